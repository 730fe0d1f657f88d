/* outbox-soak: keyed and unkeyed producers at a steady rate against 2-3 relay processes while
 * faults are injected at random (seeded) — relays killed and stopped, the broker and the
 * database restarted, a memory alarm, connections cut and stalled, rows that can never be
 * published — checking continuously and at the end that nothing committed is lost, keys keep
 * their order, duplicates follow faults, nothing waits long once faults are over, poison rows
 * end dead, relays stop cleanly and their memory stays flat.
 *
 * It runs as one criterion test so that the test harness (relay processes, servers, proxy)
 * works as in the fault tests; main() parses the command line, hands it to the test process
 * through the environment (criterion runs each test in a fresh process) and, whatever became
 * of that process, puts the shared servers back as they were. */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/soak/producer.h"
#include "tests/soak/soak.h"
#include "tests/support/fixture.h"
#include "tests/support/http_probe.h"
#include "tests/support/tcp_proxy.h"

#define ARGS_ENV "OUTBOX_SOAK_ARGS_"
/* A SIGTERM must end the relay within relay.shutdown_timeout + 1 s (its contract) + this
 * much for an ASan build's exit (leak check) on a loaded machine. */
#define TERM_SLACK_MS 4000
#define TERM_WAIT_MS  60000
/* The last rows and the poison rows must be through by then. */
#define POISON_DEAD_TIMEOUT_MS 120000

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
	(void)sig;
	interrupted = 1;
}

/* ---- options ---- */

void soak_usage(void)
{
	printf("usage: outbox-soak [--duration D] [--relays 2|3] [--seed N] [--rate R]\n"
	       "                   [--faults kind,kind,...] [--quiet D] [--drain D] "
	       "[--producers N] [--keys N] [--keep-going]\n"
	       "  --duration D   how long faults are injected (default 120s; 500ms, 30s, 5m, 1h)\n"
	       "  --quiet D      producers go on without faults afterwards (default 45s)\n"
	       "  --drain D      at most this long for the last rows to arrive (default 180s)\n"
	       "  --relays N     relay processes, 2 or 3 (default 3)\n"
	       "  --producers N  producer connections, 1-%d (default 4)\n"
	       "  --rate R       rows committed per second by all producers (default 300)\n"
	       "  --keys N       ordering keys the keyed rows are spread over, 1-%d (default 32)\n"
	       "  --seed N       seed of every random choice (default: from the clock; printed)\n"
	       "  --faults LIST  a subset of:",
	       SOAK_MAX_PRODUCERS, SOAK_MAX_KEYS);
	for (int k = 0; k < SOAK_N_FAULTS; k++)
		printf(" %s", soak_fault_names[k]);
	printf(" (default: all)\n"
	       "  --keep-going   go on after a failed check (default: stop injecting faults, drain "
	       "and report)\n"
	       "Reads RELAY_TEST_* (tests/services.sh's env file) and RELAY_TEST_BIN (the "
	       "relay).\n");
}

/* "120s", "500ms", "5m", "2h" or plain seconds. */
static int parse_duration(const char *s, int64_t *ms)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || v < 0)
		return -1;
	if (strcmp(end, "ms") == 0)
		*ms = (int64_t)v;
	else if (*end == '\0' || strcmp(end, "s") == 0)
		*ms = (int64_t)(v * 1000);
	else if (strcmp(end, "m") == 0)
		*ms = (int64_t)(v * 60000);
	else if (strcmp(end, "h") == 0)
		*ms = (int64_t)(v * 3600000);
	else
		return -1;
	return 0;
}

