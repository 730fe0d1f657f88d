/* The cursor source's statements (position.h): the lead, the read above the position, the move
 * and the exceptions' claim. Prepared once per connection, on first use. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "store/source/position.h"
#include "store/store_private.h"

#define ST_POS_READ  "outbox_position_read"
#define ST_POS_READF "outbox_position_read_fenced"
#define ST_POS_MOVE  "outbox_position_move"
#define ST_POS_CLAIM "outbox_position_claim"
#define ST_POS_FENCE "outbox_position_fence"
#define ST_POS_STEP  "outbox_position_step"
#define ST_POS_W     "outbox_position_w"

/* The read's columns after the row's (STORE_ROW_COLUMNS): what the cursor needs to know of it. */
enum { POS_COL_LATER = COL_ATTEMPTS + 1, POS_COL_DEAD, POS_COL_HELD, POS_COL_COUNT };

/* An exception of the key of row o (alias) that is older and not published: a dead one counts
 * unless relay.ordering = skip-dead ($strict). %s: the table; two %s: the alias. */
#define OLDER_EXCEPTION(o, strict, max)                                                       \
	"EXISTS (SELECT 1 FROM %s e WHERE e.ordering_key = " o ".ordering_key"                \
	" AND e.deferred_at IS NOT NULL AND e.published_at IS NULL AND e.seq < " o ".seq AND" \
	" (" strict " OR e.attempts < " max "))"

/* The read above the position ($1) up to upto: %s twice, the table. */
#define POS_READ(upto)                                                              \
	"SELECT " STORE_ROW_COLUMNS ", o.available_at > clock_timestamp(),"         \
	" o.attempts >= $4::int, o.ordering_key IS NOT NULL AND " OLDER_EXCEPTION(  \
	        "o", "$5::boolean",                                                 \
	        "$4::int") " FROM %s o WHERE o.seq > $1::bigint AND o.seq <= " upto \
	                   " AND o.published_at IS NULL ORDER BY o.seq LIMIT $3::int"

