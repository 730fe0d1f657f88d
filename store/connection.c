/* The store handle and its connection's life: connecting (where to and each attempt are in
 * connect_targets.c), refusing what cannot serve the relay (a missing or old table, a standby,
 * a transaction-pooling proxy), setting up the relay's session and LISTENing. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/utf8.h"
#include "store/store.h"
#include "store/source/lease.h"
#include "store/operator/schema.h"
#include "store/store_private.h"

/* Columns store_connect() insists on in relay mode (DESIGN §1). */
static const char *const required_columns[] = {
	"seq",           "id",           "exchange_name", "routing_key",  "body",
	"body_encoding", "content_type", "headers",       "properties",   "ordering_key",
	"txid",          "created_at",   "available_at",  "published_at", "attempts",
	"last_error",    "locked_by",    "locked_until",
};

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

/* A nonce for claim tokens: two handles (workers of one process, or relays given the same
 * relay.id by mistake) must not produce the same tokens. */
static uint32_t token_nonce(const struct store *s)
{
	uint32_t v = 0;
	int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);

	if (fd >= 0) {
		if (read(fd, &v, sizeof(v)) != (ssize_t)sizeof(v))
			v = 0;
		close(fd);
	}
	if (v == 0)
		v = (uint32_t)clock_mono_us() ^ (uint32_t)getpid() ^ (uint32_t)(uintptr_t)s;
	return v;
}

/* Ownership: opts and its strings are borrowed for the handle's lifetime. */
struct store *store_new(const struct store_options *opts)
{
	struct store *s = calloc(1, sizeof(*s));
	const char *id;
	size_t cut;

	if (!s)
		return NULL;
	s->opts = *opts;
	s->fd = -1;
	if (pthread_mutex_init(&s->fd_lock, NULL) != 0) {
		free(s);
		return NULL;
	}
	/* An unusable name is remembered as "" and refused at connect with a message. */
	if (opts->table && identifier_valid(opts->table))
		snprintf(s->table, sizeof(s->table), "%s", opts->table);
	/* Tokens are "<relay id>#<nonce>.<counter>" in 64 bytes: nonce and counter take at most
	 * 14, so a longer relay id is cut (at a character boundary) to its first 50 bytes. */
	id = opts->relay_id && opts->relay_id[0] ? opts->relay_id : "relay";
	cut = utf8_valid_prefix(id, strlen(id) < 50 ? strlen(id) : 50);
	snprintf(s->token_prefix, sizeof(s->token_prefix), "%.*s#", (int)cut, id);
	s->token_nonce = token_nonce(s) % 2176782336u; /* 36^6: six base-36 digits */
	watermark_reset(&s->wm);
	s->keys_pending = true; /* not known yet: the first claim looks */
	return s;
}

/* Clears the descriptor store_interrupt() may use, before the socket is closed. */
void store_forget_fd(struct store *s)
{
	pthread_mutex_lock(&s->fd_lock);
	s->fd = -1;
	pthread_mutex_unlock(&s->fd_lock);
}

static void remember_fd(struct store *s)
{
	pthread_mutex_lock(&s->fd_lock);
	s->fd = s->conn ? PQsocket(s->conn) : -1;
	pthread_mutex_unlock(&s->fd_lock);
}

void store_disconnect(struct store *s)
{
	if (!s)
		return;
	store_forget_fd(s);
	PQfinish(s->conn);
	s->conn = NULL;
	s->prepared = false;
	s->position_prepared = false;
	s->armed = false; /* a session lock ends with its session */
	s->inflight = STORE_INFLIGHT_NONE;
	s->inflight_sent_ms = 0;
	s->no_answer = false;
	s->aborted = false;
}

void store_interrupt(struct store *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->fd_lock);
	if (s->fd >= 0)
		(void)shutdown(s->fd, SHUT_RDWR);
	pthread_mutex_unlock(&s->fd_lock);
}

void store_free(struct store *s)
{
	if (!s)
		return;
	store_disconnect(s);
	for (int i = 0; i < STORE_SLOT_COUNT; i++)
		free(s->arr[i]);
	pthread_mutex_destroy(&s->fd_lock);
	free(s);
}

const char *store_errmsg(const struct store *s)
{
	return s ? s->errmsg : "no store";
}

const char *store_server(const struct store *s)
{
	return s ? s->server : "";
}

bool store_connected(const struct store *s)
{
	return s && s->conn && PQstatus(s->conn) == CONNECTION_OK;
}

