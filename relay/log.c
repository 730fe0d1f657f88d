/* Operator log lines on stderr, logfmt or JSON. Each line is formatted into a stack buffer of
 * bounded size and written with a single write(2), so threads never interleave within a line
 * and no lock is needed. */
#include "relay/log.h"

#include "base/utf8.h"

#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* A line never exceeds PIPE_BUF (4096 on Linux): stderr is often a pipe (Docker, systemd), and
 * only writes up to that size are atomic there, so a longer line could interleave with
 * another thread's. */
#define LOG_LINE_MAX PIPE_BUF
/* Room kept back for what must close a line even when it is full: `..."` + `}` + `\n`. */
#define LOG_TAIL 16
/* A single value longer than this is cut and ends in "...". */
#define LOG_VALUE_MAX 1024

/* Atomics although set once before threads start: a later log_setup (tests, reload) must not
 * be a data race for TSan. */
static atomic_int g_min_level = LOG_INFO;
static atomic_int g_format = LOG_FORMAT_TEXT;

/* The source of the calling thread's lines (log_set_source()); NULL = none. */
static _Thread_local const char *t_source;

struct line {
	char buf[LOG_LINE_MAX];
	size_t len;
	bool full; /* set once something did not fit: nothing more is added but the tail */
};

void log_setup(enum log_level min_level, enum log_format format)
{
	atomic_store_explicit(&g_min_level, (int)min_level, memory_order_relaxed);
	atomic_store_explicit(&g_format, (int)format, memory_order_relaxed);
}

bool log_enabled(enum log_level level)
{
	return (int)level >= atomic_load_explicit(&g_min_level, memory_order_relaxed);
}

void log_set_source(const char *name)
{
	t_source = name && name[0] ? name : NULL;
}

static const char *level_name(enum log_level level)
{
	switch (level) {
	case LOG_DEBUG:
		return "debug";
	case LOG_INFO:
		return "info";
	case LOG_WARN:
		return "warn";
	case LOG_ERROR:
		return "error";
	}
	return "unknown";
}

/* All or nothing: a partial key or escape sequence would corrupt the line's syntax. */
static bool put_raw(struct line *l, const char *s, size_t n)
{
	if (l->full || l->len + n > LOG_LINE_MAX - LOG_TAIL) {
		l->full = true;
		return false;
	}
	memcpy(l->buf + l->len, s, n);
	l->len += n;
	return true;
}

static bool put_str(struct line *l, const char *s)
{
	return put_raw(l, s, strlen(s));
}

/* Closing characters go into the reserved tail; only a few are ever written per line. */
static void put_tail(struct line *l, const char *s)
{
	size_t n = strlen(s);

	if (l->len + n <= LOG_LINE_MAX) {
		memcpy(l->buf + l->len, s, n);
		l->len += n;
	}
}

/* Text values need quotes when a logfmt parser would otherwise split or misread them. */
static bool text_needs_quotes(const char *v)
{
	if (*v == '\0')
		return true;
	for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
		if (*p <= ' ' || *p == '"' || *p == '=' || *p == '\\' || *p == 0x7f)
			return true;
	}
	return false;
}

/* Writes v escaped (for JSON or for a quoted logfmt value), invalid UTF-8 replaced by U+FFFD,
 * cut at LOG_VALUE_MAX input bytes or when the line is full; a cut value ends in "...". */
static void put_escaped(struct line *l, const char *v, bool json)
{
	const unsigned char *p = (const unsigned char *)v;
	size_t left = strlen(v);
	size_t used = 0;
	bool cut = false;

	while (left > 0) {
		char esc[8];
		const char *out = esc;
		size_t n = 1, outlen;
		unsigned char c = *p;

		if (used >= LOG_VALUE_MAX) {
			cut = true;
			break;
		}
		if (c == '"' || c == '\\') {
			esc[0] = '\\';
			esc[1] = (char)c;
			outlen = 2;
		} else if (c == '\n' || c == '\r' || c == '\t') {
			esc[0] = '\\';
			esc[1] = c == '\n' ? 'n' : c == '\r' ? 'r' : 't';
			outlen = 2;
		} else if (c < 0x20 || c == 0x7f) {
			snprintf(esc, sizeof(esc), "\\u%04x", c);
			outlen = 6;
		} else if (c < 0x80) {
			out = (const char *)p;
			outlen = 1;
		} else if ((n = utf8_seq_len(p, left)) > 0) {
			out = (const char *)p;
			outlen = n;
		} else {
			/* One bad byte at a time, so the rest of a mostly valid value survives. */
			n = 1;
			out = json ? "\\ufffd" : "\xef\xbf\xbd";
			outlen = strlen(out);
		}
		if (!put_raw(l, out, outlen)) {
			cut = true;
			break;
		}
		p += n;
		left -= n;
		used += n;
	}
	if (cut)
		put_tail(l, "...");
}

