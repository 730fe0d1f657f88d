/* The database turns read-only under a running relay, as a primary demoted to a standby looks
 * from a session it left open: the relay drops the connection and reconnects (error 25006 is a
 * lost connection, not a statement to retry in place), charges no row, and once the server
 * accepts writes again delivers every committed row. The read-only switch is cluster-wide
 * (default_transaction_read_only through ALTER SYSTEM): it is kept to a few seconds and always
 * undone, a failed assertion included. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/drive/pgsql.h"
#include "tests/support/fault.h"
#include "tests/support/http_probe.h"

#define ROWS 200

static const char lost_line[] = "msg=\"lost connection, will reconnect\" to=database";
static const char back_line[] = "msg=\"reconnected\" to=database";
/* What the relay logs when it treats an error as a statement to retry on the same session. */
static const char in_place_line[] = "database statement failed";

/* Whether this test has made the cluster read-only and not yet undone it. */
static bool read_only;

/* Sets or resets the cluster's default_transaction_read_only and reloads the configuration;
 * without criterion, so that the teardown can call it whatever happened. The session turns it
 * off for itself first: ALTER SYSTEM must not depend on what it undoes. */
static bool set_read_only(bool on)
{
	char err[512] = "";
	PGconn *c = pgsql_connect(harness_pg_conninfo(), err, sizeof(err));
	bool ok = c != NULL;

	if (ok)
		ok = pgsql_exec(c, "SET default_transaction_read_only = off", err, sizeof(err)) ==
		             0 &&
		     pgsql_exec(c,
		                on ? "ALTER SYSTEM SET default_transaction_read_only = on"
		                   : "ALTER SYSTEM RESET default_transaction_read_only",
		                err, sizeof(err)) == 0 &&
		     pgsql_exec(c, "SELECT pg_reload_conf()", err, sizeof(err)) == 0;
	if (!ok)
		fprintf(stderr, "could not %s the cluster: %s\n",
		        on ? "make read-only" : "make writable again", err);
	PQfinish(c);
	return ok;
}

/* Whatever happened in the test, the next one finds the cluster writable. */
static void restore_writable(void)
{
	for (int i = 0; read_only && i < 20; i++) {
		if (set_read_only(false))
			read_only = false;
		else
			harness_sleep_ms(500);
	}
}

/* The backend of the relay's loop: application_name 'outbox-relay worker 1' and a last
 * statement on this test's table (other relays on the cluster never touch it); the newest
 * when a session that was just given up has not ended yet. 0 when there is none right now. */
static int worker_pid(struct fixture *f)
{
	return (int)harness_pg_int(f->pg,
	                           "SELECT coalesce((SELECT pid FROM pg_stat_activity"
	                           " WHERE application_name = 'outbox-relay worker 1'"
	                           " AND strpos(query, '%s') > 0"
	                           " ORDER BY backend_start DESC LIMIT 1), 0)",
	                           f->table);
}

static int session_count(struct fixture *f, int pid)
{
	return (int)harness_pg_int(f->pg, "SELECT count(*) FROM pg_stat_activity WHERE pid = %d",
	                           pid);
}

static int64_t charged(struct fixture *f)
{
	return harness_pg_int(f->pg, "SELECT count(*) FROM %s WHERE attempts > 0", f->table);
}

/* Whether one line of some relay's log holds both a and b. */
static bool logged_both(struct fixture *f, const char *a, const char *b)
{
	bool found = false;

	for (size_t i = 0; i < f->n_relays && !found; i++) {
		char *log = harness_relay_log(f->relays[i]), *line, *next;

		for (line = log; line && *line && !found; line = next) {
			next = strchr(line, '\n');
			if (next)
				*next++ = '\0';
			found = strstr(line, a) && strstr(line, b);
		}
		free(log);
	}
	return found;
}

static bool ready(void *arg)
{
	struct probe_reply r = probe_get(arg, "/readyz");
	bool ok = r.status == 200;

	free(r.body);
	return ok;
}

