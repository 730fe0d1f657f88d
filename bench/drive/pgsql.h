/* pgsql.h — PostgreSQL shortcuts. bench/drive/ holds the drivers of real servers and
 * processes that the benchmark and the tests share; they need neither criterion nor the test
 * harness (whose harness_pg_* fail the test on top of these). Each takes a finished SQL
 * string and returns 0 or -1 with the reason in err (errlen may be 0: no text); output
 * parameters are written only on success. */
#ifndef OUTBOX_BENCH_DRIVE_PGSQL_H
#define OUTBOX_BENCH_DRIVE_PGSQL_H

#include <stddef.h>
#include <stdint.h>
#include <libpq-fe.h>

/* New connection to conninfo with server notices silenced ("already exists, skipping" from
 * idempotent DDL would only bury the output); the caller PQfinish()es it. NULL with the
 * server's message in err when it could not connect. */
PGconn *pgsql_connect(const char *conninfo, char *err, size_t errlen)
        __attribute__((warn_unused_result));
/* Runs sql (one or more statements); -1 when the server refused it. */
int pgsql_exec(PGconn *c, const char *sql, char *err, size_t errlen)
        __attribute__((warn_unused_result));
/* First column of the first row as an integer into *out; -1 when the query failed, returned
 * no row or NULL, or the value is not an integer. */
int pgsql_int(PGconn *c, const char *sql, int64_t *out, char *err, size_t errlen)
        __attribute__((warn_unused_result));
/* First column of the first row into *out: a new string (free()), or NULL for SQL NULL or no
 * row; -1 when the query failed or memory ran out. */
int pgsql_string(PGconn *c, const char *sql, char **out, char *err, size_t errlen)
        __attribute__((warn_unused_result));

#endif
