/* Reading and answering the broker's frames (acks, nacks, returns, closes, connection.blocked),
 * methods awaited as RPCs, and opening the channels. Every wait polls the socket here, never
 * inside rabbitmq-c, so the shutdown deadline and broker_interrupt() can end it. */
#include "amqp/broker.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>

#include <amqp.h>
#include <amqp_framing.h>

#include "amqp/broker_private.h"
#include "amqp/confirm_tracker.h"
#include "base/clock.h"

/* The longest single poll() of a wait: progress_ms is stored, and a shutdown deadline set
 * while the wake descriptor could not be used is seen, at least this often. */
#define SLICE_MS 500

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

void broker_release_channel(struct broker *b, amqp_channel_t ch)
{
	if (b->conn != NULL)
		amqp_maybe_release_buffers_on_channel(b->conn, ch);
}

/* Waits until fd is ready for events (1), deadline_ms passes (0), the shutdown deadline
 * passes or broker_interrupt() is called (BROKER_ERR_ABORTED, connection dropped). The
 * shutdown deadline is read again after every wake-up; the wake descriptor is polled only
 * while no deadline is set, since it stays readable once written. */
int broker_wait_fd(struct broker *b, int fd, short events, int64_t deadline_ms, const char *what)
{
	bool use_wake = b->opts.wake_fd >= 0;

	for (;;) {
		struct pollfd p[3];
		nfds_t n = 0;
		int wake_i = -1;
		int64_t now = clock_mono_ms();
		int64_t stop = broker_abort_at(b);
		int64_t end = deadline_ms;
		int rc;

		broker_touch_progress(b, now);
		if (atomic_load(&b->interrupted))
			return broker_interrupted_err(b, what);
		if (stop != 0 && now >= stop) {
			broker_set_err(b, "stopped waiting at the shutdown deadline: %s", what);
			(void)broker_lost(b);
			return BROKER_ERR_ABORTED;
		}
		/* Nothing is in flight while connecting: a stop need not wait for its deadline. */
		if (stop != 0 && b->connecting) {
			broker_set_err(b, "stopped %s: the relay is stopping", what);
			(void)broker_lost(b);
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
			broker_set_err(b, "could not wait for the broker while %s: %s", what,
			               strerror(errno));
			return broker_lost(b);
		}
		if (rc <= 0)
			continue;
		/* Readable before a deadline was set (a stop that sets it only afterwards):
		 * polling it again would spin, so look at the deadline every slice instead. */
		if (wake_i >= 0 && p[wake_i].revents != 0 && broker_abort_at(b) == 0)
			use_wake = false;
		if (p[0].revents != 0)
			return 1;
	}
}

/* Reads the next frame into *f: 1 when one arrived, 0 when deadline_ms passed first (a
 * deadline in the past reads only what has arrived), or an error (connection dropped).
 * rabbitmq-c is only asked for what it can return at once; the waiting is broker_wait_fd()'s. */
static int next_frame(struct broker *b, amqp_frame_t *f, int64_t deadline_ms, const char *what)
{
	/* Not zero: rabbitmq-c notices a missed server heartbeat only when the deadline it is
	 * given is a real time, and 1 us is one it can never wait for. */
	const struct timeval at_once = { 0, 1 };

	for (;;) {
		int rc;

		if (b->conn == NULL) {
			broker_set_err(b, "not connected to broker");
			return BROKER_ERR_CONN;
		}
		rc = amqp_simple_wait_frame_noblock(b->conn, f, &at_once);
		if (rc == AMQP_STATUS_OK)
			return 1;
		if (rc != AMQP_STATUS_TIMEOUT)
			return broker_io_failed(b, what, rc);
		if (clock_mono_ms() >= deadline_ms)
			return 0;
		rc = broker_wait_fd(b, amqp_get_sockfd(b->conn), POLLIN, deadline_ms, what);
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
	broker_set_err(b,
	               "broker returned a message that matches no row waiting for an answer "
	               "(message_id '%.64s'): the batch is abandoned",
	               mid);
	return broker_lost(b);
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
		return broker_lost(b);
	return broker_io_failed(b, "closing a channel", rc);
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
		broker_set_err(b, "connection closed by broker: %s", text);
		(void)send_close_ok(b, 0);
		rc = broker_lost(b);
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
	broker_release_channel(b, f->channel);
	return rc;
}

/* Reads and handles one frame, waiting until deadline_ms at most. Returns 1 when a frame
 * was handled, 0 at the deadline, or an error. */
int broker_read_frame(struct broker *b, int64_t deadline_ms, const char *what)
{
	amqp_frame_t f;
	int rc = next_frame(b, &f, deadline_ms, what);

	if (rc <= 0)
		return rc;
	rc = handle_frame(b, &f);
	return rc == BROKER_OK ? 1 : rc;
}

/* Handles everything already received without waiting for more. */
int broker_drain(struct broker *b)
{
	int rc;

	do {
		rc = broker_read_frame(b, 0, "reading from the broker");
	} while (rc == 1 && !b->channel_closed);
	return rc < 0 ? rc : BROKER_OK;
}

/* Waits for method reply_id on channel ch, handling every other frame on the way (acks,
 * returns, connection.blocked). W_GOT with *out (decoded in the channel's buffers: copy
 * what is needed, then broker_release_channel()), W_DEADLINE, W_CHANNEL_CLOSED (the broker closed
 * ch instead; close-ok sent) or W_CONNECTION_CLOSED (connection dropped), with the reply
 * code and text in rpc_close_*; or an error. */
int broker_wait_method(struct broker *b, amqp_channel_t ch, amqp_method_number_t reply_id,
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
				(void)broker_lost(b);
				return W_CONNECTION_CLOSED;
			}
			if (ch != 0 && f.channel == ch && id == AMQP_CHANNEL_CLOSE_METHOD) {
				const amqp_channel_close_t *c = f.payload.method.decoded;

				b->rpc_close_code = c->reply_code;
				copy_shown(b->rpc_close_text, sizeof(b->rpc_close_text),
				           c->reply_text);
				broker_release_channel(b, ch);
				rc = send_close_ok(b, ch);
				return rc < 0 ? rc : W_CHANNEL_CLOSED;
			}
		}
		rc = handle_frame(b, &f);
		if (rc < 0)
			return rc;
	}
}

