/* fixture.h — what the relay tests stand on: a table of their own (migrated), a topic exchange,
 * a durable queue bound to it with a consumer, a PostgreSQL connection, and the relays the test
 * starts; fixture_teardown() undoes all of it. Names come from harness_unique_name(), so tests
 * can run in parallel. Like harness.h, every helper fails the current criterion test when it
 * cannot do its job. */
#ifndef OUTBOX_TESTS_FIXTURE_H
#define OUTBOX_TESTS_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <libpq-fe.h>

#include "tests/support/consumer_assert.h"
#include "tests/support/harness.h"

#define FIXTURE_MAX_RELAYS 16

/* What fixture_setup() leaves out or does differently; NULL or all zero = everything, with
 * the consumer bound to "#". */
struct fixture_options {
	const char *binding; /* the consumer's binding key on the exchange; NULL = "#" */
	bool no_migrate;     /* the table is left to the test (it creates or upgrades it) */
	bool no_consumer;    /* no queue and no consumer: cons stays NULL */
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
};

/* Fills *fx: unique names from prefix, a connection, `outbox-relay migrate` for the table and
 * a consumer on the queue bound to the exchange (both declared), unless opt says otherwise
 * (opt may be NULL; it is not kept). Returns once the queue is bound, so a row published
 * afterwards reaches the consumer. */
void fixture_setup(struct fixture *fx, const char *prefix, const struct fixture_options *opt);
/* Finishes every relay still running (SIGTERM, expecting exit status 0: harness_relay_finish),
 * stops the consumer (deleting its queue and exchange), drops the table (reconnecting when the
 * server was restarted under the old connection) and closes the connection. */
void fixture_teardown(struct fixture *fx);

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

#endif
