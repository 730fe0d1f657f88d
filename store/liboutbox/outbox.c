/* The producer library: one INSERT ... ON CONFLICT DO NOTHING on the caller's own
 * connection, inside the caller's transaction. Links against libpq only; everything that
 * could make the server reject the row is checked first, because a failed statement would
 * abort the caller's whole transaction, and so is what the relay could never publish (JSON
 * it cannot read, properties it cannot set, malformed trace context), which would otherwise
 * die at publish time. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json_scan.h"
#include "base/message_property.h"
#include "base/text.h"
#include "base/trace_context.h"
#include "base/utf8.h"
#include "store/liboutbox/liboutbox_private.h"
#include "store/liboutbox/outbox.h"
#include "store/store_private.h"

#define ID_MAX_BYTES   64
#define NAME_MAX_CHARS 255 /* VARCHAR(255): exchange, routing key, content type, key */
#define INSERT_SQL_MAX 1024
#define BODY_MAX_BYTES ((size_t)0x3fffffff) /* 1 GiB - 1: PostgreSQL's largest text value */
/* The object and 16 levels below it: the deepest headers the relay maps to AMQP tables
 * (MESSAGE_MAP_MAX_DEPTH); a deeper row would die at publish time. */
#define JSON_MAX_DEPTH 17
/* A key of the properties object longer than this is no property; copied this far, it is
 * still quoted in the error as the relay quotes it (text_shown() cuts at 48 bytes). */
#define PROPERTY_KEY_MAX 64

static bool text_ok(const char *s, long max_chars)
{
	long n = utf8_chars(s, strlen(s));
	return n >= 0 && (max_chars < 0 || n <= max_chars);
}

/* The library sends UTF-8 (DESIGN §1: the relay publishes the columns' bytes, and checks them
 * as UTF-8), so the connection must not convert: on a LATIN1 connection the server would
 * read each UTF-8 byte as a LATIN1 character and store "café" as "cafÃ©". Refused rather
 * than converted: the library cannot tell whether the caller's strings are in the
 * connection's encoding or in UTF-8 (the message says UTF-8), and changing the connection's
 * client_encoding would change how every other string of the caller's transaction is read.
 * SQL_ASCII converts nothing either way: UTF-8 is stored as sent (on a UTF8 database the
 * server still checks it). NULL when fine, else the encoding's name (borrowed from conn). */
const char *store_client_encoding_refused(PGconn *conn)
{
	const char *enc = PQparameterStatus(conn, "client_encoding");

	if (!enc)
		return "unknown";
	if (strcmp(enc, "UTF8") == 0 || strcmp(enc, "SQL_ASCII") == 0)
		return NULL;
	return enc;
}

/* What the headers object holds of the trace context: the keys are matched in any case, as
 * the spec asks readers of its headers to do. */
struct trace_keys {
	int n_parent, n_state;
	struct jscan_member parent, state;
	size_t members;
};

static int find_trace_keys(const char *text, const struct jscan_member *m, void *arg)
{
	struct trace_keys *t = arg;

	t->members++;
	if (jscan_string_equal(text, m->key_start, m->key_end, "traceparent", true)) {
		t->n_parent++;
		t->parent = *m;
	} else if (jscan_string_equal(text, m->key_start, m->key_end, "tracestate", true)) {
		t->n_state++;
		t->state = *m;
	}
	return 0;
}

/* Checks a JSON column the way the relay will read it (a row it cannot read dies at publish
 * time): one object, valid JSON, no duplicate keys, nested no deeper than it maps. fn sees
 * the members (may be NULL). 0 or an OUTBOX_ERR_* with errbuf filled in. */
static int check_json(const char *column, const char *text, jscan_member_fn fn, void *arg,
                      char *errbuf, size_t errlen)
{
	struct jscan_result res;
	int rc = jscan_object(text, strlen(text), JSON_MAX_DEPTH, fn, arg, &res);

	if (rc == JSCAN_NOMEM) {
		liboutbox_set_err(errbuf, errlen, "out of memory", NULL);
		return OUTBOX_ERR_NOMEM;
	}
	if (rc != JSCAN_OK) {
		liboutbox_errorf(errbuf, errlen, "%s must be a JSON object: %s (at byte %zu)",
		                 column, res.error, res.offset);
		return OUTBOX_ERR_INVALID;
	}
	return 0;
}

