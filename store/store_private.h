/* Internals shared by the store's .c files (not installed, not for other modules): the handle,
 * connecting, sending requests and reading answers, error classification and text-array
 * encoding. */
#ifndef OUTBOX_STORE_STORE_PRIVATE_H
#define OUTBOX_STORE_STORE_PRIVATE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <libpq-fe.h>

#include "base/identifier.h"
#include "store/store.h"
#include "store/source/lease.h"
#include "store/operator/admin.h"
#include "store/operator/schema.h"
#include "store/source/watermark.h"

/* Longest "schema.table" plus the longest suffix we derive ("_unkeyed_idx") and a NUL. */
#define STORE_NAME_MAX 160
/* An ordering key: VARCHAR(255) is 255 characters, up to 4 bytes each in UTF-8, and a NUL. */
#define STORE_KEY_CURSOR_MAX (255 * 4 + 1)
#define STORE_ERRMSG_MAX     512

/* Which _send call is waiting for its _recv. */
enum store_inflight {
	STORE_INFLIGHT_NONE = 0,
	STORE_INFLIGHT_CLAIM,
	STORE_INFLIGHT_MARK,
	STORE_INFLIGHT_MARK_NOOP, /* an empty mark: nothing was sent */
	STORE_INFLIGHT_SYNC,      /* a request whose answer the same call reads */
};

/* Names of the prepared statements (per connection), see statements.c. */
#define ST_CLAIM       "outbox_claim"
#define ST_CLAIM_FULL  "outbox_claim_full"
#define ST_CLAIM_MARK  "outbox_claim_mark"   /* the full claim carrying a mark */
#define ST_CLAIM_DROP  "outbox_claim_delete" /* the full claim carrying a delete */
#define ST_SAMPLE      "outbox_sample"
#define ST_MARK        "outbox_mark"
#define ST_DELETE      "outbox_delete"
#define ST_FAIL        "outbox_fail"
#define ST_RELEASE     "outbox_release"
#define ST_RELEASE_ALL "outbox_release_all"
#define ST_RENEW       "outbox_renew"
#define ST_ARM         "outbox_arm"
/* The full claim and its carrying variants without the keyed part (while no keyed row waits):
 * one prefix, by which claim_send() tells them. */
#define ST_CLAIM_LEAN      "outbox_claim_lean"
#define ST_CLAIM_LEAN_MARK "outbox_claim_lean_mark"
#define ST_CLAIM_LEAN_DROP "outbox_claim_lean_delete"

/* Every unpublished row, in words that match the table's two partial indexes (schema.c: the
 * unkeyed index and the key index), so that the planner reads both: "published_at IS NULL"
 * alone matches neither, and would walk the whole table with its days of published rows. a is
 * the table's alias with its dot, or "". */
#define STORE_UNPUBLISHED(a)                                                                 \
	a "published_at IS NULL AND (" a "ordering_key IS NULL OR " a "ordering_key IS NOT " \
	  "NULL)"

/* The wake-up (schema.c): a relay about to sleep holds the session advisory lock
 * (STORE_WAKEUP_LOCK_CLASS, the table's OID as an integer); the table's statement-level
 * trigger (tgtype AFTER INSERT FOR EACH STATEMENT) notifies only while someone holds it. */
#define STORE_WAKEUP_LOCK_CLASS "1869968482" /* 0x6f757462, "outb" */
#define STORE_WAKEUP_TGTYPE     "4"
/* The cursor source's lead (store/source/position.c): a session advisory lock (this class, the
 * table's OID as an integer), held by the one relay that publishes the table. */
#define STORE_LEAD_LOCK_CLASS "1869968483" /* 0x6f757463, "outc" */

/* Columns an outbox_row needs, in the order the claim returns them. */
#define STORE_ROW_COLUMNS                                                        \
	"o.seq, o.id, o.exchange_name, o.routing_key, o.body, o.body_encoding, " \
	"o.content_type, o.headers, o.properties, o.ordering_key, "              \
	"floor(extract(epoch FROM o.created_at))::bigint, o.attempts"
enum store_claim_col {
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
	/* the claim's last row (seq NULL): the watermark's sample and the lease left */
	COL_WM_SEQ,
	COL_WM_HOLDERS, /* "3/1234,5/99" or NULL */
	COL_WM_NHOLDERS,
	COL_LEASE_LEFT,   /* ms, by the database clock, when the statement ended */
	COL_WM_KEYED,     /* a keyed row above the settled watermark waits */
	COL_KEY_CURSOR,   /* the last ordering key looked at, NULL when the keys ran out */
	COL_MARKED,       /* rows the mark it carried hit (store_claim_mark_send), else NULL */
	COL_KEYS_PENDING, /* an unpublished keyed row exists (looked at from the cursor on) */
	COL_COUNT
};

