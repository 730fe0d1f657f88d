/* Sending a request to PostgreSQL and reading its answer within bounds — the answer timeout
 * (a hung server or a stalled path must not hang the relay) and the shutdown deadline — and
 * classifying what went wrong into reconnect / retry / fatal, in one-line texts that never
 * hold the connection's password. */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/redact.h"
#include "base/text.h"
#include "store/store_private.h"

/* The longest single poll(): progress_ms is refreshed at least this often while waiting. */
#define WAIT_SLICE_MS 1000

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

/* ---- error texts ---- */

void store_set_line(struct store *s, const char *prefix, const char *text)
{
	char tmp[STORE_ERRMSG_MAX];

	/* Truncation is fine here (the message stays one readable line); checking the result
	 * also tells -Wformat-truncation that it was considered. */
	if (snprintf(tmp, sizeof(tmp), "%s%s%s", prefix ? prefix : "",
	             prefix && text && text[0] ? ": " : "", text ? text : "") < 0)
		tmp[0] = '\0';
	/* libpq echoes parts of the connection string in its errors (a password with a bad
	 * percent escape comes back whole): scrub every secret the string holds. */
	redact_message(tmp, s->opts.conninfo ? s->opts.conninfo : "", s->errmsg, sizeof(s->errmsg));
	text_one_line(s->errmsg);
}

void store_set_error(struct store *s, const char *fmt, ...)
{
	va_list ap;
	char tmp[STORE_ERRMSG_MAX];

	va_start(ap, fmt);
	vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	store_set_line(s, NULL, tmp);
}

static bool sqlstate_is(const char *st, const char *want)
{
	return st && strncmp(st, want, strlen(want)) == 0;
}

/* ---- deadlines ---- */

/* How long a relay connection waits for an answer before it gives the connection up: a
 * statement that outlasts the lease is futile (its rows may be claimed by another relay by
 * then), and a server or network path that stopped answering must not hang the relay.
 * Admin connections (the CLI, the maintenance loop) wait as long as the server takes. */
static int64_t answer_timeout_ms(const struct store *s)
{
	return s->opts.admin ? 0 : s->opts.lease_ms;
}

int64_t store_request_deadline(const struct store *s)
{
	int64_t limit = answer_timeout_ms(s);

	return limit > 0 ? clock_mono_ms() + limit : 0;
}

static int64_t shutdown_deadline(const struct store *s)
{
	return s->opts.deadline_ms ? (int64_t)atomic_load(s->opts.deadline_ms) : 0;
}

static void progress(struct store *s)
{
	if (s->opts.progress_ms)
		atomic_store_explicit(s->opts.progress_ms, clock_mono_ms(), memory_order_relaxed);
}

bool store_wait_socket(struct store *s, bool for_write, int64_t deadline)
{
	for (;;) {
		int64_t now = clock_mono_ms(), stop = shutdown_deadline(s), until = deadline, left;
		struct pollfd p[2];
		nfds_t n = 0;
		int rc;

		if (stop != 0 && (until == 0 || stop < until))
			until = stop;
		if (until != 0 && now >= until) {
			if (stop != 0 && until == stop)
				s->aborted = true;
			else
				s->no_answer = true;
			return false;
		}
		left = until == 0 ? WAIT_SLICE_MS : until - now;
		if (left > WAIT_SLICE_MS)
			left = WAIT_SLICE_MS;
		p[n].fd = PQsocket(s->conn);
		p[n++].events = for_write ? POLLOUT : POLLIN;
		if (p[0].fd < 0)
			return true; /* no socket: the libpq call that follows says why */
		/* The wake-up pipe stays readable once written: poll it only until the deadline it
		 * announces is known, then the deadline does the job. */
		if (stop == 0 && s->opts.deadline_ms && s->opts.wake_fd >= 0) {
			p[n].fd = s->opts.wake_fd;
			p[n++].events = POLLIN;
		}
		rc = poll(p, n, (int)left);
		progress(s);
		if (rc < 0 && errno != EINTR)
			return true; /* libpq reports what is wrong with the socket */
		if (rc > 0 && p[0].revents)
			return true;
	}
}

/* Pushes what libpq holds in its output buffer (the connection is non-blocking, so a send
 * never waits inside libpq where no deadline reaches it). */
static bool flush_out(struct store *s, int64_t deadline)
{
	for (;;) {
		int rc = PQflush(s->conn);

		if (rc == 0)
			return true;
		if (rc < 0)
			return true; /* PQgetResult() or the caller's check reports it */
		if (!store_wait_socket(s, true, deadline))
			return false;
		/* Data may also have come in (a server that answers while we write). */
		if (!PQconsumeInput(s->conn))
			return true;
	}
}

