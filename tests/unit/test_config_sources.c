/* Unit tests of the named sources in config/: the file's "sources", OUTBOX_SOURCES and its
 * variables, --set sources.NAME.KEY, precedence and inheritance, provenance, and every error
 * with its location; `config show` and `config check` run the relay binary (no server).
 * Fixtures are in tests/data/config (sources*.json). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "config/config.h"
#include "tests/support/harness.h"

static struct config_errors errs;
static struct config *cfg;

static void teardown(void)
{
	config_free(cfg);
	cfg = NULL;
	config_errors_clear(&errs);
}

TestSuite(config_sources, .fini = teardown);

/* Path of a fixture; static buffer, valid until the next call. */
static const char *fixture(const char *name)
{
	static char path[4096];
	const char *dir = getenv("RELAY_TEST_DATA");

	cr_assert_not_null(dir, "RELAY_TEST_DATA must point at tests/data");
	snprintf(path, sizeof(path), "%s/config/%s", dir, name);
	return path;
}

/* "file <fixture path>:<line>", as a provenance or inside an error line. */
static const char *at(const char *name, int line)
{
	static char buf[4200];

	snprintf(buf, sizeof(buf), "file %s:%d", fixture(name), line);
	return buf;
}

/* Refuses any amqp.url holding "refused", as broker_check_url refuses what it cannot read. */
static int check_url(const char *url, char *why, size_t n)
{
	if (!strstr(url, "refused"))
		return 0;
	snprintf(why, n, "the client refuses it");
	return 1;
}

static struct config *load(const char *file, const char *const *env, const char *const *sets,
                           size_t nsets)
{
	static const char *const no_env[] = { NULL };
	struct config_sources src = { file, sets, nsets, env ? env : no_env, check_url };

	cfg = config_load(&src, &errs);
	return cfg;
}

static void dump_errors(void)
{
	for (size_t i = 0; i < errs.n; i++)
		cr_log_info("error: %s", errs.lines[i]);
}

/* The one error line that is exactly want. */
static void expect_line(const char *want)
{
	for (size_t i = 0; i < errs.n; i++) {
		if (strcmp(errs.lines[i], want) == 0)
			return;
	}
	dump_errors();
	cr_assert_fail("no error line is: %s", want);
}

static void expect_error(const char *needle)
{
	for (size_t i = 0; i < errs.n; i++) {
		if (strstr(errs.lines[i], needle))
			return;
	}
	dump_errors();
	cr_assert_fail("no error line contains: %s", needle);
}

static size_t errors_containing(const char *needle)
{
	size_t n = 0;

	for (size_t i = 0; i < errs.n; i++)
		n += strstr(errs.lines[i], needle) != NULL;
	return n;
}

static struct config *source_named(const char *name)
{
	cr_assert_not_null(cfg);
	for (size_t s = 0; s < cfg->n_named; s++) {
		if (strcmp(cfg->named[s]->source_name, name) == 0)
			return cfg->named[s];
	}
	cr_assert_fail("no source named %s", name);
	return NULL;
}

static const char *value_of(const struct config *c, const char *key)
{
	static char buf[512];
	int i = config_key_index(key);

	cr_assert_geq(i, 0, "unknown key %s", key);
	config_value_text(c, (size_t)i, buf, sizeof(buf));
	return buf;
}

static const char *source_of(const struct config *c, const char *key)
{
	int i = config_key_index(key);

	cr_assert_geq(i, 0, "unknown key %s", key);
	return c->sources[i];
}

static struct config *load_ok(const char *file, const char *const *env, const char *const *sets,
                              size_t nsets)
{
	if (!load(file, env, sets, nsets))
		dump_errors();
	cr_assert_not_null(cfg, "config_load failed with %zu errors", errs.n);
	return cfg;
}

