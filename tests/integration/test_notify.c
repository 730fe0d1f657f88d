/* The systemd notify protocol as a Type=notify unit sees it: the test binds the AF_UNIX
 * datagram socket NOTIFY_SOCKET names and starts the relay itself, with WATCHDOG_USEC and
 * WATCHDOG_PID = the relay's own pid (a shell that execs it: the relay ignores the watchdog
 * when WATCHDOG_PID names another process, as libsystemd does). READY=1 comes only once the
 * broker is reachable too, STATUS= lines come, WATCHDOG=1 comes at about half the interval,
 * stops while a relay loop is stuck and comes back once it moves, STOPPING=1 comes at SIGTERM.
 * The socket may be a path or a name in the abstract namespace ('@').
 *
 * A loop is stuck when it has not ticked within the /healthz bound. The loops tick inside
 * their long waits, so the test makes one block where no tick reaches: a write(2) to stderr,
 * a pipe the test stops reading, which rows that go dead at once (one error line each) fill.
 * The main thread, which feeds the watchdog, logs nothing at log.level=warn and so keeps
 * running; /proc shows which thread sits in write(2). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "bench/drive/process.h"
#include "tests/support/fixture.h"
#include "tests/support/harness.h"
#include "tests/support/http_probe.h"
#include "tests/support/tcp_proxy.h"

#define WATCHDOG_MS      2000 /* WATCHDOG_USEC: the relay feeds it every 1 s */
#define STATE_TIMEOUT_MS 120000
#define MAX_MESSAGES     4096

/* One datagram from the relay, and when the test read it. */
struct message {
	int64_t at_ms;
	char text[1024];
};

struct notify {
	int fd;
	char dir[48], path[96];
	char env_sock[128], env_usec[64]; /* NOTIFY_SOCKET=path, WATCHDOG_USEC=WATCHDOG_MS */
	struct message *v;
	size_t n;
};

/* A socket at a path under a fresh directory, or (abstract) one in the abstract namespace,
 * which NOTIFY_SOCKET names with a leading '@' (systemd uses both). */
static void notify_open(struct notify *s, bool abstract)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	socklen_t len = sizeof(addr);

	memset(s, 0, sizeof(*s));
	if (abstract) {
		snprintf(s->path, sizeof(s->path), "@outbox-notify.%ld.%lld", (long)getpid(),
		         (long long)harness_now_ms());
		memcpy(addr.sun_path, s->path, strlen(s->path));
		addr.sun_path[0] = '\0';
		len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(s->path));
	} else {
		snprintf(s->dir, sizeof(s->dir), "/tmp/outbox-notify.XXXXXX");
		cr_assert_not_null(mkdtemp(s->dir));
		snprintf(s->path, sizeof(s->path), "%s/notify", s->dir);
		snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", s->path);
	}
	s->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	cr_assert_geq(s->fd, 0);
	cr_assert_eq(bind(s->fd, (struct sockaddr *)&addr, len), 0, "bind %s: %s", s->path,
	             strerror(errno));
	snprintf(s->env_sock, sizeof(s->env_sock), "NOTIFY_SOCKET=%s", s->path);
	snprintf(s->env_usec, sizeof(s->env_usec), "WATCHDOG_USEC=%d", WATCHDOG_MS * 1000);
	s->v = calloc(MAX_MESSAGES, sizeof(*s->v));
	cr_assert_not_null(s->v);
}

static void notify_close(struct notify *s)
{
	if (s->fd >= 0)
		close(s->fd);
	if (s->dir[0]) {
		unlink(s->path);
		rmdir(s->dir);
	}
	free(s->v);
}

/* Reads every datagram waiting, up to wait_ms for the first. */
static void notify_read(struct notify *s, int wait_ms)
{
	struct pollfd p = { .fd = s->fd, .events = POLLIN };

	if (poll(&p, 1, wait_ms) <= 0)
		return;
	for (;;) {
		char buf[1024];
		ssize_t len = recv(s->fd, buf, sizeof(buf) - 1, 0);

		if (len < 0)
			return;
		cr_assert_lt(s->n, MAX_MESSAGES, "the relay sent more than %d messages",
		             MAX_MESSAGES);
		buf[len] = '\0';
		s->v[s->n].at_ms = harness_now_ms();
		snprintf(s->v[s->n].text, sizeof(s->v[s->n].text), "%s", buf);
		s->n++;
	}
}

