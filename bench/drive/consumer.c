/* The consumer driver the benchmark and the tests share: one rabbitmq-c connection on its own
 * thread that records every delivery (copied, headers as JSON) for the caller to query, and
 * reconnects after broker restarts so that fault tests can count messages across them. Needs
 * neither criterion nor the test harness. */
#include "bench/drive/consumer.h"

#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CONSUMER_PREFETCH 1000
/* A frame wait this long is also how quickly the thread notices consumer_stop(). */
#define CONSUMER_POLL_US 100000
/* How long consumer_open() waits for the first basic.consume. */
#define CONSUMER_START_MS 20000
/* With url_list: how long one request may take before the consumer tries the next node. */
#define CONSUMER_RPC_TIMEOUT_S 10

struct entry {
	struct consumer_msg *first;
	size_t count;
};

struct consumer {
	char *url, *queue, *exchange, *exchange_type, *routing_key;
	pthread_t thread;
	atomic_bool stop;
	atomic_int ready; /* 0 connecting, 1 consuming, -1 gave up before the first consume */
	atomic_size_t connects;
	struct consumer_options opt;
	atomic_size_t counted; /* deliveries handled, whatever the options */
	atomic_bool failed;    /* no_reconnect: the thread ended on an error */
	size_t url_next;       /* url_list: the node of the next connection (consumer thread) */

