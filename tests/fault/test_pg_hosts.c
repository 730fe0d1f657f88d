/* Failover over every host libpq would try, not only those written in database.url: a host
 * list from PGHOST, and a name that resolves to several addresses. The first host (address)
 * accepts TCP connections and never answers, as a machine behind a dead service or a stalled
 * path does; the relay must give it its own connect_timeout and go on to the next one, which
 * is PostgreSQL. Before, such lists ran as one libpq attempt under one deadline, which the
 * silent first host used up every time: the relay never connected. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/support/fault.h"
#include "tests/support/tcp_proxy.h"

#define ROWS 10
/* Each silent address costs connect_timeout (2 s here) per round; far more than one round. */
#define CONNECT_BOUND_MS 60000

/* A listener that never accepts: the kernel completes the handshake, the startup packet is
 * never answered. Returns the socket; *port gets its port (in: 0 = ephemeral). */
static int silent_listener(const char *ipv4, int *port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)*port) };
	socklen_t alen = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	cr_assert(fd >= 0, "socket: %s", strerror(errno));
	cr_assert_eq(inet_pton(AF_INET, ipv4, &a.sin_addr), 1);
	cr_assert(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0, "bind %s:%d: %s", ipv4, *port,
	          strerror(errno));
	cr_assert(listen(fd, 64) == 0, "listen: %s", strerror(errno));
	cr_assert(getsockname(fd, (struct sockaddr *)&a, &alen) == 0);
	*port = ntohs(a.sin_port);
	return fd;
}

/* Whether someone connected to the silent listener (the relay tried it). */
static bool was_tried(int fd)
{
	int c, fl = fcntl(fd, F_GETFL);

	(void)fcntl(fd, F_SETFL, fl | O_NONBLOCK);
	c = accept(fd, NULL, NULL);
	if (c >= 0)
		close(c);
	return c >= 0;
}

/* The relay is connected to PostgreSQL and publishes what is committed. */
static void expect_relaying(struct fixture *f, const char *prefix)
{
	if (!fixture_wait_logged(f, "msg=\"connected\" to=database", CONNECT_BOUND_MS)) {
		fixture_dump_logs(f);
		cr_assert_fail("the relay never connected to PostgreSQL past the silent host");
	}
	harness_insert_rows(f->pg, f->table, ROWS, f->exchange, "hosts.run", prefix, NULL, NULL);
	fixture_expect_unique(f, f->cons, ROWS, FAULT_DELIVERY_TIMEOUT_MS);
}

Test(fault, pghost_list_fails_over_past_a_silent_host, .timeout = 600)
{
	struct fixture f;
	int dead_port = 0, dead = silent_listener("127.0.0.1", &dead_port);
	const char *pg_port = harness_require_env("RELAY_TEST_PG_PORT");
	char hosts[64], ports[64];
	const char *env[] = {
		"OUTBOX_DATABASE_URL=user=postgres dbname=postgres connect_timeout=2",
		hosts,
		ports,
		NULL,
	};

	fixture_setup(&f, "fault_pghost", NULL);
	snprintf(hosts, sizeof(hosts), "PGHOST=127.0.0.1,127.0.0.1");
	snprintf(ports, sizeof(ports), "PGPORT=%d,%s", dead_port, pg_port);
	fault_relay_start(&f, env);
	expect_relaying(&f, "pghost");
	cr_expect(was_tried(dead), "the silent first host of PGHOST was never tried");
	fixture_teardown(&f);
	close(dead);
}

/* The relay resolves names through nss_wrapper (Debian's libnss-wrapper, preloaded) with a
 * hosts file of the test's own: no mount namespace, so it works alike as root or not, in a
 * container or a chroot, and leaves the machine's /etc/hosts alone. */
#define NSS_WRAPPER_PRELOAD "LD_PRELOAD=libnss_wrapper.so"
#define NSS_NO_DEEPBIND     "NSS_WRAPPER_DISABLE_DEEPBIND=1"

/* The first line of `getent ahostsv4 name` with hosts_file as the hosts file: the address
 * libpq tries first. */