/* What check_property() found: the first member of the properties object the relay would
 * refuse, with errbuf filled in. */
struct property_check {
	int rc; /* 0, OUTBOX_ERR_INVALID or OUTBOX_ERR_NOMEM */
	char *errbuf;
	size_t errlen;
};

/* A member's value as the JSON text holds it, for the "got ..." of an error. */
struct member_text {
	const char *text;
	const struct jscan_member *m;
};

static void show_member(const void *arg, char *out, size_t n)
{
	const struct member_text *t = arg;

	text_shown(out, n, t->text + t->m->value_start, t->m->value_end - t->m->value_start);
}

/* Whether the number text[start, end) is what jansson, and so the relay, reads as an integer
 * (no fraction, no exponent), and its value; jscan_object() has checked it fits 64 bits. */
static bool integer_number(const char *text, size_t start, size_t end, long long *out)
{
	char digits[24], *stop;
	size_t n = end - start;
	long long v;

	if (n == 0 || n >= sizeof(digits))
		return false;
	memcpy(digits, text + start, n);
	digits[n] = '\0';
	if (strpbrk(digits, ".eE"))
		return false;
	errno = 0;
	v = strtoll(digits, &stop, 10);
	if (errno != 0 || *stop != '\0')
		return false;
	*out = v;
	return true;
}

/* A member of properties_json, checked by the rules the relay maps it by
 * (base/message_property.h). Always goes on (returns 0): the relay parses the whole text
 * before it looks at a member, so a JSON error further on is the one to report. */
static int check_property(const char *text, const struct jscan_member *m, void *arg)
{
	struct property_check *c = arg;
	struct member_text shown = { text, m };
	struct message_property_value v = { .show = show_member, .show_arg = &shown };
	char key[PROPERTY_KEY_MAX + 1], value[MESSAGE_PROPERTY_MAX_STRING + 2], *big = NULL;
	const struct message_property *found;

	if (c->rc != 0)
		return 0; /* the first problem is the one reported */
	switch (m->kind) {
	case JSCAN_NULL:
		v.type = MESSAGE_PROPERTY_JSON_NULL;
		break;
	case JSCAN_STRING:
		/* Unescaped and whole: an expiration is checked digit by digit before its length. */
		v.type = MESSAGE_PROPERTY_JSON_STRING;
		v.string = value;
		v.len = jscan_string_copy(text, m->value_start + 1, m->value_end - 1, value,
		                          sizeof(value));
		if (v.len >= sizeof(value)) {
			big = malloc(v.len + 1);
			if (!big) {
				liboutbox_set_err(c->errbuf, c->errlen, "out of memory", NULL);
				c->rc = OUTBOX_ERR_NOMEM;
				return 0;
			}
			jscan_string_copy(text, m->value_start + 1, m->value_end - 1, big,
			                  v.len + 1);
			v.string = big;
		}
		break;
	case JSCAN_NUMBER:
		v.type = integer_number(text, m->value_start, m->value_end, &v.integer)
		                 ? MESSAGE_PROPERTY_JSON_INTEGER
		                 : MESSAGE_PROPERTY_JSON_OTHER;
		break;
	default:
		v.type = MESSAGE_PROPERTY_JSON_OTHER;
		break;
	}
	jscan_string_copy(text, m->key_start, m->key_end, key, sizeof(key));
	if (message_property_check("properties_json", key, &v, &found, c->errbuf, c->errlen) !=
	    MESSAGE_PROPERTY_OK)
		c->rc = OUTBOX_ERR_INVALID;
	free(big);
	return 0;
}

/* properties_json (NULL = none): a JSON object the relay reads, holding only properties it
 * can set. 0 or an OUTBOX_ERR_* with errbuf filled in. */
static int check_properties(const char *properties, char *errbuf, size_t errlen)
{
	struct property_check c = { 0, errbuf, errlen };
	int rc;

	if (!properties)
		return 0;
	rc = check_json("properties_json", properties, check_property, &c, errbuf, errlen);
	return rc != 0 ? rc : c.rc;
}

/* A trace context member of headers_json: a string holding a valid traceparent (parent) or
 * tracestate, as one given on its own must be. */
