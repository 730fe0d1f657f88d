/* Publisher-confirm bookkeeping for one batch on one confirm-mode channel: delivery tag ->
 * row, basic.ack / basic.nack with `multiple`, basic.return before the ack of the same
 * message. Pure logic (no rabbitmq-c), so the tricky cases are unit tested. */
#ifndef OUTBOX_AMQP_CONFIRM_TRACKER_H
#define OUTBOX_AMQP_CONFIRM_TRACKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum confirm_tracker_err {
	CONFIRM_TRACKER_OK = 0,
	CONFIRM_TRACKER_ERR_NOMEM = -1,
	CONFIRM_TRACKER_ERR_FULL = -2, /* a row sent twice on one channel without a reset */
};

enum confirm_tracker_state {
	CONFIRM_TRACKER_UNSENT = 0, /* not (or no longer) in flight */
	CONFIRM_TRACKER_SENT,       /* published, no answer yet */
	CONFIRM_TRACKER_ACKED,
	CONFIRM_TRACKER_NACKED,
	CONFIRM_TRACKER_RETURNED, /* basic.return; the ack that follows leaves it returned */
};

/* Fields are private; the struct is public only so that it can be embedded. */
struct confirm_tracker {
	unsigned char *state; /* per row, enum confirm_tracker_state */
	int64_t *sent_us;     /* per row: when it was published */
	int64_t *latency_us;  /* per row: publish -> ack */
	size_t *tag_row;      /* row of delivery tag first_tag + i */
	size_t nrows, cap;
	size_t ntags;       /* tags handed out since the batch (or channel) started */
	size_t low;         /* tag_row[0..low) are all answered: multiple acks stay O(n) */
	size_t outstanding; /* rows SENT and not answered */
	uint64_t first_tag; /* delivery tag of tag_row[0] */
	uint64_t next_tag;  /* delivery tag of the next publish on this channel */
};

void confirm_tracker_init(struct confirm_tracker *t);
void confirm_tracker_free(struct confirm_tracker *t); /* frees storage, not t; accepts NULL */

/* Starts a batch of nrows rows, all UNSENT. Delivery tags keep counting on the same channel,
 * so answers for an earlier batch's tags are recognised as unknown and ignored. Storage is
 * reused and only grows. */
int confirm_tracker_reset(struct confirm_tracker *t, size_t nrows)
        __attribute__((warn_unused_result));

/* The channel was closed and reopened: delivery tags start again at 1, and rows that were
 * in flight without an answer go back to UNSENT (they must be published again). */
void confirm_tracker_channel_reset(struct confirm_tracker *t);

/* Records that row was just published at now_us; *tag gets its delivery tag. Fails with
 * CONFIRM_TRACKER_ERR_FULL when row is not UNSENT (each row is in flight at most once). */
int confirm_tracker_sent(struct confirm_tracker *t, size_t row, int64_t now_us, uint64_t *tag)
        __attribute__((warn_unused_result));

/* Applies basic.ack (nack = false) or basic.nack (nack = true) for tag, covering every
 * earlier tag too when multiple. Unknown, duplicate and stale tags are ignored. Returns how
 * many rows got their answer from this call. */
size_t confirm_tracker_answer(struct confirm_tracker *t, uint64_t tag, bool multiple, bool nack,
                              int64_t now_us);

/* Marks an in-flight row RETURNED. Returns false (and changes nothing) when row is not SENT. */
bool confirm_tracker_returned(struct confirm_tracker *t, size_t row);

enum confirm_tracker_state confirm_tracker_state(const struct confirm_tracker *t, size_t row);
/* Publish -> ack latency of an ACKED row, else 0. */
int64_t confirm_tracker_latency_us(const struct confirm_tracker *t, size_t row);
/* Rows published and still waiting for an answer. */
size_t confirm_tracker_outstanding(const struct confirm_tracker *t);

#endif
