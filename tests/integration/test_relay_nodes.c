/* The relay binary given a broker cluster of two nodes (two TCP proxies in front of the one test
 * broker): /readyz and /metrics name the node in use, and when that node drops every connection
 * and refuses new ones the relay moves to the other, says so in its log and its metrics, and
 * every committed row still reaches the consumer. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/fixture.h"
#include "tests/support/http_probe.h"
#include "tests/support/tcp_proxy.h"

/* Generous deadlines: the suite runs under ASan on two cores beside other test files. Only
 * there to stop a hang. */
#define DELIVERY_TIMEOUT_MS 180000
#define STATE_TIMEOUT_MS    120000
#define ROWS_BEFORE         200
#define ROWS_AFTER          200

struct nodes {
	struct fixture fx;
	struct proxy *p[2];
	char node[2][64]; /* "127.0.0.1:PORT" of each proxy, as the relay names its nodes */
	char listen[64];
	struct harness_relay *relay;
};

static char *scrape(const struct nodes *t)
{
	struct probe_reply r = probe_get(t->listen, "/metrics");

	cr_assert_eq(r.status, 200, "/metrics answered %d", r.status);
	return r.body;
}

static double node_info(const char *metrics, const char *node)
{
	char series[128];

	snprintf(series, sizeof(series), "outbox_relay_broker_node_info{node=\"%s\"}", node);
	return probe_metric(metrics, series);
}

/* Which node /readyz names (0 or 1), -1 when it is not ready or names neither. */
static int readyz_node(const struct nodes *t)
{
	struct probe_reply r = probe_get(t->listen, "/readyz");
	int which = -1;

	for (int i = 0; i < 2 && r.status == 200; i++) {
		char want[96];

		snprintf(want, sizeof(want), "\nbroker %s\n", t->node[i]);
		if (strstr(r.body, want))
			which = which == -1 ? i : -2; /* both named: not what one worker shows */
	}
	free(r.body);
	return which;
}

struct on_node {
	const struct nodes *t;
	int want;
};

/* /readyz and /metrics both name want's node, and only it. */
static bool relay_on_node(void *arg)
{
	const struct on_node *o = arg;
	char *m;
	bool ok;

	if (readyz_node(o->t) != o->want)
		return false;
	m = scrape(o->t);
	ok = node_info(m, o->t->node[o->want]) == 1 && node_info(m, o->t->node[1 - o->want]) == -1;
	free(m);
	return ok;
}

static void wait_on_node(struct nodes *t, int want, const char *when)
{
	struct on_node o = { t, want };
	struct probe_reply r;
	char *m;

	if (harness_wait_until(relay_on_node, &o, STATE_TIMEOUT_MS))
		return;
	r = probe_get(t->listen, "/readyz");
	m = scrape(t);
	fixture_dump_logs(&t->fx);
	cr_assert_fail("%s: the relay never showed node %s\n/readyz %d:\n%s\n/metrics:\n%s", when,
	               t->node[want], r.status, r.body, m);
}

/* Whether one line of the relay's log holds both a and b. */
static bool log_line_has(const struct harness_relay *r, const char *a, const char *b)
{
	char *log = harness_relay_log(r), *line, *next;
	bool found = false;

	for (line = log; line && *line && !found; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		found = strstr(line, a) && strstr(line, b);
	}
	free(log);
	return found;
}

/* Committed ids "<prefix>-<i, 7 digits>" that never arrived; adds the extra deliveries of the
 * ones that did to *dups. */
static size_t count_lost(struct consumer *c, const char *prefix, size_t n, size_t *dups)
{
	size_t lost = 0;
	char id[64];

	for (size_t i = 0; i < n; i++) {
		size_t k;

		snprintf(id, sizeof(id), "%s-%07zu", prefix, i);
		k = consumer_count(c, id);
		if (k == 0) {
			if (lost < 10)
				cr_log_error("%s committed, never received", id);
			lost++;
		} else {
			*dups += k - 1;
		}
	}
	return lost;
}

