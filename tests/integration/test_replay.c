/* `outbox-relay replay` against real PostgreSQL, RabbitMQ and relays: each filter selects the
 * right rows, a dry run changes nothing, more than 10,000 rows need --yes, headers that cannot
 * take the replay header are refused, a consumer gets the same message_id with the replay
 * header, a key's replayed rows go out in seq order before its newer rows (also while a
 * producer's transaction is open, and while the relay publishes the same keys), a key with a
 * row in flight is left out, a purge does not delete a row a replay made pending, and with
 * retention 0 there is nothing to replay. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store.h"
#include "store/operator/replay.h"
#include "tests/support/fixture.h"
#include "tests/support/http_probe.h"
#include "tests/support/ordering_load.h"

/* Generous: the suite runs under ASan on two cores beside other test files. */
#define DELIVERY_TIMEOUT_MS 240000

/* Runs `outbox-relay replay ARGS...` on t's table with env (may be NULL). */
#define REPLAY(o, t, env, ...) \
	harness_cli((o), (t)->table, (env), "replay", __VA_ARGS__, (const char *)NULL)

static const char *const fast_env[] = { "OUTBOX_RELAY_POLL_INTERVAL=200ms", NULL };

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The ids a --dry-run listed (first column of the lines between the header and the summary),
 * sorted and joined by commas; new string. */
static char *listed_ids(const char *out)
{
	char *copy = strdup(out), *line, *save = NULL, *res;
	const char *ids[256];
	size_t n = 0, len = 1;
	bool in_rows = false;

	cr_assert_not_null(copy);
	for (line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		if (strncmp(line, "id\texchange\t", 12) == 0) {
			in_rows = true;
			continue;
		}
		if (!in_rows || strncmp(line, "would replay", 12) == 0) {
			in_rows = false;
			continue;
		}
		cr_assert_lt(n, 256);
		line[strcspn(line, "\t")] = '\0';
		ids[n++] = line;
		len += strlen(line) + 1;
	}
	qsort(ids, n, sizeof(ids[0]), cmp_str);
	res = calloc(1, len);
	cr_assert_not_null(res);
	for (size_t i = 0, at = 0; i < n; i++)
		at += (size_t)snprintf(res + at, len - at, "%s%s", i ? "," : "", ids[i]);
	free(copy);
	return res;
}

/* A dry run with the given arguments must list exactly want (sorted ids, comma-separated). */
#define EXPECT_SELECTED(t, want, ...)                                                             \
	do {                                                                                      \
		struct harness_output o_;                                                         \
		char *got_;                                                                       \
                                                                                                  \
		REPLAY(&o_, (t), NULL, "--dry-run", __VA_ARGS__);                                 \
		cr_assert_eq(o_.status, 0, "replay --dry-run exited %d: %s%s", o_.status, o_.out, \
		             o_.err);                                                             \
		got_ = listed_ids(o_.out);                                                        \
		cr_assert_str_eq(got_, (want), "%s: selected [%s], want [%s]\n%s", #__VA_ARGS__,  \
		                 got_, (want), o_.out);                                           \
		free(got_);                                                                       \
		harness_output_free(&o_);                                                         \
	} while (0)

/* What the table holds, row by row, as one text: to show that something changed nothing. */
static char *table_text(struct fixture *t)
{
	char *s = harness_pg_string(
	        t->pg, "SELECT md5(string_agg(x::text, ',' ORDER BY seq)) FROM %s x", t->table);

	cr_assert_not_null(s);
	return s;
}

static int64_t pending(struct fixture *t, const char *cond)
{
	return harness_pg_int(t->pg, "SELECT count(*) FROM %s WHERE published_at IS NULL AND (%s)",
	                      t->table, cond);
}

/* A row without its lease columns, as text. */
#define UNLEASED                                                                           \
	"concat_ws('|', seq, id, exchange_name, routing_key, body, headers, ordering_key," \
	" created_at, available_at, published_at, attempts, last_error)"

/* Rows of the filter test. */
static void insert_filter_rows(struct fixture *t)
{
	harness_pg_exec(
	        t->pg,
	        "INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key) VALUES"
	        " ('r01', 'ex_a', 'order.created.eu', '{}', 'k1'),"
	        " ('r02', 'ex_a', 'order.paid.eu', '{}', 'k1'),"
	        " ('r03', 'ex_b', 'order.created.us', '{}', 'k2'),"
	        " ('r04', 'ex_b', 'pay.x', '{}', 'k2'),"
	        " ('r05', 'ex_a', 'a_b%%c', '{}', NULL),"
	        " ('r06', 'ex_a', 'axb%%c', '{}', NULL),"
	        " ('r07', 'ex_a', 'Order.created.eu', '{}', NULL),"
	        " ('r08', 'ex_b', 'order.created.eu', '{}', 'k1');"
	        /* published (minutes ago) and created (minutes ago); r08 is still pending */
	        "UPDATE %s u SET published_at = CASE WHEN v.p IS NULL THEN NULL"
	        " ELSE now() - v.p * interval '1 minute' END,"
	        " created_at = now() - v.c * interval '1 minute'"
	        " FROM (VALUES ('r01', 100, 200), ('r02', 80, 190), ('r03', 60, 70), ('r04', 40, "
	        "50),"
	        " ('r05', 20, 30), ('r06', 10, 15), ('r07', 5, 6), ('r08', NULL, 1))"
	        " AS v(id, p, c) WHERE u.id = v.id",
	        t->table, t->table);
}

