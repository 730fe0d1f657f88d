/* Prometheus rendering: counter values, cumulative histogram buckets with +Inf equal to
 * _count, gauges that wait for the first table refresh, connection state, build_info. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "relay/metrics.h"

/* The one unnamed source most tests render, as `run` has it without named sources. */
static struct metrics g_metrics;

static void setup(void)
{
	metrics_init(&g_metrics);
}

TestSuite(metrics, .init = setup);

static char *render_one(const char *version)
{
	struct metrics_unit u = { .source = "", .m = &g_metrics };

	return metrics_render(&u, 1, version);
}

/* Finds the sample line "name value" (name may carry labels) and returns its value text. */
static const char *sample(const char *text, const char *name, char *buf, size_t n)
{
	size_t len = strlen(name);
	const char *p = text;

	while ((p = strstr(p, name)) != NULL) {
		if ((p == text || p[-1] == '\n') && p[len] == ' ') {
			const char *end = strchr(p + len + 1, '\n');
			size_t vlen = end ? (size_t)(end - p - len - 1) : strlen(p + len + 1);

			cr_assert_lt(vlen, n);
			memcpy(buf, p + len + 1, vlen);
			buf[vlen] = '\0';
			return buf;
		}
		p += len;
	}
	return NULL;
}

static void assert_sample(const char *text, const char *name, const char *want)
{
	char buf[64];
	const char *got = sample(text, name, buf, sizeof(buf));

	cr_assert_not_null(got, "no sample %s in:\n%s", name, text);
	cr_assert_str_eq(got, want, "%s", name);
}

static void assert_described(const char *text, const char *name, const char *type)
{
	char help[160], typeline[160];

	snprintf(help, sizeof(help), "# HELP %s ", name);
	snprintf(typeline, sizeof(typeline), "# TYPE %s %s\n", name, type);
	cr_assert_not_null(strstr(text, help), "no HELP for %s", name);
	cr_assert_not_null(strstr(text, typeline), "no TYPE %s for %s", type, name);
}

Test(metrics, counters_render_their_values)
{
	char *text;

	atomic_fetch_add(&g_metrics.published, 7);
	atomic_fetch_add(&g_metrics.failed[METRICS_FAIL_UNROUTABLE], 2);
	atomic_fetch_add(&g_metrics.failed[METRICS_FAIL_INVALID], 1);
	atomic_fetch_add(&g_metrics.dead, 3);
	atomic_fetch_add(&g_metrics.claimed, 11);
	atomic_fetch_add(&g_metrics.released, 4);
	text = render_one("1.2.3");
	cr_assert_not_null(text);

	assert_described(text, "outbox_relay_published_total", "counter");
	assert_sample(text, "outbox_relay_published_total", "7");
	assert_described(text, "outbox_relay_failed_total", "counter");
	assert_sample(text, "outbox_relay_failed_total{reason=\"nacked\"}", "0");
	assert_sample(text, "outbox_relay_failed_total{reason=\"unroutable\"}", "2");
	assert_sample(text, "outbox_relay_failed_total{reason=\"refused\"}", "0");
	assert_sample(text, "outbox_relay_failed_total{reason=\"invalid\"}", "1");
	assert_sample(text, "outbox_relay_dead_total", "3");
	assert_sample(text, "outbox_relay_claimed_total", "11");
	assert_sample(text, "outbox_relay_released_total", "4");
	assert_described(text, "outbox_relay_build_info", "gauge");
	assert_sample(text, "outbox_relay_build_info{version=\"1.2.3\"}", "1");
	cr_assert_eq(text[strlen(text) - 1], '\n', "the exposition ends with a newline");
	free(text);
}

