/* A wake-up that arrives with the answer to a claim. A producer that commits while the relay's
 * last claim before sleeping runs (armed: the relay holds the wake-up lock) notifies, and
 * PostgreSQL sends that notification just before the claim's answer ends: libpq reads it into
 * its queue together with the answer, and the socket stays quiet. A relay that only looks for
 * notifications when the socket polls readable sleeps the whole poll interval (here an hour)
 * while the producer's row waits.
 *
 * The test makes that happen every time, by locks rather than timing: a statement-level
 * trigger on the relay's table holds up any claim of a session that holds the wake-up lock on
 * an advisory lock the test holds. The relay's claim after arming waits there, having taken
 * its snapshot; the test commits a row (which notifies: the relay is armed), then lets the
 * claim go. The claim cannot see the row, and its answer brings the notification. The row must
 * arrive long before the poll interval. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "store/store_private.h"
#include "tests/support/fixture.h"

/* The advisory lock (one bigint key) the test holds and the held-up claim waits for. */
#define GATE_KEY 733105
/* Generous: a loaded CI machine under ASan. Only there to end a hang. */
#define STATE_TIMEOUT_MS 120000
/* Far below the poll interval: a row that waits for the poll never comes within it. */
#define DELIVERY_TIMEOUT_MS 60000

/* An hour's poll; a lease longer than the test holds a claim up (the relay gives up on an
 * answer after a lease). */
static const char *const relay_env[] = { "OUTBOX_RELAY_POLL_INTERVAL=1h", "OUTBOX_RELAY_LEASE=10m",
	                                 NULL };

/* The gate: while gate.hold is true, any UPDATE statement on the table by a session that
 * holds the wake-up lock (the relay's claims after arming) first waits for GATE_KEY. */
static void install_gate(struct fixture *f)
{
	harness_pg_exec(f->pg,
	                "CREATE TABLE %s_gate (hold boolean NOT NULL);"
	                " INSERT INTO %s_gate VALUES (true);"
	                " CREATE FUNCTION %s_gate_fn() RETURNS trigger LANGUAGE plpgsql AS $fn$"
	                " BEGIN"
	                "   IF (SELECT hold FROM %s_gate) AND EXISTS (SELECT 1 FROM pg_locks"
	                "       WHERE pid = pg_backend_pid() AND locktype = 'advisory'"
	                "       AND classid = %s AND objid = '%s'::regclass::oid AND objsubid = 2"
	                "       AND mode = 'ExclusiveLock' AND granted) THEN"
	                "     PERFORM pg_advisory_xact_lock_shared(%d);"
	                "   END IF;"
	                "   RETURN NULL;"
	                " END $fn$;"
	                " CREATE TRIGGER %s_gate BEFORE UPDATE ON %s"
	                " FOR EACH STATEMENT EXECUTE FUNCTION %s_gate_fn();",
	                f->table, f->table, f->table, f->table, STORE_WAKEUP_LOCK_CLASS, f->table,
	                GATE_KEY, f->table, f->table, f->table);
}

/* Sessions waiting for GATE_KEY: the relay's claim, held up. */
static int64_t waiting_at_gate(PGconn *c)
{
	return harness_pg_int(c,
	                      "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
	                      " AND classid = 0 AND objid = %d AND objsubid = 1 AND NOT granted",
	                      GATE_KEY);
}

Test(fault, wakeup_that_came_with_a_claims_answer_is_not_lost, .timeout = 600)
{
	struct fixture f;
	PGconn *holder;
	char gate_table[80];
	size_t got;

	/* Not for the cursor source: the gate is a trigger on UPDATE, which the lease source's
	 * claim is; the cursor reads its rows with a SELECT, which no trigger can hold up, so the
	 * race cannot be staged this way. Its wake-up is the contract test's
	 * (a_row_committed_while_idle_wakes_the_source). */
	if (harness_source_is_cursor())
		cr_skip_test("the gate holds up an UPDATE claim; the cursor's read is a SELECT");
	fixture_setup(&f, "wake_race", &(struct fixture_options){ .binding = "wake.#" });
	install_gate(&f);
	holder = harness_pg_connect();
	harness_pg_exec(holder, "SELECT pg_advisory_lock(%d)", GATE_KEY);

	/* The relay claims (unarmed: through the gate), arms, settles the watermark and claims
	 * once more before it sleeps: that claim waits at the gate. */
	fixture_relay_start(&f, relay_env);
	HARNESS_WAIT(waiting_at_gate(f.pg) == 1, STATE_TIMEOUT_MS);
	if (waiting_at_gate(f.pg) != 1)
		fixture_dump_logs(&f);
	cr_assert_eq(waiting_at_gate(f.pg), 1, "the relay's claim after arming never came");
	cr_assert_eq(harness_wakeup_holders(f.pg, f.table), 1,
	             "the relay does not hold the wake-up lock while its last claim runs");

	/* A producer commits now: its trigger finds the lock held and notifies. */
	harness_pg_exec(f.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body)"
	                " VALUES ('late-0', '%s', 'wake.late', '{\"late\":true}')",
	                f.table, f.exchange);
	/* The claim goes on, with a snapshot taken before that row committed. */
	harness_pg_exec(holder, "UPDATE %s_gate SET hold = false", f.table);
	harness_pg_exec(holder, "SELECT pg_advisory_unlock(%d)", GATE_KEY);

	/* The relay sleeps an hour unless it reads the notification libpq holds. */
	fixture_expect_unique(&f, f.cons, 1, DELIVERY_TIMEOUT_MS);
	got = consumer_count(f.cons, "late-0");
	cr_assert_geq(got, 1, "late-0 was not delivered");
	HARNESS_WAIT(harness_unpublished_count(f.pg, f.table) == 0, STATE_TIMEOUT_MS);
	cr_assert_eq(harness_unpublished_count(f.pg, f.table), 0,
	             "late-0 was delivered but never marked published");
	fprintf(stderr, "wakeup_race: rows=1 received=%zu lost=0 duplicates=%zu\n",
	        consumer_received(f.cons), got - 1);

	snprintf(gate_table, sizeof(gate_table), "%s", f.table);
	fixture_teardown(&f);
	harness_pg_exec(holder,
	                "DROP TABLE IF EXISTS %s_gate; DROP FUNCTION IF EXISTS %s_gate_fn()",
	                gate_table, gate_table);
	PQfinish(holder);
}