Test(replay, each_filter_selects_its_rows, .timeout = 120)
{
	struct fixture t;
	struct harness_output o;
	char *at, *at_plain, *before, *after;

	fixture_setup(&t, "rp_filter", &(struct fixture_options){ .no_consumer = true });
	insert_filter_rows(&t);

	/* time ranges on published_at (the default) and on created_at */
	EXPECT_SELECTED(&t, "r02,r03,r04", "--since", "90m", "--until", "30m");
	EXPECT_SELECTED(&t, "r02,r03,r04", "--by", "published", "--since", "90m", "--until", "30m");
	EXPECT_SELECTED(&t, "r03,r04,r05,r06,r07", "--by", "created", "--since", "75m");
	EXPECT_SELECTED(&t, "r01,r02", "--by", "created", "--until", "100m");
	/* a time, with its zone or without (then UTC) */
	at = harness_pg_string(t.pg, "SELECT to_char((now() - interval '50 minutes') AT TIME ZONE"
	                             " 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')");
	at_plain = harness_pg_string(t.pg, "SELECT to_char((now() - interval '50 minutes') AT TIME"
	                                   " ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS')");
	EXPECT_SELECTED(&t, "r04,r05,r06,r07", "--since", at);
	EXPECT_SELECTED(&t, "r04,r05,r06,r07", "--since", at_plain);
	EXPECT_SELECTED(&t, "r01,r02,r03", "--until", at);
	free(at);
	free(at_plain);
	/* exchange, routing key patterns (case-sensitive; '%' and '_' literal), ordering key */
	EXPECT_SELECTED(&t, "r03,r04", "--exchange", "ex_b");
	EXPECT_SELECTED(&t, "r01,r02", "--routing-key", "order.*.eu");
	EXPECT_SELECTED(&t, "r05", "--routing-key", "a_b%c");
	EXPECT_SELECTED(&t, "r04", "--routing-key", "?ay.*");
	EXPECT_SELECTED(&t, "r03", "--routing-key", "order.created.?s");
	EXPECT_SELECTED(&t, "r01,r02,r03,r04,r05,r06,r07", "--routing-key", "*");
	EXPECT_SELECTED(&t, "r03,r04", "--ordering-key", "k2");
	EXPECT_SELECTED(&t, "r01,r02", "--exchange", "ex_a", "--routing-key", "order.*");
	EXPECT_SELECTED(&t, "", "--ordering-key", "k1", "--exchange", "ex_b");

	/* ids: the unpublished and unknown ones are named on stderr */
	REPLAY(&o, &t, NULL, "--dry-run", "--id", "r01", "r05", "r08", "nope");
	cr_assert_eq(o.status, 0, "%s%s", o.out, o.err);
	at = listed_ids(o.out);
	cr_assert_str_eq(at, "r01,r05", "%s", o.out);
	free(at);
	cr_assert_not_null(strstr(o.err, "id 'r08': not published"), "%s", o.err);
	cr_assert_not_null(strstr(o.err, "id 'nope': not in the table"), "%s", o.err);
	harness_output_free(&o);

	/* A real replay touches exactly the selected rows, but for the lease of the key's
	 * unpublished rows (r08 of k1): held by the replay while it commits, then handed back. */
	before = harness_pg_string(t.pg,
	                           "SELECT md5(string_agg(" UNLEASED ", ',' ORDER BY seq))"
	                           " FROM %s x WHERE id NOT IN ('r01', 'r02')",
	                           t.table);
	harness_pg_exec(t.pg, "UPDATE %s SET attempts = 3, last_error = 'old' WHERE id = 'r01'",
	                t.table);
	REPLAY(&o, &t, NULL, "--routing-key", "order.*.eu");
	cr_assert_eq(o.status, 0, "%s%s", o.out, o.err);
	cr_assert_not_null(strstr(o.out, "replayed 2 rows"), "%s", o.out);
	cr_assert_not_null(strstr(o.err, "msg=\"replayed published rows\" rows=2 selected=2"),
	                   "no log line: %s", o.err);
	cr_assert_not_null(strstr(o.err, "routing_key=order.*.eu"), "%s", o.err);
	harness_output_free(&o);
	after = harness_pg_string(t.pg,
	                          "SELECT md5(string_agg(" UNLEASED ", ',' ORDER BY seq))"
	                          " FROM %s x WHERE id NOT IN ('r01', 'r02')",
	                          t.table);
	cr_assert_str_eq(before, after, "a row that was not selected changed");
	cr_assert_eq(harness_pg_int(t.pg,
	                            "SELECT count(*) FROM %s WHERE locked_by IS NOT NULL"
	                            " OR locked_until > now()",
	                            t.table),
	             0, "the replay left a row leased");
	free(before);
	free(after);
	cr_assert_eq(harness_pg_int(t.pg,
	                            "SELECT count(*) FROM %s WHERE id IN ('r01', 'r02')"
	                            " AND published_at IS NULL AND attempts = 0"
	                            " AND last_error IS NULL AND locked_until IS NULL"
	                            " AND available_at <= now()"
	                            " AND headers::jsonb ? '" STORE_REPLAY_HEADER "'",
	                            t.table),
	             2, "the replayed rows are not pending with the header");
	fixture_teardown(&t);
}

