/* What happens to claimed rows afterwards — marked published (or deleted), charged a failure,
 * released, their lease renewed — each one statement for the whole batch and fenced by the
 * claim's token; and the wake-up: taking its lock, draining notifications. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "store/store.h"
#include "store/source/lease.h"
#include "store/store_private.h"

static int need_token(struct store *s, const char *token)
{
	if (!token || !token[0]) {
		store_set_error(s, "internal error: a write without its claim's token");
		return STORE_ERR_FATAL;
	}
	return 0;
}

static int64_t int64_at(const void *items, size_t i)
{
	return ((const int64_t *)items)[i];
}

int store_mark_params(struct store *s, const char *token, const int64_t *seqs, size_t n,
                      const char **ids)
{
	int rc;

	if ((rc = store_ensure_prepared(s)) != 0 || (rc = need_token(s, token)) != 0)
		return rc;
	return store_int_array(s, STORE_SLOT_IDS, seqs, n, int64_at, ids);
}

int store_mark_published_send(struct store *s, const char *token, const int64_t *seqs, size_t n,
                              bool delete_rows)
{
	const char *params[2];
	int rc;

	if ((rc = store_mark_params(s, token, seqs, n, &params[0])) != 0)
		return rc;
	if (n == 0) {
		s->inflight = STORE_INFLIGHT_MARK_NOOP;
		return 0;
	}
	params[1] = token;
	return store_send_prepared(s, delete_rows ? ST_DELETE : ST_MARK, 2, params,
	                           STORE_INFLIGHT_MARK, "could not mark rows published");
}

int store_mark_published_recv(struct store *s, size_t *n_changed)
{
	PGresult *res;
	int64_t v = 0;
	int rc = 0;

	if (s->inflight == STORE_INFLIGHT_MARK_NOOP) {
		s->inflight = STORE_INFLIGHT_NONE;
		if (n_changed)
			*n_changed = 0;
		return 0;
	}
	if (!s->conn || s->inflight != STORE_INFLIGHT_MARK) {
		store_set_error(s, "no mark is waiting for its result");
		return s->conn ? STORE_ERR_QUERY : STORE_ERR_CONN;
	}
	res = store_collect(s);
	if (PQresultStatus(res) != PGRES_COMMAND_OK) {
		rc = store_result_error(s, res, "could not mark rows published");
	} else {
		if (store_parse_int64(PQcmdTuples(res), &v) != 0)
			v = 0;
		if (n_changed)
			*n_changed = (size_t)v;
	}
	PQclear(res);
	return rc;
}

int store_mark_published(struct store *s, const char *token, const int64_t *seqs, size_t n,
                         bool delete_rows)
{
	int rc = store_mark_published_send(s, token, seqs, n, delete_rows);

	if (rc != 0)
		return rc;
	return store_mark_published_recv(s, NULL);
}

static const char *failure_id_at(const void *items, size_t i)
{
	return ((const struct store_failure *)items)[i].id;
}

static const char *failure_error_at(const void *items, size_t i)
{
	const char *e = ((const struct store_failure *)items)[i].error;
	return e ? e : "";
}

static int64_t failure_delay_at(const void *items, size_t i)
{
	int64_t d = ((const struct store_failure *)items)[i].delay_ms;
	return d > 0 ? d : 0;
}

static bool failure_dead_at(const void *items, size_t i)
{
	return ((const struct store_failure *)items)[i].dead;
}

static bool failure_counted_at(const void *items, size_t i)
{
	return !((const struct store_failure *)items)[i].uncounted;
}

int store_mark_failed(struct store *s, const char *token, const struct store_failure *f, size_t n,
                      size_t *n_changed)
{
	const char *params[7];
	char max[16];
	int rc;

	if ((rc = store_ensure_prepared(s)) != 0 || (rc = need_token(s, token)) != 0)
		return rc;
	if (n == 0) {
		if (n_changed)
			*n_changed = 0;
		return 0;
	}
	snprintf(max, sizeof(max), "%d", s->opts.max_attempts);
	if ((rc = store_text_array(s, STORE_SLOT_IDS, f, n, failure_id_at, false, &params[0])) !=
	            0 ||
	    (rc = store_text_array(s, STORE_SLOT_ERRORS, f, n, failure_error_at, true,
	                           &params[1])) != 0 ||
	    (rc = store_int_array(s, STORE_SLOT_DELAYS, f, n, failure_delay_at, &params[2])) != 0 ||
	    (rc = store_bool_array(s, STORE_SLOT_DEAD, f, n, failure_dead_at, &params[3])) != 0 ||
	    (rc = store_bool_array(s, STORE_SLOT_COUNTED, f, n, failure_counted_at, &params[6])) !=
	            0)
		return rc;
	params[4] = max;
	params[5] = token;
	return store_exec_prepared(s, ST_FAIL, 7, params, PGRES_COMMAND_OK, n_changed, NULL,
	                           "could not mark rows failed");
}

int store_release(struct store *s, const char *token, const char *const *ids, size_t n)
{
	const char *params[2];
	int rc;

	if ((rc = store_ensure_prepared(s)) != 0 || (rc = need_token(s, token)) != 0)
		return rc;
	if (n == 0)
		return 0;
	rc = store_text_array(s, STORE_SLOT_IDS, ids, n, store_string_at, false, &params[0]);
	if (rc != 0)
		return rc;
	params[1] = token;
	return store_exec_prepared(s, ST_RELEASE, 2, params, PGRES_COMMAND_OK, NULL, NULL,
	                           "could not release leases");
}

int store_release_claims(struct store *s, const char *const *stems, size_t n)
{
	const char *params[1];
	int rc;

	if ((rc = store_ensure_prepared(s)) != 0)
		return rc;
	for (size_t i = 0; i < n; i++) {
		size_t len = stems[i] ? strlen(stems[i]) : 0;

		/* A stem ends with the '.' before the counter: anything else could match the
		 * tokens of another process. */
		if (len < 3 || stems[i][len - 1] != '.' || !strchr(stems[i], '#')) {
			store_set_error(s, "internal error: '%s' is not a claim token's stem",
			                stems[i] ? stems[i] : "");
			return STORE_ERR_FATAL;
		}
	}
	if (n == 0)
		return 0;
	rc = store_text_array(s, STORE_SLOT_IDS, stems, n, store_string_at, false, &params[0]);
	if (rc != 0)
		return rc;
	return store_exec_prepared(s, ST_RELEASE_ALL, 1, params, PGRES_COMMAND_OK, NULL, NULL,
	                           "could not release leases");
}

