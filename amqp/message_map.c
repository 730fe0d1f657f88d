/* Turns an outbox row into what basic.publish sends (DESIGN §5) and rejects, with one line
 * naming the column, every row the broker could never accept: those rows go dead at once
 * instead of failing on every retry. */
#include "amqp/message_map.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "amqp/base64.h"
#include "base/json_scan.h"
#include "base/message_property.h"
#include "base/text.h"
#include "base/trace_context.h"

static int fail(char *err, size_t errlen, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return MESSAGE_MAP_INVALID;
}

/* The common case is "{}": answering it without parsing keeps jansson's allocations off the
 * per-message path for rows that carry no headers or properties. */
static bool empty_object(const char *s)
{
	if (s == NULL)
		return true;
	while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
		s++;
	if (*s++ != '{')
		return false;
	while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
		s++;
	if (*s++ != '}')
		return false;
	while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
		s++;
	return *s == '\0';
}

/* Parses a JSON column that must hold an object. *out is a new reference on success. */
static int parse_object(const char *column, const char *text, json_t **out, char *err,
                        size_t errlen)
{
	json_error_t jerr;
	json_t *v =
	        json_loads(text, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);

	if (v == NULL) {
		/* jansson quotes the token it stopped at, raw newlines included: the error
		 * must stay one line */
		for (char *c = jerr.text; *c != '\0'; c++) {
			if ((unsigned char)*c < 0x20 || *c == 0x7f)
				*c = '?';
		}
		return fail(err, errlen, "%s: invalid JSON at line %d column %d: %s", column,
		            jerr.line, jerr.column, jerr.text);
	}
	if (!json_is_object(v)) {
		json_decref(v);
		return fail(err, errlen, "%s: not a JSON object", column);
	}
	*out = v;
	return MESSAGE_MAP_OK;
}

static int pool_copy(amqp_pool_t *pool, const char *s, size_t len, amqp_bytes_t *out)
{
	amqp_bytes_t b = { 0, NULL };

	if (len > 0) {
		amqp_pool_alloc_bytes(pool, len, &b);
		if (b.bytes == NULL)
			return MESSAGE_MAP_NOMEM;
		memcpy(b.bytes, s, len);
	}
	*out = b;
	return MESSAGE_MAP_OK;
}

/* Where a header value sits, for errors: "a.b[2]". */
struct header_path {
	char text[160];
	size_t len;
};

/* Appends ".key" (or "key" at the top) or "[idx]"; returns the old length for path_pop(). */
static size_t path_push(struct header_path *p, const char *key, size_t klen, size_t idx)
{
	size_t old = p->len;
	size_t room = sizeof(p->text) - p->len;
	char name[TEXT_SHOWN_SIZE];
	int w;

	if (key != NULL) {
		text_shown(name, sizeof(name), key, klen);
		w = snprintf(p->text + p->len, room, "%s%s", p->len == 0 ? "" : ".", name);
	} else {
		w = snprintf(p->text + p->len, room, "[%zu]", idx);
	}
	if (w > 0)
		p->len += (size_t)w < room ? (size_t)w : room - 1;
	return old;
}

static void path_pop(struct header_path *p, size_t old)
{
	p->len = old;
	p->text[old] = '\0';
}

static int map_table(json_t *obj, amqp_pool_t *pool, int depth, struct header_path *path,
                     amqp_table_t *out, char *err, size_t errlen);

