/* What an operator sees of a running relay: /metrics against what a consumer really got,
 * `outbox-relay healthcheck`, JSON logs that parse line by line, and passwords that never
 * show up in logs, `config show`, start-up errors or /metrics. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/fixture.h"
#include "tests/support/http_probe.h"

/* Generous deadlines: the suite runs under ASan on two cores beside other test files. */
#define DELIVERY_TIMEOUT_MS 120000
#define EXIT_TIMEOUT_MS     30000
/* The maintenance loop refreshes the table gauges every 5 s. */
#define GAUGE_TIMEOUT_MS 30000
#define ROWS             30

/* The fixture, the address of the relay's HTTP server, and the relay (borrowed from fx). */
struct op {
	struct fixture fx;
	char listen[64], e_listen[96];
	struct harness_relay *relay;
};

static void op_setup(struct op *t, const char *prefix)
{
	memset(t, 0, sizeof(*t));
	fixture_setup(&t->fx, prefix, NULL);
	snprintf(t->listen, sizeof(t->listen), "127.0.0.1:%d", probe_free_port());
	snprintf(t->e_listen, sizeof(t->e_listen), "OUTBOX_HTTP_LISTEN=%s", t->listen);
}

/* ROWS routable rows and one that no queue is bound for. */
static void insert_workload(struct op *t, const char *unroutable_id)
{
	harness_insert_rows(t->fx.pg, t->fx.table, ROWS, t->fx.exchange, "op.created", "op", NULL,
	                    NULL);
	harness_pg_exec(t->fx.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body) "
	                "VALUES ('%s', 'amq.direct', 'nobody.listens.%s', '{}')",
	                t->fx.table, unroutable_id, t->fx.table);
}

static void expect_delivered(struct op *t, size_t n)
{
	fixture_expect_unique(&t->fx, t->fx.cons, n, DELIVERY_TIMEOUT_MS);
}

static bool ready(void *arg)
{
	struct probe_reply r = probe_get(arg, "/readyz");
	bool ok = r.status == 200;

	free(r.body);
	return ok;
}

static void wait_ready(struct op *t)
{
	if (!harness_wait_until(ready, t->listen, 60000)) {
		harness_relay_dump_log(t->relay);
		cr_assert_fail("/readyz never answered 200");
	}
}

static char *scrape(struct op *t)
{
	struct probe_reply r = probe_get(t->listen, "/metrics");

	cr_assert_eq(r.status, 200, "/metrics answered %d", r.status);
	return r.body;
}

struct settle {
	struct op *t;
	double published;
};

/* The metrics have caught up: the unroutable row was counted and went dead, the gauges were
 * refreshed since, and every delivery the consumer saw is a counted confirm. */
static bool settled(void *arg)
{
	struct settle *s = arg;
	char *m = scrape(s->t);
	bool ok = probe_metric(m, "outbox_relay_failed_total{reason=\"unroutable\"}") >= 1 &&
	          probe_metric(m, "outbox_relay_dead_rows") == 1 &&
	          probe_metric(m, "outbox_relay_pending_rows") == 0 &&
	          probe_metric(m, "outbox_relay_published_total") ==
	                  (double)consumer_received(s->t->fx.cons);

	s->published = probe_metric(m, "outbox_relay_published_total");
	free(m);
	return ok;
}

