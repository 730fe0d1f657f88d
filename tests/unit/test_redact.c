/* Unit tests of base/redact: passwords with the characters that split URIs (? # % @ : / ,
 * and blanks), raw and percent-encoded, in libpq URIs and conninfo strings, AMQP URLs and
 * lists of them; masked in the strings and in the messages libraries write about them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "base/redact.h"

#define NSECRETS 4
#define NPUBLIC  6

struct redact_case {
	const char *in;
	const char *secrets[NSECRETS]; /* as intended: written, and decoded where they differ */
	const char *public[NPUBLIC];   /* host, port, database, user, parameters: must stay */
	const char *expect;            /* the exact redacted form, or NULL */
};

static const struct redact_case cases[] = {
	{ "postgresql://app:s3cr?t@db.internal:5432/app",
	  { "s3cr?t" },
	  { "app:", "@db.internal:5432/app" },
	  "postgresql://app:***@db.internal:5432/app" },
	{ "postgresql://app:s3cr?t@db/app",
	  { "s3cr?t" },
	  { "@db/app" },
	  "postgresql://app:***@db/app" },
	{ "postgresql://app:p#ss@db/app", { "p#ss" }, { "app:", "@db/app" }, NULL },
	{ "postgresql://app:50%off@db/app", { "50%off" }, { "app:", "@db/app" }, NULL },
	{ "postgresql://app:p%40ss%3Aw%2Frd@db/app",
	  { "p%40ss%3Aw%2Frd", "p@ss:w/rd" },
	  { "app:", "@db/app" },
	  "postgresql://app:***@db/app" },
	{ "postgresql://app:p@ss:w/rd@db:5433/app",
	  { "p@ss:w/rd", "p@ss", "ss:w" },
	  { "app:", "@db:5433/app" },
	  "postgresql://app:***@db:5433/app" },
	{ "postgresql://app:a b c@db/app", { "a b c" }, { "app:", "@db/app" }, NULL },
	{ "postgres://app:x=y&z@db/app?sslmode=require",
	  { "x=y&z" },
	  { "app:", "@db/app?sslmode=require" },
	  NULL },
	{ "postgresql://relay:m%2Fh@h1:5432,h2:5433/orders?target_session_attrs=read-write",
	  { "m%2Fh", "m/h" },
	  { "relay:", "@h1:5432,h2:5433/orders?target_session_attrs=read-write" },
	  "postgresql://relay:***@h1:5432,h2:5433/orders?target_session_attrs=read-write" },
	{ "postgresql://u:a,b@h1,h2/db", { "a,b" }, { "u:", "@h1,h2/db" }, NULL },
	{ "postgresql://[::1]:5432/app?user=relay&password=q%26p%20r&application_name=relay",
	  { "q%26p%20r", "q&p r" },
	  { "[::1]:5432/app?user=relay&password=", "&application_name=relay" },
	  "postgresql://[::1]:5432/app?user=relay&password=***&application_name=relay" },
	{ "postgresql://relay@db/app?sslpassword=k3yp4ss&sslmode=verify-full",
	  { "k3yp4ss" },
	  { "relay@db/app?sslpassword=", "&sslmode=verify-full" },
	  NULL },
	{ "postgresql://relay@db/app?password=raw&cut&sslmode=require",
	  { "raw&cut", "cut" },
	  { "relay@db/app", "&sslmode=require" },
	  NULL },
	{ "host=db port=5432 user=app password='se cr\\'et #1' dbname=app",
	  { "se cr'et #1", "se cr\\'et #1" },
	  { "host=db", "port=5432", "user=app", "dbname=app" },
	  "host=db port=5432 user=app password=*** dbname=app" },
	{ "host=db sslpassword=k3y:p@ss dbname=app",
	  { "k3y:p@ss" },
	  { "host=db", "dbname=app" },
	  "host=db sslpassword=*** dbname=app" },
	{ "host=db password=two words dbname=app",
	  { "two words", "words" },
	  { "host=db", "dbname=app" },
	  "host=db password=*** dbname=app" },
	{ "host=db password=back\\ slash user=app",
	  { "back\\ slash", "back slash" },
	  { "host=db", "user=app" },
	  NULL },
	{ "amqp://relay:r@bbit@mq1:5672/%2f",
	  { "r@bbit", "bbit" },
	  { "relay:", "@mq1:5672/%2f" },
	  "amqp://relay:***@mq1:5672/%2f" },
	{ "amqp://relay:one%3Atwo@mq1:5672,amqps://relay:thr?ee@mq2:5671/vh,amqp://guest@mq3",
	  { "one%3Atwo", "one:two", "thr?ee" },
	  { "relay:", "@mq1:5672,amqps://", "@mq2:5671/vh,amqp://guest@mq3" },
	  "amqp://relay:***@mq1:5672,amqps://relay:***@mq2:5671/vh,amqp://guest@mq3" },
	{ "amqps://relay:pa,ss@mq1:5671", { "pa,ss" }, { "relay:", "@mq1:5671" }, NULL },
	{ "amqp://relay:sl/ash#frag@mq1", { "sl/ash#frag" }, { "relay:", "@mq1" }, NULL },
};

