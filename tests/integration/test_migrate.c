/* `outbox-relay migrate` beside a live application: on an up-to-date table it takes no lock,
 * so producers never queue behind it; what it must change it changes under a short lock
 * timeout, failing with a line that names who holds the table; and the wake-up trigger works
 * whatever search_path the producer has. Each test uses its own table. */
#include <criterion/criterion.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libpq-fe.h>

#include "store/liboutbox/inbox.h"
#include "tests/support/fixture.h"

/* Bounds only against a hang: migrate's lock timeout is 5 s. */
#define MIGRATE_EXIT_MS 30000

/* A producer's connection with an insert left uncommitted (it holds ROW EXCLUSIVE on the
 * table until it ends), named so that migrate's message can be checked for it. */
static PGconn *hold_insert(const char *t, const char *app, const char *id)
{
	PGconn *c = harness_pg_connect();

	harness_pg_exec(c, "SET application_name = '%s'", app);
	harness_pg_exec(c, "BEGIN");
	harness_pg_exec(c,
	                "INSERT INTO %s (id, exchange_name, routing_key, body)"
	                " VALUES ('%s', 'ex', 'rk', '{}')",
	                t, id);
	return c;
}

/* One producer's insert in its own transaction, given at most 2 s. 0 or -1 (err says why). */
static int timed_insert(const char *t, const char *id, char *err, size_t errlen)
{
	PGconn *c = harness_pg_connect();
	int rc = harness_pg_try_exec(c, err, errlen,
	                             "SET statement_timeout = '2s';"
	                             " INSERT INTO %s (id, exchange_name, routing_key, body)"
	                             " VALUES ('%s', 'ex', 'rk', '{}')",
	                             t, id);
	PQfinish(c);
	return rc;
}

struct migrate_wait {
	struct harness_relay *m;
	PGconn *c;
};

/* The migrate process has exited, or waits for a lock (what the old migrate did). */
static bool exited_or_waiting(void *arg)
{
	struct migrate_wait *w = arg;

	if (harness_relay_wait(w->m, 0) != -1)
		return true;
	return harness_pg_int(w->c, "SELECT count(*) FROM pg_stat_activity WHERE application_name ="
	                            " 'outbox-relay admin' AND wait_event_type = 'Lock'") > 0;
}

Test(migrate, up_to_date_table_takes_no_lock, .timeout = 120)
{
	char err[512];
	const char *const args[] = { "migrate", NULL };
	struct fixture fx;
	PGconn *holder;
	struct migrate_wait w;
	int failed = 0, status;

	fixture_setup(&fx, "mig_nolock", &(struct fixture_options){ .no_consumer = true });
	holder = hold_insert(fx.table, "mig-holder", "held-1");

	w.c = fx.pg;
	w.m = harness_relay_start(fx.table, NULL, args);
	cr_assert(harness_wait_until(exited_or_waiting, &w, 20000),
	          "migrate neither ended nor waited");
	/* While migrate runs (or ran): five other producers, 2 s each at most. */
	for (int i = 0; i < 5; i++) {
		char id[32];

		snprintf(id, sizeof(id), "p-%d", i);
		if (timed_insert(fx.table, id, err, sizeof(err)) != 0) {
			cr_log_error("producer %d: %s", i, err);
			failed++;
		}
	}
	status = harness_relay_wait(w.m, MIGRATE_EXIT_MS);
	harness_pg_exec(holder, "COMMIT");
	PQfinish(holder);
	if (status != 0)
		harness_relay_dump_log(w.m);
	cr_assert_eq(failed, 0, "%d of 5 producers' inserts timed out behind migrate", failed);
	cr_assert_eq(status, 0, "migrate on an up-to-date table exited %d (-1: still waiting)",
	             status);
	cr_assert_eq(harness_pg_int(fx.pg, "SELECT count(*) FROM %s", fx.table), 6);
	harness_relay_free(w.m);
	fixture_teardown(&fx);
}

/* The table's objects with their oids and files (one rebuilt or replaced: another string). */
static char *object_oids(PGconn *c, const char *t)
{
	return harness_pg_string(c,
	                         "SELECT string_agg(relname || '=' || oid || '/' || relfilenode,"
	                         " ',' ORDER BY relname) FROM pg_class WHERE relname IN ('%s',"
	                         " '%s_deferred_idx', '%s_position', '%s_unkeyed_idx',"
	                         " '%s_key_idx', '%s_published_idx')",
	                         t, t, t, t, t, t);
}