Test(config_sources, file_names_sources_in_order_and_they_inherit)
{
	struct config *orders, *billing;
	char want[4300];

	load_ok(fixture("sources.json"), NULL, NULL, 0);
	cr_assert_str_eq(cfg->source_name, "");
	cr_assert_eq(cfg->n_named, 2);
	cr_assert_str_eq(cfg->named[0]->source_name, "orders");
	cr_assert_str_eq(cfg->named[1]->source_name, "billing_eu");
	orders = source_named("orders");
	billing = source_named("billing_eu");
	cr_assert_eq(orders->n_named, 0);
	cr_assert_null(orders->named);

	cr_assert_str_eq(orders->database_url, "postgresql://relay:secret@db1/orders");
	cr_assert_str_eq(source_of(orders, "database.url"), at("sources.json", 6));
	cr_assert_str_eq(orders->database_table, "outbox");
	cr_assert_str_eq(source_of(orders, "database.table"), "top level: default");
	cr_assert_str_eq(orders->amqp_url, "amqp://guest:guest@rabbit:5672/");
	snprintf(want, sizeof(want), "top level: %s", at("sources.json", 2));
	cr_assert_str_eq(source_of(orders, "amqp.url"), want);
	cr_assert_eq(orders->relay_batch_size, 200);
	snprintf(want, sizeof(want), "top level: %s", at("sources.json", 3));
	cr_assert_str_eq(source_of(orders, "relay.batch_size"), want);
	cr_assert_str_eq(orders->relay_id, cfg->relay_id);

	cr_assert_str_eq(billing->database_url, "postgresql://relay@db2/billing");
	cr_assert_str_eq(billing->database_table, "billing_outbox");
	cr_assert_str_eq(source_of(billing, "database.table"), at("sources.json", 8));
	cr_assert_str_eq(billing->amqp_url, "amqp://guest:guest@rabbit:5672/billing");
	cr_assert_str_eq(source_of(billing, "amqp.url"), at("sources.json", 9));
	cr_assert_eq(billing->relay_batch_size, 50);
	cr_assert_str_eq(source_of(billing, "relay.batch_size"), at("sources.json", 10));

	/* The top level keeps its own values and the process-wide keys. */
	cr_assert_eq(cfg->relay_batch_size, 200);
	cr_assert_eq(cfg->log_level, CONFIG_LOG_DEBUG);
	cr_assert_str_eq(cfg->database_url, "");
}

Test(config_sources, value_text_on_a_named_snapshot_redacts_as_at_the_top)
{
	load_ok(fixture("sources.json"), NULL, NULL, 0);
	cr_assert_str_eq(value_of(source_named("orders"), "database.url"),
	                 "postgresql://relay:***@db1/orders");
	cr_assert_str_eq(value_of(source_named("billing_eu"), "relay.batch_size"), "50");
	cr_assert_str_eq(value_of(source_named("orders"), "relay.lease"), "1m");
}

Test(config_sources, environment_names_sources_and_sets_their_keys)
{
	const char *env[] = {
		"OUTBOX_SOURCES= orders , billing ",
		"OUTBOX_SOURCES_ORDERS_DATABASE_URL=postgresql://relay@db1/orders",
		"OUTBOX_SOURCES_BILLING_AMQP_URL=amqp://guest:guest@rabbit:5672/billing",
		"OUTBOX_SOURCES_BILLING_DATABASE_TABLE=billing_outbox",
		"OUTBOX_AMQP_URL=amqp://guest:guest@rabbit:5672/",
		NULL
	};

	load_ok(NULL, env, NULL, 0);
	cr_assert_eq(cfg->n_named, 2);
	cr_assert_str_eq(cfg->named[0]->source_name, "orders");
	cr_assert_str_eq(cfg->named[1]->source_name, "billing");
	cr_assert_str_eq(source_named("orders")->database_url, "postgresql://relay@db1/orders");
	cr_assert_str_eq(source_of(source_named("orders"), "database.url"),
	                 "env OUTBOX_SOURCES_ORDERS_DATABASE_URL");
	cr_assert_str_eq(source_of(source_named("orders"), "amqp.url"),
	                 "top level: env OUTBOX_AMQP_URL");
	cr_assert_str_eq(source_named("billing")->amqp_url,
	                 "amqp://guest:guest@rabbit:5672/billing");
	cr_assert_str_eq(source_of(source_named("billing"), "amqp.url"),
	                 "env OUTBOX_SOURCES_BILLING_AMQP_URL");
	cr_assert_str_eq(source_named("billing")->database_table, "billing_outbox");
}

