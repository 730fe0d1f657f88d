/* The lease source's policy that its unit tests read (store/lease_source.c). */
#ifndef OUTBOX_STORE_LEASE_SOURCE_H
#define OUTBOX_STORE_LEASE_SOURCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* How long (µs) the source holds its next claim back after claiming rows of which none has an
 * ordering key, since_claim_us after it sent the previous claim: while they are fewer than an
 * eighth of batch_size, until 2 ms after that claim; otherwise 0 (gathering). */
int64_t lease_gather_us(int64_t since_claim_us, size_t rows, int batch_size, bool keyed);

#endif
