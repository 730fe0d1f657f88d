/* outbox_add() checks headers_json and properties_json fully, the way the relay will read them
 * (base/json_scan), and the properties by the rules the relay maps them by
 * (base/message_property): a column the relay could not read or publish is refused before
 * anything is sent, with one line naming the column, the problem and where, instead of a row
 * that dies at publish time; and what the relay reads is taken. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/liboutbox/outbox.h"
#include "tests/support/fixture.h"

static struct outbox_message message(const char *id)
{
	struct outbox_message m = {
		.id = id, .exchange = "orders", .routing_key = "x", .body = "{}", .body_len = 2
	};
	return m;
}

Test(producer_json, columns_the_relay_cannot_read_are_refused, .timeout = 120)
{
	static const struct {
		const char *headers, *properties, *want;
	} bad[] = {
		{ "[1]", NULL,
		  "headers_json must be a JSON object: not a JSON object (at byte 0)" },
		{ "", NULL, "headers_json must be a JSON object: no JSON object (empty text)" },
		{ "{\"a\":1,\"a\":2}", NULL,
		  "headers_json must be a JSON object: duplicate key 'a' (at byte 7)" },
		{ "{\"a\":{\"b\":1,\"b\":1}}", NULL, "duplicate key 'b'" },
		{ "{\"a\":01}", NULL, "number with a leading zero (at byte 5)" },
		{ "{\"a\":9223372036854775808}", NULL, "integer out of the 64-bit range" },
		{ "{\"a\":1e400}", NULL, "number out of range" },
		{ "{\"a\":\"\\ud800\"}", NULL, "high surrogate \\uD800 not followed by a low one" },
		{ "{\"a\":\"\xff\"}", NULL, "invalid UTF-8 in a string" },
		{ "{\"a\":1} {}", NULL, "text after the object (at byte 8)" },
		{ "{\"k\":[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]}", NULL,
		  "headers_json must be a JSON object: nested deeper than 17 levels" },
		{ NULL, "{\"type\":\"a\",}",
		  "properties_json must be a JSON object: a key (a string) "
		  "expected (at byte 12)" },
		{ NULL, "{\"type\":\"a\",\"type\":\"b\"}",
		  "properties_json must be a JSON object: "
		  "duplicate key 'type'" },
	};
	struct fixture t;
	struct outbox_message m;
	char err[512];
	int rc;

	fixture_setup(&t, "pjson", &(struct fixture_options){ .no_consumer = true });
	harness_pg_exec(t.pg, "BEGIN");
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		m = message("bad");
		m.headers_json = bad[i].headers;
		m.properties_json = bad[i].properties;
		err[0] = '\0';
		rc = outbox_add(t.pg, t.table, &m, err, sizeof(err));
		cr_expect_eq(rc, OUTBOX_ERR_INVALID, "%s / %s: %d", bad[i].headers,
		             bad[i].properties, rc);
		cr_expect(strstr(err, bad[i].want), "error '%s', wanted '%s'", err, bad[i].want);
		cr_expect_null(strchr(err, '\n'), "one line: %s", err);
	}
	cr_assert_eq(PQtransactionStatus(t.pg), PQTRANS_INTRANS, "nothing was sent");
	harness_pg_exec(t.pg, "COMMIT");
	cr_expect_eq(harness_pg_int(t.pg, "SELECT count(*) FROM %s", t.table), 0);
	fixture_teardown(&t);
}

Test(producer_json, columns_the_relay_reads_are_taken_as_written, .timeout = 120)
{
	static const char *const good[] = {
		"{}",
		(" {\n\t\"a\" : [1, -2.5e3, true, false, null, {\"b\": \"\\u00e9\\ud83d\\ude00\"}] "
		 "}\r\n"),
		"{\"nul\":\"a\\u0000b\",\"A\":1,\"a\":2}",
		"{\"k\":[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]}", /* the object and 16 levels below */
		"{\"big\":9223372036854775807,\"small\":-9223372036854775808,\"tiny\":1e-400}",
	};
	struct fixture t;
	struct outbox_message m;
	char err[512], id[16];

	fixture_setup(&t, "pjson_ok", &(struct fixture_options){ .no_consumer = true });
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		char *got;
		int rc;

		snprintf(id, sizeof(id), "good-%zu", i);
		m = message(id);
		m.headers_json = good[i];
		rc = outbox_add(t.pg, t.table, &m, err, sizeof(err));
		cr_expect_eq(rc, OUTBOX_ADDED, "%s: %d %s", good[i], rc, err);
		got = harness_pg_string(t.pg, "SELECT headers FROM %s WHERE id = '%s'", t.table,
		                        id);
		cr_expect_str_eq(got ? got : "(no row)", good[i], "stored as written");
		free(got);
	}
	fixture_teardown(&t);
}

