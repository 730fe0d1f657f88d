/* W3C trace context from producer to consumer: traceparent and tracestate given to
 * outbox_add() or to `outbox-relay enqueue` arrive at a real consumer as AMQP headers of the
 * same names with the exact values; malformed ones are refused by the library and by enqueue
 * before anything is inserted; and the relay's log line for a row it could not publish
 * carries the row's trace_id. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/liboutbox/outbox.h"
#include "tests/support/fixture.h"

#define DELIVERY_TIMEOUT_MS 120000

#define TP       "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
#define TRACE_ID "0af7651916cd43dd8448eb211c80319c"
/* '"' and '\' are tracestate value characters: they must come through JSON intact. */
#define TS "rojo=00f067aa0ba902b7,congo=q\"uote\\d"

#define TP_CLI "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
#define TS_CLI "congo=t61rcWkgMzE"

static struct outbox_message message(const char *id, const char *exchange, const char *routing_key)
{
	struct outbox_message m = {
		.id = id,
		.exchange = exchange,
		.routing_key = routing_key,
		.body = "{\"n\":1}",
		.body_len = 7,
	};
	return m;
}

/* The delivery's header name as a string, or NULL. */
static const char *header(const struct consumer_msg *d, const char *name)
{
	json_t *v = d->headers ? json_object_get(d->headers, name) : NULL;

	return v && json_is_string(v) ? json_string_value(v) : NULL;
}

static void expect_trace_headers(struct consumer *c, const char *id, const char *tp, const char *ts)
{
	const struct consumer_msg *d = consumer_find(c, id);

	cr_assert_not_null(d, "%s was not delivered", id);
	cr_assert_not_null(d->headers, "%s came without headers", id);
	cr_expect_str_eq(header(d, "traceparent") ? header(d, "traceparent") : "(none)", tp,
	                 "%s: traceparent", id);
	cr_expect_str_eq(header(d, "tracestate") ? header(d, "tracestate") : "(none)", ts,
	                 "%s: tracestate", id);
	cr_expect_str_eq(header(d, "tenant") ? header(d, "tenant") : "(none)", "acme",
	                 "%s: the producer's own header", id);
}

Test(trace, outbox_add_and_enqueue_reach_the_consumer, .timeout = 300)
{
	struct fixture t;
	struct harness_output o;
	struct outbox_message m;
	char err[256] = "";
	int rc;

	fixture_setup(&t, "trace_rt", NULL);
	fixture_relay_start(&t, (const char *const[]){ "OUTBOX_RELAY_POLL_INTERVAL=200ms", NULL });

	m = message("trace-lib-1", t.exchange, "trace.lib");
	m.headers_json = "{\"tenant\":\"acme\"}";
	m.traceparent = TP;
	m.tracestate = TS;
	harness_pg_exec(t.pg, "BEGIN");
	rc = outbox_add(t.pg, t.table, &m, err, sizeof(err));
	cr_assert_eq(rc, OUTBOX_ADDED, "outbox_add returned %d: %s", rc, err);
	harness_pg_exec(t.pg, "COMMIT");

	harness_cli(&o, t.table, NULL, "enqueue", "--exchange", t.exchange, "--routing-key",
	            "trace.cli", "--body", "{}", "--id", "trace-cli-1", "--header", "tenant=acme",
	            "--traceparent", TP_CLI, "--tracestate", TS_CLI, (char *)NULL);
	cr_assert_eq(o.status, 0, "enqueue exited %d: %s", o.status, o.err);
	cr_expect(strstr(o.out, "enqueued trace-cli-1"), "%s", o.out);
	harness_output_free(&o);

	fixture_expect_unique(&t, t.cons, 2, DELIVERY_TIMEOUT_MS);
	expect_trace_headers(t.cons, "trace-lib-1", TP, TS);
	expect_trace_headers(t.cons, "trace-cli-1", TP_CLI, TS_CLI);
	fixture_teardown(&t);
}

/* Refused with OUTBOX_ERR_INVALID and an error containing want; the caller's transaction is
 * untouched (nothing was sent). */
static void expect_refused(PGconn *c, const char *table, const struct outbox_message *m,
                           const char *want)
{
	char err[512] = "";
	int rc = outbox_add(c, table, m, err, sizeof(err));

	cr_expect_eq(rc, OUTBOX_ERR_INVALID, "traceparent '%s' tracestate '%s' headers %s: %d %s",
	             m->traceparent ? m->traceparent : "", m->tracestate ? m->tracestate : "",
	             m->headers_json ? m->headers_json : "-", rc, err);
	cr_expect(strstr(err, want), "error '%s', wanted '%s'", err, want);
	cr_expect_null(strchr(err, '\n'), "one line: %s", err);
	cr_expect_eq(PQtransactionStatus(c), PQTRANS_INTRANS, "the transaction is untouched");
}

