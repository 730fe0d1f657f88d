/* Ordering-key workload for the tests (see ordering_load.h): concurrent producers whose
 * transactions commit out of seq order, and the per-key order check against the table. */
#include "tests/support/ordering_load.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/support/harness.h"

#define LOAD_MAX_PRODUCERS 32
#define LOAD_ERR_MAX       512

struct producer {
	struct ordering_load *load;
	pthread_t thread;
	bool started;
	uint32_t rng;
};

struct ordering_load {
	char table[128];
	char exchange[128];
	char conninfo[1024];
	size_t keys, total, n_producers;
	size_t *slots;      /* key of each row slot, shuffled */
	atomic_size_t next; /* next slot to insert */
	atomic_size_t committed;
	atomic_int failed;
	pthread_mutex_t err_lock;
	char err[LOAD_ERR_MAX]; /* the first failure */
	struct producer producers[LOAD_MAX_PRODUCERS];
};

static uint32_t xorshift(uint32_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 17;
	*x ^= *x << 5;
	return *x;
}

static void load_fail(struct ordering_load *l, const char *what, PGconn *c)
{
	pthread_mutex_lock(&l->err_lock);
	if (atomic_fetch_add(&l->failed, 1) == 0)
		snprintf(l->err, sizeof(l->err), "%s: %s", what, c ? PQerrorMessage(c) : "");
	pthread_mutex_unlock(&l->err_lock);
}

static bool exec_ok(PGconn *c, const char *sql)
{
	PGresult *res = PQexec(c, sql);
	bool ok = PQresultStatus(res) == PGRES_COMMAND_OK;

	PQclear(res);
	return ok;
}

static void sleep_us(long us)
{
	struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };

	nanosleep(&ts, NULL);
}

/* One producer: transactions of 1-4 single-row INSERTs until the slots run out. Criterion's
 * asserts belong to the test thread, so failures are recorded and reported by join. */
static void *producer_main(void *arg)
{
	struct producer *p = arg;
	struct ordering_load *l = p->load;
	char sql[512];
	PGconn *c = PQconnectdb(l->conninfo);

	if (PQstatus(c) != CONNECTION_OK) {
		load_fail(l, "producer could not connect", c);
		PQfinish(c);
		return NULL;
	}
	snprintf(sql, sizeof(sql),
	         "INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key)"
	         " VALUES ($1, $2, $3, $4, $5)",
	         l->table);
	while (atomic_load(&l->failed) == 0) {
		size_t n = 1 + xorshift(&p->rng) % 4;
		size_t first = atomic_fetch_add(&l->next, n);

		if (first >= l->total)
			break;
		if (first + n > l->total)
			n = l->total - first;
		if (!exec_ok(c, "BEGIN")) {
			load_fail(l, "BEGIN", c);
			break;
		}
		for (size_t i = first; i < first + n; i++) {
			char id[48], key[24], rk[32], body[128];
			const char *params[5] = { id, l->exchange, rk, body, key };
			PGresult *res;

			snprintf(key, sizeof(key), "k%03zu", l->slots[i]);
			snprintf(id, sizeof(id), "%s-%06zu", key, i);
			snprintf(rk, sizeof(rk), "ord.%s", key);
			snprintf(body, sizeof(body), "{\"key\":\"%s\",\"slot\":%zu}", key, i);
			res = PQexecParams(c, sql, 5, NULL, params, NULL, NULL, 0);
			if (PQresultStatus(res) != PGRES_COMMAND_OK) {
				PQclear(res);
				load_fail(l, "INSERT", c);
				goto out;
			}
			PQclear(res);
			/* A pause between statements lets other transactions take seqs in between. */
			if (xorshift(&p->rng) % 2)
				sleep_us((long)(xorshift(&p->rng) % 2000));
		}
		sleep_us((long)(xorshift(&p->rng) % 5001));
		if (!exec_ok(c, "COMMIT")) {
			load_fail(l, "COMMIT", c);
			break;
		}
		atomic_fetch_add(&l->committed, n);
	}
out:
	PQfinish(c);
	return NULL;
}

struct ordering_load *ordering_load_start(const char *table, const char *exchange, size_t keys,
                                          size_t per_key, size_t producers, unsigned seed)
{
	struct ordering_load *l = calloc(1, sizeof(*l));
	uint32_t rng = seed ? seed : 1;

	cr_assert_not_null(l);
	cr_assert(producers > 0 && producers <= LOAD_MAX_PRODUCERS, "producers %zu", producers);
	cr_assert(keys > 0 && keys < 1000, "keys %zu", keys);
	snprintf(l->table, sizeof(l->table), "%s", table);
	snprintf(l->exchange, sizeof(l->exchange), "%s", exchange);
	snprintf(l->conninfo, sizeof(l->conninfo), "%s", harness_pg_conninfo());
	l->keys = keys;
	l->total = keys * per_key;
	l->n_producers = producers;
	l->slots = calloc(l->total, sizeof(*l->slots));
	cr_assert_not_null(l->slots);
	for (size_t i = 0; i < l->total; i++)
		l->slots[i] = i % keys;
	for (size_t i = l->total; i > 1; i--) {
		size_t j = xorshift(&rng) % i;
		size_t tmp = l->slots[i - 1];

		l->slots[i - 1] = l->slots[j];
		l->slots[j] = tmp;
	}
	atomic_init(&l->next, 0);
	atomic_init(&l->committed, 0);
	atomic_init(&l->failed, 0);
	pthread_mutex_init(&l->err_lock, NULL);
	for (size_t i = 0; i < producers; i++) {
		struct producer *p = &l->producers[i];

		p->load = l;
		p->rng = (uint32_t)(seed * 7919u + i * 104729u + 17u);
		cr_assert_eq(pthread_create(&p->thread, NULL, producer_main, p), 0);
		p->started = true;
	}
	return l;
}

