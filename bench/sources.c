/* The row sources issue 37 weighs, prototyped on the database side alone (one libpq client
 * plays the relay, no broker): (L) the lease source's claim and mark, two writes of every row;
 * (a) a cursor over the append-only table, one write of a position row per batch; (b) logical
 * decoding of the table's inserts through a pgoutput slot; (c) the cursor of (a) reading unkeyed
 * rows past the fence, the position moved behind them with a sample every SOURCES_SAMPLE_MS.
 * Each drains the same backlog: rows/s,
 * PostgreSQL's CPU and WAL per message, the VACUUM its writes leave, and what the backlog cost
 * while no relay ran (a slot keeps WAL). Then the same designs while producers insert. */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/cpu.h"
#include "bench/db.h"
#include "bench/latency.h"
#include "bench/logical.h"
#include "bench/wal.h"
#include "bench/drive/pgsql.h"

#define SOURCES_ROWS       200000 /* the backlog without --rows */
#define SOURCES_ROWS_QUICK 20000  /* and with --quick */
#define SOURCES_TABLE      "bench_sources"
#define SOURCES_CURSOR     "bench_sources_cursor" /* (a)'s position row */
/* (b)'s slot and publication. Fixed names, so that a run that died leaving them is cleaned up
 * by the next: a forgotten logical slot keeps every byte of WAL from then on. */
#define SOURCES_SLOT "outbox_bench_sources"
#define SOURCES_PUB  "outbox_bench_sources"
/* The relay's defaults that the claim and its floor use (relay.lease, relay.max_attempts,
 * relay.poll_interval). */
#define SOURCES_LEASE_MS     60000
#define SOURCES_ATTEMPTS     10
#define SOURCES_FLOORLESS_MS 1000
/* After a read of less than a batch the next waits until this long after it (the relay's
 * gathering): under a trickle a design reads a few rows at a time, not one. */
#define SOURCES_GATHER_MS 2
/* (c) samples the ordering watermark (the lock list) and moves its position this often. */
#define SOURCES_SAMPLE_MS 10
/* (c)'s seqs stepped over by its reads, re-read until found or closed: more is a failure. */
#define SOURCES_GAPS_MAX 1024
/* The load stretch: producer connections and their total rate without --load-rate. */
#define SOURCES_PRODUCERS 4
#define SOURCES_LOAD_RATE 2000
#define SOURCES_MAX_LOAD  2000000L /* rate x seconds beyond this is refused */

struct src;

/* One design: opened on a fresh table (after its rows, for a backlog), then asked for batches
 * until every row is taken. */
struct src_design {
	const char *tag;  /* "L", "a", "b", as the issue names them */
	const char *key;  /* "l", "a", "b": in the summary's keys */
	const char *name; /* one line: what it does per batch */
	/* Whether open() starts the work: a walsender decodes as soon as it is asked to stream,
	 * so that is part of the measured stretch (and all of its backend's CPU is). */
	bool open_starts;
	/* Before any row goes in: what the design needs in the database (a position row, a
	 * publication and a slot). -1 after bench_fail(). */
	int (*setup)(struct src *s);
	/* Its session, statements prepared; s->backend set when known. -1 after bench_fail(). */
	int (*open)(struct src *s);
	/* One batch taken and settled as the relay would after the broker confirmed it: how many
	 * rows, or -1 after bench_fail(). */
	long (*take)(struct src *s);
	/* Ends what open() began; safe after a failed open(). */
	void (*close)(struct src *s);
};

/* A design's run. */
struct src {
	struct bench *b;
	const char *what;
	const struct src_design *d;
	PGconn *c; /* control: LSNs, sizes, the slot; never the design's */
	PGconn *w; /* the design's session ((L), (a)) */
	struct logical_stream *ls;
	pid_t backend; /* the design's backend: w's, or the walsender */
	long batch;
	unsigned int seq_oid, db_oid;
	long taken, reads, reads_empty, writes; /* writes: statements that wrote */
	char *buf;                              /* (L): the batch's seqs as an array literal */
	size_t buf_len;
	/* (L) */
	long token_n;
	int64_t prev_first, floor;
	int64_t floorless_us;
	/* (a) */
	int64_t pos, fence, pend_w;
	long gaps;          /* seqs stepped over: rows lost, since nothing here aborts */
	char *pend_holders; /* NULL: no pending sample */
	/* (c): read_pos, the highest seq read; gap[] the seqs below it not read yet */
	int64_t read_pos, sample_us;
	int64_t gap[SOURCES_GAPS_MAX];
	long n_gap, late; /* late: rows read below read_pos (found in a gap) */
	/* (b) */
	uint64_t acked;
	long bad_body;
};

/* What one drain or load stretch cost, per message. */
struct src_cost {
	long n;
	double secs, rate;
	double own_us; /* the design's backend alone */
	struct cpu_cost cpu;
	struct wal_cost wal;
	double vac_pg_us, vac_wal; /* the VACUUM after it */
};

/* ---- the database side shared by the designs ---- */

/* The rows' columns, as the relay's claim returns them (STORE_ROW_COLUMNS). */
#define SRC_COLUMNS                                                              \
	"o.seq, o.id, o.exchange_name, o.routing_key, o.body, o.body_encoding, " \
	"o.content_type, o.headers, o.properties, o.ordering_key, "              \
	"floor(extract(epoch FROM o.created_at))::bigint, o.attempts"

/* The relay's session settings (store/connection.c): the plans its statements are written for,
 * its own writes committing asynchronously. */
#define SRC_SESSION                                                                               \
	"SET enable_seqscan = off; SET enable_bitmapscan = off; SET enable_sort = off;"           \
	" SET jit = off; SET plan_cache_mode = force_generic_plan; SET synchronous_commit = off;" \
	" SET statement_timeout = '600s'"

static int prepare(struct src *s, const char *name, int nparams, const char *sql)
{
	PGresult *r = PQprepare(s->w, name, sql, nparams, NULL);
	int rc = 0;

	if (PQresultStatus(r) != PGRES_COMMAND_OK) {
		bench_fail(s->b, s->what, "(%s) prepare %s: %s", s->d->tag, name,
		           PQerrorMessage(s->w));
		rc = -1;
	}
	PQclear(r);
	return rc;
}

/* The design's session as the relay opens its own. */
static int open_session(struct src *s)
{
	char err[512];

	s->w = pgsql_connect(s->b->opt.pg, err, sizeof(err));
	if (!s->w) {
		bench_fail(s->b, s->what, "(%s) could not connect: %s", s->d->tag, err);
		return -1;
	}
	s->backend = (pid_t)PQbackendPID(s->w);
	return db_exec(s->b, s->w, s->what, SRC_SESSION);
}

static void close_session(struct src *s)
{
	PQfinish(s->w);
	s->w = NULL;
}