Test(config_sources, file_form_of_a_source_variable_reads_a_secret)
{
	char plain[4300], file[4100], want[4300];
	const char *env[] = { "OUTBOX_SOURCES=orders", plain, NULL };

	snprintf(file, sizeof(file), "%s", fixture("secret.txt"));
	snprintf(plain, sizeof(plain), "OUTBOX_SOURCES_ORDERS_DATABASE_URL_FILE=%s", file);
	load_ok(NULL, env, NULL, 0);
	cr_assert_str_eq(source_named("orders")->database_url, "pa ss");
	snprintf(want, sizeof(want), "env OUTBOX_SOURCES_ORDERS_DATABASE_URL_FILE (%s)", file);
	cr_assert_str_eq(source_of(source_named("orders"), "database.url"), want);
	cr_assert_str_eq(cfg->database_url, "");
}

Test(config_sources, a_key_variable_ending_in_file_is_the_key_not_a_secret)
{
	const char *env[] = { "OUTBOX_SOURCES=orders",
		              "OUTBOX_SOURCES_ORDERS_AMQP_TLS_CA_FILE=/etc/ssl/ca.pem", NULL };

	load_ok(NULL, env, NULL, 0);
	cr_assert_str_eq(source_named("orders")->amqp_tls_ca_file, "/etc/ssl/ca.pem");
}

Test(config_sources, set_names_a_source_and_sets_its_key)
{
	const char *sets[] = { "sources.orders.relay.batch_size=9",
		               "sources.orders.database.url=postgresql://relay@db1/orders",
		               "relay.batch_size=300" };

	load_ok(NULL, NULL, sets, 3);
	cr_assert_eq(cfg->n_named, 1);
	cr_assert_eq(source_named("orders")->relay_batch_size, 9);
	cr_assert_str_eq(source_of(source_named("orders"), "relay.batch_size"), "flag --set");
	cr_assert_eq(source_named("orders")->relay_workers, 1);
	cr_assert_str_eq(source_of(source_named("orders"), "relay.workers"), "top level: default");
	cr_assert_eq(cfg->relay_batch_size, 300);
}

Test(config_sources, naming_order_is_file_then_environment_then_set)
{
	const char *env[] = { "OUTBOX_SOURCES=from_env,orders", NULL };
	const char *sets[] = { "sources.from_set.database.table=t3",
		               "sources.from_env.database.table=t2" };

	load_ok(fixture("sources.json"), env, sets, 2);
	cr_assert_eq(cfg->n_named, 4);
	cr_assert_str_eq(cfg->named[0]->source_name, "orders");
	cr_assert_str_eq(cfg->named[1]->source_name, "billing_eu");
	cr_assert_str_eq(cfg->named[2]->source_name, "from_env");
	cr_assert_str_eq(cfg->named[3]->source_name, "from_set");
}

Test(config_sources, precedence_within_a_source_file_then_environment_then_set)
{
	const char *env[] = { "OUTBOX_SOURCES_BILLING_EU_RELAY_BATCH_SIZE=7",
		              "OUTBOX_SOURCES_BILLING_EU_RELAY_MAX_ATTEMPTS=4",
		              "OUTBOX_SOURCES_ORDERS_RELAY_MAX_ATTEMPTS=5", NULL };
	const char *sets[] = { "sources.billing_eu.relay.batch_size=9" };
	struct config *billing;

	load_ok(fixture("sources.json"), env, sets, 1);
	billing = source_named("billing_eu");
	cr_assert_eq(billing->relay_batch_size, 9); /* file 50 < env 7 < --set 9 */
	cr_assert_str_eq(source_of(billing, "relay.batch_size"), "flag --set");
	cr_assert_eq(billing->relay_max_attempts, 4); /* env over the top level's default */
	cr_assert_str_eq(source_of(billing, "relay.max_attempts"),
	                 "env OUTBOX_SOURCES_BILLING_EU_RELAY_MAX_ATTEMPTS");
	cr_assert_eq(source_named("orders")->relay_max_attempts, 5);
	cr_assert_eq(cfg->relay_max_attempts, 10);
}

