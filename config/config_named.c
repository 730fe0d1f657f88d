/* The named sources of one process (the file's "sources", OUTBOX_SOURCES and its
 * OUTBOX_SOURCES_<NAME>_<KEY> variables, --set sources.NAME.KEY): each source's own values over
 * the top level's effective ones, checked like the top level, its errors under its path. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_slots.h"

#define SOURCES_ENV        "OUTBOX_SOURCES"
#define SOURCES_ENV_PREFIX "OUTBOX_SOURCES_"
#define INHERITED_PREFIX   "top level: "
#define NAME_RULE          "[a-z][a-z0-9_]*, at most 32 bytes"

_Static_assert(CONFIG_SOURCE_NAME_MAX == 32, "NAME_RULE says 32");

struct named {
	char name[CONFIG_SOURCE_NAME_MAX + 1];
	struct config_slot *slots; /* config_key_count() entries; text NULL: not given here */
	struct config_errors errs; /* this source's, moved under "sources.NAME." when checked */
};

struct config_named {
	struct named v[CONFIG_SOURCES_MAX];
	size_t n;
	bool too_many; /* reported once */
};

struct config_named *config_named_new(void)
{
	return calloc(1, sizeof(struct config_named));
}

void config_named_free(struct config_named *nl)
{
	if (!nl)
		return;
	for (size_t s = 0; s < nl->n; s++) {
		for (size_t i = 0; nl->v[s].slots && i < config_key_count(); i++) {
			free(nl->v[s].slots[i].text);
			free(nl->v[s].slots[i].source);
		}
		free(nl->v[s].slots);
		config_errors_clear(&nl->v[s].errs);
	}
	free(nl);
}

static bool name_valid(const char *name, size_t len)
{
	if (len == 0 || len > CONFIG_SOURCE_NAME_MAX || !(name[0] >= 'a' && name[0] <= 'z'))
		return false;
	for (size_t i = 1; i < len; i++) {
		char c = name[i];

		if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'))
			return false;
	}
	return true;
}

static struct named *find(struct config_named *nl, const char *name, size_t len)
{
	for (size_t s = 0; s < nl->n; s++) {
		if (strlen(nl->v[s].name) == len && memcmp(nl->v[s].name, name, len) == 0)
			return &nl->v[s];
	}
	return NULL;
}

/* The source called name[0..len), named now if it was not yet; NULL (and an error) when the
 * name is bad or there are too many. where: where the name was given. */
static struct named *name_source(struct config_named *nl, const char *name, size_t len,
                                 const char *where, struct config_errors *errs)
{
	struct named *s = find(nl, name, len);
	char shown[128];

	if (s)
		return s;
	if (!name_valid(name, len)) {
		config_safe_name(name, len, shown, sizeof(shown));
		config_errors_add(errs, "sources.%s: not a source name (%s); allowed: %s", shown,
		                  where, NAME_RULE);
		return NULL;
	}
	if (nl->n == CONFIG_SOURCES_MAX) {
		if (!nl->too_many)
			config_errors_add(errs,
			                  "sources.%.*s: one source too many (%s); allowed: at "
			                  "most %d sources",
			                  (int)len, name, where, CONFIG_SOURCES_MAX);
		nl->too_many = true;
		return NULL;
	}
	s = &nl->v[nl->n];
	s->slots = calloc(config_key_count(), sizeof(*s->slots));
	if (!s->slots) {
		config_errors_add(errs, "sources: out of memory");
		return NULL;
	}
	memcpy(s->name, name, len);
	s->name[len] = '\0';
	nl->n++;
	return s;
}

/* Key idx may be given under a source unless one process has it once. */
static bool per_source(struct named *s, size_t idx, const char *where)
{
	if (!config_key_process_wide(idx))
		return true;
	config_errors_add(&s->errs, "%s: a process-wide key (%s); allowed: set it at the top level",
	                  config_key_name(idx), where);
	s->slots[idx].failed = true;
	return false;
}

/* The file's "sources": each member names a source (in file order), its entries are the
 * source's keys. A member with a bad name was reported once; its keys are skipped. */
