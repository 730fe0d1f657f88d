/* Three relays on one table at once, no faults: SKIP LOCKED claims split the rows, so every
 * row arrives exactly once. No relay dies, so the lease is long: one that ran out on a loaded
 * machine would let another relay take rows still in flight, a duplicate no fault caused.
 *
 * With the cursor source one relay leads the table and the other two wait: still every row
 * exactly once, the position covers them all, and when the leader dies a standby takes over. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/fault.h"

#define ROWS 30000
#define MORE 100

/* The cursor: the position covers every row, one of the three leads; killed, another one
 * takes the lead and publishes what comes next (the standbys retry the lead every ~200 ms). */
static void cursor_standby_takes_over(struct fixture *f, const char *const ids[3])
{
	int64_t max_seq = harness_pg_int(f->pg, "SELECT max(seq) FROM %s", f->table);
	char *leader = harness_cursor_leader(f->pg, f->table), *next;
	int lead = -1;
	size_t lost;

	cr_assert_geq(harness_cursor_position(f->pg, f->table), max_seq,
	              "the position does not cover every row");
	cr_assert_not_null(leader, "no leader recorded");
	for (int i = 0; i < 3; i++)
		if (strstr(leader, strchr(ids[i], '=') + 1))
			lead = i;
	cr_assert_geq(lead, 0, "the leader '%s' is none of the three relays", leader);
	harness_relay_kill(f->relays[lead]);
	harness_insert_rows(f->pg, f->table, MORE, f->exchange, "three.relays", "more", NULL, NULL);
	fixture_expect_unique(f, f->cons, ROWS + MORE, FAULT_DELIVERY_TIMEOUT_MS);
	fault_expect_settled(f, 10, 60000);
	(void)fault_count(f, "three_relays after the leader died", "more", MORE, &lost);
	cr_assert_eq(lost, 0);
	next = harness_cursor_leader(f->pg, f->table);
	cr_assert(next && strcmp(next, leader) != 0, "the lead did not move from '%s'", leader);
	free(leader);
	free(next);
}

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
	if (harness_source_is_cursor())
		cursor_standby_takes_over(&f, ids);
	fixture_teardown(&f);
}