#define NCASES (sizeof(cases) / sizeof(cases[0]))

static void assert_no_secret(const struct redact_case *c, const char *what, const char *out)
{
	for (size_t k = 0; k < NSECRETS && c->secrets[k]; k++)
		cr_assert_null(strstr(out, c->secrets[k]), "%s of \"%s\" shows \"%s\": %s", what,
		               c->in, c->secrets[k], out);
}

Test(redact, conninfo_masks_every_secret_and_keeps_the_rest)
{
	for (size_t i = 0; i < NCASES; i++) {
		const struct redact_case *c = &cases[i];
		char out[512];

		redact_conninfo(c->in, out, sizeof(out));
		assert_no_secret(c, "redact_conninfo", out);
		for (size_t k = 0; k < NPUBLIC && c->public[k]; k++)
			cr_assert_not_null(strstr(out, c->public[k]), "\"%s\" lost \"%s\": %s",
			                   c->in, c->public[k], out);
		cr_assert_not_null(strstr(out, REDACT_MASK), "nothing masked in %s", out);
		if (c->expect)
			cr_assert_str_eq(out, c->expect);
	}
}

/* A message holding each secret as written, decoded and encoded, and the string whole. */
Test(redact, message_masks_every_form_of_every_secret)
{
	for (size_t i = 0; i < NCASES; i++) {
		const struct redact_case *c = &cases[i];
		char msg[2048], out[2048];
		size_t len;

		len = (size_t)snprintf(msg, sizeof(msg), "could not connect with \"%s\":", c->in);
		for (size_t k = 0; k < NSECRETS && c->secrets[k]; k++)
			len += (size_t)snprintf(msg + len, sizeof(msg) - len,
			                        " token \"%s\" near %s;", c->secrets[k],
			                        c->secrets[k]);
		cr_assert_lt(len, sizeof(msg));
		redact_message(msg, c->in, out, sizeof(out));
		assert_no_secret(c, "redact_message", out);
	}
}

