/* Log line format: logfmt quoting and escaping, JSON that parses and carries every field,
 * truncation of huge values, the level filter. stderr is captured through a pipe. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "relay/log.h"

static int saved_stderr = -1;
static int capture_rd = -1;

static void capture_start(void)
{
	int fds[2];

	cr_assert_eq(pipe(fds), 0);
	saved_stderr = dup(STDERR_FILENO);
	cr_assert_geq(saved_stderr, 0);
	cr_assert_geq(dup2(fds[1], STDERR_FILENO), 0);
	close(fds[1]);
	capture_rd = fds[0];
}

/* Returns what was written to stderr since capture_start (caller frees). The pipe holds
 * 64 KiB, more than any test writes, so writing without a reader cannot block. */
static char *capture_end(void)
{
	size_t cap = 65536, len = 0;
	char *buf = malloc(cap + 1);
	ssize_t n;

	cr_assert_not_null(buf);
	dup2(saved_stderr, STDERR_FILENO);
	close(saved_stderr);
	while ((n = read(capture_rd, buf + len, cap - len)) > 0)
		len += (size_t)n;
	close(capture_rd);
	buf[len] = '\0';
	return buf;
}

static size_t count_char(const char *s, char c)
{
	size_t n = 0;

	for (; *s; s++)
		n += *s == c;
	return n;
}

Test(log, text_line_has_timestamp_level_component_and_message)
{
	char *out;

	log_setup(LOG_INFO, LOG_FORMAT_TEXT);
	capture_start();
	log_event(LOG_WARN, "relay", "could not publish, will retry in 4s", LOG_STR("id", "a1"));
	out = capture_end();

	/* ts=YYYY-MM-DDTHH:MM:SS.mmmZ */
	cr_assert_eq(strncmp(out, "ts=", 3), 0, "got: %s", out);
	cr_assert_eq(out[7], '-');
	cr_assert_eq(out[13], 'T');
	cr_assert_eq(out[22], '.');
	cr_assert_eq(out[26], 'Z', "got: %s", out);
	cr_assert_str_eq(out + 27, " level=warn component=relay"
	                           " msg=\"could not publish, will retry in 4s\" id=a1\n");
	free(out);
}

Test(log, text_quotes_and_escapes_values)
{
	char *out;

	log_setup(LOG_DEBUG, LOG_FORMAT_TEXT);
	capture_start();
	log_event(LOG_INFO, "store", "m", LOG_STR("plain", "abc"), LOG_STR("space", "a b"),
	          LOG_STR("empty", ""), LOG_STR("null", NULL), LOG_STR("quote", "say \"hi\""),
	          LOG_STR("eq", "k=v"), LOG_STR("nl", "x\ny"), LOG_STR("bs", "c:\\d"),
	          LOG_STR("ctl", "a\x01z"), LOG_STR("tab", "\t"));
	out = capture_end();

	cr_assert(strstr(out, " msg=\"m\"") != NULL, "got: %s", out);
	cr_assert(strstr(out, " plain=abc ") != NULL, "got: %s", out);
	cr_assert(strstr(out, " space=\"a b\" ") != NULL, "got: %s", out);
	cr_assert(strstr(out, " empty=\"\" ") != NULL, "got: %s", out);
	cr_assert(strstr(out, " null=\"\" ") != NULL, "got: %s", out);
	cr_assert(strstr(out, " quote=\"say \\\"hi\\\"\" ") != NULL, "got: %s", out);
	cr_assert(strstr(out, " eq=\"k=v\" ") != NULL, "got: %s", out);
	cr_assert(strstr(out, " nl=\"x\\ny\" ") != NULL, "got: %s", out);
	cr_assert(strstr(out, " bs=\"c:\\\\d\" ") != NULL, "got: %s", out);
	cr_assert(strstr(out, " ctl=\"a\\u0001z\" ") != NULL, "got: %s", out);
	cr_assert(strstr(out, " tab=\"\\t\"\n") != NULL, "got: %s", out);
	cr_assert_eq(count_char(out, '\n'), 1, "one event must be one line: %s", out);
	free(out);
}

