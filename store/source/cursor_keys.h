/* The ordering keys a batch of the cursor source is built with (store/source/cursor_source.c):
 * which keys have a row in the batch, and which had a row passed (deferred) by this read. A
 * small open-addressing set of borrowed strings, emptied in O(1) by a generation count, so that
 * building a batch of n rows costs O(n). Pure logic, unit-tested alone. */
#ifndef OUTBOX_STORE_SOURCE_CURSOR_KEYS_H
#define OUTBOX_STORE_SOURCE_CURSOR_KEYS_H

#include <stddef.h>
#include <stdint.h>

#define CURSOR_KEY_IN_BATCH 1u /* a row of the key is in the batch */
#define CURSOR_KEY_PASSED   2u /* a row of the key was passed: its later rows wait behind it */

struct cursor_keys {
	struct cursor_key_slot {
		const char *key; /* borrowed: the batch's row */
		uint32_t gen;
		unsigned flags;
	} * slots;
	size_t cap; /* a power of two, at least twice the keys a build adds */
	uint32_t gen;
};

/* Room for n keys (grows only). 0, or -1 on out of memory. */
int cursor_keys_reserve(struct cursor_keys *k, size_t n);
/* Empties the set. */
void cursor_keys_clear(struct cursor_keys *k);
/* The flags of key (0 when absent). */
unsigned cursor_keys_get(const struct cursor_keys *k, const char *key);
/* Adds flags to key (borrowed until the next clear). The set must have room
 * (cursor_keys_reserve()). */
void cursor_keys_add(struct cursor_keys *k, const char *key, unsigned flags);
void cursor_keys_free(struct cursor_keys *k);

#endif
