/* Ordering keys: the relay drains n_tput rows spread over KEYS ordering keys, against the
 * same drain without keys (the relay measurement's when it ran, else one of its own). */
#include <math.h>
#include <stdio.h>

#include "bench/bench.h"
#include "bench/drain.h"
#include "bench/memory.h"

#define KEYS 10000 /* distinct ordering keys */

void measure_keys(struct bench *b)
{
	const char *what = b->what;
	struct drain d;
	double nokeys = bench_get(b, "relay"), ratio;

	if (isnan(nokeys)) {
		if (drain_run(b, what, "bench_nokeys", b->opt.n_tput, 0, false, &d) != 0)
			return;
		memory_note(b, &d, false);
		nokeys = d.rate;
	}
	bench_set(b, "nokeys", nokeys);
	if (drain_run(b, what, "bench_keys", b->opt.n_tput, KEYS, false, &d) != 0)
		return;
	memory_note(b, &d, false);
	ratio = d.rate / nokeys;
	bench_set(b, "keys", d.rate);
	bench_set(b, "keys_ratio", ratio);
	printf("%s: %ld rows over %d ordering keys: %.2f s, %.0f msgs/s; without keys %.0f "
	       "msgs/s; ratio %.2f\n",
	       what, b->opt.n_tput, KEYS, d.secs, d.rate, nokeys, ratio);
	drain_print_cost(what, &d, b->opt.n_tput);
}
