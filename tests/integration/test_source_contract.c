/* The contract of a source of rows (store/source.h), against a real PostgreSQL: what the relay's
 * loop relies on, whichever source it runs. Every test runs against each source in SOURCES; a
 * new source is added there and must pass them all. The test plays the broker: it gives each
 * row its fate, as the loop would from the broker's answers. */
#include <criterion/criterion.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "store/source/source.h"
#include "store/source/source_testing.h"
#include "tests/support/fixture.h"
#include "tests/support/harness.h"

/* The sources under contract: a name for the messages, and which source_new() makes. Each test
 * runs them in turn on one table, emptied before each (fresh()). Where the cursor keeps the
 * contract differently (one source leads the table, the others wait), the test says how. */
struct contract_source {
	const char *name;
	enum source_kind kind;
};
static const struct contract_source SOURCES[] = {
	{ "lease", SOURCE_LEASE },
	{ "cursor", SOURCE_CURSOR },
};
#define N_SOURCES (sizeof(SOURCES) / sizeof(SOURCES[0]))

#define POLL_MS 60000 /* long: a test never waits for the poll interval, only for events */
#define BATCH   4
#define WAIT_MS 30000

/* What the hooks heard. */
struct heard {
	size_t marked, repaid, released, answered;
};

static void on_marked(void *arg, size_t rows, int64_t batch_us)
{
	(void)batch_us;
	((struct heard *)arg)->marked += rows;
}

static void on_repaid(void *arg, size_t marked, size_t gone)
{
	((struct heard *)arg)->repaid += marked + gone;
}

static void on_released(void *arg, size_t rows)
{
	((struct heard *)arg)->released += rows;
}

static void on_answered(void *arg)
{
	((struct heard *)arg)->answered++;
}

struct under_test {
	const struct contract_source *kind;
	struct source_options o;
	struct heard heard;
	struct source *src;
};

static atomic_int g_stopping;
/* relay.poll_interval of the sources open_source() opens; setup() puts back POLL_MS. */
static int64_t g_poll_ms = POLL_MS;
/* Their relay.batch_size; setup() puts back BATCH. */
static int g_batch = BATCH;
/* Their sessions' application_name. */
#define APP_NAME "outbox-relay contract test"

static void open_source(struct under_test *t, const struct contract_source *kind,
                        const struct fixture *fx, const char *relay_id)
{
	memset(t, 0, sizeof(*t));
	t->kind = kind;
	t->o.store = fixture_store_options(fx, relay_id, false);
	t->o.store.application_name = APP_NAME;
	t->o.store.batch_size = g_batch;
	t->o.confirm_timeout_ms = 5000;
	t->o.poll_interval_ms = g_poll_ms;
	t->o.stopping = &g_stopping;
	t->o.hooks = (struct source_hooks){ .arg = &t->heard,
		                            .marked = on_marked,
		                            .repaid = on_repaid,
		                            .released = on_released,
		                            .answered = on_answered };
	t->o.kind = kind->kind;
	t->src = source_new(&t->o);
	cr_assert_not_null(t->src, "%s: out of memory", kind->name);
	cr_assert_eq(source_connect(t->src), 0, "%s: connect: %s", kind->name,
	             source_errmsg(t->src));
}

static void close_source(struct under_test *t)
{
	source_free(t->src);
	t->src = NULL;
}

static bool is_cursor(const struct contract_source *kind)
{
	return kind->kind == SOURCE_CURSOR;
}

static struct fixture g_fx;
/* A producer's connection of a test's own, closed by teardown() too: a test that fails with its
 * transaction open must not leave the table locked behind it. */
static PGconn *g_producer;

/* The table as a new one, for the next source: no rows, no position (the cursor's, which says
 * the cursor runs the table). */
static void fresh(void)
{
	harness_pg_exec(g_fx.pg,
	                "TRUNCATE %s;"
	                " DO $$ BEGIN IF to_regclass('%s_position') IS NOT NULL THEN"
	                " DELETE FROM %s_position; END IF; END $$",
	                g_fx.table, g_fx.table, g_fx.table);
}

/* One source_next(), for a source that must hand nothing out (a standby); fails on an error. */
static const struct source_batch *next_once(struct under_test *t)
{
	const struct source_batch *b;
	int64_t ask_at;

	cr_assert_eq(source_next(t->src, &b, &ask_at), 0, "%s: next: %s (%s)", t->kind->name,
	             source_errmsg(t->src), source_step_text(source_step(t->src)));
	return b;
}

/* Whether the source, idle, is woken within WAIT_MS: its descriptor polled, source_input()
 * called each time it turns readable (or a second passes) until it says rows may have come. */
static bool wait_woken(struct under_test *t)
{
	int64_t end = clock_mono_ms() + WAIT_MS;
	bool woken = false;

	while (!woken && clock_mono_ms() < end) {
		struct pollfd p = { .fd = source_fd(t->src), .events = POLLIN };

		(void)poll(&p, 1, 1000);
		cr_assert_eq(source_input(t->src, &woken), 0, "%s: input: %s", t->kind->name,
		             source_errmsg(t->src));
	}
	return woken;
}

