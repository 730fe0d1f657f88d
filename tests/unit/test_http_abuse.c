/* The HTTP endpoint under slow and abusive clients on loopback: probes are answered while
 * slow clients keep connecting from the prober's own address, every connection has an
 * absolute deadline, and requests are small GETs or HEADs. */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "relay/http.h"
#include "relay/metrics.h"
#include "tests/support/http_probe.h"

/* The one unnamed source, as `run` has it without named sources. */
static struct metrics g_metrics;
static struct metrics_unit g_unit = { .source = "", .m = &g_metrics };

#define SLOW_CLIENTS 40
/* Generous bounds that only stop a hang: the server's deadlines are a few seconds. */
#define CLOSE_BOUND_MS   30000
#define PROBE_TIMEOUT_MS 3000

/* Slow clients: each sends the start of a request line, then one more byte a second, and
 * never ends it (slowloris). */
struct slow {
	char listen[64];
	const char *src; /* loopback source address, NULL for 127.0.0.1 */
	bool reconnect;  /* reopen what the server closed, as a determined client would */
	int fd[SLOW_CLIENTS];
	int n;
	int closed_by_server;
};

static void slow_open_one(struct slow *s, int i)
{
	static const char start[] = "GET /";

	s->fd[i] = probe_connect(s->listen, s->src, 5000);
	if (s->fd[i] >= 0 &&
	    send(s->fd[i], start, sizeof(start) - 1, MSG_NOSIGNAL) != (ssize_t)sizeof(start) - 1) {
		close(s->fd[i]);
		s->fd[i] = -1;
		s->closed_by_server++;
	}
}

static void slow_start(struct slow *s, const char *listen, const char *src, int n, bool reconnect)
{
	memset(s, 0, sizeof(*s));
	snprintf(s->listen, sizeof(s->listen), "%s", listen);
	s->src = src;
	s->reconnect = reconnect;
	s->n = n;
	for (int i = 0; i < n; i++)
		slow_open_one(s, i);
}

/* True when the server has closed (or reset) this connection. */
static bool closed_by_peer(int fd)
{
	char buf[512];

	for (;;) {
		ssize_t got = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);

		if (got > 0)
			continue; /* an error page before the close: read on */
		if (got == 0)
			return true;
		return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
	}
}

/* Notices the connections the server has closed. */
static void slow_reap(struct slow *s)
{
	for (int i = 0; i < s->n; i++) {
		if (s->fd[i] >= 0 && closed_by_peer(s->fd[i])) {
			close(s->fd[i]);
			s->fd[i] = -1;
			s->closed_by_server++;
		}
	}
}

/* One second of a slow client's life: notice closes, send one more byte each. */
static void slow_tick(struct slow *s)
{
	slow_reap(s);
	for (int i = 0; i < s->n; i++) {
		if (s->fd[i] >= 0 && send(s->fd[i], "a", 1, MSG_NOSIGNAL) != 1) {
			close(s->fd[i]);
			s->fd[i] = -1;
			s->closed_by_server++;
		}
		if (s->fd[i] < 0 && s->reconnect)
			slow_open_one(s, i);
	}
}

static int slow_open_count(const struct slow *s)
{
	int open = 0;

	for (int i = 0; i < s->n; i++)
		open += s->fd[i] >= 0;
	return open;
}

/* Ticks once a second until the server has closed every slow connection or bound_ms ran
 * out; returns how many are still open. */
static int slow_wait_all_closed(struct slow *s, int64_t bound_ms)
{
	int64_t until = clock_mono_ms() + bound_ms;

	s->reconnect = false;
	while (slow_open_count(s) > 0 && clock_mono_ms() < until) {
		poll(NULL, 0, 1000);
		slow_tick(s);
	}
	return slow_open_count(s);
}

static void slow_stop(struct slow *s)
{
	for (int i = 0; i < s->n; i++)
		if (s->fd[i] >= 0)
			close(s->fd[i]);
	s->n = 0;
}

static struct http_server *start(char *listen, size_t size)
{
	char err[256] = "";
	struct http_server *h;

	snprintf(listen, size, "127.0.0.1:%d", probe_free_port());
	metrics_init(&g_metrics);
	/* A liveness limit far beyond the test: /healthz answers 200 as long as it answers. */
	h = http_start(listen, 600000, "9.9.9", &g_unit, 1, err, sizeof(err));
	cr_assert_not_null(h, "http_start: %s", err);
	atomic_store(&g_metrics.workers, 1);
	atomic_store(&g_metrics.tick_ms[0], clock_mono_ms());
	return h;
}

