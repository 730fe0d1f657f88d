/* Row -> AMQP mapping: every header JSON type into the field table (nested tables and arrays
 * included), every property, the exact one-line message of every invalid case, and the
 * encoded sizes that decide whether a row fits a frame, checked against rabbitmq-c. The trace
 * context headers and the trace id of a row; and the producer library's JSON check
 * (base/json_scan) refusing exactly the headers the mapping refuses as JSON. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <amqp.h>
#include <amqp_framing.h>

#include "amqp/message_map.h"
#include "base/json_scan.h"

static amqp_pool_t pool;

static void setup(void)
{
	init_amqp_pool(&pool, 4096);
}

static void teardown(void)
{
	empty_amqp_pool(&pool);
}

TestSuite(message_map, .init = setup, .fini = teardown);

static struct outbox_row row(const char *headers, const char *properties)
{
	struct outbox_row m = {
		.id = "id-1",
		.exchange = "orders",
		.routing_key = "order.created",
		.body = "{\"a\":1}",
		.body_len = 7,
		.body_encoding = "utf-8",
		.content_type = "application/json",
		.headers = headers,
		.properties = properties,
		.created_at_s = 1700000000,
	};
	return m;
}

/* Appends s to the NUL-terminated text in buf (n bytes). */
static void append(char *buf, size_t n, const char *s)
{
	size_t len = strlen(buf);

	snprintf(buf + len, n - len, "%s", s);
}

static bool bytes_is(amqp_bytes_t b, const char *s)
{
	return b.len == strlen(s) && (b.len == 0 || memcmp(b.bytes, s, b.len) == 0);
}

static const amqp_field_value_t *entry(const amqp_table_t *t, const char *key)
{
	for (int i = 0; i < t->num_entries; i++) {
		if (bytes_is(t->entries[i].key, key))
			return &t->entries[i].value;
	}
	cr_assert_fail("no header '%s'", key);
	return NULL;
}

static void map_ok(const struct outbox_row *m, amqp_basic_properties_t *p, amqp_bytes_t *b)
{
	char err[320] = "";

	cr_assert_eq(message_map(m, &pool, p, b, err, sizeof(err)), MESSAGE_MAP_OK,
	             "unexpected error: %s", err);
}

static void expect_invalid(const struct outbox_row *m, const char *want)
{
	amqp_basic_properties_t p;
	amqp_bytes_t b = { 12345, NULL };
	char err[320] = "";

	memset(&p, 0xab, sizeof(p));
	cr_assert_eq(message_map(m, &pool, &p, &b, err, sizeof(err)), MESSAGE_MAP_INVALID,
	             "expected '%s'", want);
	cr_assert_str_eq(err, want);
	cr_assert_eq(b.len, 12345, "body written on failure");
	cr_assert_eq(p._flags, (amqp_flags_t)0xabababab, "properties written on failure");
}

Test(message_map, defaults)
{
	struct outbox_row m = row("{}", " { } ");
	amqp_basic_properties_t p;
	amqp_bytes_t b;

	map_ok(&m, &p, &b);
	cr_assert(bytes_is(p.message_id, "id-1"));
	cr_assert(bytes_is(p.content_type, "application/json"));
	cr_assert_eq(p.delivery_mode, 2);
	cr_assert_eq(p.timestamp, 1700000000);
	cr_assert_eq(p._flags, AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
	                               AMQP_BASIC_TIMESTAMP_FLAG | AMQP_BASIC_CONTENT_TYPE_FLAG);
	cr_assert(bytes_is(b, "{\"a\":1}"));
}

