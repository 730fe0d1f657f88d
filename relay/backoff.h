/* Retry backoff: min(max, min * 2^(attempts-1)) with +-25 % jitter, for rows and for
 * reconnects. Pure logic. */
#ifndef OUTBOX_RELAY_BACKOFF_H
#define OUTBOX_RELAY_BACKOFF_H

#include <stdint.h>

/* attempts >= 1 is the number of failures so far. jitter_seed is advanced (xorshift) so that
 * each thread can keep its own without locks. Result is >= 0. */
int64_t backoff_ms(int64_t min_ms, int64_t max_ms, int64_t attempts, uint64_t *jitter_seed);

#endif
