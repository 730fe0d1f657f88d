/* Strict base64 decoder for message bodies: a malformed body must make the row dead with the
 * offset of the problem rather than reach consumers as silently truncated bytes. */
#include "amqp/base64.h"

#include <stdint.h>

/* 0..63 for alphabet symbols, 64 for '=', 65 for line breaks, 255 for anything else. */
static int8_t symbol_value(unsigned char c)
{
	if (c >= 'A' && c <= 'Z')
		return (int8_t)(c - 'A');
	if (c >= 'a' && c <= 'z')
		return (int8_t)(c - 'a' + 26);
	if (c >= '0' && c <= '9')
		return (int8_t)(c - '0' + 52);
	if (c == '+')
		return 62;
	if (c == '/')
		return 63;
	if (c == '=')
		return 64;
	if (c == '\r' || c == '\n')
		return 65;
	return -1;
}

size_t base64_decoded_max(size_t len)
{
	return len / 4 * 3 + 3;
}

int base64_decode(const char *in, size_t len, unsigned char *out, size_t *out_len,
                  size_t *err_offset)
{
	uint32_t acc = 0;
	size_t n = 0;    /* symbols in the current group of four */
	size_t pad = 0;  /* '=' seen; after the first one only '=' and line breaks may follow */
	int done = 0;    /* a padded group ended the text: only line breaks may follow */
	size_t last = 0; /* offset of the last alphabet symbol */
	size_t o = 0;
	size_t bad = len;
	int rc = BASE64_ERR_INVALID;

	for (size_t i = 0; i < len; i++) {
		int8_t v = symbol_value((unsigned char)in[i]);

		if (v == 65)
			continue;
		if (v < 0) {
			bad = i;
			goto out;
		}
		if (v == 64) {
			/* Padding may only fill the last one or two places of a group. */
			if (done || n + pad < 2) {
				bad = i;
				goto out;
			}
			pad++;
			if (n + pad == 4) {
				/* The bits beyond the decoded bytes must be zero, or two different
				 * texts would decode to the same body. */
				if ((n == 2 && (acc & 0x0f) != 0) ||
				    (n == 3 && (acc & 0x03) != 0)) {
					bad = last;
					goto out;
				}
				if (n == 2) {
					out[o++] = (unsigned char)(acc >> 4);
				} else {
					out[o++] = (unsigned char)(acc >> 10);
					out[o++] = (unsigned char)(acc >> 2);
				}
				n = 0;
				acc = 0;
				done = 1;
			}
			continue;
		}
		if (pad > 0) {
			/* data after padding: either within the padded group or after it */
			bad = i;
			goto out;
		}
		last = i;
		acc = acc << 6 | (uint32_t)v;
		if (++n == 4) {
			out[o++] = (unsigned char)(acc >> 16);
			out[o++] = (unsigned char)(acc >> 8);
			out[o++] = (unsigned char)acc;
			n = 0;
			acc = 0;
		}
	}
	if (n != 0)
		goto out; /* bad = len: the input ends inside a group */
	*out_len = o;
	rc = BASE64_OK;
out:
	if (rc != BASE64_OK)
		*err_offset = bad;
	return rc;
}
