/* consumer_assert.h — the consumer of bench/drive/consumer.h for the criterion tests: the same
 * consumer, with consumer_start() that fails the current test where consumer_open() returns an
 * error. Include this rather than bench/drive/consumer.h in a test that calls consumer_start(). */
#ifndef OUTBOX_TESTS_CONSUMER_ASSERT_H
#define OUTBOX_TESTS_CONSUMER_ASSERT_H

#include "bench/drive/consumer.h"

/* consumer_open() for the criterion tests: returns the new consumer (free with
 * consumer_stop()) or fails the current test with the error. */
struct consumer *consumer_start(const char *url, const char *queue, const char *exchange,
                                const char *exchange_type, const char *routing_key);

#endif
