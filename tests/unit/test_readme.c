/* The README's configuration reference is checked against the key table: every key has a row
 * with its environment variable, and no row names a key that does not exist. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"

static char *read_readme(void)
{
	const char *data = getenv("RELAY_TEST_DATA");
	char path[1024];
	FILE *f;
	char *buf;
	long n;

	cr_assert_not_null(data, "RELAY_TEST_DATA is not set (ctest sets it)");
	snprintf(path, sizeof(path), "%s/../../README.md", data);
	f = fopen(path, "rb");
	cr_assert_not_null(f, "cannot open %s", path);
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = calloc(1, (size_t)n + 1);
	cr_assert_not_null(buf);
	cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	return buf;
}

Test(readme, every_key_has_a_row_with_its_variable)
{
	char *readme = read_readme();

	for (size_t i = 0; i < config_key_count(); i++) {
		char row[256];

		snprintf(row, sizeof(row), "| `%s` | `%s` |", config_key_name(i),
		         config_key_env(i));
		cr_expect_not_null(strstr(readme, row), "README has no row starting %s", row);
	}
	free(readme);
}

Test(readme, no_row_names_an_unknown_key)
{
	char *readme = read_readme();
	const char *p = readme;
	int rows = 0;

	/* Rows of the reference table look like "| `relay.lease` | `OUTBOX_RELAY_LEASE` |". */
	while ((p = strstr(p, "\n| `")) != NULL) {
		char key[128];
		const char *start = p + 4, *end = strchr(start, '`');

		p = start;
		if (!end || (size_t)(end - start) >= sizeof(key) ||
		    strncmp(end, "` | `OUTBOX_", 12))
			continue;
		memcpy(key, start, (size_t)(end - start));
		key[end - start] = '\0';
		cr_expect_geq(config_key_index(key), 0, "README documents unknown key '%s'", key);
		rows++;
	}
	cr_assert_eq(rows, (int)config_key_count(), "README has %d key rows, the table %zu", rows,
	             config_key_count());
	free(readme);
}
