/* The lease source (store/source.h): rows are claimed under a lease written into them, marked
 * published or failed when their batch ends, and released when the broker never answered.
 * Its policy is here, whole: which claim carries a mark (held and carried marks), where a claim
 * starts (the claim floor), when a claim looks everywhere (key rounds), what is owed while the
 * database is away, how long a claim waits for company (gathering), and the idle path that
 * arms the wake-up before sleeping. docs/design.md, "The words the code uses", defines them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "store/source/gather.h"
#include "store/source/lease_source_private.h"
#include "store/store.h"
#include "store/operator/partitions.h"
#include "store/source/lease.h"
#include "store/operator/admin.h"
#include "store/source/source.h"

static int grow(struct lease *s, size_t n)
{
	size_t cap = s->cap ? s->cap : 64;
	void *p;

	if (n <= s->cap)
		return 0;
	while (cap < n)
		cap *= 2;
#define GROW(field)                                             \
	do {                                                    \
		p = realloc(s->field, cap * sizeof(*s->field)); \
		if (!p)                                         \
			return -1;                              \
		s->field = p;                                   \
	} while (0)
	GROW(published);
	GROW(released);
	GROW(failures);
#undef GROW
	s->cap = cap;
	return 0;
}

/* ---- owed marks ---- */

/* Keeps confirmed rows to mark once the database is back (else they are republished when
 * their lease runs out: a duplicate, not a loss). */
static void owe(struct lease *s, const char *token, const int64_t *seqs, size_t n)
{
	for (size_t i = 0; i < n && s->n_owed < OWED_MAX; i++) {
		struct owed *p = realloc(s->owed, (s->n_owed + 1) * sizeof(*s->owed));

		if (!p)
			return;
		s->owed = p;
		s->owed[s->n_owed].seq = seqs[i];
		snprintf(s->owed[s->n_owed].token, sizeof(s->owed[s->n_owed].token), "%s", token);
		s->n_owed++;
	}
}

static void clear_owed(struct lease *s)
{
	free(s->owed);
	s->owed = NULL;
	s->n_owed = 0;
}

/* Marks what was owed, one statement per claim token (owed rows come in whole batches). */
int lease_repay(struct lease *s)
{
	size_t marked = 0, changed = 0;
	int rc;

	if (!s->n_owed)
		return 0;
	if (grow(s, s->n_owed) < 0)
		return lease_fail(s, SOURCE_STEP_REPAYING, STORE_ERR_NOMEM);
	for (size_t i = 0; i < s->n_owed;) {
		size_t n = 0, hit = 0;
		const char *token = s->owed[i].token;

		while (i + n < s->n_owed && strcmp(s->owed[i + n].token, token) == 0) {
			s->published[n] = s->owed[i + n].seq;
			n++;
		}
		rc = store_mark_published_send(s->store, token, s->published, n,
		                               s->o.delete_published);
		if (rc == 0)
			rc = store_mark_published_recv(s->store, &hit);
		if (rc < 0) {
			/* What was marked is no longer owed; the rest stays, to try again. */
			memmove(s->owed, s->owed + i, (s->n_owed - i) * sizeof(*s->owed));
			s->n_owed -= i;
			return lease_fail(s, SOURCE_STEP_REPAYING, rc);
		}
		marked += n;
		changed += hit;
		i += n;
	}
	if (s->o.hooks.repaid)
		s->o.hooks.repaid(s->o.hooks.arg, changed, marked - changed);
	clear_owed(s);
	return 0;
}

/* ---- marks ---- */

/* Counts a mark's answer: hit of its rows were still ours. */
static void marked(struct lease *s, size_t hit)
{
	s->mark = MARK_NONE;
	lease_hook_marked(s, hit, s->marking_t0_us);
}

/* Reads the answer to the mark sent at the end of the previous batch, sending it first if it
 * was held for a claim that is not coming. On failure the caller disconnects, which owes the
 * mark's rows. */
int lease_finish_mark(struct lease *s)
{
	size_t hit = 0;
	int rc;

	if (s->mark == MARK_HELD) {
		rc = store_mark_published_send(s->store, s->marking_token, s->published,
		                               s->n_marking, s->o.delete_published);
		if (rc < 0)
			return lease_fail(s, SOURCE_STEP_MARKING, rc);
		s->mark = MARK_SENT;
	}
	if (s->mark != MARK_SENT) /* none, or the claim's answer brings it */
		return 0;
	rc = store_mark_published_recv(s->store, &hit);
	if (rc < 0)
		return lease_fail(s, SOURCE_STEP_MARKING, rc);
	marked(s, hit);
	return 0;
}

