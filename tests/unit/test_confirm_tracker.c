/* The confirm tracker: delivery tags to rows, `multiple` acks and nacks, returns before acks,
 * stale and unknown tags, and knowing when a batch is fully answered. */
#include <criterion/criterion.h>

#include "amqp/confirm_tracker.h"

static struct confirm_tracker t;

static void setup(void)
{
	confirm_tracker_init(&t);
}

static void teardown(void)
{
	confirm_tracker_free(&t);
}

/* Sends rows 0..n-1 in order at time 100 and checks the tags they get. */
static void send_all(size_t n, uint64_t first_tag)
{
	for (size_t i = 0; i < n; i++) {
		uint64_t tag = 0;

		cr_assert_eq(confirm_tracker_sent(&t, i, 100, &tag), CONFIRM_TRACKER_OK);
		cr_assert_eq(tag, first_tag + i, "row %zu got tag %llu", i,
		             (unsigned long long)tag);
	}
	cr_assert_eq(confirm_tracker_outstanding(&t), n);
}

TestSuite(confirm_tracker, .init = setup, .fini = teardown);

Test(confirm_tracker, multiple_ack_spans_rows)
{
	cr_assert_eq(confirm_tracker_reset(&t, 5), CONFIRM_TRACKER_OK);
	send_all(5, 1);
	cr_assert_eq(confirm_tracker_answer(&t, 3, true, false, 250), 3);
	for (size_t i = 0; i < 3; i++) {
		cr_assert_eq(confirm_tracker_state(&t, i), CONFIRM_TRACKER_ACKED);
		cr_assert_eq(confirm_tracker_latency_us(&t, i), 150);
	}
	cr_assert_eq(confirm_tracker_state(&t, 3), CONFIRM_TRACKER_SENT);
	cr_assert_eq(confirm_tracker_outstanding(&t), 2);
	cr_assert_eq(confirm_tracker_answer(&t, 5, true, false, 300), 2);
	cr_assert_eq(confirm_tracker_outstanding(&t), 0);
	cr_assert_eq(confirm_tracker_state(&t, 4), CONFIRM_TRACKER_ACKED);
}

Test(confirm_tracker, single_acks_out_of_order)
{
	cr_assert_eq(confirm_tracker_reset(&t, 4), CONFIRM_TRACKER_OK);
	send_all(4, 1);
	cr_assert_eq(confirm_tracker_answer(&t, 3, false, false, 110), 1);
	cr_assert_eq(confirm_tracker_answer(&t, 1, false, false, 120), 1);
	cr_assert_eq(confirm_tracker_state(&t, 1), CONFIRM_TRACKER_SENT);
	cr_assert_eq(confirm_tracker_state(&t, 2), CONFIRM_TRACKER_ACKED);
	cr_assert_eq(confirm_tracker_latency_us(&t, 2), 10);
	/* a multiple ack now covers only what is still open below it */
	cr_assert_eq(confirm_tracker_answer(&t, 4, true, false, 130), 2);
	cr_assert_eq(confirm_tracker_outstanding(&t), 0);
	cr_assert_eq(confirm_tracker_latency_us(&t, 0), 20);
}

Test(confirm_tracker, nacks_single_and_multiple)
{
	cr_assert_eq(confirm_tracker_reset(&t, 5), CONFIRM_TRACKER_OK);
	send_all(5, 1);
	cr_assert_eq(confirm_tracker_answer(&t, 2, false, true, 110), 1);
	cr_assert_eq(confirm_tracker_state(&t, 1), CONFIRM_TRACKER_NACKED);
	cr_assert_eq(confirm_tracker_latency_us(&t, 1), 0, "latency only for acks");
	cr_assert_eq(confirm_tracker_answer(&t, 4, true, true, 120), 3);
	cr_assert_eq(confirm_tracker_state(&t, 0), CONFIRM_TRACKER_NACKED);
	cr_assert_eq(confirm_tracker_state(&t, 2), CONFIRM_TRACKER_NACKED);
	cr_assert_eq(confirm_tracker_state(&t, 3), CONFIRM_TRACKER_NACKED);
	cr_assert_eq(confirm_tracker_state(&t, 4), CONFIRM_TRACKER_SENT);
	cr_assert_eq(confirm_tracker_answer(&t, 5, false, false, 130), 1);
	cr_assert_eq(confirm_tracker_state(&t, 4), CONFIRM_TRACKER_ACKED);
}

Test(confirm_tracker, return_before_ack_stays_returned)
{
	cr_assert_eq(confirm_tracker_reset(&t, 3), CONFIRM_TRACKER_OK);
	send_all(3, 1);
	cr_assert(confirm_tracker_returned(&t, 1));
	cr_assert_eq(confirm_tracker_outstanding(&t), 2);
	cr_assert_not(confirm_tracker_returned(&t, 1), "second return for the same row");
	cr_assert_eq(confirm_tracker_answer(&t, 2, false, false, 110), 0);
	cr_assert_eq(confirm_tracker_state(&t, 1), CONFIRM_TRACKER_RETURNED);
	cr_assert_eq(confirm_tracker_answer(&t, 3, true, false, 120), 2);
	cr_assert_eq(confirm_tracker_state(&t, 1), CONFIRM_TRACKER_RETURNED);
	cr_assert_eq(confirm_tracker_outstanding(&t), 0);
}

