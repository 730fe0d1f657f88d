/* The HA infrastructure itself, with plain libpq and rabbitmq-c (no relay): a PostgreSQL
 * failover through a multi-host read-write conninfo, and a quorum queue that loses one node,
 * then its majority, then a node to SIGKILL. What the servers did is written here; the
 * relay's HA behaviour is designed from it, so the tests assert it and print the figures
 * (`ha pg:` and `ha rabbitmq:` lines on stderr).
 *
 * PostgreSQL 15, a primary and a synchronous standby (synchronous_commit = on):
 * - SIGKILL to the primary's process group: a session on it fails its next statement with
 *   "FATAL: terminating connection due to unexpected postmaster exit" and/or "server closed
 *   the connection unexpectedly" (the sockets close; a crashed machine would leave them
 *   hanging instead). Until the promotion, the read-write conninfo over both nodes fails:
 *   "Connection refused" for the dead node, "session is read-only" for the standby;
 *   target_session_attrs=read-write never lands on a standby, whichever node is listed
 *   first.
 * - pg_ctl promote takes 0.2-0.5 s. Every commit acknowledged before the kill is on the new
 *   primary, and new connections through the same conninfo land there.
 * - Rebuilding the old primary with pg_basebackup as the new synchronous standby takes 1-5 s.
 * - With its synchronous standby gone, a commit on the primary hangs (pg_stat_activity:
 *   wait_event SyncRep; the row is not yet visible to other sessions) for as long as no
 *   standby returns and synchronous_standby_names names one; emptying it releases the commit
 *   at once. So a promotion empties it while no standby exists, and a rejoin sets it again:
 *   the tests want writes to go on after a failover (like Patroni's synchronous_mode without
 *   _strict), and a relay whose database loses its synchronous standby sees commits hang,
 *   not fail.
 *
 * RabbitMQ 3.10.8, three nodes, a quorum queue with a member on each, default settings:
 * - `rabbitmqctl shutdown` of a node: its clients get connection.close 320
 *   CONNECTION_FORCED "broker forced connection closure with reason 'shutdown'" within the
 *   2-4 s the stop takes; connecting to it afterwards fails at once (connection refused).
 *   SIGKILL of a node: its clients see the socket drop (rabbitmq-c: "a socket error
 *   occurred") within 0.1-0.2 s.
 * - One node down, even the leader's: publishing through the others is acked at once after a
 *   graceful stop, and within 0.2-0.5 s of a SIGKILL of the leader's node (a new election).
 * - Two nodes down, no majority. What a publisher with confirms sees depends on its channel:
 *   - A channel that published to the queue before: nothing at all. No ack, no nack, no
 *     channel.close, no connection.blocked (rabbitmqctl lists the connection as "running"
 *     with 40 publishes pending), for as long as the outage lasts (120 s observed; 3.10.8
 *     has no timeout for it). Once a majority is back, every pending publish is acked within
 *     2 s of the returning node's start, and enqueued exactly once, in order.
 *   - A channel whose first publish to the queue comes during the outage: it first registers
 *     as an enqueuer, synchronously, with a timeout of net_ticktime + 5 s = 65 s. If the
 *     surviving member is the leader, the registration times out after 65 s and that message
 *     is nacked (and not enqueued); the channel handles nothing else meanwhile, and the next
 *     publish starts another 65 s wait, until the majority returns, when the waiting
 *     publishes are acked. If the leader was on a stopped node, every publish is nacked at
 *     once (within 0.3 s).
 *   - Publishes still unconfirmed when their channel closes (a publisher that gives up and
 *     reconnects): enqueued all the same once the majority returns when the surviving member
 *     was the leader (it had appended them to its log), lost when the leader was on a stopped
 *     node. After giving up on a confirm, republishing may duplicate; not republishing may
 *     lose.
 * - A nacked message was never enqueued; every acked message was delivered, none twice.
 * - A publisher's connection that nothing services is closed by the broker after two
 *   heartbeats ("missed heartbeats from client"), pending publishes or not: a waiting
 *   publisher must keep calling into rabbitmq-c.
 * Times on a shared, loaded two-core machine: PostgreSQL pair 1.4-7.4 s to start, RabbitMQ
 * cluster 14-28 s (node 1, then nodes 2 and 3 side by side), a node restart 5-16.5 s, a
 * graceful node stop 2-4.5 s, a promotion 0.2-0.5 s, a rejoin 0.7-5.4 s; this file 2.5-3 min
 * (a minute of it the 65 s wait above). */
