/* drain.h — the relay draining a pre-filled table, timed from its start until every row is
 * confirmed and marked: the procedure behind the relay, backlog and keys measurements. */
#ifndef OUTBOX_BENCH_DRAIN_H
#define OUTBOX_BENCH_DRAIN_H

#include <stdbool.h>

#include "bench/bench.h"
#include "bench/cpu.h"
#include "bench/db.h"
#include "bench/wal.h"

struct drain {
	double secs, rate;
	double first_s; /* relay start -> first delivery: its start-up cost */
	long hwm_kb;    /* the relay's VmHWM before it stopped (-1 unknown) */
	long maxrss_kb; /* and its ru_maxrss */
	/* msgs/s of each 10 % of the rows by the consumer's clock (with slices only) */
	double slice_rate[10];
	/* Per message, from just before the relay starts until the drain ends: the CPU of each
	 * party, and the WAL (its pg_stat_wal part until the relay has stopped, when its
	 * backends have reported). */
	struct cpu_cost cpu;
	/* Of cpu.pg_us, what the relay's own sessions spent (from their start, after the
	 * drain's): the rest is the server's other processes (autovacuum, checkpointer, WAL
	 * writer). NAN when unknown. And each session's part, by application_name. */
	double pg_relay_us;
	size_t n_sessions;
	struct {
		char name[DB_APP_NAME_LEN];
		double us;
	} sessions[DB_MAX_RELAY_SESSIONS];
	struct wal_cost wal;
	struct wal_cost fill_wal; /* per row, of the pre-fill (no breakdown) */
};

/* Fills `table` with n rows (over `keys` ordering keys, 0 = none), starts a relay on it and
 * times it until the consumer has seen n deliveries and no unpublished row is left. Fills
 * *d; 0, or -1 after bench_fail(what). The table is dropped and the relay stopped either
 * way; d->hwm_kb and d->maxrss_kb are set whenever the relay ran. */
int drain_run(struct bench *b, const char *what, const char *table, long n, int keys, bool slices,
              struct drain *d) __attribute__((warn_unused_result));
/* As drain_run(), on a table the caller made and filled, whose n unpublished rows are
 * drained; the table is left as the drain leaves it (no pre-fill figures: fill_wal is zero). */
int drain_existing(struct bench *b, const char *what, const char *table, long n, struct drain *d)
        __attribute__((warn_unused_result));
/* Prints what a successful drain_run() of n rows cost: "<what>: cpu per message: ...", the
 * WAL per message with its breakdown by record type, and the pre-fill's WAL per row. */
void drain_print_cost(const char *what, const struct drain *d, long n);

#endif
