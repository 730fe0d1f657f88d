/* Backlog scaling: the relay drains n_backlog pre-filled rows; its rate in the last 10 % of
 * the rows against the first 10 % shows whether a long table slows the claim down. */
#include <stdio.h>

#include "bench/bench.h"
#include "bench/drain.h"
#include "bench/memory.h"

void measure_backlog(struct bench *b)
{
	const char *what = b->what;
	struct drain d;
	double first, last, ratio;

	if (drain_run(b, what, "bench_backlog", b->opt.n_backlog, 0, true, &d) != 0)
		return;
	memory_note(b, &d, false);
	first = d.slice_rate[0];
	last = d.slice_rate[9];
	ratio = last / first;
	bench_set(b, "backlog_first", first);
	bench_set(b, "backlog_last", last);
	bench_set(b, "backlog_ratio", ratio);
	printf("%s: %ld rows drained in %.1f s (%.0f msgs/s), peak RSS %ld kB; "
	       "rate per 10 %%:",
	       what, b->opt.n_backlog, d.secs, d.rate, d.hwm_kb);
	for (int i = 0; i < 10; i++)
		printf(" %.0f", d.slice_rate[i]);
	printf("\n%s: first 10 %% %.0f msgs/s, last 10 %% %.0f msgs/s, ratio %.2f "
	       "(target >= 0.90: %s)\n",
	       what, first, last, ratio, ratio >= 0.9 ? "met" : "MISSED");
	drain_print_cost(what, &d, b->opt.n_backlog);
}
