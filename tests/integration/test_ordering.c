/* Ordering keys and delayed delivery end to end through the relay binary: per-key seq order
 * under concurrent producers and several relays, keys held back by a failing or dead head
 * (and released by requeue / discard, or moved on under skip-dead), keyed rows held back by
 * an older open transaction, and available_at honoured. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/fixture.h"
#include "tests/support/ordering_load.h"

/* Generous deadlines: the suite runs under ASan on two cores beside other test files. */
#define DELIVERY_TIMEOUT_MS 240000
#define N_RELAYS            3

static int64_t unpublished(struct fixture *t, const char *cond)
{
	return harness_pg_int(t->pg, "SELECT count(*) FROM %s WHERE published_at IS NULL AND (%s)",
	                      t->table, cond);
}

/* Rows for harness_insert_rows: row i belongs to key i % keys (id "k<NNN>-<i>", routing key
 * "<prefix>.k<NNN>" where prefix is late_prefix for keys below n_late, else "ok"), so the
 * rows of all keys interleave in seq order. */
struct keyed_gen {
	size_t keys, n_late;
	const char *late_prefix;
	const char *bad_properties; /* for the first row of each key below n_bad */
	size_t n_bad;
	char id[48], key[24], rk[48];
};

static void keyed_row(size_t i, struct outbox_row *row, void *arg)
{
	struct keyed_gen *g = arg;
	size_t k = i % g->keys;

	snprintf(g->key, sizeof(g->key), "k%03zu", k);
	snprintf(g->id, sizeof(g->id), "%s-%06zu", g->key, i);
	snprintf(g->rk, sizeof(g->rk), "%s.%s", k < g->n_late ? g->late_prefix : "ok", g->key);
	row->id = g->id;
	row->routing_key = g->rk;
	row->ordering_key = g->key;
	if (i < g->keys && k < g->n_bad)
		row->properties = g->bad_properties;
}

/* ---- 1) 50 keys x 200 rows from 8 overlapping producers, 3 relays ---- */

Test(ordering, concurrent_producers_keep_seq_order_per_key, .timeout = 500)
{
	const size_t keys = 50, per_key = 200, n = keys * per_key;
	struct fixture t;
	struct ordering_load *load;
	int64_t t0;

	fixture_setup(&t, "ord_conc", NULL);
	for (int i = 0; i < N_RELAYS; i++) {
		char id[32];

		snprintf(id, sizeof(id), "OUTBOX_RELAY_ID=ord-%d", i);
		fixture_relay_start(&t,
		                    (const char *const[]){ id, "OUTBOX_RELAY_POLL_INTERVAL=200ms",
		                                           "OUTBOX_RELAY_BATCH_SIZE=50", NULL });
	}
	t0 = harness_now_ms();
	load = ordering_load_start(t.table, t.exchange, keys, per_key, 8, 20240611u);
	ordering_load_join(load);
	fprintf(stderr, "ordering: %zu rows committed by 8 producers in %lld ms\n", n,
	        (long long)(harness_now_ms() - t0));
	/* The workload is only a test if transactions interleaved: rows whose transaction id is
	 * lower than that of a row with a lower seq were inserted while another transaction was
	 * still open. */
	cr_assert_gt(
	        harness_pg_int(t.pg,
	                       "SELECT count(*) FROM (SELECT txid, max(txid::text::bigint) OVER"
	                       " (ORDER BY seq ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)"
	                       " AS m FROM %s) x WHERE txid::text::bigint < m",
	                       t.table),
	        0, "the producers' transactions never interleaved");
	cr_assert_eq(harness_pg_int(t.pg, "SELECT count(*) FROM %s", t.table), (int64_t)n);

	fixture_expect_unique(&t, t.cons, n, DELIVERY_TIMEOUT_MS);
	harness_sleep_ms(1000);
	ordering_check(t.pg, t.table, NULL, &t.cons, 1, false, "ordering concurrent");
	cr_assert_eq(consumer_duplicates(t.cons), 0, "%zu duplicates", consumer_duplicates(t.cons));
	HARNESS_WAIT(unpublished(&t, "true") == 0, 30000);
	cr_assert_eq(unpublished(&t, "true"), 0, "rows left unpublished");
	fixture_teardown(&t);
}

