/* Rows that can never be published, interleaved with good ones: each is dead at once with a
 * last_error naming the column and the problem, the good rows are delivered once each, the
 * relay keeps serving, and the operator commands (dead, requeue, discard) work on them. Also:
 * the purge removes published rows past retention and keeps the dead ones. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "tests/support/fault.h"

#define GOOD         600
#define MAX_ATTEMPTS 5

struct bad {
	const char *id;
	const char *body;
	const char *encoding;
	const char *headers;
	const char *properties;
	const char *error; /* expected at the start of last_error */
};

static const struct bad bad_rows[] = {
	{ "bad-base64", "!!not base64!!", "base64", "{}", "{}", "body: invalid base64 at offset" },
	{ "bad-encoding", "x", "utf-16", "{}", "{}", "body_encoding: unknown encoding 'utf-16'" },
	{ "bad-headers-array", "x", "utf-8", "[1,2]", "{}", "headers: not a JSON object" },
	{ "bad-headers-json", "x", "utf-8", "{\"a\":", "{}", "headers: invalid JSON" },
	{ "bad-prop-name", "x", "utf-8", "{}", "{\"colour\":\"red\"}",
	  "properties: unknown property 'colour'" },
	{ "bad-priority", "x", "utf-8", "{}", "{\"priority\":12}",
	  "properties: priority must be an integer 0-9, got 12" },
	{ "bad-expiration", "x", "utf-8", "{}", "{\"expiration\":\"abc\"}",
	  "properties: expiration must be a string of digits" },
	{ "bad-delivery-mode", "x", "utf-8", "{}", "{\"delivery_mode\":3}",
	  "properties: delivery_mode must be 1 or 2" },
};
#define N_BAD (sizeof(bad_rows) / sizeof(bad_rows[0]))

/* No relay is killed here, so a long lease: one that ran out under a loaded machine could
 * only show up as a false duplicate. */
static const char *const relay_env[] = { "OUTBOX_RELAY_MAX_ATTEMPTS=5", "OUTBOX_RELAY_LEASE=60s",
	                                 NULL };

/* Good rows "good-<i>" with the bad ones spread among them, all in one transaction, so
 * every batch holds both kinds. */
static void insert_mixed(struct fixture *f)
{
	harness_pg_exec(f->pg, "BEGIN");
	for (size_t b = 0; b <= N_BAD; b++) {
		size_t from = b * (GOOD / (N_BAD + 1));
		size_t to = b == N_BAD ? GOOD : from + GOOD / (N_BAD + 1);

		harness_pg_exec(f->pg,
		                "INSERT INTO %s (id, exchange_name, routing_key, body)"
		                " SELECT 'good-' || lpad(g::text, 7, '0'), '%s', 'fault.good',"
		                " '{\"n\":' || g || '}' FROM generate_series(%zu, %zu) g",
		                f->table, f->exchange, from, to - 1);
		if (b == N_BAD)
			break;
		harness_pg_exec(f->pg,
		                "INSERT INTO %s (id, exchange_name, routing_key, body,"
		                " body_encoding, headers, properties)"
		                " VALUES ('%s', '%s', 'fault.bad', '%s', '%s', '%s', '%s')",
		                f->table, bad_rows[b].id, f->exchange, bad_rows[b].body,
		                bad_rows[b].encoding, bad_rows[b].headers, bad_rows[b].properties);
	}
	harness_pg_exec(f->pg, "COMMIT");
}

static int64_t dead_count(struct fixture *f)
{
	return harness_pg_int(f->pg,
	                      "SELECT count(*) FROM %s"
	                      " WHERE %s AND attempts >= %d",
	                      f->table, harness_unpublished(f->table), MAX_ATTEMPTS);
}

