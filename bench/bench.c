/* outbox-bench: measures the relay against a PostgreSQL and RabbitMQ of its own (bench/run
 * starts them): the broker's limit, relay throughput, idle latency, the producers' cost of the
 * wake-up, backlog scaling, peak memory and ordering keys; prints every figure on one line. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_tcp_socket.h>
#include <libpq-fe.h>

#define BODY_LEN     1024
#define LIMIT_WINDOW 1000  /* publishes in flight for the limit run */
#define PRODUCERS    8     /* producer cost: threads, each on its own connection */
#define IDLE_RATE    200   /* idle latency: commits per second */
#define KEYS         10000 /* ordering keys run: distinct keys */

struct options {
	const char *pg;    /* libpq conninfo */
	const char *amqp;  /* amqp:// URL */
	const char *relay; /* outbox-relay binary */
	const char *only;  /* NULL = every measurement */
	bool quick;
	long n_tput; /* rows for the limit, throughput and keys runs */
	long n_backlog;
	int phase_s;           /* producer cost phase and idle latency duration */
	long workers;          /* relay.workers for every relay run */
	long batch;            /* relay.batch_size for every relay run */
	const char *retention; /* relay.retention for every relay run ("0": delete on confirm) */
};

static struct options opt;
static volatile sig_atomic_t interrupted;
static pid_t running_relay; /* so a fatal exit or a signal does not leave a relay behind */

/* NAN = not measured (skipped or failed). */
struct results {
	double limit, relay, relay_ratio;
	double p50_ms, p95_ms, p99_ms;
	long lat_samples;
	double prod_with, prod_without, prod_ratio;
	double backlog_first, backlog_last, backlog_ratio;
	long rss_kb, rss_max_kb;
	double keys, nokeys, keys_ratio;
	int failures;
};

static struct results res;

static void on_signal(int sig)
{
	(void)sig;
	interrupted = 1;
}

static int64_t mono_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int64_t real_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !interrupted)
		;
}

static void fail(const char *what, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A measurement that could not finish says so and the run goes on with the next one. */
static void fail(const char *what, const char *fmt, ...)
{
	va_list ap;

	fprintf(stdout, "%s: FAILED: ", what);
	va_start(ap, fmt);
	vfprintf(stdout, fmt, ap);
	va_end(ap);
	fputc('\n', stdout);
	fflush(stdout);
	res.failures++;
}

static bool selected(const char *name)
{
	return !opt.only || strcmp(opt.only, name) == 0;
}

/* ---- PostgreSQL ---- */

/* NOTICEs such as "table does not exist, skipping" would only clutter the figures. */
static void quiet_notices(void *arg, const char *msg)
{
	(void)arg;
	(void)msg;
}

static int db_exec(PGconn *c, const char *what, const char *sql)
{
	PGresult *r = PQexec(c, sql);
	int rc = 0;

	if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK) {
		fail(what, "%s: %s", sql, PQerrorMessage(c));
		rc = -1;
	}
	PQclear(r);
	return rc;
}

static PGconn *db_open(const char *what)
{
	PGconn *c = PQconnectdb(opt.pg);

	if (PQstatus(c) != CONNECTION_OK) {
		fail(what, "could not connect to PostgreSQL: %s", PQerrorMessage(c));
		PQfinish(c);
		return NULL;
	}
	PQsetNoticeProcessor(c, quiet_notices, NULL);
	/* Bounds every statement (the 1,000,000-row fill included): a stuck server fails the
	 * measurement instead of hanging the run. */
	if (db_exec(c, what, "SET statement_timeout = '600s'") != 0) {
		PQfinish(c);
		return NULL;
	}
	return c;
}

/* The first column of the first row as text into out; -1 on error. */
static int db_value(PGconn *c, const char *sql, char *out, size_t outlen)
{
	PGresult *r = PQexec(c, sql);
	int rc = -1;

	if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0) {
		snprintf(out, outlen, "%s", PQgetvalue(r, 0, 0));
		rc = 0;
	}
	PQclear(r);
	return rc;
}

static long long db_count(PGconn *c, const char *sql)
{
	char buf[64], *end;
	long long v;

	if (db_value(c, sql, buf, sizeof(buf)) != 0)
		return -1;
	errno = 0;
	v = strtoll(buf, &end, 10);
	return (errno || *end) ? -1 : v;
}

/* ---- RabbitMQ ---- */

static const char *reply_text(amqp_rpc_reply_t r, char *buf, size_t len)
{
	if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION) {
		snprintf(buf, len, "%s", amqp_error_string2(r.library_error));
	} else if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
	           r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
		amqp_channel_close_t *m = r.reply.decoded;

		snprintf(buf, len, "channel closed: %.*s", (int)m->reply_text.len,
		         (const char *)m->reply_text.bytes);
	} else if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
	           r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
		amqp_connection_close_t *m = r.reply.decoded;

		snprintf(buf, len, "connection closed: %.*s", (int)m->reply_text.len,
		         (const char *)m->reply_text.bytes);
	} else {
		snprintf(buf, len, "unexpected reply %d", (int)r.reply_type);
	}
	return buf;
}

/* Opens a connection with channel 1; NULL (and err set) on failure. */
static amqp_connection_state_t mq_open(char *err, size_t errlen)
{
	struct amqp_connection_info ci;
	amqp_connection_state_t c = NULL;
	amqp_socket_t *s;
	amqp_rpc_reply_t r;
	char *url = strdup(opt.amqp);
	struct timeval tv = { 10, 0 };

	if (!url) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	/* amqp_parse_url() cuts the string it is given into the fields it returns. */
	if (amqp_parse_url(url, &ci) != AMQP_STATUS_OK) {
		snprintf(err, errlen, "bad AMQP URL");
		goto fail;
	}
	c = amqp_new_connection();
	s = c ? amqp_tcp_socket_new(c) : NULL;
	if (!s) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	if (amqp_socket_open_noblock(s, ci.host, ci.port, &tv) != AMQP_STATUS_OK) {
		snprintf(err, errlen, "could not connect to %s:%d", ci.host, ci.port);
		goto fail;
	}
	r = amqp_login(c, ci.vhost && ci.vhost[0] ? ci.vhost : "/", 0, 131072, 0,
	               AMQP_SASL_METHOD_PLAIN, ci.user, ci.password);
	if (r.reply_type != AMQP_RESPONSE_NORMAL) {
		reply_text(r, err, errlen);
		goto fail;
	}
	amqp_channel_open(c, 1);
	r = amqp_get_rpc_reply(c);
	if (r.reply_type != AMQP_RESPONSE_NORMAL) {
		reply_text(r, err, errlen);
		goto fail;
	}
	free(url);
	return c;
fail:
	if (c)
		amqp_destroy_connection(c);
	free(url);
	return NULL;
}