Test(config_sources, environment_over_file_within_a_source)
{
	const char *env[] = { "OUTBOX_SOURCES_BILLING_EU_RELAY_BATCH_SIZE=7", NULL };

	load_ok(fixture("sources.json"), env, NULL, 0);
	cr_assert_eq(source_named("billing_eu")->relay_batch_size, 7);
	cr_assert_str_eq(source_of(source_named("billing_eu"), "relay.batch_size"),
	                 "env OUTBOX_SOURCES_BILLING_EU_RELAY_BATCH_SIZE");
}

Test(config_sources, a_source_value_beats_every_layer_of_the_top_level)
{
	const char *env[] = { "OUTBOX_RELAY_BATCH_SIZE=400", NULL };
	const char *sets[] = { "relay.batch_size=300" };
	char want[4300];

	load_ok(fixture("sources.json"), env, sets, 1);
	cr_assert_eq(cfg->relay_batch_size, 300);
	/* billing_eu's file value (the lowest layer) wins over the top level's --set. */
	cr_assert_eq(source_named("billing_eu")->relay_batch_size, 50);
	cr_assert_str_eq(source_of(source_named("billing_eu"), "relay.batch_size"),
	                 at("sources.json", 10));
	/* orders gave none: the top level's effective value, after all its layers. */
	cr_assert_eq(source_named("orders")->relay_batch_size, 300);
	cr_assert_str_eq(source_of(source_named("orders"), "relay.batch_size"),
	                 "top level: flag --set");
	snprintf(want, sizeof(want), "top level: %s", at("sources.json", 2));
	cr_assert_str_eq(source_of(source_named("orders"), "amqp.url"), want);
}

Test(config_sources, names_with_underscores_match_the_longest_name_first)
{
	const char *env[] = { "OUTBOX_SOURCES=a,a_b,a_relay",
		              "OUTBOX_SOURCES_A_B_RELAY_WORKERS=3",
		              "OUTBOX_SOURCES_A_RELAY_WORKERS=2",
		              "OUTBOX_SOURCES_A_RELAY_DATABASE_TABLE=t_relay",
		              "OUTBOX_SOURCES_A_B_DATABASE_TABLE=t_b",
		              NULL };

	load_ok(NULL, env, NULL, 0);
	cr_assert_eq(source_named("a_b")->relay_workers, 3);
	/* a_relay + WORKERS names no key: the variable is a's RELAY_WORKERS. */
	cr_assert_eq(source_named("a")->relay_workers, 2);
	cr_assert_eq(source_named("a_relay")->relay_workers, 1);
	cr_assert_str_eq(source_named("a_relay")->database_table, "t_relay");
	cr_assert_str_eq(source_named("a_b")->database_table, "t_b");
	cr_assert_str_eq(source_named("a")->database_table, "outbox");
}

Test(config_sources, no_sources_is_the_top_level_alone)
{
	struct config *plain;
	const char *sets[] = { "relay.batch_size=100", "relay.workers=2", "relay.max_attempts=3" };

	load_ok(fixture("sources_empty.json"), NULL, NULL, 0);
	cr_assert_eq(cfg->n_named, 0);
	cr_assert_null(cfg->named);
	cr_assert_str_eq(cfg->source_name, "");
	plain = cfg;
	cfg = NULL;
	load_ok(NULL, NULL, sets, 3);
	for (size_t i = 0; i < config_key_count(); i++) {
		char a[512], b[512];

		config_value_text(plain, i, a, sizeof(a));
		config_value_text(cfg, i, b, sizeof(b));
		if (strcmp(config_key_name(i), "relay.id") != 0)
			cr_assert_str_eq(a, b, "%s", config_key_name(i));
	}
	config_free(plain);
	config_free(cfg);
	cfg = NULL;
	load_ok(NULL, NULL, NULL, 0);
	cr_assert_eq(cfg->n_named, 0);
	cr_assert_str_eq(cfg->source_name, "");
}

