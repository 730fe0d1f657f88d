/* The broker module against the real RabbitMQ (RELAY_TEST_AMQP): what arrives, and the
 * outcome of every row when one of them is unroutable, refused, nacked, invalid or too large
 * for a frame or for the broker's max_message_size. Each test declares its own exchange and
 * queues and deletes them at the end. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_tcp_socket.h>
#include <malloc.h>

#include "amqp/broker.h"
#include "amqp/broker_testing.h"
#include "amqp/message_map.h"
#include "tests/support/amqp_admin.h"
#include "tests/support/fixture.h"

/* ---- a small rabbitmq-c admin/consumer connection for the test itself ---- */

/* Takes the next message from q (NULL when the queue is empty). Caller destroys it. */
static amqp_message_t *get_message(amqp_connection_state_t c, const char *q)
{
	amqp_rpc_reply_t r = amqp_basic_get(c, 1, amqp_cstring_bytes(q), 1);
	amqp_message_t *m;

	cr_assert_eq(r.reply_type, AMQP_RESPONSE_NORMAL, "basic.get failed");
	if (r.reply.id == AMQP_BASIC_GET_EMPTY_METHOD)
		return NULL;
	m = calloc(1, sizeof(*m));
	cr_assert_not_null(m);
	r = amqp_read_message(c, 1, m, 0);
	cr_assert_eq(r.reply_type, AMQP_RESPONSE_NORMAL, "reading a message failed");
	return m;
}

static void drop_message(amqp_message_t *m)
{
	if (m == NULL)
		return;
	amqp_destroy_message(m);
	free(m);
}

static bool bytes_is(amqp_bytes_t b, const char *s)
{
	return b.len == strlen(s) && (b.len == 0 || memcmp(b.bytes, s, b.len) == 0);
}

static const amqp_field_value_t *header(const amqp_basic_properties_t *p, const char *key)
{
	cr_assert(p->_flags & AMQP_BASIC_HEADERS_FLAG, "no headers");
	for (int i = 0; i < p->headers.num_entries; i++) {
		if (bytes_is(p->headers.entries[i].key, key))
			return &p->headers.entries[i].value;
	}
	cr_assert_fail("no header '%s'", key);
	return NULL;
}

/* Drains q and counts the messages whose message_id is id. */
static size_t count_ids(amqp_connection_state_t c, const char *q, const char *const *ids,
                        size_t nids, size_t *counts)
{
	size_t total = 0;
	amqp_message_t *m;

	memset(counts, 0, nids * sizeof(*counts));
	while ((m = get_message(c, q)) != NULL) {
		for (size_t i = 0; i < nids; i++) {
			if (bytes_is(m->properties.message_id, ids[i]))
				counts[i]++;
		}
		total++;
		drop_message(m);
	}
	return total;
}

/* ---- fixture: one direct exchange with queue Q bound to key "k" ---- */

static amqp_connection_state_t admin;
static char exchange[128], queue[128];
static struct broker *b;
static struct broker_options opts;

static void setup(void)
{
	admin = amqp_admin_open();
	harness_unique_name(exchange, sizeof(exchange), "broker_test_ex");
	harness_unique_name(queue, sizeof(queue), "broker_test_q");
	amqp_exchange_declare(admin, 1, amqp_cstring_bytes(exchange), amqp_cstring_bytes("direct"),
	                      0, 0, 0, 0, amqp_empty_table);
	amqp_admin_check(admin, "exchange.declare");
	amqp_admin_queue(admin, queue, exchange, "k", false, amqp_empty_table);

	opts = fixture_broker_options(harness_amqp_url(), 10000, "outbox-relay broker test");
	opts.heartbeat_ms = 30000;
	b = fixture_broker_new(&opts);
	cr_assert_eq(broker_connect(b), BROKER_OK, "connect: %s", broker_errmsg(b));
}

static void teardown(void)
{
	broker_free(b);
	if (admin == NULL)
		return; /* setup failed before connecting: nothing was declared */
	amqp_queue_delete(admin, 1, amqp_cstring_bytes(queue), 0, 0);
	amqp_exchange_delete(admin, 1, amqp_cstring_bytes(exchange), 0);
	amqp_admin_close(admin);
}

static struct outbox_row msg(const char *id, const char *ex, const char *key, const char *body)
{
	struct outbox_row m = {
		.id = id,
		.exchange = ex,
		.routing_key = key,
		.body = body,
		.body_len = strlen(body),
		.body_encoding = "utf-8",
		.content_type = "application/json",
		.headers = "{}",
		.properties = "{}",
		.created_at_s = 1700000000,
	};
	return m;
}

