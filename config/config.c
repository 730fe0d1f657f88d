/* Builds the one immutable config snapshot: defaults, then the JSON file, then OUTBOX_*
 * environment variables, then --set flags; validates every value and reports every problem
 * at once, each with its key, its source, what was given and what is allowed. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/config.h"
#include "config/config_keys.h"
#include "config/config_slots.h"
#include "base/hostport.h"
#include "base/identifier.h"
#include "base/redact.h"

#define ERRORS_MAX   200
#define RELAY_ID_MAX 64 /* locked_by is VARCHAR(64) */

int config_errors_add(struct config_errors *errs, const char *fmt, ...)
{
	char buf[1024];
	char **lines;
	va_list ap;

	if (errs->n >= ERRORS_MAX)
		return -1;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	lines = realloc(errs->lines, (errs->n + 1) * sizeof(*lines));
	if (!lines)
		return -1;
	errs->lines = lines;
	lines[errs->n] = strdup(buf);
	if (!lines[errs->n])
		return -1;
	errs->n++;
	return 0;
}

void config_errors_clear(struct config_errors *errs)
{
	if (!errs)
		return;
	for (size_t i = 0; i < errs->n; i++)
		free(errs->lines[i]);
	free(errs->lines);
	errs->lines = NULL;
	errs->n = 0;
}

static bool listen_valid(const char *s)
{
	struct hostport hp;

	return *s == '\0' || hostport_parse(s, &hp, NULL, 0) == 0;
}

/* A table or channel name that fails only for a reserved word says which word: the rule
 * is not one an operator would guess from "an SQL identifier". */
static bool identifier_checked(const char *v, bool valid, char *why, size_t n)
{
	char word[64];

	if (!valid && identifier_reserved_word(v, word, sizeof(word)))
		snprintf(why, n, "'%s' is a reserved word in PostgreSQL", word);
	return valid;
}

/* amqp.url: URLs separated by commas (blanks around them allowed), each amqp:// or amqps://.
 * A wrong one is named by its position, since the URL itself may hold a password. */
static bool amqp_urls_valid(const char *v, char *why, size_t n)
{
	size_t count = 1, pos = 1;

	for (const char *p = v; *p; p++)
		count += *p == ',';
	for (const char *p = v;; pos++) {
		size_t len = strcspn(p, ",");
		const char *u = p;
		size_t ulen = len;
		bool ok;

		while (ulen > 0 && (*u == ' ' || *u == '\t')) {
			u++;
			ulen--;
		}
		while (ulen > 0 && (u[ulen - 1] == ' ' || u[ulen - 1] == '\t'))
			ulen--;
		ok = (ulen >= 7 && strncmp(u, "amqp://", 7) == 0) ||
		     (ulen >= 8 && strncmp(u, "amqps://", 8) == 0);
		if (!ok) {
			if (count > 1 && ulen == 0)
				snprintf(why, n, "URL %zu of %zu is empty", pos, count);
			else if (count > 1)
				snprintf(why, n,
				         "URL %zu of %zu does not start with amqp:// or amqps:// "
				         "(a comma "
				         "inside a URL is written %%2C)",
				         pos, count);
			return false;
		}
		if (p[len] == '\0')
			return true;
		p += len + 1;
	}
}

/* Checks v for string key k. On failure why may say more than allowed_text() does. */
static bool check_string(const struct config_key *k, const char *v, char *why, size_t n)
{
	switch (k->check) {
	case CONFIG_CHECK_TABLE:
		return identifier_checked(v, identifier_table_name_valid(v), why, n);
	case CONFIG_CHECK_CHANNEL:
		return identifier_checked(v, identifier_plain_valid(v), why, n);
	case CONFIG_CHECK_AMQP_URLS:
		return amqp_urls_valid(v, why, n);
	case CONFIG_CHECK_LISTEN:
		return listen_valid(v);
	case CONFIG_CHECK_RELAY_ID:
		return *v != '\0' && strlen(v) <= RELAY_ID_MAX;
	case CONFIG_CHECK_NONE:
	default:
		return true;
	}
}