static int parse_int(const char *s, long lo, long hi, long *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

static int parse_faults(const char *s, unsigned *mask)
{
	*mask = 0;
	while (*s) {
		size_t len = strcspn(s, ",");
		int k;

		if (len == 3 && strncmp(s, "all", 3) == 0) {
			*mask = (1u << SOAK_N_FAULTS) - 1;
		} else {
			for (k = 0; k < SOAK_N_FAULTS; k++)
				if (strlen(soak_fault_names[k]) == len &&
				    strncmp(s, soak_fault_names[k], len) == 0)
					break;
			if (k == SOAK_N_FAULTS)
				return -1;
			*mask |= 1u << k;
		}
		s += len;
		if (*s == ',')
			s++;
	}
	return *mask ? 0 : -1;
}

int soak_parse_args(int argc, char **argv, struct soak_options *o, char *err, size_t errlen)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	*o = (struct soak_options){
		.duration_ms = 120000,
		.quiet_ms = 45000,
		.drain_ms = 180000,
		.relays = 3,
		.producers = 4,
		.rate = 300,
		.keys = 32,
		.seed = ((uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec) % 1000000000u,
		.faults = (1u << SOAK_N_FAULTS) - 1,
	};
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		long n;
		int rc = 0;

		if (strcmp(a, "--keep-going") == 0) {
			o->keep_going = true;
			continue;
		}
		if (v == NULL) {
			snprintf(err, errlen, "%s: missing value (or unknown option)", a);
			return -1;
		}
		i++;
		if (strcmp(a, "--duration") == 0)
			rc = parse_duration(v, &o->duration_ms);
		else if (strcmp(a, "--quiet") == 0)
			rc = parse_duration(v, &o->quiet_ms);
		else if (strcmp(a, "--drain") == 0)
			rc = parse_duration(v, &o->drain_ms);
		else if (strcmp(a, "--relays") == 0)
			rc = parse_int(v, 2, SOAK_MAX_RELAYS, &n) || ((o->relays = (int)n), 0);
		else if (strcmp(a, "--producers") == 0)
			rc = parse_int(v, 1, SOAK_MAX_PRODUCERS, &n) ||
			     ((o->producers = (int)n), 0);
		else if (strcmp(a, "--keys") == 0)
			rc = parse_int(v, 1, SOAK_MAX_KEYS, &n) || ((o->keys = (int)n), 0);
		else if (strcmp(a, "--rate") == 0)
			rc = parse_int(v, 1, 100000, &n) || ((o->rate = (int)n), 0);
		else if (strcmp(a, "--seed") == 0)
			rc = parse_int(v, 0, 2000000000L, &n) || ((o->seed = (uint64_t)n), 0);
		else if (strcmp(a, "--faults") == 0)
			rc = parse_faults(v, &o->faults);
		else {
			snprintf(err, errlen, "unknown option '%s'", a);
			return -1;
		}
		if (rc != 0) {
			snprintf(err, errlen, "%s: bad value '%s'", a, v);
			return -1;
		}
	}
	return 0;
}

/* ---- the row source under test ---- */

static bool source_cursor;
static char source_unpublished[600], source_published[600];

void soak_source_init(const char *table)
{
	source_cursor = harness_source_is_cursor();
	snprintf(source_unpublished, sizeof(source_unpublished), "%s", harness_unpublished(table));
	snprintf(source_published, sizeof(source_published), "%s", harness_published(table));
}

bool soak_cursor(void)
{
	return source_cursor;
}

const char *soak_unpublished(void)
{
	return source_unpublished;
}

const char *soak_published(void)
{
	return source_published;
}

/* ---- the run ---- */

struct slot {
	struct proxy *mq, *db;
	struct harness_relay *r;
	int life;
	int starts;
	char listen[64];
};

struct soak {
	struct soak_options o;
	struct fixture fx;
	struct slot slots[SOAK_MAX_RELAYS];
	uint64_t rng;
	int poison_rounds;
	/* SIGTERM outcomes */
	int terms, terms_ok;
	int64_t term_slowest_ms;
};

static uint64_t rnd(struct soak *s)
{
	s->rng ^= s->rng << 13;
	s->rng ^= s->rng >> 7;
	s->rng ^= s->rng << 17;
	return s->rng;
}

/* A uniform value in [lo, hi]. */
static int64_t rnd_between(struct soak *s, int64_t lo, int64_t hi)
{
	return lo + (int64_t)(rnd(s) % (uint64_t)(hi - lo + 1));
}

static bool should_stop(const struct soak *s)
{
	return interrupted || (!s->o.keep_going && soak_failures_total() > 0);
}

/* Sleeps ms while watching the relays (ends early when the run must stop). */
static void watch(struct soak *s, int64_t ms);

static void relay_start(struct soak *s, int i)
{
	struct slot *sl = &s->slots[i];
	const char *amqp = harness_amqp_url();
	const char *colon = strrchr(amqp, ':');
	char e_amqp[512], e_db[1280], e_listen[96], e_id[64];
	const char *env[] = {
		e_amqp,
		e_db,
		e_listen,
		e_id,
		/* A killed relay's rows come back after the lease: long enough that no lease runs
		 * out under a slow mark on a loaded machine (which would be a duplicate no fault
		 * caused), short enough for recovery to be quick. */
		"OUTBOX_RELAY_LEASE=10s",
		/* Shorter than a broker stall, sometimes. */
		"OUTBOX_AMQP_CONFIRM_TIMEOUT=3s",
		"OUTBOX_AMQP_HEARTBEAT=10s",
		/* Poison rows with a missing exchange or no route are dead within seconds. */
		"OUTBOX_RELAY_MAX_ATTEMPTS=5",
		"OUTBOX_RELAY_RETRY_BACKOFF_MIN=200ms",
		"OUTBOX_RELAY_RETRY_BACKOFF_MAX=2s",
		"OUTBOX_RELAY_POLL_INTERVAL=200ms",
		"OUTBOX_RELAY_SHUTDOWN_TIMEOUT=5s",
		/* Batches small enough that the relays share the load. */
		"OUTBOX_RELAY_BATCH_SIZE=100",
		NULL,
	};

	snprintf(e_amqp, sizeof(e_amqp), "OUTBOX_AMQP_URL=%.*s:%d", (int)(colon - amqp), amqp,
	         proxy_port(sl->mq));
	/* libpq takes the last value of a repeated keyword: the proxy's port wins. */
	snprintf(e_db, sizeof(e_db), "OUTBOX_DATABASE_URL=%s port=%d", harness_pg_conninfo(),
	         proxy_port(sl->db));
	snprintf(sl->listen, sizeof(sl->listen), "127.0.0.1:%d", probe_free_port());
	snprintf(e_listen, sizeof(e_listen), "OUTBOX_HTTP_LISTEN=%s", sl->listen);
	snprintf(e_id, sizeof(e_id), "OUTBOX_RELAY_ID=soak-%d-%d", i, ++sl->starts);
	sl->r = harness_relay_start(s->fx.table, env, NULL);
	sl->life = soak_life_begin(i, sl->r->pid, sl->r->log_path);
}

