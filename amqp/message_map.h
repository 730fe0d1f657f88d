/* DESIGN §5: one outbox row -> AMQP basic properties and body. Validates everything that
 * could make a row unpublishable, so such rows die before anything reaches the broker. */
#ifndef OUTBOX_AMQP_MESSAGE_MAP_H
#define OUTBOX_AMQP_MESSAGE_MAP_H

#include <stddef.h>
#include <stdint.h>

#include <amqp.h>

#include "amqp/broker.h"
#include "base/message_property.h"

enum message_map_err {
	MESSAGE_MAP_OK = 0,
	MESSAGE_MAP_INVALID = -1, /* the row can never be published; err says why */
	MESSAGE_MAP_NOMEM = -2,
};

#define MESSAGE_MAP_MAX_DEPTH      16  /* nested tables/arrays in headers */
#define MESSAGE_MAP_MAX_KEY        128 /* bytes in a header key */
#define MESSAGE_MAP_MAX_SHORTSTR   255 /* AMQP short string */
#define MESSAGE_MAP_MAX_EXPIRATION MESSAGE_PROPERTY_MAX_EXPIRATION /* ms (406 above) */
/* What a content header frame adds to its encoded properties: frame header (type, channel,
 * size: 7), class id (2), weight (2), body size (8) and the frame end octet (1). */
#define MESSAGE_MAP_HEADER_FRAME_OVERHEAD 20

/* Maps m into *props and *body. Header tables, strings parsed from the JSON columns and a
 * decoded base64 body are allocated from pool (owned by the caller, valid until it is
 * recycled); id, content type and a utf-8 body are borrowed from m, so m must outlive the
 * publish. On failure nothing is written to props or
 * body; for MESSAGE_MAP_INVALID err (errlen bytes, caller's) gets one line naming the
 * column and the problem, e.g. "properties: unknown property 'foo'". */
int message_map(const struct outbox_row *m, amqp_pool_t *pool, amqp_basic_properties_t *props,
                amqp_bytes_t *body, char *err, size_t errlen) __attribute__((warn_unused_result));

/* Bytes of message_map_trace_id()'s answer: 32 hex digits and a NUL. */
#define MESSAGE_MAP_TRACE_ID_SIZE 33

/* The trace id of a row for its log lines: the 32 lowercase hex digits of the trace-id of a
 * valid W3C traceparent header (a top-level string member named "traceparent", in any case)
 * in headers_json (NULL = none), written with a NUL into trace_id
 * (MESSAGE_MAP_TRACE_ID_SIZE bytes); "" when there is none. Reads the JSON only as far as
 * that member, so a row whose headers are malformed further on still has its trace id. Pure;
 * allocates only for objects with many keys, and then gives "" when out of memory. */
void message_map_trace_id(const char *headers_json, char *trace_id);

/* The number of bytes rabbitmq-c 0.11's amqp_encode_properties() writes for p (basic class):
 * the flag words and every field whose flag is set, the headers field table included, so
 * that a row whose content header cannot fit a frame is found before anything is sent.
 * SIZE_MAX when the library could not encode p at all (a short string over 255 bytes, an
 * unknown field kind). Pure; p is borrowed. */
size_t message_map_properties_size(const amqp_basic_properties_t *p);

/* Checks that the content header frame for p fits a frame of frame_max bytes (the
 * negotiated amqp_get_frame_max()). MESSAGE_MAP_OK, or MESSAGE_MAP_INVALID with err (errlen
 * bytes, caller's) naming the column and both sizes, e.g. "headers: encoded size 204,873
 * bytes exceeds the 131,072-byte frame". */
int message_map_check_frame(const amqp_basic_properties_t *p, size_t frame_max, char *err,
                            size_t errlen) __attribute__((warn_unused_result));

/* Checks a body of body_len bytes against the broker's max_message_size (0 = not known).
 * MESSAGE_MAP_OK, or MESSAGE_MAP_INVALID with err = "body: 5,242,880 bytes exceed the
 * broker's max_message_size of 4,194,304 bytes". */
int message_map_check_body(size_t body_len, uint64_t max_message_size, char *err, size_t errlen)
        __attribute__((warn_unused_result));

#endif
