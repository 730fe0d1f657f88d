/* The one table of configuration keys: name, environment name, type, default, bounds,
 * sensitive flag and one line of help. `config show`, the start-up log line, the README
 * and the loader all read this table; a key that is not here does not exist. */
#include <stddef.h>
#include <string.h>

#include "config/config.h"
#include "config/config_keys.h"

#define SEC  1000LL
#define MIN  (60 * SEC)
#define HOUR (60 * MIN)
#define DAY  (24 * HOUR)
#define KIB  1024LL
#define MIB  (1024 * KIB)
#define GIB  (1024 * MIB)

#define FIELD(f) offsetof(struct config, f)

/* Index order must match enum config_ordering, enum config_source, enum config_log_level and
 * enum config_log_format. */
static const char *const ordering_choices[] = { "strict", "skip-dead", NULL };
static const char *const source_choices[] = { "lease", "cursor", NULL };
static const char *const level_choices[] = { "debug", "info", "warn", "error", NULL };
static const char *const format_choices[] = { "text", "json", NULL };

/* An enum key is stored through an int: the enums must be int-sized. */
_Static_assert(sizeof(enum config_ordering) == sizeof(int), "enum config_ordering");
_Static_assert(sizeof(enum config_source) == sizeof(int), "enum config_source");
_Static_assert(sizeof(enum config_log_level) == sizeof(int), "enum config_log_level");
_Static_assert(sizeof(enum config_log_format) == sizeof(int), "enum config_log_format");