static int publish_confirm(struct outbox_row *m, size_t n, struct broker_result *res)
{
	int rc = broker_publish(b, m, n, res);

	cr_assert_eq(rc, BROKER_OK, "publish: %s", broker_errmsg(b));
	return broker_confirm(b, m, n, res);
}

TestSuite(broker, .init = setup, .fini = teardown, .timeout = 60);

Test(broker, batch_arrives_with_exact_bytes_properties_and_headers)
{
	struct outbox_row m[3] = {
		msg("arrive-1", exchange, "k", "{\"n\":1}"),
		msg("arrive-2", exchange, "k", "AAEC/w=="),
		msg("arrive-3", exchange, "k", "plain text"),
	};
	struct broker_result res[3];
	amqp_message_t *got;
	const amqp_field_value_t *v;

	m[1].body_encoding = "base64";
	m[1].content_type = "application/octet-stream";
	m[2].headers = "{\"s\":\"x\",\"i\":42,\"r\":2.5,\"t\":true,\"n\":null,"
	               "\"o\":{\"p\":\"q\"},\"a\":[1,\"b\"]}";
	m[2].properties = "{\"correlation_id\":\"c-9\",\"reply_to\":\"r\",\"type\":\"t\","
	                  "\"app_id\":\"shop\",\"expiration\":\"60000\",\"priority\":5,"
	                  "\"content_encoding\":\"identity\",\"delivery_mode\":1}";

	cr_assert_eq(publish_confirm(m, 3, res), BROKER_OK, "confirm: %s", broker_errmsg(b));
	for (size_t i = 0; i < 3; i++) {
		cr_assert_eq(res[i].outcome, BROKER_ACKED, "row %zu: %d %s", i, res[i].outcome,
		             res[i].error);
		cr_assert_gt(res[i].confirm_us, 0);
	}

	got = get_message(admin, queue);
	cr_assert_not_null(got);
	cr_assert(bytes_is(got->properties.message_id, "arrive-1"));
	cr_assert(bytes_is(got->body, "{\"n\":1}"));
	cr_assert(bytes_is(got->properties.content_type, "application/json"));
	cr_assert_eq(got->properties.delivery_mode, 2);
	cr_assert_eq(got->properties.timestamp, 1700000000);
	drop_message(got);

	got = get_message(admin, queue);
	cr_assert_not_null(got);
	cr_assert(bytes_is(got->properties.message_id, "arrive-2"));
	cr_assert_eq(got->body.len, 4);
	cr_assert_eq(memcmp(got->body.bytes, "\x00\x01\x02\xff", 4), 0);
	drop_message(got);

	got = get_message(admin, queue);
	cr_assert_not_null(got);
	cr_assert(bytes_is(got->properties.message_id, "arrive-3"));
	cr_assert(bytes_is(got->properties.correlation_id, "c-9"));
	cr_assert(bytes_is(got->properties.reply_to, "r"));
	cr_assert(bytes_is(got->properties.type, "t"));
	cr_assert(bytes_is(got->properties.app_id, "shop"));
	cr_assert(bytes_is(got->properties.expiration, "60000"));
	cr_assert(bytes_is(got->properties.content_encoding, "identity"));
	cr_assert_eq(got->properties.priority, 5);
	cr_assert_eq(got->properties.delivery_mode, 1);
	v = header(&got->properties, "s");
	cr_assert(v->kind == AMQP_FIELD_KIND_UTF8 && bytes_is(v->value.bytes, "x"));
	v = header(&got->properties, "i");
	cr_assert(v->kind == AMQP_FIELD_KIND_I64 && v->value.i64 == 42);
	v = header(&got->properties, "r");
	cr_assert(v->kind == AMQP_FIELD_KIND_F64 && v->value.f64 == 2.5);
	v = header(&got->properties, "t");
	cr_assert(v->kind == AMQP_FIELD_KIND_BOOLEAN && v->value.boolean);
	v = header(&got->properties, "n");
	cr_assert_eq(v->kind, AMQP_FIELD_KIND_VOID);
	v = header(&got->properties, "o");
	cr_assert_eq(v->kind, AMQP_FIELD_KIND_TABLE);
	cr_assert(bytes_is(v->value.table.entries[0].value.value.bytes, "q"));
	v = header(&got->properties, "a");
	cr_assert_eq(v->kind, AMQP_FIELD_KIND_ARRAY);
	cr_assert_eq(v->value.array.num_entries, 2);
	cr_assert_eq(v->value.array.entries[0].value.i64, 1);
	drop_message(got);
	cr_assert_null(get_message(admin, queue), "nothing else arrived");
}

