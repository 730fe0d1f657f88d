/* The JSON scanner of base/json_scan.h: it must accept exactly the objects the relay's reading
 * of a row accepts (jansson, duplicates refused, \u0000 allowed in strings), since the producer
 * library refuses with it what would otherwise die at publish time. Valid and invalid
 * objects (nesting, escapes, \u surrogates, UTF-8, numbers at the limits of 64-bit integers
 * and doubles, duplicate keys), the error texts and offsets, the members it lists, and the
 * string helpers. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json_scan.h"

static void expect_ok(const char *text)
{
	struct jscan_result res;
	int rc = jscan_object(text, strlen(text), JSCAN_DEPTH_MAX, NULL, NULL, &res);

	cr_expect_eq(rc, JSCAN_OK, "refused %s: %s at %zu", text, res.error, res.offset);
}

/* Refused, with an error that contains want, at byte at. */
static void expect_bad(const char *text, const char *want, size_t at)
{
	struct jscan_result res;
	int rc = jscan_object(text, strlen(text), JSCAN_DEPTH_MAX, NULL, NULL, &res);

	cr_expect_eq(rc, JSCAN_INVALID, "accepted %s", text);
	if (rc != JSCAN_INVALID)
		return;
	cr_expect(strstr(res.error, want) != NULL, "%s: error '%s', wanted '%s'", text, res.error,
	          want);
	cr_expect_eq(res.offset, at, "%s: error '%s' at %zu, wanted %zu", text, res.error,
	             res.offset, at);
}

Test(json_scan, valid_objects)
{
	expect_ok("{}");
	expect_ok(" \t\r\n{ \t\r\n} \t\r\n");
	expect_ok("{\"a\":1}");
	expect_ok("{\"s\":\"x\",\"i\":-12,\"r\":1.5e-3,\"t\":true,\"f\":false,\"n\":null,"
	          "\"o\":{\"p\":[1,[2,{\"q\":[]}],{}]},\"e\":[]}");
	expect_ok("{ \"a\" : [ 1 , 2 ] , \"b\" : { } }");
	expect_ok("{\"\":0}"); /* an empty key is a key */
	/* the same key in different objects, and keys that differ in case only */
	expect_ok("{\"a\":{\"a\":1},\"b\":{\"a\":2},\"A\":3}");
}

Test(json_scan, not_an_object)
{
	expect_bad("", "empty text", 0);
	expect_bad("   ", "empty text", 3);
	expect_bad("[1]", "not a JSON object", 0);
	expect_bad("\"text\"", "not a JSON object", 0);
	expect_bad("1", "not a JSON object", 0);
	expect_bad("null", "not a JSON object", 0);
	expect_bad("{} {}", "text after the object", 3);
	expect_bad("{}x", "text after the object", 2);
}

Test(json_scan, syntax_errors)
{
	expect_bad("{", "a key (a string) expected", 1);
	expect_bad("{\"a\"}", "':' expected after a key", 4);
	expect_bad("{\"a\" 1}", "':' expected after a key", 5);
	expect_bad("{\"a\":}", "unexpected character '}', a value expected", 5);
	expect_bad("{\"a\":1,}", "a key (a string) expected", 7);
	expect_bad("{\"a\":1 \"b\":2}", "',' or '}' expected in an object", 7);
	expect_bad("{\"a\":[1,]}", "unexpected character ']', a value expected", 8);
	expect_bad("{\"a\":[1 2]}", "',' or ']' expected in an array", 8);
	expect_bad("{\"a\":[1", "',' or ']' expected in an array", 7);
	expect_bad("{\"a\":1", "',' or '}' expected in an object", 6);
	expect_bad("{a:1}", "a key (a string) expected", 1);
	expect_bad("{'a':1}", "a key (a string) expected", 1);
	expect_bad("{1:1}", "a key (a string) expected", 1);
	expect_bad("{\"a\":tru}", "unexpected character 't'", 5);
	expect_bad("{\"a\":True}", "unexpected character 'T', a value expected", 5);
	expect_bad("{\"a\":nul}", "unexpected character 'n'", 5);
	expect_bad("{\"a\":undefined}", "unexpected character 'u', a value expected", 5);
	expect_bad("{\"a\":1}/* c */", "text after the object", 7);
	/* a NUL byte inside the given length is a character like any other: not white space */
	{
		struct jscan_result res;

		cr_expect_eq(jscan_object("{}\0", 3, 8, NULL, NULL, &res), JSCAN_INVALID);
		cr_expect_str_eq(res.error, "text after the object");
		cr_expect_eq(jscan_object("{\"a\0\":1}", 8, 8, NULL, NULL, &res), JSCAN_INVALID);
		cr_expect_str_eq(res.error, "control character 0x00 in a string");
	}
}

