/* Unit tests of config/: layering and sources, every kind of error with its location,
 * durations, identifiers, secret files and redaction. Fixtures are in tests/data/config. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "config/config.h"
#include "config/config_keys.h"
#include "base/identifier.h"

static struct config_errors errs;
static struct config *cfg;

static void teardown(void)
{
	config_free(cfg);
	cfg = NULL;
	config_errors_clear(&errs);
}

TestSuite(config, .fini = teardown);

/* Path of a fixture; static buffer, valid until the next call. */
static const char *fixture(const char *name)
{
	static char path[4096];
	const char *dir = getenv("RELAY_TEST_DATA");

	cr_assert_not_null(dir, "RELAY_TEST_DATA must point at tests/data");
	snprintf(path, sizeof(path), "%s/config/%s", dir, name);
	return path;
}

static struct config *load(const char *file, const char *const *env, const char *const *sets,
                           size_t nsets)
{
	static const char *const no_env[] = { NULL };
	struct config_sources src = { file, sets, nsets, env ? env : no_env, NULL };

	cfg = config_load(&src, &errs);
	return cfg;
}

static bool has_error(const char *needle)
{
	for (size_t i = 0; i < errs.n; i++) {
		if (strstr(errs.lines[i], needle))
			return true;
	}
	return false;
}

static void dump_errors(void)
{
	for (size_t i = 0; i < errs.n; i++)
		cr_log_info("error: %s", errs.lines[i]);
}

static void expect_error(const char *needle)
{
	if (!has_error(needle))
		dump_errors();
	cr_assert(has_error(needle), "no error line contains: %s", needle);
}

static const char *value(size_t i)
{
	static char buf[512];

	config_value_text(cfg, i, buf, sizeof(buf));
	return buf;
}

static const char *source(const char *key)
{
	int i = config_key_index(key);

	cr_assert_geq(i, 0, "unknown key %s", key);
	return cfg->sources[i];
}

Test(config, defaults_match_design)
{
	cr_assert_not_null(load(NULL, NULL, NULL, 0));
	cr_assert_eq(errs.n, 0);
	cr_assert_str_eq(cfg->database_url, "");
	cr_assert_str_eq(cfg->database_table, "outbox");
	cr_assert_str_eq(cfg->database_channel, "outbox");
	cr_assert_str_eq(cfg->amqp_url, "amqp://guest:guest@localhost:5672");
	cr_assert_eq(cfg->amqp_heartbeat_ms, 30000);
	cr_assert_eq(cfg->amqp_confirm_timeout_ms, 30000);
	cr_assert_str_eq(cfg->amqp_tls_ca_file, "");
	cr_assert(cfg->amqp_tls_verify_peer);
	cr_assert_eq(cfg->relay_batch_size, 500);
	cr_assert_eq(cfg->relay_batch_max_bytes, 16 * 1024 * 1024);
	cr_assert_eq(cfg->relay_lease_ms, 60000);
	cr_assert_eq(cfg->relay_max_attempts, 10);
	cr_assert_eq(cfg->relay_poll_interval_ms, 1000);
	cr_assert_eq(cfg->relay_retry_backoff_min_ms, 1000);
	cr_assert_eq(cfg->relay_retry_backoff_max_ms, 300000);
	cr_assert_eq(cfg->relay_retention_ms, 7LL * 24 * 3600 * 1000);
	cr_assert_eq(cfg->relay_ordering, CONFIG_ORDERING_STRICT);
	cr_assert_eq(cfg->relay_workers, 1);
	cr_assert_eq(cfg->relay_purge_interval_ms, 3600000);
	cr_assert_eq(cfg->relay_shutdown_timeout_ms, 15000);
	cr_assert_eq(cfg->log_level, CONFIG_LOG_INFO);
	cr_assert_eq(cfg->log_format, CONFIG_LOG_TEXT);
	cr_assert_str_eq(cfg->http_listen, "127.0.0.1:8787");
	/* relay.id is hostname:pid, from the default */
	cr_assert_not_null(strrchr(cfg->relay_id, ':'));
	cr_assert_eq(strtol(strrchr(cfg->relay_id, ':') + 1, NULL, 10), (long)getpid());
	cr_assert_leq(strlen(cfg->relay_id), 64);
	cr_assert_str_eq(source("relay.id"), "default");
	cr_assert_str_eq(source("relay.batch_size"), "default");
}

