/* Test harness: environment, names, PostgreSQL helpers, the relay process under test and
 * the service controls used by the integration and fault tests (see harness.h). */
#include "tests/support/harness.h"
#include "bench/drive/pgsql.h"
#include "bench/drive/process.h"
#include "store/store_private.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* Cap on a formatted SQL statement or command line; tests build small ones. */
#define HARNESS_SQL_MAX (64 * 1024)

const char *harness_require_env(const char *name)
{
	const char *v = getenv(name);

	if (v == NULL || v[0] == '\0')
		cr_assert_fail(
		        "%s is not set: run the tests with tests/run (or source the env file "
		        "tests/services.sh writes)",
		        name);
	return v;
}

const char *harness_pg_conninfo(void)
{
	return harness_require_env("RELAY_TEST_PG");
}

const char *harness_amqp_url(void)
{
	return harness_require_env("RELAY_TEST_AMQP");
}

const char *harness_relay_bin(void)
{
	return harness_require_env("RELAY_TEST_BIN");
}

int harness_amqp_port(void)
{
	const char *url = harness_amqp_url();
	const char *at = strrchr(url, '@');
	const char *host = at ? at + 1 : strstr(url, "://");
	const char *colon;
	char *end;
	long port;

	cr_assert_not_null(host, "cannot parse RELAY_TEST_AMQP '%s'", url);
	if (!at)
		host += 3;
	colon = strchr(host, ':');
	if (colon == NULL)
		return 5672;
	errno = 0;
	port = strtol(colon + 1, &end, 10);
	cr_assert(errno == 0 && end != colon + 1 && port > 0 && port < 65536,
	          "cannot parse the port of RELAY_TEST_AMQP '%s'", url);
	return (int)port;
}

void harness_unique_name(char *buf, size_t len, const char *prefix)
{
	static unsigned counter;
	static bool seeded;
	unsigned r;
	int n;

	/* Random part: tests of one file run in one process, but files run in parallel and
	 * reruns reuse pids, so pid + counter alone could meet a leftover table or queue. */
	if (!seeded) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		srand((unsigned)ts.tv_nsec ^ (unsigned)getpid());
		seeded = true;
	}
	r = (unsigned)rand() & 0xfffff;
	n = snprintf(buf, len, "%s_%ld_%u_%05x", prefix, (long)getpid(), ++counter, r);
	cr_assert(n > 0 && (size_t)n < len, "name buffer too small for prefix '%s'", prefix);
	for (char *p = buf; *p; p++) {
		if (*p >= 'A' && *p <= 'Z')
			*p = (char)(*p - 'A' + 'a');
	}
}

int64_t harness_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void harness_sleep_ms(int64_t ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000 };

	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

bool harness_wait_until(harness_cond_fn cond, void *arg, int64_t timeout_ms)
{
	int64_t deadline = harness_now_ms() + timeout_ms;

	for (;;) {
		if (cond(arg))
			return true;
		if (harness_now_ms() >= deadline)
			return false;
		harness_sleep_ms(20);
	}
}

/* ---- PostgreSQL ---- */

PGconn *harness_pg_connect(void)
{
	char msg[512];
	PGconn *c = pgsql_connect(harness_pg_conninfo(), msg, sizeof(msg));

	if (c == NULL)
		cr_assert_fail("could not connect to RELAY_TEST_PG: %s", msg);
	return c;
}

PGconn *harness_pg_connect_retry(int64_t timeout_ms)
{
	int64_t deadline = harness_now_ms() + timeout_ms;

	for (;;) {
		PGconn *c = PQconnectdb(harness_pg_conninfo());

		if (PQstatus(c) == CONNECTION_OK)
			return c;
		PQfinish(c);
		if (harness_now_ms() >= deadline)
			return NULL;
		harness_sleep_ms(100);
	}
}

static char *vformat(const char *fmt, va_list ap) __attribute__((format(printf, 1, 0)));

static char *vformat(const char *fmt, va_list ap)
{
	char *s = malloc(HARNESS_SQL_MAX);
	int n;

	cr_assert_not_null(s);
	n = vsnprintf(s, HARNESS_SQL_MAX, fmt, ap);
	cr_assert(n >= 0 && n < HARNESS_SQL_MAX, "formatted text longer than %d bytes",
	          HARNESS_SQL_MAX);
	return s;
}

