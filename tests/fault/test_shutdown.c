/* SIGTERM while the relay waits on something that will not answer soon: a broker that blocks
 * publishers, a stalled broker socket (a batch waiting for confirms, and a write that cannot
 * complete), a stalled database, a broker it cannot reach (reconnect backoff, and a connection
 * attempt that hangs), and the one-at-a-time search for the row that closed the channel. Each
 * wait ends at the shutdown deadline: the process exits 0 within relay.shutdown_timeout + 1 s
 * (asserted with room for a loaded machine, far below the 60 s confirm timeout or the 120 s
 * lease a missed wait would take), the log says what ended the wait, and a fresh relay then
 * delivers every committed row. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/fault.h"
#include "tests/support/tcp_proxy.h"

#define SHUTDOWN_TIMEOUT_MS 3000
/* The promise is shutdown_timeout + 1 s; 5 s more for a loaded machine. */
#define EXIT_BOUND_MS (SHUTDOWN_TIMEOUT_MS + 1000 + 5000)
/* Longer than the confirm timeout, so that a wait the deadline missed shows as its real
 * length in the failure rather than as a hang. */
#define EXIT_WAIT_MS 150000
#define MAX_ROWS     30000

/* Every wait that the shutdown deadline does not end lasts a minute or more. */
static const char *const long_waits[] = {
	"OUTBOX_RELAY_SHUTDOWN_TIMEOUT=3s",
	"OUTBOX_AMQP_CONFIRM_TIMEOUT=60s",
	"OUTBOX_RELAY_LEASE=120s",
	NULL,
};

static const char gave_up_broker[] =
        "msg=\"stopping: gave up waiting for the broker, unconfirmed rows released\"";
static const char gave_up_database[] = "msg=\"stopping: gave up on the database\"";

struct sd {
	struct fixture f;
	struct proxy *mq, *db; /* NULL unless the relay under test goes through them */
	char mq_env[256], db_env[768];
	struct harness_relay *relay; /* the relay under test */
};

static void sd_setup(struct sd *t, const char *prefix, bool mq_proxy, bool db_proxy)
{
	memset(t, 0, sizeof(*t));
	fixture_setup(&t->f, prefix, NULL);
	if (mq_proxy) {
		t->mq = proxy_start(harness_amqp_port());
		fault_amqp_env(t->mq_env, sizeof(t->mq_env), proxy_port(t->mq));
	}
	if (db_proxy) {
		t->db = proxy_start(
		        (int)strtol(harness_require_env("RELAY_TEST_PG_PORT"), NULL, 10));
		fault_database_env(t->db_env, sizeof(t->db_env), proxy_port(t->db));
	}
}

static void sd_teardown(struct sd *t)
{
	fixture_teardown(&t->f);
	proxy_stop(t->mq);
	proxy_stop(t->db);
}

static void expect_logged(struct sd *t, const char *needle, const char *when)
{
	if (!harness_relay_wait_log(t->relay, needle, FAULT_LOG_TIMEOUT_MS))
		harness_relay_dump_log(t->relay);
	cr_assert(harness_relay_log_count(t->relay, needle) > 0, "%s: no '%s' line", when, needle);
}

/* Starts the relay under test with the long waits, through the proxies set up, plus extra;
 * returns once it is connected to both servers. */
static void sd_start(struct sd *t, const char *const *extra)
{
	const char *env[32];
	size_t n = 0;

	for (size_t i = 0; long_waits[i]; i++)
		env[n++] = long_waits[i];
	if (t->mq)
		env[n++] = t->mq_env;
	if (t->db)
		env[n++] = t->db_env;
	for (size_t i = 0; extra && extra[i]; i++) {
		cr_assert_lt(n, 31, "too many environment entries");
		env[n++] = extra[i];
	}
	env[n] = NULL;
	t->relay = fault_relay_start(&t->f, env);
	expect_logged(t, "msg=\"connected\" to=database", "start");
	expect_logged(t, "msg=\"connected\" to=broker", "start");
}