Test(message_map, every_header_type)
{
	struct outbox_row m =
	        row("{\"s\":\"text\",\"i\":-9007199254740993,\"r\":1.5,\"t\":true,\"f\":false,"
	            "\"n\":null,"
	            "\"o\":{\"inner\":{\"deep\":\"x\"},\"k\":2},\"a\":[1,\"two\",[3],{\"four\":4}],"
	            "\"e\":[],\"z\":\"nul\\u0000byte\"}",
	            "{}");
	amqp_basic_properties_t p;
	amqp_bytes_t b;
	const amqp_field_value_t *v;

	map_ok(&m, &p, &b);
	cr_assert(p._flags & AMQP_BASIC_HEADERS_FLAG);
	cr_assert_eq(p.headers.num_entries, 10);
	cr_assert(bytes_is(p.headers.entries[0].key, "s"), "insertion order kept");

	v = entry(&p.headers, "s");
	cr_assert_eq(v->kind, AMQP_FIELD_KIND_UTF8);
	cr_assert(bytes_is(v->value.bytes, "text"));
	v = entry(&p.headers, "i");
	cr_assert_eq(v->kind, AMQP_FIELD_KIND_I64);
	cr_assert_eq(v->value.i64, -9007199254740993LL);
	v = entry(&p.headers, "r");
	cr_assert_eq(v->kind, AMQP_FIELD_KIND_F64);
	cr_assert_float_eq(v->value.f64, 1.5, 1e-12);
	v = entry(&p.headers, "t");
	cr_assert_eq(v->kind, AMQP_FIELD_KIND_BOOLEAN);
	cr_assert(v->value.boolean);
	v = entry(&p.headers, "f");
	cr_assert_eq(v->kind, AMQP_FIELD_KIND_BOOLEAN);
	cr_assert_not(v->value.boolean);
	v = entry(&p.headers, "n");
	cr_assert_eq(v->kind, AMQP_FIELD_KIND_VOID);

	v = entry(&p.headers, "o");
	cr_assert_eq(v->kind, AMQP_FIELD_KIND_TABLE);
	cr_assert_eq(v->value.table.num_entries, 2);
	v = entry(&v->value.table, "inner");
	cr_assert_eq(v->kind, AMQP_FIELD_KIND_TABLE);
	v = entry(&v->value.table, "deep");
	cr_assert(bytes_is(v->value.bytes, "x"));

	v = entry(&p.headers, "a");
	cr_assert_eq(v->kind, AMQP_FIELD_KIND_ARRAY);
	cr_assert_eq(v->value.array.num_entries, 4);
	cr_assert_eq(v->value.array.entries[0].kind, AMQP_FIELD_KIND_I64);
	cr_assert_eq(v->value.array.entries[0].value.i64, 1);
	cr_assert_eq(v->value.array.entries[1].kind, AMQP_FIELD_KIND_UTF8);
	cr_assert(bytes_is(v->value.array.entries[1].value.bytes, "two"));
	cr_assert_eq(v->value.array.entries[2].kind, AMQP_FIELD_KIND_ARRAY);
	cr_assert_eq(v->value.array.entries[2].value.array.entries[0].value.i64, 3);
	cr_assert_eq(v->value.array.entries[3].kind, AMQP_FIELD_KIND_TABLE);

	v = entry(&p.headers, "e");
	cr_assert_eq(v->kind, AMQP_FIELD_KIND_ARRAY);
	cr_assert_eq(v->value.array.num_entries, 0);
	v = entry(&p.headers, "z");
	cr_assert_eq(v->value.bytes.len, 8, "NUL bytes kept in a longstr");
}

