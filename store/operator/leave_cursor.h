/* Handing a table back from the cursor source to the lease source (store/operator/
 * leave_cursor.c; `outbox-relay leave-cursor`): the rows the cursor published carry no
 * published_at, so the lease source would publish them all again. They are marked, then the
 * position row goes. docs/design.md, "Row sources: lease and cursor". */
#ifndef OUTBOX_STORE_OPERATOR_LEAVE_CURSOR_H
#define OUTBOX_STORE_OPERATOR_LEAVE_CURSOR_H

#include <stdbool.h>
#include <stdint.h>

#include "store/store.h"

/* Rows marked per statement (each its own transaction) by the command. */
#define STORE_LEAVE_BATCH 10000

enum store_leave_state {
	STORE_LEAVE_NOT_CURSOR, /* no position row: the lease source takes the table as it is */
	STORE_LEAVE_LED,        /* another session holds the table's lead (a relay with
	                           relay.source = cursor runs): nothing was changed */
	STORE_LEAVE_DONE,       /* marked and the position row deleted (dry run: counted only) */
};

/* What store_leave_cursor() found and did. */
struct store_leave_outcome {
	enum store_leave_state state;
	int64_t position;  /* the position handed over (STORE_LEAVE_DONE) */
	char moved_at[64]; /* its last move, ISO 8601 in UTC: the published_at the rows get */
	int64_t marked;    /* rows behind the position marked published (dry run: to be) */
	int64_t deferred;  /* exceptions left unpublished (deferred_at set; dead ones included):
	                      the lease source retries them, or keeps the dead ones dead */
};

/* On an admin store (store_options.admin), as the table's owner: takes the table's lead (the
 * cursor source's session advisory lock, store/source/position.c), so that no cursor relay
 * leads or moves the position meanwhile; reads the position P; marks published_at =
 * COALESCE(moved_at, now()) on every row with seq <= P that is neither published nor deferred,
 * batch rows a statement (each committed on its own, oldest first: unkeyed rows by seq, then
 * keyed rows by key and seq, each along its partial index); then deletes the position row, last,
 * so that a run cut short leaves the table the cursor's and a second run finishes the job. The
 * lead is let go before returning. Rows above P and deferred rows are left as they are: the
 * lease source publishes (or keeps dead) them as any unpublished row. dry_run: takes the lead
 * and counts, changes nothing.
 * *out is written on success only (the state says which case). Errors: STORE_ERR_FATAL when
 * the role may not delete the position row (said before anything is marked: run it as the
 * table's owner) or the position moved meanwhile; STORE_ERR_CONN, _QUERY as any statement (the
 * text says how many rows were marked so far; run the command again). */
int store_leave_cursor(struct store *s, int batch, bool dry_run, struct store_leave_outcome *out)
        __attribute__((warn_unused_result));

#endif