/* ---- claiming ---- */

static bool batch_keyed(const struct store_batch *x)
{
	for (size_t i = 0; i < x->n; i++)
		if (x->rows[i].ordering_key)
			return true;
	return false;
}

/* Chooses where the next claim starts. Nothing below the first row of the current batch
 * was claimable when it was claimed, and the next rows of ordering keys published by this
 * batch or the previous one (whose mark has just committed) lie above their first rows. Rows
 * committed late below it are looked at all the same (the store keeps the floor below what
 * the last claim could not see). What else may have become claimable below it since
 * (released or retried rows, expired delays, keys moved on by other relays) is found by a
 * claim without a floor at least every poll interval. */
static void set_claim_floor(struct lease *s, const struct store_batch *x)
{
	int64_t now = clock_mono_ms();
	int64_t first = x->n ? x->rows[0].seq : 0;
	int64_t floor_seq = first;

	if (s->last_first_seq > 0 && s->last_first_seq < floor_seq)
		floor_seq = s->last_first_seq;
	s->last_first_seq = first;
	if (now - s->full_claim_ms >= s->o.poll_interval_ms) {
		floor_seq = 0;
		s->full_claim_ms = now;
	}
	store_set_claim_floor(s->store, floor_seq);
}

/* Drops the notifications libpq holds. Under load the loop never sleeps, yet notifications
 * still come (another relay asleep makes producers notify, and so does a wake-up that came
 * as this source got busy), each kept by libpq until it is read: without this they would pile
 * up for as long as the load lasts. A busy source claims again after every batch, so they say
 * nothing it needs. A failure is left to the next statement, which meets it too. */
static void drop_notifications(struct lease *s)
{
	bool woken;

	if (store_consume_input(s->store, &woken) < 0)
		return;
}

/* Reads the claim sent by lease_prefetch() into batches[1 - cur], with the mark it carried. */
static int claim_answer(struct lease *s)
{
	struct store_batch *next = &s->batches[1 - s->cur];
	int rc;

	if (!s->claiming)
		return 0;
	s->claiming = false;
	rc = store_claim_recv(s->store, next);
	if (rc < 0) {
		next->n = 0;
		return lease_fail(s, SOURCE_STEP_CLAIMING, rc);
	}
	lease_hook_answered(s);
	if (s->claim_disarms)
		s->armed = false;
	if (s->mark == MARK_IN_CLAIM)
		marked(s, store_claim_marked(s->store));
	lease_hook_unheld(s, next);
	drop_notifications(s);
	return 0;
}

/* ---- handing out ---- */

/* A batch claimed while the previous one waited for its confirms may have little lease left:
 * it is renewed first (fenced: rows another relay took meanwhile are dropped from the batch),
 * and every wait of its publishing ends before its lease does (the batch's deadline), so that
 * no row is ever waited on past its lease. A batch is never left aside for having too little
 * lease — on a loaded machine that could repeat for ever; at worst its confirms are cut short
 * and its rows released. 1 when x goes out, 0 when nothing of it may be published. */
static int hand_out(struct lease *s, struct store_batch *x, const struct source_batch **out)
{
	int64_t spare = (s->o.store.lease_ms - s->o.confirm_timeout_ms) / 2;
	int64_t margin =
	        spare < LEASE_MARGIN_MAX_MS ? (spare > 0 ? spare : 0) : LEASE_MARGIN_MAX_MS;
	int rc;

	if (x->lease_deadline_ms - clock_mono_ms() < s->o.confirm_timeout_ms + margin) {
		rc = lease_finish_mark(s);
		if (rc < 0)
			return rc;
		rc = store_renew(s->store, x);
		if (rc < 0)
			return lease_fail(s, SOURCE_STEP_RENEWING, rc);
	}
	/* The mark that follows the confirms needs a moment of lease too (margin). */
	if (x->n == 0 || x->lease_deadline_ms - margin <= clock_mono_ms()) {
		x->n = 0; /* left to their lease: another relay, or this one later, takes them */
		return 0;
	}
	s->view.rows = x->rows;
	s->view.n = x->n;
	s->view.deadline_ms = x->lease_deadline_ms - margin;
	s->out = true;
	s->out_us = clock_mono_us();
	*out = &s->view;
	return 1;
}

/* A batch just claimed goes out; should it not (its lease gone already), the caller comes
 * round again at once. */
