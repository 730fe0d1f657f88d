/* The HTTP endpoint on a loopback port: /healthz follows the relay loops' ticks, /readyz the
 * connection state, /metrics renders counters; the healthcheck client reads statuses. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "base/clock.h"
#include "relay/http.h"
#include "relay/metrics.h"

/* The one unnamed source, as `run` has it without named sources. */
static struct metrics g_metrics;
static struct metrics_unit g_unit = { .source = "", .m = &g_metrics };

static void setup(void)
{
	metrics_init(&g_metrics);
}

TestSuite(http, .init = setup);

/* Asks the kernel for a free port by binding to port 0, then frees it for the server. */
static int free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	cr_assert_geq(fd, 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	close(fd);
	return ntohs(a.sin_port);
}

/* Sends a raw request and returns the whole response (caller frees). */
static char *request(int port, const char *method, const char *path)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct timeval tv = { .tv_sec = 5 };
	size_t cap = 65536, len = 0;
	char *buf = malloc(cap + 1), req[256];
	ssize_t n;
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	cr_assert_not_null(buf);
	cr_assert_geq(fd, 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	a.sin_port = htons((uint16_t)port);
	cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	n = snprintf(req, sizeof(req), "%s %s HTTP/1.0\r\nHost: localhost\r\n\r\n", method, path);
	cr_assert_eq(send(fd, req, (size_t)n, MSG_NOSIGNAL), n);
	while (len < cap && (n = recv(fd, buf + len, cap - len, 0)) > 0)
		len += (size_t)n;
	close(fd);
	buf[len] = '\0';
	return buf;
}

static const char *body_of(const char *resp)
{
	const char *p = strstr(resp, "\r\n\r\n");

	cr_assert_not_null(p, "no header end in: %s", resp);
	return p + 4;
}

static struct http_server *start(int *port, int64_t stale_ms)
{
	char listen[64], err[256] = "";
	struct http_server *h;

	*port = free_port();
	snprintf(listen, sizeof(listen), "127.0.0.1:%d", *port);
	h = http_start(listen, stale_ms, "9.9.9", &g_unit, 1, err, sizeof(err));
	cr_assert_not_null(h, "http_start: %s", err);
	return h;
}

Test(http, healthz_follows_the_ticks)
{
	int port;
	struct http_server *h = start(&port, 1000);
	char *resp;

	atomic_store(&g_metrics.workers, 2);
	atomic_store(&g_metrics.tick_ms[0], clock_mono_ms());
	atomic_store(&g_metrics.tick_ms[1], clock_mono_ms());
	resp = request(port, "GET", "/healthz");
	cr_assert_eq(strncmp(resp, "HTTP/1.", 7), 0);
	cr_assert_eq(strncmp(resp + 9, "200", 3), 0, "got: %s", resp);
	cr_assert_str_eq(body_of(resp), "ok\n");
	free(resp);

	/* Worker 1 has not ticked for 5 s: the process is alive but that loop is stuck. */
	atomic_store(&g_metrics.tick_ms[1], clock_mono_ms() - 5000);
	resp = request(port, "GET", "/healthz");
	cr_assert_eq(strncmp(resp + 9, "503", 3), 0, "got: %s", resp);
	cr_assert_not_null(strstr(body_of(resp), "worker 1"), "got: %s", resp);
	free(resp);
	http_stop(h);
}

Test(http, readyz_names_what_is_missing)
{
	int port;
	struct http_server *h = start(&port, 1000);
	char *resp;

	atomic_store(&g_metrics.workers, 2);
	atomic_store(&g_metrics.db_up, 1);
	atomic_store(&g_metrics.broker_up, 2);
	resp = request(port, "GET", "/readyz");
	cr_assert_eq(strncmp(resp + 9, "503", 3), 0, "got: %s", resp);
	cr_assert_not_null(strstr(body_of(resp), "database not connected"), "got: %s", resp);
	cr_assert_null(strstr(body_of(resp), "broker"), "got: %s", resp);
	free(resp);

	atomic_store(&g_metrics.db_up, 2);
	atomic_store(&g_metrics.broker_up, 0);
	resp = request(port, "GET", "/readyz");
	cr_assert_eq(strncmp(resp + 9, "503", 3), 0, "got: %s", resp);
	cr_assert_not_null(strstr(body_of(resp), "broker not connected"), "got: %s", resp);
	free(resp);

	atomic_store(&g_metrics.broker_up, 2);
	resp = request(port, "GET", "/readyz");
	cr_assert_eq(strncmp(resp + 9, "200", 3), 0, "got: %s", resp);
	cr_assert_eq(strncmp(body_of(resp), "ready\n", 6), 0, "got: %s", body_of(resp));
	free(resp);
	http_stop(h);
}