static int check_trace_header(const char *headers, const struct jscan_member *m, const char *name,
                              bool parent, char *errbuf, size_t errlen)
{
	char value[TRACE_PARENT_MAX + 2];
	const char *why;
	size_t n;

	if (m->kind != JSCAN_STRING) {
		liboutbox_errorf(errbuf, errlen, "headers_json: %s must be a string", name);
		return OUTBOX_ERR_INVALID;
	}
	n = jscan_string_copy(headers, m->value_start + 1, m->value_end - 1, value, sizeof(value));
	if (n >= sizeof(value) - 1)
		why = "it is longer than 512 characters";
	else if (strlen(value) != n)
		why = "it holds a NUL character";
	else
		why = parent ? trace_parent_check(value, n, NULL)
		             : trace_state_check(value, n, NULL);
	if (why) {
		liboutbox_errorf(errbuf, errlen,
		                 "headers_json: %s is not valid W3C Trace Context: %s%s", name, why,
		                 parent ? " (00-<32 hex trace-id>-<16 hex parent-id>-<2 hex flags>,"
		                          " lowercase)"
		                        : "");
		return OUTBOX_ERR_INVALID;
	}
	return 0;
}

/* Checks m's trace context against what headers (the JSON text, already checked) holds;
 * *add_state says whether m->tracestate is to be stored (one without a member is not). */
static int check_trace(const struct outbox_message *m, const char *headers,
                       const struct trace_keys *t, bool *add_state, char *errbuf, size_t errlen)
{
	const char *why;
	int members = 0, rc;

	*add_state = false;
	if (t->n_parent > 1 || t->n_state > 1) {
		liboutbox_set_err(
		        errbuf, errlen,
		        "headers_json holds traceparent or tracestate twice (the keys differ in "
		        "case only)",
		        NULL);
		return OUTBOX_ERR_INVALID;
	}
	if ((m->traceparent && t->n_parent) || (m->tracestate && t->n_state)) {
		liboutbox_set_err(
		        errbuf, errlen,
		        "trace context given twice: both in headers_json and as traceparent or "
		        "tracestate",
		        NULL);
		return OUTBOX_ERR_INVALID;
	}
	if (t->n_parent &&
	    (rc = check_trace_header(headers, &t->parent, "traceparent", true, errbuf, errlen)))
		return rc;
	if (t->n_state &&
	    (rc = check_trace_header(headers, &t->state, "tracestate", false, errbuf, errlen)))
		return rc;
	if (m->traceparent &&
	    (why = trace_parent_check(m->traceparent, strlen(m->traceparent), NULL)) != NULL) {
		liboutbox_errorf(errbuf, errlen,
		                 "traceparent is not valid W3C Trace Context: %s (00-<32 hex "
		                 "trace-id>-<16 hex parent-id>-<2 hex flags>, lowercase)",
		                 why);
		return OUTBOX_ERR_INVALID;
	}
	if (m->tracestate &&
	    (why = trace_state_check(m->tracestate, strlen(m->tracestate), &members)) != NULL) {
		liboutbox_set_err(errbuf, errlen, "tracestate is not valid W3C Trace Context", why);
		return OUTBOX_ERR_INVALID;
	}
	/* The spec lets a reader drop a tracestate that comes without a traceparent. */
	if ((m->tracestate || t->n_state) && !m->traceparent && !t->n_parent) {
		liboutbox_set_err(errbuf, errlen, "tracestate without traceparent", NULL);
		return OUTBOX_ERR_INVALID;
	}
	*add_state = m->tracestate && members > 0;
	return 0;
}

/* Appends s to out[*n] as a JSON string. s was checked: printable ASCII, where only '"' and
 * '\\' need an escape. */
static void put_json_string(char *out, size_t *n, const char *s)
{
	out[(*n)++] = '"';
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			out[(*n)++] = '\\';
		out[(*n)++] = *s;
	}
	out[(*n)++] = '"';
}

/* Appends "name":"value" to out[*n], after a comma when the object has members already. */
static void put_member(char *out, size_t *n, bool *comma, const char *name, const char *value)
{
	if (*comma)
		out[(*n)++] = ',';
	*comma = true;
	put_json_string(out, n, name);
	out[(*n)++] = ':';
	put_json_string(out, n, value);
}

/* The headers object with traceparent and tracestate (each NULL = not added) added before
 * its closing brace. Ownership: a new string (caller frees), NULL when out of memory. */
