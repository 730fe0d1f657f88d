/* Checks the test harness itself against the real servers: the consumer's record of
 * deliveries (properties, headers of every type, duplicates), the TCP proxy's drop, stall
 * and refuse, and the PostgreSQL helpers, so that a failing relay test is the relay's fault;
 * and that a test that fails or is killed leaves none of the processes it started running. */
#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/consumer_assert.h"
#include "tests/support/fixture.h"
#include "tests/support/harness.h"
#include "tests/support/tcp_proxy.h"

/* A publisher connection straight through rabbitmq-c; NULL when it cannot log in. */
static amqp_connection_state_t pub_open(int port)
{
	amqp_connection_state_t conn = amqp_new_connection();
	amqp_socket_t *sock = amqp_tcp_socket_new(conn);
	struct timeval tv = { .tv_sec = 5 };
	amqp_rpc_reply_t r;

	if (sock == NULL || amqp_socket_open_noblock(sock, "127.0.0.1", port, &tv) != 0)
		goto fail;
	r = amqp_login(conn, "/", 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, "guest", "guest");
	if (r.reply_type != AMQP_RESPONSE_NORMAL)
		goto fail;
	amqp_channel_open(conn, 1);
	if (amqp_get_rpc_reply(conn).reply_type != AMQP_RESPONSE_NORMAL)
		goto fail;
	return conn;
fail:
	amqp_destroy_connection(conn);
	return NULL;
}

static int pub_simple(amqp_connection_state_t conn, const char *exchange, const char *rk,
                      const char *id, const char *body)
{
	amqp_basic_properties_t p = { 0 };

	p._flags = AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG;
	p.message_id = amqp_cstring_bytes(id);
	p.delivery_mode = 2;
	return amqp_basic_publish(conn, 1, amqp_cstring_bytes(exchange), amqp_cstring_bytes(rk), 0,
	                          0, &p, amqp_cstring_bytes(body));
}

/* A round trip on the channel: proves the connection is alive and the publishes before it
 * were processed (the broker handles a channel's methods in order). */
static bool pub_sync(amqp_connection_state_t conn)
{
	amqp_basic_qos(conn, 1, 0, 10, 0);
	return amqp_get_rpc_reply(conn).reply_type == AMQP_RESPONSE_NORMAL;
}