/* Rows of the table with cond (SQL) true. */
static int64_t rows_where(const char *cond)
{
	return harness_pg_int(g_fx.pg, "SELECT count(*) FROM %s WHERE %s", g_fx.table, cond);
}

/* The next batch, asking again while the source asks to be called back soon (it is catching
 * up with rows committed just now); NULL once it says to come back after its poll interval
 * (nothing to publish). */
static const struct source_batch *next(struct under_test *t)
{
	int64_t end = clock_mono_ms() + WAIT_MS;

	for (;;) {
		const struct source_batch *b;
		int64_t ask_at;
		int rc = source_next(t->src, &b, &ask_at);

		cr_assert_eq(rc, 0, "%s: next: %s (%s)", t->kind->name, source_errmsg(t->src),
		             source_step_text(source_step(t->src)));
		if (b)
			return b;
		if (ask_at - clock_mono_ms() >= t->o.poll_interval_ms / 2)
			return NULL;
		cr_assert_lt(clock_mono_ms(), end, "%s: still asked to come back soon after %d ms",
		             t->kind->name, WAIT_MS);
		if (ask_at > clock_mono_ms())
			clock_sleep_us((ask_at - clock_mono_ms()) * 1000);
	}
}

static void settle_all(struct under_test *t, const struct source_batch *b,
                       enum source_outcome outcome)
{
	struct source_fate f[64] = { 0 };

	cr_assert_leq(b->n, 64);
	for (size_t i = 0; i < b->n; i++) {
		f[i].outcome = outcome;
		f[i].error = "contract test";
	}
	cr_assert_eq(source_settle(t->src, b, f), 0, "%s: settle: %s", t->kind->name,
	             source_errmsg(t->src));
}

/* Ids of b, "a,b,c", into out. */
static void ids(const struct source_batch *b, char *out, size_t cap)
{
	size_t len = 0;

	out[0] = '\0';
	for (size_t i = 0; i < b->n && len < cap; i++)
		len += (size_t)snprintf(out + len, cap - len, "%s%s", i ? "," : "", b->rows[i].id);
}

static void insert(struct fixture *fx, size_t n, const char *prefix)
{
	harness_insert_rows(fx->pg, fx->table, n, "contract_ex", "rk", prefix, NULL, NULL);
}

static void setup(void)
{
	struct fixture_options o = { .no_consumer = true };

	atomic_store(&g_stopping, 0);
	g_poll_ms = POLL_MS;
	g_batch = BATCH;
	fixture_setup(&g_fx, "src", &o);
}

static void teardown(void)
{
	PQfinish(g_producer);
	g_producer = NULL;
	fixture_teardown(&g_fx);
}

TestSuite(source_contract, .init = setup, .fini = teardown, .timeout = 180);

/* Every committed row is handed out once, in the table's order within a batch, and batches of
 * at most batch_size; once published, no source hands it out again. */
Test(source_contract, every_row_goes_out_once_in_order_and_stays_published)
{
	for (size_t k = 0; k < N_SOURCES; k++) {
		fresh();
		struct under_test t;
		const struct source_batch *b;
		char seen[64][32];
		size_t n_seen = 0;

		insert(&g_fx, 10, SOURCES[k].name);
		open_source(&t, &SOURCES[k], &g_fx, "contract-a");
		while ((b = next(&t)) != NULL) {
			cr_assert_leq(b->n, BATCH, "%s: %zu rows in a batch", SOURCES[k].name,
			              b->n);
			cr_assert_gt(b->deadline_ms, clock_mono_ms(),
			             "%s: a batch past its deadline", SOURCES[k].name);
			for (size_t i = 0; i < b->n; i++) {
				if (i > 0)
					cr_assert_gt(b->rows[i].seq, b->rows[i - 1].seq);
				for (size_t j = 0; j < n_seen; j++)
					cr_assert_str_neq(seen[j], b->rows[i].id,
					                  "%s: %s handed out twice",
					                  SOURCES[k].name, b->rows[i].id);
				cr_assert_lt(n_seen, 64);
				snprintf(seen[n_seen++], sizeof(seen[0]), "%s", b->rows[i].id);
				cr_assert_eq(b->rows[i].attempts, 0);
			}
			settle_all(&t, b, SOURCE_PUBLISHED);
		}
		cr_assert_eq(n_seen, 10, "%s: %zu of 10 rows handed out", SOURCES[k].name, n_seen);
		cr_assert_eq(t.heard.marked, 10, "%s: %zu of 10 rows heard marked", SOURCES[k].name,
		             t.heard.marked);
		cr_assert_gt(t.heard.answered, 0);
		close_source(&t);

		/* A new source (another process, after a restart) finds nothing left. */
		open_source(&t, &SOURCES[k], &g_fx, "contract-b");
		cr_assert_null(next(&t), "%s: a published row came out again", SOURCES[k].name);
		close_source(&t);
	}
}