static int prepare_all(struct store *s)
{
	const char *t = s->table;
	int rc;

	if (s->position_prepared)
		return 0;
	/* $1 after, $2 the highest seq to read, $3 limit, $4 max_attempts, $5 strict. Always the
	 * last statement of a read's round trip (position_read()), after the carried move's and
	 * the fence's or W's when there are. The held test looks for any older exception: every exception is older than a row above the
	 * position. Later is by the clock, not now(): the transaction began with the statements
	 * before the read (the fence's, the move's), and a row committed since has an
	 * available_at after its start (the producer's now()) though it is due. */
	if ((rc = store_prepare(s, ST_POS_READ, 5, POS_READ("$2::bigint"), t, t)) != 0)
		return rc;
	/* The same, up to the fence the sample before it settled in this round trip (the
	 * session's outbox_relay.fence) when that is lower than $2. */
	if ((rc = store_prepare(s, ST_POS_READF, 5,
	                        POS_READ("LEAST($2::bigint,"
	                                 " current_setting('outbox_relay.fence')::bigint)"),
	                        t, t)) != 0)
		return rc;
	/* $1 from, $2 to, $3.. the passed rows, $8 max_attempts. Durable, as the lease source's
	 * mark: a position that could come back lower would only publish rows again, but a key's
	 * next row must never go while its deferred predecessor could come back undeferred. The
	 * passed rows are written only when the position is still `from` (p). */
	if ((rc = store_prepare(
	             s, ST_POS_MOVE, 8,
	             "WITH durable AS (SELECT set_config('synchronous_commit', 'on', true)),"
	             " p AS (SELECT q.position FROM %s_position q WHERE q.stream = 'main'"
	             " AND q.position = $1::bigint FOR UPDATE OF q),"
	             " d AS (UPDATE %s o SET deferred_at = now(), attempts = CASE WHEN u.dead"
	             " THEN $8::int WHEN u.counted THEN o.attempts + 1 ELSE o.attempts END,"
	             " last_error = COALESCE(left(u.err, 1000), o.last_error),"
	             " available_at = CASE WHEN u.delay < 0 THEN o.available_at"
	             " ELSE now() + u.delay * interval '1 millisecond' END"
	             " FROM p, unnest($3::bigint[], $4::text[], $5::bigint[], $6::boolean[],"
	             " $7::boolean[]) AS u(seq, err, delay, dead, counted)"
	             " WHERE o.seq = u.seq AND o.published_at IS NULL RETURNING 1)"
	             " UPDATE %s_position q SET position = $2::bigint, moved_at = now()"
	             " FROM p, durable WHERE q.stream = 'main' RETURNING (SELECT count(*) FROM d)",
	             t, t, t)) != 0)
		return rc;
	/* $1 token, $2 lease ms, $3 max_attempts, $4 limit, $5 strict. In the order of
	 * <table>_deferred_idx (key, then seq; unkeyed rows last), which holds only the
	 * exceptions: ordered by seq alone, the session's plans (no sorts) walked the seq index
	 * through every row of the table instead, 1.3 s on 300,000 rows against 0.14 ms. A
	 * key's rows are still taken oldest first; across keys the order does not matter. */
	if ((rc = store_prepare(
	             s, ST_POS_CLAIM, 5,
	             "UPDATE %s o SET locked_by = $1::text, locked_until = now() +"
	             " $2::bigint * interval '1 millisecond' FROM (SELECT d.seq FROM %s d"
	             " WHERE d.deferred_at IS NOT NULL AND d.published_at IS NULL"
	             " AND d.attempts < $3::int AND d.available_at <= now()"
	             " AND (d.locked_until IS NULL OR d.locked_until < now())"
	             " AND (d.ordering_key IS NULL OR NOT " OLDER_EXCEPTION(
	                     "d", "$5::boolean",
	                     "$3::int") ") ORDER BY d.ordering_key, d.seq LIMIT $4::int FOR UPDATE "
	                                "SKIP LOCKED) b"
	                                " WHERE o.seq = b.seq RETURNING " STORE_ROW_COLUMNS,
	             t, t, t)) != 0)
		return rc;
	/* $1 from, $2 to: the move a read carries (position_read()), which passes no rows. The
	 * move's statement without its exceptions: starting a statement that could write them
	 * opens the outbox table and each of its indexes, every time (a quarter of the relay's
	 * database time under a moderate load). Durable and compare-and-set like it. */
	if ((rc = store_prepare(s, ST_POS_STEP, 2,
	                        "WITH durable AS (SELECT set_config('synchronous_commit', 'on',"
	                        " true)) UPDATE %s_position q SET position = $2::bigint,"
	                        " moved_at = now() FROM durable WHERE q.stream = 'main'"
	                        " AND q.position = $1::bigint RETURNING 1",
	                        t)) != 0)
		return rc;
	/* $1 the fence so far: the fence's statement when it does not read the lock list, with
	 * its columns (the fence, W, no holders). */
	if ((rc = store_prepare(s, ST_POS_W, 1,
	                        "SELECT $1::bigint, COALESCE(pg_sequence_last_value("
	                        "%u::oid::regclass), 0), NULL::text, 0::bigint",
	                        s->seq_oid)) != 0)
		return rc;
	/* $1 the fence so far. The first statement of a read that samples the watermark
	 * (position_read()): the sample, and the fence the read after it may go up to, kept in
	 * the session's outbox_relay.fence. */
	if ((rc = store_prepare(s, ST_POS_FENCE, 1,
	                        "SELECT set_config('outbox_relay.fence', GREATEST($1::bigint,"
	                        " CASE WHEN h.n = 0 THEN s.w END)::text, false), s.w, h.holders,"
	                        " h.n" SAMPLE_FROM,
	                        s->seq_oid, s->db_oid, s->seq_oid)) != 0)
		return rc;
	s->position_prepared = true;
	return 0;
}

static int prepared(struct store *s)
{
	int rc = store_require_conn(s);

	if (rc == 0)
		rc = store_ensure_prepared(s);
	if (rc == 0)
		rc = prepare_all(s);
	return rc;
}

int position_check(struct store *s)
{
	return prepared(s);
}

bool store_wakeup_armed(const struct store *s)
{
	return s->armed;
}

uint64_t store_lock_list_reads(const struct store *s)
{
	return s->lock_list_reads;
}

int64_t store_watermark_safe(const struct store *s)
{
	return watermark_safe(&s->wm);
}

int64_t store_watermark_seen(const struct store *s)
{
	return s->wm.last_w;
}

