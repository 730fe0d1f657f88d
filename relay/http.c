/* /healthz, /readyz and /metrics served by libmicrohttpd from a thread of this module, which
 * holds every connection to an absolute deadline and to the connection limits (http.h); plus
 * the tiny blocking client that `outbox-relay healthcheck` uses so the image needs no curl. */
#include "relay/http.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/hostport.h"
#include "relay/metrics.h"

/*
 * How connections are held to their deadlines and limits.
 *
 * libmicrohttpd's own timeout (MHD_OPTION_CONNECTION_TIMEOUT) counts idle time, and every
 * byte received resets it: a client sending one byte a second keeps its connection forever.
 * Its per-IP limit refuses the newest connection, which may be the prober's (http.h). So this
 * module keeps its own table of connections, filled from MHD_OPTION_NOTIFY_CONNECTION, with
 * the deadline of each one's current phase, and enforces both: a connection past its deadline,
 * or the one chosen to make room, has its socket shut down - shutdown(), never close(): the
 * descriptor stays libmicrohttpd's, which sees the end of the stream, closes the socket and
 * forgets the connection the usual way.
 *
 * The daemon runs in external-select mode (MHD_USE_EPOLL without an internal thread), driven
 * by serve() on a thread of this module, rather than on its internal thread with a timer
 * thread beside it. Everything that reads or writes the table then runs on that one thread:
 * the notifications and the request handler (both called from inside MHD_run()) and the
 * deadline check between two MHD_run() calls. That is what makes shutdown() safe: a socket is
 * only closed inside MHD_run() (or MHD_stop_daemon()), and libmicrohttpd 0.9.75 sends
 * MHD_CONNECTION_NOTIFY_CLOSED just before that close() (MHD_cleanup_connections() and the
 * failure path of new_connection_process_() in daemon.c), where this module forgets the
 * descriptor. Between two MHD_run() calls every descriptor in the table is therefore still
 * open and still that connection's, never a number already reused by a new socket; a timer
 * thread would need one lock around its shutdown() calls and the notifications to be as sure.
 * The loop also sleeps exactly until the nearest deadline, with no periodic tick.
 *
 * Every answer carries "Connection: close", so a connection serves one request: probes and
 * scrapes come seconds apart, reusing a connection would save nothing, and a connection that
 * never waits between requests has no idle phase for a slow client to hold. (0.9.75 closes
 * after an answer queued from the first handler call anyway; the header makes it so on every
 * version, and the response deadline still bounds any connection that stayed open.)
 */

/* The kernel's queue of connections not yet accepted (capped by net.core.somaxconn). When
 * it is full, a new connection's SYN is dropped and its client retries a second later, as
 * long as kubelet's whole default probe timeout; queued, it waits a few turns of the loop
 * (10 accepts each). A burst of reconnecting clients must not fill it, so it is long. */
#define HTTP_BACKLOG     1024
#define HTTP_MAX_WORKERS METRICS_MAX_WORKERS

enum http_phase {
	HTTP_FREE = 0,  /* slot unused */
	HTTP_RECEIVING, /* accepted, request not complete: may be shut down to make room */
	HTTP_ANSWERING, /* request complete, answer being sent */
	HTTP_CLOSING,   /* shut down here; libmicrohttpd has yet to notice and close it */
};

struct http_conn {
	enum http_phase phase;
	int fd;                 /* libmicrohttpd's socket: open for as long as the slot is used */
	unsigned char addr[16]; /* client address, IPv4 as ::ffff:a.b.c.d so both listeners agree */
	uint64_t seq;           /* accept order: the lowest receiving one has waited longest */
	int64_t deadline_ms;    /* CLOCK_MONOTONIC end of the current phase */
};

struct http_server {
	struct MHD_Daemon *daemon;
	int64_t stale_after_ms;
	char version[128];
	/* The sources served (borrowed from http_start()'s caller, alive until http_stop()). */
	const struct metrics_unit *units;
	size_t n_units;
	bool named; /* the units have names: answers name each source */
	pthread_t thread;
	bool running; /* the thread was started and must be joined */
	atomic_bool stopping;
	int wake[2];        /* http_stop() writes to wake[1] to end serve()'s poll() */
	int epoll_fd;       /* libmicrohttpd's, which serve() polls */
	uint64_t next_seq;  /* accept order, for the next connection */
	uint64_t turn_seq;  /* next_seq when the current turn began: later ones are unread */
	uint64_t prev_turn; /* turn_seq of the turn before */
	/* Used by the serving thread only (and by MHD_stop_daemon() once that has ended). As
	 * large as libmicrohttpd's limit, so every connection it keeps has a slot. */
	struct http_conn conns[HTTP_CONNECTION_LIMIT];
};

