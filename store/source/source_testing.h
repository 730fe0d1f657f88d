/* Test seams of the row sources (store/source/source.c): what a test cannot see from outside.
 * Never used by the relay. */
#ifndef OUTBOX_STORE_SOURCE_TESTING_H
#define OUTBOX_STORE_SOURCE_TESTING_H

#include <stdint.h>

#include "store/source/source.h"

/* How many of the cursor source's reads read the lock list (the ordering watermark's sample)
 * since the source was made; 0 for the lease source. A statement of a round trip that is not
 * its last is not in pg_stat_activity, so a test cannot see it there. */
uint64_t source_test_lock_list_reads(const struct source *s);

#endif
