/* `outbox-relay run`: start each source's relay loops and maintenance loop (one unit a source:
 * the named ones, or the one unnamed), the HTTP endpoint, log a summary line per source every
 * 10 s while busy, and shut down in order on SIGTERM/SIGINT (SIGHUP is only noted: the
 * configuration is immutable). A named source that fails stops alone. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "relay/http.h"
#include "relay/log.h"
#include "relay/metrics.h"
#include "relay/notify.h"
#include "relay/relay.h"
#include "store/store.h"
#include "store/source/lease.h"
#include "store/operator/schema.h"

#define SUMMARY_INTERVAL_MS 10000

/* What the last summary line counted from. */
struct summary_state {
	int64_t last_pub;
	uint64_t last_fail;
	int64_t last_ms;
};

/* The relay loops of one source: one worker and one thread each. */
struct crew {
	struct worker **workers;
	pthread_t *threads;
	int n, started;
	bool broker_cut, store_cut; /* the shutdown interrupted the calls still stuck */
};

/* One source as the main thread holds it: what its threads share (r), its loops, its
 * maintenance loop and its summary line. */
struct unit {
	struct relay r;
	struct crew crew;
	struct maintenance *maint;
	struct summary_state sum;
	bool reaped; /* its loops ended, were joined and its leases released */
};

/* Every unit, in static storage so that the signal handler may read it at any time (it is
 * filled before the handlers are installed and never freed): async-signal-safe. */
static struct unit g_unit_store[CONFIG_SOURCES_MAX + 1];
static struct relay *g_units[CONFIG_SOURCES_MAX + 1];
static atomic_int g_n_units;
/* Wakes the main loop (serve()) on a signal; each unit has a pipe of its own. */
static int wake_pipe[2] = { -1, -1 };
/* Set by the first SIGTERM/SIGINT. */
static atomic_int g_signalled;
/* Set by SIGHUP, read and cleared by serve(). */
static atomic_int g_hangup;

/* Stops r with its own relay.shutdown_timeout from now (cut: at once, for the broker end),
 * keeping earlier deadlines. Async-signal-safe: atomics and one write. The deadlines are
 * stored before the unit's self-pipe is written, so a wait that wakes on it finds them. */
static void stop_unit(struct relay *r, long long now, bool cut)
{
	long long at = now + (cut ? 0 : r->cfg->relay_shutdown_timeout_ms), expected = 0;

	if (cut) {
		atomic_store(&r->abort_at_ms, now);
		atomic_store(&r->db_deadline_ms, now + RELAY_SHUTDOWN_DB_GRACE_MS);
	} else if (atomic_compare_exchange_strong(&r->abort_at_ms, &expected, at)) {
		expected = 0;
		atomic_compare_exchange_strong(&r->db_deadline_ms, &expected,
		                               at + RELAY_SHUTDOWN_DB_GRACE_MS);
	}
	atomic_store(&r->stopping, 1);
	if (r->wake_wr >= 0) {
		ssize_t n = write(r->wake_wr, "x", 1);
		(void)n;
	}
}

/* Async-signal-safe: atomics, clock_gettime and writes. The first signal starts an orderly
 * shutdown of every unit, each bounded by its relay.shutdown_timeout; a second one cuts the
 * wait for outstanding confirms short. */
static void on_signal(int sig)
{
	int saved = errno, n = atomic_load(&g_n_units);
	struct timespec ts;
	long long now;
	bool again;

	(void)sig;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	now = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
	again = atomic_exchange(&g_signalled, 1) != 0;
	for (int i = 0; i < n; i++)
		stop_unit(g_units[i], now, again);
	if (wake_pipe[1] >= 0) {
		ssize_t w = write(wake_pipe[1], "x", 1);
		(void)w;
	}
	errno = saved;
}

void relay_fail(struct relay *r)
{
	atomic_store(&r->failed, 1);
	atomic_store(&r->metrics.source_failed, 1);
	/* The one unnamed source is the process: stop it as a signal would (exit 1). */
	if (!r->name[0]) {
		(void)raise(SIGTERM);
		return;
	}
	stop_unit(r, clock_mono_ms(), false);
}

/* SIGHUP asks daemons to reload; the configuration is one immutable snapshot, so it is only
 * noted (serve() says so). Left at its default it would end the process without the orderly
 * shutdown, with a status systemd counts as clean, so Restart=on-failure would not bring it
 * back. The wake pipe is not written: serve() looks 4 times a second anyway. */
