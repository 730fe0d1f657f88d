/* Several named sources in one `outbox-relay run` (issue 38): each table's rows reach its own
 * queue, /metrics labels every series with its source, log lines name the source, status goes
 * through every source, --source selects one, and a source whose database is down or whose
 * table is refused stalls none of the others. The sources come from the environment form
 * (OUTBOX_SOURCES=orders,billing, OUTBOX_SOURCES_ORDERS_DATABASE_TABLE=...). */
#include <criterion/criterion.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <libpq-fe.h>

#include "tests/support/fixture.h"
#include "tests/support/http_probe.h"

/* Generous deadlines: the suite runs under ASan on two cores beside other test files. */
#define DELIVERY_TIMEOUT_MS 180000
#define READY_TIMEOUT_MS    60000
#define EXIT_TIMEOUT_MS     30000
#define ROWS                300
#define PGBOUNCER           "/usr/sbin/pgbouncer"

/* The environment of a relay with two sources, orders on a's table and billing on b's, /metrics
 * on listen; billing_extra (NULL: none) is one more of billing's variables, such as a
 * database.url or amqp.url where nobody listens. */
struct env {
	char v[8][300];
	const char *p[9];
};

static const char *const *two_sources(struct env *e, const struct fixture *a,
                                      const struct fixture *b, const char *billing_extra,
                                      const char *listen)
{
	size_t n = 0;

	snprintf(e->v[n++], sizeof(e->v[0]), "OUTBOX_SOURCES=orders,billing");
	snprintf(e->v[n++], sizeof(e->v[0]), "OUTBOX_SOURCES_ORDERS_DATABASE_TABLE=%s", a->table);
	snprintf(e->v[n++], sizeof(e->v[0]), "OUTBOX_SOURCES_ORDERS_DATABASE_CHANNEL=%s", a->table);
	snprintf(e->v[n++], sizeof(e->v[0]), "OUTBOX_SOURCES_BILLING_DATABASE_TABLE=%s", b->table);
	snprintf(e->v[n++], sizeof(e->v[0]), "OUTBOX_SOURCES_BILLING_DATABASE_CHANNEL=%s",
	         b->table);
	if (billing_extra)
		snprintf(e->v[n++], sizeof(e->v[0]), "%s", billing_extra);
	snprintf(e->v[n++], sizeof(e->v[0]), "OUTBOX_HTTP_LISTEN=%s", listen ? listen : "");
	snprintf(e->v[n++], sizeof(e->v[0]), "OUTBOX_RELAY_POLL_INTERVAL=200ms");
	for (size_t i = 0; i < n; i++)
		e->p[i] = e->v[i];
	e->p[n] = NULL;
	return e->p;
}

/* The relay of a test, kept in a's fixture so that teardown finishes it (expecting exit 0). */
static struct harness_relay *start(struct fixture *a, const char *const *env)
{
	struct harness_relay *r = harness_relay_start(a->table, env, NULL);

	a->relays[a->n_relays++] = r;
	return r;
}

static bool metric_is(const char *listen, const char *series, double want)
{
	struct probe_reply p = probe_get(listen, "/metrics");
	bool ok = p.status == 200 && probe_metric(p.body, series) == want;

	free(p.body);
	return ok;
}

static bool ready_is(const char *listen, int status, const char *needle)
{
	struct probe_reply p = probe_get(listen, "/readyz");
	bool ok = p.status == status && strstr(p.body, needle) != NULL;

	free(p.body);
	return ok;
}

/* Every one of c's deliveries has an id starting with prefix: nothing of another source. */
static void only_ids_of(struct consumer *c, const char *prefix)
{
	size_t n;
	const char **ids = consumer_order(c, &n);

	for (size_t i = 0; i < n; i++)
		cr_assert_eq(strncmp(ids[i], prefix, strlen(prefix)), 0,
		             "'%s' reached the queue of source %s", ids[i], prefix);
	free(ids);
}