/* ---- 2) keys whose routing fails at first wait; the other keys do not ---- */

Test(ordering, failing_keys_wait_and_other_keys_go_on, .timeout = 300)
{
	const size_t keys = 6, n_late = 2, per_key = 20, n = keys * per_key;
	const size_t n_ok = (keys - n_late) * per_key, n_late_rows = n_late * per_key;
	struct keyed_gen g = { .keys = keys, .n_late = n_late, .late_prefix = "late" };
	struct consumer *late = NULL;
	struct consumer *both[2];
	struct fixture t;
	char late_q[80];
	const char *late_keys = "ordering_key IN ('k000', 'k001')";

	fixture_setup(&t, "ord_fail", &(struct fixture_options){ .binding = "ok.#" });
	harness_insert_rows(t.pg, t.table, n, t.exchange, NULL, NULL, keyed_row, &g);
	fixture_relay_start(&t, (const char *const[]){ "OUTBOX_RELAY_POLL_INTERVAL=200ms",
	                                               "OUTBOX_RELAY_RETRY_BACKOFF_MIN=200ms",
	                                               "OUTBOX_RELAY_RETRY_BACKOFF_MAX=1s", NULL });
	/* The other keys finish while nothing is bound to "late.#". */
	fixture_expect_unique(&t, t.cons, n_ok, DELIVERY_TIMEOUT_MS);
	/* Each late key's head fails again and again, and nothing behind it is even tried. */
	HARNESS_WAIT(harness_pg_int(t.pg, "SELECT count(*) FROM %s WHERE %s AND attempts >= 2",
	                            t.table, late_keys) == (int64_t)n_late,
	             60000);
	cr_assert_eq(harness_pg_int(t.pg, "SELECT count(*) FROM %s WHERE %s AND attempts >= 2",
	                            t.table, late_keys),
	             (int64_t)n_late, "the late keys' heads were not retried");
	cr_assert_eq(harness_pg_int(t.pg, "SELECT count(*) FROM %s WHERE %s AND attempts > 0",
	                            t.table, late_keys),
	             (int64_t)n_late, "a row behind a failing head was tried");
	cr_assert_eq(unpublished(&t, late_keys), (int64_t)n_late_rows,
	             "a row of a late key was published while its head failed");
	{
		char *err = harness_pg_string(
		        t.pg, "SELECT last_error FROM %s WHERE id = 'k000-000000'", t.table);

		cr_assert_not_null(err, "the failing head has no last_error");
		fprintf(stderr, "ordering: failing head's last_error: %s\n", err);
		free(err);
	}
	cr_assert_eq(consumer_unique(t.cons), n_ok);

	/* Bind the late keys: they continue, each in order. */
	snprintf(late_q, sizeof(late_q), "%s_late", t.queue);
	late = consumer_start(harness_amqp_url(), late_q, t.exchange, NULL, "late.#");
	fixture_expect_unique(&t, late, n_late_rows, DELIVERY_TIMEOUT_MS);
	harness_sleep_ms(1000);
	both[0] = t.cons;
	both[1] = late;
	ordering_check(t.pg, t.table, NULL, both, 2, false, "ordering failing keys");
	cr_assert_eq(consumer_duplicates(late), 0);
	cr_assert_eq(consumer_duplicates(t.cons), 0);
	consumer_stop(late);
	fixture_teardown(&t);
}

/* ---- 3) a dead head blocks its key (strict) or is set aside (skip-dead) ---- */

/* Three keys of 5 rows and 5 unkeyed rows; the heads of k000 and k001 can never be published
 * (priority 42), k002 is healthy. */