size_t ordering_load_committed(struct ordering_load *l)
{
	return atomic_load(&l->committed);
}

void ordering_load_join(struct ordering_load *l)
{
	char err[LOAD_ERR_MAX];
	int failed;

	for (size_t i = 0; i < l->n_producers; i++) {
		if (l->producers[i].started)
			pthread_join(l->producers[i].thread, NULL);
	}
	failed = atomic_load(&l->failed);
	snprintf(err, sizeof(err), "%s", l->err);
	pthread_mutex_destroy(&l->err_lock);
	free(l->slots);
	free(l);
	cr_assert_eq(failed, 0, "a producer failed: %s", err);
}

/* Key number of an id "k<NNN>-...", or -1. */
static long key_of(const char *id)
{
	char *end;
	long k;

	if (id == NULL || id[0] != 'k')
		return -1;
	k = strtol(id + 1, &end, 10);
	return *end == '-' ? k : -1;
}

struct key_list {
	const char **ids;
	size_t n, cap;
};

static void push(struct key_list *kl, const char *id)
{
	if (kl->n == kl->cap) {
		kl->cap = kl->cap ? kl->cap * 2 : 64;
		kl->ids = realloc(kl->ids, kl->cap * sizeof(*kl->ids));
		cr_assert_not_null(kl->ids);
	}
	kl->ids[kl->n++] = id;
}

void ordering_check(PGconn *pg, const char *table, const char *filter, struct consumer *const *cons,
                    size_t n_cons, bool collapse_repeats, const char *what)
{
	char sql[1024];
	PGresult *res;
	const char **order;
	size_t n_order, n_keys = 0, repeats = 0, rows, deliveries = 0;
	struct key_list *want, *got;

	snprintf(sql, sizeof(sql),
	         "SELECT id FROM %s WHERE ordering_key IS NOT NULL AND (%s)"
	         " ORDER BY ordering_key, seq",
	         table, filter ? filter : "true");
	res = PQexec(pg, sql);
	cr_assert_eq(PQresultStatus(res), PGRES_TUPLES_OK, "%s", PQerrorMessage(pg));
	rows = (size_t)PQntuples(res);
	for (size_t i = 0; i < rows; i++) {
		long k = key_of(PQgetvalue(res, (int)i, 0));

		cr_assert(k >= 0, "unexpected id '%s'", PQgetvalue(res, (int)i, 0));
		if ((size_t)k + 1 > n_keys)
			n_keys = (size_t)k + 1;
	}
	want = calloc(n_keys + 1, sizeof(*want));
	got = calloc(n_keys + 1, sizeof(*got));
	cr_assert(want && got);
	for (size_t i = 0; i < rows; i++) {
		const char *id = PQgetvalue(res, (int)i, 0);

		push(&want[key_of(id)], id);
	}

	for (size_t c = 0; c < n_cons; c++) {
		order = consumer_order(cons[c], &n_order);
		deliveries += n_order;
		for (size_t i = 0; i < n_order; i++) {
			long k = key_of(order[i]);
			struct key_list *g;

			if (k < 0 || (size_t)k >= n_keys)
				continue; /* not a keyed row of this workload */
			g = &got[k];
			if (collapse_repeats && g->n > 0 &&
			    strcmp(g->ids[g->n - 1], order[i]) == 0) {
				repeats++;
				continue;
			}
			push(g, order[i]);
		}
		free(order);
	}

	for (size_t k = 0; k < n_keys; k++) {
		size_t n = want[k].n < got[k].n ? want[k].n : got[k].n;

		for (size_t i = 0; i < n; i++) {
			cr_assert_str_eq(
			        got[k].ids[i], want[k].ids[i],
			        "%s: key k%03zu, delivery %zu of the key is '%s', the table's "
			        "seq order has '%s' there",
			        what, k, i, got[k].ids[i], want[k].ids[i]);
		}
		cr_assert_eq(
		        got[k].n, want[k].n,
		        "%s: key k%03zu: %zu deliveries (after collapsing repeats: %s), the table "
		        "has %zu rows",
		        what, k, got[k].n, collapse_repeats ? "yes" : "no", want[k].n);
	}
	fprintf(stderr,
	        "%s: %zu keyed rows over %zu keys arrived in seq order per key (%zu deliveries, "
	        "%zu repeats of a key's last row)\n",
	        what, rows, n_keys, deliveries, repeats);
	for (size_t k = 0; k < n_keys; k++) {
		free(want[k].ids);
		free(got[k].ids);
	}
	free(want);
	free(got);
	PQclear(res);
}
