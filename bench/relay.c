/* The relay's throughput: it drains a table pre-filled with n_tput rows, from its start until
 * every row is confirmed and marked; compared with the broker's limit when that was measured. */
#include <math.h>
#include <stdio.h>

#include "bench/bench.h"
#include "bench/drain.h"
#include "bench/memory.h"

void measure_relay(struct bench *b)
{
	struct drain d;
	double limit = bench_get(b, "limit");

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
}