static void insert_dead_heads(struct fixture *t)
{
	struct keyed_gen g = { .keys = 3,
		               .n_late = 0,
		               .late_prefix = "late",
		               .bad_properties = "{\"priority\":42}",
		               .n_bad = 2 };

	harness_insert_rows(t->pg, t->table, 15, t->exchange, NULL, NULL, keyed_row, &g);
	harness_insert_rows(t->pg, t->table, 5, t->exchange, "ok.unkeyed", "u", NULL, NULL);
}

static json_t *cli_json(struct fixture *t, const char *const *env, const char *a1, const char *a2,
                        const char *a3)
{
	struct harness_output o;
	json_error_t jerr;
	json_t *j;

	harness_cli(&o, t->table, env, a1, a2, a3, (char *)NULL);
	cr_assert_eq(o.status, 0, "%s %s failed (%d): %s", a1, a2 ? a2 : "", o.status, o.err);
	j = json_loads(o.out, 0, &jerr);
	cr_assert_not_null(j, "%s: not JSON (%s): %s", a1, jerr.text, o.out);
	harness_output_free(&o);
	return j;
}

static void expect_cli_ok(struct fixture *t, const char *want_out, const char *a1, const char *a2,
                          const char *a3)
{
	struct harness_output o;

	harness_cli(&o, t->table, NULL, a1, a2, a3, (char *)NULL);
	cr_assert_eq(o.status, 0, "%s failed (%d): %s", a1, o.status, o.err);
	cr_assert_not_null(strstr(o.out, want_out), "%s printed '%s', expected '%s'", a1, o.out,
	                   want_out);
	harness_output_free(&o);
}

Test(ordering, dead_head_blocks_its_key_until_requeue_or_discard, .timeout = 300)
{
	struct fixture t;
	struct harness_output o;
	json_t *j, *it;
	size_t i;

	fixture_setup(&t, "ord_dead", NULL);
	insert_dead_heads(&t);
	fixture_relay_start(&t, (const char *const[]){ "OUTBOX_RELAY_POLL_INTERVAL=200ms", NULL });
	/* k002 and the unkeyed rows are not held back by the dead keys. */
	fixture_expect_unique(&t, t.cons, 10, DELIVERY_TIMEOUT_MS);
	HARNESS_WAIT(
	        harness_pg_int(t.pg, "SELECT count(*) FROM %s WHERE attempts >= 10", t.table) == 2,
	        60000);
	cr_assert_eq(harness_pg_int(t.pg, "SELECT count(*) FROM %s WHERE attempts >= 10", t.table),
	             2, "the malformed heads did not go dead");
	harness_sleep_ms(1500); /* several polls: nothing behind a dead head may move */
	cr_assert_eq(unpublished(&t, "ordering_key IN ('k000', 'k001')"), 10);
	cr_assert_eq(consumer_unique(t.cons), 10);

	/* keys --blocked, text and JSON: both keys, each with its head and the head's error. */
	harness_cli(&o, t.table, NULL, "keys", "--blocked", (char *)NULL);
	cr_assert_eq(o.status, 0, "keys --blocked failed: %s", o.err);
	fprintf(stderr, "ordering: keys --blocked printed:\n%s", o.out);
	cr_assert_not_null(strstr(o.out, "key 'k000'"), "%s", o.out);
	cr_assert_not_null(strstr(o.out, "k000-000000"), "%s", o.out);
	cr_assert_not_null(strstr(o.out, "key 'k001'"), "%s", o.out);
	cr_assert_not_null(strstr(o.out, "k001-000001"), "%s", o.out);
	cr_assert_not_null(strstr(o.out, "priority"), "the head's error is missing: %s", o.out);
	cr_assert_null(strstr(o.out, "k002"), "a healthy key is listed: %s", o.out);
	harness_output_free(&o);

	j = cli_json(&t, NULL, "keys", "--blocked", "--json");
	cr_assert(json_is_array(j));
	cr_assert_eq(json_array_size(j), 2, "blocked keys listed: %zu", json_array_size(j));
	json_array_foreach(j, i, it)
	{
		const char *key = json_string_value(json_object_get(it, "ordering_key"));
		const char *id = json_string_value(json_object_get(it, "id"));
		const char *err = json_string_value(json_object_get(it, "last_error"));

		cr_assert_not_null(key);
		cr_assert_not_null(id);
		cr_assert_str_eq(id, strcmp(key, "k000") == 0 ? "k000-000000" : "k001-000001");
		cr_assert_not_null(err, "no last_error for key %s", key);
		cr_assert_not_null(strstr(err, "priority"), "last_error of %s: %s", key, err);
	}
	json_decref(j);

	j = cli_json(&t, NULL, "status", "--json", NULL);
	cr_assert_eq(json_integer_value(json_object_get(j, "blocked_keys")), 2);
	cr_assert_str_eq(json_string_value(json_object_get(j, "oldest_blocked_key")), "k000");
	cr_assert_eq(json_integer_value(json_object_get(j, "dead")), 2);
	json_decref(j);

	/* Fix the head of k000 and requeue it: the key follows in order. */
	harness_pg_exec(t.pg, "UPDATE %s SET properties = '{}' WHERE id = 'k000-000000'", t.table);
	expect_cli_ok(&t, "requeued 1 row", "requeue", "--id", "k000-000000");
	fixture_expect_unique(&t, t.cons, 15, DELIVERY_TIMEOUT_MS);
	cr_assert_eq(unpublished(&t, "ordering_key = 'k001'"), 5, "k001 moved on by itself");

	/* Discard the head of k001: the rest of it follows in order. */
	expect_cli_ok(&t, "discarded 1 row", "discard", "--id", "k001-000001");
	fixture_expect_unique(&t, t.cons, 19, DELIVERY_TIMEOUT_MS);
	harness_sleep_ms(1000);
	cr_assert_eq(consumer_count(t.cons, "k001-000001"), 0);
	ordering_check(t.pg, t.table, NULL, &t.cons, 1, false, "ordering strict dead head");
	cr_assert_eq(consumer_received(t.cons), 19);

	j = cli_json(&t, NULL, "status", "--json", NULL);
	cr_assert_eq(json_integer_value(json_object_get(j, "blocked_keys")), 0);
	cr_assert(json_is_null(json_object_get(j, "oldest_blocked_key")));
	json_decref(j);
	fixture_teardown(&t);
}

