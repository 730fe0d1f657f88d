/* An application's program, built outside the tree against an installed liboutbox (check.sh
 * builds it through pkg-config and through find_package(outbox), shared and static): adds a
 * message with trace context inside a transaction, then deduplicates a delivery through the
 * inbox, against a real PostgreSQL, checking every answer and the rows left in the tables.
 *
 * Usage: app CONNINFO OUTBOX_TABLE INBOX_TABLE (the outbox table exists; both are dropped at
 * the end). Exits 0 when everything held, else 1 with one line per failure on stderr. */
#include <outbox/inbox.h>
#include <outbox/outbox.h>

#include <libpq-fe.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRACEPARENT "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
#define TRACESTATE  "congo=t61rcWkgMzE"

static int failures;

#define CHECK(cond, ...)                                  \
	do {                                              \
		if (!(cond)) {                            \
			fprintf(stderr, "app: FAILED: "); \
			fprintf(stderr, __VA_ARGS__);     \
			fputc('\n', stderr);              \
			failures++;                       \
			goto out;                         \
		}                                         \
	} while (0)

/* Runs sql; whether it worked (the error goes to stderr). */
static bool exec(PGconn *c, const char *sql)
{
	PGresult *r = PQexec(c, sql);
	bool ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;

	if (!ok)
		fprintf(stderr, "app: %s: %s", sql, PQresultErrorMessage(r));
	PQclear(r);
	return ok;
}

/* The first value of a one-row query into out (n bytes); whether there was one. */
static bool value(PGconn *c, const char *sql, const char *param, char *out, size_t n)
{
	PGresult *r = PQexecParams(c, sql, 1, NULL, &param, NULL, NULL, 0);
	bool ok = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1;

	if (ok)
		snprintf(out, n, "%s", PQgetvalue(r, 0, 0));
	else
		fprintf(stderr, "app: %s: %s", sql, PQresultErrorMessage(r));
	PQclear(r);
	return ok;
}

int main(int argc, char **argv)
{
	const char *want_headers = "{\"tenant\": \"acme\",\"traceparent\":\"" TRACEPARENT
	                           "\",\"tracestate\":\"" TRACESTATE "\"}";
	struct outbox_message m = {
		.id = "install-1",
		.exchange = "orders",
		.routing_key = "order.paid",
		.body = "{\"order\": 42}",
		.body_len = 13,
		.headers_json = "{\"tenant\": \"acme\"}",
		.traceparent = TRACEPARENT,
		.tracestate = TRACESTATE,
	};
	char err[256] = "", sql[512], got[512];
	const char *outbox, *inbox;
	PGconn *conn = NULL;
	char *ddl = NULL;
	int64_t purged;
	int rc;

	if (argc != 4) {
		fprintf(stderr, "usage: app CONNINFO OUTBOX_TABLE INBOX_TABLE\n");
		return 2;
	}
	outbox = argv[2];
	inbox = argv[3];
	conn = PQconnectdb(argv[1]);
	CHECK(PQstatus(conn) == CONNECTION_OK, "connect: %s", PQerrorMessage(conn));
	CHECK(exec(conn, "SET client_min_messages = warning"), "SET");

	/* Producing: inside the caller's transaction, which stays open. */
	CHECK(exec(conn, "BEGIN"), "BEGIN");
	rc = outbox_add(conn, outbox, &m, err, sizeof(err));
	CHECK(rc == OUTBOX_ADDED, "outbox_add returned %d: %s", rc, err);
	CHECK(PQtransactionStatus(conn) == PQTRANS_INTRANS, "outbox_add ended the transaction");
	CHECK(exec(conn, "COMMIT"), "COMMIT");
	snprintf(sql, sizeof(sql),
	         "SELECT count(*)::text || '|' || min(headers) FROM %s WHERE id = $1", outbox);
	CHECK(value(conn, sql, m.id, got, sizeof(got)), "reading the row");
	snprintf(sql, sizeof(sql), "1|%s", want_headers);
	CHECK(strcmp(got, sql) == 0, "the row reads '%s', not '%s'", got, sql);
	rc = outbox_add(conn, outbox, &m, err, sizeof(err));
	CHECK(rc == OUTBOX_DUPLICATE, "outbox_add again returned %d: %s", rc, err);
	m.id = "install-2";
	m.traceparent = "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01";
	rc = outbox_add(conn, outbox, &m, err, sizeof(err));
	CHECK(rc == OUTBOX_ERR_INVALID && strstr(err, "traceparent"),
	      "an uppercase traceparent: outbox_add returned %d: %s", rc, err);

	/* Consuming: claim, work, confirm, commit; the redelivery is a duplicate. */
	rc = inbox_migrate(conn, inbox, err, sizeof(err));
	CHECK(rc == INBOX_OK, "inbox_migrate returned %d: %s", rc, err);
	CHECK(exec(conn, "BEGIN"), "BEGIN");
	rc = inbox_claim(conn, inbox, "install-1", "app@install", 30000, err, sizeof(err));
	CHECK(rc == INBOX_CLAIMED, "inbox_claim returned %d: %s", rc, err);
	rc = inbox_confirm(conn, inbox, "install-1", "app@install", err, sizeof(err));
	CHECK(rc == INBOX_OK, "inbox_confirm returned %d: %s", rc, err);
	CHECK(exec(conn, "COMMIT"), "COMMIT");
	CHECK(exec(conn, "BEGIN"), "BEGIN");
	rc = inbox_claim(conn, inbox, "install-1", "app@install", 30000, err, sizeof(err));
	CHECK(rc == INBOX_DONE, "inbox_claim of a confirmed message returned %d: %s", rc, err);
	CHECK(exec(conn, "ROLLBACK"), "ROLLBACK");
	snprintf(sql, sizeof(sql),
	         "SELECT (confirmed_at IS NOT NULL)::text FROM %s WHERE message_id = $1", inbox);
	CHECK(value(conn, sql, "install-1", got, sizeof(got)), "reading the inbox row");
	CHECK(strcmp(got, "true") == 0, "the inbox row is not confirmed (%s)", got);
	purged = inbox_purge(conn, inbox, 0, 10, err, sizeof(err));
	CHECK(purged == 1, "inbox_purge returned %lld: %s", (long long)purged, err);
	ddl = inbox_schema_sql(inbox);
	CHECK(ddl != NULL && strstr(ddl, "CREATE TABLE IF NOT EXISTS"), "inbox_schema_sql");
	printf("app: every check held\n");
out:
	free(ddl);
	if (conn && PQstatus(conn) == CONNECTION_OK) {
		if (PQtransactionStatus(conn) != PQTRANS_IDLE)
			PQclear(PQexec(conn, "ROLLBACK"));
		snprintf(sql, sizeof(sql),
		         "DROP TABLE IF EXISTS %s, %s, %s_wakeup;"
		         " DROP FUNCTION IF EXISTS %s_wakeup_notify()",
		         outbox, inbox, outbox, outbox);
		PQclear(PQexec(conn, sql));
	}
	PQfinish(conn);
	return failures ? 1 : 0;
}