/* Whether text has a line that starts with prefix (whole: that is the whole line). */
static bool has_line(const char *text, const char *prefix, bool whole)
{
	size_t len = strlen(prefix);

	for (const char *p = text; p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
		if (strncmp(p, prefix, len) == 0 && (!whole || p[len] == '\n' || p[len] == '\0'))
			return true;
	}
	return false;
}

/* Index of the first message from index from on with the line line, or -1. */
static long notify_find(const struct notify *s, size_t from, const char *line)
{
	for (size_t i = from; i < s->n; i++)
		if (has_line(s->v[i].text, line, true))
			return (long)i;
	return -1;
}

/* Waits up to timeout_ms for a message from index from on with a line starting with prefix;
 * returns its index or -1. pipe_fd, when >= 0, is drained meanwhile. */
static long notify_wait(struct notify *s, size_t from, const char *prefix, int64_t timeout_ms,
                        int pipe_fd)
{
	int64_t deadline = harness_now_ms() + timeout_ms;

	for (;;) {
		for (size_t i = from; i < s->n; i++)
			if (has_line(s->v[i].text, prefix, false))
				return (long)i;
		if (harness_now_ms() >= deadline)
			return -1;
		if (pipe_fd >= 0) {
			char sink[65536];

			while (read(pipe_fd, sink, sizeof(sink)) > 0)
				;
		}
		notify_read(s, 100);
	}
}

static size_t count_line(const struct notify *s, size_t from, const char *line)
{
	size_t n = 0;
	long i = (long)from - 1;

	while ((i = notify_find(s, (size_t)i + 1, line)) >= 0)
		n++;
	return n;
}

/* The relay under `sh -c 'WATCHDOG_PID=$$ exec relay run'`: the shell's pid is the relay's
 * (watchdog_pid, when not NULL, is put there instead). stderr goes to err_fd (-1: a log file
 * under relay-logs is not needed here, /dev/null). */
static pid_t start_relay(const char *table, const char *amqp_url, const char *const *extra,
                         int err_fd, const char *watchdog_pid)
{
	struct process_env e = { 0 };
	char script[128];
	char *argv[] = { "/bin/sh", "-c", script, (char *)harness_relay_bin(), NULL };
	int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
	pid_t pid;

	snprintf(script, sizeof(script), "WATCHDOG_PID=%s; export WATCHDOG_PID; exec \"$0\" run",
	         watchdog_pid ? watchdog_pid : "$$");
	cr_assert_geq(devnull, 0);
	cr_assert_eq(process_env_relay(&e, harness_pg_conninfo(), amqp_url, table, extra), 0);
	pid = process_spawn(argv, e.v, devnull, err_fd >= 0 ? err_fd : devnull);
	cr_assert_gt(pid, 0, "could not start the relay: %s", strerror(errno));
	close(devnull);
	process_env_free(&e);
	return pid;
}

/* Lines of the relay's log (the file at fd) that say a broker connection failed. */
static int broker_refusals(int fd)
{
	static char buf[1 << 20];
	ssize_t len = pread(fd, buf, sizeof(buf) - 1, 0);
	int n = 0;

	buf[len > 0 ? len : 0] = '\0';
	for (char *p = buf; (p = strstr(p, "could not connect, will retry")) != NULL; p++) {
		char *eol = strchr(p, '\n');

		if (eol)
			*eol = '\0';
		n += strstr(p, "to=broker") != NULL;
		if (!eol)
			break;
		*eol = '\n';
	}
	return n;
}

/* The last lines of the relay's log (the file at fd), through criterion's logger. */
static void dump_log(int fd)
{
	char buf[8192];
	off_t end = lseek(fd, 0, SEEK_END);
	off_t at = end > (off_t)sizeof(buf) - 1 ? end - (off_t)sizeof(buf) + 1 : 0;
	ssize_t len = pread(fd, buf, sizeof(buf) - 1, at);

	buf[len > 0 ? len : 0] = '\0';
	cr_log_error("relay log (last %zd bytes):\n%s", len, buf);
}