	pthread_mutex_t mu; /* guards everything below */
	json_t *index;      /* message id -> index into entries */
	struct entry *entries;
	size_t n_entries, cap_entries;
	char **order; /* id of each delivery, arrival order */
	size_t n_order, cap_order;
	int64_t *order_ms; /* when each delivery was recorded (CLOCK_MONOTONIC) */
	size_t cap_order_ms;
	char last_error[256];
};

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t clock_us(clockid_t clock)
{
	struct timespec ts;

	clock_gettime(clock, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void sleep_ms(int64_t ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000 };

	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static char *dup_bytes(amqp_bytes_t b)
{
	char *s = malloc(b.len + 1);

	if (s == NULL)
		abort();
	if (b.len)
		memcpy(s, b.bytes, b.len);
	s[b.len] = '\0';
	return s;
}

static char *dup_str(const char *s)
{
	char *d = s ? strdup(s) : NULL;

	if (s && d == NULL)
		abort();
	return d;
}

static json_t *field_to_json(const amqp_field_value_t *v);

static json_t *table_to_json(const amqp_table_t *t)
{
	json_t *o = json_object();

	for (int i = 0; i < t->num_entries; i++) {
		char *key = dup_bytes(t->entries[i].key);

		json_object_set_new_nocheck(o, key, field_to_json(&t->entries[i].value));
		free(key);
	}
	return o;
}

/* Every AMQP field kind, so a test sees exactly what the relay sent (an int header sent as a
 * 32-bit value still compares equal to its JSON integer). */
static json_t *field_to_json(const amqp_field_value_t *v)
{
	switch (v->kind) {
	case AMQP_FIELD_KIND_BOOLEAN:
		return json_boolean(v->value.boolean);
	case AMQP_FIELD_KIND_I8:
		return json_integer(v->value.i8);
	case AMQP_FIELD_KIND_U8:
		return json_integer(v->value.u8);
	case AMQP_FIELD_KIND_I16:
		return json_integer(v->value.i16);
	case AMQP_FIELD_KIND_U16:
		return json_integer(v->value.u16);
	case AMQP_FIELD_KIND_I32:
		return json_integer(v->value.i32);
	case AMQP_FIELD_KIND_U32:
		return json_integer(v->value.u32);
	case AMQP_FIELD_KIND_I64:
		return json_integer(v->value.i64);
	case AMQP_FIELD_KIND_U64:
		return json_integer((json_int_t)v->value.u64);
	case AMQP_FIELD_KIND_TIMESTAMP:
		return json_integer((json_int_t)v->value.u64);
	case AMQP_FIELD_KIND_F32:
		return json_real(v->value.f32);
	case AMQP_FIELD_KIND_F64:
		return json_real(v->value.f64);
	case AMQP_FIELD_KIND_DECIMAL: {
		double d = v->value.decimal.value;

		for (int i = 0; i < v->value.decimal.decimals; i++)
			d /= 10.0;
		return json_real(d);
	}
	case AMQP_FIELD_KIND_UTF8:
	case AMQP_FIELD_KIND_BYTES:
		return json_stringn_nocheck(v->value.bytes.bytes, v->value.bytes.len);
	case AMQP_FIELD_KIND_VOID:
		return json_null();
	case AMQP_FIELD_KIND_TABLE:
		return table_to_json(&v->value.table);
	case AMQP_FIELD_KIND_ARRAY: {
		json_t *a = json_array();

		for (int i = 0; i < v->value.array.num_entries; i++)
			json_array_append_new(a, field_to_json(&v->value.array.entries[i]));
		return a;
	}
	default: {
		char kind[32];

		snprintf(kind, sizeof(kind), "<kind %c>", v->kind);
		return json_string(kind);
	}
	}
}

static struct consumer_msg *copy_envelope(const amqp_envelope_t *env)
{
	const amqp_basic_properties_t *p = &env->message.properties;
	struct consumer_msg *m = calloc(1, sizeof(*m));

	if (m == NULL)
		abort();
	m->flags = p->_flags;
	m->exchange = dup_bytes(env->exchange);
	m->routing_key = dup_bytes(env->routing_key);
	m->body = dup_bytes(env->message.body);
	m->body_len = env->message.body.len;
	m->redelivered = env->redelivered;
	m->message_id = p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG ? dup_bytes(p->message_id) : NULL;
#define COPY(flag, field) m->field = p->_flags & (flag) ? dup_bytes(p->field) : NULL
	COPY(AMQP_BASIC_CONTENT_TYPE_FLAG, content_type);
	COPY(AMQP_BASIC_CONTENT_ENCODING_FLAG, content_encoding);
	COPY(AMQP_BASIC_CORRELATION_ID_FLAG, correlation_id);
	COPY(AMQP_BASIC_REPLY_TO_FLAG, reply_to);
	COPY(AMQP_BASIC_EXPIRATION_FLAG, expiration);
	COPY(AMQP_BASIC_TYPE_FLAG, type);
	COPY(AMQP_BASIC_APP_ID_FLAG, app_id);
	COPY(AMQP_BASIC_USER_ID_FLAG, user_id);
	COPY(AMQP_BASIC_CLUSTER_ID_FLAG, cluster_id);
#undef COPY
	m->delivery_mode = p->_flags & AMQP_BASIC_DELIVERY_MODE_FLAG ? p->delivery_mode : 0;
	m->priority = p->_flags & AMQP_BASIC_PRIORITY_FLAG ? p->priority : -1;
	m->timestamp = p->_flags & AMQP_BASIC_TIMESTAMP_FLAG ? (int64_t)p->timestamp : -1;
	m->headers = p->_flags & AMQP_BASIC_HEADERS_FLAG ? table_to_json(&p->headers) : NULL;
	return m;
}

static void free_msg(struct consumer_msg *m)
{
	if (m == NULL)
		return;
	free(m->message_id);
	free(m->exchange);
	free(m->routing_key);
	free(m->body);
	free(m->content_type);
	free(m->content_encoding);
	free(m->correlation_id);
	free(m->reply_to);
	free(m->expiration);
	free(m->type);
	free(m->app_id);
	free(m->user_id);
	free(m->cluster_id);
	json_decref(m->headers);
	free(m);
}

static void grow(void **p, size_t *cap, size_t need, size_t elem)
{
	if (need <= *cap)
		return;
	size_t n = *cap ? *cap * 2 : 1024;

	while (n < need)
		n *= 2;
	*p = realloc(*p, n * elem);
	if (*p == NULL)
		abort();
	*cap = n;
}

static void record(struct consumer *c, struct consumer_msg *m)
{
	const char *id = m->message_id ? m->message_id : "";
	json_t *ix;

	pthread_mutex_lock(&c->mu);
	grow((void **)&c->order, &c->cap_order, c->n_order + 1, sizeof(*c->order));
	grow((void **)&c->order_ms, &c->cap_order_ms, c->n_order + 1, sizeof(*c->order_ms));
	c->order_ms[c->n_order] = now_ms();
	c->order[c->n_order++] = dup_str(id);
	ix = json_object_get(c->index, id);
	if (ix) {
		c->entries[json_integer_value(ix)].count++;
		free_msg(m);
	} else {
		grow((void **)&c->entries, &c->cap_entries, c->n_entries + 1, sizeof(*c->entries));
		c->entries[c->n_entries].first = m;
		c->entries[c->n_entries].count = 1;
		json_object_set_new_nocheck(c->index, id, json_integer((json_int_t)c->n_entries));
		c->n_entries++;
	}
	pthread_mutex_unlock(&c->mu);
}

static void set_error(struct consumer *c, const char *what, amqp_rpc_reply_t r)
{
	char detail[160] = "";

	if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION) {
		snprintf(detail, sizeof(detail), "%s", amqp_error_string2(r.library_error));
	} else if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION) {
		if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
			amqp_channel_close_t *m = r.reply.decoded;

			snprintf(detail, sizeof(detail), "channel closed %u: %.*s", m->reply_code,
			         (int)m->reply_text.len, (const char *)m->reply_text.bytes);
		} else if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
			amqp_connection_close_t *m = r.reply.decoded;

			snprintf(detail, sizeof(detail), "connection closed %u: %.*s",
			         m->reply_code, (int)m->reply_text.len,
			         (const char *)m->reply_text.bytes);
		} else {
			snprintf(detail, sizeof(detail), "server exception 0x%08x", r.reply.id);
		}
	}
	pthread_mutex_lock(&c->mu);
	snprintf(c->last_error, sizeof(c->last_error), "%s: %s", what, detail);
	pthread_mutex_unlock(&c->mu);
}

