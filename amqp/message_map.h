/* DESIGN §5: one outbox row -> AMQP basic properties and body. Validates everything that
 * could make a row unpublishable, so such rows die before anything reaches the broker. */
#ifndef OUTBOX_AMQP_MESSAGE_MAP_H
#define OUTBOX_AMQP_MESSAGE_MAP_H

#include <stddef.h>

#include <amqp.h>

#include "amqp/broker.h"

enum message_map_err {
	MESSAGE_MAP_OK = 0,
	MESSAGE_MAP_INVALID = -1, /* the row can never be published; err says why */
	MESSAGE_MAP_NOMEM = -2,
};

#define MESSAGE_MAP_MAX_DEPTH    16  /* nested tables/arrays in headers */
#define MESSAGE_MAP_MAX_KEY      128 /* bytes in a header key */
#define MESSAGE_MAP_MAX_SHORTSTR 255 /* AMQP short string */

/* Maps m into *props and *body. Header tables, strings parsed from the JSON columns and a
 * decoded base64 body are allocated from pool (owned by the caller, valid until it is
 * recycled); id, content type and a utf-8 body are borrowed from m, so m must outlive the
 * publish. On failure nothing is written to props or
 * body; for MESSAGE_MAP_INVALID err (errlen bytes, caller's) gets one line naming the
 * column and the problem, e.g. "properties: unknown property 'foo'". */
int message_map(const struct broker_message *m, amqp_pool_t *pool, amqp_basic_properties_t *props,
                amqp_bytes_t *body, char *err, size_t errlen) __attribute__((warn_unused_result));

#endif