static void expect_status_json(const struct fixture *a, const struct fixture *b,
                               const char *const *env)
{
	struct harness_output o;
	json_error_t jerr;
	json_t *j;

	harness_cli(&o, a->table, env, "status", "--json", (const char *)NULL);
	cr_assert_eq(o.status, 0, "status exited %d: %s%s", o.status, o.out, o.err);
	j = json_loads(o.out, 0, &jerr);
	cr_assert_not_null(j, "status --json is not JSON (%s): %s", jerr.text, o.out);
	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "orders"), "table")),
	                 a->table, "%s", o.out);
	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "billing"), "table")),
	                 b->table, "%s", o.out);
	cr_assert_eq(json_integer_value(json_object_get(json_object_get(j, "billing"), "pending")),
	             0, "%s", o.out);
	json_decref(j);
	harness_output_free(&o);

	harness_cli(&o, a->table, env, "--source", "billing", "status", "--json",
	            (const char *)NULL);
	cr_assert_eq(o.status, 0, "status --source exited %d: %s%s", o.status, o.out, o.err);
	j = json_loads(o.out, 0, &jerr);
	cr_assert_not_null(j, "not JSON (%s): %s", jerr.text, o.out);
	cr_assert_str_eq(json_string_value(json_object_get(j, "table")), b->table, "%s", o.out);
	json_decref(j);
	harness_output_free(&o);
}

static void expect_usage_rules(const struct fixture *a, const char *const *env)
{
	struct harness_output o;

	harness_cli(&o, a->table, env, "dead", (const char *)NULL);
	cr_assert_eq(o.status, 2, "dead without --source exited %d: %s", o.status, o.err);
	cr_assert_not_null(strstr(o.err, "several sources are configured (orders, billing): name "
	                                 "one with --source"),
	                   "%s", o.err);
	harness_output_free(&o);
	harness_cli(&o, a->table, env, "--source", "shipping", "dead", (const char *)NULL);
	cr_assert_eq(o.status, 2, "an unknown --source exited %d: %s", o.status, o.err);
	cr_assert_not_null(strstr(o.err, "'shipping'"), "%s", o.err);
	cr_assert_not_null(strstr(o.err, "orders, billing"), "%s", o.err);
	harness_output_free(&o);
	harness_cli(&o, a->table, env, "--source", "orders", "dead", "--json", (const char *)NULL);
	cr_assert_eq(o.status, 0, "dead --source orders exited %d: %s", o.status, o.err);
	cr_assert_not_null(strstr(o.out, "[]"), "%s", o.out);
	harness_output_free(&o);
}

Test(sources_run, two_sources_relay_to_their_own_queues, .timeout = 400)
{
	struct fixture a, b;
	struct env e;
	char listen[64];
	const char *const *env;
	struct harness_relay *r;

	fixture_setup(&a, "src_orders", NULL);
	fixture_setup(&b, "src_billing", NULL);
	snprintf(listen, sizeof(listen), "127.0.0.1:%d", probe_free_port());
	env = two_sources(&e, &a, &b, NULL, listen);
	harness_insert_rows(a.pg, a.table, ROWS, a.exchange, "orders.created", "orders", NULL,
	                    NULL);
	harness_insert_rows(b.pg, b.table, ROWS, b.exchange, "billing.created", "billing", NULL,
	                    NULL);
	r = start(&a, env);

	fixture_expect_unique(&a, a.cons, ROWS, DELIVERY_TIMEOUT_MS);
	fixture_expect_unique(&a, b.cons, ROWS, DELIVERY_TIMEOUT_MS);
	only_ids_of(a.cons, "orders-");
	only_ids_of(b.cons, "billing-");
	fprintf(stderr, "two sources: duplicates orders %zu, billing %zu\n",
	        consumer_duplicates(a.cons), consumer_duplicates(b.cons));
	/* The broker's confirm comes before the mark: wait for both tables to be marked. */
	HARNESS_WAIT(harness_unpublished_count(a.pg, a.table) == 0 &&
	                     harness_unpublished_count(b.pg, b.table) == 0,
	             READY_TIMEOUT_MS);
	cr_assert_eq(harness_unpublished_count(a.pg, a.table), 0);
	cr_assert_eq(harness_unpublished_count(b.pg, b.table), 0);

	HARNESS_WAIT(
	        metric_is(listen, "outbox_relay_published_total{source=\"billing\"}", ROWS) &&
	                metric_is(listen, "outbox_relay_published_total{source=\"orders\"}", ROWS),
	        READY_TIMEOUT_MS);
	cr_assert(metric_is(listen, "outbox_relay_published_total{source=\"orders\"}", ROWS));
	cr_assert(metric_is(listen, "outbox_relay_published_total{source=\"billing\"}", ROWS));
	cr_assert(metric_is(listen, "outbox_relay_workers{source=\"billing\"}", 1));
	HARNESS_WAIT(ready_is(listen, 200, "orders ready") &&
	                     ready_is(listen, 200, "billing ready"),
	             READY_TIMEOUT_MS);
	cr_assert(ready_is(listen, 200, "orders ready"));
	cr_assert(ready_is(listen, 200, "billing ready"));
	cr_assert(harness_relay_wait_log(r, "component=worker1 source=orders msg=\"connected\"",
	                                 READY_TIMEOUT_MS));
	cr_assert(harness_relay_wait_log(r, "component=worker1 source=billing msg=\"connected\"",
	                                 READY_TIMEOUT_MS));
	cr_assert(harness_relay_wait_log(r, "source=billing msg=\"summary\"", 30000));

	expect_status_json(&a, &b, env);
	expect_usage_rules(&a, env);
	cr_assert_eq(harness_relay_stop(r, SIGTERM, EXIT_TIMEOUT_MS), 0);
	fixture_teardown(&b);
	fixture_teardown(&a);
}