Test(replay, usage_errors_exit_2, .timeout = 60)
{
	static const char *const cases[][7] = {
		{ "replay", NULL },
		{ "replay", "--dry-run", NULL },
		{ "replay", "--since", NULL },
		{ "replay", "--since", "not-a-time", NULL },
		{ "replay", "--since", "1h", "--until", "2h", NULL },
		{ "replay", "--by", "sent", "--since", "1h", NULL },
		{ "replay", "--by", "created", "--exchange", "x", NULL },
		{ "replay", "--exchange", "a", "--exchange", "b", NULL },
		{ "replay", "--id", NULL },
		{ "replay", "--bogus", "1", NULL },
		{ "replay", "--exchange", "x", "stray", NULL },
	};
	struct fixture t;

	fixture_setup(&t, "rp_usage", &(struct fixture_options){ .no_consumer = true });
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const char *const *a = cases[i];
		struct harness_output o;
		size_t n = 0;

		while (a[n])
			n++;
		/* The rows end in NULLs: the first one ends the list. */
		harness_cli(&o, t.table, NULL, a[0], a[1], a[2], a[3], a[4], a[5], a[6],
		            (const char *)NULL);
		cr_assert_eq(o.status, 2, "case %zu (%s %s %s) exited %d: %s%s", i,
		             n > 1 ? a[1] : "", n > 2 ? a[2] : "", n > 3 ? a[3] : "", o.status,
		             o.out, o.err);
		cr_assert_not_null(strstr(o.err, "outbox-relay: replay: "), "case %zu: %s", i,
		                   o.err);
		harness_output_free(&o);
	}
	fixture_teardown(&t);
}

/* Digits alone are neither a duration (which unit?) nor a time PostgreSQL should guess at:
 * "20240501" once meant 20,240,501 seconds ago. Refused with exit 2, and the line says what to
 * write instead; a unit or a time still works. */
Test(replay, digits_alone_are_refused_with_the_fix, .timeout = 60)
{
	static const char *const refused[] = { "20240501", "3600", "0", "1714521600" };
	struct fixture t;
	struct harness_output o;

	fixture_setup(&t, "rp_digits", &(struct fixture_options){ .no_consumer = true });
	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
		harness_cli(&o, t.table, NULL, "replay", "--dry-run", "--since", refused[i],
		            (const char *)NULL);
		fprintf(stderr, "replay --since %s: exit %d: %s", refused[i], o.status, o.err);
		cr_assert_eq(o.status, 2, "--since %s exited %d: %s%s", refused[i], o.status, o.out,
		             o.err);
		cr_assert_not_null(strstr(o.err, "digits alone"), "--since %s: %s", refused[i],
		                   o.err);
		cr_assert_not_null(strstr(o.err, "2024-05-01"), "no time example: %s", o.err);
		cr_assert_not_null(strstr(o.err, "7d"), "no duration example: %s", o.err);
		harness_output_free(&o);
		harness_cli(&o, t.table, NULL, "replay", "--dry-run", "--until", refused[i],
		            (const char *)NULL);
		cr_assert_eq(o.status, 2, "--until %s exited %d: %s%s", refused[i], o.status, o.out,
		             o.err);
		harness_output_free(&o);
	}
	/* With a unit, or written as a time, the same digits are fine. */
	static const char *const accepted[] = { "3600s", "2024-05-01", "20240501T000000Z" };
	for (size_t i = 0; i < sizeof(accepted) / sizeof(accepted[0]); i++) {
		harness_cli(&o, t.table, NULL, "replay", "--dry-run", "--since", accepted[i],
		            (const char *)NULL);
		cr_assert_eq(o.status, 0, "--since %s exited %d: %s%s", accepted[i], o.status,
		             o.out, o.err);
		harness_output_free(&o);
	}
	fixture_teardown(&t);
}

Test(replay, dry_run_prints_the_rows_and_changes_nothing, .timeout = 120)
{
	struct fixture t;
	struct harness_output o;
	char *before, *after, *line;

	fixture_setup(&t, "rp_dry", &(struct fixture_options){ .no_consumer = true });
	insert_filter_rows(&t);
	before = table_text(&t);
	REPLAY(&o, &t, NULL, "--dry-run", "--since", "3h");
	cr_assert_eq(o.status, 0, "%s%s", o.out, o.err);
	after = table_text(&t);
	cr_assert_str_eq(before, after, "the dry run changed the table");
	cr_assert_not_null(strstr(o.out, "id\texchange\trouting_key\tordering_key\tpublished_at\n"),
	                   "%s", o.out);
	cr_assert_not_null(strstr(o.out, "would replay 7 rows"), "%s", o.out);
	cr_assert_null(strstr(o.err, "replayed published rows"), "a dry run logged a replay");
	/* Each row's line holds what the table holds, published_at in UTC. */
	line = harness_pg_string(t.pg,
	                         "SELECT id || E'\\t' || exchange_name || E'\\t' || routing_key ||"
	                         " E'\\t' || ordering_key || E'\\t' || to_char(published_at AT TIME"
	                         " ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') || E'\\n'"
	                         " FROM %s WHERE id = 'r03'",
	                         t.table);
	cr_assert_not_null(strstr(o.out, line), "no line '%s' in:\n%s", line, o.out);
	free(line);
	cr_assert_not_null(strstr(o.out, "r05\tex_a\ta_b%c\t-\t"), "%s", o.out);
	harness_output_free(&o);
	free(before);
	free(after);
	fixture_teardown(&t);
}

