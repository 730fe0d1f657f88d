/* Fuzz target: one outbox row -> AMQP properties and body (message_map()), with the headers
 * and properties JSON, the body and its encoding taken from the input. Besides what the
 * sanitizers see, a row that maps is checked against rabbitmq-c itself: the size that decides
 * whether it fits a frame is exactly what amqp_encode_properties() writes, the frame check
 * agrees with that size at the boundary, and the encoding decodes and encodes again to the
 * same bytes.
 *
 * Input: one selector byte (its low bits pick body_encoding: utf-8, base64, a NULL encoding,
 * or an unknown one), then NUL-separated fields: headers JSON, properties JSON, body, id,
 * content type, routing key. Missing fields take a plain row's values. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <amqp.h>
#include <amqp_framing.h>

#include "amqp/base64.h"
#include "amqp/message_map.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A finding: libFuzzer saves the input that led here and reports it as a crash. */
#define CHECK(cond, ...)                                        \
	do {                                                    \
		if (!(cond)) {                                  \
			fprintf(stderr, "fuzz check failed: "); \
			fprintf(stderr, __VA_ARGS__);           \
			fputc('\n', stderr);                    \
			abort();                                \
		}                                               \
	} while (0)

#define FIELDS 6

static void check_mapped(const struct outbox_row *m, amqp_pool_t *pool, amqp_basic_properties_t *p,
                         amqp_bytes_t body)
{
	size_t n = message_map_properties_size(p);
	unsigned char *buf, *again;
	amqp_bytes_t out, in;
	void *decoded = NULL;
	char err[320];
	int rc;

	CHECK(n != SIZE_MAX && n < (size_t)1 << 30, "a mapped row has no encoded size (%zu)", n);
	buf = malloc(n + 16);
	again = malloc(n + 16);
	CHECK(buf != NULL && again != NULL, "out of memory");

	/* exactly n bytes: encodes, and says so */
	out.bytes = buf;
	out.len = n;
	rc = amqp_encode_properties(AMQP_BASIC_CLASS, p, out);
	CHECK(rc >= 0 && (size_t)rc == n, "size %zu, rabbitmq-c wrote %d", n, rc);
	/* one byte less: rabbitmq-c refuses, as the frame check does */
	out.len = n - 1;
	CHECK(amqp_encode_properties(AMQP_BASIC_CLASS, p, out) < 0,
	      "rabbitmq-c encoded %zu bytes into %zu", n, n - 1);
	CHECK(message_map_check_frame(p, n + MESSAGE_MAP_HEADER_FRAME_OVERHEAD, err, sizeof(err)) ==
	              MESSAGE_MAP_OK,
	      "a frame of exactly the size is refused: %s", err);
	CHECK(message_map_check_frame(p, n + MESSAGE_MAP_HEADER_FRAME_OVERHEAD - 1, err,
	                              sizeof(err)) == MESSAGE_MAP_INVALID,
	      "a frame one byte too small is accepted");
	CHECK(strncmp(err, "headers: ", 9) == 0 || strncmp(err, "properties: ", 12) == 0,
	      "frame error names no column: %s", err);

	/* what the broker would decode is what we meant */
	in.bytes = buf;
	in.len = n;
	rc = amqp_decode_properties(AMQP_BASIC_CLASS, pool, in, &decoded);
	CHECK(rc == 0 && decoded != NULL, "rabbitmq-c cannot decode its own encoding: %d", rc);
	CHECK(message_map_properties_size(decoded) == n, "decoded properties have another size");
	out.bytes = again;
	out.len = n;
	rc = amqp_encode_properties(AMQP_BASIC_CLASS, decoded, out);
	CHECK(rc >= 0 && (size_t)rc == n && memcmp(buf, again, n) == 0,
	      "decoded properties encode differently");

	/* the body check against max_message_size, at its boundary */
	CHECK(message_map_check_body(body.len, body.len, err, sizeof(err)) == MESSAGE_MAP_OK,
	      "a body of exactly the limit is refused");
	if (body.len > 1)
		CHECK(message_map_check_body(body.len, body.len - 1, err, sizeof(err)) ==
		              MESSAGE_MAP_INVALID,
		      "a body one byte over the limit is accepted");
	if (m->body_encoding != NULL && strcmp(m->body_encoding, "base64") == 0)
		CHECK(body.len <= base64_decoded_max(m->body_len), "decoded body too long");
	else
		CHECK(body.len == m->body_len, "a utf-8 body changed length");
	free(buf);
	free(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const encodings[4] = { "utf-8", "base64", NULL, "utf-16" };
	const char *field[FIELDS] = { "{}", "{}", "", "id-1", "application/json", "k" };
	size_t body_len = 0;
	struct outbox_row m;
	amqp_basic_properties_t p;
	amqp_bytes_t body;
	amqp_pool_t pool;
	char err[320];
	char *text;
	int rc;

	if (size == 0)
		return 0;
	text = malloc(size);
	if (text == NULL)
		return 0;
	/* The fields are NUL-terminated in place; the last one ends where the input does. */
	memcpy(text, data + 1, size - 1);
	text[size - 1] = '\0';
	{
		char *s = text, *end = text + size - 1;

		for (size_t i = 0; i < FIELDS && s <= end; i++) {
			size_t len = strlen(s);

			field[i] = s;
			if (i == 2)
				body_len = len;
			s += len + 1;
		}
	}
	memset(&m, 0, sizeof(m));
	m.id = field[3];
	m.exchange = "orders";
	m.routing_key = field[5];
	m.body = field[2];
	m.body_len = body_len;
	m.body_encoding = encodings[data[0] & 3];
	m.content_type = field[4];
	m.headers = field[0];
	m.properties = field[1];
	m.created_at_s = (int64_t)(data[0] >> 2) * 1000003;

	init_amqp_pool(&pool, 4096);
	memset(err, 0, sizeof(err));
	memset(&p, 0xab, sizeof(p)); /* must stay as it is on failure */
	rc = message_map(&m, &pool, &p, &body, err, sizeof(err));
	CHECK(rc == MESSAGE_MAP_OK || rc == MESSAGE_MAP_INVALID || rc == MESSAGE_MAP_NOMEM,
	      "message_map returned %d", rc);
	if (rc == MESSAGE_MAP_OK) {
		check_mapped(&m, &pool, &p, body);
	} else if (rc == MESSAGE_MAP_INVALID) {
		size_t len = strnlen(err, sizeof(err));

		CHECK(len > 0 && len < sizeof(err), "an invalid row without a one-line reason");
		CHECK(strchr(err, '\n') == NULL, "a reason over two lines: %s", err);
		CHECK(p._flags == (amqp_flags_t)0xabababab, "properties written on failure");
	}
	empty_amqp_pool(&pool);
	free(text);
	return 0;
}
