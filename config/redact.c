/* Hides passwords in database and broker URLs and in libpq conninfo strings, so that config
 * show, start-up logs and error messages can print where the relay connects without leaking
 * how it logs in. */
#include <ctype.h>
#include <stdbool.h>
#include <string.h>

#include "config/config.h"

#define MASK "***"

/* Bounded output: always NUL-terminated, silently truncated at n - 1 bytes. */
struct out_buf {
	char *p;
	size_t n, len;
};

static void put(struct out_buf *o, const char *s, size_t len)
{
	for (size_t i = 0; i < len && o->len + 1 < o->n; i++)
		o->p[o->len++] = s[i];
	o->p[o->len] = '\0';
}

static void put_str(struct out_buf *o, const char *s)
{
	put(o, s, strlen(s));
}

/* Length of "scheme://" at the start of s, or 0 when s is not a URI. */
static size_t uri_prefix(const char *s)
{
	size_t i = 0;

	if (!isalpha((unsigned char)s[0]))
		return 0;
	while (isalnum((unsigned char)s[i]) || s[i] == '+' || s[i] == '-' || s[i] == '.')
		i++;
	return strncmp(s + i, "://", 3) == 0 ? i + 3 : 0;
}

static void redact_query(struct out_buf *o, const char *q)
{
	/* libpq URIs may carry ?password=... as a parameter, not only in the userinfo. */
	while (*q) {
		size_t len = strcspn(q, "&#");

		if (len >= 9 && strncmp(q, "password=", 9) == 0) {
			put_str(o, "password=" MASK);
		} else {
			put(o, q, len);
		}
		q += len;
		if (*q == '#') {
			put_str(o, q);
			return;
		}
		if (*q == '&') {
			put(o, q, 1);
			q++;
		}
	}
}

static void redact_uri(struct out_buf *o, const char *s, size_t prefix)
{
	const char *auth = s + prefix;
	size_t auth_len = strcspn(auth, "/?#");
	const char *at = NULL;
	const char *rest;

	put(o, s, prefix);
	/* The last '@' ends the userinfo: an unescaped '@' in a password must not leak the
	 * part after it. */
	for (size_t i = 0; i < auth_len; i++) {
		if (auth[i] == '@')
			at = auth + i;
	}
	if (at) {
		const char *colon = memchr(auth, ':', (size_t)(at - auth));

		if (colon) {
			put(o, auth, (size_t)(colon - auth));
			put_str(o, ":" MASK);
		} else {
			put(o, auth, (size_t)(at - auth));
		}
		put(o, at, auth_len - (size_t)(at - auth));
	} else {
		put(o, auth, auth_len);
	}
	rest = auth + auth_len;
	if (*rest == '/')
		while (*rest && *rest != '?' && *rest != '#')
			put(o, rest++, 1);
	if (*rest == '?') {
		put(o, rest, 1);
		redact_query(o, rest + 1);
	} else {
		put_str(o, rest);
	}
}

/* libpq conninfo: keyword = value pairs split by blanks; values may be single-quoted with
 * backslash escapes. Everything is copied as written except the password's value. */
static void redact_conninfo(struct out_buf *o, const char *s)
{
	const char *p = s;

	while (*p) {
		const char *kw, *v;
		size_t kw_len;
		bool secret;

		while (isspace((unsigned char)*p))
			put(o, p++, 1);
		kw = p;
		while (*p && *p != '=' && !isspace((unsigned char)*p))
			p++;
		kw_len = (size_t)(p - kw);
		put(o, kw, kw_len);
		while (isspace((unsigned char)*p))
			put(o, p++, 1);
		if (*p != '=') {
			continue; /* not a pair; copied as is, the next round goes on */
		}
		put(o, p++, 1);
		while (isspace((unsigned char)*p))
			put(o, p++, 1);
		secret = kw_len == 8 && strncmp(kw, "password", 8) == 0;
		v = p;
		if (*p == '\'') {
			p++;
			while (*p && *p != '\'') {
				if (*p == '\\' && p[1])
					p++;
				p++;
			}
			if (*p == '\'')
				p++;
		} else {
			while (*p && !isspace((unsigned char)*p)) {
				if (*p == '\\' && p[1])
					p++;
				p++;
			}
		}
		if (secret)
			put_str(o, MASK);
		else
			put(o, v, (size_t)(p - v));
	}
}

void config_redact(const char *url_or_conninfo, char *out, size_t n)
{
	struct out_buf o = { out, n, 0 };
	size_t prefix;

	if (!out || n == 0)
		return;
	out[0] = '\0';
	if (!url_or_conninfo)
		return;
	prefix = uri_prefix(url_or_conninfo);
	if (prefix)
		redact_uri(&o, url_or_conninfo, prefix);
	else
		redact_conninfo(&o, url_or_conninfo);
}