Test(config_sources, every_error_of_the_file_at_once_with_its_line)
{
	const char *f = "sources_errors.json";
	char want[9000], lease_at[4200];

	cr_assert_null(load(fixture(f), NULL, NULL, 0));
	snprintf(want, sizeof(want),
	         "sources.orders.relay.batch_size: got \"0\" (%s); allowed: an integer 1..10000",
	         at(f, 5));
	expect_line(want);
	snprintf(want, sizeof(want),
	         "sources.orders.log.level: a process-wide key (%s); allowed: set it at the top "
	         "level",
	         at(f, 6));
	expect_line(want);
	snprintf(want, sizeof(want),
	         "sources.orders.http.listen: a process-wide key (%s); allowed: set it at the "
	         "top level",
	         at(f, 7));
	expect_line(want);
	snprintf(want, sizeof(want),
	         "sources.orders.relay.bogus: unknown key (%s); allowed: a key listed by "
	         "`outbox-relay config show`",
	         at(f, 8));
	expect_line(want);
	snprintf(want, sizeof(want),
	         "sources.Bad-Name: not a source name (%s); allowed: [a-z][a-z0-9_]*, at most "
	         "32 bytes",
	         at(f, 10));
	expect_line(want);
	snprintf(want, sizeof(want),
	         "sources.scalar: got a number (%s); allowed: an object of the source's "
	         "sections and keys",
	         at(f, 11));
	expect_line(want);
	/* twin's own confirm timeout against the lease it inherits. */
	snprintf(lease_at, sizeof(lease_at), "%s", at(f, 2));
	snprintf(want, sizeof(want),
	         "sources.twin.relay.lease: got \"60s\" (top level: %s); allowed: more than "
	         "amqp.confirm_timeout, which is 90s (%s)",
	         lease_at, at(f, 12));
	expect_line(want);
	expect_line("sources.scalar: same database.url (top level: default) and database.table "
	            "(top level: default) as sources.orders; allowed: one source per table of a "
	            "database");
	expect_error("sources.twin: same database.url");
	cr_assert_eq(errs.n, 9, "got %zu errors", errs.n);
}

Test(config_sources, sources_must_be_an_object)
{
	char want[4300];

	cr_assert_null(load(fixture("sources_not_object.json"), NULL, NULL, 0));
	snprintf(want, sizeof(want),
	         "sources: got an array (%s); allowed: an object mapping each source's name to "
	         "an object of its keys",
	         at("sources_not_object.json", 2));
	expect_line(want);
	cr_assert_eq(errs.n, 1);
}

Test(config_sources, bad_names_from_the_environment_and_set)
{
	const char *env[] = { "OUTBOX_SOURCES=orders,,9lives,Orders", NULL };
	const char *sets[] = { "sources.has-dash.relay.workers=2", "sources.nokey=1",
		               "sources.a23456789012345678901234567890123.relay.workers=2" };

	cr_assert_null(load(NULL, env, sets, 3));
	expect_line("sources: name 2 of 4 is empty (env OUTBOX_SOURCES); allowed: source names "
	            "separated by commas");
	expect_line("sources.9lives: not a source name (env OUTBOX_SOURCES); allowed: "
	            "[a-z][a-z0-9_]*, at most 32 bytes");
	expect_line("sources.Orders: not a source name (env OUTBOX_SOURCES); allowed: "
	            "[a-z][a-z0-9_]*, at most 32 bytes");
	expect_line("sources.has-dash: not a source name (flag --set); allowed: "
	            "[a-z][a-z0-9_]*, at most 32 bytes");
	expect_line("sources.a23456789012345678901234567890123: not a source name (flag --set); "
	            "allowed: [a-z][a-z0-9_]*, at most 32 bytes");
	expect_line("sources.nokey: no key (flag --set); allowed: sources.NAME.section.key=value");
	cr_assert_eq(errs.n, 6);
}

Test(config_sources, a_name_of_32_bytes_is_allowed)
{
	const char *sets[] = { "sources.a2345678901234567890123456789012.relay.workers=2" };

	load_ok(NULL, NULL, sets, 1);
	cr_assert_eq(source_named("a2345678901234567890123456789012")->relay_workers, 2);
}