static int map_value(json_t *v, amqp_pool_t *pool, int depth, struct header_path *path,
                     amqp_field_value_t *out, char *err, size_t errlen)
{
	amqp_field_value_t f;
	int rc = MESSAGE_MAP_OK;

	memset(&f, 0, sizeof(f));
	switch (json_typeof(v)) {
	case JSON_STRING:
		f.kind = AMQP_FIELD_KIND_UTF8;
		rc = pool_copy(pool, json_string_value(v), json_string_length(v), &f.value.bytes);
		break;
	case JSON_INTEGER:
		f.kind = AMQP_FIELD_KIND_I64;
		f.value.i64 = (int64_t)json_integer_value(v);
		break;
	case JSON_REAL:
		f.kind = AMQP_FIELD_KIND_F64;
		f.value.f64 = json_real_value(v);
		break;
	case JSON_TRUE:
	case JSON_FALSE:
		f.kind = AMQP_FIELD_KIND_BOOLEAN;
		f.value.boolean = json_is_true(v);
		break;
	case JSON_NULL:
		f.kind = AMQP_FIELD_KIND_VOID;
		break;
	case JSON_OBJECT:
	case JSON_ARRAY:
		/* RabbitMQ and most clients cap nesting too; a deep structure here is far more
		 * likely a producer bug than a header anyone reads. */
		if (depth >= MESSAGE_MAP_MAX_DEPTH)
			return fail(err, errlen, "headers: key '%s': nested deeper than %d levels",
			            path->text, MESSAGE_MAP_MAX_DEPTH);
		if (json_is_object(v)) {
			f.kind = AMQP_FIELD_KIND_TABLE;
			rc = map_table(v, pool, depth + 1, path, &f.value.table, err, errlen);
		} else {
			size_t n = json_array_size(v);

			f.kind = AMQP_FIELD_KIND_ARRAY;
			f.value.array.num_entries = (int)n;
			f.value.array.entries = NULL;
			if (n > 0) {
				f.value.array.entries =
				        amqp_pool_alloc(pool, n * sizeof(amqp_field_value_t));
				if (f.value.array.entries == NULL)
					return MESSAGE_MAP_NOMEM;
			}
			for (size_t i = 0; i < n && rc == MESSAGE_MAP_OK; i++) {
				size_t old = path_push(path, NULL, 0, i);

				rc = map_value(json_array_get(v, i), pool, depth + 1, path,
				               &f.value.array.entries[i], err, errlen);
				if (rc == MESSAGE_MAP_OK)
					path_pop(path, old);
			}
		}
		break;
	}
	if (rc == MESSAGE_MAP_OK)
		*out = f;
	return rc;
}

static int map_table(json_t *obj, amqp_pool_t *pool, int depth, struct header_path *path,
                     amqp_table_t *out, char *err, size_t errlen)
{
	size_t n = json_object_size(obj);
	amqp_table_t t = { 0, NULL };
	const char *key;
	json_t *v;
	size_t i = 0;

	if (n > 0) {
		t.entries = amqp_pool_alloc(pool, n * sizeof(amqp_table_entry_t));
		if (t.entries == NULL)
			return MESSAGE_MAP_NOMEM;
	}
	json_object_foreach(obj, key, v)
	{
		size_t klen = strlen(key);
		size_t old = path_push(path, key, klen, 0);
		int rc;

		if (klen > MESSAGE_MAP_MAX_KEY)
			return fail(err, errlen, "headers: key '%s': longer than %d bytes",
			            path->text, MESSAGE_MAP_MAX_KEY);
		rc = pool_copy(pool, key, klen, &t.entries[i].key);
		if (rc == MESSAGE_MAP_OK)
			rc = map_value(v, pool, depth, path, &t.entries[i].value, err, errlen);
		if (rc != MESSAGE_MAP_OK)
			return rc;
		path_pop(path, old);
		i++;
	}
	t.num_entries = (int)i;
	*out = t;
	return MESSAGE_MAP_OK;
}

static int map_headers(const char *text, amqp_pool_t *pool, amqp_table_t *out, char *err,
                       size_t errlen)
{
	struct header_path path = { .text = "", .len = 0 };
	json_t *obj = NULL;
	int rc;

	rc = parse_object("headers", text, &obj, err, errlen);
	if (rc != MESSAGE_MAP_OK)
		goto out;
	rc = map_table(obj, pool, 0, &path, out, err, errlen);
out:
	json_decref(obj);
	return rc;
}