static const struct config_key keys[] = {
	{
	        .name = "database.url",
	        .env = "OUTBOX_DATABASE_URL",
	        .type = CONFIG_STRING,
	        .def = "",
	        .sensitive = true,
	        .field = FIELD(database_url),
	        .help = "libpq conninfo or URI; empty means libpq's PG* variables",
	},
	{
	        .name = "database.table",
	        .env = "OUTBOX_DATABASE_TABLE",
	        .type = CONFIG_STRING,
	        .def = "outbox",
	        .check = CONFIG_CHECK_TABLE,
	        .field = FIELD(database_table),
	        .help = "outbox table, optionally schema-qualified",
	},
	{
	        .name = "database.channel",
	        .env = "OUTBOX_DATABASE_CHANNEL",
	        .type = CONFIG_STRING,
	        .def = "outbox",
	        .check = CONFIG_CHECK_CHANNEL,
	        .field = FIELD(database_channel),
	        .help = "LISTEN channel the relay wakes up on",
	},
	{
	        .name = "amqp.url",
	        .env = "OUTBOX_AMQP_URL",
	        .type = CONFIG_STRING,
	        .def = "amqp://guest:guest@localhost:5672",
	        .sensitive = true,
	        .check = CONFIG_CHECK_AMQP_URLS,
	        .field = FIELD(amqp_url),
	        .help = "broker URL, or several separated by commas (cluster nodes, tried in "
	                "turn); amqps:// for TLS; no path means vhost /",
	},
	{
	        .name = "amqp.heartbeat",
	        .env = "OUTBOX_AMQP_HEARTBEAT",
	        .type = CONFIG_DURATION,
	        .def = "30s",
	        .min = 1 * SEC,
	        .max = 1 * HOUR,
	        .zero_ok = true,
	        .field = FIELD(amqp_heartbeat_ms),
	        .help = "AMQP heartbeat interval; 0 disables heartbeats",
	},
	{
	        .name = "amqp.confirm_timeout",
	        .env = "OUTBOX_AMQP_CONFIRM_TIMEOUT",
	        .type = CONFIG_DURATION,
	        .def = "30s",
	        .min = 100,
	        .max = 1 * HOUR,
	        .field = FIELD(amqp_confirm_timeout_ms),
	        .help = "how long to wait for the broker's confirms of one batch",
	},
	{
	        .name = "amqp.tls.ca_file",
	        .env = "OUTBOX_AMQP_TLS_CA_FILE",
	        .type = CONFIG_STRING,
	        .def = "",
	        .field = FIELD(amqp_tls_ca_file),
	        .help = "PEM file of CA certificates that verify the broker (amqps://)",
	},
	{
	        .name = "amqp.tls.cert_file",
	        .env = "OUTBOX_AMQP_TLS_CERT_FILE",
	        .type = CONFIG_STRING,
	        .def = "",
	        .field = FIELD(amqp_tls_cert_file),
	        .help = "PEM client certificate for amqps://",
	},
	{
	        .name = "amqp.tls.key_file",
	        .env = "OUTBOX_AMQP_TLS_KEY_FILE",
	        .type = CONFIG_STRING,
	        .def = "",
	        .field = FIELD(amqp_tls_key_file),
	        .help = "PEM private key of the client certificate",
	},
	{
	        .name = "amqp.tls.verify_peer",
	        .env = "OUTBOX_AMQP_TLS_VERIFY_PEER",
	        .type = CONFIG_BOOL,
	        .def = "true",
	        .field = FIELD(amqp_tls_verify_peer),
	        .help = "verify the broker's certificate and host name (amqps://)",
	},
	{
	        .name = "relay.id",
	        .env = "OUTBOX_RELAY_ID",
	        .type = CONFIG_STRING,
	        .default_fn = config_default_relay_id,
	        .check = CONFIG_CHECK_RELAY_ID,
	        .field = FIELD(relay_id),
	        .help = "this relay's name, written to locked_by; default hostname:pid",
	},
	{
	        .name = "relay.batch_size",
	        .env = "OUTBOX_RELAY_BATCH_SIZE",
	        .type = CONFIG_INT,
	        .def = "500",
	        .min = 1,
	        .max = 10000,
	        .field = FIELD(relay_batch_size),
	        .help = "rows claimed per round trip",
	},
	{
	        .name = "relay.batch_max_bytes",
	        .env = "OUTBOX_RELAY_BATCH_MAX_BYTES",
	        .type = CONFIG_SIZE,
	        .def = "16MiB",
	        .min = 64 * KIB,
	        .max = 1 * GIB,
	        .field = FIELD(relay_batch_max_bytes),
	        .help = "bytes of bodies claimed per round trip (a larger row goes alone); bytes "
	                "or KiB, MiB, GiB (k, m, g: the same powers of 1024)",
	},
	{
	        .name = "relay.lease",
	        .env = "OUTBOX_RELAY_LEASE",
	        .type = CONFIG_DURATION,
	        .def = "60s",
	        .min = 1 * SEC,
	        .max = 7 * DAY,
	        .field = FIELD(relay_lease_ms),
	        .help = "how long claimed rows stay locked; must exceed amqp.confirm_timeout",
	},
	{
	        .name = "relay.max_attempts",
	        .env = "OUTBOX_RELAY_MAX_ATTEMPTS",
	        .type = CONFIG_INT,
	        .def = "10",
	        .min = 1,
	        .max = 1000,
	        .field = FIELD(relay_max_attempts),
	        .help = "failed publishes before a row is dead",
	},
	{
	        .name = "relay.poll_interval",
	        .env = "OUTBOX_RELAY_POLL_INTERVAL",
	        .type = CONFIG_DURATION,
	        .def = "1s",
	        .min = 10,
	        .max = 1 * HOUR,
	        .field = FIELD(relay_poll_interval_ms),
	        .help = "longest wait between claims without a notification",
	},
	{
	        .name = "relay.retry_backoff_min",
	        .env = "OUTBOX_RELAY_RETRY_BACKOFF_MIN",
	        .type = CONFIG_DURATION,
	        .def = "1s",
	        .min = 0,
	        .max = 30 * DAY,
	        .field = FIELD(relay_retry_backoff_min_ms),
	        .help = "delay before the first retry of a failed row",
	},
	{
	        .name = "relay.retry_backoff_max",
	        .env = "OUTBOX_RELAY_RETRY_BACKOFF_MAX",
	        .type = CONFIG_DURATION,
	        .def = "5m",
	        .min = 0,
	        .max = 30 * DAY,
	        .field = FIELD(relay_retry_backoff_max_ms),
	        .help = "longest delay between retries of a failed row",
	},
	{
	        .name = "relay.retention",
	        .env = "OUTBOX_RELAY_RETENTION",
	        .type = CONFIG_DURATION,
	        .def = "7d",
	        .min = 0,
	        .max = 3650 * DAY,
	        .field = FIELD(relay_retention_ms),
	        .help = "how long published rows are kept; 0 deletes them on confirm",
	},
	{
	        .name = "relay.ordering",
	        .env = "OUTBOX_RELAY_ORDERING",
	        .type = CONFIG_ENUM,
	        .def = "strict",
	        .choices = ordering_choices,
	        .field = FIELD(relay_ordering),
	        .help = "a dead keyed row blocks its key (strict) or is set aside (skip-dead)",
	},
	{
	        .name = "relay.source",
	        .env = "OUTBOX_RELAY_SOURCE",
	        .type = CONFIG_ENUM,
	        .def = "lease",
	        .choices = source_choices,
	        .field = FIELD(relay_source),
	        .help = "lease: a lease written into each row; cursor: one position per table",
	},
	{
	        .name = "relay.workers",
	        .env = "OUTBOX_RELAY_WORKERS",
	        .type = CONFIG_INT,
	        .def = "1",
	        .min = 1,
	        .max = CONFIG_RELAY_WORKERS_MAX,
	        .field = FIELD(relay_workers),
	        .help = "relay threads, each with its own connections",
	},
	{
	        .name = "relay.purge_interval",
	        .env = "OUTBOX_RELAY_PURGE_INTERVAL",
	        .type = CONFIG_DURATION,
	        .def = "1h",
	        .min = 1 * SEC,
	        .max = 30 * DAY,
	        .field = FIELD(relay_purge_interval_ms),
	        .help = "how often published rows older than relay.retention are purged",
	},
	{
	        .name = "relay.shutdown_timeout",
	        .env = "OUTBOX_RELAY_SHUTDOWN_TIMEOUT",
	        .type = CONFIG_DURATION,
	        .def = "15s",
	        .min = 0,
	        .max = 1 * HOUR,
	        .field = FIELD(relay_shutdown_timeout_ms),
	        .help = "how long an orderly shutdown waits for in-flight confirms",
	},
	{
	        .name = "log.level",
	        .env = "OUTBOX_LOG_LEVEL",
	        .type = CONFIG_ENUM,
	        .def = "info",
	        .choices = level_choices,
	        .process_wide = true,
	        .field = FIELD(log_level),
	        .help = "least severe level written: debug, info, warn, error",
	},
	{
	        .name = "log.format",
	        .env = "OUTBOX_LOG_FORMAT",
	        .type = CONFIG_ENUM,
	        .def = "text",
	        .choices = format_choices,
	        .process_wide = true,
	        .field = FIELD(log_format),
	        .help = "text (logfmt) or json",
	},
	{
	        .name = "http.listen",
	        .env = "OUTBOX_HTTP_LISTEN",
	        .type = CONFIG_STRING,
	        .def = "127.0.0.1:8787",
	        .check = CONFIG_CHECK_LISTEN,
	        .process_wide = true,
	        .field = FIELD(http_listen),
	        .help = "host:port for /healthz, /readyz and /metrics; empty disables",
	},
};

