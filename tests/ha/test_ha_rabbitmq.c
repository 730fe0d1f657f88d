/* The relay against a three-node RabbitMQ cluster and a quorum queue, given every node's URL:
 * the node it uses is stopped under load, later the queue loses its majority (once with the
 * relay's node stopped, once with it the sole survivor), and a relay starts while the first
 * node of its list is down. Every row a producer saw committed must arrive, none may be
 * charged an attempt or go dead because of the broker, the relay never exits, and publishing
 * resumes within a bound once the majority is back. Prints `ha rabbitmq node stop:`,
 * `ha rabbitmq majority lost (...):` and `ha rabbitmq first node down at start:` lines.
 *
 * What the cluster does meanwhile is written at the top of test_ha_infra.c: without a
 * majority, a channel that published to the queue before gets no answer at all, and a new
 * channel's first publish is nacked (leader down) or waits 65 s for its registration (leader
 * on the survivor). The relay runs with a 5 s confirm timeout so that a 20 s outage shows what
 * it does with unanswered publishes: release them without an attempt and publish them again
 * (duplicates), and back off after a nacked batch. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/drive/consumer.h"
#include "tests/support/fault.h"
#include "tests/support/fixture.h"
#include "tests/support/ha.h"
#include "tests/support/harness.h"

#define PRODUCERS_PER_KIND 2
#define PAUSE_MS           20
/* Keyed rows spread over 32 ordering keys, about three a second per key. */
#define KEYS         32
#define LOAD_MS      3000
#define OUTAGE_MS    20000
#define MAX_ATTEMPTS 10
/* Bounds, generous for a loaded two-core machine; what they are made of:
 * - a node stop: its clients get connection.close 320; the relay reconnects to the next node
 *   after about 250 ms and publishes again: the longest pause in deliveries under a steady
 *   load, bounded by a few reconnects (250 ms, 500 ms, 1 s, ...) and 15 s of slack.
 * - the majority back: the relay may be waiting for confirms (5 s) or in its reconnect backoff
 *   (at most 15 s) when the returning node's member catches up: 20 s + 10 s of slack,
 *   counted from the moment the node's start command returned. */
#define NODE_STOP_BOUND_MS 20000
#define RESUME_BOUND_MS    30000

static const char confirm_timeout_line[] = "msg=\"broker did not confirm the batch";
static const char nack_backoff_line[] = "msg=\"broker refused most of the batch, backing off\"";
static const char nacked_row_line[] = "error=\"nacked by broker\"";
static const char lost_broker_line[] = "msg=\"lost connection, will reconnect\" to=broker";

/* Every piece of one test, torn down by rig_teardown(). */
struct rig {
	struct fixture f;
	struct ha_producer *ps[2];
	char amqp_env[1024];
};

/* The table, the exchange and a quorum queue bound to it with "#" (declared by the consumer,
 * which follows the cluster from node to node), with a member on every node. */
static void rig_setup(struct rig *g, const char *prefix)
{
	static const struct fixture_options no_consumer = { .no_consumer = true };
	struct consumer_options copt = { .queue_type = "quorum", .url_list = true };
	char err[512];

	memset(g, 0, sizeof(*g));
	fixture_setup(&g->f, prefix, &no_consumer);
	if (consumer_open_with(&g->f.cons, ha_amqp_urls(), g->f.queue, g->f.exchange, "topic", "#",
	                       &copt, err, sizeof(err)) != 0)
		cr_assert_fail("%s", err);
	ha_wait_quorum_online(g->f.queue, 3, HA_TIMEOUT_MS);
	snprintf(g->amqp_env, sizeof(g->amqp_env), "OUTBOX_AMQP_URL=%s", ha_amqp_urls());
}

/* A relay given every node's URL; a confirm timeout below the outage (see the top). */
static struct harness_relay *start_relay(struct rig *g)
{
	const char *env[] = {
		g->amqp_env,
		"OUTBOX_AMQP_CONFIRM_TIMEOUT=5s",
		"OUTBOX_RELAY_LEASE=20s",
		NULL,
	};

	return fixture_relay_start(&g->f, env);
}

static void start_producers(struct rig *g)
{
	struct ha_producer_options o = {
		.table = g->f.table,
		.exchange = g->f.exchange,
		.threads = PRODUCERS_PER_KIND,
		.pause_ms = PAUSE_MS,
	};

	o.prefix = "u";
	o.routing_key = "ha.unkeyed";
	g->ps[0] = ha_producer_start(&o);
	o.prefix = "k";
	o.routing_key = "ha.keyed";
	o.keys = KEYS;
	g->ps[1] = ha_producer_start(&o);
}