/* Names this relay the leader and reads the position: 1, or 0 when there is no position row. */
static int claim_row(struct store *s, int64_t *position)
{
	char sql[256];
	const char *params[1] = { s->opts.relay_id };
	PGresult *res = NULL;
	int rc;

	if ((rc = store_format_sql(s, sql, sizeof(sql),
	                           "UPDATE %s_position SET leader = $1::text WHERE stream = 'main'"
	                           " RETURNING position",
	                           s->table)) != 0)
		return rc;
	if ((rc = store_exec(s, sql, 1, params, PGRES_TUPLES_OK, &res,
	                     "could not read the position")) != 0)
		return rc;
	if (PQntuples(res) == 1 && store_parse_int64(PQgetvalue(res, 0, 0), position) == 0)
		rc = 1;
	PQclear(res);
	return rc;
}

/* The first position row: below every unpublished row, and never past the settled watermark
 * (a row a running transaction may still commit). */
static int make_row(struct store *s)
{
	char sql[1024], safe[24];
	const char *params[2] = { safe, s->opts.relay_id };
	int rc;

	snprintf(safe, sizeof(safe), "%lld", (long long)watermark_safe(&s->wm));
	if ((rc = store_format_sql(
	             s, sql, sizeof(sql),
	             "INSERT INTO %s_position (stream, position, leader) SELECT 'main',"
	             " LEAST(COALESCE(LEAST((SELECT min(seq) FROM %s WHERE published_at IS NULL"
	             " AND ordering_key IS NULL), (SELECT min(seq) FROM %s WHERE published_at IS"
	             " NULL AND ordering_key IS NOT NULL)) - 1, (SELECT max(seq) FROM %s), 0),"
	             " $1::bigint), $2::text ON CONFLICT (stream) DO NOTHING",
	             s->table, s->table, s->table, s->table)) != 0)
		return rc;
	return store_exec(s, sql, 2, params, PGRES_COMMAND_OK, NULL,
	                  "could not make the position row");
}

int position_lead(struct store *s, int64_t *position)
{
	char sql[160];
	PGresult *res = NULL;
	bool got;
	int rc;

	if ((rc = prepared(s)) != 0)
		return rc;
	snprintf(sql, sizeof(sql), "SELECT pg_try_advisory_lock(" STORE_LEAD_LOCK_CLASS ", %d)",
	         s->table_key);
	if ((rc = store_exec(s, sql, 0, NULL, PGRES_TUPLES_OK, &res,
	                     "could not take the table's lead")) != 0)
		return rc;
	got = PQntuples(res) == 1 && PQgetvalue(res, 0, 0)[0] == 't';
	PQclear(res);
	if (!got || (rc = claim_row(s, position)) != 0)
		return rc; /* another leads (0), leading (1), or an error */
	/* No row yet. The lock stays taken (a session lock taken again only counts twice):
	 * while a transaction keeps the watermark from settling, 0, and the next call goes on. */
	if ((rc = store_settle_watermark(s)) != 0)
		return rc < 0 ? rc : 0;
	if ((rc = make_row(s)) != 0)
		return rc;
	rc = claim_row(s, position);
	if (rc == 0) {
		store_set_error(s, "%s_position has no 'main' row after making it", s->table);
		rc = STORE_ERR_QUERY;
	}
	return rc;
}

/* Feeds the watermark the sample of row 0 of res, three columns from col on: W, the holders
 * and their count. A NULL W: the statement took none. */
static void feed_sample(struct store *s, const PGresult *res, int col)
{
	int64_t n = -1;

	if (PQgetisnull(res, 0, col))
		return;
	if (store_parse_int64(PQgetvalue(res, 0, col + 2), &n) != 0)
		n = -1;
	store_feed_sample(s, PQgetvalue(res, 0, col),
	                  PQgetisnull(res, 0, col + 1) ? "" : PQgetvalue(res, 0, col + 1), n);
	s->sampled_ms = clock_mono_ms();
	s->lock_list_reads++;
}

/* The read's answer into out and seen[]. */
static int parse_read(struct store *s, const PGresult *res, struct store_batch *out,
                      struct position_seen **seen, size_t *seen_cap)
{
	int nt = PQntuples(res);
	size_t total = 0, used = 0, k = 0;

