/* Claiming: one statement leases up to a batch of claimable rows under a new token and returns
 * them with the ordering watermark's sample; the rows are copied into the batch's own storage
 * (a PGresult never leaves store/). Also the idle path's watermark settling. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "store/store.h"
#include "store/source/lease.h"
#include "store/store_private.h"

/* A claimed batch may carry large bodies, but never more than this in one go. */
#define BATCH_BUF_MAX ((size_t)1 << 30)
/* The most bodies a claim asks for, whatever relay.batch_max_bytes says (up to 1 GiB): the
 * batch's other columns need room in the buffer too. */
#define BATCH_BODIES_MAX (BATCH_BUF_MAX / 8 * 7)
/* Ordering keys a claim looks at, at least: a batch's worth, and never fewer than this, so
 * that a small batch does not take many claims to go round a few dozen keys. */
#define STORE_CLAIM_KEYS_MIN 64
/* ... and a claim that only looks through the keys (STORE_FLOOR_KEYS_ONLY), going round keys
 * whose heads are all delayed, dead or leased: fewer statements for the same descents. */
#define STORE_CLAIM_KEYS_ONLY 1024
/* How far below the floor a claim still looks for rows committed late, in batches
 * (store_set_claim_floor). */
#define STORE_FLOOR_REACH_BATCHES 8
/* The lock list is read by a claim at least this often (ms), so that the watermark, and with
 * it the claim floor, moves on while only unkeyed rows flow. */
#define STORE_SAMPLE_EVERY_MS 10

static int cmp_row_seq(const void *a, const void *b)
{
	const struct outbox_row *x = a, *y = b;

	return (x->seq > y->seq) - (x->seq < y->seq);
}

/* Feeds the watermark one sample: W, and the lock holders as "3/12,5/99" (n of them). */
void store_feed_sample(struct store *s, const char *w_text, const char *holders, int64_t n)
{
	watermark_vxid v[WATERMARK_HOLDERS];
	size_t k = 0;
	bool complete = n >= 0 && n <= WATERMARK_HOLDERS;
	int64_t w;

	if (store_parse_int64(w_text, &w) != 0)
		return;
	for (const char *p = holders; complete && p && *p;) {
		char one[40];
		size_t len = strcspn(p, ",");

		if (len >= sizeof(one) || k == WATERMARK_HOLDERS) {
			complete = false;
			break;
		}
		memcpy(one, p, len);
		one[len] = '\0';
		if (watermark_parse_vxid(one, &v[k]) != 0) {
			complete = false;
			break;
		}
		k++;
		p += len;
		if (*p == ',')
			p++;
	}
	if ((int64_t)k != n)
		complete = false;
	watermark_sample(&s->wm, w, v, k, complete);
}

/* Rows the mark carried by the claim hit, by row i of its answer (0 when none was carried). */
static size_t answer_marked(const PGresult *res, int i)
{
	int64_t v;

	if (PQgetisnull(res, i, COL_MARKED) ||
	    store_parse_int64(PQgetvalue(res, i, COL_MARKED), &v) != 0 || v <= 0)
		return 0;
	return (size_t)v;
}

/* Takes the sample from row i of the claim's answer, with left ms of the lease. */
static void use_sample(struct store *s, const PGresult *res, int i, int64_t left,
                       struct store_batch *out, int64_t sent_ms)
{
	int64_t n = -1;
	size_t marked = answer_marked(res, i);

