/* fixture.h — what the integration tests stand on: a table of their own (migrated), a topic
 * exchange, a durable queue bound to it with a consumer, a PostgreSQL connection, the relays the
 * test starts and store handles on the table; fixture_teardown() undoes all of it. Names come
 * from harness_unique_name(), so tests can run in parallel. The tests of the broker module,
 * which need no table, take their broker handles and URLs from here too. Like harness.h, every
 * helper fails the current criterion test when it cannot do its job. */
#ifndef OUTBOX_TESTS_FIXTURE_H
#define OUTBOX_TESTS_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <libpq-fe.h>

#include "tests/support/consumer_assert.h"
#include "tests/support/harness.h"
#include "amqp/broker.h"
#include "store/store.h"

#define FIXTURE_MAX_RELAYS 16
#define FIXTURE_MAX_STORES 8

/* What fixture_setup() leaves out or does differently; NULL or all zero = everything, with
 * the consumer bound to "#". */
struct fixture_options {
	const char *binding; /* the consumer's binding key on the exchange; NULL = "#" */
	bool no_migrate;     /* the table is left to the test (it creates or upgrades it) */
	bool no_consumer;    /* no queue and no consumer: cons stays NULL */
	bool inbox;          /* the table is a consumer's inbox: inbox_migrate() on pg, not
	                        `outbox-relay migrate` (no_migrate still leaves it out) */
};

struct fixture {
	char table[48];    /* "<prefix>_<pid>_<n>_<random>" */
	char exchange[64]; /* "<table>_ex", a durable topic exchange the consumer declares */
	char queue[64];    /* "<table>_q", the consumer's durable queue */
	PGconn *pg;        /* the test's own connection */
	struct consumer *cons;
	/* Every relay fixture_relay_start() started, in order, killed ones included (their logs
	 * are still searched). A test may stop one or replace one with a relay of its own;
	 * teardown finishes whatever is there. */
	struct harness_relay *relays[FIXTURE_MAX_RELAYS];
	size_t n_relays;
	/* The options of the stores fixture_store_open() opened: a store borrows them for its
	 * lifetime, so they live here until teardown. */
	struct store_options store_opts[FIXTURE_MAX_STORES];
	size_t n_stores;
	char drop_later[1024]; /* fixture_drop_later()'s statements, run at teardown */
};

/* Fills *fx: unique names from prefix, a connection, `outbox-relay migrate` for the table and
 * a consumer on the queue bound to the exchange (both declared), unless opt says otherwise
 * (opt may be NULL; it is not kept). Returns once the queue is bound, so a row published
 * afterwards reaches the consumer. */
void fixture_setup(struct fixture *fx, const char *prefix, const struct fixture_options *opt);
/* Finishes every relay still running (SIGTERM, expecting exit status 0: harness_relay_finish),
 * stops the consumer (deleting its queue and exchange), drops the table and its wake-up function
 * (reconnecting when the server was restarted under the old connection, rolling back a
 * transaction a failed test left open on pg), then runs fixture_drop_later()'s statements, and
 * closes the connection. Does nothing a second time, nor on a fixture that is all zero, so a
 * suite's .fini may call it too: it then cleans up after a test that failed before its own
 * call (criterion reports no failure from a .fini, so the test's own call is what checks the
 * relays' exit). */
void fixture_teardown(struct fixture *fx);

/* SQL (printf-formatted) for what the test made beside its table (a second table, a function),
 * run on pg by fixture_teardown() after the table is dropped. Use IF EXISTS: a test that failed
 * early may not have made them. */
void fixture_drop_later(struct fixture *fx, const char *fmt, ...)
        __attribute__((format(printf, 2, 3)));

/* Starts a relay on fx's table with env (NULL-terminated "OUTBOX_X=y", may be NULL), see
 * harness_relay_start(). Borrowed: fx finishes and frees it. */
struct harness_relay *fixture_relay_start(struct fixture *fx, const char *const *env);

/* Lines containing needle over the logs of every relay in fx. */
int fixture_log_count(struct fixture *fx, const char *needle);
/* Whether some log line of any relay in fx contains needle. */
bool fixture_logged(struct fixture *fx, const char *needle);
/* Waits until fixture_logged(fx, needle); false after timeout_ms. */
bool fixture_wait_logged(struct fixture *fx, const char *needle, int64_t timeout_ms);
/* Dumps every relay's log tail (call before failing). */
void fixture_dump_logs(struct fixture *fx);

/* Waits until c (fx->cons or another consumer of the test) holds n distinct messages; dumps
 * the relays' logs and fails otherwise. */
void fixture_expect_unique(struct fixture *fx, struct consumer *c, size_t n, int64_t timeout_ms);

/* ---- store handles on the fixture's table ---- */
/* Options for a store on fx's table, as the relay opens one (admin false: it checks the table,
 * prepares its statements and LISTENs on the channel, the table's name) or as the operator
 * commands do (admin true); relay_id goes to locked_by. Leases of 60 s, 3 attempts, batches of
 * 100, no shutdown deadline. The strings are borrowed (fx's and relay_id): the test changes
 * fields as it needs before fixture_store_open() or store_new(). */
struct store_options fixture_store_options(const struct fixture *fx, const char *relay_id,
                                           bool admin);
/* store_new() and store_connect() with a copy of *o that fx keeps until teardown; fails the
 * test unless the store connected. New store: the caller store_free()s it (before
 * fixture_teardown(), which does not). At most FIXTURE_MAX_STORES per fixture. */
struct store *fixture_store_open(struct fixture *fx, const struct store_options *o);

/* ---- the test broker (RELAY_TEST_AMQP), without a fixture ---- */
/* RELAY_TEST_AMQP taken apart by amqp_parse_url() (rabbitmq-c's <amqp.h>): the test broker's
 * user, password, host and port. Parsed once; borrowed, valid until the process exits. */
struct amqp_connection_info;
const struct amqp_connection_info *fixture_amqp_info(void);
/* "amqp://user:password@127.0.0.1:port/" into out (n bytes): the test broker's credentials
 * (password in their place when not NULL) at another port, a proxy's or one where nothing
 * listens. */
void fixture_amqp_node_url(char *out, size_t n, int port, const char *password);
/* Options for a broker handle to url (borrowed; a list of nodes, or RELAY_TEST_AMQP): no TLS
 * files, no heartbeats, confirms waited for up to confirm_timeout_ms, no shutdown deadline
 * (wake_fd -1), connection_name (borrowed, may be NULL) shown in the management UI. The test
 * changes fields as it needs before fixture_broker_new(). */
struct broker_options fixture_broker_options(const char *url, int64_t confirm_timeout_ms,
                                             const char *connection_name);
/* broker_new(o), failing the test when it returns NULL. o is borrowed for the handle's
 * lifetime (broker.h); the caller broker_free()s the handle. */
struct broker *fixture_broker_new(const struct broker_options *o);

#endif
