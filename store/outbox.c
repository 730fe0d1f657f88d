/* The producer library: one INSERT ... ON CONFLICT (id) DO NOTHING on the caller's own
 * connection, inside the caller's transaction. Links against libpq only; everything that
 * could make the server reject the row is checked first, because a failed statement would
 * abort the caller's whole transaction. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "store/outbox.h"
#include "store/store_private.h"

#define ID_MAX_BYTES   64
#define NAME_MAX_CHARS 255 /* VARCHAR(255): exchange, routing key, content type, key */
#define INSERT_SQL_MAX 1024

static void set_err(char *errbuf, size_t errlen, const char *msg, const char *detail)
{
	if (errbuf && errlen > 0)
		snprintf(errbuf, errlen, "%s%s%s", msg, detail ? ": " : "", detail ? detail : "");
}

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

/* A JSON object in outline (the relay checks it fully and marks the row dead if it is not):
 * catches the common mistake of passing an array or a bare value. */
static bool json_object_ok(const char *s)
{
	size_t n = strlen(s);

	while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
		s++, n--;
	while (n > 0 &&
	       (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r'))
		n--;
	return n >= 2 && s[0] == '{' && s[n - 1] == '}' && utf8_chars(s, n) >= 0;
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

/* conn and m are borrowed; nothing is kept after the call. */
int outbox_add(PGconn *conn, const char *table, const struct outbox_message *m, char *errbuf,
               size_t errlen)
{
	char sql[INSERT_SQL_MAX], delay[24];
	const char *values[10];
	int lengths[10] = { 0 }, formats[10] = { 0 };
	const char *encoding;
	char *encoded = NULL;
	PGresult *res = NULL;
	size_t id_len;
	int rc;

	if (!table)
		table = "outbox";
	if (!conn || !m) {
		set_err(errbuf, errlen, "no connection or no message", NULL);
		return OUTBOX_ERR_INVALID;
	}
	if (!identifier_valid(table)) {
		set_err(errbuf, errlen, "invalid table name", table);
		return OUTBOX_ERR_INVALID;
	}
	if ((encoding = store_client_encoding_refused(conn)) != NULL) {
		if (errbuf && errlen > 0)
			snprintf(
			        errbuf, errlen,
			        "the connection's client_encoding is %s, but outbox_add() sends "
			        "UTF-8:"
			        " set it to UTF8 (client_encoding=UTF8 in the connection string, or"
			        " PQsetClientEncoding(conn, \"UTF8\"))",
			        encoding);
		return OUTBOX_ERR_INVALID;
	}
	id_len = m->id ? strlen(m->id) : 0;
	if (id_len < 1 || id_len > ID_MAX_BYTES || !text_ok(m->id, -1)) {
		set_err(errbuf, errlen, "id must be 1 to 64 bytes of UTF-8", NULL);
		return OUTBOX_ERR_INVALID;
	}
	if (!m->exchange || !text_ok(m->exchange, NAME_MAX_CHARS)) {
		set_err(errbuf, errlen, "exchange must be set and at most 255 characters", NULL);
		return OUTBOX_ERR_INVALID;
	}
	if (!m->routing_key || !text_ok(m->routing_key, NAME_MAX_CHARS)) {
		set_err(errbuf, errlen, "routing key must be set and at most 255 characters", NULL);
		return OUTBOX_ERR_INVALID;
	}
	if ((m->content_type && !text_ok(m->content_type, NAME_MAX_CHARS)) ||
	    (m->ordering_key && !text_ok(m->ordering_key, NAME_MAX_CHARS))) {
		set_err(errbuf, errlen, "content type and ordering key are at most 255 characters",
		        NULL);
		return OUTBOX_ERR_INVALID;
	}
	if ((m->headers_json && !json_object_ok(m->headers_json)) ||
	    (m->properties_json && !json_object_ok(m->properties_json))) {
		set_err(errbuf, errlen, "headers and properties must be JSON objects", NULL);
		return OUTBOX_ERR_INVALID;
	}
	if (!m->body && m->body_len > 0) {
		set_err(errbuf, errlen, "body is NULL but body_len is not 0", NULL);
		return OUTBOX_ERR_INVALID;
	}

	/* The body goes as a binary-format text parameter: no copy to NUL-terminate it, and
	 * the server still checks the encoding. */
	values[3] = m->body ? m->body : "";
	lengths[3] = (int)m->body_len;
	formats[3] = 1;
	if (m->body_len > (size_t)0x3fffffff) {
		set_err(errbuf, errlen, "body too large", NULL);
		return OUTBOX_ERR_INVALID;
	}
	if (!m->body_encoding) {
		if (utf8_chars(values[3], m->body_len) >= 0) {
			encoding = "utf-8";
		} else {
			encoding = "base64";
			encoded = base64_encode((const unsigned char *)values[3], m->body_len);
			if (!encoded) {
				set_err(errbuf, errlen, "out of memory", NULL);
				return OUTBOX_ERR_NOMEM;
			}
			values[3] = encoded;
			lengths[3] = (int)strlen(encoded);
		}
	} else if (strcmp(m->body_encoding, "utf-8") == 0) {
		encoding = "utf-8";
		if (utf8_chars(values[3], m->body_len) < 0) {
			set_err(errbuf, errlen, "body is not valid UTF-8 (or holds NUL bytes)",
			        NULL);
			return OUTBOX_ERR_INVALID;
		}
	} else if (strcmp(m->body_encoding, "base64") == 0) {
		encoding = "base64";
		if (!base64_ok(values[3], m->body_len)) {
			set_err(errbuf, errlen, "body is not valid base64", NULL);
			return OUTBOX_ERR_INVALID;
		}
	} else {
		set_err(errbuf, errlen, "body_encoding must be \"utf-8\" or \"base64\"", NULL);
		return OUTBOX_ERR_INVALID;
	}

	snprintf(delay, sizeof(delay), "%lld", (long long)(m->delay_ms > 0 ? m->delay_ms : 0));
	values[0] = m->id;
	values[1] = m->exchange;
	values[2] = m->routing_key;
	values[4] = encoding;
	values[5] = m->content_type ? m->content_type : "application/json";
	values[6] = m->headers_json ? m->headers_json : "{}";
	values[7] = m->properties_json ? m->properties_json : "{}";
	values[8] = m->ordering_key; /* NULL = SQL NULL */
	values[9] = delay;
	snprintf(sql, sizeof(sql),
	         "INSERT INTO %s (id, exchange_name, routing_key, body, body_encoding,"
	         " content_type, headers, properties, ordering_key, available_at)"
	         " VALUES ($1, $2, $3, $4::text, $5, $6, $7, $8, $9,"
	         " now() + $10::bigint * interval '1 millisecond')"
	         " ON CONFLICT (id) DO NOTHING",
	         table);
	res = PQexecParams(conn, sql, 10, NULL, values, lengths, formats, 0);
	if (PQresultStatus(res) != PGRES_COMMAND_OK) {
		const char *msg = res ? PQresultErrorMessage(res) : PQerrorMessage(conn);
		char line[512];
		snprintf(line, sizeof(line), "%s", msg && msg[0] ? msg : "no result");
		for (char *c = line; *c; c++)
			if (*c == '\n' || *c == '\r')
				*c = ' ';
		for (size_t n = strlen(line); n > 0 && line[n - 1] == ' '; n--)
			line[n - 1] = '\0';
		set_err(errbuf, errlen, "could not insert into the outbox", line);
		rc = res ? OUTBOX_ERR_QUERY : OUTBOX_ERR_NOMEM;
		if (PQstatus(conn) == CONNECTION_BAD)
			rc = OUTBOX_ERR_QUERY;
		goto out;
	}
	rc = strcmp(PQcmdTuples(res), "1") == 0 ? OUTBOX_ADDED : OUTBOX_DUPLICATE;
out:
	PQclear(res);
	free(encoded);
	return rc;
}
