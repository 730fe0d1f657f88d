/* consumer.h — a real AMQP consumer. bench/drive/ holds the drivers of real servers and
 * processes that the benchmark and the tests share; they need neither criterion nor the test
 * harness (consumer.c links against rabbitmq-c, jansson and pthreads only). Here: its own
 * thread and connection, a durable queue bound to an exchange, and a record of every delivery
 * (duplicates included) that another thread can query while messages are still arriving. It
 * reconnects by itself when the broker restarts and acks only after recording, so nothing is
 * lost on its side; consumer_options turn that off for a benchmark that only counts.
 *
 * Thread-safe: the queries may be called from any thread while the consumer runs;
 * consumer_stop() once, after the last of them. */
#ifndef OUTBOX_BENCH_DRIVE_CONSUMER_H
#define OUTBOX_BENCH_DRIVE_CONSUMER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

/* One delivery, copied out of rabbitmq-c's buffers. Owned by the consumer; pointers stay
 * valid until consumer_stop(). Strings are NUL-terminated copies (NULL when the property was
 * absent); body may hold NUL bytes, use body_len. */
struct consumer_msg {
	char *message_id;
	char *exchange;
	char *routing_key;
	char *body;
	size_t body_len;
	uint32_t flags; /* AMQP_BASIC_*_FLAG bits that were present */
	char *content_type;
	char *content_encoding;
	char *correlation_id;
	char *reply_to;
	char *expiration;
	char *type;
	char *app_id;
	char *user_id;
	char *cluster_id;
	int delivery_mode; /* 0 when absent */
	int priority;      /* -1 when absent */
	int64_t timestamp; /* -1 when absent */
	json_t *headers;   /* the field table as JSON; NULL when absent */
	bool redelivered;
};

struct consumer;

/* Connects to url, declares the durable queue `queue`, binds it to exchange with
 * routing_key (exchange NULL or "" = default exchange, no binding) and starts consuming.
 * When exchange_type is not NULL the exchange is declared first (durable). The strings are
 * copied. Returns 0 once the queue is bound, so a publish made afterwards is routed to it,
 * with a new consumer in *out (free with consumer_stop()). Returns -1 when it could not
 * consume within 20 s (the last broker error in err) or could not start its thread; *out is
 * then untouched and nothing is left running. */
int consumer_open(struct consumer **out, const char *url, const char *queue, const char *exchange,
                  const char *exchange_type, const char *routing_key, char *err, size_t errlen)
        __attribute__((warn_unused_result));
/* One delivery as consumer_options.on_delivery sees it, on the consumer's thread. */
struct consumer_delivery {
	size_t n;         /* 1 for the first delivery of this consumer, then 2, 3, ... */
	int64_t mono_us;  /* CLOCK_MONOTONIC when rabbitmq-c returned it, in microseconds */
	int64_t real_us;  /* CLOCK_REALTIME at the same moment (to compare with a sender's clock) */
	const char *body; /* borrowed for the call only; may hold NUL bytes, not NUL-terminated */
	size_t body_len;
};
typedef void (*consumer_delivery_fn)(const struct consumer_delivery *d, void *arg);

/* What consumer_open_with() does differently from consumer_open(); all zero (or a NULL
 * pointer) is consumer_open()'s behaviour. For programs that measure rather than check, such
 * as the benchmark: a consumer that keeps up with a broker at full speed. */
struct consumer_options {
	/* basic.consume with no-ack: the broker pushes without waiting for acks. A delivery in
	 * flight when the connection drops is lost, not redelivered. */
	bool no_ack;
	/* Deliveries are counted (consumer_received()) and passed to on_delivery, not copied:
	 * consumer_unique(), consumer_find(), consumer_order() and the like see none of them.
	 * Memory stays flat however many arrive. */
	bool count_only;
	/* Consume `queue` as it is: no exchange or queue is declared or bound (exchange,
	 * exchange_type and routing_key are ignored) and consumer_stop() deletes nothing. */
	bool existing_queue;
	/* No reconnection: the first error, at the start or later, ends the consumer's thread;
	 * consumer_failed() then says so. */
	bool no_reconnect;
	/* How long consumer_open_with() waits for the first basic.consume; 0 = 20 s. */
	int64_t start_timeout_ms;
	/* Called for every delivery before it counts in consumer_received(), so a thread that
	 * sees the count also sees what on_delivery stored for those deliveries. Must be quick:
	 * the consumer reads nothing while it runs. NULL = none. */
	consumer_delivery_fn on_delivery;
	void *arg;
	/* The queue's x-queue-type when the consumer declares it ("quorum", "stream"; borrowed
	 * until consumer_stop()); NULL = none, a classic queue. A quorum queue refuses a declare
	 * that does not name its type. */
	const char *queue_type;
	/* url is a list of nodes separated by commas, as amqp.url takes them: the first
	 * connection goes to the first, and each new one to the node after the one used last,
	 * so the consumer follows a cluster whose node it used went away. Every request then
	 * gives up after 10 s, so that a node that cannot answer (a quorum queue without its
	 * majority) makes the consumer try the next one instead of hanging. */
	bool url_list;
};

/* consumer_open() with options (opt may be NULL: then the same as consumer_open(); it is
 * copied, arg is borrowed until consumer_stop()). */
int consumer_open_with(struct consumer **out, const char *url, const char *queue,
                       const char *exchange, const char *exchange_type, const char *routing_key,
                       const struct consumer_options *opt, char *err, size_t errlen)
        __attribute__((warn_unused_result));
/* Stops the thread, deletes the queue (and the exchange it declared; neither with
 * existing_queue), frees everything; accepts NULL. Pointers obtained from c are invalid
 * afterwards. */
void consumer_stop(struct consumer *c);

/* Waits until n distinct message ids arrived; false after timeout_ms. */
bool consumer_wait_unique(struct consumer *c, size_t n, int64_t timeout_ms);
size_t consumer_received(struct consumer *c);   /* deliveries, duplicates included */
size_t consumer_unique(struct consumer *c);     /* distinct message ids */
size_t consumer_duplicates(struct consumer *c); /* received - unique */
size_t consumer_reconnects(struct consumer *c); /* connections made after the first */
/* Whether a consumer opened with no_reconnect has ended on an error; the error goes into err
 * (may be NULL). Always false for the others, which reconnect instead. */
bool consumer_failed(struct consumer *c, char *err, size_t errlen);

/* First delivery of id, or NULL. Borrowed (see struct consumer_msg). */
const struct consumer_msg *consumer_find(struct consumer *c, const char *id);
/* How many times id was delivered. */
size_t consumer_count(struct consumer *c, const char *id);
/* Ids of all deliveries in arrival order (duplicates repeat); new array of *n borrowed
 * strings: free() the array only. */
const char **consumer_order(struct consumer *c, size_t *n);
/* Deliveries number from, from + 1, ... (0 = the first; duplicates repeat) in arrival order:
 * copies at most max of them into ids (borrowed strings, valid until consumer_stop()) and
 * at_ms (when the consumer recorded each, CLOCK_MONOTONIC milliseconds; may be NULL).
 * Returns how many it copied, 0 when nothing arrived past from. Lets a caller follow the
 * deliveries as they come without copying the whole history each time. */
size_t consumer_deliveries(struct consumer *c, size_t from, const char **ids, int64_t *at_ms,
                           size_t max);
/* Which of the n expected ids never arrived: new array (free()) of borrowed pointers into
 * expected, count in *n_lost. */
const char **consumer_lost(struct consumer *c, const char *const *expected, size_t n,
                           size_t *n_lost);

#endif
