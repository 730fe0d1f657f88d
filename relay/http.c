/* /healthz, /readyz and /metrics on libmicrohttpd's own thread, plus the tiny blocking client
 * that `outbox-relay healthcheck` uses so the container image needs no curl. The server side
 * reads g_metrics atomics only and never touches a database or broker connection. */
#include "relay/http.h"

#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/hostport.h"
#include "relay/metrics.h"

/* Scrapers and probes are few; the limits keep a flood of idle connections from pinning
 * memory or the one polling thread. */
#define HTTP_CONNECTION_LIMIT     32u
#define HTTP_CONNECTION_TIMEOUT_S 10u
#define HTTP_BACKLOG              16
#define HTTP_MAX_WORKERS          ((int)(sizeof(g_metrics.tick_ms) / sizeof(g_metrics.tick_ms[0])))

struct http_server {
	struct MHD_Daemon *daemon;
	int64_t stale_after_ms;
	char version[128];
};

/* Binds and listens on one address; -1 with errno set on failure. */
static int listen_on(const struct sockaddr *sa, socklen_t salen, bool dual_stack)
{
	int one = 1, zero = 0;
	int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -1;
	/* Lets a restarted relay listen again while old connections sit in TIME_WAIT. */
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (dual_stack)
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
	if (bind(fd, sa, salen) < 0 || listen(fd, HTTP_BACKLOG) < 0) {
		int saved = errno;
		close(fd);
		errno = saved;
		return -1;
	}
	return fd;
}

/* We open the socket ourselves instead of letting libmicrohttpd do it, so that a failure is
 * reported with its errno ("address already in use") and ":port" can mean both families. */
static int open_listener(const struct hostport *ep, const char *listen, char *err, size_t errlen)
{
	struct addrinfo hints, *res = NULL, *ai;
	char port_text[8];
	int fd = -1, rc, saved = 0;

	if (ep->host[0] == '\0') {
		struct sockaddr_in6 a6 = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_ANY_INIT };
		struct sockaddr_in a4 = { .sin_family = AF_INET, .sin_addr.s_addr = INADDR_ANY };
		uint16_t port = (uint16_t)ep->port;

		a6.sin6_port = htons(port);
		a4.sin_port = htons(port);
		fd = listen_on((struct sockaddr *)&a6, sizeof(a6), true);
		/* Containers and hosts without IPv6 still get every IPv4 address. */
		if (fd < 0 && (errno == EAFNOSUPPORT || errno == EADDRNOTAVAIL))
			fd = listen_on((struct sockaddr *)&a4, sizeof(a4), false);
		if (fd < 0)
			snprintf(err, errlen, "could not listen on %s: %s", listen,
			         strerror(errno));
		return fd;
	}

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	snprintf(port_text, sizeof(port_text), "%d", ep->port);
	rc = getaddrinfo(ep->host, port_text, &hints, &res);
	if (rc != 0) {
		snprintf(err, errlen, "could not resolve '%s': %s", ep->host, gai_strerror(rc));
		return -1;
	}
	for (ai = res; ai != NULL && fd < 0; ai = ai->ai_next) {
		fd = listen_on(ai->ai_addr, ai->ai_addrlen, false);
		if (fd < 0)
			saved = errno;
	}
	freeaddrinfo(res);
	if (fd < 0)
		snprintf(err, errlen, "could not listen on %s: %s", listen, strerror(saved));
	return fd;
}

static enum MHD_Result respond(struct MHD_Connection *conn, unsigned int status, const char *body,
                               const char *content_type)
{
	struct MHD_Response *r;
	enum MHD_Result ret;

	r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
	if (r == NULL)
		return MHD_NO;
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
	/* Probes must see the state now, never a cached answer. */
	MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
		MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
	ret = MHD_queue_response(conn, status, r);
	MHD_destroy_response(r);
	return ret;
}

static int load_workers(void)
{
	int workers = atomic_load_explicit(&g_metrics.workers, memory_order_relaxed);

	return workers > HTTP_MAX_WORKERS ? HTTP_MAX_WORKERS : workers;
}

/* Liveness: every relay loop ticked within stale_after_ms. A loop stuck in a call that never
 * returns stops ticking, and an orchestrator can then restart the process. */
static enum MHD_Result healthz(struct MHD_Connection *conn, const struct http_server *h)
{
	char body[160];
	int workers = load_workers();
	int64_t now = clock_mono_ms();