static void read_file(struct config_named *nl, const char *path, const struct config_file *f,
                      struct config_errors *errs)
{
	for (size_t i = 0; f && i < f->n; i++) {
		const struct config_file_entry *e = &f->v[i];
		char where[512];
		struct named *s;
		int idx;

		snprintf(where, sizeof(where), "file %s:%d", path, e->line);
		if (e->name_len == 0 && strcmp(e->key, "sources") == 0) {
			config_errors_add(errs,
			                  "sources: got %s (%s); allowed: an object mapping each "
			                  "source's name to an object of its keys",
			                  config_json_kind_text(e->kind), where);
			continue;
		}
		if (e->name_len == 0 || e->rel > strlen(e->key))
			continue;
		if (e->rel == strlen(e->key)) {
			s = name_source(nl, e->key + 8, e->name_len, where, errs);
			if (s && e->kind != CONFIG_JSON_OBJECT)
				config_errors_add(errs,
				                  "sources.%s: got %s (%s); allowed: an object of "
				                  "the source's sections and keys",
				                  s->name, config_json_kind_text(e->kind), where);
			continue;
		}
		s = find(nl, e->key + 8, e->name_len);
		if (!s)
			continue;
		idx = config_key_index(e->key + e->rel);
		if (idx >= 0 && !per_source(s, (size_t)idx, where))
			continue;
		config_slot_from_file(path, f, i, e->key + e->rel, s->slots, &s->errs);
	}
}

/* OUTBOX_SOURCES=orders,billing: blanks around each name are not part of it. */
static void read_env_names(struct config_named *nl, const char *const *env,
                           struct config_errors *errs)
{
	const char *list = NULL;
	size_t count = 1, pos = 1;

	for (size_t e = 0; env && env[e]; e++) {
		if (strncmp(env[e], SOURCES_ENV "=", strlen(SOURCES_ENV) + 1) == 0)
			list = env[e] + strlen(SOURCES_ENV) + 1;
	}
	if (!list || list[strspn(list, " \t")] == '\0')
		return;
	for (const char *p = list; *p; p++)
		count += *p == ',';
	for (const char *p = list;; pos++) {
		size_t len = strcspn(p, ",");
		const char *name = p;
		size_t nlen = len;

		while (nlen > 0 && (*name == ' ' || *name == '\t')) {
			name++;
			nlen--;
		}
		while (nlen > 0 && (name[nlen - 1] == ' ' || name[nlen - 1] == '\t'))
			nlen--;
		if (nlen == 0)
			config_errors_add(errs,
			                  "sources: name %zu of %zu is empty (env " SOURCES_ENV
			                  "); allowed: source names separated by commas",
			                  pos, count);
		else
			(void)name_source(nl, name, nlen, "env " SOURCES_ENV, errs);
		if (p[len] == '\0')
			break;
		p += len + 1;
	}
}

/* Does the variable's rest (after OUTBOX_SOURCES_<NAME>_) name key i, as itself or with
 * _FILE? The exact name is tried first by the caller, as for OUTBOX_AMQP_TLS_CA_FILE. */
static bool key_is(const char *rest, size_t len, size_t i, bool file)
{
	const char *k = config_key_env(i) + strlen("OUTBOX_");
	size_t klen = strlen(k);

	if (len != klen + (file ? 5 : 0) || memcmp(rest, k, klen) != 0)
		return false;
	return !file || memcmp(rest + klen, "_FILE", 5) == 0;
}

/* Which source and key a variable OUTBOX_SOURCES_... names, its name being entry[0..len):
 * the longest source name that fits first, since names may hold '_' (a and a_b). */
static struct named *env_match(struct config_named *nl, const char *entry, size_t len, size_t *idx,
                               bool *file)
{
	const char *rest = entry + strlen(SOURCES_ENV_PREFIX);
	size_t rlen = len - strlen(SOURCES_ENV_PREFIX);

	for (size_t want = CONFIG_SOURCE_NAME_MAX; want > 0; want--) {
		for (size_t s = 0; s < nl->n; s++) {
			const char *name = nl->v[s].name;
			size_t j = 0;

			if (strlen(name) != want || rlen <= want + 1 || rest[want] != '_')
				continue;
			while (j < want && rest[j] == (char)(name[j] - (name[j] >= 'a' ? 32 : 0)))
				j++;
			if (j < want)
				continue;
			for (int pass = 0; pass < 2; pass++) {
				for (size_t i = 0; i < config_key_count(); i++) {
					if (key_is(rest + want + 1, rlen - want - 1, i, pass)) {
						*idx = i;
						*file = pass;
						return &nl->v[s];
					}
				}
			}
		}
	}
	return NULL;
}