Test(fault, database_turns_read_only, .timeout = 600, .fini = restore_writable)
{
	struct fixture f;
	struct harness_relay *relay;
	struct probe_reply reply;
	char listen[64], e_listen[96], *flipped_at;
	size_t lost, dups;
	int old_pid, new_pid;

	fixture_setup(&f, "fault_ro", NULL);
	/* The test's own connection (producer, checks, teardown) keeps writing throughout. */
	harness_pg_exec(f.pg, "SET default_transaction_read_only = off");
	snprintf(listen, sizeof(listen), "127.0.0.1:%d", probe_free_port());
	snprintf(e_listen, sizeof(e_listen), "OUTBOX_HTTP_LISTEN=%s", listen);
	/* The harness's database URL, without target_session_attrs. Debug shows every refused
	 * reconnect, not only the first. */
	relay = fault_relay_start(
	        &f, (const char *const[]){ e_listen, "OUTBOX_LOG_LEVEL=debug", NULL });
	harness_insert_rows(f.pg, f.table, ROWS, f.exchange, "ro.before", "rob", NULL, NULL);
	fixture_expect_unique(&f, f.cons, ROWS, FAULT_DELIVERY_TIMEOUT_MS);
	HARNESS_WAIT((old_pid = worker_pid(&f)) != 0, FAULT_LOG_TIMEOUT_MS);
	cr_assert_neq(old_pid, 0, "no session of the relay's loop in pg_stat_activity");

	/* The flip. From here on keep it short: the cluster is shared. */
	flipped_at = harness_pg_string(f.pg, "SELECT clock_timestamp()::text");
	cr_assert_not_null(flipped_at);
	read_only = true;
	cr_assert(set_read_only(true), "could not make the cluster read-only");
	harness_insert_rows(f.pg, f.table, ROWS, f.exchange, "ro.during", "rod", NULL, NULL);

	/* The relay's next write fails with 25006: the connection is given up as lost, and the
	 * reconnects are refused (the server is read-only) until it is writable again. */
	HARNESS_WAIT(logged_both(&f, lost_line, "read-only") &&
	                     fixture_log_count(&f, "read-only") >= 2,
	             FAULT_LOG_TIMEOUT_MS);
	if (!logged_both(&f, lost_line, "read-only") || fixture_log_count(&f, "read-only") < 2)
		fixture_dump_logs(&f);
	cr_assert(logged_both(&f, lost_line, "read-only"),
	          "the read-only error was not taken as a lost connection");
	cr_assert_geq(fixture_log_count(&f, "read-only"), 2,
	              "the relay did not try the server again after dropping the connection");
	cr_assert_not(logged_both(&f, in_place_line, "read-only"),
	              "the read-only error was treated as a failed statement on a live session");
	HARNESS_WAIT(session_count(&f, old_pid) == 0, FAULT_LOG_TIMEOUT_MS);
	cr_assert_eq(session_count(&f, old_pid), 0,
	             "the relay's session (pid %d) is still open: it was not dropped", old_pid);
	cr_assert_eq(charged(&f), 0, "a read-only server must not charge attempts");

	restore_writable();
	cr_assert_not(read_only, "could not make the cluster writable again");

	if (!fixture_wait_logged(&f, back_line, FAULT_LOG_TIMEOUT_MS))
		fixture_dump_logs(&f);
	cr_assert(fixture_logged(&f, back_line),
	          "no 'reconnected' line once the server was writable");
	fixture_expect_unique(&f, f.cons, 2 * ROWS, FAULT_DELIVERY_TIMEOUT_MS);
	HARNESS_WAIT((new_pid = worker_pid(&f)) != 0 && new_pid != old_pid, FAULT_LOG_TIMEOUT_MS);
	cr_assert_neq(new_pid, 0, "no session of the relay's loop after the reconnect");
	cr_assert_neq(new_pid, old_pid, "the relay kept its old session");
	cr_assert_eq(harness_pg_int(f.pg,
	                            "SELECT count(*) FROM pg_stat_activity WHERE pid = %d"
	                            " AND backend_start > '%s'::timestamptz",
	                            new_pid, flipped_at),
	             1, "the relay's session (pid %d) is not one opened after the flip", new_pid);
	free(flipped_at);

	cr_assert_not(relay->exited, "the relay process must ride out a read-only server");
	if (!harness_wait_until(ready, listen, FAULT_LOG_TIMEOUT_MS))
		fixture_dump_logs(&f);
	cr_assert(ready(listen), "/readyz never answered 200 again");
	reply = probe_get(listen, "/metrics");
	cr_assert_eq(reply.status, 200, "/metrics answered %d", reply.status);
	cr_assert_eq(probe_metric(reply.body, "outbox_relay_database_up"), 1, "%s", reply.body);
	free(reply.body);

	fault_expect_settled(&f, 10, 60000);
	/* Duplicates allowed, though none is expected: nothing was in flight at the flip. */
	dups = fault_count(&f, "read_only", "rob", ROWS, &lost);
	cr_assert_eq(lost, 0, "%zu rows committed before the flip never arrived", lost);
	dups += fault_count(&f, "read_only", "rod", ROWS, &lost);
	cr_assert_eq(lost, 0, "%zu rows committed while read-only never arrived", lost);
	cr_log_info("read_only: duplicates=%zu", dups);
	cr_assert_eq(charged(&f), 0, "a read-only server must not charge attempts");
	cr_assert_not(logged_both(&f, in_place_line, "read-only"),
	              "the read-only error was treated as a failed statement on a live session");
	fixture_teardown(&f);
}
