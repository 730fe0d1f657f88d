/* The process-wide metrics and their Prometheus text rendering (format 0.0.4). Writers are the
 * relay threads, the reader is the HTTP thread; all access is relaxed atomics. */
#include "relay/metrics.h"

#include "config/config.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A scrape is a few kilobytes; the cap only guards against a bug looping forever. */
#define METRICS_RENDER_MAX (256 * 1024)

struct metrics g_metrics;

const double metrics_bucket_bounds_s[METRICS_BUCKETS] = {
	0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
};

/* The same bounds in whole microseconds, so that an observation exactly on a bound lands in
 * that bound's bucket (le means "less or equal") without floating point rounding. */
static const uint64_t bucket_bounds_us[METRICS_BUCKETS] = {
	500,    1000,   2500,   5000,    10000,   25000,   50000,
	100000, 250000, 500000, 1000000, 2500000, 5000000, 10000000,
};

void metrics_observe(struct metrics_histogram *h, uint64_t us)
{
	for (size_t i = 0; i < METRICS_BUCKETS; i++) {
		if (us <= bucket_bounds_us[i]) {
			atomic_fetch_add_explicit(&h->buckets[i], 1, memory_order_relaxed);
			break;
		}
	}
	/* Above the last bound only +Inf (= count) grows. */
	atomic_fetch_add_explicit(&h->sum_us, us, memory_order_relaxed);
	atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
}

struct outbuf {
	char *p;
	size_t len, cap;
	bool failed;
};

static void out_printf(struct outbuf *o, const char *fmt, ...)
        __attribute__((format(printf, 2, 3)));

static void out_printf(struct outbuf *o, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (o->failed)
		return;
	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(o->p + o->len, o->cap - o->len, fmt, ap);
		va_end(ap);
		if (n < 0) {
			o->failed = true;
			return;
		}
		if ((size_t)n < o->cap - o->len) {
			o->len += (size_t)n;
			return;
		}
		if (o->cap * 2 > METRICS_RENDER_MAX) {
			o->failed = true;
			return;
		}
		char *np = realloc(o->p, o->cap * 2);
		if (np == NULL) {
			o->failed = true;
			return;
		}
		o->p = np;
		o->cap *= 2;
	}
}

static unsigned long long load_u(atomic_ullong *a)
{
	return atomic_load_explicit(a, memory_order_relaxed);
}

static long long load_ll(atomic_llong *a)
{
	return atomic_load_explicit(a, memory_order_relaxed);
}

