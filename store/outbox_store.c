/* The relay's hot path on PostgreSQL: connecting, the prepared claim (lease + ordering keys),
 * marking rows published or failed, releasing leases, arming the wake-up flag and draining
 * notifications. Errors are classified here into reconnect / retry / fatal. */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/utf8.h"
#include "store/outbox_store.h"
#include "store/store_private.h"

/* A claimed batch may carry large bodies, but never more than this in one go. */
#define BATCH_BUF_MAX ((size_t)1 << 30)
/* Parameter literals: 10000 ids or 10000 error texts of 1000 characters fit. */
#define ARRAY_BUF_MAX  ((size_t)64 << 20)
#define ELEM_CHARS_MAX 1000
#define SQL_MAX        4096

/* Columns a store_row needs, in the order parse_batch() reads them. */
#define ROW_COLUMNS                                                              \
	"o.seq, o.id, o.exchange_name, o.routing_key, o.body, o.body_encoding, " \
	"o.content_type, o.headers, o.properties, o.ordering_key, "              \
	"floor(extract(epoch FROM o.created_at))::bigint, o.attempts"
enum {
	COL_SEQ,
	COL_ID,
	COL_EXCHANGE,
	COL_ROUTING_KEY,
	COL_BODY,
	COL_BODY_ENCODING,
	COL_CONTENT_TYPE,
	COL_HEADERS,
	COL_PROPERTIES,
	COL_ORDERING_KEY,
	COL_CREATED_AT,
	COL_ATTEMPTS,
	/* the claim's extra row (seq NULL): the ordering watermark's sample */
	COL_WM_SEQ,
	COL_WM_XMIN,
	COL_WM_XMAX,
	COL_WM_KEYED, /* a keyed row above the settled watermark waits */
	COL_COUNT
};

/* Names of the prepared statements (per connection). */
#define ST_CLAIM       "outbox_claim"
#define ST_MARK        "outbox_mark"
#define ST_DELETE      "outbox_delete"
#define ST_FAIL        "outbox_fail"
#define ST_RELEASE     "outbox_release"
#define ST_RELEASE_ALL "outbox_release_all"
#define ST_ARM         "outbox_arm"

/* Columns store_connect() insists on in relay mode (DESIGN §1). */
static const char *const required_columns[] = {
	"seq",           "id",           "exchange_name", "routing_key",  "body",
	"body_encoding", "content_type", "headers",       "properties",   "ordering_key",
	"txid",          "created_at",   "available_at",  "published_at", "attempts",
	"last_error",    "locked_by",    "locked_until",
};

/* ---- errors ---- */

/* Copies text as one line: newlines become spaces, trailing blanks go. */
static void set_line(struct store *s, const char *prefix, const char *text)
{
	size_t n;

	/* Truncation is fine here (the message stays one readable line); checking the result
	 * also tells -Wformat-truncation that it was considered. */
	if (snprintf(s->errmsg, sizeof(s->errmsg), "%s%s%s", prefix ? prefix : "",
	             prefix && text && text[0] ? ": " : "", text ? text : "") < 0)
		s->errmsg[0] = '\0';
	for (char *c = s->errmsg; *c; c++)
		if (*c == '\n' || *c == '\r' || *c == '\t')
			*c = ' ';
	n = strlen(s->errmsg);
	while (n > 0 && s->errmsg[n - 1] == ' ')
		s->errmsg[--n] = '\0';
}

void store_set_error(struct store *s, const char *fmt, ...)
{
	va_list ap;
	char tmp[STORE_ERRMSG_MAX];

	va_start(ap, fmt);
	vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	set_line(s, NULL, tmp);
}

static bool sqlstate_is(const char *st, const char *want)
{
	return st && strncmp(st, want, strlen(want)) == 0;
}

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* How long a relay connection waits for an answer before it gives the connection up: a
 * statement that outlasts the lease is futile (its rows may be claimed by another relay by
 * then), and a server or network path that stopped answering must not hang the relay.
 * Admin connections (the CLI, the maintenance loop) wait as long as the server takes. */
static int64_t answer_timeout_ms(const struct store *s)
{
	return s->opts.admin ? 0 : s->opts.lease_ms;
}

/* Waits until the next result can be read without blocking. False when the answer timeout
 * ran out first: the handle then remembers it, and the caller's store_result_error() reports
 * it and drops the connection (a request is still in flight on it). */
static bool await_result(struct store *s, int64_t deadline)
{
	if (deadline == 0)
		return true;
	while (PQisBusy(s->conn)) {
		int64_t left = deadline - mono_ms();
		struct pollfd p = { .fd = PQsocket(s->conn), .events = POLLIN };
		int rc;

		if (p.fd < 0)
			return true; /* no socket: PQgetResult() says why */
		if (left <= 0) {
			s->no_answer = true;
			return false;
		}
		rc = poll(&p, 1, left > INT_MAX ? INT_MAX : (int)left);
		if (rc < 0 && errno != EINTR)
			return true; /* libpq reports what is wrong with the socket */
		if (rc > 0 && !PQconsumeInput(s->conn))
			return true; /* likewise: PQgetResult() returns the error */
	}
	return true;
}

/* Reads every result of the request in flight and returns the one that tells how it went
 * (the first error, else the last result; the caller clears it), or NULL. */
static PGresult *collect(struct store *s)
{
	int64_t limit = answer_timeout_ms(s);
	int64_t deadline = limit > 0 ? mono_ms() + limit : 0;
	PGresult *keep = NULL, *r;

	s->inflight = STORE_INFLIGHT_NONE;
	while (await_result(s, deadline) && (r = PQgetResult(s->conn)) != NULL) {
		bool keep_failed = keep && PQresultStatus(keep) == PGRES_FATAL_ERROR;

		if (keep_failed) {
			PQclear(r);
			continue;
		}
		PQclear(keep);
		keep = r;
	}
	if (s->no_answer) {
		PQclear(keep);
		return NULL;
	}
	return keep;
}

