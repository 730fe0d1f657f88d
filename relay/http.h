/* The HTTP endpoint (libmicrohttpd driven by its own thread): /healthz, /readyz, /metrics. It
 * reads the sources' metrics only and never touches a connection. Slow or abusive clients cannot make
 * it unreachable for a prober: see the limits below. */
#ifndef OUTBOX_RELAY_HTTP_H
#define OUTBOX_RELAY_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "relay/metrics.h"

/*
 * Limits, and why they are what they are. Who connects: Docker's HEALTHCHECK runs
 * `outbox-relay healthcheck` inside the container (127.0.0.1, one connection per interval);
 * kubelet's liveness, readiness and startup probes come from the node's address, up to three
 * at a time; Prometheus scrapes once per interval per server (two for an HA pair); now and
 * then an operator's curl. A dozen connections at once covers all of them together.
 *
 * A prober may share its address with a slow client: loopback inside the container, the
 * node's address for every pod's traffic that is masqueraded, a NAT in front of a network. A
 * limit that refuses the newest connection (libmicrohttpd's per-IP limit) refuses exactly the
 * prober then, and restarts a healthy relay. So reaching a limit closes instead the connection
 * that has waited longest without completing its request: a prober sends its whole request at
 * once and is answered before it could become the oldest; a slow client is by nature the
 * oldest. How many slow clients there are then no longer decides whether a probe is answered.
 */

/* From accept to the last byte of its request, not extended by traffic: a request is one
 * segment of a few hundred bytes that arrives within a round trip, so 5 s is far beyond any
 * real client and still frees a held slot well within kubelet's 10 s probe period. */
#define HTTP_REQUEST_DEADLINE_MS 5000
/* From a complete request to its answer handed to the kernel: answers are a few KiB and go at
 * once, only a client that stops reading comes near it. */
#define HTTP_RESPONSE_DEADLINE_MS 5000
/* Connections of one client address (IPv4, or IPv6 in full). Five would do for kubelet's
 * three probes, a healthcheck and an operator's curl behind one address. It need not exceed
 * the slow clients that may share that address (see above): it only decides how much of the
 * soft limit one address can take, an eighth, and beyond it only that address's own oldest
 * waiting connection is closed, never another's. */
#define HTTP_PER_ADDRESS_LIMIT 8
/* Connections in all, five times the dozen legitimate ones. Beyond it the oldest waiting
 * connection of any address is closed, so slow clients spread over many addresses (an IPv6
 * /64 has plenty) cannot lock a prober out either. */
#define HTTP_CONNECTION_SOFT_LIMIT 64
/* libmicrohttpd's own limit, beyond which it refuses a connection outright, and the size of
 * the table of connections. Above the soft limit it must hold what one turn of its loop
 * accepts (at most 10), spared until the next turn, and what the last turn shut down and is
 * not yet closed: 128 leaves room for several times that. With HTTP_CONNECTION_MEMORY each,
 * that is at most 1 MiB. */
#define HTTP_CONNECTION_LIMIT 128
/* Memory for one connection's request line, headers and answer headers: a request that does
 * not fit (a little under 8 KiB) gets 414 or 431 and the connection is closed. Probes send
 * about 150 bytes and Prometheus about 300; 8 KiB is also the usual per-line limit of web
 * servers, so a browser with a few cookies still gets an answer. */
#define HTTP_CONNECTION_MEMORY (8 * 1024)

struct http_server;

/* Starts listening on "host:port" (IPv4, "[::1]:port" IPv6, or ":port" for all addresses) and
 * serving from a thread of its own. stale_after_ms: /healthz answers 503 when a relay loop has
 * not ticked for that long. version is copied. units[0..n_units) are the sources it reports
 * (borrowed: they must outlive the server); named units (units[0].source not "") get one
 * /readyz line each and labelled metrics. Returns a new server (http_stop() frees it) or NULL
 * with a one-line reason in err. */
struct http_server *http_start(const char *listen, int64_t stale_after_ms, const char *version,
                               const struct metrics_unit *units, size_t n_units, char *err,
                               size_t errlen) __attribute__((warn_unused_result));
/* Stops serving, closes every connection and the listening socket, and frees h; accepts
 * NULL. */
void http_stop(struct http_server *h);

/* Client side, for `outbox-relay healthcheck`: GET path on listen; returns the HTTP status,
 * or -1 with a reason in err. */
int http_get_status(const char *listen, const char *path, int timeout_ms, char *err, size_t errlen)
        __attribute__((warn_unused_result));

#endif