Test(replay, over_10000_rows_need_yes, .timeout = 300)
{
	struct fixture t;
	struct harness_output o;
	char *before, *after;

	fixture_setup(&t, "rp_yes", &(struct fixture_options){ .no_consumer = true });
	harness_insert_rows(t.pg, t.table, 10001, "ex", "rk.a", "big", NULL, NULL);
	harness_pg_exec(t.pg, "UPDATE %s SET published_at = now()", t.table);
	before = table_text(&t);

	REPLAY(&o, &t, NULL, "--routing-key", "rk.*");
	cr_assert_eq(o.status, 2, "without --yes: exit %d: %s%s", o.status, o.out, o.err);
	cr_assert_not_null(strstr(o.err, "10001 rows match"), "%s", o.err);
	cr_assert_not_null(strstr(o.err, "--yes"), "%s", o.err);
	harness_output_free(&o);
	after = table_text(&t);
	cr_assert_str_eq(before, after, "a refused replay changed the table");

	REPLAY(&o, &t, NULL, "--dry-run", "--routing-key", "rk.*");
	cr_assert_eq(o.status, 0, "%s", o.err);
	cr_assert_not_null(strstr(o.out, "would replay 10001 rows"), "%.300s", o.out);
	cr_assert_not_null(strstr(o.out, "needs --yes"), "%.300s", o.out);
	harness_output_free(&o);

	REPLAY(&o, &t, NULL, "--routing-key", "rk.*", "--yes");
	cr_assert_eq(o.status, 0, "with --yes: exit %d: %s%s", o.status, o.out, o.err);
	cr_assert_not_null(strstr(o.out, "replayed 10001 rows"), "%s", o.out);
	harness_output_free(&o);
	cr_assert_eq(pending(&t, "headers::jsonb ? '" STORE_REPLAY_HEADER "'"), 10001);
	free(before);
	free(after);
	fixture_teardown(&t);
}

Test(replay, headers_that_cannot_take_the_header_are_refused, .timeout = 120)
{
	struct fixture t;
	struct harness_output o;
	char *before, *after;

	fixture_setup(&t, "rp_refuse", &(struct fixture_options){ .no_consumer = true });
	insert_filter_rows(&t);
	/* A row changed by hand after it was published: an array, and text that is not JSON. */
	harness_pg_exec(t.pg,
	                "UPDATE %s SET headers = '[1]' WHERE id = 'r03';"
	                "UPDATE %s SET headers = '{\"a\": ' WHERE id = 'r04'",
	                t.table, t.table);
	before = table_text(&t);
	REPLAY(&o, &t, NULL, "--since", "3h");
	cr_assert_eq(o.status, 1, "exit %d: %s%s", o.status, o.out, o.err);
	cr_assert_not_null(strstr(o.err, "row 'r03': its headers are not a JSON object"), "%s",
	                   o.err);
	cr_assert_not_null(strstr(o.err, "row 'r04': PostgreSQL cannot read its headers as JSON"),
	                   "%s", o.err);
	cr_assert_not_null(strstr(o.err, "Nothing was replayed"), "%s", o.err);
	harness_output_free(&o);
	after = table_text(&t);
	cr_assert_str_eq(before, after, "a refused replay changed the table");
	/* The dry run says so too; rows with good headers replay. */
	REPLAY(&o, &t, NULL, "--dry-run", "--since", "3h");
	cr_assert_eq(o.status, 0, "%s%s", o.out, o.err);
	cr_assert_not_null(strstr(o.out, "2 of them cannot carry the replay header"), "%s", o.out);
	harness_output_free(&o);
	REPLAY(&o, &t, NULL, "--ordering-key", "k1");
	cr_assert_eq(o.status, 0, "%s%s", o.out, o.err);
	cr_assert_not_null(strstr(o.out, "replayed 2 rows"), "%s", o.out);
	harness_output_free(&o);
	free(before);
	free(after);
	fixture_teardown(&t);
}

/* Waits until c received n deliveries in all; fails with the relay logs otherwise. */
static void expect_received(struct fixture *t, struct consumer *c, size_t n)
{
	HARNESS_WAIT(consumer_received(c) >= n, DELIVERY_TIMEOUT_MS);
	if (consumer_received(c) < n) {
		fixture_dump_logs(t);
		cr_assert_fail("the consumer received %zu deliveries, want %zu",
		               consumer_received(c), n);
	}
}

Test(replay, consumer_gets_the_same_message_id_with_the_replay_header, .timeout = 300)
{
	struct fixture t;
	struct harness_output o;
	struct consumer *again;
	char q2[96], stamp[64] = "";
	const char *p;

	fixture_setup(&t, "rp_hdr", NULL);
	harness_pg_exec(t.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body, headers) VALUES"
	                " ('h1', '%s', 'a.b', '{\"n\": 1}', '{\"tenant\": \"acme\", \"n\": 7}'),"
	                " ('h2', '%s', 'a.b', '{\"n\": 2}', '{}'),"
	                " ('h3', '%s', 'a.b', '{\"n\": 3}', '{}')",
	                t.table, t.exchange, t.exchange, t.exchange);
	fixture_relay_start(&t, fast_env);
	fixture_expect_unique(&t, t.cons, 3, DELIVERY_TIMEOUT_MS);
	HARNESS_WAIT(pending(&t, "true") == 0, 30000);
	cr_assert_eq(pending(&t, "true"), 0, "the rows were not marked published");

	/* A second queue bound now sees only what is published from here on. */
	snprintf(q2, sizeof(q2), "%s_again", t.queue);
	again = consumer_start(harness_amqp_url(), q2, t.exchange, NULL, "#");
	REPLAY(&o, &t, NULL, "--id", "h1", "h2");
	cr_assert_eq(o.status, 0, "%s%s", o.out, o.err);
	p = strstr(o.out, "header " STORE_REPLAY_HEADER ": ");
	cr_assert_not_null(p, "%s", o.out);
	sscanf(p + strlen("header " STORE_REPLAY_HEADER ": "), "%63s", stamp);
	harness_output_free(&o);
	/* RFC 3339 in UTC: 2026-01-02T03:04:05.678Z */
	cr_assert_eq(strlen(stamp), 24, "stamp '%s'", stamp);
	cr_assert(stamp[4] == '-' && stamp[10] == 'T' && stamp[19] == '.' && stamp[23] == 'Z',
	          "stamp '%s'", stamp);

	fixture_expect_unique(&t, again, 2, DELIVERY_TIMEOUT_MS);
	for (int i = 1; i <= 2; i++) {
		char id[16];
		const struct consumer_msg *m;
		json_t *h;

		snprintf(id, sizeof(id), "h%d", i);
		m = consumer_find(again, id);
		cr_assert_not_null(m, "%s was not published again", id);
		cr_assert_str_eq(m->message_id, id);
		cr_assert_not_null(m->headers, "%s carries no headers", id);
		h = json_object_get(m->headers, STORE_REPLAY_HEADER);
		cr_assert(json_is_string(h), "%s has no " STORE_REPLAY_HEADER, id);
		cr_assert_str_eq(json_string_value(h), stamp);
		cr_assert_eq(consumer_count(t.cons, id), 2, "%s delivered %zu times", id,
		             consumer_count(t.cons, id));
	}
	/* The producer's headers travel on, with their types. */
	cr_assert_str_eq(
	        json_string_value(json_object_get(consumer_find(again, "h1")->headers, "tenant")),
	        "acme");
	cr_assert_eq(json_integer_value(json_object_get(consumer_find(again, "h1")->headers, "n")),
	             7);
	cr_assert_eq(consumer_count(t.cons, "h3"), 1, "h3 was not selected");
	cr_assert_null(consumer_find(again, "h3"));
	/* Published again and marked again. */
	HARNESS_WAIT(pending(&t, "true") == 0, 30000);
	cr_assert_eq(pending(&t, "true"), 0, "the replayed rows were not marked published");
	consumer_stop(again);
	fixture_teardown(&t);
}

