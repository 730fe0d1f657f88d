/* The relay draining a pre-filled table (drain.h): fill, start the relay, watch the
 * consumer's count and the table until all is delivered and marked, stop; the CPU and WAL
 * of the drain around it. */
#include "bench/drain.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bench/db.h"
#include "bench/mq.h"
#include "bench/proc.h"

/* What the consumer's thread records for drain_run(); read once consumer_received() shows
 * the deliveries it was recorded for. */
struct drain_times {
	int64_t first_us;     /* CLOCK_MONOTONIC of the first delivery */
	long slice;           /* deliveries per 10 %; 0 = no slices */
	int64_t slice_us[10]; /* CLOCK_MONOTONIC of each 10 % boundary */
};

static void on_delivery(const struct consumer_delivery *dv, void *arg)
{
	struct drain_times *t = arg;
	long n = (long)dv->n;

	if (n == 1)
		t->first_us = dv->mono_us;
	if (t->slice > 0 && n % t->slice == 0 && n / t->slice <= 10)
		t->slice_us[n / t->slice - 1] = dv->mono_us;
}

/* The count of the rows not yet dealt with. The lease source marks each row it published;
 * the cursor source marks none: every row at or below its position is dealt with, published
 * or deferred (and a deferred row is unpublished until marked). Before the cursor has
 * written its position, every row counts. */
static void unpublished_sql(const struct bench *b, const char *table, char *sql, size_t len)
{
	if (b->source == BENCH_CURSOR)
		snprintf(
		        sql, len,
		        "SELECT count(*) FROM %s WHERE published_at IS NULL AND (deferred_at IS "
		        "NOT NULL OR seq > coalesce((SELECT position FROM %s_position WHERE stream "
		        "= 'main'), 0))",
		        table, table);
	else
		snprintf(sql, len, "SELECT count(*) FROM %s WHERE published_at IS NULL", table);
}

/* The CPU the relay's sessions have spent so far per message, n messages, into d: each
 * session's and their sum. They began after the drain did, so it is theirs in the drain. */
static void relay_sessions_us(PGconn *c, long n, struct drain *d)
{
	pid_t pids[DB_MAX_RELAY_SESSIONS];
	char names[DB_MAX_RELAY_SESSIONS][DB_APP_NAME_LEN];
	size_t k = db_relay_sessions(c, pids, names);

	d->pg_relay_us = k > 0 ? cpu_pids_s(pids, k) * 1e6 / (double)n : NAN;
	d->n_sessions = 0;
	for (size_t i = 0; i < k; i++) {
		snprintf(d->sessions[i].name, sizeof(d->sessions[i].name), "%s", names[i]);
		d->sessions[i].us = cpu_pids_s(&pids[i], 1) * 1e6 / (double)n;
		d->n_sessions++;
	}
}

/* The drain itself, on c's database: a fresh queue and its consumer, the relay started and
 * watched until n rows are delivered and dealt with, then stopped; the table is the caller's. */
