/* `outbox-relay leave-cursor` (store/operator/leave_cursor.c): a table the cursor source ran is
 * handed to the lease source. The rows behind the position that the cursor published get
 * published_at (the position's last move), nothing else changes, the position row goes, and the
 * lease source takes the table: it claims the rows above the position and the exceptions that
 * are due, and never publishes a row the cursor published. Refused while a cursor relay leads
 * the table; a run cut short is finished by the next. The state is built in SQL as the cursor
 * source leaves it (as tests/integration/test_cursor_operator.c does), and once end to end: a
 * cursor relay, then leave-cursor, then a lease relay, with a real broker and consumer. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libpq-fe.h>

#include "store/store.h"
#include "store/operator/leave_cursor.h"
#include "store/source/lease.h"
#include "store/source/position.h"
#include "tests/support/fixture.h"

#define DELIVERY_TIMEOUT_MS 120000
#define MOVED_AT            "2020-01-02 03:04:05.123456+00"
#define MOVED_AT_ISO        "2020-01-02T03:04:05.123456Z"

static struct fixture g_fx;

static void teardown(void)
{
	fixture_teardown(&g_fx);
}

TestSuite(leave_cursor, .fini = teardown, .timeout = 300);

/* One row: id, ordering key (NULL: none), then extra columns and their SQL values. */
static void row(const char *id, const char *key, const char *extra_cols, const char *extra_vals)
{
	char k[64];

	snprintf(k, sizeof(k), key ? "'%s'" : "NULL", key);
	harness_pg_exec(g_fx.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key%s)"
	                " VALUES ('%s', 'ex', 'rk', '{}', %s%s)",
	                g_fx.table, extra_cols, id, k, extra_vals);
}

/* An exception: deferred by the cursor, with attempts and available_at as given. */
static void deferred(const char *id, const char *key, int attempts, const char *available)
{
	char vals[256];

	snprintf(vals, sizeof(vals), ", now() - interval '1 hour', %d, %s, 'boom'", attempts,
	         available);
	row(id, key, ", deferred_at, attempts, available_at, last_error", vals);
}

/* The position row at the seq of row id, moved at MOVED_AT; returns the position. */
static int64_t position_at(const char *id)
{
	harness_pg_exec(g_fx.pg,
	                "INSERT INTO %s_position (stream, position, leader, moved_at)"
	                " SELECT 'main', seq, 'r1', '" MOVED_AT "' FROM %s WHERE id = '%s'",
	                g_fx.table, g_fx.table, id);
	return harness_cursor_position(g_fx.pg, g_fx.table);
}

/* The table as a cursor relay leaves it (max_attempts 3, as the fixture's stores have it):
 *   behind the position: u1 u2 ka1(ka) u3 kb1(kb) ka2(ka), published by the cursor (nothing
 *     written); dfail (failed, due), dwait (failed, backing off for an hour), ddead (dead),
 *     dkey (kc, failed, due): exceptions; dpub (an exception published later); u4, the last
 *     row the cursor published, at the position;
 *   above it: a1, a2(ka), a3(kb), a4(kd), not yet read. */
static int64_t build(const char *tag)
{
	fixture_setup(&g_fx, tag, &(struct fixture_options){ .no_consumer = true });
	row("u1", NULL, "", "");
	row("u2", NULL, "", "");
	row("ka1", "ka", "", "");
	row("u3", NULL, "", "");
	row("kb1", "kb", "", "");
	row("ka2", "ka", "", "");
	deferred("dfail", NULL, 1, "now() - interval '1 minute'");
	deferred("dwait", NULL, 1, "now() + interval '1 hour'");
	deferred("ddead", NULL, 3, "now() - interval '1 minute'");
	deferred("dkey", "kc", 1, "now() - interval '1 minute'");
	row("dpub", NULL, ", deferred_at, published_at",
	    ", now() - interval '2 hours', '2021-05-06 07:08:09+00'");
	row("u4", NULL, "", "");
	row("a1", NULL, "", "");
	row("a2", "ka", "", "");
	row("a3", "kb", "", "");
	row("a4", "kd", "", "");
	return position_at("u4");
}