	/* Over the round: a key looked at by an earlier claim of it may still wait. */
	s->round_waiting =
	        (s->has_cursor && s->round_waiting) || PQgetvalue(res, i, COL_WM_KEYED)[0] == 't';
	s->wm.waiting = s->round_waiting;
	s->has_cursor = !PQgetisnull(res, i, COL_KEY_CURSOR) &&
	                (size_t)PQgetlength(res, i, COL_KEY_CURSOR) < sizeof(s->key_cursor);
	if (s->has_cursor)
		memcpy(s->key_cursor, PQgetvalue(res, i, COL_KEY_CURSOR),
		       (size_t)PQgetlength(res, i, COL_KEY_CURSOR) + 1);
	if (store_parse_int64(PQgetvalue(res, i, COL_WM_NHOLDERS), &n) != 0)
		n = -1;
	s->keys_pending = PQgetisnull(res, i, COL_KEYS_PENDING) ||
	                  PQgetvalue(res, i, COL_KEYS_PENDING)[0] != 'f';
	if (marked > 0)
		s->claim_marked = marked;
	/* No sample when the claim found no keyed row and none was asked for (statements.c). */
	if (!PQgetisnull(res, i, COL_WM_SEQ)) {
		store_feed_sample(s, PQgetvalue(res, i, COL_WM_SEQ),
		                  PQgetisnull(res, i, COL_WM_HOLDERS)
		                          ? ""
		                          : PQgetvalue(res, i, COL_WM_HOLDERS),
		                  n);
		s->sampled_ms = clock_mono_ms();
	}
	/* By the database clock, counted from when the claim was sent (earlier), so that the
	 * deadline errs on the early side. */
	out->lease_deadline_ms = sent_ms + left;
}

/* Reads the watermark's sample and the lease left from the claim's answer and returns the
 * number of claimed rows. The full claim (ST_CLAIM_FULL) gives the sample a row of its own,
 * seq NULL, which UNION ALL puts last (one found elsewhere is still used, and skipped by the
 * parse loop); the claim (ST_CLAIM) repeats it on every row, each with the lease left when that
 * row was leased: the least of them is the one to go by. */
static int take_sample(struct store *s, const PGresult *res, int nt, struct store_batch *out,
                       int64_t sent_ms)
{
	int64_t left = INT64_MAX;

	for (int i = 0; i < nt; i++) {
		int64_t l;

		if (PQgetisnull(res, i, COL_SEQ)) {
			if (store_parse_int64(PQgetvalue(res, i, COL_LEASE_LEFT), &l) != 0)
				l = 0;
			use_sample(s, res, i, l, out, sent_ms);
			return i == nt - 1 ? nt - 1 : nt;
		}
		if (PQgetisnull(res, i, COL_LEASE_LEFT))
			continue; /* the full claim's rows: its sample's row has the lease */
		if (store_parse_int64(PQgetvalue(res, i, COL_LEASE_LEFT), &l) != 0)
			l = 0;
		if (l < left)
			left = l;
	}
	if (nt > 0)
		use_sample(s, res, 0, left, out, sent_ms);
	else
		out->lease_deadline_ms = sent_ms;
	return nt;
}

/* Bytes row i of the answer takes in the batch's buffer: every text column and its NUL. */
size_t store_row_bytes(const PGresult *res, int i)
{
	size_t n = 0;

	for (int c = COL_ID; c <= COL_ORDERING_KEY; c++)
		n += (size_t)PQgetlength(res, i, c) + 1;
	return n;
}

struct by_seq {
	int64_t seq;
	int i;
};

static int cmp_by_seq(const void *a, const void *b)
{
	const struct by_seq *x = a, *y = b;

	return (x->seq > y->seq) - (x->seq < y->seq);
}

/* A claimed batch larger than the buffer (the budget keeps bodies below it; large headers or
 * properties can still get here): never left leased, where it would fail the same way after
 * every lease. Its rows that fit, oldest first, are kept; the rest are handed back at once
 * (they come with a later claim); a row that cannot fit even alone can never be held, and is
 * recorded dead with a last_error that says so (it cannot block the rows behind it either).
 * Sets skip[i] for every row of the answer not kept and *total to what the kept ones need. */
static int fit_batch(struct store *s, const PGresult *res, unsigned char *skip,
                     struct store_batch *out, size_t *total)
{
	int nt = PQntuples(res), n = 0, rc = 0;
	struct by_seq *order = calloc((size_t)nt + 1, sizeof(*order));
	const char **cut = calloc((size_t)nt + 1, sizeof(*cut));
	struct store_failure *refused = calloc((size_t)nt + 1, sizeof(*refused));
	size_t used = 0, n_cut = 0, n_refused = 0;
	bool cutting = false;