static void allowed_text(const struct config_key *k, char *buf, size_t n)
{
	char lo[32], hi[32];

	switch (k->type) {
	case CONFIG_INT:
		snprintf(buf, n, "an integer %" PRId64 "..%" PRId64, k->min, k->max);
		return;
	case CONFIG_BOOL:
		snprintf(buf, n, "true, false, 1, 0, yes, no, on or off");
		return;
	case CONFIG_DURATION:
		config_format_duration(k->min, lo, sizeof(lo));
		config_format_duration(k->max, hi, sizeof(hi));
		snprintf(buf, n, "%sa duration %s..%s (500ms, 30s, 5m, 2h, 7d or seconds)",
		         k->zero_ok ? "0 or " : "", lo, hi);
		return;
	case CONFIG_SIZE:
		config_format_size(k->min, lo, sizeof(lo));
		config_format_size(k->max, hi, sizeof(hi));
		snprintf(buf, n,
		         "a size %s..%s: bytes, or a whole number with KiB, MiB or GiB (k, m, g or "
		         "K, M, G are the same powers of 1024)",
		         lo, hi);
		return;
	case CONFIG_ENUM: {
		size_t len = 0;

		snprintf(buf, n, "one of");
		for (size_t i = 0; k->choices[i]; i++) {
			len = strlen(buf);
			snprintf(buf + len, n - len, "%s %s", i ? "," : "", k->choices[i]);
		}
		return;
	}
	case CONFIG_STRING:
	default:
		break;
	}
	switch (k->check) {
	case CONFIG_CHECK_TABLE:
		snprintf(buf, n,
		         "an SQL identifier [A-Za-z_][A-Za-z0-9_]{0,50} (51 bytes at most, "
		         "so that derived index names fit), optionally schema-qualified "
		         "(schema.table), no part a reserved word of PostgreSQL");
		break;
	case CONFIG_CHECK_CHANNEL:
		snprintf(buf, n,
		         "an SQL identifier [A-Za-z_][A-Za-z0-9_]{0,62}, no schema, not a reserved "
		         "word of PostgreSQL");
		break;
	case CONFIG_CHECK_AMQP_URLS:
		snprintf(buf, n,
		         "a URL starting with amqp:// or amqps://, or several separated by commas");
		break;
	case CONFIG_CHECK_LISTEN:
		snprintf(buf, n,
		         "\"\" (disabled) or host:port with port 1..65535 "
		         "(host empty, IPv4, a name or [IPv6])");
		break;
	case CONFIG_CHECK_RELAY_ID:
		snprintf(buf, n, "a non-empty string of at most %d bytes", RELAY_ID_MAX);
		break;
	case CONFIG_CHECK_NONE:
	default:
		snprintf(buf, n, "a string");
		break;
	}
}

/* The given value as it goes into an error line: quoted, control characters masked, long
 * values cut. A secret goes through redact_conninfo() first, which masks whatever it is
 * unsure of; cutting or masking characters after that cannot bring a secret back. */
static void given_text(const struct config_key *k, const char *v, char *buf, size_t n)
{
	char redacted[512];
	size_t len = 0;

	if (k && k->sensitive) {
		redact_conninfo(v, redacted, sizeof(redacted));
		v = redacted;
	}
	buf[len++] = '"';
	for (const char *p = v; *p && len + 6 < n; p++) {
		if (p - v >= 120) {
			memcpy(buf + len, "...", 3);
			len += 3;
			break;
		}
		buf[len++] = (*p == '"' || (unsigned char)*p < 0x20) ? '?' : *p;
	}
	buf[len++] = '"';
	buf[len] = '\0';
}

