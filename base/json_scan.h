/* json_scan.h — a strict JSON reader that builds nothing: it checks a whole object and hands
 * its top-level members to the caller as byte ranges. The producer library links libpq only
 * (no jansson), yet must refuse a headers or properties column the relay could never read, and
 * must find and add the trace context keys of the headers object; the relay uses it to pick the
 * trace id out of a row's headers. The prefix is jscan_: json_ is jansson's.
 *
 * What it accepts is what the relay's reading of a row accepts (jansson, with duplicate keys
 * refused and \u0000 allowed in strings): RFC 8259 JSON in UTF-8, no duplicate keys in any
 * object (keys compared after unescaping), no \u0000 in a key, no lone surrogate escape,
 * integers within 64 bits, numbers with a fraction or exponent within a double's range. */
#ifndef OUTBOX_BASE_JSON_SCAN_H
#define OUTBOX_BASE_JSON_SCAN_H

#include <stdbool.h>
#include <stddef.h>

enum jscan_err {
	JSCAN_OK = 0,
	JSCAN_INVALID = -1, /* not such an object: jscan_result says what and where */
	JSCAN_NOMEM = -2,   /* an object with more than 16 keys needs memory for the duplicate
	                       check */
};

enum jscan_kind {
	JSCAN_STRING,
	JSCAN_NUMBER,
	JSCAN_OBJECT,
	JSCAN_ARRAY,
	JSCAN_TRUE,
	JSCAN_FALSE,
	JSCAN_NULL,
};

/* One member of the outer object, as offsets into the text: the key between its quotes (still
 * escaped: compare it with jscan_string_equal()), and the whole value (a string with its
 * quotes, an object with its braces). */
struct jscan_member {
	size_t key_start, key_end;
	size_t value_start, value_end;
	enum jscan_kind kind;
};

/* Called for each member of the outer object in text order, once the member is read (the
 * rest of the text is not checked yet: what the callback learns counts only when
 * jscan_object() returns JSCAN_OK). 0 goes on; any other value stops the scan, and
 * jscan_object() returns it. text and m are borrowed for the call. */
typedef int (*jscan_member_fn)(const char *text, const struct jscan_member *m, void *arg);

#define JSCAN_ERROR_MAX 96
#define JSCAN_DEPTH_MAX 64 /* the deepest nesting jscan_object() ever follows */

struct jscan_result {
	size_t offset;               /* JSCAN_INVALID: the byte where the text went wrong */
	char error[JSCAN_ERROR_MAX]; /* JSCAN_INVALID: what is wrong, e.g. "duplicate key 'a'"
	                                (a quoted key is cut short and printable) */
};

/* Checks that text[0, len) is one JSON object, nested at most max_depth arrays and objects
 * deep (the outer object is the first level; 1..JSCAN_DEPTH_MAX, others mean the maximum),
 * with nothing but white space around it, and calls fn (may be NULL) for each of its
 * members. Returns JSCAN_OK, JSCAN_INVALID with *res filled in, JSCAN_NOMEM, or what fn
 * returned. text, arg and res are borrowed; nothing is kept. */
int jscan_object(const char *text, size_t len, int max_depth, jscan_member_fn fn, void *arg,
                 struct jscan_result *res) __attribute__((warn_unused_result));

/* Whether the JSON string text[start, end) (between the quotes of a string jscan_object()
 * accepted) reads s once unescaped; with fold_case, ASCII letters match in either case. */
bool jscan_string_equal(const char *text, size_t start, size_t end, const char *s, bool fold_case);

/* Unescapes the JSON string text[start, end) (as above) into out (outlen > 0 bytes, always
 * NUL-terminated, cut short when it does not fit). Returns the unescaped length, which is
 * outlen or more when it was cut. */
size_t jscan_string_copy(const char *text, size_t start, size_t end, char *out, size_t outlen);

#endif
