/* The soak's ledger: every row the producers committed, every delivery the consumer saw and
 * every fault injected, and the checks over them (per-key order, duplicates explained by a
 * fault, phantoms, losses, recovery time), continuously on a thread of its own and once more
 * against the table at the end. No criterion here: failures are counted and printed. */
#include "tests/soak/soak.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/support/harness.h"

#define CHUNK_ROWS   65536
#define MAX_CHUNKS   1024
#define MAX_FAULTS   8192
#define MAX_POISON   8192
#define FAIL_PRINTED 20
/* A delivered id no producer has recorded as committed yet waits this long (its producer may
 * be finding out whether an interrupted COMMIT went through) before it counts as a phantom. */
#define PHANTOM_WAIT_MS 120000
#define STATUS_EVERY_MS 10000

const char *const soak_fault_names[SOAK_N_FAULTS] = {
	"relay_kill", "relay_term", "broker_app",  "broker_node", "mem_alarm",
	"pg_restart", "proxy_drop", "proxy_stall", "poison",
};

const char *const soak_check_names[SOAK_N_CHECKS] = {
	"lost",    "order", "duplicate",    "pending_age", "poison",          "good_row_dead",
	"phantom", "rss",   "sigterm_exit", "relay_died",  "cursor_position", "harness",
};

/* Expected last_error pieces, as the fault tests assert them. */
const struct soak_poison_def soak_poison_defs[POISON_N] = {
	{ "big_headers", "headers: encoded size" },
	{ "big_body", "exceed the broker's max_message_size" },
	{ "bad_base64", "body: invalid base64 at offset" },
	{ "bad_encoding", "body_encoding: unknown encoding 'utf-16'" },
	{ "headers_not_object", "headers: not a JSON object" },
	{ "properties_not_object", "properties: not a JSON object" },
	{ "unknown_property", "properties: unknown property 'colour'" },
	{ "priority_12", "properties: priority must be an integer 0-9, got 12" },
	{ "expiration_abc", "properties: expiration must be a string of digits" },
	{ "missing_exchange", "not found" },
	{ "unroutable", "unroutable: exchange" },
};

/* ---- clock and output ---- */

static int64_t t0_ms;
static pthread_mutex_t say_mu = PTHREAD_MUTEX_INITIALIZER;

void soak_clock_start(void)
{
	t0_ms = harness_now_ms();
}

int64_t soak_ms(void)
{
	return harness_now_ms() - t0_ms;
}

int64_t soak_clock_from(int64_t mono_ms)
{
	return mono_ms - t0_ms;
}

static void vsay(const char *fmt, va_list ap) __attribute__((format(printf, 1, 0)));

static void vsay(const char *fmt, va_list ap)
{
	int64_t t = soak_ms();

	pthread_mutex_lock(&say_mu);
	printf("[%7" PRId64 ".%03" PRId64 "] ", t / 1000, t % 1000);
	vprintf(fmt, ap);
	putchar('\n');
	fflush(stdout);
	pthread_mutex_unlock(&say_mu);
}

void soak_say(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsay(fmt, ap);
	va_end(ap);
}

static atomic_size_t failures[SOAK_N_CHECKS];

void soak_fail(enum soak_check c, const char *fmt, ...)
{
	size_t n = atomic_fetch_add(&failures[c], 1);
	char line[1024];
	va_list ap;

	if (n >= FAIL_PRINTED)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	soak_say("CHECK FAILED %s: %s%s", soak_check_names[c], line,
	         n + 1 == FAIL_PRINTED ? " (further failures of this check are only counted)" : "");
}

size_t soak_failures(enum soak_check c)
{
	return atomic_load(&failures[c]);
}

size_t soak_failures_total(void)
{
	size_t n = 0;

	for (int c = 0; c < SOAK_N_CHECKS; c++)
		n += atomic_load(&failures[c]);
	return n;
}

/* ---- shared state, all under mu ---- */

struct fault_rec {
	enum soak_fault kind;
	int64_t start_ms, end_ms; /* end -1 while active */
};

