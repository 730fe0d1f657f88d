/* What the broker's answers mean for each row of a batch (its fate: published, retried after a
 * backoff, dead, or released), said in the log and the metrics; and what the source reports
 * (rows marked, owed rows recorded, rows a batch could not hold). relay/worker_private.h. */
#include <stdio.h>
#include <string.h>

#include "amqp/broker.h"
#include "base/clock.h"
#include "relay/backoff.h"
#include "relay/log.h"
#include "relay/metrics.h"
#include "relay/relay.h"
#include "relay/worker_private.h"
#include "store/source/source.h"

static enum metrics_fail_reason fail_reason(enum broker_outcome o)
{
	switch (o) {
	case BROKER_NACKED:
		return METRICS_FAIL_NACKED;
	case BROKER_RETURNED:
		return METRICS_FAIL_UNROUTABLE;
	case BROKER_REFUSED:
		return METRICS_FAIL_REFUSED;
	default:
		return METRICS_FAIL_INVALID;
	}
}

static void log_failure(struct worker *w, const struct outbox_row *row,
                        const struct broker_result *res, const struct source_fate *f, int attempts,
                        enum log_level retry_level)
{
	if (!f->dead) {
		log_event(retry_level, w->component, "could not publish, will retry",
		          LOG_STR("id", row->id), LOG_STR("exchange", row->exchange),
		          LOG_STR("routing_key", row->routing_key), LOG_INT("attempt", attempts),
		          LOG_MS("retry_in", f->delay_ms), LOG_STR("error", res->error),
		          LOG_OPT("trace_id", res->trace_id[0] ? res->trace_id : NULL));
		return;
	}
	log_event(LOG_ERROR, w->component,
	          "message is dead, an operator must requeue or discard it", LOG_STR("id", row->id),
	          LOG_STR("exchange", row->exchange), LOG_STR("routing_key", row->routing_key),
	          LOG_INT("attempts", attempts), LOG_STR("error", res->error),
	          LOG_OPT("ordering_key", row->ordering_key),
	          LOG_OPT("trace_id", res->trace_id[0] ? res->trace_id : NULL));
	if (row->ordering_key && w->cfg->relay_ordering == CONFIG_ORDERING_SKIP_DEAD) {
		log_event(LOG_ERROR, w->component, "dead row set aside, its ordering key moves on",
		          LOG_STR("ordering_key", row->ordering_key), LOG_STR("id", row->id));
		atomic_fetch_add_explicit(&w->relay->metrics.skipped_dead, 1, memory_order_relaxed);
	}
}

/* Nacks a connection backs off for: fewer rows than this are a few rows' trouble, whatever
 * share of their batch they are (under a trickle a batch is a row or two). */
#define NACKS_BACKOFF_MIN 8

/* A broker condition is told from one destination's trouble (a queue rejecting publishes
 * because it is full, one quorum queue without its majority) by its breadth: most of a batch
 * of some size, on more than one exchange and routing key. One destination's rows back off
 * each by itself (DESIGN §4) while the rest keeps flowing: backing off the connection for
 * them held up every healthy queue, after every row, for up to RECONNECT_MAX_MS. */
bool worker_nacks_back_off(size_t rows, size_t nacked, bool one_destination)
{
	return nacked >= NACKS_BACKOFF_MIN && 2 * nacked > rows && !one_destination;
}

/* Gives every row of b its fate by the broker's answer (fates[]); logs and counts the
 * failures, which back off (relay.retry_backoff_*) or are dead after relay.max_attempts. A nack is the broker's own failure (a quorum queue without a
 * majority, reject-publish overflow): the row backs off but is not charged an attempt, so an
 * outage can never make good rows dead. */
void worker_classify(struct worker *w, const struct source_batch *b, struct settled *st)
{
	const struct config *cfg = w->cfg;
	const struct outbox_row *first = NULL;
	size_t nacked = 0;
	bool one_destination = true;

	/* Most of a batch nacked is one condition of the broker, said once by worker_nacked_most():
	 * its rows are logged at debug then, not as thousands of warn lines. */
	for (size_t i = 0; i < b->n; i++) {
		if (w->res[i].outcome != BROKER_NACKED)
			continue;
		if (nacked++ == 0)
			first = &b->rows[i];
		else if (one_destination)
			one_destination = strcmp(b->rows[i].exchange, first->exchange) == 0 &&
			                  strcmp(b->rows[i].routing_key, first->routing_key) == 0;
	}
	st->quiet_nacks = nacked >= NACKS_BACKOFF_MIN && 2 * nacked > b->n;
	st->back_off = worker_nacks_back_off(b->n, nacked, one_destination);
	st->nacked_row = first;

	for (size_t i = 0; i < b->n; i++) {
		const struct outbox_row *r = &b->rows[i];
		struct broker_result *res = &w->res[i];
		struct source_fate *f = &w->fates[i];
		int attempts;

		memset(f, 0, sizeof(*f));
		switch (res->outcome) {
		case BROKER_ACKED:
			f->outcome = SOURCE_PUBLISHED;
			st->n_pub++;
			/* A row made pending by `outbox-relay replay` carries its header. */
			if (outbox_row_replayed(r))
				atomic_fetch_add_explicit(&w->relay->metrics.replayed, 1,
				                          memory_order_relaxed);
			metrics_observe(&w->relay->metrics.confirm_latency,
			                (uint64_t)res->confirm_us);
			break;
		case BROKER_PENDING:
			f->outcome = SOURCE_RELEASED;
			break;
		default:
			f->outcome = SOURCE_FAILED;
			f->error = res->error;
			f->uncounted = res->outcome == BROKER_NACKED;
			attempts = f->uncounted ? r->attempts : r->attempts + 1;
			f->dead = res->outcome == BROKER_INVALID ||
			          (!f->uncounted && attempts >= cfg->relay_max_attempts);
			if (res->outcome == BROKER_INVALID)
				attempts = (int)cfg->relay_max_attempts;
			if (f->uncounted)
				st->n_nacked++;
			f->delay_ms = f->dead ? 0
			                      : backoff_ms(cfg->relay_retry_backoff_min_ms,
			                                   cfg->relay_retry_backoff_max_ms,
			                                   attempts > 0 ? attempts : 1, &w->seed);
			atomic_fetch_add_explicit(
			        &w->relay->metrics.failed[fail_reason(res->outcome)], 1,
			        memory_order_relaxed);
			if (f->dead)
				atomic_fetch_add_explicit(&w->relay->metrics.dead, 1,
				                          memory_order_relaxed);
			log_failure(w, r, res, f, attempts,
			            f->uncounted && st->quiet_nacks ? LOG_DEBUG : LOG_WARN);
			break;
		}
	}
}