Test(notify, ready_after_both_connections_status_watchdog_stopping, .timeout = 600)
{
	char url[128], log_path[] = "/tmp/outbox-notify-log.XXXXXX";
	struct fixture fx;
	struct notify s;
	struct proxy *proxy;
	pid_t pid;
	long ready, stopping, i;
	size_t pings = 0, from;
	int64_t last = 0, longest = 0, total = 0, deadline;
	int log_fd, st;

	fixture_setup(&fx, "notify_ready", &(struct fixture_options){ .no_consumer = true });
	notify_open(&s, false);
	/* The broker behind a proxy that refuses every connection: the database connects, the
	 * broker does not, and the relay keeps trying. */
	proxy = proxy_start(harness_amqp_port());
	proxy_refuse(proxy, true);
	snprintf(url, sizeof(url), "amqp://guest:guest@127.0.0.1:%d", proxy_port(proxy));
	log_fd = mkstemp(log_path);
	cr_assert_geq(log_fd, 0);
	pid = start_relay(fx.table, url,
	                  (const char *const[]){ s.env_sock, s.env_usec,
	                                         "OUTBOX_RELAY_POLL_INTERVAL=200ms",
	                                         "OUTBOX_LOG_LEVEL=debug", NULL },
	                  log_fd, NULL);

	/* Not ready while the broker refuses: wait until the relay has been turned away twice
	 * (the first failure logs at warn, later ones at debug). */
	deadline = harness_now_ms() + STATE_TIMEOUT_MS;
	while (broker_refusals(log_fd) < 2 && harness_now_ms() < deadline)
		notify_read(&s, 100);
	if (broker_refusals(log_fd) < 2)
		dump_log(log_fd);
	cr_assert_geq(broker_refusals(log_fd), 2, "the relay never tried the broker twice");
	notify_read(&s, 500);
	cr_expect_lt(notify_find(&s, 0, "READY=1"), 0, "READY=1 while the broker refuses");
	i = notify_wait(&s, 0, "STATUS=connecting: ", 10000, -1);
	cr_expect_geq(i, 0, "no STATUS=connecting line before READY=1");
	cr_expect_eq(process_wait(pid, 0, NULL), -1, "the relay exited while the broker refused");

	/* Let the broker through: READY=1 follows, with a STATUS= that says so. */
	from = s.n;
	proxy_refuse(proxy, false);
	ready = notify_wait(&s, from, "READY=1", STATE_TIMEOUT_MS, -1);
	cr_assert_geq(ready, 0, "no READY=1 once the broker was reachable");
	cr_expect_not_null(
	        strstr(s.v[ready].text, "\nSTATUS=connected to the database and the broker"),
	        "READY=1 without its STATUS=: %s", s.v[ready].text);
	cr_expect_eq(count_line(&s, 0, "READY=1"), 1, "READY=1 sent more than once");

	/* The watchdog, fed about every WATCHDOG_MS / 2: never a gap of a whole interval (that
	 * would be a restart under systemd), and not a stream either. */
	while (pings < 6) {
		i = notify_wait(&s, s.n, "WATCHDOG=1", 4 * WATCHDOG_MS, -1);
		cr_assert_geq(i, 0, "WATCHDOG=1 stopped after %zu pings", pings);
		if (pings > 0) {
			int64_t gap = s.v[i].at_ms - last;

			longest = gap > longest ? gap : longest;
			total += gap;
		}
		last = s.v[i].at_ms;
		pings++;
	}
	cr_expect_lt(longest, WATCHDOG_MS, "a gap of %lld ms between WATCHDOG=1 (interval %d ms)",
	             (long long)longest, WATCHDOG_MS);
	cr_expect_geq(total / (int64_t)(pings - 1), WATCHDOG_MS / 4,
	              "WATCHDOG=1 every %lld ms on average: not half of %d ms",
	              (long long)(total / (int64_t)(pings - 1)), WATCHDOG_MS);

	/* SIGTERM: STOPPING=1 with a STATUS= saying why, then exit 0. */
	from = s.n;
	cr_assert_eq(kill(pid, SIGTERM), 0);
	stopping = notify_wait(&s, from, "STOPPING=1", 60000, -1);
	cr_expect_geq(stopping, 0, "no STOPPING=1 at SIGTERM");
	if (stopping >= 0)
		cr_expect_not_null(strstr(s.v[stopping].text, "\nSTATUS=stopping: "), "%s",
		                   s.v[stopping].text);
	st = process_wait(pid, 60000, NULL);
	cr_expect_eq(st, 0, "the relay exited %d after SIGTERM", st);
	if (st != 0) {
		dump_log(log_fd);
		process_kill(pid);
	}
	close(log_fd);
	unlink(log_path);
	proxy_stop(proxy);
	notify_close(&s);
	fixture_teardown(&fx);
}

