/* The stand-in for a relay that costs nothing (direct.h): the producers' commits queue up as
 * ranges of row indexes; one thread publishes each as soon as it is queued, and reads the
 * broker's confirms only when DIRECT_WINDOW are outstanding or the run ends (the stand-in must
 * not cost more than the relay it stands for, or the floor would be too high). */
#include "bench/direct.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <amqp.h>
#include <amqp_framing.h>

#include "bench/latency.h"
#include "bench/mq.h"

#define DIRECT_WINDOW          1000      /* publishes in flight, as the limit run */
#define DIRECT_CONFIRM_WAIT_US 30000000L /* a full window with no confirm this long fails */

struct direct_range {
	long first, n;
};

struct direct {
	pthread_t thread;
	bool started;
	amqp_connection_state_t conn;
	char queue[64];

	pthread_mutex_t lock;
	pthread_cond_t more;
	struct direct_range *ranges; /* pushed, in the order their commits returned */
	long pushed, taken;          /* ranges, at most rows of them */
	bool stopping;
	int64_t stop_by_us; /* with stopping: give up on what is left after this */

	/* The publishing thread's alone until it ends. */
	unsigned char *acked; /* by delivery tag, 1 .. rows */
	long rows, sent, confirmed, floor_tag, nacked;
	char err[256];
};

/* Reads one frame if one comes within timeout_us (0: only what is there); counts confirms.
 * -1 with d->err set on a broken connection or an unexpected method. */
static int read_confirms(struct direct *d, long timeout_us)
{
	struct timeval tv = { timeout_us / 1000000, timeout_us % 1000000 };
	amqp_frame_t f;
	int rc = amqp_simple_wait_frame_noblock(d->conn, &f, &tv);

	if (rc == AMQP_STATUS_TIMEOUT)
		return 0;
	if (rc != AMQP_STATUS_OK) {
		snprintf(d->err, sizeof(d->err), "reading confirms: %s", amqp_error_string2(rc));
		return -1;
	}
	if (f.frame_type != AMQP_FRAME_METHOD)
		return 0;
	if (f.payload.method.id == AMQP_BASIC_ACK_METHOD) {
		amqp_basic_ack_t *a = f.payload.method.decoded;

		mq_count_confirm(a->delivery_tag, a->multiple, d->sent, d->acked, &d->confirmed,
		                 &d->floor_tag, d->rows);
	} else if (f.payload.method.id == AMQP_BASIC_NACK_METHOD) {
		amqp_basic_nack_t *a = f.payload.method.decoded;

		d->nacked++;
		mq_count_confirm(a->delivery_tag, a->multiple, d->sent, d->acked, &d->confirmed,
		                 &d->floor_tag, d->rows);
	} else {
		snprintf(d->err, sizeof(d->err), "unexpected method 0x%08x from the broker",
		         f.payload.method.id);
		return -1;
	}
	return 0;
}

static int publish_range(struct direct *d, const struct direct_range *r, amqp_basic_properties_t *p)
{
	char body[BENCH_BODY_LEN + 1], id[32];
	int fd = amqp_get_sockfd(d->conn), on = 1, off = 0, rc = 0;

	/* A commit's rows leave in as few segments as the relay's batch does (it corks too). */
	(void)setsockopt(fd, IPPROTO_TCP, TCP_CORK, &on, sizeof(on));
	for (long i = r->first; i < r->first + r->n && rc == 0; i++) {
		amqp_bytes_t bb = { BENCH_BODY_LEN, body };

		for (int64_t since = bench_mono_us();
		     rc == 0 && d->sent - d->confirmed >= DIRECT_WINDOW;) {
			rc = read_confirms(d, 1000000);
			if (rc == 0 && bench_mono_us() - since > DIRECT_CONFIRM_WAIT_US) {
				snprintf(d->err, sizeof(d->err),
				         "no confirm for %d s with %d in flight",
				         (int)(DIRECT_CONFIRM_WAIT_US / 1000000), DIRECT_WINDOW);
				rc = -1;
			}
		}
		if (rc != 0)
			break;
		latency_body(body, i, bench_mono_us());
		snprintf(id, sizeof(id), "l%ld", i);
		p->message_id = amqp_cstring_bytes(id);
		if (amqp_basic_publish(d->conn, 1, amqp_empty_bytes, amqp_cstring_bytes(d->queue),
		                       1, 0, p, bb) != AMQP_STATUS_OK) {
			snprintf(d->err, sizeof(d->err), "publishing row %ld failed", i);
			rc = -1;
		} else {
			d->sent++;
		}
	}
	(void)setsockopt(fd, IPPROTO_TCP, TCP_CORK, &off, sizeof(off));
	return rc;
}

