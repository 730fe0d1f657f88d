/* The producers' cost of the wake-up: PRODUCERS connections committing single-row inserts for
 * phase_s seconds with the relay running, once with the wake-up trigger and once without;
 * the ratio of their commit rates is what the trigger costs an application. The same with the
 * connections alternating between the two tables (interleaved()), which drift cannot tilt. And
 * the trigger's own cost per INSERT statement, in server time, with the two tables interleaved
 * in one session (trigger_cost()). */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"
#include "bench/cpu.h"
#include "bench/db.h"
#include "bench/mq.h"
#include "bench/proc.h"
#include "bench/drive/pgsql.h"

#define PRODUCERS 8 /* threads, each on its own connection */

/* Commits per block: a producer on two tables (interleaved()) alternates between them this
 * many commits at a time. */
#define IL_BLOCK 50

struct producer {
	pthread_t thread;
	const char *pg;
	const char *const *tables; /* one, or two to alternate between */
	int ntables;
	int index;
	atomic_int *go; /* 0 wait, 1 run, 2 stop */
	atomic_int *ready;
	atomic_int backend; /* its session's server process; 0 until connected */
	long commits[2];    /* per table; on two tables, in whole blocks only */
	int64_t us[2];      /* time spent in each table's whole blocks */
	char err[256];
};

static const char *const stmt_names[2] = { "ins0", "ins1" };

static void *producer_main(void *arg)
{
	struct producer *pr = arg;
	PGconn *c = pgsql_connect(pr->pg, pr->err, sizeof(pr->err));
	char id[48], body[BENCH_BODY_LEN + 1];
	const char *params[3];
	long n = 0;

	if (!c)
		goto out;
	atomic_store(&pr->backend, PQbackendPID(c));
	for (int t = 0; t < pr->ntables; t++)
		if (db_prepare_insert(c, stmt_names[t], pr->tables[t], pr->err, sizeof(pr->err)) !=
		    0)
			goto out;
	memset(body, 'x', BENCH_BODY_LEN);
	body[BENCH_BODY_LEN] = '\0';
	params[2] = body;
	atomic_fetch_add(pr->ready, 1);
	while (atomic_load(pr->go) == 0)
		bench_sleep_ms(1);
	/* Half the producers start on each table. */
	for (long block = pr->index; atomic_load(pr->go) == 1; block++) {
		int t = (int)(block % pr->ntables), done = 0;
		int64_t t0 = bench_mono_us();

		params[1] = pr->tables[t];
		for (; done < IL_BLOCK && atomic_load(pr->go) == 1; done++) {
			PGresult *r;

			snprintf(id, sizeof(id), "p%d-%ld", pr->index, ++n);
			params[0] = id;
			r = PQexecPrepared(c, stmt_names[t], 3, params, NULL, NULL, 0);
			if (PQresultStatus(r) != PGRES_COMMAND_OK) {
				snprintf(pr->err, sizeof(pr->err), "%s", PQerrorMessage(c));
				PQclear(r);
				goto out;
			}
			PQclear(r);
		}
		/* On two tables a block cut short by the end is not counted. */
		if (done == IL_BLOCK || pr->ntables == 1) {
			pr->commits[t] += done;
			pr->us[t] += bench_mono_us() - t0;
		}
	}
out:
	PQfinish(c);
	atomic_fetch_add(pr->ready, 1000); /* counts as ready even on failure: nobody waits */
	return NULL;
}

/* Drains the notifications that reached the listener so far; returns how many. */
static long count_notifies(PGconn *c)
{
	PGnotify *n;
	long count = 0;

	if (!c || !PQconsumeInput(c))
		return 0;
	while ((n = PQnotifies(c)) != NULL) {
		count++;
		PQfreemem(n);
	}
	return count;
}

/* PostgreSQL's CPU while the producers committed, by session: theirs and the relays'. */
struct session_cpu {
	PGconn *c;          /* to find the relays' sessions */
	double producers_s; /* NAN when a session's process could not be read */
	double relays_s;    /* NAN as well without relay sessions */
};

/* Prints " <label> <us> us" for s seconds over n commits, or " <label> unknown". */
static void session_us(const char *label, double s, long n)
{
	if (isnan(s) || n <= 0)
		printf(" %s unknown", label);
	else
		printf(" %s %.1f us", label, s * 1e6 / (double)n);
}

