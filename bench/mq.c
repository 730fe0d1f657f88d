/* The benchmark's RabbitMQ (mq.h): a rabbitmq-c connection for publishing and declaring, and
 * the measuring consumer set up on bench/drive/consumer.c. */
#include "bench/mq.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <amqp_framing.h>
#include <amqp_tcp_socket.h>

/* How long mq_consume() waits for basic.consume. */
#define MQ_CONSUME_START_MS 15000

const char *mq_reply_text(amqp_rpc_reply_t r, char *buf, size_t len)
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

void mq_relay_properties(amqp_basic_properties_t *p)
{
	memset(p, 0, sizeof(*p));
	p->_flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
	            AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TIMESTAMP_FLAG;
	p->content_type = amqp_cstring_bytes("application/json");
	p->delivery_mode = 2;
	p->timestamp = (uint64_t)time(NULL);
}

void mq_count_confirm(uint64_t tag, bool multiple, long sent, unsigned char *acked, long *confirmed,
                      long *floor_tag, long n)
{
	if (tag > (uint64_t)sent)
		return;
	if (multiple) {
		for (long t = *floor_tag + 1; t <= (long)tag; t++)
			if (!acked[t]) {
				acked[t] = 1;
				(*confirmed)++;
			}
	} else if (!acked[tag]) {
		acked[tag] = 1;
		(*confirmed)++;
	}
	while (*floor_tag < n && acked[*floor_tag + 1])
		(*floor_tag)++;
}

amqp_connection_state_t mq_open(const struct bench *b, char *err, size_t errlen)
{
	struct amqp_connection_info ci;
	amqp_connection_state_t c = NULL;
	amqp_socket_t *s;
	amqp_rpc_reply_t r;
	char *url = strdup(b->opt.amqp);
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
		mq_reply_text(r, err, errlen);
		goto fail;
	}
	amqp_channel_open(c, 1);
	r = amqp_get_rpc_reply(c);
	if (r.reply_type != AMQP_RESPONSE_NORMAL) {
		mq_reply_text(r, err, errlen);
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

void mq_close(amqp_connection_state_t c)
{
	if (!c)
		return;
	amqp_channel_close(c, 1, AMQP_REPLY_SUCCESS);
	amqp_connection_close(c, AMQP_REPLY_SUCCESS);
	amqp_destroy_connection(c);
}

void mq_server_version(amqp_connection_state_t c, char *out, size_t outlen)
{
	const amqp_table_t *t = amqp_get_server_properties(c);

	for (int i = 0; t && i < t->num_entries; i++) {
		const amqp_table_entry_t *e = &t->entries[i];

		if (e->key.len == 7 && memcmp(e->key.bytes, "version", 7) == 0 &&
		    e->value.kind == AMQP_FIELD_KIND_UTF8)
			snprintf(out, outlen, "%.*s", (int)e->value.value.bytes.len,
			         (const char *)e->value.value.bytes.bytes);
	}
}

int mq_fresh_queue(struct bench *b, const char *what, const char *name)
{
	char err[256];
	amqp_connection_state_t c = mq_open(b, err, sizeof(err));
	amqp_table_entry_t arg;
	amqp_table_t args = { 1, &arg };
	amqp_rpc_reply_t r;
	int rc = 0;

	if (!c) {
		bench_fail(b, what, "RabbitMQ: %s", err);
		return -1;
	}
	amqp_queue_delete(c, 1, amqp_cstring_bytes(name), 0, 0);
	r = amqp_get_rpc_reply(c);
	if (r.reply_type == AMQP_RESPONSE_NORMAL) {
		/* Classic whatever the broker's default: the figures are for classic queues. */
		arg.key = amqp_cstring_bytes("x-queue-type");
		arg.value.kind = AMQP_FIELD_KIND_UTF8;
		arg.value.value.bytes = amqp_cstring_bytes("classic");
		amqp_queue_declare(c, 1, amqp_cstring_bytes(name), 0, 1, 0, 0, args);
		r = amqp_get_rpc_reply(c);
	}
	if (r.reply_type != AMQP_RESPONSE_NORMAL) {
		bench_fail(b, what, "could not declare queue '%s': %s", name,
		           mq_reply_text(r, err, sizeof(err)));
		rc = -1;
	}
	mq_close(c);
	return rc;
}

int mq_consume(struct bench *b, const char *what, const char *name, consumer_delivery_fn fn,
               void *arg, struct consumer **out)
{
	/* A lost delivery must fail the measurement at once rather than let it wait for a
	 * count that never comes: hence no reconnection (no-ack loses what is in flight). */
	const struct consumer_options opt = {
		.no_ack = true,
		.count_only = true,
		.existing_queue = true,
		.no_reconnect = true,
		.start_timeout_ms = MQ_CONSUME_START_MS,
		.on_delivery = fn,
		.arg = arg,
	};
	char err[512];

	if (consumer_open_with(out, b->opt.amqp, name, NULL, NULL, NULL, &opt, err, sizeof(err)) !=
	    0) {
		bench_fail(b, what, "%s", err);
		return -1;
	}
	return 0;
}

int mq_consumer_check(struct bench *b, struct consumer *k, const char *what)
{
	char err[256];

	if (!consumer_failed(k, err, sizeof(err)))
		return 0;
	bench_fail(b, what, "consumer failed: %s", err);
	return -1;
}
