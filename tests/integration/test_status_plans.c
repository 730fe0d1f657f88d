/* The operator statements on a table with a million published rows: the gauges the maintenance
 * loop reads every few seconds, the dead and blocked lists, requeue --all-dead and the purge
 * must cost O(unpublished rows) (or O(rows purged)), never a walk of the whole table. EXPLAIN
 * of the exact statements the store runs (store_admin_sql()) shows no sequential scan of the
 * table, and the counts are right. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libpq-fe.h>

#include "store/store.h"
#include "store/operator/admin.h"
#include "store/store_private.h"
#include "tests/support/fixture.h"

#define PUBLISHED 1000000
#define OLD_ROWS  10000 /* published more than a day ago: the purge's share */

/* EXPLAIN of sql with params, as one text (new string). */
static char *explain(PGconn *c, const char *sql, int n, const char *const *params)
{
	size_t len = strlen(sql) + 16, used = 0, cap = 65536;
	char *q = malloc(len), *plan = malloc(cap);
	PGresult *r;

	cr_assert(q && plan);
	snprintf(q, len, "EXPLAIN %s", sql);
	r = PQexecParams(c, q, n, NULL, params, NULL, NULL, 0);
	cr_assert_eq(PQresultStatus(r), PGRES_TUPLES_OK, "%s: %s", q, PQresultErrorMessage(r));
	plan[0] = '\0';
	for (int i = 0; i < PQntuples(r) && used < cap - 1; i++)
		used += (size_t)snprintf(plan + used, cap - used, "%s\n", PQgetvalue(r, i, 0));
	PQclear(r);
	free(q);
	return plan;
}

/* A sequential scan of table t (not of the flag table or a catalog) anywhere in the plan. */
static bool scans_table(const char *plan, const char *t)
{
	char needle[96];
	const char *p = plan;

	snprintf(needle, sizeof(needle), "Seq Scan on %s", t);
	while ((p = strstr(p, needle)) != NULL) {
		char next = p[strlen(needle)];

		if (next == ' ' || next == '\n' || next == '\0')
			return true;
		p += strlen(needle);
	}
	return false;
}

/* A connected admin store on fx's table, as the maintenance loop opens one. */
static struct store *open_admin(struct fixture *fx)
{
	struct store_options o = fixture_store_options(fx, "plans", true);

	o.channel = "";
	return fixture_store_open(fx, &o);
}

static void check_plan(PGconn *c, struct store *s, enum store_admin_sql which, const char *name,
                       const char *t, int n, const char *const *params, const char *want_index)
{
	char sql[16384];
	char *plan;

	cr_assert_eq(store_admin_sql(s, which, sql, sizeof(sql)), 0, "%s", store_errmsg(s));
	plan = explain(c, sql, n, params);
	cr_assert_not(scans_table(plan, t), "%s walks the whole table:\n%s", name, plan);
	if (want_index) {
		cr_assert(strstr(plan, want_index), "%s does not use %s:\n%s", name, want_index,
		          plan);
	} else {
		/* Nor a walk of an index over every row (or every published one). */
		const char *whole[] = { "_published_idx", "_pkey", "_seq_key" };

		for (size_t i = 0; i < sizeof(whole) / sizeof(whole[0]); i++) {
			char idx[96];

			snprintf(idx, sizeof(idx), "%s%s", t, whole[i]);
			cr_assert_null(strstr(plan, idx), "%s walks %s:\n%s", name, idx, plan);
		}
	}
	free(plan);
}