Test(relay_nodes, a_dropped_node_moves_the_relay_to_the_other, .timeout = 600)
{
	struct nodes t;
	char url[2][256], e_amqp[600], e_listen[96], server[96], *m;
	double failovers;
	size_t dups = 0, lost;
	int used, other;

	memset(&t, 0, sizeof(t));
	fixture_setup(&t.fx, "relay_nodes", NULL);
	for (int i = 0; i < 2; i++) {
		t.p[i] = proxy_start(harness_amqp_port());
		fixture_amqp_node_url(url[i], sizeof(url[i]), proxy_port(t.p[i]), NULL);
		snprintf(t.node[i], sizeof(t.node[i]), "127.0.0.1:%d", proxy_port(t.p[i]));
	}
	snprintf(e_amqp, sizeof(e_amqp), "OUTBOX_AMQP_URL=%s,%s", url[0], url[1]);
	snprintf(t.listen, sizeof(t.listen), "127.0.0.1:%d", probe_free_port());
	snprintf(e_listen, sizeof(e_listen), "OUTBOX_HTTP_LISTEN=%s", t.listen);

	harness_insert_rows(t.fx.pg, t.fx.table, ROWS_BEFORE, t.fx.exchange, "nodes.before",
	                    "before", NULL, NULL);
	/* A short heartbeat makes an idle relay notice a dropped connection soon too. */
	t.relay = fixture_relay_start(
	        &t.fx, (const char *const[]){ e_amqp, e_listen, "OUTBOX_AMQP_HEARTBEAT=2s",
	                                      "OUTBOX_RELAY_POLL_INTERVAL=200ms", NULL });
	fixture_expect_unique(&t.fx, t.fx.cons, ROWS_BEFORE, DELIVERY_TIMEOUT_MS);

	/* The first node is random: whichever it is, both endpoints name it. */
	HARNESS_WAIT(readyz_node(&t) >= 0, STATE_TIMEOUT_MS);
	used = readyz_node(&t);
	if (used < 0)
		fixture_dump_logs(&t.fx);
	cr_assert_geq(used, 0, "/readyz never named one of the two nodes");
	other = 1 - used;
	wait_on_node(&t, used, "rows flowing");
	cr_assert_geq(proxy_live(t.p[used]), 1, "the relay does not use the node it names");
	cr_assert_eq(proxy_live(t.p[other]), 0, "the relay holds a connection to the other node");
	snprintf(server, sizeof(server), "server=%s", t.node[used]);
	cr_assert(log_line_has(t.relay, "to=broker", server),
	          "the log does not name the first node %s", t.node[used]);
	m = scrape(&t);
	failovers = probe_metric(m, "outbox_relay_broker_failovers_total");
	cr_assert_geq(failovers, 0, "no outbox_relay_broker_failovers_total in /metrics:\n%s", m);
	free(m);

	/* The node goes away: every connection cut, new ones refused, so it cannot come back. */
	proxy_refuse(t.p[used], true);
	proxy_drop_all(t.p[used]);
	harness_insert_rows(t.fx.pg, t.fx.table, ROWS_AFTER, t.fx.exchange, "nodes.after", "after",
	                    NULL, NULL);

	wait_on_node(&t, other, "after the node went away");
	cr_assert_geq(proxy_live(t.p[other]), 1, "the relay does not use the node it names");
	m = scrape(&t);
	cr_assert_geq(probe_metric(m, "outbox_relay_broker_failovers_total"), failovers + 1,
	              "the failover was not counted:\n%s", m);
	cr_assert_eq(probe_metric(m, "outbox_relay_broker_up"), 1, "%s", m);
	free(m);
	snprintf(server, sizeof(server), "server=%s", t.node[other]);
	if (!log_line_has(t.relay, "msg=\"reconnected\" to=broker", server))
		fixture_dump_logs(&t.fx);
	cr_assert(log_line_has(t.relay, "msg=\"reconnected\" to=broker", server),
	          "the log does not say the relay reconnected to %s", t.node[other]);

	/* Duplicates allowed: what the broker had not confirmed when the node went is sent
	 * again. */
	fixture_expect_unique(&t.fx, t.fx.cons, ROWS_BEFORE + ROWS_AFTER, DELIVERY_TIMEOUT_MS);
	lost = count_lost(t.fx.cons, "before", ROWS_BEFORE, &dups) +
	       count_lost(t.fx.cons, "after", ROWS_AFTER, &dups);
	fprintf(stderr, "relay_nodes: committed=%d received=%zu lost=%zu duplicates=%zu\n",
	        ROWS_BEFORE + ROWS_AFTER, consumer_received(t.fx.cons), lost, dups);
	cr_assert_eq(lost, 0, "%zu committed rows never arrived", lost);
	cr_assert_not(t.relay->exited, "the relay must ride out the node's loss");

	fixture_teardown(&t.fx);
	proxy_stop(t.p[0]);
	proxy_stop(t.p[1]);
}