Test(harness, unique_names_are_distinct_identifiers)
{
	char a[64], b[64];

	harness_unique_name(a, sizeof(a), "Tbl");
	harness_unique_name(b, sizeof(b), "Tbl");
	cr_assert_str_neq(a, b);
	cr_assert_eq(strncmp(a, "tbl_", 4), 0, "prefix lowercased: %s", a);
	for (const char *p = a; *p; p++)
		cr_assert((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_',
		          "'%c' in %s", *p, a);
}

static void weird_row(size_t i, struct outbox_row *row, void *arg)
{
	(void)arg;
	row->body = i == 0 ? "tab\there\nnew line \\ backslash\r" : "ünïcødé ✓";
	row->headers = "{\"k\": \"v\"}";
	row->ordering_key = i == 1 ? "key-1" : NULL;
}

Test(harness, copy_insert_and_pg_helpers)
{
	struct fixture fx;
	char *s;

	/* A table of the columns harness_insert_rows() writes, not an outbox. */
	fixture_setup(&fx, "hx",
	              &(struct fixture_options){ .no_migrate = true, .no_consumer = true });
	harness_pg_exec(
	        fx.pg,
	        "CREATE TABLE %s (id text PRIMARY KEY, exchange_name text, routing_key text,"
	        " body text, body_encoding text, content_type text, headers text,"
	        " properties text, ordering_key text)",
	        fx.table);
	harness_insert_rows(fx.pg, fx.table, 2, "ex", "rk", "w", weird_row, NULL);
	harness_insert_rows(fx.pg, fx.table, 1000, "ex2", "rk2", "plain", NULL, NULL);
	cr_assert_eq(harness_pg_int(fx.pg, "SELECT count(*) FROM %s", fx.table), 1002);
	s = harness_pg_string(fx.pg, "SELECT body FROM %s WHERE id = 'w-0000000'", fx.table);
	cr_assert_str_eq(s, "tab\there\nnew line \\ backslash\r");
	free(s);
	s = harness_pg_string(fx.pg, "SELECT body FROM %s WHERE id = 'w-0000001'", fx.table);
	cr_assert_str_eq(s, "ünïcødé ✓");
	free(s);
	s = harness_pg_string(fx.pg, "SELECT ordering_key FROM %s WHERE id = 'w-0000000'",
	                      fx.table);
	cr_assert_null(s);
	s = harness_pg_string(fx.pg, "SELECT body FROM %s WHERE id = 'plain-0000999'", fx.table);
	cr_assert_str_eq(s, "{\"n\":999,\"id\":\"plain-0000999\"}");
	free(s);
	cr_assert_eq(harness_pg_int(fx.pg,
	                            "SELECT count(*) FROM %s WHERE exchange_name = 'ex2' "
	                            "AND routing_key = 'rk2' AND properties = '{}'",
	                            fx.table),
	             1000);
	char err[256];
	cr_assert_neq(
	        harness_pg_try_exec(fx.pg, err, sizeof(err), "SELECT * FROM %s_nope", fx.table), 0);
	cr_assert(strstr(err, "does not exist") != NULL, "%s", err);
	fixture_teardown(&fx);
}

Test(harness, consumer_records_properties_headers_and_duplicates)
{
	char ex[64], q[64];
	amqp_connection_state_t conn;
	struct consumer *cons;
	amqp_basic_properties_t p = { 0 };
	amqp_table_entry_t inner[1], entries[8];
	amqp_field_value_t arr[2];
	const struct consumer_msg *m;
	static const char body[] = { 'a', 0, 'b', (char)0xff };
	json_t *want;
	size_t n;
	const char **order, **lost;
	const char *expected[] = { "m-1", "m-2", "m-3" };

	harness_unique_name(ex, sizeof(ex), "hx_ex");
	harness_unique_name(q, sizeof(q), "hx_q");
	cons = consumer_start(harness_amqp_url(), q, ex, "topic", "t.#");
	conn = pub_open(harness_amqp_port());
	cr_assert_not_null(conn);

	inner[0] = (amqp_table_entry_t){ amqp_cstring_bytes("x"),
		                         { .kind = AMQP_FIELD_KIND_I32, .value.i32 = 7 } };
	arr[0] = (amqp_field_value_t){ .kind = AMQP_FIELD_KIND_UTF8,
		                       .value.bytes = amqp_cstring_bytes("a") };
	arr[1] = (amqp_field_value_t){ .kind = AMQP_FIELD_KIND_BOOLEAN, .value.boolean = 0 };
	entries[0] = (amqp_table_entry_t){ amqp_cstring_bytes("s"),
		                           { .kind = AMQP_FIELD_KIND_UTF8,
		                             .value.bytes = amqp_cstring_bytes("str") } };
	entries[1] = (amqp_table_entry_t){ amqp_cstring_bytes("i"),
		                           { .kind = AMQP_FIELD_KIND_I64,
		                             .value.i64 = -9007199254740993LL } };
	entries[2] = (amqp_table_entry_t){ amqp_cstring_bytes("r"),
		                           { .kind = AMQP_FIELD_KIND_F64, .value.f64 = 2.5 } };
	entries[3] =
	        (amqp_table_entry_t){ amqp_cstring_bytes("b"),
		                      { .kind = AMQP_FIELD_KIND_BOOLEAN, .value.boolean = 1 } };
	entries[4] =
	        (amqp_table_entry_t){ amqp_cstring_bytes("n"), { .kind = AMQP_FIELD_KIND_VOID } };
	entries[5] = (amqp_table_entry_t){ amqp_cstring_bytes("o"),
		                           { .kind = AMQP_FIELD_KIND_TABLE,
		                             .value.table = { 1, inner } } };
	entries[6] = (amqp_table_entry_t){ amqp_cstring_bytes("a"),
		                           { .kind = AMQP_FIELD_KIND_ARRAY,
		                             .value.array = { 2, arr } } };
	entries[7] = (amqp_table_entry_t){ amqp_cstring_bytes("t"),
		                           { .kind = AMQP_FIELD_KIND_TIMESTAMP,
		                             .value.u64 = 1700000000 } };
	p._flags = AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_CONTENT_TYPE_FLAG |
	           AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_TIMESTAMP_FLAG |
	           AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_CORRELATION_ID_FLAG |
	           AMQP_BASIC_REPLY_TO_FLAG | AMQP_BASIC_TYPE_FLAG | AMQP_BASIC_APP_ID_FLAG |
	           AMQP_BASIC_EXPIRATION_FLAG | AMQP_BASIC_PRIORITY_FLAG |
	           AMQP_BASIC_CONTENT_ENCODING_FLAG;
	p.message_id = amqp_cstring_bytes("m-1");
	p.content_type = amqp_cstring_bytes("application/octet-stream");
	p.delivery_mode = 1;
	p.timestamp = 1700000001;
	p.headers = (amqp_table_t){ 8, entries };
	p.correlation_id = amqp_cstring_bytes("corr");
	p.reply_to = amqp_cstring_bytes("replies");
	p.type = amqp_cstring_bytes("order.created");
	p.app_id = amqp_cstring_bytes("shop");
	p.expiration = amqp_cstring_bytes("60000");
	p.priority = 5;
	p.content_encoding = amqp_cstring_bytes("gzip");
	cr_assert_eq(amqp_basic_publish(conn, 1, amqp_cstring_bytes(ex), amqp_cstring_bytes("t.1"),
	                                0, 0, &p, (amqp_bytes_t){ sizeof(body), (void *)body }),
	             0);
	cr_assert_eq(pub_simple(conn, ex, "t.2", "m-2", "two"), 0);
	cr_assert_eq(pub_simple(conn, ex, "t.2", "m-2", "two again"), 0);
	cr_assert(pub_sync(conn));
	cr_assert(consumer_wait_unique(cons, 2, 10000), "got %zu", consumer_unique(cons));
	HARNESS_WAIT(consumer_received(cons) >= 3, 30000);

	m = consumer_find(cons, "m-1");
	cr_assert_not_null(m);
	cr_assert_str_eq(m->exchange, ex);
	cr_assert_str_eq(m->routing_key, "t.1");
	cr_assert_eq(m->body_len, sizeof(body));
	cr_assert_eq(memcmp(m->body, body, sizeof(body)), 0);
	cr_assert_str_eq(m->content_type, "application/octet-stream");
	cr_assert_eq(m->delivery_mode, 1);
	cr_assert_eq(m->timestamp, 1700000001);
	cr_assert_str_eq(m->correlation_id, "corr");
	cr_assert_str_eq(m->reply_to, "replies");
	cr_assert_str_eq(m->type, "order.created");
	cr_assert_str_eq(m->app_id, "shop");
	cr_assert_str_eq(m->expiration, "60000");
	cr_assert_eq(m->priority, 5);
	cr_assert_str_eq(m->content_encoding, "gzip");
	cr_assert_null(m->user_id);
	want = json_pack("{s:s, s:I, s:f, s:b, s:n, s:{s:i}, s:[s,b], s:I}", "s", "str", "i",
	                 (json_int_t)-9007199254740993LL, "r", 2.5, "b", 1, "n", "o", "x", 7, "a",
	                 "a", 0, "t", (json_int_t)1700000000);
	cr_assert_not_null(want);
	cr_assert(json_equal(m->headers, want), "headers %s",
	          json_dumps(m->headers, JSON_SORT_KEYS));
	json_decref(want);

	m = consumer_find(cons, "m-2");
	cr_assert_not_null(m);
	cr_assert_str_eq(m->body, "two", "the first delivery is kept");
	cr_assert_null(m->headers);
	cr_assert_eq(m->priority, -1);
	cr_assert_eq(consumer_count(cons, "m-2"), 2);
	cr_assert_eq(consumer_received(cons), 3);
	cr_assert_eq(consumer_unique(cons), 2);
	cr_assert_eq(consumer_duplicates(cons), 1);
	order = consumer_order(cons, &n);
	cr_assert_eq(n, 3);
	cr_assert_str_eq(order[0], "m-1");
	cr_assert_str_eq(order[1], "m-2");
	cr_assert_str_eq(order[2], "m-2");
	free(order);
	lost = consumer_lost(cons, expected, 3, &n);
	cr_assert_eq(n, 1);
	cr_assert_str_eq(lost[0], "m-3");
	free(lost);
	cr_assert_null(consumer_find(cons, "m-3"));

	amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
	amqp_destroy_connection(conn);
	consumer_stop(cons);
}

Test(harness, proxy_forwards_drops_stalls_and_refuses)
{
	char ex[64], q[64], id[32];
	struct proxy *px = proxy_start(harness_amqp_port());
	struct consumer *cons;
	amqp_connection_state_t conn;

	harness_unique_name(ex, sizeof(ex), "hx_ex");
	harness_unique_name(q, sizeof(q), "hx_q");
	cons = consumer_start(harness_amqp_url(), q, ex, "direct", "k");

	/* Forwarding. */
	conn = pub_open(proxy_port(px));
	cr_assert_not_null(conn, "login through the proxy failed");
	HARNESS_WAIT(proxy_live(px) == 1, 2000);
	cr_assert_eq(proxy_live(px), 1);
	cr_assert_eq(pub_simple(conn, ex, "k", "p-1", "via proxy"), 0);
	cr_assert(pub_sync(conn));
	cr_assert(consumer_wait_unique(cons, 1, 10000));

	/* Stall: the publish does not arrive while stalled, and does once resumed. */
	proxy_stall(px, true);
	cr_assert_eq(pub_simple(conn, ex, "k", "p-2", "stalled"), 0);
	harness_sleep_ms(700);
	cr_assert_null(consumer_find(cons, "p-2"), "bytes moved through a stalled proxy");
	cr_assert_eq(proxy_live(px), 1, "stall must keep the connection open");
	proxy_stall(px, false);
	cr_assert(consumer_wait_unique(cons, 2, 10000), "stalled bytes never arrived");
	cr_assert(pub_sync(conn));

	/* Drop: the client's connection is gone at once. */
	proxy_drop_all(px);
	cr_assert_eq(proxy_live(px), 0);
	cr_assert_not(pub_sync(conn), "the connection survived proxy_drop_all");
	amqp_destroy_connection(conn);

	/* Refuse: new connections fail; after refuse(off) they work again. */
	proxy_refuse(px, true);
	conn = pub_open(proxy_port(px));
	cr_assert_null(conn, "a connection got through a refusing proxy");
	proxy_refuse(px, false);
	conn = pub_open(proxy_port(px));
	cr_assert_not_null(conn);
	snprintf(id, sizeof(id), "p-3");
	cr_assert_eq(pub_simple(conn, ex, "k", id, "after refuse"), 0);
	cr_assert(pub_sync(conn));
	cr_assert(consumer_wait_unique(cons, 3, 10000));
	cr_assert_eq(proxy_accepted(px), 2);
	amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
	amqp_destroy_connection(conn);
	consumer_stop(cons);
	proxy_stop(px);
}

Test(harness, consumer_on_default_exchange)
{
	char q[64];
	struct consumer *cons;
	amqp_connection_state_t conn;

	harness_unique_name(q, sizeof(q), "hx_q");
	cons = consumer_start(harness_amqp_url(), q, "", NULL, NULL);
	conn = pub_open(harness_amqp_port());
	cr_assert_not_null(conn);
	cr_assert_eq(pub_simple(conn, "", q, "d-1", "direct to queue"), 0);
	cr_assert(pub_sync(conn));
	cr_assert(consumer_wait_unique(cons, 1, 10000));
	cr_assert_str_eq(consumer_find(cons, "d-1")->exchange, "");
	cr_assert_str_eq(consumer_find(cons, "d-1")->routing_key, q);
	amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
	amqp_destroy_connection(conn);
	consumer_stop(cons);
}

/* ---- a failing test still ends every process it started ---- */

/* These tests run twice. Run by ctest, they run their own executable again, filtered to
 * themselves, with RELAY_TEST_ORPHAN_PROBE naming a table: that second run is the probe. It
 * starts a relay (plus a consumer and a TCP proxy, whose threads must not keep it alive),
 * prints the relay's pid and then fails on purpose, either through cr_assert (criterion ends
 * the worker with exit()) or by SIGKILL of its own worker (a timeout kill: no exit handler
 * runs). The outer run then checks that the relay is gone. It makes itself the subreaper of
 * what it starts, so a process that outlived the probe comes back to it and is killed here,
 * not left behind by this test too. */

#define PROBE_ENV    "RELAY_TEST_ORPHAN_PROBE"
#define PROBE_MARKER "orphan probe: relay pid="

/* The probe's part, on the outer run's fixture: table given, exchange and queue named as
 * fixture_setup() names them. */
static void probe_child(const char *table, bool by_sigkill)
{
	char ex[64], q[64];
	struct harness_relay *r;

	snprintf(ex, sizeof(ex), "%s_ex", table);
	snprintf(q, sizeof(q), "%s_q", table);
	r = harness_relay_start(table, NULL, NULL);
	cr_assert(harness_relay_wait_log(r, "msg=\"connected\" to=broker", 60000),
	          "the probe's relay did not start");
	if (!by_sigkill) {
		(void)consumer_start(harness_amqp_url(), q, ex, "topic", "#");
		(void)proxy_start(harness_amqp_port());
	}
	fprintf(stderr, PROBE_MARKER "%ld\n", (long)r->pid);
	if (by_sigkill)
		raise(SIGKILL);
	cr_assert_fail("failing on purpose with a relay running");
}

/* Whether pid is a live process that still holds table in its environment (the relay's
 * OUTBOX_DATABASE_TABLE): a pid reused by another process does not count. */
static bool relay_alive(pid_t pid, const char *table)
{
	char path[64], want[128], buf[16384];
	size_t n = 0, len;
	FILE *f;

	if (kill(pid, 0) != 0)
		return false;
	snprintf(path, sizeof(path), "/proc/%ld/environ", (long)pid);
	snprintf(want, sizeof(want), "OUTBOX_DATABASE_TABLE=%s", table);
	f = fopen(path, "rb");
	if (f == NULL)
		return false;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	len = strlen(want);
	for (size_t i = 0; i + len <= n; i += strlen(buf + i) + 1) {
		if (strncmp(buf + i, want, len + 1) == 0)
			return true;
	}
	return false;
}

/* Reaps the children that came back to this subreaper once dead; true when none is left
 * running. */
static bool no_children_left(void)
{
	for (;;) {
		pid_t w = waitpid(-1, NULL, WNOHANG);

		if (w > 0)
			continue;
		return w < 0 && errno == ECHILD;
	}
}

static void run_probe(const char *test)
{
	char exe[PATH_MAX], filter[128], e_probe[128], e_pg[1100], e_amqp[600],
	        e_bin[PATH_MAX + 32];
	const char *const env[] = { e_probe, e_pg, e_amqp, e_bin, NULL };
	struct harness_relay *probe;
	struct fixture fx;
	char *log, *mark;
	long pid;
	ssize_t n;
	int st;
	bool alive, leftovers;

	cr_assert_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0, "PR_SET_CHILD_SUBREAPER: %s",
	             strerror(errno));
	/* The probe's relay runs on fx's table, its consumer shares fx's queue: fx's teardown
	 * removes them whatever the probe left. */
	fixture_setup(&fx, "hx_orphan", NULL);
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	cr_assert(n > 0, "readlink /proc/self/exe: %s", strerror(errno));
	exe[n] = '\0';
	snprintf(filter, sizeof(filter), "--filter=harness/%s", test);
	snprintf(e_probe, sizeof(e_probe), PROBE_ENV "=%s", fx.table);
	snprintf(e_pg, sizeof(e_pg), "RELAY_TEST_PG=%s", harness_pg_conninfo());
	snprintf(e_amqp, sizeof(e_amqp), "RELAY_TEST_AMQP=%s", harness_amqp_url());
	snprintf(e_bin, sizeof(e_bin), "RELAY_TEST_BIN=%s", harness_relay_bin());

	probe = harness_program_start(exe, (const char *const[]){ filter, "--jobs=1", NULL }, env,
	                              "orphan-probe");
	st = harness_relay_wait(probe, 180000);
	if (st < 0)
		harness_relay_dump_log(probe);
	cr_assert_geq(st, 0, "the probe run did not end");
	log = harness_relay_log(probe);
	mark = strstr(log, PROBE_MARKER);
	pid = mark ? strtol(mark + strlen(PROBE_MARKER), NULL, 10) : 0;
	if (pid <= 0 || st == 0)
		harness_relay_dump_log(probe);
	free(log);
	cr_assert_gt(pid, 0, "the probe never had its relay running");
	cr_assert_neq(st, 0, "the probe test was meant to fail");
	harness_relay_free(probe);

	/* A relay killed as its parent died comes back here as a zombie and is reaped above;
	 * one still running after this long outlived the failed test. */
	HARNESS_WAIT(!relay_alive((pid_t)pid, fx.table) && no_children_left(), 15000);
	alive = relay_alive((pid_t)pid, fx.table);
	leftovers = !no_children_left();
	if (alive) {
		kill((pid_t)pid, SIGKILL);
		waitpid((pid_t)pid, NULL, 0);
	}
	fixture_teardown(&fx);
	cr_assert_not(alive, "relay %ld (table %s) still runs after its test failed", pid,
	              fx.table);
	cr_assert_not(leftovers, "a process the failed test started is still running");
}