static void mq_close(amqp_connection_state_t c)
{
	if (!c)
		return;
	amqp_channel_close(c, 1, AMQP_REPLY_SUCCESS);
	amqp_connection_close(c, AMQP_REPLY_SUCCESS);
	amqp_destroy_connection(c);
}

/* Deletes and declares queue `name` (durable, classic), so every run starts empty. */
static int mq_fresh_queue(const char *what, const char *name)
{
	char err[256];
	amqp_connection_state_t c = mq_open(err, sizeof(err));
	amqp_table_entry_t arg;
	amqp_table_t args = { 1, &arg };
	amqp_rpc_reply_t r;
	int rc = 0;

	if (!c) {
		fail(what, "RabbitMQ: %s", err);
		return -1;
	}
	amqp_queue_delete(c, 1, amqp_cstring_bytes(name), 0, 0);
	r = amqp_get_rpc_reply(c);
	if (r.reply_type == AMQP_RESPONSE_NORMAL) {
		arg.key = amqp_cstring_bytes("x-queue-type");
		arg.value.kind = AMQP_FIELD_KIND_UTF8;
		arg.value.value.bytes = amqp_cstring_bytes("classic");
		amqp_queue_declare(c, 1, amqp_cstring_bytes(name), 0, 1, 0, 0, args);
		r = amqp_get_rpc_reply(c);
	}
	if (r.reply_type != AMQP_RESPONSE_NORMAL) {
		fail(what, "could not declare queue '%s': %s", name,
		     reply_text(r, err, sizeof(err)));
		rc = -1;
	}
	mq_close(c);
	return rc;
}

/* ---- the consumer: own thread and connection, no-ack, counting deliveries ---- */

struct consumer {
	char queue[64];
	pthread_t thread;
	atomic_long count;
	atomic_int state; /* 0 starting, 1 consuming, -1 failed */
	atomic_int stop;
	char err[256];
	/* latency mode: bodies start with "t=<CLOCK_REALTIME us>;"; commit -> receive in us */
	int64_t *lat;
	long lat_cap;
	atomic_long lat_n;
	int64_t first_us; /* CLOCK_MONOTONIC us of the first delivery */
	/* slice mode: CLOCK_MONOTONIC us of each 10 % boundary */
	long slice;
	int64_t slice_us[10];
};

static void consumer_record(struct consumer *k, const amqp_envelope_t *env, int64_t now)
{
	long n = atomic_load(&k->count) + 1;

	if (k->lat) {
		char tmp[32], *end;
		size_t len = env->message.body.len < sizeof(tmp) - 1 ? env->message.body.len
		                                                     : sizeof(tmp) - 1;
		long long t;

		memcpy(tmp, env->message.body.bytes, len);
		tmp[len] = '\0';
		errno = 0;
		t = strtoll(tmp + 2, &end, 10);
		if (strncmp(tmp, "t=", 2) == 0 && !errno && *end == ';') {
			long i = atomic_load(&k->lat_n);

			if (i < k->lat_cap) {
				k->lat[i] = real_us() - t;
				atomic_store(&k->lat_n, i + 1);
			}
		}
	}
	if (n == 1)
		k->first_us = now;
	if (k->slice > 0) {
		if (n % k->slice == 0 && n / k->slice <= 10)
			k->slice_us[n / k->slice - 1] = now;
	}
	/* The count is stored last: a reader that sees it also sees the times recorded above. */
	atomic_store(&k->count, n);
}

static void *consumer_main(void *arg)
{
	struct consumer *k = arg;
	amqp_connection_state_t c = mq_open(k->err, sizeof(k->err));
	amqp_rpc_reply_t r;

	if (!c) {
		atomic_store(&k->state, -1);
		return NULL;
	}
	/* no-ack: the broker pushes as fast as it can and the consumer never limits the run. */
	amqp_basic_consume(c, 1, amqp_cstring_bytes(k->queue), amqp_empty_bytes, 0, 1, 0,
	                   amqp_empty_table);
	r = amqp_get_rpc_reply(c);
	if (r.reply_type != AMQP_RESPONSE_NORMAL) {
		reply_text(r, k->err, sizeof(k->err));
		atomic_store(&k->state, -1);
		mq_close(c);
		return NULL;
	}
	atomic_store(&k->state, 1);
	while (!atomic_load(&k->stop)) {
		amqp_envelope_t env;
		struct timeval tv = { 0, 100000 };

		amqp_maybe_release_buffers(c);
		r = amqp_consume_message(c, &env, &tv, 0);
		if (r.reply_type == AMQP_RESPONSE_NORMAL) {
			consumer_record(k, &env, mono_us());
			amqp_destroy_envelope(&env);
		} else if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
		           r.library_error == AMQP_STATUS_TIMEOUT) {
			continue;
		} else {
			reply_text(r, k->err, sizeof(k->err));
			atomic_store(&k->state, -1);
			break;
		}
	}
	mq_close(c);
	return NULL;
}

/* Starts consuming queue; returns once basic.consume is confirmed. */
static int consumer_start(struct consumer *k, const char *what, const char *queue)
{
	int64_t deadline = mono_us() + 15000000;

	snprintf(k->queue, sizeof(k->queue), "%s", queue);
	atomic_init(&k->count, 0);
	atomic_init(&k->state, 0);
	atomic_init(&k->stop, 0);
	atomic_init(&k->lat_n, 0);
	if (pthread_create(&k->thread, NULL, consumer_main, k) != 0) {
		fail(what, "could not start the consumer thread");
		return -1;
	}
	while (atomic_load(&k->state) == 0 && mono_us() < deadline)
		sleep_ms(5);
	if (atomic_load(&k->state) != 1) {
		atomic_store(&k->stop, 1);
		pthread_join(k->thread, NULL);
		fail(what, "consumer could not start: %s", k->err[0] ? k->err : "timeout");
		return -1;
	}
	return 0;
}

static void consumer_stop(struct consumer *k)
{
	atomic_store(&k->stop, 1);
	pthread_join(k->thread, NULL);
}

/* ---- the relay as a child process ---- */

struct relay_proc {
	pid_t pid;
	long hwm_kb;    /* VmHWM read just before stopping it */
	long maxrss_kb; /* ru_maxrss from wait4 */
};

/* Runs the relay binary with `cmd` and a clean environment naming table (which is also the
 * queue's and the LISTEN channel's name, so runs never see each other's rows). */
