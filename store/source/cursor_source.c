/* The cursor source (store/source/source.h, relay.source = cursor): one relay leads the table
 * and reads the rows above its position. A row goes once every seq below it was read, or is at
 * or below the ordering watermark's fence (no row a running transaction may still commit is
 * ever passed, and a key's rows go in seq order); after the broker has confirmed a batch, the
 * position moves past it in one durable statement. Nothing is written into a published row.
 * The rows it cannot publish at once (failed, delayed, dead, never answered, or behind such a
 * row of their ordering key) are deferred: written as exceptions by that same statement, and
 * published later under a lease, one per key at a time, by the exceptions' claim. Relays that
 * do not lead wait, trying for the lead now and then (warm standbys). docs/design.md, "Row
 * sources", tells the design and its failure cases. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "store/operator/admin.h"
#include "store/source/cursor_keys.h"
#include "store/source/gather.h"
#include "store/source/lease.h"
#include "store/source/position.h"
#include "store/source/cursor_source_private.h"
#include "store/source/source_private.h"
#include "store/store.h"
#include "store/operator/partitions.h"

/* A relay that does not lead tries for the lead this often (at most relay.poll_interval): the
 * longest a table goes unpublished after its leader's session ends, beyond the server noticing. */
#define LEAD_RETRY_MS 200
/* While rows wait for the watermark to settle, the read is tried again after 1, 2, 4 ... ms, at
 * most this. */
#define SETTLE_PAUSE_MAX_MS 50
/* A read reads the lock list (the watermark's sample, pg_lock_status(): every lock of the
 * server) while a hole holds rows back, first after leading, and, after a read that found
 * nothing while seqs were drawn that no read found, at most this often; never while rows flow
 * and not on a wake-up: a row whose every lower seq was read needs no fence, and a read that
 * finds one behind a hole samples next time. */
#define SAMPLE_EVERY_MS 10

/* ---- leading ---- */

static int lead(struct cursor *c, int64_t now)
{
	int64_t pos = 0;
	int rc;

	if (now < c->lead_at_ms)
		return 0;
	rc = position_lead(c->store, &pos);
	if (rc < 0)
		return cursor_fail(c, SOURCE_STEP_LEADING, rc);
	cursor_answered(c);
	if (rc == 0) {
		int64_t retry = c->o.poll_interval_ms < LEAD_RETRY_MS ? c->o.poll_interval_ms
		                                                      : LEAD_RETRY_MS;
		c->lead_at_ms = now + retry;
		if (!c->standby_said && c->o.hooks.lead)
			c->o.hooks.lead(c->o.hooks.arg, false, 0);
		c->standby_said = true;
		return 0;
	}
	/* What this relay still owes stands only on the position it was owed against. */
	if (c->pos_known && c->moving_lost && pos == c->moving_to)
		cursor_moved(c); /* the move whose answer was lost had landed */
	c->moving_lost = false;
	if (!c->pos_known || pos != c->pos) {
		cursor_drop_owed(c);
		c->pos = c->read_pos = pos;
	}
	c->leader = c->pos_known = true;
	c->standby_said = false;
	c->read_fence = 0;
	c->hole = c->sampled_ms = 0;
	c->hole_reads = 0;
	c->read_rows = 0;
	c->lane_due_ms = 0;
	if (c->o.hooks.lead)
		c->o.hooks.lead(c->o.hooks.arg, true, c->pos);
	return 1;
}

/* ---- the batch ---- */

static int pass_row(struct cursor *c, const struct outbox_row *r)
{
	struct position_pass p = { .seq = r->seq, .delay_ms = -1 };

	if (r->ordering_key) {
		cursor_keys_add(&c->keys, r->ordering_key, CURSOR_KEY_PASSED);
		c->batch_keyed = true;
	}
	return cursor_add_pass(c, &p);
}

/* Where the last read stopped at a hole (stuck) or went past it: see struct cursor. */
static void note_hole(struct cursor *c, const struct cursor_read *r, bool stuck)
{
	if (stuck) {
		int64_t hole = c->read_pos + 1;

		if (c->hole != hole)
			c->hole_reads = 0;
		c->hole = hole;
		c->hole_reads++;
		c->read_full = false; /* the rows after the hole cannot go now */
	} else if (!r->bounded || c->read_pos >= c->hole) {
		c->hole = 0;
		c->hole_reads = 0;
	}
}

