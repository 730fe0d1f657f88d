/* Private to config/: the key table's row layout and the helpers that config.c,
 * config_parse.c and config_keys.c share. Nothing outside config/ includes this. */
#ifndef OUTBOX_CONFIG_CONFIG_KEYS_H
#define OUTBOX_CONFIG_CONFIG_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"

enum config_type {
	CONFIG_STRING,   /* char * */
	CONFIG_INT,      /* int64_t */
	CONFIG_BOOL,     /* bool */
	CONFIG_DURATION, /* int64_t milliseconds */
	CONFIG_ENUM,     /* an int-sized enum; the value is the index of the choice */
	CONFIG_SIZE,     /* int64_t bytes */
};

/* Checks beyond the type that a string key needs. */
enum config_check {
	CONFIG_CHECK_NONE,
	CONFIG_CHECK_TABLE,     /* identifier, optionally schema-qualified */
	CONFIG_CHECK_CHANNEL,   /* plain identifier */
	CONFIG_CHECK_AMQP_URLS, /* amqp:// or amqps:// URLs separated by commas */
	CONFIG_CHECK_LISTEN,    /* "" or host:port */
	CONFIG_CHECK_RELAY_ID,  /* 1..64 bytes: it is written to locked_by VARCHAR(64) */
};

/* One row of the key table. Rows are written with designated initialisers: whatever a row
 * does not name is zero (no bounds, not sensitive, no check). */
struct config_key {
	const char *name;
	const char *env; /* OUTBOX_ + name upper-cased, '.' -> '_' */
	enum config_type type;
	const char *def;            /* default as text; NULL when default_fn computes it */
	char *(*default_fn)(void);  /* a new string (NULL when out of memory), e.g. hostname:pid */
	int64_t min, max;           /* int: value bounds; duration: milliseconds */
	bool zero_ok;               /* duration: 0 is allowed besides min..max */
	bool sensitive;             /* value never printed but through redact_conninfo() */
	bool process_wide;          /* one per process (logs, HTTP): refused under a source */
	const char *const *choices; /* enum: NULL-terminated names, index = enum value */
	enum config_check check;
	size_t field; /* offsetof in struct config; its C type follows from type */
	const char *help;
};

/* Row i of the table (borrowed, static). i must be < config_key_count(). */
const struct config_key *config_key_at(size_t i);
/* Index of the key stored at offset field of struct config (offsetof), or config_key_count()
 * when no row stores it: cross-key rules name keys by their field, never by their name. */
size_t config_key_by_field(size_t field);
/* True when path names a section that holds keys ("relay", "amqp.tls"). */
bool config_key_is_section(const char *path);

/* A value given in the JSON file, flattened to its dotted key. */
enum config_json_kind {
	CONFIG_JSON_STRING,
	CONFIG_JSON_INT,
	CONFIG_JSON_REAL,
	CONFIG_JSON_BOOL,
	CONFIG_JSON_NULL,
	CONFIG_JSON_ARRAY,
	CONFIG_JSON_OBJECT
};

struct config_file_entry {
	char *key;  /* owned; dotted path, e.g. "relay.batch_size" */
	char *text; /* owned; the value as text ("500", "0.5", "true", "[...]") */
	enum config_json_kind kind;
	int64_t ms; /* kind INT or REAL: the number read as seconds, in ms (for durations) */
	bool ms_ok; /* ms holds a usable, non-negative value */
	int line;
	/* Under the top-level "sources" object: the source's name is key[8 .. 8 + name_len) and
	 * the key within the source starts at key + rel (at the NUL when the member is not an
	 * object). name_len is 0 for every other entry, and for "sources" itself. */
	size_t name_len;
	size_t rel;
};

struct config_file {
	struct config_file_entry *v; /* owned; n entries */
	size_t n;
};

/* Reads and parses path. On success fills out (free with config_file_clear) and returns 0.
 * On failure returns -1 and appends one line describing why (unreadable file, JSON syntax
 * error with file:line:column, top level not an object) to errs; out is untouched. */
int config_file_read(const char *path, struct config_file *out, struct config_errors *errs)
        __attribute__((warn_unused_result));
void config_file_clear(struct config_file *f);

/* Replaces // and block comments outside JSON strings with spaces, keeping newlines so that
 * line and column numbers stay true. Works in place. */
void config_strip_comments(char *text);

/* Value parsers: return 0 and write *out, or -1 (out untouched). */
int config_parse_int(const char *s, int64_t *out) __attribute__((warn_unused_result));
int config_parse_bool(const char *s, bool *out) __attribute__((warn_unused_result));
int config_parse_enum(const char *s, const char *const *choices, int64_t *out)
        __attribute__((warn_unused_result));

/* relay.id's default: "hostname:pid", cut to fit locked_by. New string, NULL on no memory. */
char *config_default_relay_id(void);

/* Appends one formatted line to errs. Returns 0, or -1 when out of memory or when the list is
 * full (then the line is dropped: a start-up that already failed needs no more). */
int config_errors_add(struct config_errors *errs, const char *fmt, ...)
        __attribute__((format(printf, 2, 3)));

#endif
