/* The operator side on a table the cursor source runs (its position row exists), the state
 * built by hand in SQL as the cursor source leaves it (docs/design.md): rows behind the
 * position are published without a trace unless deferred; deferred rows are failed, dead,
 * held, leased by its exception path, or published later (published_at). status, dead, keys
 * --blocked, requeue, discard, purge and replay read and change it by the cursor's definitions;
 * rows above the position are the relay's; and the lease source refuses the table. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libpq-fe.h>

#include "store/store.h"
#include "store/operator/admin.h"
#include "store/operator/replay.h"
#include "tests/support/fixture.h"

static struct fixture g_fx;

static void teardown(void)
{
	fixture_teardown(&g_fx);
}

TestSuite(cursor_operator, .fini = teardown, .timeout = 120);

/* One row: id, ordering key (NULL: none), and the SQL values of the columns the cursor writes
 * (or the producer's defaults), created_at relative to now. */
static void row(const char *id, const char *key, const char *created, const char *extra_cols,
                const char *extra_vals)
{
	char k[64];

	snprintf(k, sizeof(k), key ? "'%s'" : "NULL", key);
	harness_pg_exec(
	        g_fx.pg,
	        "INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key,"
	        " created_at%s) VALUES ('%s', 'ex', 'rk', '{}', %s, now() - interval '%s'%s)",
	        g_fx.table, extra_cols, id, k, created, extra_vals);
}

#define OLD   "2 days"
#define YOUNG "0 s"

/* Deferred (the cursor passed it), with attempts and available_at as given. */
static void deferred(const char *id, const char *key, int attempts, const char *available)
{
	char vals[256];

	snprintf(vals, sizeof(vals), ", now() - interval '1 hour', %d, %s, %s", attempts, available,
	         attempts > 0 ? "'boom'" : "NULL");
	row(id, key, OLD, ", deferred_at, attempts, available_at, last_error", vals);
}

/* The table as a cursor relay leaves it; returns the position (the seq of 'pub3').
 *   behind the position: pub1 pub2 pubk1 pubk3 (published, old), dfail (k1, failed, waits),
 *     dheld (k1, held behind dfail), ddead (dead), ddeadk (k2, dead), dleased (leased by the
 *     exception path), dpubold / dpubnew (deferred, then published 2 days / 1 minute ago),
 *     pub4 (published, old), pubyoung (published, young), pub3 (published, old);
 *   above it: a1 (old), a2 (k3), adead (dead: a lease relay's, before the cursor came). */
static int64_t build(const char *tag)
{
	fixture_setup(&g_fx, tag, &(struct fixture_options){ .no_consumer = true });
	row("pub1", NULL, OLD, "", "");
	row("pub2", NULL, OLD, "", "");
	row("pubk1", "k1", OLD, "", "");
	row("pubk3", "k3", OLD, "", "");
	deferred("dfail", "k1", 1, "now() + interval '1 hour'");
	deferred("dheld", "k1", 0, "now()");
	deferred("ddead", NULL, 3, "now()");
	deferred("ddeadk", "k2", 3, "now()");
	deferred("dleased", NULL, 0, "now()");
	harness_pg_exec(g_fx.pg,
	                "UPDATE %s SET locked_by = 'cursor#1', locked_until = now() + interval"
	                " '1 minute' WHERE id = 'dleased'",
	                g_fx.table);
	row("dpubold", NULL, OLD, ", deferred_at, published_at",
	    ", now() - interval '2 days', now() - interval '2 days'");
	row("dpubnew", NULL, OLD, ", deferred_at, published_at",
	    ", now() - interval '1 hour', now() - interval '1 minute'");
	row("pub4", NULL, OLD, "", "");
	row("pubyoung", NULL, YOUNG, "", "");
	row("pub3", NULL, OLD, "", "");
	row("a1", NULL, OLD, "", "");
	row("a2", "k3", YOUNG, "", "");
	row("adead", NULL, YOUNG, ", attempts, last_error", ", 3, 'boom'");
	harness_pg_exec(g_fx.pg,
	                "INSERT INTO %s_position (stream, position, leader)"
	                " SELECT 'main', seq, 'r1' FROM %s WHERE id = 'pub3'",
	                g_fx.table, g_fx.table);
	return harness_pg_int(g_fx.pg, "SELECT position FROM %s_position", g_fx.table);
}

static struct store *admin(void)
{
	struct store_options o = fixture_store_options(&g_fx, "admin", true);

	return fixture_store_open(&g_fx, &o);
}