struct key_state {
	int64_t last_first_seq; /* seq of the key's latest first delivery */
	int64_t *waiting;       /* seqs committed and not delivered yet */
	size_t n_waiting, cap_waiting;
};

struct poison_rec {
	char id[64];
	enum soak_poison kind;
	uint32_t deliveries;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct soak_row *chunks[SOAK_MAX_PRODUCERS][MAX_CHUNKS];
static uint64_t n_rows[SOAK_MAX_PRODUCERS];
static struct fault_rec faults[MAX_FAULTS];
static size_t n_faults;
static struct key_state keys[SOAK_MAX_KEYS];
static struct poison_rec poison[MAX_POISON];
static size_t n_poison;
static size_t committed_total, committed_keyed, delivered_unique, deliveries_total;
static size_t duplicates_total, poison_delivered;
static size_t dup_by_kind[SOAK_N_FAULTS];
static size_t lost_final, stuck_final;
static int64_t st_pending = -1, st_leased = -1, st_dead = -1, st_position = -1;
static double st_oldest;

static struct soak_row *row_at(int p, uint64_t n)
{
	if (p < 0 || p >= SOAK_MAX_PRODUCERS || n >= n_rows[p])
		return NULL;
	return &chunks[p][n / CHUNK_ROWS][n % CHUNK_ROWS];
}

void soak_row_id(char *buf, size_t len, int p, uint64_t n)
{
	snprintf(buf, len, "p%d-%08" PRIu64, p, n);
}

/* "p<P>-<n>" to its row; NULL when id is not a producer's or not reserved. */
static struct soak_row *row_of(const char *id)
{
	char *end;
	long p;
	unsigned long long n;

	if (id[0] != 'p' || id[1] < '0' || id[1] > '9')
		return NULL;
	errno = 0;
	p = strtol(id + 1, &end, 10);
	if (errno || *end != '-')
		return NULL;
	n = strtoull(end + 1, &end, 10);
	if (errno || *end != '\0')
		return NULL;
	return row_at((int)p, n);
}

uint64_t soak_rows_reserve(int p, size_t n, const int16_t *key)
{
	uint64_t first;

	pthread_mutex_lock(&mu);
	first = n_rows[p];
	for (size_t i = 0; i < n; i++) {
		uint64_t k = first + i;
		struct soak_row *r;

		if (chunks[p][k / CHUNK_ROWS] == NULL) {
			if (k / CHUNK_ROWS >= MAX_CHUNKS ||
			    !(chunks[p][k / CHUNK_ROWS] =
			              calloc(CHUNK_ROWS, sizeof(struct soak_row))))
				abort(); /* 67 M rows a producer: far beyond any run */
		}
		r = &chunks[p][k / CHUNK_ROWS][k % CHUNK_ROWS];
		r->key = key[i];
		r->first_ms = -1;
	}
	n_rows[p] = first + n;
	pthread_mutex_unlock(&mu);
	return first;
}

static void key_wait_add(struct key_state *k, int64_t seq)
{
	if (k->n_waiting == k->cap_waiting) {
		size_t cap = k->cap_waiting ? k->cap_waiting * 2 : 64;

		k->waiting = realloc(k->waiting, cap * sizeof(*k->waiting));
		if (k->waiting == NULL)
			abort();
		k->cap_waiting = cap;
	}
	k->waiting[k->n_waiting++] = seq;
}

void soak_rows_committed(int p, uint64_t first, size_t n, const int64_t *seqs, int64_t commit_ms)
{
	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < n; i++) {
		struct soak_row *r = row_at(p, first + i);

		r->seq = seqs[i];
		r->commit_ms = commit_ms;
		r->committed = true;
		committed_total++;
		if (r->key >= 0) {
			committed_keyed++;
			/* Delivered before its producer heard COMMIT return: the checker waits for
			 * this record before it looks at the delivery, so it is not delivered yet. */
			key_wait_add(&keys[r->key], r->seq);
		}
	}
	pthread_mutex_unlock(&mu);
}

