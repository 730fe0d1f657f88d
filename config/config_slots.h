/* The slots config_load() fills, one per key, and the readers of each source that fill them:
 * private to config/ (config.c validates and builds the snapshot, config_sources.c reads the
 * defaults, the file, the environment and --set). */
#ifndef OUTBOX_CONFIG_SLOTS_H
#define OUTBOX_CONFIG_SLOTS_H

#include <stdbool.h>
#include <stdint.h>

#include "config/config.h"
#include "config/config_keys.h"

/* One key's value while loading: the text it was given and where from. */
struct config_slot {
	char *text;     /* owned; as given */
	char *source;   /* owned */
	int64_t num;    /* int, duration (ms), enum index */
	bool flag;      /* bool */
	bool failed;    /* some source gave a bad value: skip cross-key rules on it */
	bool inherited; /* a named source's copy of the top level's: checked there already */
};

/* What one source offered for one key. */
struct config_given {
	const char *text;
	enum config_json_kind kind;
	int64_t ms;
	bool ms_ok;
	const char *source;
};

/* Parses g for key k into s. On a bad value reports it in errs, marks s failed and leaves
 * its value as it was: -1. 0 when s took the value. */
int config_slot_assign(struct config_slot *s, const struct config_key *k,
                       const struct config_given *g, struct config_errors *errs);

/* Each source in turn, in the order of precedence; every problem goes into errs. slots has
 * config_key_count() entries. config_slots_defaults() fails (-1) only when out of memory. */
int config_slots_defaults(struct config_slot *slots, struct config_errors *errs);
void config_slots_file(const char *path, const struct config_file *f, struct config_slot *slots,
                       struct config_errors *errs);
void config_slots_env(const char *const *env, struct config_slot *slots,
                      struct config_errors *errs);
void config_slots_sets(const struct config_sources *src, struct config_slot *slots,
                       struct config_errors *errs);

/* One entry of the file, f->v[i], into slots as key (the entry's key, or a named source's key
 * within the source): unknown keys, a section given a value and a key given twice are
 * errors. */
void config_slot_from_file(const char *path, const struct config_file *f, size_t i, const char *key,
                           struct config_slot *slots, struct config_errors *errs);
/* Key i from the variables env=plain or env_FILE=file (either may be NULL; both is an error),
 * env being the variable's name without _FILE, e.g. "OUTBOX_SOURCES_ORDERS_DATABASE_URL". */
void config_slot_from_env(size_t i, const char *env, const char *plain, const char *file,
                          struct config_slot *slot, struct config_errors *errs);
/* Copies name[0..len) into buf when it has the shape of a name (letters, digits, '_', '.',
 * '-'; at most 100 bytes) and returns true; else writes a placeholder and returns false. */
bool config_safe_name(const char *name, size_t len, char *buf, size_t n);
/* "a string", "a number", "an object", ...: what a file gave, for error lines (static). */
const char *config_json_kind_text(enum config_json_kind kind);

/* The cross-key rules, then amqp.url through src->check_amqp_url. A rule whose keys are all
 * inherited, and an inherited amqp.url, are left out: the top level was checked. */
void config_slots_check(const struct config_sources *src, const struct config_slot *slots,
                        struct config_errors *errs);
/* A new snapshot taking the slots' values and sources (the slots keep their numbers), named
 * name ("" for the top level); NULL when out of memory. */
struct config *config_slots_build(struct config_slot *slots, const char *name);

/* The named sources while loading (config_named.c). */
struct config_named;
struct config_named *config_named_new(void);     /* NULL when out of memory */
void config_named_free(struct config_named *nl); /* accepts NULL */
/* Names the sources (the file's "sources", OUTBOX_SOURCES, --set sources.NAME.KEY) and reads
 * each one's own values from the file (f may be NULL), the environment and --set. */
void config_named_read(struct config_named *nl, const char *path, const struct config_file *f,
                       const struct config_sources *src, struct config_errors *errs);
/* Fills each source's remaining keys from top (the top level's effective slots) and checks
 * each source as the top level is checked, then that no two share a table. */
void config_named_check(struct config_named *nl, const struct config_slot *top,
                        const struct config_sources *src, struct config_errors *errs);
/* Builds each source's snapshot into c->named. -1 when out of memory (c unchanged). */
int config_named_build(struct config_named *nl, struct config *c)
        __attribute__((warn_unused_result));

#endif