	if (!order || !cut || !refused) {
		store_set_error(s, "out of memory");
		rc = STORE_ERR_NOMEM;
		goto out;
	}
	for (int i = 0; i < nt; i++) {
		if (PQgetisnull(res, i, COL_SEQ))
			continue; /* the sample's row */
		if (store_parse_int64(PQgetvalue(res, i, COL_SEQ), &order[n].seq) != 0) {
			store_set_error(s, "claim returned an unreadable number");
			rc = STORE_ERR_QUERY;
			goto out;
		}
		order[n++].i = i;
	}
	qsort(order, (size_t)n, sizeof(*order), cmp_by_seq);
	for (int j = 0; j < n; j++) {
		int i = order[j].i;
		size_t b = store_row_bytes(res, i);

		if (b <= BATCH_BUF_MAX - used && !cutting) {
			used += b;
			continue;
		}
		skip[i] = 1;
		if (b <= BATCH_BUF_MAX) {
			cutting = true; /* oldest first: nothing after a row handed back */
			cut[n_cut++] = PQgetvalue(res, i, COL_ID);
			continue;
		}
		if (n_refused == 0) {
			snprintf(out->refused_id, sizeof(out->refused_id), "%s",
			         PQgetvalue(res, i, COL_ID));
			snprintf(out->refused_error, sizeof(out->refused_error),
			         "row needs %zu bytes, more than a claimed batch may hold (%zu)", b,
			         BATCH_BUF_MAX);
		}
		refused[n_refused].id = PQgetvalue(res, i, COL_ID);
		refused[n_refused].error = out->refused_error;
		refused[n_refused].dead = true;
		n_refused++;
	}
	if (n_refused && (rc = store_mark_failed(s, s->claim_token, refused, n_refused, NULL)) != 0)
		goto out;
	if (n_cut && (rc = store_release(s, s->claim_token, cut, n_cut)) != 0)
		goto out;
	out->n_cut = n_cut;
	out->n_refused = n_refused;
	*total = used;
out:
	free(order);
	free(cut);
	free(refused);
	return rc;
}

/* Copies the result into the batch's single buffer: sizes first, so that the buffer is
 * (re)allocated at most once and no pointer is taken before it stops moving. */
/* Room in out for nt rows and total bytes of their text. The old contents need not be kept:
 * the batch is being replaced. -1 on out of memory. */
int store_batch_reserve(struct store_batch *out, int nt, size_t total)
{
	if ((size_t)nt > out->cap) {
		struct outbox_row *r = realloc(out->rows, (size_t)nt * sizeof(*r));
		if (!r)
			return -1;
		out->rows = r;
		out->cap = (size_t)nt;
	}
	if (total > out->buf_cap) {
		size_t cap = out->buf_cap ? out->buf_cap : 64 * 1024;
		while (cap < total)
			cap *= 2;
		if (cap > BATCH_BUF_MAX)
			cap = BATCH_BUF_MAX;
		free(out->buf);
		out->buf = malloc(cap);
		out->buf_cap = out->buf ? cap : 0;
		if (!out->buf)
			return -1;
	}
	return 0;
}

/* Copies row i of res into r, its text at out->buf + *used (moved on). -1 when a number in it
 * cannot be read. */