/* The answer to a request just sent with one of libpq's PQsend* calls (sent = its return). */
static PGresult *answer(struct store *s, int sent)
{
	return sent ? collect(s) : NULL;
}

int store_result_error(struct store *s, const PGresult *res, const char *what)
{
	if (s->no_answer) {
		char why[96];

		snprintf(why, sizeof(why), "no answer from PostgreSQL within %lld ms",
		         (long long)answer_timeout_ms(s));
		set_line(s, what, why);
		store_disconnect(s);
		return STORE_ERR_CONN;
	}
	const char *st = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
	const char *text = res ? PQresultErrorMessage(res) : NULL;
	bool conn_bad = !s->conn || PQstatus(s->conn) == CONNECTION_BAD;

	if (!text || !text[0])
		text = s->conn ? PQerrorMessage(s->conn) : "not connected";
	if (res && PQresultStatus(res) != PGRES_FATAL_ERROR &&
	    PQresultStatus(res) != PGRES_NONFATAL_ERROR && (!text || !text[0]))
		text = PQresStatus(PQresultStatus(res));
	set_line(s, what, text);
	/* Class 08 (connection exception) and the shutdown codes mean the server side is gone
	 * even if libpq has not noticed yet: reconnect rather than retry on this socket. */
	if (conn_bad || sqlstate_is(st, "08") || sqlstate_is(st, "57P01") ||
	    sqlstate_is(st, "57P02") || sqlstate_is(st, "57P03"))
		return STORE_ERR_CONN;
	/* Things that retrying cannot fix: the table, a column or a function is missing, or
	 * this role may not use them. */
	if (sqlstate_is(st, "42P01") || sqlstate_is(st, "42703") || sqlstate_is(st, "42501") ||
	    sqlstate_is(st, "42883") || sqlstate_is(st, "3F000"))
		return STORE_ERR_FATAL;
	if (!res)
		return STORE_ERR_NOMEM;
	return STORE_ERR_QUERY;
}

int store_require_conn(struct store *s)
{
	if (!s->conn || PQstatus(s->conn) != CONNECTION_OK) {
		set_line(s, "not connected to PostgreSQL", NULL);
		return STORE_ERR_CONN;
	}
	if (s->inflight != STORE_INFLIGHT_NONE) {
		/* A _send without its _recv would make us read someone else's result. */
		set_line(s, "a previous request is still waiting for its result", NULL);
		return STORE_ERR_QUERY;
	}
	return 0;
}

int store_exec(struct store *s, const char *sql, int nparams, const char *const *params,
               ExecStatusType want, PGresult **out, const char *what)
{
	PGresult *res;
	int rc;

	rc = store_require_conn(s);
	if (rc != 0)
		return rc;
	res = answer(s, PQsendQueryParams(s->conn, sql, nparams, NULL, params, NULL, NULL, 0));
	if (PQresultStatus(res) != want) {
		rc = store_result_error(s, res, what);
		PQclear(res);
		return rc;
	}
	if (out)
		*out = res;
	else
		PQclear(res);
	return 0;
}

/* ---- UTF-8 and array literals ---- */

const char *store_string_at(const void *items, size_t i)
{
	return ((const char *const *)items)[i];
}

static int slot_reserve(struct store *s, enum store_slot slot, size_t need)
{
	size_t cap = s->arr_cap[slot];
	char *p;

	if (need <= cap)
		return 0;
	if (need > ARRAY_BUF_MAX) {
		store_set_error(s, "parameter of %zu bytes exceeds the limit of %zu", need,
		                ARRAY_BUF_MAX);
		return STORE_ERR_NOMEM;
	}
	if (cap == 0)
		cap = 1024;
	while (cap < need)
		cap *= 2;
	if (cap > ARRAY_BUF_MAX)
		cap = ARRAY_BUF_MAX;
	p = realloc(s->arr[slot], cap);
	if (!p) {
		store_set_error(s, "out of memory");
		return STORE_ERR_NOMEM;
	}
	s->arr[slot] = p;
	s->arr_cap[slot] = cap;
	return 0;
}

int store_text_array(struct store *s, enum store_slot slot, const void *items, size_t n,
                     const char *(*get)(const void *items, size_t i), const char **out)
{
	size_t need = 3, len = 0;
	char *p;
	int rc;

	/* Worst case per element: every byte escaped, quotes and a comma. */
	for (size_t i = 0; i < n; i++) {
		const char *v = get(items, i);
		need += v ? 2 * strlen(v) + 3 : 5;
	}
	rc = slot_reserve(s, slot, need);
	if (rc != 0)
		return rc;
	p = s->arr[slot];
	p[len++] = '{';
	for (size_t i = 0; i < n; i++) {
		const char *v = get(items, i);
		size_t vlen, j = 0, chars = 0;

		if (i > 0)
			p[len++] = ',';
		if (!v) {
			memcpy(p + len, "NULL", 4);
			len += 4;
			continue;
		}
		vlen = strlen(v);
		p[len++] = '"';
		while (j < vlen && chars < ELEM_CHARS_MAX) {
			size_t k = utf8_seq_len((const unsigned char *)v + j, vlen - j);
			if (k == 0) {
				p[len++] = '?';
				j++;
			} else {
				for (size_t m = 0; m < k; m++) {
					char c = v[j + m];
					if (c == '"' || c == '\\')
						p[len++] = '\\';
					p[len++] = c;
				}
				j += k;
			}
			chars++;
		}
		p[len++] = '"';
	}
	p[len++] = '}';
	p[len] = '\0';
	*out = p;
	return 0;
}

