/* The partitioned table (migrate --partitioned; docs/design.md, "A partitioned table"): migrate
 * creates it with its DEFAULT partition and partitions ahead; producers' retries are
 * deduplicated within a partition; the relay's maintenance keeps partitions ahead as seq grows;
 * both row sources relay every row across partitions in per-key order; retention drops exactly
 * the done partitions; the operator commands work on it; a plain table is not converted. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libpq-fe.h>

#include "tests/support/fixture.h"

#define DELIVERY_TIMEOUT_MS 120000
#define ROWS_PER_PARTITION  "100"

static struct fixture g_fx;

static void teardown(void)
{
	fixture_teardown(&g_fx);
}

TestSuite(partitioned, .fini = teardown, .timeout = 300);

/* A fixture whose table is made by `migrate --partitioned --partition-rows 100`; with a
 * consumer unless no_consumer. */
static void setup(const char *tag, bool no_consumer)
{
	struct harness_output o;

	fixture_setup(&g_fx, tag,
	              &(struct fixture_options){ .no_migrate = true, .no_consumer = no_consumer });
	fixture_drop_later(
	        &g_fx,
	        "DROP FUNCTION IF EXISTS %s_part_ahead(), %s_part_retire(bigint, bigint),"
	        " %s_part_status(integer, boolean)",
	        g_fx.table, g_fx.table, g_fx.table);
	harness_cli(&o, g_fx.table, NULL, "migrate", "--partitioned", "--partition-rows",
	            ROWS_PER_PARTITION, NULL);
	cr_assert_eq(o.status, 0, "migrate --partitioned exited %d: %s", o.status, o.err);
	harness_output_free(&o);
}

/* Range partitions of the table (the DEFAULT one not counted). */
static int64_t range_partitions(void)
{
	return harness_pg_int(g_fx.pg,
	                      "SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid ="
	                      " i.inhrelid WHERE i.inhparent = '%s'::regclass"
	                      " AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT'",
	                      g_fx.table);
}

static int64_t default_rows(void)
{
	return harness_pg_int(g_fx.pg, "SELECT count(*) FROM %s_default", g_fx.table);
}

/* Range partitions wholly above the sequence's last value: empty ones ahead. */
static int64_t partitions_ahead(void)
{
	return harness_pg_int(
	        g_fx.pg,
	        "SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
	        " WHERE i.inhparent = '%s'::regclass AND (regexp_match(pg_get_expr(c.relpartbound,"
	        " c.oid), 'FROM \\(''(\\d+)''\\)'))[1]::bigint > COALESCE(pg_sequence_last_value("
	        "pg_get_serial_sequence('%s', 'seq')::regclass), 0)",
	        g_fx.table, g_fx.table);
}

static void ahead_now(void)
{
	harness_pg_exec(g_fx.pg, "SELECT %s_part_ahead()", g_fx.table);
}

/* n rows "<prefix>-<i>" by SQL: every keys-th row unkeyed, the others over keys ordering
 * keys "k<j>", so that each key's rows span the partitions. */
static void insert_sql(const char *prefix, int from, int n, int keys)
{
	harness_pg_exec(g_fx.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key)"
	                " SELECT '%s-' || g, '%s', 'part.' || g, '{}', CASE WHEN g %% %d = 0"
	                " THEN NULL ELSE 'k' || (g %% %d) END FROM generate_series(%d, %d) g"
	                " ON CONFLICT DO NOTHING",
	                g_fx.table, prefix, g_fx.exchange, keys, keys, from, from + n - 1);
}

