/* The relay's side of PostgreSQL: one connection with its prepared statements, claiming rows
 * under a lease, marking them published or failed, releasing leases, the LISTEN wake-up and
 * the operator queries. A PGresult never leaves store/: rows cross as owned structs.
 *
 * Threads: a struct store belongs to one thread at a time (libpq connections are not
 * thread-safe); only store_interrupt() may be called from another thread. Error texts never
 * hold a password: libpq's messages are scrubbed of the connection string's secrets. */
#ifndef OUTBOX_STORE_OUTBOX_STORE_H
#define OUTBOX_STORE_OUTBOX_STORE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/outbox_row.h"

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
	/* Shutdown: when non-NULL and *deadline_ms != 0, an absolute CLOCK_MONOTONIC time in ms
	 * after which every wait (connecting, sending, an answer) gives up with
	 * STORE_ERR_ABORTED. wake_fd (-1 = none) becomes readable once *deadline_ms is set, so
	 * that a wait begun before notices it at once. progress_ms (may be NULL) gets
	 * CLOCK_MONOTONIC ms at least once a second while a call waits (liveness). */
	const atomic_llong *deadline_ms;
	int wake_fd;
	atomic_llong *progress_ms;
};

/* A claimed batch, oldest first (seq order). Reused across claims so that the hot path does
 * not allocate once warmed up. */
struct store_batch {
	struct outbox_row *rows; /* point into the storage below, until the batch is reused */
	size_t n;
	char token[STORE_TOKEN_MAX]; /* the claim's fencing token (see STORE_TOKEN_MAX) */
	/* CLOCK_MONOTONIC ms by which the lease surely runs out, measured by the database clock
	 * (the claim's send time plus the time its statement said was left). */
	int64_t lease_deadline_ms;
	/* Rows the claim leased that the batch could not hold (store/claim.c, fit_batch()):
	 * n_cut were handed back at once and come again with a later claim; n_refused could not
	 * fit even alone and were recorded dead, the first of them named here for the log. */
	size_t n_cut, n_refused;
	char refused_id[257]; /* VARCHAR(64): up to 256 bytes of UTF-8 */
	char refused_error[160];
	/* private: storage */
	size_t cap;
	char *buf;
	size_t buf_len, buf_cap;
};
void store_batch_init(struct store_batch *b);
void store_batch_free(struct store_batch *b); /* frees storage, not b itself */