static pid_t relay_spawn(const char *cmd, const char *table)
{
	char db[1100], mq[600], tb[100], ch[100], wk[48], bs[48], rt[64];
	char *envp[] = {
		db, mq, tb, ch, wk, bs, rt, "OUTBOX_HTTP_LISTEN=", "OUTBOX_LOG_LEVEL=warn", NULL
	};
	char *argv[] = { (char *)opt.relay, (char *)cmd, NULL };
	pid_t pid;

	snprintf(db, sizeof(db), "OUTBOX_DATABASE_URL=%s", opt.pg);
	snprintf(mq, sizeof(mq), "OUTBOX_AMQP_URL=%s", opt.amqp);
	snprintf(tb, sizeof(tb), "OUTBOX_DATABASE_TABLE=%s", table);
	snprintf(ch, sizeof(ch), "OUTBOX_DATABASE_CHANNEL=%s", table);
	snprintf(wk, sizeof(wk), "OUTBOX_RELAY_WORKERS=%ld", opt.workers > 0 ? opt.workers : 1);
	snprintf(bs, sizeof(bs), "OUTBOX_RELAY_BATCH_SIZE=%ld", opt.batch > 0 ? opt.batch : 500);
	snprintf(rt, sizeof(rt), "OUTBOX_RELAY_RETENTION=%s", opt.retention);
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		/* `migrate` reports on stdout; the benchmark's own output stays readable. */
		if (strcmp(cmd, "run") != 0 && !freopen("/dev/null", "w", stdout))
			_exit(127);
		execve(opt.relay, argv, envp);
		fprintf(stderr, "outbox-bench: could not run %s: %s\n", opt.relay, strerror(errno));
		_exit(127);
	}
	return pid;
}

/* Waits for pid for at most timeout_ms; returns the exit status or -1 (still running). */
static int wait_child(pid_t pid, long timeout_ms, struct rusage *ru)
{
	int64_t deadline = mono_us() + timeout_ms * 1000;
	int st;

	for (;;) {
		pid_t w = wait4(pid, &st, WNOHANG, ru);

		if (w == pid)
			return st;
		if (w < 0 && errno != EINTR)
			return -2;
		if (mono_us() > deadline)
			return -1;
		sleep_ms(5);
	}
}

static int relay_migrate(const char *what, const char *table)
{
	struct rusage ru;
	pid_t pid = relay_spawn("migrate", table);
	int st;

	if (pid < 0) {
		fail(what, "fork: %s", strerror(errno));
		return -1;
	}
	st = wait_child(pid, 60000, &ru);
	if (st == -1) {
		kill(pid, SIGKILL);
		wait_child(pid, 5000, &ru);
	}
	if (st < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		fail(what, "outbox-relay migrate failed (status %d)", st);
		return -1;
	}
	return 0;
}

static int relay_start(struct relay_proc *rp, const char *what, const char *table)
{
	memset(rp, 0, sizeof(*rp));
	rp->pid = relay_spawn("run", table);
	if (rp->pid < 0) {
		fail(what, "fork: %s", strerror(errno));
		return -1;
	}
	running_relay = rp->pid;
	return 0;
}

/* True while the relay runs; a relay that exited on its own is a failed measurement. */
static bool relay_alive(struct relay_proc *rp, const char *what)
{
	struct rusage ru;
	int st;

	if (wait4(rp->pid, &st, WNOHANG, &ru) != rp->pid)
		return true;
	running_relay = 0;
	rp->pid = 0;
	fail(what, "the relay exited early (%s %d)", WIFEXITED(st) ? "exit" : "signal",
	     WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
	return false;
}

static long read_hwm_kb(pid_t pid)
{
	char path[64], line[256];
	long kb = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%ld/status", (long)pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, "VmHWM:", 6) == 0) {
			char *end;

			errno = 0;
			kb = strtol(line + 6, &end, 10);
			if (errno)
				kb = -1;
			break;
		}
	}
	fclose(f);
	return kb;
}

/* SIGTERM (orderly shutdown), then SIGKILL if it does not exit within 30 s. */
static int relay_stop(struct relay_proc *rp, const char *what)
{
	struct rusage ru;
	int st;

	if (rp->pid <= 0)
		return -1;
	rp->hwm_kb = read_hwm_kb(rp->pid);
	kill(rp->pid, SIGTERM);
	st = wait_child(rp->pid, 30000, &ru);
	if (st == -1) {
		kill(rp->pid, SIGKILL);
		st = wait_child(rp->pid, 5000, &ru);
		fail(what, "the relay did not stop within 30 s of SIGTERM");
	}
	running_relay = 0;
	rp->pid = 0;
	if (st >= 0)
		rp->maxrss_kb = ru.ru_maxrss;
	return st;
}

static void kill_relay_atexit(void)
{
	if (running_relay > 0) {
		kill(running_relay, SIGKILL);
		waitpid(running_relay, NULL, 0);
	}
}

/* ---- tables ---- */

/* Drops the table and its wake-up flag, then lets the relay create them as operators do. */
static int table_fresh(PGconn *c, const char *what, const char *table)
{
	char sql[256];

	snprintf(sql, sizeof(sql),
	         "DROP TABLE IF EXISTS %s CASCADE; DROP TABLE IF EXISTS %s_wakeup", table, table);
	if (db_exec(c, what, sql) != 0)
		return -1;
	return relay_migrate(what, table);
}

static void table_drop(PGconn *c, const char *table)
{
	char sql[256];
	PGresult *r;

	snprintf(sql, sizeof(sql),
	         "DROP TABLE IF EXISTS %s CASCADE; DROP TABLE IF EXISTS %s_wakeup", table, table);
	r = PQexec(c, sql);
	PQclear(r);
}

/* n rows of 1 KB, routed by the default exchange to the queue of the same name; with keys,
 * spread round-robin over `keys` ordering keys. One statement, then VACUUM ANALYZE so that
 * the relay meets a table in the state autovacuum keeps a long-lived one in. */
static int table_fill(PGconn *c, const char *what, const char *table, long n, int keys)
{
	char sql[512], key[64];

	if (keys > 0)
		snprintf(key, sizeof(key), "'k' || (g %% %d)", keys);
	else
		snprintf(key, sizeof(key), "NULL");
	snprintf(sql, sizeof(sql),
	         "INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key) "
	         "SELECT 'b' || g, '', '%s', repeat('x', %d), %s FROM generate_series(1, %ld) g",
	         table, table, BODY_LEN, key, n);
	if (db_exec(c, what, sql) != 0)
		return -1;
	snprintf(sql, sizeof(sql), "VACUUM ANALYZE %s", table);
	return db_exec(c, what, sql);
}

