/* Operator queries on the outbox: status counts, dead rows, blocked ordering keys, requeue,
 * discard and the retention purge. Run from the CLI or the maintenance thread, never on the
 * claim path, so they use unnamed statements (nothing to prepare before `migrate`). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/outbox_store.h"
#include "store/store_private.h"

#define ADMIN_SQL_MAX 4096

/* ISO 8601 in UTC, so the CLI output does not depend on the session's time zone. */
#define ISO(col) "to_char(" col " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"

static int parse_double(const char *v, double *out)
{
	char *end;
	double x;

	errno = 0;
	x = strtod(v, &end);
	if (errno != 0 || end == v || *end != '\0')
		return -1;
	*out = x;
	return 0;
}

/* Formats a statement into sql[cap]; 0, or STORE_ERR_FATAL when it does not fit. */
static int build_sql(struct store *s, char *sql, size_t cap, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));

static int build_sql(struct store *s, char *sql, size_t cap, const char *fmt, ...)
{
	va_list ap;
	int w;

	va_start(ap, fmt);
	w = vsnprintf(sql, cap, fmt, ap);
	va_end(ap);
	if (w < 0 || (size_t)w >= cap) {
		store_set_error(s, "statement text too long");
		return STORE_ERR_FATAL;
	}
	return 0;
}

/* The head rows (oldest unpublished) of every ordering key, and which of them block their
 * key: dead, or failed and waiting in backoff. Under skip-dead a dead row is set aside, so
 * the head is the oldest row that is not dead. $1 = max_attempts. */
static int blocked_cte(struct store *s, char *out, size_t cap)
{
	return build_sql(s, out, cap,
	                 "heads AS (SELECT DISTINCT ON (ordering_key) id, exchange_name,"
	                 " routing_key, ordering_key, last_error, attempts, created_at,"
	                 " available_at, seq FROM %s WHERE published_at IS NULL"
	                 " AND ordering_key IS NOT NULL%s ORDER BY ordering_key, seq),"
	                 " blocked AS (SELECT * FROM heads WHERE attempts >= $1::int"
	                 " OR (attempts > 0 AND available_at > now()))",
	                 s->table, s->opts.skip_dead ? " AND attempts < $1::int" : "");
}

int store_status(struct store *s, struct store_status *st)
{
	char cte[ADMIN_SQL_MAX], sql[ADMIN_SQL_MAX * 2], max[16];
	const char *params[1] = { max };
	struct store_status r;
	PGresult *res = NULL;
	int rc;

	memset(&r, 0, sizeof(r));
	rc = blocked_cte(s, cte, sizeof(cte));
	if (rc != 0)
		goto out;
	snprintf(max, sizeof(max), "%d", s->opts.max_attempts);
	if ((rc = build_sql(
	             s, sql, sizeof(sql),
	             "WITH u AS (SELECT attempts, locked_until, created_at FROM %s"
	             " WHERE published_at IS NULL), %s"
	             " SELECT (SELECT count(*) FROM u WHERE attempts < $1::int),"
	             " (SELECT count(*) FROM u WHERE attempts < $1::int AND locked_until >= now()),"
	             " (SELECT count(*) FROM u WHERE attempts >= $1::int),"
	             " (SELECT count(*) FROM %s WHERE published_at IS NOT NULL),"
	             " (SELECT COALESCE(extract(epoch FROM now() - min(created_at)), 0)::float8"
	             "  FROM u WHERE attempts < $1::int),"
	             " (SELECT count(*) FROM blocked),"
	             " (SELECT ordering_key FROM blocked ORDER BY seq LIMIT 1),"
	             " (SELECT extract(epoch FROM now() - created_at)::float8 FROM blocked"
	             "  ORDER BY seq LIMIT 1)",
	             s->table, cte, s->table)) != 0)
		goto out;
	rc = store_exec(s, sql, 1, params, PGRES_TUPLES_OK, &res, "could not read the status");
	if (rc != 0)
		goto out;
	if (PQntuples(res) != 1 || store_parse_int64(PQgetvalue(res, 0, 0), &r.pending) != 0 ||
	    store_parse_int64(PQgetvalue(res, 0, 1), &r.leased) != 0 ||
	    store_parse_int64(PQgetvalue(res, 0, 2), &r.dead) != 0 ||
	    store_parse_int64(PQgetvalue(res, 0, 3), &r.published) != 0 ||
	    parse_double(PQgetvalue(res, 0, 4), &r.oldest_pending_age_s) != 0 ||
	    store_parse_int64(PQgetvalue(res, 0, 5), &r.blocked_keys) != 0) {
		store_set_error(s, "status query returned something unreadable");
		rc = STORE_ERR_QUERY;
		goto out;
	}
	if (!PQgetisnull(res, 0, 6)) {
		snprintf(r.oldest_blocked_key, sizeof(r.oldest_blocked_key), "%s",
		         PQgetvalue(res, 0, 6));
		if (parse_double(PQgetvalue(res, 0, 7), &r.oldest_blocked_age_s) != 0)
			r.oldest_blocked_age_s = 0;
	}
	if (r.oldest_pending_age_s < 0)
		r.oldest_pending_age_s = 0;
	*st = r;
	rc = 0;
out:
	PQclear(res);
	return rc;
}

