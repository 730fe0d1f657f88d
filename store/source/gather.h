/* Gathering (docs/design.md): under a trickle of rows without an ordering key, a source holds
 * its next claim (the lease source) or read (the cursor source) back a little and takes the
 * rows of that time together. Pure policy, shared by the sources and read by their unit tests
 * (store/source/gather.c). */
#ifndef OUTBOX_STORE_SOURCE_GATHER_H
#define OUTBOX_STORE_SOURCE_GATHER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SOURCE_GATHER_US 2000

/* How long (µs) a source holds its next claim or read back after one that found rows, of which
 * none has an ordering key, since_us after it was sent: while they are fewer than an eighth of
 * batch_size, until SOURCE_GATHER_US after it; otherwise 0. */
int64_t source_gather_us(int64_t since_us, size_t rows, int batch_size, bool keyed);

#endif
