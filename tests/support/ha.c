/* High-availability test helpers (see ha.h): the commands tests/ha/services.sh writes, run
 * through harness_shell(), plus libpq and rabbitmq-c steps against single nodes, a publisher
 * with confirms that keeps the answer to every delivery tag, producers that keep committing
 * through a failover, and the relay's broker node as its log tells. */
#include "tests/support/ha.h"

#include <amqp_tcp_socket.h>
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <jansson.h>

#include "bench/drive/consumer.h"
#include "tests/support/harness.h"

/* Every RPC (declare, close, ...) gives up after this: a broker that stopped reading must
 * not hang a test for ever. */
#define HA_RPC_TIMEOUT_S 10
#define HA_HEARTBEAT_S   30
#define HA_FRAME_MAX     131072

static void check_node(int node, int max)
{
	cr_assert(node >= 1 && node <= max, "node %d is not between 1 and %d", node, max);
}

/* RELAY_TEST_HA_<what><node><suffix>, e.g. RELAY_TEST_HA_PG1_PORT. */
static const char *node_env(const char *what, int node, const char *suffix)
{
	char name[64];

	snprintf(name, sizeof(name), "RELAY_TEST_HA_%s%d%s", what, node, suffix);
	return harness_require_env(name);
}

const char *ha_pg_conninfo(void)
{
	return harness_require_env("RELAY_TEST_HA_PG");
}

const char *ha_pg_node_conninfo(int node)
{
	check_node(node, HA_PG_NODES);
	return node_env("PG", node, "");
}

int ha_pg_node_port(int node)
{
	const char *v;
	char *end;
	long port;

	check_node(node, HA_PG_NODES);
	v = node_env("PG", node, "_PORT");
	errno = 0;
	port = strtol(v, &end, 10);
	cr_assert(errno == 0 && *end == '\0' && port > 0 && port < 65536,
	          "RELAY_TEST_HA_PG%d_PORT is not a port: '%s'", node, v);
	return (int)port;
}

const char *ha_amqp_url(int node)
{
	check_node(node, HA_RMQ_NODES);
	return node_env("AMQP", node, "");
}

const char *ha_amqp_urls(void)
{
	return harness_require_env("RELAY_TEST_HA_AMQP_ALL");
}

void ha_restore(void)
{
	if (harness_shell("%s", harness_require_env("RELAY_TEST_HA_RESTORE")) != 0)
		cr_log_error("could not restore the HA servers; the next tests may fail too");
}

/* ---- PostgreSQL ---- */

static void quiet_notices(void *arg, const char *message)
{
	(void)arg;
	(void)message;
}

/* 1 when node answers as a primary, 0 as a standby or not at all. */
static int node_is_primary(int node)
{
	PGconn *c = PQconnectdb(ha_pg_node_conninfo(node));
	PGresult *r;
	int primary = 0;

	if (PQstatus(c) == CONNECTION_OK) {
		r = PQexec(c, "SELECT pg_is_in_recovery()");
		if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
			primary = strcmp(PQgetvalue(r, 0, 0), "f") == 0;
		PQclear(r);
	}
	PQfinish(c);
	return primary;
}

int ha_pg_primary_try(void)
{
	int found = 0;

	for (int n = 1; n <= HA_PG_NODES; n++) {
		if (!node_is_primary(n))
			continue;
		if (found)
			return -1;
		found = n;
	}
	return found;
}

int ha_pg_primary(void)
{
	int p = ha_pg_primary_try();

	cr_assert(p != 0, "no PostgreSQL node accepts writes");
	cr_assert(p > 0, "both PostgreSQL nodes accept writes (split brain)");
	return p;
}

void ha_pg_kill(int node)
{
	check_node(node, HA_PG_NODES);
	cr_assert_eq(harness_shell("%s %d", harness_require_env("RELAY_TEST_HA_PG_KILL"), node), 0,
	             "could not kill PostgreSQL node %d", node);
}

int ha_pg_kill_primary(void)
{
	int p = ha_pg_primary();

	ha_pg_kill(p);
	return p;
}

int ha_pg_promote(void)
{
	cr_assert_eq(harness_shell("%s", harness_require_env("RELAY_TEST_HA_PG_PROMOTE")), 0,
	             "could not promote the PostgreSQL standby");
	return ha_pg_primary();
}

void ha_pg_rejoin(int node)
{
	check_node(node, HA_PG_NODES);
	cr_assert_eq(harness_shell("%s %d", harness_require_env("RELAY_TEST_HA_PG_REJOIN"), node),
	             0, "could not rebuild PostgreSQL node %d as a standby", node);
}

void ha_pg_set_sync(bool on)
{
	cr_assert_eq(harness_shell("%s %s", harness_require_env("RELAY_TEST_HA_PG_SYNC"),
	                           on ? "on" : "off"),
	             0, "could not turn synchronous replication %s", on ? "on" : "off");
}

static PGconn *connect_quiet(const char *conninfo)
{
	PGconn *c = PQconnectdb(conninfo);

	if (PQstatus(c) == CONNECTION_OK)
		PQsetNoticeProcessor(c, quiet_notices, NULL);
	return c;
}

static PGconn *connect_or_fail(const char *conninfo, const char *what)
{
	PGconn *c = connect_quiet(conninfo);

	if (PQstatus(c) != CONNECTION_OK) {
		char msg[1024];

		snprintf(msg, sizeof(msg), "%s", PQerrorMessage(c));
		PQfinish(c);
		cr_assert_fail("could not connect to %s: %s", what, msg);
	}
	return c;
}

PGconn *ha_pg_connect(void)
{
	return connect_or_fail(ha_pg_conninfo(), "the primary (RELAY_TEST_HA_PG)");
}

PGconn *ha_pg_connect_node(int node)
{
	char what[64];

	snprintf(what, sizeof(what), "PostgreSQL node %d", node);
	return connect_or_fail(ha_pg_node_conninfo(node), what);
}