static void on_hangup(int sig)
{
	(void)sig;
	atomic_store(&g_hangup, 1);
}

static int install_signals(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGTERM, &sa, NULL) < 0 || sigaction(SIGINT, &sa, NULL) < 0)
		return -1;
	sa.sa_handler = on_hangup;
	if (sigaction(SIGHUP, &sa, NULL) < 0)
		return -1;
	sa.sa_handler = SIG_IGN;
	return sigaction(SIGPIPE, &sa, NULL);
}

static void log_config(const struct config *cfg, bool named)
{
	/* The effective configuration on one line, secrets redacted: the first thing an operator
	 * reads when asking "what is it running with?". A named source's line leaves out the
	 * process-wide keys, which only the top level has. */
	size_t n = config_key_count(), k = 0;
	const char **kv = calloc(2 * n, sizeof(*kv));
	char *vals = calloc(n, 256);

	if (kv && vals) {
		for (size_t i = 0; i < n; i++) {
			if (named && config_key_process_wide(i))
				continue;
			config_value_text(cfg, i, vals + k * 256, 256);
			kv[2 * k] = config_key_name(i);
			kv[2 * k + 1] = vals + k * 256;
			k++;
		}
		log_event_kv(LOG_INFO, "config", "effective configuration", kv, k);
	}
	free(kv);
	free(vals);
}

/* One unit's summary line (its source named on it). */
static void summary(struct unit *u)
{
	struct summary_state *st = &u->sum;
	struct metrics *m = &u->r.metrics;
	int64_t now = clock_mono_ms();
	uint64_t pub = atomic_load_explicit(&m->published, memory_order_relaxed);
	uint64_t fail = 0;
	double secs = (double)(now - st->last_ms) / 1000.0;
	bool known = atomic_load(&m->table_stats_at_ms) != 0;

	for (int i = 0; i < METRICS_FAIL_REASONS; i++)
		fail += atomic_load_explicit(&m->failed[i], memory_order_relaxed);
	if ((int64_t)pub == st->last_pub && fail == st->last_fail) {
		st->last_ms = now; /* silence when idle */
		return;
	}
	/* Until the maintenance loop has read the table once, say so rather than print 0. */
	log_set_source(u->r.name);
	log_event(LOG_INFO, "relay", "summary", LOG_UINT("published", pub - (uint64_t)st->last_pub),
	          LOG_UINT("failed", fail - st->last_fail),
	          LOG_RATE("rate", secs > 0 ? (double)(pub - (uint64_t)st->last_pub) / secs : 0),
	          known ? LOG_INT("pending", atomic_load(&m->pending))
	                : LOG_STR("pending", "unknown"),
	          known ? LOG_MS("oldest_pending_age", atomic_load(&m->oldest_pending_age_ms))
	                : LOG_STR("oldest_pending_age", "unknown"));
	log_set_source(NULL);
	st->last_pub = (int64_t)pub;
	st->last_fail = fail;
	st->last_ms = now;
}

/* Releases whatever the unit's claims still hold after its loops stopped (rows claimed but
 * never published because we were stopping), so another relay takes them at once instead of
 * after the lease. Exactly this process's: by each loop's token stem, nonce included, so that
 * a relay given the same relay.id by mistake keeps the rows it is publishing. */
static void release_leases(struct unit *u)
{
	int n = u->crew.started;
	char(*stems)[STORE_TOKEN_MAX] = calloc((size_t)n + 1, sizeof(*stems));
	const char **ptrs = calloc((size_t)n + 1, sizeof(*ptrs));
	struct store_options o;
	struct store *s = NULL;
	size_t k = 0;

	if (!stems || !ptrs)
		goto out;
	for (int i = 0; i < n; i++)
		if (u->crew.workers[i] &&
		    worker_token_stem(u->crew.workers[i], stems[k], sizeof(stems[k])) == 0) {
			ptrs[k] = stems[k];
			k++;
		}
	relay_store_options(u->r.cfg, &u->r, true, "outbox-relay shutdown", &o);
	o.channel = "";
	s = store_new(&o);
	if (!s)
		goto out;
	if (store_connect(s) < 0 || store_release_claims(s, ptrs, k) < 0)
		log_event(LOG_WARN, "relay", "could not release leases, they expire by themselves",
		          LOG_STR("error", store_errmsg(s)));
out:
	store_free(s);
	free(stems);
	free(ptrs);
}