Test(log, json_line_parses_and_carries_every_field)
{
	json_error_t jerr;
	json_t *o;
	char *out;

	log_setup(LOG_INFO, LOG_FORMAT_JSON);
	capture_start();
	log_event(LOG_ERROR, "relay", "row is dead", LOG_STR("id", "r\"1"),
	          LOG_STR("error", "bad\x02\n\\"), LOG_STR("utf8", "caf\xc3\xa9"),
	          LOG_STR("broken", "a\xff\xfe"
	                            "b"),
	          LOG_STR("null", NULL));
	out = capture_end();

	cr_assert_eq(count_char(out, '\n'), 1, "got: %s", out);
	o = json_loads(out, 0, &jerr);
	cr_assert_not_null(o, "not JSON (%s): %s", jerr.text, out);
	cr_assert(json_is_string(json_object_get(o, "ts")));
	cr_assert_eq(strlen(json_string_value(json_object_get(o, "ts"))), 24);
	cr_assert_str_eq(json_string_value(json_object_get(o, "level")), "error");
	cr_assert_str_eq(json_string_value(json_object_get(o, "component")), "relay");
	cr_assert_str_eq(json_string_value(json_object_get(o, "msg")), "row is dead");
	cr_assert_str_eq(json_string_value(json_object_get(o, "id")), "r\"1");
	cr_assert_str_eq(json_string_value(json_object_get(o, "error")), "bad\x02\n\\");
	cr_assert_str_eq(json_string_value(json_object_get(o, "utf8")), "caf\xc3\xa9");
	/* Each invalid byte becomes U+FFFD; jansson would have refused the line otherwise. */
	cr_assert_str_eq(json_string_value(json_object_get(o, "broken")),
	                 "a\xef\xbf\xbd\xef\xbf\xbd"
	                 "b");
	cr_assert_str_eq(json_string_value(json_object_get(o, "null")), "");
	cr_assert_eq(json_object_size(o), 9);
	json_decref(o);
	free(out);
}

Test(log, level_filter_drops_lower_levels)
{
	char *out;

	log_setup(LOG_WARN, LOG_FORMAT_TEXT);
	cr_assert(!log_enabled(LOG_DEBUG));
	cr_assert(!log_enabled(LOG_INFO));
	cr_assert(log_enabled(LOG_WARN));
	cr_assert(log_enabled(LOG_ERROR));
	capture_start();
	log_event(LOG_DEBUG, "relay", "debug line");
	log_event(LOG_INFO, "relay", "info line");
	log_event(LOG_WARN, "relay", "warn line");
	log_event(LOG_ERROR, "relay", "error line");
	out = capture_end();

	cr_assert_null(strstr(out, "debug line"), "got: %s", out);
	cr_assert_null(strstr(out, "info line"), "got: %s", out);
	cr_assert_not_null(strstr(out, "level=warn component=relay msg=\"warn line\""));
	cr_assert_not_null(strstr(out, "level=error component=relay msg=\"error line\""));
	cr_assert_eq(count_char(out, '\n'), 2);
	free(out);
}

static char *make_string(size_t n, char c)
{
	char *s = malloc(n + 1);

	cr_assert_not_null(s);
	memset(s, c, n);
	s[n] = '\0';
	return s;
}