void soak_poison_add(const char *id, enum soak_poison k)
{
	pthread_mutex_lock(&mu);
	if (n_poison < MAX_POISON) {
		snprintf(poison[n_poison].id, sizeof(poison[n_poison].id), "%s", id);
		poison[n_poison].kind = k;
		n_poison++;
	}
	pthread_mutex_unlock(&mu);
}

/* ---- faults ---- */

static const char *fault_detail_fmt(char *buf, size_t len, const char *fmt, va_list ap)
        __attribute__((format(printf, 3, 0)));

static const char *fault_detail_fmt(char *buf, size_t len, const char *fmt, va_list ap)
{
	vsnprintf(buf, len, fmt, ap);
	return buf;
}

int soak_fault_begin(enum soak_fault kind, const char *fmt, ...)
{
	char detail[256];
	va_list ap;
	int n;

	va_start(ap, fmt);
	fault_detail_fmt(detail, sizeof(detail), fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&mu);
	if (n_faults == MAX_FAULTS)
		abort(); /* one fault every few seconds: days of soak */
	n = (int)n_faults++;
	faults[n].kind = kind;
	faults[n].start_ms = soak_ms();
	faults[n].end_ms = -1;
	pthread_mutex_unlock(&mu);
	soak_say("fault %d start %s %s", n, soak_fault_names[kind], detail);
	return n;
}

void soak_fault_end(int n, const char *fmt, ...)
{
	char detail[256];
	int64_t start, end = soak_ms();
	va_list ap;

	va_start(ap, fmt);
	fault_detail_fmt(detail, sizeof(detail), fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&mu);
	faults[n].end_ms = end;
	start = faults[n].start_ms;
	pthread_mutex_unlock(&mu);
	soak_say("fault %d end   %s after %.1f s %s", n, soak_fault_names[faults[n].kind],
	         (double)(end - start) / 1000.0, detail);
}

void soak_fault_state(bool *active, int64_t *last_end_ms)
{
	pthread_mutex_lock(&mu);
	*active = n_faults > 0 && faults[n_faults - 1].end_ms < 0;
	*last_end_ms = n_faults > 0 ? faults[n_faults - 1].end_ms : -1;
	pthread_mutex_unlock(&mu);
}

size_t soak_fault_count(enum soak_fault kind)
{
	size_t n = 0;

	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < n_faults; i++)
		n += faults[i].kind == kind;
	pthread_mutex_unlock(&mu);
	return n;
}

/* The latest fault that may explain a second delivery at t2 of a row first delivered at t1:
 * it began before t2 and had not ended lease + slack before t1 (the row was claimed at most
 * a lease before its first publish). -1 when none. Under mu. */
static int explaining_fault(int64_t t1, int64_t t2)
{
	for (size_t i = n_faults; i-- > 0;) {
		const struct fault_rec *f = &faults[i];

		if (f->start_ms > t2)
			continue;
		if (f->end_ms < 0 || f->end_ms >= t1 - SOAK_LEASE_MS - SOAK_DUP_SLACK_MS)
			return (int)i;
	}
	return -1;
}

/* ---- the checker ---- */

struct checker {
	pthread_t thread;
	struct consumer *cons;
	atomic_bool stop;
	uint64_t next; /* next delivery to look at */
	int64_t last_status_ms;
	size_t last_committed, last_delivered;
};

static struct checker chk;

/* Removes seq from the key's waiting list; returns the smallest seq left waiting below it
 * (-1 none): a row of the key committed before this one that has not arrived yet. */
static int64_t key_deliver(struct key_state *k, int64_t seq)
{
	int64_t below = -1;

	for (size_t i = 0; i < k->n_waiting; i++) {
		if (k->waiting[i] == seq) {
			k->waiting[i--] = k->waiting[--k->n_waiting];
			continue;
		}
		if (k->waiting[i] < seq && (below < 0 || k->waiting[i] < below))
			below = k->waiting[i];
	}
	return below;
}

static struct poison_rec *poison_of(const char *id)
{
	for (size_t i = 0; i < n_poison; i++) {
		if (strcmp(poison[i].id, id) == 0)
			return &poison[i];
	}
	return NULL;
}