/* Sends a method and waits for its reply (see broker_wait_method()). */
int broker_rpc(struct broker *b, amqp_channel_t ch, amqp_method_number_t id, void *req,
               amqp_method_number_t reply_id, int64_t deadline_ms, const char *what,
               amqp_method_t *out)
{
	int rc;

	if (b->conn == NULL) {
		broker_set_err(b, "not connected to broker");
		return BROKER_ERR_CONN;
	}
	rc = amqp_send_method(b->conn, ch, id, req);
	if (rc != AMQP_STATUS_OK)
		return broker_io_failed(b, what, rc);
	return broker_wait_method(b, ch, reply_id, deadline_ms, what, out);
}

/* Turns an broker_rpc() outcome other than W_GOT into an error with "doing: why". */
int broker_rpc_failed(struct broker *b, int rc, const char *doing)
{
	switch (rc) {
	case W_DEADLINE:
		broker_set_err(b, "%s: no answer from %s in time", doing, b->node_name);
		(void)broker_lost(b);
		return BROKER_ERR_TIMEOUT;
	case W_CHANNEL_CLOSED:
		broker_set_err(b, "%s: %s", doing, b->rpc_close_text);
		return broker_lost(b);
	case W_CONNECTION_CLOSED:
		broker_set_err(b, "%s: connection closed by broker: %s", doing, b->rpc_close_text);
		return broker_lost(b);
	default:
		return rc; /* an error, its message set */
	}
}

int broker_open_publish_channel(struct broker *b, int64_t deadline_ms)
{
	amqp_channel_open_t open = { .out_of_band = amqp_empty_bytes };
	amqp_confirm_select_t select = { .nowait = 0 };
	amqp_method_t m;
	int rc;

	rc = broker_rpc(b, PUBLISH_CHANNEL, AMQP_CHANNEL_OPEN_METHOD, &open,
	                AMQP_CHANNEL_OPEN_OK_METHOD, deadline_ms, "opening the publish channel",
	                &m);
	if (rc != W_GOT)
		return broker_rpc_failed(b, rc, "could not open channel");
	broker_release_channel(b, PUBLISH_CHANNEL);
	rc = broker_rpc(b, PUBLISH_CHANNEL, AMQP_CONFIRM_SELECT_METHOD, &select,
	                AMQP_CONFIRM_SELECT_OK_METHOD, deadline_ms, "selecting confirm mode", &m);
	if (rc != W_GOT)
		return broker_rpc_failed(b, rc, "could not select confirm mode");
	broker_release_channel(b, PUBLISH_CHANNEL);
	b->channel_closed = false;
	b->return_pending = false;
	confirm_tracker_channel_reset(&b->tracker);
	return BROKER_OK;
}

int broker_open_check_channel(struct broker *b, int64_t deadline_ms)
{
	amqp_channel_open_t open = { .out_of_band = amqp_empty_bytes };
	amqp_method_t m;
	int rc;

	rc = broker_rpc(b, CHECK_CHANNEL, AMQP_CHANNEL_OPEN_METHOD, &open,
	                AMQP_CHANNEL_OPEN_OK_METHOD, deadline_ms, "opening the check channel", &m);
	if (rc != W_GOT)
		return broker_rpc_failed(b, rc, "could not open channel");
	broker_release_channel(b, CHECK_CHANNEL);
	b->check_open = true;
	return BROKER_OK;
}
