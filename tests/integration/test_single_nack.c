/* One queue that rejects publishes, under a trickle: each of its rows is claimed alone, nacked,
 * and must back off by itself (no attempt charged, last_error says nacked) while the relay keeps
 * its broker connection and a healthy queue's rows keep flowing. A relay that took a one-row
 * batch nacked whole for "most of the batch nacked" (a condition of the broker) disconnected,
 * moved to another node and backed off, holding up every queue, after each such row.
 *
 * Deterministic: each round inserts one row for the rejecting queue and waits until the table
 * shows it nacked (so it was published alone), then one row for the healthy queue and waits for
 * it at the consumer. What must never show is in the log ("broker refused most of the batch",
 * "lost connection ... to=broker") and in /metrics (failovers). */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <amqp.h>
#include <amqp_framing.h>

#include "tests/support/amqp_admin.h"
#include "tests/support/fixture.h"
#include "tests/support/http_probe.h"

#define STATE_TIMEOUT_MS    120000
#define DELIVERY_TIMEOUT_MS 120000
#define ROUNDS              6

/* A queue that holds nothing and rejects every publish routed to it (x-max-length 0,
 * reject-publish): the broker nacks each such publish. Exclusive: it goes with the test's
 * connection. */
static void declare_rejecting_queue(amqp_connection_state_t c, const char *q, const char *exchange)
{
	amqp_admin_full_queue(c, q, exchange, "nack.bad", 0, true);
}

static void insert_row(struct fixture *f, const char *id, const char *rk)
{
	harness_pg_exec(f->pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body)"
	                " VALUES ('%s', '%s', '%s', '{\"id\":\"%s\"}')",
	                f->table, id, f->exchange, rk, id);
}

static bool nacked(struct fixture *f, const char *id)
{
	return harness_pg_int(
	               f->pg,
	               "SELECT count(*) FROM %s WHERE id = '%s' AND last_error LIKE '%%nacked%%'",
	               f->table, id) > 0;
}

Test(single_nack, one_rejecting_queue_does_not_hold_up_the_others, .timeout = 600)
{
	struct fixture f;
	amqp_connection_state_t admin;
	char rejecting[96], listen[64], e_listen[96], id[32], *m;
	size_t dups = 0;
	double failovers, nacks;

	fixture_setup(&f, "single_nack", &(struct fixture_options){ .binding = "nack.good" });
	admin = amqp_admin_open();
	snprintf(rejecting, sizeof(rejecting), "%s_reject", f.table);
	declare_rejecting_queue(admin, rejecting, f.exchange);

	snprintf(listen, sizeof(listen), "127.0.0.1:%d", probe_free_port());
	snprintf(e_listen, sizeof(e_listen), "OUTBOX_HTTP_LISTEN=%s", listen);
	/* An hour's poll: every row is found by its wake-up, so a row that reaches the consumer
	 * was not waiting for a poll. Row backoff at its default (1 s and up). */
	fixture_relay_start(
	        &f, (const char *const[]){ e_listen, "OUTBOX_RELAY_POLL_INTERVAL=1h", NULL });

	for (int i = 0; i < ROUNDS; i++) {
		snprintf(id, sizeof(id), "bad-%d", i);
		insert_row(&f, id, "nack.bad");
		HARNESS_WAIT(nacked(&f, id), STATE_TIMEOUT_MS);
		if (!nacked(&f, id))
			fixture_dump_logs(&f);
		cr_assert(nacked(&f, id), "%s was never nacked", id);

		snprintf(id, sizeof(id), "good-%d", i);
		insert_row(&f, id, "nack.good");
		fixture_expect_unique(&f, f.cons, (size_t)i + 1, DELIVERY_TIMEOUT_MS);
		cr_assert_geq(consumer_count(f.cons, id), 1, "%s was not delivered", id);
	}

	/* Each rejected row backed off by itself: not published, no attempt charged, later. */
	cr_assert_eq(harness_pg_int(f.pg,
	                            "SELECT count(*) FROM %s WHERE id LIKE 'bad-%%'"
	                            " AND published_at IS NULL AND attempts = 0"
	                            " AND last_error LIKE '%%nacked%%'",
	                            f.table),
	             ROUNDS, "a rejected row was charged, published, or not recorded as nacked");
	cr_assert(fixture_logged(&f, "could not publish, will retry"),
	          "the log does not say a row was nacked");

	/* The relay never took one row's nack for a broker condition. */
	if (fixture_logged(&f, "broker refused most of the batch") ||
	    fixture_logged(&f, "lost connection"))
		fixture_dump_logs(&f);
	cr_assert_eq(fixture_log_count(&f, "broker refused most of the batch"), 0,
	             "a one-row nack backed off the whole relay");
	cr_assert_eq(fixture_log_count(&f, "lost connection"), 0,
	             "the relay dropped a connection during the trickle");
	m = probe_get(listen, "/metrics").body;
	cr_assert_not_null(m);
	failovers = probe_metric(m, "outbox_relay_broker_failovers_total");
	nacks = probe_metric(m, "outbox_relay_failed_total{reason=\"nacked\"}");
	cr_assert_eq(failovers, 0, "the relay moved to another broker connection:\n%s", m);
	cr_assert_geq(nacks, ROUNDS, "nacks not counted:\n%s", m);
	cr_assert_eq(probe_metric(m, "outbox_relay_broker_up"), 1, "%s", m);
	free(m);

	/* Every healthy row arrived (lost = 0); duplicates are counted, not forbidden. */
	for (int i = 0; i < ROUNDS; i++) {
		snprintf(id, sizeof(id), "good-%d", i);
		cr_assert_geq(consumer_count(f.cons, id), 1, "%s lost", id);
		dups += consumer_count(f.cons, id) - 1;
	}
	cr_assert_eq(consumer_unique(f.cons), ROUNDS, "the consumer got rows of the other queue");
	fprintf(stderr, "single_nack: good=%d received=%zu lost=0 duplicates=%zu nacks=%.0f\n",
	        ROUNDS, consumer_received(f.cons), dups, nacks);

	amqp_admin_close(admin);
	fixture_teardown(&f);
}
