/* One row of the outbox table as the relay reads it and publishes it: the row type of store/
 * (a claim fills them), amqp/ (publishes them) and the tests (insert them). An application
 * writes rows through liboutbox's struct outbox_message (store/liboutbox/outbox.h), its stable public
 * form, which also says how to write one (a delay, trace context) rather than what was stored.
 *
 * Every pointer is borrowed from whoever filled the row (a claimed batch's storage, a test's
 * literals) and lives as long as that owner says. */
#ifndef OUTBOX_BASE_OUTBOX_ROW_H
#define OUTBOX_BASE_OUTBOX_ROW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct outbox_row {
	int64_t seq;          /* the table's order; 0 when not read from it */
	const char *id;       /* becomes the AMQP message_id */
	const char *exchange; /* "" is the default exchange */
	const char *routing_key;
	const char *body;          /* as stored: base64 text when body_encoding is "base64" */
	size_t body_len;           /* bytes of body as stored */
	const char *body_encoding; /* "utf-8" | "base64" */
	const char *content_type;
	const char *headers;      /* JSON object text as stored ("{}" or NULL: none) */
	const char *properties;   /* JSON object text of AMQP properties ("{}" or NULL: none) */
	const char *ordering_key; /* NULL when none */
	int64_t created_at_s;     /* seconds since the epoch; the AMQP timestamp */
	/* Failed publishes before this one. A row that failed before is published after every
	 * other row of its batch has its answer (amqp/publish.c), so that a publish that closes
	 * the channel again cannot cost the rest of the batch a duplicate. */
	int attempts;
};

/* The header a row made pending again by `outbox-relay replay` carries: the time the replay
 * was asked (RFC 3339, UTC). It stays in the row's headers. */
#define OUTBOX_ROW_REPLAY_HEADER "x-outbox-replayed-at"

/* Whether r carries OUTBOX_ROW_REPLAY_HEADER (the relay counts it as replayed). Cheap. */
static inline bool outbox_row_replayed(const struct outbox_row *r)
{
	return r->headers && strstr(r->headers, "\"" OUTBOX_ROW_REPLAY_HEADER "\"") != NULL;
}

#endif