int store_batch_copy_row(const PGresult *res, int i, struct store_batch *out, struct outbox_row *r,
                         size_t *used)
{
	const char **dst[COL_ORDERING_KEY - COL_ID + 1] = {
		&r->id,      &r->exchange,      &r->routing_key,
		&r->body,    &r->body_encoding, &r->content_type,
		&r->headers, &r->properties,    &r->ordering_key,
	};
	int64_t v;

	for (int c = COL_ID; c <= COL_ORDERING_KEY; c++) {
		size_t len = (size_t)PQgetlength(res, i, c);
		if (PQgetisnull(res, i, c)) {
			*dst[c - COL_ID] = NULL;
			continue;
		}
		memcpy(out->buf + *used, PQgetvalue(res, i, c), len);
		out->buf[*used + len] = '\0';
		*dst[c - COL_ID] = out->buf + *used;
		if (c == COL_BODY)
			r->body_len = len;
		*used += len + 1;
	}
	if (store_parse_int64(PQgetvalue(res, i, COL_SEQ), &r->seq) != 0 ||
	    store_parse_int64(PQgetvalue(res, i, COL_CREATED_AT), &r->created_at_s) != 0 ||
	    store_parse_int64(PQgetvalue(res, i, COL_ATTEMPTS), &v) != 0)
		return -1;
	r->attempts = (int)v;
	return 0;
}

static int parse_batch(struct store *s, const PGresult *res, struct store_batch *out,
                       int64_t sent_ms)
{
	int nt = PQntuples(res), rc = 0;
	size_t total = 0, used = 0, k = 0;
	unsigned char *skip = NULL;

	out->n_cut = out->n_refused = 0;
	out->refused_id[0] = out->refused_error[0] = '\0';
	if (PQnfields(res) != COL_COUNT) {
		store_set_error(s, "claim returned %d columns, expected %d", PQnfields(res),
		                COL_COUNT);
		return STORE_ERR_QUERY;
	}
	for (int i = 0; i < nt; i++)
		total += store_row_bytes(res, i);
	nt = take_sample(s, res, nt, out, sent_ms);
	if (total > BATCH_BUF_MAX) {
		skip = calloc((size_t)PQntuples(res) + 1, 1);
		if (!skip)
			goto nomem;
		if ((rc = fit_batch(s, res, skip, out, &total)) != 0) {
			free(skip);
			return rc;
		}
		nt -= (int)(out->n_cut + out->n_refused);
	}
	if (store_batch_reserve(out, nt, total) != 0)
		goto nomem;
	for (int i = 0; i < PQntuples(res); i++) {
		if (PQgetisnull(res, i, COL_SEQ))
			continue; /* the watermark sample (rows may still be NULL then) */
		if (skip && skip[i])
			continue; /* handed back or refused (fit_batch) */
		if (store_batch_copy_row(res, i, out, &out->rows[k], &used) != 0) {
			store_set_error(s, "claim returned an unreadable number");
			out->n = 0;
			free(skip);
			return STORE_ERR_QUERY;
		}
		k++;
	}
	free(skip);
	out->buf_len = used;
	out->n = k;
	snprintf(out->token, sizeof(out->token), "%s", s->claim_token);
	/* RETURNING comes in no particular order; publishing must go oldest first. */
	if (out->n > 1)
		qsort(out->rows, out->n, sizeof(out->rows[0]), cmp_row_seq);
	return 0;
nomem:
	free(skip);
	store_set_error(s, "out of memory");
	return STORE_ERR_NOMEM;
}

/* Base 36, lowercase, into buf; returns buf. */
static char *base36(uint32_t v, char *buf, size_t n)
{
	char tmp[16];
	size_t len = 0;

	do {
		tmp[len++] = "0123456789abcdefghijklmnopqrstuvwxyz"[v % 36];
		v /= 36;
	} while (v && len < sizeof(tmp));
	for (size_t i = 0; i < len && i + 1 < n; i++)
		buf[i] = tmp[len - 1 - i];
	buf[len < n ? len : n - 1] = '\0';
	return buf;
}

/* A new token for the next claim: the counter wraps after 36^6 claims, long after any
 * batch that carried an old value is gone. */
static void next_token(struct store *s)
{
	char nonce[7], count[7]; /* both below 36^6: six digits */

	s->token_counter = (s->token_counter + 1) % 2176782336u;
	snprintf(s->claim_token, sizeof(s->claim_token), "%s%s.%s", s->token_prefix,
	         base36(s->token_nonce, nonce, sizeof(nonce)),
	         base36(s->token_counter, count, sizeof(count)));
}