Test(config, key_table_env_names_follow_the_rule)
{
	cr_assert_geq(config_key_count(), 25);
	for (size_t i = 0; i < config_key_count(); i++) {
		char env[128] = "OUTBOX_";
		size_t len = strlen(env);

		for (const char *p = config_key_name(i); *p && len + 1 < sizeof(env); p++) {
			char ch = *p == '.' ? '_' : *p;

			env[len++] = (char)(ch >= 'a' && ch <= 'z' ? ch - 'a' + 'A' : ch);
		}
		env[len] = '\0';
		cr_assert_str_eq(config_key_env(i), env);
		cr_assert_eq(config_key_index(config_key_name(i)), (int)i);
		cr_assert_gt(strlen(config_key_help(i)), 10);
	}
	cr_assert_geq(config_key_index("amqp.tls.ca_file"), 0);
	cr_assert_geq(config_key_index("amqp.tls.cert_file"), 0);
	cr_assert_geq(config_key_index("amqp.tls.key_file"), 0);
	cr_assert_geq(config_key_index("amqp.tls.verify_peer"), 0);
	cr_assert_str_eq(config_key_env((size_t)config_key_index("amqp.tls.ca_file")),
	                 "OUTBOX_AMQP_TLS_CA_FILE");
	cr_assert(config_key_sensitive((size_t)config_key_index("database.url")));
	cr_assert(config_key_sensitive((size_t)config_key_index("amqp.url")));
	cr_assert_not(config_key_sensitive((size_t)config_key_index("relay.id")));
	cr_assert_eq(config_key_index("relay.nope"), -1);
}

Test(config, file_with_comments_sections_and_dotted_keys)
{
	cr_assert_not_null(load(fixture("valid.json"), NULL, NULL, 0));
	cr_assert_eq(errs.n, 0);
	cr_assert_str_eq(cfg->database_url, "postgresql://app:s3cret@db.internal/app");
	cr_assert_str_eq(cfg->database_table, "events.outbox_v2");
	/* a // inside a string value is data, not a comment */
	cr_assert_str_eq(cfg->amqp_tls_ca_file, "/etc/ssl/ca.pem // not a comment");
	cr_assert_not(cfg->amqp_tls_verify_peer);
	cr_assert_eq(cfg->relay_batch_size, 250);
	cr_assert_eq(cfg->relay_lease_ms, 120000);
	/* a JSON number is seconds */
	cr_assert_eq(cfg->relay_poll_interval_ms, 500);
	cr_assert_eq(cfg->relay_ordering, CONFIG_ORDERING_SKIP_DEAD);
	cr_assert_eq(cfg->log_format, CONFIG_LOG_JSON);
	cr_assert_eq(cfg->log_level, CONFIG_LOG_DEBUG);
	cr_assert(strstr(source("relay.batch_size"), "valid.json:12"), "source was %s",
	          source("relay.batch_size"));
	cr_assert(strstr(source("amqp.tls.ca_file"), "valid.json:10"));
	cr_assert(strstr(source("relay.poll_interval"), "valid.json:14"));
	cr_assert_eq(strncmp(source("relay.lease"), "file ", 5), 0);
	cr_assert_str_eq(source("relay.workers"), "default");
}

Test(config, config_file_from_outbox_config_env)
{
	static char var[4200];
	const char *env[] = { var, NULL };

	snprintf(var, sizeof(var), "OUTBOX_CONFIG=%s", fixture("precedence.json"));
	cr_assert_not_null(load(NULL, env, NULL, 0));
	cr_assert_eq(cfg->relay_batch_size, 100);
}

Test(config, precedence_default_file_env_set)
{
	const char *env[] = { "OUTBOX_RELAY_WORKERS=3", "OUTBOX_RELAY_MAX_ATTEMPTS=5", "PATH=/bin",
		              NULL };
	const char *sets[] = { "relay.max_attempts=7", "log.level=warn" };

	cr_assert_not_null(load(fixture("precedence.json"), env, sets, 2));
	cr_assert_eq(cfg->relay_batch_size, 100);      /* file */
	cr_assert_eq(cfg->relay_workers, 3);           /* env over file */
	cr_assert_eq(cfg->relay_max_attempts, 7);      /* set over env over file */
	cr_assert_eq(cfg->log_level, CONFIG_LOG_WARN); /* set over default */
	cr_assert_eq(cfg->relay_lease_ms, 60000);      /* default */
	cr_assert(strstr(source("relay.batch_size"), "precedence.json:2"));
	cr_assert_str_eq(source("relay.workers"), "env OUTBOX_RELAY_WORKERS");
	cr_assert_str_eq(source("relay.max_attempts"), "flag --set");
	cr_assert_str_eq(source("log.level"), "flag --set");
	cr_assert_str_eq(source("relay.lease"), "default");
}

Test(config, unknown_keys_in_file_with_line)
{
	cr_assert_null(load(fixture("unknown_key.json"), NULL, NULL, 0));
	expect_error("relay.batch_sise: unknown key (file ");
	expect_error("unknown_key.json:4)");
	/* an unknown section is one error, not one per leaf */
	expect_error("bogus: unknown key (file ");
	expect_error("unknown_key.json:6)");
	cr_assert_eq(errs.n, 2);
}