/* Looks at one delivery; false when it must wait (its row is not recorded yet). Under mu. */
static bool check_delivery(const char *id, int64_t at, uint64_t idx, bool final)
{
	struct soak_row *r = row_of(id);
	struct poison_rec *pr;

	if (r == NULL || !r->committed) {
		if (r != NULL && !final && soak_ms() - at < PHANTOM_WAIT_MS)
			return false;
		if ((pr = poison_of(id)) != NULL) {
			pr->deliveries++;
			poison_delivered++;
			soak_fail(CHECK_POISON, "poison row %s (%s) was delivered", id,
			          soak_poison_defs[pr->kind].name);
		} else {
			soak_fail(CHECK_PHANTOM, "%s delivered at %.3f s but never committed", id,
			          (double)at / 1000.0);
		}
		deliveries_total++;
		return true;
	}
	deliveries_total++;
	r->deliveries++;
	if (r->deliveries == 1) {
		r->first_ms = at;
		r->first_idx = idx;
		delivered_unique++;
		if (r->key >= 0) {
			struct key_state *k = &keys[r->key];
			int64_t below = key_deliver(k, r->seq);

			if (r->seq <= k->last_first_seq)
				soak_fail(CHECK_ORDER,
				          "key k%02d: %s (seq %" PRId64
				          ") arrived at %.3f s after seq "
				          "%" PRId64 " of the same key",
				          r->key, id, r->seq, (double)at / 1000.0,
				          k->last_first_seq);
			else if (below >= 0)
				soak_fail(CHECK_ORDER,
				          "key k%02d: %s (seq %" PRId64
				          ") arrived at %.3f s before seq "
				          "%" PRId64 " of the same key, committed earlier",
				          r->key, id, r->seq, (double)at / 1000.0, below);
			if (r->seq > k->last_first_seq)
				k->last_first_seq = r->seq;
		}
		return true;
	}
	duplicates_total++;
	{
		int f = explaining_fault(r->first_ms, at);

		if (f >= 0)
			dup_by_kind[faults[f].kind]++;
		else
			soak_fail(CHECK_DUPLICATE,
			          "%s delivered again at %.3f s (first at %.3f s) with no fault "
			          "between "
			          "%.3f s and then",
			          id, (double)at / 1000.0, (double)r->first_ms / 1000.0,
			          (double)(r->first_ms - SOAK_LEASE_MS - SOAK_DUP_SLACK_MS) /
			                  1000.0);
	}
	return true;
}

/* Follows the consumer from chk.next on; final = no more waiting for records. */
static void checker_pass(bool final)
{
	enum { BATCH = 4096 };
	static const char *ids[BATCH];
	static int64_t at[BATCH];

	for (;;) {
		size_t n = consumer_deliveries(chk.cons, chk.next, ids, at, BATCH), done = 0;

		pthread_mutex_lock(&mu);
		for (; done < n; done++) {
			if (!check_delivery(ids[done], soak_clock_from(at[done]), chk.next, final))
				break;
			chk.next++;
		}
		pthread_mutex_unlock(&mu);
		if (done < n || n < BATCH)
			break;
	}
}

static void status_line(void)
{
	size_t c, u, d, dups, poisons;
	int64_t pend, leased, dead, position;
	double oldest;
	char pos[48] = "";
	int64_t now = soak_ms();
	double secs = (double)(now - chk.last_status_ms) / 1000.0;

	pthread_mutex_lock(&mu);
	c = committed_total;
	u = delivered_unique;
	d = deliveries_total;
	dups = duplicates_total;
	poisons = n_poison;
	pend = st_pending;
	leased = st_leased;
	dead = st_dead;
	oldest = st_oldest;
	position = st_position;
	pthread_mutex_unlock(&mu);
	if (soak_cursor())
		snprintf(pos, sizeof(pos), " position=%" PRId64, position);
	soak_say("status committed=%zu (%.0f/s) delivered=%zu (%.0f/s) in_flight=%zu "
	         "deliveries=%zu duplicates=%zu poison=%zu pending=%" PRId64 " leased=%" PRId64
	         " dead=%" PRId64 "%s oldest_pending=%.1fs failed_checks=%zu",
	         c, secs > 0 ? (double)(c - chk.last_committed) / secs : 0.0, u,
	         secs > 0 ? (double)(u - chk.last_delivered) / secs : 0.0, c > u ? c - u : 0, d,
	         dups, poisons, pend, leased, dead, pos, oldest, soak_failures_total());
	chk.last_status_ms = now;
	chk.last_committed = c;
	chk.last_delivered = u;
}