/* What a test checks at its end, after the producers stopped. */
struct outcome {
	size_t committed, lost, duplicates, received, keyed;
	int64_t attempts, dead, unpublished;
};

static void finish_rows(struct rig *g, const char *what, struct outcome *o)
{
	o->committed = ha_producer_stop(g->ps[0]) + ha_producer_stop(g->ps[1]);
	o->lost = ha_wait_delivered(g->f.cons, g->ps, 2, HA_TIMEOUT_MS, what);
	if (o->lost != 0)
		fixture_dump_logs(&g->f);
	fault_expect_settled(&g->f, MAX_ATTEMPTS, HA_TIMEOUT_MS);
	/* Late duplicates (publishes a lost channel left behind) arrive within a moment. */
	harness_sleep_ms(2000);
	o->received = consumer_received(g->f.cons);
	o->duplicates = consumer_duplicates(g->f.cons);
	o->keyed = ha_check_key_order(g->f.pg, g->f.table, g->f.cons, what);
	o->attempts =
	        harness_pg_int(g->f.pg, "SELECT count(*) FROM %s WHERE attempts > 0", g->f.table);
	o->dead = harness_pg_int(g->f.pg, "SELECT count(*) FROM %s WHERE %s AND attempts >= %d",
	                         g->f.table, harness_unpublished(g->f.table), MAX_ATTEMPTS);
	o->unpublished = harness_unpublished_count(g->f.pg, g->f.table);
}

static void expect_rows(const struct outcome *o, const char *what)
{
	cr_assert_eq(o->lost, 0, "%s: %zu committed rows never arrived", what, o->lost);
	cr_assert_eq(o->attempts, 0, "%s: %lld rows were charged an attempt by a broker outage",
	             what, (long long)o->attempts);
	cr_assert_eq(o->dead, 0, "%s: %lld rows went dead", what, (long long)o->dead);
	cr_assert_eq(o->unpublished, 0, "%s: %lld rows are still unpublished", what,
	             (long long)o->unpublished);
	cr_assert_geq(o->received, o->committed);
}

static void expect_alive(struct rig *g)
{
	for (size_t i = 0; i < g->f.n_relays; i++) {
		struct harness_relay *r = g->f.relays[i];

		if (r != NULL && harness_relay_wait(r, 0) != -1)
			harness_relay_dump_log(r);
		cr_assert(r == NULL || harness_relay_wait(r, 0) == -1, "relay %zu exited", i);
	}
}

static void rig_teardown(struct rig *g)
{
	ha_producer_free(g->ps[0]);
	ha_producer_free(g->ps[1]);
	fixture_teardown(&g->f);
}

/* Waits until a row committed at or after since_ms arrives; returns when, failing the test
 * after the bound (plus the time a stop or start command itself takes). */
static int64_t wait_fresh(struct rig *g, int64_t since_ms, const char *what)
{
	int64_t at = -1;

	HARNESS_WAIT((at = ha_first_fresh_delivery(g->f.cons, g->ps, 2, since_ms)) >= 0,
	             HA_TIMEOUT_MS);
	if (at < 0)
		fixture_dump_logs(&g->f);
	cr_assert_geq(at, 0, "%s: no row committed afterwards arrived within %d ms", what,
	              HA_TIMEOUT_MS);
	return at;
}

/* What one majority outage looked like. */
struct outage {
	int64_t stop_ms;  /* the stop command */
	int64_t start_ms; /* the start command that brought the majority back */
	/* From the start command's return to the first delivery after it began (0 when
	 * deliveries resumed while it ran), and to the first delivery of a row committed after
	 * it returned. */
	int64_t resume_ms, fresh_ms;
	int64_t online; /* ha_quorum_online() during the outage: 0 (not listed, no leader) or 1 */
	size_t dups_before;
	/* The relay's log lines during the outage. */
	int confirm_timeouts, nack_backoffs, nacked_rows, lost_connections;
};

/* Stops node `stop`, which leaves the queue one member of three, waits OUTAGE_MS, starts it
 * again and waits until deliveries resume. */
/* rabbitmqctl lists a quorum queue without a leader not at all (0), one whose leader
 * survived with one member online: either way, not two. */
static void expect_minority(const struct outage *o)
{
	cr_assert(o->online == 0 || o->online == 1,
	          "during the outage the queue had %lld members online (-1: nobody answered)",
	          (long long)o->online);
}