Test(config_sources, more_than_the_maximum_of_sources)
{
	char list[1024] = "OUTBOX_SOURCES=";
	const char *env[] = { list, NULL };
	char want[256];

	for (int i = 0; i <= CONFIG_SOURCES_MAX; i++) {
		size_t len = strlen(list);

		snprintf(list + len, sizeof(list) - len, "%ss%d", i ? "," : "", i);
	}
	cr_assert_null(load(NULL, env, NULL, 0));
	snprintf(want, sizeof(want),
	         "sources.s%d: one source too many (env OUTBOX_SOURCES); allowed: at most %d "
	         "sources",
	         CONFIG_SOURCES_MAX, CONFIG_SOURCES_MAX);
	expect_line(want);
	cr_assert_eq(errors_containing("too many"), 1);
}

Test(config_sources, the_maximum_of_sources_loads)
{
	char list[1024] = "OUTBOX_SOURCES=";
	char vars[CONFIG_SOURCES_MAX][96];
	const char *env[CONFIG_SOURCES_MAX + 2] = { list };

	for (int i = 0; i < CONFIG_SOURCES_MAX; i++) {
		size_t len = strlen(list);

		snprintf(list + len, sizeof(list) - len, "%ss%d", i ? "," : "", i);
		snprintf(vars[i], sizeof(vars[i]), "OUTBOX_SOURCES_S%d_DATABASE_TABLE=t%d", i, i);
		env[i + 1] = vars[i];
	}
	load_ok(NULL, env, NULL, 0);
	cr_assert_eq(cfg->n_named, CONFIG_SOURCES_MAX);
	cr_assert_str_eq(source_named("s31")->database_table, "t31");
}

Test(config_sources, process_wide_keys_are_refused_in_every_form)
{
	const char *env[] = { "OUTBOX_SOURCES=orders", "OUTBOX_SOURCES_ORDERS_LOG_FORMAT=json",
		              NULL };
	const char *sets[] = { "sources.orders.http.listen=:9000" };

	cr_assert_null(load(NULL, env, sets, 1));
	expect_line("sources.orders.log.format: a process-wide key (env "
	            "OUTBOX_SOURCES_ORDERS_LOG_FORMAT); allowed: set it at the top level");
	expect_line("sources.orders.http.listen: a process-wide key (flag --set); allowed: set it "
	            "at the top level");
	cr_assert_eq(errs.n, 2);
}

Test(config_sources, unknown_source_variable_names_the_known_sources)
{
	const char *env[] = { "OUTBOX_SOURCES=orders,billing",
		              "OUTBOX_SOURCES_SHIPPING_DATABASE_URL=postgresql://x/y",
		              "OUTBOX_SOURCES_ORDERS_RELAY_BATCHSIZE=5",
		              "OUTBOX_SOURCES_BILLING_DATABASE_TABLE=billing", NULL };

	cr_assert_null(load(NULL, env, NULL, 0));
	expect_line("OUTBOX_SOURCES_SHIPPING_DATABASE_URL: unknown configuration variable (env "
	            "OUTBOX_SOURCES_SHIPPING_DATABASE_URL); allowed: OUTBOX_SOURCES_<NAME>_<KEY> "
	            "or its _FILE form, <NAME> a source that OUTBOX_SOURCES (or the file's "
	            "\"sources\", or --set sources.NAME.KEY) names, upper-cased, and <KEY> a "
	            "key's variable without OUTBOX_; sources known: orders, billing");
	expect_error("OUTBOX_SOURCES_ORDERS_RELAY_BATCHSIZE: unknown configuration variable");
	cr_assert_eq(errs.n, 2);
}

Test(config_sources, a_source_variable_without_sources_says_none_are_known)
{
	const char *env[] = { "OUTBOX_SOURCES_ORDERS_DATABASE_URL=postgresql://x/y", NULL };

	cr_assert_null(load(NULL, env, NULL, 0));
	expect_error("OUTBOX_SOURCES_ORDERS_DATABASE_URL: unknown configuration variable");
	expect_error("sources known: none");
	cr_assert_eq(errs.n, 1);
}