Test(message_map, every_property)
{
	struct outbox_row m = row(
	        "{}",
	        "{\"correlation_id\":\"c-1\",\"reply_to\":\"replies\",\"type\":\"order.created\","
	        "\"app_id\":\"shop\",\"user_id\":\"guest\",\"expiration\":\"60000\",\"priority\":7,"
	        "\"content_encoding\":\"gzip\",\"delivery_mode\":1}");
	amqp_basic_properties_t p;
	amqp_bytes_t b;

	map_ok(&m, &p, &b);
	cr_assert(bytes_is(p.correlation_id, "c-1"));
	cr_assert(p._flags & AMQP_BASIC_CORRELATION_ID_FLAG);
	cr_assert(bytes_is(p.reply_to, "replies"));
	cr_assert(p._flags & AMQP_BASIC_REPLY_TO_FLAG);
	cr_assert(bytes_is(p.type, "order.created"));
	cr_assert(p._flags & AMQP_BASIC_TYPE_FLAG);
	cr_assert(bytes_is(p.app_id, "shop"));
	cr_assert(p._flags & AMQP_BASIC_APP_ID_FLAG);
	cr_assert(bytes_is(p.user_id, "guest"));
	cr_assert(p._flags & AMQP_BASIC_USER_ID_FLAG);
	cr_assert(bytes_is(p.expiration, "60000"));
	cr_assert(p._flags & AMQP_BASIC_EXPIRATION_FLAG);
	cr_assert_eq(p.priority, 7);
	cr_assert(p._flags & AMQP_BASIC_PRIORITY_FLAG);
	cr_assert(bytes_is(p.content_encoding, "gzip"));
	cr_assert(p._flags & AMQP_BASIC_CONTENT_ENCODING_FLAG);
	cr_assert_eq(p.delivery_mode, 1);
	cr_assert_not(p._flags & AMQP_BASIC_HEADERS_FLAG);
}

Test(message_map, null_property_is_unset)
{
	struct outbox_row m = row("{}", "{\"correlation_id\":null}");
	amqp_basic_properties_t p;
	amqp_bytes_t b;

	map_ok(&m, &p, &b);
	cr_assert_not(p._flags & AMQP_BASIC_CORRELATION_ID_FLAG);
}

Test(message_map, base64_body)
{
	struct outbox_row m = row("{}", "{}");
	amqp_basic_properties_t p;
	amqp_bytes_t b;

	m.body = "AAEC/w==";
	m.body_len = 8;
	m.body_encoding = "base64";
	map_ok(&m, &p, &b);
	cr_assert_eq(b.len, 4);
	cr_assert_eq(memcmp(b.bytes, "\x00\x01\x02\xff", 4), 0);
}

Test(message_map, invalid_body)
{
	struct outbox_row m = row("{}", "{}");

	m.body = "Zm9vYmFyYmF6*A==";
	m.body_len = strlen(m.body);
	m.body_encoding = "base64";
	expect_invalid(&m, "body: invalid base64 at offset 12");
	m.body_encoding = "x";
	expect_invalid(&m, "body_encoding: unknown encoding 'x' (allowed: utf-8, base64)");
	m.body_encoding = "UTF8";
	expect_invalid(&m, "body_encoding: unknown encoding 'UTF8' (allowed: utf-8, base64)");
}

Test(message_map, invalid_headers)
{
	struct outbox_row m = row("[1,2]", "{}");
	char deep[512] = "{\"k\":";
	char longkey[300] = "{\"";

	expect_invalid(&m, "headers: not a JSON object");
	m.headers = "\"text\"";
	expect_invalid(&m, "headers: not a JSON object");
	m.headers = "{\"a\" 1}";
	expect_invalid(&m, "headers: invalid JSON at line 1 column 6: ':' expected near '1'");
	m.headers = "";
	expect_invalid(
	        &m, "headers: invalid JSON at line 1 column 0: unexpected token near end of file");
	m.headers = "{\"a\":1,\"a\":2}";
	expect_invalid(
	        &m, "headers: invalid JSON at line 1 column 10: duplicate object key near '\"a\"'");

	for (int i = 0; i < 17; i++)
		append(deep, sizeof(deep), "[");
	append(deep, sizeof(deep), "1");
	for (int i = 0; i < 17; i++)
		append(deep, sizeof(deep), "]");
	append(deep, sizeof(deep), "}");
	m.headers = deep;
	expect_invalid(&m, "headers: key 'k[0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0]': "
	                   "nested deeper than 16 levels");
	m.headers = "{\"a\":{\"b\":{\"c\":{\"d\":{\"e\":{\"f\":{\"g\":{\"h\":{\"i\":{\"j\":{\"k\":"
	            "{\"l\":{\"m\":{\"n\":{\"o\":{\"p\":{\"q\":{\"r\":1}}}}}}}}}}}}}}}}}}";
	expect_invalid(
	        &m,
	        "headers: key 'a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q': nested deeper than 16 levels");

	memset(longkey + 2, 'k', 129);
	append(longkey, sizeof(longkey), "\":1}");
	m.headers = longkey;
	expect_invalid(&m, "headers: key 'kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk...': "
	                   "longer than 128 bytes");
}