void relay_store_options(const struct config *cfg, const struct relay *r, bool admin,
                         const char *application_name, struct store_options *o)
{
	memset(o, 0, sizeof(*o));
	o->conninfo = cfg->database_url;
	o->table = cfg->database_table;
	o->channel = cfg->database_channel;
	o->relay_id = cfg->relay_id;
	o->application_name = application_name;
	o->lease_ms = cfg->relay_lease_ms;
	o->max_attempts = (int)cfg->relay_max_attempts;
	o->skip_dead = cfg->relay_ordering == CONFIG_ORDERING_SKIP_DEAD;
	o->batch_size = (int)cfg->relay_batch_size;
	o->batch_max_bytes = cfg->relay_batch_max_bytes;
	o->admin = admin;
	o->wake_fd = -1;
	if (r) {
		/* Its waits end at the shutdown deadline like the relay loops' (a stalled
		 * database must not hold the exit). */
		o->deadline_ms = &r->db_deadline_ms;
		o->wake_fd = r->wake_fd;
	}
}

/* A loop that has not ticked for this long is stuck (/healthz and the watchdog): a few polls
 * and a whole confirm wait beyond what a working loop ever takes between ticks. */
static int64_t stale_after_ms(const struct config *cfg)
{
	return 5 * cfg->relay_poll_interval_ms + cfg->amqp_confirm_timeout_ms + 10000;
}

/* Starts u's c->n loops; -1 when one could not be made or started (those started stay counted
 * in c->started, for the shutdown). */
static int start_crew(struct unit *u)
{
	struct crew *c = &u->crew;

	c->workers = calloc((size_t)c->n, sizeof(*c->workers));
	c->threads = calloc((size_t)c->n, sizeof(*c->threads));
	if (!c->workers || !c->threads)
		return -1;
	for (int i = 0; i < c->n; i++) {
		c->workers[i] = worker_new(&u->r, i);
		if (!c->workers[i])
			return -1;
	}
	for (; c->started < c->n; c->started++) {
		if (pthread_create(&c->threads[c->started], NULL, worker_main,
		                   c->workers[c->started]) != 0) {
			log_event(LOG_ERROR, "relay", "could not start a relay thread");
			return -1;
		}
	}
	return 0;
}

/* One look at u's stopping loops: true once all have finished. Their waits end by the
 * deadlines on their own; a call stuck where no deadline reaches (a write to a broker that
 * stopped reading) is interrupted shortly after its deadline, so that the process exits
 * within relay.shutdown_timeout + 1 s of the signal whatever the far ends do. */
static bool crew_finished(struct unit *u)
{
	struct crew *c = &u->crew;
	long long now = clock_mono_ms();
	bool all = true;

	for (int i = 0; i < c->started; i++)
		all = all && worker_done(c->workers[i]);
	if (all)
		return true;
	if (!c->broker_cut && now >= atomic_load(&u->r.abort_at_ms) + 200) {
		for (int i = 0; i < c->started; i++)
			if (!worker_done(c->workers[i]))
				worker_interrupt_broker(c->workers[i]);
		c->broker_cut = true;
	}
	if (!c->store_cut && now >= atomic_load(&u->r.db_deadline_ms) + 100) {
		for (int i = 0; i < c->started; i++)
			if (!worker_done(c->workers[i]))
				worker_interrupt_store(c->workers[i]);
		c->store_cut = true;
	}
	return false;
}

/* After u's loops finished: joins them, stops its maintenance loop and releases what its
 * claims still hold. Once. */
static void reap_unit(struct unit *u)
{
	if (u->reaped)
		return;
	for (int i = 0; i < u->crew.started; i++)
		pthread_join(u->crew.threads[i], NULL);
	maintenance_stop(u->maint);
	u->maint = NULL;
	log_set_source(u->r.name);
	if (u->crew.started > 0)
		release_leases(u);
	log_set_source(NULL);
	u->reaped = true;
}

static void free_unit(struct unit *u)
{
	struct crew *c = &u->crew;
	int rd, wr;

	if (c->workers)
		for (int i = 0; i < c->n; i++)
			worker_free(c->workers[i]);
	free(c->workers);
	free(c->threads);
	c->workers = NULL;
	c->threads = NULL;
	rd = u->r.wake_fd;
	wr = u->r.wake_wr;

	/* Forgotten before closed: a late signal must not write to a reused descriptor. */
	u->r.wake_fd = u->r.wake_wr = -1;
	if (wr >= 0)
		close(wr);
	if (rd >= 0)
		close(rd);
	metrics_destroy(&u->r.metrics);
}

