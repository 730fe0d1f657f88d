/* docker/compose.ha.yml against the code and against what a RabbitMQ cluster needs, read line
 * by line (no Docker engine is needed, none runs the file here): every OUTBOX_* variable is a
 * configuration key, the relay is given the three nodes, the nodes share one Erlang cookie and
 * form a cluster from a classic_config node list, a quorum queue is bound to the demo's
 * exchange before the relay starts, and every long-running server has a health check. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "tests/support/harness.h"

#define MAX_BLOCK 16384

static const char *const nodes[] = { "rabbitmq1", "rabbitmq2", "rabbitmq3" };

/* docker/<name>, found from RELAY_TEST_DATA (tests/data); caller frees. */
static char *read_docker_file(const char *name)
{
	const char *data = getenv("RELAY_TEST_DATA");
	char path[4096];

	cr_assert_not_null(data, "RELAY_TEST_DATA must point at tests/data");
	snprintf(path, sizeof(path), "%s/../../docker/%s", data, name);
	return harness_read_file(path);
}

static char *read_compose(void)
{
	return read_docker_file("compose.ha.yml");
}

static size_t indent_of(const char *line)
{
	size_t n = 0;

	while (line[n] == ' ')
		n++;
	return n;
}

/* Whether the line holds nothing but spaces or a comment. */
static bool blank(const char *line, size_t len)
{
	size_t i = 0;

	while (i < len && line[i] == ' ')
		i++;
	return i == len || line[i] == '#';
}

/* Copies into out the block of the key "<indent spaces><key>:" — the key's line and every
 * following line indented deeper (blank and comment lines included) — from the first such key
 * found after the line "<parent>:" at column 0. False when there is none. */
static bool block(const char *text, const char *parent, size_t indent, const char *key, char *out,
                  size_t outlen)
{
	char head[128], want[160];
	const char *p, *start, *end;
	size_t len;

	snprintf(head, sizeof(head), "\n%s:\n", parent);
	p = strstr(text, head);
	if (p == NULL)
		return false;
	p += strlen(head) - 1;
	snprintf(want, sizeof(want), "\n%*s%s:", (int)indent, "", key);
	for (;;) {
		p = strstr(p, want);
		if (p == NULL)
			return false;
		/* "<key>:" then the end of the line or a value, not a longer key. */
		if (p[strlen(want)] == '\n' || p[strlen(want)] == ' ')
			break;
		p++;
	}
	start = p + 1;
	end = strchr(start, '\n');
	while (end != NULL) {
		const char *next = end + 1;
		const char *nl = strchr(next, '\n');
		size_t l = nl ? (size_t)(nl - next) : strlen(next);

		if (l > 0 && !blank(next, l) && indent_of(next) <= indent)
			break;
		if (nl == NULL) {
			end = next + l;
			break;
		}
		end = nl;
	}
	len = end ? (size_t)(end - start) : strlen(start);
	cr_assert_lt(len, outlen, "block '%s' is too long for the test", key);
	memcpy(out, start, len);
	out[len] = '\0';
	return true;
}

static bool service(const char *text, const char *name, char *out, size_t outlen)
{
	return block(text, "services", 2, name, out, outlen);
}

static bool is_config_env(const char *name)
{
	for (size_t i = 0; i < config_key_count(); i++) {
		if (strcmp(config_key_env(i), name) == 0)
			return true;
	}
	return false;
}

static size_t count(const char *hay, const char *needle)
{
	size_t n = 0;

	for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle))
		n++;
	return n;
}

Test(compose_ha, every_outbox_variable_is_a_config_key)
{
	char *text = read_compose();
	const char *p = text;
	size_t found = 0;

	cr_assert_gt(config_key_count(), 0);
	while ((p = strstr(p, "OUTBOX_")) != NULL) {
		char name[128];
		size_t len = 0;

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
		/* OUTBOX_<KEY>_FILE reads key <KEY> from a secret file. */
		if (len > 5 && strcmp(name + len - 5, "_FILE") == 0 && !is_config_env(name))
			name[len - 5] = '\0';
		cr_expect(is_config_env(name), "compose.ha.yml names %s, which is not a config key",
		          name);
		found++;
	}
	cr_assert_gt(found, 0);
	free(text);
}

