/* Operator queries on the outbox: status counts, dead rows, blocked ordering keys, requeue,
 * discard and the retention purge. Run from the CLI or the maintenance thread, never on the
 * claim path, so they use unnamed statements (nothing to prepare before `migrate`). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store.h"
#include "store/operator/partitions.h"
#include "store/operator/admin.h"
#include "store/operator/admin_private.h"
#include "store/store_private.h"

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

/* The head rows (oldest unpublished) of every ordering key, and which of them block their
 * key: dead, or failed and waiting in backoff. Under skip-dead a dead row is set aside, so
 * the head is the oldest row that is not dead. The keys are found as the claim finds them
 * (store/statements.c): one descent of the key index per key, so the cost is O(keys), not
 * O(rows queued behind the heads). Follows "WITH RECURSIVE". $1 = max_attempts. */
static int blocked_cte(struct store *s, char *out, size_t cap)
{
	return store_format_sql(
	        s, out, cap,
	        "keys(k) AS ((SELECT ordering_key::text FROM %s WHERE published_at IS NULL"
	        " AND ordering_key IS NOT NULL ORDER BY ordering_key LIMIT 1)"
	        " UNION ALL SELECT (SELECT o.ordering_key::text FROM %s o"
	        " WHERE o.published_at IS NULL AND o.ordering_key IS NOT NULL"
	        " AND o.ordering_key > keys.k ORDER BY o.ordering_key LIMIT 1)"
	        " FROM keys WHERE keys.k IS NOT NULL),"
	        " heads AS (SELECT h.* FROM keys CROSS JOIN LATERAL (SELECT id, exchange_name,"
	        " routing_key, ordering_key, last_error, attempts, created_at, available_at, seq"
	        " FROM %s o WHERE o.ordering_key = keys.k AND o.published_at IS NULL%s"
	        " ORDER BY o.seq LIMIT 1) h WHERE keys.k IS NOT NULL),"
	        " blocked AS (SELECT * FROM heads WHERE attempts >= $1::int"
	        " OR (attempts > 0 AND available_at > now()))",
	        s->table, s->table, s->table, s->opts.skip_dead ? " AND o.attempts < $1::int" : "");
}

/* A published-row count above this many pages is estimated (see store_status()); below it
 * the table is small enough to count: at most 1 MiB of pages read. */
#define COUNT_PUBLISHED_MAX_PAGES 128

/* The gauges cost O(unpublished rows), never O(table): with days of retention the table holds
 * millions of published rows, and this runs every few seconds. Pending, leased, dead and the
 * oldest age walk the unkeyed and key indexes (unpublished rows only); blocked keys read one
 * head per key;
 * published rows are the table's live-row estimate (the statistics' n_live_tup, or
 * reltuples before any were collected) less the unpublished rows, clamped at 0. The last
 * column is the table's size in pages, by which store_status() decides whether to count the
 * published rows instead. $1 = max_attempts. */
int admin_status_sql(struct store *s, const char *cte, const char *rows, char *sql, size_t cap)
{
	return store_format_sql(
	        s, sql, cap,
	        "WITH RECURSIVE %s SELECT u.pending, u.leased, u.dead,"
	        " GREATEST(0, (SELECT sum(CASE WHEN pg_stat_get_live_tuples(c.oid) > 0"
	        " THEN pg_stat_get_live_tuples(c.oid) ELSE GREATEST(c.reltuples, 0)::bigint END)"
	        " FROM pg_class c WHERE c.oid IN (SELECT '%s'::regclass UNION ALL SELECT relid"
	        " FROM pg_partition_tree('%s'::regclass) WHERE isleaf)) - u.pending - u.dead),"
	        " u.oldest,"
	        " (SELECT count(*) FROM blocked),"
	        " (SELECT ordering_key FROM blocked ORDER BY seq LIMIT 1),"
	        " (SELECT extract(epoch FROM now() - created_at)::float8 FROM blocked"
	        "  ORDER BY seq LIMIT 1),"
	        " (SELECT sum(pg_relation_size(relid)) FROM (SELECT '%s'::regclass AS relid"
	        " UNION ALL SELECT relid FROM pg_partition_tree('%s'::regclass) WHERE isleaf) "
	        "t)::bigint"
	        " / current_setting('block_size')::bigint"
	        " FROM (SELECT count(*) FILTER (WHERE attempts < $1::int) AS pending,"
	        " count(*) FILTER (WHERE attempts < $1::int AND leased) AS leased,"
	        " count(*) FILTER (WHERE attempts >= $1::int) AS dead,"
	        " COALESCE(extract(epoch FROM now() - min(created_at)"
	        " FILTER (WHERE attempts < $1::int)), 0)::float8 AS oldest"
	        " FROM (%s) x) u",
	        cte, s->table, s->table, s->table, s->table, rows);
}