size_t config_key_count(void)
{
	return sizeof(keys) / sizeof(keys[0]);
}

const struct config_key *config_key_at(size_t i)
{
	return &keys[i];
}

size_t config_key_by_field(size_t field)
{
	size_t i = 0;

	while (i < config_key_count() && keys[i].field != field)
		i++;
	return i;
}

const char *config_key_name(size_t i)
{
	return i < config_key_count() ? keys[i].name : NULL;
}

const char *config_key_help(size_t i)
{
	return i < config_key_count() ? keys[i].help : NULL;
}

bool config_key_sensitive(size_t i)
{
	return i < config_key_count() && keys[i].sensitive;
}

bool config_key_process_wide(size_t i)
{
	return i < config_key_count() && keys[i].process_wide;
}

const char *config_key_env(size_t i)
{
	return i < config_key_count() ? keys[i].env : NULL;
}

int config_key_index(const char *name)
{
	if (!name)
		return -1;
	for (size_t i = 0; i < config_key_count(); i++) {
		if (strcmp(keys[i].name, name) == 0)
			return (int)i;
	}
	return -1;
}

bool config_key_is_section(const char *path)
{
	size_t len = strlen(path);

	/* A section is a proper prefix of some key ending at a dot: "amqp" and "amqp.tls" are,
	 * "amq" and "amqp.url" are not. */
	for (size_t i = 0; i < config_key_count(); i++) {
		if (strncmp(keys[i].name, path, len) == 0 && keys[i].name[len] == '.')
			return true;
	}
	return false;
}

int config_key_default_json(size_t i, char *buf, size_t n)
{
	const char *def;
	size_t need;
	bool quote;

	if (i >= config_key_count() || !keys[i].def)
		return -1;
	def = keys[i].def;
	/* The loader takes every type from a JSON string too; numbers and booleans are written
	 * bare because that is how an operator writes them. */
	quote = keys[i].type != CONFIG_INT && keys[i].type != CONFIG_BOOL;
	need = quote ? 3 : 1; /* the quotes and the NUL */
	for (const char *p = def; *p; p++) {
		if ((unsigned char)*p < 0x20)
			return -1;
		need += quote && (*p == '"' || *p == '\\') ? 2 : 1;
	}
	if (need > n)
		return -1;
	need = 0;
	if (quote)
		buf[need++] = '"';
	for (const char *p = def; *p; p++) {
		if (quote && (*p == '"' || *p == '\\'))
			buf[need++] = '\\';
		buf[need++] = *p;
	}
	if (quote)
		buf[need++] = '"';
	buf[need] = '\0';
	return 0;
}
