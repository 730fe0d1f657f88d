/* The relay binary against a broker that nacks every publish (a full queue rejecting them, on
 * two routing keys): nacks are counted and logged as the broker's failure, never charged as
 * attempts, no row goes dead, a batch nacked across destinations backs the connection off, and
 * once the rejecting queue is gone every row is published and delivered. */
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

/* Generous deadlines: the suite runs under ASan on two cores beside other test files. Only
 * there to stop a hang. */
#define STATE_TIMEOUT_MS    120000
#define DELIVERY_TIMEOUT_MS 180000
/* At least the 8 nacked rows a connection backs off for (relay/worker.c), on two routing
 * keys: nacks of one destination only back its rows off. */
#define ROWS 12
/* relay.max_attempts for the relay under test: every row must be nacked more often than this
 * and still be charged nothing. */
#define MAX_ATTEMPTS 2
#define BINDING_KEY  "nacks.#"
#define ID_PREFIX    "nack"

/* A queue that holds nothing and rejects every publish routed to it, bound to exchange with
 * the rows' routing key: the broker then nacks each publish as a whole, whatever the other
 * queues did with it. Exclusive, so that it goes with the connection if the test fails. */
static void declare_rejecting_queue(amqp_connection_state_t c, const char *q, const char *exchange)
{
	amqp_admin_full_queue(c, q, exchange, BINDING_KEY, 0, true);
}

/* Rows on two routing keys, both bound to the rejecting queue. */
static void two_keys(size_t i, struct outbox_row *row, void *arg)
{
	(void)arg;
	row->routing_key = i % 2 ? "nacks.b" : "nacks.a";
}

/* ---- what the relay shows ---- */

static char *scrape(const char *listen)
{
	struct probe_reply r = probe_get(listen, "/metrics");

	cr_assert_eq(r.status, 200, "/metrics answered %d", r.status);
	return r.body;
}

/* Log lines of r that hold every one of the n needles. */
static int log_lines_with(const struct harness_relay *r, const char *const *needles, size_t n)
{
	char *log = harness_relay_log(r), *line, *next;
	int count = 0;

	for (line = log; line && *line; line = next) {
		bool all = true;

		next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		for (size_t i = 0; i < n && all; i++)
			all = strstr(line, needles[i]) != NULL;
		count += all;
	}
	free(log);
	return count;
}

static void row_id(char *buf, size_t n, size_t i)
{
	snprintf(buf, n, "%s-%07zu", ID_PREFIX, i);
}

/* How often the log says row i was nacked and will be retried. */
static int row_nacks(const struct harness_relay *r, size_t i)
{
	char id[64], want[80];
	const char *needles[3] = { "could not publish, will retry", want, "nacked by broker" };

	row_id(id, sizeof(id), i);
	snprintf(want, sizeof(want), "id=%s ", id);
	return log_lines_with(r, needles, 3);
}

struct nacking {
	struct fixture *fx;
	struct harness_relay *relay;
};

static bool running(struct harness_relay *r)
{
	return harness_relay_wait(r, 0) == -1;
}

/* Every row was nacked more often than relay.max_attempts — or something already went wrong
 * (a row charged, published or dead, or the relay gone): the caller's assertions say which. */
static bool nacked_enough_or_broken(void *arg)
{
	const struct nacking *k = arg;
	bool enough = true;

	if (!running(k->relay))
		return true;
	if (harness_pg_int(k->fx->pg,
	                   "SELECT count(*) FROM %s WHERE attempts > 0 OR published_at IS NOT NULL",
	                   k->fx->table) > 0)
		return true;
	for (size_t i = 0; i < ROWS && enough; i++)
		enough = row_nacks(k->relay, i) > MAX_ATTEMPTS;
	return enough;
}

struct delivered {
	struct fixture *fx;
	const size_t *copies; /* deliveries of each row before the rejecting queue went */
};