/* ---- limit: rabbitmq-c straight to the queue, confirms, LIMIT_WINDOW in flight ---- */

static void bench_limit(void)
{
	const char *what = "limit", *q = "bench_limit";
	struct consumer k = { 0 };
	amqp_connection_state_t c = NULL;
	amqp_basic_properties_t p;
	unsigned char *acked = NULL;
	long n = opt.n_tput, sent = 0, confirmed = 0, floor_tag = 0, nacked = 0;
	char body[BODY_LEN], id[32], err[256];
	int64_t t0, deadline;
	bool consuming = false;

	if (mq_fresh_queue(what, q) != 0 || consumer_start(&k, what, q) != 0)
		return;
	consuming = true;
	acked = calloc((size_t)n + 1, 1);
	c = mq_open(err, sizeof(err));
	if (!acked || !c) {
		fail(what, "%s", acked ? err : "out of memory");
		goto out;
	}
	amqp_confirm_select(c, 1);
	if (amqp_get_rpc_reply(c).reply_type != AMQP_RESPONSE_NORMAL) {
		fail(what, "confirm.select refused");
		goto out;
	}
	memset(body, 'x', sizeof(body));
	/* The properties the relay sets on every row (DESIGN §5), so both carry the same. */
	memset(&p, 0, sizeof(p));
	p._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
	           AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TIMESTAMP_FLAG;
	p.content_type = amqp_cstring_bytes("application/json");
	p.delivery_mode = 2;
	p.timestamp = (uint64_t)time(NULL);
	t0 = mono_us();
	deadline = t0 + (60 + n / 500) * 1000000LL;
	while (confirmed < n) {
		amqp_frame_t f;
		struct timeval tv = { 0, 0 };
		int rc;

		if (interrupted || mono_us() > deadline) {
			fail(what, "timed out with %ld of %ld confirmed", confirmed, n);
			goto out;
		}
		while (sent < n && sent - confirmed < LIMIT_WINDOW) {
			snprintf(id, sizeof(id), "l%ld", sent + 1);
			p.message_id = amqp_cstring_bytes(id);
			amqp_bytes_t b = { sizeof(body), body };

			if (amqp_basic_publish(c, 1, amqp_empty_bytes, amqp_cstring_bytes(q), 1, 0,
			                       &p, b) != AMQP_STATUS_OK) {
				fail(what, "publish failed");
				goto out;
			}
			sent++;
		}
		/* Block for the next frame only when the window is full or everything is sent. */
		if (sent < n && sent - confirmed < LIMIT_WINDOW)
			continue;
		tv.tv_sec = 1;
		rc = amqp_simple_wait_frame_noblock(c, &f, &tv);
		if (rc == AMQP_STATUS_TIMEOUT)
			continue;
		if (rc != AMQP_STATUS_OK) {
			fail(what, "reading confirms: %s", amqp_error_string2(rc));
			goto out;
		}
		if (f.frame_type != AMQP_FRAME_METHOD)
			continue;
		if (f.payload.method.id == AMQP_BASIC_ACK_METHOD ||
		    f.payload.method.id == AMQP_BASIC_NACK_METHOD) {
			uint64_t tag;
			bool multiple;

			if (f.payload.method.id == AMQP_BASIC_ACK_METHOD) {
				amqp_basic_ack_t *a = f.payload.method.decoded;

				tag = a->delivery_tag;
				multiple = a->multiple;
			} else {
				amqp_basic_nack_t *a = f.payload.method.decoded;

				tag = a->delivery_tag;
				multiple = a->multiple;
				nacked++;
			}
			if (tag > (uint64_t)sent)
				continue;
			if (multiple) {
				for (long t = floor_tag + 1; t <= (long)tag; t++)
					if (!acked[t]) {
						acked[t] = 1;
						confirmed++;
					}
			} else if (!acked[tag]) {
				acked[tag] = 1;
				confirmed++;
			}
			while (floor_tag < n && acked[floor_tag + 1])
				floor_tag++;
		} else {
			fail(what, "unexpected method 0x%08x from the broker", f.payload.method.id);
			goto out;
		}
	}
	res.limit = (double)n / ((double)(mono_us() - t0) / 1e6);
	printf("limit: %ld msgs of %d B, persistent, durable classic queue, confirms, %d in "
	       "flight: %.0f msgs/s (%ld nacked)\n",
	       n, BODY_LEN, LIMIT_WINDOW, res.limit, nacked);
out:
	if (c)
		mq_close(c);
	free(acked);
	if (consuming)
		consumer_stop(&k);
}

/* ---- relay drains a pre-filled table ---- */

struct drain {
	double secs, rate;
	double first_s; /* relay start -> first delivery: its start-up cost */
	long hwm_kb, maxrss_kb;
	double slice_rate[10]; /* msgs/s of each 10 % of the rows, by the consumer's clock */
};

/* Fills `table` with n rows, starts the relay and times it from start until every row is
 * confirmed (consumer count) and marked (no unpublished row left). */
static int relay_drain(const char *what, const char *table, long n, int keys, bool slices,
                       struct drain *d)
{
	PGconn *c = db_open(what);
	struct consumer k = { 0 };
	struct relay_proc rp = { 0 };
	char sql[256];
	int64_t t0, deadline, last_print;
	long long left = -1;
	int rc = -1;
	bool consuming = false;

