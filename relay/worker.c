/* One relay loop: moves batches between a source of rows (store/source.h) and the broker. It
 * asks the source for a batch, publishes it with confirms, and tells the source how each row
 * ended; it keeps both connections up, reconnecting with backoff, and says what happens in
 * the log and the metrics. How rows are found, leased and marked is the source's business:
 * a row the loop cannot account for is never dropped, the source keeps it or it comes back by
 * itself. */
#include <stdio.h>
#include <stdlib.h>

#include "amqp/broker.h"
#include "base/clock.h"
#include "relay/log.h"
#include "relay/metrics.h"
#include "relay/relay.h"
#include "relay/worker_private.h"
#include "store/source/source.h"

static int grow(struct worker *w, size_t n)
{
	size_t cap = w->cap ? w->cap : 64;
	void *p;

	if (n <= w->cap)
		return 0;
	while (cap < n)
		cap *= 2;
	p = realloc(w->res, cap * sizeof(*w->res));
	if (!p)
		return -1;
	w->res = p;
	p = realloc(w->fates, cap * sizeof(*w->fates));
	if (!p)
		return -1;
	w->fates = p;
	w->cap = cap;
	return 0;
}

/* One turn of the pipeline: batch b is published; while the broker confirms it, the source
 * fetches the next one (and records the previous batch), so that the broker and the database
 * work at the same time. Then every row of b gets its fate. */
static void cycle(struct worker *w, const struct source_batch *b)
{
	struct settled st = { 0 };
	int brc, rc;

	if (grow(w, b->n) < 0) {
		/* Nothing to settle them with: the rows come back by themselves. */
		log_event(LOG_ERROR, w->component, "out of memory, leaving the batch to its lease");
		if (source_settle(w->source, b, NULL) < 0)
			worker_db_failed(w, -1);
		return;
	}
	for (size_t i = 0; i < b->n; i++) {
		w->res[i].outcome = BROKER_PENDING;
		w->res[i].error[0] = '\0';
		w->res[i].confirm_us = 0;
	}
	atomic_fetch_add_explicit(&w->relay->metrics.claimed, b->n, memory_order_relaxed);
	broker_set_batch_deadline(w->broker, b->deadline_ms);

	brc = broker_publish(w->broker, b->rows, b->n, w->res);
	if (brc == BROKER_OK && !atomic_load(&w->relay->stopping)) {
		rc = source_prefetch(w->source, b);
		if (rc < 0)
			worker_db_failed(w, rc); /* the source owes what it must */
	}
	if (brc == BROKER_OK)
		brc = broker_confirm(w->broker, b->rows, b->n, w->res);

	worker_classify(w, b, &st);
	/* The broker did useful work only if it took something: a batch it nacked whole (a queue
	 * without its majority) must let the reconnect backoff grow. */
	if (brc == BROKER_OK && st.n_pub > 0)
		w->mq.streak = 0;
	if (brc < 0)
		worker_broker_failed(w, brc,
		                     true); /* the batch fetched ahead goes back (source_pause) */
	rc = source_settle(w->source, b, w->fates);
	if (rc < 0) {
		if (source_step(w->source) == SOURCE_STEP_MARKING_FAILED)
			log_event(LOG_WARN, w->component,
			          "could not record failed rows, they return when their lease ends",
			          LOG_STR("error", source_errmsg(w->source)));
		worker_db_failed(w, rc);
		return;
	}
	if (brc == BROKER_OK)
		worker_nacked_most(w, b, &st);
}

/* ---- the loop ---- */

static void worker_loop(struct worker *w)
{
	while (!atomic_load(&w->relay->stopping)) {
		const struct source_batch *b;
		int64_t ask_at;
		bool db_ok, mq_ok;
		int rc;

		worker_tick(w);
		db_ok = worker_ensure_db(w);
		mq_ok = worker_ensure_broker(w);
		if (!db_ok || !mq_ok) {
			int64_t next = INT64_MAX;

			/* Nothing may wait on the database while we sleep: what is in flight is
			 * recorded, a batch fetched ahead goes back, the wake-up stops. */
			if (db_ok) {
				rc = source_pause(w->source);
				if (rc < 0) {
					if (source_step(w->source) == SOURCE_STEP_HANDING_BACK)
						log_event(
						        LOG_WARN, w->component,
						        "could not release leases, they expire by "
						        "themselves",
						        LOG_STR("error", source_errmsg(w->source)));
					worker_db_failed(w, rc);
					continue;
				}
			}
			if (!db_ok)
				next = w->db.retry_at_ms;
			if (!mq_ok && w->mq.retry_at_ms < next)
				next = w->mq.retry_at_ms;
			worker_wait(w, next);
			continue;
		}
		rc = source_next(w->source, &b, &ask_at);
		if (rc < 0) {
			worker_db_failed(w, rc);
			continue;
		}
		if (b)
			cycle(w, b);
		else
			worker_wait(w, ask_at);
	}
}

