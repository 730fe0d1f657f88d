/* End-to-end acceptance tests of the core relay through its command-line contract: rows
 * committed to a real PostgreSQL arrive at a real RabbitMQ consumer exactly as the mapping
 * says, once each, and the table is left in the documented state. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/liboutbox/outbox.h"
#include "tests/support/fixture.h"
#include "tests/support/tcp_proxy.h"

/* Generous deadlines: the suite runs under ASan on two cores beside other test files. */
#define DELIVERY_TIMEOUT_MS 180000
#define EXIT_TIMEOUT_MS     30000

/* ---- a) 10,000 mixed rows, every field checked ---- */

static const char b64chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static void base64(const unsigned char *in, size_t n, char *out)
{
	size_t o = 0;

	for (size_t i = 0; i < n; i += 3) {
		unsigned v = (unsigned)in[i] << 16;

		if (i + 1 < n)
			v |= (unsigned)in[i + 1] << 8;
		if (i + 2 < n)
			v |= in[i + 2];
		out[o++] = b64chars[(v >> 18) & 63];
		out[o++] = b64chars[(v >> 12) & 63];
		out[o++] = i + 1 < n ? b64chars[(v >> 6) & 63] : '=';
		out[o++] = i + 2 < n ? b64chars[v & 63] : '=';
	}
	out[o] = '\0';
}

/* Deterministic "random" bytes for row i, starting with NUL and holding 0xff. */
static size_t binary_body(size_t i, unsigned char *buf)
{
	size_t n = 1 + i % 61;
	uint32_t x = (uint32_t)i * 2654435761u + 1;

	for (size_t k = 0; k < n; k++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		buf[k] = (unsigned char)x;
	}
	buf[0] = 0;
	if (n > 2)
		buf[n - 1] = 0xff;
	return n;
}

/* The expected message for row i; the generator and the checker share it. */
struct mixed {
	char id[32];
	char routing_key[32];
	char body[256];
	unsigned char bin[64];
	size_t bin_len;
	const char *encoding;
	const char *content_type;
	char headers[512];
	char properties[512];
};

static void mixed_for(size_t i, struct mixed *m)
{
	snprintf(m->id, sizeof(m->id), "mix-%06zu", i);
	snprintf(m->routing_key, sizeof(m->routing_key), "orders.%zu.created", i % 7);
	m->encoding = "utf-8";
	m->bin_len = 0;
	switch (i % 4) {
	case 0:
		snprintf(m->body, sizeof(m->body), "héllo wörld ✓ 日本語 🚀 #%zu", i);
		break;
	case 1:
		m->bin_len = binary_body(i, m->bin);
		base64(m->bin, m->bin_len, m->body);
		m->encoding = "base64";
		break;
	case 2:
		snprintf(m->body, sizeof(m->body), "{\"order\":%zu,\"note\":\"tab\\there\"}", i);
		break;
	default:
		m->body[0] = '\0'; /* an empty body is a valid message too */
		break;
	}
	m->content_type = i % 2 ? "text/plain; charset=utf-8" : NULL;
	snprintf(m->headers, sizeof(m->headers),
	         "{\"s\":\"välue %zu\",\"i\":%lld,\"big\":9007199254740993,\"r\":1.5,"
	         "\"t\":true,\"f\":false,\"n\":null,\"o\":{\"k\":[1,\"two\"],\"deep\":{\"x\":-1}},"
	         "\"a\":[1,2.25,\"s\",null,true,{\"x\":1},[]]}",
	         i, -(long long)i);
	if (i % 3 == 0)
		snprintf(m->properties, sizeof(m->properties),
		         "{\"correlation_id\":\"corr-%zu\",\"reply_to\":\"replies\","
		         "\"type\":\"order.created\",\"app_id\":\"shop\",\"expiration\":\"600000\","
		         "\"priority\":%zu,\"content_encoding\":\"identity\",\"delivery_mode\":1}",
		         i, i % 10);
	else
		snprintf(m->properties, sizeof(m->properties), "{}");
}

