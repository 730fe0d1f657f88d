/* Replay (`outbox-relay replay`): the published rows an operator selects are made pending
 * again, with a header saying when the replay was asked, so that the running relay publishes
 * them through its normal path (confirms, retries); every ordering key keeps its order. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "store/store.h"
#include "store/operator/replay.h"
#include "store/store_private.h"

#define REPLAY_SQL_MAX 4096
#define REPLAY_PAGE    1000 /* rows per listing statement */
#define POLL_MS        10   /* between two looks at the sequence's lock holders */

/* The session's own tables (temporary: they go with the connection). The selection: one row
 * per selected row, fixed when the replay starts, with why its key waits (NULL = ready); a
 * row leaves it once replayed. And the rows whose headers cannot take the replay header. */
#define SEL     "pg_temp.outbox_replay"
#define REFUSED "pg_temp.outbox_replay_refused"

/* UTC text, whatever the session's time zone: milliseconds for people, microseconds for the
 * bounds the selection uses (a bound shown rounded must not select other rows). */
#define ISO_MS(e) "to_char((" e ") AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"
#define ISO_US(e) "to_char((" e ") AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"

/* Which source runs the table (store_table_mode()), read anew by every statement that needs
 * it: on a table the cursor source runs (its position row exists), with pos its position
 * (docs/design.md),
 *   published   = (seq <= pos AND deferred_at IS NULL) OR published_at IS NOT NULL
 *   unpublished = published_at IS NULL AND (seq > pos OR deferred_at IS NOT NULL)
 * and rows above the position are in its leader's hands. */

/* A published row of a cursor table, the position being parameter $1. */
#define CURSOR_PUBLISHED_1 \
	"((o.seq <= $1::bigint AND o.deferred_at IS NULL) OR o.published_at IS NOT NULL)"

/* Ends the transaction a failed step began, keeping the failure's message. */
static void rollback(struct store *s)
{
	char keep[STORE_ERRMSG_MAX];

	if (!store_connected(s))
		return;
	snprintf(keep, sizeof(keep), "%s", s->errmsg);
	if (store_exec(s, "ROLLBACK", 0, NULL, PGRES_COMMAND_OK, NULL, "could not roll back") != 0)
		store_disconnect(s); /* the next statement must not run inside it */
	snprintf(s->errmsg, sizeof(s->errmsg), "%s", keep);
}

int store_replay_like(const char *pattern, char *out, size_t cap)
{
	size_t n = 0;

	for (const char *p = pattern; *p; p++) {
		char c = *p, esc = 0;

		if (c == '*')
			c = '%';
		else if (c == '?')
			c = '_';
		else if (c == '%' || c == '_' || c == '!')
			esc = '!';
		if (n + (esc ? 2 : 1) >= cap)
			return -1;
		if (esc)
			out[n++] = esc;
		out[n++] = c;
	}
	if (n >= cap)
		return -1;
	out[n] = '\0';
	return 0;
}

/* Ownership: asked_at[cap] gets the server's time now (UTC, ms), the replay's stamp. */
int store_replay_begin(struct store *s, char *asked_at, size_t cap)
{
	PGresult *res = NULL;
	int rc;

	/* A time given without a zone is UTC, as every time the command prints. */
	rc = store_exec(
	        s,
	        "SET TIME ZONE 'UTC';"
	        " DROP TABLE IF EXISTS " SEL ", " REFUSED ";"
	        " CREATE TEMP TABLE outbox_replay (seq bigint PRIMARY KEY,"
	        " ordering_key text, reason text);"
	        " CREATE TEMP TABLE outbox_replay_refused (seq bigint, id text, reason text)",
	        0, NULL, PGRES_COMMAND_OK, NULL, "could not set up the replay");
	if (rc != 0)
		return rc;
	if ((rc = store_resolve_sequence(s)) != 0)
		return rc;
	rc = store_exec(s, "SELECT " ISO_MS("now()") ", pg_backend_pid()", 0, NULL, PGRES_TUPLES_OK,
	                &res, "could not set up the replay");
	if (rc != 0)
		return rc;
	snprintf(asked_at, cap, "%s", PQgetvalue(res, 0, 0));
	/* What the parked rows' locked_by says (park_keys()): who holds them, and since when. */
	snprintf(s->claim_token, sizeof(s->claim_token), "replay#%s.%s", PQgetvalue(res, 0, 1),
	         asked_at);
	PQclear(res);
	return rc;
}

