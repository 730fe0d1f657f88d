/* The one list of AMQP basic properties a row may set and the rules for their values, shared
 * by the relay's mapping and the producer library's check (see message_property.h). */
#include "base/message_property.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/text.h"

/* The properties a producer sets. message_id, timestamp, content_type and headers are not
 * here: the relay sets them from the row's own columns. */
static const struct message_property properties[] = {
	{ "correlation_id", MESSAGE_PROPERTY_CORRELATION_ID, MESSAGE_PROPERTY_STRING },
	{ "reply_to", MESSAGE_PROPERTY_REPLY_TO, MESSAGE_PROPERTY_STRING },
	{ "type", MESSAGE_PROPERTY_TYPE, MESSAGE_PROPERTY_STRING },
	{ "app_id", MESSAGE_PROPERTY_APP_ID, MESSAGE_PROPERTY_STRING },
	{ "user_id", MESSAGE_PROPERTY_USER_ID, MESSAGE_PROPERTY_STRING },
	{ "content_encoding", MESSAGE_PROPERTY_CONTENT_ENCODING, MESSAGE_PROPERTY_STRING },
	{ "expiration", MESSAGE_PROPERTY_EXPIRATION, MESSAGE_PROPERTY_MILLISECONDS },
	{ "priority", MESSAGE_PROPERTY_PRIORITY, MESSAGE_PROPERTY_PRIORITY_0_9 },
	{ "delivery_mode", MESSAGE_PROPERTY_DELIVERY_MODE, MESSAGE_PROPERTY_DELIVERY_1_2 },
};

static int fail(char *err, size_t errlen, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen > 0) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return MESSAGE_PROPERTY_INVALID;
}

static bool all_digits(const char *s, size_t len)
{
	if (len == 0)
		return false;
	for (size_t i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return false;
	}
	return true;
}

/* Whether the decimal digits s[0..len) (leading zeros allowed) denote at most max. */
static bool digits_at_most(const char *s, size_t len, uint64_t max)
{
	uint64_t v = 0;

	for (size_t i = 0; i < len; i++) {
		uint64_t d = (uint64_t)(s[i] - '0');

		if (v > (max - d) / 10)
			return false;
		v = v * 10 + d;
	}
	return true;
}

const struct message_property *message_property_find(const char *name)
{
	for (size_t i = 0; i < sizeof(properties) / sizeof(properties[0]); i++) {
		if (strcmp(name, properties[i].name) == 0)
			return &properties[i];
	}
	return NULL;
}

/* The value's check; p names it in the error. */
static int check_value(const char *column, const struct message_property *p,
                       const struct message_property_value *v, char *err, size_t errlen)
{
	char shown[TEXT_SHOWN_SIZE];

	switch (p->kind) {
	case MESSAGE_PROPERTY_STRING:
		if (v->type != MESSAGE_PROPERTY_JSON_STRING)
			return fail(err, errlen, "%s: %s must be a string", column, p->name);
		if (v->len > MESSAGE_PROPERTY_MAX_STRING)
			return fail(err, errlen, "%s: %s longer than %d bytes", column, p->name,
			            MESSAGE_PROPERTY_MAX_STRING);
		return MESSAGE_PROPERTY_OK;
	case MESSAGE_PROPERTY_MILLISECONDS:
		/* RabbitMQ closes the channel (406) for anything but a non-negative integer in
		 * a string, which would blame the whole batch: refuse it here instead. */
		if (v->type != MESSAGE_PROPERTY_JSON_STRING || !all_digits(v->string, v->len))
			return fail(err, errlen, "%s: %s must be a string of digits", column,
			            p->name);
		if (v->len > MESSAGE_PROPERTY_MAX_STRING)
			return fail(err, errlen, "%s: %s longer than %d bytes", column, p->name,
			            MESSAGE_PROPERTY_MAX_STRING);
		if (!digits_at_most(v->string, v->len, MESSAGE_PROPERTY_MAX_EXPIRATION))
			return fail(err, errlen, "%s: %s must be at most %llu", column, p->name,
			            (unsigned long long)MESSAGE_PROPERTY_MAX_EXPIRATION);
		return MESSAGE_PROPERTY_OK;
	case MESSAGE_PROPERTY_PRIORITY_0_9:
		if (v->type != MESSAGE_PROPERTY_JSON_INTEGER || v->integer < 0 || v->integer > 9) {
			if (v->show)
				v->show(v->show_arg, shown, sizeof(shown));
			else
				snprintf(shown, sizeof(shown), "?");
			return fail(err, errlen, "%s: %s must be an integer 0-9, got %s", column,
			            p->name, shown);
		}
		return MESSAGE_PROPERTY_OK;
	case MESSAGE_PROPERTY_DELIVERY_1_2:
		if (v->type != MESSAGE_PROPERTY_JSON_INTEGER ||
		    (v->integer != 1 && v->integer != 2))
			return fail(err, errlen, "%s: %s must be 1 or 2", column, p->name);
		return MESSAGE_PROPERTY_OK;
	}
	return fail(err, errlen, "%s: %s cannot be checked", column, p->name);
}

int message_property_check(const char *column, const char *name,
                           const struct message_property_value *v,
                           const struct message_property **found, char *err, size_t errlen)
{
	const struct message_property *p;
	char shown[TEXT_SHOWN_SIZE];
	int rc;

	if (v->type == MESSAGE_PROPERTY_JSON_NULL) {
		*found = NULL; /* serializers write null for "not set" */
		return MESSAGE_PROPERTY_OK;
	}
	p = message_property_find(name);
	if (!p) {
		text_shown(shown, sizeof(shown), name, strlen(name));
		return fail(err, errlen, "%s: unknown property '%s'", column, shown);
	}
	rc = check_value(column, p, v, err, errlen);
	if (rc == MESSAGE_PROPERTY_OK)
		*found = p;
	return rc;
}
