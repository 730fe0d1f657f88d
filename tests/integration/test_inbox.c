/* The consumer's dedupe helper (store/liboutbox/inbox.h) against a real PostgreSQL (RELAY_TEST_PG):
 * claims, leases and takeovers, confirmations that commit or roll back with the caller's
 * work, forget, purge, two consumers racing for one message, and what is refused before
 * anything is sent. Each test uses its own table; A and B are two consumers' connections. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libpq-fe.h>

#include "store/liboutbox/inbox.h"
#include "tests/support/fixture.h"

#define LONG_LEASE_MS 60000 /* outlives any test: "still held" never depends on timing */

/* The inbox table and A's connection are the fixture's. */
static struct fixture g_fx;
static const char *g_table = g_fx.table;
static char g_work[80]; /* the consumers' own work, for tests that commit it with a confirm */
static PGconn *g_a, *g_b;

static void setup(void)
{
	fixture_setup(&g_fx, "ib", &(struct fixture_options){ .inbox = true, .no_consumer = true });
	g_a = g_fx.pg;
	snprintf(g_work, sizeof(g_work), "%s_work", g_table);
	fixture_drop_later(&g_fx, "DROP TABLE IF EXISTS %s", g_work);
	g_b = harness_pg_connect();
	/* A statement that hangs on a lock it should never wait for fails the test instead of
	 * hanging it. */
	harness_pg_exec(g_a, "SET statement_timeout = '30s'");
	harness_pg_exec(g_b, "SET statement_timeout = '30s'");
	harness_pg_exec(g_a, "CREATE TABLE %s (message_id text NOT NULL)", g_work);
}

static void teardown(void)
{
	/* B lets go of what it holds before the fixture drops the tables (it rolls back A). */
	if (g_b && PQtransactionStatus(g_b) != PQTRANS_IDLE)
		PQclear(PQexec(g_b, "ROLLBACK"));
	PQfinish(g_b);
	g_b = NULL;
	fixture_teardown(&g_fx);
}

TestSuite(inbox, .init = setup, .fini = teardown, .timeout = 180);

/* ---- shortcuts: each asserts success and that the caller's transaction is left as it was */

static int claim(PGconn *c, const char *id, const char *consumer, int64_t lease_ms)
{
	char err[256] = "";
	PGTransactionStatusType before = PQtransactionStatus(c);
	int rc = inbox_claim(c, g_table, id, consumer, lease_ms, err, sizeof(err));

	cr_assert_geq(rc, 0, "claim '%s' by '%s': %d %s", id, consumer, rc, err);
	cr_assert_eq(PQtransactionStatus(c), before, "claim changed the transaction state");
	return rc;
}

static int confirm(PGconn *c, const char *id, const char *consumer)
{
	char err[256] = "";
	PGTransactionStatusType before = PQtransactionStatus(c);
	int rc = inbox_confirm(c, g_table, id, consumer, err, sizeof(err));

	cr_assert_geq(rc, 0, "confirm '%s' by '%s': %d %s", id, consumer, rc, err);
	cr_assert_eq(PQtransactionStatus(c), before, "confirm changed the transaction state");
	return rc;
}

static int forget(PGconn *c, const char *id, const char *consumer)
{
	char err[256] = "";
	PGTransactionStatusType before = PQtransactionStatus(c);
	int rc = inbox_forget(c, g_table, id, consumer, err, sizeof(err));

	cr_assert_geq(rc, 0, "forget '%s' by '%s': %d %s", id, consumer, rc, err);
	cr_assert_eq(PQtransactionStatus(c), before, "forget changed the transaction state");
	return rc;
}

static int64_t purge(PGconn *c, int64_t retention_ms, int limit)
{
	char err[256] = "";
	PGTransactionStatusType before = PQtransactionStatus(c);
	int64_t n = inbox_purge(c, g_table, retention_ms, limit, err, sizeof(err));

	cr_assert_geq(n, 0, "purge: %lld %s", (long long)n, err);
	cr_assert_eq(PQtransactionStatus(c), before, "purge changed the transaction state");
	return n;
}

