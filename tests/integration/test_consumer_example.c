/* The example consumer (examples/consumer.c) in its database mode, end to end: the relay
 * publishes every row, then publishes all of them again (as after a crash between publish and
 * mark), and the consumer, deduplicating with the inbox table (store/liboutbox/inbox.h), does the work
 * of each message exactly once and acks the repeats as duplicates. A second queue on the
 * same exchange counts what the broker really delivered. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/fixture.h"

#define ROWS                300
#define DELIVERY_TIMEOUT_MS 120000

Test(consumer_example, inbox_mode_does_each_message_once, .timeout = 300)
{
	char inbox[64], queue[64], db_env[600], inbox_env[96];
	const char *const env[] = { db_env, inbox_env, NULL };
	struct harness_relay *example;
	struct fixture fx;

	/* fx.cons counts what the broker delivers; the example consumes a queue of its own. */
	fixture_setup(&fx, "cx", NULL);
	snprintf(inbox, sizeof(inbox), "%s_inbox", fx.table);
	snprintf(queue, sizeof(queue), "%s_example", fx.table);
	snprintf(db_env, sizeof(db_env), "INBOX_DATABASE_URL=%s", harness_pg_conninfo());
	snprintf(inbox_env, sizeof(inbox_env), "INBOX_TABLE=%s", inbox);

	example = harness_program_start(harness_require_env("RELAY_TEST_CONSUMER_BIN"),
	                                (const char *const[]){ harness_amqp_url(), queue,
	                                                       fx.exchange, "cx.#", "240", NULL },
	                                env, "example-consumer");
	if (!harness_relay_wait_log(example, "deduplicating in the database", 30000))
		harness_relay_dump_log(example);
	cr_assert(harness_relay_log_count(example, "deduplicating in the database") == 1,
	          "the example consumer did not start in database mode");
	cr_assert_eq(harness_pg_int(fx.pg, "SELECT count(*) FROM %s", inbox), 0,
	             "the consumer did not create its inbox table");

	harness_insert_rows(fx.pg, fx.table, ROWS, fx.exchange, "cx.rk", "cx", NULL, NULL);
	fixture_relay_start(&fx, NULL);
	cr_assert(consumer_wait_unique(fx.cons, ROWS, DELIVERY_TIMEOUT_MS),
	          "only %zu of %d arrived", consumer_unique(fx.cons), ROWS);
	HARNESS_WAIT(harness_pg_int(fx.pg, "SELECT count(*) FROM %s WHERE confirmed_at IS NOT NULL",
	                            inbox) == ROWS,
	             DELIVERY_TIMEOUT_MS);

	/* Every row published again: each message now reaches the consumer a second time. */
	harness_pg_exec(fx.pg, "UPDATE %s SET published_at = NULL", fx.table);
	HARNESS_WAIT(consumer_received(fx.cons) >= 2 * ROWS, DELIVERY_TIMEOUT_MS);
	cr_assert_eq(consumer_received(fx.cons), 2 * ROWS,
	             "the broker did not deliver the repeats");
	HARNESS_WAIT(harness_relay_log_count(example, "duplicate message_id=") >= ROWS,
	             DELIVERY_TIMEOUT_MS);
	if (harness_relay_log_count(example, "duplicate message_id=") != ROWS)
		harness_relay_dump_log(example);

	/* The work ran once per message, and the repeats were recognised as such. */
	cr_assert_eq(harness_relay_log_count(example, "duplicate message_id="), ROWS);
	cr_assert_eq(harness_relay_log_count(example, "received message_id="), ROWS);
	cr_assert_eq(harness_relay_log_count(example, "requeued"), 0);
	cr_assert_eq(harness_pg_int(fx.pg,
	                            "SELECT count(*) FROM %s i JOIN %s o ON o.id = i.message_id"
	                            " WHERE i.confirmed_at IS NOT NULL",
	                            inbox, fx.table),
	             ROWS, "every outbox id is confirmed once in the inbox");
	cr_assert_eq(harness_pg_int(fx.pg, "SELECT count(*) FROM %s", inbox), ROWS);

	/* The example has no orderly stop of its own: SIGTERM ends it. */
	cr_assert_eq(harness_relay_stop(example, SIGTERM, 30000), 128 + SIGTERM);
	harness_relay_free(example);
	harness_pg_exec(fx.pg, "DROP TABLE %s", inbox);
	fixture_teardown(&fx);
}
