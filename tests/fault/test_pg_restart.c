/* PostgreSQL restarts (pg_ctl restart -m fast) mid-stream while a producer keeps committing:
 * the relay logs the lost connection, stops claiming, reconnects by itself and delivers every
 * committed row. */
#include <criterion/criterion.h>
#include <stdio.h>

#include "tests/support/fault.h"

#define MAX_ROWS 30000

static const char lost_line[] = "msg=\"lost connection, will reconnect\" to=database";
static const char back_line[] = "msg=\"reconnected\" to=database";

Test(fault, pg_restart_fast, .timeout = 300)
{
	struct fixture f;
	struct fault_producer *p;
	struct harness_relay *r;
	size_t n, lost;

	fixture_setup(&f, "fault_pg", NULL);
	p = fault_producer_start(&f, "pgr", 50, 20, MAX_ROWS);
	r = fault_relay_start(&f, NULL);
	fixture_expect_unique(&f, f.cons, 2000, FAULT_DELIVERY_TIMEOUT_MS);

	for (int round = 0; round < 2; round++) {
		int before = fixture_log_count(&f, back_line);

		harness_pg_restart();
		/* The test's own connection was cut too. */
		PQfinish(f.pg);
		f.pg = harness_pg_connect();
		if (!fixture_wait_logged(&f, lost_line, FAULT_LOG_TIMEOUT_MS))
			fixture_dump_logs(&f);
		cr_assert(fixture_logged(&f, lost_line), "no 'lost connection' line");
		HARNESS_WAIT(fixture_log_count(&f, back_line) > before, FAULT_LOG_TIMEOUT_MS);
		if (fixture_log_count(&f, back_line) <= before)
			fixture_dump_logs(&f);
		cr_assert_gt(fixture_log_count(&f, back_line), before,
		             "round %d: no 'reconnected' line after the restart", round);
		fixture_expect_unique(&f, f.cons, consumer_unique(f.cons) + 2000,
		                      FAULT_DELIVERY_TIMEOUT_MS);
	}
	cr_assert_not(r->exited, "the relay process must recover by itself");

	n = fault_producer_stop(p);
	fixture_expect_unique(&f, f.cons, n, FAULT_DELIVERY_TIMEOUT_MS);
	fault_expect_settled(&f, 10, 60000);
	harness_sleep_ms(1000);
	/* Duplicates allowed: confirmed rows whose mark was cut off are sent again. */
	(void)fault_count(&f, "pg_restart", "pgr", n, &lost);
	cr_assert_eq(lost, 0, "%zu committed rows never arrived", lost);
	cr_assert_eq(harness_pg_int(f.pg, "SELECT count(*) FROM %s WHERE attempts > 0", f.table), 0,
	             "a database restart must not charge attempts");
	fixture_teardown(&f);
}