#include <criterion/criterion.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/ha.h"
#include "tests/support/harness.h"

#define BEFORE_ROWS 20

/* ---- PostgreSQL ---- */

/* Which node a connection through conninfo lands on; 0 when it fails (message in err). */
static int lands_on(const char *conninfo, char *err, size_t errlen)
{
	PGconn *c = PQconnectdb(conninfo);
	int node = 0;

	if (PQstatus(c) == CONNECTION_OK)
		node = ha_pg_conn_node(c);
	else
		snprintf(err, errlen, "%s", PQerrorMessage(c));
	PQfinish(c);
	return node;
}

/* Whether c's query is still running after ms (input consumed meanwhile). */
static bool still_busy(PGconn *c, int64_t ms)
{
	int64_t deadline = harness_now_ms() + ms;

	do {
		cr_assert_eq(PQconsumeInput(c), 1, "connection lost: %s", PQerrorMessage(c));
		if (!PQisBusy(c))
			return false;
		harness_sleep_ms(20);
	} while (harness_now_ms() < deadline);
	return true;
}

Test(ha_pg, failover_to_standby, .init = ha_restore, .timeout = 600)
{
	char table[64], err[1024], standby_first[256];
	PGconn *w, *c, *s;
	int old, primary, rc, node;
	int64_t t0;
	PGresult *res;

	harness_unique_name(table, sizeof(table), "ha_pg");
	old = ha_pg_primary();
	w = ha_pg_connect();
	cr_assert_eq(ha_pg_conn_node(w), old, "the read-write conninfo landed on node %d, not %d",
	             ha_pg_conn_node(w), old);
	harness_pg_exec(w, "CREATE TABLE %s (id int PRIMARY KEY, note text NOT NULL)", table);
	/* Each INSERT is its own commit, acknowledged only once the standby flushed it. */
	for (int i = 1; i <= BEFORE_ROWS; i++)
		harness_pg_exec(w, "INSERT INTO %s VALUES (%d, 'before')", table, i);

	t0 = harness_now_ms();
	ha_pg_kill(old);
	fprintf(stderr, "ha pg: killed primary %d in %lld ms\n", old,
	        (long long)(harness_now_ms() - t0));
	rc = harness_pg_try_exec(w, err, sizeof(err), "INSERT INTO %s VALUES (0, 'lost')", table);
	cr_assert_neq(rc, 0, "a statement on the killed primary's session succeeded");
	fprintf(stderr, "ha pg: the session on the killed primary: %s", err);
	PQfinish(w);
	node = lands_on(ha_pg_conninfo(), err, sizeof(err));
	cr_assert_eq(node, 0, "before the promotion, the read-write conninfo landed on node %d",
	             node);
	fprintf(stderr, "ha pg: read-write conninfo before the promotion: %s", err);

	t0 = harness_now_ms();
	primary = ha_pg_promote();
	fprintf(stderr, "ha pg: promoted node %d in %lld ms\n", primary,
	        (long long)(harness_now_ms() - t0));
	cr_assert_neq(primary, old);
	c = ha_pg_connect();
	cr_assert_eq(ha_pg_conn_node(c), primary, "the read-write conninfo landed on node %d",
	             ha_pg_conn_node(c));
	cr_assert_eq(harness_pg_int(c, "SELECT count(*) FROM %s WHERE note = 'before'", table),
	             BEFORE_ROWS, "commits acknowledged before the kill are missing");
	harness_pg_exec(c, "INSERT INTO %s VALUES (%d, 'after')", table, BEFORE_ROWS + 1);

	t0 = harness_now_ms();
	ha_pg_rejoin(old);
	fprintf(stderr, "ha pg: node %d rebuilt as the synchronous standby in %lld ms\n", old,
	        (long long)(harness_now_ms() - t0));
	s = ha_pg_connect_node(old);
	cr_assert_eq(harness_pg_int(s, "SELECT pg_is_in_recovery()::int"), 1,
	             "the old primary did not come back as a standby");
	cr_assert_eq(harness_pg_int(c,
	                            "SELECT count(*) FROM pg_stat_replication WHERE "
	                            "sync_state = 'sync' AND application_name = 'node%d'",
	                            old),
	             1, "node %d is not the synchronous standby", old);
	harness_pg_exec(c, "INSERT INTO %s VALUES (%d, 'replicated')", table, BEFORE_ROWS + 2);
	/* remote_flush, not remote_apply: the standby shows the row once it replayed it. */
	HARNESS_WAIT(harness_pg_int(s, "SELECT count(*) FROM %s", table) == BEFORE_ROWS + 2, 30000);
	cr_assert_eq(harness_pg_int(s, "SELECT count(*) FROM %s", table), BEFORE_ROWS + 2,
	             "the standby does not have the primary's rows");
	PQfinish(s);

	/* Whichever node is listed first, read-write lands on the primary, never the standby. */
	snprintf(standby_first, sizeof(standby_first),
	         "host=127.0.0.1,127.0.0.1 port=%d,%d user=postgres dbname=postgres "
	         "target_session_attrs=read-write connect_timeout=5",
	         ha_pg_node_port(old), ha_pg_node_port(primary));
	for (int i = 0; i < 5; i++) {
		node = lands_on(standby_first, err, sizeof(err));
		cr_assert_eq(node, primary, "read-write landed on node %d (%s)", node, err);
		node = lands_on(ha_pg_conninfo(), err, sizeof(err));
		cr_assert_eq(node, primary, "read-write landed on node %d (%s)", node, err);
	}

	/* Synchronous replication without its standby: the commit is held, however long. */
	ha_pg_kill(old);
	snprintf(err, sizeof(err), "INSERT INTO %s VALUES (%d, 'held')", table, BEFORE_ROWS + 3);
	cr_assert_eq(PQsendQuery(c, err), 1, "could not send the INSERT: %s", PQerrorMessage(c));
	t0 = harness_now_ms();
	cr_assert(still_busy(c, 3000), "a commit returned while its synchronous standby was down");
	ha_pg_set_sync(false);
	cr_assert(!still_busy(c, 30000), "emptying synchronous_standby_names did not release the "
	                                 "commit");
	res = PQgetResult(c);
	cr_assert_eq(PQresultStatus(res), PGRES_COMMAND_OK, "the held commit failed: %s",
	             PQresultErrorMessage(res));
	PQclear(res);
	while ((res = PQgetResult(c)) != NULL)
		PQclear(res);
	fprintf(stderr,
	        "ha pg: a commit without its synchronous standby was held %lld ms, until "
	        "synchronous_standby_names was emptied\n",
	        (long long)(harness_now_ms() - t0));
	ha_pg_rejoin(old);
	harness_pg_exec(c, "DROP TABLE %s", table);
	PQfinish(c);
}

