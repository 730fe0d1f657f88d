/* `outbox-relay leave-cursor`: hands a table from the cursor source back to the lease source
 * (leave_cursor.h). Under the table's lead, the rows the cursor published get the published_at
 * the cursor never wrote, in bounded batches, and the position row goes last. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store.h"
#include "store/operator/leave_cursor.h"
#include "store/store_private.h"

#define LEAVE_SQL_MAX 2048

/* published_at of a marked row: the position's last move, an upper bound of when the rows it
 * passed went out (the retention then keeps them a little longer, never shorter). */
#define LEAVE_PUBLISHED_AT "COALESCE($4::timestamptz, now())"

/* The rows the cursor published: behind the position, never deferred, no published_at. A row
 * marked by an earlier run that was cut short is published already and not counted again. */
#define LEAVE_DONE_BY_CURSOR(a) \
	a "seq <= $1::bigint AND " a "published_at IS NULL AND " a "deferred_at IS NULL"

/* One batch of unkeyed rows, along the unkeyed index (seq order) from above $2: $1 = the
 * position, $2 = the last seq marked, $3 = batch, $4 = published_at. Answers: rows marked,
 * rows found, the last seq found (NULL when none). */
static int unkeyed_sql(struct store *s, char *sql, size_t cap)
{
	return store_format_sql(s, sql, cap,
	                        "WITH b AS MATERIALIZED (SELECT seq FROM %s"
	                        " WHERE published_at IS NULL AND ordering_key IS NULL"
	                        " AND seq > $2::bigint AND %s ORDER BY seq LIMIT $3::int),"
	                        " u AS (UPDATE %s o SET published_at = %s FROM b"
	                        " WHERE o.seq = b.seq AND %s RETURNING 1)"
	                        " SELECT (SELECT count(*) FROM u), (SELECT count(*) FROM b),"
	                        " (SELECT max(seq) FROM b)",
	                        s->table, LEAVE_DONE_BY_CURSOR(""), s->table, LEAVE_PUBLISHED_AT,
	                        LEAVE_DONE_BY_CURSOR("o."));
}

/* One batch of keyed rows, along the key index (key, then seq) from above ($5, $2): as
 * unkeyed_sql(), and $5 = the last key marked. Answers: rows marked, rows found, the last seq
 * and key found (NULL when none). */
static int keyed_sql(struct store *s, char *sql, size_t cap)
{
	return store_format_sql(s, sql, cap,
	                        "WITH b AS MATERIALIZED (SELECT ordering_key, seq FROM %s"
	                        " WHERE published_at IS NULL AND ordering_key IS NOT NULL"
	                        " AND (ordering_key, seq) > ($5::text, $2::bigint) AND %s"
	                        " ORDER BY ordering_key, seq LIMIT $3::int),"
	                        " l AS (SELECT ordering_key, seq FROM b"
	                        " ORDER BY ordering_key DESC, seq DESC LIMIT 1),"
	                        " u AS (UPDATE %s o SET published_at = %s FROM b"
	                        " WHERE o.seq = b.seq AND %s RETURNING 1)"
	                        " SELECT (SELECT count(*) FROM u), (SELECT count(*) FROM b),"
	                        " (SELECT seq FROM l), (SELECT ordering_key::text FROM l)",
	                        s->table, LEAVE_DONE_BY_CURSOR(""), s->table, LEAVE_PUBLISHED_AT,
	                        LEAVE_DONE_BY_CURSOR("o."));
}

/* Reads column c of row 0 of res as an int64 into *v: 0, or STORE_ERR_QUERY (error set). */
static int int_at(struct store *s, const PGresult *res, int c, int64_t *v)
{
	if (PQntuples(res) != 1 || PQgetisnull(res, 0, c) ||
	    store_parse_int64(PQgetvalue(res, 0, c), v) != 0) {
		store_set_error(s, "could not read an answer of leave-cursor");
		return STORE_ERR_QUERY;
	}
	return 0;
}

/* The role must be able to delete the position row in the end (the relay role may not: it is
 * the owner's, like migrate). Found out before anything is marked, not after. */
static int check_privileges(struct store *s)
{
	char pos_table[STORE_NAME_MAX + 16];
	const char *params[2] = { pos_table, s->table };
	PGresult *res = NULL;
	bool may;
	int rc;

	snprintf(pos_table, sizeof(pos_table), "%s" STORE_POSITION_SUFFIX, s->table);
	rc = store_exec(s,
	                "SELECT COALESCE(has_table_privilege(to_regclass($1), 'DELETE')"
	                " AND has_table_privilege(to_regclass($2), 'UPDATE'), false)",
	                2, params, PGRES_TUPLES_OK, &res, "could not check the role's privileges");
	if (rc != 0)
		return rc;
	may = PQntuples(res) == 1 && PQgetvalue(res, 0, 0)[0] == 't';
	PQclear(res);
	if (!may) {
		store_set_error(s,
		                "this role may not delete from %s" STORE_POSITION_SUFFIX
		                " or update %s: run leave-cursor as the table's owner (the role "
		                "that runs migrate); nothing was changed",
		                s->table, s->table);
		return STORE_ERR_FATAL;
	}
	return 0;
}

