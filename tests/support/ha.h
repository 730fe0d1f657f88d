/* ha.h — helpers for the high-availability tests (tests/ha): the environment that
 * tests/ha/services.sh writes, failovers of the PostgreSQL primary/standby pair, stopping and
 * starting the three RabbitMQ nodes, quorum queues, a publisher with confirms that records
 * what became of every message, producers that keep committing outbox rows through a
 * failover, and which broker node a relay uses. Like harness.h, a helper that cannot do its
 * job fails the current criterion test; nodes are numbered from 1, as in the env file. Not
 * thread-safe unless said otherwise. */
#ifndef OUTBOX_TESTS_HA_H
#define OUTBOX_TESTS_HA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <amqp.h>
#include <libpq-fe.h>

struct harness_relay; /* tests/support/harness.h */

#define HA_PG_NODES  2
#define HA_RMQ_NODES 3

/* A set of RabbitMQ nodes for ha_rmq_wait_cluster(): HA_NODE(1) | HA_NODE(3). */
#define HA_NODE(n)   (1u << ((n)-1))
#define HA_ALL_NODES (HA_NODE(1) | HA_NODE(2) | HA_NODE(3))

/* Generous bounds that only stop a hang: the suite runs under ASan on two shared cores. */
#define HA_TIMEOUT_MS 120000

/* ---- environment (borrowed strings; fail the test when the variable is missing) ---- */
/* RELAY_TEST_HA_PG: both nodes with target_session_attrs=read-write (also RELAY_TEST_PG). */
const char *ha_pg_conninfo(void);
const char *ha_pg_node_conninfo(int node); /* RELAY_TEST_HA_PG1, RELAY_TEST_HA_PG2 */
int ha_pg_node_port(int node);
const char *ha_amqp_url(int node); /* RELAY_TEST_HA_AMQP1..3 */
const char *ha_amqp_urls(void);    /* RELAY_TEST_HA_AMQP_ALL: the three, comma-separated */

/* Brings back whatever a test left down: every RabbitMQ node (and waits for the cluster),
 * a PostgreSQL primary and its synchronous standby. For a test's .fini, so that a failed test
 * does not leave the next one a broken set. Never fails the test; logs what went wrong. */
void ha_restore(void);

/* ---- PostgreSQL ---- */
/* The node that accepts writes (asks both); fails the test when none or both do. */
int ha_pg_primary(void);
/* Same without failing: 0 when no node accepts writes (mid-failover), -1 when both do. */
int ha_pg_primary_try(void);
/* SIGKILL to the node's postmaster and every backend at once; returns at once when they are
 * gone. ha_pg_kill_primary() kills the current primary and returns its number. */
void ha_pg_kill(int node);
int ha_pg_kill_primary(void);
/* Promotes the running standby (after setting its synchronous_standby_names to '', since no
 * standby is left to wait for) and returns once it commits; returns its number. */
int ha_pg_promote(void);
/* Rebuilds node (stopped or killed, not the primary) as a fresh copy of the primary, starts
 * it as a standby and makes it the primary's synchronous standby again. */
void ha_pg_rejoin(int node);
/* Synchronous replication on the primary: on = commits wait for the standby's flush; off =
 * they do not. ha_pg_promote() turns it off, ha_pg_rejoin() on. */
void ha_pg_set_sync(bool on);
/* New connection through ha_pg_conninfo() (lands on the primary) or to one node; the caller
 * PQfinish()es it. _connect fails the test; _retry returns NULL after timeout_ms. */
PGconn *ha_pg_connect(void);
PGconn *ha_pg_connect_retry(int64_t timeout_ms);
PGconn *ha_pg_connect_node(int node);
/* Which node c is connected to (by its port), 0 when neither. */
int ha_pg_conn_node(const PGconn *c);

/* ---- RabbitMQ nodes ---- */
void ha_rmq_stop(int node);  /* rabbitmqctl shutdown: closes its connections, VM exits */
void ha_rmq_kill(int node);  /* SIGKILL to the Erlang VM: its sockets just drop */
void ha_rmq_start(int node); /* starts it and waits until it booted (it rejoins by itself) */
/* Waits until every node of the set runs and sees the others as running members. */
void ha_rmq_wait_cluster(unsigned nodes);

/* ---- AMQP ---- */
/* Connection to node with channel 1 open (heartbeat 30 s, as the relay's default); the
 * caller closes it with ha_amqp_close(). Fails the test when it cannot connect. */
amqp_connection_state_t ha_amqp_connect(int node);
/* Same without failing: NULL with the reason in err (the library's error, or the broker's
 * connection.close) when node does not take the connection. */
amqp_connection_state_t ha_amqp_try_connect(int node, char *err, size_t errlen);
/* Closes politely when it can and destroys c; accepts NULL and dead connections. */
void ha_amqp_close(amqp_connection_state_t c);
/* Declares a durable topic exchange and a durable quorum queue (x-queue-type=quorum, one
 * member per node) bound to it with binding_key, through node. */