Test(message_map, sixteen_levels_of_nesting_are_fine)
{
	struct outbox_row m = row("{\"k\":[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]}", "{}");
	amqp_basic_properties_t p;
	amqp_bytes_t b;

	map_ok(&m, &p, &b);
	cr_assert_eq(p.headers.entries[0].value.kind, AMQP_FIELD_KIND_ARRAY);
}

Test(message_map, header_key_of_128_bytes_is_fine)
{
	char key[200] = "{\"";
	struct outbox_row m = row(key, "{}");
	amqp_basic_properties_t p;
	amqp_bytes_t b;

	memset(key + 2, 'k', 128);
	append(key, sizeof(key), "\":1}");
	map_ok(&m, &p, &b);
	cr_assert_eq(p.headers.entries[0].key.len, 128);
}

Test(message_map, invalid_properties)
{
	struct outbox_row m = row("{}", "{\"foo\":1}");
	char longstr[320] = "{\"app_id\":\"";

	expect_invalid(&m, "properties: unknown property 'foo'");
	m.properties = "{\"message_id\":\"x\"}";
	expect_invalid(&m, "properties: unknown property 'message_id'");
	m.properties = "[]";
	expect_invalid(&m, "properties: not a JSON object");
	m.properties = "{";
	expect_invalid(&m, "properties: invalid JSON at line 1 column 1: "
	                   "string or '}' expected near end of file");
	m.properties = "{\"priority\":12}";
	expect_invalid(&m, "properties: priority must be an integer 0-9, got 12");
	m.properties = "{\"priority\":-1}";
	expect_invalid(&m, "properties: priority must be an integer 0-9, got -1");
	m.properties = "{\"priority\":\"high\"}";
	expect_invalid(&m, "properties: priority must be an integer 0-9, got \"high\"");
	m.properties = "{\"priority\":1.5}";
	expect_invalid(&m, "properties: priority must be an integer 0-9, got 1.5");
	m.properties = "{\"expiration\":60000}";
	expect_invalid(&m, "properties: expiration must be a string of digits");
	m.properties = "{\"expiration\":\"-1\"}";
	expect_invalid(&m, "properties: expiration must be a string of digits");
	m.properties = "{\"expiration\":\"\"}";
	expect_invalid(&m, "properties: expiration must be a string of digits");
	m.properties = "{\"delivery_mode\":3}";
	expect_invalid(&m, "properties: delivery_mode must be 1 or 2");
	m.properties = "{\"delivery_mode\":\"2\"}";
	expect_invalid(&m, "properties: delivery_mode must be 1 or 2");
	m.properties = "{\"correlation_id\":5}";
	expect_invalid(&m, "properties: correlation_id must be a string");

	memset(longstr + 11, 'a', 256);
	append(longstr, sizeof(longstr), "\"}");
	m.properties = longstr;
	expect_invalid(&m, "properties: app_id longer than 255 bytes");
}

Test(message_map, invalid_columns)
{
	char longname[300];
	struct outbox_row m = row("{}", "{}");

	memset(longname, 'x', 256);
	longname[256] = '\0';
	m.routing_key = longname;
	expect_invalid(&m, "routing_key: longer than 255 bytes");
	m.routing_key = "rk";
	m.exchange = longname;
	expect_invalid(&m, "exchange_name: longer than 255 bytes");
	m.exchange = "";
	m.id = "";
	expect_invalid(&m, "id: empty");
}

Test(message_map, quoted_names_stay_on_one_line)
{
	struct outbox_row m = row("{}", "{\"a\\nb\":1}");

	expect_invalid(&m, "properties: unknown property 'a?b'");
}

