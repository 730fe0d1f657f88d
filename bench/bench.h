/* bench.h — what the driver (main.c) and the measurements share: the options, the figures
 * that end up on the summary line, failures, clocks, and the row of the driver's table that
 * each measurement fills. Single-threaded unless said otherwise. */
#ifndef OUTBOX_BENCH_BENCH_H
#define OUTBOX_BENCH_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BENCH_BODY_LEN     1024 /* the body of every message, in bytes */
#define BENCH_MAX_FIGURES  64   /* summary keys over all measurements */
#define BENCH_ROW_FIGURES  10   /* summary keys of one measurement */
#define BENCH_BATCH_DFLT   500  /* relay.batch_size when --batch is not given */
#define BENCH_WORKERS_DFLT 1    /* relay.workers when --workers is not given */
/* The load run's commits per second when --load-rate is not given and the relay's throughput
 * was not measured in the same run (it is half of that otherwise). */
#define BENCH_LOAD_RATE_DFLT 4000

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
	long load_rate;        /* the load run's commits/s (0 = half the relay's, see load.c) */
};

/* A key of the summary line and how many decimals its value gets there. */
struct bench_figure {
	const char *key;
	int decimals;
};

/* The run: options, failures so far and every figure of the summary line (NAN until a
 * measurement sets it; printed as "-" then). */
struct bench {
	struct bench_options opt;
	int failures;
	size_t n_figures;
	struct {
		struct bench_figure f;
		double value;
	} figures[BENCH_MAX_FIGURES];
};

/* One row of the driver's table: a measurement. */
struct bench_measurement {
	const char *name; /* for --only; its output lines start with "<name>: " */
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
void report_memory(struct bench *b);    /* memory.c */

/* ---- figures ---- */
/* Declares key on the summary line (the driver does, from its table). */
void bench_declare(struct bench *b, const struct bench_figure *f);
/* Sets a declared figure; a key nobody declared is a bug in the benchmark: it aborts. */
void bench_set(struct bench *b, const char *key, double value);
/* A figure's value, NAN when it was not measured (or not declared). */
double bench_get(const struct bench *b, const char *key);

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
