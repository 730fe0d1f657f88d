/* Strict base64 decoding (RFC 4648 standard alphabet, padding required) for message bodies
 * stored with body_encoding = 'base64'. */
#ifndef OUTBOX_AMQP_BASE64_H
#define OUTBOX_AMQP_BASE64_H

#include <stddef.h>

enum base64_err {
	BASE64_OK = 0,
	BASE64_ERR_INVALID = -1, /* not valid base64; *err_offset says where */
};

/* An upper bound on the decoded size of len input bytes. */
size_t base64_decoded_max(size_t len);

/* Decodes in[0..len) into out, which the caller owns and sizes with base64_decoded_max(len).
 * Line breaks (CR, LF) are skipped because PostgreSQL's encode(..., 'base64') wraps its
 * output at 76 columns; any other byte outside the alphabet, misplaced or missing '='
 * padding, and non-zero bits in the last symbol are errors. On success *out_len gets the
 * decoded length. On BASE64_ERR_INVALID only *err_offset is written: the offset of the
 * first offending byte, or len when the input ends in the middle of a group. */
int base64_decode(const char *in, size_t len, unsigned char *out, size_t *out_len,
                  size_t *err_offset) __attribute__((warn_unused_result));

#endif
