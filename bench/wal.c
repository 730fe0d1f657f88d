/* The WAL of a stretch of work (wal.h): LSNs and pg_stat_wal read over libpq, the range kept
 * by a temporary replication slot and broken down by record type with pg_waldump. */
#include "bench/wal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/db.h"
#include "bench/drive/pgsql.h"
#include "bench/drive/process.h"

#define WAL_DUMP_MAX   (256 * 1024) /* bytes of pg_waldump output kept (about 60 lines) */
#define WAL_DUMP_MS    300000       /* pg_waldump's bound: a 1 GB range takes seconds */
#define WAL_MAX_TYPES  256          /* record types of one breakdown (PostgreSQL has ~150) */
#define WAL_WRITTEN_MS 5000         /* how long the end of a range may take to be written */
#define WAL_PAGE       8192         /* XLOG_BLCKSZ: a page header may end a range */

extern char **environ;

/* "X/Y" (hex) into an LSN; 0 when it is not one. */
static uint64_t parse_lsn(const char *s)
{
	unsigned long long hi, lo;
	char *end;

	errno = 0;
	hi = strtoull(s, &end, 16);
	if (errno || end == s || *end != '/')
		return 0;
	s = end + 1;
	lo = strtoull(s, &end, 16);
	if (errno || end == s || *end || lo > 0xffffffffULL)
		return 0;
	return (uint64_t)hi << 32 | lo;
}

static void format_lsn(uint64_t lsn, char *out, size_t len)
{
	snprintf(out, len, "%" PRIX64 "/%" PRIX64, lsn >> 32, lsn & 0xffffffffU);
}

void wal_hold(PGconn *c, char *slot, size_t len)
{
	static int seq;
	char sql[256];

	snprintf(slot, len, "outbox_bench_%ld_%d", (long)getpid(), ++seq);
	/* immediately_reserve: held from now, not from the first client; temporary: gone with
	 * the session if the benchmark dies before it drops it. */
	snprintf(sql, sizeof(sql), "SELECT pg_create_physical_replication_slot('%s', true, true)",
	         slot);
	if (pgsql_exec(c, sql, NULL, 0) != 0)
		slot[0] = '\0';
}

void wal_release(PGconn *c, const char *slot)
{
	char sql[256];

	if (!slot[0])
		return;
	snprintf(sql, sizeof(sql), "SELECT pg_drop_replication_slot('%s')", slot);
	/* Nothing to do on an error: the slot is temporary and goes with the session. */
	if (pgsql_exec(c, sql, NULL, 0) != 0)
		return;
}

/* The LSN that `sql` returns; 0 when it cannot be read. */
static uint64_t query_lsn(PGconn *c, const char *sql)
{
	char *s = NULL;
	uint64_t lsn = 0;

	if (pgsql_string(c, sql, &s, NULL, 0) == 0 && s)
		lsn = parse_lsn(s);
	free(s);
	return lsn;
}

void wal_mark_lsn(PGconn *c, struct wal_point *p)
{
	p->lsn = query_lsn(c, "SELECT pg_current_wal_insert_lsn()::text");
}

void wal_mark_stats(PGconn *c, struct wal_point *p)
{
	PGresult *r;

	p->records = p->fpi = p->bytes = -1;
	/* This backend's own counts reach the statistics when it goes idle, at most once a
	 * second unless forced. Forcing came with PostgreSQL 15; before, they may lag. */
	if (pgsql_exec(c, "SELECT pg_stat_force_next_flush()", NULL, 0) != 0 &&
	    PQserverVersion(c) >= 150000)
		return;
	r = PQexec(c, "SELECT wal_records, wal_fpi, wal_bytes::bigint FROM pg_stat_wal");
	if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) {
		long long v[3];
		bool ok = true;

		for (int i = 0; i < 3 && ok; i++) {
			char *end;
			const char *s = PQgetvalue(r, 0, i);

			errno = 0;
			v[i] = strtoll(s, &end, 10);
			ok = !errno && end != s && !*end;
		}
		if (ok) {
			p->records = v[0];
			p->fpi = v[1];
			p->bytes = v[2];
		}
	}
	PQclear(r);
}

/* pg_waldump of the server c is connected to; 0 with its path in out, -1 with why. Beside
 * pg_ctl first (RELAY_TEST_PG_CTL may be tests/services.sh's wrapper script: then beside the
 * pg_ctl it runs), then the Debian place for the server's major version. */
