/* The documentation against the code: every message a log call in relay/ can print is in
 * docs/logs.md, and every configuration key has its row in docs/configuration.md with its
 * variable, default and help from the key table (what `config example` prints); no row names
 * a key that does not exist. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "tests/support/harness.h"

/* The text with comments blanked out (string and character literals kept as they are), so
 * that a log call quoted in a comment is not taken for one. Modified in place. */
static void blank_comments(char *s)
{
	for (char *p = s; *p; p++) {
		if (*p == '"' || *p == '\'') {
			char q = *p;

			for (p++; *p && *p != q; p++)
				if (*p == '\\' && p[1])
					p++;
			if (!*p)
				return;
		} else if (p[0] == '/' && p[1] == '*') {
			for (; *p && !(p[0] == '*' && p[1] == '/'); p++)
				if (*p != '\n')
					*p = ' ';
			if (!*p)
				return;
			p[0] = p[1] = ' ';
			p++;
		} else if (p[0] == '/' && p[1] == '/') {
			for (; *p && *p != '\n'; p++)
				*p = ' ';
			if (!*p)
				return;
		}
	}
}

/* One string literal at p (at its opening quote), unescaped and appended to out; returns the
 * character after its closing quote. */
static const char *take_literal(const char *p, char *out, size_t n)
{
	size_t len = strlen(out);

	for (p++; *p && *p != '"'; p++) {
		char c = *p;

		if (c == '\\' && p[1]) {
			p++;
			c = *p == 'n' ? '\n' : *p == 't' ? '\t' : *p;
		}
		if (len + 1 < n)
			out[len++] = c;
	}
	out[len] = '\0';
	return *p ? p + 1 : p;
}

struct messages {
	char text[128][256];
	char where[128][320];
	size_t n;
};

/* The messages of the log call whose argument list starts after the '(' at p: the string
 * literals of its third argument, adjacent literals joined ("a" "b" is one message; the two
 * branches of `c ? "a" : "b"` are two). */
static void call_messages(const char *p, const char *file, int line, struct messages *m)
{
	int depth = 1, arg = 0;

	while (*p && depth > 0) {
		if (*p == '"') {
			if (arg == 2) {
				char msg[256] = "";

				/* this literal and the ones right after it, blanks between */
				for (;;) {
					p = take_literal(p, msg, sizeof(msg));
					while (*p == ' ' || *p == '\t' || *p == '\n')
						p++;
					if (*p != '"')
						break;
				}
				cr_assert_lt(m->n, 128,
				             "more than 128 log messages: raise the bound");
				snprintf(m->text[m->n], sizeof(m->text[0]), "%s", msg);
				snprintf(m->where[m->n], sizeof(m->where[0]), "%s:%d", file, line);
				m->n++;
				continue;
			}
			p = take_literal(p, (char[256]){ "" }, 256);
			continue;
		}
		if (*p == '(' || *p == '[' || *p == '{')
			depth++;
		else if (*p == ')' || *p == ']' || *p == '}')
			depth--;
		else if (*p == ',' && depth == 1)
			arg++;
		p++;
	}
}

/* Every log_event / log_event_kv / log_fields call in the .c files of relay/, log.c aside. */
static void collect_messages(struct messages *m)
{
	static const char *const calls[] = { "log_event(", "log_event_kv(", "log_fields(", NULL };
	char dir_path[4096];
	DIR *d;
	struct dirent *e;

	memset(m, 0, sizeof(*m));
	harness_source_path(dir_path, sizeof(dir_path), "relay");
	d = opendir(dir_path);
	cr_assert_not_null(d, "cannot open %s", dir_path);
	while ((e = readdir(d)) != NULL) {
		size_t len = strlen(e->d_name);
		char rel[300];
		char *src;

		if (len < 3 || strcmp(e->d_name + len - 2, ".c") != 0 ||
		    strcmp(e->d_name, "log.c") == 0)
			continue;
		snprintf(rel, sizeof(rel), "relay/%s", e->d_name);
		src = harness_read_source(rel);
		blank_comments(src);
		for (const char *const *c = calls; *c; c++) {
			for (const char *p = src; (p = strstr(p, *c)) != NULL; p++) {
				int line = 1;

				/* the name alone, not the tail of a longer one */
				if (p > src && (p[-1] == '_' || (p[-1] >= 'a' && p[-1] <= 'z')))
					continue;
				for (const char *q = src; q < p; q++)
					line += *q == '\n';
				call_messages(p + strlen(*c), rel, line, m);
			}
		}
		free(src);
	}
	closedir(d);
}

