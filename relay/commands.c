/* The one-shot operator commands: schema, migrate, status, dead, requeue, discard, keys, purge,
 * leave-cursor, config, healthcheck (enqueue and replay have files of their own). Each opens what it needs, does one
 * thing, and says what it did on stdout (errors on stderr, one line). */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "relay/command.h"
#include "relay/http.h"
#include "relay/relay.h"
#include "store/liboutbox/outbox.h"
#include "store/store.h"
#include "store/operator/admin.h"
#include "store/operator/leave_cursor.h"
#include "store/operator/partitions.h"
#include "store/operator/schema.h"

struct store *command_admin_open(const struct config *cfg, struct store_options *o)
{
	struct store *s;

	relay_store_options(cfg, NULL, true, "outbox-relay admin", o);
	s = store_new(o);
	if (!s) {
		fputs("outbox-relay: out of memory\n", stderr);
		return NULL;
	}
	if (store_connect(s) < 0) {
		fprintf(stderr, "outbox-relay: could not connect to the database: %s\n",
		        store_errmsg(s));
		store_free(s);
		return NULL;
	}
	return s;
}

int command_store_failed(struct store *s, const char *doing)
{
	fprintf(stderr, "outbox-relay: could not %s: %s\n", doing, store_errmsg(s));
	store_free(s);
	return 1;
}

bool command_has_flag(int argc, char **argv, const char *flag)
{
	for (int i = 0; i < argc; i++)
		if (strcmp(argv[i], flag) == 0)
			return true;
	return false;
}

size_t command_collect_ids(int argc, char **argv, const char **ids)
{
	size_t n = 0;

	for (int i = 0; i < argc; i++) {
		if (strcmp(argv[i], "--id") != 0)
			continue;
		while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0)
			ids[n++] = argv[++i];
	}
	return n;
}

int command_unknown_args(int argc, char **argv, const char *const *known, const char *cmd)
{
	for (int i = 0; i < argc; i++) {
		bool ok = false;

		if (strncmp(argv[i], "--", 2) != 0)
			continue; /* a value */
		for (size_t k = 0; known[k]; k++)
			if (strcmp(argv[i], known[k]) == 0)
				ok = true;
		if (!ok) {
			fprintf(stderr,
			        "outbox-relay: %s: unknown option '%s' (see outbox-relay help)\n",
			        cmd, argv[i]);
			return 2;
		}
	}
	return 0;
}

int command_schema(const struct config *cfg, int argc, char **argv)
{
	char *sql;

	(void)argv;
	if (argc > 0) {
		fputs("outbox-relay: schema takes no arguments\n", stderr);
		return 2;
	}
	sql = store_schema_sql(cfg->database_table, cfg->database_channel);
	if (!sql) {
		fputs("outbox-relay: out of memory\n", stderr);
		return 1;
	}
	fputs(sql, stdout);
	free(sql);
	return 0;
}

/* `migrate [--partitioned [--partition-rows N]]`: 0, or -1 after one line on stderr. */
static int parse_migrate(int argc, char **argv, bool *partitioned, int64_t *rows)
{
	for (int i = 0; i < argc; i++) {
		char *end = NULL;

		if (strcmp(argv[i], "--partitioned") == 0) {
			*partitioned = true;
			continue;
		}
		if (strcmp(argv[i], "--partition-rows") != 0) {
			fprintf(stderr, "outbox-relay: migrate: unknown argument '%s'\n", argv[i]);
			return -1;
		}
		errno = 0;
		*rows = i + 1 < argc ? strtoll(argv[++i], &end, 10) : 0;
		if (!end || errno || *end || *rows < STORE_PARTITION_ROWS_MIN ||
		    *rows > STORE_PARTITION_ROWS_MAX) {
			fprintf(stderr,
			        "outbox-relay: migrate: --partition-rows needs a number from %d to "
			        "%lld\n",
			        STORE_PARTITION_ROWS_MIN, STORE_PARTITION_ROWS_MAX);
			return -1;
		}
	}
	if (*rows && !*partitioned) {
		fputs("outbox-relay: migrate: --partition-rows goes with --partitioned\n", stderr);
		return -1;
	}
	return 0;
}

