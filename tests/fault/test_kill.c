/* Kill -9 at random moments: a relay that dies holds nothing but leases, so every committed
 * row still arrives once the next relay takes over (duplicates allowed, losses never). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tests/support/fault.h"

#define ROWS  30000
#define KILLS 10

Test(fault, sigkill_ten_times_loses_nothing, .timeout = 600)
{
	struct fixture f;
	unsigned seed = (unsigned)time(NULL);
	size_t lost, dups, before_last;

	fixture_setup(&f, "fault_kill", NULL);
	harness_insert_rows(f.pg, f.table, ROWS, f.exchange, "kill.run", "kill", NULL, NULL);
	fprintf(stderr, "fault kill: random seed %u\n", seed);
	srand(seed);
	for (int k = 0; k < KILLS; k++) {
		struct harness_relay *r = fault_relay_start(&f, NULL);
		/* Each kill lands somewhere inside its own slice of the run, so all ten happen
		 * while rows are still flowing, at a random point of that slice. */
		size_t slice = ROWS / (KILLS + 2);
		size_t target = (size_t)k * slice + (size_t)rand() % slice + 1;
		int64_t jitter = rand() % 300;

		if (!consumer_wait_unique(f.cons, target, FAULT_DELIVERY_TIMEOUT_MS)) {
			fixture_dump_logs(&f);
			cr_assert_fail("kill %d: stuck at %zu of %zu messages", k,
			               consumer_unique(f.cons), target);
		}
		harness_sleep_ms(jitter);
		harness_relay_kill(r);
		cr_assert(r->exited);
		cr_assert_eq(r->status, 128 + 9, "kill %d: relay ended with %d, not by SIGKILL", k,
		             r->status);
	}
	before_last = consumer_unique(f.cons);
	cr_assert_lt(before_last, ROWS, "the run finished before the last kill");

	/* The survivor takes over the rows left and, after their lease, the dead relays' ones. */
	fault_relay_start(&f, NULL);
	fixture_expect_unique(&f, f.cons, ROWS, FAULT_DELIVERY_TIMEOUT_MS);
	fault_expect_settled(&f, 10, 60000);
	harness_sleep_ms(1000);
	dups = fault_count(&f, "kill", "kill", ROWS, &lost);
	cr_assert_eq(lost, 0, "%zu committed rows never arrived", lost);
	cr_assert_eq(harness_pg_int(f.pg, "SELECT count(*) FROM %s WHERE attempts > 0", f.table), 0,
	             "a kill must not charge attempts");
	(void)dups; /* allowed: rows published but not marked before a kill are sent again */
	fixture_teardown(&f);
}
