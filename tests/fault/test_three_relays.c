/* Three relays on one table at once, no faults: SKIP LOCKED claims split the rows, so every
 * row arrives exactly once. No relay dies, so the lease is long: one that ran out on a loaded
 * machine would let another relay take rows still in flight, a duplicate no fault caused. */
#include <criterion/criterion.h>
#include <stdio.h>

#include "tests/support/fault.h"

#define ROWS 30000

Test(fault, three_relays_no_faults, .timeout = 400)
{
	static const char *const ids[] = { "OUTBOX_RELAY_ID=relay-a", "OUTBOX_RELAY_ID=relay-b",
		                           "OUTBOX_RELAY_ID=relay-c" };
	struct fixture f;
	size_t lost, dups;

	fixture_setup(&f, "fault_three", NULL);
	harness_insert_rows(f.pg, f.table, ROWS, f.exchange, "three.relays", "three", NULL, NULL);
	for (int i = 0; i < 3; i++)
		fault_relay_start(&f, (const char *const[]){ ids[i], "OUTBOX_RELAY_BATCH_SIZE=100",
		                                             "OUTBOX_RELAY_LEASE=60s", NULL });
	fixture_expect_unique(&f, f.cons, ROWS, FAULT_DELIVERY_TIMEOUT_MS);
	fault_expect_settled(&f, 10, 60000);
	harness_sleep_ms(1500);
	dups = fault_count(&f, "three_relays", "three", ROWS, &lost);
	cr_assert_eq(lost, 0, "%zu committed rows never arrived", lost);
	cr_assert_eq(dups, 0, "%zu rows were sent twice", dups);
	cr_assert_eq(harness_pg_int(f.pg, "SELECT count(*) FROM %s WHERE attempts > 0", f.table),
	             0);
	for (size_t i = 0; i < f.n_relays; i++)
		cr_assert_not(f.relays[i]->exited, "relay %zu died", i);
	fixture_teardown(&f);
}