static int find_waldump(PGconn *c, char *out, size_t len, char *why, size_t whylen)
{
	const char *ctl = getenv("RELAY_TEST_PG_CTL");
	char buf[4096];
	const char *slash;
	int64_t num;

	if (ctl && (slash = strrchr(ctl, '/')) != NULL) {
		FILE *f;

		snprintf(out, len, "%.*s/pg_waldump", (int)(slash - ctl), ctl);
		if (access(out, X_OK) == 0)
			return 0;
		f = fopen(ctl, "r");
		if (f) {
			size_t got = fread(buf, 1, sizeof(buf) - 1, f);
			const char *p = buf;

			fclose(f);
			buf[got] = '\0';
			while ((p = strstr(p, "/pg_ctl")) != NULL) {
				const char *start = p;

				while (start > buf && !strchr(" \t\n\"'=", start[-1]))
					start--;
				snprintf(out, len, "%.*s/pg_waldump", (int)(p - start), start);
				if (p > start && access(out, X_OK) == 0)
					return 0;
				p += 7;
			}
		}
	}
	if (pgsql_int(c, "SHOW server_version_num", &num, NULL, 0) == 0) {
		snprintf(out, len, "/usr/lib/postgresql/%" PRId64 "/bin/pg_waldump", num / 10000);
		if (access(out, X_OK) == 0)
			return 0;
	}
	snprintf(why, whylen, "pg_waldump not found (beside RELAY_TEST_PG_CTL or in %s)",
	         "/usr/lib/postgresql/<major>/bin");
	return -1;
}

/* Runs argv with stdout and stderr into a new buffer (free()); NULL with why on any error.
 * Its exit status is not looked at: pg_waldump prints its statistics even when it stops on
 * a record cut by the end of the range. */
static char *run_capture(char *const argv[], char *why, size_t whylen)
{
	int fds[2];
	pid_t pid;
	char *out = malloc(WAL_DUMP_MAX + 1);
	size_t got = 0;
	int64_t deadline = bench_mono_us() + (int64_t)WAL_DUMP_MS * 1000;
	int st;

	if (!out || pipe2(fds, O_CLOEXEC) != 0) {
		snprintf(why, whylen, "%s", out ? strerror(errno) : "out of memory");
		free(out);
		return NULL;
	}
	pid = process_spawn(argv, environ, fds[1], fds[1]);
	close(fds[1]);
	if (pid < 0) {
		snprintf(why, whylen, "could not start %s: %s", argv[0], strerror(errno));
		close(fds[0]);
		free(out);
		return NULL;
	}
	for (;;) {
		struct pollfd pf = { fds[0], POLLIN, 0 };
		char tmp[4096];
		ssize_t n;

		if (bench_mono_us() > deadline || bench_interrupted()) {
			snprintf(why, whylen, "pg_waldump did not finish within %d s",
			         WAL_DUMP_MS / 1000);
			process_kill(pid);
			close(fds[0]);
			free(out);
			return NULL;
		}
		if (poll(&pf, 1, 200) <= 0)
			continue;
		n = read(fds[0], tmp, sizeof(tmp));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		if (got < WAL_DUMP_MAX) {
			size_t take =
			        (size_t)n < WAL_DUMP_MAX - got ? (size_t)n : WAL_DUMP_MAX - got;

			memcpy(out + got, tmp, take);
			got += take;
		}
	}
	close(fds[0]);
	st = process_wait(pid, 10000, NULL);
	if (st == -1)
		process_kill(pid);
	out[got] = '\0';
	return out;
}

static int by_bytes(const void *a, const void *b)
{
	const struct wal_type *x = a, *y = b;

	return (x->bytes < y->bytes) - (x->bytes > y->bytes);
}

/* One row of pg_waldump --stats=record: "Heap/INSERT  N (pct)  rec (pct)  fpi (pct)
 * combined (pct)" (a percentage may hold spaces: "( 26.57)"). v gets the four counts. */
static bool parse_stats_row(const char *row, char *name, size_t name_len, unsigned long long v[4])
{
	const char *p = row + strspn(row, " \t");
	size_t k = strcspn(p, " \t");
	char *end;

	if (k == 0 || k >= name_len)
		return false;
	memcpy(name, p, k);
	name[k] = '\0';
	p += k;
	for (int i = 0; i < 4; i++) {
		p += strspn(p, " \t");
		if (*p < '0' || *p > '9')
			return false;
		errno = 0;
		v[i] = strtoull(p, &end, 10);
		if (errno)
			return false;
		p = end + strspn(end, " \t");
		if (*p != '(' || (p = strchr(p, ')')) == NULL)
			return false;
		p++;
	}
	return true;
}

/* The end of the range in "WAL statistics between A and B:", or 0 when row is not that
 * line. */
