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

void measure_relay(struct bench *b)
{
	struct drain d;
	struct wal_cost ins;
	double limit = bench_get(b, "limit");
	long probe = b->opt.quick ? INSERT_PROBE_ROWS_QUICK : INSERT_PROBE_ROWS;
	char note[96];

	if (drain_run(b, "relay", "bench_tput", b->opt.n_tput, 0, false, &d) != 0)
		return;
	bench_set(b, "relay", d.rate);
	memory_note(b, &d, true);
	printf("relay: %ld pre-filled rows of %d B, start -> all confirmed and marked: %.2f s "
	       "(first delivery after %.3f s), %.0f msgs/s; peak RSS %ld kB (VmHWM), "
	       "%ld kB (ru_maxrss)\n",
	       b->opt.n_tput, BENCH_BODY_LEN, d.secs, d.first_s, d.rate, d.hwm_kb, d.maxrss_kb);
	if (!isnan(limit)) {
		double ratio = d.rate / limit;

		bench_set(b, "ratio", ratio);
		printf("relay: ratio to limit %.2f (target >= 0.80: %s)\n", ratio,
		       ratio >= 0.8 ? "met" : "MISSED");
	}
	drain_print_cost("relay", &d, b->opt.n_tput);
	bench_set(b, "pg_us", d.cpu.pg_us);
	bench_set(b, "mq_us", d.cpu.mq_us);
	bench_set(b, "relay_us", d.cpu.relay_us);
	bench_set(b, "wal_bytes", d.wal.bytes);
	if (wal_insert_probe(b, "relay", probe, &ins) != 0)
		return;
	snprintf(note, sizeof(note),
	         "%ld single-row INSERT commits as producers make them, no relay", probe);
	wal_print("relay", "producer insert", note, &ins);
	bench_set(b, "wal_insert_bytes", ins.bytes);
}