static void mixed_row(size_t i, struct outbox_row *row, void *arg)
{
	struct mixed *m = arg;

	mixed_for(i, m);
	row->id = m->id;
	row->routing_key = m->routing_key;
	row->body = m->body;
	row->body_encoding = m->encoding;
	row->content_type = m->content_type;
	row->headers = m->headers;
	row->properties = m->properties;
}

static void expect_prop(const char *got, json_t *props, const char *name, const char *id)
{
	json_t *want = json_object_get(props, name);

	if (want == NULL) {
		cr_assert_null(got, "%s: %s set to '%s' but not given", id, name, got);
		return;
	}
	cr_assert_not_null(got, "%s: %s missing", id, name);
	cr_assert_str_eq(got, json_string_value(want), "%s: %s", id, name);
}

static void check_mixed(size_t i, const struct consumer_msg *msg, const char *exchange,
                        int64_t created_at)
{
	struct mixed m;
	json_t *headers, *props, *v;
	json_error_t jerr;

	mixed_for(i, &m);
	cr_assert_not_null(msg, "%s never arrived", m.id);
	cr_assert_str_eq(msg->message_id, m.id);
	cr_assert_str_eq(msg->exchange, exchange, "%s: exchange", m.id);
	cr_assert_str_eq(msg->routing_key, m.routing_key, "%s: routing key", m.id);
	if (m.bin_len) {
		cr_assert_eq(msg->body_len, m.bin_len, "%s: body length", m.id);
		cr_assert_eq(memcmp(msg->body, m.bin, m.bin_len), 0, "%s: decoded body", m.id);
	} else {
		cr_assert_eq(msg->body_len, strlen(m.body), "%s: body length", m.id);
		cr_assert_eq(memcmp(msg->body, m.body, msg->body_len), 0, "%s: body", m.id);
	}
	cr_assert_str_eq(msg->content_type, m.content_type ? m.content_type : "application/json",
	                 "%s: content type", m.id);
	cr_assert_eq(msg->timestamp, created_at, "%s: timestamp %lld, created_at %lld", m.id,
	             (long long)msg->timestamp, (long long)created_at);

	headers = json_loads(m.headers, 0, &jerr);
	cr_assert_not_null(headers);
	cr_assert_not_null(msg->headers, "%s: no headers", m.id);
	if (!json_equal(msg->headers, headers)) {
		char *got = json_dumps(msg->headers, JSON_SORT_KEYS);

		cr_assert_fail("%s: headers differ: got %s want %s", m.id, got, m.headers);
	}
	json_decref(headers);

	props = json_loads(m.properties, 0, &jerr);
	cr_assert_not_null(props);
	expect_prop(msg->correlation_id, props, "correlation_id", m.id);
	expect_prop(msg->reply_to, props, "reply_to", m.id);
	expect_prop(msg->type, props, "type", m.id);
	expect_prop(msg->app_id, props, "app_id", m.id);
	expect_prop(msg->expiration, props, "expiration", m.id);
	expect_prop(msg->content_encoding, props, "content_encoding", m.id);
	cr_assert_null(msg->user_id, "%s: user_id", m.id);
	v = json_object_get(props, "priority");
	cr_assert_eq(msg->priority, v ? (int)json_integer_value(v) : -1, "%s: priority", m.id);
	v = json_object_get(props, "delivery_mode");
	cr_assert_eq(msg->delivery_mode, v ? (int)json_integer_value(v) : 2, "%s: delivery mode",
	             m.id);
	json_decref(props);
}