static void relay_restart_after_death(struct soak *s, int i)
{
	struct slot *sl = &s->slots[i];

	soak_life_end(sl->life);
	soak_fail(CHECK_RELAY_DIED, "relay %d (pid %ld) exited by itself with status %d; log %s", i,
	          (long)sl->r->pid, sl->r->status, sl->r->log_path);
	harness_relay_free(sl->r);
	relay_start(s, i);
}

static void check_relays(struct soak *s)
{
	for (int i = 0; i < s->o.relays; i++) {
		struct slot *sl = &s->slots[i];

		if (sl->r->exited || harness_relay_wait(sl->r, 0) >= 0)
			relay_restart_after_death(s, i);
	}
}

static void watch(struct soak *s, int64_t ms)
{
	int64_t end = soak_ms() + ms;

	while (soak_ms() < end && !should_stop(s)) {
		check_relays(s);
		harness_sleep_ms(end - soak_ms() < 200 ? (end - soak_ms() > 0 ? end - soak_ms() : 0)
		                                       : 200);
	}
}

/* The soak's own connection, reconnected after a restart (which an idle connection only
 * notices when it is used: hence the probe). */
static PGconn *main_pg(struct soak *s)
{
	PGresult *res = PQexec(s->fx.pg, "SELECT 1");
	bool ok = PQresultStatus(res) == PGRES_TUPLES_OK;

	PQclear(res);
	if (!ok) {
		PQfinish(s->fx.pg);
		s->fx.pg = harness_pg_connect_retry(60000);
		cr_assert_not_null(s->fx.pg, "no database connection");
	}
	return s->fx.pg;
}

/* SIGTERM: the relay must exit 0 within shutdown_timeout + 1 s + slack. */
static int relay_term(struct soak *s, int i, int64_t *took)
{
	struct slot *sl = &s->slots[i];
	int64_t t = harness_now_ms(), bound = SOAK_SHUTDOWN_TIMEOUT_MS + 1000 + TERM_SLACK_MS;
	int st;

	/* A relay signalled before it installed its handlers dies of the signal: that says
	 * nothing about its shutdown. The line comes after the handlers are in place. */
	if (!harness_relay_wait_log(sl->r, "msg=\"starting outbox-relay\"", 30000))
		soak_fail(CHECK_HARNESS, "relay %d (pid %ld) never logged its start; log %s", i,
		          (long)sl->r->pid, sl->r->log_path);
	soak_life_end(sl->life);
	st = harness_relay_stop(sl->r, SIGTERM, TERM_WAIT_MS);
	*took = harness_now_ms() - t;
	s->terms++;
	if (*took > s->term_slowest_ms)
		s->term_slowest_ms = *took;
	if (st < 0) {
		soak_fail(CHECK_SHUTDOWN,
		          "relay %d (pid %ld) still running %d s after SIGTERM; log %s", i,
		          (long)sl->r->pid, TERM_WAIT_MS / 1000, sl->r->log_path);
		harness_relay_kill(sl->r);
	} else if (st != 0) {
		soak_fail(CHECK_SHUTDOWN, "relay %d (pid %ld) exited with %d after SIGTERM; log %s",
		          i, (long)sl->r->pid, st, sl->r->log_path);
	} else if (*took > bound) {
		soak_fail(CHECK_SHUTDOWN,
		          "relay %d (pid %ld) took %.1f s to exit after SIGTERM (bound %.1f s); "
		          "log %s",
		          i, (long)sl->r->pid, (double)*took / 1000.0, (double)bound / 1000.0,
		          sl->r->log_path);
	} else {
		s->terms_ok++;
	}
	harness_relay_free(sl->r);
	sl->r = NULL;
	return st;
}

static void memory_alarm(bool on)
{
	if (harness_shell("%s set_vm_memory_high_watermark %s >/dev/null",
	                  harness_require_env("RELAY_TEST_RABBITMQCTL"),
	                  on ? "absolute 1" : "0.4") != 0)
		soak_fail(CHECK_HARNESS, "rabbitmqctl set_vm_memory_high_watermark failed");
}

