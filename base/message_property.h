/* message_property.h — the AMQP basic properties a row's properties column may set, and what
 * each value must be: one list for the relay, which maps them (amqp/message_map.c) and lets a
 * row that breaks them go dead, and for the producer library (store/liboutbox/outbox.c), which refuses
 * such a message at insert time in the same words. Knows nothing of any JSON library: each
 * reader hands over the value as it parsed it. */
#ifndef OUTBOX_BASE_MESSAGE_PROPERTY_H
#define OUTBOX_BASE_MESSAGE_PROPERTY_H

#include <stddef.h>

#define MESSAGE_PROPERTY_MAX_STRING     255        /* bytes: an AMQP short string */
#define MESSAGE_PROPERTY_MAX_EXPIRATION 4294967295 /* ms; RabbitMQ refuses more (406) */

enum message_property_err {
	MESSAGE_PROPERTY_OK = 0,
	MESSAGE_PROPERTY_INVALID = -1, /* the broker would never take it; err says why */
};

/* Which property, for the reader to find its field. */
enum message_property_id {
	MESSAGE_PROPERTY_CORRELATION_ID,
	MESSAGE_PROPERTY_REPLY_TO,
	MESSAGE_PROPERTY_TYPE,
	MESSAGE_PROPERTY_APP_ID,
	MESSAGE_PROPERTY_USER_ID,
	MESSAGE_PROPERTY_CONTENT_ENCODING,
	MESSAGE_PROPERTY_EXPIRATION,
	MESSAGE_PROPERTY_PRIORITY,
	MESSAGE_PROPERTY_DELIVERY_MODE,
};

/* What its value must be. */
enum message_property_kind {
	MESSAGE_PROPERTY_STRING,       /* a string of at most MESSAGE_PROPERTY_MAX_STRING bytes */
	MESSAGE_PROPERTY_MILLISECONDS, /* expiration: a string of digits (leading zeros allowed)
	                                   denoting at most MESSAGE_PROPERTY_MAX_EXPIRATION */
	MESSAGE_PROPERTY_PRIORITY_0_9, /* an integer 0-9 */
	MESSAGE_PROPERTY_DELIVERY_1_2, /* the integer 1 (transient) or 2 (persistent) */
};

struct message_property {
	const char *name; /* as the properties column spells it: "correlation_id" */
	enum message_property_id id;
	enum message_property_kind kind;
};

/* A member's JSON value as its reader parsed it. */
enum message_property_json {
	MESSAGE_PROPERTY_JSON_NULL,    /* null: the property is not set (serializers write it) */
	MESSAGE_PROPERTY_JSON_STRING,  /* string, len bytes once unescaped (NUL bytes count) */
	MESSAGE_PROPERTY_JSON_INTEGER, /* a number without fraction or exponent */
	MESSAGE_PROPERTY_JSON_OTHER,   /* any other number, true, false, object or array */
};

struct message_property_value {
	enum message_property_json type;
	const char *string; /* JSON_STRING: the unescaped bytes (borrowed) */
	size_t len;
	long long integer; /* JSON_INTEGER */
	/* Writes the value as JSON text into out (n bytes, NUL-terminated, shortened with
	 * text_shown()) for the "got ..." of an error; called only then, with show_arg. */
	void (*show)(const void *show_arg, char *out, size_t n);
	const void *show_arg;
};

/* The property called name (NUL-terminated, unescaped; case matters), NULL when there is none.
 * The answer points into a static table. */
const struct message_property *message_property_find(const char *name);

/* Checks one member of a properties object: a null value is accepted under any name and sets
 * nothing (*found = NULL); otherwise name must be a property and v what it takes (then *found
 * is it). MESSAGE_PROPERTY_OK, or MESSAGE_PROPERTY_INVALID with err (errlen bytes, caller's)
 * holding one line that starts with column, e.g. "properties: unknown property 'foo'" or
 * "properties: priority must be an integer 0-9, got 12"; *found is then not written. name, v
 * and column are borrowed. */
int message_property_check(const char *column, const char *name,
                           const struct message_property_value *v,
                           const struct message_property **found, char *err, size_t errlen)
        __attribute__((warn_unused_result));

#endif