Test(operability, metrics_match_what_was_delivered, .timeout = 300)
{
	struct op t;
	struct settle s;
	struct harness_output o;
	char *m;

	op_setup(&t, "op_metrics");
	insert_workload(&t, "op-unroutable");
	t.relay = fixture_relay_start(
	        &t.fx, (const char *const[]){ t.e_listen, "OUTBOX_RELAY_MAX_ATTEMPTS=1",
	                                      "OUTBOX_RELAY_POLL_INTERVAL=200ms", NULL });
	wait_ready(&t);
	expect_delivered(&t, ROWS);

	s.t = &t;
	s.published = -1;
	if (!harness_wait_until(settled, &s, GAUGE_TIMEOUT_MS)) {
		m = scrape(&t);
		harness_relay_dump_log(t.relay);
		cr_assert_fail("metrics never settled (consumer got %zu, published %.0f):\n%s",
		               consumer_received(t.fx.cons), s.published, m);
	}
	m = scrape(&t);
	cr_assert_eq(probe_metric(m, "outbox_relay_published_total"),
	             (double)consumer_received(t.fx.cons));
	cr_assert_eq(probe_metric(m, "outbox_relay_published_total"), ROWS, "%s", m);
	cr_assert_geq(probe_metric(m, "outbox_relay_failed_total{reason=\"unroutable\"}"), 1, "%s",
	              m);
	cr_assert_geq(probe_metric(m, "outbox_relay_claimed_total"), ROWS + 1, "%s", m);
	cr_assert_geq(probe_metric(m, "outbox_relay_dead_total"), 1, "%s", m);
	cr_assert_gt(probe_metric(m, "outbox_relay_batch_duration_seconds_count"), 0, "%s", m);
	cr_assert_gt(probe_metric(m, "outbox_relay_confirm_latency_seconds_count"), 0, "%s", m);
	cr_assert_eq(probe_metric(m, "outbox_relay_batch_duration_seconds_bucket{le=\"+Inf\"}"),
	             probe_metric(m, "outbox_relay_batch_duration_seconds_count"), "%s", m);
	cr_assert_not_null(strstr(m, "\noutbox_relay_build_info{version=\""), "%s", m);
	cr_assert_eq(probe_metric(m, "outbox_relay_database_up"), 1, "%s", m);
	cr_assert_eq(probe_metric(m, "outbox_relay_broker_up"), 1, "%s", m);
	cr_assert_eq(probe_metric(m, "outbox_relay_dead_rows"), 1, "%s", m);
	cr_assert_eq(probe_metric(m, "outbox_relay_pending_rows"), 0, "%s", m);
	cr_assert_geq(probe_metric(m, "outbox_relay_oldest_pending_age_seconds"), 0, "%s", m);
	free(m);
	cr_assert_eq(harness_pg_int(t.fx.pg,
	                            "SELECT count(*) FROM %s WHERE published_at IS NULL "
	                            "AND attempts >= 1 AND id = 'op-unroutable'",
	                            t.fx.table),
	             1, "the unroutable row is the dead one");

	/* The container health check asks the same relay. */
	harness_cli(&o, t.fx.table, (const char *const[]){ t.e_listen, NULL }, "healthcheck", NULL);
	cr_assert_eq(o.status, 0, "healthcheck exited %d: %s", o.status, o.err);
	cr_assert_eq(strncmp(o.out, "ready\n", 6), 0, "got: %s", o.out);
	harness_output_free(&o);
	fixture_teardown(&t.fx);
}

Test(operability, healthcheck_fails_when_nothing_listens, .timeout = 60)
{
	struct harness_output o;
	char e_listen[96];

	snprintf(e_listen, sizeof(e_listen), "OUTBOX_HTTP_LISTEN=127.0.0.1:%d", probe_free_port());
	harness_cli(&o, NULL, (const char *const[]){ e_listen, NULL }, "healthcheck", NULL);
	cr_assert_eq(o.status, 1, "healthcheck exited %d: %s", o.status, o.err);
	cr_assert_not_null(strstr(o.err, "could not connect"), "stderr: %s", o.err);
	cr_assert_eq(strchr(o.err, '\n'), o.err + strlen(o.err) - 1, "one line: %s", o.err);
	harness_output_free(&o);
}

/* ---- JSON logs ---- */