Test(broker, unroutable_row_is_returned_and_the_others_acked)
{
	struct outbox_row m[3] = {
		msg("ret-1", exchange, "k", "a"),
		msg("ret-2", exchange, "nobody", "b"),
		msg("ret-3", exchange, "k", "c"),
	};
	struct broker_result res[3];
	char want[320];
	const char *ids[3] = { "ret-1", "ret-2", "ret-3" };
	size_t counts[3];

	cr_assert_eq(publish_confirm(m, 3, res), BROKER_OK, "confirm: %s", broker_errmsg(b));
	cr_assert_eq(res[0].outcome, BROKER_ACKED);
	cr_assert_eq(res[1].outcome, BROKER_RETURNED);
	snprintf(want, sizeof(want),
	         "unroutable: exchange '%s' routing key 'nobody' has no binding", exchange);
	cr_assert_str_eq(res[1].error, want);
	cr_assert_eq(res[2].outcome, BROKER_ACKED);
	cr_assert_eq(count_ids(admin, queue, ids, 3, counts), 2);
	cr_assert(counts[0] == 1 && counts[1] == 0 && counts[2] == 1);

	/* the late ack of the returned row must not confuse the next batch */
	cr_assert_eq(publish_confirm(m, 1, res), BROKER_OK, "confirm: %s", broker_errmsg(b));
	cr_assert_eq(res[0].outcome, BROKER_ACKED);
}

Test(broker, missing_exchange_is_refused_without_sending)
{
	char nope[128], want[320];
	struct outbox_row m[4];
	struct broker_result res[4];
	const char *ids[4] = { "nx-1", "nx-2", "nx-3", "nx-4" };
	size_t counts[4];

	harness_unique_name(nope, sizeof(nope), "broker_test_nope");
	m[0] = msg("nx-1", exchange, "k", "a");
	m[1] = msg("nx-2", nope, "k", "b");
	m[2] = msg("nx-3", exchange, "k", "c");
	m[3] = msg("nx-4", nope, "k", "d");
	cr_assert_eq(publish_confirm(m, 4, res), BROKER_OK, "confirm: %s", broker_errmsg(b));
	snprintf(want, sizeof(want), "exchange '%s' not found", nope);
	cr_assert_eq(res[0].outcome, BROKER_ACKED);
	cr_assert_eq(res[1].outcome, BROKER_REFUSED);
	cr_assert_str_eq(res[1].error, want);
	cr_assert_eq(res[2].outcome, BROKER_ACKED);
	cr_assert_eq(res[3].outcome, BROKER_REFUSED);
	cr_assert_eq(count_ids(admin, queue, ids, 4, counts), 2);
	cr_assert(counts[0] == 1 && counts[2] == 1);
	cr_assert(broker_connected(b));
}

Test(broker, foreign_user_id_is_refused_and_only_that_row_blamed)
{
	struct outbox_row m[5] = {
		msg("uid-1", exchange, "k", "a"), msg("uid-2", exchange, "k", "b"),
		msg("uid-3", exchange, "k", "c"), msg("uid-4", exchange, "k", "d"),
		msg("uid-5", exchange, "k", "e"),
	};
	struct broker_result res[5];
	const char *ids[5] = { "uid-1", "uid-2", "uid-3", "uid-4", "uid-5" };
	size_t counts[5];
	const struct amqp_connection_info *ci = fixture_amqp_info();
	char want[320];

	snprintf(want, sizeof(want),
	         "PRECONDITION_FAILED - user_id property set to 'somebody-else' but authenticated "
	         "user was '%s'",
	         ci->user);
	m[2].properties = "{\"user_id\":\"somebody-else\"}";
	cr_assert_eq(publish_confirm(m, 5, res), BROKER_OK, "confirm: %s", broker_errmsg(b));
	for (size_t i = 0; i < 5; i++) {
		if (i == 2)
			continue;
		cr_assert_eq(res[i].outcome, BROKER_ACKED, "row %zu: %d %s", i, res[i].outcome,
		             res[i].error);
	}
	cr_assert_eq(res[2].outcome, BROKER_REFUSED);
	cr_assert_str_eq(res[2].error, want);
	count_ids(admin, queue, ids, 5, counts);
	for (size_t i = 0; i < 5; i++)
		cr_assert_eq(counts[i] > 0, i != 2, "row %zu received %zu times", i, counts[i]);

	/* the channel works again for the next batch */
	cr_assert_eq(publish_confirm(m, 2, res), BROKER_OK, "confirm: %s", broker_errmsg(b));
	cr_assert_eq(res[1].outcome, BROKER_ACKED);
}

/* Rows that failed before go last, as a group of their own: when one of them closes the
 * channel again, the rows of the batch that had not failed are already confirmed, so none of
 * them is sent twice, and the row after the culprit is found and delivered once too. */