int store_socket(const struct store *s)
{
	return store_connected(s) ? PQsocket(s->conn) : -1;
}

/* ---- connecting ---- */

/* Only relay/ logs: the server's notices (migrate's "already exists, skipping") must not
 * reach stderr through libpq's default processor. */
static void ignore_notice(void *arg, const char *message)
{
	(void)arg;
	(void)message;
}

/* The lease source on a table the cursor source runs would take every row behind the
 * position for unpublished (nothing is written in a row the cursor publishes) and publish
 * them all again. `outbox-relay leave-cursor` (store/operator/leave_cursor.c) marks them and
 * deletes the position row: the way out that the message names. */
static int refuse_cursor_table(struct store *s)
{
	bool cursor = false;
	int64_t pos = 0;
	int rc = store_cursor_position(s, &cursor, &pos);

	if (rc != 0 || !cursor)
		return rc;
	store_set_error(s,
	                "%s is run by the cursor source (relay.source = cursor): its published "
	                "rows carry no published_at; set relay.source = cursor, or run "
	                "outbox-relay leave-cursor to hand it to the lease source",
	                s->table);
	return STORE_ERR_FATAL;
}

/* Relay mode: say plainly what is missing rather than failing later on a prepare. The wake-up
 * trigger is looked at too, but only noted (store_wakeup_current()): without it the relay
 * still works, finding new rows by polling. A trigger wakes relays when it tests their lock,
 * in its function (this version) or in its WHEN (the version before, which works alike). */