/* A column of the message's row as text; "<none>" without a row, "<null>" for NULL. */
static const char *column(const char *id, const char *expr)
{
	static char out[256];
	char *v;

	if (harness_pg_int(g_a, "SELECT count(*) FROM %s WHERE message_id = '%s'", g_table, id) ==
	    0)
		return "<none>";
	v = harness_pg_string(g_a, "SELECT (%s)::text FROM %s WHERE message_id = '%s'", expr,
	                      g_table, id);
	snprintf(out, sizeof(out), "%s", v ? v : "<null>");
	free(v);
	return out;
}

static int64_t rows(void)
{
	return harness_pg_int(g_a, "SELECT count(*) FROM %s", g_table);
}

/* ---- one consumer */

Test(inbox, first_claim_is_yours_inside_your_transaction)
{
	harness_pg_exec(g_a, "BEGIN");
	cr_assert_eq(claim(g_a, "m1", "a", LONG_LEASE_MS), INBOX_CLAIMED);
	cr_assert_eq(PQtransactionStatus(g_a), PQTRANS_INTRANS, "the caller's transaction is open");
	harness_pg_exec(g_a, "COMMIT");
	cr_assert_eq(rows(), 1);
	cr_assert_str_eq(column("m1", "claimed_by"), "a");
	cr_assert_str_eq(column("m1", "confirmed_at IS NULL"), "true");
	/* The lease runs from the statement, not from the start of the transaction. */
	cr_assert_str_eq(column("m1", "claimed_until > clock_timestamp() + interval '30 s'"),
	                 "true");
}

Test(inbox, lease_counts_from_the_statement_not_the_transaction_start)
{
	/* A transaction that began "long ago": now() stays at its start, the lease must not. */
	harness_pg_exec(g_a, "BEGIN");
	harness_pg_exec(g_a, "SELECT now()");
	harness_sleep_ms(1500);
	cr_assert_eq(claim(g_a, "m1", "a", 1000), INBOX_CLAIMED);
	cr_assert_str_eq(column("m1", "claimed_until > now() + interval '1 s'"), "true");
	harness_pg_exec(g_a, "COMMIT");
}

Test(inbox, another_consumer_is_busy_while_the_lease_lives)
{
	/* Autocommit: the claim commits on its own, as a consumer whose work is not in the
	 * database does it. */
	cr_assert_eq(claim(g_a, "m1", "a", LONG_LEASE_MS), INBOX_CLAIMED);
	harness_pg_exec(g_b, "BEGIN");
	cr_assert_eq(claim(g_b, "m1", "b", LONG_LEASE_MS), INBOX_BUSY);
	cr_assert_eq(PQtransactionStatus(g_b), PQTRANS_INTRANS, "BUSY leaves B's transaction open");
	cr_assert_str_eq(column("m1", "claimed_by"), "a");
	/* B's BUSY took no lock: A confirms while B's transaction is still open (a wait here
	 * would end in statement_timeout). */
	cr_assert_eq(confirm(g_a, "m1", "a"), INBOX_OK);
	/* Read committed: B's next statement sees A's confirmation. */
	cr_assert_eq(claim(g_b, "m1", "b", LONG_LEASE_MS), INBOX_DONE);
	harness_pg_exec(g_b, "ROLLBACK");
	cr_assert_str_eq(column("m1", "claimed_by"), "a");
}

Test(inbox, same_consumer_claims_again_and_renews_the_lease)
{
	char *first;

	cr_assert_eq(claim(g_a, "m1", "a", LONG_LEASE_MS), INBOX_CLAIMED);
	first = harness_pg_string(g_a, "SELECT claimed_until::text FROM %s", g_table);
	harness_sleep_ms(20);
	cr_assert_eq(claim(g_a, "m1", "a", 2 * LONG_LEASE_MS), INBOX_CLAIMED);
	cr_assert_eq(rows(), 1);
	cr_assert_eq(harness_pg_int(g_a, "SELECT count(*) FROM %s WHERE claimed_until > '%s'",
	                            g_table, first),
	             1, "the lease was not extended");
	free(first);
	cr_assert_eq(claim(g_b, "m1", "b", LONG_LEASE_MS), INBOX_BUSY);
}