Test(message_map, expiration_at_most_32_bits)
{
	struct outbox_row m = row("{}", "{\"expiration\":\"4294967295\"}");
	amqp_basic_properties_t p;
	amqp_bytes_t b;

	map_ok(&m, &p, &b);
	cr_assert(bytes_is(p.expiration, "4294967295"));
	m.properties = "{\"expiration\":\"0004294967295\"}";
	map_ok(&m, &p, &b);
	m.properties = "{\"expiration\":\"0\"}";
	map_ok(&m, &p, &b);
	m.properties = "{\"expiration\":\"4294967296\"}";
	expect_invalid(&m, "properties: expiration must be at most 4294967295");
	m.properties = "{\"expiration\":\"18446744073709551616\"}";
	expect_invalid(&m, "properties: expiration must be at most 4294967295");
	m.properties = "{\"expiration\":\"99999999999999999999999999999999999999999\"}";
	expect_invalid(&m, "properties: expiration must be at most 4294967295");
}

/* message_map_properties_size() against rabbitmq-c's own encoder: the exact size encodes,
 * one byte less does not. */
static void expect_size_matches_library(const struct outbox_row *m)
{
	amqp_basic_properties_t p;
	amqp_bytes_t b, out;
	size_t size;
	char *buf;

	map_ok(m, &p, &b);
	size = message_map_properties_size(&p);
	cr_assert_lt(size, (size_t)1 << 24);
	buf = malloc(size + 64);
	cr_assert_not_null(buf);
	out.bytes = buf;
	out.len = size + 64;
	cr_assert_eq(amqp_encode_properties(AMQP_BASIC_CLASS, &p, out), (int)size,
	             "headers %s properties %s", m->headers, m->properties);
	out.len = size;
	cr_assert_eq(amqp_encode_properties(AMQP_BASIC_CLASS, &p, out), (int)size);
	out.len = size - 1;
	cr_assert_lt(amqp_encode_properties(AMQP_BASIC_CLASS, &p, out), 0);
	free(buf);
}

Test(message_map, encoded_size_is_what_rabbitmq_c_writes)
{
	struct outbox_row m = row("{}", "{}");

	expect_size_matches_library(&m);
	m.headers = "{\"s\":\"text\",\"i\":-9007199254740993,\"r\":1.5,\"t\":true,\"n\":null,"
	            "\"o\":{\"inner\":{\"deep\":\"x\"},\"k\":2},\"a\":[1,\"two\",[3],{\"f\":4}],"
	            "\"e\":[],\"eo\":{},\"z\":\"nul\\u0000byte\"}";
	expect_size_matches_library(&m);
	m.properties =
	        "{\"correlation_id\":\"c-1\",\"reply_to\":\"replies\",\"type\":\"order.created\","
	        "\"app_id\":\"shop\",\"user_id\":\"guest\",\"expiration\":\"60000\",\"priority\":7,"
	        "\"content_encoding\":\"gzip\",\"delivery_mode\":1}";
	expect_size_matches_library(&m);
	m.content_type = "";
	m.headers = "{}";
	expect_size_matches_library(&m);
}

Test(message_map, frame_check_at_the_limit)
{
	struct outbox_row m = row("{\"k\":\"value\"}", "{}");
	amqp_basic_properties_t p;
	amqp_bytes_t b;
	char err[320] = "";
	size_t frame;

	map_ok(&m, &p, &b);
	frame = message_map_properties_size(&p) + MESSAGE_MAP_HEADER_FRAME_OVERHEAD;
	cr_assert_eq(message_map_check_frame(&p, frame, err, sizeof(err)), MESSAGE_MAP_OK, "%s",
	             err);
	cr_assert_eq(message_map_check_frame(&p, frame - 1, err, sizeof(err)), MESSAGE_MAP_INVALID);
	cr_assert_eq(frame, 69, "flags, content type, headers, delivery mode, id, timestamp");
	cr_assert_str_eq(err, "headers: encoded size 69 bytes exceeds the 68-byte frame");
	p._flags &= ~AMQP_BASIC_HEADERS_FLAG;
	cr_assert_eq(message_map_check_frame(&p, 20, err, sizeof(err)), MESSAGE_MAP_INVALID);
	cr_assert_str_eq(err, "properties: encoded size 53 bytes exceeds the 20-byte frame");
}

