/* The soak's producers: threads on connections of their own that commit outbox rows at a
 * steady rate in overlapping transactions, keyed ones under a per-key advisory lock (as an
 * application updating the key's aggregate would), unkeyed ones alone or beside them. A
 * transaction cut by a database restart is resolved by looking its ids up afterwards: only
 * ids the producer knows committed count. */
#include "tests/soak/producer.h"

#include <inttypes.h>
#include <libpq-fe.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/harness.h"

#define TXN_MAX_ROWS 16
/* How long a producer keeps trying to learn the outcome of an interrupted COMMIT. */
#define RESOLVE_TIMEOUT_MS 300000
/* Behind schedule by more than this (a restart), the schedule restarts from now: the rate
 * stays steady instead of bursting to catch up. */
#define MAX_BEHIND_MS 1000

struct producer {
	int index;
	pthread_t thread;
	uint64_t rng;
	double next_at_ms; /* when the next transaction is due */
	PGconn *c;
};

static struct {
	char conninfo[1024];
	char table[128];
	char exchange[128];
	int n, rate, keys;
	atomic_bool stop;
	atomic_size_t failed;
	atomic_size_t resolved_in, resolved_out; /* interrupted transactions: committed, not */
	struct producer p[SOAK_MAX_PRODUCERS];
} g;

static uint64_t next_rand(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static bool exec_ok(PGconn *c, const char *sql)
{
	PGresult *res = PQexec(c, sql);
	bool ok = PQresultStatus(res) == PGRES_COMMAND_OK;

	PQclear(res);
	return ok;
}

static void sleep_us(int64_t us)
{
	harness_sleep_ms(us / 1000);
}

/* A connection, or NULL after the stop flag or a while of failures. */
static bool ensure_conn(struct producer *p)
{
	if (p->c != NULL && PQstatus(p->c) == CONNECTION_OK)
		return true;
	PQfinish(p->c);
	p->c = PQconnectdb(g.conninfo);
	if (PQstatus(p->c) != CONNECTION_OK) {
		PQfinish(p->c);
		p->c = NULL;
		return false;
	}
	PQclear(PQexec(p->c, "SET client_min_messages = warning"));
	return true;
}

/* The rows of one transaction: who they are and, once inserted, their seqs. */
struct txn {
	uint64_t first; /* producer row number of the first */
	size_t n;
	int16_t key[TXN_MAX_ROWS];
	int64_t seq[TXN_MAX_ROWS];
};

/* Fills t: keyed only (40 %), keyed and unkeyed (20 %) or unkeyed only (40 %); keyed rows are
 * grouped by key in ascending key order, 1-2 rows a key, 1-3 keys; 1-4 unkeyed rows. */
static void plan_txn(struct producer *p, struct txn *t)
{
	unsigned kind = (unsigned)(next_rand(&p->rng) % 10);
	size_t n = 0;

	if (kind < 6) {
		int nk = 1 + (int)(next_rand(&p->rng) % 3), chosen[3];

		for (int i = 0; i < nk; i++) {
			bool dup;

			do {
				chosen[i] = (int)(next_rand(&p->rng) % (uint64_t)g.keys);
				dup = false;
				for (int j = 0; j < i; j++)
					dup = dup || chosen[j] == chosen[i];
			} while (dup);
		}
		/* Ascending: two transactions never wait for each other's locks in a cycle. */
		for (int i = 1; i < nk; i++)
			for (int j = i; j > 0 && chosen[j - 1] > chosen[j]; j--) {
				int x = chosen[j];

				chosen[j] = chosen[j - 1];
				chosen[j - 1] = x;
			}
		for (int i = 0; i < nk; i++) {
			int per = 1 + (int)(next_rand(&p->rng) % 2);

			for (int r = 0; r < per; r++)
				t->key[n++] = (int16_t)chosen[i];
		}
	}
	if (kind >= 4) {
		int nu = 1 + (int)(next_rand(&p->rng) % 4);

		for (int r = 0; r < nu; r++)
			t->key[n++] = -1;
	}
	t->n = n;
	t->first = soak_rows_reserve(p->index, n, t->key);
}

/* Runs the transaction once: BEGIN, per key the advisory lock then its rows, then the
 * unkeyed rows, a short random pause (so that transactions overlap and commit out of seq
 * order across keys), COMMIT. Returns 0 committed, 1 certainly not committed, 2 unknown
 * (the COMMIT was sent and no answer came). *commit_ms gets when COMMIT was sent. */
static int run_txn(struct producer *p, struct txn *t, int64_t *commit_ms)
{
	char sql[512], id[32], body[160], key[16];
	const char *params[5];
	size_t i = 0;
	PGresult *res;

	if (!exec_ok(p->c, "BEGIN"))
		return 1;
	while (i < t->n) {
		int k = t->key[i];

		if (k >= 0 && (i == 0 || t->key[i - 1] != k)) {
			/* The key's lock, held to COMMIT: within a key, insert order (seq) is commit
			 * order, as for an application that updates the key's aggregate. */
			snprintf(sql, sizeof(sql), "SELECT pg_advisory_xact_lock(736411, %d)", k);
			res = PQexec(p->c, sql);
			if (PQresultStatus(res) != PGRES_TUPLES_OK) {
				PQclear(res);
				return 1;
			}
			PQclear(res);
		}
		soak_row_id(id, sizeof(id), p->index, t->first + i);
		snprintf(key, sizeof(key), "k%02d", k);
		snprintf(body, sizeof(body), "{\"producer\":%d,\"n\":%" PRIu64 ",\"key\":%s%s%s}",
		         p->index, t->first + i, k >= 0 ? "\"" : "", k >= 0 ? key : "null",
		         k >= 0 ? "\"" : "");
		params[0] = id;
		params[1] = g.exchange;
		params[2] = k >= 0 ? "soak.keyed" : "soak.unkeyed";
		params[3] = body;
		params[4] = k >= 0 ? key : NULL;
		snprintf(sql, sizeof(sql),
		         "INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key)"
		         " VALUES ($1, $2, $3, $4, $5) RETURNING seq",
		         g.table);
		res = PQexecParams(p->c, sql, 5, NULL, params, NULL, NULL, 0);
		if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
			PQclear(res);
			return 1;
		}
		t->seq[i] = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
		PQclear(res);
		i++;
		if (next_rand(&p->rng) % 4 == 0)
			sleep_us((int64_t)(next_rand(&p->rng) % 3000));
	}
	sleep_us((int64_t)(next_rand(&p->rng) % 5000));
	*commit_ms = soak_ms();
	res = PQexec(p->c, "COMMIT");
	if (PQresultStatus(res) == PGRES_COMMAND_OK) {
		PQclear(res);
		return 0;
	}
	PQclear(res);
	/* An error with the connection still up rolled the transaction back; a lost connection
	 * leaves the outcome unknown. */
	return PQstatus(p->c) == CONNECTION_OK ? 1 : 2;
}