Test(migrate, missing_objects_are_created_and_an_old_function_replaced, .timeout = 120)
{
	struct fixture fx;
	char *src, *cfg;

	fixture_setup(&fx, "mig_fix", &(struct fixture_options){ .no_consumer = true });
	/* What an older version left: no purge index, the pending index (every unpublished row)
	 * instead of the unkeyed one, and its wake-up: a function without a pinned search_path
	 * behind a deferred per-row constraint trigger. */
	harness_pg_exec(fx.pg,
	                "DROP INDEX %s_unkeyed_idx; DROP INDEX %s_published_idx;"
	                " CREATE INDEX %s_pending_idx ON %s (seq) WHERE published_at IS NULL",
	                fx.table, fx.table, fx.table, fx.table);
	/* Nor what the cursor source needs: deferred_at (and with it its index), the position
	 * table. A row the old version published and one it has not stay as they were. */
	harness_pg_exec(fx.pg, "ALTER TABLE %s DROP COLUMN deferred_at; DROP TABLE %s_position",
	                fx.table, fx.table);
	harness_pg_exec(fx.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body, published_at)"
	                " VALUES ('old-done', 'ex', 'rk', '{}', now()), ('old-open', 'ex', 'rk',"
	                " '{}', NULL)",
	                fx.table);
	harness_pg_exec(fx.pg,
	                "DROP TRIGGER %s_wakeup ON %s;"
	                " CREATE OR REPLACE FUNCTION %s_wakeup_notify() RETURNS trigger"
	                " LANGUAGE plpgsql AS $fn$ BEGIN PERFORM pg_notify('%s', ''); RETURN NULL;"
	                " END $fn$;"
	                " CREATE CONSTRAINT TRIGGER %s_wakeup AFTER INSERT ON %s DEFERRABLE"
	                " INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION %s_wakeup_notify()",
	                fx.table, fx.table, fx.table, fx.table, fx.table, fx.table, fx.table);
	harness_migrate(fx.table);

	cr_assert_eq(harness_pg_int(fx.pg,
	                            "SELECT count(*) FROM pg_index i JOIN pg_class ic"
	                            " ON ic.oid = i.indexrelid WHERE i.indrelid = '%s'::regclass"
	                            " AND i.indisvalid AND ic.relname IN ('%s_unkeyed_idx',"
	                            " '%s_key_idx', '%s_published_idx')",
	                            fx.table, fx.table, fx.table, fx.table),
	             3, "all three indexes, valid");
	cr_assert_eq(
	        harness_pg_int(fx.pg,
	                       "SELECT count(*) FROM pg_class WHERE relname = '%s_pending_idx'",
	                       fx.table),
	        0, "the retired index is dropped");
	cr_assert_eq(harness_pg_int(fx.pg,
	                            "SELECT count(*) FROM pg_index i JOIN pg_class ic"
	                            " ON ic.oid = i.indexrelid WHERE i.indrelid = '%s'::regclass"
	                            " AND i.indisvalid AND ic.relname = '%s_deferred_idx'",
	                            fx.table, fx.table),
	             1, "the deferred index, valid");
	cr_assert_eq(harness_pg_int(fx.pg,
	                            "SELECT count(*) FROM %s WHERE deferred_at IS NULL AND"
	                            " ((id = 'old-done' AND published_at IS NOT NULL) OR"
	                            " (id = 'old-open' AND published_at IS NULL))",
	                            fx.table),
	             2,
	             "deferred_at added, NULL in the old rows, which are otherwise as they were");
	cr_assert_eq(harness_pg_int(fx.pg,
	                            "SELECT count(*) FROM pg_attribute WHERE attrelid ="
	                            " '%s_position'::regclass AND attname IN ('stream', 'position',"
	                            " 'leader', 'moved_at')",
	                            fx.table),
	             4, "the position table is created");
	/* A second run finds everything in place: it changes nothing (no object rebuilt). */
	char *before = object_oids(fx.pg, fx.table);
	harness_migrate(fx.table);
	char *after = object_oids(fx.pg, fx.table);
	cr_assert_str_eq(after, before, "the second migrate rebuilt something");
	free(before);
	free(after);
	src = harness_pg_string(
	        fx.pg, "SELECT prosrc FROM pg_proc WHERE proname = '%s_wakeup_notify'", fx.table);
	cfg = harness_pg_string(
	        fx.pg,
	        "SELECT array_to_string(proconfig, ';') FROM pg_proc WHERE proname ="
	        " '%s_wakeup_notify'",
	        fx.table);
	cr_assert_not_null(src);
	cr_assert(strstr(src, "pg_catalog.pg_notify(") != NULL, "%s", src);
	cr_assert(strstr(src, "pg_catalog.pg_try_advisory_lock_shared(") != NULL,
	          "the function tests the wake-up lock: %s", src);
	cr_assert_null(cfg, "the function sets nothing per call (it names its objects): %s", cfg);
	free(src);
	free(cfg);
	cr_assert_eq(harness_pg_int(fx.pg,
	                            "SELECT count(*) FROM pg_trigger WHERE tgrelid = '%s'::regclass"
	                            " AND tgname = '%s_wakeup' AND tgtype = 4"
	                            " AND NOT tgdeferrable AND tgqual IS NULL",
	                            fx.table, fx.table),
	             1, "the deferred row trigger is replaced by the statement trigger");
	fixture_teardown(&fx);
}