void *worker_main(void *arg)
{
	struct worker *w = arg;
	int rc;

	log_set_source(w->relay->name);
	worker_tick(w);
	worker_loop(w);

	/* Orderly shutdown: what is in flight is recorded, a batch fetched ahead is handed back,
	 * and whatever is owed is recorded if the database lets us (all bounded by the shutdown
	 * deadline: the store gives up with STORE_ERR_ABORTED at it). */
	rc = source_finish(w->source);
	if (rc < 0) {
		enum source_step step = source_step(w->source);

		if (step == SOURCE_STEP_HANDING_BACK)
			log_event(LOG_WARN, w->component,
			          "could not release leases, they expire by themselves",
			          LOG_STR("error", source_errmsg(w->source)));
		worker_db_failed(w, rc);
		if (step == SOURCE_STEP_REPAYING)
			log_event(LOG_WARN, w->component, "could not mark confirmed rows");
	}
	if (source_owed(w->source))
		log_event(
		        LOG_WARN, w->component,
		        "exiting with confirmed rows unmarked; they will be published again after "
		        "their lease");
	if (w->db.up)
		atomic_fetch_sub_explicit(&w->relay->metrics.db_up, 1, memory_order_relaxed);
	if (w->mq.up)
		atomic_fetch_sub_explicit(&w->relay->metrics.broker_up, 1, memory_order_relaxed);
	w->db.up = w->mq.up = false;
	broker_disconnect(w->broker);
	source_disconnect(w->source);
	atomic_store(&w->done, 1);
	return NULL;
}

struct worker *worker_new(struct relay *r, int index)
{
	const struct config *cfg = r->cfg;
	struct worker *w = calloc(1, sizeof(*w));

	if (!w)
		return NULL;
	w->index = index;
	w->relay = r;
	w->cfg = cfg;
	w->seed = (uint64_t)clock_mono_us() ^ ((uint64_t)(index + 1) * 0x9E3779B97F4A7C15ull);
	snprintf(w->component, sizeof(w->component), "worker%d", index + 1);
	snprintf(w->app_name, sizeof(w->app_name), "outbox-relay worker %d", index + 1);

	relay_store_options(cfg, r, false, w->app_name, &w->sopts.store);
	/* A long wait that is still working keeps /healthz at 200. */
	w->sopts.store.progress_ms = &w->relay->metrics.tick_ms[index];
	w->sopts.kind = cfg->relay_source == CONFIG_SOURCE_CURSOR ? SOURCE_CURSOR : SOURCE_LEASE;
	w->sopts.confirm_timeout_ms = cfg->amqp_confirm_timeout_ms;
	w->sopts.poll_interval_ms = cfg->relay_poll_interval_ms;
	w->sopts.delete_published = cfg->relay_retention_ms == 0;
	w->sopts.stopping = &r->stopping;
	w->sopts.hooks = worker_source_hooks(w);

	w->bopts.url = cfg->amqp_url;
	w->bopts.heartbeat_ms = cfg->amqp_heartbeat_ms;
	w->bopts.confirm_timeout_ms = cfg->amqp_confirm_timeout_ms;
	w->bopts.tls_ca_file = cfg->amqp_tls_ca_file;
	w->bopts.tls_cert_file = cfg->amqp_tls_cert_file;
	w->bopts.tls_key_file = cfg->amqp_tls_key_file;
	w->bopts.tls_verify_peer = cfg->amqp_tls_verify_peer;
	w->bopts.connection_name = w->app_name;
	w->bopts.abort_at_ms = &r->abort_at_ms;
	w->bopts.wake_fd = r->wake_fd;
	w->bopts.progress_ms = &w->relay->metrics.tick_ms[index];

	w->source = source_new(&w->sopts);
	w->broker = broker_new(&w->bopts);
	if (!w->source || !w->broker) {
		worker_free(w);
		return NULL;
	}
	return w;
}

bool worker_done(const struct worker *w)
{
	return atomic_load(&w->done) != 0;
}

void worker_interrupt_broker(struct worker *w)
{
	broker_interrupt(w->broker);
}

void worker_interrupt_store(struct worker *w)
{
	source_interrupt(w->source);
}

int worker_token_stem(const struct worker *w, char *out, size_t cap)
{
	return source_token_stem(w->source, out, cap);
}

void worker_free(struct worker *w)
{
	if (!w)
		return;
	source_free(w->source);
	broker_free(w->broker);
	free(w->res);
	free(w->fates);
	free(w);
}