/* After an interrupted COMMIT: looks the ids up on a new connection. 0 all committed (seqs
 * filled), 1 none, -1 never learned (stop or timeout). */
static int resolve(struct producer *p, struct txn *t)
{
	int64_t deadline = harness_now_ms() + RESOLVE_TIMEOUT_MS;
	char ids[TXN_MAX_ROWS * 16 + 4], sql[512], id[32];
	size_t len = 0;

	ids[len++] = '{';
	for (size_t i = 0; i < t->n; i++) {
		soak_row_id(id, sizeof(id), p->index, t->first + i);
		len += (size_t)snprintf(ids + len, sizeof(ids) - len, "%s%s", i ? "," : "", id);
	}
	snprintf(ids + len, sizeof(ids) - len, "}");
	snprintf(sql, sizeof(sql), "SELECT id, seq FROM %s WHERE id = ANY($1::text[]) ORDER BY id",
	         g.table);
	while (harness_now_ms() < deadline) {
		const char *params[1] = { ids };
		PGresult *res;
		int n;

		if (!ensure_conn(p)) {
			harness_sleep_ms(200);
			continue;
		}
		res = PQexecParams(p->c, sql, 1, NULL, params, NULL, NULL, 0);
		if (PQresultStatus(res) != PGRES_TUPLES_OK) {
			PQclear(res);
			harness_sleep_ms(200);
			continue;
		}
		n = PQntuples(res);
		if (n == 0) {
			PQclear(res);
			return 1;
		}
		if ((size_t)n != t->n) {
			PQclear(res);
			soak_fail(CHECK_HARNESS,
			          "producer %d: %d of %zu rows of one transaction committed",
			          p->index, n, t->n);
			return -1;
		}
		/* Ids sort like row numbers (fixed width), so row i is result i. */
		for (int i = 0; i < n; i++)
			t->seq[i] = strtoll(PQgetvalue(res, i, 1), NULL, 10);
		PQclear(res);
		return 0;
	}
	return -1;
}