/* Waits until the next result can be read without blocking. False when a deadline ran out
 * first: the caller's store_result_error() reports it and drops the connection (a request is
 * still in flight on it). */
static bool await_result(struct store *s, int64_t deadline)
{
	while (PQisBusy(s->conn)) {
		if (!store_wait_socket(s, false, deadline))
			return false;
		if (!PQconsumeInput(s->conn))
			return true; /* PQgetResult() returns the error */
	}
	return true;
}

PGresult *store_collect(struct store *s)
{
	int64_t deadline = s->inflight_sent_ms ? s->inflight_sent_ms : 0;
	PGresult *keep = NULL, *r;

	/* The answer timeout counts from when the request was sent: a pipelined claim that
	 * waited while the broker confirmed a batch is not given a second allowance. */
	if (deadline != 0 && answer_timeout_ms(s) > 0)
		deadline += answer_timeout_ms(s);
	else
		deadline = store_request_deadline(s);
	s->inflight = STORE_INFLIGHT_NONE;
	s->inflight_sent_ms = 0;
	if (!flush_out(s, deadline))
		return NULL;
	/* The last answer is the one kept, unless an earlier one failed: that one says why. */
	while (await_result(s, deadline) && (r = PQgetResult(s->conn)) != NULL) {
		if (keep && PQresultStatus(keep) == PGRES_FATAL_ERROR) {
			PQclear(r);
			continue;
		}
		PQclear(keep);
		keep = r;
	}
	if (s->no_answer || s->aborted) {
		PQclear(keep);
		return NULL;
	}
	return keep;
}

int store_result_error(struct store *s, const PGresult *res, const char *what)
{
	const char *st, *text;
	bool conn_bad;

	if (s->aborted) {
		store_set_line(s, what, "stopped waiting for PostgreSQL at the shutdown deadline");
		store_disconnect(s);
		return STORE_ERR_ABORTED;
	}
	if (s->no_answer) {
		char why[96];

		snprintf(why, sizeof(why), "no answer from PostgreSQL within %lld ms",
		         (long long)answer_timeout_ms(s));
		store_set_line(s, what, why);
		store_disconnect(s);
		return STORE_ERR_CONN;
	}
	st = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
	text = res ? PQresultErrorMessage(res) : NULL;
	conn_bad = !s->conn || PQstatus(s->conn) == CONNECTION_BAD;
	if (!text || !text[0])
		text = s->conn ? PQerrorMessage(s->conn) : "not connected";
	if (res && PQresultStatus(res) != PGRES_FATAL_ERROR &&
	    PQresultStatus(res) != PGRES_NONFATAL_ERROR && (!text || !text[0]))
		text = PQresStatus(PQresultStatus(res));
	store_set_line(s, what, text);
	/* Class 08 (connection exception) and the shutdown codes mean the server side is gone
	 * even if libpq has not noticed yet: reconnect rather than retry on this socket. 25006
	 * (read-only transaction): the server became a standby after a failover; retrying on it
	 * can never work, the multi-host list must be walked again to find the primary. */
	if (conn_bad || sqlstate_is(st, "08") || sqlstate_is(st, "57P01") ||
	    sqlstate_is(st, "57P02") || sqlstate_is(st, "57P03") || sqlstate_is(st, "25006"))
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
		store_set_line(s, "not connected to PostgreSQL", NULL);
		return STORE_ERR_CONN;
	}
	if (s->inflight != STORE_INFLIGHT_NONE) {
		/* A _send without its _recv would make us read someone else's result. */
		store_set_line(s, "a previous request is still waiting for its result", NULL);
		return STORE_ERR_QUERY;
	}
	return 0;
}

/* Marks a request as sent now; false when libpq refused to queue it. */
static bool sent(struct store *s, int ok, enum store_inflight kind)
{
	if (!ok)
		return false;
	s->inflight = kind;
	s->inflight_sent_ms = clock_mono_ms();
	return true;
}

int store_format_sql(struct store *s, char *sql, size_t cap, const char *fmt, ...)
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

int store_exec_state(struct store *s, const char *sql, int nparams, const char *const *params,
                     ExecStatusType want, PGresult **out, const char *what, char *state)
{
	PGresult *res = NULL;
	int rc;

	if (state)
		state[0] = '\0';
	rc = store_require_conn(s);
	if (rc != 0)
		return rc;
	/* Without parameters, the simple protocol: it takes several statements at once (the
	 * session's settings, migrate's DDL). */
	if (sent(s,
	         nparams == 0
	                 ? PQsendQuery(s->conn, sql)
	                 : PQsendQueryParams(s->conn, sql, nparams, NULL, params, NULL, NULL, 0),
	         STORE_INFLIGHT_SYNC))
		res = store_collect(s);
	if (PQresultStatus(res) != want) {
		const char *st = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;

		if (state && st)
			snprintf(state, 6, "%s", st);
		rc = store_result_error(s, res, what);
		/* A data exception is the caller's input (a time that is not one): the server's
		 * one line says it, without the statement's context. */
		if (state && strncmp(state, "22", 2) == 0 &&
		    PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY))
			store_set_line(s, NULL, PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY));
		PQclear(res);
		return rc;
	}
	if (out)
		*out = res;
	else
		PQclear(res);
	return 0;
}

