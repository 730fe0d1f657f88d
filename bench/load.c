/* Latency under load: LOAD_PRODUCERS connections commit inserts (--load-batch rows each, one
 * by default) at a fixed total rate of rows (half the relay's measured maximum) on an absolute
 * schedule for phase_s seconds, and the time from each row's commit returning to the consumer's
 * receipt (p50/p95/p99/max). Several rows a commit let the rate be held where single-row
 * commits would cost the database more than the machine has. Then the same load once more with
 * no relay (bench/direct.h publishes each commit's rows as it returns): the floor, what the
 * machine gives at that rate before any relay's work, and the database's CPU for the
 * producers' inserts alone. */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/cpu.h"
#include "bench/db.h"
#include "bench/direct.h"
#include "bench/latency.h"
#include "bench/mq.h"
#include "bench/proc.h"
#include "bench/drive/pgsql.h"

#define LOAD_PRODUCERS 4         /* threads, each on its own connection */
#define LOAD_MAX_ROWS  20000000L /* rate x seconds beyond this is refused (memory) */
#define LOAD_QUIET_MS  10000     /* the wait for the last deliveries ends after this without one */
#define LOAD_DRAIN_MS  120000    /* and after this in any case */

/* One producer: commits index, index + LOAD_PRODUCERS, ... each of batch rows, commit k
 * holding rows k * batch ... and sent at t0 + its first row / rate. */
struct load_producer {
	pthread_t thread;
	const char *pg, *table;
	int index;
	long rows;         /* rows of the whole run, a multiple of batch */
	long batch;        /* rows per commit */
	double rate;       /* of the whole run, rows per second */
	int64_t stop_ns;   /* a producer this far behind its schedule stops sending */
	atomic_int *go;    /* 0 wait, 1 run (t0_ns set), 2 stop */
	atomic_int *ready; /* producers connected (or failed) */
	const int64_t *t0_ns;
	int64_t *commit_us;    /* by row: bench_mono_us() when the commit returned; 0 = not sent */
	int64_t *rtt_us;       /* by row: the commit's round trip, send -> return */
	struct direct *direct; /* the stand-in publisher (no relay runs), or NULL */
	long commits;
	int64_t last_us; /* when its last commit returned */
	char err[256];
};

static void *producer_main(void *arg)
{
	struct load_producer *pr = arg;
	PGconn *c = pgsql_connect(pr->pg, pr->err, sizeof(pr->err));
	char(*ids)[48] = calloc((size_t)pr->batch, sizeof(*ids));
	char *bodies = malloc((size_t)pr->batch * (BENCH_BODY_LEN + 1));
	const char **params = calloc((size_t)pr->batch * 3, sizeof(*params));

	if (!ids || !bodies || !params) {
		snprintf(pr->err, sizeof(pr->err), "out of memory");
		atomic_fetch_add(pr->ready, 1);
		goto out;
	}
	if (!c ||
	    db_prepare_insert_rows(c, "ins", pr->table, pr->batch, pr->err, sizeof(pr->err)) != 0) {
		atomic_fetch_add(pr->ready, 1);
		goto out;
	}
	for (long j = 0; j < pr->batch; j++) {
		params[3 * j] = ids[j];
		params[3 * j + 1] = pr->table;
		params[3 * j + 2] = bodies + j * (BENCH_BODY_LEN + 1);
	}
	atomic_fetch_add(pr->ready, 1);
	while (atomic_load(pr->go) == 0)
		bench_sleep_ms(1);
	for (long first = pr->index * pr->batch; first < pr->rows && atomic_load(pr->go) == 1;
	     first += LOAD_PRODUCERS * pr->batch) {
		int64_t at = *pr->t0_ns + (int64_t)((double)first * 1e9 / pr->rate), sent;
		PGresult *r;

		latency_sleep_until(at);
		if (latency_mono_ns() > pr->stop_ns || bench_interrupted())
			break;
		sent = bench_mono_us();
		for (long j = 0; j < pr->batch; j++) {
			snprintf(ids[j], sizeof(ids[j]), "l%ld", first + j);
			latency_body(bodies + j * (BENCH_BODY_LEN + 1), first + j, sent);
		}
		/* Autocommit: the statement's return is the commit's. */
		r = PQexecPrepared(c, "ins", (int)(3 * pr->batch), params, NULL, NULL, 0);
		pr->last_us = bench_mono_us();
		if (PQresultStatus(r) != PGRES_COMMAND_OK) {
			snprintf(pr->err, sizeof(pr->err), "%s", PQerrorMessage(c));
			PQclear(r);
			break;
		}
		PQclear(r);
		for (long j = 0; j < pr->batch; j++) {
			pr->commit_us[first + j] = pr->last_us;
			pr->rtt_us[first + j] = pr->last_us - sent;
		}
		if (pr->direct)
			direct_push(pr->direct, first, pr->batch);
		pr->commits++;
	}
out:
	PQfinish(c);
	free(ids);
	free(bodies);
	free(params);
	return NULL;
}