/* The ids of a list, comma-separated (static buffer). */
static const char *ids_of(const struct store_list *l)
{
	static char out[512];
	size_t at = 0;

	out[0] = '\0';
	for (size_t i = 0; i < l->n; i++)
		at += (size_t)snprintf(out + at, sizeof(out) - at, "%s%s", i ? "," : "",
		                       l->items[i].id);
	return out;
}

/* The ids left in the table, in seq order (new string). */
static char *ids_left(void)
{
	return harness_pg_string(g_fx.pg, "SELECT string_agg(id, ',' ORDER BY seq) FROM %s",
	                         g_fx.table);
}

Test(cursor_operator, status_dead_and_blocked_keys_by_the_cursors_definitions)
{
	struct store_status st;
	struct store_list l;
	struct store *s;

	build("cop_status");
	s = admin();
	cr_assert_eq(store_status(s, &st), 0, "%s", store_errmsg(s));
	/* Unpublished: dfail dheld dleased a1 a2 pending, ddead ddeadk adead dead. */
	cr_expect_eq(st.pending, 5, "pending %lld", (long long)st.pending);
	cr_expect_eq(st.dead, 3, "dead %lld", (long long)st.dead);
	cr_expect_eq(st.leased, 1, "leased %lld (dleased)", (long long)st.leased);
	/* pub1 pub2 pubk1 pubk3 pub4 pubyoung pub3 (no trace) and dpubold dpubnew. */
	cr_expect_eq(st.published, 9, "published %lld", (long long)st.published);
	cr_expect_geq(st.oldest_pending_age_s, 2 * 86400 - 600, "a1 is two days old: %f",
	              st.oldest_pending_age_s);
	cr_expect_eq(st.blocked_keys, 2, "k1 (dfail waits) and k2 (ddeadk dead): %lld",
	             (long long)st.blocked_keys);
	cr_expect_str_eq(st.oldest_blocked_key, "k1");

	cr_assert_eq(store_dead(s, 0, &l), 0, "%s", store_errmsg(s));
	cr_expect_str_eq(ids_of(&l), "ddead,ddeadk,adead");
	store_list_free(&l);
	cr_assert_eq(store_blocked_keys(s, 0, &l), 0, "%s", store_errmsg(s));
	cr_expect_str_eq(ids_of(&l), "dfail,ddeadk");
	store_list_free(&l);

	/* The position moves past a1 and a2 (published): they leave the counts. */
	harness_pg_exec(g_fx.pg,
	                "UPDATE %s_position SET position = (SELECT seq FROM %s WHERE id = 'a2')",
	                g_fx.table, g_fx.table);
	cr_assert_eq(store_status(s, &st), 0, "%s", store_errmsg(s));
	cr_expect_eq(st.pending, 3);
	cr_expect_eq(st.published, 11);
	cr_expect_eq(st.dead, 3, "adead is still above the position");
	store_free(s);
	fixture_teardown(&g_fx);
}