/* SIGTERM, then the time until the process is gone: printed, and bounded. */
static void stop_timed(struct sd *t, const char *state)
{
	struct harness_relay *r = t->relay;
	int64_t t0, ms;
	int st;

	cr_assert_not(r->exited, "%s: the relay exited before SIGTERM (status %d)", state,
	              r->status);
	t0 = harness_now_ms();
	cr_assert_eq(kill(r->pid, SIGTERM), 0);
	st = harness_relay_wait(r, EXIT_WAIT_MS);
	ms = harness_now_ms() - t0;
	fprintf(stderr, "shutdown %s: exit after %lld ms\n", state, (long long)ms);
	if (st != 0 || ms > EXIT_BOUND_MS)
		harness_relay_dump_log(r);
	cr_assert_eq(st, 0, "%s: exit status %d (-1: still running %d ms after SIGTERM)", state, st,
	             EXIT_WAIT_MS);
	cr_assert_leq(ms, EXIT_BOUND_MS,
	              "%s: SIGTERM -> exit took %lld ms with relay.shutdown_timeout %d ms", state,
	              (long long)ms, SHUTDOWN_TIMEOUT_MS);
}

/* The first line of r's log holding a and b (b may be NULL); new string, or NULL. */
static char *log_line(const struct harness_relay *r, const char *a, const char *b)
{
	char *log = harness_relay_log(r), *line = log, *found = NULL;

	while (line && *line) {
		char *end = strchr(line, '\n');

		if (end)
			*end = '\0';
		if (strstr(line, a) && (!b || strstr(line, b))) {
			found = strdup(line);
			break;
		}
		line = end ? end + 1 : NULL;
	}
	free(log);
	return found;
}

/* The stop line that says what ended the wait (a), with b in it; printed. */
static void expect_line(struct sd *t, const char *state, const char *a, const char *b)
{
	char *line = log_line(t->relay, a, b);

	if (!line)
		harness_relay_dump_log(t->relay);
	cr_assert_not_null(line, "%s: no log line with '%s' and '%s'", state, a, b ? b : "");
	fprintf(stderr, "shutdown %s: %s\n", state, line);
	free(line);
}

static void expect_no_line(struct sd *t, const char *state, const char *a)
{
	char *line = log_line(t->relay, a, NULL);

	if (line)
		harness_relay_dump_log(t->relay);
	cr_assert_null(line, "%s: unexpected log line: %s", state, line);
}

static int64_t leased(struct sd *t)
{
	return harness_pg_int(t->f.pg,
	                      "SELECT count(*) FROM %s WHERE published_at IS NULL"
	                      " AND locked_by IS NOT NULL",
	                      t->f.table);
}

/* The relay under test reached the database at the end: it handed back every lease. The
 * cursor leases only the rows of its exception path (rows it set aside and publishes one by
 * one): none of those is left leased either. */
static void expect_released(struct sd *t, const char *state)
{
	int64_t n = leased(t);

	if (n != 0)
		harness_relay_dump_log(t->relay);
	cr_assert_eq(n, 0, "%s: %lld rows still leased after the shutdown", state, (long long)n);
}

static void expect_uncharged(struct sd *t, const char *state, const char *prefix)
{
	int64_t n = harness_pg_int(t->f.pg,
	                           "SELECT count(*) FROM %s WHERE id LIKE '%s-%%' AND attempts > 0",
	                           t->f.table, prefix);

	cr_assert_eq(n, 0, "%s: %lld rows were charged an attempt by the shutdown", state,
	             (long long)n);
}

/* Once the relay under test has stopped and the fault is over: a fresh relay with the fault
 * suite's short timings, straight to both servers, delivers rows prefix-0 .. prefix-(n-1).
 * Nothing is killed any more: its lease is long enough for a claim on a loaded machine to
 * leave the margin a batch needs before it is published. Duplicates are allowed: what was in
 * flight may have been routed before the fault. */
static void expect_delivered(struct sd *t, const char *name, const char *prefix, size_t n,
                             const char *const *extra)
{
	const char *env[16] = { "OUTBOX_RELAY_LEASE=30s" };
	size_t lost, k = 1;

	for (size_t i = 0; extra && extra[i]; i++) {
		cr_assert_lt(k, 15, "too many environment entries");
		env[k++] = extra[i];
	}
	env[k] = NULL;
	fault_relay_start(&t->f, env);
	fixture_expect_unique(&t->f, t->f.cons, n, FAULT_DELIVERY_TIMEOUT_MS);
	harness_sleep_ms(500);
	(void)fault_count(&t->f, name, prefix, n, &lost);
	cr_assert_eq(lost, 0, "%s: %zu committed rows never arrived", name, lost);
}

/* ---- 1: a broker that blocks publishers ---- */

static bool alarm_raised;