Test(status_plans, gauges_and_lists_cost_unpublished_rows_only, .timeout = 300)
{
	char idx[96];
	struct fixture fx;
	struct store_status st;
	struct store *s;
	int64_t n = -1;

	fixture_setup(&fx, "plans", &(struct fixture_options){ .no_consumer = true });
	/* One statement: 1,000,000 published rows, the oldest OLD_ROWS of them past a day. The
	 * wake-up trigger is left out (session_replication_role): it would run a million times at
	 * commit, and ids in key order keep the primary key's inserts at its right edge. */
	harness_pg_exec(fx.pg, "SET session_replication_role = replica");
	harness_pg_exec(
	        fx.pg,
	        "INSERT INTO %s (id, exchange_name, routing_key, body, published_at)"
	        " SELECT 'pub-' || lpad(g::text, 7, '0'), 'ex', 'rk', '{}', CASE WHEN g <= %d"
	        " THEN now() - interval '2 days' + g * interval '1 ms'"
	        " ELSE now() - interval '1 hour' END FROM generate_series(1, %d) g",
	        fx.table, OLD_ROWS, PUBLISHED);
	harness_pg_exec(fx.pg, "RESET session_replication_role");
	/* Unpublished: 20 pending (3 of them leased, one 100 s old), 4 dead, and keyed rows: K1's
	 * head is dead, K2's head failed and backs off, K3's head is plain pending. */
	harness_pg_exec(fx.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body)"
	                " SELECT 'p-' || g, 'ex', 'rk', '{}' FROM generate_series(1, 20) g",
	                fx.table);
	harness_pg_exec(fx.pg,
	                "UPDATE %s SET locked_by = 'x', locked_until = now() + interval '1 minute'"
	                " WHERE id IN ('p-1', 'p-2', 'p-3')",
	                fx.table);
	harness_pg_exec(
	        fx.pg, "UPDATE %s SET created_at = now() - interval '100 seconds' WHERE id = 'p-4'",
	        fx.table);
	harness_pg_exec(
	        fx.pg,
	        "INSERT INTO %s (id, exchange_name, routing_key, body, attempts, last_error)"
	        " SELECT 'd-' || g, 'ex', 'rk', '{}', 3, 'boom' FROM generate_series(1, 4) g",
	        fx.table);
	harness_pg_exec(fx.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key,"
	                " attempts, available_at) VALUES"
	                " ('k1-a', 'ex', 'rk', '{}', 'K1', 3, now()),"
	                " ('k1-b', 'ex', 'rk', '{}', 'K1', 0, now()),"
	                " ('k2-a', 'ex', 'rk', '{}', 'K2', 1, now() + interval '1 hour'),"
	                " ('k3-a', 'ex', 'rk', '{}', 'K3', 0, now())",
	                fx.table);
	/* The statistics as autovacuum would leave them: wait until the inserts are counted, so
	 * that ANALYZE's count is not added to a second time, then analyze. */
	for (int i = 0; i < 300 && harness_pg_int(fx.pg,
	                                          "SELECT COALESCE((SELECT n_tup_ins FROM"
	                                          " pg_stat_user_tables WHERE relid ="
	                                          " '%s'::regclass), 0)",
	                                          fx.table) < PUBLISHED + 28;
	     i++)
		harness_sleep_ms(100);
	harness_pg_exec(fx.pg, "ANALYZE %s", fx.table);

	s = open_admin(&fx);

	{
		const char *max[1] = { "3" };
		const char *max_lim[2] = { "3", "100" };
		const char *purge[2] = { "86400000", "5000" };

		check_plan(fx.pg, s, STORE_SQL_STATUS, "status", fx.table, 1, max, NULL);
		check_plan(fx.pg, s, STORE_SQL_DEAD, "dead", fx.table, 2, max_lim, NULL);
		check_plan(fx.pg, s, STORE_SQL_BLOCKED, "keys --blocked", fx.table, 2, max_lim,
		           NULL);
		check_plan(fx.pg, s, STORE_SQL_REQUEUE_DEAD, "requeue --all-dead", fx.table, 1, max,
		           NULL);
		snprintf(idx, sizeof(idx), "%s_published_idx", fx.table);
		check_plan(fx.pg, s, STORE_SQL_PURGE, "purge", fx.table, 2, purge, idx);
	}

	cr_assert_eq(store_status(s, &st), 0, "%s", store_errmsg(s));
	cr_assert_eq(st.pending, 20 + 3, "p-1..p-20, k1-b, k2-a and k3-a (leased included)");
	cr_assert_eq(st.leased, 3);
	cr_assert_eq(st.dead, 4 + 1, "d-1..d-4 and k1-a");
	cr_assert_geq(st.oldest_pending_age_s, 99.0);
	cr_assert_eq(st.blocked_keys, 2, "K1 (dead head) and K2 (head backing off)");
	cr_assert_str_eq(st.oldest_blocked_key, "K1");
	/* An estimate from the statistics (ANALYZE samples the table). */
	cr_assert(st.published > PUBLISHED * 9 / 10 && st.published < PUBLISHED * 11 / 10,
	          "published %lld, expected about %d", (long long)st.published, PUBLISHED);

	{
		struct store_list l;

		cr_assert_eq(store_dead(s, 0, &l), 0, "%s", store_errmsg(s));
		cr_assert_eq(l.n, 5);
		store_list_free(&l);
		cr_assert_eq(store_blocked_keys(s, 0, &l), 0, "%s", store_errmsg(s));
		cr_assert_eq(l.n, 2);
		cr_assert_str_eq(l.items[0].id, "k1-a");
		cr_assert_str_eq(l.items[1].id, "k2-a");
		store_list_free(&l);
	}

	/* The purge deletes exactly the rows past the retention, oldest first. */
	cr_assert_eq(store_purge(s, 86400000, 3000, NULL, &n), 0, "%s", store_errmsg(s));
	cr_assert_eq(n, OLD_ROWS);
	cr_assert_eq(
	        harness_pg_int(fx.pg, "SELECT count(*) FROM %s WHERE id LIKE 'pub-%%'", fx.table),
	        PUBLISHED - OLD_ROWS);
	cr_assert_eq(store_requeue(s, NULL, 0, true, &n), 0, "%s", store_errmsg(s));
	cr_assert_eq(n, 5);

	store_free(s);
	fixture_teardown(&fx);
}