static int status_sql(struct store *s, char *sql, size_t cap)
{
	char cte[ADMIN_SQL_MAX], rows[ADMIN_SQL_MAX];
	int rc;

	if ((rc = blocked_cte(s, cte, sizeof(cte))) != 0 ||
	    (rc = store_format_sql(s, rows, sizeof(rows),
	                           "SELECT attempts, created_at, locked_until >= now() AS leased"
	                           " FROM %s WHERE " STORE_UNPUBLISHED(""),
	                           s->table)) != 0)
		return rc;
	return admin_status_sql(s, cte, rows, sql, cap);
}

/* Reads status_sql()'s answer (or the cursor's) into r and the table's size into *pages. */
static int parse_status(struct store *s, const PGresult *res, struct store_status *r,
                        int64_t *pages)
{
	if (PQntuples(res) != 1 || store_parse_int64(PQgetvalue(res, 0, 0), &r->pending) != 0 ||
	    store_parse_int64(PQgetvalue(res, 0, 1), &r->leased) != 0 ||
	    store_parse_int64(PQgetvalue(res, 0, 2), &r->dead) != 0 ||
	    store_parse_int64(PQgetvalue(res, 0, 3), &r->published) != 0 ||
	    parse_double(PQgetvalue(res, 0, 4), &r->oldest_pending_age_s) != 0 ||
	    store_parse_int64(PQgetvalue(res, 0, 5), &r->blocked_keys) != 0 ||
	    store_parse_int64(PQgetvalue(res, 0, 8), pages) != 0) {
		store_set_error(s, "status query returned something unreadable");
		return STORE_ERR_QUERY;
	}
	if (!PQgetisnull(res, 0, 6)) {
		snprintf(r->oldest_blocked_key, sizeof(r->oldest_blocked_key), "%s",
		         PQgetvalue(res, 0, 6));
		if (parse_double(PQgetvalue(res, 0, 7), &r->oldest_blocked_age_s) != 0)
			r->oldest_blocked_age_s = 0;
	}
	if (r->oldest_pending_age_s < 0)
		r->oldest_pending_age_s = 0;
	return 0;
}

/* The published rows of a small table, counted. */
static int count_published(struct store *s, const struct store_table_mode *m, int64_t *out)
{
	char sql[ADMIN_SQL_MAX];
	const char *params[1] = { m->p };
	PGresult *res = NULL;
	int rc;

	rc = m->cursor ? admin_cursor_count_published_sql(s, sql, sizeof(sql))
	               : store_format_sql(s, sql, sizeof(sql),
	                                  "SELECT count(*) FROM %s WHERE published_at IS NOT NULL",
	                                  s->table);
	if (rc != 0)
		return rc;
	rc = store_exec(s, sql, m->cursor ? 1 : 0, params, PGRES_TUPLES_OK, &res,
	                "could not count published rows");
	if (rc != 0)
		return rc;
	if (store_parse_int64(PQgetvalue(res, 0, 0), out) != 0) {
		store_set_error(s, "status query returned something unreadable");
		rc = STORE_ERR_QUERY;
	}
	PQclear(res);
	return rc;
}

