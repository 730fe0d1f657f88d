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
static void expect_progress(struct fixture *f, size_t more)
{
	fixture_expect_unique(f, f->cons, consumer_unique(f->cons) + more,
	                      FAULT_DELIVERY_TIMEOUT_MS);
}

static void finish(struct fixture *f, struct fault_producer *p, const char *name)
{
	size_t n = fault_producer_stop(p), lost;

	fixture_expect_unique(f, f->cons, n, FAULT_DELIVERY_TIMEOUT_MS);
	fault_expect_settled(f, 10, 60000);
	harness_sleep_ms(1000);
	/* Duplicates are allowed: rows in flight when the connection dropped are sent again. */
	(void)fault_count(f, name, "brk", n, &lost);
	cr_assert_eq(lost, 0, "%zu committed rows never arrived", lost);
	cr_assert_eq(harness_pg_int(f->pg, "SELECT count(*) FROM %s WHERE attempts > 0", f->table),
	             0, "a lost connection must not charge attempts");
}

/* One broker fault in the middle of a stream of commits: cause() it, expect fault_line in a
 * relay log, let it last pause_ms, end() it, expect back_line (when not NULL), then progress;
 * in the end every committed row is delivered and no attempt is charged. */
struct broker_fault {
	const char *prefix, *name;
	void (*cause)(void);
	const char *fault_line;
	int pause_ms;
	void (*end)(void);
	const char *back_line;
};

static void run_broker_fault(const struct broker_fault *bf)
{
	struct fixture f;
	struct fault_producer *p;
	struct harness_relay *r;

	fixture_setup(&f, bf->prefix, NULL);
	p = fault_producer_start(&f, "brk", 50, 20, MAX_ROWS);
	r = fault_relay_start(&f, NULL);
	expect_progress(&f, 2000);

	bf->cause();
	if (!fixture_wait_logged(&f, bf->fault_line, FAULT_LOG_TIMEOUT_MS))
		fixture_dump_logs(&f);
	cr_assert(fixture_logged(&f, bf->fault_line), "no '%s' line in %s", bf->fault_line,
	          bf->name);
	harness_sleep_ms(bf->pause_ms); /* rows keep being committed meanwhile */
	bf->end();
	if (bf->back_line) {
		if (!fixture_wait_logged(&f, bf->back_line, FAULT_LOG_TIMEOUT_MS))
			fixture_dump_logs(&f);
		cr_assert(fixture_logged(&f, bf->back_line), "no '%s' line in %s", bf->back_line,
		          bf->name);
	}
	expect_progress(&f, 2000);
	cr_assert_not(r->exited, "the relay process must recover by itself");
	finish(&f, p, bf->name);
	fixture_teardown(&f);
}

Test(fault, broker_stop_app_start_app, .timeout = 300)
{
	run_broker_fault(&(struct broker_fault){ "fault_brk_app", "broker_stop_app",
	                                         harness_broker_stop_app, lost_line, 1000,
	                                         harness_broker_start_app, back_line });
}

Test(fault, broker_node_stop_start, .timeout = 300)
{
	run_broker_fault(&(struct broker_fault){ "fault_brk_node", "broker_node_restart",
	                                         harness_broker_node_stop, lost_line, 0,
	                                         harness_broker_node_start, back_line });
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

static void raise_memory_alarm(void)
{
	memory_alarm(true);
}

static void clear_memory_alarm(void)
{
	memory_alarm(false);
}

/* confirm_timeout is 2s: blocked that long, the batch is released (no attempt charged) and
 * the connection given up; the relay keeps trying until the alarm clears. */
Test(fault, broker_memory_alarm_blocks_publishing, .timeout = 300, .fini = clear_memory_alarm)
{
	run_broker_fault(&(struct broker_fault){
	        "fault_brk_alarm", "broker_memory_alarm", raise_memory_alarm,
	        "msg=\"broker did not confirm the batch, unconfirmed rows released\""
	        " reason=timeout error=\"broker blocked the connection (resource alarm) and"
	        " confirmed nothing more for ",
	        3000, clear_memory_alarm, NULL });
}