Test(docs, every_log_message_is_in_logs_md)
{
	struct messages m;
	char *logs = harness_read_source("docs/logs.md");

	collect_messages(&m);
	/* A scanner that found next to nothing would pass vacuously. */
	cr_assert_geq(m.n, 30, "only %zu log messages found in relay/*.c", m.n);
	for (size_t i = 0; i < m.n; i++) {
		char want[300];

		snprintf(want, sizeof(want), "`%s`", m.text[i]);
		cr_expect_not_null(strstr(logs, want),
		                   "docs/logs.md does not list the log message %s (%s)", want,
		                   m.where[i]);
	}
	free(logs);
}

/* The row of key i in docs/configuration.md's table, as a new string, or NULL. */
static char *key_row(const char *doc, size_t i)
{
	char head[256];
	const char *row, *end;

	snprintf(head, sizeof(head), "\n| `%s` | `%s` |", config_key_name(i), config_key_env(i));
	row = strstr(doc, head);
	if (!row)
		return NULL;
	row++;
	end = strchr(row, '\n');
	return strndup(row, end ? (size_t)(end - row) : strlen(row));
}

Test(docs, every_key_has_its_row_with_default_and_help)
{
	char *doc = harness_read_source("docs/configuration.md");

	for (size_t i = 0; i < config_key_count(); i++) {
		char json[512], want[600];
		char *row = key_row(doc, i);

		cr_expect_not_null(row, "docs/configuration.md has no row starting | `%s` | `%s` |",
		                   config_key_name(i), config_key_env(i));
		if (!row)
			continue;
		if (config_key_default_json(i, json, sizeof(json)) == 0) {
			size_t len = strlen(json);

			/* A string default is shown without its JSON quotes; "" stays "". */
			if (json[0] == '"' && len > 2) {
				json[len - 1] = '\0';
				snprintf(want, sizeof(want), "| `%s` |", json + 1);
			} else {
				snprintf(want, sizeof(want), "| `%s` |", json);
			}
		} else {
			snprintf(want, sizeof(want), "(computed)");
		}
		cr_expect_not_null(strstr(row, want),
		                   "%s: the row does not give the default %s: %s",
		                   config_key_name(i), want, row);
		cr_expect_not_null(strstr(row, config_key_help(i)),
		                   "%s: the row does not carry the key's help \"%s\": %s",
		                   config_key_name(i), config_key_help(i), row);
		free(row);
	}
	free(doc);
}

Test(docs, no_row_names_an_unknown_key)
{
	char *doc = harness_read_source("docs/configuration.md");
	const char *p = doc;
	int rows = 0;

	/* Rows of the reference look like "| `relay.lease` | `OUTBOX_RELAY_LEASE` |". */
	while ((p = strstr(p, "\n| `")) != NULL) {
		char key[128];
		const char *start = p + 4, *end = strchr(start, '`');

		p = start;
		if (!end || (size_t)(end - start) >= sizeof(key) ||
		    strncmp(end, "` | `OUTBOX_", 12) != 0)
			continue;
		memcpy(key, start, (size_t)(end - start));
		key[end - start] = '\0';
		cr_expect_geq(config_key_index(key), 0,
		              "docs/configuration.md documents unknown key '%s'", key);
		rows++;
	}
	cr_assert_eq(rows, (int)config_key_count(),
	             "docs/configuration.md has %d key rows, the table %zu", rows,
	             config_key_count());
	free(doc);
}