/* The published count is an estimate on a table of more than COUNT_PUBLISHED_MAX_PAGES pages
 * (see status_sql()); on a smaller one a second statement counts it, reading at most that many
 * pages. On a table the cursor source runs, by its definitions (admin_cursor.c). */
int store_status(struct store *s, struct store_status *st)
{
	char sql[ADMIN_SQL_MAX * 2], max[16];
	struct store_table_mode m;
	const char *params[2] = { max, m.p };
	struct store_status r;
	PGresult *res = NULL;
	int64_t pages = 0;
	int rc;

	memset(&r, 0, sizeof(r));
	snprintf(max, sizeof(max), "%d", s->opts.max_attempts);
	if ((rc = store_table_mode(s, &m)) != 0)
		goto out;
	rc = m.cursor ? admin_cursor_status_sql(s, sql, sizeof(sql))
	              : status_sql(s, sql, sizeof(sql));
	if (rc != 0)
		goto out;
	rc = store_exec(s, sql, m.cursor ? 2 : 1, params, PGRES_TUPLES_OK, &res,
	                "could not read the status");
	if (rc != 0 || (rc = parse_status(s, res, &r, &pages)) != 0)
		goto out;
	if (pages <= COUNT_PUBLISHED_MAX_PAGES && (rc = count_published(s, &m, &r.published)) != 0)
		goto out;
	if ((rc = store_partitions_info(s, m.cursor, &r.partitions)) != 0)
		goto out;
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

/* Runs a list statement: $1 = max_attempts, $2 = limit, $3 = the position (pos NULL: a lease
 * table's statement, which has no $3). */
static int run_list(struct store *s, const char *sql, size_t limit, const char *pos,
                    struct store_list *out, const char *what)
{
	char max[16], lim[24];
	const char *params[3] = { max, limit ? lim : NULL, pos };
	struct store_list l = { NULL, 0 };
	PGresult *res = NULL;
	bool failed = false;
	int rc;

	snprintf(max, sizeof(max), "%d", s->opts.max_attempts);
	snprintf(lim, sizeof(lim), "%zu", limit);
	rc = store_exec(s, sql, pos ? 3 : 2, params, PGRES_TUPLES_OK, &res, what);
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

/* Dead rows through the unpublished rows' indexes, oldest first. $1 = max_attempts, $2 = limit (NULL =
 * all). */
static int dead_sql(struct store *s, char *sql, size_t cap)
{
	return store_format_sql(
	        s, sql, cap,
	        "SELECT " LIST_COLUMNS " FROM %s WHERE " STORE_UNPUBLISHED(
	                "") " AND attempts >= $1::int ORDER BY seq LIMIT $2::bigint",
	        s->table);
}

/* The key index's head rows that block their key. Parameters as dead_sql(). */
static int blocked_sql(struct store *s, char *sql, size_t cap)
{
	char cte[ADMIN_SQL_MAX];
	int rc;

	if ((rc = blocked_cte(s, cte, sizeof(cte))) != 0)
		return rc;
	return store_format_sql(s, sql, cap,
	                        "WITH RECURSIVE %s SELECT " LIST_COLUMNS
	                        " FROM blocked ORDER BY seq LIMIT $2::bigint",
	                        cte);
}

/* Ownership: *out is filled with a new list (store_list_free()) only on success. */
int store_dead(struct store *s, size_t limit, struct store_list *out)
{
	char sql[ADMIN_SQL_MAX];
	struct store_table_mode m;
	int rc;

	if ((rc = store_table_mode(s, &m)) != 0)
		return rc;
	rc = m.cursor ? admin_cursor_dead_sql(s, sql, sizeof(sql)) : dead_sql(s, sql, sizeof(sql));
	if (rc != 0)
		return rc;
	return run_list(s, sql, limit, m.cursor ? m.p : NULL, out, "could not list dead rows");
}

/* Ownership: as store_dead(). */
int store_blocked_keys(struct store *s, size_t limit, struct store_list *out)
{
	char sql[ADMIN_SQL_MAX * 2];
	struct store_table_mode m;
	int rc;

	if ((rc = store_table_mode(s, &m)) != 0)
		return rc;
	rc = m.cursor ? admin_cursor_blocked_sql(s, sql, sizeof(sql))
	              : blocked_sql(s, sql, sizeof(sql));
	if (rc != 0)
		return rc;
	return run_list(s, sql, limit, m.cursor ? m.p : NULL, out, "could not list blocked keys");
}

static int changed_count(struct store *s, PGresult *res, int64_t *out)
{
	if (store_parse_int64(PQcmdTuples(res), out) != 0) {
		store_set_error(s, "could not read the number of changed rows");
		return STORE_ERR_QUERY;
	}
	return 0;
}

/* Every dead row (the unpublished rows' indexes), $1 = max_attempts; or the unpublished rows of
 * ids $1 (the primary key). A lease that has run out is cleared; a live one is kept (only a
 * forced requeue reaches such a row): its relay finishes with the row first. On a cursor
 * table, the deferred dead rows (admin_cursor.c), or the unpublished rows of ids $1 by the
 * cursor's definition, $2 = the position; deferred_at is kept, so that the cursor's exception
 * path takes the row up. */
static int requeue_sql(struct store *s, bool all_dead, bool cursor, char *sql, size_t cap)
{
	if (cursor && all_dead)
		return admin_cursor_requeue_dead_sql(s, sql, cap);
	return store_format_sql(
	        s, sql, cap,
	        "UPDATE %s SET attempts = 0, last_error = NULL, available_at = now(),"
	        " locked_by = CASE WHEN " STORE_LIVE_LEASE " THEN locked_by END,"
	        " locked_until = CASE WHEN " STORE_LIVE_LEASE " THEN locked_until END WHERE %s",
	        s->table,
	        all_dead ? STORE_UNPUBLISHED("") " AND attempts >= $1::int"
	        : cursor ? CURSOR_UNPUBLISHED("$2") " AND id = ANY($1::text[])"
	                 : "published_at IS NULL AND id = ANY($1::text[])");
}

/* Notifies the channel once, so a relay asleep until its next poll picks requeued rows up now.
 * The rows are requeued already; a failed notify only delays them to the next poll, so it is
 * not reported as a failure of the requeue. */
static void notify_requeued(struct store *s)
{
	const char *ch[1] = { s->opts.channel };
	PGresult *nres;

	if (!s->opts.channel || !s->opts.channel[0])
		return;
	nres = PQexecParams(s->conn, "SELECT pg_notify($1, '')", 1, NULL, ch, NULL, NULL, 0);
	PQclear(nres);
}

/* Ends the transaction the id commands opened; a failure is what the caller reports. */
static void rollback(struct store *s)
{
	if (store_connected(s))
		PQclear(PQexec(s->conn, "ROLLBACK"));
}

#define LOCKED_UNTIL ISO("locked_until")
#define LOCK_IDS_SQL                                                                  \
	"SELECT id, locked_by, " LOCKED_UNTIL ", " STORE_LIVE_LEASE ", false FROM %s" \
	" WHERE published_at IS NULL AND id = ANY($1::text[]) ORDER BY seq FOR UPDATE"
/* On a cursor table, $2 = the position: a row above it is in the relay's hands. */
#define LOCK_IDS_CURSOR_SQL                                                                 \
	"SELECT id, locked_by, " LOCKED_UNTIL ", " STORE_LIVE_LEASE " OR seq > $2::bigint," \
	" seq > $2::bigint FROM %s WHERE " CURSOR_UNPUBLISHED(                              \
	        "$2") " AND id = ANY($1::text[]) ORDER BY seq FOR UPDATE"

/* Locks the unpublished rows of ids ($1) against claims until the transaction ends, and fills o
 * with those under a live lease (a claim that is publishing them, or a replay's) and, on a
 * cursor table, those above its position. */
static int lock_ids(struct store *s, const char *const *params, const struct store_table_mode *m,
                    struct store_ids_outcome *o)
{
	char sql[ADMIN_SQL_MAX];
	PGresult *res = NULL;
	int rc;

	if ((rc = store_format_sql(s, sql, sizeof(sql),
	                           m->cursor ? LOCK_IDS_CURSOR_SQL : LOCK_IDS_SQL, s->table)) != 0)
		return rc;
	rc = store_exec(s, sql, m->cursor ? 2 : 1, params, PGRES_TUPLES_OK, &res,
	                "could not read the rows");
	if (rc != 0)
		return rc;
	o->position = m->cursor ? m->pos : -1;
	for (int i = 0; i < PQntuples(res); i++) {
		struct store_leased *l;
		bool ahead = PQgetvalue(res, i, 4)[0] == 't';

		if (PQgetvalue(res, i, 3)[0] != 't')
			continue;
		if (o->n_listed < STORE_LEASED_MAX) {
			l = &o->listed[o->n_listed++];
			snprintf(l->id, sizeof(l->id), "%s", PQgetvalue(res, i, 0));
			snprintf(l->locked_by, sizeof(l->locked_by), "%s", PQgetvalue(res, i, 1));
			snprintf(l->locked_until, sizeof(l->locked_until), "%s",
			         PQgetvalue(res, i, 2));
			l->ahead = ahead;
		}
		o->leased++;
		o->ahead += ahead;
	}
	PQclear(res);
	return 0;
}

/* requeue and discard by id, in one transaction: the rows are locked (a claim steps around
 * them meanwhile), those under a live lease are found, and unless forced nothing is changed
 * when there are any. */
static int ids_command(struct store *s, const char *const *ids, size_t n, bool force, bool requeue,
                       struct store_ids_outcome *out)
{
	char sql[ADMIN_SQL_MAX];
	struct store_table_mode m;
	const char *params[2] = { NULL, m.p };
	PGresult *res = NULL;
	struct store_ids_outcome *o;
	int rc;

	o = calloc(1, sizeof(*o));
	if (!o) {
		store_set_error(s, "out of memory");
		return STORE_ERR_NOMEM;
	}
	if (n == 0)
		goto done;
	rc = store_text_array(s, STORE_SLOT_IDS, ids, n, store_string_at, false, &params[0]);
	if (rc == 0)
		rc = store_table_mode(s, &m);
	if (rc == 0)
		rc = requeue ? requeue_sql(s, false, m.cursor, sql, sizeof(sql))
		             : store_format_sql(
		                       s, sql, sizeof(sql), "DELETE FROM %s WHERE %s", s->table,
		                       m.cursor ? CURSOR_UNPUBLISHED("$2") " AND id = ANY($1"
		                                                           "::text[])"
		                                : "published_at IS NULL"
		                                  " AND id = ANY($1::text[])");
	if (rc != 0)
		goto out;
	if ((rc = store_exec(s, "BEGIN", 0, NULL, PGRES_COMMAND_OK, NULL,
	                     requeue ? "could not requeue" : "could not discard")) != 0)
		goto out;
	if ((rc = lock_ids(s, params, &m, o)) != 0)
		goto failed;
	if (o->leased > 0 && !force) {
		rollback(s);
		goto done;
	}
	rc = store_exec(s, sql, m.cursor ? 2 : 1, params, PGRES_COMMAND_OK, &res,
	                requeue ? "could not requeue" : "could not discard");
	if (rc == 0)
		rc = changed_count(s, res, &o->changed);
	if (rc == 0)
		rc = store_exec(s, "COMMIT", 0, NULL, PGRES_COMMAND_OK, NULL,
		                requeue ? "could not requeue" : "could not discard");
	if (rc != 0)
		goto failed;
	if (requeue && o->changed > 0)
		notify_requeued(s);
done:
	*out = *o;
	rc = 0;
	goto out;
failed:
	rollback(s);
out:
	PQclear(res);
	free(o);
	return rc;
}

int store_requeue_ids(struct store *s, const char *const *ids, size_t n, bool force,
                      struct store_ids_outcome *out)
{
	return ids_command(s, ids, n, force, true, out);
}

int store_discard_ids(struct store *s, const char *const *ids, size_t n, bool force,
                      struct store_ids_outcome *out)
{
	return ids_command(s, ids, n, force, false, out);
}

/* The unforced id commands as a plain count: rows under a live lease are an error. */
static int ids_counted(struct store *s, const char *const *ids, size_t n, bool requeue,
                       int64_t *n_changed)
{
	struct store_ids_outcome *o = calloc(1, sizeof(*o));
	int rc;

	if (!o) {
		store_set_error(s, "out of memory");
		return STORE_ERR_NOMEM;
	}
	rc = ids_command(s, ids, n, false, requeue, o);
	if (rc == 0 && o->listed[0].ahead) {
		store_set_error(
		        s,
		        "%lld row(s) are in the relay's hands (first: '%s', above the cursor "
		        "source's position %lld); nothing was changed",
		        (long long)o->leased, o->listed[0].id, (long long)o->position);
		rc = STORE_ERR_QUERY;
	} else if (rc == 0 && o->leased > 0) {
		store_set_error(s,
		                "%lld row(s) are under a relay's lease (first: '%s' by '%s' until "
		                "%s); nothing was changed",
		                (long long)o->leased, o->listed[0].id, o->listed[0].locked_by,
		                o->listed[0].locked_until);
		rc = STORE_ERR_QUERY;
	} else if (rc == 0) {
		*n_changed = o->changed;
	}
	free(o);
	return rc;
}

/* ids are borrowed. */
int store_requeue(struct store *s, const char *const *ids, size_t n, bool all_dead,
                  int64_t *n_changed)
{
	char sql[ADMIN_SQL_MAX], max[16];
	struct store_table_mode m;
	const char *params[2] = { max, m.p };
	PGresult *res = NULL;
	int64_t changed = 0;
	int rc;

	if (!all_dead)
		return ids_counted(s, ids, n, true, n_changed);
	snprintf(max, sizeof(max), "%d", s->opts.max_attempts);
	if ((rc = store_table_mode(s, &m)) != 0 ||
	    (rc = requeue_sql(s, all_dead, m.cursor, sql, sizeof(sql))) != 0)
		goto out;
	rc = store_exec(s, sql, m.cursor ? 2 : 1, params, PGRES_COMMAND_OK, &res,
	                "could not requeue");
	if (rc != 0)
		goto out;
	if ((rc = changed_count(s, res, &changed)) != 0)
		goto out;
	if (changed > 0)
		notify_requeued(s);
	*n_changed = changed;
	rc = 0;
out:
	PQclear(res);
	return rc;
}

/* ids are borrowed. Published rows are left to the purge. */
int store_discard(struct store *s, const char *const *ids, size_t n, int64_t *n_changed)
{
	return ids_counted(s, ids, n, false, n_changed);
}

/* One slice of the purge: the oldest published rows past the cut-off, found by walking the
 * published index (created by migrate) from its oldest entry, so a slice reads about $2 index
 * entries and the last slice stops at the cut-off instead of walking every row kept for the
 * retention. The rows are deleted by their tuple ids (a TID scan, whatever the planner
 * thinks of the rest of the table). $1 = age in ms, $2 = slice size. On a cursor table the
 * rows that carry published_at (deferred rows its exception path published, and rows the lease
 * source published before), never one above the position, $3. */
static int purge_sql(struct store *s, bool cursor, char *sql, size_t cap)
{
	const char *behind = cursor ? " AND seq <= $3::bigint" : "";

	return store_format_sql(
	        s, sql, cap,
	        "DELETE FROM %s WHERE ctid = ANY (ARRAY(SELECT ctid FROM %s"
	        " WHERE published_at IS NOT NULL"
	        " AND published_at < now() - $1::bigint * interval '1 millisecond'%s"
	        " ORDER BY published_at LIMIT $2::int))"
	        /* Checked again on the row it deletes: a row made pending meanwhile
	                         * (a replay) must stay, also on servers whose TID scan does not
	                         * re-check a row changed under it (before the 2025 minor releases). */
	        " AND published_at IS NOT NULL"
	        " AND published_at < now() - $1::bigint * interval '1 millisecond'%s",
	        s->table, s->table, behind, behind);
}

int store_admin_sql(struct store *s, enum store_admin_sql which, char *out, size_t cap)
{
	switch (which) {
	case STORE_SQL_STATUS:
		return status_sql(s, out, cap);
	case STORE_SQL_DEAD:
		return dead_sql(s, out, cap);
	case STORE_SQL_BLOCKED:
		return blocked_sql(s, out, cap);
	case STORE_SQL_REQUEUE_DEAD:
		return requeue_sql(s, true, false, out, cap);
	case STORE_SQL_PURGE:
		return purge_sql(s, false, out, cap);
	case STORE_SQL_CURSOR_STATUS:
		return admin_cursor_status_sql(s, out, cap);
	case STORE_SQL_CURSOR_DEAD:
		return admin_cursor_dead_sql(s, out, cap);
	case STORE_SQL_CURSOR_BLOCKED:
		return admin_cursor_blocked_sql(s, out, cap);
	case STORE_SQL_CURSOR_REQUEUE_DEAD:
		return admin_cursor_requeue_dead_sql(s, out, cap);
	case STORE_SQL_CURSOR_PURGE:
		return purge_sql(s, true, out, cap);
	case STORE_SQL_CURSOR_PURGE_BEHIND:
		return admin_cursor_purge_sql(s, out, cap);
	}
	store_set_error(s, "no such statement");
	return STORE_ERR_FATAL;
}

/* Deletes in slices of `batch` rows, each its own short transaction, so that the purge
 * never holds many row locks or one long snapshot while the relay works. On a cursor table,
 * first the rows it published behind its position (admin_cursor_purge()), then the rows that
 * carry published_at. */
int store_purge(struct store *s, int64_t older_than_ms, int batch, const atomic_int *stop,
                int64_t *n_deleted)
{
	char sql[ADMIN_SQL_MAX], age[24], lim[16];
	struct store_table_mode m;
	const char *params[3] = { age, lim, m.p };
	int64_t total = 0;
	bool part = false;
	int rc;

	snprintf(age, sizeof(age), "%lld", (long long)(older_than_ms > 0 ? older_than_ms : 0));
	snprintf(lim, sizeof(lim), "%d", batch > 0 ? batch : 1000);
	if ((rc = store_table_mode(s, &m)) != 0 || (rc = store_partitioned(s, &part)) != 0)
		return rc;
	/* A partitioned table loses whole partitions, never rows one by one. */
	if (part)
		return store_partitions_retire(s, older_than_ms, m.cursor, m.pos, n_deleted,
		                               &total);
	if (m.cursor &&
	    (rc = admin_cursor_purge(s, m.pos, older_than_ms, batch, stop, &total)) != 0)
		return rc;
	if ((rc = purge_sql(s, m.cursor, sql, sizeof(sql))) != 0)
		return rc;
	for (;;) {
		PGresult *res = NULL;
		int64_t n = 0;

		if (stop && atomic_load(stop))
			break;
		rc = store_exec(s, sql, m.cursor ? 3 : 2, params, PGRES_COMMAND_OK, &res,
		                "could not purge");
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