static void *checker_main(void *arg)
{
	(void)arg;
	while (!atomic_load(&chk.stop)) {
		checker_pass(false);
		if (soak_ms() - chk.last_status_ms >= STATUS_EVERY_MS)
			status_line();
		harness_sleep_ms(100);
	}
	checker_pass(false);
	checker_pass(true);
	status_line();
	return NULL;
}

void soak_checker_start(struct consumer *c, int producers)
{
	(void)producers;
	for (int k = 0; k < SOAK_MAX_KEYS; k++)
		keys[k].last_first_seq = -1;
	chk.cons = c;
	atomic_init(&chk.stop, false);
	chk.last_status_ms = soak_ms();
	if (pthread_create(&chk.thread, NULL, checker_main, NULL) != 0)
		abort();
}

void soak_checker_stop(void)
{
	atomic_store(&chk.stop, true);
	pthread_join(chk.thread, NULL);
}

void soak_status_pending(int64_t pending, int64_t leased, int64_t dead, double oldest_s,
                         int64_t position)
{
	pthread_mutex_lock(&mu);
	st_pending = pending;
	st_leased = leased;
	st_dead = dead;
	st_oldest = oldest_s;
	st_position = position;
	pthread_mutex_unlock(&mu);
}

/* ---- totals ---- */

void soak_totals(struct soak_totals *t)
{
	memset(t, 0, sizeof(*t));
	pthread_mutex_lock(&mu);
	t->committed = committed_total;
	t->committed_keyed = committed_keyed;
	t->delivered_unique = delivered_unique;
	t->deliveries = deliveries_total;
	t->duplicates = duplicates_total;
	t->lost = lost_final;
	t->stuck = stuck_final;
	t->poison = n_poison;
	t->poison_delivered = poison_delivered;
	memcpy(t->dup_by_kind, dup_by_kind, sizeof(dup_by_kind));
	pthread_mutex_unlock(&mu);
}

bool soak_all_delivered(size_t *missing)
{
	size_t m;

	pthread_mutex_lock(&mu);
	m = committed_total - delivered_unique;
	pthread_mutex_unlock(&mu);
	*missing = m;
	return m == 0;
}

int soak_recovery(int64_t worst_by_kind[SOAK_N_FAULTS], int64_t *worst_ms)
{
	int worst = -1;

	*worst_ms = -1;
	for (int k = 0; k < SOAK_N_FAULTS; k++)
		worst_by_kind[k] = -1;
	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < n_faults; i++) {
		const struct fault_rec *f = &faults[i];
		int64_t first = -1, rec;

		if (f->end_ms < 0)
			continue;
		for (int p = 0; p < SOAK_MAX_PRODUCERS; p++) {
			for (uint64_t n = 0; n < n_rows[p]; n++) {
				const struct soak_row *r = row_at(p, n);

				if (r->committed && r->commit_ms >= f->start_ms &&
				    r->first_ms >= f->end_ms && (first < 0 || r->first_ms < first))
					first = r->first_ms;
			}
		}
		if (first < 0) {
			/* Nothing committed after it arrived: only the end of the run can do that
			 * (producers stopped); it says nothing about recovery. */
			if (worst_by_kind[f->kind] == -1)
				worst_by_kind[f->kind] = -2;
			continue;
		}
		rec = first - f->end_ms;
		if (rec > worst_by_kind[f->kind])
			worst_by_kind[f->kind] = rec;
		if (rec > *worst_ms) {
			*worst_ms = rec;
			worst = (int)i;
		}
	}
	pthread_mutex_unlock(&mu);
	return worst;
}

