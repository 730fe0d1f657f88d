/* The store's handle on PostgreSQL: one connection, its options, its errors. What is done
 * with it is in the folders by job: source/ (what the relay runs: the lease source, claims,
 * marks, the wake-up), operator/ (what operators run: status and the by-id commands, replay,
 * schema and migrate), liboutbox/ (what applications link). A PGresult never leaves store/:
 * rows cross as owned structs.
 *
 * Threads: a struct store belongs to one thread at a time (libpq connections are not
 * thread-safe); only store_interrupt() may be called from another thread. Error texts never
 * hold a password: libpq's messages are scrubbed of the connection string's secrets. */
#ifndef OUTBOX_STORE_STORE_H
#define OUTBOX_STORE_STORE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Return codes. The detail text is on the handle: store_errmsg(). */
enum store_err {
	STORE_OK = 0,
	STORE_ERR_CONN = -1,  /* connection lost or not open: reconnect, then retry */
	STORE_ERR_QUERY = -2, /* a statement failed on a live connection: log, back off, retry */
	STORE_ERR_FATAL = -3, /* cannot work with this database/table (missing table, bad DDL,
	                         permission): stop at start-up, back off at run time */
	STORE_ERR_NOMEM = -4,
	STORE_ERR_ABORTED = -5,     /* the shutdown deadline (store_options.deadline_ms) ended a
	                               wait; the connection is closed */
	STORE_ERR_UNSUPPORTED = -6, /* this connection can never serve the relay (it goes
	                               through a transaction-pooling proxy): stop */
};

/* A claim's fencing token: written to locked_by by the claim, required by every later write
 * of the claimed rows ("<relay.id>#<nonce>.<counter>", at most 64 bytes). A relay whose lease
 * ran out, or a worker of the same process, can never write to rows claimed by another. */
#define STORE_TOKEN_MAX 65

/* Borrowed by store_new() for the store's lifetime (the relay keeps config alive). */
struct store_options {
	const char *conninfo;         /* libpq conninfo or URI; "" = PG* environment */
	const char *table;            /* validated identifier, maybe schema-qualified */
	const char *channel;          /* LISTEN channel ("" = do not LISTEN) */
	const char *relay_id;         /* written to locked_by */
	const char *application_name; /* "outbox-relay", "outbox-relay worker 2", ... */
	int64_t lease_ms;
	int max_attempts;
	bool skip_dead; /* relay.ordering = skip-dead */
	int batch_size;
	int64_t batch_max_bytes; /* sum of body sizes per claim (one larger row still goes
	                            alone); 0 = no limit */
	bool admin;              /* CLI/maintenance use: store_connect() neither prepares the
	                            relay statements, checks the table, nor LISTENs */
	/* Opened for the cursor source (relay.source = cursor). Otherwise (the lease source)
	 * store_connect() refuses a table the cursor source runs: its published rows carry no
	 * published_at, so the lease source would publish them all again. */
	bool cursor;
	/* Shutdown: when non-NULL and *deadline_ms != 0, an absolute CLOCK_MONOTONIC time in ms
	 * after which every wait (connecting, sending, an answer) gives up with
	 * STORE_ERR_ABORTED. wake_fd (-1 = none) becomes readable once *deadline_ms is set, so
	 * that a wait begun before notices it at once. progress_ms (may be NULL) gets
	 * CLOCK_MONOTONIC ms at least once a second while a call waits (liveness). */
	const atomic_llong *deadline_ms;
	int wake_fd;
	atomic_llong *progress_ms;
};

struct store;

/* New, unconnected handle. opts and its strings are borrowed. NULL on out of memory. */
struct store *store_new(const struct store_options *opts);
void store_free(struct store *s);                /* closes the connection; accepts NULL */
const char *store_errmsg(const struct store *s); /* borrowed, valid until the next call */

/* Connects (closing any previous connection), prepares the statements and LISTENs on the
 * channel. STORE_ERR_FATAL when the table is missing or lacks a column the relay needs
 * (the message then says to run `outbox-relay migrate`); STORE_ERR_UNSUPPORTED when the
 * connection goes through a transaction-pooling proxy. With opts->admin, only connects. Any
 * server that accepts is used; a server that is read-only (a standby) is refused. */
int store_connect(struct store *s) __attribute__((warn_unused_result));
void store_disconnect(struct store *s);
bool store_connected(const struct store *s);
/* Thread-safe, from any thread: makes a call blocked on this store's socket fail at once (the
 * connection is shut down; the owner's call returns an error and the next store_connect()
 * starts afresh). For the shutdown deadline. */
void store_interrupt(struct store *s);
/* "host:port" of the server in use (or last tried), never credentials; "" when unknown. */
const char *store_server(const struct store *s);
/* The socket to poll for notifications, or -1 when not connected. */
int store_socket(const struct store *s);

/* The table as the backlog gauges see it (store/operator/admin.h: store_status()). */
/* What status shows of a partitioned table (store/operator/partitions.h). */
struct store_partitions {
	bool partitioned;
	int64_t partitions;      /* range partitions, the DEFAULT one not counted */
	int64_t default_rows;    /* rows in the DEFAULT partition */
	int64_t dead_partitions; /* partitions that dead rows keep from being retired */
};

struct store_status {
	int64_t pending; /* published_at IS NULL AND attempts < max (leased included) */
	int64_t leased;
	int64_t dead;
	int64_t published;            /* retained published rows: an estimate from the table's
	                                 statistics on a table over 1 MiB (exact below) */
	double oldest_pending_age_s;  /* 0 when none */
	int64_t blocked_keys;         /* keys whose head row is failed-in-backoff or dead */
	char oldest_blocked_key[256]; /* "" when none */
	double oldest_blocked_age_s;
	struct store_partitions partitions; /* all zero on a plain table */
};

#endif