static void report_bad(struct config_errors *errs, const struct config_key *k,
                       const struct config_given *g, const char *why)
{
	char got[160], allowed[320];

	given_text(k, g->text, got, sizeof(got));
	allowed_text(k, allowed, sizeof(allowed));
	config_errors_add(errs, "%s: got %s (%s)%s%s; allowed: %s", k->name, got, g->source,
	                  *why ? ": " : "", why, allowed);
}

/* Parses g for key k into s. On a bad value reports it and leaves s's value as it was. */
int config_slot_assign(struct config_slot *s, const struct config_key *k,
                       const struct config_given *g, struct config_errors *errs)
{
	int64_t num = 0;
	bool flag = false;
	bool from_string = g->kind == CONFIG_JSON_STRING;
	bool ok = false;
	char why[160] = "";
	char *text, *source;

	switch (k->type) {
	case CONFIG_STRING:
		ok = from_string && check_string(k, g->text, why, sizeof(why));
		break;
	case CONFIG_INT:
		ok = (from_string || g->kind == CONFIG_JSON_INT) &&
		     config_parse_int(g->text, &num) == 0 && num >= k->min && num <= k->max;
		break;
	case CONFIG_BOOL:
		ok = (from_string || g->kind == CONFIG_JSON_BOOL || g->kind == CONFIG_JSON_INT) &&
		     config_parse_bool(g->text, &flag) == 0;
		break;
	case CONFIG_DURATION:
		/* In JSON a bare number is seconds, like "30" is. */
		if (g->kind == CONFIG_JSON_INT || g->kind == CONFIG_JSON_REAL) {
			ok = g->ms_ok;
			num = g->ms;
		} else {
			ok = from_string && config_parse_duration(g->text, &num) == 0;
		}
		ok = ok && ((num >= k->min && num <= k->max) || (k->zero_ok && num == 0));
		break;
	case CONFIG_ENUM:
		ok = from_string && config_parse_enum(g->text, k->choices, &num) == 0;
		break;
	case CONFIG_SIZE:
		/* In JSON a bare number is bytes, like "65536" is. */
		ok = (from_string || g->kind == CONFIG_JSON_INT) &&
		     config_parse_size(g->text, &num) == 0 && num >= k->min && num <= k->max;
		break;
	}
	if (!ok) {
		report_bad(errs, k, g, why);
		s->failed = true;
		return -1;
	}
	text = strdup(g->text);
	source = strdup(g->source);
	if (!text || !source) {
		free(text);
		free(source);
		config_errors_add(errs, "%s: out of memory", k->name);
		return -1;
	}
	free(s->text);
	free(s->source);
	s->text = text;
	s->source = source;
	s->num = num;
	s->flag = flag;
	return 0;
}

char *config_default_relay_id(void)
{
	char host[256];
	char pid[24];
	char *id;
	size_t room;

	if (gethostname(host, sizeof(host)) != 0 || host[0] == '\0')
		snprintf(host, sizeof(host), "localhost");
	host[sizeof(host) - 1] = '\0';
	snprintf(pid, sizeof(pid), ":%ld", (long)getpid());
	/* Cut a long host name rather than the pid: the pid tells two relays on one host
	 * apart, and the whole must fit locked_by. */
	room = RELAY_ID_MAX - strlen(pid);
	if (strlen(host) > room)
		host[room] = '\0';
	id = malloc(strlen(host) + strlen(pid) + 1);
	if (!id)
		return NULL;
	memcpy(id, host, strlen(host));
	memcpy(id + strlen(host), pid, strlen(pid) + 1);
	return id;
}

/* The slot of the key stored at field f of struct config; NULL when no row stores it (then
 * the rule naming it cannot apply, and the tests of that rule fail). */
#define SLOT(slots, f) slot_of(slots, offsetof(struct config, f))
static const struct config_slot *slot_of(const struct config_slot *slots, size_t field)
{
	size_t i = config_key_by_field(field);

	return i < config_key_count() ? &slots[i] : NULL;
}

