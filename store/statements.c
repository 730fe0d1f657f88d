/* The relay's statements, prepared once per connection: the claim runs many times a second and
 * the marks as often. Every write of claimed rows is fenced by the claim's token. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "store/store_private.h"

#define SQL_MAX 6144

/* The claim takes a sample when it found keyed rows (heads), for them, or when the caller asks
 * ($11: the claim floor needs the watermark to move on, a few times a second): under a steady
 * trickle of unkeyed rows the claim runs for every row or two, and the lock list was about a
 * quarter of what the claim cost the database. */
#define CLAIM_SAMPLE_FROM SAMPLE_FROM_WHEN("$11::boolean OR EXISTS (SELECT 1 FROM heads)")

/* Prepares statement name from fmt (the table's name and OIDs filled in by the caller's
 * arguments). */
int store_prepare(struct store *s, const char *name, int nparams, const char *fmt, ...)
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

/* The claim's CTEs up to b, the rows to lease, after "WITH [RECURSIVE]" and any CTE of the
 * caller's. CLAIM_KEYED has four %s (the table three times, then the alive condition) and one
 * more for the table, CLAIM_UNKEYED one. */
#define CLAIM_DISARM "disarm AS (SELECT pg_advisory_unlock_all() WHERE $1::boolean),"
#define CLAIM_KEYED                                                                        \
	" keys(k) AS ((SELECT o.ordering_key::text FROM %s o WHERE o.published_at IS NULL" \
	" AND o.ordering_key IS NOT NULL AND o.ordering_key >= COALESCE($9::text, '')"     \
	" ORDER BY o.ordering_key LIMIT 1)"                                                \
	" UNION ALL SELECT (SELECT o.ordering_key::text FROM %s o"                         \
	" WHERE o.published_at IS NULL AND o.ordering_key IS NOT NULL"                     \
	" AND o.ordering_key > keys.k ORDER BY o.ordering_key LIMIT 1)"                    \
	" FROM keys WHERE keys.k IS NOT NULL),"                                            \
	" kk AS (SELECT k FROM keys WHERE k IS NOT NULL AND k IS DISTINCT FROM $9::text"   \
	" LIMIT $10::int),"                                                                \
	" heads AS (SELECT h.seq FROM kk CROSS JOIN LATERAL (SELECT o.seq FROM %s o"       \
	" WHERE o.ordering_key = kk.k AND o.published_at IS NULL%s"                        \
	" ORDER BY o.seq LIMIT 1) h),"                                                     \
	" kc AS (SELECT o.seq, octet_length(o.body) AS len FROM %s o"                      \
	" WHERE o.seq = ANY (ARRAY(SELECT seq FROM heads)) AND o.seq <= $7::bigint"        \
	" AND o.published_at IS NULL AND o.attempts < $2::int AND o.available_at <= now()" \
	" AND (o.locked_until IS NULL OR o.locked_until < now())"                          \
	" FOR UPDATE OF o SKIP LOCKED),"
/* The lean claim's keyed part: none. kk and heads stay, empty, for the sample's columns. */
#define CLAIM_NO_KEYS                                                                   \
	" kk(k) AS (SELECT NULL::text WHERE false), heads(seq) AS (SELECT NULL::bigint" \
	" WHERE false),"
#define CLAIM_UNKEYED                                                                      \
	" uc AS (SELECT o.seq, octet_length(o.body) AS len FROM %s o"                      \
	" WHERE o.published_at IS NULL AND o.ordering_key IS NULL AND o.seq >= $6::bigint" \
	" AND o.attempts < $2::int AND o.available_at <= now()"                            \
	" AND (o.locked_until IS NULL OR o.locked_until < now())"                          \
	" ORDER BY o.seq LIMIT $3::int FOR UPDATE SKIP LOCKED),"
#define CLAIM_MERGED                                                                  \
	" c AS (SELECT seq, len FROM (SELECT * FROM kc UNION ALL SELECT * FROM uc) a" \
	" ORDER BY seq LIMIT $3::int),"
/* The byte budget: the oldest row always, then rows while the bodies, theirs included, fit
 * $8 (a row is taken only if it fits, not while the bodies before it do: that let every claim
 * go one row past the budget). */
#define CLAIM_BUDGET                                                                \
	" b AS (SELECT seq FROM (SELECT seq, sum(len) OVER (ORDER BY seq) AS upto," \
	" row_number() OVER (ORDER BY seq) AS i FROM c) x WHERE i = 1 OR upto <= $8::bigint)"
#define CLAIM_CTES CLAIM_DISARM CLAIM_KEYED CLAIM_UNKEYED CLAIM_MERGED CLAIM_BUDGET
#define CLAIM_CTES_LEAN \
	CLAIM_DISARM CLAIM_NO_KEYS CLAIM_UNKEYED " c AS (SELECT seq, len FROM uc)," CLAIM_BUDGET
