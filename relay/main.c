/* outbox-relay's entry point: parse the command line, build the configuration snapshot, and
 * hand over to the command. Exit codes: 0 ok, 1 runtime failure, 2 usage or configuration. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "relay/log.h"
#include "relay/relay.h"

extern char **environ;

static const char usage[] =
        "usage: outbox-relay [--config FILE] [--set key=value ...] [COMMAND] [ARGS]\n"
        "\n"
        "commands:\n"
        "  run                      relay the outbox to the broker (default)\n"
        "  schema                   print the table's DDL (apply with psql)\n"
        "  migrate                  create or upgrade the table in place\n"
        "  enqueue                  insert one message: --exchange X --routing-key K\n"
        "                           (--body TEXT | --body-file F) [--header k=v ...]\n"
        "                           [--property k=v ...] [--content-type T] [--delay D]\n"
        "                           [--ordering-key K] [--id ID]\n"
        "                           [--traceparent TP [--tracestate TS]]\n"
        "  status [--json]          pending, leased, dead, published rows, oldest pending age\n"
        "  dead [--json] [--limit N]  list dead rows with their last error\n"
        "  requeue --id ID... | --all-dead   make dead or failed rows pending again\n"
        "  discard --id ID...       delete unpublished rows\n"
        "  keys --blocked [--json]  ordering keys held up by a failed or dead head row\n"
        "  purge --older-than D     delete published rows older than D\n"
        "  replay FILTER... [--dry-run] [--yes]\n"
        "                           publish retained published rows again; FILTER:\n"
        "                           --since T, --until T (a time, or a duration ago),\n"
        "                           --by published|created (which time; published),\n"
        "                           --exchange X, --routing-key PATTERN ('*' any run of\n"
        "                           characters, '?' one), --ordering-key K, --id ID...;\n"
        "                           over 10000 rows needs --yes\n"
        "  config check|show        validate, or print the effective configuration\n"
        "  healthcheck              exit 0 when /readyz answers 200 (Docker HEALTHCHECK)\n"
        "  version                  print the version\n"
        "  help                     this text\n"
        "\n"
        "Configuration: built-in defaults < JSON file (--config or OUTBOX_CONFIG) <\n"
        "OUTBOX_* environment variables < --set flags. `outbox-relay config show` lists\n"
        "every key with its value and where it came from.\n";

typedef int (*command_fn)(const struct config *, int, char **);

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
	{ "replay", command_replay },
	{ "config", command_config },
	{ "healthcheck", command_healthcheck },
};

int main(int argc, char **argv)
{
	const char **sets = NULL;
	size_t nsets = 0;
	const char *file = NULL;
	const char *cmd = NULL;
	char **rest = NULL;
	int nrest = 0;
	command_fn fn = NULL;
	struct config_sources src;
	struct config_errors errs = { 0 };
	struct config *cfg = NULL;
	int rc = 2;

	sets = calloc((size_t)argc + 1, sizeof(*sets));
	rest = calloc((size_t)argc + 1, sizeof(*rest));
	if (!sets || !rest) {
		fputs("outbox-relay: out of memory\n", stderr);
		rc = 1;
		goto out;
	}
	/* --config and --set may stand anywhere; the first other word is the command and the
	 * remaining words belong to it. */
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];

		if (strcmp(a, "--config") == 0 || strcmp(a, "--set") == 0) {
			if (i + 1 >= argc) {
				fprintf(stderr, "outbox-relay: %s needs a value\n%s", a, usage);
				goto out;
			}
			if (a[2] == 'c')
				file = argv[++i];
			else
				sets[nsets++] = argv[++i];
		} else if (strncmp(a, "--config=", 9) == 0) {
			file = a + 9;
		} else if (strncmp(a, "--set=", 6) == 0) {
			sets[nsets++] = a + 6;
		} else if (!cmd && (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)) {
			cmd = "help";
		} else if (!cmd && strcmp(a, "--version") == 0) {
			cmd = "version";
		} else if (!cmd && a[0] != '-') {
			cmd = a;
		} else {
			rest[nrest++] = argv[i];
		}
	}
	if (!cmd)
		cmd = "run";
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
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (strcmp(commands[i].name, cmd) == 0)
			fn = commands[i].fn;
	if (!fn) {
		fprintf(stderr, "outbox-relay: unknown command '%s'\n%s", cmd, usage);
		goto out;
	}

	src.file = file;
	src.sets = sets;
	src.nsets = nsets;
	src.environ = (const char *const *)environ;
	cfg = config_load(&src, &errs);
	if (!cfg) {
		for (size_t i = 0; i < errs.n; i++)
			fprintf(stderr, "outbox-relay: configuration: %s\n", errs.lines[i]);
		fprintf(stderr, "outbox-relay: %zu configuration error%s, not starting\n", errs.n,
		        errs.n == 1 ? "" : "s");
		config_errors_clear(&errs);
		goto out;
	}
	log_setup((enum log_level)cfg->log_level,
	          cfg->log_format == CONFIG_LOG_JSON ? LOG_FORMAT_JSON : LOG_FORMAT_TEXT);
	rc = fn(cfg, nrest, rest);
out:
	config_free(cfg);
	free(sets);
	free(rest);
	return rc;
}
