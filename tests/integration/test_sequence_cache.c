/* The seq sequence must hand out values one at a time (CACHE 1): the ordering watermark takes its
 * last value as the highest seq handed out, and with CACHE n a session holds values it has not
 * used yet, so a later transaction of that session takes a seq below rows already committed and
 * a key's rows go out in seq order, not in the order they were committed. `migrate` sets
 * CACHE 1 (also on an existing table); `run` refuses a cached sequence with exit 2 and one line
 * naming the sequence and the fix, and so do the relay's connections and `replay`; `status`
 * warns. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store.h"
#include "tests/support/fixture.h"

#define EXIT_WAIT_MS 60000

/* The sequence behind t's seq column, schema-qualified (new string). */
static char *seq_name(struct fixture *t)
{
	char *s = harness_pg_string(t->pg, "SELECT pg_get_serial_sequence('%s', 'seq')", t->table);

	cr_assert_not_null(s, "table %s has no seq sequence", t->table);
	return s;
}

static int64_t seq_cache(struct fixture *t, const char *seq)
{
	return harness_pg_int(
	        t->pg, "SELECT seqcache FROM pg_sequence WHERE seqrelid = '%s'::regclass", seq);
}

Test(sequence_cache, migrate_sets_cache_1_on_an_existing_table, .timeout = 120)
{
	struct fixture t;
	struct harness_output o;
	char *seq;

	fixture_setup(&t, "seqc_mig", &(struct fixture_options){ .no_consumer = true });
	seq = seq_name(&t);
	cr_assert_eq(seq_cache(&t, seq), 1, "a new table's sequence caches nothing");
	harness_pg_exec(t.pg, "ALTER SEQUENCE %s CACHE 20", seq);
	harness_cli(&o, t.table, NULL, "migrate", (const char *)NULL);
	fprintf(stderr, "migrate on CACHE 20: exit %d: %s%s", o.status, o.out, o.err);
	cr_assert_eq(o.status, 0, "migrate exited %d: %s%s", o.status, o.out, o.err);
	cr_assert_eq(seq_cache(&t, seq), 1, "migrate left %s with CACHE %lld", seq,
	             (long long)seq_cache(&t, seq));
	/* Sessions keep what they cached before: migrate says so. */
	cr_assert_not_null(strstr(o.out, "CACHE 1"), "migrate did not say what it changed: %s",
	                   o.out);
	harness_output_free(&o);
	/* Up to date now: migrate again changes nothing and says nothing more. */
	harness_cli(&o, t.table, NULL, "migrate", (const char *)NULL);
	cr_assert_eq(o.status, 0, "%s", o.err);
	cr_assert_null(strstr(o.out, "CACHE"), "%s", o.out);
	harness_output_free(&o);
	/* The script for applying by hand sets it too. */
	harness_pg_exec(t.pg, "ALTER SEQUENCE %s CACHE 50", seq);
	harness_cli(&o, t.table, NULL, "schema", (const char *)NULL);
	cr_assert_eq(o.status, 0, "%s", o.err);
	harness_pg_exec(t.pg, "%s", o.out);
	cr_assert_eq(seq_cache(&t, seq), 1, "the schema script left CACHE %lld",
	             (long long)seq_cache(&t, seq));
	harness_output_free(&o);
	free(seq);
	fixture_teardown(&t);
}

/* The defect itself: with CACHE 20, session A caches seq 1..20 and uses 1; session B then
 * commits key k's first row (seq 21); A then commits k's second row with seq 2. Published in
 * seq order, the consumer would get k's rows the other way round. The relay must refuse to
 * start instead, naming the sequence and both fixes, and publish nothing. */