/* Whatever happened in the test, the next one finds the broker taking publishes. */
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

Test(fault, shutdown_blocked_broker, .timeout = 400, .fini = clear_alarm)
{
	const char *state = "blocked broker";
	struct sd t;

	sd_setup(&t, "sd_blocked", false, false);
	harness_insert_rows(t.f.pg, t.f.table, BLOCKED_ROWS, t.f.exchange, "sd.blocked", "blk",
	                    NULL, NULL);
	alarm_raised = true;
	cr_assert(fault_memory_alarm(true), "rabbitmqctl could not raise the memory alarm");
	sd_start(&t, NULL);
	/* The relay claims the rows and publishes them; the broker blocks its connection, and
	 * the confirms cannot come before the 60 s confirm timeout. The cursor's batch is in no
	 * row: that the broker blocks the connection (it does once the relay publishes) says
	 * enough. */
	if (!harness_source_is_cursor()) {
		HARNESS_WAIT(leased(&t) > 0, 60000);
		cr_assert_gt(leased(&t), 0, "the relay never claimed the rows");
	}
	if (!harness_wait_until(broker_blocks_a_connection, NULL, 60000))
		harness_relay_dump_log(t.relay);
	cr_assert(broker_blocks_a_connection(NULL), "the broker never blocked the relay");
	harness_sleep_ms(500);

	stop_timed(&t, state);
	expect_line(&t, state, gave_up_broker, "shutdown deadline");
	expect_no_line(&t, state, "no confirm from broker within");
	expect_released(&t, state);

	cr_assert(fault_memory_alarm(false), "rabbitmqctl could not clear the memory alarm");
	alarm_raised = false;
	expect_delivered(&t, "shutdown_blocked_broker", "blk", BLOCKED_ROWS, NULL);
	expect_uncharged(&t, state, "blk");
	sd_teardown(&t);
}

/* ---- 2: a stalled broker socket ---- */

Test(fault, shutdown_stalled_broker_waiting_for_confirms, .timeout = 400)
{
	const char *state = "stalled broker, confirm wait";
	struct fault_producer *prod;
	struct sd t;
	size_t n;

	sd_setup(&t, "sd_mqstall", true, false);
	prod = fault_producer_start(&t.f, "mqs", 20, 20, MAX_ROWS);
	sd_start(&t, NULL);
	fixture_expect_unique(&t.f, t.f.cons, 1000, FAULT_DELIVERY_TIMEOUT_MS);
	proxy_stall(t.mq, true);
	/* Rows keep coming: within a moment the relay has published a batch into the stalled
	 * socket and waits for its confirms. */
	harness_sleep_ms(1500);
	/* The cursor's batch is in no row; the stop line below (a confirm wait ended by the
	 * deadline) shows it was in flight. */
	if (!harness_source_is_cursor())
		cr_assert_gt(leased(&t), 0, "no batch in flight");

	stop_timed(&t, state);
	n = fault_producer_stop(prod);
	expect_line(&t, state, gave_up_broker, "shutdown deadline");
	expect_released(&t, state);

	proxy_stall(t.mq, false);
	expect_delivered(&t, "shutdown_stalled_broker", "mqs", n, NULL);
	expect_uncharged(&t, state, "mqs");
	sd_teardown(&t);
}

/* Bytes written on the connection to 127.0.0.1:port that its peer has not acknowledged
 * (tx_queue in /proc/net/tcp; only the relay connects to the proxy), -1 when there is no
 * such connection. */
static long send_queue_to(int port)
{
	FILE *f = fopen("/proc/net/tcp", "r");
	char line[512];
	long most = -1;

	cr_assert_not_null(f, "cannot read /proc/net/tcp");
	while (fgets(line, sizeof(line), f)) {
		unsigned int lport, rport, st;
		unsigned long txq, rxq;

		if (sscanf(line, " %*u: %*x:%x %*x:%x %x %lx:%lx", &lport, &rport, &st, &txq,
		           &rxq) != 5)
			continue;
		if (rport == (unsigned int)port && st == 1 /* ESTABLISHED */ && (long)txq > most)
			most = (long)txq;
	}
	fclose(f);
	return most;
}

/* Far more than the relay's send buffer and the proxy's receive buffer hold together. */
#define BIG_ROWS 500
#define BIG_BODY 100000