/* Starts PRODUCERS threads on tables (ntables: one, or two to alternate between), lets them
 * commit for run_us once every one is connected and a second has passed (for a relay to connect
 * and go idle, so that the run starts as production would), and joins them. While they run,
 * *notifies counts what reached listener (when there is one), and sc (when not NULL) what
 * the producers' and the relays' sessions spent meanwhile. False after bench_fail(). */
static bool run_producers(struct bench *b, struct producer *pr, const char *const *tables,
                          int ntables, int64_t run_us, PGconn *listener, long *notifies,
                          struct session_cpu *sc)
{
	pid_t mine[PRODUCERS], relays[DB_MAX_RELAY_SESSIONS];
	size_t n_relays = 0;
	double mine0 = NAN, relays0 = NAN;
	const char *what = b->what;
	atomic_int go, ready;
	int64_t t0, deadline;
	int started = 0;
	bool ok = true;

	memset(pr, 0, PRODUCERS * sizeof(*pr));
	for (int i = 0; i < PRODUCERS; i++)
		atomic_init(&pr[i].backend, 0);
	atomic_init(&go, 0);
	atomic_init(&ready, 0);
	for (; started < PRODUCERS; started++) {
		pr[started].pg = b->opt.pg;
		pr[started].tables = tables;
		pr[started].ntables = ntables;
		pr[started].index = started;
		pr[started].go = &go;
		pr[started].ready = &ready;
		if (pthread_create(&pr[started].thread, NULL, producer_main, &pr[started]) != 0) {
			bench_fail(b, what, "could not start producer threads");
			ok = false;
			break;
		}
	}
	deadline = bench_mono_us() + 30000000;
	while (ok && atomic_load(&ready) < PRODUCERS && bench_mono_us() < deadline)
		bench_sleep_ms(5);
	bench_sleep_ms(ok ? 1000 : 0);
	count_notifies(listener);
	*notifies = 0;
	if (sc) {
		for (int i = 0; i < PRODUCERS; i++)
			mine[i] = (pid_t)atomic_load(&pr[i].backend);
		mine0 = cpu_pids_s(mine, PRODUCERS);
		n_relays = db_relay_sessions(sc->c, relays, NULL);
		relays0 = cpu_pids_s(relays, n_relays);
	}
	t0 = bench_mono_us();
	atomic_store(&go, ok ? 1 : 2);
	while (ok && bench_mono_us() - t0 < run_us && !bench_interrupted()) {
		bench_sleep_ms(10);
		*notifies += count_notifies(listener);
	}
	if (sc) {
		sc->producers_s = cpu_pids_s(mine, PRODUCERS) - mine0;
		sc->relays_s = cpu_pids_s(relays, n_relays) - relays0;
	}
	atomic_store(&go, 2);
	for (int i = 0; i < started; i++) {
		pthread_join(pr[i].thread, NULL);
		if (pr[i].err[0] && ok) {
			bench_fail(b, what, "producer %d: %s", i, pr[i].err);
			ok = false;
		}
	}
	/* Commits still in flight at the end may notify a little later. */
	bench_sleep_ms(50);
	*notifies += count_notifies(listener);
	return ok && !bench_interrupted();
}

/* One phase: fresh table (trigger dropped when !wakeup), a relay draining it as in
 * production (unless !relay), PRODUCERS threads committing for phase_s seconds. Returns
 * commits/s or NAN; *notifies gets how many producer commits sent a NOTIFY (a listener of our
 * own counts them), which tells why a wake-up costs what it costs. */
