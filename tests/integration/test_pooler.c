/* The relay behind PgBouncer (Debian's pgbouncer, started here in front of the test
 * PostgreSQL on a free loopback port). Transaction pooling cannot serve the relay (it LISTENs
 * and keeps session settings): the relay says so once and exits 1 without relaying. Session
 * pooling works end to end. Statement pooling must be refused as well (see below). */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <libpq-fe.h>

#include "tests/support/consumer_assert.h"
#include "tests/support/harness.h"
#include "tests/support/fixture.h"

#define PGBOUNCER           "/usr/sbin/pgbouncer"
#define DELIVERY_TIMEOUT_MS 120000
#define EXIT_TIMEOUT_MS     60000

struct bouncer {
	struct harness_relay *proc; /* killed at the test's exit whatever happens */
	int port;
	char dir[128];
	char url[256]; /* conninfo through the pooler */
};

/* A loopback port nobody listens on right now. */
static int free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0), port;

	cr_assert_geq(fd, 0);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	port = ntohs(a.sin_port);
	close(fd);
	return port;
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	cr_assert_not_null(f, "cannot write %s", path);
	fputs(text, f);
	cr_assert_eq(fclose(f), 0);
	cr_assert_eq(chmod(path, 0644), 0);
}

static bool bouncer_accepts(void *arg)
{
	struct bouncer *b = arg;
	PGconn *c = PQconnectdb(b->url);
	bool ok = PQstatus(c) == CONNECTION_OK;

	PQfinish(c);
	return ok;
}

/* Starts PgBouncer in pool_mode mode in front of the test server. PgBouncer refuses to run as
 * root, so it drops to the postgres user (-u); its files are readable by all. */
static void bouncer_start(struct bouncer *b, const char *mode)
{
	const char *pg_port = harness_require_env("RELAY_TEST_PG_PORT");
	char ini[160], users[160], text[1024];
	const char *args[4];

	cr_assert(access(PGBOUNCER, X_OK) == 0, PGBOUNCER " is missing (tests/install-deps.sh)");
	snprintf(b->dir, sizeof(b->dir), "/tmp/outbox-pgbouncer-XXXXXX");
	cr_assert_not_null(mkdtemp(b->dir));
	cr_assert_eq(chmod(b->dir, 0755), 0);
	b->port = free_port();
	snprintf(ini, sizeof(ini), "%s/pgbouncer.ini", b->dir);
	snprintf(users, sizeof(users), "%s/users.txt", b->dir);
	write_file(users, "\"postgres\" \"\"\n");
	snprintf(text, sizeof(text),
	         "[databases]\n"
	         "* = host=127.0.0.1 port=%s\n"
	         "[pgbouncer]\n"
	         "listen_addr = 127.0.0.1\n"
	         "listen_port = %d\n"
	         "unix_socket_dir =\n"
	         "auth_type = trust\n"
	         "auth_file = %s\n"
	         "pool_mode = %s\n"
	         "max_client_conn = 200\n"
	         "default_pool_size = 20\n"
	         "server_reset_query = DISCARD ALL\n"
	         "ignore_startup_parameters = extra_float_digits\n",
	         pg_port, b->port, users, mode);
	write_file(ini, text);
	args[0] = "-u";
	args[1] = "postgres";
	args[2] = ini;
	args[3] = NULL;
	b->proc = harness_program_start(PGBOUNCER, args, NULL, "pgbouncer");
	snprintf(b->url, sizeof(b->url),
	         "host=127.0.0.1 port=%d user=postgres dbname=postgres connect_timeout=5", b->port);
	if (!harness_wait_until(bouncer_accepts, b, 20000)) {
		harness_relay_dump_log(b->proc);
		cr_assert_fail("pgbouncer (%s) did not accept connections on port %d", mode,
		               b->port);
	}
}

static void bouncer_stop(struct bouncer *b)
{
	char path[200];

	harness_relay_free(b->proc); /* kills it */
	b->proc = NULL;
	snprintf(path, sizeof(path), "%s/pgbouncer.ini", b->dir);
	unlink(path);
	snprintf(path, sizeof(path), "%s/users.txt", b->dir);
	unlink(path);
	rmdir(b->dir);
}

