/* The relay's statements, prepared once per connection: the claim runs many times a second and
 * the marks as often. Every write of claimed rows is fenced by the claim's token. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "store/store_private.h"

#define SQL_MAX 6144

/* The watermark's sample (store/watermark.h): W first, then the transactions other than this
 * one holding a lock on the sequence, read after W (the lateral subquery depends on W, so it
 * runs once W is known). Two %u: the sequence's OID, then the database's OID and the sequence
 * again. */
#define SAMPLE_FROM                                                                              \
	" FROM (SELECT COALESCE(pg_sequence_last_value(%u::oid::regclass), 0) AS w OFFSET 0) s," \
	" LATERAL (SELECT string_agg(l.virtualtransaction, ',') AS holders, count(*) AS n"       \
	" FROM pg_locks l WHERE l.locktype = 'relation' AND l.database = %u"                     \
	" AND l.relation = %u AND l.pid IS DISTINCT FROM pg_backend_pid()"                       \
	" AND s.w IS NOT NULL) h"

/* Prepares statement name from fmt (the table or wake-up names filled in by the caller's
 * arguments). */
static int prepare_one(struct store *s, const char *name, int nparams, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));

static int prepare_one(struct store *s, const char *name, int nparams, const char *fmt, ...)
{
	char sql[SQL_MAX];
	PGresult *res = NULL;
	va_list ap;
	int rc = 0, w;

	va_start(ap, fmt);
	w = vsnprintf(sql, sizeof(sql), fmt, ap);
	va_end(ap);
	if (w < 0 || w >= SQL_MAX) {
		store_set_error(s, "statement %s too long", name);
		return STORE_ERR_FATAL;
	}
	if (PQsendPrepare(s->conn, name, sql, nparams, NULL)) {
		s->inflight = STORE_INFLIGHT_SYNC;
		res = store_collect(s);
	}
	if (PQresultStatus(res) != PGRES_COMMAND_OK) {
		rc = store_result_error(s, res, "could not prepare the relay statements");
		if (rc == STORE_ERR_FATAL) {
			char tmp[STORE_ERRMSG_MAX];
			snprintf(tmp, sizeof(tmp), "%s", s->errmsg);
			store_set_line(s, tmp, "run 'outbox-relay migrate'");
		}
	}
	PQclear(res);
	return rc;
}

/* DESIGN §3: only the oldest unpublished row of a key is claimable (under skip-dead, the
 * oldest that is not dead), and only up to the settled ordering watermark ($7), below which no
 * transaction still in progress can commit a row. The disarm CTE clears the wake-up flag in
 * the same round trip. The order is the pending index's, so the scan stops after about $3
 * rows; the byte budget ($8) then keeps the first rows whose bodies fit (always the first).
 * $4 is the claim's token, $5 the lease in ms, $6 the claim floor. The last row of the answer
 * (seq NULL) is the watermark's sample plus what is left of the lease by the database clock
 * and whether a keyed row waits above the watermark. */
static int prepare_claim(struct store *s, const char *t, const char *wake)
{
	return prepare_one(
	        s, ST_CLAIM, 8,
	        "WITH disarm AS (UPDATE %s SET armed_until = NULL"
	        " WHERE $1::boolean AND armed_until IS NOT NULL),"
	        " c AS (SELECT o.seq, octet_length(o.body) AS len FROM %s o"
	        " WHERE o.published_at IS NULL AND o.seq >= $6::bigint"
	        " AND o.attempts < $2::int"
	        " AND o.available_at <= now()"
	        " AND (o.locked_until IS NULL OR o.locked_until < now())"
	        " AND (o.ordering_key IS NULL OR (o.seq <= $7::bigint"
	        " AND NOT EXISTS (SELECT 1 FROM %s p"
	        " WHERE p.ordering_key = o.ordering_key"
	        " AND p.published_at IS NULL AND p.seq < o.seq%s)))"
	        " ORDER BY o.seq LIMIT $3::int FOR UPDATE SKIP LOCKED),"
	        " b AS (SELECT seq FROM (SELECT seq, sum(len) OVER (ORDER BY seq) - len AS before"
	        " FROM c) x WHERE before < $8::bigint),"
	        " u AS (UPDATE %s o SET locked_by = $4::text,"
	        " locked_until = now() + $5::bigint * interval '1 millisecond'"
	        " FROM b WHERE o.seq = b.seq RETURNING " STORE_ROW_COLUMNS ")"
	        " SELECT u.*, NULL::bigint, NULL::text, NULL::bigint, NULL::bigint,"
	        " NULL::boolean FROM u"
	        " UNION ALL"
	        " SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,"
	        " NULL, s.w, h.holders, h.n,"
	        " (extract(epoch FROM now() + $5::bigint * interval '1 millisecond'"
	        " - clock_timestamp()) * 1000)::bigint,"
	        /* Only the newest rows lie above the settled watermark, so this walks a few
	         * entries of the pending index at most. */
	        " EXISTS (SELECT 1 FROM %s k WHERE k.published_at IS NULL"
	        " AND k.seq > $7::bigint AND k.ordering_key IS NOT NULL"
	        " ORDER BY k.seq LIMIT 1)" SAMPLE_FROM,
	        wake, t, t, s->opts.skip_dead ? " AND p.attempts < $2::int" : "", t, t, s->seq_oid,
	        s->db_oid, s->seq_oid);
}