#define CURSOR_PUBLISHED "u1,u2,ka1,u3,kb1,ka2,u4"

/* The ids with published_at = MOVED_AT, in seq order (new string; NULL when none). */
static char *marked_ids(void)
{
	return harness_pg_string(g_fx.pg,
	                         "SELECT string_agg(id, ',' ORDER BY seq) FROM %s"
	                         " WHERE published_at = '" MOVED_AT "'",
	                         g_fx.table);
}

/* A fingerprint of the rows where cond holds (SQL on the table's columns). New string. */
static char *fingerprint(const char *cond)
{
	return harness_pg_string(g_fx.pg,
	                         "SELECT md5(string_agg(t::text, '|' ORDER BY seq)) FROM %s t"
	                         " WHERE %s",
	                         g_fx.table, cond);
}
#define UNTOUCHED "id NOT IN ('u1','u2','ka1','u3','kb1','ka2','u4')"

/* The same of the whole table and the position row. New string. */
static char *fingerprint_all(void)
{
	return harness_pg_string(g_fx.pg,
	                         "SELECT md5(string_agg(t::text, '|' ORDER BY seq)) ||"
	                         " (SELECT COALESCE(md5(string_agg(p::text, '|')), '-')"
	                         " FROM %s_position p) FROM %s t",
	                         g_fx.table, g_fx.table);
}

static struct store *admin(void)
{
	struct store_options o = fixture_store_options(&g_fx, "admin", true);

	return fixture_store_open(&g_fx, &o);
}

/* Settles the ordering watermark (keyed rows are claimable once it passed them), waiting while
 * transactions of other tests on the server hold it back. */
static void settle(struct store *s)
{
	for (int i = 0; i < 1500; i++) {
		int rc = store_settle_watermark(s);

		cr_assert_geq(rc, 0, "settle: %s", store_errmsg(s));
		if (rc == 0)
			return;
		harness_sleep_ms(20);
	}
	cr_assert_fail("the ordering watermark never settled");
}

/* Claims with the lease source until nothing more is claimable; the ids claimed, sorted,
 * comma-separated (static buffer). Claimed rows stay leased, so none comes twice. */
static const char *claim_all(struct store *s)
{
	static char out[1024];
	char *ids[64];
	size_t n = 0, len = 0;
	struct store_batch b;

	store_batch_init(&b);
	for (int round = 0; round < 50; round++) {
		settle(s);
		cr_assert_eq(store_claim(s, false, &b), 0, "claim: %s", store_errmsg(s));
		for (size_t i = 0; i < b.n && n < 64; i++)
			ids[n++] = strdup(b.rows[i].id);
		if (b.n == 0 && !store_keys_more(s))
			break;
	}
	store_batch_free(&b);
	/* Sorted, so that the order of the claims does not matter. */
	for (size_t i = 1; i < n; i++)
		for (size_t j = i; j > 0 && strcmp(ids[j - 1], ids[j]) > 0; j--) {
			char *t = ids[j];

			ids[j] = ids[j - 1];
			ids[j - 1] = t;
		}
	out[0] = '\0';
	for (size_t i = 0; i < n; i++) {
		len += (size_t)snprintf(out + len, sizeof(out) - len, "%s%s", i ? "," : "", ids[i]);
		free(ids[i]);
	}
	return out;
}

/* What the lease source claims on the table, opened as a relay of it would open it. */
static const char *lease_claims(void)
{
	struct store_options o = fixture_store_options(&g_fx, "lease-1", false);
	struct store *lease = fixture_store_open(&g_fx, &o);
	const char *ids = claim_all(lease);

	store_free(lease);
	return ids;
}