/* A small table's published rows are counted, not estimated: right after the inserts, before
 * any statistics exist. */
Test(status_plans, small_table_counts_published_rows, .timeout = 120)
{
	struct fixture fx;
	struct store_status st;
	struct store *s;

	fixture_setup(&fx, "plans_small", &(struct fixture_options){ .no_consumer = true });
	harness_pg_exec(fx.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body, published_at)"
	                " SELECT 'pub-' || g, 'ex', 'rk', '{}', CASE WHEN g <= 7 THEN now() END"
	                " FROM generate_series(1, 10) g",
	                fx.table);
	s = open_admin(&fx);
	cr_assert_eq(store_status(s, &st), 0, "%s", store_errmsg(s));
	cr_assert_eq(st.published, 7);
	cr_assert_eq(st.pending, 3);
	store_free(s);
	fixture_teardown(&fx);
}

/* The gauges over a large backlog: the table holds only unpublished rows, so the status
 * statement reads all of them, and on a session with the server's defaults PostgreSQL plans it
 * with parallel workers and compiles it (JIT). The maintenance loop runs it every few seconds;
 * on the store's admin session the same statement is planned with neither. */
Test(status_plans, admin_session_plans_without_workers_or_jit, .timeout = 300)
{
	char sql[16384];
	const char *max[1] = { "3" };
	struct fixture fx;
	struct store *s;
	char *plain, *admin;

	fixture_setup(&fx, "plans_backlog", &(struct fixture_options){ .no_consumer = true });
	harness_pg_exec(fx.pg, "SET session_replication_role = replica");
	harness_pg_exec(fx.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body)"
	                " SELECT 'p-' || lpad(g::text, 7, '0'), 'ex', 'rk', repeat('x', 1024)"
	                " FROM generate_series(1, 200000) g",
	                fx.table);
	harness_pg_exec(fx.pg, "RESET session_replication_role");
	harness_pg_exec(fx.pg, "ANALYZE %s", fx.table);

	s = open_admin(&fx);
	cr_assert_eq(store_admin_sql(s, STORE_SQL_STATUS, sql, sizeof(sql)), 0);

	/* The server's defaults would use both (else this test shows nothing). */
	plain = explain(fx.pg, sql, 1, max);
	cr_assert(strstr(plain, "Gather") && strstr(plain, "JIT:"),
	          "the status plan with the server's defaults uses neither workers nor JIT, so "
	          "this test cannot tell the admin session apart:\n%s",
	          plain);
	admin = explain(s->conn, sql, 1, max);
	cr_expect(!strstr(admin, "Gather"), "the admin session plans parallel workers:\n%s", admin);
	cr_expect(!strstr(admin, "JIT:"), "the admin session compiles the statement:\n%s", admin);
	free(plain);
	free(admin);
	store_free(s);
	fixture_teardown(&fx);
}

