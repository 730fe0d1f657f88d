/* outbox-relay's entry point: parse the command line, build the configuration snapshot, and
 * hand over to the command. Exit codes: 0 ok, 1 runtime failure, 2 usage or configuration. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/broker.h"
#include "config/config.h"
#include "relay/log.h"
#include "relay/relay.h"

extern char **environ;

static const char usage[] =
        "usage: outbox-relay [--config FILE] [--set key=value ...] [--source NAME] [COMMAND]\n"
        "                    [ARGS]\n"
        "\n"
        "commands:\n"
        "  run                      relay the outbox to the broker (default)\n"
        "  schema                   print the table's DDL (apply with psql)\n"
        "  migrate                  create or upgrade the table in place\n"
        "                           [--partitioned] [--partition-rows N]: the table\n"
        "                           range-partitioned by seq, N seqs a partition\n"
        "  enqueue                  insert one message: --exchange X --routing-key K\n"
        "                           (--body TEXT | --body-file F) [--header k=v ...]\n"
        "                           [--property k=v ...] [--content-type T] [--delay D]\n"
        "                           [--ordering-key K] [--id ID]\n"
        "                           [--traceparent TP [--tracestate TS]]\n"
        "  status [--json]          pending, leased, dead, published rows, oldest pending age\n"
        "  dead [--json] [--limit N]  list dead rows with their last error\n"
        "  requeue --id ID... [--force] | --all-dead   make dead or failed rows pending again\n"
        "  discard --id ID... [--force]   delete unpublished rows\n"
        "                           (rows a relay holds under a lease are refused; --force:\n"
        "                           discard deletes them, requeue resets them and leaves the\n"
        "                           lease to the relay)\n"
        "  keys --blocked [--json]  ordering keys held up by a failed or dead head row\n"
        "  purge --older-than D     delete published rows older than D\n"
        "  leave-cursor [--dry-run] hand a table the cursor source ran back to the lease\n"
        "                           source: mark the rows it published, delete its\n"
        "                           position (relays of the table stopped; as the owner)\n"
        "  replay FILTER... [--dry-run] [--yes]\n"
        "                           publish retained published rows again; FILTER:\n"
        "                           --since T, --until T (a time, or a duration ago with\n"
        "                           its unit: 30m, 2h, 7d),\n"
        "                           --by published|created (which time; published),\n"
        "                           --exchange X, --routing-key PATTERN ('*' any run of\n"
        "                           characters, '?' one), --ordering-key K, --id ID...;\n"
        "                           over 10000 rows needs --yes\n"
        "  config check|show        validate, or print the effective configuration\n"
        "  config example           print every key at its default as a commented config file\n"
        "  healthcheck              exit 0 when /readyz answers 200 (Docker HEALTHCHECK)\n"
        "  version                  print the version\n"
        "  help                     this text\n"
        "\n"
        "Configuration: built-in defaults < JSON file (--config or OUTBOX_CONFIG) <\n"
        "OUTBOX_* environment variables < --set flags. `outbox-relay config show` lists\n"
        "every key with its value and where it came from.\n"
        "\n"
        "Named sources (\"sources\" in the file, OUTBOX_SOURCES): run relays from all of\n"
        "them, status and migrate go through each in turn; --source NAME runs any command\n"
        "with that source's configuration, and the other commands need it.\n";

typedef int (*command_fn)(const struct config *, int, char **);

#define EXAMPLE_WIDTH 96

/* One "// ..." comment, word-wrapped to EXAMPLE_WIDTH columns at the given indent. */
static void example_comment(int indent, const char *text)
{
	int room = EXAMPLE_WIDTH - indent - 3;

	while (*text) {
		int len = (int)strlen(text), cut = len;

		if (len > room) {
			cut = room;
			while (cut > 0 && text[cut] != ' ')
				cut--;
			if (cut == 0)
				cut = room;
		}
		printf("%*s// %.*s\n", indent, "", cut, text);
		text += cut;
		while (*text == ' ')
			text++;
	}
}

/* Whether a key after i that has a default to write lies under prefix ("amqp.", "" = any):
 * then what ends before it is followed by a comma. */
static bool example_more(size_t i, const char *prefix)
{
	char v[512];

	for (size_t j = i + 1; j < config_key_count(); j++)
		if (strncmp(config_key_name(j), prefix, strlen(prefix)) == 0 &&
		    config_key_default_json(j, v, sizeof(v)) == 0)
			return true;
	return false;
}

/* Indent of what lies inside the open sections ("amqp.tls." is two deep). */
static int example_indent(const char *open)
{
	int depth = 1;

	for (const char *p = open; *p; p++)
		depth += *p == '.';
	return 2 * depth;
}

/* Closes the innermost open section; i is the last key written. */
static void example_close(char *open, size_t i)
{
	char *dot;

	open[strlen(open) - 1] = '\0';
	dot = strrchr(open, '.');
	*(dot ? dot + 1 : open) = '\0';
	printf("%*s}%s\n", example_indent(open), "", example_more(i, open) ? "," : "");
}

