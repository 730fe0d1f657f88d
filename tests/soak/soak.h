/* soak.h — what the parts of outbox-soak share: its options, the ledger of every row the
 * producers committed and every delivery the consumer saw, the fault log, the checks that
 * run over them, and the samplers (relay RSS, pending age). The ledger and the samplers are
 * thread-safe and never call criterion: only the main thread may fail the test. */
#ifndef OUTBOX_TESTS_SOAK_H
#define OUTBOX_TESTS_SOAK_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "bench/drive/consumer.h"

#define SOAK_MAX_RELAYS    3
#define SOAK_MAX_PRODUCERS 8
#define SOAK_MAX_KEYS      1024
/* Relay settings the checks depend on (see soak.c for why each). */
#define SOAK_LEASE_MS            10000
#define SOAK_CONFIRM_TIMEOUT_MS  3000
#define SOAK_MAX_ATTEMPTS        5
#define SOAK_SHUTDOWN_TIMEOUT_MS 5000
/* A duplicate is explained by a fault that ended at most lease + this before the first
 * delivery (the row was claimed at most a lease before it was published). */
#define SOAK_DUP_SLACK_MS 5000
/* The pending-age bound: no good row older than this unpublished ... */
#define SOAK_PENDING_BOUND_MS 60000
/* ... once no fault has been active for this long. */
#define SOAK_PENDING_CLEAR_MS 30000

enum soak_fault {
	SOAK_RELAY_KILL,
	SOAK_RELAY_TERM,
	SOAK_BROKER_APP,
	SOAK_BROKER_NODE,
	SOAK_MEM_ALARM,
	SOAK_PG_RESTART,
	SOAK_PROXY_DROP,
	SOAK_PROXY_STALL,
	SOAK_POISON,
	SOAK_N_FAULTS
};

extern const char *const soak_fault_names[SOAK_N_FAULTS];

struct soak_options {
	int64_t duration_ms; /* faults are injected for this long */
	int64_t quiet_ms;    /* then producers go on without faults for this long */
	int64_t drain_ms;    /* then at most this long for the last rows to arrive */
	int relays;
	int producers;
	int rate; /* rows per second, all producers together */
	int keys; /* ordering keys the keyed rows are spread over */
	uint64_t seed;
	unsigned faults; /* bit per enum soak_fault */
	bool keep_going;
};

/* Parses argv (argv[0] is skipped); 0, or -1 with a message in err. */
int soak_parse_args(int argc, char **argv, struct soak_options *o, char *err, size_t errlen);
void soak_usage(void);

/* Milliseconds since the soak started (CLOCK_MONOTONIC based); soak_clock_from() converts a
 * harness_now_ms() value. */
int64_t soak_ms(void);
int64_t soak_clock_from(int64_t mono_ms);
void soak_clock_start(void);

/* One line on stdout with the soak's clock in front. Thread-safe. */
void soak_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- the row source under test ----
 * RELAY_TEST_SOURCE (lease, the default, or cursor): the harness starts every relay and
 * command with it (tests/support/harness.h), and ctest runs the soak under each. The lease
 * source marks every row it publishes (published_at); the cursor publishes the rows its
 * position covers without writing them and marks only the rows it set aside (deferred_at).
 * soak_source_init() reads it and the SQL conditions on a row of the soak's table, published
 * and unpublished (pending or dead) as the source under test records them, on the main thread
 * before any other thread starts; read-only afterwards, so every thread may use them. */
void soak_source_init(const char *table);
bool soak_cursor(void);
const char *soak_unpublished(void);
const char *soak_published(void);

/* ---- the ledger ---- */

/* One good row, as its producer knows it. */
struct soak_row {
	int64_t seq;         /* from INSERT ... RETURNING, once committed */
	int64_t commit_ms;   /* when its COMMIT was sent (soak clock) */
	int64_t first_ms;    /* first delivery (soak clock), -1 none */
	uint64_t first_idx;  /* index of the first delivery in arrival order */
	uint32_t deliveries; /* how many times the consumer got it */
	int16_t key;         /* -1 unkeyed */
	bool committed;
	bool unpublished_at_end; /* still pending in the table when the drain ended */
};

/* The poison kinds, each a row the relay must make dead and never publish. */
enum soak_poison {
	POISON_BIG_HEADERS,
	POISON_BIG_BODY,
	POISON_BAD_BASE64,
	POISON_BAD_ENCODING,
	POISON_HEADERS_NOT_OBJECT,
	POISON_PROPERTIES_NOT_OBJECT,
	POISON_UNKNOWN_PROPERTY,
	POISON_PRIORITY,
	POISON_EXPIRATION,
	POISON_MISSING_EXCHANGE,
	POISON_UNROUTABLE,
	POISON_N
};

struct soak_poison_def {
	const char *name;
	const char *error; /* last_error must contain this */
};
extern const struct soak_poison_def soak_poison_defs[POISON_N];

