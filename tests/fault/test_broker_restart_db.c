/* A broker restart is the broker's outage only. While rows are committed steadily, RabbitMQ is
 * restarted three times (the application, the whole node, the application again), each time
 * in the middle of a batch, with a burst of rows left to drain: the relay's database
 * connection stays up throughout (outbox_relay_database_up, sampled every 50 ms, never reads
 * 0, and /readyz never blames the database), nothing goes wrong on the database side in the
 * log, and every committed row arrives.
 *
 * The relay reaches the broker through a proxy. Before each restart the proxy holds what the
 * relay sends while the broker's own bytes still reach it: the relay publishes its next batch
 * into the proxy and waits for confirms that cannot come (the confirm timeout is raised so
 * that it waits), so the restart finds it inside a batch whatever the machine's speed. A
 * burst alone raced the relay: on a fast run it was drained before rabbitmqctl took effect. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/fault.h"
#include "tests/support/http_probe.h"
#include "tests/support/tcp_proxy.h"

#define MAX_ROWS   500000
#define SAMPLE_MS  50
#define BURST_ROWS 20000

static const char lost_line[] = "msg=\"lost connection, will reconnect\" to=broker";
static const char in_batch_line[] =
        "msg=\"broker did not confirm the batch, unconfirmed rows released\"";
static const char back_line[] = "msg=\"reconnected\" to=broker";

/* ---- the broker, restored whatever happens ---- */

static bool app_stopped, node_stopped;

static void restore_broker(void)
{
	if (app_stopped &&
	    harness_shell("%s start_app", harness_require_env("RELAY_TEST_RABBITMQCTL")) == 0)
		app_stopped = false;
	if (node_stopped &&
	    harness_shell("%s", harness_require_env("RELAY_TEST_RABBITMQ_START")) == 0)
		node_stopped = false;
}

/* ---- /metrics and /readyz sampled on a thread of their own ---- */

struct sampler {
	pthread_t thread;
	char listen[64];
	atomic_bool stop;
	atomic_size_t samples;    /* /metrics answers that held the gauge */
	atomic_size_t db_down;    /* ... of which read outbox_relay_database_up 0 */
	atomic_size_t unanswered; /* /metrics without an answer or the gauge */
	atomic_size_t readyz_db;  /* /readyz answers that named the database */
	/* The first bad answers, written by the thread before it counts them, read after the
	 * join. */
	char first_down[160], first_readyz[160];
};

/* Static, not on the test's stack: a failed assertion leaves the test function while the
 * thread still runs, and the fini stops it. */
static struct sampler sampler;
static bool sampling;
static struct proxy *mq_proxy;

/* The value of the gauge in a /metrics body, -1 when it is not there. */
static long gauge(const char *body, const char *name)
{
	char needle[96];
	const char *p;

	snprintf(needle, sizeof(needle), "\n%s ", name);
	p = strstr(body, needle);
	return p ? strtol(p + strlen(needle), NULL, 10) : -1;
}

static void *sampler_main(void *arg)
{
	struct sampler *s = arg;
	unsigned int n = 0;

	while (!atomic_load(&s->stop)) {
		struct probe_reply r = probe_get_within(s->listen, "/metrics", 2000);
		long up = r.status == 200 ? gauge(r.body, "outbox_relay_database_up") : -1;

		if (up < 0) {
			atomic_fetch_add(&s->unanswered, 1);
		} else {
			if (up == 0 && atomic_load(&s->db_down) == 0)
				snprintf(s->first_down, sizeof(s->first_down),
				         "outbox_relay_database_up 0 at sample %zu",
				         atomic_load(&s->samples));
			if (up == 0)
				atomic_fetch_add(&s->db_down, 1);
			atomic_fetch_add(&s->samples, 1);
		}
		free(r.body);
		/* /readyz is 503 while the broker is away; it must say the broker, only. */
		if (n++ % 4 == 0) {
			r = probe_get_within(s->listen, "/readyz", 2000);
			if (r.status > 0 && strstr(r.body, "database")) {
				if (atomic_load(&s->readyz_db) == 0)
					snprintf(s->first_readyz, sizeof(s->first_readyz),
					         "/readyz %d: %s", r.status, r.body);
				atomic_fetch_add(&s->readyz_db, 1);
			}
			free(r.body);
		}
		harness_sleep_ms(SAMPLE_MS);
	}
	return NULL;
}

/* ---- log checks ---- */

/* Whether a log line is one of those that say the database had trouble. */
static bool database_trouble(const char *line)
{
	if (strstr(line, "database statement failed"))
		return true;
	if (strstr(line, "to=database") && !strstr(line, "msg=\"connected\" to=database"))
		return true;
	return strstr(line, "could not") && strstr(line, "PostgreSQL");
}