Test(message_map, body_check_against_max_message_size)
{
	char err[320] = "";

	cr_assert_eq(message_map_check_body(5242880, 0, err, sizeof(err)), MESSAGE_MAP_OK,
	             "no limit known");
	cr_assert_eq(message_map_check_body(4194304, 4194304, err, sizeof(err)), MESSAGE_MAP_OK);
	cr_assert_eq(message_map_check_body(5242880, 4194304, err, sizeof(err)),
	             MESSAGE_MAP_INVALID);
	cr_assert_str_eq(err, "body: 5,242,880 bytes exceed the broker's max_message_size of "
	                      "4,194,304 bytes");
	cr_assert_eq(message_map_check_body(1000, 999, err, sizeof(err)), MESSAGE_MAP_INVALID);
	cr_assert_str_eq(err,
	                 "body: 1,000 bytes exceed the broker's max_message_size of 999 bytes");
}

/* jansson quotes the token it stopped at as it was written, a raw newline included: the
 * error stays one line (found by fuzz_message_map). */
Test(message_map, json_errors_stay_on_one_line)
{
	struct outbox_row m = row("{\"tracep\\\n\n \nccccc\":87", "{}");

	expect_invalid(&m, "headers: invalid JSON at line 2 column 0: invalid escape near "
	                   "'\"tracep\\?'");
}

/* ---- trace context ---- */

#define TP "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
#define TS "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"

Test(message_map, trace_context_headers_are_amqp_strings)
{
	struct outbox_row m = row(
	        "{\"tenant\":\"acme\",\"traceparent\":\"" TP "\",\"tracestate\":\"" TS "\"}", "{}");
	amqp_basic_properties_t p;
	amqp_bytes_t b;
	const amqp_field_value_t *v;

	map_ok(&m, &p, &b);
	cr_assert(p._flags & AMQP_BASIC_HEADERS_FLAG);
	cr_assert_eq(p.headers.num_entries, 3);
	v = entry(&p.headers, "traceparent");
	cr_assert_eq(v->kind, AMQP_FIELD_KIND_UTF8);
	cr_assert(bytes_is(v->value.bytes, TP));
	v = entry(&p.headers, "tracestate");
	cr_assert_eq(v->kind, AMQP_FIELD_KIND_UTF8);
	cr_assert(bytes_is(v->value.bytes, TS));
}

static void expect_trace_id(const char *headers, const char *want)
{
	char id[MESSAGE_MAP_TRACE_ID_SIZE];

	memset(id, 'z', sizeof(id));
	message_map_trace_id(headers, id);
	cr_expect_str_eq(id, want, "headers %s", headers ? headers : "NULL");
}

