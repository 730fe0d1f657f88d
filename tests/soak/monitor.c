/* The soak's samplers: every relay process's resident memory (VmRSS) every 2 s, judged per
 * process life at the end, and the age of the oldest unpublished good row every 5 s, judged
 * against the pending bound whenever no fault has been active for a while. */
#include "tests/soak/soak.h"

#include <inttypes.h>
#include <libpq-fe.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/support/harness.h"

#define MAX_LIVES        256
#define RSS_EVERY_MS     2000
#define PENDING_EVERY_MS 5000
/* RSS check: lives shorter than this are not judged, the first RSS_WARMUP_MS of a life are
 * left out (connections, first batches, allocator pools), the median of the last third of
 * what remains may exceed the median of the first third by RSS_GROW_PCT % + RSS_GROW_KB.
 * With the cursor source a relay publishes only once it leads the table (a standby waits,
 * with a smaller working set): its warm-up begins when it first took the lead. */
#define RSS_MIN_LIFE_MS 60000
#define RSS_WARMUP_MS   20000
#define RSS_GROW_PCT    20
#define RSS_GROW_KB     2048
/* A relay that made a big poison row dead read it whole: libpq's input buffer and the
 * relay's batch buffer keep that size, and the allocator keeps the freed result's block. */
#define BIG_ROW_FACTOR 3

struct life {
	int slot;
	pid_t pid;
	char log_path[512];
	int64_t start_ms, end_ms; /* end -1 while it runs */
	int64_t start_wall_ms;    /* start_ms as CLOCK_REALTIME, to place the log's times */
	long *rss_kb;
	int64_t *at_ms;
	size_t n, cap;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct life lives[MAX_LIVES];
static size_t n_lives;

static pthread_t rss_thread, pending_thread;
static atomic_bool stop;
static char conninfo[1024], table_name[128];
static double max_oldest, max_oldest_clear;

int soak_life_begin(int slot, pid_t pid, const char *log_path)
{
	struct timespec ts;
	int n;

	pthread_mutex_lock(&mu);
	if (n_lives == MAX_LIVES)
		abort(); /* a restart every few seconds for hours */
	n = (int)n_lives++;
	lives[n].slot = slot;
	lives[n].pid = pid;
	snprintf(lives[n].log_path, sizeof(lives[n].log_path), "%s", log_path);
	lives[n].start_ms = soak_ms();
	clock_gettime(CLOCK_REALTIME, &ts);
	lives[n].start_wall_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
	lives[n].end_ms = -1;
	pthread_mutex_unlock(&mu);
	return n;
}

void soak_life_end(int n)
{
	pthread_mutex_lock(&mu);
	lives[n].end_ms = soak_ms();
	pthread_mutex_unlock(&mu);
}

long soak_life_rss(int n)
{
	long v = 0;

	pthread_mutex_lock(&mu);
	if (lives[n].n > 0)
		v = lives[n].rss_kb[lives[n].n - 1];
	pthread_mutex_unlock(&mu);
	return v;
}

/* VmRSS of pid in kB, -1 when it cannot be read (the process is gone). */
static long read_rss(pid_t pid)
{
	char path[64], line[256];
	long kb = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%ld/status", (long)pid);
	if ((f = fopen(path, "r")) == NULL)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, "VmRSS:", 6) == 0) {
			kb = strtol(line + 6, NULL, 10);
			break;
		}
	}
	fclose(f);
	return kb;
}

static void add_sample(struct life *l, long kb, int64_t at)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 256;

		l->rss_kb = realloc(l->rss_kb, cap * sizeof(*l->rss_kb));
		l->at_ms = realloc(l->at_ms, cap * sizeof(*l->at_ms));
		if (l->rss_kb == NULL || l->at_ms == NULL)
			abort();
		l->cap = cap;
	}
	l->rss_kb[l->n] = kb;
	l->at_ms[l->n] = at;
	l->n++;
}

static void *rss_main(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop)) {
		pthread_mutex_lock(&mu);
		for (size_t i = 0; i < n_lives; i++) {
			struct life *l = &lives[i];
			long kb;

			if (l->end_ms >= 0)
				continue;
			/* A pid read after the life ended could be a reused one; the life is ended
			 * (under mu) before its process is signalled. */
			kb = read_rss(l->pid);
			if (kb > 0)
				add_sample(l, kb, soak_ms());
		}
		pthread_mutex_unlock(&mu);
		harness_sleep_ms(RSS_EVERY_MS);
	}
	return NULL;
}

static PGconn *connect_quiet(void)
{
	PGconn *c = PQconnectdb(conninfo);

	if (PQstatus(c) != CONNECTION_OK) {
		PQfinish(c);
		return NULL;
	}
	return c;
}

