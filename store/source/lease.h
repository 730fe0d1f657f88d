/* The lease source's statements (store/source/claim.c, marks.c, wakeup.c): claiming rows under
 * a lease written into them, marking them published or failed, releasing and renewing leases,
 * the LISTEN wake-up. Only the lease source (lease_source.c), the shutdown's sweep and the
 * tests use them; the relay's loop goes through store/source/source.h. */
#ifndef OUTBOX_STORE_SOURCE_LEASE_H
#define OUTBOX_STORE_SOURCE_LEASE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/outbox_row.h"
#include "store/store.h"

/* A claimed batch, oldest first (seq order). Reused across claims so that the hot path does
 * not allocate once warmed up. */
struct store_batch {
	struct outbox_row *rows; /* point into the storage below, until the batch is reused */
	size_t n;
	char token[STORE_TOKEN_MAX]; /* the claim's fencing token (see STORE_TOKEN_MAX) */
	/* CLOCK_MONOTONIC ms by which the lease surely runs out, measured by the database clock
	 * (the claim's send time plus the time its statement said was left). */
	int64_t lease_deadline_ms;
	/* Rows the claim leased that the batch could not hold (store/source/claim.c, fit_batch()):
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

/* The wake-up (store/operator/schema.c). store_arm() takes the table's wake-up lock for this session:
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
 * (store/source/wakeup.c). */
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

#endif
