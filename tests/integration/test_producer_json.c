/* outbox_add() checks headers_json and properties_json fully, the way the relay will read them
 * (base/json_scan): a column the relay could not read is refused before anything is sent,
 * with one line naming the column, the problem and where, instead of a row that dies at
 * publish time; and what the relay reads is taken. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/outbox.h"
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
		m.properties_json = good[i];
		rc = outbox_add(t.pg, t.table, &m, err, sizeof(err));
		cr_expect_eq(rc, OUTBOX_ADDED, "%s: %d %s", good[i], rc, err);
		got = harness_pg_string(t.pg, "SELECT headers FROM %s WHERE id = '%s'", t.table,
		                        id);
		cr_expect_str_eq(got ? got : "(no row)", good[i], "stored as written");
		free(got);
	}
	fixture_teardown(&t);
}
