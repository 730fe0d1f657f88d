/* Rows the broker refuses, among good rows: unroutable (basic.return), a missing exchange
 * (404), a user_id that is not the connection's (406) and an exchange the relay's user may not
 * write to (403). Each costs its own row an attempt
 * with the reason and a backoff, never the other rows of its batch; once the route exists
 * the row is delivered; at max_attempts it is dead, logged once at error. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/fault.h"

#define GOOD 400

/* The test's consumer takes only "good.#", so other routing keys on the exchange have no
 * binding. */
static void routing_setup(struct fixture *f, const char *prefix)
{
	fixture_setup(f, prefix, &(struct fixture_options){ .binding = "good.#" });
}

/* GOOD good rows in one transaction with `extra` (an INSERT's VALUES list) in the middle, so
 * the odd rows share a batch with good ones. */
static void insert_with(struct fixture *f, const char *extra)
{
	harness_pg_exec(f->pg, "BEGIN");
	harness_pg_exec(f->pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body)"
	                " SELECT 'good-' || lpad(g::text, 7, '0'), '%s', 'good.rk', '{}'"
	                " FROM generate_series(0, %d) g",
	                f->table, f->exchange, GOOD / 2 - 1);
	harness_pg_exec(f->pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body, properties)"
	                " VALUES %s",
	                f->table, extra);
	harness_pg_exec(f->pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body)"
	                " SELECT 'good-' || lpad(g::text, 7, '0'), '%s', 'good.rk', '{}'"
	                " FROM generate_series(%d, %d) g",
	                f->table, f->exchange, GOOD / 2, GOOD - 1);
	harness_pg_exec(f->pg, "COMMIT");
}

static int64_t attempts_of(struct fixture *f, const char *id)
{
	return harness_pg_int(f->pg, "SELECT attempts FROM %s WHERE id = '%s'", f->table, id);
}

static void expect_error(struct fixture *f, const char *id, const char *want)
{
	char *err =
	        harness_pg_string(f->pg, "SELECT last_error FROM %s WHERE id = '%s'", f->table, id);

	cr_assert_not_null(err, "%s: no last_error", id);
	cr_assert(strstr(err, want) != NULL, "%s: last_error '%s' does not say '%s'", id, err,
	          want);
	free(err);
}

static void expect_good_uncharged(struct fixture *f)
{
	cr_assert_eq(harness_pg_int(f->pg,
	                            "SELECT count(*) FROM %s WHERE id LIKE 'good-%%'"
	                            " AND (attempts <> 0 OR last_error IS NOT NULL)",
	                            f->table),
	             0, "good rows were charged for another row's failure");
}

/* Every good row marked published, none of them charged for the odd row's failure. */
static void expect_good_settled_uncharged(struct fixture *f)
{
	HARNESS_WAIT(harness_pg_int(f->pg, "SELECT count(*) FROM %s WHERE id LIKE 'good-%%' AND %s",
	                            f->table, harness_unpublished(f->table)) == 0,
	             30000);
	expect_good_uncharged(f);
}

