/* Fuzz target: redact_conninfo() and redact_message(). Every input checks that the output is
 * NUL-terminated within n and nothing past n is written. Inputs whose first byte picks a
 * template also check that no secret leaks: the rest of the input is a password S (up to the
 * first NUL) and text for the message (after it); S is put into a connection string the way
 * an operator would write it (raw, percent-encoded or quoted), and neither the redacted string
 * nor a message holding S (as is, percent-encoded, and percent-decoded where a library
 * decodes it) may show it.
 *
 * What S may hold: anything but NUL and '*' (a password of asterisks is indistinguishable
 * from the mask), and in URIs no "://", which starts a new URL of a list (see redact.h);
 * unquoted conninfo values hold no blank, backslash or leading quote (libpq's own syntax). */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/redact.h"
#include "base/text.h"
#include "tests/fuzz/fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define OUT_MAX 8192
#define CANARY  0x5a

enum form { RAW, PCT, QUOTED };

/* The connection string around S: pre, S in some form, post. */
static const struct template
{
	const char *pre;
	enum form form;
	const char *post;
	bool uri;
	bool unquoted_conninfo;
}
templates[] = {
	{ "postgresql://relay:", RAW, "@db.example:5432/app?sslmode=require", true, false },
	{ "postgres://relay:", RAW, "@h1:5432,h2:5433/app?target_session_attrs=read-write", true,
	  false },
	{ "postgresql://relay:", PCT, "@db/app", true, false },
	{ "postgresql://relay@db/app?password=", PCT, "&sslmode=require", true, false },
	{ "postgresql://relay@db/app?sslpassword=", PCT, "", true, false },
	{ "host=db port=5432 user=relay password=", QUOTED, " dbname=app", false, false },
	{ "host=db sslpassword=", QUOTED, " dbname=app", false, false },
	{ "host=db password=", RAW, " dbname=app", false, true },
	{ "amqp://relay:", RAW, "@mq1:5672/%2f", true, false },
	{ "amqps://relay:", PCT, "@mq1:5671,amqp://relay:pw@mq2:5672", true, false },
	{ "amqp://guest@mq0,amqps://relay:", RAW, "@mq1:5671/vh", true, false },
};

#define NTEMPLATES (sizeof(templates) / sizeof(templates[0]))

static size_t pct_encode(const char *s, char *buf)
{
	size_t n = 0;

	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
		    (*p >= '0' && *p <= '9') || (*p && strchr("-._~", *p))) {
			buf[n++] = (char)*p;
		} else {
			buf[n++] = '%';
			buf[n++] = "0123456789ABCDEF"[*p >> 4];
			buf[n++] = "0123456789ABCDEF"[*p & 15];
		}
	}
	buf[n] = '\0';
	return n;
}

static void pct_decode(const char *s, char *buf)
{
	size_t n = 0;

	for (size_t i = 0; s[i]; i++) {
		int hi = s[i] == '%' && s[i + 1] ? text_hex_value(s[i + 1]) : -1;
		int lo = hi >= 0 && s[i + 2] ? text_hex_value(s[i + 2]) : -1;

		if (lo >= 0 && hi * 16 + lo != 0) {
			buf[n++] = (char)(hi * 16 + lo);
			i += 2;
		} else {
			buf[n++] = s[i];
		}
	}
	buf[n] = '\0';
}

static void conninfo_quote(const char *s, char *buf)
{
	size_t n = 0;

	buf[n++] = '\'';
	for (const char *p = s; *p; p++) {
		if (*p == '\'' || *p == '\\')
			buf[n++] = '\\';
		buf[n++] = *p;
	}
	buf[n++] = '\'';
	buf[n] = '\0';
}

static size_t count(const char *hay, const char *needle)
{
	size_t n = 0, len = strlen(needle);

	if (len == 0)
		return 0;
	for (const char *p = hay; (p = strstr(p, needle)) != NULL; p++)
		n++;
	return n;
}