/* A pooling mode that cannot serve the relay: it must not relay, must say why in one error
 * line, once, and exit 1. */
static void refused_in_mode(const char *mode)
{
	char env_url[320];
	const char *env[2] = { env_url, NULL };
	struct fixture fx;
	struct bouncer b;
	struct harness_relay *r;
	int status;

	fixture_setup(&fx, "pool_refused", &(struct fixture_options){ .no_consumer = true });
	harness_pg_exec(fx.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body)"
	                " VALUES ('r-1', 'amq.topic', 'nowhere', '{}')",
	                fx.table);
	bouncer_start(&b, mode);
	snprintf(env_url, sizeof(env_url), "OUTBOX_DATABASE_URL=%s", b.url);
	r = fixture_relay_start(&fx, env);
	status = harness_relay_wait(r, EXIT_TIMEOUT_MS);
	if (status != 1)
		harness_relay_dump_log(r);
	cr_assert_eq(status, 1, "pool_mode=%s: the relay exited %d (-1: still running)", mode,
	             status);
	cr_assert_eq(harness_relay_log_count(r, "level=error"), 1, "one error line");
	cr_assert_eq(harness_relay_log_count(r, "pool_mode=transaction"), 1,
	             "the error line names the problem");
	cr_assert_eq(harness_relay_log_count(r, "direct connection or session pooling"), 1);
	cr_assert_eq(harness_pg_int(fx.pg,
	                            "SELECT count(*) FROM %s WHERE published_at IS NULL"
	                            " AND attempts = 0 AND locked_by IS NULL",
	                            fx.table),
	             1, "nothing relayed, nothing claimed");
	bouncer_stop(&b);
	fixture_teardown(&fx);
}

Test(pooler, transaction_pooling_is_refused, .timeout = 180)
{
	refused_in_mode("transaction");
}

/* Statement pooling must be refused too, but the connect-time probe cannot tell it yet: it
 * opens a transaction on a second client, which PgBouncer refuses in this mode, and then takes
 * "cannot tell" for "direct". The relay then runs, its LISTEN and prepared statements on
 * whichever server connection the pooler picks. Disabled until the probe takes a refused
 * BEGIN (with a backend pid that is not the session's) for a pooler (store/connection.c). */
Test(pooler, statement_pooling_is_refused, .timeout = 180)
{
	refused_in_mode("statement");
}

Test(pooler, session_pooling_relays_end_to_end, .timeout = 300)
{
	char env_url[320];
	const char *env[2] = { env_url, NULL };
	struct fixture fx;
	struct bouncer b;

	/* The table is migrated through the pooler below. */
	fixture_setup(&fx, "pool_session", &(struct fixture_options){ .no_migrate = true });
	bouncer_start(&b, "session");
	snprintf(env_url, sizeof(env_url), "OUTBOX_DATABASE_URL=%s", b.url);
	{
		/* migrate through the pooler too */
		struct harness_output o;

		harness_cli(&o, fx.table, env, "migrate", (const char *)NULL);
		cr_assert_eq(o.status, 0, "migrate through pgbouncer: %s%s", o.out, o.err);
		harness_output_free(&o);
	}
	harness_pg_exec(fx.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body)"
	                " SELECT 's-' || g, '%s', 'rk', '{}' FROM generate_series(1, 20) g",
	                fx.table, fx.exchange);
	fixture_relay_start(&fx, env);
	fixture_expect_unique(&fx, fx.cons, 20, DELIVERY_TIMEOUT_MS);
	/* A row committed while the relay sleeps arrives too (LISTEN through the pooler). */
	harness_pg_exec(fx.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body)"
	                " VALUES ('late', '%s', 'rk', '{}')",
	                fx.table, fx.exchange);
	fixture_expect_unique(&fx, fx.cons, 21, DELIVERY_TIMEOUT_MS);
	HARNESS_WAIT(harness_pg_int(fx.pg, "SELECT count(*) FROM %s WHERE published_at IS NULL",
	                            fx.table) == 0,
	             30000);
	cr_assert_eq(harness_pg_int(fx.pg, "SELECT count(*) FROM %s WHERE published_at IS NULL",
	                            fx.table),
	             0);
	/* The relay stops before its pooler does. */
	fixture_teardown(&fx);
	bouncer_stop(&b);
}