/* Most of a batch nacked, across destinations, is a condition of the broker (quorum queues
 * that lost their majority, a node refusing publishes), not of the rows: retrying row by row
 * would hammer it. Back off the whole connection as after a lost connection. Of one
 * destination, it is that queue's: its rows back off each by itself, said in one line. */
void worker_nacked_most(struct worker *w, const struct source_batch *x, const struct settled *st)
{
	if (!st->quiet_nacks)
		return;
	if (!st->back_off) {
		log_event(LOG_WARN, w->component,
		          "broker refused most of the batch for one destination, its rows back off",
		          LOG_UINT("nacked", st->n_nacked), LOG_UINT("rows", x->n),
		          LOG_STR("exchange", st->nacked_row->exchange),
		          LOG_STR("routing_key", st->nacked_row->routing_key));
		return;
	}
	log_event(LOG_WARN, w->component, "broker refused most of the batch, backing off",
	          LOG_UINT("nacked", st->n_nacked), LOG_UINT("rows", x->n));
	worker_broker_back_off(w, "broker nacked most of a batch");
}

/* ---- what the source reports ---- */

static void on_marked(void *arg, size_t rows, int64_t batch_us)
{
	struct worker *w = arg;

	/* A row not hit was taken over by another relay after its lease ran out (it will be
	 * published and marked there): counted once, by whoever marked it. */
	atomic_fetch_add_explicit(&w->relay->metrics.published, rows, memory_order_relaxed);
	metrics_observe(&w->relay->metrics.batch_duration, (uint64_t)batch_us);
}

static void on_repaid(void *arg, size_t marked, size_t no_longer_ours)
{
	struct worker *w = arg;

	log_event(LOG_INFO, w->component, "marked rows confirmed while the database was away",
	          LOG_UINT("rows", marked), LOG_UINT("no_longer_ours", no_longer_ours));
	atomic_fetch_add_explicit(&w->relay->metrics.published, marked, memory_order_relaxed);
}

/* Rows a fetch leased but its batch could not hold: handed back at once, or recorded dead
 * because even alone they exceed what a batch may hold. */
static void on_unheld(void *arg, size_t cut, size_t refused, const char *first_id,
                      const char *error)
{
	struct worker *w = arg;

	if (refused) {
		log_event(LOG_ERROR, w->component,
		          "message is dead, an operator must requeue or discard it",
		          LOG_STR("id", first_id), LOG_STR("error", error),
		          LOG_UINT("rows", refused));
		atomic_fetch_add_explicit(&w->relay->metrics.failed[METRICS_FAIL_INVALID], refused,
		                          memory_order_relaxed);
		atomic_fetch_add_explicit(&w->relay->metrics.dead, refused, memory_order_relaxed);
	}
	if (cut)
		log_event(LOG_WARN, w->component,
		          "claimed more than a batch may hold, handed the rest back",
		          LOG_UINT("rows", cut));
}

static void on_released(void *arg, size_t rows)
{
	struct worker *w = arg;

	atomic_fetch_add_explicit(&w->relay->metrics.released, rows, memory_order_relaxed);
}

static void on_lead(void *arg, bool leading, int64_t position)
{
	struct worker *w = arg;

	if (leading)
		log_event(LOG_INFO, w->component, "leading the table",
		          LOG_INT("position", position));
	else
		log_event(LOG_INFO, w->component, "another relay leads the table, standing by");
}

static void on_answered(void *arg)
{
	struct worker *w = arg;

	w->db.streak = 0;
}

static void on_tick(void *arg)
{
	worker_tick(arg);
}

struct source_hooks worker_source_hooks(struct worker *w)
{
	return (struct source_hooks){
		.arg = w,
		.marked = on_marked,
		.repaid = on_repaid,
		.unheld = on_unheld,
		.released = on_released,
		.lead = on_lead,
		.answered = on_answered,
		.tick = on_tick,
	};
}
