/* One relay loop: claim a batch under a lease, publish it with confirms, mark what the broker
 * confirmed, charge what it refused, release what it never answered. Reconnects both ends
 * with backoff and never drops a row it cannot account for: such rows stay leased and come
 * back when the lease runs out. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "amqp/broker.h"
#include "relay/backoff.h"
#include "base/clock.h"
#include "relay/log.h"
#include "relay/metrics.h"
#include "relay/relay.h"
#include "store/outbox_store.h"

/* Reconnect backoff bounds: quick first retry (a restart takes seconds), capped so an outage
 * costs at most this long after the far end is back. */
#define RECONNECT_MIN_MS 250
#define RECONNECT_MAX_MS 15000
/* Confirmed ids kept in memory while the database is away, to be marked once it is back. A
 * relay that cannot mark stops claiming, so this only ever holds one batch's worth. */
#define OWED_MAX 20000
/* A batch is published only while its lease (by the database clock) outlasts the confirm
 * timeout by a margin, room for the mark that follows: half of what the lease gives beyond
 * the confirm timeout, at most this (a fresh claim always qualifies). */
#define LEASE_MARGIN_MAX_MS 2000

/* A confirmed row not yet marked, with its claim's token: the mark is fenced like every
 * write, so it only lands while the row is still ours. */
struct owed {
	int64_t seq;
	char token[STORE_TOKEN_MAX];
};

struct endpoint_state {
	bool up;          /* counted in g_metrics */
	int64_t failures; /* consecutive failed attempts */
	/* Failures since the endpoint last did useful work (a claim answered, a batch
	 * confirmed), which sets the reconnect backoff. Connecting alone does not end a streak:
	 * a broker that blocks every new connection at its first publish, or a database whose
	 * statements fail on every fresh connection, is retried less and less often. */
	int64_t streak;
	int64_t retry_at_ms; /* CLOCK_MONOTONIC */
	int64_t down_since_ms;
};

struct worker {
	int index;
	struct relay *relay;
	const struct config *cfg;
	char component[24];
	char app_name[64];

	struct store_options sopts;
	struct broker_options bopts;
	struct store *store;
	struct broker *broker;
	struct endpoint_state db, mq;

	/* Two batches: the one being published (cur) and the next, claimed while the broker
	 * confirms the current one. */
	struct store_batch batches[2];
	int cur;
	/* The mark of the previous batch's confirmed rows, whose seqs are still in published[]:
	 * held to go with the next claim, on the wire on its own (store_mark_published_send)
	 * while the current batch is being published, or carried by the claim on the wire. */
	enum { MARK_NONE, MARK_HELD, MARK_SENT, MARK_IN_CLAIM } mark;
	size_t n_marking;
	int64_t marking_t0_us;
	char marking_token[STORE_TOKEN_MAX];

	size_t cap; /* capacity of the arrays below */
	struct broker_result *res;
	int64_t *published;    /* seqs of the rows confirmed in this batch */
	const char **released; /* ids never answered */
	struct store_failure *failures;

	struct owed *owed; /* confirmed rows not yet marked (database was away) */
	size_t n_owed;

	/* Claim floor (see store_set_claim_floor): the first seq of the previous cycle's batch,
	 * and when the last claim without a floor ran. */
	int64_t last_first_seq;
	int64_t full_claim_ms;
	int64_t claim_sent_us; /* when the pipeline's last claim went out (gather()) */

	bool armed;           /* this worker's session holds the wake-up lock (store_arm) */
	int64_t arm_pause_ms; /* the next pause after producers refused the lock (arm()) */
	uint64_t seed;
	atomic_int done; /* worker_main() has finished (read by the main thread) */
	char node[300];  /* the broker node of the last connection, for "failover" */
};

static void set_tick(struct worker *w)
{
	atomic_store_explicit(&g_metrics.tick_ms[w->index], clock_mono_ms(), memory_order_relaxed);
}

/* ---- connection state ---- */

static void endpoint_up(struct worker *w, struct endpoint_state *e, atomic_int *gauge,
                        const char *what, const char *detail)
{
	if (e->failures > 0 || e->down_since_ms)
		log_event(LOG_INFO, w->component, "reconnected", LOG_STR("to", what),
		          LOG_MS("after", clock_mono_ms() - e->down_since_ms),
		          LOG_OPT("server", detail));
	else
		log_event(LOG_INFO, w->component, "connected", LOG_STR("to", what),
		          LOG_OPT("server", detail));
	e->up = true;
	e->failures = 0;
	e->down_since_ms = 0;
	atomic_fetch_add_explicit(gauge, 1, memory_order_relaxed);
}

/* Records a failed connect or a lost connection and schedules the next try. One warn line
 * per state change; repeated failures while down are logged at debug. */
static void endpoint_down(struct worker *w, struct endpoint_state *e, atomic_int *gauge,
                          const char *what, const char *error)
{
	int64_t now = clock_mono_ms();
	bool was_up = e->up;
	int64_t delay;

	if (e->up) {
		e->up = false;
		atomic_fetch_sub_explicit(gauge, 1, memory_order_relaxed);
	}
	if (!e->down_since_ms)
		e->down_since_ms = now;
	e->failures++;
	e->streak++;
	delay = backoff_ms(RECONNECT_MIN_MS, RECONNECT_MAX_MS, e->streak, &w->seed);
	e->retry_at_ms = now + delay;
	if (was_up)
		log_event(LOG_WARN, w->component, "lost connection, will reconnect",
		          LOG_STR("to", what), LOG_MS("retry_in", delay), LOG_STR("error", error));
	else if (e->failures == 1)
		log_event(LOG_WARN, w->component, "could not connect, will retry",
		          LOG_STR("to", what), LOG_MS("retry_in", delay), LOG_STR("error", error));
	else /* later failures of the same outage: the operator has been told already */
		log_event(LOG_DEBUG, w->component, "could not connect, will retry",
		          LOG_STR("to", what), LOG_MS("retry_in", delay),
		          LOG_INT("attempt", e->failures), LOG_STR("error", error));
}