Test(relay_e2e, mixed_rows_arrive_exactly_once_and_exact, .timeout = 400)
{
	const size_t n = 10000;
	struct fixture t;
	struct mixed scratch;
	int64_t t0, elapsed;
	PGresult *res;

	fixture_setup(&t, "e2e_mixed", NULL);
	harness_insert_rows(t.pg, t.table, n, t.exchange, NULL, NULL, mixed_row, &scratch);
	t0 = harness_now_ms();
	fixture_relay_start(&t, (const char *const[]){ "OUTBOX_RELAY_POLL_INTERVAL=200ms", NULL });
	fixture_expect_unique(&t, t.cons, n, DELIVERY_TIMEOUT_MS);
	elapsed = harness_now_ms() - t0;
	fprintf(stderr, "relay_e2e: %zu mixed messages relayed in %lld ms (%.0f msg/s)\n", n,
	        (long long)elapsed, elapsed > 0 ? (double)n * 1000.0 / (double)elapsed : 0.0);

	res = PQexec(t.pg, "SELECT 1"); /* keep the connection warm before the long query */
	PQclear(res);
	{
		char sql[256];

		snprintf(sql, sizeof(sql),
		         "SELECT id, floor(extract(epoch FROM created_at))::bigint FROM %s "
		         "ORDER BY id",
		         t.table);
		res = PQexec(t.pg, sql);
	}
	cr_assert_eq(PQresultStatus(res), PGRES_TUPLES_OK, "%s", PQerrorMessage(t.pg));
	cr_assert_eq((size_t)PQntuples(res), n);
	for (int r = 0; r < PQntuples(res); r++) {
		const char *id = PQgetvalue(res, r, 0);
		size_t i = (size_t)strtoull(id + 4, NULL, 10);

		check_mixed(i, consumer_find(t.cons, id), t.exchange,
		            strtoll(PQgetvalue(res, r, 1), NULL, 10));
	}
	PQclear(res);

	/* Marking follows the confirms; give it a moment, then nothing may be left over. */
	HARNESS_WAIT(harness_pg_int(t.pg,
	                            "SELECT count(*) FROM %s WHERE published_at IS NULL "
	                            "OR locked_by IS NOT NULL OR locked_until IS NOT NULL",
	                            t.table) == 0,
	             30000);
	cr_assert_eq(harness_pg_int(t.pg,
	                            "SELECT count(*) FROM %s WHERE published_at IS NULL "
	                            "OR locked_by IS NOT NULL OR locked_until IS NOT NULL",
	                            t.table),
	             0, "rows left unpublished or leased after delivery");
	harness_sleep_ms(1000);
	cr_assert_eq(consumer_duplicates(t.cons), 0, "%zu duplicates", consumer_duplicates(t.cons));
	cr_assert_eq(consumer_unique(t.cons), n);
	fixture_teardown(&t);
}

/* ---- b) outbox_add inside the caller's transaction ---- */

static void add_one(PGconn *c, const char *table, const char *id, const char *exchange, int want)
{
	char err[256] = "";
	struct outbox_message m = {
		.id = id,
		.exchange = exchange,
		.routing_key = "added",
		.body = "{\"added\":true}",
		.body_len = strlen("{\"added\":true}"),
	};
	int rc = outbox_add(c, table, &m, err, sizeof(err));

	cr_assert_eq(rc, want, "outbox_add(%s) returned %d: %s", id, rc, err);
	cr_assert_eq(PQtransactionStatus(c), PQTRANS_INTRANS,
	             "outbox_add must leave the caller's transaction open");
}

Test(relay_e2e, outbox_add_commit_and_rollback, .timeout = 120)
{
	struct fixture t;

	fixture_setup(&t, "e2e_add", NULL);
	fixture_relay_start(&t, (const char *const[]){ "OUTBOX_RELAY_POLL_INTERVAL=200ms", NULL });

	harness_pg_exec(t.pg, "BEGIN");
	add_one(t.pg, t.table, "add-1", t.exchange, OUTBOX_ADDED);
	add_one(t.pg, t.table, "add-1", t.exchange, OUTBOX_DUPLICATE);
	harness_pg_exec(t.pg, "COMMIT");
	cr_assert_eq(harness_pg_int(t.pg, "SELECT count(*) FROM %s", t.table), 1);

	harness_pg_exec(t.pg, "BEGIN");
	add_one(t.pg, t.table, "add-rolled-back", t.exchange, OUTBOX_ADDED);
	harness_pg_exec(t.pg, "ROLLBACK");

	/* A later committed row is the barrier: once it arrived, a rolled-back row that had
	 * leaked would have arrived too (same table, older). */
	harness_pg_exec(t.pg, "BEGIN");
	add_one(t.pg, t.table, "add-2", t.exchange, OUTBOX_ADDED);
	harness_pg_exec(t.pg, "COMMIT");
	fixture_expect_unique(&t, t.cons, 2, 60000);
	harness_sleep_ms(1000);
	cr_assert_eq(consumer_count(t.cons, "add-1"), 1);
	cr_assert_eq(consumer_count(t.cons, "add-2"), 1);
	cr_assert_eq(consumer_count(t.cons, "add-rolled-back"), 0);
	cr_assert_eq(consumer_received(t.cons), 2);
	cr_assert_eq(harness_pg_int(t.pg, "SELECT count(*) FROM %s WHERE id = 'add-rolled-back'",
	                            t.table),
	             0);
	fixture_teardown(&t);
}

