/* One relay process, four named sources: three databases on the test server and one on a
 * second server. The second server is stopped and started again, and one source is given rows
 * that can never be published; the other sources deliver meanwhile, /readyz names the source
 * that is down, every metric of a source carries its label, and in the end every committed row
 * of every source reached its own consumer once at least (lost = 0, duplicates counted). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/fault.h"
#include "tests/support/http_probe.h"

#define N_SOURCES    4
#define FAR          3 /* the source on the second server */
#define BAD          2 /* the source given bad rows */
#define ROUND        400
#define N_BAD        5
#define MAX_ATTEMPTS 3

struct source {
	char name[8]; /* "a" .. "d": OUTBOX_SOURCES_<NAME>_... */
	char db[64];
	char conninfo[256];
	char table[48];
	char exchange[64];
	char queue[64];
	PGconn *pg;
	struct consumer *cons;
	size_t committed; /* ids "<name>-<i, 7 digits>" for i below it */
};

static struct source g_src[N_SOURCES];
static struct harness_relay *g_relay;
static char g_listen[32];

static const char *server_conninfo(int i)
{
	return i == FAR ? harness_require_env("RELAY_TEST_PG2") : harness_pg_conninfo();
}

static PGconn *connect_to(const char *conninfo)
{
	PGconn *c = PQconnectdb(conninfo);

	cr_assert_eq(PQstatus(c), CONNECTION_OK, "connecting to %s: %s", conninfo,
	             PQerrorMessage(c));
	return c;
}

/* A database of its own for source i (on the second server for FAR), its outbox table
 * migrated by the relay's own command, and a consumer on its own exchange. */
static void source_setup(int i)
{
	struct source *s = &g_src[i];
	struct harness_output o;
	char url[320];
	const char *env[] = { url, NULL };
	PGconn *admin;

	char db[64], table[48];

	snprintf(s->name, sizeof(s->name), "%c", 'a' + i);
	harness_unique_name(db, sizeof(db), "src_db");
	harness_unique_name(table, sizeof(table), "src");
	memcpy(s->table, table, sizeof(table));
	snprintf(s->exchange, sizeof(s->exchange), "%s_ex", table);
	snprintf(s->queue, sizeof(s->queue), "%s_q", table);
	admin = connect_to(server_conninfo(i));
	harness_pg_exec(admin, "CREATE DATABASE %s", db);
	memcpy(s->db, db, sizeof(db));
	PQfinish(admin);
	/* A keyword given twice in a conninfo string takes its last value. */
	snprintf(s->conninfo, sizeof(s->conninfo), "%s dbname=%s", server_conninfo(i), db);
	s->pg = connect_to(s->conninfo);
	snprintf(url, sizeof(url), "OUTBOX_DATABASE_URL=%s", s->conninfo);
	harness_cli(&o, s->table, env, "migrate", NULL);
	cr_assert_eq(o.status, 0, "migrate of source %s: %s", s->name, o.err);
	harness_output_free(&o);
	s->cons = consumer_start(harness_amqp_url(), s->queue, s->exchange, "topic", "#");
}

static void sources_teardown(void)
{
	harness_relay_free(g_relay);
	g_relay = NULL;
	for (int i = 0; i < N_SOURCES; i++) {
		struct source *s = &g_src[i];
		PGconn *admin;

		if (s->cons)
			consumer_stop(s->cons);
		if (s->pg)
			PQfinish(s->pg);
		if (s->db[0]) {
			admin = PQconnectdb(server_conninfo(i));
			if (PQstatus(admin) == CONNECTION_OK)
				PQclear(PQexec(admin, "SET client_min_messages = warning"));
			if (PQstatus(admin) == CONNECTION_OK) {
				char sql[128];

				snprintf(sql, sizeof(sql),
				         "DROP DATABASE IF EXISTS %s WITH (FORCE)", s->db);
				PQclear(PQexec(admin, sql));
			}
			PQfinish(admin);
		}
		memset(s, 0, sizeof(*s));
	}
}

/* The far server: stopped (fast: its sessions end at once) or started again. */
static void far_server(const char *action)
{
	cr_assert_eq(harness_shell("%s %s -m fast -w -t 60",
	                           harness_require_env("RELAY_TEST_PG2_CTL"), action),
	             0, "pg_ctl %s on the second server failed", action);
}

static void commit_rows(int i, size_t n)
{
	struct source *s = &g_src[i];
	char prefix[16];

	/* insert_rows numbers from 0: a round of its own writes the next ids by hand. */
	snprintf(prefix, sizeof(prefix), "%s", s->name);
	harness_pg_exec(
	        s->pg,
	        "INSERT INTO %s (id, exchange_name, routing_key, body)"
	        " SELECT '%s-' || lpad(g::text, 7, '0'), '%s', 'src.%s', '{\"n\":' || g || '}'"
	        " FROM generate_series(%zu, %zu) g",
	        s->table, prefix, s->exchange, s->name, s->committed, s->committed + n - 1);
	s->committed += n;
}