Test(config, several_errors_at_once_with_locations)
{
	cr_assert_null(load(fixture("errors.json"), NULL, NULL, 0));
	/* out of range */
	expect_error("relay.batch_size: got \"0\" (file ");
	expect_error("errors.json:3); allowed: an integer 1..10000");
	/* bad duration */
	expect_error("relay.lease: got \"ten seconds\" (file ");
	expect_error("errors.json:4); allowed: a duration 1s..7d");
	/* bad enum */
	expect_error("relay.ordering: got \"random\" (file ");
	expect_error("allowed: one of strict, skip-dead");
	/* not an integer */
	expect_error("relay.workers: got \"4.5\"");
	/* bad identifier */
	expect_error("database.table: got \"bad-name\"");
	expect_error("errors.json:8); allowed: an SQL identifier");
	/* wrong JSON type: a number for a string, a number for an enum */
	expect_error("database.channel: got \"42\"");
	expect_error("log.level: got \"3\" (file ");
	expect_error("errors.json:9); allowed: one of debug, info, warn, error");
	/* secret never echoed, even when invalid: shown redacted */
	expect_error("amqp.url: got \"http://user:***@host/\" (file ");
	for (size_t i = 0; i < errs.n; i++)
		cr_assert_null(strstr(errs.lines[i], "topsecret"), "leaked: %s", errs.lines[i]);
	cr_assert_eq(errs.n, 8, "expected 8 errors, got %zu", errs.n);
}

Test(config, json_syntax_error_names_line_and_column)
{
	cr_assert_null(load(fixture("syntax.json"), NULL, NULL, 0));
	cr_assert_eq(errs.n, 1);
	expect_error("syntax.json:4:");
	expect_error("invalid JSON:");
}

Test(config, missing_config_file)
{
	cr_assert_null(load(fixture("does-not-exist.json"), NULL, NULL, 0));
	expect_error("does-not-exist.json: could not read config file: No such file");
	teardown();
	cr_assert_null(load("", NULL, NULL, 0));
	expect_error("--config: got an empty path");
}

Test(config, lease_must_exceed_confirm_timeout)
{
	cr_assert_null(load(fixture("lease.json"), NULL, NULL, 0));
	cr_assert_eq(errs.n, 1);
	expect_error("relay.lease: got \"30s\" (file ");
	expect_error("allowed: more than amqp.confirm_timeout, which is 45s (file ");
}

Test(config, lease_equal_to_confirm_timeout_is_refused)
{
	const char *sets[] = { "relay.lease=30s" };

	cr_assert_null(load(NULL, NULL, sets, 1));
	expect_error("relay.lease: got \"30s\" (flag --set); allowed: more than "
	             "amqp.confirm_timeout, which is 30s (default)");
}

Test(config, backoff_min_above_max)
{
	const char *env[] = { "OUTBOX_RELAY_RETRY_BACKOFF_MIN=10m", NULL };

	cr_assert_null(load(NULL, env, NULL, 0));
	expect_error("relay.retry_backoff_min: got \"10m\" (env OUTBOX_RELAY_RETRY_BACKOFF_MIN); "
	             "allowed: at most relay.retry_backoff_max, which is 5m (default)");
}

Test(config, unknown_outbox_variable)
{
	const char *env[] = { "OUTBOX_RELAY_BATCHSIZE=10", "OUTBOXY=1", "HOME=/root", NULL };

	cr_assert_null(load(NULL, env, NULL, 0));
	cr_assert_eq(errs.n, 1);
	expect_error("OUTBOX_RELAY_BATCHSIZE: unknown configuration variable");
}

Test(config, outbox_config_file_is_not_a_variable)
{
	const char *env[] = { "OUTBOX_CONFIG_FILE=/etc/relay.json", NULL };

	cr_assert_null(load(NULL, env, NULL, 0));
	cr_assert_eq(errs.n, 1);
	expect_error("OUTBOX_CONFIG_FILE: unknown configuration variable");
	expect_error("allowed: OUTBOX_CONFIG=");
}

Test(config, section_given_a_scalar)
{
	const char *env[] = { "OUTBOX_CONFIG=", NULL };

	/* an empty OUTBOX_CONFIG means no file */
	cr_assert_not_null(load(NULL, env, NULL, 0));
	teardown();
	cr_assert_null(load(fixture("section_scalar.json"), NULL, NULL, 0));
	cr_assert_eq(errs.n, 2);
	expect_error("relay: got a number (file ");
	expect_error("section_scalar.json:2); allowed: an object holding relay.* keys");
	expect_error("amqp.tls.ca_file: got \"{...}\" (file ");
	expect_error("section_scalar.json:4); allowed: a string");
}

Test(config, key_given_twice_in_file)
{
	cr_assert_null(load(fixture("twice.json"), NULL, NULL, 0));
	cr_assert_eq(errs.n, 1);
	expect_error("relay.batch_size: given twice (file ");
	expect_error("twice.json:3 and line 2)");
}