/* Sessions holding the table's lead (the cursor source's advisory lock, class "outc"). */
static int64_t lead_holders(void)
{
	return harness_pg_int(g_fx.pg,
	                      "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
	                      " AND classid = 1869968483::bigint::oid AND objsubid = 2"
	                      " AND objid = to_regclass('%s')::oid AND granted",
	                      g_fx.table);
}

Test(leave_cursor, marks_what_the_cursor_published_and_the_lease_source_takes_the_rest)
{
	struct store_leave_outcome lo;
	struct store *s;
	char *before, *after, *ids;
	int64_t pos;

	pos = build("lcv_mark");
	s = admin();
	before = fingerprint_all();

	/* A dry run counts and changes nothing (the position row stays). */
	memset(&lo, 0xff, sizeof(lo));
	cr_assert_eq(store_leave_cursor(s, 2, true, &lo), 0, "%s", store_errmsg(s));
	cr_expect_eq(lo.state, STORE_LEAVE_DONE);
	cr_expect_eq(lo.position, pos);
	cr_expect_eq(lo.marked, 7, "would mark %lld", (long long)lo.marked);
	cr_expect_eq(lo.deferred, 4, "dfail dwait ddead dkey: %lld", (long long)lo.deferred);
	after = fingerprint_all();
	cr_expect_str_eq(after, before, "the dry run changed the table");
	free(after);
	free(before);

	/* The run, two rows a statement: unkeyed rows in two batches, keyed ones in two. */
	before = fingerprint(UNTOUCHED);
	memset(&lo, 0xff, sizeof(lo));
	cr_assert_eq(store_leave_cursor(s, 2, false, &lo), 0, "%s", store_errmsg(s));
	cr_expect_eq(lo.state, STORE_LEAVE_DONE);
	cr_expect_eq(lo.position, pos);
	cr_expect_str_eq(lo.moved_at, MOVED_AT_ISO);
	cr_expect_eq(lo.marked, 7, "marked %lld", (long long)lo.marked);
	cr_expect_eq(lo.deferred, 4, "deferred %lld", (long long)lo.deferred);
	/* Exactly the rows the cursor published got published_at, its last move ... */
	ids = marked_ids();
	cr_expect_str_eq(ids ? ids : "(none)", CURSOR_PUBLISHED);
	free(ids);
	/* ... no other row changed (dpub keeps its own published_at; the exceptions and the rows
	 * above the position keep every column), and the position row is gone. */
	cr_expect_eq(harness_pg_int(g_fx.pg,
	                            "SELECT count(*) FROM %s WHERE published_at IS NOT NULL",
	                            g_fx.table),
	             8);
	after = fingerprint(UNTOUCHED);
	cr_expect_str_eq(after, before, "a row the cursor did not publish changed");
	free(after);
	free(before);
	cr_expect_eq(harness_cursor_position(g_fx.pg, g_fx.table), -1);
	cr_expect_eq(lead_holders(), 0, "the lead was not let go");

	/* A second run has nothing to do. */
	cr_assert_eq(store_leave_cursor(s, 2, false, &lo), 0, "%s", store_errmsg(s));
	cr_expect_eq(lo.state, STORE_LEAVE_NOT_CURSOR);
	store_free(s);

	/* The lease source takes the table (no refusal), and claims exactly the rows above the
	 * position and the exceptions that are due: a2 (ka) is claimable because ka1 and ka2 are
	 * marked, a3 (kb) because kb1 is; dwait waits for its time and ddead for an operator. */
	cr_expect_str_eq(lease_claims(), "a1,a2,a3,a4,dfail,dkey");
	fixture_teardown(&g_fx);
}