/* Runs prepared name; its result (PQclear()) or NULL after bench_fail(). */
static PGresult *run(struct src *s, const char *name, int n, const char *const *params,
                     ExecStatusType want)
{
	PGresult *r = PQexecPrepared(s->w, name, n, params, NULL, NULL, 0);

	if (PQresultStatus(r) != want) {
		bench_fail(s->b, s->what, "(%s) %s: %s", s->d->tag, name, PQerrorMessage(s->w));
		PQclear(r);
		return NULL;
	}
	return r;
}

static int64_t int_at(const PGresult *r, int row, int col)
{
	return PQgetisnull(r, row, col) ? -1 : strtoll(PQgetvalue(r, row, col), NULL, 10);
}

/* ---- (L): the lease source's claim and mark ---- */

/* (L) needs nothing but the table; nor do the producers alone. */
static int no_setup(struct src *s)
{
	(void)s;
	return 0;
}

/* The unkeyed claim and the durable mark of store/statements.c, reduced to what a backlog of
 * unkeyed rows meets: the pending index walked in seq order from the claim floor, the rows
 * locked SKIP LOCKED and leased under a token; the mark found by seq and fenced by the token.
 * (The relay sends the mark inside the next claim; here it goes on its own, in the same
 * session: the same rows written, one more round trip.) */
static int lease_open(struct src *s)
{
	char sql[2048];

	if (open_session(s) != 0)
		return -1;
	snprintf(sql, sizeof(sql),
	         "UPDATE %s o SET locked_by = $1::text, locked_until = now() + %d * interval"
	         " '1 millisecond' FROM (SELECT o.seq FROM %s o WHERE o.published_at IS NULL"
	         " AND o.ordering_key IS NULL AND o.seq >= $2::bigint AND o.attempts < %d"
	         " AND o.available_at <= now() AND (o.locked_until IS NULL OR"
	         " o.locked_until < now()) ORDER BY o.seq LIMIT $3::int FOR UPDATE SKIP LOCKED) b"
	         " WHERE o.seq = b.seq RETURNING " SRC_COLUMNS,
	         SOURCES_TABLE, SOURCES_LEASE_MS, SOURCES_TABLE, SOURCES_ATTEMPTS);
	if (prepare(s, "claim", 3, sql) != 0)
		return -1;
	snprintf(sql, sizeof(sql),
	         "WITH durable AS (SELECT set_config('synchronous_commit', 'on', true))"
	         " UPDATE %s SET published_at = now(), locked_by = NULL, locked_until = NULL"
	         " FROM durable WHERE seq = ANY($1::bigint[]) AND locked_by = $2::text"
	         " AND published_at IS NULL",
	         SOURCES_TABLE);
	if (prepare(s, "mark", 2, sql) != 0)
		return -1;
	s->buf_len = (size_t)s->batch * 21 + 3;
	s->buf = malloc(s->buf_len);
	if (!s->buf) {
		bench_fail(s->b, s->what, "(L) out of memory");
		return -1;
	}
	s->floorless_us = bench_mono_us();
	return 0;
}

static long lease_take(struct src *s)
{
	char token[64], floor_s[24], batch_s[24];
	const char *claim[3] = { token, floor_s, batch_s }, *mark[2];
	PGresult *r;
	long n;
	size_t at = 0;
	int64_t first = -1;

	snprintf(token, sizeof(token), "bench#sources.%ld", ++s->token_n);
	/* At least once a relay.poll_interval a claim starts from the oldest row (a row that
	 * committed late below the floor). */
	if (bench_mono_us() - s->floorless_us >= SOURCES_FLOORLESS_MS * 1000LL) {
		s->floor = 0;
		s->floorless_us = bench_mono_us();
	}
	snprintf(floor_s, sizeof(floor_s), "%" PRId64, s->floor);
	snprintf(batch_s, sizeof(batch_s), "%ld", s->batch);
	r = run(s, "claim", 3, claim, PGRES_TUPLES_OK);
	if (!r)
		return -1;
	n = PQntuples(r);
	s->writes++;
	if (n == 0) {
		PQclear(r);
		return 0;
	}
	s->buf[at++] = '{';
	for (long i = 0; i < n; i++) {
		int64_t seq = int_at(r, (int)i, 0);

		if (first < 0 || seq < first)
			first = seq;
		at += (size_t)snprintf(s->buf + at, s->buf_len - at, "%s%" PRId64, i ? "," : "",
		                       seq);
	}
	snprintf(s->buf + at, s->buf_len - at, "}");
	PQclear(r);
	/* The claim floor: the first seq of the previous batch or of this one, whichever is
	 * lower, so that the next claim does not step over the index entries of rows marked
	 * before (they stay until vacuum). */
	s->floor = s->prev_first > 0 && s->prev_first < first ? s->prev_first : first;
	s->prev_first = first;
	mark[0] = s->buf;
	mark[1] = token;
	r = run(s, "mark", 2, mark, PGRES_COMMAND_OK);
	if (!r)
		return -1;
	s->writes++;
	if (strtol(PQcmdTuples(r), NULL, 10) != n) {
		bench_fail(s->b, s->what, "(L) the mark hit %s of %ld rows", PQcmdTuples(r), n);
		PQclear(r);
		return -1;
	}
	PQclear(r);
	return n;
}

static void lease_close(struct src *s)
{
	close_session(s);
}

/* ---- (a): a cursor over the append-only table ---- */

static int cursor_setup(struct src *s)
{
	char sql[512];

	snprintf(sql, sizeof(sql),
	         "DROP TABLE IF EXISTS %s; CREATE TABLE %s (stream text PRIMARY KEY,"
	         " position bigint NOT NULL); INSERT INTO %s VALUES ('outbox', 0)",
	         SOURCES_CURSOR, SOURCES_CURSOR, SOURCES_CURSOR);
	return db_exec(s->b, s->c, s->what, sql);
}

/* The ordering watermark's sample as the relay's statements take it: W first, then the
 * transactions holding the seq sequence's lock, read after W (s.w and h.holders). Three %u: the
 * sequence's OID, the database's, the sequence's. */
#define SRC_SAMPLE_FROM                                                                          \
	" FROM (SELECT COALESCE(pg_sequence_last_value(%u::oid::regclass), 0) AS w OFFSET 0) s," \
	" LATERAL (SELECT string_agg(l.virtualtransaction, ',') AS holders FROM pg_locks l"      \
	" WHERE l.locktype = 'relation' AND l.database = %u AND l.relation = %u"                 \
	" AND l.pid IS DISTINCT FROM pg_backend_pid() AND s.w IS NOT NULL) h"

/* The read: rows above the position up to the fence ($2), and a sample of the ordering
 * watermark taken after the statement's snapshot (store/statements.c's: W first, then the
 * transactions holding the seq sequence's lock, read after W). The sample is for the next
 * read: once every holder it saw has ended (or it saw none), no seq up to its W can still
 * commit, and a later snapshot sees all of them. The write: the position, durable as the
 * lease source's mark (losing it would only publish rows again). */
