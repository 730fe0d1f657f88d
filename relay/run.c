/* `outbox-relay run`: start the relay loops, the maintenance loop and the HTTP endpoint, log a
 * summary line every 10 s while busy, and shut down in order on SIGTERM/SIGINT (SIGHUP is
 * only noted: the configuration is immutable). */
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

static struct relay g_relay;
static int wake_pipe[2] = { -1, -1 };
/* Set by SIGHUP, read and cleared by serve(). */
static atomic_int g_hangup;

/* Async-signal-safe: atomics, clock_gettime and one write. The first signal starts an orderly
 * shutdown bounded by relay.shutdown_timeout; a second one cuts the wait for outstanding
 * confirms short. The deadlines are stored before the self-pipe is written, so a wait that
 * wakes on the pipe finds them. */
static void on_signal(int sig)
{
	int saved = errno;
	struct timespec ts;
	long long now;

	(void)sig;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	now = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
	if (atomic_exchange(&g_relay.stopping, 1)) {
		atomic_store(&g_relay.abort_at_ms, now);
		atomic_store(&g_relay.db_deadline_ms, now + RELAY_SHUTDOWN_DB_GRACE_MS);
	} else {
		long long at = now + (g_relay.cfg ? g_relay.cfg->relay_shutdown_timeout_ms : 0);

		atomic_store(&g_relay.abort_at_ms, at);
		atomic_store(&g_relay.db_deadline_ms, at + RELAY_SHUTDOWN_DB_GRACE_MS);
	}
	if (wake_pipe[1] >= 0) {
		ssize_t n = write(wake_pipe[1], "x", 1);
		(void)n;
	}
	errno = saved;
}

/* SIGHUP asks daemons to reload; the configuration is one immutable snapshot, so it is only
 * noted (serve() says so). Left at its default it would end the process without the orderly
 * shutdown, with a status systemd counts as clean, so Restart=on-failure would not bring it
 * back. The wake pipe is not written: the loops never drain it, and serve() looks 4 times a
 * second anyway. */
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

static void log_config(const struct config *cfg)
{
	/* The effective configuration on one line, secrets redacted: the first thing an operator
	 * reads when asking "what is it running with?". */
	size_t n = config_key_count();
	const char **kv = calloc(2 * n, sizeof(*kv));
	char *vals = calloc(n, 256);

	if (kv && vals) {
		for (size_t i = 0; i < n; i++) {
			config_value_text(cfg, i, vals + i * 256, 256);
			kv[2 * i] = config_key_name(i);
			kv[2 * i + 1] = vals + i * 256;
		}
		log_event_kv(LOG_INFO, "config", "effective configuration", kv, n);
	}
	free(kv);
	free(vals);
}

/* What the last summary line counted from. */
struct summary_state {
	int64_t last_pub;
	uint64_t last_fail;
	int64_t last_ms;
};

static void summary(struct summary_state *st)
{
	int64_t now = clock_mono_ms();
	uint64_t pub = atomic_load_explicit(&g_metrics.published, memory_order_relaxed);
	uint64_t fail = 0;
	double secs = (double)(now - st->last_ms) / 1000.0;
	bool known = atomic_load(&g_metrics.table_stats_at_ms) != 0;

	for (int i = 0; i < METRICS_FAIL_REASONS; i++)
		fail += atomic_load_explicit(&g_metrics.failed[i], memory_order_relaxed);
	if ((int64_t)pub == st->last_pub && fail == st->last_fail) {
		st->last_ms = now; /* silence when idle */
		return;
	}
	/* Until the maintenance loop has read the table once, say so rather than print 0. */
	log_event(
	        LOG_INFO, "relay", "summary", LOG_UINT("published", pub - (uint64_t)st->last_pub),
	        LOG_UINT("failed", fail - st->last_fail),
	        LOG_RATE("rate", secs > 0 ? (double)(pub - (uint64_t)st->last_pub) / secs : 0),
	        known ? LOG_INT("pending", atomic_load(&g_metrics.pending))
	              : LOG_STR("pending", "unknown"),
	        known ? LOG_MS("oldest_pending_age", atomic_load(&g_metrics.oldest_pending_age_ms))
	              : LOG_STR("oldest_pending_age", "unknown"));
	st->last_pub = (int64_t)pub;
	st->last_fail = fail;
	st->last_ms = now;
}

/* Releases whatever this process's claims still hold after the loops stopped (rows claimed but
 * never published because we were stopping), so another relay takes them at once instead of
 * after the lease. Exactly this process's: by each loop's token stem, nonce included, so that
 * a relay given the same relay.id by mistake keeps the rows it is publishing. */