/* ---- the final comparison with the table ---- */

static PGresult *query(PGconn *pg, const char *sql)
{
	PGresult *res = PQexec(pg, sql);

	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		soak_fail(CHECK_HARNESS, "final query failed: %s", PQerrorMessage(pg));
		PQclear(res);
		return NULL;
	}
	return res;
}

/* Keyed rows in the table, key by key in seq order, against each key's first deliveries. */
static void final_order(PGconn *pg, const char *table)
{
	char sql[512];
	PGresult *res;
	int n;
	int prev_key = -1;
	uint64_t prev_idx = 0;
	size_t checked = 0;

	snprintf(sql, sizeof(sql),
	         "SELECT id, ordering_key, seq FROM %s WHERE ordering_key IS NOT NULL"
	         " AND id NOT LIKE 'poison-%%' ORDER BY ordering_key, seq",
	         table);
	if ((res = query(pg, sql)) == NULL)
		return;
	n = PQntuples(res);
	pthread_mutex_lock(&mu);
	for (int i = 0; i < n; i++) {
		const char *id = PQgetvalue(res, i, 0);
		const struct soak_row *r = row_of(id);
		int key = (int)strtol(PQgetvalue(res, i, 1) + 1, NULL, 10);

		if (r == NULL || !r->committed) {
			soak_fail(CHECK_PHANTOM,
			          "%s is in the table, its producer never saw it commit", id);
			continue;
		}
		if (r->key != key || r->seq != strtoll(PQgetvalue(res, i, 2), NULL, 10))
			soak_fail(CHECK_HARNESS, "%s: key or seq differ from what the producer saw",
			          id);
		if (r->first_ms < 0)
			continue; /* lost: counted by the loss check */
		/* Within a key, first deliveries must come in seq order. */
		if (key == prev_key && r->first_idx < prev_idx)
			soak_fail(CHECK_ORDER,
			          "key k%02d: %s (seq %s) was first delivered before the row "
			          "before it in seq order",
			          key, id, PQgetvalue(res, i, 2));
		prev_key = key;
		prev_idx = r->first_idx;
		checked++;
	}
	pthread_mutex_unlock(&mu);
	PQclear(res);
	soak_say("final: %zu keyed rows compared with the table's seq order, key by key", checked);
}

/* Committed rows that never arrived: lost when the table says published (or has no such
 * row), stuck when it still holds them unpublished (the relays did not get to them before
 * the drain ended: a liveness failure, not a loss). */
static void final_undelivered(PGconn *pg, const char *table)
{
	char sql[1024], id[32];
	PGresult *res;
	int n;

	snprintf(sql, sizeof(sql), "SELECT id FROM %s WHERE %s AND id NOT LIKE 'poison-%%'", table,
	         soak_unpublished());
	if ((res = query(pg, sql)) == NULL)
		return;
	n = PQntuples(res);
	pthread_mutex_lock(&mu);
	for (int i = 0; i < n; i++) {
		struct soak_row *r = row_of(PQgetvalue(res, i, 0));

		if (r)
			r->unpublished_at_end = true;
	}
	for (int p = 0; p < SOAK_MAX_PRODUCERS; p++) {
		for (uint64_t k = 0; k < n_rows[p]; k++) {
			const struct soak_row *r = row_at(p, k);

			if (!r->committed || r->deliveries > 0)
				continue;
			soak_row_id(id, sizeof(id), p, k);
			if (r->unpublished_at_end) {
				stuck_final++;
				soak_fail(CHECK_PENDING,
				          "%s (key %d, seq %" PRId64 ") committed at %.3f s, still "
				          "unpublished when the drain ended",
				          id, r->key, r->seq, (double)r->commit_ms / 1000.0);
			} else {
				lost_final++;
				soak_fail(CHECK_LOST,
				          "%s (key %d, seq %" PRId64 ") committed at %.3f s, never "
				          "delivered, and the table has it published or not at all",
				          id, r->key, r->seq, (double)r->commit_ms / 1000.0);
			}
		}
	}
	pthread_mutex_unlock(&mu);
	PQclear(res);
	soak_say("final: committed and never delivered: %zu lost, %zu stuck unpublished",
	         lost_final, stuck_final);
}