/* Every row is marked published and was delivered once more since the rejecting queue went. */
static bool all_published_and_delivered(void *arg)
{
	const struct delivered *d = arg;
	char id[64];

	if (harness_pg_int(d->fx->pg, "SELECT count(*) FROM %s WHERE published_at IS NULL",
	                   d->fx->table) > 0)
		return false;
	for (size_t i = 0; i < ROWS; i++) {
		row_id(id, sizeof(id), i);
		if (consumer_count(d->fx->cons, id) <= d->copies[i])
			return false;
	}
	return true;
}

Test(relay_nacks, nacked_rows_are_never_charged_and_go_out_once_the_broker_takes_them,
     .timeout = 600)
{
	struct fixture fx;
	struct harness_relay *relay;
	amqp_connection_state_t admin;
	char rejecting[96], listen[64], e_listen[96], e_attempts[64], id[64], *m;
	const char *attempt0[3] = { "could not publish, will retry", " attempt=0 ",
		                    "nacked by broker" };
	const char *charged[2] = { "could not publish, will retry", " attempt=1 " };
	size_t copies[ROWS], total_copies = 0, dups = 0;
	struct nacking k;
	struct delivered d;
	double nacked;
	int n;

	fixture_setup(&fx, "relay_nacks", NULL);
	admin = amqp_admin_open();
	snprintf(rejecting, sizeof(rejecting), "%s_reject", fx.table);
	declare_rejecting_queue(admin, rejecting, fx.exchange);

	snprintf(listen, sizeof(listen), "127.0.0.1:%d", probe_free_port());
	snprintf(e_listen, sizeof(e_listen), "OUTBOX_HTTP_LISTEN=%s", listen);
	snprintf(e_attempts, sizeof(e_attempts), "OUTBOX_RELAY_MAX_ATTEMPTS=%d", MAX_ATTEMPTS);
	harness_insert_rows(fx.pg, fx.table, ROWS, fx.exchange, "nacks.a", ID_PREFIX, two_keys,
	                    NULL);
	/* Short row backoff so that rows come round again quickly; debug, because with the whole
	 * batch nacked the per-row lines are logged at debug. */
	relay = fixture_relay_start(
	        &fx, (const char *const[]){
	                     e_listen, e_attempts, "OUTBOX_RELAY_RETRY_BACKOFF_MIN=100ms",
	                     "OUTBOX_RELAY_RETRY_BACKOFF_MAX=200ms",
	                     "OUTBOX_RELAY_POLL_INTERVAL=200ms", "OUTBOX_LOG_LEVEL=debug", NULL });

	/* Each row nacked more often than max_attempts: a relay that charged nacks would have
	 * made every row dead by now. */
	k.fx = &fx;
	k.relay = relay;
	harness_wait_until(nacked_enough_or_broken, &k, STATE_TIMEOUT_MS);
	cr_assert(running(relay), "the relay exited while the broker nacked");

	/* The table: unpublished, no attempt charged, the nack as last error, nothing dead. */
	cr_assert_eq(harness_pg_int(fx.pg, "SELECT count(*) FROM %s", fx.table), ROWS);
	cr_assert_eq(harness_pg_int(fx.pg, "SELECT count(*) FROM %s WHERE published_at IS NOT NULL",
	                            fx.table),
	             0, "a row was marked published although every publish was nacked");
	cr_assert_eq(harness_pg_int(fx.pg, "SELECT count(*) FROM %s WHERE attempts <> 0", fx.table),
	             0, "nacks were charged as attempts: %" PRId64 " rows at attempts %" PRId64,
	             harness_pg_int(fx.pg, "SELECT count(*) FROM %s WHERE attempts <> 0", fx.table),
	             harness_pg_int(fx.pg, "SELECT coalesce(max(attempts), 0) FROM %s", fx.table));
	cr_assert_eq(harness_pg_int(fx.pg,
	                            "SELECT count(*) FROM %s WHERE last_error IS NULL"
	                            " OR last_error NOT LIKE '%%nacked%%'",
	                            fx.table),
	             0, "a nacked row's last_error does not say it was nacked");
	cr_assert_eq(harness_pg_int(fx.pg, "SELECT count(*) FROM %s WHERE attempts >= %d", fx.table,
	                            MAX_ATTEMPTS),
	             0, "a nacked row went dead");

	/* The log says every row was nacked more often than max_attempts, each time at attempt
	 * 0 and with most of the batch refused; the metrics count the nacks as nacks and nothing
	 * as dead. */
	for (size_t i = 0; i < ROWS; i++) {
		n = row_nacks(relay, i);
		if (n <= MAX_ATTEMPTS)
			fixture_dump_logs(&fx);
		row_id(id, sizeof(id), i);
		cr_assert_gt(n, MAX_ATTEMPTS,
		             "row %s was nacked %d times, never more than max_attempts %d", id, n,
		             MAX_ATTEMPTS);
	}
	m = scrape(listen);
	nacked = probe_metric(m, "outbox_relay_failed_total{reason=\"nacked\"}");
	cr_assert_geq(nacked, ROWS * (MAX_ATTEMPTS + 1), "nacks not counted:\n%s", m);
	cr_assert_eq(probe_metric(m, "outbox_relay_failed_total{reason=\"unroutable\"}"), 0, "%s",
	             m);
	cr_assert_eq(probe_metric(m, "outbox_relay_dead_total"), 0, "%s", m);
	free(m);
	cr_assert(fixture_logged(&fx, "broker refused most of the batch, backing off"),
	          "the log does not say the broker refused the batch");
	cr_assert_geq(log_lines_with(relay, attempt0, 3), ROWS * (MAX_ATTEMPTS + 1),
	              "the log's nack lines do not say attempt=0");
	cr_assert_eq(log_lines_with(relay, charged, 2), 0, "the log says a row was charged");
	cr_assert_not(fixture_logged(&fx, "message is dead"), "the log says a row went dead");

	/* The consumer's queue took a copy of publishes the broker nacked as a whole: whatever
	 * it holds now proves nothing. Each row must arrive once more after the broker takes it. */
	for (size_t i = 0; i < ROWS; i++) {
		row_id(id, sizeof(id), i);
		copies[i] = consumer_count(fx.cons, id);
		total_copies += copies[i];
	}
	amqp_queue_delete(admin, 1, amqp_cstring_bytes(rejecting), 0, 0);
	amqp_admin_check(admin, "queue.delete");

	d.fx = &fx;
	d.copies = copies;
	if (!harness_wait_until(all_published_and_delivered, &d, DELIVERY_TIMEOUT_MS))
		fixture_dump_logs(&fx);
	cr_assert_eq(harness_pg_int(fx.pg, "SELECT count(*) FROM %s WHERE published_at IS NULL",
	                            fx.table),
	             0, "rows stayed unpublished after the broker took publishes again");
	for (size_t i = 0; i < ROWS; i++) {
		size_t got;

		row_id(id, sizeof(id), i);
		got = consumer_count(fx.cons, id);
		cr_assert_gt(got, copies[i], "%s was never delivered once the broker took it", id);
		dups += got - 1;
	}
	cr_assert_eq(harness_pg_int(fx.pg, "SELECT count(*) FROM %s WHERE attempts <> 0", fx.table),
	             0, "a row was charged an attempt on its way out");
	cr_assert(running(relay), "the relay must ride out the nacks");
	fprintf(stderr,
	        "relay_nacks: rows=%d nacked=%.0f copies_while_nacked=%zu received=%zu "
	        "duplicates=%zu\n",
	        ROWS, nacked, total_copies, consumer_received(fx.cons), dups);

	amqp_admin_close(admin);
	fixture_teardown(&fx);
}