int lease_hand_out_now(struct lease *s, struct store_batch *x, const struct source_batch **out,
                       int64_t *ask_at_ms)
{
	int rc = hand_out(s, x, out);

	if (rc == 0)
		*ask_at_ms = clock_mono_ms();
	return rc;
}

int lease_next(struct lease *s, const struct source_batch **out, int64_t *ask_at_ms)
{
	struct store_batch *x = &s->batches[s->cur];
	int rc;

	*out = NULL;
	*ask_at_ms = clock_mono_ms() + s->o.poll_interval_ms;
	s->step = SOURCE_STEP_NONE;
	if (s->out)
		return 0; /* the batch out must be settled first */
	/* Any batch fetched ahead goes out at once: under load the source never goes idle, so
	 * it never takes the wake-up lock and producers never pay for a NOTIFY. */
	if (x->n > 0) {
		rc = hand_out(s, x, out);
		if (rc != 0)
			return rc < 0 ? rc : 0;
	}
	rc = lease_next_idle(s, out, ask_at_ms);
	return rc < 0 ? rc : 0;
}

int lease_prefetch(struct lease *s, const struct source_batch *b)
{
	struct store_batch *x = &s->batches[s->cur];
	bool disarm = s->armed;
	int rc;

	s->step = SOURCE_STEP_NONE;
	if (!s->out || b != &s->view || s->claiming || lease_stopping(s))
		return 0;
	/* A held mark goes with the claim; one on the wire is read first. */
	if (s->mark != MARK_HELD) {
		rc = lease_finish_mark(s);
		if (rc < 0)
			return rc;
	}
	clock_sleep_us(source_gather_us(clock_mono_us() - s->claim_sent_us, x->n,
	                                s->o.store.batch_size, batch_keyed(x)));
	set_claim_floor(s, x);
	/* Still armed when the claim after arming found rows: producers would notify on every
	 * commit while this source is busy. This claim lets the lock go. */
	if (s->mark == MARK_HELD)
		rc = store_claim_mark_send(s->store, disarm, s->marking_token, s->published,
		                           s->n_marking, s->o.delete_published);
	else
		rc = store_claim_send(s->store, disarm);
	s->claim_sent_us = clock_mono_us();
	if (rc < 0)
		return lease_fail(s, SOURCE_STEP_CLAIMING, rc); /* disconnecting owes a held mark */
	s->batches[1 - s->cur].n = 0;
	s->claiming = true;
	s->claim_disarms = disarm;
	if (s->mark == MARK_HELD)
		s->mark = MARK_IN_CLAIM;
	return 0;
}

/* ---- settling ---- */

/* Sorts the rows of x by their fates into published[], failures[] and released[]. */
static void sort_fates(struct lease *s, const struct store_batch *x,
                       const struct source_fate *fates, size_t *n_pub, size_t *n_fail,
                       size_t *n_rel)
{
	*n_pub = *n_fail = *n_rel = 0;
	for (size_t i = 0; i < x->n; i++) {
		const struct source_fate *f = &fates[i];
		struct store_failure *sf;

		switch (f->outcome) {
		case SOURCE_PUBLISHED:
			s->published[(*n_pub)++] = x->rows[i].seq;
			break;
		case SOURCE_FAILED:
			sf = &s->failures[(*n_fail)++];
			sf->id = x->rows[i].id;
			sf->error = f->error ? f->error : "";
			sf->delay_ms = f->delay_ms;
			sf->dead = f->dead;
			sf->uncounted = f->uncounted;
			break;
		default:
			s->released[(*n_rel)++] = x->rows[i].id;
			break;
		}
	}
}

/* The database could not hear how x went: its confirmed rows are owed (marked after
 * reconnecting), everything else is left to its lease. From the fates, not published[]: that
 * may still hold the seqs of a mark in flight, which disconnecting owes. */
static void owe_fates(struct lease *s, const struct store_batch *x, const struct source_fate *fates)
{
	for (size_t i = 0; i < x->n; i++)
		if (fates[i].outcome == SOURCE_PUBLISHED)
			owe(s, x->token, &x->rows[i].seq, 1);
	s->batches[1 - s->cur].n = 0;
}

/* As owe_fates(), once the fates are sorted (no mark is in flight then). */
static int settle_lost(struct lease *s, const struct store_batch *x, size_t n_pub, int rc)
{
	owe(s, x->token, s->published, n_pub);
	s->batches[1 - s->cur].n = 0;
	return rc;
}

