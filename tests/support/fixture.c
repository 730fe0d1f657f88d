/* fixture.c — the set-up and teardown the integration tests share: own table, exchange, queue
 * and consumer, the test's connection, its relays and store handles, the log and delivery checks
 * over them, and the broker handles of the broker module's tests (see fixture.h). */
#include "tests/support/fixture.h"

#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <amqp.h>

#include "store/liboutbox/inbox.h"

void fixture_setup(struct fixture *fx, const char *prefix, const struct fixture_options *opt)
{
	static const struct fixture_options defaults = { 0 };

	if (opt == NULL)
		opt = &defaults;
	memset(fx, 0, sizeof(*fx));
	harness_unique_name(fx->table, sizeof(fx->table), prefix);
	snprintf(fx->exchange, sizeof(fx->exchange), "%s_ex", fx->table);
	snprintf(fx->queue, sizeof(fx->queue), "%s_q", fx->table);
	fx->pg = harness_pg_connect();
	if (opt->inbox && !opt->no_migrate) {
		char err[256] = "";

		cr_assert_eq(inbox_migrate(fx->pg, fx->table, err, sizeof(err)), INBOX_OK,
		             "inbox_migrate %s: %s", fx->table, err);
	} else if (!opt->no_migrate) {
		harness_migrate(fx->table);
	}
	if (!opt->no_consumer)
		fx->cons = consumer_start(harness_amqp_url(), fx->queue, fx->exchange, "topic",
		                          opt->binding ? opt->binding : "#");
}

void fixture_teardown(struct fixture *fx)
{
	for (size_t i = 0; i < fx->n_relays; i++) {
		char name[32];

		snprintf(name, sizeof(name), "relay %zu", i);
		harness_relay_finish(fx->relays[i], name);
		fx->relays[i] = NULL;
	}
	fx->n_relays = 0;
	consumer_stop(fx->cons);
	fx->cons = NULL;
	/* An empty name: torn down already, or never set up (a .fini after a test that failed
	 * before fixture_setup()). */
	if (fx->table[0] != '\0') {
		/* The server may have been restarted under the old connection. */
		if (PQstatus(fx->pg) != CONNECTION_OK) {
			PQfinish(fx->pg);
			fx->pg = harness_pg_connect_retry(30000);
		}
		if (fx->pg) {
			/* A test that failed inside a transaction left it open: the DROP would go
			 * down with it when the connection closes. */
			if (PQtransactionStatus(fx->pg) != PQTRANS_IDLE)
				PQclear(PQexec(fx->pg, "ROLLBACK"));
			/* The function and the cursor source's position table (migrate makes
			 * it beside the table) are no part of the table: CASCADE leaves them. */
			harness_pg_exec(fx->pg,
			                "DROP TABLE IF EXISTS %s CASCADE;"
			                " DROP TABLE IF EXISTS %s_position;"
			                " DROP FUNCTION IF EXISTS %s_wakeup_notify()",
			                fx->table, fx->table, fx->table);
			if (fx->drop_later[0] != '\0')
				harness_pg_exec(fx->pg, "%s", fx->drop_later);
		}
		fx->table[0] = '\0';
	}
	PQfinish(fx->pg);
	fx->pg = NULL;
}

void fixture_drop_later(struct fixture *fx, const char *fmt, ...)
{
	size_t used = strlen(fx->drop_later), room;
	va_list ap;
	int n;

	if (used > 0) {
		cr_assert_lt(used + 2, sizeof(fx->drop_later), "fixture_drop_later: too much SQL");
		memcpy(fx->drop_later + used, "; ", 3);
		used += 2;
	}
	room = sizeof(fx->drop_later) - used;
	va_start(ap, fmt);
	n = vsnprintf(fx->drop_later + used, room, fmt, ap);
	va_end(ap);
	cr_assert(n >= 0 && (size_t)n < room, "fixture_drop_later: more than %zu bytes of SQL",
	          sizeof(fx->drop_later) - 1);
}

struct harness_relay *fixture_relay_start(struct fixture *fx, const char *const *env)
{
	cr_assert_lt(fx->n_relays, FIXTURE_MAX_RELAYS, "too many relays for one test");
	fx->relays[fx->n_relays] = harness_relay_start(fx->table, env, NULL);
	return fx->relays[fx->n_relays++];
}

