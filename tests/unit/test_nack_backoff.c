/* When a worker backs off its broker connection for nacks (worker_nacks_back_off): only for most
 * of a batch of some size nacked across destinations. A row or two of a trickle, or one queue
 * rejecting publishes, back off row by row and never hold up the rest. */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stddef.h>

#include "relay/relay.h"

Test(nack_backoff, one_nacked_row_alone_is_the_rows_trouble)
{
	cr_assert_not(worker_nacks_back_off(1, 1, true));
	cr_assert_not(worker_nacks_back_off(1, 1, false));
	cr_assert_not(worker_nacks_back_off(2, 2, false));
	cr_assert_not(worker_nacks_back_off(7, 7, false));
}

Test(nack_backoff, one_destination_backs_off_row_by_row)
{
	cr_assert_not(worker_nacks_back_off(500, 500, true));
	cr_assert_not(worker_nacks_back_off(20, 12, true));
}

Test(nack_backoff, most_of_a_batch_across_destinations_is_the_brokers)
{
	cr_assert(worker_nacks_back_off(8, 8, false));
	cr_assert(worker_nacks_back_off(500, 251, false));
	cr_assert_not(worker_nacks_back_off(500, 250, false));
	cr_assert_not(worker_nacks_back_off(0, 0, false));
}