static void final_rows(PGconn *pg, const char *table)
{
	char sql[2048];
	PGresult *res;
	long long in_table, unpublished, dead, charged;
	size_t committed;

	snprintf(sql, sizeof(sql),
	         "SELECT count(*), count(*) FILTER (WHERE %s),"
	         " count(*) FILTER (WHERE %s AND attempts >= %d),"
	         " count(*) FILTER (WHERE attempts > 0) FROM %s WHERE id NOT LIKE 'poison-%%'",
	         soak_unpublished(), soak_unpublished(), SOAK_MAX_ATTEMPTS, table);
	if ((res = query(pg, sql)) == NULL)
		return;
	in_table = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
	unpublished = strtoll(PQgetvalue(res, 0, 1), NULL, 10);
	dead = strtoll(PQgetvalue(res, 0, 2), NULL, 10);
	charged = strtoll(PQgetvalue(res, 0, 3), NULL, 10);
	PQclear(res);
	pthread_mutex_lock(&mu);
	committed = committed_total;
	pthread_mutex_unlock(&mu);
	if ((size_t)in_table != committed)
		soak_fail(CHECK_PHANTOM,
		          "the table holds %lld good rows, the producers committed %zu", in_table,
		          committed);
	if (dead > 0)
		soak_fail(CHECK_GOOD_DEAD, "%lld good rows are dead", dead);
	soak_say("final: table good_rows=%lld unpublished=%lld dead=%lld charged_an_attempt=%lld",
	         in_table, unpublished, dead, charged);
}

/* Poison rows end dead: unpublished, max_attempts charged, last_error saying why; with the
 * cursor each one is also set aside (deferred), which is where its exception path and the
 * operator tools find it. */
static void final_poison(PGconn *pg, const char *table)
{
	char sql[1024];
	PGresult *res;
	int n;
	size_t ok = 0;

	snprintf(sql, sizeof(sql),
	         "SELECT id, attempts, %s, coalesce(last_error, ''), %s"
	         " FROM %s WHERE id LIKE 'poison-%%'",
	         soak_published(), soak_cursor() ? "deferred_at IS NOT NULL" : "true", table);
	if ((res = query(pg, sql)) == NULL)
		return;
	n = PQntuples(res);
	pthread_mutex_lock(&mu);
	if ((size_t)n != n_poison)
		soak_fail(CHECK_POISON, "%d poison rows in the table, %zu inserted", n, n_poison);
	for (int i = 0; i < n; i++) {
		const char *id = PQgetvalue(res, i, 0);
		long attempts = strtol(PQgetvalue(res, i, 1), NULL, 10);
		bool published = PQgetvalue(res, i, 2)[0] == 't';
		const char *err = PQgetvalue(res, i, 3);
		bool deferred = PQgetvalue(res, i, 4)[0] == 't';
		const struct poison_rec *p = poison_of(id);

		if (p == NULL) {
			soak_fail(CHECK_POISON, "%s: not a poison row the soak inserted", id);
			continue;
		}
		if (published || !deferred || attempts < SOAK_MAX_ATTEMPTS ||
		    strstr(err, soak_poison_defs[p->kind].error) == NULL) {
			soak_fail(CHECK_POISON,
			          "%s (%s): published=%d%s attempts=%ld last_error '%.200s', want "
			          "dead with '%s'",
			          id, soak_poison_defs[p->kind].name, published,
			          soak_cursor() ? (deferred ? " deferred=1" : " deferred=0") : "",
			          attempts, err, soak_poison_defs[p->kind].error);
			continue;
		}
		ok++;
	}
	pthread_mutex_unlock(&mu);
	PQclear(res);
	soak_say("final: %zu of %d poison rows dead with the expected error", ok, n);
}