Test(broker, retried_rows_go_last_and_cost_the_others_no_duplicate)
{
	struct outbox_row m[6] = {
		msg("rt-1", exchange, "k", "a"), msg("rt-2", exchange, "k", "b"),
		msg("rt-3", exchange, "k", "c"), msg("rt-4", exchange, "k", "d"),
		msg("rt-5", exchange, "k", "e"), msg("rt-6", exchange, "k", "f"),
	};
	const char *want_order[] = { "rt-1", "rt-3", "rt-5", "rt-6", "rt-4" };
	struct broker_result res[6];
	amqp_message_t *got;
	size_t k = 0;

	m[1].properties = "{\"user_id\":\"somebody-else\"}";
	m[1].attempts = 1;
	m[3].attempts = 1;
	cr_assert_eq(publish_confirm(m, 6, res), BROKER_OK, "confirm: %s", broker_errmsg(b));
	cr_assert_eq(res[1].outcome, BROKER_REFUSED);
	cr_assert(strstr(res[1].error, "PRECONDITION_FAILED") != NULL, "%s", res[1].error);
	for (size_t i = 0; i < 6; i++) {
		if (i != 1)
			cr_assert_eq(res[i].outcome, BROKER_ACKED, "row %zu: %d %s", i,
			             res[i].outcome, res[i].error);
	}
	/* In the queue: the rows that had not failed, in order, then the retried good one; each
	 * once. */
	while ((got = get_message(admin, queue)) != NULL) {
		cr_assert_lt(k, 5, "more than five messages arrived");
		cr_assert(bytes_is(got->properties.message_id, want_order[k]),
		          "message %zu is %.*s, want %s", k, (int)got->properties.message_id.len,
		          (const char *)got->properties.message_id.bytes, want_order[k]);
		drop_message(got);
		k++;
	}
	cr_assert_eq(k, 5);
}

Test(broker, full_queue_with_reject_publish_nacks)
{
	char full[128];
	struct outbox_row m[3] = {
		msg("nack-1", exchange, "full", "a"),
		msg("nack-2", exchange, "full", "b"),
		msg("nack-3", exchange, "full", "c"),
	};
	struct broker_result res[3];

	harness_unique_name(full, sizeof(full), "broker_test_full");
	amqp_admin_full_queue(admin, full, exchange, "full", 1, false);

	cr_assert_eq(publish_confirm(m, 3, res), BROKER_OK, "confirm: %s", broker_errmsg(b));
	cr_assert_eq(res[0].outcome, BROKER_ACKED);
	for (size_t i = 1; i < 3; i++) {
		cr_assert_eq(res[i].outcome, BROKER_NACKED, "row %zu: %d", i, res[i].outcome);
		cr_assert_str_eq(res[i].error, "nacked by broker");
	}
	amqp_queue_delete(admin, 1, amqp_cstring_bytes(full), 0, 0);
	amqp_admin_check(admin, "queue.delete");
}

Test(broker, invalid_rows_are_not_sent)
{
	struct outbox_row m[4] = {
		msg("inv-1", exchange, "k", "Zm9vYmFyYmF6*A=="),
		msg("inv-2", exchange, "k", "fine"),
		msg("inv-3", exchange, "k", "x"),
		msg("inv-4", exchange, "k", "y"),
	};
	struct broker_result res[4];
	const char *ids[4] = { "inv-1", "inv-2", "inv-3", "inv-4" };
	size_t counts[4];

	m[0].body_encoding = "base64";
	m[2].properties = "{\"priority\":12}";
	m[3].headers = "[]";
	cr_assert_eq(publish_confirm(m, 4, res), BROKER_OK, "confirm: %s", broker_errmsg(b));
	cr_assert_eq(res[0].outcome, BROKER_INVALID);
	cr_assert_str_eq(res[0].error, "body: invalid base64 at offset 12");
	cr_assert_eq(res[1].outcome, BROKER_ACKED);
	cr_assert_eq(res[2].outcome, BROKER_INVALID);
	cr_assert_str_eq(res[2].error, "properties: priority must be an integer 0-9, got 12");
	cr_assert_eq(res[3].outcome, BROKER_INVALID);
	cr_assert_str_eq(res[3].error, "headers: not a JSON object");
	cr_assert_eq(count_ids(admin, queue, ids, 4, counts), 1);
	cr_assert_eq(counts[1], 1);
}

