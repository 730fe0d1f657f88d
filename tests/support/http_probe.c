/* A blocking HTTP/1.0 GET over loopback for the tests, and a free port finder. */
#include "tests/support/http_probe.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

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

struct probe_reply probe_get(const char *listen, const char *path)
{
	struct probe_reply r = { -1, NULL };
	struct sockaddr_in a = { .sin_family = AF_INET };
	/* A relay that accepts but never answers must not hang the test. */
	struct timeval tv = { .tv_sec = 10 };
	const char *colon = strrchr(listen, ':');
	char req[256], *buf, *body;
	size_t len = 0;
	int fd;

	cr_assert_not_null(colon, "bad listen address '%s'", listen);
	buf = calloc(1, PROBE_MAX_RESPONSE);
	cr_assert_not_null(buf);
	a.sin_port = htons((uint16_t)strtol(colon + 1, NULL, 10));
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	fd = socket(AF_INET, SOCK_STREAM, 0);
	cr_assert(fd >= 0, "socket: %s", strerror(errno));
	(void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0) {
		int n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path,
		                 listen);

		cr_assert(n > 0 && (size_t)n < sizeof(req));
		if (send(fd, req, (size_t)n, MSG_NOSIGNAL) == n) {
			for (;;) {
				ssize_t got = recv(fd, buf + len, PROBE_MAX_RESPONSE - 1 - len, 0);

				if (got <= 0)
					break;
				len += (size_t)got;
				cr_assert_lt(len, PROBE_MAX_RESPONSE - 1,
				             "HTTP response too large");
			}
		}
	}
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