/* ---- c) an idle relay wakes up on commit ---- */

Test(relay_e2e, idle_relay_wakes_on_commit, .timeout = 120)
{
	struct fixture t;
	int64_t t0, took;

	fixture_setup(&t, "e2e_wake", NULL);
	/* The warm-up row is there before the relay starts, so its first claim sends it. */
	harness_insert_rows(t.pg, t.table, 1, t.exchange, "wake.warm", "warm", NULL, NULL);
	fixture_relay_start(&t, (const char *const[]){ "OUTBOX_RELAY_POLL_INTERVAL=30s", NULL });
	fixture_expect_unique(&t, t.cons, 1, 60000);
	harness_sleep_ms(2000); /* idle now, waiting up to 30 s for the next poll */

	t0 = harness_now_ms();
	harness_insert_rows(t.pg, t.table, 1, t.exchange, "wake.now", "wake", NULL, NULL);
	/* Well under the 28 s or so that the next poll would take, with room for a loaded
	 * machine: only the notification can deliver it this soon. */
	fixture_expect_unique(&t, t.cons, 2, 15000);
	took = harness_now_ms() - t0;
	fprintf(stderr, "relay_e2e: idle commit-to-consumer %lld ms\n", (long long)took);
	cr_assert_not_null(consumer_find(t.cons, "wake-0000000"));
	fixture_teardown(&t);
}

static bool leased(PGconn *c, const char *table, const char *id)
{
	return harness_pg_int(c,
	                      "SELECT count(*) FROM %s WHERE id = '%s' AND locked_by IS NOT NULL",
	                      table, id) == 1;
}

/* A relay that ran dry takes the wake-up lock, then claims once more (a producer that tested
 * the lock before it was taken does not notify). When that claim finds rows the relay is busy
 * again, and the lock must go with its next claim: while a relay holds it every producer's
 * commit notifies, and those commits queue one behind the other (bench/run saw producers at a
 * third of their rate for as long as a busy relay held it). The first batch's confirms are
 * held back by a stalled proxy, so the relay stays in that batch until the test has looked. */