static char *headers_with_trace(const char *headers, const struct trace_keys *t,
                                const char *traceparent, const char *tracestate)
{
	size_t len = strlen(headers), close = len, n = 0;
	bool comma = t->members > 0;
	char *out;

	while (close > 0 && headers[close - 1] != '}')
		close--;
	close--; /* the closing brace: the text is a checked object */
	/* Each value at most doubles with its escapes; names, quotes, ':' and ',' fit in 64. */
	out = malloc(len +
	             2 * ((traceparent ? strlen(traceparent) : 0) +
	                  (tracestate ? strlen(tracestate) : 0)) +
	             64);
	if (!out)
		return NULL;
	memcpy(out, headers, close);
	n = close;
	if (traceparent)
		put_member(out, &n, &comma, "traceparent", traceparent);
	if (tracestate)
		put_member(out, &n, &comma, "tracestate", tracestate);
	memcpy(out + n, headers + close, len - close + 1);
	return out;
}

static bool base64_ok(const char *s, size_t len)
{
	size_t i, pad = 0;

	if (len % 4 != 0)
		return false;
	for (i = 0; i < len; i++) {
		char c = s[i];
		if (c == '=') {
			pad++;
			continue;
		}
		if (pad > 0)
			return false; /* data after padding */
		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
		      c == '+' || c == '/'))
			return false;
	}
	return pad <= 2;
}

/* Ownership: returns a new NUL-terminated string (caller frees), NULL on out of memory. */
static char *base64_encode(const unsigned char *in, size_t len)
{
	static const char tab[] =
	        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t out_len = 4 * ((len + 2) / 3), i, j = 0;
	char *out;

	if (len > (SIZE_MAX / 4) * 3 - 3)
		return NULL;
	out = malloc(out_len + 1);
	if (!out)
		return NULL;
	for (i = 0; i + 2 < len; i += 3) {
		unsigned v = (unsigned)in[i] << 16 | (unsigned)in[i + 1] << 8 | in[i + 2];
		out[j++] = tab[(v >> 18) & 63];
		out[j++] = tab[(v >> 12) & 63];
		out[j++] = tab[(v >> 6) & 63];
		out[j++] = tab[v & 63];
	}
	if (i < len) {
		unsigned v = (unsigned)in[i] << 16 | (i + 1 < len ? (unsigned)in[i + 1] << 8 : 0);
		out[j++] = tab[(v >> 18) & 63];
		out[j++] = tab[(v >> 12) & 63];
		out[j++] = i + 1 < len ? tab[(v >> 6) & 63] : '=';
		out[j++] = '=';
	}
	out[j] = '\0';
	return out;
}

/* Where the row goes: a connection that sends UTF-8 unchanged, and a table name that can be
 * pasted into SQL. 0 or OUTBOX_ERR_INVALID with errbuf filled in. */
static int check_target(PGconn *conn, const char *table, const struct outbox_message *m,
                        char *errbuf, size_t errlen)
{
	const char *encoding;

	if (!conn || !m) {
		liboutbox_set_err(errbuf, errlen, "no connection or no message", NULL);
		return OUTBOX_ERR_INVALID;
	}
	if (!identifier_valid(table)) {
		liboutbox_set_err(errbuf, errlen, "invalid table name", table);
		return OUTBOX_ERR_INVALID;
	}
	if ((encoding = store_client_encoding_refused(conn)) != NULL) {
		liboutbox_errorf(errbuf, errlen,
		                 "the connection's client_encoding is %s, but outbox_add() sends "
		                 "UTF-8: set it to UTF8 (client_encoding=UTF8 in the connection "
		                 "string, or PQsetClientEncoding(conn, \"UTF8\"))",
		                 encoding);
		return OUTBOX_ERR_INVALID;
	}
	return 0;
}

/* Everything of m but its body, as the table's columns and the relay will take it: headers is
 * the headers object m gives ("{}" when none); *trace gets its trace context keys and
 * *add_state whether m->tracestate is to be stored. 0 or an OUTBOX_ERR_* with errbuf filled
 * in. */
static int check_message(const struct outbox_message *m, const char *headers,
                         struct trace_keys *trace, bool *add_state, char *errbuf, size_t errlen)
{
	size_t id_len = m->id ? strlen(m->id) : 0;
	int rc;