/* Fails the test with what went wrong and the head of the statement; frees sql. */
static void fail_sql(const char *what, const char *err, char *sql)
{
	char head[200];

	snprintf(head, sizeof(head), "%s", sql);
	free(sql);
	cr_assert_fail("%s%s\n  statement: %s", what, err, head);
}

void harness_pg_exec(PGconn *c, const char *fmt, ...)
{
	char err[1024];
	va_list ap;
	char *sql;
	int rc;

	va_start(ap, fmt);
	sql = vformat(fmt, ap);
	va_end(ap);
	rc = pgsql_exec(c, sql, err, sizeof(err));
	if (rc != 0)
		fail_sql("SQL failed: ", err, sql);
	free(sql);
}

int harness_pg_try_exec(PGconn *c, char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	char *sql;
	int rc;

	va_start(ap, fmt);
	sql = vformat(fmt, ap);
	va_end(ap);
	rc = pgsql_exec(c, sql, err, errlen);
	free(sql);
	return rc;
}

int64_t harness_pg_int(PGconn *c, const char *fmt, ...)
{
	char err[1024];
	va_list ap;
	char *sql;
	int64_t v;

	va_start(ap, fmt);
	sql = vformat(fmt, ap);
	va_end(ap);
	if (pgsql_int(c, sql, &v, err, sizeof(err)) != 0)
		fail_sql("", err, sql);
	free(sql);
	return v;
}

char *harness_pg_string(PGconn *c, const char *fmt, ...)
{
	char err[1024], *sql, *s;
	va_list ap;

	va_start(ap, fmt);
	sql = vformat(fmt, ap);
	va_end(ap);
	if (pgsql_string(c, sql, &s, err, sizeof(err)) != 0)
		fail_sql("", err, sql);
	free(sql);
	return s;
}

int64_t harness_wakeup_holders(PGconn *c, const char *table)
{
	return harness_pg_int(c,
	                      "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
	                      " AND classid = %s AND objid = '%s'::regclass::oid AND granted"
	                      " AND mode = 'ExclusiveLock'",
	                      STORE_WAKEUP_LOCK_CLASS, table);
}

/* ---- bulk insert with COPY ---- */

struct copybuf {
	char *p;
	size_t len, cap;
};

static void cb_put(struct copybuf *b, const char *s, size_t n)
{
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 1 << 16;

		while (b->len + n + 1 > cap)
			cap *= 2;
		b->p = realloc(b->p, cap);
		cr_assert_not_null(b->p);
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
}

/* COPY text format: backslash, tab, newline and carriage return need escapes; NULL is \N. */
static void cb_field(struct copybuf *b, const char *s, bool last)
{
	if (s == NULL) {
		cb_put(b, "\\N", 2);
	} else {
		for (const char *p = s; *p; p++) {
			switch (*p) {
			case '\\':
				cb_put(b, "\\\\", 2);
				break;
			case '\t':
				cb_put(b, "\\t", 2);
				break;
			case '\n':
				cb_put(b, "\\n", 2);
				break;
			case '\r':
				cb_put(b, "\\r", 2);
				break;
			default:
				cb_put(b, p, 1);
				break;
			}
		}
	}
	cb_put(b, last ? "\n" : "\t", 1);
}

static void copy_flush(PGconn *c, struct copybuf *b)
{
	if (b->len == 0)
		return;
	cr_assert(PQputCopyData(c, b->p, (int)b->len) == 1, "COPY data failed: %s",
	          PQerrorMessage(c));
	b->len = 0;
}