/* One sample of the table; false when the database did not answer (restarting). */
static bool sample_pending(PGconn *c)
{
	char sql[2048], pos[256];
	PGresult *res;
	int64_t pending, leased, dead, good_dead, position;
	double oldest;
	bool active;
	int64_t last_end, now;

	/* The cursor's position, for the status line. */
	if (soak_cursor())
		snprintf(pos, sizeof(pos),
		         "(SELECT position FROM %s_position WHERE stream = 'main')", table_name);
	else
		snprintf(pos, sizeof(pos), "NULL::bigint");
	/* Unpublished rows only, as the source under test records them: with the lease source
	 * the partial index over them serves this on any table size; the cursor's rows are
	 * read whole (one sequential scan of the soak's table every 5 s). */
	snprintf(sql, sizeof(sql),
	         "SELECT count(*) FILTER (WHERE attempts < %d),"
	         " count(*) FILTER (WHERE attempts < %d AND locked_until >= now()),"
	         " count(*) FILTER (WHERE attempts >= %d),"
	         " count(*) FILTER (WHERE attempts >= %d AND id NOT LIKE 'poison-%%'),"
	         " coalesce(extract(epoch FROM now() - min(created_at)"
	         "   FILTER (WHERE id NOT LIKE 'poison-%%')), 0),"
	         " coalesce(%s, -1)"
	         " FROM %s WHERE %s",
	         SOAK_MAX_ATTEMPTS, SOAK_MAX_ATTEMPTS, SOAK_MAX_ATTEMPTS, SOAK_MAX_ATTEMPTS, pos,
	         table_name, soak_unpublished());
	res = PQexec(c, sql);
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		PQclear(res);
		return false;
	}
	pending = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
	leased = strtoll(PQgetvalue(res, 0, 1), NULL, 10);
	dead = strtoll(PQgetvalue(res, 0, 2), NULL, 10);
	good_dead = strtoll(PQgetvalue(res, 0, 3), NULL, 10);
	oldest = strtod(PQgetvalue(res, 0, 4), NULL);
	position = strtoll(PQgetvalue(res, 0, 5), NULL, 10);
	PQclear(res);
	soak_status_pending(pending, leased, dead, oldest, position);
	if (good_dead > 0)
		soak_fail(CHECK_GOOD_DEAD, "%" PRId64 " good rows are dead", good_dead);
	soak_fault_state(&active, &last_end);
	now = soak_ms();
	if (oldest > max_oldest)
		max_oldest = oldest;
	if (!active && now - last_end >= SOAK_PENDING_CLEAR_MS) {
		if (oldest > max_oldest_clear)
			max_oldest_clear = oldest;
		if (oldest * 1000.0 > SOAK_PENDING_BOUND_MS)
			soak_fail(CHECK_PENDING,
			          "a good row has waited %.1f s unpublished, %.1f s after the last "
			          "fault ended",
			          oldest, (double)(now - last_end) / 1000.0);
	}
	return true;
}

static void *pending_main(void *arg)
{
	PGconn *c = NULL;

	(void)arg;
	while (!atomic_load(&stop)) {
		if (c == NULL || PQstatus(c) != CONNECTION_OK) {
			PQfinish(c);
			c = connect_quiet();
		}
		if (c != NULL && !sample_pending(c)) {
			PQfinish(c);
			c = NULL;
		}
		for (int i = 0; i < PENDING_EVERY_MS / 100 && !atomic_load(&stop); i++)
			harness_sleep_ms(100);
	}
	PQfinish(c);
	return NULL;
}

void soak_samplers_start(const char *pg, const char *table)
{
	snprintf(conninfo, sizeof(conninfo), "%s", pg);
	snprintf(table_name, sizeof(table_name), "%s", table);
	atomic_init(&stop, false);
	if (pthread_create(&rss_thread, NULL, rss_main, NULL) != 0 ||
	    pthread_create(&pending_thread, NULL, pending_main, NULL) != 0)
		abort();
}

void soak_samplers_stop(void)
{
	atomic_store(&stop, true);
	pthread_join(rss_thread, NULL);
	pthread_join(pending_thread, NULL);
}

void soak_pending_max(double *overall_s, double *clear_s)
{
	*overall_s = max_oldest;
	*clear_s = max_oldest_clear;
}

/* kB of big poison rows this relay read, from its log's dead-row lines. */
static long big_rows_read_kb(const char *log_path)
{
	FILE *f = fopen(log_path, "r");
	char line[2048];
	long kb = 0;

	if (f == NULL)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		if (strstr(line, "msg=\"message is dead") == NULL)
			continue;
		if (strstr(line, "-big_body"))
			kb += 5 * 1024;
		else if (strstr(line, "-big_headers"))
			kb += 200;
	}
	fclose(f);
	return kb;
}

/* When the life first took the table's lead (the cursor source's "leading the table" line),
 * on the soak clock; -1 when its log has no such line (the lease source, or a standby). */