static void *direct_main(void *arg)
{
	struct direct *d = arg;
	amqp_basic_properties_t p;

	mq_relay_properties(&p);
	for (;;) {
		struct direct_range r = { 0, 0 };
		bool stopping;
		int64_t stop_by;

		pthread_mutex_lock(&d->lock);
		if (d->taken < d->pushed)
			r = d->ranges[d->taken++];
		stopping = d->stopping;
		stop_by = d->stop_by_us;
		pthread_mutex_unlock(&d->lock);
		if (r.n > 0) {
			if (publish_range(d, &r, &p) != 0)
				return NULL;
			continue;
		}
		if (stopping && d->confirmed == d->sent)
			return NULL;
		if (stopping && bench_mono_us() > stop_by) {
			snprintf(d->err, sizeof(d->err), "%ld of %ld publishes unconfirmed",
			         d->sent - d->confirmed, d->sent);
			return NULL;
		}
		if (stopping) {
			if (read_confirms(d, 100000) != 0)
				return NULL;
			continue;
		}
		/* Confirms wait in the socket until the window is full or the run ends: reading
		 * them costs a poll a publish, more than the relay spends on them. */
		pthread_mutex_lock(&d->lock);
		if (d->taken == d->pushed && !d->stopping)
			pthread_cond_wait(&d->more, &d->lock);
		pthread_mutex_unlock(&d->lock);
	}
}

static void direct_free(struct direct *d)
{
	if (d->conn)
		mq_close(d->conn);
	pthread_mutex_destroy(&d->lock);
	pthread_cond_destroy(&d->more);
	free(d->ranges);
	free(d->acked);
	free(d);
}

struct direct *direct_start(const struct bench *b, const char *queue, long rows, char *err,
                            size_t errlen)
{
	struct direct *d = calloc(1, sizeof(*d));

	if (!d) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	pthread_mutex_init(&d->lock, NULL);
	pthread_cond_init(&d->more, NULL);
	snprintf(d->queue, sizeof(d->queue), "%s", queue);
	d->rows = rows;
	d->ranges = calloc((size_t)rows, sizeof(*d->ranges));
	d->acked = calloc((size_t)rows + 1, 1);
	if (!d->ranges || !d->acked) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	if (!(d->conn = mq_open(b, err, errlen)))
		goto fail;
	amqp_confirm_select(d->conn, 1);
	if (amqp_get_rpc_reply(d->conn).reply_type != AMQP_RESPONSE_NORMAL) {
		snprintf(err, errlen, "confirm.select refused");
		goto fail;
	}
	if (pthread_create(&d->thread, NULL, direct_main, d) != 0) {
		snprintf(err, errlen, "could not start the publishing thread");
		goto fail;
	}
	d->started = true;
	return d;
fail:
	direct_free(d);
	return NULL;
}

void direct_push(struct direct *d, long first, long n)
{
	pthread_mutex_lock(&d->lock);
	if (d->pushed < d->rows) {
		d->ranges[d->pushed++] = (struct direct_range){ first, n };
		pthread_cond_signal(&d->more);
	}
	pthread_mutex_unlock(&d->lock);
}

int direct_stop(struct direct *d, int64_t wait_ms, char *err, size_t errlen)
{
	int rc = 0;

	if (!d)
		return 0;
	pthread_mutex_lock(&d->lock);
	d->stopping = true;
	d->stop_by_us = bench_mono_us() + wait_ms * 1000;
	pthread_cond_signal(&d->more);
	pthread_mutex_unlock(&d->lock);
	if (d->started)
		pthread_join(d->thread, NULL);
	if (d->err[0]) {
		snprintf(err, errlen, "%s", d->err);
		rc = -1;
	} else if (d->nacked) {
		snprintf(err, errlen, "the broker nacked %ld of %ld publishes", d->nacked, d->sent);
		rc = -1;
	}
	direct_free(d);
	return rc;
}