static uint64_t stats_range_end(const char *row)
{
	static const char head[] = "WAL statistics between ";
	const char *and;
	char lsn[32];
	size_t k;

	if (strncmp(row, head, sizeof(head) - 1) != 0 ||
	    (and = strstr(row + sizeof(head) - 1, " and ")) == NULL)
		return 0;
	and += 5;
	k = strspn(and, "0123456789ABCDEFabcdef/");
	if (k == 0 || k >= sizeof(lsn))
		return 0;
	memcpy(lsn, and, k);
	lsn[k] = '\0';
	return parse_lsn(lsn);
}

/* Reads pg_waldump --stats=record's rows ("Heap/INSERT  N (pct)  rec (pct)  fpi (pct)
 * combined (pct)") into w->types per message, largest first. None when it printed no rows or
 * stopped before `to` (a segment it could not read: its statistics then cover only part of
 * the range); its first error line goes into why then. */
static void parse_dump(const char *text, uint64_t to, long n, struct wal_cost *w)
{
	struct wal_type *all = calloc(WAL_MAX_TYPES, sizeof(*all));
	int n_all = 0;
	const char *line = text;
	double other_count = 0, other_bytes = 0;
	uint64_t read_to = 0;
	char err[160] = "";

	if (!all) {
		snprintf(w->why, sizeof(w->why), "out of memory");
		return;
	}
	while (*line) {
		const char *eol = strchr(line, '\n');
		size_t len = eol ? (size_t)(eol - line) : strlen(line);
		char row[512], name[64];
		unsigned long long v[4]; /* count, record bytes, fpi bytes, combined bytes */
		uint64_t end;

		snprintf(row, sizeof(row), "%.*s", (int)(len < sizeof(row) ? len : sizeof(row) - 1),
		         line);
		if (parse_stats_row(row, name, sizeof(name), v) && strchr(name, '/') &&
		    n_all < WAL_MAX_TYPES) {
			snprintf(all[n_all].name, sizeof(all[n_all].name), "%s", name);
			all[n_all].count = (double)v[0] / (double)n;
			all[n_all].bytes = (double)v[3] / (double)n;
			n_all++;
		} else if ((end = stats_range_end(row)) != 0) {
			read_to = end;
		} else if (!err[0] && strstr(row, "error")) {
			snprintf(err, sizeof(err), "%.150s", row);
		}
		line += len + (eol ? 1 : 0);
	}
	if (n_all == 0) {
		snprintf(w->why, sizeof(w->why), "%s", err[0] ? err : "pg_waldump printed no rows");
		free(all);
		return;
	}
	/* The last record read ends at `to`, or a page header before it. */
	if (read_to + WAL_PAGE < to) {
		char a[32], z[32];

		format_lsn(read_to, a, sizeof(a));
		format_lsn(to, z, sizeof(z));
		snprintf(w->why, sizeof(w->why), "pg_waldump read up to %s of %s only: %.100s", a,
		         z, err[0] ? err : "?");
		free(all);
		return;
	}
	w->why[0] = '\0';
	qsort(all, (size_t)n_all, sizeof(*all), by_bytes);
	for (int i = 0; i < n_all; i++) {
		if (i < WAL_TOP) {
			w->types[w->n_types++] = all[i];
		} else {
			other_count += all[i].count;
			other_bytes += all[i].bytes;
		}
	}
	if (n_all > WAL_TOP) {
		snprintf(w->types[w->n_types].name, sizeof(w->types[0].name), "other");
		w->types[w->n_types].count = other_count;
		w->types[w->n_types].bytes = other_bytes;
		w->n_types++;
	}
	free(all);
}

/* pg_waldump --stats=record over from .. to into w (n messages). */
static void breakdown(PGconn *c, uint64_t from, uint64_t to, long n, struct wal_cost *w)
{
	const char *data = getenv("RELAY_TEST_PG_DATA");
	char tool[4096], dir[4096], s[32], e[32], *text;
	char *argv[] = { tool, "--stats=record", "-s", s, "-e", e, "-p", dir, NULL };
	int64_t deadline = bench_mono_us() + (int64_t)WAL_WRITTEN_MS * 1000;

	if (!data || !data[0]) {
		snprintf(w->why, sizeof(w->why), "RELAY_TEST_PG_DATA is not set");
		return;
	}
	if (find_waldump(c, tool, sizeof(tool), w->why, sizeof(w->why)) != 0)
		return;
	/* The range ends at an insert position; what was inserted is written to the segment
	 * files shortly after (by the WAL writer, or by the next commit). */
	while (query_lsn(c, "SELECT pg_current_wal_lsn()::text") < to && !bench_interrupted() &&
	       bench_mono_us() < deadline)
		bench_sleep_ms(20);
	snprintf(dir, sizeof(dir), "%s/pg_wal", data);
	format_lsn(from, s, sizeof(s));
	format_lsn(to, e, sizeof(e));
	text = run_capture(argv, w->why, sizeof(w->why));
	if (!text)
		return;
	parse_dump(text, to, n, w);
	free(text);
}

