/* Passwords with the characters that split URIs and conninfo strings (? # % @ : / , ; ' \ +
 * & = and blanks) never show in what the relay prints: `config show`, a failed start, and a
 * running relay's log while it cannot reach a database and a broker on closed ports. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/harness.h"
#include "tests/support/http_probe.h"

/* Generous: the suite runs under ASan on two cores beside other test files. */
#define LOG_TIMEOUT_MS  60000
#define EXIT_TIMEOUT_MS 30000

#define DB_FAILED     "could not connect, will retry\" to=database"
#define BROKER_FAILED "could not connect, will retry\" to=broker"

/* Each long enough that a piece of it showing up is not a coincidence. */
static const char *const passwords[] = {
	"Qm?x#Fr4gment",       /* libpq reads ? and # as password; rabbitmq-c stops there */
	"Zulu@Kwai:Yeti/Pq9x", /* libpq ends the userinfo at the first '@' */
	"50%offVx7",           /* libpq: invalid percent-encoded token, quoted */
	"Sp ace,Cm;ma",        /* a blank ends an unquoted conninfo value; a comma splits lists */
	"Qu'ote\\Bks7",        /* conninfo quoting and escapes */
	"%41%42Pcte9",         /* percent-encoded: "ABPcte9" once decoded */
	"pl+us&and=eq",        /* query delimiters */
};

#define NPASSWORDS (sizeof(passwords) / sizeof(passwords[0]))

/* Writes s percent-encoded (all but unreserved characters) into buf. */
static void pct_encode(const char *s, char *buf, size_t n)
{
	size_t len = 0;

	for (const unsigned char *p = (const unsigned char *)s; *p && len + 4 < n; p++) {
		if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
		    (*p >= '0' && *p <= '9') || strchr("-._~", *p))
			buf[len++] = (char)*p;
		else
			len += (size_t)snprintf(buf + len, n - len, "%%%02X", *p);
	}
	buf[len] = '\0';
}

/* Writes s with valid %XX escapes decoded into buf. */
static void pct_decode(const char *s, char *buf, size_t n)
{
	size_t len = 0;

	for (const char *p = s; *p && len + 1 < n; p++) {
		unsigned int v;

		if (p[0] == '%' && p[1] && p[2] && sscanf(p + 1, "%2x", &v) == 1 &&
		    strchr("0123456789abcdefABCDEF", p[1]) &&
		    strchr("0123456789abcdefABCDEF", p[2])) {
			buf[len++] = (char)v;
			p += 2;
		} else {
			buf[len++] = *p;
		}
	}
	buf[len] = '\0';
}

/* Writes s quoted for a libpq conninfo value: 'a\'b'. */
static void conninfo_quote(const char *s, char *buf, size_t n)
{
	size_t len = 0;

	buf[len++] = '\'';
	for (const char *p = s; *p && len + 4 < n; p++) {
		if (*p == '\'' || *p == '\\')
			buf[len++] = '\\';
		buf[len++] = *p;
	}
	buf[len++] = '\'';
	buf[len] = '\0';
}

/* Fails the test when text shows pw as written, decoded or encoded, or a piece of it of four
 * bytes or more (the libraries cut passwords at delimiters and echo the pieces). */
static void expect_no_password(const char *pw, const char *what, const char *text)
{
	char dec[128], enc[384], piece[128];
	size_t len = 0;

	pct_decode(pw, dec, sizeof(dec));
	pct_encode(pw, enc, sizeof(enc));
	cr_assert_null(strstr(text, pw), "%s shows the password %s:\n%s", what, pw, text);
	cr_assert_null(strstr(text, dec), "%s shows the password %s decoded:\n%s", what, pw, text);
	cr_assert_null(strstr(text, enc), "%s shows the password %s encoded:\n%s", what, pw, text);
	for (const char *p = pw;; p++) {
		if (*p && !strchr("@:/?#[],&=;+%' \\", *p)) {
			piece[len++] = *p;
			continue;
		}
		piece[len] = '\0';
		if (len >= 4)
			cr_assert_null(strstr(text, piece),
			               "%s shows \"%s\" of the password %s:\n%s", what, piece, pw,
			               text);
		len = 0;
		if (!*p)
			break;
	}
}

/* Whether an AMQP URL with pw written raw as its password is refused: pw holds a URL
 * delimiter, or a '%' that does not start a %XX escape. */
static bool raw_refused(const char *pw)
{
	for (const char *p = strchr(pw, '%'); p != NULL; p = strchr(p + 1, '%'))
		if (!p[1] || !strchr("0123456789abcdefABCDEF", p[1]) || !p[2] ||
		    !strchr("0123456789abcdefABCDEF", p[2]))
			return true;
	return strpbrk(pw, ":/@?#[]") != NULL;
}

/* The environment of one case: a database URL (URI or conninfo) and an AMQP URL, both with
 * pw, pointing at ports where nothing listens. */
struct secret_env {
	char db[512], amqp[512], e_db[600], e_amqp[600];
};

static void secret_env(struct secret_env *e, const char *pw, bool conninfo)
{
	char enc[384], quoted[256];

	pct_encode(pw, enc, sizeof(enc));
	if (conninfo) {
		conninfo_quote(pw, quoted, sizeof(quoted));
		snprintf(e->db, sizeof(e->db),
		         "host=127.0.0.1 port=%d user=relay dbname=postgres password=%s "
		         "connect_timeout=5",
		         probe_free_port(), quoted);
	} else {
		/* Written raw, as operators do: the libraries then cut it in surprising places. */
		snprintf(e->db, sizeof(e->db),
		         "postgresql://relay:%s@127.0.0.1:%d/postgres?connect_timeout=5", pw,
		         probe_free_port());
	}
	snprintf(e->amqp, sizeof(e->amqp), "amqp://relay:%s@127.0.0.1:%d/%%2f", enc,
	         probe_free_port());
	snprintf(e->e_db, sizeof(e->e_db), "OUTBOX_DATABASE_URL=%s", e->db);
	snprintf(e->e_amqp, sizeof(e->e_amqp), "OUTBOX_AMQP_URL=%s", e->amqp);
}