static int drain_body(struct bench *b, const char *what, PGconn *c, const char *table, long n,
                      bool slices, struct drain *d)
{
	struct consumer *k = NULL;
	struct proc_relay rp = { 0 };
	struct drain_times t = { 0 };
	struct cpu_sample ca, cz;
	struct wal_point wa, wz;
	char sql[512], slot[64] = "";
	int64_t t0, deadline, last_print;
	long long left = -1;
	int rc = -1;

	if (mq_fresh_queue(b, what, table) != 0)
		return -1;
	t.slice = slices ? n / 10 : 0;
	if (mq_consume(b, what, table, on_delivery, &t, &k) != 0)
		goto out;
	unpublished_sql(b, table, sql, sizeof(sql));
	/* The drain's WAL stays on disk until pg_waldump has read it, checkpoints or not. */
	wal_hold(c, slot, sizeof(slot));
	wal_mark_stats(c, &wa);
	wal_mark_lsn(c, &wa);
	cpu_sample(&ca, 0);
	t0 = bench_mono_us();
	last_print = t0;
	/* Generous: a relay slower than 500 msgs/s fails rather than hangs the run. */
	deadline = t0 + (60 + n / 500) * 1000000LL;
	if (proc_relay_start(b, &rp, what, table) != 0)
		goto out;
	for (;;) {
		int64_t now = bench_mono_us();
		long got = (long)consumer_received(k);

		if (bench_interrupted()) {
			bench_fail(b, what, "interrupted");
			goto out;
		}
		if (!proc_relay_alive(b, &rp, what))
			goto out;
		if (mq_consumer_check(b, k, what) != 0)
			goto out;
		if (now > deadline) {
			bench_fail(b, what, "timed out: %ld of %ld delivered, %lld unpublished",
			           got, n, left);
			goto out;
		}
		/* Every row is delivered at least once before it can be marked, so the table is
		 * only asked once the consumer has seen n deliveries. */
		if (got >= n) {
			left = db_count(c, sql);
			if (left == 0)
				break;
		}
		if (now - last_print > 10000000) {
			fprintf(stderr, "%s: %ld of %ld delivered after %.0f s\n", what, got, n,
			        (double)(now - t0) / 1e6);
			last_print = now;
		}
		bench_sleep_ms(10);
	}
	d->secs = (double)(bench_mono_us() - t0) / 1e6;
	cpu_sample(&cz, rp.pid);
	relay_sessions_us(c, n, d);
	wal_mark_lsn(c, &wz);
	d->first_s = (double)(t.first_us - t0) / 1e6;
	d->rate = (double)n / d->secs;
	if (slices && t.slice > 0) {
		int64_t prev = t.first_us;

		for (int i = 0; i < 10; i++) {
			double s = (double)(t.slice_us[i] - prev) / 1e6;

			d->slice_rate[i] = s > 0 ? (double)t.slice / s : NAN;
			prev = t.slice_us[i];
		}
	}
	cpu_cost(&ca, &cz, n, &d->cpu);
	proc_relay_stop(b, &rp, what);
	d->hwm_kb = rp.hwm_kb;
	d->maxrss_kb = rp.maxrss_kb;
	/* A backend reports its WAL counts when it ends, shortly after the relay closed it. */
	bench_sleep_ms(200);
	wal_mark_stats(c, &wz);
	wal_cost(c, &wa, &wz, n, true, &d->wal);
	rc = 0;
out:
	if (rp.pid > 0) {
		proc_relay_stop(b, &rp, what);
		d->hwm_kb = rp.hwm_kb;
		d->maxrss_kb = rp.maxrss_kb;
	}
	wal_release(c, slot);
	consumer_stop(k);
	return rc;
}

int drain_run(struct bench *b, const char *what, const char *table, long n, int keys, bool slices,
              struct drain *d)
{
	PGconn *c = db_open(b, what);
	struct wal_point fa, fz;
	int rc = -1;

	memset(d, 0, sizeof(*d));
	if (!c)
		return -1;
	if (db_table_fresh(b, c, what, table) != 0)
		goto out;
	wal_mark_stats(c, &fa);
	wal_mark_lsn(c, &fa);
	if (db_table_fill(b, c, what, table, n, keys) != 0)
		goto out;
	wal_mark_lsn(c, &fz);
	wal_mark_stats(c, &fz);
	wal_cost(c, &fa, &fz, n, false, &d->fill_wal);
	rc = drain_body(b, what, c, table, n, slices, d);
out:
	db_table_drop(c, table);
	PQfinish(c);
	return rc;
}

int drain_existing(struct bench *b, const char *what, const char *table, long n, struct drain *d)
{
	PGconn *c = db_open(b, what);
	int rc;

	memset(d, 0, sizeof(*d));
	if (!c)
		return -1;
	rc = drain_body(b, what, c, table, n, false, d);
	PQfinish(c);
	return rc;
}

void drain_print_cost(const char *what, const struct drain *d, long n)
{
	char note[96];

	cpu_print(what, &d->cpu, true);
	if (!isnan(d->pg_relay_us)) {
		printf("%s: postgres cpu per message in the relay's sessions: %.1f us (", what,
		       d->pg_relay_us);
		for (size_t i = 0; i < d->n_sessions; i++)
			printf("%s%s %.1f us", i ? ", " : "", d->sessions[i].name,
			       d->sessions[i].us);
		printf("); the server's other processes: %.1f us\n", d->cpu.pg_us - d->pg_relay_us);
	}
	wal_print(what, "message", NULL, &d->wal);
	snprintf(note, sizeof(note), "one INSERT ... SELECT of %ld rows, then VACUUM ANALYZE", n);
	wal_print(what, "pre-filled row", note, &d->fill_wal);
}
