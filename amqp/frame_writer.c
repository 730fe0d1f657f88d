/* A batch's publishes written 64 kB at a time: rabbitmq-c writes every frame of a message
 * (method, content header, body) with a send() of its own, and those system calls were most
 * of the relay's CPU per message. On a plain TCP connection the frames are encoded here, with
 * rabbitmq-c's own encoders, into one buffer that is written when it holds 64 kB or the batch
 * is written. A TLS connection keeps rabbitmq-c's path (its socket is the library's). */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <amqp.h>
#include <amqp_framing.h>

#include "amqp/broker_private.h"

#define FRAME_HEADER 7 /* type, channel, payload size */
#define FRAME_END    0xCE
#define OUT_FLUSH_AT (64 * 1024) /* buffered bytes that make an append write them out */
#define METHOD_ARGS  (2 + 1 + 255 + 1 + 255 + 1) /* basic.publish's arguments at most */
#define HEADER_FIXED 12                          /* class, weight, body size */
#define PROPS_ROOM   4096 /* encoded properties tried first; up to a frame when they need it */

static void put16(unsigned char *p, uint16_t v)
{
	p[0] = (unsigned char)(v >> 8);
	p[1] = (unsigned char)v;
}

static void put32(unsigned char *p, uint32_t v)
{
	put16(p, (uint16_t)(v >> 16));
	put16(p + 2, (uint16_t)v);
}

static void put64(unsigned char *p, uint64_t v)
{
	put32(p, (uint32_t)(v >> 32));
	put32(p + 4, (uint32_t)v);
}

static int reserve(struct broker *b, size_t more)
{
	size_t cap = b->out_cap ? b->out_cap : OUT_FLUSH_AT * 2;
	unsigned char *p;

	if (b->out_len + more <= b->out_cap)
		return BROKER_OK;
	while (cap < b->out_len + more)
		cap *= 2;
	p = realloc(b->out, cap);
	if (!p) {
		broker_set_err(b, "out of memory");
		return BROKER_ERR_NOMEM;
	}
	b->out = p;
	b->out_cap = cap;
	return BROKER_OK;
}

/* Starts a frame of type on channel ch at the end of the buffer (room reserved by the
 * caller); the payload follows, then end_frame(). */
static size_t begin_frame(struct broker *b, uint8_t type, amqp_channel_t ch)
{
	size_t at = b->out_len;

	b->out[at] = type;
	put16(b->out + at + 1, ch);
	b->out_len += FRAME_HEADER;
	return at;
}

static void end_frame(struct broker *b, size_t at)
{
	put32(b->out + at + 3, (uint32_t)(b->out_len - at - FRAME_HEADER));
	b->out[b->out_len++] = FRAME_END;
}

bool broker_out_direct(const struct broker *b)
{
	return b->connected && b->cur_node < b->nnodes && !b->nodes[b->cur_node].ci.ssl;
}

int broker_out_append(struct broker *b, amqp_channel_t ch, amqp_bytes_t exchange,
                      amqp_bytes_t routing_key, const amqp_basic_properties_t *props,
                      amqp_bytes_t body)
{
	size_t frame_max = (size_t)amqp_get_frame_max(b->conn), start = b->out_len, at, chunk;
	amqp_basic_publish_t m = { .exchange = exchange,
		                   .routing_key = routing_key,
		                   .mandatory = 1 };
	amqp_bytes_t room;
	int rc, w;

	if (frame_max <= FRAME_HEADER + 1 + HEADER_FIXED)
		return 0;
	/* The method frame. */
	if ((rc = reserve(b, FRAME_HEADER + 4 + METHOD_ARGS + 1)) != BROKER_OK)
		return rc;
	at = begin_frame(b, AMQP_FRAME_METHOD, ch);
	put32(b->out + b->out_len, AMQP_BASIC_PUBLISH_METHOD);
	b->out_len += 4;
	room.bytes = b->out + b->out_len;
	room.len = METHOD_ARGS;
	w = amqp_encode_method(AMQP_BASIC_PUBLISH_METHOD, &m, room);
	if (w < 0)
		goto unencodable;
	b->out_len += (size_t)w;
	end_frame(b, at);
	/* The content header: the properties within one frame, as rabbitmq-c's own buffer; room
	 * for the usual few hundred bytes first, so that the buffer keeps its size. */
	for (size_t most = frame_max - FRAME_HEADER - HEADER_FIXED - 1,
	            room_len = most < PROPS_ROOM ? most : PROPS_ROOM;
	     ; room_len = most) {
		if ((rc = reserve(b, FRAME_HEADER + HEADER_FIXED + room_len + 1)) != BROKER_OK)
			goto fail;
		at = begin_frame(b, AMQP_FRAME_HEADER, ch);
		put16(b->out + b->out_len, AMQP_BASIC_CLASS);
		put16(b->out + b->out_len + 2, 0);
		put64(b->out + b->out_len + 4, (uint64_t)body.len);
		b->out_len += HEADER_FIXED;
		room.bytes = b->out + b->out_len;
		room.len = room_len;
		w = amqp_encode_properties(AMQP_BASIC_CLASS, (void *)props, room);
		if (w >= 0)
			break;
		b->out_len = at;
		if (room_len == most)
			goto unencodable;
	}
	b->out_len += (size_t)w;
	end_frame(b, at);
	/* The body, in frames of at most frame_max. */
	for (size_t off = 0; off < body.len; off += chunk) {
		chunk = body.len - off;
		if (chunk > frame_max - FRAME_HEADER - 1)
			chunk = frame_max - FRAME_HEADER - 1;
		if ((rc = reserve(b, FRAME_HEADER + chunk + 1)) != BROKER_OK)
			goto fail;
		at = begin_frame(b, AMQP_FRAME_BODY, ch);
		memcpy(b->out + b->out_len, (const char *)body.bytes + off, chunk);
		b->out_len += chunk;
		end_frame(b, at);
	}
	if (b->out_len >= OUT_FLUSH_AT && (rc = broker_out_flush(b)) != BROKER_OK)
		return rc;
	return 1;
unencodable:
	b->out_len = start;
	return 0;
fail:
	b->out_len = start;
	return rc;
}

int broker_out_flush(struct broker *b)
{
	size_t off = 0;
	int fd = b->conn ? amqp_get_sockfd(b->conn) : -1;

	if (fd < 0 && b->out_len > 0) {
		b->out_len = 0;
		return broker_io_failed(b, "publishing", AMQP_STATUS_SOCKET_ERROR);
	}
	while (off < b->out_len) {
		ssize_t w = send(fd, b->out + off, b->out_len - off, MSG_NOSIGNAL);

		if (w > 0) {
			off += (size_t)w;
			continue;
		}
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			/* As rabbitmq-c's own send: no deadline but the shutdown's. */
			int rc = broker_wait_fd(b, fd, POLLOUT, INT64_MAX, "publishing");

			if (rc < 0) {
				b->out_len = 0;
				return rc;
			}
			continue;
		}
		b->out_len = 0;
		return broker_io_failed(b, "publishing", AMQP_STATUS_SOCKET_ERROR);
	}
	b->out_len = 0;
	return BROKER_OK;
}