static void insert_rows_sized(struct sd *t, const char *prefix, int from, int to, int body)
{
	harness_pg_exec(t->f.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body)"
	                " SELECT '%s-' || lpad(g::text, 7, '0'), '%s', 'sd.big',"
	                " '\"' || repeat('x', %d) || '\"' FROM generate_series(%d, %d) g",
	                t->f.table, prefix, t->f.exchange, body, from, to);
}

Test(fault, shutdown_stalled_broker_blocked_write, .timeout = 400)
{
	const char *state = "stalled broker, blocked write";
	const char *const env[] = { "OUTBOX_RELAY_BATCH_SIZE=1000",
		                    "OUTBOX_RELAY_BATCH_MAX_BYTES=128MiB", NULL };
	long q = -1, last = -2;
	int64_t until;
	struct sd t;

	sd_setup(&t, "sd_mqwrite", true, false);
	sd_start(&t, env);
	/* A few small rows first, so that the exchange is known on this connection and the
	 * large ones go out without a passive declare (which would wait for a read). */
	insert_rows_sized(&t, "big", 0, 9, 10);
	fixture_expect_unique(&t.f, t.f.cons, 10, FAULT_DELIVERY_TIMEOUT_MS);
	/* Confirmed and marked, not only routed: otherwise their confirms could be the bytes the
	 * stall holds back, and the relay would wait for them instead of writing. */
	HARNESS_WAIT(harness_unpublished_count(t.f.pg, t.f.table) == 0, FAULT_LOG_TIMEOUT_MS);
	proxy_stall(t.mq, true);
	insert_rows_sized(&t, "big", 10, 10 + BIG_ROWS - 1, BIG_BODY);
	/* 50 MB into a peer that reads nothing: the relay's write blocks inside rabbitmq-c,
	 * where neither the confirm wait nor a deadline of its own reaches. Wait until the send
	 * queue is full and stays so for a second. */
	until = harness_now_ms() + 60000;
	while (harness_now_ms() < until) {
		harness_sleep_ms(1000);
		q = send_queue_to(proxy_port(t.mq));
		if (q > 1000000 && q == last)
			break;
		last = q;
	}
	fprintf(stderr, "shutdown %s: %ld bytes stuck in the relay's send queue\n", state, q);
	cr_assert(q > 1000000 && q == last, "the relay's writes never blocked (send queue %ld)", q);

	stop_timed(&t, state);
	expect_line(&t, state, gave_up_broker, "publishing");
	expect_released(&t, state);

	proxy_stall(t.mq, false);
	expect_delivered(&t, "shutdown_blocked_write", "big", 10 + BIG_ROWS, NULL);
	expect_uncharged(&t, state, "big");
	sd_teardown(&t);
}

/* ---- 3: a stalled database ---- */

Test(fault, shutdown_stalled_database, .timeout = 400)
{
	const char *state = "stalled database";
	struct fault_producer *prod;
	struct sd t;
	int64_t held;
	size_t n;

	sd_setup(&t, "sd_dbstall", false, true);
	prod = fault_producer_start(&t.f, "dbs", 20, 20, MAX_ROWS);
	sd_start(&t, NULL);
	fixture_expect_unique(&t.f, t.f.cons, 1000, FAULT_DELIVERY_TIMEOUT_MS);
	proxy_stall(t.db, true);
	/* The relay is busy: within a moment it waits for an answer (a claim, a mark) that
	 * the stalled path holds back, for up to relay.lease (120 s). */
	harness_sleep_ms(1500);

	stop_timed(&t, state);
	n = fault_producer_stop(prod);
	expect_line(&t, state, gave_up_database, "shutdown deadline");

	/* Nothing could be released through the stalled path: the rows the relay held come
	 * back when their lease ends. The test ends those leases itself rather than wait
	 * relay.lease (two minutes); a fresh relay then delivers everything. */
	proxy_stall(t.db, false);
	held = harness_pg_int(t.f.pg,
	                      "WITH u AS (UPDATE %s SET locked_until = now()"
	                      " WHERE published_at IS NULL AND locked_by IS NOT NULL RETURNING 1)"
	                      " SELECT count(*) FROM u",
	                      t.f.table);
	fprintf(stderr, "shutdown %s: %lld rows left to their lease\n", state, (long long)held);
	expect_delivered(&t, "shutdown_stalled_database", "dbs", n, NULL);
	expect_uncharged(&t, state, "dbs");
	sd_teardown(&t);
}

/* ---- 4: a broker the relay cannot reach ---- */