/* Ownership: out[cap] gets the time (UTC, µs) only when 0 is returned. */
int store_replay_time(struct store *s, const char *at, int64_t ago_ms, char *out, size_t cap)
{
	char ago[24], state[6];
	const char *params[2] = { at, ago };
	PGresult *res = NULL;
	int rc;

	snprintf(ago, sizeof(ago), "%lld", (long long)(ago_ms > 0 ? ago_ms : 0));
	rc = store_exec_state(
	        s,
	        "SELECT CASE WHEN isfinite(t) THEN " ISO_US(
	                "t") " END FROM (SELECT"
	                     " COALESCE($1::timestamptz, now() - $2::bigint * interval '1 "
	                     "millisecond')"
	                     " AS t) x",
	        2, params, PGRES_TUPLES_OK, &res, "could not read the time", state);
	if (rc != 0)
		return strncmp(state, "22", 2) == 0 ? 1 : rc; /* class 22: data exception */
	if (PQntuples(res) != 1 || PQgetisnull(res, 0, 0)) {
		store_set_error(s, "not a finite time");
		PQclear(res);
		return 1;
	}
	snprintf(out, cap, "%s", PQgetvalue(res, 0, 0));
	PQclear(res);
	return 0;
}

/* Appends " AND <before>$n<after>" for one parameter, unless value is NULL. */
static int add_cond(struct store *s, char *sql, size_t cap, const char **params, int *np,
                    const char *before, const char *after, const char *value)
{
	size_t len = strlen(sql);

	if (!value)
		return 0;
	params[(*np)++] = value;
	return store_format_sql(s, sql + len, cap - len, " AND %s$%d%s", before, *np, after);
}

/* The selection, fixed now: rows published later, or replayed while this replay waits for a
 * key, do not join it. On published_at it walks the purge's index of published rows. On a
 * cursor table the rows it published carry no published_at: a time on published_at selects
 * them by created_at (they went out about then), and the selection reads the table. */
int store_replay_select(struct store *s, const struct store_replay_filter *f, int64_t *n_rows)
{
	char sql[REPLAY_SQL_MAX];
	const char *params[7];
	struct store_table_mode m;
	const char *col = f->by_created ? "o.created_at" : "o.published_at";
	char since[64], until[64];
	const char *ids = NULL;
	PGresult *res = NULL;
	int64_t n = 0;
	int np = 0, rc;

	if ((rc = store_table_mode(s, &m)) != 0)
		return rc;
	if (m.cursor) {
		params[np++] = m.p;
		if (!f->by_created)
			col = "COALESCE(o.published_at, o.created_at)";
	}
	snprintf(since, sizeof(since), "%s >= ", col);
	snprintf(until, sizeof(until), "%s < ", col);
	if (f->n_ids > 0 && (rc = store_text_array(s, STORE_SLOT_IDS, f->ids, f->n_ids,
	                                           store_string_at, false, &ids)) != 0)
		return rc;
	/* '!' escapes the LIKE pattern: a backslash would depend on standard_conforming_strings. */
	if ((rc = store_format_sql(
	             s, sql, sizeof(sql),
	             "INSERT INTO " SEL " (seq, ordering_key) SELECT o.seq, o.ordering_key"
	             " FROM %s o WHERE %s",
	             s->table, m.cursor ? CURSOR_PUBLISHED_1 : "o.published_at IS NOT NULL")) !=
	            0 ||
	    (rc = add_cond(s, sql, sizeof(sql), params, &np, "o.id = ANY(", "::text[])", ids)) !=
	            0 ||
	    (rc = add_cond(s, sql, sizeof(sql), params, &np, since, "::timestamptz", f->since)) !=
	            0 ||
	    (rc = add_cond(s, sql, sizeof(sql), params, &np, until, "::timestamptz", f->until)) !=
	            0 ||
	    (rc = add_cond(s, sql, sizeof(sql), params, &np, "o.exchange_name = ", "",
	                   f->exchange)) != 0 ||
	    (rc = add_cond(s, sql, sizeof(sql), params, &np, "o.routing_key LIKE ", " ESCAPE '!'",
	                   f->routing_key_like)) != 0 ||
	    (rc = add_cond(s, sql, sizeof(sql), params, &np, "o.ordering_key = ", "",
	                   f->ordering_key)) != 0)
		return rc;
	rc = store_exec(s, sql, np, params, PGRES_COMMAND_OK, &res, "could not select the rows");
	if (rc != 0)
		return rc;
	if (store_parse_int64(PQcmdTuples(res), &n) != 0) {
		store_set_error(s, "could not read the number of selected rows");
		rc = STORE_ERR_QUERY;
	} else {
		*n_rows = n;
	}
	PQclear(res);
	return rc;
}