static void release_leases(const struct config *cfg, struct worker **workers, int n)
{
	char(*stems)[STORE_TOKEN_MAX] = calloc((size_t)n, sizeof(*stems));
	const char **ptrs = calloc((size_t)n, sizeof(*ptrs));
	struct store_options o;
	struct store *s = NULL;
	size_t k = 0;

	if (!stems || !ptrs)
		goto out;
	for (int i = 0; i < n; i++)
		if (workers[i] && worker_token_stem(workers[i], stems[k], sizeof(stems[k])) == 0) {
			ptrs[k] = stems[k];
			k++;
		}
	relay_store_options(cfg, &g_relay, true, "outbox-relay shutdown", &o);
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

/* Stops like a signal would (a start-up failure, or the main loop's own decision). */
static void begin_stop(const struct config *cfg)
{
	long long at = clock_mono_ms() + cfg->relay_shutdown_timeout_ms, expected = 0;

	/* Keep earlier deadlines set by a signal. */
	if (atomic_compare_exchange_strong(&g_relay.abort_at_ms, &expected, at)) {
		expected = 0;
		atomic_compare_exchange_strong(&g_relay.db_deadline_ms, &expected,
		                               at + RELAY_SHUTDOWN_DB_GRACE_MS);
	}
	atomic_store(&g_relay.stopping, 1);
	if (wake_pipe[1] >= 0) {
		ssize_t n = write(wake_pipe[1], "x", 1);
		(void)n;
	}
}

/* Waits for the relay loops to finish their orderly shutdown. Their waits end by the
 * deadlines on their own; a call stuck where no deadline reaches (a write to a broker that
 * stopped reading) is interrupted shortly after its deadline, so that the process exits
 * within relay.shutdown_timeout + 1 s of the signal whatever the far ends do. */
static void await_workers(struct worker **workers, int n)
{
	bool broker_cut = false, store_cut = false;

	for (;;) {
		long long now = clock_mono_ms();
		bool all = true;

		for (int i = 0; i < n; i++)
			all = all && worker_done(workers[i]);
		if (all)
			return;
		if (!broker_cut && now >= atomic_load(&g_relay.abort_at_ms) + 200) {
			for (int i = 0; i < n; i++)
				if (!worker_done(workers[i]))
					worker_interrupt_broker(workers[i]);
			broker_cut = true;
		}
		if (!store_cut && now >= atomic_load(&g_relay.db_deadline_ms) + 100) {
			for (int i = 0; i < n; i++)
				if (!worker_done(workers[i]))
					worker_interrupt_store(workers[i]);
			store_cut = true;
		}
		(void)poll(NULL, 0, 20);
	}
}

/* The self-pipe signals and begin_stop() write to wake every loop, and the shared state reset
 * for this run. -1 when the pipe cannot be made. */
static int open_wake_pipe(const struct config *cfg)
{
	if (pipe(wake_pipe) < 0) {
		log_event(LOG_ERROR, "relay", "could not create the wake-up pipe",
		          LOG_STR("error", strerror(errno)));
		return -1;
	}
	(void)fcntl(wake_pipe[0], F_SETFD, FD_CLOEXEC);
	(void)fcntl(wake_pipe[1], F_SETFD, FD_CLOEXEC);
	(void)fcntl(wake_pipe[1], F_SETFL, O_NONBLOCK);
	g_relay.cfg = cfg;
	g_relay.wake_fd = wake_pipe[0];
	atomic_store(&g_relay.stopping, 0);
	atomic_store(&g_relay.abort_at_ms, 0);
	atomic_store(&g_relay.db_deadline_ms, 0);
	atomic_store(&g_relay.failed, 0);
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

/* The start line (every URL redacted) and the effective configuration. */
static void log_start(const struct config *cfg)
{
	char db[512], mq[512];

	config_redact(cfg->database_url, db, sizeof(db));
	config_redact(cfg->amqp_url, mq, sizeof(mq));
	log_event(LOG_INFO, "relay", "starting outbox-relay", LOG_STR("version", OUTBOX_VERSION),
	          LOG_STR("relay_id", cfg->relay_id), LOG_STR("table", cfg->database_table),
	          LOG_STR("database", db), LOG_STR("broker", mq),
	          LOG_INT("workers", cfg->relay_workers),
	          LOG_INT("batch_size", cfg->relay_batch_size), LOG_STR("http", cfg->http_listen));
	log_config(cfg);
}

/* The HTTP endpoint when http.listen is set (*out stays NULL otherwise); -1 when it cannot
 * listen. */
static int start_http(const struct config *cfg, struct http_server **out)
{
	char err[256];

	*out = NULL;
	if (!cfg->http_listen[0])
		return 0;
	*out = http_start(cfg->http_listen, stale_after_ms(cfg), OUTBOX_VERSION, err, sizeof(err));
	if (!*out) {
		log_event(LOG_ERROR, "http", "could not start the HTTP endpoint",
		          LOG_STR("listen", cfg->http_listen), LOG_STR("error", err));
		return -1;
	}
	log_event(LOG_INFO, "http", "serving /healthz /readyz /metrics",
	          LOG_STR("listen", cfg->http_listen));
	return 0;
}

/* The relay loops: one worker and one thread each. */
struct crew {
	struct worker **workers;
	pthread_t *threads;
	int n, started;
};

/* Starts c->n loops; -1 when one could not be made or started (those started stay counted in
 * c->started, for stop_crew()). */
static int start_crew(struct crew *c)
{
	c->workers = calloc((size_t)c->n, sizeof(*c->workers));
	c->threads = calloc((size_t)c->n, sizeof(*c->threads));
	if (!c->workers || !c->threads)
		return -1;
	for (int i = 0; i < c->n; i++) {
		c->workers[i] = worker_new(&g_relay, i);
		if (!c->workers[i])
			return -1;
	}
	for (; c->started < c->n; c->started++) {
		if (pthread_create(&c->threads[c->started], NULL, worker_main,
		                   c->workers[c->started]) != 0) {
			log_event(LOG_ERROR, "relay", "could not start a relay thread");
			atomic_store(&g_relay.stopping, 1);
			return -1;
		}
	}
	return 0;
}

/* Waits for the loops to finish (bounded by the shutdown deadlines) and frees them. */
static void stop_crew(struct crew *c)
{
	if (c->started > 0)
		await_workers(c->workers, c->started);
	for (int i = 0; i < c->started; i++)
		pthread_join(c->threads[i], NULL);
}

static void free_crew(struct crew *c)
{
	if (c->workers)
		for (int i = 0; i < c->n; i++)
			worker_free(c->workers[i]);
	free(c->workers);
	free(c->threads);
}

/* The main thread while the loops run: readiness and the watchdog four times a second, a
 * summary line every SUMMARY_INTERVAL_MS, until a signal or a loop stops the relay. */
static void serve(struct summary_state *sum)
{
	while (!atomic_load(&g_relay.stopping)) {
		struct pollfd p = { .fd = wake_pipe[0], .events = POLLIN };

		(void)poll(&p, 1, 250);
		if (atomic_exchange(&g_hangup, 0))
			log_event(LOG_INFO, "relay",
			          "received SIGHUP, configuration not reloaded: restart to apply "
			          "changes");
		notify_tick();
		if (clock_mono_ms() - sum->last_ms >= SUMMARY_INTERVAL_MS)
			summary(sum);
	}
}

/* How long the start-up check of the table may take before the relay starts anyway (its loops
 * check again when they connect). */
#define START_CHECK_MS 5000

/* The table checks no retry can fix, before any loop claims: a seq sequence with CACHE > 1
 * (store_check_sequence()) stops the start with exit 2 and one line naming the sequence and the
 * fix. A database that cannot be reached, or a table not there yet, is left to the loops,
 * which connect with backoff and refuse such a table the same way (and so never claim from
 * it). Returns 0 to go on, or the exit status. */
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
		log_event(LOG_ERROR, "relay", "cannot relay from this table, not starting",
		          LOG_STR("table", cfg->database_table), LOG_STR("error", store_errmsg(s)));
		rc = 2;
	}
	store_free(s);
	return rc;
}