Test(json_scan, strings_and_escapes)
{
	expect_ok("{\"a\":\"\\\" \\\\ \\/ \\b \\f \\n \\r \\t\"}");
	expect_ok("{\"a\":\"\\u0041\\u00e9\\u20AC\\uFFFF\"}");
	expect_ok("{\"a\":\"\\ud83d\\ude00\"}");               /* a surrogate pair */
	expect_ok("{\"a\":\"\\uDBFF\\uDFFF\"}");               /* U+10FFFF */
	expect_ok("{\"a\":\"\\u0000\"}");                      /* NUL in a value: allowed */
	expect_ok("{\"a\":\"caf\xc3\xa9 \xf0\x9f\x9a\x80\"}"); /* raw UTF-8 */
	expect_ok("{\"a\":\"\x7f\"}");                         /* DEL needs no escape */

	expect_bad("{\"a\":\"x}", "unterminated string", 5);
	expect_bad("{\"a\":\"x\\", "unterminated string", 5);
	expect_bad("{\"a\":\"a\nb\"}", "control character 0x0a in a string", 7);
	expect_bad("{\"a\":\"\t\"}", "control character 0x09 in a string", 6);
	expect_bad("{\"a\":\"\\x41\"}", "invalid escape '\\x'", 6);
	expect_bad("{\"a\":\"\\'\"}", "invalid escape", 6);
	expect_bad("{\"a\":\"\\u12\"}", "invalid \\u escape", 6);
	expect_bad("{\"a\":\"\\u12g4\"}", "invalid \\u escape", 6);
	expect_bad("{\"a\":\"\\ud83d\"}", "high surrogate \\uD83D not followed by a low one", 6);
	expect_bad("{\"a\":\"\\ud83dx\"}", "high surrogate", 6);
	expect_bad("{\"a\":\"\\ud83d\\u0041\"}", "high surrogate", 6);
	expect_bad("{\"a\":\"\\ud83d\\ud83d\"}", "high surrogate", 6);
	expect_bad("{\"a\":\"\\ude00\"}", "lone low surrogate \\uDE00", 6);
	expect_bad("{\"a\":\"\\ude00\\ud83d\"}", "lone low surrogate", 6);
	expect_bad("{\"\\u0000\":1}", "\\u0000 in a key", 2);
}

Test(json_scan, utf8)
{
	expect_bad("{\"a\":\"\xc3\"}", "invalid UTF-8", 6);             /* cut short */
	expect_bad("{\"a\":\"\xc0\xaf\"}", "invalid UTF-8", 6);         /* overlong */
	expect_bad("{\"a\":\"\xed\xa0\x80\"}", "invalid UTF-8", 6);     /* a surrogate */
	expect_bad("{\"a\":\"\xf4\x90\x80\x80\"}", "invalid UTF-8", 6); /* above U+10FFFF */
	expect_bad("{\"\xff\":1}", "invalid UTF-8", 2);
	/* outside strings, anything not ASCII is out of place */
	expect_bad("{\"a\":\xc3\xa9}", "unexpected character '?'", 5);
}