/* Calls fn for each row of res (columns: id, exchange, routing key, ordering key, published,
 * created, reason, rows; NULL where a column is absent); stops at fn's first non-zero. */
static int each_row(PGresult *res, int ncols, store_replay_fn fn, void *arg)
{
	for (int i = 0; i < PQntuples(res); i++) {
		const char *v[8] = { 0 };
		struct store_replay_row r;
		int64_t rows = 0;
		int rc;

		for (int c = 0; c < ncols && c < 8; c++)
			v[c] = PQgetisnull(res, i, c) ? NULL : PQgetvalue(res, i, c);
		if (v[7] && store_parse_int64(v[7], &rows) != 0)
			rows = 0;
		r = (struct store_replay_row){ .id = v[0],
			                       .exchange = v[1],
			                       .routing_key = v[2],
			                       .ordering_key = v[3],
			                       .published_at = v[4],
			                       .created_at = v[5],
			                       .reason = v[6],
			                       .rows = rows };
		if ((rc = fn(&r, arg)) != 0)
			return rc;
	}
	return 0;
}

/* What --dry-run shows of a row, as each_row() reads it; seq last, for the next page. */
#define LIST_COLUMNS                                                     \
	"o.id, o.exchange_name, o.routing_key, o.ordering_key, " ISO_MS( \
	        "o.published_at") ", " ISO_MS("o.created_at") ", NULL, NULL, o.seq"

int store_replay_list(struct store *s, store_replay_fn fn, void *arg)
{
	char sql[REPLAY_SQL_MAX], after[24] = "0";
	const char *params[1] = { after };
	int rc;

	/* Pages by seq, so that a large selection is never held in memory at once. */
	if ((rc = store_format_sql(s, sql, sizeof(sql),
	                           "SELECT %s FROM %s o JOIN " SEL " r ON r.seq = o.seq"
	                           " WHERE o.seq > $1::bigint ORDER BY o.seq LIMIT %d",
	                           LIST_COLUMNS, s->table, REPLAY_PAGE)) != 0)
		return rc;
	for (;;) {
		PGresult *res = NULL;
		int n;

		rc = store_exec(s, sql, 1, params, PGRES_TUPLES_OK, &res,
		                "could not list the rows");
		if (rc != 0)
			return rc;
		n = PQntuples(res);
		rc = each_row(res, 8, fn, arg);
		if (n > 0)
			snprintf(after, sizeof(after), "%s", PQgetvalue(res, n - 1, 8));
		PQclear(res);
		if (rc != 0 || n < REPLAY_PAGE)
			return rc;
	}
}

int store_replay_missing_ids(struct store *s, const char *const *ids, size_t n, store_replay_fn fn,
                             void *arg)
{
	char sql[REPLAY_SQL_MAX];
	struct store_table_mode m;
	const char *params[2] = { NULL, m.p };
	PGresult *res = NULL;
	int rc;

	if (n == 0)
		return 0;
	rc = store_text_array(s, STORE_SLOT_IDS, ids, n, store_string_at, false, &params[0]);
	if (rc == 0)
		rc = store_table_mode(s, &m);
	if (rc != 0)
		return rc;
	if ((rc = store_format_sql(s, sql, sizeof(sql),
	                           "SELECT i.id, NULL, NULL, NULL, NULL, NULL, CASE"
	                           " WHEN o.id IS NULL THEN 'not in the table'"
	                           " WHEN %s THEN 'not published (pending or dead)'"
	                           " ELSE 'published, but left out by the other filters' END"
	                           " FROM unnest($1::text[]) WITH ORDINALITY AS i(id, n)"
	                           " LEFT JOIN %s o ON o.id = i.id"
	                           " WHERE o.seq IS NULL OR NOT EXISTS (SELECT 1 FROM " SEL
	                           " r WHERE r.seq = o.seq) ORDER BY i.n",
	                           m.cursor ? "o.published_at IS NULL AND (o.seq > $2::bigint"
	                                      " OR o.deferred_at IS NOT NULL)"
	                                    : "o.published_at IS NULL",
	                           s->table)) != 0)
		return rc;
	rc = store_exec(s, sql, m.cursor ? 2 : 1, params, PGRES_TUPLES_OK, &res,
	                "could not look up the ids");
	if (rc != 0)
		return rc;
	rc = each_row(res, 7, fn, arg);
	PQclear(res);
	return rc;
}

