/* SIGHUP, as an operator or a log-rotation script sends it to a daemon: the relay says that
 * its configuration is not reloaded, keeps relaying, and still stops in order (exit 0) on the
 * SIGTERM that follows. Left at its default, SIGHUP ended the process at once, without the
 * orderly shutdown, with a status that systemd counts as a clean stop. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>

#include "tests/support/fault.h"

#define ROWS_BEFORE 20
#define ROWS_AFTER  20

static const char hup_line[] =
        "msg=\"received SIGHUP, configuration not reloaded: restart to apply changes\"";

Test(fault, sighup_is_noted_and_the_relay_keeps_running, .timeout = 600)
{
	struct fixture f;
	struct harness_relay *r;
	int st;

	fixture_setup(&f, "fault_hup", NULL);
	r = fault_relay_start(&f, NULL);
	harness_insert_rows(f.pg, f.table, ROWS_BEFORE, f.exchange, "hup.run", "hup", NULL, NULL);
	fixture_expect_unique(&f, f.cons, ROWS_BEFORE, FAULT_DELIVERY_TIMEOUT_MS);

	cr_assert_eq(kill(r->pid, SIGHUP), 0);
	if (!harness_relay_wait_log(r, hup_line, FAULT_LOG_TIMEOUT_MS)) {
		(void)harness_relay_wait(r, 1000);
		harness_relay_dump_log(r);
		cr_assert_fail("no SIGHUP line; the relay %s (status %d)",
		               r->exited ? "exited" : "is still running", r->status);
	}
	cr_assert_eq(harness_relay_log_count(r, hup_line), 1, "one line per SIGHUP");

	/* Still relaying: rows committed after the signal go out. */
	harness_insert_rows(f.pg, f.table, ROWS_AFTER, f.exchange, "hup.run", "hup_after", NULL,
	                    NULL);
	fixture_expect_unique(&f, f.cons, ROWS_BEFORE + ROWS_AFTER, FAULT_DELIVERY_TIMEOUT_MS);
	st = harness_relay_wait(r, 0);
	cr_assert_eq(st, -1, "the relay exited after SIGHUP (status %d)", st);

	/* And the orderly shutdown is still the one SIGTERM starts. */
	st = harness_relay_stop(r, SIGTERM, 60000);
	if (st != 0)
		harness_relay_dump_log(r);
	cr_assert_eq(st, 0, "SIGTERM after SIGHUP: exit status %d", st);
	cr_assert_gt(harness_relay_log_count(r, "msg=\"stopped\""), 0, "no orderly shutdown");
	fixture_teardown(&f);
}
