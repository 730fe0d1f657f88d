/* The cursor source (store/source/source.h, relay.source = cursor): one relay leads the table
 * and reads the rows above its position, up to the ordering watermark's fence (no row a running
 * transaction may still commit is ever passed); after the broker has confirmed a batch, the
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
#include "store/source/lease.h"
#include "store/source/position.h"
#include "store/source/source_private.h"
#include "store/store.h"

/* A relay that does not lead tries for the lead this often (at most relay.poll_interval): the
 * longest a table goes unpublished after its leader's session ends, beyond the server noticing. */
#define LEAD_RETRY_MS 200
/* While rows wait for the watermark to settle, the read is tried again after 1, 2, 4 ... ms, at
 * most this. */
#define SETTLE_PAUSE_MAX_MS 50

struct cursor {
	struct source base; /* first: a struct source * is a struct cursor * */
	struct source_options o;
	struct store *store;

	bool leader;
	bool standby_said;  /* the lead hook heard this relay stands by */
	bool pos_known;     /* pos is what this relay last read or wrote of the table */
	int64_t lead_at_ms; /* when to try for the lead again */
	int64_t pos;        /* the table's position */
	int64_t read_pos;   /* every row up to it was handed out or passed */
	int64_t read_fence; /* the fence the last read went up to */
	bool read_full;     /* the last read found as many rows as it asked for */

	/* What the next move writes: the rows passed (their error texts owned), and how many
	 * confirmed rows it records (owed until it lands). */
	struct position_pass *passes;
	size_t n_passes, passes_cap;
	size_t n_unrecorded;
	int64_t batch_t0_us;
	bool batch_keyed; /* the batch out passed a keyed row, or one of its keyed rows failed */
	bool owed_across; /* the rows owed were confirmed before the connection was lost */
	/* The move on the wire, answered while the next batch goes out: where to, how many of
	 * the passes and owed rows it records; lost: the connection went before its answer (it
	 * may have landed). */
	bool moving, moving_lost;
	int64_t moving_to;
	size_t moving_passes, moving_rows;

	/* Two reads: reads[cur] is the one the batch out was built from (its rows point into it),
	 * reads[1 - cur] the one fetched ahead while the broker confirms. */
	struct cursor_read {
		struct store_batch rows;
		struct position_seen *seen;
		size_t seen_cap;
		int64_t fence;
	} reads[2];
	int cur;
	enum { AHEAD_NONE, AHEAD_SENT, AHEAD_READY } ahead;
	struct cursor_keys keys;
	struct outbox_row *rows; /* the batch handed out */
	size_t rows_cap;

	struct store_batch lane; /* exceptions claimed */
	int64_t lane_due_ms;
	bool prefer_lane;

	bool out, out_lane; /* a batch is handed out (of exceptions) */
	int64_t out_us;
	struct source_batch view;

	int64_t pause_ms;
	enum source_step step;
};

static int fail(struct cursor *c, enum source_step step, int rc)
{
	c->step = step;
	return rc;
}

static void answered(struct cursor *c)
{
	if (c->o.hooks.answered)
		c->o.hooks.answered(c->o.hooks.arg);
}

/* ---- what the next move writes ---- */

static void clear_passes(struct cursor *c)
{
	for (size_t i = 0; i < c->n_passes; i++)
		free((char *)c->passes[i].error);
	c->n_passes = 0;
}

static int add_pass(struct cursor *c, const struct position_pass *p)
{
	if (c->n_passes == c->passes_cap) {
		size_t cap = c->passes_cap ? 2 * c->passes_cap : 64;
		struct position_pass *np = realloc(c->passes, cap * sizeof(*np));
		if (!np)
			return STORE_ERR_NOMEM;
		c->passes = np;
		c->passes_cap = cap;
	}
	c->passes[c->n_passes] = *p;
	if (p->error && !(c->passes[c->n_passes].error = strdup(p->error)))
		return STORE_ERR_NOMEM;
	c->n_passes++;
	return 0;
}

/* What was owed is forgotten: another relay leads from a position of its own, and publishes
 * again what this one had published above it (a duplicate, never a loss). */