Test(inbox, a_confirmed_message_is_done_for_everyone)
{
	char *at;

	harness_pg_exec(g_a, "BEGIN");
	cr_assert_eq(claim(g_a, "m1", "a", LONG_LEASE_MS), INBOX_CLAIMED);
	cr_assert_eq(confirm(g_a, "m1", "a"), INBOX_OK);
	cr_assert_eq(PQtransactionStatus(g_a), PQTRANS_INTRANS);
	harness_pg_exec(g_a, "COMMIT");
	cr_assert_str_eq(column("m1", "confirmed_at IS NOT NULL"), "true");
	at = harness_pg_string(g_a, "SELECT confirmed_at::text FROM %s", g_table);

	harness_pg_exec(g_a, "BEGIN");
	harness_pg_exec(g_b, "BEGIN");
	cr_assert_eq(claim(g_a, "m1", "a", LONG_LEASE_MS), INBOX_DONE, "not even for its owner");
	cr_assert_eq(claim(g_b, "m1", "b", LONG_LEASE_MS), INBOX_DONE);
	/* Confirming twice is harmless and keeps the first time; others cannot confirm. */
	cr_assert_eq(confirm(g_a, "m1", "a"), INBOX_OK);
	cr_assert_eq(confirm(g_b, "m1", "b"), INBOX_LOST);
	harness_pg_exec(g_a, "COMMIT");
	harness_pg_exec(g_b, "COMMIT");
	cr_assert_str_eq(column("m1", "confirmed_at::text"), at);
	cr_assert_str_eq(column("m1", "claimed_by"), "a");
	free(at);
}

Test(inbox, work_and_confirmation_commit_or_roll_back_together)
{
	/* Rolled back: no work, no confirmation, and the message is not reported done. */
	harness_pg_exec(g_a, "BEGIN");
	cr_assert_eq(claim(g_a, "m1", "a", LONG_LEASE_MS), INBOX_CLAIMED);
	harness_pg_exec(g_a, "INSERT INTO %s VALUES ('m1')", g_work);
	cr_assert_eq(confirm(g_a, "m1", "a"), INBOX_OK);
	harness_pg_exec(g_a, "ROLLBACK");
	cr_assert_eq(rows(), 0, "the claim rolled back with the rest");
	cr_assert_eq(harness_pg_int(g_a, "SELECT count(*) FROM %s", g_work), 0);
	cr_assert_eq(claim(g_b, "m1", "b", LONG_LEASE_MS), INBOX_CLAIMED);
	cr_assert_eq(forget(g_b, "m1", "b"), INBOX_OK);

	/* Committed: both, and from then on the message is done. */
	harness_pg_exec(g_a, "BEGIN");
	cr_assert_eq(claim(g_a, "m1", "a", LONG_LEASE_MS), INBOX_CLAIMED);
	harness_pg_exec(g_a, "INSERT INTO %s VALUES ('m1')", g_work);
	cr_assert_eq(confirm(g_a, "m1", "a"), INBOX_OK);
	harness_pg_exec(g_a, "COMMIT");
	cr_assert_eq(harness_pg_int(g_a, "SELECT count(*) FROM %s", g_work), 1);
	cr_assert_eq(claim(g_b, "m1", "b", LONG_LEASE_MS), INBOX_DONE);
}

Test(inbox, rolled_back_confirmation_leaves_a_claim_that_expires)
{
	/* The claim committed on its own (work outside the database), the confirmation's
	 * transaction rolled back: the row stays claimed, then claimable once the lease ends,
	 * and is never reported done. */
	cr_assert_eq(claim(g_a, "m1", "a", LONG_LEASE_MS), INBOX_CLAIMED);
	harness_pg_exec(g_a, "BEGIN");
	harness_pg_exec(g_a, "INSERT INTO %s VALUES ('m1')", g_work);
	cr_assert_eq(confirm(g_a, "m1", "a"), INBOX_OK);
	harness_pg_exec(g_a, "ROLLBACK");
	cr_assert_str_eq(column("m1", "confirmed_at IS NULL"), "true");
	cr_assert_eq(claim(g_b, "m1", "b", LONG_LEASE_MS), INBOX_BUSY, "not DONE");

	cr_assert_eq(claim(g_a, "m1", "a", 300), INBOX_CLAIMED, "A renews with a short lease");
	harness_sleep_ms(1000);
	cr_assert_eq(claim(g_b, "m1", "b", LONG_LEASE_MS), INBOX_CLAIMED);
	cr_assert_str_eq(column("m1", "claimed_by"), "b");
	cr_assert_eq(confirm(g_b, "m1", "b"), INBOX_OK);
	cr_assert_eq(harness_pg_int(g_a, "SELECT count(*) FROM %s", g_work), 0);
}

