/* Unit tests of base/message_property (the AMQP properties a row may set, and their values:
 * the rules the relay maps by and the producer library checks by) and base/text (one-line
 * error texts). */
#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>

#include "base/message_property.h"
#include "base/text.h"

static struct message_property_value string_value(const char *s)
{
	return (struct message_property_value){ .type = MESSAGE_PROPERTY_JSON_STRING,
		                                .string = s,
		                                .len = strlen(s) };
}

static struct message_property_value integer_value(long long v)
{
	return (struct message_property_value){ .type = MESSAGE_PROPERTY_JSON_INTEGER,
		                                .integer = v };
}

static void show_text(const void *arg, char *out, size_t n)
{
	text_shown(out, n, arg, strlen(arg));
}

static void expect_ok(const char *name, struct message_property_value v)
{
	const struct message_property *found = NULL;
	char err[256] = "";

	cr_assert_eq(message_property_check("properties", name, &v, &found, err, sizeof(err)),
	             MESSAGE_PROPERTY_OK, "%s: %s", name, err);
	cr_assert_not_null(found, "%s", name);
	cr_assert_str_eq(found->name, name);
}

static void expect_refused(const char *name, struct message_property_value v, const char *want)
{
	const struct message_property *found = (const void *)1;
	char err[256] = "";

	cr_assert_eq(message_property_check("properties", name, &v, &found, err, sizeof(err)),
	             MESSAGE_PROPERTY_INVALID, "%s accepted", name);
	cr_assert_str_eq(err, want);
	cr_assert_eq(found, (const void *)1, "found written on failure");
}

Test(message_property, the_list_is_what_a_row_may_set)
{
	static const char *const names[] = { "correlation_id", "reply_to", "type",
		                             "app_id",         "user_id",  "content_encoding",
		                             "expiration",     "priority", "delivery_mode" };
	static const char *const not_names[] = {
		"message_id", "timestamp", "headers", "content_type", "cluster_id", "Priority", ""
	};

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		cr_assert_not_null(message_property_find(names[i]), "%s", names[i]);
	for (size_t i = 0; i < sizeof(not_names) / sizeof(not_names[0]); i++)
		cr_assert_null(message_property_find(not_names[i]), "%s", not_names[i]);
	cr_assert_eq(message_property_find("priority")->id, MESSAGE_PROPERTY_PRIORITY);
	cr_assert_eq(message_property_find("reply_to")->kind, MESSAGE_PROPERTY_STRING);
}

Test(message_property, valid_values_are_accepted)
{
	char longest[MESSAGE_PROPERTY_MAX_STRING + 1];
	struct message_property_value nul = { .type = MESSAGE_PROPERTY_JSON_STRING,
		                              .string = "a\0b",
		                              .len = 3 };
	const struct message_property *found = (const void *)1;
	struct message_property_value null = { .type = MESSAGE_PROPERTY_JSON_NULL };
	char err[64];

	memset(longest, 'x', sizeof(longest) - 1);
	longest[sizeof(longest) - 1] = '\0';
	expect_ok("correlation_id", string_value(longest));
	expect_ok("type", string_value(""));
	expect_ok("app_id", nul);
	expect_ok("expiration", string_value("0"));
	expect_ok("expiration", string_value("0004294967295"));
	expect_ok("priority", integer_value(0));
	expect_ok("priority", integer_value(9));
	expect_ok("delivery_mode", integer_value(1));
	expect_ok("delivery_mode", integer_value(2));
	/* null: "not set", under any name */
	cr_assert_eq(
	        message_property_check("properties", "anything", &null, &found, err, sizeof(err)),
	        MESSAGE_PROPERTY_OK);
	cr_assert_null(found);
}

Test(message_property, invalid_values_are_refused_in_the_relays_words)
{
	char longer[MESSAGE_PROPERTY_MAX_STRING + 2];
	struct message_property_value real = { .type = MESSAGE_PROPERTY_JSON_OTHER,
		                               .show = show_text,
		                               .show_arg = "1.5" };
	struct message_property_value text = string_value("high");

	memset(longer, '7', sizeof(longer) - 1);
	longer[sizeof(longer) - 1] = '\0';
	expect_refused("foo", integer_value(1), "properties: unknown property 'foo'");
	expect_refused("a\nb", integer_value(1), "properties: unknown property 'a?b'");
	expect_refused("correlation_id", integer_value(5),
	               "properties: correlation_id must be a string");
	expect_refused("app_id", string_value(longer), "properties: app_id longer than 255 bytes");
	expect_refused("expiration", integer_value(60000),
	               "properties: expiration must be a string of digits");
	expect_refused("expiration", string_value("-1"),
	               "properties: expiration must be a string of digits");
	expect_refused("expiration", string_value(""),
	               "properties: expiration must be a string of digits");
	expect_refused("expiration", string_value(longer),
	               "properties: expiration longer than 255 bytes");
	expect_refused("expiration", string_value("4294967296"),
	               "properties: expiration must be at most 4294967295");
	expect_refused("priority", integer_value(12),
	               "properties: priority must be an integer 0-9, got ?");
	expect_refused("priority", real, "properties: priority must be an integer 0-9, got 1.5");
	text.show = show_text;
	text.show_arg = "\"high\"";
	expect_refused("priority", text,
	               "properties: priority must be an integer 0-9, got \"high\"");
	expect_refused("delivery_mode", integer_value(3),
	               "properties: delivery_mode must be 1 or 2");
	expect_refused("delivery_mode", string_value("2"),
	               "properties: delivery_mode must be 1 or 2");
}

Test(text, one_line)
{
	char s[] = "ERROR:  boom\nDETAIL:\tmore\r\n  \n";

	text_one_line(s);
	cr_assert_str_eq(s, "ERROR:  boom DETAIL: more");
}

Test(text, shown_names_are_printable_and_cut)
{
	char out[TEXT_SHOWN_SIZE], name[100];

	text_shown(out, sizeof(out),
	           "a\x01\x7f"
	           "b",
	           4);
	cr_assert_str_eq(out, "a??b");
	memset(name, 'n', sizeof(name));
	text_shown(out, sizeof(out), name, sizeof(name));
	cr_assert_eq(strlen(out), TEXT_SHOWN_MAX + 3);
	cr_assert_str_eq(out + TEXT_SHOWN_MAX, "...");
	text_shown(out, 4, "abcdef", 6);
	cr_assert_str_eq(out, "");
}