/* Keys come from code, but a stray space or quote in one must not break the line. */
static void put_key(struct line *l, const char *k, bool json)
{
	char key[64];
	size_t n = 0;

	for (; *k && n < sizeof(key) - 1; k++) {
		char c = *k;
		bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		          (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
		key[n++] = ok ? c : '_';
	}
	key[n] = '\0';
	if (json) {
		char buf[80];
		int len = snprintf(buf, sizeof(buf), ",\"%s\":\"", key);
		put_raw(l, buf, (size_t)len);
	} else {
		char buf[80];
		int len = snprintf(buf, sizeof(buf), " %s=", key);
		put_raw(l, buf, (size_t)len);
	}
}

static void put_pair(struct line *l, const char *k, const char *v, bool json, bool force_quotes)
{
	if (v == NULL)
		v = "";
	if (l->full)
		return;
	put_key(l, k, json);
	if (l->full)
		return;
	if (json) {
		put_escaped(l, v, true);
		put_tail(l, "\"");
	} else if (force_quotes || text_needs_quotes(v)) {
		if (!put_raw(l, "\"", 1))
			return;
		put_escaped(l, v, false);
		put_tail(l, "\"");
	} else {
		put_escaped(l, v, false);
	}
}

static void format_ts(char *buf, size_t n)
{
	struct timespec ts;
	struct tm tm;
	char date[32];

	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(buf, n, "%s.%03ldZ", date, ts.tv_nsec / 1000000);
}

/* Loops because a signal can interrupt the write; a failed stderr has nowhere to report to. */
static void write_all(const char *buf, size_t n)
{
	while (n > 0) {
		ssize_t w = write(STDERR_FILENO, buf, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return;
		}
		buf += w;
		n -= (size_t)w;
	}
}

/* Writes ts, level, component and msg into l; the caller adds pairs and calls line_end(). */
static bool line_begin(struct line *l, enum log_level level, const char *component, const char *msg)
{
	char ts[48];
	bool json = atomic_load_explicit(&g_format, memory_order_relaxed) == LOG_FORMAT_JSON;

	l->len = 0;
	l->full = false;
	format_ts(ts, sizeof(ts));
	if (json) {
		/* The first pair has no leading comma: write the opening brace and "ts" by hand. */
		put_str(l, "{\"ts\":\"");
		put_escaped(l, ts, true);
		put_tail(l, "\"");
	} else {
		put_str(l, "ts=");
		put_str(l, ts);
	}
	put_pair(l, "level", level_name(level), json, false);
	put_pair(l, "component", component ? component : "relay", json, false);
	if (t_source)
		put_pair(l, "source", t_source, json, false);
	/* msg is always quoted in text so that a one-word message reads like the others. */
	put_pair(l, "msg", msg, json, true);
	return json;
}

static void line_end(struct line *l, bool json)
{
	if (json)
		put_tail(l, "}");
	put_tail(l, "\n");
	write_all(l->buf, l->len);
}

/* Formats a duration for people: "250ms", "1.5s", "90s", or whole minutes, hours and days
 * when it is exactly that ("5m", "2h", "7d"). */
static void format_ms(int64_t ms, char *buf, size_t n)
{
	const int64_t min = 60000, hour = 60 * min, day = 24 * hour;

	if (ms < 0)
		ms = 0;
	if (ms < 1000)
		snprintf(buf, n, "%lldms", (long long)ms);
	else if (ms >= day && ms % day == 0)
		snprintf(buf, n, "%lldd", (long long)(ms / day));
	else if (ms >= hour && ms % hour == 0)
		snprintf(buf, n, "%lldh", (long long)(ms / hour));
	else if (ms >= min && ms % min == 0)
		snprintf(buf, n, "%lldm", (long long)(ms / min));
	else if (ms < 100000)
		snprintf(buf, n, "%.1fs", (double)ms / 1000.0);
	else
		snprintf(buf, n, "%.0fs", (double)ms / 1000.0);
}

/* The text of a typed value; NULL when the pair is to be left out. */
static const char *field_text(const struct log_field *f, char *buf, size_t n)
{
	switch (f->kind) {
	case LOG_FIELD_STR:
		return f->v.s ? f->v.s : "";
	case LOG_FIELD_OPT:
		return f->v.s;
	case LOG_FIELD_INT:
		snprintf(buf, n, "%lld", (long long)f->v.i);
		return buf;
	case LOG_FIELD_UINT:
		snprintf(buf, n, "%llu", (unsigned long long)f->v.u);
		return buf;
	case LOG_FIELD_MS:
		format_ms(f->v.i, buf, n);
		return buf;
	case LOG_FIELD_RATE:
		snprintf(buf, n, "%.0f/s", f->v.d);
		return buf;
	case LOG_FIELD_END:
		break;
	}
	return NULL;
}

void log_fields(enum log_level level, const char *component, const char *msg,
                const struct log_field *f)
{
	struct line l;
	bool json;

	if (!log_enabled(level))
		return;
	json = line_begin(&l, level, component, msg);
	for (; f != NULL && f->kind != LOG_FIELD_END; f++) {
		char buf[48];
		const char *v = field_text(f, buf, sizeof(buf));

		if (f->key != NULL && v != NULL)
			put_pair(&l, f->key, v, json, false);
	}
	line_end(&l, json);
}

void log_event_kv(enum log_level level, const char *component, const char *msg,
                  const char *const *kv, size_t npairs)
{
	struct line l;
	bool json;

	if (!log_enabled(level))
		return;
	json = line_begin(&l, level, component, msg);
	for (size_t i = 0; kv != NULL && i < npairs; i++) {
		if (kv[2 * i] != NULL)
			put_pair(&l, kv[2 * i], kv[2 * i + 1], json, false);
	}
	line_end(&l, json);
}