Test(config, env_values_are_validated)
{
	const char *env[] = { "OUTBOX_RELAY_BATCH_SIZE=20000", "OUTBOX_AMQP_TLS_VERIFY_PEER=maybe",
		              "OUTBOX_AMQP_HEARTBEAT=500ms", NULL };

	cr_assert_null(load(NULL, env, NULL, 0));
	cr_assert_eq(errs.n, 3);
	expect_error("relay.batch_size: got \"20000\" (env OUTBOX_RELAY_BATCH_SIZE); allowed: "
	             "an integer 1..10000");
	expect_error("amqp.tls.verify_peer: got \"maybe\" (env OUTBOX_AMQP_TLS_VERIFY_PEER)");
	expect_error("amqp.heartbeat: got \"500ms\" (env OUTBOX_AMQP_HEARTBEAT); allowed: 0 or "
	             "a duration 1s..1h");
}

Test(config, env_types_accepted)
{
	const char *env[] = { "OUTBOX_AMQP_TLS_VERIFY_PEER=off",
		              "OUTBOX_AMQP_HEARTBEAT=0",
		              "OUTBOX_RELAY_RETENTION=0",
		              "OUTBOX_HTTP_LISTEN=",
		              "OUTBOX_AMQP_TLS_CA_FILE=/ca.pem",
		              "OUTBOX_RELAY_ID=relay-a",
		              NULL };

	cr_assert_not_null(load(NULL, env, NULL, 0));
	cr_assert_not(cfg->amqp_tls_verify_peer);
	cr_assert_eq(cfg->amqp_heartbeat_ms, 0);
	cr_assert_eq(cfg->relay_retention_ms, 0);
	cr_assert_str_eq(cfg->http_listen, "");
	/* OUTBOX_AMQP_TLS_CA_FILE is the key itself, not a _FILE secret of OUTBOX_AMQP_TLS_CA */
	cr_assert_str_eq(cfg->amqp_tls_ca_file, "/ca.pem");
	cr_assert_str_eq(cfg->relay_id, "relay-a");
	cr_assert_str_eq(source("relay.id"), "env OUTBOX_RELAY_ID");
}

Test(config, secret_from_file)
{
	static char var[4200];
	const char *env[] = { var, NULL };

	snprintf(var, sizeof(var), "OUTBOX_DATABASE_URL_FILE=%s", fixture("secret.txt"));
	cr_assert_not_null(load(NULL, env, NULL, 0));
	/* trailing newlines stripped, inner space kept */
	cr_assert_str_eq(cfg->database_url, "pa ss");
	cr_assert(strstr(source("database.url"), "env OUTBOX_DATABASE_URL_FILE ("));
	cr_assert(strstr(source("database.url"), "secret.txt)"));
}

Test(config, secret_file_unreadable)
{
	const char *env[] = { "OUTBOX_AMQP_URL_FILE=/nonexistent/secret", NULL };

	cr_assert_null(load(NULL, env, NULL, 0));
	cr_assert_eq(errs.n, 1);
	expect_error("amqp.url: could not read OUTBOX_AMQP_URL_FILE \"/nonexistent/secret\": "
	             "No such file or directory");
}

Test(config, both_value_and_file_set)
{
	const char *env[] = { "OUTBOX_DATABASE_URL=host=a", "OUTBOX_DATABASE_URL_FILE=/x", NULL };

	cr_assert_null(load(NULL, env, NULL, 0));
	cr_assert_eq(errs.n, 1);
	expect_error("database.url: both OUTBOX_DATABASE_URL and OUTBOX_DATABASE_URL_FILE are set");
}

Test(config, set_errors)
{
	const char *sets[] = { "relay.batch_size", "relay.nope=1", "log.format=xml" };

	cr_assert_null(load(NULL, NULL, sets, 3));
	cr_assert_eq(errs.n, 3);
	expect_error("--set \"relay.batch_size\": missing '='");
	expect_error("relay.nope: unknown key (flag --set)");
	expect_error("log.format: got \"xml\" (flag --set); allowed: one of text, json");
}

Test(config, channel_and_url_and_listen_checks)
{
	const char *sets[] = { "database.channel=public.outbox", "amqp.url=amqp://x",
		               "http.listen=localhost:70000", "relay.id=" };

	cr_assert_null(load(NULL, NULL, sets, 4));
	cr_assert_eq(errs.n, 3);
	expect_error("database.channel: got \"public.outbox\" (flag --set)");
	expect_error("http.listen: got \"localhost:70000\"");
	expect_error("relay.id: got \"\"");
}

Test(config, table_name_leaves_room_for_derived_names)
{
	/* 51 bytes fits ("<t>_unkeyed_idx" stays within PostgreSQL's 63); 52 does not, also
	 * after a schema. */
	const char *ok[] = {
		"database.table=app.a23456789012345678901234567890123456789012345678901"
	};
	const char *bad[] = {
		"database.table=a234567890123456789012345678901234567890123456789012"
	};
	struct config *c = load(NULL, NULL, ok, 1);

	cr_assert_not_null(c);
	config_free(c);
	cr_assert_null(load(NULL, NULL, bad, 1));
	cr_assert_eq(errs.n, 1);
	expect_error(
	        "database.table: got \"a234567890123456789012345678901234567890123456789012\"");
	expect_error("51 bytes at most");
}