static int cursor_open(struct src *s)
{
	char sql[2048];
	PGresult *r;

	if (open_session(s) != 0)
		return -1;
	snprintf(sql, sizeof(sql),
	         "SELECT s.w, h.holders, r.*" SRC_SAMPLE_FROM
	         " LEFT JOIN LATERAL (SELECT " SRC_COLUMNS " FROM %s o WHERE o.seq > $1::bigint"
	         " AND o.seq <= $2::bigint ORDER BY o.seq LIMIT $3::int) r ON true",
	         s->seq_oid, s->db_oid, s->seq_oid, SOURCES_TABLE);
	if (prepare(s, "read", 3, sql) != 0)
		return -1;
	snprintf(sql, sizeof(sql),
	         "WITH durable AS (SELECT set_config('synchronous_commit', 'on', true))"
	         " UPDATE %s SET position = $1::bigint FROM durable WHERE stream = 'outbox'",
	         SOURCES_CURSOR);
	if (prepare(s, "advance", 1, sql) != 0)
		return -1;
	snprintf(sql, sizeof(sql), "SELECT position FROM %s WHERE stream = 'outbox'",
	         SOURCES_CURSOR);
	r = PQexec(s->w, sql);
	if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
		bench_fail(s->b, s->what, "(a) reading the position: %s", PQerrorMessage(s->w));
		PQclear(r);
		return -1;
	}
	s->pos = int_at(r, 0, 0);
	PQclear(r);
	return 0;
}

/* Whether a transaction of list (comma-separated virtual transaction ids) is in now. */
static bool any_in(const char *list, const char *now)
{
	/* Token against token: a search for the rest of the list (every id after the first
	 * included) found a still running holder only when it came last, and the fence went
	 * past the seq it held. */
	while (*list) {
		size_t k = strcspn(list, ",");

		for (const char *p = now; k > 0 && *p;) {
			size_t m = strcspn(p, ",");

			if (m == k && strncmp(p, list, k) == 0)
				return true;
			p += m + (p[m] == ',');
		}
		list += k + (list[k] == ',');
	}
	return false;
}

/* Moves the fence with the sample (w, holders) the last read took. */
static void cursor_sample(struct src *s, int64_t w, const char *holders)
{
	if (s->pend_holders && !any_in(s->pend_holders, holders)) {
		if (s->pend_w > s->fence)
			s->fence = s->pend_w;
		free(s->pend_holders);
		s->pend_holders = NULL;
	}
	if (!holders[0]) {
		if (w > s->fence)
			s->fence = w;
		free(s->pend_holders);
		s->pend_holders = NULL;
	} else if (!s->pend_holders) {
		/* Kept until its holders have ended: a newer sample in its place would have
		 * holders of its own, and under steady load the fence would never move. */
		s->pend_holders = strdup(holders);
		s->pend_w = w;
	}
}

static long cursor_take(struct src *s)
{
	char pos_s[24], fence_s[24], batch_s[24];
	const char *read[3] = { pos_s, fence_s, batch_s }, *adv[1] = { pos_s };
	PGresult *r;
	long n;

	snprintf(pos_s, sizeof(pos_s), "%" PRId64, s->pos);
	snprintf(fence_s, sizeof(fence_s), "%" PRId64, s->fence);
	snprintf(batch_s, sizeof(batch_s), "%ld", s->batch);
	r = run(s, "read", 3, read, PGRES_TUPLES_OK);
	if (!r)
		return -1;
	if (PQntuples(r) < 1) {
		bench_fail(s->b, s->what, "(a) the read returned no sample");
		PQclear(r);
		return -1;
	}
	cursor_sample(s, int_at(r, 0, 0), PQgetvalue(r, 0, 1));
	/* One row with no seq: the sample alone. */
	n = PQgetisnull(r, 0, 2) ? 0 : PQntuples(r);
	/* The benchmark's inserts never abort, so every seq commits: one missing between two
	 * rows read (or after the position) is a row the fence let the position step over. */
	for (long i = 0; i < n; i++) {
		int64_t seq = int_at(r, (int)i, 2);

		s->gaps += seq - s->pos - 1;
		s->pos = seq;
	}
	PQclear(r);
	if (n == 0)
		return 0;
	snprintf(pos_s, sizeof(pos_s), "%" PRId64, s->pos);
	r = run(s, "advance", 1, adv, PGRES_COMMAND_OK);
	if (!r)
		return -1;
	PQclear(r);
	s->writes++;
	return n;
}

static void cursor_close(struct src *s)
{
	free(s->pend_holders);
	s->pend_holders = NULL;
	close_session(s);
}

/* ---- (c): the cursor reading unkeyed rows past the fence ---- */

/* (a)'s position and sample, apart: the read takes every row above the highest seq read so far
 * and the seqs it stepped over (gap[]: drawn by a transaction not yet committed, or never to
 * be), with no lock list; the sample (W and the lock list, as (a)'s) runs once every
 * SOURCES_SAMPLE_MS, before a read. A gap at or below the fence settled before a read began
 * and not found by it never will be: every row up to that fence is visible to the read. The
 * position follows the fence, behind what was read, one durable write a sample: a crash would
 * publish again what was read above it (duplicates, up to a sample's worth). Keyed rows would
 * still wait for the fence (their order is by seq); this backlog has none. */
static int skip_open(struct src *s)
{
	char sql[2048];

	if (cursor_open(s) != 0)
		return -1;
	snprintf(sql, sizeof(sql), "SELECT s.w, h.holders" SRC_SAMPLE_FROM, s->seq_oid, s->db_oid,
	         s->seq_oid);
	if (prepare(s, "sample", 0, sql) != 0)
		return -1;
	snprintf(sql, sizeof(sql),
	         "(SELECT " SRC_COLUMNS " FROM %s o WHERE o.seq = ANY($2::bigint[]))"
	         " UNION ALL (SELECT " SRC_COLUMNS " FROM %s o WHERE o.seq > $1::bigint"
	         " ORDER BY o.seq LIMIT $3::int)",
	         SOURCES_TABLE, SOURCES_TABLE);
	if (prepare(s, "read_past", 3, sql) != 0)
		return -1;
	s->read_pos = s->pos;
	s->n_gap = 0;
	s->sample_us = 0;
	s->buf_len = SOURCES_GAPS_MAX * 21 + 3;
	s->buf = malloc(s->buf_len);
	if (!s->buf) {
		bench_fail(s->b, s->what, "(c) out of memory");
		return -1;
	}
	return 0;
}

/* A row read: out of a gap, or above read_pos (the seqs between become gaps). -1 after
 * bench_fail(). */
static int skip_row(struct src *s, int64_t seq)
{
	if (seq <= s->read_pos) {
		for (long i = 0; i < s->n_gap; i++) {
			if (s->gap[i] == seq) {
				s->gap[i] = s->gap[--s->n_gap];
				s->late++;
				return 0;
			}
		}
		bench_fail(s->b, s->what, "(c) seq %" PRId64 " read twice", seq);
		return -1;
	}
	for (int64_t g = s->read_pos + 1; g < seq; g++) {
		if (s->n_gap == SOURCES_GAPS_MAX) {
			bench_fail(s->b, s->what, "(c) more than %d seqs stepped over",
			           SOURCES_GAPS_MAX);
			return -1;
		}
		s->gap[s->n_gap++] = g;
	}
	s->read_pos = seq;
	return 0;
}