Test(relay_e2e, a_relay_busy_after_its_last_claim_lets_the_wakeup_lock_go, .timeout = 300)
{
	struct fixture t;
	struct proxy *mq;
	PGconn *look = harness_pg_connect();
	const char *amqp = harness_amqp_url();
	const char *colon = strrchr(amqp, ':');
	char url[256];

	fixture_setup(&t, "e2e_arm", NULL);
	mq = proxy_start(harness_amqp_port());
	cr_assert_not_null(colon);
	snprintf(url, sizeof(url), "OUTBOX_AMQP_URL=%.*s:%d", (int)(colon - amqp), amqp,
	         proxy_port(mq));

	/* The first row makes the relay check the exchange (a broker round trip, which the
	 * stall would hold up) before the rows that matter. */
	harness_insert_rows(t.pg, t.table, 1, t.exchange, "warm", "warm", NULL, NULL);
	/* Inserted before any relay holds the lock: this transaction will not notify. */
	harness_pg_exec(t.pg, "BEGIN");
	add_one(t.pg, t.table, "late-1", t.exchange, OUTBOX_ADDED);
	add_one(t.pg, t.table, "late-2", t.exchange, OUTBOX_ADDED);
	add_one(t.pg, t.table, "late-3", t.exchange, OUTBOX_ADDED);
	fixture_relay_start(&t, (const char *const[]){ url, "OUTBOX_RELAY_POLL_INTERVAL=60s",
	                                               "OUTBOX_RELAY_BATCH_SIZE=1", NULL });
	/* It sends the first row, runs dry and arms: then it waits for the open transaction. */
	fixture_expect_unique(&t, t.cons, 1, DELIVERY_TIMEOUT_MS);
	HARNESS_WAIT(harness_wakeup_holders(look, t.table) == 1, 60000);
	cr_assert_eq(harness_wakeup_holders(look, t.table), 1, "the idle relay never armed");

	proxy_stall(mq, true);
	harness_pg_exec(t.pg, "COMMIT");
	/* The claim after arming takes late-1 and the relay publishes it; the claim that follows
	 * leases late-2 while the relay waits for late-1's confirm. */
	HARNESS_WAIT(leased(look, t.table, "late-2"), 60000);
	cr_assert(leased(look, t.table, "late-2"),
	          "the relay did not claim on after the claim that followed its arming");
	cr_assert_eq(harness_wakeup_holders(look, t.table), 0,
	             "a busy relay still holds the wake-up lock: every commit notifies");

	proxy_stall(mq, false);
	fixture_expect_unique(&t, t.cons, 4, DELIVERY_TIMEOUT_MS);
	/* Dry again, it arms again. */
	HARNESS_WAIT(harness_wakeup_holders(look, t.table) == 1, 60000);
	cr_assert_eq(harness_wakeup_holders(look, t.table), 1, "the relay did not arm once dry");
	PQfinish(look);
	fixture_teardown(&t);
	proxy_stop(mq);
}

/* ---- d) two relays share the work without sending anything twice ---- */

Test(relay_e2e, two_relays_deliver_each_row_once, .timeout = 400)
{
	const size_t n = 10000;
	struct fixture t;

	fixture_setup(&t, "e2e_two", NULL);
	harness_insert_rows(t.pg, t.table, n, t.exchange, "two.relays", "two", NULL, NULL);
	fixture_relay_start(&t, (const char *const[]){ "OUTBOX_RELAY_ID=relay-a",
	                                               "OUTBOX_RELAY_POLL_INTERVAL=200ms",
	                                               "OUTBOX_RELAY_BATCH_SIZE=100", NULL });
	fixture_relay_start(&t, (const char *const[]){ "OUTBOX_RELAY_ID=relay-b",
	                                               "OUTBOX_RELAY_POLL_INTERVAL=200ms",
	                                               "OUTBOX_RELAY_BATCH_SIZE=100", NULL });
	fixture_expect_unique(&t, t.cons, n, DELIVERY_TIMEOUT_MS);
	harness_sleep_ms(1500);
	cr_assert_eq(consumer_unique(t.cons), n);
	cr_assert_eq(consumer_duplicates(t.cons), 0, "%zu messages were sent twice",
	             consumer_duplicates(t.cons));
	HARNESS_WAIT(harness_pg_int(t.pg, "SELECT count(*) FROM %s WHERE published_at IS NULL",
	                            t.table) == 0,
	             30000);
	cr_assert_eq(
	        harness_pg_int(t.pg, "SELECT count(*) FROM %s WHERE published_at IS NULL", t.table),
	        0);
	fixture_teardown(&t);
}

/* ---- e) SIGTERM while busy: exit 0, leases released ---- */