/* Writes what the database must hear about batch x: failures and releases at once (they are
 * rare), the confirmed rows' mark sent now and read next turn, or held to go with the next
 * turn's claim when that claim is the full one (store_claim_carries_mark) and x has no
 * ordering key: one statement a turn instead of two. Under 1,500 durable commits a second
 * (claims of 4-6 rows) that cut the relay's database CPU per message by 6 % and its own by
 * 12 %. A keyed batch is marked on its own, so that the next claim can take its keys' next
 * rows. */
static int write_fates(struct lease *s, const struct store_batch *x,
                       const struct source_fate *fates)
{
	const struct store_batch *next = &s->batches[1 - s->cur];
	size_t n_pub, n_fail, n_rel;
	int rc;

	if (!store_connected(s->store)) { /* the relay finds the connection gone and says so */
		owe_fates(s, x, fates);
		return 0;
	}
	/* The previous batch's mark first: its seqs are in published[]. */
	rc = lease_finish_mark(s);
	if (rc == 0 && grow(s, x->n) < 0)
		rc = lease_fail(s, SOURCE_STEP_MARKING, STORE_ERR_NOMEM);
	if (rc < 0) {
		owe_fates(s, x, fates);
		return rc;
	}
	sort_fates(s, x, fates, &n_pub, &n_fail, &n_rel);
	if (n_fail) {
		/* The failure path failing is left to the lease: the rows come back after it and
		 * are tried again. */
		rc = store_mark_failed(s->store, x->token, s->failures, n_fail, NULL);
		if (rc < 0)
			return settle_lost(s, x, n_pub,
			                   lease_fail(s, SOURCE_STEP_MARKING_FAILED, rc));
	}
	if (n_rel) {
		rc = store_release(s->store, x->token, s->released, n_rel);
		if (rc < 0)
			return settle_lost(s, x, n_pub, lease_fail(s, SOURCE_STEP_RELEASING, rc));
		lease_hook_released(s, n_rel);
	}
	if (!n_pub) {
		/* Nothing to mark: the batch is settled now (its duration is otherwise taken when
		 * the mark's answer is read). */
		lease_hook_marked(s, 0, s->out_us);
		return 0;
	}
	if (next->n > 0 && store_claim_carries_mark(s->store) && !batch_keyed(x)) {
		s->mark = MARK_HELD;
	} else {
		rc = store_mark_published_send(s->store, x->token, s->published, n_pub,
		                               s->o.delete_published);
		if (rc < 0)
			return settle_lost(s, x, n_pub, lease_fail(s, SOURCE_STEP_MARKING, rc));
		s->mark = MARK_SENT;
	}
	s->n_marking = n_pub;
	s->marking_t0_us = s->out_us;
	snprintf(s->marking_token, sizeof(s->marking_token), "%s", x->token);
	return 0;
}

int lease_settle(struct lease *s, const struct source_batch *b, const struct source_fate *fates)
{
	struct store_batch *x = &s->batches[s->cur];
	int rc = 0;

	s->step = SOURCE_STEP_NONE;
	if (!s->out || b != &s->view)
		return 0;
	s->out = false;
	/* The claim on the wire is answered before anything else is said on the connection. */
	if (store_connected(s->store))
		rc = claim_answer(s);
	if (fates && rc < 0)
		owe_fates(s, x, fates);
	else if (fates)
		rc = write_fates(s, x, fates);
	x->n = 0;
	s->cur = 1 - s->cur;
	return rc;
}

/* ---- pausing and finishing ---- */

/* Hands a batch fetched ahead back at once rather than after its lease. */
static int hand_back(struct lease *s)
{
	struct store_batch *x = &s->batches[s->cur];
	int rc;

	if (s->out || x->n == 0 || !store_connected(s->store))
		goto out;
	rc = lease_finish_mark(s);
	if (rc < 0 || grow(s, x->n) < 0) {
		x->n = 0;
		return rc < 0 ? rc : lease_fail(s, SOURCE_STEP_HANDING_BACK, STORE_ERR_NOMEM);
	}
	for (size_t i = 0; i < x->n; i++)
		s->released[i] = x->rows[i].id;
	rc = store_release(s->store, x->token, s->released, x->n);
	if (rc < 0) {
		x->n = 0;
		return lease_fail(s, SOURCE_STEP_HANDING_BACK, rc);
	}
	lease_hook_released(s, x->n);
out:
	if (!s->out)
		x->n = 0;
	return 0;
}