#define BACKOFF_ROWS 200

Test(fault, shutdown_in_reconnect_backoff, .timeout = 300)
{
	const char *state = "reconnect backoff";
	const char *const env[] = { "OUTBOX_LOG_LEVEL=debug", NULL };
	struct sd t;

	sd_setup(&t, "sd_backoff", true, false);
	sd_start(&t, env);
	proxy_refuse(t.mq, true);
	proxy_drop_all(t.mq);
	expect_logged(&t, "msg=\"lost connection, will reconnect\" to=broker", state);
	harness_insert_rows(t.f.pg, t.f.table, BACKOFF_ROWS, t.f.exchange, "sd.backoff", "bko",
	                    NULL, NULL);
	/* Each refused attempt doubles the wait before the next (250 ms .. 15 s): after the
	 * third the relay sleeps for seconds. */
	HARNESS_WAIT(harness_relay_log_count(t.relay, "msg=\"could not connect, will retry\""
	                                              " to=broker") >= 3,
	             FAULT_LOG_TIMEOUT_MS);
	cr_assert_geq(harness_relay_log_count(t.relay, "msg=\"could not connect, will retry\""
	                                               " to=broker"),
	              3, "the relay did not retry the broker");

	stop_timed(&t, state);
	expect_line(&t, state, "msg=\"stopping: waiting for outstanding confirms\"", NULL);
	expect_line(&t, state, "msg=\"stopped\"", NULL);
	expect_released(&t, state);

	proxy_refuse(t.mq, false);
	expect_delivered(&t, "shutdown_reconnect_backoff", "bko", BACKOFF_ROWS, NULL);
	expect_uncharged(&t, state, "bko");
	sd_teardown(&t);
}

Test(fault, shutdown_during_connection_attempt, .timeout = 300)
{
	const char *state = "connection attempt";
	struct sd t;
	size_t before;

	sd_setup(&t, "sd_connect", true, false);
	sd_start(&t, NULL);
	/* New connections are accepted but nothing moves: the next attempt hangs in the AMQP
	 * handshake, bounded by min(confirm_timeout, 10 s) of its own. */
	proxy_stall(t.mq, true);
	before = proxy_accepted(t.mq);
	proxy_drop_all(t.mq);
	HARNESS_WAIT(proxy_accepted(t.mq) > before, FAULT_LOG_TIMEOUT_MS);
	cr_assert_gt(proxy_accepted(t.mq), before, "the relay did not try to reconnect");
	harness_insert_rows(t.f.pg, t.f.table, BACKOFF_ROWS, t.f.exchange, "sd.connect", "con",
	                    NULL, NULL);

	stop_timed(&t, state);
	expect_line(&t, state, "msg=\"stopped\"", NULL);
	expect_released(&t, state);

	proxy_stall(t.mq, false);
	expect_delivered(&t, "shutdown_connection_attempt", "con", BACKOFF_ROWS, NULL);
	expect_uncharged(&t, state, "con");
	sd_teardown(&t);
}

/* ---- 5: the search for the row that closed the channel ---- */

/* Good rows behind the one that closes the channel, all in one batch (relay.batch_size is at
 * most 10000): after the close every one of them is published again alone, waiting for its
 * confirm, a few hundred a second on the test machine. */
#define SEARCH_ROWS      3000
#define LONG_SEARCH_ROWS 9999

static void insert_culprit_first(struct sd *t, int n)
{
	harness_pg_exec(t->f.pg,
	                "BEGIN;"
	                " INSERT INTO %s (id, exchange_name, routing_key, body, properties)"
	                " VALUES ('bad-1', '%s', 'sd.search', '{}',"
	                " '{\"user_id\":\"someone-else\"}');"
	                " INSERT INTO %s (id, exchange_name, routing_key, body)"
	                " SELECT 'good-' || lpad(g::text, 7, '0'), '%s', 'sd.search', '{}'"
	                " FROM generate_series(0, %d) g;"
	                " COMMIT",
	                t->f.table, t->f.exchange, t->f.table, t->f.exchange, n - 1);
}

static const char *const search_env[] = { "OUTBOX_RELAY_BATCH_SIZE=10000",
	                                  "OUTBOX_RELAY_MAX_ATTEMPTS=100",
	                                  "OUTBOX_RELAY_RETRY_BACKOFF_MIN=2s",
	                                  "OUTBOX_RELAY_RETRY_BACKOFF_MAX=4s", NULL };
