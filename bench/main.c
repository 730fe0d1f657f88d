/* outbox-bench's driver: reads the options, prints the machine's facts, runs the measurements
 * of the table below in order against the PostgreSQL and RabbitMQ that bench/run started, and
 * prints the summary line that scripts and the README read.
 *
 * Adding a measurement takes one file and one row:
 * - bench/<name>.c defines `void measure_<name>(struct bench *b)` (its prototype goes in the
 *   list in bench.h). It prints its lines as "<name>: ...", stores its figures with
 *   bench_set() and, when it cannot finish, calls bench_fail() and returns; the run goes on.
 *   It stands on db.h (connections, outbox tables), mq.h (queues, the measuring consumer),
 *   proc.h (the relay process, /proc), drain.h (the relay draining a pre-filled table) and
 *   memory.h (note the relay's peak RSS). CMake picks the file up by itself.
 * - its row in `measurements`: the name for --only, whether it runs once per row source (a
 *   measurement that starts the relay does: --source), the function, and the keys it sets,
 *   which are appended to the summary line in table order ("-" when it did not run), the
 *   lease source's as they are and the cursor source's with the prefix "cursor_". A target
 *   of its own goes on the targets line in print_summary().
 * A measurement run per source prints its lines as "<name>/<source>: ..." (b->what) and
 * finds its source in b->source; bench_set() and bench_get() pick that source's keys. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>
#include <amqp.h>

#include "bench/bench.h"
#include "bench/db.h"
#include "bench/mq.h"

/* In the order they run. A row without a function only reports, after every run, on figures
 * others noted (memory: the relay, backlog and keys runs note their relay's peak RSS). */
static const struct bench_measurement measurements[] = {
	{ "limit", false, measure_limit, NULL, { { "limit", 0 } } },
	{ "relay",
	  true,
	  measure_relay,
	  NULL,
	  { { "relay", 0 },
	    { "ratio", 2 },
	    { "pg_us", 1 },
	    { "mq_us", 1 },
	    { "relay_us", 1 },
	    { "wal_bytes", 0 },
	    { "wal_records", 3 },
	    { "wal_insert_bytes", 0 } } },
	{ "idle", true, measure_idle, NULL, { { "p50_ms", 2 }, { "p95_ms", 2 }, { "p99_ms", 2 } } },
	{ "load",
	  true,
	  measure_load,
	  NULL,
	  { { "load_rate", 0 },
	    { "load_p50_ms", 2 },
	    { "load_p99_ms", 2 },
	    { "load_pg_us", 1 },
	    { "load_floor_p50_ms", 2 },
	    { "load_floor_p99_ms", 2 },
	    { "load_floor_pg_us", 1 } } },
	{ "producer",
	  true,
	  measure_producer,
	  NULL,
	  { { "producer_with", 0 },
	    { "producer_without", 0 },
	    { "producer_ratio", 2 },
	    { "producer_alone_ratio", 2 },
	    { "producer_il_ratio", 2 },
	    { "producer_il_relay_ratio", 2 },
	    { "producer_il_durable_ratio", 2 },
	    { "producer_il_durable_relay_ratio", 2 },
	    { "trigger_us", 1 },
	    { "trigger_tx_us", 1 } } },
	{ "backlog",
	  true,
	  measure_backlog,
	  NULL,
	  { { "backlog_first", 0 }, { "backlog_last", 0 }, { "backlog_ratio", 2 } } },
	{ "memory", true, NULL, report_memory, { { "rss_kb", 0 }, { "rss_max_kb", 0 } } },
	{ "keys",
	  true,
	  measure_keys,
	  NULL,
	  { { "keys", 0 }, { "nokeys", 0 }, { "keys_ratio", 2 } } },
	/* A prototype's figures (issue 37), not the relay's: the four row sources' rows/s,
	 * PostgreSQL CPU and WAL per message, and the WAL a logical slot held per row while
	 * no relay ran. */
	{ "sources",
	  false,
	  measure_sources,
	  NULL,
	  { { "src_l", 0 },
	    { "src_a", 0 },
	    { "src_b", 0 },
	    { "src_c", 0 },
	    { "src_l_pg_us", 1 },
	    { "src_a_pg_us", 1 },
	    { "src_b_pg_us", 1 },
	    { "src_c_pg_us", 1 },
	    { "src_l_wal", 0 },
	    { "src_a_wal", 0 },
	    { "src_b_wal", 0 },
	    { "src_c_wal", 0 },
	    { "src_b_held", 0 } } },
	/* A long history, plain against partitioned (--only history). */
	{ "history",
	  false,
	  measure_history,
	  NULL,
	  { { "history_plain_rate", 0 },
	    { "history_part_rate", 0 },
	    { "history_plain_pg_us", 1 },
	    { "history_part_pg_us", 1 },
	    { "history_plain_purge_s", 1 },
	    { "history_part_purge_s", 2 },
	    { "history_plain_after_mb", 0 },
	    { "history_part_after_mb", 0 },
	    { "history_plain_steady_mb", 0 },
	    { "history_part_steady_mb", 0 } } },
	/* The two sources side by side, from the figures above: the cursor's throughput and
	 * PostgreSQL CPU per message against the lease's in the same run. */
	{ "versus",
	  false,
	  NULL,
	  report_versus,
	  { { "cursor_lease_ratio", 2 }, { "cursor_lease_pg_ratio", 2 } } },
};