static double phase(struct bench *b, const char *table, bool wakeup, bool relay, long *notifies)
{
	const char *what = b->what;
	PGconn *c = db_open(b, what), *listener = NULL;
	struct consumer *k = NULL;
	struct proc_relay rp = { 0 };
	struct producer pr[PRODUCERS];
	char sql[256];
	double rate = NAN;
	long total = 0;
	int64_t us = 0;

	if (!c)
		return NAN;
	if (db_table_fresh(b, c, what, table) != 0)
		goto out;
	/* Every trigger a user made, whatever the schema calls the wake-up. */
	if (!wakeup && db_drop_triggers(b, c, what, table, NULL) != 0)
		goto out;
	listener = db_open(b, what);
	if (!listener)
		goto out;
	snprintf(sql, sizeof(sql), "LISTEN %s", table);
	if (db_exec(b, listener, what, sql) != 0)
		goto out;
	if (relay && (mq_fresh_queue(b, what, table) != 0 ||
	              mq_consume(b, what, table, NULL, NULL, &k) != 0 ||
	              proc_relay_start(b, &rp, what, table) != 0))
		goto out;
	if (!run_producers(b, pr, &table, 1, (int64_t)b->opt.phase_s * 1000000, listener, notifies,
	                   NULL) ||
	    (relay && !proc_relay_alive(b, &rp, what)))
		goto out;
	/* Each producer's own time: from its first commit to its last, as it saw them. */
	for (int i = 0; i < PRODUCERS; i++) {
		total += pr[i].commits[0];
		us += pr[i].us[0];
	}
	if (us > 0)
		rate = (double)total / ((double)us / 1e6) * PRODUCERS;
out:
	PQfinish(listener);
	proc_relay_stop(b, &rp, what);
	consumer_stop(k);
	db_table_drop(c, table);
	PQfinish(c);
	return rate;
}

/* Rounds of with and without alternating, in the order with-without, then without-with, so
 * that a drift of the machine during the run (autovacuum, checkpoints, a neighbour) does not
 * favour whichever phase comes first. The mean of each; false when a phase failed. */
static bool rounds_of(struct bench *b, int rounds, bool relay, double *with, double *without)
{
	*with = *without = 0;
	for (int r = 0; r < rounds; r++) {
		long nw = 0, nwo = 0;
		double a = NAN, c = NAN;

		if (r % 2 == 0) {
			a = phase(b, "bench_pc_with", true, relay, &nw);
			if (!isnan(a))
				c = phase(b, "bench_pc_without", false, relay, &nwo);
		} else {
			c = phase(b, "bench_pc_without", false, relay, &nwo);
			if (!isnan(c))
				a = phase(b, "bench_pc_with", true, relay, &nw);
		}
		if (isnan(a) || isnan(c))
			return false;
		printf("%s: round %d: %d connections, single-row inserts, %d s each, %s: "
		       "with wake-up %.0f commits/s (%ld notifying commits), without %.0f "
		       "commits/s (%ld)\n",
		       b->what, r + 1, PRODUCERS, b->opt.phase_s,
		       relay ? "relay running" : "no relay", a, nw, c, nwo);
		*with += a;
		*without += c;
	}
	*with /= rounds;
	*without /= rounds;
	return true;
}

/* The trigger's own cost per INSERT statement, in server time: one session inserts
 * TC_ROUNDS x 2 blocks of TC_BLOCK single-row statements (the producers' statement) into a table
 * with the wake-up and one without, alternating block by block (the order swapped every round),
 * and clock_timestamp() around each block. Interleaved that finely, a drift of the machine
 * falls on both alike: the commit-rate phases above move by a fifth between rounds, this by a
 * few percent. Nobody holds the wake-up lock, so the trigger's function does not notify: what
 * every producer pays while relays are busy.
 * Twice: in one transaction (trigger_us), and committing after each statement as producers do
 * (trigger_tx_us). PL/pgSQL sets a function's expressions up anew in each transaction, so the
 * second is what a producer pays; the first has no commit in it, and a trigger deferred to
 * commit (the wake-up before the advisory lock was one) shows there as nothing. */
#define TC_ROUNDS 40
#define TC_BLOCK  500

/* A float8 the server printed, into *out; false when it is not one. */
static bool parse_seconds(const char *s, double *out)
{
	char *end;

	errno = 0;
	*out = strtod(s, &end);
	return errno == 0 && end != s && *end == '\0';
}

/* One run of the interleaved blocks (commit: after each statement); server time per statement
 * into *with_us and *without_us. False after bench_fail(). */
