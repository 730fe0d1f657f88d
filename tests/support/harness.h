/* harness.h — helpers for the integration and fault tests: the test environment, unique
 * names, PostgreSQL shortcuts, running the relay binary (daemon or one-shot command) with a
 * clean environment, polling with deadlines and controlling the test servers. Every helper
 * that cannot do its job fails the current criterion test (cr_assert_fail), so tests read as
 * a list of steps without error plumbing. Not thread-safe unless said otherwise.
 *
 * Every process started here (relays, programs, commands, shells) ends with the test process,
 * however that ends: the ones still running at exit() are killed and reaped (a failed
 * cr_assert ends the worker that way), and each one gets SIGKILL from the kernel when the
 * process dies without an exit (crash, abort, timeout kill). */
#ifndef OUTBOX_TESTS_HARNESS_H
#define OUTBOX_TESTS_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <libpq-fe.h>

#include "base/outbox_row.h"

/* ---- environment (borrowed strings; fail the test when the variable is missing) ---- */
const char *harness_pg_conninfo(void); /* RELAY_TEST_PG */
const char *harness_amqp_url(void);    /* RELAY_TEST_AMQP */
const char *harness_relay_bin(void);   /* RELAY_TEST_BIN */
const char *harness_require_env(const char *name);

/* AMQP host and port parsed from RELAY_TEST_AMQP (for the TCP proxy). */
int harness_amqp_port(void);

/* ---- the row source under test ----
 * RELAY_TEST_SOURCE (`lease`, the default, or `cursor`) is the relay.source of every relay and
 * command this harness starts (OUTBOX_RELAY_SOURCE, unless the test's env names it): ctest
 * runs each fault test under both (tests/CMakeLists.txt). Tests branch on it only where the
 * two sources keep the contract in different ways (docs/design.md, "The source seam"). */
const char *harness_source(void); /* "lease" or "cursor"; fails the test on anything else */
bool harness_source_is_cursor(void);
/* SQL conditions on a row of table (unqualified columns, for a WHERE on table itself): the
 * row is unpublished (pending or dead) / published, as the source under test records it. The
 * lease source marks every row (published_at); the cursor publishes the rows its position
 * covers without writing them, and marks only the rows it set aside (deferred_at). Borrowed:
 * each call's string stays valid for the next three calls. */
const char *harness_unpublished(const char *table);
const char *harness_published(const char *table);
/* Rows of table unpublished (pending or dead) under the source under test. */
int64_t harness_unpublished_count(PGconn *c, const char *table);
/* The cursor's position on table (its <table>_position row), -1 while there is none; and the
 * relay.id of the relay that leads it, a new string (free()), NULL when none is recorded. */
int64_t harness_cursor_position(PGconn *c, const char *table);
char *harness_cursor_leader(PGconn *c, const char *table);

/* ---- names ---- */
/* Writes "<prefix>_<pid>_<counter>_<random>" in lowercase into buf: unique across processes
 * and calls, and a valid SQL identifier / queue / exchange name when prefix is one. */
void harness_unique_name(char *buf, size_t len, const char *prefix);

/* ---- time ---- */
int64_t harness_now_ms(void); /* monotonic */
void harness_sleep_ms(int64_t ms);

/* Polls cond every 20 ms until it holds or timeout_ms passed; the caller asserts cond after. */
#define HARNESS_WAIT(cond, timeout_ms)                                       \
	do {                                                                 \
		int64_t harness_deadline_ = harness_now_ms() + (timeout_ms); \
		while (!(cond) && harness_now_ms() < harness_deadline_)      \
			harness_sleep_ms(20);                                \
	} while (0)

/* Function form of HARNESS_WAIT; returns whether cond(arg) became true in time. */
typedef bool (*harness_cond_fn)(void *arg);
bool harness_wait_until(harness_cond_fn cond, void *arg, int64_t timeout_ms);