Test(inbox, an_expired_lease_is_taken_over_and_the_late_confirm_is_lost)
{
	cr_assert_eq(claim(g_a, "m1", "a", 300), INBOX_CLAIMED);
	harness_sleep_ms(1000);
	cr_assert_eq(claim(g_b, "m1", "b", LONG_LEASE_MS), INBOX_CLAIMED);
	cr_assert_str_eq(column("m1", "claimed_by"), "b");

	harness_pg_exec(g_a, "BEGIN");
	harness_pg_exec(g_a, "INSERT INTO %s VALUES ('m1')", g_work);
	cr_assert_eq(confirm(g_a, "m1", "a"), INBOX_LOST);
	cr_assert_eq(PQtransactionStatus(g_a), PQTRANS_INTRANS, "LOST leaves A's transaction open");
	harness_pg_exec(g_a, "ROLLBACK"); /* what a caller does on LOST */
	cr_assert_str_eq(column("m1", "confirmed_at IS NULL"), "true");
	cr_assert_str_eq(column("m1", "claimed_by"), "b");
	cr_assert_eq(claim(g_a, "m1", "a", LONG_LEASE_MS), INBOX_BUSY);

	cr_assert_eq(confirm(g_b, "m1", "b"), INBOX_OK);
	cr_assert_eq(claim(g_a, "m1", "a", LONG_LEASE_MS), INBOX_DONE);
}

Test(inbox, a_late_confirm_succeeds_while_nobody_took_over)
{
	cr_assert_eq(claim(g_a, "m1", "a", 300), INBOX_CLAIMED);
	harness_sleep_ms(1000);
	cr_assert_eq(confirm(g_a, "m1", "a"), INBOX_OK);
	cr_assert_eq(claim(g_b, "m1", "b", LONG_LEASE_MS), INBOX_DONE);
}

Test(inbox, forget_releases_only_ones_own_unconfirmed_claim)
{
	cr_assert_eq(claim(g_a, "m1", "a", LONG_LEASE_MS), INBOX_CLAIMED);
	cr_assert_eq(forget(g_b, "m1", "b"), INBOX_LOST, "B holds nothing");
	cr_assert_str_eq(column("m1", "claimed_by"), "a");
	cr_assert_eq(claim(g_b, "m1", "b", LONG_LEASE_MS), INBOX_BUSY);

	harness_pg_exec(g_a, "BEGIN");
	cr_assert_eq(forget(g_a, "m1", "a"), INBOX_OK);
	cr_assert_eq(PQtransactionStatus(g_a), PQTRANS_INTRANS);
	harness_pg_exec(g_a, "COMMIT");
	cr_assert_eq(rows(), 0);
	cr_assert_eq(claim(g_b, "m1", "b", LONG_LEASE_MS), INBOX_CLAIMED, "claimable at once");

	cr_assert_eq(confirm(g_b, "m1", "b"), INBOX_OK);
	cr_assert_eq(forget(g_b, "m1", "b"), INBOX_LOST, "a confirmed row is never forgotten");
	cr_assert_eq(forget(g_a, "m1", "a"), INBOX_LOST);
	cr_assert_str_eq(column("m1", "confirmed_at IS NOT NULL"), "true");
	cr_assert_eq(forget(g_a, "never-seen", "a"), INBOX_LOST);
}

/* ---- purge */

static void put_row(const char *id, const char *claimed_until, const char *confirmed_at)
{
	harness_pg_exec(g_a,
	                "INSERT INTO %s (message_id, claimed_by, claimed_until, confirmed_at)"
	                " VALUES ('%s', 'x', %s, %s)",
	                g_table, id, claimed_until, confirmed_at);
}