/* A random non-empty subset of the relays, as a bit mask, and its text "0,2". */
static unsigned pick_relays(struct soak *s, char *text, size_t len)
{
	unsigned all = (1u << s->o.relays) - 1, m = 0;
	size_t off = 0;

	while (m == 0)
		m = (unsigned)rnd(s) & all;
	text[0] = '\0';
	for (int i = 0; i < s->o.relays; i++)
		if (m & (1u << i))
			off += (size_t)snprintf(text + off, len - off, "%s%d", off ? "," : "", i);
	return m;
}

static void insert_poison(struct soak *s, int round, char ids[POISON_N][64])
{
	PGconn *pg = main_pg(s);
	const char *t = s->fx.table, *ex = s->fx.exchange;

	for (int k = 0; k < POISON_N; k++)
		snprintf(ids[k], 64, "poison-%04d-%s", round, soak_poison_defs[k].name);
	harness_pg_exec(pg, "BEGIN");
	harness_pg_exec(pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body, headers)"
	                " SELECT '%s', '%s', 'soak.poison', '{}',"
	                " '{' || string_agg(format('\"h%%s\":\"%%s\"', lpad(g::text, 3, '0'),"
	                " repeat('v', 1000)), ',' ORDER BY g) || '}'"
	                " FROM generate_series(0, 199) g",
	                t, ids[POISON_BIG_HEADERS], ex);
	harness_pg_exec(pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body)"
	                " VALUES ('%s', '%s', 'soak.poison', repeat('x', 5 * 1024 * 1024))",
	                t, ids[POISON_BIG_BODY], ex);
	harness_pg_exec(
	        pg,
	        "INSERT INTO %s (id, exchange_name, routing_key, body, body_encoding,"
	        " headers, properties) VALUES"
	        " ('%s', '%s', 'soak.poison', '!!not base64!!', 'base64', '{}', '{}'),"
	        " ('%s', '%s', 'soak.poison', 'x', 'utf-16', '{}', '{}'),"
	        " ('%s', '%s', 'soak.poison', 'x', 'utf-8', '[1,2]', '{}'),"
	        " ('%s', '%s', 'soak.poison', 'x', 'utf-8', '{}', '[\"a\"]'),"
	        " ('%s', '%s', 'soak.poison', 'x', 'utf-8', '{}', '{\"colour\":\"red\"}'),"
	        " ('%s', '%s', 'soak.poison', 'x', 'utf-8', '{}', '{\"priority\":12}'),"
	        " ('%s', '%s', 'soak.poison', 'x', 'utf-8', '{}', '{\"expiration\":\"abc\"}'),"
	        " ('%s', 'soak_missing_%s', 'soak.poison', 'x', 'utf-8', '{}', '{}'),"
	        " ('%s', '%s', 'unrouted.poison', 'x', 'utf-8', '{}', '{}')",
	        t, ids[POISON_BAD_BASE64], ex, ids[POISON_BAD_ENCODING], ex,
	        ids[POISON_HEADERS_NOT_OBJECT], ex, ids[POISON_PROPERTIES_NOT_OBJECT], ex,
	        ids[POISON_UNKNOWN_PROPERTY], ex, ids[POISON_PRIORITY], ex, ids[POISON_EXPIRATION],
	        ex, ids[POISON_MISSING_EXCHANGE], t, ids[POISON_UNROUTABLE], ex);
	harness_pg_exec(pg, "COMMIT");
	for (int k = 0; k < POISON_N; k++)
		soak_poison_add(ids[k], (enum soak_poison)k);
}

static int64_t poison_dead(struct soak *s, int round)
{
	return harness_pg_int(main_pg(s),
	                      "SELECT count(*) FROM %s WHERE id LIKE 'poison-%04d-%%'"
	                      " AND %s AND attempts >= %d",
	                      s->fx.table, round, soak_unpublished(), SOAK_MAX_ATTEMPTS);
}