/* The batch out of the last read: its rows in order, up to the first one of a key already in
 * it (a key's rows go one at a time) or past the byte budget, and never past a hole: a seq
 * the read did not find above the fence, whose row may still be committed (its rows would
 * come out of order, and the position would pass it). Rows that cannot go now are passed.
 * read_pos moves over every row looked at, and to the fence when all were. */
static int build(struct cursor *c, size_t *n)
{
	const struct cursor_read *rd = &c->reads[c->cur];
	int64_t bytes = 0, max = c->o.store.batch_max_bytes;
	size_t i, k = 0;
	bool stuck = false;
	int rc;

	*n = 0;
	if (c->reads[c->cur].rows.n > c->rows_cap) {
		struct outbox_row *r = realloc(c->rows, c->reads[c->cur].rows.n * sizeof(*r));
		if (!r)
			return STORE_ERR_NOMEM;
		c->rows = r;
		c->rows_cap = c->reads[c->cur].rows.n;
	}
	if (cursor_keys_reserve(&c->keys, c->reads[c->cur].rows.n) != 0)
		return STORE_ERR_NOMEM;
	cursor_keys_clear(&c->keys);
	c->batch_keyed = c->read_keyed = false;
	for (i = 0; i < c->reads[c->cur].rows.n; i++) {
		const struct outbox_row *r = &c->reads[c->cur].rows.rows[i];
		const struct position_seen *s = &c->reads[c->cur].seen[i];
		unsigned f = r->ordering_key ? cursor_keys_get(&c->keys, r->ordering_key) : 0;

		if (r->seq > c->read_pos + 1 && r->seq - 1 > rd->fence) {
			stuck = true;
			break;
		}
		c->read_keyed |= r->ordering_key != NULL;
		if (s->later || s->dead || s->held || (f & CURSOR_KEY_PASSED)) {
			if ((rc = pass_row(c, r)) != 0)
				return rc;
		} else if ((f & CURSOR_KEY_IN_BATCH) ||
		           (k > 0 && max > 0 && bytes + (int64_t)r->body_len > max)) {
			break;
		} else {
			c->rows[k++] = *r;
			bytes += (int64_t)r->body_len;
			if (r->ordering_key)
				cursor_keys_add(&c->keys, r->ordering_key, CURSOR_KEY_IN_BATCH);
		}
		c->read_pos = r->seq;
	}
	/* Every row up to the fence was read (all of them, or up to a row past the fence): a
	 * seq up to it that the read did not find will never be committed. */
	if ((stuck || (i == rd->rows.n && !c->read_full)) && rd->fence > c->read_pos)
		c->read_pos = rd->fence;
	note_hole(c, rd, stuck);
	*n = k;
	return 0;
}

static void hand_out(struct cursor *c, const struct outbox_row *rows, size_t n, bool lane,
                     const struct source_batch **out)
{
	c->out = true;
	c->out_lane = lane;
	c->out_us = clock_mono_us();
	c->view.rows = rows;
	c->view.n = n;
	c->view.deadline_ms = clock_mono_ms() + c->o.confirm_timeout_ms;
	*out = &c->view;
}

/* Forgets the read fetched ahead (its rows are read again); *n gets how many it had. */
void cursor_drop_ahead(struct cursor *c, size_t *n)
{
	*n = c->ahead == AHEAD_READY ? c->reads[1 - c->cur].rows.n : 0;
	c->ahead = AHEAD_NONE;
}

/* One read above read_pos into r. A move that passes no rows goes in its round trip: while a
 * batch is out, to where read_pos was when that batch was built (its own rows are not
 * settled), else to read_pos. A move that passes rows goes alone first (cursor_flush()). */