static int64_t first_lead_ms(const struct life *l)
{
	FILE *f = fopen(l->log_path, "r");
	char line[2048];
	int64_t at = -1;

	if (f == NULL)
		return -1;
	while (at < 0 && fgets(line, sizeof(line), f)) {
		struct tm tm = { 0 };
		int ms;

		if (strstr(line, "msg=\"leading the table\"") == NULL ||
		    sscanf(line, "ts=%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
		           &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &ms) != 7)
			continue;
		tm.tm_year -= 1900;
		tm.tm_mon -= 1;
		at = l->start_ms + ((int64_t)timegm(&tm) * 1000 + ms - l->start_wall_ms);
	}
	fclose(f);
	return at;
}

static int cmp_long(const void *a, const void *b)
{
	long x = *(const long *)a, y = *(const long *)b;

	return (x > y) - (x < y);
}

static long median(const long *v, size_t n)
{
	long *s = malloc(n * sizeof(*s));
	long m;

	if (s == NULL)
		abort();
	memcpy(s, v, n * sizeof(*s));
	qsort(s, n, sizeof(*s), cmp_long);
	m = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
	free(s);
	return m;
}

void soak_rss_report(const char *csv_path)
{
	FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;

	printf("\nRSS per relay process life (kB; judged when it lived >= %d s: median of the last "
	       "third vs the first third after a %d s warm-up, bound +%d %% + %d kB, + %d x the "
	       "big poison rows the relay's log says it made dead + 1 MiB; led_s: when it first "
	       "led the table, the cursor's, where its warm-up begins)\n",
	       RSS_MIN_LIFE_MS / 1000, RSS_WARMUP_MS / 1000, RSS_GROW_PCT, RSS_GROW_KB,
	       BIG_ROW_FACTOR);
	printf("  %-5s %-4s %-8s %-9s %-7s %-9s %-9s %-9s %-9s %s\n", "life", "slot", "pid",
	       "lived_s", "led_s", "first", "last", "med_1/3", "med_3/3", "verdict");
	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < n_lives; i++) {
		struct life *l = &lives[i];
		int64_t end = l->end_ms >= 0 ? l->end_ms : soak_ms();
		int64_t lived = end - l->start_ms, warm = l->start_ms, lead = first_lead_ms(l);
		size_t from = 0, third;
		long m1 = 0, m3 = 0;
		const char *verdict = "short";
		char led[16] = "-";

		if (lead >= 0)
			snprintf(led, sizeof(led), "%.0f", (double)lead / 1000.0);
		if (l->n == 0) {
			printf("  %-5zu %-4d %-8ld %-9.0f %-7s %-9s %-9s %-9s %-9s no samples\n", i,
			       l->slot, (long)l->pid, (double)lived / 1000.0, led, "-", "-", "-",
			       "-");
			continue;
		}
		if (lead > warm)
			warm = lead;
		while (from < l->n && l->at_ms[from] - warm < RSS_WARMUP_MS)
			from++;
		third = (l->n - from) / 3;
		if (lived >= RSS_MIN_LIFE_MS && third >= 2) {
			long bound;

			long allow = 0;

			m1 = median(l->rss_kb + from, third);
			m3 = median(l->rss_kb + l->n - third, third);
			long big = big_rows_read_kb(l->log_path);

			if (big > 0)
				allow = BIG_ROW_FACTOR * big + 1024;
			bound = m1 + m1 * RSS_GROW_PCT / 100 + RSS_GROW_KB + allow;
			verdict = m3 <= bound ? (allow ? "ok (big row allowed)" : "ok") : "GREW";
			if (m3 > bound)
				soak_fail(CHECK_RSS,
				          "relay slot %d pid %ld: RSS median %ld kB in the last "
				          "third of "
				          "its life, %ld kB in the first (bound %ld kB)",
				          l->slot, (long)l->pid, m3, m1, bound);
		}
		/* "first" is the first sample after the warm-up: before it the process may still
		 * be starting (even be the harness's fork before exec). */
		printf("  %-5zu %-4d %-8ld %-9.0f %-7s %-9ld %-9ld %-9ld %-9ld %s\n", i, l->slot,
		       (long)l->pid, (double)lived / 1000.0, led, l->rss_kb[from < l->n ? from : 0],
		       l->rss_kb[l->n - 1], m1, m3, verdict);
	}
	if (csv) {
		fprintf(csv, "life,slot,pid,t_ms,rss_kb\n");
		for (size_t i = 0; i < n_lives; i++)
			for (size_t k = 0; k < lives[i].n; k++)
				fprintf(csv, "%zu,%d,%ld,%" PRId64 ",%ld\n", i, lives[i].slot,
				        (long)lives[i].pid, lives[i].at_ms[k], lives[i].rss_kb[k]);
		fclose(csv);
	}
	pthread_mutex_unlock(&mu);
	fflush(stdout);
}
