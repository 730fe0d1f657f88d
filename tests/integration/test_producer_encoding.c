/* The producer and inbox libraries send UTF-8: on a connection whose client_encoding converts
 * (LATIN1) they refuse before sending anything, instead of letting the server store "café" as
 * "cafÃ©"; UTF8 works as before. Each test uses its own table. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libpq-fe.h>

#include "store/liboutbox/inbox.h"
#include "store/liboutbox/outbox.h"
#include "tests/support/fixture.h"

#define CAFE "caf\xc3\xa9" /* "café" in UTF-8 */

static struct outbox_message msg(const char *id)
{
	struct outbox_message m = {
		.id = id,
		.exchange = "ex",
		.routing_key = "rk",
		.body = "{\"name\":\"" CAFE "\"}",
		.body_len = strlen("{\"name\":\"" CAFE "\"}"),
	};
	return m;
}

Test(producer_encoding, latin1_connection_is_refused_utf8_works, .timeout = 60)
{
	char err[512] = "";
	struct fixture fx;
	struct outbox_message m = msg(CAFE "-1");
	char *got;

	fixture_setup(&fx, "enc", &(struct fixture_options){ .no_consumer = true });

	cr_assert_eq(PQsetClientEncoding(fx.pg, "LATIN1"), 0, "%s", PQerrorMessage(fx.pg));
	harness_pg_exec(fx.pg, "BEGIN");
	cr_assert_eq(outbox_add(fx.pg, fx.table, &m, err, sizeof(err)), OUTBOX_ERR_INVALID,
	             "a LATIN1 connection must be refused: %s", err);
	cr_assert(strstr(err, "LATIN1") && strstr(err, "UTF8"),
	          "the message names the encoding and what to do: %s", err);
	cr_assert_eq(PQtransactionStatus(fx.pg), PQTRANS_INTRANS, "nothing was sent");
	harness_pg_exec(fx.pg, "ROLLBACK");

	/* The same through SET: libpq learns the new value from the server. */
	harness_pg_exec(fx.pg, "SET client_encoding TO 'LATIN1'");
	cr_assert_eq(outbox_add(fx.pg, fx.table, &m, err, sizeof(err)), OUTBOX_ERR_INVALID, "%s",
	             err);

	harness_pg_exec(fx.pg, "SET client_encoding TO 'UTF8'");
	cr_assert_eq(outbox_add(fx.pg, fx.table, &m, err, sizeof(err)), OUTBOX_ADDED, "%s", err);
	got = harness_pg_string(fx.pg, "SELECT id || ' ' || body FROM %s", fx.table);
	cr_assert_not_null(got);
	cr_assert_str_eq(got, CAFE "-1 {\"name\":\"" CAFE "\"}", "stored as sent");
	free(got);
	cr_assert_eq(harness_pg_int(fx.pg, "SELECT count(*) FROM %s", fx.table), 1,
	             "only the UTF8 add");

	fixture_teardown(&fx);
}

Test(producer_encoding, inbox_refuses_a_converting_connection, .timeout = 60)
{
	char err[512] = "";
	struct fixture fx;

	fixture_setup(&fx, "enc_inbox",
	              &(struct fixture_options){ .inbox = true, .no_consumer = true });
	harness_pg_exec(fx.pg, "SET client_encoding TO 'LATIN1'");
	cr_assert_eq(inbox_claim(fx.pg, fx.table, CAFE, "consumer", 60000, err, sizeof(err)),
	             INBOX_ERR_INVALID, "%s", err);
	cr_assert(strstr(err, "LATIN1"), "%s", err);
	cr_assert_eq(inbox_confirm(fx.pg, fx.table, CAFE, "consumer", err, sizeof(err)),
	             INBOX_ERR_INVALID, "%s", err);
	cr_assert_eq(harness_pg_int(fx.pg, "SELECT count(*) FROM %s", fx.table), 0);

	harness_pg_exec(fx.pg, "SET client_encoding TO 'UTF8'");
	cr_assert_eq(inbox_claim(fx.pg, fx.table, CAFE, "consumer", 60000, err, sizeof(err)),
	             INBOX_CLAIMED, "%s", err);
	cr_assert_eq(harness_pg_int(fx.pg, "SELECT count(*) FROM %s WHERE message_id = '" CAFE "'",
	                            fx.table),
	             1);
	fixture_teardown(&fx);
}
