/* The broker goes away mid-stream (the RabbitMQ application, then the whole node) while rows
 * keep being committed: the relay says it lost the connection, reconnects by itself, and
 * every committed row arrives. */
#include <criterion/criterion.h>
#include <stdio.h>

#include "tests/support/fault.h"

#define MAX_ROWS 30000

static const char lost_line[] = "msg=\"lost connection, will reconnect\" to=broker";
static const char back_line[] = "msg=\"reconnected\" to=broker";

/* Waits for some progress past what arrived so far, failing with the logs otherwise. */
static void expect_progress(struct fault *f, size_t more)
{
	fault_expect_unique(f, consumer_unique(f->cons) + more, FAULT_DELIVERY_TIMEOUT_MS);
}

static void finish(struct fault *f, struct fault_producer *p, const char *name)
{
	size_t n = fault_producer_stop(p), lost;

	fault_expect_unique(f, n, FAULT_DELIVERY_TIMEOUT_MS);
	fault_expect_settled(f, 10, 60000);
	harness_sleep_ms(1000);
	/* Duplicates are allowed: rows in flight when the connection dropped are sent again. */
	(void)fault_count(f, name, "brk", n, &lost);
	cr_assert_eq(lost, 0, "%zu committed rows never arrived", lost);
	cr_assert_eq(harness_pg_int(f->pg, "SELECT count(*) FROM %s WHERE attempts > 0", f->table),
	             0, "a lost connection must not charge attempts");
}

Test(fault, broker_stop_app_start_app, .timeout = 300)
{
	struct fault f;
	struct fault_producer *p;
	struct harness_relay *r;

	fault_setup(&f, "fault_brk_app");
	p = fault_producer_start(&f, "brk", 50, 20, MAX_ROWS);
	r = fault_relay_start(&f, NULL);
	expect_progress(&f, 2000);

	harness_broker_stop_app();
	cr_assert(fault_wait_logged(&f, lost_line, FAULT_LOG_TIMEOUT_MS),
	          "no 'lost connection' line after stop_app");
	harness_sleep_ms(1000); /* rows keep being committed while the broker is away */
	harness_broker_start_app();
	if (!fault_wait_logged(&f, back_line, FAULT_LOG_TIMEOUT_MS))
		fault_dump_logs(&f);
	cr_assert(fault_logged(&f, back_line), "no 'reconnected' line after start_app");
	expect_progress(&f, 2000);
	cr_assert_not(r->exited, "the relay process must recover by itself");
	finish(&f, p, "broker_stop_app");
	fault_teardown(&f);
}

Test(fault, broker_node_stop_start, .timeout = 300)
{
	struct fault f;
	struct fault_producer *p;
	struct harness_relay *r;

	fault_setup(&f, "fault_brk_node");
	p = fault_producer_start(&f, "brk", 50, 20, MAX_ROWS);
	r = fault_relay_start(&f, NULL);
	expect_progress(&f, 2000);

	harness_broker_node_stop();
	cr_assert(fault_wait_logged(&f, lost_line, FAULT_LOG_TIMEOUT_MS),
	          "no 'lost connection' line after the node stopped");
	harness_broker_node_start();
	if (!fault_wait_logged(&f, back_line, FAULT_LOG_TIMEOUT_MS))
		fault_dump_logs(&f);
	cr_assert(fault_logged(&f, back_line), "no 'reconnected' line after the node started");
	expect_progress(&f, 2000);
	cr_assert_not(r->exited, "the relay process must recover by itself");
	finish(&f, p, "broker_node_restart");
	fault_teardown(&f);
}
