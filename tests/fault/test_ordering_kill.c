/* Ordering keys under SIGKILL: relays killed in the middle of an overlapping producer
 * workload and restarted may resend the row of a key they had just published, but never send
 * a key's rows out of seq order, skip one or lose one. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/fixture.h"
#include "tests/support/ordering_load.h"

#define DELIVERY_TIMEOUT_MS 300000
#define N_RELAYS            3

/* Short leases, so that a killed relay's rows come back within seconds. */
static const char *const relay_env[] = { "OUTBOX_RELAY_POLL_INTERVAL=200ms",
	                                 "OUTBOX_RELAY_BATCH_SIZE=50", "OUTBOX_RELAY_LEASE=4s",
	                                 "OUTBOX_AMQP_CONFIRM_TIMEOUT=2s", NULL };

static void restart(struct harness_relay **slot, const char *table)
{
	harness_relay_kill(*slot);
	harness_relay_free(*slot);
	*slot = harness_relay_start(table, relay_env, NULL);
}

/* Kills relays at random during the concurrent-producer workload: a key may repeat its last
 * published row, never go back. */
Test(ordering_kill, sigkill_never_reorders_a_key, .timeout = 800)
{
	const size_t keys = 50, per_key = 200, n = keys * per_key;
	/* Kill after these many unique deliveries; the rounds marked two kill two relays. */
	const size_t at[] = { 800, 2000, 3500, 5000, 6500, 8000 };
	const int two[] = { 0, 1, 0, 1, 0, 1 };
	struct ordering_load *load;
	struct fixture fx;
	int kills = 0;

	fixture_setup(&fx, "ord_kill", NULL);
	for (int i = 0; i < N_RELAYS; i++)
		fixture_relay_start(&fx, relay_env);

	load = ordering_load_start(fx.table, fx.exchange, keys, per_key, 8, 77u);
	for (size_t r = 0; r < sizeof(at) / sizeof(at[0]); r++) {
		int victim = (int)(r % N_RELAYS);

		if (!consumer_wait_unique(fx.cons, at[r], DELIVERY_TIMEOUT_MS)) {
			fixture_dump_logs(&fx);
			cr_assert_fail("only %zu messages arrived before kill round %zu",
			               consumer_unique(fx.cons), r);
		}
		restart(&fx.relays[victim], fx.table);
		kills++;
		if (two[r]) {
			restart(&fx.relays[(victim + 1) % N_RELAYS], fx.table);
			kills++;
		}
	}
	ordering_load_join(load);

	if (!consumer_wait_unique(fx.cons, n, DELIVERY_TIMEOUT_MS)) {
		fixture_dump_logs(&fx);
		cr_assert_fail("only %zu of %zu messages arrived", consumer_unique(fx.cons), n);
	}
	HARNESS_WAIT(harness_unpublished_count(fx.pg, fx.table) == 0, 60000);
	cr_assert_eq(harness_unpublished_count(fx.pg, fx.table), 0, "rows left unpublished");
	harness_sleep_ms(1000);
	fprintf(stderr, "ordering_kill: %d relays killed, %zu deliveries, %zu duplicates\n", kills,
	        consumer_received(fx.cons), consumer_duplicates(fx.cons));
	ordering_check(fx.pg, fx.table, NULL, &fx.cons, 1, true, "ordering_kill");
	fixture_teardown(&fx);
}
