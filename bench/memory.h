/* memory.h — the relay's peak resident memory, noted by every run that drains a table and
 * reported once all have run. */
#ifndef OUTBOX_BENCH_MEMORY_H
#define OUTBOX_BENCH_MEMORY_H

#include <stdbool.h>

#include "bench/bench.h"
#include "bench/drain.h"

/* Notes the peak RSS of the relay of d (VmHWM, else ru_maxrss) into rss_max_kb; with
 * reference, also as rss_kb, the figure held to the target (the n_tput-row run). */
void memory_note(struct bench *b, const struct drain *d, bool reference);

#endif