/* The last column: whether an unpublished keyed row exists. The full claim knows from the
 * keys it walked (from the cursor $9 on: with one, the keys before it are not looked at); the
 * lean one looks for one in the key index (%s: the table). */
#define CLAIM_KEYS_PENDING "($9::text IS NOT NULL OR EXISTS (SELECT 1 FROM kk))"
#define CLAIM_KEYS_PENDING_LEAN                                                            \
	"($9::text IS NOT NULL OR EXISTS (SELECT 1 FROM %s o WHERE o.published_at IS NULL" \
	" AND o.ordering_key IS NOT NULL))"
/* The lease, and what is left of it by the database clock when evaluated. */
#define CLAIM_LEASE      "now() + $5::bigint * interval '1 millisecond'"
#define CLAIM_LEASE_LEFT "(extract(epoch FROM " CLAIM_LEASE " - clock_timestamp()) * 1000)::bigint"
/* The sample's columns after W, holders and their count: whether a key looked at has its head
 * above the watermark, and the last key looked at when $10 of them were. */
#define CLAIM_KEYS_SEEN                                                                     \
	" EXISTS (SELECT 1 FROM heads WHERE seq > $7::bigint) AS above,"                    \
	" CASE WHEN (SELECT count(*) FROM kk) >= $10::int THEN (SELECT max(k) FROM kk) END" \
	" AS key_cursor"

/* The seqs of array p bounded by their least and greatest: on a partitioned table
 * (docs/design.md, "A partitioned table") the bounds, known once the statement runs, leave
 * out every partition the batch cannot be in, where the array alone left out none: each
 * partition's seq index was searched for every seq of the batch, and PostgreSQL spent 2.1
 * times a plain table's CPU per message with 13 partitions (bench/history.c). On a plain
 * table they are two more conditions on the same index. */
#define SEQ_IN(p)                                                                                \
	"seq = ANY(" p "::bigint[]) AND seq BETWEEN (SELECT min(x) FROM unnest(" p "::bigint[])" \
	" x) AND (SELECT max(x) FROM unnest(" p "::bigint[]) x)"

/* A mark carried by the full claim ($12 the seqs, $13 the mark's token): the statement of
 * ST_MARK or ST_DELETE as CTE m, durable like them, so the whole claim commits durably. Its
 * rows are this relay's, under their lease, which no claim takes. A row whose lease ran out
 * meanwhile may be reached by both: whichever comes second misses it, so it is either marked,
 * or claimed again and published once more (as when another relay takes it over). It comes
 * first, where pg_stat_activity shows it (the statement's first 1 KB by default). */
#define CARRIED_HEAD "durable AS (SELECT set_config('synchronous_commit', 'on', true)), m AS ("
#define CARRIED_MARK " SET published_at = now(), locked_by = NULL, locked_until = NULL FROM durable"
#define CARRIED_WHERE                                                                 \
	" WHERE " SEQ_IN("$12") " AND locked_by = $13::text AND published_at IS NULL" \
	                        " RETURNING 1), "

/* The full claim, carrying a mark (verb "UPDATE " or "DELETE FROM " the table, then rest) or not
 * (verb NULL): CTE m, counted by the sample's row. Lean, without the keyed part. */
static int prepare_full_claim(struct store *s, const char *name, bool lean, const char *t,
                              const char *alive, const char *verb, const char *rest)
{
	char ctes[SQL_MAX], pending[512];
	bool m = verb != NULL;
	int w;

	if (lean) {
		w = snprintf(ctes, sizeof(ctes), CLAIM_CTES_LEAN, t);
		snprintf(pending, sizeof(pending), CLAIM_KEYS_PENDING_LEAN, t);
	} else {
		w = snprintf(ctes, sizeof(ctes), CLAIM_CTES, t, t, t, alive, t, t);
		snprintf(pending, sizeof(pending), "%s", CLAIM_KEYS_PENDING);
	}
	if (w < 0 || (size_t)w >= sizeof(ctes)) {
		store_set_error(s, "statement %s too long", name);
		return STORE_ERR_FATAL;
	}
	return store_prepare(
	        s, name, m ? 13 : 11,
	        "WITH %s%s%s%s%s%s%s"
	        ", u AS (UPDATE %s o SET locked_by = $4::text, locked_until = " CLAIM_LEASE
	        " FROM b WHERE o.seq = b.seq RETURNING " STORE_ROW_COLUMNS ")"
	        " SELECT u.*, NULL::bigint, NULL::text, NULL::bigint, NULL::bigint,"
	        " NULL::boolean, NULL::text, NULL::bigint, NULL::boolean FROM u"
	        " UNION ALL"
	        " SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,"
	        " NULL, NULL, s.w, h.holders, h.n, " CLAIM_LEASE_LEFT "," CLAIM_KEYS_SEEN
	        ", %s, %s" CLAIM_SAMPLE_FROM ", (SELECT count(*) FROM disarm) d",
	        lean ? "" : "RECURSIVE ", m ? CARRIED_HEAD : "", m ? verb : "", m ? t : "",
	        m ? rest : "", m ? CARRIED_WHERE : "", ctes, t,
	        m ? "(SELECT count(*) FROM m)" : "NULL::bigint", pending, s->seq_oid, s->db_oid,
	        s->seq_oid);
}

