/* The claim's byte budget (relay.batch_max_bytes) is a limit: a claim stops before the row that
 * would take its bodies past it, and only a row larger than the whole budget goes over it, alone.
 * A claim that admitted one row past the budget could, with a budget near the relay's buffer
 * limit, lease a batch that the relay then could not hold: its rows were neither published nor
 * released, and failed the same way after every lease.
 *
 * A trigger records every lease the relay's claims write (token, body size). With a 64 KiB budget
 * and 40 KiB rows, every claim of more than one row must stay within 64 KiB; a 200 KiB row goes
 * alone and blocks nothing; every row arrives. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "tests/support/fixture.h"

#define DELIVERY_TIMEOUT_MS 120000
#define BUDGET              65536
#define ROWS                12 /* 11 of 40 KiB, one of 200 KiB among them */

static const char *const relay_env[] = { "OUTBOX_RELAY_BATCH_MAX_BYTES=64KiB", NULL };

static void install_lease_log(struct fixture *f)
{
	fixture_drop_later(f,
	                   "DROP TABLE IF EXISTS %s_leases; DROP FUNCTION IF EXISTS %s_lease_fn()",
	                   f->table, f->table);
	harness_pg_exec(f->pg,
	                "CREATE TABLE %s_leases (token text NOT NULL, id text NOT NULL,"
	                " len bigint NOT NULL);"
	                " CREATE FUNCTION %s_lease_fn() RETURNS trigger LANGUAGE plpgsql AS $fn$"
	                " BEGIN"
	                "   IF NEW.locked_by IS NOT NULL"
	                "      AND NEW.locked_by IS DISTINCT FROM OLD.locked_by THEN"
	                "     INSERT INTO %s_leases VALUES (NEW.locked_by, NEW.id,"
	                "       octet_length(NEW.body));"
	                "   END IF;"
	                "   RETURN NULL;"
	                " END $fn$;"
	                " CREATE TRIGGER %s_lease AFTER UPDATE ON %s"
	                " FOR EACH ROW EXECUTE FUNCTION %s_lease_fn();",
	                f->table, f->table, f->table, f->table, f->table, f->table);
}

Test(batch_budget, claims_stop_at_the_byte_budget, .timeout = 600)
{
	struct fixture f;
	size_t dups = 0;
	int64_t over, big_alone, claims;

	fixture_setup(&f, "budget", &(struct fixture_options){ .binding = "budget.#" });
	install_lease_log(&f);
	/* One transaction, so that the first claim sees every row. */
	harness_pg_exec(
	        f.pg,
	        "INSERT INTO %s (id, exchange_name, routing_key, body)"
	        " SELECT 'row-' || lpad(g::text, 2, '0'), '%s', 'budget.rows',"
	        " CASE WHEN g = 5 THEN repeat('b', 200 * 1024) ELSE repeat('x', 40 * 1024) END"
	        " FROM generate_series(0, %d) g ORDER BY g",
	        f.table, f.exchange, ROWS - 1);

	fixture_relay_start(&f, relay_env);
	fixture_expect_unique(&f, f.cons, ROWS, DELIVERY_TIMEOUT_MS);
	HARNESS_WAIT(harness_pg_int(f.pg, "SELECT count(*) FROM %s WHERE published_at IS NULL",
	                            f.table) == 0,
	             DELIVERY_TIMEOUT_MS);
	cr_assert_eq(
	        harness_pg_int(f.pg, "SELECT count(*) FROM %s WHERE published_at IS NULL", f.table),
	        0, "rows were delivered but not marked published");

	claims = harness_pg_int(f.pg, "SELECT count(DISTINCT token) FROM %s_leases", f.table);
	over = harness_pg_int(f.pg,
	                      "SELECT count(*) FROM (SELECT token FROM %s_leases GROUP BY token"
	                      " HAVING count(*) > 1 AND sum(len) > %d) t",
	                      f.table, BUDGET);
	if (over > 0)
		fixture_dump_logs(&f);
	cr_assert_eq(
	        over, 0,
	        "%lld of %lld claims leased more than the %d-byte budget (largest: %lld bytes)",
	        (long long)over, (long long)claims, BUDGET,
	        (long long)harness_pg_int(f.pg,
	                                  "SELECT max(s) FROM (SELECT sum(len) s FROM %s_leases"
	                                  " GROUP BY token) t",
	                                  f.table));
	big_alone =
	        harness_pg_int(f.pg,
	                       "SELECT count(*) FROM %s_leases l WHERE l.id = 'row-05' AND"
	                       " (SELECT count(*) FROM %s_leases m WHERE m.token = l.token) = 1",
	                       f.table, f.table);
	cr_assert_geq(big_alone, 1, "the row larger than the budget did not go alone");

	for (int i = 0; i < ROWS; i++) {
		char id[16];

		snprintf(id, sizeof(id), "row-%02d", i);
		cr_assert_geq(consumer_count(f.cons, id), 1, "%s lost", id);
		dups += consumer_count(f.cons, id) - 1;
	}
	fprintf(stderr, "batch_budget: rows=%d claims=%lld received=%zu lost=0 duplicates=%zu\n",
	        ROWS, (long long)claims, consumer_received(f.cons), dups);

	fixture_teardown(&f);
}