static bool ensure_db(struct worker *w)
{
	int rc;

	if (store_connected(w->store))
		return true;
	if (clock_mono_ms() < w->db.retry_at_ms)
		return false;
	rc = store_connect(w->store);
	if (rc == STORE_OK) {
		/* Said before the connection counts as up, so once /readyz answers 200 every loop
		 * has looked. */
		if (!store_wakeup_current(w->store) && !atomic_exchange(&w->relay->wakeup_said, 1))
			log_event(LOG_WARN, w->component,
			          "the table's wake-up trigger is missing or outdated, "
			          "new rows are found by polling: run 'outbox-relay migrate'",
			          LOG_STR("table", w->cfg->database_table),
			          LOG_MS("poll_interval", w->cfg->relay_poll_interval_ms));
		endpoint_up(w, &w->db, &g_metrics.db_up, "database", store_server(w->store));
		/* The wake-up lock ended with the old session. */
		w->armed = false;
		return true;
	}
	if (rc == STORE_ERR_UNSUPPORTED) {
		/* No retry can fix this connection: say so once and stop the relay (exit 1). */
		log_event(LOG_ERROR, w->component, "cannot relay through this database connection",
		          LOG_STR("error", store_errmsg(w->store)));
		atomic_store(&w->relay->failed, 1);
		(void)raise(SIGTERM);
		return false;
	}
	if (rc == STORE_ERR_ABORTED)
		return false; /* stopping */
	endpoint_down(w, &w->db, &g_metrics.db_up, "database", store_errmsg(w->store));
	return false;
}

static bool ensure_broker(struct worker *w)
{
	int rc;

	if (broker_connected(w->broker))
		return true;
	if (clock_mono_ms() < w->mq.retry_at_ms)
		return false;
	rc = broker_connect(w->broker);
	if (rc == BROKER_OK) {
		const char *node = broker_node(w->broker);

		endpoint_up(w, &w->mq, &g_metrics.broker_up, "broker", node);
		/* Another node than last time: the cluster failed over (or we spread out). */
		if (w->node[0] && strcmp(w->node, node) != 0)
			atomic_fetch_add_explicit(&g_metrics.broker_failovers, 1,
			                          memory_order_relaxed);
		snprintf(w->node, sizeof(w->node), "%s", node);
		metrics_set_broker_node(w->index, node);
		return true;
	}
	if (rc == BROKER_ERR_ABORTED)
		return false; /* stopping */
	endpoint_down(w, &w->mq, &g_metrics.broker_up, "broker", broker_errmsg(w->broker));
	return false;
}

static void owe_marks(struct worker *w, const char *token, const int64_t *seqs, size_t n);

/* The connection goes: a mark still on the wire is owed, to be sent again after reconnecting
 * (fenced, so it lands only if the rows are still ours), never read as an answer that cannot
 * come (which would fail the next connection too). */
static void drop_db(struct worker *w)
{
	if (w->mark != MARK_NONE) {
		owe_marks(w, w->marking_token, w->published, w->n_marking);
		w->mark = MARK_NONE;
	}
	store_disconnect(w->store);
}

static void db_failed(struct worker *w, int rc, const char *doing)
{
	if (rc == STORE_ERR_CONN || rc == STORE_ERR_ABORTED || !store_connected(w->store)) {
		drop_db(w);
		if (rc == STORE_ERR_ABORTED) {
			log_event(LOG_WARN, w->component, "stopping: gave up on the database",
			          LOG_STR("doing", doing),
			          LOG_STR("error", store_errmsg(w->store)));
			return;
		}
		endpoint_down(w, &w->db, &g_metrics.db_up, "database", store_errmsg(w->store));
		return;
	}
	/* The connection is alive but the statement failed (lock timeout, constraint, a DBA
	 * dropping a column...): say so and back off; leases keep the rows safe. */
	log_event(LOG_ERROR, w->component, "database statement failed, will retry",
	          LOG_STR("doing", doing), LOG_STR("error", store_errmsg(w->store)));
	drop_db(w);
	endpoint_down(w, &w->db, &g_metrics.db_up, "database", store_errmsg(w->store));
}

/* in_batch: rows were waiting for confirms, and have been released by the caller. */
static void broker_failed(struct worker *w, int rc, bool in_batch)
{
	const char *why = rc == BROKER_ERR_TIMEOUT ? "timeout" : "connection";

	broker_disconnect(w->broker);
	if (rc == BROKER_ERR_ABORTED) {
		/* The shutdown deadline ended the wait: say so, not "no confirm within". */
		log_event(LOG_WARN, w->component,
		          in_batch ? "stopping: gave up waiting for the broker, unconfirmed rows "
		                     "released"
		                   : "stopping: gave up on the broker",
		          LOG_STR("error", broker_errmsg(w->broker)));
		return;
	}
	if (w->mq.up && in_batch)
		log_event(LOG_WARN, w->component,
		          "broker did not confirm the batch, unconfirmed rows released",
		          LOG_STR("reason", why), LOG_STR("error", broker_errmsg(w->broker)));
	endpoint_down(w, &w->mq, &g_metrics.broker_up, "broker", broker_errmsg(w->broker));
}

/* ---- waiting ---- */

/* Sleeps until a notification, the deadline, or shutdown, servicing the broker connection
 * (heartbeats, connection.blocked) at least every heartbeat/2 meanwhile. False when it slept
 * to the deadline; true when something else ended it (a notification, shutdown, a lost
 * connection): the loop has work to look at.
 * A notification may already be in libpq's queue: PostgreSQL sends one that came while a
 * statement ran just before that statement's answer ends, so libpq reads it with the answer
 * and the socket has nothing more to say. Polling alone would sleep through it (up to the
 * poll interval, while a producer's row waits), so the queue is read before the first poll. */
