/* What the relay loop's files share (relay/worker.c: the loop; relay/worker_endpoints.c: its
 * two connections and waiting on them; relay/worker_fates.c: what the broker's answers mean for
 * each row, and what the source reports). Nothing else includes it. */
#ifndef OUTBOX_RELAY_WORKER_PRIVATE_H
#define OUTBOX_RELAY_WORKER_PRIVATE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "amqp/broker.h"
#include "base/clock.h"
#include "relay/metrics.h"
#include "relay/relay.h"
#include "store/source/source.h"

struct endpoint_state {
	bool up;          /* counted in the unit's metrics */
	int64_t failures; /* consecutive failed attempts */
	/* Failures since the endpoint last did useful work (a claim answered, a batch
	 * confirmed), which sets the reconnect backoff. Connecting alone does not end a streak:
	 * a broker that blocks every new connection at its first publish, or a database whose
	 * statements fail on every fresh connection, is retried less and less often. */
	int64_t streak;
	int64_t retry_at_ms; /* CLOCK_MONOTONIC */
	int64_t down_since_ms;
};

/* One relay loop (relay.h: worker_new()). */
struct worker {
	int index;
	struct relay *relay;
	const struct config *cfg;
	char component[24];
	char app_name[64];

	struct source_options sopts;
	struct broker_options bopts;
	struct source *source;
	struct broker *broker;
	struct endpoint_state db, mq;

	size_t cap; /* capacity of the arrays below */
	struct broker_result *res;
	struct source_fate *fates;

	uint64_t seed;
	atomic_int done; /* worker_main() has finished (read by the main thread) */
	char node[300];  /* the broker node of the last connection, for "failover" */
};

static inline void worker_tick(struct worker *w)
{
	atomic_store_explicit(&w->relay->metrics.tick_ms[w->index], clock_mono_ms(),
	                      memory_order_relaxed);
}

/* worker_endpoints.c */
/* Connects the database (source) or the broker when it is down and its retry is due: true
 * when it is up. */
bool worker_ensure_db(struct worker *w);
bool worker_ensure_broker(struct worker *w);
/* A source call failed with rc: logs it, closes the connection, schedules the reconnection. */
void worker_db_failed(struct worker *w, int rc);
/* A broker call failed with rc; in_batch: rows were waiting for confirms. */
void worker_broker_failed(struct worker *w, int rc, bool in_batch);
/* The broker is to be left for a while (it refused most of a batch): as after a lost
 * connection. */
void worker_broker_back_off(struct worker *w, const char *why);
/* Sleeps until the source has something, deadline_ms, or shutdown, servicing the broker
 * meanwhile. False when it slept to the deadline. */
bool worker_wait(struct worker *w, int64_t deadline_ms);

/* worker_fates.c */
/* The outcome of one batch. */
struct settled {
	size_t n_pub, n_nacked;
	/* Most of a batch of NACKS_BACKOFF_MIN rows or more nacked: its rows are logged at
	 * debug, the batch once (worker_nacked_most()). back_off: a broker condition
	 * (worker_nacks_back_off), else one destination's, the first nacked row's. */
	bool quiet_nacks, back_off;
	const struct outbox_row *nacked_row;
};
/* Gives every row of b its fate (w->fates) by the broker's answer (w->res), logs and counts. */
void worker_classify(struct worker *w, const struct source_batch *b, struct settled *st);
/* Most of b nacked: says so, and backs off the broker for a condition of the broker. */
void worker_nacked_most(struct worker *w, const struct source_batch *b, const struct settled *st);
/* The hooks the source reports through (struct source_hooks), arg = w. */
struct source_hooks worker_source_hooks(struct worker *w);

#endif
