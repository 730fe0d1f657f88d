/* amqp.url with the nodes of a cluster: a node that refuses is skipped, a lost connection
 * moves on to the next node, a call tries every node once and fails once per round, a login
 * refused everywhere is a configuration error, and no error text ever holds a password. The
 * "nodes" are TCP proxies in front of the one test broker, closed ports, and listeners that
 * never answer. */
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <amqp.h>

#include "amqp/broker.h"
#include "tests/support/fixture.h"
#include "tests/support/tcp_proxy.h"

#define PASSWORD_SHOWN_NEVER "s3cr3t-Pw"

static struct broker *b;

static void setup(void)
{
	b = NULL;
}

static void teardown(void)
{
	broker_free(b);
}

TestSuite(broker_nodes, .init = setup, .fini = teardown, .timeout = 120);

static struct broker *new_broker(const char *url, int64_t confirm_timeout_ms)
{
	static struct broker_options o;

	o = fixture_broker_options(url, confirm_timeout_ms, "outbox-relay nodes test");
	return fixture_broker_new(&o);
}

/* A port nobody listens on: bound, then closed. */
static int closed_port(void)
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

/* A listener that never accepts: the kernel completes the TCP handshake, the broker module
 * then waits for a connection.start that never comes. */
static int silent_listener(int *port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0); /* take_attempts() */

	cr_assert_geq(fd, 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(listen(fd, 16), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	*port = ntohs(a.sin_port);
	return fd;
}

/* Connections that reached the listener since the last call. */
static int take_attempts(int fd)
{
	int n = 0, c;

	while ((c = accept(fd, NULL, NULL)) >= 0) {
		close(c);
		n++;
	}
	cr_assert(errno == EAGAIN || errno == EWOULDBLOCK, "accept: %s", strerror(errno));
	return n;
}

Test(broker_nodes, a_refusing_first_node_is_skipped)
{
	char a[256], c[256], url[600], want[64];
	int port = closed_port();

	/* The first node of a round is random: every start must end on the live node. */
	fixture_amqp_node_url(a, sizeof(a), port, PASSWORD_SHOWN_NEVER);
	fixture_amqp_node_url(c, sizeof(c), harness_amqp_port(), NULL);
	snprintf(url, sizeof(url), "%s, %s", a, c);
	snprintf(want, sizeof(want), "127.0.0.1:%d", harness_amqp_port());
	for (int i = 0; i < 4; i++) {
		struct broker *x = new_broker(url, 5000);

		cr_assert_str_eq(broker_node(x), "", "no node before the first attempt");
		cr_assert_eq(broker_connect(x), BROKER_OK, "connect: %s", broker_errmsg(x));
		cr_assert_str_eq(broker_node(x), want);
		cr_assert_null(strstr(broker_errmsg(x), PASSWORD_SHOWN_NEVER));
		broker_free(x);
	}
}

Test(broker_nodes, a_lost_connection_moves_on_to_the_next_node)
{
	struct proxy *p[2] = { proxy_start(harness_amqp_port()), proxy_start(harness_amqp_port()) };
	char n0[256], n1[256], url[600], name[2][64];
	int first;

	fixture_amqp_node_url(n0, sizeof(n0), proxy_port(p[0]), NULL);
	fixture_amqp_node_url(n1, sizeof(n1), proxy_port(p[1]), NULL);
	snprintf(url, sizeof(url), "%s,%s", n0, n1);
	for (int i = 0; i < 2; i++)
		snprintf(name[i], sizeof(name[i]), "127.0.0.1:%d", proxy_port(p[i]));
	b = new_broker(url, 5000);
	cr_assert_eq(broker_connect(b), BROKER_OK, "connect: %s", broker_errmsg(b));
	first = strcmp(broker_node(b), name[0]) == 0 ? 0 : 1;
	cr_assert_str_eq(broker_node(b), name[first]);
	for (int round = 1; round <= 3; round++) {
		int now = (first + round) % 2, before = 1 - now;
		size_t accepted = proxy_accepted(p[now]);

		proxy_drop_all(p[before]);
		HARNESS_WAIT(broker_service(b) != BROKER_OK, 10000);
		cr_assert_not(broker_connected(b), "the dropped connection went unnoticed");
		cr_assert_eq(broker_connect(b), BROKER_OK, "reconnect: %s", broker_errmsg(b));
		cr_assert_str_eq(broker_node(b), name[now], "round %d", round);
		cr_assert_eq(proxy_accepted(p[now]), accepted + 1);
	}
	broker_free(b);
	b = NULL;
	proxy_stop(p[0]);
	proxy_stop(p[1]);
}

/* Three nodes that accept TCP and never answer: one call tries each once, bounded by the
 * connect timeout, and fails once; the next call does the same. */
Test(broker_nodes, all_nodes_down_is_one_error_per_round)
{
	int fd[3], port[3];
	char u[3][256], url[900];

	for (int i = 0; i < 3; i++) {
		fd[i] = silent_listener(&port[i]);
		fixture_amqp_node_url(u[i], sizeof(u[i]), port[i], PASSWORD_SHOWN_NEVER);
	}
	snprintf(url, sizeof(url), "%s,%s,%s", u[0], u[1], u[2]);
	b = new_broker(url, 1000);
	for (int round = 0; round < 2; round++) {
		char want[96];

		cr_assert_eq(broker_connect(b), BROKER_ERR_CONN, "round %d: %s", round,
		             broker_errmsg(b));
		for (int i = 0; i < 3; i++)
			cr_assert_eq(take_attempts(fd[i]), 1, "round %d, node %d", round, i);
		snprintf(want, sizeof(want),
		         "could not log in to %s as user '%s': ", broker_node(b),
		         fixture_amqp_info()->user);
		cr_assert_eq(strncmp(broker_errmsg(b), want, strlen(want)), 0, "%s",
		             broker_errmsg(b));
		cr_assert(strstr(broker_errmsg(b), "(all 3 nodes failed)") != NULL, "%s",
		          broker_errmsg(b));
		cr_assert_null(strstr(broker_errmsg(b), PASSWORD_SHOWN_NEVER));
	}
	for (int i = 0; i < 3; i++)
		close(fd[i]);
}

Test(broker_nodes, closed_ports_name_the_last_node)
{
	char u[2][256], url[600], want[128];

	fixture_amqp_node_url(u[0], sizeof(u[0]), closed_port(), PASSWORD_SHOWN_NEVER);
	fixture_amqp_node_url(u[1], sizeof(u[1]), closed_port(), PASSWORD_SHOWN_NEVER);
	snprintf(url, sizeof(url), "%s,%s", u[0], u[1]);
	b = new_broker(url, 2000);
	cr_assert_eq(broker_connect(b), BROKER_ERR_CONN);
	snprintf(want, sizeof(want),
	         "could not connect to %s: connection refused (all 2 nodes failed)",
	         broker_node(b));
	cr_assert_str_eq(broker_errmsg(b), want);
}

Test(broker_nodes, login_refused_by_every_node_is_a_config_error)
{
	char u[2][256], url[600];

	fixture_amqp_node_url(u[0], sizeof(u[0]), harness_amqp_port(), PASSWORD_SHOWN_NEVER);
	snprintf(url, sizeof(url), "%s,%s", u[0], u[0]);
	b = new_broker(url, 5000);
	cr_assert_eq(broker_connect(b), BROKER_ERR_CONFIG, "%s", broker_errmsg(b));
	cr_assert(strstr(broker_errmsg(b), "login refused for user") != NULL, "%s",
	          broker_errmsg(b));
	cr_assert_null(strstr(broker_errmsg(b), PASSWORD_SHOWN_NEVER));
	broker_free(b);

	/* One node refusing the login and one down is not a configuration error. */
	fixture_amqp_node_url(u[1], sizeof(u[1]), closed_port(), NULL);
	snprintf(url, sizeof(url), "%s,%s", u[0], u[1]);
	b = new_broker(url, 5000);
	cr_assert_eq(broker_connect(b), BROKER_ERR_CONN, "%s", broker_errmsg(b));
}

Test(broker_nodes, a_bad_url_in_the_list_is_named_by_position)
{
	char u[256], url[600];

	fixture_amqp_node_url(u, sizeof(u), harness_amqp_port(), PASSWORD_SHOWN_NEVER);
	snprintf(url, sizeof(url), "%s,http://user:%s@nowhere/", u, PASSWORD_SHOWN_NEVER);
	b = new_broker(url, 1000);
	cr_assert_eq(broker_connect(b), BROKER_ERR_CONFIG);
	cr_assert_str_eq(broker_errmsg(b),
	                 "invalid amqp.url: URL 2 of 2: does not start with amqp:// or amqps://");
	broker_free(b);
	snprintf(url, sizeof(url), "%s,", u);
	b = new_broker(url, 1000);
	cr_assert_eq(broker_connect(b), BROKER_ERR_CONFIG);
	cr_assert_str_eq(broker_errmsg(b), "invalid amqp.url: URL 2 of 2: empty");
}