void harness_insert_rows(PGconn *c, const char *table, size_t n, const char *exchange,
                         const char *routing_key, const char *id_prefix, harness_row_fn gen,
                         void *arg)
{
	struct copybuf b = { 0 };
	char sql[512], idbuf[128], bodybuf[200];
	PGresult *res;

	harness_pg_exec(c, "BEGIN");
	snprintf(sql, sizeof(sql),
	         "COPY %s (id, exchange_name, routing_key, body, body_encoding, content_type, "
	         "headers, properties, ordering_key) FROM STDIN",
	         table);
	res = PQexec(c, sql);
	cr_assert(PQresultStatus(res) == PGRES_COPY_IN, "COPY failed: %s", PQerrorMessage(c));
	PQclear(res);
	for (size_t i = 0; i < n; i++) {
		struct outbox_row row = { .exchange = exchange, .routing_key = routing_key };

		if (gen)
			gen(i, &row, arg);
		snprintf(idbuf, sizeof(idbuf), "%s-%07zu", id_prefix ? id_prefix : "m", i);
		snprintf(bodybuf, sizeof(bodybuf), "{\"n\":%zu,\"id\":\"%s\"}", i, idbuf);
		cb_field(&b, row.id ? row.id : idbuf, false);
		cb_field(&b, row.exchange ? row.exchange : "", false);
		cb_field(&b, row.routing_key ? row.routing_key : "", false);
		cb_field(&b, row.body ? row.body : bodybuf, false);
		cb_field(&b, row.body_encoding ? row.body_encoding : "utf-8", false);
		cb_field(&b, row.content_type ? row.content_type : "application/json", false);
		cb_field(&b, row.headers ? row.headers : "{}", false);
		cb_field(&b, row.properties ? row.properties : "{}", false);
		cb_field(&b, row.ordering_key, true);
		if (b.len > (1 << 20))
			copy_flush(c, &b);
	}
	copy_flush(c, &b);
	free(b.p);
	cr_assert(PQputCopyEnd(c, NULL) == 1, "COPY end failed: %s", PQerrorMessage(c));
	res = PQgetResult(c);
	cr_assert(PQresultStatus(res) == PGRES_COMMAND_OK, "COPY into %s failed: %s", table,
	          PQerrorMessage(c));
	PQclear(res);
	while ((res = PQgetResult(c)) != NULL)
		PQclear(res);
	harness_pg_exec(c, "COMMIT");
}

/* ---- the row source under test ---- */

const char *harness_source(void)
{
	const char *v = getenv("RELAY_TEST_SOURCE");

	if (v == NULL || v[0] == '\0')
		return "lease";
	cr_assert(strcmp(v, "lease") == 0 || strcmp(v, "cursor") == 0,
	          "RELAY_TEST_SOURCE is '%s': lease or cursor", v);
	return v;
}

bool harness_source_is_cursor(void)
{
	return strcmp(harness_source(), "cursor") == 0;
}

/* A few buffers in turn, so that one statement may use several conditions. */
#define COND_BUFS 4
#define COND_MAX  512

const char *harness_unpublished(const char *table)
{
	static char bufs[COND_BUFS][COND_MAX];
	static unsigned next;
	char *b = bufs[next++ % COND_BUFS];
	int n;

	if (!harness_source_is_cursor())
		return "published_at IS NULL";
	/* The cursor writes nothing into a row it publishes on its main path: a row is
	 * published when the position covers it and it was not set aside (deferred), or when
	 * the exception path marked it. No position row yet: nothing was published that way. */
	n = snprintf(b, COND_MAX,
	             "(published_at IS NULL AND (deferred_at IS NOT NULL OR seq > coalesce("
	             "(SELECT position FROM %s_position WHERE stream = 'main'), 0)))",
	             table);
	cr_assert(n > 0 && n < COND_MAX, "table name too long: %s", table);
	return b;
}

const char *harness_published(const char *table)
{
	static char bufs[COND_BUFS][COND_MAX + 16];
	static unsigned next;
	char *b = bufs[next++ % COND_BUFS];

	if (!harness_source_is_cursor())
		return "published_at IS NOT NULL";
	snprintf(b, COND_MAX + 16, "NOT %s", harness_unpublished(table));
	return b;
}

int64_t harness_unpublished_count(PGconn *c, const char *table)
{
	return harness_pg_int(c, "SELECT count(*) FROM %s WHERE %s", table,
	                      harness_unpublished(table));
}

int64_t harness_cursor_position(PGconn *c, const char *table)
{
	return harness_pg_int(c,
	                      "SELECT coalesce((SELECT position FROM %s_position"
	                      " WHERE stream = 'main'), -1)",
	                      table);
}

char *harness_cursor_leader(PGconn *c, const char *table)
{
	return harness_pg_string(c, "SELECT leader FROM %s_position WHERE stream = 'main'", table);
}

/* ---- processes ---- */

/* The relay's clean environment (process_env_relay()) with this test's servers and row
 * source (RELAY_TEST_SOURCE, before extra: a test that names OUTBOX_RELAY_SOURCE wins). */
