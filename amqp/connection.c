/* Connecting: pick a node of the cluster, open TCP or TLS within the node's time, log in (SASL
 * PLAIN, advertising connection.blocked) and open the channels; a polite disconnect,
 * broker_interrupt() from another thread, and servicing the connection while idle. */
#include "amqp/broker.h"

#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
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

#include "amqp/broker_private.h"
#include "base/clock.h"

#define FRAME_MAX 131072
/* Each node attempt (connect, TLS, login, channels) is bounded by min(confirm_timeout, this),
 * so that one dead node of a cluster cannot hold up the others for long. */
#define CONNECT_TIMEOUT_MAX_MS 10000
/* A polite connection.close waits this long for close-ok: a healthy broker answers in
 * milliseconds, and a stalled one must not delay a reconnect. */
#define CLOSE_WAIT_MS 1000

/* broker_connect() stops its round on this one: unreadable TLS files fail every node alike. */
#define ERR_SETUP (-100)

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

/* ---- nodes ---- */

/* Parses amqp.url once (url.c); a bad one fails every later call the same way. Errors never
 * quote a URL: it holds a password. */
static int parse_nodes(struct broker *b)
{
	char why[sizeof(b->parse_err) - 32];
	int rc;

	if (b->parsed) {
		if (b->parse_err[0] == '\0')
			return BROKER_OK;
		broker_set_err(b, "%s", b->parse_err);
		return BROKER_ERR_CONFIG;
	}
	rc = broker_url_parse(b->opts.url, &b->nodes, &b->nnodes, why, sizeof(why));
	if (rc == BROKER_ERR_NOMEM) {
		broker_set_err(b, "out of memory");
		return rc;
	}
	b->parsed = true;
	if (rc == BROKER_OK)
		return BROKER_OK;
	snprintf(b->parse_err, sizeof(b->parse_err), "invalid amqp.url: %s", why);
	broker_set_err(b, "%s", b->parse_err);
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

/* Connects a non-blocking TCP socket to the node, waiting in broker_wait_fd() so that the shutdown
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
		broker_set_err(b, "could not connect to %s: %s", nd->name, reason);
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
			rc = broker_wait_fd(b, fd, POLLOUT, deadline_ms, what);
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
	broker_set_err(b, "could not connect to %s: %s", nd->name, reason);
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
	int64_t end = deadline_ms, stop = broker_abort_at(b), now = clock_mono_ms();
	struct timeval tv;
	char reason[128];
	int rc, e;

	if (sock == NULL) {
		broker_set_err(b, "could not create TLS socket");
		return BROKER_ERR_NOMEM;
	}
	if (b->opts.tls_ca_file != NULL && b->opts.tls_ca_file[0] != '\0' &&
	    amqp_ssl_socket_set_cacert(sock, b->opts.tls_ca_file) != AMQP_STATUS_OK) {
		broker_set_err(b, "could not read amqp.tls.ca_file '%s'", b->opts.tls_ca_file);
		return ERR_SETUP;
	}
	if (b->opts.tls_cert_file != NULL && b->opts.tls_cert_file[0] != '\0' &&
	    amqp_ssl_socket_set_key(sock, b->opts.tls_cert_file,
	                            b->opts.tls_key_file != NULL ? b->opts.tls_key_file : "") !=
	            AMQP_STATUS_OK) {
		broker_set_err(b, "could not read amqp.tls.cert_file '%s' or key_file '%s'",
		               b->opts.tls_cert_file,
		               b->opts.tls_key_file ? b->opts.tls_key_file : "");
		return ERR_SETUP;
	}
	amqp_ssl_socket_set_verify_peer(sock, b->opts.tls_verify_peer);
	amqp_ssl_socket_set_verify_hostname(sock, b->opts.tls_verify_peer);
	if (stop != 0 && stop < end)
		end = stop;
	if (atomic_load(&b->interrupted))
		return broker_interrupted_err(b, "connecting");
	if (stop != 0 && now >= stop) {
		broker_set_err(b, "stopped waiting at the shutdown deadline: connecting to %s",
		               nd->name);
		(void)broker_lost(b);
		return BROKER_ERR_ABORTED;
	}
	broker_touch_progress(b, now);
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
	broker_set_err(b, "could not connect to %s: %s", nd->name, reason);
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
	return stop ? broker_interrupted_err(b, "connecting") : BROKER_OK;
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
		broker_set_err(
		        b, "could not log in to %s as user '%s': no answer to %s within %lld ms",
		        nd->name, nd->ci.user, step, (long long)connect_timeout_ms(b));
		(void)broker_lost(b);
		return BROKER_ERR_CONN;
	case W_CONNECTION_CLOSED:
		broker_set_err(b, "could not log in to %s as user '%s': %s", nd->name, nd->ci.user,
		               b->rpc_close_text);
		return BROKER_ERR_CONN;
	case W_GOT:
	case W_CHANNEL_CLOSED:
		broker_set_err(b, "could not log in to %s: unexpected answer to %s", nd->name,
		               step);
		return broker_lost(b);
	default:
		return rc; /* an error, its message set */
	}
}

