/* The operator side's queries (store/operator/admin.c): the backlog gauges, dead rows and
 * blocked keys, requeue and discard (never racing a relay's lease), retention's purge. */
#ifndef OUTBOX_STORE_OPERATOR_ADMIN_H
#define OUTBOX_STORE_OPERATOR_ADMIN_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/store.h"

/* Reads the gauges at a cost of O(unpublished rows), never O(table): published is estimated
 * (live rows by the statistics less the unpublished ones) once the table is over 1 MiB. */
int store_status(struct store *s, struct store_status *st) __attribute__((warn_unused_result));

/* A listed row (dead rows, blocked keys). Strings owned by the list. */
struct store_listed {
	char *id;
	char *exchange;
	char *routing_key;
	char *ordering_key; /* NULL when none */
	char *last_error;   /* NULL when none */
	int attempts;
	char *created_at;   /* ISO 8601 text */
	char *available_at; /* ISO 8601 text */
};
struct store_list {
	struct store_listed *items;
	size_t n;
};
void store_list_free(struct store_list *l); /* frees contents, not l */

/* Dead rows, oldest first, at most limit (0 = all). */
int store_dead(struct store *s, size_t limit, struct store_list *out)
        __attribute__((warn_unused_result));
/* Head rows of blocked ordering keys (failed and waiting, or dead), oldest first. */
int store_blocked_keys(struct store *s, size_t limit, struct store_list *out)
        __attribute__((warn_unused_result));
/* attempts = 0, last_error = NULL, available_at = now(), lease cleared, for unpublished ids;
 * all_dead: every dead row. *n_changed gets the count. By ids, as store_requeue_ids() unforced,
 * rows under a live lease being an error (STORE_ERR_QUERY, nothing changed). */
int store_requeue(struct store *s, const char *const *ids, size_t n, bool all_dead,
                  int64_t *n_changed) __attribute__((warn_unused_result));
/* Deletes unpublished ids; as store_discard_ids() unforced, rows under a live lease being an
 * error (STORE_ERR_QUERY, nothing changed). */
int store_discard(struct store *s, const char *const *ids, size_t n, int64_t *n_changed)
        __attribute__((warn_unused_result));

/* An operator's command never races a relay: a row under a live lease (locked_by set and
 * locked_until not passed: a relay is publishing it, or a replay holds it) is refused unless
 * forced; so is, on a table the cursor source runs, a row above its position (its leader may
 * be publishing it right now). What the by-id commands below found. On such a table
 * "unpublished" and "dead" are the cursor's (docs/design.md): the commands act on deferred
 * unpublished rows as on unpublished rows of a lease table; requeue keeps deferred_at, so that
 * the cursor's exception path takes the row up; --all-dead leaves rows above the position to
 * the relay. */
#define STORE_LEASED_MAX 20
struct store_leased {
	char id[257]; /* VARCHAR(64): up to 64 characters of up to 4 bytes */
	char locked_by[257];
	char locked_until[32]; /* ISO 8601, UTC */
	bool ahead;            /* above the cursor source's position (no lease: its leader's) */
};
struct store_ids_outcome {
	int64_t changed;  /* rows requeued or deleted */
	int64_t leased;   /* rows among the ids under a live lease, or in the cursor's hands */
	int64_t ahead;    /* of those, rows above the cursor source's position */
	int64_t position; /* the cursor source's position; -1: the lease source runs the table */
	size_t n_listed;  /* the first STORE_LEASED_MAX of them, oldest first */
	struct store_leased listed[STORE_LEASED_MAX];
};
/* In one transaction, the unpublished rows of ids (borrowed) are locked against claims and
 * those under a live lease are listed in *out. Some are, and not force: nothing is changed
 * (out->changed 0). Otherwise attempts = 0, last_error = NULL, available_at = now(); the lease
 * is cleared where it has run out and kept where it is live, so that its relay finishes with
 * the row first: it is never published by two relays at once, and comes back with fresh
 * attempts if that relay does not publish it. Notifies the channel when rows changed. */
int store_requeue_ids(struct store *s, const char *const *ids, size_t n, bool force,
                      struct store_ids_outcome *out) __attribute__((warn_unused_result));
/* As store_requeue_ids(), deleting the rows. Forced, a leased row is deleted too: the relay's
 * later writes of it (mark, failure, release, renewal) are fenced by its claim's token and find
 * nothing, so nothing brings it back; what that relay has already handed to the broker may
 * still be delivered once. */
int store_discard_ids(struct store *s, const char *const *ids, size_t n, bool force,
                      struct store_ids_outcome *out) __attribute__((warn_unused_result));
/* Deletes published rows older than older_than_ms, at most batch rows per statement, until
 * none are left or *stop becomes true (may be NULL). *n_deleted gets the total. */
int store_purge(struct store *s, int64_t older_than_ms, int batch, const atomic_int *stop,
                int64_t *n_deleted) __attribute__((warn_unused_result));

#endif