/* DESIGN §3: only the oldest unpublished row of a key is claimable (under skip-dead, the
 * oldest that is not dead), and only up to the settled ordering watermark ($7), below which no
 * transaction still in progress can commit a row. Unkeyed and keyed rows are found apart, so
 * that neither costs more than a batch, however long the backlog:
 *  - unkeyed rows: the unkeyed index in seq order from the claim floor ($6), up to a batch;
 *  - keyed rows: one head per key, key by key through the key index (a loose index scan: one
 *    descent per key, never a walk of a key's later rows), starting after the key the
 *    previous claim ended on ($9, NULL from the start) and looking at most at $10 keys. Walking
 *    keyed rows in seq order instead reads every row queued behind a head: with 37,000 rows on
 *    32 keys, each claim read all of them (2 s a claim).
 * The heads are looked up by an array of their seqs (an index condition), not by a join:
 * planned generically on a table that was empty, the join read the table from its first row
 * up to $7 (every row, by sequential or index scan) before it looked at the heads.
 * Both sets are locked (SKIP LOCKED: what another claim holds is stepped around, and the
 * conditions are checked again on the newest version of each row), merged oldest first, cut to
 * the batch ($3) and then to the byte budget ($8: rows while their bodies fit, and always the
 * first row), and leased under the claim's token ($4) for $5 ms. The disarm CTE lets the
 * wake-up lock go in the same round trip ($1; every advisory lock of the session, which holds
 * no other, and however many times it was taken).
 * With every row comes the watermark's sample (W NULL when no keyed row was found and $11 did
 * not ask for one: none taken), what is left of the lease by the database clock when that row
 * was leased, whether a key looked at has its head above the watermark, and the last key looked
 * at when $10 of them were (NULL when the keys ran out: the next claim starts from the first
 * key again). The sample is one CTE, evaluated once (MATERIALIZED) and joined into each row,
 * which makes it run, disarm included.
 * The claim is the UPDATE itself: PostgreSQL keeps its RETURNING rows once, in the portal's
 * store, where an UPDATE in a CTE under a SELECT kept them twice (the CTE's store, then the
 * portal's), a copy of every body. An UPDATE cannot answer without a row, so a claim that
 * leases none is followed by the full claim (ST_CLAIM_FULL: the same rows, then a last row, seq
 * NULL, for the sample alone), which either leases rows that came meanwhile or says why there
 * are none. The lean claims (ST_CLAIM_LEAN and its carrying variants) are the full claim
 * without the keyed part, kk and heads left empty: the small claims while no keyed row waits
 * (store/source/claim.c). Every claim says in its last column whether an unpublished keyed row
 * exists. */
static int prepare_claim(struct store *s, const char *t)
{
	const char *alive = s->opts.skip_dead ? " AND o.attempts < $2::int" : "";
	int rc;

	rc = store_prepare(s, ST_CLAIM, 11,
	                   "WITH RECURSIVE " CLAIM_CTES
	                   ", smp AS MATERIALIZED (SELECT s.w, h.holders, h.n," CLAIM_KEYS_SEEN
	                   ", " CLAIM_KEYS_PENDING " AS keys_pending" CLAIM_SAMPLE_FROM
	                   ", (SELECT count(*) FROM disarm) d)"
	                   " UPDATE %s o SET locked_by = $4::text, locked_until = " CLAIM_LEASE
	                   " FROM b, smp WHERE o.seq = b.seq RETURNING " STORE_ROW_COLUMNS
	                   ", smp.w, smp.holders, smp.n, " CLAIM_LEASE_LEFT ", smp.above,"
	                   " smp.key_cursor, NULL::bigint, smp.keys_pending",
	                   t, t, t, alive, t, t, s->seq_oid, s->db_oid, s->seq_oid, t);
	for (int lean = 0; lean < 2 && rc == 0; lean++) {
		rc = prepare_full_claim(s, lean ? ST_CLAIM_LEAN : ST_CLAIM_FULL, lean, t, alive,
		                        NULL, NULL);
		if (rc == 0)
			rc = prepare_full_claim(s, lean ? ST_CLAIM_LEAN_MARK : ST_CLAIM_MARK, lean,
			                        t, alive, "UPDATE ", CARRIED_MARK);
		if (rc == 0)
			rc = prepare_full_claim(s, lean ? ST_CLAIM_LEAN_DROP : ST_CLAIM_DROP, lean,
			                        t, alive, "DELETE FROM ", " USING durable");
	}
	return rc;
}

