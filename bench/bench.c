/* The benchmark's common ground (bench.h): the figures of the summary line, failures, the
 * interrupt flag and the clocks every measurement uses. */
#include "bench/bench.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static volatile sig_atomic_t interrupted;

void bench_declare(struct bench *b, const struct bench_figure *f)
{
	if (b->n_figures == BENCH_MAX_FIGURES) {
		fprintf(stderr, "outbox-bench: more than %d figures; raise BENCH_MAX_FIGURES\n",
		        BENCH_MAX_FIGURES);
		abort();
	}
	b->figures[b->n_figures].f = *f;
	b->figures[b->n_figures].value = NAN;
	b->n_figures++;
}

void bench_set(struct bench *b, const char *key, double value)
{
	for (size_t i = 0; i < b->n_figures; i++) {
		if (strcmp(b->figures[i].f.key, key) == 0) {
			b->figures[i].value = value;
			return;
		}
	}
	/* Caught on the first run of a new measurement, not left to print a wrong summary. */
	fprintf(stderr, "outbox-bench: figure '%s' is in no row of the measurement table\n", key);
	abort();
}

double bench_get(const struct bench *b, const char *key)
{
	for (size_t i = 0; i < b->n_figures; i++) {
		if (strcmp(b->figures[i].f.key, key) == 0)
			return b->figures[i].value;
	}
	return NAN;
}

void bench_fail(struct bench *b, const char *what, const char *fmt, ...)
{
	va_list ap;

	fprintf(stdout, "%s: FAILED: ", what);
	va_start(ap, fmt);
	vfprintf(stdout, fmt, ap);
	va_end(ap);
	fputc('\n', stdout);
	fflush(stdout);
	b->failures++;
}

bool bench_interrupted(void)
{
	return interrupted != 0;
}

void bench_interrupt(void)
{
	interrupted = 1;
}

static int64_t clock_us(clockid_t clock)
{
	struct timespec ts;

	clock_gettime(clock, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t bench_mono_us(void)
{
	return clock_us(CLOCK_MONOTONIC);
}

int64_t bench_real_us(void)
{
	return clock_us(CLOCK_REALTIME);
}

void bench_sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !interrupted)
		;
}

long bench_workers(const struct bench *b)
{
	return b->opt.workers > 0 ? b->opt.workers : BENCH_WORKERS_DFLT;
}

long bench_batch(const struct bench *b)
{
	return b->opt.batch > 0 ? b->opt.batch : BENCH_BATCH_DFLT;
}
