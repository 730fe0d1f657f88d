/* What one source's relay threads share (a unit: one per named source, or the one unnamed
 * source): its configuration snapshot, its metrics, its stop flag and the self-pipe that wakes
 * every one of its waiting threads at once. */
#ifndef OUTBOX_RELAY_RELAY_H
#define OUTBOX_RELAY_RELAY_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "config/config.h"
#include "relay/metrics.h"
#include "store/store.h"

/* Shutdown is bounded (relay.shutdown_timeout + 1 s at most from the signal to the exit):
 * waits for the broker end at abort_at_ms (confirms not in by then are released, no attempt
 * counted), the database statements that follow (marks, releases) end at db_deadline_ms, a
 * little later; a call stuck where no deadline reaches is interrupted by the main thread. */
#define RELAY_SHUTDOWN_DB_GRACE_MS 600

struct relay {
	const struct config *cfg; /* borrowed, immutable */
	/* The source's name (cfg->source_name, borrowed): "" for the one unnamed source. */
	const char *name;
	/* This source's counters and state, read by the HTTP thread and the main loop. */
	struct metrics metrics;
	/* Set once by the signal handler (every unit at once), or by relay_fail() for this
	 * unit alone. */
	atomic_int stopping;
	/* CLOCK_MONOTONIC ms (0 = none): set by the signal handler before it writes the
	 * self-pipe, so a wait that wakes on the pipe finds its deadline. */
	atomic_llong abort_at_ms;
	atomic_llong db_deadline_ms;
	/* A loop found something no retry can fix and stopped this unit (relay_fail()): exit
	 * status 1 at the end. */
	atomic_int failed;
	/* Read end of the unit's self-pipe. It is written once on shutdown (and when the unit
	 * fails) and never drained, so it stays readable and every poll() that includes it
	 * returns at once. */
	int wake_fd;
	int wake_wr; /* its write end */
	/* A loop found the table without this version's wake-up trigger and said so: once a
	 * process, not once a loop or a reconnect. */
	atomic_int wakeup_said;
};

/* A loop of r found something no retry can fix: marks r failed (said once by the caller) and
 * stops it. The one unnamed source stops the process, as a signal would; a named source stops
 * alone, its threads end, and the others go on. Thread-safe. */
void relay_fail(struct relay *r);

/* The store options every connection of this relay uses, from the configuration (borrowed:
 * cfg must outlive them): admin for the CLI, the maintenance loop and the shutdown's release
 * (no claims, no LISTEN, no answer timeout); r (may be NULL) gives the shutdown deadline. */
void relay_store_options(const struct config *cfg, const struct relay *r, bool admin,
                         const char *application_name, struct store_options *o);

/* One relay loop: its own PostgreSQL and AMQP connections, claiming, publishing and marking
 * until r->stopping. */
struct worker;

/* Creates worker number index (0-based) for r (borrowed). NULL on out of memory. */
struct worker *worker_new(struct relay *r, int index);
/* True once worker_main() has returned (or is about to). Thread-safe. */
bool worker_done(const struct worker *w);
/* Thread-safe: makes whatever call w's thread is blocked in on the broker (store) fail at
 * once. For the shutdown deadline only. */
void worker_interrupt_broker(struct worker *w);
void worker_interrupt_store(struct worker *w);
/* What every claim token of w starts with (store_token_stem()), into out[cap]: 0 or -1. For
 * the shutdown's release of exactly what this process claimed. */
int worker_token_stem(const struct worker *w, char *out, size_t cap);
void worker_free(struct worker *w); /* accepts NULL; the thread must have been joined */
/* pthread entry point; arg is a struct worker *. Returns NULL. */
void *worker_main(void *arg);
/* Whether a batch of rows of which nacked were nacked by the broker (one_destination: all of
 * them to one exchange and routing key) shows a condition of the broker, for which the worker
 * backs off its connection; otherwise each nacked row backs off by itself (relay/worker.c). */
bool worker_nacks_back_off(size_t rows, size_t nacked, bool one_destination);

/* The maintenance loop: table gauges for /metrics and the retention purge, on a connection
 * of its own so that neither slows the relay loops. */
struct maintenance;
struct maintenance *maintenance_start(struct relay *r); /* NULL if the thread cannot start */
void maintenance_stop(struct maintenance *m);           /* joins; accepts NULL */
/* How long the maintenance loop waits to read the table gauges again after a reading that
 * took took_ms (negative: a failed reading): 5 s, or 20 times took_ms when that is longer (the
 * reading costs O(backlog)), at most 5 minutes. */
int64_t maintenance_gauge_delay_ms(int64_t took_ms);

/* Command-line entry points (relay/commands.c). argv excludes the command word. Each
 * returns the process exit code: 0 ok, 1 runtime failure, 2 usage. */
int command_schema(const struct config *cfg, int argc, char **argv);
int command_migrate(const struct config *cfg, int argc, char **argv);
int command_enqueue(const struct config *cfg, int argc, char **argv);
int command_status(const struct config *cfg, int argc, char **argv);
int command_dead(const struct config *cfg, int argc, char **argv);
int command_requeue(const struct config *cfg, int argc, char **argv);
int command_discard(const struct config *cfg, int argc, char **argv);
int command_keys(const struct config *cfg, int argc, char **argv);
int command_purge(const struct config *cfg, int argc, char **argv);
int command_leave_cursor(const struct config *cfg, int argc, char **argv);
int command_replay(const struct config *cfg, int argc, char **argv); /* relay/replay.c */
int command_config(const struct config *cfg, int argc, char **argv);
int command_healthcheck(const struct config *cfg, int argc, char **argv);
int command_run(const struct config *cfg, int argc, char **argv);

#endif