/* Rows whose headers the replay cannot merge its header into: not a JSON object, or text
 * PostgreSQL cannot read as JSON (a relay parses headers itself, so a row it published may
 * still hold, say, a \u0000 escape that jsonb refuses). One statement finds them all when
 * every row parses; when one does not, a loop tries each row in a subtransaction to name
 * which. */
int store_replay_refused(struct store *s, store_replay_fn fn, void *arg, int64_t *n_refused)
{
	char sql[REPLAY_SQL_MAX], state[6];
	PGresult *res = NULL;
	int64_t n = 0;
	int rc;

	if ((rc = store_exec(s, "TRUNCATE " REFUSED, 0, NULL, PGRES_COMMAND_OK, NULL,
	                     "could not check the headers")) != 0 ||
	    (rc = store_format_sql(
	             s, sql, sizeof(sql),
	             "INSERT INTO " REFUSED " SELECT o.seq, o.id,"
	             " 'its headers are not a JSON object' FROM %s o JOIN " SEL
	             " r ON r.seq = o.seq WHERE jsonb_typeof(o.headers::jsonb) <> 'object'",
	             s->table)) != 0)
		return rc;
	rc = store_exec_state(s, sql, 0, NULL, PGRES_COMMAND_OK, NULL,
	                      "could not check the headers", state);
	if (rc != 0 && strncmp(state, "22", 2) == 0) {
		if ((rc = store_format_sql(
		             s, sql, sizeof(sql),
		             "DO $replay$ DECLARE r record; BEGIN"
		             " FOR r IN SELECT o.seq, o.id, o.headers FROM %s o JOIN " SEL
		             " x ON x.seq = o.seq LOOP"
		             " BEGIN IF jsonb_typeof(r.headers::jsonb) <> 'object' THEN"
		             " INSERT INTO " REFUSED " VALUES (r.seq, r.id,"
		             " 'its headers are not a JSON object'); END IF;"
		             " EXCEPTION WHEN others THEN INSERT INTO " REFUSED
		             " VALUES (r.seq, r.id, 'PostgreSQL cannot read its headers as JSON: '"
		             " || SQLERRM); END; END LOOP; END $replay$",
		             s->table)) != 0)
			return rc;
		rc = store_exec(s, sql, 0, NULL, PGRES_COMMAND_OK, NULL,
		                "could not check the headers");
	}
	if (rc != 0)
		return rc;
	rc = store_exec(
	        s, "SELECT id, NULL, NULL, NULL, NULL, NULL, reason FROM " REFUSED " ORDER BY seq",
	        0, NULL, PGRES_TUPLES_OK, &res, "could not check the headers");
	if (rc != 0)
		return rc;
	n = PQntuples(res);
	rc = fn ? each_row(res, 7, fn, arg) : 0;
	PQclear(res);
	if (rc == 0)
		*n_refused = n;
	return rc;
}

/* How many of the holders $3 (virtual transaction ids) still hold a lock on the sequence $1
 * in database $2, and one of them described for the operator. */
#define HOLDERS_LEFT_SQL                                                                   \
	"SELECT count(*), max(CASE WHEN l.pid IS NULL THEN 'a prepared transaction'"       \
	" ELSE format('pid %s, open for %s s', a.pid, COALESCE(floor(extract(epoch FROM"   \
	" clock_timestamp() - a.xact_start))::text, '?')) END)"                            \
	" FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid"                   \
	" WHERE l.locktype = 'relation' AND l.relation = $1::oid AND l.database = $2::oid" \
	" AND l.virtualtransaction = ANY($3::text[]) AND l.pid IS DISTINCT FROM pg_backend_pid()"

/* Takes the lock a producer holds on the seq sequence from its INSERT to its end, then
 * waits (up to wait_ms) until every other transaction that held it has ended. From then on
 * until this transaction ends, the relay's ordering watermark (store/source/watermark.h) cannot
 * settle past any seq drawn after the lock, so no keyed row that this statement's snapshot
 * misses can be claimed before the replay commits; and every keyed row with an earlier seq is
 * committed or gone, so the next statement sees it. Returns 0 when they ended, 1 when some
 * did not in time (why is in *why, a new string or NULL), or an error. */