/* The field and flag of a property that holds a string (base/message_property.h). */
static amqp_bytes_t *string_field(amqp_basic_properties_t *p, enum message_property_id id,
                                  amqp_flags_t *flag)
{
	switch (id) {
	case MESSAGE_PROPERTY_CORRELATION_ID:
		*flag = AMQP_BASIC_CORRELATION_ID_FLAG;
		return &p->correlation_id;
	case MESSAGE_PROPERTY_REPLY_TO:
		*flag = AMQP_BASIC_REPLY_TO_FLAG;
		return &p->reply_to;
	case MESSAGE_PROPERTY_TYPE:
		*flag = AMQP_BASIC_TYPE_FLAG;
		return &p->type;
	case MESSAGE_PROPERTY_APP_ID:
		*flag = AMQP_BASIC_APP_ID_FLAG;
		return &p->app_id;
	case MESSAGE_PROPERTY_USER_ID:
		*flag = AMQP_BASIC_USER_ID_FLAG;
		return &p->user_id;
	case MESSAGE_PROPERTY_CONTENT_ENCODING:
		*flag = AMQP_BASIC_CONTENT_ENCODING_FLAG;
		return &p->content_encoding;
	case MESSAGE_PROPERTY_EXPIRATION:
		break;
	case MESSAGE_PROPERTY_PRIORITY:
	case MESSAGE_PROPERTY_DELIVERY_MODE:
		break; /* not strings: never asked for */
	}
	*flag = AMQP_BASIC_EXPIRATION_FLAG;
	return &p->expiration;
}

/* "got ..." text for an out-of-range value: the JSON as written, shortened. */
static void shown_json(const void *arg, char *out, size_t n)
{
	char *s = json_dumps(arg, JSON_ENCODE_ANY | JSON_COMPACT);

	if (s == NULL) {
		snprintf(out, n, "?");
		return;
	}
	text_shown(out, n, s, strlen(s));
	free(s);
}

/* One member of the properties column, checked by the rules the producer library checks
 * with (base/message_property.h), into its field of p. */
static int map_one_property(const char *key, json_t *v, amqp_pool_t *pool,
                            amqp_basic_properties_t *p, char *err, size_t errlen)
{
	struct message_property_value val = { .show = shown_json, .show_arg = v };
	const struct message_property *prop;
	amqp_flags_t flag;

	switch (json_typeof(v)) {
	case JSON_NULL:
		val.type = MESSAGE_PROPERTY_JSON_NULL;
		break;
	case JSON_STRING:
		val.type = MESSAGE_PROPERTY_JSON_STRING;
		val.string = json_string_value(v);
		val.len = json_string_length(v);
		break;
	case JSON_INTEGER:
		val.type = MESSAGE_PROPERTY_JSON_INTEGER;
		val.integer = (long long)json_integer_value(v);
		break;
	default:
		val.type = MESSAGE_PROPERTY_JSON_OTHER;
		break;
	}
	if (message_property_check("properties", key, &val, &prop, err, errlen) !=
	    MESSAGE_PROPERTY_OK)
		return MESSAGE_MAP_INVALID;
	if (prop == NULL)
		return MESSAGE_MAP_OK; /* null: not set */
	switch (prop->kind) {
	case MESSAGE_PROPERTY_STRING:
	case MESSAGE_PROPERTY_MILLISECONDS:
		if (pool_copy(pool, val.string, val.len, string_field(p, prop->id, &flag)) !=
		    MESSAGE_MAP_OK)
			return MESSAGE_MAP_NOMEM;
		p->_flags |= flag;
		break;
	case MESSAGE_PROPERTY_PRIORITY_0_9:
		p->priority = (uint8_t)val.integer;
		p->_flags |= AMQP_BASIC_PRIORITY_FLAG;
		break;
	case MESSAGE_PROPERTY_DELIVERY_1_2:
		p->delivery_mode = (uint8_t)val.integer;
		break;
	}
	return MESSAGE_MAP_OK;
}

static int map_properties(const char *text, amqp_pool_t *pool, amqp_basic_properties_t *p,
                          char *err, size_t errlen)
{
	json_t *obj = NULL;
	const char *key;
	json_t *v;
	int rc;

	rc = parse_object("properties", text, &obj, err, errlen);
	if (rc != MESSAGE_MAP_OK)
		goto out;
	json_object_foreach(obj, key, v)
	{
		rc = map_one_property(key, v, pool, p, err, errlen);
		if (rc != MESSAGE_MAP_OK)
			goto out;
	}
out:
	json_decref(obj);
	return rc;
}