Test(redact, message_libpq_echoes)
{
	char out[512];

	/* libpq complains about a bad escape with the token as written. */
	redact_message("invalid percent-encoded token: \"50%off\"", "postgresql://u:50%off@h/db",
	               out, sizeof(out));
	cr_assert_str_eq(out, "invalid percent-encoded token: \"***\"");
	/* libpq ends the password at the first '@' and takes the rest for a host. */
	redact_message("could not translate host name \"cr3t@db\" to address: Name or service not "
	               "known",
	               "postgresql://app:s3@cr3t@db/app", out, sizeof(out));
	cr_assert_null(strstr(out, "cr3t"), "%s", out);
	cr_assert_not_null(strstr(out, "to address: Name or service not known"), "%s", out);
	/* A '/' before the '@' leaves libpq without a userinfo: port and dbname hold the rest. */
	redact_message("invalid integer value \"ab\" for connection option \"port\"; database "
	               "\"cd==@h/db\"",
	               "postgresql://u:ab/cd==@h/db", out, sizeof(out));
	cr_assert_null(strstr(out, "ab\""), "%s", out);
	cr_assert_null(strstr(out, "cd=="), "%s", out);
	/* An unquoted blank ends a conninfo value; libpq echoes the next word. */
	redact_message("missing \"=\" after \"words\" in connection info string",
	               "host=db password=two words dbname=app", out, sizeof(out));
	cr_assert_null(strstr(out, "words"), "%s", out);
	/* The whole URI, echoed by libpq's URI errors. */
	redact_message("unexpected character \"x\" in URI: \"postgresql://u:pw%2F@[::1x/db\"",
	               "postgresql://u:pw%2F@[::1x/db", out, sizeof(out));
	cr_assert_null(strstr(out, "pw"), "%s", out);
	cr_assert_not_null(strstr(out, "postgresql://u:***@[::1x/db"), "%s", out);
}

Test(redact, message_percent_forms)
{
	char out[512];

	/* Written raw in a conninfo, the password may come back encoded, and the other way. */
	redact_message("a p%40ss%3A b p%40ss%3a c p@ss: d", "host=h password=p@ss:", out,
	               sizeof(out));
	cr_assert_str_eq(out, "a *** b *** c *** d");
	redact_message("x n\xc3\xa9 y n%C3%A9 z", "amqp://u:n%C3%A9@h", out, sizeof(out));
	cr_assert_str_eq(out, "x *** y *** z");
	/* %00 stays as written in the decoded form (libpq refuses it; a C string cannot hold
	 * it): the rest of the password, decoded, is still found. */
	redact_message("x a\nb%00 y", "amqp://u:a%0Ab%00@h", out, sizeof(out));
	cr_assert_str_eq(out, "x *** y");
}

Test(redact, message_short_secrets_are_masked_everywhere)
{
	char out[256];

	/* Ugly but never leaky: a one-character password goes wherever that character is. */
	redact_message("box x of xx", "host=h password=x", out, sizeof(out));
	cr_assert_str_eq(out, "bo*** *** of ***");
	/* An empty password has nothing to mask. */
	redact_message("could not connect", "postgresql://u:@h/db", out, sizeof(out));
	cr_assert_str_eq(out, "could not connect");
}

Test(redact, message_without_conninfo_is_copied)
{
	char out[64];

	redact_message("plain text", NULL, out, sizeof(out));
	cr_assert_str_eq(out, "plain text");
	redact_message(NULL, "host=h password=x", out, sizeof(out));
	cr_assert_str_eq(out, "");
	redact_message("plain text", "", out, sizeof(out));
	cr_assert_str_eq(out, "plain text");
}

