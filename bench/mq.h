/* mq.h — the benchmark's RabbitMQ: a plain rabbitmq-c connection (the limit run publishes on
 * it; bench/drive has none to give), a fresh queue per run, and the measuring consumer
 * (bench/drive/consumer.h without acks, records or reconnections). */
#ifndef OUTBOX_BENCH_MQ_H
#define OUTBOX_BENCH_MQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <amqp.h>

#include "bench/bench.h"
#include "bench/drive/consumer.h"

/* New connection to the benchmark's broker with channel 1 open (close with mq_close()); NULL
 * with the reason in err. */
amqp_connection_state_t mq_open(const struct bench *b, char *err, size_t errlen);
/* Closes channel and connection and frees c; accepts NULL. */
void mq_close(amqp_connection_state_t c);
/* The text of a failed rabbitmq-c call into buf; returns buf. */
const char *mq_reply_text(amqp_rpc_reply_t r, char *buf, size_t len);
/* The broker's "version" server property into out; out unchanged when there is none. */
void mq_server_version(amqp_connection_state_t c, char *out, size_t outlen);

/* The properties the relay sets on every row (DESIGN §5): content type, persistent, a
 * timestamp; message_id is the caller's to set per message. */
void mq_relay_properties(amqp_basic_properties_t *p);
/* Counts the confirms of one basic.ack or basic.nack frame (tag, multiple) of a channel that
 * has sent `sent` of at most n publishes: acked[1..n] marks each tag confirmed, *confirmed
 * counts them, *floor_tag is the highest tag up to which every publish is confirmed (where a
 * multiple=true confirm starts). */
void mq_count_confirm(uint64_t tag, bool multiple, long sent, unsigned char *acked, long *confirmed,
                      long *floor_tag, long n);

/* Deletes and declares queue `name` (durable, classic), so every run starts empty. -1 after
 * bench_fail(what). */
int mq_fresh_queue(struct bench *b, const char *what, const char *name)
        __attribute__((warn_unused_result));

/* Consumes the existing queue `name` on a thread of its own, no-ack (the broker pushes as
 * fast as it can and the consumer never limits the run), counting deliveries
 * (consumer_received()) and handing each to fn (may be NULL) with its receive time. Returns
 * once basic.consume is confirmed (15 s at most) with the consumer in *out (consumer_stop()
 * it; the queue stays), or -1 after bench_fail(what). */
int mq_consume(struct bench *b, const char *what, const char *name, consumer_delivery_fn fn,
               void *arg, struct consumer **out) __attribute__((warn_unused_result));
/* -1 after bench_fail(what) when the consumer has ended on an error; 0 while it runs. */
int mq_consumer_check(struct bench *b, struct consumer *k, const char *what)
        __attribute__((warn_unused_result));

#endif
