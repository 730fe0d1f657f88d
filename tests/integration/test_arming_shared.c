/* Arming against a producer's shared hold of the wake-up lock. Every INSERT into the table tests
 * the lock by taking it shared for an instant; a relay that tries to arm in that instant is
 * refused, as it would be by another relay asleep. Taken for that, the relay sleeps its poll
 * interval without the lock while no relay holds it, and producers do not notify: a row
 * committed then waits the whole interval (here an hour).
 *
 * The test holds the lock shared from a session of its own for as long as it takes the relay to
 * try (a producer's instant, stretched), without timing: a transaction that drew a seq and stays
 * open keeps the relay in its watermark catch-up right after arming, where the test sees it
 * sampling. Then the test lets the lock and the transaction go, waits for the relay's claim
 * that comes before sleeping, and commits a row: it must arrive long before the poll interval,
 * and the relay must end up asleep with the lock held. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "store/store_private.h"
#include "tests/support/fixture.h"

#define STATE_TIMEOUT_MS    120000
#define DELIVERY_TIMEOUT_MS 60000 /* far below the poll interval */
#define APP_NAME            "outbox-relay worker 1"

static const char *const relay_env[] = { "OUTBOX_RELAY_POLL_INTERVAL=1h", NULL };

/* Whether the relay's session is idle after a statement whose text starts with prefix. */
static bool relay_idle_after(PGconn *c, const char *prefix)
{
	return harness_pg_int(c,
	                      "SELECT count(*) FROM pg_stat_activity WHERE application_name = '%s'"
	                      " AND state = 'idle' AND starts_with(query, '%s')",
	                      APP_NAME, prefix) > 0;
}

/* Whether the relay's session has run the watermark's sample (store/statements.c, ST_SAMPLE:
 * "SELECT s.w, ..."), which it does only after arming. */
static bool relay_sampled(PGconn *c)
{
	return harness_pg_int(c,
	                      "SELECT count(*) FROM pg_stat_activity WHERE application_name = '%s'"
	                      " AND starts_with(query, 'SELECT s.w')",
	                      APP_NAME) > 0;
}

/* Whether the relay sleeps armed: it holds the wake-up lock and its session is idle after a
 * claim. */
static bool relay_asleep_armed(PGconn *c, const char *table)
{
	return harness_wakeup_holders(c, table) == 1 && relay_idle_after(c, "WITH");
}

Test(arming_shared, relay_arms_past_a_producers_shared_hold, .timeout = 600)
{
	struct fixture f;
	PGconn *shared, *seq_holder;
	size_t got;
	bool seen;

	fixture_setup(&f, "arm_shared", &(struct fixture_options){ .binding = "arm.#" });
	shared = harness_pg_connect();
	seq_holder = harness_pg_connect();

	/* A producer's test of the lock, held: shared, as the trigger takes it. */
	harness_pg_exec(shared, "SELECT pg_advisory_lock_shared(%s, '%s'::regclass::oid::int4)",
	                STORE_WAKEUP_LOCK_CLASS, f.table);
	/* A transaction that holds a seq: the relay's catch-up after arming waits for it. */
	harness_pg_exec(seq_holder, "BEGIN; SELECT nextval(pg_get_serial_sequence('%s', 'seq'))",
	                f.table);

	fixture_relay_start(&f, relay_env);
	HARNESS_WAIT((seen = relay_sampled(f.pg)), STATE_TIMEOUT_MS);
	if (!seen)
		fixture_dump_logs(&f);
	cr_assert(seen, "the relay never got to its catch-up after arming");
	cr_assert_eq(harness_wakeup_holders(f.pg, f.table), 0,
	             "the relay holds the wake-up lock although it is held shared");

	/* The producer's instant is over; so is the transaction. The relay claims and sleeps. */
	harness_pg_exec(shared, "SELECT pg_advisory_unlock_shared(%s, '%s'::regclass::oid::int4)",
	                STORE_WAKEUP_LOCK_CLASS, f.table);
	harness_pg_exec(seq_holder, "COMMIT");
	/* Asleep: armed, idle after the claim that comes before sleeping (for the poll interval,
	 * an hour). Until it arms, the relay goes round its claims a few milliseconds apart, so a
	 * state seen once is asserted as seen, never read again. */
	HARNESS_WAIT((seen = relay_asleep_armed(f.pg, f.table)), STATE_TIMEOUT_MS);
	if (!seen)
		fixture_dump_logs(&f);
	cr_assert(seen, "the relay never claimed after its catch-up and went to sleep armed");

	/* A row committed now notifies only if a relay holds the lock. */
	harness_pg_exec(f.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body)"
	                " VALUES ('after-0', '%s', 'arm.after', '{\"after\":true}')",
	                f.table, f.exchange);
	fixture_expect_unique(&f, f.cons, 1, DELIVERY_TIMEOUT_MS);
	got = consumer_count(f.cons, "after-0");
	cr_assert_geq(got, 1, "after-0 was not delivered");

	/* And the relay goes back to sleep armed. */
	HARNESS_WAIT((seen = relay_asleep_armed(f.pg, f.table)), STATE_TIMEOUT_MS);
	cr_assert(seen, "the relay sleeps without the wake-up lock");
	fprintf(stderr, "arming_shared: rows=1 received=%zu lost=0 duplicates=%zu\n",
	        consumer_received(f.cons), got - 1);

	PQfinish(seq_holder);
	PQfinish(shared);
	fixture_teardown(&f);
}
