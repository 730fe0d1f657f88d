/* latency.h — commit -> consumer latency, what the idle and load measurements share: bodies
 * that carry their row's index and a stamp, the consumer's record of when each arrived,
 * producers paced on an absolute schedule, and percentiles. */
#ifndef OUTBOX_BENCH_LATENCY_H
#define OUTBOX_BENCH_LATENCY_H

#include <stdatomic.h>
#include <stdint.h>

#include "bench/mq.h"

/* What the consumer's thread records, by the index each body carries. Written by that thread
 * only; a thread that sees `arrived` reach a count also sees the entries behind it. */
struct latency {
	long cap;             /* indexes 0 .. cap - 1 */
	int64_t *stamp_us;    /* the stamp the body carried (bench_mono_us() of its producer) */
	int64_t *arrived_us;  /* CLOCK_MONOTONIC of its first delivery; 0 = none yet */
	atomic_long arrived;  /* distinct indexes delivered */
	atomic_long repeated; /* deliveries of an index already delivered */
};

/* Zeroed arrays for cap indexes; -1 when memory ran out (l is then safe to latency_free()). */
int latency_init(struct latency *l, long cap) __attribute__((warn_unused_result));
void latency_free(struct latency *l);

/* Writes the body of row `index` into body (BENCH_BODY_LEN + 1 bytes): "t=<stamp_us>;n=<index>;"
 * then 'x' up to BENCH_BODY_LEN bytes, NUL-terminated. */
void latency_body(char *body, long index, int64_t stamp_us);
/* The consumer's callback (mq_consume(), arg = the struct latency): records the arrival of
 * the index the body carries; a body that carries none is ignored. */
void latency_on_delivery(const struct consumer_delivery *d, void *arg);
/* Waits until `want` indexes have arrived, for total_ms at most, giving up sooner when none
 * arrived for quiet_ms, or on an interrupt. Returns how many have arrived. */
long latency_wait(struct latency *l, long want, int64_t total_ms, int64_t quiet_ms);

/* Sleeps until CLOCK_MONOTONIC reaches at_ns (nanoseconds, absolute), cut short by an
 * interrupt; returns at once when that time has passed. Producers that sleep to a point of an
 * absolute schedule keep their rate even when a commit was late: the next one goes at once. */
void latency_sleep_until(int64_t at_ns);
/* CLOCK_MONOTONIC now, in nanoseconds. */
int64_t latency_mono_ns(void);

/* Sorts v ascending. */
void latency_sort(int64_t *v, long n);
/* Nearest-rank percentile p (0..100) of sorted v (microseconds), in milliseconds. */
double latency_pct_ms(const int64_t *v, long n, long p);

#endif