/* The fresh relay that delivers the rest: batches of the default size. */
static const char *const after_search_env[] = { "OUTBOX_RELAY_MAX_ATTEMPTS=100",
	                                        "OUTBOX_RELAY_RETRY_BACKOFF_MIN=2s",
	                                        "OUTBOX_RELAY_RETRY_BACKOFF_MAX=4s", NULL };

static void expect_culprit_charged(struct sd *t, const char *state)
{
	char *err = harness_pg_string(t->f.pg, "SELECT last_error FROM %s WHERE id = 'bad-1'",
	                              t->f.table);

	cr_assert_not_null(err, "%s: the row that closed the channel was not charged", state);
	cr_assert_not_null(strstr(err, "PRECONDITION_FAILED"), "%s: last_error '%s'", state, err);
	free(err);
	expect_uncharged(t, state, "good");
}

/* Deterministic: the broker is stalled while the search is under way (a good row of the
 * batch has arrived, and the culprit has not been reported yet), so SIGTERM finds the search
 * waiting for a confirm that cannot come. */
Test(fault, shutdown_during_culprit_search_stalled, .timeout = 400)
{
	const char *state = "culprit search, stalled";
	struct sd t;
	size_t seen;

	sd_setup(&t, "sd_search", true, false);
	insert_culprit_first(&t, SEARCH_ROWS);
	sd_start(&t, search_env);
	/* Before the search nothing of the batch is routed: the broker closed the channel at
	 * the first row and dropped the rest. */
	fixture_expect_unique(&t.f, t.f.cons, 1, FAULT_DELIVERY_TIMEOUT_MS);
	proxy_stall(t.mq, true);
	harness_sleep_ms(500);
	seen = consumer_unique(t.f.cons);
	fprintf(stderr, "shutdown %s: %zu of %d rows republished when the broker stalled\n", state,
	        seen, SEARCH_ROWS);
	/* The culprit is reported when the search ends: not yet. */
	expect_no_line(&t, state, "msg=\"could not publish, will retry\" id=bad-1");
	cr_assert_lt(seen, SEARCH_ROWS, "the search was over before the broker stalled");

	stop_timed(&t, state);
	expect_line(&t, state, gave_up_broker, "shutdown deadline");
	/* It was found before the search was cut short: charged, and no good row was. */
	expect_line(&t, state, "msg=\"could not publish, will retry\" id=bad-1",
	            "PRECONDITION_FAILED");
	expect_culprit_charged(&t, state);
	expect_released(&t, state);

	proxy_stall(t.mq, false);
	expect_delivered(&t, "shutdown_culprit_search_stalled", "good", SEARCH_ROWS,
	                 after_search_env);
	expect_uncharged(&t, state, "good");
	sd_teardown(&t);
}

/* The broker keeps answering: the search moves on row after row, and SIGTERM lands as the
 * first republished row arrives. The search stops at the deadline between two rows rather
 * than run on to its end (or its own allowance of confirm_timeout). Here the search takes
 * over ten seconds; should a machine confirm ten thousand rows one by one within the
 * three-second deadline, the search ends by itself and only the bound is checked. */
Test(fault, shutdown_during_culprit_search, .timeout = 400)
{
	const char *state = "culprit search";
	struct sd t;
	size_t seen;

	sd_setup(&t, "sd_search2", false, false);
	insert_culprit_first(&t, LONG_SEARCH_ROWS);
	sd_start(&t, search_env);
	fixture_expect_unique(&t.f, t.f.cons, 1, FAULT_DELIVERY_TIMEOUT_MS);

	stop_timed(&t, state);
	harness_sleep_ms(500);
	seen = consumer_unique(t.f.cons);
	fprintf(stderr, "shutdown %s: %zu of %d rows republished before the relay stopped\n", state,
	        seen, LONG_SEARCH_ROWS);
	if (seen < LONG_SEARCH_ROWS)
		expect_line(&t, state, gave_up_broker, "shutdown deadline");
	expect_line(&t, state, "msg=\"could not publish, will retry\" id=bad-1",
	            "PRECONDITION_FAILED");
	expect_culprit_charged(&t, state);
	expect_released(&t, state);

	expect_delivered(&t, "shutdown_culprit_search", "good", LONG_SEARCH_ROWS, after_search_env);
	expect_uncharged(&t, state, "good");
	sd_teardown(&t);
}