Test(leave_cursor, refused_while_a_cursor_relay_leads_and_nothing_changes)
{
	struct store_leave_outcome lo;
	struct store_options o;
	struct harness_output out;
	struct store *s, *cursor;
	char *before, *after;
	int64_t pos = 0;

	build("lcv_led");
	/* A cursor relay's store takes the lead, as the relay does. */
	o = fixture_store_options(&g_fx, "cursor-1", false);
	o.cursor = true;
	cursor = fixture_store_open(&g_fx, &o);
	cr_assert_eq(position_lead(cursor, &pos), 1, "the cursor store did not lead: %s",
	             store_errmsg(cursor));
	cr_assert_eq(lead_holders(), 1);
	before = fingerprint_all();

	s = admin();
	memset(&lo, 0xff, sizeof(lo));
	cr_assert_eq(store_leave_cursor(s, 2, false, &lo), 0, "%s", store_errmsg(s));
	cr_expect_eq(lo.state, STORE_LEAVE_LED);
	cr_assert_eq(store_leave_cursor(s, 2, true, &lo), 0, "%s", store_errmsg(s));
	cr_expect_eq(lo.state, STORE_LEAVE_LED);
	store_free(s);

	/* The command says why, names the table and the way on, and exits 1. */
	harness_cli(&out, g_fx.table, NULL, "leave-cursor", NULL);
	cr_expect_eq(out.status, 1, "leave-cursor exited %d: %s%s", out.status, out.out, out.err);
	cr_expect(strstr(out.err, "a relay with relay.source = cursor leads table") &&
	                  strstr(out.err, g_fx.table) &&
	                  strstr(out.err, "stop every relay of the table first") &&
	                  strstr(out.err, "nothing was changed") &&
	                  strchr(out.err, '\n') == out.err + strlen(out.err) - 1,
	          "stderr: %s", out.err);
	cr_expect_str_eq(out.out, "");
	harness_output_free(&out);
	after = fingerprint_all();
	cr_expect_str_eq(after, before, "a refused leave-cursor changed the table");
	free(after);
	free(before);
	/* The leader still leads, alone. */
	cr_expect_eq(lead_holders(), 1);

	/* Once the relay is gone, the command does it. */
	store_free(cursor);
	HARNESS_WAIT(lead_holders() == 0, 30000);
	cr_assert_eq(lead_holders(), 0, "the cursor store's session kept the lead");
	harness_cli(&out, g_fx.table, NULL, "leave-cursor", "--dry-run", NULL);
	cr_expect_eq(out.status, 0, "leave-cursor --dry-run exited %d: %s", out.status, out.err);
	cr_expect(strstr(out.out, "7 rows behind position") && strstr(out.out, "would be marked") &&
	                  strstr(out.out, "nothing was changed"),
	          "stdout: %s", out.out);
	harness_output_free(&out);
	cr_expect_eq(harness_cursor_position(g_fx.pg, g_fx.table), pos);
	harness_cli(&out, g_fx.table, NULL, "leave-cursor", NULL);
	cr_expect_eq(out.status, 0, "leave-cursor exited %d: %s", out.status, out.err);
	cr_expect(strstr(out.out, "handed to the lease source: 7 rows behind position") &&
	                  strstr(out.out, MOVED_AT_ISO) && strstr(out.out, "4 deferred rows") &&
	                  strstr(out.out, "set relay.source = lease"),
	          "stdout: %s", out.out);
	harness_output_free(&out);
	cr_expect_eq(harness_cursor_position(g_fx.pg, g_fx.table), -1);
	harness_cli(&out, g_fx.table, NULL, "leave-cursor", NULL);
	cr_expect_eq(out.status, 0);
	cr_expect(strstr(out.out, "is not run by the cursor source") &&
	                  strstr(out.out, "nothing to do"),
	          "stdout: %s", out.out);
	harness_output_free(&out);
	fixture_teardown(&g_fx);
}