/* A released row comes back, its attempts unchanged; a failed one comes back with one attempt
 * more (none for the broker's own failure), and not before its delay. The cursor moves its
 * position past all three and sets them aside (deferred): they come back on its exception
 * path. */
Test(source_contract, released_and_failed_rows_come_back_as_their_fate_says)
{
	for (size_t k = 0; k < N_SOURCES; k++) {
		fresh();
		struct under_test t;
		const struct source_batch *b;
		struct source_fate f[3] = {
			{ .outcome = SOURCE_RELEASED },
			{ .outcome = SOURCE_FAILED, .error = "returned", .delay_ms = 0 },
			{ .outcome = SOURCE_FAILED,
			  .error = "nacked",
			  .delay_ms = 0,
			  .uncounted = true },
		};
		int attempts[3] = { -1, -1, -1 };

		insert(&g_fx, 3, SOURCES[k].name);
		open_source(&t, &SOURCES[k], &g_fx, "contract-a");
		b = next(&t);
		cr_assert_not_null(b);
		cr_assert_eq(b->n, 3);
		cr_assert_eq(source_settle(t.src, b, f), 0, "%s", source_errmsg(t.src));
		cr_assert_eq(t.heard.released, 1, "%s: released heard %zu", SOURCES[k].name,
		             t.heard.released);
		if (is_cursor(&SOURCES[k]))
			cr_assert_eq(rows_where("deferred_at IS NOT NULL AND published_at IS NULL"),
			             3, "cursor: the three rows were not set aside");
		for (int round = 0;
		     round < 5 && (attempts[0] < 0 || attempts[1] < 0 || attempts[2] < 0);
		     round++) {
			b = next(&t);
			if (!b)
				break;
			for (size_t i = 0; i < b->n; i++) {
				const char *id = b->rows[i].id;
				int which = id[strlen(id) - 1] - '0';

				cr_assert(which >= 0 && which < 3, "%s: unknown row %s",
				          SOURCES[k].name, id);
				attempts[which] = b->rows[i].attempts;
			}
			settle_all(&t, b, SOURCE_PUBLISHED);
		}
		cr_assert_eq(attempts[0], 0, "%s: released row: attempts %d", SOURCES[k].name,
		             attempts[0]);
		cr_assert_eq(attempts[1], 1, "%s: failed row: attempts %d", SOURCES[k].name,
		             attempts[1]);
		cr_assert_eq(attempts[2], 0, "%s: nacked row: attempts %d", SOURCES[k].name,
		             attempts[2]);
		close_source(&t);
	}
}

/* A row failed with a delay is not handed out before it; a dead row never again, and the
 * backlog counts it dead. */
Test(source_contract, delayed_and_dead_rows_stay_out)
{
	for (size_t k = 0; k < N_SOURCES; k++) {
		fresh();
		struct under_test t;
		const struct source_batch *b;
		struct store_status st;
		struct source_fate f[2] = {
			{ .outcome = SOURCE_FAILED, .error = "later", .delay_ms = 3600000 },
			{ .outcome = SOURCE_FAILED, .error = "never", .dead = true },
		};

		insert(&g_fx, 2, SOURCES[k].name);
		open_source(&t, &SOURCES[k], &g_fx, "contract-a");
		b = next(&t);
		cr_assert_not_null(b);
		cr_assert_eq(b->n, 2);
		cr_assert_eq(source_settle(t.src, b, f), 0, "%s", source_errmsg(t.src));
		cr_assert_null(next(&t), "%s: a delayed or dead row came out", SOURCES[k].name);
		cr_assert_eq(source_backlog(t.src, &st), 0, "%s", source_errmsg(t.src));
		cr_assert_eq(st.dead, 1, "%s: dead %lld", SOURCES[k].name, (long long)st.dead);
		cr_assert_eq(st.pending, 1, "%s: pending %lld", SOURCES[k].name,
		             (long long)st.pending);
		close_source(&t);
	}
}

/* Rows of one ordering key go out one at a time, in commit order: the next only after the
 * previous one was published. */
Test(source_contract, an_ordering_key_goes_out_one_row_at_a_time)
{
	for (size_t k = 0; k < N_SOURCES; k++) {
		fresh();
		struct under_test t;
		const struct source_batch *b;
		char prefix[32], want[64], got[128];

		for (int i = 0; i < 3; i++) {
			snprintf(prefix, sizeof(prefix), "%s-k%d", SOURCES[k].name, i);
			harness_pg_exec(g_fx.pg,
			                "INSERT INTO %s (id, exchange_name, routing_key, body, "
			                "ordering_key) VALUES ('%s', 'ex', 'rk', '{}', 'key-1')",
			                g_fx.table, prefix);
		}
		open_source(&t, &SOURCES[k], &g_fx, "contract-a");
		for (int i = 0; i < 3; i++) {
			b = next(&t);
			cr_assert_not_null(b, "%s: key's row %d never came", SOURCES[k].name, i);
			ids(b, got, sizeof(got));
			snprintf(want, sizeof(want), "%s-k%d", SOURCES[k].name, i);
			cr_assert_str_eq(got, want, "%s: batch %d", SOURCES[k].name, i);
			settle_all(&t, b, SOURCE_PUBLISHED);
		}
		cr_assert_null(next(&t));
		close_source(&t);
	}
}