static void build_env(struct process_env *e, const char *table, const char *const *extra)
{
	const char *pg = harness_pg_conninfo(), *amqp = harness_amqp_url();
	const char *merged[PROCESS_ENV_MAX + 1];
	char source[64];
	size_t n = 0;

	snprintf(source, sizeof(source), "OUTBOX_RELAY_SOURCE=%s", harness_source());
	merged[n++] = source;
	for (const char *const *p = extra; p && *p; p++) {
		cr_assert_lt(n, PROCESS_ENV_MAX, "more than %d variables", PROCESS_ENV_MAX);
		merged[n++] = *p;
	}
	merged[n] = NULL;
	cr_assert_eq(process_env_relay(e, pg, amqp, table, merged), 0,
	             "could not build the environment (more than %d variables, or one too long)",
	             PROCESS_ENV_MAX);
}

/* process_spawn() with stdout/stderr to the given files (err_path NULL = same as out). Every
 * process the harness starts ends with the test process (see bench/drive/process.h). */
static pid_t spawn(char *const argv[], char *const envp[], const char *out_path,
                   const char *err_path)
{
	int out, err, err_no;
	pid_t pid;

	out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	cr_assert(out >= 0, "cannot open %s: %s", out_path, strerror(errno));
	err = err_path ? open(err_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : out;
	cr_assert(err >= 0, "cannot open %s: %s", err_path, strerror(errno));
	pid = process_spawn(argv, envp, out, err);
	err_no = errno;
	close(out);
	if (err != out)
		close(err);
	cr_assert(pid > 0, "cannot start %s: %s", argv[0], strerror(err_no));
	return pid;
}

/* Waits for pid up to timeout_ms; returns the decoded status or -1 while still running. */
static int wait_pid(pid_t pid, int64_t timeout_ms)
{
	int st = process_wait(pid, timeout_ms, NULL);

	cr_assert(st != -2, "waitpid failed: %s", strerror(errno));
	return st;
}

static void log_dir(char *buf, size_t len)
{
	snprintf(buf, len, "relay-logs");
	if (mkdir(buf, 0755) != 0 && errno != EEXIST)
		cr_assert_fail("cannot create %s: %s", buf, strerror(errno));
}

/* Starts bin with argv[1..] = args (first_arg, when not NULL, before them) and the relay's
 * clean environment plus env; output to ./relay-logs/<log_name>-<pid>-<n>.log. */
static struct harness_relay *start_process(const char *bin, const char *first_arg,
                                           const char *const *args, const char *log_name,
                                           const char *table, const char *const *env)
{
	static unsigned seq;
	struct harness_relay *r = calloc(1, sizeof(*r));
	char *argv[32];
	struct process_env e = { 0 };
	char dir[64];
	int argc = 0;

	cr_assert_not_null(r);
	log_dir(dir, sizeof(dir));
	snprintf(r->table, sizeof(r->table), "%s", table ? table : "");
	snprintf(r->log_path, sizeof(r->log_path), "%s/%s-%ld-%u.log", dir, log_name,
	         (long)getpid(), ++seq);
	argv[argc++] = (char *)bin;
	if (first_arg)
		argv[argc++] = (char *)first_arg;
	for (const char *const *p = args; p && *p; p++) {
		cr_assert(argc < 30, "too many arguments");
		argv[argc++] = (char *)*p;
	}
	argv[argc] = NULL;
	build_env(&e, table, env);
	r->pid = spawn(argv, e.v, r->log_path, NULL);
	process_env_free(&e);
	return r;
}

struct harness_relay *harness_relay_start(const char *table, const char *const *env,
                                          const char *const *args)
{
	return start_process(harness_relay_bin(), args ? NULL : "run", args,
	                     table ? table : "relay", table, env);
}

struct harness_relay *harness_program_start(const char *bin, const char *const *args,
                                            const char *const *env, const char *log_name)
{
	return start_process(bin, NULL, args, log_name, NULL, env);
}

int harness_relay_wait(struct harness_relay *r, int64_t timeout_ms)
{
	int st;

	if (r->exited)
		return r->status;
	st = wait_pid(r->pid, timeout_ms);
	if (st >= 0) {
		r->exited = true;
		r->status = st;
	}
	return st;
}

void harness_relay_finish(struct harness_relay *r, const char *name)
{
	int st;

	if (r == NULL)
		return;
	if (!r->exited) {
		st = harness_relay_stop(r, SIGTERM, 30000);
		if (st != 0)
			harness_relay_dump_log(r);
		cr_expect_eq(st, 0, "%s exited with %d at the end of the test", name, st);
	}
	harness_relay_free(r);
}

int harness_relay_stop(struct harness_relay *r, int sig, int64_t timeout_ms)
{
	if (!r->exited)
		kill(r->pid, sig);
	return harness_relay_wait(r, timeout_ms);
}

void harness_relay_kill(struct harness_relay *r)
{
	if (r->exited)
		return;
	kill(r->pid, SIGKILL);
	harness_relay_wait(r, 30000);
}

void harness_relay_free(struct harness_relay *r)
{
	if (r == NULL)
		return;
	harness_relay_kill(r);
	free(r);
}

static char *read_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	char *s = NULL;
	size_t len = 0, cap = 0, n;

	if (f == NULL) {
		s = strdup("");
		cr_assert_not_null(s);
		return s;
	}
	do {
		if (cap - len < 4096) {
			cap = cap ? cap * 2 : 8192;
			s = realloc(s, cap);
			cr_assert_not_null(s);
		}
		n = fread(s + len, 1, cap - len - 1, f);
		len += n;
	} while (n > 0);
	fclose(f);
	s[len] = '\0';
	return s;
}

