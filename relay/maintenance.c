/* The maintenance loop: refreshes the table gauges behind /metrics and the summary line, and
 * purges published rows past relay.retention in bounded batches, on its own connection so
 * that neither a scrape nor a purge ever waits on (or slows) a relay loop. */
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "relay/backoff.h"
#include "base/clock.h"
#include "relay/log.h"
#include "relay/metrics.h"
#include "relay/relay.h"
#include "store/source/source.h"

#define GAUGE_INTERVAL_MS 5000
/* The gauges' statement may take at most 1/GAUGE_DUTY of the time (see below). */
#define GAUGE_DUTY 20
/* ... but the figures are never left older than this. */
#define GAUGE_DELAY_MAX_MS 300000
#define PURGE_BATCH        5000

struct maintenance {
	struct relay *relay;
	struct source_options opts;
	struct source *source; /* admin: the backlog and retention only */
	pthread_t thread;
	atomic_int stop_purge;
	uint64_t seed;
	bool ahead_failing; /* the last call for partitions ahead failed (said once) */
};

/* Returns how long the reading took, or -1 when it failed (the next one then comes at the usual
 * interval, however long the failure took: a statement timeout must not put it off for
 * minutes). */
static int64_t refresh_gauges(struct maintenance *m)
{
	struct store_status st;
	int64_t t0 = clock_mono_ms();

	if (source_backlog(m->source, &st) < 0) {
		log_event(LOG_WARN, "maintenance", "could not read table status, will retry",
		          LOG_STR("error", source_errmsg(m->source)));
		source_disconnect(m->source);
		return -1;
	}
	atomic_store(&m->relay->metrics.pending, st.pending);
	atomic_store(&m->relay->metrics.leased, st.leased);
	atomic_store(&m->relay->metrics.dead_rows, st.dead);
	atomic_store(&m->relay->metrics.published_rows, st.published);
	atomic_store(&m->relay->metrics.oldest_pending_age_ms,
	             (long long)(st.oldest_pending_age_s * 1000));
	atomic_store(&m->relay->metrics.blocked_keys, st.blocked_keys);
	atomic_store(&m->relay->metrics.table_stats_at_ms, clock_wall_ms());
	return clock_mono_ms() - t0;
}

/* With relay.retention = 0 the lease source deletes each row as it marks it; the cursor source
 * writes nothing into a published row, so its rows behind the position are deleted here, in
 * bulk, at most CURSOR_DELETE_INTERVAL_MS apart. */
#define CURSOR_DELETE_INTERVAL_MS 5000

static bool purges(const struct config *cfg)
{
	return cfg->relay_retention_ms > 0 || cfg->relay_source == CONFIG_SOURCE_CURSOR;
}

static int64_t purge_interval_ms(const struct config *cfg)
{
	if (cfg->relay_retention_ms == 0 &&
	    cfg->relay_purge_interval_ms > CURSOR_DELETE_INTERVAL_MS)
		return CURSOR_DELETE_INTERVAL_MS;
	return cfg->relay_purge_interval_ms;
}

static void purge(struct maintenance *m)
{
	const struct config *cfg = m->relay->cfg;
	int64_t deleted = 0;

	if (source_purge(m->source, cfg->relay_retention_ms, PURGE_BATCH, &m->stop_purge,
	                 &deleted) < 0) {
		log_event(LOG_WARN, "maintenance", "could not purge published rows, will retry",
		          LOG_STR("error", source_errmsg(m->source)));
		source_disconnect(m->source);
		return;
	}
	if (deleted > 0) {
		log_event(LOG_INFO, "maintenance", "purged published rows past retention",
		          LOG_INT("rows", deleted), LOG_MS("retention", cfg->relay_retention_ms));
	}
}

/* On a partitioned table, the partitions ahead of the producers, every turn: one cheap
 * statement when none is needed; a failure (a lock it waited 1 s for) is said once and tried
 * again at the next turn, while the partitions made earlier still take the rows. */