Test(fault, unroutable_and_missing_exchange, .timeout = 300)
{
	const char *const env[] = { "OUTBOX_RELAY_MAX_ATTEMPTS=100",
		                    "OUTBOX_RELAY_RETRY_BACKOFF_MIN=2s",
		                    "OUTBOX_RELAY_RETRY_BACKOFF_MAX=4s", NULL };
	struct fixture f;
	struct consumer *bound, *created;
	char nope[96], values[512], want[256], q2[96], q3[96];
	size_t lost;

	routing_setup(&f, "fault_route");
	snprintf(nope, sizeof(nope), "%s_nope", f.table);
	snprintf(values, sizeof(values),
	         "('unrouted-1', '%s', 'lonely.key', '{}', '{}'),"
	         " ('noexchange-1', '%s', 'good.rk', '{}', '{}')",
	         f.exchange, nope);
	insert_with(&f, values);
	fault_relay_start(&f, env);
	fixture_expect_unique(&f, f.cons, GOOD, FAULT_DELIVERY_TIMEOUT_MS);
	HARNESS_WAIT(attempts_of(&f, "unrouted-1") >= 1 && attempts_of(&f, "noexchange-1") >= 1,
	             60000);
	cr_assert_geq(attempts_of(&f, "unrouted-1"), 1);
	cr_assert_geq(attempts_of(&f, "noexchange-1"), 1);

	snprintf(want, sizeof(want),
	         "unroutable: exchange '%s' routing key 'lonely.key' has no "
	         "binding",
	         f.exchange);
	expect_error(&f, "unrouted-1", want);
	snprintf(want, sizeof(want), "exchange '%s' not found", nope);
	expect_error(&f, "noexchange-1", want);
	/* Backoff: the failure moved available_at at least backoff_min - 25 % past the row's
	 * creation (the failure itself came later still). */
	cr_assert_eq(harness_pg_int(f.pg,
	                            "SELECT count(*) FROM %s WHERE id IN ('unrouted-1',"
	                            " 'noexchange-1') AND %s"
	                            " AND available_at >= created_at + interval '1.5 seconds'",
	                            f.table, harness_unpublished(f.table)),
	             2, "no backoff applied after the failures");
	cr_assert(fixture_logged(&f, "msg=\"could not publish, will retry\" id=unrouted-1"));
	cr_assert(fixture_logged(&f, "msg=\"could not publish, will retry\" id=noexchange-1"));
	/* The cursor moved past them: set aside (deferred), to be retried on its exception
	 * path, while the position went on. */
	if (harness_source_is_cursor())
		cr_assert_eq(harness_pg_int(f.pg,
		                            "SELECT count(*) FROM %s WHERE id IN ('unrouted-1',"
		                            " 'noexchange-1') AND deferred_at IS NOT NULL",
		                            f.table),
		             2, "the failed rows were not set aside");
	expect_good_uncharged(&f);

	/* Give them a route: both are delivered on their next try. */
	snprintf(q2, sizeof(q2), "%s_q2", f.table);
	snprintf(q3, sizeof(q3), "%s_q3", f.table);
	bound = consumer_start(harness_amqp_url(), q2, f.exchange, NULL, "lonely.key");
	created = consumer_start(harness_amqp_url(), q3, nope, "topic", "#");
	if (!consumer_wait_unique(bound, 1, 60000) || !consumer_wait_unique(created, 1, 60000))
		fixture_dump_logs(&f);
	cr_assert_not_null(consumer_find(bound, "unrouted-1"), "unrouted-1 not delivered");
	cr_assert_not_null(consumer_find(created, "noexchange-1"), "noexchange-1 not delivered");
	fault_expect_settled(&f, 100, 30000);
	cr_assert_geq(attempts_of(&f, "unrouted-1"), 1, "attempts kept after delivery");

	harness_sleep_ms(1000);
	/* Duplicates allowed: after the 404 the rest of the batch is republished. */
	(void)fault_count(&f, "routing", "good", GOOD, &lost);
	cr_assert_eq(lost, 0, "%zu good rows never arrived", lost);
	expect_good_uncharged(&f);
	consumer_stop(bound);
	consumer_stop(created);
	fixture_teardown(&f);
}

Test(fault, precondition_failed_charges_only_its_row, .timeout = 300)
{
	const char *const env[] = { "OUTBOX_RELAY_MAX_ATTEMPTS=100",
		                    "OUTBOX_RELAY_RETRY_BACKOFF_MIN=2s",
		                    "OUTBOX_RELAY_RETRY_BACKOFF_MAX=4s", NULL };
	struct fixture f;
	char values[256];
	size_t lost;

	routing_setup(&f, "fault_406");
	snprintf(values, sizeof(values),
	         "('wrong-user-1', '%s', 'good.rk', '{}', '{\"user_id\":\"someone-else\"}')",
	         f.exchange);
	insert_with(&f, values);
	fault_relay_start(&f, env);
	fixture_expect_unique(&f, f.cons, GOOD, FAULT_DELIVERY_TIMEOUT_MS);
	HARNESS_WAIT(attempts_of(&f, "wrong-user-1") >= 1, 60000);
	cr_assert_geq(attempts_of(&f, "wrong-user-1"), 1);
	/* The broker's own reply text. */
	expect_error(&f, "wrong-user-1", "PRECONDITION_FAILED");
	expect_error(&f, "wrong-user-1", "someone-else");
	cr_assert_null(consumer_find(f.cons, "wrong-user-1"));
	expect_good_settled_uncharged(&f);
	harness_sleep_ms(1000);
	(void)fault_count(&f, "precondition_failed", "good", GOOD, &lost);
	cr_assert_eq(lost, 0, "%zu good rows never arrived", lost);
	fixture_teardown(&f);
}

Test(fault, max_attempts_makes_unroutable_row_dead, .timeout = 300)
{
	/* No relay is killed: a long lease, so that only the return can cause a resend. */
	const char *const env[] = { "OUTBOX_RELAY_MAX_ATTEMPTS=2", "OUTBOX_RELAY_LEASE=60s", NULL };
	struct fixture f;
	char values[256];
	size_t lost, dups;

	routing_setup(&f, "fault_maxatt");
	snprintf(values, sizeof(values), "('doomed-1', '%s', 'lonely.key', '{}', '{}')",
	         f.exchange);
	insert_with(&f, values);
	fault_relay_start(&f, env);
	fixture_expect_unique(&f, f.cons, GOOD, FAULT_DELIVERY_TIMEOUT_MS);
	HARNESS_WAIT(attempts_of(&f, "doomed-1") >= 2, 60000);
	cr_assert_eq(attempts_of(&f, "doomed-1"), 2);
	cr_assert(fixture_wait_logged(&f, "message is dead", FAULT_LOG_TIMEOUT_MS));
	/* Several poll intervals: a dead row is never claimed again. */
	harness_sleep_ms(2000);
	cr_assert_eq(attempts_of(&f, "doomed-1"), 2);
	cr_assert_eq(fixture_log_count(&f, "message is dead"), 1,
	             "the dead row logged more than once");
	cr_assert_eq(fixture_log_count(&f, "level=error"), 1);
	cr_assert_eq(fixture_log_count(&f, "msg=\"message is dead, an operator must requeue or"
	                                   " discard it\" id=doomed-1"),
	             1);
	cr_assert_eq(fixture_log_count(&f, "msg=\"could not publish, will retry\" id=doomed-1"), 1,
	             "the first failure is logged once");
	cr_assert_eq(fixture_log_count(&f, "level=warn"), 1, "the first failure is a warning");
	expect_error(&f, "doomed-1", "unroutable");
	dups = fault_count(&f, "max_attempts", "good", GOOD, &lost);
	cr_assert_eq(lost, 0);
	cr_assert_eq(dups, 0, "basic.return must not resend other rows");
	expect_good_uncharged(&f);
	fixture_teardown(&f);
}