/* Fetching ahead while the broker works: the batch fetched is the next one handed out; paused
 * (the broker went away), the source hands it back and it comes out again later. */
Test(source_contract, a_batch_fetched_ahead_goes_out_next_or_back_when_paused)
{
	for (size_t k = 0; k < N_SOURCES; k++) {
		fresh();
		struct under_test t;
		const struct source_batch *b;
		char first[128], again[128];

		insert(&g_fx, 3 * BATCH, SOURCES[k].name);
		open_source(&t, &SOURCES[k], &g_fx, "contract-a");
		b = next(&t);
		cr_assert_not_null(b);
		cr_assert_eq(source_prefetch(t.src, b), 0, "%s", source_errmsg(t.src));
		settle_all(&t, b, SOURCE_PUBLISHED);
		b = next(&t);
		cr_assert_not_null(b);
		cr_assert_eq(b->n, BATCH);
		ids(b, first, sizeof(first));
		cr_assert_eq(source_prefetch(t.src, b), 0, "%s", source_errmsg(t.src));
		settle_all(&t, b, SOURCE_PUBLISHED);
		/* The third batch is fetched ahead; the broker goes away. */
		cr_assert_eq(source_pause(t.src), 0, "%s", source_errmsg(t.src));
		cr_assert_eq(t.heard.released, BATCH, "%s: %zu handed back", SOURCES[k].name,
		             t.heard.released);
		b = next(&t);
		cr_assert_not_null(b, "%s: the handed back batch never came again",
		                   SOURCES[k].name);
		ids(b, again, sizeof(again));
		cr_assert_str_neq(first, again);
		cr_assert_eq(b->rows[0].attempts, 0);
		settle_all(&t, b, SOURCE_PUBLISHED);
		cr_assert_null(next(&t));
		cr_assert_eq(t.heard.marked, 3 * BATCH);
		close_source(&t);
	}
}

/* The database goes while a batch is out: the rows the broker confirmed are owed and recorded
 * after reconnecting, never handed out again by this source. */
Test(source_contract, confirmed_rows_are_owed_across_a_lost_connection)
{
	for (size_t k = 0; k < N_SOURCES; k++) {
		fresh();
		struct under_test t, other;
		const struct source_batch *b;

		insert(&g_fx, 2, SOURCES[k].name);
		open_source(&t, &SOURCES[k], &g_fx, "contract-a");
		b = next(&t);
		cr_assert_not_null(b);
		cr_assert_eq(b->n, 2);
		source_disconnect(t.src); /* as after a failed call */
		settle_all(&t, b, SOURCE_PUBLISHED);
		cr_assert_eq(source_owed(t.src), 2, "%s: owed %zu", SOURCES[k].name,
		             source_owed(t.src));
		cr_assert_eq(source_connect(t.src), 0, "%s", source_errmsg(t.src));
		cr_assert_null(next(&t), "%s: an owed row came out again", SOURCES[k].name);
		cr_assert_eq(t.heard.repaid, 2, "%s: repaid %zu", SOURCES[k].name, t.heard.repaid);
		cr_assert_eq(source_owed(t.src), 0);
		close_source(&t);
		open_source(&other, &SOURCES[k], &g_fx, "contract-b");
		cr_assert_null(next(&other), "%s: an owed row was left unpublished",
		               SOURCES[k].name);
		close_source(&other);
	}
}

/* The cursor: the second source is a standby and gets nothing while the first leads; once the
 * leader's connection closes, the standby takes the lead and hands out the rest, none of the
 * rows the leader published and recorded (its first batch, recorded by the read that took its
 * second, which it never settles: that one comes out again). */
static void cursor_standby(const struct contract_source *kind)
{
	struct under_test a, b;
	const struct source_batch *ba, *bb;
	int64_t first_last;

	insert(&g_fx, 2 * BATCH, kind->name);
	open_source(&a, kind, &g_fx, "contract-a");
	open_source(&b, kind, &g_fx, "contract-b");
	ba = next(&a);
	cr_assert_not_null(ba);
	for (int i = 0; i < 3; i++)
		cr_assert_null(next_once(&b), "%s: a standby handed rows out", kind->name);
	first_last = ba->rows[ba->n - 1].seq;
	settle_all(&a, ba, SOURCE_PUBLISHED);
	cr_assert_null(next_once(&b), "%s: a standby handed rows out", kind->name);
	cr_assert_not_null(next(&a), "%s: the leader's second batch", kind->name);
	close_source(&a);
	bb = next(&b);
	cr_assert_not_null(bb, "%s: the standby did not take over", kind->name);
	cr_assert_gt(bb->rows[0].seq, first_last, "%s: %s came out again after it was published",
	             kind->name, bb->rows[0].id);
	settle_all(&b, bb, SOURCE_PUBLISHED);
	close_source(&b);
}