/* A failed row, for store_mark_failed(). All borrowed. */
struct store_failure {
	const char *id;
	const char *error; /* truncated to 1000 chars when written */
	int64_t delay_ms;  /* available_at = now() + delay_ms */
	bool dead;         /* attempts = max_attempts (can never be published) */
	bool uncounted;    /* the broker's own failure (a nack): back off, attempts unchanged */
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

/* Claims up to batch_size claimable rows (at most batch_max_bytes of bodies, at least one row)
 * (DESIGN §3, ordering keys included) in one statement and fills out (previous contents
 * dropped), with a new token and the lease's deadline. With disarm, the same statement also
 * clears the wake-up flag (call it after a wake). On error out->n = 0. */
int store_claim(struct store *s, bool disarm, struct store_batch *out)
        __attribute__((warn_unused_result));
/* The same split in two, so the relay can publish while the database works:
 * store_claim_send() queues the claim; store_claim_recv() waits for and reads it. No other
 * store call may be made in between. */
int store_claim_send(struct store *s, bool disarm) __attribute__((warn_unused_result));
int store_claim_recv(struct store *s, struct store_batch *out) __attribute__((warn_unused_result));
/* A claim that also marks (or deletes) a batch's confirmed rows, as store_mark_published would,
 * in the same statement and transaction (which then commits durably): one statement a turn
 * instead of two, where each claim finds a few rows and the statements' fixed costs count.
 * The claim is the full one (it answers a row of its own): store_claim_carries_mark() says
 * when that is the claim the store would take anyway, after a claim of few rows. The claim
 * does not see the mark, so it never takes a keyed row queued behind one being marked: mark
 * a batch with ordering keys on its own. Read with store_claim_recv(); then
 * store_claim_marked() gives how many rows the mark hit. If the claim fails, so did the mark. */
bool store_claim_carries_mark(const struct store *s);
int store_claim_mark_send(struct store *s, bool disarm, const char *token, const int64_t *seqs,
                          size_t n, bool delete_rows) __attribute__((warn_unused_result));
size_t store_claim_marked(const struct store *s);

/* Makes the following claims consider only unkeyed rows with seq >= from_seq (0 = all rows;
 * STORE_FLOOR_KEYS_ONLY = none: claims that only go on through the ordering keys, and look at
 * more of them each). Keyed rows are found key by key and the floor does not apply to them.
 * Why: a mark leaves the row's entry in the unkeyed index until vacuum removes it, so on a
 * long backlog a claim that always starts at the beginning walks every row published since
 * the last vacuum, and the drain slows as it goes. A relay that just claimed a full batch
 * knows nothing older was claimable and can start there; it must still claim without a
 * floor now and then, for older rows that became claimable since (released, retried,
 * delayed). A row committed late, by a transaction that took its seq early, needs no such
 * claim: the store never starts a claim above a row the previous claim could not see yet
 * (by the settled ordering watermark it was sent with), unless that is more than 8 batches
 * below the floor asked for (a transaction open that long leaves its row to the next claim
 * without a floor). */
void store_set_claim_floor(struct store *s, int64_t from_seq);
#define STORE_FLOOR_KEYS_ONLY INT64_MAX

/* Ordering keys: each claim looks at the heads of a batch's worth of keys (at least 64; 1024
 * with STORE_FLOOR_KEYS_ONLY), in key order, going on where the previous claim of this handle
 * stopped, so that a claim costs the same however many rows queue behind each key. A round is
 * the claims from the first key to the last. store_keys_more() is true while the current round
 * has keys left: a claim that found nothing says nothing about the keys it did not reach, so
 * claim again (with STORE_FLOOR_KEYS_ONLY) until something is claimed or it turns false before
 * concluding that nothing is claimable. store_keys_restart() makes the next claim begin a
 * round at the first key. */
bool store_keys_more(const struct store *s);
void store_keys_restart(struct store *s);

/* True when the last round of claims saw keyed rows waiting for the ordering watermark (store/
 * watermark.h) and it is moving: settling it and claiming again soon finds them. False while
 * a transaction that inserted into the outbox earlier is still open (claiming again then does
 * not help). */
bool store_keys_settling(const struct store *s);
/* Samples the ordering watermark twice (two short statements) so that keyed rows committed
 * before the call become claimable by the next claim. Returns 0 when it reached the sequence's
 * value of the first sample, 1 when a transaction that inserted into the outbox before the
 * call is still open (try again later), or an error. */
int store_settle_watermark(struct store *s) __attribute__((warn_unused_result));

/* Every write below is fenced by the claim's token: only rows still locked_by token are
 * touched, so a write of a batch whose lease ran out (or that was claimed on a server that
 * has since failed over) changes nothing, and its rows are published again (a duplicate,
 * never a loss, and never out of order for a key). */

/* Marks the rows of seqs (outbox_row.seq) published (published_at = now(), lease cleared) in
 * one durable statement, or deletes them when delete_rows. By seq, not id: a bigint lookup,
 * where an id is text compared under the database's collation (with UUID ids the mark found
 * its 500 rows in 2.4-2.7 ms by id, 1.05 ms by seq). *n_changed (may be NULL; _recv) gets how
 * many rows it hit. */
int store_mark_published(struct store *s, const char *token, const int64_t *seqs, size_t n,
                         bool delete_rows) __attribute__((warn_unused_result));
int store_mark_published_send(struct store *s, const char *token, const int64_t *seqs, size_t n,
                              bool delete_rows) __attribute__((warn_unused_result));
int store_mark_published_recv(struct store *s, size_t *n_changed)
        __attribute__((warn_unused_result));

/* Records failures in one statement: attempts + 1 (max_attempts when dead; unchanged when
 * uncounted), last_error, available_at = now() + delay, lease released. *n_changed (may be
 * NULL) gets how many rows were updated. */
int store_mark_failed(struct store *s, const char *token, const struct store_failure *f, size_t n,
                      size_t *n_changed) __attribute__((warn_unused_result));

/* Releases the leases of ids (attempts unchanged). */
int store_release(struct store *s, const char *token, const char *const *ids, size_t n)
        __attribute__((warn_unused_result));
/* The part every claim token of this handle starts with, "<relay id>#<nonce>." (the relay id
 * cut to its first 50 bytes; the nonce is the handle's own, drawn at random), into out[cap]:
 * 0, or -1 when it does not fit (STORE_TOKEN_MAX always does). */
int store_token_stem(const struct store *s, char *out, size_t cap);
/* Releases every row leased by a claim of one of stems (store_token_stem() of the handles
 * whose claims are to go; borrowed), attempts unchanged: the orderly shutdown's sweep, on any
 * handle (an admin one too). Matched by the whole stem, nonce included: rows of another
 * process, also one given the same relay.id, are never touched. */
int store_release_claims(struct store *s, const char *const *stems, size_t n)
        __attribute__((warn_unused_result));
/* store_release_claims() of this handle's own claims. */
int store_release_all(struct store *s) __attribute__((warn_unused_result));
/* Extends the lease of b's rows to relay.lease from now and moves b->lease_deadline_ms. Rows
 * no longer b's (another relay claimed them after the lease ran out) are dropped from b: they
 * must not be published by this relay. */
int store_renew(struct store *s, struct store_batch *b) __attribute__((warn_unused_result));

/* The wake-up (store/schema.c). store_arm() takes the table's wake-up lock for this session:
 * while some session holds it, producers' INSERT statements notify the channel. Call it before
 * sleeping, then claim once more; a claim with disarm lets it go. Returns 1 when this session
 * holds it, 0 when another does (a relay asleep: its notifications reach every relay that
 * listens), or an error. The lock ends with the session, so a relay that dies stops the
 * notifications with its connection.
 * A producer tests the lock when its INSERT ends, before it commits: one that tested just
 * before the lock was taken does not notify, and its rows may commit after the claim that
 * followed. It holds a seq already, so settle the watermark (store_settle_watermark()) after
 * arming and before that claim: once every transaction holding a seq then has ended, the claim
 * sees their rows. */
int store_arm(struct store *s) __attribute__((warn_unused_result));
/* After store_arm() answered 0: 1 when another session holds the wake-up lock as a relay
 * does (exclusively: a relay asleep, whose notifications reach every relay that listens), 0
 * when none does (producers' triggers held it shared for an instant: try again), or an error
 * (store/wakeup.c). */
int store_wakeup_armed_elsewhere(struct store *s) __attribute__((warn_unused_result));
/* Lets the wake-up lock go without claiming (the relay cannot publish for now). */
int store_disarm(struct store *s) __attribute__((warn_unused_result));
/* Whether the table has a wake-up trigger that tests this relay's lock (read at connect: this
 * version's function, an earlier one, or a trigger whose WHEN tests it): without one the relay
 * finds new rows only by polling. */
bool store_wakeup_current(const struct store *s);
/* Reads whatever arrived on the socket and drains notifications; *woken is set when at least
 * one notification on the channel was received. Never blocks. */
int store_consume_input(struct store *s, bool *woken) __attribute__((warn_unused_result));

/* ---- operator queries (CLI, maintenance thread) ---- */

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
};
/* Reads the gauges at a cost of O(unpublished rows), never O(table): published is estimated
 * (live rows by the statistics less the unpublished ones) once the table is over 1 MiB. */