Test(partitioned, migrate_creates_it_and_producers_deduplicate)
{
	struct harness_output o;
	char err[512];

	setup("pt_make", true);
	cr_assert_eq(harness_pg_int(g_fx.pg,
	                            "SELECT count(*) FROM pg_class WHERE oid ="
	                            " '%s'::regclass AND relkind = 'p'",
	                            g_fx.table),
	             1, "the table is not partitioned");
	cr_assert_eq(range_partitions(), 2, "two partitions ahead of an empty table");
	cr_assert_eq(partitions_ahead(), 2);
	/* Again: nothing to change, and the plain migrate keeps it as it is. */
	harness_cli(&o, g_fx.table, NULL, "migrate", NULL);
	cr_assert_eq(o.status, 0, "%s", o.err);
	harness_output_free(&o);
	cr_assert_eq(range_partitions(), 2);

	/* liboutbox (enqueue) and SQL, with a retry of each id. */
	for (int i = 0; i < 2; i++) {
		harness_cli(&o, g_fx.table, NULL, "enqueue", "--exchange", "ex", "--routing-key",
		            "rk", "--body", "{}", "--id", "lib-1", NULL);
		cr_assert_eq(o.status, 0, "enqueue exited %d: %s", o.status, o.err);
		cr_assert_not_null(strstr(o.out, i == 0 ? "enqueued lib-1" : "exists lib-1"), "%s",
		                   o.out);
		harness_output_free(&o);
		insert_sql("sql", 1, 1, 1);
	}
	cr_assert_eq(harness_pg_int(g_fx.pg, "SELECT count(*) FROM %s", g_fx.table), 2);
	/* The conflict target (id) has no arbiter on a partitioned parent: applications drop it. */
	cr_assert_neq(harness_pg_try_exec(g_fx.pg, err, sizeof(err),
	                                  "INSERT INTO %s (id, exchange_name, routing_key, body)"
	                                  " VALUES ('t', '', 'k', '') ON CONFLICT (id) DO NOTHING",
	                                  g_fx.table),
	              0, "ON CONFLICT (id) worked on a partitioned table");
	cr_assert_not_null(strstr(err, "no unique or exclusion constraint"), "%s", err);

	/* A plain table is not converted: refused, nothing changed. */
	harness_pg_exec(g_fx.pg, "CREATE TABLE %s_plain (LIKE %s INCLUDING IDENTITY)", g_fx.table,
	                g_fx.table);
	fixture_drop_later(&g_fx, "DROP TABLE IF EXISTS %s_plain", g_fx.table);
	{
		char plain[80];

		snprintf(plain, sizeof(plain), "%s_plain", g_fx.table);
		harness_cli(&o, plain, NULL, "migrate", "--partitioned", NULL);
	}
	cr_assert_eq(o.status, 1, "%s", o.err);
	cr_assert_not_null(strstr(o.err, "exists and is not partitioned"), "%s", o.err);
	harness_output_free(&o);
	harness_cli(&o, g_fx.table, NULL, "migrate", "--partition-rows", "100", NULL);
	cr_assert_eq(o.status, 2, "%s", o.err);
	harness_output_free(&o);
	fixture_teardown(&g_fx);
}

static bool enough_ahead(void *arg)
{
	(void)arg;
	return partitions_ahead() >= 2;
}

Test(partitioned, relay_keeps_partitions_ahead_and_the_default_partition_catches_the_rest)
{
	struct harness_relay *r;
	int64_t rows = 0;

	setup("pt_ahead", false);
	r = fixture_relay_start(&g_fx, NULL);
	/* 60 rows at a time: each batch crosses a boundary now and then; the maintenance loop
	 * makes the next partitions before the producers reach them. */
	for (int i = 0; i < 8; i++) {
		insert_sql("a", (int)rows + 1, 60, 5);
		rows += 60;
		cr_assert(harness_wait_until(enough_ahead, NULL, 60000),
		          "the relay made no partitions ahead after %lld rows", (long long)rows);
	}
	cr_assert_eq(default_rows(), 0, "rows fell into the DEFAULT partition");
	cr_assert_geq(range_partitions(), 6);
	/* More rows at once than the partitions ahead hold: the rest lands in DEFAULT and is
	 * relayed all the same; the next partitions start above it. */
	insert_sql("b", 1, 350, 5);
	rows += 350;
	cr_assert_gt(default_rows(), 0);
	fixture_expect_unique(&g_fx, g_fx.cons, (size_t)rows, DELIVERY_TIMEOUT_MS);
	cr_assert(harness_wait_until(enough_ahead, NULL, 60000));
	cr_assert_eq(harness_unpublished_count(g_fx.pg, g_fx.table), 0);
	(void)r;
	fixture_teardown(&g_fx);
}