Test(json_scan, numbers)
{
	expect_ok("{\"a\":[0,-0,1,-1,10,0.5,-0.5,1e5,1E5,1e+5,1e-5,1.25E-10,0e0]}");
	expect_ok("{\"a\":[9223372036854775807,-9223372036854775808]}");
	expect_ok("{\"a\":1e308}");
	expect_ok("{\"a\":1.7976931348623157e308}");  /* DBL_MAX */
	expect_ok("{\"a\":-1.7976931348623158e308}"); /* rounds to -DBL_MAX */
	expect_ok("{\"a\":1e-400}");                  /* underflow reads as 0 */
	expect_ok("{\"a\":0e99999999999999999999}");
	expect_ok("{\"a\":9223372036854775808.0}"); /* a real, not an integer */
	expect_ok("{\"a\":9223372036854775808e0}");

	expect_bad("{\"a\":01}", "number with a leading zero", 5);
	expect_bad("{\"a\":-01}", "number with a leading zero", 5);
	expect_bad("{\"a\":1.}", "digits expected after '.'", 5);
	expect_bad("{\"a\":.5}", "unexpected character '.'", 5);
	expect_bad("{\"a\":+1}", "unexpected character '+'", 5);
	expect_bad("{\"a\":-}", "invalid number", 5);
	expect_bad("{\"a\":-a}", "invalid number", 5);
	expect_bad("{\"a\":1e}", "digits expected in the exponent", 5);
	expect_bad("{\"a\":1e+}", "digits expected in the exponent", 5);
	expect_bad("{\"a\":0x10}", "',' or '}' expected in an object", 6);
	expect_bad("{\"a\":NaN}", "unexpected character 'N'", 5);
	expect_bad("{\"a\":Infinity}", "unexpected character 'I'", 5);
	/* jansson reads integers into 64 bits */
	expect_bad("{\"a\":9223372036854775808}", "integer out of the 64-bit range", 5);
	expect_bad("{\"a\":-9223372036854775809}", "integer out of the 64-bit range", 5);
	expect_bad("{\"a\":123456789012345678901234567890}", "integer out of the 64-bit range", 5);
	/* and reals into a double */
	expect_bad("{\"a\":1e309}", "number out of range", 5);
	expect_bad("{\"a\":-1e309}", "number out of range", 5);
	expect_bad("{\"a\":1e99999999999999999999}", "number out of range", 5);
	expect_bad("{\"a\":1.7976931348623159e308}", "number out of range", 5);
	expect_bad("{\"a\":0.000001e315}", "number out of range", 5);
}

/* 2^1024 - 2^970, the least magnitude that rounds to infinity, and its neighbours. */
Test(json_scan, the_exact_edge_of_a_double)
{
	static const char bound[] =
	        "17976931348623158079372897140530341507993413271003782693617377898044496829276475"
	        "09466490179775872070963302864166928879109465555478519404026306574886715058206819"
	        "08902000708383676273854845817711531764475730270069855571366959622842914819860834"
	        "936475292719074168444365510704342711559699508093042880177904174497792";
	char text[1024], below[400];

	cr_assert_eq(strlen(bound), 309);
	snprintf(text, sizeof(text), "{\"a\":%s.0}", bound);
	expect_bad(text, "number out of range", 5);
	snprintf(text, sizeof(text), "{\"a\":0.%se309}", bound);
	expect_bad(text, "number out of range", 5);
	snprintf(below, sizeof(below), "%s", bound);
	below[308] = '1'; /* ...791 */
	snprintf(text, sizeof(text), "{\"a\":%s.9999}", below);
	expect_ok(text);
	snprintf(text, sizeof(text), "{\"a\":%.1s.%se308}", bound, bound + 1);
	expect_bad(text, "number out of range", 5);
	snprintf(text, sizeof(text), "{\"a\":%.1s.%se308}", below, below + 1);
	expect_ok(text);
}

Test(json_scan, duplicate_keys)
{
	expect_bad("{\"a\":1,\"a\":2}", "duplicate key 'a'", 7);
	expect_bad("{\"a\":1,\"\\u0061\":2}", "duplicate key 'a'", 7); /* the same once read */
	expect_bad("{\"x\":{\"b\":1,\"c\":2,\"b\":3}}", "duplicate key 'b'", 18);
	expect_bad("{\"x\":[{\"b\":1,\"b\":1}]}", "duplicate key 'b'", 13);
	expect_bad("{\"\\ud83d\\ude00\":1,\"\xf0\x9f\x98\x80\":2}", "duplicate key", 18);
	/* the key in the error stays one short line */
	expect_bad("{\"a\\nb\":1,\"a\\nb\":2}", "duplicate key 'a?b'", 10);
	expect_bad("{\"kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk\":1,"
	           "\"kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk\":2}",
	           "duplicate key 'kkkkkkkkkkkkkkkkkkkkkkkk...'", 42);
}