static int settle_sequence(struct store *s, int64_t wait_ms, char **why)
{
	char seq[16], db[16];
	const char *params[3] = { seq, db, NULL };
	PGresult *res = NULL;
	char *holders = NULL;
	int64_t deadline = clock_mono_ms() + wait_ms;
	int rc;

	snprintf(seq, sizeof(seq), "%u", s->seq_oid);
	snprintf(db, sizeof(db), "%u", s->db_oid);
	rc = store_exec(s, "SELECT pg_sequence_last_value($1::oid::regclass) IS NULL", 1, params,
	                PGRES_TUPLES_OK, NULL, "could not lock the sequence");
	if (rc != 0)
		return rc;
	/* Read after the lock is held: anyone who drew a seq before it and is still open. */
	rc = store_exec(s,
	                "SELECT COALESCE(array_agg(l.virtualtransaction)::text, '{}')"
	                " FROM pg_locks l WHERE l.locktype = 'relation' AND l.relation = $1::oid"
	                " AND l.database = $2::oid AND l.pid IS DISTINCT FROM pg_backend_pid()",
	                2, params, PGRES_TUPLES_OK, &res, "could not read the sequence's holders");
	if (rc != 0)
		return rc;
	holders = strdup(PQgetvalue(res, 0, 0));
	PQclear(res);
	res = NULL;
	if (!holders) {
		store_set_error(s, "out of memory");
		return STORE_ERR_NOMEM;
	}
	params[2] = holders;
	for (;;) {
		int64_t left = 0;

		rc = store_exec(s, HOLDERS_LEFT_SQL, 3, params, PGRES_TUPLES_OK, &res,
		                "could not read the sequence's holders");
		if (rc != 0)
			break;
		if (store_parse_int64(PQgetvalue(res, 0, 0), &left) != 0 || left == 0) {
			rc = 0;
			break;
		}
		if (clock_mono_ms() >= deadline) {
			char text[300];

			snprintf(text, sizeof(text),
			         "a transaction that inserted into the outbox is still open (%s)",
			         PQgetvalue(res, 0, 1));
			*why = strdup(text);
			rc = 1;
			break;
		}
		PQclear(res);
		res = NULL;
		clock_sleep_us(POLL_MS * 1000);
	}
	PQclear(res);
	free(holders);
	return rc;
}

/* Notes in the selection which keys must wait, and why, and parks the other keys' unpublished
 * rows. A key with a row in flight (leased, or locked right now by a claim or a mark) waits:
 * that row would be published before the replayed ones, which are older. The rows of a key
 * that goes are parked: leased to the replay (s->claim_token) for relay.lease, in the same
 * statement that locks them (SKIP LOCKED: the replay waits for nobody).
 *
 * Why park, when a row lock held to the commit seems enough: a claim whose snapshot predates
 * the replay's commit still sees the replayed rows as published, so to it the key's oldest
 * unpublished row is a newer one. If it reaches that row after the commit, the row lock is
 * gone and, the row being unchanged, nothing is checked again: it would be claimed and
 * published before the replayed rows. A row the replay changed is checked again against the
 * claim's conditions (READ COMMITTED's recheck of an updated row), and a lease that ends
 * after the claim began fails them. release_parked() hands the rows back after the commit.
 * On a cursor table a key with an unpublished row above the position waits too: its leader
 * may be publishing that row right now, and nothing a replay writes stops it; the deferred
 * rows are parked, as its exception path claims them under the same lease.
 * $1 = token, $2 = lease in ms, $3 = the position (cursor table). */