int store_claim_token_next(struct store *s, char *out, size_t cap)
{
	next_token(s);
	if (snprintf(out, cap, "%s", s->claim_token) >= (int)cap) {
		store_set_error(s, "internal error: a claim token does not fit");
		return STORE_ERR_FATAL;
	}
	return 0;
}

void store_sort_rows(struct store_batch *b)
{
	qsort(b->rows, b->n, sizeof(b->rows[0]), cmp_row_seq);
}

int store_token_stem(const struct store *s, char *out, size_t cap)
{
	char nonce[7];
	int w = snprintf(out, cap, "%s%s.", s->token_prefix,
	                 base36(s->token_nonce, nonce, sizeof(nonce)));

	return w < 0 || (size_t)w >= cap ? -1 : 0;
}

/* Where this claim starts among unkeyed rows: the floor asked for, but never above a row the
 * last claim could not see (claim_seen + 1: every row below was visible to it, so a row
 * committed late, after it, is looked at by this one), nor more than a reach of batches below
 * what was asked (a transaction that stays open longer than that many rows behind leaves its
 * row to the next claim without a floor). */
static int64_t floor_in_effect(const struct store *s, int batch_size)
{
	int64_t asked = s->claim_floor, reach = (int64_t)batch_size * STORE_FLOOR_REACH_BATCHES;

	if (asked == 0 || asked == STORE_FLOOR_KEYS_ONLY || asked <= s->claim_seen + 1)
		return asked;
	return s->claim_seen + 1 > asked - reach ? s->claim_seen + 1 : asked - reach;
}

/* Sends claim statement name (ST_CLAIM, ST_CLAIM_FULL, or with mark_ids and mark_token
 * ST_CLAIM_MARK or ST_CLAIM_DROP) under a new token. */
static int claim_send(struct store *s, const char *name, bool disarm, const char *mark_ids,
                      const char *mark_token)
{
	char max[16], batch[16], lease[24], floor_seq[24], safe[24], budget[24], nkeys[16];
	const char *params[13];
	int64_t now = clock_mono_ms();
	int batch_size = s->opts.batch_size > 0 ? s->opts.batch_size : 1;
	int rc;

	rc = store_ensure_prepared(s);
	if (rc != 0)
		return rc;
	if (s->opts.admin) {
		store_set_error(s, "an admin connection cannot claim");
		return STORE_ERR_FATAL;
	}
	next_token(s);
	snprintf(max, sizeof(max), "%d", s->opts.max_attempts);
	snprintf(batch, sizeof(batch), "%d", batch_size);
	snprintf(nkeys, sizeof(nkeys), "%d",
	         s->claim_floor == STORE_FLOOR_KEYS_ONLY ? STORE_CLAIM_KEYS_ONLY
	         : batch_size > STORE_CLAIM_KEYS_MIN     ? batch_size
	                                                 : STORE_CLAIM_KEYS_MIN);
	snprintf(lease, sizeof(lease), "%lld", (long long)s->opts.lease_ms);
	snprintf(floor_seq, sizeof(floor_seq), "%lld", (long long)floor_in_effect(s, batch_size));
	snprintf(safe, sizeof(safe), "%lld", (long long)watermark_safe(&s->wm));
	/* A claim that looks at no unkeyed row sees nothing for the floor's sake. */
	s->claim_seen_sent =
	        s->claim_floor == STORE_FLOOR_KEYS_ONLY ? s->claim_seen : watermark_safe(&s->wm);
	/* The claim stops at the budget, before leasing what the batch could not hold. */
	snprintf(budget, sizeof(budget), "%lld",
	         s->opts.batch_max_bytes > 0 && (size_t)s->opts.batch_max_bytes < BATCH_BODIES_MAX
	                 ? (long long)s->opts.batch_max_bytes
	                 : (long long)BATCH_BODIES_MAX);
	params[0] = disarm ? "t" : "f";
	s->claim_disarm = disarm;
	if (disarm)
		s->armed = false;
	params[1] = max;
	params[2] = batch;
	params[3] = s->claim_token;
	params[4] = lease;
	params[5] = floor_seq;
	params[6] = safe;
	params[7] = budget;
	params[8] = s->has_cursor ? s->key_cursor : NULL;
	params[9] = nkeys;
	params[10] = s->sampled_ms == 0 || now - s->sampled_ms >= STORE_SAMPLE_EVERY_MS ? "t" : "f";
	params[11] = mark_ids;
	params[12] = mark_token;
	s->claim_marked = 0;
	s->claim_lean = strncmp(name, ST_CLAIM_LEAN, strlen(ST_CLAIM_LEAN)) == 0;
	return store_send_prepared(s, name, mark_ids ? 13 : 11, params, STORE_INFLIGHT_CLAIM,
	                           "could not claim");
}

