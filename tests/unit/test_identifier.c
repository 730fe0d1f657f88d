/* Unit tests of base/identifier: the shape of table and channel names, and PostgreSQL's
 * reserved key words, which cannot be pasted into SQL unquoted. */
#include <string.h>

#include <criterion/criterion.h>

#include "base/identifier.h"

Test(identifier, reserved_words_are_refused_in_any_part_and_case)
{
	static const char *const bad[] = {
		"select", "user",    "table",        "order",       "group",
		"USER",   "Order",   "app.user",     "user.outbox", "public.table",
		"left",   "verbose", "current_user", "with",
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		cr_assert_not(identifier_valid(bad[i]), "%s accepted", bad[i]);
		cr_assert_not(identifier_table_name_valid(bad[i]), "%s accepted", bad[i]);
		if (!strchr(bad[i], '.'))
			cr_assert_not(identifier_plain_valid(bad[i]), "%s accepted", bad[i]);
	}
}

/* Only reserved words: unreserved ones and those that cannot be functions or types still
 * name tables unquoted (CREATE TABLE between (...) works). */
Test(identifier, other_words_are_accepted)
{
	static const char *const good[] = {
		"outbox", "users", "user_outbox", "orders", "selects", "name",  "key",   "value",
		"data",   "text",  "between",     "int",    "public",  "event", "_user", "a.b",
	};

	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		cr_assert(identifier_valid(good[i]), "%s refused", good[i]);
		cr_assert_not(identifier_reserved_word(good[i], NULL, 0), "%s", good[i]);
	}
}

Test(identifier, reserved_word_names_the_part)
{
	char word[16];

	cr_assert(identifier_reserved_word("app.Order", word, sizeof(word)));
	cr_assert_str_eq(word, "Order");
	cr_assert(identifier_reserved_word("SELECT", word, sizeof(word)));
	cr_assert_str_eq(word, "SELECT");
	cr_assert(identifier_reserved_word("current_timestamp", word, 8));
	cr_assert_str_eq(word, "current");
	cr_assert_not(identifier_reserved_word("app.outbox", word, sizeof(word)));
	cr_assert_not(identifier_reserved_word("", word, sizeof(word)));
	/* a prefix or an extension of a reserved word is not one */
	cr_assert_not(identifier_reserved_word("selec", NULL, 0));
	cr_assert_not(identifier_reserved_word("selectx", NULL, 0));
	cr_assert_not(identifier_reserved_word("a", NULL, 0));
	cr_assert_not(identifier_reserved_word("zzz", NULL, 0));
}