/* Start, serve, and on the way out (a signal, a loop that cannot relay, or a failure to
 * start) stop in order: the loops finish what is outstanding within relay.shutdown_timeout,
 * the maintenance loop stops, what is still leased is released, and the endpoint goes last
 * so that /readyz says so meanwhile. */
int command_run(const struct config *cfg, int argc, char **argv)
{
	struct crew crew = { .n = (int)cfg->relay_workers };
	struct maintenance *maint = NULL;
	struct http_server *http = NULL;
	struct summary_state sum = { .last_ms = clock_mono_ms() };
	int rc = 1;

	if (argc > 0) {
		fprintf(stderr, "outbox-relay: run takes no arguments, got '%s'\n", argv[0]);
		return 2;
	}
	if (open_wake_pipe(cfg) < 0)
		return 1;
	if (install_signals() < 0)
		goto out;
	log_start(cfg);
	if ((rc = check_table_at_start(cfg)) != 0)
		goto out;
	rc = 1;
	atomic_store(&g_metrics.workers, crew.n);
	notify_setup(stale_after_ms(cfg));
	if (start_http(cfg, &http) < 0 || start_crew(&crew) < 0)
		goto out;
	maint = maintenance_start(&g_relay);
	serve(&sum);
	rc = 0;
out:
	/* Branch point: a start-up failure with no loop running stops nothing but what it made;
	 * otherwise every started loop is waited for, whatever ended the run. */
	if (crew.started > 0 || rc != 0) {
		if (rc == 0) {
			log_event(LOG_INFO, "relay", "stopping: waiting for outstanding confirms",
			          LOG_MS("timeout", cfg->relay_shutdown_timeout_ms));
			notify_stopping(atomic_load(&g_relay.failed) ? "cannot relay" : "signal");
		}
		begin_stop(cfg);
	}
	stop_crew(&crew);
	if (rc == 0 && atomic_load(&g_relay.failed))
		rc = 1;
	maintenance_stop(maint);
	if (crew.started > 0) {
		release_leases(cfg, crew.workers, crew.started);
		if (rc == 0) {
			summary(&sum);
			log_event(LOG_INFO, "relay", "stopped");
		}
	}
	http_stop(http);
	free_crew(&crew);
	close_wake_pipe();
	return rc;
}
