/* A partitioned table under a SIGKILL loop while retention drops partitions: a producer keeps
 * committing across partition boundaries (partitions of 500 rows), the relay is killed five
 * times at random moments, its maintenance loop creates partitions ahead of the producer (rows
 * that outrun them while no relay runs land in the DEFAULT partition) and drops the done ones
 * behind it, and every committed row still arrives (lost = 0, duplicates counted). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tests/support/fault.h"

#define ROWS      8000
#define KILLS     5
#define PART_ROWS "500"

static struct fixture g_fx;

static void fini(void)
{
	fixture_teardown(&g_fx);
}

/* Rows left in the table: on a partitioned table retention deletes none, it drops partitions. */
static int64_t rows_left(void)
{
	return harness_pg_int(g_fx.pg, "SELECT count(*) FROM %s", g_fx.table);
}

Test(fault, partitioned_sigkill_with_retention, .timeout = 600, .fini = fini)
{
	const char *const env[] = { "OUTBOX_RELAY_RETENTION=1s", "OUTBOX_RELAY_PURGE_INTERVAL=1s",
		                    NULL };
	unsigned seed = (unsigned)time(NULL);
	struct harness_output o;
	struct fault_producer *p;
	size_t committed, lost;

	fixture_setup(&g_fx, "fault_pkill", &(struct fixture_options){ .no_migrate = true });
	fixture_drop_later(
	        &g_fx,
	        "DROP FUNCTION IF EXISTS %s_part_ahead(), %s_part_retire(bigint, bigint),"
	        " %s_part_status(integer, boolean)",
	        g_fx.table, g_fx.table, g_fx.table);
	harness_cli(&o, g_fx.table, NULL, "migrate", "--partitioned", "--partition-rows", PART_ROWS,
	            NULL);
	cr_assert_eq(o.status, 0, "migrate --partitioned exited %d: %s", o.status, o.err);
	harness_output_free(&o);
	fprintf(stderr, "fault partitioned kill: random seed %u\n", seed);
	srand(seed);
	p = fault_producer_start(&g_fx, "pk", 50, 20, ROWS);
	for (int k = 0; k < KILLS; k++) {
		struct harness_relay *r = fault_relay_start(&g_fx, env);
		size_t target = (size_t)(k + 1) * (ROWS / (KILLS + 3));

		if (!consumer_wait_unique(g_fx.cons, target, FAULT_DELIVERY_TIMEOUT_MS)) {
			fixture_dump_logs(&g_fx);
			cr_assert_fail("kill %d: stuck at %zu of %zu messages", k,
			               consumer_unique(g_fx.cons), target);
		}
		harness_sleep_ms(rand() % 300);
		harness_relay_kill(r);
		cr_assert_eq(r->status, 128 + 9, "kill %d: relay ended with %d, not by SIGKILL", k,
		             r->status);
	}
	fault_relay_start(&g_fx, env);
	committed = fault_producer_stop(p);
	fixture_expect_unique(&g_fx, g_fx.cons, committed, FAULT_DELIVERY_TIMEOUT_MS);
	fault_expect_settled(&g_fx, 10, 60000);
	/* Retention dropped partitions behind the relay, with their rows. */
	HARNESS_WAIT(rows_left() < (int64_t)committed, FAULT_LOG_TIMEOUT_MS);
	cr_assert_lt(rows_left(), (int64_t)committed,
	             "all %zu rows still in the table: no partition dropped", committed);
	(void)fault_count(&g_fx, "partitioned kill", "pk", committed, &lost);
	cr_assert_eq(lost, 0, "%zu committed rows never arrived", lost);
	fixture_teardown(&g_fx);
}
