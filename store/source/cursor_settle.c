/* The cursor source's moves and settling (store/source/cursor_source.c tells the design):
 * what the next move writes, the move and its answer (a move that passes no rows goes with the
 * next read, cursor_source.c), each batch's fates, pause and finish. */
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "store/source/cursor_source_private.h"

/* ---- what the next move writes ---- */

void cursor_clear_passes(struct cursor *c)
{
	for (size_t i = 0; i < c->n_passes; i++)
		free((char *)c->passes[i].error);
	c->n_passes = 0;
}

int cursor_add_pass(struct cursor *c, const struct position_pass *p)
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
void cursor_drop_owed(struct cursor *c)
{
	if (c->n_unrecorded && c->o.hooks.repaid)
		c->o.hooks.repaid(c->o.hooks.arg, 0, c->n_unrecorded);
	c->n_unrecorded = 0;
	c->owed_across = c->moving_lost = false;
	cursor_clear_passes(c);
}

/* The move landed: what it recorded is no longer owed. */
void cursor_moved(struct cursor *c)
{
	c->pos = c->moving_to;
	if (c->moving_passes) {
		for (size_t i = 0; i < c->moving_passes; i++)
			free((char *)c->passes[i].error);
		memmove(c->passes, c->passes + c->moving_passes,
		        (c->n_passes - c->moving_passes) * sizeof(*c->passes));
		c->n_passes -= c->moving_passes;
	}
	if (c->moving_passes)
		c->lane_due_ms = 0; /* what was passed may be due already */
	c->n_unrecorded -= c->moving_rows;
	if (c->moving_rows && c->owed_across && c->o.hooks.repaid)
		c->o.hooks.repaid(c->o.hooks.arg, c->moving_rows, 0);
	else if (c->moving_rows && c->o.hooks.marked)
		c->o.hooks.marked(c->o.hooks.arg, c->moving_rows, clock_mono_us() - c->batch_t0_us);
	if (c->n_unrecorded == 0)
		c->owed_across = false;
	c->moving_lost = false;
}

/* What the move to `to` records, set before it is sent: the passes (all of them) or none. */
void cursor_moving(struct cursor *c, int64_t to, bool passes)
{
	c->moving_to = to;
	c->moving_passes = passes ? c->n_passes : 0;
	c->moving_rows = c->n_unrecorded;
}

/* A move answered: moved (1) or not, the position being no longer where it started (0: another
 * relay leads, and what was owed stood on that position). */
int cursor_move_answered(struct cursor *c, int moved)
{
	if (!moved) {
		c->leader = c->pos_known = false;
		cursor_drop_owed(c);
		return cursor_fail(c, SOURCE_STEP_MOVING, STORE_ERR_QUERY);
	}
	cursor_moved(c);
	return 0;
}

/* Moves the position to read_pos with the passed rows and waits for it, unless a batch is out
 * (its rows are below read_pos and not settled) or there is nothing to move. */
int cursor_flush(struct cursor *c)
{
	int rc;

	if (c->out || (c->read_pos <= c->pos && c->n_passes == 0))
		return 0;
	cursor_moving(c, c->read_pos, true);
	rc = position_move(c->store, c->pos, c->read_pos, c->passes, c->n_passes);
	if (rc < 0) {
		c->moving_lost = true; /* it may have landed: lead() looks */
		return cursor_fail(c, SOURCE_STEP_MOVING, rc);
	}
	return cursor_move_answered(c, rc);
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
		rc = cursor_fail(c, SOURCE_STEP_MARKING, rc);
		goto out;
	}
	if (np && c->o.hooks.marked)
		c->o.hooks.marked(c->o.hooks.arg, np, clock_mono_us() - c->out_us);
	if (nf && (rc = store_mark_failed(c->store, c->lane.token, fail_rows, nf, NULL)) != 0) {
		rc = cursor_fail(c, SOURCE_STEP_MARKING_FAILED, rc);
		goto out;
	}
	if (nr && (rc = store_release(c->store, c->lane.token, rel, nr)) != 0) {
		rc = cursor_fail(c, SOURCE_STEP_RELEASING, rc);
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
		if ((rc = cursor_add_pass(c, &p)) != 0)
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
		return settle_lane(c, fates);
	}
	if ((rc = settle_read(c, b, fates)) != 0)
		return cursor_fail(c, SOURCE_STEP_MOVING, rc);
	if (!store_connected(c->store) || !c->leader) {
		/* Owed: moved once this relay leads again from the same position. */
		c->owed_across = c->n_unrecorded > 0;
		return 0;
	}
	/* A keyed row passed: the read fetched ahead did not know its key waits behind it. */
	if (c->batch_keyed)
		c->ahead = AHEAD_NONE;
	/* A move that only records published rows goes with the next read, in its round trip
	 * (cursor_source.c); one that writes exceptions is waited for, so that what settle says is
	 * in the table. */
	return c->n_passes ? cursor_flush(c) : 0;
}

/* Hands back the read fetched ahead (nothing to write: its rows are above the position). */
static void hand_back(struct cursor *c)
{
	size_t n = 0;

	cursor_drop_ahead(c, &n);
	if (n && c->o.hooks.released)
		c->o.hooks.released(c->o.hooks.arg, n);
}

int cursor_pause(struct cursor *c)
{
	int rc = 0;

	if (c->leader && store_connected(c->store)) {
		hand_back(c);
		rc = cursor_flush(c);
	}
	if (rc == 0 && store_connected(c->store) && store_wakeup_armed(c->store) &&
	    (rc = position_disarm(c->store)) != 0)
		rc = cursor_fail(c, SOURCE_STEP_DISARMING, rc);
	return rc;
}

int cursor_finish(struct cursor *c)
{
	int rc = 0;

	if (c->leader && store_connected(c->store)) {
		hand_back(c);
		rc = cursor_flush(c);
	}
	return rc;
}

size_t cursor_owed(const struct cursor *c)
{
	return c->n_unrecorded;
}
