/* The W3C Trace Context checks of trace_context.h. A producer is held to the strictest reading
 * (Trace Context Level 1's key grammar, which Level 2 only widens), so that whatever it sends
 * every consumer's parser takes. */
#include "base/trace_context.h"

#include <stdbool.h>
#include <string.h>

#define TRACE_PARENT_LEN 55 /* version 00: 2 + 1 + 32 + 1 + 16 + 1 + 2 */
#define SIMPLE_KEY_MAX   256
#define TENANT_MAX       241
#define SYSTEM_MAX       14
#define VALUE_MAX        256

static bool lower_hex(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	return true;
}

static bool all_zeros(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (s[i] != '0')
			return false;
	return true;
}

const char *trace_parent_check(const char *s, size_t len, char *trace_id)
{
	bool v00;

	if (len < 3 || !lower_hex(s, 2) || s[2] != '-')
		return "it does not start with a version (two lowercase hex digits) and a dash";
	if (s[0] == 'f' && s[1] == 'f')
		return "version ff is forbidden";
	v00 = s[0] == '0' && s[1] == '0';
	if (v00 && len != TRACE_PARENT_LEN)
		return "version 00 is exactly 55 characters";
	if (len < TRACE_PARENT_LEN)
		return "it is shorter than 55 characters";
	if (len > TRACE_PARENT_MAX)
		return "it is longer than 512 characters";
	if (!lower_hex(s + 3, 32))
		return "the trace-id is not 32 lowercase hex digits";
	if (s[35] != '-')
		return "no dash after the trace-id";
	if (all_zeros(s + 3, 32))
		return "the trace-id is all zeros";
	if (!lower_hex(s + 36, 16))
		return "the parent-id is not 16 lowercase hex digits";
	if (s[52] != '-')
		return "no dash after the parent-id";
	if (all_zeros(s + 36, 16))
		return "the parent-id is all zeros";
	if (!lower_hex(s + 53, 2))
		return "the flags are not two lowercase hex digits";
	/* A later version may add fields: after a dash, and nothing we could not carry. */
	if (len > TRACE_PARENT_LEN && s[TRACE_PARENT_LEN] != '-')
		return "the flags are not followed by the end or a dash";
	for (size_t i = TRACE_PARENT_LEN; i < len; i++)
		if (s[i] < 0x21 || s[i] > 0x7e)
			return "it holds a character that is not printable ASCII";
	if (trace_id != NULL) {
		memcpy(trace_id, s + 3, TRACE_ID_HEX);
		trace_id[TRACE_ID_HEX] = '\0';
	}
	return NULL;
}

static bool key_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
	       c == '*' || c == '/';
}

/* simple-key, or tenant-id "@" system-id. */
static const char *key_check(const char *k, size_t n)
{
	const char *at = memchr(k, '@', n);
	size_t tenant;

	for (size_t i = 0; i < n; i++)
		if (k[i] != '@' && !key_char(k[i]))
			return "a key holds a character other than a-z 0-9 _ - * / @";
	if (at == NULL) {
		if (n == 0 || !(k[0] >= 'a' && k[0] <= 'z'))
			return "a key does not start with a lowercase letter";
		if (n > SIMPLE_KEY_MAX)
			return "a key is longer than 256 characters";
		return NULL;
	}
	tenant = (size_t)(at - k);
	if (memchr(at + 1, '@', n - tenant - 1) != NULL)
		return "a key holds '@' twice";
	if (tenant == 0 || tenant > TENANT_MAX)
		return "a tenant id (before '@') is not 1 to 241 characters";
	if (n - tenant - 1 == 0 || n - tenant - 1 > SYSTEM_MAX)
		return "a system id (after '@') is not 1 to 14 characters";
	if (!(at[1] >= 'a' && at[1] <= 'z'))
		return "a system id (after '@') does not start with a lowercase letter";
	return NULL;
}

/* 1 to 256 printable ASCII characters but ',' and '=', the last one not a space. */
static const char *value_check(const char *v, size_t n)
{
	if (n == 0 || n > VALUE_MAX)
		return "a value is not 1 to 256 characters";
	for (size_t i = 0; i < n; i++)
		if (v[i] < 0x20 || v[i] > 0x7e || v[i] == ',' || v[i] == '=')
			return "a value holds '=' or a character that is not printable ASCII";
	return NULL; /* a trailing space was taken for white space around the member */
}

const char *trace_state_check(const char *s, size_t len, int *members)
{
	struct {
		const char *k;
		size_t n;
	} keys[TRACE_STATE_MEMBERS];
	size_t i = 0;
	int n = 0;

	if (len > TRACE_STATE_MAX)
		return "it is longer than 512 characters";
	for (;;) {
		size_t end = i, a = i, b;
		const char *eq, *why;

		while (end < len && s[end] != ',')
			end++;
		b = end;
		while (a < b && (s[a] == ' ' || s[a] == '\t'))
			a++;
		while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t'))
			b--;
		if (a < b) { /* an empty member is allowed */
			if (n == TRACE_STATE_MEMBERS)
				return "it has more than 32 list-members";
			eq = memchr(s + a, '=', b - a);
			if (eq == NULL)
				return "a list-member is not key=value";
			why = key_check(s + a, (size_t)(eq - (s + a)));
			if (why == NULL)
				why = value_check(eq + 1, (size_t)(s + b - eq - 1));
			if (why != NULL)
				return why;
			keys[n].k = s + a;
			keys[n].n = (size_t)(eq - (s + a));
			for (int j = 0; j < n; j++)
				if (keys[j].n == keys[n].n &&
				    memcmp(keys[j].k, keys[n].k, keys[n].n) == 0)
					return "a key appears twice";
			n++;
		}
		if (end == len)
			break;
		i = end + 1;
	}
	if (members != NULL)
		*members = n;
	return NULL;
}