/* A statement on a cursor table must not read an index of every row either: there the unkeyed
 * and key indexes hold every row the cursor published (it writes nothing in them). */
static void check_cursor_plan(PGconn *c, struct store *s, enum store_admin_sql which,
                              const char *name, const char *t, int n, const char *const *params,
                              const char *want_index)
{
	const char *whole[] = { "_published_idx", "_pkey", "_unkeyed_idx" };
	char sql[16384], idx[96];
	char *plan;

	cr_assert_eq(store_admin_sql(s, which, sql, sizeof(sql)), 0, "%s", store_errmsg(s));
	plan = explain(c, sql, n, params);
	cr_assert_not(scans_table(plan, t), "%s walks the whole table:\n%s", name, plan);
	if (want_index)
		cr_assert(strstr(plan, want_index), "%s does not use %s:\n%s", name, want_index,
		          plan);
	for (size_t i = 0; !want_index && i < sizeof(whole) / sizeof(whole[0]); i++) {
		snprintf(idx, sizeof(idx), "%s%s", t, whole[i]);
		cr_assert_null(strstr(plan, idx), "%s walks %s:\n%s", name, idx, plan);
	}
	free(plan);
}

/* The cursor's table: 1,000,000 rows it published (no trace, keyed and not), a few deferred
 * ones behind the position and a few rows above it. */
