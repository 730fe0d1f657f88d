/* Replay (store/operator/replay.c): published rows made pending again, in steps that never
 * overtake a key's row in flight. */
#ifndef OUTBOX_STORE_OPERATOR_REPLAY_H
#define OUTBOX_STORE_OPERATOR_REPLAY_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/outbox_row.h"
#include "store/store.h"

/* The header a replayed message carries (base/outbox_row.h). */
#define STORE_REPLAY_HEADER OUTBOX_ROW_REPLAY_HEADER

/* Which published rows to replay; NULL (0) = no condition. Borrowed. */
struct store_replay_filter {
	bool by_created;              /* since/until on created_at, not published_at */
	const char *since;            /* inclusive, as store_replay_time() resolved it */
	const char *until;            /* exclusive, likewise */
	const char *exchange;         /* exact */
	const char *routing_key_like; /* LIKE pattern, '!' escapes: store_replay_like() */
	const char *ordering_key;     /* exact */
	const char *const *ids;
	size_t n_ids;
};

/* A row (or, for store_replay_skipped(), a key) as the calls below report it. Every field
 * may be NULL; all are borrowed for the callback's duration. */
struct store_replay_row {
	const char *id, *exchange, *routing_key, *ordering_key;
	const char *published_at, *created_at; /* UTC, ms */
	const char *reason;                    /* why it is not or cannot be replayed */
	int64_t rows;                          /* store_replay_skipped(): the key's rows */
};
/* Returns 0 to go on; any other value stops the listing and is returned. */
typedef int (*store_replay_fn)(const struct store_replay_row *r, void *arg);

/* What the steps did so far (start from zero, left = the selection's size). */
struct store_replay_progress {
	int64_t replayed;  /* rows made pending again */
	int64_t gone;      /* selected rows no longer published when their turn came (purged,
	                      or replayed by another replay meanwhile) */
	int64_t left;      /* rows still selected: their keys must wait */
	int64_t left_keys; /* and their keys */
	bool conflict;     /* the last step hit a deadlock and changed nothing: try again */
};

/* Turns an operator's pattern (`*` any run of characters, `?` one, the rest literal) into a
 * LIKE pattern with '!' as its escape, in out[cap]: 0, or -1 when it does not fit. */
int store_replay_like(const char *pattern, char *out, size_t cap);
/* Sets up the session for one replay (an admin handle): the session's time zone is UTC, the
 * selection is empty. asked_at[cap] gets the database's time now (UTC, ms): the header's
 * value. STORE_ERR_FATAL when the table has no seq sequence. */
int store_replay_begin(struct store *s, char *asked_at, size_t cap)
        __attribute__((warn_unused_result));
/* at (a time PostgreSQL reads; without a zone, UTC) or else now minus ago_ms, as UTC text with
 * microseconds into out[cap]. 1 (errmsg says why) when at is not a finite time. */
int store_replay_time(struct store *s, const char *at, int64_t ago_ms, char *out, size_t cap)
        __attribute__((warn_unused_result));
/* Selects the published rows matching f (after store_replay_begin()); *n_rows gets how many. */
int store_replay_select(struct store *s, const struct store_replay_filter *f, int64_t *n_rows)
        __attribute__((warn_unused_result));
/* The selected rows in seq order, for --dry-run (id, exchange, routing key, ordering key,
 * published_at, created_at), read a page at a time. */
int store_replay_list(struct store *s, store_replay_fn fn, void *arg)
        __attribute__((warn_unused_result));
/* Ids among ids (borrowed) that were not selected, each with the reason. */
int store_replay_missing_ids(struct store *s, const char *const *ids, size_t n, store_replay_fn fn,
                             void *arg) __attribute__((warn_unused_result));
/* Selected rows whose headers cannot take the replay header (not a JSON object, or text
 * PostgreSQL cannot read as JSON), each with the reason (fn may be NULL); *n_refused gets how
 * many. Such a row would make the replay's statement fail: the caller refuses the replay. */
int store_replay_refused(struct store *s, store_replay_fn fn, void *arg, int64_t *n_refused)
        __attribute__((warn_unused_result));
/* One step: in one transaction, makes the selected rows pending again (published_at,
 * attempts, last_error and the lease cleared, available_at = now(), asked_at merged into the
 * headers as STORE_REPLAY_HEADER) and NOTIFYs the channel, except the rows of keys that must
 * wait — a key with a row in flight (that newer row would go out before the replayed ones),
 * or every key while a transaction that inserted into the outbox stays open for wait_ms.
 * The unpublished rows of each key replayed are leased to the replay until just after the
 * commit (locked_by "replay#<pid>.<asked_at>", then NULL with locked_until = the release
 * time): a claim begun before the commit cannot take them. Adds to *p. Two replays of one
 * table take turns (an advisory lock). */
int store_replay_step(struct store *s, const char *asked_at, int64_t wait_ms,
                      struct store_replay_progress *p) __attribute__((warn_unused_result));
/* The keys still selected after the last step: ordering_key, rows and the reason. */
int store_replay_skipped(struct store *s, store_replay_fn fn, void *arg)
        __attribute__((warn_unused_result));

#endif