	if (workers <= 0)
		return respond(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "no relay loop running\n",
		               "text/plain");
	for (int i = 0; i < workers; i++) {
		int64_t tick = atomic_load_explicit(&g_metrics.tick_ms[i], memory_order_relaxed);

		if (tick == 0 || now - tick > h->stale_after_ms) {
			if (tick == 0)
				snprintf(body, sizeof(body),
				         "worker %d stale: has not ticked yet\n", i);
			else
				snprintf(body, sizeof(body),
				         "worker %d stale: no tick for %lld ms (limit %lld ms)\n",
				         i, (long long)(now - tick), (long long)h->stale_after_ms);
			return respond(conn, MHD_HTTP_SERVICE_UNAVAILABLE, body, "text/plain");
		}
	}
	return respond(conn, MHD_HTTP_OK, "ok\n", "text/plain");
}

/* Readiness: every worker holds both connections, so rows are actually moving. */
static enum MHD_Result readyz(struct MHD_Connection *conn)
{
	char body[160];
	int workers = load_workers();
	int db = atomic_load_explicit(&g_metrics.db_up, memory_order_relaxed);
	int broker = atomic_load_explicit(&g_metrics.broker_up, memory_order_relaxed);

	if (workers <= 0)
		return respond(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "no relay loop running\n",
		               "text/plain");
	if (db == workers && broker == workers)
		return respond(conn, MHD_HTTP_OK, "ready\n", "text/plain");
	snprintf(body, sizeof(body), "%s%s%s\n", db != workers ? "database not connected" : "",
	         db != workers && broker != workers ? "; " : "",
	         broker != workers ? "broker not connected" : "");
	return respond(conn, MHD_HTTP_SERVICE_UNAVAILABLE, body, "text/plain");
}

static enum MHD_Result metrics(struct MHD_Connection *conn, const struct http_server *h)
{
	struct MHD_Response *r;
	enum MHD_Result ret;
	char *text = metrics_render(h->version);

	if (text == NULL)
		return respond(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n",
		               "text/plain");
	/* MUST_FREE hands the malloc'd text to libmicrohttpd, which frees it after sending. */
	r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
	if (r == NULL) {
		free(text);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4");
	MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	ret = MHD_queue_response(conn, MHD_HTTP_OK, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload_data,
                              size_t *upload_data_size, void **con_cls)
{
	const struct http_server *h = cls;

	(void)version;
	(void)upload_data;
	(void)upload_data_size;
	(void)con_cls;
	/* HEAD is a GET without the body (libmicrohttpd drops it), so probes using it work. */
	if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
		return respond(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed\n",
		               "text/plain");
	if (strcmp(url, "/healthz") == 0)
		return healthz(conn, h);
	if (strcmp(url, "/readyz") == 0)
		return readyz(conn);
	if (strcmp(url, "/metrics") == 0)
		return metrics(conn, h);
	return respond(conn, MHD_HTTP_NOT_FOUND, "not found\n", "text/plain");
}

struct http_server *http_start(const char *listen, int64_t stale_after_ms, const char *version,
                               char *err, size_t errlen)
{
	struct hostport ep;
	struct http_server *h = NULL, *result = NULL;
	int fd = -1;

	if (hostport_parse(listen, &ep, err, errlen) < 0)
		goto out;
	h = calloc(1, sizeof(*h));
	if (h == NULL) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	h->stale_after_ms = stale_after_ms;
	snprintf(h->version, sizeof(h->version), "%s", version ? version : "unknown");
	fd = open_listener(&ep, listen, err, errlen);
	if (fd < 0)
		goto out;
	h->daemon = MHD_start_daemon(
	        MHD_USE_AUTO_INTERNAL_THREAD, 0, NULL, NULL, handle, h, MHD_OPTION_LISTEN_SOCKET,
	        (MHD_socket)fd, MHD_OPTION_CONNECTION_LIMIT, HTTP_CONNECTION_LIMIT,
	        MHD_OPTION_CONNECTION_TIMEOUT, HTTP_CONNECTION_TIMEOUT_S, MHD_OPTION_END);
	if (h->daemon == NULL) {
		snprintf(err, errlen, "could not start the HTTP server on %s", listen);
		goto out;
	}
	fd = -1; /* the daemon owns it now and closes it in MHD_stop_daemon */
	result = h;
	h = NULL;
out:
	if (fd >= 0)
		close(fd);
	free(h);
	return result;
}

void http_stop(struct http_server *h)
{
	if (h == NULL)
		return;
	MHD_stop_daemon(h->daemon);
	free(h);
}

/* ---- client ---- */

static int wait_fd(int fd, short events, int64_t deadline)
{
	for (;;) {
		struct pollfd p = { .fd = fd, .events = events };
		int64_t left = deadline - clock_mono_ms();
		int rc;

		if (left <= 0) {
			errno = ETIMEDOUT;
			return -1;
		}
		rc = poll(&p, 1, (int)left);
		if (rc > 0)
			return 0;
		if (rc == 0) {
			errno = ETIMEDOUT;
			return -1;
		}
		if (errno != EINTR)
			return -1;
	}
}

/* Non-blocking connect bounded by the deadline; -1 with errno on failure. */
static int connect_one(const struct addrinfo *ai, int64_t deadline)
{
	int fd, soerr = 0, result = -1;
	socklen_t len = sizeof(soerr);

	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
		if (errno != EINPROGRESS || wait_fd(fd, POLLOUT, deadline) < 0)
			goto out;
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) < 0)
			goto out;
		if (soerr != 0) {
			errno = soerr;
			goto out;
		}
	}
	result = fd;
	fd = -1;