static long skip_take(struct src *s)
{
	char pos_s[24], batch_s[24];
	const char *read[3] = { pos_s, s->buf, batch_s }, *adv[1] = { pos_s };
	bool sampled = false;
	int64_t fence, to;
	PGresult *r;
	size_t at = 0;
	long n;

	if (bench_mono_us() - s->sample_us >= SOURCES_SAMPLE_MS * 1000LL) {
		r = run(s, "sample", 0, NULL, PGRES_TUPLES_OK);
		if (!r)
			return -1;
		cursor_sample(s, int_at(r, 0, 0), PQgetvalue(r, 0, 1));
		PQclear(r);
		s->sample_us = bench_mono_us();
		sampled = true;
	}
	fence = s->fence; /* settled before the read: every row up to it is visible to it */
	s->buf[at++] = '{';
	for (long i = 0; i < s->n_gap; i++)
		at += (size_t)snprintf(s->buf + at, s->buf_len - at, "%s%" PRId64, i ? "," : "",
		                       s->gap[i]);
	snprintf(s->buf + at, s->buf_len - at, "}");
	snprintf(pos_s, sizeof(pos_s), "%" PRId64, s->read_pos);
	snprintf(batch_s, sizeof(batch_s), "%ld", s->batch);
	r = run(s, "read_past", 3, read, PGRES_TUPLES_OK);
	if (!r)
		return -1;
	n = PQntuples(r);
	for (long i = 0; i < n; i++) {
		if (skip_row(s, int_at(r, (int)i, 0)) != 0) {
			PQclear(r);
			return -1;
		}
	}
	PQclear(r);
	/* Gaps up to the fence not found now never will be: here, where no insert aborts, that
	 * is a row the fence let the position step over. */
	for (long i = 0; i < s->n_gap;) {
		if (s->gap[i] <= fence) {
			s->gaps++;
			s->gap[i] = s->gap[--s->n_gap];
		} else {
			i++;
		}
	}
	to = fence < s->read_pos ? fence : s->read_pos;
	if (sampled && to > s->pos) {
		snprintf(pos_s, sizeof(pos_s), "%" PRId64, to);
		r = run(s, "advance", 1, adv, PGRES_COMMAND_OK);
		if (!r)
			return -1;
		PQclear(r);
		s->pos = to;
		s->writes++;
	}
	return n;
}

/* ---- (b): logical decoding through a pgoutput slot ---- */

/* Drops the slot, waiting for a walsender that still holds it to go (it ends shortly after
 * its connection closed); errors are ignored when the slot is already gone. */
static void slot_drop(PGconn *c)
{
	for (int i = 0; i < 100; i++) {
		int64_t left;

		if (pgsql_int(c,
		              "SELECT count(*) FROM pg_replication_slots WHERE slot_name = "
		              "'" SOURCES_SLOT "'",
		              &left, NULL, 0) != 0 ||
		    left == 0)
			return;
		if (pgsql_exec(c, "SELECT pg_drop_replication_slot('" SOURCES_SLOT "')", NULL, 0) ==
		    0)
			return;
		bench_sleep_ms(50);
	}
}

static int decode_setup(struct src *s)
{
	slot_drop(s->c);
	if (db_exec(s->b, s->c, s->what,
	            "DROP PUBLICATION IF EXISTS " SOURCES_PUB "; CREATE PUBLICATION " SOURCES_PUB
	            " FOR TABLE " SOURCES_TABLE " WITH (publish = 'insert')") != 0)
		return -1;
	/* Made before the rows go in: a slot decodes from where it was made. */
	return db_exec(s->b, s->c, s->what,
	               "SELECT pg_create_logical_replication_slot('" SOURCES_SLOT "', 'pgoutput')");
}

static int decode_open(struct src *s)
{
	char err[512];

	s->ls = logical_start(s->b->opt.pg, SOURCES_SLOT, SOURCES_PUB, err, sizeof(err));
	if (!s->ls) {
		bench_fail(s->b, s->what, "(b) %s", err);
		return -1;
	}
	s->backend = logical_backend(s->ls);
	return 0;
}

/* Rows as they stream, up to a batch, or fewer when none came for SOURCES_GATHER_MS; then
 * the end of the last commit read is acknowledged (one status update a batch: the slot's
 * position moves, nothing is written). */
static long decode_take(struct src *s)
{
	char err[512];
	long n = 0;

	while (n < s->batch) {
		struct logical_row row;
		int rc = logical_next(s->ls, SOURCES_GATHER_MS, &row, err, sizeof(err));

		if (rc < 0) {
			bench_fail(s->b, s->what, "(b) %s", err);
			return -1;
		}
		if (rc == 0)
			break;
		if (row.body_len != BENCH_BODY_LEN)
			s->bad_body++;
		n++;
	}
	if (logical_commit_end(s->ls) > s->acked) {
		if (logical_ack(s->ls, logical_commit_end(s->ls), err, sizeof(err)) != 0) {
			bench_fail(s->b, s->what, "(b) %s", err);
			return -1;
		}
		s->acked = logical_commit_end(s->ls);
	}
	return n;
}

static void decode_close(struct src *s)
{
	logical_stop(s->ls);
	s->ls = NULL;
}

static const struct src_design designs[] = {
	{ "L", "l", "claim + mark: two writes of every row", false, no_setup, lease_open,
	  lease_take, lease_close },
	{ "a", "a", "read above the position + one position write a batch", false, cursor_setup,
	  cursor_open, cursor_take, cursor_close },
	{ "b", "b", "logical decoding (pgoutput) + one flush acknowledgement a batch", true,
	  decode_setup, decode_open, decode_take, decode_close },
	{ "c", "c",
	  "read past the fence + the seqs stepped over; a sample and one position write every "
	  "10 ms",
	  false, cursor_setup, skip_open, skip_take, cursor_close },
};

#define N_DESIGNS (sizeof(designs) / sizeof(designs[0]))

static int alone_open(struct src *s)
{
	(void)s;
	return 0;
}

static void alone_close(struct src *s)
{
	(void)s;
}

/* No design: the producers alone, the baseline of the load stretches (take NULL). */
static const struct src_design alone = {
	"-", "-", "no reader", false, no_setup, alone_open, NULL, alone_close,
};

/* ---- measuring ---- */

/* The outbox table as `outbox-relay migrate` makes it, autovacuum off so that the cleanup each
 * design leaves is measured afterwards rather than whenever autovacuum comes by; the seq
 * sequence's and the database's OIDs for the watermark. -1 after bench_fail(). */