int store_exec(struct store *s, const char *sql, int nparams, const char *const *params,
               ExecStatusType want, PGresult **out, const char *what)
{
	return store_exec_state(s, sql, nparams, params, want, out, what, NULL);
}

/* Reads the answers of a pipeline of n statements and its Sync into res[] (the first result of
 * each; the statement that failed, or PIPELINE_ABORTED after it, stays in its place). False
 * when a deadline ran out or the connection broke first. */
static bool collect_calls(struct store *s, PGresult **res, int n, int64_t deadline)
{
	PGresult *r;

	for (int i = 0; i <= n; i++) {
		/* Each statement's answer ends with a NULL; the Sync's is one result alone. */
		for (;;) {
			if (!await_result(s, deadline))
				return false;
			r = PQgetResult(s->conn);
			if (i == n) {
				bool synced = PQresultStatus(r) == PGRES_PIPELINE_SYNC;

				PQclear(r);
				return synced;
			}
			if (!r)
				break;
			if (res[i])
				PQclear(r);
			else
				res[i] = r;
		}
		if (!res[i])
			return false; /* the connection broke: libpq gave no answer */
	}
	return true;
}

int store_exec_calls(struct store *s, const struct store_call *calls, PGresult **res, int n,
                     const char *what)
{
	int64_t deadline;
	bool ok;
	int rc = 0;

	for (int i = 0; i < n; i++)
		res[i] = NULL;
	if ((rc = store_require_conn(s)) != 0)
		return rc;
	/* libpq refuses only a connection that is not idle: a request of ours still in flight on
	 * it. Its state is not known, so it is given up like a broken one. */
	if (!PQenterPipelineMode(s->conn)) {
		store_set_line(s, what, "the connection was busy and could not start a pipeline");
		store_disconnect(s);
		return STORE_ERR_CONN;
	}
	ok = true;
	for (int i = 0; ok && i < n; i++)
		ok = PQsendQueryPrepared(s->conn, calls[i].name, calls[i].nparams, calls[i].params,
		                         NULL, NULL, 0) == 1;
	ok = ok && PQpipelineSync(s->conn) == 1;
	deadline = store_request_deadline(s);
	ok = ok && flush_out(s, deadline) && collect_calls(s, res, n, deadline);
	/* The statement that failed says why (the ones after it were skipped). */
	for (int i = 0; rc == 0 && i < n; i++)
		if (res[i] && PQresultStatus(res[i]) != PGRES_TUPLES_OK)
			rc = store_result_error(s, res[i], what);
	if (rc == 0 && !ok)
		rc = store_result_error(s, NULL, what);
	/* A pipeline not read to its end leaves the connection unusable: it is given up. */
	if (!ok || !PQexitPipelineMode(s->conn)) {
		if (rc == 0)
			store_set_line(s, what, "the pipeline did not end");
		store_disconnect(s);
		if (rc != STORE_ERR_ABORTED)
			rc = STORE_ERR_CONN;
	}
	if (rc != 0) {
		for (int i = 0; i < n; i++) {
			PQclear(res[i]);
			res[i] = NULL;
		}
	}
	return rc;
}

int store_send_prepared(struct store *s, const char *name, int n, const char *const *params,
                        enum store_inflight kind, const char *what)
{
	if (!sent(s, PQsendQueryPrepared(s->conn, name, n, params, NULL, NULL, 0), kind))
		return store_result_error(s, NULL, what);
	return 0;
}

int store_exec_prepared(struct store *s, const char *name, int n, const char *const *params,
                        ExecStatusType want, size_t *changed, PGresult **out, const char *what)
{
	PGresult *res = NULL;
	int64_t v = 0;
	int rc = 0;

	rc = store_require_conn(s);
	if (rc != 0)
		return rc;
	if (sent(s, PQsendQueryPrepared(s->conn, name, n, params, NULL, NULL, 0),
	         STORE_INFLIGHT_SYNC))
		res = store_collect(s);
	if (PQresultStatus(res) != want) {
		rc = store_result_error(s, res, what);
		goto out;
	}
	if (store_parse_int64(PQcmdTuples(res), &v) != 0)
		v = 0;
	if (changed)
		*changed = (size_t)v;
	if (out) {
		*out = res;
		res = NULL;
	}
out:
	PQclear(res);
	return rc;
}
