/* The relay loop's two connections: connecting the source and the broker, losing them, the
 * reconnect backoff, and waiting on both (relay/worker_private.h). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>

#include "amqp/broker.h"
#include "base/clock.h"
#include "relay/backoff.h"
#include "relay/log.h"
#include "relay/metrics.h"
#include "relay/relay.h"
#include "relay/worker_private.h"
#include "store/source/source.h"

/* Reconnect backoff bounds: quick first retry (a restart takes seconds), capped so an outage
 * costs at most this long after the far end is back. */
#define RECONNECT_MIN_MS 250
#define RECONNECT_MAX_MS 15000

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

bool worker_ensure_db(struct worker *w)
{
	int rc;

	if (source_connected(w->source))
		return true;
	if (w->db.up) {
		/* The connection went while nothing failed loudly (libpq found the socket closed
		 * while reading notifications, say): it is lost like any other, and said so. */
		worker_db_failed(w, STORE_ERR_CONN);
		return false;
	}
	if (clock_mono_ms() < w->db.retry_at_ms)
		return false;
	rc = source_connect(w->source);
	if (rc == STORE_OK) {
		/* Said before the connection counts as up, so once /readyz answers 200 every loop
		 * has looked. */
		if (!source_wakeup_current(w->source) &&
		    !atomic_exchange(&w->relay->wakeup_said, 1))
			log_event(LOG_WARN, w->component,
			          "the table's wake-up trigger is missing or outdated, "
			          "new rows are found by polling: run 'outbox-relay migrate'",
			          LOG_STR("table", w->cfg->database_table),
			          LOG_MS("poll_interval", w->cfg->relay_poll_interval_ms));
		endpoint_up(w, &w->db, &w->relay->metrics.db_up, "database",
		            source_server(w->source));
		return true;
	}
	if (rc == STORE_ERR_UNSUPPORTED) {
		/* No retry can fix this connection: say so once and stop the source (exit 1). */
		log_event(LOG_ERROR, w->component, "cannot relay through this database connection",
		          LOG_STR("error", source_errmsg(w->source)));
		relay_fail(w->relay);
		return false;
	}
	if (rc == STORE_ERR_ABORTED)
		return false; /* stopping */
	endpoint_down(w, &w->db, &w->relay->metrics.db_up, "database", source_errmsg(w->source));
	return false;
}

bool worker_ensure_broker(struct worker *w)
{
	int rc;

	if (broker_connected(w->broker))
		return true;
	if (clock_mono_ms() < w->mq.retry_at_ms)
		return false;
	rc = broker_connect(w->broker);
	if (rc == BROKER_OK) {
		const char *node = broker_node(w->broker);

		endpoint_up(w, &w->mq, &w->relay->metrics.broker_up, "broker", node);
		/* Another node than last time: the cluster failed over (or we spread out). */
		if (w->node[0] && strcmp(w->node, node) != 0)
			atomic_fetch_add_explicit(&w->relay->metrics.broker_failovers, 1,
			                          memory_order_relaxed);
		snprintf(w->node, sizeof(w->node), "%s", node);
		metrics_set_broker_node(&w->relay->metrics, w->index, node);
		return true;
	}
	if (rc == BROKER_ERR_ABORTED)
		return false; /* stopping */
	endpoint_down(w, &w->mq, &w->relay->metrics.broker_up, "broker", broker_errmsg(w->broker));
	return false;
}

void worker_db_failed(struct worker *w, int rc)
{
	const char *doing = source_step_text(source_step(w->source));

	if (rc == STORE_ERR_CONN || rc == STORE_ERR_ABORTED || !source_connected(w->source)) {
		source_disconnect(w->source);
		if (rc == STORE_ERR_ABORTED) {
			log_event(LOG_WARN, w->component, "stopping: gave up on the database",
			          LOG_STR("doing", doing),
			          LOG_STR("error", source_errmsg(w->source)));
			return;
		}
		endpoint_down(w, &w->db, &w->relay->metrics.db_up, "database",
		              source_errmsg(w->source));
		return;
	}
	/* The connection is alive but the statement failed (lock timeout, constraint, a DBA
	 * dropping a column...): say so and back off; leases keep the rows safe. */
	log_event(LOG_ERROR, w->component, "database statement failed, will retry",
	          LOG_STR("doing", doing), LOG_STR("error", source_errmsg(w->source)));
	source_disconnect(w->source);
	endpoint_down(w, &w->db, &w->relay->metrics.db_up, "database", source_errmsg(w->source));
}

/* in_batch: rows were waiting for confirms, and have been released by the caller. */
void worker_broker_failed(struct worker *w, int rc, bool in_batch)
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
	endpoint_down(w, &w->mq, &w->relay->metrics.broker_up, "broker", broker_errmsg(w->broker));
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
bool worker_wait(struct worker *w, int64_t deadline_ms)
{
	int64_t hb_ms = w->cfg->amqp_heartbeat_ms > 0 ? w->cfg->amqp_heartbeat_ms / 2 : 5000;

	if (source_fd(w->source) >= 0) {
		bool woken = false;
		int rc = source_input(w->source, &woken);

		if (rc < 0) {
			worker_db_failed(w, rc);
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

		worker_tick(w);
		if (atomic_load(&w->relay->stopping))
			return true;
		if (timeout <= 0)
			return false;
		if (timeout > hb_ms)
			timeout = hb_ms;
		pfd[n].fd = w->relay->wake_fd;
		pfd[n++].events = POLLIN;
		if (source_fd(w->source) >= 0) {
			db_i = (int)n;
			pfd[n].fd = source_fd(w->source);
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
			rc = source_input(w->source, &woken);
			if (rc < 0) {
				worker_db_failed(w, rc);
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
				worker_broker_failed(w, rc, false);
				return true;
			}
		}
	}
}

void worker_broker_back_off(struct worker *w, const char *why)
{
	broker_disconnect(w->broker);
	endpoint_down(w, &w->mq, &w->relay->metrics.broker_up, "broker", why);
}