/* Runs migrate for t to its end and returns its output (harness_output_free()). */
static void run_migrate(struct harness_output *o, const char *t)
{
	harness_cli(o, t, NULL, "migrate", (const char *)NULL);
}

Test(migrate, a_blocked_change_fails_within_the_lock_timeout, .timeout = 180)
{
	char pid[16];
	struct fixture fx;
	PGconn *holder;
	struct harness_output o;

	fixture_setup(&fx, "mig_blocked", &(struct fixture_options){ .no_consumer = true });

	/* A change in the transaction: the trigger (SHARE ROW EXCLUSIVE on the table). */
	harness_pg_exec(fx.pg, "DROP TRIGGER %s_wakeup ON %s", fx.table, fx.table);
	holder = hold_insert(fx.table, "mig-holder", "held-1");
	snprintf(pid, sizeof(pid), "pid %d", PQbackendPID(holder));
	run_migrate(&o, fx.table);
	cr_assert_eq(o.status, 1, "migrate exited %d (-1: killed after 60 s):\n%s%s", o.status,
	             o.out, o.err);
	cr_assert(strstr(o.err, fx.table) && strstr(o.err, pid) && strstr(o.err, "'mig-holder'") &&
	                  strstr(o.err, "nothing was changed"),
	          "the message names the table, the holder and the outcome: %s", o.err);
	cr_assert_eq(strchr(o.err, '\n'), o.err + strlen(o.err) - 1, "one line: %s", o.err);
	harness_output_free(&o);
	cr_assert_eq(harness_pg_int(fx.pg,
	                            "SELECT count(*) FROM pg_trigger WHERE tgrelid = '%s'::regclass"
	                            " AND tgname = '%s_wakeup'",
	                            fx.table, fx.table),
	             0, "nothing was changed");

	/* An index build (CONCURRENTLY: it waits for the holder's transaction). */
	harness_pg_exec(holder, "COMMIT");
	PQfinish(holder);
	harness_migrate(fx.table);
	harness_pg_exec(fx.pg, "DROP INDEX %s_unkeyed_idx", fx.table);
	holder = hold_insert(fx.table, "mig-holder-2", "held-2");
	snprintf(pid, sizeof(pid), "pid %d", PQbackendPID(holder));
	/* An index build waits for short transactions (it blocks nobody meanwhile); one that has
	 * held the table for the lock timeout already makes it fail at once. */
	harness_sleep_ms(5500);
	run_migrate(&o, fx.table);
	cr_assert_eq(o.status, 1, "migrate exited %d:\n%s%s", o.status, o.out, o.err);
	cr_assert(strstr(o.err, fx.table) && strstr(o.err, pid) &&
	                  strstr(o.err, "'mig-holder-2'") && strstr(o.err, "_unkeyed_idx"),
	          "%s", o.err);
	harness_output_free(&o);
	harness_pg_exec(holder, "COMMIT");
	PQfinish(holder);

	/* Once the holder is gone, the next run finishes the job (an unfinished index build
	 * left an invalid index behind: it is dropped and built again). */
	harness_migrate(fx.table);
	cr_assert_eq(harness_pg_int(fx.pg,
	                            "SELECT count(*) FROM pg_index i JOIN pg_class ic"
	                            " ON ic.oid = i.indexrelid WHERE i.indrelid = '%s'::regclass"
	                            " AND i.indisvalid AND ic.relname = '%s_unkeyed_idx'",
	                            fx.table, fx.table),
	             1);
	cr_assert_eq(harness_pg_int(fx.pg,
	                            "SELECT count(*) FROM pg_index WHERE indrelid = '%s'::regclass"
	                            " AND NOT indisvalid",
	                            fx.table),
	             0, "no invalid index left");
	fixture_teardown(&fx);
}