#define N_MEASUREMENTS (sizeof(measurements) / sizeof(measurements[0]))

/* Measurements that run only when --only names them, never in a full run: a prototype's
 * figures, which the relay's targets do not read. */
static const char *const on_request[] = { "sources", "history" };

static bool in_full_run(const char *name)
{
	for (size_t i = 0; i < sizeof(on_request) / sizeof(on_request[0]); i++) {
		if (strcmp(on_request[i], name) == 0)
			return false;
	}
	return true;
}

static void on_signal(int sig)
{
	(void)sig;
	bench_interrupt();
}

/* ---- machine facts ---- */

static void print_facts(struct bench *b)
{
	char model[256] = "unknown", line[512], pgv[128] = "unknown", fs[32] = "?", sc[32] = "?";
	char sb[32] = "?", hp[32] = "?";
	char rmqv[64] = "unknown", err[256];
	struct utsname u;
	FILE *f = fopen("/proc/cpuinfo", "r");
	bool lease = bench_measures(b, BENCH_LEASE), cursor = bench_measures(b, BENCH_CURSOR);
	PGconn *c;
	amqp_connection_state_t m;

	if (f) {
		while (fgets(line, sizeof(line), f)) {
			if (strncmp(line, "model name", 10) == 0) {
				char *v = strchr(line, ':');

				if (v) {
					v += strspn(v + 1, " \t") + 1;
					v[strcspn(v, "\n")] = '\0';
					snprintf(model, sizeof(model), "%s", v);
				}
				break;
			}
		}
		fclose(f);
	}
	c = PQconnectdb(b->opt.pg);
	if (PQstatus(c) == CONNECTION_OK) {
		db_show(c, "SHOW server_version", pgv, sizeof(pgv));
		db_show(c, "SHOW fsync", fs, sizeof(fs));
		db_show(c, "SHOW synchronous_commit", sc, sizeof(sc));
		db_show(c, "SHOW shared_buffers", sb, sizeof(sb));
		db_show(c, "SHOW huge_pages", hp, sizeof(hp));
	}
	PQfinish(c);
	m = mq_open(b, err, sizeof(err));
	if (m) {
		mq_server_version(m, rmqv, sizeof(rmqv));
		mq_close(m);
	}
	if (uname(&u) != 0)
		snprintf(u.release, sizeof(u.release), "?");
	printf("machine: %ld cores, %s, Linux %s\n", sysconf(_SC_NPROCESSORS_ONLN), model,
	       u.release);
	printf("versions: PostgreSQL %s (fsync=%s, synchronous_commit=%s, shared_buffers=%s, "
	       "huge_pages=%s), RabbitMQ %s, rabbitmq-c %s, relay %s\n",
	       pgv, fs, sc, sb, hp, rmqv, amqp_version(), b->opt.relay);
	printf("sizes: rows %ld, backlog %ld, phases %d s, body %d B, relay.retention %s%s\n",
	       b->opt.n_tput, b->opt.n_backlog, b->opt.phase_s, BENCH_BODY_LEN, b->opt.retention,
	       b->opt.quick ? " (--quick)" : "");
	printf("topology: %s\n", bench_topology_name(b->opt.topology));
	printf("sources: %s%s%s%s\n", lease ? "lease" : "", lease && cursor ? ", " : "",
	       cursor ? "cursor" : "",
	       lease && cursor ? " (each measurement that starts the relay runs once for each, "
	                         "the first of the two alternating from one to the next)"
	                       : "");
	fflush(stdout);
}