/* Each key's deliveries in seq order (the ids carry the row number, which grows with seq). */
static void expect_key_order(struct consumer *c, int keys)
{
	size_t n = 0;
	const char **ids = consumer_order(c, &n);
	int last[16] = { 0 };

	cr_assert_leq(keys, 16);
	for (size_t i = 0; i < n; i++) {
		int g = (int)strtol(strchr(ids[i], '-') + 1, NULL, 10), k = g % keys;

		if (k == 0)
			continue;
		/* A duplicate may repeat an earlier row; a later row never comes before one. */
		cr_assert(g >= last[k] || consumer_count(c, ids[i]) > 1, "key k%d: %s after row %d",
		          k, ids[i], last[k]);
		if (g > last[k])
			last[k] = g;
	}
	free(ids);
}

/* 500 rows over five partitions, 7 keys, relayed by source. */
static void relay_across_partitions(const char *source)
{
	char env_source[64];
	const char *env[] = { env_source, NULL };
	char *expected[500];
	const char **lost;
	size_t n_lost = 0;

	snprintf(env_source, sizeof(env_source), "OUTBOX_RELAY_SOURCE=%s", source);
	for (int i = 0; i < 5; i++) {
		insert_sql("r", i * 100 + 1, 100, 7);
		ahead_now();
	}
	cr_assert_eq(default_rows(), 0);
	cr_assert_geq(range_partitions(), 7);
	fixture_relay_start(&g_fx, env);
	fixture_expect_unique(&g_fx, g_fx.cons, 500, DELIVERY_TIMEOUT_MS);
	for (int i = 0; i < 500; i++) {
		expected[i] = malloc(16);
		cr_assert_not_null(expected[i]);
		snprintf(expected[i], 16, "r-%d", i + 1);
	}
	lost = consumer_lost(g_fx.cons, (const char *const *)expected, 500, &n_lost);
	cr_assert_eq(n_lost, 0, "lost %zu rows, the first %s", n_lost, n_lost ? lost[0] : "");
	free(lost);
	for (int i = 0; i < 500; i++)
		free(expected[i]);
	expect_key_order(g_fx.cons, 7);
}

Test(partitioned, lease_source_relays_every_row_in_key_order)
{
	setup("pt_lease", false);
	relay_across_partitions("lease");
	cr_assert_eq(harness_pg_int(g_fx.pg, "SELECT count(*) FROM %s WHERE published_at IS NULL",
	                            g_fx.table),
	             0);
	fixture_teardown(&g_fx);
}

Test(partitioned, cursor_source_relays_every_row_in_key_order)
{
	setup("pt_cursor", false);
	relay_across_partitions("cursor");
	fixture_teardown(&g_fx);
}

static int64_t rows_in(int64_t lower)
{
	return harness_pg_int(g_fx.pg,
	                      "SELECT count(*) FROM %s WHERE seq >= %lld AND seq < %lld + 100",
	                      g_fx.table, (long long)lower, (long long)lower);
}

static bool partition_exists(int64_t lower)
{
	return harness_pg_int(g_fx.pg, "SELECT count(*) FROM pg_class WHERE relname = '%s_p%lld'",
	                      g_fx.table, (long long)lower) == 1;
}

/* The lease source's retention: 450 rows in p1..p401 (the sequence in p401), published two
 * hours ago but for one pending row in p101 and one dead row in p201. */