static int fresh_table(struct src *s)
{
	int64_t v;

	if (db_table_fresh(s->b, s->c, s->what, SOURCES_TABLE) != 0 ||
	    db_exec(s->b, s->c, s->what,
	            "ALTER TABLE " SOURCES_TABLE " SET (autovacuum_enabled = false)") != 0)
		return -1;
	if (pgsql_int(s->c,
	              "SELECT pg_get_serial_sequence('" SOURCES_TABLE "', 'seq')::regclass::oid",
	              &v, NULL, 0) != 0) {
		bench_fail(s->b, s->what, "the seq sequence of %s not found", SOURCES_TABLE);
		return -1;
	}
	s->seq_oid = (unsigned int)v;
	if (pgsql_int(s->c, "SELECT oid FROM pg_database WHERE datname = current_database()", &v,
	              NULL, 0) != 0) {
		bench_fail(s->b, s->what, "the database's OID not found");
		return -1;
	}
	s->db_oid = (unsigned int)v;
	return 0;
}

/* n rows of BENCH_BODY_LEN bytes, one per transaction as producers commit them (a DO block
 * that commits after each INSERT: server-side, seconds for 200,000 rows). */
static int fill(struct src *s, long n)
{
	char sql[512];

	snprintf(sql, sizeof(sql),
	         "DO $$ BEGIN FOR g IN 1..%ld LOOP INSERT INTO %s (id, exchange_name,"
	         " routing_key, body) VALUES ('b' || g, '', '%s', repeat('x', %d)); COMMIT;"
	         " END LOOP; END $$",
	         n, SOURCES_TABLE, SOURCES_TABLE, BENCH_BODY_LEN);
	return db_exec(s->b, s->c, s->what, sql);
}

static double query_double(PGconn *c, const char *sql)
{
	char *v = NULL;
	double d = NAN;

	if (pgsql_string(c, sql, &v, NULL, 0) == 0 && v)
		d = strtod(v, NULL);
	free(v);
	return d;
}

/* What the backlog cost while no relay ran: the rows' WAL, the table's growth, and what the
 * design keeps besides (a slot: the WAL from its restart point, and its catalog xmin). */
struct src_idle {
	struct wal_cost wal; /* per row, of the inserts */
	double table_b;      /* table + indexes, per row */
	double held_b;       /* WAL the slot keeps, per row; 0 without a slot */
	double held_mb;
	double xmin_age; /* transactions behind the catalog xmin the slot holds; NAN: none */
};

/* Fills the design's fresh table with n rows while nothing reads it, and what that left into
 * *idle. -1 after bench_fail(). */
static int backlog(struct src *s, long n, struct src_idle *idle)
{
	struct wal_point a, z;
	double t0 = query_double(s->c, "SELECT pg_total_relation_size('" SOURCES_TABLE "')");

	wal_mark_stats(s->c, &a);
	wal_mark_lsn(s->c, &a);
	if (fill(s, n) != 0)
		return -1;
	wal_mark_lsn(s->c, &z);
	wal_mark_stats(s->c, &z);
	wal_cost(s->c, &a, &z, n, false, &idle->wal);
	idle->table_b =
	        (query_double(s->c, "SELECT pg_total_relation_size('" SOURCES_TABLE "')") - t0) /
	        (double)n;
	idle->held_b = 0;
	idle->held_mb = 0;
	idle->xmin_age = NAN;
	if (s->d->tag[0] == 'b') {
		idle->held_mb = query_double(
		        s->c,
		        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) / 1048576.0"
		        " FROM pg_replication_slots WHERE slot_name = '" SOURCES_SLOT "'");
		idle->held_b = idle->held_mb * 1048576.0 / (double)n;
		idle->xmin_age = query_double(
		        s->c, "SELECT age(catalog_xmin) FROM "
		              "pg_replication_slots WHERE slot_name = '" SOURCES_SLOT "'");
	}
	/* The table as autovacuum keeps a long-lived one, as db_table_fill() leaves it. */
	return db_exec(s->b, s->c, s->what, "VACUUM ANALYZE " SOURCES_TABLE);
}

/* The VACUUM that the design's writes leave, per message, into cost. */
static int vacuum_after(struct src *s, long n, struct src_cost *cost)
{
	struct cpu_sample a, z;
	struct wal_point wa, wz;

	wal_mark_lsn(s->c, &wa);
	cpu_sample(&a, 0);
	if (db_exec(s->b, s->c, s->what, "VACUUM " SOURCES_TABLE) != 0)
		return -1;
	cpu_sample(&z, 0);
	wal_mark_lsn(s->c, &wz);
	cost->vac_pg_us = a.pg_s < 0 || z.pg_s < 0 ? NAN : (z.pg_s - a.pg_s) * 1e6 / (double)n;
	cost->vac_wal = wa.lsn && wz.lsn >= wa.lsn ? (double)(wz.lsn - wa.lsn) / (double)n : NAN;
	return 0;
}

/* The producers of the load stretch: rows index, index + SOURCES_PRODUCERS, ... each at
 * t0 + row / rate, one per transaction. */
struct src_producer {
	pthread_t thread;
	const char *pg;
	int index;
	long rows;
	double rate;
	atomic_int *go; /* 0 wait, 1 run (t0_ns set), 2 stop */
	atomic_int *ready, *done;
	atomic_long *committed;
	const int64_t *t0_ns;
	int64_t last_us;
	char err[256];
};

static void *producer_main(void *arg)
{
	struct src_producer *p = arg;
	PGconn *c = pgsql_connect(p->pg, p->err, sizeof(p->err));
	char id[48], body[BENCH_BODY_LEN + 1];
	const char *params[3] = { id, SOURCES_TABLE, body };

	memset(body, 'x', BENCH_BODY_LEN);
	body[BENCH_BODY_LEN] = '\0';
	if (!c || db_prepare_insert(c, "ins", SOURCES_TABLE, p->err, sizeof(p->err)) != 0) {
		atomic_fetch_add(p->ready, 1);
		goto out;
	}
	atomic_fetch_add(p->ready, 1);
	while (atomic_load(p->go) == 0)
		bench_sleep_ms(1);
	for (long row = p->index; row < p->rows && atomic_load(p->go) == 1;
	     row += SOURCES_PRODUCERS) {
		PGresult *r;

		latency_sleep_until(*p->t0_ns + (int64_t)((double)row * 1e9 / p->rate));
		if (bench_interrupted())
			break;
		snprintf(id, sizeof(id), "p%ld", row);
		r = PQexecPrepared(c, "ins", 3, params, NULL, NULL, 0);
		if (PQresultStatus(r) != PGRES_COMMAND_OK) {
			snprintf(p->err, sizeof(p->err), "%s", PQerrorMessage(c));
			PQclear(r);
			break;
		}
		PQclear(r);
		p->last_us = bench_mono_us();
		atomic_fetch_add(p->committed, 1);
	}
out:
	atomic_fetch_add(p->done, 1);
	PQfinish(c);
	return NULL;
}