/* The watermark's sample (store/source/watermark.h): W first, then the transactions other than this
 * one holding a lock on the sequence, read after W (the lateral subquery depends on W, so it
 * runs once W is known). Two %u: the sequence's OID, then the database's OID and the sequence
 * again. */
#define SAMPLE_HOLDERS                                                                      \
	", LATERAL (SELECT string_agg(l.virtualtransaction, ',') AS holders, count(*) AS n" \
	" FROM pg_locks l WHERE l.locktype = 'relation' AND l.database = %u"                \
	" AND l.relation = %u AND l.pid IS DISTINCT FROM pg_backend_pid()"                  \
	" AND s.w IS NOT NULL) h"
#define SAMPLE_FROM                                                                            \
	" FROM (SELECT COALESCE(pg_sequence_last_value(%u::oid::regclass), 0) AS w OFFSET 0) " \
	"s" SAMPLE_HOLDERS
/* The sample taken only when cond (SQL) holds: otherwise W is NULL and the lock list, which
 * reads every lock of the server (pg_lock_status()), is not read at all (a one-time filter on
 * s.w); the holders are NULL and n is 0. */
#define SAMPLE_FROM_WHEN(cond)                                                        \
	" FROM (SELECT CASE WHEN " cond " THEN"                                       \
	" COALESCE(pg_sequence_last_value(%u::oid::regclass), 0) END AS w OFFSET 0) " \
	"s" SAMPLE_HOLDERS
/* Reusable parameter buffers (array literals) of the handle. */
enum store_slot {
	STORE_SLOT_IDS = 0,
	STORE_SLOT_ERRORS,
	STORE_SLOT_DELAYS,
	STORE_SLOT_DEAD,
	STORE_SLOT_COUNTED,
	STORE_SLOT_COUNT,
};

struct store {
	struct store_options opts; /* strings borrowed from the caller */
	PGconn *conn;
	/* The connection's socket as seen by store_interrupt(), which may run on another
	 * thread: set and cleared under fd_lock, and cleared before the socket is closed, so an
	 * interrupt never reaches a descriptor that was closed and reused. */
	pthread_mutex_t fd_lock;
	int fd;
	char server[300]; /* "host:port" of the connection in use or last tried */

	bool prepared;          /* the relay statements exist on this connection */
	bool position_prepared; /* ... and the cursor source's (store/source/position.c) */
	enum store_inflight inflight;
	int64_t inflight_sent_ms; /* CLOCK_MONOTONIC send time of the request in flight */
	bool no_answer;           /* the server did not answer within the answer timeout */
	bool aborted;             /* the shutdown deadline ended a wait */
	int64_t claim_floor;      /* store_set_claim_floor() */
	/* Every row with seq <= claim_seen was visible to the last claim read: the settled
	 * watermark it was sent with (claim_seen_sent, the claim in flight). The floor never
	 * passes it (store/source/claim.c). */
	int64_t claim_seen, claim_seen_sent;
	int64_t sampled_ms;       /* CLOCK_MONOTONIC: when the lock list was last read (0: never) */
	uint64_t lock_list_reads; /* by the cursor's reads, since the handle was made (tests) */
	/* Where the next claim goes on looking for ordering keys (store/source/claim.c): the last key
	 * the previous claim looked at; none (has_cursor false) at the start of a round. */
	char key_cursor[STORE_KEY_CURSOR_MAX];
	bool has_cursor;
	bool round_waiting; /* a claim of this round saw a key whose head waits above safe */
	struct watermark wm;
	/* The identity sequence behind seq and this database, by OID, resolved at connect: the
	 * watermark's samples read the sequence and the locks held on it. */
	unsigned int seq_oid, db_oid;
	/* The wake-up lock's second key: the table's OID as an integer (schema.c). */
	int table_key;
	bool wakeup_current; /* the table's wake-up trigger is this version's (check_table) */
	bool armed;          /* this session holds the wake-up lock (store_arm) */
	bool claim_disarm;   /* the claim in flight lets the wake-up lock go */
	size_t claim_last_n; /* rows the last claim leased (store_claim_send) */
	size_t claim_marked; /* rows the mark carried by the last claim hit */
	/* The last claim saw an unpublished keyed row, or had a cursor, or there was none yet:
	 * the next small claim looks at keys (store/source/claim.c). */
	bool keys_pending;
	bool claim_lean; /* the claim in flight is a lean one (ST_CLAIM_LEAN...) */
	/* Claim tokens: "<relay id, cut>#<nonce>.<counter>" (see STORE_TOKEN_MAX). */
	char token_prefix[52]; /* "<relay id, cut to 50 bytes>#" */
	uint32_t token_nonce;
	uint32_t token_counter;
	char claim_token[STORE_TOKEN_MAX]; /* the token of the claim in flight */
	char table[STORE_NAME_MAX];        /* as given, validated: "outbox" or "app.outbox" */
	char errmsg[STORE_ERRMSG_MAX];
	char notice[2 * STORE_ERRMSG_MAX]; /* store_notice() */
	/* Reused text-array literals ({"a","b"}) for the parameters: no allocation per call once
	 * warm. */
	char *arr[STORE_SLOT_COUNT];
	size_t arr_cap[STORE_SLOT_COUNT];
};

