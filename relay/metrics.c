/* Each source's metrics and their Prometheus text rendering (format 0.0.4). Writers are the
 * source's threads, the reader is the HTTP thread; all access is relaxed atomics. */
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

/* What a render walks: the units and whether their series carry a source label. */
struct render {
	struct outbuf o;
	const struct metrics_unit *units;
	size_t n;
	bool labelled;
};

static void header(struct render *r, const char *name, const char *type, const char *help)
{
	out_printf(&r->o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* Starts the series of name for unit u: `name{source="orders",` + extra + `} ` (extra: more
 * labels, already escaped, or NULL); the caller writes the value. */
static void series(struct render *r, const char *name, const struct metrics_unit *u,
                   const char *extra)
{
	char src[200];

	if (r->labelled) {
		label_value(u->source, src, sizeof(src));
		out_printf(&r->o, "%s{source=\"%s\"%s%s} ", name, src, extra ? "," : "",
		           extra ? extra : "");
	} else if (extra) {
		out_printf(&r->o, "%s{%s} ", name, extra);
	} else {
		out_printf(&r->o, "%s ", name);
	}
}

/* The field of struct metrics at off, for a family's one series per unit. */
#define FIELD(m, type, off) ((type *)(void *)((char *)(m) + (off)))

static void counter(struct render *r, const char *name, const char *help, size_t off)
{
	header(r, name, "counter", help);
	for (size_t i = 0; i < r->n; i++) {
		series(r, name, &r->units[i], NULL);
		out_printf(&r->o, "%llu\n", load_u(FIELD(r->units[i].m, atomic_ullong, off)));
	}
}

static void histogram_series(struct render *r, const char *name, const struct metrics_unit *u,
                             struct metrics_histogram *h)
{
	unsigned long long cum = 0, count, sum_us;
	char metric[128], le[32];

	/* count is read first: buckets incremented after it can only make a bucket exceed
	 * count by a scrape-sized race, so clamp to keep the series monotonic and +Inf last. */
	count = load_u(&h->count);
	sum_us = load_u(&h->sum_us);
	snprintf(metric, sizeof(metric), "%s_bucket", name);
	for (size_t i = 0; i < METRICS_BUCKETS; i++) {
		cum += load_u(&h->buckets[i]);
		if (cum > count)
			cum = count;
		snprintf(le, sizeof(le), "le=\"%g\"", metrics_bucket_bounds_s[i]);
		series(r, metric, u, le);
		out_printf(&r->o, "%llu\n", cum);
	}
	series(r, metric, u, "le=\"+Inf\"");
	out_printf(&r->o, "%llu\n", count);
	snprintf(metric, sizeof(metric), "%s_sum", name);
	series(r, metric, u, NULL);
	out_printf(&r->o, "%llu.%06llu\n", sum_us / 1000000, sum_us % 1000000);
	snprintf(metric, sizeof(metric), "%s_count", name);
	series(r, metric, u, NULL);
	out_printf(&r->o, "%llu\n", count);
}

static void histogram(struct render *r, const char *name, const char *help, size_t off)
{
	header(r, name, "histogram", help);
	for (size_t i = 0; i < r->n; i++)
		histogram_series(r, name, &r->units[i],
		                 FIELD(r->units[i].m, struct metrics_histogram, off));
}

/* Every worker has its slot in the per-worker arrays (ticks, nodes): relay.workers may never
 * ask for more than they hold. */
_Static_assert(CONFIG_RELAY_WORKERS_MAX <= METRICS_MAX_WORKERS,
               "relay.workers' maximum exceeds the per-worker arrays of struct metrics");

void metrics_init(struct metrics *m)
{
	memset(m, 0, sizeof(*m));
	pthread_mutex_init(&m->nodes_lock, NULL);
}

void metrics_destroy(struct metrics *m)
{
	pthread_mutex_destroy(&m->nodes_lock);
}

void metrics_set_broker_node(struct metrics *m, int index, const char *node)
{
	if (index < 0 || index >= METRICS_MAX_WORKERS)
		return;
	pthread_mutex_lock(&m->nodes_lock);
	snprintf(m->nodes[index], sizeof(m->nodes[index]), "%s", node ? node : "");
	pthread_mutex_unlock(&m->nodes_lock);
}

void metrics_broker_node(struct metrics *m, int index, char *buf, size_t n)
{
	size_t len;

	if (n == 0)
		return;
	buf[0] = '\0';
	if (index < 0 || index >= METRICS_MAX_WORKERS)
		return;
	pthread_mutex_lock(&m->nodes_lock);
	/* Cut to the caller's buffer (a copy, not snprintf: GCC's truncation check at -O2). */
	len = strnlen(m->nodes[index], n - 1);
	memcpy(buf, m->nodes[index], len);
	buf[len] = '\0';
	pthread_mutex_unlock(&m->nodes_lock);
}

/* One series per distinct node a unit's workers use (several workers may share one). */
static void render_nodes(struct render *r, const struct metrics_unit *u)
{
	char seen[METRICS_MAX_WORKERS][256], esc[300], label[320];
	int nseen = 0, workers = atomic_load_explicit(&u->m->workers, memory_order_relaxed);

	for (int i = 0; i < workers && i < METRICS_MAX_WORKERS; i++) {
		bool dup = false;

		metrics_broker_node(u->m, i, seen[nseen], sizeof(seen[nseen]));
		if (!seen[nseen][0])
			continue;
		for (int k = 0; k < nseen && !dup; k++)
			dup = strcmp(seen[k], seen[nseen]) == 0;
		if (dup)
			continue;
		label_value(seen[nseen], esc, sizeof(esc));
		snprintf(label, sizeof(label), "node=\"%s\"", esc);
		series(r, "outbox_relay_broker_node_info", u, label);
		out_printf(&r->o, "1\n");
		nseen++;
	}
}

/* What the relay did since it started: counters and latency histograms. */
static void render_activity(struct render *r)
{
	static const char *const reasons[METRICS_FAIL_REASONS] = {
		"nacked",
		"unroutable",
		"refused",
		"invalid",
	};

	counter(r, "outbox_relay_published_total", "Messages confirmed by the broker.",
	        offsetof(struct metrics, published));
	header(r, "outbox_relay_failed_total", "counter",
	       "Failed publishes by reason; nacked ones are the broker's own failures and do "
	       "not count toward relay.max_attempts.");
	for (size_t i = 0; i < r->n; i++)
		for (size_t k = 0; k < METRICS_FAIL_REASONS; k++) {
			char label[32];

			snprintf(label, sizeof(label), "reason=\"%s\"", reasons[k]);
			series(r, "outbox_relay_failed_total", &r->units[i], label);
			out_printf(&r->o, "%llu\n", load_u(&r->units[i].m->failed[k]));
		}
	counter(r, "outbox_relay_dead_total",
	        "Rows that went dead (attempts exhausted or invalid).",
	        offsetof(struct metrics, dead));
	counter(r, "outbox_relay_claimed_total", "Rows claimed under a lease.",
	        offsetof(struct metrics, claimed));
	counter(r, "outbox_relay_released_total", "Leases released without publishing.",
	        offsetof(struct metrics, released));
	counter(r, "outbox_relay_skipped_dead_total",
	        "Keyed rows set aside under relay.ordering=skip-dead.",
	        offsetof(struct metrics, skipped_dead));
	counter(r, "outbox_relay_replayed_total",
	        "Rows published again because of outbox-relay replay (confirmed by the broker).",
	        offsetof(struct metrics, replayed));
	histogram(r, "outbox_relay_batch_duration_seconds",
	          "Time from claiming a batch to marking it.",
	          offsetof(struct metrics, batch_duration));
	histogram(r, "outbox_relay_confirm_latency_seconds",
	          "Time from publishing a batch to the broker's confirms.",
	          offsetof(struct metrics, confirm_latency));
}

/* A table gauge of every unit whose gauges were read: they read 0 before the first refresh,
 * which would look like an empty outbox, so a unit not yet read has no series, and a family
 * none has is left out. ms: the value is milliseconds, written as seconds. */
static void table_gauge(struct render *r, const char *name, const char *help, size_t off, bool ms)
{
	bool any = false;

	for (size_t i = 0; i < r->n; i++) {
		struct metrics *m = r->units[i].m;
		long long v = load_ll(FIELD(m, atomic_llong, off));

		if (load_ll(&m->table_stats_at_ms) == 0)
			continue;
		if (!any)
			header(r, name, "gauge", help);
		any = true;
		series(r, name, &r->units[i], NULL);
		if (!ms) {
			out_printf(&r->o, "%lld\n", v);
			continue;
		}
		if (v < 0) /* clock skew between the database and us */
			v = 0;
		out_printf(&r->o, "%lld.%03lld\n", v / 1000, v % 1000);
	}
}

/* The outbox table as the maintenance loop last counted it. */
static void render_table(struct render *r)
{
	table_gauge(r, "outbox_relay_pending_rows", "Unpublished rows that are not dead.",
	            offsetof(struct metrics, pending), false);
	table_gauge(r, "outbox_relay_leased_rows", "Pending rows currently under a lease.",
	            offsetof(struct metrics, leased), false);
	table_gauge(r, "outbox_relay_dead_rows", "Rows waiting for an operator.",
	            offsetof(struct metrics, dead_rows), false);
	table_gauge(r, "outbox_relay_published_rows", "Published rows kept for relay.retention.",
	            offsetof(struct metrics, published_rows), false);
	table_gauge(r, "outbox_relay_oldest_pending_age_seconds", "Age of the oldest pending row.",
	            offsetof(struct metrics, oldest_pending_age_ms), true);
	table_gauge(r, "outbox_relay_blocked_keys", "Ordering keys held back by a dead row.",
	            offsetof(struct metrics, blocked_keys), false);
	/* When the gauges above were read: they keep their last values while the maintenance
	 * loop cannot refresh them, and an alert needs to tell. */
	table_gauge(r, "outbox_relay_table_stats_timestamp_seconds",
	            "Unix time of the last refresh of the table gauges.",
	            offsetof(struct metrics, table_stats_at_ms), true);
}

/* One int gauge of every unit, computed by f. */
static void int_gauge(struct render *r, const char *name, const char *help,
                      int (*f)(struct metrics *m))
{
	header(r, name, "gauge", help);
	for (size_t i = 0; i < r->n; i++) {
		series(r, name, &r->units[i], NULL);
		out_printf(&r->o, "%d\n", f(r->units[i].m));
	}
}

static int workers_of(struct metrics *m)
{
	return atomic_load_explicit(&m->workers, memory_order_relaxed);
}

static int db_up_of(struct metrics *m)
{
	int workers = workers_of(m);

	return workers > 0 && atomic_load_explicit(&m->db_up, memory_order_relaxed) == workers;
}

static int broker_up_of(struct metrics *m)
{
	int workers = workers_of(m);

	return workers > 0 && atomic_load_explicit(&m->broker_up, memory_order_relaxed) == workers;
}

static int failed_of(struct metrics *m)
{
	return atomic_load_explicit(&m->source_failed, memory_order_relaxed) != 0;
}

/* Whether the workers are connected now, and to which broker nodes. */
static void render_connections(struct render *r)
{
	int_gauge(r, "outbox_relay_database_up", "1 when every worker is connected to PostgreSQL.",
	          db_up_of);
	int_gauge(r, "outbox_relay_broker_up", "1 when every worker is connected to the broker.",
	          broker_up_of);
	int_gauge(r, "outbox_relay_workers", "Relay worker threads.", workers_of);
	/* Only named sources can stop alone (one source alone stops the process). */
	if (r->labelled)
		int_gauge(r, "outbox_relay_source_failed",
		          "1 when the source stopped on something no retry can fix.", failed_of);
	counter(r, "outbox_relay_broker_failovers_total",
	        "Broker connections made to another node of the cluster than the last one.",
	        offsetof(struct metrics, broker_failovers));
	header(r, "outbox_relay_broker_node_info", "gauge",
	       "The broker node(s) the relay is connected to; always 1.");
	for (size_t i = 0; i < r->n; i++)
		render_nodes(r, &r->units[i]);
}

char *metrics_render(const struct metrics_unit *units, size_t n, const char *version)
{
	struct render r = { .units = units, .n = n };
	char ver[256];
	char *result = NULL;

	r.labelled = n > 0 && units[0].source && units[0].source[0];
	r.o.cap = 8192;
	r.o.p = malloc(r.o.cap);
	if (r.o.p == NULL)
		goto out;

	render_activity(&r);
	render_table(&r);
	render_connections(&r);

	label_value(version ? version : "unknown", ver, sizeof(ver));
	header(&r, "outbox_relay_build_info", "gauge", "Build information; always 1.");
	out_printf(&r.o, "outbox_relay_build_info{version=\"%s\"} 1\n", ver);

	if (r.o.failed)
		goto out;
	result = r.o.p;
	r.o.p = NULL;
out:
	free(r.o.p);
	return result;
}