/* Start: the broker must speak 0-9-1 and offer PLAIN, the only login we send. */
static int login_start(struct broker *b, const struct node *nd, int64_t deadline_ms,
                       const char *what)
{
	amqp_method_t m;
	int rc;

	rc = broker_wait_method(b, 0, AMQP_CONNECTION_START_METHOD, deadline_ms, what, &m);
	if (rc != W_GOT)
		return login_failed(b, nd, rc, "the protocol header");
	{
		const amqp_connection_start_t *s = m.decoded;

		if (s->version_major != AMQP_PROTOCOL_VERSION_MAJOR ||
		    s->version_minor != AMQP_PROTOCOL_VERSION_MINOR) {
			broker_set_err(
			        b, "could not log in to %s: broker speaks AMQP %d-%d, not 0-9-1",
			        nd->name, s->version_major, s->version_minor);
			return broker_lost(b);
		}
		if (!offers_plain(s->mechanisms)) {
			broker_set_err(b,
			               "could not log in to %s: broker does not offer PLAIN login",
			               nd->name);
			return broker_lost(b);
		}
	}
	broker_release_channel(b, 0);
	return BROKER_OK;
}

/* Start-ok: the capabilities and connection name the broker shows, and the SASL PLAIN
 * response, wiped once sent so that the password does not linger on the heap. */
static int login_start_ok(struct broker *b, const struct node *nd, const char *what)
{
	const char *const cap_names[4] = { "connection.blocked", "publisher_confirms", "basic.nack",
		                           "authentication_failure_close" };
	amqp_table_entry_t caps[4], props[3];
	amqp_connection_start_ok_t start_ok;
	size_t ulen = strlen(nd->ci.user), plen = strlen(nd->ci.password);
	char *sasl;
	int rc;

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
		broker_set_err(b, "out of memory");
		(void)broker_lost(b);
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
		return broker_io_failed(b, what, rc);
	return BROKER_OK;
}

/* Tune / tune-ok: a refusal of the credentials arrives here, as the broker's answer to
 * start-ok (BROKER_ERR_CONFIG: when every node refuses, retrying cannot help); otherwise
 * settles the limits both sides can live with. heartbeat is ours, in seconds. */