/* Two sources on one table never have the same row out at once. */
Test(source_contract, two_sources_never_share_a_row)
{
	for (size_t k = 0; k < N_SOURCES; k++) {
		fresh();
		struct under_test a, b;
		const struct source_batch *ba, *bb;

		if (is_cursor(&SOURCES[k])) {
			cursor_standby(&SOURCES[k]);
			continue;
		}
		insert(&g_fx, 2 * BATCH, SOURCES[k].name);
		open_source(&a, &SOURCES[k], &g_fx, "contract-a");
		open_source(&b, &SOURCES[k], &g_fx, "contract-b");
		ba = next(&a);
		bb = next(&b);
		cr_assert_not_null(ba);
		cr_assert_not_null(bb, "%s: the second source found nothing", SOURCES[k].name);
		for (size_t i = 0; i < ba->n; i++)
			for (size_t j = 0; j < bb->n; j++)
				cr_assert_neq(ba->rows[i].seq, bb->rows[j].seq,
				              "%s: row %s out twice", SOURCES[k].name,
				              ba->rows[i].id);
		settle_all(&a, ba, SOURCE_PUBLISHED);
		settle_all(&b, bb, SOURCE_PUBLISHED);
		close_source(&a);
		close_source(&b);
	}
}

/* Idle, the source arranges to be woken: a row committed later makes its descriptor readable
 * and source_input() says so (no poll interval involved: it is a minute here). */
Test(source_contract, a_row_committed_while_idle_wakes_the_source)
{
	for (size_t k = 0; k < N_SOURCES; k++) {
		fresh();
		struct under_test t;
		const struct source_batch *b;

		open_source(&t, &SOURCES[k], &g_fx, "contract-a");
		cr_assert_null(next(&t));
		cr_assert_geq(source_fd(t.src), 0);
		insert(&g_fx, 1, SOURCES[k].name);
		cr_assert(wait_woken(&t), "%s: not woken by a committed row", SOURCES[k].name);
		b = next(&t);
		cr_assert_not_null(b);
		settle_all(&t, b, SOURCE_PUBLISHED);
		close_source(&t);
	}
}

/* An orderly finish hands back what was fetched ahead: another source takes it at once. */
Test(source_contract, finish_hands_back_what_was_fetched_ahead)
{
	for (size_t k = 0; k < N_SOURCES; k++) {
		fresh();
		struct under_test t, other;
		const struct source_batch *b;

		insert(&g_fx, 2 * BATCH, SOURCES[k].name);
		open_source(&t, &SOURCES[k], &g_fx, "contract-a");
		b = next(&t);
		cr_assert_not_null(b);
		cr_assert_eq(source_prefetch(t.src, b), 0, "%s", source_errmsg(t.src));
		settle_all(&t, b, SOURCE_PUBLISHED);
		cr_assert_eq(source_finish(t.src), 0, "%s", source_errmsg(t.src));
		cr_assert_eq(source_owed(t.src), 0);
		close_source(&t);
		open_source(&other, &SOURCES[k], &g_fx, "contract-b");
		b = next(&other);
		cr_assert_not_null(b, "%s: what was fetched ahead stayed leased", SOURCES[k].name);
		cr_assert_eq(b->n, BATCH);
		settle_all(&other, b, SOURCE_PUBLISHED);
		close_source(&other);
	}
}

/* ---- the cursor's own: what its position must not do ---- */

/* The cursor's entry in SOURCES; the test is skipped while it is not there. */
static const struct contract_source *cursor_kind(void)
{
	for (size_t k = 0; k < N_SOURCES; k++)
		if (is_cursor(&SOURCES[k]))
			return &SOURCES[k];
	cr_skip_test("the cursor source is not under contract yet");
	return NULL;
}

static void insert_one(const char *id, const char *key, const char *available_at)
{
	harness_pg_exec(g_fx.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key,"
	                " available_at) VALUES ('%s', 'ex', 'rk', '{}', %s%s%s, %s)",
	                g_fx.table, id, key ? "'" : "", key ? key : "NULL", key ? "'" : "",
	                available_at);
}

/* The next batch within WAIT_MS, asking as often as the source lets (whatever it says of when
 * to come back): for rows that become due while the test waits. NULL when none came. */
static const struct source_batch *next_within(struct under_test *t)
{
	int64_t end = clock_mono_ms() + WAIT_MS;
	const struct source_batch *b;

	while ((b = next_once(t)) == NULL && clock_mono_ms() < end)
		clock_sleep_us(100 * 1000);
	return b;
}

/* A row not due yet (available_at in the future) is not handed out before it is due, and does
 * not hold back the rows committed after it; once due, it comes, set aside (deferred) by then:
 * the position went on without it. */
