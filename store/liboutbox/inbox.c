/* The consumer library: an idempotency table keyed by message_id, claimed under leases and
 * confirmed in the caller's own transaction. One statement per call (two when a claim lost a
 * race) on the caller's connection; everything the server could reject is checked first,
 * because a failed statement would abort the caller's whole transaction. */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/text.h"
#include "base/utf8.h"
#include "store/liboutbox/inbox.h"
#include "store/liboutbox/liboutbox_private.h"
#include "store/store_private.h"

#define DEFAULT_TABLE      "inbox"
#define ID_MAX_CHARS       64  /* VARCHAR(64), like the outbox's id */
#define CONSUMER_MAX_CHARS 255 /* VARCHAR(255) */
#define LEASE_MAX_MS       (7LL * 24 * 3600 * 1000)
#define RETENTION_MAX_MS   (3650LL * 24 * 3600 * 1000)
#define PURGE_LIMIT_MAX    10000
#define SQL_MAX            2048
#define ERR_LINE_MAX       512

static bool text_ok(const char *s, long max_chars)
{
	long n;

	if (!s)
		return false;
	n = utf8_chars(s, strlen(s));
	return n >= 1 && n <= max_chars;
}

/* The checks every call shares; fills in the default table. */
static int check_args(PGconn *conn, const char **table, const char *message_id,
                      const char *consumer, char *errbuf, size_t errlen)
{
	const char *enc;

	if (!*table)
		*table = DEFAULT_TABLE;
	if (!conn) {
		liboutbox_set_err(errbuf, errlen, "no connection", NULL);
		return INBOX_ERR_INVALID;
	}
	if (!identifier_valid(*table)) {
		liboutbox_set_err(errbuf, errlen, "invalid table name", *table);
		return INBOX_ERR_INVALID;
	}
	/* Message ids and consumer names go as UTF-8: see store_client_encoding_refused(). */
	if ((message_id || consumer) && (enc = store_client_encoding_refused(conn)) != NULL) {
		liboutbox_errorf(
		        errbuf, errlen,
		        "the connection's client_encoding is %s, but the inbox sends UTF-8:"
		        " set it to UTF8 (client_encoding=UTF8 in the connection string, or"
		        " PQsetClientEncoding(conn, \"UTF8\"))",
		        enc);
		return INBOX_ERR_INVALID;
	}
	if (message_id && !text_ok(message_id, ID_MAX_CHARS)) {
		liboutbox_set_err(errbuf, errlen, "message_id must be 1 to 64 characters of UTF-8",
		                  NULL);
		return INBOX_ERR_INVALID;
	}
	if (consumer && !text_ok(consumer, CONSUMER_MAX_CHARS)) {
		liboutbox_set_err(errbuf, errlen, "consumer must be 1 to 255 characters of UTF-8",
		                  NULL);
		return INBOX_ERR_INVALID;
	}
	return 0;
}

/* Same for the calls that take a message and a consumer, where NULL is an error too. */
static int check_claim_args(PGconn *conn, const char **table, const char *message_id,
                            const char *consumer, char *errbuf, size_t errlen)
{
	if (!message_id) {
		liboutbox_set_err(errbuf, errlen, "message_id must be 1 to 64 characters of UTF-8",
		                  NULL);
		return INBOX_ERR_INVALID;
	}
	if (!consumer) {
		liboutbox_set_err(errbuf, errlen, "consumer must be 1 to 255 characters of UTF-8",
		                  NULL);
		return INBOX_ERR_INVALID;
	}
	return check_args(conn, table, message_id, consumer, errbuf, errlen);
}

/* Writes "what: <server message>" as one line and returns the code. res may be NULL (libpq
 * could not send the statement, or ran out of memory); it is borrowed. */
static int query_error(PGconn *conn, const PGresult *res, const char *what, char *errbuf,
                       size_t errlen)
{
	/* The primary message alone: the full text adds "ERROR:" and, for some errors, a
	 * quote of the statement with a caret under it, which make no sense on one line. */
	const char *msg = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
	char line[ERR_LINE_MAX];

	if (!msg || !msg[0])
		msg = res ? PQresultErrorMessage(res) : PQerrorMessage(conn);

	if (msg && msg[0])
		snprintf(line, sizeof(line), "%s", msg);
	else if (res)
		snprintf(line, sizeof(line), "unexpected result %s",
		         PQresStatus(PQresultStatus(res)));
	else
		snprintf(line, sizeof(line), "no result");
	text_one_line(line);
	liboutbox_set_err(errbuf, errlen, what, line);
	return INBOX_ERR_QUERY;
}