static void header(struct outbuf *o, const char *name, const char *type, const char *help)
{
	out_printf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void counter(struct outbuf *o, const char *name, const char *help, atomic_ullong *v)
{
	header(o, name, "counter", help);
	out_printf(o, "%s %llu\n", name, load_u(v));
}

static void gauge(struct outbuf *o, const char *name, const char *help, long long v)
{
	header(o, name, "gauge", help);
	out_printf(o, "%s %lld\n", name, v);
}

static void histogram(struct outbuf *o, const char *name, const char *help,
                      struct metrics_histogram *h)
{
	unsigned long long cum = 0, count, sum_us;

	/* count is read first: buckets incremented after it can only make a bucket exceed
	 * count by a scrape-sized race, so clamp to keep the series monotonic and +Inf last. */
	count = load_u(&h->count);
	sum_us = load_u(&h->sum_us);
	header(o, name, "histogram", help);
	for (size_t i = 0; i < METRICS_BUCKETS; i++) {
		cum += load_u(&h->buckets[i]);
		if (cum > count)
			cum = count;
		out_printf(o, "%s_bucket{le=\"%g\"} %llu\n", name, metrics_bucket_bounds_s[i], cum);
	}
	out_printf(o, "%s_bucket{le=\"+Inf\"} %llu\n", name, count);
	out_printf(o, "%s_sum %llu.%06llu\n", name, sum_us / 1000000, sum_us % 1000000);
	out_printf(o, "%s_count %llu\n", name, count);
}

/* Label values escape backslash, double quote and newline (exposition format rules). */
static void label_value(const char *v, char *buf, size_t n)
{
	size_t j = 0;

	for (; *v && j + 3 < n; v++) {
		if (*v == '\\' || *v == '"') {
			buf[j++] = '\\';
			buf[j++] = *v;
		} else if (*v == '\n') {
			buf[j++] = '\\';
			buf[j++] = 'n';
		} else {
			buf[j++] = *v;
		}
	}
	buf[j] = '\0';
}

/* Every worker has its slot in the per-worker arrays (ticks, nodes): relay.workers may never
 * ask for more than they hold. */
_Static_assert(CONFIG_RELAY_WORKERS_MAX <= METRICS_MAX_WORKERS,
               "relay.workers' maximum exceeds the per-worker arrays of g_metrics");

/* The nodes workers are connected to, a snapshot the workers publish under a lock (strings
 * cannot be atomics). */
static pthread_mutex_t g_nodes_lock = PTHREAD_MUTEX_INITIALIZER;
static char g_nodes[METRICS_MAX_WORKERS][256];

void metrics_set_broker_node(int index, const char *node)
{
	if (index < 0 || index >= METRICS_MAX_WORKERS)
		return;
	pthread_mutex_lock(&g_nodes_lock);
	snprintf(g_nodes[index], sizeof(g_nodes[index]), "%s", node ? node : "");
	pthread_mutex_unlock(&g_nodes_lock);
}

void metrics_broker_node(int index, char *buf, size_t n)
{
	size_t len;

	if (n == 0)
		return;
	buf[0] = '\0';
	if (index < 0 || index >= METRICS_MAX_WORKERS)
		return;
	pthread_mutex_lock(&g_nodes_lock);
	/* Cut to the caller's buffer (a copy, not snprintf: GCC's truncation check at -O2). */
	len = strnlen(g_nodes[index], n - 1);
	memcpy(buf, g_nodes[index], len);
	buf[len] = '\0';
	pthread_mutex_unlock(&g_nodes_lock);
}

/* One series per distinct node in use (several workers may share one). */
static void render_nodes(struct outbuf *o, int workers)
{
	char seen[METRICS_MAX_WORKERS][256], label[300];
	int nseen = 0;

	header(o, "outbox_relay_broker_node_info", "gauge",
	       "The broker node(s) the relay is connected to; always 1.");
	for (int i = 0; i < workers && i < METRICS_MAX_WORKERS; i++) {
		bool dup = false;

		metrics_broker_node(i, seen[nseen], sizeof(seen[nseen]));
		if (!seen[nseen][0])
			continue;
		for (int k = 0; k < nseen && !dup; k++)
			dup = strcmp(seen[k], seen[nseen]) == 0;
		if (dup)
			continue;
		label_value(seen[nseen], label, sizeof(label));
		out_printf(o, "outbox_relay_broker_node_info{node=\"%s\"} 1\n", label);
		nseen++;
	}
}

/* What the relay did since it started: counters and latency histograms. */
static void render_activity(struct outbuf *o, struct metrics *m)
{
	static const char *const reasons[METRICS_FAIL_REASONS] = {
		"nacked",
		"unroutable",
		"refused",
		"invalid",
	};

	counter(o, "outbox_relay_published_total", "Messages confirmed by the broker.",
	        &m->published);
	header(o, "outbox_relay_failed_total", "counter",
	       "Failed publishes by reason; nacked ones are the broker's own failures and do "
	       "not count toward relay.max_attempts.");
	for (size_t i = 0; i < METRICS_FAIL_REASONS; i++)
		out_printf(o, "outbox_relay_failed_total{reason=\"%s\"} %llu\n", reasons[i],
		           load_u(&m->failed[i]));
	counter(o, "outbox_relay_dead_total",
	        "Rows that went dead (attempts exhausted or invalid).", &m->dead);
	counter(o, "outbox_relay_claimed_total", "Rows claimed under a lease.", &m->claimed);
	counter(o, "outbox_relay_released_total", "Leases released without publishing.",
	        &m->released);
	counter(o, "outbox_relay_skipped_dead_total",
	        "Keyed rows set aside under relay.ordering=skip-dead.", &m->skipped_dead);
	counter(o, "outbox_relay_replayed_total",
	        "Rows published again because of outbox-relay replay (confirmed by the broker).",
	        &m->replayed);
	histogram(o, "outbox_relay_batch_duration_seconds",
	          "Time from claiming a batch to marking it.", &m->batch_duration);
	histogram(o, "outbox_relay_confirm_latency_seconds",
	          "Time from publishing a batch to the broker's confirms.", &m->confirm_latency);
}

/* The outbox table as the maintenance loop last counted it. */
static void render_table(struct outbuf *o, struct metrics *m)
{
	/* Table gauges read 0 before the first refresh, which would look like an empty
	 * outbox; leave them out until they mean something. */
	if (load_ll(&m->table_stats_at_ms) != 0) {
		long long age_ms = load_ll(&m->oldest_pending_age_ms);

		if (age_ms < 0) /* clock skew between the database and us */
			age_ms = 0;

		gauge(o, "outbox_relay_pending_rows", "Unpublished rows that are not dead.",
		      load_ll(&m->pending));
		gauge(o, "outbox_relay_leased_rows", "Pending rows currently under a lease.",
		      load_ll(&m->leased));
		gauge(o, "outbox_relay_dead_rows", "Rows waiting for an operator.",
		      load_ll(&m->dead_rows));
		gauge(o, "outbox_relay_published_rows", "Published rows kept for relay.retention.",
		      load_ll(&m->published_rows));
		header(o, "outbox_relay_oldest_pending_age_seconds", "gauge",
		       "Age of the oldest pending row.");
		out_printf(o, "outbox_relay_oldest_pending_age_seconds %lld.%03lld\n",
		           age_ms / 1000, age_ms % 1000);
		gauge(o, "outbox_relay_blocked_keys", "Ordering keys held back by a dead row.",
		      load_ll(&m->blocked_keys));
		/* When the gauges above were read: they keep their last values while the
		 * maintenance loop cannot refresh them, and an alert needs to tell. */
		long long at_ms = load_ll(&m->table_stats_at_ms);
		header(o, "outbox_relay_table_stats_timestamp_seconds", "gauge",
		       "Unix time of the last refresh of the table gauges.");
		out_printf(o, "outbox_relay_table_stats_timestamp_seconds %lld.%03lld\n",
		           at_ms / 1000, at_ms % 1000);
	}
}

/* Whether the workers are connected now, and to which broker nodes. */
static void render_connections(struct outbuf *o, struct metrics *m)
{
	int workers, db, broker;

	workers = atomic_load_explicit(&m->workers, memory_order_relaxed);
	db = atomic_load_explicit(&m->db_up, memory_order_relaxed);
	broker = atomic_load_explicit(&m->broker_up, memory_order_relaxed);
	gauge(o, "outbox_relay_database_up", "1 when every worker is connected to PostgreSQL.",
	      workers > 0 && db == workers);
	gauge(o, "outbox_relay_broker_up", "1 when every worker is connected to the broker.",
	      workers > 0 && broker == workers);
	gauge(o, "outbox_relay_workers", "Relay worker threads.", workers);
	counter(o, "outbox_relay_broker_failovers_total",
	        "Broker connections made to another node of the cluster than the last one.",
	        &m->broker_failovers);
	render_nodes(o, workers);
}

char *metrics_render(const char *version)
{
	struct metrics *m = &g_metrics;
	struct outbuf o = { 0 };
	char ver[256];
	char *result = NULL;

	o.cap = 8192;
	o.p = malloc(o.cap);
	if (o.p == NULL)
		goto out;

	render_activity(&o, m);
	render_table(&o, m);
	render_connections(&o, m);

	label_value(version ? version : "unknown", ver, sizeof(ver));
	header(&o, "outbox_relay_build_info", "gauge", "Build information; always 1.");
	out_printf(&o, "outbox_relay_build_info{version=\"%s\"} 1\n", ver);

	if (o.failed)
		goto out;
	result = o.p;
	o.p = NULL;
out:
	free(o.p);
	return result;
}
