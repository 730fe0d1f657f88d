/* fixture.c — the set-up and teardown the relay tests share: own table, exchange, queue and
 * consumer, the test's connection and its relays, and the log and delivery checks over them
 * (see fixture.h). */
#include "tests/support/fixture.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

void fixture_setup(struct fixture *fx, const char *prefix, const struct fixture_options *opt)
{
	static const struct fixture_options defaults = { 0 };

	if (opt == NULL)
		opt = &defaults;
	memset(fx, 0, sizeof(*fx));
	harness_unique_name(fx->table, sizeof(fx->table), prefix);
	snprintf(fx->exchange, sizeof(fx->exchange), "%s_ex", fx->table);
	snprintf(fx->queue, sizeof(fx->queue), "%s_q", fx->table);
	fx->pg = harness_pg_connect();
	if (!opt->no_migrate)
		harness_migrate(fx->table);
	if (!opt->no_consumer)
		fx->cons = consumer_start(harness_amqp_url(), fx->queue, fx->exchange, "topic",
		                          opt->binding ? opt->binding : "#");
}

void fixture_teardown(struct fixture *fx)
{
	for (size_t i = 0; i < fx->n_relays; i++) {
		char name[32];

		snprintf(name, sizeof(name), "relay %zu", i);
		harness_relay_finish(fx->relays[i], name);
		fx->relays[i] = NULL;
	}
	fx->n_relays = 0;
	consumer_stop(fx->cons);
	fx->cons = NULL;
	/* The server may have been restarted under the old connection. */
	if (PQstatus(fx->pg) != CONNECTION_OK) {
		PQfinish(fx->pg);
		fx->pg = harness_pg_connect_retry(30000);
	}
	if (fx->pg)
		harness_pg_exec(fx->pg, "DROP TABLE IF EXISTS %s CASCADE", fx->table);
	PQfinish(fx->pg);
	fx->pg = NULL;
}

struct harness_relay *fixture_relay_start(struct fixture *fx, const char *const *env)
{
	cr_assert_lt(fx->n_relays, FIXTURE_MAX_RELAYS, "too many relays for one test");
	fx->relays[fx->n_relays] = harness_relay_start(fx->table, env, NULL);
	return fx->relays[fx->n_relays++];
}

int fixture_log_count(struct fixture *fx, const char *needle)
{
	int n = 0;

	for (size_t i = 0; i < fx->n_relays; i++) {
		if (fx->relays[i])
			n += harness_relay_log_count(fx->relays[i], needle);
	}
	return n;
}

bool fixture_logged(struct fixture *fx, const char *needle)
{
	return fixture_log_count(fx, needle) > 0;
}

bool fixture_wait_logged(struct fixture *fx, const char *needle, int64_t timeout_ms)
{
	HARNESS_WAIT(fixture_logged(fx, needle), timeout_ms);
	return fixture_logged(fx, needle);
}

void fixture_dump_logs(struct fixture *fx)
{
	for (size_t i = 0; i < fx->n_relays; i++) {
		if (fx->relays[i])
			harness_relay_dump_log(fx->relays[i]);
	}
}

void fixture_expect_unique(struct fixture *fx, struct consumer *c, size_t n, int64_t timeout_ms)
{
	if (consumer_wait_unique(c, n, timeout_ms))
		return;
	fixture_dump_logs(fx);
	cr_assert_fail("only %zu of %zu messages arrived within %lld ms", consumer_unique(c), n,
	               (long long)timeout_ms);
}