/* Binds and listens on one address; -1 with errno set on failure. */
static int listen_on(const struct sockaddr *sa, socklen_t salen, bool dual_stack)
{
	int one = 1, zero = 0;
	int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -1;
	/* Lets a restarted relay listen again while old connections sit in TIME_WAIT. */
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (dual_stack)
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
	if (bind(fd, sa, salen) < 0 || listen(fd, HTTP_BACKLOG) < 0) {
		int saved = errno;
		close(fd);
		errno = saved;
		return -1;
	}
	return fd;
}

/* We open the socket ourselves instead of letting libmicrohttpd do it, so that a failure is
 * reported with its errno ("address already in use") and ":port" can mean both families. */
static int open_listener(const struct hostport *ep, const char *listen, char *err, size_t errlen)
{
	struct addrinfo hints, *res = NULL, *ai;
	char port_text[8];
	int fd = -1, rc, saved = 0;

	if (ep->host[0] == '\0') {
		struct sockaddr_in6 a6 = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_ANY_INIT };
		struct sockaddr_in a4 = { .sin_family = AF_INET, .sin_addr.s_addr = INADDR_ANY };
		uint16_t port = (uint16_t)ep->port;

		a6.sin6_port = htons(port);
		a4.sin_port = htons(port);
		fd = listen_on((struct sockaddr *)&a6, sizeof(a6), true);
		/* Containers and hosts without IPv6 still get every IPv4 address. */
		if (fd < 0 && (errno == EAFNOSUPPORT || errno == EADDRNOTAVAIL))
			fd = listen_on((struct sockaddr *)&a4, sizeof(a4), false);
		if (fd < 0)
			snprintf(err, errlen, "could not listen on %s: %s", listen,
			         strerror(errno));
		return fd;
	}

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	snprintf(port_text, sizeof(port_text), "%d", ep->port);
	rc = getaddrinfo(ep->host, port_text, &hints, &res);
	if (rc != 0) {
		snprintf(err, errlen, "could not resolve '%s': %s", ep->host, gai_strerror(rc));
		return -1;
	}
	for (ai = res; ai != NULL && fd < 0; ai = ai->ai_next) {
		fd = listen_on(ai->ai_addr, ai->ai_addrlen, false);
		if (fd < 0)
			saved = errno;
	}
	freeaddrinfo(res);
	if (fd < 0)
		snprintf(err, errlen, "could not listen on %s: %s", listen, strerror(saved));
	return fd;
}

/* ---- connection table (serving thread only) ---- */

static void addr_key(const struct sockaddr *sa, unsigned char key[16])
{
	memset(key, 0, 16);
	if (sa != NULL && sa->sa_family == AF_INET) {
		key[10] = key[11] = 0xff;
		memcpy(key + 12, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, 4);
	} else if (sa != NULL && sa->sa_family == AF_INET6) {
		memcpy(key, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, 16);
	}
}

static bool live(const struct http_conn *c)
{
	return c->phase == HTTP_RECEIVING || c->phase == HTTP_ANSWERING;
}

/* Ends a connection: libmicrohttpd reads the end of the stream on its next turn and closes
 * it. The slot stays until then, so the descriptor is not forgotten before it is closed. */
static void cut(struct http_conn *c)
{
	(void)shutdown(c->fd, SHUT_RDWR);
	c->phase = HTTP_CLOSING;
}

/* Live connections from addr, or from anywhere when addr is NULL. */
static int count_live(const struct http_server *h, const unsigned char *addr)
{
	int n = 0;

	for (size_t i = 0; i < HTTP_CONNECTION_LIMIT; i++)
		n += live(&h->conns[i]) &&
		     (addr == NULL || memcmp(h->conns[i].addr, addr, 16) == 0);
	return n;
}

/* Shuts down, of the connections from addr (from anywhere when addr is NULL), the one that
 * was accepted first among those still receiving a request that libmicrohttpd has had a turn
 * to read; false when there is none. A connection accepted in the last turn has not been read
 * at all (a turn learns which sockets are readable before it accepts), so it is spared even
 * in a flood: a prober's request, sent with its connection, is read in the next turn, and
 * from then on the prober is answering and is never chosen. */