static int migrate_one(const struct config *cfg, bool partitioned, int64_t rows)
{
	struct store_options o;
	struct store *s;

	s = command_admin_open(cfg, &o);
	if (!s)
		return 1;
	if ((partitioned ? store_migrate_partitioned(s, rows) : store_migrate(s)) < 0)
		return command_store_failed(s, "migrate");
	printf("table %s is up to date\n", cfg->database_table);
	if (store_notice(s)[0])
		printf("%s\n", store_notice(s));
	store_free(s);
	return 0;
}

/* With named sources, each in turn (a heading line each), stopping at the first that fails:
 * the line says which, and that those after it were not tried. */
int command_migrate(const struct config *cfg, int argc, char **argv)
{
	bool partitioned = false;
	int64_t rows = 0;

	if (parse_migrate(argc, argv, &partitioned, &rows) < 0)
		return 2;
	if (cfg->n_named == 0)
		return migrate_one(cfg, partitioned, rows);
	for (size_t i = 0; i < cfg->n_named; i++) {
		printf("%ssource %s\n", i > 0 ? "\n" : "", cfg->named[i]->source_name);
		fflush(stdout);
		if (migrate_one(cfg->named[i], partitioned, rows) != 0) {
			fprintf(stderr, "outbox-relay: migrate: stopped at source '%s'%s\n",
			        cfg->named[i]->source_name,
			        i + 1 < cfg->n_named ? ", the sources after it were not tried"
			                             : "");
			return 1;
		}
	}
	return 0;
}

static void print_json(json_t *j)
{
	if (j) {
		json_dumpf(j, stdout, JSON_INDENT(2));
		fputc('\n', stdout);
	}
}

/* One table's status: printed as text, or (out not NULL) into *out as a new JSON object. 0,
 * or 1 when it could not be read (said on stderr). */
static int status_one(const struct config *cfg, json_t **out)
{
	struct store_options o;
	struct store_status st;
	struct store *s;
	int rc;

	s = command_admin_open(cfg, &o);
	if (!s)
		return 1;
	if (store_status(s, &st) < 0)
		return command_store_failed(s, "read the status");
	/* The relay refuses such a table: say why here too (the counts still follow). */
	if ((rc = store_check_sequence(s)) == 1)
		fprintf(stderr, "outbox-relay: status: warning: %s\n", store_errmsg(s));
	else if (rc < 0)
		return command_store_failed(s, "read the seq sequence");
	if (out) {
		*out = json_pack("{s:s,s:I,s:I,s:I,s:I,s:f,s:I,s:s?,s:f}", "table",
		                 cfg->database_table, "pending", (json_int_t)st.pending, "leased",
		                 (json_int_t)st.leased, "dead", (json_int_t)st.dead, "published",
		                 (json_int_t)st.published, "oldest_pending_age_seconds",
		                 st.oldest_pending_age_s, "blocked_keys",
		                 (json_int_t)st.blocked_keys, "oldest_blocked_key",
		                 st.oldest_blocked_key[0] ? st.oldest_blocked_key : NULL,
		                 "oldest_blocked_age_seconds", st.oldest_blocked_age_s);
		if (*out && st.partitions.partitioned)
			json_object_set_new(
			        *out, "partitions",
			        json_pack("{s:I,s:I,s:I}", "partitions",
			                  (json_int_t)st.partitions.partitions, "default_rows",
			                  (json_int_t)st.partitions.default_rows, "held_by_dead",
			                  (json_int_t)st.partitions.dead_partitions));
	} else {
		printf("table                %s\n", cfg->database_table);
		printf("pending              %" PRId64 "\n", st.pending);
		printf("leased               %" PRId64 "\n", st.leased);
		printf("dead                 %" PRId64 "\n", st.dead);
		printf("published (retained) %" PRId64 "\n", st.published);
		printf("oldest pending age   %.1fs\n", st.oldest_pending_age_s);
		printf("blocked keys         %" PRId64 "%s%s%s\n", st.blocked_keys,
		       st.oldest_blocked_key[0] ? " (oldest: '" : "", st.oldest_blocked_key,
		       st.oldest_blocked_key[0] ? "')" : "");
		if (st.partitions.partitioned) {
			printf("partitions           %" PRId64 " (%" PRId64 " held by dead rows)\n",
			       st.partitions.partitions, st.partitions.dead_partitions);
			printf("default partition    %" PRId64 " rows\n",
			       st.partitions.default_rows);
		}
	}
	store_free(s);
	return 0;
}