/* The URL of the next connection: c->url, or with url_list its node number url_next (modulo
 * the number of nodes). New string. */
static char *next_url(const struct consumer *c)
{
	const char *p = c->url, *end;
	size_t n = 1, k;

	if (!c->opt.url_list)
		return dup_str(c->url);
	for (const char *q = c->url; (q = strchr(q, ',')) != NULL; q++)
		n++;
	for (k = c->url_next % n; k > 0; k--)
		p = strchr(p, ',') + 1;
	end = strchr(p, ',');
	return strndup(p, end ? (size_t)(end - p) : strlen(p));
}

/* One connection from login to basic.consume; NULL (and last_error set) on failure. */
static amqp_connection_state_t open_consumer(struct consumer *c)
{
	struct amqp_connection_info ci;
	amqp_connection_state_t conn = amqp_new_connection();
	amqp_socket_t *sock = amqp_tcp_socket_new(conn);
	struct timeval tv = { .tv_sec = 5 };
	struct timeval rpc_tv = { .tv_sec = CONSUMER_RPC_TIMEOUT_S };
	char *url = next_url(c);
	amqp_rpc_reply_t r = { .reply_type = AMQP_RESPONSE_NORMAL };
	amqp_table_entry_t type_arg = {
		.key = amqp_cstring_bytes("x-queue-type"),
		.value = { .kind = AMQP_FIELD_KIND_UTF8,
		           .value = { .bytes = amqp_cstring_bytes(
		                              c->opt.queue_type ? c->opt.queue_type : "") } },
	};
	amqp_table_t args = amqp_empty_table;
	const char *step = "parse url";

	if (url == NULL)
		abort();
	if (c->opt.queue_type) {
		args.num_entries = 1;
		args.entries = &type_arg;
	}
	if (sock == NULL || amqp_parse_url(url, &ci) != AMQP_STATUS_OK)
		goto fail;
	step = "connect";
	if (amqp_socket_open_noblock(sock, ci.host, ci.port, &tv) != AMQP_STATUS_OK)
		goto fail;
	if (c->opt.url_list)
		(void)amqp_set_rpc_timeout(conn, &rpc_tv);
	/* rabbitmq-c reads a trailing "/" as the empty vhost; the tests mean the default one. */
	if (ci.vhost == NULL || ci.vhost[0] == '\0')
		ci.vhost = "/";
	step = "login";
	r = amqp_login(conn, ci.vhost, 0, 131072, 30, AMQP_SASL_METHOD_PLAIN, ci.user, ci.password);
	if (r.reply_type != AMQP_RESPONSE_NORMAL)
		goto fail;
	step = "channel.open";
	amqp_channel_open(conn, 1);
	if ((r = amqp_get_rpc_reply(conn)).reply_type != AMQP_RESPONSE_NORMAL)
		goto fail;
	step = "basic.qos";
	amqp_basic_qos(conn, 1, 0, CONSUMER_PREFETCH, 0);
	if ((r = amqp_get_rpc_reply(conn)).reply_type != AMQP_RESPONSE_NORMAL)
		goto fail;
	if (c->opt.existing_queue)
		goto consume;
	if (c->exchange_type && c->exchange[0]) {
		step = "exchange.declare";
		amqp_exchange_declare(conn, 1, amqp_cstring_bytes(c->exchange),
		                      amqp_cstring_bytes(c->exchange_type), 0, 1, 0, 0,
		                      amqp_empty_table);
		if ((r = amqp_get_rpc_reply(conn)).reply_type != AMQP_RESPONSE_NORMAL)
			goto fail;
	}
	step = "queue.declare";
	amqp_queue_declare(conn, 1, amqp_cstring_bytes(c->queue), 0, 1, 0, 0, args);
	if ((r = amqp_get_rpc_reply(conn)).reply_type != AMQP_RESPONSE_NORMAL)
		goto fail;
	if (c->exchange[0]) {
		step = "queue.bind";
		amqp_queue_bind(conn, 1, amqp_cstring_bytes(c->queue),
		                amqp_cstring_bytes(c->exchange), amqp_cstring_bytes(c->routing_key),
		                amqp_empty_table);
		if ((r = amqp_get_rpc_reply(conn)).reply_type != AMQP_RESPONSE_NORMAL)
			goto fail;
	}
consume:
	step = "basic.consume";
	amqp_basic_consume(conn, 1, amqp_cstring_bytes(c->queue), amqp_empty_bytes, 0,
	                   c->opt.no_ack ? 1 : 0, 0, amqp_empty_table);
	if ((r = amqp_get_rpc_reply(conn)).reply_type != AMQP_RESPONSE_NORMAL)
		goto fail;
	free(url);
	return conn;
fail:
	set_error(c, step, r);
	amqp_destroy_connection(conn);
	free(url);
	c->url_next++; /* url_list: the next node */
	return NULL;
}