static bool trigger_blocks(struct bench *b, PGconn *c, bool commit, double *with_us,
                           double *without_us)
{
	const char *what = b->what, *end = commit ? " COMMIT;" : "";
	char sql[4096];
	PGresult *r = NULL;
	bool ok = false;

	snprintf(sql, sizeof(sql),
	         "DO $tc$ DECLARE body text := repeat('x', %d); t0 timestamptz;"
	         " w float8 := 0; wo float8 := 0; n bigint := 0;"
	         " BEGIN FOR r IN 1..%d LOOP FOR half IN 0..1 LOOP"
	         " t0 := clock_timestamp();"
	         " IF (half + r) %% 2 = 0 THEN FOR i IN 1..%d LOOP n := n + 1;"
	         " INSERT INTO bench_tc_with (id, exchange_name, routing_key, body)"
	         " VALUES ('tc%d-' || n, '', 'k', body) ON CONFLICT (id) DO NOTHING;%s"
	         " END LOOP; w := w + extract(epoch FROM clock_timestamp() - t0);"
	         " ELSE FOR i IN 1..%d LOOP n := n + 1;"
	         " INSERT INTO bench_tc_without (id, exchange_name, routing_key, body)"
	         " VALUES ('tc%d-' || n, '', 'k', body) ON CONFLICT (id) DO NOTHING;%s"
	         " END LOOP; wo := wo + extract(epoch FROM clock_timestamp() - t0);"
	         " END IF; END LOOP; END LOOP;"
	         " DELETE FROM bench_tc_result; INSERT INTO bench_tc_result VALUES (w, wo); END "
	         "$tc$",
	         BENCH_BODY_LEN, TC_ROUNDS, TC_BLOCK, commit, end, TC_BLOCK, commit, end);
	if (db_exec(b, c, what, sql) != 0)
		return false;
	r = PQexec(c, "SELECT with_s, without_s FROM bench_tc_result");
	if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
		bench_fail(b, what, "could not read the trigger's cost: %s", PQerrorMessage(c));
		goto out;
	}
	if (!parse_seconds(PQgetvalue(r, 0, 0), with_us) ||
	    !parse_seconds(PQgetvalue(r, 0, 1), without_us)) {
		bench_fail(b, what, "unreadable times for the trigger's cost: '%s', '%s'",
		           PQgetvalue(r, 0, 0), PQgetvalue(r, 0, 1));
		goto out;
	}
	*with_us *= 1e6 / (TC_ROUNDS * TC_BLOCK);
	*without_us *= 1e6 / (TC_ROUNDS * TC_BLOCK);
	ok = true;
out:
	PQclear(r);
	return ok;
}

static void trigger_cost(struct bench *b)
{
	const char *what = b->what;
	PGconn *c = db_open(b, what);
	double with_us, without_us;

	if (!c)
		return;
	if (db_table_fresh(b, c, what, "bench_tc_with") != 0 ||
	    db_table_fresh(b, c, what, "bench_tc_without") != 0 ||
	    db_drop_triggers(b, c, what, "bench_tc_without", NULL) != 0 ||
	    db_exec(b, c, what,
	            "CREATE TEMP TABLE bench_tc_result (with_s float8, without_s float8)") != 0)
		goto out;
	for (int commit = 0; commit < 2; commit++) {
		if (!trigger_blocks(b, c, commit, &with_us, &without_us))
			goto out;
		bench_set(b, commit ? "trigger_tx_us" : "trigger_us", with_us - without_us);
		printf("%s: the trigger's own cost (one session, %d single-row INSERT"
		       " statements into each table, interleaved %d at a time, server time, %s):"
		       " with wake-up %.1f us, without %.1f us per statement (+%.1f us, %+.0f "
		       "%%)\n",
		       b->what, TC_ROUNDS * TC_BLOCK, TC_BLOCK,
		       commit ? "a commit after each" : "one transaction, no commit", with_us,
		       without_us, with_us - without_us,
		       100.0 * (with_us - without_us) / without_us);
	}
out:
	db_table_drop(c, "bench_tc_with");
	db_table_drop(c, "bench_tc_without");
	PQfinish(c);
}

/* The same commit rates, interleaved: every producer alternates between a table with the
 * wake-up and one without, IL_BLOCK commits at a time (half of them starting on each), and sums
 * its time in each. The phases above run each table for phase_s seconds on its own, and the
 * machine drifts between them by more than the trigger costs; here a drift falls on both tables
 * alike, as in trigger_cost(), but the figure is commits, the producer's whole round trip. With
 * relay, a relay drains each table (the one without the wake-up by polling), both running all
 * the time: what the trigger costs producers beside busy relays, not what a woken relay's small
 * batches cost the shared cores, which the phases above include. */