Test(partitioned, lease_retention_drops_exactly_the_done_partitions)
{
	struct harness_output o;

	setup("pt_ret", true);
	for (int i = 0; i < 5; i++) {
		insert_sql("x", i * 100 + 1, i == 4 ? 50 : 100, 3);
		ahead_now();
	}
	harness_pg_exec(g_fx.pg, "UPDATE %s SET published_at = now() - interval '2 hours'",
	                g_fx.table);
	harness_pg_exec(g_fx.pg, "UPDATE %s SET published_at = NULL WHERE id = 'x-150'",
	                g_fx.table);
	harness_pg_exec(g_fx.pg,
	                "UPDATE %s SET published_at = NULL, attempts = 10, last_error = 'boom'"
	                " WHERE id = 'x-250'",
	                g_fx.table);
	/* Published an hour ago only: p301 stays for a 90-minute retention. */
	harness_pg_exec(g_fx.pg,
	                "UPDATE %s SET published_at = now() - interval '1 hour' WHERE id = 'x-350'",
	                g_fx.table);
	cr_assert_eq(harness_pg_int(g_fx.pg, "SELECT count(*) FROM %s", g_fx.table), 450);

	harness_cli(&o, g_fx.table, NULL, "status", NULL);
	cr_assert_eq(o.status, 0, "%s", o.err);
	cr_assert_not_null(strstr(o.out, "(1 held by dead rows)"), "%s", o.out);
	harness_output_free(&o);

	harness_cli(&o, g_fx.table, NULL, "purge", "--older-than", "90m", NULL);
	cr_assert_eq(o.status, 0, "%s", o.err);
	cr_assert_not_null(strstr(o.out, "purged 100 published rows"), "%s", o.out);
	harness_output_free(&o);
	cr_assert(!partition_exists(1), "p1 (all published) was kept");
	cr_assert(partition_exists(101) && rows_in(101) == 100, "p101 (a pending row) went");
	cr_assert(partition_exists(201) && rows_in(201) == 100, "p201 (a dead row) went");
	cr_assert(partition_exists(301) && rows_in(301) == 100, "p301 (young) went");
	cr_assert(partition_exists(401) && rows_in(401) == 50, "p401 (the sequence's) went");
	cr_assert_eq(harness_pg_int(g_fx.pg, "SELECT count(*) FROM %s", g_fx.table), 350);

	/* The dead row discarded and the pending one published: both go at the next purge, the
	 * young one and the sequence's partition stay. */
	harness_cli(&o, g_fx.table, NULL, "discard", "--id", "x-250", NULL);
	cr_assert_eq(o.status, 0, "%s", o.err);
	harness_output_free(&o);
	harness_pg_exec(
	        g_fx.pg,
	        "UPDATE %s SET published_at = now() - interval '2 hours' WHERE id = 'x-150'",
	        g_fx.table);
	harness_cli(&o, g_fx.table, NULL, "purge", "--older-than", "90m", NULL);
	cr_assert_eq(o.status, 0, "%s", o.err);
	cr_assert_not_null(strstr(o.out, "purged 199 published rows"), "%s", o.out);
	harness_output_free(&o);
	cr_assert(!partition_exists(101) && !partition_exists(201));
	cr_assert(partition_exists(301) && partition_exists(401));
	cr_assert_eq(harness_pg_int(g_fx.pg, "SELECT count(*) FROM %s", g_fx.table), 150);
	fixture_teardown(&g_fx);
}

/* The cursor source's retention: partitions wholly behind the position with no deferred row
 * unpublished go one retention after a purge first found them done. */