int lease_pause(struct lease *s)
{
	int rc;

	s->step = SOURCE_STEP_NONE;
	s->idle = IDLE_CLAIM;
	if (!store_connected(s->store))
		return 0;
	rc = hand_back(s);
	if (rc == 0)
		rc = lease_finish_mark(s);
	if (rc < 0)
		return rc;
	/* No notification can help while the broker is away, and each costs a producer's
	 * commit: let the wake-up lock go. */
	if (s->armed) {
		rc = store_disarm(s->store);
		if (rc < 0)
			return lease_fail(s, SOURCE_STEP_DISARMING, rc);
		s->armed = false;
	}
	return 0;
}

int lease_finish(struct lease *s)
{
	int rc;

	s->step = SOURCE_STEP_NONE;
	if (!store_connected(s->store))
		return 0;
	rc = lease_finish_mark(s);
	if (rc == 0)
		rc = hand_back(s);
	if (rc == 0 && store_connected(s->store))
		rc = lease_repay(s);
	return rc;
}

size_t lease_owed(const struct lease *s)
{
	return s->n_owed;
}

/* ---- the connection ---- */

int lease_connect(struct lease *s)
{
	int rc;

	s->step = SOURCE_STEP_NONE;
	rc = store_connect(s->store);
	if (rc == STORE_OK) {
		/* The wake-up lock ended with the old session. */
		s->armed = false;
		s->idle = IDLE_CLAIM;
	}
	return rc;
}

/* A mark still on the wire is owed, to be sent again after reconnecting (fenced, so it lands
 * only if the rows are still ours), never read as an answer that cannot come (which would
 * fail the next connection too). A claim on the wire and a batch fetched ahead are left to
 * their lease. The batch out stays, for its settling to owe its confirmed rows. */
void lease_disconnect(struct lease *s)
{
	if (s->mark != MARK_NONE) {
		owe(s, s->marking_token, s->published, s->n_marking);
		s->mark = MARK_NONE;
	}
	s->claiming = false;
	s->batches[1 - s->cur].n = 0;
	if (!s->out)
		s->batches[s->cur].n = 0;
	s->idle = IDLE_CLAIM;
	store_disconnect(s->store);
}

bool lease_connected(const struct lease *s)
{
	return store_connected(s->store);
}

void lease_interrupt(struct lease *s)
{
	store_interrupt(s->store);
}

const char *lease_errmsg(const struct lease *s)
{
	return store_errmsg(s->store);
}

enum source_step lease_step(const struct lease *s)
{
	return s->step;
}

const char *lease_server(const struct lease *s)
{
	return store_server(s->store);
}

bool lease_wakeup_current(const struct lease *s)
{
	return store_wakeup_current(s->store);
}

int lease_token_stem(const struct lease *s, char *out, size_t cap)
{
	return store_token_stem(s->store, out, cap);
}

int lease_fd(const struct lease *s)
{
	return store_socket(s->store);
}

int lease_input(struct lease *s, bool *woken)
{
	int rc = store_consume_input(s->store, woken);

	if (rc < 0)
		return lease_fail(s, SOURCE_STEP_WAITING, rc);
	if (*woken)
		s->idle = IDLE_CLAIM;
	return 0;
}

int lease_backlog(struct lease *s, struct store_status *st)
{
	return store_status(s->store, st);
}

int lease_partitions_ahead(struct lease *s, int *made)
{
	return store_partitions_ahead(s->store, made);
}

int lease_purge(struct lease *s, int64_t older_than_ms, int batch, const atomic_int *stop,
                int64_t *n_removed)
{
	return store_purge(s->store, older_than_ms, batch, stop, n_removed);
}

struct lease *lease_new(const struct source_options *opts)
{
	struct lease *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	s->base.kind = SOURCE_LEASE;
	s->o = *opts;
	/* This source's store refuses a table the cursor source runs (store_connect()). */
	s->o.store.cursor = false;
	s->arm_pause_ms = 1;
	store_batch_init(&s->batches[0]);
	store_batch_init(&s->batches[1]);
	s->store = store_new(&s->o.store);
	if (!s->store) {
		lease_free(s);
		return NULL;
	}
	return s;
}

void lease_free(struct lease *s)
{
	if (!s)
		return;
	store_free(s->store);
	store_batch_free(&s->batches[0]);
	store_batch_free(&s->batches[1]);
	free(s->published);
	free(s->released);
	free(s->failures);
	clear_owed(s);
	free(s);
}
