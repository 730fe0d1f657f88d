/* Network faults injected by a TCP proxy in front of each server: every connection cut at
 * once (broker side, then database side), a broker that goes silent long enough for the
 * confirm timeout, and a database that goes silent mid-request. The relay notices, recovers
 * when the network does, and loses nothing. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/fault.h"
#include "tests/support/tcp_proxy.h"

#define MAX_ROWS 30000

struct net {
	struct fixture f;
	struct proxy *mq, *db;
	char amqp_env[256], db_env[768];
	struct fault_producer *prod;
};

/* Both proxies, and a relay whose two connections go through them (the consumer and the
 * test's own connections do not). */
static void net_setup(struct net *t, const char *prefix, const char *const *extra)
{
	const char *amqp = harness_amqp_url();
	const char *colon = strrchr(amqp, ':');
	const char *pg_port = harness_require_env("RELAY_TEST_PG_PORT");
	const char *env[8];
	size_t n = 0;

	memset(t, 0, sizeof(*t));
	fixture_setup(&t->f, prefix, NULL);
	t->mq = proxy_start(harness_amqp_port());
	t->db = proxy_start((int)strtol(pg_port, NULL, 10));
	cr_assert_not_null(colon);
	snprintf(t->amqp_env, sizeof(t->amqp_env), "OUTBOX_AMQP_URL=%.*s:%d", (int)(colon - amqp),
	         amqp, proxy_port(t->mq));
	/* libpq takes the last value of a repeated keyword: the proxy's port wins. */
	snprintf(t->db_env, sizeof(t->db_env), "OUTBOX_DATABASE_URL=%s port=%d",
	         harness_pg_conninfo(), proxy_port(t->db));
	env[n++] = t->amqp_env;
	env[n++] = t->db_env;
	for (size_t i = 0; extra && extra[i] && n < 7; i++)
		env[n++] = extra[i];
	env[n] = NULL;
	t->prod = fault_producer_start(&t->f, "net", 50, 20, MAX_ROWS);
	fault_relay_start(&t->f, env);
	fixture_expect_unique(&t->f, t->f.cons, 2000, FAULT_DELIVERY_TIMEOUT_MS);
	cr_assert_geq(proxy_accepted(t->mq), 1, "the relay does not use the broker proxy");
	cr_assert_geq(proxy_accepted(t->db), 1, "the relay does not use the database proxy");
}

static void net_finish(struct net *t, const char *name)
{
	size_t n, lost;

	fixture_expect_unique(&t->f, t->f.cons, consumer_unique(t->f.cons) + 2000,
	                      FAULT_DELIVERY_TIMEOUT_MS);
	cr_assert_not(t->f.relays[0]->exited, "the relay process must recover by itself");
	n = fault_producer_stop(t->prod);
	fixture_expect_unique(&t->f, t->f.cons, n, FAULT_DELIVERY_TIMEOUT_MS);
	fault_expect_settled(&t->f, 10, 60000);
	harness_sleep_ms(1000);
	/* Duplicates allowed: what was in flight when the network failed is sent again. */
	(void)fault_count(&t->f, name, "net", n, &lost);
	cr_assert_eq(lost, 0, "%zu committed rows never arrived", lost);
	cr_assert_eq(
	        harness_pg_int(t->f.pg, "SELECT count(*) FROM %s WHERE attempts > 0", t->f.table),
	        0, "a network fault must not charge attempts");
	fixture_teardown(&t->f);
	proxy_stop(t->mq);
	proxy_stop(t->db);
}

static void expect_logged(struct fixture *f, const char *line, const char *what)
{
	if (!fixture_wait_logged(f, line, FAULT_LOG_TIMEOUT_MS))
		fixture_dump_logs(f);
	cr_assert(fixture_logged(f, line), "no '%s' line after %s", line, what);
}

/* Lets the stall last a few seconds more, ends it, and expects the relay to reconnect (the
 * log line `reconnected`) and to move on. */
static void end_stall(struct net *t, struct proxy *p, const char *reconnected)
{
	size_t during;

	harness_sleep_ms(3000);
	during = consumer_unique(t->f.cons);
	proxy_stall(p, false);
	expect_logged(&t->f, reconnected, "the stall ended");
	fixture_expect_unique(&t->f, t->f.cons, during + 1000, FAULT_DELIVERY_TIMEOUT_MS);
}

Test(fault, proxy_drop_broker_connections, .timeout = 300)
{
	struct net t;

	net_setup(&t, "fault_net_mq", NULL);
	proxy_drop_all(t.mq);
	expect_logged(&t.f, "msg=\"lost connection, will reconnect\" to=broker",
	              "the broker connections were cut");
	expect_logged(&t.f, "msg=\"reconnected\" to=broker", "the broker connections were cut");
	cr_assert_geq(proxy_accepted(t.mq), 2);
	net_finish(&t, "proxy_drop_broker");
}

Test(fault, proxy_drop_database_connections, .timeout = 300)
{
	struct net t;

	net_setup(&t, "fault_net_db", NULL);
	proxy_drop_all(t.db);
	expect_logged(&t.f, "msg=\"lost connection, will reconnect\" to=database",
	              "the database connections were cut");
	expect_logged(&t.f, "msg=\"reconnected\" to=database", "the database connections were cut");
	cr_assert_geq(proxy_accepted(t.db), 2);
	net_finish(&t, "proxy_drop_database");
}

Test(fault, proxy_broker_stall_hits_confirm_timeout, .timeout = 300)
{
	struct net t;

	net_setup(&t, "fault_net_stall", NULL);
	proxy_stall(t.mq, true);
	/* confirm_timeout is 2s: the batch in flight times out, is released, and the relay
	 * reconnects (through the proxy that is still stalled) until the stall ends. */
	expect_logged(&t.f, "broker did not confirm the batch, unconfirmed rows released",
	              "the broker stalled");
	cr_assert(fixture_logged(&t.f, "reason=timeout"), "the release does not say it timed out");
	cr_assert(fixture_logged(&t.f, "msg=\"lost connection, will reconnect\" to=broker"));
	end_stall(&t, t.mq, "msg=\"reconnected\" to=broker");
	net_finish(&t, "proxy_broker_stall");
}

Test(fault, proxy_database_stall_gives_the_connection_up, .timeout = 300)
{
	struct net t;

	net_setup(&t, "fault_net_dbstall", NULL);
	proxy_stall(t.db, true);
	/* The lease is 3s: a request unanswered for that long is given up, the connection dropped
	 * and a new one tried (through the proxy that is still stalled, so connect_timeout ends
	 * those tries) until the stall ends. */
	expect_logged(&t.f, "no answer from PostgreSQL within 3000 ms", "the database stalled");
	cr_assert(fixture_logged(&t.f, "msg=\"lost connection, will reconnect\" to=database"));
	end_stall(&t, t.db, "msg=\"reconnected\" to=database");
	net_finish(&t, "proxy_database_stall");
}