/* With named sources, every source in turn: text under a "source NAME" heading each, JSON as
 * one object keyed by source name (a source that could not be read holds an "error"). Exit 1
 * when any could not be read. */
int command_status(const struct config *cfg, int argc, char **argv)
{
	static const char *const known[] = { "--json", NULL };
	bool json;
	json_t *j = NULL, *all;
	int rc;

	if ((rc = command_unknown_args(argc, argv, known, "status")))
		return rc;
	json = command_has_flag(argc, argv, "--json");
	if (cfg->n_named == 0) {
		rc = status_one(cfg, json ? &j : NULL);
		print_json(j);
		json_decref(j);
		return rc;
	}
	all = json ? json_object() : NULL;
	for (size_t i = 0; i < cfg->n_named; i++) {
		const char *name = cfg->named[i]->source_name;

		j = NULL;
		if (!json) {
			printf("%ssource %s\n", i > 0 ? "\n" : "", name);
			fflush(stdout);
		}
		if (status_one(cfg->named[i], json ? &j : NULL) != 0) {
			fprintf(stderr, "outbox-relay: status: could not read source '%s'\n", name);
			rc = 1;
			if (json)
				j = json_pack("{s:s}", "error", "could not read the status");
		}
		if (all && j)
			json_object_set_new(all, name, j);
	}
	print_json(all);
	json_decref(all);
	return rc;
}

static void print_list(const struct store_list *l, bool json, bool keyed)
{
	if (json) {
		json_t *arr = json_array();

		for (size_t i = 0; arr && i < l->n; i++) {
			const struct store_listed *it = &l->items[i];

			json_array_append_new(
			        arr,
			        json_pack("{s:s,s:s,s:s,s:s?,s:i,s:s?,s:s?,s:s?}", "id", it->id,
			                  "exchange", it->exchange, "routing_key", it->routing_key,
			                  "ordering_key", it->ordering_key, "attempts",
			                  it->attempts, "last_error", it->last_error, "created_at",
			                  it->created_at, "available_at", it->available_at));
		}
		if (arr) {
			json_dumpf(arr, stdout, JSON_INDENT(2));
			fputc('\n', stdout);
			json_decref(arr);
		}
		return;
	}
	if (l->n == 0) {
		puts(keyed ? "no blocked ordering keys" : "no dead rows");
		return;
	}
	for (size_t i = 0; i < l->n; i++) {
		const struct store_listed *it = &l->items[i];

		if (keyed)
			printf("key '%s'  head %s  attempts %d  exchange '%s' routing key '%s'  "
			       "available %s\n  last error: %s\n",
			       it->ordering_key ? it->ordering_key : "", it->id, it->attempts,
			       it->exchange, it->routing_key,
			       it->available_at ? it->available_at : "",
			       it->last_error ? it->last_error : "(none)");
		else
			printf("%s  attempts %d  exchange '%s' routing key '%s'%s%s%s  created %s\n"
			       "  last error: %s\n",
			       it->id, it->attempts, it->exchange, it->routing_key,
			       it->ordering_key ? "  key '" : "",
			       it->ordering_key ? it->ordering_key : "",
			       it->ordering_key ? "'" : "", it->created_at ? it->created_at : "",
			       it->last_error ? it->last_error : "(none)");
	}
}

static int parse_limit(int argc, char **argv, size_t *limit)
{
	for (int i = 0; i < argc; i++) {
		if (strcmp(argv[i], "--limit") == 0) {
			char *end;
			long long v;

			if (i + 1 >= argc)
				return -1;
			errno = 0;
			v = strtoll(argv[i + 1], &end, 10);
			if (errno || *end || v < 0)
				return -1;
			*limit = (size_t)v;
		}
	}
	return 0;
}

