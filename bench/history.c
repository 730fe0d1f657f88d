/* history: a table with a long history, plain against partitioned (docs/operations.md,
 * "Partitioning"). Each table gets the same rows: --rows of them (10 million by default, 1
 * million with --quick) of 200-byte bodies, created over an hour that ended an hour ago, all
 * published at their creation but the newest 1 %, which are pending. Then, per table, with the
 * lease source:
 *  - the drain of the pending rows (what a claim costs beside a long history): msgs/s and
 *    PostgreSQL CPU per message;
 *  - retention: `outbox-relay purge --older-than 30m`, which deletes the published rows in
 *    batches on a plain table and drops whole partitions on a partitioned one: its time, its
 *    WAL, and the table's size (indexes and partitions included) before and after.
 * Then the steady load: STEADY_RATE rows/s for 36 phases (--seconds: 10 by default, so 6
 * minutes; --seconds 100 makes it the hour), the relay publishing them with relay.retention a
 * fifth of that and purging every thirtieth: the table's size at each tenth of the way, and the
 * WAL per row of everything together (the producer's inserts, the marks, the purge).
 * A partitioned table gets ten partitions of history (`migrate --partitioned --partition-rows`
 * a tenth of the rows). --history plain|partitioned measures one kind alone: two runs, each
 * on servers of its own (bench/run starts them), can then measure both at once. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/db.h"
#include "bench/drain.h"
#include "bench/mq.h"
#include "bench/proc.h"
#include "bench/wal.h"

#define HISTORY_ROWS_DFLT  10000000L
#define HISTORY_ROWS_QUICK 1000000L
#define HISTORY_CHUNK      1000000L /* rows a fill statement (and transaction) */
#define HISTORY_BODY_LEN   200

struct history_cost {
	double fill_s, size_mb;
	double rate, pg_us;
	double purge_s, purge_wal_mb, after_mb;
	long long partitions, partitions_after;
};

static double table_mb(PGconn *c, const char *table)
{
	char sql[256];
	long long bytes;

	/* pg_partition_tree() has no rows for a plain table. */
	snprintf(sql, sizeof(sql),
	         "SELECT COALESCE((SELECT sum(pg_total_relation_size(relid))::bigint"
	         " FROM pg_partition_tree('%s')), pg_total_relation_size('%s'))",
	         table, table);
	bytes = db_count(c, sql);
	return bytes < 0 ? NAN : (double)bytes / (1024.0 * 1024.0);
}

static long long partitions(PGconn *c, const char *table)
{
	char sql[256];

	snprintf(sql, sizeof(sql),
	         "SELECT count(*) FROM pg_partition_tree('%s') WHERE isleaf AND level > 0", table);
	return db_count(c, sql);
}

/* The table as `migrate` makes it, plain or partitioned. */
static int make_table(struct bench *b, PGconn *c, const char *what, const char *table,
                      bool partitioned, long part_rows)
{
	char rows[32];
	const char *const plain[] = { "migrate", NULL };
	const char *const parted[] = { "migrate", "--partitioned", "--partition-rows", rows, NULL };

	snprintf(rows, sizeof(rows), "%ld", part_rows);
	db_table_drop(c, table);
	return proc_command(b, what, table, partitioned ? parted : plain, 120000);
}

/* n rows, created over the hour that ended an hour ago and published as they were created,
 * but the newest `pending`: in chunks of HISTORY_CHUNK rows, a transaction each. A partitioned
 * table (part_rows > 0) gets its partitions ahead after each chunk, as the relay's maintenance
 * loop would (none runs while the history is written); a chunk is then at most a partition, so
 * that every row finds one (two lie ahead). */
static int fill(struct bench *b, PGconn *c, const char *what, const char *table, long n,
                long pending, long part_rows)
{
	long chunk = part_rows > 0 && part_rows < HISTORY_CHUNK ? part_rows : HISTORY_CHUNK;
	char sql[1024];

	for (long from = 1; from <= n; from += chunk) {
		long to = from + chunk - 1 < n ? from + chunk - 1 : n;

		snprintf(sql, sizeof(sql),
		         "INSERT INTO %s (id, exchange_name, routing_key, body, created_at,"
		         " published_at) SELECT 'h' || g, '', '%s', repeat('x', %d), s.ts,"
		         " CASE WHEN g <= %ld THEN s.ts END FROM generate_series(%ld, %ld) g"
		         " CROSS JOIN LATERAL (SELECT now() - interval '2 hours'"
		         " + (g::float8 / %ld) * interval '1 hour') AS s(ts)",
		         table, table, HISTORY_BODY_LEN, n - pending, from, to, n);
		if (db_exec(b, c, what, sql) != 0)
			return -1;
		snprintf(sql, sizeof(sql), "SELECT %s_part_ahead()", table);
		if (part_rows > 0 && db_exec(b, c, what, sql) != 0)
			return -1;
		if (bench_interrupted()) {
			bench_fail(b, what, "interrupted");
			return -1;
		}
	}
	snprintf(sql, sizeof(sql), "VACUUM ANALYZE %s", table);
	return db_exec(b, c, what, sql);
}