/* Lines of r's log that say the database had trouble; the first few are printed. */
static int count_database_trouble(const struct harness_relay *r)
{
	char *log = harness_relay_log(r), *line = log;
	int n = 0;

	while (line && *line) {
		char *end = strchr(line, '\n');

		if (end)
			*end = '\0';
		if (database_trouble(line) && n++ < 5)
			cr_log_error("database trouble: %s", line);
		line = end ? end + 1 : NULL;
	}
	free(log);
	return n;
}

/* ---- the test ---- */

static void expect_logged_more(struct fixture *f, const char *line, int before, const char *when)
{
	HARNESS_WAIT(fixture_log_count(f, line) > before, FAULT_LOG_TIMEOUT_MS);
	if (fixture_log_count(f, line) <= before)
		fixture_dump_logs(f);
	cr_assert_gt(fixture_log_count(f, line), before, "%s: no new '%s' line", when, line);
}

static void stop_app(void)
{
	app_stopped = true;
	harness_broker_stop_app();
}

static void start_app(void)
{
	harness_broker_start_app();
	app_stopped = false;
}

static void stop_node(void)
{
	node_stopped = true;
	harness_broker_node_stop();
}

static void start_node(void)
{
	harness_broker_node_start();
	node_stopped = false;
}

struct restart {
	const char *name;
	void (*stop)(void);
	void (*start)(void);
};

static const struct restart restarts[] = {
	{ "stop_app/start_app", stop_app, start_app },
	{ "node stop/start", stop_node, start_node },
	{ "stop_app/start_app", stop_app, start_app },
};
#define N_RESTARTS (sizeof(restarts) / sizeof(restarts[0]))

static bool database_up_reads_1(void *arg)
{
	struct probe_reply r = probe_get(arg, "/metrics");
	bool ok = r.status == 200 && gauge(r.body, "outbox_relay_database_up") == 1;

	free(r.body);
	return ok;
}

/* Whatever happened: the sampler stopped, the broker running, the proxy gone. */
static void finish(void)
{
	if (sampling) {
		atomic_store(&sampler.stop, true);
		pthread_join(sampler.thread, NULL);
		sampling = false;
	}
	restore_broker();
	proxy_stop(mq_proxy);
	mq_proxy = NULL;
}

/* Unpublished rows that a relay holds a lease on: a batch in flight. */
static int64_t leased(struct fixture *f)
{
	return harness_pg_int(f->pg,
	                      "SELECT count(*) FROM %s"
	                      " WHERE locked_by IS NOT NULL AND published_at IS NULL",
	                      f->table);
}

/* Bytes the relay sent that the holding proxy has not read (rx_queue in /proc/net/tcp of the
 * proxy's side of the relay's connection, whose local port is the proxy's): a batch in flight
 * for the cursor source, which writes nothing into the rows of its batch. */
static int64_t held_at_proxy(void)
{
	FILE *pf = fopen("/proc/net/tcp", "r");
	unsigned int port = (unsigned int)proxy_port(mq_proxy);
	char line[512];
	int64_t most = 0;

	cr_assert_not_null(pf, "cannot read /proc/net/tcp");
	while (fgets(line, sizeof(line), pf)) {
		unsigned int lport, st;
		unsigned long txq, rxq;

		if (sscanf(line, " %*u: %*x:%x %*x:%*x %x %lx:%lx", &lport, &st, &txq, &rxq) != 4)
			continue;
		if (lport == port && st == 1 /* ESTABLISHED */ && (int64_t)rxq > most)
			most = (int64_t)rxq;
	}
	fclose(pf);
	return most;
}

/* A batch in flight: leased rows, or for the cursor more bytes held than a heartbeat frame's
 * 8 (a publish of the smallest row takes more than a hundred). */
static int64_t in_flight_now(struct fixture *f)
{
	int64_t held;

	if (!harness_source_is_cursor())
		return leased(f);
	held = held_at_proxy();
	return held > 100 ? held : 0;
}

