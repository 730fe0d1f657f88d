/* The operator statements on a table the cursor source runs (its position row exists): the same
 * gauges, lists and purge as admin.c's, by the cursor's definitions (docs/design.md, "The
 * cursor source"). Rows behind the position carry nothing when published, so "unpublished"
 * is read from two places: the rows above the position (a range of the seq index) and the
 * deferred rows below it (the deferred index). Neither grows with the rows kept for the
 * retention. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store.h"
#include "store/operator/admin.h"
#include "store/operator/admin_private.h"
#include "store/store_private.h"

/* The keys whose oldest unpublished row blocks them (failed and waiting, or dead; under
 * skip-dead a dead row is set aside). Such a row is deferred, so the keys are found in the
 * deferred index, one descent per key, and each key's head there is its oldest deferred row.
 * That is the key's oldest unpublished row unless a row of the key above the position comes
 * before it (a deferred row above the position: the relay is passing it right now). Follows
 * "WITH RECURSIVE". $1 = max_attempts, p = the position's parameter. */
static int blocked_cte(struct store *s, const char *p, char *out, size_t cap)
{
	const char *t = s->table, *sd = s->opts.skip_dead ? " AND o.attempts < $1::int" : "";

	return store_format_sql(
	        s, out, cap,
	        "keys(k) AS ((SELECT ordering_key::text FROM %s WHERE deferred_at IS NOT NULL"
	        " AND published_at IS NULL AND ordering_key IS NOT NULL"
	        " ORDER BY ordering_key LIMIT 1)"
	        " UNION ALL SELECT (SELECT o.ordering_key::text FROM %s o"
	        " WHERE o.deferred_at IS NOT NULL AND o.published_at IS NULL"
	        " AND o.ordering_key IS NOT NULL AND o.ordering_key > keys.k"
	        " ORDER BY o.ordering_key LIMIT 1) FROM keys WHERE keys.k IS NOT NULL),"
	        " heads AS (SELECT h.* FROM keys CROSS JOIN LATERAL (SELECT id, exchange_name,"
	        " routing_key, ordering_key, last_error, attempts, created_at, available_at, seq"
	        " FROM %s o WHERE o.ordering_key = keys.k AND o.deferred_at IS NOT NULL"
	        " AND o.published_at IS NULL%s ORDER BY o.seq LIMIT 1) h"
	        " WHERE keys.k IS NOT NULL),"
	        " blocked AS (SELECT * FROM heads h WHERE (h.attempts >= $1::int"
	        " OR (h.attempts > 0 AND h.available_at > now()))"
	        " AND (h.seq <= %s::bigint OR NOT EXISTS (SELECT 1 FROM %s o"
	        " WHERE o.ordering_key = h.ordering_key AND o.seq > %s::bigint"
	        " AND o.seq < h.seq AND o.published_at IS NULL%s)))",
	        t, t, t, sd, p, t, p, sd);
}

#define ABOVE_2    CURSOR_ABOVE("", "$2")
#define DEFERRED_2 CURSOR_DEFERRED("", "$2")

/* The status statement (admin_status_sql()) over a cursor table's unpublished rows: those above
 * the position and the deferred ones below it; leased are the deferred rows the cursor's
 * exception path holds under a lease right now. */
int admin_cursor_status_sql(struct store *s, char *sql, size_t cap)
{
	char cte[ADMIN_SQL_MAX], rows[ADMIN_SQL_MAX];
	int rc;

	if ((rc = blocked_cte(s, "$2", cte, sizeof(cte))) != 0 ||
	    (rc = store_format_sql(s, rows, sizeof(rows),
	                           "SELECT attempts, created_at, deferred_at IS NOT NULL"
	                           " AND COALESCE(" STORE_LIVE_LEASE ", false) AS leased FROM %s"
	                           " WHERE " ABOVE_2 " UNION ALL SELECT attempts, created_at,"
	                           " COALESCE(" STORE_LIVE_LEASE
	                           ", false) FROM %s WHERE " DEFERRED_2,
	                           s->table, s->table)) != 0)
		return rc;
	return admin_status_sql(s, cte, rows, sql, cap);
}

int admin_cursor_count_published_sql(struct store *s, char *sql, size_t cap)
{
	return store_format_sql(s, sql, cap,
	                        "SELECT count(*) FROM %s WHERE (seq <= $1::bigint AND deferred_at"
	                        " IS NULL) OR published_at IS NOT NULL",
	                        s->table);
}

/* Rows above the position ($3) and deferred rows behind it, as the dead and blocked lists have
 * it. */
#define ABOVE_3    CURSOR_ABOVE("", "$3")
#define DEFERRED_3 CURSOR_DEFERRED("", "$3")