Test(redact, doubtful_parts_are_masked)
{
	char out[256];

	/* A port that is not a number is likely the rest of a password. */
	redact_conninfo("amqp://relay:pa/ss@mq", out, sizeof(out));
	cr_assert_str_eq(out, "amqp://relay:***@mq");
	redact_conninfo("postgresql://db:s3cret/app", out, sizeof(out));
	cr_assert_str_eq(out, "postgresql://db:***/app");
	/* A keyword libpq does not know (a misspelt password?) and a word without '='. */
	redact_conninfo("host=h pasword=hunter2 dbname=app", out, sizeof(out));
	cr_assert_str_eq(out, "host=h pasword=*** dbname=app");
	redact_conninfo("host=h hunter2 dbname=app", out, sizeof(out));
	cr_assert_str_eq(out, "host=h *** dbname=app");
	/* Percent-encoded or upper-case keywords of a query are still password keywords. */
	redact_conninfo("postgresql://h/db?pass%77ord=hunter2", out, sizeof(out));
	cr_assert_str_eq(out, "postgresql://h/db?pass%77ord=***");
	redact_conninfo("postgresql://h/db?PASSWORD=hunter2", out, sizeof(out));
	cr_assert_str_eq(out, "postgresql://h/db?PASSWORD=***");
	/* A URI that libpq would read as a conninfo (leading blank, capital scheme). */
	redact_conninfo(" PostgreSQL://u:hunter2@h/db", out, sizeof(out));
	cr_assert_str_eq(out, " PostgreSQL://u:***@h/db");
	/* An unterminated quote runs to the end. */
	redact_conninfo("host=h password='hunter2 dbname=app", out, sizeof(out));
	cr_assert_str_eq(out, "host=h password=***");
	/* A dbname holding a connection string. */
	redact_conninfo("dbname='postgresql://u:hunter2@h/db' host=h", out, sizeof(out));
	cr_assert_str_eq(out, "dbname=*** host=h");
	redact_conninfo("postgresql://h/?dbname=host%3Dx%20password%3Dhunter2&sslmode=require", out,
	                sizeof(out));
	cr_assert_str_eq(out, "postgresql://h/?dbname=***&sslmode=require");
	/* A "user" running into the path: no telling where the password is. */
	redact_conninfo("postgresql://h/db?password=hunter2@x", out, sizeof(out));
	cr_assert_null(strstr(out, "hunter2"), "%s", out);
}

Test(redact, nothing_to_mask)
{
	static const char *const plain[] = {
		"",
		"host=db port=5432 dbname=app user=relay sslmode=require",
		"postgresql://relay@db:5432/app?sslmode=require&application_name=relay",
		"postgresql:///app?host=/run/postgresql",
		"amqp://guest@localhost:5672",
		"amqp://localhost",
		"amqps://[::1]:5671/%2f",
	};
	char out[256];

	for (size_t i = 0; i < sizeof(plain) / sizeof(plain[0]); i++) {
		redact_conninfo(plain[i], out, sizeof(out));
		cr_assert_str_eq(out, plain[i]);
	}
	redact_conninfo(NULL, out, sizeof(out));
	cr_assert_str_eq(out, "");
}

Test(redact, output_is_bounded_and_terminated)
{
	char buf[16];

	memset(buf, 'x', sizeof(buf));
	redact_conninfo("amqp://user:secret@h", buf, 14);
	cr_assert_str_eq(buf, "amqp://user:*");
	cr_assert_eq(buf[14], 'x', "wrote past n");
	memset(buf, 'x', sizeof(buf));
	redact_conninfo("amqp://u:secret@h", buf, 1);
	cr_assert_eq(buf[0], '\0');
	cr_assert_eq(buf[1], 'x', "wrote past n");
	redact_conninfo("amqp://u:secret@h", buf, 0);
	cr_assert_eq(buf[1], 'x', "wrote with n = 0");
	memset(buf, 'x', sizeof(buf));
	redact_message("the secret is secret", "amqp://u:secret@h", buf, 8);
	cr_assert_str_eq(buf, "the ***");
	redact_message("secret", "amqp://u:secret@h", buf, 3);
	cr_assert_str_eq(buf, "**");
}

/* More secrets than the parser keeps track of: the rest is masked, never shown. */
Test(redact, many_secrets)
{
	char in[8192], out[8192];
	size_t len = 0;

	for (int i = 0; i < 200; i++)
		len += (size_t)snprintf(in + len, sizeof(in) - len, "password=s%03d port=1 ", i);
	redact_conninfo(in, out, sizeof(out));
	for (int i = 0; i < 200; i++) {
		char s[16];

		snprintf(s, sizeof(s), "s%03d", i);
		cr_assert_null(strstr(out, s), "%s shown", s);
	}
}