Test(compose_ha, services)
{
	static const char *const want[] = {
		"postgres",        "rabbitmq1",     "rabbitmq2", "rabbitmq3",
		"rabbitmq-cookie", "rabbitmq-init", "migrate",   "relay",
	};
	char *text = read_compose();
	char *b = malloc(MAX_BLOCK);

	cr_assert_not_null(b);
	cr_assert_not_null(strstr(text, "\nservices:\n"));
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		cr_expect(service(text, want[i], b, MAX_BLOCK), "no service '%s'", want[i]);
	cr_assert(service(text, "postgres", b, MAX_BLOCK));
	cr_expect_not_null(strstr(b, "image: postgres:"));
	cr_expect_not_null(strstr(b, "POSTGRES_PASSWORD_FILE"), "the password comes from a secret");
	cr_expect_not_null(strstr(b, "healthcheck:"));
	cr_expect_not_null(strstr(b, "pg_isready"));
	free(b);
	free(text);
}

Test(compose_ha, relay_is_given_the_three_nodes)
{
	char *text = read_compose();
	char *b = malloc(MAX_BLOCK);
	const char *url, *end;
	char list[2048];

	cr_assert_not_null(b);
	cr_assert(service(text, "relay", b, MAX_BLOCK), "no relay service");
	url = strstr(b, "OUTBOX_AMQP_URL:");
	cr_assert_not_null(url, "the relay's environment sets OUTBOX_AMQP_URL");
	url += strlen("OUTBOX_AMQP_URL:");
	end = strchr(url, '\n');
	cr_assert_not_null(end);
	snprintf(list, sizeof(list), "%.*s", (int)(end - url), url);
	cr_expect_eq(count(list, "amqp://"), 3, "OUTBOX_AMQP_URL lists %zu URLs, not 3: %s",
	             count(list, "amqp://"), list);
	cr_expect_eq(count(list, ","), 2, "the URLs are separated by commas: %s", list);
	for (size_t i = 0; i < 3; i++) {
		char host[64];

		snprintf(host, sizeof(host), "@%s:5672", nodes[i]);
		cr_expect_not_null(strstr(list, host), "OUTBOX_AMQP_URL lacks %s: %s", host, list);
	}
	cr_expect_not_null(strstr(b, "OUTBOX_DATABASE_URL_FILE"), "the database URL is a secret");
	/* The relay starts after the table exists and the quorum queue is bound. */
	cr_expect_not_null(strstr(b, "rabbitmq-init:\n        condition: "
	                             "service_completed_successfully"),
	                   "the relay waits for the queue to be declared");
	cr_expect_not_null(strstr(b, "migrate:\n        condition: "
	                             "service_completed_successfully"),
	                   "the relay waits for migrate");
	cr_expect_not_null(strstr(b, "postgres:\n        condition: service_healthy"));
	free(b);
	free(text);
}