static void drop_owed(struct cursor *c)
{
	if (c->n_unrecorded && c->o.hooks.repaid)
		c->o.hooks.repaid(c->o.hooks.arg, 0, c->n_unrecorded);
	c->n_unrecorded = 0;
	c->owed_across = c->moving = c->moving_lost = false;
	clear_passes(c);
}

/* The move landed: what it recorded is no longer owed. */
static void moved(struct cursor *c)
{
	c->pos = c->moving_to;
	for (size_t i = 0; i < c->moving_passes; i++)
		free((char *)c->passes[i].error);
	memmove(c->passes, c->passes + c->moving_passes,
	        (c->n_passes - c->moving_passes) * sizeof(*c->passes));
	c->n_passes -= c->moving_passes;
	if (c->moving_passes)
		c->lane_due_ms = 0; /* what was passed may be due already */
	c->n_unrecorded -= c->moving_rows;
	if (c->moving_rows && c->owed_across && c->o.hooks.repaid)
		c->o.hooks.repaid(c->o.hooks.arg, c->moving_rows, 0);
	else if (c->moving_rows && c->o.hooks.marked)
		c->o.hooks.marked(c->o.hooks.arg, c->moving_rows, clock_mono_us() - c->batch_t0_us);
	if (c->n_unrecorded == 0)
		c->owed_across = false;
	c->moving = c->moving_lost = false;
}

/* Sends the move to read_pos with the passed rows, unless one is on the wire already or a
 * batch is out (its rows are below read_pos and not settled). */
static int send_move(struct cursor *c)
{
	int rc;

	if (c->moving || c->out || (c->read_pos <= c->pos && c->n_passes == 0))
		return 0;
	rc = position_move_send(c->store, c->pos, c->read_pos, c->passes, c->n_passes);
	if (rc != 0)
		return fail(c, SOURCE_STEP_MOVING, rc);
	c->moving = true;
	c->moving_to = c->read_pos;
	c->moving_passes = c->n_passes;
	c->moving_rows = c->n_unrecorded;
	return 0;
}

static int collect_move(struct cursor *c)
{
	int rc;

	if (!c->moving)
		return 0;
	rc = position_move_recv(c->store);
	if (rc < 0) {
		c->moving = false;
		c->moving_lost = true;
		return fail(c, SOURCE_STEP_MOVING, rc);
	}
	if (rc == 0) {
		c->leader = c->pos_known = false;
		drop_owed(c);
		return fail(c, SOURCE_STEP_MOVING, STORE_ERR_QUERY);
	}
	moved(c);
	return 0;
}

static int collect_ahead(struct cursor *c);

/* Reads the answer on the wire (a move or a read fetched ahead: one at a time), so that the
 * next statement may go. */
static int quiet(struct cursor *c)
{
	int rc = collect_move(c);

	return rc != 0 ? rc : collect_ahead(c);
}

/* Moves the position and waits for it. */
static int flush(struct cursor *c)
{
	int rc = quiet(c);

	if (rc == 0)
		rc = send_move(c);
	return rc != 0 ? rc : collect_move(c);
}

/* ---- leading ---- */

static int lead(struct cursor *c, int64_t now)
{
	int64_t pos = 0;
	int rc;

	if (now < c->lead_at_ms)
		return 0;
	if ((rc = quiet(c)) != 0)
		return rc;
	rc = position_lead(c->store, &pos);
	if (rc < 0)
		return fail(c, SOURCE_STEP_LEADING, rc);
	answered(c);
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
		moved(c); /* the move whose answer was lost had landed */
	c->moving_lost = false;
	if (!c->pos_known || pos != c->pos) {
		drop_owed(c);
		c->pos = c->read_pos = pos;
	}
	c->leader = c->pos_known = true;
	c->standby_said = false;
	c->read_fence = 0;
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
	return add_pass(c, &p);
}

/* The batch out of the last read: its rows in order, up to the first one of a key already in
 * it (a key's rows go one at a time) or past the byte budget; rows that cannot go now are
 * passed. read_pos moves over every row looked at, and to the fence when all were. */