Test(confirm_tracker, unknown_duplicate_and_stale_tags_are_ignored)
{
	cr_assert_eq(confirm_tracker_reset(&t, 2), CONFIRM_TRACKER_OK);
	send_all(2, 1);
	cr_assert_eq(confirm_tracker_answer(&t, 0, false, false, 110), 0);
	cr_assert_eq(confirm_tracker_answer(&t, 9, false, false, 110), 0);
	cr_assert_eq(confirm_tracker_outstanding(&t), 2);
	cr_assert_eq(confirm_tracker_answer(&t, 1, false, false, 110), 1);
	cr_assert_eq(confirm_tracker_answer(&t, 1, false, true, 110), 0, "duplicate");
	cr_assert_eq(confirm_tracker_state(&t, 0), CONFIRM_TRACKER_ACKED);
	/* a multiple ack beyond what was sent still covers what was */
	cr_assert_eq(confirm_tracker_answer(&t, 9, true, false, 110), 1);
	cr_assert_eq(confirm_tracker_outstanding(&t), 0);

	/* the next batch continues the channel's tags; the old ones are stale */
	cr_assert_eq(confirm_tracker_reset(&t, 2), CONFIRM_TRACKER_OK);
	send_all(2, 3);
	cr_assert_eq(confirm_tracker_answer(&t, 2, true, false, 110), 0);
	cr_assert_eq(confirm_tracker_outstanding(&t), 2);
	cr_assert_eq(confirm_tracker_answer(&t, 4, true, false, 110), 2);
}

Test(confirm_tracker, everything_done_detection)
{
	cr_assert_eq(confirm_tracker_reset(&t, 0), CONFIRM_TRACKER_OK);
	cr_assert_eq(confirm_tracker_outstanding(&t), 0);
	cr_assert_eq(confirm_tracker_reset(&t, 3), CONFIRM_TRACKER_OK);
	cr_assert_eq(confirm_tracker_outstanding(&t), 0, "nothing sent yet");
	send_all(3, 1);
	cr_assert_eq(confirm_tracker_answer(&t, 1, false, false, 110), 1);
	cr_assert_eq(confirm_tracker_answer(&t, 2, false, true, 110), 1);
	cr_assert_neq(confirm_tracker_outstanding(&t), 0);
	cr_assert(confirm_tracker_returned(&t, 2));
	cr_assert_eq(confirm_tracker_outstanding(&t), 0);
}

Test(confirm_tracker, a_row_is_in_flight_once)
{
	uint64_t tag = 0;

	cr_assert_eq(confirm_tracker_reset(&t, 2), CONFIRM_TRACKER_OK);
	cr_assert_eq(confirm_tracker_sent(&t, 0, 100, &tag), CONFIRM_TRACKER_OK);
	tag = 77;
	cr_assert_eq(confirm_tracker_sent(&t, 0, 100, &tag), CONFIRM_TRACKER_ERR_FULL);
	cr_assert_eq(tag, 77, "tag written on failure");
	cr_assert_eq(confirm_tracker_sent(&t, 2, 100, &tag), CONFIRM_TRACKER_ERR_FULL);
}

Test(confirm_tracker, channel_reset_restarts_tags_and_unsends_open_rows)
{
	uint64_t tag = 0;

	cr_assert_eq(confirm_tracker_reset(&t, 3), CONFIRM_TRACKER_OK);
	send_all(3, 1);
	cr_assert_eq(confirm_tracker_answer(&t, 1, false, false, 110), 1);
	confirm_tracker_channel_reset(&t);
	cr_assert_eq(confirm_tracker_state(&t, 0), CONFIRM_TRACKER_ACKED);
	cr_assert_eq(confirm_tracker_state(&t, 1), CONFIRM_TRACKER_UNSENT);
	cr_assert_eq(confirm_tracker_state(&t, 2), CONFIRM_TRACKER_UNSENT);
	cr_assert_eq(confirm_tracker_outstanding(&t), 0);
	cr_assert_eq(confirm_tracker_sent(&t, 2, 200, &tag), CONFIRM_TRACKER_OK);
	cr_assert_eq(tag, 1);
	cr_assert_eq(confirm_tracker_answer(&t, 1, false, false, 210), 1);
	cr_assert_eq(confirm_tracker_state(&t, 2), CONFIRM_TRACKER_ACKED);
	cr_assert_eq(confirm_tracker_latency_us(&t, 2), 10);
	cr_assert_eq(confirm_tracker_state(&t, 1), CONFIRM_TRACKER_UNSENT);
}

/* A broker condition (a queue rejecting publishes) nacks most of a batch: one multiple=true
 * nack answers every row still open below it, each reported, none twice. */
Test(confirm_tracker, multiple_nack_over_a_large_batch)
{
	enum { N = 1000 };

	cr_assert_eq(confirm_tracker_reset(&t, N), CONFIRM_TRACKER_OK);
	send_all(N, 1);
	cr_assert_eq(confirm_tracker_answer(&t, 1, false, false, 110), 1);
	cr_assert_eq(confirm_tracker_answer(&t, 500, false, false, 110), 1);
	cr_assert_eq(confirm_tracker_answer(&t, 999, true, true, 120), 997);
	for (size_t i = 0; i < N - 1; i++) {
		enum confirm_tracker_state want =
		        i == 0 || i == 499 ? CONFIRM_TRACKER_ACKED : CONFIRM_TRACKER_NACKED;

		cr_assert_eq(confirm_tracker_state(&t, i), want, "row %zu", i);
	}
	cr_assert_eq(confirm_tracker_state(&t, N - 1), CONFIRM_TRACKER_SENT);
	cr_assert_eq(confirm_tracker_outstanding(&t), 1);
	cr_assert_eq(confirm_tracker_answer(&t, N, true, true, 130), 1);
	cr_assert_eq(confirm_tracker_outstanding(&t), 0);
	cr_assert_eq(confirm_tracker_answer(&t, N, true, true, 140), 0, "nothing answered twice");
}