void ha_declare_quorum_queue(int node, const char *exchange, const char *queue,
                             const char *binding_key);
/* Deletes queue and exchange through the first node that answers; never fails the test
 * (cleanup after a failure must go on). */
void ha_delete_queue(const char *exchange, const char *queue);
/* Members of the quorum queue whose Raft server runs, as rabbitmqctl sees them from the first
 * running node; -1 when that could not be asked. */
int ha_quorum_online(const char *queue);
/* The node (1-3) whose member of the quorum queue is its leader, 0 when there is none or it
 * could not be asked. */
int ha_quorum_leader(const char *queue);
/* Waits until ha_quorum_online(queue) >= n, and fails the test after timeout_ms. A restarted
 * node's member must be back before another node is stopped, or the queue loses its
 * majority earlier than the test means it to. */
void ha_wait_quorum_online(const char *queue, int n, int64_t timeout_ms);

/* One message taken from a queue by ha_queue_drain(). */
typedef void (*ha_msg_fn)(const char *body, size_t len, void *arg);
/* basic.get with ack through node until the queue is empty; calls fn (may be NULL) for each
 * message and returns how many there were. */
size_t ha_queue_drain(int node, const char *queue, ha_msg_fn fn, void *arg);

/* ---- a publisher with confirms ---- */
enum ha_confirm {
	HA_PENDING, /* published, no answer yet */
	HA_ACKED,   /* basic.ack */
	HA_NACKED,  /* basic.nack */
};

/* What one publisher saw, beyond acks and nacks. */
struct ha_publisher_events {
	size_t returned;         /* basic.return (mandatory, unroutable) */
	bool blocked;            /* connection.blocked seen and not yet connection.unblocked */
	size_t blocked_count;    /* connection.blocked frames seen */
	bool closed;             /* the connection is gone (closed by the broker or dropped) */
	int close_code;          /* connection.close / channel.close reply code, 0 = dropped */
	char close_text[256];    /* "connection.close 320 CONNECTION_FORCED - ...", ... */
	int64_t closed_at_ms;    /* harness_now_ms() when closed became true */
	int64_t last_confirm_ms; /* harness_now_ms() of the last ack or nack, 0 = none */
};

struct ha_publisher;

/* Connects to node, opens channel 1 and puts it in confirm mode. Free with
 * ha_publisher_close(). Fails the test when it cannot. */
struct ha_publisher *ha_publisher_open(int node);
/* Publishes body as a persistent, mandatory message and returns its delivery tag (1, 2, ...),
 * or 0 when the connection is already closed or the write failed (then events say why). It
 * only writes: answers are read by ha_publisher_wait(). A broker that stops reading (flow
 * control) makes this block once the socket buffers are full, so tests publish few messages
 * while a queue is unavailable. */
uint64_t ha_publish(struct ha_publisher *p, const char *exchange, const char *routing_key,
                    const char *body);
/* Reads what the broker sends until every publish so far is answered, the connection is gone
 * or timeout_ms passed; returns how many are still pending. */
size_t ha_publisher_wait(struct ha_publisher *p, int64_t timeout_ms);
/* Reads what has arrived without waiting, and sends a heartbeat when one is due: call it for
 * every open publisher at least every 15 s (heartbeat 30 s), or the broker closes it. */
void ha_publisher_service(struct ha_publisher *p);
/* Reads what the broker sends, answered or not, until the connection is gone or timeout_ms
 * passed; returns whether it is gone (see the events for how). */
bool ha_publisher_wait_closed(struct ha_publisher *p, int64_t timeout_ms);
enum ha_confirm ha_publisher_state(const struct ha_publisher *p, uint64_t tag);
size_t ha_publisher_count(const struct ha_publisher *p, enum ha_confirm state);
uint64_t ha_publisher_published(const struct ha_publisher *p); /* last tag handed out */
const struct ha_publisher_events *ha_publisher_events(const struct ha_publisher *p);
/* Closes the connection (quietly when dead) and frees p; accepts NULL. */
void ha_publisher_close(struct ha_publisher *p);

/* ---- producers through a failover ---- */

/* What ha_producer_start() runs. Strings are copied. */
struct ha_producer_options {
	const char *conninfo;    /* NULL = ha_pg_conninfo() (both nodes, read-write) */
	const char *table;       /* an outbox table */
	const char *exchange;    /* every row's exchange_name */
	const char *routing_key; /* NULL = "ha.row" */
	const char *prefix;      /* ids "<prefix><thread>-<n, 7 digits>", 1-15 characters */
	int threads;             /* producers, each a thread with a connection of its own */
	/* 0: unkeyed rows. Else each transaction picks one of `keys` ordering keys
	 * "<prefix>k<NN>" at random (the threads share them) and takes that key's advisory
	 * transaction lock before its INSERT, so that within a key, seq order is commit order
	 * (as for an application that updates the key's aggregate in the same transaction). */
	int keys;
	int64_t pause_ms; /* after each commit; one row a transaction */
	size_t max_rows;  /* per thread; 0 = 100,000 */
};