Test(operability, json_logs_parse_line_by_line, .timeout = 300)
{
	static const char *const levels[] = { "debug", "info", "warn", "error" };
	struct op t;
	char *log, *line, *next;
	size_t lines = 0, warn = 0, error = 0, stopped = 0;
	int st;

	op_setup(&t, "op_json");
	insert_workload(&t, "op-json-unroutable");
	/* Debug adds the most kinds of lines; two attempts give a failure and then a death. */
	t.relay = fixture_relay_start(
	        &t.fx,
	        (const char *const[]){ t.e_listen, "OUTBOX_LOG_FORMAT=json",
	                               "OUTBOX_LOG_LEVEL=debug", "OUTBOX_RELAY_MAX_ATTEMPTS=2",
	                               "OUTBOX_RELAY_RETRY_BACKOFF_MIN=100ms",
	                               "OUTBOX_RELAY_POLL_INTERVAL=200ms", NULL });
	expect_delivered(&t, ROWS);
	HARNESS_WAIT(harness_pg_int(t.fx.pg,
	                            "SELECT count(*) FROM %s WHERE published_at IS NULL "
	                            "AND attempts >= 2",
	                            t.fx.table) == 1,
	             60000);
	cr_assert_eq(harness_pg_int(t.fx.pg,
	                            "SELECT count(*) FROM %s WHERE published_at IS NULL "
	                            "AND attempts >= 2",
	                            t.fx.table),
	             1, "the unroutable row never went dead");
	st = harness_relay_stop(t.relay, SIGTERM, EXIT_TIMEOUT_MS);
	cr_assert_eq(st, 0, "relay exited with %d", st);

	log = harness_relay_log(t.relay);
	/* Every line, empty ones included: an empty line is not a JSON object either. */
	for (line = log; *line != '\0'; line = next) {
		json_error_t jerr;
		json_t *o;
		const char *level;
		bool known = false;

		next = strchr(line, '\n');
		cr_assert_not_null(next, "the last line is not terminated: %s", line);
		*next++ = '\0';
		o = json_loads(line, 0, &jerr);
		lines++;
		cr_assert_not_null(o, "line %zu is not JSON (%s): %s", lines, jerr.text, line);
		cr_assert(json_is_object(o), "line %zu is not an object: %s", lines, line);
		cr_assert(json_is_string(json_object_get(o, "ts")), "no ts: %s", line);
		cr_assert(json_is_string(json_object_get(o, "component")), "no component: %s",
		          line);
		cr_assert(json_is_string(json_object_get(o, "msg")), "no msg: %s", line);
		level = json_string_value(json_object_get(o, "level"));
		cr_assert_not_null(level, "no level: %s", line);
		for (size_t i = 0; i < sizeof(levels) / sizeof(levels[0]); i++)
			known = known || strcmp(level, levels[i]) == 0;
		cr_assert(known, "unknown level: %s", line);
		warn += strcmp(level, "warn") == 0;
		error += strcmp(level, "error") == 0;
		stopped += strcmp(json_string_value(json_object_get(o, "msg")), "stopped") == 0;
		json_decref(o);
	}
	free(log);
	cr_assert_geq(lines, 5, "only %zu log lines", lines);
	cr_assert_geq(warn, 1, "the failed publish was not logged at warn");
	cr_assert_geq(error, 1, "the dead row was not logged at error");
	cr_assert_eq(stopped, 1, "the shutdown was not logged");
	fixture_teardown(&t.fx);
}

/* ---- the wake-up ---- */

#define NO_WAKEUP "wake-up trigger is missing or outdated"

/* A table without the wake-up trigger (made by hand, or by an older release): the relay says
 * so in one line however many loops it runs, naming the table and what fixes it, and keeps
 * relaying by polling. After `outbox-relay migrate` a relay finds the trigger and says
 * nothing. */
Test(operability, a_table_without_the_wakeup_is_said_once, .timeout = 300)
{
	struct op t;
	struct harness_relay *second;
	char *line;

	op_setup(&t, "op_wake");
	harness_pg_exec(t.fx.pg, "DROP TRIGGER %s_wakeup ON %s", t.fx.table, t.fx.table);
	const char *env[] = { t.e_listen, "OUTBOX_RELAY_WORKERS=2",
		              "OUTBOX_RELAY_POLL_INTERVAL=200ms", NULL };
	t.relay = fixture_relay_start(&t.fx, env);
	/* Ready: both loops are connected, and each looked before it counted as connected. */
	wait_ready(&t);
	cr_assert_eq(harness_relay_log_count(t.relay, NO_WAKEUP), 1, "one line for two loops");
	line = harness_relay_log_line(t.relay, NO_WAKEUP);
	cr_assert_not_null(line);
	cr_assert_not_null(strstr(line, "run 'outbox-relay migrate'"), "%s", line);
	cr_assert_not_null(strstr(line, t.fx.table), "the table is named: %s", line);
	cr_assert_not_null(strstr(line, "poll_interval=200ms"), "%s", line);
	free(line);
	/* Rows committed now reach the consumer, found by polling: nothing notifies. */
	harness_insert_rows(t.fx.pg, t.fx.table, ROWS, t.fx.exchange, "op.created", "op", NULL,
	                    NULL);
	expect_delivered(&t, ROWS);
	cr_assert_eq(harness_relay_stop(t.relay, SIGTERM, EXIT_TIMEOUT_MS), 0);

	harness_migrate(t.fx.table);
	snprintf(t.listen, sizeof(t.listen), "127.0.0.1:%d", probe_free_port());
	snprintf(t.e_listen, sizeof(t.e_listen), "OUTBOX_HTTP_LISTEN=%s", t.listen);
	second = fixture_relay_start(&t.fx, env);
	wait_ready(&t);
	cr_assert_eq(harness_relay_log_count(second, NO_WAKEUP), 0,
	             "migrate installed the trigger");
	fixture_teardown(&t.fx);
}

/* ---- secrets ---- */

