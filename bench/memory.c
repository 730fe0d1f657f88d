/* The relay's peak RSS: not a run of its own but the runs that drain a table (relay, backlog,
 * keys) note it, and the memory line reports it after all of them. */
#include "bench/memory.h"

#include <math.h>
#include <stdio.h>

#define MEMORY_TARGET_KB 12288

void memory_note(struct bench *b, const struct drain *d, bool reference)
{
	long kb = d->hwm_kb > 0 ? d->hwm_kb : d->maxrss_kb;
	double max = bench_get(b, "rss_max_kb");

	if (kb <= 0)
		return;
	if (reference)
		bench_set(b, "rss_kb", (double)kb);
	if (isnan(max) || (double)kb > max)
		bench_set(b, "rss_max_kb", (double)kb);
}

void report_memory(struct bench *b)
{
	double rss = bench_get(b, "rss_kb"), max = bench_get(b, "rss_max_kb");
	long rss_kb = isnan(rss) ? 0 : (long)rss, max_kb = isnan(max) ? 0 : (long)max;

	if (rss_kb <= 0 && max_kb <= 0)
		return;
	printf("%s: relay peak RSS ", b->what);
	/* The reference is the relay run's; without one (--only backlog or keys) the runs that
	 * drained a table give the peak alone. */
	if (rss_kb > 0)
		printf("%ld kB in the %ld-row run (batch %ld x %d B), at most ", rss_kb,
		       b->opt.n_tput, bench_batch(b), BENCH_BODY_LEN);
	printf("%ld kB in any run (target <= %d kB: %s)\n", max_kb, MEMORY_TARGET_KB,
	       (rss_kb > 0 ? rss_kb : max_kb) <= MEMORY_TARGET_KB ? "met" : "MISSED");
}
