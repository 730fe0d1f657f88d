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

static const char *const source_names[BENCH_N_SOURCES] = { "lease", "cursor" };
/* The lease source's keys are the summary's keys from before there were two sources, so that
 * its figures read as they always have; the cursor's carry this prefix. */
static const char *const source_prefix[BENCH_N_SOURCES] = { "", "cursor_" };

const char *bench_source_name(enum bench_source s)
{
	return s < BENCH_N_SOURCES ? source_names[s] : "?";
}

bool bench_measures(const struct bench *b, enum bench_source s)
{
	return (b->opt.sources & (1u << s)) != 0;
}

const char *bench_topology_name(enum bench_topology t)
{
	static const char *const names[] = { "shared", "split-cores", "broker-core" };

	return t <= BENCH_BROKER_CORE ? names[t] : "?";
}

double bench_ratio_target(const struct bench *b)
{
	return b->opt.topology == BENCH_BROKER_CORE ? 0.90 : 0.80;
}

static int by_value(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

double bench_median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), by_value);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void declare(struct bench *b, const char *prefix, const struct bench_figure *f)
{
	int len;

	if (b->n_figures == BENCH_MAX_FIGURES) {
		fprintf(stderr, "outbox-bench: more than %d figures; raise BENCH_MAX_FIGURES\n",
		        BENCH_MAX_FIGURES);
		abort();
	}
	len = snprintf(b->figures[b->n_figures].key, BENCH_KEY_LEN, "%s%s", prefix, f->key);
	if (len < 0 || len >= BENCH_KEY_LEN) {
		fprintf(stderr, "outbox-bench: figure '%s%s' is too long a key\n", prefix, f->key);
		abort();
	}
	b->figures[b->n_figures].decimals = f->decimals;
	b->figures[b->n_figures].value = NAN;
	for (int r = 0; r < BENCH_ROUNDS_MAX; r++)
		b->figures[b->n_figures].rounds[r] = NAN;
	b->n_figures++;
}

void bench_declare(struct bench *b, const struct bench_figure *f)
{
	declare(b, "", f);
}

void bench_declare_source(struct bench *b, const struct bench_figure *f, enum bench_source s)
{
	declare(b, source_prefix[s], f);
}

/* The index of key as source s's figure, else of key itself; -1 when neither is declared. */
static long find(const struct bench *b, enum bench_source s, const char *key)
{
	char full[BENCH_KEY_LEN];

	snprintf(full, sizeof(full), "%s%s", source_prefix[s], key);
	for (size_t i = 0; i < b->n_figures; i++) {
		if (strcmp(b->figures[i].key, full) == 0)
			return (long)i;
	}
	for (size_t i = 0; i < b->n_figures; i++) {
		if (strcmp(b->figures[i].key, key) == 0)
			return (long)i;
	}
	return -1;
}

void bench_set(struct bench *b, const char *key, double value)
{
	long i = find(b, b->source, key);

	if (i >= 0) {
		b->figures[i].value = value;
		if (b->round >= 0 && b->round < BENCH_ROUNDS_MAX)
			b->figures[i].rounds[b->round] = value;
		return;
	}
	/* Caught on the first run of a new measurement, not left to print a wrong summary. */
	fprintf(stderr, "outbox-bench: figure '%s' is in no row of the measurement table\n", key);
	abort();
}

double bench_get(const struct bench *b, const char *key)
{
	return bench_get_source(b, b->source, key);
}

double bench_get_source(const struct bench *b, enum bench_source s, const char *key)
{
	long i = find(b, s, key);

	return i >= 0 ? b->figures[i].value : NAN;
}

double bench_get_round(const struct bench *b, enum bench_source s, const char *key, int r)
{
	long i = find(b, s, key);

	return i >= 0 && r >= 0 && r < BENCH_ROUNDS_MAX ? b->figures[i].rounds[r] : NAN;
}

void bench_take_medians(struct bench *b)
{
	for (size_t i = 0; i < b->n_figures; i++) {
		double v[BENCH_ROUNDS_MAX];
		int n = 0;

		for (int r = 0; r < BENCH_ROUNDS_MAX; r++)
			if (!isnan(b->figures[i].rounds[r]))
				v[n++] = b->figures[i].rounds[r];
		if (n > 0)
			b->figures[i].value = bench_median(v, n);
	}
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