Test(broker, large_batch_is_all_acked)
{
	enum { N = 600 };
	static struct outbox_row m[N];
	static struct broker_result res[N];
	static char ids[N][32];
	amqp_message_t *got;
	size_t n = 0;

	for (size_t i = 0; i < N; i++) {
		snprintf(ids[i], sizeof(ids[i]), "big-%zu", i);
		m[i] = msg(ids[i], exchange, "k", "{\"payload\":\"0123456789abcdef\"}");
	}
	cr_assert_eq(publish_confirm(m, N, res), BROKER_OK, "confirm: %s", broker_errmsg(b));
	for (size_t i = 0; i < N; i++)
		cr_assert_eq(res[i].outcome, BROKER_ACKED, "row %zu: %d", i, res[i].outcome);
	while ((got = get_message(admin, queue)) != NULL) {
		cr_assert(bytes_is(got->properties.message_id, ids[n]), "order kept at %zu", n);
		n++;
		drop_message(got);
	}
	cr_assert_eq(n, N);
}

Test(broker, idle_service_keeps_the_connection)
{
	cr_assert_geq(broker_fd(b), 0);
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(broker_service(b), BROKER_OK, "service: %s", broker_errmsg(b));
		usleep(20000);
	}
	cr_assert(broker_connected(b));
	cr_assert_not(broker_blocked(b));
	broker_disconnect(b);
	cr_assert_not(broker_connected(b));
	cr_assert_eq(broker_fd(b), -1);
	cr_assert_eq(broker_service(b), BROKER_ERR_CONN);
	cr_assert_eq(broker_connect(b), BROKER_OK, "reconnect: %s", broker_errmsg(b));
}

/* ---- rows that can never fit: charged to themselves, never to the connection ---- */

/* A headers object of nkeys keys "hNNN", each holding a string of vlen 'v's. New string. */
static char *big_headers(size_t nkeys, size_t vlen)
{
	size_t cap = 2 + nkeys * (vlen + 16);
	char *s = malloc(cap);
	size_t o = 0;

	cr_assert_not_null(s);
	s[o++] = '{';
	for (size_t k = 0; k < nkeys; k++) {
		o += (size_t)snprintf(s + o, cap - o, "%s\"h%03zu\":\"", k ? "," : "", k);
		memset(s + o, 'v', vlen);
		o += vlen;
		s[o++] = '"';
	}
	s[o++] = '}';
	s[o] = '\0';
	return s;
}

Test(broker, headers_beyond_the_frame_are_invalid_and_the_others_published)
{
	char *big = big_headers(200, 1000);
	struct outbox_row m[3] = {
		msg("hdr-1", exchange, "k", "a"),
		msg("hdr-2", exchange, "k", "b"),
		msg("hdr-3", exchange, "k", "c"),
	};
	struct broker_result res[3];
	const char *ids[3] = { "hdr-1", "hdr-2", "hdr-3" };
	size_t counts[3];

	m[1].headers = big;
	cr_assert_eq(broker_publish(b, m, 3, res), BROKER_OK, "publish: %s", broker_errmsg(b));
	cr_assert_eq(res[1].outcome, BROKER_INVALID, "checked before publishing");
	cr_assert_eq(broker_confirm(b, m, 3, res), BROKER_OK, "confirm: %s", broker_errmsg(b));
	cr_assert_eq(res[0].outcome, BROKER_ACKED);
	cr_assert_eq(res[2].outcome, BROKER_ACKED);
	cr_assert_eq(res[1].outcome, BROKER_INVALID);
	/* 200 entries of 1 + 4 + 1 + 4 + 1000 bytes, the table's length, flags, message_id,
	 * content type, delivery mode, timestamp and the frame's 20 */
	cr_assert_str_eq(res[1].error, "headers: encoded size 202,058 bytes exceeds the "
	                               "131,072-byte frame");
	cr_assert(broker_connected(b), "a row's size is not a connection failure");
	cr_assert_eq(count_ids(admin, queue, ids, 3, counts), 2);
	cr_assert(counts[0] == 1 && counts[2] == 1);
	free(big);
}

/* The size check against rabbitmq-c itself: a content header of exactly frame_max bytes is
 * published (the library would fail one byte more), one byte more is refused up front. */
