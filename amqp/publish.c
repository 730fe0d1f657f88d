/* Publishing a batch with `mandatory` on the confirm-mode channel: exchanges checked once per
 * connection, retries and large bodies published last, the broker's answers read within
 * confirm_timeout and the batch's lease, and the one row behind a channel close found. */
#include "amqp/broker.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <amqp.h>
#include <amqp_framing.h>

#include "amqp/broker_private.h"
#include "amqp/confirm_tracker.h"
#include "amqp/message_map.h"
#include "base/clock.h"

#define DRAIN_EVERY         128 /* publishes between non-blocking reads of arrived acks */
#define KNOWN_EXCHANGES_MAX 1024

static int64_t batch_wait_end(const struct broker *b);

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
		broker_forget_exchanges(b); /* bounded: start over rather than grow for ever */
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
		rc = broker_open_check_channel(b, deadline_ms);
		if (rc != BROKER_OK)
			return rc;
	}
	memset(&req, 0, sizeof(req));
	req.exchange = amqp_cstring_bytes(name);
	req.type = amqp_cstring_bytes("");
	req.passive = 1;
	req.arguments = amqp_empty_table;
	snprintf(doing, sizeof(doing), "could not check exchange '%s'", name);
	rc = broker_rpc(b, CHECK_CHANNEL, AMQP_EXCHANGE_DECLARE_METHOD, &req,
	                AMQP_EXCHANGE_DECLARE_OK_METHOD, deadline_ms, "checking an exchange", &m);
	broker_release_channel(b, CHECK_CHANNEL);
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
	return broker_rpc_failed(b, rc, doing);
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
	const struct outbox_row *m = &b->msgs[i];
	amqp_bytes_t exchange, rkey;
	char text[128];
	uint64_t tag;
	int rc;

	broker_touch_progress(b, clock_mono_ms());
	if (confirm_tracker_sent(&b->tracker, i, clock_mono_us(), &tag) != CONFIRM_TRACKER_OK) {
		broker_set_err(b, "internal error: row %zu published twice on one channel", i);
		return broker_lost(b);
	}
	exchange = amqp_cstring_bytes(m->exchange != NULL ? m->exchange : "");
	rkey = amqp_cstring_bytes(m->routing_key != NULL ? m->routing_key : "");
	if (broker_out_direct(b)) {
		rc = broker_out_append(b, PUBLISH_CHANNEL, exchange, rkey, &b->props[i],
		                       b->bodies[i]);
		if (rc == 1)
			return b->out_batch ? BROKER_OK : broker_out_flush(b);
		/* Its delivery tag is spent: the channel cannot go on, as when rabbitmq-c fails. */
		if (rc == BROKER_ERR_NOMEM)
			return broker_lost(b);
		if (rc < 0)
			return rc;
		/* Refused by the encoders: rabbitmq-c publishes it, after what is buffered, and
		 * reports why. */
		if ((rc = broker_out_flush(b)) != BROKER_OK)
			return rc;
	}
	rc = amqp_basic_publish(b->conn, PUBLISH_CHANNEL, exchange, rkey, 1, 0, &b->props[i],
	                        b->bodies[i]);
	if (rc == AMQP_STATUS_OK)
		return BROKER_OK;
	if (!atomic_load(&b->interrupted) && !encodable(b, i, text, sizeof(text))) {
		/* The row's fault, not the connection's: it is dead, the others are not charged.
		 * The method frame already went out without its content, so the connection
		 * cannot be used any more. */
		b->res[i].outcome = BROKER_INVALID;
		snprintf(b->res[i].error, sizeof(b->res[i].error),
		         "could not encode the message: %s", text);
		broker_set_err(
		        b,
		        "could not publish row '%.64s' (%s); the connection is dropped and the "
		        "batch's other unanswered rows are released",
		        m->id, text);
		return broker_lost(b);
	}
	return broker_io_failed(b, "publishing", rc);
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
	return b->msgs[i].attempts > 0 || b->bodies[i].len > b->proven_body;
}

_Static_assert(sizeof(((struct broker_result *)0)->trace_id) == MESSAGE_MAP_TRACE_ID_SIZE,
               "broker_result.trace_id holds what message_map_trace_id() writes");

/* Holds a batch's frames in the kernel while they are written, so that they leave in full
 * segments: over TLS rabbitmq-c writes every frame with a send() of its own, and pushing a
 * segment out per message was most of the relay's CPU per message (on plain TCP the frames go
 * out 64 kB at a time anyway: frame_writer.c). Off again once the batch is written, which
 * sends the rest at once. The socket is TCP with or without TLS; a failure changes only the
 * speed. */
static void cork(struct broker *b, int on)
{
	int fd = b->conn ? amqp_get_sockfd(b->conn) : -1; /* NULL: lost while writing */

	if (fd >= 0)
		(void)setsockopt(fd, IPPROTO_TCP, TCP_CORK, &on, sizeof(on));
}

/* Writes the frames buffered so far (frame_writer.c), if any. */
static int write_out(struct broker *b)
{
	return b->out_len > 0 ? broker_out_flush(b) : BROKER_OK;
}

int broker_publish(struct broker *b, const struct outbox_row *msgs, size_t n,
                   struct broker_result *res)
{
	bool corked = false;
	size_t sent = 0, frame_max;
	int rc = BROKER_OK;

