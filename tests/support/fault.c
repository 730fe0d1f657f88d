/* fault.c — what the fault tests add to the fixture: relays with short timings, a producer
 * that keeps committing through a fault, and the lost/duplicate count (see fault.h). */
#include "tests/support/fault.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ENV 48

static const char *const fault_defaults[] = {
	"OUTBOX_RELAY_LEASE=3s",
	"OUTBOX_AMQP_CONFIRM_TIMEOUT=2s",
	"OUTBOX_RELAY_RETRY_BACKOFF_MIN=200ms",
	"OUTBOX_RELAY_RETRY_BACKOFF_MAX=1s",
	"OUTBOX_RELAY_POLL_INTERVAL=200ms",
	NULL,
};

static bool same_name(const char *a, const char *b)
{
	size_t n = strcspn(a, "=");

	return strncmp(a, b, n) == 0 && b[n] == '=';
}

struct harness_relay *fault_relay_start(struct fixture *f, const char *const *env)
{
	const char *merged[MAX_ENV];
	size_t n = 0;

	for (size_t i = 0; fault_defaults[i]; i++) {
		bool replaced = false;

		for (size_t k = 0; env && env[k]; k++)
			replaced = replaced || same_name(fault_defaults[i], env[k]);
		if (!replaced)
			merged[n++] = fault_defaults[i];
	}
	for (size_t k = 0; env && env[k]; k++) {
		cr_assert_lt(n, MAX_ENV - 1, "too many environment entries");
		merged[n++] = env[k];
	}
	merged[n] = NULL;
	return fixture_relay_start(f, merged);
}

static int64_t unsettled(struct fixture *f, int max_attempts)
{
	/* A row marked published keeps no lease (the lease source's marks, the cursor's
	 * exception path). */
	return harness_pg_int(f->pg,
	                      "SELECT count(*) FROM %s"
	                      " WHERE (%s AND attempts < %d)"
	                      " OR (published_at IS NOT NULL AND locked_by IS NOT NULL)",
	                      f->table, harness_unpublished(f->table), max_attempts);
}

void fault_expect_settled(struct fixture *f, int max_attempts, int64_t timeout_ms)
{
	int64_t left;

	if (PQstatus(f->pg) != CONNECTION_OK) {
		PQfinish(f->pg);
		f->pg = harness_pg_connect_retry(30000);
		cr_assert_not_null(f->pg, "no database connection");
	}
	HARNESS_WAIT(unsettled(f, max_attempts) == 0, timeout_ms);
	left = unsettled(f, max_attempts);
	if (left != 0)
		fixture_dump_logs(f);
	cr_assert_eq(left, 0, "%lld rows still pending or leased", (long long)left);
}

size_t fault_count(struct fixture *f, const char *name, const char *prefix, size_t n, size_t *lost)
{
	size_t missing = 0, received = consumer_received(f->cons);
	size_t dups = consumer_duplicates(f->cons);
	char id[96];

	for (size_t i = 0; i < n; i++) {
		snprintf(id, sizeof(id), "%s-%07zu", prefix, i);
		if (consumer_count(f->cons, id) == 0) {
			if (missing < 10)
				cr_log_error("fault %s: %s committed, never received", name, id);
			missing++;
		}
	}
	fprintf(stderr, "fault %s: committed=%zu received=%zu lost=%zu duplicates=%zu\n", name, n,
	        received, missing, dups);
	*lost = missing;
	return dups;
}

/* ---- producer ---- */

struct fault_producer {
	pthread_t thread;
	char conninfo[512];
	char table[48], exchange[64], prefix[32];
	size_t chunk, max_rows;
	int64_t pause_ms;
	atomic_size_t committed;
	atomic_bool stop;
};