/* The output of the last command and the log of the last relay: freed when the test ends,
 * also when an assertion ends it. */
static struct harness_output o;
static char *g_log;

static void free_outputs(void)
{
	harness_output_free(&o);
	free(g_log);
	g_log = NULL;
}

TestSuite(secrets, .fini = free_outputs);

static void config_show(const char *pw, bool conninfo)
{
	struct secret_env e;
	char table[64], enc[384], list[1200], e_list[1300];

	harness_unique_name(table, sizeof(table), "secrets");
	secret_env(&e, pw, conninfo);
	pct_encode(pw, enc, sizeof(enc));
	/* amqp.url as a list, the second URL with the password raw (but for a comma, which would
	 * split the list). A password holding a URL delimiter cannot work raw: the configuration
	 * refuses it, in a line that names the fault and not the password. */
	snprintf(list, sizeof(list), "%s,amqps://relay:%s@127.0.0.1:5671", e.amqp,
	         strchr(pw, ',') ? enc : pw);
	snprintf(e_list, sizeof(e_list), "OUTBOX_AMQP_URL=%s", list);
	if (raw_refused(pw)) {
		harness_cli(&o, table, (const char *const[]){ e.e_db, e_list, NULL }, "config",
		            "check", NULL);
		cr_assert_eq(o.status, 2, "a raw '%s' in amqp.url must stop config check: %s", pw,
		             o.err);
		cr_assert_not_null(strstr(o.err, "URL 2 of 2: the password holds "), "%s", o.err);
		expect_no_password(pw, "config check's refusal", o.err);
		expect_no_password(pw, "config check's stdout", o.out);
		harness_output_free(&o);
		snprintf(list, sizeof(list), "%s,amqps://relay:%s@127.0.0.1:5671", e.amqp, enc);
		snprintf(e_list, sizeof(e_list), "OUTBOX_AMQP_URL=%s", list);
	}
	/* Every URL of the list is redacted. */
	harness_cli(&o, table, (const char *const[]){ e.e_db, e_list, NULL }, "config", "show",
	            NULL);
	cr_assert_eq(o.status, 0, "config show exited %d: %s", o.status, o.err);
	expect_no_password(pw, "config show", o.out);
	expect_no_password(pw, "config show's stderr", o.err);
	cr_assert_not_null(strstr(o.out, "127.0.0.1"), "%s", o.out);
	cr_assert_not_null(strstr(o.out, "***"), "%s", o.out);
	cr_assert_not_null(strstr(o.out, "amqps://relay:***@127.0.0.1:5671"), "%s", o.out);
	harness_output_free(&o);

	/* A start that fails validation prints the errors, not the URLs. */
	harness_cli(&o, table,
	            (const char *const[]){ e.e_db, e_list, "OUTBOX_RELAY_BATCH_SIZE=0", NULL },
	            "run", NULL);
	cr_assert_eq(o.status, 2, "a bad batch size must stop the start: %s", o.err);
	expect_no_password(pw, "a failed start", o.err);
	expect_no_password(pw, "a failed start's stdout", o.out);
	harness_output_free(&o);
}

static void run_unreachable(const char *pw, bool conninfo)
{
	struct secret_env e;
	struct harness_relay *r;
	char table[64];
	const char *log;
	int st;

	harness_unique_name(table, sizeof(table), "secrets");
	secret_env(&e, pw, conninfo);
	r = harness_relay_start(table, (const char *const[]){ e.e_db, e.e_amqp, NULL }, NULL);
	if (!harness_relay_wait_log(r, DB_FAILED, LOG_TIMEOUT_MS) ||
	    !harness_relay_wait_log(r, BROKER_FAILED, LOG_TIMEOUT_MS)) {
		harness_relay_dump_log(r);
		harness_relay_free(r);
		cr_assert_fail("no \"could not connect\" line for both ends (password %s)", pw);
	}
	st = harness_relay_stop(r, SIGTERM, EXIT_TIMEOUT_MS);
	free_outputs();
	log = g_log = harness_relay_log(r);
	harness_relay_free(r);
	cr_assert_eq(st, 0, "relay exited with %d:\n%s", st, log);
	cr_assert_not_null(strstr(log, "starting outbox-relay"), "%s", log);
	cr_assert_not_null(strstr(log, "effective configuration"), "%s", log);
	cr_assert_not_null(strstr(log, "amqp://relay:***@127.0.0.1:"), "%s", log);
	/* The start-up lines (config/ redaction) and the connect errors (store/ and amqp/
	 * texts) alike. */
	expect_no_password(pw, "the relay's log", log);
}

Test(secrets, config_show_and_failed_start_with_uri)
{
	for (size_t i = 0; i < NPASSWORDS; i++)
		config_show(passwords[i], false);
}

Test(secrets, config_show_and_failed_start_with_conninfo)
{
	for (size_t i = 0; i < NPASSWORDS; i++)
		config_show(passwords[i], true);
}

Test(secrets, unreachable_ends_with_uri)
{
	for (size_t i = 0; i < NPASSWORDS; i++)
		run_unreachable(passwords[i], false);
}

Test(secrets, unreachable_ends_with_conninfo)
{
	for (size_t i = 0; i < NPASSWORDS; i++)
		run_unreachable(passwords[i], true);
}