Test(config_sources, unknown_key_and_bad_value_under_a_source_from_set_and_env)
{
	const char *env[] = { "OUTBOX_SOURCES=orders", "OUTBOX_SOURCES_ORDERS_RELAY_WORKERS=0",
		              NULL };
	const char *sets[] = { "sources.orders.relay.nope=1",
		               "sources.orders.database.table=select" };

	cr_assert_null(load(NULL, env, sets, 2));
	expect_line("sources.orders.relay.nope: unknown key (flag --set); allowed: a key listed "
	            "by `outbox-relay config show`");
	expect_line("sources.orders.relay.workers: got \"0\" (env "
	            "OUTBOX_SOURCES_ORDERS_RELAY_WORKERS); allowed: an integer 1..64");
	expect_error("sources.orders.database.table: got \"select\" (flag --set): 'select' is a "
	             "reserved word");
	cr_assert_eq(errs.n, 3);
}

Test(config_sources, both_a_source_variable_and_its_file_form)
{
	char file[4200];
	const char *env[] = { "OUTBOX_SOURCES=orders", "OUTBOX_SOURCES_ORDERS_DATABASE_URL=x", file,
		              NULL };

	snprintf(file, sizeof(file), "OUTBOX_SOURCES_ORDERS_DATABASE_URL_FILE=%s",
	         fixture("secret.txt"));
	cr_assert_null(load(NULL, env, NULL, 0));
	expect_line("sources.orders.database.url: both OUTBOX_SOURCES_ORDERS_DATABASE_URL and "
	            "OUTBOX_SOURCES_ORDERS_DATABASE_URL_FILE are set (env); allowed: only one of "
	            "them");
	cr_assert_eq(errs.n, 1);
}

Test(config_sources, unreadable_file_form_names_the_source_variable)
{
	const char *env[] = { "OUTBOX_SOURCES=orders",
		              "OUTBOX_SOURCES_ORDERS_AMQP_URL_FILE=/nonexistent/amqp_url", NULL };

	cr_assert_null(load(NULL, env, NULL, 0));
	expect_line("sources.orders.amqp.url: could not read OUTBOX_SOURCES_ORDERS_AMQP_URL_FILE "
	            "\"/nonexistent/amqp_url\": No such file or directory (env "
	            "OUTBOX_SOURCES_ORDERS_AMQP_URL_FILE); allowed: a readable file holding the "
	            "value");
}

Test(config_sources, cross_key_rules_apply_per_source_and_once_for_the_top_level)
{
	const char *env[] = { "OUTBOX_SOURCES=orders,billing",
		              "OUTBOX_SOURCES_ORDERS_RELAY_RETRY_BACKOFF_MIN=10m",
		              "OUTBOX_SOURCES_BILLING_DATABASE_TABLE=billing", NULL };
	const char *sets[] = { "relay.lease=20s" };

	cr_assert_null(load(NULL, env, sets, 1));
	expect_line("sources.orders.relay.retry_backoff_min: got \"10m\" (env "
	            "OUTBOX_SOURCES_ORDERS_RELAY_RETRY_BACKOFF_MIN); allowed: at most "
	            "relay.retry_backoff_max, which is 5m (top level: default)");
	/* The top level's own lease error, once, not again for each source inheriting it. */
	expect_line("relay.lease: got \"20s\" (flag --set); allowed: more than "
	            "amqp.confirm_timeout, which is 30s (default)");
	cr_assert_eq(errors_containing("relay.lease"), 1);
	cr_assert_eq(errs.n, 2);
}

Test(config_sources, amqp_url_check_runs_for_a_source_own_url)
{
	const char *sets[] = { "sources.orders.amqp.url=amqp://refused@h/",
		               "sources.billing.database.table=billing" };

	cr_assert_null(load(NULL, NULL, sets, 2));
	expect_error("sources.orders.amqp.url: got \"amqp://refused");
	expect_error("(flag --set): the client refuses it");
	cr_assert_eq(errs.n, 1);
}

Test(config_sources, two_sources_on_one_table)
{
	const char *sets[] = { "sources.orders.database.url=postgresql://db1/app",
		               "sources.billing.database.url=postgresql://db1/app",
		               "sources.billing.database.table=outbox" };

	cr_assert_null(load(NULL, NULL, sets, 3));
	expect_line("sources.billing: same database.url (flag --set) and database.table (flag "
	            "--set) as sources.orders; allowed: one source per table of a database");
	cr_assert_eq(errs.n, 1);
}

