/* Retry backoff: doubling from the minimum, the cap, jitter bounds over many draws, seeds,
 * and no overflow for absurd attempt counts. */
#include <criterion/criterion.h>
#include <stdint.h>

#include "relay/backoff.h"

/* Asserts that n draws all fall within base +- 25 % and actually spread across that range. */
static void assert_jittered(int64_t min_ms, int64_t max_ms, int64_t attempts, int64_t base)
{
	uint64_t seed = 42;
	int64_t lo = INT64_MAX, hi = INT64_MIN;
	/* base + 25 % saturates: the result is an int64_t, so it can never exceed INT64_MAX. */
	int64_t top = base > INT64_MAX - base / 4 ? INT64_MAX : base + base / 4;

	for (int i = 0; i < 10000; i++) {
		int64_t v = backoff_ms(min_ms, max_ms, attempts, &seed);

		cr_assert_geq(v, base - base / 4, "attempts %lld: %lld below %lld",
		              (long long)attempts, (long long)v, (long long)(base - base / 4));
		cr_assert_leq(v, top, "attempts %lld: %lld above %lld", (long long)attempts,
		              (long long)v, (long long)top);
		lo = v < lo ? v : lo;
		hi = v > hi ? v : hi;
	}
	if (base >= 100) {
		cr_assert_lt(lo, base - base / 5, "jitter never went low: %lld", (long long)lo);
		if (top < INT64_MAX)
			cr_assert_gt(hi, base + base / 5, "jitter never went high: %lld",
			             (long long)hi);
	}
}

Test(backoff, doubles_from_the_minimum)
{
	assert_jittered(1000, 300000, 1, 1000);
	assert_jittered(1000, 300000, 2, 2000);
	assert_jittered(1000, 300000, 3, 4000);
	assert_jittered(1000, 300000, 9, 256000);
}

Test(backoff, is_capped_at_the_maximum)
{
	assert_jittered(1000, 300000, 10, 300000);
	assert_jittered(1000, 300000, 40, 300000);
	/* A minimum above the maximum still obeys the cap. */
	assert_jittered(5000, 2000, 1, 2000);
}

Test(backoff, huge_attempts_do_not_overflow)
{
	uint64_t seed = 7;

	assert_jittered(1000, 300000, 63, 300000);
	assert_jittered(1000, 300000, 64, 300000);
	assert_jittered(1000, 300000, INT64_MAX, 300000);
	assert_jittered(INT64_MAX / 2, INT64_MAX, 3, INT64_MAX);
	for (int i = 0; i < 1000; i++) {
		int64_t v = backoff_ms(INT64_MAX, INT64_MAX, INT64_MAX, &seed);
		cr_assert_geq(v, INT64_MAX - INT64_MAX / 4);
	}
}

Test(backoff, odd_inputs_stay_sane)
{
	uint64_t seed = 1;

	/* attempts below 1 count as the first failure; negative bounds mean zero. */
	assert_jittered(1000, 300000, 0, 1000);
	assert_jittered(1000, 300000, -5, 1000);
	cr_assert_eq(backoff_ms(0, 300000, 5, &seed), 0);
	cr_assert_eq(backoff_ms(-10, -5, 3, &seed), 0);
	cr_assert_geq(backoff_ms(1000, 300000, 2, NULL), 1500, "a NULL seed still works");
}

Test(backoff, zero_seed_still_produces_jitter)
{
	uint64_t seed = 0;
	int64_t first = backoff_ms(1000, 300000, 1, &seed);
	int distinct = 0;

	cr_assert_neq(seed, 0, "a zero seed must be replaced, or xorshift stays at zero");
	for (int i = 0; i < 100; i++)
		distinct += backoff_ms(1000, 300000, 1, &seed) != first;
	cr_assert_gt(distinct, 50);
}

Test(backoff, same_seed_same_sequence)
{
	uint64_t a = 12345, b = 12345;

	for (int i = 0; i < 100; i++)
		cr_assert_eq(backoff_ms(1000, 300000, 4, &a), backoff_ms(1000, 300000, 4, &b));
	cr_assert_eq(a, b);
}
