/* Child processes, a driver the benchmark and the tests share: environments, fork + exec on a
 * thread of its own, waits and kills, and the guards that end every child with its parent (see
 * process.h). Needs neither criterion nor the test harness, which fails the test on top. */
#include "bench/drive/process.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Processes running at once (relays, programs, commands); far above any test. */
#define PROCESS_MAX_CHILDREN 256
/* How long the exit handler waits for the processes it killed before giving up on them. */
#define PROCESS_EXIT_REAP_MS 10000
/* Longest "NAME=value" process_env_setf() builds. */
#define PROCESS_ENV_PAIR_MAX 4096

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int64_t ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000 };

	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

/* ---- environments ---- */

int process_env_set(struct process_env *e, const char *kv)
{
	const char *eq = strchr(kv, '=');
	size_t nlen = eq ? (size_t)(eq - kv) : strlen(kv);
	char *copy;

	for (int i = 0; i < e->n; i++) {
		if (strncmp(e->v[i], kv, nlen) == 0 && e->v[i][nlen] == '=') {
			copy = strdup(kv);
			if (copy == NULL)
				return -1;
			free(e->v[i]);
			e->v[i] = copy;
			return 0;
		}
	}
	if (e->n >= PROCESS_ENV_MAX)
		return -1;
	copy = strdup(kv);
	if (copy == NULL)
		return -1;
	e->v[e->n++] = copy;
	e->v[e->n] = NULL;
	return 0;
}

int process_env_setf(struct process_env *e, const char *name, const char *value)
{
	char buf[PROCESS_ENV_PAIR_MAX];
	int n = snprintf(buf, sizeof(buf), "%s=%s", name, value);

	if (n < 0 || (size_t)n >= sizeof(buf))
		return -1;
	return process_env_set(e, buf);
}

void process_env_free(struct process_env *e)
{
	for (int i = 0; i < e->n; i++)
		free(e->v[i]);
	e->n = 0;
	e->v[0] = NULL;
}

static int env_inherit(struct process_env *e, const char *name)
{
	const char *v = getenv(name);

	return v ? process_env_setf(e, name, v) : 0;
}

int process_env_relay(struct process_env *e, const char *pg, const char *amqp, const char *table,
                      const char *const *extra)
{
	static const char *const inherited[] = { "ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS",
		                                 "TSAN_OPTIONS" };
	int rc = 0;

	process_env_free(e);
	rc |= process_env_setf(e, "PATH", getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
	rc |= process_env_setf(e, "HOME", getenv("HOME") ? getenv("HOME") : "/tmp");
	for (size_t i = 0; i < sizeof(inherited) / sizeof(inherited[0]); i++)
		rc |= env_inherit(e, inherited[i]);
	rc |= process_env_setf(e, "OUTBOX_DATABASE_URL", pg);
	rc |= process_env_setf(e, "OUTBOX_AMQP_URL", amqp);
	if (table) {
		rc |= process_env_setf(e, "OUTBOX_DATABASE_TABLE", table);
		rc |= process_env_setf(e, "OUTBOX_DATABASE_CHANNEL", table);
	}
	rc |= process_env_set(e, "OUTBOX_HTTP_LISTEN=");
	rc |= process_env_set(e, "OUTBOX_LOG_LEVEL=info");
	for (const char *const *p = extra; p && *p; p++)
		rc |= process_env_set(e, *p);
	return rc ? -1 : 0;
}

/* ---- every process started here ends with the process that started it ----
 *
 * A failed cr_assert ends criterion's test worker with exit(); a crash, an abort in .init or
 * a timeout (criterion's runner signals the worker) end it without; a benchmark may be
 * killed. Either way a relay it started must not outlive it: it would go on claiming rows of
 * a table nobody drops and hold the machine's cores. Two guards:
 * - every child is registered until it is reaped, and an exit handler SIGKILLs and reaps the
 *   ones still registered when the process exits (the cr_assert path, and callers that
 *   forgot);
 * - every child asks the kernel for SIGKILL when its parent dies (PR_SET_PDEATHSIG), which
 *   covers the deaths no handler sees. The kernel sends it when the *thread* that forked
 *   exits, not the process, so every fork happens on one thread of this module's own that
 *   lives until the process ends, whichever thread asked for the process.
 * Other threads (consumers, proxies, producers) do not hold the process up: exit() ends them
 * without a join, and the exit handler touches none of them. */

static pthread_mutex_t children_mu = PTHREAD_MUTEX_INITIALIZER;
static pid_t children[PROCESS_MAX_CHILDREN]; /* started, not reaped yet */
static size_t n_children;

/* One fork request, handed to the spawner thread. */
struct spawn_req {
	char *const *argv;
	char *const *envp;
	int out, err;
	pid_t pid; /* the child, or -1 with err_no */
	int err_no;
	bool done;
};

static pthread_mutex_t spawn_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t spawn_cv = PTHREAD_COND_INITIALIZER;
static struct spawn_req *spawn_pending; /* guarded by spawn_mu; one request at a time */
static pid_t spawner_of;                /* the process whose spawner thread runs; 0 = none */

static void children_remove(pid_t pid)
{
	pthread_mutex_lock(&children_mu);
	for (size_t i = 0; i < n_children; i++) {
		if (children[i] == pid) {
			children[i] = children[--n_children];
			break;
		}
	}
	pthread_mutex_unlock(&children_mu);
}

/* Runs in the process's exit path: no criterion calls (a test is over) and a bounded wait,
 * so a child stuck in the kernel cannot hold the exit up either. */
static void kill_children(void)
{
	pid_t pids[PROCESS_MAX_CHILDREN];
	size_t n, left;
	int64_t deadline;

	if (spawner_of != getpid())
		return; /* a copy of the handler in a forked child that never exec'd */
	pthread_mutex_lock(&children_mu);
	n = n_children;
	memcpy(pids, children, n * sizeof(pids[0]));
	n_children = 0;
	pthread_mutex_unlock(&children_mu);
	if (n == 0)
		return;
	for (size_t i = 0; i < n; i++)
		kill(pids[i], SIGKILL);
	deadline = now_ms() + PROCESS_EXIT_REAP_MS;
	do {
		left = 0;
		for (size_t i = 0; i < n; i++) {
			if (pids[i] > 0 && waitpid(pids[i], NULL, WNOHANG) == 0)
				left++;
			else
				pids[i] = 0;
		}
		if (left > 0)
			sleep_ms(10);
	} while (left > 0 && now_ms() < deadline);
	fprintf(stderr, "%s: killed %zu process(es) still running at exit%s\n",
	        program_invocation_short_name, n, left > 0 ? ", some not reaped" : "");
}

/* In the child between fork and execve: only async-signal-safe calls, the parent has
 * threads. */
static void exec_child(const struct spawn_req *req, pid_t parent)
{
	sigset_t none;
	int devnull;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	/* The parent may have died before the line above: then no signal will come. (A forking
	 * thread that ended early would go unnoticed here, as getppid() names the process:
	 * hence the spawner thread, which never ends.) */
	if (getppid() != parent)
		_exit(127);
	/* The spawner thread's mask is its creator's at its creation; a relay must start with
	 * every signal deliverable, SIGTERM above all. */
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	devnull = open("/dev/null", O_RDONLY);
	if (devnull >= 0)
		dup2(devnull, 0);
	if (req->out >= 0)
		dup2(req->out, 1);
	if (req->err >= 0)
		dup2(req->err, 2);
	execve(req->argv[0], req->argv, req->envp);
	_exit(127);
}

/* The spawner thread: forks whatever is asked, for as long as the process lives. */
static void *spawner_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&spawn_mu);
	for (;;) {
		struct spawn_req *req;
		pid_t parent = getpid();

		while (spawn_pending == NULL || spawn_pending->done)
			pthread_cond_wait(&spawn_cv, &spawn_mu);
		req = spawn_pending;
		pthread_mutex_lock(&children_mu);
		if (n_children == PROCESS_MAX_CHILDREN) {
			req->pid = -1;
			req->err_no = EAGAIN;
		} else {
			req->pid = fork();
			req->err_no = errno;
			if (req->pid == 0)
				exec_child(req, parent);
			if (req->pid > 0)
				children[n_children++] = req->pid;
		}
		pthread_mutex_unlock(&children_mu);
		req->done = true;
		pthread_cond_broadcast(&spawn_cv);
	}
	return NULL;
}