/* NOTIFY_SOCKET in the abstract namespace ("@name"), and WATCHDOG_PID naming another process
 * (here the test's): READY=1 and STOPPING=1 arrive, WATCHDOG=1 never does. The first ping is
 * due in the same tick as READY=1, so a relay that took the watchdog for its own would send it
 * at once, whatever the machine's load; the two intervals waited besides only add to that. */
Test(notify, abstract_socket_and_a_watchdog_meant_for_another_process, .timeout = 600)
{
	char other[32];
	struct fixture fx;
	struct notify s;
	pid_t pid;
	long ready, stopping;
	int64_t deadline;
	int st;

	fixture_setup(&fx, "notify_abstract", &(struct fixture_options){ .no_consumer = true });
	notify_open(&s, true);
	snprintf(other, sizeof(other), "%ld", (long)getpid());
	pid = start_relay(fx.table, harness_amqp_url(),
	                  (const char *const[]){ s.env_sock, s.env_usec,
	                                         "OUTBOX_RELAY_POLL_INTERVAL=200ms", NULL },
	                  -1, other);
	ready = notify_wait(&s, 0, "READY=1", STATE_TIMEOUT_MS, -1);
	cr_expect_geq(ready, 0, "no READY=1 through the abstract socket %s", s.path);
	deadline = harness_now_ms() + 2 * WATCHDOG_MS;
	while (ready >= 0 && harness_now_ms() < deadline)
		notify_read(&s, 100);
	cr_expect_eq(kill(pid, SIGTERM), 0);
	stopping = notify_wait(&s, 0, "STOPPING=1", 60000, -1);
	cr_expect_geq(stopping, 0, "no STOPPING=1 at SIGTERM through the abstract socket");
	cr_expect_lt(notify_find(&s, 0, "WATCHDOG=1"), 0,
	             "WATCHDOG=1 while WATCHDOG_PID names another process (%s)", other);
	st = process_wait(pid, 60000, NULL);
	cr_expect_eq(st, 0, "the relay exited %d after SIGTERM", st);
	if (st != 0)
		process_kill(pid);
	notify_close(&s);
	fixture_teardown(&fx);
}

/* Whether some thread of pid other than the main one is in write(2) to fd 2 (the first two
 * fields of /proc/PID/task/TID/syscall: "1 0x2"); main_in_write says the same of the main
 * thread. */
static bool a_thread_writes_stderr(pid_t pid, bool *main_in_write)
{
	char path[300], line[256];
	bool found = false;
	struct dirent *de;
	DIR *d;

	*main_in_write = false;
	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	d = opendir(path);
	if (!d)
		return false;
	while ((de = readdir(d)) != NULL) {
		FILE *f;

		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%s/syscall", (int)pid, de->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		if (fgets(line, sizeof(line), f) && strncmp(line, "1 0x2 ", 6) == 0) {
			if (strtol(de->d_name, NULL, 10) == (long)pid)
				*main_in_write = true;
			else
				found = true;
		}
		fclose(f);
	}
	closedir(d);
	return found;
}

struct healthz_want {
	const char *listen;
	int status;
};

static bool healthz_is(void *arg)
{
	struct healthz_want *w = arg;
	struct probe_reply r = probe_get(w->listen, "/healthz");
	bool ok = r.status == w->status;

	free(r.body);
	return ok;
}

static void dead_row(size_t i, struct outbox_row *row, void *arg)
{
	(void)i;
	(void)arg;
	/* Not base64: the row can never be published and goes dead at once, with one
	 * error line. */
	row->body = "!!! not base64 !!!";
	row->body_encoding = "base64";
}