/* A source whose database cannot be reached stalls no other: orders relays, /readyz names
 * billing as not ready (503), and SIGTERM still stops both in time with status 0. */
Test(sources_run, a_source_down_does_not_stall_the_other, .timeout = 300)
{
	struct fixture a, b;
	struct env e;
	char listen[64];
	struct harness_relay *r;

	fixture_setup(&a, "src_up", NULL);
	fixture_setup(&b, "src_down", &(struct fixture_options){ .no_consumer = true });
	snprintf(listen, sizeof(listen), "127.0.0.1:%d", probe_free_port());
	harness_insert_rows(a.pg, a.table, ROWS, a.exchange, "orders.created", "orders", NULL,
	                    NULL);
	r = start(&a, two_sources(&e, &a, &b,
	                          "OUTBOX_SOURCES_BILLING_DATABASE_URL="
	                          "postgresql://127.0.0.1:1/none?connect_timeout=2",
	                          listen));

	fixture_expect_unique(&a, a.cons, ROWS, DELIVERY_TIMEOUT_MS);
	HARNESS_WAIT(ready_is(listen, 503, "billing not ready: database not connected") &&
	                     ready_is(listen, 503, "orders ready"),
	             READY_TIMEOUT_MS);
	cr_assert(ready_is(listen, 503, "orders ready"));
	cr_assert(ready_is(listen, 503, "billing not ready: database not connected"));
	cr_assert(metric_is(listen, "outbox_relay_database_up{source=\"billing\"}", 0));
	cr_assert(metric_is(listen, "outbox_relay_database_up{source=\"orders\"}", 1));
	cr_assert(harness_relay_wait_log(r, "source=billing msg=\"could not connect, will retry\"",
	                                 READY_TIMEOUT_MS));
	cr_assert_eq(harness_relay_stop(r, SIGTERM, EXIT_TIMEOUT_MS), 0);
	fixture_teardown(&b);
	fixture_teardown(&a);
}

/* A source whose broker cannot be reached stalls no other either. */
Test(sources_run, a_source_without_broker_does_not_stall_the_other, .timeout = 300)
{
	struct fixture a, b;
	struct env e;
	char listen[64], url[200];
	struct harness_relay *r;

	fixture_setup(&a, "src_mq_up", NULL);
	fixture_setup(&b, "src_mq_down", &(struct fixture_options){ .no_consumer = true });
	snprintf(listen, sizeof(listen), "127.0.0.1:%d", probe_free_port());
	harness_insert_rows(a.pg, a.table, ROWS, a.exchange, "orders.created", "orders", NULL,
	                    NULL);
	harness_insert_rows(b.pg, b.table, 10, "amq.topic", "billing.created", "billing", NULL,
	                    NULL);
	snprintf(url, sizeof(url),
	         "OUTBOX_SOURCES_BILLING_AMQP_URL=amqp://guest:guest@127.0.0.1:%d",
	         probe_free_port());
	r = start(&a, two_sources(&e, &a, &b, url, listen));

	fixture_expect_unique(&a, a.cons, ROWS, DELIVERY_TIMEOUT_MS);
	HARNESS_WAIT(ready_is(listen, 503, "billing not ready: broker not connected") &&
	                     ready_is(listen, 503, "orders ready"),
	             READY_TIMEOUT_MS);
	cr_assert(ready_is(listen, 503, "orders ready"));
	cr_assert(ready_is(listen, 503, "billing not ready: broker not connected"));
	cr_assert(metric_is(listen, "outbox_relay_broker_up{source=\"billing\"}", 0));
	cr_assert(metric_is(listen, "outbox_relay_published_total{source=\"billing\"}", 0));
	cr_assert_eq(harness_unpublished_count(b.pg, b.table), 10, "billing published nothing");
	cr_assert_eq(harness_relay_stop(r, SIGTERM, EXIT_TIMEOUT_MS), 0);
	fixture_teardown(&b);
	fixture_teardown(&a);
}