/* A numeric/boolean array literal of n elements produced by fmt_elem. */
static int scalar_array(struct store *s, enum store_slot slot, size_t n, const char **out,
                        const struct store_failure *f, bool delays)
{
	size_t len = 0, need = 3 + n * 22;
	char *p;
	int rc;

	rc = slot_reserve(s, slot, need);
	if (rc != 0)
		return rc;
	p = s->arr[slot];
	p[len++] = '{';
	for (size_t i = 0; i < n; i++) {
		int w;
		if (delays)
			w = snprintf(p + len, need - len, "%s%lld", i ? "," : "",
			             (long long)(f[i].delay_ms > 0 ? f[i].delay_ms : 0));
		else
			w = snprintf(p + len, need - len, "%s%s", i ? "," : "",
			             f[i].dead ? "t" : "f");
		if (w < 0 || (size_t)w >= need - len) {
			store_set_error(s, "could not format a parameter array");
			return STORE_ERR_NOMEM;
		}
		len += (size_t)w;
	}
	p[len++] = '}';
	p[len] = '\0';
	*out = p;
	return 0;
}

/* ---- handle ---- */

void store_batch_init(struct store_batch *b)
{
	memset(b, 0, sizeof(*b));
}

void store_batch_free(struct store_batch *b)
{
	if (!b)
		return;
	free(b->rows);
	free(b->buf);
	memset(b, 0, sizeof(*b));
}

/* Ownership: opts and its strings are borrowed for the handle's lifetime. */
struct store *store_new(const struct store_options *opts)
{
	struct store *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	s->opts = *opts;
	/* An unusable name is remembered as "" and refused at connect with a message. */
	if (opts->table && identifier_valid(opts->table))
		snprintf(s->table, sizeof(s->table), "%s", opts->table);
	return s;
}

void store_disconnect(struct store *s)
{
	if (!s)
		return;
	PQfinish(s->conn);
	s->conn = NULL;
	s->prepared = false;
	s->inflight = STORE_INFLIGHT_NONE;
	s->no_answer = false;
}

void store_free(struct store *s)
{
	if (!s)
		return;
	store_disconnect(s);
	for (int i = 0; i < STORE_SLOT_COUNT; i++)
		free(s->arr[i]);
	free(s);
}

const char *store_errmsg(const struct store *s)
{
	return s ? s->errmsg : "no store";
}

bool store_connected(const struct store *s)
{
	return s && s->conn && PQstatus(s->conn) == CONNECTION_OK;
}

int store_socket(const struct store *s)
{
	return store_connected(s) ? PQsocket(s->conn) : -1;
}

/* Prepares statement name from fmt (the table or wake-up names filled in by the caller's
 * arguments). */
static int prepare_one(struct store *s, const char *name, int nparams, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));

static int prepare_one(struct store *s, const char *name, int nparams, const char *fmt, ...)
{
	char sql[SQL_MAX];
	PGresult *res;
	va_list ap;
	int rc = 0, w;

	va_start(ap, fmt);
	w = vsnprintf(sql, sizeof(sql), fmt, ap);
	va_end(ap);
	if (w < 0 || w >= SQL_MAX) {
		store_set_error(s, "statement %s too long", name);
		return STORE_ERR_FATAL;
	}
	res = answer(s, PQsendPrepare(s->conn, name, sql, nparams, NULL));
	if (PQresultStatus(res) != PGRES_COMMAND_OK) {
		rc = store_result_error(s, res, "could not prepare the relay statements");
		if (rc == STORE_ERR_FATAL) {
			char tmp[STORE_ERRMSG_MAX];
			snprintf(tmp, sizeof(tmp), "%s", s->errmsg);
			set_line(s, tmp, "run 'outbox-relay migrate'");
		}
	}
	PQclear(res);
	return rc;
}