int fixture_log_count(struct fixture *fx, const char *needle)
{
	int n = 0;

	for (size_t i = 0; i < fx->n_relays; i++) {
		if (fx->relays[i])
			n += harness_relay_log_count(fx->relays[i], needle);
	}
	return n;
}

bool fixture_logged(struct fixture *fx, const char *needle)
{
	return fixture_log_count(fx, needle) > 0;
}

bool fixture_wait_logged(struct fixture *fx, const char *needle, int64_t timeout_ms)
{
	HARNESS_WAIT(fixture_logged(fx, needle), timeout_ms);
	return fixture_logged(fx, needle);
}

void fixture_dump_logs(struct fixture *fx)
{
	for (size_t i = 0; i < fx->n_relays; i++) {
		if (fx->relays[i])
			harness_relay_dump_log(fx->relays[i]);
	}
}

void fixture_expect_unique(struct fixture *fx, struct consumer *c, size_t n, int64_t timeout_ms)
{
	if (consumer_wait_unique(c, n, timeout_ms))
		return;
	fixture_dump_logs(fx);
	cr_assert_fail("only %zu of %zu messages arrived within %lld ms", consumer_unique(c), n,
	               (long long)timeout_ms);
}

struct store_options fixture_store_options(const struct fixture *fx, const char *relay_id,
                                           bool admin)
{
	struct store_options o = {
		.conninfo = harness_pg_conninfo(),
		.table = fx->table,
		.channel = fx->table,
		.relay_id = relay_id,
		.application_name = "outbox-relay test",
		.lease_ms = 60000,
		.max_attempts = 3,
		.batch_size = 100,
		.admin = admin,
		.wake_fd = -1,
	};

	return o;
}

struct store *fixture_store_open(struct fixture *fx, const struct store_options *o)
{
	struct store_options *kept;
	struct store *s;
	int rc;

	cr_assert_lt(fx->n_stores, FIXTURE_MAX_STORES, "too many stores for one test");
	kept = &fx->store_opts[fx->n_stores++];
	*kept = *o;
	s = store_new(kept);
	cr_assert_not_null(s, "store_new failed");
	rc = store_connect(s);
	cr_assert_eq(rc, 0, "store_connect: %d %s", rc, store_errmsg(s));
	return s;
}

const struct amqp_connection_info *fixture_amqp_info(void)
{
	/* amqp_parse_url() cuts up the string it is given: the copy stays for the pointers. */
	static char url[1024];
	static struct amqp_connection_info ci;
	static bool parsed;
	int n;

	if (parsed)
		return &ci;
	n = snprintf(url, sizeof(url), "%s", harness_amqp_url());
	cr_assert(n > 0 && (size_t)n < sizeof(url), "RELAY_TEST_AMQP is too long");
	cr_assert_eq(amqp_parse_url(url, &ci), AMQP_STATUS_OK, "RELAY_TEST_AMQP does not parse");
	parsed = true;
	return &ci;
}

void fixture_amqp_node_url(char *out, size_t n, int port, const char *password)
{
	const struct amqp_connection_info *ci = fixture_amqp_info();
	int len;

	len = snprintf(out, n, "amqp://%s:%s@127.0.0.1:%d/", ci->user,
	               password != NULL ? password : ci->password, port);
	cr_assert(len > 0 && (size_t)len < n, "node URL buffer too small");
}

struct broker_options fixture_broker_options(const char *url, int64_t confirm_timeout_ms,
                                             const char *connection_name)
{
	struct broker_options o = {
		.url = url,
		.confirm_timeout_ms = confirm_timeout_ms,
		.tls_ca_file = "",
		.tls_cert_file = "",
		.tls_key_file = "",
		.tls_verify_peer = true,
		.connection_name = connection_name,
		.wake_fd = -1,
	};

	return o;
}

struct broker *fixture_broker_new(const struct broker_options *o)
{
	struct broker *b = broker_new(o);

	cr_assert_not_null(b, "broker_new failed");
	return b;
}
