/* A bounded HTTP/1.0 client over loopback for the tests (every call ends by its deadline, so
 * a server that accepts and never answers cannot hang a test), and a free port finder. */
#include "tests/support/http_probe.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"

/* /metrics is a few kilobytes; this only bounds a runaway answer. */
#define PROBE_MAX_RESPONSE (1 << 20)

int probe_free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0), port;

	cr_assert(fd >= 0, "socket: %s", strerror(errno));
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0, "bind: %s", strerror(errno));
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	port = ntohs(a.sin_port);
	close(fd);
	return port;
}

/* Waits for events on fd until deadline; the events that came, -1 on timeout or error. */
static int wait_until(int fd, short events, int64_t deadline)
{
	for (;;) {
		struct pollfd p = { .fd = fd, .events = events };
		int64_t left = deadline - clock_mono_ms();
		int rc;

		if (left <= 0)
			return -1;
		rc = poll(&p, 1, (int)left);
		if (rc > 0)
			return p.revents;
		if (rc == 0 || errno != EINTR)
			return -1;
	}
}

int probe_connect(const char *listen, const char *src, int timeout_ms)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	const char *colon = strrchr(listen, ':');
	int64_t deadline = clock_mono_ms() + timeout_ms;
	int fd, soerr = 0;
	socklen_t len = sizeof(soerr);

	cr_assert_not_null(colon, "bad listen address '%s'", listen);
	fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	cr_assert(fd >= 0, "socket: %s", strerror(errno));
	if (src != NULL) {
		struct sockaddr_in s = { .sin_family = AF_INET };

		cr_assert_eq(inet_pton(AF_INET, src, &s.sin_addr), 1, "bad address '%s'", src);
		if (bind(fd, (struct sockaddr *)&s, sizeof(s)) < 0) {
			close(fd);
			return -1;
		}
	}
	a.sin_port = htons((uint16_t)strtol(colon + 1, NULL, 10));
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0)
		return fd;
	if (errno != EINPROGRESS || wait_until(fd, POLLOUT, deadline) < 0 ||
	    getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) < 0 || soerr != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

struct probe_reply probe_raw(const char *listen, const char *req, size_t reqlen, int timeout_ms)
{
	struct probe_reply r = { -1, NULL };
	int64_t deadline = clock_mono_ms() + timeout_ms;
	size_t len = 0, sent = 0;
	char *buf, *body;
	int fd;

	buf = calloc(1, PROBE_MAX_RESPONSE);
	cr_assert_not_null(buf);
	fd = probe_connect(listen, NULL, timeout_ms);
	if (fd < 0)
		goto answer;
	/* A server that refuses a request early (too large, wrong method) may close while it is
	 * still being sent: the answer it sent first is what counts. */
	while (sent < reqlen) {
		ssize_t w = send(fd, req + sent, reqlen - sent, MSG_NOSIGNAL);

		if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
			int ev = wait_until(fd, POLLOUT | POLLIN, deadline);

			if (ev < 0)
				goto answer;
			if (ev & ~POLLOUT)
				break; /* an answer (or a close) came before the end */
			continue;
		}
		if (w < 0)
			break;
		sent += (size_t)w;
	}
	for (;;) {
		ssize_t got = recv(fd, buf + len, PROBE_MAX_RESPONSE - 1 - len, 0);

		if (got < 0 && (errno == EAGAIN || errno == EINTR)) {
			if (wait_until(fd, POLLIN, deadline) < 0)
				break;
			continue;
		}
		if (got <= 0)
			break;
		len += (size_t)got;
		cr_assert_lt(len, PROBE_MAX_RESPONSE - 1, "HTTP response too large");
	}
answer:
	if (fd >= 0)
		close(fd);
	buf[len] = '\0';
	if (len > 12 && strncmp(buf, "HTTP/1.", 7) == 0)
		r.status = (int)strtol(buf + 9, NULL, 10);
	body = strstr(buf, "\r\n\r\n");
	r.body = strdup(body ? body + 4 : "");
	cr_assert_not_null(r.body);
	free(buf);
	return r;
}

struct probe_reply probe_get_within(const char *listen, const char *path, int timeout_ms)
{
	char req[256];
	int n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, listen);

	cr_assert(n > 0 && (size_t)n < sizeof(req));
	return probe_raw(listen, req, (size_t)n, timeout_ms);
}

struct probe_reply probe_get(const char *listen, const char *path)
{
	/* A relay that accepts but never answers must not hang the test. */
	return probe_get_within(listen, path, 10000);
}

double probe_metric(const char *text, const char *series)
{
	size_t n = strlen(series);
	const char *p = text;

	while ((p = strstr(p, series)) != NULL) {
		if ((p == text || p[-1] == '\n') && p[n] == ' ')
			return strtod(p + n + 1, NULL);
		p += n;
	}
	return -1;
}