static int read_into(struct cursor *c, struct cursor_read *r)
{
	struct position_carry carry;
	struct position_ask ask;
	int64_t now = clock_mono_ms();
	bool carried;
	int rc;

	if (!c->out && c->n_passes && (rc = cursor_flush(c)) != 0)
		return rc;
	carry = (struct position_carry){ .from = c->pos, .to = c->out ? c->out_from : c->read_pos };
	if ((carried = carry.to > c->pos))
		cursor_moving(c, carry.to, false);
	ask = (struct position_ask){
		.after = c->read_pos,
		.fence = store_watermark_safe(c->store),
		.limit = c->o.store.batch_size,
		/* Stuck at a hole for a while (a transaction open for long): the rows after it
		 * are not read again and again for nothing. */
		.bounded = c->hole && c->hole_reads >= 2,
		.sample = c->hole || c->sampled_ms == 0 ||
		          (c->read_rows == 0 && store_watermark_seen(c->store) > c->read_pos &&
		           now - c->sampled_ms >= SAMPLE_EVERY_MS),
		/* W tells idle() whether seqs were drawn that no read found yet; while rows
		 * flow, the next read comes anyway. */
		.w = c->read_rows == 0,
	};
	if (ask.fence < c->read_pos)
		ask.fence = c->read_pos;
	r->bounded = ask.bounded;
	c->read_us = clock_mono_us();
	rc = position_read(c->store, carried ? &carry : NULL, &ask, &r->rows, &r->seen,
	                   &r->seen_cap, &r->fence);
	if (rc == 0 && ask.sample)
		c->sampled_ms = now;
	if (rc != 0) {
		if (carried)
			c->moving_lost = true; /* it may have landed: lead() looks */
		return cursor_fail(c, SOURCE_STEP_READING, rc);
	}
	return carried ? cursor_move_answered(c, carry.moved) : 0;
}

/* Whether the read fetched ahead holds a row of a key the batch before it had (c->keys still
 * holds that batch's keys: build() clears them). */
static bool ahead_shares_keys(const struct cursor *c)
{
	const struct store_batch *rows = &c->reads[1 - c->cur].rows;

	for (size_t i = 0; i < rows->n; i++)
		if (rows->rows[i].ordering_key &&
		    (cursor_keys_get(&c->keys, rows->rows[i].ordering_key) & CURSOR_KEY_IN_BATCH))
			return true;
	return false;
}

/* Reads above the position (or takes the read fetched ahead) and hands out what may go. */
static int read_next(struct cursor *c, const struct source_batch **out)
{
	int limit = c->o.store.batch_size;
	struct cursor_read *r;
	size_t n;
	int rc;

	if (c->ahead == AHEAD_READY) {
		/* The read fetched ahead goes out before the move past the batch before it, which
		 * the next read carries: a relay killed in between would have both batches published
		 * again. When a key has a row in each, that would send the key's earlier row after
		 * its later one, so the move goes first, alone and durable. */
		if (ahead_shares_keys(c) && (rc = cursor_flush(c)) != 0)
			return rc;
		c->cur = 1 - c->cur;
		c->ahead = AHEAD_NONE;
	} else if ((rc = read_into(c, &c->reads[c->cur])) != 0) {
		return rc;
	}
	r = &c->reads[c->cur];
	cursor_answered(c);
	c->read_fence = r->fence;
	c->read_full = r->rows.n == (size_t)limit;
	if (r->rows.n > 0)
		c->pause_ms = 1; /* rows are flowing: the watermark moves as often as they come */
	c->out_from = c->read_pos;
	if ((rc = build(c, &n)) != 0)
		return cursor_fail(c, SOURCE_STEP_READING, rc);
	/* Gathering goes by the rows that could go (none behind a hole: its pauses are idle()'s);
	 * build() said whether one of those it looked at had a key. */
	c->read_rows = c->hole ? 0 : r->rows.n;
	if (n == 0)
		return 0;
	/* Still armed (a wake-up from idle): the batch goes first, the lock is let go by
	 * cursor_prefetch() while the broker confirms it. */
	hand_out(c, c->rows, n, false, out);
	return 0;
}

/* Claims the exceptions that may go now. */
static int lane_next(struct cursor *c, int64_t now, const struct source_batch **out)
{
	int rc = position_claim_deferred(c->store, c->o.store.batch_size, &c->lane);

	if (rc != 0)
		return cursor_fail(c, SOURCE_STEP_DEFERRED, rc);
	if (c->lane.n == 0) {
		c->lane_due_ms = now + c->o.poll_interval_ms;
		return 0;
	}
	hand_out(c, c->lane.rows, c->lane.n, true, out);
	return 0;
}