Test(cursor_operator, requeue_and_discard_act_on_deferred_rows_and_leave_the_relays_alone)
{
	const char *one[1];
	struct store_ids_outcome o;
	struct store *s;
	int64_t n = -1;

	build("cop_ids");
	s = admin();

	/* Published (behind the position, never deferred): nothing to do. */
	one[0] = "pub1";
	cr_assert_eq(store_requeue_ids(s, one, 1, false, &o), 0, "%s", store_errmsg(s));
	cr_expect_eq(o.changed, 0);
	cr_expect_eq(o.leased, 0);
	cr_assert_eq(store_discard_ids(s, one, 1, true, &o), 0, "%s", store_errmsg(s));
	cr_expect_eq(o.changed, 0, "a published row was discarded");

	/* Above the position: the relay's, refused unless forced. */
	one[0] = "a1";
	cr_assert_eq(store_requeue_ids(s, one, 1, false, &o), 0, "%s", store_errmsg(s));
	cr_expect_eq(o.changed, 0);
	cr_expect_eq(o.leased, 1);
	cr_expect_eq(o.ahead, 1);
	cr_expect(o.n_listed == 1 && o.listed[0].ahead && strcmp(o.listed[0].id, "a1") == 0);
	cr_expect_eq(store_discard(s, one, 1, &n), STORE_ERR_QUERY);
	cr_expect(strstr(store_errmsg(s), "above the cursor source's position") &&
	                  strchr(store_errmsg(s), '\n') == NULL,
	          "%s", store_errmsg(s));
	one[0] = "a2";
	cr_assert_eq(store_discard_ids(s, one, 1, true, &o), 0, "%s", store_errmsg(s));
	cr_expect_eq(o.changed, 1, "a forced discard deletes a row above the position");

	/* The exception path's lease: refused unless forced, as on a lease table. */
	one[0] = "dleased";
	cr_assert_eq(store_requeue_ids(s, one, 1, false, &o), 0, "%s", store_errmsg(s));
	cr_expect(o.changed == 0 && o.leased == 1 && o.ahead == 0 && !o.listed[0].ahead);

	/* A deferred dead row: requeued, still deferred (the exception path takes it up). */
	one[0] = "ddead";
	cr_assert_eq(store_requeue(s, one, 1, false, &n), 0, "%s", store_errmsg(s));
	cr_expect_eq(n, 1);
	cr_expect_eq(harness_pg_int(g_fx.pg,
	                            "SELECT count(*) FROM %s WHERE id = 'ddead' AND attempts = 0"
	                            " AND last_error IS NULL AND deferred_at IS NOT NULL"
	                            " AND published_at IS NULL AND available_at <= now()",
	                            g_fx.table),
	             1);
	/* --all-dead: the deferred ones (ddeadk), not adead above the position. */
	cr_assert_eq(store_requeue(s, NULL, 0, true, &n), 0, "%s", store_errmsg(s));
	cr_expect_eq(n, 1);
	cr_expect_eq(harness_pg_int(g_fx.pg,
	                            "SELECT count(*) FROM %s WHERE attempts >= 3 AND id = 'adead'",
	                            g_fx.table),
	             1, "requeue --all-dead changed a row above the position");
	cr_expect_eq(harness_pg_int(g_fx.pg,
	                            "SELECT attempts FROM %s WHERE id = 'ddeadk' AND deferred_at"
	                            " IS NOT NULL",
	                            g_fx.table),
	             0);

	/* Discard of a deferred row. */
	one[0] = "dheld";
	cr_assert_eq(store_discard(s, one, 1, &n), 0, "%s", store_errmsg(s));
	cr_expect_eq(n, 1);
	char *left = ids_left();
	cr_expect_str_eq(left,
	                 "pub1,pub2,pubk1,pubk3,dfail,ddead,ddeadk,dleased,dpubold,dpubnew,pub4,"
	                 "pubyoung,pub3,a1,adead");
	free(left);
	store_free(s);
	fixture_teardown(&g_fx);
}

Test(cursor_operator, purge_deletes_old_published_rows_only)
{
	struct store *s;
	int64_t n = -1;
	char *left;

	build("cop_purge");
	s = admin();
	/* Slices of 2 rows: the walk behind the position goes on over the deferred rows. */
	cr_assert_eq(store_purge(s, 86400000, 2, NULL, &n), 0, "%s", store_errmsg(s));
	/* pub1 pub2 pubk1 pubk3 pub4 (old, behind, no trace) and dpubold (published_at old);
	 * pub3 stays: it comes after pubyoung, where the walk stops. */
	cr_expect_eq(n, 6, "purged %lld", (long long)n);
	left = ids_left();
	cr_expect_str_eq(left,
	                 "dfail,dheld,ddead,ddeadk,dleased,dpubnew,pubyoung,pub3,a1,a2,adead");
	free(left);
	/* Once pubyoung is old too, pub3 goes; a1 (old, above the position) never. */
	harness_pg_exec(
	        g_fx.pg,
	        "UPDATE %s SET created_at = now() - interval '3 days' WHERE id = 'pubyoung'",
	        g_fx.table);
	cr_assert_eq(store_purge(s, 86400000, 1000, NULL, &n), 0, "%s", store_errmsg(s));
	cr_expect_eq(n, 2);
	left = ids_left();
	cr_expect_str_eq(left, "dfail,dheld,ddead,ddeadk,dleased,dpubnew,a1,a2,adead");
	free(left);
	store_free(s);
	fixture_teardown(&g_fx);
}

/* Replay's callbacks: the reasons it gave, joined. */
static int note_reason(const struct store_replay_row *r, void *arg)
{
	char *out = arg;
	size_t len = strlen(out);

	snprintf(out + len, 1024 - len, "%s=%s;", r->id ? r->id : r->ordering_key,
	         r->reason ? r->reason : "");
	return 0;
}