Test(partitioned, cursor_retention_drops_partitions_behind_the_position)
{
	const char *env[] = { "OUTBOX_RELAY_SOURCE=cursor", NULL };
	struct harness_output o;

	setup("pt_cret", true);
	for (int i = 0; i < 4; i++) {
		insert_sql("c", i * 100 + 1, 100, 3);
		ahead_now();
	}
	/* Behind the position: p1, p101 (a deferred dead row), p201 but its last row. */
	harness_pg_exec(g_fx.pg, "INSERT INTO %s_position (stream, position) VALUES ('main', 299)",
	                g_fx.table);
	harness_pg_exec(g_fx.pg,
	                "UPDATE %s SET deferred_at = now(), attempts = 10, last_error = 'boom'"
	                " WHERE id = 'c-150'",
	                g_fx.table);
	harness_cli(&o, g_fx.table, env, "purge", "--older-than", "0s", NULL);
	cr_assert_eq(o.status, 0, "%s", o.err);
	cr_assert_not_null(strstr(o.out, "purged 0 published rows"), "first seen done: %s", o.out);
	harness_output_free(&o);
	harness_cli(&o, g_fx.table, env, "purge", "--older-than", "0s", NULL);
	cr_assert_eq(o.status, 0, "%s", o.err);
	cr_assert_not_null(strstr(o.out, "purged 100 published rows"), "%s", o.out);
	harness_output_free(&o);
	cr_assert(!partition_exists(1));
	cr_assert(partition_exists(101), "p101 (a dead deferred row) went");
	cr_assert(partition_exists(201), "p201 (its last row ahead of the position) went");
	harness_cli(&o, g_fx.table, env, "status", NULL);
	cr_assert_not_null(strstr(o.out, "(1 held by dead rows)"), "%s", o.out);
	harness_output_free(&o);
	/* A long retention keeps what a purge found done a moment ago. */
	harness_pg_exec(g_fx.pg, "UPDATE %s_position SET position = 300", g_fx.table);
	harness_cli(&o, g_fx.table, env, "purge", "--older-than", "1h", NULL);
	harness_output_free(&o);
	harness_cli(&o, g_fx.table, env, "purge", "--older-than", "1h", NULL);
	cr_assert_not_null(strstr(o.out, "purged 0 published rows"), "%s", o.out);
	harness_output_free(&o);
	cr_assert(partition_exists(201));
	fixture_teardown(&g_fx);
}

/* status, dead, requeue, discard and replay on a partitioned table, and a relay that then
 * publishes what they made pending. */
Test(partitioned, operator_commands_work_on_it)
{
	struct harness_output o;

	setup("pt_ops", false);
	for (int i = 0; i < 3; i++) {
		insert_sql("o", i * 100 + 1, 100, 4);
		ahead_now();
	}
	harness_pg_exec(g_fx.pg,
	                "UPDATE %s SET published_at = now() - interval '1 hour'"
	                " WHERE id NOT IN ('o-50', 'o-150', 'o-250')",
	                g_fx.table);
	harness_pg_exec(g_fx.pg,
	                "UPDATE %s SET attempts = 10, last_error = 'boom' WHERE id IN ('o-50',"
	                " 'o-150', 'o-250')",
	                g_fx.table);
	harness_cli(&o, g_fx.table, NULL, "status", "--json", NULL);
	cr_assert_eq(o.status, 0, "%s", o.err);
	cr_assert_not_null(strstr(o.out, "\"dead\": 3"), "%s", o.out);
	cr_assert_not_null(strstr(o.out, "\"held_by_dead\": 3"), "%s", o.out);
	harness_output_free(&o);
	harness_cli(&o, g_fx.table, NULL, "dead", NULL);
	cr_assert_eq(o.status, 0, "%s", o.err);
	cr_assert(strstr(o.out, "o-50") && strstr(o.out, "o-150") && strstr(o.out, "o-250"), "%s",
	          o.out);
	harness_output_free(&o);
	harness_cli(&o, g_fx.table, NULL, "requeue", "--id", "o-50", "o-150", NULL);
	cr_assert_eq(o.status, 0, "%s", o.err);
	harness_output_free(&o);
	harness_cli(&o, g_fx.table, NULL, "discard", "--id", "o-250", NULL);
	cr_assert_eq(o.status, 0, "%s", o.err);
	harness_output_free(&o);
	harness_cli(&o, g_fx.table, NULL, "replay", "--id", "o-10", "o-110", "o-210", NULL);
	cr_assert_eq(o.status, 0, "%s%s", o.out, o.err);
	harness_output_free(&o);
	cr_assert_eq(harness_pg_int(g_fx.pg, "SELECT count(*) FROM %s", g_fx.table), 299);
	cr_assert_eq(harness_pg_int(g_fx.pg,
	                            "SELECT count(*) FROM %s WHERE published_at IS NULL AND"
	                            " attempts = 0",
	                            g_fx.table),
	             5);
	fixture_relay_start(&g_fx, NULL);
	fixture_expect_unique(&g_fx, g_fx.cons, 5, DELIVERY_TIMEOUT_MS);
	cr_assert(consumer_find(g_fx.cons, "o-50") && consumer_find(g_fx.cons, "o-150") &&
	          consumer_find(g_fx.cons, "o-110"));
	cr_assert_null(consumer_find(g_fx.cons, "o-250"));
	fixture_teardown(&g_fx);
}