int store_ensure_prepared(struct store *s)
{
	const char *t = s->table;
	int rc = store_require_conn(s);

	if (rc != 0 || s->prepared)
		return rc;
	/* Admin handles (the CLI, the maintenance loop) never claim: they have no sequence
	 * resolved, and only the writes below are theirs. */
	if (!s->opts.admin && (rc = prepare_claim(s, t)) != 0)
		return rc;
	if (!s->opts.admin &&
	    (rc = store_prepare(s, ST_SAMPLE, 0, "SELECT s.w, h.holders, h.n" SAMPLE_FROM,
	                        s->seq_oid, s->db_oid, s->seq_oid)) != 0)
		return rc;

	/* Marks are durable although the session commits asynchronously: a key's next row must
	 * never be published while its predecessor could still come back unpublished. */
	if ((rc = store_prepare(
	             s, ST_MARK, 2,
	             "WITH durable AS (SELECT set_config('synchronous_commit', 'on', true))"
	             " UPDATE %s SET published_at = now(), locked_by = NULL, locked_until = NULL"
	             " FROM durable WHERE " SEQ_IN("$1") " AND locked_by = $2::text"
	                                                 " AND published_at IS NULL",
	             t)) != 0)
		return rc;
	if ((rc = store_prepare(
	             s, ST_DELETE, 2,
	             "WITH durable AS (SELECT set_config('synchronous_commit', 'on', true))"
	             " DELETE FROM %s USING durable WHERE " SEQ_IN(
	                     "$1") " AND locked_by = $2::text AND published_at IS NULL",
	             t)) != 0)
		return rc;

	/* left() counts characters, as VARCHAR(1000) does. A nack is the broker's failure, not
	 * the row's: it backs off without counting an attempt ($7). */
	if ((rc = store_prepare(
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

	if ((rc = store_prepare(s, ST_RELEASE, 2,
	                        "UPDATE %s SET locked_by = NULL, locked_until = NULL"
	                        " WHERE id = ANY($1::text[]) AND locked_by = $2::text",
	                        t)) != 0)
		return rc;
		/* Every claim of the given stems ($1, "<relay id>#<nonce>."): a token is its stem and a
	 * counter without a '.', so cutting the token after its last '.' gives its stem exactly,
	 * and a relay that shares the relay id (or its first 50 bytes) but not the nonce is never
	 * touched. Through the unkeyed and the key index, since published rows hold no lease (one
	 * arm each: this session turns bitmap scans off, so an OR of the two would walk the
	 * table). The conditions are repeated on o, so that a row claimed by someone else
	 * meanwhile is checked again on its new version and left alone. */
#define STEM_OF(a) "substring(" a "locked_by FROM '^(.*[.])[^.]*$')"
	if ((rc = store_prepare(
	             s, ST_RELEASE_ALL, 1,
	             "UPDATE %s o SET locked_by = NULL, locked_until = NULL"
	             " FROM (SELECT seq FROM %s WHERE published_at IS NULL"
	             " AND ordering_key IS NULL AND " STEM_OF(
	                     "") " = ANY($1::text[])"
	                         " UNION ALL SELECT seq FROM %s WHERE published_at IS NULL"
	                         " AND ordering_key IS NOT NULL AND " STEM_OF(
	                                 "") " = ANY($1::text[])) r"
	                                     " WHERE o.seq = r.seq AND o.published_at IS NULL"
	                                     " AND " STEM_OF("o.") " = ANY($1::text[])",
	             t, t, t)) != 0)
		return rc;
#undef STEM_OF
	if ((rc = store_prepare(
	             s, ST_RENEW, 3,
	             "UPDATE %s SET locked_until = now() + $3::bigint * interval"
	             " '1 millisecond' WHERE id = ANY($1::text[]) AND locked_by = $2::text"
	             " AND published_at IS NULL RETURNING id,"
	             " (extract(epoch FROM locked_until - clock_timestamp()) * 1000)"
	             "::bigint",
	             t)) != 0)
		return rc;

	/* The wake-up lock (schema.c): a session lock, held while the relay sleeps. */
	if (!s->opts.admin &&
	    (rc = store_prepare(s, ST_ARM, 0,
	                        "SELECT pg_try_advisory_lock(" STORE_WAKEUP_LOCK_CLASS ", %d)",
	                        s->table_key)) != 0)
		return rc;

	s->prepared = true;
	return 0;
}