Test(notify, watchdog_stops_while_a_loop_is_stuck, .timeout = 600)
{
	char e_listen[96], listen[64];
	struct fixture fx;
	struct notify s;
	struct healthz_want w;
	struct probe_reply r;
	int pipefd[2];
	pid_t pid;
	long i;
	size_t from;
	bool main_in_write = false;
	int64_t deadline;
	int st;

	fixture_setup(&fx, "notify_stuck", &(struct fixture_options){ .no_consumer = true });
	notify_open(&s, false);
	snprintf(listen, sizeof(listen), "127.0.0.1:%d", probe_free_port());
	snprintf(e_listen, sizeof(e_listen), "OUTBOX_HTTP_LISTEN=%s", listen);
	/* stderr is a pipe of one page that the test reads only when it wants the relay to
	 * move; non-blocking on this side only. */
	cr_assert_eq(pipe2(pipefd, O_CLOEXEC), 0);
	(void)fcntl(pipefd[0], F_SETPIPE_SZ, 4096);
	(void)fcntl(pipefd[0], F_SETFL, O_NONBLOCK);
	/* The shortest bound the configuration allows: 5 x 100ms + 1s + 10s. log.level=warn: the
	 * main thread's summary line (info) would block on the full pipe too. */
	pid = start_relay(fx.table, harness_amqp_url(),
	                  (const char *const[]){ s.env_sock, s.env_usec, e_listen,
	                                         "OUTBOX_RELAY_POLL_INTERVAL=100ms",
	                                         "OUTBOX_AMQP_CONFIRM_TIMEOUT=1s",
	                                         "OUTBOX_RELAY_LEASE=30s", "OUTBOX_LOG_LEVEL=warn",
	                                         NULL },
	                  pipefd[1], NULL);
	close(pipefd[1]);
	i = notify_wait(&s, 0, "READY=1", STATE_TIMEOUT_MS, pipefd[0]);
	cr_assert_geq(i, 0, "no READY=1");
	w = (struct healthz_want){ listen, 200 };
	cr_assert(harness_wait_until(healthz_is, &w, 30000), "/healthz is not 200 at start");

	/* Rows that go dead at once, one error line each: far more than the pipe holds. From
	 * here on the test does not read the pipe. */
	harness_insert_rows(fx.pg, fx.table, 300, "amq.topic", "notify.stuck", "stuck", dead_row,
	                    NULL);
	deadline = harness_now_ms() + STATE_TIMEOUT_MS;
	while (!a_thread_writes_stderr(pid, &main_in_write) && harness_now_ms() < deadline)
		notify_read(&s, 50);
	cr_assert(a_thread_writes_stderr(pid, &main_in_write),
	          "no relay thread ever blocked writing its log to the full pipe");
	cr_expect(!main_in_write, "the main thread is blocked in write(2) too");

	/* Still fed while the loop is within its bound: the main thread runs. */
	from = s.n;
	i = notify_wait(&s, from, "WATCHDOG=1", 4 * WATCHDOG_MS, -1);
	cr_expect_geq(i, 0,
	              "no WATCHDOG=1 right after the loop blocked: is the main thread stuck?");

	/* Past the bound /healthz names the loop; from then on WATCHDOG=1 must not come, for
	 * several intervals. Every datagram sent before /healthz answered is in the socket when
	 * the answer arrives, so what the test reads after it was sent after it. */
	w = (struct healthz_want){ listen, 503 };
	cr_assert(harness_wait_until(healthz_is, &w, STATE_TIMEOUT_MS),
	          "/healthz never said the blocked loop is stuck");
	a_thread_writes_stderr(pid, &main_in_write);
	cr_expect(!main_in_write, "the main thread is blocked in write(2) too");
	notify_read(&s, 0);
	from = s.n;
	deadline = harness_now_ms() + 4 * WATCHDOG_MS;
	while (harness_now_ms() < deadline)
		notify_read(&s, 100);
	cr_expect_lt(notify_find(&s, from, "WATCHDOG=1"), 0,
	             "WATCHDOG=1 while /healthz says a loop is stuck");
	r = probe_get(listen, "/healthz");
	cr_expect_eq(r.status, 503, "/healthz: %d %s", r.status, r.body);
	free(r.body);

	/* Read the pipe again: the loop moves, /healthz turns 200 and the watchdog is fed. */
	from = s.n;
	i = notify_wait(&s, from, "WATCHDOG=1", STATE_TIMEOUT_MS, pipefd[0]);
	cr_expect_geq(i, 0, "WATCHDOG=1 never came back after the loop moved again");
	w = (struct healthz_want){ listen, 200 };
	deadline = harness_now_ms() + STATE_TIMEOUT_MS;
	while (!healthz_is(&w) && harness_now_ms() < deadline)
		(void)notify_wait(&s, s.n, "no such line", 200, pipefd[0]);
	cr_expect(healthz_is(&w), "/healthz is not 200 once the loop moves");

	from = s.n;
	cr_assert_eq(kill(pid, SIGTERM), 0);
	i = notify_wait(&s, from, "STOPPING=1", 60000, pipefd[0]);
	cr_expect_geq(i, 0, "no STOPPING=1 at SIGTERM");
	deadline = harness_now_ms() + 60000;
	while ((st = process_wait(pid, 0, NULL)) == -1 && harness_now_ms() < deadline)
		(void)notify_wait(&s, s.n, "no such line", 100, pipefd[0]);
	cr_expect_eq(st, 0, "the relay exited %d after SIGTERM", st);
	if (st == -1)
		process_kill(pid);
	close(pipefd[0]);
	notify_close(&s);
	fixture_teardown(&fx);
}