/* The cursor's end, every relay stopped: its position covers every row of the table (each
 * committed row was dealt with, and the leader wrote how far it got before it stopped), so
 * the rows it set aside (deferred) are the only ones left unpublished. */
static void final_position(PGconn *pg, const char *table)
{
	char sql[1024];
	PGresult *res;
	long long pos, max_seq, above, deferred, unpublished;

	snprintf(sql, sizeof(sql),
	         "SELECT coalesce((SELECT position FROM %s_position WHERE stream = 'main'), -1),"
	         " coalesce(max(seq), 0),"
	         " count(*) FILTER (WHERE seq > coalesce((SELECT position FROM %s_position"
	         " WHERE stream = 'main'), 0)),"
	         " count(*) FILTER (WHERE deferred_at IS NOT NULL AND published_at IS NULL),"
	         " count(*) FILTER (WHERE %s) FROM %s",
	         table, table, soak_unpublished(), table);
	if ((res = query(pg, sql)) == NULL)
		return;
	pos = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
	max_seq = strtoll(PQgetvalue(res, 0, 1), NULL, 10);
	above = strtoll(PQgetvalue(res, 0, 2), NULL, 10);
	deferred = strtoll(PQgetvalue(res, 0, 3), NULL, 10);
	unpublished = strtoll(PQgetvalue(res, 0, 4), NULL, 10);
	PQclear(res);
	if (pos < 0)
		soak_fail(CHECK_POSITION, "no position row: the cursor never led %s", table);
	else if (above > 0 || pos < max_seq)
		soak_fail(
		        CHECK_POSITION,
		        "the position is %lld, the table's last seq %lld: %lld rows above it, not "
		        "dealt with after every relay stopped (unpublished %lld, of which deferred "
		        "%lld)",
		        pos, max_seq, above, unpublished, deferred);
	else if (unpublished != deferred)
		soak_fail(CHECK_POSITION,
		          "%lld rows unpublished, %lld of them deferred: the others should be "
		          "none",
		          unpublished, deferred);
	soak_say("final: cursor position %lld, last seq %lld, rows above it %lld, unpublished %lld "
	         "(deferred %lld)",
	         pos, max_seq, above, unpublished, deferred);
}

void soak_final_dead_list(const char *text)
{
	json_error_t jerr;
	json_t *list = json_loads(text, 0, &jerr), *it;
	bool *seen;
	size_t i, listed = 0, ok = 0;

	if (!json_is_array(list)) {
		soak_fail(CHECK_HARNESS, "outbox-relay dead --json: not a JSON array (%s): %.200s",
		          jerr.text, text);
		json_decref(list);
		return;
	}
	pthread_mutex_lock(&mu);
	if ((seen = calloc(n_poison + 1, sizeof(*seen))) == NULL)
		abort();
	json_array_foreach(list, i, it)
	{
		const char *id = json_string_value(json_object_get(it, "id"));
		const struct poison_rec *p = id ? poison_of(id) : NULL;

		listed++;
		if (p == NULL) {
			soak_fail(CHECK_POISON, "outbox-relay dead lists %s, not a poison row",
			          id ? id : "(no id)");
			continue;
		}
		if (seen[p - poison])
			soak_fail(CHECK_POISON, "outbox-relay dead lists %s twice", id);
		seen[p - poison] = true;
		ok++;
	}
	for (i = 0; i < n_poison; i++)
		if (!seen[i])
			soak_fail(CHECK_POISON, "poison row %s (%s) is not in outbox-relay dead",
			          poison[i].id, soak_poison_defs[poison[i].kind].name);
	pthread_mutex_unlock(&mu);
	free(seen);
	json_decref(list);
	soak_say("final: outbox-relay dead lists %zu rows, %zu of them poison rows", listed, ok);
}

void soak_final_table_check(void *pgp, const char *table)
{
	PGconn *pg = pgp;

	final_undelivered(pg, table);
	final_rows(pg, table);
	final_order(pg, table);
	final_poison(pg, table);
	if (soak_cursor())
		final_position(pg, table);
}
