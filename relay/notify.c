/* The sd_notify side of the relay (see notify.h). Everything it says comes from the sources'
 * metrics, which the loops keep up to date. The protocol is systemd's documented one (sd_notify(3),
 * "the notification socket"): one datagram of newline-separated assignments to the AF_UNIX
 * socket named by NOTIFY_SOCKET, a path or, after '@', a name in the abstract namespace.
 * Written here rather than linked from libsystemd, which brings six more libraries (gcrypt,
 * gpg-error, lz4, lzma, zstd, cap) and about 850 kB of resident memory for these few lines. */
#include "relay/notify.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/clock.h"
#include "relay/log.h"
#include "relay/metrics.h"

#define STATUS_EVERY_MS 10000
#define WARN_EVERY_MS   60000

static struct {
	bool enabled; /* NOTIFY_SOCKET names a socket we can address */
	struct sockaddr_un addr;
	socklen_t addr_len;
	bool ready;
	int64_t stale_after_ms;
	const struct metrics_unit *units; /* borrowed, from notify_setup() */
	size_t n_units;
	int64_t watchdog_ms; /* 0 = no watchdog */
	int64_t next_ping_ms;
	int64_t status_at_ms;
	char status[512];
	char socket[sizeof(((struct sockaddr_un *)0)->sun_path)]; /* NOTIFY_SOCKET, for the log */
	int64_t warned_at_ms;   /* 0 = no failed send logged yet */
	unsigned long failures; /* sends that failed since the last warning */
} g_notify;

/* The address NOTIFY_SOCKET names; false when it names none this side can reach (unset,
 * empty, too long, or another family such as systemd's "vsock:"). */
static bool socket_address(const char *name, struct sockaddr_un *addr, socklen_t *len)
{
	size_t n = name ? strlen(name) : 0;

	memset(addr, 0, sizeof(*addr));
	addr->sun_family = AF_UNIX;
	if (n < 2 || (name[0] != '/' && name[0] != '@') || n >= sizeof(addr->sun_path))
		return false;
	memcpy(addr->sun_path, name, n);
	if (name[0] == '@')
		addr->sun_path[0] = '\0'; /* abstract: the length, not a NUL, ends the name */
	*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (name[0] == '/'));
	return true;
}

/* Sends one state message; systemd takes the sender's pid from the socket's credentials. A
 * failure is logged at most once a minute, with the number of sends that failed since the
 * last such line: under systemd a READY=1 that never arrives shows only as a start timeout,
 * and lost WATCHDOG=1s as a restart, and this line says why. */
static void notify_send(const char *state)
{
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0), err = 0;
	int64_t now;
	ssize_t n;

	if (fd < 0) {
		err = errno;
	} else {
		do
			n = sendto(fd, state, strlen(state), MSG_NOSIGNAL,
			           (struct sockaddr *)&g_notify.addr, g_notify.addr_len);
		while (n < 0 && errno == EINTR);
		if (n < 0)
			err = errno;
		close(fd);
	}
	if (err == 0)
		return;
	g_notify.failures++;
	now = clock_mono_ms();
	if (g_notify.warned_at_ms != 0 && now - g_notify.warned_at_ms < WARN_EVERY_MS)
		return;
	log_event(LOG_WARN, "relay", "could not notify the service manager",
	          LOG_STR("notify_socket", g_notify.socket), LOG_STR("error", strerror(err)),
	          LOG_UINT("failed_sends", g_notify.failures));
	g_notify.warned_at_ms = now;
	g_notify.failures = 0;
}

/* WATCHDOG_USEC in milliseconds when the watchdog is meant for this process (WATCHDOG_PID
 * unset or ours), else 0. */
static int64_t watchdog_ms(void)
{
	const char *usec = getenv("WATCHDOG_USEC"), *pid = getenv("WATCHDOG_PID");
	unsigned long long v;
	char *end;

	if (!usec || !usec[0])
		return 0;
	errno = 0;
	v = strtoull(usec, &end, 10);
	if (errno || *end || usec[0] == '-' || v < 2000 || v / 1000 > (unsigned long long)INT64_MAX)
		return 0;
	if (pid && pid[0]) {
		long long p;

		errno = 0;
		p = strtoll(pid, &end, 10);
		if (errno || *end || p != (long long)getpid())
			return 0;
	}
	return (int64_t)(v / 1000);
}

void notify_setup(int64_t stale_after_ms, const struct metrics_unit *units, size_t n_units)
{
	memset(&g_notify, 0, sizeof(g_notify));
	g_notify.enabled =
	        socket_address(getenv("NOTIFY_SOCKET"), &g_notify.addr, &g_notify.addr_len);
	g_notify.stale_after_ms = stale_after_ms;
	g_notify.units = units;
	g_notify.n_units = n_units;
	if (g_notify.enabled) {
		snprintf(g_notify.socket, sizeof(g_notify.socket), "%s", getenv("NOTIFY_SOCKET"));
		g_notify.watchdog_ms = watchdog_ms();
	}
}

static bool unit_failed(const struct metrics_unit *u)
{
	return atomic_load(&u->m->source_failed) != 0;
}

/* Every loop of m connected to both ends (what /readyz calls ready). */
static bool connected(struct metrics *m)
{
	int workers = atomic_load(&m->workers);

	return workers > 0 && atomic_load(&m->db_up) == workers &&
	       atomic_load(&m->broker_up) == workers;
}