void wal_cost(PGconn *c, const struct wal_point *a, const struct wal_point *z, long n, bool dump,
              struct wal_cost *w)
{
	memset(w, 0, sizeof(*w));
	w->dumped = dump;
	w->bytes = w->records = w->fpi = w->stat_bytes = NAN;
	if (n <= 0) {
		snprintf(w->why, sizeof(w->why), "no messages");
		return;
	}
	if (a->records >= 0 && z->records >= 0) {
		w->records = (double)(z->records - a->records) / (double)n;
		w->fpi = (double)(z->fpi - a->fpi) / (double)n;
		w->stat_bytes = (double)(z->bytes - a->bytes) / (double)n;
	}
	if (!a->lsn || !z->lsn || z->lsn < a->lsn) {
		snprintf(w->why, sizeof(w->why), "the insert LSN could not be read");
		return;
	}
	w->bytes = (double)(z->lsn - a->lsn) / (double)n;
	if (dump)
		breakdown(c, a->lsn, z->lsn, n, w);
}

/* The decimals that show v to two significant digits, min at least: whole bytes read best
 * for a writer per row, but a writer per batch (the cursor source) writes a fraction of a
 * byte and of a record per message, which would print as 0. */
static int decimals(double v, int min)
{
	double a = fabs(v);
	int d;

	if (a == 0 || isnan(a) || a >= 10)
		return min;
	d = (int)ceil(-log10(a)) + 1;
	if (d > 6)
		d = 6;
	return d > min ? d : min;
}

void wal_print(const char *what, const char *unit, const char *note, const struct wal_cost *w)
{
	printf("%s: wal per %s%s%s%s: ", what, unit, note ? " (" : "", note ? note : "",
	       note ? ")" : "");
	if (isnan(w->bytes))
		printf("?");
	else
		printf("%.*f B", decimals(w->bytes, 0), w->bytes);
	if (isnan(w->records))
		printf(" (pg_stat_wal unavailable)\n");
	else
		printf(", %.*f records, %.3f fpi (pg_stat_wal %.*f B)\n", decimals(w->records, 2),
		       w->records, w->fpi, decimals(w->stat_bytes, 0), w->stat_bytes);
	if (!w->dumped)
		return;
	printf("%s: wal per %s by record (pg_waldump): ", what, unit);
	if (w->n_types == 0) {
		printf("unavailable (%s)\n", w->why[0] ? w->why : "?");
		return;
	}
	for (int i = 0; i < w->n_types; i++)
		printf("%s%s %.*f B %.*f", i ? ", " : "", w->types[i].name,
		       decimals(w->types[i].bytes, 0), w->types[i].bytes,
		       decimals(w->types[i].count, 2), w->types[i].count);
	printf("\n");
}

int wal_insert_probe(struct bench *b, const char *what, long n, struct wal_cost *w)
{
	const char *table = "bench_walins";
	PGconn *c = db_open(b, what);
	char slot[64] = "", err[512], id[48], body[BENCH_BODY_LEN + 1];
	const char *params[3];
	struct wal_point a, z;
	int rc = -1;

	if (!c)
		return -1;
	if (db_table_fresh(b, c, what, table) != 0)
		goto out;
	if (db_prepare_insert(c, "ins", table, err, sizeof(err)) != 0) {
		bench_fail(b, what, "prepare: %s", err);
		goto out;
	}
	memset(body, 'x', BENCH_BODY_LEN);
	body[BENCH_BODY_LEN] = '\0';
	params[1] = table;
	params[2] = body;
	wal_hold(c, slot, sizeof(slot));
	wal_mark_stats(c, &a);
	wal_mark_lsn(c, &a);
	for (long i = 0; i < n; i++) {
		PGresult *r;

		if (bench_interrupted()) {
			bench_fail(b, what, "interrupted");
			goto out;
		}
		snprintf(id, sizeof(id), "w%ld", i + 1);
		params[0] = id;
		r = PQexecPrepared(c, "ins", 3, params, NULL, NULL, 0);
		if (PQresultStatus(r) != PGRES_COMMAND_OK) {
			bench_fail(b, what, "insert: %s", PQerrorMessage(c));
			PQclear(r);
			goto out;
		}
		PQclear(r);
	}
	wal_mark_lsn(c, &z);
	wal_mark_stats(c, &z);
	wal_cost(c, &a, &z, n, true, w);
	rc = 0;
out:
	wal_release(c, slot);
	db_table_drop(c, table);
	PQfinish(c);
	return rc;
}