	if (id_len < 1 || id_len > ID_MAX_BYTES || !text_ok(m->id, -1)) {
		liboutbox_set_err(errbuf, errlen, "id must be 1 to 64 bytes of UTF-8", NULL);
		return OUTBOX_ERR_INVALID;
	}
	if (!m->exchange || !text_ok(m->exchange, NAME_MAX_CHARS)) {
		liboutbox_set_err(errbuf, errlen, "exchange must be set and at most 255 characters",
		                  NULL);
		return OUTBOX_ERR_INVALID;
	}
	if (!m->routing_key || !text_ok(m->routing_key, NAME_MAX_CHARS)) {
		liboutbox_set_err(errbuf, errlen,
		                  "routing key must be set and at most 255 characters", NULL);
		return OUTBOX_ERR_INVALID;
	}
	if ((m->content_type && !text_ok(m->content_type, NAME_MAX_CHARS)) ||
	    (m->ordering_key && !text_ok(m->ordering_key, NAME_MAX_CHARS))) {
		liboutbox_set_err(errbuf, errlen,
		                  "content type and ordering key are at most 255 characters", NULL);
		return OUTBOX_ERR_INVALID;
	}
	/* now() + delay would overflow the timestamp or the interval far below INT64_MAX, and a
	 * statement that fails aborts the caller's transaction. */
	if (m->delay_ms > OUTBOX_DELAY_MAX_MS) {
		liboutbox_errorf(errbuf, errlen,
		                 "delay_ms %lld is above the maximum of %lld (365 days)",
		                 (long long)m->delay_ms, (long long)OUTBOX_DELAY_MAX_MS);
		return OUTBOX_ERR_INVALID;
	}
	if ((rc = check_json("headers_json", headers, find_trace_keys, trace, errbuf, errlen)) ||
	    (rc = check_properties(m->properties_json, errbuf, errlen)) ||
	    (rc = check_trace(m, headers, trace, add_state, errbuf, errlen)))
		return rc;
	return 0;
}

/* The body column as outbox_add() sends it. */
struct body {
	const char *data;     /* the bytes, not NUL-terminated (borrowed from m, or encoded) */
	int len;              /* at most BODY_MAX_BYTES */
	const char *encoding; /* the body_encoding column: "utf-8" or "base64" */
	char *encoded;        /* owned (free()): the base64 text data points to, else NULL */
};

/* m's body as the body and body_encoding columns: given bytes that are not UTF-8 are
 * base64-encoded (b->encoded), and a given encoding is checked. On success the caller frees
 * b->encoded; on failure nothing is left to free. 0 or an OUTBOX_ERR_* with errbuf filled
 * in. */
static int encode_body(const struct outbox_message *m, struct body *b, char *errbuf, size_t errlen)
{
	if (!m->body && m->body_len > 0) {
		liboutbox_set_err(errbuf, errlen, "body is NULL but body_len is not 0", NULL);
		return OUTBOX_ERR_INVALID;
	}
	b->data = m->body ? m->body : "";
	b->len = (int)m->body_len;
	b->encoded = NULL;
	if (m->body_len > BODY_MAX_BYTES) {
		liboutbox_set_err(errbuf, errlen, "body too large", NULL);
		return OUTBOX_ERR_INVALID;
	}
	if (!m->body_encoding) {
		if (utf8_chars(b->data, m->body_len) >= 0) {
			b->encoding = "utf-8";
			return 0;
		}
		b->encoding = "base64";
		b->encoded = base64_encode((const unsigned char *)b->data, m->body_len);
		if (!b->encoded) {
			liboutbox_set_err(errbuf, errlen, "out of memory", NULL);
			return OUTBOX_ERR_NOMEM;
		}
		b->data = b->encoded;
		b->len = (int)strlen(b->encoded);
		return 0;
	}
	if (strcmp(m->body_encoding, "utf-8") == 0) {
		b->encoding = "utf-8";
		if (utf8_chars(b->data, m->body_len) < 0) {
			liboutbox_set_err(errbuf, errlen,
			                  "body is not valid UTF-8 (or holds NUL bytes)", NULL);
			return OUTBOX_ERR_INVALID;
		}
		return 0;
	}
	if (strcmp(m->body_encoding, "base64") == 0) {
		b->encoding = "base64";
		if (!base64_ok(b->data, m->body_len)) {
			liboutbox_set_err(errbuf, errlen, "body is not valid base64", NULL);
			return OUTBOX_ERR_INVALID;
		}
		return 0;
	}
	liboutbox_set_err(errbuf, errlen, "body_encoding must be \"utf-8\" or \"base64\"", NULL);
	return OUTBOX_ERR_INVALID;
}