Test(log, huge_values_are_cut_and_the_line_stays_valid)
{
	json_error_t jerr;
	json_t *o;
	char *big = make_string(100000, 'x');
	char *quotes = make_string(20000, '\x01');
	const char *v;
	char *out;

	log_setup(LOG_INFO, LOG_FORMAT_JSON);
	capture_start();
	log_event(LOG_WARN, "relay", "big", LOG_STR("a", big), LOG_STR("b", quotes),
	          LOG_STR("c", big), LOG_STR("d", "tail"));
	out = capture_end();

	cr_assert_leq(strlen(out), 4096, "a line fits in PIPE_BUF");
	cr_assert_eq(count_char(out, '\n'), 1);
	o = json_loads(out, 0, &jerr);
	cr_assert_not_null(o, "not JSON (%s)", jerr.text);
	v = json_string_value(json_object_get(o, "a"));
	cr_assert_not_null(v);
	cr_assert_lt(strlen(v), 100000);
	cr_assert_eq(strcmp(v + strlen(v) - 3, "..."), 0, "a cut value ends in ...");
	json_decref(o);
	free(out);

	log_setup(LOG_INFO, LOG_FORMAT_TEXT);
	capture_start();
	log_event(LOG_WARN, "relay", "big", LOG_STR("a", big), LOG_STR("b", "x y"));
	out = capture_end();
	cr_assert_leq(strlen(out), 4096);
	cr_assert_not_null(strstr(out, "xxx... b=\"x y\"\n"), "got tail: %s",
	                   out + strlen(out) - 40);
	free(out);
	free(big);
	free(quotes);
}

/* Writers on several threads with a reader draining the pipe: every line must arrive whole,
 * because each is a single write(2) no longer than PIPE_BUF. */
#define THREADS          4
#define LINES_PER_THREAD 300

struct drain {
	int fd;
	char *buf;
	size_t len, cap;
};

static void *drain_pipe(void *arg)
{
	struct drain *d = arg;
	ssize_t n;

	while (d->len < d->cap && (n = read(d->fd, d->buf + d->len, d->cap - d->len)) > 0)
		d->len += (size_t)n;
	return NULL;
}

static void *write_lines(void *arg)
{
	char id[32];

	for (int i = 0; i < LINES_PER_THREAD; i++) {
		snprintf(id, sizeof(id), "t%d-%d", *(int *)arg, i);
		log_event(LOG_INFO, "relay", "concurrent line", LOG_STR("id", id),
		          LOG_STR("pad",
		                  "some text with spaces and \"quotes\" to make the line longer"));
	}
	return NULL;
}

Test(log, concurrent_lines_never_interleave)
{
	pthread_t writers[THREADS], reader;
	int ids[THREADS], fds[2], lines = 0;
	struct drain d = { .cap = 4 * 1024 * 1024 };
	char *line, *nl;

	log_setup(LOG_INFO, LOG_FORMAT_JSON);
	d.buf = malloc(d.cap + 1);
	cr_assert_not_null(d.buf);
	cr_assert_eq(pipe(fds), 0);
	saved_stderr = dup(STDERR_FILENO);
	dup2(fds[1], STDERR_FILENO);
	close(fds[1]);
	d.fd = fds[0];
	cr_assert_eq(pthread_create(&reader, NULL, drain_pipe, &d), 0);
	for (int i = 0; i < THREADS; i++) {
		ids[i] = i;
		cr_assert_eq(pthread_create(&writers[i], NULL, write_lines, &ids[i]), 0);
	}
	for (int i = 0; i < THREADS; i++)
		pthread_join(writers[i], NULL);
	/* Restoring stderr closes the last write end, so the reader sees end of file. */
	dup2(saved_stderr, STDERR_FILENO);
	close(saved_stderr);
	pthread_join(reader, NULL);
	close(fds[0]);
	d.buf[d.len] = '\0';

	for (line = d.buf; (nl = strchr(line, '\n')) != NULL; line = nl + 1) {
		json_error_t jerr;
		json_t *o;

		*nl = '\0';
		o = json_loads(line, 0, &jerr);

		cr_assert_not_null(o, "torn line (%s): %s", jerr.text, line);
		cr_assert_str_eq(json_string_value(json_object_get(o, "msg")), "concurrent line");
		json_decref(o);
		lines++;
	}
	cr_assert_str_eq(line, "", "output ends with a newline");
	cr_assert_eq(lines, THREADS * LINES_PER_THREAD);
	free(d.buf);
}

Test(log, pairs_from_an_array)
{
	const char *kv[] = { "a", "1", "b", "two words", "c", NULL };
	char *out;

	log_setup(LOG_INFO, LOG_FORMAT_TEXT);
	capture_start();
	log_event_kv(LOG_INFO, "config", "effective configuration", kv, 3);
	log_event_kv(LOG_DEBUG, "config", "filtered out", kv, 3);
	out = capture_end();

	cr_assert_not_null(strstr(out, " component=config msg=\"effective configuration\""
	                               " a=1 b=\"two words\" c=\"\"\n"),
	                   "got: %s", out);
	cr_assert_null(strstr(out, "filtered out"));
	free(out);
}