Test(fault, malformed_rows_dead_at_once, .timeout = 300)
{
	struct fixture f;
	struct harness_output o;
	json_t *list;
	json_error_t jerr;
	size_t lost, dups;

	fixture_setup(&f, "fault_bad", NULL);
	insert_mixed(&f);
	fault_relay_start(&f, relay_env);
	fixture_expect_unique(&f, f.cons, GOOD, FAULT_DELIVERY_TIMEOUT_MS);
	HARNESS_WAIT(dead_count(&f) == (int64_t)N_BAD, 30000);
	cr_assert_eq(dead_count(&f), (int64_t)N_BAD);
	fault_expect_settled(&f, MAX_ATTEMPTS, 30000);

	for (size_t b = 0; b < N_BAD; b++) {
		const struct bad *x = &bad_rows[b];
		char *err;

		cr_assert_eq(harness_pg_int(f.pg, "SELECT attempts FROM %s WHERE id = '%s'",
		                            f.table, x->id),
		             MAX_ATTEMPTS, "%s: dead at once means attempts = max_attempts", x->id);
		err = harness_pg_string(f.pg, "SELECT last_error FROM %s WHERE id = '%s'", f.table,
		                        x->id);
		cr_assert_not_null(err, "%s: no last_error", x->id);
		cr_assert(strncmp(err, x->error, strlen(x->error)) == 0,
		          "%s: last_error '%s', want it to start with '%s'", x->id, err, x->error);
		free(err);
		cr_assert_eq(consumer_count(f.cons, x->id), 0, "%s was published", x->id);
		cr_assert_eq(fixture_log_count(&f, x->id), 1, "%s: want one log line", x->id);
	}
	cr_assert_eq(fixture_log_count(&f, "level=error"), (int)N_BAD,
	             "want one error line per dead row");
	cr_assert_eq(harness_pg_int(f.pg,
	                            "SELECT count(*) FROM %s WHERE id LIKE 'good-%%'"
	                            " AND attempts > 0",
	                            f.table),
	             0, "good rows were charged for the bad ones");

	/* The relay keeps serving. */
	harness_insert_rows(f.pg, f.table, 50, f.exchange, "fault.later", "later", NULL, NULL);
	fixture_expect_unique(&f, f.cons, GOOD + 50, FAULT_DELIVERY_TIMEOUT_MS);

	/* dead --json lists every dead row with its error. */
	harness_cli(&o, f.table, relay_env, "dead", "--json", NULL);
	cr_assert_eq(o.status, 0, "dead --json exited %d: %s", o.status, o.err);
	list = json_loads(o.out, 0, &jerr);
	cr_assert_not_null(list, "dead --json is not JSON: %s", jerr.text);
	cr_assert(json_is_array(list));
	cr_assert_eq(json_array_size(list), N_BAD);
	for (size_t b = 0; b < N_BAD; b++) {
		bool found = false;
		size_t i;
		json_t *it;

		json_array_foreach(list, i, it)
		{
			const char *id = json_string_value(json_object_get(it, "id"));
			const char *e = json_string_value(json_object_get(it, "last_error"));

			if (id && strcmp(id, bad_rows[b].id) == 0) {
				found = true;
				cr_assert_not_null(e);
				cr_assert(strstr(e, bad_rows[b].error) != NULL, "%s: %s", id, e);
				cr_assert_eq(json_integer_value(json_object_get(it, "attempts")),
				             MAX_ATTEMPTS);
			}
		}
		cr_assert(found, "dead --json does not list %s", bad_rows[b].id);
	}
	json_decref(list);
	harness_output_free(&o);

	/* Fixed by hand, requeued: delivered. */
	harness_pg_exec(f.pg,
	                "UPDATE %s SET properties = '{\"priority\":9}' WHERE id = 'bad-priority'",
	                f.table);
	harness_cli(&o, f.table, relay_env, "requeue", "--id", "bad-priority", NULL);
	cr_assert_eq(o.status, 0, "requeue exited %d: %s", o.status, o.err);
	cr_assert(strstr(o.out, "requeued 1 row") != NULL, "requeue said: %s", o.out);
	harness_output_free(&o);
	fixture_expect_unique(&f, f.cons, GOOD + 51, FAULT_DELIVERY_TIMEOUT_MS);
	cr_assert_eq(consumer_find(f.cons, "bad-priority")->priority, 9);

	/* Discarded: gone. */
	harness_cli(&o, f.table, relay_env, "discard", "--id", "bad-delivery-mode", NULL);
	cr_assert_eq(o.status, 0, "discard exited %d: %s", o.status, o.err);
	cr_assert(strstr(o.out, "discarded 1 row") != NULL, "discard said: %s", o.out);
	harness_output_free(&o);
	cr_assert_eq(harness_pg_int(f.pg, "SELECT count(*) FROM %s WHERE id = 'bad-delivery-mode'",
	                            f.table),
	             0);
	HARNESS_WAIT(dead_count(&f) == (int64_t)N_BAD - 2, 30000);
	cr_assert_eq(dead_count(&f), (int64_t)N_BAD - 2);

	harness_sleep_ms(1000);
	dups = fault_count(&f, "malformed", "good", GOOD, &lost);
	cr_assert_eq(lost, 0, "%zu good rows never arrived", lost);
	cr_assert_eq(dups, 0, "%zu duplicates without any fault that could cause one", dups);
	cr_assert_eq(consumer_count(f.cons, "bad-priority"), 1);
	fixture_teardown(&f);
}

Test(fault, purge_removes_published_keeps_dead, .timeout = 300)
{
	struct fixture f;
	size_t lost, dups;
	const char *const env[] = { "OUTBOX_RELAY_MAX_ATTEMPTS=5", "OUTBOX_RELAY_RETENTION=1s",
		                    "OUTBOX_RELAY_PURGE_INTERVAL=1s", "OUTBOX_RELAY_LEASE=60s",
		                    NULL };

	fixture_setup(&f, "fault_purge", NULL);
	insert_mixed(&f);
	fault_relay_start(&f, env);
	fixture_expect_unique(&f, f.cons, GOOD, FAULT_DELIVERY_TIMEOUT_MS);
	cr_assert(fixture_wait_logged(&f, "purged published rows past retention", 60000),
	          "no purge line");
	HARNESS_WAIT(harness_pg_int(f.pg, "SELECT count(*) FROM %s", f.table) == (int64_t)N_BAD,
	             60000);
	cr_assert_eq(harness_pg_int(f.pg, "SELECT count(*) FROM %s WHERE %s", f.table,
	                            harness_published(f.table)),
	             0, "published rows were not purged");
	cr_assert_eq(dead_count(&f), (int64_t)N_BAD, "the purge must keep dead rows");
	cr_assert_eq(harness_pg_int(f.pg, "SELECT count(*) FROM %s", f.table), (int64_t)N_BAD);
	dups = fault_count(&f, "purge", "good", GOOD, &lost);
	cr_assert_eq(lost, 0);
	cr_assert_eq(dups, 0);
	fixture_teardown(&f);
}
