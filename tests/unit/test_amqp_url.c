/* amqp.url is read at start as the AMQP client will read it: a URL that can never connect (an
 * unescaped '/', '@', ':', '?' or '#' in a password, a port out of range, a vhost with a raw
 * '/') stops the start with one line naming the key, the source, the URL's position and what
 * to write instead, and never the password. `config check` and `run` exit 2 on it. Runs the
 * relay binary, needs no server. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/broker.h"
#include "config/config.h"
#include "tests/support/harness.h"

/* A password holding each character rabbitmq-c splits a URL at, and what the line says. */
static const struct {
	const char *url;
	const char *why;
} bad[] = {
	{ "amqp://relay:Se/cret@mq:5672",
	  "the password holds an unescaped '/': percent-encode it as %2F" },
	{ "amqp://relay:Se@cret@mq:5672",
	  "the password holds an unescaped '@': percent-encode it as %40" },
	{ "amqp://relay:Se:cret@mq:5672",
	  "the password holds an unescaped ':': percent-encode it as %3A" },
	{ "amqp://relay:Se?cret@mq:5672",
	  "the password holds an unescaped '?': percent-encode it as %3F" },
	{ "amqp://relay:Se#cret@mq:5672",
	  "the password holds an unescaped '#': percent-encode it as %23" },
	{ "amqp://relay:50%cret@mq", "the password holds a '%' that does not start a %XX escape" },
	{ "amqp://re/lay:Secret@mq", "the user name holds an unescaped '/'" },
	{ "amqp://mq:99999", "the port is not a number 1..65535" },
	{ "amqp://mq:0", "the port is not a number 1..65535" },
	{ "amqp://mq:56x2", "the port is not a number 1..65535" },
	{ "amqp://mq/orders/eu", "the vhost holds an unescaped '/': percent-encode it as %2F" },
	{ "amqp://mq/?heartbeat=10", "holds an unescaped '?' (the AMQP client takes no query" },
	{ "amqp://[::1:5672", "an IPv6 host is written in brackets" },
};

static const char *const good[] = {
	"amqp://guest:guest@localhost:5672",
	"amqp://relay:Se%2Fcret%40x%3A%3F%23@mq:5672/%2f",
	"amqps://relay:pw@[::1]:5671/orders",
	"amqp://mq",
	"amqp://mq/",
	"amqp://a:b@mq1:5672, amqps://c:d@mq2:5671",
};

Test(amqp_url, each_bad_url_says_what_is_wrong_without_the_password)
{
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char why[256] = "";

		cr_assert_eq(broker_check_url(bad[i].url, why, sizeof(why)), BROKER_ERR_CONFIG,
		             "%s was accepted", bad[i].url);
		cr_expect(strstr(why, bad[i].why) != NULL, "%s: got \"%s\", expected \"%s\"",
		          bad[i].url, why, bad[i].why);
		cr_expect(strstr(why, "cret") == NULL, "%s: the line shows the password: %s",
		          bad[i].url, why);
	}
}

Test(amqp_url, good_urls_pass)
{
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		char why[256] = "";

		cr_expect_eq(broker_check_url(good[i], why, sizeof(why)), BROKER_OK, "%s: %s",
		             good[i], why);
	}
}

Test(amqp_url, a_node_of_a_list_is_named_by_its_position)
{
	char why[256] = "";

	cr_assert_eq(broker_check_url("amqp://a:ok@mq1, amqp://relay:p@ss@mq2,amqp://mq3", why,
	                              sizeof(why)),
	             BROKER_ERR_CONFIG);
	cr_assert_str_eq(why,
	                 "URL 2 of 3: the password holds an unescaped '@': percent-encode it as "
	                 "%40");
}

/* config_load() with the AMQP client's reading, as relay/main.c builds it. */
Test(amqp_url, config_load_reports_the_key_the_source_and_what_is_wrong)
{
	static const char *const env[] = { "OUTBOX_AMQP_URL=amqp://relay:S3/cret@mq:5672", NULL };
	struct config_sources src = { NULL, NULL, 0, env, broker_check_url };
	struct config_errors errs = { 0 };
	struct config *c = config_load(&src, &errs);

	cr_assert_null(c, "a URL that can never connect was accepted");
	cr_assert_eq(errs.n, 1);
	cr_expect_str_eq(errs.lines[0],
	                 "amqp.url: got \"amqp://relay:***@mq:5672\" (env OUTBOX_AMQP_URL): the "
	                 "password holds an unescaped '/': percent-encode it as %2F");
	config_errors_clear(&errs);

	/* Without the check (config/ alone) only the scheme is looked at. */
	src.check_amqp_url = NULL;
	c = config_load(&src, &errs);
	cr_expect_not_null(c);
	config_free(c);
	config_errors_clear(&errs);
}

Test(amqp_url, config_load_names_the_flag_and_the_node)
{
	static const char *const env[] = { NULL };
	const char *sets[] = { "amqp.url=amqp://mq1:5672,amqp://relay:S3#cret@mq2:5672" };
	struct config_sources src = { NULL, sets, 1, env, broker_check_url };
	struct config_errors errs = { 0 };
	struct config *c = config_load(&src, &errs);

	cr_assert_null(c);
	cr_assert_eq(errs.n, 1);
	cr_expect(strstr(errs.lines[0], "amqp.url: got ") == errs.lines[0], "%s", errs.lines[0]);
	cr_expect(strstr(errs.lines[0], "(flag --set): URL 2 of 2: the password holds an "
	                                "unescaped '#': percent-encode it as %23") != NULL,
	          "%s", errs.lines[0]);
	cr_expect(strstr(errs.lines[0], "cret") == NULL, "shows the password: %s", errs.lines[0]);
	config_errors_clear(&errs);
}

/* The relay binary with args, in an environment of PATH, the sanitizer options and env alone. */
static struct harness_output relay(const char *const *env, const char *const *args)
{
	struct harness_output o;

	harness_cli_bare(&o, env, args);
	return o;
}

Test(amqp_url, config_check_and_run_exit_2_on_a_url_that_can_never_connect)
{
	static const char *const env[] = {
		"OUTBOX_AMQP_URL=amqp://relay:Pa55/w0rd@127.0.0.1:1",
		"OUTBOX_DATABASE_URL=host=127.0.0.1 port=1 connect_timeout=2",
		"OUTBOX_HTTP_LISTEN=",
		NULL,
	};
	static const char *const fixed[] = {
		"OUTBOX_AMQP_URL=amqp://relay:Pa55%2Fw0rd@127.0.0.1:1",
		NULL,
	};
	const char *cmds[][3] = { { "config", "check", NULL }, { "run", NULL, NULL } };

	for (size_t i = 0; i < 2; i++) {
		struct harness_output r = relay(env, cmds[i]);

		cr_expect_eq(r.status, 2, "%s exited %d: %s", cmds[i][0], r.status, r.err);
		cr_expect(strstr(r.err, "amqp.url: got \"amqp://relay:***@127.0.0.1:1\" (env "
		                        "OUTBOX_AMQP_URL): the password holds an unescaped '/': "
		                        "percent-encode it as %2F") != NULL,
		          "%s said: %s", cmds[i][0], r.err);
		cr_expect(strstr(r.err, "w0rd") == NULL, "%s shows the password: %s", cmds[i][0],
		          r.err);
		harness_output_free(&r);
	}
	{
		struct harness_output r = relay(fixed, cmds[0]);

		cr_expect_eq(r.status, 0, "config check of the encoded URL exited %d: %s", r.status,
		             r.err);
		harness_output_free(&r);
	}
}