	memset(d, 0, sizeof(*d));
	if (!c)
		return -1;
	if (table_fresh(c, what, table) != 0 || table_fill(c, what, table, n, keys) != 0 ||
	    mq_fresh_queue(what, table) != 0)
		goto out;
	k.slice = slices ? n / 10 : 0;
	if (consumer_start(&k, what, table) != 0)
		goto out;
	consuming = true;
	snprintf(sql, sizeof(sql), "SELECT count(*) FROM %s WHERE published_at IS NULL", table);
	t0 = mono_us();
	last_print = t0;
	/* Generous: a relay slower than 500 msgs/s fails rather than hangs the run. */
	deadline = t0 + (60 + n / 500) * 1000000LL;
	if (relay_start(&rp, what, table) != 0)
		goto out;
	for (;;) {
		int64_t now = mono_us();

		if (interrupted) {
			fail(what, "interrupted");
			goto out;
		}
		if (!relay_alive(&rp, what))
			goto out;
		if (atomic_load(&k.state) < 0) {
			fail(what, "consumer failed: %s", k.err);
			goto out;
		}
		if (now > deadline) {
			fail(what, "timed out: %ld of %ld delivered, %lld unpublished",
			     atomic_load(&k.count), n, left);
			goto out;
		}
		/* Every row is delivered at least once before it can be marked, so the table is
		 * only asked once the consumer has seen n deliveries. */
		if (atomic_load(&k.count) >= n) {
			left = db_count(c, sql);
			if (left == 0)
				break;
		}
		if (now - last_print > 10000000) {
			fprintf(stderr, "%s: %ld of %ld delivered after %.0f s\n", what,
			        atomic_load(&k.count), n, (double)(now - t0) / 1e6);
			last_print = now;
		}
		sleep_ms(10);
	}
	d->secs = (double)(mono_us() - t0) / 1e6;
	d->first_s = (double)(k.first_us - t0) / 1e6;
	d->rate = (double)n / d->secs;
	if (slices && k.slice > 0) {
		int64_t prev = k.first_us;

		for (int i = 0; i < 10; i++) {
			double s = (double)(k.slice_us[i] - prev) / 1e6;

			d->slice_rate[i] = s > 0 ? (double)k.slice / s : NAN;
			prev = k.slice_us[i];
		}
	}
	rc = 0;
out:
	if (rp.pid > 0) {
		relay_stop(&rp, what);
		d->hwm_kb = rp.hwm_kb;
		d->maxrss_kb = rp.maxrss_kb;
	}
	if (consuming)
		consumer_stop(&k);
	table_drop(c, table);
	PQfinish(c);
	return rc;
}

static void note_rss(const struct drain *d)
{
	long kb = d->hwm_kb > 0 ? d->hwm_kb : d->maxrss_kb;

	if (kb > res.rss_max_kb)
		res.rss_max_kb = kb;
}

static void bench_relay(void)
{
	struct drain d;

	if (relay_drain("relay", "bench_tput", opt.n_tput, 0, false, &d) != 0)
		return;
	res.relay = d.rate;
	res.rss_kb = d.hwm_kb > 0 ? d.hwm_kb : d.maxrss_kb;
	note_rss(&d);
	printf("relay: %ld pre-filled rows of %d B, start -> all confirmed and marked: %.2f s "
	       "(first delivery after %.3f s), %.0f msgs/s; peak RSS %ld kB (VmHWM), "
	       "%ld kB (ru_maxrss)\n",
	       opt.n_tput, BODY_LEN, d.secs, d.first_s, d.rate, d.hwm_kb, d.maxrss_kb);
	if (!isnan(res.limit)) {
		res.relay_ratio = res.relay / res.limit;
		printf("relay: ratio to limit %.2f (target >= 0.80: %s)\n", res.relay_ratio,
		       res.relay_ratio >= 0.8 ? "met" : "MISSED");
	}
}

/* ---- idle latency ---- */

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted v. */
static double pct_ms(const int64_t *v, long n, long p)
{
	long i = (p * n + 99) / 100 - 1;

	if (i < 0)
		i = 0;
	if (i >= n)
		i = n - 1;
	return (double)v[i] / 1000.0;
}

static void bench_idle(void)
{
	const char *what = "idle", *table = "bench_idle";
	long samples = (long)IDLE_RATE * opt.phase_s, sent = 0, got;
	PGconn *c = db_open(what), *p = NULL;
	struct consumer k = { 0 };
	struct relay_proc rp = { 0 };
	char body[BODY_LEN + 1], id[32];
	const char *params[3];
	struct timespec next;
	int64_t deadline;
	bool consuming = false;

	if (!c)
		return;
	k.lat = calloc((size_t)samples, sizeof(*k.lat));
	k.lat_cap = samples;
	if (!k.lat) {
		fail(what, "out of memory");
		goto out;
	}
	if (table_fresh(c, what, table) != 0 || mq_fresh_queue(what, table) != 0 ||
	    consumer_start(&k, what, table) != 0)
		goto out;
	consuming = true;
	if (relay_start(&rp, what, table) != 0)
		goto out;
	p = db_open(what);
	if (!p)
		goto out;
	{
		char sql[256];
		PGresult *r;

		snprintf(sql, sizeof(sql),
		         "INSERT INTO %s (id, exchange_name, routing_key, body) "
		         "VALUES ($1, '', $2, $3) ON CONFLICT (id) DO NOTHING",
		         table);
		r = PQprepare(p, "ins", sql, 3, NULL);
		if (PQresultStatus(r) != PGRES_COMMAND_OK) {
			fail(what, "prepare: %s", PQerrorMessage(p));
			PQclear(r);
			goto out;
		}
		PQclear(r);
	}
	/* Let the relay connect, find nothing and go to sleep: this measures an idle relay. */
	sleep_ms(2000);
	if (!relay_alive(&rp, what))
		goto out;
	memset(body, 'x', BODY_LEN);
	body[BODY_LEN] = '\0';
	params[1] = table;
	params[2] = body;
	clock_gettime(CLOCK_MONOTONIC, &next);
	for (sent = 0; sent < samples && !interrupted; sent++) {
		char stamp[40];
		PGresult *r;
		int len;

		next.tv_nsec += 1000000000L / IDLE_RATE;
		if (next.tv_nsec >= 1000000000L) {
			next.tv_sec++;
			next.tv_nsec -= 1000000000L;
		}
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL) == EINTR &&
		       !interrupted)
			;
		snprintf(id, sizeof(id), "i%ld", sent + 1);
		/* Taken before the single-statement (autocommit) transaction is sent, so the figure
		 * includes the commit itself. */
		len = snprintf(stamp, sizeof(stamp), "t=%" PRId64 ";", real_us());
		memcpy(body, stamp, (size_t)len);
		params[0] = id;
		r = PQexecPrepared(p, "ins", 3, params, NULL, NULL, 0);
		if (PQresultStatus(r) != PGRES_COMMAND_OK) {
			fail(what, "insert: %s", PQerrorMessage(p));
			PQclear(r);
			goto out;
		}
		PQclear(r);
	}
	deadline = mono_us() + 10000000;
	while (atomic_load(&k.lat_n) < samples && mono_us() < deadline && !interrupted)
		sleep_ms(10);
	got = atomic_load(&k.lat_n);
	if (got < samples) {
		fail(what, "only %ld of %ld messages arrived within 10 s of the last commit", got,
		     samples);
		goto out;
	}
	qsort(k.lat, (size_t)got, sizeof(*k.lat), cmp_i64);
	res.p50_ms = pct_ms(k.lat, got, 50);
	res.p95_ms = pct_ms(k.lat, got, 95);
	res.p99_ms = pct_ms(k.lat, got, 99);
	res.lat_samples = got;
	printf("idle: %ld single-row commits at %d/s, commit -> consumer receive: p50 %.2f ms, "
	       "p95 %.2f ms, p99 %.2f ms, max %.2f ms "
	       "(targets p50 <= 2 ms: %s, p99 <= 10 ms: %s)\n",
	       got, IDLE_RATE, res.p50_ms, res.p95_ms, res.p99_ms, (double)k.lat[got - 1] / 1000.0,
	       res.p50_ms <= 2.0 ? "met" : "MISSED", res.p99_ms <= 10.0 ? "met" : "MISSED");