/* Commits [from, from + n) once; false when it did not commit (the caller retries). */
static bool produce_chunk(struct fault_producer *p, PGconn *c, size_t from, size_t n)
{
	char sql[1024];
	PGresult *res;
	bool ok;

	snprintf(sql, sizeof(sql),
	         "INSERT INTO %s (id, exchange_name, routing_key, body)"
	         " SELECT '%s-' || lpad(g::text, 7, '0'), '%s', 'fault.produced',"
	         " '{\"n\":' || g || '}' FROM generate_series(%zu, %zu) g"
	         " ON CONFLICT DO NOTHING", /* no (id) target: a partitioned table has none */
	         p->table, p->prefix, p->exchange, from, from + n - 1);
	res = PQexec(c, sql);
	ok = PQresultStatus(res) == PGRES_COMMAND_OK;
	PQclear(res);
	return ok;
}

static void *producer_main(void *arg)
{
	struct fault_producer *p = arg;
	PGconn *c = NULL;
	size_t next = 0;

	while (!atomic_load(&p->stop) && next < p->max_rows) {
		size_t n = p->chunk;

		if (c == NULL || PQstatus(c) != CONNECTION_OK) {
			PQfinish(c);
			c = PQconnectdb(p->conninfo);
			if (PQstatus(c) != CONNECTION_OK) {
				harness_sleep_ms(100);
				continue;
			}
			PQclear(PQexec(c, "SET client_min_messages = warning"));
		}
		if (n > p->max_rows - next)
			n = p->max_rows - next;
		if (!produce_chunk(p, c, next, n)) {
			/* A restart under us: the chunk may or may not have committed; the retry
			 * is idempotent. */
			harness_sleep_ms(100);
			continue;
		}
		next += n;
		atomic_store(&p->committed, next);
		harness_sleep_ms(p->pause_ms);
	}
	PQfinish(c);
	return NULL;
}

struct fault_producer *fault_producer_start(const struct fixture *f, const char *prefix,
                                            size_t chunk, int64_t pause_ms, size_t max_rows)
{
	struct fault_producer *p = calloc(1, sizeof(*p));

	cr_assert_not_null(p);
	snprintf(p->conninfo, sizeof(p->conninfo), "%s", harness_pg_conninfo());
	snprintf(p->table, sizeof(p->table), "%s", f->table);
	snprintf(p->exchange, sizeof(p->exchange), "%s", f->exchange);
	snprintf(p->prefix, sizeof(p->prefix), "%s", prefix);
	p->chunk = chunk;
	p->pause_ms = pause_ms;
	p->max_rows = max_rows;
	atomic_init(&p->committed, 0);
	atomic_init(&p->stop, false);
	cr_assert_eq(pthread_create(&p->thread, NULL, producer_main, p), 0);
	return p;
}

size_t fault_producer_committed(struct fault_producer *p)
{
	return atomic_load(&p->committed);
}

size_t fault_producer_stop(struct fault_producer *p)
{
	size_t n;

	atomic_store(&p->stop, true);
	pthread_join(p->thread, NULL);
	n = atomic_load(&p->committed);
	free(p);
	return n;
}

/* ---- broker and proxy shortcuts ---- */

bool fault_memory_alarm(bool on)
{
	return harness_shell("%s set_vm_memory_high_watermark %s >/dev/null",
	                     harness_require_env("RELAY_TEST_RABBITMQCTL"),
	                     on ? "absolute 1" : "0.4") == 0;
}

void fault_amqp_env(char *buf, size_t len, int port)
{
	const char *amqp = harness_amqp_url();
	const char *colon = strrchr(amqp, ':');

	cr_assert_not_null(colon, "RELAY_TEST_AMQP has no port: %s", amqp);
	snprintf(buf, len, "OUTBOX_AMQP_URL=%.*s:%d", (int)(colon - amqp), amqp, port);
}

void fault_database_env(char *buf, size_t len, int port)
{
	/* libpq takes the last value of a repeated keyword: this port wins. */
	snprintf(buf, len, "OUTBOX_DATABASE_URL=%s port=%d", harness_pg_conninfo(), port);
}