#define WAKEUP_TEST "'pg_try_advisory_lock_shared(" STORE_WAKEUP_LOCK_CLASS ", '"
static int check_table(struct store *s)
{
	char trigger[STORE_NAME_MAX + 8], schema[STORE_NAME_MAX], base[STORE_NAME_MAX];
	const char *params[2] = { s->table, trigger };
	PGresult *res = NULL;
	char missing[STORE_ERRMSG_MAX / 2] = "";
	size_t mlen = 0;
	int rc, ncols = 0;

	/* The trigger's name as the catalog has it: created unquoted, so folded to lower case. */
	store_split_table(s->table, schema, sizeof(schema), base, sizeof(base));
	for (size_t i = 0; base[i]; i++)
		base[i] = (char)tolower((unsigned char)base[i]);
	snprintf(trigger, sizeof(trigger), "%s_wakeup", base);
	s->wakeup_current = false;
	rc = store_exec(
	        s,
	        "SELECT attname::text FROM pg_attribute WHERE attrelid = to_regclass($1)"
	        " AND attnum > 0 AND NOT attisdropped"
	        " UNION ALL SELECT '' FROM pg_trigger tg JOIN pg_proc p ON p.oid = tg.tgfoid"
	        " WHERE tg.tgrelid = to_regclass($1) AND tg.tgname = $2"
	        " AND tg.tgtype = " STORE_WAKEUP_TGTYPE " AND tg.tgenabled <> 'D'"
	        " AND (strpos(p.prosrc, " WAKEUP_TEST ") > 0"
	        " OR strpos(pg_get_triggerdef(tg.oid), " WAKEUP_TEST ") > 0)",
	        2, params, PGRES_TUPLES_OK, &res, "could not inspect the outbox table");
	if (rc != 0)
		goto out;
	for (int i = 0; i < PQntuples(res); i++) {
		if (PQgetvalue(res, i, 0)[0] == '\0')
			s->wakeup_current = true;
		else
			ncols++;
	}
	if (ncols == 0) {
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
	rc = s->opts.cursor ? 0 : refuse_cursor_table(s);
out:
	PQclear(res);
	return rc;
}

bool store_wakeup_current(const struct store *s)
{
	return s->wakeup_current;
}

/* Runs sql on c and waits at most timeout_ms for its answer, without the store's machinery (the
 * probe below runs two clients at once). *value (may be NULL) gets the first column of the
 * last row as a new string. 0 on success, -1 on an error, 1 when no answer came in time. */
static int probe_query(PGconn *c, const char *sql, int64_t timeout_ms, char **value)
{
	int64_t deadline = clock_mono_ms() + timeout_ms;
	PGresult *r;
	int rc = 0;

	if (!PQsendQuery(c, sql))
		return -1;
	while (PQflush(c) > 0 || PQisBusy(c)) {
		struct pollfd p = { .fd = PQsocket(c), .events = POLLIN | POLLOUT };
		int64_t left = deadline - clock_mono_ms();

		if (left <= 0)
			return 1;
		if (poll(&p, 1, (int)left) < 0 && errno != EINTR)
			return -1;
		if (!PQconsumeInput(c))
			return -1;
	}
	while ((r = PQgetResult(c)) != NULL) {
		ExecStatusType st = PQresultStatus(r);

		if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
			rc = -1;
		if (value && st == PGRES_TUPLES_OK && PQntuples(r) > 0) {
			free(*value);
			*value = strdup(PQgetvalue(r, PQntuples(r) - 1, 0));
		}
		PQclear(r);
	}
	return rc;
}

/* One round of the probe below: 1 when it shows a pooler handing server connections around,
 * 0 when it shows none, -1 when it could not tell. */
static int probe_round(struct store *s, PGconn *other, int round)
{
	static const char get_sql[] =
	        "SELECT coalesce(current_setting('outbox_relay.pool_probe', true), '')";
	char nonce[48], set_sql[160], *seen_a = NULL, *seen_b = NULL;
	int q, rc = -1;

	snprintf(nonce, sizeof(nonce), "%u.%d.%lld", s->token_nonce, round,
	         (long long)clock_mono_us());
	snprintf(set_sql, sizeof(set_sql),
	         "SELECT set_config('outbox_relay.pool_probe', '%s', false)", nonce);
	if (probe_query(s->conn, set_sql, 10000, NULL) != 0)
		return -1;
	/* Give the pooler a moment to take our server connection back into its pool: the
	 * answer reaches us before it does. */
	(void)poll(NULL, 0, 20 + 40 * round);
	/* A statement pooler refuses transaction blocks outright; a server or a session pooler
	 * never refuses a plain BEGIN. */
	if (probe_query(other, "BEGIN", 10000, NULL) != 0)
		return 1;
	if (probe_query(other, get_sql, 10000, &seen_b) != 0)
		goto out;
	q = probe_query(s->conn, get_sql, 5000, &seen_a);
	(void)probe_query(other, "ROLLBACK", 10000, NULL);
	if (q == 1 || (seen_b && strcmp(seen_b, nonce) == 0) ||
	    (q == 0 && seen_a && strcmp(seen_a, nonce) != 0))
		rc = 1;
	else if (q == 0)
		rc = 0;
out:
	free(seen_a);
	free(seen_b);
	return rc;
}

/* Behind a transaction-pooling proxy (PgBouncer pool_mode=transaction or statement) the
 * relay's session state — LISTEN, session settings, prepared statements — lands on server
 * connections that other clients (the application!) then use, and the wake-up silently stops.
 * A proxy shows itself by a cancel key whose pid is not the backend's. Then a session setting
 * made by this connection is looked for from a second client that holds a transaction open
 * meanwhile: a session pooler never shows one client's session to another and keeps our
 * session ours; a transaction pooler hands server connections around (most recently used
 * first), so either the other client sees our setting or we no longer do — or we get no
 * server connection at all while the other client holds one. A few rounds, since a pooler
 * may not have taken our server connection back yet when the other client asks. */
static int check_pooler(struct store *s, const char *backend_pid)
{
	struct store_attempt a = { .n = 0 };
	char user_timeout[24];
	PGconn *other = NULL;
	bool aborted;
	int rc = 0, seen = 0;

	if ((long)PQbackendPID(s->conn) == strtol(backend_pid, NULL, 10))
		return 0; /* a direct connection */
	store_add_defaults(s, &a, user_timeout, sizeof(user_timeout));
	store_attempt_add(&a, "dbname", s->opts.conninfo ? s->opts.conninfo : "");
	a.timeout_ms = 10000;
	other = store_connect_once(s, &a, 1, &aborted);
	if (!other || PQstatus(other) != CONNECTION_OK || PQsetnonblocking(other, 1) != 0)
		goto out; /* cannot tell: the relay's own statements will show any trouble */
	for (int round = 0; round < 3 && seen == 0; round++)
		seen = probe_round(s, other, round);
	if (seen == 1) {
		store_set_error(s, "database.url leads to a connection pooler in transaction or "
		                   "statement pooling mode (PgBouncer pool_mode=transaction?): the "
		                   "relay needs a direct connection or session pooling (it LISTENs "
		                   "and keeps session settings); producers may use any pooling");
		rc = STORE_ERR_UNSUPPORTED;
	}
out:
	if (other)
		PQfinish(other);
	return rc;
}

int store_resolve_sequence(struct store *s)
{
	const char *params[1] = { s->table };
	PGresult *res = NULL;
	int rc;

	rc = store_exec(s,
	                "SELECT pg_get_serial_sequence($1, 'seq')::regclass::oid::text,"
	                " (SELECT oid FROM pg_database WHERE datname = current_database())::text,"
	                " to_regclass($1)::oid::integer::text",
	                1, params, PGRES_TUPLES_OK, &res, "could not find the seq sequence");
	if (rc != 0)
		return rc;
	if (PQntuples(res) != 1 || PQgetisnull(res, 0, 0)) {
		store_set_error(s,
		                "table '%s' has no identity sequence behind seq: run "
		                "'outbox-relay migrate'",
		                s->table);
		rc = STORE_ERR_FATAL;
	} else {
		s->seq_oid = (unsigned int)strtoul(PQgetvalue(res, 0, 0), NULL, 10);
		s->db_oid = (unsigned int)strtoul(PQgetvalue(res, 0, 1), NULL, 10);
		/* As the wake-up function has it (TG_RELID::int4): the OID as a signed integer. */
		s->table_key = (int)strtol(PQgetvalue(res, 0, 2), NULL, 10);
	}
	PQclear(res);
	/* The watermark reads this sequence: it must not cache (store_check_sequence()). */
	if (rc == 0 && (rc = store_check_sequence(s)) == 1)
		rc = STORE_ERR_FATAL;
	return rc;
}

/* An admin session (the maintenance loop, the CLI). Its statements walk the relay's indexes,
 * and over a large backlog (the gauges count every unpublished row, every few seconds) their
 * estimates pass jit_above_cost and the parallel thresholds. With JIT on, as PostgreSQL ships,
 * the maintenance session compiled its gauge statement each time and started parallel
 * workers that compiled it again: about a fifth of the machine's CPU samples while a
 * 400,000-row backlog drained (perf, bench/run --only relay --rows 400000). Neither pays off
 * for a walk of an index, and parallel workers take the cores the application and the claim
 * need. */
static int setup_admin_session(struct store *s)
{
	return store_exec(s, "SET jit = off; SET max_parallel_workers_per_gather = 0", 0, NULL,
	                  PGRES_COMMAND_OK, NULL, "could not set up the session");
}

/* The relay's session. The claim must walk the unkeyed index in seq order and stop after
 * `batch` rows. With missing or stale statistics (a bulk load before autoanalyze) the planner
 * prefers a bitmap scan of every pending row plus a sort, measured at 30x the time on a
 * 100,000 row backlog; none of this connection's statements needs either, so they are taken
 * off the table here rather than left to the estimates. Nor does any of them need a
 * sequential scan, and the plans outlive the estimates: PostgreSQL plans a prepared
 * statement generically after five runs and keeps that plan until the table's statistics
 * change, so a relay that started on a new, empty table went on reading the whole table in
 * every claim (the key-head lookup) and every mark as it grew, until autovacuum first
 * analyzed it (12 ms a claim at 20,000 rows; commit -> consumer p99 42 ms at 2,000 commits/s,
 * 3.4 ms without). (The claim's byte budget still sorts
 * its few rows: the penalty that steers the planner then pushes the cost past jit_above_cost,
 * and compiling the statement took 700 ms a claim; JIT never pays off for statements this
 * small, so it is off too.) With the plans kept to the indexes, the generic plan of each
 * statement is as good as a custom one, and the session always takes it (plan_cache_mode):
 * PostgreSQL planned the claim of a full batch anew for 182 of 200 runs (1 ms each, 2 us per
 * message of a drain) and a mark of a few rows for every run (0.2 ms), because it estimated
 * those plans cheaper than the generic one. The relay's own writes (leases, failures,
 * releases) commit without waiting for the WAL flush: a database crash can only
 * forget some of them, which returns rows to be published again (a duplicate, never a loss).
 * Marks stay durable (see statements.c), so a key's next row is never published while its
 * predecessor could still come back. statement_timeout matches the answer timeout, so that
 * a statement the relay gave up on (say, waiting for a lock a migration holds) stops on the
 * server too. TCP keepalives from the server's side: a relay whose host vanished while it
 * held the wake-up lock (it sleeps holding it) is dropped within about a minute, and
 * producers stop notifying nobody (no effect over a Unix socket). Then: is this a writable
 * primary, which sequence is behind seq, and is there a pooler in between. */
static int setup_session(struct store *s)
{
	char sql[STORE_NAME_MAX + 512];
	PGresult *res = NULL;
	char *pid = NULL;
	int rc;

	snprintf(sql, sizeof(sql),
	         "SET enable_seqscan = off; SET enable_bitmapscan = off; SET enable_sort = off;"
	         " SET jit = off; SET plan_cache_mode = force_generic_plan;"
	         " SET synchronous_commit = off; SET statement_timeout = %lld;"
	         " SET tcp_keepalives_idle = 30; SET tcp_keepalives_interval = 10;"
	         " SET tcp_keepalives_count = 3",
	         (long long)s->opts.lease_ms);
	rc = store_exec(s, sql, 0, NULL, PGRES_COMMAND_OK, NULL, "could not set up the session");
	if (rc != 0)
		return rc;
	rc = store_exec(s,
	                "SELECT pg_backend_pid()::text, pg_is_in_recovery(),"
	                " current_setting('transaction_read_only') = 'on'",
	                0, NULL, PGRES_TUPLES_OK, &res, "could not set up the session");
	if (rc != 0)
		return rc;
	if (PQntuples(res) != 1) {
		store_set_error(s, "could not set up the session: unexpected answer");
		rc = STORE_ERR_QUERY;
		goto out;
	}
	if (PQgetvalue(res, 0, 1)[0] == 't' || PQgetvalue(res, 0, 2)[0] == 't') {
		store_set_error(s,
		                "server %s is read-only (a standby?); the relay needs the "
		                "primary: list every node in database.url",
		                s->server);
		rc = STORE_ERR_CONN;
		goto out;
	}
	pid = strdup(PQgetvalue(res, 0, 0));
	PQclear(res);
	res = NULL;
	if (!pid) {
		store_set_error(s, "out of memory");
		return STORE_ERR_NOMEM;
	}
	if ((rc = store_resolve_sequence(s)) != 0)
		goto out;
	rc = check_pooler(s, pid);
out:
	PQclear(res);
	free(pid);
	return rc;
}

int store_connect(struct store *s)
{
	char sql[STORE_NAME_MAX + 32];
	int rc;

	store_disconnect(s);
	if (!s->table[0]) {
		store_set_error(s, "table name '%s' is not a valid identifier",
		                s->opts.table ? s->opts.table : "");
		return STORE_ERR_FATAL;
	}
	rc = store_open_connection(s);
	if (rc != 0)
		return rc;
	snprintf(s->server, sizeof(s->server), "%s:%s", PQhost(s->conn) ? PQhost(s->conn) : "",
	         PQport(s->conn) ? PQport(s->conn) : "");
	remember_fd(s);
	PQsetNoticeProcessor(s->conn, ignore_notice, NULL);
	/* Non-blocking: a send never waits inside libpq, where no deadline reaches it. */
	if (PQsetnonblocking(s->conn, 1) != 0) {
		store_set_line(s, "could not set up the connection", PQerrorMessage(s->conn));
		rc = STORE_ERR_CONN;
		goto out;
	}
	/* We ask for UTF8, which converts from any server encoding but SQL_ASCII: there the
	 * bytes carry no encoding, and a row whose id is not UTF-8 would fail every statement
	 * that returns it. Ids must come back byte for byte to be marked, so take them raw. */
	{
		const char *enc = PQparameterStatus(s->conn, "server_encoding");

		if (enc && strcmp(enc, "SQL_ASCII") == 0 &&
		    (rc = store_exec(s, "SET client_encoding = 'SQL_ASCII'", 0, NULL,
		                     PGRES_COMMAND_OK, NULL, "could not set up the session")) != 0)
			goto out;
	}
	/* A new connection may be a new server (a failover): lock lists of the old one say
	 * nothing here. Keyed rows wait for the first settled sample. */
	watermark_reset(&s->wm);
	s->claim_seen = s->claim_seen_sent = 0;
	s->claim_last_n = 0;
	s->sampled_ms = 0;
	if (s->opts.admin) {
		rc = setup_admin_session(s);
		goto out;
	}
	if ((rc = check_table(s)) != 0 || (rc = setup_session(s)) != 0 ||
	    (rc = store_ensure_prepared(s)) != 0)
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
		rc = store_exec(s, sql, 0, NULL, PGRES_COMMAND_OK, NULL, "could not LISTEN");
	}
out:
	if (rc != 0) {
		/* Keep the message: store_disconnect() does not touch it. */
		store_disconnect(s);
	}
	return rc;
}
