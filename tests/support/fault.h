/* fault.h — shared steps of the fault tests: a table, exchange and consumer of their own,
 * relays started with short leases and backoffs, a producer thread that keeps committing
 * rows while a fault happens, and the lost/duplicate count every fault test prints. Like
 * harness.h, every helper fails the current criterion test when it cannot do its job. */
#ifndef OUTBOX_TESTS_FAULT_H
#define OUTBOX_TESTS_FAULT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <libpq-fe.h>

#include "tests/support/consumer.h"
#include "tests/support/harness.h"

/* Generous: the suite runs under ASan on two cores. */
#define FAULT_DELIVERY_TIMEOUT_MS 180000
#define FAULT_LOG_TIMEOUT_MS      60000
#define FAULT_MAX_RELAYS          16

struct fault {
	char table[48], exchange[64], queue[64];
	PGconn *pg;
	struct consumer *cons;
	/* Every relay started, killed ones included, so their logs can be searched. */
	struct harness_relay *relays[FAULT_MAX_RELAYS];
	size_t n_relays;
};

/* Own table (migrated), topic exchange and a consumer bound to everything it carries. */
void fault_setup(struct fault *f, const char *prefix);
/* Stops the relays still running with SIGTERM (expecting exit 0), the consumer, drops the
 * table. */
void fault_teardown(struct fault *f);

/* Starts a relay on f's table with the fault suite's short settings (lease 3s, confirm
 * timeout 2s, backoff 200ms..1s, poll 200ms), then env (NULL-terminated "OUTBOX_X=y", may be
 * NULL), whose names replace those defaults. Borrowed; f frees it. */
struct harness_relay *fault_relay_start(struct fault *f, const char *const *env);

/* Whether some log line of any relay started so far contains needle. */
bool fault_logged(struct fault *f, const char *needle);
/* Waits until fault_logged(f, needle); false after timeout_ms. */
bool fault_wait_logged(struct fault *f, const char *needle, int64_t timeout_ms);
/* Lines containing needle over all relays' logs. */
int fault_log_count(struct fault *f, const char *needle);
/* Dumps every relay's log tail (call before failing). */
void fault_dump_logs(struct fault *f);

/* Waits until the consumer holds n distinct messages; dumps the logs and fails otherwise. */
void fault_expect_unique(struct fault *f, size_t n, int64_t timeout_ms);
/* Waits until no row of the table is unpublished except `dead` ones (rows with attempts >=
 * max_attempts are dead; pass the relay's max_attempts), failing after timeout_ms. */
void fault_expect_settled(struct fault *f, int max_attempts, int64_t timeout_ms);

/* Ids "<prefix>-<i, 7 digits>" for i in [0, n) as harness_insert_rows and the producer make
 * them: counts those never received, prints
 * `fault <name>: committed=N received=N lost=N duplicates=N` to stderr (received and
 * duplicates over every delivery of the consumer) and returns the duplicates; *lost gets the
 * lost count. */
size_t fault_count(struct fault *f, const char *name, const char *prefix, size_t n, size_t *lost);

/* A thread committing rows "<prefix>-<i, 7 digits>" (i from 0, chunk rows a transaction,
 * pause_ms between transactions, at most max_rows) on a connection of its own. It rides out
 * a database restart: a chunk whose commit failed is retried (ON CONFLICT DO NOTHING), so
 * after fault_producer_stop every id below the returned count is committed. */
struct fault_producer;
struct fault_producer *fault_producer_start(const struct fault *f, const char *prefix, size_t chunk,
                                            int64_t pause_ms, size_t max_rows);
/* Rows committed so far (thread-safe). */
size_t fault_producer_committed(struct fault_producer *p);
/* Stops and frees p; returns the number of rows committed. */
size_t fault_producer_stop(struct fault_producer *p);

#endif