/* A NOTIFY_SOCKET that refuses every datagram (a socket file nobody reads any more): the
 * relay says so in its log, naming the socket, once a minute at most, and keeps relaying.
 * Its sends fail at least twice here, READY=1 and STOPPING=1 (besides WATCHDOG=1 every
 * second), so a second line within the minute would be a line per failure. */
Test(notify, a_socket_that_refuses_is_logged_once_a_minute, .timeout = 600)
{
	const char *needle = "could not notify the service manager";
	struct fixture fx;
	struct notify s;
	struct harness_relay *r;
	char *line, want[160];
	int64_t started, lived;
	int st, lines;

	fixture_setup(&fx, "notify_refused", NULL);
	notify_open(&s, false);
	close(s.fd); /* the path stays, a socket with no one behind it: ECONNREFUSED */
	s.fd = -1;
	started = harness_now_ms();
	r = fixture_relay_start(&fx, (const char *const[]){ s.env_sock, s.env_usec, NULL });

	if (!fixture_wait_logged(&fx, needle, STATE_TIMEOUT_MS))
		fixture_dump_logs(&fx);
	cr_assert(fixture_logged(&fx, needle), "no log line when NOTIFY_SOCKET refused");
	line = harness_relay_log_line(r, needle);
	cr_assert_not_null(line);
	snprintf(want, sizeof(want), "notify_socket=%s ", s.path);
	cr_expect_not_null(strstr(line, want), "the line does not name the socket: %s", line);
	cr_expect_not_null(strstr(line, "error=\"Connection refused\""), "%s", line);
	cr_expect_not_null(strstr(line, "failed_sends=1"), "%s", line);
	cr_expect_not_null(strstr(line, "level=warn component=relay "), "%s", line);
	free(line);

	/* Rows still go through while systemd cannot hear the relay. */
	harness_insert_rows(fx.pg, fx.table, 20, fx.exchange, "notify.refused", "nr", NULL, NULL);
	fixture_expect_unique(&fx, fx.cons, 20, STATE_TIMEOUT_MS);

	st = harness_relay_stop(r, SIGTERM, 60000);
	lived = harness_now_ms() - started;
	cr_expect_eq(st, 0, "the relay exited %d after SIGTERM", st);
	lines = fixture_log_count(&fx, needle);
	if (lived < 55000)
		cr_expect_eq(lines, 1, "%d lines for failed sends within %lld ms", lines,
		             (long long)lived);
	else
		cr_log_warn("the relay ran %lld ms, more than the minute between lines; its %d "
		            "lines are not counted",
		            (long long)lived, lines);
	notify_close(&s);
	fixture_teardown(&fx);
}