static int build(struct cursor *c, size_t *n)
{
	int64_t bytes = 0, max = c->o.store.batch_max_bytes;
	size_t i, k = 0;
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
	c->batch_keyed = false;
	for (i = 0; i < c->reads[c->cur].rows.n; i++) {
		const struct outbox_row *r = &c->reads[c->cur].rows.rows[i];
		const struct position_seen *s = &c->reads[c->cur].seen[i];
		unsigned f = r->ordering_key ? cursor_keys_get(&c->keys, r->ordering_key) : 0;

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
	if (i == c->reads[c->cur].rows.n && !c->read_full && c->read_fence > c->read_pos)
		c->read_pos = c->read_fence;
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

/* The read fetched ahead, once its answer is in. */
static int collect_ahead(struct cursor *c)
{
	struct cursor_read *r = &c->reads[1 - c->cur];
	int rc;

	if (c->ahead != AHEAD_SENT)
		return 0;
	c->ahead = AHEAD_NONE;
	rc = position_read_recv(c->store, &r->rows, &r->seen, &r->seen_cap);
	if (rc != 0)
		return fail(c, SOURCE_STEP_READING, rc);
	c->ahead = AHEAD_READY;
	return 0;
}

/* Forgets the read fetched ahead (its rows are read again); *n gets how many it had. */
static int drop_ahead(struct cursor *c, size_t *n)
{
	int rc = collect_ahead(c);

	*n = c->ahead == AHEAD_READY ? c->reads[1 - c->cur].rows.n : 0;
	c->ahead = AHEAD_NONE;
	return rc;
}

/* Reads above the position (or takes the read fetched ahead) and hands out what may go. */
static int read_next(struct cursor *c, const struct source_batch **out)
{
	int64_t fence = store_watermark_safe(c->store);
	int limit = c->o.store.batch_size;
	struct cursor_read *r;
	size_t n;
	int rc;

	if (c->ahead == AHEAD_READY) {
		c->cur = 1 - c->cur;
		c->ahead = AHEAD_NONE;
		r = &c->reads[c->cur];
	} else {
		if ((rc = quiet(c)) != 0)
			return rc;
		fence = store_watermark_safe(c->store); /* the answers just read may move it */
		r = &c->reads[c->cur];
		r->fence = fence < c->read_pos ? c->read_pos : fence;
		rc = position_read(c->store, c->read_pos, r->fence, limit, &r->rows, &r->seen,
		                   &r->seen_cap);
		if (rc != 0)
			return fail(c, SOURCE_STEP_READING, rc);
	}
	answered(c);
	c->read_fence = r->fence;
	c->read_full = r->rows.n == (size_t)limit;
	if (r->rows.n > 0)
		c->pause_ms = 1; /* rows are flowing: the watermark moves as often as they come */
	if ((rc = build(c, &n)) != 0)
		return fail(c, SOURCE_STEP_READING, rc);
	if (n == 0)
		return 0;
	if (store_wakeup_armed(c->store) &&
	    ((rc = quiet(c)) != 0 || (rc = position_disarm(c->store)) != 0))
		return fail(c, SOURCE_STEP_DISARMING, rc);
	hand_out(c, c->rows, n, false, out);
	return 0;
}

/* Claims the exceptions that may go now. */
static int lane_next(struct cursor *c, int64_t now, const struct source_batch **out)
{
	int rc = quiet(c);

	if (rc == 0)
		rc = position_claim_deferred(c->store, c->o.store.batch_size, &c->lane);
	if (rc != 0)
		return fail(c, SOURCE_STEP_DEFERRED, rc);
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
	if (store_watermark_seen(c->store) > c->read_fence) {
		/* Rows may be committed above the fence: read again once the watermark moves. */
		*ask_at_ms = now + c->pause_ms;
		c->pause_ms = c->pause_ms * 2 > SETTLE_PAUSE_MAX_MS ? SETTLE_PAUSE_MAX_MS
		                                                    : c->pause_ms * 2;
		return 0;
	}
	c->pause_ms = 1;
	*ask_at_ms = now + c->o.poll_interval_ms;
	if (c->lane_due_ms < *ask_at_ms)
		*ask_at_ms = c->lane_due_ms;
	if (!c->o.store.channel[0] || store_wakeup_armed(c->store))
		return 0;
	/* Arm, then read once more: its sample covers every seq drawn before the lock was
	 * taken, whose producer may not have notified. */
	if ((rc = quiet(c)) != 0)
		return rc;
	rc = store_arm(c->store);
	if (rc == 0)
		rc = store_wakeup_armed_elsewhere(c->store);
	if (rc < 0)
		return fail(c, SOURCE_STEP_ARMING, rc);
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
	if ((rc = flush(c)) != 0)
		return rc;
	if (c->prefer_lane && now >= c->lane_due_ms) {
		if ((rc = lane_next(c, now, out)) != 0 || *out) {
			c->prefer_lane = false;
			return rc;
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
	if (c->n_passes && (rc = flush(c)) != 0)
		return rc;
	return idle(c, now, ask_at_ms);
}

int cursor_prefetch(struct cursor *c, const struct source_batch *b)
{
	struct cursor_read *r = &c->reads[1 - c->cur];
	int64_t fence;
	int rc;

	if (!c->out || c->out_lane || b != &c->view || c->ahead != AHEAD_NONE || !c->leader)
		return 0;
	if ((rc = quiet(c)) != 0)
		return rc;
	fence = store_watermark_safe(c->store);
	r->fence = fence < c->read_pos ? c->read_pos : fence;
	rc = position_read_send(c->store, c->read_pos, r->fence, c->o.store.batch_size);
	if (rc != 0)
		return fail(c, SOURCE_STEP_READING, rc);
	c->ahead = AHEAD_SENT;
	return 0;
}

/* ---- settling ---- */

/* The exceptions' fates, written under their claim's token as the lease source writes its. */
static int settle_lane(struct cursor *c, const struct source_fate *fates)
{
	size_t n = c->lane.n, np = 0, nf = 0, nr = 0;
	int64_t *pub = calloc(n ? n : 1, sizeof(*pub));
	struct store_failure *fail_rows = calloc(n ? n : 1, sizeof(*fail_rows));
	const char **rel = calloc(n ? n : 1, sizeof(*rel));
	int rc = STORE_ERR_NOMEM;

	if (!pub || !fail_rows || !rel)
		goto out;
	for (size_t i = 0; i < n; i++) {
		const struct outbox_row *r = &c->lane.rows[i];

		if (fates[i].outcome == SOURCE_PUBLISHED)
			pub[np++] = r->seq;
		else if (fates[i].outcome == SOURCE_FAILED)
			fail_rows[nf++] = (struct store_failure){ .id = r->id,
				                                  .error = fates[i].error,
				                                  .delay_ms = fates[i].delay_ms,
				                                  .dead = fates[i].dead,
				                                  .uncounted = fates[i].uncounted };
		else
			rel[nr++] = r->id;
	}
	rc = 0;
	if (np && (rc = store_mark_published(c->store, c->lane.token, pub, np,
	                                     c->o.delete_published)) != 0) {
		rc = fail(c, SOURCE_STEP_MARKING, rc);
		goto out;
	}
	if (np && c->o.hooks.marked)
		c->o.hooks.marked(c->o.hooks.arg, np, clock_mono_us() - c->out_us);
	if (nf && (rc = store_mark_failed(c->store, c->lane.token, fail_rows, nf, NULL)) != 0) {
		rc = fail(c, SOURCE_STEP_MARKING_FAILED, rc);
		goto out;
	}
	if (nr && (rc = store_release(c->store, c->lane.token, rel, nr)) != 0) {
		rc = fail(c, SOURCE_STEP_RELEASING, rc);
		goto out;
	}
	if (nr && c->o.hooks.released)
		c->o.hooks.released(c->o.hooks.arg, nr);
	c->lane_due_ms = 0; /* the next of each key may go now */
out:
	free(pub);
	free(fail_rows);
	free(rel);
	return rc;
}

/* The batch's fates: confirmed rows are recorded by the move; every other row is passed
 * (deferred), with its failure when it has one. */
static int settle_read(struct cursor *c, const struct source_batch *b,
                       const struct source_fate *fates)
{
	size_t released = 0, published = 0;
	int rc;

	static const struct source_fate unsaid = { .outcome = SOURCE_RELEASED };

	for (size_t i = 0; i < b->n; i++) {
		/* Nothing said of the batch (no fates): every row is passed as never answered. */
		const struct source_fate *f = fates ? &fates[i] : &unsaid;
		struct position_pass p = { .seq = b->rows[i].seq, .delay_ms = -1 };

		if (f->outcome == SOURCE_PUBLISHED) {
			published++;
			continue;
		}
		if (b->rows[i].ordering_key)
			c->batch_keyed = true;
		if (f->outcome == SOURCE_FAILED) {
			p.error = f->error;
			p.delay_ms = f->delay_ms;
			p.dead = f->dead;
			p.counted = !f->uncounted && !f->dead;
		} else {
			released++;
		}
		if ((rc = add_pass(c, &p)) != 0)
			return rc;
	}
	if (published && !c->n_unrecorded)
		c->batch_t0_us = c->out_us;
	c->n_unrecorded += published;
	if (released && c->o.hooks.released)
		c->o.hooks.released(c->o.hooks.arg, released);
	return 0;
}

int cursor_settle(struct cursor *c, const struct source_batch *b, const struct source_fate *fates)
{
	int rc;

	if (!c->out || b != &c->view)
		return 0;
	c->out = false;
	if (!fates && c->out_lane)
		return 0; /* nothing can be said of it: exceptions come back by their lease */
	if (c->out_lane) {
		if (!store_connected(c->store))
			return 0;
		return (rc = quiet(c)) != 0 ? rc : settle_lane(c, fates);
	}
	if ((rc = settle_read(c, b, fates)) != 0)
		return fail(c, SOURCE_STEP_MOVING, rc);
	if (!store_connected(c->store) || !c->leader) {
		/* Owed: moved once this relay leads again from the same position. */
		c->owed_across = c->n_unrecorded > 0;
		return 0;
	}
	if ((rc = quiet(c)) != 0)
		return rc;
	/* A keyed row passed: the read fetched ahead did not know its key waits behind it. */
	if (c->batch_keyed)
		c->ahead = AHEAD_NONE;
	return send_move(c); /* answered while the next batch goes out */
}

/* Hands back the read fetched ahead (nothing to write: its rows are above the position). */
static int hand_back(struct cursor *c)
{
	size_t n = 0;
	int rc = drop_ahead(c, &n);

	if (n && c->o.hooks.released)
		c->o.hooks.released(c->o.hooks.arg, n);
	return rc;
}

int cursor_pause(struct cursor *c)
{
	int rc = 0;

	if (c->leader && store_connected(c->store) && (rc = hand_back(c)) == 0)
		rc = flush(c);
	if (rc == 0 && store_connected(c->store) && store_wakeup_armed(c->store) &&
	    (rc = position_disarm(c->store)) != 0)
		rc = fail(c, SOURCE_STEP_DISARMING, rc);
	return rc;
}

int cursor_finish(struct cursor *c)
{
	int rc = 0;

	if (c->leader && store_connected(c->store) && (rc = hand_back(c)) == 0)
		rc = flush(c);
	return rc;
}

size_t cursor_owed(const struct cursor *c)
{
	return c->n_unrecorded;
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
	if (c->moving) {
		c->moving = false;
		c->moving_lost = true; /* it may have landed: lead() looks */
	}
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
		return fail(c, SOURCE_STEP_WAITING, rc);
	if (*woken)
		c->pause_ms = 1;
	return 0;
}

int cursor_backlog(struct cursor *c, struct store_status *st)
{
	return store_status(c->store, st);
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
	clear_passes(c);
	free(c->passes);
	free(c->rows);
	cursor_keys_free(&c->keys);
	free(c);
}