/* A column that becomes an AMQP short string. */
static int check_shortstr(const char *column, const char *s, char *err, size_t errlen)
{
	if (s != NULL && strlen(s) > MESSAGE_MAP_MAX_SHORTSTR)
		return fail(err, errlen, "%s: longer than %d bytes", column,
		            MESSAGE_MAP_MAX_SHORTSTR);
	return MESSAGE_MAP_OK;
}

static int map_body(const struct outbox_row *m, amqp_pool_t *pool, amqp_bytes_t *out, char *err,
                    size_t errlen)
{
	const char *enc = m->body_encoding;
	amqp_bytes_t b = { 0, NULL };
	size_t off = 0;
	size_t len = 0;
	char shown[TEXT_SHOWN_SIZE];

	if (enc == NULL || strcmp(enc, "utf-8") == 0) {
		b.len = m->body_len;
		b.bytes = (void *)(uintptr_t)m->body;
		*out = b;
		return MESSAGE_MAP_OK;
	}
	if (strcmp(enc, "base64") != 0) {
		text_shown(shown, sizeof(shown), enc, strlen(enc));
		return fail(err, errlen,
		            "body_encoding: unknown encoding '%s' (allowed: utf-8, base64)", shown);
	}
	amqp_pool_alloc_bytes(pool, base64_decoded_max(m->body_len), &b);
	if (b.bytes == NULL)
		return MESSAGE_MAP_NOMEM;
	if (base64_decode(m->body, m->body_len, b.bytes, &len, &off) != BASE64_OK)
		return fail(err, errlen, "body: invalid base64 at offset %zu", off);
	b.len = len;
	*out = b;
	return MESSAGE_MAP_OK;
}

int message_map(const struct outbox_row *m, amqp_pool_t *pool, amqp_basic_properties_t *props,
                amqp_bytes_t *body, char *err, size_t errlen)
{
	amqp_basic_properties_t p;
	amqp_bytes_t b;
	int rc;

	memset(&p, 0, sizeof(p));
	if (m->id == NULL || m->id[0] == '\0')
		return fail(err, errlen, "id: empty");
	if ((rc = check_shortstr("id", m->id, err, errlen)) != MESSAGE_MAP_OK ||
	    (rc = check_shortstr("exchange_name", m->exchange, err, errlen)) != MESSAGE_MAP_OK ||
	    (rc = check_shortstr("routing_key", m->routing_key, err, errlen)) != MESSAGE_MAP_OK ||
	    (rc = check_shortstr("content_type", m->content_type, err, errlen)) != MESSAGE_MAP_OK)
		return rc;
	rc = map_body(m, pool, &b, err, errlen);
	if (rc != MESSAGE_MAP_OK)
		return rc;

	p._flags = AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
	           AMQP_BASIC_TIMESTAMP_FLAG;
	p.message_id = amqp_cstring_bytes(m->id);
	p.delivery_mode = AMQP_DELIVERY_PERSISTENT;
	p.timestamp = m->created_at_s > 0 ? (uint64_t)m->created_at_s : 0;
	if (m->content_type != NULL && m->content_type[0] != '\0') {
		p.content_type = amqp_cstring_bytes(m->content_type);
		p._flags |= AMQP_BASIC_CONTENT_TYPE_FLAG;
	}
	if (!empty_object(m->headers)) {
		rc = map_headers(m->headers, pool, &p.headers, err, errlen);
		if (rc != MESSAGE_MAP_OK)
			return rc;
		if (p.headers.num_entries > 0)
			p._flags |= AMQP_BASIC_HEADERS_FLAG;
	}
	if (!empty_object(m->properties)) {
		rc = map_properties(m->properties, pool, &p, err, errlen);
		if (rc != MESSAGE_MAP_OK)
			return rc;
	}
	*props = p;
	*body = b;
	return MESSAGE_MAP_OK;
}

