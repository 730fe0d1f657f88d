/* Where the relay's rows come from. A source finds the rows to publish, hands them out a batch
 * at a time, and hears how each batch ended; how rows are found, leased, marked and handed back
 * is the source's business alone. The relay's loop (relay/worker.c) only moves batches between
 * a source and the broker:
 *
 *     source_connect()                        again after any error, when the caller's backoff
 *                                             says so
 *     loop:
 *         source_next(&b, &ask_at)            a batch, or none and when to ask again (sooner
 *                                             when source_fd() turns readable: source_input())
 *         publish b's rows to the broker
 *         source_prefetch(b)                  the next batch is fetched while the broker
 *                                             confirms this one (optional)
 *         wait for the broker's confirms
 *         source_settle(b, fates)             one fate per row: published, failed, released
 *     source_finish()                         orderly shutdown: nothing left in flight
 *
 * One source today: the lease source (store/lease_source.c, DESIGN §3): every batch is claimed
 * under a lease written into its rows, and each row is marked when it ends. The words its
 * policy uses (held and carried marks, claim floor, key rounds, owed marks, gathering, arming)
 * are defined in docs/design.md, "The words the code uses". A second source must pass the same
 * contract test (tests/integration/test_source_contract.c), which runs against each source.
 *
 * Threads: a source belongs to one thread at a time, like the libpq connection under it; only
 * source_interrupt() may be called from another thread. Sources of one relay share nothing.
 *
 * Ownership: a batch and its rows belong to the source. They stay valid, unchanged, from
 * source_next() until source_settle() returns for that batch (or the source is disconnected or
 * freed); at most one batch is out at a time, and it must be settled before the next
 * source_next(). The fates and their error texts are borrowed for the call.
 *
 * Errors: calls return STORE_OK (0) or a negative enum store_err (store/store.h).
 * source_errmsg() holds the detail, source_step() what the source was doing. After an error the
 * caller calls source_disconnect() and connects again later. Nothing committed is lost on any
 * path: rows the broker confirmed but the source could not record are owed (recorded after
 * reconnecting), and every other row comes back by itself (its lease ends).
 *
 * A source never logs. What an operator must hear of (rows it marked, rows a batch could not
 * hold, rows it handed back) reaches the caller through its hooks, on the source's thread,
 * during the call that did it. */
#ifndef OUTBOX_STORE_SOURCE_H
#define OUTBOX_STORE_SOURCE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/outbox_row.h"
#include "store/store.h"

/* What a source tells its caller. Every hook may be NULL; arg is passed to each. */
struct source_hooks {
	void *arg;
	/* A settled batch's published rows were recorded: rows of them were still this relay's
	 * (a row that was not had been taken over by another relay after its lease ran out, and
	 * is counted there); batch_us since the batch was handed out. */
	void (*marked)(void *arg, size_t rows, int64_t batch_us);
	/* Rows confirmed while the database was away were recorded after reconnecting: marked of
	 * them, and no_longer_ours that another relay had taken over meanwhile. */
	void (*repaid)(void *arg, size_t marked, size_t no_longer_ours);
	/* A fetch took rows a batch cannot hold (the byte budget): cut went back at once and come
	 * again; refused could not fit even alone and were recorded dead (the first one's id and
	 * error given, for the log). */
	void (*unheld)(void *arg, size_t cut, size_t refused, const char *first_id,
	               const char *error);
	/* Rows handed back unpublished, their attempts unchanged (never answered by the broker, or
	 * fetched for a publish that could not happen). */
	void (*released)(void *arg, size_t rows);
	/* The cursor source took its table's lead (leading, at position), or found another relay
	 * leading it (a warm standby). Said when it changes, and after connecting. */
	void (*lead)(void *arg, bool leading, int64_t position);
	/* The database answered: the caller's reconnect backoff may start afresh. */
	void (*answered)(void *arg);
	/* Still working through a long series of statements (liveness). */
	void (*tick)(void *arg);
};

/* Which source (relay.source): the lease source (a lease written into every row it hands
 * out, each row marked when it ends) or the cursor source (one position per table, moved once
 * a batch; only the rows that cannot go at once are written). */
enum source_kind { SOURCE_LEASE = 0, SOURCE_CURSOR };

/* Borrowed by source_new() for the source's lifetime. */
struct source_options {
	enum source_kind kind;
	struct store_options store; /* the connection, the table, the lease, the batch's size */
	int64_t confirm_timeout_ms; /* the broker's answer may take this long (amqp.confirm_timeout) */
	int64_t poll_interval_ms;   /* relay.poll_interval: the longest a row waits unnoticed */
	bool delete_published;      /* relay.retention = 0: published rows are deleted */
	const atomic_int *stopping; /* non-zero: the relay is stopping (no new long work) */
	struct source_hooks hooks;
};

/* A batch handed out: rows in the table's order (seq), every one to get a fate. */
struct source_batch {
	const struct outbox_row *rows;
	size_t n;
	/* CLOCK_MONOTONIC ms by which every wait of this batch's publishing must end (the broker's
	 * batch deadline): past it another relay may take its rows. */
	int64_t deadline_ms;
};

/* How one row of a batch ended. */
enum source_outcome {
	SOURCE_RELEASED = 0, /* never answered by the broker: handed back, no attempt charged */
	SOURCE_PUBLISHED,    /* confirmed by the broker */
	SOURCE_FAILED,       /* refused: retried after delay_ms, or dead */
};
struct source_fate {
	enum source_outcome outcome;
	/* SOURCE_FAILED only: */
	const char *error; /* why (truncated to 1000 characters where it is recorded) */
	int64_t delay_ms;  /* when it may be tried again */
	bool dead;         /* can never be published: set aside for an operator */
	bool uncounted;    /* the broker's own failure (a nack): no attempt charged */
};