/* ---- PostgreSQL ---- */
/* New connection to RELAY_TEST_PG; the caller PQfinish()es it. */
PGconn *harness_pg_connect(void);
/* Same, retrying for up to timeout_ms (after a server restart). NULL when it never worked. */
PGconn *harness_pg_connect_retry(int64_t timeout_ms);
/* Runs printf-formatted SQL (one or more statements) and fails the test unless it worked. */
void harness_pg_exec(PGconn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Same without failing: 0 on success, -1 with the server's message in err. */
int harness_pg_try_exec(PGconn *c, char *err, size_t errlen, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));
/* First column of the first row as an integer; fails the test on error, no row or NULL. */
int64_t harness_pg_int(PGconn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* First column of the first row; new string (free()), NULL for SQL NULL or no row. */
char *harness_pg_string(PGconn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Sessions holding the wake-up lock of table, the one a relay takes while it sleeps (in
 * exclusive mode; producers test it in shared mode and let it go at once). */
int64_t harness_wakeup_holders(PGconn *c, const char *table);

/* harness_insert_rows() writes struct outbox_row (base/outbox_row.h): id, exchange,
 * routing_key, body (a C string: body_len is not read), body_encoding, content_type, headers,
 * properties and ordering_key; the other fields are the table's to set. NULL fields take the
 * table's defaults ('utf-8', 'application/json', '{}', '{}', no ordering key). */
/* Fills *row for row number i (0-based). Strings must stay valid until the next call; the
 * fields start zeroed except exchange and routing_key, which hold insert_rows' defaults. */
typedef void (*harness_row_fn)(size_t i, struct outbox_row *row, void *arg);

/* Inserts n rows into table with COPY in one transaction. gen may be NULL: then row i gets id
 * "<id_prefix>-<i, 7 digits>" and a small JSON body. With gen, a NULL id also gets that id. */
void harness_insert_rows(PGconn *c, const char *table, size_t n, const char *exchange,
                         const char *routing_key, const char *id_prefix, harness_row_fn gen,
                         void *arg);

/* ---- the relay binary ---- */
/* Runs `outbox-relay migrate` for table and fails the test unless it exits 0. */
void harness_migrate(const char *table);

/* A running relay process. */
struct harness_relay {
	pid_t pid;
	bool exited;
	int status;         /* as harness_relay_wait() returns it, once exited */
	char log_path[512]; /* its stdout + stderr */
	char table[128];
};

/* Starts `outbox-relay args...` (args NULL-terminated; NULL = just "run") with a clean
 * environment: PATH, HOME, the sanitizer options, OUTBOX_DATABASE_URL, OUTBOX_AMQP_URL,
 * OUTBOX_DATABASE_TABLE=table, OUTBOX_DATABASE_CHANNEL=table, OUTBOX_HTTP_LISTEN=,
 * OUTBOX_LOG_LEVEL=info, then env (NULL-terminated "OUTBOX_X=y"; a name given there replaces
 * the default). Output goes to a log file under ./relay-logs. Free with harness_relay_free. */
struct harness_relay *harness_relay_start(const char *table, const char *const *env,
                                          const char *const *args);
/* Starts another program (bin args..., args NULL-terminated) the same way, with the same
 * clean environment (no table) plus env, its output in a log named after log_name. The
 * harness_relay_* calls below work on it too. */
struct harness_relay *harness_program_start(const char *bin, const char *const *args,
                                            const char *const *env, const char *log_name);
/* Waits up to timeout_ms for the process to exit. Returns its exit code, 128 + signal when a
 * signal killed it, or -1 when it is still running. */
int harness_relay_wait(struct harness_relay *r, int64_t timeout_ms);
/* Sends sig, then harness_relay_wait(). */
int harness_relay_stop(struct harness_relay *r, int sig, int64_t timeout_ms);
/* SIGKILL and reap. */
void harness_relay_kill(struct harness_relay *r);
/* Kills the process if still running, then frees r; accepts NULL. */
void harness_relay_free(struct harness_relay *r);
/* The end of a test: SIGTERM, wait up to 30 s, expect exit status 0 (an orderly shutdown;
 * sanitizer reports would show as a non-zero status), dump the log when it is not, and free.
 * name says which relay in the failure message. Accepts NULL and relays that already exited
 * (those are only freed). */
void harness_relay_finish(struct harness_relay *r, const char *name);
/* The whole log so far; new string (free()). */
char *harness_relay_log(const struct harness_relay *r);
/* The whole file at path as a new NUL-terminated string (free()); fails the test when it
 * cannot be read. */
char *harness_read_file(const char *path);
/* The source tree's path of rel, a path relative to the repository's root, into buf (n bytes;
 * RELAY_TEST_DATA, which ctest sets, is <source>/tests/data). */
void harness_source_path(char *buf, size_t n, const char *rel);
/* harness_read_file() of the source tree's rel; new string (free()). */
char *harness_read_source(const char *rel);
/* Number of log lines containing needle. */
int harness_relay_log_count(const struct harness_relay *r, const char *needle);
/* The first log line containing needle, without its newline; new string (free()), NULL when no
 * line does. */
char *harness_relay_log_line(const struct harness_relay *r, const char *needle);
/* Waits until some log line contains needle; false after timeout_ms. */
bool harness_relay_wait_log(const struct harness_relay *r, const char *needle, int64_t timeout_ms);
/* Prints the log's last lines through criterion's logger (call on failure paths). */
void harness_relay_dump_log(const struct harness_relay *r);

/* Output of a one-shot command. */
struct harness_output {
	int status; /* exit code, 128 + signal, or -1 when it had to be killed after 60 s */
	char *out;  /* stdout, NUL-terminated; never NULL */
	char *err;  /* stderr, NUL-terminated; never NULL */
};
/* Runs `outbox-relay <args...>` (NULL-terminated varargs) to completion with the same
 * environment as harness_relay_start() (table and env as there; table may be NULL, then no
 * OUTBOX_DATABASE_TABLE/CHANNEL is set). Fills *o; free it with harness_output_free(). */
void harness_cli(struct harness_output *o, const char *table, const char *const *env, ...);
/* Runs `outbox-relay <args...>` (args NULL-terminated) the same way, in an environment of
 * PATH, the sanitizer options and env (NULL-terminated "NAME=value", may be NULL) alone: no
 * test servers, and no OUTBOX_* variable of the caller's shell changes what is tested. For the
 * command line's unit tests. */
void harness_cli_bare(struct harness_output *o, const char *const *env, const char *const *args);
void harness_output_free(struct harness_output *o);

/* ---- test servers (commands from tests/services.sh's env file) ---- */
/* Runs a shell command line; returns its exit code (output goes to the test's log). */
int harness_shell(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void harness_broker_stop_app(void); /* rabbitmqctl stop_app: connections drop, node stays */
void harness_broker_start_app(void);
void harness_broker_node_stop(void);  /* the whole Erlang node exits */
void harness_broker_node_start(void); /* starts it again and waits until it runs */
void harness_pg_restart(void);        /* pg_ctl restart -m fast, waits until it accepts */

#endif
