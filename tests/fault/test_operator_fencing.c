/* `discard` and `requeue --id` never race a relay: rows under a live lease are refused (nothing
 * changed, the line names each id, who holds it and until when, and how to wait or force).
 * With --force, discard deletes the row and the relay's later mark cannot bring it back;
 * requeue resets the row's attempts but leaves the lease to its relay, so the row is never
 * published by two relays at once. The relay holding the rows is kept publishing by a stalled
 * broker connection (a proxy), with a second relay ready to take whatever is let go. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/fault.h"
#include "tests/support/tcp_proxy.h"

static const char *const slow_confirms[] = {
	"OUTBOX_AMQP_CONFIRM_TIMEOUT=90s",
	"OUTBOX_RELAY_LEASE=180s",
	"OUTBOX_RELAY_BATCH_SIZE=10",
};

static int64_t count(struct fixture *f, const char *cond)
{
	return harness_pg_int(f->pg, "SELECT count(*) FROM %s WHERE %s", f->table, cond);
}

static void expect_refused(struct fixture *f, const char *cmd, const char *id)
{
	struct harness_output o;
	char *holder =
	        harness_pg_string(f->pg, "SELECT locked_by FROM %s WHERE id = '%s'", f->table, id);

	cr_assert_not_null(holder, "%s is not leased", id);

	harness_cli(&o, f->table, NULL, cmd, "--id", id, "other-id", (const char *)NULL);
	fprintf(stderr, "%s --id %s (leased): exit %d: %s%s", cmd, id, o.status, o.out, o.err);
	cr_assert_eq(o.status, 1, "%s of a leased row: exit %d: %s%s", cmd, o.status, o.out, o.err);
	cr_assert_not_null(strstr(o.err, id), "%s: the line does not name %s: %s", cmd, id, o.err);
	cr_assert_not_null(strstr(o.err, holder), "%s: the line does not name the holder %s: %s",
	                   cmd, holder, o.err);
	cr_assert_not_null(strstr(o.err, "--force"), "%s: no way out given: %s", cmd, o.err);
	cr_assert_not_null(strstr(o.err, "nothing was changed"), "%s: %s", cmd, o.err);
	cr_assert_eq(strchr(o.err, '\n'), o.err + strlen(o.err) - 1, "%s: not one line: %s", cmd,
	             o.err);
	harness_output_free(&o);
	free(holder);
}

Test(operator_fencing, discard_and_requeue_never_race_a_relay, .timeout = 600)
{
	struct fixture f;
	struct proxy *mq;
	char mq_env[256], *holder;
	const char *env[8];
	struct harness_relay *a;
	struct harness_output o;

	/* Not for the cursor source: the rows of its batches carry no lease (only its position
	 * moves past them), so no row is under a live lease for the commands to refuse or keep,
	 * and its leader's batch cannot be seen from the table. The commands on a table the
	 * cursor runs are the operator commands' own tests'. */
	if (harness_source_is_cursor())
		cr_skip_test("the cursor source leases no row of its batches");
	fixture_setup(&f, "opfence", NULL);
	mq = proxy_start(harness_amqp_port());
	fault_amqp_env(mq_env, sizeof(mq_env), proxy_port(mq));
	env[0] = slow_confirms[0];
	env[1] = slow_confirms[1];
	env[2] = slow_confirms[2];
	env[3] = mq_env;
	env[4] = NULL;
	a = fault_relay_start(&f, env);
	cr_assert(harness_relay_wait_log(a, "msg=\"connected\" to=broker", FAULT_LOG_TIMEOUT_MS));
	cr_assert(harness_relay_wait_log(a, "msg=\"connected\" to=database", FAULT_LOG_TIMEOUT_MS));

	/* Relay A claims both rows and publishes them into a broker connection that carries
	 * nothing: they stay leased to it while it waits for the confirms. */
	proxy_stall(mq, true);
	harness_pg_exec(f.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body) VALUES"
	                " ('fence-discard', '%s', 'fence', '{}'),"
	                " ('fence-requeue', '%s', 'fence', '{}')",
	                f.table, f.exchange, f.exchange);
	HARNESS_WAIT(count(&f, "locked_by IS NOT NULL AND locked_until > now()") == 2,
	             FAULT_LOG_TIMEOUT_MS);
	cr_assert_eq(count(&f, "locked_by IS NOT NULL AND locked_until > now()"), 2,
	             "relay A did not claim the rows");
	holder = harness_pg_string(f.pg, "SELECT locked_by FROM %s WHERE id = 'fence-requeue'",
	                           f.table);
	cr_assert_not_null(holder);
	/* A failure recorded earlier, for the requeue to reset. */
	harness_pg_exec(
	        f.pg,
	        "UPDATE %s SET attempts = 2, last_error = 'earlier' WHERE id = 'fence-requeue'",
	        f.table);

	/* Refused, and nothing changed. */
	expect_refused(&f, "discard", "fence-discard");
	expect_refused(&f, "requeue", "fence-requeue");
	cr_assert_eq(count(&f, "id IN ('fence-discard', 'fence-requeue') AND locked_until > now()"),
	             2);
	cr_assert_eq(count(&f, "id = 'fence-requeue' AND attempts = 2 AND last_error = 'earlier'"),
	             1, "a refused requeue changed the row");

	/* A second relay, free to publish whatever relay A lets go of. */
	fault_relay_start(&f, (const char *const[]){ "OUTBOX_RELAY_LEASE=180s", NULL });
	cr_assert(fixture_wait_logged(&f, "msg=\"connected\" to=broker", FAULT_LOG_TIMEOUT_MS));

	/* Forced: the discard deletes the row; the requeue resets it and keeps the lease. */
	harness_cli(&o, f.table, NULL, "discard", "--id", "fence-discard", "--force",
	            (const char *)NULL);
	fprintf(stderr, "discard --force: exit %d: %s%s", o.status, o.out, o.err);
	cr_assert_eq(o.status, 0, "%s%s", o.out, o.err);
	cr_assert_not_null(strstr(o.out, "discarded 1 row"), "%s", o.out);
	harness_output_free(&o);
	harness_cli(&o, f.table, NULL, "requeue", "--id", "fence-requeue", "--force",
	            (const char *)NULL);
	fprintf(stderr, "requeue --force: exit %d: %s%s", o.status, o.out, o.err);
	cr_assert_eq(o.status, 0, "%s%s", o.out, o.err);
	cr_assert_not_null(strstr(o.out, "requeued 1 row"), "%s", o.out);
	harness_output_free(&o);
	cr_assert_eq(count(&f, "id = 'fence-discard'"), 0);
	cr_assert_eq(count(&f, "id = 'fence-requeue' AND attempts = 0 AND last_error IS NULL"), 1);
	{
		char *now = harness_pg_string(
		        f.pg, "SELECT locked_by FROM %s WHERE id = 'fence-requeue'", f.table);
		cr_assert_not_null(now, "the forced requeue let the lease go");
		cr_assert_str_eq(now, holder, "the forced requeue changed the lease");
		free(now);
	}

	/* Relay A gets its confirms: it marks what it still holds, and only that. */
	proxy_stall(mq, false);
	HARNESS_WAIT(count(&f, "id = 'fence-requeue' AND published_at IS NOT NULL") == 1,
	             FAULT_DELIVERY_TIMEOUT_MS);
	cr_assert_eq(count(&f, "id = 'fence-requeue' AND published_at IS NOT NULL"), 1);
	/* A row committed afterwards goes out: every earlier mark has been written by then. */
	harness_pg_exec(f.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body) VALUES"
	                " ('fence-tail', '%s', 'fence', '{}')",
	                f.table, f.exchange);
	HARNESS_WAIT(consumer_count(f.cons, "fence-tail") >= 1 &&
	                     count(&f, "published_at IS NULL") == 0,
	             FAULT_DELIVERY_TIMEOUT_MS);
	cr_assert_eq(count(&f, "published_at IS NULL"), 0);
	cr_assert_eq(count(&f, "id = 'fence-discard'"), 0,
	             "the relay's mark brought back a row an "
	             "operator discarded");
	fprintf(stderr,
	        "fault operator_fencing: fence-requeue delivered %zu, fence-discard delivered %zu "
	        "(in flight before the forced discard), duplicates=%zu\n",
	        consumer_count(f.cons, "fence-requeue"), consumer_count(f.cons, "fence-discard"),
	        consumer_duplicates(f.cons));
	cr_assert_eq(consumer_count(f.cons, "fence-requeue"), 1,
	             "the requeued row went out %zu times",
	             consumer_count(f.cons, "fence-requeue"));
	cr_assert_leq(consumer_count(f.cons, "fence-discard"), 1);
	cr_assert_eq(consumer_duplicates(f.cons), 0);
	free(holder);
	fixture_teardown(&f);
	proxy_stop(mq);
}