/* Prepared once per connection: the claim and the marks run thousands of times a second. */
static int prepare_statements(struct store *s)
{
	char wake[STORE_NAME_MAX];
	const char *t = s->table;
	int rc;

	if (!store_wakeup_name(t, wake, sizeof(wake))) {
		store_set_error(s, "table name '%s' too long", t);
		return STORE_ERR_FATAL;
	}

	/* DESIGN §3: only the oldest unpublished row of a key is claimable (under skip-dead,
	 * the oldest that is not dead), and only once no transaction still in progress can
	 * commit an earlier row of that key. Comparing the row's own txid with the snapshot's
	 * xmin is not enough: a transaction gets its id at its first write, so one with a
	 * higher id may hold a lower seq. Instead keyed rows are claimable up to a watermark
	 * seq that is known settled (see struct ordering_watermark in store_private.h). The
	 * disarm CTE clears the wake-up flag in the same round trip. The order is the pending
	 * index's, so the scan stops after about $3 rows. */
	rc = prepare_one(
	        s, ST_CLAIM, 9,
	        "WITH disarm AS (UPDATE %s SET armed_until = NULL"
	        " WHERE $1::boolean AND armed_until IS NOT NULL),"
	        " c AS (SELECT o.seq FROM %s o"
	        " WHERE o.published_at IS NULL AND o.seq >= $6::bigint"
	        " AND o.attempts < $2::int"
	        " AND o.available_at <= now()"
	        " AND (o.locked_until IS NULL OR o.locked_until < now())"
	        " AND (o.ordering_key IS NULL OR ("
	        "o.seq <= CASE WHEN pg_snapshot_xmin(pg_current_snapshot()) >= $8::xid8"
	        " THEN $9::bigint ELSE $7::bigint END"
	        " AND NOT EXISTS (SELECT 1 FROM %s p"
	        " WHERE p.ordering_key = o.ordering_key"
	        " AND p.published_at IS NULL AND p.seq < o.seq%s)))"
	        " ORDER BY o.seq LIMIT $3::int FOR UPDATE SKIP LOCKED),"
	        " u AS (UPDATE %s o SET locked_by = $4::text,"
	        " locked_until = now() + $5::bigint * interval '1 millisecond'"
	        " FROM c WHERE o.seq = c.seq RETURNING " ROW_COLUMNS ")"
	        " SELECT u.*, NULL::bigint, NULL::text, NULL::text, NULL::boolean FROM u"
	        " UNION ALL"
	        " SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,"
	        " NULL, COALESCE(pg_sequence_last_value("
	        "pg_get_serial_sequence('%s', 'seq')::regclass), 0),"
	        " pg_snapshot_xmin(pg_current_snapshot())::text,"
	        " pg_snapshot_xmax(pg_current_snapshot())::text,"
	        /* Only the newest rows lie above the settled watermark, so this walks a few
	              * entries of the pending index at most. */
	        " EXISTS (SELECT 1 FROM %s k WHERE k.published_at IS NULL"
	        " AND k.seq > $7::bigint AND k.ordering_key IS NOT NULL"
	        " ORDER BY k.seq LIMIT 1)",
	        wake, t, t, s->opts.skip_dead ? " AND p.attempts < $2::int" : "", t, t, t);
	if (rc != 0)
		return rc;

	if ((rc = prepare_one(
	             s, ST_MARK, 1,
	             "WITH durable AS (SELECT set_config('synchronous_commit', 'on', true))"
	             " UPDATE %s SET published_at = now(), locked_by = NULL, locked_until = NULL"
	             " FROM durable WHERE id = ANY($1::text[]) AND published_at IS NULL",
	             t)) != 0)
		return rc;

	if ((rc = prepare_one(
	             s, ST_DELETE, 1,
	             "WITH durable AS (SELECT set_config('synchronous_commit', 'on', true))"
	             " DELETE FROM %s USING durable WHERE id = ANY($1::text[])",
	             t)) != 0)
		return rc;

	/* Fenced by locked_by: a relay whose lease ran out must not charge an attempt to a row
	 * another relay now holds. left() counts characters, as VARCHAR(1000) does. */
	if ((rc = prepare_one(
	             s, ST_FAIL, 6,
	             "UPDATE %s o SET attempts = CASE WHEN u.dead THEN $5::int"
	             " ELSE o.attempts + 1 END,"
	             " last_error = left(u.err, 1000),"
	             " available_at = now() + u.delay * interval '1 millisecond',"
	             " locked_by = NULL, locked_until = NULL"
	             " FROM unnest($1::text[], $2::text[], $3::bigint[], $4::boolean[])"
	             " AS u(id, err, delay, dead)"
	             " WHERE o.id = u.id AND o.locked_by = $6::text AND o.published_at IS NULL",
	             t)) != 0)
		return rc;

	if ((rc = prepare_one(s, ST_RELEASE, 2,
	                      "UPDATE %s SET locked_by = NULL, locked_until = NULL"
	                      " WHERE id = ANY($1::text[]) AND locked_by = $2::text",
	                      t)) != 0)
		return rc;

	if ((rc = prepare_one(s, ST_RELEASE_ALL, 1,
	                      "UPDATE %s SET locked_by = NULL, locked_until = NULL"
	                      " WHERE locked_by = $1::text",
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

/* Admin handles prepare the relay statements on first use only: before `migrate` the table
 * may not exist, and preparing would fail. */
static int ensure_prepared(struct store *s)
{
	int rc = store_require_conn(s);

	if (rc != 0)
		return rc;
	return s->prepared ? 0 : prepare_statements(s);
}

/* Relay mode: say plainly what is missing rather than failing later on a prepare. */
static int check_table(struct store *s)
{
	char wake[STORE_NAME_MAX];
	const char *params[2];
	PGresult *res = NULL;
	char missing[STORE_ERRMSG_MAX / 2] = "";
	size_t mlen = 0;
	bool have_wakeup = false;
	int rc;

	if (!store_wakeup_name(s->table, wake, sizeof(wake))) {
		store_set_error(s, "table name '%s' too long", s->table);
		return STORE_ERR_FATAL;
	}
	params[0] = s->table;
	params[1] = wake;
	rc = store_exec(s,
	                "SELECT attname::text FROM pg_attribute WHERE attrelid = to_regclass($1)"
	                " AND attnum > 0 AND NOT attisdropped"
	                " UNION ALL SELECT '' WHERE to_regclass($2) IS NOT NULL",
	                2, params, PGRES_TUPLES_OK, &res, "could not inspect the outbox table");
	if (rc != 0)
		goto out;
	for (int i = 0; i < PQntuples(res); i++)
		if (PQgetvalue(res, i, 0)[0] == '\0')
			have_wakeup = true;
	if (PQntuples(res) == (have_wakeup ? 1 : 0)) {
		store_set_error(s, "table '%s' does not exist: run 'outbox-relay migrate'",
		                s->table);
		rc = STORE_ERR_FATAL;
		goto out;
	}
	for (size_t c = 0; c < sizeof(required_columns) / sizeof(required_columns[0]); c++) {
		bool found = false;
		for (int i = 0; i < PQntuples(res) && !found; i++)
			found = strcmp(PQgetvalue(res, i, 0), required_columns[c]) == 0;
		if (!found) {
			int w = snprintf(missing + mlen, sizeof(missing) - mlen, "%s%s",
			                 mlen ? ", " : "", required_columns[c]);
			if (w > 0 && (size_t)w < sizeof(missing) - mlen)
				mlen += (size_t)w;
		}
	}
	if (mlen > 0) {
		store_set_error(s, "table '%s' lacks column(s) %s: run 'outbox-relay migrate'",
		                s->table, missing);
		rc = STORE_ERR_FATAL;
		goto out;
	}
	if (!have_wakeup) {
		store_set_error(s,
		                "table '%s' lacks its wake-up table %s: run 'outbox-relay migrate'",
		                s->table, wake);
		rc = STORE_ERR_FATAL;
		goto out;
	}
	rc = 0;
out:
	PQclear(res);
	return rc;
}

/* Only relay/ logs: the server's notices (migrate's "already exists, skipping") must not
 * reach stderr through libpq's default processor. */
static void ignore_notice(void *arg, const char *message)
{
	(void)arg;
	(void)message;
}

int store_connect(struct store *s)
{
	/* Ours first, the user's string (dbname, expanded) last: libpq keeps the last value of
	 * a repeated keyword, so anything the user sets wins. Keepalives notice a dead peer
	 * (a pulled cable, a failed-over VIP) in about 25 s instead of the kernel's 2 hours, while
	 * the connection is idle; tcp_user_timeout does the same while a request is unanswered at
	 * the TCP level, and connect_timeout bounds a connection attempt to a silent server. */
	char user_timeout[24];
	const char *keys[] = { "application_name", "keepalives",
		               "keepalives_idle",  "keepalives_interval",
		               "keepalives_count", "connect_timeout",
		               "tcp_user_timeout", "client_encoding",
		               "dbname",           NULL };
	const char *vals[] = { s->opts.application_name ? s->opts.application_name : "outbox-relay",
		               "1",
		               "10",
		               "5",
		               "3",
		               "10",
		               user_timeout,
		               "UTF8",
		               s->opts.conninfo ? s->opts.conninfo : "",
		               NULL };
	char sql[STORE_NAME_MAX + 32];
	PGresult *res = NULL;
	int rc;

	snprintf(user_timeout, sizeof(user_timeout), "%lld", (long long)answer_timeout_ms(s));
	store_disconnect(s);
	if (!s->table[0]) {
		store_set_error(s, "table name '%s' is not a valid identifier",
		                s->opts.table ? s->opts.table : "");
		return STORE_ERR_FATAL;
	}
	s->conn = PQconnectdbParams(keys, vals, 1);
	if (!s->conn) {
		store_set_error(s, "out of memory");
		return STORE_ERR_NOMEM;
	}
	if (PQstatus(s->conn) != CONNECTION_OK) {
		set_line(s, "could not connect to PostgreSQL", PQerrorMessage(s->conn));
		rc = STORE_ERR_CONN;
		goto out;
	}
	PQsetNoticeProcessor(s->conn, ignore_notice, NULL);
	if (s->opts.admin) {
		rc = 0;
		goto out;
	}
	rc = check_table(s);
	if (rc != 0)
		goto out;
	/* The claim must walk the pending index in seq order and stop after `batch` rows. With
	 * missing or stale statistics (a bulk load before autoanalyze) the planner prefers a
	 * bitmap scan of every pending row plus a sort, measured at 30x the time on a 100,000
	 * row backlog. None of this connection's statements needs a sort or a bitmap scan, so
	 * they are taken off the table here rather than left to the estimates.
	 * The relay's own writes (leases, failures, releases) commit without waiting for the WAL
	 * flush: a database crash can only forget some of them, which returns rows to be
	 * published again (a duplicate, never a loss). Marks stay durable (see ST_MARK), so a
	 * key's next row is never published while its predecessor could still come back.
	 * statement_timeout matches the answer timeout (see collect()), so that a statement the
	 * relay gave up on (say, waiting for a lock a migration holds) stops on the server too. */
	snprintf(sql, sizeof(sql),
	         "SET enable_bitmapscan = off; SET enable_sort = off;"
	         " SET synchronous_commit = off; SET statement_timeout = %lld",
	         (long long)answer_timeout_ms(s));
	res = answer(s, PQsendQuery(s->conn, sql));
	if (PQresultStatus(res) != PGRES_COMMAND_OK) {
		rc = store_result_error(s, res, "could not set up the session");
		goto out;
	}
	PQclear(res);
	res = NULL;
	rc = prepare_statements(s);
	if (rc != 0)
		goto out;
	if (s->opts.channel && s->opts.channel[0]) {
		if (!identifier_plain_valid(s->opts.channel)) {
			store_set_error(s, "channel '%s' is not a valid identifier",
			                s->opts.channel);
			rc = STORE_ERR_FATAL;
			goto out;
		}
		/* Quoted, so that the name matches pg_notify('<channel>') case for case. */
		snprintf(sql, sizeof(sql), "LISTEN \"%s\"", s->opts.channel);
		res = answer(s, PQsendQuery(s->conn, sql));
		if (PQresultStatus(res) != PGRES_COMMAND_OK) {
			rc = store_result_error(s, res, "could not LISTEN");
			goto out;
		}
	}
	rc = 0;
out:
	PQclear(res);
	if (rc != 0) {
		/* Keep the message: store_disconnect() does not touch it. */
		store_disconnect(s);
	}
	return rc;
}

/* ---- claim ---- */

static int cmp_row_seq(const void *a, const void *b)
{
	const struct store_row *x = a, *y = b;

	return (x->seq > y->seq) - (x->seq < y->seq);
}

int store_parse_int64(const char *v, int64_t *out)
{
	char *end;
	long long x;

	errno = 0;
	x = strtoll(v, &end, 10);
	if (errno != 0 || end == v || *end != '\0')
		return -1;
	*out = x;
	return 0;
}

/* Copies the result into the batch's single buffer: sizes first, so that the buffer is
 * (re)allocated at most once and no pointer is taken before it stops moving. */
static uint64_t xid_value(const char *x)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(x, &end, 10);
	return errno || *end ? 0 : (uint64_t)v;
}

/* Moves the ordering watermark on with the claim's sample row (the row whose seq is NULL)
 * and returns the number of claimed rows. The claimed rows come before the sample, which
 * UNION ALL puts last here; a sample elsewhere is still found, and skipped by parse. */
/* Settles every candidate whose transactions have all ended by a snapshot with this xmin. */
static void wm_advance(struct ordering_watermark *wm, uint64_t xmin)
{
	int k = 0;

	while (k < wm->npend && wm->pend[k].x <= xmin) {
		if (wm->pend[k].w > wm->safe)
			wm->safe = wm->pend[k].w;
		k++;
	}
	if (k > 0) {
		memmove(wm->pend, wm->pend + k, (size_t)(wm->npend - k) * sizeof(wm->pend[0]));
		wm->npend -= k;
	}
	wm->stuck = wm->npend > 0;
}

/* Pairs the W read before a snapshot with that snapshot's xmax as a new candidate. */
static void wm_push(struct ordering_watermark *wm, int64_t w, uint64_t xmax)
{
	if (w <= wm->safe || (wm->npend > 0 && wm->pend[wm->npend - 1].w >= w))
		return; /* nothing new to settle */
	if (wm->npend == WM_PENDING)
		return; /* full: the oldest candidates settle first; W is read again later */
	wm->pend[wm->npend].w = w;
	wm->pend[wm->npend].x = xmax;
	wm->npend++;
}

/* Moves the ordering watermark on with the claim's sample row (the row whose seq is NULL)
 * and returns the number of claimed rows. UNION ALL puts the sample last; one found
 * elsewhere is still used, and the parse loop skips it by its NULL seq. */
static int take_watermark_sample(struct store *s, const PGresult *res, int nt)
{
	struct ordering_watermark *wm = &s->wm;
	int64_t w;

	for (int i = 0; i < nt; i++) {
		if (!PQgetisnull(res, i, COL_SEQ))
			continue;
		if (store_parse_int64(PQgetvalue(res, i, COL_WM_SEQ), &w) != 0)
			return nt;
		wm->keyed_waiting = PQgetvalue(res, i, COL_WM_KEYED)[0] == 't';
		wm_advance(wm, xid_value(PQgetvalue(res, i, COL_WM_XMIN)));
		if (wm->have_w)
			wm_push(wm, wm->last_w, xid_value(PQgetvalue(res, i, COL_WM_XMAX)));
		wm->last_w = w;
		wm->have_w = true;
		return i == nt - 1 ? nt - 1 : nt;
	}
	return nt;
}

/* One scalar text query on the relay connection; NULL on failure (error set). */
static char *scalar(struct store *s, const char *sql)
{
	PGresult *res = answer(s, PQsendQuery(s->conn, sql));
	char *v = NULL;

	if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
		v = strdup(PQgetvalue(res, 0, 0));
	else
		(void)store_result_error(s, res, "could not read the ordering watermark");
	PQclear(res);
	return v;
}

int store_settle_watermark(struct store *s)
{
	char sql[STORE_NAME_MAX + 160];
	char *w = NULL, *xmax = NULL, *xmin2 = NULL, *xmin = NULL;
	int64_t wv;
	int rc = STORE_ERR_QUERY;

	if (!s->conn || s->inflight != STORE_INFLIGHT_NONE) {
		store_set_error(s, "not connected");
		return STORE_ERR_CONN;
	}
	/* Three statements, three snapshots, in this order: W first, then a snapshot's xmax,
	 * then a later snapshot's xmin (see struct ordering_watermark). */
	snprintf(sql, sizeof(sql),
	         "SELECT COALESCE(pg_sequence_last_value(pg_get_serial_sequence('%s', 'seq')"
	         "::regclass), 0)",
	         s->table);
	if (!(w = scalar(s, sql)) ||
	    !(xmax = scalar(s, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text")) ||
	    !(xmin2 = scalar(s, "SELECT pg_snapshot_xmin(pg_current_snapshot())::text")) ||
	    !(xmin = scalar(s, "SELECT pg_snapshot_xmin(pg_current_snapshot())::text")))
		goto out;
	if (store_parse_int64(w, &wv) != 0) {
		store_set_error(s, "unreadable sequence value '%s'", w);
		goto out;
	}
	/* W was read before the second statement's snapshot: pair it with that xmax; the third
	 * statement's xmin then settles it if nothing older is running. */
	wm_advance(&s->wm, xid_value(xmin2));
	wm_push(&s->wm, wv, xid_value(xmax));
	wm_advance(&s->wm, xid_value(xmin));
	s->wm.last_w = wv;
	s->wm.have_w = true;
	rc = s->wm.safe >= wv ? 0 : 1;
out:
	if (rc != 0 && !store_connected(s))
		rc = STORE_ERR_CONN;
	free(w);
	free(xmax);
	free(xmin2);
	free(xmin);
	return rc;
}

bool store_keys_settling(const struct store *s)
{
	return s->wm.keyed_waiting && s->wm.have_w && s->wm.safe < s->wm.last_w && !s->wm.stuck;
}

static int parse_batch(struct store *s, const PGresult *res, struct store_batch *out)
{
	int nt = PQntuples(res);
	size_t total = 0, used = 0, k = 0;

	if (PQnfields(res) != COL_COUNT) {
		store_set_error(s, "claim returned %d columns, expected %d", PQnfields(res),
		                COL_COUNT);
		return STORE_ERR_QUERY;
	}
	for (int i = 0; i < nt; i++)
		for (int c = COL_ID; c <= COL_ORDERING_KEY; c++)
			total += (size_t)PQgetlength(res, i, c) + 1;
	nt = take_watermark_sample(s, res, nt);
	if (total > BATCH_BUF_MAX) {
		store_set_error(s,
		                "claimed batch of %d rows needs %zu bytes, more than the limit "
		                "of %zu: lower relay.batch_size",
		                nt, total, BATCH_BUF_MAX);
		return STORE_ERR_NOMEM;
	}
	if ((size_t)nt > out->cap) {
		struct store_row *r = realloc(out->rows, (size_t)nt * sizeof(*r));
		if (!r)
			goto nomem;
		out->rows = r;
		out->cap = (size_t)nt;
	}
	if (total > out->buf_cap) {
		size_t cap = out->buf_cap ? out->buf_cap : 64 * 1024;
		while (cap < total)
			cap *= 2;
		if (cap > BATCH_BUF_MAX)
			cap = BATCH_BUF_MAX;
		/* No need to keep the old contents: the batch is being replaced. */
		free(out->buf);
		out->buf = malloc(cap);
		out->buf_cap = out->buf ? cap : 0;
		if (!out->buf)
			goto nomem;
	}
	for (int i = 0; i < nt; i++) {
		struct store_row *r = &out->rows[k];
		const char **dst[] = { &r->id,      &r->exchange,      &r->routing_key,
			               &r->body,    &r->body_encoding, &r->content_type,
			               &r->headers, &r->properties,    &r->ordering_key };
		int64_t v;

		if (PQgetisnull(res, i, COL_SEQ))
			continue; /* the watermark sample */
		for (int c = COL_ID; c <= COL_ORDERING_KEY; c++) {
			size_t len = (size_t)PQgetlength(res, i, c);
			if (PQgetisnull(res, i, c)) {
				*dst[c - COL_ID] = NULL;
				continue;
			}
			memcpy(out->buf + used, PQgetvalue(res, i, c), len);
			out->buf[used + len] = '\0';
			*dst[c - COL_ID] = out->buf + used;
			if (c == COL_BODY)
				r->body_len = len;
			used += len + 1;
		}
		if (store_parse_int64(PQgetvalue(res, i, COL_SEQ), &r->seq) != 0 ||
		    store_parse_int64(PQgetvalue(res, i, COL_CREATED_AT), &r->created_at_s) != 0 ||
		    store_parse_int64(PQgetvalue(res, i, COL_ATTEMPTS), &v) != 0) {
			store_set_error(s, "claim returned an unreadable number");
			out->n = 0;
			return STORE_ERR_QUERY;
		}
		r->attempts = (int)v;
		k++;
	}
	out->buf_len = used;
	out->n = k;
	/* RETURNING comes in no particular order; publishing must go oldest first. */
	if (out->n > 1)
		qsort(out->rows, out->n, sizeof(out->rows[0]), cmp_row_seq);
	return 0;
nomem:
	store_set_error(s, "out of memory");
	return STORE_ERR_NOMEM;
}

static int send_prepared(struct store *s, const char *name, int n, const char *const *params,
                         enum store_inflight kind, const char *what)
{
	if (!PQsendQueryPrepared(s->conn, name, n, params, NULL, NULL, 0))
		return store_result_error(s, NULL, what);
	s->inflight = kind;
	return 0;
}

int store_claim_send(struct store *s, bool disarm)
{
	char max[16], batch[16], lease[24], floor_seq[24], safe[24], cand_w[24], cand_x[24];
	const char *params[9];
	struct ordering_watermark *wm = &s->wm;
	int rc;

	rc = ensure_prepared(s);
	if (rc != 0)
		return rc;
	snprintf(max, sizeof(max), "%d", s->opts.max_attempts);
	snprintf(batch, sizeof(batch), "%d", s->opts.batch_size > 0 ? s->opts.batch_size : 1);
	snprintf(lease, sizeof(lease), "%lld", (long long)s->opts.lease_ms);
	params[0] = disarm ? "t" : "f";
	params[1] = max;
	params[2] = batch;
	params[3] = s->opts.relay_id ? s->opts.relay_id : "";
	params[4] = lease;
	snprintf(floor_seq, sizeof(floor_seq), "%lld", (long long)s->claim_floor);
	params[5] = floor_seq;
	/* The oldest candidate rides along: the claim's own snapshot may settle it. Without
	 * one, the CASE yields the settled watermark either way. */
	snprintf(safe, sizeof(safe), "%lld", (long long)wm->safe);
	if (wm->npend > 0) {
		snprintf(cand_w, sizeof(cand_w), "%lld", (long long)wm->pend[0].w);
		snprintf(cand_x, sizeof(cand_x), "%llu", (unsigned long long)wm->pend[0].x);
	} else {
		snprintf(cand_w, sizeof(cand_w), "%s", safe);
		snprintf(cand_x, sizeof(cand_x), "0");
	}
	params[6] = safe;
	params[7] = cand_x;
	params[8] = cand_w;
	return send_prepared(s, ST_CLAIM, 9, params, STORE_INFLIGHT_CLAIM, "could not claim");
}

void store_set_claim_floor(struct store *s, int64_t from_seq)
{
	s->claim_floor = from_seq > 0 ? from_seq : 0;
}

int store_claim_recv(struct store *s, struct store_batch *out)
{
	PGresult *res;
	int rc;

	out->n = 0;
	if (!s->conn || s->inflight != STORE_INFLIGHT_CLAIM) {
		store_set_error(s, "no claim is waiting for its result");
		return s->conn ? STORE_ERR_QUERY : STORE_ERR_CONN;
	}
	res = collect(s);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		rc = store_result_error(s, res, "could not claim");
	else
		rc = parse_batch(s, res, out);
	PQclear(res);
	return rc;
}

int store_claim(struct store *s, bool disarm, struct store_batch *out)
{
	int rc = store_claim_send(s, disarm);

	if (rc != 0) {
		out->n = 0;
		return rc;
	}
	return store_claim_recv(s, out);
}

/* ---- mark, fail, release ---- */

int store_mark_published_send(struct store *s, const char *const *ids, size_t n, bool delete_rows)
{
	const char *arr;
	int rc;

	rc = ensure_prepared(s);
	if (rc != 0)
		return rc;
	if (n == 0) {
		s->inflight = STORE_INFLIGHT_MARK_NOOP;
		return 0;
	}
	rc = store_text_array(s, STORE_SLOT_IDS, ids, n, store_string_at, &arr);
	if (rc != 0)
		return rc;
	return send_prepared(s, delete_rows ? ST_DELETE : ST_MARK, 1, &arr, STORE_INFLIGHT_MARK,
	                     "could not mark rows published");
}

int store_mark_published_recv(struct store *s)
{
	PGresult *res;
	int rc = 0;

	if (s->inflight == STORE_INFLIGHT_MARK_NOOP) {
		s->inflight = STORE_INFLIGHT_NONE;
		return 0;
	}
	if (!s->conn || s->inflight != STORE_INFLIGHT_MARK) {
		store_set_error(s, "no mark is waiting for its result");
		return s->conn ? STORE_ERR_QUERY : STORE_ERR_CONN;
	}
	res = collect(s);
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
		rc = store_result_error(s, res, "could not mark rows published");
	PQclear(res);
	return rc;
}

int store_mark_published(struct store *s, const char *const *ids, size_t n, bool delete_rows)
{
	int rc = store_mark_published_send(s, ids, n, delete_rows);

	if (rc != 0)
		return rc;
	return store_mark_published_recv(s);
}

/* Runs a prepared statement that changes rows; *changed (may be NULL) gets the count. */
static int exec_prepared(struct store *s, const char *name, int n, const char *const *params,
                         size_t *changed, const char *what)
{
	PGresult *res;
	int64_t v = 0;
	int rc = 0;

	res = answer(s, PQsendQueryPrepared(s->conn, name, n, params, NULL, NULL, 0));
	if (PQresultStatus(res) != PGRES_COMMAND_OK) {
		rc = store_result_error(s, res, what);
		goto out;
	}
	if (store_parse_int64(PQcmdTuples(res), &v) != 0)
		v = 0;
	if (changed)
		*changed = (size_t)v;
out:
	PQclear(res);
	return rc;
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

int store_mark_failed(struct store *s, const struct store_failure *f, size_t n, size_t *n_changed)
{
	const char *params[6];
	char max[16];
	int rc;

	rc = ensure_prepared(s);
	if (rc != 0)
		return rc;
	if (n == 0) {
		if (n_changed)
			*n_changed = 0;
		return 0;
	}
	snprintf(max, sizeof(max), "%d", s->opts.max_attempts);
	if ((rc = store_text_array(s, STORE_SLOT_IDS, f, n, failure_id_at, &params[0])) != 0 ||
	    (rc = store_text_array(s, STORE_SLOT_ERRORS, f, n, failure_error_at, &params[1])) !=
	            0 ||
	    (rc = scalar_array(s, STORE_SLOT_DELAYS, n, &params[2], f, true)) != 0 ||
	    (rc = scalar_array(s, STORE_SLOT_DEAD, n, &params[3], f, false)) != 0)
		return rc;
	params[4] = max;
	params[5] = s->opts.relay_id ? s->opts.relay_id : "";
	return exec_prepared(s, ST_FAIL, 6, params, n_changed, "could not mark rows failed");
}

int store_release(struct store *s, const char *const *ids, size_t n)
{
	const char *params[2];
	const char *relay = s->opts.relay_id ? s->opts.relay_id : "";
	int rc;

	rc = ensure_prepared(s);
	if (rc != 0)
		return rc;
	if (!ids) {
		params[0] = relay;
		return exec_prepared(s, ST_RELEASE_ALL, 1, params, NULL,
		                     "could not release leases");
	}
	if (n == 0)
		return 0;
	rc = store_text_array(s, STORE_SLOT_IDS, ids, n, store_string_at, &params[0]);
	if (rc != 0)
		return rc;
	params[1] = relay;
	return exec_prepared(s, ST_RELEASE, 2, params, NULL, "could not release leases");
}

/* ---- wake-up ---- */

int store_arm(struct store *s, int64_t ttl_ms)
{
	char ttl[24];
	const char *params[1] = { ttl };
	int rc;

	rc = ensure_prepared(s);
	if (rc != 0)
		return rc;
	snprintf(ttl, sizeof(ttl), "%lld", (long long)(ttl_ms > 0 ? ttl_ms : 0));
	return exec_prepared(s, ST_ARM, 1, params, NULL, "could not arm the wake-up");
}

int store_consume_input(struct store *s, bool *woken)
{
	PGnotify *n;
	bool got = false;
	int rc;

	rc = store_require_conn(s);
	if (rc != 0)
		return rc;
	if (!PQconsumeInput(s->conn)) {
		set_line(s, "could not read from PostgreSQL", PQerrorMessage(s->conn));
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
