/* /healthz during long waits that are still working: a relay loop inside a bounded wait keeps
 * ticking, so /healthz answers 200 however long the wait lasts, past the staleness bound of
 * 5 × relay.poll_interval + amqp.confirm_timeout + 10 s.
 *
 * A broker that blocks publishers cannot tell this from a loop that ticks only between
 * batches: the confirm wait it causes ends at confirm_timeout, which the bound includes. It is
 * tested all the same (the wait is renewed batch after batch for longer than the bound). The
 * wait that tells them apart is one on the database: an answer is waited for up to
 * relay.lease, which must exceed confirm_timeout, so a stalled database path holds the loop in
 * one call for longer than the bound. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/fault.h"
#include "tests/support/http_probe.h"
#include "tests/support/tcp_proxy.h"

/* Staleness bound: 5 × 100 ms + 60 s + 10 s; a wait on the database lasts up to 120 s. */
#define STALE_AFTER_MS (5 * 100 + 60000 + 10000)
#define WATCH_MS       (STALE_AFTER_MS + 5000)
#define PROBE_EVERY_MS 250

struct hw {
	struct fixture f;
	struct proxy *db;
	char listen[64], e_listen[96], db_env[768];
	struct harness_relay *relay;
};

static void hw_start(struct hw *t, const char *prefix, bool db_proxy)
{
	const char *env[8] = {
		"OUTBOX_AMQP_CONFIRM_TIMEOUT=60s",
		"OUTBOX_RELAY_LEASE=120s",
		"OUTBOX_RELAY_POLL_INTERVAL=100ms",
		t->e_listen,
	};
	size_t n = 4;

	fixture_setup(&t->f, prefix, NULL);
	snprintf(t->listen, sizeof(t->listen), "127.0.0.1:%d", probe_free_port());
	snprintf(t->e_listen, sizeof(t->e_listen), "OUTBOX_HTTP_LISTEN=%s", t->listen);
	if (db_proxy) {
		t->db = proxy_start(
		        (int)strtol(harness_require_env("RELAY_TEST_PG_PORT"), NULL, 10));
		fault_database_env(t->db_env, sizeof(t->db_env), proxy_port(t->db));
		env[n++] = t->db_env;
	}
	env[n] = NULL;
	t->relay = fault_relay_start(&t->f, env);
	if (!harness_relay_wait_log(t->relay, "msg=\"connected\" to=broker", FAULT_LOG_TIMEOUT_MS))
		harness_relay_dump_log(t->relay);
	cr_assert(harness_relay_log_count(t->relay, "msg=\"connected\" to=broker") > 0,
	          "the relay never connected");
}

/* GETs /healthz every PROBE_EVERY_MS for WATCH_MS and fails on any answer but 200. */
static void watch_healthz(struct hw *t, const char *what)
{
	int64_t start = harness_now_ms(), end = start + WATCH_MS;
	int probes = 0;

	while (harness_now_ms() < end) {
		struct probe_reply r = probe_get(t->listen, "/healthz");
		int64_t at = harness_now_ms() - start;

		probes++;
		if (r.status != 200)
			harness_relay_dump_log(t->relay);
		cr_assert_eq(r.status, 200,
		             "%s: /healthz answered %d after %lld ms of the wait: %s", what,
		             r.status, (long long)at, r.body);
		free(r.body);
		harness_sleep_ms(PROBE_EVERY_MS);
	}
	fprintf(stderr, "healthz %s: %d answers of 200 over %d ms (staleness bound %d ms)\n", what,
	        probes, WATCH_MS, STALE_AFTER_MS);
}

static int64_t leased(struct hw *t)
{
	return harness_pg_int(t->f.pg,
	                      "SELECT count(*) FROM %s WHERE published_at IS NULL"
	                      " AND locked_by IS NOT NULL",
	                      t->f.table);
}

static bool alarm_raised;

static void clear_alarm(void)
{
	if (alarm_raised && fault_memory_alarm(false))
		alarm_raised = false;
}

static bool broker_blocks_a_connection(void *arg)
{
	(void)arg;
	return harness_shell("%s -q list_connections state 2>/dev/null | grep -qx blocked",
	                     harness_require_env("RELAY_TEST_RABBITMQCTL")) == 0;
}

#define BLOCKED_ROWS 300

Test(fault, healthz_200_while_the_broker_blocks, .timeout = 400, .fini = clear_alarm)
{
	struct hw t = { 0 };
	size_t lost;

	alarm_raised = true;
	cr_assert(fault_memory_alarm(true), "rabbitmqctl could not raise the memory alarm");
	hw_start(&t, "hz_blocked", false);
	harness_insert_rows(t.f.pg, t.f.table, BLOCKED_ROWS, t.f.exchange, "hz.blocked", "hzb",
	                    NULL, NULL);
	/* The cursor's batch is in no row: the blocked connection (the broker blocks it once the
	 * relay publishes) is what is waited for. */
	if (!harness_source_is_cursor())
		HARNESS_WAIT(leased(&t) > 0, 60000);
	if (!harness_wait_until(broker_blocks_a_connection, NULL, 60000))
		harness_relay_dump_log(t.relay);
	cr_assert(broker_blocks_a_connection(NULL), "the broker never blocked the relay");

	watch_healthz(&t, "blocked broker");
	/* The confirm wait did run out meanwhile (at confirm_timeout), and the rows were handed
	 * back: the loop went on and waited again. */
	cr_assert(harness_relay_log_count(t.relay,
	                                  "msg=\"broker did not confirm the batch,"
	                                  " unconfirmed rows released\" reason=timeout") > 0,
	          "the confirm wait never ran out");

	cr_assert(fault_memory_alarm(false), "rabbitmqctl could not clear the memory alarm");
	alarm_raised = false;
	fixture_expect_unique(&t.f, t.f.cons, BLOCKED_ROWS, FAULT_DELIVERY_TIMEOUT_MS);
	(void)fault_count(&t.f, "healthz_blocked_broker", "hzb", BLOCKED_ROWS, &lost);
	cr_assert_eq(lost, 0);
	fixture_teardown(&t.f);
}

#define MAX_ROWS 200000

Test(fault, healthz_200_while_the_database_stalls, .timeout = 400)
{
	struct fault_producer *prod;
	struct hw t = { 0 };
	size_t n, lost;

	hw_start(&t, "hz_dbstall", true);
	prod = fault_producer_start(&t.f, "hzd", 20, 20, MAX_ROWS);
	fixture_expect_unique(&t.f, t.f.cons, 1000, FAULT_DELIVERY_TIMEOUT_MS);
	proxy_stall(t.db, true);
	/* The relay is busy: it now waits for an answer that the stalled path holds back, up to
	 * relay.lease (120 s), longer than the staleness bound. */
	watch_healthz(&t, "stalled database");
	cr_assert_eq(harness_relay_log_count(t.relay, "to=database"),
	             harness_relay_log_count(t.relay, "msg=\"connected\" to=database"),
	             "the relay gave up on the database before relay.lease");

	proxy_stall(t.db, false);
	n = fault_producer_stop(prod);
	fixture_expect_unique(&t.f, t.f.cons, n, FAULT_DELIVERY_TIMEOUT_MS);
	(void)fault_count(&t.f, "healthz_stalled_database", "hzd", n, &lost);
	cr_assert_eq(lost, 0);
	fixture_teardown(&t.f);
	proxy_stop(t.db);
}