/* True when one log line holds all three needles. */
static bool log_line_has(const struct harness_relay *r, const char *a, const char *b, const char *c)
{
	char *log = harness_relay_log(r);
	bool found = false;

	for (char *line = log; line && *line && !found;) {
		char *end = strchr(line, '\n');

		if (end)
			*end = '\0';
		found = strstr(line, a) && strstr(line, b) && strstr(line, c);
		line = end ? end + 1 : NULL;
	}
	free(log);
	return found;
}

Test(ordering, skip_dead_sets_the_dead_head_aside, .timeout = 300)
{
	const char *const env[] = { "OUTBOX_RELAY_POLL_INTERVAL=200ms",
		                    "OUTBOX_RELAY_ORDERING=skip-dead", NULL };
	struct fixture t;
	json_t *j;

	fixture_setup(&t, "ord_skip", NULL);
	insert_dead_heads(&t);
	fixture_relay_start(&t, env);
	/* Everything but the two dead heads. */
	fixture_expect_unique(&t, t.cons, 18, DELIVERY_TIMEOUT_MS);
	harness_sleep_ms(1000);
	cr_assert_eq(consumer_count(t.cons, "k000-000000"), 0);
	cr_assert_eq(consumer_count(t.cons, "k001-000001"), 0);
	/* The last marks follow the last confirms: wait for them, not for a fixed time. */
	HARNESS_WAIT(unpublished(&t, "true") == 2, 30000);
	cr_assert_eq(unpublished(&t, "true"), 2);
	ordering_check(t.pg, t.table, "published_at IS NOT NULL", &t.cons, 1, false,
	               "ordering skip-dead");
	cr_assert_eq(harness_pg_int(t.pg, "SELECT count(*) FROM %s WHERE attempts >= 10", t.table),
	             2);
	cr_assert(log_line_has(t.relays[0], "level=error", "ordering_key=k000", "id=k000-000000"),
	          "no error line names key k000 and row k000-000000");
	cr_assert(log_line_has(t.relays[0], "level=error", "ordering_key=k001", "id=k001-000001"),
	          "no error line names key k001 and row k001-000001");
	/* Set aside is not blocked. */
	j = cli_json(&t, env, "status", "--json", NULL);
	cr_assert_eq(json_integer_value(json_object_get(j, "blocked_keys")), 0);
	cr_assert_eq(json_integer_value(json_object_get(j, "dead")), 2);
	json_decref(j);
	fixture_teardown(&t);
}