/* What a source was doing when a call failed, for the log (source_step_text()). */
enum source_step {
	SOURCE_STEP_NONE = 0,
	SOURCE_STEP_CLAIMING,
	SOURCE_STEP_MARKING,
	SOURCE_STEP_MARKING_FAILED,
	SOURCE_STEP_RELEASING,
	SOURCE_STEP_HANDING_BACK,
	SOURCE_STEP_RENEWING,
	SOURCE_STEP_REPAYING,
	SOURCE_STEP_ARMING,
	SOURCE_STEP_DISARMING,
	SOURCE_STEP_SETTLING_WATERMARK,
	SOURCE_STEP_WAITING,
	SOURCE_STEP_LEADING,  /* the cursor source: taking or checking the table's lead */
	SOURCE_STEP_READING,  /* ... reading rows above the position */
	SOURCE_STEP_MOVING,   /* ... moving the position (and writing the rows it passes) */
	SOURCE_STEP_DEFERRED, /* ... claiming or settling rows it passed (the exceptions) */
};
const char *source_step_text(enum source_step step); /* "claiming rows", ... */

struct source;

/* A new, unconnected source of opts->kind. opts is borrowed. NULL on out of memory. */
struct source *source_new(const struct source_options *opts);
void source_free(struct source *s); /* closes the connection; accepts NULL */

/* Connects, checks the table and listens for the wake-up, as store_connect(). A source that
 * reconnects starts with nothing in flight but what it owes. */
int source_connect(struct source *s) __attribute__((warn_unused_result));
/* Closes the connection. What was on the wire is settled as an error would settle it: a record
 * of confirmed rows not yet answered is owed, a fetch not yet read is left to its lease. */
void source_disconnect(struct source *s);
bool source_connected(const struct source *s);
/* Thread-safe: makes a call blocked on the source's connection fail at once (shutdown). */
void source_interrupt(struct source *s);
const char *source_errmsg(const struct source *s);    /* borrowed, valid until the next call */
enum source_step source_step(const struct source *s); /* of the last failed call */
const char *source_server(const struct source *s);    /* "host:port", never credentials */
bool source_wakeup_current(const struct source *s);   /* store_wakeup_current() */
/* The start every fencing token of this source has (store_token_stem()): the shutdown's sweep
 * releases what is left by it. */
int source_token_stem(const struct source *s, char *out, size_t cap);

/* The next batch to publish into *out (NULL when none), and *ask_at_ms (CLOCK_MONOTONIC): when
 * to call again if nothing happens before (source_input() says when something does). Without
 * a batch fetched ahead it looks at every row that may be published; finding none, it arranges
 * to be woken (the wake-up) and may ask to be called again soon while rows committed just now
 * become visible. A batch fetched ahead whose lease is short is renewed first; rows lost to
 * another relay meanwhile are dropped from it. */
int source_next(struct source *s, const struct source_batch **out, int64_t *ask_at_ms)
        __attribute__((warn_unused_result));
/* The socket to poll while waiting (-1 when not connected), and what to call when it is
 * readable (or before sleeping): *woken when rows may have arrived. Never blocks. */
int source_fd(const struct source *s);
int source_input(struct source *s, bool *woken) __attribute__((warn_unused_result));
/* Fetches the batch after b while the broker works on b (starts it, or waits for it too: what
 * the source does here costs the broker nothing, what it leaves for source_settle() keeps the
 * broker idle); b's rows were all handed to the broker. Optional: without it the next
 * source_next() fetches. */
int source_prefetch(struct source *s, const struct source_batch *b)
        __attribute__((warn_unused_result));
/* Records how b ended: fates[i] is the fate of b->rows[i]. fates NULL: the batch is left as it
 * is, to come back by itself (nothing could be said of it). On a source whose connection is
 * gone already (an earlier call failed and was reported), the published rows are owed and the
 * call returns STORE_OK. */
int source_settle(struct source *s, const struct source_batch *b, const struct source_fate *fates)
        __attribute__((warn_unused_result));
/* The broker is away: nothing may wait on the source meanwhile. Records what is in flight,
 * hands back a batch fetched ahead, and stops the wake-up (it would only cost producers). */
int source_pause(struct source *s) __attribute__((warn_unused_result));
/* Orderly shutdown (bounded by store_options.deadline_ms): records what is in flight, hands
 * back a batch fetched ahead, and records what is owed if the database lets it. */
int source_finish(struct source *s) __attribute__((warn_unused_result));
/* Confirmed rows not yet recorded (owed); after source_finish(): they will be published again
 * once their lease ends (a duplicate, never a loss). */
size_t source_owed(const struct source *s);

/* ---- the maintenance side: a source of its own, with store.admin set, serves only these
 * (and the connection calls above), on a thread of its own ---- */

/* The backlog as the source sees it (store_status()). */
int source_backlog(struct source *s, struct store_status *st) __attribute__((warn_unused_result));
/* On a partitioned table, creates the partitions that keep two empty ones above the
 * sequence (store_partitions_ahead()); *made gets how many. Nothing on a plain table. */
int source_partitions_ahead(struct source *s, int *made) __attribute__((warn_unused_result));
/* Retention: removes published rows older than older_than_ms, a bounded step (batch rows) at
 * a time, until none are left or *stop becomes true (may be NULL); *n_removed gets how many.
 * On a partitioned table: drops whole partitions (store_purge()). */
int source_purge(struct source *s, int64_t older_than_ms, int batch, const atomic_int *stop,
                 int64_t *n_removed) __attribute__((warn_unused_result));

#endif
