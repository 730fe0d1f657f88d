/* direct.h — a stand-in for a relay that costs nothing: the load run's producers hand it each
 * commit's rows as the commit returns, and it publishes them at once on a connection of its own
 * (confirm mode, the properties the relay sets), never reading the database. The latency the
 * consumer then sees is what the machine gives at that rate before any relay's own work: the
 * producers' inserts, the broker and the consumer on the same cores, no read, no fence, no
 * move. Threads: direct_push() from any producer, the rest from the thread that made it. */
#ifndef OUTBOX_BENCH_DIRECT_H
#define OUTBOX_BENCH_DIRECT_H

#include <stddef.h>

#include "bench/bench.h"

struct direct;

/* Starts the publisher for queue `queue` (the default exchange, routing key = queue) with
 * room for `rows` rows in all; NULL with the reason in err. */
struct direct *direct_start(const struct bench *b, const char *queue, long rows, char *err,
                            size_t errlen);
/* Hands rows first .. first + n - 1 (their index is what the body carries) to the publisher. */
void direct_push(struct direct *d, long first, long n);
/* Stops the publisher once everything pushed is published and confirmed (or after wait_ms):
 * 0, or -1 with the reason in err (a publish failed, the broker nacked, or time ran out).
 * Frees d; accepts NULL. */
int direct_stop(struct direct *d, int64_t wait_ms, char *err, size_t errlen);

#endif
