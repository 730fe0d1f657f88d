/* The relay's side of RabbitMQ (rabbitmq-c 0.11): one connection to one node of a cluster and
 * one confirm-mode channel, publishing rows with `mandatory` and reading basic.ack /
 * basic.nack / basic.return and channel/connection closes ourselves (0.11 has no
 * confirm-wait helper).
 *
 * Threads: a struct broker belongs to one thread at a time (rabbitmq-c connections are not
 * thread-safe, and heartbeats are only serviced inside its calls: call broker_service() at
 * least every heartbeat/2 while idle); only broker_interrupt() may be called from another
 * thread. Error texts never hold a password. */
#ifndef OUTBOX_AMQP_BROKER_H
#define OUTBOX_AMQP_BROKER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/outbox_row.h"

enum broker_err {
	BROKER_OK = 0,
	BROKER_ERR_CONN = -1,    /* connection lost / refused / channel closed for a reason that
	                            is not one publish's: disconnect, back off, reconnect */
	BROKER_ERR_TIMEOUT = -2, /* confirms (or connection.blocked) outlasted confirm_timeout:
	                            treat like BROKER_ERR_CONN */
	BROKER_ERR_CONFIG = -3,  /* bad URL, unreadable TLS files, login refused (by every node):
	                            fatal at start */
	BROKER_ERR_NOMEM = -4,
	BROKER_ERR_ABORTED = -5, /* the shutdown deadline (*abort_at_ms) ended a wait, or
	                            broker_interrupt() ended a call; the connection is gone and
	                            unanswered rows are PENDING: release them, no attempt */
};

/* Borrowed by broker_new() for the broker's lifetime. */
struct broker_options {
	/* amqp://user:pass@host:port/vhost or amqps://..., or several of them separated by
	 * commas (the nodes of a cluster, each with its own credentials and vhost; a comma
	 * inside a URL is written %2C). The TLS options apply to every amqps:// node. */
	const char *url;
	int64_t heartbeat_ms; /* 0 disables heartbeats */
	int64_t confirm_timeout_ms;
	const char *tls_ca_file; /* "" = none */
	const char *tls_cert_file;
	const char *tls_key_file;
	bool tls_verify_peer;
	const char *connection_name; /* shown in the management UI */
	/* When non-NULL and *abort_at_ms != 0: an absolute CLOCK_MONOTONIC deadline in ms by
	 * which every wait gives up with BROKER_ERR_ABORTED (orderly shutdown). Read again
	 * whenever a wait wakes up. */
	const atomic_llong *abort_at_ms;
	/* A descriptor that becomes readable once the process is stopping, after *abort_at_ms
	 * was set; never drained here. -1 = none. Waits poll it while *abort_at_ms is 0, so that
	 * a deadline set during a wait is seen at once. A zeroed struct means descriptor 0:
	 * set -1 when there is none. */
	int wake_fd;
	/* When non-NULL: while a broker call waits (connecting, logging in, confirms, the
	 * culprit search), clock_mono_ms() is stored here at least once a second, so that a long
	 * wait that is still working can be told from a stuck one. */
	atomic_llong *progress_ms;
};

enum broker_outcome {
	BROKER_PENDING = 0, /* not answered (connection failure, timeout, shutdown): release, no
	                       attempt */
	BROKER_ACKED,       /* basic.ack: published */
	BROKER_NACKED,      /* basic.nack: the broker's own failure (quorum queue without a
	                       majority, reject-publish overflow): retry with backoff, no attempt
	                       (DESIGN §4); error is "nacked by broker" */
	BROKER_RETURNED,    /* basic.return (unroutable under mandatory): retry with an attempt */
	BROKER_REFUSED,     /* the broker closed the channel because of this publish (404, 406,
	                       403): retry with an attempt; error holds the reply text */
	BROKER_INVALID,     /* can never be published (bad base64, headers, properties, a
	                       content header beyond the frame, a body beyond the broker's
	                       max_message_size, a message rabbitmq-c cannot encode): dead at
	                       once; error names the column and the problem */
};

struct broker_result {
	enum broker_outcome outcome;
	char error[320];    /* one line, set for NACKED/RETURNED/REFUSED/INVALID:
	                       "nacked by broker",
	                       "unroutable: exchange 'orders' routing key 'x.y' has no binding",
	                       "exchange 'nope' not found",
	                       "headers: key 'a': value cannot be carried by AMQP (...)",
	                       "headers: encoded size 204,873 bytes exceeds the 131,072-byte frame",
	                       "body: 5,242,880 bytes exceed the broker's max_message_size of
	                        4,194,304 bytes" */
	int64_t confirm_us; /* publish -> confirm latency (ACKED only) */
	/* The trace id of the row's W3C traceparent header (32 lowercase hex digits), for its
	 * log lines; "" when it has none. Set by broker_publish() for every row, whatever it
	 * returns. */
	char trace_id[33];
};

struct broker;

/* NULL when out of memory (or out of file descriptors: each broker keeps a pipe that
 * broker_interrupt() writes to). */
