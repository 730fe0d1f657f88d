/* The benchmark's PostgreSQL (db.h), on bench/drive/pgsql.h: what a measurement needs of
 * the database, each error reported once as the measurement's failure. */
#include "bench/db.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/proc.h"
#include "bench/drive/pgsql.h"

PGconn *db_open(struct bench *b, const char *what)
{
	char err[512];
	PGconn *c = pgsql_connect(b->opt.pg, err, sizeof(err));

	if (!c) {
		bench_fail(b, what, "could not connect to PostgreSQL: %s", err);
		return NULL;
	}
	/* Bounds every statement (the 1,000,000-row fill included): a stuck server fails the
	 * measurement instead of hanging the run. */
	if (db_exec(b, c, what, "SET statement_timeout = '600s'") != 0) {
		PQfinish(c);
		return NULL;
	}
	return c;
}

int db_exec(struct bench *b, PGconn *c, const char *what, const char *sql)
{
	char err[512];

	if (pgsql_exec(c, sql, err, sizeof(err)) != 0) {
		bench_fail(b, what, "%s: %s", sql, err);
		return -1;
	}
	return 0;
}

long long db_count(PGconn *c, const char *sql)
{
	int64_t v;

	return pgsql_int(c, sql, &v, NULL, 0) == 0 ? (long long)v : -1;
}

void db_show(PGconn *c, const char *sql, char *out, size_t outlen)
{
	char *s = NULL;

	if (pgsql_string(c, sql, &s, NULL, 0) == 0 && s)
		snprintf(out, outlen, "%s", s);
	free(s);
}

int db_table_fresh(struct bench *b, PGconn *c, const char *what, const char *table)
{
	char sql[256];

	snprintf(sql, sizeof(sql),
	         "DROP TABLE IF EXISTS %s CASCADE; DROP TABLE IF EXISTS %s_wakeup; "
	         "DROP TABLE IF EXISTS %s_position",
	         table, table, table);
	if (db_exec(b, c, what, sql) != 0)
		return -1;
	return proc_migrate(b, what, table);
}

int db_table_fill(struct bench *b, PGconn *c, const char *what, const char *table, long n, int keys)
{
	char sql[512], key[64];

	if (keys > 0)
		snprintf(key, sizeof(key), "'k' || (g %% %d)", keys);
	else
		snprintf(key, sizeof(key), "NULL");
	snprintf(sql, sizeof(sql),
	         "INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key) "
	         "SELECT 'b' || g, '', '%s', repeat('x', %d), %s FROM generate_series(1, %ld) g",
	         table, table, BENCH_BODY_LEN, key, n);
	if (db_exec(b, c, what, sql) != 0)
		return -1;
	snprintf(sql, sizeof(sql), "VACUUM ANALYZE %s", table);
	return db_exec(b, c, what, sql);
}

int db_drop_triggers(struct bench *b, PGconn *c, const char *what, const char *table, int *n)
{
	char sql[512];
	PGresult *r;
	int rc = -1, dropped = 0;

	snprintf(sql, sizeof(sql),
	         "SELECT format('DROP TRIGGER %%I ON %%s', tgname, tgrelid::regclass) "
	         "FROM pg_trigger WHERE tgrelid = '%s'::regclass AND NOT tgisinternal",
	         table);
	r = PQexec(c, sql);
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		bench_fail(b, what, "listing the triggers of %s: %s", table, PQerrorMessage(c));
		goto out;
	}
	for (int i = 0; i < PQntuples(r); i++) {
		if (db_exec(b, c, what, PQgetvalue(r, i, 0)) != 0)
			goto out;
		dropped++;
	}
	if (n)
		*n = dropped;
	rc = 0;
out:
	PQclear(r);
	return rc;
}

int db_prepare_insert(PGconn *p, const char *name, const char *table, char *err, size_t errlen)
{
	return db_prepare_insert_rows(p, name, table, 1, err, errlen);
}

int db_prepare_insert_rows(PGconn *p, const char *name, const char *table, long rows, char *err,
                           size_t errlen)
{
	size_t cap = 128 + strlen(table) + (size_t)rows * 40, len;
	char *sql = malloc(cap);
	PGresult *r;
	int rc = 0;

	if (!sql) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	len = (size_t)snprintf(
	        sql, cap, "INSERT INTO %s (id, exchange_name, routing_key, body) VALUES", table);
	for (long i = 0; i < rows; i++)
		len += (size_t)snprintf(sql + len, cap - len, "%s ($%ld, '', $%ld, $%ld)",
		                        i ? "," : "", 3 * i + 1, 3 * i + 2, 3 * i + 3);
	snprintf(sql + len, cap - len, " ON CONFLICT (id) DO NOTHING");
	r = PQprepare(p, name, sql, (int)(3 * rows), NULL);
	if (PQresultStatus(r) != PGRES_COMMAND_OK) {
		snprintf(err, errlen, "%s", PQerrorMessage(p));
		rc = -1;
	}
	PQclear(r);
	free(sql);
	return rc;
}

size_t db_relay_sessions(PGconn *c, pid_t *pids, char (*names)[DB_APP_NAME_LEN])
{
	PGresult *r = PQexec(c, "SELECT pid, application_name FROM pg_stat_activity"
	                        " WHERE datname = current_database()"
	                        " AND application_name LIKE 'outbox-relay%' ORDER BY 2, 1");
	size_t n = 0;

	for (int i = 0;
	     PQresultStatus(r) == PGRES_TUPLES_OK && i < PQntuples(r) && n < DB_MAX_RELAY_SESSIONS;
	     i++) {
		char *end;
		long pid;

		errno = 0;
		pid = strtol(PQgetvalue(r, i, 0), &end, 10);
		if (errno != 0 || *end != '\0' || pid <= 0)
			continue;
		if (names)
			snprintf(names[n], DB_APP_NAME_LEN, "%s", PQgetvalue(r, i, 1));
		pids[n++] = (pid_t)pid;
	}
	PQclear(r);
	return n;
}

void db_table_drop(PGconn *c, const char *table)
{
	char sql[256];

	if (!c)
		return;
	snprintf(sql, sizeof(sql),
	         "DROP TABLE IF EXISTS %s CASCADE; DROP TABLE IF EXISTS %s_wakeup; "
	         "DROP TABLE IF EXISTS %s_position",
	         table, table, table);
	/* Nothing to do on an error: the measurement is over, and the next run of the same
	 * name drops the table first anyway. */
	if (pgsql_exec(c, sql, NULL, 0) != 0)
		return;
}
