/* Under a trickle of unkeyed rows a source holds its next claim or read back until 2 ms after the
 * previous one, to take the rows of that time together; full batches and batches with
 * ordering keys never wait. */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>

#include "store/source/gather.h"

Test(gather, a_small_unkeyed_batch_waits_until_two_ms_after_the_last_claim)
{
	cr_assert_eq(source_gather_us(0, 1, 500, false), 2000);
	cr_assert_eq(source_gather_us(300, 1, 500, false), 1700);
	cr_assert_eq(source_gather_us(1999, 62, 500, false), 1);
	cr_assert_eq(source_gather_us(2000, 1, 500, false), 0);
	cr_assert_eq(source_gather_us(250000, 1, 500, false), 0);
}

Test(gather, a_batch_of_an_eighth_or_more_goes_on_at_once)
{
	cr_assert_eq(source_gather_us(100, 63, 500, false), 0);
	cr_assert_eq(source_gather_us(100, 500, 500, false), 0);
	/* Batches of one row (relay.batch_size 1..7) are always full enough. */
	cr_assert_eq(source_gather_us(100, 1, 1, false), 0);
	cr_assert_eq(source_gather_us(100, 1, 8, false), 0);
	cr_assert_eq(source_gather_us(100, 1, 9, false), 1900);
}

Test(gather, batches_with_ordering_keys_never_wait)
{
	cr_assert_eq(source_gather_us(0, 1, 500, true), 0);
	cr_assert_eq(source_gather_us(100, 10, 500, true), 0);
}