Test(inbox, purge_deletes_old_confirmations_and_stale_claims_in_bounded_slices)
{
	put_row("old1", "now() - interval '4 h'", "now() - interval '3 h'");
	put_row("old2", "now() - interval '4 h'", "now() - interval '150 min'");
	put_row("old3", "now() - interval '4 h'", "now() - interval '2 h'");
	put_row("recent", "now() - interval '20 min'", "now() - interval '10 min'");
	put_row("stale", "now() - interval '2 h'", "NULL");
	put_row("expired", "now() - interval '10 min'", "NULL");
	put_row("live", "now() + interval '1 h'", "NULL");

	harness_pg_exec(g_a, "BEGIN");
	cr_assert_eq(purge(g_a, 3600 * 1000, 2), 2, "the limit holds");
	harness_pg_exec(g_a, "COMMIT");
	cr_assert_str_eq(column("old1", "1"), "<none>", "oldest confirmation goes first");
	cr_assert_str_eq(column("old2", "1"), "<none>");
	cr_assert_str_eq(column("old3", "1"), "1");

	cr_assert_eq(purge(g_a, 3600 * 1000, 2), 2);
	cr_assert_str_eq(column("old3", "1"), "<none>");
	cr_assert_str_eq(column("stale", "1"), "<none>", "a lease that ended 2 h ago");
	cr_assert_eq(purge(g_a, 3600 * 1000, 2), 0);
	cr_assert_eq(rows(), 3);
	cr_assert_str_eq(column("recent", "1"), "1");
	cr_assert_str_eq(column("expired", "1"), "1");
	cr_assert_str_eq(column("live", "1"), "1");

	/* Retention 0: every confirmation and every ended lease, never a live one. */
	cr_assert_eq(purge(g_a, 0, 100), 2);
	cr_assert_eq(rows(), 1);
	cr_assert_str_eq(column("live", "1"), "1");
}

Test(inbox, purge_skips_rows_in_use_without_waiting)
{
	put_row("old1", "now() - interval '4 h'", "now() - interval '3 h'");
	put_row("old2", "now() - interval '4 h'", "now() - interval '3 h'");
	harness_pg_exec(g_b, "BEGIN");
	harness_pg_exec(g_b, "SELECT 1 FROM %s WHERE message_id = 'old1' FOR UPDATE", g_table);
	cr_assert_eq(purge(g_a, 3600 * 1000, 10), 1);
	cr_assert_str_eq(column("old1", "1"), "1");
	harness_pg_exec(g_b, "ROLLBACK");
	cr_assert_eq(purge(g_a, 3600 * 1000, 10), 1);
	cr_assert_eq(rows(), 0);
}

/* ---- two consumers racing for one message: B claims while A's transaction holds the row */

struct claimer {
	PGconn *conn;
	const char *id;
	pthread_t thread;
	atomic_bool finished;
	int rc;
	char err[256];
};

static void *claimer_main(void *arg)
{
	struct claimer *cl = arg;

	cl->rc = inbox_claim(cl->conn, g_table, cl->id, "b", LONG_LEASE_MS, cl->err,
	                     sizeof(cl->err));
	atomic_store(&cl->finished, true);
	return NULL;
}

/* Starts B's claim in its own transaction on a thread and returns once B's backend waits
 * for a lock: from then on B can only answer after A's transaction ends. */
static void claimer_start(struct claimer *cl, const char *id)
{
	PGconn *watch = harness_pg_connect();
	int pid = PQbackendPID(g_b);
	bool waiting = false;

	memset(cl, 0, sizeof(*cl));
	cl->conn = g_b;
	cl->id = id;
	atomic_init(&cl->finished, false);
	harness_pg_exec(g_b, "BEGIN");
	cr_assert_eq(pthread_create(&cl->thread, NULL, claimer_main, cl), 0);
	for (int64_t end = harness_now_ms() + 30000; !waiting && harness_now_ms() < end;) {
		waiting = harness_pg_int(watch,
		                         "SELECT count(*) FROM pg_stat_activity"
		                         " WHERE pid = %d AND wait_event_type = 'Lock'",
		                         pid) == 1;
		if (!waiting)
			harness_sleep_ms(20);
	}
	PQfinish(watch);
	cr_assert(waiting, "B's claim never waited for A's transaction");
	cr_assert_not(atomic_load(&cl->finished), "B answered while A's transaction was open");
}