char *harness_read_file(const char *path)
{
	cr_assert_eq(access(path, R_OK), 0, "cannot open %s", path);
	return read_file(path);
}

void harness_source_path(char *buf, size_t n, const char *rel)
{
	const char *data = getenv("RELAY_TEST_DATA");

	cr_assert_not_null(data, "RELAY_TEST_DATA is not set (ctest sets it)");
	snprintf(buf, n, "%s/../../%s", data, rel);
}

char *harness_read_source(const char *rel)
{
	char path[4096];

	harness_source_path(path, sizeof(path), rel);
	return harness_read_file(path);
}

char *harness_relay_log(const struct harness_relay *r)
{
	return read_file(r->log_path);
}

int harness_relay_log_count(const struct harness_relay *r, const char *needle)
{
	char *log = harness_relay_log(r);
	char *line = log;
	int count = 0;

	while (line && *line) {
		char *nl = strchr(line, '\n');

		if (nl)
			*nl = '\0';
		if (strstr(line, needle))
			count++;
		line = nl ? nl + 1 : NULL;
	}
	free(log);
	return count;
}

char *harness_relay_log_line(const struct harness_relay *r, const char *needle)
{
	char *log = harness_relay_log(r);
	char *line = log ? strstr(log, needle) : NULL;
	char *copy = NULL;
	bool found = line != NULL;

	if (found) {
		while (line > log && line[-1] != '\n')
			line--;
		copy = strndup(line, strcspn(line, "\n"));
	}
	free(log);
	cr_assert(!found || copy, "out of memory");
	return copy;
}

bool harness_relay_wait_log(const struct harness_relay *r, const char *needle, int64_t timeout_ms)
{
	int64_t deadline = harness_now_ms() + timeout_ms;

	for (;;) {
		if (harness_relay_log_count(r, needle) > 0)
			return true;
		if (harness_now_ms() >= deadline)
			return false;
		harness_sleep_ms(50);
	}
}

void harness_relay_dump_log(const struct harness_relay *r)
{
	char *log = harness_relay_log(r);
	size_t len = strlen(log);
	const char *tail = len > 6000 ? log + len - 6000 : log;

	cr_log_error("relay log %s (last %zu bytes):\n%s", r->log_path, strlen(tail), tail);
	free(log);
}

void harness_migrate(const char *table)
{
	struct harness_output o;

	harness_cli(&o, table, NULL, "migrate", (const char *)NULL);
	cr_assert_eq(o.status, 0, "outbox-relay migrate for %s exited %d:\n%s%s", table, o.status,
	             o.out, o.err);
	harness_output_free(&o);
}

/* Runs argv with envp to completion, its stdout and stderr into *o. */
static void run_to_completion(struct harness_output *o, char *const argv[], char *const envp[])
{
	static unsigned seq;
	char out_path[256], err_path[256], dir[64];
	pid_t pid;

	log_dir(dir, sizeof(dir));
	snprintf(out_path, sizeof(out_path), "%s/cli-%ld-%u.out", dir, (long)getpid(), ++seq);
	snprintf(err_path, sizeof(err_path), "%s/cli-%ld-%u.err", dir, (long)getpid(), seq);
	pid = spawn(argv, envp, out_path, err_path);
	o->status = wait_pid(pid, 60000);
	if (o->status < 0)
		process_kill(pid);
	o->out = read_file(out_path);
	o->err = read_file(err_path);
	unlink(out_path);
	unlink(err_path);
}