/* The load stretch's producers, running. */
struct src_load {
	struct src_producer p[SOURCES_PRODUCERS];
	int started;
	atomic_int go, ready, done;
	atomic_long committed;
	int64_t t0_ns;
};

static int load_start(struct src *s, struct src_load *l, long rows, double rate)
{
	atomic_init(&l->go, 0);
	atomic_init(&l->ready, 0);
	atomic_init(&l->done, 0);
	atomic_init(&l->committed, 0);
	l->started = 0;
	for (int i = 0; i < SOURCES_PRODUCERS; i++) {
		struct src_producer *p = &l->p[i];

		memset(p, 0, sizeof(*p));
		p->pg = s->b->opt.pg;
		p->index = i;
		p->rows = rows;
		p->rate = rate;
		p->go = &l->go;
		p->ready = &l->ready;
		p->done = &l->done;
		p->committed = &l->committed;
		p->t0_ns = &l->t0_ns;
		if (pthread_create(&p->thread, NULL, producer_main, p) != 0) {
			bench_fail(s->b, s->what, "could not start a producer thread");
			return -1;
		}
		l->started++;
	}
	while (atomic_load(&l->ready) < SOURCES_PRODUCERS)
		bench_sleep_ms(1);
	for (int i = 0; i < SOURCES_PRODUCERS; i++) {
		if (l->p[i].err[0]) {
			bench_fail(s->b, s->what, "producer: %s", l->p[i].err);
			return -1;
		}
	}
	l->t0_ns = latency_mono_ns() + 10000000; /* 10 ms from now: every thread is waiting */
	atomic_store(&l->go, 1);
	return 0;
}

/* Stops and joins the producers; -1 after bench_fail() when one of them failed. */
static int load_stop(struct src *s, struct src_load *l, int64_t *last_us)
{
	int rc = 0;

	atomic_store(&l->go, 2);
	*last_us = 0;
	for (int i = 0; i < l->started; i++) {
		pthread_join(l->p[i].thread, NULL);
		if (l->p[i].err[0] && rc == 0) {
			bench_fail(s->b, s->what, "producer: %s", l->p[i].err);
			rc = -1;
		}
		if (l->p[i].last_us > *last_us)
			*last_us = l->p[i].last_us;
	}
	l->started = 0;
	return rc;
}

/* Takes batches until want rows are taken (want < 0: until the producers of l are done and
 * every row they committed is taken), gathering after a short read; the CPU and WAL of the
 * stretch per message into cost. With l, the stretch starts with the producers. */
static int drain(struct src *s, long want, struct src_load *l, long load_rows, double rate,
                 struct src_cost *cost)
{
	struct cpu_sample ca, cz;
	struct wal_point wa, wz;
	char slot[64] = "";
	double own0 = 0, own1;
	int64_t t0, deadline, last_print, t_end;
	int rc = -1;

	memset(cost, 0, sizeof(*cost));
	/* The same state for every design: a fresh checkpoint, the stretch's WAL kept for
	 * pg_waldump. */
	if (db_exec(s->b, s->c, s->what, "CHECKPOINT") != 0)
		return -1;
	if (!s->d->open_starts && s->d->open(s) != 0)
		goto out;
	wal_hold(s->c, slot, sizeof(slot));
	wal_mark_stats(s->c, &wa);
	wal_mark_lsn(s->c, &wa);
	cpu_sample(&ca, 0);
	if (s->backend > 0)
		own0 = cpu_pids_s(&s->backend, 1);
	t0 = bench_mono_us();
	if (s->d->open_starts && s->d->open(s) != 0)
		goto out;
	if (l && load_start(s, l, load_rows, rate) != 0)
		goto out;
	deadline = t0 + (120 + (want > 0 ? want : load_rows) / 500) * 1000000LL;
	last_print = t0;
	for (;;) {
		int64_t start = bench_mono_us();
		long got;

		if (want >= 0 && s->taken >= want)
			break;
		if (want < 0 && atomic_load(&l->done) == SOURCES_PRODUCERS &&
		    s->taken >= atomic_load(&l->committed))
			break;
		if (bench_interrupted()) {
			bench_fail(s->b, s->what, "(%s) interrupted", s->d->tag);
			goto out;
		}
		if (start > deadline) {
			bench_fail(s->b, s->what, "(%s) timed out: %ld rows taken", s->d->tag,
			           s->taken);
			goto out;
		}
		if (!s->d->take) {
			/* The producers alone: the stretch ends with them. */
			if (atomic_load(&l->done) == SOURCES_PRODUCERS)
				s->taken = atomic_load(&l->committed);
			bench_sleep_ms(5);
			continue;
		}
		got = s->d->take(s);
		if (got < 0)
			goto out;
		if (s->gaps > 0) {
			bench_fail(s->b, s->what,
			           "(%s) the position stepped over %ld rows: the fence let it pass "
			           "rows not yet committed",
			           s->d->tag, s->gaps);
			goto out;
		}
		s->taken += got;
		s->reads++;
		if (got == 0)
			s->reads_empty++;
		if (got < s->batch)
			latency_sleep_until((start + SOURCES_GATHER_MS * 1000LL) * 1000);
		if (start - last_print > 10000000) {
			fprintf(stderr, "%s: (%s) %ld rows taken after %.0f s\n", s->what,
			        s->d->tag, s->taken, (double)(start - t0) / 1e6);
			last_print = start;
		}
	}
	t_end = bench_mono_us();
	own1 = s->backend > 0 ? cpu_pids_s(&s->backend, 1) : NAN;
	cpu_sample(&cz, 0);
	wal_mark_lsn(s->c, &wz);
	if (l) {
		int64_t last_us;

		if (load_stop(s, l, &last_us) != 0)
			goto out;
		/* From the last commit until every row was taken: whether the design kept up. */
		cost->secs = (double)(t_end - last_us) / 1e6;
	} else {
		cost->secs = (double)(t_end - t0) / 1e6;
	}
	cost->n = s->taken;
	cost->rate = (double)s->taken / ((double)(t_end - t0) / 1e6);
	cost->own_us = (own1 - own0) * 1e6 / (double)s->taken;
	cpu_cost(&ca, &cz, s->taken, &cost->cpu);
	s->d->close(s);
	/* A backend reports its WAL counts when it ends. */
	bench_sleep_ms(200);
	wal_mark_stats(s->c, &wz);
	wal_cost(s->c, &wa, &wz, s->taken, true, &cost->wal);
	rc = 0;
out:
	if (l && l->started) {
		int64_t ignored;

		atomic_store(&l->go, 2);
		if (load_stop(s, l, &ignored) != 0)
			rc = -1;
	}
	s->d->close(s);
	wal_release(s->c, slot);
	return rc;
}

/* A stretch's cost; with base (the producers alone under the same load), what the design
 * added to it. */