/* Nothing to hand out: when to look again. */
static int idle(struct cursor *c, int64_t now, int64_t *ask_at_ms)
{
	int rc;

	if (c->read_full || c->n_passes) {
		*ask_at_ms = now;
		return 0;
	}
	if (c->hole || store_watermark_seen(c->store) > c->read_pos) {
		if (store_watermark_safe(c->store) > c->read_fence) {
			/* The last read's sample settled a fence it could not use yet. */
			*ask_at_ms = now;
			return 0;
		}
		/* Seqs drawn and not read yet (their transactions still running, or rolled back
		 * and waiting for the fence to pass them): read again soon. */
		*ask_at_ms = now + c->pause_ms;
		c->pause_ms = c->pause_ms * 2 > SETTLE_PAUSE_MAX_MS ? SETTLE_PAUSE_MAX_MS
		                                                    : c->pause_ms * 2;
		return 0;
	}
	c->pause_ms = 1;
	/* Going quiet: published rows are recorded now rather than by a read that may be far off
	 * (a move over rows that were not there can wait for that read). */
	if (c->n_unrecorded && (rc = cursor_flush(c)) != 0)
		return rc;
	*ask_at_ms = now + c->o.poll_interval_ms;
	if (c->lane_due_ms < *ask_at_ms)
		*ask_at_ms = c->lane_due_ms;
	if (!c->o.store.channel[0] || store_wakeup_armed(c->store))
		return 0;
	/* Arm, then read once more: its sample covers every seq drawn before the lock was
	 * taken, whose producer may not have notified. */
	rc = store_arm(c->store);
	if (rc == 0)
		rc = store_wakeup_armed_elsewhere(c->store);
	if (rc < 0)
		return cursor_fail(c, SOURCE_STEP_ARMING, rc);
	if (rc == 0 || store_wakeup_armed(c->store))
		*ask_at_ms = now + (rc == 0 ? 1 : 0);
	return 0;
}

int cursor_next(struct cursor *c, const struct source_batch **out, int64_t *ask_at_ms)
{
	int64_t now = clock_mono_ms();
	int rc;

	*out = NULL;
	*ask_at_ms = now;
	if (!c->leader) {
		if ((rc = lead(c, now)) <= 0) {
			*ask_at_ms = c->lead_at_ms;
			return rc;
		}
	}
	/* The read fetched ahead goes out at once, while the move before it commits. */
	if (c->ahead == AHEAD_READY && !(c->prefer_lane && now >= c->lane_due_ms)) {
		if ((rc = read_next(c, out)) != 0 || *out) {
			c->prefer_lane = true;
			return rc;
		}
	}
	/* The rows passed are written before the exceptions are claimed (a move that records
	 * only published rows goes with the next read). */
	if (c->n_passes && (rc = cursor_flush(c)) != 0)
		return rc;
	if (c->prefer_lane && now >= c->lane_due_ms) {
		if ((rc = lane_next(c, now, out)) != 0 || *out) {
			c->prefer_lane = false;
			return rc;
		}
	}
	/* Gathering: behind a short read of rows without a key, the next one waits a little and
	 * takes the rows of that time together. */
	if (c->read_rows > 0) {
		int64_t wait = source_gather_us(clock_mono_us() - c->read_us, c->read_rows,
		                                c->o.store.batch_size, c->read_keyed);
		if (wait > 0) {
			*ask_at_ms = now + (wait + 999) / 1000;
			return 0;
		}
	}
	if ((rc = read_next(c, out)) != 0 || *out) {
		c->prefer_lane = true;
		return rc;
	}
	if (!c->prefer_lane && now >= c->lane_due_ms) {
		if ((rc = lane_next(c, now, out)) != 0 || *out)
			return rc;
	}
	if (c->n_passes && (rc = cursor_flush(c)) != 0)
		return rc;
	return idle(c, now, ask_at_ms);
}

/* Reads the next batch while the broker works on b, and takes its answer here rather than in
 * cursor_settle(): the broker is busy with b until its last confirm, but idle from then until
 * the next batch's first publish, so whatever the relay does between the two is lost to it.
 * Taken after the confirms, a read of 500 rows of 1 KB (its transfer held back by the full
 * socket while the relay waited on the broker, then parsed) kept the broker idle for 0.7 ms of
 * every 16; taken here it costs the broker nothing: with the broker on a core of its own the
 * drain went from 28,276 to 35,377 msgs/s. It is the same read as any other (read_into()), and
 * it carries the move past the batch before b. */