Test(http, readyz_without_workers_is_not_ready)
{
	int port;
	struct http_server *h = start(&port, 1000);
	char *resp = request(port, "GET", "/readyz");

	cr_assert_eq(strncmp(resp + 9, "503", 3), 0, "got: %s", resp);
	free(resp);
	http_stop(h);
}

Test(http, metrics_are_served_as_prometheus_text)
{
	int port;
	struct http_server *h = start(&port, 1000);
	char *resp;

	atomic_fetch_add(&g_metrics.published, 5);
	resp = request(port, "GET", "/metrics");
	cr_assert_eq(strncmp(resp + 9, "200", 3), 0, "got: %s", resp);
	cr_assert_not_null(strstr(resp, "Content-Type: text/plain; version=0.0.4\r\n"), "got: %s",
	                   resp);
	cr_assert_not_null(strstr(body_of(resp), "\noutbox_relay_published_total 5\n"));
	cr_assert_not_null(strstr(body_of(resp), "outbox_relay_build_info{version=\"9.9.9\"} 1\n"));
	free(resp);
	http_stop(h);
}

Test(http, unknown_paths_and_methods_are_refused)
{
	int port;
	struct http_server *h = start(&port, 1000);
	char *resp;

	resp = request(port, "GET", "/nope");
	cr_assert_eq(strncmp(resp + 9, "404", 3), 0, "got: %s", resp);
	free(resp);
	resp = request(port, "POST", "/metrics");
	cr_assert_eq(strncmp(resp + 9, "405", 3), 0, "got: %s", resp);
	free(resp);
	resp = request(port, "DELETE", "/healthz");
	cr_assert_eq(strncmp(resp + 9, "405", 3), 0, "got: %s", resp);
	free(resp);
	http_stop(h);
}

Test(http, client_reads_the_status)
{
	int port;
	struct http_server *h = start(&port, 1000);
	char listen[64], err[256] = "";

	snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
	atomic_store(&g_metrics.workers, 1);
	cr_assert_eq(http_get_status(listen, "/readyz", 2000, err, sizeof(err)), 503, "%s", err);
	atomic_store(&g_metrics.db_up, 1);
	atomic_store(&g_metrics.broker_up, 1);
	cr_assert_eq(http_get_status(listen, "/readyz", 2000, err, sizeof(err)), 200, "%s", err);
	cr_assert_eq(http_get_status(listen, "/missing", 2000, err, sizeof(err)), 404, "%s", err);
	/* ":port" and 0.0.0.0 mean "this host" to the client. */
	snprintf(listen, sizeof(listen), "0.0.0.0:%d", port);
	cr_assert_eq(http_get_status(listen, "/readyz", 2000, err, sizeof(err)), 200, "%s", err);
	http_stop(h);

	snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
	err[0] = '\0';
	cr_assert_eq(http_get_status(listen, "/readyz", 2000, err, sizeof(err)), -1);
	cr_assert_not_null(strstr(err, "could not connect"), "got: %s", err);
}

Test(http, all_addresses_listener)
{
	char listen[64], err[256] = "";
	int port = free_port();
	struct http_server *h;

	snprintf(listen, sizeof(listen), ":%d", port);
	h = http_start(listen, 1000, "v", &g_unit, 1, err, sizeof(err));
	cr_assert_not_null(h, "http_start: %s", err);
	cr_assert_eq(http_get_status(listen, "/nope", 2000, err, sizeof(err)), 404, "%s", err);
	http_stop(h);
}

Test(http, bad_addresses_are_reported)
{
	char listen[64], err[256] = "";
	int port;
	struct http_server *h = start(&port, 1000), *h2;

	snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
	h2 = http_start(listen, 1000, "v", &g_unit, 1, err, sizeof(err));
	cr_assert_null(h2);
	cr_assert_not_null(strstr(err, "in use"), "got: %s", err);
	http_stop(h);
	/* Stopping closes the listening socket: the port can be taken again at once. */
	h = http_start(listen, 1000, "v", &g_unit, 1, err, sizeof(err));
	cr_assert_not_null(h, "port still held after http_stop: %s", err);
	http_stop(h);

	cr_assert_null(http_start("127.0.0.1", 1000, "v", &g_unit, 1, err, sizeof(err)));
	cr_assert_not_null(strstr(err, "127.0.0.1"), "got: %s", err);
	cr_assert_null(http_start("127.0.0.1:70000", 1000, "v", &g_unit, 1, err, sizeof(err)));
	cr_assert_not_null(strstr(err, "port"), "got: %s", err);
	cr_assert_null(http_start("::1:8787", 1000, "v", &g_unit, 1, err, sizeof(err)));
	cr_assert_null(http_start("", 1000, "v", &g_unit, 1, err, sizeof(err)));
	cr_assert_eq(http_get_status("nonsense", "/", 100, err, sizeof(err)), -1);
	http_stop(NULL);
}