static bool wait_for_work(struct worker *w, int64_t deadline_ms)
{
	int64_t hb_ms = w->cfg->amqp_heartbeat_ms > 0 ? w->cfg->amqp_heartbeat_ms / 2 : 5000;

	if (store_socket(w->store) >= 0) {
		bool woken = false;
		int rc = store_consume_input(w->store, &woken);

		if (rc < 0) {
			db_failed(w, rc, "waiting for notifications");
			return true;
		}
		if (woken)
			return true;
	}
	for (;;) {
		struct pollfd pfd[3];
		nfds_t n = 0;
		int64_t now = clock_mono_ms();
		int64_t timeout = deadline_ms - now;
		int db_i = -1;
		bool woken = false;
		int rc;

		set_tick(w);
		if (atomic_load(&w->relay->stopping))
			return true;
		if (timeout <= 0)
			return false;
		if (timeout > hb_ms)
			timeout = hb_ms;
		pfd[n].fd = w->relay->wake_fd;
		pfd[n++].events = POLLIN;
		if (store_socket(w->store) >= 0) {
			db_i = (int)n;
			pfd[n].fd = store_socket(w->store);
			pfd[n++].events = POLLIN;
		}
		if (broker_fd(w->broker) >= 0) {
			pfd[n].fd = broker_fd(w->broker);
			pfd[n++].events = POLLIN;
		}
		rc = poll(pfd, n, (int)timeout);
		if (rc < 0 && errno != EINTR)
			return true;
		if (db_i >= 0 && rc > 0 && pfd[db_i].revents) {
			rc = store_consume_input(w->store, &woken);
			if (rc < 0) {
				db_failed(w, rc, "waiting for notifications");
				return true;
			}
			if (woken)
				return true;
		}
		/* Service the broker on readability and on every heartbeat/2 timeout alike:
		 * rabbitmq-c only sends heartbeats from inside its own calls. */
		if (broker_connected(w->broker)) {
			rc = broker_service(w->broker);
			if (rc < 0) {
				broker_failed(w, rc, false);
				return true;
			}
		}
	}
}

/* Drops the notifications libpq holds. Under load the loop never sleeps, yet notifications
 * still come (another relay asleep makes producers notify, and so does a wake-up that came
 * as this loop got busy), each kept by libpq until it is read: without this they would pile
 * up for as long as the load lasts. A busy loop claims again after every batch, so they say
 * nothing it needs. A failure is left to the next statement, which meets it too. */
static void drop_notifications(struct worker *w)
{
	bool woken;

	if (store_consume_input(w->store, &woken) < 0)
		return;
}

/* ---- batches ---- */

/* Says what a claim leased but its batch could not hold (store/claim.c): rows handed back at
 * once, and rows recorded dead because even alone they exceed what a batch may hold. */
static void report_unheld(struct worker *w, const struct store_batch *b)
{
	if (b->n_refused) {
		log_event(LOG_ERROR, w->component,
		          "message is dead, an operator must requeue or discard it",
		          LOG_STR("id", b->refused_id), LOG_STR("error", b->refused_error),
		          LOG_UINT("rows", b->n_refused));
		atomic_fetch_add_explicit(&g_metrics.failed[METRICS_FAIL_INVALID], b->n_refused,
		                          memory_order_relaxed);
		atomic_fetch_add_explicit(&g_metrics.dead, b->n_refused, memory_order_relaxed);
	}
	if (b->n_cut)
		log_event(LOG_WARN, w->component,
		          "claimed more than a batch may hold, handed the rest back",
		          LOG_UINT("rows", b->n_cut));
}

static int grow(struct worker *w, size_t n)
{
	size_t cap = w->cap ? w->cap : 64;
	void *p;

	if (n <= w->cap)
		return 0;
	while (cap < n)
		cap *= 2;
#define GROW(field)                                             \
	do {                                                    \
		p = realloc(w->field, cap * sizeof(*w->field)); \
		if (!p)                                         \
			return -1;                              \
		w->field = p;                                   \
	} while (0)
	GROW(res);
	GROW(published);
	GROW(released);
	GROW(failures);
#undef GROW
	w->cap = cap;
	return 0;
}

static enum metrics_fail_reason fail_reason(enum broker_outcome o)
{
	switch (o) {
	case BROKER_NACKED:
		return METRICS_FAIL_NACKED;
	case BROKER_RETURNED:
		return METRICS_FAIL_UNROUTABLE;
	case BROKER_REFUSED:
		return METRICS_FAIL_REFUSED;
	default:
		return METRICS_FAIL_INVALID;
	}
}

/* Keeps confirmed rows to mark once the database is back (else they are republished when
 * their lease runs out: a duplicate, not a loss). */
static void owe_marks(struct worker *w, const char *token, const int64_t *seqs, size_t n)
{
	for (size_t i = 0; i < n && w->n_owed < OWED_MAX; i++) {
		struct owed *p = realloc(w->owed, (w->n_owed + 1) * sizeof(*w->owed));

		if (!p)
			return;
		w->owed = p;
		w->owed[w->n_owed].seq = seqs[i];
		snprintf(w->owed[w->n_owed].token, sizeof(w->owed[w->n_owed].token), "%s", token);
		w->n_owed++;
	}
}

static void clear_owed(struct worker *w)
{
	free(w->owed);
	w->owed = NULL;
	w->n_owed = 0;
}

/* Marks what was owed, one statement per claim token (owed rows come in whole batches). */
static int pay_owed(struct worker *w)
{
	size_t marked = 0, changed = 0;
	int rc;

	if (!w->n_owed)
		return 0;
	if (grow(w, w->n_owed) < 0)
		return -1;
	for (size_t i = 0; i < w->n_owed;) {
		size_t n = 0, hit = 0;
		const char *token = w->owed[i].token;

		while (i + n < w->n_owed && strcmp(w->owed[i + n].token, token) == 0) {
			w->published[n] = w->owed[i + n].seq;
			n++;
		}
		rc = store_mark_published_send(w->store, token, w->published, n,
		                               w->cfg->relay_retention_ms == 0);
		if (rc == 0)
			rc = store_mark_published_recv(w->store, &hit);
		if (rc < 0) {
			/* What was marked is no longer owed; the rest stays, to try again. */
			memmove(w->owed, w->owed + i, (w->n_owed - i) * sizeof(*w->owed));
			w->n_owed -= i;
			db_failed(w, rc, "marking rows confirmed while the database was away");
			return rc;
		}
		marked += n;
		changed += hit;
		i += n;
	}
	log_event(LOG_INFO, w->component, "marked rows confirmed while the database was away",
	          LOG_UINT("rows", changed), LOG_UINT("no_longer_ours", marked - changed));
	atomic_fetch_add_explicit(&g_metrics.published, changed, memory_order_relaxed);
	clear_owed(w);
	return 0;
}

