/* The files the Debian package installs, against the code: packaging/relay.json is what
 * `outbox-relay config example` prints (the key table at its defaults), the relay accepts it
 * and reads every key's default from it; packaging/outbox-relay.default only names real
 * variables, each example accepted by the relay; the unit's stop timeout covers the default
 * shutdown timeout. Runs the relay binary, needs no server. */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "tests/support/harness.h"

/* packaging/<name> in the source tree (found from RELAY_TEST_DATA, tests/data). */
static void packaging_path(char *buf, size_t n, const char *name)
{
	const char *data = getenv("RELAY_TEST_DATA");

	cr_assert_not_null(data, "RELAY_TEST_DATA is not set (ctest sets it)");
	snprintf(buf, n, "%s/../../packaging/%s", data, name);
}

/* The relay binary with args, in an environment of PATH, the sanitizer options and env alone. */
static struct harness_output relay(const char *const *env, const char *const *args)
{
	struct harness_output o;

	harness_cli_bare(&o, env, args);
	return o;
}

Test(packaging, relay_json_is_what_config_example_prints)
{
	char path[4096];
	char *shipped;
	struct harness_output r;

	packaging_path(path, sizeof(path), "relay.json");
	shipped = harness_read_file(path);
	r = relay(NULL, (const char *const[]){ "config", "example", NULL });
	cr_assert_eq(r.status, 0, "config example exited %d: %s", r.status, r.err);
	cr_expect_str_eq(shipped, r.out,
	                 "packaging/relay.json differs from `outbox-relay config example`: "
	                 "regenerate it with `outbox-relay config example > packaging/relay.json`");
	harness_output_free(&r);
	free(shipped);
}

Test(packaging, config_example_ignores_the_environment_and_the_file)
{
	struct harness_output plain =
	        relay(NULL, (const char *const[]){ "config", "example", NULL });
	/* Neither a valid nor a broken setting changes the defaults it prints, nor stops it. */
	struct harness_output env = relay(
	        (const char *const[]){ "OUTBOX_RELAY_BATCH_SIZE=7", "OUTBOX_NO_SUCH_KEY=1", NULL },
	        (const char *const[]){ "--config", "/nonexistent/relay.json", "config", "example",
	                               NULL });

	cr_assert_eq(plain.status, 0);
	cr_assert_eq(env.status, 0, "config example exited %d: %s", env.status, env.err);
	cr_expect_str_eq(plain.out, env.out);
	harness_output_free(&plain);
	harness_output_free(&env);
}

Test(packaging, relay_json_passes_config_check)
{
	char path[4096];
	struct harness_output r;

	packaging_path(path, sizeof(path), "relay.json");
	r = relay(NULL, (const char *const[]){ "--config", path, "config", "check", NULL });
	cr_expect_eq(r.status, 0, "config check of %s exited %d: %s", path, r.status, r.err);
	cr_expect(strstr(r.out, "configuration ok") != NULL, "config check said: %s", r.out);
	harness_output_free(&r);
}

/* The value column of key i's line in `config show` ("%-28s %-40s %s"). */
static void show_value(const char *show, size_t i, char *buf, size_t n)
{
	const char *name = config_key_name(i), *line = show;
	size_t len;

	while (line && !(strncmp(line, name, strlen(name)) == 0 && line[strlen(name)] == ' '))
		line = (line = strchr(line, '\n')) ? line + 1 : NULL;
	cr_assert_not_null(line, "config show has no line for %s", name);
	line += 29;
	len = strcspn(line, "\n");
	/* The source column follows the 40-column value. */
	if (len > 40 && line[40] == ' ')
		len = 40;
	while (len > 0 && line[len - 1] == ' ')
		len--;
	snprintf(buf, n, "%.*s", (int)len, line);
}

Test(packaging, relay_json_sets_every_key_to_its_default)
{
	char path[4096], src[600];
	struct harness_output with, without;

	packaging_path(path, sizeof(path), "relay.json");
	with = relay(NULL, (const char *const[]){ "--config", path, "config", "show", NULL });
	without = relay(NULL, (const char *const[]){ "config", "show", NULL });
	cr_assert_eq(with.status, 0, "%s", with.err);
	cr_assert_eq(without.status, 0, "%s", without.err);
	for (size_t i = 0; i < config_key_count(); i++) {
		char a[512], b[512], json[512];
		bool computed = config_key_default_json(i, json, sizeof(json)) != 0;

		show_value(with.out, i, a, sizeof(a));
		show_value(without.out, i, b, sizeof(b));
		/* relay.id is hostname:pid, another pid in each run; it is not in the file. */
		if (!computed)
			cr_expect_str_eq(a, b, "%s: %s from relay.json, %s by default",
			                 config_key_name(i), a, b);
		snprintf(src, sizeof(src), "%-40s %s", a, computed ? "default" : "file ");
		cr_expect(strstr(with.out, src) != NULL || computed,
		          "%s does not come from relay.json: %s", config_key_name(i), with.out);
	}
	harness_output_free(&with);
	harness_output_free(&without);
}