/* Each kind of property the relay refuses at publish time (amqp/message_map.c, the row goes
 * dead) is refused at insert time in the relay's words, and the caller's transaction goes on. */
Test(producer_json, properties_the_relay_cannot_set_are_refused, .timeout = 120)
{
	static char long_type[400], long_expiration[400];
	static const struct {
		const char *properties, *want;
	} bad[] = {
		{ "{\"foo\":\"x\"}", "properties_json: unknown property 'foo'" },
		{ "{\"message_id\":\"x\"}", "properties_json: unknown property 'message_id'" },
		{ "{\"Priority\":1}", "properties_json: unknown property 'Priority'" },
		{ "{\"a\\nb\":1}", "properties_json: unknown property 'a?b'" },
		{ "{\"type\":\"t\",\"priority\":1,\"headers\":{}}",
		  "properties_json: unknown property 'headers'" },
		{ "{\"correlation_id\":5}", "properties_json: correlation_id must be a string" },
		{ "{\"reply_to\":true}", "properties_json: reply_to must be a string" },
		{ "{\"app_id\":[\"a\"]}", "properties_json: app_id must be a string" },
		{ long_type, "properties_json: type longer than 255 bytes" },
		{ "{\"expiration\":60000}",
		  "properties_json: expiration must be a string of digits" },
		{ "{\"expiration\":\"-1\"}",
		  "properties_json: expiration must be a string of digits" },
		{ "{\"expiration\":\"\"}",
		  "properties_json: expiration must be a string of digits" },
		{ "{\"expiration\":\"1\\u00002\"}",
		  "properties_json: expiration must be a string of digits" },
		{ long_expiration, "properties_json: expiration longer than 255 bytes" },
		{ "{\"expiration\":\"4294967296\"}",
		  "properties_json: expiration must be at most 4294967295" },
		{ "{\"priority\":12}", "properties_json: priority must be an integer 0-9, got 12" },
		{ "{\"priority\":-1}", "properties_json: priority must be an integer 0-9, got -1" },
		{ "{\"priority\":\"5\"}",
		  "properties_json: priority must be an integer 0-9, got \"5\"" },
		{ "{\"priority\":1.5}",
		  "properties_json: priority must be an integer 0-9, got 1.5" },
		{ "{\"priority\":5e0}",
		  "properties_json: priority must be an integer 0-9, got 5e0" },
		{ "{\"delivery_mode\":3}", "properties_json: delivery_mode must be 1 or 2" },
		{ "{\"delivery_mode\":\"2\"}", "properties_json: delivery_mode must be 1 or 2" },
		{ "{\"delivery_mode\":2.0}", "properties_json: delivery_mode must be 1 or 2" },
		/* the relay parses the whole text first: a JSON error further on is the one said */
		{ "{\"foo\":1,}",
		  "properties_json must be a JSON object: a key (a string) expected (at byte 9)" },
	};
	struct fixture t;
	struct outbox_message m;
	char err[512];
	int rc;

	/* 256 bytes once unescaped, though the text is longer; 256 digits */
	snprintf(long_type, sizeof(long_type), "{\"type\":\"\\u00e9%0254d\"}", 0);
	snprintf(long_expiration, sizeof(long_expiration), "{\"expiration\":\"%0256d\"}", 0);
	fixture_setup(&t, "pprops", &(struct fixture_options){ .no_consumer = true });
	harness_pg_exec(t.pg, "BEGIN");
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		m = message("bad");
		m.properties_json = bad[i].properties;
		err[0] = '\0';
		rc = outbox_add(t.pg, t.table, &m, err, sizeof(err));
		cr_expect_eq(rc, OUTBOX_ERR_INVALID, "%s: %d", bad[i].properties, rc);
		cr_expect_str_eq(err, bad[i].want, "%s", bad[i].properties);
	}
	cr_assert_eq(PQtransactionStatus(t.pg), PQTRANS_INTRANS, "nothing was sent");
	m = message("after");
	rc = outbox_add(t.pg, t.table, &m, err, sizeof(err));
	cr_assert_eq(rc, OUTBOX_ADDED, "the transaction goes on: %d %s", rc, err);
	harness_pg_exec(t.pg, "COMMIT");
	cr_expect_eq(harness_pg_int(t.pg, "SELECT count(*) FROM %s", t.table), 1);
	fixture_teardown(&t);
}