/* A self-pipe: [0] read, [1] written (non-blocking); -1 when it cannot be made. */
static int open_pipe(int fds[2])
{
	if (pipe(fds) < 0) {
		log_event(LOG_ERROR, "relay", "could not create the wake-up pipe",
		          LOG_STR("error", strerror(errno)));
		fds[0] = fds[1] = -1;
		return -1;
	}
	(void)fcntl(fds[0], F_SETFD, FD_CLOEXEC);
	(void)fcntl(fds[1], F_SETFD, FD_CLOEXEC);
	(void)fcntl(fds[1], F_SETFL, O_NONBLOCK);
	return 0;
}

/* The unit of cfg (name: its source's, "" for the one unnamed source), reset for this run,
 * with its self-pipe; -1 when the pipe cannot be made. */
static int open_unit(struct unit *u, const struct config *cfg)
{
	int fds[2];

	memset(u, 0, sizeof(*u));
	metrics_init(&u->r.metrics);
	u->r.cfg = cfg;
	u->r.name = cfg->source_name ? cfg->source_name : "";
	u->r.wake_fd = u->r.wake_wr = -1;
	u->crew.n = (int)cfg->relay_workers;
	u->sum.last_ms = clock_mono_ms();
	if (open_pipe(fds) < 0)
		return -1;
	u->r.wake_fd = fds[0];
	u->r.wake_wr = fds[1];
	return 0;
}

static void close_wake_pipe(void)
{
	if (wake_pipe[0] >= 0)
		close(wake_pipe[0]);
	if (wake_pipe[1] >= 0)
		close(wake_pipe[1]);
	wake_pipe[0] = wake_pipe[1] = -1;
}

/* The start line (every URL redacted) and the effective configuration; with named sources,
 * a start line for the process and one for each source, naming it. */
static void log_start(const struct config *top, struct unit *units, size_t n)
{
	char db[512], mq[512];

	if (top->n_named > 0)
		log_event(LOG_INFO, "relay", "starting outbox-relay",
		          LOG_STR("version", OUTBOX_VERSION), LOG_UINT("sources", n),
		          LOG_STR("http", top->http_listen));
	for (size_t i = 0; i < n; i++) {
		const struct config *cfg = units[i].r.cfg;

		config_redact(cfg->database_url, db, sizeof(db));
		config_redact(cfg->amqp_url, mq, sizeof(mq));
		log_set_source(units[i].r.name);
		log_event(LOG_INFO, "relay", top->n_named > 0 ? "source" : "starting outbox-relay",
		          LOG_STR("version", OUTBOX_VERSION), LOG_STR("relay_id", cfg->relay_id),
		          LOG_STR("table", cfg->database_table), LOG_STR("database", db),
		          LOG_STR("broker", mq), LOG_INT("workers", cfg->relay_workers),
		          LOG_INT("batch_size", cfg->relay_batch_size),
		          LOG_STR("http", top->http_listen));
		log_config(cfg, cfg->source_name[0] != '\0');
		log_set_source(NULL);
	}
}

/* The HTTP endpoint when http.listen is set (*out stays NULL otherwise); -1 when it cannot
 * listen. */
static int start_http(const struct config *cfg, int64_t stale_ms, const struct metrics_unit *mu,
                      size_t n, struct http_server **out)
{
	char err[256];

	*out = NULL;
	if (!cfg->http_listen[0])
		return 0;
	*out = http_start(cfg->http_listen, stale_ms, OUTBOX_VERSION, mu, n, err, sizeof(err));
	if (!*out) {
		log_event(LOG_ERROR, "http", "could not start the HTTP endpoint",
		          LOG_STR("listen", cfg->http_listen), LOG_STR("error", err));
		return -1;
	}
	log_event(LOG_INFO, "http", "serving /healthz /readyz /metrics",
	          LOG_STR("listen", cfg->http_listen));
	return 0;
}

/* How long the start-up check of the table may take before the relay starts anyway (its loops
 * check again when they connect). */
#define START_CHECK_MS 5000

/* The table checks no retry can fix, before any loop claims: a seq sequence with CACHE > 1
 * (store_check_sequence()) is refused with one line naming the sequence and the fix. A
 * database that cannot be reached, or a table not there yet, is left to the loops, which
 * connect with backoff and refuse such a table the same way (and so never claim from it).
 * Returns 0 to go on, or 2 when the table is refused. */