/* Takes the table's lead as position_lead() does (store/source/position.c: the same class, the
 * table's OID as an integer for the key), for this session. *key gets the key, *got whether
 * the lock was taken (false: another session leads). */
static int take_lead(struct store *s, int *key, bool *got)
{
	const char *params[1] = { s->table };
	PGresult *res = NULL;
	int64_t k = 0;
	int rc;

	rc = store_exec(s,
	                "SELECT k, pg_try_advisory_lock(" STORE_LEAD_LOCK_CLASS ", k) FROM"
	                " (SELECT to_regclass($1)::oid::integer AS k) x",
	                1, params, PGRES_TUPLES_OK, &res, "could not take the table's lead");
	if (rc != 0)
		return rc;
	if ((rc = int_at(s, res, 0, &k)) == 0) {
		*key = (int)k;
		*got = PQgetvalue(res, 0, 1)[0] == 't';
	}
	PQclear(res);
	return rc;
}

/* Lets the lead go, keeping the handle's error text (the unlock runs on failure paths too; a
 * session lock also ends with the session, should this not reach the server). */
static void release_lead(struct store *s, int key)
{
	char sql[96], saved[STORE_ERRMSG_MAX];

	memcpy(saved, s->errmsg, sizeof(saved));
	snprintf(sql, sizeof(sql), "SELECT pg_advisory_unlock(" STORE_LEAD_LOCK_CLASS ", %d)", key);
	if (store_exec(s, sql, 0, NULL, PGRES_TUPLES_OK, NULL, "could not let the lead go") != 0)
		store_disconnect(s); /* the session goes, and its lock with it */
	memcpy(s->errmsg, saved, sizeof(saved));
}

/* The position and its last move (ISO 8601 in UTC, with microseconds, so that it reads back
 * as the same instant; "" when none), read under the lead: *found false when the row is gone
 * (a run that finished meanwhile). */
static int read_position(struct store *s, bool *found, struct store_leave_outcome *o)
{
	char sql[STORE_NAME_MAX + 160];
	PGresult *res = NULL;
	int rc;

	if ((rc = store_format_sql(s, sql, sizeof(sql),
	                           "SELECT position, to_char(moved_at AT TIME ZONE 'UTC',"
	                           " 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"
	                           " FROM %s" STORE_POSITION_SUFFIX " WHERE stream = 'main'",
	                           s->table)) != 0)
		return rc;
	if ((rc = store_exec(s, sql, 0, NULL, PGRES_TUPLES_OK, &res,
	                     "could not read the cursor source's position")) != 0)
		return rc;
	*found = PQntuples(res) == 1;
	if (*found && (rc = int_at(s, res, 0, &o->position)) == 0)
		snprintf(o->moved_at, sizeof(o->moved_at), "%s", PQgetvalue(res, 0, 1));
	PQclear(res);
	return rc;
}

/* Counts the rows of the table where `where` holds (its one parameter, if any, $1 = pos). */
static int count(struct store *s, const char *where, int nparams, int64_t pos, int64_t *n,
                 const char *what)
{
	char sql[LEAVE_SQL_MAX], p[24];
	const char *params[1] = { p };
	PGresult *res = NULL;
	int rc;

	snprintf(p, sizeof(p), "%lld", (long long)pos);
	if ((rc = store_format_sql(s, sql, sizeof(sql), "SELECT count(*) FROM %s WHERE %s",
	                           s->table, where)) != 0)
		return rc;
	if ((rc = store_exec(s, sql, nparams, params, PGRES_TUPLES_OK, &res, what)) != 0)
		return rc;
	rc = int_at(s, res, 0, n);
	PQclear(res);
	return rc;
}

/* Marks every row the cursor published, unkeyed rows first, then keyed ones; *marked gets how
 * many (also when a batch fails: its text says how many went before). */
static int mark_batches(struct store *s, const struct store_leave_outcome *o, int batch,
                        int64_t *marked)
{
	char sql[LEAVE_SQL_MAX], p[24], after[24], lim[16], key[STORE_KEY_CURSOR_MAX], what[160];
	const char *params[5] = { p, after, lim, o->moved_at[0] ? o->moved_at : NULL, key };
	int rc, limit = batch > 0 ? batch : STORE_LEAVE_BATCH;

	*marked = 0;
	snprintf(p, sizeof(p), "%lld", (long long)o->position);
	snprintf(lim, sizeof(lim), "%d", limit);
	for (int keyed = 0; keyed < 2; keyed++) {
		/* Below every seq, and below every key ('' sorts first in any collation). */
		snprintf(after, sizeof(after), "%lld", (long long)INT64_MIN);
		key[0] = '\0';
		if ((rc = keyed ? keyed_sql(s, sql, sizeof(sql))
		                : unkeyed_sql(s, sql, sizeof(sql))) != 0)
			return rc;
		for (;;) {
			PGresult *res = NULL;
			int64_t n = 0, found = 0;

			snprintf(
			        what, sizeof(what),
			        "could not mark the rows behind position %lld (%lld marked so far; "
			        "run leave-cursor again to finish)",
			        (long long)o->position, (long long)*marked);
			if ((rc = store_exec(s, sql, keyed ? 5 : 4, params, PGRES_TUPLES_OK, &res,
			                     what)) != 0)
				return rc;
			if ((rc = int_at(s, res, 0, &n)) == 0)
				rc = int_at(s, res, 1, &found);
			if (rc == 0 && found > 0) {
				snprintf(after, sizeof(after), "%s", PQgetvalue(res, 0, 2));
				if (keyed)
					snprintf(key, sizeof(key), "%s", PQgetvalue(res, 0, 3));
			}
			PQclear(res);
			if (rc != 0)
				return rc;
			*marked += n;
			if (found < limit)
				break;
		}
	}
	return 0;
}