/* Opens an admin connection, lists up to limit rows with list and prints them (`dead` and
 * `keys --blocked`); 0, or 1 with one line on stderr. */
static int list_rows(const struct config *cfg,
                     int (*list)(struct store *, size_t, struct store_list *), size_t limit,
                     const char *doing, bool json, bool keys)
{
	struct store_options o;
	struct store_list l = { 0 };
	struct store *s = command_admin_open(cfg, &o);

	if (!s)
		return 1;
	if (list(s, limit, &l) < 0)
		return command_store_failed(s, doing);
	print_list(&l, json, keys);
	store_list_free(&l);
	store_free(s);
	return 0;
}

int command_dead(const struct config *cfg, int argc, char **argv)
{
	static const char *const known[] = { "--json", "--limit", NULL };
	size_t limit = 1000;
	int rc;

	if ((rc = command_unknown_args(argc, argv, known, "dead")))
		return rc;
	if (parse_limit(argc, argv, &limit) < 0) {
		fputs("outbox-relay: dead: --limit wants a whole number\n", stderr);
		return 2;
	}
	return list_rows(cfg, store_dead, limit, "list dead rows",
	                 command_has_flag(argc, argv, "--json"), false);
}

int command_keys(const struct config *cfg, int argc, char **argv)
{
	static const char *const known[] = { "--blocked", "--json", "--limit", NULL };
	size_t limit = 1000;
	int rc;

	if ((rc = command_unknown_args(argc, argv, known, "keys")))
		return rc;
	if (!command_has_flag(argc, argv, "--blocked") || parse_limit(argc, argv, &limit) < 0) {
		fputs("outbox-relay: usage: keys --blocked [--json] [--limit N]\n", stderr);
		return 2;
	}
	return list_rows(cfg, store_blocked_keys, limit, "list blocked keys",
	                 command_has_flag(argc, argv, "--json"), true);
}

/* The refusal of rows under a live lease, as one line on stderr: which rows, who holds them
 * until when, and how to wait or force. */
static void say_leased(const char *name, bool requeue, const struct store_ids_outcome *o)
{
	fprintf(stderr, "outbox-relay: %s: nothing was changed: %" PRId64 " row%s %s %s:", name,
	        o->leased, o->leased == 1 ? "" : "s", o->leased == 1 ? "is" : "are",
	        o->ahead ? "in a relay's hands" : "under a relay's lease");
	for (size_t i = 0; i < o->n_listed; i++) {
		if (o->listed[i].ahead)
			fprintf(stderr, "%s '%s' (above the cursor source's position %" PRId64 ")",
			        i ? "," : "", o->listed[i].id, o->position);
		else
			fprintf(stderr, "%s '%s' (leased by '%s' until %s)", i ? "," : "",
			        o->listed[i].id, o->listed[i].locked_by, o->listed[i].locked_until);
	}
	if ((int64_t)o->n_listed < o->leased)
		fprintf(stderr, " and %" PRId64 " more", o->leased - (int64_t)o->n_listed);
	fprintf(stderr, "; run the command again once %s, or add --force to %s\n",
	        o->ahead ? "the relay has passed the row (it publishes it or sets it aside)"
	                 : "the lease has ended (the relay publishes the row or lets it go)",
	        requeue ? "reset it now and let that relay finish with it first"
	                : "delete it now (the relay may still publish it once: it has it in hand)");
}

