/* Rows too large for AMQP, among good ones, through the relay binary: a row whose headers
 * cannot fit a frame (200 keys of 1,000 characters) and a row whose body exceeds the test
 * broker's max_message_size (4 MiB; this one is 5 MiB). Each is dead at once with a last_error
 * that says why, every good row is delivered exactly once, and the relay never takes either
 * for a broken connection (which used to republish the rows before them forever and stall
 * everything behind them). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/fault.h"

#define MAX_ATTEMPTS 5

/* No relay is killed: a long lease, so that no lease running out on a loaded machine can
 * show up as a duplicate. */
static const char *const relay_env[] = { "OUTBOX_RELAY_MAX_ATTEMPTS=5", "OUTBOX_RELAY_LEASE=60s",
	                                 NULL };

/* Good rows "good-<i>" for i in [from, to). */
static void insert_good(struct fixture *f, int from, int to)
{
	harness_pg_exec(f->pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body)"
	                " SELECT 'good-' || lpad(g::text, 7, '0'), '%s', 'fault.good',"
	                " '{\"n\":' || g || '}' FROM generate_series(%d, %d) g ORDER BY g",
	                f->table, f->exchange, from, to - 1);
}

/* 3 good, headers beyond the frame, 3 good, a body beyond max_message_size, 3 good: one
 * transaction, so that they are claimed together, in this order. */
static void insert_rows(struct fixture *f)
{
	harness_pg_exec(f->pg, "BEGIN");
	insert_good(f, 0, 3);
	harness_pg_exec(f->pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body, headers)"
	                " SELECT 'big-headers', '%s', 'fault.bad', '{}',"
	                " '{' || string_agg(format('\"h%%s\":\"%%s\"', lpad(g::text, 3, '0'),"
	                " repeat('v', 1000)), ',' ORDER BY g) || '}'"
	                " FROM generate_series(0, 199) g",
	                f->table, f->exchange);
	insert_good(f, 3, 6);
	harness_pg_exec(f->pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body)"
	                " VALUES ('big-body', '%s', 'fault.bad', repeat('x', 5 * 1024 * 1024))",
	                f->table, f->exchange);
	insert_good(f, 6, 9);
	harness_pg_exec(f->pg, "COMMIT");
}

static int64_t dead_count(struct fixture *f)
{
	return harness_pg_int(f->pg,
	                      "SELECT count(*) FROM %s"
	                      " WHERE %s AND attempts >= %d",
	                      f->table, harness_unpublished(f->table), MAX_ATTEMPTS);
}

static void expect_dead(struct fixture *f, const char *id, const char *error)
{
	char *err;

	cr_assert_eq(harness_pg_int(f->pg, "SELECT attempts FROM %s WHERE id = '%s'", f->table, id),
	             MAX_ATTEMPTS, "%s: dead at once means attempts = max_attempts", id);
	err = harness_pg_string(f->pg, "SELECT last_error FROM %s WHERE id = '%s'", f->table, id);
	cr_assert_not_null(err, "%s: no last_error", id);
	cr_assert_str_eq(err, error, "%s", id);
	free(err);
	cr_assert_eq(consumer_count(f->cons, id), 0, "%s was published", id);
}

Test(fault, oversized_rows_dead_at_once, .timeout = 600)
{
	struct fixture f;
	size_t lost, dups;

	fixture_setup(&f, "fault_big", NULL);
	insert_rows(&f);
	fault_relay_start(&f, relay_env);
	fixture_expect_unique(&f, f.cons, 9, FAULT_DELIVERY_TIMEOUT_MS);
	HARNESS_WAIT(dead_count(&f) == 2, 60000);
	if (dead_count(&f) != 2)
		fixture_dump_logs(&f);
	cr_assert_eq(dead_count(&f), 2);
	fault_expect_settled(&f, MAX_ATTEMPTS, 60000);

	/* 200 entries of 1 + 4 + 1 + 4 + 1000 bytes and the table's length, then flags, content
	 * type, delivery mode, message_id, timestamp and the frame's own 20 bytes */
	expect_dead(&f, "big-headers",
	            "headers: encoded size 202,064 bytes exceeds the 131,072-byte frame");
	expect_dead(
	        &f, "big-body",
	        "body: 5,242,880 bytes exceed the broker's max_message_size of 4,194,304 bytes");
	cr_assert_eq(harness_pg_int(f.pg,
	                            "SELECT count(*) FROM %s WHERE id LIKE 'good-%%'"
	                            " AND attempts > 0",
	                            f.table),
	             0, "good rows were charged for the bad ones");
	cr_assert_eq(fixture_log_count(&f, "lost connection"), 0,
	             "a row's size was taken for a broken connection");

	/* The relay keeps serving. */
	harness_pg_exec(f.pg, "BEGIN");
	insert_good(&f, 9, 20);
	harness_pg_exec(f.pg, "COMMIT");
	fixture_expect_unique(&f, f.cons, 20, FAULT_DELIVERY_TIMEOUT_MS);

	harness_sleep_ms(1000);
	dups = fault_count(&f, "oversized", "good", 20, &lost);
	cr_assert_eq(lost, 0, "%zu good rows never arrived", lost);
	cr_assert_eq(dups, 0, "%zu good rows were delivered more than once", dups);
	fixture_teardown(&f);
}
