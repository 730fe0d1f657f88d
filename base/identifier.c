/* The identifier checks of identifier.h: table and channel names are the only text ever put
 * into a statement, so they are held to the contract's plain ASCII identifiers. */
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "base/identifier.h"

#define IDENT_MAX 63

/* PostgreSQL 15's reserved key words (appendix "SQL Key Words", the PostgreSQL column's
 * "reserved" and "reserved (can be function or type)" entries; pg_get_keywords() catcode R
 * and T): none of them can name a table or a LISTEN channel unquoted, and we never quote.
 * Sorted, for the binary search. */
/* clang-format off */
static const char *const reserved_words[] = {
	"all", "analyse", "analyze", "and", "any", "array", "as", "asc", "asymmetric",
	"authorization", "binary", "both", "case", "cast", "check", "collate", "collation",
	"column", "concurrently", "constraint", "create", "cross", "current_catalog",
	"current_date", "current_role", "current_schema", "current_time", "current_timestamp",
	"current_user", "default", "deferrable", "desc", "distinct", "do", "else", "end", "except",
	"false", "fetch", "for", "foreign", "freeze", "from", "full", "grant", "group", "having",
	"ilike", "in", "initially", "inner", "intersect", "into", "is", "isnull", "join",
	"lateral", "leading", "left", "like", "limit", "localtime", "localtimestamp", "natural",
	"not", "notnull", "null", "offset", "on", "only", "or", "order", "outer", "overlaps",
	"placing", "primary", "references", "returning", "right", "select", "session_user",
	"similar", "some", "symmetric", "table", "tablesample", "then", "to", "trailing", "true",
	"union", "unique", "user", "using", "variadic", "verbose", "when", "where", "window",
	"with",
};
/* clang-format on */

static int compare_part(const char *part, size_t len, const char *word)
{
	for (size_t i = 0; i < len; i++) {
		char c = part[i] >= 'A' && part[i] <= 'Z' ? (char)(part[i] - 'A' + 'a') : part[i];

		if (word[i] == '\0' || c != word[i])
			return word[i] == '\0' ? 1 : (unsigned char)c - (unsigned char)word[i];
	}
	return word[len] == '\0' ? 0 : -1;
}

/* Whether s[0, len) is a reserved word, in any case ("USER" is user to the parser). */
static bool part_reserved(const char *s, size_t len)
{
	size_t lo = 0, hi = sizeof(reserved_words) / sizeof(reserved_words[0]);

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = compare_part(s, len, reserved_words[mid]);

		if (c == 0)
			return true;
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return false;
}

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
	return n > 0 && s[n] == '\0' && !part_reserved(s, n);
}

bool identifier_valid(const char *s)
{
	size_t n;

	if (!s)
		return false;
	n = ident_part_len(s);
	if (n == 0 || part_reserved(s, n))
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

bool identifier_reserved_word(const char *s, char *word, size_t n)
{
	const char *part = s;

	while (part) {
		const char *dot = strchr(part, '.');
		size_t len = dot ? (size_t)(dot - part) : strlen(part);

		if (part_reserved(part, len)) {
			if (word && n > 0)
				snprintf(word, n, "%.*s", (int)len, part);
			return true;
		}
		part = dot ? dot + 1 : NULL;
	}
	return false;
}