static void first_address(const char *hosts_file, const char *name, char *buf, size_t n)
{
	char cmd[1024];
	FILE *p;

	snprintf(cmd, sizeof(cmd), "%s NSS_WRAPPER_HOSTS='%s' getent ahostsv4 '%s'",
	         NSS_WRAPPER_PRELOAD, hosts_file, name);
	p = popen(cmd, "r");
	cr_assert_not_null(p);
	buf[0] = '\0';
	if (fgets(buf, (int)n, p))
		buf[strcspn(buf, " \t\n")] = '\0';
	cr_assert_eq(pclose(p), 0, "%s: could not resolve through nss_wrapper (libnss-wrapper)",
	             cmd);
}

Test(fault, a_name_with_two_addresses_fails_over_past_a_silent_one, .timeout = 600)
{
	static const char name[] = "outbox-relay-two-addresses.test";
	const char *pg_port = harness_require_env("RELAY_TEST_PG_PORT");
	const char *asan = getenv("ASAN_OPTIONS");
	char dir[] = "/tmp/outbox-hosts.XXXXXX", hosts_file[128], first[64], nss_hosts[160];
	char url[256], table[96], channel[96], asan_options[512];
	const char *live_addr;
	struct fixture f;
	struct proxy *live;
	struct harness_relay *r;
	int port = 0, dead;
	FILE *h;

	cr_assert_not_null(mkdtemp(dir));
	snprintf(hosts_file, sizeof(hosts_file), "%s/hosts", dir);
	h = fopen(hosts_file, "w");
	cr_assert_not_null(h);
	fprintf(h, "127.0.0.1 %s\n127.0.0.2 %s\n", name, name);
	cr_assert_eq(fclose(h), 0);
	/* The silent listener takes the address tried first, PostgreSQL (through a proxy at the
	 * same port) the other one. */
	first_address(hosts_file, name, first, sizeof(first));
	cr_assert(strcmp(first, "127.0.0.1") == 0 || strcmp(first, "127.0.0.2") == 0,
	          "%s resolves first to '%s'", name, first);
	live_addr = strcmp(first, "127.0.0.1") == 0 ? "127.0.0.2" : "127.0.0.1";
	dead = silent_listener(first, &port);
	live = proxy_start_at(live_addr, port, (int)strtol(pg_port, NULL, 10));

	fixture_setup(&f, "fault_twoaddr", NULL);
	snprintf(url, sizeof(url),
	         "OUTBOX_DATABASE_URL=host=%s port=%d user=postgres dbname=postgres "
	         "connect_timeout=2",
	         name, port);
	snprintf(table, sizeof(table), "OUTBOX_DATABASE_TABLE=%s", f.table);
	snprintf(channel, sizeof(channel), "OUTBOX_DATABASE_CHANNEL=%s", f.table);
	snprintf(nss_hosts, sizeof(nss_hosts), "NSS_WRAPPER_HOSTS=%s", hosts_file);
	/* The sanitizers' runtime wants to come first among the libraries (nss_wrapper, preloaded,
	 * comes before it, which is harmless here) and cannot run beside the deep binding with
	 * which nss_wrapper loads libc, so that is off. */
	snprintf(asan_options, sizeof(asan_options), "ASAN_OPTIONS=%s%sverify_asan_link_order=0",
	         asan ? asan : "", asan && *asan ? ":" : "");
	{
		const char *env[] = { url,       table,           channel,      NSS_WRAPPER_PRELOAD,
			              nss_hosts, NSS_NO_DEEPBIND, asan_options, NULL };

		r = harness_program_start(harness_relay_bin(), (const char *const[]){ "run", NULL },
		                          env, f.table);
	}
	cr_assert_lt(f.n_relays, FIXTURE_MAX_RELAYS);
	f.relays[f.n_relays++] = r;
	expect_relaying(&f, "twoaddr");
	cr_expect(was_tried(dead), "the silent first address of %s was never tried", name);
	fixture_teardown(&f);
	proxy_stop(live);
	close(dead);
	unlink(hosts_file);
	rmdir(dir);
}
