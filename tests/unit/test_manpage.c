/* The man page (packaging/outbox-relay.1) against the key table, like docs/configuration.md:
 * every key has an item with its environment variable and default, and no item names a key
 * that does not exist. Each command's synopsis shows the options the command takes, none
 * nested inside another's brackets. And it renders clean: `mandoc -T lint -W warning`, `groff -mandoc -ww
 * -z` and `man --warnings -l` say nothing. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/drive/process.h"
#include "config/config.h"
#include "tests/support/harness.h"

static void manpage_path(char *buf, size_t n)
{
	const char *data = getenv("RELAY_TEST_DATA");

	cr_assert_not_null(data, "RELAY_TEST_DATA is not set (ctest sets it)");
	snprintf(buf, n, "%s/../../packaging/outbox-relay.1", data);
}

/* The body of the item that starts at it: up to the next .It or .El (a new string). */
static char *item_body(const char *it)
{
	const char *body = strchr(it, '\n'), *end;
	const char *next_it, *next_el;

	cr_assert_not_null(body);
	next_it = strstr(body, "\n.It ");
	next_el = strstr(body, "\n.El");
	end = next_it && (!next_el || next_it < next_el) ? next_it : next_el;
	cr_assert_not_null(end);
	return strndup(body, (size_t)(end - body) + 1);
}

Test(manpage, every_key_has_an_item_with_its_variable_and_default)
{
	char path[4096];
	char *page;

	manpage_path(path, sizeof(path));
	page = harness_read_file(path);
	for (size_t i = 0; i < config_key_count(); i++) {
		char head[256], json[512], want[600];
		const char *it;
		char *body;

		snprintf(head, sizeof(head), "\n.It Cm %s Pq Ev %s\n", config_key_name(i),
		         config_key_env(i));
		it = strstr(page, head);
		cr_expect_not_null(it, "the man page has no item %s", head + 1);
		if (!it)
			continue;
		body = item_body(it + 1);
		if (config_key_default_json(i, json, sizeof(json)) == 0) {
			/* A string default is written without its JSON quotes; "" stays "". */
			size_t len = strlen(json);
			bool quoted = json[0] == '"';

			if (quoted && len > 2) {
				json[len - 1] = '\0';
				snprintf(want, sizeof(want), "\nDefault:\n.Ql %s%s%s .\n",
				         strchr(json, ' ') ? "\"" : "", json + 1,
				         strchr(json, ' ') ? "\"" : "");
			} else {
				snprintf(want, sizeof(want), "\nDefault:\n.Ql %s .\n", json);
			}
		} else {
			snprintf(want, sizeof(want), "\nDefault: computed at start");
		}
		cr_expect(strstr(body, want) != NULL, "%s: the man page does not say%s(it says:%s)",
		          config_key_name(i), want, body);
		free(body);
	}
	free(page);
}

Test(manpage, no_item_names_an_unknown_key)
{
	char path[4096];
	char *page;
	const char *p;
	int items = 0;

	manpage_path(path, sizeof(path));
	page = harness_read_file(path);
	/* Key items look like ".It Cm relay.lease Pq Ev OUTBOX_RELAY_LEASE". */
	for (p = page; (p = strstr(p, "\n.It Cm ")) != NULL; p++) {
		char key[128];
		const char *start = p + 8;
		size_t len = strcspn(start, " \n");

		if (strncmp(start + len, " Pq Ev OUTBOX_", 14) != 0)
			continue;
		cr_assert_lt(len, sizeof(key));
		snprintf(key, sizeof(key), "%.*s", (int)len, start);
		cr_expect_geq(config_key_index(key), 0, "the man page documents unknown key '%s'",
		              key);
		items++;
	}
	cr_expect_eq(items, (int)config_key_count(), "the man page has %d key items, the table %zu",
	             items, config_key_count());
	free(page);
}

/* Path of program in PATH; fails the test when it is not installed. */
static void find_program(const char *program, char *buf, size_t n)
{
	const char *path = getenv("PATH");

	if (!path || !*path)
		path = "/usr/bin:/bin";
	while (*path) {
		size_t len = strcspn(path, ":");

		snprintf(buf, n, "%.*s/%s", (int)len, path, program);
		if (len > 0 && access(buf, X_OK) == 0)
			return;
		path += len + (path[len] == ':');
	}
	cr_assert_fail("%s is not installed (tests/install-deps.sh installs it)", program);
}

/* Runs argv (argv[0] a program name looked up in PATH) with its output discarded and its
 * standard error captured; returns the exit status. */