/* ---- RabbitMQ ---- */

#define MAX_BODIES 512

/* Every body drained from the queue, with how often it came. */
struct seen {
	char body[MAX_BODIES][32];
	int count[MAX_BODIES];
	size_t n;
};

static void seen_add(const char *body, size_t len, void *arg)
{
	struct seen *s = arg;
	char b[32];

	snprintf(b, sizeof(b), "%.*s", (int)(len < 31 ? len : 31), body);
	for (size_t i = 0; i < s->n; i++) {
		if (strcmp(s->body[i], b) == 0) {
			s->count[i]++;
			return;
		}
	}
	cr_assert(s->n < MAX_BODIES, "more distinct messages than expected");
	snprintf(s->body[s->n], sizeof(s->body[s->n]), "%s", b);
	s->count[s->n++] = 1;
}

static int seen_count(const struct seen *s, const char *body)
{
	for (size_t i = 0; i < s->n; i++) {
		if (strcmp(s->body[i], body) == 0)
			return s->count[i];
	}
	return 0;
}

/* Messages with bodies "<prefix>-<i>" for i in [0, n) found in s, duplicates included. */
static int seen_prefix(const struct seen *s, const char *prefix, int n)
{
	char b[32];
	int total = 0;

	for (int i = 0; i < n; i++) {
		snprintf(b, sizeof(b), "%s-%d", prefix, i);
		total += seen_count(s, b);
	}
	return total;
}