int store_status(struct store *s, struct store_status *st) __attribute__((warn_unused_result));

/* A listed row (dead rows, blocked keys). Strings owned by the list. */
struct store_listed {
	char *id;
	char *exchange;
	char *routing_key;
	char *ordering_key; /* NULL when none */
	char *last_error;   /* NULL when none */
	int attempts;
	char *created_at;   /* ISO 8601 text */
	char *available_at; /* ISO 8601 text */
};
struct store_list {
	struct store_listed *items;
	size_t n;
};
void store_list_free(struct store_list *l); /* frees contents, not l */

/* Dead rows, oldest first, at most limit (0 = all). */
int store_dead(struct store *s, size_t limit, struct store_list *out)
        __attribute__((warn_unused_result));
/* Head rows of blocked ordering keys (failed and waiting, or dead), oldest first. */
int store_blocked_keys(struct store *s, size_t limit, struct store_list *out)
        __attribute__((warn_unused_result));
/* attempts = 0, last_error = NULL, available_at = now(), lease cleared, for unpublished ids;
 * all_dead: every dead row. *n_changed gets the count. By ids, as store_requeue_ids() unforced,
 * rows under a live lease being an error (STORE_ERR_QUERY, nothing changed). */
int store_requeue(struct store *s, const char *const *ids, size_t n, bool all_dead,
                  int64_t *n_changed) __attribute__((warn_unused_result));
/* Deletes unpublished ids; as store_discard_ids() unforced, rows under a live lease being an
 * error (STORE_ERR_QUERY, nothing changed). */