/* The total commit rate: --load-rate, else half what the relay drained in this run, else
 * BENCH_LOAD_RATE_DFLT; its origin into why. */
static double load_rate(const struct bench *b, char *why, size_t len)
{
	double relay = bench_get(b, "relay");

	if (b->opt.load_rate > 0) {
		snprintf(why, len, "--load-rate");
		return (double)b->opt.load_rate;
	}
	if (!isnan(relay) && relay >= 2) {
		snprintf(why, len, "half the %s source's drain, %.0f msgs/s",
		         bench_source_name(b->source), relay);
		return floor(relay / 2);
	}
	snprintf(why, len, "default: the relay was not measured in this run");
	return BENCH_LOAD_RATE_DFLT;
}

/* The server processes of the relay's own sessions (its workers' and its maintenance's, by
 * application_name) into pids: how many, at most cap. */
static size_t relay_backends(PGconn *c, pid_t *pids, size_t cap)
{
	PGresult *r = PQexec(c, "SELECT pid FROM pg_stat_activity"
	                        " WHERE application_name LIKE 'outbox-relay %' ORDER BY pid");
	size_t n = 0;

	if (PQresultStatus(r) == PGRES_TUPLES_OK)
		for (int i = 0; i < PQntuples(r) && n < cap; i++)
			pids[n++] = (pid_t)strtol(PQgetvalue(r, i, 0), NULL, 10);
	PQclear(r);
	return n;
}

/* One stretch of load at rate: the relay (d NULL) or the stand-in publisher (direct.h)
 * carries the producers' rows to the consumer. Prints its lines; the relay's stretch sets the
 * load figures, the stand-in's the floor's. */