/* More keys than fit on the stack: the sorted check finds the pair wherever it is. */
Test(json_scan, duplicate_keys_in_a_large_object)
{
	size_t cap = 64 * 1024, n;
	char *text = malloc(cap);
	struct jscan_result res;

	cr_assert_not_null(text);
	for (int dup = -1; dup < 1000; dup += 333) {
		n = (size_t)snprintf(text, cap, "{");
		for (int i = 0; i < 1000; i++)
			n += (size_t)snprintf(text + n, cap - n, "%s\"key%d\":%d", i ? "," : "", i,
			                      i);
		if (dup >= 0)
			n += (size_t)snprintf(text + n, cap - n, ",\"key%d\":0", dup);
		n += (size_t)snprintf(text + n, cap - n, "}");
		if (dup < 0) {
			cr_expect_eq(jscan_object(text, n, 8, NULL, NULL, &res), JSCAN_OK, "%s",
			             res.error);
		} else {
			char want[32];

			snprintf(want, sizeof(want), "duplicate key 'key%d'", dup);
			cr_expect_eq(jscan_object(text, n, 8, NULL, NULL, &res), JSCAN_INVALID);
			cr_expect(strstr(res.error, want), "%s, wanted %s", res.error, want);
		}
	}
	free(text);
}

Test(json_scan, nesting_depth)
{
	char text[256];
	struct jscan_result res;
	size_t n;

	/* the outer object counts: {"k":[[...]]} with 16 arrays is 17 levels */
	n = (size_t)snprintf(text, sizeof(text), "{\"k\":");
	for (int i = 0; i < 16; i++)
		text[n++] = '[';
	text[n++] = '1';
	for (int i = 0; i < 16; i++)
		text[n++] = ']';
	text[n++] = '}';
	text[n] = '\0';
	cr_expect_eq(jscan_object(text, n, 17, NULL, NULL, &res), JSCAN_OK, "%s", res.error);
	cr_expect_eq(jscan_object(text, n, 16, NULL, NULL, &res), JSCAN_INVALID);
	cr_expect_str_eq(res.error, "nested deeper than 16 levels");
	cr_expect_eq(res.offset, 20); /* the 16th '[' */
	cr_expect_eq(jscan_object("{\"a\":{\"b\":{}}}", 14, 3, NULL, NULL, &res), JSCAN_OK);
	cr_expect_eq(jscan_object("{\"a\":{\"b\":{}}}", 14, 2, NULL, NULL, &res), JSCAN_INVALID);
	cr_expect_eq(jscan_object("{}", 2, 1, NULL, NULL, &res), JSCAN_OK);

	/* out-of-range limits mean the maximum, which bounds the recursion */
	n = 0;
	text[n++] = '{';
	text[n++] = '"';
	text[n++] = 'k';
	text[n++] = '"';
	text[n++] = ':';
	for (int i = 0; i < JSCAN_DEPTH_MAX; i++)
		text[n++] = '[';
	text[n] = '\0';
	cr_expect_eq(jscan_object(text, n, 0, NULL, NULL, &res), JSCAN_INVALID);
	cr_expect_str_eq(res.error, "nested deeper than 64 levels");
	cr_expect_eq(jscan_object(text, n, 1000, NULL, NULL, &res), JSCAN_INVALID);
	cr_expect_str_eq(res.error, "nested deeper than 64 levels");
}

struct seen {
	struct jscan_member m[8];
	int n;
	int stop_at; /* return 7 at this member; -1 = never */
};

static int collect(const char *text, const struct jscan_member *m, void *arg)
{
	struct seen *s = arg;

	(void)text;
	if (s->n < 8)
		s->m[s->n] = *m;
	s->n++;
	return s->n - 1 == s->stop_at ? 7 : 0;
}