void store_list_free(struct store_list *l)
{
	if (!l)
		return;
	for (size_t i = 0; i < l->n; i++) {
		struct store_listed *it = &l->items[i];
		free(it->id);
		free(it->exchange);
		free(it->routing_key);
		free(it->ordering_key);
		free(it->last_error);
		free(it->created_at);
		free(it->available_at);
	}
	free(l->items);
	l->items = NULL;
	l->n = 0;
}

static char *dup_value(const PGresult *res, int row, int col, bool *failed)
{
	char *v;

	if (PQgetisnull(res, row, col))
		return NULL;
	v = strdup(PQgetvalue(res, row, col));
	if (!v)
		*failed = true;
	return v;
}

/* Columns: id, exchange, routing key, ordering key, last_error, attempts, created, available. */
#define LIST_COLUMNS                                                                \
	"id, exchange_name, routing_key, ordering_key, last_error, attempts, " ISO( \
	        "created_at") ", " ISO("available_at")

static int run_list(struct store *s, const char *sql, size_t limit, struct store_list *out,
                    const char *what)
{
	char max[16], lim[24];
	const char *params[2] = { max, limit ? lim : NULL };
	struct store_list l = { NULL, 0 };
	PGresult *res = NULL;
	bool failed = false;
	int rc;

	snprintf(max, sizeof(max), "%d", s->opts.max_attempts);
	snprintf(lim, sizeof(lim), "%zu", limit);
	rc = store_exec(s, sql, 2, params, PGRES_TUPLES_OK, &res, what);
	if (rc != 0)
		goto out;
	if (PQntuples(res) > 0) {
		l.items = calloc((size_t)PQntuples(res), sizeof(*l.items));
		if (!l.items) {
			failed = true;
			goto check;
		}
	}
	for (int i = 0; i < PQntuples(res); i++) {
		struct store_listed *it = &l.items[i];
		int64_t attempts = 0;

		l.n++;
		it->id = dup_value(res, i, 0, &failed);
		it->exchange = dup_value(res, i, 1, &failed);
		it->routing_key = dup_value(res, i, 2, &failed);
		it->ordering_key = dup_value(res, i, 3, &failed);
		it->last_error = dup_value(res, i, 4, &failed);
		if (store_parse_int64(PQgetvalue(res, i, 5), &attempts) == 0)
			it->attempts = (int)attempts;
		it->created_at = dup_value(res, i, 6, &failed);
		it->available_at = dup_value(res, i, 7, &failed);
	}
check:
	if (failed) {
		store_list_free(&l);
		store_set_error(s, "out of memory");
		rc = STORE_ERR_NOMEM;
		goto out;
	}
	*out = l;
	rc = 0;
out:
	PQclear(res);
	return rc;
}

/* Ownership: *out is filled with a new list (store_list_free()) only on success. */
int store_dead(struct store *s, size_t limit, struct store_list *out)
{
	char sql[ADMIN_SQL_MAX];
	int rc;

	if ((rc = build_sql(s, sql, sizeof(sql),
	                    "SELECT " LIST_COLUMNS " FROM %s WHERE published_at IS NULL"
	                    " AND attempts >= $1::int ORDER BY seq LIMIT $2::bigint",
	                    s->table)) != 0)
		return rc;
	return run_list(s, sql, limit, out, "could not list dead rows");
}

/* Ownership: as store_dead(). */
int store_blocked_keys(struct store *s, size_t limit, struct store_list *out)
{
	char cte[ADMIN_SQL_MAX], sql[ADMIN_SQL_MAX * 2];
	int rc;

	if ((rc = blocked_cte(s, cte, sizeof(cte))) != 0)
		return rc;
	if ((rc = build_sql(s, sql, sizeof(sql),
	                    "WITH %s SELECT " LIST_COLUMNS
	                    " FROM blocked ORDER BY seq LIMIT $2::bigint",
	                    cte)) != 0)
		return rc;
	return run_list(s, sql, limit, out, "could not list blocked keys");
}

static int changed_count(struct store *s, PGresult *res, int64_t *out)
{
	if (store_parse_int64(PQcmdTuples(res), out) != 0) {
		store_set_error(s, "could not read the number of changed rows");
		return STORE_ERR_QUERY;
	}
	return 0;
}