Test(trace, the_library_refuses_malformed_trace_context, .timeout = 120)
{
	static const struct {
		const char *tp, *ts, *headers, *want;
	} bad[] = {
		/* traceparent: wrong length, uppercase, zeros, version ff */
		{ "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1", NULL, NULL,
		  "traceparent is not valid W3C Trace Context: version 00 is exactly 55 "
		  "characters" },
		{ TP "0", NULL, NULL, "version 00 is exactly 55 characters" },
		{ "00-0af7651916cd43dd8448eb211c80319c", NULL, NULL,
		  "version 00 is exactly 55 characters" },
		{ "", NULL, NULL, "does not start with a version" },
		{ "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01", NULL, NULL,
		  "the trace-id is not 32 lowercase hex digits" },
		{ "00-00000000000000000000000000000000-b7ad6b7169203331-01", NULL, NULL,
		  "the trace-id is all zeros" },
		{ "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", NULL, NULL,
		  "the parent-id is all zeros" },
		{ "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", NULL, NULL,
		  "version ff is forbidden" },
		{ "cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01x", NULL, NULL,
		  "the flags are not followed by the end or a dash" },
		/* tracestate */
		{ TP, "congo", NULL,
		  "tracestate is not valid W3C Trace Context: a list-member is not "
		  "key=value" },
		{ TP, "Congo=1", NULL, "a key holds a character other than" },
		{ TP, "congo=1,congo=2", NULL, "a key appears twice" },
		{ TP, "congo=caf\xc3\xa9", NULL, "a value holds" },
		{ NULL, "congo=1", NULL, "tracestate without traceparent" },
		/* given twice, or malformed in headers_json */
		{ TP, NULL, "{\"traceparent\":\"" TP "\"}", "trace context given twice" },
		{ TP, NULL, "{\"TraceParent\":\"x\"}", "trace context given twice" },
		{ TP, "a=1", "{\"tracestate\":\"b=2\"}", "trace context given twice" },
		{ NULL, NULL, "{\"traceparent\":\"" TP "\",\"Traceparent\":\"" TP "\"}",
		  "holds traceparent or tracestate twice" },
		{ NULL, NULL, "{\"traceparent\":\"00-x\"}",
		  "headers_json: traceparent is not valid W3C Trace Context" },
		{ NULL, NULL, "{\"traceparent\":1}", "headers_json: traceparent must be a string" },
		{ NULL, NULL, "{\"tracestate\":\"a=1\"}", "tracestate without traceparent" },
		{ NULL, NULL, "{\"traceparent\":\"" TP "\",\"tracestate\":\"A=1\"}",
		  "headers_json: tracestate is not valid W3C Trace Context" },
	};
	struct fixture t;
	struct outbox_message m;
	char err[256] = "";

	fixture_setup(&t, "trace_bad", &(struct fixture_options){ .no_consumer = true });
	harness_pg_exec(t.pg, "BEGIN");
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		m = message("trace-bad", "orders", "x");
		m.traceparent = bad[i].tp;
		m.tracestate = bad[i].ts;
		m.headers_json = bad[i].headers;
		expect_refused(t.pg, t.table, &m, bad[i].want);
	}
	/* a good one in the same transaction: nothing above was sent */
	m = message("trace-good", "orders", "x");
	m.traceparent = TP;
	cr_assert_eq(outbox_add(t.pg, t.table, &m, err, sizeof(err)), OUTBOX_ADDED, "%s", err);
	harness_pg_exec(t.pg, "COMMIT");
	cr_expect_eq(harness_pg_int(t.pg, "SELECT count(*) FROM %s", t.table), 1,
	             "only the good row");
	fixture_teardown(&t);
}

/* The headers column the library stored, read back as text. */
static void expect_stored(PGconn *c, const char *table, const char *id, const char *want)
{
	char *got = harness_pg_string(c, "SELECT headers FROM %s WHERE id = '%s'", table, id);

	cr_expect_str_eq(got ? got : "(no row)", want, "%s", id);
	free(got);
}