/* The arrival order of key's deliveries at c, as their ids' numbers (the part after the last
 * '-'), into out (room for max); the count. Ids are "<key>-<n>". */
static size_t key_order(struct consumer *c, const char *key, int *out, size_t max)
{
	size_t n = 0, len = strlen(key), total = 0;
	const char **ids = consumer_order(c, &total);

	for (size_t i = 0; i < total; i++) {
		if (strncmp(ids[i], key, len) != 0 || ids[i][len] != '-')
			continue;
		cr_assert_lt(n, max);
		out[n++] = (int)strtol(ids[i] + len + 1, NULL, 10);
	}
	free(ids);
	return n;
}

static void insert_key_rows(struct fixture *t, PGconn *c, const char *key, int from, int to,
                            const char *extra)
{
	for (int i = from; i <= to; i++)
		harness_pg_exec(
		        c,
		        "INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key%s)"
		        " VALUES ('%s-%d', '%s', 'k.%s', '{}', '%s'%s)",
		        t->table, extra ? ", available_at" : "", key, i, t->exchange, key, key,
		        extra ? extra : "");
}

/* The key's arrival order as text ("1 2 3 "). */
static void key_order_text(struct fixture *t, const char *key, char *out, size_t cap)
{
	int got[64];
	size_t m = key_order(t->cons, key, got, 64), len = 0;

	out[0] = '\0';
	for (size_t i = 0; i < m && len < cap; i++)
		len += (size_t)snprintf(out + len, cap - len, "%d ", got[i]);
}

static void expect_key_order(struct fixture *t, const char *key, const char *want)
{
	char got[512];

	key_order_text(t, key, got, sizeof(got));
	cr_assert_str_eq(got, want, "key %s arrived in the order [%s], want [%s]", key, got, want);
}

/* Rows 6..8 are committed and pending (delayed) when rows 1..5 are replayed; they become
 * claimable right after the replay, while the replayed rows wait to go out one by one. */
Test(replay, replayed_rows_go_out_in_order_before_the_keys_newer_rows, .timeout = 300)
{
	struct fixture t;
	struct harness_output o;

	fixture_setup(&t, "rp_order", NULL);
	fixture_relay_start(&t, fast_env);
	insert_key_rows(&t, t.pg, "ka", 1, 5, NULL);
	fixture_expect_unique(&t, t.cons, 5, DELIVERY_TIMEOUT_MS);
	HARNESS_WAIT(pending(&t, "true") == 0, 30000);
	insert_key_rows(&t, t.pg, "ka", 6, 8, ", now() + interval '1 hour'");

	REPLAY(&o, &t, NULL, "--ordering-key", "ka");
	cr_assert_eq(o.status, 0, "%s%s", o.out, o.err);
	cr_assert_not_null(strstr(o.out, "replayed 5 rows"), "%s", o.out);
	harness_output_free(&o);
	harness_pg_exec(t.pg, "UPDATE %s SET available_at = now() WHERE published_at IS NULL",
	                t.table);
	expect_received(&t, t.cons, 13);
	harness_sleep_ms(500); /* nothing more may come */
	expect_key_order(&t, "ka", "1 2 3 4 5 1 2 3 4 5 6 7 8 ");
	fixture_teardown(&t);
}

/* A producer's transaction has inserted rows 6..8 and is still open when the replay starts:
 * the replay waits for it (a row it may commit could otherwise be claimed before the replay
 * commits), and the replayed rows still go out first. */