out:
	PQfinish(p);
	if (rp.pid > 0)
		relay_stop(&rp, what);
	if (consuming)
		consumer_stop(&k);
	table_drop(c, table);
	PQfinish(c);
	free(k.lat);
}

/* Drains the notifications that reached the listener so far; returns how many. */
static long count_notifies(PGconn *c)
{
	PGnotify *n;
	long count = 0;

	if (!c || !PQconsumeInput(c))
		return 0;
	while ((n = PQnotifies(c)) != NULL) {
		count++;
		PQfreemem(n);
	}
	return count;
}

/* ---- producer cost: 8 connections committing single-row inserts for a fixed time ---- */

struct producer {
	pthread_t thread;
	const char *table;
	int index;
	atomic_int *go; /* 0 wait, 1 run, 2 stop */
	atomic_int *ready;
	long commits;
	char err[256];
};

static void *producer_main(void *arg)
{
	struct producer *pr = arg;
	PGconn *c = PQconnectdb(opt.pg);
	char sql[256], id[48], body[BODY_LEN + 1];
	const char *params[3];
	PGresult *r;

	snprintf(sql, sizeof(sql),
	         "INSERT INTO %s (id, exchange_name, routing_key, body) VALUES ($1, '', $2, $3) "
	         "ON CONFLICT (id) DO NOTHING",
	         pr->table);
	if (PQstatus(c) != CONNECTION_OK) {
		snprintf(pr->err, sizeof(pr->err), "%s", PQerrorMessage(c));
		goto out;
	}
	r = PQprepare(c, "ins", sql, 3, NULL);
	if (PQresultStatus(r) != PGRES_COMMAND_OK)
		snprintf(pr->err, sizeof(pr->err), "%s", PQerrorMessage(c));
	PQclear(r);
	if (pr->err[0])
		goto out;
	memset(body, 'x', BODY_LEN);
	body[BODY_LEN] = '\0';
	params[1] = pr->table;
	params[2] = body;
	atomic_fetch_add(pr->ready, 1);
	while (atomic_load(pr->go) == 0)
		sleep_ms(1);
	while (atomic_load(pr->go) == 1) {
		snprintf(id, sizeof(id), "p%d-%ld", pr->index, pr->commits + 1);
		params[0] = id;
		r = PQexecPrepared(c, "ins", 3, params, NULL, NULL, 0);
		if (PQresultStatus(r) != PGRES_COMMAND_OK) {
			snprintf(pr->err, sizeof(pr->err), "%s", PQerrorMessage(c));
			PQclear(r);
			break;
		}
		PQclear(r);
		pr->commits++;
	}
out:
	PQfinish(c);
	atomic_fetch_add(pr->ready, 1000); /* counts as ready even on failure: nobody waits */
	return NULL;
}

/* One phase: fresh table (trigger dropped when !wakeup), a relay draining it as in
 * production, PRODUCERS threads committing for phase_s seconds. Returns commits/s or NAN;
 * *notifies gets how many producer commits sent a NOTIFY (a listener of our own counts them),
 * which tells why a wake-up costs what it costs. */
static double producer_phase(const char *what, const char *table, bool wakeup, long *notifies)
{
	PGconn *c = db_open(what), *listener = NULL;
	struct consumer k = { 0 };
	struct relay_proc rp = { 0 };
	struct producer pr[PRODUCERS];
	atomic_int go, ready;
	double rate = NAN;
	long total = 0;
	int started = 0;
	int64_t t0 = 0, t1 = 0, deadline;
	bool consuming = false;

	if (!c)
		return NAN;
	memset(pr, 0, sizeof(pr));
	atomic_init(&go, 0);
	atomic_init(&ready, 0);
	if (table_fresh(c, what, table) != 0)
		goto out;
	if (!wakeup) {
		char sql[256];

		snprintf(sql, sizeof(sql), "DROP TRIGGER %s_wakeup ON %s", table, table);
		if (db_exec(c, what, sql) != 0)
			goto out;
	}
	listener = db_open(what);
	if (!listener)
		goto out;
	{
		char sql[128];

		snprintf(sql, sizeof(sql), "LISTEN %s", table);
		if (db_exec(listener, what, sql) != 0)
			goto out;
	}
	if (mq_fresh_queue(what, table) != 0 || consumer_start(&k, what, table) != 0)
		goto out;
	consuming = true;
	if (relay_start(&rp, what, table) != 0)
		goto out;
	for (; started < PRODUCERS; started++) {
		pr[started].table = table;
		pr[started].index = started;
		pr[started].go = &go;
		pr[started].ready = &ready;
		if (pthread_create(&pr[started].thread, NULL, producer_main, &pr[started]) != 0) {
			fail(what, "could not start producer threads");
			atomic_store(&go, 2);
			goto join;
		}
	}
	deadline = mono_us() + 30000000;
	while (atomic_load(&ready) < PRODUCERS && mono_us() < deadline)
		sleep_ms(5);
	/* Give the relay time to connect and go idle, so the phase starts as production would. */
	sleep_ms(1000);
	count_notifies(listener);
	*notifies = 0;
	t0 = mono_us();
	atomic_store(&go, 1);
	while (mono_us() - t0 < (int64_t)opt.phase_s * 1000000 && !interrupted) {
		sleep_ms(10);
		*notifies += count_notifies(listener);
	}
	atomic_store(&go, 2);
	t1 = mono_us();
join:
	for (int i = 0; i < started; i++) {
		pthread_join(pr[i].thread, NULL);
		if (pr[i].err[0]) {
			fail(what, "producer %d: %s", i, pr[i].err);
			goto out;
		}
		total += pr[i].commits;
	}
	if (started == PRODUCERS && relay_alive(&rp, what) && !interrupted)
		rate = (double)total / ((double)(t1 - t0) / 1e6);
	/* Commits still in flight at the end of the phase may notify a little later. */
	sleep_ms(50);
	*notifies += count_notifies(listener);
out:
	PQfinish(listener);
	if (rp.pid > 0)
		relay_stop(&rp, what);
	if (consuming)
		consumer_stop(&k);
	table_drop(c, table);
	PQfinish(c);
	return rate;
}