static bool cut_oldest(struct http_server *h, const unsigned char *addr)
{
	struct http_conn *oldest = NULL;

	for (size_t i = 0; i < HTTP_CONNECTION_LIMIT; i++) {
		struct http_conn *c = &h->conns[i];

		if (c->phase != HTTP_RECEIVING || c->seq >= h->turn_seq ||
		    (addr != NULL && memcmp(c->addr, addr, 16) != 0))
			continue;
		if (oldest == NULL || c->seq < oldest->seq)
			oldest = c;
	}
	if (oldest == NULL)
		return false;
	cut(oldest);
	return true;
}

/* Brings each address, then the whole, back within its limit (http.h). When no connection can
 * be chosen, the excess waits: those spared now are chosen after the next turn, and those
 * answering end by their response deadline. */
static void make_room(struct http_server *h)
{
	for (size_t i = 0; i < HTTP_CONNECTION_LIMIT; i++) {
		/* The slot's address stays as it is while it is cut (only a notification
		 * inside MHD_run() clears it). */
		const unsigned char *addr = h->conns[i].addr;

		if (!live(&h->conns[i]))
			continue;
		while (count_live(h, addr) > HTTP_PER_ADDRESS_LIMIT && cut_oldest(h, addr))
			;
	}
	while (count_live(h, NULL) > HTTP_CONNECTION_SOFT_LIMIT && cut_oldest(h, NULL))
		;
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
	struct http_server *h = cls;
	struct http_conn *c = NULL;
	const union MHD_ConnectionInfo *fd_info, *addr_info;

	if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
		/* Sent just before libmicrohttpd closes the socket: from here on its number may
		 * be reused, so the slot must no longer hold it. */
		c = *socket_context;
		if (c != NULL)
			memset(c, 0, sizeof(*c));
		*socket_context = NULL;
		return;
	}
	if (code != MHD_CONNECTION_NOTIFY_STARTED)
		return;
	fd_info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
	addr_info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	for (size_t i = 0; i < HTTP_CONNECTION_LIMIT && c == NULL; i++)
		if (h->conns[i].phase == HTTP_FREE)
			c = &h->conns[i];
	if (fd_info == NULL)
		return; /* 0.9.75 always knows it; without it nothing could end the connection */
	if (c == NULL) {
		/* Cannot happen while the table is as large as libmicrohttpd's limit; a
		 * connection without a slot would have no deadline, so it is not served. */
		(void)shutdown(fd_info->connect_fd, SHUT_RDWR);
		return;
	}
	c->phase = HTTP_RECEIVING;
	c->fd = fd_info->connect_fd;
	addr_key(addr_info != NULL ? addr_info->client_addr : NULL, c->addr);
	c->seq = h->next_seq++;
	c->deadline_ms = clock_mono_ms() + HTTP_REQUEST_DEADLINE_MS;
	*socket_context = c;
}

/* The request is complete (the handler runs once its headers are in): from now on the
 * connection has the response deadline and is no longer shut down to make room. */
static void now_answering(struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *info =
	        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	struct http_conn *c = info != NULL ? info->socket_context : NULL;

	if (c != NULL && c->phase == HTTP_RECEIVING) {
		c->phase = HTTP_ANSWERING;
		c->deadline_ms = clock_mono_ms() + HTTP_RESPONSE_DEADLINE_MS;
	}
}

/* Shuts down every connection past the deadline of its phase. */
static void cut_late(struct http_server *h, int64_t now)
{
	for (size_t i = 0; i < HTTP_CONNECTION_LIMIT; i++)
		if (live(&h->conns[i]) && h->conns[i].deadline_ms <= now)
			cut(&h->conns[i]);
}

/* How long serve() may sleep: until the nearest deadline or libmicrohttpd's own next
 * timeout (0 while it has data in hand); -1 when neither exists. */
static int next_wait_ms(struct http_server *h, int64_t now)
{
	MHD_UNSIGNED_LONG_LONG mhd_ms;
	int64_t wait = -1;

	for (size_t i = 0; i < HTTP_CONNECTION_LIMIT; i++) {
		const struct http_conn *c = &h->conns[i];
		int64_t left = c->deadline_ms - now;

		if (!live(c))
			continue;
		if (left < 0)
			left = 0;
		if (wait < 0 || left < wait)
			wait = left;
	}
	if (MHD_get_timeout(h->daemon, &mhd_ms) == MHD_YES &&
	    (wait < 0 || mhd_ms < (MHD_UNSIGNED_LONG_LONG)wait))
		wait = mhd_ms > INT_MAX ? INT_MAX : (int64_t)mhd_ms;
	return wait > INT_MAX ? INT_MAX : (int)wait;
}