static void log_failure(struct worker *w, const struct outbox_row *row,
                        const struct broker_result *res, const struct store_failure *f,
                        int attempts, enum log_level retry_level)
{
	if (!f->dead) {
		log_event(retry_level, w->component, "could not publish, will retry",
		          LOG_STR("id", row->id), LOG_STR("exchange", row->exchange),
		          LOG_STR("routing_key", row->routing_key), LOG_INT("attempt", attempts),
		          LOG_MS("retry_in", f->delay_ms), LOG_STR("error", res->error),
		          LOG_OPT("trace_id", res->trace_id[0] ? res->trace_id : NULL));
		return;
	}
	log_event(LOG_ERROR, w->component,
	          "message is dead, an operator must requeue or discard it", LOG_STR("id", row->id),
	          LOG_STR("exchange", row->exchange), LOG_STR("routing_key", row->routing_key),
	          LOG_INT("attempts", attempts), LOG_STR("error", res->error),
	          LOG_OPT("ordering_key", row->ordering_key),
	          LOG_OPT("trace_id", res->trace_id[0] ? res->trace_id : NULL));
	if (row->ordering_key && w->cfg->relay_ordering == CONFIG_ORDERING_SKIP_DEAD) {
		log_event(LOG_ERROR, w->component, "dead row set aside, its ordering key moves on",
		          LOG_STR("ordering_key", row->ordering_key), LOG_STR("id", row->id));
		atomic_fetch_add_explicit(&g_metrics.skipped_dead, 1, memory_order_relaxed);
	}
}

/* Counts a mark's answer: hit of its rows were still ours. */
static void marked(struct worker *w, size_t hit)
{
	w->mark = MARK_NONE;
	/* A row not hit was taken over by another relay after its lease ran out (it will be
	 * published and marked there): counted once, by whoever marked it. */
	atomic_fetch_add_explicit(&g_metrics.published, hit, memory_order_relaxed);
	metrics_observe(&g_metrics.batch_duration, (uint64_t)(clock_mono_us() - w->marking_t0_us));
}

/* Reads the answer to the mark sent at the end of the previous cycle, sending it first if it
 * was held for a claim that is not coming. On failure the ids are kept to be marked after
 * reconnecting. */
static int finish_mark(struct worker *w)
{
	size_t hit = 0;
	int rc;

	if (w->mark == MARK_HELD) {
		rc = store_mark_published_send(w->store, w->marking_token, w->published,
		                               w->n_marking, w->cfg->relay_retention_ms == 0);
		if (rc < 0) {
			db_failed(w, rc, "marking rows published"); /* owes the mark (drop_db) */
			return rc;
		}
		w->mark = MARK_SENT;
	}
	if (w->mark != MARK_SENT) /* none, or the claim's answer brings it (cycle()) */
		return 0;
	rc = store_mark_published_recv(w->store, &hit);
	if (rc < 0) {
		db_failed(w, rc, "marking rows published"); /* owes the mark (drop_db) */
		return rc;
	}
	marked(w, hit);
	return 0;
}

static void prepare(struct worker *w, const struct store_batch *b)
{
	for (size_t i = 0; i < b->n; i++) {
		w->res[i].outcome = BROKER_PENDING;
		w->res[i].error[0] = '\0';
		w->res[i].confirm_us = 0;
	}
}

/* Nacks a connection backs off for: fewer rows than this are a few rows' trouble, whatever
 * share of their batch they are (under a trickle a batch is a row or two). */
#define NACKS_BACKOFF_MIN 8

/* A broker condition is told from one destination's trouble (a queue rejecting publishes
 * because it is full, one quorum queue without its majority) by its breadth: most of a batch
 * of some size, on more than one exchange and routing key. One destination's rows back off
 * each by itself (DESIGN §4) while the rest keeps flowing: backing off the connection for
 * them held up every healthy queue, after every row, for up to RECONNECT_MAX_MS. */
bool worker_nacks_back_off(size_t rows, size_t nacked, bool one_destination)
{
	return nacked >= NACKS_BACKOFF_MIN && 2 * nacked > rows && !one_destination;
}

/* The outcome of one batch, sorted by what the database must hear. */
struct settled {
	size_t n_pub, n_fail, n_rel, n_nacked;
	/* Most of a batch of NACKS_BACKOFF_MIN rows or more nacked: its rows are logged at
	 * debug, the batch once (nacked_most()). back_off: a broker condition
	 * (worker_nacks_back_off), else one destination's, the first nacked row's. */
	bool quiet_nacks, back_off;
	const struct outbox_row *nacked_row;
};

/* Sorts every row of b by the broker's answer into published[], failures[] and released[];
 * logs and counts the failures. A nack is the broker's own failure (a quorum queue without a
 * majority, reject-publish overflow): the row backs off but is not charged an attempt, so an
 * outage can never make good rows dead. */
static void classify(struct worker *w, const struct store_batch *b, struct settled *st)
{
	const struct config *cfg = w->cfg;
	const struct outbox_row *first = NULL;
	size_t nacked = 0;
	bool one_destination = true;

	/* Most of a batch nacked is one condition of the broker, said once by nacked_most():
	 * its rows are logged at debug then, not as thousands of warn lines. */
	for (size_t i = 0; i < b->n; i++) {
		if (w->res[i].outcome != BROKER_NACKED)
			continue;
		if (nacked++ == 0)
			first = &b->rows[i];
		else if (one_destination)
			one_destination = strcmp(b->rows[i].exchange, first->exchange) == 0 &&
			                  strcmp(b->rows[i].routing_key, first->routing_key) == 0;
	}
	st->quiet_nacks = nacked >= NACKS_BACKOFF_MIN && 2 * nacked > b->n;
	st->back_off = worker_nacks_back_off(b->n, nacked, one_destination);
	st->nacked_row = first;

	for (size_t i = 0; i < b->n; i++) {
		const struct outbox_row *r = &b->rows[i];
		struct broker_result *res = &w->res[i];
		struct store_failure *f;
		int attempts;

		switch (res->outcome) {
		case BROKER_ACKED:
			w->published[st->n_pub++] = r->seq;
			/* A row made pending by `outbox-relay replay` carries its header. */
			if (store_row_replayed(r))
				atomic_fetch_add_explicit(&g_metrics.replayed, 1,
				                          memory_order_relaxed);
			metrics_observe(&g_metrics.confirm_latency, (uint64_t)res->confirm_us);
			break;
		case BROKER_PENDING:
			w->released[st->n_rel++] = r->id;
			break;
		default:
			f = &w->failures[st->n_fail++];
			f->id = r->id;
			f->error = res->error;
			f->uncounted = res->outcome == BROKER_NACKED;
			attempts = f->uncounted ? r->attempts : r->attempts + 1;
			f->dead = res->outcome == BROKER_INVALID ||
			          (!f->uncounted && attempts >= cfg->relay_max_attempts);
			if (res->outcome == BROKER_INVALID)
				attempts = (int)cfg->relay_max_attempts;
			if (f->uncounted)
				st->n_nacked++;
			f->delay_ms = f->dead ? 0
			                      : backoff_ms(cfg->relay_retry_backoff_min_ms,
			                                   cfg->relay_retry_backoff_max_ms,
			                                   attempts > 0 ? attempts : 1, &w->seed);
			atomic_fetch_add_explicit(&g_metrics.failed[fail_reason(res->outcome)], 1,
			                          memory_order_relaxed);
			if (f->dead)
				atomic_fetch_add_explicit(&g_metrics.dead, 1, memory_order_relaxed);
			log_failure(w, r, res, f, attempts,
			            f->uncounted && st->quiet_nacks ? LOG_DEBUG : LOG_WARN);
			break;
		}
	}
}