/* Best effort on the way out: the dev broker is shared, so queues must not pile up. */
static void cleanup_broker(struct consumer *c, amqp_connection_state_t conn)
{
	amqp_queue_delete(conn, 1, amqp_cstring_bytes(c->queue), 0, 0);
	if (amqp_get_rpc_reply(conn).reply_type != AMQP_RESPONSE_NORMAL)
		return;
	if (c->exchange_type && c->exchange[0]) {
		amqp_exchange_delete(conn, 1, amqp_cstring_bytes(c->exchange), 0);
		amqp_get_rpc_reply(conn);
	}
}

/* Hands env to on_delivery and records it (unless count_only); env is destroyed here. */
static void deliver(struct consumer *c, amqp_envelope_t *env)
{
	struct consumer_msg *m = NULL;

	if (c->opt.on_delivery) {
		/* Stamped before anything else is done with the delivery, so the time is when
		 * it arrived, not when the consumer got round to it. */
		struct consumer_delivery d = {
			.n = atomic_load(&c->counted) + 1,
			.mono_us = clock_us(CLOCK_MONOTONIC),
			.real_us = clock_us(CLOCK_REALTIME),
			.body = env->message.body.bytes,
			.body_len = env->message.body.len,
		};

		c->opt.on_delivery(&d, c->opt.arg);
	}
	if (!c->opt.count_only)
		m = copy_envelope(env);
	amqp_destroy_envelope(env);
	if (m)
		record(c, m);
	atomic_fetch_add(&c->counted, 1);
}

/* no_reconnect: the consumer ends here, with the error for consumer_failed(). */
static bool give_up(struct consumer *c)
{
	if (!c->opt.no_reconnect)
		return false;
	atomic_store(&c->failed, true);
	if (atomic_load(&c->ready) == 0)
		atomic_store(&c->ready, -1);
	return true;
}

