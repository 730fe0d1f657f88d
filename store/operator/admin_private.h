/* What admin.c and admin_cursor.c share, and nobody else: the pieces of the operator statements
 * and the statements for a table the cursor source runs (admin_cursor.c). */
#ifndef OUTBOX_STORE_OPERATOR_ADMIN_PRIVATE_H
#define OUTBOX_STORE_OPERATOR_ADMIN_PRIVATE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "store/store.h"

#define ADMIN_SQL_MAX 4096

/* ISO 8601 in UTC, so the CLI output does not depend on the session's time zone. */
#define ISO(col) "to_char(" col " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"

/* A row a relay (or a replay) holds right now: its claim's token, and the lease not run out. */
#define STORE_LIVE_LEASE "(locked_by IS NOT NULL AND locked_until >= now())"

/* Columns: id, exchange, routing key, ordering key, last_error, attempts, created, available. */
#define LIST_COLUMNS                                                                \
	"id, exchange_name, routing_key, ordering_key, last_error, attempts, " ISO( \
	        "created_at") ", " ISO("available_at")

/* The status statement of either source ($1 = max_attempts; docs/operations.md, "status"):
 * cte defines `blocked` (the keys whose head is dead or waiting), rows is a query whose rows
 * are the table's unpublished ones, with their attempts, created_at and leased (held by a
 * relay right now). Answers one row: pending, leased, dead, the published estimate, the oldest
 * pending age, the blocked keys, the oldest blocked key and its age, the table's pages. */
int admin_status_sql(struct store *s, const char *cte, const char *rows, char *sql, size_t cap)
        __attribute__((warn_unused_result));

/* On a table the cursor source runs, with pos its position (docs/design.md):
 *   unpublished = published_at IS NULL AND (seq > pos OR deferred_at IS NOT NULL)
 * Rows above the position are a range of the seq index; the deferred ones below it are in the
 * deferred index. Each of the two reads one, so every statement below costs O(unpublished).
 * a is the table's alias with its dot, or ""; p the position's parameter ("$2"). */
#define CURSOR_ABOVE(a, p) a "seq > " p "::bigint AND " a "published_at IS NULL"
#define CURSOR_DEFERRED(a, p) \
	a "deferred_at IS NOT NULL AND " a "published_at IS NULL AND " a "seq <= " p "::bigint"
/* One unpublished row (by id, found by the primary key). */
#define CURSOR_UNPUBLISHED(p) \
	"published_at IS NULL AND (seq > " p "::bigint OR deferred_at IS NOT NULL)"

/* The statements on a cursor table, as admin.c's for a lease table; parameters as theirs, the
 * position last. status: $1 = max_attempts, $2 = position. dead, blocked: $1 = max_attempts,
 * $2 = limit, $3 = position. requeue --all-dead: $1 = max_attempts, $2 = position (deferred
 * dead rows only: those above the position are the relay's). The published count of a small
 * table: $1 = position. */
int admin_cursor_status_sql(struct store *s, char *sql, size_t cap)
        __attribute__((warn_unused_result));
int admin_cursor_dead_sql(struct store *s, char *sql, size_t cap)
        __attribute__((warn_unused_result));
int admin_cursor_blocked_sql(struct store *s, char *sql, size_t cap)
        __attribute__((warn_unused_result));
int admin_cursor_requeue_dead_sql(struct store *s, char *sql, size_t cap)
        __attribute__((warn_unused_result));
int admin_cursor_count_published_sql(struct store *s, char *sql, size_t cap)
        __attribute__((warn_unused_result));
/* One slice of the purge behind the position: $1 = age in ms, $2 = slice size, $3 = position,
 * $4 = the last seq looked at (the slice starts above it). */
int admin_cursor_purge_sql(struct store *s, char *sql, size_t cap)
        __attribute__((warn_unused_result));
/* Deletes the rows the cursor published (behind pos, never deferred) created before the
 * cut-off, oldest seq first, in slices of batch rows, each its own statement; stops at the
 * first row younger than the cut-off, at the position, or once *stop (may be NULL) is set.
 * *n_deleted gets how many. */
int admin_cursor_purge(struct store *s, int64_t pos, int64_t older_than_ms, int batch,
                       const atomic_int *stop, int64_t *n_deleted)
        __attribute__((warn_unused_result));

#endif