static void report_unknown_env(const struct config_named *nl, const char *entry, size_t len,
                               struct config_errors *errs)
{
	char name[128], known[CONFIG_SOURCES_MAX * (CONFIG_SOURCE_NAME_MAX + 2) + 8] = "";
	size_t used = 0;

	for (size_t s = 0; s < nl->n; s++) {
		snprintf(known + used, sizeof(known) - used, "%s%s", s ? ", " : "", nl->v[s].name);
		used = strlen(known);
	}
	config_safe_name(entry, len, name, sizeof(name));
	config_errors_add(errs,
	                  "%s: unknown configuration variable (env %s); allowed: "
	                  "OUTBOX_SOURCES_<NAME>_<KEY> or its _FILE form, <NAME> a source that "
	                  "OUTBOX_SOURCES (or the file's \"sources\", or --set sources.NAME.KEY) "
	                  "names, upper-cased, and <KEY> a key's variable without OUTBOX_; "
	                  "sources known: %s",
	                  name, name, nl->n ? known : "none");
}

/* Key i of source s from its variables: <env>=value or <env>_FILE=path. */
static void env_apply(struct named *s, size_t i, const char *plain, const char *file)
{
	char env[128], where[160];
	size_t len = (size_t)snprintf(env, sizeof(env), SOURCES_ENV_PREFIX "%s_", s->name);

	for (size_t j = strlen(SOURCES_ENV_PREFIX); j < len; j++)
		env[j] = (char)(env[j] >= 'a' && env[j] <= 'z' ? env[j] - 32 : env[j]);
	snprintf(env + len, sizeof(env) - len, "%s", config_key_env(i) + strlen("OUTBOX_"));
	snprintf(where, sizeof(where), "env %s%s", env, plain ? "" : "_FILE");
	if (per_source(s, i, where))
		config_slot_from_env(i, env, plain, file, &s->slots[i], &s->errs);
}

/* Every OUTBOX_SOURCES_* variable to its source's key; one that fits none is an error, as an
 * unknown OUTBOX_* variable is. */
static void read_env_values(struct config_named *nl, const char *const *env,
                            struct config_errors *errs)
{
	size_t nkeys = config_key_count();
	const char **plain = calloc(CONFIG_SOURCES_MAX * nkeys, sizeof(*plain));
	const char **file = calloc(CONFIG_SOURCES_MAX * nkeys, sizeof(*file));

	if (!plain || !file) {
		config_errors_add(errs, "sources: out of memory");
		goto out;
	}
	for (size_t e = 0; env && env[e]; e++) {
		const char *eq = strchr(env[e], '=');
		struct named *s;
		size_t idx;
		bool is_file;

		if (!eq || strncmp(env[e], SOURCES_ENV_PREFIX, strlen(SOURCES_ENV_PREFIX)) != 0)
			continue;
		s = env_match(nl, env[e], (size_t)(eq - env[e]), &idx, &is_file);
		if (!s)
			report_unknown_env(nl, env[e], (size_t)(eq - env[e]), errs);
		else if (is_file)
			file[(size_t)(s - nl->v) * nkeys + idx] = eq + 1;
		else
			plain[(size_t)(s - nl->v) * nkeys + idx] = eq + 1;
	}
	for (size_t s = 0; s < nl->n; s++) {
		for (size_t i = 0; i < nkeys; i++) {
			const char *p = plain[s * nkeys + i], *f = file[s * nkeys + i];

			if (p || f)
				env_apply(&nl->v[s], i, p, f);
		}
	}
out:
	free(plain);
	free(file);
}

/* --set sources.NAME.section.key=value. With name_only, only names the sources (they are
 * named after the file's and OUTBOX_SOURCES's); else sets the values. */
