/* TLS to both ends against the test servers' real TLS listeners (tests/services.sh makes the
 * certificates): the relay delivers over amqps:// and sslmode=verify-full, presents a client
 * certificate when given one, and refuses a broker its CA file cannot verify. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/fixture.h"

/* Generous deadlines: the suite runs under ASan on two cores beside other test files. */
#define DELIVERY_TIMEOUT_MS 120000
#define ROWS                40

#define BROKER_FAILED "could not connect, will retry\" to=broker"
#define DB_FAILED     "could not connect, will retry\" to=database"

struct tls_test {
	struct fixture fx;
	char db_url[1024], amqps[256];
	char ca[512], wrong_ca[512], client_cert[512], client_key[512];
	char e_db[1100], e_amqp[300], e_ca[600], e_cert[600], e_key[600];
	struct harness_relay *relay; /* borrowed from fx */
};

static void tls_path(char *buf, size_t len, const char *file)
{
	int n = snprintf(buf, len, "%s/%s", harness_require_env("RELAY_TEST_TLS_DIR"), file);

	cr_assert(n > 0 && (size_t)n < len, "TLS path too long");
}

/* Own table and exchange, a plain-AMQP consumer (the relay is what must speak TLS), and the
 * relay's environment strings: verify-full against the test CA for PostgreSQL, amqps:// with
 * the CA file given as `ca` for the broker. */
static void tls_setup(struct tls_test *t, const char *prefix, const char *ca)
{
	memset(t, 0, sizeof(*t));
	tls_path(t->ca, sizeof(t->ca), "ca.pem");
	tls_path(t->wrong_ca, sizeof(t->wrong_ca), "wrong-ca.pem");
	tls_path(t->client_cert, sizeof(t->client_cert), "client.pem");
	tls_path(t->client_key, sizeof(t->client_key), "client.key");
	snprintf(t->amqps, sizeof(t->amqps), "%s", harness_require_env("RELAY_TEST_AMQPS"));
	snprintf(t->db_url, sizeof(t->db_url), "%s sslmode=verify-full sslrootcert=%s",
	         harness_pg_conninfo(), t->ca);
	snprintf(t->e_db, sizeof(t->e_db), "OUTBOX_DATABASE_URL=%s", t->db_url);
	snprintf(t->e_amqp, sizeof(t->e_amqp), "OUTBOX_AMQP_URL=%s", t->amqps);
	snprintf(t->e_ca, sizeof(t->e_ca), "OUTBOX_AMQP_TLS_CA_FILE=%s",
	         strcmp(ca, "wrong") == 0 ? t->wrong_ca : t->ca);
	snprintf(t->e_cert, sizeof(t->e_cert), "OUTBOX_AMQP_TLS_CERT_FILE=%s", t->client_cert);
	snprintf(t->e_key, sizeof(t->e_key), "OUTBOX_AMQP_TLS_KEY_FILE=%s", t->client_key);
	fixture_setup(&t->fx, prefix, NULL);
	harness_insert_rows(t->fx.pg, t->fx.table, ROWS, t->fx.exchange, "tls.created", "tls", NULL,
	                    NULL);
}

static void expect_all_delivered(struct tls_test *t)
{
	fixture_expect_unique(&t->fx, t->fx.cons, ROWS, DELIVERY_TIMEOUT_MS);
	HARNESS_WAIT(harness_pg_int(t->fx.pg, "SELECT count(*) FROM %s WHERE published_at IS NULL",
	                            t->fx.table) == 0,
	             30000);
	cr_assert_eq(harness_pg_int(t->fx.pg, "SELECT count(*) FROM %s WHERE published_at IS NULL",
	                            t->fx.table),
	             0, "rows left unpublished after delivery");
	cr_assert_eq(harness_relay_log_count(t->relay, "could not connect"), 0,
	             "a connection failed on the way");
}

/* Output of `rabbitmqctl list_connections ssl peer_cert_subject`; new string (free()). */
static char *broker_connections(void)
{
	char cmd[1024], *buf;
	size_t len = 0, cap = 1 << 16;
	FILE *p;

	snprintf(cmd, sizeof(cmd), "'%s' list_connections -q ssl peer_cert_subject 2>&1",
	         harness_require_env("RELAY_TEST_RABBITMQCTL"));
	p = popen(cmd, "r");
	cr_assert_not_null(p, "could not run rabbitmqctl");
	buf = malloc(cap);
	cr_assert_not_null(buf);
	len = fread(buf, 1, cap - 1, p);
	buf[len] = '\0';
	cr_assert_eq(pclose(p), 0, "rabbitmqctl list_connections failed: %s", buf);
	return buf;
}

static bool contains_ci(const char *hay, const char *needle)
{
	size_t n = strlen(needle);

	for (; *hay; hay++) {
		size_t i = 0;

		while (i < n && hay[i] &&
		       tolower((unsigned char)hay[i]) == tolower((unsigned char)needle[i]))
			i++;
		if (i == n)
			return true;
	}
	return false;
}

/* The first log line containing needle; new string (free()), NULL when there is none. */
static char *log_line(const struct harness_relay *r, const char *needle)
{
	char *log = harness_relay_log(r), *hit, *start, *end, *line = NULL;

	hit = strstr(log, needle);
	if (hit != NULL) {
		start = hit;
		while (start > log && start[-1] != '\n')
			start--;
		end = strchr(hit, '\n');
		if (end == NULL)
			end = hit + strlen(hit);
		line = strndup(start, (size_t)(end - start));
	}
	free(log);
	return line;
}

