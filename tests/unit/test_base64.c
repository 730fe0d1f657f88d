/* The strict base64 decoder: round trips, line breaks, and the offset of every kind of
 * malformed input (a wrong offset would send operators to the wrong byte). */
#include <criterion/criterion.h>
#include <string.h>

#include "amqp/base64.h"

static int decode(const char *in, unsigned char *out, size_t *out_len, size_t *off)
{
	return base64_decode(in, strlen(in), out, out_len, off);
}

static void expect_ok(const char *in, const char *want, size_t want_len)
{
	unsigned char out[128];
	size_t len = 999, off = 999;

	cr_assert_lt(base64_decoded_max(strlen(in)), sizeof(out));
	cr_assert_eq(decode(in, out, &len, &off), BASE64_OK, "'%s' should decode", in);
	cr_assert_eq(len, want_len, "'%s': length %zu, want %zu", in, len, want_len);
	cr_assert_eq(memcmp(out, want, want_len), 0, "'%s': wrong bytes", in);
	cr_assert_eq(off, 999, "offset written on success");
}

static void expect_bad(const char *in, size_t want_off)
{
	unsigned char out[128];
	size_t len = 999, off = 999;

	cr_assert_eq(decode(in, out, &len, &off), BASE64_ERR_INVALID, "'%s' should fail", in);
	cr_assert_eq(off, want_off, "'%s': offset %zu, want %zu", in, off, want_off);
	cr_assert_eq(len, 999, "length written on failure");
}

Test(base64, decodes_all_padding_forms)
{
	expect_ok("", "", 0);
	expect_ok("Zg==", "f", 1);
	expect_ok("Zm8=", "fo", 2);
	expect_ok("Zm9v", "foo", 3);
	expect_ok("Zm9vYmFy", "foobar", 6);
	expect_ok("AAEC/w==", "\x00\x01\x02\xff", 4);
	expect_ok("+/+/", "\xfb\xff\xbf", 3);
}

Test(base64, skips_line_breaks_as_postgres_writes_them)
{
	expect_ok("Zm9v\nYmFy", "foobar", 6);
	expect_ok("Zm9v\r\nYmFy\n", "foobar", 6);
	expect_ok("Zg=\n=", "f", 1);
}

Test(base64, rejects_bytes_outside_the_alphabet)
{
	expect_bad("Zm9v YmFy", 4);
	expect_bad("Zm9vYmF*", 7);
	expect_bad("Zm9v-_==", 4); /* URL-safe alphabet is not accepted */
	expect_bad("Zm9vYmFyYmF6\t", 12);
}

Test(base64, rejects_missing_or_misplaced_padding)
{
	expect_bad("Zg", 2); /* ends inside a group */
	expect_bad("Zm9", 3);
	expect_bad("Zg=", 3);
	expect_bad("Z===", 1); /* padding cannot fill three places */
	expect_bad("=Zg=", 0);
	expect_bad("Zg==Zg==", 4); /* data after padding */
	expect_bad("Zm8=a", 4);
	expect_bad("Zg===", 4); /* too much padding */
	expect_bad("Zg=a", 3);
}

Test(base64, rejects_non_zero_trailing_bits)
{
	expect_bad("Zh==", 1); /* 'h' leaves bits that "Zg==" has zero */
	expect_bad("Zm9=", 2);
	expect_ok("Zm8=", "fo", 2);
}
