/* Least privilege, as packaging/roles.sql and packaging/grants.sql set it up and psql runs
 * them: the owner role migrates, the relay role runs the relay and every operator command,
 * the application's role (a member of the producer role) adds messages; and each of them can
 * do no more than that (leave-cursor, which deletes the cursor's position row, is the owner's). */
#include <criterion/criterion.h>
#include <libpq-fe.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/fixture.h"

#define DELIVERY_TIMEOUT_MS 120000
#define DEAD_TIMEOUT_MS     60000

struct roles {
	struct fixture fx;
	char owner[64], relay[64], producer[64], app[64];
	char e_owner[1200], e_relay[1200], e_app[1200]; /* OUTBOX_DATABASE_URL=... as each */
	char c_owner[1100], c_relay[1100], c_app[1100]; /* conninfo as each */
};

static void sql_file(char *buf, size_t n, const char *name)
{
	const char *data = getenv("RELAY_TEST_DATA");

	cr_assert_not_null(data, "RELAY_TEST_DATA is not set (ctest sets it)");
	snprintf(buf, n, "%s/../../packaging/%s", data, name);
}

/* psql -f FILE as the role in conninfo with the -v settings in vars; fails the test unless
 * it exits 0. */
static void run_psql(const char *conninfo, const char *file, const char *vars)
{
	char path[4096];
	int rc;

	sql_file(path, sizeof(path), file);
	rc = harness_shell("psql -X -q -v ON_ERROR_STOP=1 -d '%s' %s -f '%s'", conninfo, vars,
	                   path);
	cr_assert_eq(rc, 0, "psql -f %s exited %d", file, rc);
}

static void roles_setup(struct roles *t)
{
	char vars[512];
	struct harness_output o;

	memset(t, 0, sizeof(*t));
	fixture_setup(&t->fx, "roles", &(struct fixture_options){ .no_migrate = true });
	harness_unique_name(t->owner, sizeof(t->owner), "ob_owner");
	harness_unique_name(t->relay, sizeof(t->relay), "ob_relay");
	harness_unique_name(t->producer, sizeof(t->producer), "ob_producer");
	harness_unique_name(t->app, sizeof(t->app), "ob_app");
	snprintf(t->c_owner, sizeof(t->c_owner), "%s user=%s", harness_pg_conninfo(), t->owner);
	snprintf(t->c_relay, sizeof(t->c_relay), "%s user=%s", harness_pg_conninfo(), t->relay);
	snprintf(t->c_app, sizeof(t->c_app), "%s user=%s", harness_pg_conninfo(), t->app);
	snprintf(t->e_owner, sizeof(t->e_owner), "OUTBOX_DATABASE_URL=%s", t->c_owner);
	snprintf(t->e_relay, sizeof(t->e_relay), "OUTBOX_DATABASE_URL=%s", t->c_relay);
	snprintf(t->e_app, sizeof(t->e_app), "OUTBOX_DATABASE_URL=%s", t->c_app);

	/* 1. the roles, by the test's superuser; the application's login role joins producer */
	snprintf(vars, sizeof(vars), "-v owner=%s -v relay=%s -v producer=%s", t->owner, t->relay,
	         t->producer);
	run_psql(harness_pg_conninfo(), "roles.sql", vars);
	harness_pg_exec(t->fx.pg, "CREATE ROLE %s LOGIN IN ROLE %s", t->app, t->producer);
	/* 2. migrate as the owner */
	harness_cli(&o, t->fx.table, (const char *[]){ t->e_owner, NULL }, "migrate", NULL);
	cr_assert_eq(o.status, 0, "migrate as the owner role exited %d: %s", o.status, o.err);
	harness_output_free(&o);
	cr_assert_eq(harness_pg_int(t->fx.pg,
	                            "SELECT count(*) FROM pg_tables WHERE tablename = '%s'"
	                            " AND tableowner = '%s'",
	                            t->fx.table, t->owner),
	             1, "the table is not owned by the owner role");
	/* 3. the grants, as the owner */
	snprintf(vars, sizeof(vars), "-v table=%s -v relay=%s -v producer=%s", t->fx.table,
	         t->relay, t->producer);
	run_psql(t->c_owner, "grants.sql", vars);
}