static int park_keys(struct store *s, const struct store_table_mode *m, int64_t *parked,
                     char *state)
{
	char sql[REPLAY_SQL_MAX], lease[24], u[REPLAY_SQL_MAX / 2];
	const char *params[3] = { s->claim_token, lease, m->p };
	PGresult *res = NULL;
	int rc;

	snprintf(lease, sizeof(lease), "%lld", (long long)s->opts.lease_ms);
	if (m->cursor)
		rc = store_format_sql(
		        s, u, sizeof(u),
		        "SELECT o.seq, o.id, o.ordering_key, o.locked_by,"
		        " COALESCE(o.locked_until >= now(), false) AS leased, false AS ahead"
		        " FROM %s o JOIN k ON o.ordering_key = k.ordering_key"
		        " WHERE o.deferred_at IS NOT NULL AND o.published_at IS NULL"
		        " AND o.seq <= $3::bigint"
		        " UNION ALL SELECT o.seq, o.id, o.ordering_key, o.locked_by, true, true"
		        " FROM %s o JOIN k ON o.ordering_key = k.ordering_key"
		        " WHERE o.seq > $3::bigint AND o.published_at IS NULL",
		        s->table, s->table);
	else
		rc = store_format_sql(
		        s, u, sizeof(u),
		        "SELECT o.seq, o.id, o.ordering_key, o.locked_by,"
		        " COALESCE(o.locked_until >= now(), false) AS leased,"
		        " false AS ahead FROM %s o JOIN k"
		        " ON o.ordering_key = k.ordering_key WHERE o.published_at IS NULL",
		        s->table);
	if (rc != 0)
		return rc;
	if ((rc = store_format_sql(
	             s, sql, sizeof(sql),
	             "WITH k AS (SELECT DISTINCT ordering_key FROM " SEL
	             " WHERE ordering_key IS NOT NULL),"
	             " u AS MATERIALIZED (%s),"
	             /* the lease as the locked (latest) row version has it */
	             " l AS MATERIALIZED (SELECT o.seq, o.locked_by, o.published_at IS NULL"
	             " AND COALESCE(o.locked_until >= now(), false) AS leased FROM %s o"
	             " WHERE o.seq IN (SELECT seq FROM u WHERE NOT leased)"
	             " FOR UPDATE OF o SKIP LOCKED),"
	             " busy AS MATERIALIZED (SELECT u.ordering_key, (array_agg(CASE"
	             " WHEN u.ahead THEN format('row %%L is in the relay''s hands (above the"
	             " cursor source''s position)', u.id)"
	             " WHEN u.leased OR l.leased THEN format('row %%L is being published"
	             " (leased by %%L)', u.id, COALESCE(l.locked_by, u.locked_by))"
	             " ELSE format('row %%L is locked by another transaction', u.id) END"
	             " ORDER BY u.seq))[1] AS reason"
	             " FROM u LEFT JOIN l ON l.seq = u.seq"
	             " WHERE u.leased OR l.seq IS NULL OR l.leased GROUP BY u.ordering_key),"
	             " noted AS (UPDATE " SEL " r SET reason = b.reason FROM busy b"
	             " WHERE r.ordering_key = b.ordering_key),"
	             " parked AS (UPDATE %s o SET locked_by = $1::text, locked_until ="
	             " clock_timestamp() + $2::bigint * interval '1 millisecond'"
	             " FROM l JOIN u ON u.seq = l.seq WHERE o.seq = l.seq AND NOT l.leased"
	             " AND o.published_at IS NULL AND NOT EXISTS (SELECT 1 FROM busy b"
	             " WHERE b.ordering_key = u.ordering_key) RETURNING 1)"
	             " SELECT count(*) FROM parked",
	             u, s->table, s->table)) != 0)
		return rc;
	rc = store_exec_state(s, sql, m->cursor ? 3 : 2, params, PGRES_TUPLES_OK, &res,
	                      "could not check the keys", state);
	if (rc != 0)
		return rc;
	if (store_parse_int64(PQgetvalue(res, 0, 0), parked) != 0)
		*parked = 0;
	PQclear(res);
	return 0;
}

/* After the commit: the parked rows are released with locked_until = the time now, which is
 * after the commit, so that a claim begun before it still finds them leased (its recheck
 * compares with its own start) and every later claim finds them free. Should this fail, the
 * rows come free when the parking lease ends: later, never sooner. */
static int release_parked(struct store *s, const struct store_table_mode *m)
{
	char sql[REPLAY_SQL_MAX];
	const char *params[1] = { s->claim_token };
	int rc;

	/* On a cursor table the parked rows are deferred ones: the deferred index has them (its
	 * unpublished rows' indexes hold every row it ever published). */
	if ((rc = store_format_sql(
	             s, sql, sizeof(sql),
	             "UPDATE %s SET locked_by = NULL, locked_until = clock_timestamp()"
	             " WHERE locked_by = $1::text AND %s",
	             s->table,
	             m->cursor ? "deferred_at IS NOT NULL AND published_at IS NULL"
	                       : STORE_UNPUBLISHED(""))) != 0)
		return rc;
	return store_exec(s, sql, 1, params, PGRES_COMMAND_OK, NULL,
	                  "could not release the keys' rows");
}