PGconn *ha_pg_connect_retry(int64_t timeout_ms)
{
	int64_t deadline = harness_now_ms() + timeout_ms;

	for (;;) {
		PGconn *c = connect_quiet(ha_pg_conninfo());

		if (PQstatus(c) == CONNECTION_OK)
			return c;
		PQfinish(c);
		if (harness_now_ms() >= deadline)
			return NULL;
		harness_sleep_ms(100);
	}
}

int ha_pg_conn_node(const PGconn *c)
{
	const char *port = PQport(c);

	for (int n = 1; port != NULL && n <= HA_PG_NODES; n++) {
		char buf[16];

		snprintf(buf, sizeof(buf), "%d", ha_pg_node_port(n));
		if (strcmp(port, buf) == 0)
			return n;
	}
	return 0;
}

/* ---- RabbitMQ nodes ---- */

void ha_rmq_stop(int node)
{
	check_node(node, HA_RMQ_NODES);
	cr_assert_eq(
	        harness_shell("%s %d", harness_require_env("RELAY_TEST_HA_RABBITMQ_STOP"), node), 0,
	        "could not stop RabbitMQ node %d", node);
}

void ha_rmq_kill(int node)
{
	check_node(node, HA_RMQ_NODES);
	cr_assert_eq(
	        harness_shell("%s %d", harness_require_env("RELAY_TEST_HA_RABBITMQ_KILL"), node), 0,
	        "could not kill RabbitMQ node %d", node);
}

void ha_rmq_start(int node)
{
	check_node(node, HA_RMQ_NODES);
	cr_assert_eq(
	        harness_shell("%s %d", harness_require_env("RELAY_TEST_HA_RABBITMQ_START"), node),
	        0, "could not start RabbitMQ node %d", node);
}

void ha_rmq_wait_cluster(unsigned nodes)
{
	char list[16] = "";
	size_t len = 0;

	for (int n = 1; n <= HA_RMQ_NODES; n++) {
		if (nodes & HA_NODE(n))
			len += (size_t)snprintf(list + len, sizeof(list) - len, " %d", n);
	}
	cr_assert(len > 0, "ha_rmq_wait_cluster: no node given");
	cr_assert_eq(harness_shell("%s%s",
	                           harness_require_env("RELAY_TEST_HA_RABBITMQ_WAIT_CLUSTER"),
	                           list),
	             0, "RabbitMQ nodes%s do not run as one cluster", list);
}

/* ---- AMQP ---- */

static void reply_text(amqp_rpc_reply_t r, char *buf, size_t len)
{
	if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION) {
		snprintf(buf, len, "%s", amqp_error_string2(r.library_error));
	} else if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
	           r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
		const amqp_connection_close_t *m = r.reply.decoded;

		snprintf(buf, len, "connection.close %u %.*s", m->reply_code,
		         (int)m->reply_text.len, (const char *)m->reply_text.bytes);
	} else if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
	           r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
		const amqp_channel_close_t *m = r.reply.decoded;

		snprintf(buf, len, "channel.close %u %.*s", m->reply_code, (int)m->reply_text.len,
		         (const char *)m->reply_text.bytes);
	} else if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION) {
		snprintf(buf, len, "server exception 0x%08x", r.reply.id);
	} else {
		snprintf(buf, len, "no reply");
	}
}

amqp_connection_state_t ha_amqp_try_connect(int node, char *err, size_t errlen)
{
	char *url = strdup(ha_amqp_url(node));
	struct amqp_connection_info ci;
	amqp_connection_state_t conn = amqp_new_connection();
	amqp_socket_t *sock = conn ? amqp_tcp_socket_new(conn) : NULL;
	struct timeval connect_tv = { .tv_sec = 5 };
	struct timeval rpc_tv = { .tv_sec = HA_RPC_TIMEOUT_S };
	amqp_rpc_reply_t r;
	int rc;

	cr_assert(url != NULL && conn != NULL && sock != NULL, "out of memory");
	if (amqp_parse_url(url, &ci) != AMQP_STATUS_OK)
		cr_assert_fail("cannot parse RELAY_TEST_HA_AMQP%d '%s'", node, ha_amqp_url(node));
	if (ci.vhost == NULL || ci.vhost[0] == '\0')
		ci.vhost = "/";
	rc = amqp_socket_open_noblock(sock, ci.host, ci.port, &connect_tv);
	if (rc != AMQP_STATUS_OK) {
		snprintf(err, errlen, "connect: %s", amqp_error_string2(rc));
		goto fail;
	}
	(void)amqp_set_rpc_timeout(conn, &rpc_tv);
	r = amqp_login(conn, ci.vhost, 0, HA_FRAME_MAX, HA_HEARTBEAT_S, AMQP_SASL_METHOD_PLAIN,
	               ci.user, ci.password);
	if (r.reply_type != AMQP_RESPONSE_NORMAL) {
		char detail[200];

		reply_text(r, detail, sizeof(detail));
		snprintf(err, errlen, "login: %s", detail);
		goto fail;
	}
	amqp_channel_open(conn, 1);
	r = amqp_get_rpc_reply(conn);
	if (r.reply_type != AMQP_RESPONSE_NORMAL) {
		char detail[200];

		reply_text(r, detail, sizeof(detail));
		snprintf(err, errlen, "channel.open: %s", detail);
		goto fail;
	}
	free(url);
	return conn;
fail:
	amqp_destroy_connection(conn);
	free(url);
	return NULL;
}

amqp_connection_state_t ha_amqp_connect(int node)
{
	char err[256] = "";
	amqp_connection_state_t c = ha_amqp_try_connect(node, err, sizeof(err));

	cr_assert_not_null(c, "could not connect to RabbitMQ node %d (%s): %s", node,
	                   ha_amqp_url(node), err);
	return c;
}

void ha_amqp_close(amqp_connection_state_t c)
{
	if (c == NULL)
		return;
	/* Bounded by the RPC timeout; on a dead socket the write fails at once. */
	(void)amqp_connection_close(c, AMQP_REPLY_SUCCESS);
	amqp_destroy_connection(c);
}

static void rpc_ok(amqp_connection_state_t c, const char *what, const char *name)
{
	amqp_rpc_reply_t r = amqp_get_rpc_reply(c);
	char detail[256];

	if (r.reply_type == AMQP_RESPONSE_NORMAL)
		return;
	reply_text(r, detail, sizeof(detail));
	cr_assert_fail("%s '%s' failed: %s", what, name, detail);
}