Test(config, listen_forms)
{
	const char *ok[] = { "http.listen=:8080" };
	const char *v6[] = { "http.listen=[::1]:9000" };
	const char *bad[] = { "http.listen=::1:9000" };

	cr_assert_not_null(load(NULL, NULL, ok, 1));
	teardown();
	cr_assert_not_null(load(NULL, NULL, v6, 1));
	cr_assert_str_eq(cfg->http_listen, "[::1]:9000");
	teardown();
	cr_assert_null(load(NULL, NULL, bad, 1));
}

Test(config, durations_both_ways)
{
	int64_t ms = -1;
	char buf[32];

	cr_assert_eq(config_parse_duration("500ms", &ms), 0);
	cr_assert_eq(ms, 500);
	cr_assert_eq(config_parse_duration("30s", &ms), 0);
	cr_assert_eq(ms, 30000);
	cr_assert_eq(config_parse_duration("5m", &ms), 0);
	cr_assert_eq(ms, 300000);
	cr_assert_eq(config_parse_duration("2h", &ms), 0);
	cr_assert_eq(ms, 7200000);
	cr_assert_eq(config_parse_duration("7d", &ms), 0);
	cr_assert_eq(ms, 604800000);
	cr_assert_eq(config_parse_duration("30", &ms), 0);
	cr_assert_eq(ms, 30000);
	cr_assert_eq(config_parse_duration("0.5", &ms), 0);
	cr_assert_eq(ms, 500);
	cr_assert_eq(config_parse_duration("1.5m", &ms), 0);
	cr_assert_eq(ms, 90000);
	cr_assert_eq(config_parse_duration("0", &ms), 0);
	cr_assert_eq(ms, 0);

	ms = 42;
	cr_assert_lt(config_parse_duration("", &ms), 0);
	cr_assert_lt(config_parse_duration("-1s", &ms), 0);
	cr_assert_lt(config_parse_duration("5 s", &ms), 0);
	cr_assert_lt(config_parse_duration("5x", &ms), 0);
	cr_assert_lt(config_parse_duration("s", &ms), 0);
	cr_assert_lt(config_parse_duration("0.0001", &ms), 0);
	cr_assert_lt(config_parse_duration("99999999999999999999d", &ms), 0);
	cr_assert_eq(ms, 42, "output written on failure");

	config_format_duration(0, buf, sizeof(buf));
	cr_assert_str_eq(buf, "0");
	config_format_duration(1500, buf, sizeof(buf));
	cr_assert_str_eq(buf, "1500ms");
	config_format_duration(30000, buf, sizeof(buf));
	cr_assert_str_eq(buf, "30s");
	config_format_duration(300000, buf, sizeof(buf));
	cr_assert_str_eq(buf, "5m");
	config_format_duration(7200000, buf, sizeof(buf));
	cr_assert_str_eq(buf, "2h");
	config_format_duration(604800000, buf, sizeof(buf));
	cr_assert_str_eq(buf, "7d");
	config_format_duration(90000, buf, sizeof(buf));
	cr_assert_str_eq(buf, "90s");
	/* round trip */
	cr_assert_eq(config_parse_duration(buf, &ms), 0);
	cr_assert_eq(ms, 90000);
}

Test(config, identifiers)
{
	char long63[64], long64[65];

	memset(long63, 'a', 63);
	long63[63] = '\0';
	memset(long64, 'a', 64);
	long64[64] = '\0';
	cr_assert(identifier_valid("outbox"));
	cr_assert(identifier_valid("_Outbox_2"));
	cr_assert(identifier_valid("app.outbox"));
	cr_assert(identifier_valid(long63));
	cr_assert_not(identifier_valid(long64));
	cr_assert_not(identifier_valid(""));
	cr_assert_not(identifier_valid("2outbox"));
	cr_assert_not(identifier_valid("out-box"));
	cr_assert_not(identifier_valid("outbox;drop table x"));
	cr_assert_not(identifier_valid("\"outbox\""));
	cr_assert_not(identifier_valid("a.b.c"));
	cr_assert_not(identifier_valid("app."));
	cr_assert_not(identifier_valid(".outbox"));
	cr_assert_not(identifier_valid(NULL));
}

static const char *redact(const char *in)
{
	static char buf[256];

	config_redact(in, buf, sizeof(buf));
	return buf;
}