/* Runs both functions into a buffer of n bytes inside a larger one and checks the bounds. */
static void check_bounds(const char *s, const char *msg, size_t n)
{
	static char buf[OUT_MAX + 16];

	memset(buf, CANARY, sizeof(buf));
	redact_conninfo(s, buf, n);
	if (n > 0 && strnlen(buf, n) >= n)
		FUZZ_FAIL("redact_conninfo: no NUL within %zu bytes", n);
	for (size_t i = n; i < sizeof(buf); i++) {
		if ((unsigned char)buf[i] != CANARY)
			FUZZ_FAIL("redact_conninfo wrote byte %zu with n = %zu", i, n);
	}
	memset(buf, CANARY, sizeof(buf));
	redact_message(msg, s, buf, n);
	if (n > 0 && strnlen(buf, n) >= n)
		FUZZ_FAIL("redact_message: no NUL within %zu bytes", n);
	for (size_t i = n; i < sizeof(buf); i++) {
		if ((unsigned char)buf[i] != CANARY)
			FUZZ_FAIL("redact_message wrote byte %zu with n = %zu", i, n);
	}
}

static bool secret_allowed(const char *s, const struct template *t)
{
	if (*s == '\0' || strchr(s, '*'))
		return false;
	if (t->uri && strstr(s, "://"))
		return false;
	if (t->unquoted_conninfo && (s[0] == '\'' || strpbrk(s, " \t\n\r\f\v\\")))
		return false;
	return true;
}

/* The leak checks for S in template t; extra is more message text from the input. */
static void check_template(const struct template *t, const char *s, const char *extra)
{
	static char placed[OUT_MAX], conn[OUT_MAX * 2], expect[OUT_MAX * 2], out[OUT_MAX * 2];
	static char msg[OUT_MAX * 6], enc[OUT_MAX], dec[OUT_MAX];
	const char *forms[3];

	pct_encode(s, enc);
	pct_decode(s, dec);
	if (t->form == PCT)
		snprintf(placed, sizeof(placed), "%s", enc);
	else if (t->form == QUOTED)
		conninfo_quote(s, placed);
	else
		snprintf(placed, sizeof(placed), "%s", s);
	snprintf(conn, sizeof(conn), "%s%s%s", t->pre, placed, t->post);
	snprintf(expect, sizeof(expect), "%s" REDACT_MASK "%s", t->pre, t->post);

	/* The password is S, written as placed; a URI also decodes what is written raw. */
	forms[0] = s;
	forms[1] = enc;
	forms[2] = t->uri && t->form == RAW ? dec : s;
	/* The string: S shows no more often than in the template with S masked. */
	redact_conninfo(conn, out, sizeof(out));
	for (size_t i = 0; i < 3; i++) {
		if (!strchr(forms[i], '*') && count(out, forms[i]) > count(expect, forms[i]))
			FUZZ_FAIL("redact_conninfo(\"%s\") = \"%s\" shows \"%s\"", conn, out,
			          forms[i]);
	}
	/* A message with S in every form, and the string whole, as libpq's URI errors do. */
	snprintf(msg, sizeof(msg), "could not connect: \"%s\" %s %s %s; \"%s\" %s", s, enc, dec,
	         extra, conn, s);
	redact_message(msg, conn, out, sizeof(out));
	for (size_t i = 0; i < 3; i++) {
		if (!strchr(forms[i], '*') && strstr(out, forms[i]))
			FUZZ_FAIL("redact_message(\"%s\", \"%s\") = \"%s\" shows \"%s\"", msg, conn,
			          out, forms[i]);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *in;
	const char *s, *extra;
	size_t slen;
	uint8_t mode;

	if (size < 2 || size > OUT_MAX / 4)
		return 0;
	in = malloc(size);
	if (!in)
		return 0;
	mode = data[0];
	memcpy(in, data + 1, size - 1);
	in[size - 1] = '\0';
	/* The part up to the first NUL is the string (or S), the rest the message. */
	s = in;
	slen = strlen(s);
	extra = slen + 1 < size - 1 ? in + slen + 1 : "";
	check_bounds(s, extra, (size_t)data[1] % 64);
	check_bounds(s, extra, OUT_MAX);
	if (mode < NTEMPLATES && secret_allowed(s, &templates[mode]))
		check_template(&templates[mode], s, extra);
	free(in);
	return 0;
}
