/* drain.h — the relay draining a pre-filled table, timed from its start until every row is
 * confirmed and marked: the procedure behind the relay, backlog and keys measurements. */
#ifndef OUTBOX_BENCH_DRAIN_H
#define OUTBOX_BENCH_DRAIN_H

#include <stdbool.h>

#include "bench/bench.h"

struct drain {
	double secs, rate;
	double first_s; /* relay start -> first delivery: its start-up cost */
	long hwm_kb;    /* the relay's VmHWM before it stopped (-1 unknown) */
	long maxrss_kb; /* and its ru_maxrss */
	/* msgs/s of each 10 % of the rows by the consumer's clock (with slices only) */
	double slice_rate[10];
};

/* Fills `table` with n rows (over `keys` ordering keys, 0 = none), starts a relay on it and
 * times it until the consumer has seen n deliveries and no unpublished row is left. Fills
 * *d; 0, or -1 after bench_fail(what). The table is dropped and the relay stopped either
 * way; d->hwm_kb and d->maxrss_kb are set whenever the relay ran. */
int drain_run(struct bench *b, const char *what, const char *table, long n, int keys, bool slices,
              struct drain *d) __attribute__((warn_unused_result));

#endif