static void print_cost(const struct src *s, const struct src_cost *c, const char *unit,
                       const struct src_cost *base)
{
	char what[32], note[160];
	double rest = c->cpu.pg_us - c->own_us;

	/* The two are read at slightly different moments: a rest that rounds to nothing is
	 * printed as 0.0, not -0.0. */
	if (fabs(rest) < 0.05)
		rest = 0.0;
	snprintf(what, sizeof(what), "%s: (%s)", s->what, s->d->tag);
	printf("%s: cpu per %s: postgres %.1f us (the design's backend %.1f us, the rest %.1f us),"
	       " outbox-bench %.1f us; machine busy %.0f %%",
	       what, unit, c->cpu.pg_us, c->own_us, rest, c->cpu.self_us, c->cpu.busy_pct);
	cpu_print_each(&c->cpu);
	printf(", %.0f %% outside these processes (steal %.0f %%)\n", c->cpu.other_pct,
	       c->cpu.steal_pct);
	if (c->cpu.other_pct > CPU_NOISY_PCT)
		printf("%s: noisy: %.0f %% of the machine went outside these processes, so this "
		       "stretch's figures are not comparable with another run's\n",
		       what, c->cpu.other_pct);
	snprintf(note, sizeof(note), "%ld reads, %ld of them empty; %ld writing statements",
	         s->reads, s->reads_empty, s->writes);
	wal_print(what, unit, note, &c->wal);
	/* A design that writes once a batch rounds to 0 B per message above. */
	if (!base)
		printf("%s: wal in all: %.0f B over %ld messages, %.0f B per writing statement\n",
		       what, c->wal.bytes * (double)c->n, c->n,
		       s->writes > 0 ? c->wal.bytes * (double)c->n / (double)s->writes : 0.0);
	else
		printf("%s: beyond the producers alone, per message: postgres %+.1f us, wal %+.1f "
		       "B "
		       "(%.0f B in all over the stretch)\n",
		       what, c->cpu.pg_us - base->cpu.pg_us, c->wal.bytes - base->wal.bytes,
		       (c->wal.bytes - base->wal.bytes) * (double)c->n);
	printf("%s: the VACUUM after it, per %s: postgres %.1f us, wal %.0f B\n", what, unit,
	       c->vac_pg_us, c->vac_wal);
}

static void print_idle(const struct src *s, long n, const struct src_idle *i)
{
	printf("%s: (%s): while no relay ran, %ld rows went in (one per transaction): their wal "
	       "%.0f B per row, table and indexes +%.0f B per row; ",
	       s->what, s->d->tag, n, i->wal.bytes, i->table_b);
	/* The slot's figure is every byte of WAL the server wrote since it stopped, the
	 * outbox's or not: here only the inserts ran. */
	if (s->d->tag[0] == 'b')
		printf("the slot holds %.1f MB of wal (%.0f B per row: all the server wrote "
		       "meanwhile), its catalog_xmin %.0f transactions old\n",
		       i->held_mb, i->held_b, i->xmin_age);
	else
		printf("nothing else is held (%s)\n",
		       s->d->tag[0] == 'a' ? "the position stays where it was" : "the rows wait");
}

/* The summary key src_<design><suffix>. */
static void set_figure(struct bench *b, const struct src_design *d, const char *suffix, double v)
{
	char key[32];

	snprintf(key, sizeof(key), "src_%s%s", d->key, suffix);
	bench_set(b, key, v);
}

/* Whether (b) can run on this server; why not into why. */
static bool decoding_possible(PGconn *c, char *why, size_t len)
{
	char level[32] = "?", slots[32] = "0", senders[32] = "0";

	db_show(c, "SHOW wal_level", level, sizeof(level));
	db_show(c, "SHOW max_replication_slots", slots, sizeof(slots));
	db_show(c, "SHOW max_wal_senders", senders, sizeof(senders));
	if (strcmp(level, "logical") != 0) {
		snprintf(why, len,
		         "wal_level is %s, logical decoding needs logical (bench/run --wal-level "
		         "logical)",
		         level);
		return false;
	}
	if (strtol(slots, NULL, 10) < 2 || strtol(senders, NULL, 10) < 1) {
		snprintf(why, len, "max_replication_slots %s, max_wal_senders %s", slots, senders);
		return false;
	}
	return true;
}

/* A design over the backlog: the fill, what it left while no relay ran, the drain, the
 * VACUUM. 0 with *cost and *idle, or -1 after bench_fail(). */
static int one_backlog(struct bench *b, PGconn *c, const struct src_design *d, long n,
                       struct src_cost *cost, struct src_idle *idle)
{
	struct src s = { 0 };
	int rc = -1;

	s.b = b;
	s.what = "sources";
	s.d = d;
	s.c = c;
	s.batch = bench_batch(b);
	if (fresh_table(&s) != 0 || d->setup(&s) != 0 || backlog(&s, n, idle) != 0)
		goto out;
	print_idle(&s, n, idle);
	if (drain(&s, n, NULL, 0, 0, cost) != 0)
		goto out;
	if (s.bad_body) {
		bench_fail(b, s.what, "(%s) %ld rows came with a body not of %d B", d->tag,
		           s.bad_body, BENCH_BODY_LEN);
		goto out;
	}
	if (vacuum_after(&s, n, cost) != 0)
		goto out;
	printf("%s: (%s): %s: %ld rows in batches of %ld: %.2f s, %.0f rows/s\n", s.what, d->tag,
	       d->name, n, s.batch, cost->secs, cost->rate);
	print_cost(&s, cost, "message", NULL);
	if (d->tag[0] == 'b') {
		double held = query_double(
		        c, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) / 1024.0"
		           " FROM pg_replication_slots WHERE slot_name = '" SOURCES_SLOT "'");

		printf("%s: (b): after the drain, every row acknowledged: the slot still holds "
		       "%.0f kB of wal (its restart point moves at the next running-transactions "
		       "record)\n",
		       s.what, held);
	}
	rc = 0;
out:
	if (d->setup == decode_setup)
		slot_drop(c);
	free(s.buf);
	return rc;
}

/* A design while producers insert at rate for the phase (or, with d = &alone, the producers
 * alone: into *out): what it costs per message, the producers' inserts included, and beyond
 * base (NULL: not known). 0, or -1 after bench_fail(). */