/* ids are borrowed. A requeue also notifies the channel once, so a relay asleep until its
 * next poll picks the rows up now. */
int store_requeue(struct store *s, const char *const *ids, size_t n, bool all_dead,
                  int64_t *n_changed)
{
	char sql[ADMIN_SQL_MAX], max[16];
	const char *params[1];
	PGresult *res = NULL;
	int64_t changed = 0;
	int rc;

	if (!all_dead && n == 0) {
		*n_changed = 0;
		return 0;
	}
	if (all_dead) {
		snprintf(max, sizeof(max), "%d", s->opts.max_attempts);
		params[0] = max;
	} else {
		rc = store_text_array(s, STORE_SLOT_IDS, ids, n, store_string_at, false,
		                      &params[0]);
		if (rc != 0)
			goto out;
	}
	if ((rc = build_sql(
	             s, sql, sizeof(sql),
	             "UPDATE %s SET attempts = 0, last_error = NULL, available_at = now(),"
	             " locked_by = NULL, locked_until = NULL WHERE published_at IS NULL AND %s",
	             s->table, all_dead ? "attempts >= $1::int" : "id = ANY($1::text[])")) != 0)
		goto out;
	rc = store_exec(s, sql, 1, params, PGRES_COMMAND_OK, &res, "could not requeue");
	if (rc != 0)
		goto out;
	if ((rc = changed_count(s, res, &changed)) != 0)
		goto out;
	if (changed > 0 && s->opts.channel && s->opts.channel[0]) {
		const char *ch[1] = { s->opts.channel };
		/* The rows are requeued already; a failed notify only delays them to the next
		 * poll, so it is not reported as a failure of the requeue. */
		PGresult *nres = PQexecParams(s->conn, "SELECT pg_notify($1, '')", 1, NULL, ch,
		                              NULL, NULL, 0);
		PQclear(nres);
	}
	*n_changed = changed;
	rc = 0;
out:
	PQclear(res);
	return rc;
}

/* ids are borrowed. Published rows are left to the purge. */
int store_discard(struct store *s, const char *const *ids, size_t n, int64_t *n_changed)
{
	char sql[ADMIN_SQL_MAX];
	const char *params[1];
	PGresult *res = NULL;
	int64_t changed = 0;
	int rc;

	if (n == 0) {
		*n_changed = 0;
		return 0;
	}
	rc = store_text_array(s, STORE_SLOT_IDS, ids, n, store_string_at, false, &params[0]);
	if (rc != 0)
		goto out;
	if ((rc = build_sql(s, sql, sizeof(sql),
	                    "DELETE FROM %s WHERE published_at IS NULL AND id = ANY($1::text[])",
	                    s->table)) != 0)
		goto out;
	rc = store_exec(s, sql, 1, params, PGRES_COMMAND_OK, &res, "could not discard");
	if (rc != 0)
		goto out;
	if ((rc = changed_count(s, res, &changed)) != 0)
		goto out;
	*n_changed = changed;
out:
	PQclear(res);
	return rc;
}

/* Deletes in slices of `batch` rows, each its own short transaction, so that the purge
 * never holds many row locks or one long snapshot while the relay works. Old published rows
 * sit at the low end of seq, which the unique seq index walks in order. */
int store_purge(struct store *s, int64_t older_than_ms, int batch, const atomic_int *stop,
                int64_t *n_deleted)
{
	char sql[ADMIN_SQL_MAX], age[24], lim[16];
	const char *params[2] = { age, lim };
	int64_t total = 0;
	int rc;

	snprintf(age, sizeof(age), "%lld", (long long)(older_than_ms > 0 ? older_than_ms : 0));
	snprintf(lim, sizeof(lim), "%d", batch > 0 ? batch : 1000);
	if ((rc = build_sql(s, sql, sizeof(sql),
	                    "DELETE FROM %s WHERE seq IN (SELECT seq FROM %s"
	                    " WHERE published_at IS NOT NULL"
	                    " AND published_at < now() - $1::bigint * interval '1 millisecond'"
	                    " ORDER BY seq LIMIT $2::int)",
	                    s->table, s->table)) != 0)
		return rc;
	for (;;) {
		PGresult *res = NULL;
		int64_t n = 0;

		if (stop && atomic_load(stop))
			break;
		rc = store_exec(s, sql, 2, params, PGRES_COMMAND_OK, &res, "could not purge");
		if (rc != 0)
			return rc;
		rc = changed_count(s, res, &n);
		PQclear(res);
		if (rc != 0)
			return rc;
		total += n;
		if (n < (batch > 0 ? batch : 1000))
			break;
	}
	*n_deleted = total;
	return 0;
}