/* The serving thread: waits for libmicrohttpd's sockets, a deadline or http_stop(), lets
 * libmicrohttpd do its part, then ends what is late. */
static void *serve(void *arg)
{
	struct http_server *h = arg;

	while (!atomic_load(&h->stopping)) {
		struct pollfd p[2] = { { .fd = h->epoll_fd, .events = POLLIN },
			               { .fd = h->wake[0], .events = POLLIN } };

		/* poll() on two descriptors of ours fails only with EINTR or ENOMEM: a turn
		 * taken early is harmless, but must not become a spin. */
		if (poll(p, 2, next_wait_ms(h, clock_mono_ms())) < 0 && errno != EINTR)
			(void)poll(NULL, 0, 10);
		if (atomic_load(&h->stopping))
			break;
		h->prev_turn = h->turn_seq;
		h->turn_seq = h->next_seq;
		(void)MHD_run(h->daemon);
		/* Limits only change with an accept in this turn or the last (whose connections
		 * can now be chosen); counting at every turn would cost a flood's worth of scans. */
		if (h->next_seq != h->prev_turn)
			make_room(h);
		cut_late(h, clock_mono_ms());
	}
	return NULL;
}

static enum MHD_Result respond(struct MHD_Connection *conn, unsigned int status, const char *body,
                               const char *content_type)
{
	struct MHD_Response *r;
	enum MHD_Result ret;

	r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
	if (r == NULL)
		return MHD_NO;
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
	/* Probes must see the state now, never a cached answer. */
	MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	/* One request per connection (see the top of this file). */
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
	if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
		MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
	ret = MHD_queue_response(conn, status, r);
	MHD_destroy_response(r);
	return ret;
}

static int load_workers(const struct metrics_unit *u)
{
	int workers = atomic_load_explicit(&u->m->workers, memory_order_relaxed);

	return workers > HTTP_MAX_WORKERS ? HTTP_MAX_WORKERS : workers;
}

static bool unit_failed(const struct metrics_unit *u)
{
	return atomic_load_explicit(&u->m->source_failed, memory_order_relaxed) != 0;
}

/* The first loop of u that has not ticked within stale_after_ms, said into body (after its
 * source's name when named); false when every loop ticks. */
static bool unit_stale(const struct http_server *h, const struct metrics_unit *u, int64_t now,
                       char *body, size_t n)
{
	int workers = load_workers(u);
	const char *sep = h->named ? ": " : "";
	const char *name = h->named ? u->source : "";

	for (int i = 0; i < workers; i++) {
		int64_t tick = atomic_load_explicit(&u->m->tick_ms[i], memory_order_relaxed);

		if (tick != 0 && now - tick <= h->stale_after_ms)
			continue;
		if (tick == 0)
			snprintf(body, n, "%s%sworker %d stale: has not ticked yet\n", name, sep,
			         i);
		else
			snprintf(body, n,
			         "%s%sworker %d stale: no tick for %lld ms (limit %lld ms)\n", name,
			         sep, i, (long long)(now - tick), (long long)h->stale_after_ms);
		return true;
	}
	return false;
}

/* Liveness: every relay loop ticked within stale_after_ms. A loop stuck in a call that never
 * returns stops ticking, and an orchestrator can then restart the process. The loops of a
 * named source that failed have ended on purpose: they are not stale (/readyz tells). */
static enum MHD_Result healthz(struct MHD_Connection *conn, const struct http_server *h)
{
	char body[320];
	int64_t now = clock_mono_ms();
	int running = 0;

	for (size_t i = 0; i < h->n_units; i++)
		if (!(h->named && unit_failed(&h->units[i])))
			running += load_workers(&h->units[i]);
	if (running <= 0)
		return respond(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "no relay loop running\n",
		               "text/plain");
	for (size_t i = 0; i < h->n_units; i++) {
		if (h->named && unit_failed(&h->units[i]))
			continue;
		if (unit_stale(h, &h->units[i], now, body, sizeof(body)))
			return respond(conn, MHD_HTTP_SERVICE_UNAVAILABLE, body, "text/plain");
	}
	return respond(conn, MHD_HTTP_OK, "ok\n", "text/plain");
}

