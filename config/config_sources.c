/* Reads each source of the configuration into the key slots: the built-in defaults, the JSON
 * file, OUTBOX_* environment variables (and their _FILE forms) and --set flags. Names and
 * values a source gives are echoed only when they have the shape of a name. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_slots.h"

#define SECRET_FILE_MAX    (64 * 1024)
#define ENV_PREFIX         "OUTBOX_"
#define ENV_SOURCES_PREFIX "OUTBOX_SOURCES_"

/* A name (of a key, variable or section) as it goes into an error line: as given when it has
 * the shape of a name, else not at all. Names come from the file, the environment and --set,
 * where a misplaced value ({"postgresql://u:secret@h/db": 1}) would otherwise be echoed. */
bool config_safe_name(const char *name, size_t len, char *buf, size_t n)
{
	bool plain = len > 0 && len <= 100;

	for (size_t i = 0; i < len && plain; i++) {
		char c = name[i];

		plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		        (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
	}
	if (plain)
		snprintf(buf, n, "%.*s", (int)len, name);
	else
		snprintf(buf, n, "(a name not shown: it holds characters no key has)");
	return plain;
}

int config_slots_defaults(struct config_slot *slots, struct config_errors *errs)
{
	for (size_t i = 0; i < config_key_count(); i++) {
		const struct config_key *k = config_key_at(i);
		struct config_given g = { k->def, CONFIG_JSON_STRING, 0, false, "default" };
		char *computed = NULL;
		int rc;

		if (k->default_fn) {
			computed = k->default_fn();
			if (!computed) {
				config_errors_add(errs, "%s: out of memory", k->name);
				return -1;
			}
			g.text = computed;
		}
		rc = config_slot_assign(&slots[i], k, &g, errs);
		free(computed);
		if (rc < 0)
			return -1;
	}
	return 0;
}

const char *config_json_kind_text(enum config_json_kind kind)
{
	switch (kind) {
	case CONFIG_JSON_STRING:
		return "a string";
	case CONFIG_JSON_INT:
	case CONFIG_JSON_REAL:
		return "a number";
	case CONFIG_JSON_BOOL:
		return "a boolean";
	case CONFIG_JSON_NULL:
		return "null";
	case CONFIG_JSON_ARRAY:
		return "an array";
	case CONFIG_JSON_OBJECT:
	default:
		return "an object";
	}
}

void config_slot_from_file(const char *path, const struct config_file *f, size_t i, const char *key,
                           struct config_slot *slots, struct config_errors *errs)
{
	const struct config_file_entry *e = &f->v[i];
	int idx = config_key_index(key);
	char source[512];
	struct config_given g;

	snprintf(source, sizeof(source), "file %s:%d", path, e->line);
	if (idx < 0 && config_key_is_section(key)) {
		/* Not the value: {"database": "postgresql://u:secret@h/db"} is a URL put where
		 * the section goes. */
		config_errors_add(errs, "%s: got %s (%s); allowed: an object holding %s.* keys",
		                  key, config_json_kind_text(e->kind), source, key);
		return;
	}
	if (idx < 0) {
		char name[128];

		config_safe_name(key, strlen(key), name, sizeof(name));
		config_errors_add(errs,
		                  "%s: unknown key (%s); allowed: a key listed by "
		                  "`outbox-relay config show`",
		                  name, source);
		return;
	}
	for (size_t j = 0; j < i; j++) {
		/* {"relay.x": 1, "relay": {"x": 2}} names one key twice; which one wins would be
		 * an accident of iteration order. */
		if (strcmp(f->v[j].key, e->key) == 0) {
			config_errors_add(
			        errs,
			        "%s: given twice (%s and line %d); allowed: one value per "
			        "key",
			        key, source, f->v[j].line);
			slots[idx].failed = true;
			break;
		}
	}
	if (slots[idx].failed)
		return;
	g = (struct config_given){ e->text, e->kind, e->ms, e->ms_ok, source };
	(void)config_slot_assign(&slots[idx], config_key_at((size_t)idx), &g, errs);
}

void config_slots_file(const char *path, const struct config_file *f, struct config_slot *slots,
                       struct config_errors *errs)
{
	for (size_t i = 0; i < f->n; i++) {
		/* The "sources" object is the named sources' (config_named.c). */
		if (f->v[i].name_len > 0 || strcmp(f->v[i].key, "sources") == 0)
			continue;
		config_slot_from_file(path, f, i, f->v[i].key, slots, errs);
	}
}

/* Reads a Docker-style secret file. The contents never appear in an error. */
static char *read_secret(const char *path, int *err)
{
	size_t len;
	char *buf = config_read_file(path, SECRET_FILE_MAX, &len, err);

	if (buf && memchr(buf, '\0', len)) {
		*err = EINVAL;
		free(buf);
		return NULL;
	}
	/* Editors and `echo` end files with a newline that is not part of the password. */
	while (buf && len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r'))
		buf[--len] = '\0';
	return buf;
}

static bool env_name_is(const char *entry, size_t name_len, const char *name, const char *suffix)
{
	size_t len = strlen(name);

	if (name_len != len + strlen(suffix))
		return false;
	return strncmp(entry, name, len) == 0 && strncmp(entry + len, suffix, strlen(suffix)) == 0;
}

/* Where one OUTBOX_* variable goes: key *idx as a value or, with the _FILE suffix, as the
 * path of a file holding the value. False when it names no key. */
static bool env_key(const char *entry, size_t name_len, size_t *idx, bool *is_file)
{
	/* The exact name first: OUTBOX_AMQP_TLS_CA_FILE is a key, not a secret file. */
	for (size_t i = 0; i < config_key_count(); i++) {
		if (env_name_is(entry, name_len, config_key_env(i), "")) {
			*idx = i;
			*is_file = false;
			return true;
		}
	}
	for (size_t i = 0; i < config_key_count(); i++) {
		if (env_name_is(entry, name_len, config_key_env(i), "_FILE")) {
			*idx = i;
			*is_file = true;
			return true;
		}
	}
	return false;
}

static void report_unknown_env(const char *entry, size_t name_len, struct config_errors *errs)
{
	char name[128];

	if (env_name_is(entry, name_len, "OUTBOX_CONFIG", "_FILE")) {
		/* The file's path is not a secret; a _FILE form would only be a second way to
		 * say the same thing. */
		config_errors_add(errs, "OUTBOX_CONFIG_FILE: unknown configuration variable (env "
		                        "OUTBOX_CONFIG_FILE); allowed: OUTBOX_CONFIG=<path of the "
		                        "JSON config file>");
		return;
	}
	/* A typo such as OUTBOX_RELAY_BATCHSIZE must stop the start, not run silently with
	 * the default. */
	config_safe_name(entry, name_len, name, sizeof(name));
	config_errors_add(errs,
	                  "%s: unknown configuration variable (env %s); allowed: OUTBOX_<KEY> or "
	                  "OUTBOX_<KEY>_FILE for a key listed by `outbox-relay config show`, or "
	                  "OUTBOX_CONFIG",
	                  name, name);
}

/* Sorts the OUTBOX_* variables into plain[i] and file[i] per key (borrowed from env) and
 * reports the ones that name no key. */
static void env_collect(const char *const *env, const char **plain, const char **file,
                        struct config_errors *errs)
{
	for (size_t e = 0; env && env[e]; e++) {
		const char *entry = env[e];
		const char *eq = strchr(entry, '=');
		size_t name_len, idx;
		bool is_file;

		if (!eq || strncmp(entry, ENV_PREFIX, strlen(ENV_PREFIX)) != 0)
			continue;
		name_len = (size_t)(eq - entry);
		if (env_name_is(entry, name_len, "OUTBOX_CONFIG", ""))
			continue; /* the config file, read before */
		if (env_name_is(entry, name_len, "OUTBOX_SOURCES", "") ||
		    strncmp(entry, ENV_SOURCES_PREFIX, strlen(ENV_SOURCES_PREFIX)) == 0)
			continue; /* the named sources' (config_named.c) */
		if (!env_key(entry, name_len, &idx, &is_file))
			report_unknown_env(entry, name_len, errs);
		else if (is_file)
			file[idx] = eq + 1;
		else
			plain[idx] = eq + 1;
	}
}

/* Key i from <env>_FILE=path: the file's contents are the value. */
static void env_apply_file(size_t i, const char *env, const char *path, struct config_slot *slot,
                           struct config_errors *errs)
{
	const struct config_key *k = config_key_at(i);
	char source[512];
	struct config_given g = { NULL, CONFIG_JSON_STRING, 0, false, source };
	int err = 0;
	char *secret = read_secret(path, &err);

	snprintf(source, sizeof(source), "env %s_FILE (%s)", env, path);
	if (!secret) {
		const char *why = err == EINVAL ? "not a text file or too large" : strerror(err);

		config_errors_add(errs,
		                  "%s: could not read %s_FILE \"%s\": %s (env %s_FILE); allowed: a "
		                  "readable file holding the value",
		                  k->name, env, path, why, env);
		slot->failed = true;
		return;
	}
	g.text = secret;
	(void)config_slot_assign(slot, k, &g, errs);
	free(secret);
}

void config_slot_from_env(size_t i, const char *env, const char *plain, const char *file,
                          struct config_slot *slot, struct config_errors *errs)
{
	const struct config_key *k = config_key_at(i);
	char source[512];
	struct config_given g = { plain, CONFIG_JSON_STRING, 0, false, source };

	if (plain && file) {
		config_errors_add(
		        errs, "%s: both %s and %s_FILE are set (env); allowed: only one of them",
		        k->name, env, env);
		slot->failed = true;
	} else if (plain) {
		snprintf(source, sizeof(source), "env %s", env);
		(void)config_slot_assign(slot, k, &g, errs);
	} else if (file) {
		env_apply_file(i, env, file, slot, errs);
	}
}

void config_slots_env(const char *const *env, struct config_slot *slots, struct config_errors *errs)
{
	size_t nkeys = config_key_count();
	const char **plain = calloc(nkeys, sizeof(*plain));
	const char **file = calloc(nkeys, sizeof(*file));

	if (!plain || !file) {
		config_errors_add(errs, "environment: out of memory");
		goto out;
	}
	env_collect(env, plain, file, errs);
	for (size_t i = 0; i < nkeys; i++)
		config_slot_from_env(i, config_key_env(i), plain[i], file[i], &slots[i], errs);
out:
	free(plain);
	free(file);
}

void config_slots_sets(const struct config_sources *src, struct config_slot *slots,
                       struct config_errors *errs)
{
	for (size_t i = 0; i < src->nsets; i++) {
		const char *set = src->sets[i] ? src->sets[i] : "";
		const char *eq = strchr(set, '=');
		char key[128];
		struct config_given g = { NULL, CONFIG_JSON_STRING, 0, false, "flag --set" };
		int idx;

		if (strncmp(set, "sources.", 8) == 0 && eq)
			continue; /* a named source's (config_named.c) */
		if (!eq) {
			/* "--set amqp.url amqp://u:secret@h" lost its '=': show a key, not that. */
			if (config_safe_name(set, strlen(set), key, sizeof(key)))
				config_errors_add(
				        errs,
				        "--set \"%s\": missing '=' (flag --set); allowed: "
				        "key=value",
				        key);
			else
				config_errors_add(
				        errs,
				        "--set argument %zu: missing '=' (flag --set), not shown "
				        "since it is no key name; allowed: key=value",
				        i + 1);
			continue;
		}
		idx = config_safe_name(set, (size_t)(eq - set), key, sizeof(key))
		              ? config_key_index(key)
		              : -1;
		if (idx < 0) {
			config_errors_add(errs,
			                  "%s: unknown key (flag --set); allowed: a key "
			                  "listed by `outbox-relay config show`",
			                  key);
			continue;
		}
		g.text = eq + 1;
		(void)config_slot_assign(&slots[idx], config_key_at((size_t)idx), &g, errs);
	}
}