Test(source_contract, cursor_a_delayed_row_waits_alone)
{
	const struct contract_source *kind = cursor_kind();
	struct under_test t;
	const struct source_batch *b;
	char got[128];

	fresh();
	/* Exceptions that come due are looked for once a poll interval at least. */
	g_poll_ms = 500;
	insert_one("later", NULL, "now() + interval '3 seconds'");
	insert_one("now-1", NULL, "now()");
	insert_one("now-2", NULL, "now()");
	open_source(&t, kind, &g_fx, "contract-a");
	b = next_once(&t);
	if (b == NULL)
		b = next(&t);
	cr_assert_not_null(b, "the rows after a delayed one were held back");
	ids(b, got, sizeof(got));
	cr_assert_str_eq(got, "now-1,now-2");
	settle_all(&t, b, SOURCE_PUBLISHED);
	b = next_within(&t);
	cr_assert_not_null(b, "the delayed row never came once due");
	ids(b, got, sizeof(got));
	cr_assert_str_eq(got, "later");
	cr_assert_eq(rows_where("id = 'later' AND available_at <= now()"), 1,
	             "the delayed row came out before it was due");
	cr_assert_eq(rows_where("id = 'later' AND deferred_at IS NOT NULL"), 1,
	             "the delayed row was not set aside");
	cr_assert_eq(b->rows[0].attempts, 0);
	settle_all(&t, b, SOURCE_PUBLISHED);
	cr_assert_null(next(&t));
	cr_assert_eq(rows_where("id = 'later' AND published_at IS NOT NULL"), 1);
	close_source(&t);
}

static int64_t position_now(void)
{
	return harness_pg_int(g_fx.pg, "SELECT position FROM %s_position WHERE stream = 'main'",
	                      g_fx.table);
}

/* While the broker confirms a batch, the cursor reads the next one ahead when rows are queueing:
 * behind a read of at least an eighth of a batch (here 16: 2 rows), not behind a shorter one
 * (under a trickle such a read finds next to nothing). Seen by a row committed after the read
 * ahead: it is not in the batch that read hands out, and it is in the one a read after the
 * confirms hands out. */
Test(source_contract, cursor_reads_ahead_when_rows_queue)
{
	const struct contract_source *kind = cursor_kind();
	struct under_test t;
	const struct source_batch *b;
	char got[128];

	fresh();
	g_batch = 16;
	open_source(&t, kind, &g_fx, "contract-a");
	cr_assert_null(next(&t));

	/* Three rows at once: queueing. */
	insert_one("q-1", NULL, "now()");
	insert_one("q-2", NULL, "now()");
	insert_one("q-3", NULL, "now()");
	b = next(&t);
	cr_assert_not_null(b);
	cr_assert_eq(b->n, 3);
	insert_one("ahead", NULL, "now()");
	cr_assert_eq(source_prefetch(t.src, b), 0, "%s", source_errmsg(t.src));
	insert_one("after", NULL, "now()");
	settle_all(&t, b, SOURCE_PUBLISHED);
	b = next(&t);
	cr_assert_not_null(b);
	ids(b, got, sizeof(got));
	cr_assert_str_eq(got, "ahead", "behind 3 rows the next batch was not read ahead");
	settle_all(&t, b, SOURCE_PUBLISHED);

	/* One row: a trickle. The read ahead's one row went alone, so the next read waits (it
	 * gathers) and takes both rows committed meanwhile. */
	b = next(&t);
	cr_assert_not_null(b);
	ids(b, got, sizeof(got));
	cr_assert_str_eq(got, "after");
	insert_one("late", NULL, "now()");
	cr_assert_eq(source_prefetch(t.src, b), 0, "%s", source_errmsg(t.src));
	insert_one("later", NULL, "now()");
	settle_all(&t, b, SOURCE_PUBLISHED);
	b = next(&t);
	cr_assert_not_null(b);
	ids(b, got, sizeof(got));
	cr_assert_str_eq(got, "late,later", "behind one row the next batch was read ahead");
	settle_all(&t, b, SOURCE_PUBLISHED);
	cr_assert_null(next(&t));
	close_source(&t);
}

/* A key with a row in a batch and another in the read fetched ahead: the position moves past
 * the batch before the next one goes out. Otherwise a relay killed after publishing the next
 * batch, before the read after it carried the move, would have both published again, and the
 * key's first row would go after its second. */