out:
	if (fd >= 0) {
		soerr = errno;
		close(fd);
		errno = soerr;
	}
	return result;
}

/* Sends the request and reads until the end of the status line (or until the server closes).
 * Returns the number of bytes read into resp (NUL-terminated), or -1 with errno. */
static ssize_t exchange(int fd, const char *req, size_t reqlen, char *resp, size_t size,
                        int64_t deadline)
{
	size_t sent = 0, got = 0;

	while (sent < reqlen) {
		ssize_t w = send(fd, req + sent, reqlen - sent, MSG_NOSIGNAL);
		if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
			if (wait_fd(fd, POLLOUT, deadline) < 0)
				return -1;
			continue;
		}
		if (w < 0)
			return -1;
		sent += (size_t)w;
	}
	while (got < size - 1 && memchr(resp, '\n', got) == NULL) {
		ssize_t r = recv(fd, resp + got, size - 1 - got, 0);
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
			if (wait_fd(fd, POLLIN, deadline) < 0)
				return -1;
			continue;
		}
		if (r < 0)
			return -1;
		if (r == 0)
			break;
		got += (size_t)r;
	}
	resp[got] = '\0';
	return (ssize_t)got;
}

int http_get_status(const char *listen, const char *path, int timeout_ms, char *err, size_t errlen)
{
	struct hostport ep;
	struct addrinfo hints, *res = NULL, *ai;
	char req[512], resp[512], port_text[8];
	const char *host;
	ssize_t got;
	int64_t deadline = clock_mono_ms() + (timeout_ms > 0 ? timeout_ms : 1);
	int fd = -1, rc, n, status = -1, saved = ECONNREFUSED;
	char *end;
	long code;

	if (hostport_parse(listen, &ep, err, errlen) < 0)
		goto out;
	/* A server listening on every address is reached through loopback. */
	host = ep.host;
	if (host[0] == '\0' || strcmp(host, "0.0.0.0") == 0)
		host = "127.0.0.1";
	else if (strcmp(host, "::") == 0)
		host = "::1";

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICSERV;
	snprintf(port_text, sizeof(port_text), "%d", ep.port);
	rc = getaddrinfo(host, port_text, &hints, &res);
	if (rc != 0) {
		snprintf(err, errlen, "could not resolve '%s': %s", host, gai_strerror(rc));
		goto out;
	}
	/* A name may resolve to ::1 and 127.0.0.1; the server listens on one of them. */
	for (ai = res; ai != NULL && fd < 0; ai = ai->ai_next) {
		fd = connect_one(ai, deadline);
		if (fd < 0)
			saved = errno;
	}
	if (fd < 0) {
		snprintf(err, errlen, "could not connect to %s: %s", listen, strerror(saved));
		goto out;
	}

	n = snprintf(req, sizeof(req),
	             "GET %s HTTP/1.0\r\nHost: %s%s%s:%d\r\n"
	             "User-Agent: outbox-relay-healthcheck\r\nConnection: close\r\n\r\n",
	             path, strchr(host, ':') ? "[" : "", host, strchr(host, ':') ? "]" : "",
	             ep.port);
	if (n < 0 || (size_t)n >= sizeof(req)) {
		snprintf(err, errlen, "request path too long");
		goto out;
	}
	got = exchange(fd, req, (size_t)n, resp, sizeof(resp), deadline);
	if (got < 0) {
		snprintf(err, errlen, "could not talk to %s: %s", listen, strerror(errno));
		goto out;
	}
	if (got < 12 || strncmp(resp, "HTTP/1.", 7) != 0 || resp[8] != ' ') {
		snprintf(err, errlen, "not an HTTP response from %s", listen);
		goto out;
	}
	errno = 0;
	code = strtol(resp + 9, &end, 10);
	if (end != resp + 12 || errno != 0 || code < 100 || code > 599) {
		snprintf(err, errlen, "bad HTTP status line from %s", listen);
		goto out;
	}
	status = (int)code;
out:
	if (fd >= 0)
		close(fd);
	if (res != NULL)
		freeaddrinfo(res);
	return status;
}