static int claimer_finish(struct claimer *cl)
{
	HARNESS_WAIT(atomic_load(&cl->finished), 30000);
	cr_assert(atomic_load(&cl->finished), "B's claim did not return after A's transaction");
	pthread_join(cl->thread, NULL);
	cr_assert_geq(cl->rc, 0, "B's claim: %d %s", cl->rc, cl->err);
	cr_assert_eq(PQtransactionStatus(g_b), PQTRANS_INTRANS, "B's transaction is open");
	return cl->rc;
}

/* A claims m1 (and confirms it, when asked) in an open transaction; B's claim starts and
 * waits for it; then A ends its transaction with a_end. Returns what B's claim answered; B's
 * transaction is still open. */
static int race(bool a_confirms, const char *a_end)
{
	struct claimer cl;

	harness_pg_exec(g_a, "BEGIN");
	cr_assert_eq(claim(g_a, "m1", "a", LONG_LEASE_MS), INBOX_CLAIMED);
	if (a_confirms)
		cr_assert_eq(confirm(g_a, "m1", "a"), INBOX_OK);
	claimer_start(&cl, "m1");
	harness_pg_exec(g_a, "%s", a_end);
	return claimer_finish(&cl);
}

Test(inbox, race_the_second_claim_waits_and_is_busy_after_the_first_commits)
{
	cr_assert_eq(race(false, "COMMIT"), INBOX_BUSY);
	harness_pg_exec(g_b, "ROLLBACK");
	cr_assert_str_eq(column("m1", "claimed_by"), "a");
}

Test(inbox, race_the_second_claim_gets_it_when_the_first_rolls_back)
{
	cr_assert_eq(race(false, "ROLLBACK"), INBOX_CLAIMED);
	harness_pg_exec(g_b, "COMMIT");
	cr_assert_str_eq(column("m1", "claimed_by"), "b");
}

Test(inbox, race_the_second_claim_is_done_when_the_first_confirms)
{
	cr_assert_eq(race(true, "COMMIT"), INBOX_DONE);
	harness_pg_exec(g_b, "ROLLBACK");
}

Test(inbox, race_on_an_expired_lease_only_one_takes_it_over)
{
	struct claimer cl;

	/* B's snapshot shows a takeable row (x's lease ended) while A's uncommitted takeover
	 * holds it: B must wait and then see A's lease, not its own snapshot. */
	cr_assert_eq(inbox_claim(g_a, g_table, "m1", "x", 300, NULL, 0), INBOX_CLAIMED);
	harness_sleep_ms(1000);
	harness_pg_exec(g_a, "BEGIN");
	cr_assert_eq(claim(g_a, "m1", "a", LONG_LEASE_MS), INBOX_CLAIMED);
	claimer_start(&cl, "m1");
	harness_pg_exec(g_a, "COMMIT");
	cr_assert_eq(claimer_finish(&cl), INBOX_BUSY);
	harness_pg_exec(g_b, "ROLLBACK");
	cr_assert_str_eq(column("m1", "claimed_by"), "a");
}

/* ---- arguments, errors, schema */

static void expect_invalid(int rc, const char *err, const char *needle)
{
	cr_assert_eq(rc, INBOX_ERR_INVALID, "want INBOX_ERR_INVALID for '%s', got %d", needle, rc);
	cr_assert_not_null(strstr(err, needle), "error '%s' does not name '%s'", err, needle);
}