static void inject(struct soak *s, enum soak_fault kind)
{
	int i = (int)(rnd(s) % (uint64_t)s->o.relays), f;
	struct slot *sl = &s->slots[i];
	char which[32];
	int64_t hold, took;

	switch (kind) {
	case SOAK_RELAY_KILL:
		f = soak_fault_begin(kind, "relay=%d pid=%ld", i, (long)sl->r->pid);
		soak_life_end(sl->life);
		harness_relay_kill(sl->r);
		harness_relay_free(sl->r);
		harness_sleep_ms(rnd_between(s, 0, 2000));
		relay_start(s, i);
		soak_fault_end(f, "restarted pid=%ld", (long)sl->r->pid);
		break;
	case SOAK_RELAY_TERM: {
		/* Sometimes with the broker silent, so that confirms never come: the relay must
		 * still stop within its shutdown timeout and exit 0. */
		bool stall = rnd(s) % 3 == 0;
		int st;

		f = soak_fault_begin(kind, "relay=%d pid=%ld%s", i, (long)sl->r->pid,
		                     stall ? " broker_connection=stalled" : "");
		if (stall) {
			proxy_stall(sl->mq, true);
			harness_sleep_ms(1000);
		}
		st = relay_term(s, i, &took);
		if (stall)
			proxy_stall(sl->mq, false);
		relay_start(s, i);
		soak_fault_end(f, "exit=%d in %.1f s, restarted pid=%ld", st, (double)took / 1000.0,
		               (long)sl->r->pid);
		break;
	}
	case SOAK_BROKER_APP:
		hold = rnd_between(s, 1000, 5000);
		f = soak_fault_begin(kind, "rabbitmqctl stop_app, start_app after %.1f s",
		                     (double)hold / 1000.0);
		harness_broker_stop_app();
		harness_sleep_ms(hold);
		harness_broker_start_app();
		soak_fault_end(f, "app running");
		break;
	case SOAK_BROKER_NODE:
		f = soak_fault_begin(kind, "node stop, start");
		harness_broker_node_stop();
		harness_sleep_ms(rnd_between(s, 0, 2000));
		harness_broker_node_start();
		soak_fault_end(f, "node running");
		break;
	case SOAK_MEM_ALARM:
		hold = rnd_between(s, 2000, 8000);
		f = soak_fault_begin(kind, "vm_memory_high_watermark absolute 1 for %.1f s",
		                     (double)hold / 1000.0);
		memory_alarm(true);
		harness_sleep_ms(hold);
		memory_alarm(false);
		soak_fault_end(f, "watermark back to 0.4");
		break;
	case SOAK_PG_RESTART:
		f = soak_fault_begin(kind, "pg_ctl restart -m fast");
		harness_pg_restart();
		soak_fault_end(f, "accepting connections");
		break;
	case SOAK_PROXY_DROP: {
		unsigned m = pick_relays(s, which, sizeof(which));
		int target = (int)(rnd(s) % 3); /* 0 broker, 1 database, 2 both */
		static const char *const tn[] = { "broker", "database", "broker+database" };

		f = soak_fault_begin(kind, "relays=%s connections=%s", which, tn[target]);
		for (int r = 0; r < s->o.relays; r++) {
			if (!(m & (1u << r)))
				continue;
			if (target != 1)
				proxy_drop_all(s->slots[r].mq);
			if (target != 0)
				proxy_drop_all(s->slots[r].db);
		}
		soak_fault_end(f, "cut");
		break;
	}
	case SOAK_PROXY_STALL: {
		unsigned m = pick_relays(s, which, sizeof(which));
		bool db = rnd(s) % 2;

		/* Broker: 1-8 s against a 3 s confirm timeout; database: 1-13 s against the 10 s
		 * lease after which the relay gives a silent connection up. */
		hold = db ? rnd_between(s, 1000, 13000) : rnd_between(s, 1000, 8000);
		f = soak_fault_begin(kind, "relays=%s connections=%s for %.1f s", which,
		                     db ? "database" : "broker", (double)hold / 1000.0);
		for (int r = 0; r < s->o.relays; r++)
			if (m & (1u << r))
				proxy_stall(db ? s->slots[r].db : s->slots[r].mq, true);
		harness_sleep_ms(hold);
		for (int r = 0; r < s->o.relays; r++)
			if (m & (1u << r))
				proxy_stall(db ? s->slots[r].db : s->slots[r].mq, false);
		soak_fault_end(f, "flowing again");
		break;
	}
	case SOAK_POISON: {
		char ids[POISON_N][64];
		int round = ++s->poison_rounds;
		int64_t deadline, dead = 0;

		f = soak_fault_begin(kind, "round=%d: %d rows that can never be published", round,
		                     POISON_N);
		insert_poison(s, round, ids);
		/* The fault lasts until every one of them is dead. */
		deadline = soak_ms() + POISON_DEAD_TIMEOUT_MS;
		while (soak_ms() < deadline && (dead = poison_dead(s, round)) < POISON_N) {
			check_relays(s);
			harness_sleep_ms(200);
		}
		if (dead < POISON_N)
			soak_fail(CHECK_POISON,
			          "round %d: only %" PRId64 " of %d poison rows dead after %d s",
			          round, dead, POISON_N, POISON_DEAD_TIMEOUT_MS / 1000);
		soak_fault_end(f, "%" PRId64 " of %d dead", dead, POISON_N);
		break;
	}
	default:
		break;
	}
}

/* Faults in a shuffled deck of the enabled kinds, redealt when used up: random, yet every
 * kind comes round once per deck. Spaced by 3-15 s, and one time in eight by 35-45 s so
 * that the pending-age check also sees quiet stretches while producers run. */