Test(leave_cursor, a_run_cut_short_is_finished_by_the_next)
{
	struct store_leave_outcome lo = { 0 };
	struct store_options o;
	struct store *s, *lease;
	char *ids;
	int rc;

	build("lcv_cut");
	/* The third unkeyed row cannot be written: the second batch fails. The trigger also
	 * says whether its session held the table's lead while it marked. */
	harness_pg_exec(g_fx.pg,
	                "CREATE FUNCTION %s_cut() RETURNS trigger LANGUAGE plpgsql AS $$"
	                " BEGIN RAISE EXCEPTION 'cut short, lead held: %%', (SELECT count(*)"
	                " FROM pg_locks WHERE locktype = 'advisory'"
	                " AND classid = 1869968483::bigint::oid AND objsubid = 2"
	                " AND objid = TG_RELID AND pid = pg_backend_pid() AND granted); END $$;"
	                " CREATE TRIGGER %s_cut BEFORE UPDATE ON %s FOR EACH ROW"
	                " WHEN (NEW.id = 'u3') EXECUTE FUNCTION %s_cut()",
	                g_fx.table, g_fx.table, g_fx.table, g_fx.table);
	fixture_drop_later(&g_fx, "DROP FUNCTION IF EXISTS %s_cut()", g_fx.table);
	s = admin();
	rc = store_leave_cursor(s, 2, false, &lo);
	cr_expect_eq(rc, STORE_ERR_QUERY, "%d: %s", rc, store_errmsg(s));
	cr_expect(strstr(store_errmsg(s), "2 marked so far") &&
	                  strstr(store_errmsg(s), "run leave-cursor again") &&
	                  strstr(store_errmsg(s), "cut short, lead held: 1"),
	          "%s", store_errmsg(s));
	/* The oldest rows were marked, one batch; the table is still the cursor's, the lead was let
	 * go, and the lease source still refuses it. */
	ids = marked_ids();
	cr_expect_str_eq(ids ? ids : "(none)", "u1,u2");
	free(ids);
	cr_expect_neq(harness_cursor_position(g_fx.pg, g_fx.table), -1);
	cr_expect_eq(lead_holders(), 0, "the lead was not let go after the failure");
	o = fixture_store_options(&g_fx, "lease-early", false);
	lease = store_new(&o);
	cr_assert_not_null(lease);
	cr_expect_eq(store_connect(lease), STORE_ERR_FATAL, "the lease source took a cursor table");
	cr_expect(strstr(store_errmsg(lease),
	                 "run outbox-relay leave-cursor to hand it to the lease"
	                 " source") != NULL,
	          "%s", store_errmsg(lease));
	store_free(lease);

	/* The next run finishes the job. */
	harness_pg_exec(g_fx.pg, "DROP TRIGGER %s_cut ON %s", g_fx.table, g_fx.table);
	cr_assert_eq(store_leave_cursor(s, 2, false, &lo), 0, "%s", store_errmsg(s));
	cr_expect_eq(lo.state, STORE_LEAVE_DONE);
	cr_expect_eq(lo.marked, 5, "marked %lld (u1 and u2 were already)", (long long)lo.marked);
	ids = marked_ids();
	cr_expect_str_eq(ids ? ids : "(none)", CURSOR_PUBLISHED);
	free(ids);
	cr_expect_eq(harness_cursor_position(g_fx.pg, g_fx.table), -1);
	store_free(s);
	cr_expect_str_eq(lease_claims(), "a1,a2,a3,a4,dfail,dkey");
	fixture_teardown(&g_fx);
}

/* Every third row has one of five ordering keys. */
static void keyed_rows(size_t i, struct outbox_row *r, void *arg)
{
	static char key[16];

	(void)arg;
	if (i % 3 == 0) {
		snprintf(key, sizeof(key), "key-%zu", i % 5);
		r->ordering_key = key;
	}
}

#define N_CURSOR 300
#define M_LEASE  200