static void roles_teardown(struct roles *t)
{
	const char *roles[] = { t->app, t->owner, t->relay, t->producer };

	fixture_teardown(&t->fx);
	/* One role at a time: DROP OWNED BY over roles whose default or granted privileges
	 * name each other fails in some PostgreSQL releases. */
	for (size_t i = 0; i < 4; i++) {
		PGconn *c = harness_pg_connect();

		harness_pg_exec(c, "DROP OWNED BY %s", roles[i]);
		PQfinish(c);
	}
	for (size_t i = 0; i < 4; i++) {
		PGconn *c = harness_pg_connect();

		harness_pg_exec(c, "DROP ROLE %s", roles[i]);
		PQfinish(c);
	}
}

static PGconn *connect_as(const char *conninfo)
{
	PGconn *c = PQconnectdb(conninfo);

	cr_assert_eq(PQstatus(c), CONNECTION_OK, "cannot connect as %s: %s", conninfo,
	             PQerrorMessage(c));
	return c;
}

/* The statement must fail with insufficient_privilege (42501). */
static void expect_denied(PGconn *c, const char *who, const char *sql)
{
	PGresult *r = PQexec(c, sql);
	const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);

	cr_expect(PQresultStatus(r) == PGRES_FATAL_ERROR && state && strcmp(state, "42501") == 0,
	          "%s could run `%s` (status %s, sqlstate %s)", who, sql,
	          PQresStatus(PQresultStatus(r)), state ? state : "none");
	PQclear(r);
}

static void expect_allowed(PGconn *c, const char *who, const char *sql)
{
	PGresult *r = PQexec(c, sql);
	ExecStatusType st = PQresultStatus(r);

	cr_expect(st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK, "%s could not run `%s`: %s", who,
	          sql, PQresultErrorMessage(r));
	PQclear(r);
}

/* Runs `outbox-relay args...` as the role env names; returns its output (free it). */
static void cli_as(struct harness_output *o, struct roles *t, const char *env, int want,
                   const char *a1, const char *a2, const char *a3, const char *a4)
{
	harness_cli(o, t->fx.table, (const char *[]){ env, NULL }, a1, a2, a3, a4, NULL);
	cr_expect_eq(o->status, want, "`%s %s %s %s` exited %d, not %d: %s%s", a1, a2 ? a2 : "",
	             a3 ? a3 : "", a4 ? a4 : "", o->status, want, o->out, o->err);
}