/* The variable name of an assignment line "#NAME=value" or "NAME=value"; false otherwise. */
static bool assignment(const char *line, char *name, size_t n, bool *commented)
{
	size_t len;

	*commented = line[0] == '#';
	line += *commented;
	len = strspn(line, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_");
	if (len == 0 || line[len] != '=' || len >= n)
		return false;
	snprintf(name, n, "%.*s", (int)len, line);
	return true;
}

Test(packaging, environment_file_names_only_keys_and_each_example_is_accepted)
{
	char path[4096];
	char *text, *save = NULL;
	int examples = 0;

	packaging_path(path, sizeof(path), "outbox-relay.default");
	text = harness_read_file(path);
	for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char name[128], base[128], kv[1024];
		bool commented, known = false;
		struct harness_output r;

		if (!assignment(line, name, sizeof(name), &commented))
			continue;
		/* Nothing is set by the package: an unconfigured relay reads its defaults. */
		cr_expect(commented, "an active assignment in the shipped file: %s", line);
		snprintf(base, sizeof(base), "%s", name);
		if (strlen(base) > 5 && strcmp(base + strlen(base) - 5, "_FILE") == 0)
			base[strlen(base) - 5] = '\0';
		for (size_t i = 0; i < config_key_count(); i++)
			known = known || strcmp(config_key_env(i), name) == 0 ||
			        (config_key_sensitive(i) && strcmp(config_key_env(i), base) == 0);
		cr_expect(known, "%s names no configuration key (or a _FILE form of a secret)",
		          name);
		if (!known || strcmp(name, base) != 0)
			continue; /* a _FILE example names a file that is not here */
		snprintf(kv, sizeof(kv), "%s", line + 1);
		r = relay((const char *const[]){ kv, NULL },
		          (const char *const[]){ "config", "check", NULL });
		cr_expect_eq(r.status, 0, "the example %s is refused: %s", kv, r.err);
		harness_output_free(&r);
		examples++;
	}
	cr_expect_geq(examples, 3, "the environment file shows only %d examples", examples);
	free(text);
}

Test(packaging, unit_stops_later_than_the_relay_and_runs_the_packaged_config)
{
	char path[4096], json[64];
	char *unit, *p;
	int64_t stop_ms = 0, shutdown_ms = 0;
	int idx = config_key_index("relay.shutdown_timeout");

	packaging_path(path, sizeof(path), "outbox-relay.service");
	unit = harness_read_file(path);
	cr_assert(strstr(unit, "\nExecStart=/usr/bin/outbox-relay --config "
	                       "/etc/outbox-relay/relay.json run\n") != NULL);
	cr_assert(strstr(unit, "\nEnvironmentFile=-/etc/default/outbox-relay\n") != NULL);
	cr_assert(strstr(unit, "\nType=notify\n") != NULL);
	p = strstr(unit, "\nTimeoutStopSec=");
	cr_assert_not_null(p);
	p += strlen("\nTimeoutStopSec=");
	p[strcspn(p, "\n")] = '\0';
	cr_assert_eq(config_parse_duration(p, &stop_ms), 0, "TimeoutStopSec=%s", p);
	cr_assert_geq(idx, 0);
	cr_assert_eq(config_key_default_json((size_t)idx, json, sizeof(json)), 0);
	json[strlen(json) - 1] = '\0';
	cr_assert_eq(config_parse_duration(json + 1, &shutdown_ms), 0);
	/* The relay exits within shutdown_timeout + 1 s, then hands back its leases. */
	cr_expect_gt(stop_ms, shutdown_ms + 5000, "TimeoutStopSec=%s is too close to %s", p,
	             json + 1);
	free(unit);
}

/* The migrate step under systemd runs with exactly what the relay runs with: a drop-in of the
 * relay's own unit that adds `migrate` before ExecStart (same binary, same --config) and sets
 * nothing else, so the unit's EnvironmentFile, the credentials drop-in, User and sandbox all
 * apply. The README no longer sources /etc/default/outbox-relay in a shell for it (a URL with
 * '&' broke that, and a credential was not there at all). */
Test(packaging, migrate_drop_in_runs_migrate_with_the_units_own_settings)
{
	char path[4096], want[512];
	char *unit, *dropin, *readme, *exec, *line;
	size_t len;

	packaging_path(path, sizeof(path), "outbox-relay.service");
	unit = harness_read_file(path);
	packaging_path(path, sizeof(path), "migrate.conf");
	dropin = harness_read_file(path);
	packaging_path(path, sizeof(path), "../README.md");
	readme = harness_read_file(path);

	/* ExecStart=<binary and options> run  ->  ExecStartPre=<the same> migrate */
	exec = strstr(unit, "\nExecStart=");
	cr_assert_not_null(exec);
	exec += strlen("\nExecStart=");
	len = strcspn(exec, "\n");
	cr_assert(len > 4 && strncmp(exec + len - 4, " run", 4) == 0, "ExecStart=%.*s", (int)len,
	          exec);
	snprintf(want, sizeof(want), "ExecStartPre=%.*s migrate", (int)len - 4, exec);

	/* Only [Service] and that line: everything else is inherited from the unit. */
	for (line = dropin; *line; line += strcspn(line, "\n") + (line[strcspn(line, "\n")] != 0)) {
		size_t n = strcspn(line, "\n");

		if (n == 0 || line[0] == '#')
			continue;
		cr_expect((n == strlen("[Service]") && strncmp(line, "[Service]", n) == 0) ||
		                  (n == strlen(want) && strncmp(line, want, n) == 0),
		          "migrate.conf sets more than the migrate step: %.*s (want only %s)",
		          (int)n, line, want);
	}
	cr_assert(strstr(dropin, "\n[Service]\n") != NULL, "migrate.conf has no [Service]");
	cr_assert(strstr(dropin, want) != NULL, "migrate.conf lacks %s", want);

	cr_expect(strstr(readme, ". /etc/default/outbox-relay") == NULL,
	          "the README sources /etc/default/outbox-relay in a shell");
	cr_expect(strstr(readme, "examples/migrate.conf") != NULL,
	          "the README does not show the migrate drop-in");
	free(unit);
	free(dropin);
	free(readme);
}