Test(sequence_cache, run_refuses_a_cached_sequence, .timeout = 180)
{
	struct fixture t;
	struct harness_output o;
	struct harness_relay *r;
	PGconn *a, *b;
	char *seq, *log, *line;
	int st;

	fixture_setup(&t, "seqc_run", NULL);
	seq = seq_name(&t);
	harness_pg_exec(t.pg, "ALTER SEQUENCE %s CACHE 20", seq);
	a = harness_pg_connect();
	b = harness_pg_connect();
	harness_pg_exec(a,
	                "INSERT INTO %s (id, exchange_name, routing_key, body) VALUES"
	                " ('u-1', '%s', 'seq.cache', '{}')",
	                t.table, t.exchange);
	harness_pg_exec(b,
	                "INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key) VALUES"
	                " ('k-first', '%s', 'seq.cache', '{}', 'k')",
	                t.table, t.exchange);
	harness_pg_exec(a,
	                "INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key) VALUES"
	                " ('k-second', '%s', 'seq.cache', '{}', 'k')",
	                t.table, t.exchange);
	cr_assert_gt(harness_pg_int(t.pg, "SELECT seq FROM %s WHERE id = 'k-first'", t.table),
	             harness_pg_int(t.pg, "SELECT seq FROM %s WHERE id = 'k-second'", t.table),
	             "the scenario needs the later row to draw the lower seq");

	r = fixture_relay_start(&t, NULL);
	st = harness_relay_wait(r, EXIT_WAIT_MS);
	if (st != 2) {
		/* Show what the consumer got meanwhile: the key's rows out of commit order. */
		size_t n = 0;
		const char **order;

		consumer_wait_unique(t.cons, 3, 30000);
		order = consumer_order(t.cons, &n);
		for (size_t i = 0; i < n; i++)
			fprintf(stderr, "run on CACHE 20: delivery %zu: %s\n", i + 1, order[i]);
		free(order);
		harness_relay_dump_log(r);
	}
	cr_assert_eq(st, 2, "run on a sequence with CACHE 20: exit status %d (-1: still running)",
	             st);
	log = harness_relay_log(r);
	line = strstr(log, "CACHE 1");
	fprintf(stderr, "run on CACHE 20: %s", log);
	cr_assert_not_null(line, "no line with the fix: %s", log);
	cr_assert_not_null(strstr(log, strchr(seq, '.') ? strchr(seq, '.') + 1 : seq),
	                   "the line does not name the sequence %s: %s", seq, log);
	cr_assert_not_null(strstr(log, "outbox-relay migrate"), "%s", log);
	free(log);
	cr_assert_eq(consumer_received(t.cons), 0, "published before refusing");

	/* replay reads the same sequence: it refuses too. */
	harness_cli(&o, t.table, NULL, "replay", "--dry-run", "--since", "1h", (const char *)NULL);
	cr_assert_eq(o.status, 1, "replay exited %d: %s%s", o.status, o.out, o.err);
	cr_assert_not_null(strstr(o.err, "CACHE 1"), "%s", o.err);
	harness_output_free(&o);
	/* status still reads the table, with a warning. */
	harness_cli(&o, t.table, NULL, "status", (const char *)NULL);
	cr_assert_eq(o.status, 0, "status exited %d: %s%s", o.status, o.out, o.err);
	cr_assert_not_null(strstr(o.err, "CACHE 1"), "status did not warn: %s", o.err);
	harness_output_free(&o);

	/* Fixed by migrate (and new producer sessions): the relay starts and relays. */
	PQfinish(a);
	PQfinish(b);
	harness_cli(&o, t.table, NULL, "migrate", (const char *)NULL);
	cr_assert_eq(o.status, 0, "%s", o.err);
	harness_output_free(&o);
	harness_pg_exec(t.pg, "DELETE FROM %s", t.table);
	harness_pg_exec(t.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key) VALUES"
	                " ('after-1', '%s', 'seq.cache', '{}', 'k')",
	                t.table, t.exchange);
	fixture_relay_start(&t, NULL);
	fixture_expect_unique(&t, t.cons, 1, 120000);
	free(seq);
	fixture_teardown(&t);
}

/* A relay loop that connects (a relay started while the database was away, or one reconnecting
 * after a DBA changed the sequence) refuses the table the same way: it never claims from it. */
Test(sequence_cache, a_relay_connection_refuses_a_cached_sequence, .timeout = 120)
{
	struct fixture t;
	struct store_options o;
	struct store *s;
	char *seq;
	int rc;

	fixture_setup(&t, "seqc_conn", &(struct fixture_options){ .no_consumer = true });
	o = fixture_store_options(&t, "seq-cache", false);
	seq = seq_name(&t);
	s = fixture_store_open(&t, &o);
	store_disconnect(s);
	harness_pg_exec(t.pg, "ALTER SEQUENCE %s CACHE 20", seq);
	rc = store_connect(s);
	fprintf(stderr, "connect on CACHE 20: %d: %s\n", rc, store_errmsg(s));
	cr_assert_eq(rc, STORE_ERR_FATAL, "connect returned %d", rc);
	cr_assert_not_null(strstr(store_errmsg(s), "CACHE 1"), "%s", store_errmsg(s));
	cr_assert_not(store_connected(s));
	store_free(s);
	free(seq);
	fixture_teardown(&t);
}