/* The claim that keeps its rows once (ST_CLAIM) saves a copy of each row it leases, and costs a
 * second statement when it leases none. It is taken where a batch's worth is likely: after a
 * claim that leased an eighth of a batch or more. A trickle of a few rows a claim, and the
 * keys-only claims going round heads that are not ready, take the full claim, whose copies are
 * few: under 2,000 commits a second, always taking ST_CLAIM cost PostgreSQL 8-11 % more per
 * message. */
static bool claim_big(const struct store *s)
{
	int batch_size = s->opts.batch_size > 0 ? s->opts.batch_size : 1;
	size_t many = batch_size / 8 > 0 ? (size_t)batch_size / 8 : 1;

	return s->claim_floor != STORE_FLOOR_KEYS_ONLY && s->claim_last_n >= many;
}

/* The full claim leaves its keyed part out while the last claim saw no unpublished keyed row
 * and no round of the keys is under way: a trickle of unkeyed rows, claimed a few at a time,
 * then skips setting up and running a dozen plan nodes that find nothing (about a sixth of
 * what such a claim costs the database). The lean claim looks in the key index for a keyed
 * row instead; when it finds one and leased nothing, the full claim follows at once
 * (store_claim_recv()), and after it leased rows the next claim is the full one. A keyed row is
 * so never left for longer than one claim. */
static bool claim_lean(const struct store *s)
{
	return !s->keys_pending && !s->has_cursor && s->claim_floor != STORE_FLOOR_KEYS_ONLY;
}

int store_claim_send(struct store *s, bool disarm)
{
	const char *name = claim_big(s) ? ST_CLAIM : claim_lean(s) ? ST_CLAIM_LEAN : ST_CLAIM_FULL;

	return claim_send(s, name, disarm, NULL, NULL);
}

bool store_claim_carries_mark(const struct store *s)
{
	return !claim_big(s);
}

int store_claim_mark_send(struct store *s, bool disarm, const char *token, const int64_t *seqs,
                          size_t n, bool delete_rows)
{
	const char *ids, *name;
	bool lean = claim_lean(s);
	int rc;

	if (n == 0)
		return store_claim_send(s, disarm);
	if ((rc = store_mark_params(s, token, seqs, n, &ids)) != 0)
		return rc;
	if (delete_rows)
		name = lean ? ST_CLAIM_LEAN_DROP : ST_CLAIM_DROP;
	else
		name = lean ? ST_CLAIM_LEAN_MARK : ST_CLAIM_MARK;
	return claim_send(s, name, disarm, ids, token);
}

size_t store_claim_marked(const struct store *s)
{
	return s->claim_marked;
}

void store_set_claim_floor(struct store *s, int64_t from_seq)
{
	s->claim_floor = from_seq > 0 ? from_seq : 0;
}