	for (size_t i = 0; i < n; i++)
		message_map_trace_id(msgs[i].headers, res[i].trace_id);
	b->active = false;
	if (!b->connected) {
		broker_set_err(b, "not connected to broker");
		return BROKER_ERR_CONN;
	}
	recycle_amqp_pool(&b->pool);
	if (grow_maps(b, n) != BROKER_OK || confirm_tracker_reset(&b->tracker, n) != 0) {
		broker_set_err(b, "out of memory");
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
			broker_set_err(b, "out of memory");
			rc = BROKER_ERR_NOMEM;
			goto out;
		}
	}
	rc = check_exchanges(b);
	if (rc != BROKER_OK)
		goto out;
	if (n > 1) {
		cork(b, 1);
		corked = true;
	}
	b->out_batch = true;
	for (size_t i = 0; i < n && !b->channel_closed; i++) {
		if (res[i].outcome != BROKER_PENDING || deferred(b, i))
			continue;
		rc = publish_row(b, i);
		if (rc != BROKER_OK)
			goto out;
		/* Read acks that have already arrived now and then, so that they do not pile up
		 * in the socket buffer while a large batch is written. */
		if (++sent % DRAIN_EVERY == 0) {
			rc = write_out(b);
			if (rc == BROKER_OK)
				rc = broker_drain(b);
			if (rc != BROKER_OK)
				goto out;
		}
	}
	if (rc == BROKER_OK)
		rc = write_out(b);
out:
	b->out_batch = false;
	b->out_len = 0; /* written, or the connection is gone */
	if (corked)
		cork(b, 0);
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
		broker_set_err(
		        b,
		        "broker blocked the connection (resource alarm) and confirmed nothing more "
		        "for %lld ms: %zu messages without a confirm",
		        (long long)(clock_mono_ms() - b->blocked_since_ms), left);
	else if (b->batch_deadline_ms > 0 && clock_mono_ms() >= b->batch_deadline_ms)
		broker_set_err(b,
		               "the batch's lease ran out before the broker confirmed %zu messages",
		               left);
	else
		broker_set_err(b, "no confirm from broker within %lld ms for %zu messages",
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
		rc = broker_read_frame(b, end, "waiting for confirms");
		if (rc == 0 && clock_mono_ms() >= end)
			return timed_out(b);
		if (rc == BROKER_ERR_ABORTED && !atomic_load(&b->interrupted)) {
			size_t left = confirm_tracker_outstanding(&b->tracker);

			broker_set_err(
			        b,
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
	broker_set_err(b, "broker closed the publish channel: %s", b->close_text);
	return broker_lost(b);
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

/* Row i may be sent now: no outcome yet, never sent, and its body within the broker's limit.
 * A body above the limit gets BROKER_INVALID here, with its error. */
static bool ready_to_send(struct broker *b, size_t i)
{
	struct broker_result *r = &b->res[i];

	if (r->outcome != BROKER_PENDING ||
	    confirm_tracker_state(&b->tracker, i) != CONFIRM_TRACKER_UNSENT)
		return false;
	if (message_map_check_body(b->bodies[i].len, b->max_body, r->error, sizeof(r->error)) !=
	    MESSAGE_MAP_OK) {
		r->outcome = BROKER_INVALID;
		return false;
	}
	return true;
}

/* The broker closed the publish channel because of one publish while several were without
 * an answer. Every row without an answer is published again, one at a time, waiting for each
 * answer, so that the close that comes again names its row; the others get their real
 * outcome. */
static int find_culprit(struct broker *b, int64_t deadline_ms)
{
	int rc;

	broker_forget_exchanges(b); /* a 404 here means an exchange went away after our check */
	rc = broker_open_publish_channel(b, deadline_ms);
	if (rc != BROKER_OK)
		return rc;
	for (size_t i = 0; i < b->n; i++) {
		if (!ready_to_send(b, i))
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
		blame(b, i);
		rc = broker_open_publish_channel(b, deadline_ms);
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
	int rc = BROKER_OK;

	update_proven(b);
	b->out_batch = true;
	for (size_t i = 0; i < b->n && !b->channel_closed; i++) {
		if ((b->msgs[i].attempts > 0) != retry || !ready_to_send(b, i))
			continue;
		if (b->bodies[i].len > b->proven_body) {
			if (sent == 0) {
				rc = publish_row(b, i);
				sent++;
			}
			break;
		}
		rc = publish_row(b, i);
		if (rc == BROKER_OK && ++sent % DRAIN_EVERY == 0 &&
		    (rc = write_out(b)) == BROKER_OK)
			rc = broker_drain(b);
		if (rc != BROKER_OK)
			break;
	}
	if (rc == BROKER_OK)
		rc = write_out(b);
	b->out_batch = false;
	b->out_len = 0;
	if (rc != BROKER_OK)
		return rc;
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
			broker_forget_exchanges(b);
			rc = broker_open_publish_channel(b, deadline_ms);
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

int broker_confirm(struct broker *b, const struct outbox_row *msgs, size_t n,
                   struct broker_result *res)
{
	int64_t deadline_ms = batch_wait_end(b);
	int rc = BROKER_OK;

	if (!b->active || b->msgs != msgs || b->res != res || b->n != n) {
		broker_set_err(b, "broker_confirm() without a matching broker_publish()");
		rc = BROKER_ERR_CONN;
		goto out;
	}
	if (!b->connected) {
		broker_set_err(b, "not connected to broker");
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
				broker_set_err(b, "row %zu has no answer from the broker", i);
				rc = BROKER_ERR_CONN;
				break;
			}
		}
	}
	return rc;
}
