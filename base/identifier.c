/* The identifier checks of identifier.h: table and channel names are the only text ever put
 * into a statement, so they are held to the contract's plain ASCII identifiers. */
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "base/identifier.h"

#define IDENT_MAX 63

static size_t ident_part_len(const char *s)
{
	size_t i = 0;

	/* Not isalpha()/isalnum(): they depend on the locale; the contract is ASCII only. */
	if (!((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z') || s[0] == '_'))
		return 0;
	while ((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
	       (s[i] >= '0' && s[i] <= '9') || s[i] == '_')
		i++;
	return i <= IDENT_MAX ? i : 0;
}

bool identifier_plain_valid(const char *s)
{
	size_t n;

	if (!s)
		return false;
	n = ident_part_len(s);
	return n > 0 && s[n] == '\0';
}

bool identifier_valid(const char *s)
{
	size_t n;

	if (!s)
		return false;
	n = ident_part_len(s);
	if (n == 0)
		return false;
	if (s[n] == '\0')
		return true;
	if (s[n] != '.')
		return false;
	return identifier_plain_valid(s + n + 1);
}

const char *identifier_base(const char *s)
{
	const char *dot = strchr(s, '.');

	return dot ? dot + 1 : s;
}

bool identifier_table_name_valid(const char *s)
{
	return identifier_valid(s) && strlen(identifier_base(s)) <= IDENTIFIER_TABLE_BASE_MAX;
}