Test(leave_cursor, end_to_end_a_cursor_relay_then_a_lease_relay_publish_every_row_once)
{
	struct harness_output out;
	struct harness_relay *r;
	size_t received;
	int64_t top;
	char want[64];

	fixture_setup(&g_fx, "lcv_e2e", NULL);
	r = fixture_relay_start(&g_fx, (const char *[]){ "OUTBOX_RELAY_SOURCE=cursor", NULL });
	harness_insert_rows(g_fx.pg, g_fx.table, N_CURSOR, g_fx.exchange, "lcv.created", "n",
	                    keyed_rows, NULL);
	fixture_expect_unique(&g_fx, g_fx.cons, N_CURSOR, DELIVERY_TIMEOUT_MS);
	/* Once the position has passed every row, the cursor relay stops: nothing is owed. */
	top = harness_pg_int(g_fx.pg, "SELECT max(seq) FROM %s", g_fx.table);
	HARNESS_WAIT(harness_cursor_position(g_fx.pg, g_fx.table) >= top, DELIVERY_TIMEOUT_MS);
	cr_assert_geq(harness_cursor_position(g_fx.pg, g_fx.table), top,
	              "the position never passed the rows");
	cr_assert_eq(harness_relay_stop(r, SIGTERM, 30000), 0, "the cursor relay did not stop");
	cr_assert_eq(harness_pg_int(g_fx.pg, "SELECT count(*) FROM %s WHERE published_at IS NULL",
	                            g_fx.table),
	             N_CURSOR, "the cursor wrote published_at");

	harness_cli(&out, g_fx.table, NULL, "leave-cursor", NULL);
	cr_assert_eq(out.status, 0, "leave-cursor exited %d: %s%s", out.status, out.out, out.err);
	snprintf(want, sizeof(want), "handed to the lease source: %d rows", N_CURSOR);
	cr_expect(strstr(out.out, want) != NULL, "stdout: %s", out.out);
	harness_output_free(&out);

	/* The lease relay starts on the table (no refusal) and publishes what comes next. */
	r = fixture_relay_start(&g_fx, (const char *[]){ "OUTBOX_RELAY_SOURCE=lease", NULL });
	harness_insert_rows(g_fx.pg, g_fx.table, M_LEASE, g_fx.exchange, "lcv.created", "m",
	                    keyed_rows, NULL);
	fixture_expect_unique(&g_fx, g_fx.cons, N_CURSOR + M_LEASE, DELIVERY_TIMEOUT_MS);
	/* Every row is published now (marked): the relay claims nothing more. One last row
	 * through the same queue then comes after anything it published before. */
	HARNESS_WAIT(harness_pg_int(g_fx.pg, "SELECT count(*) FROM %s WHERE published_at IS NULL",
	                            g_fx.table) == 0,
	             DELIVERY_TIMEOUT_MS);
	cr_assert_eq(harness_pg_int(g_fx.pg, "SELECT count(*) FROM %s WHERE published_at IS NULL",
	                            g_fx.table),
	             0, "the lease relay left rows unpublished");
	harness_insert_rows(g_fx.pg, g_fx.table, 1, g_fx.exchange, "lcv.created", "last", NULL,
	                    NULL);
	fixture_expect_unique(&g_fx, g_fx.cons, N_CURSOR + M_LEASE + 1, DELIVERY_TIMEOUT_MS);
	received = consumer_received(g_fx.cons);
	cr_expect_eq(received, (size_t)(N_CURSOR + M_LEASE + 1),
	             "%zu deliveries for %d messages: the lease relay published rows again",
	             received, N_CURSOR + M_LEASE + 1);
	for (int i = 0; i < N_CURSOR; i++) {
		char id[32];

		snprintf(id, sizeof(id), "n-%07d", i);
		cr_expect_eq(consumer_count(g_fx.cons, id), 1, "%s delivered %zu times", id,
		             consumer_count(g_fx.cons, id));
	}
	cr_expect_eq(harness_relay_log_count(r, "is run by the cursor source"), 0);
	fixture_teardown(&g_fx);
}