Test(inbox, invalid_arguments_are_refused_before_anything_is_sent)
{
	char err[256], long_id[80], bad_utf8[] = { 'a', (char)0xff, 'b', 0 };
	const char *t = g_table;

	memset(long_id, 'x', 65);
	long_id[65] = '\0';
	harness_pg_exec(g_a, "BEGIN");
#define CHECK(call, needle)                               \
	do {                                              \
		err[0] = '\0';                            \
		expect_invalid((int)(call), err, needle); \
	} while (0)
	CHECK(inbox_claim(NULL, t, "m", "a", 1000, err, sizeof(err)), "no connection");
	CHECK(inbox_claim(g_a, "bad-name", "m", "a", 1000, err, sizeof(err)),
	      "invalid table name: bad-name");
	CHECK(inbox_claim(g_a, "a.b.c", "m", "a", 1000, err, sizeof(err)), "invalid table name");
	CHECK(inbox_claim(g_a, "x; DROP TABLE y", "m", "a", 1000, err, sizeof(err)),
	      "invalid table name");
	CHECK(inbox_claim(g_a, "", "m", "a", 1000, err, sizeof(err)), "invalid table name");
	CHECK(inbox_claim(g_a, t, "", "a", 1000, err, sizeof(err)), "message_id");
	CHECK(inbox_claim(g_a, t, NULL, "a", 1000, err, sizeof(err)), "message_id");
	CHECK(inbox_claim(g_a, t, long_id, "a", 1000, err, sizeof(err)), "message_id");
	CHECK(inbox_claim(g_a, t, bad_utf8, "a", 1000, err, sizeof(err)), "message_id");
	CHECK(inbox_claim(g_a, t, "m", "", 1000, err, sizeof(err)), "consumer");
	CHECK(inbox_claim(g_a, t, "m", NULL, 1000, err, sizeof(err)), "consumer");
	CHECK(inbox_claim(g_a, t, "m", bad_utf8, 1000, err, sizeof(err)), "consumer");
	CHECK(inbox_claim(g_a, t, "m", "a", 0, err, sizeof(err)), "lease_ms");
	CHECK(inbox_claim(g_a, t, "m", "a", -5, err, sizeof(err)), "lease_ms");
	CHECK(inbox_claim(g_a, t, "m", "a", 8LL * 24 * 3600 * 1000, err, sizeof(err)), "lease_ms");
	CHECK(inbox_confirm(g_a, t, long_id, "a", err, sizeof(err)), "message_id");
	CHECK(inbox_confirm(g_a, t, "m", "", err, sizeof(err)), "consumer");
	CHECK(inbox_confirm(g_a, "1abc", "m", "a", err, sizeof(err)), "invalid table name");
	CHECK(inbox_forget(g_a, t, "", "a", err, sizeof(err)), "message_id");
	CHECK(inbox_forget(g_a, t, "m", NULL, err, sizeof(err)), "consumer");
	CHECK(inbox_purge(g_a, t, -1, 10, err, sizeof(err)), "retention_ms");
	CHECK(inbox_purge(g_a, t, 0, 0, err, sizeof(err)), "limit");
	CHECK(inbox_purge(g_a, t, 0, 10001, err, sizeof(err)), "limit");
	CHECK(inbox_purge(g_a, "no good", 0, 10, err, sizeof(err)), "invalid table name");
	CHECK(inbox_migrate(g_a, "no good", err, sizeof(err)), "invalid table name");
	CHECK(inbox_migrate(g_a, "t234567890123456789012345678901234567890123456789012", err,
	                    sizeof(err)),
	      "51 bytes");
#undef CHECK
	/* No error buffer at all is fine too. */
	cr_assert_eq(inbox_claim(g_a, t, "", "a", 1000, NULL, 0), INBOX_ERR_INVALID);
	cr_assert_eq(inbox_claim(g_a, t, "", "a", 1000, err, 0), INBOX_ERR_INVALID);
	cr_assert_eq(PQtransactionStatus(g_a), PQTRANS_INTRANS,
	             "nothing was sent: the transaction is not aborted");
	harness_pg_exec(g_a, "COMMIT");
	cr_assert_eq(rows(), 0);
}

Test(inbox, message_id_limit_counts_characters_like_the_outbox_column)
{
	char id[2 * 65 + 1], err[256] = "";

	/* 64 two-byte characters (128 bytes) fit VARCHAR(64); 65 do not. */
	for (int i = 0; i < 65; i++)
		memcpy(id + 2 * i, "\xc3\xa9", 2);
	id[2 * 64] = '\0';
	cr_assert_eq(claim(g_a, id, "a", LONG_LEASE_MS), INBOX_CLAIMED);
	cr_assert_eq(confirm(g_a, id, "a"), INBOX_OK);
	cr_assert_eq(claim(g_b, id, "b", LONG_LEASE_MS), INBOX_DONE);
	id[2 * 64] = (char)0xc3;
	id[2 * 65] = '\0';
	expect_invalid(inbox_claim(g_a, g_table, id, "a", 1000, err, sizeof(err)), err,
	               "message_id");
}

