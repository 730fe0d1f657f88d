/* The cursor source's statements (store/source/position.c): leading a table, reading the rows
 * above its position, moving the position (with the rows it passes without publishing them, the
 * exceptions), and claiming those exceptions back. Only the cursor source
 * (store/source/cursor_source.c) and the tests use them.
 *
 * The position is one row of <table>_position (stream 'main'), made by `outbox-relay migrate`:
 * every row with seq <= position has been published or deferred (deferred_at set). A deferred
 * row that is not published yet is an exception: it waits for its time (available_at), for an
 * operator (dead), or behind an earlier exception of its ordering key. docs/design.md, "Row
 * sources", tells the whole design. */
#ifndef OUTBOX_STORE_SOURCE_POSITION_H
#define OUTBOX_STORE_SOURCE_POSITION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/source/lease.h"
#include "store/store.h"

/* Takes the table's lead for this session (a session advisory lock, so it ends with the
 * session): 1 when this session leads (then *position is the table's position, the row made
 * first if there was none, and the table's leader column names relay_id), 0 when another session
 * leads, or an error. The position a new row starts at never passes a row that is unpublished,
 * or that a transaction still running may commit (the ordering watermark, store/source/
 * watermark.h): 0 is also returned while such a transaction keeps it from being settled. */
int position_lead(struct store *s, int64_t *position) __attribute__((warn_unused_result));

/* A row read above the position, beside what the batch holds of it. */
struct position_seen {
	bool later; /* available_at is still to come (delayed, or backing off) */
	bool dead;  /* attempts >= relay.max_attempts already */
	bool held;  /* an earlier row of its ordering key is an exception not published yet */
};

/* A move the read carries (position_read()): from `from` to `to`, passing no rows. */
struct position_carry {
	int64_t from, to;
	int moved; /* 1 when it moved, 0 when the position was no longer `from` */
};

/* What a read asks (position_read()). */
struct position_ask {
	int64_t after; /* rows with seq above it */
	int64_t fence; /* the fence settled so far: every row up to it that will exist is visible */
	int limit;
	/* Only rows up to the fence (else every row above after, up to limit: the caller tells
	 * which of them may go, store/source/cursor_source.c). */
	bool bounded;
	/* A first statement reads the lock list (pg_locks, every lock of the server), which may
	 * settle a higher fence, and W, the highest seq drawn (store_watermark_seen()). */
	bool sample;
	bool w; /* without sample: a first statement reads W alone */
};

/* Reads up to ask->limit unpublished rows above ask->after (up to the fence when ask->bounded),
 * in seq order, into out (its rows; token and lease unused) and seen[] (out->n of them; seen is
 * reallocated as needed: *seen_cap its size). One round trip: with ask->sample, a first
 * statement samples the ordering watermark (store_watermark_safe() gives the fence it allows),
 * and when nobody holds the sequence its W is settled for the second, the read. So a row
 * committed while the relay was idle is read by the first read after its notification, not by
 * the one after that.
 * *fence_used gets the fence as the read began: every row up to it that will ever exist was
 * visible to it.
 * With carry, a move goes first in the same round trip and the same transaction (durable, as
 * position_move()'s): one round trip and one commit a batch instead of two. When the position
 * was no longer carry->from, carry->moved is 0, nothing was written and no rows are read (the
 * error text says another relay leads); an error leaves it unknown whether the move landed. */
int position_read(struct store *s, struct position_carry *carry, const struct position_ask *ask,
                  struct store_batch *out, struct position_seen **seen, size_t *seen_cap,
                  int64_t *fence_used) __attribute__((warn_unused_result));
/* The fence a read may use: every row with seq <= it that will ever exist is visible. */
int64_t store_watermark_safe(const struct store *s);
/* The highest seq the last read saw drawn (a row up to it may be committed but not yet
 * readable). */
int64_t store_watermark_seen(const struct store *s);
/* How many times this handle's reads read the lock list (the watermark's sample), since it was
 * made: for tests (source_testing.h). */
uint64_t store_lock_list_reads(const struct store *s);

/* A row the position passes without publishing it, written with the move. */
struct position_pass {
	int64_t seq;
	const char *error; /* last_error; NULL keeps the row's */
	int64_t delay_ms;  /* available_at = now() + delay_ms; negative keeps the row's */
	bool dead;         /* attempts = relay.max_attempts */
	bool counted;      /* attempts + 1 */
};

/* Moves the position from `from` to `to` in one durable statement, deferring the rows of
 * passes[0..n) in the same transaction. 1 when it moved, 0 when the position was no longer
 * `from` (another relay leads: nothing was written; the error text says so), or an error. */
int position_move(struct store *s, int64_t from, int64_t to, const struct position_pass *passes,
                  size_t n) __attribute__((warn_unused_result));

/* Claims up to limit exceptions that may go now, in seq order, under a lease (locked_by, as the
 * lease source's claim: store_mark_published(), store_mark_failed() and store_release() settle
 * them): due (available_at), not dead, and each the oldest exception of its ordering key not
 * published (under relay.ordering = skip-dead, dead ones aside). */
int position_claim_deferred(struct store *s, int limit, struct store_batch *out)
        __attribute__((warn_unused_result));

/* Prepares the cursor's statements on a new connection: STORE_ERR_FATAL, saying to run
 * `outbox-relay migrate`, when the table has no position table or deferred_at column. */
int position_check(struct store *s) __attribute__((warn_unused_result));
/* Whether this session holds the wake-up lock (store_arm()). */
bool store_wakeup_armed(const struct store *s);

/* The wake-up lock alone, let go without touching the lead (store_disarm() lets every lock of
 * the session go). */
int position_disarm(struct store *s) __attribute__((warn_unused_result));

#endif