Test(metrics, histogram_buckets_are_cumulative)
{
	char *text;

	/* 300 us, exactly 1 ms (le is inclusive), 3 s, and 20 s which only +Inf counts. */
	metrics_observe(&g_metrics.batch_duration, 300);
	metrics_observe(&g_metrics.batch_duration, 1000);
	metrics_observe(&g_metrics.batch_duration, 3000000);
	metrics_observe(&g_metrics.batch_duration, 20000000);
	metrics_observe(&g_metrics.confirm_latency, 42000);
	text = render_one("v");
	cr_assert_not_null(text);

	assert_described(text, "outbox_relay_batch_duration_seconds", "histogram");
	assert_sample(text, "outbox_relay_batch_duration_seconds_bucket{le=\"0.0005\"}", "1");
	assert_sample(text, "outbox_relay_batch_duration_seconds_bucket{le=\"0.001\"}", "2");
	assert_sample(text, "outbox_relay_batch_duration_seconds_bucket{le=\"0.0025\"}", "2");
	assert_sample(text, "outbox_relay_batch_duration_seconds_bucket{le=\"2.5\"}", "2");
	assert_sample(text, "outbox_relay_batch_duration_seconds_bucket{le=\"5\"}", "3");
	assert_sample(text, "outbox_relay_batch_duration_seconds_bucket{le=\"10\"}", "3");
	assert_sample(text, "outbox_relay_batch_duration_seconds_bucket{le=\"+Inf\"}", "4");
	assert_sample(text, "outbox_relay_batch_duration_seconds_count", "4");
	assert_sample(text, "outbox_relay_batch_duration_seconds_sum", "23.001300");

	assert_described(text, "outbox_relay_confirm_latency_seconds", "histogram");
	assert_sample(text, "outbox_relay_confirm_latency_seconds_bucket{le=\"0.025\"}", "0");
	assert_sample(text, "outbox_relay_confirm_latency_seconds_bucket{le=\"0.05\"}", "1");
	assert_sample(text, "outbox_relay_confirm_latency_seconds_bucket{le=\"+Inf\"}", "1");
	assert_sample(text, "outbox_relay_confirm_latency_seconds_count", "1");
	free(text);
}

Test(metrics, bucket_bounds_match_the_contract)
{
	static const double want[METRICS_BUCKETS] = {
		0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
	};

	for (size_t i = 0; i < METRICS_BUCKETS; i++)
		cr_assert_float_eq(metrics_bucket_bounds_s[i], want[i], 1e-12, "bucket %zu", i);
}

Test(metrics, table_gauges_wait_for_the_first_refresh)
{
	char *text = render_one("v");

	cr_assert_not_null(text);
	cr_assert_null(strstr(text, "outbox_relay_pending_rows"), "gauge before any refresh");
	cr_assert_null(strstr(text, "outbox_relay_oldest_pending_age_seconds"));
	cr_assert_null(strstr(text, "outbox_relay_table_stats_timestamp_seconds"));
	free(text);

	atomic_store(&g_metrics.pending, 120);
	atomic_store(&g_metrics.leased, 20);
	atomic_store(&g_metrics.dead_rows, 2);
	atomic_store(&g_metrics.published_rows, 9000);
	atomic_store(&g_metrics.oldest_pending_age_ms, 61500);
	atomic_store(&g_metrics.blocked_keys, 1);
	atomic_store(&g_metrics.table_stats_at_ms, 1700000000000LL);
	text = render_one("v");
	cr_assert_not_null(text);
	assert_described(text, "outbox_relay_pending_rows", "gauge");
	assert_sample(text, "outbox_relay_pending_rows", "120");
	assert_sample(text, "outbox_relay_leased_rows", "20");
	assert_sample(text, "outbox_relay_dead_rows", "2");
	assert_sample(text, "outbox_relay_published_rows", "9000");
	assert_sample(text, "outbox_relay_oldest_pending_age_seconds", "61.500");
	assert_sample(text, "outbox_relay_blocked_keys", "1");
	assert_described(text, "outbox_relay_table_stats_timestamp_seconds", "gauge");
	assert_sample(text, "outbox_relay_table_stats_timestamp_seconds", "1700000000.000");
	free(text);
}

Test(metrics, connection_state_needs_every_worker)
{
	char *text;

	text = render_one("v");
	cr_assert_not_null(text);
	assert_sample(text, "outbox_relay_database_up", "0");
	assert_sample(text, "outbox_relay_broker_up", "0");
	assert_sample(text, "outbox_relay_workers", "0");
	free(text);

	atomic_store(&g_metrics.workers, 2);
	atomic_store(&g_metrics.db_up, 2);
	atomic_store(&g_metrics.broker_up, 1);
	text = render_one("v");
	cr_assert_not_null(text);
	assert_sample(text, "outbox_relay_database_up", "1");
	assert_sample(text, "outbox_relay_broker_up", "0");
	assert_sample(text, "outbox_relay_workers", "2");
	free(text);
}