/* Retention over the history: every row published over 30 minutes ago goes. */
static int purge(struct bench *b, PGconn *c, const char *what, const char *table,
                 struct history_cost *h)
{
	const char *const args[] = { "purge", "--older-than", "30m", NULL };
	struct wal_point a, z;
	int64_t t0;

	wal_mark_lsn(c, &a);
	t0 = bench_mono_us();
	if (proc_command(b, what, table, args, 3600000) != 0)
		return -1;
	h->purge_s = (double)(bench_mono_us() - t0) / 1e6;
	wal_mark_lsn(c, &z);
	h->purge_wal_mb = a.lsn && z.lsn ? (double)(z.lsn - a.lsn) / (1024.0 * 1024.0) : NAN;
	h->after_mb = table_mb(c, table);
	h->partitions_after = partitions(c, table);
	return 0;
}

static int one_table(struct bench *b, bool partitioned, long n, struct history_cost *h)
{
	const char *table = partitioned ? "bench_history_part" : "bench_history_plain";
	long pending = n / 100, part_rows = n / 10 < 100 ? 100 : n / 10;
	char what[64];
	struct drain d;
	PGconn *c;
	int64_t t0;
	int rc = -1;

	memset(h, 0, sizeof(*h));
	snprintf(what, sizeof(what), "history/%s", partitioned ? "partitioned" : "plain");
	c = db_open(b, what);
	if (!c)
		return -1;
	if (make_table(b, c, what, table, partitioned, part_rows) != 0)
		goto out;
	t0 = bench_mono_us();
	if (fill(b, c, what, table, n, pending, partitioned ? part_rows : 0) != 0)
		goto out;
	h->fill_s = (double)(bench_mono_us() - t0) / 1e6;
	h->size_mb = table_mb(c, table);
	h->partitions = partitions(c, table);
	printf("%s: %ld rows (%ld pending) in %.0f s, %.0f MB, %lld partitions\n", what, n, pending,
	       h->fill_s, h->size_mb, h->partitions);
	if (drain_existing(b, what, table, pending, &d) != 0)
		goto out;
	h->rate = d.rate;
	h->pg_us = d.cpu.pg_us;
	printf("%s: drain of the pending rows: %.0f msgs/s, PostgreSQL %.1f us/msg\n", what,
	       h->rate, h->pg_us);
	if (purge(b, c, what, table, h) != 0)
		goto out;
	printf("%s: retention (purge --older-than 30m): %.1f s, WAL %.1f MB; size %.0f -> %.0f MB,"
	       " partitions %lld -> %lld\n",
	       what, h->purge_s, h->purge_wal_mb, h->size_mb, h->after_mb, h->partitions,
	       h->partitions_after);
	rc = 0;
out:
	db_table_drop(c, table);
	PQfinish(c);
	return rc;
}

#define STEADY_RATE 2000 /* rows/s, in ten statements a second */

struct steady {
	double mb[11]; /* the table's size at 0 %, 10 %, ... 100 % of the phase */
	double max_mb;
	double wal_per_row; /* bytes */
	long rows;
};

static void ignore_delivery(const struct consumer_delivery *d, void *arg)
{
	(void)d;
	(void)arg;
}

/* One tick of the steady load: rows first+1 .. first+n in one statement (and commit). */
static int steady_insert(struct bench *b, PGconn *c, const char *what, const char *table,
                         long first, long n)
{
	char sql[512];

	snprintf(sql, sizeof(sql),
	         "INSERT INTO %s (id, exchange_name, routing_key, body) SELECT 's' || g, '',"
	         " '%s', repeat('x', %d) FROM generate_series(%ld, %ld) g",
	         table, table, HISTORY_BODY_LEN, first + 1, first + n);
	return db_exec(b, c, what, sql);
}

static int steady_run(struct bench *b, const char *what, PGconn *c, const char *table, long secs,
                      struct steady *st)
{
	struct proc_relay rp = { 0 };
	struct wal_point a, z;
	int64_t next = bench_mono_us();
	int rc = -1;