static void load_stretch(struct bench *b, double rate, const char *why, long batch, bool direct)
{
	const char *what = b->what, *table = "bench_load";
	long rows = ((long)llround(rate * b->opt.phase_s) + batch - 1) / batch * batch;
	long committed = 0, commits = 0, got, n = 0;
	PGconn *c = NULL;
	struct consumer *k = NULL;
	struct proc_relay rp = { 0 };
	struct direct *d = NULL;
	struct latency lat;
	struct load_producer pr[LOAD_PRODUCERS];
	struct cpu_sample ca, cz;
	struct cpu_cost cost;
	pid_t own[8];
	size_t n_own = 0;
	double own0 = NAN, own1 = NAN;
	int64_t *commit_us = NULL, *rtt_us = NULL, *v = NULL, *rv = NULL, t0_ns = 0, t0_us = 0;
	int64_t last_us = 0, deadline;
	atomic_int go, ready;
	int started = 0;
	double achieved, p50, p95, p99, r50, r99;
	char err[256], label[96];

	memset(pr, 0, sizeof(pr));
	atomic_init(&go, 0);
	atomic_init(&ready, 0);
	memset(&lat, 0, sizeof(lat));
	if (rows > LOAD_MAX_ROWS) {
		bench_fail(b, what, "%.0f/s for %d s is more than %ld rows", rate, b->opt.phase_s,
		           LOAD_MAX_ROWS);
		goto out;
	}
	commit_us = calloc((size_t)rows, sizeof(*commit_us));
	rtt_us = calloc((size_t)rows, sizeof(*rtt_us));
	v = calloc((size_t)rows, sizeof(*v));
	rv = calloc((size_t)rows, sizeof(*rv));
	if (latency_init(&lat, rows) != 0 || !commit_us || !rtt_us || !v || !rv) {
		bench_fail(b, what, "out of memory");
		goto out;
	}
	c = db_open(b, what);
	if (!c)
		goto out;
	if (db_table_fresh(b, c, what, table) != 0 || mq_fresh_queue(b, what, table) != 0 ||
	    mq_consume(b, what, table, latency_on_delivery, &lat, &k) != 0)
		goto out;
	if (direct && !(d = direct_start(b, table, rows, err, sizeof(err)))) {
		bench_fail(b, what, "the stand-in publisher: %s", err);
		goto out;
	}
	if (!direct && proc_relay_start(b, &rp, what, table) != 0)
		goto out;
	for (; started < LOAD_PRODUCERS; started++) {
		struct load_producer *p = &pr[started];

		p->pg = b->opt.pg;
		p->table = table;
		p->index = started;
		p->rows = rows;
		p->batch = batch;
		p->rate = rate;
		p->go = &go;
		p->ready = &ready;
		p->t0_ns = &t0_ns;
		p->commit_us = commit_us;
		p->rtt_us = rtt_us;
		p->direct = d;
		if (pthread_create(&p->thread, NULL, producer_main, p) != 0) {
			bench_fail(b, what, "could not start producer threads");
			atomic_store(&go, 2);
			goto join;
		}
	}
	deadline = bench_mono_us() + 30000000;
	while (atomic_load(&ready) < LOAD_PRODUCERS && bench_mono_us() < deadline)
		bench_sleep_ms(5);
	/* Let the relay connect and go idle, as the idle run does; the load then wakes it. */
	if (!direct)
		bench_sleep_ms(2000);
	if (!direct && !proc_relay_alive(b, &rp, what)) {
		atomic_store(&go, 2);
		goto join;
	}
	if (!direct && (n_own = relay_backends(c, own, sizeof(own) / sizeof(own[0]))) > 0)
		own0 = cpu_pids_s(own, n_own);
	cpu_sample(&ca, rp.pid);
	t0_us = bench_mono_us();
	t0_ns = latency_mono_ns();
	/* A producer that cannot keep up commits as fast as it can; past twice the phase and
	 * 10 s more it stops, and the achieved rate says so. */
	for (int i = 0; i < LOAD_PRODUCERS; i++)
		pr[i].stop_ns = t0_ns + (2LL * b->opt.phase_s + 10) * 1000000000LL;
	atomic_store(&go, 1);
join:
	for (int i = 0; i < started; i++)
		pthread_join(pr[i].thread, NULL);
	if (atomic_load(&go) != 1)
		goto out;
	for (int i = 0; i < started; i++) {
		if (pr[i].err[0]) {
			bench_fail(b, what, "producer %d: %s", i, pr[i].err);
			goto out;
		}
		commits += pr[i].commits;
		committed += pr[i].commits * batch;
		if (pr[i].last_us > last_us)
			last_us = pr[i].last_us;
	}
	if (bench_interrupted()) {
		bench_fail(b, what, "interrupted");
		goto out;
	}
	got = latency_wait(&lat, committed, LOAD_DRAIN_MS, LOAD_QUIET_MS);
	cpu_sample(&cz, rp.pid);
	if (n_own > 0)
		own1 = cpu_pids_s(own, n_own); /* NAN when a session went (a reconnect) */
	if ((!direct && !proc_relay_alive(b, &rp, what)) || mq_consumer_check(b, k, what) != 0)
		goto out;
	if (direct) {
		int rc = direct_stop(d, LOAD_QUIET_MS, err, sizeof(err));

		d = NULL;
		if (rc != 0) {
			bench_fail(b, what, "the stand-in publisher: %s", err);
			goto out;
		}
	}
	if (got < committed) {
		bench_fail(b, what, "only %ld of %ld committed rows delivered (none for %d s)", got,
		           committed, LOAD_QUIET_MS / 1000);
		goto out;
	}
	for (long i = 0; i < rows; i++) {
		if (commit_us[i] == 0 || lat.arrived_us[i] == 0)
			continue;
		v[n] = lat.arrived_us[i] - commit_us[i];
		rv[n] = rtt_us[i];
		n++;
	}
	if (n == 0) {
		bench_fail(b, what, "no row was committed");
		goto out;
	}
	latency_sort(v, n);
	latency_sort(rv, n);
	achieved = last_us > t0_us ? (double)committed / ((double)(last_us - t0_us) / 1e6) : NAN;
	p50 = latency_pct_ms(v, n, 50);
	p95 = latency_pct_ms(v, n, 95);
	p99 = latency_pct_ms(v, n, 99);
	r50 = latency_pct_ms(rv, n, 50);
	r99 = latency_pct_ms(rv, n, 99);
	cpu_cost(&ca, &cz, committed, &cost);
	if (direct) {
		bench_set(b, "load_floor_p50_ms", p50);
		bench_set(b, "load_floor_p99_ms", p99);
		bench_set(b, "load_floor_pg_us", cost.pg_us);
		printf("%s: the same load with no relay, the bench publishing each commit's rows "
		       "as "
		       "it returns (confirm mode, %ld rows at %.0f rows/s achieved, %ld "
		       "delivered): "
		       "commit -> consumer receive: p50 %.2f ms, p95 %.2f ms, p99 %.2f ms, max "
		       "%.2f ms: the floor at this rate on this machine\n",
		       what, committed, achieved, got, p50, p95, p99, (double)v[n - 1] / 1000.0);
		snprintf(label, sizeof(label), "%s (no relay)", what);
		cpu_print(label, &cost, true);
		goto out;
	}
	bench_set(b, "load_rate", achieved);
	bench_set(b, "load_p50_ms", p50);
	bench_set(b, "load_p99_ms", p99);
	printf("%s: %d connections, %ld-row commits paced at %.0f rows/s (%s) for %d s: %ld "
	       "rows in %ld commits at %.0f rows/s achieved, %ld delivered (%ld repeated); the "
	       "commit itself p50 %.2f ms, p99 %.2f ms\n",
	       what, LOAD_PRODUCERS, batch, rate, why, b->opt.phase_s, committed, commits, achieved,
	       got, atomic_load(&lat.repeated), r50, r99);
	printf("%s: commit -> consumer receive: p50 %.2f ms, p95 %.2f ms, p99 %.2f ms, max "
	       "%.2f ms (target p99 <= 10 ms: %s)\n",
	       what, p50, p95, p99, (double)v[n - 1] / 1000.0, p99 <= 10.0 ? "met" : "MISSED");
	cpu_print(what, &cost, true);
	/* Measured in the same stretch, so steadier than the difference with the floor below,
	 * but it leaves out whatever the relay makes the other sessions spend. */
	if (!isnan(own0) && !isnan(own1))
		printf("%s: of the PostgreSQL CPU, the relay's own %zu sessions: %.1f us a "
		       "message\n",
		       what, n_own, (own1 - own0) * 1e6 / (double)committed);
	/* The producers' inserts included: the sources differ by what the relay adds to them. */
	bench_set(b, "load_pg_us", cost.pg_us);
out:
	if (d)
		(void)direct_stop(d, 0, err, sizeof(err));
	proc_relay_stop(b, &rp, what);
	consumer_stop(k);
	db_table_drop(c, table);
	PQfinish(c);
	latency_free(&lat);
	free(commit_us);
	free(rtt_us);
	free(v);
	free(rv);
}

/* The relay under the load, then the same load with no relay at all: what is left of the
 * latency when the relay's own work is taken away (the producers, the broker and the consumer
 * share the machine as before). A target the floor itself misses cannot be met by any relay on
 * this machine at this rate. */
void measure_load(struct bench *b)
{
	char why[96];
	double rate = load_rate(b, why, sizeof(why));
	long batch = b->opt.load_batch > 0 ? b->opt.load_batch : 1;

	double with, alone;

	load_stretch(b, rate, why, batch, false);
	if (bench_interrupted())
		return;
	load_stretch(b, rate, why, batch, true);
	with = bench_get(b, "load_pg_us");
	alone = bench_get(b, "load_floor_pg_us");
	if (!isnan(with) && !isnan(alone))
		printf("%s: PostgreSQL CPU the relay added at this rate: %.1f us a message (%.1f "
		       "with "
		       "it, %.1f for the producers' inserts alone)\n",
		       b->what, with - alone, with, alone);
}
