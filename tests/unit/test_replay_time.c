/* What `replay --since/--until` takes a value for: a duration ago needs its unit, digits alone
 * are refused as ambiguous (seconds ago, or a date?), anything else is a time for PostgreSQL
 * to read. */
#include <criterion/criterion.h>
#include <stdint.h>

#include "relay/command.h"

Test(replay_time, digits_alone_are_ambiguous)
{
	static const char *const texts[] = { "20240501", "3600", "0", "1714521600",
		                             "1.5",      "12.",  ".5" };

	for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
		int64_t ago = -1;

		cr_assert_eq(replay_time_kind(texts[i], &ago), REPLAY_TIME_AMBIGUOUS, "'%s'",
		             texts[i]);
		cr_assert_eq(ago, -1, "'%s' wrote a duration", texts[i]);
	}
}

Test(replay_time, a_duration_with_its_unit_is_ago)
{
	static const struct {
		const char *text;
		int64_t ms;
	} cases[] = {
		{ "3600s", 3600000 }, { "30m", 1800000 }, { "2h", 7200000 },
		{ "7d", 604800000 },  { "500ms", 500 },   { "1.5h", 5400000 },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int64_t ago = -1;

		cr_assert_eq(replay_time_kind(cases[i].text, &ago), REPLAY_TIME_AGO, "'%s'",
		             cases[i].text);
		cr_assert_eq(ago, cases[i].ms, "'%s': %lld ms", cases[i].text, (long long)ago);
	}
}

Test(replay_time, anything_else_is_a_time_for_the_database)
{
	static const char *const texts[] = { "2024-05-01",
		                             "2024-05-01T12:00:00Z",
		                             "2024-05-01 12:00:00+02",
		                             "20240501T120000",
		                             "yesterday",
		                             "" };

	for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
		int64_t ago = -1;

		cr_assert_eq(replay_time_kind(texts[i], &ago), REPLAY_TIME_AT, "'%s'", texts[i]);
	}
}