Test(tls, delivers_over_amqps_and_verify_full, .timeout = 300)
{
	struct tls_test t;

	tls_setup(&t, "tls_ok", "right");
	/* sslmode=verify-full fails unless the server's certificate names 127.0.0.1 and chains
	 * to the CA, so delivery itself proves the database side is TLS. */
	t.relay = fixture_relay_start(
	        &t.fx, (const char *const[]){ t.e_db, t.e_amqp, t.e_ca,
	                                      "OUTBOX_RELAY_POLL_INTERVAL=200ms", NULL });
	expect_all_delivered(&t);
	cr_assert(harness_relay_log_count(t.relay, "amqps://guest:***@localhost") >= 1,
	          "the start line shows the amqps:// URL, password hidden");
	fixture_teardown(&t.fx);
}

Test(tls, presents_client_certificate, .timeout = 300)
{
	struct tls_test t;
	char *conns;

	tls_setup(&t, "tls_client", "right");
	t.relay = fixture_relay_start(
	        &t.fx, (const char *const[]){ t.e_db, t.e_amqp, t.e_ca, t.e_cert, t.e_key,
	                                      "OUTBOX_RELAY_POLL_INTERVAL=200ms", NULL });
	expect_all_delivered(&t);
	/* The broker saw our certificate: only the relay connects with one in these tests. */
	conns = broker_connections();
	cr_assert(strstr(conns, "true\tCN=localhost") != NULL,
	          "no TLS connection with the client certificate's subject:\n%s", conns);
	free(conns);
	fixture_teardown(&t.fx);
}

Test(tls, wrong_ca_refuses_broker_and_delivers_nothing, .timeout = 300)
{
	struct tls_test t;
	char *line;

	tls_setup(&t, "tls_wrongca", "wrong");
	/* Repeated failures of one outage are logged at debug only. */
	t.relay = fixture_relay_start(&t.fx,
	                              (const char *const[]){ t.e_db, t.e_amqp, t.e_ca,
	                                                     "OUTBOX_RELAY_POLL_INTERVAL=200ms",
	                                                     "OUTBOX_LOG_LEVEL=debug", NULL });
	if (!harness_relay_wait_log(t.relay, BROKER_FAILED, 60000))
		harness_relay_dump_log(t.relay);
	line = log_line(t.relay, BROKER_FAILED);
	cr_assert_not_null(line, "no connect failure logged");
	cr_assert(strstr(line, "to=broker") != NULL, "the failure names the broker: %s", line);
	cr_assert(contains_ci(line, "cert") && contains_ci(line, "verif"),
	          "the failure names a certificate verification problem: %s", line);
	cr_assert_eq(harness_relay_log_count(t.relay, "connected\" to=broker"), 0,
	             "the relay connected to a broker it cannot verify");
	free(line);
	/* A second failed attempt shows it keeps refusing rather than falling back. */
	HARNESS_WAIT(harness_relay_log_count(t.relay, BROKER_FAILED) >= 2, 60000);
	cr_assert(harness_relay_log_count(t.relay, BROKER_FAILED) >= 2);
	cr_assert_eq(consumer_received(t.fx.cons), 0,
	             "messages arrived through an unverified "
	             "connection");
	cr_assert_eq(harness_pg_int(t.fx.pg, "SELECT count(*) FROM %s WHERE published_at IS NULL",
	                            t.fx.table),
	             ROWS);
	/* An orderly stop must exit 0 even when the broker was never reached. */
	fixture_teardown(&t.fx);
}

Test(tls, wrong_ca_without_verification_connects, .timeout = 300)
{
	struct tls_test t;

	tls_setup(&t, "tls_noverify", "wrong");
	t.relay = fixture_relay_start(
	        &t.fx, (const char *const[]){ t.e_db, t.e_amqp, t.e_ca,
	                                      "OUTBOX_AMQP_TLS_VERIFY_PEER=false",
	                                      "OUTBOX_RELAY_POLL_INTERVAL=200ms", NULL });
	expect_all_delivered(&t);
	fixture_teardown(&t.fx);
}

Test(tls, database_with_wrong_ca_is_refused, .timeout = 300)
{
	struct tls_test t;
	char e_db[1100], *line;

	tls_setup(&t, "tls_dbwrong", "right");
	snprintf(e_db, sizeof(e_db), "OUTBOX_DATABASE_URL=%s sslmode=verify-full sslrootcert=%s",
	         harness_pg_conninfo(), t.wrong_ca);
	t.relay = fixture_relay_start(
	        &t.fx, (const char *const[]){ e_db, t.e_amqp, t.e_ca,
	                                      "OUTBOX_RELAY_POLL_INTERVAL=200ms", NULL });
	/* The worker's line; the maintenance loop reports the same failure in its own words. */
	if (!harness_relay_wait_log(t.relay, DB_FAILED, 60000))
		harness_relay_dump_log(t.relay);
	line = log_line(t.relay, DB_FAILED);
	cr_assert_not_null(line, "no connect failure logged");
	cr_assert(strstr(line, "to=database") != NULL, "the failure names the database: %s", line);
	cr_assert(contains_ci(line, "certificate") && contains_ci(line, "verif"),
	          "the failure names a certificate verification problem: %s", line);
	free(line);
	cr_assert_eq(consumer_received(t.fx.cons), 0);
	fixture_teardown(&t.fx);
}
