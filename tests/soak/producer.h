/* producer.h — the soak's producer threads (producer.c). */
#ifndef OUTBOX_TESTS_SOAK_PRODUCER_H
#define OUTBOX_TESTS_SOAK_PRODUCER_H

#include <stddef.h>
#include <stdint.h>

#include "tests/soak/soak.h"

/* Starts n producer threads (n <= SOAK_MAX_PRODUCERS) committing `rate` rows a second in all
 * into table, routed to exchange ("soak.keyed" / "soak.unkeyed"), keyed rows over `keys`
 * ordering keys "k00", "k01", ... The strings are copied. */
void producers_start(const char *conninfo, const char *table, const char *exchange, int n, int rate,
                     int keys, uint64_t seed);
/* Stops them once their transaction in progress is settled; returns how many producers
 * gave up on learning a transaction's outcome (0 expected). */
size_t producers_stop(void);

/* Transactions that failed part way and were looked up afterwards: how many had committed
 * after all, how many had not (and were run again with the same ids). */
void producers_resolved(size_t *committed, size_t *retried);

#endif