/* Publishes "<prefix>-<i>" for i in [0, n); returns the first delivery tag. */
static uint64_t publish(struct ha_publisher *p, const char *exchange, const char *prefix, int n)
{
	uint64_t first = 0;
	char body[32];

	for (int i = 0; i < n; i++) {
		uint64_t tag;

		snprintf(body, sizeof(body), "%s-%d", prefix, i);
		tag = ha_publish(p, exchange, "ha.test", body);
		cr_assert_neq(tag, 0, "publishing '%s' failed: %s", body,
		              ha_publisher_events(p)->close_text);
		if (first == 0)
			first = tag;
	}
	return first;
}

/* Services every open publisher of ps for ms; the broker closes a connection nothing reads
 * for two heartbeats, even while its publishes are pending. */
static void serve(struct ha_publisher *const *ps, size_t n, int64_t ms)
{
	int64_t deadline = harness_now_ms() + ms;

	do {
		for (size_t i = 0; i < n; i++) {
			if (ps[i] != NULL)
				(void)ha_publisher_wait_closed(ps[i], 100);
		}
	} while (harness_now_ms() < deadline);
}

/* Services ps until target has nothing pending or timeout_ms passed; returns the time it
 * took in ms, or -1 on timeout. */
static int64_t serve_until_answered(struct ha_publisher *const *ps, size_t n,
                                    struct ha_publisher *target, int64_t timeout_ms)
{
	int64_t t0 = harness_now_ms();

	while (ha_publisher_count(target, HA_PENDING) > 0 && !ha_publisher_events(target)->closed) {
		if (harness_now_ms() - t0 > timeout_ms)
			return -1;
		serve(ps, n, 200);
	}
	return harness_now_ms() - t0;
}

static void expect_all_acked(struct ha_publisher *p, const char *what)
{
	const struct ha_publisher_events *ev = ha_publisher_events(p);

	ha_publisher_wait(p, 60000);
	cr_assert_eq(ha_publisher_count(p, HA_ACKED), ha_publisher_published(p),
	             "%s: %zu of %llu acked, %zu nacked, %zu pending (%s)", what,
	             ha_publisher_count(p, HA_ACKED), (unsigned long long)ha_publisher_published(p),
	             ha_publisher_count(p, HA_NACKED), ha_publisher_count(p, HA_PENDING),
	             ev->closed ? ev->close_text : "open");
}

/* A publisher on node that has published to the queue once, so its channel is a registered
 * enqueuer of the quorum queue (see the notes at the top). */
static struct ha_publisher *registered(int node, const char *exchange, const char *prefix)
{
	struct ha_publisher *p = ha_publisher_open(node);

	publish(p, exchange, prefix, 1);
	expect_all_acked(p, prefix);
	return p;
}

/* The queue's leader once it is known and not on node gone (0: any), as the leader recorded
 * for the queue may lag an election. */
