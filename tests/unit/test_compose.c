/* The Docker files against the code: every OUTBOX_* variable in the compose file is a real
 * configuration key (a typo there would stop the relay at start), and the image's runtime
 * stage runs as a non-root user with a HEALTHCHECK. Line-based: no YAML parser needed. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "tests/support/harness.h"

/* Reads docker/<name> relative to RELAY_TEST_DATA (tests/data); caller frees. */
static char *read_docker_file(const char *name)
{
	const char *data = getenv("RELAY_TEST_DATA");
	char path[4096];

	cr_assert_not_null(data, "RELAY_TEST_DATA must point at tests/data");
	snprintf(path, sizeof(path), "%s/../../docker/%s", data, name);
	return harness_read_file(path);
}

static bool is_config_env(const char *name)
{
	for (size_t i = 0; i < config_key_count(); i++) {
		if (strcmp(config_key_env(i), name) == 0)
			return true;
	}
	return false;
}

/* Copies the next line of *p into line (without the newline), trimmed on the left. */
static bool next_line(const char **p, char *line, size_t n)
{
	const char *s = *p, *end;
	size_t len;

	if (*s == '\0')
		return false;
	end = strchr(s, '\n');
	len = end ? (size_t)(end - s) : strlen(s);
	*p = end ? end + 1 : s + len;
	while (len > 0 && (*s == ' ' || *s == '\t')) {
		s++;
		len--;
	}
	if (len >= n)
		len = n - 1;
	memcpy(line, s, len);
	line[len] = '\0';
	return true;
}

Test(compose, every_outbox_variable_is_a_config_key)
{
	char *text = read_docker_file("compose.yml");
	const char *p = text;
	size_t found = 0;
	bool db_file = false, amqp_file = false;

	cr_assert_gt(config_key_count(), 0);
	while ((p = strstr(p, "OUTBOX_")) != NULL) {
		char name[128];
		size_t len = 0;

		/* Part of a longer identifier (e.g. MY_OUTBOX_X) is not ours. */
		if (p > text && (isalnum((unsigned char)p[-1]) || p[-1] == '_')) {
			p++;
			continue;
		}
		while ((isupper((unsigned char)p[len]) || isdigit((unsigned char)p[len]) ||
		        p[len] == '_') &&
		       len < sizeof(name) - 1) {
			name[len] = p[len];
			len++;
		}
		name[len] = '\0';
		p += len;
		if (strcmp(name, "OUTBOX_DATABASE_URL_FILE") == 0)
			db_file = true;
		if (strcmp(name, "OUTBOX_AMQP_URL_FILE") == 0)
			amqp_file = true;
		/* OUTBOX_<KEY>_FILE reads key <KEY> from a secret file. */
		if (len > 5 && strcmp(name + len - 5, "_FILE") == 0 && !is_config_env(name))
			name[len - 5] = '\0';
		cr_expect(is_config_env(name), "compose.yml names %s, which is not a config key",
		          name);
		found++;
	}
	cr_assert_gt(found, 0, "compose.yml configures the relay with OUTBOX_* variables");
	cr_assert(db_file, "the database URL comes from a secret file");
	cr_assert(amqp_file, "the AMQP URL comes from a secret file");
	free(text);
}

Test(compose, secrets_are_files_not_inline_passwords)
{
	char *text = read_docker_file("compose.yml");

	cr_assert_not_null(strstr(text, "POSTGRES_PASSWORD_FILE"));
	cr_assert_null(strstr(text, "POSTGRES_PASSWORD:"), "password inline in compose.yml");
	cr_assert_null(strstr(text, "OUTBOX_DATABASE_URL:"), "database URL inline in compose.yml");
	cr_assert_null(strstr(text, "OUTBOX_AMQP_URL:"), "AMQP URL inline in compose.yml");
	cr_assert_not_null(strstr(text, "service_completed_successfully"),
	                   "the relay waits for migrate to finish");
	cr_assert_not_null(strstr(text, "service_healthy"));
	free(text);
}