static int check_table_at_start(const struct config *cfg)
{
	atomic_llong deadline = clock_mono_ms() + START_CHECK_MS;
	struct store_options o;
	struct store *s;
	int rc = 0;

	relay_store_options(cfg, NULL, true, "outbox-relay start-up check", &o);
	o.channel = "";
	o.deadline_ms = &deadline;
	s = store_new(&o);
	if (!s)
		return 0;
	if (store_connect(s) == 0 && store_check_sequence(s) == 1) {
		log_event(LOG_ERROR, "relay",
		          cfg->source_name && cfg->source_name[0]
		                  ? "cannot relay from this table, source not started"
		                  : "cannot relay from this table, not starting",
		          LOG_STR("table", cfg->database_table), LOG_STR("error", store_errmsg(s)));
		rc = 2;
	}
	store_free(s);
	return rc;
}

/* The table check of every unit. A named source whose table is refused is marked failed and
 * not started (the others start; it is not retried: the fix is an operator's, and a restart
 * applies it); the one unnamed source's refusal ends the start (exit 2), as does every named
 * source's. Returns 0 or the exit status. */
static int check_units(struct unit *units, size_t n)
{
	size_t refused = 0;

	for (size_t i = 0; i < n; i++) {
		struct unit *u = &units[i];

		log_set_source(u->r.name);
		if (check_table_at_start(u->r.cfg) != 0) {
			atomic_store(&u->r.failed, 1);
			atomic_store(&u->r.metrics.source_failed, 1);
			atomic_store(&u->r.stopping, 1);
			u->reaped = true; /* nothing to reap, and said already */
			refused++;
		}
		log_set_source(NULL);
	}
	return refused == n ? 2 : 0;
}

/* Starts the loops and the maintenance loop of every unit that passed its check; -1 when a
 * loop could not be made or started. */
static int start_units(struct unit *units, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		struct unit *u = &units[i];

		if (atomic_load(&u->r.failed))
			continue;
		atomic_store(&u->r.metrics.workers, u->crew.n);
		if (start_crew(u) < 0)
			return -1;
		u->maint = maintenance_start(&u->r);
	}
	return 0;
}

/* Whether any unit still runs (none stopping). */
static bool any_running(struct unit *units, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!atomic_load(&units[i].r.stopping))
			return true;
	return false;
}

/* The line for a named source that failed while running (once, after its loops ended). */
static void say_failed(struct unit *u)
{
	log_set_source(u->r.name);
	log_event(LOG_ERROR, "relay",
	          "source stopped on an error no retry can fix, the other sources go on");
	log_set_source(NULL);
}

/* A named source that stopped alone (it failed): once its loops have ended, reaped and said
 * once; the others go on. */
static void reap_failed(struct unit *units, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		struct unit *u = &units[i];

		if (u->reaped || !atomic_load(&u->r.stopping) || !crew_finished(u))
			continue;
		reap_unit(u);
		say_failed(u);
	}
}

/* The main thread while the loops run: readiness and the watchdog four times a second, a
 * summary line per source every SUMMARY_INTERVAL_MS, until a signal, or until no source
 * runs any more. */
static void serve(struct unit *units, size_t n)
{
	while (!atomic_load(&g_signalled) && any_running(units, n)) {
		struct pollfd p = { .fd = wake_pipe[0], .events = POLLIN };

		(void)poll(&p, 1, 250);
		if (atomic_exchange(&g_hangup, 0))
			log_event(LOG_INFO, "relay",
			          "received SIGHUP, configuration not reloaded: restart to apply "
			          "changes");
		notify_tick();
		for (size_t i = 0; i < n; i++)
			if (clock_mono_ms() - units[i].sum.last_ms >= SUMMARY_INTERVAL_MS)
				summary(&units[i]);
		if (n > 1 || units[0].r.name[0])
			reap_failed(units, n);
	}
}

/* Stops every unit (keeping deadlines a signal set) and waits for all their loops at once,
 * each bounded by its own shutdown deadlines; then joins them, stops their maintenance loops
 * and releases their leases, each with its own configuration. */
static void stop_units(struct unit *units, size_t n)
{
	long long now = clock_mono_ms();
	bool all;

	for (size_t i = 0; i < n; i++)
		stop_unit(&units[i].r, now, false);
	do {
		all = true;
		for (size_t i = 0; i < n; i++)
			if (!units[i].reaped)
				all = crew_finished(&units[i]) && all;
		if (!all)
			(void)poll(NULL, 0, 20);
	} while (!all);
	for (size_t i = 0; i < n; i++) {
		bool said = units[i].reaped;

		reap_unit(&units[i]);
		/* The last source to fail ends serve() before it could say so. */
		if (!said && units[i].r.name[0] && atomic_load(&units[i].r.failed))
			say_failed(&units[i]);
	}
}