Test(compose_ha, nodes_form_a_cluster_with_one_cookie)
{
	char *text = read_compose();
	char *b = malloc(MAX_BLOCK);
	char *cfg;

	cr_assert(b);
	for (size_t i = 0; i < 3; i++) {
		char line[128];

		cr_assert(service(text, nodes[i], b, MAX_BLOCK), "no service %s", nodes[i]);
		snprintf(line, sizeof(line), "hostname: %s\n", nodes[i]);
		cr_expect_not_null(strstr(b, line), "%s: the node name is rabbit@<hostname>",
		                   nodes[i]);
		/* Its own data directory, where the cookie is. */
		snprintf(line, sizeof(line), "- %s:/var/lib/rabbitmq\n", nodes[i]);
		cr_expect_not_null(strstr(b, line), "%s: no data volume of its own", nodes[i]);
		cr_expect_not_null(strstr(b, "<<: *rabbitmq-node"), "%s: not a cluster node",
		                   nodes[i]);
		cr_expect_not_null(strstr(b, "rabbitmq-cookie:\n        condition: "
		                             "service_completed_successfully"),
		                   "%s starts before the cookie is written", nodes[i]);
		if (i > 0)
			cr_expect_not_null(
			        strstr(b, "rabbitmq1:\n        condition: service_healthy"),
			        "%s must join a running first node", nodes[i]);
		/* A bind mount: docker-compose 1.29 ignores configs outside a swarm. */
		cr_expect_not_null(strstr(b, "- ./rabbitmq-cluster.conf:/etc/rabbitmq/conf.d/"),
		                   "%s: the cluster config is not mounted in conf.d", nodes[i]);
	}
	/* What every node has, from the anchor they merge: the image, the cluster config, a
	 * health check. */
	{
		const char *anchor = strstr(text, "\nx-rabbitmq-node: &rabbitmq-node\n");
		const char *stop = anchor ? strstr(anchor + 1, "\nservices:\n") : NULL;

		cr_assert(anchor && stop, "no x-rabbitmq-node anchor before the services");
		snprintf(b, MAX_BLOCK, "%.*s", (int)(stop - anchor), anchor);
	}
	cr_expect_not_null(strstr(b, "image: rabbitmq:3.10"), "the nodes run RabbitMQ 3.10");
	cr_expect_not_null(strstr(b, "healthcheck:"), "the nodes have a health check");
	cr_expect_not_null(strstr(b, "rabbitmq-diagnostics"));
	/* The Erlang cookie: written, the same, into each node's data volume, owner-only. */
	cr_assert(service(text, "rabbitmq-cookie", b, MAX_BLOCK));
	cr_expect_not_null(strstr(b, ".erlang.cookie"));
	cr_expect_not_null(strstr(b, "chmod 400"), "Erlang refuses a cookie others can read");
	for (size_t i = 0; i < 3; i++) {
		char line[64];

		snprintf(line, sizeof(line), "- %s:/node%zu\n", nodes[i], i + 1);
		cr_expect_not_null(strstr(b, line), "the cookie is not written for %s", nodes[i]);
	}
	cr_expect_null(strstr(text, "RABBITMQ_ERLANG_COOKIE"),
	               "the image's entrypoint refuses RABBITMQ_ERLANG_COOKIE since 3.9");
	/* Peer discovery from the node list, in the file the nodes mount. */
	cfg = read_docker_file("rabbitmq-cluster.conf");
	cr_expect_not_null(strstr(cfg, "cluster_formation.peer_discovery_backend = "
	                               "classic_config"));
	for (size_t i = 0; i < 3; i++) {
		char line[128];

		snprintf(line, sizeof(line),
		         "cluster_formation.classic_config.nodes.%zu = rabbit@%s", i + 1, nodes[i]);
		cr_expect_not_null(strstr(cfg, line), "the node list lacks '%s'", line);
	}
	free(cfg);
	free(b);
	free(text);
}

Test(compose_ha, a_quorum_queue_is_bound_to_the_demo_exchange)
{
	char *text = read_compose();
	char *b = malloc(MAX_BLOCK);

	cr_assert_not_null(b);
	cr_assert(service(text, "rabbitmq-init", b, MAX_BLOCK), "no rabbitmq-init service");
	cr_expect_not_null(strstr(b, "\"x-queue-type\": \"quorum\""),
	                   "the queue is a quorum queue");
	cr_expect_not_null(strstr(b, "declare queue name=demo-ha durable=true"));
	cr_expect_not_null(strstr(b, "declare binding source=amq.topic destination=demo-ha"),
	                   "the queue is bound to the exchange the producer writes to");
	cr_expect_not_null(strstr(b, "restart: \"no\""), "a one-shot service");
	/* A quorum queue has members on the nodes that are in the cluster when it is declared. */
	cr_expect_not_null(strstr(b, "list nodes"), "it waits for the three nodes first");
	for (size_t i = 0; i < 3; i++) {
		char dep[128];

		snprintf(dep, sizeof(dep), "%s:\n        condition: service_healthy", nodes[i]);
		cr_expect_not_null(strstr(b, dep), "rabbitmq-init does not wait for %s", nodes[i]);
	}
	/* The producer writes to the exchange the queue is bound to. */
	cr_assert(service(text, "producer", b, MAX_BLOCK), "no producer service");
	cr_expect_not_null(strstr(b, "'amq.topic', 'demo.hello'"));
	free(b);
	free(text);
}
