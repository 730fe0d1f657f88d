/* The broker's limit: rabbitmq-c alone publishing persistent messages to a durable classic
 * queue with confirms and LIMIT_WINDOW in flight, no database; what the relay is held to.
 * Also the broker's CPU per message here, to set against the relay run's. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <amqp.h>
#include <amqp_framing.h>

#include "bench/bench.h"
#include "bench/cpu.h"
#include "bench/mq.h"

#define LIMIT_WINDOW 1000 /* publishes in flight */

void measure_limit(struct bench *b)
{
	const char *what = "limit", *q = "bench_limit";
	struct consumer *k = NULL;
	amqp_connection_state_t c = NULL;
	amqp_basic_properties_t p;
	unsigned char *acked = NULL;
	long n = b->opt.n_tput, sent = 0, confirmed = 0, floor_tag = 0, nacked = 0;
	char body[BENCH_BODY_LEN], id[32], err[256];
	int64_t t0, deadline;
	double rate;
	struct cpu_sample ca, cz;
	struct cpu_cost cost;

	/* A consumer drains the queue as in production, so the broker pages nothing out. */
	if (mq_fresh_queue(b, what, q) != 0 || mq_consume(b, what, q, NULL, NULL, &k) != 0)
		return;
	acked = calloc((size_t)n + 1, 1);
	c = mq_open(b, err, sizeof(err));
	if (!acked || !c) {
		bench_fail(b, what, "%s", acked ? err : "out of memory");
		goto out;
	}
	amqp_confirm_select(c, 1);
	if (amqp_get_rpc_reply(c).reply_type != AMQP_RESPONSE_NORMAL) {
		bench_fail(b, what, "confirm.select refused");
		goto out;
	}
	memset(body, 'x', sizeof(body));
	mq_relay_properties(&p);
	cpu_sample(&ca, 0);
	t0 = bench_mono_us();
	deadline = t0 + (60 + n / 500) * 1000000LL;
	while (confirmed < n) {
		amqp_frame_t f;
		struct timeval tv = { 0, 0 };
		int rc;

		if (bench_interrupted() || bench_mono_us() > deadline) {
			bench_fail(b, what, "timed out with %ld of %ld confirmed", confirmed, n);
			goto out;
		}
		while (sent < n && sent - confirmed < LIMIT_WINDOW) {
			amqp_bytes_t bb = { sizeof(body), body };

			snprintf(id, sizeof(id), "l%ld", sent + 1);
			p.message_id = amqp_cstring_bytes(id);
			if (amqp_basic_publish(c, 1, amqp_empty_bytes, amqp_cstring_bytes(q), 1, 0,
			                       &p, bb) != AMQP_STATUS_OK) {
				bench_fail(b, what, "publish failed");
				goto out;
			}
			sent++;
		}
		/* Block for the next frame only when the window is full or everything is sent. */
		if (sent < n && sent - confirmed < LIMIT_WINDOW)
			continue;
		tv.tv_sec = 1;
		rc = amqp_simple_wait_frame_noblock(c, &f, &tv);
		if (rc == AMQP_STATUS_TIMEOUT)
			continue;
		if (rc != AMQP_STATUS_OK) {
			bench_fail(b, what, "reading confirms: %s", amqp_error_string2(rc));
			goto out;
		}
		if (f.frame_type != AMQP_FRAME_METHOD)
			continue;
		if (f.payload.method.id == AMQP_BASIC_ACK_METHOD) {
			amqp_basic_ack_t *a = f.payload.method.decoded;

			mq_count_confirm(a->delivery_tag, a->multiple, sent, acked, &confirmed,
			                 &floor_tag, n);
		} else if (f.payload.method.id == AMQP_BASIC_NACK_METHOD) {
			amqp_basic_nack_t *a = f.payload.method.decoded;

			nacked++;
			mq_count_confirm(a->delivery_tag, a->multiple, sent, acked, &confirmed,
			                 &floor_tag, n);
		} else {
			bench_fail(b, what, "unexpected method 0x%08x from the broker",
			           f.payload.method.id);
			goto out;
		}
	}
	rate = (double)n / ((double)(bench_mono_us() - t0) / 1e6);
	/* The CPU ends where the relay run's does, once the consumer has every message: the
	 * broker's deliveries are part of its cost per message. */
	deadline = bench_mono_us() + 10000000;
	while ((long)consumer_received(k) < n && bench_mono_us() < deadline && !bench_interrupted())
		bench_sleep_ms(5);
	cpu_sample(&cz, 0);
	bench_set(b, "limit", rate);
	printf("limit: %ld msgs of %d B, persistent, durable classic queue, confirms, %d in "
	       "flight: %.0f msgs/s (%ld nacked)\n",
	       n, BENCH_BODY_LEN, LIMIT_WINDOW, rate, nacked);
	cpu_cost(&ca, &cz, n, &cost);
	cpu_print(what, &cost, false);
out:
	if (c)
		mq_close(c);
	free(acked);
	consumer_stop(k);
}
