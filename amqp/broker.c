/* One RabbitMQ connection for the relay (rabbitmq-c 0.11): pick a node of the cluster, connect
 * and log in, publish a batch with `mandatory` on a confirm-mode channel, then read the
 * broker's answers ourselves and find the one row behind a channel close. Every wait polls
 * the socket here, never inside rabbitmq-c, so the shutdown deadline and broker_interrupt()
 * can end it. */
#include "amqp/broker.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>

#include "amqp/broker_testing.h"
#include "amqp/confirm_tracker.h"
#include "amqp/message_map.h"
#include "base/clock.h"

#define PUBLISH_CHANNEL     1
#define CHECK_CHANNEL       2 /* passive declares: a 404 there must not close the publish channel */
#define FRAME_MAX           131072
#define POOL_PAGE           (256 * 1024) /* bodies below this stay in recycled pages, no malloc */
#define DRAIN_EVERY         128          /* publishes between non-blocking reads of arrived acks */
#define KNOWN_EXCHANGES_MAX 1024
#define NODES_MAX           32
#define NODE_NAME_MAX       300
#define CLOSE_TEXT_MAX      256
/* Each node attempt (connect, TLS, login, channels) is bounded by min(confirm_timeout, this),
 * so that one dead node of a cluster cannot hold up the others for long. */
#define CONNECT_TIMEOUT_MAX_MS 10000
/* The longest single poll() of a wait: progress_ms is stored, and a shutdown deadline set
 * while the wake descriptor could not be used is seen, at least this often. */
#define SLICE_MS 500
/* A polite connection.close waits this long for close-ok: a healthy broker answers in
 * milliseconds, and a stalled one must not delay a reconnect. */
#define CLOSE_WAIT_MS 1000
/* Bodies up to this size are published in the pipeline at once. A larger body, until one at
 * least as large has been answered on this connection, is published alone after the rest of
 * the batch is answered: if it exceeds the broker's max_message_size, the channel close that
 * follows can only be its own, and no good row in flight is published twice. */
#define PIPELINE_BODY_MAX (128 * 1024)

/* Outcomes of wait_method() besides errors (< 0). */
enum { W_DEADLINE = 0, W_GOT = 1, W_CHANNEL_CLOSED = 2, W_CONNECTION_CLOSED = 3 };

/* broker_connect() stops its round on this one: unreadable TLS files fail every node alike. */
#define ERR_SETUP (-100)

struct node {
	char *buf; /* amqp_parse_url() points into it */
	struct amqp_connection_info ci;
	char name[NODE_NAME_MAX]; /* "host:port" */
};

struct broker {
	struct broker_options opts; /* strings borrowed */
	char errmsg[512];

	/* The nodes of amqp.url, parsed by the first broker_connect(). */
	struct node *nodes;
	size_t nnodes;
	bool parsed;
	char parse_err[256]; /* set when the URL list is invalid */
	bool started;        /* the first round's random start was drawn */
	size_t next_node;    /* where the next broker_connect() starts */
	size_t cur_node;     /* in use while connected */
	char node_name[NODE_NAME_MAX];

	amqp_connection_state_t conn;
	bool connected;
	bool blocked;
	int64_t blocked_since_ms;
	bool check_open;   /* CHECK_CHANNEL is open */
	uint64_t max_body; /* max_message_size learnt from a 406 on this connection; 0 = unknown */
	int64_t batch_deadline_ms; /* broker_set_batch_deadline(); 0 = none */
	bool connecting;           /* inside broker_connect(): a stop ends its waits at once */
	size_t proven_body;     /* bodies up to this size go in the pipeline (PIPELINE_BODY_MAX) */
	bool skip_frame_check;  /* broker_test_skip_frame_check() */
	unsigned char *scratch; /* re-encodes the properties of a row whose publish failed */
	size_t scratch_len;

	/* broker_interrupt(): the socket it may shut down, and a pipe that wakes our polls. */
	pthread_mutex_t fd_lock;
	int live_fd; /* under fd_lock; -1 when no connection holds a socket */
	atomic_bool interrupted;
	int intr_pipe[2];

	/* The last connection.close or channel.close answering one of our requests. */
	int rpc_close_code;
	char rpc_close_text[CLOSE_TEXT_MAX];

	/* The batch in flight: set by broker_publish(), answered by broker_confirm(). */
	const struct broker_message *msgs;
	struct broker_result *res;
	size_t n;
	bool active;
	bool channel_closed; /* channel.close on the publish channel, answered */
	int close_code;
	char close_text[CLOSE_TEXT_MAX];
	bool return_pending; /* basic.return read, its content header not yet */
	char ret_exchange[256], ret_rkey[256];

	amqp_pool_t pool; /* per-batch tables and decoded bodies, recycled */
	amqp_basic_properties_t *props;
	amqp_bytes_t *bodies;
	size_t map_cap;
	struct confirm_tracker tracker;

	char **known; /* exchanges seen to exist on this connection */
	size_t nknown;
};