Test(relay_e2e, sigterm_while_busy_releases_leases, .timeout = 300)
{
	const size_t n = 50000;
	struct fixture t;
	int st;
	int64_t left;

	fixture_setup(&t, "e2e_term", NULL);
	harness_insert_rows(t.pg, t.table, n, t.exchange, "term.busy", "term", NULL, NULL);
	fixture_relay_start(&t, (const char *const[]){ "OUTBOX_RELAY_POLL_INTERVAL=200ms", NULL });
	fixture_expect_unique(&t, t.cons, 300, 60000);

	st = harness_relay_stop(t.relays[0], SIGTERM, EXIT_TIMEOUT_MS);
	if (st != 0)
		harness_relay_dump_log(t.relays[0]);
	cr_assert_eq(st, 0, "relay exited with %d after SIGTERM", st);
	left = harness_pg_int(t.pg, "SELECT count(*) FROM %s WHERE published_at IS NULL", t.table);
	fprintf(stderr, "relay_e2e: SIGTERM after %zu deliveries, %lld rows left pending\n",
	        consumer_unique(t.cons), (long long)left);
	cr_assert_gt(left, 0, "the relay finished 50,000 rows before SIGTERM; test is moot");
	cr_assert_eq(harness_pg_int(t.pg,
	                            "SELECT count(*) FROM %s WHERE published_at IS NULL "
	                            "AND locked_by IS NOT NULL",
	                            t.table),
	             0, "unpublished rows still leased after an orderly shutdown");
	cr_assert_eq(harness_pg_int(t.pg, "SELECT count(*) FROM %s WHERE attempts <> 0", t.table),
	             0, "shutdown must not charge attempts");
	fixture_teardown(&t);
}

/* ---- f) retention 0 deletes on confirm ---- */

Test(relay_e2e, retention_zero_empties_the_table, .timeout = 120)
{
	const size_t n = 500;
	struct fixture t;

	fixture_setup(&t, "e2e_ret", NULL);
	harness_insert_rows(t.pg, t.table, n, t.exchange, "ret.zero", "ret", NULL, NULL);
	fixture_relay_start(&t, (const char *const[]){ "OUTBOX_RELAY_RETENTION=0",
	                                               "OUTBOX_RELAY_POLL_INTERVAL=200ms", NULL });
	fixture_expect_unique(&t, t.cons, n, 60000);
	HARNESS_WAIT(harness_pg_int(t.pg, "SELECT count(*) FROM %s", t.table) == 0, 30000);
	cr_assert_eq(harness_pg_int(t.pg, "SELECT count(*) FROM %s", t.table), 0,
	             "published rows kept despite retention 0");
	cr_assert_eq(consumer_duplicates(t.cons), 0);
	fixture_teardown(&t);
}

/* ---- marks that go with the next claim ---- */

static void big_row(size_t i, struct outbox_row *row, void *arg)
{
	static char body[10002];

	(void)i;
	(void)arg;
	if (!body[0]) {
		memset(body, 'x', sizeof(body) - 1);
		body[0] = '"';
		body[sizeof(body) - 2] = '"';
	}
	row->body = body;
}

/* Claims of a few rows (here 7 of a batch of 100: the byte budget's 64 KiB over 10 KB bodies)
 * carry the previous batch's mark in the same statement. Every row is marked (or deleted, with
 * retention 0) all the same, delivered once, and nothing stays leased. The carrying claim is
 * seen in pg_stat_activity, whose query is the last statement of the relay's session: with a
 * backlog, all of its claims but the first carry a mark, and it sends nothing else. (Lean, as
 * no row has an ordering key: "WITH durable", not "WITH RECURSIVE durable".) */
/* Rows not done with: unpublished or leased; with retention 0, any row at all. */
static int64_t left_over(PGconn *c, const char *table, bool delete_rows)
{
	if (delete_rows)
		return harness_pg_int(c, "SELECT count(*) FROM %s", table);
	return harness_pg_int(c,
	                      "SELECT count(*) FROM %s WHERE published_at IS NULL"
	                      " OR locked_by IS NOT NULL",
	                      table);
}