Test(migrate, two_concurrent_migrates_of_a_new_table, .timeout = 120)
{
	const char *const args[] = { "migrate", NULL };
	struct harness_relay *a, *b;
	struct fixture fx;
	int sa, sb;

	fixture_setup(&fx, "mig_twice",
	              &(struct fixture_options){ .no_migrate = true, .no_consumer = true });
	a = harness_relay_start(fx.table, NULL, args);
	b = harness_relay_start(fx.table, NULL, args);
	sa = harness_relay_wait(a, MIGRATE_EXIT_MS);
	sb = harness_relay_wait(b, MIGRATE_EXIT_MS);
	if (sa != 0)
		harness_relay_dump_log(a);
	if (sb != 0)
		harness_relay_dump_log(b);
	cr_assert(sa == 0 && sb == 0, "exit statuses %d and %d", sa, sb);
	cr_assert_eq(harness_pg_int(fx.pg,
	                            "SELECT count(*) FROM pg_trigger WHERE tgrelid = '%s'::regclass"
	                            " AND NOT tgisinternal",
	                            fx.table),
	             1, "one wake-up trigger");
	harness_relay_free(a);
	harness_relay_free(b);
	fixture_teardown(&fx);
}

/* ---- the wake-up trigger and the producer's search_path ---- */

/* Waits up to ms for a notification on channel; drains what came. */
static bool notified(PGconn *l, const char *channel, int ms)
{
	int64_t end = harness_now_ms() + ms;
	bool got = false;

	while (!got && harness_now_ms() < end) {
		struct pollfd p = { .fd = PQsocket(l), .events = POLLIN };
		PGnotify *n;

		(void)poll(&p, 1, 50);
		cr_assert(PQconsumeInput(l), "%s", PQerrorMessage(l));
		while ((n = PQnotifies(l)) != NULL) {
			if (strcmp(n->relname, channel) == 0)
				got = true;
			PQfreemem(n);
		}
	}
	return got;
}

/* A producer with search_path set by path_sql inserts into public.<t> and commits; while the
 * listener holds the wake-up lock (as a relay does before it sleeps) it is notified. */
static void produce_with_path(PGconn *listener, const char *t, const char *path_sql, const char *id)
{
	PGconn *p = harness_pg_connect();
	char err[512];

	harness_pg_exec(p, "%s", path_sql);
	harness_pg_exec(listener,
	                "SELECT pg_advisory_lock(1869968482, 'public.%s'::regclass::oid::integer)",
	                t);
	harness_pg_exec(p, "BEGIN");
	harness_pg_exec(p,
	                "INSERT INTO public.%s (id, exchange_name, routing_key, body)"
	                " VALUES ('%s', 'ex', 'rk', '{}')",
	                t, id);
	cr_assert_eq(harness_pg_try_exec(p, err, sizeof(err), "COMMIT"), 0,
	             "the producer's commit failed (%s): %s", path_sql, err);
	PQfinish(p);
	cr_assert(notified(listener, t, 15000), "lock held, no notification (%s)", path_sql);
	harness_pg_exec(listener, "SELECT pg_advisory_unlock_all()");
	cr_assert_eq(
	        harness_pg_int(listener, "SELECT count(*) FROM public.%s WHERE id = '%s'", t, id),
	        1);
}

Test(migrate, wakeup_works_under_any_producer_search_path, .timeout = 120)
{
	char hostile[80];
	struct fixture fx;

	fixture_setup(&fx, "mig_path", &(struct fixture_options){ .no_consumer = true });
	snprintf(hostile, sizeof(hostile), "%s_hostile", fx.table);
	harness_pg_exec(fx.pg, "LISTEN \"%s\"", fx.table);

	produce_with_path(fx.pg, fx.table, "SET search_path = ''", "empty-path");

	/* A schema ahead of pg_catalog on the path with a pg_notify of its own that does nothing,
	 * a lock test that always succeeds (nobody waiting, so no notification) and an int4 that
	 * fails every cast: a function that followed the producer's path would stay silent, or
	 * fail the producer's INSERT. */
	harness_pg_exec(fx.pg,
	                "CREATE SCHEMA %s; CREATE FUNCTION %s.pg_notify(text, text) RETURNS void"
	                " LANGUAGE sql AS 'SELECT NULL::void';"
	                " CREATE FUNCTION %s.pg_try_advisory_lock_shared(integer, integer)"
	                " RETURNS boolean LANGUAGE sql AS 'SELECT true';"
	                " CREATE DOMAIN %s.int4 AS integer CHECK (VALUE IS NULL)",
	                hostile, hostile, hostile, hostile);
	produce_with_path(fx.pg, fx.table, "SET search_path = ''", "empty-path-2");
	char path[160];
	snprintf(path, sizeof(path), "SET search_path = %s, pg_catalog, public", hostile);
	produce_with_path(fx.pg, fx.table, path, "hostile-path");

	harness_pg_exec(fx.pg, "DROP SCHEMA %s CASCADE", hostile);
	fixture_teardown(&fx);
}