Test(replay, replay_waits_for_an_open_producer_and_keeps_the_order, .timeout = 300)
{
	struct fixture t;
	struct harness_relay *r;
	PGconn *producer;
	char *log, got[512];

	fixture_setup(&t, "rp_open", NULL);
	fixture_relay_start(&t, fast_env);
	insert_key_rows(&t, t.pg, "kb", 1, 5, NULL);
	fixture_expect_unique(&t, t.cons, 5, DELIVERY_TIMEOUT_MS);
	HARNESS_WAIT(pending(&t, "true") == 0, 30000);

	producer = harness_pg_connect();
	harness_pg_exec(producer, "BEGIN");
	insert_key_rows(&t, producer, "kb", 6, 8, NULL);
	r = harness_relay_start(t.table, NULL,
	                        (const char *const[]){ "replay", "--ordering-key", "kb", NULL });
	/* It waits while the producer's transaction is open. */
	HARNESS_WAIT(harness_pg_int(t.pg,
	                            "SELECT count(*) FROM pg_stat_activity WHERE application_name"
	                            " = 'outbox-relay admin'"
	                            " AND query LIKE '%%virtualtransaction = ANY%%'") > 0,
	             30000);
	harness_sleep_ms(300);
	cr_assert_eq(harness_relay_wait(r, 0), -1, "the replay did not wait for the producer");
	harness_pg_exec(producer, "COMMIT");
	PQfinish(producer);
	cr_assert_eq(harness_relay_wait(r, 60000), 0, "the replay failed");
	log = harness_relay_log(r);
	cr_assert_not_null(strstr(log, "replayed 5 rows"), "%s", log);
	free(log);
	harness_relay_free(r);
	expect_received(&t, t.cons, 13);
	harness_sleep_ms(500);
	/* Rows 6..8 that were published before the replay took its snapshot went out before the
	 * replayed rows (the relay may claim row 6 as soon as the producer commits, and a key
	 * with a row in flight waits); every other one after them. Never a row of 6..8 amid the
	 * replayed ones, nor one of them before a newer one. */
	key_order_text(&t, "kb", got, sizeof(got));
	fprintf(stderr, "replay open producer: key kb arrived [%s]\n", got);
	{
		bool ok = false;

		for (int first = 6; first <= 9 && !ok; first++) {
			char want[128] = "1 2 3 4 5 ";
			size_t len = strlen(want);

			for (int i = 6; i < first; i++)
				len += (size_t)snprintf(want + len, sizeof(want) - len, "%d ", i);
			len += (size_t)snprintf(want + len, sizeof(want) - len, "1 2 3 4 5 ");
			for (int i = first; i <= 8; i++)
				len += (size_t)snprintf(want + len, sizeof(want) - len, "%d ", i);
			ok = strcmp(got, want) == 0;
		}
		cr_assert(ok, "key kb arrived in the order [%s]", got);
	}
	fixture_teardown(&t);
}

/* A key with a row leased (in flight) is left out, and said so; the other keys go. */
Test(replay, a_key_with_a_row_in_flight_is_left_out, .timeout = 120)
{
	static const char *const short_lease[] = { "OUTBOX_RELAY_LEASE=2s",
		                                   "OUTBOX_AMQP_CONFIRM_TIMEOUT=1s", NULL };
	struct fixture t;
	struct harness_output o;

	fixture_setup(&t, "rp_busy", &(struct fixture_options){ .no_consumer = true });
	insert_filter_rows(&t);
	/* r08 (k1, unpublished) is leased by some relay */
	harness_pg_exec(t.pg,
	                "UPDATE %s SET locked_by = 'relay-x#1.1', locked_until = now() +"
	                " interval '1 hour' WHERE id = 'r08'",
	                t.table);
	REPLAY(&o, &t, short_lease, "--since", "3h");
	cr_assert_eq(o.status, 0, "%s%s", o.out, o.err);
	cr_assert_not_null(strstr(o.out, "replayed 5 rows"), "%s", o.out);
	cr_assert_not_null(strstr(o.out, "key 'k1': 2 rows not replayed: row 'r08' is being "
	                                 "published (leased by 'relay-x#1.1')"),
	                   "%s", o.out);
	cr_assert_not_null(strstr(o.err, "skipped_keys=1 skipped_rows=2"), "%s", o.err);
	harness_output_free(&o);
	cr_assert_eq(pending(&t, "ordering_key = 'k1' AND id <> 'r08'"), 0,
	             "a row of the busy key was made pending");
	cr_assert_eq(pending(&t, "id IN ('r03', 'r04', 'r05', 'r06', 'r07')"), 5);

	/* Once the row is no longer in flight, the key replays. */
	harness_pg_exec(t.pg,
	                "UPDATE %s SET published_at = now(), locked_by = NULL,"
	                " locked_until = NULL WHERE id = 'r08'",
	                t.table);
	REPLAY(&o, &t, short_lease, "--ordering-key", "k1");
	cr_assert_eq(o.status, 0, "%s%s", o.out, o.err);
	cr_assert_not_null(strstr(o.out, "replayed 3 rows"), "%s", o.out);
	harness_output_free(&o);
	fixture_teardown(&t);
}

/* The purge deletes published rows past retention by their tuple ids, chosen before it waits
 * for a row lock: a row that a replay (here its statement, in a transaction held open) made
 * pending meanwhile must survive. */
