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
 * A partitioned table gets ten partitions of history (`migrate --partitioned --partition-rows`
 * a tenth of the rows). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/db.h"
#include "bench/drain.h"
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

void measure_history(struct bench *b)
{
	long n = b->opt.rows > 0 ? b->opt.rows
	         : b->opt.quick  ? HISTORY_ROWS_QUICK
	                         : HISTORY_ROWS_DFLT;
	enum bench_source was = b->source;
	struct history_cost plain, part;

	/* The lease source: its claim walks the pending index, its mark writes published_at,
	 * which is what retention reads. */
	b->source = BENCH_LEASE;
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
out:
	b->source = was;
}