/* ---- the trace id of a row ---- */

/* Stops the scan (returns 1) at the first traceparent member that holds a valid one. */
static int find_trace_id(const char *text, const struct jscan_member *m, void *arg)
{
	char value[TRACE_PARENT_MAX + 1];
	size_t n;

	if (m->kind != JSCAN_STRING ||
	    !jscan_string_equal(text, m->key_start, m->key_end, "traceparent", true))
		return 0;
	n = jscan_string_copy(text, m->value_start + 1, m->value_end - 1, value, sizeof(value));
	if (n >= sizeof(value) || strlen(value) != n || trace_parent_check(value, n, arg) != NULL)
		return 0;
	return 1;
}

void message_map_trace_id(const char *headers_json, char *trace_id)
{
	struct jscan_result res;

	trace_id[0] = '\0';
	if (empty_object(headers_json))
		return;
	/* Any nesting the scanner follows: depth is the mapping's business, not the log's. */
	if (jscan_object(headers_json, strlen(headers_json), JSCAN_DEPTH_MAX, find_trace_id,
	                 trace_id, &res) != 1)
		trace_id[0] = '\0';
}

/* ---- encoded sizes, exactly as rabbitmq-c 0.11 encodes (amqp_table.c, amqp_framing.c) ---- */

/* Saturating: SIZE_MAX stands for "cannot be encoded" and stays so. */
static size_t add_size(size_t a, size_t b)
{
	return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}

static size_t table_size(const amqp_table_t *t);

/* One field value: the kind octet and its payload (amqp_encode_field_value()). */
static size_t field_size(const amqp_field_value_t *v)
{
	size_t n = 1, sum;

	switch (v->kind) {
	case AMQP_FIELD_KIND_BOOLEAN:
	case AMQP_FIELD_KIND_I8:
	case AMQP_FIELD_KIND_U8:
		return n + 1;
	case AMQP_FIELD_KIND_I16:
	case AMQP_FIELD_KIND_U16:
		return n + 2;
	case AMQP_FIELD_KIND_I32:
	case AMQP_FIELD_KIND_U32:
	case AMQP_FIELD_KIND_F32:
		return n + 4;
	case AMQP_FIELD_KIND_I64:
	case AMQP_FIELD_KIND_U64:
	case AMQP_FIELD_KIND_F64:
	case AMQP_FIELD_KIND_TIMESTAMP:
		return n + 8;
	case AMQP_FIELD_KIND_DECIMAL:
		return n + 5;
	case AMQP_FIELD_KIND_UTF8:
	case AMQP_FIELD_KIND_BYTES:
		return add_size(n + 4, v->value.bytes.len);
	case AMQP_FIELD_KIND_ARRAY:
		sum = n + 4;
		for (int i = 0; i < v->value.array.num_entries; i++)
			sum = add_size(sum, field_size(&v->value.array.entries[i]));
		return sum;
	case AMQP_FIELD_KIND_TABLE:
		return add_size(n, table_size(&v->value.table));
	case AMQP_FIELD_KIND_VOID:
		return n;
	default:
		return SIZE_MAX; /* amqp_encode_field_value(): AMQP_STATUS_INVALID_PARAMETER */
	}
}

/* A field table: its 32-bit length, then per entry the key as a short string (rabbitmq-c
 * writes the key's length as one octet without checking it; message_map() keeps keys to
 * MESSAGE_MAP_MAX_KEY bytes) and the value. */
static size_t table_size(const amqp_table_t *t)
{
	size_t sum = 4;

	for (int i = 0; i < t->num_entries; i++) {
		sum = add_size(sum, 1 + t->entries[i].key.len);
		sum = add_size(sum, field_size(&t->entries[i].value));
	}
	return sum;
}

static size_t shortstr_size(amqp_bytes_t b)
{
	return b.len > MESSAGE_MAP_MAX_SHORTSTR ? SIZE_MAX : 1 + b.len;
}

