/* Idle latency: an idle relay, commits at IDLE_RATE per second each carrying its commit time,
 * and the time from just before each commit to the consumer's receipt (p50/p95/p99). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/db.h"
#include "bench/latency.h"
#include "bench/mq.h"
#include "bench/proc.h"

#define IDLE_RATE 200 /* commits per second */

void measure_idle(struct bench *b)
{
	const char *what = b->what, *table = "bench_idle";
	long samples = (long)IDLE_RATE * b->opt.phase_s, sent = 0, got = 0;
	PGconn *c = db_open(b, what), *p = NULL;
	struct consumer *k = NULL;
	struct proc_relay rp = { 0 };
	struct latency lat;
	int64_t *v = NULL, start_ns;
	char body[BENCH_BODY_LEN + 1], id[32], err[512];
	const char *params[3];
	double p50, p95, p99;

	if (latency_init(&lat, samples) != 0 || !(v = calloc((size_t)samples, sizeof(*v)))) {
		bench_fail(b, what, "out of memory");
		goto out;
	}
	if (!c)
		goto out;
	if (db_table_fresh(b, c, what, table) != 0 || mq_fresh_queue(b, what, table) != 0 ||
	    mq_consume(b, what, table, latency_on_delivery, &lat, &k) != 0)
		goto out;
	if (proc_relay_start(b, &rp, what, table) != 0)
		goto out;
	p = db_open(b, what);
	if (!p)
		goto out;
	if (db_prepare_insert(p, "ins", table, err, sizeof(err)) != 0) {
		bench_fail(b, what, "prepare: %s", err);
		goto out;
	}
	/* Let the relay connect, find nothing and go to sleep: this measures an idle relay. */
	bench_sleep_ms(2000);
	if (!proc_relay_alive(b, &rp, what))
		goto out;
	params[1] = table;
	params[2] = body;
	start_ns = latency_mono_ns();
	for (sent = 0; sent < samples && !bench_interrupted(); sent++) {
		PGresult *r;

		latency_sleep_until(start_ns + (sent + 1) * (1000000000LL / IDLE_RATE));
		snprintf(id, sizeof(id), "i%ld", sent + 1);
		/* Taken before the single-statement (autocommit) transaction is sent, so the figure
		 * includes the commit itself. */
		latency_body(body, sent, bench_mono_us());
		params[0] = id;
		r = PQexecPrepared(p, "ins", 3, params, NULL, NULL, 0);
		if (PQresultStatus(r) != PGRES_COMMAND_OK) {
			bench_fail(b, what, "insert: %s", PQerrorMessage(p));
			PQclear(r);
			goto out;
		}
		PQclear(r);
	}
	got = latency_wait(&lat, samples, 10000, 10000);
	if (got < samples) {
		bench_fail(b, what,
		           "only %ld of %ld messages arrived within 10 s of the last commit", got,
		           samples);
		goto out;
	}
	for (long i = 0; i < samples; i++)
		v[i] = lat.arrived_us[i] - lat.stamp_us[i];
	latency_sort(v, got);
	p50 = latency_pct_ms(v, got, 50);
	p95 = latency_pct_ms(v, got, 95);
	p99 = latency_pct_ms(v, got, 99);
	bench_set(b, "p50_ms", p50);
	bench_set(b, "p95_ms", p95);
	bench_set(b, "p99_ms", p99);
	printf("%s: %ld single-row commits at %d/s, commit -> consumer receive: p50 %.2f ms, "
	       "p95 %.2f ms, p99 %.2f ms, max %.2f ms "
	       "(targets p50 <= 2 ms: %s, p99 <= 10 ms: %s)\n",
	       what, got, IDLE_RATE, p50, p95, p99, (double)v[got - 1] / 1000.0,
	       p50 <= 2.0 ? "met" : "MISSED", p99 <= 10.0 ? "met" : "MISSED");
out:
	PQfinish(p);
	proc_relay_stop(b, &rp, what);
	consumer_stop(k);
	db_table_drop(c, table);
	PQfinish(c);
	latency_free(&lat);
	free(v);
}
