/* http_probe.h — the tests' own HTTP/1.0 client for the relay's endpoint, independent of the
 * relay's healthcheck client so that one cannot hide a bug in the other, and a free loopback
 * port to listen on. Failures of the test process itself fail the current criterion test. */
#ifndef OUTBOX_TESTS_HTTP_PROBE_H
#define OUTBOX_TESTS_HTTP_PROBE_H

/* A loopback port nobody listens on right now (the kernel picks it). */
int probe_free_port(void);

struct probe_reply {
	int status; /* HTTP status, -1 when nothing answered */
	char *body; /* never NULL; free() */
};

/* GET path from "127.0.0.1:PORT" (IPv4 loopback only), reading until the server closes. */
struct probe_reply probe_get(const char *listen, const char *path);

#endif