static void *consumer_main(void *arg)
{
	struct consumer *c = arg;
	amqp_connection_state_t conn = NULL;

	while (!atomic_load(&c->stop)) {
		amqp_envelope_t env;
		struct timeval tv = { .tv_sec = 0, .tv_usec = CONSUMER_POLL_US };
		amqp_rpc_reply_t r;

		if (conn == NULL) {
			conn = open_consumer(c);
			if (conn == NULL) {
				if (give_up(c))
					break;
				sleep_ms(200);
				continue;
			}
			atomic_fetch_add(&c->connects, 1);
			atomic_store(&c->ready, 1);
		}
		amqp_maybe_release_buffers(conn);
		r = amqp_consume_message(conn, &env, &tv, 0);
		if (r.reply_type == AMQP_RESPONSE_NORMAL) {
			uint64_t tag = env.delivery_tag;

			deliver(c, &env);
			if (c->opt.no_ack)
				continue;
			/* Acked after recording: a delivery lost with the connection comes back as a
			 * redelivery, counted as a duplicate, never missing. */
			if (amqp_basic_ack(conn, 1, tag, 0) != AMQP_STATUS_OK) {
				amqp_destroy_connection(conn);
				conn = NULL;
				c->url_next++;
				if (give_up(c))
					break;
			}
			continue;
		}
		if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
		    r.library_error == AMQP_STATUS_TIMEOUT)
			continue;
		/* Anything else (connection closed, broker shutting down, a method we did not
		 * expect such as basic.cancel): start over with a new connection. */
		set_error(c, "consume", r);
		amqp_destroy_connection(conn);
		conn = NULL;
		c->url_next++;
		if (give_up(c))
			break;
		sleep_ms(100);
	}
	if (conn) {
		if (!c->opt.existing_queue)
			cleanup_broker(c, conn);
		amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
		amqp_destroy_connection(conn);
	}
	return NULL;
}

/* Everything but the thread, which is joined (or was never started) by now. */
static void free_consumer(struct consumer *c)
{
	for (size_t i = 0; i < c->n_entries; i++)
		free_msg(c->entries[i].first);
	for (size_t i = 0; i < c->n_order; i++)
		free(c->order[i]);
	free(c->entries);
	free(c->order);
	free(c->order_ms);
	json_decref(c->index);
	pthread_mutex_destroy(&c->mu);
	free(c->url);
	free(c->queue);
	free(c->exchange);
	free(c->exchange_type);
	free(c->routing_key);
	free(c);
}

int consumer_open(struct consumer **out, const char *url, const char *queue, const char *exchange,
                  const char *exchange_type, const char *routing_key, char *err, size_t errlen)
{
	return consumer_open_with(out, url, queue, exchange, exchange_type, routing_key, NULL, err,
	                          errlen);
}

int consumer_open_with(struct consumer **out, const char *url, const char *queue,
                       const char *exchange, const char *exchange_type, const char *routing_key,
                       const struct consumer_options *opt, char *err, size_t errlen)
{
	struct consumer *c = calloc(1, sizeof(*c));
	int64_t deadline;

	if (c == NULL) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	c->url = dup_str(url);
	c->queue = dup_str(queue);
	c->exchange = dup_str(exchange ? exchange : "");
	c->exchange_type = dup_str(exchange_type);
	c->routing_key = dup_str(routing_key ? routing_key : "");
	c->index = json_object();
	pthread_mutex_init(&c->mu, NULL);
	atomic_init(&c->stop, false);
	atomic_init(&c->ready, 0);
	atomic_init(&c->connects, 0);
	atomic_init(&c->counted, 0);
	atomic_init(&c->failed, false);
	if (opt)
		c->opt = *opt;
	if (pthread_create(&c->thread, NULL, consumer_main, c) != 0) {
		snprintf(err, errlen, "could not start the consumer thread");
		free_consumer(c);
		return -1;
	}
	deadline = now_ms() +
	           (c->opt.start_timeout_ms > 0 ? c->opt.start_timeout_ms : CONSUMER_START_MS);
	while (atomic_load(&c->ready) == 0 && now_ms() < deadline)
		sleep_ms(10);
	if (atomic_load(&c->ready) != 1) {
		pthread_mutex_lock(&c->mu);
		snprintf(err, errlen, "consumer for queue '%s' could not start: %s", queue,
		         c->last_error[0] ? c->last_error : "no connection in time");
		pthread_mutex_unlock(&c->mu);
		consumer_stop(c);
		return -1;
	}
	*out = c;
	return 0;
}

