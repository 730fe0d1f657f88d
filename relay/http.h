/* The HTTP endpoint (libmicrohttpd, its own thread): /healthz, /readyz, /metrics. It reads
 * g_metrics only and never touches a connection. */
#ifndef OUTBOX_RELAY_HTTP_H
#define OUTBOX_RELAY_HTTP_H

#include <stddef.h>
#include <stdint.h>

struct http_server;

/* Starts listening on "host:port" (IPv4, "[::1]:port" IPv6, or ":port" for all addresses).
 * stale_after_ms: /healthz answers 503 when a relay loop has not ticked for that long.
 * Returns a new server or NULL with a one-line reason in err. */
struct http_server *http_start(const char *listen, int64_t stale_after_ms, const char *version,
                               char *err, size_t errlen);
void http_stop(struct http_server *h); /* accepts NULL */

/* Client side, for `outbox-relay healthcheck`: GET path on listen; returns the HTTP status,
 * or -1 with a reason in err. */
int http_get_status(const char *listen, const char *path, int timeout_ms, char *err, size_t errlen);

#endif