size_t message_map_properties_size(const amqp_basic_properties_t *p)
{
	const amqp_flags_t f = p->_flags;
	amqp_flags_t rest = f;
	size_t n = 0;

	/* Flag words: 16 bits each, the lowest bit saying another word follows. */
	do {
		n += 2;
		rest >>= 16;
	} while (rest != 0);
	if (f & AMQP_BASIC_CONTENT_TYPE_FLAG)
		n = add_size(n, shortstr_size(p->content_type));
	if (f & AMQP_BASIC_CONTENT_ENCODING_FLAG)
		n = add_size(n, shortstr_size(p->content_encoding));
	if (f & AMQP_BASIC_HEADERS_FLAG)
		n = add_size(n, table_size(&p->headers));
	if (f & AMQP_BASIC_DELIVERY_MODE_FLAG)
		n = add_size(n, 1);
	if (f & AMQP_BASIC_PRIORITY_FLAG)
		n = add_size(n, 1);
	if (f & AMQP_BASIC_CORRELATION_ID_FLAG)
		n = add_size(n, shortstr_size(p->correlation_id));
	if (f & AMQP_BASIC_REPLY_TO_FLAG)
		n = add_size(n, shortstr_size(p->reply_to));
	if (f & AMQP_BASIC_EXPIRATION_FLAG)
		n = add_size(n, shortstr_size(p->expiration));
	if (f & AMQP_BASIC_MESSAGE_ID_FLAG)
		n = add_size(n, shortstr_size(p->message_id));
	if (f & AMQP_BASIC_TIMESTAMP_FLAG)
		n = add_size(n, 8);
	if (f & AMQP_BASIC_TYPE_FLAG)
		n = add_size(n, shortstr_size(p->type));
	if (f & AMQP_BASIC_USER_ID_FLAG)
		n = add_size(n, shortstr_size(p->user_id));
	if (f & AMQP_BASIC_APP_ID_FLAG)
		n = add_size(n, shortstr_size(p->app_id));
	if (f & AMQP_BASIC_CLUSTER_ID_FLAG)
		n = add_size(n, shortstr_size(p->cluster_id));
	return n;
}

/* "204,873": sizes in errors are read by people. */
static void thousands(uint64_t v, char *out, size_t n)
{
	char digits[24];
	int len = snprintf(digits, sizeof(digits), "%llu", (unsigned long long)v);
	size_t o = 0;

	for (int i = 0; i < len && o + 1 < n; i++) {
		if (i > 0 && (len - i) % 3 == 0) {
			out[o++] = ',';
			if (o + 1 >= n)
				break;
		}
		out[o++] = digits[i];
	}
	out[o] = '\0';
}

int message_map_check_frame(const amqp_basic_properties_t *p, size_t frame_max, char *err,
                            size_t errlen)
{
	size_t props = message_map_properties_size(p);
	size_t frame = add_size(props, MESSAGE_MAP_HEADER_FRAME_OVERHEAD);
	/* Short strings and field kinds are checked by message_map(); what is left to grow
	 * without bound is the headers table. */
	const char *column = (p->_flags & AMQP_BASIC_HEADERS_FLAG) ? "headers" : "properties";
	char got[32], max[32];

	if (frame <= frame_max)
		return MESSAGE_MAP_OK;
	if (props == SIZE_MAX)
		return fail(err, errlen, "%s: cannot be encoded by AMQP", column);
	thousands(frame, got, sizeof(got));
	thousands(frame_max, max, sizeof(max));
	return fail(err, errlen, "%s: encoded size %s bytes exceeds the %s-byte frame", column, got,
	            max);
}

int message_map_check_body(size_t body_len, uint64_t max_message_size, char *err, size_t errlen)
{
	char got[32], max[32];

	if (max_message_size == 0 || body_len <= max_message_size)
		return MESSAGE_MAP_OK;
	thousands(body_len, got, sizeof(got));
	thousands(max_message_size, max, sizeof(max));
	return fail(err, errlen, "body: %s bytes exceed the broker's max_message_size of %s bytes",
	            got, max);
}