Test(inbox, a_failed_statement_is_reported_and_aborts_the_callers_transaction)
{
	char err[256] = "", missing[64];

	harness_unique_name(missing, sizeof(missing), "ib_missing");
	harness_pg_exec(g_a, "BEGIN");
	cr_assert_eq(inbox_claim(g_a, missing, "m1", "a", 1000, err, sizeof(err)), INBOX_ERR_QUERY);
	cr_assert_not_null(strstr(err, "could not claim the message: "), "%s", err);
	cr_assert_not_null(strstr(err, "does not exist"), "%s", err);
	cr_assert_null(strchr(err, '\n'), "one line: %s", err);
	cr_assert_eq(PQtransactionStatus(g_a), PQTRANS_INERROR);
	cr_assert_eq(inbox_confirm(g_a, g_table, "m1", "a", err, sizeof(err)), INBOX_ERR_QUERY);
	cr_assert_not_null(strstr(err, "could not confirm the message: "), "%s", err);
	harness_pg_exec(g_a, "ROLLBACK");
	cr_assert_eq(inbox_purge(g_a, missing, 0, 10, err, sizeof(err)), INBOX_ERR_QUERY);
	cr_assert_not_null(strstr(err, "could not purge the inbox: "), "%s", err);
}

Test(inbox, schema_is_idempotent_and_migrate_keeps_the_callers_transaction)
{
	char err[256] = "", other[64], qualified[80], *ddl;

	ddl = inbox_schema_sql(NULL);
	cr_assert_not_null(ddl);
	cr_assert_not_null(strstr(ddl, "CREATE TABLE IF NOT EXISTS inbox ("), "%s", ddl);
	cr_assert_not_null(strstr(ddl, "inbox_done_idx ON inbox"), "%s", ddl);
	free(ddl);
	cr_assert_null(inbox_schema_sql("bad name"));
	cr_assert_null(inbox_schema_sql("t234567890123456789012345678901234567890123456789012"));
	ddl = inbox_schema_sql("s.t23456789012345678901234567890123456789012345678901");
	cr_assert_not_null(ddl, "51 bytes after the schema fit");
	cr_assert_not_null(strstr(ddl, "INDEX IF NOT EXISTS t2345678901234567890123456789012345678"
	                               "9012345678901_stale_idx ON s.t"),
	                   "%s", ddl);
	free(ddl);

	/* Applied again on the existing table: nothing changes, nothing fails. */
	harness_pg_exec(g_a, "BEGIN");
	cr_assert_eq(inbox_migrate(g_a, g_table, err, sizeof(err)), INBOX_OK, "%s", err);
	cr_assert_eq(PQtransactionStatus(g_a), PQTRANS_INTRANS);
	harness_pg_exec(g_a, "COMMIT");
	cr_assert_eq(harness_pg_int(g_a, "SELECT count(*) FROM pg_indexes WHERE tablename = '%s'",
	                            g_table),
	             3);

	/* Schema-qualified, inside the caller's transaction, rolled back with it. */
	harness_unique_name(other, sizeof(other), "ib");
	snprintf(qualified, sizeof(qualified), "public.%s", other);
	harness_pg_exec(g_a, "BEGIN");
	cr_assert_eq(inbox_migrate(g_a, qualified, err, sizeof(err)), INBOX_OK, "%s", err);
	cr_assert_eq(inbox_migrate(g_a, qualified, err, sizeof(err)), INBOX_OK, "%s", err);
	cr_assert_eq(PQtransactionStatus(g_a), PQTRANS_INTRANS);
	cr_assert_eq(inbox_claim(g_a, qualified, "m1", "a", 1000, err, sizeof(err)), INBOX_CLAIMED,
	             "%s", err);
	cr_assert_eq(inbox_purge(g_a, qualified, 0, 10, err, sizeof(err)), 0, "%s", err);
	harness_pg_exec(g_a, "ROLLBACK");
	cr_assert_eq(
	        harness_pg_int(g_a, "SELECT count(*) FROM pg_tables WHERE tablename = '%s'", other),
	        0);
}
