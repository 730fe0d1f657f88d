/* redact.h — hides the secrets of database and broker connection strings, in the strings
 * themselves (config show, start-up lines, configuration errors) and in the messages libpq
 * and rabbitmq-c write about them. Shared by config/, store/, amqp/ and relay/.
 *
 * What counts as a secret: the password of a URI's userinfo, the values of the `password`
 * and `sslpassword` keywords (conninfo) and query parameters (URIs), and everything the
 * parser is not sure about (see redact_conninfo). When unsure, more is masked, never less.
 * The mask is REDACT_MASK; one run of masked bytes becomes one mask. */
#ifndef OUTBOX_BASE_REDACT_H
#define OUTBOX_BASE_REDACT_H

#include <stddef.h>

#define REDACT_MASK "***"

/* Copies s into out (n bytes, always NUL-terminated, truncated to n - 1 bytes) with every
 * secret replaced by REDACT_MASK. s is borrowed and may be NULL (then out is ""); nothing
 * is allocated. s may be:
 *   - a libpq conninfo: "host=db password='a b\'c' dbname=app"
 *     -> "host=db password=*** dbname=app";
 *   - a libpq URI (postgresql:// or postgres://), multi-host included:
 *     "postgresql://app:s3cr?t@h1:5432,h2:5432/app?target_session_attrs=read-write"
 *     -> "postgresql://app:***@h1:5432,h2:5432/app?target_session_attrs=read-write";
 *   - an AMQP URL (amqp://, amqps://), or several separated by commas, each redacted:
 *     "amqp://u:p@a:5672,amqps://u:q@b" -> "amqp://u:***@a:5672,amqps://u:***@b".
 * The userinfo of a URI ends at its last '@' (libpq ends it at the first, rabbitmq-c at the
 * first delimiter: a raw '@', '/', '?' or '#' in a password would otherwise show the rest
 * of it). Also masked, because the libraries would echo them in errors or because they may
 * be a misplaced password: a non-numeric port, the values of keywords and query parameters
 * that libpq does not know, words without '=' in a conninfo or query, whatever follows a
 * password up to the next known keyword (an unquoted "password=a b" is the password "a b"
 * to whoever wrote it), a whole userinfo whose user part holds '/', '?', '#', '&', '=' or
 * blanks, and a dbname that holds a connection string. A comma starts a new URL only when a
 * scheme ("amqp://") follows it: a comma in a libpq host list or in a password does not. */
void redact_conninfo(const char *s, char *out, size_t n);

/* Copies msg (a message from libpq's PQerrorMessage, rabbitmq-c or our own code about the
 * connection) into out (n bytes, always NUL-terminated, truncated to n - 1 bytes) with every
 * occurrence of a secret of conninfo replaced by REDACT_MASK. conninfo is the string the
 * connection was made from, in any form redact_conninfo() accepts; both are borrowed and
 * may be NULL. Each secret redact_conninfo() would mask is looked for as written, with its
 * escapes resolved (conninfo quotes and backslashes), percent-decoded and percent-encoded
 * (upper- and lower-case hex): libpq says `invalid percent-encoded token: "50%off"` about a
 * URI password 50%off. When a secret holds characters a library splits at ('@' or '/' for
 * libpq, ":@/?#[]" for rabbitmq-c, blanks in a conninfo, '&' and '=' in a query), its
 * pieces are looked for too, since the library may have echoed one as a host or a keyword.
 * Secrets of any length are masked, one character included: a one-character password is
 * masked wherever that character appears, which garbles the message but never leaks it.
 * Where two secrets overlap, the longest match at the leftmost position wins. When the
 * secrets cannot be held (out of memory), out is REDACT_MASK alone. */
void redact_message(const char *msg, const char *conninfo, char *out, size_t n);

#endif