Test(replay, purge_leaves_a_row_the_replay_made_pending, .timeout = 120)
{
	struct fixture t;
	struct harness_relay *purge;
	PGconn *replay;

	fixture_setup(&t, "rp_purge", &(struct fixture_options){ .no_consumer = true });
	insert_filter_rows(&t);
	replay = harness_pg_connect();
	harness_pg_exec(replay, "BEGIN; UPDATE %s SET published_at = NULL WHERE id = 'r01'",
	                t.table);
	purge = harness_relay_start(t.table, NULL,
	                            (const char *const[]){ "purge", "--older-than", "1m", NULL });
	HARNESS_WAIT(harness_pg_int(t.pg,
	                            "SELECT count(*) FROM pg_stat_activity WHERE application_name"
	                            " = 'outbox-relay admin' AND wait_event_type = 'Lock'"
	                            " AND query LIKE '%%DELETE FROM %s %%'",
	                            t.table) > 0,
	             30000);
	cr_assert_eq(harness_relay_wait(purge, 0), -1, "the purge did not wait for the row");
	harness_pg_exec(replay, "COMMIT");
	PQfinish(replay);
	cr_assert_eq(harness_relay_wait(purge, 60000), 0);
	harness_relay_free(purge);
	cr_assert_eq(pending(&t, "id = 'r01'"), 1, "the purge deleted a row made pending");
	cr_assert_eq(harness_pg_int(t.pg, "SELECT count(*) FROM %s", t.table), 2,
	             "the purge did not delete the other published rows");
	fixture_teardown(&t);
}

Test(replay, nothing_to_replay_when_retention_is_0, .timeout = 300)
{
	static const char *const env[] = { "OUTBOX_RELAY_RETENTION=0",
		                           "OUTBOX_RELAY_POLL_INTERVAL=200ms", NULL };
	struct fixture t;
	struct harness_output o;

	fixture_setup(&t, "rp_ret0", NULL);
	harness_insert_rows(t.pg, t.table, 5, t.exchange, "a.b", "gone", NULL, NULL);
	fixture_relay_start(&t, env);
	fixture_expect_unique(&t, t.cons, 5, DELIVERY_TIMEOUT_MS);
	HARNESS_WAIT(harness_pg_int(t.pg, "SELECT count(*) FROM %s", t.table) == 0, 30000);
	REPLAY(&o, &t, env, "--since", "1h");
	cr_assert_eq(o.status, 0, "%s%s", o.out, o.err);
	cr_assert_not_null(strstr(o.out, "nothing to replay"), "%s", o.out);
	cr_assert_not_null(strstr(o.out, "relay.retention is 0"), "%s", o.out);
	cr_assert_not_null(strstr(o.err, "rows=0 selected=0"), "%s", o.err);
	harness_output_free(&o);
	harness_sleep_ms(500);
	cr_assert_eq(consumer_received(t.cons), 5, "something was published again");
	fixture_teardown(&t);
}

/* The value of the sample named exactly series in the relay's /metrics; -1 when absent. */
static double metric(const char *listen, const char *series)
{
	struct probe_reply r = probe_get(listen, "/metrics");
	double v;

	cr_assert_eq(r.status, 200, "/metrics answered %d", r.status);
	v = probe_metric(r.body, series);
	free(r.body);
	return v;
}

/* The relay counts the rows it published again because of a replay (they carry its header)
 * into outbox_relay_replayed_total. */
Test(replay, the_relay_counts_replayed_rows, .timeout = 300)
{
	struct fixture t;
	struct harness_output o;
	char listen[64], e_listen[96];

	fixture_setup(&t, "rp_metric", NULL);
	snprintf(listen, sizeof(listen), "127.0.0.1:%d", probe_free_port());
	snprintf(e_listen, sizeof(e_listen), "OUTBOX_HTTP_LISTEN=%s", listen);
	harness_insert_rows(t.pg, t.table, 3, t.exchange, "a.b", "m", NULL, NULL);
	fixture_relay_start(
	        &t, (const char *const[]){ e_listen, "OUTBOX_RELAY_POLL_INTERVAL=200ms", NULL });
	fixture_expect_unique(&t, t.cons, 3, DELIVERY_TIMEOUT_MS);
	HARNESS_WAIT(pending(&t, "true") == 0, 30000);
	cr_assert_eq(metric(listen, "outbox_relay_replayed_total"), 0);

	REPLAY(&o, &t, NULL, "--id", "m-0000000", "m-0000001");
	cr_assert_eq(o.status, 0, "%s%s", o.out, o.err);
	harness_output_free(&o);
	expect_received(&t, t.cons, 5);
	HARNESS_WAIT(metric(listen, "outbox_relay_replayed_total") == 2, 30000);
	cr_assert_eq(metric(listen, "outbox_relay_replayed_total"), 2);
	HARNESS_WAIT(metric(listen, "outbox_relay_published_total") == 5, 30000);
	cr_assert_eq(metric(listen, "outbox_relay_published_total"), 5);
	fixture_teardown(&t);
}

/* ---- replays racing a relay that publishes the same keys ---- */

#define RACE_KEYS    6
#define RACE_PER_KEY 150

/* Each key's deliveries at c, checked against the table: first deliveries in seq order (the
 * replays never make a row go out before an older one's first delivery), every replayed row
 * (its headers hold the replay header) delivered twice and every other row once, and each
 * key's replayed rows delivered again in seq order, one after another with nothing of the
 * key between them. Returns how many rows were replayed. */