static void majority_outage(struct rig *g, int stop, struct outage *o)
{
	int64_t t0, t_lost, t_back0, t_back, first;
	int ct = fixture_log_count(&g->f, confirm_timeout_line);
	int nb = fixture_log_count(&g->f, nack_backoff_line);
	int nr = fixture_log_count(&g->f, nacked_row_line);
	int lc = fixture_log_count(&g->f, lost_broker_line);

	o->dups_before = consumer_duplicates(g->f.cons);
	t0 = harness_now_ms();
	ha_rmq_stop(stop);
	t_lost = harness_now_ms();
	o->stop_ms = t_lost - t0;
	o->online = ha_quorum_online(g->f.queue);
	harness_sleep_ms(OUTAGE_MS);
	expect_alive(g);
	t_back0 = harness_now_ms();
	ha_rmq_start(stop);
	t_back = harness_now_ms();
	o->start_ms = t_back - t_back0;
	HARNESS_WAIT((first = ha_first_delivery_after(g->f.cons, t_back0)) >= 0, HA_TIMEOUT_MS);
	if (first < 0)
		fixture_dump_logs(&g->f);
	cr_assert_geq(first, 0, "nothing was delivered after the majority came back");
	o->resume_ms = first > t_back ? first - t_back : 0;
	o->fresh_ms = wait_fresh(g, t_back, "majority back") - t_back;
	o->confirm_timeouts = fixture_log_count(&g->f, confirm_timeout_line) - ct;
	o->nack_backoffs = fixture_log_count(&g->f, nack_backoff_line) - nb;
	o->nacked_rows = fixture_log_count(&g->f, nacked_row_line) - nr;
	o->lost_connections = fixture_log_count(&g->f, lost_broker_line) - lc;
}

Test(ha_rabbitmq, node_stop_then_majority_lost, .init = ha_restore, .timeout = 900)
{
	struct rig g;
	struct harness_relay *r;
	struct outage out;
	struct outcome o;
	int a, b, c, leader;
	int64_t t0, t_stopped, fresh, pause, pause_end;
	size_t dups_stop;

	rig_setup(&g, "ha_rmq1");
	r = start_relay(&g);
	a = ha_wait_relay_broker_node(r, 0, 60000);
	start_producers(&g);
	harness_sleep_ms(LOAD_MS);
	fixture_expect_unique(&g.f, g.f.cons, 200, HA_TIMEOUT_MS);

	/* The relay's node stops: the relay moves to another one. */
	leader = ha_quorum_leader(g.f.queue);
	t0 = harness_now_ms();
	ha_rmq_stop(a);
	t_stopped = harness_now_ms();
	b = ha_wait_relay_broker_node(r, a, HA_TIMEOUT_MS);
	fresh = wait_fresh(&g, t_stopped, "node stop");
	/* Under a steady load, the longest pause between deliveries is the failover's. */
	pause = ha_longest_pause(g.f.cons, t0, fresh, &pause_end);
	harness_sleep_ms(LOAD_MS);
	dups_stop = consumer_duplicates(g.f.cons);
	fprintf(stderr,
	        "ha rabbitmq node stop: node=%d to=%d leader=%d stop_ms=%lld pause_ms=%lld "
	        "paused_after_ms=%lld fresh_ms=%lld duplicates=%zu\n",
	        a, b, leader, (long long)(t_stopped - t0), (long long)pause,
	        (long long)(pause_end - pause - t0), (long long)(fresh - t_stopped), dups_stop);
	cr_assert_leq(pause, NODE_STOP_BOUND_MS,
	              "deliveries paused for %lld ms when the relay's node stopped (bound %d ms)",
	              (long long)pause, NODE_STOP_BOUND_MS);

	/* Then the node it moved to: the queue keeps one member of three, on the node the relay
	 * must move to now. */
	c = 6 - a - b;
	leader = ha_quorum_leader(g.f.queue);
	majority_outage(&g, b, &out);
	harness_sleep_ms(LOAD_MS);
	ha_rmq_start(a);
	ha_rmq_wait_cluster(HA_ALL_NODES);
	ha_wait_quorum_online(g.f.queue, 3, HA_TIMEOUT_MS);
	harness_sleep_ms(LOAD_MS);
	expect_alive(&g);
	finish_rows(&g, "ha rabbitmq majority lost", &o);
	fprintf(stderr,
	        "ha rabbitmq majority lost (relay's node stopped): stopped=%d,%d survivor=%d "
	        "leader=%d online=%lld outage_ms=%d start_ms=%lld resume_ms=%lld fresh_ms=%lld "
	        "confirm_timeouts=%d nack_backoffs=%d nacked_rows=%d committed=%zu "
	        "delivered=%zu lost=%zu duplicates=%zu attempts=%lld dead=%lld\n",
	        a, b, c, leader, (long long)out.online, OUTAGE_MS, (long long)out.start_ms,
	        (long long)out.resume_ms, (long long)out.fresh_ms, out.confirm_timeouts,
	        out.nack_backoffs, out.nacked_rows, o.committed, consumer_unique(g.f.cons), o.lost,
	        o.duplicates - out.dups_before, (long long)o.attempts, (long long)o.dead);
	expect_minority(&out);
	expect_rows(&o, "node stop then majority lost");
	cr_assert_leq(out.resume_ms, RESUME_BOUND_MS,
	              "publishing resumed %lld ms after the majority came back (bound %d ms)",
	              (long long)out.resume_ms, RESUME_BOUND_MS);
	expect_alive(&g);
	rig_teardown(&g);
}

