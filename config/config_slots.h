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
	char *text;   /* owned; as given */
	char *source; /* owned */
	int64_t num;  /* int, duration (ms), enum index */
	bool flag;    /* bool */
	bool failed;  /* some source gave a bad value: skip cross-key rules on it */
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
void config_slots_file(const char *path, struct config_slot *slots, struct config_errors *errs);
void config_slots_env(const char *const *env, struct config_slot *slots,
                      struct config_errors *errs);
void config_slots_sets(const struct config_sources *src, struct config_slot *slots,
                       struct config_errors *errs);

#endif