/* Formats a statement around the validated table name; false when it does not fit (it
 * always does: the name is at most 127 bytes). */
static bool build_sql(char *sql, size_t len, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

static bool build_sql(char *sql, size_t len, const char *fmt, ...)
{
	va_list ap;
	int w;

	va_start(ap, fmt);
	w = vsnprintf(sql, len, fmt, ap);
	va_end(ap);
	return w > 0 && (size_t)w < len;
}

/* Ownership: returns a new string (caller frees); table borrowed. */
char *inbox_schema_sql(const char *table)
{
	static const char fmt[] =
	        "-- outbox-relay inbox table %s (idempotent: safe to apply again)\n"
	        "CREATE TABLE IF NOT EXISTS %s (\n"
	        "  message_id    VARCHAR(64)  NOT NULL PRIMARY KEY,\n"
	        "  claimed_by    VARCHAR(255),\n"
	        "  claimed_until TIMESTAMPTZ,\n"
	        "  confirmed_at  TIMESTAMPTZ,\n"
	        "  first_seen_at TIMESTAMPTZ  NOT NULL DEFAULT now()\n"
	        ");\n"
	        "-- for the purge: old confirmations, leases that ended long ago\n"
	        "CREATE INDEX IF NOT EXISTS %.*s_done_idx ON %s (confirmed_at)\n"
	        "  WHERE confirmed_at IS NOT NULL;\n"
	        "CREATE INDEX IF NOT EXISTS %.*s_stale_idx ON %s (claimed_until)\n"
	        "  WHERE confirmed_at IS NULL;\n";
	const char *base;
	size_t base_len, len;
	char *out;

	if (!table)
		table = DEFAULT_TABLE;
	if (!identifier_table_name_valid(table))
		return NULL;
	/* An index lives in its table's schema: name it by the base name alone. */
	base = identifier_base(table);
	base_len = strlen(base);
	len = sizeof(fmt) + 6 * strlen(table);
	out = malloc(len);
	if (!out)
		return NULL;
	if (!build_sql(out, len, fmt, table, table, (int)base_len, base, table, (int)base_len, base,
	               table)) {
		free(out);
		return NULL;
	}
	return out;
}

/* Whether table and both its indexes exist (valid): then there is nothing to do, and no lock
 * to take. 1, 0, or an INBOX_ERR_*. */
static int inbox_current(PGconn *conn, const char *table, char *errbuf, size_t errlen)
{
	char base[IDENTIFIER_TABLE_BASE_MAX + 1];
	const char *params[2] = { table, base };
	PGresult *res;
	int rc;

	snprintf(base, sizeof(base), "%s", identifier_base(table));
	for (char *c = base; *c; c++)
		*c = (char)tolower((unsigned char)*c); /* as the catalog stores unquoted names */
	res = PQexecParams(conn,
	                   "SELECT count(*) FROM pg_index i JOIN pg_class ic"
	                   " ON ic.oid = i.indexrelid WHERE i.indrelid = to_regclass($1)"
	                   " AND i.indisvalid AND ic.relname IN ($2 || '_done_idx',"
	                   " $2 || '_stale_idx')",
	                   2, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
		rc = query_error(conn, res, "could not read the catalog", errbuf, errlen);
	else
		rc = strcmp(PQgetvalue(res, 0, 0), "2") == 0;
	PQclear(res);
	return rc;
}

/* Reads the catalog first: the usual run (every consumer start) finds the table up to date and
 * takes no lock on it; CREATE INDEX IF NOT EXISTS would take a SHARE lock even when the index
 * exists, queue behind any open transaction on the table and hold every consumer's claim
 * behind itself. Otherwise one multi-statement simple query: outside a transaction block
 * PostgreSQL runs it as one implicit transaction, so the lock is held until the DDL is done
 * (CREATE ... IF NOT EXISTS is not safe against a concurrent create of the same name, hence
 * the lock), and each lock is waited for at most 5 s. */
int inbox_migrate(PGconn *conn, const char *table, char *errbuf, size_t errlen)
{
	char *ddl = NULL, *sql = NULL;
	PGresult *res = NULL;
	size_t len;
	int rc;

	rc = check_args(conn, &table, NULL, NULL, errbuf, errlen);
	if (rc != 0)
		return rc;
	if (!identifier_table_name_valid(table)) {
		liboutbox_set_err(
		        errbuf, errlen,
		        "invalid table name (the name after any schema is at most 51 bytes)",
		        table);
		return INBOX_ERR_INVALID;
	}
	rc = inbox_current(conn, table, errbuf, errlen);
	if (rc < 0)
		return rc;
	if (rc == 1)
		return INBOX_OK;
	ddl = inbox_schema_sql(table);
	if (!ddl) {
		liboutbox_set_err(errbuf, errlen, "out of memory", NULL);
		return INBOX_ERR_NOMEM;
	}
	len = strlen(ddl) + strlen(table) + 192;
	sql = malloc(len);
	if (!sql) {
		liboutbox_set_err(errbuf, errlen, "out of memory", NULL);
		rc = INBOX_ERR_NOMEM;
		goto out;
	}
	snprintf(sql, len,
	         "SELECT pg_advisory_xact_lock(hashtext('outbox-relay inbox migrate %s'));\n"
	         "SELECT set_config('lock_timeout', '5s', true);\n%s",
	         table, ddl);
	res = PQexec(conn, sql);
	if (PQresultStatus(res) != PGRES_COMMAND_OK) {
		const char *st = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;

		rc = query_error(
		        conn, res,
		        st && strcmp(st, "55P03") == 0
		                ? "could not create the inbox table (another transaction held"
		                  " a lock on it for 5 s; nothing was changed)"
		                : "could not create the inbox table",
		        errbuf, errlen);
		goto out;
	}
	rc = INBOX_OK;
out:
	PQclear(res);
	free(sql);
	free(ddl);
	return rc;
}

/* The claim is one statement and one round trip in every case but a lost race:
 *  - cur reads the row as the statement's snapshot sees it, without locking it. When that
 *    already says "confirmed" or "another consumer's live lease" the INSERT is skipped, so a
 *    duplicate delivery neither writes nor locks anything.
 *  - Otherwise INSERT ... ON CONFLICT DO UPDATE either inserts the row, or locks the newest
 *    committed version of it (waiting for a transaction that holds it) and takes it over only
 *    when the condition still holds on that version. This is what keeps two consumers from
 *    both claiming: the second one's ON CONFLICT waits for the first one's transaction and
 *    then sees its lease (or its confirmation).
 * When the INSERT took nothing and cur does not say why, the row changed after the snapshot
 * was taken (a race): the answer is -1 and a second statement, with a fresh snapshot, reads
 * what the ON CONFLICT saw; we hold the row's lock, so it cannot change in between.
 * clock_timestamp(), not now(): now() is the start of the caller's transaction, which may be
 * long ago, and would hand out leases that end too soon. */
static const char claim_fmt[] =
        "WITH cur AS ("
        " SELECT confirmed_at IS NOT NULL AS done,"
        " (claimed_by <> $2::text AND claimed_until >= clock_timestamp()) AS busy"
        " FROM %s WHERE message_id = $1::text),"
        " ins AS ("
        " INSERT INTO %s AS i (message_id, claimed_by, claimed_until)"
        " SELECT $1::text, $2::text, clock_timestamp() + $3::bigint * interval '1 millisecond'"
        " WHERE NOT EXISTS (SELECT 1 FROM cur WHERE done OR busy)"
        " ON CONFLICT (message_id) DO UPDATE"
        " SET claimed_by = excluded.claimed_by,"
        " claimed_until = clock_timestamp() + $3::bigint * interval '1 millisecond'"
        " WHERE i.confirmed_at IS NULL"
        " AND (i.claimed_until IS NULL OR i.claimed_until < clock_timestamp()"
        " OR i.claimed_by = excluded.claimed_by)"
        " RETURNING 1)"
        " SELECT CASE WHEN EXISTS (SELECT 1 FROM ins) THEN 0"
        " WHEN EXISTS (SELECT 1 FROM cur WHERE done) THEN 1"
        " WHEN EXISTS (SELECT 1 FROM cur WHERE busy) THEN 2"
        " ELSE -1 END";

static const char claim_recheck_fmt[] =
        "SELECT confirmed_at IS NOT NULL FROM %s WHERE message_id = $1::text";

/* conn and the strings are borrowed; nothing is kept after the call. */
int inbox_claim(PGconn *conn, const char *table, const char *message_id, const char *consumer,
                int64_t lease_ms, char *errbuf, size_t errlen)
{
	char sql[SQL_MAX], lease[24];
	const char *params[3];
	PGresult *res = NULL;
	int rc;

	rc = check_claim_args(conn, &table, message_id, consumer, errbuf, errlen);
	if (rc != 0)
		return rc;
	if (lease_ms < 1 || lease_ms > LEASE_MAX_MS) {
		liboutbox_set_err(errbuf, errlen, "lease_ms must be 1 to 604800000 (7 days)", NULL);
		return INBOX_ERR_INVALID;
	}
	if (!build_sql(sql, sizeof(sql), claim_fmt, table, table)) {
		liboutbox_set_err(errbuf, errlen, "invalid table name (too long)", table);
		return INBOX_ERR_INVALID;
	}
	snprintf(lease, sizeof(lease), "%lld", (long long)lease_ms);
	params[0] = message_id;
	params[1] = consumer;
	params[2] = lease;
	res = PQexecParams(conn, sql, 3, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
		rc = query_error(conn, res, "could not claim the message", errbuf, errlen);
		goto out;
	}
	switch (PQgetvalue(res, 0, 0)[0]) {
	case '0':
		rc = INBOX_CLAIMED;
		goto out;
	case '1':
		rc = INBOX_DONE;
		goto out;
	case '2':
		rc = INBOX_BUSY;
		goto out;
	default:
		break;
	}

	/* Lost a race (see above). A row we did not find again cannot be ours: "try later". */
	PQclear(res);
	res = NULL;
	if (!build_sql(sql, sizeof(sql), claim_recheck_fmt, table)) {
		liboutbox_set_err(errbuf, errlen, "invalid table name (too long)", table);
		rc = INBOX_ERR_INVALID;
		goto out;
	}
	res = PQexecParams(conn, sql, 1, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		rc = query_error(conn, res, "could not claim the message", errbuf, errlen);
		goto out;
	}
	rc = PQntuples(res) == 1 && PQgetvalue(res, 0, 0)[0] == 't' ? INBOX_DONE : INBOX_BUSY;
out:
	PQclear(res);
	return rc;
}

enum own_row_change { OWN_CONFIRM, OWN_FORGET };

/* Confirms or forgets consumer's own row of message_id: INBOX_OK when the statement changed
 * it, INBOX_LOST when there was none to change, or INBOX_ERR_*.
 *  - confirm is fenced by claimed_by alone: a lease that ran out is still good while nobody
 *    else claimed the message, and a takeover changes claimed_by, which the UPDATE rechecks
 *    on the newest version after waiting for the row lock. COALESCE keeps the first
 *    confirmation's time.
 *  - forget deletes (rather than clearing the holder): nothing is left behind for the purge,
 *    and a consumer waiting on the row lock inserts the row afresh once this commits. */
static int change_own_row(PGconn *conn, const char *table, const char *message_id,
                          const char *consumer, enum own_row_change change, char *errbuf,
                          size_t errlen)
{
	char sql[SQL_MAX];
	const char *params[2] = { message_id, consumer };
	const char *what;
	PGresult *res;
	bool built;
	int rc;

	rc = check_claim_args(conn, &table, message_id, consumer, errbuf, errlen);
	if (rc != 0)
		return rc;
	if (change == OWN_CONFIRM) {
		what = "could not confirm the message";
		built = build_sql(sql, sizeof(sql),
		                  "UPDATE %s SET confirmed_at = COALESCE(confirmed_at,"
		                  " clock_timestamp())"
		                  " WHERE message_id = $1::text AND claimed_by = $2::text",
		                  table);
	} else {
		what = "could not forget the message";
		built = build_sql(sql, sizeof(sql),
		                  "DELETE FROM %s WHERE message_id = $1::text"
		                  " AND claimed_by = $2::text AND confirmed_at IS NULL",
		                  table);
	}
	if (!built) {
		liboutbox_set_err(errbuf, errlen, "invalid table name (too long)", table);
		return INBOX_ERR_INVALID;
	}
	res = PQexecParams(conn, sql, 2, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
		rc = query_error(conn, res, what, errbuf, errlen);
	else
		rc = strcmp(PQcmdTuples(res), "1") == 0 ? INBOX_OK : INBOX_LOST;
	PQclear(res);
	return rc;
}

int inbox_confirm(PGconn *conn, const char *table, const char *message_id, const char *consumer,
                  char *errbuf, size_t errlen)
{
	return change_own_row(conn, table, message_id, consumer, OWN_CONFIRM, errbuf, errlen);
}

int inbox_forget(PGconn *conn, const char *table, const char *message_id, const char *consumer,
                 char *errbuf, size_t errlen)
{
	return change_own_row(conn, table, message_id, consumer, OWN_FORGET, errbuf, errlen);
}

/* Each part walks its partial index in age order and stops after limit rows, so a slice
 * costs the same however much is waiting; SKIP LOCKED steps around rows a consumer is
 * claiming or confirming right now. statement_timestamp(), not clock_timestamp(): the cut-off
 * must be stable for the index to use it. */
static const char purge_fmt[] =
        "WITH old AS ("
        " SELECT message_id FROM %s"
        " WHERE confirmed_at < statement_timestamp() - $1::bigint * interval '1 millisecond'"
        " ORDER BY confirmed_at LIMIT $2::int FOR UPDATE SKIP LOCKED),"
        " stale AS ("
        " SELECT message_id FROM %s"
        " WHERE confirmed_at IS NULL"
        " AND claimed_until < statement_timestamp() - $1::bigint * interval '1 millisecond'"
        " ORDER BY claimed_until LIMIT $2::int - (SELECT count(*) FROM old)"
        " FOR UPDATE SKIP LOCKED)"
        " DELETE FROM %s WHERE message_id = ANY (ARRAY("
        "SELECT message_id FROM old UNION ALL SELECT message_id FROM stale))";

/* PQcmdTuples() as a number, -1 when it is not one. */
static int64_t row_count(const char *s)
{
	char *end;
	long long v;

	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || v < 0)
		return -1;
	return (int64_t)v;
}

/* conn and table are borrowed. */
int64_t inbox_purge(PGconn *conn, const char *table, int64_t retention_ms, int limit, char *errbuf,
                    size_t errlen)
{
	char sql[SQL_MAX], age[24], lim[16];
	const char *params[2] = { age, lim };
	PGresult *res = NULL;
	int64_t rc;
	int err;

	err = check_args(conn, &table, NULL, NULL, errbuf, errlen);
	if (err != 0)
		return err;
	if (retention_ms < 0 || retention_ms > RETENTION_MAX_MS) {
		liboutbox_set_err(errbuf, errlen,
		                  "retention_ms must be 0 to 315360000000 (3650 days)", NULL);
		return INBOX_ERR_INVALID;
	}
	if (limit < 1 || limit > PURGE_LIMIT_MAX) {
		liboutbox_set_err(errbuf, errlen, "limit must be 1 to 10000", NULL);
		return INBOX_ERR_INVALID;
	}
	if (!build_sql(sql, sizeof(sql), purge_fmt, table, table, table)) {
		liboutbox_set_err(errbuf, errlen, "invalid table name (too long)", table);
		return INBOX_ERR_INVALID;
	}
	snprintf(age, sizeof(age), "%lld", (long long)retention_ms);
	snprintf(lim, sizeof(lim), "%d", limit);
	res = PQexecParams(conn, sql, 2, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_COMMAND_OK) {
		rc = query_error(conn, res, "could not purge the inbox", errbuf, errlen);
		goto out;
	}
	rc = row_count(PQcmdTuples(res));
	if (rc < 0) {
		liboutbox_set_err(errbuf, errlen,
		                  "could not purge the inbox: no row count in the reply", NULL);
		rc = INBOX_ERR_QUERY;
	}
out:
	PQclear(res);
	return rc;
}
