/* text.h — small helpers for the one-line error texts every layer writes: a server's
 * multi-line message made one line, and a user-supplied name quoted without breaking the
 * line. */
#ifndef OUTBOX_BASE_TEXT_H
#define OUTBOX_BASE_TEXT_H

#include <stddef.h>

/* Bytes of a user-supplied name text_shown() quotes before it cuts the rest to "...". */
#define TEXT_SHOWN_MAX 48
/* A buffer that holds any text_shown() answer: TEXT_SHOWN_MAX bytes, "..." and a NUL. */
#define TEXT_SHOWN_SIZE (TEXT_SHOWN_MAX + 8)

/* Makes s one line in place: each line break or tab (a libpq message ends in one, and some
 * hold DETAIL or HINT lines) becomes a blank, and trailing blanks are dropped. */
void text_one_line(char *s);

/* Copies s[0, len) into out (n bytes, always NUL-terminated) for quoting in a one-line
 * error: control bytes become '?', and a name longer than TEXT_SHOWN_MAX bytes is cut there
 * with "..." after it. s is borrowed and may hold NUL bytes (shown as '?'). */
void text_shown(char *out, size_t n, const char *s, size_t len);

/* The value of one hexadecimal digit (either case), or -1 for any other character: the one
 * reading of a %XX escape or \uXXXX digit for every layer. */
int text_hex_value(char c);

#endif
