/* One RabbitMQ connection for the relay (rabbitmq-c 0.11): connect and log in, publish a
 * batch with `mandatory` on a confirm-mode channel, then read the broker's answers ourselves
 * (0.11 has no confirm-wait helper) and find the one row behind a channel close. */
#include "amqp/broker.h"

#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <netinet/tcp.h>
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

#include "amqp/confirm_tracker.h"
#include "amqp/message_map.h"
#include "base/clock.h"

#define PUBLISH_CHANNEL     1
#define CHECK_CHANNEL       2 /* passive declares: a 404 there must not close the publish channel */
#define FRAME_MAX           131072
#define POOL_PAGE           (256 * 1024) /* bodies below this stay in recycled pages, no malloc */
#define DRAIN_EVERY         128          /* publishes between non-blocking reads of arrived acks */
#define KNOWN_EXCHANGES_MAX 1024

struct broker {
	struct broker_options opts; /* strings borrowed */
	char errmsg[512];

	amqp_connection_state_t conn;
	char *url_buf; /* amqp_parse_url() points into it */
	struct amqp_connection_info ci;
	bool connected;
	bool blocked;
	int64_t blocked_since_ms;

	/* The batch in flight: set by broker_publish(), answered by broker_confirm(). */
	const struct broker_message *msgs;
	struct broker_result *res;
	size_t n;
	bool active;
	bool channel_closed; /* channel.close on the publish channel, answered */
	int close_code;
	char close_text[256];

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

struct broker *broker_new(const struct broker_options *opts)
{
	struct broker *b = calloc(1, sizeof(*b));

	if (b == NULL)
		return NULL;
	b->opts = *opts;
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
	confirm_tracker_free(&b->tracker);
	free(b->url_buf);
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

static struct timeval ms_timeval(int64_t ms)
{
	struct timeval tv;

	if (ms < 0)
		ms = 0;
	tv.tv_sec = (time_t)(ms / 1000);
	tv.tv_usec = (suseconds_t)(ms % 1000 * 1000);
	return tv;
}

/* A server reply as one line: the broker's own text ("ACCESS_REFUSED - ...") or the
 * library's error. */
static void reply_text(amqp_rpc_reply_t r, char *out, size_t n)
{
	switch (r.reply_type) {
	case AMQP_RESPONSE_NORMAL:
		snprintf(out, n, "ok");
		break;
	case AMQP_RESPONSE_NONE:
		snprintf(out, n, "missing reply");
		break;
	case AMQP_RESPONSE_LIBRARY_EXCEPTION:
		snprintf(out, n, "%s", amqp_error_string2(r.library_error));
		break;
	case AMQP_RESPONSE_SERVER_EXCEPTION:
		if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
			const amqp_connection_close_t *c = r.reply.decoded;

			snprintf(out, n, "%.*s", (int)c->reply_text.len,
			         (const char *)c->reply_text.bytes);
		} else if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
			const amqp_channel_close_t *c = r.reply.decoded;

			snprintf(out, n, "%.*s", (int)c->reply_text.len,
			         (const char *)c->reply_text.bytes);
		} else {
			snprintf(out, n, "unexpected method 0x%08x", (unsigned)r.reply.id);
		}
		break;
	}
}

/* The connection is unusable: drop it without a polite close (the socket may be dead). */
static int lost(struct broker *b)
{
	if (b->conn != NULL) {
		amqp_destroy_connection(b->conn);
		b->conn = NULL;
	}
	b->connected = false;
	b->blocked = false;
	return BROKER_ERR_CONN;
}

static int lost_status(struct broker *b, const char *what, int status)
{
	set_err(b, "%s: %s", what, amqp_error_string2(status));
	return lost(b);
}

void broker_disconnect(struct broker *b)
{
	if (b->conn == NULL)
		return;
	if (b->connected) {
		/* Polite close so the broker logs a clean disconnect; bounded by the rpc
		 * timeout. */
		(void)amqp_connection_close(b->conn, AMQP_REPLY_SUCCESS);
	}
	(void)lost(b);
	b->active = false;
}