static int ids_command(const struct config *cfg, int argc, char **argv, bool requeue)
{
	static const char *const known_rq[] = { "--id", "--all-dead", "--force", NULL };
	static const char *const known_ds[] = { "--id", "--force", NULL };
	const char *name = requeue ? "requeue" : "discard";
	struct store_ids_outcome *out = NULL;
	struct store_options o;
	struct store *s;
	const char **ids;
	size_t n;
	bool all_dead = requeue && command_has_flag(argc, argv, "--all-dead");
	bool force = command_has_flag(argc, argv, "--force");
	int64_t changed = 0;
	int rc;

	if ((rc = command_unknown_args(argc, argv, requeue ? known_rq : known_ds, name)))
		return rc;
	ids = calloc((size_t)argc + 1, sizeof(*ids));
	out = calloc(1, sizeof(*out));
	if (!ids || !out) {
		free(ids);
		free(out);
		return 1;
	}
	n = command_collect_ids(argc, argv, ids);
	if ((n == 0) == !all_dead || (force && all_dead)) {
		fprintf(stderr, "outbox-relay: usage: %s\n",
		        requeue ? "requeue --id ID... [--force] | --all-dead"
		                : "discard --id ID... [--force]");
		free(ids);
		free(out);
		return 2;
	}
	s = command_admin_open(cfg, &o);
	if (!s) {
		free(ids);
		free(out);
		return 1;
	}
	if (all_dead)
		rc = store_requeue(s, NULL, 0, true, &changed);
	else if (requeue)
		rc = store_requeue_ids(s, ids, n, force, out);
	else
		rc = store_discard_ids(s, ids, n, force, out);
	free(ids);
	if (rc < 0) {
		free(out);
		return command_store_failed(s, name);
	}
	if (!all_dead && out->leased > 0 && !force) {
		say_leased(name, requeue, out);
		free(out);
		store_free(s);
		return 1;
	}
	if (!all_dead)
		changed = out->changed;
	printf("%s %" PRId64 " row%s", requeue ? "requeued" : "discarded", changed,
	       changed == 1 ? "" : "s");
	if (!all_dead && out->leased > 0)
		printf(" (%" PRId64 " under a relay's lease: %s)", out->leased,
		       requeue ? "that relay finishes with it first"
		               : "that relay may still publish it once");
	putchar('\n');
	free(out);
	store_free(s);
	return 0;
}

int command_requeue(const struct config *cfg, int argc, char **argv)
{
	return ids_command(cfg, argc, argv, true);
}

int command_discard(const struct config *cfg, int argc, char **argv)
{
	return ids_command(cfg, argc, argv, false);
}

int command_purge(const struct config *cfg, int argc, char **argv)
{
	struct store_options o;
	struct store *s;
	int64_t older = -1, deleted = 0;

	for (int i = 0; i < argc; i++) {
		if (strcmp(argv[i], "--older-than") == 0 && i + 1 < argc) {
			if (config_parse_duration(argv[++i], &older) < 0)
				older = -2;
		} else {
			older = -2;
		}
	}
	if (older < 0) {
		fputs("outbox-relay: usage: purge --older-than DURATION (e.g. 7d, 12h)\n", stderr);
		return 2;
	}
	s = command_admin_open(cfg, &o);
	if (!s)
		return 1;
	if (store_purge(s, older, 5000, NULL, &deleted) < 0)
		return command_store_failed(s, "purge");
	printf("purged %" PRId64 " published row%s\n", deleted, deleted == 1 ? "" : "s");
	store_free(s);
	return 0;
}

/* Hands the table back from the cursor source to the lease source (docs/operations.md, "On a
 * table run by the cursor source"). A relay that leads the table is refused like a row under a
 * lease (exit 1, nothing changed): the relays must be stopped first. */
