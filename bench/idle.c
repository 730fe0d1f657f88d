/* Idle latency: an idle relay, commits at IDLE_RATE per second each carrying its commit time,
 * and the time from just before each commit to the consumer's receipt (p50/p95/p99). */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench.h"
#include "bench/db.h"
#include "bench/mq.h"
#include "bench/proc.h"

#define IDLE_RATE 200 /* commits per second */

/* Filled by the consumer's thread: commit -> receive in microseconds, one per message. */
struct latencies {
	int64_t *v;
	long cap;
	atomic_long n;
};

/* Bodies start with "t=<CLOCK_REALTIME us>;", the time taken just before the commit. */
static void on_delivery(const struct consumer_delivery *d, void *arg)
{
	struct latencies *l = arg;
	char tmp[32], *end;
	size_t len = d->body_len < sizeof(tmp) - 1 ? d->body_len : sizeof(tmp) - 1;
	long long t;
	long i;

	memcpy(tmp, d->body, len);
	tmp[len] = '\0';
	if (strncmp(tmp, "t=", 2) != 0)
		return;
	errno = 0;
	t = strtoll(tmp + 2, &end, 10);
	if (errno || *end != ';')
		return;
	i = atomic_load(&l->n);
	if (i < l->cap) {
		l->v[i] = d->real_us - t;
		atomic_store(&l->n, i + 1);
	}
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted v. */
static double pct_ms(const int64_t *v, long n, long p)
{
	long i = (p * n + 99) / 100 - 1;

	if (i < 0)
		i = 0;
	if (i >= n)
		i = n - 1;
	return (double)v[i] / 1000.0;
}

/* Prepares the producer's single-row insert as "ins"; -1 after bench_fail(what). */
static int prepare_insert(struct bench *b, PGconn *p, const char *what, const char *table)
{
	char sql[256];
	PGresult *r;
	int rc = 0;

	snprintf(sql, sizeof(sql),
	         "INSERT INTO %s (id, exchange_name, routing_key, body) "
	         "VALUES ($1, '', $2, $3) ON CONFLICT (id) DO NOTHING",
	         table);
	r = PQprepare(p, "ins", sql, 3, NULL);
	if (PQresultStatus(r) != PGRES_COMMAND_OK) {
		bench_fail(b, what, "prepare: %s", PQerrorMessage(p));
		rc = -1;
	}
	PQclear(r);
	return rc;
}

void measure_idle(struct bench *b)
{
	const char *what = "idle", *table = "bench_idle";
	long samples = (long)IDLE_RATE * b->opt.phase_s, sent = 0, got;
	PGconn *c = db_open(b, what), *p = NULL;
	struct consumer *k = NULL;
	struct proc_relay rp = { 0 };
	struct latencies lat = { 0 };
	char body[BENCH_BODY_LEN + 1], id[32];
	const char *params[3];
	struct timespec next;
	int64_t deadline;
	double p50, p95, p99;

	if (!c)
		return;
	lat.v = calloc((size_t)samples, sizeof(*lat.v));
	lat.cap = samples;
	atomic_init(&lat.n, 0);
	if (!lat.v) {
		bench_fail(b, what, "out of memory");
		goto out;
	}
	if (db_table_fresh(b, c, what, table) != 0 || mq_fresh_queue(b, what, table) != 0 ||
	    mq_consume(b, what, table, on_delivery, &lat, &k) != 0)
		goto out;
	if (proc_relay_start(b, &rp, what, table) != 0)
		goto out;
	p = db_open(b, what);
	if (!p || prepare_insert(b, p, what, table) != 0)
		goto out;
	/* Let the relay connect, find nothing and go to sleep: this measures an idle relay. */
	bench_sleep_ms(2000);
	if (!proc_relay_alive(b, &rp, what))
		goto out;
	memset(body, 'x', BENCH_BODY_LEN);
	body[BENCH_BODY_LEN] = '\0';
	params[1] = table;
	params[2] = body;
	clock_gettime(CLOCK_MONOTONIC, &next);
	for (sent = 0; sent < samples && !bench_interrupted(); sent++) {
		char stamp[40];
		PGresult *r;
		int len;

		next.tv_nsec += 1000000000L / IDLE_RATE;
		if (next.tv_nsec >= 1000000000L) {
			next.tv_sec++;
			next.tv_nsec -= 1000000000L;
		}
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL) == EINTR &&
		       !bench_interrupted())
			;
		snprintf(id, sizeof(id), "i%ld", sent + 1);
		/* Taken before the single-statement (autocommit) transaction is sent, so the figure
		 * includes the commit itself. */
		len = snprintf(stamp, sizeof(stamp), "t=%" PRId64 ";", bench_real_us());
		memcpy(body, stamp, (size_t)len);
		params[0] = id;
		r = PQexecPrepared(p, "ins", 3, params, NULL, NULL, 0);
		if (PQresultStatus(r) != PGRES_COMMAND_OK) {
			bench_fail(b, what, "insert: %s", PQerrorMessage(p));
			PQclear(r);
			goto out;
		}
		PQclear(r);
	}
	deadline = bench_mono_us() + 10000000;
	while (atomic_load(&lat.n) < samples && bench_mono_us() < deadline && !bench_interrupted())
		bench_sleep_ms(10);
	got = atomic_load(&lat.n);
	if (got < samples) {
		bench_fail(b, what,
		           "only %ld of %ld messages arrived within 10 s of the last commit", got,
		           samples);
		goto out;
	}
	qsort(lat.v, (size_t)got, sizeof(*lat.v), cmp_i64);
	p50 = pct_ms(lat.v, got, 50);
	p95 = pct_ms(lat.v, got, 95);
	p99 = pct_ms(lat.v, got, 99);
	bench_set(b, "p50_ms", p50);
	bench_set(b, "p95_ms", p95);
	bench_set(b, "p99_ms", p99);
	printf("idle: %ld single-row commits at %d/s, commit -> consumer receive: p50 %.2f ms, "
	       "p95 %.2f ms, p99 %.2f ms, max %.2f ms "
	       "(targets p50 <= 2 ms: %s, p99 <= 10 ms: %s)\n",
	       got, IDLE_RATE, p50, p95, p99, (double)lat.v[got - 1] / 1000.0,
	       p50 <= 2.0 ? "met" : "MISSED", p99 <= 10.0 ? "met" : "MISSED");
out:
	PQfinish(p);
	proc_relay_stop(b, &rp, what);
	consumer_stop(k);
	db_table_drop(c, table);
	PQfinish(c);
	free(lat.v);
}
