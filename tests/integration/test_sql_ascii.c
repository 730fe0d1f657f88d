/* A SQL_ASCII database stores whatever bytes a producer sends, so ids need not be UTF-8. End to
 * end on such a database: rows whose ids hold bytes like 0xff 0xfe are each published once and
 * marked published (the relay's id arrays carry ids verbatim: a rewritten id never matched its
 * row, which was then published again forever). The producer library works there too. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libpq-fe.h>

#include "store/liboutbox/outbox.h"
#include "tests/support/consumer_assert.h"
#include "tests/support/harness.h"
#include "tests/support/fixture.h"

#define DELIVERY_TIMEOUT_MS 120000

/* The relay's table, exchange, queue and consumer; the table lives in g_db, not in the
 * database of the fixture's connection. */
static struct fixture g_fx;
static char g_db[64];

static void drop_db(void)
{
	PGconn *c;

	if (!g_db[0])
		return;
	c = harness_pg_connect();
	PQclear(PQexec(c, "SET client_min_messages = warning"));
	{
		char q[160];

		snprintf(q, sizeof(q), "DROP DATABASE IF EXISTS %s WITH (FORCE)", g_db);
		PQclear(PQexec(c, q));
	}
	PQfinish(c);
	g_db[0] = '\0';
}

static void teardown(void)
{
	fixture_teardown(&g_fx);
	drop_db();
}

TestSuite(sql_ascii, .fini = teardown, .timeout = 300);

/* Ids that are not UTF-8 (and one that is, added through outbox_add()). */
static const char *const ids[] = {
	"id-\xff\xfe-1", "\xff", "\xfe\xff", "latin1-caf\xe9", "\x80\x81\x82\x83", "plain-ascii",
};
#define N_IDS   (sizeof(ids) / sizeof(ids[0]))
#define UTF8_ID "utf8-caf\xc3\xa9"

static const char *printable(const char *id, char *buf, size_t len)
{
	size_t o = 0;

	for (const unsigned char *p = (const unsigned char *)id; *p && o + 5 < len; p++)
		o += (size_t)snprintf(buf + o, len - o, *p < 0x80 && *p >= 0x20 ? "%c" : "\\x%02x",
		                      *p);
	buf[o] = '\0';
	return buf;
}

/* The whole round: a SQL_ASCII database, rows with non-UTF-8 ids, a relay whose database.url
 * is the database's plus url_extra. */
static void round_trip(const char *url_extra)
{
	char url[512], env_url[600], err[512], shown[64];
	PGconn *p;
	struct harness_output o;
	struct harness_relay *r;
	struct outbox_message m = { .id = UTF8_ID,
		                    .exchange = g_fx.exchange,
		                    .routing_key = "rk",
		                    .body = "{}",
		                    .body_len = 2 };
	const char *env[2] = { env_url, NULL };

	/* The table is migrated on the SQL_ASCII database below. */
	fixture_setup(&g_fx, "sa", &(struct fixture_options){ .no_migrate = true });
	harness_unique_name(g_db, sizeof(g_db), "sqlascii");
	harness_pg_exec(g_fx.pg,
	                "CREATE DATABASE %s ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C'"
	                " TEMPLATE template0",
	                g_db);
	snprintf(url, sizeof(url), "%s dbname=%s", harness_pg_conninfo(), g_db);
	snprintf(env_url, sizeof(env_url), "OUTBOX_DATABASE_URL=%s%s", url, url_extra);

	harness_cli(&o, g_fx.table, env, "migrate", (const char *)NULL);
	cr_assert_eq(o.status, 0, "migrate on the SQL_ASCII database: %s%s", o.out, o.err);
	harness_output_free(&o);

	p = PQconnectdb(url);
	cr_assert_eq(PQstatus(p), CONNECTION_OK, "%s", PQerrorMessage(p));
	cr_assert_str_eq(PQparameterStatus(p, "server_encoding"), "SQL_ASCII");
	for (size_t i = 0; i < N_IDS; i++) {
		const char *v[2] = { ids[i], g_fx.exchange };
		PGresult *res;
		char sql[256];

		snprintf(sql, sizeof(sql),
		         "INSERT INTO %s (id, exchange_name, routing_key, body)"
		         " VALUES ($1, $2, 'rk', '{}')",
		         g_fx.table);
		res = PQexecParams(p, sql, 2, NULL, v, NULL, NULL, 0);
		cr_assert_eq(PQresultStatus(res), PGRES_COMMAND_OK, "%s: %s",
		             printable(ids[i], shown, sizeof(shown)), PQresultErrorMessage(res));
		PQclear(res);
	}
	/* The library on a SQL_ASCII connection (client_encoding SQL_ASCII: nothing converted). */
	cr_assert_eq(outbox_add(p, g_fx.table, &m, err, sizeof(err)), OUTBOX_ADDED,
	             "outbox_add: %s", err);

	r = harness_relay_start(g_fx.table, env, NULL);
	if (!consumer_wait_unique(g_fx.cons, N_IDS + 1, DELIVERY_TIMEOUT_MS)) {
		harness_relay_dump_log(r);
		cr_assert_fail("%zu of %zu messages arrived", consumer_unique(g_fx.cons),
		               N_IDS + 1);
	}
	/* Every row marked; then the relay stops, and nothing is left to publish again. */
	{
		char pending_sql[160];

		snprintf(pending_sql, sizeof(pending_sql),
		         "SELECT count(*) FROM %s WHERE published_at IS NULL", g_fx.table);
		HARNESS_WAIT(harness_pg_int(p, "%s", pending_sql) == 0, 30000);
		if (harness_pg_int(p, "%s", pending_sql) != 0) {
			char *left = harness_pg_string(
			        p,
			        "SELECT string_agg(encode(convert_to(id, 'SQL_ASCII'), 'hex') || ' "
			        "attempts ' || attempts || ' ' || COALESCE(last_error, ''), '; ')"
			        " FROM %s WHERE published_at IS NULL",
			        g_fx.table);

			harness_relay_dump_log(r);
			cr_assert_fail("rows left unmarked (hex ids): %s", left ? left : "?");
		}
	}
	/* Time for a republish loop to show itself before the relay stops. */
	harness_sleep_ms(3000);
	harness_relay_finish(r, "relay");
	cr_assert_eq(harness_pg_int(p, "SELECT count(*) FROM %s WHERE published_at IS NOT NULL",
	                            g_fx.table),
	             (int64_t)N_IDS + 1);
	for (size_t i = 0; i < N_IDS; i++)
		cr_assert_eq(consumer_count(g_fx.cons, ids[i]), 1, "id %s delivered %zu times",
		             printable(ids[i], shown, sizeof(shown)),
		             consumer_count(g_fx.cons, ids[i]));
	cr_assert_eq(consumer_count(g_fx.cons, UTF8_ID), 1);
	cr_assert_eq(consumer_duplicates(g_fx.cons), 0);
	PQfinish(p);
	fixture_teardown(&g_fx);
}

/* With client_encoding=SQL_ASCII in database.url the relay's connection converts nothing. */
Test(sql_ascii, non_utf8_ids_are_published_once_and_marked)
{
	round_trip(" client_encoding=SQL_ASCII");
}

/* With the default database.url: the relay asks for client_encoding UTF8 on any other server,
 * but leaves a SQL_ASCII server's bytes alone (converted to UTF8 there, a row holding a byte
 * that is not UTF-8 failed the whole claim, every time, and nothing was relayed). */
Test(sql_ascii, non_utf8_ids_with_the_default_url)
{
	round_trip("");
}