/* `config example`: every key of the table at its default, nested by section, each with its
 * help and variable, as the JSON-with-comments file that --config reads. It comes from the
 * key table alone (no file, environment or flag), so the packaged relay.json cannot drift. */
static int config_example(void)
{
	char open[128] = "", v[512], text[768];
	size_t n = config_key_count();

	fputs("// outbox-relay configuration: JSON, with // and /* */ comments. Every key below "
	      "is\n"
	      "// at its built-in default (`outbox-relay config example` prints this file).\n"
	      "// Precedence: built-in defaults < this file < OUTBOX_* environment variables < "
	      "--set\n"
	      "// flags. Durations: 500ms, 30s, 5m, 2h, 7d or plain seconds. Keep passwords out "
	      "of\n"
	      "// this file: give them as OUTBOX_<KEY>_FILE, a file holding the value.\n"
	      "{\n",
	      stdout);
	for (size_t i = 0; i < n; i++) {
		const char *name = config_key_name(i), *env = config_key_env(i);
		const char *leaf = strrchr(name, '.');
		size_t sec = leaf ? (size_t)(leaf - name) + 1 : 0;

		/* Close the sections this key is not in, then open the ones it is in. */
		while (strlen(open) > sec || strncmp(open, name, strlen(open)) != 0)
			example_close(open, i - 1);
		while (strlen(open) < sec) {
			const char *start = name + strlen(open);
			int len = (int)(strchr(start, '.') - start);

			printf("%*s\"%.*s\": {\n", example_indent(open), "", len, start);
			snprintf(open + strlen(open), sizeof(open) - strlen(open), "%.*s.", len,
			         start);
		}
		if (config_key_sensitive(i))
			snprintf(text, sizeof(text),
			         "%s. Environment: %s, or %s_FILE naming a file "
			         "that holds it.",
			         config_key_help(i), env, env);
		else
			snprintf(text, sizeof(text), "%s. Environment: %s.", config_key_help(i),
			         env);
		example_comment(example_indent(open), text);
		leaf = leaf ? leaf + 1 : name;
		if (config_key_default_json(i, v, sizeof(v)) == 0)
			printf("%*s\"%s\": %s%s\n", example_indent(open), "", leaf, v,
			       example_more(i, open) ? "," : "");
		else
			printf("%*s// \"%s\": not set here, computed at start\n",
			       example_indent(open), "", leaf);
	}
	while (open[0])
		example_close(open, n - 1);
	fputs("}\n", stdout);
	return fflush(stdout) == 0 ? 0 : 1;
}

static const struct {
	const char *name;
	command_fn fn;
} commands[] = {
	{ "run", command_run },
	{ "schema", command_schema },
	{ "migrate", command_migrate },
	{ "enqueue", command_enqueue },
	{ "status", command_status },
	{ "dead", command_dead },
	{ "requeue", command_requeue },
	{ "discard", command_discard },
	{ "keys", command_keys },
	{ "purge", command_purge },
	{ "leave-cursor", command_leave_cursor },
	{ "replay", command_replay },
	{ "config", command_config },
	{ "healthcheck", command_healthcheck },
};

/* The words of the command line sorted into what configures the relay and what is the
 * command's. */
struct command_line {
	const char **sets; /* --set values, room for argc */
	size_t nsets;
	const char *file;   /* --config, or NULL */
	const char *source; /* --source, or NULL */
	const char *cmd;    /* NULL when none was given */
	char **rest;        /* the command's words, room for argc */
	int nrest;
};

/* --config, --set and --source may stand anywhere; the first other word is the command and
 * the remaining words belong to it. 0, or 2 (usage) with the reason on stderr. */
static int parse_command_line(int argc, char **argv, struct command_line *cl)
{
	const char *file = NULL, *cmd = NULL;
	size_t nsets = 0;
	int nrest = 0;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];

		if (strcmp(a, "--config") == 0 || strcmp(a, "--set") == 0 ||
		    strcmp(a, "--source") == 0) {
			if (i + 1 >= argc) {
				fprintf(stderr, "outbox-relay: %s needs a value\n%s", a, usage);
				return 2;
			}
			if (a[2] == 'c')
				file = argv[++i];
			else if (a[3] == 'o')
				cl->source = argv[++i];
			else
				cl->sets[nsets++] = argv[++i];
		} else if (strncmp(a, "--config=", 9) == 0) {
			file = a + 9;
		} else if (strncmp(a, "--source=", 9) == 0) {
			cl->source = a + 9;
		} else if (strncmp(a, "--set=", 6) == 0) {
			cl->sets[nsets++] = a + 6;
		} else if (!cmd && (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)) {
			cmd = "help";
		} else if (!cmd && strcmp(a, "--version") == 0) {
			cmd = "version";
		} else if (!cmd && a[0] != '-') {
			cmd = a;
		} else {
			cl->rest[nrest++] = argv[i];
		}
	}
	cl->file = file;
	cl->cmd = cmd;
	cl->nsets = nsets;
	cl->nrest = nrest;
	return 0;
}