/* Adds " broker NODE" (named) or "broker NODE\n" lines for each distinct node of u. */
static size_t add_nodes(const struct http_server *h, const struct metrics_unit *u, char *body,
                        size_t start, size_t len, size_t cap)
{
	int workers = load_workers(u);

	/* Which broker node(s) the loops use: after a cluster failover the operator sees where
	 * the relay went. */
	for (int i = 0; i < workers && len < cap; i++) {
		char node[128];

		metrics_broker_node(u->m, i, node, sizeof(node));
		if (node[0] && !strstr(body + start, node))
			len += (size_t)snprintf(body + len, cap - len,
			                        h->named ? ", broker %s" : "broker %s\n", node);
	}
	return len;
}

/* One source's readiness into body at len (named: one line "orders ready"; unnamed: the
 * answer as it always was); true when ready. */
static bool unit_ready(const struct http_server *h, const struct metrics_unit *u, char *body,
                       size_t *len, size_t cap)
{
	int workers = load_workers(u);
	int db = atomic_load_explicit(&u->m->db_up, memory_order_relaxed);
	int broker = atomic_load_explicit(&u->m->broker_up, memory_order_relaxed);
	const char *name = h->named ? u->source : "";
	const char *sp = h->named ? " " : "";
	bool failed = h->named && unit_failed(u);
	bool ready = workers > 0 && db == workers && broker == workers && !failed;
	size_t start = *len;

	if (*len >= cap)
		return ready;
	if (failed)
		*len += (size_t)snprintf(body + *len, cap - *len,
		                         "%s failed: stopped on an error no retry can fix\n", name);
	else if (workers <= 0)
		*len += (size_t)snprintf(body + *len, cap - *len, "%s%s%sno relay loop running\n",
		                         name, sp, h->named ? "not ready: " : "");
	else if (ready) {
		*len += (size_t)snprintf(body + *len, cap - *len, "%s%sready%s", name, sp,
		                         h->named ? "" : "\n");
		*len = add_nodes(h, u, body, start, *len, cap);
		if (h->named && *len < cap)
			*len += (size_t)snprintf(body + *len, cap - *len, "\n");
	} else
		*len += (size_t)snprintf(body + *len, cap - *len, "%s%s%s%s%s%s\n", name,
		                         h->named ? " not ready: " : "",
		                         db != workers ? "database not connected" : "",
		                         db != workers && broker != workers ? "; " : "",
		                         broker != workers ? "broker not connected" : "", "");
	return ready;
}

/* Readiness: every worker of every source holds both connections, so rows are actually
 * moving; with named sources, one line a source. */
static enum MHD_Result readyz(struct MHD_Connection *conn, const struct http_server *h)
{
	char body[4096];
	size_t len = 0;
	bool all = h->n_units > 0;

	body[0] = '\0';
	for (size_t i = 0; i < h->n_units; i++)
		all = unit_ready(h, &h->units[i], body, &len, sizeof(body)) && all;
	if (h->n_units == 0)
		snprintf(body, sizeof(body), "no relay loop running\n");
	return respond(conn, all ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, body, "text/plain");
}

static enum MHD_Result metrics(struct MHD_Connection *conn, const struct http_server *h)
{
	struct MHD_Response *r;
	enum MHD_Result ret;
	char *text = metrics_render(h->units, h->n_units, h->version);