static void read_sets(struct config_named *nl, const struct config_sources *src, bool name_only,
                      struct config_errors *errs)
{
	for (size_t i = 0; i < src->nsets; i++) {
		const char *set = src->sets[i] ? src->sets[i] : "";
		const char *eq = strchr(set, '=');
		const char *name = set + 8, *dot;
		struct config_given g = { eq ? eq + 1 : NULL, CONFIG_JSON_STRING, 0, false,
			                  "flag --set" };
		char key[128];
		struct named *s;
		int idx = -1;

		if (!eq || strncmp(set, "sources.", 8) != 0)
			continue;
		dot = memchr(name, '.', (size_t)(eq - name));
		if (!dot) {
			if (name_only) {
				config_safe_name(set, (size_t)(eq - set), key, sizeof(key));
				config_errors_add(errs,
				                  "%s: no key (flag --set); allowed: "
				                  "sources.NAME.section.key=value",
				                  key);
			}
			continue;
		}
		if (name_only) {
			(void)name_source(nl, name, (size_t)(dot - name), "flag --set", errs);
			continue;
		}
		s = find(nl, name, (size_t)(dot - name));
		if (!s)
			continue;
		if (config_safe_name(dot + 1, (size_t)(eq - dot - 1), key, sizeof(key)))
			idx = config_key_index(key);
		if (idx < 0)
			config_errors_add(&s->errs,
			                  "%s: unknown key (flag --set); allowed: a key listed by "
			                  "`outbox-relay config show`",
			                  key);
		else if (per_source(s, (size_t)idx, "flag --set"))
			(void)config_slot_assign(&s->slots[idx], config_key_at((size_t)idx), &g,
			                         &s->errs);
	}
}

void config_named_read(struct config_named *nl, const char *path, const struct config_file *f,
                       const struct config_sources *src, struct config_errors *errs)
{
	read_file(nl, path, f, errs);
	read_env_names(nl, src->environ, errs);
	read_sets(nl, src, true, errs);
	read_env_values(nl, src->environ, errs);
	read_sets(nl, src, false, errs);
}

/* A key the source did not give takes the top level's effective value, and says so. */
static int inherit(struct config_slot *own, const struct config_slot *top)
{
	size_t len = strlen(INHERITED_PREFIX) + strlen(top->source) + 1;

	own->text = strdup(top->text ? top->text : "");
	own->source = malloc(len);
	if (!own->text || !own->source)
		return -1;
	snprintf(own->source, len, INHERITED_PREFIX "%s", top->source);
	own->num = top->num;
	own->flag = top->flag;
	own->failed = top->failed;
	own->inherited = true;
	return 0;
}

/* Two sources on one table of one database would relay each row twice. The texts are
 * compared as given: two spellings of one database are not caught. */
static void check_tables(struct config_named *nl, struct config_errors *errs)
{
	size_t url = config_key_by_field(offsetof(struct config, database_url));
	size_t table = config_key_by_field(offsetof(struct config, database_table));

	for (size_t b = 0; b < nl->n; b++) {
		const struct config_slot *bs = nl->v[b].slots;

		if (bs[url].failed || bs[table].failed)
			continue;
		for (size_t a = 0; a < b; a++) {
			const struct config_slot *as = nl->v[a].slots;

			if (as[url].failed || as[table].failed ||
			    strcmp(as[url].text, bs[url].text) != 0 ||
			    strcmp(as[table].text, bs[table].text) != 0)
				continue;
			config_errors_add(errs,
			                  "sources.%s: same database.url (%s) and database.table "
			                  "(%s) as sources.%s; allowed: one source per table of a "
			                  "database",
			                  nl->v[b].name, bs[url].source, bs[table].source,
			                  nl->v[a].name);
			break;
		}
	}
}

void config_named_check(struct config_named *nl, const struct config_slot *top,
                        const struct config_sources *src, struct config_errors *errs)
{
	for (size_t s = 0; s < nl->n; s++) {
		struct named *n = &nl->v[s];

		for (size_t i = 0; i < config_key_count(); i++) {
			if (n->slots[i].text || n->slots[i].failed)
				continue;
			if (inherit(&n->slots[i], &top[i]) < 0) {
				config_errors_add(errs, "sources.%s: out of memory", n->name);
				n->slots[i].failed = true;
			}
		}
		config_slots_check(src, n->slots, &n->errs);
		for (size_t e = 0; e < n->errs.n; e++)
			config_errors_add(errs, "sources.%s.%s", n->name, n->errs.lines[e]);
		config_errors_clear(&n->errs);
	}
	check_tables(nl, errs);
}

int config_named_build(struct config_named *nl, struct config *c)
{
	struct config **named;

	if (nl->n == 0)
		return 0;
	named = calloc(nl->n, sizeof(*named));
	if (!named)
		return -1;
	for (size_t s = 0; s < nl->n; s++) {
		named[s] = config_slots_build(nl->v[s].slots, nl->v[s].name);
		if (!named[s]) {
			while (s > 0)
				config_free(named[--s]);
			free(named);
			return -1;
		}
	}
	c->named = named;
	c->n_named = nl->n;
	return 0;
}