/* Every property the relay sets, at the edges of what it takes, and null for "not set" under
 * any name: taken and stored as written. */
Test(producer_json, properties_the_relay_sets_are_taken_as_written, .timeout = 120)
{
	static char longest[400];
	static const char *const good[] = {
		"{\"correlation_id\":\"c-1\",\"reply_to\":\"r\",\"type\":\"t\",\"app_id\":\"a\","
		"\"user_id\":\"u\",\"content_encoding\":\"gzip\",\"expiration\":\"60000\","
		"\"priority\":0,\"delivery_mode\":2}",
		"{\"priority\":9,\"delivery_mode\":1,\"expiration\":\"0004294967295\"}",
		" { \"priority\" : -0 , \"expiration\" : \"0\" } ",
		"{\"unknown\":null,\"priority\":null,\"type\":\"\"}",
		"{\"\\u0074ype\":\"\\u00e9\\u0000x\\ud83d\\ude00\"}",
		longest,
	};
	struct fixture t;
	struct outbox_message m;
	char err[512], id[16];

	/* 255 bytes once unescaped */
	snprintf(longest, sizeof(longest), "{\"app_id\":\"\\u00e9%0253d\"}", 0);
	fixture_setup(&t, "pprops_ok", &(struct fixture_options){ .no_consumer = true });
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		char *got;
		int rc;

		snprintf(id, sizeof(id), "good-%zu", i);
		m = message(id);
		m.properties_json = good[i];
		rc = outbox_add(t.pg, t.table, &m, err, sizeof(err));
		cr_expect_eq(rc, OUTBOX_ADDED, "%s: %d %s", good[i], rc, err);
		got = harness_pg_string(t.pg, "SELECT properties FROM %s WHERE id = '%s'", t.table,
		                        id);
		cr_expect_str_eq(got ? got : "(no row)", good[i], "stored as written");
		free(got);
	}
	fixture_teardown(&t);
}

/* `enqueue --property`: digits given for priority and delivery_mode go in as numbers (the
 * relay maps them only as integers); other properties stay strings; a value the relay would
 * refuse is refused at once, naming the property. */
Test(producer_json, enqueue_properties_take_the_relay_s_types, .timeout = 120)
{
	struct fixture t;
	struct harness_output o;
	char *got;

	fixture_setup(&t, "pprops_cli", &(struct fixture_options){ .no_consumer = true });
	harness_cli(&o, t.table, NULL, "enqueue", "--exchange", "orders", "--routing-key", "x",
	            "--body", "{}", "--id", "cli-props", "--property", "priority=5", "--property",
	            "delivery_mode=1", "--property", "app_id=7", "--property", "expiration=60000",
	            (char *)NULL);
	cr_assert_eq(o.status, 0, "enqueue exited %d: %s", o.status, o.err);
	harness_output_free(&o);
	got = harness_pg_string(
	        t.pg,
	        "SELECT jsonb_build_object('priority', properties::jsonb->'priority',"
	        " 'delivery_mode', properties::jsonb->'delivery_mode', 'app_id',"
	        " properties::jsonb->'app_id', 'expiration', properties::jsonb->'expiration')::text"
	        " FROM %s WHERE id = 'cli-props'",
	        t.table);
	cr_assert_str_eq(got ? got : "(no row)",
	                 "{\"app_id\": \"7\", \"priority\": 5, \"expiration\": \"60000\","
	                 " \"delivery_mode\": 1}");
	free(got);

	harness_cli(&o, t.table, NULL, "enqueue", "--exchange", "orders", "--routing-key", "x",
	            "--body", "{}", "--id", "cli-props-bad", "--property", "priority=12",
	            (char *)NULL);
	cr_assert_eq(o.status, 2, "enqueue exited %d: %s", o.status, o.err);
	cr_assert(strstr(o.err, "priority must be an integer 0-9, got 12"), "%s", o.err);
	harness_output_free(&o);
	fixture_teardown(&t);
}