#define PG_SECRET   "pg-Secret-4f7d2"
#define AMQP_SECRET "amqp-Secret-9c1e8"

static void expect_no_secret(const char *what, const char *text)
{
	cr_assert_null(strstr(text, PG_SECRET), "%s shows the database password:\n%s", what, text);
	cr_assert_null(strstr(text, AMQP_SECRET), "%s shows the broker password:\n%s", what, text);
}

Test(operability, passwords_never_shown, .timeout = 300)
{
	const char *ctl = harness_require_env("RELAY_TEST_RABBITMQCTL");
	struct op t;
	struct harness_output o;
	char user[64], e_db[512], e_amqp[512], *text;
	int st;

	op_setup(&t, "op_secret");
	/* A broker user of our own, so the AMQP password is one that appears nowhere else. */
	harness_unique_name(user, sizeof(user), "relayuser");
	cr_assert_eq(harness_shell("'%s' add_user '%s' '%s' >/dev/null", ctl, user, AMQP_SECRET),
	             0);
	cr_assert_eq(harness_shell("'%s' set_permissions -p / '%s' '.*' '.*' '.*' >/dev/null", ctl,
	                           user),
	             0);
	/* The test server trusts loopback, so the database password is accepted and unused. */
	snprintf(e_db, sizeof(e_db),
	         "OUTBOX_DATABASE_URL=postgresql://postgres:" PG_SECRET "@127.0.0.1:%s/postgres",
	         harness_require_env("RELAY_TEST_PG_PORT"));
	snprintf(e_amqp, sizeof(e_amqp), "OUTBOX_AMQP_URL=amqp://%s:" AMQP_SECRET "@127.0.0.1:%d",
	         user, harness_amqp_port());

	harness_insert_rows(t.fx.pg, t.fx.table, 5, t.fx.exchange, "op.secret", "sec", NULL, NULL);
	t.relay = fixture_relay_start(
	        &t.fx, (const char *const[]){ e_db, e_amqp, t.e_listen,
	                                      "OUTBOX_RELAY_POLL_INTERVAL=200ms", NULL });
	wait_ready(&t);
	expect_delivered(&t, 5); /* both passwords worked */

	text = scrape(&t);
	expect_no_secret("/metrics", text);
	free(text);

	harness_cli(&o, t.fx.table, (const char *const[]){ e_db, e_amqp, NULL }, "config", "show",
	            NULL);
	cr_assert_eq(o.status, 0, "config show exited %d: %s", o.status, o.err);
	expect_no_secret("config show", o.out);
	expect_no_secret("config show's stderr", o.err);
	cr_assert_not_null(strstr(o.out, "postgresql://postgres:***@127.0.0.1:"), "%s", o.out);
	cr_assert_not_null(strstr(o.out, ":***@127.0.0.1:"), "%s", o.out);
	cr_assert_not_null(strstr(o.out, user), "%s", o.out);
	harness_output_free(&o);

	harness_cli(&o, t.fx.table,
	            (const char *const[]){ e_db, e_amqp, "OUTBOX_RELAY_BATCH_SIZE=0", NULL }, "run",
	            NULL);
	cr_assert_eq(o.status, 2, "a bad batch size must stop the start: %s", o.err);
	cr_assert_not_null(strstr(o.err, "relay.batch_size"), "%s", o.err);
	expect_no_secret("a failed start", o.err);
	expect_no_secret("a failed start's stdout", o.out);
	harness_output_free(&o);

	/* A URL that fails validation is reported without its value. */
	harness_cli(&o, t.fx.table,
	            (const char *const[]){
	                    e_db, "OUTBOX_AMQP_URL=ampq://x:" AMQP_SECRET "@127.0.0.1:5672", NULL },
	            "run", NULL);
	cr_assert_eq(o.status, 2, "a bad amqp.url must stop the start: %s", o.err);
	cr_assert_not_null(strstr(o.err, "amqp.url"), "%s", o.err);
	expect_no_secret("a failed start", o.err);
	harness_output_free(&o);

	st = harness_relay_stop(t.relay, SIGTERM, EXIT_TIMEOUT_MS);
	cr_assert_eq(st, 0, "relay exited with %d", st);
	text = harness_relay_log(t.relay);
	expect_no_secret("the relay's log", text);
	cr_assert_not_null(strstr(text, "postgresql://postgres:***@"), "%s", text);
	cr_assert_not_null(strstr(text, ":***@127.0.0.1:"), "%s", text);
	free(text);
	(void)harness_shell("'%s' delete_user '%s' >/dev/null", ctl, user);
	fixture_teardown(&t.fx);
}
