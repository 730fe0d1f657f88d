/* bench.h — what the driver (main.c) and the measurements share: the options, the figures
 * that end up on the summary line, failures, clocks, and the row of the driver's table that
 * each measurement fills. Single-threaded unless said otherwise. */
#ifndef OUTBOX_BENCH_BENCH_H
#define OUTBOX_BENCH_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BENCH_BODY_LEN     1024 /* the body of every message, in bytes */
#define BENCH_MAX_FIGURES  128  /* summary keys over all measurements */
#define BENCH_KEY_LEN      48   /* a summary key, its source's prefix included */
#define BENCH_ROW_FIGURES  13   /* summary keys of one measurement */
#define BENCH_BATCH_DFLT   500  /* relay.batch_size when --batch is not given */
#define BENCH_WORKERS_DFLT 1    /* relay.workers when --workers is not given */
#define BENCH_ROUNDS_MAX   20   /* --rounds at most */
/* The load run's commits per second when --load-rate is not given and the relay's throughput
 * was not measured in the same run (it is half of that otherwise). */
#define BENCH_LOAD_RATE_DFLT 4000

/* The relay's row sources (relay.source): a measurement that starts the relay runs once for
 * each source the run selects (--source), its figures kept apart. */
enum bench_source {
	BENCH_LEASE,  /* a lease written into each row, each row marked: the summary's bare keys */
	BENCH_CURSOR, /* one position per table: its keys carry the prefix "cursor_" */
	BENCH_N_SOURCES
};

/* Where the servers run (bench/run's pinning), for the targets that depend on it. */
enum bench_topology {
	BENCH_SHARED,      /* everything shares the machine's cores (the default) */
	BENCH_SPLIT_CORES, /* PostgreSQL alone on CPU 0 (--split-cores) */
	BENCH_BROKER_CORE  /* RabbitMQ alone on CPU 1 (--broker-core): production's shape */
};

struct bench_options {
	const char *pg;    /* libpq conninfo (RELAY_TEST_PG) */
	const char *amqp;  /* amqp:// URL (RELAY_TEST_AMQP) */
	const char *relay; /* outbox-relay binary */
	const char *only;  /* NULL = every measurement */
	bool quick;
	long n_tput; /* rows for the limit, throughput and keys runs */
	long rows;   /* --rows as given, 0 when not: a measurement with a default of its own */
	long n_backlog;
	int phase_s;           /* producer cost phase, idle and load latency duration */
	long workers;          /* relay.workers for every relay run (0 = BENCH_WORKERS_DFLT) */
	long batch;            /* relay.batch_size for every relay run (0 = BENCH_BATCH_DFLT) */
	const char *retention; /* relay.retention for every relay run ("0": delete on confirm) */
	/* relay.purge_interval for every relay run; NULL = the relay's default (a measurement
	 * of retention sets it for its own runs) */
	const char *purge_interval;
	/* history's tables: bit 0 plain, bit 1 partitioned (--history; both by default), so
	 * that two runs on servers of their own can take one each at once */
	unsigned history_tables;
	long load_rate;   /* the load run's rows/s (0 = half the relay's, see load.c) */
	long load_batch;  /* the load run's rows per commit (0 = 1) */
	unsigned sources; /* bit (1u << enum bench_source) for each source to measure */
	enum bench_topology topology;
	/* --rounds: the selected measurements run this many times in turn (1 = once), and
	 * every figure is the median of its rounds (bench_take_medians()): the relay's drain is
	 * judged by its ratios to the limit measured just before it, round by round */
	int rounds;
};

/* A key of the summary line and how many decimals its value gets there. */
struct bench_figure {
	const char *key;
	int decimals;
};

/* The run: options, failures so far and every figure of the summary line (NAN until a
 * measurement sets it; printed as "-" then); the source being measured and the label of the
 * measurement's lines. */
struct bench {
	struct bench_options opt;
	int failures;
	enum bench_source source; /* the relay's source in the measurement that runs now */
	/* What the running measurement calls itself in its lines and failures: its name, and
	 * "<name>/<source>" for a measurement that runs once per source ("relay/cursor"). */
	char what[BENCH_KEY_LEN];
	/* With --rounds: the round that runs now (0 ..; -1 once they are over). */
	int round;
	size_t n_figures;
	struct {
		char key[BENCH_KEY_LEN];
		int decimals;
		double value;
		double rounds[BENCH_ROUNDS_MAX]; /* as each round set it (NAN: not) */
	} figures[BENCH_MAX_FIGURES];
};