/* ---- connection.c ---- */
/* Clears the descriptor store_interrupt() may use, before the socket is closed. */
void store_forget_fd(struct store *s);

/* ---- connect_targets.c: where to connect, one attempt at a time ---- */
/* keyword=value pairs for one connection attempt (NULL-terminated, borrowed strings). */
struct store_attempt {
	const char *keys[64];
	const char *vals[64];
	int n;
	int64_t timeout_ms;
};
/* Adds key=val (borrowed; nothing when val is NULL or a is full), keeping a NULL-terminated. */
void store_attempt_add(struct store_attempt *a, const char *key, const char *val);
/* Adds the relay's own settings (keepalives, timeouts, read-write, UTF8) to a, before the
 * user's, which win; user_timeout[n] holds the text of tcp_user_timeout, borrowed by a. */
void store_add_defaults(struct store *s, struct store_attempt *a, char *user_timeout, size_t n);
/* One attempt, polled within a->timeout_ms and the shutdown deadline: the new connection
 * (caller PQfinish()es; maybe CONNECTION_BAD), or NULL when out of memory or the time ran out,
 * *aborted telling the shutdown deadline. s->conn is left as it was. */
PGconn *store_connect_once(struct store *s, const struct store_attempt *a, int expand,
                           bool *aborted);
/* Connects s->conn to the first address that accepts and is writable, of every host libpq
 * would try, each with its own timeout: 0, or STORE_ERR_CONN (the error text and s->server
 * tell the last failure), _ABORTED (the shutdown deadline), _FATAL (database.url does not
 * parse) or _NOMEM. */
int store_open_connection(struct store *s) __attribute__((warn_unused_result));

/* ---- schema.c ---- */
/* Splits a validated table name into its schema part ("" when none) and its base name. */
void store_split_table(const char *table, char *schema, size_t schema_len, char *base,
                       size_t base_len);

/* ---- outbox.c ---- */
/* NULL when conn's client_encoding passes UTF-8 through unchanged (UTF8, SQL_ASCII), else the
 * encoding's name (borrowed from conn): the producer and inbox libraries refuse such a
 * connection. */
const char *store_client_encoding_refused(PGconn *conn);

/* ---- admin.c ---- */
/* The operator statements, for tests that EXPLAIN them. */
enum store_admin_sql {
	STORE_SQL_STATUS,       /* store_status(): $1 = max_attempts */
	STORE_SQL_DEAD,         /* store_dead(): $1 = max_attempts, $2 = limit (NULL = all) */
	STORE_SQL_BLOCKED,      /* store_blocked_keys(): as STORE_SQL_DEAD */
	STORE_SQL_REQUEUE_DEAD, /* store_requeue(all_dead): $1 = max_attempts */
	STORE_SQL_PURGE,        /* one slice of store_purge(): $1 = age in ms, $2 = slice size */
	/* The same on a table the cursor source runs, the position last ($2, $3, $3, $2, $3);
	 * and the purge's slice behind the position: $1 = age in ms, $2 = slice size, $3 = the
	 * position, $4 = the last seq looked at. */
	STORE_SQL_CURSOR_STATUS,
	STORE_SQL_CURSOR_DEAD,
	STORE_SQL_CURSOR_BLOCKED,
	STORE_SQL_CURSOR_REQUEUE_DEAD,
	STORE_SQL_CURSOR_PURGE,
	STORE_SQL_CURSOR_PURGE_BEHIND,
};
/* Writes the text of statement which, exactly as the store runs it, into out[cap]: 0, or
 * STORE_ERR_FATAL when it does not fit. */
