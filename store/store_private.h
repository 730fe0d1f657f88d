/* Internals shared by the store's .c files (not installed, not for other modules): the handle,
 * identifier checks, error classification and text-array encoding. */
#ifndef OUTBOX_STORE_STORE_PRIVATE_H
#define OUTBOX_STORE_STORE_PRIVATE_H

#include <stdbool.h>
#include <stddef.h>
#include <libpq-fe.h>

#include "base/identifier.h"
#include "store/outbox_store.h"

/* Longest "schema.table" plus the longest suffix we derive ("_pending_idx") and a NUL. */
#define STORE_NAME_MAX   160
#define STORE_ERRMSG_MAX 512

/* Which _send call is waiting for its _recv. */
enum store_inflight {
	STORE_INFLIGHT_NONE = 0,
	STORE_INFLIGHT_CLAIM,
	STORE_INFLIGHT_MARK,
	STORE_INFLIGHT_MARK_NOOP, /* an empty mark: nothing was sent */
};

/* Reusable parameter buffers (array literals) of the handle. */
enum store_slot {
	STORE_SLOT_IDS = 0,
	STORE_SLOT_ERRORS,
	STORE_SLOT_DELAYS,
	STORE_SLOT_DEAD,
	STORE_SLOT_COUNT,
};

/* The ordering watermark: the highest seq such that no transaction still in progress can
 * commit a row with that seq or a lower one. Keyed rows are claimable only up to it, so a
 * key's rows go out in seq order with no row appearing later behind one already published.
 * Each claim reads the sequence's last value W (after its snapshot was taken) and reports
 * its snapshot's xmin and xmax. Any row with seq <= W_n was given its seq, and so its
 * transaction an id, before claim n read W_n, hence before claim n+1 took its snapshot: once
 * a later snapshot's xmin reaches claim n+1's xmax, all those transactions have ended and
 * W_n is settled. (This relies on the identity sequence handing out values in order, i.e.
 * CACHE 1, PostgreSQL's default.) */
#define WM_PENDING 16

struct ordering_watermark {
	int64_t safe;   /* settled watermark */
	int64_t last_w; /* W read by the last claim (or settle), to pair with the next xmax */
	bool have_w;
	/* Candidates (W, X), oldest first, W and X rising: W is settled once xmin >= X. Kept
	 * until settled, so that under steady overlapping transactions the watermark still
	 * moves as soon as xmin passes an older candidate. */
	struct {
		int64_t w;
		uint64_t x;
	} pend[WM_PENDING];
	int npend;
	bool stuck;         /* the oldest candidate waits for a transaction that is still running */
	bool keyed_waiting; /* the last claim saw a keyed row above the settled watermark */
};

struct store {
	struct store_options opts; /* strings borrowed from the caller */
	PGconn *conn;
	bool prepared; /* the relay statements exist on this connection */
	enum store_inflight inflight;
	bool no_answer;      /* the server did not answer within the answer timeout (see collect) */
	int64_t claim_floor; /* store_set_claim_floor() */
	struct ordering_watermark wm;
	char table[STORE_NAME_MAX]; /* as given, validated: "outbox" or "app.outbox" */
	char errmsg[STORE_ERRMSG_MAX];
	/* Reused text-array literals ({"a","b"}) for the id/error parameters: no allocation per
	 * call once warm. */
	char *arr[STORE_SLOT_COUNT];
	size_t arr_cap[STORE_SLOT_COUNT];
};

/* Splits a validated table name into its schema part ("" when none) and its base name. */
void store_split_table(const char *table, char *schema, size_t schema_len, char *base,
                       size_t base_len);
/* "schema.base_wakeup" (or "base_wakeup") for a validated table; false when it does not fit. */
bool store_wakeup_name(const char *table, char *out, size_t len);
/* strtoll with end-pointer and errno checks: 0, or -1 when v is not a whole int64. */
int store_parse_int64(const char *v, int64_t *out);
/* Formats the handle's error text (one line). */
void store_set_error(struct store *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Classifies a failed result (res may be NULL), copies its message to the handle prefixed by
 * what, and returns STORE_ERR_CONN, _QUERY, _FATAL or _NOMEM. res is borrowed. */
int store_result_error(struct store *s, const PGresult *res, const char *what);
/* Runs sql with text params and expects status want; on success *out (owned by the caller,
 * PQclear()) gets the result. */
int store_exec(struct store *s, const char *sql, int nparams, const char *const *params,
               ExecStatusType want, PGresult **out, const char *what)
        __attribute__((warn_unused_result));
/* Builds a PostgreSQL text-array literal of n strings (get(items, i)) into the handle's
 * reusable slot; *out is borrowed from the handle until the next call with that slot. NULL
 * elements become NULL; each element is cut to 1000 characters (the widest column we
 * write); invalid UTF-8 bytes are replaced by '?' so one bad error text cannot fail a whole
 * statement. */
int store_text_array(struct store *s, enum store_slot slot, const void *items, size_t n,
                     const char *(*get)(const void *items, size_t i), const char **out)
        __attribute__((warn_unused_result));
/* The getter for a plain array of strings (const char *const *). */
const char *store_string_at(const void *items, size_t i);
/* Makes sure the connection is open; STORE_ERR_CONN otherwise. */
int store_require_conn(struct store *s) __attribute__((warn_unused_result));

#endif
