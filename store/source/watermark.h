/* The ordering watermark (DESIGN §3, ordering keys): the highest seq up to which no transaction
 * still in progress can commit an outbox row. Keyed rows are claimable only up to it, so a
 * key's rows go out in seq order with no row appearing later behind one already published.
 * Pure logic: the store feeds it samples read by its statements and asks where keyed rows
 * may be claimed; nothing here talks to PostgreSQL. Not thread-safe: one per connection.
 *
 * Why a lock list and not transaction ids. A producer's INSERT draws the row's seq from the
 * identity sequence before the transaction has an xid (the `txid` default assigns it a moment
 * later, in the same statement), so a snapshot's xmin moving past some xid says nothing about
 * a transaction that holds a low seq but no xid yet. What every such transaction does hold,
 * from its first nextval() until it ends, is a lock on the sequence (PostgreSQL keeps it to the
 * end of the transaction). So each sample is: W, the sequence's last value, then the virtual
 * transaction ids holding a lock on the sequence, read after W. Any transaction that drew a
 * seq <= W and had not ended is in that list. W is settled once a later sample shows none of
 * them holding the lock any more: they have all committed or rolled back. A statement may
 * claim keyed rows up to a W settled by an earlier statement (its snapshot then sees every row
 * up to W that will ever exist), never by its own (its snapshot predates its lock list). */
#ifndef OUTBOX_STORE_WATERMARK_H
#define OUTBOX_STORE_WATERMARK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define WATERMARK_CANDIDATES 16  /* samples waiting to settle, oldest first */
#define WATERMARK_HOLDERS    512 /* lock holders remembered per candidate */

/* A virtual transaction id ("backend/local", e.g. "3/1234"; prepared transactions "-1/xid"),
 * packed. Unique over a server's life: local ids are not reused by a backend slot. */
typedef uint64_t watermark_vxid;

struct watermark_candidate {
	int64_t w;
	size_t n;                                  /* holders */
	watermark_vxid holders[WATERMARK_HOLDERS]; /* sorted */
};

struct watermark {
	int64_t safe;   /* settled: keyed rows with seq <= safe are claimable */
	int64_t last_w; /* W of the latest sample (0 before the first) */
	bool waiting;   /* the latest claim saw a keyed row above safe */
	bool stuck;     /* the latest sample left a candidate unsettled */
	size_t ncand;
	struct watermark_candidate cand[WATERMARK_CANDIDATES];
};

/* Forgets everything (a new connection, or a new server after a failover: lock lists of one
 * server say nothing about another). Keyed rows wait for the next settled sample. */
void watermark_reset(struct watermark *wm);

/* Parses a virtual transaction id as pg_locks shows it; 0 on success, -1 otherwise. */
int watermark_parse_vxid(const char *text, watermark_vxid *out);

/* Feeds one sample: w was read first, then holders (n virtual transaction ids, any order,
 * duplicates allowed, the reading session itself excluded) were read after it, both by one
 * statement that has completed. Candidates none of whose holders appear in this list are
 * settled; then (w, holders) becomes a candidate, or is settled at once when no transaction
 * held the lock. complete is false when the caller had to cut the holder list short: such a
 * sample settles nothing and is not kept, since a missing holder would look ended. */
void watermark_sample(struct watermark *wm, int64_t w, const watermark_vxid *holders, size_t n,
                      bool complete);

/* W read without the lock list: it settles nothing, but it is the highest seq drawn so far
 * (last_w). */
void watermark_seen(struct watermark *wm, int64_t w);

/* The seq up to which the next statement may claim keyed rows. */
static inline int64_t watermark_safe(const struct watermark *wm)
{
	return wm->safe;
}

/* True when keyed rows wait above the settled watermark and every transaction holding them
 * back may well be over by now: sampling again soon is worth it. False when nothing waits or
 * the last sample still saw a holder of the oldest candidate (a long transaction). */
bool watermark_settling(const struct watermark *wm);

#endif