/* A check that failed: counted by name, the first few printed in full. */
enum soak_check {
	CHECK_LOST,
	CHECK_ORDER,
	CHECK_DUPLICATE,
	CHECK_PENDING,
	CHECK_POISON,
	CHECK_GOOD_DEAD,
	CHECK_PHANTOM,
	CHECK_RSS,
	CHECK_SHUTDOWN,
	CHECK_RELAY_DIED,
	CHECK_POSITION,
	CHECK_HARNESS,
	SOAK_N_CHECKS
};
extern const char *const soak_check_names[SOAK_N_CHECKS];

/* Records a failed check and prints it (the first 20 of each kind). Thread-safe. */
void soak_fail(enum soak_check c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
size_t soak_failures(enum soak_check c);
size_t soak_failures_total(void);

/* The fault log. soak_fault_begin returns the fault's number; end it with soak_fault_end. */
int soak_fault_begin(enum soak_fault kind, const char *fmt, ...)
        __attribute__((format(printf, 2, 3)));
void soak_fault_end(int n, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Whether a fault is active now, and when the last one ended (-1: none yet). */
void soak_fault_state(bool *active, int64_t *last_end_ms);
size_t soak_fault_count(enum soak_fault kind);

/* Producers: reserve n row numbers of producer p (their ids are soak_row_id()); the rows are
 * known from then on but count only once committed. */
uint64_t soak_rows_reserve(int p, size_t n, const int16_t *keys);
/* Marks rows [first, first + n) of producer p committed, with their seqs. */
void soak_rows_committed(int p, uint64_t first, size_t n, const int64_t *seqs, int64_t commit_ms);
void soak_row_id(char *buf, size_t len, int p, uint64_t n);

/* Poison rows: registers id (kind k) inserted at at_ms. */
void soak_poison_add(const char *id, enum soak_poison k);

/* The checker thread: follows the consumer's deliveries (ordering, duplicates, phantoms) and
 * prints a status line every 10 s. */
void soak_checker_start(struct consumer *c, int producers);
/* Stops the thread after one last pass over what arrived. */
void soak_checker_stop(void);

struct soak_totals {
	size_t committed, committed_keyed, delivered_unique, deliveries, duplicates;
	size_t lost;  /* never delivered, and published or gone from the table */
	size_t stuck; /* never delivered, still unpublished when the drain ended */
	size_t poison, poison_delivered;
	size_t dup_by_kind[SOAK_N_FAULTS];
};
void soak_totals(struct soak_totals *t);
/* Whether every committed row was delivered (and how many are still missing). */
bool soak_all_delivered(size_t *missing);

/* Worst recovery: for each fault that ended, the first delivery at or after the fault's end
 * of a row whose COMMIT was sent at or after the fault's start, minus the fault's end.
 * Fills worst per kind (-1: no fault of that kind, -2: such a fault with no row delivered
 * after it) and returns the worst fault's number (-1 none). */
int soak_recovery(int64_t worst_by_kind[SOAK_N_FAULTS], int64_t *worst_ms);

/* The final comparison with the table: committed rows never delivered, told apart into lost
 * (published or gone) and stuck (still unpublished); keyed rows of each key in seq order
 * against their first deliveries; committed sets equal; good rows none dead; poison rows
 * dead with their error and never delivered. pg is the soak's own connection. */
struct pg_conn;
void soak_final_table_check(void *pg, const char *table);
/* The dead rows as the operator tools list them (`outbox-relay dead --json`, its standard
 * output in json): exactly the poison rows. */
void soak_final_dead_list(const char *json);

/* Status fields the samplers publish for the status line; position is the cursor's (-1 with
 * the lease source, or while no position row exists). */
void soak_status_pending(int64_t pending, int64_t leased, int64_t dead, double oldest_s,
                         int64_t position);

/* ---- samplers ---- */

/* Every relay process life, for the RSS check. */
/* log_path: the relay's log (copied), read at the end to see which big rows it made dead. */
int soak_life_begin(int slot, pid_t pid, const char *log_path);
void soak_life_end(int life);
/* RSS every 2 s of each live relay; pending age every 5 s on a connection of its own. */
void soak_samplers_start(const char *conninfo, const char *table);
void soak_samplers_stop(void);
/* Worst oldest-pending age seen, overall and while faults had been clear for
 * SOAK_PENDING_CLEAR_MS. */
void soak_pending_max(double *overall_s, double *clear_s);
/* Prints the RSS table and fails CHECK_RSS for lives that grew past the bound; writes every
 * sample to csv_path ("life,slot,pid,t_ms,rss_kb") when it is not NULL. */
void soak_rss_report(const char *csv_path);
/* Latest RSS of the life (kB), 0 unknown. */
long soak_life_rss(int life);

#endif