static const char *const il_tables[2] = { "bench_pi_with", "bench_pi_without" };

/* One interleaved run of 2 x phase_s seconds; the ratio with / without, or NAN. */
static double interleaved(struct bench *b, bool relay, const char *how)
{
	const char *what = b->what;
	PGconn *c = db_open(b, what);
	struct consumer *k[2] = { NULL, NULL };
	struct proc_relay rp[2] = { { 0 }, { 0 } };
	struct producer pr[PRODUCERS];
	struct session_cpu sc = { .c = c };
	double rate[2], ratio = NAN;
	long commits[2] = { 0, 0 }, notifies;
	int64_t us[2] = { 0, 0 };

	if (!c)
		return NAN;
	for (int t = 0; t < 2; t++)
		if (db_table_fresh(b, c, what, il_tables[t]) != 0)
			goto out;
	if (db_drop_triggers(b, c, what, il_tables[1], NULL) != 0)
		goto out;
	for (int t = 0; relay && t < 2; t++)
		if (mq_fresh_queue(b, what, il_tables[t]) != 0 ||
		    mq_consume(b, what, il_tables[t], NULL, NULL, &k[t]) != 0 ||
		    proc_relay_start(b, &rp[t], what, il_tables[t]) != 0)
			goto out;
	if (!run_producers(b, pr, il_tables, 2, (int64_t)b->opt.phase_s * 2000000, NULL, &notifies,
	                   &sc))
		goto out;
	for (int t = 0; relay && t < 2; t++)
		if (!proc_relay_alive(b, &rp[t], what))
			goto out;
	for (int i = 0; i < PRODUCERS; i++)
		for (int t = 0; t < 2; t++) {
			commits[t] += pr[i].commits[t];
			us[t] += pr[i].us[t];
		}
	if (us[0] <= 0 || us[1] <= 0)
		goto out;
	/* Per connection, times the connections: what they commit together while all run. */
	for (int t = 0; t < 2; t++)
		rate[t] = (double)commits[t] / ((double)us[t] / 1e6) * PRODUCERS;
	ratio = rate[0] / rate[1];
	printf("%s: interleaved, %d connections alternating %d commits at a time for %d s,"
	       " %s%s: with wake-up %.0f commits/s (%ld commits), without %.0f commits/s (%ld);"
	       " ratio %.2f (target >= 0.95: %s)\n",
	       b->what, PRODUCERS, IL_BLOCK, b->opt.phase_s * 2,
	       relay ? "a relay on each table" : "no relay", how, rate[0], commits[0], rate[1],
	       commits[1], ratio, ratio >= 0.95 ? "met" : "MISSED");
	/* Where the database's time went: with relays keeping up, their sessions can cost about
	 * what the producers' own do (README, Performance). */
	printf("%s: interleaved, %s%s: database CPU per commit:", b->what,
	       relay ? "a relay on each table" : "no relay", how);
	session_us("the producers' sessions", sc.producers_s, commits[0] + commits[1]);
	if (relay) {
		printf(",");
		session_us("the relays'", sc.relays_s, commits[0] + commits[1]);
	}
	printf("\n");
out:
	for (int t = 0; t < 2; t++) {
		proc_relay_stop(b, &rp[t], what);
		consumer_stop(k[t]);
		db_table_drop(c, il_tables[t]);
	}
	PQfinish(c);
	return ratio;
}

/* Turns fsync and full_page_writes on (on) or back to the server's configuration files (off)
 * and waits until a new session sees the change. -1 after bench_fail(what). */