static void expect_delivered(int i)
{
	struct source *s = &g_src[i];

	if (!consumer_wait_unique(s->cons, s->committed, FAULT_DELIVERY_TIMEOUT_MS))
		harness_relay_dump_log(g_relay);
	cr_assert_geq(consumer_unique(s->cons), s->committed,
	              "source %s: %zu of %zu committed rows delivered", s->name,
	              consumer_unique(s->cons), s->committed);
}

/* Every committed id of source i at its consumer: prints the count line of the fault suite
 * and returns the number lost. */
static size_t count_lost(int i)
{
	struct source *s = &g_src[i];
	size_t lost = 0;
	char id[32];

	for (size_t k = 0; k < s->committed; k++) {
		snprintf(id, sizeof(id), "%s-%07zu", s->name, k);
		if (consumer_count(s->cons, id) == 0)
			lost++;
	}
	fprintf(stderr, "fault sources/%s: committed=%zu received=%zu lost=%zu duplicates=%zu\n",
	        s->name, s->committed, consumer_received(s->cons), lost,
	        consumer_duplicates(s->cons));
	return lost;
}

/* Whether one line of the relay's log holds both a and b. */
static bool log_line_has(const char *a, const char *b)
{
	char *log = harness_relay_log(g_relay), *save = NULL;
	bool found = false;

	for (char *line = strtok_r(log, "\n", &save); line && !found;
	     line = strtok_r(NULL, "\n", &save))
		found = strstr(line, a) && strstr(line, b);
	free(log);
	return found;
}

static bool far_lost_logged(void *arg)
{
	(void)arg;
	return log_line_has("source=d", "lost connection");
}

static void start_relay(void)
{
	static char vars[N_SOURCES * 3][400];
	const char *env[N_SOURCES * 3 + 12];
	size_t n = 0;
	char listen[64];

	snprintf(g_listen, sizeof(g_listen), "127.0.0.1:%d", probe_free_port());
	snprintf(listen, sizeof(listen), "OUTBOX_HTTP_LISTEN=%s", g_listen);
	env[n++] = "OUTBOX_SOURCES=a,b,c,d";
	for (int i = 0; i < N_SOURCES; i++) {
		const struct source *s = &g_src[i];
		char up = (char)('A' + i);

		snprintf(vars[3 * i], sizeof(vars[0]), "OUTBOX_SOURCES_%c_DATABASE_URL=%s", up,
		         s->conninfo);
		snprintf(vars[3 * i + 1], sizeof(vars[0]), "OUTBOX_SOURCES_%c_DATABASE_TABLE=%s",
		         up, s->table);
		snprintf(vars[3 * i + 2], sizeof(vars[0]), "OUTBOX_SOURCES_%c_DATABASE_CHANNEL=%s",
		         up, s->table);
		for (int k = 0; k < 3; k++)
			env[n++] = vars[3 * i + k];
	}
	env[n++] = listen;
	env[n++] = "OUTBOX_RELAY_MAX_ATTEMPTS=3";
	env[n++] = "OUTBOX_RELAY_LEASE=30s";
	env[n++] = "OUTBOX_AMQP_CONFIRM_TIMEOUT=10s";
	env[n++] = "OUTBOX_RELAY_RETRY_BACKOFF_MIN=200ms";
	env[n++] = "OUTBOX_RELAY_RETRY_BACKOFF_MAX=1s";
	env[n++] = "OUTBOX_RELAY_POLL_INTERVAL=200ms";
	env[n++] = NULL;
	g_relay = harness_relay_start(g_src[0].table, env, NULL);
}

/* Rows of source BAD that can never be published (a malformed body or headers), among good
 * ones: dead after MAX_ATTEMPTS, with the reason in last_error. */
static void commit_bad_rows(void)
{
	struct source *s = &g_src[BAD];

	harness_pg_exec(s->pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body, body_encoding,"
	                " headers) SELECT 'bad-' || g, '%s', 'src.bad', '!!not base64!!',"
	                " 'base64', '{}' FROM generate_series(1, %d) g",
	                s->table, s->exchange, N_BAD);
}

/* Source i's value of family (a counter) in a /metrics text; -1 when the series is missing. */
static double series_of(const char *text, const char *family, int i)
{
	char series[256];

	snprintf(series, sizeof(series), "%s{source=\"%.8s\"}", family, g_src[i].name);
	return probe_metric(text, series);
}

/* What /metrics must say once the relay has counted what the consumers saw: each source's
 * published counter at least its committed rows, source c's dead counter its bad rows, source
 * a's none. A delivery reaches the consumer before the relay counts its confirm, so this is
 * waited for (the counters only grow, and a's dead counter never moves). */
static bool metrics_counted(const char *text)
{
	bool ok = series_of(text, "outbox_relay_dead_total", BAD) == (double)N_BAD &&
	          series_of(text, "outbox_relay_dead_total", 0) == 0.0;

	for (int i = 0; i < N_SOURCES; i++)
		ok = ok && series_of(text, "outbox_relay_published_total", i) >=
		                   (double)g_src[i].committed;
	return ok;
}

