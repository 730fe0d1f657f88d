/* The store against a real PostgreSQL (RELAY_TEST_PG): schema and migrate, the claim (order,
 * leases, concurrency, ordering keys, snapshot xmin), marks, release, wake-up, the operator
 * queries and the claim plan on a large backlog. Each test uses its own table. */
#include <criterion/criterion.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <libpq-fe.h>

#include "store/liboutbox/outbox.h"
#include "store/store.h"
#include "store/source/lease.h"
#include "store/source/position.h"
#include "store/operator/admin.h"
#include "store/operator/schema.h"
#include "tests/support/fixture.h"
#include "store/store_private.h"

/* The test's own table and connection (setup and checks) are the fixture's, which name_table()
 * sets up: no consumer, and the table is left to the test. */
static struct fixture g_fx;
static const char *g_table = g_fx.table;
static PGconn *g_admin;

static void sql(PGconn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sql(PGconn *c, const char *fmt, ...)
{
	char q[2048];
	va_list ap;
	PGresult *r;

	va_start(ap, fmt);
	vsnprintf(q, sizeof(q), fmt, ap);
	va_end(ap);
	r = PQexec(c, q);
	cr_assert(PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK,
	          "%s: %s", q, PQresultErrorMessage(r));
	PQclear(r);
}

/* The first value of a query, as a long long. */
static long long sql_int(PGconn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static long long sql_int(PGconn *c, const char *fmt, ...)
{
	char q[2048];
	va_list ap;
	PGresult *r;
	long long v;

	va_start(ap, fmt);
	vsnprintf(q, sizeof(q), fmt, ap);
	va_end(ap);
	r = PQexec(c, q);
	cr_assert(PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1, "%s: %s", q,
	          PQresultErrorMessage(r));
	v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
	PQclear(r);
	return v;
}

static void teardown(void)
{
	fixture_teardown(&g_fx);
}

TestSuite(store, .fini = teardown, .timeout = 120);

static void name_table(const char *tag)
{
	char prefix[32];

	snprintf(prefix, sizeof(prefix), "st_%s", tag);
	fixture_setup(&g_fx, prefix,
	              &(struct fixture_options){ .no_migrate = true, .no_consumer = true });
	g_admin = g_fx.pg;
}

static struct store_options opts_for(const char *relay, bool admin)
{
	return fixture_store_options(&g_fx, relay, admin);
}

/* A connected store; the fixture keeps its options until the test ends. */
static struct store *open_store(struct store_options o)
{
	return fixture_store_open(&g_fx, &o);
}

static struct store *migrated(const char *tag)
{
	name_table(tag);
	struct store *a = open_store(opts_for("admin", true));
	int rc = store_migrate(a);
	cr_assert_eq(rc, 0, "migrate: %s", store_errmsg(a));
	return a;
}

static void add(const char *id, const char *key, int64_t delay_ms)
{
	struct outbox_message m = {
		.id = id,
		.exchange = "ex",
		.routing_key = "rk",
		.body = "{}",
		.body_len = 2,
		.ordering_key = key,
		.delay_ms = delay_ms,
	};
	char err[256];
	int rc = outbox_add(g_admin, g_table, &m, err, sizeof(err));
	cr_assert_eq(rc, OUTBOX_ADDED, "outbox_add %s: %s", id, err);
}

/* Settles the ordering watermark, waiting up to 3 s while transactions of other tests on the
 * same server (which hold it back, as any producer's would) are still running. Tests that
 * hold it back on purpose just see their keyed rows stay unclaimed. */
static void settle(struct store *s)
{
	for (int i = 0; i < 300; i++) {
		int rc = store_settle_watermark(s);

		cr_assert_geq(rc, 0, "settle: %s", store_errmsg(s));
		if (rc == 0)
			return;
		usleep(10000);
	}
}

/* The token of the last claim_str() (every write of claimed rows must carry it). */
static char g_token[STORE_TOKEN_MAX];

/* Claims once and returns the ids as "a,b,c" (static buffer); the claim's token goes to
 * g_token. */
static const char *claim_str(struct store *s, bool disarm)
{
	static char out[4096];
	struct store_batch b;
	size_t len = 0;

	store_batch_init(&b);
	/* As the relay does before it sleeps: keyed rows committed since the last claims are
	 * claimable once the ordering watermark has passed them. */
	settle(s);
	int rc = store_claim(s, disarm, &b);
	cr_assert_eq(rc, 0, "claim: %s", store_errmsg(s));
	out[0] = '\0';
	for (size_t i = 0; i < b.n; i++) {
		if (i > 0)
			cr_assert_gt(b.rows[i].seq, b.rows[i - 1].seq, "rows not in seq order");
		len += (size_t)snprintf(out + len, sizeof(out) - len, "%s%s", i ? "," : "",
		                        b.rows[i].id);
	}
	snprintf(g_token, sizeof(g_token), "%s", b.token);
	store_batch_free(&b);
	return out;
}

/* Keyed rows wait for every older transaction in the cluster to end; other work on the same
 * server may hold one open for a moment, so wait until our rows are past the xmin. */
static void wait_rows_settled(void)
{
	for (int i = 0; i < 1200; i++) {
		if (sql_int(g_admin,
		            "SELECT (COALESCE(max(txid), '0'::xid8) < "
		            "pg_snapshot_xmin(pg_current_snapshot()))::int FROM %s",
		            g_table) == 1)
			return;
		usleep(50 * 1000);
	}
	cr_assert_fail("another transaction kept the snapshot xmin back for 60 s");
}

/* Gives table t the wake-up of the version before this one: the lock tested in the trigger's
 * WHEN, and a function that pins its search_path and only notifies. */
static void when_trigger(const char *t)
{
	sql(g_admin, "DROP TRIGGER %s_wakeup ON %s", t, t);
	sql(g_admin,
	    "CREATE OR REPLACE FUNCTION %s_wakeup_notify() RETURNS trigger LANGUAGE plpgsql"
	    " SET search_path = pg_catalog, pg_temp"
	    " AS $fn$ BEGIN PERFORM pg_notify('%s', ''); RETURN NULL; END $fn$",
	    t, t);
	sql(g_admin,
	    "CREATE TRIGGER %s_wakeup AFTER INSERT ON %s FOR EACH STATEMENT"
	    " WHEN (NOT (pg_try_advisory_lock_shared(" STORE_WAKEUP_LOCK_CLASS
	    ", '%s'::regclass::oid::integer) AND pg_advisory_unlock_shared(" STORE_WAKEUP_LOCK_CLASS
	    ", '%s'::regclass::oid::integer))) EXECUTE FUNCTION %s_wakeup_notify()",
	    t, t, t, t, t);
}

/* What the cursor source needs (docs/design.md): the deferred_at column (nullable, no
 * default), the partial index of its exceptions, and the position table beside the table. */
static void expect_cursor_objects(const char *t)
{
	cr_assert_eq(sql_int(g_admin,
	                     "SELECT count(*) FROM pg_attribute WHERE attrelid = '%s'::regclass"
	                     " AND attname = 'deferred_at' AND NOT attnotnull AND NOT atthasdef"
	                     " AND atttypid = 'timestamptz'::regtype AND NOT attisdropped",
	                     t),
	             1, "deferred_at TIMESTAMPTZ, nullable, no default");
	cr_assert_eq(sql_int(g_admin,
	                     "SELECT count(*) FROM pg_index i JOIN pg_class ic ON ic.oid ="
	                     " i.indexrelid WHERE i.indrelid = '%s'::regclass AND i.indisvalid"
	                     " AND ic.relname = '%s_deferred_idx' AND pg_get_indexdef(i.indexrelid)"
	                     " LIKE '%%(ordering_key, seq) WHERE ((deferred_at IS NOT NULL) AND"
	                     " (published_at IS NULL))'",
	                     t, t),
	             1, "the deferred index, valid");
	cr_assert_eq(sql_int(g_admin,
	                     "SELECT count(*) FROM pg_attribute WHERE attrelid ="
	                     " '%s_position'::regclass AND attnum > 0 AND NOT attisdropped AND"
	                     " (attname, format_type(atttypid, atttypmod), attnotnull) IN"
	                     " (('stream', 'text', true), ('position', 'bigint', true),"
	                     " ('leader', 'text', false),"
	                     " ('moved_at', 'timestamp with time zone', true))",
	                     t),
	             4, "the position table's columns");
	cr_assert_eq(
	        sql_int(g_admin,
	                "SELECT count(*) FROM pg_index WHERE indrelid = '%s_position'::regclass"
	                " AND indisprimary",
	                t),
	        1, "stream is the position table's key");
	sql(g_admin, "INSERT INTO %s_position (stream, position) VALUES ('probe', 7)", t);
	cr_assert_eq(sql_int(g_admin,
	                     "SELECT count(*) FROM %s_position WHERE stream = 'probe'"
	                     " AND moved_at > now() - interval '1 hour'",
	                     t),
	             1, "moved_at defaults to now()");
	sql(g_admin, "DELETE FROM %s_position WHERE stream = 'probe'", t);
}

/* The oids of the objects migrate makes, as one string (a changed one: migrate rebuilt it). */
static char *object_oids(const char *t)
{
	char q[1024];
	PGresult *r;
	char *out;

	snprintf(q, sizeof(q),
	         "SELECT string_agg(c.relname || '=' || c.oid || '/' || c.relfilenode, ','"
	         " ORDER BY c.relname) FROM pg_class c WHERE c.relname LIKE '%s%%'",
	         t);
	r = PQexec(g_admin, q);
	cr_assert(PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1, "%s",
	          PQresultErrorMessage(r));
	out = strdup(PQgetvalue(r, 0, 0));
	PQclear(r);
	return out;
}

Test(store, schema_applies_twice_and_refuses_bad_names)
{
	name_table("schema");
	char *ddl = store_schema_sql(g_table, "chan");
	cr_assert_not_null(ddl);
	sql(g_admin, "SET client_min_messages = warning");
	for (int i = 0; i < 2; i++) {
		PGresult *r = PQexec(g_admin, ddl);
		cr_assert_eq(PQresultStatus(r), PGRES_COMMAND_OK, "apply %d: %s", i,
		             PQresultErrorMessage(r));
		PQclear(r);
	}
	cr_assert_eq(sql_int(g_admin,
	                     "SELECT count(*) FROM pg_trigger WHERE tgrelid = '%s'::regclass"
	                     " AND tgname = '%s_wakeup' AND tgtype = " STORE_WAKEUP_TGTYPE,
	                     g_table, g_table),
	             1, "the statement-level wake-up trigger");
	cr_assert_eq(
	        sql_int(g_admin, "SELECT count(*) FROM pg_indexes WHERE tablename = '%s'", g_table),
	        6, "pkey, seq unique, unkeyed, key, published and deferred indexes, nothing twice");
	expect_cursor_objects(g_table);
	/* Over a table of an earlier version: its deferred per-row trigger is replaced. */
	sql(g_admin, "DROP TRIGGER %s_wakeup ON %s", g_table, g_table);
	sql(g_admin,
	    "CREATE CONSTRAINT TRIGGER %s_wakeup AFTER INSERT ON %s DEFERRABLE INITIALLY DEFERRED"
	    " FOR EACH ROW EXECUTE FUNCTION %s_wakeup_notify()",
	    g_table, g_table, g_table);
	PGresult *res = PQexec(g_admin, ddl);
	cr_assert_eq(PQresultStatus(res), PGRES_COMMAND_OK, "%s", PQresultErrorMessage(res));
	PQclear(res);
	cr_assert_eq(sql_int(g_admin,
	                     "SELECT count(*) FROM pg_trigger WHERE tgrelid = '%s'::regclass"
	                     " AND NOT tgisinternal AND tgtype = " STORE_WAKEUP_TGTYPE,
	                     g_table),
	             1, "the earlier trigger replaced");
	/* ... and so is the version's before this one, which tested the lock in its WHEN. */
	when_trigger(g_table);
	res = PQexec(g_admin, ddl);
	cr_assert_eq(PQresultStatus(res), PGRES_COMMAND_OK, "%s", PQresultErrorMessage(res));
	PQclear(res);
	free(ddl);
	cr_assert_eq(sql_int(g_admin,
	                     "SELECT count(*) FROM pg_trigger WHERE tgrelid = '%s'::regclass"
	                     " AND NOT tgisinternal AND tgtype = " STORE_WAKEUP_TGTYPE
	                     " AND tgqual IS NULL",
	                     g_table),
	             1, "the WHEN trigger replaced");
	cr_assert_eq(sql_int(g_admin,
	                     "SELECT count(*) FROM pg_proc WHERE proname = '%s_wakeup_notify'"
	                     " AND proconfig IS NULL AND strpos(prosrc, 'TG_RELID') > 0",
	                     g_table),
	             1, "the function replaced");

	cr_assert_null(store_schema_sql("bad name", "c"));
	cr_assert_null(store_schema_sql("x; DROP TABLE y", "c"));
	cr_assert_null(store_schema_sql("a.b.c", "c"));
	cr_assert_null(store_schema_sql("outbox", "bad'chan"));
	ddl = store_schema_sql("app.outbox", "c");
	cr_assert_not_null(ddl);
	cr_assert(strstr(ddl, "DROP INDEX IF EXISTS app.outbox_pending_idx"),
	          "derived objects in the table's schema");
	free(ddl);
}

Test(store, relay_connect_says_migrate_when_table_missing)
{
	name_table("missing");
	struct store_options o = opts_for("r1", false);
	struct store *s = store_new(&o);
	cr_assert_not_null(s);
	cr_assert_eq(store_connect(s), STORE_ERR_FATAL);
	cr_assert(strstr(store_errmsg(s), "run 'outbox-relay migrate'"), "%s", store_errmsg(s));
	cr_assert_null(strchr(store_errmsg(s), '\n'));
	store_free(s);

	o.conninfo = "host=127.0.0.1 port=1 connect_timeout=2";
	s = store_new(&o);
	cr_assert_eq(store_connect(s), STORE_ERR_CONN);
	cr_assert_not(store_connected(s));
	cr_assert_eq(store_socket(s), -1);
	store_free(s);
}

Test(store, migrate_upgrades_acemq_table)
{
	name_table("acemq");
	sql(g_admin,
	    "CREATE TABLE %s (id VARCHAR(64) NOT NULL PRIMARY KEY,"
	    " exchange_name VARCHAR(255) NOT NULL, routing_key VARCHAR(255) NOT NULL,"
	    " body TEXT NOT NULL, body_encoding VARCHAR(16) NOT NULL DEFAULT 'utf-8',"
	    " content_type VARCHAR(255) NOT NULL DEFAULT 'application/json',"
	    " headers TEXT NOT NULL DEFAULT '{}', created_at TIMESTAMPTZ NOT NULL DEFAULT now(),"
	    " published_at TIMESTAMPTZ, attempts INTEGER NOT NULL DEFAULT 0,"
	    " last_error VARCHAR(1000), locked_by VARCHAR(64), locked_until TIMESTAMPTZ)",
	    g_table);
	sql(g_admin,
	    "INSERT INTO %s (id, exchange_name, routing_key, body) VALUES"
	    " ('old1', 'ex', 'rk', 'a'), ('old2', 'ex', 'rk', 'b'), ('old3', 'ex', 'rk', 'c')",
	    g_table);
	sql(g_admin,
	    "INSERT INTO %s (id, exchange_name, routing_key, body, published_at)"
	    " VALUES ('done', 'ex', 'rk', 'd', now())",
	    g_table);

	struct store_options o = opts_for("r1", false);
	struct store *s = store_new(&o);
	cr_assert_eq(store_connect(s), STORE_ERR_FATAL, "old table lacks columns");
	cr_assert(strstr(store_errmsg(s), "seq"), "%s", store_errmsg(s));
	cr_assert(strstr(store_errmsg(s), "migrate"), "%s", store_errmsg(s));
	store_free(s);

	struct store *a = open_store(opts_for("admin", true));
	cr_assert_eq(store_migrate(a), 0, "%s", store_errmsg(a));
	expect_cursor_objects(g_table);
	cr_assert_eq(sql_int(g_admin, "SELECT count(*) FROM %s WHERE deferred_at IS NULL", g_table),
	             4, "existing rows are not deferred");
	char *before = object_oids(g_table);
	cr_assert_eq(store_migrate(a), 0, "second migrate: %s", store_errmsg(a));
	char *after = object_oids(g_table);
	cr_assert_str_eq(after, before, "the second migrate rebuilt or replaced something");
	cr_assert(strstr(before, "_deferred_idx=") && strstr(before, "_position="), "%s", before);
	free(before);
	free(after);
	struct store *r = open_store(opts_for("r1", false));
	cr_assert_str_eq(claim_str(r, false), "old1,old2,old3");
	store_free(r);
	store_free(a);
}

/* Every column of a row add() wrote, as a claim returns it. */
static void expect_whole_row(const struct outbox_row *r)
{
	cr_assert_str_eq(r->exchange, "ex");
	cr_assert_str_eq(r->routing_key, "rk");
	cr_assert_str_eq(r->body, "{}");
	cr_assert_eq(r->body_len, 2);
	cr_assert_str_eq(r->body_encoding, "utf-8");
	cr_assert_str_eq(r->content_type, "application/json");
	cr_assert_str_eq(r->headers, "{}");
	cr_assert_str_eq(r->properties, "{}");
	cr_assert_null(r->ordering_key);
	cr_assert_eq(r->attempts, 0);
	cr_assert_gt(r->created_at_s, (int64_t)time(NULL) - 600);
}

Test(store, claim_in_seq_order_and_writes_lease)
{
	struct store *a = migrated("order");
	for (int i = 0; i < 5; i++) {
		char id[16];
		snprintf(id, sizeof(id), "m%d", i);
		add(id, NULL, 0);
	}
	struct store_options o = opts_for("relay-1", false);
	o.batch_size = 3;
	struct store *r = open_store(o);

	struct store_batch b;
	store_batch_init(&b);
	cr_assert_eq(store_claim(r, false, &b), 0, "%s", store_errmsg(r));
	cr_assert_eq(b.n, 3);
	cr_assert_str_eq(b.rows[0].id, "m0");
	cr_assert_str_eq(b.rows[2].id, "m2");
	expect_whole_row(&b.rows[0]);
	cr_assert_eq(sql_int(g_admin,
	                     "SELECT count(*) FROM %s WHERE locked_by LIKE 'relay-1#%%'"
	                     " AND locked_until > now() + interval '50 seconds'",
	                     g_table),
	             3);
	/* The batch is reused: the second claim replaces the first. It follows a claim of more
	 * than an eighth of a batch, so it is the other statement (ST_CLAIM, claim.c): its rows
	 * come whole all the same. */
	cr_assert_eq(store_claim(r, false, &b), 0);
	cr_assert_eq(b.n, 2);
	cr_assert_str_eq(b.rows[0].id, "m3");
	cr_assert_str_eq(b.rows[1].id, "m4");
	expect_whole_row(&b.rows[0]);
	expect_whole_row(&b.rows[1]);
	cr_assert_lt(b.rows[0].seq, b.rows[1].seq);
	cr_assert_eq(store_claim(r, false, &b), 0);
	cr_assert_eq(b.n, 0);
	store_batch_free(&b);
	store_free(r);
	store_free(a);
}

/* relay.batch_max_bytes: a claim takes rows while their bodies, each row's own included, fit
 * the budget, whatever batch_size allows; a row larger than the whole budget still goes, first
 * and alone. (Taking rows while the bodies before each one fit went one row past the budget.) */
Test(store, claim_stops_at_the_byte_budget)
{
	struct store *a = migrated("bytes");
	struct store_batch b;
	char body[1001], id[16];

	memset(body, 'x', 1000);
	body[1000] = '\0';
	for (int i = 0; i < 6; i++) {
		struct outbox_message m = { .id = id, .exchange = "ex", .routing_key = "rk" };
		char err[256];

		snprintf(id, sizeof(id), "b%d", i);
		m.body = body;
		/* b3 is larger than the whole budget. */
		m.body_len = i == 3 ? 1000 : 400;
		cr_assert_eq(outbox_add(g_admin, g_table, &m, err, sizeof(err)), OUTBOX_ADDED, "%s",
		             err);
	}
	struct store_options o = opts_for("relay-bytes", false);
	o.batch_size = 100;
	o.batch_max_bytes = 900;
	struct store *r = open_store(o);

	store_batch_init(&b);
	/* 400 + 400 <= 900, and b2 would make it 1,200: b0 and b1. */
	cr_assert_eq(store_claim(r, false, &b), 0, "%s", store_errmsg(r));
	cr_assert_eq(b.n, 2, "claimed %zu rows", b.n);
	cr_assert_str_eq(b.rows[1].id, "b1");
	/* b2, and b3 would make it 1,400: b2 alone. */
	cr_assert_eq(store_claim(r, false, &b), 0, "%s", store_errmsg(r));
	cr_assert_eq(b.n, 1, "claimed %zu rows", b.n);
	cr_assert_str_eq(b.rows[0].id, "b2");
	/* b3 alone is over the budget: it still goes, first and alone... */
	cr_assert_eq(store_claim(r, false, &b), 0, "%s", store_errmsg(r));
	cr_assert_eq(b.n, 1, "claimed %zu rows", b.n);
	cr_assert_str_eq(b.rows[0].id, "b3");
	/* ...and the rest fit. */
	cr_assert_eq(store_claim(r, false, &b), 0, "%s", store_errmsg(r));
	cr_assert_eq(b.n, 2, "claimed %zu rows", b.n);
	cr_assert_eq(b.n_cut + b.n_refused, 0);
	store_batch_free(&b);
	store_free(r);
	store_free(a);
}

Test(store, claim_floor_skips_older_rows_until_cleared)
{
	struct store *a = migrated("floor");
	for (int i = 0; i < 6; i++) {
		char id[16];
		snprintf(id, sizeof(id), "f%d", i);
		add(id, NULL, 0);
	}
	struct store *r = open_store(opts_for("relay-1", false));
	struct store_batch b;
	store_batch_init(&b);
	int64_t third = sql_int(g_admin, "SELECT seq FROM %s WHERE id = 'f3'", g_table);
	int64_t last = sql_int(g_admin, "SELECT seq FROM %s WHERE id = 'f5'", g_table);

	/* The floor holds only above rows an earlier claim saw: settle the watermark past every
	 * row, let a claim see them all (it claims them, being the first), and hand them back. */
	settle(r);
	cr_assert_eq(store_claim(r, false, &b), 0, "%s", store_errmsg(r));
	cr_assert_eq(b.n, 6);
	cr_assert_eq(b.rows[5].seq, last);
	const char *ids[6];
	for (size_t i = 0; i < 6; i++)
		ids[i] = b.rows[i].id;
	cr_assert_eq(store_release(r, b.token, ids, 6), 0, "%s", store_errmsg(r));
	store_set_claim_floor(r, third);
	cr_assert_eq(store_claim(r, false, &b), 0, "%s", store_errmsg(r));
	cr_assert_eq(b.n, 3);
	cr_assert_str_eq(b.rows[0].id, "f3");
	/* Without the floor the older rows are found again. */
	store_set_claim_floor(r, 0);
	cr_assert_eq(store_claim(r, false, &b), 0);
	cr_assert_eq(b.n, 3);
	cr_assert_str_eq(b.rows[0].id, "f0");
	store_batch_free(&b);
	store_free(r);
	store_free(a);
}

/* The seq of row id. */
static int64_t seq_of(const char *id)
{
	return sql_int(g_admin, "SELECT seq FROM %s WHERE id = '%s'", g_table, id);
}

/* Adds row id in the transaction open on c. */
static void add_on(PGconn *c, const char *id)
{
	struct outbox_message m = {
		.id = id, .exchange = "ex", .routing_key = "rk", .body = "{}", .body_len = 2
	};
	char err[256];

	cr_assert_eq(outbox_add(c, g_table, &m, err, sizeof(err)), OUTBOX_ADDED, "%s", err);
}

/* A relay whose pipeline stays busy sets the floor to the first row of its last batch. A row
 * whose transaction drew its seq before that row's and committed after the claim lies below
 * that floor: the next claim must still look there, or the row waits for a claim without a
 * floor (up to a poll interval). */
Test(store, claim_floor_looks_below_it_for_rows_committed_late)
{
	struct store *a = migrated("floorlate");
	struct store *r = open_store(opts_for("relay-1", false));
	PGconn *p = harness_pg_connect();
	struct store_batch b;

	store_batch_init(&b);
	sql(p, "BEGIN");
	add_on(p, "early");
	add("b1", NULL, 0);
	add("b2", NULL, 0);
	cr_assert_eq(store_claim(r, false, &b), 0, "%s", store_errmsg(r));
	cr_assert_eq(b.n, 2, "claimed %zu rows", b.n);
	cr_assert_str_eq(b.rows[0].id, "b1");
	store_set_claim_floor(r, b.rows[0].seq);
	sql(p, "COMMIT");
	cr_assert_eq(store_claim(r, false, &b), 0, "%s", store_errmsg(r));
	cr_assert_eq(b.n, 1, "the row committed late was not claimed (%zu rows)", b.n);
	cr_assert_str_eq(b.rows[0].id, "early");
	PQfinish(p);
	store_batch_free(&b);
	store_free(r);
	store_free(a);
}

/* ...but only so far: a claim looks at most 8 batches below the floor asked for, so that a
 * transaction left open does not make every claim walk all the rows committed since it
 * began. Its row is found by the next claim without a floor. */
Test(store, claim_floor_looks_below_it_at_most_eight_batches)
{
	struct store *a = migrated("floorreach");
	struct store_options o = opts_for("relay-1", false);
	PGconn *p = harness_pg_connect();
	struct store_batch b;
	char id[16];

	o.batch_size = 1;
	struct store *r = open_store(o);
	store_batch_init(&b);
	sql(p, "BEGIN");
	add_on(p, "early");
	for (int i = 0; i < 20; i++) {
		snprintf(id, sizeof(id), "r%d", i);
		add(id, NULL, 0);
	}
	cr_assert_eq(store_claim(r, false, &b), 0, "%s", store_errmsg(r));
	cr_assert_str_eq(b.rows[0].id, "r0");
	store_set_claim_floor(r, seq_of("r15"));
	sql(p, "COMMIT");
	cr_assert_eq(store_claim(r, false, &b), 0, "%s", store_errmsg(r));
	cr_assert_eq(b.n, 1);
	cr_assert_eq(b.rows[0].seq, seq_of("r15") - 8, "claimed %s", b.rows[0].id);
	store_set_claim_floor(r, 0);
	cr_assert_eq(store_claim(r, false, &b), 0, "%s", store_errmsg(r));
	cr_assert_str_eq(b.rows[0].id, "early");
	PQfinish(p);
	store_batch_free(&b);
	store_free(r);
	store_free(a);
}

Test(store, concurrent_claims_never_share_a_row)
{
	struct store *a = migrated("conc");
	enum { N = 3000 };
	sql(g_admin,
	    "INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key)"
	    " SELECT 'c' || g, 'ex', 'rk', 'b', CASE WHEN g %% 3 = 0 THEN 'k' || (g %% 7) END"
	    " FROM generate_series(0, %d) g",
	    g_table, N - 1);
	wait_rows_settled();
	struct store_options o1 = opts_for("relay-1", false), o2 = opts_for("relay-2", false);
	o1.batch_size = o2.batch_size = 97;
	struct store *r1 = open_store(o1), *r2 = open_store(o2);
	static unsigned char seen[N];
	struct store_batch b1, b2;
	store_batch_init(&b1);
	store_batch_init(&b2);
	int total = 0, idle = 0;

	while (idle < 3) {
		settle(r1);
		settle(r2);
		/* Both statements run on the server at the same time. */
		cr_assert_eq(store_claim_send(r1, false), 0, "%s", store_errmsg(r1));
		cr_assert_eq(store_claim_send(r2, false), 0, "%s", store_errmsg(r2));
		cr_assert_eq(store_claim_recv(r1, &b1), 0, "%s", store_errmsg(r1));
		cr_assert_eq(store_claim_recv(r2, &b2), 0, "%s", store_errmsg(r2));
		idle = (b1.n + b2.n == 0) ? idle + 1 : 0;
		struct store_batch *bs[2] = { &b1, &b2 };
		struct store *rs[2] = { r1, r2 };
		for (int k = 0; k < 2; k++) {
			int64_t seqs[97];
			for (size_t i = 0; i < bs[k]->n; i++) {
				int n = (int)strtol(bs[k]->rows[i].id + 1, NULL, 10);
				cr_assert(n >= 0 && n < N);
				cr_assert_eq(seen[n], 0, "row %s claimed twice", bs[k]->rows[i].id);
				seen[n] = 1;
				seqs[i] = bs[k]->rows[i].seq;
				total++;
			}
			/* Publishing makes the next row of each key claimable. */
			cr_assert_eq(
			        store_mark_published(rs[k], bs[k]->token, seqs, bs[k]->n, false),
			        0);
		}
	}
	cr_assert_eq(total, N);
	store_batch_free(&b1);
	store_batch_free(&b2);
	store_free(r1);
	store_free(r2);
	store_free(a);
}

Test(store, expired_lease_makes_rows_claimable)
{
	struct store *a = migrated("lease");
	add("l1", NULL, 0);
	add("l2", NULL, 0);
	struct store_options o1 = opts_for("relay-1", false);
	o1.lease_ms = 2000;
	struct store *r1 = open_store(o1);
	struct store *r2 = open_store(opts_for("relay-2", false));
	cr_assert_str_eq(claim_str(r1, false), "l1,l2");
	cr_assert_str_eq(claim_str(r2, false), "", "leased rows are not claimable");
	usleep(2500 * 1000);
	cr_assert_str_eq(claim_str(r2, false), "l1,l2", "lease ran out");
	cr_assert_eq(sql_int(g_admin, "SELECT count(*) FROM %s WHERE locked_by LIKE 'relay-2#%%'",
	                     g_table),
	             2);
	store_free(r1);
	store_free(r2);
	store_free(a);
}

/* A batch claimed while the previous one waited for its confirms may have little lease left:
 * renewing extends it, and drops the rows another relay took after the lease ran out (they
 * must not be published twice at once, nor charged by the wrong claim). */
Test(store, renew_extends_the_lease_and_drops_rows_taken_meanwhile)
{
	struct store *a = migrated("renew");
	add("n1", NULL, 0);
	add("n2", NULL, 0);
	struct store_options o1 = opts_for("relay-1", false);
	o1.lease_ms = 2000;
	struct store *r1 = open_store(o1);
	struct store *r2 = open_store(opts_for("relay-2", false));
	struct store_batch b;
	store_batch_init(&b);
	settle(r1);
	cr_assert_eq(store_claim(r1, false, &b), 0, "%s", store_errmsg(r1));
	cr_assert_eq(b.n, 2);
	int64_t left = b.lease_deadline_ms - harness_now_ms();
	cr_assert(left > 0 && left <= 2000, "lease left by the database clock: %lld ms",
	          (long long)left);

	/* Renewed in time: both rows stay ours, for a full lease from now. */
	cr_assert_eq(store_renew(r1, &b), 0, "%s", store_errmsg(r1));
	cr_assert_eq(b.n, 2);
	cr_assert_gt(b.lease_deadline_ms, harness_now_ms() + 1000);

	/* Too late: relay-2 took n1 after the lease ran out; n2 happens to be free again. */
	usleep(2500 * 1000);
	sql(g_admin, "UPDATE %s SET locked_by = 'relay-2#zz.1' WHERE id = 'n1'", g_table);
	cr_assert_eq(store_renew(r1, &b), 0, "%s", store_errmsg(r1));
	cr_assert_eq(b.n, 1, "the row another relay holds is dropped from the batch");
	cr_assert_str_eq(b.rows[0].id, "n2");
	cr_assert_eq(sql_int(g_admin,
	                     "SELECT count(*) FROM %s WHERE id = 'n2' AND locked_by = '%s'",
	                     g_table, b.token),
	             1);
	store_batch_free(&b);
	store_free(r1);
	store_free(r2);
	store_free(a);
}

/* Two handles with the same relay id (two workers of one process, or two relays given one
 * relay.id by mistake) never make the same token, so neither can write the other's rows. */
Test(store, tokens_differ_between_handles_of_one_relay_id)
{
	struct store *a = migrated("tokens");
	add("t1", NULL, 0);
	add("t2", NULL, 0);
	struct store_options o = opts_for("relay-1", false);
	o.batch_size = 1;
	struct store *w1 = open_store(o), *w2 = open_store(o);
	cr_assert_str_eq(claim_str(w1, false), "t1");
	char t1[STORE_TOKEN_MAX];
	snprintf(t1, sizeof(t1), "%s", g_token);
	cr_assert_str_eq(claim_str(w2, false), "t2");
	cr_assert_str_neq(t1, g_token);
	cr_assert_eq(strncmp(t1, "relay-1#", 8), 0, "locked_by starts with the relay id: %s", t1);
	const char *ids[] = { "t1", "t2" };
	cr_assert_eq(store_release(w2, g_token, ids, 2), 0);
	cr_assert_eq(
	        sql_int(g_admin, "SELECT count(*) FROM %s WHERE locked_by IS NOT NULL", g_table), 1,
	        "w2 released its own row only");
	cr_assert_eq(sql_int(g_admin,
	                     "SELECT count(*) FROM %s WHERE id = 't1' AND locked_by = '%s'",
	                     g_table, t1),
	             1);
	store_free(w1);
	store_free(w2);
	store_free(a);
}

Test(store, mark_published_and_delete)
{
	struct store *a = migrated("mark");
	add("p1", NULL, 0);
	add("p2", NULL, 0);
	add("p\"3\\", NULL, 0);
	struct store *r = open_store(opts_for("relay-1", false));
	cr_assert_str_eq(claim_str(r, false), "p1,p2,p\"3\\");
	int64_t seqs[] = { seq_of("p1"), seq_of("p\"3\\") };
	cr_assert_eq(store_mark_published(r, "relay-1#other.1", seqs, 2, false), 0, "%s",
	             store_errmsg(r));
	cr_assert_eq(
	        sql_int(g_admin, "SELECT count(*) FROM %s WHERE published_at IS NOT NULL", g_table),
	        0, "a mark with another claim's token changes nothing");
	cr_assert_eq(store_mark_published(r, g_token, seqs, 2, false), 0, "%s", store_errmsg(r));
	cr_assert_eq(sql_int(g_admin,
	                     "SELECT count(*) FROM %s WHERE published_at IS NOT NULL"
	                     " AND locked_by IS NULL AND locked_until IS NULL",
	                     g_table),
	             2, "both rows marked, and only they");
	long long before =
	        sql_int(g_admin, "SELECT xmin::text::bigint FROM %s WHERE id = 'p1'", g_table);
	cr_assert_eq(store_mark_published(r, g_token, seqs, 1, false), 0);
	cr_assert_eq(sql_int(g_admin, "SELECT xmin::text::bigint FROM %s WHERE id = 'p1'", g_table),
	             before, "an already published row is left alone");
	cr_assert_eq(store_mark_published(r, g_token, seqs, 0, false), 0, "empty mark is a no-op");

	int64_t del[] = { seq_of("p2") };
	size_t hit = 0;
	cr_assert_eq(store_mark_published_send(r, g_token, del, 1, true), 0);
	cr_assert_eq(store_mark_published_recv(r, &hit), 0, "%s", store_errmsg(r));
	cr_assert_eq(hit, 1);
	cr_assert_eq(sql_int(g_admin, "SELECT count(*) FROM %s WHERE id = 'p2'", g_table), 0);
	store_free(r);
	store_free(a);
}

/* A claim that carries the previous batch's mark: one statement leases the new rows and marks
 * (or deletes) the old, fenced by the old claim's token, and says how many it hit. */
Test(store, claim_carries_the_mark_of_the_previous_batch)
{
	struct store *a = migrated("carry");
	add("c1", NULL, 0);
	add("c2", NULL, 0);
	struct store_options o = opts_for("relay-1", false);
	o.batch_size = 16; /* a claim of 2 rows or more is a big one: it carries nothing */
	struct store *r = open_store(o);
	cr_assert_str_eq(claim_str(r, false), "c1,c2");
	cr_assert_not(store_claim_carries_mark(r), "after a claim of an eighth of a batch");
	char t1[STORE_TOKEN_MAX];
	snprintf(t1, sizeof(t1), "%s", g_token);
	add("c3", NULL, 0);
	cr_assert_str_eq(claim_str(r, false), "c3");
	cr_assert(store_claim_carries_mark(r), "after a claim of fewer rows");
	char t3[STORE_TOKEN_MAX];
	snprintf(t3, sizeof(t3), "%s", g_token);
	add("c4", NULL, 0);

	struct store_batch b;
	store_batch_init(&b);
	int64_t seqs[] = { seq_of("c1"), seq_of("c3") };
	/* c1 under t1, c3 under t3: a mark under t1 hits c1 alone. */
	cr_assert_eq(store_claim_mark_send(r, false, t1, seqs, 2, false), 0, "%s", store_errmsg(r));
	cr_assert_eq(store_claim_recv(r, &b), 0, "%s", store_errmsg(r));
	cr_assert_eq(b.n, 1);
	cr_assert_str_eq(b.rows[0].id, "c4", "the claim leased the new row");
	cr_assert_eq(store_claim_marked(r), 1, "the mark is fenced by its token");
	cr_assert_eq(sql_int(g_admin,
	                     "SELECT count(*) FROM %s WHERE id = 'c1' AND published_at IS NOT NULL"
	                     " AND locked_by IS NULL AND locked_until IS NULL",
	                     g_table),
	             1, "c1 is published, its lease cleared");
	cr_assert_eq(sql_int(g_admin,
	                     "SELECT count(*) FROM %s WHERE published_at IS NULL"
	                     " AND locked_by IS NOT NULL",
	                     g_table),
	             3, "c2 and c3 keep their leases, c4 has its own");

	/* The delete, with nothing left to claim: the full claim still answers. */
	int64_t del[] = { seq_of("c3") };
	cr_assert_eq(store_claim_mark_send(r, false, t3, del, 1, true), 0, "%s", store_errmsg(r));
	cr_assert_eq(store_claim_recv(r, &b), 0, "%s", store_errmsg(r));
	cr_assert_eq(b.n, 0);
	cr_assert_eq(store_claim_marked(r), 1);
	cr_assert_eq(sql_int(g_admin, "SELECT count(*) FROM %s WHERE id = 'c3'", g_table), 0);

	/* A plain claim afterwards says it marked nothing. */
	cr_assert_eq(store_claim(r, false, &b), 0, "%s", store_errmsg(r));
	cr_assert_eq(store_claim_marked(r), 0);
	store_batch_free(&b);
	store_free(r);
	store_free(a);
}

/* Which claim the session named app ran last, by the statement text pg_stat_activity keeps
 * for an idle session: 1 the lean claim (no keyed part: no recursive CTE), 0 the full one, -1
 * anything else. */
static int last_claim_lean(const char *app)
{
	return (int)sql_int(
	        g_admin,
	        "SELECT CASE WHEN query LIKE 'WITH RECURSIVE %%' THEN 0"
	        " WHEN query LIKE 'WITH disarm AS %%' OR query LIKE 'WITH durable AS %%'"
	        " THEN 1 ELSE -1 END FROM pg_stat_activity WHERE application_name = '%s'"
	        " AND state = 'idle'",
	        app);
}

Test(store, a_small_claim_leaves_the_keys_out_while_no_keyed_row_waits)
{
	struct store *a = migrated("lean");
	char app[64]; /* at most 63 bytes reach pg_stat_activity */
	snprintf(app, sizeof(app), "lean %.50s", g_table);
	struct store_options o = opts_for("relay-1", false);
	o.application_name = app;
	o.batch_size = 16;
	struct store *r = open_store(o);

	add("u1", NULL, 0);
	cr_assert_str_eq(claim_str(r, false), "u1");
	cr_assert_eq(last_claim_lean(app), 0, "the first claim looks at the keys: none known yet");
	add("u2", NULL, 0);
	cr_assert_str_eq(claim_str(r, false), "u2");
	cr_assert_eq(last_claim_lean(app), 1, "no keyed row waited: the keys are left out");

	/* A keyed row alone: the lean claim sees it in the key index, leases nothing, and the
	 * full claim takes it in the same call. */
	add("k1", "key-a", 0);
	cr_assert_str_eq(claim_str(r, false), "k1", "the keyed row waited for another claim");
	cr_assert_eq(last_claim_lean(app), 0);
	char tk1[STORE_TOKEN_MAX];
	snprintf(tk1, sizeof(tk1), "%s", g_token);

	/* k1 is leased, not published: its key still counts. */
	add("u3", NULL, 0);
	cr_assert_str_eq(claim_str(r, false), "u3");
	cr_assert_eq(last_claim_lean(app), 0, "k1 is not published yet");
	char tu3[STORE_TOKEN_MAX];
	snprintf(tu3, sizeof(tu3), "%s", g_token);
	int64_t k1 = seq_of("k1");
	cr_assert_eq(store_mark_published(r, tk1, &k1, 1, false), 0, "%s", store_errmsg(r));
	cr_assert_str_eq(claim_str(r, false), "");
	cr_assert_eq(last_claim_lean(app), 0, "the claim after k1's mark looks once more");

	/* The lean claim carries a mark, and a keyed row that comes with unkeyed ones is taken by
	 * the claim after it. */
	add("u4", NULL, 0);
	add("k2", "key-b", 0);
	settle(r);
	struct store_batch b;
	store_batch_init(&b);
	int64_t u3 = seq_of("u3");
	cr_assert_eq(store_claim_mark_send(r, false, tu3, &u3, 1, false), 0, "%s", store_errmsg(r));
	cr_assert_eq(store_claim_recv(r, &b), 0, "%s", store_errmsg(r));
	cr_assert_eq(last_claim_lean(app), 1, "the carrying claim is lean too");
	cr_assert_eq(store_claim_marked(r), 1);
	cr_assert_eq(b.n, 1);
	cr_assert_str_eq(b.rows[0].id, "u4");
	cr_assert_eq(sql_int(g_admin,
	                     "SELECT count(*) FROM %s WHERE id = 'u3' AND published_at IS NOT NULL",
	                     g_table),
	             1);
	store_batch_free(&b);
	cr_assert_str_eq(claim_str(r, false), "k2", "the keyed row waited for more than one claim");
	cr_assert_eq(last_claim_lean(app), 0);
	store_free(r);
	store_free(a);
}

/* The relay's session takes each statement's generic plan from its first run: left to
 * itself, PostgreSQL plans a prepared statement's first five runs anew, and went on planning
 * the claim of a full batch and the mark of a few rows for every run. */
Test(store, the_relay_session_plans_each_statement_once)
{
	struct store *a = migrated("generic");
	char id[16];
	for (int i = 0; i < 24; i++) {
		snprintf(id, sizeof(id), "g%d", i);
		add(id, NULL, 0);
	}
	struct store_options o = opts_for("relay-1", false);
	o.batch_size = 4; /* a claim of 4 is a big one: the full claim, then ST_CLAIM */
	struct store *r = open_store(o);
	struct store_batch b;
	store_batch_init(&b);
	size_t total = 0;
	for (int i = 0; i < 12; i++) {
		cr_assert_eq(store_claim(r, false, &b), 0, "%s", store_errmsg(r));
		int64_t seqs[4];
		for (size_t k = 0; k < b.n; k++)
			seqs[k] = b.rows[k].seq;
		if (b.n > 0)
			cr_assert_eq(store_mark_published(r, b.token, seqs, b.n, false), 0, "%s",
			             store_errmsg(r));
		total += b.n;
	}
	store_batch_free(&b);
	cr_assert_eq(total, 24);

	PGresult *res = NULL;
	cr_assert_eq(
	        store_exec(r,
	                   "SELECT name || ' ' || generic_plans || '/' || custom_plans"
	                   " FROM pg_prepared_statements WHERE generic_plans + custom_plans > 0"
	                   " ORDER BY name",
	                   0, NULL, PGRES_TUPLES_OK, &res, "reading the plans"),
	        0, "%s", store_errmsg(r));
	int big = 0, mark = 0;
	for (int i = 0; i < PQntuples(res); i++) {
		const char *row = PQgetvalue(res, i, 0);
		cr_assert(strstr(row, "/0") && strstr(row, "/0")[2] == '\0',
		          "planned anew for a run: %s", row);
		big += strncmp(row, "outbox_claim ", 13) == 0;
		mark += strncmp(row, "outbox_mark ", 12) == 0;
	}
	PQclear(res);
	cr_assert(big && mark, "the big claim and the mark ran");
	store_free(r);
	store_free(a);
}

Test(store, mark_failed_is_fenced_and_records_the_failure)
{
	struct store *a = migrated("fail");
	add("f1", NULL, 0);
	add("f2", NULL, 0);
	add("f3", NULL, 0);
	struct store *r1 = open_store(opts_for("relay-1", false));
	struct store *r2 = open_store(opts_for("relay-2", false));
	cr_assert_str_eq(claim_str(r1, false), "f1,f2,f3");

	/* 1500 characters of two bytes each: cut at 1000 characters, not bytes. */
	static char longerr[3100];
	for (int i = 0; i < 1500; i++)
		memcpy(longerr + 2 * i, "\xc3\xa9", 2);
	longerr[3000] = '\0';
	struct store_failure f[] = {
		{ .id = "f1", .error = longerr, .delay_ms = 60000, .dead = false },
		{ .id = "f2", .error = "bad \"json\"\xff", .delay_ms = 0, .dead = true },
	};
	size_t changed = 99;
	cr_assert_eq(store_mark_failed(r2, "relay-2#x.1", f, 2, &changed), 0, "%s",
	             store_errmsg(r2));
	cr_assert_eq(changed, 0, "another relay cannot touch rows it does not hold");
	cr_assert_eq(store_mark_failed(r1, "relay-1#x.1", f, 2, &changed), 0, "%s",
	             store_errmsg(r1));
	cr_assert_eq(changed, 0, "nor another claim of the same relay id");
	cr_assert_eq(store_mark_failed(r1, g_token, f, 2, &changed), 0, "%s", store_errmsg(r1));
	cr_assert_eq(changed, 2);
	cr_assert_eq(sql_int(g_admin,
	                     "SELECT count(*) FROM %s WHERE id = 'f1' AND attempts = 1"
	                     " AND char_length(last_error) = 1000 AND locked_by IS NULL"
	                     " AND locked_until IS NULL"
	                     " AND available_at > now() + interval '50 seconds'",
	                     g_table),
	             1);
	cr_assert_eq(sql_int(g_admin,
	                     "SELECT count(*) FROM %s WHERE id = 'f2' AND attempts = 3"
	                     " AND last_error = 'bad \"json\"?' AND locked_by IS NULL",
	                     g_table),
	             1, "dead: attempts = max_attempts, invalid UTF-8 replaced");
	/* f1 waits in backoff, f2 is dead, f3 still leased: nothing to claim. */
	cr_assert_str_eq(claim_str(r2, false), "");
	store_free(r1);
	store_free(r2);
	store_free(a);
}

Test(store, release_is_fenced_and_keeps_attempts)
{
	struct store *a = migrated("release");
	add("r1", NULL, 0);
	add("r2", NULL, 0);
	add("r3", NULL, 0);
	sql(g_admin, "UPDATE %s SET attempts = 2 WHERE id = 'r1'", g_table);
	struct store *x = open_store(opts_for("relay-1", false));
	struct store *y = open_store(opts_for("relay-2", false));
	cr_assert_str_eq(claim_str(x, false), "r1,r2,r3");
	const char *ids[] = { "r1" };
	cr_assert_eq(store_release(y, "relay-2#a.1", ids, 1), 0);
	cr_assert_eq(store_release_all(y), 0);
	cr_assert_eq(sql_int(g_admin, "SELECT count(*) FROM %s WHERE locked_by LIKE 'relay-1#%%'",
	                     g_table),
	             3, "another relay id releases nothing");
	/* The same relay id on another handle (a second process given it by mistake): its
	 * nonce differs, and its shutdown's sweep releases nothing of x's. */
	struct store *twin = open_store(opts_for("relay-1", false));
	cr_assert_eq(store_release_all(twin), 0, "%s", store_errmsg(twin));
	cr_assert_eq(sql_int(g_admin, "SELECT count(*) FROM %s WHERE locked_by LIKE 'relay-1#%%'",
	                     g_table),
	             3, "a handle with the same relay id released another's claims");
	store_free(twin);
	cr_assert_eq(store_release(x, g_token, ids, 1), 0, "%s", store_errmsg(x));
	cr_assert_eq(sql_int(g_admin,
	                     "SELECT count(*) FROM %s WHERE id = 'r1' AND locked_by IS NULL"
	                     " AND locked_until IS NULL AND attempts = 2",
	                     g_table),
	             1);
	cr_assert_eq(store_release_all(x), 0, "%s", store_errmsg(x));
	cr_assert_eq(
	        sql_int(g_admin, "SELECT count(*) FROM %s WHERE locked_by IS NOT NULL", g_table),
	        0);
	cr_assert_str_eq(claim_str(y, false), "r1,r2,r3");
	store_free(x);
	store_free(y);
	store_free(a);
}

Test(store, ordering_keys_head_only_and_failed_head_blocks_its_key)
{
	struct store *a = migrated("keys");
	add("a1", "A", 0);
	add("a2", "A", 0);
	add("b1", "B", 0);
	add("u1", NULL, 0);
	add("b2", "B", 0);
	wait_rows_settled();
	struct store *r = open_store(opts_for("relay-1", false));
	cr_assert_str_eq(claim_str(r, false), "a1,b1,u1", "only the head of each key");
	char first[STORE_TOKEN_MAX];
	snprintf(first, sizeof(first), "%s", g_token);
	cr_assert_str_eq(claim_str(r, false), "",
	                 "a key's next row waits while its head is leased");

	int64_t pa[] = { seq_of("a1") };
	cr_assert_eq(store_mark_published(r, first, pa, 1, false), 0);
	cr_assert_str_eq(claim_str(r, false), "a2", "next row after the head is published");

	struct store_failure f = { .id = "b1", .error = "nack", .delay_ms = 60000 };
	size_t changed = 0;
	cr_assert_eq(store_mark_failed(r, first, &f, 1, &changed), 0);
	cr_assert_eq(changed, 1);
	add("c1", "C", 0);
	add("u2", NULL, 0);
	wait_rows_settled();
	cr_assert_str_eq(claim_str(r, false), "c1,u2",
	                 "a failed head blocks its key through backoff, not other keys");
	store_free(r);
	store_free(a);
}

/* A claim looks at a batch's worth of keys (64 at least) and the next one goes on from there:
 * a ready key behind 150 keys whose heads are delayed is found by the round's later claims,
 * and the round then ends (the keys ran out) so that the next one starts from the first key. */
Test(store, claims_go_round_the_keys_a_few_at_a_time)
{
	struct store *a = migrated("round");

	sql(g_admin,
	    "INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key, available_at)"
	    " SELECT 'd' || g, 'ex', 'rk', '{}', 'k' || lpad(g::text, 3, '0'),"
	    " now() + interval '1 hour' FROM generate_series(1, 150) g",
	    g_table);
	add("z1", "z-last", 0);
	add("z2", "z-last", 0);
	wait_rows_settled();
	struct store_options o = opts_for("relay-1", false);
	o.batch_size = 10;
	struct store *r = open_store(o);

	store_keys_restart(r);
	cr_assert_str_eq(claim_str(r, false), "", "the first 64 keys have nothing ready");
	cr_assert(store_keys_more(r), "the round has keys left");
	store_set_claim_floor(r, STORE_FLOOR_KEYS_ONLY);
	cr_assert_str_eq(claim_str(r, false), "z1", "the rest of the keys, up to the last");
	cr_assert_not(store_keys_more(r), "the keys ran out: the next claim starts over");
	store_set_claim_floor(r, 0);
	/* A new round from the first key: nothing new is ready and z2 waits behind z1. */
	cr_assert_str_eq(claim_str(r, false), "");
	cr_assert(store_keys_more(r));
	add("u1", "k001", 0); /* behind the delayed head of k001: not claimable */
	add("u2", NULL, 0);
	wait_rows_settled();
	cr_assert_str_eq(claim_str(r, false), "u2", "unkeyed rows are claimed mid-round");
	cr_assert(store_keys_more(r), "keys 65-128 were looked at: the round goes on");
	/* A claim that leases rows carries the round's cursor as one that leases none does. */
	add("u3", NULL, 0);
	wait_rows_settled();
	cr_assert_str_eq(claim_str(r, false), "u3");
	cr_assert_not(store_keys_more(r), "the rest of the keys were looked at: the round ends");
	store_free(r);
	store_free(a);
}

Test(store, dead_head_blocks_under_strict_not_under_skip_dead)
{
	struct store *a = migrated("dead");
	add("d1", "K", 0);
	add("d2", "K", 0);
	sql(g_admin, "UPDATE %s SET attempts = 3 WHERE id = 'd1'", g_table);
	wait_rows_settled();
	struct store *strict = open_store(opts_for("relay-1", false));
	cr_assert_str_eq(claim_str(strict, false), "", "strict: a dead head blocks its key");
	struct store_options o = opts_for("relay-2", false);
	o.skip_dead = true;
	struct store *skip = open_store(o);
	cr_assert_str_eq(claim_str(skip, false), "d2", "skip-dead: the key moves on");
	store_free(strict);
	store_free(skip);
	store_free(a);
}

Test(store, keyed_rows_wait_for_open_and_older_transactions)
{
	struct store *a = migrated("xmin");
	struct store *r = open_store(opts_for("relay-1", false));
	PGconn *older = harness_pg_connect(), *newer = harness_pg_connect();
	char err[256];
	struct outbox_message m = { .id = "open1",
		                    .exchange = "ex",
		                    .routing_key = "rk",
		                    .body = "x",
		                    .body_len = 1,
		                    .ordering_key = "K" };

	/* A row of a transaction still open is invisible. */
	sql(newer, "BEGIN");
	cr_assert_eq(outbox_add(newer, g_table, &m, err, sizeof(err)), OUTBOX_ADDED, "%s", err);
	cr_assert_str_eq(claim_str(r, false), "");
	sql(newer, "COMMIT");
	wait_rows_settled();
	cr_assert_str_eq(claim_str(r, false), "open1");

	/* An older transaction that has drawn a seq is still open: a keyed row that a newer
	 * transaction committed waits for it (the older one holds an earlier seq and may still
	 * commit a row of the key with it); unkeyed rows do not wait. */
	sql(older, "BEGIN");
	m.id = "early1";
	m.ordering_key = "E";
	cr_assert_eq(outbox_add(older, g_table, &m, err, sizeof(err)), OUTBOX_ADDED, "%s", err);
	m.id = "late1";
	m.ordering_key = "L";
	cr_assert_eq(outbox_add(newer, g_table, &m, err, sizeof(err)), OUTBOX_ADDED, "%s", err);
	m.id = "free1";
	m.ordering_key = NULL;
	cr_assert_eq(outbox_add(newer, g_table, &m, err, sizeof(err)), OUTBOX_ADDED, "%s", err);
	cr_assert_str_eq(claim_str(r, false), "free1");
	usleep(200 * 1000);
	cr_assert_str_eq(claim_str(r, false), "", "held back while the older transaction runs");
	sql(older, "COMMIT");
	cr_assert_str_eq(claim_str(r, false), "early1,late1");

	/* A transaction that has drawn a seq but has no transaction id yet — the moment inside
	 * a producer's first INSERT between the identity's nextval() and the txid default, made
	 * to last here with a bare nextval() — holds back keyed rows committed after it: it may
	 * still commit a row of their key with the earlier seq. (Comparing transaction ids with
	 * the snapshot's xmin misses it: it has none.) */
	sql(older, "BEGIN");
	int64_t early_seq =
	        sql_int(older, "SELECT nextval(pg_get_serial_sequence('%s', 'seq'))", g_table);
	cr_assert_eq(sql_int(older, "SELECT (pg_current_xact_id_if_assigned() IS NULL)::int"), 1,
	             "the drawing transaction has no transaction id");
	m.id = "k2";
	m.ordering_key = "K2";
	cr_assert_eq(outbox_add(newer, g_table, &m, err, sizeof(err)), OUTBOX_ADDED, "%s", err);
	for (int i = 0; i < 5; i++)
		cr_assert_str_eq(claim_str(r, false), "",
		                 "a keyed row waits while an earlier seq may still commit");
	sql(older,
	    "INSERT INTO %s (seq, id, exchange_name, routing_key, body, ordering_key)"
	    " OVERRIDING SYSTEM VALUE VALUES (%lld, 'k1', 'ex', 'rk', 'x', 'K2')",
	    g_table, (long long)early_seq);
	sql(older, "COMMIT");
	cr_assert_str_eq(claim_str(r, false), "k1", "the earlier row of the key goes first");
	PQfinish(older);
	PQfinish(newer);
	store_free(r);
	store_free(a);
}

Test(store, delayed_rows_are_not_claimed_yet)
{
	struct store *a = migrated("delay");
	add("later", NULL, 60000);
	add("now", NULL, 0);
	struct store *r = open_store(opts_for("relay-1", false));
	cr_assert_str_eq(claim_str(r, false), "now");
	sql(g_admin, "UPDATE %s SET available_at = now() - interval '1 second'", g_table);
	cr_assert_str_eq(claim_str(r, false), "later");
	store_free(r);
	store_free(a);
}

/* Waits up to ms for input on the store's socket, then drains it. */
static bool woken_within(struct store *s, int ms)
{
	bool woken = false;
	int waited = 0;

	while (!woken && waited <= ms) {
		struct pollfd p = { .fd = store_socket(s), .events = POLLIN };
		cr_assert_geq(p.fd, 0);
		poll(&p, 1, 50);
		waited += 50;
		cr_assert_eq(store_consume_input(s, &woken), 0, "%s", store_errmsg(s));
	}
	return woken;
}

Test(store, armed_lock_notifies_and_disarmed_does_not)
{
	struct store *a = migrated("wake");
	struct store *r = open_store(opts_for("relay-1", false));
	struct store *r2 = open_store(opts_for("relay-2", false));

	cr_assert(store_wakeup_current(r), "migrate installed this version's trigger");
	add("w0", NULL, 0);
	cr_assert_not(woken_within(r, 300), "not armed: a commit does not notify");
	cr_assert_eq(store_arm(r), 1, "%s", store_errmsg(r));
	cr_assert_eq(harness_wakeup_holders(g_admin, g_table), 1);
	add("w1", NULL, 0);
	cr_assert(woken_within(r, 15000), "armed: the producer's INSERT notifies");
	/* Another relay finds the lock taken: the notifications reach it too. */
	cr_assert_eq(store_arm(r2), 0, "%s", store_errmsg(r2));
	add("w2", NULL, 0);
	cr_assert(woken_within(r2, 15000), "every listening relay is woken");
	cr_assert(woken_within(r, 15000));

	/* The claim after a wake lets the lock go in the same statement. */
	cr_assert_str_eq(claim_str(r, true), "w0,w1,w2");
	cr_assert_eq(harness_wakeup_holders(g_admin, g_table), 0);
	add("w3", NULL, 0);
	cr_assert_not(woken_within(r, 300), "disarmed: no notification");

	/* The lock ends with its session: a relay that dies stops the notifications. */
	cr_assert_eq(store_arm(r2), 1, "%s", store_errmsg(r2));
	cr_assert_eq(store_arm(r2), 1, "arming twice takes it once");
	store_free(r2);
	for (int i = 0; i < 100 && harness_wakeup_holders(g_admin, g_table) > 0; i++)
		usleep(50 * 1000);
	cr_assert_eq(harness_wakeup_holders(g_admin, g_table), 0,
	             "the server let the dead session's lock go");
	add("w4", NULL, 0);
	cr_assert_not(woken_within(r, 300), "nobody armed: no notification");

	/* store_disarm() lets it go without claiming. */
	cr_assert_eq(store_arm(r), 1);
	cr_assert_eq(store_disarm(r), 0, "%s", store_errmsg(r));
	cr_assert_eq(harness_wakeup_holders(g_admin, g_table), 0);
	store_free(r);
	store_free(a);
}

/* After a claim that leased rows, the next claim is the UPDATE that keeps its rows once
 * (statements.c): it lets the wake-up lock go as the full claim does. */
Test(store, a_claim_after_a_batch_lets_the_wakeup_lock_go_too)
{
	struct store *a = migrated("wakefast");
	struct store_options o = opts_for("relay-1", false);
	o.batch_size = 8;
	struct store *r = open_store(o);

	add("f1", NULL, 0);
	cr_assert_str_eq(claim_str(r, false), "f1");
	cr_assert_eq(store_arm(r), 1, "%s", store_errmsg(r));
	cr_assert_eq(harness_wakeup_holders(g_admin, g_table), 1);
	add("f2", NULL, 0);
	cr_assert_str_eq(claim_str(r, true), "f2");
	cr_assert_eq(harness_wakeup_holders(g_admin, g_table), 0,
	             "the claim let the wake-up lock go");
	/* ... and so does the full claim that follows one that leased nothing. */
	cr_assert_eq(store_arm(r), 1, "%s", store_errmsg(r));
	cr_assert_str_eq(claim_str(r, true), "");
	cr_assert_eq(harness_wakeup_holders(g_admin, g_table), 0,
	             "the empty claim let the wake-up lock go");
	store_free(r);
	store_free(a);
}

/* A producer tests the lock when its INSERT ends, not when it commits: one that tested before
 * the relay armed does not notify. The relay's way round it: after arming, it settles the
 * watermark (every transaction that held a seq then has ended) before its last claim, which
 * then sees the row. */
Test(store, a_producer_that_tested_before_the_arm_is_caught_by_settling)
{
	struct store *a = migrated("wake_race");
	struct store *r = open_store(opts_for("relay-1", false));
	PGconn *producer = harness_pg_connect();
	struct outbox_message m = {
		.id = "early", .exchange = "ex", .routing_key = "rk", .body = "x", .body_len = 1
	};
	char err[256];

	sql(producer, "BEGIN");
	cr_assert_eq(outbox_add(producer, g_table, &m, err, sizeof(err)), OUTBOX_ADDED, "%s", err);
	cr_assert_eq(store_arm(r), 1, "%s", store_errmsg(r));
	cr_assert_eq(store_settle_watermark(r), 1, "the producer is still open");
	sql(producer, "COMMIT");
	cr_assert_not(woken_within(r, 300), "it tested before the arm: no notification");
	cr_assert_eq(store_settle_watermark(r), 0, "%s", store_errmsg(r));
	cr_assert_str_eq(claim_str(r, true), "early", "the claim after settling sees it");
	PQfinish(producer);
	store_free(r);
	store_free(a);
}

/* A read of up to 10 rows above `after`, up to the fence, the lock list read: the cursor's
 * read as it was before it read past the fence (position_ask). */
#define ASK(after_, fence_)                        \
	((struct position_ask){ .after = (after_), \
	                        .fence = (fence_), \
	                        .limit = 10,       \
	                        .bounded = true,   \
	                        .sample = true })

/* The cursor's read after a quiet spell is given a stale fence (the last read's sample). The
 * sample its first statement takes, just before the read, settles a W nobody holds, so the read
 * finds the row committed meanwhile at once. While a producer holds a seq below a committed
 * row, the read keeps to the fence it was given, and finds both once the producer commits. */
Test(store, cursor_read_goes_up_to_a_watermark_nobody_holds)
{
	struct store *a = migrated("pos_fresh");
	struct store *r = open_store(opts_for("relay-1", false));
	PGconn *producer = harness_pg_connect();
	struct outbox_message m = {
		.id = "held", .exchange = "ex", .routing_key = "rk", .body = "x", .body_len = 1
	};
	struct store_batch b = { 0 };
	struct position_seen *seen = NULL;
	size_t cap = 0;
	int64_t used = -1, fence;
	char err[256];

	add("quiet", NULL, 0);
	cr_assert_eq(position_read(r, NULL, &ASK(0, 0), &b, &seen, &cap, &used), 0, "%s",
	             store_errmsg(r));
	cr_assert_eq(b.n, 1, "the row committed while the relay was idle, read at once");
	cr_assert_str_eq(b.rows[0].id, "quiet");
	cr_assert_geq(used, b.rows[0].seq);

	fence = used;
	sql(producer, "BEGIN");
	cr_assert_eq(outbox_add(producer, g_table, &m, err, sizeof(err)), OUTBOX_ADDED, "%s", err);
	add("after", NULL, 0);
	cr_assert_eq(position_read(r, NULL, &ASK(fence, fence), &b, &seen, &cap, &used), 0, "%s",
	             store_errmsg(r));
	cr_assert_eq(b.n, 0, "a producer holds a seq below 'after': nothing may be read past it");
	cr_assert_eq(used, fence, "the fence may not move while the sequence is held");

	sql(producer, "COMMIT");
	cr_assert_eq(position_read(r, NULL, &ASK(fence, fence), &b, &seen, &cap, &used), 0, "%s",
	             store_errmsg(r));
	cr_assert_eq(b.n, 2, "both rows, once the producer has committed");
	cr_assert_str_eq(b.rows[0].id, "held");
	cr_assert_str_eq(b.rows[1].id, "after");
	store_batch_free(&b);
	free(seen);
	PQfinish(producer);
	store_free(r);
	store_free(a);
}

/* The cursor's read past the fence, and without the lock list. Unbounded, it returns the rows
 * above `after` whatever the fence (the cursor decides which may go); without the sample its
 * first statement reads W alone (or there is none) and settles nothing, even when nobody holds
 * the sequence (a lock list not read says nothing of who holds it); with it, W is settled once
 * nobody does. */
Test(store, cursor_read_past_the_fence_and_without_the_lock_list)
{
	struct store *a = migrated("pos_past");
	struct store *r = open_store(opts_for("relay-1", false));
	PGconn *producer = harness_pg_connect();
	struct outbox_message m = {
		.id = "held", .exchange = "ex", .routing_key = "rk", .body = "x", .body_len = 1
	};
	struct store_batch b = { 0 };
	struct position_seen *seen = NULL;
	size_t cap = 0;
	int64_t used = -1, fence, after;
	struct position_ask ask;
	char err[256];

	cr_assert_eq(position_read(r, NULL, &ASK(0, 0), &b, &seen, &cap, &used), 0, "%s",
	             store_errmsg(r));
	fence = used;
	/* A failed assertion leaves it open: the server ends it, and the table is not left locked. */
	sql(producer, "SET idle_in_transaction_session_timeout = '20s'");
	sql(producer, "BEGIN");
	cr_assert_eq(outbox_add(producer, g_table, &m, err, sizeof(err)), OUTBOX_ADDED, "%s", err);
	add("after", NULL, 0);
	after = sql_int(g_admin, "SELECT seq FROM %s WHERE id = 'after'", g_table);

	ask = (struct position_ask){ .after = fence, .fence = fence, .limit = 10, .w = true };
	cr_assert_eq(position_read(r, NULL, &ask, &b, &seen, &cap, &used), 0, "%s",
	             store_errmsg(r));
	cr_assert_eq(b.n, 1, "the committed row above the held seq, past the fence");
	cr_assert_str_eq(b.rows[0].id, "after");
	cr_assert_eq(used, fence, "no lock list read: no fence settled");
	cr_assert_geq(store_watermark_seen(r), after, "W is read without the lock list");

	ask.sample = true;
	cr_assert_eq(position_read(r, NULL, &ask, &b, &seen, &cap, &used), 0, "%s",
	             store_errmsg(r));
	cr_assert_eq(b.n, 1);
	cr_assert_eq(used, fence, "the producer holds the sequence: the fence stays");

	sql(producer, "COMMIT");
	ask.sample = ask.w = false;
	cr_assert_eq(position_read(r, NULL, &ask, &b, &seen, &cap, &used), 0, "%s",
	             store_errmsg(r));
	cr_assert_eq(b.n, 2, "both rows, once the producer has committed");
	cr_assert_str_eq(b.rows[0].id, "held");
	cr_assert_eq(used, fence, "nobody holds the sequence, but the lock list was not read");
	cr_assert_eq(store_watermark_safe(r), fence);

	ask.sample = true;
	cr_assert_eq(position_read(r, NULL, &ask, &b, &seen, &cap, &used), 0, "%s",
	             store_errmsg(r));
	cr_assert_geq(used, after, "sampled with nobody holding the sequence: W settled at once");
	store_batch_free(&b);
	free(seen);
	PQfinish(producer);
	store_free(r);
	store_free(a);
}

static long long position_of(void)
{
	return sql_int(g_admin, "SELECT position FROM %s_position WHERE stream = 'main'", g_table);
}

/* A read may carry the move past the batch before it, in its round trip and its transaction:
 * the position moves and the rows above are read. A move from a position that is no longer
 * the table's writes nothing, reads nothing, and says another relay leads. */
Test(store, cursor_read_carries_the_move)
{
	struct store *a = migrated("pos_carry");
	struct store *r = open_store(opts_for("relay-1", false));
	struct store_batch b = { 0 };
	struct position_seen *seen = NULL;
	size_t cap = 0;
	int64_t pos = -1, used = -1, second;
	struct position_carry carry;

	add("m1", NULL, 0);
	add("m2", NULL, 0);
	cr_assert_eq(position_lead(r, &pos), 1, "%s", store_errmsg(r));
	cr_assert_eq(position_read(r, NULL, &ASK(pos, pos), &b, &seen, &cap, &used), 0, "%s",
	             store_errmsg(r));
	cr_assert_eq(b.n, 2);
	second = b.rows[1].seq;
	add("m3", NULL, 0);

	carry = (struct position_carry){ .from = pos, .to = second };
	cr_assert_eq(position_read(r, &carry, &ASK(second, used), &b, &seen, &cap, &used), 0, "%s",
	             store_errmsg(r));
	cr_assert_eq(carry.moved, 1);
	cr_assert_eq(position_of(), second, "the move landed with the read");
	cr_assert_eq(b.n, 1);
	cr_assert_str_eq(b.rows[0].id, "m3");

	carry = (struct position_carry){ .from = pos, .to = b.rows[0].seq };
	cr_assert_eq(position_read(r, &carry, &ASK(b.rows[0].seq, used), &b, &seen, &cap, &used), 0,
	             "%s", store_errmsg(r));
	cr_assert_eq(carry.moved, 0, "the position was no longer where this move starts");
	cr_assert_eq(b.n, 0, "no rows read for a relay that does not lead");
	cr_assert_eq(position_of(), second, "nothing written");
	cr_assert(strstr(store_errmsg(r), "another relay leads"), "%s", store_errmsg(r));
	store_batch_free(&b);
	free(seen);
	store_free(r);
	store_free(a);
}

/* A pipeline asked of a connection with a request still in flight is refused by libpq: the
 * request is a clear error on that connection, which is given up (its state is unknown); a
 * new connection then reads. */
Test(store, a_pipeline_on_a_busy_connection_is_a_connection_error)
{
	struct store *a = migrated("pipe_busy");
	struct store_options o = opts_for("relay-1", false);
	struct store *r;
	struct store_batch b = { 0 };
	struct position_seen *seen = NULL;
	size_t cap = 0;
	int64_t pos = -1, used = -1;
	PGresult *res[1];
	struct store_call call = { .name = "no_such_statement", .nparams = 0, .params = NULL };

	o.cursor = true;
	r = open_store(o);
	add("m1", NULL, 0);
	cr_assert_eq(position_lead(r, &pos), 1, "%s", store_errmsg(r));
	cr_assert_eq(PQsendQuery(r->conn, "SELECT 1"), 1);
	cr_assert_eq(store_exec_calls(r, &call, res, 1, "busy"), STORE_ERR_CONN);
	cr_assert(strstr(store_errmsg(r), "busy: the connection was busy"), "%s", store_errmsg(r));
	cr_assert_null(res[0]);
	cr_assert_not(store_connected(r), "the busy connection was given up");
	cr_assert_eq(store_connect(r), 0, "%s", store_errmsg(r));
	cr_assert_eq(position_read(r, NULL, &ASK(pos, pos), &b, &seen, &cap, &used), 0, "%s",
	             store_errmsg(r));
	cr_assert_eq(b.n, 1, "the next connection reads");
	store_batch_free(&b);
	free(seen);
	store_free(r);
	store_free(a);
}

struct carried_read {
	struct store *r;
	struct position_carry carry;
	struct store_batch b;
	struct position_seen *seen;
	size_t cap;
	int64_t used;
	int rc;
};

static void *carried_read_main(void *arg)
{
	struct carried_read *cr = arg;

	cr->rc = position_read(cr->r, &cr->carry, &ASK(cr->carry.from, cr->carry.from), &cr->b,
	                       &cr->seen, &cr->cap, &cr->used);
	return NULL;
}

/* The read's transaction begins with the statements before it (the move's, the fence's); a row
 * committed after that began has an available_at (its producer's now()) later than the read's
 * now(), yet it is due: it is read as due, not set aside as delayed. Here the move waits on the
 * position row, locked by another session, while a producer commits a row. */
Test(store, a_row_committed_after_the_read_began_is_due)
{
	struct store *a = migrated("pos_clock");
	struct store *r = open_store(opts_for("relay-1", false));
	PGconn *locker = harness_pg_connect();
	struct carried_read cr = { .r = r };
	int64_t pos = -1;
	pthread_t th;
	int pid;

	cr_assert_eq(position_lead(r, &pos), 1, "%s", store_errmsg(r));
	pid = PQbackendPID(r->conn);
	sql(locker, "BEGIN");
	sql(locker, "SELECT 1 FROM %s_position WHERE stream = 'main' FOR UPDATE", g_table);
	cr.carry = (struct position_carry){ .from = pos, .to = pos };
	cr_assert_eq(pthread_create(&th, NULL, carried_read_main, &cr), 0);
	for (int i = 0; i < 3000 && !sql_int(g_admin,
	                                     "SELECT count(*) FROM pg_stat_activity WHERE pid = %d"
	                                     " AND wait_event_type = 'Lock'",
	                                     pid);
	     i++)
		usleep(10000);
	add("late", NULL, 0);
	sql(locker, "COMMIT");
	pthread_join(th, NULL);
	cr_assert_eq(cr.rc, 0, "%s", store_errmsg(r));
	cr_assert_eq(cr.carry.moved, 1);
	cr_assert_eq(cr.b.n, 1, "the row committed while the move waited");
	cr_assert_not(cr.seen[0].later, "a row due when it was read is not set aside as later");
	store_batch_free(&cr.b);
	free(cr.seen);
	PQfinish(locker);
	store_free(r);
	store_free(a);
}

/* Advisory locks the producers' session (g_admin) holds: the wake-up's shared one must be let
 * go by the same statement that took it, or no relay could arm while a producer is connected. */
static long long producer_advisory_locks(void)
{
	return sql_int(g_admin, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
	                        " AND pid = pg_backend_pid()");
}

/* The wake-up migrate installed: a relay counts it current, and a producer's INSERT holds no
 * lock afterwards, wakes no relay that does not wait, and wakes one that does. */
static void expect_wakeup_after_migrate(void)
{
	struct store *r = open_store(opts_for("relay-2", false));

	cr_assert(store_wakeup_current(r));
	add("n0", NULL, 0);
	cr_assert_eq(producer_advisory_locks(), 0, "the INSERT let the shared lock go");
	cr_assert_not(woken_within(r, 300), "not armed: no notification");
	cr_assert_eq(store_arm(r), 1);
	add("n1", NULL, 0);
	cr_assert_eq(producer_advisory_locks(), 0, "refused, the INSERT holds nothing");
	cr_assert(woken_within(r, 15000), "armed: the trigger notifies");
	store_free(r);
}

/* A table migrated by an earlier version has a deferred per-row trigger that reads a flag
 * table: the relay says it is not current (it then polls), and migrate replaces it. */
Test(store, migrate_replaces_an_earlier_wakeup_trigger)
{
	struct store *a = migrated("wake_old");

	sql(g_admin, "DROP TRIGGER %s_wakeup ON %s", g_table, g_table);
	sql(g_admin,
	    "CREATE CONSTRAINT TRIGGER %s_wakeup AFTER INSERT ON %s DEFERRABLE INITIALLY DEFERRED"
	    " FOR EACH ROW EXECUTE FUNCTION %s_wakeup_notify()",
	    g_table, g_table, g_table);
	struct store *r = open_store(opts_for("relay-1", false));
	cr_assert_not(store_wakeup_current(r));
	store_free(r);
	cr_assert_eq(store_migrate(a), 0, "%s", store_errmsg(a));
	cr_assert_eq(sql_int(g_admin,
	                     "SELECT count(*) FROM pg_trigger WHERE tgrelid = '%s'::regclass"
	                     " AND NOT tgisinternal",
	                     g_table),
	             1, "one trigger, the new one");
	expect_wakeup_after_migrate();
	store_free(a);
}

/* The version before this one tested the lock in the trigger's WHEN. That trigger wakes relays
 * as this one does, so the relay counts it current; migrate replaces it with the trigger that
 * tests the lock in its function, which wakes a relay that waits and only such a relay. */
Test(store, migrate_replaces_the_wakeup_that_tested_in_its_when)
{
	struct store *a = migrated("wake_when");

	when_trigger(g_table);
	struct store *r = open_store(opts_for("relay-1", false));
	cr_assert(store_wakeup_current(r), "the WHEN trigger wakes relays too");
	cr_assert_eq(store_arm(r), 1);
	add("o1", NULL, 0);
	cr_assert(woken_within(r, 15000), "the WHEN trigger notifies");
	store_free(r);

	cr_assert_eq(store_migrate(a), 0, "%s", store_errmsg(a));
	cr_assert_eq(sql_int(g_admin,
	                     "SELECT count(*) FROM pg_trigger WHERE tgrelid = '%s'::regclass"
	                     " AND NOT tgisinternal AND tgqual IS NULL",
	                     g_table),
	             1, "one trigger, without a WHEN");
	cr_assert_eq(sql_int(g_admin,
	                     "SELECT count(*) FROM pg_proc WHERE proname = '%s_wakeup_notify'"
	                     " AND proconfig IS NULL",
	                     g_table),
	             1, "the function no longer sets its search_path on every call");
	expect_wakeup_after_migrate();
	store_free(a);
}

/* The version before this one let the lock go in a PERFORM, a query of its own. Its function
 * wakes relays as this one does; migrate replaces it with the one that tests and lets go in
 * one expression, which still lets go, wakes a relay that waits, and only such a relay. */
Test(store, migrate_replaces_the_wakeup_that_let_go_in_a_perform)
{
	struct store *a = migrated("wake_perform");

	sql(g_admin,
	    "CREATE OR REPLACE FUNCTION %s_wakeup_notify() RETURNS trigger LANGUAGE plpgsql"
	    " AS $fn$ BEGIN"
	    " IF pg_catalog.pg_try_advisory_lock_shared(" STORE_WAKEUP_LOCK_CLASS
	    ", TG_RELID::pg_catalog.int4) THEN"
	    " PERFORM pg_catalog.pg_advisory_unlock_shared(" STORE_WAKEUP_LOCK_CLASS
	    ", TG_RELID::pg_catalog.int4); RETURN NULL; END IF;"
	    " PERFORM pg_catalog.pg_notify('%s', ''); RETURN NULL; END $fn$",
	    g_table, g_table);
	struct store *r = open_store(opts_for("relay-1", false));
	cr_assert(store_wakeup_current(r), "the earlier function wakes relays too");
	add("o0", NULL, 0);
	cr_assert_eq(producer_advisory_locks(), 0);
	cr_assert_eq(store_arm(r), 1);
	add("o1", NULL, 0);
	cr_assert(woken_within(r, 15000), "the earlier function notifies");
	store_free(r);

	cr_assert_eq(store_migrate(a), 0, "%s", store_errmsg(a));
	cr_assert_eq(
	        sql_int(g_admin,
	                "SELECT count(*) FROM pg_proc WHERE proname = '%s_wakeup_notify'"
	                " AND strpos(prosrc, 'PERFORM pg_catalog.pg_advisory_unlock') = 0"
	                " AND strpos(prosrc, 'THEN pg_catalog.pg_advisory_unlock_shared(') > 0",
	                g_table),
	        1, "the lock is let go in the test's own expression");
	expect_wakeup_after_migrate();
	store_free(a);
}

Test(store, status_counts_and_blocked_keys)
{
	struct store *a = migrated("status");
	add("s1", NULL, 0);
	add("s2", NULL, 0);
	add("s3", "K", 0);
	add("s4", "K", 0);
	add("s5", NULL, 0);
	add("s6", NULL, 0);
	sql(g_admin, "UPDATE %s SET attempts = 3, last_error = 'boom' WHERE id = 's3'", g_table);
	sql(g_admin, "UPDATE %s SET published_at = now() WHERE id = 's5'", g_table);
	sql(g_admin,
	    "UPDATE %s SET locked_by = 'x', locked_until = now() + interval '1 minute',"
	    " created_at = now() - interval '100 seconds' WHERE id = 's1'",
	    g_table);

	struct store_status st;
	cr_assert_eq(store_status(a, &st), 0, "%s", store_errmsg(a));
	cr_assert_eq(st.pending, 4, "s1 s2 s4 s6 (leased included)");
	cr_assert_eq(st.leased, 1);
	cr_assert_eq(st.dead, 1);
	cr_assert_eq(st.published, 1);
	cr_assert_geq(st.oldest_pending_age_s, 99.0);
	cr_assert_eq(st.blocked_keys, 1);
	cr_assert_str_eq(st.oldest_blocked_key, "K");

	struct store_list l;
	cr_assert_eq(store_blocked_keys(a, 0, &l), 0, "%s", store_errmsg(a));
	cr_assert_eq(l.n, 1);
	cr_assert_str_eq(l.items[0].id, "s3");
	cr_assert_str_eq(l.items[0].ordering_key, "K");
	cr_assert_str_eq(l.items[0].last_error, "boom");
	store_list_free(&l);

	/* Under skip-dead the dead row is set aside: the key is not blocked. */
	struct store_options o = opts_for("admin2", true);
	o.skip_dead = true;
	struct store *sk = open_store(o);
	cr_assert_eq(store_status(sk, &st), 0);
	cr_assert_eq(st.blocked_keys, 0);
	cr_assert_str_eq(st.oldest_blocked_key, "");
	store_free(sk);
	store_free(a);
}

Test(store, dead_list_requeue_discard_purge)
{
	struct store *a = migrated("admin");
	for (int i = 0; i < 6; i++) {
		char id[16];
		snprintf(id, sizeof(id), "x%d", i);
		add(id, NULL, 0);
	}
	sql(g_admin,
	    "UPDATE %s SET attempts = 3, last_error = 'dead ' || id"
	    " WHERE id IN ('x0', 'x1', 'x2')",
	    g_table);

	struct store_list l;
	cr_assert_eq(store_dead(a, 0, &l), 0, "%s", store_errmsg(a));
	cr_assert_eq(l.n, 3);
	cr_assert_str_eq(l.items[0].id, "x0");
	cr_assert_str_eq(l.items[0].last_error, "dead x0");
	cr_assert_eq(l.items[0].attempts, 3);
	cr_assert_str_eq(l.items[0].exchange, "ex");
	cr_assert(strchr(l.items[0].created_at, 'T'), "ISO 8601: %s", l.items[0].created_at);
	store_list_free(&l);
	cr_assert_eq(store_dead(a, 2, &l), 0);
	cr_assert_eq(l.n, 2);
	store_list_free(&l);

	/* A requeue wakes a listening relay. */
	struct store *r = open_store(opts_for("relay-1", false));
	int64_t n = -1;
	const char *one[] = { "x0" };
	cr_assert_eq(store_requeue(a, one, 1, false, &n), 0, "%s", store_errmsg(a));
	cr_assert_eq(n, 1);
	cr_assert(woken_within(r, 15000), "requeue notifies the channel");
	cr_assert_eq(sql_int(g_admin,
	                     "SELECT count(*) FROM %s WHERE id = 'x0' AND attempts = 0"
	                     " AND last_error IS NULL",
	                     g_table),
	             1);
	cr_assert_eq(store_requeue(a, NULL, 0, true, &n), 0);
	cr_assert_eq(n, 2);
	cr_assert_eq(store_dead(a, 0, &l), 0);
	cr_assert_eq(l.n, 0);
	store_list_free(&l);

	const char *gone[] = { "x1", "nope" };
	cr_assert_eq(store_discard(a, gone, 2, &n), 0, "%s", store_errmsg(a));
	cr_assert_eq(n, 1);

	sql(g_admin, "UPDATE %s SET published_at = now() - interval '2 hours' WHERE id <> 'x2'",
	    g_table);
	sql(g_admin, "UPDATE %s SET published_at = now() WHERE id = 'x3'", g_table);
	cr_assert_eq(store_purge(a, 3600 * 1000, 2, NULL, &n), 0, "%s", store_errmsg(a));
	cr_assert_eq(n, 3, "x0 x4 x5: older than an hour, in slices of 2");
	cr_assert_eq(sql_int(g_admin, "SELECT count(*) FROM %s", g_table), 2, "x2 and x3 remain");
	atomic_int stop = 1;
	cr_assert_eq(store_purge(a, 0, 2, &stop, &n), 0);
	cr_assert_eq(n, 0, "a raised stop flag purges nothing");
	store_free(r);
	store_free(a);
}

/* What EXPLAIN (ANALYZE, BUFFERS) prints for q run on conn, one text (a static buffer, good
 * until the next call). */
static const char *explain_analyze(PGconn *conn, const char *q)
{
	static char plan[65536];
	char explain[1024];
	size_t len = 0;
	PGresult *res;

	snprintf(explain, sizeof(explain), "EXPLAIN (ANALYZE, BUFFERS) %s", q);
	res = PQexec(conn, explain);
	cr_assert_eq(PQresultStatus(res), PGRES_TUPLES_OK, "%s: %s", explain,
	             PQresultErrorMessage(res));
	plan[0] = '\0';
	for (int t = 0; t < PQntuples(res) && len < sizeof(plan) - 1; t++)
		len += (size_t)snprintf(plan + len, sizeof(plan) - len, "%s\n",
		                        PQgetvalue(res, t, 0));
	PQclear(res);
	return plan;
}

/* Index entries an EXPLAIN ANALYZE plan read through index idx: over every node scanning it,
 * (rows + rows removed by its filter) x loops. The figures are per loop (rounded averages),
 * which is close enough for a bound. */
static long long index_entries_read(const char *plan, const char *idx)
{
	char using[128];
	long long total = 0;
	bool seen = false;

	snprintf(using, sizeof(using), "using %s on ", idx);
	for (const char *line = plan; line && *line;) {
		const char *eol = strchr(line, '\n');
		const char *act;

		if (!strstr(line, using) || (eol && strstr(line, using) > eol)) {
			line = eol ? eol + 1 : NULL;
			continue;
		}
		seen = true;
		act = strstr(line, "actual time=");
		cr_assert(act && (!eol || act < eol), "no actual figures:\n%s", plan);
		const char *rows = strstr(act, "rows="), *loops = strstr(act, "loops=");
		cr_assert(rows && loops);
		long long n = strtoll(rows + 5, NULL, 10);
		long long k = strtoll(loops + 6, NULL, 10);
		/* The node's own detail lines, up to the next node. */
		for (line = eol ? eol + 1 : NULL; line && *line && !strstr(line, "->");) {
			const char *end = strchr(line, '\n');
			const char *rem = strstr(line, "Rows Removed by Filter: ");
			if (rem && (!end || rem < end))
				n += strtoll(rem + 24, NULL, 10);
			if (strstr(line, "SubPlan") && (!end || strstr(line, "SubPlan") < end))
				break;
			line = end ? end + 1 : NULL;
		}
		total += n * k;
	}
	cr_assert(seen, "plan does not use %s:\n%s", idx, plan);
	return total;
}

/* D2 of the soak run: a keyed backlog (37,000 rows on 32 keys) made every claim walk all of
 * it, 2 s a claim, because the claim walked unpublished rows in seq order and each row queued
 * behind its key's head was read and refused. The claim must read O(batch + keys) index
 * entries however long the keys' queues are. */
Test(store, claim_reads_a_batch_and_the_key_heads_however_long_the_backlog, .timeout = 300)
{
	struct store *a = migrated("plan");
	/* 100,000 published rows (their entries stay in the indexes until vacuum), then 100,000
	 * pending: 90 % of them on 32 keys (2,800 queued behind each head), 10 % unkeyed. */
	sql(g_admin,
	    "INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key)"
	    " SELECT 'b' || g, 'ex', 'rk', 'body', CASE WHEN g %% 10 <> 0 THEN 'k' || (g %% 32) END"
	    " FROM generate_series(1, 200000) g",
	    g_table);
	sql(g_admin,
	    "UPDATE %s SET published_at = now() WHERE seq <= (SELECT min(seq) + 99999 FROM %s)",
	    g_table, g_table);
	/* No ANALYZE: right after a bulk load the statistics are missing, and the claim must
	 * still walk the indexes. */
	wait_rows_settled();
	struct store *r = open_store(opts_for("relay-1", false));
	char unkeyed[96], keyed[96], seqscan[96];
	snprintf(unkeyed, sizeof(unkeyed), "%s_unkeyed_idx", g_table);
	snprintf(keyed, sizeof(keyed), "%s_key_idx", g_table);
	snprintf(seqscan, sizeof(seqscan), "Seq Scan on %s ", g_table);
	int64_t keyed_before = sql_int(
	        g_admin,
	        "SELECT count(*) FROM %s WHERE published_at IS NULL AND ordering_key IS NOT NULL",
	        g_table);

	/* Several runs: after five executions PostgreSQL may switch to a generic plan, which
	 * must be just as good. Each claims 100 rows: the 32 heads (older than most unkeyed
	 * rows) and unkeyed rows. */
	for (int i = 0; i < 8; i++) {
		const char *plan =
		        explain_analyze(r->conn, "EXECUTE outbox_claim("
		                                 "false, 3, 100, 'relay-1#t.1', 60000, 0,"
		                                 " 9223372036854775807,"
		                                 " 9223372036854775807, NULL, 100, false)");
		cr_assert_null(strstr(plan, seqscan), "run %d walks the table:\n%s", i, plan);
		long long u = index_entries_read(plan, unkeyed),
		          k = index_entries_read(plan, keyed);
		cr_assert_leq(u, 400, "run %d read %lld unkeyed entries for a batch of 100:\n%s", i,
		              u, plan);
		/* One descent to find each of the 32 keys and one for its head, plus the end. */
		cr_assert_leq(k, 4 * 32 + 8, "run %d read %lld key index entries for 32 keys:\n%s",
		              i, k, plan);
		/* As the relay would: the claimed rows get published before the next claim. */
		sql(g_admin,
		    "UPDATE %s SET published_at = now(), locked_by = NULL, locked_until = NULL"
		    " WHERE locked_by LIKE 'relay-1#%%'",
		    g_table);
	}
	cr_assert_eq(
	        sql_int(g_admin, "SELECT count(*) FROM %s WHERE published_at IS NULL", g_table),
	        100000 - 800, "each run claimed a full batch");
	cr_assert_eq(sql_int(g_admin,
	                     "SELECT count(*) FROM %s WHERE published_at IS NULL"
	                     " AND ordering_key IS NOT NULL",
	                     g_table),
	             keyed_before - 8 * 32, "each run claimed every key's head");
	store_free(r);
	store_free(a);
}

/* The most shared buffers any node of q's plan touched (hit or read), run by EXPLAIN (ANALYZE,
 * BUFFERS) on conn: a node counts the buffers of the nodes below it. */
static long plan_buffers(PGconn *conn, const char *q)
{
	long most = 0;

	for (const char *line = explain_analyze(conn, q); line && *line;) {
		const char *eol = strchr(line, '\n'), *p;
		long n = 0;

		if ((p = strstr(line, "shared hit=")) != NULL && (!eol || p < eol))
			n += strtol(p + strlen("shared hit="), NULL, 10);
		if ((p = strstr(line, " read=")) != NULL && (!eol || p < eol))
			n += strtol(p + strlen(" read="), NULL, 10);
		most = n > most ? n : most;
		line = eol ? eol + 1 : NULL;
	}
	return most;
}

/* PostgreSQL plans a prepared statement generically after five runs and keeps that plan until
 * the table's statistics change. Planned on a new, empty table (a fresh deployment, a bench),
 * the claim's key-head lookup and the mark read the whole table (by sequential scan, and the
 * lookup by index scan of every row up to the watermark when sequential scans were off), and
 * went on doing so as it grew: at 2,000 commits/s over a table reaching 20,000 rows, each claim
 * spent 12 ms on it, with no keyed row in the table. Here the generic plans are made on the
 * empty table (autovacuum off, so no ANALYZE replans them) and run once it holds 20,000 rows
 * (about 5,000 pages): a claim of 100 rows and the writes of two rows touch a few hundred. */
Test(store, statements_planned_on_an_empty_table_keep_to_the_indexes)
{
	struct store *a = migrated("emptyplan");
	sql(g_admin, "ALTER TABLE %s SET (autovacuum_enabled = false)", g_table);
	struct store *r = open_store(opts_for("relay-1", false));
	struct store_batch b;
	const char *one[1] = { "nothing" };
	const int64_t none[1] = { 0 };
	long n;

	store_batch_init(&b);
	sql(r->conn, "SET plan_cache_mode = force_generic_plan");
	cr_assert_eq(store_claim(r, false, &b), 0, "%s", store_errmsg(r));
	cr_assert_eq(b.n, 0);
	cr_assert_eq(store_mark_published(r, "token", none, 1, false), 0, "%s", store_errmsg(r));
	cr_assert_eq(store_mark_published(r, "token", none, 1, true), 0, "%s", store_errmsg(r));
	cr_assert_eq(store_release(r, "token", one, 1), 0, "%s", store_errmsg(r));

	sql(g_admin,
	    "INSERT INTO %s (id, exchange_name, routing_key, body) SELECT 'g' || g, 'ex', 'rk',"
	    " repeat('x', 1000) FROM generate_series(1, 20000) g",
	    g_table);
	cr_assert_gt(sql_int(g_admin, "SELECT pg_relation_size('%s') / 8192", g_table), 4000);
	/* The watermark at its highest: every row is below it. */
	n = plan_buffers(r->conn, "EXECUTE " ST_CLAIM "(false, 3, 100, 'token', 60000, 0,"
	                          " 9223372036854775807, 9223372036854775807, NULL, 64, true)");
	cr_expect_lt(n, 1000, "the claim touched %ld buffers", n);
	n = plan_buffers(r->conn, "EXECUTE " ST_CLAIM_FULL "(false, 3, 100, 'token', 60000, 0,"
	                          " 9223372036854775807, 9223372036854775807, NULL, 64, true)");
	cr_expect_lt(n, 1000, "the full claim touched %ld buffers", n);
	n = plan_buffers(r->conn, "EXECUTE " ST_MARK "('{1,2}', 'token')");
	cr_expect_lt(n, 100, "the mark touched %ld buffers", n);
	n = plan_buffers(r->conn, "EXECUTE " ST_DELETE "('{1,2}', 'token')");
	cr_expect_lt(n, 100, "the delete on confirm touched %ld buffers", n);
	n = plan_buffers(r->conn, "EXECUTE " ST_RELEASE "('{g1,g2}', 'token')");
	cr_expect_lt(n, 100, "the release touched %ld buffers", n);
	store_batch_free(&b);
	store_free(r);
	store_free(a);
}