static void fault_phase(struct soak *s)
{
	enum soak_fault deck[SOAK_N_FAULTS];
	size_t n_deck = 0, next = 0;
	int64_t end = soak_ms() + s->o.duration_ms;

	for (int k = 0; k < SOAK_N_FAULTS; k++)
		if (s->o.faults & (1u << k))
			deck[n_deck++] = (enum soak_fault)k;
	if (n_deck == 0) {
		watch(s, s->o.duration_ms);
		return;
	}
	watch(s, 5000); /* a first look at the steady state */
	while (soak_ms() < end && !should_stop(s)) {
		int64_t gap;

		if (next == 0) {
			for (size_t i = n_deck; i > 1; i--) {
				size_t j = (size_t)(rnd(s) % i);
				enum soak_fault x = deck[i - 1];

				deck[i - 1] = deck[j];
				deck[j] = x;
			}
		}
		inject(s, deck[next]);
		next = (next + 1) % n_deck;
		check_relays(s);
		gap = rnd(s) % 8 == 0 ? rnd_between(s, 35000, 45000) : rnd_between(s, 3000, 15000);
		if (soak_ms() + gap > end)
			gap = end - soak_ms();
		if (gap > 0)
			watch(s, gap);
	}
}

/* Waits until every committed row arrived and no poison round is left alive, or timeout. */
static void drain(struct soak *s)
{
	int64_t end = soak_ms() + s->o.drain_ms;
	size_t missing = 0;

	while (soak_ms() < end && !interrupted) {
		if (soak_all_delivered(&missing))
			break;
		check_relays(s);
		harness_sleep_ms(200);
	}
	soak_say("drain: %s (%zu committed rows not delivered)",
	         missing == 0 ? "every committed row delivered" : "TIMED OUT", missing);
	/* Late duplicates (a redelivery on its way) still count. */
	harness_sleep_ms(3000);
}

/* Waits until the consumer has had nothing new for 2 s (at most 20 s). */
static void settle_deliveries(struct consumer *c)
{
	int64_t end = soak_ms() + 20000;
	size_t last = consumer_received(c);

	while (soak_ms() < end) {
		size_t now;

		harness_sleep_ms(2000);
		now = consumer_received(c);
		if (now == last)
			break;
		last = now;
	}
}

/* The dead rows where the operator finds them: `outbox-relay dead`, run as the relays run
 * (max attempts 5), lists the poison rows and no other. */
static void final_dead_list(struct soak *s)
{
	static const char *const env[] = { "OUTBOX_RELAY_MAX_ATTEMPTS=5", NULL };
	struct harness_output o;

	harness_cli(&o, s->fx.table, env, "dead", "--json", "--limit", "100000", NULL);
	if (o.status != 0)
		soak_fail(CHECK_HARNESS, "outbox-relay dead exited %d: %.300s", o.status, o.err);
	else
		soak_final_dead_list(o.out);
	harness_output_free(&o);
}

static void print_summary(struct soak *s, int64_t fault_phase_ms)
{
	struct soak_totals t;
	int64_t worst_by_kind[SOAK_N_FAULTS], worst_ms;
	double pend_all, pend_clear;
	size_t total_faults = 0, res_in, res_out;
	int worst;

	soak_totals(&t);
	worst = soak_recovery(worst_by_kind, &worst_ms);
	soak_pending_max(&pend_all, &pend_clear);
	printf("\n==== outbox-soak summary: seed=%" PRIu64 " duration=%.0fs (faults) relays=%d "
	       "producers=%d rate=%d/s keys=%d source=%s ====\n",
	       s->o.seed, (double)fault_phase_ms / 1000.0, s->o.relays, s->o.producers, s->o.rate,
	       s->o.keys, soak_cursor() ? "cursor" : "lease");
	printf("%-14s %7s %12s %12s\n", "fault", "count", "worst_rec_s", "dups_after");
	for (int k = 0; k < SOAK_N_FAULTS; k++) {
		size_t n = soak_fault_count((enum soak_fault)k);
		char rec[32];

		total_faults += n;
		if (worst_by_kind[k] >= 0)
			snprintf(rec, sizeof(rec), "%.1f", (double)worst_by_kind[k] / 1000.0);
		else
			snprintf(rec, sizeof(rec), "%s", worst_by_kind[k] == -2 ? "n/a" : "-");
		printf("%-14s %7zu %12s %12zu\n", soak_fault_names[k], n, rec, t.dup_by_kind[k]);
	}
	printf("%-14s %7zu %12s %12zu\n", "total", total_faults, "", t.duplicates);
	printf("\nrows committed            %zu (keyed %zu, unkeyed %zu)\n", t.committed,
	       t.committed_keyed, t.committed - t.committed_keyed);
	producers_resolved(&res_in, &res_out);
	printf("  interrupted transactions looked up afterwards: %zu had committed, %zu had not "
	       "(run again)\n",
	       res_in, res_out);
	printf("rows delivered (unique)   %zu (%zu deliveries)\n", t.delivered_unique,
	       t.deliveries);
	printf("lost                      %zu (never delivered, and published or gone)\n", t.lost);
	printf("stuck                     %zu (never delivered, still unpublished when the drain "
	       "ended)\n",
	       t.stuck);
	printf("duplicates                %zu, every one after a fault (by kind above); "
	       "unexplained: %zu\n",
	       t.duplicates, soak_failures(CHECK_DUPLICATE));
	printf("poison rows               %zu inserted in %d rounds, %zu delivered, %zu not as "
	       "expected\n",
	       t.poison, s->poison_rounds, t.poison_delivered, soak_failures(CHECK_POISON));
	if (worst >= 0)
		printf("worst recovery            %.1f s (fault %d)\n", (double)worst_ms / 1000.0,
		       worst);
	else
		printf("worst recovery            -\n");
	printf("  recovery of a fault = the first delivery, at or after the fault's end, of a row\n"
	       "  whose COMMIT was sent at or after the fault began, minus the fault's end\n");
	printf("max pending age           %.1f s overall; %.1f s with faults clear for %d s (bound "
	       "%d s)\n",
	       pend_all, pend_clear, SOAK_PENDING_CLEAR_MS / 1000, SOAK_PENDING_BOUND_MS / 1000);
	printf("SIGTERM exits             %d, %d with status 0 in time, slowest %.1f s (bound %.1f "
	       "s)\n",
	       s->terms, s->terms_ok, (double)s->term_slowest_ms / 1000.0,
	       (double)(SOAK_SHUTDOWN_TIMEOUT_MS + 1000 + TERM_SLACK_MS) / 1000.0);
	soak_rss_report("relay-logs/soak-rss.csv");
	printf("\nchecks failed:");
	for (int c = 0; c < SOAK_N_CHECKS; c++)
		printf(" %s=%zu", soak_check_names[c], soak_failures((enum soak_check)c));
	printf("\nRESULT: %s\n", soak_failures_total() == 0 && !interrupted ? "PASS" : "FAIL");
	fflush(stdout);
}