pid_t process_spawn(char *const argv[], char *const envp[], int out, int err)
{
	struct spawn_req req = { .argv = argv, .envp = envp, .out = out, .err = err };
	int rc = 0;

	fflush(NULL);
	pthread_mutex_lock(&spawn_mu);
	/* Once per process: the worker criterion forks for a test starts without the thread. */
	if (spawner_of != getpid()) {
		pthread_attr_t attr;
		pthread_t t;

		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		rc = pthread_create(&t, &attr, spawner_main, NULL);
		pthread_attr_destroy(&attr);
		if (rc == 0) {
			spawner_of = getpid();
			rc = atexit(kill_children) == 0 ? 0 : ENOMEM;
		}
	}
	if (rc == 0) {
		while (spawn_pending != NULL)
			pthread_cond_wait(&spawn_cv, &spawn_mu);
		spawn_pending = &req;
		pthread_cond_broadcast(&spawn_cv);
		while (!req.done)
			pthread_cond_wait(&spawn_cv, &spawn_mu);
		spawn_pending = NULL;
		pthread_cond_broadcast(&spawn_cv);
	}
	pthread_mutex_unlock(&spawn_mu);
	if (rc != 0) {
		errno = rc;
		return -1;
	}
	if (req.pid <= 0) {
		errno = req.err_no;
		return -1;
	}
	return req.pid;
}

static int decode_status(int st)
{
	if (WIFEXITED(st))
		return WEXITSTATUS(st);
	if (WIFSIGNALED(st))
		return 128 + WTERMSIG(st);
	return -1;
}

int process_wait(pid_t pid, int64_t timeout_ms, struct rusage *ru)
{
	int64_t deadline = now_ms() + timeout_ms;
	int st;

	for (;;) {
		pid_t r = wait4(pid, &st, WNOHANG, ru);

		if (r == pid) {
			children_remove(pid);
			return decode_status(st);
		}
		if (r < 0 && errno != EINTR)
			return -2;
		if (now_ms() >= deadline)
			return -1;
		sleep_ms(10);
	}
}

void process_kill(pid_t pid)
{
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	children_remove(pid);
}