/* Makes the ready rows pending again with the header merged in (jsonb rewrites the text
 * canonically), and drops them from the selection. On a cursor table a row is made pending by
 * deferring it (deferred_at = now()): the cursor's exception path publishes it; $3 = the
 * position. */
static int make_pending(struct store *s, const struct store_table_mode *m, const char *asked_at,
                        int64_t *replayed, int64_t *gone, char *state)
{
	char sql[REPLAY_SQL_MAX];
	const char *params[3] = { STORE_REPLAY_HEADER, asked_at, m->p };
	PGresult *res = NULL;
	int64_t done = 0, ready = 0;
	int rc;

	if ((rc = store_format_sql(
	             s, sql, sizeof(sql),
	             "WITH sel AS MATERIALIZED (SELECT seq FROM " SEL " WHERE reason IS NULL),"
	             " u AS (UPDATE %s o SET published_at = NULL,%s attempts = 0,"
	             " last_error = NULL, available_at = now(), locked_by = NULL,"
	             " locked_until = NULL,"
	             " headers = (o.headers::jsonb || jsonb_build_object($1::text, $2::text))"
	             "::text FROM sel WHERE o.seq = sel.seq AND %s"
	             " RETURNING 1),"
	             " d AS (DELETE FROM " SEL " x USING sel WHERE x.seq = sel.seq)"
	             " SELECT (SELECT count(*) FROM u), (SELECT count(*) FROM sel)",
	             s->table, m->cursor ? " deferred_at = now()," : "",
	             m->cursor ? "((o.seq <= $3::bigint AND o.deferred_at IS NULL)"
	                         " OR o.published_at IS NOT NULL)"
	                       : "o.published_at IS NOT NULL")) != 0)
		return rc;
	rc = store_exec_state(s, sql, m->cursor ? 3 : 2, params, PGRES_TUPLES_OK, &res,
	                      "could not replay", state);
	if (rc != 0)
		return rc;
	if (store_parse_int64(PQgetvalue(res, 0, 0), &done) != 0 ||
	    store_parse_int64(PQgetvalue(res, 0, 1), &ready) != 0) {
		store_set_error(s, "could not read the number of replayed rows");
		rc = STORE_ERR_QUERY;
	} else {
		*replayed = done;
		*gone = ready - done;
	}
	PQclear(res);
	return rc;
}

/* A deadlock (with a purge deleting the same published rows, say) or a serialization
 * failure: the step is rolled back and simply tried again. */
static bool conflict(const char *state)
{
	return strcmp(state, "40P01") == 0 || strcmp(state, "40001") == 0 ||
	       strcmp(state, "55P03") == 0;
}

/* Wakes the relays that LISTEN on the channel; the caller checks that one is set. */
static int notify_relays(struct store *s)
{
	const char *ch[1] = { s->opts.channel };

	return store_exec(s, "SELECT pg_notify($1, '')", 1, ch, PGRES_TUPLES_OK, NULL,
	                  "could not notify the relay");
}

/* The step's first statements, in the transaction it began: takes the replay lock, forgets
 * why keys waited in the last step, and tells whether any selected row has a key (*keyed). */
static int start_step(struct store *s, bool *keyed)
{
	char lock[STORE_NAME_MAX + 32];
	const char *params[1] = { lock };
	PGresult *res = NULL;
	int rc;

	snprintf(lock, sizeof(lock), "outbox-relay replay %s", s->table);
	/* Two replays one at a time: each waits for the other's sequence lock otherwise. */
	rc = store_exec(s, "SELECT pg_advisory_xact_lock(hashtext($1))", 1, params, PGRES_TUPLES_OK,
	                NULL, "could not take the replay lock");
	if (rc == 0)
		rc = store_exec(s,
		                "UPDATE " SEL " SET reason = NULL WHERE reason IS NOT NULL;"
		                " SELECT EXISTS (SELECT 1 FROM " SEL
		                " WHERE ordering_key IS NOT NULL)",
		                0, NULL, PGRES_TUPLES_OK, &res, "could not replay");
	if (rc == 0)
		*keyed = PQgetvalue(res, 0, 0)[0] == 't';
	PQclear(res);
	return rc;
}

/* Keyed rows go only once the sequence has settled: then the keys that can go have their
 * newer rows parked (*parked); otherwise every keyed row waits for the next step, with why. */
