/* outbox_add() against a real PostgreSQL (RELAY_TEST_PG): duplicates, rollbacks, the
 * caller's transaction left open, body encodings, delays and what is refused before the
 * INSERT is sent. Each test uses its own table. */
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libpq-fe.h>

#include "store/liboutbox/outbox.h"
#include "store/store.h"
#include "store/operator/schema.h"
#include "tests/support/fixture.h"

/* The test's table and connection are the fixture's. */
static struct fixture g_fx;
static const char *g_table = g_fx.table;
static PGconn *g_conn;

static void exec_ok(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void exec_ok(const char *fmt, ...)
{
	char q[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(q, sizeof(q), fmt, ap);
	va_end(ap);
	PGresult *r = PQexec(g_conn, q);
	cr_assert(PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK,
	          "%s: %s", q, PQresultErrorMessage(r));
	PQclear(r);
}

/* The first value of a query as text (static buffer). */
static const char *value(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *value(const char *fmt, ...)
{
	static char out[4096];
	char q[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(q, sizeof(q), fmt, ap);
	va_end(ap);
	PGresult *r = PQexec(g_conn, q);
	cr_assert(PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1, "%s: %s", q,
	          PQresultErrorMessage(r));
	snprintf(out, sizeof(out), "%s", PQgetvalue(r, 0, 0));
	PQclear(r);
	return out;
}

static void setup(void)
{
	fixture_setup(&g_fx, "pr",
	              &(struct fixture_options){ .no_migrate = true, .no_consumer = true });
	g_conn = g_fx.pg;
	char *ddl = store_schema_sql(g_table, g_table);
	cr_assert_not_null(ddl);
	PGresult *r = PQexec(g_conn, ddl);
	free(ddl);
	cr_assert_eq(PQresultStatus(r), PGRES_COMMAND_OK, "%s", PQresultErrorMessage(r));
	PQclear(r);
}

static void teardown(void)
{
	fixture_teardown(&g_fx);
}

TestSuite(producer, .init = setup, .fini = teardown, .timeout = 60);

static struct outbox_message msg(const char *id)
{
	struct outbox_message m = { .id = id,
		                    .exchange = "orders",
		                    .routing_key = "created",
		                    .body = "{\"n\":1}",
		                    .body_len = 7 };
	return m;
}

Test(producer, same_id_twice_is_one_row)
{
	char err[256] = "";
	struct outbox_message m = msg("dup-1");

	exec_ok("BEGIN");
	cr_assert_eq(outbox_add(g_conn, g_table, &m, err, sizeof(err)), OUTBOX_ADDED, "%s", err);
	cr_assert_eq(PQtransactionStatus(g_conn), PQTRANS_INTRANS,
	             "the caller's transaction is still open");
	exec_ok("COMMIT");
	exec_ok("BEGIN");
	cr_assert_eq(outbox_add(g_conn, g_table, &m, err, sizeof(err)), OUTBOX_DUPLICATE, "%s",
	             err);
	cr_assert_eq(PQtransactionStatus(g_conn), PQTRANS_INTRANS, "a duplicate does not abort");
	exec_ok("COMMIT");
	cr_assert_str_eq(value("SELECT count(*) FROM %s", g_table), "1");
	cr_assert_str_eq(value("SELECT body || '|' || body_encoding || '|' || content_type"
	                       " || '|' || headers || '|' || properties FROM %s",
	                       g_table),
	                 "{\"n\":1}|utf-8|application/json|{}|{}");
}

Test(producer, rolled_back_leaves_nothing)
{
	char err[256] = "";
	struct outbox_message m = msg("rb-1");

	exec_ok("BEGIN");
	cr_assert_eq(outbox_add(g_conn, g_table, &m, err, sizeof(err)), OUTBOX_ADDED, "%s", err);
	cr_assert_eq(PQtransactionStatus(g_conn), PQTRANS_INTRANS);
	exec_ok("ROLLBACK");
	cr_assert_str_eq(value("SELECT count(*) FROM %s", g_table), "0");
}

Test(producer, outside_a_transaction_autocommits)
{
	char err[256] = "";
	struct outbox_message m = msg("auto-1");

	cr_assert_eq(outbox_add(g_conn, g_table, &m, err, sizeof(err)), OUTBOX_ADDED, "%s", err);
	cr_assert_eq(PQtransactionStatus(g_conn), PQTRANS_IDLE, "no BEGIN of its own");
	cr_assert_str_eq(value("SELECT count(*) FROM %s", g_table), "1");
}

Test(producer, binary_body_becomes_base64)
{
	char err[256] = "";
	static const unsigned char bin[] = { 0x00, 0xff, 0x10, 'a', 0x80 };
	struct outbox_message m = msg("bin-1");
	m.body = bin;
	m.body_len = sizeof(bin);

	cr_assert_eq(outbox_add(g_conn, g_table, &m, err, sizeof(err)), OUTBOX_ADDED, "%s", err);
	cr_assert_str_eq(value("SELECT body_encoding FROM %s", g_table), "base64");
	cr_assert_str_eq(value("SELECT body FROM %s", g_table), "AP8QYYA=");
	cr_assert_str_eq(value("SELECT encode(decode(body, 'base64'), 'hex') FROM %s", g_table),
	                 "00ff106180");

	/* Text with a NUL byte is not text either. */
	m.id = "bin-2";
	m.body = "ab\0c";
	m.body_len = 4;
	cr_assert_eq(outbox_add(g_conn, g_table, &m, err, sizeof(err)), OUTBOX_ADDED, "%s", err);
	cr_assert_str_eq(value("SELECT body || body_encoding FROM %s WHERE id = 'bin-2'", g_table),
	                 "YWIAYw==base64");

	/* Valid UTF-8 stays as it is. */
	m.id = "txt-1";
	m.body = "h\xc3\xa9";
	m.body_len = 3;
	cr_assert_eq(outbox_add(g_conn, g_table, &m, err, sizeof(err)), OUTBOX_ADDED, "%s", err);
	cr_assert_str_eq(value("SELECT body || body_encoding FROM %s WHERE id = 'txt-1'", g_table),
	                 "h\xc3\xa9utf-8");
}

Test(producer, all_fields_and_delay)
{
	char err[256] = "";
	struct outbox_message m = msg("full-1");
	m.content_type = "text/plain";
	m.headers_json = "{\"a\": 1}";
	m.properties_json = "{\"priority\": 5}";
	m.ordering_key = "customer-7";
	m.delay_ms = 60000;
	m.body_encoding = "base64";
	m.body = "aGk=";
	m.body_len = 4;

	cr_assert_eq(outbox_add(g_conn, g_table, &m, err, sizeof(err)), OUTBOX_ADDED, "%s", err);
	cr_assert_str_eq(value("SELECT concat_ws('|', content_type, headers, properties,"
	                       " ordering_key, body, body_encoding,"
	                       " available_at > now() + interval '50 seconds') FROM %s",
	                       g_table),
	                 "text/plain|{\"a\": 1}|{\"priority\": 5}|customer-7|aGk=|base64|t");
}

/* A delay above OUTBOX_DELAY_MAX_MS would make the INSERT fail (now() + the interval out of
 * range), which aborts the caller's transaction: it is refused before anything is sent, and the
 * transaction goes on. The maximum itself is taken, and a negative delay means now. */
Test(producer, delay_above_the_maximum_is_refused_before_the_insert)
{
	char err[256] = "";
	struct outbox_message m = msg("late-1");

	exec_ok("BEGIN");
	m.delay_ms = OUTBOX_DELAY_MAX_MS + 1;
	cr_assert_eq(outbox_add(g_conn, g_table, &m, err, sizeof(err)), OUTBOX_ERR_INVALID, "%s",
	             err);
	cr_assert_str_eq(err,
	                 "delay_ms 31536000001 is above the maximum of 31536000000 (365 days)");
	m.delay_ms = INT64_MAX;
	cr_assert_eq(outbox_add(g_conn, g_table, &m, err, sizeof(err)), OUTBOX_ERR_INVALID, "%s",
	             err);
	cr_assert(strstr(err, "9223372036854775807"), "%s", err);
	cr_assert_eq(PQtransactionStatus(g_conn), PQTRANS_INTRANS, "nothing was sent");
	exec_ok("SELECT 1"); /* the caller's transaction still works */

	m.delay_ms = OUTBOX_DELAY_MAX_MS;
	cr_assert_eq(outbox_add(g_conn, g_table, &m, err, sizeof(err)), OUTBOX_ADDED, "%s", err);
	m = msg("now-1");
	m.delay_ms = -60000;
	cr_assert_eq(outbox_add(g_conn, g_table, &m, err, sizeof(err)), OUTBOX_ADDED, "%s", err);
	exec_ok("COMMIT");
	cr_assert_str_eq(value("SELECT available_at > now() + interval '364 days' FROM %s"
	                       " WHERE id = 'late-1'",
	                       g_table),
	                 "t");
	cr_assert_str_eq(value("SELECT available_at <= now() FROM %s WHERE id = 'now-1'", g_table),
	                 "t");
}

Test(producer, refuses_bad_messages_without_aborting_the_transaction)
{
	char err[256] = "";
	char longid[80];
	memset(longid, 'x', 65);
	longid[65] = '\0';

	exec_ok("BEGIN");
	struct outbox_message m = msg(longid);
	cr_assert_eq(outbox_add(g_conn, g_table, &m, err, sizeof(err)), OUTBOX_ERR_INVALID);
	cr_assert(strstr(err, "id"), "%s", err);
	m = msg("");
	cr_assert_eq(outbox_add(g_conn, g_table, &m, err, sizeof(err)), OUTBOX_ERR_INVALID);
	m = msg("ok-1");
	m.exchange = NULL;
	cr_assert_eq(outbox_add(g_conn, g_table, &m, err, sizeof(err)), OUTBOX_ERR_INVALID);
	m = msg("ok-1");
	char longkey[300];
	memset(longkey, 'k', 256);
	longkey[256] = '\0';
	m.routing_key = longkey;
	cr_assert_eq(outbox_add(g_conn, g_table, &m, err, sizeof(err)), OUTBOX_ERR_INVALID);
	m = msg("ok-1");
	m.headers_json = "[1]";
	cr_assert_eq(outbox_add(g_conn, g_table, &m, err, sizeof(err)), OUTBOX_ERR_INVALID);
	m = msg("ok-1");
	m.body_encoding = "latin1";
	cr_assert_eq(outbox_add(g_conn, g_table, &m, err, sizeof(err)), OUTBOX_ERR_INVALID);
	m = msg("ok-1");
	m.body_encoding = "base64";
	m.body = "not base64!";
	m.body_len = 11;
	cr_assert_eq(outbox_add(g_conn, g_table, &m, err, sizeof(err)), OUTBOX_ERR_INVALID);
	m = msg("ok-1");
	m.body_encoding = "utf-8";
	m.body = "\xff";
	m.body_len = 1;
	cr_assert_eq(outbox_add(g_conn, g_table, &m, err, sizeof(err)), OUTBOX_ERR_INVALID);
	m = msg("ok-1");
	cr_assert_eq(outbox_add(g_conn, "x; DROP TABLE y", &m, err, sizeof(err)),
	             OUTBOX_ERR_INVALID);
	cr_assert_eq(PQtransactionStatus(g_conn), PQTRANS_INTRANS,
	             "nothing was sent, so the transaction is intact");
	cr_assert_eq(outbox_add(g_conn, g_table, &m, err, sizeof(err)), OUTBOX_ADDED, "%s", err);
	exec_ok("COMMIT");
	cr_assert_str_eq(value("SELECT string_agg(id, ',') FROM %s", g_table), "ok-1");
}

Test(producer, server_error_is_reported_as_query_error)
{
	char err[256] = "";
	struct outbox_message m = msg("q-1");

	cr_assert_eq(outbox_add(g_conn, "no_such_outbox_table", &m, err, sizeof(err)),
	             OUTBOX_ERR_QUERY);
	cr_assert(strstr(err, "no_such_outbox_table"), "%s", err);
	cr_assert_null(strchr(err, '\n'), "one line");
}