/* A source whose table is refused at start (a seq sequence with CACHE > 1) is marked failed,
 * not started, and the process does not exit: the other relays; /readyz says which failed;
 * the exit status at shutdown is 1. */
Test(sources_run, a_refused_source_fails_alone, .timeout = 300)
{
	struct fixture a, b;
	struct env e;
	char listen[64];
	struct harness_relay *r;
	char *seq;

	fixture_setup(&a, "src_fine", NULL);
	fixture_setup(&b, "src_refused", &(struct fixture_options){ .no_consumer = true });
	seq = harness_pg_string(b.pg, "SELECT pg_get_serial_sequence('%s', 'seq')", b.table);
	cr_assert_not_null(seq);
	harness_pg_exec(b.pg, "ALTER SEQUENCE %s CACHE 20", seq);
	free(seq);
	snprintf(listen, sizeof(listen), "127.0.0.1:%d", probe_free_port());
	harness_insert_rows(a.pg, a.table, ROWS, a.exchange, "orders.created", "orders", NULL,
	                    NULL);
	r = harness_relay_start(a.table, two_sources(&e, &a, &b, NULL, listen), NULL);

	fixture_expect_unique(&a, a.cons, ROWS, DELIVERY_TIMEOUT_MS);
	cr_assert(harness_relay_wait_log(r,
	                                 "source=billing msg=\"cannot relay from this table, "
	                                 "source not started\"",
	                                 READY_TIMEOUT_MS));
	HARNESS_WAIT(ready_is(listen, 503, "billing failed"), READY_TIMEOUT_MS);
	cr_assert(ready_is(listen, 503, "billing failed"));
	cr_assert(ready_is(listen, 503, "orders ready"));
	cr_assert(metric_is(listen, "outbox_relay_source_failed{source=\"billing\"}", 1));
	cr_assert_eq(harness_relay_stop(r, SIGTERM, EXIT_TIMEOUT_MS), 1,
	             "a run with a failed source must exit 1");
	harness_relay_free(r);
	fixture_teardown(&b);
	fixture_teardown(&a);
}

/* ---- a source that fails at run time: behind a transaction-pooling PgBouncer ---- */
/* (The same PgBouncer set-up as tests/integration/test_pooler.c, trimmed to one mode.) */

struct bouncer {
	struct harness_relay *proc; /* killed at the test's exit whatever happens */
	char dir[128];
	char url[256]; /* conninfo through the pooler */
};

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	cr_assert_not_null(f, "cannot write %s", path);
	fputs(text, f);
	cr_assert_eq(fclose(f), 0);
	cr_assert_eq(chmod(path, 0644), 0);
}

static bool bouncer_accepts(void *arg)
{
	struct bouncer *b = arg;
	PGconn *c = PQconnectdb(b->url);
	bool ok = PQstatus(c) == CONNECTION_OK;

	PQfinish(c);
	return ok;
}

/* PgBouncer in transaction pooling in front of the test server, which the relay refuses (it
 * LISTENs and keeps session settings). It refuses to run as root, so it drops to postgres. */