/* Checks an RPC reply during connect; a server close there is either a refused login or a
 * missing vhost, which no retry fixes. */
static int check_rpc(struct broker *b, amqp_rpc_reply_t r, const char *what)
{
	char text[256];

	if (r.reply_type == AMQP_RESPONSE_NORMAL)
		return BROKER_OK;
	reply_text(r, text, sizeof(text));
	set_err(b, "%s: %s", what, text);
	if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
	    r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
		amqp_connection_close_ok_t ok = { 0 };

		(void)amqp_send_method(b->conn, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
	}
	(void)lost(b);
	return BROKER_ERR_CONN;
}

static int open_publish_channel(struct broker *b)
{
	amqp_channel_open(b->conn, PUBLISH_CHANNEL);
	if (check_rpc(b, amqp_get_rpc_reply(b->conn), "could not open channel") != BROKER_OK)
		return BROKER_ERR_CONN;
	amqp_confirm_select(b->conn, PUBLISH_CHANNEL);
	if (check_rpc(b, amqp_get_rpc_reply(b->conn), "could not select confirm mode") != BROKER_OK)
		return BROKER_ERR_CONN;
	b->channel_closed = false;
	confirm_tracker_channel_reset(&b->tracker);
	return BROKER_OK;
}

static int parse_url(struct broker *b)
{
	int rc;

	free(b->url_buf);
	b->url_buf = strdup(b->opts.url != NULL ? b->opts.url : "");
	if (b->url_buf == NULL) {
		set_err(b, "out of memory");
		return BROKER_ERR_NOMEM;
	}
	amqp_default_connection_info(&b->ci);
	rc = amqp_parse_url(b->url_buf, &b->ci);
	if (rc != AMQP_STATUS_OK) {
		set_err(b, "invalid amqp.url: %s", amqp_error_string2(rc));
		return BROKER_ERR_CONFIG;
	}
	/* "amqp://host" and "amqp://host/" both mean the default vhost here, as operators
	 * expect; an explicitly empty vhost is not useful with RabbitMQ. */
	if (b->ci.vhost == NULL || b->ci.vhost[0] == '\0')
		b->ci.vhost = "/";
	return BROKER_OK;
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

static int open_socket(struct broker *b)
{
	amqp_socket_t *sock;
	struct timeval tv = ms_timeval(b->opts.confirm_timeout_ms);
	int rc;

	if (b->ci.ssl) {
		sock = amqp_ssl_socket_new(b->conn);
		if (sock == NULL) {
			set_err(b, "could not create TLS socket");
			return BROKER_ERR_NOMEM;
		}
		if (b->opts.tls_ca_file != NULL && b->opts.tls_ca_file[0] != '\0' &&
		    amqp_ssl_socket_set_cacert(sock, b->opts.tls_ca_file) != AMQP_STATUS_OK) {
			set_err(b, "could not read amqp.tls.ca_file '%s'", b->opts.tls_ca_file);
			return BROKER_ERR_CONFIG;
		}
		if (b->opts.tls_cert_file != NULL && b->opts.tls_cert_file[0] != '\0' &&
		    amqp_ssl_socket_set_key(sock, b->opts.tls_cert_file,
		                            b->opts.tls_key_file != NULL ? b->opts.tls_key_file
		                                                         : "") != AMQP_STATUS_OK) {
			set_err(b, "could not read amqp.tls.cert_file '%s' or key_file '%s'",
			        b->opts.tls_cert_file,
			        b->opts.tls_key_file ? b->opts.tls_key_file : "");
			return BROKER_ERR_CONFIG;
		}
		amqp_ssl_socket_set_verify_peer(sock, b->opts.tls_verify_peer);
		amqp_ssl_socket_set_verify_hostname(sock, b->opts.tls_verify_peer);
	} else {
		sock = amqp_tcp_socket_new(b->conn);
		if (sock == NULL) {
			set_err(b, "out of memory");
			return BROKER_ERR_NOMEM;
		}
	}
	errno = 0;
	rc = amqp_socket_open_noblock(sock, b->ci.host, b->ci.port, &tv);
	if (rc != AMQP_STATUS_OK) {
		int e = errno;
		char reason[128];

		if (rc == AMQP_STATUS_SOCKET_ERROR && (e == 0 || e == EINPROGRESS))
			e = connect_errno(b->ci.host, b->ci.port, b->opts.confirm_timeout_ms);

		if (rc == AMQP_STATUS_SOCKET_ERROR && e != 0) {
			/* strerror() is capitalised ("Connection refused"); our lines are not */
			snprintf(reason, sizeof(reason), "%s", strerror(e));
			if (reason[0] >= 'A' && reason[0] <= 'Z')
				reason[0] = (char)(reason[0] - 'A' + 'a');
		} else if (rc == AMQP_STATUS_TIMEOUT) {
			snprintf(reason, sizeof(reason), "timed out after %lld ms",
			         (long long)b->opts.confirm_timeout_ms);
		} else {
			snprintf(reason, sizeof(reason), "%s", amqp_error_string2(rc));
		}
		set_err(b, "could not connect to %s:%d: %s", b->ci.host, b->ci.port, reason);
		return BROKER_ERR_CONN;
	}
	return BROKER_OK;
}

/* Bounds writes once connected: rabbitmq-c keeps the socket non-blocking and waits for
 * writability without a deadline inside basic.publish, so SO_SNDTIMEO alone does not stop a
 * broker that stops reading (memory alarm) from blocking us; TCP_USER_TIMEOUT makes the
 * kernel drop a connection whose sent data (or zero-window probes) stay unacknowledged. */
static void bound_writes(struct broker *b)
{
	int fd = amqp_get_sockfd(b->conn);
	struct timeval tv = ms_timeval(b->opts.confirm_timeout_ms);
	unsigned int user_timeout;

	if (fd < 0 || b->opts.confirm_timeout_ms <= 0)
		return;
	(void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	user_timeout = b->opts.confirm_timeout_ms > UINT_MAX
	                       ? UINT_MAX
	                       : (unsigned int)b->opts.confirm_timeout_ms;
	(void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof(user_timeout));
}

static int login(struct broker *b)
{
	amqp_table_entry_t caps[4];
	amqp_table_entry_t props[2];
	amqp_table_t client;
	amqp_rpc_reply_t r;
	int heartbeat_s = 0;
	char text[256];
	const char *const cap_names[4] = { "connection.blocked", "publisher_confirms", "basic.nack",
		                           "authentication_failure_close" };

	for (size_t i = 0; i < 4; i++) {
		caps[i].key = amqp_cstring_bytes(cap_names[i]);
		caps[i].value.kind = AMQP_FIELD_KIND_BOOLEAN;
		caps[i].value.value.boolean = 1;
	}
	props[0].key = amqp_cstring_bytes("capabilities");
	props[0].value.kind = AMQP_FIELD_KIND_TABLE;
	props[0].value.value.table.num_entries = 4;
	props[0].value.value.table.entries = caps;
	props[1].key = amqp_cstring_bytes("connection_name");
	props[1].value.kind = AMQP_FIELD_KIND_UTF8;
	props[1].value.value.bytes = amqp_cstring_bytes(
	        b->opts.connection_name != NULL && b->opts.connection_name[0] != '\0'
	                ? b->opts.connection_name
	                : "outbox-relay");
	client.num_entries = 2;
	client.entries = props;

	if (b->opts.heartbeat_ms > 0) {
		int64_t s = (b->opts.heartbeat_ms + 999) / 1000; /* rounded up: never more often */

		heartbeat_s = s > 65535 ? 65535 : (int)s;
	}
	r = amqp_login_with_properties(b->conn, b->ci.vhost, 0, FRAME_MAX, heartbeat_s, &client,
	                               AMQP_SASL_METHOD_PLAIN, b->ci.user, b->ci.password);
	if (r.reply_type == AMQP_RESPONSE_NORMAL)
		return BROKER_OK;
	reply_text(r, text, sizeof(text));
	if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
	    r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
		const amqp_connection_close_t *c = r.reply.decoded;
		amqp_connection_close_ok_t ok = { 0 };

		if (c->reply_code == AMQP_ACCESS_REFUSED)
			set_err(b, "login refused for user '%s' (%s)", b->ci.user, text);
		else
			set_err(b, "could not open vhost '%s' as user '%s' (%s)", b->ci.vhost,
			        b->ci.user, text);
		(void)amqp_send_method(b->conn, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
		(void)lost(b);
		return BROKER_ERR_CONFIG;
	}
	set_err(b, "could not log in to %s:%d as user '%s': %s", b->ci.host, b->ci.port, b->ci.user,
	        text);
	(void)lost(b);
	return BROKER_ERR_CONN;
}

int broker_connect(struct broker *b)
{
	struct timeval tv = ms_timeval(b->opts.confirm_timeout_ms);
	int rc;

	broker_disconnect(b);
	forget_exchanges(b); /* exchanges may have been deleted while we were away */
	b->active = false;
	rc = parse_url(b);
	if (rc != BROKER_OK)
		goto out;
	b->conn = amqp_new_connection();
	if (b->conn == NULL) {
		set_err(b, "out of memory");
		rc = BROKER_ERR_NOMEM;
		goto out;
	}
	rc = open_socket(b);
	if (rc != BROKER_OK)
		goto out;
	if (b->opts.confirm_timeout_ms > 0) {
		(void)amqp_set_handshake_timeout(b->conn, &tv);
		(void)amqp_set_rpc_timeout(b->conn, &tv);
	}
	rc = login(b);
	if (rc != BROKER_OK)
		goto out;
	bound_writes(b);
	rc = open_publish_channel(b);
	if (rc != BROKER_OK)
		goto out;
	amqp_channel_open(b->conn, CHECK_CHANNEL);
	rc = check_rpc(b, amqp_get_rpc_reply(b->conn), "could not open channel");
	if (rc != BROKER_OK)
		goto out;
	b->connected = true;
	b->blocked = false;
out:
	if (rc != BROKER_OK && b->conn != NULL)
		(void)lost(b);
	return rc;
}

/* ---- reading the broker's answers ---- */

static void copy_bytes(char *out, size_t n, amqp_bytes_t s)
{
	size_t len = s.len < n - 1 ? s.len : n - 1;

	memcpy(out, s.bytes, len);
	out[len] = '\0';
}

/* basic.return: RabbitMQ sends it before the ack of the same message, and it carries no
 * delivery tag, so the row is found by the message_id property we set. */
static int handle_return(struct broker *b, const amqp_basic_return_t *ret)
{
	char exchange[256], rkey[256], mid[256];
	amqp_message_t msg;
	amqp_rpc_reply_t r;

	copy_bytes(exchange, sizeof(exchange), ret->exchange);
	copy_bytes(rkey, sizeof(rkey), ret->routing_key);
	r = amqp_read_message(b->conn, PUBLISH_CHANNEL, &msg, 0);
	if (r.reply_type != AMQP_RESPONSE_NORMAL) {
		char text[256];

		reply_text(r, text, sizeof(text));
		set_err(b, "could not read returned message: %s", text);
		return lost(b);
	}
	mid[0] = '\0';
	if (msg.properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG)
		copy_bytes(mid, sizeof(mid), msg.properties.message_id);
	amqp_destroy_message(&msg);
	if (!b->active)
		return BROKER_OK;
	for (size_t i = 0; i < b->n; i++) {
		if (confirm_tracker_state(&b->tracker, i) != CONFIRM_TRACKER_SENT ||
		    strcmp(b->msgs[i].id, mid) != 0)
			continue;
		(void)confirm_tracker_returned(&b->tracker, i);
		snprintf(b->res[i].error, sizeof(b->res[i].error),
		         "unroutable: exchange '%.120s' routing key '%.120s' has no binding",
		         exchange, rkey);
		break;
	}
	return BROKER_OK;
}

/* Handles one frame; anything kept is copied before the channel's buffers are recycled. */
static int handle_frame(struct broker *b, const amqp_frame_t *f)
{
	int rc = BROKER_OK;

	if (f->frame_type != AMQP_FRAME_METHOD)
		goto out; /* stray content of a message we do not consume */
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
		rc = handle_return(b, f->payload.method.decoded);
		break;
	case AMQP_CHANNEL_CLOSE_METHOD: {
		const amqp_channel_close_t *c = f->payload.method.decoded;
		amqp_channel_close_ok_t ok = { 0 };

		if (f->channel == PUBLISH_CHANNEL) {
			b->channel_closed = true;
			b->close_code = c->reply_code;
			copy_bytes(b->close_text, sizeof(b->close_text), c->reply_text);
		}
		if (amqp_send_method(b->conn, f->channel, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok) < 0) {
			set_err(b, "connection lost while closing channel %u",
			        (unsigned)f->channel);
			rc = lost(b);
			goto out;
		}
		if (f->channel == CHECK_CHANNEL) {
			/* Only passive declares run there, and their closes are answered inside the
			 * RPC; reopen so the next check has a channel. */
			amqp_channel_open(b->conn, CHECK_CHANNEL);
			rc = check_rpc(b, amqp_get_rpc_reply(b->conn), "could not reopen channel");
		}
		break;
	}
	case AMQP_CONNECTION_CLOSE_METHOD: {
		const amqp_connection_close_t *c = f->payload.method.decoded;
		amqp_connection_close_ok_t ok = { 0 };

		set_err(b, "connection closed by broker: %.*s", (int)c->reply_text.len,
		        (const char *)c->reply_text.bytes);
		(void)amqp_send_method(b->conn, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
		rc = lost(b);
		goto out;
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
	if (b->conn != NULL)
		amqp_maybe_release_buffers_on_channel(b->conn, f->channel);
	return rc;
}

/* Reads and handles one frame, waiting at most timeout_ms (0 = only what has arrived).
 * Returns 1 when a frame was handled, 0 on timeout, or an error. */
static int read_frame(struct broker *b, int64_t timeout_ms)
{
	struct timeval tv = ms_timeval(timeout_ms);
	amqp_frame_t f;
	int rc;

	if (b->conn == NULL)
		return BROKER_ERR_CONN;
	rc = amqp_simple_wait_frame_noblock(b->conn, &f, &tv);
	if (rc == AMQP_STATUS_TIMEOUT)
		return 0;
	if (rc != AMQP_STATUS_OK)
		return lost_status(b, "connection to broker lost", rc);
	rc = handle_frame(b, &f);
	return rc == BROKER_OK ? 1 : rc;
}

/* Handles everything already received without waiting for more. */
static int drain(struct broker *b)
{
	int rc;

	do {
		rc = read_frame(b, 0);
	} while (rc == 1 && !b->channel_closed);
	return rc < 0 ? rc : BROKER_OK;
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
 * caller) on 404; other refusals are reported through text. */
static int check_exchange(struct broker *b, const char *name, bool *exists, char *text, size_t n)
{
	amqp_rpc_reply_t r;

	amqp_exchange_declare(b->conn, CHECK_CHANNEL, amqp_cstring_bytes(name),
	                      amqp_cstring_bytes(""), 1, 0, 0, 0, amqp_empty_table);
	r = amqp_get_rpc_reply(b->conn);
	if (r.reply_type == AMQP_RESPONSE_NORMAL) {
		*exists = true;
		return remember_exchange(b, name);
	}
	if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
	    r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
		const amqp_channel_close_t *c = r.reply.decoded;
		amqp_channel_close_ok_t ok = { 0 };

		if (c->reply_code == AMQP_NOT_FOUND)
			snprintf(text, n, "exchange '%s' not found", name);
		else
			snprintf(text, n, "%.*s", (int)c->reply_text.len,
			         (const char *)c->reply_text.bytes);
		if (amqp_send_method(b->conn, CHECK_CHANNEL, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok) <
		    0) {
			set_err(b, "connection lost while checking exchange '%s'", name);
			return lost(b);
		}
		amqp_channel_open(b->conn, CHECK_CHANNEL);
		if (check_rpc(b, amqp_get_rpc_reply(b->conn), "could not reopen channel") !=
		    BROKER_OK)
			return BROKER_ERR_CONN;
		*exists = false;
		return BROKER_OK;
	}
	reply_text(r, text, n);
	set_err(b, "could not check exchange '%s': %s", name, text);
	if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION) {
		amqp_connection_close_ok_t ok = { 0 };

		(void)amqp_send_method(b->conn, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
	}
	return lost(b);
}

static int check_exchanges(struct broker *b)
{
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
		rc = check_exchange(b, ex, &exists, text, sizeof(text));
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

static int publish_row(struct broker *b, size_t i)
{
	const struct broker_message *m = &b->msgs[i];
	uint64_t tag;
	int rc;

	if (confirm_tracker_sent(&b->tracker, i, clock_mono_us(), &tag) != CONFIRM_TRACKER_OK) {
		set_err(b, "internal error: row %zu published twice on one channel", i);
		return lost(b);
	}
	rc = amqp_basic_publish(b->conn, PUBLISH_CHANNEL,
	                        amqp_cstring_bytes(m->exchange != NULL ? m->exchange : ""),
	                        amqp_cstring_bytes(m->routing_key != NULL ? m->routing_key : ""), 1,
	                        0, &b->props[i], b->bodies[i]);
	if (rc != AMQP_STATUS_OK)
		return lost_status(b, "could not publish", rc);
	return BROKER_OK;
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

int broker_publish(struct broker *b, const struct broker_message *msgs, size_t n,
                   struct broker_result *res)
{
	size_t sent = 0;
	int rc;

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

	for (size_t i = 0; i < n; i++) {
		res[i].outcome = BROKER_PENDING;
		res[i].error[0] = '\0';
		res[i].confirm_us = 0;
		rc = message_map(&msgs[i], &b->pool, &b->props[i], &b->bodies[i], res[i].error,
		                 sizeof(res[i].error));
		if (rc == MESSAGE_MAP_INVALID) {
			res[i].outcome = BROKER_INVALID;
		} else if (rc != MESSAGE_MAP_OK) {
			set_err(b, "out of memory");
			return BROKER_ERR_NOMEM;
		}
	}
	rc = check_exchanges(b);
	if (rc != BROKER_OK)
		return rc;
	for (size_t i = 0; i < n && !b->channel_closed; i++) {
		if (res[i].outcome != BROKER_PENDING || msgs[i].retry)
			continue;
		rc = publish_row(b, i);
		if (rc != BROKER_OK)
			return rc;
		/* Read acks that have already arrived now and then, so that they do not pile up
		 * in the socket buffer while a large batch is written. */
		if (++sent % DRAIN_EVERY == 0) {
			rc = drain(b);
			if (rc != BROKER_OK)
				return rc;
		}
	}
	return BROKER_OK;
}

/* ---- waiting for confirms ---- */

/* Milliseconds left before the confirm deadline or the shutdown deadline, whichever comes
 * first; <= 0 when one has passed. */
static int64_t time_left(const struct broker *b, int64_t deadline_ms)
{
	int64_t now = clock_mono_ms();
	int64_t left = deadline_ms - now;

	if (b->opts.abort_at_ms != NULL) {
		long long abort_at = atomic_load(b->opts.abort_at_ms);

		if (abort_at != 0 && abort_at - now < left)
			left = abort_at - now;
	}
	if (b->blocked && b->blocked_since_ms + b->opts.confirm_timeout_ms - now < left)
		left = b->blocked_since_ms + b->opts.confirm_timeout_ms - now;
	return left;
}

static int timed_out(struct broker *b)
{
	if (b->blocked && clock_mono_ms() - b->blocked_since_ms >= b->opts.confirm_timeout_ms)
		set_err(b, "broker blocked the connection for more than %lld ms (resource alarm)",
		        (long long)b->opts.confirm_timeout_ms);
	else
		set_err(b, "no confirm from broker within %lld ms for %zu messages",
		        (long long)b->opts.confirm_timeout_ms,
		        confirm_tracker_outstanding(&b->tracker));
	return BROKER_ERR_TIMEOUT;
}

#define ALL_ROWS SIZE_MAX

/* Reads frames until row (ALL_ROWS: every row sent so far) has its answer or the channel
 * closes. */
static int wait_answers(struct broker *b, size_t row, int64_t deadline_ms)
{
	for (;;) {
		bool waiting = row == ALL_ROWS ? confirm_tracker_outstanding(&b->tracker) > 0
		                               : confirm_tracker_state(&b->tracker, row) ==
		                                         CONFIRM_TRACKER_SENT;
		int64_t left;
		int rc;

		if (!waiting || b->channel_closed)
			return BROKER_OK;
		left = time_left(b, deadline_ms);
		if (left <= 0)
			return timed_out(b);
		rc = read_frame(b, left);
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

/* The broker closed the publish channel because of one publish. Every row without an answer
 * is published again, one at a time, waiting for each answer, so that the close that comes
 * again names its row; the others get their real outcome. */
static int find_culprit(struct broker *b, int64_t deadline_ms)
{
	int rc;

	if (!culprit_code(b->close_code))
		return channel_gone(b);
	forget_exchanges(b); /* a 404 here means an exchange went away after our check */
	rc = open_publish_channel(b);
	if (rc != BROKER_OK)
		return rc;
	for (size_t i = 0; i < b->n; i++) {
		if (b->res[i].outcome != BROKER_PENDING ||
		    confirm_tracker_state(&b->tracker, i) != CONFIRM_TRACKER_UNSENT)
			continue;
		rc = publish_row(b, i);
		if (rc == BROKER_OK)
			rc = wait_answers(b, i, deadline_ms);
		if (rc != BROKER_OK)
			return rc;
		if (!b->channel_closed)
			continue;
		if (!culprit_code(b->close_code))
			return channel_gone(b);
		b->res[i].outcome = BROKER_REFUSED;
		snprintf(b->res[i].error, sizeof(b->res[i].error), "%s", b->close_text);
		rc = open_publish_channel(b);
		if (rc != BROKER_OK)
			return rc;
	}
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

/* Publishes the retry rows that broker_publish() held back; returns how many were sent, or
 * an error. Stops early when the channel closes (find_culprit() takes the rest). */
static int publish_retries(struct broker *b)
{
	int sent = 0;

	for (size_t i = 0; i < b->n && !b->channel_closed; i++) {
		int rc;

		if (b->res[i].outcome != BROKER_PENDING || !b->msgs[i].retry ||
		    confirm_tracker_state(&b->tracker, i) != CONFIRM_TRACKER_UNSENT)
			continue;
		rc = publish_row(b, i);
		if (rc == BROKER_OK && ++sent % DRAIN_EVERY == 0)
			rc = drain(b);
		if (rc != BROKER_OK)
			return rc;
	}
	return sent;
}

int broker_confirm(struct broker *b, const struct broker_message *msgs, size_t n,
                   struct broker_result *res)
{
	int64_t deadline_ms = clock_mono_ms() + b->opts.confirm_timeout_ms;
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
	rc = wait_answers(b, ALL_ROWS, deadline_ms);
	if (rc == BROKER_OK && !b->channel_closed) {
		int sent = publish_retries(b);

		if (sent < 0)
			rc = sent;
		else if (sent > 0) /* within the same deadline: one confirm_timeout a batch */
			rc = wait_answers(b, ALL_ROWS, deadline_ms);
	}
	if (rc != BROKER_OK)
		goto out;
	if (b->channel_closed) {
		/* The search gets a fresh allowance: it is one round trip per row. */
		rc = find_culprit(b, clock_mono_ms() + b->opts.confirm_timeout_ms);
		if (rc != BROKER_OK)
			goto out;
	}
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