static void marks_ride_with_claims(const char *prefix, bool delete_rows)
{
	const size_t n = 1200;
	int64_t deadline = harness_now_ms() + DELIVERY_TIMEOUT_MS;
	struct fixture t;
	bool carried = false;
	char first[64] = "";

	fixture_setup(&t, prefix, NULL);
	harness_insert_rows(t.pg, t.table, n, t.exchange, "carry", "carry", big_row, NULL);
	fixture_relay_start(&t, (const char *const[]){ "OUTBOX_RELAY_BATCH_SIZE=100",
	                                               "OUTBOX_RELAY_BATCH_MAX_BYTES=64KiB",
	                                               delete_rows ? "OUTBOX_RELAY_RETENTION=0"
	                                                           : "OUTBOX_RELAY_RETENTION=30d",
	                                               NULL });
	/* Two runs of it by one session, not one: preparing it at connect shows its text too. */
	while (!carried && consumer_unique(t.cons) < n && harness_now_ms() < deadline) {
		char *at =
		        harness_pg_string(t.pg,
		                          "SELECT pid || ' ' || query_start FROM pg_stat_activity"
		                          " WHERE application_name LIKE 'outbox-relay worker%%'"
		                          " AND query LIKE 'WITH %%durable AS (%%'"
		                          " AND query LIKE '%%, m AS (%s %s %%'"
		                          " ORDER BY pid LIMIT 1",
		                          delete_rows ? "DELETE FROM" : "UPDATE", t.table);

		if (at && first[0] && strcmp(at, first) != 0)
			carried = true;
		else if (at)
			snprintf(first, sizeof(first), "%s", at);
		free(at);
	}
	fixture_expect_unique(&t, t.cons, n, DELIVERY_TIMEOUT_MS);
	cr_assert(carried, "no claim carried a mark");
	/* The last mark follows the last confirms. */
	HARNESS_WAIT(left_over(t.pg, t.table, delete_rows) == 0, 30000);
	cr_assert_eq(left_over(t.pg, t.table, delete_rows), 0, "%s",
	             delete_rows ? "published rows kept despite retention 0"
	                         : "rows left unpublished or leased after delivery");
	harness_sleep_ms(1000);
	cr_assert_eq(consumer_duplicates(t.cons), 0, "%zu duplicates", consumer_duplicates(t.cons));
	fixture_teardown(&t);
}

Test(relay_e2e, claims_of_a_few_rows_carry_the_mark, .timeout = 300)
{
	marks_ride_with_claims("e2e_carry", false);
}

Test(relay_e2e, claims_of_a_few_rows_carry_the_delete, .timeout = 300)
{
	marks_ride_with_claims("e2e_carry0", true);
}

/* ---- g) schema twice; migrate upgrades an AceMQ table ---- */

static const char *const design_columns[] = {
	"seq",           "id",           "exchange_name", "routing_key",  "body",
	"body_encoding", "content_type", "headers",       "properties",   "ordering_key",
	"txid",          "created_at",   "available_at",  "published_at", "attempts",
	"last_error",    "locked_by",    "locked_until",
};

static int64_t count_columns(PGconn *c, const char *table)
{
	char list[1024] = "";
	size_t off = 0;

	for (size_t i = 0; i < sizeof(design_columns) / sizeof(design_columns[0]); i++) {
		int w = snprintf(list + off, sizeof(list) - off, "%s'%s'", i ? "," : "",
		                 design_columns[i]);

		cr_assert(w > 0 && (size_t)w < sizeof(list) - off);
		off += (size_t)w;
	}
	return harness_pg_int(c,
	                      "SELECT count(*) FROM information_schema.columns WHERE "
	                      "table_schema = current_schema() AND table_name = '%s' AND "
	                      "column_name IN (%s)",
	                      table, list);
}

Test(relay_e2e, schema_applies_twice, .timeout = 60)
{
	struct harness_output o;
	struct fixture t;

	fixture_setup(&t, "e2e_schema",
	              &(struct fixture_options){ .no_migrate = true, .no_consumer = true });
	harness_cli(&o, t.table, NULL, "schema", (const char *)NULL);
	cr_assert_eq(o.status, 0, "schema exited %d: %s", o.status, o.err);
	cr_assert(strstr(o.out, t.table) != NULL, "the DDL does not name the table:\n%s", o.out);
	for (int round = 0; round < 2; round++) {
		PGresult *res = PQexec(t.pg, o.out);

		cr_assert(PQresultStatus(res) == PGRES_COMMAND_OK ||
		                  PQresultStatus(res) == PGRES_TUPLES_OK,
		          "applying the schema (round %d) failed: %s", round + 1,
		          PQerrorMessage(t.pg));
		PQclear(res);
	}
	cr_assert_eq(count_columns(t.pg, t.table), 18, "the table lacks some of DESIGN's columns");
	harness_output_free(&o);
	fixture_teardown(&t);
}