static void expect_healthz(const char *listen, const char *when)
{
	struct probe_reply r = probe_get_within(listen, "/healthz", PROBE_TIMEOUT_MS);

	cr_assert_eq(r.status, 200, "%s: /healthz answered %d (-1: nothing within %d ms)", when,
	             r.status, PROBE_TIMEOUT_MS);
	cr_assert_str_eq(r.body, "ok\n");
	free(r.body);
}

/* The defect: 32 slots, no deadline, a timeout that every byte resets; 32 slow clients made
 * /healthz unreachable and the orchestrator restarted a healthy relay. The prober shares
 * 127.0.0.1 with the slow clients, as `outbox-relay healthcheck` does in a container. */
Test(http_abuse, probes_are_answered_while_slow_clients_hold_the_address)
{
	char listen[64], when[64];
	struct http_server *h = start(listen, sizeof(listen));
	struct slow s;

	slow_start(&s, listen, NULL, SLOW_CLIENTS, true);
	for (int round = 1; round <= 5; round++) {
		slow_tick(&s);
		poll(NULL, 0, 1000);
		slow_tick(&s);
		snprintf(when, sizeof(when), "round %d with %d slow clients", round, SLOW_CLIENTS);
		expect_healthz(listen, when);
		poll(NULL, 0, 1000);
	}
	/* Once they stop reconnecting, every slow connection is closed by the server although
	 * each keeps sending: nothing resets a request's deadline. */
	cr_assert_eq(slow_wait_all_closed(&s, CLOSE_BOUND_MS), 0,
	             "slow connections still open after %d ms", CLOSE_BOUND_MS);
	expect_healthz(listen, "after the slow clients");
	slow_stop(&s);
	http_stop(h);
}

/* Fewer slow clients than the per-address limit: no one pushes them out, so only the
 * absolute request deadline can close them. */
Test(http_abuse, a_request_that_never_ends_is_cut_at_its_deadline)
{
	char listen[64];
	struct http_server *h = start(listen, sizeof(listen));
	struct slow s;

	slow_start(&s, listen, NULL, 3, false);
	cr_assert_eq(slow_open_count(&s), 3);
	cr_assert_eq(slow_wait_all_closed(&s, CLOSE_BOUND_MS), 0,
	             "a request trickling one byte a second was not cut within %d ms",
	             CLOSE_BOUND_MS);
	cr_assert_eq(s.closed_by_server, 3);
	expect_healthz(listen, "after the deadline");
	slow_stop(&s);
	http_stop(h);
}

/* Each connection carries one request: an HTTP/1.1 client that would keep it open for more
 * is told "Connection: close" and the server closes it, so no connection sits idle between
 * requests where a slow client could hold it. */
Test(http_abuse, a_connection_carries_one_request)
{
	static const char req[] = "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n";
	char listen[64], buf[1024] = "";
	struct http_server *h = start(listen, sizeof(listen));
	size_t len = 0;
	ssize_t got = -1;
	int64_t until = clock_mono_ms() + CLOSE_BOUND_MS;
	int fd = probe_connect(listen, NULL, 5000);

	cr_assert_geq(fd, 0);
	cr_assert_eq(send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL), (ssize_t)sizeof(req) - 1);
	while (len < sizeof(buf) - 1 && clock_mono_ms() < until) {
		struct pollfd p = { .fd = fd, .events = POLLIN };

		poll(&p, 1, 1000);
		got = recv(fd, buf + len, sizeof(buf) - 1 - len, MSG_DONTWAIT);
		if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR))
			break;
		if (got > 0)
			len += (size_t)got;
	}
	buf[len] = '\0';
	close(fd);
	cr_assert_eq(got, 0, "the server did not close the connection after its answer: %s", buf);
	cr_assert_not_null(strstr(buf, "\r\nConnection: close\r\n"), "got: %s", buf);
	cr_assert_not_null(strstr(buf, "\r\n\r\nok\n"), "got: %s", buf);
	http_stop(h);
}

/* The per-address limit closes the connections of the address that exceeds it, not those of
 * another address. 127.0.0.2 and .3 are loopback addresses of this host, like two pods. The
 * connection from .3 is opened first, so a deadline alone would close it before any other. */