static int one_load(struct bench *b, PGconn *c, const struct src_design *d, double rate,
                    const struct src_cost *base, struct src_cost *out)
{
	struct src s = { 0 };
	struct src_load *l = calloc(1, sizeof(*l));
	struct src_cost cost;
	char unit[96];
	long rows = (long)llround(rate * b->opt.phase_s);
	int rc = -1;

	if (!l) {
		bench_fail(b, "sources", "out of memory");
		return -1;
	}
	s.b = b;
	s.what = "sources";
	s.d = d;
	s.c = c;
	s.batch = bench_batch(b);
	if (fresh_table(&s) != 0 || d->setup(&s) != 0)
		goto out;
	if (drain(&s, -1, l, rows, rate, &cost) != 0)
		goto out;
	if (vacuum_after(&s, cost.n, &cost) != 0)
		goto out;
	if (out)
		*out = cost;
	if (d == &alone) {
		printf("%s: under load, the producers alone (%.0f commits/s from %d connections "
		       "for "
		       "%d s, one row each, no reader): %ld rows; per row: postgres %.1f us, wal "
		       "%.0f B, outbox-bench %.1f us; machine busy %.0f %%",
		       s.what, rate, SOURCES_PRODUCERS, b->opt.phase_s, cost.n, cost.cpu.pg_us,
		       cost.wal.bytes, cost.cpu.self_us, cost.cpu.busy_pct);
		cpu_print_each(&cost.cpu);
		printf(", %.0f %% outside these processes (steal %.0f %%)\n", cost.cpu.other_pct,
		       cost.cpu.steal_pct);
		rc = 0;
		goto out;
	}
	if (d->open == cursor_open)
		snprintf(unit, sizeof(unit), " (no seq stepped over: every row read in seq order)");
	else if (d->open == skip_open)
		snprintf(unit, sizeof(unit),
		         " (no seq stepped over; %ld rows read after a later seq, from a gap)",
		         s.late);
	else
		unit[0] = '\0';
	printf("%s: (%s): under load, %.0f commits/s from %d connections for %d s: %ld rows, "
	       "%.1f rows a read that found any, all taken %.3f s after the last commit%s\n",
	       s.what, d->tag, rate, SOURCES_PRODUCERS, b->opt.phase_s, cost.n,
	       s.reads > s.reads_empty ? (double)cost.n / (double)(s.reads - s.reads_empty) : 0,
	       cost.secs, unit);
	snprintf(unit, sizeof(unit), "message (the producers' inserts included)");
	print_cost(&s, &cost, unit, base);
	rc = 0;
out:
	if (d->setup == decode_setup)
		slot_drop(c);
	free(s.buf);
	free(l);
	return rc;
}

static void ratio(const char *name, const double *v, bool ran[N_DESIGNS])
{
	printf("%s", name);
	for (size_t i = 1; i < N_DESIGNS; i++) {
		if (ran[i] && v[0] > 0 && v[i] == 0)
			printf(" (%s) x0", designs[i].tag);
		else if (ran[i] && v[0] > 0 && v[i] < 0)
			/* Below a baseline measured apart: nothing, within the noise. */
			printf(" (%s) <=0", designs[i].tag);
		else if (ran[i] && v[0] > 0 && v[i] / v[0] >= 0.01)
			printf(" (%s) x%.2f", designs[i].tag, v[i] / v[0]);
		else if (ran[i] && v[0] > 0)
			printf(" (%s) x%.1e", designs[i].tag, v[i] / v[0]);
		else
			printf(" (%s) -", designs[i].tag);
	}
}

void measure_sources(struct bench *b)
{
	const char *what = "sources";
	long n = b->opt.rows ? b->opt.rows : b->opt.quick ? SOURCES_ROWS_QUICK : SOURCES_ROWS;
	double rate = b->opt.load_rate > 0 ? (double)b->opt.load_rate : SOURCES_LOAD_RATE;
	PGconn *c = db_open(b, what);
	struct src_cost cost[N_DESIGNS], load[N_DESIGNS], base;
	struct src_idle idle[N_DESIGNS];
	bool ran[N_DESIGNS] = { false }, ran_load[N_DESIGNS];
	double pg_add[N_DESIGNS], wal_add[N_DESIGNS];
	double rate_v[N_DESIGNS], pg[N_DESIGNS], pg_vac[N_DESIGNS], wal[N_DESIGNS];
	double wal_vac[N_DESIGNS];
	char why[160] = "", level[32] = "?";
	bool decoding;

	if (!c)
		return;
	db_show(c, "SHOW wal_level", level, sizeof(level));
	decoding = decoding_possible(c, why, sizeof(why));
	printf("%s: the database side of four row sources, one libpq client, no broker; "
	       "wal_level %s; %ld rows of %d B committed one per transaction; batches of %ld\n",
	       what, level, n, BENCH_BODY_LEN, bench_batch(b));
	if (rate * b->opt.phase_s > SOURCES_MAX_LOAD) {
		bench_fail(b, what, "--load-rate x --seconds is above %ld rows", SOURCES_MAX_LOAD);
		goto out;
	}
	for (size_t i = 0; i < N_DESIGNS; i++) {
		if (designs[i].tag[0] == 'b' && !decoding) {
			printf("%s: (b): skipped: %s\n", what, why);
			continue;
		}
		/* A design that failed says so; the others still run. */
		if (one_backlog(b, c, &designs[i], n, &cost[i], &idle[i]) != 0)
			continue;
		ran[i] = true;
		rate_v[i] = cost[i].rate;
		pg[i] = cost[i].cpu.pg_us;
		pg_vac[i] = cost[i].cpu.pg_us + cost[i].vac_pg_us;
		wal[i] = cost[i].wal.bytes;
		wal_vac[i] = cost[i].wal.bytes + cost[i].vac_wal;
		set_figure(b, &designs[i], "", cost[i].rate);
		set_figure(b, &designs[i], "_pg_us", cost[i].cpu.pg_us);
		set_figure(b, &designs[i], "_wal", cost[i].wal.bytes);
		if (designs[i].tag[0] == 'b')
			bench_set(b, "src_b_held", idle[i].held_b);
	}
	if (ran[0]) {
		printf("%s: against (L) in this run:", what);
		ratio(" rows/s", rate_v, ran);
		ratio("; postgres cpu per message", pg, ran);
		ratio(", with the VACUUM after", pg_vac, ran);
		ratio("; wal per message", wal, ran);
		ratio(", with the VACUUM after", wal_vac, ran);
		printf("\n");
	}
	/* Under load: the producers alone, then each design; what each adds to them. */
	if (one_load(b, c, &alone, rate, NULL, &base) != 0)
		goto out;
	for (size_t i = 0; i < N_DESIGNS; i++) {
		ran_load[i] = false;
		if (designs[i].tag[0] == 'b' && !decoding)
			continue;
		if (one_load(b, c, &designs[i], rate, &base, &load[i]) != 0)
			continue;
		ran_load[i] = true;
		pg_add[i] = load[i].cpu.pg_us - base.cpu.pg_us;
		wal_add[i] = load[i].wal.bytes - base.wal.bytes;
	}
	if (ran_load[0]) {
		printf("%s: under load, beyond the producers alone, against (L):", what);
		ratio(" postgres cpu per message", pg_add, ran_load);
		ratio("; wal per message", wal_add, ran_load);
		printf("\n");
	}
out:
	if (decoding)
		slot_drop(c);
	/* Nothing to do on an error: the run is over, and the next drops them first. */
	if (pgsql_exec(c,
	               "DROP PUBLICATION IF EXISTS " SOURCES_PUB
	               "; DROP TABLE IF EXISTS " SOURCES_CURSOR,
	               NULL, 0) != 0)
		fprintf(stderr, "%s: could not drop the publication or the position table\n", what);
	db_table_drop(c, SOURCES_TABLE);
	PQfinish(c);
}