/* ---- a ready key behind hundreds of keys whose heads wait ---- */

/* A claim looks at a few dozen keys at a time: before the relay goes to sleep it must have
 * looked at every key, or a ready key late in key order waits for ever behind keys whose heads
 * are delayed. */
Test(ordering, a_ready_key_is_found_behind_keys_that_wait, .timeout = 300)
{
	const char *const env[] = { "OUTBOX_RELAY_POLL_INTERVAL=200ms",
		                    "OUTBOX_RELAY_BATCH_SIZE=10", NULL };
	struct fixture t;

	fixture_setup(&t, "ord_round", NULL);
	harness_pg_exec(t.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key,"
	                " available_at) SELECT 'd' || g, '%s', 'ok.d', '{}',"
	                " 'k' || lpad(g::text, 4, '0'), now() + interval '1 hour'"
	                " FROM generate_series(1, 500) g",
	                t.table, t.exchange);
	harness_pg_exec(t.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key)"
	                " VALUES ('zz-1', '%s', 'ok.z', '{}', 'zz')",
	                t.table, t.exchange);
	fixture_relay_start(&t, env);
	fixture_expect_unique(&t, t.cons, 1, DELIVERY_TIMEOUT_MS);
	cr_assert_eq(consumer_count(t.cons, "zz-1"), 1);
	/* zz-1 itself may not be marked yet: the mark follows the confirm, and the consumer can
	 * have it first. */
	cr_assert_eq(unpublished(&t, "id <> 'zz-1'"), 500, "the delayed heads stay");
	fixture_teardown(&t);
}

/* ---- an open older transaction holds back keyed rows, never unkeyed ones ---- */

Test(ordering, older_open_transaction_holds_back_keyed_rows_only, .timeout = 300)
{
	struct fixture t;
	PGconn *older, *bystander;

	fixture_setup(&t, "ord_xmin", NULL);
	fixture_relay_start(&t, (const char *const[]){ "OUTBOX_RELAY_POLL_INTERVAL=200ms", NULL });
	/* A transaction that has nothing to do with the outbox (it has an id, as any writer
	 * does) never holds keyed rows back: it cannot add a row with an earlier seq. */
	bystander = harness_pg_connect();
	harness_pg_exec(bystander, "BEGIN");
	cr_assert_gt(harness_pg_int(bystander, "SELECT pg_current_xact_id()::text::bigint"), 0);
	/* The older transaction has inserted into the outbox: it holds an earlier seq and may
	 * still commit more rows, so a keyed row committed after it must wait. */
	older = harness_pg_connect();
	harness_pg_exec(older, "BEGIN");
	harness_pg_exec(older,
	                "INSERT INTO %s (id, exchange_name, routing_key, body)"
	                " VALUES ('o-0', '%s', 'ok.unkeyed', '{}')",
	                t.table, t.exchange);

	harness_pg_exec(t.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key)"
	                " VALUES ('k000-000000', '%s', 'ok.k000', '{}', 'k000'),"
	                " ('u-0', '%s', 'ok.unkeyed', '{}', NULL)",
	                t.table, t.exchange, t.exchange);
	fixture_expect_unique(&t, t.cons, 1, DELIVERY_TIMEOUT_MS);
	cr_assert_not_null(consumer_find(t.cons, "u-0"));
	harness_sleep_ms(1500); /* several polls */
	cr_assert_eq(consumer_count(t.cons, "k000-000000"), 0,
	             "a keyed row went out while an older outbox transaction was open");
	cr_assert_eq(unpublished(&t, "ordering_key = 'k000'"), 1);

	harness_pg_exec(older, "COMMIT");
	fixture_expect_unique(&t, t.cons, 3, DELIVERY_TIMEOUT_MS);
	cr_assert_not_null(consumer_find(t.cons, "k000-000000"),
	                   "the unrelated open transaction did not hold the key back");
	harness_pg_exec(bystander, "COMMIT");
	PQfinish(older);
	PQfinish(bystander);
	fixture_teardown(&t);
}

