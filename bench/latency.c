/* Commit -> consumer latency (latency.h): the stamped bodies, the consumer's arrival record,
 * the absolute pacing and the percentiles of the idle and load measurements. */
#include "bench/latency.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench.h"

int latency_init(struct latency *l, long cap)
{
	memset(l, 0, sizeof(*l));
	atomic_init(&l->arrived, 0);
	atomic_init(&l->repeated, 0);
	if (cap <= 0)
		return -1;
	l->stamp_us = calloc((size_t)cap, sizeof(*l->stamp_us));
	l->arrived_us = calloc((size_t)cap, sizeof(*l->arrived_us));
	if (!l->stamp_us || !l->arrived_us)
		return -1;
	l->cap = cap;
	return 0;
}

void latency_free(struct latency *l)
{
	free(l->stamp_us);
	free(l->arrived_us);
	l->stamp_us = l->arrived_us = NULL;
	l->cap = 0;
}

void latency_body(char *body, long index, int64_t stamp_us)
{
	int len = snprintf(body, BENCH_BODY_LEN + 1, "t=%" PRId64 ";n=%ld;", stamp_us, index);

	if (len < 0)
		len = 0;
	if (len < BENCH_BODY_LEN)
		memset(body + len, 'x', (size_t)(BENCH_BODY_LEN - len));
	body[BENCH_BODY_LEN] = '\0';
}

void latency_on_delivery(const struct consumer_delivery *d, void *arg)
{
	struct latency *l = arg;
	char tmp[64], *end;
	size_t len = d->body_len < sizeof(tmp) - 1 ? d->body_len : sizeof(tmp) - 1;
	long long t, i;

	memcpy(tmp, d->body, len);
	tmp[len] = '\0';
	if (strncmp(tmp, "t=", 2) != 0)
		return;
	errno = 0;
	t = strtoll(tmp + 2, &end, 10);
	if (errno || strncmp(end, ";n=", 3) != 0)
		return;
	errno = 0;
	i = strtoll(end + 3, &end, 10);
	if (errno || *end != ';' || i < 0 || i >= l->cap)
		return;
	if (l->arrived_us[i] != 0) {
		atomic_fetch_add(&l->repeated, 1);
		return;
	}
	l->stamp_us[i] = t;
	l->arrived_us[i] = d->mono_us;
	atomic_fetch_add(&l->arrived, 1);
}

long latency_wait(struct latency *l, long want, int64_t total_ms, int64_t quiet_ms)
{
	int64_t now = bench_mono_us(), deadline = now + total_ms * 1000, last = now;
	long seen = atomic_load(&l->arrived);

	while (seen < want && now < deadline && now - last < quiet_ms * 1000 &&
	       !bench_interrupted()) {
		long got;

		bench_sleep_ms(10);
		now = bench_mono_us();
		got = atomic_load(&l->arrived);
		if (got != seen) {
			seen = got;
			last = now;
		}
	}
	return seen;
}

int64_t latency_mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void latency_sleep_until(int64_t at_ns)
{
	struct timespec ts = { (time_t)(at_ns / 1000000000), (long)(at_ns % 1000000000) };

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR &&
	       !bench_interrupted())
		;
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return (x > y) - (x < y);
}

void latency_sort(int64_t *v, long n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_i64);
}

double latency_pct_ms(const int64_t *v, long n, long p)
{
	long i = (p * n + 99) / 100 - 1;

	if (i < 0)
		i = 0;
	if (i >= n)
		i = n - 1;
	return (double)v[i] / 1000.0;
}
