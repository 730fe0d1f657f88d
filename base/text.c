/* One-line error texts: flattening a server's message, quoting a user-supplied name (see
 * text.h). Also the one hex digit reader. */
#include "base/text.h"

#include <string.h>

int text_hex_value(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

void text_one_line(char *s)
{
	size_t n;

	for (char *c = s; *c; c++)
		if (*c == '\n' || *c == '\r' || *c == '\t')
			*c = ' ';
	n = strlen(s);
	while (n > 0 && s[n - 1] == ' ')
		s[--n] = '\0';
}

void text_shown(char *out, size_t n, const char *s, size_t len)
{
	size_t o = 0;

	if (n == 0)
		return;
	for (size_t i = 0; i < len && o + 4 < n; i++) {
		if (i == TEXT_SHOWN_MAX) {
			memcpy(out + o, "...", 3);
			o += 3;
			break;
		}
		out[o++] = ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) ? '?' : s[i];
	}
	out[o] = '\0';
}