/* Typed fields: numbers and durations are formatted here, an optional pair that is NULL is left
 * out without losing the pairs after it (the old NULL-terminated list ended there). */
Test(log, typed_fields_format_and_optional_pairs_do_not_end_the_list)
{
	char *out;

	log_setup(LOG_INFO, LOG_FORMAT_TEXT);
	capture_start();
	log_event(LOG_WARN, "worker1", "typed", LOG_INT("attempt", -3),
	          LOG_UINT("rows", 18446744073709551615ull), LOG_MS("short", 250),
	          LOG_MS("secs", 1500), LOG_MS("mins", 300000),
	          LOG_MS("days", 7LL * 24 * 3600 * 1000), LOG_MS("odd", 123456),
	          LOG_RATE("rate", 1234.4), LOG_OPT("ordering_key", NULL),
	          LOG_STR("after", "kept"));
	out = capture_end();

	cr_assert_not_null(strstr(out, " attempt=-3 "), "got: %s", out);
	cr_assert_not_null(strstr(out, " rows=18446744073709551615 "), "got: %s", out);
	cr_assert_not_null(strstr(out, " short=250ms secs=1.5s mins=5m days=7d odd=123s "),
	                   "got: %s", out);
	cr_assert_not_null(strstr(out, " rate=1234/s "), "got: %s", out);
	cr_assert_null(strstr(out, "ordering_key"), "a NULL optional pair is left out: %s", out);
	cr_assert_not_null(strstr(out, " after=kept\n"), "pairs after it survive: %s", out);
	free(out);
}

static void *log_as_billing(void *arg)
{
	(void)arg;
	log_set_source("billing");
	log_event(LOG_INFO, "worker1", "connected", LOG_STR("to", "broker"));
	return NULL;
}

/* A source's lines name it right after component; a thread that set none (or "") names none,
 * and one thread's source never leaks into another's lines. */
Test(log, source_follows_component_per_thread)
{
	pthread_t t;
	char *out;

	log_setup(LOG_INFO, LOG_FORMAT_TEXT);
	capture_start();
	log_set_source("orders");
	log_event(LOG_INFO, "relay", "summary", LOG_UINT("published", 3));
	cr_assert_eq(pthread_create(&t, NULL, log_as_billing, NULL), 0);
	pthread_join(t, NULL);
	log_set_source("");
	log_event(LOG_INFO, "relay", "stopped");
	log_set_source(NULL);
	out = capture_end();

	cr_assert_not_null(strstr(out, " level=info component=relay source=orders "
	                               "msg=\"summary\" published=3\n"),
	                   "got: %s", out);
	cr_assert_not_null(strstr(out, " component=worker1 source=billing msg=\"connected\""),
	                   "got: %s", out);
	cr_assert_not_null(strstr(out, " component=relay msg=\"stopped\"\n"), "got: %s", out);
	cr_assert_eq(count_char(out, '\n'), 3, "got: %s", out);
	free(out);
}

Test(log, source_in_json)
{
	json_error_t jerr;
	json_t *o;
	char *out;

	log_setup(LOG_INFO, LOG_FORMAT_JSON);
	capture_start();
	log_set_source("orders");
	log_event(LOG_WARN, "maintenance", "could not read table status, will retry");
	log_set_source(NULL);
	out = capture_end();

	o = json_loads(out, 0, &jerr);
	cr_assert_not_null(o, "not JSON (%s): %s", jerr.text, out);
	cr_assert_str_eq(json_string_value(json_object_get(o, "source")), "orders");
	cr_assert_not_null(strstr(out, "\"component\":\"maintenance\",\"source\":\"orders\""),
	                   "got: %s", out);
	json_decref(o);
	free(out);
	log_setup(LOG_INFO, LOG_FORMAT_TEXT);
}