/* A broker user that may write to every exchange except those whose name ends in "_denied". */
static void add_limited_user(const char *user)
{
	const char *ctl = harness_require_env("RELAY_TEST_RABBITMQCTL");

	cr_assert_eq(harness_shell("%s add_user %s limited-pw >/dev/null", ctl, user), 0,
	             "rabbitmqctl add_user failed");
	cr_assert_eq(harness_shell("%s set_permissions -p / %s '.*' '^(?!.*_denied$).*' '.*'"
	                           " >/dev/null",
	                           ctl, user),
	             0, "rabbitmqctl set_permissions failed");
}

Test(fault, access_refused_charges_only_its_row, .timeout = 300)
{
	const char *ctl = harness_require_env("RELAY_TEST_RABBITMQCTL");
	struct fixture f;
	struct consumer *denied_cons;
	char user[64], url[256], url_env[300], denied[96], q2[96], values[256];
	size_t lost;

	routing_setup(&f, "fault_403");
	snprintf(user, sizeof(user), "relay_limited_%ld", (long)getpid());
	snprintf(url, sizeof(url), "amqp://%s:limited-pw@127.0.0.1:%d", user, harness_amqp_port());
	snprintf(url_env, sizeof(url_env), "OUTBOX_AMQP_URL=%s", url);
	add_limited_user(user);
	/* The exchange exists (the passive check passes) but the relay's user may not write to
	 * it: the broker closes the channel with 403 at the publish. */
	snprintf(denied, sizeof(denied), "%s_denied", f.table);
	snprintf(q2, sizeof(q2), "%s_q2", f.table);
	denied_cons = consumer_start(harness_amqp_url(), q2, denied, "topic", "#");
	snprintf(values, sizeof(values), "('refused-1', '%s', 'good.rk', '{}', '{}')", denied);
	insert_with(&f, values);

	const char *const env[] = { url_env, "OUTBOX_RELAY_MAX_ATTEMPTS=100",
		                    "OUTBOX_RELAY_RETRY_BACKOFF_MIN=2s",
		                    "OUTBOX_RELAY_RETRY_BACKOFF_MAX=4s", NULL };
	fault_relay_start(&f, env);
	fixture_expect_unique(&f, f.cons, GOOD, FAULT_DELIVERY_TIMEOUT_MS);
	HARNESS_WAIT(attempts_of(&f, "refused-1") >= 1, 60000);
	cr_assert_geq(attempts_of(&f, "refused-1"), 1);
	/* The broker's own reply text, naming the exchange and the user. */
	expect_error(&f, "refused-1", "ACCESS_REFUSED");
	expect_error(&f, "refused-1", denied);
	expect_error(&f, "refused-1", user);
	cr_assert(fixture_logged(&f, "msg=\"could not publish, will retry\" id=refused-1"));
	cr_assert_eq(consumer_unique(denied_cons), 0, "a refused publish arrived");
	expect_good_settled_uncharged(&f);
	/* The relay never logged its user's password. */
	cr_assert_not(fixture_logged(&f, "limited-pw"), "the password appeared in a log");

	/* Grant the permission: the row goes out on its next try, on a channel opened since. */
	cr_assert_eq(
	        harness_shell("%s set_permissions -p / %s '.*' '.*' '.*' >/dev/null", ctl, user),
	        0);
	if (!consumer_wait_unique(denied_cons, 1, 60000))
		fixture_dump_logs(&f);
	cr_assert_not_null(consumer_find(denied_cons, "refused-1"), "refused-1 not delivered");
	fault_expect_settled(&f, 100, 30000);

	harness_sleep_ms(1000);
	/* Duplicates allowed: after the 403 the rest of the batch is republished. */
	(void)fault_count(&f, "access_refused", "good", GOOD, &lost);
	cr_assert_eq(lost, 0, "%zu good rows never arrived", lost);
	consumer_stop(denied_cons);
	fixture_teardown(&f);
	(void)harness_shell("%s delete_user %s >/dev/null", ctl, user);
}