Test(json_scan, members_of_the_outer_object)
{
	const char *text = " { \"a\" : \"x\\\"y\" , \"b\":{\"c\":1},\"d\":[true],\"e\":-1.5,"
	                   "\"f\":true,\"g\":false,\"h\":null } ";
	static const enum jscan_kind kinds[] = { JSCAN_STRING, JSCAN_OBJECT, JSCAN_ARRAY,
		                                 JSCAN_NUMBER, JSCAN_TRUE,   JSCAN_FALSE,
		                                 JSCAN_NULL };
	static const char *const values[] = { "\"x\\\"y\"", "{\"c\":1}", "[true]", "-1.5",
		                              "true",       "false",     "null" };
	struct seen s = { .n = 0, .stop_at = -1 };
	struct jscan_result res;

	cr_assert_eq(jscan_object(text, strlen(text), 8, collect, &s, &res), JSCAN_OK, "%s",
	             res.error);
	cr_assert_eq(s.n, 7, "only the outer object's members: %d", s.n);
	for (int i = 0; i < 7; i++) {
		char key[2] = { "abdefgh"[i], '\0' }; /* "c" is the nested object's */
		const struct jscan_member *m = &s.m[i];

		cr_expect_eq(m->key_end - m->key_start, 1);
		cr_expect_eq(strncmp(text + m->key_start, key, 1), 0, "member %d", i);
		cr_expect_eq(m->kind, kinds[i], "member %d", i);
		cr_expect_eq(m->value_end - m->value_start, strlen(values[i]), "member %d", i);
		cr_expect_eq(strncmp(text + m->value_start, values[i], strlen(values[i])), 0,
		             "member %d", i);
	}

	/* a non-zero answer stops the scan and is what jscan_object() returns */
	s.n = 0;
	s.stop_at = 1;
	cr_expect_eq(jscan_object(text, strlen(text), 8, collect, &s, &res), 7);
	cr_expect_eq(s.n, 2);
	/* members are seen as they are read: an error further on comes after them */
	s.n = 0;
	s.stop_at = -1;
	cr_expect_eq(jscan_object("{\"a\":1,\"b\":2,", 13, 8, collect, &s, &res), JSCAN_INVALID);
	cr_expect_eq(s.n, 2);
}

Test(json_scan, string_helpers)
{
	const char *text = "{\"Trace\\u0050arent\":\"\\ud83d\\ude00 caf\\u00e9 \\\"q\\\"\"}";
	struct seen s = { .n = 0, .stop_at = -1 };
	struct jscan_result res;
	char out[64];
	size_t n;

	cr_assert_eq(jscan_object(text, strlen(text), 8, collect, &s, &res), JSCAN_OK, "%s",
	             res.error);
	cr_assert_eq(s.n, 1);
	cr_expect(jscan_string_equal(text, s.m[0].key_start, s.m[0].key_end, "TraceParent", false));
	cr_expect_not(
	        jscan_string_equal(text, s.m[0].key_start, s.m[0].key_end, "traceparent", false));
	cr_expect(jscan_string_equal(text, s.m[0].key_start, s.m[0].key_end, "traceparent", true));
	cr_expect_not(
	        jscan_string_equal(text, s.m[0].key_start, s.m[0].key_end, "traceparen", true));
	cr_expect_not(
	        jscan_string_equal(text, s.m[0].key_start, s.m[0].key_end, "traceparentx", true));

	n = jscan_string_copy(text, s.m[0].value_start + 1, s.m[0].value_end - 1, out, sizeof(out));
	cr_expect_str_eq(out, "\xf0\x9f\x98\x80 caf\xc3\xa9 \"q\"");
	cr_expect_eq(n, strlen(out));
	/* cut short, always NUL-terminated, the full length returned */
	n = jscan_string_copy(text, s.m[0].value_start + 1, s.m[0].value_end - 1, out, 6);
	cr_expect_str_eq(out, "\xf0\x9f\x98\x80 ");
	cr_expect_eq(n, strlen("\xf0\x9f\x98\x80 caf\xc3\xa9 \"q\""));
	n = jscan_string_copy(text, 2, 2, out, 1);
	cr_expect_eq(n, 0);
	cr_expect_str_eq(out, "");
	/* every simple escape */
	n = jscan_string_copy("\\b\\f\\n\\r\\t\\/\\\\\\\"", 0, 16, out, sizeof(out));
	cr_expect_eq(n, 8);
	cr_expect_eq(memcmp(out, "\b\f\n\r\t/\\\"", 8), 0);
}
