/* db.h — the benchmark's PostgreSQL: connections that bound every statement, SQL that reports
 * a failed measurement, and the outbox tables each measurement uses (fresh, filled, dropped). */
#ifndef OUTBOX_BENCH_DB_H
#define OUTBOX_BENCH_DB_H

#include <stddef.h>
#include <sys/types.h>
#include <libpq-fe.h>

#include "bench/bench.h"

/* New connection to the benchmark's server (PQfinish() it), every statement bounded by
 * 600 s so a stuck server fails the measurement instead of hanging the run; NULL after
 * bench_fail(what). */
PGconn *db_open(struct bench *b, const char *what);
/* Runs sql; -1 after bench_fail(what) with the statement and the server's message. */
int db_exec(struct bench *b, PGconn *c, const char *what, const char *sql)
        __attribute__((warn_unused_result));
/* First column of the first row as an integer; -1 on any error (nothing reported). */
long long db_count(PGconn *c, const char *sql);
/* First column of the first row as text into out; out unchanged on any error. */
void db_show(PGconn *c, const char *sql, char *out, size_t outlen);

/* Drops table, its wake-up flag and its position (the cursor source's), then lets the relay
 * create them (`outbox-relay migrate`) as operators do. -1 after bench_fail(what). */
int db_table_fresh(struct bench *b, PGconn *c, const char *what, const char *table)
        __attribute__((warn_unused_result));
/* n rows of BENCH_BODY_LEN bytes, routed by the default exchange to the queue named like the
 * table; with keys > 0, spread round-robin over that many ordering keys. Then VACUUM ANALYZE,
 * so that the relay meets a table in the state autovacuum keeps a long-lived one in. -1 after
 * bench_fail(what). */
int db_table_fill(struct bench *b, PGconn *c, const char *what, const char *table, long n, int keys)
        __attribute__((warn_unused_result));
/* Drops every trigger a user made on table (pg_trigger rows that are NOT tgisinternal: the
 * wake-up whatever it is called, not the triggers behind constraints), so that a measurement
 * sees the table without its wake-up however the schema names it; how many into *n (n may be
 * NULL). -1 after
 * bench_fail(what). */
int db_drop_triggers(struct bench *b, PGconn *c, const char *what, const char *table, int *n)
        __attribute__((warn_unused_result));
/* Prepares, as name on p, the single-row insert every producer of the benchmark commits
 * (autocommit: one row per transaction; $1 id, $2 routing key, $3 body, default exchange; an
 * id already there is skipped). 0, or -1 with the server's message in err; reports nothing,
 * so any thread may call it. */
int db_prepare_insert(PGconn *p, const char *name, const char *table, char *err, size_t errlen)
        __attribute__((warn_unused_result));
/* As db_prepare_insert(), for rows rows in one statement: $1, $2, $3 the first row's id,
 * routing key and body, $4, $5, $6 the second's, and so on. */
int db_prepare_insert_rows(PGconn *p, const char *name, const char *table, long rows, char *err,
                           size_t errlen) __attribute__((warn_unused_result));
#define DB_MAX_RELAY_SESSIONS 16
#define DB_APP_NAME_LEN       64

/* The server processes of the relays' sessions in this database now (their application_name
 * starts with outbox-relay: workers and maintenance), at most DB_MAX_RELAY_SESSIONS into
 * pids and, unless names is NULL, their application_name into names; how many (0 on any
 * error, nothing reported). */
size_t db_relay_sessions(PGconn *c, pid_t *pids, char (*names)[DB_APP_NAME_LEN]);
/* Drops table, its wake-up flag and its position; errors are ignored (the run is over for
 * it). */
void db_table_drop(PGconn *c, const char *table);

#endif