Test(config, redaction)
{
	char small[8];

	cr_assert_str_eq(redact("amqp://u:secret@h/"), "amqp://u:***@h/");
	cr_assert_str_eq(redact("amqps://u:p%40ss@broker:5671/vh"), "amqps://u:***@broker:5671/vh");
	cr_assert_str_eq(redact("postgresql://app:s3@cr3t@db/app"), "postgresql://app:***@db/app");
	cr_assert_str_eq(redact("postgresql://app@db/app?password=x&sslmode=require"),
	                 "postgresql://app@db/app?password=***&sslmode=require");
	cr_assert_str_eq(redact("amqp://guest@localhost:5672"), "amqp://guest@localhost:5672");
	cr_assert_str_eq(redact("amqp://localhost"), "amqp://localhost");
	cr_assert_str_eq(redact("host=x password=secret"), "host=x password=***");
	cr_assert_str_eq(redact("host=x password = 'se cr\\'et' dbname=app"),
	                 "host=x password = *** dbname=app");
	cr_assert_str_eq(redact("password=a user=b"), "password=*** user=b");
	cr_assert_str_eq(redact("host=x user=app"), "host=x user=app");
	cr_assert_str_eq(redact(""), "");
	/* truncated output stays terminated and never shows the password */
	config_redact("amqp://user:secret@h", small, sizeof(small));
	cr_assert_eq(strlen(small), 7);
}

Test(config, value_text_redacts_and_formats)
{
	const char *sets[] = { "database.url=host=db password=hunter2",
		               "amqp.url=amqp://relay:hunter2@b:5672", "relay.lease=90s",
		               "relay.ordering=skip-dead" };
	char buf[256];
	bool seen_secret = false;

	cr_assert_not_null(load(NULL, NULL, sets, 4));
	cr_assert_str_eq(value((size_t)config_key_index("database.url")), "host=db password=***");
	cr_assert_str_eq(value((size_t)config_key_index("amqp.url")), "amqp://relay:***@b:5672");
	cr_assert_str_eq(value((size_t)config_key_index("relay.lease")), "90s");
	cr_assert_str_eq(value((size_t)config_key_index("relay.ordering")), "skip-dead");
	cr_assert_str_eq(value((size_t)config_key_index("amqp.tls.verify_peer")), "true");
	cr_assert_str_eq(value((size_t)config_key_index("relay.batch_size")), "500");
	cr_assert_str_eq(value((size_t)config_key_index("log.format")), "text");
	for (size_t i = 0; i < config_key_count(); i++) {
		config_value_text(cfg, i, buf, sizeof(buf));
		if (strstr(buf, "hunter2"))
			seen_secret = true;
	}
	cr_assert_not(seen_secret);
}

/* Every row of the key table stands on its own: named, documented, with a default, a field
 * of its own (cross-key rules and enums find keys by field, never by name) and sane bounds. */
Test(config, key_rows_are_complete)
{
	for (size_t i = 0; i < config_key_count(); i++) {
		const struct config_key *k = config_key_at(i);

		cr_assert_not_null(k->name);
		cr_assert_not_null(k->env, "%s", k->name);
		cr_assert_not_null(k->help, "%s", k->name);
		cr_assert((k->def != NULL) != (k->default_fn != NULL), "%s: one default", k->name);
		cr_assert_eq(config_key_by_field(k->field), i, "%s: field shared", k->name);
		cr_assert_leq(k->min, k->max, "%s", k->name);
		cr_assert_eq(k->choices != NULL, k->type == CONFIG_ENUM, "%s: choices", k->name);
		cr_assert(k->check == CONFIG_CHECK_NONE || k->type == CONFIG_STRING, "%s", k->name);
		if (k->type == CONFIG_INT || k->type == CONFIG_DURATION || k->type == CONFIG_SIZE)
			cr_assert_gt(k->max, 0, "%s: no bounds", k->name);
	}
}

Test(config, enum_values_round_trip)
{
	const char *sets[] = { "log.level=error", "log.format=json", "relay.ordering=skip-dead" };

	cr_assert_not_null(load(NULL, NULL, sets, 3));
	cr_assert_eq(cfg->log_level, CONFIG_LOG_ERROR);
	cr_assert_eq(cfg->log_format, CONFIG_LOG_JSON);
	cr_assert_eq(cfg->relay_ordering, CONFIG_ORDERING_SKIP_DEAD);
	cr_assert_str_eq(value((size_t)config_key_index("log.level")), "error");
	cr_assert_str_eq(value((size_t)config_key_index("log.format")), "json");
	cr_assert_str_eq(value((size_t)config_key_index("relay.ordering")), "skip-dead");
}

static void expect_no_leak(const char *secret)
{
	for (size_t i = 0; i < errs.n; i++)
		cr_assert_null(strstr(errs.lines[i], secret), "leaked %s: %s", secret,
		               errs.lines[i]);
}

/* {"database": "postgresql://..."}: a URL where a section goes is not printed. */
Test(config, section_given_a_secret_string)
{
	cr_assert_null(load(fixture("section_secret.json"), NULL, NULL, 0));
	cr_assert_eq(errs.n, 2);
	expect_error("database: got a string (file ");
	expect_error("section_secret.json:2); allowed: an object holding database.* keys");
	expect_error("amqp: got a string (file ");
	expect_no_leak("S3cret");
	expect_no_leak("relay:");
}