int store_admin_sql(struct store *s, enum store_admin_sql which, char *out, size_t cap)
        __attribute__((warn_unused_result));

/* ---- request.c: requests, answers and errors ---- */
/* strtoll with end-pointer and errno checks: 0, or -1 when v is not a whole int64. */
int store_parse_int64(const char *v, int64_t *out);
/* Formats the handle's error text (one line, scrubbed of the connection's secrets). */
void store_set_error(struct store *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Sets the handle's error text to "prefix: text" as one line, scrubbed of the connection's
 * secrets; either may be NULL. */
void store_set_line(struct store *s, const char *prefix, const char *text);
/* Classifies a failed result (res may be NULL), copies its message to the handle prefixed by
 * what, and returns STORE_ERR_CONN, _QUERY, _FATAL, _ABORTED or _NOMEM. res is borrowed. A
 * request that got no answer in time leaves the connection closed. */
int store_result_error(struct store *s, const PGresult *res, const char *what);
/* Makes sure the connection is open and no request is waiting; STORE_ERR_CONN otherwise. */
int store_require_conn(struct store *s) __attribute__((warn_unused_result));
/* Runs sql with text params and expects status want; on success *out (owned by the caller,
 * PQclear()) gets the result, else nothing is written. Without params (nparams 0), sql may
 * hold several statements; the last result counts. */
int store_exec(struct store *s, const char *sql, int nparams, const char *const *params,
               ExecStatusType want, PGresult **out, const char *what)
        __attribute__((warn_unused_result));
/* store_exec() that also gives the failed statement's SQLSTATE in state[6] ("" when none;
 * state may be NULL): for callers that tell the operator's bad input or a deadlock from a
 * failure of the database. With state, a data exception (class 22) is said by the server's
 * one line alone. */
int store_exec_state(struct store *s, const char *sql, int nparams, const char *const *params,
                     ExecStatusType want, PGresult **out, const char *what, char *state)
        __attribute__((warn_unused_result));
/* One prepared statement of store_exec_calls(): its name and text parameters. */
struct store_call {
	const char *name;
	int nparams;
	const char *const *params;
};
/* n prepared statements in one round trip and one implicit transaction (libpq's pipeline
 * mode: one Sync after them all), each answering rows: res[i] gets the i-th answer, all to be
 * cleared by the caller; on failure none (a statement that fails skips the rest and the
 * transaction rolls back). Prepared statements rather than EXECUTE in a text of several: the
 * server runs an EXECUTE as a utility statement and keeps its whole answer in a tuple store
 * before sending it, a copy of every row read (a tenth of the reading session's CPU). */
int store_exec_calls(struct store *s, const struct store_call *calls, PGresult **res, int n,
                     const char *what) __attribute__((warn_unused_result));
/* Formats a statement into sql[cap]: 0, or STORE_ERR_FATAL (error set) when it does not fit.
 * Only the validated table name and numbers ever go into the text; values are parameters. */
int store_format_sql(struct store *s, char *sql, size_t cap, const char *fmt, ...)
        __attribute__((format(printf, 4, 5), warn_unused_result));
/* Resolves the identity sequence behind seq and this database's OID into s->seq_oid and
 * s->db_oid (the watermark reads the sequence and the locks on it). STORE_ERR_FATAL when
 * the table has no such sequence (migrate has not run). */
int store_resolve_sequence(struct store *s) __attribute__((warn_unused_result));

/* Sends a prepared statement without waiting for its answer (the caller reads it with
 * store_collect()); kind says which _recv will read it. */
int store_send_prepared(struct store *s, const char *name, int n, const char *const *params,
                        enum store_inflight kind, const char *what)
        __attribute__((warn_unused_result));
/* Reads every result of the request in flight within the answer timeout and the shutdown
 * deadline, and returns the one that tells how it went (the first error, else the last
 * result; the caller PQclear()s it), or NULL (then store_result_error() says why). */
PGresult *store_collect(struct store *s);
/* Runs a prepared statement that changes rows and expects want; *changed (may be NULL) gets
 * PQcmdTuples, *out (may be NULL) the result (caller PQclear()s). */
int store_exec_prepared(struct store *s, const char *name, int n, const char *const *params,
                        ExecStatusType want, size_t *changed, PGresult **out, const char *what)
        __attribute__((warn_unused_result));
/* Waits until the socket is readable (or writable, for_write) or the request's deadline; false
 * when the deadline passed (the handle then records no_answer or aborted). Keeps progress_ms
 * moving. deadline 0 = only the shutdown deadline. */
bool store_wait_socket(struct store *s, bool for_write, int64_t deadline);
/* The deadline of a request sent now: the answer timeout, or 0 for none. */
int64_t store_request_deadline(const struct store *s);

/* ---- text_array.c: parameter literals ---- */
/* Builds a PostgreSQL text-array literal of n strings (get(items, i)) into the handle's
 * reusable slot; *out is borrowed from the handle until the next call with that slot. NULL
 * elements become NULL. With sanitize, each element is cut to 1000 characters (the widest
 * column we write) and invalid UTF-8 bytes become '?', so one bad error text cannot fail a
 * whole statement; without, elements go verbatim (ids must match their rows byte for byte,
 * also on a SQL_ASCII database). */
int store_text_array(struct store *s, enum store_slot slot, const void *items, size_t n,
                     const char *(*get)(const void *items, size_t i), bool sanitize,
                     const char **out) __attribute__((warn_unused_result));
/* An int64 or boolean array literal of n elements: get(items, i) gives element i. */
int store_int_array(struct store *s, enum store_slot slot, const void *items, size_t n,
                    int64_t (*get)(const void *items, size_t i), const char **out)
        __attribute__((warn_unused_result));
int store_bool_array(struct store *s, enum store_slot slot, const void *items, size_t n,
                     bool (*get)(const void *items, size_t i), const char **out)
        __attribute__((warn_unused_result));
/* The getter for a plain array of strings (const char *const *). */
const char *store_string_at(const void *items, size_t i);

/* ---- claim.c: what a claim's answer becomes, for the cursor's reads too ---- */
/* Feeds the watermark one sample: W, and the lock holders as "3/12,5/99" (n of them). */
void store_feed_sample(struct store *s, const char *w_text, const char *holders, int64_t n);
/* Bytes row i of res takes in a batch's buffer (its columns in STORE_ROW_COLUMNS' order). */
size_t store_row_bytes(const PGresult *res, int i);
/* Room in out for nt rows and total bytes of their text; -1 on out of memory. */
int store_batch_reserve(struct store_batch *out, int nt, size_t total);
/* Copies row i of res into r, its text at out->buf + *used (moved on); -1 on a bad number. */
int store_batch_copy_row(const PGresult *res, int i, struct store_batch *out, struct outbox_row *r,
                         size_t *used);
/* Sorts b's rows by seq (RETURNING gives them in no particular order). */
void store_sort_rows(struct store_batch *b);
/* A new claim token (store_token_stem() and a counter) into out[cap], for rows leased by a
 * statement of another file (the cursor source's exceptions). */
int store_claim_token_next(struct store *s, char *out, size_t cap)
        __attribute__((warn_unused_result));

/* ---- marks.c ---- */
/* What a mark of seqs under token sends, prepared and checked: the seqs' array literal in
 * *ids (in STORE_SLOT_IDS). For the mark, and for the claim that carries one (claim.c). */
int store_mark_params(struct store *s, const char *token, const int64_t *seqs, size_t n,
                      const char **ids) __attribute__((warn_unused_result));

/* ---- table_mode.c: whether the cursor source runs the table ---- */
/* The position table beside the outbox table ("app.outbox" -> "app.outbox_position"). */
#define STORE_POSITION_SUFFIX "_position"
/* Whether the cursor source runs the table: *cursor true and *pos its position when
 * <table>_position has the row of stream 'main'; false (lease mode) when the table or the row
 * is missing. 0 or an error. */
int store_cursor_position(struct store *s, bool *cursor, int64_t *pos)
        __attribute__((warn_unused_result));
/* Which source runs the table, read anew by every operator command: the lease source (cursor
 * false), or the cursor source at position pos, whose text p[24] is ready for a parameter. */
struct store_table_mode {
	bool cursor;
	int64_t pos;
	char p[24];
};
int store_table_mode(struct store *s, struct store_table_mode *m)
        __attribute__((warn_unused_result));

/* ---- statements.c ---- */
/* Prepares the relay's statements on this connection unless done (admin handles prepare on
 * first use only: before `migrate` the table may not exist). */
int store_ensure_prepared(struct store *s) __attribute__((warn_unused_result));
/* Prepares one statement (fmt formatted with its arguments) as name on this connection; a
 * statement the table cannot take (a missing column or table) is STORE_ERR_FATAL, its error
 * saying to run 'outbox-relay migrate'. */
int store_prepare(struct store *s, const char *name, int nparams, const char *fmt, ...)
        __attribute__((format(printf, 4, 5), warn_unused_result));

#endif