struct broker *broker_new(const struct broker_options *opts);
/* Reads amqp.url (url borrowed, may be NULL) as broker_connect() will, without connecting:
 * returns BROKER_OK, or BROKER_ERR_CONFIG with one line in why (n bytes) that names the URL
 * by position when there are several and says what is wrong, e.g. "URL 2 of 3: the password
 * holds an unescaped '/': percent-encode it as %2F" (never a part of the URL itself), or
 * BROKER_ERR_NOMEM. For the configuration check at start: such a URL can never connect. */
int broker_check_url(const char *url, char *why, size_t n) __attribute__((warn_unused_result));
void broker_free(struct broker *b);                /* accepts NULL */
const char *broker_errmsg(const struct broker *b); /* borrowed; never holds a password */

/* Connects, logs in (advertising the connection.blocked capability), opens the channel and
 * selects confirm mode. With several URLs: the first call starts from a random node (so
 * relays spread over the cluster), a call after the connection was lost starts from the node
 * after the last one used, and each call tries every node at most once, each attempt
 * (connect, TLS, login, channels) bounded by min(confirm_timeout, 10 s) and by the shutdown
 * deadline. Returns BROKER_ERR_CONN after a full round without success, with the last
 * error (naming its node) in broker_errmsg(); BROKER_ERR_CONFIG for a bad URL, unreadable
 * TLS files, or when every node refused the login or vhost; BROKER_ERR_ABORTED at the
 * shutdown deadline or after broker_interrupt(). Back off per call, not per node. Socket
 * writes are bounded by confirm_timeout (TCP_USER_TIMEOUT) so a broker that stops reading
 * cannot block the relay for ever; broker_interrupt() ends them at once. */
int broker_connect(struct broker *b) __attribute__((warn_unused_result));
void broker_disconnect(struct broker *b); /* closes politely if possible; idempotent; keeps
                                             broker_errmsg() */
bool broker_connected(const struct broker *b);
bool broker_blocked(const struct broker *b); /* connection.blocked in force */
int broker_fd(const struct broker *b);       /* socket to poll while idle, -1 if none */
/* "host:port" of the node connected to, or of the last one tried ("" before the first
 * attempt); never credentials. Borrowed, valid until the next broker_connect(). */
const char *broker_node(const struct broker *b);

/* Thread-safe; the only call another thread may make while the owner is inside a broker
 * call. Makes the blocked socket operation fail at once (a write that rabbitmq-c would wait
 * on for ever, a read, a connect): the owner's call returns BROKER_ERR_ABORTED and the
 * connection is gone. The next broker_connect() works normally. */
void broker_interrupt(struct broker *b);

/* Services the connection while idle without blocking: reads pending frames (heartbeats,
 * connection.blocked/unblocked, closes) and sends a heartbeat when due. Call at least every
 * heartbeat/2. */
int broker_service(struct broker *b) __attribute__((warn_unused_result));

/* Validates and publishes n messages (mandatory, persistent, DESIGN §5 mapping), in order
 * but for rows that failed before (attempts > 0) and rows whose body is larger than any this
 * connection has delivered yet, which broker_confirm() publishes last (a large body is published alone,
 * once every other row has its answer: if it exceeds the broker's max_message_size, the
 * close that follows blames it and nothing else). res[i] is set to BROKER_INVALID (with
 * error) for rows that can never be published — those are not sent: everything message_map()
 * rejects, a content header that does not fit the negotiated frame, a body over the
 * max_message_size learnt on this connection — and to BROKER_PENDING for the rest.
 * Exchanges are checked once per connection with a passive declare: rows for a missing
 * exchange get BROKER_REFUSED without being sent. When rabbitmq-c fails to publish a row
 * because of its content, that row is BROKER_INVALID with the library's text; the
 * connection is then unusable, so the call returns BROKER_ERR_CONN with every other
 * unanswered row PENDING (rows already answered keep their outcome). msgs and res are
 * borrowed and must stay valid until broker_confirm() returns. */
int broker_publish(struct broker *b, const struct outbox_row *msgs, size_t n,
                   struct broker_result *res) __attribute__((warn_unused_result));

/* Every wait for the batch about to be published (the exchange check, its confirms, the
 * culprit search) ends by deadline_ms (CLOCK_MONOTONIC; 0 = none) as well as by
 * confirm_timeout: the batch's lease, after which its rows may be claimed by another relay.
 * A wait it ends returns BROKER_ERR_TIMEOUT with a text saying the lease ran out. Stays set
 * until changed. */
void broker_set_batch_deadline(struct broker *b, int64_t deadline_ms);

/* Waits for the broker's answer to everything the last broker_publish() sent, then
 * publishes the deferred rows (above) and waits for those, all within confirm_timeout. When
 * the broker closes the channel because of one publish (404/406/403), reopens it; the
 * culprit is the one row without an answer if there is only one, else the unconfirmed rows
 * are republished one at a time to find it. The culprit gets BROKER_REFUSED, or
 * BROKER_INVALID when the reply says its body exceeds max_message_size (the limit is then
 * remembered for the connection); the others are published again without blame
 * (duplicates possible, never loss). A basic.return that matches no row waiting for its
 * answer fails the batch with BROKER_ERR_CONN. Returns BROKER_OK when every row has an
 * outcome other than PENDING, else the error, leaving unanswered rows PENDING. */
int broker_confirm(struct broker *b, const struct outbox_row *msgs, size_t n,
                   struct broker_result *res) __attribute__((warn_unused_result));

#endif