int store_discard(struct store *s, const char *const *ids, size_t n, int64_t *n_changed)
        __attribute__((warn_unused_result));

/* An operator's command never races a relay: a row under a live lease (locked_by set and
 * locked_until not passed: a relay is publishing it, or a replay holds it) is refused unless
 * forced. What the by-id commands below found. */
#define STORE_LEASED_MAX 20
struct store_leased {
	char id[257]; /* VARCHAR(64): up to 64 characters of up to 4 bytes */
	char locked_by[257];
	char locked_until[32]; /* ISO 8601, UTC */
};
struct store_ids_outcome {
	int64_t changed; /* rows requeued or deleted */
	int64_t leased;  /* rows among the ids under a live lease */
	size_t n_listed; /* the first STORE_LEASED_MAX of them, oldest first */
	struct store_leased listed[STORE_LEASED_MAX];
};
/* In one transaction, the unpublished rows of ids (borrowed) are locked against claims and
 * those under a live lease are listed in *out. Some are, and not force: nothing is changed
 * (out->changed 0). Otherwise attempts = 0, last_error = NULL, available_at = now(); the lease
 * is cleared where it has run out and kept where it is live, so that its relay finishes with
 * the row first: it is never published by two relays at once, and comes back with fresh
 * attempts if that relay does not publish it. Notifies the channel when rows changed. */
int store_requeue_ids(struct store *s, const char *const *ids, size_t n, bool force,
                      struct store_ids_outcome *out) __attribute__((warn_unused_result));
/* As store_requeue_ids(), deleting the rows. Forced, a leased row is deleted too: the relay's
 * later writes of it (mark, failure, release, renewal) are fenced by its claim's token and find
 * nothing, so nothing brings it back; what that relay has already handed to the broker may
 * still be delivered once. */
int store_discard_ids(struct store *s, const char *const *ids, size_t n, bool force,
                      struct store_ids_outcome *out) __attribute__((warn_unused_result));
/* Deletes published rows older than older_than_ms, at most batch rows per statement, until
 * none are left or *stop becomes true (may be NULL). *n_deleted gets the total. */
int store_purge(struct store *s, int64_t older_than_ms, int batch, const atomic_int *stop,
                int64_t *n_deleted) __attribute__((warn_unused_result));

/* ---- replay (store/replay.c): published rows made pending again ---- */

/* The header a replayed message carries, the time the replay was asked (RFC 3339, UTC). It
 * stays in the row's headers: the relay counts a row holding it as replayed. */
#define STORE_REPLAY_HEADER "x-outbox-replayed-at"

/* Which published rows to replay; NULL (0) = no condition. Borrowed. */
struct store_replay_filter {
	bool by_created;              /* since/until on created_at, not published_at */
	const char *since;            /* inclusive, as store_replay_time() resolved it */
	const char *until;            /* exclusive, likewise */
	const char *exchange;         /* exact */
	const char *routing_key_like; /* LIKE pattern, '!' escapes: store_replay_like() */
	const char *ordering_key;     /* exact */
	const char *const *ids;
	size_t n_ids;
};

/* A row (or, for store_replay_skipped(), a key) as the calls below report it. Every field
 * may be NULL; all are borrowed for the callback's duration. */
struct store_replay_row {
	const char *id, *exchange, *routing_key, *ordering_key;
	const char *published_at, *created_at; /* UTC, ms */
	const char *reason;                    /* why it is not or cannot be replayed */
	int64_t rows;                          /* store_replay_skipped(): the key's rows */
};
/* Returns 0 to go on; any other value stops the listing and is returned. */
typedef int (*store_replay_fn)(const struct store_replay_row *r, void *arg);

/* What the steps did so far (start from zero, left = the selection's size). */
struct store_replay_progress {
	int64_t replayed;  /* rows made pending again */
	int64_t gone;      /* selected rows no longer published when their turn came (purged,
	                      or replayed by another replay meanwhile) */
	int64_t left;      /* rows still selected: their keys must wait */
	int64_t left_keys; /* and their keys */
	bool conflict;     /* the last step hit a deadlock and changed nothing: try again */
};

/* Whether r carries STORE_REPLAY_HEADER (it was made pending by a replay). Cheap. */
bool store_row_replayed(const struct outbox_row *r);
/* Turns an operator's pattern (`*` any run of characters, `?` one, the rest literal) into a
 * LIKE pattern with '!' as its escape, in out[cap]: 0, or -1 when it does not fit. */
