/* ha.h — helpers for the high-availability tests (tests/ha): the environment that
 * tests/ha/services.sh writes, failovers of the PostgreSQL primary/standby pair, stopping and
 * starting the three RabbitMQ nodes, quorum queues, and a publisher with confirms that records
 * what became of every message. Like harness.h, a helper that cannot do its job fails the
 * current criterion test; nodes are numbered from 1, as in the env file. Not thread-safe. */
#ifndef OUTBOX_TESTS_HA_H
#define OUTBOX_TESTS_HA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <amqp.h>
#include <libpq-fe.h>

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

#endif