/* ---- summary ---- */

static void print_summary(const struct bench *b)
{
	double rt = bench_ratio_target(b);

	printf("summary:");
	for (size_t i = 0; i < b->n_figures; i++) {
		double v = b->figures[i].value;

		if (isnan(v))
			printf(" %s=-", b->figures[i].key);
		else
			printf(" %s=%.*f", b->figures[i].key, b->figures[i].decimals, v);
	}
	printf(" failures=%d\n", b->failures);
	printf("targets: ratio>=%.2f backlog_ratio>=0.90 p50_ms<=2 p99_ms<=10 producer_ratio>=0.95 "
	       "producer_il_ratio>=0.95 producer_il_relay_ratio>=0.95 "
	       "producer_il_durable_ratio>=0.95 "
	       "producer_il_durable_relay_ratio>=0.95 rss_kb<=12288 "
	       "load_p99_ms<=10 cursor_ratio>=%.2f cursor_lease_ratio>=1.50 "
	       "cursor_lease_pg_ratio<=0.33 cursor_p50_ms<=1 cursor_p99_ms<=5 "
	       "cursor_load_p99_ms<=10 (topology %s)\n",
	       rt, rt, bench_topology_name(b->opt.topology));
}

/* ---- command line ---- */

static void usage(FILE *out)
{
	const char *sep = "";

	fputs("usage: outbox-bench [--quick] [--only NAME[,NAME...]] [--source lease|cursor|both]\n"
	      "                    [--topology shared|split-cores|broker-core] [--relay PATH]\n"
	      "                    [--rows N] [--backlog N] [--seconds S] [--workers N]\n"
	      "                    [--history plain|partitioned|both]\n"
	      "                    [--batch N] [--retention D] [--load-rate R] [--load-batch N]\n"
	      "                    [--rounds N]\n"
	      "  NAME: ",
	      out);
	for (size_t i = 0; i < N_MEASUREMENTS; i++) {
		if (measurements[i].run) {
			fprintf(out, "%s%s", sep, measurements[i].name);
			sep = ", ";
		}
	}
	fprintf(out,
	        " (memory comes with relay/backlog; sources and history only with --only;\n"
	        "  several names, comma-separated, run in the usual order: limit,relay gives the\n"
	        "  relay's ratio to the limit of the same run)\n"
	        "  --source: the relay's row source(s) (relay.source) in every measurement that\n"
	        "  starts the relay (default both, in turn)\n"
	        "  --topology: where bench/run put the servers, for the targets (default shared)\n"
	        "  --load-rate: rows/s of the load run (default: half the relay's figure of the\n"
	        "  same run and source, else %d)\n"
	        "  --load-batch: rows per commit of the load run (default 1)\n"
	        "  --rounds: run the selected measurements N times in turn (at most %d); the\n"
	        "  relay's ratio is taken to the limit of its own round, and the summary gets\n"
	        "  medians of every figure (--only limit,relay --rounds 5: a ratio the\n"
	        "  broker's moods do not decide)\n"
	        "  environment: RELAY_TEST_PG (libpq conninfo), RELAY_TEST_AMQP (amqp:// URL)\n",
	        BENCH_LOAD_RATE_DFLT, BENCH_ROUNDS_MAX);
}

static int parse_long(const char *s, long min, long max, long *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < min || v > max)
		return -1;
	*out = v;
	return 0;
}

/* The relay of the same build sits in the parent directory of outbox-bench's (bench/). */
static char *default_relay(const char *argv0)
{
	char self[4096], *slash, *path;
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	size_t len;

	if (n <= 0) {
		snprintf(self, sizeof(self), "%s", argv0);
		n = (ssize_t)strlen(self);
	}
	self[n] = '\0';
	slash = strrchr(self, '/');
	if (!slash)
		return strdup("./outbox-relay");
	*slash = '\0';
	len = strlen(self) + 32;
	path = malloc(len);
	if (!path)
		return NULL;
	snprintf(path, len, "%s/outbox-relay", self);
	if (access(path, X_OK) == 0)
		return path;
	snprintf(path, len, "%s/../outbox-relay", self);
	return path;
}

/* Whether name is one of list's comma-separated names. */
static bool listed(const char *list, const char *name)
{
	size_t n = strlen(name);

	for (const char *p = list; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
		if (strncmp(p, name, n) == 0 && (p[n] == ',' || p[n] == '\0'))
			return true;
	}
	return false;
}