static int wait_leader(const char *queue, int gone)
{
	int leader = 0;

	HARNESS_WAIT((leader = ha_quorum_leader(queue)) != 0 && leader != gone, HA_TIMEOUT_MS);
	cr_assert(leader != 0 && leader != gone, "quorum queue '%s' has no leader (%d)", queue,
	          leader);
	return leader;
}

/* The running node of {a, b} other than x. */
static int other_of(int a, int b, int x)
{
	return a == x ? b : a;
}

Test(ha_rabbitmq, quorum_queue_majority, .init = ha_restore, .timeout = 900)
{
	char ex[64], q[64], err[256];
	struct ha_publisher *p[HA_RMQ_NODES + 1] = { 0 };
	struct ha_publisher *reg1, *orphan1, *fresh1, *reg2, *orphan2, *fresh2;
	struct ha_publisher *all[8];
	const struct ha_publisher_events *ev;
	struct seen *seen = calloc(1, sizeof(*seen));
	int a, b, s, f, l3;
	int64_t t0, took;
	amqp_connection_state_t c;

	cr_assert_not_null(seen);
	harness_unique_name(ex, sizeof(ex), "ha_ex");
	harness_unique_name(q, sizeof(q), "ha_qq");
	ha_declare_quorum_queue(1, ex, q, "ha.#");
	ha_wait_quorum_online(q, 3, HA_TIMEOUT_MS);

	/* All three nodes: publishing through each is confirmed. */
	for (int n = 1; n <= HA_RMQ_NODES; n++) {
		char prefix[24];

		snprintf(prefix, sizeof(prefix), "pre%d", n);
		p[n] = ha_publisher_open(n);
		publish(p[n], ex, prefix, 3);
		expect_all_acked(p[n], "all nodes up");
	}

	/* One node down, the leader's: its clients are told, the others go on. */
	a = wait_leader(q, 0);
	t0 = harness_now_ms();
	ha_rmq_stop(a);
	fprintf(stderr, "ha rabbitmq: stopped node %d (the leader's) in %lld ms\n", a,
	        (long long)(harness_now_ms() - t0));
	ha_publisher_wait_closed(p[a], 10000);
	ev = ha_publisher_events(p[a]);
	cr_assert(ev->closed, "a client of the stopped node %d was not told", a);
	cr_assert_eq(ev->close_code, 320, "a client of the stopped node saw: %s", ev->close_text);
	fprintf(stderr, "ha rabbitmq: a client of the stopped node saw: %s\n", ev->close_text);
	c = ha_amqp_try_connect(a, err, sizeof(err));
	cr_assert_null(c, "connected to the stopped node %d", a);
	fprintf(stderr, "ha rabbitmq: connecting to the stopped node: %s\n", err);
	ha_publisher_close(p[a]);
	p[a] = NULL;
	for (int n = 1; n <= HA_RMQ_NODES; n++) {
		char prefix[24];

		if (n == a)
			continue;
		snprintf(prefix, sizeof(prefix), "down1-%d", n);
		t0 = harness_now_ms();
		publish(p[n], ex, prefix, 3);
		expect_all_acked(p[n], "one node down");
		fprintf(stderr, "ha rabbitmq: one node down, acked through node %d in %lld ms\n", n,
		        (long long)(harness_now_ms() - t0));
	}

	/* Outage 1: the second node down is not the leader's, so the survivor s holds the
	 * leader. Publishers: reg1 registered before, orphan1 registered and closed while its
	 * publishes are pending, fresh1 publishing for the first time. */
	s = wait_leader(q, a);
	b = 6 - a - s;
	reg1 = registered(s, ex, "reg1pre");
	orphan1 = registered(s, ex, "orphan1pre");
	t0 = harness_now_ms();
	ha_rmq_stop(b);
	fprintf(stderr, "ha rabbitmq: stopped node %d in %lld ms; node %d alone\n", b,
	        (long long)(harness_now_ms() - t0), s);
	ha_publisher_wait_closed(p[b], 10000);
	ha_publisher_close(p[b]);
	p[b] = NULL;
	fresh1 = ha_publisher_open(s);
	t0 = harness_now_ms();
	publish(reg1, ex, "reg1", 10);
	publish(orphan1, ex, "orphan1", 5);
	publish(fresh1, ex, "fresh1", 3);
	all[0] = reg1;
	all[1] = orphan1;
	all[2] = fresh1;
	all[3] = p[s];
	serve(all, 4, 10000);
	cr_assert_eq(ha_publisher_count(reg1, HA_PENDING), 10,
	             "without a majority, 10 publishes "
	             "came to %zu acked, %zu nacked",
	             ha_publisher_count(reg1, HA_ACKED), ha_publisher_count(reg1, HA_NACKED));
	cr_assert_eq(ha_publisher_count(orphan1, HA_PENDING), 5);
	cr_assert(!ha_publisher_events(reg1)->closed && !ha_publisher_events(reg1)->blocked,
	          "the publisher was closed or blocked: %s", ha_publisher_events(reg1)->close_text);
	ha_publisher_close(orphan1);
	all[1] = NULL;
	/* fresh1's first publish is answered when its enqueuer registration times out. */
	while (ha_publisher_state(fresh1, 1) == HA_PENDING &&
	       !ha_publisher_events(fresh1)->closed && harness_now_ms() - t0 < 180000)
		serve(all, 4, 200);
	cr_assert_eq(ha_publisher_state(fresh1, 1), HA_NACKED,
	             "the first publish of a new channel without a majority came to %d (%s)",
	             ha_publisher_state(fresh1, 1), ha_publisher_events(fresh1)->close_text);
	fprintf(stderr,
	        "ha rabbitmq: no majority, leader on the survivor: a new channel's first publish "
	        "was nacked after %lld ms\n",
	        (long long)(ha_publisher_events(fresh1)->last_confirm_ms - t0));
	cr_assert_eq(ha_publisher_count(reg1, HA_PENDING), 10,
	             "a registered channel's publishes were answered without a majority");
	fprintf(stderr,
	        "ha rabbitmq: no majority: a registered channel had 10 publishes unanswered "
	        "after %lld ms, connection open, not blocked\n",
	        (long long)(harness_now_ms() - t0));
	t0 = harness_now_ms();
	ha_rmq_start(b);
	fprintf(stderr, "ha rabbitmq: restarted node %d in %lld ms\n", b,
	        (long long)(harness_now_ms() - t0));
	took = serve_until_answered(all, 4, reg1, HA_TIMEOUT_MS);
	expect_all_acked(reg1, "majority back");
	fprintf(stderr,
	        "ha rabbitmq: majority back: the pending publishes were acked %lld ms after the "
	        "node's start returned\n",
	        (long long)took);
	serve_until_answered(all, 4, fresh1, HA_TIMEOUT_MS);
	cr_assert_eq(ha_publisher_count(fresh1, HA_ACKED), 2,
	             "the new channel's later publishes: %zu acked, %zu nacked",
	             ha_publisher_count(fresh1, HA_ACKED), ha_publisher_count(fresh1, HA_NACKED));

	/* Outage 2: node a still down, and now the leader's node l3 stops: the survivor f is a
	 * follower with no leader. */
	l3 = wait_leader(q, a);
	f = other_of(s, b, l3);
	reg2 = registered(f, ex, "reg2pre");
	orphan2 = registered(f, ex, "orphan2pre");
	ha_rmq_stop(l3);
	fprintf(stderr, "ha rabbitmq: stopped node %d (the leader's); node %d alone\n", l3, f);
	fresh2 = ha_publisher_open(f);
	all[0] = reg2;
	all[1] = orphan2;
	all[2] = fresh2;
	all[3] = p[f];
	all[4] = reg1; /* closed with node l3 when s was l3 */
	all[5] = fresh1;
	t0 = harness_now_ms();
	publish(reg2, ex, "reg2", 10);
	publish(orphan2, ex, "orphan2", 5);
	publish(fresh2, ex, "fresh2", 3);
	took = serve_until_answered(all, 6, fresh2, HA_TIMEOUT_MS);
	cr_assert_eq(ha_publisher_count(fresh2, HA_NACKED), 3,
	             "no majority, no leader: a new channel's publishes came to %zu nacked, %zu "
	             "acked, %zu pending",
	             ha_publisher_count(fresh2, HA_NACKED), ha_publisher_count(fresh2, HA_ACKED),
	             ha_publisher_count(fresh2, HA_PENDING));
	fprintf(stderr,
	        "ha rabbitmq: no majority, leader down: a new channel's 3 publishes were nacked "
	        "within %lld ms\n",
	        (long long)took);
	serve(all, 6, 10000);
	cr_assert_eq(ha_publisher_count(reg2, HA_PENDING), 10,
	             "no leader: a registered channel's publishes were answered");
	cr_assert(!ha_publisher_events(reg2)->closed);
	ha_publisher_close(orphan2);
	all[1] = NULL;
	t0 = harness_now_ms();
	ha_rmq_start(a);
	fprintf(stderr, "ha rabbitmq: restarted node %d (down since the first stop) in %lld ms\n",
	        a, (long long)(harness_now_ms() - t0));
	took = serve_until_answered(all, 6, reg2, HA_TIMEOUT_MS);
	expect_all_acked(reg2, "majority back after the leader's node stopped");
	fprintf(stderr, "ha rabbitmq: majority back: acked %lld ms after the start returned\n",
	        (long long)took);
	ha_rmq_start(l3);
	ha_rmq_wait_cluster(HA_ALL_NODES);
	ha_wait_quorum_online(q, 3, HA_TIMEOUT_MS);

	/* All back: publishing through each node is confirmed again. */
	for (int n = 1; n <= HA_RMQ_NODES; n++) {
		struct ha_publisher *post = ha_publisher_open(n);
		char prefix[24];

		snprintf(prefix, sizeof(prefix), "post%d", n);
		publish(post, ex, prefix, 3);
		expect_all_acked(post, "all nodes back");
		ha_publisher_close(post);
	}

	/* What the queue holds: every acked message once, no nacked one; the orphans as the
	 * notes at the top say. */
	ha_queue_drain(1, q, seen_add, seen);
	for (size_t i = 0; i < seen->n; i++)
		cr_assert_eq(seen->count[i], 1, "'%s' was delivered %d times", seen->body[i],
		             seen->count[i]);
	for (int n = 1; n <= HA_RMQ_NODES; n++) {
		char prefix[24];

		snprintf(prefix, sizeof(prefix), "pre%d", n);
		cr_assert_eq(seen_prefix(seen, prefix, 3), 3, "%s: acked messages lost", prefix);
		snprintf(prefix, sizeof(prefix), "post%d", n);
		cr_assert_eq(seen_prefix(seen, prefix, 3), 3, "%s: acked messages lost", prefix);
		if (n == a)
			continue;
		snprintf(prefix, sizeof(prefix), "down1-%d", n);
		cr_assert_eq(seen_prefix(seen, prefix, 3), 3, "%s: acked messages lost", prefix);
	}
	cr_assert_eq(seen_prefix(seen, "reg1", 10), 10, "outage 1: acked messages lost");
	cr_assert_eq(seen_prefix(seen, "reg2", 10), 10, "outage 2: acked messages lost");
	cr_assert_eq(seen_count(seen, "fresh1-0"), 0, "a nacked message was enqueued");
	cr_assert_eq(seen_prefix(seen, "fresh1", 3), 2, "outage 1: acked messages lost");
	cr_assert_eq(seen_prefix(seen, "fresh2", 3), 0, "nacked messages were enqueued");
	fprintf(stderr,
	        "ha rabbitmq: unconfirmed publishes of a channel closed during the outage, then "
	        "enqueued: %d of 5 (leader on the survivor), %d of 5 (leader down)\n",
	        seen_prefix(seen, "orphan1", 5), seen_prefix(seen, "orphan2", 5));
	cr_expect_eq(seen_prefix(seen, "orphan1", 5), 5,
	             "unconfirmed publishes held by the surviving leader were not enqueued");
	cr_expect_eq(seen_prefix(seen, "orphan2", 5), 0,
	             "unconfirmed publishes sent to a stopped leader were enqueued");

	for (int n = 1; n <= HA_RMQ_NODES; n++)
		ha_publisher_close(p[n]);
	ha_publisher_close(reg1);
	ha_publisher_close(fresh1);
	ha_publisher_close(reg2);
	ha_publisher_close(fresh2);
	ha_delete_queue(ex, q);
	free(seen);
}