void consumer_stop(struct consumer *c)
{
	if (c == NULL)
		return;
	atomic_store(&c->stop, true);
	pthread_join(c->thread, NULL);
	free_consumer(c);
}

size_t consumer_unique(struct consumer *c)
{
	size_t n;

	pthread_mutex_lock(&c->mu);
	n = c->n_entries;
	pthread_mutex_unlock(&c->mu);
	return n;
}

size_t consumer_received(struct consumer *c)
{
	size_t n;

	if (c->opt.count_only)
		return atomic_load(&c->counted);
	pthread_mutex_lock(&c->mu);
	n = c->n_order;
	pthread_mutex_unlock(&c->mu);
	return n;
}

size_t consumer_duplicates(struct consumer *c)
{
	size_t n;

	pthread_mutex_lock(&c->mu);
	n = c->n_order - c->n_entries;
	pthread_mutex_unlock(&c->mu);
	return n;
}

size_t consumer_reconnects(struct consumer *c)
{
	size_t n = atomic_load(&c->connects);

	return n > 0 ? n - 1 : 0;
}

bool consumer_failed(struct consumer *c, char *err, size_t errlen)
{
	if (!atomic_load(&c->failed))
		return false;
	if (err && errlen > 0) {
		pthread_mutex_lock(&c->mu);
		snprintf(err, errlen, "%s", c->last_error[0] ? c->last_error : "unknown error");
		pthread_mutex_unlock(&c->mu);
	}
	return true;
}

bool consumer_wait_unique(struct consumer *c, size_t n, int64_t timeout_ms)
{
	int64_t deadline = now_ms() + timeout_ms;

	for (;;) {
		if (consumer_unique(c) >= n)
			return true;
		if (now_ms() >= deadline)
			return false;
		sleep_ms(10);
	}
}

const struct consumer_msg *consumer_find(struct consumer *c, const char *id)
{
	const struct consumer_msg *m = NULL;
	json_t *ix;

	pthread_mutex_lock(&c->mu);
	ix = json_object_get(c->index, id);
	if (ix)
		m = c->entries[json_integer_value(ix)].first;
	pthread_mutex_unlock(&c->mu);
	return m;
}

size_t consumer_count(struct consumer *c, const char *id)
{
	size_t n = 0;
	json_t *ix;

	pthread_mutex_lock(&c->mu);
	ix = json_object_get(c->index, id);
	if (ix)
		n = c->entries[json_integer_value(ix)].count;
	pthread_mutex_unlock(&c->mu);
	return n;
}

const char **consumer_order(struct consumer *c, size_t *n)
{
	const char **ids;

	pthread_mutex_lock(&c->mu);
	ids = malloc((c->n_order + 1) * sizeof(*ids));
	if (ids == NULL)
		abort();
	for (size_t i = 0; i < c->n_order; i++)
		ids[i] = c->order[i];
	*n = c->n_order;
	pthread_mutex_unlock(&c->mu);
	return ids;
}

size_t consumer_deliveries(struct consumer *c, size_t from, const char **ids, int64_t *at_ms,
                           size_t max)
{
	size_t n = 0;

	pthread_mutex_lock(&c->mu);
	for (size_t i = from; i < c->n_order && n < max; i++, n++) {
		ids[n] = c->order[i];
		if (at_ms)
			at_ms[n] = c->order_ms[i];
	}
	pthread_mutex_unlock(&c->mu);
	return n;
}

const char **consumer_lost(struct consumer *c, const char *const *expected, size_t n,
                           size_t *n_lost)
{
	const char **lost = malloc((n + 1) * sizeof(*lost));
	size_t k = 0;

	if (lost == NULL)
		abort();
	pthread_mutex_lock(&c->mu);
	for (size_t i = 0; i < n; i++) {
		if (json_object_get(c->index, expected[i]) == NULL)
			lost[k++] = expected[i];
	}
	pthread_mutex_unlock(&c->mu);
	*n_lost = k;
	return lost;
}