Test(trace, stored_in_the_headers_object, .timeout = 120)
{
	static const struct {
		const char *id, *tp, *ts, *headers, *want;
	} ok[] = {
		{ "s1", TP, NULL, NULL, "{\"traceparent\":\"" TP "\"}" },
		{ "s2", TP, "congo=1", "{}",
		  "{\"traceparent\":\"" TP "\",\"tracestate\":\"congo=1\"}" },
		{ "s3", TP, "a=\"q\\", " { \"x\" : [1, {\"y\": null}] }\n",
		  " { \"x\" : [1, {\"y\": null}] ,\"traceparent\":\"" TP
		  "\",\"tracestate\":\"a=\\\"q\\\\\"}\n" },
		/* a tracestate without a member is left out, as the spec asks of senders */
		{ "s4", TP, " , ", "{\"a\":1}", "{\"a\":1,\"traceparent\":\"" TP "\"}" },
		/* the trace context in headers_json alone is checked and stored as written */
		{ "s5", NULL, NULL, "{\"traceparent\":\"" TP "\",\"tracestate\":\"b=2\"}",
		  "{\"traceparent\":\"" TP "\",\"tracestate\":\"b=2\"}" },
		/* or split: the traceparent there, the tracestate here */
		{ "s6", NULL, "c=3", "{\"traceparent\":\"" TP "\"}",
		  "{\"traceparent\":\"" TP "\",\"tracestate\":\"c=3\"}" },
		/* a later version, forward compatible */
		{ "s7", "cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-more", NULL, NULL,
		  "{\"traceparent\":\"cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-"
		  "more\"}" },
	};
	struct fixture t;
	struct outbox_message m;
	char err[256] = "";

	fixture_setup(&t, "trace_store", &(struct fixture_options){ .no_consumer = true });
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		int rc;

		m = message(ok[i].id, "orders", "x");
		m.traceparent = ok[i].tp;
		m.tracestate = ok[i].ts;
		m.headers_json = ok[i].headers;
		rc = outbox_add(t.pg, t.table, &m, err, sizeof(err));
		cr_expect_eq(rc, OUTBOX_ADDED, "%s: %d %s", ok[i].id, rc, err);
		expect_stored(t.pg, t.table, ok[i].id, ok[i].want);
	}
	/* what was stored is JSON PostgreSQL reads the same way */
	cr_expect_eq(harness_pg_int(t.pg,
	                            "SELECT count(*) FROM %s WHERE headers::jsonb->>'tracestate'"
	                            " = 'a=\"q\\'",
	                            t.table),
	             1);
	fixture_teardown(&t);
}

Test(trace, enqueue_refuses_malformed_trace_context, .timeout = 120)
{
	static const struct {
		const char *const args[4];
		const char *want;
	} bad[] = {
		{ { "--traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1",
		    NULL },
		  "traceparent is not valid W3C Trace Context: version 00 is exactly 55 "
		  "characters" },
		{ { "--traceparent", "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
		    NULL },
		  "the trace-id is not 32 lowercase hex digits" },
		{ { "--traceparent", "00-00000000000000000000000000000000-b7ad6b7169203331-01",
		    NULL },
		  "the trace-id is all zeros" },
		{ { "--traceparent", "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		    NULL },
		  "version ff is forbidden" },
		{ { "--tracestate", "congo=1", NULL }, "tracestate without traceparent" },
		{ { "--traceparent", TP, "--tracestate", "congo" },
		  "a list-member is not key=value" },
		{ { "--traceparent", TP, "--header", "traceparent=" TP },
		  "trace context given twice" },
	};
	struct fixture t;

	fixture_setup(&t, "trace_cli", &(struct fixture_options){ .no_consumer = true });
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct harness_output o;
		const char *const *a = bad[i].args;

		harness_cli(&o, t.table, NULL, "enqueue", "--exchange", "orders", "--routing-key",
		            "x", "--body", "{}", a[0], a[1], a[2], a[3], (char *)NULL);
		cr_expect_eq(o.status, 2, "%s %s: exit %d, stderr: %s", a[0], a[1], o.status,
		             o.err);
		cr_expect(strstr(o.err, "outbox-relay: enqueue: ") && strstr(o.err, bad[i].want),
		          "%s %s: stderr '%s', wanted '%s'", a[0], a[1], o.err, bad[i].want);
		harness_output_free(&o);
	}
	cr_expect_eq(harness_pg_int(t.pg, "SELECT count(*) FROM %s", t.table), 0,
	             "nothing inserted");
	fixture_teardown(&t);
}

/* The line of the relay's logs that holds every one of the needles (up to three), new
 * string (free()), or NULL. */