Test(broker, headers_exactly_at_the_frame_limit_publish_one_byte_more_is_invalid)
{
	struct outbox_row m[2] = {
		msg("edge-fits", exchange, "k", "a"),
		msg("edge-over", exchange, "k", "b"),
	};
	struct broker_result res[2];
	amqp_basic_properties_t p;
	amqp_bytes_t body;
	amqp_pool_t pool;
	char err[320] = "", *fits, *over;
	size_t base, pad;
	amqp_message_t *got;
	const amqp_field_value_t *v;

	/* Calibrate: the frame of a row whose only header is "pad":"" */
	init_amqp_pool(&pool, 4096);
	m[0].headers = "{\"pad\":\"\"}";
	cr_assert_eq(message_map(&m[0], &pool, &p, &body, err, sizeof(err)), MESSAGE_MAP_OK, "%s",
	             err);
	base = message_map_properties_size(&p) + MESSAGE_MAP_HEADER_FRAME_OVERHEAD;
	empty_amqp_pool(&pool);
	cr_assert_lt(base, 131072);
	pad = 131072 - base;
	fits = malloc(pad + 32);
	over = malloc(pad + 32);
	cr_assert(fits != NULL && over != NULL);
	snprintf(fits, pad + 32, "{\"pad\":\"%0*d\"}", (int)pad, 0);
	snprintf(over, pad + 32, "{\"pad\":\"%0*d\"}", (int)pad + 1, 0);
	m[0].headers = fits;
	m[1].headers = over;

	cr_assert_eq(publish_confirm(m, 2, res), BROKER_OK, "confirm: %s", broker_errmsg(b));
	cr_assert_eq(res[0].outcome, BROKER_ACKED, "at the limit: %d %s", res[0].outcome,
	             res[0].error);
	cr_assert_eq(res[1].outcome, BROKER_INVALID);
	cr_assert_str_eq(res[1].error,
	                 "headers: encoded size 131,073 bytes exceeds the 131,072-byte frame");
	got = get_message(admin, queue);
	cr_assert_not_null(got);
	cr_assert(bytes_is(got->properties.message_id, "edge-fits"));
	v = header(&got->properties, "pad");
	cr_assert_eq(v->value.bytes.len, pad);
	drop_message(got);
	cr_assert_null(get_message(admin, queue));
	free(fits);
	free(over);
}

/* A body over the broker's max_message_size (4 MiB in the test broker, RabbitMQ closes the
 * channel with 406): that row is dead with the size and the limit, the others are delivered
 * once each, and the limit is known from then on, so a later such row is refused before it
 * is sent. */
Test(broker, body_over_max_message_size_is_invalid_and_remembered, .timeout = 120)
{
	size_t big_len = 5 * 1024 * 1024;
	char *big = malloc(big_len + 1);
	struct outbox_row m[5] = {
		msg("max-1", exchange, "k", "a"), msg("max-2", exchange, "k", "b"),
		msg("max-3", exchange, "k", "c"), msg("max-4", exchange, "k", "d"),
		msg("max-5", exchange, "k", "e"),
	};
	struct broker_result res[5];
	const char *ids[5] = { "max-1", "max-2", "max-3", "max-4", "max-5" };
	size_t counts[5];

	cr_assert_not_null(big);
	memset(big, 'x', big_len);
	big[big_len] = '\0';
	m[2].body = big;
	m[2].body_len = big_len;
	cr_assert_eq(publish_confirm(m, 5, res), BROKER_OK, "confirm: %s", broker_errmsg(b));
	for (size_t i = 0; i < 5; i++) {
		if (i != 2)
			cr_assert_eq(res[i].outcome, BROKER_ACKED, "row %zu: %d %s", i,
			             res[i].outcome, res[i].error);
	}
	cr_assert_eq(res[2].outcome, BROKER_INVALID, "%d %s", res[2].outcome, res[2].error);
	cr_assert_str_eq(res[2].error, "body: 5,242,880 bytes exceed the broker's "
	                               "max_message_size of 4,194,304 bytes");
	cr_assert_eq(count_ids(admin, queue, ids, 5, counts), 4);
	for (size_t i = 0; i < 5; i++)
		cr_assert_eq(counts[i], i == 2 ? 0 : 1, "row %zu arrived %zu times", i, counts[i]);

	/* The limit is remembered: checked before publishing now. */
	m[2].body_len = 4 * 1024 * 1024 + 1;
	cr_assert_eq(broker_publish(b, &m[1], 2, res), BROKER_OK, "publish: %s", broker_errmsg(b));
	cr_assert_eq(res[1].outcome, BROKER_INVALID);
	cr_assert_str_eq(res[1].error, "body: 4,194,305 bytes exceed the broker's "
	                               "max_message_size of 4,194,304 bytes");
	cr_assert_eq(broker_confirm(b, &m[1], 2, res), BROKER_OK, "confirm: %s", broker_errmsg(b));
	cr_assert_eq(res[0].outcome, BROKER_ACKED);
	free(big);
}

/* When rabbitmq-c itself refuses a row (the frame check is switched off to get there), the
 * row is dead with the library's reason; the connection cannot be used after a half-sent
 * publish, so the call fails and the other rows are left unanswered, uncharged. */