Test(config_sources, one_database_two_tables_is_fine)
{
	const char *sets[] = { "sources.orders.database.url=postgresql://db1/app",
		               "sources.billing.database.url=postgresql://db1/app",
		               "sources.billing.database.table=billing_outbox",
		               "sources.billing.database.channel=billing" };

	load_ok(NULL, NULL, sets, 4);
	cr_assert_eq(cfg->n_named, 2);
	cr_assert_str_eq(source_named("billing")->database_channel, "billing");
}

/* Whether `config show` has a line for key ending in tail, in the part after heading ("" for
 * the top level), which ends at the next heading. */
static bool show_has(const char *out, const char *heading, const char *key, const char *tail)
{
	const char *line = *heading ? strstr(out, heading) : out;
	const char *end;

	if (!line)
		return false;
	line += strlen(heading);
	end = strstr(line, "\n[sources.");
	while (*line && (!end || line < end)) {
		size_t len = strcspn(line, "\n");

		if (strncmp(line, key, strlen(key)) == 0 && line[strlen(key)] == ' ' &&
		    len >= strlen(tail) &&
		    strncmp(line + len - strlen(tail), tail, strlen(tail)) == 0)
			return true;
		line += len + (line[len] == '\n');
	}
	return false;
}

Test(config_sources, config_show_prints_each_source_under_its_heading)
{
	struct harness_output o;
	const char *env[] = { "OUTBOX_SOURCES=orders,billing",
		              "OUTBOX_SOURCES_ORDERS_DATABASE_URL=postgresql://relay:secret@db1/o",
		              "OUTBOX_SOURCES_BILLING_DATABASE_TABLE=billing_outbox",
		              "OUTBOX_AMQP_URL=amqp://guest:guest@rabbit:5672/",
		              "OUTBOX_LOG_LEVEL=debug",
		              NULL };

	harness_cli_bare(&o, env, (const char *const[]){ "config", "show", NULL });
	cr_assert_eq(o.status, 0, "config show exited %d: %s", o.status, o.err);
	cr_expect(show_has(o.out, "", "log.level", "env OUTBOX_LOG_LEVEL"), "%s", o.out);
	cr_expect(show_has(o.out, "\n[sources.orders]\n", "database.url",
	                   "env OUTBOX_SOURCES_ORDERS_DATABASE_URL"),
	          "%s", o.out);
	cr_expect(strstr(o.out, "secret") == NULL, "a password shown: %s", o.out);
	cr_expect(show_has(o.out, "\n[sources.orders]\n", "amqp.url",
	                   "top level: env OUTBOX_AMQP_URL"),
	          "%s", o.out);
	cr_expect(show_has(o.out, "\n[sources.billing]\n", "database.table",
	                   "env OUTBOX_SOURCES_BILLING_DATABASE_TABLE"),
	          "%s", o.out);
	cr_expect(!show_has(o.out, "\n[sources.orders]\n", "log.level", ""),
	          "a process-wide key under a source: %s", o.out);
	cr_expect(!show_has(o.out, "\n[sources.billing]\n", "http.listen", ""),
	          "a process-wide key under a source: %s", o.out);
	harness_output_free(&o);
}

Test(config_sources, config_check_validates_every_source)
{
	struct harness_output o;
	const char *bad[] = { "OUTBOX_SOURCES=orders", "OUTBOX_SOURCES_ORDERS_RELAY_WORKERS=0",
		              NULL };
	const char *good[] = { "OUTBOX_SOURCES=orders", "OUTBOX_SOURCES_ORDERS_RELAY_WORKERS=2",
		               NULL };

	harness_cli_bare(&o, bad, (const char *const[]){ "config", "check", NULL });
	cr_expect_eq(o.status, 2, "config check exited %d", o.status);
	cr_expect(strstr(o.err, "sources.orders.relay.workers: got \"0\"") != NULL, "%s", o.err);
	harness_output_free(&o);
	harness_cli_bare(&o, good, (const char *const[]){ "config", "check", NULL });
	cr_expect_eq(o.status, 0, "config check exited %d: %s", o.status, o.err);
	cr_expect(strstr(o.out, "configuration ok: 1 source") != NULL, "%s", o.out);
	harness_output_free(&o);
}