Test(roles, relay_and_commands_run_as_the_roles, .timeout = 600)
{
	struct roles t;
	struct harness_output o;
	struct harness_relay *r;
	char sql[1024];
	PGconn *app;

	roles_setup(&t);

	/* The producer's side: the SQL of the contract on the application's connection, and the
	 * CLI; adding an id twice is still no error. */
	app = connect_as(t.c_app);
	snprintf(sql, sizeof(sql),
	         "BEGIN; INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key)"
	         " VALUES ('sql-1', '%s', 'roles.created', '{}', 'k1') ON CONFLICT (id) DO NOTHING;"
	         " INSERT INTO %s (id, exchange_name, routing_key, body)"
	         " VALUES ('sql-1', '%s', 'roles.created', '{}') ON CONFLICT (id) DO NOTHING; "
	         "COMMIT",
	         t.fx.table, t.fx.exchange, t.fx.table, t.fx.exchange);
	expect_allowed(app, "the producer", sql);
	PQfinish(app);
	harness_cli(&o, t.fx.table, (const char *[]){ t.e_app, NULL }, "enqueue", "--exchange",
	            t.fx.exchange, "--routing-key", "roles.created", "--body", "{}", "--id",
	            "cli-1", "--ordering-key", "k1", NULL);
	cr_assert_eq(o.status, 0, "enqueue as the producer exited %d: %s", o.status, o.err);
	harness_output_free(&o);
	harness_cli(&o, t.fx.table, (const char *[]){ t.e_app, NULL }, "enqueue", "--exchange",
	            t.fx.exchange, "--routing-key", "roles.created", "--body", "{}", "--id",
	            "cli-1", NULL);
	cr_assert_eq(o.status, 0, "enqueue of a known id as the producer exited %d: %s", o.status,
	             o.err);
	harness_output_free(&o);

	/* The relay as the relay role: everything arrives, and it stops cleanly (releasing). */
	r = fixture_relay_start(&t.fx, (const char *[]){ t.e_relay, NULL });
	fixture_expect_unique(&t.fx, t.fx.cons, 2, DELIVERY_TIMEOUT_MS);

	/* A row that can never be published goes dead (inserted by the test's superuser). */
	harness_pg_exec(t.fx.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body, body_encoding)"
	                " VALUES ('bad-1', '%s', 'roles.created', '!!', 'base64')",
	                t.fx.table, t.fx.exchange);
	cr_assert(fixture_wait_logged(&t.fx, "message is dead", DEAD_TIMEOUT_MS),
	          "the bad row never went dead");

	/* The operator commands as the relay role. */
	cli_as(&o, &t, t.e_relay, 0, "status", NULL, NULL, NULL);
	cr_expect(strstr(o.out, "dead") != NULL, "status printed: %s", o.out);
	harness_output_free(&o);
	cli_as(&o, &t, t.e_relay, 0, "status", "--json", NULL, NULL);
	harness_output_free(&o);
	cli_as(&o, &t, t.e_relay, 0, "dead", "--limit", "10", NULL);
	cr_expect(strstr(o.out, "bad-1") != NULL, "dead printed: %s", o.out);
	harness_output_free(&o);
	cli_as(&o, &t, t.e_relay, 0, "keys", "--blocked", NULL, NULL);
	harness_output_free(&o);
	cli_as(&o, &t, t.e_relay, 0, "requeue", "--id", "bad-1", NULL);
	harness_output_free(&o);
	/* Requeued, it is claimed again and dies again: the relay role failed it twice. */
	HARNESS_WAIT(fixture_log_count(&t.fx, "message is dead") >= 2, DEAD_TIMEOUT_MS);
	cr_assert_geq(fixture_log_count(&t.fx, "message is dead"), 2,
	              "the requeued row never went dead again");
	HARNESS_WAIT(harness_pg_int(t.fx.pg,
	                            "SELECT count(*) FROM %s WHERE id = 'bad-1'"
	                            " AND attempts > 0 AND locked_by IS NULL",
	                            t.fx.table) == 1,
	             DEAD_TIMEOUT_MS);
	cli_as(&o, &t, t.e_relay, 0, "discard", "--id", "bad-1", NULL);
	harness_output_free(&o);
	cr_expect_eq(
	        harness_pg_int(t.fx.pg, "SELECT count(*) FROM %s WHERE id = 'bad-1'", t.fx.table),
	        0, "discard as the relay role left the row");
	cli_as(&o, &t, t.e_relay, 0, "replay", "--id", "sql-1", "--dry-run");
	cr_expect(strstr(o.out, "sql-1") != NULL, "replay --dry-run printed: %s", o.out);
	harness_output_free(&o);
	cli_as(&o, &t, t.e_relay, 0, "replay", "--id", "sql-1", NULL);
	harness_output_free(&o);
	HARNESS_WAIT(harness_pg_int(t.fx.pg,
	                            "SELECT count(*) FROM %s WHERE published_at IS NOT NULL",
	                            t.fx.table) == 2,
	             DELIVERY_TIMEOUT_MS);
	cli_as(&o, &t, t.e_relay, 0, "purge", "--older-than", "7d", NULL);
	harness_output_free(&o);
	cr_expect_eq(fixture_log_count(&t.fx, "database statement failed"), 0,
	             "the relay role met a statement it may not run");
	cr_expect_eq(fixture_log_count(&t.fx, "permission denied"), 0);

	/* An orderly stop as the relay role: it releases what it holds and exits 0. */
	cr_expect_eq(harness_relay_stop(r, SIGTERM, 30000), 0, "the relay did not stop cleanly");
	roles_teardown(&t);
}

