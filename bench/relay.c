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

void relay_rounds_report(struct bench *b)
{
	double limits[BENCH_ROUNDS_MAX], rates[BENCH_ROUNDS_MAX], ratios[BENCH_ROUNDS_MAX];
	double pg[BENCH_ROUNDS_MAX];
	double target = bench_ratio_target(b);
	int n = 0;

	for (int r = 0; r < b->opt.rounds; r++)
		if (!isnan(b->by_round[r].limit))
			limits[n++] = b->by_round[r].limit;
	if (n > 0) {
		b->source = BENCH_LEASE;
		bench_set(b, "limit", bench_median(limits, n));
		printf("limit: median of %d rounds %.0f msgs/s (from %.0f to %.0f)\n", n,
		       bench_get(b, "limit"), limits[0], limits[n - 1]);
	}
	for (int s = 0; s < BENCH_N_SOURCES; s++) {
		int nr = 0, nq = 0, np = 0;

		if (!bench_measures(b, (enum bench_source)s))
			continue;
		b->source = (enum bench_source)s;
		printf("relay/%s: by round (limit, relay msgs/s, ratio):", bench_source_name(s));
		for (int r = 0; r < b->opt.rounds; r++) {
			double l = b->by_round[r].limit, x = b->by_round[r].relay[s];

			if (isnan(x))
				continue;
			rates[nr++] = x;
			if (!isnan(b->by_round[r].pg_us[s]))
				pg[np++] = b->by_round[r].pg_us[s];
			printf(" %.0f %.0f", l, x);
			if (!isnan(l)) {
				ratios[nq++] = x / l;
				printf(" %.2f", x / l);
			}
			printf(";");
		}
		printf("\n");
		if (nr == 0)
			continue;
		bench_set(b, "relay", bench_median(rates, nr));
		if (np > 0) {
			bench_set(b, "pg_us", bench_median(pg, np));
			printf("relay/%s: PostgreSQL CPU per message, median of %d rounds %.1f us "
			       "(from %.1f to %.1f)\n",
			       bench_source_name(s), np, bench_get(b, "pg_us"), pg[0], pg[np - 1]);
		}
		if (nq == 0)
			continue;
		bench_set(b, "ratio", bench_median(ratios, nq));
		printf("relay/%s: median ratio to limit of %d rounds %.2f (from %.2f to %.2f; "
		       "topology %s, target >= %.2f: %s)\n",
		       bench_source_name(s), nq, bench_get(b, "ratio"), ratios[0], ratios[nq - 1],
		       bench_topology_name(b->opt.topology), target,
		       bench_get(b, "ratio") >= target ? "met" : "MISSED");
	}
	b->source = BENCH_LEASE;
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
	b->by_round[b->round].relay[b->source] = d.rate;
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
	b->by_round[b->round].pg_us[b->source] = d.cpu.pg_us;
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