static int durable_commits(struct bench *b, PGconn *c, bool on)
{
	static const char *const names[] = { "fsync", "full_page_writes" };
	const char *want = on ? "on" : "off";
	char sql[64];

	for (int i = 0; i < 2; i++) { /* one statement each: ALTER SYSTEM takes no transaction */
		snprintf(sql, sizeof(sql), "ALTER SYSTEM %s %s%s", on ? "SET" : "RESET", names[i],
		         on ? " = on" : "");
		if (db_exec(b, c, b->what, sql) != 0)
			return -1;
	}
	if (db_exec(b, c, b->what, "SELECT pg_reload_conf()") != 0)
		return -1;
	/* The postmaster rereads its files when the signal reaches it; new sessions then start
	 * with the new values. */
	for (int i = 0; i < 600 && !bench_interrupted(); i++) {
		PGconn *n = db_open(b, b->what);
		char fs[8] = "";

		if (!n)
			return -1;
		db_show(n, "SHOW fsync", fs, sizeof(fs));
		PQfinish(n);
		if (strcmp(fs, want) == 0)
			return 0;
		usleep(50 * 1000);
	}
	if (bench_interrupted())
		return 0; /* the reset went out; the run is ending */
	bench_fail(b, b->what, "the server's fsync did not turn %s after a reload", want);
	return -1;
}

#define DURABLE ", commits flushed to disk (fsync and full_page_writes on)"

/* The interleaved runs again with every commit flushed to disk, as a production server does:
 * the benchmark's servers run with fsync off, which makes a commit cheap and the trigger a
 * larger share of it. Only on a server whose fsync is off by its configuration files (not by
 * ALTER SYSTEM), so that resetting gives it back exactly; otherwise the runs above already
 * flushed their commits, or the server is not the benchmark's to change. */
static void interleaved_durable(struct bench *b)
{
	PGconn *c = db_open(b, b->what);
	long long ok;

	if (!c)
		return;
	ok = db_count(c, "SELECT CASE WHEN current_setting('is_superuser') = 'on' THEN count(*) "
	                 "FILTER (WHERE name = 'fsync' AND setting = 'off')"
	                 " - count(*) FILTER (WHERE coalesce(sourcefile, '') LIKE"
	                 " '%postgresql.auto.conf') END"
	                 " FROM pg_settings WHERE name IN ('fsync', 'full_page_writes')");
	if (ok != 1) {
		printf("%s: interleaved with commits flushed to disk: not measured (the "
		       "server's fsync is on already or set by ALTER SYSTEM, or this session is "
		       "not a superuser)\n",
		       b->what);
		PQfinish(c);
		return;
	}
	if (durable_commits(b, c, true) == 0) {
		bench_set(b, "producer_il_durable_ratio", interleaved(b, false, DURABLE));
		bench_set(b, "producer_il_durable_relay_ratio", interleaved(b, true, DURABLE));
	}
	if (durable_commits(b, c, false) != 0)
		bench_fail(b, b->what,
		           "fsync and full_page_writes may still be on: run ALTER "
		           "SYSTEM RESET for both and reload");
	PQfinish(c);
}

/* As in production, with the relay draining the table (four rounds in a full run: two moved
 * the ratio between 0.60 and 0.92 from run to run). With the wake-up the relay also answers a
 * trickle at once, in small batches that cost the shared cores more per row than the large
 * batches it drains after a poll interval without it; so the trigger's own cost is measured
 * apart too, with no relay (two rounds). */
void measure_producer(struct bench *b)
{
	int rounds = b->opt.quick ? 1 : 4;
	double with, without, ratio, alone_with, alone_without, alone;

	if (!rounds_of(b, rounds, true, &with, &without) ||
	    !rounds_of(b, rounds > 1 ? rounds / 2 : 1, false, &alone_with, &alone_without))
		return;
	ratio = with / without;
	alone = alone_with / alone_without;
	bench_set(b, "producer_with", with);
	bench_set(b, "producer_without", without);
	bench_set(b, "producer_ratio", ratio);
	bench_set(b, "producer_alone_ratio", alone);
	bench_set(b, "producer_il_ratio", interleaved(b, false, ""));
	bench_set(b, "producer_il_relay_ratio", interleaved(b, true, ""));
	interleaved_durable(b);
	printf("%s: relay running: with wake-up %.0f commits/s, without %.0f commits/s; "
	       "ratio %.2f (target >= 0.95: %s)\n",
	       b->what, with, without, ratio, ratio >= 0.95 ? "met" : "MISSED");
	printf("%s: no relay (the trigger alone): with %.0f commits/s, without %.0f "
	       "commits/s; ratio %.2f\n",
	       b->what, alone_with, alone_without, alone);
	trigger_cost(b);
}