	if (text == NULL)
		return respond(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n",
		               "text/plain");
	/* MUST_FREE hands the malloc'd text to libmicrohttpd, which frees it after sending. */
	r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
	if (r == NULL) {
		free(text);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4");
	MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
	ret = MHD_queue_response(conn, MHD_HTTP_OK, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload_data,
                              size_t *upload_data_size, void **con_cls)
{
	const struct http_server *h = cls;

	(void)version;
	(void)upload_data;
	(void)upload_data_size;
	(void)con_cls;
	now_answering(conn);
	/* HEAD is a GET without the body (libmicrohttpd drops it), so probes using it work.
	 * Anything else is refused at once; answering before a body has been read makes
	 * libmicrohttpd discard the rest and close, so a large upload is never waited for. */
	if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
		return respond(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed\n",
		               "text/plain");
	if (strcmp(url, "/healthz") == 0)
		return healthz(conn, h);
	if (strcmp(url, "/readyz") == 0)
		return readyz(conn, h);
	if (strcmp(url, "/metrics") == 0)
		return metrics(conn, h);
	return respond(conn, MHD_HTTP_NOT_FOUND, "not found\n", "text/plain");
}

struct http_server *http_start(const char *listen, int64_t stale_after_ms, const char *version,
                               const struct metrics_unit *units, size_t n_units, char *err,
                               size_t errlen)
{
	struct hostport ep;
	struct http_server *h = NULL, *result = NULL;
	const union MHD_DaemonInfo *info;
	int fd = -1;

	if (hostport_parse(listen, &ep, err, errlen) < 0)
		goto out;
	h = calloc(1, sizeof(*h));
	if (h == NULL) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	h->wake[0] = h->wake[1] = -1;
	h->stale_after_ms = stale_after_ms;
	h->units = units;
	h->n_units = n_units;
	h->named = n_units > 0 && units[0].source && units[0].source[0];
	snprintf(h->version, sizeof(h->version), "%s", version ? version : "unknown");
	if (pipe2(h->wake, O_CLOEXEC | O_NONBLOCK) < 0) {
		snprintf(err, errlen, "could not create a pipe: %s", strerror(errno));
		goto out;
	}
	fd = open_listener(&ep, listen, err, errlen);
	if (fd < 0)
		goto out;
	h->daemon = MHD_start_daemon(
	        MHD_USE_EPOLL, 0, NULL, NULL, handle, h, MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
	        MHD_OPTION_CONNECTION_LIMIT, (unsigned int)HTTP_CONNECTION_LIMIT,
	        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)HTTP_CONNECTION_MEMORY,
	        MHD_OPTION_NOTIFY_CONNECTION, on_connection, h, MHD_OPTION_END);
	/* The daemon owns the socket from here, even when it failed to start: 0.9.75 closes it
	 * on most of its failure paths but not all, and a second close() could hit a descriptor
	 * another thread has just opened. At worst a failed start-up, which ends the process,
	 * leaves one descriptor open. */
	fd = -1;
	if (h->daemon == NULL) {
		snprintf(err, errlen, "could not start the HTTP server on %s", listen);
		goto out;
	}
	info = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_EPOLL_FD);
	if (info == NULL || info->epoll_fd < 0) {
		snprintf(err, errlen, "could not start the HTTP server on %s: no epoll", listen);
		goto out;
	}
	h->epoll_fd = info->epoll_fd;
	if (pthread_create(&h->thread, NULL, serve, h) != 0) {
		snprintf(err, errlen, "could not start the HTTP thread");
		goto out;
	}
	h->running = true;
	result = h;
	h = NULL;
out:
	if (fd >= 0)
		close(fd);
	http_stop(h); /* a server that did not start */
	return result;
}

void http_stop(struct http_server *h)
{
	if (h == NULL)
		return;
	if (h->running) {
		ssize_t n;

		atomic_store(&h->stopping, true);
		/* The pipe is empty, so one byte always fits; serve() checks the flag after any
		 * wake-up, so nothing more is needed. */
		do
			n = write(h->wake[1], "x", 1);
		while (n < 0 && errno == EINTR);
		pthread_join(h->thread, NULL);
	}
	/* Shuts down and closes every connection (each one notified as closed first) and the
	 * listening socket. */
	if (h->daemon != NULL)
		MHD_stop_daemon(h->daemon);
	if (h->wake[0] >= 0)
		close(h->wake[0]);
	if (h->wake[1] >= 0)
		close(h->wake[1]);
	free(h);
}

/* ---- client ---- */

static int wait_fd(int fd, short events, int64_t deadline)
{
	for (;;) {
		struct pollfd p = { .fd = fd, .events = events };
		int64_t left = deadline - clock_mono_ms();
		int rc;

		if (left <= 0) {
			errno = ETIMEDOUT;
			return -1;
		}
		rc = poll(&p, 1, (int)left);
		if (rc > 0)
			return 0;
		if (rc == 0) {
			errno = ETIMEDOUT;
			return -1;
		}
		if (errno != EINTR)
			return -1;
	}
}

