/* What the lease source's files share (store/lease_source.c: handing out, fetching ahead,
 * settling; store/lease_idle.c: the idle path). Nothing outside them includes it. */
#ifndef OUTBOX_STORE_LEASE_SOURCE_PRIVATE_H
#define OUTBOX_STORE_LEASE_SOURCE_PRIVATE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/clock.h"
#include "store/store.h"
#include "store/source/lease.h"
#include "store/source/source.h"
#include "store/source/source_private.h"

/* Confirmed rows kept in memory while the database is away, to be marked once it is back. A
 * source that cannot mark fetches nothing, so this only ever holds a batch or two. */
#define OWED_MAX 20000
/* A batch is handed out only while its lease (by the database clock) outlasts the confirm
 * timeout by a margin, room for the mark that follows: half of what the lease gives beyond
 * the confirm timeout, at most this (a fresh claim always qualifies). */
#define LEASE_MARGIN_MAX_MS 2000
/* After arming, the watermark is sampled again after pauses of 1, 2, 4 ... ms, at most this
 * (catch_up()). */
#define CATCH_UP_PAUSE_MS 50
/* Arming: tries of the wake-up lock before a refusal is read as producers holding it, and the
 * longest pause before trying again (arm()). */
#define ARM_TRIES        3
#define ARM_PAUSE_MAX_MS 50

/* A confirmed row not yet marked, with its claim's token: the mark is fenced like every
 * write, so it only lands while the row is still ours. */
struct owed {
	int64_t seq;
	char token[STORE_TOKEN_MAX];
};

struct lease {
	struct source base; /* first: a struct lease * is a struct lease * */
	struct source_options o;
	struct store *store;

	/* Two batches: batches[cur] is the one handed out (or fetched ahead, to be handed out
	 * next), batches[1 - cur] the one claimed while the broker confirms it. */
	struct store_batch batches[2];
	int cur;
	bool out;       /* batches[cur] is handed out and not settled yet */
	int64_t out_us; /* when it was handed out */
	struct source_batch view;
	bool claiming;      /* a claim into batches[1 - cur] is on the wire */
	bool claim_disarms; /* ... and it lets the wake-up lock go */

	/* The mark of the previous batch's confirmed rows, whose seqs are still in published[]:
	 * held to go with the next claim, on the wire on its own, or carried by the claim on the
	 * wire. */
	enum { MARK_NONE, MARK_HELD, MARK_SENT, MARK_IN_CLAIM } mark;
	size_t n_marking;
	int64_t marking_t0_us;
	char marking_token[STORE_TOKEN_MAX];

	size_t cap; /* capacity of the arrays below */
	int64_t *published;
	const char **released;
	struct store_failure *failures;

	struct owed *owed; /* confirmed rows not yet marked (the database was away) */
	size_t n_owed;

	/* Claim floor: the first seq of the previous batch, and when the last claim without a
	 * floor ran; when the last claim went out (gathering). */
	int64_t last_first_seq;
	int64_t full_claim_ms;
	int64_t claim_sent_us;

	/* The idle path (lease_next() with nothing fetched ahead). */
	enum { IDLE_CLAIM, IDLE_CATCH_UP } idle;
	bool armed;     /* this session holds the wake-up lock */
	bool contended; /* producers held the lock at every try of the last arming */
	int64_t arm_pause_ms;
	int64_t catch_up_end_ms, catch_up_pause_ms;

	enum source_step step;
};

static inline void lease_hook_marked(struct lease *s, size_t rows, int64_t t0_us)
{
	if (s->o.hooks.marked)
		s->o.hooks.marked(s->o.hooks.arg, rows, clock_mono_us() - t0_us);
}

static inline void lease_hook_answered(struct lease *s)
{
	if (s->o.hooks.answered)
		s->o.hooks.answered(s->o.hooks.arg);
}

static inline void lease_hook_released(struct lease *s, size_t rows)
{
	if (s->o.hooks.released)
		s->o.hooks.released(s->o.hooks.arg, rows);
}

static inline void lease_hook_tick(struct lease *s)
{
	if (s->o.hooks.tick)
		s->o.hooks.tick(s->o.hooks.arg);
}

/* What a claim leased but its batch could not hold (store/source/claim.c, fit_batch()). */
static inline void lease_hook_unheld(struct lease *s, const struct store_batch *b)
{
	if ((b->n_cut || b->n_refused) && s->o.hooks.unheld)
		s->o.hooks.unheld(s->o.hooks.arg, b->n_cut, b->n_refused, b->refused_id,
		                  b->refused_error);
}

static inline bool lease_stopping(const struct lease *s)
{
	return s->o.stopping && atomic_load(s->o.stopping);
}

static inline int lease_fail(struct lease *s, enum source_step step, int rc)
{
	s->step = step;
	return rc;
}

/* lease_source.c */
/* Reads the answer to the mark of the previous batch, sending it first if it was held. */
int lease_finish_mark(struct lease *s);
/* Marks what was owed while the database was away. */
int lease_repay(struct lease *s);
/* Hands out x, just claimed; when it may not go, *ask_at_ms is now. 1 when it went out. */
int lease_hand_out_now(struct lease *s, struct store_batch *x, const struct source_batch **out,
                       int64_t *ask_at_ms);

/* lease_idle.c */
/* With nothing fetched ahead: records what is in flight, claims everywhere; finding nothing,
 * arms the wake-up, catches up, claims everywhere once more, and says when to be called
 * again (*ask_at_ms). 1 when a batch went out (*out). */
int lease_next_idle(struct lease *s, const struct source_batch **out, int64_t *ask_at_ms);

#endif