/* jansson quotes the token it stopped at, which here is half a password. */
Test(config, json_syntax_error_does_not_quote_the_value)
{
	cr_assert_null(load(fixture("syntax_secret.json"), NULL, NULL, 0));
	cr_assert_eq(errs.n, 1);
	expect_error("syntax_secret.json:3:");
	expect_error("invalid JSON: invalid escape");
	expect_no_leak("S3cr");
}

Test(config, names_that_hold_values_are_not_echoed)
{
	const char *env[] = { "OUTBOX_X:S3cretEnv@h=1", NULL };
	const char *sets[] = { "amqp.url amqp://relay:S3cretSet@mq", "amqp://u:S3cretKey@mq=1",
		               "relay.batch_sise=5" };

	cr_assert_null(load(fixture("key_secret.json"), env, sets, 3));
	expect_no_leak("S3cret");
	expect_error("(a name not shown: it holds characters no key has): unknown key (file ");
	expect_error("key_secret.json:2)");
	expect_error("unknown configuration variable");
	expect_error("--set argument 1: missing '='");
	expect_error(
	        "(a name not shown: it holds characters no key has): unknown key (flag --set)");
	/* a plain typo is still named */
	expect_error("relay.batch_sise: unknown key (flag --set)");
	/* a number for a URL is shown through the redactor, which masks what it cannot read */
	expect_error("database.url: got \"***\" (file ");
	expect_no_leak("12345678");
}

Test(config, bad_secret_values_are_shown_redacted)
{
	const char *env[] = { "OUTBOX_AMQP_URL=ampq://relay:S3cretMq@mq:5672/%2f", NULL };
	const char *sets[] = { "amqp.tls.verify_peer=S3cretNot" };

	cr_assert_null(load(NULL, env, sets, 1));
	expect_error("amqp.url: got \"ampq://relay:***@mq:5672/%2f\" (env OUTBOX_AMQP_URL)");
	expect_no_leak("S3cretMq");
	/* keys that hold no secret show their value as given */
	expect_error("amqp.tls.verify_peer: got \"S3cretNot\"");
}

Test(config, reserved_words_are_refused_with_the_reason)
{
	const char *sets[] = { "database.table=user", "database.channel=Select" };
	const char *env[] = { "OUTBOX_DATABASE_TABLE=app.order", NULL };

	cr_assert_null(load(NULL, NULL, sets, 2));
	cr_assert_eq(errs.n, 2);
	expect_error("database.table: got \"user\" (flag --set): 'user' is a reserved word in "
	             "PostgreSQL; allowed: an SQL identifier");
	expect_error("database.channel: got \"Select\" (flag --set): 'Select' is a reserved word "
	             "in PostgreSQL; allowed:");
	teardown();
	cr_assert_null(load(NULL, env, NULL, 0));
	expect_error("'order' is a reserved word in PostgreSQL");
}

Test(config, sizes_both_ways)
{
	static const struct {
		const char *text;
		int64_t bytes;
	} ok[] = {
		{ "0", 0 },
		{ "65536", 65536 },
		{ "512KiB", 512 * 1024 },
		{ "512k", 512 * 1024 },
		{ "512K", 512 * 1024 },
		{ "16MiB", 16 * 1024 * 1024 },
		{ "16m", 16 * 1024 * 1024 },
		{ "16M", 16 * 1024 * 1024 },
		{ "1GiB", 1024 * 1024 * 1024 },
		{ "1g", 1024 * 1024 * 1024 },
		{ "3G", 3LL * 1024 * 1024 * 1024 },
	};
	static const char *const bad[] = {
		"",
		"KiB",
		"16MB",
		"16mib",
		"1.5MiB",
		"-1",
		" 64KiB",
		"64 KiB",
		"0x10000",
		"16Mi",
		"16MiBs",
		"99999999999999999999",
		"9999999999999999999G",
	};
	int64_t v;
	char buf[32];

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		v = -1;
		cr_assert_eq(config_parse_size(ok[i].text, &v), 0, "%s refused", ok[i].text);
		cr_assert_eq(v, ok[i].bytes, "%s", ok[i].text);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		v = 42;
		cr_assert_lt(config_parse_size(bad[i], &v), 0, "%s accepted", bad[i]);
		cr_assert_eq(v, 42, "output written on failure");
	}
	config_format_size(16 * 1024 * 1024, buf, sizeof(buf));
	cr_assert_str_eq(buf, "16MiB");
	config_format_size(65536, buf, sizeof(buf));
	cr_assert_str_eq(buf, "64KiB");
	config_format_size(1024 * 1024 * 1024, buf, sizeof(buf));
	cr_assert_str_eq(buf, "1GiB");
	config_format_size(100000, buf, sizeof(buf));
	cr_assert_str_eq(buf, "100000");
	config_format_size(1536, buf, sizeof(buf));
	cr_assert_str_eq(buf, "1536");
	config_format_size(0, buf, sizeof(buf));
	cr_assert_str_eq(buf, "0");
}