/* One row a producer saw committed. */
struct ha_commit {
	int key;           /* ordering key number, -1 for an unkeyed row */
	int64_t begin_ms;  /* harness_now_ms() when the attempt that committed began */
	int64_t commit_ms; /* when its COMMIT returned */
	/* The INSERT found the id there: an earlier attempt had committed without the producer
	 * seeing it (its COMMIT's answer was lost with the server). */
	bool earlier;
};

/* Threads that commit one outbox row a transaction through a failover. A transaction that
 * fails in any way (the server killed under it, a standby refusing writes, no server at all)
 * is retried with the same id (INSERT ... ON CONFLICT DO NOTHING) on a new connection until
 * it commits: only commits the producer saw succeed are recorded, and every recorded id is
 * in the table. Thread-safe between the producer threads and the test thread; free with
 * ha_producer_free(). Fails the test when it cannot start. */
struct ha_producer;
struct ha_producer *ha_producer_start(const struct ha_producer_options *opt);
/* Rows seen committed so far, over every thread. */
size_t ha_producer_committed(struct ha_producer *p);
/* Transactions that failed and were retried so far. */
size_t ha_producer_retries(struct ha_producer *p);
/* Stops the threads once their transaction under way has ended (recorded when it committed;
 * a failed one is not retried) and returns the rows committed. The queries below keep working
 * afterwards. */
size_t ha_producer_stop(struct ha_producer *p);
/* The record of id when the producer saw it committed, else NULL. Borrowed until
 * ha_producer_free(). */
const struct ha_commit *ha_producer_find(struct ha_producer *p, const char *id);
/* Calls fn for every row seen committed so far (in no particular order across threads). */
typedef void (*ha_commit_fn)(const char *id, const struct ha_commit *c, void *arg);
void ha_producer_each(struct ha_producer *p, ha_commit_fn fn, void *arg);
void ha_producer_free(struct ha_producer *p); /* stops it first; accepts NULL */

/* ---- what a consumer saw of the producers' rows ---- */
struct consumer; /* bench/drive/consumer.h */

/* Rows the producers saw committed that c never received: logs the first ten ids (tagged
 * with what; what NULL logs nothing) and returns how many. */
size_t ha_count_lost(struct consumer *c, struct ha_producer *const *ps, size_t n, const char *what);
/* Waits until c has received every row the producers saw committed, up to timeout_ms; then
 * returns ha_count_lost(c, ps, n, what). */
size_t ha_wait_delivered(struct consumer *c, struct ha_producer *const *ps, size_t n,
                         int64_t timeout_ms, const char *what);
/* harness_now_ms() of the first delivery at c of a row the producers committed in an attempt
 * that began at or after since_ms (rows an earlier attempt had committed unseen excluded);
 * -1 when none has arrived. */
int64_t ha_first_fresh_delivery(struct consumer *c, struct ha_producer *const *ps, size_t n,
                                int64_t since_ms);
/* The latest first arrival at c (harness_now_ms()) among the rows the producers saw
 * committed before before_ms: when the last of them had come; -1 when one has not come yet,
 * 0 when there are none. */
int64_t ha_last_arrival(struct consumer *c, struct ha_producer *const *ps, size_t n,
                        int64_t before_ms);
/* harness_now_ms() of the first delivery at c at or after from_ms, any row; -1 when none. */
int64_t ha_first_delivery_after(struct consumer *c, int64_t from_ms);
/* The longest pause between consecutive deliveries at c that ends in [from_ms, to_ms], in ms;
 * *end_ms (may be NULL) gets the time of the delivery that ended it. 0 when there is none. */
int64_t ha_longest_pause(struct consumer *c, int64_t from_ms, int64_t to_ms, int64_t *end_ms);
/* Per ordering key, the first deliveries at c of the table's keyed rows must come in the
 * table's seq order, every row once at least (duplicates, which may follow a failover, are
 * allowed after the first). A row whose first delivery was a redelivery (it went to a
 * connection of c that dropped before reading it; RabbitMQ requeues such messages in the order
 * they came back) is left out of the order and counted on stderr. Fails the test at the first
 * difference; returns the number of keyed rows. */
size_t ha_check_key_order(PGconn *pg, const char *table, struct consumer *c, const char *what);

/* ---- the relay as its log tells ---- */

/* The RabbitMQ node (1-3) of the relay's latest "connected" or "reconnected to=broker" log
 * line (its server=host:port), 0 when there is none yet. */
int ha_relay_broker_node(const struct harness_relay *r);
/* Waits until the relay logs a broker connection to a node other than other_than (0: any) and
 * returns that node; fails the test after timeout_ms. */
int ha_wait_relay_broker_node(const struct harness_relay *r, int other_than, int64_t timeout_ms);

#endif