static void check_rules(const struct config_slot *slots, struct config_errors *errs)
{
	const struct config_slot *lease = SLOT(slots, relay_lease_ms);
	const struct config_slot *confirm = SLOT(slots, amqp_confirm_timeout_ms);
	const struct config_slot *bmin = SLOT(slots, relay_retry_backoff_min_ms);
	const struct config_slot *bmax = SLOT(slots, relay_retry_backoff_max_ms);
	char v[32];

	if (!lease || !confirm || !bmin || !bmax)
		return;
	/* A named source's rule whose keys it all inherits was checked, and reported once, at
	 * the top level. */

	/* A lease shorter than the confirm wait lets another relay claim rows that are still
	 * in flight here: every slow confirm would become a duplicate. */
	if (!lease->failed && !confirm->failed && !(lease->inherited && confirm->inherited) &&
	    lease->num <= confirm->num) {
		config_format_duration(confirm->num, v, sizeof(v));
		config_errors_add(errs,
		                  "relay.lease: got \"%s\" (%s); allowed: more than "
		                  "amqp.confirm_timeout, which is %s (%s)",
		                  lease->text, lease->source, v, confirm->source);
	}
	if (!bmin->failed && !bmax->failed && !(bmin->inherited && bmax->inherited) &&
	    bmin->num > bmax->num) {
		config_format_duration(bmax->num, v, sizeof(v));
		config_errors_add(errs,
		                  "relay.retry_backoff_min: got \"%s\" (%s); allowed: at "
		                  "most relay.retry_backoff_max, which is %s (%s)",
		                  bmin->text, bmin->source, v, bmax->source);
	}
}

/* amqp.url as the AMQP client reads it, when the caller can say (src->check_amqp_url). Only
 * the effective value is read: one that some source gave wrongly was reported already. */
static void check_amqp_url(const struct config_sources *src, const struct config_slot *slots,
                           struct config_errors *errs)
{
	size_t i = config_key_by_field(offsetof(struct config, amqp_url));
	char why[256] = "", got[160];

	if (!src->check_amqp_url || i >= config_key_count() || slots[i].failed || !slots[i].text ||
	    slots[i].inherited)
		return;
	if (src->check_amqp_url(slots[i].text, why, sizeof(why)) == 0)
		return;
	given_text(config_key_at(i), slots[i].text, got, sizeof(got));
	config_errors_add(errs, "amqp.url: got %s (%s): %s", got, slots[i].source,
	                  why[0] ? why : "the AMQP client cannot read it");
}

void config_slots_check(const struct config_sources *src, const struct config_slot *slots,
                        struct config_errors *errs)
{
	check_rules(slots, errs);
	check_amqp_url(src, slots, errs);
}

struct config *config_slots_build(struct config_slot *slots, const char *name)
{
	size_t nkeys = config_key_count();
	struct config *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->sources = calloc(nkeys, sizeof(*c->sources));
	c->source_name = strdup(name);
	if (!c->sources || !c->source_name) {
		free(c->sources);
		free(c->source_name);
		free(c);
		return NULL;
	}
	for (size_t i = 0; i < nkeys; i++) {
		const struct config_key *k = config_key_at(i);
		char *base = (char *)c;

		/* Ownership moves from the slot to the snapshot. */
		c->sources[i] = slots[i].source;
		slots[i].source = NULL;
		switch (k->type) {
		case CONFIG_STRING:
			*(char **)(void *)(base + k->field) = slots[i].text;
			slots[i].text = NULL;
			break;
		case CONFIG_INT:
		case CONFIG_DURATION:
		case CONFIG_SIZE:
			*(int64_t *)(void *)(base + k->field) = slots[i].num;
			break;
		case CONFIG_BOOL:
			*(bool *)(void *)(base + k->field) = slots[i].flag;
			break;
		case CONFIG_ENUM:
			*(int *)(void *)(base + k->field) = (int)slots[i].num;
			break;
		}
	}
	return c;
}