static char *log_line(struct fixture *f, const char *a, const char *b, const char *c)
{
	for (size_t i = 0; i < f->n_relays; i++) {
		char *log = harness_relay_log(f->relays[i]);
		char *line = log, *found = NULL;

		while (line && *line && !found) {
			char *end = strchr(line, '\n');
			size_t n = end ? (size_t)(end - line) : strlen(line);
			char *copy = strndup(line, n);

			cr_assert_not_null(copy);
			if (strstr(copy, a) && (!b || strstr(copy, b)) && (!c || strstr(copy, c)))
				found = copy;
			else
				free(copy);
			line = end ? end + 1 : NULL;
		}
		free(log);
		if (found)
			return found;
	}
	return NULL;
}

struct wanted {
	struct fixture *f;
	const char *a, *b;
};

static bool line_logged(void *arg)
{
	const struct wanted *w = arg;
	char *line = log_line(w->f, w->a, w->b, NULL);

	free(line);
	return line != NULL;
}

/* The operator's way from a failed publish to the request that made it: the relay's line for
 * an unroutable row and for a dead row carries trace_id=<the traceparent's 32 hex>. Needs the
 * trace_id field in relay/worker.c's log_failure(). */
Test(trace, failure_log_lines_carry_the_trace_id, .timeout = 300)
{
	struct fixture t;
	struct outbox_message m;
	char err[256] = "", *line;
	const char *retry = "msg=\"could not publish, will retry\"";
	const char *dead = "msg=\"message is dead, an operator must requeue or discard it\"";

	/* the consumer's queue takes "bound.#" only: other keys have no route */
	fixture_setup(&t, "trace_log", &(struct fixture_options){ .binding = "bound.#" });
	m = message("trace-unrouted-1", t.exchange, "lonely.key");
	m.traceparent = TP;
	cr_assert_eq(outbox_add(t.pg, t.table, &m, err, sizeof(err)), OUTBOX_ADDED, "%s", err);
	/* a property the broker can never take: dead at once (outbox_add() refuses it, so it
	 * is written afterwards, as a producer without the library could) */
	m = message("trace-dead-1", t.exchange, "bound.dead");
	m.traceparent = TP_CLI;
	cr_assert_eq(outbox_add(t.pg, t.table, &m, err, sizeof(err)), OUTBOX_ADDED, "%s", err);
	harness_pg_exec(t.pg, "UPDATE %s SET properties = '{\"priority\":99}' WHERE id = '%s'",
	                t.table, "trace-dead-1");
	m = message("trace-none-1", t.exchange, "lonely.other");
	cr_assert_eq(outbox_add(t.pg, t.table, &m, err, sizeof(err)), OUTBOX_ADDED, "%s", err);
	m = message("trace-good-1", t.exchange, "bound.good");
	m.traceparent = TP;
	cr_assert_eq(outbox_add(t.pg, t.table, &m, err, sizeof(err)), OUTBOX_ADDED, "%s", err);

	fixture_relay_start(&t,
	                    (const char *const[]){ "OUTBOX_RELAY_RETRY_BACKOFF_MIN=30s",
	                                           "OUTBOX_RELAY_RETRY_BACKOFF_MAX=60s", NULL });
	fixture_expect_unique(&t, t.cons, 1, DELIVERY_TIMEOUT_MS);
	cr_assert(harness_wait_until(line_logged,
	                             &(struct wanted){ &t, retry, "id=trace-unrouted-1" }, 60000) &&
	                  harness_wait_until(line_logged,
	                                     &(struct wanted){ &t, dead, "id=trace-dead-1" },
	                                     60000) &&
	                  harness_wait_until(line_logged,
	                                     &(struct wanted){ &t, retry, "id=trace-none-1" },
	                                     60000),
	          "the relay did not log the failures");

	line = log_line(&t, retry, "id=trace-unrouted-1", NULL);
	cr_expect(line && strstr(line, "trace_id=" TRACE_ID), "the retry line: %s",
	          line ? line : "(none)");
	free(line);
	line = log_line(&t, dead, "id=trace-dead-1", NULL);
	cr_expect(line && strstr(line, "trace_id=4bf92f3577b34da6a3ce929d0e0e4736"),
	          "the dead line: %s", line ? line : "(none)");
	free(line);
	line = log_line(&t, retry, "id=trace-none-1", NULL);
	cr_expect(line && !strstr(line, "trace_id="), "a row without trace context: %s",
	          line ? line : "(none)");
	free(line);
	fixture_teardown(&t);
}