Test(fault, broker_restart_keeps_the_database_up, .timeout = 800, .fini = finish)
{
	struct fixture f;
	struct fault_producer *prod;
	struct harness_relay *relay;
	const char *amqp = harness_amqp_url(), *colon = strrchr(amqp, ':');
	char e_listen[96], e_amqp[256];
	size_t n, lost;
	int trouble;

	fixture_setup(&f, "fault_brkdb", NULL);
	memset(&sampler, 0, sizeof(sampler));
	snprintf(sampler.listen, sizeof(sampler.listen), "127.0.0.1:%d", probe_free_port());
	snprintf(e_listen, sizeof(e_listen), "OUTBOX_HTTP_LISTEN=%s", sampler.listen);
	mq_proxy = proxy_start(harness_amqp_port());
	cr_assert_not_null(colon);
	snprintf(e_amqp, sizeof(e_amqp), "OUTBOX_AMQP_URL=%.*s:%d", (int)(colon - amqp), amqp,
	         proxy_port(mq_proxy));
	prod = fault_producer_start(&f, "bdb", 20, 20, MAX_ROWS);
	/* Nothing is killed here. The relay waits for confirms as long as it takes the broker to
	 * go (the proxy holds its publishes meanwhile), and the lease must exceed that wait. */
	relay = fault_relay_start(&f, (const char *const[]){ e_listen, e_amqp,
	                                                     "OUTBOX_AMQP_CONFIRM_TIMEOUT=60s",
	                                                     "OUTBOX_RELAY_LEASE=120s", NULL });
	fixture_expect_unique(&f, f.cons, 2000, FAULT_DELIVERY_TIMEOUT_MS);
	cr_assert(harness_wait_until(database_up_reads_1, sampler.listen, 30000),
	          "outbox_relay_database_up never read 1");
	atomic_init(&sampler.stop, false);
	cr_assert_eq(pthread_create(&sampler.thread, NULL, sampler_main, &sampler), 0);
	sampling = true;

	for (size_t i = 0; i < N_RESTARTS; i++) {
		int lost_before = fixture_log_count(&f, lost_line);
		int back_before = fixture_log_count(&f, back_line);
		int in_batch_before = fixture_log_count(&f, in_batch_line);
		int64_t in_flight = 0;
		char burst[16];

		/* With the burst to drain the relay always has a next batch. From the hold on, the
		 * batch it publishes goes into the proxy and no confirm comes back, so it stays
		 * inside a batch (of the burst or of the producer's rows) until the broker goes. */
		snprintf(burst, sizeof(burst), "bst%zu", i);
		harness_insert_rows(f.pg, f.table, BURST_ROWS, f.exchange, "fault.burst", burst,
		                    NULL, NULL);
		proxy_hold(mq_proxy, true);
		/* Seen once is enough: a batch sent before the hold may still be confirmed and
		 * marked, and the next one is then held. */
		HARNESS_WAIT((in_flight = in_flight_now(&f)) > 0, FAULT_LOG_TIMEOUT_MS);
		cr_assert_gt(in_flight, 0, "no batch in flight after burst %zu", i + 1);
		fprintf(stderr, "broker_restart_db: restart %zu (%s) with %zu rows committed\n",
		        i + 1, restarts[i].name,
		        fault_producer_committed(prod) + (i + 1) * BURST_ROWS);
		restarts[i].stop();
		expect_logged_more(&f, lost_line, lost_before, restarts[i].name);
		/* The restart hit a batch (not an idle loop), the case this test is about. */
		expect_logged_more(&f, in_batch_line, in_batch_before, restarts[i].name);
		proxy_hold(mq_proxy, false);
		harness_sleep_ms(1000); /* rows keep being committed meanwhile */
		restarts[i].start();
		expect_logged_more(&f, back_line, back_before, restarts[i].name);
		/* Rows flow again before the next restart. */
		fixture_expect_unique(&f, f.cons, consumer_unique(f.cons) + 2000,
		                      FAULT_DELIVERY_TIMEOUT_MS);
	}
	atomic_store(&sampler.stop, true);
	pthread_join(sampler.thread, NULL);
	sampling = false;
	cr_assert_not(relay->exited, "the relay process must recover by itself");

	fprintf(stderr,
	        "broker_restart_db: %zu samples of outbox_relay_database_up, %zu read 0, %zu "
	        "unanswered; /readyz named the database %zu times\n",
	        atomic_load(&sampler.samples), atomic_load(&sampler.db_down),
	        atomic_load(&sampler.unanswered), atomic_load(&sampler.readyz_db));
	trouble = count_database_trouble(relay);
	if (trouble > 0 || atomic_load(&sampler.db_down) > 0 || atomic_load(&sampler.readyz_db) > 0)
		fixture_dump_logs(&f);
	cr_assert_gt(atomic_load(&sampler.samples), 100, "too few samples of /metrics");
	cr_assert_eq(atomic_load(&sampler.db_down), 0, "the database was reported down: %s",
	             sampler.first_down);
	cr_assert_eq(atomic_load(&sampler.readyz_db), 0, "/readyz blamed the database: %s",
	             sampler.first_readyz);
	cr_assert_eq(trouble, 0, "%d log lines say the database had trouble", trouble);

	n = fault_producer_stop(prod);
	fixture_expect_unique(&f, f.cons, n + N_RESTARTS * BURST_ROWS, FAULT_DELIVERY_TIMEOUT_MS);
	fault_expect_settled(&f, 10, 60000);
	harness_sleep_ms(1000);
	/* Duplicates are allowed: rows in flight when the broker went are published again. */
	(void)fault_count(&f, "broker_restart_db", "bdb", n, &lost);
	cr_assert_eq(lost, 0, "%zu committed rows never arrived", lost);
	for (size_t i = 0; i < N_RESTARTS; i++) {
		char burst[16], name[32];

		snprintf(burst, sizeof(burst), "bst%zu", i);
		snprintf(name, sizeof(name), "broker_restart_db burst %zu", i + 1);
		(void)fault_count(&f, name, burst, BURST_ROWS, &lost);
		cr_assert_eq(lost, 0, "%zu rows of burst %zu never arrived", lost, i + 1);
	}
	fixture_teardown(&f);
}
