/* The partitioned table (migrate --partitioned; docs/design.md, "A partitioned table"): migrate
 * creates it with its DEFAULT partition and partitions ahead; producers' retries are
 * deduplicated within a partition; the relay's maintenance keeps partitions ahead as seq grows;
 * both row sources relay every row across partitions in per-key order; retention drops exactly
 * the done partitions; the operator commands work on it; a plain table is converted while a
 * producer writes, and nothing is lost. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
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

/* Each key's deliveries in seq order, the key and seq of each delivered id read from the table
 * (a duplicate may repeat an earlier row; a later row never comes before an earlier one). */
static void expect_key_order(struct consumer *c)
{
	size_t n = 0, n_keys = 0;
	const char **ids = consumer_order(c, &n);
	char keys[32][32];
	int64_t last[32];

	for (size_t i = 0; i < n; i++) {
		char *row = harness_pg_string(g_fx.pg,
		                              "SELECT COALESCE(ordering_key, '-') || ' ' || seq"
		                              " FROM %s WHERE id = '%s'",
		                              g_fx.table, ids[i]);
		char *sp = strchr(row, ' ');
		size_t k = 0;
		int64_t seq;

		cr_assert_not_null(sp);
		*sp = '\0';
		seq = strtoll(sp + 1, NULL, 10);
		if (strcmp(row, "-") != 0) {
			while (k < n_keys && strcmp(keys[k], row) != 0)
				k++;
			if (k == n_keys) {
				cr_assert_lt(n_keys, 32);
				snprintf(keys[n_keys], sizeof(keys[0]), "%s", row);
				last[n_keys++] = 0;
			}
			cr_assert(seq >= last[k] || consumer_count(c, ids[i]) > 1,
			          "key %s: %s (seq %lld) after seq %lld", row, ids[i],
			          (long long)seq, (long long)last[k]);
			if (seq > last[k])
				last[k] = seq;
		}
		free(row);
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
	expect_key_order(g_fx.cons);
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

/* A producer on a connection of its own: one row a statement ("p-<n>") until stop; counts the
 * rows it inserted and the statements that failed. */
struct producer {
	char table[64];
	atomic_int stop;
	atomic_int inserted, failed;
	char err[256];
};

static void *produce(void *arg)
{
	struct producer *p = arg;
	PGconn *c = PQconnectdb(harness_pg_conninfo());

	while (PQstatus(c) == CONNECTION_OK && !atomic_load(&p->stop)) {
		char sql[512];
		PGresult *r;

		snprintf(
		        sql, sizeof(sql),
		        "INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key) VALUES"
		        " ('p-%d', '%s_ex', 'conv', '{}', 'pk') ON CONFLICT DO NOTHING",
		        p->table, atomic_load(&p->inserted) + 1, p->table);
		r = PQexec(c, sql);
		if (PQresultStatus(r) == PGRES_COMMAND_OK) {
			atomic_fetch_add(&p->inserted, 1);
		} else {
			snprintf(p->err, sizeof(p->err), "%s", PQresultErrorMessage(r));
			atomic_fetch_add(&p->failed, 1);
		}
		PQclear(r);
	}
	PQfinish(c);
	return NULL;
}

static bool produced_some(void *arg)
{
	struct producer *p = arg;

	return atomic_load(&p->inserted) >= 200;
}

/* A plain table with rows, a relay and a producer writing: migrate --partitioned converts it
 * (the producer waits for one short lock and never fails), every row keeps its id and seq, the
 * relay (restarted, as the notice says) relays all of them in key order, and the old rows'
 * partition is retired like any other. */
Test(partitioned, converts_a_plain_table_under_a_running_producer)
{
	struct producer p = { .stop = 0 };
	struct harness_relay *r;
	struct harness_output o;
	pthread_t th;
	int64_t before, rows;
	char *ids_before, *ids_after;

	fixture_setup(&g_fx, "pt_conv", NULL);
	fixture_drop_later(
	        &g_fx,
	        "DROP FUNCTION IF EXISTS %s_part_ahead(), %s_part_retire(bigint, bigint),"
	        " %s_part_status(integer, boolean)",
	        g_fx.table, g_fx.table, g_fx.table);
	insert_sql("old", 1, 300, 5);
	r = fixture_relay_start(&g_fx, NULL);
	snprintf(p.table, sizeof(p.table), "%s", g_fx.table);
	cr_assert_eq(pthread_create(&th, NULL, produce, &p), 0);
	cr_assert(harness_wait_until(produced_some, &p, 60000), "the producer wrote nothing");
	before = harness_pg_int(g_fx.pg, "SELECT count(*) FROM %s WHERE id LIKE 'old-%%'",
	                        g_fx.table);
	ids_before =
	        harness_pg_string(g_fx.pg,
	                          "SELECT string_agg(seq || ':' || id, ',' ORDER BY seq) FROM %s"
	                          " WHERE id LIKE 'old-%%'",
	                          g_fx.table);

	harness_cli(&o, g_fx.table, NULL, "migrate", "--partitioned", "--partition-rows", "100",
	            NULL);
	cr_assert_eq(o.status, 0, "migrate --partitioned on a plain table: %s", o.err);
	cr_assert_not_null(strstr(o.out, "restart the table's relays"), "%s", o.out);
	harness_output_free(&o);
	cr_assert(harness_wait_until(produced_some, &p, 60000));
	atomic_store(&p.stop, 1);
	pthread_join(th, NULL);
	cr_assert_eq(atomic_load(&p.failed), 0, "%d producer inserts failed: %s",
	             atomic_load(&p.failed), p.err);

	cr_assert_eq(harness_pg_int(g_fx.pg,
	                            "SELECT count(*) FROM pg_class WHERE oid ="
	                            " '%s'::regclass AND relkind = 'p'",
	                            g_fx.table),
	             1, "the table is not partitioned");
	ids_after =
	        harness_pg_string(g_fx.pg,
	                          "SELECT string_agg(seq || ':' || id, ',' ORDER BY seq) FROM %s"
	                          " WHERE id LIKE 'old-%%'",
	                          g_fx.table);
	cr_assert_str_eq(ids_before, ids_after, "the old rows changed");
	free(ids_before);
	free(ids_after);
	rows = harness_pg_int(g_fx.pg, "SELECT count(*) FROM %s", g_fx.table);
	cr_assert_eq(rows, before + atomic_load(&p.inserted), "rows lost or added");
	cr_assert_eq(harness_pg_int(g_fx.pg, "SELECT count(DISTINCT id) FROM %s", g_fx.table),
	             rows);

	/* More rows after, past the first partition's bound (1,000 seqs above the sequence)
	 * and into the new partitions. */
	for (int i = 0; i < 12; i++) {
		ahead_now();
		insert_sql("new", i * 100 + 1, 100, 5);
	}
	rows += 1200;
	cr_assert_gt(harness_pg_int(g_fx.pg,
	                            "SELECT count(*) FROM %s WHERE tableoid <>"
	                            " '%s_pmin'::regclass",
	                            g_fx.table, g_fx.table),
	             0, "no row went past the old table");
	cr_assert_eq(default_rows(), 0);
	cr_assert_eq(harness_relay_stop(r, SIGTERM, 30000), 0);
	fixture_relay_start(&g_fx, NULL);
	fixture_expect_unique(&g_fx, g_fx.cons, (size_t)rows, DELIVERY_TIMEOUT_MS);
	expect_key_order(g_fx.cons);
	cr_assert_eq(harness_pg_int(g_fx.pg, "SELECT count(*) FROM %s WHERE published_at IS NULL",
	                            g_fx.table),
	             0);
	fixture_teardown(&g_fx);
}