static int login_tune(struct broker *b, const struct node *nd, int64_t deadline_ms,
                      const char *what, uint16_t heartbeat)
{
	amqp_connection_tune_ok_t tune_ok;
	amqp_method_t m;
	uint16_t channel_max = 0;
	uint32_t frame_max = FRAME_MAX;
	int rc;

	rc = broker_wait_method(b, 0, AMQP_CONNECTION_TUNE_METHOD, deadline_ms, what, &m);
	if (rc == W_CONNECTION_CLOSED && b->rpc_close_code == AMQP_ACCESS_REFUSED) {
		broker_set_err(b, "login refused for user '%s' at %s (%s)", nd->ci.user, nd->name,
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
	broker_release_channel(b, 0);
	if (channel_max == 0)
		channel_max = UINT16_MAX;
	rc = amqp_tune_connection(b->conn, channel_max, (int)frame_max, heartbeat);
	if (rc != AMQP_STATUS_OK) {
		broker_set_err(b, "could not log in to %s: %s", nd->name, amqp_error_string2(rc));
		return broker_lost(b);
	}
	tune_ok.channel_max = channel_max;
	tune_ok.frame_max = frame_max;
	tune_ok.heartbeat = heartbeat;
	rc = amqp_send_method(b->conn, 0, AMQP_CONNECTION_TUNE_OK_METHOD, &tune_ok);
	if (rc != AMQP_STATUS_OK)
		return broker_io_failed(b, what, rc);
	return BROKER_OK;
}

/* Open: a broker that closes the connection here will not let the user into the vhost,
 * which is a configuration error like a refused login. */
static int login_open(struct broker *b, const struct node *nd, int64_t deadline_ms,
                      const char *what)
{
	amqp_connection_open_t open;
	amqp_method_t m;
	int rc;

	open.virtual_host = amqp_cstring_bytes(nd->ci.vhost);
	open.capabilities = amqp_empty_bytes;
	open.insist = 1;
	rc = broker_rpc(b, 0, AMQP_CONNECTION_OPEN_METHOD, &open, AMQP_CONNECTION_OPEN_OK_METHOD,
	                deadline_ms, what, &m);
	if (rc == W_CONNECTION_CLOSED) {
		broker_set_err(b, "could not open vhost '%s' as user '%s' at %s (%s)", nd->ci.vhost,
		               nd->ci.user, nd->name, b->rpc_close_text);
		return BROKER_ERR_CONFIG;
	}
	if (rc != W_GOT)
		return login_failed(b, nd, rc, "connection.open");
	broker_release_channel(b, 0);
	return BROKER_OK;
}

/* The AMQP handshake (what amqp_login_with_properties() does), with every wait in
 * next_frame(): protocol header, start / start-ok (SASL PLAIN), tune / tune-ok, open. */
static int login(struct broker *b, const struct node *nd, int64_t deadline_ms)
{
	char what[NODE_NAME_MAX + 24];
	uint16_t heartbeat = 0;
	int rc;

	snprintf(what, sizeof(what), "logging in to %s", nd->name);
	if (b->opts.heartbeat_ms > 0) {
		int64_t s = (b->opts.heartbeat_ms + 999) / 1000; /* rounded up: never more often */

		heartbeat = s > 65535 ? 65535 : (uint16_t)s;
	}
	rc = amqp_send_header(b->conn);
	if (rc != AMQP_STATUS_OK)
		return broker_io_failed(b, what, rc);
	/* Each step returns BROKER_OK or a negative error, its message set: the first error ends the
	 * handshake. */
	rc = login_start(b, nd, deadline_ms, what);
	if (rc == BROKER_OK)
		rc = login_start_ok(b, nd, what);
	if (rc == BROKER_OK)
		rc = login_tune(b, nd, deadline_ms, what, heartbeat);
	if (rc == BROKER_OK)
		rc = login_open(b, nd, deadline_ms, what);
	return rc;
}

/* One attempt at one node, within deadline_ms. */
static int connect_node(struct broker *b, size_t idx, int64_t deadline_ms)
{
	const struct node *nd = &b->nodes[idx];
	int rc;

	b->conn = amqp_new_connection();
	if (b->conn == NULL) {
		broker_set_err(b, "out of memory");
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
				broker_set_err(b, "out of memory");
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
		rc = broker_open_publish_channel(b, deadline_ms);
	}
	if (rc == BROKER_OK)
		rc = broker_open_check_channel(b, deadline_ms);
	if (rc == BROKER_OK) {
		b->connected = true;
		b->blocked = false;
		b->cur_node = idx;
	}
	if (rc != BROKER_OK && b->conn != NULL)
		(void)broker_lost(b);
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
	broker_forget_exchanges(b); /* exchanges may have been deleted while we were away */
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
	if (broker_abort_at(b) != 0) {
		broker_set_err(b, "not connecting: the relay is stopping");
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
		broker_set_err(b, "%s (all %zu nodes failed)", last, b->nnodes);
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
	(void)broker_wait_method(b, 0, AMQP_CONNECTION_CLOSE_OK_METHOD,
	                         clock_mono_ms() + CLOSE_WAIT_MS, "closing the connection", &m);
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
	(void)broker_lost(b);
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
		broker_set_err(b, "not connected to broker");
		return BROKER_ERR_CONN;
	}
	/* Also sends a heartbeat when one is due: rabbitmq-c only does that inside its calls. */
	return broker_drain(b);
}