/* mark_batches() along the partial indexes, whatever the statistics say. On a table the cursor
 * ran they count every row behind the position as unpublished, and go on doing so after the
 * rows are marked, until the next analyze: the planner then took a bitmap scan of the key index
 * and a sort of every keyed row left for each batch of 10,000 (73 ms a batch over 125,000 keyed
 * rows, growing with the table), where walking the index in its order reads the batch alone
 * (10 to 17 ms). The session's settings are put back afterwards. */
static int mark_all(struct store *s, const struct store_leave_outcome *o, int batch,
                    int64_t *marked)
{
	char saved[STORE_ERRMSG_MAX];
	int rc, reset;

	*marked = 0;
	if ((rc = store_exec(s, "SET enable_bitmapscan = off; SET enable_sort = off", 0, NULL,
	                     PGRES_COMMAND_OK, NULL, "could not set up the session")) != 0)
		return rc;
	rc = mark_batches(s, o, batch, marked);
	memcpy(saved, s->errmsg, sizeof(saved));
	reset = store_exec(s, "RESET enable_bitmapscan; RESET enable_sort", 0, NULL,
	                   PGRES_COMMAND_OK, NULL, "could not set up the session");
	if (rc != 0)
		memcpy(s->errmsg, saved, sizeof(saved));
	return rc != 0 ? rc : reset;
}

/* Deletes the position row, only where it still is where it was read (the lead is held, so it
 * should be). */
static int delete_position(struct store *s, int64_t pos)
{
	char sql[STORE_NAME_MAX + 96], p[24];
	const char *params[1] = { p };
	PGresult *res = NULL;
	int rc;

	snprintf(p, sizeof(p), "%lld", (long long)pos);
	if ((rc = store_format_sql(s, sql, sizeof(sql),
	                           "DELETE FROM %s" STORE_POSITION_SUFFIX
	                           " WHERE stream = 'main' AND position = $1::bigint",
	                           s->table)) != 0)
		return rc;
	if ((rc = store_exec(s, sql, 1, params, PGRES_COMMAND_OK, &res,
	                     "could not delete the cursor source's position")) != 0)
		return rc;
	if (strcmp(PQcmdTuples(res), "1") != 0) {
		store_set_error(
		        s,
		        "the position of %s moved from %lld while leave-cursor ran (a relay "
		        "with relay.source = cursor?): stop every relay of the table and run "
		        "leave-cursor again",
		        s->table, (long long)pos);
		rc = STORE_ERR_FATAL;
	}
	PQclear(res);
	return rc;
}

int store_leave_cursor(struct store *s, int batch, bool dry_run, struct store_leave_outcome *out)
{
	struct store_leave_outcome o = { .state = STORE_LEAVE_NOT_CURSOR };
	bool cursor = false, led = false;
	int64_t pos = 0;
	int key = 0, rc;

	if ((rc = store_require_conn(s)) != 0 ||
	    (rc = store_cursor_position(s, &cursor, &pos)) != 0)
		return rc;
	if (!cursor) {
		*out = o;
		return 0;
	}
	if ((rc = check_privileges(s)) != 0 || (rc = take_lead(s, &key, &led)) != 0)
		return rc;
	if (!led) {
		o.state = STORE_LEAVE_LED;
		*out = o;
		return 0;
	}
	/* Read again under the lead: no relay moves it from now on. */
	if ((rc = read_position(s, &cursor, &o)) != 0 || !cursor)
		goto out;
	if (dry_run)
		rc = count(s, LEAVE_DONE_BY_CURSOR(""), 1, o.position, &o.marked,
		           "could not count the rows behind the position");
	else
		rc = mark_all(s, &o, batch, &o.marked);
	if (rc == 0)
		rc = count(s, "deferred_at IS NOT NULL AND published_at IS NULL", 0, 0, &o.deferred,
		           "could not count the deferred rows");
	/* Last: until here the table is still the cursor's, and a second run finishes the job. */
	if (rc == 0 && !dry_run)
		rc = delete_position(s, o.position);
	if (rc == 0)
		o.state = STORE_LEAVE_DONE;
out:
	release_lead(s, key);
	if (rc == 0)
		*out = o;
	return rc;
}