Test(source_contract, cursor_moves_past_a_key_before_its_next_row_goes_ahead)
{
	const struct contract_source *kind = cursor_kind();
	struct under_test t;
	const struct source_batch *b;
	int64_t first_end;
	char got[128];

	fresh();
	g_batch = 16;
	open_source(&t, kind, &g_fx, "contract-a");
	cr_assert_null(next(&t));

	insert_one("a-1", "a", "now()");
	insert_one("b-1", "b", "now()");
	insert_one("a-2", "a", "now()");
	b = next(&t);
	cr_assert_not_null(b);
	ids(b, got, sizeof(got));
	cr_assert_str_eq(got, "a-1,b-1", "a batch holds one row of a key");
	first_end = b->rows[1].seq;
	cr_assert_eq(source_prefetch(t.src, b), 0, "%s", source_errmsg(t.src));
	settle_all(&t, b, SOURCE_PUBLISHED);
	b = next(&t);
	cr_assert_not_null(b);
	ids(b, got, sizeof(got));
	cr_assert_str_eq(got, "a-2");
	cr_assert_geq(position_now(), first_end, "a-2 went out with the position still before a-1");
	settle_all(&t, b, SOURCE_PUBLISHED);

	/* Without a key in common the read ahead goes out at once, its move carried later. */
	insert_one("c-1", "c", "now()");
	insert_one("d-1", "d", "now()");
	b = next(&t);
	cr_assert_not_null(b);
	ids(b, got, sizeof(got));
	cr_assert_str_eq(got, "c-1,d-1");
	first_end = b->rows[1].seq;
	insert_one("e-1", "e", "now()");
	cr_assert_eq(source_prefetch(t.src, b), 0, "%s", source_errmsg(t.src));
	settle_all(&t, b, SOURCE_PUBLISHED);
	b = next(&t);
	cr_assert_not_null(b);
	ids(b, got, sizeof(got));
	cr_assert_str_eq(got, "e-1", "the read ahead did not go out");
	cr_assert_lt(position_now(), first_end, "a move went alone with no key in common");
	settle_all(&t, b, SOURCE_PUBLISHED);
	cr_assert_null(next(&t));
	close_source(&t);
}

/* A batch the broker confirmed whole is recorded by the move the next read carries in its
 * round trip, not by a statement of its own at settle; and before the source goes quiet at the
 * latest, so a relay that stops or idles leaves no confirmed row unrecorded. */
Test(source_contract, cursor_a_batch_is_recorded_with_the_read_after_it)
{
	const struct contract_source *kind = cursor_kind();
	struct under_test t;
	const struct source_batch *b;
	int64_t first_end, second_end;

	fresh();
	insert(&g_fx, 2, "rec");
	open_source(&t, kind, &g_fx, "contract-a");
	b = next(&t);
	cr_assert_not_null(b);
	cr_assert_eq(b->n, 2);
	first_end = b->rows[1].seq;
	cr_assert_eq(source_prefetch(t.src, b), 0, "%s", source_errmsg(t.src));
	settle_all(&t, b, SOURCE_PUBLISHED);
	cr_assert_lt(position_now(), first_end, "settle wrote the move itself");
	cr_assert_eq(t.heard.marked, 0);

	insert(&g_fx, 1, "rec-next");
	b = next(&t);
	cr_assert_not_null(b);
	cr_assert_eq(t.heard.marked, 2, "the read did not record the batch before it");
	cr_assert_eq(position_now(), first_end);
	second_end = b->rows[0].seq;
	settle_all(&t, b, SOURCE_PUBLISHED);
	cr_assert_null(next(&t));
	cr_assert_eq(t.heard.marked, 3, "went quiet with a confirmed row unrecorded");
	cr_assert_geq(position_now(), second_end);
	close_source(&t);
}

/* A key's later rows wait behind its failed row, while rows without a key go on; once the
 * failed row is due and goes, the key's rows follow one at a time, in order, uncharged. */
Test(source_contract, cursor_a_key_waits_behind_its_failed_row)
{
	const struct contract_source *kind = cursor_kind();
	struct under_test t;
	const struct source_batch *b;
	struct source_fate f[2] = {
		{ .outcome = SOURCE_FAILED, .error = "returned", .delay_ms = 3000 },
		{ .outcome = SOURCE_PUBLISHED },
	};
	char got[128];

	fresh();
	g_poll_ms = 500; /* as above */
	insert_one("k-0", "key-1", "now()");
	insert_one("other", NULL, "now()");
	insert_one("k-1", "key-1", "now()");
	insert_one("k-2", "key-1", "now()");
	open_source(&t, kind, &g_fx, "contract-a");
	b = next(&t);
	cr_assert_not_null(b);
	ids(b, got, sizeof(got));
	cr_assert_str_eq(got, "k-0,other", "one row of a key at a time");
	cr_assert_eq(source_settle(t.src, b, f), 0, "%s", source_errmsg(t.src));
	for (int i = 0; i < 3; i++) {
		char want[8];

		b = next_within(&t);
		cr_assert_not_null(b, "the key's row %d never came", i);
		ids(b, got, sizeof(got));
		snprintf(want, sizeof(want), "k-%d", i);
		cr_assert_str_eq(got, want, "the key's rows out of order (behind a failed row)");
		if (i == 0)
			cr_assert_eq(rows_where("id = 'k-0' AND available_at <= now()"), 1,
			             "the failed row came back before its delay");
		settle_all(&t, b, SOURCE_PUBLISHED);
	}
	cr_assert_null(next(&t));
	cr_assert_eq(rows_where("id IN ('k-1', 'k-2') AND attempts = 0"), 2,
	             "rows held behind a failure were charged");
	cr_assert_eq(rows_where("id = 'k-0' AND attempts = 1"), 1);
	close_source(&t);
}