int store_ensure_prepared(struct store *s)
{
	char wake[STORE_NAME_MAX];
	const char *t = s->table;
	int rc = store_require_conn(s);

	if (rc != 0 || s->prepared)
		return rc;
	if (!store_wakeup_name(t, wake, sizeof(wake))) {
		store_set_error(s, "table name '%s' too long", t);
		return STORE_ERR_FATAL;
	}
	/* Admin handles (the CLI, the maintenance loop) never claim: they have no sequence
	 * resolved, and only the writes below are theirs. */
	if (!s->opts.admin && (rc = prepare_claim(s, t, wake)) != 0)
		return rc;
	if (!s->opts.admin &&
	    (rc = prepare_one(s, ST_SAMPLE, 0, "SELECT s.w, h.holders, h.n" SAMPLE_FROM, s->seq_oid,
	                      s->db_oid, s->seq_oid)) != 0)
		return rc;

	/* Marks are durable although the session commits asynchronously: a key's next row must
	 * never be published while its predecessor could still come back unpublished. */
	if ((rc = prepare_one(
	             s, ST_MARK, 2,
	             "WITH durable AS (SELECT set_config('synchronous_commit', 'on', true))"
	             " UPDATE %s SET published_at = now(), locked_by = NULL, locked_until = NULL"
	             " FROM durable WHERE id = ANY($1::text[]) AND locked_by = $2::text"
	             " AND published_at IS NULL",
	             t)) != 0)
		return rc;
	if ((rc = prepare_one(
	             s, ST_DELETE, 2,
	             "WITH durable AS (SELECT set_config('synchronous_commit', 'on', true))"
	             " DELETE FROM %s USING durable WHERE id = ANY($1::text[])"
	             " AND locked_by = $2::text AND published_at IS NULL",
	             t)) != 0)
		return rc;

	/* left() counts characters, as VARCHAR(1000) does. A nack is the broker's failure, not
	 * the row's: it backs off without counting an attempt ($7). */
	if ((rc = prepare_one(
	             s, ST_FAIL, 7,
	             "UPDATE %s o SET attempts = CASE WHEN u.dead THEN $5::int"
	             " WHEN u.counted THEN o.attempts + 1 ELSE o.attempts END,"
	             " last_error = left(u.err, 1000),"
	             " available_at = now() + u.delay * interval '1 millisecond',"
	             " locked_by = NULL, locked_until = NULL"
	             " FROM unnest($1::text[], $2::text[], $3::bigint[], $4::boolean[],"
	             " $7::boolean[]) AS u(id, err, delay, dead, counted)"
	             " WHERE o.id = u.id AND o.locked_by = $6::text AND o.published_at IS NULL",
	             t)) != 0)
		return rc;

	if ((rc = prepare_one(s, ST_RELEASE, 2,
	                      "UPDATE %s SET locked_by = NULL, locked_until = NULL"
	                      " WHERE id = ANY($1::text[]) AND locked_by = $2::text",
	                      t)) != 0)
		return rc;
	/* Every claim of this relay id, by the tokens' common prefix; through the pending
	 * index, since published rows hold no lease. */
	if ((rc = prepare_one(s, ST_RELEASE_ALL, 1,
	                      "UPDATE %s SET locked_by = NULL, locked_until = NULL"
	                      " WHERE published_at IS NULL AND starts_with(locked_by, $1::text)",
	                      t)) != 0)
		return rc;
	if ((rc = prepare_one(s, ST_RENEW, 3,
	                      "UPDATE %s SET locked_until = now() + $3::bigint * interval"
	                      " '1 millisecond' WHERE id = ANY($1::text[]) AND locked_by = $2::text"
	                      " AND published_at IS NULL RETURNING id,"
	                      " (extract(epoch FROM locked_until - clock_timestamp()) * 1000)"
	                      "::bigint",
	                      t)) != 0)
		return rc;

	if ((rc = prepare_one(
	             s, ST_ARM, 1,
	             "UPDATE %s SET armed_until = now() + $1::bigint * interval '1 millisecond'"
	             " WHERE id = 1",
	             wake)) != 0)
		return rc;

	s->prepared = true;
	return 0;
}
