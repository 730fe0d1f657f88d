/* The broker goes away mid-stream (the RabbitMQ application, then the whole node), or stops
 * taking publishes (a memory alarm: connection.blocked), while rows keep being committed: the
 * relay says what happened, recovers by itself, and every committed row arrives. */
#include <criterion/criterion.h>
#include <stdbool.h>
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

/* A memory high watermark of 1 byte raises RabbitMQ's memory alarm: it blocks every
 * publishing connection until the watermark is back to its default. */
static void memory_alarm(bool on)
{
	cr_assert_eq(harness_shell("%s set_vm_memory_high_watermark %s >/dev/null",
	                           harness_require_env("RELAY_TEST_RABBITMQCTL"),
	                           on ? "absolute 1" : "0.4"),
	             0, "rabbitmqctl set_vm_memory_high_watermark failed");
}

static void clear_memory_alarm(void)
{
	memory_alarm(false);
}

Test(fault, broker_memory_alarm_blocks_publishing, .timeout = 300, .fini = clear_memory_alarm)
{
	static const char blocked_line[] =
	        "error=\"broker blocked the connection for more than 2000 ms (resource alarm)\"";
	struct fault f;
	struct fault_producer *p;
	struct harness_relay *r;

	fault_setup(&f, "fault_brk_alarm");
	p = fault_producer_start(&f, "brk", 50, 20, MAX_ROWS);
	r = fault_relay_start(&f, NULL);
	expect_progress(&f, 2000);

	/* confirm_timeout is 2s: blocked that long, the batch is released and the connection
	 * given up; the relay keeps trying until the alarm clears. */
	memory_alarm(true);
	if (!fault_wait_logged(&f, blocked_line, FAULT_LOG_TIMEOUT_MS))
		fault_dump_logs(&f);
	cr_assert(fault_logged(&f, blocked_line), "no line saying the broker blocked publishing");
	cr_assert(fault_logged(&f, "msg=\"broker did not confirm the batch, unconfirmed rows "
	                           "released\" reason=timeout"));
	harness_sleep_ms(3000);
	memory_alarm(false);
	expect_progress(&f, 2000);
	cr_assert_not(r->exited, "the relay process must recover by itself");
	finish(&f, p, "broker_memory_alarm");
	fault_teardown(&f);
}
