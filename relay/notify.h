/* Telling a service manager how the relay is doing (systemd's sd_notify protocol, Type=notify):
 * READY=1 once every relay loop holds both connections, STATUS= lines for `systemctl status`,
 * WATCHDOG=1 while the loops tick, STOPPING=1 at an orderly shutdown. Without NOTIFY_SOCKET in
 * the environment every call does nothing. Main thread only. */
#ifndef OUTBOX_RELAY_NOTIFY_H
#define OUTBOX_RELAY_NOTIFY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "relay/metrics.h"

/* Reads the environment (NOTIFY_SOCKET, WATCHDOG_USEC, WATCHDOG_PID) once. stale_after_ms:
 * a loop that has not ticked for this long is stuck (the same bound as /healthz). units are
 * the sources to report (borrowed until the last notify call); READY=1 and the watchdog count
 * every source that has not failed, STATUS= names the one source's state or counts the named
 * ones. */
void notify_setup(int64_t stale_after_ms, const struct metrics_unit *units, size_t n_units);
/* Called by the main loop at least every 250 ms: sends READY=1 the first time every loop is
 * connected to both ends, WATCHDOG=1 at half the watchdog interval while every loop ticks,
 * and a STATUS= line when what it says changes (at most every 10 s while only the counts
 * move). */
void notify_tick(void);
/* STOPPING=1 with a STATUS= line saying why. */
void notify_stopping(const char *why);

#endif