/* With and without alternate, in the order with-without, then without-with (twice in a full
 * run), so that a drift of the machine during the run (autovacuum, checkpoints, a neighbour)
 * does not favour whichever phase comes first. */
static void bench_producer(void)
{
	int rounds = opt.quick ? 1 : 2;
	double with = 0, without = 0;

	for (int r = 0; r < rounds; r++) {
		long nw = 0, nwo = 0;
		double a = NAN, b = NAN;

		if (r % 2 == 0) {
			a = producer_phase("producer", "bench_pc_with", true, &nw);
			if (!isnan(a))
				b = producer_phase("producer", "bench_pc_without", false, &nwo);
		} else {
			b = producer_phase("producer", "bench_pc_without", false, &nwo);
			if (!isnan(b))
				a = producer_phase("producer", "bench_pc_with", true, &nw);
		}
		if (isnan(a) || isnan(b))
			return;
		printf("producer: round %d: %d connections, single-row inserts, %d s each, relay "
		       "running: with wake-up %.0f commits/s (%ld notifying commits), without %.0f "
		       "commits/s (%ld)\n",
		       r + 1, PRODUCERS, opt.phase_s, a, nw, b, nwo);
		with += a;
		without += b;
	}
	res.prod_with = with / rounds;
	res.prod_without = without / rounds;
	res.prod_ratio = res.prod_with / res.prod_without;
	printf("producer: with wake-up %.0f commits/s, without %.0f commits/s; ratio %.2f "
	       "(target >= 0.90: %s)\n",
	       res.prod_with, res.prod_without, res.prod_ratio,
	       res.prod_ratio >= 0.9 ? "met" : "MISSED");
}

/* ---- backlog scaling ---- */

static void bench_backlog(void)
{
	struct drain d;

	if (relay_drain("backlog", "bench_backlog", opt.n_backlog, 0, true, &d) != 0)
		return;
	note_rss(&d);
	res.backlog_first = d.slice_rate[0];
	res.backlog_last = d.slice_rate[9];
	res.backlog_ratio = res.backlog_last / res.backlog_first;
	printf("backlog: %ld rows drained in %.1f s (%.0f msgs/s), peak RSS %ld kB; "
	       "rate per 10 %%:",
	       opt.n_backlog, d.secs, d.rate, d.hwm_kb);
	for (int i = 0; i < 10; i++)
		printf(" %.0f", d.slice_rate[i]);
	printf("\nbacklog: first 10 %% %.0f msgs/s, last 10 %% %.0f msgs/s, ratio %.2f "
	       "(target >= 0.90: %s)\n",
	       res.backlog_first, res.backlog_last, res.backlog_ratio,
	       res.backlog_ratio >= 0.9 ? "met" : "MISSED");
}

/* ---- ordering keys ---- */

static void bench_keys(void)
{
	struct drain d;

	if (isnan(res.relay)) {
		if (relay_drain("keys", "bench_nokeys", opt.n_tput, 0, false, &d) != 0)
			return;
		note_rss(&d);
		res.nokeys = d.rate;
	} else {
		res.nokeys = res.relay;
	}
	if (relay_drain("keys", "bench_keys", opt.n_tput, KEYS, false, &d) != 0)
		return;
	note_rss(&d);
	res.keys = d.rate;
	res.keys_ratio = res.keys / res.nokeys;
	printf("keys: %ld rows over %d ordering keys: %.2f s, %.0f msgs/s; without keys %.0f "
	       "msgs/s; ratio %.2f\n",
	       opt.n_tput, KEYS, d.secs, d.rate, res.nokeys, res.keys_ratio);
}

/* ---- machine facts ---- */

static void print_facts(void)
{
	char model[256] = "unknown", line[512], pgv[128] = "unknown", fs[32] = "?", sc[32] = "?";
	char rmqv[64] = "unknown", err[256];
	struct utsname u;
	FILE *f = fopen("/proc/cpuinfo", "r");
	PGconn *c;
	amqp_connection_state_t m;

	if (f) {
		while (fgets(line, sizeof(line), f)) {
			if (strncmp(line, "model name", 10) == 0) {
				char *v = strchr(line, ':');

				if (v) {
					v += strspn(v + 1, " \t") + 1;
					v[strcspn(v, "\n")] = '\0';
					snprintf(model, sizeof(model), "%s", v);
				}
				break;
			}
		}
		fclose(f);
	}
	c = PQconnectdb(opt.pg);
	if (PQstatus(c) == CONNECTION_OK) {
		db_value(c, "SHOW server_version", pgv, sizeof(pgv));
		db_value(c, "SHOW fsync", fs, sizeof(fs));
		db_value(c, "SHOW synchronous_commit", sc, sizeof(sc));
	}
	PQfinish(c);
	m = mq_open(err, sizeof(err));
	if (m) {
		const amqp_table_t *t = amqp_get_server_properties(m);

		for (int i = 0; t && i < t->num_entries; i++) {
			const amqp_table_entry_t *e = &t->entries[i];

			if (e->key.len == 7 && memcmp(e->key.bytes, "version", 7) == 0 &&
			    e->value.kind == AMQP_FIELD_KIND_UTF8)
				snprintf(rmqv, sizeof(rmqv), "%.*s", (int)e->value.value.bytes.len,
				         (const char *)e->value.value.bytes.bytes);
		}
		mq_close(m);
	}
	if (uname(&u) != 0)
		snprintf(u.release, sizeof(u.release), "?");
	printf("machine: %ld cores, %s, Linux %s\n", sysconf(_SC_NPROCESSORS_ONLN), model,
	       u.release);
	printf("versions: PostgreSQL %s (fsync=%s, synchronous_commit=%s), RabbitMQ %s, "
	       "rabbitmq-c %s, relay %s\n",
	       pgv, fs, sc, rmqv, amqp_version(), opt.relay);
	printf("sizes: rows %ld, backlog %ld, phases %d s, body %d B, relay.retention %s%s\n",
	       opt.n_tput, opt.n_backlog, opt.phase_s, BODY_LEN, opt.retention,
	       opt.quick ? " (--quick)" : "");
	fflush(stdout);
}

static void put(const char *name, double v, int decimals)
{
	if (isnan(v))
		printf(" %s=-", name);
	else
		printf(" %s=%.*f", name, decimals, v);
}