static void set_err(struct broker *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void set_err(struct broker *b, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(b->errmsg, sizeof(b->errmsg), fmt, ap);
	va_end(ap);
}

static void close_pipe(struct broker *b)
{
	for (int i = 0; i < 2; i++) {
		if (b->intr_pipe[i] >= 0)
			close(b->intr_pipe[i]);
		b->intr_pipe[i] = -1;
	}
}

struct broker *broker_new(const struct broker_options *opts)
{
	struct broker *b = calloc(1, sizeof(*b));

	if (b == NULL)
		return NULL;
	b->opts = *opts;
	b->live_fd = -1;
	b->proven_body = PIPELINE_BODY_MAX;
	atomic_init(&b->interrupted, false);
	if (pipe2(b->intr_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
		free(b);
		return NULL;
	}
	if (pthread_mutex_init(&b->fd_lock, NULL) != 0) {
		close_pipe(b);
		free(b);
		return NULL;
	}
	init_amqp_pool(&b->pool, POOL_PAGE);
	confirm_tracker_init(&b->tracker);
	return b;
}

static void forget_exchanges(struct broker *b)
{
	for (size_t i = 0; i < b->nknown; i++)
		free(b->known[i]);
	b->nknown = 0;
}

static void free_nodes(struct broker *b)
{
	for (size_t i = 0; i < b->nnodes; i++)
		free(b->nodes[i].buf);
	free(b->nodes);
	b->nodes = NULL;
	b->nnodes = 0;
}

void broker_free(struct broker *b)
{
	if (b == NULL)
		return;
	broker_disconnect(b);
	forget_exchanges(b);
	free(b->known);
	empty_amqp_pool(&b->pool);
	free(b->props);
	free(b->bodies);
	free(b->scratch);
	confirm_tracker_free(&b->tracker);
	free_nodes(b);
	close_pipe(b);
	pthread_mutex_destroy(&b->fd_lock);
	free(b);
}

const char *broker_errmsg(const struct broker *b)
{
	return b->errmsg;
}

bool broker_connected(const struct broker *b)
{
	return b->connected;
}

bool broker_blocked(const struct broker *b)
{
	return b->connected && b->blocked;
}

int broker_fd(const struct broker *b)
{
	if (!b->connected || b->conn == NULL)
		return -1;
	return amqp_get_sockfd(b->conn);
}

const char *broker_node(const struct broker *b)
{
	return b->node_name;
}

void broker_test_skip_frame_check(struct broker *b, bool skip)
{
	b->skip_frame_check = skip;
}

static struct timeval ms_timeval(int64_t ms)
{
	struct timeval tv;

	if (ms < 0)
		ms = 0;
	tv.tv_sec = (time_t)(ms / 1000);
	tv.tv_usec = (suseconds_t)(ms % 1000 * 1000);
	return tv;
}

static int64_t connect_timeout_ms(const struct broker *b)
{
	int64_t t = b->opts.confirm_timeout_ms;

	return t <= 0 || t > CONNECT_TIMEOUT_MAX_MS ? CONNECT_TIMEOUT_MAX_MS : t;
}

static int64_t abort_at(const struct broker *b)
{
	return b->opts.abort_at_ms != NULL ? (int64_t)atomic_load(b->opts.abort_at_ms) : 0;
}

static void touch_progress(struct broker *b, int64_t now_ms)
{
	if (b->opts.progress_ms != NULL)
		atomic_store(b->opts.progress_ms, (long long)now_ms);
}

static void copy_bytes(char *out, size_t n, amqp_bytes_t s)
{
	size_t len = s.len < n - 1 ? s.len : n - 1;

	if (len > 0)
		memcpy(out, s.bytes, len);
	out[len] = '\0';
}

/* A value from the broker quoted in a one-line error: control bytes become '?'. */
static void copy_shown(char *out, size_t n, amqp_bytes_t s)
{
	copy_bytes(out, n, s);
	for (char *p = out; *p != '\0'; p++) {
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = '?';
	}
}

static int64_t batch_wait_end(const struct broker *b);

static void release_channel(struct broker *b, amqp_channel_t ch)
{
	if (b->conn != NULL)
		amqp_maybe_release_buffers_on_channel(b->conn, ch);
}

/* The connection is unusable: drop it without a polite close (the socket may be dead). The
 * socket leaves broker_interrupt()'s reach before it is closed, so that a descriptor number
 * reused by someone else is never shut down. */
static int lost(struct broker *b)
{
	if (b->conn != NULL) {
		if (b->connected && b->nnodes > 0)
			b->next_node = (b->cur_node + 1) % b->nnodes;
		pthread_mutex_lock(&b->fd_lock);
		b->live_fd = -1;
		pthread_mutex_unlock(&b->fd_lock);
		amqp_destroy_connection(b->conn);
		b->conn = NULL;
	}
	b->connected = false;
	b->blocked = false;
	b->check_open = false;
	b->return_pending = false;
	return BROKER_ERR_CONN;
}

static int interrupted_err(struct broker *b, const char *what)
{
	set_err(b, "interrupted at the shutdown deadline while %s", what);
	(void)lost(b);
	return BROKER_ERR_ABORTED;
}

/* A rabbitmq-c read or write failed: the connection is gone. */
static int io_failed(struct broker *b, const char *what, int status)
{
	if (atomic_load(&b->interrupted))
		return interrupted_err(b, what);
	set_err(b, "connection to broker lost while %s: %s", what, amqp_error_string2(status));
	return lost(b);
}

/* Waits until fd is ready for events (1), deadline_ms passes (0), the shutdown deadline
 * passes or broker_interrupt() is called (BROKER_ERR_ABORTED, connection dropped). The
 * shutdown deadline is read again after every wake-up; the wake descriptor is polled only
 * while no deadline is set, since it stays readable once written. */
static int wait_fd(struct broker *b, int fd, short events, int64_t deadline_ms, const char *what)
{
	bool use_wake = b->opts.wake_fd >= 0;

	for (;;) {
		struct pollfd p[3];
		nfds_t n = 0;
		int wake_i = -1;
		int64_t now = clock_mono_ms();
		int64_t stop = abort_at(b);
		int64_t end = deadline_ms;
		int rc;

		touch_progress(b, now);
		if (atomic_load(&b->interrupted))
			return interrupted_err(b, what);
		if (stop != 0 && now >= stop) {
			set_err(b, "stopped waiting at the shutdown deadline: %s", what);
			(void)lost(b);
			return BROKER_ERR_ABORTED;
		}
		/* Nothing is in flight while connecting: a stop need not wait for its deadline. */
		if (stop != 0 && b->connecting) {
			set_err(b, "stopped %s: the relay is stopping", what);
			(void)lost(b);
			return BROKER_ERR_ABORTED;
		}
		if (now >= deadline_ms)
			return 0;
		if (stop != 0 && stop < end)
			end = stop;
		if (end - now > SLICE_MS)
			end = now + SLICE_MS;
		p[n].fd = fd;
		p[n++].events = events;
		p[n].fd = b->intr_pipe[0];
		p[n++].events = POLLIN;
		if (use_wake && stop == 0) {
			wake_i = (int)n;
			p[n].fd = b->opts.wake_fd;
			p[n++].events = POLLIN;
		}
		rc = poll(p, n, (int)(end - now));
		if (rc < 0 && errno != EINTR) {
			set_err(b, "could not wait for the broker while %s: %s", what,
			        strerror(errno));
			return lost(b);
		}
		if (rc <= 0)
			continue;
		/* Readable before a deadline was set (a stop that sets it only afterwards):
		 * polling it again would spin, so look at the deadline every slice instead. */
		if (wake_i >= 0 && p[wake_i].revents != 0 && abort_at(b) == 0)
			use_wake = false;
		if (p[0].revents != 0)
			return 1;
	}
}

/* Reads the next frame into *f: 1 when one arrived, 0 when deadline_ms passed first (a
 * deadline in the past reads only what has arrived), or an error (connection dropped).
 * rabbitmq-c is only asked for what it can return at once; the waiting is wait_fd()'s. */
static int next_frame(struct broker *b, amqp_frame_t *f, int64_t deadline_ms, const char *what)
{
	/* Not zero: rabbitmq-c notices a missed server heartbeat only when the deadline it is
	 * given is a real time, and 1 us is one it can never wait for. */
	const struct timeval at_once = { 0, 1 };

	for (;;) {
		int rc;

		if (b->conn == NULL) {
			set_err(b, "not connected to broker");
			return BROKER_ERR_CONN;
		}
		rc = amqp_simple_wait_frame_noblock(b->conn, f, &at_once);
		if (rc == AMQP_STATUS_OK)
			return 1;
		if (rc != AMQP_STATUS_TIMEOUT)
			return io_failed(b, what, rc);
		if (clock_mono_ms() >= deadline_ms)
			return 0;
		rc = wait_fd(b, amqp_get_sockfd(b->conn), POLLIN, deadline_ms, what);
		if (rc <= 0)
			return rc;
	}
}

/* ---- handling what the broker sends ---- */

/* The content header of a basic.return: RabbitMQ sends the return before the ack of the same
 * message, and it carries no delivery tag, so the row is found by the message_id we set. A
 * return that matches no row waiting for its answer means our bookkeeping and the broker's
 * disagree: nothing of the batch can be trusted as answered, so the batch fails. */
static int returned(struct broker *b, const amqp_basic_properties_t *p)
{
	amqp_bytes_t id = { 0, NULL };
	char mid[256];

	if (p != NULL && (p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG))
		id = p->message_id;
	if (!b->active)
		return BROKER_OK; /* no batch in flight to fail */
	for (size_t i = 0; i < b->n; i++) {
		if (confirm_tracker_state(&b->tracker, i) != CONFIRM_TRACKER_SENT ||
		    strlen(b->msgs[i].id) != id.len || memcmp(b->msgs[i].id, id.bytes, id.len) != 0)
			continue;
		(void)confirm_tracker_returned(&b->tracker, i);
		snprintf(b->res[i].error, sizeof(b->res[i].error),
		         "unroutable: exchange '%.120s' routing key '%.120s' has no binding",
		         b->ret_exchange, b->ret_rkey);
		return BROKER_OK;
	}
	copy_shown(mid, sizeof(mid), id);
	set_err(b,
	        "broker returned a message that matches no row waiting for an answer "
	        "(message_id '%.64s'): the batch is abandoned",
	        mid);
	return lost(b);
}

static int send_close_ok(struct broker *b, amqp_channel_t ch)
{
	int rc;

	if (ch == 0) {
		amqp_connection_close_ok_t ok = { 0 };

		rc = amqp_send_method(b->conn, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
	} else {
		amqp_channel_close_ok_t ok = { 0 };

		rc = amqp_send_method(b->conn, ch, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
	}
	if (rc == AMQP_STATUS_OK)
		return BROKER_OK;
	/* Answering the broker's own connection.close: the connection is gone either way, and
	 * the reason the broker gave (say, 320 'shutdown') is what the log must show, not the
	 * socket error of a close-ok nobody reads. */
	if (ch == 0)
		return lost(b);
	return io_failed(b, "closing a channel", rc);
}

/* Handles one frame; anything kept is copied before the channel's buffers are recycled. */
static int handle_frame(struct broker *b, const amqp_frame_t *f)
{
	int rc = BROKER_OK;

	if (f->frame_type == AMQP_FRAME_HEADER) {
		if (f->channel == PUBLISH_CHANNEL && b->return_pending) {
			b->return_pending = false;
			rc = returned(b, f->payload.properties.decoded);
		}
		goto out;
	}
	if (f->frame_type != AMQP_FRAME_METHOD)
		goto out; /* the body of a returned message, which we do not need */
	switch (f->payload.method.id) {
	case AMQP_BASIC_ACK_METHOD:
	case AMQP_BASIC_NACK_METHOD:
		if (f->channel == PUBLISH_CHANNEL && b->active) {
			bool nack = f->payload.method.id == AMQP_BASIC_NACK_METHOD;
			uint64_t tag;
			bool multiple;

			if (nack) {
				const amqp_basic_nack_t *m = f->payload.method.decoded;

				tag = m->delivery_tag;
				multiple = m->multiple;
			} else {
				const amqp_basic_ack_t *m = f->payload.method.decoded;

				tag = m->delivery_tag;
				multiple = m->multiple;
			}
			(void)confirm_tracker_answer(&b->tracker, tag, multiple, nack,
			                             clock_mono_us());
		}
		break;
	case AMQP_BASIC_RETURN_METHOD:
		if (f->channel == PUBLISH_CHANNEL) {
			const amqp_basic_return_t *r = f->payload.method.decoded;

			copy_shown(b->ret_exchange, sizeof(b->ret_exchange), r->exchange);
			copy_shown(b->ret_rkey, sizeof(b->ret_rkey), r->routing_key);
			b->return_pending = true;
		}
		break;
	case AMQP_CHANNEL_CLOSE_METHOD: {
		const amqp_channel_close_t *c = f->payload.method.decoded;

		if (f->channel == PUBLISH_CHANNEL) {
			b->channel_closed = true;
			b->return_pending = false;
			b->close_code = c->reply_code;
			copy_shown(b->close_text, sizeof(b->close_text), c->reply_text);
		} else if (f->channel == CHECK_CHANNEL) {
			b->check_open = false; /* reopened by the next check */
		}
		rc = send_close_ok(b, f->channel);
		break;
	}
	case AMQP_CONNECTION_CLOSE_METHOD: {
		const amqp_connection_close_t *c = f->payload.method.decoded;
		char text[CLOSE_TEXT_MAX];

		copy_shown(text, sizeof(text), c->reply_text);
		set_err(b, "connection closed by broker: %s", text);
		(void)send_close_ok(b, 0);
		rc = lost(b);
		break;
	}
	case AMQP_CONNECTION_BLOCKED_METHOD:
		if (!b->blocked) {
			b->blocked = true;
			b->blocked_since_ms = clock_mono_ms();
		}
		break;
	case AMQP_CONNECTION_UNBLOCKED_METHOD:
		b->blocked = false;
		break;
	default:
		break;
	}
out:
	release_channel(b, f->channel);
	return rc;
}

/* Reads and handles one frame, waiting until deadline_ms at most. Returns 1 when a frame
 * was handled, 0 at the deadline, or an error. */
static int read_frame(struct broker *b, int64_t deadline_ms, const char *what)
{
	amqp_frame_t f;
	int rc = next_frame(b, &f, deadline_ms, what);

	if (rc <= 0)
		return rc;
	rc = handle_frame(b, &f);
	return rc == BROKER_OK ? 1 : rc;
}

/* Handles everything already received without waiting for more. */
static int drain(struct broker *b)
{
	int rc;

	do {
		rc = read_frame(b, 0, "reading from the broker");
	} while (rc == 1 && !b->channel_closed);
	return rc < 0 ? rc : BROKER_OK;
}

/* Waits for method reply_id on channel ch, handling every other frame on the way (acks,
 * returns, connection.blocked). W_GOT with *out (decoded in the channel's buffers: copy
 * what is needed, then release_channel()), W_DEADLINE, W_CHANNEL_CLOSED (the broker closed
 * ch instead; close-ok sent) or W_CONNECTION_CLOSED (connection dropped), with the reply
 * code and text in rpc_close_*; or an error. */
static int wait_method(struct broker *b, amqp_channel_t ch, amqp_method_number_t reply_id,
                       int64_t deadline_ms, const char *what, amqp_method_t *out)
{
	for (;;) {
		amqp_frame_t f;
		int rc = next_frame(b, &f, deadline_ms, what);

		if (rc <= 0)
			return rc;
		if (f.frame_type == AMQP_FRAME_METHOD) {
			amqp_method_number_t id = f.payload.method.id;

			if (f.channel == ch && id == reply_id) {
				*out = f.payload.method;
				return W_GOT;
			}
			if (f.channel == 0 && id == AMQP_CONNECTION_CLOSE_METHOD) {
				const amqp_connection_close_t *c = f.payload.method.decoded;

				b->rpc_close_code = c->reply_code;
				copy_shown(b->rpc_close_text, sizeof(b->rpc_close_text),
				           c->reply_text);
				(void)send_close_ok(b, 0);
				(void)lost(b);
				return W_CONNECTION_CLOSED;
			}
			if (ch != 0 && f.channel == ch && id == AMQP_CHANNEL_CLOSE_METHOD) {
				const amqp_channel_close_t *c = f.payload.method.decoded;

				b->rpc_close_code = c->reply_code;
				copy_shown(b->rpc_close_text, sizeof(b->rpc_close_text),
				           c->reply_text);
				release_channel(b, ch);
				rc = send_close_ok(b, ch);
				return rc < 0 ? rc : W_CHANNEL_CLOSED;
			}
		}
		rc = handle_frame(b, &f);
		if (rc < 0)
			return rc;
	}
}

/* Sends a method and waits for its reply (see wait_method()). */
static int rpc(struct broker *b, amqp_channel_t ch, amqp_method_number_t id, void *req,
               amqp_method_number_t reply_id, int64_t deadline_ms, const char *what,
               amqp_method_t *out)
{
	int rc;

	if (b->conn == NULL) {
		set_err(b, "not connected to broker");
		return BROKER_ERR_CONN;
	}
	rc = amqp_send_method(b->conn, ch, id, req);
	if (rc != AMQP_STATUS_OK)
		return io_failed(b, what, rc);
	return wait_method(b, ch, reply_id, deadline_ms, what, out);
}

/* Turns an rpc() outcome other than W_GOT into an error with "doing: why". */
static int rpc_failed(struct broker *b, int rc, const char *doing)
{
	switch (rc) {
	case W_DEADLINE:
		set_err(b, "%s: no answer from %s in time", doing, b->node_name);
		(void)lost(b);
		return BROKER_ERR_TIMEOUT;
	case W_CHANNEL_CLOSED:
		set_err(b, "%s: %s", doing, b->rpc_close_text);
		return lost(b);
	case W_CONNECTION_CLOSED:
		set_err(b, "%s: connection closed by broker: %s", doing, b->rpc_close_text);
		return lost(b);
	default:
		return rc; /* an error, its message set */
	}
}

static int open_publish_channel(struct broker *b, int64_t deadline_ms)
{
	amqp_channel_open_t open = { .out_of_band = amqp_empty_bytes };
	amqp_confirm_select_t select = { .nowait = 0 };
	amqp_method_t m;
	int rc;

	rc = rpc(b, PUBLISH_CHANNEL, AMQP_CHANNEL_OPEN_METHOD, &open, AMQP_CHANNEL_OPEN_OK_METHOD,
	         deadline_ms, "opening the publish channel", &m);
	if (rc != W_GOT)
		return rpc_failed(b, rc, "could not open channel");
	release_channel(b, PUBLISH_CHANNEL);
	rc = rpc(b, PUBLISH_CHANNEL, AMQP_CONFIRM_SELECT_METHOD, &select,
	         AMQP_CONFIRM_SELECT_OK_METHOD, deadline_ms, "selecting confirm mode", &m);
	if (rc != W_GOT)
		return rpc_failed(b, rc, "could not select confirm mode");
	release_channel(b, PUBLISH_CHANNEL);
	b->channel_closed = false;
	b->return_pending = false;
	confirm_tracker_channel_reset(&b->tracker);
	return BROKER_OK;
}

static int open_check_channel(struct broker *b, int64_t deadline_ms)
{
	amqp_channel_open_t open = { .out_of_band = amqp_empty_bytes };
	amqp_method_t m;
	int rc;

	rc = rpc(b, CHECK_CHANNEL, AMQP_CHANNEL_OPEN_METHOD, &open, AMQP_CHANNEL_OPEN_OK_METHOD,
	         deadline_ms, "opening the check channel", &m);
	if (rc != W_GOT)
		return rpc_failed(b, rc, "could not open channel");
	release_channel(b, CHECK_CHANNEL);
	b->check_open = true;
	return BROKER_OK;
}

/* ---- nodes ---- */

/* Splits amqp.url at commas and parses each URL. Errors never quote a URL: it holds a
 * password. */
static int parse_nodes(struct broker *b)
{
	const char *url = b->opts.url != NULL ? b->opts.url : "";
	const char *p = url;
	size_t count = 1;

	if (b->parsed) {
		if (b->parse_err[0] == '\0')
			return BROKER_OK;
		set_err(b, "%s", b->parse_err);
		return BROKER_ERR_CONFIG;
	}
	for (const char *c = url; *c != '\0'; c++)
		count += *c == ',';
	if (count > NODES_MAX) {
		snprintf(b->parse_err, sizeof(b->parse_err), "invalid amqp.url: more than %d URLs",
		         NODES_MAX);
		goto out;
	}
	b->nodes = calloc(count, sizeof(*b->nodes));
	if (b->nodes == NULL) {
		set_err(b, "out of memory");
		return BROKER_ERR_NOMEM;
	}
	for (size_t i = 0; i < count; i++) {
		struct node *nd = &b->nodes[i];
		size_t len = strcspn(p, ",");
		const char *s = p;
		char where[48] = "";
		int rc;

		p += len + (p[len] == ',');
		while (len > 0 && (*s == ' ' || *s == '\t')) {
			s++;
			len--;
		}
		while (len > 0 && (s[len - 1] == ' ' || s[len - 1] == '\t'))
			len--;
		if (count > 1)
			snprintf(where, sizeof(where), "URL %zu of %zu: ", i + 1, count);
		nd->buf = strndup(s, len);
		if (nd->buf == NULL) {
			free_nodes(b);
			set_err(b, "out of memory");
			return BROKER_ERR_NOMEM;
		}
		b->nnodes = i + 1;
		amqp_default_connection_info(&nd->ci);
		rc = len == 0 ? AMQP_STATUS_BAD_URL : amqp_parse_url(nd->buf, &nd->ci);
		if (rc != AMQP_STATUS_OK) {
			snprintf(b->parse_err, sizeof(b->parse_err), "invalid amqp.url: %s%s",
			         where, len == 0 ? "empty" : amqp_error_string2(rc));
			goto out;
		}
		/* "amqp://host" and "amqp://host/" both mean the default vhost here, as
		 * operators expect; an explicitly empty vhost is not useful with RabbitMQ. */
		if (nd->ci.vhost == NULL || nd->ci.vhost[0] == '\0')
			nd->ci.vhost = "/";
		if (strchr(nd->ci.host, ':') != NULL) /* IPv6 */
			snprintf(nd->name, sizeof(nd->name), "[%s]:%d", nd->ci.host, nd->ci.port);
		else
			snprintf(nd->name, sizeof(nd->name), "%s:%d", nd->ci.host, nd->ci.port);
	}
out:
	b->parsed = true;
	if (b->parse_err[0] == '\0')
		return BROKER_OK;
	free_nodes(b);
	set_err(b, "%s", b->parse_err);
	return BROKER_ERR_CONFIG;
}

/* Where the first round starts: spread over the cluster, different in every process. */
static size_t random_node(const struct broker *b)
{
	uint64_t x = (uint64_t)clock_mono_us() ^ ((uint64_t)getpid() << 32) ^ (uintptr_t)b;

	/* splitmix64's finaliser: consecutive seeds land far apart */
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 31;
	return (size_t)(x % b->nnodes);
}

/* ---- connecting ---- */

static void lower_first(char *s)
{
	/* strerror() is capitalised ("Connection refused"); our lines are not */
	if (s[0] >= 'A' && s[0] <= 'Z')
		s[0] = (char)(s[0] - 'A' + 'a');
}

/* Connects a non-blocking TCP socket to the node, waiting in wait_fd() so that the shutdown
 * deadline and broker_interrupt() end the wait; rabbitmq-c then adopts the socket. */
static int tcp_open(struct broker *b, const struct node *nd, int64_t deadline_ms, int *fd_out)
{
	struct addrinfo hint, *list = NULL;
	char port[16], reason[128], what[NODE_NAME_MAX + 16];
	int fd = -1, err = 0, gai;

	memset(&hint, 0, sizeof(hint));
	hint.ai_family = AF_UNSPEC;
	hint.ai_socktype = SOCK_STREAM;
	hint.ai_protocol = IPPROTO_TCP;
	snprintf(port, sizeof(port), "%d", nd->ci.port);
	snprintf(what, sizeof(what), "connecting to %s", nd->name);
	gai = getaddrinfo(nd->ci.host, port, &hint, &list);
	if (gai != 0) {
		snprintf(reason, sizeof(reason), "%s", gai_strerror(gai));
		lower_first(reason);
		set_err(b, "could not connect to %s: %s", nd->name, reason);
		return BROKER_ERR_CONN;
	}
	for (struct addrinfo *a = list; a != NULL; a = a->ai_next) {
		int one = 1, rc;
		socklen_t len = sizeof(err);

		fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
		            a->ai_protocol);
		if (fd < 0) {
			err = errno;
			continue;
		}
		(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		(void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
		if (connect(fd, a->ai_addr, a->ai_addrlen) == 0)
			break;
		err = errno;
		if (err == EINPROGRESS) {
			rc = wait_fd(b, fd, POLLOUT, deadline_ms, what);
			if (rc < 0) {
				close(fd);
				freeaddrinfo(list);
				return rc;
			}
			if (rc == 0) {
				err = ETIMEDOUT; /* the node's time is up: no other address */
				close(fd);
				fd = -1;
				break;
			}
			err = 0;
			if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
				err = errno;
			if (err == 0)
				break;
		}
		close(fd);
		fd = -1;
	}
	freeaddrinfo(list);
	if (fd >= 0) {
		*fd_out = fd;
		return BROKER_OK;
	}
	if (err == ETIMEDOUT) {
		snprintf(reason, sizeof(reason), "timed out after %lld ms",
		         (long long)connect_timeout_ms(b));
	} else {
		snprintf(reason, sizeof(reason), "%s", strerror(err));
		lower_first(reason);
	}
	set_err(b, "could not connect to %s: %s", nd->name, reason);
	return BROKER_ERR_CONN;
}

/* rabbitmq-c reports a failed non-blocking connect only as "a socket error occurred": the
 * reason sits in the socket's SO_ERROR, which it does not expose. On that failure path only,
 * one plain connect attempt finds out why ("connection refused", "no route to host"), so the
 * operator's log line says what is wrong. Returns an errno value, or 0 when unknown. */
static int connect_errno(const char *host, int port, int64_t timeout_ms)
{
	struct addrinfo hint, *list = NULL;
	char portstr[16];
	int err = 0;

	memset(&hint, 0, sizeof(hint));
	hint.ai_family = AF_UNSPEC;
	hint.ai_socktype = SOCK_STREAM;
	snprintf(portstr, sizeof(portstr), "%d", port);
	if (getaddrinfo(host, portstr, &hint, &list) != 0)
		return 0;
	for (struct addrinfo *a = list; a != NULL; a = a->ai_next) {
		int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
		                a->ai_protocol);
		struct pollfd pfd;
		socklen_t len = sizeof(err);

		if (fd < 0)
			continue;
		err = 0;
		if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
			err = errno;
			if (err == EINPROGRESS) {
				pfd.fd = fd;
				pfd.events = POLLOUT;
				if (poll(&pfd, 1,
				         (int)(timeout_ms > INT_MAX ? INT_MAX : timeout_ms)) == 1)
					(void)getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
				else
					err = ETIMEDOUT;
			}
		}
		close(fd);
		if (err == 0)
			break;
	}
	freeaddrinfo(list);
	return err;
}

/* TLS: rabbitmq-c connects and shakes hands itself, so that wait is bounded by the node's
 * time (and the shutdown deadline as it stood when it began) but cannot be woken early. */
static int tls_open(struct broker *b, const struct node *nd, int64_t deadline_ms)
{
	amqp_socket_t *sock = amqp_ssl_socket_new(b->conn);
	int64_t end = deadline_ms, stop = abort_at(b), now = clock_mono_ms();
	struct timeval tv;
	char reason[128];
	int rc, e;

	if (sock == NULL) {
		set_err(b, "could not create TLS socket");
		return BROKER_ERR_NOMEM;
	}
	if (b->opts.tls_ca_file != NULL && b->opts.tls_ca_file[0] != '\0' &&
	    amqp_ssl_socket_set_cacert(sock, b->opts.tls_ca_file) != AMQP_STATUS_OK) {
		set_err(b, "could not read amqp.tls.ca_file '%s'", b->opts.tls_ca_file);
		return ERR_SETUP;
	}
	if (b->opts.tls_cert_file != NULL && b->opts.tls_cert_file[0] != '\0' &&
	    amqp_ssl_socket_set_key(sock, b->opts.tls_cert_file,
	                            b->opts.tls_key_file != NULL ? b->opts.tls_key_file : "") !=
	            AMQP_STATUS_OK) {
		set_err(b, "could not read amqp.tls.cert_file '%s' or key_file '%s'",
		        b->opts.tls_cert_file, b->opts.tls_key_file ? b->opts.tls_key_file : "");
		return ERR_SETUP;
	}
	amqp_ssl_socket_set_verify_peer(sock, b->opts.tls_verify_peer);
	amqp_ssl_socket_set_verify_hostname(sock, b->opts.tls_verify_peer);
	if (stop != 0 && stop < end)
		end = stop;
	if (atomic_load(&b->interrupted))
		return interrupted_err(b, "connecting");
	if (stop != 0 && now >= stop) {
		set_err(b, "stopped waiting at the shutdown deadline: connecting to %s", nd->name);
		(void)lost(b);
		return BROKER_ERR_ABORTED;
	}
	touch_progress(b, now);
	tv = ms_timeval(end - now);
	errno = 0;
	rc = amqp_socket_open_noblock(sock, nd->ci.host, nd->ci.port, &tv);
	if (rc == AMQP_STATUS_OK)
		return BROKER_OK;
	e = errno;
	if (rc == AMQP_STATUS_SOCKET_ERROR && (e == 0 || e == EINPROGRESS)) {
		now = clock_mono_ms();
		e = connect_errno(nd->ci.host, nd->ci.port, end > now ? end - now : 1);
	}
	if (rc == AMQP_STATUS_SOCKET_ERROR && e != 0) {
		snprintf(reason, sizeof(reason), "%s", strerror(e));
		lower_first(reason);
	} else if (rc == AMQP_STATUS_TIMEOUT) {
		snprintf(reason, sizeof(reason), "timed out after %lld ms",
		         (long long)connect_timeout_ms(b));
	} else {
		snprintf(reason, sizeof(reason), "%s", amqp_error_string2(rc));
	}
	set_err(b, "could not connect to %s: %s", nd->name, reason);
	return BROKER_ERR_CONN;
}

/* Puts the connection's socket within broker_interrupt()'s reach, unless an interrupt came
 * while connecting. */
static int hold_socket(struct broker *b)
{
	int fd = amqp_get_sockfd(b->conn);
	bool stop;

	pthread_mutex_lock(&b->fd_lock);
	stop = atomic_load(&b->interrupted);
	if (!stop)
		b->live_fd = fd;
	pthread_mutex_unlock(&b->fd_lock);
	return stop ? interrupted_err(b, "connecting") : BROKER_OK;
}

/* Bounds writes once connected: rabbitmq-c waits for writability without a deadline inside
 * basic.publish, so a broker that stops reading (memory alarm) would block us for ever;
 * TCP_USER_TIMEOUT makes the kernel drop a connection whose sent data (or zero-window
 * probes) stay unacknowledged. broker_interrupt() ends such a write sooner. */
static void bound_writes(struct broker *b)
{
	int fd = amqp_get_sockfd(b->conn);
	unsigned int user_timeout;

	if (fd < 0 || b->opts.confirm_timeout_ms <= 0)
		return;
	user_timeout = b->opts.confirm_timeout_ms > UINT_MAX
	                       ? UINT_MAX
	                       : (unsigned int)b->opts.confirm_timeout_ms;
	(void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof(user_timeout));
}

static bool offers_plain(amqp_bytes_t mechanisms)
{
	const char *s = mechanisms.bytes;
	size_t i = 0;

	while (i < mechanisms.len) {
		size_t j = i;

		while (j < mechanisms.len && s[j] != ' ')
			j++;
		if (j - i == 5 && memcmp(s + i, "PLAIN", 5) == 0)
			return true;
		i = j + 1;
	}
	return false;
}

/* A failed step of the login: the node's time ran out, the broker closed the connection, or
 * the connection broke. */
static int login_failed(struct broker *b, const struct node *nd, int rc, const char *step)
{
	switch (rc) {
	case W_DEADLINE:
		set_err(b, "could not log in to %s as user '%s': no answer to %s within %lld ms",
		        nd->name, nd->ci.user, step, (long long)connect_timeout_ms(b));
		(void)lost(b);
		return BROKER_ERR_CONN;
	case W_CONNECTION_CLOSED:
		set_err(b, "could not log in to %s as user '%s': %s", nd->name, nd->ci.user,
		        b->rpc_close_text);
		return BROKER_ERR_CONN;
	case W_GOT:
	case W_CHANNEL_CLOSED:
		set_err(b, "could not log in to %s: unexpected answer to %s", nd->name, step);
		return lost(b);
	default:
		return rc; /* an error, its message set */
	}
}

/* The AMQP handshake (what amqp_login_with_properties() does), with every wait in
 * next_frame(): protocol header, start / start-ok (SASL PLAIN), tune / tune-ok, open. */
static int login(struct broker *b, const struct node *nd, int64_t deadline_ms)
{
	const char *const cap_names[4] = { "connection.blocked", "publisher_confirms", "basic.nack",
		                           "authentication_failure_close" };
	amqp_table_entry_t caps[4], props[3];
	amqp_connection_start_ok_t start_ok;
	amqp_connection_tune_ok_t tune_ok;
	amqp_connection_open_t open;
	amqp_method_t m;
	char what[NODE_NAME_MAX + 24];
	size_t ulen = strlen(nd->ci.user), plen = strlen(nd->ci.password);
	char *sasl;
	uint16_t channel_max = 0, heartbeat = 0;
	uint32_t frame_max = FRAME_MAX;
	int rc;

	snprintf(what, sizeof(what), "logging in to %s", nd->name);
	if (b->opts.heartbeat_ms > 0) {
		int64_t s = (b->opts.heartbeat_ms + 999) / 1000; /* rounded up: never more often */

		heartbeat = s > 65535 ? 65535 : (uint16_t)s;
	}
	rc = amqp_send_header(b->conn);
	if (rc != AMQP_STATUS_OK)
		return io_failed(b, what, rc);
	rc = wait_method(b, 0, AMQP_CONNECTION_START_METHOD, deadline_ms, what, &m);
	if (rc != W_GOT)
		return login_failed(b, nd, rc, "the protocol header");
	{
		const amqp_connection_start_t *s = m.decoded;

		if (s->version_major != AMQP_PROTOCOL_VERSION_MAJOR ||
		    s->version_minor != AMQP_PROTOCOL_VERSION_MINOR) {
			set_err(b, "could not log in to %s: broker speaks AMQP %d-%d, not 0-9-1",
			        nd->name, s->version_major, s->version_minor);
			return lost(b);
		}
		if (!offers_plain(s->mechanisms)) {
			set_err(b, "could not log in to %s: broker does not offer PLAIN login",
			        nd->name);
			return lost(b);
		}
	}
	release_channel(b, 0);

	for (size_t i = 0; i < 4; i++) {
		caps[i].key = amqp_cstring_bytes(cap_names[i]);
		caps[i].value.kind = AMQP_FIELD_KIND_BOOLEAN;
		caps[i].value.value.boolean = 1;
	}
	props[0].key = amqp_cstring_bytes("product");
	props[0].value.kind = AMQP_FIELD_KIND_UTF8;
	props[0].value.value.bytes = amqp_cstring_bytes("outbox-relay");
	props[1].key = amqp_cstring_bytes("capabilities");
	props[1].value.kind = AMQP_FIELD_KIND_TABLE;
	props[1].value.value.table.num_entries = 4;
	props[1].value.value.table.entries = caps;
	props[2].key = amqp_cstring_bytes("connection_name");
	props[2].value.kind = AMQP_FIELD_KIND_UTF8;
	props[2].value.value.bytes = amqp_cstring_bytes(
	        b->opts.connection_name != NULL && b->opts.connection_name[0] != '\0'
	                ? b->opts.connection_name
	                : "outbox-relay");
	/* SASL PLAIN: "\0user\0password" */
	sasl = malloc(ulen + plen + 2);
	if (sasl == NULL) {
		set_err(b, "out of memory");
		(void)lost(b);
		return BROKER_ERR_NOMEM;
	}
	sasl[0] = '\0';
	memcpy(sasl + 1, nd->ci.user, ulen);
	sasl[1 + ulen] = '\0';
	memcpy(sasl + 2 + ulen, nd->ci.password, plen);
	start_ok.client_properties.num_entries = 3;
	start_ok.client_properties.entries = props;
	start_ok.mechanism = amqp_cstring_bytes("PLAIN");
	start_ok.response.bytes = sasl;
	start_ok.response.len = ulen + plen + 2;
	start_ok.locale = amqp_cstring_bytes("en_US");
	rc = amqp_send_method(b->conn, 0, AMQP_CONNECTION_START_OK_METHOD, &start_ok);
	explicit_bzero(sasl, ulen + plen + 2);
	free(sasl);
	if (rc != AMQP_STATUS_OK)
		return io_failed(b, what, rc);

	rc = wait_method(b, 0, AMQP_CONNECTION_TUNE_METHOD, deadline_ms, what, &m);
	if (rc == W_CONNECTION_CLOSED && b->rpc_close_code == AMQP_ACCESS_REFUSED) {
		set_err(b, "login refused for user '%s' at %s (%s)", nd->ci.user, nd->name,
		        b->rpc_close_text);
		return BROKER_ERR_CONFIG;
	}
	if (rc != W_GOT)
		return login_failed(b, nd, rc, "the login");
	{
		/* As rabbitmq-c negotiates: the smaller of both sides' limits, where 0 is "no
		 * limit" for channels and frames and "off" for heartbeats. */
		const amqp_connection_tune_t *t = m.decoded;

		channel_max = t->channel_max;
		if (t->frame_max != 0 && t->frame_max < frame_max)
			frame_max = t->frame_max;
		if (t->heartbeat != 0 && t->heartbeat < heartbeat)
			heartbeat = t->heartbeat;
	}
	release_channel(b, 0);
	if (channel_max == 0)
		channel_max = UINT16_MAX;
	rc = amqp_tune_connection(b->conn, channel_max, (int)frame_max, heartbeat);
	if (rc != AMQP_STATUS_OK) {
		set_err(b, "could not log in to %s: %s", nd->name, amqp_error_string2(rc));
		return lost(b);
	}
	tune_ok.channel_max = channel_max;
	tune_ok.frame_max = frame_max;
	tune_ok.heartbeat = heartbeat;
	rc = amqp_send_method(b->conn, 0, AMQP_CONNECTION_TUNE_OK_METHOD, &tune_ok);
	if (rc != AMQP_STATUS_OK)
		return io_failed(b, what, rc);

	open.virtual_host = amqp_cstring_bytes(nd->ci.vhost);
	open.capabilities = amqp_empty_bytes;
	open.insist = 1;
	rc = rpc(b, 0, AMQP_CONNECTION_OPEN_METHOD, &open, AMQP_CONNECTION_OPEN_OK_METHOD,
	         deadline_ms, what, &m);
	if (rc == W_CONNECTION_CLOSED) {
		set_err(b, "could not open vhost '%s' as user '%s' at %s (%s)", nd->ci.vhost,
		        nd->ci.user, nd->name, b->rpc_close_text);
		return BROKER_ERR_CONFIG;
	}
	if (rc != W_GOT)
		return login_failed(b, nd, rc, "connection.open");
	release_channel(b, 0);
	return BROKER_OK;
}

/* One attempt at one node, within deadline_ms. */
static int connect_node(struct broker *b, size_t idx, int64_t deadline_ms)
{
	const struct node *nd = &b->nodes[idx];
	int rc;

	b->conn = amqp_new_connection();
	if (b->conn == NULL) {
		set_err(b, "out of memory");
		return BROKER_ERR_NOMEM;
	}
	if (nd->ci.ssl) {
		rc = tls_open(b, nd, deadline_ms);
	} else {
		int fd = -1;

		rc = tcp_open(b, nd, deadline_ms, &fd);
		if (rc == BROKER_OK) {
			amqp_socket_t *sock = amqp_tcp_socket_new(b->conn);

			if (sock == NULL) {
				close(fd);
				set_err(b, "out of memory");
				rc = BROKER_ERR_NOMEM;
			} else {
				amqp_tcp_socket_set_sockfd(sock, fd);
			}
		}
	}
	if (rc == BROKER_OK)
		rc = hold_socket(b);
	if (rc == BROKER_OK)
		rc = login(b, nd, deadline_ms);
	if (rc == BROKER_OK) {
		bound_writes(b);
		rc = open_publish_channel(b, deadline_ms);
	}
	if (rc == BROKER_OK)
		rc = open_check_channel(b, deadline_ms);
	if (rc == BROKER_OK) {
		b->connected = true;
		b->blocked = false;
		b->cur_node = idx;
	}
	if (rc != BROKER_OK && b->conn != NULL)
		(void)lost(b);
	return rc;
}

/* A new call starts without the last one's interrupt. */
static void clear_interrupt(struct broker *b)
{
	char buf[64];

	pthread_mutex_lock(&b->fd_lock);
	atomic_store(&b->interrupted, false);
	while (read(b->intr_pipe[0], buf, sizeof(buf)) > 0)
		;
	pthread_mutex_unlock(&b->fd_lock);
}

int broker_connect(struct broker *b)
{
	bool all_refused = true;
	size_t start;
	int rc;

	broker_disconnect(b);
	clear_interrupt(b);
	forget_exchanges(b); /* exchanges may have been deleted while we were away */
	b->active = false;
	b->max_body = 0;
	b->proven_body = PIPELINE_BODY_MAX;
	rc = parse_nodes(b);
	if (rc != BROKER_OK)
		return rc;
	if (!b->started) {
		b->next_node = random_node(b);
		b->started = true;
	}
	start = b->next_node;
	if (abort_at(b) != 0) {
		set_err(b, "not connecting: the relay is stopping");
		return BROKER_ERR_ABORTED;
	}
	for (size_t k = 0; k < b->nnodes; k++) {
		size_t idx = (start + k) % b->nnodes;

		snprintf(b->node_name, sizeof(b->node_name), "%s", b->nodes[idx].name);
		b->connecting = true;
		rc = connect_node(b, idx, clock_mono_ms() + connect_timeout_ms(b));
		b->connecting = false;
		if (rc == BROKER_OK) {
			b->next_node = idx;
			return BROKER_OK;
		}
		b->next_node = (idx + 1) % b->nnodes;
		if (rc == ERR_SETUP)
			return BROKER_ERR_CONFIG;
		if (rc == BROKER_ERR_ABORTED || rc == BROKER_ERR_NOMEM)
			return rc;
		if (rc != BROKER_ERR_CONFIG)
			all_refused = false;
	}
	if (b->nnodes > 1) {
		char last[sizeof(b->errmsg)];

		memcpy(last, b->errmsg, sizeof(last));
		set_err(b, "%s (all %zu nodes failed)", last, b->nnodes);
	}
	return all_refused ? BROKER_ERR_CONFIG : BROKER_ERR_CONN;
}

/* connection.close and its close-ok, so that the broker logs a clean disconnect. Skipped
 * when the socket cannot take the frame at once: a broker that stopped reading would block
 * the write until TCP_USER_TIMEOUT. */
static void polite_close(struct broker *b)
{
	amqp_connection_close_t req = { .reply_code = AMQP_REPLY_SUCCESS,
		                        .reply_text = amqp_cstring_bytes("closing"),
		                        .class_id = 0,
		                        .method_id = 0 };
	struct pollfd p = { .fd = amqp_get_sockfd(b->conn), .events = POLLOUT };
	amqp_method_t m;

	if (atomic_load(&b->interrupted) || p.fd < 0 || poll(&p, 1, 0) != 1 ||
	    (p.revents & (POLLERR | POLLHUP)) != 0)
		return;
	if (amqp_send_method(b->conn, 0, AMQP_CONNECTION_CLOSE_METHOD, &req) != AMQP_STATUS_OK)
		return;
	(void)wait_method(b, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, clock_mono_ms() + CLOSE_WAIT_MS,
	                  "closing the connection", &m);
}

void broker_disconnect(struct broker *b)
{
	b->active = false;
	if (b->conn == NULL)
		return;
	if (b->connected) {
		/* The caller logs why it disconnects from broker_errmsg(): keep it. */
		char saved[sizeof(b->errmsg)];

		memcpy(saved, b->errmsg, sizeof(saved));
		polite_close(b);
		memcpy(b->errmsg, saved, sizeof(saved));
	}
	(void)lost(b);
}

void broker_interrupt(struct broker *b)
{
	ssize_t w;

	pthread_mutex_lock(&b->fd_lock);
	atomic_store(&b->interrupted, true);
	if (b->live_fd >= 0)
		(void)shutdown(b->live_fd, SHUT_RDWR);
	w = write(b->intr_pipe[1], "x", 1); /* full pipe: already woken */
	(void)w;
	pthread_mutex_unlock(&b->fd_lock);
}

int broker_service(struct broker *b)
{
	if (!b->connected) {
		set_err(b, "not connected to broker");
		return BROKER_ERR_CONN;
	}
	/* Also sends a heartbeat when one is due: rabbitmq-c only does that inside its calls. */
	return drain(b);
}

/* ---- publishing ---- */

static bool exchange_known(const struct broker *b, const char *name)
{
	for (size_t i = 0; i < b->nknown; i++) {
		if (strcmp(b->known[i], name) == 0)
			return true;
	}
	return false;
}

static int remember_exchange(struct broker *b, const char *name)
{
	char *copy;

	if (b->known == NULL) {
		b->known = calloc(KNOWN_EXCHANGES_MAX, sizeof(*b->known));
		if (b->known == NULL)
			return BROKER_ERR_NOMEM;
	}
	if (b->nknown == KNOWN_EXCHANGES_MAX)
		forget_exchanges(b); /* bounded: start over rather than grow for ever */
	copy = strdup(name);
	if (copy == NULL)
		return BROKER_ERR_NOMEM;
	b->known[b->nknown++] = copy;
	return BROKER_OK;
}

/* Passive declare on the check channel. *exists is false (and the rows' error set by the
 * caller from text) on 404 or another refusal. The reply's buffers are released at once:
 * nothing else ever recycles that channel's memory. */
static int check_exchange(struct broker *b, const char *name, int64_t deadline_ms, bool *exists,
                          char *text, size_t n)
{
	amqp_exchange_declare_t req;
	amqp_method_t m;
	char doing[320];
	int rc;

	if (!b->check_open) {
		rc = open_check_channel(b, deadline_ms);
		if (rc != BROKER_OK)
			return rc;
	}
	memset(&req, 0, sizeof(req));
	req.exchange = amqp_cstring_bytes(name);
	req.type = amqp_cstring_bytes("");
	req.passive = 1;
	req.arguments = amqp_empty_table;
	snprintf(doing, sizeof(doing), "could not check exchange '%s'", name);
	rc = rpc(b, CHECK_CHANNEL, AMQP_EXCHANGE_DECLARE_METHOD, &req,
	         AMQP_EXCHANGE_DECLARE_OK_METHOD, deadline_ms, "checking an exchange", &m);
	release_channel(b, CHECK_CHANNEL);
	if (rc == W_GOT) {
		*exists = true;
		return remember_exchange(b, name);
	}
	if (rc == W_CHANNEL_CLOSED) {
		b->check_open = false;
		if (b->rpc_close_code == AMQP_NOT_FOUND)
			snprintf(text, n, "exchange '%s' not found", name);
		else
			snprintf(text, n, "%s", b->rpc_close_text);
		*exists = false;
		return BROKER_OK;
	}
	return rpc_failed(b, rc, doing);
}

static int check_exchanges(struct broker *b)
{
	int64_t deadline_ms = batch_wait_end(b);
	const char *last_ok = NULL;
	char text[320];
	int rc;

	for (size_t i = 0; i < b->n; i++) {
		const char *ex = b->msgs[i].exchange;
		bool exists = false;

		if (b->res[i].outcome != BROKER_PENDING || ex == NULL || ex[0] == '\0')
			continue;
		if ((last_ok != NULL && strcmp(last_ok, ex) == 0) || exchange_known(b, ex)) {
			last_ok = ex;
			continue;
		}
		rc = check_exchange(b, ex, deadline_ms, &exists, text, sizeof(text));
		if (rc != BROKER_OK)
			return rc;
		if (exists) {
			last_ok = ex;
			continue;
		}
		/* Misses are not cached (the exchange may be declared any moment), but every row
		 * of this batch for it is answered now, with one declare. */
		for (size_t j = i; j < b->n; j++) {
			if (b->res[j].outcome == BROKER_PENDING && b->msgs[j].exchange != NULL &&
			    strcmp(b->msgs[j].exchange, ex) == 0) {
				b->res[j].outcome = BROKER_REFUSED;
				snprintf(b->res[j].error, sizeof(b->res[j].error), "%s", text);
			}
		}
	}
	return BROKER_OK;
}

/* Whether rabbitmq-c can encode row i's properties into a content header frame: after a
 * failed publish this tells the row's fault from the socket's. On false, text gets the
 * library's reason. */
static bool encodable(struct broker *b, size_t i, char *text, size_t n)
{
	size_t len = (size_t)amqp_get_frame_max(b->conn);
	amqp_bytes_t out;
	int rc;

	if (len <= MESSAGE_MAP_HEADER_FRAME_OVERHEAD)
		return true;
	len -= MESSAGE_MAP_HEADER_FRAME_OVERHEAD;
	if (b->scratch_len < len) {
		unsigned char *p = realloc(b->scratch, len);

		if (p == NULL)
			return true; /* cannot tell: blame the connection, not the row */
		b->scratch = p;
		b->scratch_len = len;
	}
	out.bytes = b->scratch;
	out.len = len;
	rc = amqp_encode_properties(AMQP_BASIC_CLASS, &b->props[i], out);
	if (rc >= 0)
		return true;
	snprintf(text, n, "%s", amqp_error_string2(rc));
	return false;
}

static int publish_row(struct broker *b, size_t i)
{
	const struct broker_message *m = &b->msgs[i];
	char text[128];
	uint64_t tag;
	int rc;

	touch_progress(b, clock_mono_ms());
	if (confirm_tracker_sent(&b->tracker, i, clock_mono_us(), &tag) != CONFIRM_TRACKER_OK) {
		set_err(b, "internal error: row %zu published twice on one channel", i);
		return lost(b);
	}
	rc = amqp_basic_publish(b->conn, PUBLISH_CHANNEL,
	                        amqp_cstring_bytes(m->exchange != NULL ? m->exchange : ""),
	                        amqp_cstring_bytes(m->routing_key != NULL ? m->routing_key : ""), 1,
	                        0, &b->props[i], b->bodies[i]);
	if (rc == AMQP_STATUS_OK)
		return BROKER_OK;
	if (!atomic_load(&b->interrupted) && !encodable(b, i, text, sizeof(text))) {
		/* The row's fault, not the connection's: it is dead, the others are not charged.
		 * The method frame already went out without its content, so the connection
		 * cannot be used any more. */
		b->res[i].outcome = BROKER_INVALID;
		snprintf(b->res[i].error, sizeof(b->res[i].error),
		         "could not encode the message: %s", text);
		set_err(b,
		        "could not publish row '%.64s' (%s); the connection is dropped and the "
		        "batch's other unanswered rows are released",
		        m->id, text);
		return lost(b);
	}
	return io_failed(b, "publishing", rc);
}

static int grow_maps(struct broker *b, size_t n)
{
	amqp_basic_properties_t *props;
	amqp_bytes_t *bodies;

	if (n <= b->map_cap)
		return BROKER_OK;
	props = realloc(b->props, n * sizeof(*props));
	if (props == NULL)
		return BROKER_ERR_NOMEM;
	b->props = props;
	bodies = realloc(b->bodies, n * sizeof(*bodies));
	if (bodies == NULL)
		return BROKER_ERR_NOMEM;
	b->bodies = bodies;
	b->map_cap = n;
	return BROKER_OK;
}

/* Copies the tracker's answers into the results. */
static void fill_results(struct broker *b)
{
	for (size_t i = 0; i < b->n; i++) {
		struct broker_result *r = &b->res[i];

		if (r->outcome != BROKER_PENDING)
			continue;
		switch (confirm_tracker_state(&b->tracker, i)) {
		case CONFIRM_TRACKER_ACKED:
			r->outcome = BROKER_ACKED;
			r->confirm_us = confirm_tracker_latency_us(&b->tracker, i);
			break;
		case CONFIRM_TRACKER_NACKED:
			r->outcome = BROKER_NACKED;
			snprintf(r->error, sizeof(r->error), "nacked by broker");
			break;
		case CONFIRM_TRACKER_RETURNED:
			r->outcome = BROKER_RETURNED; /* error written when the return arrived */
			break;
		case CONFIRM_TRACKER_UNSENT:
		case CONFIRM_TRACKER_SENT:
			break;
		}
	}
}

/* Rows that broker_confirm() publishes after the others have their answers. */
static bool deferred(const struct broker *b, size_t i)
{
	return b->msgs[i].retry || b->bodies[i].len > b->proven_body;
}

_Static_assert(sizeof(((struct broker_result *)0)->trace_id) == MESSAGE_MAP_TRACE_ID_SIZE,
               "broker_result.trace_id holds what message_map_trace_id() writes");

int broker_publish(struct broker *b, const struct broker_message *msgs, size_t n,
                   struct broker_result *res)
{
	size_t sent = 0, frame_max;
	int rc = BROKER_OK;

	for (size_t i = 0; i < n; i++)
		message_map_trace_id(msgs[i].headers_json, res[i].trace_id);
	b->active = false;
	if (!b->connected) {
		set_err(b, "not connected to broker");
		return BROKER_ERR_CONN;
	}
	recycle_amqp_pool(&b->pool);
	if (grow_maps(b, n) != BROKER_OK || confirm_tracker_reset(&b->tracker, n) != 0) {
		set_err(b, "out of memory");
		return BROKER_ERR_NOMEM;
	}
	b->msgs = msgs;
	b->res = res;
	b->n = n;
	b->active = true;
	b->return_pending = false;
	frame_max = (size_t)amqp_get_frame_max(b->conn);

	for (size_t i = 0; i < n; i++) {
		char *err = res[i].error;
		size_t errlen = sizeof(res[i].error);

		res[i].outcome = BROKER_PENDING;
		res[i].error[0] = '\0';
		res[i].confirm_us = 0;
		rc = message_map(&msgs[i], &b->pool, &b->props[i], &b->bodies[i], err, errlen);
		if (rc == MESSAGE_MAP_OK && !b->skip_frame_check)
			rc = message_map_check_frame(&b->props[i], frame_max, err, errlen);
		if (rc == MESSAGE_MAP_OK)
			rc = message_map_check_body(b->bodies[i].len, b->max_body, err, errlen);
		if (rc == MESSAGE_MAP_INVALID) {
			res[i].outcome = BROKER_INVALID;
		} else if (rc != MESSAGE_MAP_OK) {
			set_err(b, "out of memory");
			rc = BROKER_ERR_NOMEM;
			goto out;
		}
	}
	rc = check_exchanges(b);
	if (rc != BROKER_OK)
		goto out;
	for (size_t i = 0; i < n && !b->channel_closed; i++) {
		if (res[i].outcome != BROKER_PENDING || deferred(b, i))
			continue;
		rc = publish_row(b, i);
		if (rc != BROKER_OK)
			goto out;
		/* Read acks that have already arrived now and then, so that they do not pile up
		 * in the socket buffer while a large batch is written. */
		if (++sent % DRAIN_EVERY == 0) {
			rc = drain(b);
			if (rc != BROKER_OK)
				goto out;
		}
	}
out:
	if (rc != BROKER_OK) {
		/* No broker_confirm() follows: what was answered is final now. */
		fill_results(b);
		b->active = false;
	}
	return rc;
}

/* ---- waiting for confirms ---- */

void broker_set_batch_deadline(struct broker *b, int64_t deadline_ms)
{
	b->batch_deadline_ms = deadline_ms > 0 ? deadline_ms : 0;
}

/* A wait of the batch that starts now: confirm_timeout from now, and never past the batch's
 * lease (its rows may be claimed elsewhere once it runs out). */
static int64_t batch_wait_end(const struct broker *b)
{
	int64_t end = clock_mono_ms() + b->opts.confirm_timeout_ms;

	if (b->batch_deadline_ms > 0 && b->batch_deadline_ms < end)
		end = b->batch_deadline_ms;
	return end;
}

static int timed_out(struct broker *b)
{
	size_t left = confirm_tracker_outstanding(&b->tracker);

	/* connection.blocked arrives after the first publish into a blocked connection, so a
	 * wait that began before it still ran into it: name the alarm whenever it is on. */
	if (b->blocked)
		set_err(b,
		        "broker blocked the connection (resource alarm) and confirmed nothing more "
		        "for %lld ms: %zu messages without a confirm",
		        (long long)(clock_mono_ms() - b->blocked_since_ms), left);
	else if (b->batch_deadline_ms > 0 && clock_mono_ms() >= b->batch_deadline_ms)
		set_err(b, "the batch's lease ran out before the broker confirmed %zu messages",
		        left);
	else
		set_err(b, "no confirm from broker within %lld ms for %zu messages",
		        (long long)b->opts.confirm_timeout_ms, left);
	return BROKER_ERR_TIMEOUT;
}

#define ALL_ROWS SIZE_MAX

/* Reads frames until row (ALL_ROWS: every row sent so far) has its answer or the channel
 * closes, by deadline_ms, and by confirm_timeout after a connection.blocked. */
static int wait_answers(struct broker *b, size_t row, int64_t deadline_ms)
{
	for (;;) {
		bool waiting = row == ALL_ROWS ? confirm_tracker_outstanding(&b->tracker) > 0
		                               : confirm_tracker_state(&b->tracker, row) ==
		                                         CONFIRM_TRACKER_SENT;
		int64_t end = deadline_ms;
		int rc;

		if (!waiting || b->channel_closed)
			return BROKER_OK;
		if (b->blocked && b->blocked_since_ms + b->opts.confirm_timeout_ms < end)
			end = b->blocked_since_ms + b->opts.confirm_timeout_ms;
		rc = read_frame(b, end, "waiting for confirms");
		if (rc == 0 && clock_mono_ms() >= end)
			return timed_out(b);
		if (rc == BROKER_ERR_ABORTED && !atomic_load(&b->interrupted)) {
			size_t left = confirm_tracker_outstanding(&b->tracker);

			set_err(b,
			        "stopped waiting at the shutdown deadline: %zu message%s without a "
			        "confirm",
			        left, left == 1 ? "" : "s");
		}
		if (rc < 0)
			return rc;
	}
}

static bool culprit_code(int code)
{
	return code == AMQP_ACCESS_REFUSED || code == AMQP_NOT_FOUND ||
	       code == AMQP_PRECONDITION_FAILED;
}

static int channel_gone(struct broker *b)
{
	set_err(b, "broker closed the publish channel: %s", b->close_text);
	return lost(b);
}

/* Reads a decimal number at *p and moves *p past it; false when there is none or it does not
 * fit (strtoull, never sscanf: an overflowing %llu is undefined). */
static bool read_number(const char **p, unsigned long long *out)
{
	char *end;

	if (**p < '0' || **p > '9')
		return false;
	errno = 0;
	*out = strtoull(*p, &end, 10);
	if (errno != 0)
		return false;
	*p = end;
	return true;
}

/* Skips text at *p when it is there; false otherwise. */
static bool skip(const char **p, const char *text)
{
	size_t n = strlen(text);

	if (strncmp(*p, text, n) != 0)
		return false;
	*p += n;
	return true;
}

/* "PRECONDITION_FAILED - message size 5242880 is larger than configured max size 4194304"
 * (RabbitMQ 3.10; "max size" without "configured" at the hard limit). */
static bool size_limit(const char *text, unsigned long long *size, unsigned long long *limit)
{
	const char *p = strstr(text, "message size ");

	if (p == NULL)
		return false;
	p += strlen("message size ");
	if (!read_number(&p, size) || !skip(&p, " is larger than "))
		return false;
	(void)skip(&p, "configured ");
	return skip(&p, "max size ") && read_number(&p, limit);
}

/* Row i closed the channel. A body over max_message_size can never be published: dead,
 * and the limit is remembered so that later rows are checked before they are sent. Other
 * refusals (403, 404, 406 for a user_id) may be fixed by an operator: charged and retried. */
static void blame(struct broker *b, size_t i)
{
	struct broker_result *r = &b->res[i];
	unsigned long long size, limit;

	if (b->close_code == AMQP_PRECONDITION_FAILED && size_limit(b->close_text, &size, &limit)) {
		b->max_body = limit;
		r->outcome = BROKER_INVALID;
		if (message_map_check_body(b->bodies[i].len, limit, r->error, sizeof(r->error)) ==
		    MESSAGE_MAP_OK)
			snprintf(r->error, sizeof(r->error), "body: %s", b->close_text);
		return;
	}
	r->outcome = BROKER_REFUSED;
	snprintf(r->error, sizeof(r->error), "%s", b->close_text);
}

/* The row that is the only one without an answer when the channel closed: it closed it. */
static bool lone_unanswered(const struct broker *b, size_t *row)
{
	if (confirm_tracker_outstanding(&b->tracker) != 1)
		return false;
	for (size_t i = 0; i < b->n; i++) {
		if (confirm_tracker_state(&b->tracker, i) == CONFIRM_TRACKER_SENT) {
			*row = i;
			return true;
		}
	}
	return false;
}

/* The broker closed the publish channel because of one publish while several were without
 * an answer. Every row without an answer is published again, one at a time, waiting for each
 * answer, so that the close that comes again names its row; the others get their real
 * outcome. */
static int find_culprit(struct broker *b, int64_t deadline_ms)
{
	int rc;

	forget_exchanges(b); /* a 404 here means an exchange went away after our check */
	rc = open_publish_channel(b, deadline_ms);
	if (rc != BROKER_OK)
		return rc;
	for (size_t i = 0; i < b->n; i++) {
		struct broker_result *r = &b->res[i];

		if (r->outcome != BROKER_PENDING ||
		    confirm_tracker_state(&b->tracker, i) != CONFIRM_TRACKER_UNSENT)
			continue;
		if (message_map_check_body(b->bodies[i].len, b->max_body, r->error,
		                           sizeof(r->error)) != MESSAGE_MAP_OK) {
			r->outcome = BROKER_INVALID;
			continue;
		}
		rc = publish_row(b, i);
		if (rc == BROKER_OK)
			rc = wait_answers(b, i, deadline_ms);
		if (rc != BROKER_OK)
			return rc;
		if (!b->channel_closed)
			continue;
		if (!culprit_code(b->close_code))
			return channel_gone(b);
		blame(b, i);
		rc = open_publish_channel(b, deadline_ms);
		if (rc != BROKER_OK)
			return rc;
	}
	return BROKER_OK;
}

/* A body that was answered without a channel close is within max_message_size. */
static void update_proven(struct broker *b)
{
	for (size_t i = 0; i < b->n; i++) {
		enum confirm_tracker_state s = confirm_tracker_state(&b->tracker, i);

		if ((s == CONFIRM_TRACKER_ACKED || s == CONFIRM_TRACKER_NACKED ||
		     s == CONFIRM_TRACKER_RETURNED) &&
		    b->bodies[i].len > b->proven_body)
			b->proven_body = b->bodies[i].len;
	}
}

/* Publishes the unsent rows of one group (retry or not) after everything sent before has
 * its answer: in the pipeline, except a body larger than any answered so far, which goes
 * alone. Returns 1 when something was sent (wait for it, then call again), 0 when the group
 * has nothing left, or an error. */
static int publish_group(struct broker *b, bool retry)
{
	size_t sent = 0;
	int rc;

	update_proven(b);
	for (size_t i = 0; i < b->n && !b->channel_closed; i++) {
		struct broker_result *r = &b->res[i];

		if (r->outcome != BROKER_PENDING || b->msgs[i].retry != retry ||
		    confirm_tracker_state(&b->tracker, i) != CONFIRM_TRACKER_UNSENT)
			continue;
		if (message_map_check_body(b->bodies[i].len, b->max_body, r->error,
		                           sizeof(r->error)) != MESSAGE_MAP_OK) {
			r->outcome = BROKER_INVALID;
			continue;
		}
		if (b->bodies[i].len > b->proven_body) {
			if (sent > 0)
				return 1;
			rc = publish_row(b, i);
			return rc < 0 ? rc : 1;
		}
		rc = publish_row(b, i);
		if (rc == BROKER_OK && ++sent % DRAIN_EVERY == 0)
			rc = drain(b);
		if (rc != BROKER_OK)
			return rc;
	}
	return sent > 0 || b->channel_closed;
}

/* Waits for answers and publishes what is left until every row has one, the channel closes
 * with several rows in flight (then find_culprit() takes over), or an error. Rows that
 * failed before go last, once all the others have their answers. */
static int settle(struct broker *b, int64_t deadline_ms)
{
	for (;;) {
		size_t culprit;
		int rc = wait_answers(b, ALL_ROWS, deadline_ms);

		if (rc != BROKER_OK)
			return rc;
		if (b->channel_closed) {
			if (!culprit_code(b->close_code))
				return channel_gone(b);
			if (!lone_unanswered(b, &culprit)) {
				/* The search gets a fresh allowance, one round trip per row, but
				 * never beyond the batch's lease. */
				return find_culprit(b, batch_wait_end(b));
			}
			blame(b, culprit);
			forget_exchanges(b);
			rc = open_publish_channel(b, deadline_ms);
			if (rc != BROKER_OK)
				return rc;
			continue;
		}
		rc = publish_group(b, false);
		if (rc == 0)
			rc = publish_group(b, true);
		if (rc <= 0)
			return rc;
	}
}

int broker_confirm(struct broker *b, const struct broker_message *msgs, size_t n,
                   struct broker_result *res)
{
	int64_t deadline_ms = batch_wait_end(b);
	int rc = BROKER_OK;

	if (!b->active || b->msgs != msgs || b->res != res || b->n != n) {
		set_err(b, "broker_confirm() without a matching broker_publish()");
		rc = BROKER_ERR_CONN;
		goto out;
	}
	if (!b->connected) {
		set_err(b, "not connected to broker");
		rc = BROKER_ERR_CONN;
		goto out;
	}
	rc = settle(b, deadline_ms);
out:
	if (b->active) {
		fill_results(b);
		b->active = false;
	}
	if (rc == BROKER_OK) {
		for (size_t i = 0; i < n; i++) {
			if (res[i].outcome == BROKER_PENDING) {
				set_err(b, "row %zu has no answer from the broker", i);
				rc = BROKER_ERR_CONN;
				break;
			}
		}
	}
	return rc;
}
