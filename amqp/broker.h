/* The relay's side of RabbitMQ (rabbitmq-c 0.11): one connection and one confirm-mode
 * channel, publishing rows with `mandatory` and reading basic.ack / basic.nack / basic.return
 * and channel/connection closes ourselves (0.11 has no confirm-wait helper). */
#ifndef OUTBOX_AMQP_BROKER_H
#define OUTBOX_AMQP_BROKER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum broker_err {
	BROKER_OK = 0,
	BROKER_ERR_CONN = -1,    /* connection lost / refused / channel closed for a reason that
	                            is not one publish's: disconnect, back off, reconnect */
	BROKER_ERR_TIMEOUT = -2, /* confirms (or connection.blocked) outlasted confirm_timeout,
	                            or the abort deadline passed: treat like BROKER_ERR_CONN */
	BROKER_ERR_CONFIG = -3,  /* bad URL, unreadable TLS files, login refused: fatal at start */
	BROKER_ERR_NOMEM = -4,
};

/* Borrowed by broker_new() for the broker's lifetime. */
struct broker_options {
	const char *url;      /* amqp://user:pass@host:port/vhost or amqps:// */
	int64_t heartbeat_ms; /* 0 disables heartbeats */
	int64_t confirm_timeout_ms;
	const char *tls_ca_file; /* "" = none */
	const char *tls_cert_file;
	const char *tls_key_file;
	bool tls_verify_peer;
	const char *connection_name; /* shown in the management UI */
	/* When non-NULL and *abort_at_ms != 0: an absolute CLOCK_MONOTONIC deadline in ms after
	 * which waits give up with BROKER_ERR_TIMEOUT (orderly shutdown). */
	const atomic_llong *abort_at_ms;
};

/* One row to publish, as stored. All borrowed; must stay valid from broker_publish() until
 * the matching broker_confirm() returns (rows may be republished inside it). */
struct broker_message {
	const char *id; /* -> message_id */
	const char *exchange;
	const char *routing_key;
	const char *body;
	size_t body_len;
	const char *body_encoding; /* "utf-8" | "base64" */
	const char *content_type;
	const char *headers_json;
	const char *properties_json;
	int64_t timestamp_s; /* created_at */
	/* A row that failed before: published after every other row of the batch has its
	 * answer, with the other such rows, so that a publish that closes the channel again
	 * (403, 406) cannot cost the rest of the batch a duplicate. */
	bool retry;
};

enum broker_outcome {
	BROKER_PENDING = 0, /* not confirmed (connection failure/timeout): release, no attempt */
	BROKER_ACKED,       /* basic.ack: published */
	BROKER_NACKED,      /* basic.nack: retry with an attempt */
	BROKER_RETURNED,    /* basic.return (unroutable under mandatory): retry with an attempt */
	BROKER_REFUSED,     /* the broker closed the channel because of this publish (404, 406,
	                       403): retry with an attempt; error holds the reply text */
	BROKER_INVALID,     /* can never be published (bad base64, headers, properties, ...):
	                       dead at once; error names the column and the problem */
};

struct broker_result {
	enum broker_outcome outcome;
	char error[320];    /* one line, set for NACKED/RETURNED/REFUSED/INVALID:
	                       "nacked by broker",
	                       "unroutable: exchange 'orders' routing key 'x.y' has no binding",
	                       "exchange 'nope' not found",
	                       "headers: key 'a': value cannot be carried by AMQP (...)" */
	int64_t confirm_us; /* publish -> confirm latency (ACKED only) */
};

struct broker;

struct broker *broker_new(const struct broker_options *opts); /* NULL on out of memory */
void broker_free(struct broker *b);                           /* accepts NULL */
const char *broker_errmsg(const struct broker *b);            /* borrowed */

/* Connects, logs in (advertising the connection.blocked capability), opens the channel and
 * selects confirm mode. Socket writes are bounded by confirm_timeout so a broker that stops
 * reading cannot block the relay for ever. */
int broker_connect(struct broker *b) __attribute__((warn_unused_result));
void broker_disconnect(struct broker *b); /* closes politely if possible; idempotent */
bool broker_connected(const struct broker *b);
bool broker_blocked(const struct broker *b); /* connection.blocked in force */
int broker_fd(const struct broker *b);       /* socket to poll while idle, -1 if none */

/* Services the connection while idle without blocking: reads pending frames (heartbeats,
 * connection.blocked/unblocked, closes) and sends a heartbeat when due. Call at least every
 * heartbeat/2. */
int broker_service(struct broker *b) __attribute__((warn_unused_result));

/* Validates and publishes n messages (mandatory, persistent, DESIGN §5 mapping), in order
 * but for rows marked retry, which broker_confirm() publishes last. res[i] is set to
 * BROKER_INVALID (with error) for rows that can never be published — those are not sent —
 * and to BROKER_PENDING for the rest. Exchanges are checked once per connection with
 * a passive declare: rows for a missing exchange get BROKER_REFUSED without being sent.
 * msgs and res are borrowed and must stay valid until broker_confirm() returns. */
int broker_publish(struct broker *b, const struct broker_message *msgs, size_t n,
                   struct broker_result *res) __attribute__((warn_unused_result));

/* Waits for the broker's answer to everything the last broker_publish() sent, then
 * publishes the retry rows together and waits for those, all within confirm_timeout. When
 * the broker closes the channel because of one publish (404/406/403), reopens it and
 * republishes the unconfirmed rows one at a time to find the culprit, which gets
 * BROKER_REFUSED; the others are published again without blame (duplicates possible,
 * never loss). Returns BROKER_OK when every row has an outcome other than PENDING, else the
 * error, leaving unanswered rows PENDING. */
int broker_confirm(struct broker *b, const struct broker_message *msgs, size_t n,
                   struct broker_result *res) __attribute__((warn_unused_result));

#endif