int cursor_prefetch(struct cursor *c, const struct source_batch *b)
{
	int rc;

	if (!c->out || c->out_lane || b != &c->view || c->ahead != AHEAD_NONE || !c->leader)
		return 0;
	/* Busy now: producers need not notify while this relay reads again and again. */
	if (store_wakeup_armed(c->store) && (rc = position_disarm(c->store)) != 0)
		return cursor_fail(c, SOURCE_STEP_DISARMING, rc);
	/* Behind a short read the rows come one commit at a time: reading while the broker
	 * confirms would find few or none and cost a round trip all the same. The read after the
	 * confirms goes instead (and carries the move). A read of at least an eighth of a batch
	 * (what gathering does not wait for) says rows are queueing: the relay fell behind, and
	 * reading after the confirms would keep it behind (see the comment above). */
	if (!c->read_full && c->read_rows * 8 < (size_t)c->o.store.batch_size)
		return 0;
	if ((rc = read_into(c, &c->reads[1 - c->cur])) != 0)
		return rc;
	c->ahead = AHEAD_READY;
	return 0;
}

/* ---- the connection ---- */

int cursor_connect(struct cursor *c)
{
	int rc;

	c->step = SOURCE_STEP_NONE;
	c->leader = c->standby_said = false;
	c->lead_at_ms = 0;
	rc = store_connect(c->store);
	if (rc == STORE_OK && !c->o.store.admin)
		rc = position_check(c->store);
	return rc;
}

void cursor_disconnect(struct cursor *c)
{
	c->leader = false; /* the lead is a session lock: it ended with the session */
	c->ahead = AHEAD_NONE;
	if (c->n_unrecorded)
		c->owed_across = true;
	if (c->out && c->out_lane)
		c->out = false; /* its rows come back by their lease */
	store_disconnect(c->store);
}

bool cursor_connected(const struct cursor *c)
{
	return store_connected(c->store);
}

void cursor_interrupt(struct cursor *c)
{
	store_interrupt(c->store);
}

const char *cursor_errmsg(const struct cursor *c)
{
	return store_errmsg(c->store);
}

enum source_step cursor_step(const struct cursor *c)
{
	return c->step;
}

uint64_t cursor_lock_list_reads(const struct cursor *c)
{
	return store_lock_list_reads(c->store);
}

const char *cursor_server(const struct cursor *c)
{
	return store_server(c->store);
}

bool cursor_wakeup_current(const struct cursor *c)
{
	return store_wakeup_current(c->store);
}

int cursor_token_stem(const struct cursor *c, char *out, size_t cap)
{
	return store_token_stem(c->store, out, cap);
}

int cursor_fd(const struct cursor *c)
{
	return store_socket(c->store);
}

int cursor_input(struct cursor *c, bool *woken)
{
	int rc = store_consume_input(c->store, woken);

	if (rc < 0)
		return cursor_fail(c, SOURCE_STEP_WAITING, rc);
	if (*woken)
		c->pause_ms = 1;
	return 0;
}

int cursor_backlog(struct cursor *c, struct store_status *st)
{
	return store_status(c->store, st);
}

int cursor_partitions_ahead(struct cursor *c, int *made)
{
	return store_partitions_ahead(c->store, made);
}

int cursor_purge(struct cursor *c, int64_t older_than_ms, int batch, const atomic_int *stop,
                 int64_t *n_removed)
{
	return store_purge(c->store, older_than_ms, batch, stop, n_removed);
}

struct cursor *cursor_new(const struct source_options *opts)
{
	struct cursor *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->base.kind = SOURCE_CURSOR;
	c->o = *opts;
	c->o.store.cursor = true; /* the lease source refuses a table it runs; the cursor not */
	c->pause_ms = 1;
	store_batch_init(&c->reads[0].rows);
	store_batch_init(&c->reads[1].rows);
	store_batch_init(&c->lane);
	c->store = store_new(&c->o.store);
	if (!c->store) {
		cursor_free(c);
		return NULL;
	}
	return c;
}

void cursor_free(struct cursor *c)
{
	if (!c)
		return;
	store_free(c->store);
	for (int i = 0; i < 2; i++) {
		store_batch_free(&c->reads[i].rows);
		free(c->reads[i].seen);
	}
	store_batch_free(&c->lane);
	cursor_clear_passes(c);
	free(c->passes);
	free(c->rows);
	cursor_keys_free(&c->keys);
	free(c);
}
