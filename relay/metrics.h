/* Counters, gauges and histograms shared between the relay threads (writers) and the HTTP
 * thread (reader). Everything is a relaxed atomic: a scrape may see one batch half-counted,
 * never a torn value. */
#ifndef OUTBOX_RELAY_METRICS_H
#define OUTBOX_RELAY_METRICS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum metrics_fail_reason {
	METRICS_FAIL_NACKED = 0,
	METRICS_FAIL_UNROUTABLE,
	METRICS_FAIL_REFUSED, /* channel closed by one publish: missing exchange, 406, 403 */
	METRICS_FAIL_INVALID, /* malformed row */
	METRICS_FAIL_REASONS
};

#define METRICS_BUCKETS 14
/* Per-worker arrays (ticks, broker nodes) have room for this many relay loops; relay.workers
 * may not ask for more (checked where the two meet, in relay/run.c). */
#define METRICS_MAX_WORKERS 64

struct metrics_histogram {
	atomic_ullong buckets[METRICS_BUCKETS]; /* cumulative counts are computed at render */
	atomic_ullong count;
	atomic_ullong sum_us;
};

struct metrics {
	atomic_ullong published;
	atomic_ullong failed[METRICS_FAIL_REASONS];
	atomic_ullong dead;
	atomic_ullong claimed;
	atomic_ullong released;
	atomic_ullong skipped_dead;               /* keyed rows set aside under skip-dead */
	atomic_ullong broker_failovers;           /* connections made to another node */
	atomic_ullong replayed;                   /* rows published again by a replay */
	struct metrics_histogram batch_duration;  /* claim -> marked */
	struct metrics_histogram confirm_latency; /* publish -> confirm */
	/* gauges refreshed by the maintenance loop */
	atomic_llong pending;
	atomic_llong leased;
	atomic_llong dead_rows;
	atomic_llong published_rows;
	atomic_llong oldest_pending_age_ms;
	atomic_llong blocked_keys;
	atomic_llong table_stats_at_ms; /* wall clock ms of the last refresh, 0 = never */
	/* connection state: number of workers connected to each end */
	atomic_int db_up;
	atomic_int broker_up;
	atomic_int workers;
	/* liveness: CLOCK_MONOTONIC ms of each loop's last tick (the oldest counts) */
	atomic_llong tick_ms[METRICS_MAX_WORKERS];
	/* The source stopped because something no retry can fix (its loops ended). */
	atomic_int source_failed;
	/* The node each worker is connected to, a snapshot published under a lock (strings
	 * cannot be atomics). */
	pthread_mutex_t nodes_lock;
	char nodes[METRICS_MAX_WORKERS][256];
};

/* One source's metrics as /metrics, /readyz and sd_notify read them: source is its name ("" =
 * the one unnamed source: no source label), m its metrics; both borrowed. */
struct metrics_unit {
	const char *source;
	struct metrics *m;
};

/* Zeroes m and makes its lock; metrics_destroy() undoes it. */
void metrics_init(struct metrics *m);
void metrics_destroy(struct metrics *m);

/* The broker node worker index of m is connected to ("host:port"), or NULL/"" when it is not:
 * published for the HTTP thread (outbox_relay_broker_node_info, /readyz). Thread-safe. */
void metrics_set_broker_node(struct metrics *m, int index, const char *node);
/* Copies the node of worker index of m into buf ("" when none). Thread-safe. */
void metrics_broker_node(struct metrics *m, int index, char *buf, size_t n);

/* Records one observation in microseconds. */
void metrics_observe(struct metrics_histogram *h, uint64_t us);

/* Renders the Prometheus text exposition of units[0..n) into a new string (free()); NULL on
 * out of memory. Each family's HELP and TYPE come once, then one series per unit, labelled
 * source="<name>" first when the units are named (units[0].source not ""). version goes into
 * outbox_relay_build_info. units are borrowed. */
char *metrics_render(const struct metrics_unit *units, size_t n, const char *version);

/* Bucket upper bounds in seconds (for render and tests). */
extern const double metrics_bucket_bounds_s[METRICS_BUCKETS];

#endif