	if (proc_relay_start(b, &rp, what, table) != 0)
		return -1;
	wal_mark_lsn(c, &a);
	for (long tick = 0; tick <= secs * 10; tick++) {
		if (tick % secs == 0) {
			st->mb[tick / secs] = table_mb(c, table);
			if (st->mb[tick / secs] > st->max_mb)
				st->max_mb = st->mb[tick / secs];
		}
		if (tick == secs * 10)
			break;
		if (steady_insert(b, c, what, table, st->rows, STEADY_RATE / 10) != 0)
			goto out;
		st->rows += STEADY_RATE / 10;
		if (!proc_relay_alive(b, &rp, what))
			goto out;
		if (bench_interrupted()) {
			bench_fail(b, what, "interrupted");
			goto out;
		}
		next += 100000;
		if (next > bench_mono_us())
			bench_sleep_ms((long)((next - bench_mono_us()) / 1000));
	}
	wal_mark_lsn(c, &z);
	st->wal_per_row = a.lsn && z.lsn ? (double)(z.lsn - a.lsn) / (double)st->rows : NAN;
	rc = 0;
out:
	proc_relay_stop(b, &rp, what);
	return rc;
}

static int steady(struct bench *b, bool partitioned, struct steady *st)
{
	const char *table = partitioned ? "bench_steady_part" : "bench_steady_plain";
	long secs = (long)b->opt.phase_s * 36;
	long part_rows = STEADY_RATE * secs / 15;
	const char *was_ret = b->opt.retention, *was_pi = b->opt.purge_interval;
	char what[64], ret[32], pint[32];
	struct consumer *k = NULL;
	PGconn *c;
	int rc = -1;

	memset(st, 0, sizeof(*st));
	snprintf(what, sizeof(what), "history/steady/%s", partitioned ? "partitioned" : "plain");
	c = db_open(b, what);
	if (!c)
		return -1;
	snprintf(ret, sizeof(ret), "%lds", secs / 5);
	snprintf(pint, sizeof(pint), "%lds", secs / 30 < 1 ? 1 : secs / 30);
	if (make_table(b, c, what, table, partitioned, part_rows < 100 ? 100 : part_rows) != 0 ||
	    mq_fresh_queue(b, what, table) != 0 ||
	    mq_consume(b, what, table, ignore_delivery, NULL, &k) != 0)
		goto out;
	b->opt.retention = ret;
	b->opt.purge_interval = pint;
	rc = steady_run(b, what, c, table, secs, st);
	b->opt.retention = was_ret;
	b->opt.purge_interval = was_pi;
	if (rc != 0)
		goto out;
	printf("%s: %ld rows at %d/s over %ld s, relay.retention %s, purge every %s: size MB", what,
	       st->rows, STEADY_RATE, secs, ret, pint);
	for (int i = 0; i <= 10; i++)
		printf(" %.0f", st->mb[i]);
	printf("; max %.0f MB, WAL %.0f B/row\n", st->max_mb, st->wal_per_row);
out:
	consumer_stop(k);
	db_table_drop(c, table);
	PQfinish(c);
	return rc;
}

void measure_history(struct bench *b)
{
	long n = b->opt.rows > 0 ? b->opt.rows
	         : b->opt.quick  ? HISTORY_ROWS_QUICK
	                         : HISTORY_ROWS_DFLT;
	enum bench_source was = b->source;
	struct history_cost plain, part;
	struct steady splain, spart;

	/* The lease source: its claim walks the pending index, its mark writes published_at,
	 * which is what retention reads. */
	b->source = BENCH_LEASE;
	if (b->opt.history_tables != 3u) {
		/* One kind alone (--history): its lines, no ratios. */
		bool parted = b->opt.history_tables == 2u;

		if (one_table(b, parted, n, parted ? &part : &plain) == 0)
			(void)steady(b, parted, parted ? &spart : &splain);
		goto out;
	}
	if (one_table(b, false, n, &plain) != 0 || one_table(b, true, n, &part) != 0)
		goto out;
	bench_set(b, "history_plain_rate", plain.rate);
	bench_set(b, "history_part_rate", part.rate);
	bench_set(b, "history_plain_pg_us", plain.pg_us);
	bench_set(b, "history_part_pg_us", part.pg_us);
	bench_set(b, "history_plain_purge_s", plain.purge_s);
	bench_set(b, "history_part_purge_s", part.purge_s);
	bench_set(b, "history_plain_after_mb", plain.after_mb);
	bench_set(b, "history_part_after_mb", part.after_mb);
	printf("history: partitioned/plain: drain %.2f, PostgreSQL per message %.2f, retention time"
	       " %.3f, retention WAL %.3f, size after retention %.2f\n",
	       part.rate / plain.rate, part.pg_us / plain.pg_us, part.purge_s / plain.purge_s,
	       part.purge_wal_mb / plain.purge_wal_mb, part.after_mb / plain.after_mb);
	if (steady(b, false, &splain) != 0 || steady(b, true, &spart) != 0)
		goto out;
	bench_set(b, "history_plain_steady_mb", splain.max_mb);
	bench_set(b, "history_part_steady_mb", spart.max_mb);
	printf("history: steady load, partitioned/plain: largest size %.2f, WAL per row %.2f\n",
	       spart.max_mb / splain.max_mb, spart.wal_per_row / splain.wal_per_row);
out:
	b->source = was;
}
