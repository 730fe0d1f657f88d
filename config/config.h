/* The relay's configuration: one immutable snapshot built at start from built-in defaults,
 * a JSON file, OUTBOX_* environment variables and --set flags, in rising precedence. */
#ifndef OUTBOX_CONFIG_CONFIG_H
#define OUTBOX_CONFIG_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum config_ordering { CONFIG_ORDERING_STRICT, CONFIG_ORDERING_SKIP_DEAD };
/* Where the relay's rows come from (relay.source): a lease written into every row, or a
 * position kept once per table (docs/design.md, "Row sources"). */
enum config_source { CONFIG_SOURCE_LEASE, CONFIG_SOURCE_CURSOR };

/* Named sources (docs/configuration.md, "Many sources"): one process relays from several
 * databases or tables, each with its own workers and connections. A name matches
 * [a-z][a-z0-9_]* and is at most CONFIG_SOURCE_NAME_MAX bytes. */
#define CONFIG_SOURCES_MAX     32
#define CONFIG_SOURCE_NAME_MAX 32

/* relay.workers' upper bound: the relay keeps per-worker arrays of this size (checked where
 * they are defined, in relay/). */
#define CONFIG_RELAY_WORKERS_MAX 64
enum config_log_level { CONFIG_LOG_DEBUG, CONFIG_LOG_INFO, CONFIG_LOG_WARN, CONFIG_LOG_ERROR };
enum config_log_format { CONFIG_LOG_TEXT, CONFIG_LOG_JSON };

/* Every duration is held in milliseconds. Strings are never NULL (unset = ""). The struct
 * is owned by the config module: build it with config_load(), release it with config_free(),
 * and never write to it in between (threads read it without locks). */
struct config {
	char *database_url;
	char *database_table;
	char *database_channel;

	char *amqp_url; /* one URL, or several separated by commas: the nodes of a cluster */
	int64_t amqp_heartbeat_ms;
	int64_t amqp_confirm_timeout_ms;
	char *amqp_tls_ca_file;
	char *amqp_tls_cert_file;
	char *amqp_tls_key_file;
	bool amqp_tls_verify_peer;

	char *relay_id;
	int64_t relay_batch_size;
	int64_t relay_batch_max_bytes; /* sum of body sizes per claim; a larger row goes alone */
	int64_t relay_lease_ms;
	int64_t relay_max_attempts;
	int64_t relay_poll_interval_ms;
	int64_t relay_retry_backoff_min_ms;
	int64_t relay_retry_backoff_max_ms;
	int64_t relay_retention_ms;
	enum config_ordering relay_ordering;
	enum config_source relay_source;
	int64_t relay_workers;
	int64_t relay_purge_interval_ms;
	int64_t relay_shutdown_timeout_ms;

	enum config_log_level log_level;
	enum config_log_format log_format;

	char *http_listen;

	/* Where each key's value came from, indexed like config_key_name(); owned here.
	 * "default", "file <path>:<line>", "env OUTBOX_X", "env OUTBOX_X_FILE (<path>)",
	 * "flag --set". */
	char **sources;

	/* The source this snapshot configures: "" for the top level, the name for each entry of
	 * named. Never NULL. */
	char *source_name;
	/* The named sources, in the order they were first named (the file's "sources" object,
	 * then OUTBOX_SOURCES, then --set sources.NAME.KEY=...); owned, n_named entries. Each is
	 * a complete, validated snapshot with source_name set and n_named 0. A source's key
	 * takes the source's own value when one is given (file < environment < --set among
	 * them), else the top level's effective value. When n_named > 0 the top level holds
	 * only those defaults and the process-wide keys (log.*, http.listen) and is not run as
	 * a source itself; when 0 the top level is the one source, as before. */
	struct config **named;
	size_t n_named;
};

/* Errors found while building a config: every problem at once, one line each, e.g.
 * "relay.batch_size: file relay.json:4: got 0, allowed 1..10000". */
struct config_errors {
	char **lines; /* owned; n entries */
	size_t n;
};

