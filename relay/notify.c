/* The sd_notify side of the relay (see notify.h). Everything it says comes from g_metrics,
 * which the loops keep up to date. The protocol is systemd's documented one (sd_notify(3),
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

void notify_setup(int64_t stale_after_ms)
{
	memset(&g_notify, 0, sizeof(g_notify));
	g_notify.enabled =
	        socket_address(getenv("NOTIFY_SOCKET"), &g_notify.addr, &g_notify.addr_len);
	g_notify.stale_after_ms = stale_after_ms;
	if (g_notify.enabled) {
		snprintf(g_notify.socket, sizeof(g_notify.socket), "%s", getenv("NOTIFY_SOCKET"));
		g_notify.watchdog_ms = watchdog_ms();
	}
}

/* Every loop connected to both ends (what /readyz calls ready). */
static bool all_connected(int workers)
{
	return workers > 0 && atomic_load(&g_metrics.db_up) == workers &&
	       atomic_load(&g_metrics.broker_up) == workers;
}

/* Every loop has ticked within the /healthz bound: none is stuck. */
static bool all_ticking(int workers, int64_t now)
{
	for (int i = 0; i < workers && i < METRICS_MAX_WORKERS; i++) {
		if (now - atomic_load(&g_metrics.tick_ms[i]) > g_notify.stale_after_ms)
			return false;
	}
	return true;
}

/* "database and broker connected (broker 10.0.0.5:5672); 1234 published; 12 pending". */
static void status_text(int workers, char *buf, size_t n)
{
	char node[128];
	size_t len;

	metrics_broker_node(0, node, sizeof(node));
	if (all_connected(workers))
		len = (size_t)snprintf(buf, n, "connected to the database and the broker%s%s%s",
		                       node[0] ? " (" : "", node, node[0] ? ")" : "");
	else
		len = (size_t)snprintf(buf, n, "connecting: database %s, broker %s",
		                       atomic_load(&g_metrics.db_up) == workers ? "up" : "down",
		                       atomic_load(&g_metrics.broker_up) == workers ? "up"
		                                                                    : "down");
	if (len < n)
		len += (size_t)snprintf(buf + len, n - len, "; %llu published",
		                        (unsigned long long)atomic_load(&g_metrics.published));
	if (len < n && atomic_load(&g_metrics.table_stats_at_ms) != 0)
		snprintf(buf + len, n - len, "; %lld pending",
		         (long long)atomic_load(&g_metrics.pending));
}

void notify_tick(void)
{
	int workers = atomic_load(&g_metrics.workers);
	int64_t now = clock_mono_ms();
	char status[512], msg[600];

	if (!g_notify.enabled)
		return;
	status_text(workers, status, sizeof(status));
	if (!g_notify.ready && all_connected(workers)) {
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
	if (g_notify.watchdog_ms > 0 && now >= g_notify.next_ping_ms && all_ticking(workers, now)) {
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
