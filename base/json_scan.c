/* The scanner of json_scan.h: recursive descent over the text, bounded in depth, that builds
 * nothing and allocates only to find duplicate keys in objects of more than 16 keys. */
#include "base/json_scan.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/text.h"
#include "base/utf8.h"

#define SMALL_OBJECT 16 /* keys compared pairwise, on the stack */
#define KEY_SHOWN    24 /* bytes of a key quoted in an error */

/* The least magnitude that a double cannot hold: 2^1024 - 2^970, halfway between DBL_MAX and
 * 2^1024, which strtod() rounds up (to even), so to infinity. 309 digits; a number of 309
 * integer digits overflows exactly when its digits compare greater or equal. */
static const char overflow_digits[] =
        "179769313486231580793728971405303415079934132710037826936173778980444968292764750946"
        "649017977587207096330286416692887910946555547851940402630657488671505820681908902000"
        "708383676273854845817711531764475730270069855571366959622842914819860834936475292719"
        "074168444365510704342711559699508093042880177904174497792";

struct scan {
	const char *s;
	size_t len, pos;
	int max_depth;
	struct jscan_result *res;
};

struct span {
	size_t start, end;
};

static int fail(struct scan *sc, size_t at, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

static int fail(struct scan *sc, size_t at, const char *fmt, ...)
{
	va_list ap;

	sc->res->offset = at;
	va_start(ap, fmt);
	vsnprintf(sc->res->error, sizeof(sc->res->error), fmt, ap);
	va_end(ap);
	return JSCAN_INVALID;
}

static void skip_space(struct scan *sc)
{
	while (sc->pos < sc->len && (sc->s[sc->pos] == ' ' || sc->s[sc->pos] == '\t' ||
	                             sc->s[sc->pos] == '\n' || sc->s[sc->pos] == '\r'))
		sc->pos++;
}

/* The four hex digits at s[at, at + 4) of a text of len bytes, or -1. */
static long hex4(const char *s, size_t len, size_t at)
{
	long v = 0;

	if (len < 4 || at > len - 4)
		return -1;
	for (size_t i = 0; i < 4; i++) {
		int h = text_hex_value(s[at + i]);

		if (h < 0)
			return -1;
		v = v * 16 + h;
	}
	return v;
}

/* A string at sc->pos (its opening quote). A key may not hold \u0000: jansson refuses NUL
 * bytes in keys even when it allows them in values. */
static int scan_string(struct scan *sc, bool key)
{
	const size_t open = sc->pos;

	sc->pos++;
	for (;;) {
		unsigned char c;

		if (sc->pos >= sc->len)
			return fail(sc, open, "unterminated string");
		c = (unsigned char)sc->s[sc->pos];
		if (c == '"') {
			sc->pos++;
			return JSCAN_OK;
		}
		if (c < 0x20)
			return fail(sc, sc->pos, "control character 0x%02x in a string", c);
		if (c >= 0x80) {
			size_t n = utf8_seq_len((const unsigned char *)sc->s + sc->pos,
			                        sc->len - sc->pos);

			if (n == 0)
				return fail(sc, sc->pos, "invalid UTF-8 in a string");
			sc->pos += n;
			continue;
		}
		if (c != '\\') {
			sc->pos++;
			continue;
		}
		if (sc->pos + 1 >= sc->len)
			return fail(sc, open, "unterminated string");
		c = (unsigned char)sc->s[sc->pos + 1];
		if (strchr("\"\\/bfnrt", c) != NULL && c != '\0') {
			sc->pos += 2;
			continue;
		}
		if (c != 'u')
			return fail(sc, sc->pos, "invalid escape '\\%c'",
			            c >= 0x20 && c < 0x7f ? c : '?');
		long cp = hex4(sc->s, sc->len, sc->pos + 2);
		if (cp < 0)
			return fail(sc, sc->pos, "invalid \\u escape (four hex digits expected)");
		if (cp >= 0xDC00 && cp <= 0xDFFF)
			return fail(sc, sc->pos, "lone low surrogate \\u%04lX", cp);
		if (cp >= 0xD800 && cp <= 0xDBFF) {
			long lo = -1;

			if (sc->pos + 7 < sc->len && sc->s[sc->pos + 6] == '\\' &&
			    sc->s[sc->pos + 7] == 'u')
				lo = hex4(sc->s, sc->len, sc->pos + 8);
			if (lo < 0xDC00 || lo > 0xDFFF)
				return fail(sc, sc->pos,
				            "high surrogate \\u%04lX not followed by a low one",
				            cp);
			sc->pos += 12;
			continue;
		}
		if (cp == 0 && key)
			return fail(sc, sc->pos, "\\u0000 in a key");
		sc->pos += 6;
	}
}

static bool is_digit(const struct scan *sc, size_t at)
{
	return at < sc->len && sc->s[at] >= '0' && sc->s[at] <= '9';
}

/* Significant digit k of a number whose first non-zero digit is at first (integer digits
 * [is, ie), fraction digits [fs, fe)); '0' past the last one. */
static char digit_at(const char *s, size_t first, size_t ie, size_t fs, size_t fe, size_t k)
{
	if (first < ie) {
		if (k < ie - first)
			return s[first + k];
		k -= ie - first;
		return k < fe - fs ? s[fs + k] : '0';
	}
	return k < fe - first ? s[first + k] : '0';
}

/* Whether the digits of a number (integer digits [is, ie), fraction digits [fs, fe), decimal
 * exponent exp) name a magnitude a double cannot hold, as jansson's strtod() would find.
 * Underflow is fine: strtod() gives 0 or a subnormal, which jansson takes. */
static bool real_overflows(const char *s, size_t is, size_t ie, size_t fs, size_t fe, long exp)
{
	const size_t bound = sizeof(overflow_digits) - 1;
	size_t first = SIZE_MAX, n;
	long e;

	for (size_t i = is; i < ie && first == SIZE_MAX; i++)
		if (s[i] != '0')
			first = i;
	if (first != SIZE_MAX) {
		e = (long)(ie - first) - 1;
		n = (ie - first) + (fe - fs);
	} else {
		for (size_t i = fs; i < fe && first == SIZE_MAX; i++)
			if (s[i] != '0')
				first = i;
		if (first == SIZE_MAX)
			return false; /* zero */
		e = -(long)(first - fs) - 1;
		n = fe - first;
	}
	e += exp;
	if (e != 308)
		return e > 308;
	/* The bound's order of magnitude: compare digit by digit, the shorter followed by
	 * zeros; equal to the bound rounds up, to infinity. */
	for (size_t k = 0; k < (n > bound ? n : bound); k++) {
		char d = digit_at(s, first, ie, fs, fe, k);
		char b = k < bound ? overflow_digits[k] : '0';

		if (d != b)
			return d > b;
	}
	return true;
}

static int scan_number(struct scan *sc)
{
	const size_t start = sc->pos;
	size_t is, ie, fs = 0, fe = 0;
	bool neg = false, integer = true;
	long exp = 0;

	if (sc->s[sc->pos] == '-') {
		neg = true;
		sc->pos++;
	}
	is = sc->pos;
	if (!is_digit(sc, sc->pos))
		return fail(sc, start, "invalid number");
	if (sc->s[sc->pos] == '0') {
		sc->pos++;
		if (is_digit(sc, sc->pos))
			return fail(sc, start, "number with a leading zero");
	} else {
		while (is_digit(sc, sc->pos))
			sc->pos++;
	}
	ie = sc->pos;
	fs = fe = ie;
	if (sc->pos < sc->len && sc->s[sc->pos] == '.') {
		integer = false;
		sc->pos++;
		fs = sc->pos;
		if (!is_digit(sc, sc->pos))
			return fail(sc, start, "invalid number (digits expected after '.')");
		while (is_digit(sc, sc->pos))
			sc->pos++;
		fe = sc->pos;
	}
	if (sc->pos < sc->len && (sc->s[sc->pos] == 'e' || sc->s[sc->pos] == 'E')) {
		bool eneg = false;

		integer = false;
		sc->pos++;
		if (sc->pos < sc->len && (sc->s[sc->pos] == '+' || sc->s[sc->pos] == '-'))
			eneg = sc->s[sc->pos++] == '-';
		if (!is_digit(sc, sc->pos))
			return fail(sc, start, "invalid number (digits expected in the exponent)");
		while (is_digit(sc, sc->pos)) {
			if (exp < 1000000) /* far past any double; saturate */
				exp = exp * 10 + (sc->s[sc->pos] - '0');
			sc->pos++;
		}
		if (eneg)
			exp = -exp;
	}
	if (integer) {
		/* jansson reads integers into 64 bits and refuses what does not fit. */
		const char *lim = neg ? "9223372036854775808" : "9223372036854775807";
		size_t n = ie - is;

		if (n > 19 || (n == 19 && memcmp(sc->s + is, lim, 19) > 0))
			return fail(sc, start, "integer out of the 64-bit range");
		return JSCAN_OK;
	}
	if (real_overflows(sc->s, is, ie, fs, fe, exp))
		return fail(sc, start, "number out of range");
	return JSCAN_OK;
}

static int scan_literal(struct scan *sc, const char *word)
{
	size_t n = strlen(word);

	if (sc->len - sc->pos < n || memcmp(sc->s + sc->pos, word, n) != 0)
		return fail(sc, sc->pos, "unexpected character '%c'",
		            sc->s[sc->pos] >= 0x20 && sc->s[sc->pos] < 0x7f ? sc->s[sc->pos] : '?');
	sc->pos += n;
	return JSCAN_OK;
}

/* Decoded bytes of a string that scan_string() accepted, one at a time. */
struct unescape {
	const char *p, *end;
	unsigned char buf[4];
	size_t n, i;
};

static void unescape_init(struct unescape *u, const char *text, size_t start, size_t end)
{
	u->p = text + start;
	u->end = text + end;
	u->n = u->i = 0;
}

static int utf8_encode(unsigned long cp, unsigned char *out)
{
	if (cp < 0x80) {
		out[0] = (unsigned char)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (unsigned char)(0xC0 | (cp >> 6));
		out[1] = (unsigned char)(0x80 | (cp & 0x3F));
		return 2;
	}
	if (cp < 0x10000) {
		out[0] = (unsigned char)(0xE0 | (cp >> 12));
		out[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
		out[2] = (unsigned char)(0x80 | (cp & 0x3F));
		return 3;
	}
	out[0] = (unsigned char)(0xF0 | (cp >> 18));
	out[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
	out[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
	out[3] = (unsigned char)(0x80 | (cp & 0x3F));
	return 4;
}

/* The next decoded byte, or -1 at the end. Stops at anything malformed, so that a range that
 * did not come from the scanner cannot make it read past end. */
static int unescape_next(struct unescape *u)
{
	size_t left;
	long cp, lo;

	if (u->i < u->n)
		return u->buf[u->i++];
	if (u->p >= u->end)
		return -1;
	if (*u->p != '\\')
		return (unsigned char)*u->p++;
	left = (size_t)(u->end - u->p);
	if (left < 2)
		return -1;
	switch (u->p[1]) {
	case 'b':
		u->p += 2;
		return '\b';
	case 'f':
		u->p += 2;
		return '\f';
	case 'n':
		u->p += 2;
		return '\n';
	case 'r':
		u->p += 2;
		return '\r';
	case 't':
		u->p += 2;
		return '\t';
	case 'u':
		break;
	default:
		u->p += 2;
		return (unsigned char)u->p[-1]; /* \" \\ \/ */
	}
	cp = hex4(u->p, left, 2);
	if (cp < 0)
		return -1;
	u->p += 6;
	if (cp >= 0xD800 && cp <= 0xDBFF) {
		left = (size_t)(u->end - u->p);
		lo = left >= 6 && u->p[0] == '\\' && u->p[1] == 'u' ? hex4(u->p, left, 2) : -1;
		if (lo < 0xDC00 || lo > 0xDFFF)
			return -1;
		u->p += 6;
		cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
	}
	u->n = (size_t)utf8_encode((unsigned long)cp, u->buf);
	u->i = 1;
	return u->buf[0];
}

/* Orders two keys by their unescaped bytes. */
static int key_compare(const char *text, const struct span *a, const struct span *b)
{
	struct unescape ua, ub;

	unescape_init(&ua, text, a->start, a->end);
	unescape_init(&ub, text, b->start, b->end);
	for (;;) {
		int ca = unescape_next(&ua), cb = unescape_next(&ub);

		if (ca != cb)
			return ca < cb ? -1 : 1;
		if (ca < 0)
			return 0;
	}
}

/* Sorts keys[0, n) with tmp (n entries) by key_compare(): a merge sort, since qsort() has no
 * way to pass the text to the comparison. */
static void sort_keys(const char *text, struct span *keys, struct span *tmp, size_t n)
{
	for (size_t width = 1; width < n; width *= 2) {
		for (size_t lo = 0; lo < n; lo += 2 * width) {
			size_t mid = lo + width < n ? lo + width : n;
			size_t hi = lo + 2 * width < n ? lo + 2 * width : n;
			size_t a = lo, b = mid, o = lo;

			while (a < mid && b < hi)
				tmp[o++] = key_compare(text, &keys[b], &keys[a]) < 0 ? keys[b++]
				                                                     : keys[a++];
			while (a < mid)
				tmp[o++] = keys[a++];
			while (b < hi)
				tmp[o++] = keys[b++];
		}
		memcpy(keys, tmp, n * sizeof(*keys));
	}
}

static int duplicate_key(struct scan *sc, const struct span *k)
{
	char shown[KEY_SHOWN + 4];
	size_t n = jscan_string_copy(sc->s, k->start, k->end, shown, KEY_SHOWN + 1);

	for (char *c = shown; *c != '\0'; c++)
		if ((unsigned char)*c < 0x20 || *c == 0x7f || *c == '\'')
			*c = '?';
	if (n > KEY_SHOWN)
		memcpy(shown + KEY_SHOWN, "...", 4);
	return fail(sc, k->start - 1, "duplicate key '%s'", shown);
}

/* Finds a key that appears twice among keys[0, n): the relay's parser refuses such an
 * object, and which of the two values a reader takes is anyone's guess. */
static int check_duplicates(struct scan *sc, struct span *keys, size_t n)
{
	struct span *tmp;

	if (n <= SMALL_OBJECT) {
		for (size_t i = 1; i < n; i++)
			for (size_t j = 0; j < i; j++)
				if (key_compare(sc->s, &keys[i], &keys[j]) == 0)
					return duplicate_key(sc, &keys[i]);
		return JSCAN_OK;
	}
	tmp = malloc(n * sizeof(*tmp));
	if (tmp == NULL)
		return JSCAN_NOMEM;
	sort_keys(sc->s, keys, tmp, n);
	free(tmp);
	for (size_t i = 1; i < n; i++)
		if (key_compare(sc->s, &keys[i], &keys[i - 1]) == 0)
			return duplicate_key(sc, &keys[i]);
	return JSCAN_OK;
}

static int scan_value(struct scan *sc, int depth, enum jscan_kind *kind);

/* Keys go to a small array on the stack, then to the heap, for the duplicate check. */
struct key_list {
	struct span small[SMALL_OBJECT];
	struct span *keys;
	size_t n, cap;
};

static int key_list_add(struct key_list *l, size_t start, size_t end)
{
	if (l->n == l->cap) {
		size_t cap = l->cap * 2;
		struct span *k;

		if (l->keys == l->small) {
			k = malloc(cap * sizeof(*k));
			if (k != NULL)
				memcpy(k, l->small, sizeof(l->small));
		} else {
			k = cap > SIZE_MAX / sizeof(*k) ? NULL : realloc(l->keys, cap * sizeof(*k));
		}
		if (k == NULL)
			return JSCAN_NOMEM;
		l->keys = k;
		l->cap = cap;
	}
	l->keys[l->n].start = start;
	l->keys[l->n].end = end;
	l->n++;
	return JSCAN_OK;
}

/* An object at sc->pos (its '{'), depth levels deep; fn sees its members (the outer object's
 * only). */
static int scan_object(struct scan *sc, int depth, jscan_member_fn fn, void *arg)
{
	struct key_list l;
	int rc;

	if (depth > sc->max_depth)
		return fail(sc, sc->pos, "nested deeper than %d levels", sc->max_depth);
	l.keys = l.small;
	l.n = 0;
	l.cap = SMALL_OBJECT;
	sc->pos++;
	skip_space(sc);
	if (sc->pos < sc->len && sc->s[sc->pos] == '}') {
		sc->pos++;
		return JSCAN_OK;
	}
	for (;;) {
		struct jscan_member m;

		if (sc->pos >= sc->len || sc->s[sc->pos] != '"') {
			rc = fail(sc, sc->pos, "a key (a string) expected");
			goto out;
		}
		m.key_start = sc->pos + 1;
		rc = scan_string(sc, true);
		if (rc != JSCAN_OK)
			goto out;
		m.key_end = sc->pos - 1;
		rc = key_list_add(&l, m.key_start, m.key_end);
		if (rc != JSCAN_OK)
			goto out;
		skip_space(sc);
		if (sc->pos >= sc->len || sc->s[sc->pos] != ':') {
			rc = fail(sc, sc->pos, "':' expected after a key");
			goto out;
		}
		sc->pos++;
		skip_space(sc);
		m.value_start = sc->pos;
		rc = scan_value(sc, depth, &m.kind);
		if (rc != JSCAN_OK)
			goto out;
		m.value_end = sc->pos;
		if (fn != NULL && (rc = fn(sc->s, &m, arg)) != 0)
			goto out;
		skip_space(sc);
		if (sc->pos < sc->len && sc->s[sc->pos] == ',') {
			sc->pos++;
			skip_space(sc);
			continue;
		}
		if (sc->pos < sc->len && sc->s[sc->pos] == '}') {
			sc->pos++;
			break;
		}
		rc = fail(sc, sc->pos, "',' or '}' expected in an object");
		goto out;
	}
	rc = check_duplicates(sc, l.keys, l.n);
out:
	if (l.keys != l.small)
		free(l.keys);
	return rc;
}

static int scan_array(struct scan *sc, int depth)
{
	if (depth > sc->max_depth)
		return fail(sc, sc->pos, "nested deeper than %d levels", sc->max_depth);
	sc->pos++;
	skip_space(sc);
	if (sc->pos < sc->len && sc->s[sc->pos] == ']') {
		sc->pos++;
		return JSCAN_OK;
	}
	for (;;) {
		enum jscan_kind kind;
		int rc = scan_value(sc, depth, &kind);

		if (rc != JSCAN_OK)
			return rc;
		skip_space(sc);
		if (sc->pos < sc->len && sc->s[sc->pos] == ',') {
			sc->pos++;
			skip_space(sc);
			continue;
		}
		if (sc->pos < sc->len && sc->s[sc->pos] == ']') {
			sc->pos++;
			return JSCAN_OK;
		}
		return fail(sc, sc->pos, "',' or ']' expected in an array");
	}
}

/* A value at sc->pos, inside a container depth levels deep. */
static int scan_value(struct scan *sc, int depth, enum jscan_kind *kind)
{
	char c;

	if (sc->pos >= sc->len)
		return fail(sc, sc->pos, "unexpected end of text, a value expected");
	c = sc->s[sc->pos];
	switch (c) {
	case '{':
		*kind = JSCAN_OBJECT;
		return scan_object(sc, depth + 1, NULL, NULL);
	case '[':
		*kind = JSCAN_ARRAY;
		return scan_array(sc, depth + 1);
	case '"':
		*kind = JSCAN_STRING;
		return scan_string(sc, false);
	case 't':
		*kind = JSCAN_TRUE;
		return scan_literal(sc, "true");
	case 'f':
		*kind = JSCAN_FALSE;
		return scan_literal(sc, "false");
	case 'n':
		*kind = JSCAN_NULL;
		return scan_literal(sc, "null");
	default:
		break;
	}
	if (c == '-' || (c >= '0' && c <= '9')) {
		*kind = JSCAN_NUMBER;
		return scan_number(sc);
	}
	return fail(sc, sc->pos, "unexpected character '%c', a value expected",
	            c >= 0x20 && c < 0x7f ? c : '?');
}

int jscan_object(const char *text, size_t len, int max_depth, jscan_member_fn fn, void *arg,
                 struct jscan_result *res)
{
	struct scan sc = {
		.s = text,
		.len = len,
		.pos = 0,
		.max_depth = max_depth >= 1 && max_depth <= JSCAN_DEPTH_MAX ? max_depth
		                                                            : JSCAN_DEPTH_MAX,
		.res = res,
	};
	int rc;

	res->offset = 0;
	res->error[0] = '\0';
	skip_space(&sc);
	if (sc.pos >= sc.len)
		return fail(&sc, sc.pos, "no JSON object (empty text)");
	if (sc.s[sc.pos] != '{')
		return fail(&sc, sc.pos, "not a JSON object");
	rc = scan_object(&sc, 1, fn, arg);
	if (rc != JSCAN_OK)
		return rc;
	skip_space(&sc);
	if (sc.pos < sc.len)
		return fail(&sc, sc.pos, "text after the object");
	return JSCAN_OK;
}

bool jscan_string_equal(const char *text, size_t start, size_t end, const char *s, bool fold_case)
{
	struct unescape u;

	unescape_init(&u, text, start, end);
	for (;; s++) {
		int c = unescape_next(&u), want = (unsigned char)*s;

		if (fold_case) {
			if (c >= 'A' && c <= 'Z')
				c += 'a' - 'A';
			if (want >= 'A' && want <= 'Z')
				want += 'a' - 'A';
		}
		if (want == 0)
			return c < 0;
		if (c != want)
			return false;
	}
}

size_t jscan_string_copy(const char *text, size_t start, size_t end, char *out, size_t outlen)
{
	struct unescape u;
	size_t n = 0;
	int c;

	unescape_init(&u, text, start, end);
	while ((c = unescape_next(&u)) >= 0) {
		if (n + 1 < outlen)
			out[n] = (char)c;
		n++;
	}
	out[n + 1 < outlen ? n : outlen - 1] = '\0';
	return n;
}