Test(message_map, trace_id_of_a_row)
{
	const char *id = "0af7651916cd43dd8448eb211c80319c";

	expect_trace_id("{\"traceparent\":\"" TP "\"}", id);
	expect_trace_id("{\"a\":{\"traceparent\":\"x\"},\"traceparent\":\"" TP "\",\"z\":[1]}", id);
	expect_trace_id("{\"TraceParent\":\"" TP "\"}", id); /* any case, as the spec reads */
	/* escaped: the key, and the value's first digit */
	expect_trace_id("{\"trace\\u0070arent\":"
	                "\"\\u00300-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\"}",
	                id);
	/* a later version */
	expect_trace_id("{\"traceparent\":\"cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331"
	                "-01-more\"}",
	                id);
	/* found before a malformed part of the text: the dead row's log line still has it */
	expect_trace_id("{\"traceparent\":\"" TP "\",\"a\":1,\"a\":2", id);
	expect_trace_id("{\"traceparent\":\"" TP "\",", id);
	/* the first valid one */
	expect_trace_id("{\"traceparent\":\"bad\",\"Traceparent\":\"" TP "\"}", id);

	expect_trace_id(NULL, "");
	expect_trace_id("{}", "");
	expect_trace_id(" { } ", "");
	expect_trace_id("{\"tenant\":\"acme\"}", "");
	expect_trace_id("{\"traceparent\":\"00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-"
	                "01\"}",
	                "");
	expect_trace_id("{\"traceparent\":\"00-00000000000000000000000000000000-b7ad6b7169203331-"
	                "01\"}",
	                "");
	expect_trace_id("{\"traceparent\":\"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-"
	                "01\"}",
	                "");
	expect_trace_id("{\"traceparent\":[\"" TP "\"]}", "");
	expect_trace_id("{\"traceparent\":\"" TP "\\u0000\"}", "");
	expect_trace_id("{\"a\":{\"traceparent\":\"" TP "\"}}", ""); /* not a top-level header */
	expect_trace_id("[\"" TP "\"]", "");
	expect_trace_id("{\"a\":1,,\"traceparent\":\"" TP "\"}", ""); /* malformed before it */
	expect_trace_id("not json", "");
}

/* What the producer library checks (jscan_object, 17 levels: the object and 16 below it, as
 * JSON_MAX_DEPTH in store/liboutbox/outbox.c) and what the mapping refuses as JSON agree, so that a row
 * the library took never dies at publish time for its JSON, and the library refuses nothing
 * the relay would publish. */
Test(message_map, the_producer_library_check_agrees)
{
	static const char *const cases[] = {
		"{}",
		"{\"a\":1}",
		"{\"a\":1,\"a\":2}",
		"{\"a\":1,\"\\u0061\":2}",
		"{\"x\":{\"b\":1,\"b\":2}}",
		"{\"a\":\"\\u0000\"}",
		"{\"\\u0000\":1}",
		"{\"a\":\"\\ud83d\\ude00\"}",
		"{\"a\":\"\\ud83d\"}",
		"{\"a\":\"\\ude00\"}",
		"{\"a\":\"\xc3\xa9\"}",
		"{\"a\":\"\xc3\"}",
		"{\"a\":9223372036854775807}",
		"{\"a\":9223372036854775808}",
		"{\"a\":-9223372036854775809}",
		"{\"a\":1.7976931348623157e308}",
		"{\"a\":1e309}",
		"{\"a\":1e-400}",
		"{\"a\":01}",
		"{\"a\":1.}",
		"{\"a\":[1,]}",
		"{\"a\":1,}",
		"{\"a\":1} x",
		"[1]",
		"\"s\"",
		"",
		"{\"k\":[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]}",
		"{\"k\":[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]}",
		"{\"a\":{\"b\":{\"c\":{\"d\":{\"e\":{\"f\":{\"g\":{\"h\":{\"i\":{\"j\":{\"k\":{"
		"\"l\":{"
		"\"m\":{\"n\":{\"o\":{\"p\":{\"q\":1}}}}}}}}}}}}}}}}}",
		"{\"a\":{\"b\":{\"c\":{\"d\":{\"e\":{\"f\":{\"g\":{\"h\":{\"i\":{\"j\":{\"k\":{"
		"\"l\":{"
		"\"m\":{\"n\":{\"o\":{\"p\":{\"q\":{\"r\":1}}}}}}}}}}}}}}}}}}",
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct outbox_row m = row(cases[i], "{}");
		amqp_basic_properties_t p;
		amqp_bytes_t b;
		struct jscan_result res;
		char err[320] = "";
		bool mapped = message_map(&m, &pool, &p, &b, err, sizeof(err)) == MESSAGE_MAP_OK;
		bool scanned =
		        jscan_object(cases[i], strlen(cases[i]), 17, NULL, NULL, &res) == JSCAN_OK;

		cr_expect_eq(scanned, mapped, "%s: the mapping says %s, the library's check %s",
		             cases[i], mapped ? "fine" : err, scanned ? "fine" : res.error);
	}
}