Test(harness, failed_assert_ends_the_processes_it_started, .timeout = 300)
{
	const char *table = getenv(PROBE_ENV);

	if (table != NULL)
		probe_child(table, false);
	else
		run_probe("failed_assert_ends_the_processes_it_started");
}

Test(harness, killed_test_ends_the_processes_it_started, .timeout = 300)
{
	const char *table = getenv(PROBE_ENV);

	if (table != NULL)
		probe_child(table, true);
	else
		run_probe("killed_test_ends_the_processes_it_started");
}

/* The kernel sends PR_SET_PDEATHSIG when the thread that forked exits, not the process: a
 * process started on a thread that ends early must still run (the harness forks on a thread
 * of its own). A failure to start would fail the test from this thread, which criterion
 * reports as a crash: still a failure. */
static void *start_sleep(void *arg)
{
	struct harness_relay *r;

	(void)arg;
	r = harness_program_start("/bin/sleep", (const char *const[]){ "300", NULL }, NULL,
	                          "sleep");
	/* Long enough for the child to have asked for the signal before this thread ends. */
	harness_sleep_ms(500);
	return r;
}

Test(harness, a_process_outlives_the_thread_that_started_it, .timeout = 60)
{
	struct harness_relay *r = NULL;
	pthread_t t;

	cr_assert_eq(pthread_create(&t, NULL, start_sleep, NULL), 0);
	cr_assert_eq(pthread_join(t, (void **)&r), 0);
	cr_assert_not_null(r);
	harness_sleep_ms(1000);
	cr_assert_eq(harness_relay_wait(r, 0), -1,
	             "the process ended with its starting thread (status %d)", r->status);
	cr_assert_eq(harness_relay_stop(r, SIGTERM, 30000), 128 + SIGTERM);
	harness_relay_free(r);
}
