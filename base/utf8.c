/* The UTF-8 checks of utf8.h, written once for the producer library, the store and the log. */
#include "base/utf8.h"

#include <stdint.h>

size_t utf8_seq_len(const unsigned char *s, size_t avail)
{
	unsigned c = s[0];
	uint32_t cp;
	size_t n;

	if (c == 0)
		return 0;
	if (c < 0x80)
		return 1;
	if (c >= 0xC2 && c <= 0xDF) {
		n = 2;
		cp = c & 0x1F;
	} else if (c >= 0xE0 && c <= 0xEF) {
		n = 3;
		cp = c & 0x0F;
	} else if (c >= 0xF0 && c <= 0xF4) {
		n = 4;
		cp = c & 0x07;
	} else {
		return 0; /* a continuation byte, an overlong lead (C0, C1) or beyond U+10FFFF */
	}
	if (avail < n)
		return 0;
	for (size_t i = 1; i < n; i++) {
		if ((s[i] & 0xC0) != 0x80)
			return 0;
		cp = (cp << 6) | (s[i] & 0x3F);
	}
	if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
	    (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
		return 0;
	return n;
}

long utf8_chars(const void *p, size_t len)
{
	const unsigned char *s = p;
	size_t i = 0, k;
	long chars = 0;

	while (i < len) {
		k = utf8_seq_len(s + i, len - i);
		if (k == 0)
			return -1;
		i += k;
		chars++;
	}
	return chars;
}

size_t utf8_valid_prefix(const char *s, size_t len)
{
	size_t i = 0, n;

	while (i < len && (n = utf8_seq_len((const unsigned char *)s + i, len - i)) > 0)
		i += n;
	return i;
}
