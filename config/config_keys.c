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

#define FIELD(f) offsetof(struct config, f)

static const char *const ordering_choices[] = { "strict", "skip-dead", NULL };
/* Index order must match enum config_log_level and enum config_log_format. */
static const char *const level_choices[] = { "debug", "info", "warn", "error", NULL };
static const char *const format_choices[] = { "text", "json", NULL };

static const struct config_key keys[] = {
	{ "database.url", "OUTBOX_DATABASE_URL", CONFIG_STRING, "", 0, 0, false, true, NULL,
	  CONFIG_CHECK_NONE, FIELD(database_url),
	  "libpq conninfo or URI; empty means libpq's PG* variables" },
	{ "database.table", "OUTBOX_DATABASE_TABLE", CONFIG_STRING, "outbox", 0, 0, false, false,
	  NULL, CONFIG_CHECK_TABLE, FIELD(database_table),
	  "outbox table, optionally schema-qualified" },
	{ "database.channel", "OUTBOX_DATABASE_CHANNEL", CONFIG_STRING, "outbox", 0, 0, false,
	  false, NULL, CONFIG_CHECK_CHANNEL, FIELD(database_channel),
	  "LISTEN channel the relay wakes up on" },
	{ "amqp.url", "OUTBOX_AMQP_URL", CONFIG_STRING, "amqp://guest:guest@localhost:5672", 0, 0,
	  false, true, NULL, CONFIG_CHECK_AMQP_URL, FIELD(amqp_url),
	  "broker URL; amqps:// for TLS; no path means vhost /" },
	{ "amqp.heartbeat", "OUTBOX_AMQP_HEARTBEAT", CONFIG_DURATION, "30s", 1 * SEC, 1 * HOUR,
	  true, false, NULL, CONFIG_CHECK_NONE, FIELD(amqp_heartbeat_ms),
	  "AMQP heartbeat interval; 0 disables heartbeats" },
	{ "amqp.confirm_timeout", "OUTBOX_AMQP_CONFIRM_TIMEOUT", CONFIG_DURATION, "30s", 100,
	  1 * HOUR, false, false, NULL, CONFIG_CHECK_NONE, FIELD(amqp_confirm_timeout_ms),
	  "how long to wait for the broker's confirms of one batch" },
	{ "amqp.tls.ca_file", "OUTBOX_AMQP_TLS_CA_FILE", CONFIG_STRING, "", 0, 0, false, false,
	  NULL, CONFIG_CHECK_NONE, FIELD(amqp_tls_ca_file),
	  "PEM file of CA certificates that verify the broker (amqps://)" },
	{ "amqp.tls.cert_file", "OUTBOX_AMQP_TLS_CERT_FILE", CONFIG_STRING, "", 0, 0, false, false,
	  NULL, CONFIG_CHECK_NONE, FIELD(amqp_tls_cert_file),
	  "PEM client certificate for amqps://" },
	{ "amqp.tls.key_file", "OUTBOX_AMQP_TLS_KEY_FILE", CONFIG_STRING, "", 0, 0, false, false,
	  NULL, CONFIG_CHECK_NONE, FIELD(amqp_tls_key_file),
	  "PEM private key of the client certificate" },
	{ "amqp.tls.verify_peer", "OUTBOX_AMQP_TLS_VERIFY_PEER", CONFIG_BOOL, "true", 0, 0, false,
	  false, NULL, CONFIG_CHECK_NONE, FIELD(amqp_tls_verify_peer),
	  "verify the broker's certificate and host name (amqps://)" },
	{ "relay.id", "OUTBOX_RELAY_ID", CONFIG_STRING, NULL, 0, 0, false, false, NULL,
	  CONFIG_CHECK_RELAY_ID, FIELD(relay_id),
	  "this relay's name, written to locked_by; default hostname:pid" },
	{ "relay.batch_size", "OUTBOX_RELAY_BATCH_SIZE", CONFIG_INT, "500", 1, 10000, false, false,
	  NULL, CONFIG_CHECK_NONE, FIELD(relay_batch_size), "rows claimed per round trip" },
	{ "relay.lease", "OUTBOX_RELAY_LEASE", CONFIG_DURATION, "60s", 1 * SEC, 7 * DAY, false,
	  false, NULL, CONFIG_CHECK_NONE, FIELD(relay_lease_ms),
	  "how long claimed rows stay locked; must exceed amqp.confirm_timeout" },
	{ "relay.max_attempts", "OUTBOX_RELAY_MAX_ATTEMPTS", CONFIG_INT, "10", 1, 1000, false,
	  false, NULL, CONFIG_CHECK_NONE, FIELD(relay_max_attempts),
	  "failed publishes before a row is dead" },
	{ "relay.poll_interval", "OUTBOX_RELAY_POLL_INTERVAL", CONFIG_DURATION, "1s", 10, 1 * HOUR,
	  false, false, NULL, CONFIG_CHECK_NONE, FIELD(relay_poll_interval_ms),
	  "longest wait between claims without a notification" },
	{ "relay.retry_backoff_min", "OUTBOX_RELAY_RETRY_BACKOFF_MIN", CONFIG_DURATION, "1s", 0,
	  30 * DAY, false, false, NULL, CONFIG_CHECK_NONE, FIELD(relay_retry_backoff_min_ms),
	  "delay before the first retry of a failed row" },
	{ "relay.retry_backoff_max", "OUTBOX_RELAY_RETRY_BACKOFF_MAX", CONFIG_DURATION, "5m", 0,
	  30 * DAY, false, false, NULL, CONFIG_CHECK_NONE, FIELD(relay_retry_backoff_max_ms),
	  "longest delay between retries of a failed row" },
	{ "relay.retention", "OUTBOX_RELAY_RETENTION", CONFIG_DURATION, "7d", 0, 3650 * DAY, false,
	  false, NULL, CONFIG_CHECK_NONE, FIELD(relay_retention_ms),
	  "how long published rows are kept; 0 deletes them on confirm" },
	{ "relay.ordering", "OUTBOX_RELAY_ORDERING", CONFIG_ENUM, "strict", 0, 0, false, false,
	  ordering_choices, CONFIG_CHECK_NONE, CONFIG_NO_FIELD,
	  "a dead keyed row blocks its key (strict) or is set aside (skip-dead)" },
	{ "relay.workers", "OUTBOX_RELAY_WORKERS", CONFIG_INT, "1", 1, 64, false, false, NULL,
	  CONFIG_CHECK_NONE, FIELD(relay_workers), "relay threads, each with its own connections" },
	{ "relay.purge_interval", "OUTBOX_RELAY_PURGE_INTERVAL", CONFIG_DURATION, "1h", 1 * SEC,
	  30 * DAY, false, false, NULL, CONFIG_CHECK_NONE, FIELD(relay_purge_interval_ms),
	  "how often published rows older than relay.retention are purged" },
	{ "relay.shutdown_timeout", "OUTBOX_RELAY_SHUTDOWN_TIMEOUT", CONFIG_DURATION, "15s", 0,
	  1 * HOUR, false, false, NULL, CONFIG_CHECK_NONE, FIELD(relay_shutdown_timeout_ms),
	  "how long an orderly shutdown waits for in-flight confirms" },
	{ "log.level", "OUTBOX_LOG_LEVEL", CONFIG_ENUM, "info", 0, 0, false, false, level_choices,
	  CONFIG_CHECK_NONE, CONFIG_NO_FIELD,
	  "least severe level written: debug, info, warn, error" },
	{ "log.format", "OUTBOX_LOG_FORMAT", CONFIG_ENUM, "text", 0, 0, false, false,
	  format_choices, CONFIG_CHECK_NONE, CONFIG_NO_FIELD, "text (logfmt) or json" },
	{ "http.listen", "OUTBOX_HTTP_LISTEN", CONFIG_STRING, "127.0.0.1:8787", 0, 0, false, false,
	  NULL, CONFIG_CHECK_LISTEN, FIELD(http_listen),
	  "host:port for /healthz, /readyz and /metrics; empty disables" },
};

size_t config_key_count(void)
{
	return sizeof(keys) / sizeof(keys[0]);
}

const struct config_key *config_key_at(size_t i)
{
	return &keys[i];
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