Test(status_plans, on_a_cursor_table_they_cost_unpublished_rows_only, .timeout = 300)
{
	char pos[24], seq_idx[96], pub_idx[96];
	struct fixture fx;
	struct store_status st;
	struct store *s;
	int64_t n = -1;

	fixture_setup(&fx, "plans_cursor", &(struct fixture_options){ .no_consumer = true });
	harness_pg_exec(fx.pg, "SET session_replication_role = replica");
	harness_pg_exec(fx.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key,"
	                " created_at) SELECT 'pub-' || lpad(g::text, 7, '0'), 'ex', 'rk', '{}',"
	                " CASE WHEN g %% 2 = 0 THEN 'K' || (g %% 100) END,"
	                " CASE WHEN g <= %d THEN now() - interval '2 days' ELSE now() END"
	                " FROM generate_series(1, %d) g",
	                fx.table, OLD_ROWS, PUBLISHED);
	harness_pg_exec(fx.pg, "RESET session_replication_role");
	/* Deferred behind the position: 4 dead (two keyed: K2, K4), K1's head failed and
	 * waiting, 3 pending; all 8 among the old rows. */
	harness_pg_exec(fx.pg,
	                "UPDATE %s SET deferred_at = now(), attempts = CASE WHEN seq <= 4 THEN 3"
	                " WHEN seq = 2000 THEN 1 ELSE 0 END, available_at = CASE WHEN seq = 2000"
	                " THEN now() + interval '1 hour' ELSE now() END,"
	                " ordering_key = CASE WHEN seq = 2000 THEN 'K1' ELSE ordering_key END"
	                " WHERE seq IN (1, 2, 3, 4, 2000, 3001, 3003, 3005)",
	                fx.table);
	harness_pg_exec(
	        fx.pg, "INSERT INTO %s_position (stream, position) SELECT 'main', max(seq) FROM %s",
	        fx.table, fx.table);
	harness_pg_exec(fx.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key)"
	                " SELECT 'p-' || g, 'ex', 'rk', '{}', CASE WHEN g %% 2 = 0 THEN 'K2' END"
	                " FROM generate_series(1, 20) g",
	                fx.table);
	for (int i = 0; i < 300 && harness_pg_int(fx.pg,
	                                          "SELECT COALESCE((SELECT n_tup_ins FROM"
	                                          " pg_stat_user_tables WHERE relid ="
	                                          " '%s'::regclass), 0)",
	                                          fx.table) < PUBLISHED + 20;
	     i++)
		harness_sleep_ms(100);
	harness_pg_exec(fx.pg, "ANALYZE %s", fx.table);
	snprintf(pos, sizeof(pos), "%d", PUBLISHED);

	s = open_admin(&fx);
	{
		const char *max_pos[2] = { "3", pos };
		const char *max_lim_pos[3] = { "3", "100", pos };
		const char *purge[4] = { "86400000", "5000", pos, "0" };

		check_cursor_plan(fx.pg, s, STORE_SQL_CURSOR_STATUS, "status", fx.table, 2, max_pos,
		                  NULL);
		check_cursor_plan(fx.pg, s, STORE_SQL_CURSOR_DEAD, "dead", fx.table, 3, max_lim_pos,
		                  NULL);
		check_cursor_plan(fx.pg, s, STORE_SQL_CURSOR_BLOCKED, "keys --blocked", fx.table, 3,
		                  max_lim_pos, NULL);
		check_cursor_plan(fx.pg, s, STORE_SQL_CURSOR_REQUEUE_DEAD, "requeue --all-dead",
		                  fx.table, 2, max_pos, NULL);
		snprintf(seq_idx, sizeof(seq_idx), "%s_seq_key", fx.table);
		check_cursor_plan(fx.pg, s, STORE_SQL_CURSOR_PURGE_BEHIND, "purge", fx.table, 4,
		                  purge, seq_idx);
		snprintf(pub_idx, sizeof(pub_idx), "%s_published_idx", fx.table);
		check_cursor_plan(fx.pg, s, STORE_SQL_CURSOR_PURGE, "purge", fx.table, 3, purge,
		                  pub_idx);
	}

	cr_assert_eq(store_status(s, &st), 0, "%s", store_errmsg(s));
	cr_expect_eq(st.pending, 20 + 4, "p-1..p-20, the row at 2000 and 3001, 3003, 3005");
	cr_expect_eq(st.dead, 4);
	cr_expect_eq(st.blocked_keys, 3, "K2 and K4 (dead heads at seq 2 and 4) and K1");
	cr_expect_str_eq(st.oldest_blocked_key, "K2");
	cr_expect(st.published > PUBLISHED * 9 / 10 && st.published < PUBLISHED * 11 / 10,
	          "published %lld, expected about %d", (long long)st.published, PUBLISHED);
	/* The rows the cursor published before the cut-off, not the deferred ones among them. */
	cr_assert_eq(store_purge(s, 86400000, 3000, NULL, &n), 0, "%s", store_errmsg(s));
	cr_expect_eq(n, OLD_ROWS - 8, "purged %lld", (long long)n);
	cr_expect_eq(harness_pg_int(fx.pg, "SELECT count(*) FROM %s WHERE deferred_at IS NOT NULL",
	                            fx.table),
	             8);
	store_free(s);
	fixture_teardown(&fx);
}