static void run(const struct soak_options *o)
{
	static struct soak s;
	int64_t fault_start, fault_ms;

	memset(&s, 0, sizeof(s));
	s.o = *o;
	s.rng = o->seed * 2654435761u + 88172645463325252ull;
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	soak_clock_start();
	soak_say("outbox-soak seed=%" PRIu64 " duration=%.0fs quiet=%.0fs relays=%d producers=%d "
	         "rate=%d/s keys=%d keep_going=%d (repeat with --seed %" PRIu64 ")",
	         o->seed, (double)o->duration_ms / 1000.0, (double)o->quiet_ms / 1000.0, o->relays,
	         o->producers, o->rate, o->keys, o->keep_going, o->seed);
	{
		/* A relay built with ASan keeps freed memory in a quarantine of 256 MB by default,
		 * which takes minutes to fill at this rate and would look like a leak to the RSS
		 * check; 8 MB fills within its warm-up. (The harness passes ASAN_OPTIONS on.) */
		const char *a = getenv("ASAN_OPTIONS");
		char opts[1024];

		snprintf(opts, sizeof(opts), "%s%squarantine_size_mb=8", a ? a : "",
		         a && *a ? ":" : "");
		setenv("ASAN_OPTIONS", opts, 1);
	}
	fixture_setup(&s.fx, "soak", &(struct fixture_options){ .binding = "soak.#" });
	soak_source_init(s.fx.table);
	soak_say("table %s, exchange %s, queue %s, relay.source %s; relay logs in ./relay-logs",
	         s.fx.table, s.fx.exchange, s.fx.queue, harness_source());
	for (int i = 0; i < o->relays; i++) {
		s.slots[i].mq = proxy_start(harness_amqp_port());
		s.slots[i].db = proxy_start(
		        (int)strtol(harness_require_env("RELAY_TEST_PG_PORT"), NULL, 10));
		relay_start(&s, i);
		soak_say("relay %d pid %ld log %s http %s", i, (long)s.slots[i].r->pid,
		         s.slots[i].r->log_path, s.slots[i].listen);
	}
	soak_checker_start(s.fx.cons, o->producers);
	soak_samplers_start(harness_pg_conninfo(), s.fx.table);
	producers_start(harness_pg_conninfo(), s.fx.table, s.fx.exchange, o->producers, o->rate,
	                o->keys, o->seed);

	fault_start = soak_ms();
	fault_phase(&s);
	fault_ms = soak_ms() - fault_start;
	soak_say("faults over; %s", should_stop(&s) ? "stopping early" : "quiet phase");
	if (!should_stop(&s))
		watch(&s, o->quiet_ms);
	if (producers_stop() > 0)
		soak_fail(CHECK_HARNESS, "a producer never learned whether a COMMIT went through");
	soak_say("producers stopped; draining");
	drain(&s);
	for (int i = 0; i < o->relays; i++) {
		int64_t took;

		if (s.slots[i].r->exited || harness_relay_wait(s.slots[i].r, 0) >= 0)
			relay_restart_after_death(&s, i);
		relay_term(&s, i, &took);
	}
	/* A relay stopping publishes and marks what it had in flight: the checker goes on
	 * until those deliveries are in, or a row marked published now would look lost. */
	settle_deliveries(s.fx.cons);
	soak_checker_stop();
	soak_samplers_stop();
	soak_final_table_check(main_pg(&s), s.fx.table);
	final_dead_list(&s);
	print_summary(&s, fault_ms);
	for (int i = 0; i < o->relays; i++) {
		proxy_stop(s.slots[i].mq);
		proxy_stop(s.slots[i].db);
	}
	if (soak_failures_total() == 0) {
		fixture_teardown(&s.fx);
	} else {
		/* The table stays for a look; the consumer and its queue go. */
		consumer_stop(s.fx.cons);
		s.fx.cons = NULL;
		PQfinish(s.fx.pg);
		printf("table %s kept for inspection\n", s.fx.table);
	}
	cr_assert(!interrupted, "interrupted");
	cr_assert_eq(soak_failures_total(), 0, "%zu checks failed (see above)",
	             soak_failures_total());
}