/* The config file's path: --config, else OUTBOX_CONFIG; NULL when neither is given. */
static const char *file_path(const struct config_sources *src)
{
	for (size_t e = 0; !src->file && src->environ && src->environ[e]; e++) {
		if (strncmp(src->environ[e], "OUTBOX_CONFIG=", 14) == 0)
			return src->environ[e] + 14;
	}
	return src->file;
}

struct config *config_load(const struct config_sources *src, struct config_errors *errs)
{
	size_t nkeys = config_key_count();
	struct config *c = NULL;
	struct config_slot *slots;
	struct config_named *named = config_named_new();
	struct config_file f = { NULL, 0 };
	bool have_file = false;
	const char *file = file_path(src);

	errs->lines = NULL;
	errs->n = 0;
	slots = calloc(nkeys, sizeof(*slots));
	if (!slots || !named) {
		config_errors_add(errs, "config: out of memory");
		goto out;
	}
	if (config_slots_defaults(slots, errs) < 0)
		goto out;
	if (src->file && !*src->file)
		config_errors_add(errs, "--config: got an empty path; allowed: a JSON file");
	else if (file && *file && config_file_read(file, &f, errs) == 0)
		have_file = true;
	if (have_file)
		config_slots_file(file, &f, slots, errs);
	config_slots_env(src->environ, slots, errs);
	config_slots_sets(src, slots, errs);
	config_slots_check(src, slots, errs);
	/* The named sources come after the top level: they inherit its effective values. */
	config_named_read(named, file, have_file ? &f : NULL, src, errs);
	config_named_check(named, slots, src, errs);
	if (errs->n > 0)
		goto out;
	c = config_slots_build(slots, "");
	if (c && config_named_build(named, c) < 0) {
		config_free(c);
		c = NULL;
	}
	if (!c)
		config_errors_add(errs, "config: out of memory");
out:
	for (size_t i = 0; slots && i < nkeys; i++) {
		free(slots[i].text);
		free(slots[i].source);
	}
	free(slots);
	config_file_clear(&f);
	config_named_free(named);
	return c;
}

void config_free(struct config *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < config_key_count(); i++) {
		const struct config_key *k = config_key_at(i);

		if (k->type == CONFIG_STRING)
			free(*(char **)(void *)((char *)c + k->field));
		if (c->sources)
			free(c->sources[i]);
	}
	free(c->sources);
	for (size_t i = 0; i < c->n_named; i++)
		config_free(c->named[i]);
	free(c->named);
	free(c->source_name);
	free(c);
}

void config_value_text(const struct config *c, size_t i, char *buf, size_t n)
{
	const struct config_key *k;
	const char *base = (const char *)c;

	if (!buf || n == 0)
		return;
	buf[0] = '\0';
	if (!c || i >= config_key_count())
		return;
	k = config_key_at(i);
	switch (k->type) {
	case CONFIG_STRING: {
		const char *v = *(char *const *)(const void *)(base + k->field);

		if (k->sensitive)
			config_redact(v, buf, n);
		else
			snprintf(buf, n, "%s", v);
		break;
	}
	case CONFIG_INT:
		snprintf(buf, n, "%" PRId64, *(const int64_t *)(const void *)(base + k->field));
		break;
	case CONFIG_DURATION:
		config_format_duration(*(const int64_t *)(const void *)(base + k->field), buf, n);
		break;
	case CONFIG_SIZE:
		config_format_size(*(const int64_t *)(const void *)(base + k->field), buf, n);
		break;
	case CONFIG_BOOL:
		snprintf(buf, n, "%s",
		         *(const bool *)(const void *)(base + k->field) ? "true" : "false");
		break;
	case CONFIG_ENUM:
		snprintf(buf, n, "%s", k->choices[*(const int *)(const void *)(base + k->field)]);
		break;
	}
}

void config_redact(const char *url_or_conninfo, char *out, size_t n)
{
	redact_conninfo(url_or_conninfo, out, n);
}