/* Chooses where the next claim starts. Nothing below the first row of the current batch
 * was claimable when it was claimed, and the next rows of ordering keys published by this
 * batch or the previous one (whose mark has just committed) lie above their first rows. Rows
 * committed late below it are looked at all the same (the store keeps the floor below what
 * the last claim could not see). What else may have become claimable below it since
 * (released or retried rows, expired delays, keys moved on by other relays) is found by a
 * claim without a floor at least every poll interval. */
static void set_claim_floor(struct worker *w, const struct store_batch *x)
{
	int64_t now = clock_mono_ms();
	int64_t first = x->n ? x->rows[0].seq : 0;
	int64_t floor_seq = first;

	if (w->last_first_seq > 0 && w->last_first_seq < floor_seq)
		floor_seq = w->last_first_seq;
	w->last_first_seq = first;
	if (now - w->full_claim_ms >= w->cfg->relay_poll_interval_ms) {
		floor_seq = 0;
		w->full_claim_ms = now;
	}
	store_set_claim_floor(w->store, floor_seq);
}

/* Under a trickle of unkeyed rows each claim finds a row or two, and what the database spends
 * per message is the cost of its statements (claim, mark, commit), paid once a row; the broker
 * and the relay pay per batch too. After a batch well short of full, the next claim waits until
 * GATHER_US after the previous one went out, and takes the rows of that time together: at
 * 2,000 rows a second this cut the database's CPU per message by a third. A row waits at most
 * that much longer. Batches with ordering keys never wait: they are short by nature (one head
 * per key), and a key's next row cannot be claimed before its mark anyway. */
#define GATHER_US 2000

int64_t worker_gather_us(int64_t since_claim_us, size_t rows, int batch_size, bool keyed)
{
	if (keyed || rows * 8 >= (size_t)batch_size || since_claim_us >= GATHER_US)
		return 0;
	return since_claim_us > 0 ? GATHER_US - since_claim_us : GATHER_US;
}

static bool batch_keyed(const struct store_batch *x)
{
	for (size_t i = 0; i < x->n; i++)
		if (x->rows[i].ordering_key)
			return true;
	return false;
}

static void gather(struct worker *w, const struct store_batch *x)
{
	clock_sleep_us(worker_gather_us(clock_mono_us() - w->claim_sent_us, x->n,
	                                w->cfg->relay_batch_size, batch_keyed(x)));
}

/* A batch claimed while the previous one waited for its confirms may have little lease left:
 * it is renewed first (fenced: rows another relay took meanwhile are dropped from the batch),
 * and every wait of its publishing ends before its lease does (broker_set_batch_deadline), so
 * that no row is ever waited on past its lease. A batch is never left aside for having too
 * little lease — on a loaded machine that could repeat for ever; at worst its confirms are
 * cut short and its rows released. False when nothing of x may be published. */
static bool lease_covers(struct worker *w, struct store_batch *x)
{
	int64_t spare = (w->cfg->relay_lease_ms - w->cfg->amqp_confirm_timeout_ms) / 2;
	int64_t margin =
	        spare < LEASE_MARGIN_MAX_MS ? (spare > 0 ? spare : 0) : LEASE_MARGIN_MAX_MS;
	int rc;

	if (x->lease_deadline_ms - clock_mono_ms() < w->cfg->amqp_confirm_timeout_ms + margin) {
		if (finish_mark(w) < 0)
			return false;
		rc = store_renew(w->store, x);
		if (rc < 0) {
			db_failed(w, rc, "renewing leases");
			return false;
		}
	}
	/* The mark that follows the confirms needs a moment of lease too (margin). */
	broker_set_batch_deadline(w->broker, x->lease_deadline_ms - margin);
	return x->n > 0 && x->lease_deadline_ms - margin > clock_mono_ms();
}

/* The database could not hear how the batch went: the confirmed rows are owed (marked after
 * reconnecting), everything else is left to its lease. */
static void cycle_db_lost(struct worker *w, const struct store_batch *x, size_t n_pub,
                          struct store_batch *next, int rc, const char *doing)
{
	owe_marks(w, x->token, w->published, n_pub);
	db_failed(w, rc, doing);
	next->n = 0;
}

/* Writes what the database must hear about batch x: failures and releases at once (they are
 * rare), the confirmed rows' mark sent now and read next turn, or held to go with the next
 * turn's claim when that claim is the full one (store_claim_carries_mark) and x has no
 * ordering key: one statement a turn instead of two. Under 1,500 durable commits a second
 * (claims of 4-6 rows) that cut the relay's database CPU per message by 6 % and its own by
 * 12 %. A keyed batch is marked on its own, so that the next claim can take its keys' next
 * rows. */
static void settle(struct worker *w, struct store_batch *x, const struct settled *st,
                   struct store_batch *next, int64_t t0)
{
	int rc;

