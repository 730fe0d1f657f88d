/* Exponential retry backoff with +-25 % jitter, for failed rows and for reconnects. The
 * jitter keeps many relays (or many rows failed by one outage) from retrying in lockstep. */
#include "relay/backoff.h"

#include <stdint.h>

/* Any non-zero start works for xorshift; zero is a fixed point, so it is replaced. */
#define BACKOFF_SEED_DEFAULT 0x9e3779b97f4a7c15ULL

/* xorshift64*: small, fast and good enough to spread retries; not for anything secret. */
static uint64_t next_random(uint64_t *state)
{
	uint64_t x = *state;

	if (x == 0)
		x = BACKOFF_SEED_DEFAULT;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*state = x;
	return x * 0x2545f4914f6cdd1dULL;
}

int64_t backoff_ms(int64_t min_ms, int64_t max_ms, int64_t attempts, uint64_t *jitter_seed)
{
	static _Thread_local uint64_t own_seed;
	uint64_t *seed = jitter_seed ? jitter_seed : &own_seed;
	int64_t shift, base;
	uint64_t j, lo, r, out;

	if (min_ms < 0)
		min_ms = 0;
	if (max_ms < 0)
		max_ms = 0;
	if (attempts < 1)
		attempts = 1;
	shift = attempts - 1;

	/* min * 2^shift without ever computing an overflowing product: compare against
	 * max >> shift first, which is exact for the question "would this exceed max". */
	if (shift >= 63 || min_ms > (max_ms >> shift))
		base = max_ms;
	else
		base = min_ms << shift;
	if (base > max_ms)
		base = max_ms;

	/* base +- base/4, drawn uniformly. Unsigned: base + base/4 may not fit in int64_t. */
	j = (uint64_t)base / 4;
	lo = (uint64_t)base - j;
	r = next_random(seed) % (2 * j + 1);
	out = lo + r;
	if (out > (uint64_t)INT64_MAX)
		out = (uint64_t)INT64_MAX;
	return (int64_t)out;
}
