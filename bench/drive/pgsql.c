/* PostgreSQL shortcuts that return their errors (see pgsql.h), one of the drivers the
 * benchmark and the tests share. Needs only libpq: neither criterion nor the test harness,
 * which fails the test on top of them. */
#include "bench/drive/pgsql.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void quiet_notices(void *arg, const char *message)
{
	(void)arg;
	(void)message;
}

static void set_err(char *err, size_t errlen, const char *what, const char *detail)
{
	if (errlen > 0)
		snprintf(err, errlen, "%s%s", what, detail);
}

PGconn *pgsql_connect(const char *conninfo, char *err, size_t errlen)
{
	PGconn *c = PQconnectdb(conninfo);

	if (PQstatus(c) != CONNECTION_OK) {
		set_err(err, errlen, "", c ? PQerrorMessage(c) : "out of memory");
		PQfinish(c);
		return NULL;
	}
	PQsetNoticeProcessor(c, quiet_notices, NULL);
	return c;
}

int pgsql_exec(PGconn *c, const char *sql, char *err, size_t errlen)
{
	PGresult *res = PQexec(c, sql);
	ExecStatusType st = PQresultStatus(res);
	int rc = 0;

	if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
		set_err(err, errlen, "", PQerrorMessage(c));
		rc = -1;
	}
	PQclear(res);
	return rc;
}

/* The result of a query expected to return rows, or NULL with "query failed: ..." in err. */
static PGresult *query(PGconn *c, const char *sql, char *err, size_t errlen)
{
	PGresult *res = PQexec(c, sql);

	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		set_err(err, errlen, "query failed: ", PQerrorMessage(c));
		PQclear(res);
		return NULL;
	}
	return res;
}

int pgsql_int(PGconn *c, const char *sql, int64_t *out, char *err, size_t errlen)
{
	PGresult *res = query(c, sql, err, errlen);
	const char *s;
	char *end;
	long long v;
	int rc = -1;

	if (res == NULL)
		return -1;
	if (PQntuples(res) == 0 || PQgetisnull(res, 0, 0)) {
		set_err(err, errlen, "query returned no value", "");
		goto out;
	}
	s = PQgetvalue(res, 0, 0);
	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0') {
		if (errlen > 0)
			snprintf(err, errlen, "not an integer: '%s'", s);
		goto out;
	}
	*out = v;
	rc = 0;
out:
	PQclear(res);
	return rc;
}

int pgsql_string(PGconn *c, const char *sql, char **out, char *err, size_t errlen)
{
	PGresult *res = query(c, sql, err, errlen);
	char *s = NULL;
	int rc = 0;

	if (res == NULL)
		return -1;
	if (PQntuples(res) > 0 && !PQgetisnull(res, 0, 0)) {
		s = strdup(PQgetvalue(res, 0, 0));
		if (s == NULL) {
			set_err(err, errlen, "out of memory", "");
			rc = -1;
		}
	}
	PQclear(res);
	if (rc == 0)
		*out = s;
	return rc;
}