/* A lean claim's answer of its sample row alone, saying that an unpublished keyed row exists. */
static bool lean_saw_keys(const PGresult *res)
{
	return PQntuples(res) == 1 && PQnfields(res) == COL_COUNT && PQgetisnull(res, 0, COL_SEQ) &&
	       !PQgetisnull(res, 0, COL_KEYS_PENDING) &&
	       PQgetvalue(res, 0, COL_KEYS_PENDING)[0] == 't';
}

int store_claim_recv(struct store *s, struct store_batch *out)
{
	int64_t sent_ms = s->inflight_sent_ms;
	PGresult *res;
	int rc;

	out->n = 0;
	if (!s->conn || s->inflight != STORE_INFLIGHT_CLAIM) {
		store_set_error(s, "no claim is waiting for its result");
		return s->conn ? STORE_ERR_QUERY : STORE_ERR_CONN;
	}
	res = store_collect(s);
	/* Nothing leased by ST_CLAIM (the full claim answers at least its sample row): the full
	 * claim says why, or leases what came meanwhile. Nothing leased by a lean claim that saw a
	 * keyed row: the full claim looks at the keys (the mark it carried is done). */
	if (PQresultStatus(res) == PGRES_TUPLES_OK &&
	    (PQntuples(res) == 0 || (s->claim_lean && lean_saw_keys(res)))) {
		size_t marked = PQntuples(res) == 1 ? answer_marked(res, 0) : 0;

		PQclear(res);
		if ((rc = claim_send(s, ST_CLAIM_FULL, s->claim_disarm, NULL, NULL)) != 0) {
			s->claim_last_n = 0;
			s->keys_pending = true;
			return rc;
		}
		s->claim_marked = marked;
		sent_ms = s->inflight_sent_ms;
		res = store_collect(s);
	}
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		rc = store_result_error(s, res, "could not claim");
	else
		rc = parse_batch(s, res, out, sent_ms);
	if (rc == 0)
		s->claim_seen = s->claim_seen_sent;
	/* A claim that failed leased nothing this relay will use: the next one is the full claim,
	 * keys and all. */
	s->claim_last_n = rc == 0 ? out->n : 0;
	if (rc != 0)
		s->keys_pending = true;
	PQclear(res);
	return rc;
}

int store_claim(struct store *s, bool disarm, struct store_batch *out)
{
	int rc = store_claim_send(s, disarm);

	if (rc != 0) {
		out->n = 0;
		return rc;
	}
	return store_claim_recv(s, out);
}

/* One sample on its own (the idle path). */
static int sample(struct store *s)
{
	PGresult *res = NULL;
	int64_t n = -1;
	int rc;

	rc = store_exec_prepared(s, ST_SAMPLE, 0, NULL, PGRES_TUPLES_OK, NULL, &res,
	                         "could not read the ordering watermark");
	if (rc != 0)
		return rc;
	if (PQntuples(res) == 1 && PQnfields(res) == 3) {
		if (store_parse_int64(PQgetvalue(res, 0, 2), &n) != 0)
			n = -1;
		store_feed_sample(s, PQgetvalue(res, 0, 0),
		                  PQgetisnull(res, 0, 1) ? "" : PQgetvalue(res, 0, 1), n);
		s->sampled_ms = clock_mono_ms();
	}
	PQclear(res);
	return 0;
}

int store_settle_watermark(struct store *s)
{
	int64_t target;
	int rc;

	rc = store_ensure_prepared(s);
	if (rc != 0)
		return rc;
	/* The first sample reads W and who may still commit below it; the second, a moment
	 * later, settles W if they have all ended (the producers' transactions are short). */
	if ((rc = sample(s)) != 0)
		return rc;
	target = s->wm.last_w;
	if (watermark_safe(&s->wm) < target && (rc = sample(s)) != 0)
		return rc;
	return watermark_safe(&s->wm) >= target ? 0 : 1;
}

bool store_keys_more(const struct store *s)
{
	return s->has_cursor;
}

void store_keys_restart(struct store *s)
{
	s->has_cursor = false;
}

bool store_keys_settling(const struct store *s)
{
	return watermark_settling(&s->wm);
}