Test(ha_rabbitmq, node_killed, .init = ha_restore, .timeout = 600)
{
	char ex[64], q[64], err[256];
	struct ha_publisher *p[HA_RMQ_NODES + 1] = { 0 };
	const struct ha_publisher_events *ev;
	struct seen *seen = calloc(1, sizeof(*seen));
	amqp_connection_state_t c;
	int leader;
	int64_t t0;

	cr_assert_not_null(seen);
	harness_unique_name(ex, sizeof(ex), "ha_ex");
	harness_unique_name(q, sizeof(q), "ha_qq");
	ha_declare_quorum_queue(1, ex, q, "ha.#");
	ha_wait_quorum_online(q, 3, HA_TIMEOUT_MS);
	for (int n = 1; n <= HA_RMQ_NODES; n++)
		p[n] = registered(n, ex, n == 1 ? "a" : n == 2 ? "b" : "c");

	leader = wait_leader(q, 0);
	t0 = harness_now_ms();
	ha_rmq_kill(leader);
	ha_publisher_wait_closed(p[leader], 10000);
	ev = ha_publisher_events(p[leader]);
	cr_assert(ev->closed, "a client of the killed node %d noticed nothing", leader);
	cr_assert_eq(ev->close_code, 0, "a client of the killed node got a close: %s",
	             ev->close_text);
	fprintf(stderr, "ha rabbitmq: a client of the killed node saw after %lld ms: %s\n",
	        (long long)(ev->closed_at_ms - t0), ev->close_text);
	c = ha_amqp_try_connect(leader, err, sizeof(err));
	cr_assert_null(c, "connected to the killed node %d", leader);
	for (int n = 1; n <= HA_RMQ_NODES; n++) {
		if (n == leader)
			continue;
		publish(p[n], ex, n == 1 ? "killed1" : n == 2 ? "killed2" : "killed3", 3);
		expect_all_acked(p[n], "leader's node killed");
		fprintf(stderr,
		        "ha rabbitmq: leader's node killed; acked through node %d %lld ms "
		        "after the kill\n",
		        n, (long long)(harness_now_ms() - t0));
	}
	ha_publisher_close(p[leader]);
	t0 = harness_now_ms();
	ha_rmq_start(leader);
	fprintf(stderr, "ha rabbitmq: restarted the killed node %d in %lld ms\n", leader,
	        (long long)(harness_now_ms() - t0));
	ha_wait_quorum_online(q, 3, HA_TIMEOUT_MS);
	p[leader] = ha_publisher_open(leader);
	publish(p[leader], ex, "back", 3);
	expect_all_acked(p[leader], "killed node back");

	ha_queue_drain(leader, q, seen_add, seen);
	for (size_t i = 0; i < seen->n; i++)
		cr_assert_eq(seen->count[i], 1, "'%s' was delivered %d times", seen->body[i],
		             seen->count[i]);
	cr_assert_eq(seen->n, 3 + 6 + 3, "the queue holds %zu messages, not 12", seen->n);
	for (int n = 1; n <= HA_RMQ_NODES; n++)
		ha_publisher_close(p[n]);
	ha_delete_queue(ex, q);
	free(seen);
}