/* Every source that has not failed is connected, and one at least has not failed. */
static bool all_connected(void)
{
	size_t alive = 0;

	for (size_t i = 0; i < g_notify.n_units; i++) {
		if (unit_failed(&g_notify.units[i]))
			continue;
		if (!connected(g_notify.units[i].m))
			return false;
		alive++;
	}
	return alive > 0;
}

/* Every loop of every source that has not failed has ticked within the /healthz bound: none
 * is stuck. */
static bool all_ticking(int64_t now)
{
	for (size_t k = 0; k < g_notify.n_units; k++) {
		struct metrics *m = g_notify.units[k].m;
		int workers = atomic_load(&m->workers);

		if (unit_failed(&g_notify.units[k]))
			continue;
		for (int i = 0; i < workers && i < METRICS_MAX_WORKERS; i++)
			if (now - atomic_load(&m->tick_ms[i]) > g_notify.stale_after_ms)
				return false;
	}
	return true;
}

/* "; 1234 published; 12 pending" summed over the sources, at buf + len. */
static void add_counts(char *buf, size_t len, size_t n)
{
	unsigned long long published = 0;
	long long pending = 0;
	bool known = false;

	for (size_t i = 0; i < g_notify.n_units; i++) {
		struct metrics *m = g_notify.units[i].m;

		published += atomic_load(&m->published);
		if (atomic_load(&m->table_stats_at_ms) != 0) {
			known = true;
			pending += atomic_load(&m->pending);
		}
	}
	if (len < n)
		len += (size_t)snprintf(buf + len, n - len, "; %llu published", published);
	if (len < n && known)
		snprintf(buf + len, n - len, "; %lld pending", pending);
}

/* Named sources: "sources: 2 of 3 ready, 1 failed (billing)". */
static size_t sources_text(char *buf, size_t n)
{
	size_t ready = 0, failed = 0, len;
	const char *first_failed = NULL;

	for (size_t i = 0; i < g_notify.n_units; i++) {
		if (unit_failed(&g_notify.units[i])) {
			failed++;
			first_failed = first_failed ? first_failed : g_notify.units[i].source;
		} else if (connected(g_notify.units[i].m)) {
			ready++;
		}
	}
	len = (size_t)snprintf(buf, n, "sources: %zu of %zu ready", ready, g_notify.n_units);
	if (failed > 0 && len < n)
		len += (size_t)snprintf(buf + len, n - len, ", %zu failed (%s%s)", failed,
		                        first_failed, failed > 1 ? ", ..." : "");
	return len;
}

/* "database and broker connected (broker 10.0.0.5:5672); 1234 published; 12 pending". */
static void status_text(char *buf, size_t n)
{
	const struct metrics_unit *u = g_notify.units;
	int workers;
	char node[128];
	size_t len;

	if (g_notify.n_units == 0) {
		snprintf(buf, n, "no relay loop running");
		return;
	}
	if (u[0].source && u[0].source[0]) {
		add_counts(buf, sources_text(buf, n), n);
		return;
	}
	workers = atomic_load(&u->m->workers);
	metrics_broker_node(u->m, 0, node, sizeof(node));
	if (connected(u->m))
		len = (size_t)snprintf(buf, n, "connected to the database and the broker%s%s%s",
		                       node[0] ? " (" : "", node, node[0] ? ")" : "");
	else
		len = (size_t)snprintf(buf, n, "connecting: database %s, broker %s",
		                       atomic_load(&u->m->db_up) == workers ? "up" : "down",
		                       atomic_load(&u->m->broker_up) == workers ? "up" : "down");
	add_counts(buf, len, n);
}

void notify_tick(void)
{
	int64_t now = clock_mono_ms();
	char status[512], msg[600];

	if (!g_notify.enabled)
		return;
	status_text(status, sizeof(status));
	if (!g_notify.ready && all_connected()) {
		/* Ready once rows can move; systemd holds units ordered after us until then. */
		g_notify.ready = true;
		snprintf(msg, sizeof(msg), "READY=1\nSTATUS=%s", status);
		notify_send(msg);
		snprintf(g_notify.status, sizeof(g_notify.status), "%s", status);
		g_notify.status_at_ms = now;
	} else if (strcmp(status, g_notify.status) != 0 &&
	           (now - g_notify.status_at_ms >= STATUS_EVERY_MS ||
	            strncmp(status, g_notify.status, 20) != 0)) {
		/* A change of state at once; moving counts at most every 10 s. */
		snprintf(msg, sizeof(msg), "STATUS=%s", status);
		notify_send(msg);
		snprintf(g_notify.status, sizeof(g_notify.status), "%s", status);
		g_notify.status_at_ms = now;
	}
	/* The watchdog is fed only while every loop ticks: a stuck loop makes systemd restart
	 * the relay (WatchdogSec=), as /healthz would make an orchestrator do. */
	if (g_notify.watchdog_ms > 0 && now >= g_notify.next_ping_ms && all_ticking(now)) {
		notify_send("WATCHDOG=1");
		g_notify.next_ping_ms = now + g_notify.watchdog_ms / 2;
	}
}

void notify_stopping(const char *why)
{
	char msg[300];

	if (!g_notify.enabled)
		return;
	snprintf(msg, sizeof(msg), "STOPPING=1\nSTATUS=stopping: %s", why);
	notify_send(msg);
}