	if (st->n_fail) {
		rc = store_mark_failed(w->store, x->token, w->failures, st->n_fail, NULL);
		if (rc < 0) {
			/* The failure path failing is left to the lease: the rows come back after it
			 * and are tried again. */
			log_event(LOG_WARN, w->component,
			          "could not record failed rows, they return when their lease ends",
			          LOG_STR("error", store_errmsg(w->store)));
			cycle_db_lost(w, x, st->n_pub, next, rc, "marking rows failed");
			return;
		}
	}
	if (st->n_rel) {
		rc = store_release(w->store, x->token, w->released, st->n_rel);
		if (rc < 0) {
			cycle_db_lost(w, x, st->n_pub, next, rc, "releasing leases");
			return;
		}
		atomic_fetch_add_explicit(&g_metrics.released, st->n_rel, memory_order_relaxed);
	}
	if (!st->n_pub) {
		/* Nothing to mark: the batch is settled now (its duration is otherwise taken when
		 * the mark's answer is read). */
		metrics_observe(&g_metrics.batch_duration, (uint64_t)(clock_mono_us() - t0));
		return;
	}
	if (next->n > 0 && store_claim_carries_mark(w->store) && !batch_keyed(x)) {
		w->mark = MARK_HELD;
	} else {
		rc = store_mark_published_send(w->store, x->token, w->published, st->n_pub,
		                               w->cfg->relay_retention_ms == 0);
		if (rc < 0) {
			cycle_db_lost(w, x, st->n_pub, next, rc, "marking rows published");
			return;
		}
		w->mark = MARK_SENT;
	}
	w->n_marking = st->n_pub;
	w->marking_t0_us = t0;
	snprintf(w->marking_token, sizeof(w->marking_token), "%s", x->token);
}

/* Most of a batch nacked, across destinations, is a condition of the broker (quorum queues
 * that lost their majority, a node refusing publishes), not of the rows: retrying row by row
 * would hammer it. Back off the whole connection as after a lost connection. Of one
 * destination, it is that queue's: its rows back off each by itself, said in one line. */
static void nacked_most(struct worker *w, const struct store_batch *x, const struct settled *st)
{
	if (!st->quiet_nacks)
		return;
	if (!st->back_off) {
		log_event(LOG_WARN, w->component,
		          "broker refused most of the batch for one destination, its rows back off",
		          LOG_UINT("nacked", st->n_nacked), LOG_UINT("rows", x->n),
		          LOG_STR("exchange", st->nacked_row->exchange),
		          LOG_STR("routing_key", st->nacked_row->routing_key));
		return;
	}
	log_event(LOG_WARN, w->component, "broker refused most of the batch, backing off",
	          LOG_UINT("nacked", st->n_nacked), LOG_UINT("rows", x->n));
	broker_disconnect(w->broker);
	endpoint_down(w, &w->mq, &g_metrics.broker_up, "broker", "broker nacked most of a batch");
}

/* One turn of the pipeline. The current batch is published; meanwhile the database finishes
 * marking the previous batch and claims the next one, so the broker and the database work at
 * the same time. Then every row of the current batch is settled. */
static void cycle(struct worker *w)
{
	struct store_batch *x = &w->batches[w->cur];
	struct store_batch *next = &w->batches[1 - w->cur];
	struct settled st = { 0 };
	int64_t t0 = clock_mono_us();
	bool db_ok = true, claiming = false, disarm = w->armed, claim_now;
	int brc, rc;

	next->n = 0;
	if (grow(w, x->n + (size_t)w->cfg->relay_batch_size) < 0) {
		/* Nothing to release them with: the rows come back when their lease ends. */
		log_event(LOG_ERROR, w->component, "out of memory, leaving the batch to its lease");
		x->n = 0;
		return;
	}
	if (!lease_covers(w, x)) {
		x->n = 0; /* left to their lease: another relay, or this one later, takes them */
		return;
	}
	prepare(w, x);
	atomic_fetch_add_explicit(&g_metrics.claimed, x->n, memory_order_relaxed);

	brc = broker_publish(w->broker, x->rows, x->n, w->res);
	claim_now = brc == BROKER_OK && !atomic_load(&w->relay->stopping);
	/* A held mark goes with the claim, or on its own (finish_mark) when none follows. */
	if (!(claim_now && w->mark == MARK_HELD) && finish_mark(w) < 0)
		db_ok = false;
	if (db_ok && claim_now) {
		gather(w, x);
		set_claim_floor(w, x);
		/* Still armed when the claim after arming found rows: producers would notify on
		 * every commit while this loop is busy. This claim lets the lock go. */
		if (w->mark == MARK_HELD)
			rc = store_claim_mark_send(w->store, disarm, w->marking_token, w->published,
			                           w->n_marking, w->cfg->relay_retention_ms == 0);
		else
			rc = store_claim_send(w->store, disarm);
		w->claim_sent_us = clock_mono_us();
		if (rc < 0) {
			db_failed(w, rc, "claiming rows"); /* owes a held mark (drop_db) */
			db_ok = false;
		} else {
			claiming = true;
			if (w->mark == MARK_HELD)
				w->mark = MARK_IN_CLAIM;
		}
	}
	if (brc == BROKER_OK)
		brc = broker_confirm(w->broker, x->rows, x->n, w->res);
	if (claiming) {
		rc = store_claim_recv(w->store, next);
		if (rc < 0) {
			db_failed(w, rc, "claiming rows"); /* owes the mark it carried (drop_db) */
			db_ok = false;
			next->n = 0;
		} else {
			w->db.streak = 0;
			if (disarm)
				w->armed = false;
			if (w->mark == MARK_IN_CLAIM)
				marked(w, store_claim_marked(w->store));
			report_unheld(w, next);
			drop_notifications(w);
		}
	}

	classify(w, x, &st);
	/* The broker did useful work only if it took something: a batch it nacked whole (a queue
	 * without its majority) must let the reconnect backoff grow. */
	if (brc == BROKER_OK && st.n_pub > 0)
		w->mq.streak = 0;
	if (brc < 0) {
		broker_failed(w, brc, true);
		/* The next batch cannot be published before the broker is back: hand it back now
		 * rather than after its lease. */
		if (next->n > 0 && db_ok) {
			for (size_t i = 0; i < next->n; i++)
				w->released[st.n_rel + i] = next->rows[i].id;
			rc = store_release(w->store, next->token, w->released + st.n_rel, next->n);
			if (rc < 0) {
				cycle_db_lost(w, x, st.n_pub, next, rc, "releasing leases");
				x->n = 0;
				return;
			}
		}
		next->n = 0;
	}
	if (!db_ok) {
		owe_marks(w, x->token, w->published, st.n_pub);
		x->n = 0;
		return;
	}
	settle(w, x, &st, next, t0);
	if (brc == BROKER_OK)
		nacked_most(w, x, &st);
	x->n = 0;
	w->cur = 1 - w->cur;
}