static int run_quiet(char **argv, char *err, size_t n)
{
	char prog[4096], err_path[] = "/tmp/outbox-man-err.XXXXXX";
	char *env[] = { "LC_ALL=C.UTF-8", "MANWIDTH=80", "MANPAGER=cat", "PAGER=cat", NULL };
	int out, fd, status;
	pid_t pid;
	ssize_t got;

	find_program(argv[0], prog, sizeof(prog));
	argv[0] = prog;
	out = open("/dev/null", O_WRONLY);
	fd = mkstemp(err_path);
	cr_assert(out >= 0 && fd >= 0);
	pid = process_spawn(argv, env, out, fd);
	cr_assert_gt(pid, 0);
	status = process_wait(pid, 60000, NULL);
	if (status == -1)
		process_kill(pid);
	got = pread(fd, err, n - 1, 0);
	err[got > 0 ? got : 0] = '\0';
	close(out);
	close(fd);
	unlink(err_path);
	return status;
}

Test(manpage, renders_without_warnings)
{
	char path[4096], err[8192];
	int status;

	manpage_path(path, sizeof(path));
	/* mandoc's own lint, warnings and worse (its style notes about cross-references depend
	 * on which pages this machine has). */
	status = run_quiet((char *[]){ "mandoc", "-T", "lint", "-W", "warning", path, NULL }, err,
	                   sizeof(err));
	cr_expect(status == 0 && err[0] == '\0', "mandoc -T lint: status %d: %s", status, err);
	/* groff as man(1) runs it, with every warning on. */
	status = run_quiet((char *[]){ "groff", "-mandoc", "-ww", "-z", path, NULL }, err,
	                   sizeof(err));
	cr_expect(status == 0 && err[0] == '\0', "groff -ww: status %d: %s", status, err);
	status = run_quiet((char *[]){ "man", "--warnings", "-l", path, NULL }, err, sizeof(err));
	cr_expect(status == 0 && err[0] == '\0', "man -l: status %d: %s", status, err);
}

/* The page as `mandoc -T ascii` renders it, overstrike (bold, underline) removed: a new
 * string. */
static char *render(const char *path)
{
	char prog[4096], out_path[] = "/tmp/outbox-man-out.XXXXXX";
	char *argv[] = { prog, "-T", "ascii", (char *)path, NULL };
	char *env[] = { "LC_ALL=C.UTF-8", NULL };
	char *text, *w;
	int fd, err, status;
	pid_t pid;

	find_program("mandoc", prog, sizeof(prog));
	fd = mkstemp(out_path);
	err = open("/dev/null", O_WRONLY);
	cr_assert(fd >= 0 && err >= 0);
	pid = process_spawn(argv, env, fd, err);
	cr_assert_gt(pid, 0);
	status = process_wait(pid, 60000, NULL);
	if (status == -1)
		process_kill(pid);
	close(fd);
	close(err);
	cr_assert_eq(status, 0, "mandoc -T ascii exited %d", status);
	text = harness_read_file(out_path);
	unlink(out_path);
	/* "X\bX" (bold) and "_\bX" (underline) are X. */
	w = text;
	for (const char *r = text; *r; r++) {
		if (r[1] == '\b' && r[2]) {
			r++;
			continue;
		}
		*w++ = *r;
	}
	*w = '\0';
	return text;
}

Test(manpage, commands_show_their_options_unnested)
{
	static const char *const synopses[] = {
		"     status [--json]\n",
		"     dead [--json] [--limit n]\n",
		"     keys --blocked [--json] [--limit n]\n",
		"     requeue --id id ... [--force] | --all-dead\n",
		"     discard --id id ... [--force]\n",
		"     purge --older-than duration\n",
		"     replay filter ... [--dry-run | --yes]\n",
		"     leave-cursor [--dry-run]\n",
		NULL,
	};
	char path[4096];
	char *text, *commands, *end;

	manpage_path(path, sizeof(path));
	text = render(path);
	commands = strstr(text, "\nCOMMANDS\n");
	cr_assert_not_null(commands, "no COMMANDS section in the rendered page");
	end = strstr(commands + 1, "\n\n"
	                           "CONFIGURATION");
	if (!end)
		end = strstr(commands + 1, "\nCONFIGURATION");
	cr_assert_not_null(end);
	*end = '\0';
	for (const char *const *s = synopses; *s; s++)
		cr_expect_not_null(strstr(commands, *s), "the man page's COMMANDS do not show%s",
		                   *s + 4);
	/* An optional part never opens inside another: "[--json [--limit n]]" would say that
	 * --limit needs --json. */
	for (const char *line = commands; line && *line;) {
		const char *nl = strchr(line, '\n');
		size_t len = nl ? (size_t)(nl - line) : strlen(line);
		int depth = 0;

		for (size_t i = 0; i < len; i++) {
			if (line[i] == '[') {
				cr_expect_eq(depth, 0, "nested optional part in the man page: %.*s",
				             (int)len, line);
				depth++;
			} else if (line[i] == ']' && depth > 0) {
				depth--;
			}
		}
		line = nl ? nl + 1 : NULL;
	}
	free(text);
}