static void print_summary(void)
{
	printf("summary:");
	put("limit", res.limit, 0);
	put("relay", res.relay, 0);
	put("ratio", res.relay_ratio, 2);
	put("p50_ms", res.p50_ms, 2);
	put("p95_ms", res.p95_ms, 2);
	put("p99_ms", res.p99_ms, 2);
	put("producer_with", res.prod_with, 0);
	put("producer_without", res.prod_without, 0);
	put("producer_ratio", res.prod_ratio, 2);
	put("backlog_first", res.backlog_first, 0);
	put("backlog_last", res.backlog_last, 0);
	put("backlog_ratio", res.backlog_ratio, 2);
	put("rss_kb", res.rss_kb > 0 ? (double)res.rss_kb : NAN, 0);
	put("rss_max_kb", res.rss_max_kb > 0 ? (double)res.rss_max_kb : NAN, 0);
	put("keys", res.keys, 0);
	put("nokeys", res.nokeys, 0);
	put("keys_ratio", res.keys_ratio, 2);
	printf(" failures=%d\n", res.failures);
	printf("targets: ratio>=0.80 backlog_ratio>=0.90 p50_ms<=2 p99_ms<=10 producer_ratio>=0.90 "
	       "rss_kb<=12288\n");
}

/* ---- command line ---- */

static const char usage[] =
        "usage: outbox-bench [--quick] [--only NAME] [--relay PATH] [--rows N] [--backlog N]\n"
        "                    [--seconds S] [--workers N] [--batch N] [--retention D]\n"
        "  NAME: limit, relay, idle, producer, backlog, keys (memory comes with relay/backlog)\n"
        "  environment: RELAY_TEST_PG (libpq conninfo), RELAY_TEST_AMQP (amqp:// URL)\n";

static int parse_long(const char *s, long min, long max, long *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < min || v > max)
		return -1;
	*out = v;
	return 0;
}

/* The relay of the same build sits in the parent directory of outbox-bench's (bench/). */
static char *default_relay(const char *argv0)
{
	char self[4096], *slash, *path;
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	size_t len;

	if (n <= 0) {
		snprintf(self, sizeof(self), "%s", argv0);
		n = (ssize_t)strlen(self);
	}
	self[n] = '\0';
	slash = strrchr(self, '/');
	if (!slash)
		return strdup("./outbox-relay");
	*slash = '\0';
	len = strlen(self) + 32;
	path = malloc(len);
	if (!path)
		return NULL;
	snprintf(path, len, "%s/outbox-relay", self);
	if (access(path, X_OK) == 0)
		return path;
	snprintf(path, len, "%s/../outbox-relay", self);
	return path;
}

int main(int argc, char **argv)
{
	static const char *names[] = { "limit", "relay", "idle", "producer", "backlog", "keys" };
	char *relay_path = NULL;
	long rows = 0, backlog = 0, secs = 0;
	bool known = false;
	struct sigaction sa;

	opt.retention = "30d";
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (strcmp(a, "--quick") == 0) {
			opt.quick = true;
		} else if (strcmp(a, "--only") == 0 && v) {
			opt.only = v;
			i++;
		} else if (strcmp(a, "--relay") == 0 && v) {
			opt.relay = v;
			i++;
		} else if (strcmp(a, "--rows") == 0 && v &&
		           parse_long(v, 10, 100000000, &rows) == 0) {
			i++;
		} else if (strcmp(a, "--backlog") == 0 && v &&
		           parse_long(v, 10, 100000000, &backlog) == 0) {
			i++;
		} else if (strcmp(a, "--seconds") == 0 && v && parse_long(v, 1, 3600, &secs) == 0) {
			i++;
		} else if (strcmp(a, "--workers") == 0 && v &&
		           parse_long(v, 1, 64, &opt.workers) == 0) {
			i++;
		} else if (strcmp(a, "--batch") == 0 && v &&
		           parse_long(v, 1, 10000, &opt.batch) == 0) {
			i++;
		} else if (strcmp(a, "--retention") == 0 && v && v[0] && strlen(v) < 32) {
			/* relay.retention as the relay reads it; the relay refuses a bad one. */
			opt.retention = v;
			i++;
		} else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
			fputs(usage, stdout);
			return 0;
		} else {
			fprintf(stderr, "outbox-bench: bad argument '%s'\n%s", a, usage);
			return 2;
		}
	}
	for (size_t i = 0; opt.only && i < sizeof(names) / sizeof(names[0]); i++)
		known = known || strcmp(opt.only, names[i]) == 0;
	if (opt.only && !known) {
		fprintf(stderr, "outbox-bench: unknown measurement '%s'\n%s", opt.only, usage);
		return 2;
	}
	opt.pg = getenv("RELAY_TEST_PG");
	opt.amqp = getenv("RELAY_TEST_AMQP");
	if (!opt.pg || !opt.amqp) {
		fprintf(stderr, "outbox-bench: RELAY_TEST_PG and RELAY_TEST_AMQP must be set "
		                "(bench/run starts the servers and sets them)\n");
		return 2;
	}
	if (!opt.relay) {
		relay_path = default_relay(argv[0]);
		opt.relay = relay_path;
	}
	if (!opt.relay || access(opt.relay, X_OK) != 0) {
		fprintf(stderr, "outbox-bench: relay binary '%s' not found; use --relay PATH\n",
		        opt.relay ? opt.relay : "?");
		free(relay_path);
		return 2;
	}
	opt.n_tput = rows ? rows : opt.quick ? 10000 : 100000;
	opt.n_backlog = backlog ? backlog : opt.quick ? 100000 : 1000000;
	opt.phase_s = secs ? (int)secs : opt.quick ? 3 : 10;

	res = (struct results){ NAN, NAN, NAN, NAN, NAN, NAN, 0,   NAN, NAN, NAN,
		                NAN, NAN, NAN, 0,   0,   NAN, NAN, NAN, 0 };
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	atexit(kill_relay_atexit);
	setvbuf(stdout, NULL, _IOLBF, 0);

	print_facts();
	if (selected("limit"))
		bench_limit();
	if (selected("relay"))
		bench_relay();
	if (selected("idle"))
		bench_idle();
	if (selected("producer"))
		bench_producer();
	if (selected("backlog"))
		bench_backlog();
	if (selected("keys"))
		bench_keys();
	if (res.rss_kb > 0 || res.rss_max_kb > 0)
		printf("memory: relay peak RSS %ld kB in the %ld-row run (batch %ld x %d B), "
		       "at most %ld kB in any run (target <= 12288 kB: %s)\n",
		       res.rss_kb, opt.n_tput, opt.batch > 0 ? opt.batch : 500L, BODY_LEN,
		       res.rss_max_kb,
		       (res.rss_kb > 0 ? res.rss_kb : res.rss_max_kb) <= 12288 ? "met" : "MISSED");
	print_summary();
	free(relay_path);
	return res.failures ? 1 : 0;
}
