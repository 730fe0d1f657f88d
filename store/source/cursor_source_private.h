/* What the cursor source's files share (store/source/cursor_source.c: leading, reading,
 * batches, the connection; store/source/cursor_settle.c: moves and settling). Nothing outside
 * them includes it. */
#ifndef OUTBOX_STORE_SOURCE_CURSOR_SOURCE_PRIVATE_H
#define OUTBOX_STORE_SOURCE_CURSOR_SOURCE_PRIVATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/source/cursor_keys.h"
#include "store/source/lease.h"
#include "store/source/position.h"
#include "store/source/source_private.h"
#include "store/store.h"

struct cursor {
	struct source base; /* first: a struct source * is a struct cursor * */
	struct source_options o;
	struct store *store;

	bool leader;
	bool standby_said;  /* the lead hook heard this relay stands by */
	bool pos_known;     /* pos is what this relay last read or wrote of the table */
	int64_t lead_at_ms; /* when to try for the lead again */
	int64_t pos;        /* the table's position */
	int64_t read_pos;   /* every row up to it was handed out or passed */
	int64_t read_fence; /* the fence as the last read began */
	bool read_full; /* the last read found as many rows as it asked for, all of them usable */
	/* The first seq a read found missing below a row it found, above the fence: a row there
	 * may still be committed, so the rows after it wait (0: none). hole_reads: reads that
	 * stopped there; after two, reads go only up to the fence until it passes the hole. */
	int64_t hole;
	int hole_reads;
	int64_t sampled_ms; /* when a read last read the lock list (0: not since leading) */
	/* The last read: when it was sent, how many rows it found, whether one that build()
	 * looked at had a key (gathering, source_gather_us()). */
	int64_t read_us;
	size_t read_rows;
	bool read_keyed;

	/* What the next move writes: the rows passed (their error texts owned), and how many
	 * confirmed rows it records (owed until it lands). */
	struct position_pass *passes;
	size_t n_passes, passes_cap;
	size_t n_unrecorded;
	int64_t batch_t0_us;
	bool batch_keyed; /* the batch out passed a keyed row, or one of its keyed rows failed */
	bool owed_across; /* the rows owed were confirmed before the connection was lost */
	/* The move sent last: where to, how many of the passes and owed rows it records; lost:
	 * the connection went before its answer (it may have landed). */
	bool moving_lost;
	int64_t moving_to;
	size_t moving_passes, moving_rows;

	/* Two reads: reads[cur] is the one the batch out was built from (its rows point into it),
	 * reads[1 - cur] the one fetched ahead while the broker confirms. */
	struct cursor_read {
		struct store_batch rows;
		struct position_seen *seen;
		size_t seen_cap;
		int64_t fence;
		bool bounded; /* it read only up to the fence */
	} reads[2];
	int cur;
	enum { AHEAD_NONE, AHEAD_READY } ahead;
	struct cursor_keys keys;
	struct outbox_row *rows; /* the batch handed out */
	size_t rows_cap;

	struct store_batch lane; /* exceptions claimed */
	int64_t lane_due_ms;
	bool prefer_lane;

	bool out, out_lane; /* a batch is handed out (of exceptions) */
	int64_t out_us;
	int64_t out_from; /* read_pos when the batch out was built: settled up to it */
	struct source_batch view;

	int64_t pause_ms;
	enum source_step step;
};

static inline int cursor_fail(struct cursor *c, enum source_step step, int rc)
{
	c->step = step;
	return rc;
}

static inline void cursor_answered(struct cursor *c)
{
	if (c->o.hooks.answered)
		c->o.hooks.answered(c->o.hooks.arg);
}

/* cursor_settle.c */
/* Empties what the next move writes. */
void cursor_clear_passes(struct cursor *c);
/* Adds p to what the next move writes (its error text copied). */
int cursor_add_pass(struct cursor *c, const struct position_pass *p);
/* What was owed is forgotten (another relay leads from a position of its own). */
void cursor_drop_owed(struct cursor *c);
/* The move whose answer was lost landed after all. */
void cursor_moved(struct cursor *c);
/* Sets what the move to `to` records (with every pass, or none), before it is sent. */
void cursor_moving(struct cursor *c, int64_t to, bool passes);
/* The move's answer: moved (1), or not (0: another relay leads; an error is returned). */
int cursor_move_answered(struct cursor *c, int moved);
/* Moves the position to read_pos with the passed rows, and waits for it. */
int cursor_flush(struct cursor *c);

/* cursor_source.c */
/* Forgets the read fetched ahead (its rows are read again); *n gets how many it had. */
void cursor_drop_ahead(struct cursor *c, size_t *n);

#endif