int admin_cursor_dead_sql(struct store *s, char *sql, size_t cap)
{
	return store_format_sql(s, sql, cap,
	                        "SELECT " LIST_COLUMNS " FROM (SELECT * FROM %s WHERE " ABOVE_3
	                        " AND attempts >= $1::int UNION ALL SELECT * FROM %s"
	                        " WHERE " DEFERRED_3 " AND attempts >= $1::int) d"
	                        " ORDER BY seq LIMIT $2::bigint",
	                        s->table, s->table);
}

int admin_cursor_blocked_sql(struct store *s, char *sql, size_t cap)
{
	char cte[ADMIN_SQL_MAX];
	int rc;

	if ((rc = blocked_cte(s, "$3", cte, sizeof(cte))) != 0)
		return rc;
	return store_format_sql(s, sql, cap,
	                        "WITH RECURSIVE %s SELECT " LIST_COLUMNS
	                        " FROM blocked ORDER BY seq LIMIT $2::bigint",
	                        cte);
}

/* Deferred dead rows behind the position; deferred_at stays set, so that the cursor's
 * exception path takes the row up. A lease that has run out is cleared, a live one kept. */
int admin_cursor_requeue_dead_sql(struct store *s, char *sql, size_t cap)
{
	return store_format_sql(
	        s, sql, cap,
	        "UPDATE %s SET attempts = 0, last_error = NULL, available_at = now(),"
	        " locked_by = CASE WHEN " STORE_LIVE_LEASE " THEN locked_by END,"
	        " locked_until = CASE WHEN " STORE_LIVE_LEASE " THEN locked_until END"
	        " WHERE " DEFERRED_2 " AND attempts >= $1::int",
	        s->table);
}

/* The slice: up to $2 rows above $4 and behind the position, in seq order. Of those before the
 * first one younger than the cut-off, the ones the cursor published (never deferred, no
 * published_at: a deferred row that was published later goes by its published_at, with the
 * published index) are deleted, each checked again as it is deleted (a replay may have made
 * it pending meanwhile). Answers: deleted, rows looked at, the last seq looked at, and the
 * seq of the first young row (NULL when none). */
int admin_cursor_purge_sql(struct store *s, char *sql, size_t cap)
{
	return store_format_sql(
	        s, sql, cap,
	        "WITH slice AS MATERIALIZED (SELECT seq, created_at < now() - $1::bigint"
	        " * interval '1 millisecond' AS old, deferred_at IS NULL AND published_at IS NULL"
	        " AS done FROM %s WHERE seq > $4::bigint AND seq <= $3::bigint ORDER BY seq"
	        " LIMIT $2::int),"
	        " edge AS (SELECT min(seq) AS young FROM slice WHERE NOT old),"
	        " gone AS (DELETE FROM %s WHERE seq = ANY (ARRAY(SELECT slice.seq FROM slice, edge"
	        " WHERE slice.done AND (edge.young IS NULL OR slice.seq < edge.young)))"
	        " AND seq <= $3::bigint AND deferred_at IS NULL AND published_at IS NULL"
	        " RETURNING 1)"
	        " SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM slice),"
	        " (SELECT max(seq) FROM slice), (SELECT young FROM edge)",
	        s->table, s->table);
}

int admin_cursor_purge(struct store *s, int64_t pos, int64_t older_than_ms, int batch,
                       const atomic_int *stop, int64_t *n_deleted)
{
	char sql[ADMIN_SQL_MAX], age[24], lim[16], p[24], floor[24];
	const char *params[4] = { age, lim, p, floor };
	int64_t total = 0;
	int rc;

	snprintf(age, sizeof(age), "%lld", (long long)(older_than_ms > 0 ? older_than_ms : 0));
	snprintf(lim, sizeof(lim), "%d", batch > 0 ? batch : 1000);
	snprintf(p, sizeof(p), "%lld", (long long)pos);
	snprintf(floor, sizeof(floor), "%lld", (long long)INT64_MIN);
	if ((rc = admin_cursor_purge_sql(s, sql, sizeof(sql))) != 0)
		return rc;
	for (;;) {
		PGresult *res = NULL;
		int64_t n = 0, seen = 0;
		bool young;

		if (stop && atomic_load(stop))
			break;
		rc = store_exec(s, sql, 4, params, PGRES_TUPLES_OK, &res, "could not purge");
		if (rc != 0)
			return rc;
		if (store_parse_int64(PQgetvalue(res, 0, 0), &n) != 0 ||
		    store_parse_int64(PQgetvalue(res, 0, 1), &seen) != 0) {
			PQclear(res);
			store_set_error(s, "could not read the number of purged rows");
			return STORE_ERR_QUERY;
		}
		total += n;
		young = !PQgetisnull(res, 0, 3);
		if (!PQgetisnull(res, 0, 2))
			snprintf(floor, sizeof(floor), "%s", PQgetvalue(res, 0, 2));
		PQclear(res);
		if (young || seen < (batch > 0 ? batch : 1000))
			break;
	}
	*n_deleted = total;
	return 0;
}