/* One row of the driver's table: a measurement. */
struct bench_measurement {
	const char *name; /* for --only; its output lines start with "<name>: " */
	/* Runs once per selected source (it starts the relay), its output lines starting with
	 * "<name>/<source>: " and its keys declared once per source (bench_declare_source()). */
	bool per_source;
	/* Measures and prints its figures; NULL for a row that only reports. A measurement
	 * that cannot finish calls bench_fail() and returns: the run goes on with the next. */
	void (*run)(struct bench *b);
	/* Called once every run is done, for figures that come from several runs (memory);
	 * NULL for none. */
	void (*report)(struct bench *b);
	/* Its keys on the summary line, in order (ends at the first NULL key). */
	struct bench_figure figures[BENCH_ROW_FIGURES];
};

/* ---- the measurements, one file each (bench/<name>.c), in the order main.c runs them ---- */
void measure_limit(struct bench *b);    /* limit.c */
void measure_relay(struct bench *b);    /* relay.c */
void measure_idle(struct bench *b);     /* idle.c */
void measure_load(struct bench *b);     /* load.c */
void measure_producer(struct bench *b); /* producer.c */
void measure_backlog(struct bench *b);  /* backlog.c */
void measure_keys(struct bench *b);     /* keys.c */
void measure_sources(struct bench *b);  /* sources.c */
void measure_history(struct bench *b);  /* history.c */
void report_memory(struct bench *b);    /* memory.c */
void report_versus(struct bench *b);    /* versus.c */
/* With --rounds: each source's throughput, ratio to the limit and PostgreSQL CPU per message,
 * round by round, and their medians (relay.c). */
void relay_rounds_report(struct bench *b);

/* ---- sources ---- */
/* "lease" or "cursor": relay.source's value. */
const char *bench_source_name(enum bench_source s);
/* Whether the run measures source s. */
bool bench_measures(const struct bench *b, enum bench_source s);
/* "shared", "split-cores" or "broker-core": as bench/run's options name them. */
const char *bench_topology_name(enum bench_topology t);
/* The relay's throughput target as a share of the broker's limit: 0.90 with the broker on a
 * core of its own (the shape that predicts production), 0.80 otherwise (issue 37). */
double bench_ratio_target(const struct bench *b);
/* The median of v[0 .. n), n > 0; sorts v. */
double bench_median(double *v, int n);

/* ---- figures ---- */
/* Declares key on the summary line (the driver does, from its table). */
void bench_declare(struct bench *b, const struct bench_figure *f);
/* Declares key as source s's figure: key itself for the lease source, "cursor_<key>" for
 * the cursor. */
void bench_declare_source(struct bench *b, const struct bench_figure *f, enum bench_source s);
/* Sets a declared figure: the current source's (b->source) when key was declared per source,
 * else key itself. A key nobody declared is a bug in the benchmark: it aborts. */
void bench_set(struct bench *b, const char *key, double value);
/* A figure's value, the current source's as bench_set() picks it; NAN when it was not
 * measured (or not declared). */
double bench_get(const struct bench *b, const char *key);
/* Source s's figure key, whichever source is current; NAN as bench_get(). */
double bench_get_source(const struct bench *b, enum bench_source s, const char *key);
/* With --rounds: source s's figure key as round r set it; NAN as bench_get(). */
double bench_get_round(const struct bench *b, enum bench_source s, const char *key, int r);
/* With --rounds, once they are over: every figure becomes the median of the values its rounds
 * gave it (a ratio set each round, as the relay's to the limit, is so taken pair by pair). */
void bench_take_medians(struct bench *b);

/* ---- failures ---- */
/* A measurement that could not finish says so ("<what>: FAILED: ...") and counts as failed. */
void bench_fail(struct bench *b, const char *what, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

/* ---- signals and clocks ---- */
/* Whether SIGINT or SIGTERM arrived (set by the driver's handler; any thread may ask). */
bool bench_interrupted(void);
void bench_interrupt(void); /* what the handler does: async-signal-safe */
int64_t bench_mono_us(void);
int64_t bench_real_us(void);
/* Sleeps ms, cut short by an interrupt. */
void bench_sleep_ms(long ms);

/* relay.workers and relay.batch_size of every relay run. */
long bench_workers(const struct bench *b);
long bench_batch(const struct bench *b);

#endif