Test(dockerfile, runtime_stage_is_non_root_with_healthcheck)
{
	char *text = read_docker_file("Dockerfile");
	const char *p = text;
	char line[1024];
	int stages = 0;
	bool user = false, healthcheck = false, entrypoint = false, expose = false;
	bool build_has_tests_off = false;

	while (next_line(&p, line, sizeof(line))) {
		if (strncmp(line, "FROM ", 5) == 0) {
			/* Only the last stage ends up in the image: reset what it must have. */
			stages++;
			user = healthcheck = entrypoint = expose = false;
			/* The build on Debian 12; the runtime an empty image it fills. */
			cr_expect(strstr(line, "debian:bookworm") != NULL ||
			                  strncmp(line, "FROM scratch", 12) == 0,
			          "base: %s", line);
		} else if (strncmp(line, "USER ", 5) == 0) {
			const char *u = line + 5;
			user = strcmp(u, "root") != 0 && strcmp(u, "0") != 0 &&
			       strncmp(u, "root:", 5) != 0 && strncmp(u, "0:", 2) != 0;
		} else if (strncmp(line, "HEALTHCHECK ", 12) == 0) {
			healthcheck = strstr(line, "NONE") == NULL;
		} else if (strncmp(line, "ENTRYPOINT ", 11) == 0) {
			entrypoint = strstr(line, "outbox-relay") != NULL;
		} else if (strncmp(line, "EXPOSE ", 7) == 0) {
			expose = strstr(line, "8787") != NULL;
		}
		if (strstr(line, "-DOUTBOX_TESTS=OFF") != NULL)
			build_has_tests_off = true;
	}
	cr_assert_geq(stages, 2, "a multi-stage build keeps the toolchain out of the image");
	cr_assert(user, "the runtime stage must switch to a non-root USER");
	cr_assert(healthcheck, "the runtime stage must have a HEALTHCHECK");
	cr_assert(entrypoint, "ENTRYPOINT runs outbox-relay");
	cr_assert(expose, "EXPOSE 8787");
	cr_assert(build_has_tests_off, "the image build skips the test suites");
	cr_assert_not_null(strstr(text, "OUTBOX_HTTP_LISTEN=0.0.0.0:8787"),
	                   "the healthcheck needs the HTTP port on a reachable address");
	cr_expect_not_null(strstr(text, "org.opencontainers.image.licenses=\"MIT\""));
	free(text);
}

/* Valid for docker-compose 1.29 as well as Compose v2: no top-level name: (1.29 rejects it)
 * and no inline configs (1.29 ignores configs outside a swarm). */
Test(compose, files_are_valid_for_compose_1_29)
{
	static const char *const files[] = { "compose.yml", "compose.ha.yml",
		                             "compose.sidecar.yml" };

	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		char *text = read_docker_file(files[i]);

		cr_expect(strncmp(text, "name:", 5) != 0 && strstr(text, "\nname:") == NULL,
		          "%s has a top-level name:", files[i]);
		cr_expect_null(strstr(text, "\nconfigs:"), "%s has top-level configs", files[i]);
		cr_expect_null(strstr(text, "content:"), "%s has inline content", files[i]);
		free(text);
	}
}

/* The demo: the stack's network is internal, the queue is bound before the relay starts, and
 * the relay and migrate run on a read-only root. */
Test(compose, demo_network_topology_and_read_only)
{
	char *text = read_docker_file("compose.yml");

	cr_expect_not_null(strstr(text, "\n  backend:\n    internal: true\n"),
	                   "the stack's network is internal");
	cr_expect_not_null(strstr(text, "declare binding source=amq.topic destination=demo"));
	cr_expect_not_null(strstr(text, "      topology:\n        condition: "
	                                "service_completed_successfully"),
	                   "the relay waits for the topology step");
	cr_expect_not_null(strstr(text, "read_only: true"));
	cr_expect_null(strstr(text, "only accepts connections from localhost"),
	               "the official image's guest may log in from any host");
	free(text);
}

Test(compose, sidecar_adds_migrate_and_relay)
{
	char *text = read_docker_file("compose.sidecar.yml");

	cr_expect_not_null(strstr(text, "\n  outbox-migrate:\n"));
	cr_expect_not_null(strstr(text, "\n  outbox-relay:\n"));
	cr_expect_not_null(strstr(text, "outbox-migrate:\n        condition: "
	                                "service_completed_successfully"));
	cr_expect_not_null(strstr(text, "OUTBOX_DATABASE_URL_FILE"));
	cr_expect_not_null(strstr(text, "OUTBOX_AMQP_URL_FILE"));
	cr_expect_not_null(strstr(text, "read_only: true"));
	free(text);
}