	out->n = 0;
	if (PQnfields(res) != POS_COL_COUNT) {
		store_set_error(s, "the position read returned %d columns", PQnfields(res));
		return STORE_ERR_QUERY;
	}
	if (nt == 0)
		return 0;
	if ((size_t)nt > *seen_cap) {
		struct position_seen *p = realloc(*seen, (size_t)nt * sizeof(*p));
		if (!p)
			goto nomem;
		*seen = p;
		*seen_cap = (size_t)nt;
	}
	for (int i = 0; i < nt; i++)
		total += store_row_bytes(res, i);
	if (store_batch_reserve(out, nt, total) != 0)
		goto nomem;
	for (int i = 0; i < nt; i++, k++) {
		if (store_batch_copy_row(res, i, out, &out->rows[k], &used) != 0) {
			store_set_error(s, "the position read returned an unreadable number");
			return STORE_ERR_QUERY;
		}
		(*seen)[k].later = PQgetvalue(res, i, POS_COL_LATER)[0] == 't';
		(*seen)[k].dead = PQgetvalue(res, i, POS_COL_DEAD)[0] == 't';
		(*seen)[k].held = PQgetvalue(res, i, POS_COL_HELD)[0] == 't';
	}
	out->buf_len = used;
	out->n = k;
	return 0;
nomem:
	store_set_error(s, "out of memory");
	return STORE_ERR_NOMEM;
}

/* A move found the position no longer where it was moved from. */
static void move_lost_lead(struct store *s, int64_t from)
{
	store_set_error(s, "the position of %s is no longer %lld: another relay leads the table",
	                s->table, (long long)from);
}

int position_read(struct store *s, struct position_carry *carry, const struct position_ask *ask,
                  struct store_batch *out, struct position_seen **seen, size_t *seen_cap,
                  int64_t *fence_used)
{
	char from[24], to[24], fence[24], after[24], upto[24], limit[16], max[16];
	const char *step_p[] = { from, to }, *fence_p[] = { fence };
	const char *read_p[] = { after, upto, limit, max, s->opts.skip_dead ? "false" : "true" };
	struct store_call calls[3];
	PGresult *res[3] = { NULL, NULL, NULL };
	bool w_first = ask->sample || ask->w;
	PGresult **sample = carry ? &res[1] : &res[0], **rows = w_first ? sample + 1 : sample;
	int64_t used = ask->fence, w = 0;
	int n = 0, rc;

	out->n = 0;
	*fence_used = ask->fence;
	if ((rc = prepared(s)) != 0)
		return rc;
	/* The move first: it passes no rows. */
	if (carry) {
		carry->moved = 0;
		snprintf(from, sizeof(from), "%lld", (long long)carry->from);
		snprintf(to, sizeof(to), "%lld", (long long)carry->to);
		calls[n++] = (struct store_call){ ST_POS_STEP, 2, step_p };
	}
	snprintf(fence, sizeof(fence), "%lld", (long long)ask->fence);
	if (w_first)
		calls[n++] =
		        (struct store_call){ ask->sample ? ST_POS_FENCE : ST_POS_W, 1, fence_p };
	/* Without the sample the fence is the one given; with it, what the sample settled. The
	 * sample's statement ends before the read's begins, so the read's snapshot sees every row
	 * up to a W that no transaction held when the sample looked (watermark.h). */
	snprintf(after, sizeof(after), "%lld", (long long)ask->after);
	snprintf(upto, sizeof(upto), "%lld",
	         ask->bounded && !ask->sample ? (long long)ask->fence : (long long)INT64_MAX);
	snprintf(limit, sizeof(limit), "%d", ask->limit);
	snprintf(max, sizeof(max), "%d", s->opts.max_attempts);
	calls[n++] = (struct store_call){ ask->bounded && ask->sample ? ST_POS_READF : ST_POS_READ,
		                          5, read_p };
	if ((rc = store_exec_calls(s, calls, res, n, "could not read rows above the position")) !=
	    0)
		return rc;
	if (w_first &&
	    (PQntuples(*sample) != 1 || store_parse_int64(PQgetvalue(*sample, 0, 0), &used) != 0 ||
	     store_parse_int64(PQgetvalue(*sample, 0, 1), &w) != 0)) {
		store_set_error(s, "the position read's sample returned something unreadable");
		rc = STORE_ERR_QUERY;
		goto out;
	}
	if (ask->sample)
		feed_sample(s, *sample, 1);
	else if (ask->w)
		watermark_seen(&s->wm, w); /* no lock list: nothing is settled */
	*fence_used = used;
	if (carry && PQntuples(res[0]) != 1) {
		/* Not moved: another relay leads, and its position says what may be read. */
		move_lost_lead(s, carry->from);
		goto out;
	}
	if (carry)
		carry->moved = 1;
	rc = parse_read(s, *rows, out, seen, seen_cap);
out:
	for (int i = 0; i < 3; i++)
		PQclear(res[i]);
	return rc;
}

static int64_t pass_seq(const void *items, size_t i)
{
	return ((const struct position_pass *)items)[i].seq;
}