static bool metrics_caught_up(void *arg)
{
	struct probe_reply m = probe_get(g_listen, "/metrics");
	bool ok = m.status == 200 && metrics_counted(m.body);

	(void)arg;
	free(m.body);
	return ok;
}

/* Waits for metrics_counted(), then asserts each of its series on its own, so that a failure
 * names the series that fell short. */
static void check_metrics(void)
{
	struct probe_reply m;

	(void)harness_wait_until(metrics_caught_up, NULL, FAULT_LOG_TIMEOUT_MS);
	m = probe_get(g_listen, "/metrics");
	cr_assert_eq(m.status, 200, "/metrics answered %d", m.status);
	for (int i = 0; i < N_SOURCES; i++)
		cr_assert_geq(series_of(m.body, "outbox_relay_published_total", i),
		              (double)g_src[i].committed,
		              "outbox_relay_published_total of source %s below the rows delivered",
		              g_src[i].name);
	cr_assert_eq(series_of(m.body, "outbox_relay_dead_total", BAD), (double)N_BAD,
	             "outbox_relay_dead_total of source %s", g_src[BAD].name);
	cr_assert_eq(series_of(m.body, "outbox_relay_dead_total", 0), 0.0,
	             "outbox_relay_dead_total of source %s", g_src[0].name);
	/* No series without its source. */
	cr_assert_null(strstr(m.body, "\noutbox_relay_published_total "),
	               "an unlabelled series in /metrics");
	free(m.body);
}

static bool far_not_ready(void *arg)
{
	struct probe_reply r = probe_get(g_listen, "/readyz");
	bool down = r.status == 503 && strstr(r.body, "d not ready: database not connected");

	(void)arg;
	free(r.body);
	return down;
}

static bool all_ready(void *arg)
{
	struct probe_reply r = probe_get(g_listen, "/readyz");
	bool up = r.status == 200;

	(void)arg;
	free(r.body);
	return up;
}

/* A test that failed while the second server was down leaves it running for the next. */
static void fini(void)
{
	harness_shell("%s status >/dev/null || %s start -w -t 60",
	              harness_require_env("RELAY_TEST_PG2_CTL"),
	              harness_require_env("RELAY_TEST_PG2_CTL"));
	sources_teardown();
}

Test(fault_sources, one_process_many_databases, .timeout = 600, .fini = fini)
{
	size_t lost = 0;

	for (int i = 0; i < N_SOURCES; i++)
		source_setup(i);
	start_relay();
	for (int i = 0; i < N_SOURCES; i++)
		commit_rows(i, ROUND);
	for (int i = 0; i < N_SOURCES; i++)
		expect_delivered(i);
	cr_assert(harness_wait_until(all_ready, NULL, FAULT_LOG_TIMEOUT_MS), "/readyz not 200");

	/* The second server goes away: its source stops, the others go on. */
	far_server("stop");
	cr_assert(harness_wait_until(far_lost_logged, NULL, FAULT_LOG_TIMEOUT_MS),
	          "no 'lost connection' line naming source d");
	cr_assert(harness_wait_until(far_not_ready, NULL, FAULT_LOG_TIMEOUT_MS),
	          "/readyz does not name source d as not ready");
	for (int i = 0; i < N_SOURCES; i++) {
		if (i != FAR)
			commit_rows(i, ROUND);
	}
	commit_bad_rows();
	for (int i = 0; i < N_SOURCES; i++) {
		if (i != FAR)
			expect_delivered(i);
	}
	cr_assert_not(log_line_has("source=a", "lost connection"), "source a lost a connection");

	/* Back: the far source catches up with rows committed after the restart. */
	far_server("start");
	PQfinish(g_src[FAR].pg);
	g_src[FAR].pg = connect_to(g_src[FAR].conninfo);
	commit_rows(FAR, ROUND);
	expect_delivered(FAR);
	cr_assert(harness_wait_until(all_ready, NULL, FAULT_LOG_TIMEOUT_MS),
	          "/readyz not 200 after the second server came back");

	/* The bad rows are dead where the operator finds them, with their reason. */
	HARNESS_WAIT(harness_pg_int(g_src[BAD].pg,
	                            "SELECT count(*) FROM %s WHERE attempts >= %d AND"
	                            " last_error LIKE 'body: invalid base64%%'",
	                            g_src[BAD].table, MAX_ATTEMPTS) == N_BAD,
	             FAULT_DELIVERY_TIMEOUT_MS);
	cr_assert_eq(harness_pg_int(g_src[BAD].pg,
	                            "SELECT count(*) FROM %s WHERE attempts >= %d AND"
	                            " last_error LIKE 'body: invalid base64%%'",
	                            g_src[BAD].table, MAX_ATTEMPTS),
	             N_BAD, "the bad rows of source c are not dead with their reason");
	for (int i = 0; i < N_SOURCES; i++)
		lost += count_lost(i);
	cr_assert_eq(lost, 0, "%zu committed rows never delivered", lost);
	check_metrics();
	harness_relay_finish(g_relay, "relay of four sources");
	g_relay = NULL;
	sources_teardown();
}
