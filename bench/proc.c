/* The relay as the benchmark's child (proc.h): started with a clean environment through
 * bench/drive/process.h, stopped in order, its peak memory read from /proc. */
#include "bench/proc.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench/drive/process.h"

/* Starts `outbox-relay cmd` on table with stdout on out (-1 = the benchmark's); the relay's
 * stderr is always the benchmark's, so a relay that complains is seen. */
static pid_t spawn_relay_args(struct bench *b, const char *what, const char *const *args,
                              const char *table, int out)
{
	char wk[48], bs[48], rt[64], src[48], pi[64];
	const char *const extra[] = {
		wk, bs, rt, src, "OUTBOX_LOG_LEVEL=warn", b->opt.purge_interval ? pi : NULL, NULL
	};
	char *argv[16] = { (char *)b->opt.relay };
	struct process_env env = { 0 };
	pid_t pid = -1;

	for (size_t i = 0; args[i] && i + 2 < sizeof(argv) / sizeof(argv[0]); i++)
		argv[i + 1] = (char *)args[i];

	snprintf(wk, sizeof(wk), "OUTBOX_RELAY_WORKERS=%ld", bench_workers(b));
	snprintf(bs, sizeof(bs), "OUTBOX_RELAY_BATCH_SIZE=%ld", bench_batch(b));
	snprintf(rt, sizeof(rt), "OUTBOX_RELAY_RETENTION=%s", b->opt.retention);
	snprintf(src, sizeof(src), "OUTBOX_RELAY_SOURCE=%s", bench_source_name(b->source));
	snprintf(pi, sizeof(pi), "OUTBOX_RELAY_PURGE_INTERVAL=%s",
	         b->opt.purge_interval ? b->opt.purge_interval : "");
	if (process_env_relay(&env, b->opt.pg, b->opt.amqp, table, extra) != 0) {
		bench_fail(b, what, "could not build the relay's environment");
		goto out;
	}
	pid = process_spawn(argv, env.v, out, -1);
	if (pid < 0)
		bench_fail(b, what, "could not start %s: %s", b->opt.relay, strerror(errno));
out:
	process_env_free(&env);
	return pid;
}

static pid_t spawn_relay(struct bench *b, const char *what, const char *cmd, const char *table,
                         int out)
{
	const char *const args[] = { cmd, NULL };

	return spawn_relay_args(b, what, args, table, out);
}

int proc_command(struct bench *b, const char *what, const char *table, const char *const *args,
                 int64_t timeout_ms)
{
	int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
	pid_t pid;
	int st;

	if (devnull < 0) {
		bench_fail(b, what, "/dev/null: %s", strerror(errno));
		return -1;
	}
	pid = spawn_relay_args(b, what, args, table, devnull);
	close(devnull);
	if (pid < 0)
		return -1;
	st = process_wait(pid, timeout_ms, NULL);
	if (st == -1)
		process_kill(pid);
	if (st != 0) {
		bench_fail(b, what, "outbox-relay %s failed (status %d)", args[0], st);
		return -1;
	}
	return 0;
}

int proc_migrate(struct bench *b, const char *what, const char *table)
{
	const char *const args[] = { "migrate", NULL };

	/* `migrate` reports on stdout; the benchmark's own output stays readable. */
	return proc_command(b, what, table, args, 60000);
}

int proc_relay_start(struct bench *b, struct proc_relay *rp, const char *what, const char *table)
{
	memset(rp, 0, sizeof(*rp));
	rp->hwm_kb = -1;
	rp->pid = spawn_relay(b, what, "run", table, -1);
	if (rp->pid < 0) {
		rp->pid = 0;
		return -1;
	}
	return 0;
}

bool proc_relay_alive(struct bench *b, struct proc_relay *rp, const char *what)
{
	int st;

	if (rp->pid <= 0)
		return false;
	st = process_wait(rp->pid, 0, NULL);
	if (st == -1)
		return true;
	rp->pid = 0;
	if (st >= 128)
		bench_fail(b, what, "the relay exited early (signal %d)", st - 128);
	else
		bench_fail(b, what, "the relay exited early (exit %d)", st);
	return false;
}

void proc_relay_stop(struct bench *b, struct proc_relay *rp, const char *what)
{
	struct rusage ru;
	int st;

	if (rp->pid <= 0)
		return;
	rp->hwm_kb = proc_hwm_kb(rp->pid);
	kill(rp->pid, SIGTERM);
	st = process_wait(rp->pid, 30000, &ru);
	if (st == -1) {
		process_kill(rp->pid);
		bench_fail(b, what, "the relay did not stop within 30 s of SIGTERM");
	} else if (st >= 0) {
		rp->maxrss_kb = ru.ru_maxrss;
	}
	rp->pid = 0;
}

long proc_hwm_kb(pid_t pid)
{
	char path[64], line[256];
	long kb = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%ld/status", (long)pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, "VmHWM:", 6) == 0) {
			char *end;

			errno = 0;
			kb = strtol(line + 6, &end, 10);
			if (errno || end == line + 6)
				kb = -1;
			break;
		}
	}
	fclose(f);
	return kb;
}