/* Non-blocking connect bounded by the deadline; -1 with errno on failure. */
static int connect_one(const struct addrinfo *ai, int64_t deadline)
{
	int fd, soerr = 0, result = -1;
	socklen_t len = sizeof(soerr);

	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
		if (errno != EINPROGRESS || wait_fd(fd, POLLOUT, deadline) < 0)
			goto out;
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) < 0)
			goto out;
		if (soerr != 0) {
			errno = soerr;
			goto out;
		}
	}
	result = fd;
	fd = -1;
out:
	if (fd >= 0) {
		soerr = errno;
		close(fd);
		errno = soerr;
	}
	return result;
}

/* Sends the request and reads until the end of the status line (or until the server closes).
 * Returns the number of bytes read into resp (NUL-terminated), or -1 with errno. */
static ssize_t exchange(int fd, const char *req, size_t reqlen, char *resp, size_t size,
                        int64_t deadline)
{
	size_t sent = 0, got = 0;

	while (sent < reqlen) {
		ssize_t w = send(fd, req + sent, reqlen - sent, MSG_NOSIGNAL);
		if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
			if (wait_fd(fd, POLLOUT, deadline) < 0)
				return -1;
			continue;
		}
		if (w < 0)
			return -1;
		sent += (size_t)w;
	}
	while (got < size - 1 && memchr(resp, '\n', got) == NULL) {
		ssize_t r = recv(fd, resp + got, size - 1 - got, 0);
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
			if (wait_fd(fd, POLLIN, deadline) < 0)
				return -1;
			continue;
		}
		if (r < 0)
			return -1;
		if (r == 0)
			break;
		got += (size_t)r;
	}
	resp[got] = '\0';
	return (ssize_t)got;
}

int http_get_status(const char *listen, const char *path, int timeout_ms, char *err, size_t errlen)
{
	struct hostport ep;
	struct addrinfo hints, *res = NULL, *ai;
	char req[512], resp[512], port_text[8];
	const char *host;
	ssize_t got;
	int64_t deadline = clock_mono_ms() + (timeout_ms > 0 ? timeout_ms : 1);
	int fd = -1, rc, n, status = -1, saved = ECONNREFUSED;
	char *end;
	long code;

	if (hostport_parse(listen, &ep, err, errlen) < 0)
		goto out;
	/* A server listening on every address is reached through loopback. */
	host = ep.host;
	if (host[0] == '\0' || strcmp(host, "0.0.0.0") == 0)
		host = "127.0.0.1";
	else if (strcmp(host, "::") == 0)
		host = "::1";

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICSERV;
	snprintf(port_text, sizeof(port_text), "%d", ep.port);
	rc = getaddrinfo(host, port_text, &hints, &res);
	if (rc != 0) {
		snprintf(err, errlen, "could not resolve '%s': %s", host, gai_strerror(rc));
		goto out;
	}
	/* A name may resolve to ::1 and 127.0.0.1; the server listens on one of them. */
	for (ai = res; ai != NULL && fd < 0; ai = ai->ai_next) {
		fd = connect_one(ai, deadline);
		if (fd < 0)
			saved = errno;
	}
	if (fd < 0) {
		snprintf(err, errlen, "could not connect to %s: %s", listen, strerror(saved));
		goto out;
	}

	n = snprintf(req, sizeof(req),
	             "GET %s HTTP/1.0\r\nHost: %s%s%s:%d\r\n"
	             "User-Agent: outbox-relay-healthcheck\r\nConnection: close\r\n\r\n",
	             path, strchr(host, ':') ? "[" : "", host, strchr(host, ':') ? "]" : "",
	             ep.port);
	if (n < 0 || (size_t)n >= sizeof(req)) {
		snprintf(err, errlen, "request path too long");
		goto out;
	}
	got = exchange(fd, req, (size_t)n, resp, sizeof(resp), deadline);
	if (got < 0) {
		snprintf(err, errlen, "could not talk to %s: %s", listen, strerror(errno));
		goto out;
	}
	if (got < 12 || strncmp(resp, "HTTP/1.", 7) != 0 || resp[8] != ' ') {
		snprintf(err, errlen, "not an HTTP response from %s", listen);
		goto out;
	}
	errno = 0;
	code = strtol(resp + 9, &end, 10);
	if (end != resp + 12 || errno != 0 || code < 100 || code > 599) {
		snprintf(err, errlen, "bad HTTP status line from %s", listen);
		goto out;
	}
	status = (int)code;
out:
	if (fd >= 0)
		close(fd);
	if (res != NULL)
		freeaddrinfo(res);
	return status;
}