void harness_cli(struct harness_output *o, const char *table, const char *const *env, ...)
{
	char *argv[32];
	struct process_env e = { 0 };
	va_list ap;
	int argc = 0;
	const char *a;

	argv[argc++] = (char *)harness_relay_bin();
	va_start(ap, env);
	while ((a = va_arg(ap, const char *)) != NULL) {
		cr_assert(argc < 30, "too many arguments");
		argv[argc++] = (char *)a;
	}
	va_end(ap);
	argv[argc] = NULL;
	build_env(&e, table, env);
	run_to_completion(o, argv, e.v);
	process_env_free(&e);
}

void harness_cli_bare(struct harness_output *o, const char *const *env, const char *const *args)
{
	static const char *const keep[] = { "PATH", "ASAN_OPTIONS", "UBSAN_OPTIONS", "TSAN_OPTIONS",
		                            NULL };
	struct process_env e = { 0 };
	char *argv[32];
	int argc = 0;

	argv[argc++] = (char *)harness_relay_bin();
	for (; args[argc - 1]; argc++) {
		cr_assert(argc < 30, "too many arguments");
		argv[argc] = (char *)args[argc - 1];
	}
	argv[argc] = NULL;
	for (int i = 0; keep[i]; i++)
		if (getenv(keep[i]))
			cr_assert_eq(process_env_setf(&e, keep[i], getenv(keep[i])), 0);
	for (int i = 0; env && env[i]; i++)
		cr_assert_eq(process_env_set(&e, env[i]), 0);
	run_to_completion(o, argv, e.v);
	process_env_free(&e);
}

void harness_output_free(struct harness_output *o)
{
	free(o->out);
	free(o->err);
	o->out = o->err = NULL;
}

/* ---- service control ---- */

int harness_shell(const char *fmt, ...)
{
	va_list ap;
	char *cmd;
	char *argv[] = { "/bin/sh", "-c", NULL, NULL };
	char out_path[128], dir[64];
	static unsigned seq;
	pid_t pid;
	int st;

	va_start(ap, fmt);
	cmd = vformat(fmt, ap);
	va_end(ap);
	argv[2] = cmd;
	log_dir(dir, sizeof(dir));
	snprintf(out_path, sizeof(out_path), "%s/shell-%ld-%u.out", dir, (long)getpid(), ++seq);
	pid = spawn(argv, environ, out_path, NULL);
	st = wait_pid(pid, 180000);
	if (st < 0)
		process_kill(pid);
	if (st != 0) {
		char *out = read_file(out_path);

		cr_log_error("command '%s' exited %d:\n%s", cmd, st, out);
		free(out);
	}
	unlink(out_path);
	free(cmd);
	return st;
}

void harness_broker_stop_app(void)
{
	cr_assert_eq(harness_shell("%s stop_app", harness_require_env("RELAY_TEST_RABBITMQCTL")), 0,
	             "rabbitmqctl stop_app failed");
}

void harness_broker_start_app(void)
{
	cr_assert_eq(harness_shell("%s start_app", harness_require_env("RELAY_TEST_RABBITMQCTL")),
	             0, "rabbitmqctl start_app failed");
}

void harness_broker_node_stop(void)
{
	cr_assert_eq(harness_shell("%s", harness_require_env("RELAY_TEST_RABBITMQ_STOP")), 0,
	             "stopping the RabbitMQ node failed");
}

void harness_broker_node_start(void)
{
	cr_assert_eq(harness_shell("%s", harness_require_env("RELAY_TEST_RABBITMQ_START")), 0,
	             "starting the RabbitMQ node failed");
}

void harness_pg_restart(void)
{
	PGconn *c;

	cr_assert_eq(harness_shell("%s restart -m fast -w -t 60",
	                           harness_require_env("RELAY_TEST_PG_CTL")),
	             0, "pg_ctl restart failed");
	c = harness_pg_connect_retry(30000);
	cr_assert_not_null(c, "PostgreSQL does not accept connections after the restart");
	PQfinish(c);
}