static int hold_keys(struct store *s, const struct store_table_mode *m, int64_t wait_ms,
                     int64_t *parked, char *state)
{
	char *why = NULL;
	int rc;

	rc = settle_sequence(s, wait_ms, &why);
	if (rc == 1) {
		/* The unkeyed rows go now; the keyed ones wait for the next step. */
		const char *wp[1] = { why ? why : "a transaction is still open" };

		rc = store_exec(s, "UPDATE " SEL " SET reason = $1 WHERE ordering_key IS NOT NULL",
		                1, wp, PGRES_COMMAND_OK, NULL, "could not replay");
	} else if (rc == 0) {
		rc = park_keys(s, m, parked, state);
	}
	free(why);
	return rc;
}

/* After the commit: the parked rows are handed back and what is left is counted into p. The
 * replayed rows count already: an error here leaves the parked rows to their lease, which is
 * safe. */
static int finish_step(struct store *s, const struct store_table_mode *m, int64_t parked,
                       struct store_replay_progress *p)
{
	PGresult *res = NULL;
	int64_t left = 0, keys = 0;
	int rc;

	if (parked > 0 && (rc = release_parked(s, m)) != 0)
		return rc;
	/* The key's newer rows are claimable again (behind the replayed ones). */
	if (parked > 0 && s->opts.channel && s->opts.channel[0] && (rc = notify_relays(s)) != 0)
		return rc;
	rc = store_exec(s, "SELECT count(*), count(DISTINCT ordering_key) FROM " SEL, 0, NULL,
	                PGRES_TUPLES_OK, &res, "could not replay");
	if (rc != 0)
		goto out;
	if (store_parse_int64(PQgetvalue(res, 0, 0), &left) != 0 ||
	    store_parse_int64(PQgetvalue(res, 0, 1), &keys) != 0) {
		store_set_error(s, "could not read what is left to replay");
		rc = STORE_ERR_QUERY;
		goto out;
	}
	p->left = left;
	p->left_keys = keys;
	p->conflict = false;
out:
	PQclear(res);
	return rc;
}

int store_replay_step(struct store *s, const char *asked_at, int64_t wait_ms,
                      struct store_replay_progress *p)
{
	char state[6] = "";
	bool keyed = false;
	struct store_table_mode m;
	int64_t replayed = 0, gone = 0, parked = 0;
	int rc;

	if ((rc = store_exec(s, "BEGIN", 0, NULL, PGRES_COMMAND_OK, NULL, "could not replay")) != 0)
		return rc;
	/* The position is read after the replay lock: it only moves on, so a row behind it now
	 * stays behind it. */
	if ((rc = start_step(s, &keyed)) != 0 || (rc = store_table_mode(s, &m)) != 0)
		goto fail;
	if (keyed && (rc = hold_keys(s, &m, wait_ms, &parked, state)) != 0)
		goto fail;
	if ((rc = make_pending(s, &m, asked_at, &replayed, &gone, state)) != 0)
		goto fail;
	/* Delivered at commit: a relay asleep until its next poll claims them now. */
	if (replayed > 0 && s->opts.channel && s->opts.channel[0] && (rc = notify_relays(s)) != 0)
		goto fail;
	if ((rc = store_exec(s, "COMMIT", 0, NULL, PGRES_COMMAND_OK, NULL, "could not replay")) !=
	    0)
		return rc; /* a failed COMMIT ends the transaction */
	/* The replayed rows count from here. */
	p->replayed += replayed;
	p->gone += gone;
	return finish_step(s, &m, parked, p);
fail:
	rollback(s);
	if (conflict(state)) {
		p->conflict = true;
		rc = 0;
	}
	return rc;
}

int store_replay_skipped(struct store *s, store_replay_fn fn, void *arg)
{
	PGresult *res = NULL;
	int rc;

	rc = store_exec(s,
	                "SELECT NULL, NULL, NULL, ordering_key, NULL, NULL,"
	                " COALESCE((array_agg(reason ORDER BY seq))[1],"
	                " 'it conflicted with other transactions until the time ran out'),"
	                " count(*) FROM " SEL " GROUP BY ordering_key ORDER BY min(seq)",
	                0, NULL, PGRES_TUPLES_OK, &res, "could not list the keys left");
	if (rc != 0)
		return rc;
	rc = each_row(res, 8, fn, arg);
	PQclear(res);
	return rc;
}