/* Least privilege (packaging/grants.sql): the relay's role runs status and the retention
 * through the partitions' functions, the producer's role inserts and is deduplicated, and a
 * role with no grant cannot call the functions (EXECUTE is not PUBLIC's). */
Test(partitioned, grants_give_the_relay_role_the_functions)
{
	char relay[64], producer[64], other[64], env[1200], path[4096];
	const char *e[] = { env, NULL };
	const char *data = getenv("RELAY_TEST_DATA");
	struct harness_output o;
	PGconn *c;
	PGresult *res;

	setup("pt_roles", true);
	harness_unique_name(relay, sizeof(relay), "pt_relay");
	harness_unique_name(producer, sizeof(producer), "pt_prod");
	harness_unique_name(other, sizeof(other), "pt_other");
	fixture_drop_later(&g_fx, "DROP ROLE IF EXISTS %s, %s, %s", relay, producer, other);
	harness_pg_exec(g_fx.pg, "CREATE ROLE %s LOGIN; CREATE ROLE %s LOGIN; CREATE ROLE %s LOGIN",
	                relay, producer, other);
	harness_pg_exec(g_fx.pg, "GRANT SELECT ON %s TO %s", g_fx.table, other);
	cr_assert_not_null(data);
	snprintf(path, sizeof(path), "%s/../../packaging/grants.sql", data);
	cr_assert_eq(harness_shell("psql -X -q -v ON_ERROR_STOP=1 -d '%s' -v table=%s -v relay=%s"
	                           " -v producer=%s -f '%s'",
	                           harness_pg_conninfo(), g_fx.table, relay, producer, path),
	             0);
	insert_sql("g", 1, 150, 3);
	harness_pg_exec(g_fx.pg, "UPDATE %s SET published_at = now() - interval '2 hours'",
	                g_fx.table);

	snprintf(env, sizeof(env), "OUTBOX_DATABASE_URL=%s user=%s", harness_pg_conninfo(), relay);
	harness_cli(&o, g_fx.table, e, "status", NULL);
	cr_assert_eq(o.status, 0, "status as the relay role: %s", o.err);
	cr_assert_not_null(strstr(o.out, "partitions"), "%s", o.out);
	harness_output_free(&o);
	harness_cli(&o, g_fx.table, e, "purge", "--older-than", "1h", NULL);
	cr_assert_eq(o.status, 0, "purge as the relay role: %s", o.err);
	cr_assert_not_null(strstr(o.out, "purged 100 published rows"), "%s", o.out);
	harness_output_free(&o);

	snprintf(env, sizeof(env), "OUTBOX_DATABASE_URL=%s user=%s", harness_pg_conninfo(),
	         producer);
	for (int i = 0; i < 2; i++) {
		harness_cli(&o, g_fx.table, e, "enqueue", "--exchange", "ex", "--routing-key", "rk",
		            "--body", "{}", "--id", "prod-1", NULL);
		cr_assert_eq(o.status, 0, "enqueue as the producer role: %s", o.err);
		harness_output_free(&o);
	}
	cr_assert_eq(
	        harness_pg_int(g_fx.pg, "SELECT count(*) FROM %s WHERE id = 'prod-1'", g_fx.table),
	        1);

	snprintf(env, sizeof(env), "%s user=%s", harness_pg_conninfo(), other);
	c = PQconnectdb(env);
	cr_assert_eq(PQstatus(c), CONNECTION_OK, "%s", PQerrorMessage(c));
	{
		char sql[256];
		const char *state;

		snprintf(sql, sizeof(sql), "SELECT %s_part_ahead()", g_fx.table);
		res = PQexec(c, sql);
		state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
		cr_expect(state && strcmp(state, "42501") == 0, "a role without grants ran it: %s",
		          PQresultErrorMessage(res));
		PQclear(res);
	}
	PQfinish(c);
	fixture_teardown(&g_fx);
}
