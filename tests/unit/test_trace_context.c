/* W3C Trace Context checks of base/trace_context.h: traceparent version 00 and later versions
 * (the spec's forward compatibility), tracestate lists (members, keys, values, limits), and
 * the trace id handed back. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "base/trace_context.h"

#define TP "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

static void parent_ok(const char *s, const char *want_id)
{
	char id[TRACE_ID_HEX + 1] = "unchanged";
	const char *why = trace_parent_check(s, strlen(s), id);

	cr_expect_null(why, "'%s' refused: %s", s, why);
	if (!why)
		cr_expect_str_eq(id, want_id);
}

static void parent_bad(const char *s, const char *want)
{
	char id[TRACE_ID_HEX + 1] = "unchanged";
	const char *why = trace_parent_check(s, strlen(s), id);

	cr_expect_not_null(why, "'%s' accepted", s);
	if (why)
		cr_expect_str_eq(why, want, "'%s'", s);
	cr_expect_str_eq(id, "unchanged", "nothing written for a refused one");
}

Test(trace_context, traceparent_version_00)
{
	parent_ok(TP, "0af7651916cd43dd8448eb211c80319c");
	parent_ok("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
	          "4bf92f3577b34da6a3ce929d0e0e4736");
	parent_ok("00-00000000000000000000000000000001-0000000000000001-ff",
	          "00000000000000000000000000000001");
	cr_expect_null(trace_parent_check(TP, strlen(TP), NULL), "trace_id may be NULL");

	/* wrong length */
	parent_bad("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0",
	           "version 00 is exactly 55 characters");
	parent_bad(TP "-", "version 00 is exactly 55 characters");
	parent_bad(TP "0", "version 00 is exactly 55 characters");
	parent_bad("", "it does not start with a version (two lowercase hex digits) and a dash");
	parent_bad("00", "it does not start with a version (two lowercase hex digits) and a dash");
	/* uppercase, or not hex */
	parent_bad("00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
	           "the trace-id is not 32 lowercase hex digits");
	parent_bad("00-0af7651916cd43dd8448eb211c80319c-B7AD6B7169203331-01",
	           "the parent-id is not 16 lowercase hex digits");
	parent_bad("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0A",
	           "the flags are not two lowercase hex digits");
	parent_bad("0A-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	           "it does not start with a version (two lowercase hex digits) and a dash");
	parent_bad("00-0af7651916cd43dd8448eb211c80319g-b7ad6b7169203331-01",
	           "the trace-id is not 32 lowercase hex digits");
	/* fields of the wrong size, dashes out of place */
	parent_bad("00-0af7651916cd43dd8448eb211c80319-cb7ad6b7169203331-01",
	           "the trace-id is not 32 lowercase hex digits");
	parent_bad("00-0af7651916cd43dd8448eb211c80319cb-7ad6b7169203331-01",
	           "no dash after the trace-id");
	parent_bad("00-0af7651916cd43dd8448eb211c80319c-b7ad6b71692033310-1",
	           "no dash after the parent-id");
	parent_bad("00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	           "it does not start with a version (two lowercase hex digits) and a dash");
	/* all zeros */
	parent_bad("00-00000000000000000000000000000000-b7ad6b7169203331-01",
	           "the trace-id is all zeros");
	parent_bad("00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
	           "the parent-id is all zeros");
	/* version ff */
	parent_bad("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	           "version ff is forbidden");
}

/* "If a higher version is detected": at least 55 characters, the fields where version 00 has
 * them, then the end or a dash. */
Test(trace_context, traceparent_later_versions)
{
	char longer[600];

	parent_ok("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	          "0af7651916cd43dd8448eb211c80319c");
	parent_ok("cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what-the-future-holds",
	          "0af7651916cd43dd8448eb211c80319c");
	parent_ok("fe-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-09-",
	          "0af7651916cd43dd8448eb211c80319c");
	parent_bad("cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01.what",
	           "the flags are not followed by the end or a dash");
	parent_bad("cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1",
	           "it is shorter than 55 characters");
	parent_bad("cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-a b",
	           "it holds a character that is not printable ASCII");
	parent_bad("cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-\xc3\xa9",
	           "it holds a character that is not printable ASCII");
	parent_bad("cc-00000000000000000000000000000000-b7ad6b7169203331-01",
	           "the trace-id is all zeros");

	snprintf(longer, sizeof(longer), "cc%s-", &TP[2]);
	memset(longer + 56, 'x', 456); /* 512 in all */
	longer[512] = '\0';
	parent_ok(longer, "0af7651916cd43dd8448eb211c80319c");
	longer[512] = 'x';
	longer[513] = '\0';
	parent_bad(longer, "it is longer than 512 characters");
}

static void state_ok(const char *s, int want_members)
{
	int members = -1;
	const char *why = trace_state_check(s, strlen(s), &members);

	cr_expect_null(why, "'%s' refused: %s", s, why);
	cr_expect_eq(members, want_members, "'%s'", s);
}

static void state_bad(const char *s, const char *want)
{
	const char *why = trace_state_check(s, strlen(s), NULL);

	cr_expect_not_null(why, "'%s' accepted", s);
	if (why)
		cr_expect_str_eq(why, want, "'%s'", s);
}

Test(trace_context, tracestate_lists)
{
	state_ok("congo=t61rcWkgMzE", 1);
	state_ok("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE", 2);
	state_ok(" rojo=00f067aa0ba902b7 ,\tcongo=t61rcWkgMzE\t", 2);
	state_ok("", 0);
	state_ok("  ", 0);
	state_ok(",,", 0);
	state_ok("a=1,,b=2, ,", 2); /* empty members are allowed */
	state_ok("a= leading spaces are the value's", 1);
	state_ok("a=trailing spaces are not   ", 1);
	state_ok("a=!\"#$%&'()*+-./0123456789:;<>?@[\\]^_`{|}~", 1);
}

Test(trace_context, tracestate_keys)
{
	char key[300];

	state_ok("a=1", 1);
	state_ok("a0_-*/=1", 1);
	state_ok("tenant@vendor=1", 1);
	state_ok("0tenant@v=1", 1); /* a tenant id may start with a digit */
	state_ok("t_-*/0@v_-*/0=1", 1);
	state_bad("0a=1", "a key does not start with a lowercase letter");
	state_bad("_a=1", "a key does not start with a lowercase letter");
	state_bad("A=1", "a key holds a character other than a-z 0-9 _ - * / @");
	state_bad("aB=1", "a key holds a character other than a-z 0-9 _ - * / @");
	state_bad("a.b=1", "a key holds a character other than a-z 0-9 _ - * / @");
	state_bad("=1", "a key does not start with a lowercase letter");
	state_bad("a@b@c=1", "a key holds '@' twice");
	state_bad("@v=1", "a tenant id (before '@') is not 1 to 241 characters");
	state_bad("t@=1", "a system id (after '@') is not 1 to 14 characters");
	state_bad("t@0v=1", "a system id (after '@') does not start with a lowercase letter");
	state_bad("t@abcdefghijklmno=1", "a system id (after '@') is not 1 to 14 characters");
	state_ok("t@abcdefghijklmn=1", 1);

	memset(key, 'k', 256);
	snprintf(key + 256, sizeof(key) - 256, "=1");
	state_ok(key, 1);
	memset(key, 'k', 257);
	snprintf(key + 257, sizeof(key) - 257, "=1");
	state_bad(key, "a key is longer than 256 characters");
	memset(key, 't', 241);
	snprintf(key + 241, sizeof(key) - 241, "@v=1");
	state_ok(key, 1);
	memset(key, 't', 242);
	snprintf(key + 242, sizeof(key) - 242, "@v=1");
	state_bad(key, "a tenant id (before '@') is not 1 to 241 characters");
}

Test(trace_context, tracestate_values_and_limits)
{
	char list[700], value[300];
	size_t n = 0;

	state_bad("a", "a list-member is not key=value");
	state_bad("a=1,b", "a list-member is not key=value");
	state_bad("a=", "a value is not 1 to 256 characters");
	state_bad("a=   ", "a value is not 1 to 256 characters");
	state_bad("a=b=c", "a value holds '=' or a character that is not printable ASCII");
	state_bad("a=b\tc", "a value holds '=' or a character that is not printable ASCII");
	state_bad("a=caf\xc3\xa9", "a value holds '=' or a character that is not printable ASCII");
	state_bad("a=1,a=2", "a key appears twice");
	state_bad("a@v=1,b=2,a@v=3", "a key appears twice");
	state_ok("a@v=1,a@w=2,a=3", 3);

	memset(value, 'v', 256);
	value[256] = '\0';
	snprintf(list, sizeof(list), "a=%s", value);
	state_ok(list, 1);
	snprintf(list, sizeof(list), "a=%sv", value);
	state_bad(list, "a value is not 1 to 256 characters");

	/* 32 members fit, 33 do not */
	for (int i = 0; i < 32; i++)
		n += (size_t)snprintf(list + n, sizeof(list) - n, "%sk%d=v", i ? "," : "", i);
	state_ok(list, 32);
	snprintf(list + n, sizeof(list) - n, ",k32=v");
	state_bad(list, "it has more than 32 list-members");

	/* 512 characters in all */
	memset(list, ' ', 512);
	list[0] = 'a';
	list[1] = '=';
	list[2] = '1';
	list[512] = '\0';
	state_ok(list, 1);
	list[512] = ' ';
	list[513] = '\0';
	state_bad(list, "it is longer than 512 characters");
}
