/* outbox.h — the producer library: add a message to the outbox inside the caller's own
 * transaction. It runs one INSERT on the caller's connection and never begins, commits,
 * rolls back, closes or opens a connection, so the message becomes durable exactly when
 * the caller's work does. Installed as <outbox/outbox.h> with liboutbox, which links against
 * libpq only: `pkg-config --cflags --libs outbox`, or find_package(outbox) and the target
 * outbox::outbox (outbox::outbox_static for the static library). */
#ifndef OUTBOX_OUTBOX_H
#define OUTBOX_OUTBOX_H

#include <stddef.h>
#include <stdint.h>
#include <libpq-fe.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The same two macros in inbox.h: each public header stands alone.
 * OUTBOX_API marks what liboutbox.so exports (it is built with hidden visibility, so the
 * helpers it carries stay its own). OUTBOX_MUST_CHECK: a result that must not be ignored
 * (written first in a declaration, where both C and C++ take it). */
#ifndef OUTBOX_API
#if defined(__GNUC__) || defined(__clang__)
#define OUTBOX_API __attribute__((visibility("default")))
#else
#define OUTBOX_API
#endif
#endif
#ifndef OUTBOX_MUST_CHECK
#if defined(__cplusplus) && __cplusplus >= 201703L
#define OUTBOX_MUST_CHECK [[nodiscard]]
#elif defined(__GNUC__) || defined(__clang__)
#define OUTBOX_MUST_CHECK __attribute__((warn_unused_result))
#else
#define OUTBOX_MUST_CHECK
#endif
#endif

/* One message. All pointers are borrowed for the duration of outbox_add().
 * properties_json sets the AMQP properties the relay publishes with: correlation_id, reply_to,
 * type, app_id, user_id and content_encoding (strings of at most 255 bytes), expiration (ms as
 * a string of digits, at most "4294967295"), priority (an integer 0-9) and delivery_mode (1 or
 * 2; the relay sends 2, persistent, when unset). A member whose value is null is not set; any
 * other member is refused, as the relay would refuse it. */
struct outbox_message {
	const char *id;          /* required, 1..64 bytes; becomes the AMQP message_id */
	const char *exchange;    /* required; "" is the default exchange */
	const char *routing_key; /* required */
	const void *body;        /* body bytes (may hold any bytes when body_encoding is NULL) */
	size_t body_len;
	const char *body_encoding;   /* NULL: "utf-8" when body is valid UTF-8 without NUL bytes,
	                              else the library stores it base64-encoded. "utf-8" or
	                              "base64": body is stored as given (base64 = already encoded). */
	const char *content_type;    /* NULL = "application/json" */
	const char *headers_json;    /* NULL = "{}"; a JSON object */
	const char *properties_json; /* NULL = "{}"; a JSON object of AMQP properties (above) */
	const char *ordering_key;    /* NULL = no ordering */
	int64_t delay_ms;            /* > 0: available_at = now() + delay_ms, at most
	                                OUTBOX_DELAY_MAX_MS; 0 or negative: now */
	/* W3C Trace Context (https://www.w3.org/TR/trace-context/), NULL = none: stored as the
	 * headers "traceparent" and "tracestate" (added to headers_json), which the relay
	 * publishes as AMQP headers of those names and whose trace id it logs. traceparent:
	 * "00-<32 hex trace-id>-<16 hex parent-id>-<2 hex flags>", lowercase, neither id all
	 * zeros (a later version as the spec's forward compatibility reads it). tracestate: at
	 * most 32 key=value members, 512 characters, and only with a traceparent; one without
	 * any member ("" or only commas and blanks) is left out. A malformed one is refused, and
	 * so is a traceparent or tracestate given both here and in headers_json; one that
	 * headers_json holds (under that name in any case) is checked the same way. */
	const char *traceparent;
	const char *tracestate;
};

/* The longest delay_ms outbox_add() takes: 365 days. A longer one is refused before anything
 * is sent: it is most likely a unit mistake, and a large enough one would make the INSERT
 * fail, and with it the caller's transaction. */
#define OUTBOX_DELAY_MAX_MS (365LL * 24 * 60 * 60 * 1000)

enum outbox_result {
	OUTBOX_ADDED = 0,        /* a new row was inserted */
	OUTBOX_DUPLICATE = 1,    /* a row with this id exists already; nothing changed */
	OUTBOX_ERR_INVALID = -1, /* the message or table name is malformed, or the connection's
	                            client_encoding is neither UTF8 nor SQL_ASCII (see errbuf);
	                            nothing was sent */
	OUTBOX_ERR_QUERY = -2,   /* the INSERT failed (see errbuf); the caller's transaction is
	                            then aborted, as any failed statement aborts it */
	OUTBOX_ERR_NOMEM = -3,
};

/* Inserts m into table (NULL = "outbox"; a plain or schema-qualified identifier) with
 * INSERT ... ON CONFLICT DO NOTHING on conn (a partitioned table deduplicates an id within
 * its partition only: docs/design.md, "A partitioned table"). The strings are UTF-8, so conn must not
 * convert them: its client_encoding must be UTF8 (or SQL_ASCII, which converts nothing);
 * any other is refused before anything is sent. headers_json and properties_json must be
 * JSON objects the relay can read: valid JSON (UTF-8, no duplicate key in any object,
 * integers within 64 bits), nested at most 16 levels below the object; properties_json
 * holds only properties the relay can set (see struct outbox_message), checked in the words
 * the relay would use, e.g. "properties_json: priority must be an integer 0-9, got 12".
 * delay_ms is at most OUTBOX_DELAY_MAX_MS. A message refused for any of these gets
 * OUTBOX_ERR_INVALID before anything is sent, so the caller's transaction goes on. On error
 * writes one line to errbuf (if errlen > 0). conn is borrowed; its transaction state is left
 * to the caller. */
OUTBOX_MUST_CHECK OUTBOX_API int outbox_add(PGconn *conn, const char *table,
                                            const struct outbox_message *m, char *errbuf,
                                            size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
