/* fault.h — what the fault tests add to the fixture (fixture.h): relays started with short
 * leases and backoffs, a producer thread that keeps committing rows while a fault happens, and
 * the lost/duplicate count every fault test prints. Like harness.h, every helper fails the
 * current criterion test when it cannot do its job. */
#ifndef OUTBOX_TESTS_FAULT_H
#define OUTBOX_TESTS_FAULT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tests/support/fixture.h"

/* Generous: the suite runs under ASan on two cores. */
#define FAULT_DELIVERY_TIMEOUT_MS 180000
#define FAULT_LOG_TIMEOUT_MS      60000

/* Starts a relay on f's table with the fault suite's short settings (lease 3s, confirm
 * timeout 2s, backoff 200ms..1s, poll 200ms), then env (NULL-terminated "OUTBOX_X=y", may be
 * NULL), whose names replace those defaults. Borrowed; f finishes and frees it (it is one of
 * f->relays, whose logs fixture_logged() and the like search). */
struct harness_relay *fault_relay_start(struct fixture *f, const char *const *env);

/* Waits until no row of the table is unpublished except `dead` ones (rows with attempts >=
 * max_attempts are dead; pass the relay's max_attempts), failing after timeout_ms. */
void fault_expect_settled(struct fixture *f, int max_attempts, int64_t timeout_ms);

/* Ids "<prefix>-<i, 7 digits>" for i in [0, n) as harness_insert_rows and the producer make
 * them: counts those never received, prints
 * `fault <name>: committed=N received=N lost=N duplicates=N` to stderr (received and
 * duplicates over every delivery of the consumer) and returns the duplicates; *lost gets the
 * lost count. */
size_t fault_count(struct fixture *f, const char *name, const char *prefix, size_t n, size_t *lost);

/* A thread committing rows "<prefix>-<i, 7 digits>" (i from 0, chunk rows a transaction,
 * pause_ms between transactions, at most max_rows) on a connection of its own. It rides out
 * a database restart: a chunk whose commit failed is retried (ON CONFLICT DO NOTHING), so
 * after fault_producer_stop every id below the returned count is committed. */
struct fault_producer;
struct fault_producer *fault_producer_start(const struct fixture *f, const char *prefix,
                                            size_t chunk, int64_t pause_ms, size_t max_rows);
/* Rows committed so far (thread-safe). */
size_t fault_producer_committed(struct fault_producer *p);
/* Stops and frees p; returns the number of rows committed. */
size_t fault_producer_stop(struct fault_producer *p);

/* Raises (on) or clears RabbitMQ's memory alarm: a high watermark of 1 byte blocks every
 * publishing connection until the watermark is back to its default. Returns whether
 * rabbitmqctl succeeded (a test's .fini may call it without failing). */
bool fault_memory_alarm(bool on);

/* "OUTBOX_AMQP_URL=<RELAY_TEST_AMQP on port>" and "OUTBOX_DATABASE_URL=<RELAY_TEST_PG on
 * port>" into buf: a relay's connections through a tcp_proxy listening on port. */
void fault_amqp_env(char *buf, size_t len, int port);
void fault_database_env(char *buf, size_t len, int port);

#endif