/* A row of the table's as a producer's transaction of its own (c) inserts it. */
static void insert_in(PGconn *c, const char *id, const char *key)
{
	harness_pg_exec(c,
	                "INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key)"
	                " VALUES ('%s', 'ex', 'rk', '{}', %s%s%s)",
	                g_fx.table, id, key ? "'" : "", key ? key : "NULL", key ? "'" : "");
}

/* The cursor source leading the emptied table, caught up, and a producer's connection of the
 * test's own (closed by teardown()). */
static PGconn *cursor_caught_up(struct under_test *t)
{
	fresh();
	g_producer = harness_pg_connect();
	open_source(t, cursor_kind(), &g_fx, "contract-a");
	cr_assert_null(next(t));
	return g_producer;
}

/* A committed row whose lower seqs were all read goes at once, though a transaction still
 * running holds a later seq (the ordering watermark cannot settle while it does); the later
 * row follows once committed. */
Test(source_contract, cursor_a_row_goes_while_a_later_seq_is_held)
{
	struct under_test t;
	PGconn *producer = cursor_caught_up(&t);
	const struct source_batch *b;
	char got[128];

	insert_one("early", NULL, "now()");
	harness_pg_exec(producer, "BEGIN");
	insert_in(producer, "open", NULL);
	b = next(&t);
	cr_assert_not_null(b, "a committed row waited for a later transaction");
	ids(b, got, sizeof(got));
	cr_assert_str_eq(got, "early");
	settle_all(&t, b, SOURCE_PUBLISHED);
	harness_pg_exec(producer, "COMMIT");
	b = next(&t);
	cr_assert_not_null(b);
	ids(b, got, sizeof(got));
	cr_assert_str_eq(got, "open");
	settle_all(&t, b, SOURCE_PUBLISHED);
	cr_assert_null(next(&t));
	close_source(&t);
}

/* Woken from idle by a row whose every lower seq was read, the cursor reads it without reading
 * the lock list (the watermark's sample: the costliest statement of a read, which the row
 * would wait for). The source counts the reads that sampled (source_testing.h): catching up
 * took at least one (the first read after taking the lead samples), the wake-up's took none.
 * A row behind a hole still gets its sample (the test below). */
Test(source_contract, cursor_a_wake_up_reads_without_the_lock_list)
{
	struct under_test t;
	const struct source_batch *b;
	uint64_t before;

	(void)cursor_caught_up(&t);
	insert_one("woken", NULL, "now()");
	cr_assert(wait_woken(&t), "the cursor was not woken by a committed row");
	before = source_test_lock_list_reads(t.src);
	cr_assert_gt(before, 0, "catching up never read the lock list: the count says nothing");
	b = next_once(&t);
	cr_assert_not_null(b, "the wake-up's first read did not hand the row out");
	cr_assert_eq(source_test_lock_list_reads(t.src), before,
	             "the wake-up's read read the lock list");
	settle_all(&t, b, SOURCE_PUBLISHED);
	close_source(&t);
}

/* A row committed above a seq whose transaction still runs waits for it: nothing goes past the
 * hole (the position would pass a row still to come, and a key's rows would go out of order).
 * Once that transaction commits, its row goes first, then the key's next; once one rolls
 * back, the fence passes its seq and the row after it goes. */
Test(source_contract, cursor_a_row_waits_for_a_lower_seq_still_uncommitted)
{
	struct under_test t;
	PGconn *producer = cursor_caught_up(&t);
	const struct source_batch *b;
	char got[128];

	harness_pg_exec(producer, "BEGIN");
	insert_in(producer, "k-first", "key-1");
	insert_one("k-second", "key-1", "now()");
	for (int i = 0; i < 3; i++) {
		cr_assert_null(next_once(&t), "a row went past a seq still uncommitted");
		clock_sleep_us(20 * 1000);
	}
	harness_pg_exec(producer, "COMMIT");
	for (int i = 0; i < 2; i++) {
		char want[16];

		b = next(&t);
		cr_assert_not_null(b, "the key's row %d never came", i);
		ids(b, got, sizeof(got));
		snprintf(want, sizeof(want), "k-%s", i ? "second" : "first");
		cr_assert_str_eq(got, want, "the key's rows out of seq order");
		settle_all(&t, b, SOURCE_PUBLISHED);
	}

	harness_pg_exec(producer, "BEGIN");
	insert_in(producer, "gone", NULL);
	insert_one("after-gone", NULL, "now()");
	cr_assert_null(next_once(&t), "a row went past a seq still uncommitted");
	harness_pg_exec(producer, "ROLLBACK");
	b = next(&t);
	cr_assert_not_null(b, "a rolled-back seq held the rows after it for good");
	ids(b, got, sizeof(got));
	cr_assert_str_eq(got, "after-gone");
	settle_all(&t, b, SOURCE_PUBLISHED);
	cr_assert_null(next(&t));
	cr_assert_eq(rows_where("published_at IS NULL AND deferred_at IS NOT NULL"), 0);
	close_source(&t);
}