static void bouncer_start(struct bouncer *b)
{
	char ini[160], users[160], text[1024];
	int port = probe_free_port();

	cr_assert(access(PGBOUNCER, X_OK) == 0, PGBOUNCER " is missing (tests/install-deps.sh)");
	snprintf(b->dir, sizeof(b->dir), "/tmp/outbox-pgbouncer-XXXXXX");
	cr_assert_not_null(mkdtemp(b->dir));
	cr_assert_eq(chmod(b->dir, 0755), 0);
	snprintf(ini, sizeof(ini), "%s/pgbouncer.ini", b->dir);
	snprintf(users, sizeof(users), "%s/users.txt", b->dir);
	write_file(users, "\"postgres\" \"\"\n");
	snprintf(text, sizeof(text),
	         "[databases]\n* = host=127.0.0.1 port=%s\n[pgbouncer]\nlisten_addr = 127.0.0.1\n"
	         "listen_port = %d\nunix_socket_dir =\nauth_type = trust\nauth_file = %s\n"
	         "pool_mode = transaction\nmax_client_conn = 200\ndefault_pool_size = 20\n"
	         "server_reset_query = DISCARD ALL\n"
	         "ignore_startup_parameters = extra_float_digits\n",
	         harness_require_env("RELAY_TEST_PG_PORT"), port, users);
	write_file(ini, text);
	b->proc = harness_program_start(
	        PGBOUNCER, (const char *const[]){ "-u", "postgres", ini, NULL }, NULL, "pgbouncer");
	snprintf(b->url, sizeof(b->url),
	         "host=127.0.0.1 port=%d user=postgres dbname=postgres connect_timeout=5", port);
	if (!harness_wait_until(bouncer_accepts, b, 20000)) {
		harness_relay_dump_log(b->proc);
		cr_assert_fail("pgbouncer did not accept connections on port %d", port);
	}
}

static void bouncer_stop(struct bouncer *b)
{
	char path[200];

	harness_relay_free(b->proc);
	snprintf(path, sizeof(path), "%s/pgbouncer.ini", b->dir);
	unlink(path);
	snprintf(path, sizeof(path), "%s/users.txt", b->dir);
	unlink(path);
	rmdir(b->dir);
}

/* billing's loop meets what no retry can fix (a transaction pooler) after the start: billing
 * stops alone, said once; orders relays on, rows inserted after billing failed included;
 * /readyz names billing failed; SIGTERM ends the process with status 1. */
Test(sources_run, a_source_that_cannot_relay_stops_alone, .timeout = 300)
{
	struct fixture a, b;
	struct bouncer pool;
	struct env e;
	char listen[64], url[320];
	struct harness_relay *r;

	fixture_setup(&a, "src_going", NULL);
	fixture_setup(&b, "src_pooled", &(struct fixture_options){ .no_consumer = true });
	bouncer_start(&pool);
	snprintf(listen, sizeof(listen), "127.0.0.1:%d", probe_free_port());
	snprintf(url, sizeof(url), "OUTBOX_SOURCES_BILLING_DATABASE_URL=%s", pool.url);
	r = harness_relay_start(a.table, two_sources(&e, &a, &b, url, listen), NULL);

	cr_assert(harness_relay_wait_log(r, "source stopped on an error no retry can fix",
	                                 READY_TIMEOUT_MS));
	cr_assert(harness_relay_wait_log(r,
	                                 "component=worker1 source=billing msg=\"cannot relay "
	                                 "through this database connection\"",
	                                 1000));
	harness_insert_rows(a.pg, a.table, ROWS, a.exchange, "orders.created", "orders", NULL,
	                    NULL);
	fixture_expect_unique(&a, a.cons, ROWS, DELIVERY_TIMEOUT_MS);
	HARNESS_WAIT(ready_is(listen, 503, "billing failed") &&
	                     ready_is(listen, 503, "orders ready"),
	             READY_TIMEOUT_MS);
	cr_assert(ready_is(listen, 503, "billing failed"));
	cr_assert(ready_is(listen, 503, "orders ready"));
	cr_assert(metric_is(listen, "outbox_relay_source_failed{source=\"billing\"}", 1));
	cr_assert_eq(harness_relay_log_count(r, "source stopped on an error no retry can fix"), 1);
	cr_assert_eq(harness_relay_stop(r, SIGTERM, EXIT_TIMEOUT_MS), 1,
	             "a run with a failed source must exit 1");
	harness_relay_free(r);
	bouncer_stop(&pool);
	fixture_teardown(&b);
	fixture_teardown(&a);
}
