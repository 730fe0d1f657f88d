/* proc.h — the relay as a child process of the benchmark (on bench/drive/process.h, so it
 * ends with the benchmark however that ends) and what /proc says about it. */
#ifndef OUTBOX_BENCH_PROC_H
#define OUTBOX_BENCH_PROC_H

#include <stdint.h>
#include <sys/types.h>

#include "bench/bench.h"

/* A relay started by proc_relay_start(); zero it before use. */
struct proc_relay {
	pid_t pid;      /* 0 when not running */
	long hwm_kb;    /* VmHWM read just before stopping it; -1 when unknown */
	long maxrss_kb; /* ru_maxrss once reaped */
};

/* Runs `outbox-relay migrate` for table to completion (60 s at most); -1 after
 * bench_fail(what). */
int proc_migrate(struct bench *b, const char *what, const char *table)
        __attribute__((warn_unused_result));
/* Runs `outbox-relay args...` (NULL-terminated, at most 14) on table to completion, its
 * stdout discarded, killed after timeout_ms; -1 after bench_fail(what) unless it exits 0. */
int proc_command(struct bench *b, const char *what, const char *table, const char *const *args,
                 int64_t timeout_ms) __attribute__((warn_unused_result));
/* Starts `outbox-relay run` on table (also the LISTEN channel's and the queue's name, so
 * runs never see each other's rows), with the relay's clean environment plus the run's
 * relay.workers, relay.batch_size and relay.retention and the measurement's relay.source
 * (b->source), log level warn; its output goes to the benchmark's. -1 after
 * bench_fail(what). */
int proc_relay_start(struct bench *b, struct proc_relay *rp, const char *what, const char *table)
        __attribute__((warn_unused_result));
/* True while the relay runs; a relay that exited on its own is a failed measurement
 * (bench_fail(what)) and rp->pid becomes 0. */
bool proc_relay_alive(struct bench *b, struct proc_relay *rp, const char *what);
/* Reads VmHWM, then SIGTERM (an orderly shutdown) and SIGKILL if it has not exited 30 s later
 * (a failure of what). Fills hwm_kb and maxrss_kb; rp->pid becomes 0. Does nothing when it
 * is not running. */
void proc_relay_stop(struct bench *b, struct proc_relay *rp, const char *what);

/* VmHWM of pid from /proc/<pid>/status in kB; -1 when it cannot be read. */
long proc_hwm_kb(pid_t pid);

#endif