int store_replay_like(const char *pattern, char *out, size_t cap);
/* Sets up the session for one replay (an admin handle): the session's time zone is UTC, the
 * selection is empty. asked_at[cap] gets the database's time now (UTC, ms): the header's
 * value. STORE_ERR_FATAL when the table has no seq sequence. */
int store_replay_begin(struct store *s, char *asked_at, size_t cap)
        __attribute__((warn_unused_result));
/* at (a time PostgreSQL reads; without a zone, UTC) or else now minus ago_ms, as UTC text with
 * microseconds into out[cap]. 1 (errmsg says why) when at is not a finite time. */
int store_replay_time(struct store *s, const char *at, int64_t ago_ms, char *out, size_t cap)
        __attribute__((warn_unused_result));
/* Selects the published rows matching f (after store_replay_begin()); *n_rows gets how many. */
int store_replay_select(struct store *s, const struct store_replay_filter *f, int64_t *n_rows)
        __attribute__((warn_unused_result));
/* The selected rows in seq order, for --dry-run (id, exchange, routing key, ordering key,
 * published_at, created_at), read a page at a time. */
int store_replay_list(struct store *s, store_replay_fn fn, void *arg)
        __attribute__((warn_unused_result));
/* Ids among ids (borrowed) that were not selected, each with the reason. */
int store_replay_missing_ids(struct store *s, const char *const *ids, size_t n, store_replay_fn fn,
                             void *arg) __attribute__((warn_unused_result));
/* Selected rows whose headers cannot take the replay header (not a JSON object, or text
 * PostgreSQL cannot read as JSON), each with the reason (fn may be NULL); *n_refused gets how
 * many. Such a row would make the replay's statement fail: the caller refuses the replay. */
int store_replay_refused(struct store *s, store_replay_fn fn, void *arg, int64_t *n_refused)
        __attribute__((warn_unused_result));
/* One step: in one transaction, makes the selected rows pending again (published_at,
 * attempts, last_error and the lease cleared, available_at = now(), asked_at merged into the
 * headers as STORE_REPLAY_HEADER) and NOTIFYs the channel, except the rows of keys that must
 * wait — a key with a row in flight (that newer row would go out before the replayed ones),
 * or every key while a transaction that inserted into the outbox stays open for wait_ms.
 * The unpublished rows of each key replayed are leased to the replay until just after the
 * commit (locked_by "replay#<pid>.<asked_at>", then NULL with locked_until = the release
 * time): a claim begun before the commit cannot take them. Adds to *p. Two replays of one
 * table take turns (an advisory lock). */
int store_replay_step(struct store *s, const char *asked_at, int64_t wait_ms,
                      struct store_replay_progress *p) __attribute__((warn_unused_result));
/* The keys still selected after the last step: ordering_key, rows and the reason. */
int store_replay_skipped(struct store *s, store_replay_fn fn, void *arg)
        __attribute__((warn_unused_result));

/* ---- schema ---- */

/* The DDL for table/channel (DESIGN §1 and the wake-up objects), idempotent. Returns a new
 * string (free()), NULL on out of memory. table must be a valid identifier. */
char *store_schema_sql(const char *table, const char *channel);
/* Brings the table and its objects up to date (creates them, adds an older table's missing
 * columns, replaces an old wake-up function, builds missing indexes CONCURRENTLY), changing
 * only what the catalog shows missing or different: on an up-to-date table it takes no lock on
 * the table. Each lock a change needs is waited for at most 5 s; then STORE_ERR_QUERY with a
 * message naming the table and the sessions that hold it, and nothing of that step changed.
 * (Index builds block nobody: they wait up to 60 s for older transactions, but fail at once
 * when a transaction has held the table for 5 s already.) */
int store_migrate(struct store *s) __attribute__((warn_unused_result));
/* What the last store_migrate() changed that the operator must act on (borrowed, "" when
 * nothing): setting the seq sequence's CACHE to 1 leaves the values sessions cached before. */
const char *store_notice(const struct store *s);
/* Whether the sequence behind the table's seq column hands out values one at a time, as the
 * ordering watermark needs (store/migrate.c): 0 when it does (or the table or its sequence is
 * missing: other checks say so), 1 when it has CACHE > 1 (store_errmsg() names the sequence
 * and the fix, one line), or an error. The relay's connections and replay refuse such a
 * table (STORE_ERR_FATAL, same message). */
int store_check_sequence(struct store *s) __attribute__((warn_unused_result));

#endif