int store_release_all(struct store *s)
{
	char stem[STORE_TOKEN_MAX];
	const char *stems[1] = { stem };

	if (store_token_stem(s, stem, sizeof(stem)) != 0) {
		store_set_error(s, "internal error: claim token too long");
		return STORE_ERR_FATAL;
	}
	return store_release_claims(s, stems, 1);
}

static const char *row_id_at(const void *items, size_t i)
{
	return ((const struct outbox_row *)items)[i].id;
}

int store_renew(struct store *s, struct store_batch *b)
{
	const char *params[3];
	char lease[24];
	PGresult *res = NULL;
	int64_t sent = clock_mono_ms(), left = -1;
	size_t k = 0;
	int rc;

	if ((rc = store_ensure_prepared(s)) != 0 || (rc = need_token(s, b->token)) != 0)
		return rc;
	if (b->n == 0)
		return 0;
	rc = store_text_array(s, STORE_SLOT_IDS, b->rows, b->n, row_id_at, false, &params[0]);
	if (rc != 0)
		return rc;
	snprintf(lease, sizeof(lease), "%lld", (long long)s->opts.lease_ms);
	params[1] = b->token;
	params[2] = lease;
	rc = store_exec_prepared(s, ST_RENEW, 3, params, PGRES_TUPLES_OK, NULL, &res,
	                         "could not renew leases");
	if (rc != 0)
		return rc;
	/* Keep the rows the answer names, in their order (a small batch: quadratic is fine
	 * next to the round trip, and allocates nothing). */
	for (size_t i = 0; i < b->n; i++) {
		bool kept = false;

		for (int r = 0; r < PQntuples(res) && !kept; r++) {
			if (strcmp(PQgetvalue(res, r, 0), b->rows[i].id) == 0) {
				kept = true;
				if (left < 0 &&
				    store_parse_int64(PQgetvalue(res, r, 1), &left) != 0)
					left = 0;
			}
		}
		if (kept)
			b->rows[k++] = b->rows[i];
	}
	b->n = k;
	b->lease_deadline_ms = sent + (left > 0 ? left : 0);
	PQclear(res);
	return 0;
}

/* ---- wake-up ---- */

int store_arm(struct store *s)
{
	PGresult *res = NULL;
	int rc;

	rc = store_ensure_prepared(s);
	if (rc != 0)
		return rc;
	if (s->armed)
		return 1;
	rc = store_exec_prepared(s, ST_ARM, 0, NULL, PGRES_TUPLES_OK, NULL, &res,
	                         "could not arm the wake-up");
	if (rc != 0)
		return rc;
	s->armed = PQntuples(res) == 1 && PQgetvalue(res, 0, 0)[0] == 't';
	PQclear(res);
	return s->armed ? 1 : 0;
}

int store_disarm(struct store *s)
{
	int rc;

	rc = store_exec(s, "SELECT pg_advisory_unlock_all()", 0, NULL, PGRES_TUPLES_OK, NULL,
	                "could not disarm the wake-up");
	if (rc == 0)
		s->armed = false;
	return rc;
}

int store_consume_input(struct store *s, bool *woken)
{
	PGnotify *n;
	bool got = false;

	/* Also while a request waits for its answer: reading the socket only buffers it. */
	if (!s->conn || PQstatus(s->conn) != CONNECTION_OK) {
		store_set_line(s, "not connected to PostgreSQL", NULL);
		return STORE_ERR_CONN;
	}
	if (!PQconsumeInput(s->conn)) {
		store_set_line(s, "could not read from PostgreSQL", PQerrorMessage(s->conn));
		return PQstatus(s->conn) == CONNECTION_BAD ? STORE_ERR_CONN : STORE_ERR_QUERY;
	}
	while ((n = PQnotifies(s->conn)) != NULL) {
		if (s->opts.channel && strcmp(n->relname, s->opts.channel) == 0)
			got = true;
		PQfreemem(n);
		/* Anything else that arrived (more notifications) is already buffered. */
	}
	*woken = got;
	return 0;
}
