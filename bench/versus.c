/* The two row sources side by side (issue 37's goals), from the figures the measurements run
 * once per source left: not a run of its own, it reports after all of them. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>

#include "bench/bench.h"

static double lease(const struct bench *b, const char *key)
{
	return bench_get_source(b, BENCH_LEASE, key);
}

static double cursor(const struct bench *b, const char *key)
{
	return bench_get_source(b, BENCH_CURSOR, key);
}

/* With --rounds: the median over the rounds that measured both sources of the cursor's figure
 * key over the lease's, each round's pair measured minutes apart on the same machine; NAN
 * without rounds or pairs. */
static double paired(const struct bench *b, const char *key)
{
	double q[BENCH_ROUNDS_MAX];
	int n = 0;

	for (int r = 0; b->opt.rounds > 1 && r < b->opt.rounds; r++) {
		double l = bench_get_round(b, BENCH_LEASE, key, r);
		double c = bench_get_round(b, BENCH_CURSOR, key, r);

		if (!isnan(l) && !isnan(c) && l > 0)
			q[n++] = c / l;
	}
	return n > 0 ? bench_median(q, n) : NAN;
}

static const char *verdict(bool met)
{
	return met ? "met" : "MISSED";
}

/* The relay's own writes: the drain's WAL is all the relay's (the rows were inserted before
 * it began), so its records per message are what the relay wrote per row, and times the
 * batch what it wrote per batch. */
static void print_writes(const struct bench *b, enum bench_source s)
{
	double rec = bench_get_source(b, s, "wal_records");
	double bytes = bench_get_source(b, s, "wal_bytes");

	if (isnan(rec))
		return;
	printf("versus: %s: the relay's own WAL in the drain: %.3f records and %.2f B per "
	       "message, %.1f records and %.0f B per batch of %ld\n",
	       bench_source_name(s), rec, bytes, rec * (double)bench_batch(b),
	       bytes * (double)bench_batch(b), bench_batch(b));
}

static void print_latency(const struct bench *b)
{
	double cp50 = cursor(b, "p50_ms"), cp99 = cursor(b, "p99_ms");
	double clp99 = cursor(b, "load_p99_ms");

	if (!isnan(cp50)) {
		printf("versus: cursor idle latency p50 %.2f ms (target <= 1 ms: %s), p99 %.2f ms "
		       "(target <= 5 ms: %s)",
		       cp50, verdict(cp50 <= 1.0), cp99, verdict(cp99 <= 5.0));
		if (!isnan(lease(b, "p50_ms")))
			printf("; lease p50 %.2f ms, p99 %.2f ms", lease(b, "p50_ms"),
			       lease(b, "p99_ms"));
		printf("\n");
	}
	if (!isnan(clp99)) {
		printf("versus: under load at half each source's maximum: cursor %.0f/s, p99 %.2f "
		       "ms (target <= 10 ms: %s), PostgreSQL CPU per message, the producers' "
		       "inserts included, %.1f us",
		       cursor(b, "load_rate"), clp99, verdict(clp99 <= 10.0),
		       cursor(b, "load_pg_us"));
		if (!isnan(lease(b, "load_p99_ms")))
			printf("; lease %.0f/s, p99 %.2f ms, %.1f us", lease(b, "load_rate"),
			       lease(b, "load_p99_ms"), lease(b, "load_pg_us"));
		printf("\n");
	}
}

void report_versus(struct bench *b)
{
	double lr = lease(b, "relay"), cr = cursor(b, "relay");
	double lpg = lease(b, "pg_us"), cpg = cursor(b, "pg_us");
	double climit = cursor(b, "ratio"), target = bench_ratio_target(b);

	if (isnan(cr))
		return;
	if (!isnan(climit)) {
		printf("versus: cursor throughput / broker limit %.2f (topology %s, target >= "
		       "%.2f: %s)",
		       climit, bench_topology_name(b->opt.topology), target,
		       verdict(climit >= target));
		if (!isnan(lease(b, "ratio")))
			printf("; lease %.2f", lease(b, "ratio"));
		printf("\n");
	}
	if (!isnan(lr) && lr > 0) {
		double q = isnan(paired(b, "relay")) ? cr / lr : paired(b, "relay");

		bench_set(b, "cursor_lease_ratio", q);
		printf("versus: drain: cursor %.0f msgs/s, lease %.0f msgs/s: %.2f x the lease's%s "
		       "(target >= 1.50: %s)\n",
		       cr, lr, q, isnan(paired(b, "relay")) ? "" : " (median of the rounds' pairs)",
		       verdict(q >= 1.5));
	}
	if (!isnan(lpg) && !isnan(cpg) && lpg > 0) {
		double q = isnan(paired(b, "pg_us")) ? cpg / lpg : paired(b, "pg_us");

		bench_set(b, "cursor_lease_pg_ratio", q);
		printf("versus: PostgreSQL CPU per relayed message: cursor %.1f us, lease %.1f us: "
		       "%.2f of the lease's%s (target <= 0.33: %s)\n",
		       cpg, lpg, q,
		       isnan(paired(b, "pg_us")) ? "" : " (median of the rounds' pairs)",
		       verdict(q <= 0.33));
	}
	print_writes(b, BENCH_LEASE);
	print_writes(b, BENCH_CURSOR);
	print_latency(b);
}