/* ---- the loop ---- */

/* Hands a claimed batch that cannot be published now (the broker is away, or the relay is
 * stopping) back at once rather than after its lease. */
static void hand_back(struct worker *w, struct store_batch *x)
{
	int rc;

	if (x->n == 0 || !store_connected(w->store))
		goto out;
	if (finish_mark(w) < 0 || grow(w, x->n) < 0)
		goto out;
	for (size_t i = 0; i < x->n; i++)
		w->released[i] = x->rows[i].id;
	rc = store_release(w->store, x->token, w->released, x->n);
	if (rc < 0) {
		log_event(LOG_WARN, w->component,
		          "could not release leases, they expire by themselves",
		          LOG_STR("error", store_errmsg(w->store)));
		db_failed(w, rc, "releasing leases");
		goto out;
	}
	atomic_fetch_add_explicit(&g_metrics.released, x->n, memory_order_relaxed);
out:
	x->n = 0;
}

/* A claim that looks at every claimable row before the loop may conclude there is none: from
 * the first unkeyed row, and through every ordering key (a claim looks at a few hundred keys;
 * the claims that follow go on through the rest, until one claims something or the keys run
 * out). Then the next claims start from the floor again. */
static int claim_everywhere(struct worker *w, bool disarm, struct store_batch *x)
{
	int rc;

	store_keys_restart(w->store);
	store_set_claim_floor(w->store, 0);
	rc = store_claim(w->store, disarm, x);
	if (rc == 0)
		report_unheld(w, x);
	store_set_claim_floor(w->store, STORE_FLOOR_KEYS_ONLY);
	while (rc == 0 && x->n == 0 && store_keys_more(w->store) &&
	       !atomic_load(&w->relay->stopping)) {
		set_tick(w);
		rc = store_claim(w->store, false, x);
		if (rc == 0)
			report_unheld(w, x);
	}
	store_set_claim_floor(w->store, 0);
	return rc;
}

/* After arming, before the last claim: a producer tests the wake-up lock when its INSERT ends,
 * not when it commits, so one that tested just before the lock was taken does not notify,
 * and its rows may commit after a claim. It drew its seq before testing and holds the
 * sequence's lock until it ends: once a sample of the lock holders read now has seen every
 * one of them end (the watermark settles), a claim sees all their rows. So the worker samples
 * again (pauses of 1, 2, 4 ... ms, at most CATCH_UP_PAUSE_MS, listening meanwhile) until that
 * happens or a poll interval has passed: a producer that inserts and then works on before it
 * commits is caught within CATCH_UP_PAUSE_MS of its commit, and while no producer's
 * transaction is open this is one sample. The same settling makes keyed rows committed just
 * now claimable. Returns 0 (claim now), 1 when a notification came meanwhile (go round the
 * loop), or -1 (a database error, handled). */
#define CATCH_UP_PAUSE_MS 50

static int catch_up(struct worker *w)
{
	int64_t end = clock_mono_ms() + w->cfg->relay_poll_interval_ms, pause = 1;
	int rc;

	for (;;) {
		rc = store_settle_watermark(w->store);
		if (rc < 0) {
			db_failed(w, rc, "settling the ordering watermark");
			return -1;
		}
		if (rc == 0 || clock_mono_ms() + pause > end)
			return 0;
		if (wait_for_work(w, clock_mono_ms() + pause))
			return 1;
		pause = pause * 2 < CATCH_UP_PAUSE_MS ? pause * 2 : CATCH_UP_PAUSE_MS;
	}
}

/* Takes the wake-up lock before sleeping. Every producer's INSERT takes it shared for an
 * instant to test it, and a try in that instant is refused as it would be by a relay asleep:
 * taken for one, it had the relay sleep its poll interval unarmed while no relay was armed,
 * producers not notifying, new rows waiting the whole interval. So a refusal is read as
 * another relay's only when the lock list shows one holding it; otherwise the lock is tried
 * again at once, ARM_TRIES times in all. Returns ARM_ARMED, ARM_ELSEWHERE (another relay is
 * armed: its notifications reach this one too), ARM_CONTENDED (producers held it at every
 * try: the caller pauses, 1 ms and doubling up to ARM_PAUSE_MAX_MS, and comes round), or -1 (a database
 * error, handled). */
#define ARM_TRIES        3
#define ARM_PAUSE_MAX_MS 50
enum { ARM_ARMED = 1, ARM_ELSEWHERE, ARM_CONTENDED };

static int arm(struct worker *w)
{
	int rc;

	for (int i = 0; i < ARM_TRIES; i++) {
		rc = store_arm(w->store);
		if (rc < 0) {
			db_failed(w, rc, "arming the wake-up");
			return -1;
		}
		if (rc == 1)
			break;
		rc = store_wakeup_armed_elsewhere(w->store);
		if (rc < 0) {
			db_failed(w, rc, "arming the wake-up");
			return -1;
		}
		if (rc == 1) {
			w->armed = false;
			w->arm_pause_ms = 1;
			return ARM_ELSEWHERE;
		}
	}
	w->armed = rc == 1;
	if (!w->armed)
		return ARM_CONTENDED;
	w->arm_pause_ms = 1;
	return ARM_ARMED;
}