int command_leave_cursor(const struct config *cfg, int argc, char **argv)
{
	static const char *const known[] = { "--dry-run", NULL };
	struct store_leave_outcome lo;
	struct store_options o;
	struct store *s;
	bool dry = command_has_flag(argc, argv, "--dry-run");
	int rc;

	if ((rc = command_unknown_args(argc, argv, known, "leave-cursor")))
		return rc;
	for (int i = 0; i < argc; i++) {
		if (strncmp(argv[i], "--", 2) != 0) {
			fputs("outbox-relay: usage: leave-cursor [--dry-run]\n", stderr);
			return 2;
		}
	}
	s = command_admin_open(cfg, &o);
	if (!s)
		return 1;
	if (store_leave_cursor(s, STORE_LEAVE_BATCH, dry, &lo) < 0)
		return command_store_failed(s, "hand the table to the lease source");
	store_free(s);
	switch (lo.state) {
	case STORE_LEAVE_NOT_CURSOR:
		printf("table %s is not run by the cursor source (no position row): nothing to "
		       "do\n",
		       cfg->database_table);
		return 0;
	case STORE_LEAVE_LED:
		fprintf(stderr,
		        "outbox-relay: leave-cursor: a relay with relay.source = cursor leads "
		        "table "
		        "%s: stop every relay of the table first, then run leave-cursor again; "
		        "nothing was changed\n",
		        cfg->database_table);
		return 1;
	case STORE_LEAVE_DONE:
		break;
	}
	if (dry)
		printf("table %s: %" PRId64 " row%s behind position %" PRId64
		       " would be marked published, %" PRId64
		       " deferred row%s left to the lease source; nothing was changed "
		       "(--dry-run)\n",
		       cfg->database_table, lo.marked, lo.marked == 1 ? "" : "s", lo.position,
		       lo.deferred, lo.deferred == 1 ? "" : "s");
	else
		printf("table %s handed to the lease source: %" PRId64
		       " row%s behind position %" PRId64
		       " marked published (published_at %s), %" PRId64
		       " deferred row%s left to the lease source; now set relay.source = lease and "
		       "start the relays\n",
		       cfg->database_table, lo.marked, lo.marked == 1 ? "" : "s", lo.position,
		       lo.moved_at[0] ? lo.moved_at : "now", lo.deferred,
		       lo.deferred == 1 ? "" : "s");
	return 0;
}

/* One snapshot's keys for `config show`: value and where it came from. A named source leaves
 * out the process-wide keys, which only the top level has. */
static void show_keys(const struct config *cfg, bool named)
{
	for (size_t i = 0; i < config_key_count(); i++) {
		char val[1024];

		if (named && config_key_process_wide(i))
			continue;
		config_value_text(cfg, i, val, sizeof(val));
		printf("%-28s %-40s %s\n", config_key_name(i), val,
		       cfg->sources ? cfg->sources[i] : "");
	}
}

int command_config(const struct config *cfg, int argc, char **argv)
{
	if (argc == 1 && strcmp(argv[0], "check") == 0) {
		if (cfg->n_named > 0)
			printf("configuration ok: %zu source%s\n", cfg->n_named,
			       cfg->n_named == 1 ? "" : "s");
		else
			puts("configuration ok");
		return 0;
	}
	if (argc == 1 && strcmp(argv[0], "show") == 0) {
		show_keys(cfg, false);
		for (size_t s = 0; s < cfg->n_named; s++) {
			printf("\n[sources.%s]\n", cfg->named[s]->source_name);
			show_keys(cfg->named[s], true);
		}
		return 0;
	}
	fputs("outbox-relay: usage: config check|show\n", stderr);
	return 2;
}

int command_healthcheck(const struct config *cfg, int argc, char **argv)
{
	char listen[300], err[256];
	int status;

	(void)argv;
	if (argc > 0) {
		fputs("outbox-relay: healthcheck takes no arguments\n", stderr);
		return 2;
	}
	if (!cfg->http_listen[0]) {
		fputs("outbox-relay: healthcheck: http.listen is empty, nothing to ask\n", stderr);
		return 1;
	}
	/* A wildcard listen address is reached on loopback. */
	if (strncmp(cfg->http_listen, "0.0.0.0:", 8) == 0)
		snprintf(listen, sizeof(listen), "127.0.0.1:%s", cfg->http_listen + 8);
	else if (cfg->http_listen[0] == ':')
		snprintf(listen, sizeof(listen), "127.0.0.1%s", cfg->http_listen);
	else if (strncmp(cfg->http_listen, "[::]:", 5) == 0)
		snprintf(listen, sizeof(listen), "[::1]:%s", cfg->http_listen + 5);
	else
		snprintf(listen, sizeof(listen), "%s", cfg->http_listen);
	status = http_get_status(listen, "/readyz", 3000, err, sizeof(err));
	if (status == 200) {
		puts("ready");
		return 0;
	}
	if (status < 0)
		fprintf(stderr, "outbox-relay: healthcheck: %s\n", err);
	else
		fprintf(stderr, "outbox-relay: healthcheck: /readyz answered %d\n", status);
	return 1;
}