Test(roles, each_role_can_do_no_more, .timeout = 300)
{
	struct roles t;
	struct harness_output o;
	char sql[1024], other[64];
	PGconn *relay, *app, *owner;

	roles_setup(&t);
	/* An application table next to the outbox, made by another role. */
	harness_unique_name(other, sizeof(other), "ob_orders");
	harness_pg_exec(t.fx.pg, "CREATE TABLE %s (id int); INSERT INTO %s VALUES (1)", other,
	                other);

	relay = connect_as(t.c_relay);
	/* What run needs works ... */
	snprintf(sql, sizeof(sql), "SELECT count(*) FROM %s", t.fx.table);
	expect_allowed(relay, "the relay", sql);
	snprintf(sql, sizeof(sql),
	         "SELECT pg_sequence_last_value(pg_get_serial_sequence('%s', 'seq'))", t.fx.table);
	expect_allowed(relay, "the relay", sql);
	/* The cursor source's position: the first leader inserts it, then moves it. */
	snprintf(sql, sizeof(sql),
	         "INSERT INTO %s_position (stream, position, leader) VALUES ('main', 0, 'r');"
	         " UPDATE %s_position SET position = 1 WHERE stream = 'main' AND position = 0;"
	         " SELECT position FROM %s_position",
	         t.fx.table, t.fx.table, t.fx.table);
	expect_allowed(relay, "the relay", sql);
	snprintf(sql, sizeof(sql), "DROP TABLE %s_position", t.fx.table);
	expect_denied(relay, "the relay", sql);
	/* leave-cursor ends by deleting the position row, which only the owner may: the relay role
	 * is refused before anything is marked, the owner hands the table over. */
	cli_as(&o, &t, t.e_relay, 1, "leave-cursor", NULL, NULL, NULL);
	cr_expect(strstr(o.err, "run leave-cursor as the table's owner") != NULL, "stderr: %s",
	          o.err);
	harness_output_free(&o);
	cr_expect_eq(harness_cursor_position(t.fx.pg, t.fx.table), 1);
	cli_as(&o, &t, t.e_owner, 0, "leave-cursor", NULL, NULL, NULL);
	harness_output_free(&o);
	cr_expect_eq(harness_cursor_position(t.fx.pg, t.fx.table), -1,
	             "the owner's leave-cursor left the position row");
	/* ... and nothing more: no DDL on the outbox, no producing, no other table, no new
	 * objects, no drawing of sequence values. */
	snprintf(sql, sizeof(sql), "DROP TABLE %s", t.fx.table);
	expect_denied(relay, "the relay", sql);
	snprintf(sql, sizeof(sql), "TRUNCATE %s", t.fx.table);
	expect_denied(relay, "the relay", sql);
	snprintf(sql, sizeof(sql), "ALTER TABLE %s ADD COLUMN x int", t.fx.table);
	expect_denied(relay, "the relay", sql);
	snprintf(sql, sizeof(sql), "CREATE INDEX ON %s (created_at)", t.fx.table);
	expect_denied(relay, "the relay", sql);
	snprintf(sql, sizeof(sql),
	         "INSERT INTO %s (id, exchange_name, routing_key, body) VALUES ('r', '', 'q', '')",
	         t.fx.table);
	expect_denied(relay, "the relay", sql);
	snprintf(sql, sizeof(sql), "SELECT nextval(pg_get_serial_sequence('%s', 'seq'))",
	         t.fx.table);
	expect_denied(relay, "the relay", sql);
	snprintf(sql, sizeof(sql), "SELECT * FROM %s", other);
	expect_denied(relay, "the relay", sql);
	snprintf(sql, sizeof(sql), "DELETE FROM %s", other);
	expect_denied(relay, "the relay", sql);
	if (PQserverVersion(relay) >= 150000) { /* 13 and 14 let PUBLIC create in public */
		snprintf(sql, sizeof(sql), "CREATE TABLE %s_r (x int)", other);
		expect_denied(relay, "the relay", sql);
	}
	PQfinish(relay);

	app = connect_as(t.c_app);
	/* The producer adds rows but reads, changes or removes none. */
	snprintf(sql, sizeof(sql), "SELECT body FROM %s", t.fx.table);
	expect_denied(app, "the producer", sql);
	snprintf(sql, sizeof(sql), "UPDATE %s SET attempts = 0", t.fx.table);
	expect_denied(app, "the producer", sql);
	snprintf(sql, sizeof(sql), "DELETE FROM %s", t.fx.table);
	expect_denied(app, "the producer", sql);
	snprintf(sql, sizeof(sql), "TRUNCATE %s", t.fx.table);
	expect_denied(app, "the producer", sql);
	snprintf(sql, sizeof(sql), "UPDATE %s_position SET position = 0", t.fx.table);
	expect_denied(app, "the producer", sql);
	PQfinish(app);

	owner = connect_as(t.c_owner);
	/* The owner owns the outbox, not the application's tables. */
	snprintf(sql, sizeof(sql), "SELECT * FROM %s", other);
	expect_denied(owner, "the owner", sql);
	PQfinish(owner);

	harness_pg_exec(t.fx.pg, "DROP TABLE %s", other);
	roles_teardown(&t);
}