void ha_declare_quorum_queue(int node, const char *exchange, const char *queue,
                             const char *binding_key)
{
	amqp_connection_state_t c = ha_amqp_connect(node);
	amqp_table_entry_t arg = {
		.key = amqp_cstring_bytes("x-queue-type"),
		.value = { .kind = AMQP_FIELD_KIND_UTF8,
		           .value = { .bytes = amqp_cstring_bytes("quorum") } },
	};
	amqp_table_t args = { .num_entries = 1, .entries = &arg };

	amqp_exchange_declare(c, 1, amqp_cstring_bytes(exchange), amqp_cstring_bytes("topic"), 0, 1,
	                      0, 0, amqp_empty_table);
	rpc_ok(c, "exchange.declare", exchange);
	/* Quorum queues are durable, never exclusive or auto-deleted. */
	amqp_queue_declare(c, 1, amqp_cstring_bytes(queue), 0, 1, 0, 0, args);
	rpc_ok(c, "queue.declare", queue);
	amqp_queue_bind(c, 1, amqp_cstring_bytes(queue), amqp_cstring_bytes(exchange),
	                amqp_cstring_bytes(binding_key), amqp_empty_table);
	rpc_ok(c, "queue.bind", queue);
	ha_amqp_close(c);
}

void ha_delete_queue(const char *exchange, const char *queue)
{
	for (int n = 1; n <= HA_RMQ_NODES; n++) {
		char err[256];
		amqp_connection_state_t c = ha_amqp_try_connect(n, err, sizeof(err));

		if (c == NULL)
			continue;
		amqp_queue_delete(c, 1, amqp_cstring_bytes(queue), 0, 0);
		if (amqp_get_rpc_reply(c).reply_type == AMQP_RESPONSE_NORMAL) {
			amqp_exchange_delete(c, 1, amqp_cstring_bytes(exchange), 0);
			(void)amqp_get_rpc_reply(c);
		}
		ha_amqp_close(c);
		return;
	}
	cr_log_warn("could not delete queue '%s': no RabbitMQ node answers", queue);
}

