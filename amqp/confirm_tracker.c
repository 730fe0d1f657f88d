/* Delivery tag -> row bookkeeping for publisher confirms. Several AMQP clients have shipped
 * bugs exactly here (multiple=true ranges, returns followed by acks), so it is kept free of
 * I/O and tested on its own. */
#include "amqp/confirm_tracker.h"

#include <stdlib.h>
#include <string.h>

void confirm_tracker_init(struct confirm_tracker *t)
{
	memset(t, 0, sizeof(*t));
	t->first_tag = 1;
	t->next_tag = 1;
}

void confirm_tracker_free(struct confirm_tracker *t)
{
	if (t == NULL)
		return;
	free(t->state);
	free(t->sent_us);
	free(t->latency_us);
	free(t->tag_row);
	confirm_tracker_init(t);
}

int confirm_tracker_reset(struct confirm_tracker *t, size_t nrows)
{
	if (nrows > t->cap) {
		/* Grow all four arrays together; keep the old ones on failure so t stays usable. */
		unsigned char *st = malloc(nrows);
		int64_t *sent = malloc(nrows * sizeof(*sent));
		int64_t *lat = malloc(nrows * sizeof(*lat));
		size_t *rows = malloc(nrows * sizeof(*rows));

		if (st == NULL || sent == NULL || lat == NULL || rows == NULL) {
			free(st);
			free(sent);
			free(lat);
			free(rows);
			return CONFIRM_TRACKER_ERR_NOMEM;
		}
		free(t->state);
		free(t->sent_us);
		free(t->latency_us);
		free(t->tag_row);
		t->state = st;
		t->sent_us = sent;
		t->latency_us = lat;
		t->tag_row = rows;
		t->cap = nrows;
	}
	if (nrows > 0) {
		memset(t->state, CONFIRM_TRACKER_UNSENT, nrows);
		memset(t->latency_us, 0, nrows * sizeof(*t->latency_us));
	}
	t->nrows = nrows;
	t->ntags = 0;
	t->low = 0;
	t->outstanding = 0;
	t->first_tag = t->next_tag;
	return CONFIRM_TRACKER_OK;
}

void confirm_tracker_channel_reset(struct confirm_tracker *t)
{
	for (size_t i = 0; i < t->nrows; i++) {
		if (t->state[i] == CONFIRM_TRACKER_SENT)
			t->state[i] = CONFIRM_TRACKER_UNSENT;
	}
	t->ntags = 0;
	t->low = 0;
	t->outstanding = 0;
	t->first_tag = 1;
	t->next_tag = 1;
}

int confirm_tracker_sent(struct confirm_tracker *t, size_t row, int64_t now_us, uint64_t *tag)
{
	if (row >= t->nrows || t->state[row] != CONFIRM_TRACKER_UNSENT || t->ntags >= t->cap)
		return CONFIRM_TRACKER_ERR_FULL;
	t->state[row] = CONFIRM_TRACKER_SENT;
	t->sent_us[row] = now_us;
	t->tag_row[t->ntags++] = row;
	t->outstanding++;
	*tag = t->next_tag++;
	return CONFIRM_TRACKER_OK;
}

/* Gives one row its answer if it is still waiting for one; returns 1 when it was. */
static size_t answer_row(struct confirm_tracker *t, size_t row, bool nack, int64_t now_us)
{
	if (t->state[row] != CONFIRM_TRACKER_SENT)
		return 0; /* duplicate answer, or the ack that follows a basic.return */
	if (nack) {
		t->state[row] = CONFIRM_TRACKER_NACKED;
	} else {
		t->state[row] = CONFIRM_TRACKER_ACKED;
		t->latency_us[row] = now_us - t->sent_us[row];
	}
	t->outstanding--;
	return 1;
}

size_t confirm_tracker_answer(struct confirm_tracker *t, uint64_t tag, bool multiple, bool nack,
                              int64_t now_us)
{
	size_t done = 0;
	size_t idx;

	if (tag < t->first_tag || t->ntags == 0)
		return 0; /* tag 0 or an earlier batch's tag */
	if (tag - t->first_tag >= t->ntags) {
		/* A tag we never handed out: ignore a single answer; a multiple one can still
		 * only cover what we did send. */
		if (!multiple)
			return 0;
		idx = t->ntags - 1;
	} else {
		idx = (size_t)(tag - t->first_tag);
	}
	if (multiple) {
		for (size_t i = t->low; i <= idx; i++)
			done += answer_row(t, t->tag_row[i], nack, now_us);
		if (idx + 1 > t->low)
			t->low = idx + 1;
	} else {
		done += answer_row(t, t->tag_row[idx], nack, now_us);
	}
	while (t->low < t->ntags && t->state[t->tag_row[t->low]] != CONFIRM_TRACKER_SENT)
		t->low++;
	return done;
}

bool confirm_tracker_returned(struct confirm_tracker *t, size_t row)
{
	if (row >= t->nrows || t->state[row] != CONFIRM_TRACKER_SENT)
		return false;
	t->state[row] = CONFIRM_TRACKER_RETURNED;
	t->outstanding--;
	return true;
}

enum confirm_tracker_state confirm_tracker_state(const struct confirm_tracker *t, size_t row)
{
	if (row >= t->nrows)
		return CONFIRM_TRACKER_UNSENT;
	return (enum confirm_tracker_state)t->state[row];
}

int64_t confirm_tracker_latency_us(const struct confirm_tracker *t, size_t row)
{
	if (row >= t->nrows || t->state[row] != CONFIRM_TRACKER_ACKED)
		return 0;
	return t->latency_us[row];
}

size_t confirm_tracker_outstanding(const struct confirm_tracker *t)
{
	return t->outstanding;
}