/* The one statement outbox_add() sends, with the checked message: OUTBOX_ADDED,
 * OUTBOX_DUPLICATE, or an OUTBOX_ERR_* with errbuf filled in (the caller's transaction is
 * then aborted). ON CONFLICT names no target: on a partitioned table (docs/design.md) id is
 * unique in each partition only, and PostgreSQL infers no arbiter for (id) on the parent,
 * while a conflict without target is checked against the partition's own unique index on id.
 * On a plain table it is the same test (seq never conflicts: the table draws it). */
static int insert_row(PGconn *conn, const char *table, const struct outbox_message *m,
                      const char *headers, const struct body *b, char *errbuf, size_t errlen)
{
	char sql[INSERT_SQL_MAX], delay[24];
	/* The body goes as a binary-format text parameter: no copy to NUL-terminate it, and
	 * the server still checks the encoding. */
	const char *values[10] = { m->id,
		                   m->exchange,
		                   m->routing_key,
		                   b->data,
		                   b->encoding,
		                   m->content_type ? m->content_type : "application/json",
		                   headers,
		                   m->properties_json ? m->properties_json : "{}",
		                   m->ordering_key, /* NULL = SQL NULL */
		                   delay };
	const int lengths[10] = { [3] = b->len }, formats[10] = { [3] = 1 };
	PGresult *res;
	int rc;

	snprintf(delay, sizeof(delay), "%lld", (long long)(m->delay_ms > 0 ? m->delay_ms : 0));
	snprintf(sql, sizeof(sql),
	         "INSERT INTO %s (id, exchange_name, routing_key, body, body_encoding,"
	         " content_type, headers, properties, ordering_key, available_at)"
	         " VALUES ($1, $2, $3, $4::text, $5, $6, $7, $8, $9,"
	         " now() + $10::bigint * interval '1 millisecond')"
	         " ON CONFLICT DO NOTHING",
	         table);
	res = PQexecParams(conn, sql, 10, NULL, values, lengths, formats, 0);
	if (PQresultStatus(res) != PGRES_COMMAND_OK) {
		const char *msg = res ? PQresultErrorMessage(res) : PQerrorMessage(conn);
		char line[512];

		snprintf(line, sizeof(line), "%s", msg && msg[0] ? msg : "no result");
		text_one_line(line);
		liboutbox_set_err(errbuf, errlen, "could not insert into the outbox", line);
		rc = res ? OUTBOX_ERR_QUERY : OUTBOX_ERR_NOMEM;
		if (PQstatus(conn) == CONNECTION_BAD)
			rc = OUTBOX_ERR_QUERY;
	} else {
		rc = strcmp(PQcmdTuples(res), "1") == 0 ? OUTBOX_ADDED : OUTBOX_DUPLICATE;
	}
	PQclear(res);
	return rc;
}

/* conn and m are borrowed; nothing is kept after the call. */
int outbox_add(PGconn *conn, const char *table, const struct outbox_message *m, char *errbuf,
               size_t errlen)
{
	struct trace_keys trace = { 0 };
	struct body body = { 0 };
	const char *headers;
	char *traced = NULL;
	bool add_state = false;
	int rc;

	if (!table)
		table = "outbox";
	if ((rc = check_target(conn, table, m, errbuf, errlen)) != 0)
		return rc;
	headers = m->headers_json ? m->headers_json : "{}";
	if ((rc = check_message(m, headers, &trace, &add_state, errbuf, errlen)) != 0 ||
	    (rc = encode_body(m, &body, errbuf, errlen)) != 0)
		return rc;
	if (m->traceparent || add_state) {
		traced = headers_with_trace(headers, &trace, m->traceparent,
		                            add_state ? m->tracestate : NULL);
		if (!traced) {
			liboutbox_set_err(errbuf, errlen, "out of memory", NULL);
			rc = OUTBOX_ERR_NOMEM;
			goto out;
		}
		headers = traced;
	}
	rc = insert_row(conn, table, m, headers, &body, errbuf, errlen);
out:
	free(body.encoded);
	free(traced);
	return rc;
}
