/* The key set of cursor_keys.h: FNV-1a, linear probing, generations instead of clearing. */
#include "store/source/cursor_keys.h"

#include <stdlib.h>
#include <string.h>

static size_t hash(const char *key)
{
	uint64_t h = 1469598103934665603ull;

	for (const unsigned char *p = (const unsigned char *)key; *p; p++)
		h = (h ^ *p) * 1099511628211ull;
	return (size_t)h;
}

int cursor_keys_reserve(struct cursor_keys *k, size_t n)
{
	size_t cap = 64;
	struct cursor_key_slot *slots;

	while (cap < 2 * n)
		cap *= 2;
	if (cap <= k->cap)
		return 0;
	slots = calloc(cap, sizeof(*slots));
	if (!slots)
		return -1;
	free(k->slots);
	k->slots = slots;
	k->cap = cap;
	k->gen = 1; /* every slot is stale (gen 0) */
	return 0;
}

void cursor_keys_clear(struct cursor_keys *k)
{
	if (++k->gen == 0) { /* wrapped: stale slots could look current */
		memset(k->slots, 0, k->cap * sizeof(*k->slots));
		k->gen = 1;
	}
}

/* The slot of key, or the empty one where it would go. */
static struct cursor_key_slot *find(const struct cursor_keys *k, const char *key)
{
	size_t mask = k->cap - 1;

	for (size_t i = hash(key) & mask;; i = (i + 1) & mask) {
		struct cursor_key_slot *s = &k->slots[i];

		if (s->gen != k->gen || strcmp(s->key, key) == 0)
			return s;
	}
}

unsigned cursor_keys_get(const struct cursor_keys *k, const char *key)
{
	const struct cursor_key_slot *s;

	if (k->cap == 0)
		return 0;
	s = find(k, key);
	return s->gen == k->gen ? s->flags : 0;
}

void cursor_keys_add(struct cursor_keys *k, const char *key, unsigned flags)
{
	struct cursor_key_slot *s = find(k, key);

	if (s->gen != k->gen) {
		s->gen = k->gen;
		s->key = key;
		s->flags = 0;
	}
	s->flags |= flags;
}

void cursor_keys_free(struct cursor_keys *k)
{
	free(k->slots);
	k->slots = NULL;
	k->cap = 0;
}