Test(http_abuse, one_address_does_not_push_out_another)
{
	char listen[64];
	struct http_server *h = start(listen, sizeof(listen));
	struct slow other, flood;
	int64_t until;

	slow_start(&other, listen, "127.0.0.3", 1, false);
	if (other.fd[0] < 0) {
		http_stop(h);
		cr_skip_test("cannot connect from 127.0.0.3 here");
	}
	slow_start(&flood, listen, "127.0.0.2", SLOW_CLIENTS, false);
	expect_healthz(listen, "beside the flood");
	/* The server closes what exceeds the limit a turn or two after accepting it. */
	until = clock_mono_ms() + CLOSE_BOUND_MS;
	while (flood.closed_by_server < SLOW_CLIENTS - HTTP_PER_ADDRESS_LIMIT &&
	       clock_mono_ms() < until) {
		poll(NULL, 0, 50);
		slow_reap(&flood);
	}
	cr_assert_geq(flood.closed_by_server, SLOW_CLIENTS - HTTP_PER_ADDRESS_LIMIT,
	              "only %d of %d connections from one address were closed",
	              flood.closed_by_server, SLOW_CLIENTS);
	/* Had they been closed by their deadline, this one would have gone first. */
	cr_assert(!closed_by_peer(other.fd[0]),
	          "127.0.0.3 was closed while 127.0.0.2 exceeded its limit");
	slow_stop(&flood);
	slow_stop(&other);
	http_stop(h);
}

/* Requests are a line and a few headers; a large one is refused (414/431 or a closed
 * connection), a browser-sized one is not. */
Test(http_abuse, a_large_request_is_refused)
{
	char listen[64];
	struct http_server *h = start(listen, sizeof(listen));
	size_t filler = 16 * 1024, cap = filler + 256;
	char *req = malloc(cap);
	struct probe_reply r;
	int n;

	cr_assert_not_null(req);
	n = snprintf(req, cap, "GET /healthz HTTP/1.0\r\nHost: localhost\r\nX-Filler: ");
	memset(req + n, 'a', filler);
	n += (int)filler;
	n += snprintf(req + n, cap - (size_t)n, "\r\n\r\n");
	r = probe_raw(listen, req, (size_t)n, 10000);
	cr_assert(r.status == -1 || (r.status >= 400 && r.status < 500), "a %d-byte request got %d",
	          n, r.status);
	free(r.body);

	/* About what a browser sends with a few cookies. */
	n = snprintf(req, cap, "GET /healthz HTTP/1.0\r\nHost: localhost\r\nCookie: ");
	memset(req + n, 'c', 2048);
	n += 2048;
	n += snprintf(req + n, cap - (size_t)n, "\r\n\r\n");
	r = probe_raw(listen, req, (size_t)n, 10000);
	cr_assert_eq(r.status, 200, "a %d-byte request got %d", n, r.status);
	free(r.body);
	free(req);
	expect_healthz(listen, "after the large request");
	http_stop(h);
}

/* Only GET and HEAD: anything else is 405 at once, without waiting for a body. */
Test(http_abuse, other_methods_get_405_without_reading_a_body)
{
	static const char post[] = "POST /healthz HTTP/1.1\r\nHost: localhost\r\n"
	                           "Content-Length: 1000000\r\n\r\npartial body";
	char listen[64];
	struct http_server *h = start(listen, sizeof(listen));
	static const char *methods[] = { "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE" };
	struct probe_reply r;
	char req[128];

	/* The body never comes: the answer must not wait for it. */
	r = probe_raw(listen, post, sizeof(post) - 1, 10000);
	cr_assert_eq(r.status, 405, "POST with a pending body got %d", r.status);
	free(r.body);
	for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) {
		int n = snprintf(req, sizeof(req), "%s /metrics HTTP/1.0\r\n\r\n", methods[i]);

		r = probe_raw(listen, req, (size_t)n, 10000);
		cr_assert_eq(r.status, 405, "%s got %d", methods[i], r.status);
		free(r.body);
	}
	r = probe_raw(listen, "HEAD /healthz HTTP/1.0\r\n\r\n", 26, 10000);
	cr_assert_eq(r.status, 200, "HEAD got %d", r.status);
	cr_assert_str_eq(r.body, "");
	free(r.body);
	r = probe_get_within(listen, "/healthz/extra", PROBE_TIMEOUT_MS);
	cr_assert_eq(r.status, 404, "an unknown path got %d", r.status);
	free(r.body);
	http_stop(h);
}
