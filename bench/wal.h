/* wal.h — the WAL a stretch of work writes: the insert LSN and pg_stat_wal at both ends, and
 * pg_waldump's breakdown of the range by record type, per message or per row. */
#ifndef OUTBOX_BENCH_WAL_H
#define OUTBOX_BENCH_WAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <libpq-fe.h>

#include "bench/bench.h"

#define WAL_TOP 8 /* record types printed by name; the rest add up as "other" */

/* One end of a stretch. */
struct wal_point {
	uint64_t lsn;                  /* pg_current_wal_insert_lsn(); 0 = unknown */
	long long records, fpi, bytes; /* pg_stat_wal; -1 = unknown */
};

/* One record type of the breakdown, per message (or row). */
struct wal_type {
	char name[64]; /* as pg_waldump names it: "Heap/HOT_UPDATE" */
	double count, bytes;
};

/* The WAL of a stretch per message (or row); NAN where unknown. */
struct wal_cost {
	double bytes;   /* LSN distance: everything written, page headers included */
	double records; /* pg_stat_wal's deltas: every backend of the server */
	double fpi;
	double stat_bytes;
	bool dumped;                        /* a breakdown was asked for */
	int n_types;                        /* 0 when the breakdown is unavailable: why says why */
	struct wal_type types[WAL_TOP + 1]; /* largest first; the last may be "other" */
	char why[200];
};

/* Keeps the WAL written from now on until wal_release() (or c closes): a temporary physical
 * replication slot on c, so that a checkpoint during a long run does not recycle the segments
 * pg_waldump is to read later. slot gets its name, or "" when the server would not make one
 * (wal_level minimal, no free slot): the breakdown may then be unavailable, nothing fails. */
void wal_hold(PGconn *c, char *slot, size_t len);
/* Drops the slot wal_hold() made; accepts "". */
void wal_release(PGconn *c, const char *slot);

/* The insert LSN now into p->lsn (0 when it cannot be read). */
void wal_mark_lsn(PGconn *c, struct wal_point *p);
/* pg_stat_wal now into p (-1 when it cannot be read, before PostgreSQL 14). It counts what
 * backends have flushed to the statistics: c's own statements are flushed first; another
 * backend's show once it ends or reports (within a second or so while it works). */
void wal_mark_stats(PGconn *c, struct wal_point *p);

/* The WAL between a and z over n messages into w: a->lsn .. z->lsn, the pg_stat_wal deltas,
 * and with dump, pg_waldump --stats=record over the range (found beside $RELAY_TEST_PG_CTL's
 * pg_ctl or in /usr/lib/postgresql/<server major>/bin, reading $RELAY_TEST_PG_DATA/pg_wal;
 * waits up to 5 s for the range to be written). Never fails: unknown parts stay NAN, a
 * missing breakdown is explained in w->why. */
void wal_cost(PGconn *c, const struct wal_point *a, const struct wal_point *z, long n, bool dump,
              struct wal_cost *w);

/* Prints "<what>: wal per <unit> (<note>): 412 B, 3.10 records, 0.020 fpi (pg_stat_wal
 * 405 B)" (note may be NULL) and, unless the breakdown was not asked for, "<what>: wal per
 * <unit> by record (pg_waldump): Heap/HOT_UPDATE 180 B 1.00, ..." (bytes and records of each
 * type per unit, largest first). */
void wal_print(const char *what, const char *unit, const char *note, const struct wal_cost *w);

/* The producers' insert path alone: n single-row autocommit INSERTs through the SQL of the
 * producer measurement (db_prepare_insert()) into a fresh outbox table made by `outbox-relay
 * migrate` (its indexes and triggers as they are), no relay running; its WAL per row into w.
 * -1 after bench_fail(what). */
int wal_insert_probe(struct bench *b, const char *what, long n, struct wal_cost *w)
        __attribute__((warn_unused_result));

#endif
