/* http_probe.h — the tests' own HTTP/1.0 client for the relay's endpoint, independent of the
 * relay's healthcheck client so that one cannot hide a bug in the other, and a free loopback
 * port to listen on. Failures of the test process itself fail the current criterion test. */
#ifndef OUTBOX_TESTS_HTTP_PROBE_H
#define OUTBOX_TESTS_HTTP_PROBE_H

#include <stddef.h>

/* A loopback port nobody listens on right now (the kernel picks it). */
int probe_free_port(void);

struct probe_reply {
	int status; /* HTTP status, -1 when nothing answered */
	char *body; /* never NULL; free() */
};

/* GET path from "127.0.0.1:PORT" (IPv4 loopback only), reading until the server closes;
 * gives up after 10 s. */
struct probe_reply probe_get(const char *listen, const char *path);

/* The same, giving up (status -1) when connecting, sending and reading together take longer
 * than timeout_ms: what a prober with a short timeout (kubelet's is 1 s) sees. */
struct probe_reply probe_get_within(const char *listen, const char *path, int timeout_ms);

/* Sends len bytes of req as they are and reads the answer until the server closes, within
 * timeout_ms. A server that closes before taking the whole request still has its answer
 * read; status -1 when none came. */
struct probe_reply probe_raw(const char *listen, const char *req, size_t len, int timeout_ms);

/* A non-blocking TCP connection to "127.0.0.1:PORT" from the loopback address src (NULL:
 * any; "127.0.0.2" gives a second client address on one host), or -1 when it could not
 * connect within timeout_ms. The caller closes it. */
int probe_connect(const char *listen, const char *src, int timeout_ms);

/* The value of the sample whose name (labels included) is exactly series in a /metrics text;
 * -1 when there is none. */
double probe_metric(const char *text, const char *series);

#endif