Test(http, ipv6_loopback_in_brackets)
{
	char listen[64], err[256] = "";
	int port = free_port(), fd = socket(AF_INET6, SOCK_STREAM, 0);
	struct sockaddr_in6 a = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT };
	struct http_server *h;

	/* Hosts without IPv6 (some CI containers) cannot run this one. */
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		if (fd >= 0)
			close(fd);
		cr_skip_test("no IPv6 loopback here");
	}
	close(fd);
	snprintf(listen, sizeof(listen), "[::1]:%d", port);
	h = http_start(listen, 1000, "v", &g_unit, 1, err, sizeof(err));
	cr_assert_not_null(h, "http_start: %s", err);
	cr_assert_eq(http_get_status(listen, "/metrics", 2000, err, sizeof(err)), 200, "%s", err);
	http_stop(h);
}

/* Named sources: /readyz is 200 only when every source is ready and names each one's state on
 * a line; /healthz ignores a failed source's ended loops but not a stale one's; /metrics
 * labels each source's series. */
Test(http, named_sources_answer_per_source)
{
	struct metrics billing;
	struct metrics_unit units[2] = { { "orders", &g_metrics }, { "billing", &billing } };
	char listen[64], err[256] = "", *resp;
	struct http_server *h;
	int port = free_port();

	metrics_init(&billing);
	snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
	h = http_start(listen, 1000, "v", units, 2, err, sizeof(err));
	cr_assert_not_null(h, "http_start: %s", err);
	atomic_store(&g_metrics.workers, 1);
	atomic_store(&g_metrics.db_up, 1);
	atomic_store(&g_metrics.broker_up, 1);
	atomic_store(&g_metrics.tick_ms[0], clock_mono_ms());
	metrics_set_broker_node(&g_metrics, 0, "mq1:5672");
	atomic_store(&billing.workers, 1);
	atomic_store(&billing.broker_up, 1);
	atomic_store(&billing.tick_ms[0], clock_mono_ms());

	resp = request(port, "GET", "/readyz");
	cr_assert_eq(strncmp(resp + 9, "503", 3), 0, "got: %s", resp);
	cr_assert_str_eq(body_of(resp), "orders ready, broker mq1:5672\n"
	                                "billing not ready: database not connected\n");
	free(resp);

	atomic_store(&billing.db_up, 1);
	resp = request(port, "GET", "/readyz");
	cr_assert_eq(strncmp(resp + 9, "200", 3), 0, "got: %s", resp);
	cr_assert_str_eq(body_of(resp), "orders ready, broker mq1:5672\nbilling ready\n");
	free(resp);

	resp = request(port, "GET", "/healthz");
	cr_assert_eq(strncmp(resp + 9, "200", 3), 0, "got: %s", resp);
	free(resp);
	atomic_store(&billing.tick_ms[0], clock_mono_ms() - 5000);
	resp = request(port, "GET", "/healthz");
	cr_assert_eq(strncmp(resp + 9, "503", 3), 0, "got: %s", resp);
	cr_assert_not_null(strstr(body_of(resp), "billing: worker 0 stale"), "got: %s", resp);
	free(resp);

	/* Failed: its loops ended on purpose; not ready, but not a reason to restart. */
	atomic_store(&billing.source_failed, 1);
	resp = request(port, "GET", "/healthz");
	cr_assert_eq(strncmp(resp + 9, "200", 3), 0, "got: %s", resp);
	free(resp);
	resp = request(port, "GET", "/readyz");
	cr_assert_eq(strncmp(resp + 9, "503", 3), 0, "got: %s", resp);
	cr_assert_not_null(strstr(body_of(resp), "billing failed: "), "got: %s", resp);
	free(resp);

	atomic_fetch_add(&billing.published, 3);
	resp = request(port, "GET", "/metrics");
	cr_assert_not_null(
	        strstr(body_of(resp), "\noutbox_relay_published_total{source=\"billing\"} 3\n"),
	        "got: %s", resp);
	cr_assert_not_null(
	        strstr(body_of(resp), "\noutbox_relay_published_total{source=\"orders\"} 0\n"));
	free(resp);
	http_stop(h);
	metrics_destroy(&billing);
}