/* The inbox's migrate, which every consumer runs at start, reads the catalog first too. */
Test(migrate, inbox_migrate_on_an_up_to_date_table_takes_no_lock, .timeout = 60)
{
	char err[512] = "";
	struct fixture fx;
	PGconn *holder;

	/* The first inbox_migrate() makes the table. */
	fixture_setup(&fx, "mig_inbox",
	              &(struct fixture_options){ .inbox = true, .no_consumer = true });
	holder = harness_pg_connect();
	harness_pg_exec(holder, "BEGIN");
	harness_pg_exec(holder, "INSERT INTO %s (message_id) VALUES ('held')", fx.table);
	/* Bounded: the old migrate waited for a SHARE lock behind the holder. */
	harness_pg_exec(fx.pg, "SET statement_timeout = '3s'");
	cr_assert_eq(inbox_migrate(fx.pg, fx.table, err, sizeof(err)), INBOX_OK,
	             "an up-to-date inbox waited for a lock: %s", err);
	harness_pg_exec(holder, "COMMIT");
	PQfinish(holder);
	harness_pg_exec(fx.pg, "RESET statement_timeout");
	fixture_teardown(&fx);
}

/* A table the relay cannot use is refused before anything is changed, with one line naming
 * the column: one that lacks a column migrate cannot add, and one with a column of the wrong
 * type behind a column migrate could add (the refusal must also drop what it had planned). */
Test(migrate, a_table_it_cannot_use_is_refused_unchanged, .timeout = 120)
{
	struct fixture fx, fu;
	struct harness_output o;

	fixture_setup(&fx, "mig_noid",
	              &(struct fixture_options){ .no_migrate = true, .no_consumer = true });
	fixture_setup(&fu, "mig_type",
	              &(struct fixture_options){ .no_migrate = true, .no_consumer = true });
	harness_pg_exec(fx.pg,
	                "CREATE TABLE %s (seq BIGINT GENERATED ALWAYS AS IDENTITY, body TEXT)",
	                fx.table);
	run_migrate(&o, fx.table);
	cr_expect_neq(o.status, 0, "migrate of a table without id exited 0: %s", o.out);
	cr_expect(strstr(o.err, "has no column id: it is not an outbox table; nothing was changed"),
	          "migrate said: %s", o.err);
	harness_output_free(&o);

	harness_pg_exec(fx.pg,
	                "CREATE TABLE %s (seq BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,"
	                " id VARCHAR(64) PRIMARY KEY, exchange_name VARCHAR(255) NOT NULL,"
	                " routing_key VARCHAR(255) NOT NULL, body TEXT NOT NULL, attempts TEXT)",
	                fu.table);
	run_migrate(&o, fu.table);
	cr_expect_neq(o.status, 0, "migrate of a table with attempts TEXT exited 0: %s", o.out);
	cr_expect(strstr(o.err, "column attempts of table") &&
	                  strstr(o.err, "is of type text, the relay needs integer; nothing was "
	                                "changed"),
	          "migrate said: %s", o.err);
	/* Under the sanitizers a leak on this path ends the process with LeakSanitizer's report. */
	cr_expect_null(strstr(o.err, "LeakSanitizer"), "%s", o.err);
	cr_expect_eq(harness_pg_int(fx.pg,
	                            "SELECT count(*) FROM information_schema.columns WHERE"
	                            " table_name = '%s' AND column_name = 'body_encoding'",
	                            fu.table),
	             0, "a column was added although migrate refused the table");
	harness_output_free(&o);
	fixture_teardown(&fu);
	fixture_teardown(&fx);
}