Test(relay_e2e, migrate_upgrades_acemq_table, .timeout = 120)
{
	struct fixture t;

	/* The table is the test's own: an AceMQ one for migrate to upgrade. */
	fixture_setup(&t, "e2e_acemq", &(struct fixture_options){ .no_migrate = true });
	/* The AceMQ SQLOutboxStore layout: DESIGN's columns minus seq, properties,
	 * ordering_key, txid and available_at. */
	harness_pg_exec(t.pg,
	                "CREATE TABLE %s ("
	                " id VARCHAR(64) NOT NULL PRIMARY KEY,"
	                " exchange_name VARCHAR(255) NOT NULL,"
	                " routing_key VARCHAR(255) NOT NULL,"
	                " body TEXT NOT NULL,"
	                " body_encoding VARCHAR(16) NOT NULL DEFAULT 'utf-8',"
	                " content_type VARCHAR(255) NOT NULL DEFAULT 'application/json',"
	                " headers TEXT NOT NULL DEFAULT '{}',"
	                " created_at TIMESTAMPTZ NOT NULL DEFAULT now(),"
	                " published_at TIMESTAMPTZ,"
	                " attempts INTEGER NOT NULL DEFAULT 0,"
	                " last_error VARCHAR(1000),"
	                " locked_by VARCHAR(64),"
	                " locked_until TIMESTAMPTZ)",
	                t.table);
	harness_pg_exec(t.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body, headers, created_at)"
	                " SELECT 'old-' || g, '%s', 'legacy.rk', '{\"legacy\":' || g || '}',"
	                " '{\"h\":\"v\"}', now() - interval '1 hour' + g * interval '1 second'"
	                " FROM generate_series(1, 5) g",
	                t.table, t.exchange);
	harness_pg_exec(t.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body, published_at)"
	                " VALUES ('old-done', '%s', 'legacy.rk', '{}', now())",
	                t.table, t.exchange);
	harness_migrate(t.table);
	harness_migrate(t.table); /* idempotent on the upgraded table too */
	cr_assert_eq(count_columns(t.pg, t.table), 18);
	cr_assert_eq(harness_pg_int(t.pg, "SELECT count(*) FROM %s", t.table), 6,
	             "migrate must keep the rows");

	fixture_relay_start(&t, (const char *const[]){ "OUTBOX_RELAY_POLL_INTERVAL=200ms", NULL });
	fixture_expect_unique(&t, t.cons, 5, 60000);
	harness_sleep_ms(1000);
	cr_assert_eq(consumer_unique(t.cons), 5);
	cr_assert_null(consumer_find(t.cons, "old-done"), "an already published row was resent");
	{
		const struct consumer_msg *m = consumer_find(t.cons, "old-3");
		json_t *want = json_pack("{s:s}", "h", "v");

		cr_assert_not_null(m);
		cr_assert_eq(m->body_len, strlen("{\"legacy\":3}"));
		cr_assert_eq(memcmp(m->body, "{\"legacy\":3}", m->body_len), 0);
		cr_assert_str_eq(m->routing_key, "legacy.rk");
		cr_assert(json_equal(m->headers, want));
		json_decref(want);
	}
	HARNESS_WAIT(harness_pg_int(t.pg, "SELECT count(*) FROM %s WHERE published_at IS NULL",
	                            t.table) == 0,
	             30000);
	cr_assert_eq(
	        harness_pg_int(t.pg, "SELECT count(*) FROM %s WHERE published_at IS NULL", t.table),
	        0);
	fixture_teardown(&t);
}