static const char *pass_error(const void *items, size_t i)
{
	return ((const struct position_pass *)items)[i].error;
}

static int64_t pass_delay(const void *items, size_t i)
{
	return ((const struct position_pass *)items)[i].delay_ms;
}

static bool pass_dead(const void *items, size_t i)
{
	return ((const struct position_pass *)items)[i].dead;
}

static bool pass_counted(const void *items, size_t i)
{
	return ((const struct position_pass *)items)[i].counted;
}

int position_move(struct store *s, int64_t from, int64_t to, const struct position_pass *passes,
                  size_t n)
{
	char f[24], t[24], m[24];
	const char *params[8] = { f, t, NULL, NULL, NULL, NULL, NULL, m };
	PGresult *res = NULL;
	int rc;

	if ((rc = prepared(s)) != 0)
		return rc;
	if ((rc = store_int_array(s, STORE_SLOT_IDS, passes, n, pass_seq, &params[2])) != 0 ||
	    (rc = store_text_array(s, STORE_SLOT_ERRORS, passes, n, pass_error, true,
	                           &params[3])) != 0 ||
	    (rc = store_int_array(s, STORE_SLOT_DELAYS, passes, n, pass_delay, &params[4])) != 0 ||
	    (rc = store_bool_array(s, STORE_SLOT_DEAD, passes, n, pass_dead, &params[5])) != 0 ||
	    (rc = store_bool_array(s, STORE_SLOT_COUNTED, passes, n, pass_counted, &params[6])) !=
	            0)
		return rc;
	snprintf(f, sizeof(f), "%lld", (long long)from);
	snprintf(t, sizeof(t), "%lld", (long long)to);
	snprintf(m, sizeof(m), "%d", s->opts.max_attempts);
	if ((rc = store_exec_prepared(s, ST_POS_MOVE, 8, params, PGRES_TUPLES_OK, NULL, &res,
	                              "could not move the position")) != 0)
		return rc;
	rc = PQntuples(res) == 1 ? 1 : 0;
	PQclear(res);
	if (rc == 0)
		move_lost_lead(s, from);
	return rc;
}

int position_claim_deferred(struct store *s, int limit, struct store_batch *out)
{
	char lease[24], m[24], l[24];
	const char *params[5] = { NULL, lease, m, l, s->opts.skip_dead ? "false" : "true" };
	PGresult *res = NULL;
	size_t total = 0, used = 0, k = 0;
	int rc, nt;

	out->n = 0;
	if ((rc = prepared(s)) != 0)
		return rc;
	/* The lease source's claim token: store_mark_*() and store_release() go by it. */
	if ((rc = store_claim_token_next(s, out->token, sizeof(out->token))) != 0)
		return rc;
	params[0] = out->token;
	snprintf(lease, sizeof(lease), "%lld", (long long)s->opts.lease_ms);
	snprintf(m, sizeof(m), "%d", s->opts.max_attempts);
	snprintf(l, sizeof(l), "%d", limit);
	if ((rc = store_exec_prepared(s, ST_POS_CLAIM, 5, params, PGRES_TUPLES_OK, NULL, &res,
	                              "could not claim deferred rows")) != 0)
		return rc;
	nt = PQntuples(res);
	for (int i = 0; i < nt; i++)
		total += store_row_bytes(res, i);
	if (nt > 0 && store_batch_reserve(out, nt, total) != 0) {
		store_set_error(s, "out of memory");
		rc = STORE_ERR_NOMEM;
		goto out;
	}
	for (int i = 0; i < nt; i++, k++) {
		if (store_batch_copy_row(res, i, out, &out->rows[k], &used) != 0) {
			store_set_error(s, "the deferred claim returned an unreadable number");
			rc = STORE_ERR_QUERY;
			goto out;
		}
	}
	out->buf_len = used;
	out->n = k;
	if (out->n > 1)
		store_sort_rows(out);
	out->lease_deadline_ms = clock_mono_ms() + s->opts.lease_ms;
out:
	PQclear(res);
	return rc;
}

int position_disarm(struct store *s)
{
	char sql[160];
	int rc;

	if (!s->armed)
		return 0;
	snprintf(sql, sizeof(sql), "SELECT pg_advisory_unlock(" STORE_WAKEUP_LOCK_CLASS ", %d)",
	         s->table_key);
	rc = store_exec(s, sql, 0, NULL, PGRES_TUPLES_OK, NULL, "could not disarm the wake-up");
	if (rc == 0)
		s->armed = false;
	return rc;
}