/* Whether every name of list (comma-separated) is a measurement that runs. */
static bool selectable(const char *list)
{
	for (const char *p = list; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
		size_t n = strcspn(p, ",");
		bool found = false;

		for (size_t i = 0; i < N_MEASUREMENTS && !found; i++)
			found = measurements[i].run && strlen(measurements[i].name) == n &&
			        strncmp(measurements[i].name, p, n) == 0;
		if (!found)
			return false;
	}
	return true;
}

static int parse_sources(const char *s, unsigned *out)
{
	if (strcmp(s, "lease") == 0)
		*out = 1u << BENCH_LEASE;
	else if (strcmp(s, "cursor") == 0)
		*out = 1u << BENCH_CURSOR;
	else if (strcmp(s, "both") == 0)
		*out = 1u << BENCH_LEASE | 1u << BENCH_CURSOR;
	else
		return -1;
	return 0;
}

static int parse_topology(const char *s, enum bench_topology *out)
{
	for (int i = BENCH_SHARED; i <= BENCH_BROKER_CORE; i++) {
		if (strcmp(s, bench_topology_name((enum bench_topology)i)) == 0) {
			*out = (enum bench_topology)i;
			return 0;
		}
	}
	return -1;
}

/* Fills o from argv; 0 to run, 1 when --help was printed, 2 on a bad argument. */
static int parse_args(int argc, char **argv, struct bench_options *o)
{
	long rows = 0, backlog = 0, secs = 0, rounds = 1;

	o->retention = "30d";
	o->history_tables = 3u;
	o->sources = 1u << BENCH_LEASE | 1u << BENCH_CURSOR;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (strcmp(a, "--quick") == 0) {
			o->quick = true;
		} else if (strcmp(a, "--only") == 0 && v) {
			o->only = v;
			i++;
		} else if (strcmp(a, "--source") == 0 && v && parse_sources(v, &o->sources) == 0) {
			i++;
		} else if (strcmp(a, "--topology") == 0 && v &&
		           parse_topology(v, &o->topology) == 0) {
			i++;
		} else if (strcmp(a, "--relay") == 0 && v) {
			o->relay = v;
			i++;
		} else if (strcmp(a, "--rows") == 0 && v &&
		           parse_long(v, 10, 100000000, &rows) == 0) {
			i++;
		} else if (strcmp(a, "--backlog") == 0 && v &&
		           parse_long(v, 10, 100000000, &backlog) == 0) {
			i++;
		} else if (strcmp(a, "--seconds") == 0 && v && parse_long(v, 1, 3600, &secs) == 0) {
			i++;
		} else if (strcmp(a, "--workers") == 0 && v &&
		           parse_long(v, 1, 64, &o->workers) == 0) {
			i++;
		} else if (strcmp(a, "--batch") == 0 && v &&
		           parse_long(v, 1, 10000, &o->batch) == 0) {
			i++;
		} else if (strcmp(a, "--rounds") == 0 && v &&
		           parse_long(v, 1, BENCH_ROUNDS_MAX, &rounds) == 0) {
			i++;
		} else if (strcmp(a, "--load-rate") == 0 && v &&
		           parse_long(v, 1, 1000000, &o->load_rate) == 0) {
			i++;
		} else if (strcmp(a, "--load-batch") == 0 && v &&
		           parse_long(v, 1, 1000, &o->load_batch) == 0) {
			i++;
		} else if (strcmp(a, "--history") == 0 && v &&
		           (strcmp(v, "plain") == 0 || strcmp(v, "partitioned") == 0 ||
		            strcmp(v, "both") == 0)) {
			o->history_tables = v[0] == 'p' ? (v[1] == 'l' ? 1u : 2u) : 3u;
			i++;
		} else if (strcmp(a, "--retention") == 0 && v && v[0] && strlen(v) < 32) {
			/* relay.retention as the relay reads it; the relay refuses a bad one. */
			o->retention = v;
			i++;
		} else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
			usage(stdout);
			return 1;
		} else {
			fprintf(stderr, "outbox-bench: bad argument '%s'\n", a);
			usage(stderr);
			return 2;
		}
	}
	if (o->only && !selectable(o->only)) {
		fprintf(stderr, "outbox-bench: unknown measurement '%s'\n", o->only);
		usage(stderr);
		return 2;
	}
	o->rows = rows;
	o->rounds = (int)rounds;
	o->n_tput = rows ? rows : o->quick ? 10000 : 100000;
	o->n_backlog = backlog ? backlog : o->quick ? 100000 : 1000000;
	o->phase_s = secs ? (int)secs : o->quick ? 3 : 10;
	return 0;
}

