/* The README is the front door, not the whole book: at most 500 lines, and it links every page
 * of docs/, so that none is left where nobody finds it. The log lines it picks out are ones
 * the code prints (docs/logs.md lists them all; tests/unit/test_docs.c checks that). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/harness.h"

#define README_MAX_LINES 500

Test(readme, at_most_500_lines)
{
	char *readme = harness_read_source("README.md");
	int lines = 0;

	for (const char *p = readme; *p; p++)
		lines += *p == '\n';
	cr_expect_leq(lines, README_MAX_LINES,
	              "README.md has %d lines, at most %d: new material goes into docs/", lines,
	              README_MAX_LINES);
	free(readme);
}

Test(readme, links_every_docs_page)
{
	char *readme = harness_read_source("README.md");
	char dir_path[4096];
	DIR *d;
	struct dirent *e;
	int pages = 0;

	harness_source_path(dir_path, sizeof(dir_path), "docs");
	d = opendir(dir_path);
	cr_assert_not_null(d, "cannot open %s", dir_path);
	while ((e = readdir(d)) != NULL) {
		size_t len = strlen(e->d_name);
		char link[300];

		if (len < 4 || strcmp(e->d_name + len - 3, ".md") != 0)
			continue;
		snprintf(link, sizeof(link), "](docs/%s)", e->d_name);
		cr_expect_not_null(strstr(readme, link), "README.md does not link docs/%s",
		                   e->d_name);
		pages++;
	}
	closedir(d);
	cr_expect_geq(pages, 10, "docs/ has %d pages", pages);
	free(readme);
}

/* The README's log table names messages the relay really prints: each row's message is in
 * docs/logs.md, whose list test_docs checks against the code. */
Test(readme, its_log_lines_are_in_logs_md)
{
	char *readme = harness_read_source("README.md");
	char *logs = harness_read_source("docs/logs.md");
	const char *table = strstr(readme, "| level | message |");
	int rows = 0;

	cr_assert_not_null(table, "README.md has no log table");
	for (const char *p = table; (p = strstr(p, "\n| ")) != NULL;) {
		const char *msg = strstr(p, " | `"), *end;
		char want[400];

		p += 3;
		if (strncmp(p, "info", 4) != 0 && strncmp(p, "warn", 4) != 0 &&
		    strncmp(p, "error", 5) != 0)
			break; /* the table ended */
		cr_assert_not_null(msg);
		msg += 3;
		end = strchr(msg + 1, '`');
		cr_assert_not_null(end);
		snprintf(want, sizeof(want), "%.*s", (int)(end - msg + 1), msg);
		cr_expect_not_null(strstr(logs, want),
		                   "README's log line %s is not in docs/logs.md", want);
		rows++;
	}
	cr_expect_eq(rows, 10, "README's log table has %d rows, the ten that matter most", rows);
	free(logs);
	free(readme);
}