Test(metrics, build_info_label_is_escaped)
{
	char *text = render_one("1.0 \"beta\"\\x");

	cr_assert_not_null(text);
	assert_sample(text, "outbox_relay_build_info{version=\"1.0 \\\"beta\\\"\\\\x\"}", "1");
	free(text);
}

/* Count of non-overlapping occurrences of needle in text. */
static size_t count_of(const char *text, const char *needle)
{
	size_t n = 0;

	for (const char *p = text; (p = strstr(p, needle)) != NULL; p += strlen(needle))
		n++;
	return n;
}

/* Named sources: each family described once, then one series per source with the source
 * label first; each source's own counters, gauges and nodes. */
Test(metrics, named_sources_render_one_labelled_series_each)
{
	struct metrics billing;
	struct metrics_unit u[2] = { { "orders", &g_metrics }, { "billing", &billing } };
	char *text;

	metrics_init(&billing);
	atomic_fetch_add(&g_metrics.published, 7);
	atomic_fetch_add(&billing.published, 2);
	atomic_fetch_add(&billing.failed[METRICS_FAIL_UNROUTABLE], 5);
	metrics_observe(&g_metrics.batch_duration, 300);
	atomic_store(&billing.pending, 40);
	atomic_store(&billing.table_stats_at_ms, 1700000000000LL);
	atomic_store(&g_metrics.workers, 1);
	atomic_store(&g_metrics.db_up, 1);
	atomic_store(&g_metrics.broker_up, 1);
	atomic_store(&billing.workers, 2);
	atomic_store(&billing.source_failed, 1);
	metrics_set_broker_node(&g_metrics, 0, "mq1:5672");
	text = metrics_render(u, 2, "v");
	cr_assert_not_null(text);

	cr_assert_eq(count_of(text, "# TYPE outbox_relay_published_total "), 1);
	cr_assert_eq(count_of(text, "# HELP outbox_relay_batch_duration_seconds "), 1);
	assert_sample(text, "outbox_relay_published_total{source=\"orders\"}", "7");
	assert_sample(text, "outbox_relay_published_total{source=\"billing\"}", "2");
	assert_sample(text, "outbox_relay_failed_total{source=\"billing\",reason=\"unroutable\"}",
	              "5");
	assert_sample(text, "outbox_relay_failed_total{source=\"orders\",reason=\"unroutable\"}",
	              "0");
	assert_sample(text,
	              "outbox_relay_batch_duration_seconds_bucket{source=\"orders\",le=\"0.0005\"}",
	              "1");
	assert_sample(text, "outbox_relay_batch_duration_seconds_count{source=\"billing\"}", "0");
	/* Only the source whose table was read has gauges. */
	assert_sample(text, "outbox_relay_pending_rows{source=\"billing\"}", "40");
	cr_assert_null(strstr(text, "outbox_relay_pending_rows{source=\"orders\"}"));
	assert_sample(text, "outbox_relay_database_up{source=\"orders\"}", "1");
	assert_sample(text, "outbox_relay_database_up{source=\"billing\"}", "0");
	assert_sample(text, "outbox_relay_workers{source=\"billing\"}", "2");
	assert_sample(text, "outbox_relay_source_failed{source=\"billing\"}", "1");
	assert_sample(text, "outbox_relay_source_failed{source=\"orders\"}", "0");
	assert_sample(text, "outbox_relay_broker_node_info{source=\"orders\",node=\"mq1:5672\"}",
	              "1");
	/* Every sample line of a source family is labelled. */
	cr_assert_null(strstr(text, "\noutbox_relay_published_total "));
	cr_assert_eq(count_of(text, "outbox_relay_build_info{"), 1);
	free(text);
	metrics_destroy(&billing);
}

/* One unnamed source renders no source label at all (the form before named sources). */
Test(metrics, unnamed_source_has_no_source_label)
{
	char *text;

	metrics_set_broker_node(&g_metrics, 0, "mq1:5672");
	atomic_store(&g_metrics.workers, 1);
	text = render_one("v");
	cr_assert_not_null(text);
	cr_assert_null(strstr(text, "source="), "%s", text);
	cr_assert_null(strstr(text, "outbox_relay_source_failed"));
	assert_sample(text, "outbox_relay_broker_node_info{node=\"mq1:5672\"}", "1");
	free(text);
}