/* Runs a command line and returns its stdout (new string, free()) and exit status. */
static char *capture(int *status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static char *capture(int *status, const char *fmt, ...)
{
	char cmd[1024];
	char *out = NULL;
	size_t len = 0, cap = 0, n;
	va_list ap;
	FILE *f;
	int st, w;

	va_start(ap, fmt);
	w = vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	cr_assert(w > 0 && (size_t)w < sizeof(cmd), "command line too long");
	fflush(NULL);
	f = popen(cmd, "r");
	cr_assert_not_null(f, "cannot run '%s': %s", cmd, strerror(errno));
	do {
		if (cap - len < 1024) {
			cap = cap ? cap * 2 : 4096;
			out = realloc(out, cap);
			cr_assert_not_null(out);
		}
		n = fread(out + len, 1, cap - len - 1, f);
		len += n;
	} while (n > 0);
	out[len] = '\0';
	st = pclose(f);
	*status = (st >= 0 && WIFEXITED(st)) ? WEXITSTATUS(st) : -1;
	return out;
}

/* The rest of queue's line in `rabbitmqctl list_queues name <item>` as asked from the first
 * node that answers, copied into buf: "[node@host, node@host]" for a list. -1 when no node
 * answered, 0 when the queue is not listed, 1 when found. */
static int queue_info(const char *queue, const char *item, char *buf, size_t len)
{
	const char *ctl = harness_require_env("RELAY_TEST_HA_RABBITMQ_CTL");
	size_t qlen = strlen(queue);

	for (int n = 1; n <= HA_RMQ_NODES; n++) {
		int status, found = 0;
		char *out = capture(&status, "%s %d list_queues -q --no-table-headers name %s 2>&1",
		                    ctl, n, item);
		const char *line = out;

		if (status != 0) {
			free(out);
			continue;
		}
		/* One line per queue: "name\tvalue". */
		while (line && *line) {
			const char *nl = strchr(line, '\n');

			if (strncmp(line, queue, qlen) == 0 && line[qlen] == '\t') {
				size_t vlen = nl ? (size_t)(nl - line) - qlen - 1
				                 : strlen(line + qlen + 1);

				snprintf(buf, len, "%.*s", (int)vlen, line + qlen + 1);
				found = 1;
				break;
			}
			line = nl ? nl + 1 : NULL;
		}
		free(out);
		return found;
	}
	return -1;
}

int ha_quorum_online(const char *queue)
{
	char v[512];
	int online = 0;
	int rc = queue_info(queue, "online", v, sizeof(v));

	if (rc <= 0)
		return rc;
	for (const char *p = v; *p; p++)
		online += *p == '@';
	return online;
}

int ha_quorum_leader(const char *queue)
{
	char v[512];

	if (queue_info(queue, "leader", v, sizeof(v)) <= 0)
		return 0;
	for (int n = 1; n <= HA_RMQ_NODES; n++) {
		char name[48];

		snprintf(name, sizeof(name), "RELAY_TEST_HA_RABBITMQ_NODE%d", n);
		if (strcmp(v, harness_require_env(name)) == 0)
			return n;
	}
	return 0;
}

void ha_wait_quorum_online(const char *queue, int n, int64_t timeout_ms)
{
	int64_t deadline = harness_now_ms() + timeout_ms;
	int online;

	for (;;) {
		online = ha_quorum_online(queue);
		if (online >= n)
			return;
		if (harness_now_ms() >= deadline)
			break;
		harness_sleep_ms(500);
	}
	cr_assert_fail("quorum queue '%s' has %d members online after %lld ms, expected %d", queue,
	               online, (long long)timeout_ms, n);
}

size_t ha_queue_drain(int node, const char *queue, ha_msg_fn fn, void *arg)
{
	amqp_connection_state_t c = ha_amqp_connect(node);
	size_t count = 0;

	for (;;) {
		amqp_rpc_reply_t r = amqp_basic_get(c, 1, amqp_cstring_bytes(queue), 0);
		const amqp_basic_get_ok_t *ok;
		amqp_message_t msg;
		uint64_t tag;
		char detail[256];

		if (r.reply_type != AMQP_RESPONSE_NORMAL) {
			reply_text(r, detail, sizeof(detail));
			cr_assert_fail("basic.get from '%s' failed: %s", queue, detail);
		}
		if (r.reply.id == AMQP_BASIC_GET_EMPTY_METHOD)
			break;
		cr_assert_eq(r.reply.id, AMQP_BASIC_GET_OK_METHOD);
		ok = r.reply.decoded;
		tag = ok->delivery_tag;
		r = amqp_read_message(c, 1, &msg, 0);
		if (r.reply_type != AMQP_RESPONSE_NORMAL) {
			reply_text(r, detail, sizeof(detail));
			cr_assert_fail("reading a message of '%s' failed: %s", queue, detail);
		}
		if (fn)
			fn(msg.body.bytes, msg.body.len, arg);
		amqp_destroy_message(&msg);
		cr_assert_eq(amqp_basic_ack(c, 1, tag, 0), AMQP_STATUS_OK, "basic.ack failed");
		count++;
		amqp_maybe_release_buffers(c);
	}
	ha_amqp_close(c);
	return count;
}

/* ---- publisher ---- */

struct ha_publisher {
	amqp_connection_state_t conn;
	int node;
	uint64_t last_tag;
	unsigned char *state; /* enum ha_confirm by delivery tag; [0] unused */
	size_t cap;
	size_t counts[3];
	uint64_t lowest_pending; /* no tag below this is pending */
	struct ha_publisher_events ev;
};

struct ha_publisher *ha_publisher_open(int node)
{
	struct ha_publisher *p = calloc(1, sizeof(*p));
	amqp_rpc_reply_t r;
	char detail[256];

	cr_assert_not_null(p);
	p->node = node;
	p->conn = ha_amqp_connect(node);
	p->lowest_pending = 1;
	amqp_confirm_select(p->conn, 1);
	r = amqp_get_rpc_reply(p->conn);
	if (r.reply_type != AMQP_RESPONSE_NORMAL) {
		reply_text(r, detail, sizeof(detail));
		cr_assert_fail("confirm.select on node %d failed: %s", node, detail);
	}
	return p;
}

static void mark_closed(struct ha_publisher *p, int code, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

static void mark_closed(struct ha_publisher *p, int code, const char *fmt, ...)
{
	va_list ap;

	if (p->ev.closed)
		return;
	p->ev.closed = true;
	p->ev.close_code = code;
	p->ev.closed_at_ms = harness_now_ms();
	va_start(ap, fmt);
	vsnprintf(p->ev.close_text, sizeof(p->ev.close_text), fmt, ap);
	va_end(ap);
}

uint64_t ha_publish(struct ha_publisher *p, const char *exchange, const char *routing_key,
                    const char *body)
{
	amqp_basic_properties_t props = {
		._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_CONTENT_TYPE_FLAG,
		.delivery_mode = 2,
		.content_type = amqp_cstring_bytes("text/plain"),
	};
	int rc;

	if (p->ev.closed)
		return 0;
	rc = amqp_basic_publish(p->conn, 1, amqp_cstring_bytes(exchange),
	                        amqp_cstring_bytes(routing_key), 1, 0, &props,
	                        amqp_cstring_bytes(body));
	if (rc != AMQP_STATUS_OK) {
		mark_closed(p, 0, "publish failed: %s", amqp_error_string2(rc));
		return 0;
	}
	p->last_tag++;
	if (p->last_tag >= p->cap) {
		size_t ncap = p->cap ? p->cap * 2 : 256;

		p->state = realloc(p->state, ncap);
		cr_assert_not_null(p->state);
		memset(p->state + p->cap, HA_PENDING, ncap - p->cap);
		p->cap = ncap;
	}
	p->state[p->last_tag] = HA_PENDING;
	p->counts[HA_PENDING]++;
	return p->last_tag;
}

static void settle(struct ha_publisher *p, uint64_t tag, bool multiple, bool nack)
{
	enum ha_confirm to = nack ? HA_NACKED : HA_ACKED;
	uint64_t from = multiple ? p->lowest_pending : tag;

	if (tag == 0 || tag > p->last_tag) {
		cr_log_warn("node %d confirmed delivery tag %llu, but only %llu were published",
		            p->node, (unsigned long long)tag, (unsigned long long)p->last_tag);
		return;
	}
	for (uint64_t t = from; t <= tag; t++) {
		if (p->state[t] != HA_PENDING)
			continue;
		p->state[t] = (unsigned char)to;
		p->counts[HA_PENDING]--;
		p->counts[to]++;
	}
	while (p->lowest_pending <= p->last_tag && p->state[p->lowest_pending] != HA_PENDING)
		p->lowest_pending++;
	p->ev.last_confirm_ms = harness_now_ms();
}

static void handle_frame(struct ha_publisher *p, const amqp_frame_t *f)
{
	if (f->frame_type != AMQP_FRAME_METHOD)
		return;
	switch (f->payload.method.id) {
	case AMQP_BASIC_ACK_METHOD: {
		const amqp_basic_ack_t *m = f->payload.method.decoded;

		settle(p, m->delivery_tag, m->multiple, false);
		break;
	}
	case AMQP_BASIC_NACK_METHOD: {
		const amqp_basic_nack_t *m = f->payload.method.decoded;

		settle(p, m->delivery_tag, m->multiple, true);
		break;
	}
	case AMQP_BASIC_RETURN_METHOD: {
		amqp_message_t msg;
		amqp_rpc_reply_t r;

		p->ev.returned++;
		/* The returned message's header and body follow; read them off the wire. */
		r = amqp_read_message(p->conn, f->channel, &msg, 0);
		if (r.reply_type == AMQP_RESPONSE_NORMAL)
			amqp_destroy_message(&msg);
		break;
	}
	case AMQP_CHANNEL_CLOSE_METHOD: {
		const amqp_channel_close_t *m = f->payload.method.decoded;
		amqp_channel_close_ok_t ok = { 0 };

		mark_closed(p, m->reply_code, "channel.close %u %.*s", m->reply_code,
		            (int)m->reply_text.len, (const char *)m->reply_text.bytes);
		(void)amqp_send_method(p->conn, f->channel, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
		break;
	}
	case AMQP_CONNECTION_CLOSE_METHOD: {
		const amqp_connection_close_t *m = f->payload.method.decoded;
		amqp_connection_close_ok_t ok = { 0 };

		mark_closed(p, m->reply_code, "connection.close %u %.*s", m->reply_code,
		            (int)m->reply_text.len, (const char *)m->reply_text.bytes);
		(void)amqp_send_method(p->conn, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
		break;
	}
	case AMQP_CONNECTION_BLOCKED_METHOD:
		p->ev.blocked = true;
		p->ev.blocked_count++;
		break;
	case AMQP_CONNECTION_UNBLOCKED_METHOD:
		p->ev.blocked = false;
		break;
	default:
		break;
	}
}

/* Reads and handles frames until the connection is gone, timeout_ms passed or, when
 * until_answered, no publish is pending. */
static void read_frames(struct ha_publisher *p, int64_t timeout_ms, bool until_answered)
{
	int64_t deadline = harness_now_ms() + timeout_ms;

	/* At least one call even with no time left: it is also what sends heartbeats; with none
	 * left, it returns once nothing more has arrived. */
	while (!p->ev.closed && (!until_answered || p->counts[HA_PENDING] > 0)) {
		int64_t left = deadline - harness_now_ms();
		struct timeval tv;
		amqp_frame_t f;
		int rc;

		if (left < 0)
			left = 0;
		tv.tv_sec = (time_t)(left / 1000);
		tv.tv_usec = (suseconds_t)(left % 1000) * 1000;
		rc = amqp_simple_wait_frame_noblock(p->conn, &f, &tv);
		if (rc == AMQP_STATUS_TIMEOUT)
			break;
		if (rc != AMQP_STATUS_OK) {
			mark_closed(p, 0, "connection lost: %s", amqp_error_string2(rc));
			break;
		}
		handle_frame(p, &f);
		amqp_maybe_release_buffers_on_channel(p->conn, f.channel);
	}
}

void ha_publisher_service(struct ha_publisher *p)
{
	read_frames(p, 0, false);
}

size_t ha_publisher_wait(struct ha_publisher *p, int64_t timeout_ms)
{
	read_frames(p, timeout_ms, true);
	return p->counts[HA_PENDING];
}

bool ha_publisher_wait_closed(struct ha_publisher *p, int64_t timeout_ms)
{
	read_frames(p, timeout_ms, false);
	return p->ev.closed;
}

enum ha_confirm ha_publisher_state(const struct ha_publisher *p, uint64_t tag)
{
	cr_assert(tag >= 1 && tag <= p->last_tag, "delivery tag %llu was never published",
	          (unsigned long long)tag);
	return (enum ha_confirm)p->state[tag];
}

size_t ha_publisher_count(const struct ha_publisher *p, enum ha_confirm state)
{
	return p->counts[state];
}

uint64_t ha_publisher_published(const struct ha_publisher *p)
{
	return p->last_tag;
}

const struct ha_publisher_events *ha_publisher_events(const struct ha_publisher *p)
{
	return &p->ev;
}

void ha_publisher_close(struct ha_publisher *p)
{
	if (p == NULL)
		return;
	if (p->ev.closed)
		amqp_destroy_connection(p->conn);
	else
		ha_amqp_close(p->conn);
	free(p->state);
	free(p);
}

/* ---- producers ---- */

#define HA_PRODUCER_THREADS  8
#define HA_PRODUCER_ROWS     100000
#define HA_PRODUCER_RETRY_MS 50

struct producer_thread {
	struct ha_producer *p;
	int index;
	pthread_t thread;
	bool started;
	uint64_t rng;
	struct ha_commit *rows; /* max_rows records; rows[0, n) are filled */
	atomic_size_t n;
};

struct ha_producer {
	char conninfo[1024];
	char table[128], exchange[256], routing_key[256], prefix[16];
	int keys;
	int64_t pause_ms;
	size_t max_rows;
	int n_threads;
	atomic_bool stop;
	atomic_size_t retries;
	struct producer_thread t[HA_PRODUCER_THREADS];
};

static uint64_t next_rand(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* Runs one statement; true when it returned expect. *res gets the result when res is not
 * NULL (the caller clears it), else it is cleared here. */
static bool producer_exec(PGconn *c, const char *sql, int nparams, const char *const *params,
                          ExecStatusType expect, PGresult **res)
{
	PGresult *r = PQexecParams(c, sql, nparams, NULL, params, NULL, NULL, 0);
	bool ok = PQresultStatus(r) == expect;

	if (res != NULL && ok)
		*res = r;
	else
		PQclear(r);
	return ok;
}

/* One attempt at committing row id: 0 committed (*earlier: the id was there already), -1
 * not, or not known (the caller retries with the same id). */
static int producer_attempt(struct producer_thread *t, PGconn *c, const char *id, int key,
                            bool *earlier)
{
	struct ha_producer *p = t->p;
	char sql[512], keyname[32], keynum[16], body[96];
	const char *params[5];
	PGresult *res = NULL;
	bool ok;

	if (!producer_exec(c, "BEGIN", 0, NULL, PGRES_COMMAND_OK, NULL))
		return -1;
	if (key >= 0) {
		snprintf(keynum, sizeof(keynum), "%d", key);
		params[0] = p->table;
		params[1] = keynum;
		if (!producer_exec(c, "SELECT pg_advisory_xact_lock(hashtext($1), $2::int)", 2,
		                   params, PGRES_TUPLES_OK, NULL))
			goto rollback;
		snprintf(keyname, sizeof(keyname), "%sk%02d", p->prefix, key);
	}
	snprintf(body, sizeof(body), "{\"id\":\"%s\",\"key\":%d}", id, key);
	snprintf(sql, sizeof(sql),
	         "INSERT INTO %s (id, exchange_name, routing_key, body, ordering_key)"
	         " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING",
	         p->table);
	params[0] = id;
	params[1] = p->exchange;
	params[2] = p->routing_key;
	params[3] = body;
	params[4] = key >= 0 ? keyname : NULL;
	if (!producer_exec(c, sql, 5, params, PGRES_COMMAND_OK, &res))
		goto rollback;
	*earlier = strcmp(PQcmdTuples(res), "0") == 0;
	PQclear(res);
	res = NULL;
	/* COMMIT of a transaction that failed answers ROLLBACK, also with PGRES_COMMAND_OK. */
	ok = producer_exec(c, "COMMIT", 0, NULL, PGRES_COMMAND_OK, &res) &&
	     strcmp(PQcmdStatus(res), "COMMIT") == 0;
	PQclear(res);
	return ok ? 0 : -1;
rollback:
	if (PQstatus(c) == CONNECTION_OK)
		PQclear(PQexec(c, "ROLLBACK"));
	return -1;
}

static void *producer_main(void *arg)
{
	struct producer_thread *t = arg;
	struct ha_producer *p = t->p;
	PGconn *c = NULL;
	size_t next = 0;
	int key = p->keys > 0 ? (int)(next_rand(&t->rng) % (uint64_t)p->keys) : -1;

	while (!atomic_load(&p->stop) && next < p->max_rows) {
		char id[48];
		int64_t begin = harness_now_ms();
		bool earlier = false;

		if (c == NULL || PQstatus(c) != CONNECTION_OK) {
			PQfinish(c);
			c = PQconnectdb(p->conninfo);
			if (PQstatus(c) != CONNECTION_OK) {
				PQfinish(c);
				c = NULL;
				harness_sleep_ms(HA_PRODUCER_RETRY_MS);
				continue;
			}
			PQsetNoticeProcessor(c, quiet_notices, NULL);
		}
		snprintf(id, sizeof(id), "%s%d-%07zu", p->prefix, t->index, next);
		if (producer_attempt(t, c, id, key, &earlier) != 0) {
			/* Same id and key again: ON CONFLICT makes the retry harmless when the
			 * failed COMMIT did commit. */
			atomic_fetch_add(&p->retries, 1);
			if (PQstatus(c) != CONNECTION_OK) {
				PQfinish(c);
				c = NULL;
			}
			harness_sleep_ms(HA_PRODUCER_RETRY_MS);
			continue;
		}
		t->rows[next] = (struct ha_commit){
			.key = key,
			.begin_ms = begin,
			.commit_ms = harness_now_ms(),
			.earlier = earlier,
		};
		atomic_store(&t->n, ++next);
		if (p->keys > 0)
			key = (int)(next_rand(&t->rng) % (uint64_t)p->keys);
		if (p->pause_ms > 0)
			harness_sleep_ms(p->pause_ms);
	}
	PQfinish(c);
	return NULL;
}

struct ha_producer *ha_producer_start(const struct ha_producer_options *opt)
{
	struct ha_producer *p = calloc(1, sizeof(*p));

	cr_assert_not_null(p);
	cr_assert(opt->threads >= 1 && opt->threads <= HA_PRODUCER_THREADS,
	          "ha_producer_start: 1 to %d threads, not %d", HA_PRODUCER_THREADS, opt->threads);
	cr_assert(opt->prefix && opt->prefix[0] && strlen(opt->prefix) < sizeof(p->prefix),
	          "ha_producer_start: a prefix of 1 to %zu characters", sizeof(p->prefix) - 1);
	cr_assert(opt->keys >= 0 && opt->keys < 100, "ha_producer_start: 0 to 99 keys");
	snprintf(p->conninfo, sizeof(p->conninfo), "%s",
	         opt->conninfo ? opt->conninfo : ha_pg_conninfo());
	snprintf(p->table, sizeof(p->table), "%s", opt->table);
	snprintf(p->exchange, sizeof(p->exchange), "%s", opt->exchange);
	snprintf(p->routing_key, sizeof(p->routing_key), "%s",
	         opt->routing_key ? opt->routing_key : "ha.row");
	snprintf(p->prefix, sizeof(p->prefix), "%s", opt->prefix);
	p->keys = opt->keys;
	p->pause_ms = opt->pause_ms;
	p->max_rows = opt->max_rows > 0 ? opt->max_rows : HA_PRODUCER_ROWS;
	p->n_threads = opt->threads;
	atomic_init(&p->stop, false);
	atomic_init(&p->retries, 0);
	for (int i = 0; i < p->n_threads; i++) {
		struct producer_thread *t = &p->t[i];

		t->p = p;
		t->index = i;
		t->rng = ((uint64_t)harness_now_ms() << 8) ^
		         (uint64_t)(i + 1) * 0x9E3779B97F4A7C15ull;
		if (t->rng == 0)
			t->rng = 1;
		atomic_init(&t->n, 0);
		t->rows = calloc(p->max_rows, sizeof(*t->rows));
		cr_assert_not_null(t->rows);
	}
	for (int i = 0; i < p->n_threads; i++) {
		if (pthread_create(&p->t[i].thread, NULL, producer_main, &p->t[i]) != 0) {
			ha_producer_free(p);
			cr_assert_fail("could not start producer thread %d", i);
		}
		p->t[i].started = true;
	}
	return p;
}

size_t ha_producer_committed(struct ha_producer *p)
{
	size_t n = 0;

	for (int i = 0; i < p->n_threads; i++)
		n += atomic_load(&p->t[i].n);
	return n;
}

size_t ha_producer_retries(struct ha_producer *p)
{
	return atomic_load(&p->retries);
}

size_t ha_producer_stop(struct ha_producer *p)
{
	atomic_store(&p->stop, true);
	for (int i = 0; i < p->n_threads; i++) {
		if (p->t[i].started)
			pthread_join(p->t[i].thread, NULL);
		p->t[i].started = false;
	}
	return ha_producer_committed(p);
}

const struct ha_commit *ha_producer_find(struct ha_producer *p, const char *id)
{
	size_t plen = strlen(p->prefix);
	unsigned long long t, n;
	char *end;

	if (strncmp(id, p->prefix, plen) != 0)
		return NULL;
	errno = 0;
	t = strtoull(id + plen, &end, 10);
	if (errno != 0 || end == id + plen || *end != '-' || t >= (unsigned long long)p->n_threads)
		return NULL;
	id = end + 1;
	n = strtoull(id, &end, 10);
	if (errno != 0 || end == id || *end != '\0' || n >= atomic_load(&p->t[t].n))
		return NULL;
	return &p->t[t].rows[n];
}

void ha_producer_each(struct ha_producer *p, ha_commit_fn fn, void *arg)
{
	char id[48];

	for (int i = 0; i < p->n_threads; i++) {
		size_t n = atomic_load(&p->t[i].n);

		for (size_t k = 0; k < n; k++) {
			snprintf(id, sizeof(id), "%s%d-%07zu", p->prefix, i, k);
			fn(id, &p->t[i].rows[k], arg);
		}
	}
}

void ha_producer_free(struct ha_producer *p)
{
	if (p == NULL)
		return;
	(void)ha_producer_stop(p);
	for (int i = 0; i < p->n_threads; i++)
		free(p->t[i].rows);
	free(p);
}

/* ---- the relay's log ---- */

/* The node whose AMQP port is port, 0 when none. */
static int amqp_node_by_port(long port)
{
	for (int n = 1; n <= HA_RMQ_NODES; n++) {
		const char *v = node_env("AMQP", n, "_PORT");

		if (strtol(v, NULL, 10) == port)
			return n;
	}
	return 0;
}

int ha_relay_broker_node(const struct harness_relay *r)
{
	char *log = harness_relay_log(r);
	int node = 0;

	for (char *line = log; line != NULL && *line;) {
		char *nl = strchr(line, '\n');
		const char *server;

		if (nl)
			*nl = '\0';
		server = strstr(line, " server=");
		if (server && strstr(line, " to=broker") &&
		    (strstr(line, "msg=\"connected\"") || strstr(line, "msg=\"reconnected\""))) {
			const char *colon = strchr(server, ':');
			int n = colon ? amqp_node_by_port(strtol(colon + 1, NULL, 10)) : 0;

			if (n != 0)
				node = n;
		}
		line = nl ? nl + 1 : NULL;
	}
	free(log);
	return node;
}

int ha_wait_relay_broker_node(const struct harness_relay *r, int other_than, int64_t timeout_ms)
{
	int node = 0;

	HARNESS_WAIT((node = ha_relay_broker_node(r)) != 0 && node != other_than, timeout_ms);
	if (node == 0 || node == other_than)
		harness_relay_dump_log(r);
	cr_assert(node != 0 && node != other_than,
	          "the relay logged no broker connection to a node other than %d within %lld ms",
	          other_than, (long long)timeout_ms);
	return node;
}

/* ---- what a consumer saw ---- */

#define DELIVERY_CHUNK 4096

struct lost_walk {
	struct consumer *c;
	const char *what;
	size_t lost;
};

static void count_lost(const char *id, const struct ha_commit *row, void *arg)
{
	struct lost_walk *w = arg;

	(void)row;
	if (consumer_count(w->c, id) > 0)
		return;
	if (w->what != NULL && w->lost < 10)
		cr_log_error("%s: %s was committed and never received", w->what, id);
	w->lost++;
}

size_t ha_count_lost(struct consumer *c, struct ha_producer *const *ps, size_t n, const char *what)
{
	struct lost_walk w = { .c = c, .what = what, .lost = 0 };

	for (size_t i = 0; i < n; i++)
		ha_producer_each(ps[i], count_lost, &w);
	return w.lost;
}

size_t ha_wait_delivered(struct consumer *c, struct ha_producer *const *ps, size_t n,
                         int64_t timeout_ms, const char *what)
{
	int64_t deadline = harness_now_ms() + timeout_ms;

	/* Every half second: a count walks every row the producers committed. */
	while (ha_count_lost(c, ps, n, NULL) > 0 && harness_now_ms() < deadline)
		harness_sleep_ms(500);
	return ha_count_lost(c, ps, n, what);
}

int64_t ha_first_fresh_delivery(struct consumer *c, struct ha_producer *const *ps, size_t n,
                                int64_t since_ms)
{
	const char *ids[DELIVERY_CHUNK];
	int64_t at[DELIVERY_CHUNK];
	size_t from = 0, got;

	while ((got = consumer_deliveries(c, from, ids, at, DELIVERY_CHUNK)) > 0) {
		for (size_t i = 0; i < got; i++) {
			for (size_t k = 0; k < n; k++) {
				const struct ha_commit *row = ha_producer_find(ps[k], ids[i]);

				if (row != NULL && !row->earlier && row->begin_ms >= since_ms)
					return at[i];
			}
		}
		from += got;
	}
	return -1;
}

struct arrival_walk {
	json_t *first; /* id -> first arrival */
	int64_t before_ms, last;
};

static void latest_arrival(const char *id, const struct ha_commit *row, void *arg)
{
	struct arrival_walk *w = arg;
	json_t *at;

	if (w->last < 0 || row->commit_ms >= w->before_ms)
		return;
	at = json_object_get(w->first, id);
	if (at == NULL)
		w->last = -1;
	else if (json_integer_value(at) > w->last)
		w->last = json_integer_value(at);
}

int64_t ha_last_arrival(struct consumer *c, struct ha_producer *const *ps, size_t n,
                        int64_t before_ms)
{
	const char *ids[DELIVERY_CHUNK];
	int64_t at[DELIVERY_CHUNK];
	struct arrival_walk w = { .first = json_object(), .before_ms = before_ms, .last = 0 };
	size_t from = 0, got;

	cr_assert_not_null(w.first);
	while ((got = consumer_deliveries(c, from, ids, at, DELIVERY_CHUNK)) > 0) {
		for (size_t i = 0; i < got; i++) {
			if (json_object_get(w.first, ids[i]) == NULL)
				json_object_set_new(w.first, ids[i], json_integer(at[i]));
		}
		from += got;
	}
	for (size_t k = 0; k < n; k++)
		ha_producer_each(ps[k], latest_arrival, &w);
	json_decref(w.first);
	return w.last;
}

int64_t ha_first_delivery_after(struct consumer *c, int64_t from_ms)
{
	const char *ids[DELIVERY_CHUNK];
	int64_t at[DELIVERY_CHUNK];
	size_t from = 0, got;

	while ((got = consumer_deliveries(c, from, ids, at, DELIVERY_CHUNK)) > 0) {
		for (size_t i = 0; i < got; i++) {
			if (at[i] >= from_ms)
				return at[i];
		}
		from += got;
	}
	return -1;
}

int64_t ha_longest_pause(struct consumer *c, int64_t from_ms, int64_t to_ms, int64_t *end_ms)
{
	const char *ids[DELIVERY_CHUNK];
	int64_t at[DELIVERY_CHUNK], prev = -1, longest = 0, end = 0;
	size_t from = 0, got;

	while ((got = consumer_deliveries(c, from, ids, at, DELIVERY_CHUNK)) > 0) {
		for (size_t i = 0; i < got; i++) {
			if (prev >= 0 && at[i] >= from_ms && at[i] <= to_ms &&
			    at[i] - prev > longest) {
				longest = at[i] - prev;
				end = at[i];
			}
			prev = at[i];
		}
		from += got;
	}
	if (end_ms)
		*end_ms = end;
	return longest;
}

/* How the broker handed id over first: whether it said it had delivered it before, and the
 * quorum queue's count of earlier deliveries (x-delivery-count, absent on a first one). */
static void first_delivery_text(struct consumer *c, const char *id, char *buf, size_t len)
{
	const struct consumer_msg *m = consumer_find(c, id);
	json_t *count = m && m->headers ? json_object_get(m->headers, "x-delivery-count") : NULL;

	if (m == NULL) {
		snprintf(buf, len, "never delivered");
		return;
	}
	snprintf(buf, len, "redelivered=%s x-delivery-count=%lld", m->redelivered ? "yes" : "no",
	         count ? (long long)json_integer_value(count) : 0LL);
}

size_t ha_check_key_order(PGconn *pg, const char *table, struct consumer *c, const char *what)
{
	char early[96], late[96];
	const char *ids[DELIVERY_CHUNK];
	json_t *key_of = json_object(), *seen = json_object(), *next = json_object();
	bool *again;
	PGresult *res;
	size_t rows, from = 0, got, checked = 0, n_again = 0;
	char sql[512];

	cr_assert(key_of && seen && next);
	/* Within a key, seq order is commit order (the producers hold the key's lock to COMMIT). */
	snprintf(sql, sizeof(sql),
	         "SELECT id, ordering_key FROM %s WHERE ordering_key IS NOT NULL"
	         " ORDER BY ordering_key, seq",
	         table);
	res = PQexec(pg, sql);
	cr_assert_eq(PQresultStatus(res), PGRES_TUPLES_OK, "%s: %s", what, PQerrorMessage(pg));
	rows = (size_t)PQntuples(res);
	again = calloc(rows + 1, sizeof(*again));
	cr_assert_not_null(again);
	for (size_t i = 0; i < rows; i++) {
		const struct consumer_msg *m = consumer_find(c, PQgetvalue(res, (int)i, 0));

		json_object_set_new(key_of, PQgetvalue(res, (int)i, 0),
		                    json_integer((json_int_t)i));
		/* A row the broker first handed to this consumer as a redelivery had gone to a
		 * connection of it that dropped before reading it. RabbitMQ puts such messages back
		 * in the order they came back, not in queue order (quorum queues serve them before
		 * the rest: rabbitmq-server#6804), so a later row of its key, delivered fresh
		 * meanwhile, may arrive before it. What the relay ordered is what reached the
		 * queue; these rows are left out of the order check (every row must still
		 * arrive) and counted. */
		again[i] = m != NULL && m->redelivered;
		n_again += again[i];
	}
	/* next[key] = the row number the key's next first delivery must be (a row left out of
	 * the check is stepped over). */
	for (size_t i = rows; i-- > 0;) {
		if (!again[i])
			json_object_set_new(next, PQgetvalue(res, (int)i, 1),
			                    json_integer((json_int_t)i));
	}
	while ((got = consumer_deliveries(c, from, ids, NULL, DELIVERY_CHUNK)) > 0) {
		for (size_t i = 0; i < got; i++) {
			json_t *row = json_object_get(key_of, ids[i]);
			const char *key;
			json_int_t want, have, after;

			if (row == NULL || json_object_get(seen, ids[i]) != NULL)
				continue; /* not keyed, or a duplicate */
			json_object_set_new(seen, ids[i], json_true());
			checked++;
			have = json_integer_value(row);
			if (again[have])
				continue;
			key = PQgetvalue(res, (int)have, 1);
			want = json_integer_value(json_object_get(next, key));
			if (have != want) {
				first_delivery_text(c, ids[i], early, sizeof(early));
				first_delivery_text(c, PQgetvalue(res, (int)want, 0), late,
				                    sizeof(late));
			}
			cr_assert_eq(
			        have, want,
			        "%s: key '%s': '%s' (seq order %lld) arrived first, before '%s' "
			        "(seq order %lld), which was committed before it (first "
			        "deliveries: '%s' %s, '%s' %s; consumer reconnects %zu)",
			        what, key, ids[i], (long long)have, PQgetvalue(res, (int)want, 0),
			        (long long)want, ids[i], early, PQgetvalue(res, (int)want, 0), late,
			        consumer_reconnects(c));
			after = want + 1;
			while ((size_t)after < rows && again[after] &&
			       strcmp(PQgetvalue(res, (int)after, 1), key) == 0)
				after++;
			json_object_set_new(next, key, json_integer(after));
		}
		from += got;
	}
	cr_assert_eq(checked, rows, "%s: %zu of the table's %zu keyed rows arrived", what, checked,
	             rows);
	if (n_again > 0)
		fprintf(stderr,
		        "%s: %zu keyed rows first arrived as redeliveries (after a consumer "
		        "reconnect), left out of the order check\n",
		        what, n_again);
	free(again);
	json_decref(key_of);
	json_decref(seen);
	json_decref(next);
	PQclear(res);
	return rows;
}