/* Declares m's keys on the summary line: once, or once per source for a row run per source
 * (every source's, measured or not, so that the line has the same keys in every run). */
static void declare_row(struct bench *b, const struct bench_measurement *m)
{
	for (int s = 0; s < (m->per_source ? BENCH_N_SOURCES : 1); s++)
		for (size_t j = 0; j < BENCH_ROW_FIGURES && m->figures[j].key; j++) {
			if (m->per_source)
				bench_declare_source(b, &m->figures[j], (enum bench_source)s);
			else
				bench_declare(b, &m->figures[j]);
		}
}

/* Makes s the current source of m's run: b->source and the label of its lines. */
static void enter(struct bench *b, const struct bench_measurement *m, enum bench_source s)
{
	b->source = s;
	if (m->per_source)
		snprintf(b->what, sizeof(b->what), "%s/%s", m->name, bench_source_name(s));
	else
		snprintf(b->what, sizeof(b->what), "%s", m->name);
}

/* Runs the selected measurements in table order, each run per source once for each selected
 * source: lease first in the first of them, cursor first in the next, and so on, so that
 * neither source always runs on a machine the other has just warmed (or loaded). Then the
 * reports, per source where the row is. */
static void run_all(struct bench *b)
{
	int turn = 0;

	for (b->round = 0; b->round < b->opt.rounds && !bench_interrupted(); b->round++) {
		if (b->opt.rounds > 1)
			printf("round %d of %d\n", b->round + 1, b->opt.rounds);
		for (size_t i = 0; i < N_MEASUREMENTS; i++) {
			const struct bench_measurement *m = &measurements[i];

			if (!m->run ||
			    !(b->opt.only ? listed(b->opt.only, m->name) : in_full_run(m->name)))
				continue;
			for (int j = 0; j < (m->per_source ? BENCH_N_SOURCES : 1); j++) {
				enum bench_source s =
				        (enum bench_source)(turn % 2 == 0 ? j : 1 - j);

				if (m->per_source && !bench_measures(b, s))
					continue;
				enter(b, m, s);
				m->run(b);
			}
			turn += m->per_source;
		}
	}
	b->round = -1; /* the reports below set figures of no round */
	if (b->opt.rounds > 1) {
		bench_take_medians(b);
		relay_rounds_report(b);
	}
	for (size_t i = 0; i < N_MEASUREMENTS; i++) {
		const struct bench_measurement *m = &measurements[i];

		if (!m->report)
			continue;
		for (int s = 0; s < (m->per_source ? BENCH_N_SOURCES : 1); s++) {
			if (m->per_source && !bench_measures(b, (enum bench_source)s))
				continue;
			enter(b, m, (enum bench_source)s);
			m->report(b);
		}
	}
	b->source = BENCH_LEASE;
}

int main(int argc, char **argv)
{
	static struct bench b;
	char *relay_path = NULL;
	struct sigaction sa;
	int rc;

	rc = parse_args(argc, argv, &b.opt);
	if (rc != 0)
		return rc == 1 ? 0 : 2;
	b.opt.pg = getenv("RELAY_TEST_PG");
	b.opt.amqp = getenv("RELAY_TEST_AMQP");
	if (!b.opt.pg || !b.opt.amqp) {
		fprintf(stderr, "outbox-bench: RELAY_TEST_PG and RELAY_TEST_AMQP must be set "
		                "(bench/run starts the servers and sets them)\n");
		return 2;
	}
	if (!b.opt.relay) {
		relay_path = default_relay(argv[0]);
		b.opt.relay = relay_path;
	}
	if (!b.opt.relay || access(b.opt.relay, X_OK) != 0) {
		fprintf(stderr, "outbox-bench: relay binary '%s' not found; use --relay PATH\n",
		        b.opt.relay ? b.opt.relay : "?");
		free(relay_path);
		return 2;
	}
	for (size_t i = 0; i < N_MEASUREMENTS; i++)
		declare_row(&b, &measurements[i]);

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	setvbuf(stdout, NULL, _IOLBF, 0);

	print_facts(&b);
	run_all(&b);
	print_summary(&b);
	free(relay_path);
	return b.failures ? 1 : 0;
}