static void worker_loop(struct worker *w)
{
	const struct config *cfg = w->cfg;
	int rc;

	while (!atomic_load(&w->relay->stopping)) {
		struct store_batch *x = &w->batches[w->cur];
		bool db_ok, mq_ok, contended;

		set_tick(w);
		db_ok = ensure_db(w);
		mq_ok = ensure_broker(w);
		if (!db_ok || !mq_ok) {
			int64_t next = INT64_MAX;

			/* Nothing may wait on the database connection while we sleep: the mark in
			 * flight is read now, and a batch the broker cannot take goes back. */
			if (db_ok) {
				hand_back(w, x);
				if (finish_mark(w) < 0)
					continue;
				/* No notification can help while the broker is away, and each
				 * costs a producer's commit: let the wake-up lock go. */
				if (w->armed) {
					rc = store_disarm(w->store);
					if (rc < 0) {
						db_failed(w, rc, "disarming the wake-up");
						continue;
					}
					w->armed = false;
				}
			}

			if (!db_ok)
				next = w->db.retry_at_ms;
			if (!mq_ok && w->mq.retry_at_ms < next)
				next = w->mq.retry_at_ms;
			wait_for_work(w, next);
			continue;
		}
		if (x->n > 0) {
			/* Any non-empty batch claims again at once: under load the loop never sleeps,
			 * so it never takes the wake-up lock and producers never pay for a NOTIFY. */
			cycle(w);
			continue;
		}
		/* The pipeline ran dry: settle the last mark before using the connection again. */
		if (finish_mark(w) < 0)
			continue;
		if (w->n_owed && pay_owed(w) < 0)
			continue;

		w->last_first_seq = 0;
		w->full_claim_ms = clock_mono_ms();
		rc = claim_everywhere(w, w->armed, x);
		if (rc < 0) {
			db_failed(w, rc, "claiming rows");
			continue;
		}
		w->db.streak = 0;
		w->armed = false;
		if (x->n > 0)
			continue;

		/* Arm, then claim once more before sleeping: a row committed before the lock was
		 * taken did not notify, but that claim sees it (catch_up()). */
		rc = arm(w);
		if (rc < 0)
			continue;
		contended = rc == ARM_CONTENDED;
		rc = catch_up(w);
		if (rc < 0)
			continue;
		if (rc == 0) {
			rc = claim_everywhere(w, false, x);
			if (rc < 0) {
				db_failed(w, rc, "claiming rows");
				continue;
			}
			if (x->n > 0)
				continue;
			if (contended) {
				/* Nobody is armed: pause a moment, then round again to arm. */
				int64_t nap = w->arm_pause_ms;

				if (nap > cfg->relay_poll_interval_ms)
					nap = cfg->relay_poll_interval_ms;
				wait_for_work(w, clock_mono_ms() + nap);
				if (w->arm_pause_ms * 2 <= ARM_PAUSE_MAX_MS)
					w->arm_pause_ms *= 2;
				continue;
			}
			wait_for_work(w, clock_mono_ms() + cfg->relay_poll_interval_ms);
		}
	}
}

void *worker_main(void *arg)
{
	struct worker *w = arg;

	set_tick(w);
	worker_loop(w);

	/* Orderly shutdown: the last mark is read, a batch claimed but not yet published is handed
	 * back, and whatever is owed is paid if the database lets us (all bounded by the
	 * shutdown deadline: the store gives up with STORE_ERR_ABORTED at it). */
	if (store_connected(w->store) && finish_mark(w) == 0) {
		hand_back(w, &w->batches[w->cur]);
		if (w->n_owed && store_connected(w->store) && pay_owed(w) < 0)
			log_event(LOG_WARN, w->component, "could not mark confirmed rows");
	}
	if (w->n_owed)
		log_event(
		        LOG_WARN, w->component,
		        "exiting with confirmed rows unmarked; they will be published again after "
		        "their lease");
	if (w->db.up)
		atomic_fetch_sub_explicit(&g_metrics.db_up, 1, memory_order_relaxed);
	if (w->mq.up)
		atomic_fetch_sub_explicit(&g_metrics.broker_up, 1, memory_order_relaxed);
	w->db.up = w->mq.up = false;
	broker_disconnect(w->broker);
	store_disconnect(w->store);
	atomic_store(&w->done, 1);
	return NULL;
}

struct worker *worker_new(struct relay *r, int index)
{
	const struct config *cfg = r->cfg;
	struct worker *w = calloc(1, sizeof(*w));

	if (!w)
		return NULL;
	w->index = index;
	w->relay = r;
	w->cfg = cfg;
	w->seed = (uint64_t)clock_mono_us() ^ ((uint64_t)(index + 1) * 0x9E3779B97F4A7C15ull);
	w->arm_pause_ms = 1;
	snprintf(w->component, sizeof(w->component), "worker%d", index + 1);
	snprintf(w->app_name, sizeof(w->app_name), "outbox-relay worker %d", index + 1);

	relay_store_options(cfg, r, false, w->app_name, &w->sopts);
	/* A long wait that is still working keeps /healthz at 200. */
	w->sopts.progress_ms = &g_metrics.tick_ms[index];

	w->bopts.url = cfg->amqp_url;
	w->bopts.heartbeat_ms = cfg->amqp_heartbeat_ms;
	w->bopts.confirm_timeout_ms = cfg->amqp_confirm_timeout_ms;
	w->bopts.tls_ca_file = cfg->amqp_tls_ca_file;
	w->bopts.tls_cert_file = cfg->amqp_tls_cert_file;
	w->bopts.tls_key_file = cfg->amqp_tls_key_file;
	w->bopts.tls_verify_peer = cfg->amqp_tls_verify_peer;
	w->bopts.connection_name = w->app_name;
	w->bopts.abort_at_ms = &r->abort_at_ms;
	w->bopts.wake_fd = r->wake_fd;
	w->bopts.progress_ms = &g_metrics.tick_ms[index];

	store_batch_init(&w->batches[0]);
	store_batch_init(&w->batches[1]);
	w->store = store_new(&w->sopts);
	w->broker = broker_new(&w->bopts);
	if (!w->store || !w->broker) {
		worker_free(w);
		return NULL;
	}
	return w;
}

bool worker_done(const struct worker *w)
{
	return atomic_load(&w->done) != 0;
}

void worker_interrupt_broker(struct worker *w)
{
	broker_interrupt(w->broker);
}

void worker_interrupt_store(struct worker *w)
{
	store_interrupt(w->store);
}

int worker_token_stem(const struct worker *w, char *out, size_t cap)
{
	return store_token_stem(w->store, out, cap);
}

void worker_free(struct worker *w)
{
	if (!w)
		return;
	store_free(w->store);
	broker_free(w->broker);
	store_batch_free(&w->batches[0]);
	store_batch_free(&w->batches[1]);
	free(w->res);
	free(w->published);
	free(w->released);
	free(w->failures);
	clear_owed(w);
	free(w);
}