/* Inputs to config_load(). All borrowed for the duration of the call. */
struct config_sources {
	const char *file;        /* --config FILE, or NULL to use OUTBOX_CONFIG from env */
	const char *const *sets; /* "key=value" strings from --set, in order */
	size_t nsets;
	const char *const *environ; /* NULL-terminated "NAME=value" list (usually environ) */
	/* When non-NULL: reads the effective amqp.url the way the AMQP client will (config/ has
	 * no URL parser of its own and includes nothing of amqp/; relay/ passes
	 * broker_check_url). Returns 0, or non-zero with one line in why (n bytes) that never
	 * quotes a password; config_load() then reports it against amqp.url and its source, so
	 * that a URL which can never connect stops `run` and fails `config check` (exit 2). */
	int (*check_amqp_url)(const char *url, char *why, size_t n);
};

/* Builds the snapshot. Returns a new config (free with config_free) or NULL when anything is
 * wrong; then errs holds every error (free with config_errors_clear). Unknown keys in the file,
 * unknown OUTBOX_* variables that look like keys, wrong types, out-of-range values and
 * cross-key rules (relay.lease > amqp.confirm_timeout, backoff min <= max, valid table
 * identifier) are all errors. OUTBOX_CONFIG, OUTBOX_CONFIG_FILE are not keys. Named sources
 * (the file's "sources", OUTBOX_SOURCES and OUTBOX_SOURCES_<NAME>_<KEY>[_FILE], --set
 * sources.NAME.KEY=value) fill named; each is checked like the top level, its error lines
 * starting "sources.NAME.". */
struct config *config_load(const struct config_sources *src, struct config_errors *errs)
        __attribute__((warn_unused_result));
void config_free(struct config *c); /* accepts NULL */
void config_errors_clear(struct config_errors *errs);

/* The key table, for `config show`, the start-up log line and the README. */
size_t config_key_count(void);
const char *config_key_name(size_t i); /* "relay.batch_size" */
const char *config_key_help(size_t i); /* one line */
bool config_key_sensitive(size_t i);
/* True for the keys one process has once (log.*, http.listen): never set under a source, left
 * out of a named source's `config show`. */
bool config_key_process_wide(size_t i);
/* The environment variable name of key i, e.g. "OUTBOX_RELAY_BATCH_SIZE" (static storage). */
const char *config_key_env(size_t i);
/* Index of a key by name, or -1. */
int config_key_index(const char *name);
/* Key i's built-in default as a JSON value for the config file, into buf (NUL-terminated): a
 * number or true/false for integer and boolean keys, a quoted string for the others. -1 when i
 * is out of range, the default is computed at start (relay.id) or buf is too small. */
int config_key_default_json(size_t i, char *buf, size_t n) __attribute__((warn_unused_result));

/* Writes key i's effective value as text into buf (always NUL-terminated, truncated to n),
 * durations as written by config_format_duration, secrets redacted ("***" for passwords in
 * URLs and conninfo strings). */
void config_value_text(const struct config *c, size_t i, char *buf, size_t n);

/* Parses "500ms", "30s", "5m", "2h", "7d" or plain seconds ("30", "0.5") into milliseconds.
 * Returns 0 on success, -1 on a malformed or negative value. */
int config_parse_duration(const char *s, int64_t *out_ms) __attribute__((warn_unused_result));
/* Formats milliseconds back into the shortest exact unit ("1500ms", "30s", "5m", "0"). */
void config_format_duration(int64_t ms, char *buf, size_t n);

/* Parses a size in bytes: "65536", or a whole number with a binary suffix, "512KiB", "16MiB",
 * "1GiB" (k/K, m/M and g/G are the same powers of 1024). Returns 0 on success, -1 on a
 * malformed, negative or overflowing value (out untouched). */
int config_parse_size(const char *s, int64_t *out_bytes) __attribute__((warn_unused_result));
/* Formats bytes back into the largest exact unit ("16MiB", "64KiB", "1000", "0"). */
void config_format_size(int64_t bytes, char *buf, size_t n);

/* Reads a whole file of at most max bytes into a new NUL-terminated buffer (caller frees)
 * and sets *len; NULL with *err an errno value (EFBIG when it is longer than max). Used for
 * the config file, `*_FILE` secrets and `enqueue --body-file`. */
char *config_read_file(const char *path, size_t max, size_t *len, int *err);

/* Copies a URL (or a comma-separated list of them) or libpq conninfo into out with every
 * secret replaced by "***", as redact_conninfo() in base/redact.h does (this is that, kept for
 * callers of config/): "amqp://u:secret@h/" -> "amqp://u:***@h/",
 * "host=x password=secret" -> "host=x password=***". */
void config_redact(const char *url_or_conninfo, char *out, size_t n);

#endif