Test(ha_rabbitmq, first_node_down_then_majority_lost, .init = ha_restore, .timeout = 900)
{
	struct rig g;
	struct harness_relay *r[3];
	struct outage out;
	struct outcome o;
	int64_t t0, connect_ms[3];
	int node[3], other, leader;

	/* The queue gets its three members before node 1 (the first URL of every list) stops. */
	rig_setup(&g, "ha_rmq2");
	ha_rmq_stop(1);

	/* Three relays start from a random node each: every one connects through node 2 or 3. */
	t0 = harness_now_ms();
	for (int i = 0; i < 3; i++)
		r[i] = start_relay(&g);
	for (int i = 0; i < 3; i++) {
		node[i] = ha_wait_relay_broker_node(r[i], 1, 60000);
		connect_ms[i] = harness_now_ms() - t0;
	}
	fprintf(stderr,
	        "ha rabbitmq first node down at start: nodes=%d,%d,%d connect_ms=%lld,%lld,%lld\n",
	        node[0], node[1], node[2], (long long)connect_ms[0], (long long)connect_ms[1],
	        (long long)connect_ms[2]);
	/* One relay stays for the rest. */
	harness_relay_finish(g.f.relays[1], "relay 1");
	g.f.relays[1] = NULL;
	harness_relay_finish(g.f.relays[2], "relay 2");
	g.f.relays[2] = NULL;

	start_producers(&g);
	harness_sleep_ms(LOAD_MS);
	fixture_expect_unique(&g.f, g.f.cons, 200, HA_TIMEOUT_MS);

	/* The other running node stops: the relay's node is the queue's only member left. */
	other = 5 - node[0];
	leader = ha_quorum_leader(g.f.queue);
	majority_outage(&g, other, &out);
	harness_sleep_ms(LOAD_MS);
	ha_rmq_start(1);
	ha_rmq_wait_cluster(HA_ALL_NODES);
	ha_wait_quorum_online(g.f.queue, 3, HA_TIMEOUT_MS);
	harness_sleep_ms(LOAD_MS);
	expect_alive(&g);
	finish_rows(&g, "ha rabbitmq majority lost", &o);
	fprintf(stderr,
	        "ha rabbitmq majority lost (relay's node kept): stopped=1,%d survivor=%d "
	        "leader=%d online=%lld outage_ms=%d start_ms=%lld resume_ms=%lld fresh_ms=%lld "
	        "confirm_timeouts=%d nack_backoffs=%d nacked_rows=%d lost_connections=%d "
	        "committed=%zu delivered=%zu lost=%zu duplicates=%zu attempts=%lld dead=%lld\n",
	        other, node[0], leader, (long long)out.online, OUTAGE_MS, (long long)out.start_ms,
	        (long long)out.resume_ms, (long long)out.fresh_ms, out.confirm_timeouts,
	        out.nack_backoffs, out.nacked_rows, out.lost_connections, o.committed,
	        consumer_unique(g.f.cons), o.lost, o.duplicates - out.dups_before,
	        (long long)o.attempts, (long long)o.dead);
	expect_minority(&out);
	expect_rows(&o, "first node down then majority lost");
	cr_assert_leq(out.resume_ms, RESUME_BOUND_MS,
	              "publishing resumed %lld ms after the majority came back (bound %d ms)",
	              (long long)out.resume_ms, RESUME_BOUND_MS);
	expect_alive(&g);
	rig_teardown(&g);
}