static size_t check_race(struct fixture *t)
{
	size_t total = 0, replayed_rows = 0;
	const char **ids = consumer_order(t->cons, &total);
	PGresult *res;

	for (int k = 0; k < RACE_KEYS; k++) {
		char key[16], sql[512];
		int nrows;
		int64_t *seqs;
		bool *replayed;
		int *seen;
		size_t n = 0;
		int64_t last_first = -1;
		int in_block = -1; /* index into the replayed rows of the next expected replay */
		int nrep = 0, done_block = 0;
		int64_t *rep_seqs;

		snprintf(key, sizeof(key), "k%03d", k);
		snprintf(sql, sizeof(sql),
		         "SELECT id, seq, headers::jsonb ? '" STORE_REPLAY_HEADER "' FROM %s"
		         " WHERE ordering_key = '%s' ORDER BY seq",
		         t->table, key);
		res = PQexec(t->pg, sql);
		cr_assert_eq(PQresultStatus(res), PGRES_TUPLES_OK, "%s", PQerrorMessage(t->pg));
		nrows = PQntuples(res);
		seqs = calloc((size_t)nrows + 1, sizeof(*seqs));
		replayed = calloc((size_t)nrows + 1, sizeof(*replayed));
		seen = calloc((size_t)nrows + 1, sizeof(*seen));
		rep_seqs = calloc((size_t)nrows + 1, sizeof(*rep_seqs));
		cr_assert(seqs && replayed && seen && rep_seqs);
		for (int i = 0; i < nrows; i++) {
			seqs[i] = strtoll(PQgetvalue(res, i, 1), NULL, 10);
			replayed[i] = PQgetvalue(res, i, 2)[0] == 't';
			if (replayed[i])
				rep_seqs[nrep++] = seqs[i];
		}
		replayed_rows += (size_t)nrep;
		for (size_t d = 0; d < total; d++) {
			int row = -1;

			for (int i = 0; i < nrows; i++)
				if (strcmp(ids[d], PQgetvalue(res, i, 0)) == 0)
					row = i;
			if (row < 0)
				continue; /* another key's */
			n++;
			seen[row]++;
			if (seen[row] == 1) {
				cr_assert_gt(seqs[row], last_first,
				             "key %s: %s first delivered after a newer row", key,
				             ids[d]);
				cr_assert_eq(
				        in_block, -1,
				        "key %s: %s first delivered in the middle of the replayed "
				        "rows",
				        key, ids[d]);
				last_first = seqs[row];
				continue;
			}
			cr_assert(replayed[row] && seen[row] == 2,
			          "key %s: %s delivered %d times (replayed: %d)", key, ids[d],
			          seen[row], replayed[row]);
			if (in_block == -1) {
				cr_assert_eq(done_block, 0, "key %s: two blocks of replayed rows",
				             key);
				in_block = 0;
			}
			cr_assert_eq(seqs[row], rep_seqs[in_block],
			             "key %s: %s replayed out of seq order", key, ids[d]);
			if (++in_block == nrep) {
				in_block = -1;
				done_block = 1;
			}
		}
		for (int i = 0; i < nrows; i++)
			cr_assert_eq(seen[i], replayed[i] ? 2 : 1, "key %s: %s delivered %d times",
			             key, PQgetvalue(res, i, 0), seen[i]);
		cr_assert_eq(in_block, -1, "key %s: a replay was not delivered whole", key);
		free(seqs);
		free(replayed);
		free(seen);
		free(rep_seqs);
		PQclear(res);
	}
	free(ids);
	return replayed_rows;
}

/* N in the "replayed N rows" line of a replay's output (its log holds stdout and stderr). */
static size_t said_replayed(const char *log)
{
	for (const char *p = strstr(log, "replayed "); p; p = strstr(p + 1, "replayed ")) {
		const char *d = p + strlen("replayed ");

		if (*d >= '0' && *d <= '9')
			return (size_t)strtoull(d, NULL, 10);
	}
	cr_assert_fail("no 'replayed N rows' in:\n%s", log);
	return 0;
}

Test(replay, replays_racing_the_relay_keep_each_keys_order, .timeout = 600)
{
	static const char *const relay_env[] = { "OUTBOX_RELAY_POLL_INTERVAL=200ms",
		                                 "OUTBOX_RELAY_BATCH_SIZE=20", NULL };
	const size_t n = RACE_KEYS * RACE_PER_KEY;
	struct harness_relay *replays[RACE_KEYS];
	struct ordering_load *load;
	struct fixture t;
	size_t replayed_rows, replayed_said = 0;

	fixture_setup(&t, "rp_race", NULL);
	fixture_relay_start(&t, relay_env);
	fixture_relay_start(&t, relay_env);
	load = ordering_load_start(t.table, t.exchange, RACE_KEYS, RACE_PER_KEY, 4, 20261130u);
	/* Once a third of the rows is out, every key is being published: replay each key's
	 * published rows, all at once (the replays take turns). */
	HARNESS_WAIT(consumer_unique(t.cons) >= n / 3, DELIVERY_TIMEOUT_MS);
	for (int k = 0; k < RACE_KEYS; k++) {
		char key[16];

		snprintf(key, sizeof(key), "k%03d", k);
		replays[k] = harness_relay_start(
		        t.table, NULL,
		        (const char *const[]){ "replay", "--ordering-key", key, NULL });
	}
	for (int k = 0; k < RACE_KEYS; k++) {
		char *log;

		cr_assert_eq(harness_relay_wait(replays[k], 120000), 0, "replay %d failed", k);
		log = harness_relay_log(replays[k]);
		replayed_said += said_replayed(log);
		fprintf(stderr, "replay race, key %d:\n%s", k, log);
		free(log);
		harness_relay_free(replays[k]);
	}
	ordering_load_join(load);
	HARNESS_WAIT(pending(&t, "true") == 0 && consumer_received(t.cons) >= n + replayed_said,
	             DELIVERY_TIMEOUT_MS);
	cr_assert_eq(pending(&t, "true"), 0, "rows left unpublished");
	harness_sleep_ms(1000);
	replayed_rows = check_race(&t);
	cr_assert_eq(replayed_rows, replayed_said, "the replays said %zu rows, the table has %zu",
	             replayed_said, replayed_rows);
	cr_assert_gt(replayed_rows, 0, "nothing was replayed");
	cr_assert_eq(consumer_received(t.cons), n + replayed_rows);
	fixture_teardown(&t);
}