/* Opens the units of cfg: the named sources, or cfg itself as the one unnamed source. Fills
 * mu (what /metrics, /readyz and sd_notify read) and the handler's table; returns how many
 * were opened (all of them, or fewer when a pipe could not be made). */
static size_t open_units(const struct config *cfg, struct unit *units, struct metrics_unit *mu,
                         size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		if (open_unit(&units[i], cfg->n_named > 0 ? cfg->named[i] : cfg) < 0) {
			free_unit(&units[i]);
			break;
		}
		g_units[i] = &units[i].r;
		mu[i].source = units[i].r.name;
		mu[i].m = &units[i].r.metrics;
	}
	atomic_store(&g_n_units, (int)i);
	return i;
}

/* The longest of the units' bounds: what the whole process is held to. */
static int64_t longest(const struct unit *units, size_t n, bool shutdown)
{
	int64_t v = 0;

	for (size_t i = 0; i < n; i++) {
		const struct config *c = units[i].r.cfg;
		int64_t x = shutdown ? c->relay_shutdown_timeout_ms : stale_after_ms(c);

		v = x > v ? x : v;
	}
	return v;
}

static bool any_failed(const struct unit *units, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (atomic_load(&units[i].r.failed))
			return true;
	return false;
}

/* The way out of a run (a signal, sources that cannot relay, or a failure to start): the
 * loops finish what is outstanding within their relay.shutdown_timeout, the maintenance loops
 * stop, what is still leased is released, and the endpoint goes last so that /readyz says so
 * meanwhile. rc: the status so far; returns the exit status. */
static int finish_run(const struct config *cfg, struct unit *units, size_t n, int rc,
                      struct http_server *http)
{
	bool started = false;

	for (size_t i = 0; i < n; i++)
		started = started || units[i].crew.started > 0;
	if (rc == 0) {
		log_event(LOG_INFO, "relay", "stopping: waiting for outstanding confirms",
		          LOG_MS("timeout", longest(units, n, true)));
		notify_stopping(any_failed(units, n) ? "cannot relay" : "signal");
	}
	stop_units(units, n);
	if (rc == 0 && any_failed(units, n))
		rc = 1;
	if (started && (rc == 0 || cfg->n_named > 0)) {
		for (size_t i = 0; i < n; i++)
			summary(&units[i]);
		log_event(LOG_INFO, "relay", "stopped");
	}
	http_stop(http);
	/* The handler no longer reaches the units once they are freed. */
	atomic_store(&g_n_units, 0);
	for (size_t i = 0; i < n; i++)
		free_unit(&units[i]);
	close_wake_pipe();
	return rc;
}

/* Start, serve, and on the way out stop in order (finish_run()). */
int command_run(const struct config *cfg, int argc, char **argv)
{
	size_t n = cfg->n_named > 0 ? cfg->n_named : 1, opened;
	struct unit *units = g_unit_store;
	struct metrics_unit mu[CONFIG_SOURCES_MAX + 1];
	struct http_server *http = NULL;
	int rc = 1;

	if (argc > 0) {
		fprintf(stderr, "outbox-relay: run takes no arguments, got '%s'\n", argv[0]);
		return 2;
	}
	if (n > CONFIG_SOURCES_MAX) {
		fprintf(stderr, "outbox-relay: %zu sources configured, at most %d\n", n,
		        CONFIG_SOURCES_MAX);
		return 2;
	}
	atomic_store(&g_signalled, 0);
	if (open_pipe(wake_pipe) < 0)
		return 1;
	opened = open_units(cfg, units, mu, n);
	if (opened < n || install_signals() < 0)
		return finish_run(cfg, units, opened, 1, NULL);
	log_start(cfg, units, n);
	if ((rc = check_units(units, n)) != 0)
		return finish_run(cfg, units, n, rc, NULL);
	notify_setup(longest(units, n, false), mu, n);
	if (start_http(cfg, longest(units, n, false), mu, n, &http) < 0 ||
	    start_units(units, n) < 0)
		return finish_run(cfg, units, n, 1, http);
	serve(units, n);
	return finish_run(cfg, units, n, 0, http);
}
