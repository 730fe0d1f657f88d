/* UTF-8 as PostgreSQL accepts it (no overlong forms, no surrogates, nothing above U+10FFFF, no
 * NUL): the producer library checks text with it before a statement could fail, the store
 * cuts error texts at a character boundary, and the log escapes what it cannot print. */
#ifndef OUTBOX_BASE_UTF8_H
#define OUTBOX_BASE_UTF8_H

#include <stddef.h>

/* Length (1-4) of the valid sequence starting at s, reading at most avail bytes; 0 when the
 * bytes there are not valid UTF-8 or are a NUL. avail must be at least 1. */
size_t utf8_seq_len(const unsigned char *s, size_t avail);
/* Number of characters when s[0..len) is valid UTF-8 without NUL, else -1. */
long utf8_chars(const void *s, size_t len);
/* Length of the longest prefix of s[0..len) that is valid UTF-8 without NUL. */
size_t utf8_valid_prefix(const char *s, size_t len);

#endif
