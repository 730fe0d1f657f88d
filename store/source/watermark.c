/* The ordering watermark of watermark.h: candidates (W, lock holders) settle when a later lock
 * list no longer shows any of their holders. Values in, decision out; unit-tested alone. */
#include "store/source/watermark.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void watermark_reset(struct watermark *wm)
{
	wm->safe = 0;
	wm->last_w = 0;
	wm->waiting = false;
	wm->stuck = false;
	wm->ncand = 0;
}

int watermark_parse_vxid(const char *text, watermark_vxid *out)
{
	char *end;
	long long backend;
	unsigned long long local;

	if (text == NULL || text[0] == '\0')
		return -1;
	errno = 0;
	backend = strtoll(text, &end, 10);
	if (errno != 0 || end == text || *end != '/' || backend < -1 || backend > INT32_MAX)
		return -1;
	text = end + 1;
	if (*text < '0' || *text > '9')
		return -1;
	local = strtoull(text, &end, 10);
	if (errno != 0 || *end != '\0' || local > UINT32_MAX)
		return -1;
	*out = ((watermark_vxid)(uint32_t)(int32_t)backend << 32) | (watermark_vxid)local;
	return 0;
}

static int cmp_vxid(const void *a, const void *b)
{
	watermark_vxid x = *(const watermark_vxid *)a, y = *(const watermark_vxid *)b;

	return (x > y) - (x < y);
}

/* True when some holder of c is in the sorted list now[0..n). */
static bool still_held(const struct watermark_candidate *c, const watermark_vxid *now, size_t n)
{
	size_t i = 0, j = 0;

	while (i < c->n && j < n) {
		if (c->holders[i] == now[j])
			return true;
		if (c->holders[i] < now[j])
			i++;
		else
			j++;
	}
	return false;
}

/* Sorts and removes duplicates in place; returns the new length. */
static size_t sort_unique(watermark_vxid *v, size_t n)
{
	size_t k = 0;

	if (n == 0)
		return 0;
	qsort(v, n, sizeof(*v), cmp_vxid);
	for (size_t i = 1; i < n; i++) {
		if (v[i] != v[k])
			v[++k] = v[i];
	}
	return k + 1;
}

void watermark_seen(struct watermark *wm, int64_t w)
{
	if (w > wm->last_w)
		wm->last_w = w;
}

void watermark_sample(struct watermark *wm, int64_t w, const watermark_vxid *holders, size_t n,
                      bool complete)
{
	watermark_vxid now[WATERMARK_HOLDERS];
	size_t k = 0;

	watermark_seen(wm, w);
	if (!complete || n > WATERMARK_HOLDERS) {
		/* A list we could not keep whole: settling through it could take a missing
		 * holder for an ended one. Wait for a sample that fits. */
		wm->stuck = wm->ncand > 0;
		return;
	}
	if (n > 0) /* holders may be NULL when there are none */
		memcpy(now, holders, n * sizeof(*now));
	n = sort_unique(now, n);

	/* Any candidate, not only the oldest: a later W whose holders have all ended is settled
	 * whatever an older candidate still waits for (every transaction with a seq below it
	 * either ended before its list was read or was on that list). */
	for (size_t i = 0; i < wm->ncand; i++) {
		if (!still_held(&wm->cand[i], now, n)) {
			if (wm->cand[i].w > wm->safe)
				wm->safe = wm->cand[i].w;
		}
	}
	for (size_t i = 0; i < wm->ncand; i++) {
		if (wm->cand[i].w > wm->safe && still_held(&wm->cand[i], now, n))
			wm->cand[k++] = wm->cand[i];
	}
	wm->ncand = k;
	wm->stuck = k > 0;

	if (w <= wm->safe)
		return;
	if (n == 0) {
		/* Nobody held the lock after W was read: every seq up to W is settled. */
		wm->safe = w;
		wm->ncand = 0;
		wm->stuck = false;
		return;
	}
	/* Rising W only: an equal or lower W is already waiting with an older (no larger)
	 * holder list, which settles no later than this one. */
	if (wm->ncand > 0 && wm->cand[wm->ncand - 1].w >= w)
		return;
	if (wm->ncand == WATERMARK_CANDIDATES)
		return; /* full: the oldest settle first, and W is read again on every claim */
	wm->cand[wm->ncand].w = w;
	wm->cand[wm->ncand].n = n;
	memcpy(wm->cand[wm->ncand].holders, now, n * sizeof(*now));
	wm->ncand++;
}

bool watermark_settling(const struct watermark *wm)
{
	return wm->waiting && wm->ncand > 0 && !wm->stuck;
}