/* The options travel to criterion's test process, a fresh exec of this program, as
 * OUTBOX_SOAK_ARGS_<n> variables (the relays get a clean environment: harness.c). */
Test(soak, run, .timeout = 0)
{
	char name[64], err[256];
	char *argv[64];
	int argc = 0;
	struct soak_options o;
	const char *v;

	argv[argc++] = "outbox-soak";
	for (int i = 0; argc < 63; i++) {
		snprintf(name, sizeof(name), ARGS_ENV "%d", i);
		if ((v = getenv(name)) == NULL)
			break;
		argv[argc++] = (char *)v;
	}
	argv[argc] = NULL;
	setvbuf(stdout, NULL, _IOLBF, 0);
	cr_assert_eq(soak_parse_args(argc, argv, &o, err, sizeof(err)), 0, "%s", err);
	run(&o);
}

/* Whatever became of the test process: the broker app running with its default memory
 * watermark, the node and PostgreSQL up. Best effort, plain shell (no criterion here). */
static void restore_servers(void)
{
	const char *ctl = getenv("RELAY_TEST_RABBITMQCTL");
	const char *start = getenv("RELAY_TEST_RABBITMQ_START");
	const char *pg_ctl = getenv("RELAY_TEST_PG_CTL");
	char cmd[2048];

	if (ctl && start) {
		snprintf(cmd, sizeof(cmd),
		         "'%s' -q ping >/dev/null 2>&1 || '%s' >/dev/null 2>&1;"
		         " '%s' start_app >/dev/null 2>&1;"
		         " '%s' set_vm_memory_high_watermark 0.4 >/dev/null 2>&1",
		         ctl, start, ctl, ctl);
		if (system(cmd) != 0)
			fprintf(stderr, "outbox-soak: could not restore the broker\n");
	}
	if (pg_ctl) {
		snprintf(cmd, sizeof(cmd),
		         "'%s' status >/dev/null 2>&1 || '%s' start -w -t 60 >/dev/null 2>&1",
		         pg_ctl, pg_ctl);
		if (system(cmd) != 0)
			fprintf(stderr, "outbox-soak: could not restore PostgreSQL\n");
	}
}

int main(int argc, char *argv[])
{
	struct criterion_test_set *tests;
	struct soak_options o;
	char err[256], name[64];
	char *cargv[] = { argv[0], NULL };
	int result = 1;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
			soak_usage();
			return 0;
		}
	}
	if (soak_parse_args(argc, argv, &o, err, sizeof(err)) != 0) {
		fprintf(stderr, "outbox-soak: %s\n", err);
		soak_usage();
		return 2;
	}
	/* The seed is fixed here, so that the test process and the printed line agree. */
	snprintf(err, sizeof(err), "%" PRIu64, o.seed);
	for (int i = 1; i < argc && i < 60; i++) {
		snprintf(name, sizeof(name), ARGS_ENV "%d", i - 1);
		setenv(name, argv[i], 1);
	}
	snprintf(name, sizeof(name), ARGS_ENV "%d", argc - 1);
	setenv(name, "--seed", 1);
	snprintf(name, sizeof(name), ARGS_ENV "%d", argc);
	setenv(name, err, 1);
	/* Ctrl-C reaches the whole process group: the test process reports and stops; this one
	 * waits for it and then restores the servers. */
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);

	tests = criterion_initialize();
	/* The soak bounds its own waits; this only stops a hang. */
	criterion_options.timeout =
	        (double)(o.duration_ms + o.quiet_ms + o.drain_ms) / 1000.0 + 900.0;
	criterion_options.jobs = 1;
	if (criterion_handle_args(1, cargv, true))
		result = !criterion_run_all_tests(tests);
	criterion_finalize(tests);
	restore_servers();
	return result;
}