static void keep_partitions_ahead(struct maintenance *m)
{
	int made = 0;

	if (source_partitions_ahead(m->source, &made) < 0) {
		if (!m->ahead_failing)
			log_event(LOG_WARN, "maintenance",
			          "could not create partitions ahead, will retry",
			          LOG_STR("error", source_errmsg(m->source)));
		m->ahead_failing = true;
		return;
	}
	m->ahead_failing = false;
	if (made > 0)
		log_event(LOG_INFO, "maintenance", "created partitions ahead of the producers",
		          LOG_INT("partitions", made));
}

/* The gauges count every unpublished row (O(backlog), by design exact): over a backlog of
 * 400,000 rows the statement took about 0.6 s of a database core, which every 5 s would be 12 %
 * of a core spent on a gauge while the relay drains the backlog. So the next reading waits
 * GAUGE_INTERVAL_MS or GAUGE_DUTY times what the last one took, whichever is longer (12 s
 * after a 0.6 s reading), at most 5 minutes. */
int64_t maintenance_gauge_delay_ms(int64_t took_ms)
{
	if (took_ms <= GAUGE_INTERVAL_MS / GAUGE_DUTY)
		return GAUGE_INTERVAL_MS;
	if (took_ms >= GAUGE_DELAY_MAX_MS / GAUGE_DUTY)
		return GAUGE_DELAY_MAX_MS;
	return took_ms * GAUGE_DUTY;
}

static void *maintenance_main(void *arg)
{
	struct maintenance *m = arg;
	const struct config *cfg = m->relay->cfg;
	int64_t next_gauges = 0, next_purge = clock_mono_ms() + 1000, retry_at = 0;
	int64_t failures = 0;

	log_set_source(m->relay->name);
	while (!atomic_load(&m->relay->stopping)) {
		int64_t now = clock_mono_ms(), wait;
		struct pollfd p = { .fd = m->relay->wake_fd, .events = POLLIN };

		if (!source_connected(m->source) && now >= retry_at) {
			if (source_connect(m->source) < 0) {
				failures++;
				retry_at = now + backoff_ms(500, 30000, failures, &m->seed);
				if (failures == 1)
					log_event(LOG_WARN, "maintenance",
					          "could not connect to database, will retry",
					          LOG_STR("error", source_errmsg(m->source)));
			} else {
				failures = 0;
			}
		}
		if (source_connected(m->source)) {
			if (now >= next_gauges) {
				int64_t took = refresh_gauges(m);

				next_gauges = clock_mono_ms() + maintenance_gauge_delay_ms(took);
			}
			if (source_connected(m->source))
				keep_partitions_ahead(m);
			if (source_connected(m->source) && purges(cfg) && now >= next_purge) {
				purge(m);
				next_purge = now + purge_interval_ms(cfg);
			}
		}
		wait = next_gauges - clock_mono_ms();
		if (!source_connected(m->source))
			wait = retry_at - clock_mono_ms();
		if (wait < 10)
			wait = 10;
		if (wait > GAUGE_INTERVAL_MS)
			wait = GAUGE_INTERVAL_MS;
		(void)poll(&p, 1, (int)wait);
	}
	source_disconnect(m->source);
	return NULL;
}

struct maintenance *maintenance_start(struct relay *r)
{
	const struct config *cfg = r->cfg;
	struct maintenance *m = calloc(1, sizeof(*m));

	if (!m)
		return NULL;
	m->relay = r;
	m->seed = (uint64_t)clock_mono_us() | 1;
	relay_store_options(cfg, r, true, "outbox-relay maintenance", &m->opts.store);
	m->opts.store.channel = "";
	m->opts.kind = cfg->relay_source == CONFIG_SOURCE_CURSOR ? SOURCE_CURSOR : SOURCE_LEASE;
	m->opts.stopping = &r->stopping;
	m->source = source_new(&m->opts);
	if (!m->source || pthread_create(&m->thread, NULL, maintenance_main, m) != 0) {
		log_event(LOG_ERROR, "maintenance", "could not start the maintenance thread");
		source_free(m->source);
		free(m);
		return NULL;
	}
	return m;
}

void maintenance_stop(struct maintenance *m)
{
	if (!m)
		return;
	atomic_store(&m->stop_purge, 1);
	pthread_join(m->thread, NULL);
	source_free(m->source);
	free(m);
}