Test(config, batch_max_bytes_from_every_source)
{
	const char *env[] = { "OUTBOX_RELAY_BATCH_MAX_BYTES=512KiB", NULL };
	const char *sets[] = { "relay.batch_max_bytes=1g" };
	size_t i = (size_t)config_key_index("relay.batch_max_bytes");

	cr_assert_str_eq(config_key_env(i), "OUTBOX_RELAY_BATCH_MAX_BYTES");
	cr_assert_not_null(load(NULL, env, NULL, 0));
	cr_assert_eq(cfg->relay_batch_max_bytes, 512 * 1024);
	cr_assert_str_eq(value(i), "512KiB");
	teardown();
	cr_assert_not_null(load(NULL, env, sets, 1));
	cr_assert_eq(cfg->relay_batch_max_bytes, 1024 * 1024 * 1024);
	cr_assert_str_eq(value(i), "1GiB");
	cr_assert_str_eq(source("relay.batch_max_bytes"), "flag --set");
	teardown();
	cr_assert_not_null(load(fixture("sizes.json"), NULL, NULL, 0));
	cr_assert_eq(cfg->relay_batch_max_bytes, 131072); /* a JSON number is bytes */
	cr_assert_str_eq(value(i), "128KiB");
}

Test(config, batch_max_bytes_range)
{
	const char *sets[] = { "relay.batch_max_bytes=63KiB" };
	const char *env[] = { "OUTBOX_RELAY_BATCH_MAX_BYTES=2GiB", NULL };
	const char *bad[] = { "relay.batch_max_bytes=16MB" };
	const char *lo[] = { "relay.batch_max_bytes=64KiB" };

	cr_assert_null(load(NULL, env, sets, 1));
	cr_assert_eq(errs.n, 2);
	expect_error("relay.batch_max_bytes: got \"2GiB\" (env OUTBOX_RELAY_BATCH_MAX_BYTES); "
	             "allowed: a size 64KiB..1GiB: bytes, or a whole number with KiB, MiB or GiB");
	expect_error("relay.batch_max_bytes: got \"63KiB\" (flag --set)");
	teardown();
	cr_assert_null(load(NULL, NULL, bad, 1));
	expect_error("relay.batch_max_bytes: got \"16MB\" (flag --set)");
	teardown();
	cr_assert_not_null(load(NULL, NULL, lo, 1));
	cr_assert_eq(cfg->relay_batch_max_bytes, 65536);
}

Test(config, amqp_url_list)
{
	const char *sets[] = { "amqp.url=amqp://relay:S3cretA@mq1:5672,amqps://"
		               "relay:S3cretB@mq2:5671/vh,amqp://mq3" };
	size_t i = (size_t)config_key_index("amqp.url");

	cr_assert_not_null(load(NULL, NULL, sets, 1));
	cr_assert_str_eq(cfg->amqp_url, sets[0] + strlen("amqp.url="));
	cr_assert_str_eq(value(i),
	                 "amqp://relay:***@mq1:5672,amqps://relay:***@mq2:5671/vh,amqp://mq3");
}

Test(config, amqp_url_list_errors_name_the_url_by_position)
{
	static const struct {
		const char *set;
		const char *error;
	} cases[] = {
		{ "amqp.url=amqp://relay:S3cret@mq1,http://relay:S3cret@mq2",
		  "amqp.url: got \"amqp://relay:***@mq1,http://relay:***@mq2\" (flag --set): URL 2 "
		  "of 2 does not start with amqp:// or amqps://" },
		{ "amqp.url=amqp://mq1,,amqp://mq3", "URL 2 of 3 is empty" },
		{ "amqp.url=amqp://mq1,", "URL 2 of 2 is empty" },
		{ "amqp.url=amqp://mq1, ,amqp://mq2", "URL 2 of 3 is empty" },
		{ "amqp.url=amqp://mq1, mq2", "URL 2 of 2 does not start with amqp://" },
		{ "amqp.url=amqp://relay:S3,cret@mq1", "URL 2 of 2 does not start with amqp:// or "
		                                       "amqps:// (a comma inside a URL is written "
		                                       "%2C)" },
		{ "amqp.url=", "amqp.url: got \"\" (flag --set); allowed: a URL starting with" },
	};

	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		const char *sets[] = { cases[k].set };

		cr_assert_null(load(NULL, NULL, sets, 1), "%s accepted", cases[k].set);
		cr_assert_eq(errs.n, 1);
		expect_error(cases[k].error);
		for (size_t j = 0; j < errs.n; j++) {
			cr_assert_null(strstr(errs.lines[j], "S3"), "leaked: %s", errs.lines[j]);
			cr_assert_null(strstr(errs.lines[j], "cret"), "leaked: %s", errs.lines[j]);
		}
		teardown();
	}
}