/* Waits until the next transaction is due; false when told to stop. */
static bool pace(struct producer *p, size_t rows)
{
	double per_row_ms = 1000.0 * g.n / g.rate;
	double now = (double)soak_ms();

	if (now - p->next_at_ms > MAX_BEHIND_MS)
		p->next_at_ms = now;
	while (!atomic_load(&g.stop) && (double)soak_ms() < p->next_at_ms)
		harness_sleep_ms(p->next_at_ms - (double)soak_ms() > 50
		                         ? 50
		                         : (int64_t)(p->next_at_ms - (double)soak_ms()) + 1);
	p->next_at_ms += per_row_ms * (double)rows;
	return !atomic_load(&g.stop);
}

static void *producer_main(void *arg)
{
	struct producer *p = arg;

	p->next_at_ms = (double)soak_ms();
	while (!atomic_load(&g.stop)) {
		struct txn t = { 0 };
		int64_t commit_ms = 0;
		int rc;

		plan_txn(p, &t);
		if (!pace(p, t.n))
			break; /* reserved, never committed: not counted */
		for (;;) {
			if (!ensure_conn(p)) {
				harness_sleep_ms(200);
				if (atomic_load(&g.stop))
					break;
				continue;
			}
			rc = run_txn(p, &t, &commit_ms);
			if (rc != 0) {
				/* Whatever went wrong (a restart, most likely), the table says whether
				 * the ids are in: a transaction rolled back on a live connection, or
				 * ended with the server, is never half there. */
				if (PQstatus(p->c) == CONNECTION_OK) {
					exec_ok(p->c, "ROLLBACK");
				} else {
					PQfinish(p->c);
					p->c = NULL;
				}
				harness_sleep_ms(100);
				rc = resolve(p, &t);
				if (rc >= 0)
					atomic_fetch_add(rc == 0 ? &g.resolved_in : &g.resolved_out,
					                 1);
				if (rc == 1)
					continue;
				if (rc < 0) {
					atomic_fetch_add(&g.failed, 1);
					break;
				}
			}
			soak_rows_committed(p->index, t.first, t.n, t.seq, commit_ms);
			break;
		}
	}
	PQfinish(p->c);
	p->c = NULL;
	return NULL;
}

void producers_start(const char *conninfo, const char *table, const char *exchange, int n, int rate,
                     int keys, uint64_t seed)
{
	g.keys = keys;
	snprintf(g.conninfo, sizeof(g.conninfo), "%s", conninfo);
	snprintf(g.table, sizeof(g.table), "%s", table);
	snprintf(g.exchange, sizeof(g.exchange), "%s", exchange);
	g.n = n;
	g.rate = rate;
	atomic_init(&g.stop, false);
	atomic_init(&g.failed, 0);
	atomic_init(&g.resolved_in, 0);
	atomic_init(&g.resolved_out, 0);
	for (int i = 0; i < n; i++) {
		g.p[i].index = i;
		g.p[i].rng = seed * 0x9E3779B97F4A7C15ull + (uint64_t)i * 7919u + 1u;
		if (pthread_create(&g.p[i].thread, NULL, producer_main, &g.p[i]) != 0)
			abort();
	}
}

void producers_resolved(size_t *committed, size_t *retried)
{
	*committed = atomic_load(&g.resolved_in);
	*retried = atomic_load(&g.resolved_out);
}

size_t producers_stop(void)
{
	atomic_store(&g.stop, true);
	for (int i = 0; i < g.n; i++)
		pthread_join(g.p[i].thread, NULL);
	return atomic_load(&g.failed);
}
