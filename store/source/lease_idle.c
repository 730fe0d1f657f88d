/* The lease source's idle path (store/source.h, lease_next() with nothing fetched ahead):
 * claims that look everywhere before concluding that nothing is claimable, arming the wake-up
 * before sleeping, and catching up with producers that tested the wake-up just before it was
 * armed. */
#include <stdatomic.h>
#include <stdbool.h>

#include "base/clock.h"
#include "store/source/lease_source_private.h"
#include "store/store.h"
#include "store/source/lease.h"

/* A claim that looks at every claimable row before the source may conclude there is none: from
 * the first unkeyed row, and through every ordering key (a claim looks at a few hundred keys;
 * the claims that follow go on through the rest, until one claims something or the keys run
 * out). Then the next claims start from the floor again. */
static int claim_everywhere(struct lease *s, bool disarm, struct store_batch *x)
{
	int rc;

	store_keys_restart(s->store);
	store_set_claim_floor(s->store, 0);
	rc = store_claim(s->store, disarm, x);
	if (rc == 0)
		lease_hook_unheld(s, x);
	store_set_claim_floor(s->store, STORE_FLOOR_KEYS_ONLY);
	while (rc == 0 && x->n == 0 && store_keys_more(s->store) && !lease_stopping(s)) {
		lease_hook_tick(s);
		rc = store_claim(s->store, false, x);
		if (rc == 0)
			lease_hook_unheld(s, x);
	}
	store_set_claim_floor(s->store, 0);
	if (rc < 0)
		return lease_fail(s, SOURCE_STEP_CLAIMING, rc);
	lease_hook_answered(s);
	return 0;
}

/* After arming, before the last claim: a producer tests the wake-up lock when its INSERT ends,
 * not when it commits, so one that tested just before the lock was taken does not notify,
 * and its rows may commit after a claim. It drew its seq before testing and holds the
 * sequence's lock until it ends: once a sample of the lock holders read now has seen every
 * one of them end (the watermark settles), a claim sees all their rows. So the source samples
 * again (pauses of 1, 2, 4 ... ms, at most CATCH_UP_PAUSE_MS, the caller listening meanwhile)
 * until that happens or a poll interval has passed: a producer that inserts and then works on
 * before it commits is caught within CATCH_UP_PAUSE_MS of its commit, and while no producer's
 * transaction is open this is one sample. The same settling makes keyed rows committed just
 * now claimable. 1 when the caller is to call again at *ask_at_ms, 0 to claim now. */
static int catch_up(struct lease *s, int64_t *ask_at_ms)
{
	int rc = store_settle_watermark(s->store);
	int64_t now = clock_mono_ms();

	if (rc < 0)
		return lease_fail(s, SOURCE_STEP_SETTLING_WATERMARK, rc);
	if (rc == 0 || now + s->catch_up_pause_ms > s->catch_up_end_ms)
		return 0;
	*ask_at_ms = now + s->catch_up_pause_ms;
	s->catch_up_pause_ms = s->catch_up_pause_ms * 2 < CATCH_UP_PAUSE_MS
	                               ? s->catch_up_pause_ms * 2
	                               : CATCH_UP_PAUSE_MS;
	return 1;
}

/* Takes the wake-up lock before sleeping. Every producer's INSERT takes it shared for an
 * instant to test it, and a try in that instant is refused as it would be by a relay asleep:
 * taken for one, it had the relay sleep its poll interval unarmed while no relay was armed,
 * producers not notifying, new rows waiting the whole interval. So a refusal is read as
 * another relay's only when the lock list shows one holding it; otherwise the lock is tried
 * again at once, ARM_TRIES times in all. Producers holding it at every try (contended): the
 * source asks to be called again after a pause, 1 ms and doubling up to ARM_PAUSE_MAX_MS, and
 * arms then. */
static int arm(struct lease *s)
{
	int rc = 0;

	s->contended = false;
	for (int i = 0; i < ARM_TRIES; i++) {
		rc = store_arm(s->store);
		if (rc < 0)
			return lease_fail(s, SOURCE_STEP_ARMING, rc);
		if (rc == 1)
			break;
		rc = store_wakeup_armed_elsewhere(s->store);
		if (rc < 0)
			return lease_fail(s, SOURCE_STEP_ARMING, rc);
		if (rc == 1) {
			/* Another relay is armed: its notifications reach this one too. */
			s->armed = false;
			s->arm_pause_ms = 1;
			return 0;
		}
	}
	s->armed = rc == 1;
	s->contended = !s->armed;
	if (s->armed)
		s->arm_pause_ms = 1;
	return 0;
}

/* With nothing fetched ahead: settles what is in flight, claims everywhere; finding nothing,
 * arms, catches up, claims everywhere once more, and says when to be called again. */
int lease_next_idle(struct lease *s, const struct source_batch **out, int64_t *ask_at_ms)
{
	struct store_batch *x = &s->batches[s->cur];
	int rc;

	if (s->idle == IDLE_CLAIM) {
		/* The pipeline ran dry: settle the last mark before using the connection again. */
		rc = lease_finish_mark(s);
		if (rc == 0)
			rc = lease_repay(s);
		if (rc < 0)
			return rc;
		s->last_first_seq = 0;
		s->full_claim_ms = clock_mono_ms();
		rc = claim_everywhere(s, s->armed, x);
		if (rc < 0)
			return rc;
		s->armed = false;
		if (x->n > 0)
			return lease_hand_out_now(s, x, out, ask_at_ms);
		/* Arm, then claim once more before sleeping: a row committed before the lock was
		 * taken did not notify, but that claim sees it (catch_up()). */
		rc = arm(s);
		if (rc < 0)
			return rc;
		s->idle = IDLE_CATCH_UP;
		s->catch_up_end_ms = clock_mono_ms() + s->o.poll_interval_ms;
		s->catch_up_pause_ms = 1;
	}
	rc = catch_up(s, ask_at_ms);
	if (rc != 0)
		return rc < 0 ? rc : 0;
	s->idle = IDLE_CLAIM;
	rc = claim_everywhere(s, false, x);
	if (rc < 0)
		return rc;
	if (x->n > 0)
		return lease_hand_out_now(s, x, out, ask_at_ms);
	if (s->contended) {
		/* Nobody is armed: pause a moment, then round again to arm. */
		int64_t nap = s->arm_pause_ms;

		if (nap > s->o.poll_interval_ms)
			nap = s->o.poll_interval_ms;
		*ask_at_ms = clock_mono_ms() + nap;
		if (s->arm_pause_ms * 2 <= ARM_PAUSE_MAX_MS)
			s->arm_pause_ms *= 2;
		return 0;
	}
	*ask_at_ms = clock_mono_ms() + s->o.poll_interval_ms;
	return 0;
}