/* A transaction that took its id early (an earlier write) commits a keyed row with a higher
 * seq while a transaction with a later id still holds the key's lower seq: the committed row
 * must wait, since publishing it now would send seq 2 before seq 1 is even visible. */
Test(ordering, early_txid_with_later_seq_waits_for_the_lower_seq, .timeout = 300)
{
	struct fixture t;
	PGconn *early, *late;

	fixture_setup(&t, "ord_inv", NULL);
	fixture_relay_start(&t, (const char *const[]){ "OUTBOX_RELAY_POLL_INTERVAL=200ms", NULL });
	early = harness_pg_connect();
	late = harness_pg_connect();
	harness_pg_exec(early, "BEGIN");
	cr_assert_gt(harness_pg_int(early, "SELECT pg_current_xact_id()::text::bigint"), 0);
	harness_pg_exec(late, "BEGIN");
	harness_pg_exec(late,
	                "INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key)"
	                " VALUES ('k000-000000', '%s', 'ok.k000', '{}', 'k000')",
	                t.table, t.exchange);
	harness_pg_exec(early,
	                "INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key)"
	                " VALUES ('k000-000001', '%s', 'ok.k000', '{}', 'k000'),"
	                " ('u-0', '%s', 'ok.unkeyed', '{}', NULL)",
	                t.table, t.exchange, t.exchange);
	harness_pg_exec(early, "COMMIT");
	fixture_expect_unique(&t, t.cons, 1, DELIVERY_TIMEOUT_MS);
	harness_sleep_ms(1500); /* several polls */
	cr_assert_eq(consumer_count(t.cons, "k000-000001"), 0,
	             "seq 2 of the key went out while seq 1 was still uncommitted");

	harness_pg_exec(late, "COMMIT");
	cr_assert_lt(harness_pg_int(t.pg, "SELECT seq FROM %s WHERE id = 'k000-000000'", t.table),
	             harness_pg_int(t.pg, "SELECT seq FROM %s WHERE id = 'k000-000001'", t.table));
	fixture_expect_unique(&t, t.cons, 3, DELIVERY_TIMEOUT_MS);
	harness_sleep_ms(500);
	ordering_check(t.pg, t.table, NULL, &t.cons, 1, false, "ordering early txid");
	PQfinish(early);
	PQfinish(late);
	fixture_teardown(&t);
}

/* ---- 5) delayed delivery ---- */

/* How long after its available_at the latest of the rows listed was published, in ms on the
 * database's clock. */
static int64_t delay_after_due(struct fixture *t, const char *ids)
{
	int64_t late = harness_pg_int(t->pg,
	                              "SELECT (extract(epoch FROM max(published_at - available_at))"
	                              " * 1000)::bigint FROM %s WHERE id IN (%s)",
	                              t->table, ids);

	fprintf(stderr, "ordering: delayed rows %s published at most %lld ms after available_at\n",
	        ids, (long long)late);
	return late;
}

