/* The sd_notify side of the relay (see notify.h). Everything it says comes from g_metrics,
 * which the loops keep up to date; the protocol itself is libsystemd's. */
#include "relay/notify.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "relay/metrics.h"

#ifdef OUTBOX_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#else
/* Built without libsystemd: nothing to tell. */
static int sd_notify(int unset, const char *state)
{
	(void)unset;
	(void)state;
	return 0;
}

static int sd_watchdog_enabled(int unset, uint64_t *usec)
{
	(void)unset;
	(void)usec;
	return 0;
}
#endif

#define STATUS_EVERY_MS 10000

static struct {
	bool enabled; /* NOTIFY_SOCKET is set */
	bool ready;
	int64_t stale_after_ms;
	int64_t watchdog_ms; /* 0 = no watchdog */
	int64_t next_ping_ms;
	int64_t status_at_ms;
	char status[512];
} g_notify;

void notify_setup(int64_t stale_after_ms)
{
	uint64_t usec = 0;
	const char *sock = getenv("NOTIFY_SOCKET");

	memset(&g_notify, 0, sizeof(g_notify));
	g_notify.enabled = sock != NULL && sock[0] != '\0';
	g_notify.stale_after_ms = stale_after_ms;
	if (g_notify.enabled && sd_watchdog_enabled(0, &usec) > 0 && usec >= 2000)
		g_notify.watchdog_ms = (int64_t)(usec / 1000);
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
		(void)sd_notify(0, msg);
		snprintf(g_notify.status, sizeof(g_notify.status), "%s", status);
		g_notify.status_at_ms = now;
	} else if (strcmp(status, g_notify.status) != 0 &&
	           (now - g_notify.status_at_ms >= STATUS_EVERY_MS ||
	            strncmp(status, g_notify.status, 20) != 0)) {
		/* A change of state at once; moving counts at most every 10 s. */
		snprintf(msg, sizeof(msg), "STATUS=%s", status);
		(void)sd_notify(0, msg);
		snprintf(g_notify.status, sizeof(g_notify.status), "%s", status);
		g_notify.status_at_ms = now;
	}
	/* The watchdog is fed only while every loop ticks: a stuck loop makes systemd restart
	 * the relay (WatchdogSec=), as /healthz would make an orchestrator do. */
	if (g_notify.watchdog_ms > 0 && now >= g_notify.next_ping_ms && all_ticking(workers, now)) {
		(void)sd_notify(0, "WATCHDOG=1");
		g_notify.next_ping_ms = now + g_notify.watchdog_ms / 2;
	}
}

void notify_stopping(const char *why)
{
	char msg[300];

	if (!g_notify.enabled)
		return;
	snprintf(msg, sizeof(msg), "STOPPING=1\nSTATUS=stopping: %s", why);
	(void)sd_notify(0, msg);
}
