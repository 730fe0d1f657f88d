/* process.h — starting programs. bench/drive/ holds the drivers of real servers and
 * processes that the benchmark and the tests share; they need neither criterion nor the test
 * harness (which fails the test on top of these). Here: the relay's clean environment, fork +
 * exec, waits with a deadline, kills. Every function returns its error instead of failing
 * anything.
 *
 * Every process started here ends with the process that started it, however that ends: the
 * ones still running at exit() are killed and reaped, and each one gets SIGKILL from the
 * kernel when the starting process dies without an exit (crash, abort, SIGKILL).
 * Thread-safe. */
#ifndef OUTBOX_BENCH_DRIVE_PROCESS_H
#define OUTBOX_BENCH_DRIVE_PROCESS_H

#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>

#define PROCESS_ENV_MAX 64

/* An environment for execve(): v[0..n-1] are owned "NAME=value" strings, v[n] is NULL. Start
 * it zeroed ({ 0 }); free it with process_env_free(). */
struct process_env {
	char *v[PROCESS_ENV_MAX + 1];
	int n;
};

/* Adds kv ("NAME=value", copied), replacing an entry of the same name, so that later settings
 * override earlier ones. 0, or -1 when e is full or memory ran out (e unchanged). */
int process_env_set(struct process_env *e, const char *kv) __attribute__((warn_unused_result));
/* process_env_set() of name=value; also -1 when the pair exceeds 4 KiB. */
int process_env_setf(struct process_env *e, const char *name, const char *value)
        __attribute__((warn_unused_result));
/* Frees the strings; e is empty afterwards (and may be used again). */
void process_env_free(struct process_env *e);

/* Fills e (emptied first) with the relay's clean environment and nothing else: PATH, HOME and
 * the sanitizer options of this process, OUTBOX_DATABASE_URL=pg, OUTBOX_AMQP_URL=amqp,
 * OUTBOX_DATABASE_TABLE and OUTBOX_DATABASE_CHANNEL = table (unless table is NULL),
 * OUTBOX_HTTP_LISTEN= and OUTBOX_LOG_LEVEL=info, then extra (NULL-terminated "OUTBOX_X=y",
 * may be NULL; a name given there replaces the default). The relay reads every OUTBOX_*
 * variable: one inherited from a developer's shell would silently change what runs.
 * 0, or -1 (e then holds what was set so far: free it). */
int process_env_relay(struct process_env *e, const char *pg, const char *amqp, const char *table,
                      const char *const *extra) __attribute__((warn_unused_result));

/* Starts argv[0] (a path; argv and envp NULL-terminated, used before this returns) with
 * stdin on /dev/null, stdout on out and stderr on err (-1 = this process's own; the caller
 * keeps and closes its descriptors). Returns the child's pid, or -1 with errno set (fork
 * failed, too many children, no thread to fork from). The child is remembered until
 * process_wait() or process_kill() reaps it. */
pid_t process_spawn(char *const argv[], char *const envp[], int out, int err)
        __attribute__((warn_unused_result));

/* Waits up to timeout_ms (0 = just look) for pid to exit. Returns its exit code, 128 + the
 * signal that killed it, -1 while it still runs, or -2 when it cannot be waited for (errno
 * set). ru, when not NULL, receives the child's resource usage once it has been reaped. */
int process_wait(pid_t pid, int64_t timeout_ms, struct rusage *ru);

/* SIGKILL and reap. */
void process_kill(pid_t pid);

#endif