Test(ordering, delayed_rows_wait_for_available_at, .timeout = 300)
{
	struct fixture t;
	struct harness_output o;
	int64_t early, late;

	fixture_setup(&t, "ord_delay", NULL);
	fixture_relay_start(&t, (const char *const[]){ "OUTBOX_RELAY_POLL_INTERVAL=500ms", NULL });
	/* A delayed unkeyed row, a delayed keyed head with three rows behind it, and a control
	 * row that is due at once; then one more delayed row through the CLI. */
	harness_pg_exec(t.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key,"
	                " available_at) VALUES"
	                " ('d-sql', '%s', 'ok.delayed', '{}', NULL, now() + interval '3 s'),"
	                " ('k000-000000', '%s', 'ok.k000', '{}', 'k000', now() + interval '3 s'),"
	                " ('k000-000001', '%s', 'ok.k000', '{}', 'k000', now()),"
	                " ('k000-000002', '%s', 'ok.k000', '{}', 'k000', now()),"
	                " ('k000-000003', '%s', 'ok.k000', '{}', 'k000', now()),"
	                " ('now-0', '%s', 'ok.now', '{}', NULL, now())",
	                t.table, t.exchange, t.exchange, t.exchange, t.exchange, t.exchange,
	                t.exchange);
	harness_cli(&o, t.table, NULL, "enqueue", "--exchange", t.exchange, "--routing-key",
	            "ok.cli", "--body", "{}", "--id", "d-cli", "--delay", "3s", (char *)NULL);
	cr_assert_eq(o.status, 0, "enqueue failed: %s", o.err);
	harness_output_free(&o);
	cr_assert_eq(harness_pg_int(t.pg,
	                            "SELECT count(*) FROM %s WHERE id = 'd-cli'"
	                            " AND available_at > created_at + interval '2.5 s'",
	                            t.table),
	             1, "enqueue --delay 3s did not set available_at");

	fixture_expect_unique(&t, t.cons, 1, DELIVERY_TIMEOUT_MS);
	cr_assert_not_null(consumer_find(t.cons, "now-0"));
	/* If the database still says the delayed rows are not due, none of them may be here. */
	early = harness_pg_int(t.pg, "SELECT count(*) FROM %s WHERE available_at > now()", t.table);
	if (early == 3)
		cr_assert_eq(consumer_unique(t.cons), 1,
		             "a delayed row or a row behind a delayed "
		             "head arrived early");

	fixture_expect_unique(&t, t.cons, 7, DELIVERY_TIMEOUT_MS);
	/* On the database's clock: never before available_at, and within a poll interval plus a
	 * margin after it. */
	cr_assert_eq(harness_pg_int(t.pg,
	                            "SELECT count(*) FROM %s WHERE published_at < available_at",
	                            t.table),
	             0, "a row was published before its available_at");
	/* Unkeyed delayed rows wait for nothing but their time and the next poll. A keyed head
	 * also waits for the ordering watermark, which every older transaction in the cluster
	 * holds back; the other test programs run at the same time and hold some for seconds, so
	 * its bound is wider. Either bound is far below what a relay that found delayed rows only
	 * by chance (a new commit, a restart) would take. */
	late = delay_after_due(&t, "'d-sql', 'd-cli'");
	cr_assert_lt(late, 500 + 7500, "a delayed row was published %lld ms after it was due",
	             (long long)late);
	late = delay_after_due(&t, "'k000-000000'");
	cr_assert_lt(late, 500 + 14500,
	             "a delayed keyed head was published %lld ms after it was due",
	             (long long)late);
	/* The rows behind the delayed head waited for it. */
	cr_assert_eq(harness_pg_int(t.pg,
	                            "SELECT count(*) FROM %s WHERE ordering_key = 'k000' AND"
	                            " published_at < (SELECT available_at FROM %s"
	                            " WHERE id = 'k000-000000')",
	                            t.table, t.table),
	             0, "a row behind the delayed head went out before the head was due");
	harness_sleep_ms(500);
	ordering_check(t.pg, t.table, NULL, &t.cons, 1, false, "ordering delayed head");
	fixture_teardown(&t);
}