/* The configuration snapshot from every source, or NULL with each error on stderr: a relay
 * must not start on a configuration it half understood. */
static struct config *load_config(const struct command_line *cl)
{
	struct config_sources src;
	struct config_errors errs = { 0 };
	struct config *cfg;

	src.file = cl->file;
	src.sets = cl->sets;
	src.nsets = cl->nsets;
	src.environ = (const char *const *)environ;
	/* A URL the AMQP client cannot read would fail every connect: refuse it at start. */
	src.check_amqp_url = broker_check_url;
	cfg = config_load(&src, &errs);
	if (!cfg) {
		for (size_t i = 0; i < errs.n; i++)
			fprintf(stderr, "outbox-relay: configuration: %s\n", errs.lines[i]);
		fprintf(stderr, "outbox-relay: %zu configuration error%s, not starting\n", errs.n,
		        errs.n == 1 ? "" : "s");
		config_errors_clear(&errs);
	}
	return cfg;
}

/* The named sources' names, "orders, billing", into buf ("none" when there are none). */
static void source_names(const struct config *cfg, char *buf, size_t n)
{
	size_t len = 0;

	snprintf(buf, n, "none");
	for (size_t i = 0; i < cfg->n_named && len < n; i++)
		len += (size_t)snprintf(buf + len, n - len, "%s%s", i > 0 ? ", " : "",
		                        cfg->named[i]->source_name);
}

/* Which snapshot cmd runs with: --source's, or the whole configuration (run, config,
 * healthcheck, status and migrate handle several sources; the other commands need one named,
 * so that no one edits the wrong table). NULL with the reason on stderr (exit 2). */
static const struct config *command_config_for(const struct config *cfg, const char *source,
                                               const char *cmd)
{
	static const char *const many[] = { "run", "config", "healthcheck", "status", "migrate" };
	char names[CONFIG_SOURCES_MAX * (CONFIG_SOURCE_NAME_MAX + 2) + 8];

	source_names(cfg, names, sizeof(names));
	if (source) {
		for (size_t i = 0; i < cfg->n_named; i++)
			if (strcmp(cfg->named[i]->source_name, source) == 0)
				return cfg->named[i];
		fprintf(stderr, "outbox-relay: --source: no source named '%s' (configured: %s)\n",
		        source, names);
		return NULL;
	}
	for (size_t i = 0; i < sizeof(many) / sizeof(many[0]); i++)
		if (strcmp(many[i], cmd) == 0)
			return cfg;
	/* When sources are named the top level is no source: the one named is meant. */
	if (cfg->n_named <= 1)
		return cfg->n_named == 1 ? cfg->named[0] : cfg;
	fprintf(stderr,
	        "outbox-relay: several sources are configured (%s): name one with --source\n",
	        names);
	return NULL;
}

int main(int argc, char **argv)
{
	struct command_line cl = { 0 };
	const char *cmd;
	command_fn fn = NULL;
	struct config *cfg = NULL;
	const struct config *run_cfg;
	int rc = 2;

	cl.sets = calloc((size_t)argc + 1, sizeof(*cl.sets));
	cl.rest = calloc((size_t)argc + 1, sizeof(*cl.rest));
	if (!cl.sets || !cl.rest) {
		fputs("outbox-relay: out of memory\n", stderr);
		rc = 1;
		goto out;
	}
	if (parse_command_line(argc, argv, &cl) != 0)
		goto out;
	cmd = cl.cmd ? cl.cmd : "run";
	if (strcmp(cmd, "help") == 0) {
		fputs(usage, stdout);
		rc = 0;
		goto out;
	}
	if (strcmp(cmd, "version") == 0) {
		printf("outbox-relay %s\n", OUTBOX_VERSION);
		rc = 0;
		goto out;
	}
	if (strcmp(cmd, "config") == 0 && cl.nrest == 1 && strcmp(cl.rest[0], "example") == 0) {
		rc = config_example();
		goto out;
	}
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (strcmp(commands[i].name, cmd) == 0)
			fn = commands[i].fn;
	if (!fn) {
		fprintf(stderr, "outbox-relay: unknown command '%s'\n%s", cmd, usage);
		goto out;
	}

	cfg = load_config(&cl);
	if (!cfg)
		goto out;
	/* One log setup for the process (the top level's log.*), whichever source runs. */
	log_setup((enum log_level)cfg->log_level,
	          cfg->log_format == CONFIG_LOG_JSON ? LOG_FORMAT_JSON : LOG_FORMAT_TEXT);
	run_cfg = command_config_for(cfg, cl.source, cmd);
	if (run_cfg)
		rc = fn(run_cfg, cl.nrest, cl.rest);
out:
	config_free(cfg);
	free(cl.sets);
	free(cl.rest);
	return rc;
}