Test(broker, a_row_the_library_cannot_encode_is_invalid_and_the_rest_pending)
{
	char *big = big_headers(200, 1000);
	struct outbox_row m[3] = {
		msg("enc-1", exchange, "k", "a"),
		msg("enc-2", exchange, "k", "b"),
		msg("enc-3", exchange, "k", "c"),
	};
	struct broker_result res[3];

	m[1].headers = big;
	broker_test_skip_frame_check(b, true);
	cr_assert_eq(broker_publish(b, m, 3, res), BROKER_ERR_CONN);
	cr_assert_eq(res[1].outcome, BROKER_INVALID);
	cr_assert_str_eq(res[1].error, "could not encode the message: table too large for buffer");
	cr_assert(res[0].outcome == BROKER_PENDING || res[0].outcome == BROKER_ACKED);
	cr_assert_eq(res[2].outcome, BROKER_PENDING);
	cr_assert(strstr(broker_errmsg(b), "enc-2") != NULL, "%s", broker_errmsg(b));
	cr_assert_not(broker_connected(b));

	broker_test_skip_frame_check(b, false);
	cr_assert_eq(broker_connect(b), BROKER_OK, "reconnect: %s", broker_errmsg(b));
	cr_assert_eq(publish_confirm(m, 3, res), BROKER_OK, "confirm: %s", broker_errmsg(b));
	cr_assert_eq(res[0].outcome, BROKER_ACKED);
	cr_assert_eq(res[1].outcome, BROKER_INVALID);
	cr_assert_eq(res[2].outcome, BROKER_ACKED);
	free(big);
}

/* ---- the smaller defects ---- */

/* A basic.return names its row only by message_id; one that matches no row waiting for an
 * answer (here: the row's id changed under the broker's feet) must fail the batch, not pass
 * as an ack. */
Test(broker, a_return_for_no_row_in_flight_fails_the_batch)
{
	char id[32] = "stray-1";
	struct outbox_row m[1] = { msg(id, exchange, "nobody", "a") };
	struct broker_result res[1];

	cr_assert_eq(broker_publish(b, m, 1, res), BROKER_OK, "publish: %s", broker_errmsg(b));
	snprintf(id, sizeof(id), "renamed");
	cr_assert_eq(broker_confirm(b, m, 1, res), BROKER_ERR_CONN);
	cr_assert_eq(res[0].outcome, BROKER_PENDING);
	cr_assert(strstr(broker_errmsg(b), "matches no row") != NULL, "%s", broker_errmsg(b));
	cr_assert(strstr(broker_errmsg(b), "'stray-1'") != NULL, "%s", broker_errmsg(b));
}

#if defined(__SANITIZE_ADDRESS__)
/* From the sanitizer runtime (its header ships with clang only). */
size_t __sanitizer_get_current_allocated_bytes(void);
#endif

/* Heap in use by the whole process, from the allocator that is in charge of it. */
static size_t heap_in_use(void)
{
#if defined(__SANITIZE_ADDRESS__)
	return __sanitizer_get_current_allocated_bytes();
#else
	struct mallinfo2 mi = mallinfo2();

	return mi.uordblks + mi.hblkhd;
#endif
}

/* Every batch for a missing exchange checks it again (misses are not cached): thousands of
 * checks on one connection must not grow its memory (rabbitmq-c keeps each channel's
 * decoded frames until they are released). */
Test(broker, exchange_checks_keep_memory_flat, .timeout = 300)
{
	char nope[128];
	struct outbox_row m[1];
	struct broker_result res[1];
	size_t before = 0, after;

	harness_unique_name(nope, sizeof(nope), "broker_test_gone");
	m[0] = msg("flat-1", nope, "k", "a");
	for (int i = 0; i < 3300; i++) {
		if (i == 300)
			before = heap_in_use();
		cr_assert_eq(publish_confirm(m, 1, res), BROKER_OK, "confirm: %s",
		             broker_errmsg(b));
		cr_assert_eq(res[0].outcome, BROKER_REFUSED);
	}
	after = heap_in_use();
	cr_assert_lt(after, before + 128 * 1024, "3000 exchange checks grew the heap by %zu bytes",
	             after - before);
	cr_assert(broker_connected(b));
}

Test(broker, expiration_beyond_32_bits_is_invalid)
{
	struct outbox_row m[2] = {
		msg("exp-1", exchange, "k", "a"),
		msg("exp-2", exchange, "k", "b"),
	};
	struct broker_result res[2];

	m[0].properties = "{\"expiration\":\"4294967295\"}";
	m[1].properties = "{\"expiration\":\"4294967296\"}";
	cr_assert_eq(publish_confirm(m, 2, res), BROKER_OK, "confirm: %s", broker_errmsg(b));
	cr_assert_eq(res[0].outcome, BROKER_ACKED, "%d %s", res[0].outcome, res[0].error);
	cr_assert_eq(res[1].outcome, BROKER_INVALID);
	cr_assert_str_eq(res[1].error, "properties: expiration must be at most 4294967295");
}

