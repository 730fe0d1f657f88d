/* The relay's throughput: it drains a table pre-filled with n_tput rows, from its start until
 * every row is confirmed and marked; compared with the broker's limit when that was measured.
 * Then what each message cost (CPU by party, WAL by record type) and the WAL of the
 * producers' insert path, the figures a change to the database side is judged by. */
#include <math.h>
#include <stdio.h>

#include "bench/bench.h"
#include "bench/drain.h"
#include "bench/memory.h"
#include "bench/wal.h"

/* Single-row commits of the insert probe: enough for a stable figure, a few seconds. */
#define INSERT_PROBE_ROWS       5000
#define INSERT_PROBE_ROWS_QUICK 2000

/* The lowest and highest value key had over the rounds (source s's). */
static void spread(const struct bench *b, enum bench_source s, const char *key, double *lo,
                   double *hi)
{
	*lo = INFINITY;
	*hi = -INFINITY;
	for (int r = 0; r < b->opt.rounds; r++) {
		double v = bench_get_round(b, s, key, r);

		if (!isnan(v)) {
			*lo = fmin(*lo, v);
			*hi = fmax(*hi, v);
		}
	}
}

void relay_rounds_report(struct bench *b)
{
	double lo, hi;

	spread(b, BENCH_LEASE, "limit", &lo, &hi);
	if (lo <= hi)
		printf("limit: median of %d rounds %.0f msgs/s (from %.0f to %.0f)\n",
		       b->opt.rounds, bench_get_source(b, BENCH_LEASE, "limit"), lo, hi);
	for (int i = 0; i < BENCH_N_SOURCES; i++) {
		enum bench_source s = (enum bench_source)i;
		const char *name = bench_source_name(s);
		double ratio = bench_get_source(b, s, "ratio");

		if (!bench_measures(b, s) || isnan(bench_get_source(b, s, "relay")))
			continue;
		printf("relay/%s: by round (limit, relay msgs/s, ratio):", name);
		for (int r = 0; r < b->opt.rounds; r++) {
			double l = bench_get_round(b, s, "limit", r);
			double x = bench_get_round(b, s, "relay", r);

			if (isnan(x))
				printf(" -;");
			else if (isnan(l))
				printf(" - %.0f -;", x);
			else
				printf(" %.0f %.0f %.2f;", l, x, x / l);
		}
		printf("\n");
		spread(b, s, "pg_us", &lo, &hi);
		if (lo <= hi)
			printf("relay/%s: PostgreSQL CPU per message, median of the rounds %.1f us "
			       "(from %.1f to %.1f)\n",
			       name, bench_get_source(b, s, "pg_us"), lo, hi);
		spread(b, s, "ratio", &lo, &hi);
		if (lo <= hi)
			printf("relay/%s: median ratio to limit of the rounds %.2f (from %.2f to "
			       "%.2f; topology %s, target >= %.2f: %s)\n",
			       name, ratio, lo, hi, bench_topology_name(b->opt.topology),
			       bench_ratio_target(b),
			       ratio >= bench_ratio_target(b) ? "met" : "MISSED");
	}
}

void measure_relay(struct bench *b)
{
	const char *what = b->what;
	struct drain d;
	struct wal_cost ins;
	double limit = bench_get(b, "limit"), target = bench_ratio_target(b);
	long probe = b->opt.quick ? INSERT_PROBE_ROWS_QUICK : INSERT_PROBE_ROWS;
	char note[96];

	if (drain_run(b, what, "bench_tput", b->opt.n_tput, 0, false, &d) != 0)
		return;
	bench_set(b, "relay", d.rate);
	memory_note(b, &d, true);
	printf("%s: %ld pre-filled rows of %d B, start -> all confirmed and marked: %.2f s "
	       "(first delivery after %.3f s), %.0f msgs/s; peak RSS %ld kB (VmHWM), "
	       "%ld kB (ru_maxrss)\n",
	       what, b->opt.n_tput, BENCH_BODY_LEN, d.secs, d.first_s, d.rate, d.hwm_kb,
	       d.maxrss_kb);
	if (!isnan(limit)) {
		double ratio = d.rate / limit;

		bench_set(b, "ratio", ratio);
		printf("%s: ratio to limit %.2f (topology %s, target >= %.2f: %s)\n", what, ratio,
		       bench_topology_name(b->opt.topology), target,
		       ratio >= target ? "met" : "MISSED");
	}
	drain_print_cost(what, &d, b->opt.n_tput);
	bench_set(b, "pg_us", d.cpu.pg_us);
	bench_set(b, "mq_us", d.cpu.mq_us);
	bench_set(b, "relay_us", d.cpu.relay_us);
	bench_set(b, "wal_bytes", d.wal.bytes);
	/* The rows were inserted before the drain's WAL began: its records are the relay's own
	 * writes (and the vacuum they cause), per row for a source that writes each row, a
	 * constant per batch for one that writes a position. */
	bench_set(b, "wal_records", d.wal.records);
	printf("%s: the relay's own writes: %.3f WAL records per message, %.1f per batch of %ld\n",
	       what, d.wal.records, d.wal.records * (double)bench_batch(b), bench_batch(b));
	if (wal_insert_probe(b, what, probe, &ins) != 0)
		return;
	snprintf(note, sizeof(note),
	         "%ld single-row INSERT commits as producers make them, no relay", probe);
	wal_print(what, "producer insert", note, &ins);
	bench_set(b, "wal_insert_bytes", ins.bytes);
}