Test(cursor_operator, replay_defers_published_rows_and_waits_for_keys_in_the_relays_hands)
{
	char asked[64], reasons[1024] = "";
	const char *ids[] = { "pub1", "pubk1", "pubk3", "dpubnew", "a1", "dfail" };
	struct store_replay_filter f = { .ids = ids, .n_ids = 6 };
	struct store_replay_progress p = { 0 };
	struct store *s;
	int64_t n = -1;

	build("cop_replay");
	s = admin();
	cr_assert_eq(store_replay_begin(s, asked, sizeof(asked)), 0, "%s", store_errmsg(s));
	cr_assert_eq(store_replay_select(s, &f, &n), 0, "%s", store_errmsg(s));
	cr_expect_eq(n, 4, "pub1, pubk1, pubk3 (no trace) and dpubnew: %lld", (long long)n);
	cr_assert_eq(store_replay_missing_ids(s, ids, 6, note_reason, reasons), 0, "%s",
	             store_errmsg(s));
	cr_expect_str_eq(reasons, "a1=not published (pending or dead);"
	                          "dfail=not published (pending or dead);");
	/* Without a filter: every published row (9). */
	{
		struct store_replay_filter all = { 0 };
		int64_t m = -1;

		cr_assert_eq(store_replay_begin(s, asked, sizeof(asked)), 0, "%s", store_errmsg(s));
		cr_assert_eq(store_replay_select(s, &all, &m), 0, "%s", store_errmsg(s));
		cr_expect_eq(m, 9);
		cr_assert_eq(store_replay_begin(s, asked, sizeof(asked)), 0, "%s", store_errmsg(s));
		cr_assert_eq(store_replay_select(s, &f, &n), 0, "%s", store_errmsg(s));
	}

	cr_assert_eq(store_replay_step(s, asked, 2000, &p), 0, "%s", store_errmsg(s));
	cr_expect_eq(p.replayed, 3, "pub1, pubk1 (k1's rows are deferred: parked) and dpubnew");
	cr_expect_eq(p.left, 1, "pubk3 waits: a2 (k3) is above the position");
	reasons[0] = '\0';
	cr_assert_eq(store_replay_skipped(s, note_reason, reasons), 0, "%s", store_errmsg(s));
	cr_expect(strstr(reasons, "k3=row 'a2' is in the relay's hands"), "%s", reasons);
	/* Made pending the cursor's way: deferred, fresh, with the replay header. */
	cr_expect_eq(
	        harness_pg_int(g_fx.pg,
	                       "SELECT count(*) FROM %s WHERE id IN ('pub1', 'pubk1', 'dpubnew')"
	                       " AND published_at IS NULL AND deferred_at IS NOT NULL"
	                       " AND attempts = 0 AND last_error IS NULL AND locked_by IS NULL"
	                       " AND available_at <= now()"
	                       " AND headers::jsonb ? '" STORE_REPLAY_HEADER "'",
	                       g_fx.table),
	        3);
	cr_expect_eq(harness_pg_int(g_fx.pg,
	                            "SELECT count(*) FROM %s WHERE id = 'pubk3' AND deferred_at IS"
	                            " NULL",
	                            g_fx.table),
	             1, "pubk3 is left as it was");
	/* k1's deferred rows were parked during the step and are free again. */
	cr_expect_eq(harness_pg_int(g_fx.pg,
	                            "SELECT count(*) FROM %s WHERE ordering_key = 'k1' AND"
	                            " locked_until > now()",
	                            g_fx.table),
	             0);
	/* The status counts them as pending now. */
	{
		struct store_status st;

		cr_assert_eq(store_status(s, &st), 0, "%s", store_errmsg(s));
		cr_expect_eq(st.pending, 5 + 3);
		cr_expect_eq(st.published, 9 - 3);
	}
	store_free(s);
	fixture_teardown(&g_fx);
}

Test(cursor_operator, the_lease_source_refuses_a_table_the_cursor_runs)
{
	struct store_options o;
	struct store *r;

	fixture_setup(&g_fx, "cop_lease", &(struct fixture_options){ .no_consumer = true });
	/* The position table alone (migrate makes it) does not make it the cursor's. */
	o = fixture_store_options(&g_fx, "lease-1", false);
	r = fixture_store_open(&g_fx, &o);
	store_free(r);

	harness_pg_exec(g_fx.pg, "INSERT INTO %s_position (stream, position) VALUES ('main', 0)",
	                g_fx.table);
	o = fixture_store_options(&g_fx, "lease-2", false);
	r = store_new(&o);
	cr_assert_not_null(r);
	cr_assert_eq(store_connect(r), STORE_ERR_FATAL);
	char want[512];
	snprintf(want, sizeof(want),
	         "%s is run by the cursor source (relay.source = cursor): its published rows carry"
	         " no published_at; set relay.source = cursor, or run outbox-relay leave-cursor"
	         " to hand it to the lease source",
	         g_fx.table);
	cr_expect_str_eq(store_errmsg(r), want);
	store_free(r);

	/* Opened for the cursor source, the same table is fine. */
	o = fixture_store_options(&g_fx, "cursor-1", false);
	o.cursor = true;
	r = fixture_store_open(&g_fx, &o);
	store_free(r);
	fixture_teardown(&g_fx);
}