/* A queue that holds one message and rejects the rest: the broker nacks many rows of one
 * batch (singly or with multiple=true), and every one is reported. */
Test(broker, many_nacks_are_each_reported)
{
	enum { N = 60 };
	static struct outbox_row m[N];
	static struct broker_result res[N];
	static char ids[N][32];
	char full[128];

	harness_unique_name(full, sizeof(full), "broker_test_full");
	amqp_admin_full_queue(admin, full, exchange, "full", 1, false);
	for (size_t i = 0; i < N; i++) {
		snprintf(ids[i], sizeof(ids[i]), "nacks-%zu", i);
		m[i] = msg(ids[i], exchange, "full", "x");
	}
	cr_assert_eq(publish_confirm(m, N, res), BROKER_OK, "confirm: %s", broker_errmsg(b));
	cr_assert_eq(res[0].outcome, BROKER_ACKED);
	for (size_t i = 1; i < N; i++) {
		cr_assert_eq(res[i].outcome, BROKER_NACKED, "row %zu: %d", i, res[i].outcome);
		cr_assert_str_eq(res[i].error, "nacked by broker");
	}
	amqp_queue_delete(admin, 1, amqp_cstring_bytes(full), 0, 0);
	amqp_admin_check(admin, "queue.delete");
}

/* ---- connection failures (no fixture) ---- */

Test(broker_connect, closed_port_fails_with_a_clear_message)
{
	struct broker_options o =
	        fixture_broker_options("amqp://guest:secret@127.0.0.1:1/", 2000, NULL);
	struct broker *x = fixture_broker_new(&o);

	cr_assert_eq(broker_connect(x), BROKER_ERR_CONN);
	cr_assert_str_eq(broker_errmsg(x), "could not connect to 127.0.0.1:1: connection refused");
	cr_assert_not(broker_connected(x));
	broker_free(x);
}

Test(broker_connect, wrong_password_is_a_config_error_without_the_password)
{
	char url[512];
	const struct amqp_connection_info *ci = fixture_amqp_info();
	struct broker_options o;
	struct broker *x;
	char want[128];

	snprintf(url, sizeof(url), "amqp://%s:wrong-Pa55word@%s:%d/", ci->user, ci->host, ci->port);
	o = fixture_broker_options(url, 5000, NULL);
	x = fixture_broker_new(&o);
	cr_assert_eq(broker_connect(x), BROKER_ERR_CONFIG, "got: %s", broker_errmsg(x));
	snprintf(want, sizeof(want), "login refused for user '%s' at %s:%d (ACCESS_REFUSED",
	         ci->user, ci->host, ci->port);
	cr_assert_eq(strncmp(broker_errmsg(x), want, strlen(want)), 0, "got: %s", broker_errmsg(x));
	cr_assert_null(strstr(broker_errmsg(x), "wrong-Pa55word"));
	broker_free(x);
}

Test(broker_connect, bad_url_is_a_config_error)
{
	struct broker_options o = fixture_broker_options("http://nowhere", 1000, NULL);
	struct broker *x = fixture_broker_new(&o);

	cr_assert_eq(broker_connect(x), BROKER_ERR_CONFIG);
	cr_assert_str_eq(broker_errmsg(x),
	                 "invalid amqp.url: does not start with amqp:// or amqps://");
	broker_free(x);
}

Test(broker_connect, missing_vhost_is_a_config_error_naming_the_node)
{
	char url[512], want[256];
	const struct amqp_connection_info *ci = fixture_amqp_info();
	struct broker_options o;
	struct broker *x;

	snprintf(url, sizeof(url), "amqp://%s:%s@%s:%d/no-such-vhost", ci->user, ci->password,
	         ci->host, ci->port);
	o = fixture_broker_options(url, 5000, NULL);
	x = fixture_broker_new(&o);
	cr_assert_eq(broker_connect(x), BROKER_ERR_CONFIG, "got: %s", broker_errmsg(x));
	snprintf(want, sizeof(want),
	         "could not open vhost 'no-such-vhost' as user '%s' at %s:%d (NOT_ALLOWED",
	         ci->user, ci->host, ci->port);
	cr_assert_eq(strncmp(broker_errmsg(x), want, strlen(want)), 0, "got: %s", broker_errmsg(x));
	broker_free(x);
}
