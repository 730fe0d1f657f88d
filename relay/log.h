/* Operator logs on stderr: one event a line, logfmt text or JSON. Only relay/ logs; the
 * other modules return errors with text and relay/ decides what to say, once. */
#ifndef OUTBOX_RELAY_LOG_H
#define OUTBOX_RELAY_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum log_level { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR };
enum log_format { LOG_FORMAT_TEXT = 0, LOG_FORMAT_JSON };

/* Set once at start, before threads exist. Defaults: info, text. */
void log_setup(enum log_level min_level, enum log_format format);
bool log_enabled(enum log_level level);
/* The source every later line of the calling thread names (`source=orders` after component in
 * text, "source" in JSON); NULL or "" names none. name is borrowed: it must outlive the
 * thread's logging (a source's name lives in its config snapshot). Thread-local: each of a
 * source's threads calls it first thing, the main thread around work for one source. */
void log_set_source(const char *name);

/* One key/value of a log line, typed, so that a call site passes numbers and durations as
 * they are and the formatting lives here. Build them with the LOG_* macros below. */
enum log_field_kind {
	LOG_FIELD_END = 0, /* ends the list (added by log_event itself) */
	LOG_FIELD_STR,     /* text; NULL is written as "" */
	LOG_FIELD_OPT,     /* text; the pair is left out when the value is NULL */
	LOG_FIELD_INT,
	LOG_FIELD_UINT,
	LOG_FIELD_MS,   /* a duration in ms: "250ms", "1.5s", "5m", "7d" */
	LOG_FIELD_RATE, /* events per second: "1234/s" */
};

struct log_field {
	const char *key;
	enum log_field_kind kind;
	union {
		const char *s;
		int64_t i;
		uint64_t u;
		double d;
	} v;
};

#define LOG_STR(k, val) ((struct log_field){ .key = (k), .kind = LOG_FIELD_STR, .v.s = (val) })
#define LOG_OPT(k, val) ((struct log_field){ .key = (k), .kind = LOG_FIELD_OPT, .v.s = (val) })
#define LOG_INT(k, val) \
	((struct log_field){ .key = (k), .kind = LOG_FIELD_INT, .v.i = (int64_t)(val) })
#define LOG_UINT(k, val) \
	((struct log_field){ .key = (k), .kind = LOG_FIELD_UINT, .v.u = (uint64_t)(val) })
#define LOG_MS(k, val) \
	((struct log_field){ .key = (k), .kind = LOG_FIELD_MS, .v.i = (int64_t)(val) })
#define LOG_RATE(k, val) \
	((struct log_field){ .key = (k), .kind = LOG_FIELD_RATE, .v.d = (double)(val) })
#define LOG_FIELDS_END ((struct log_field){ .key = NULL, .kind = LOG_FIELD_END })

/* Writes one line: ts, level, component, msg, then the fields in order. Text form:
 *   ts=2026-11-30T05:54:05.123Z level=warn component=worker1
 *   msg="could not publish, will retry" id=a1 attempt=2 retry_in=4.0s error="no route"
 * JSON form: {"ts":"…","level":"warn","component":"worker1","msg":"…","id":"a1",…} (every
 * value a JSON string, so that one key has one type for log pipelines). Values are quoted
 * and escaped (text: when they contain space, quote, = or are empty; JSON: always).
 * Thread-safe: each line is one write(2). Never pass message bodies or secrets.
 *   log_event(LOG_WARN, "worker1", "lost connection", LOG_STR("to", "broker"),
 *             LOG_MS("retry_in", 250), LOG_OPT("ordering_key", row->ordering_key));
 * f (for log_fields) ends with a LOG_FIELD_END entry; both are borrowed for the call. */
void log_fields(enum log_level level, const char *component, const char *msg,
                const struct log_field *f);
#define LOG_FIRST_(first, ...) first
#define LOG_REST_(first, ...)  __VA_ARGS__
#define log_event(level, component, ...)                                \
	log_fields((level), (component), LOG_FIRST_(__VA_ARGS__, NULL), \
	           (const struct log_field[]){ LOG_REST_(__VA_ARGS__, LOG_FIELDS_END) })

/* The same with the pairs in an array: kv[2i] is a key, kv[2i+1] its value (borrowed). */
void log_event_kv(enum log_level level, const char *component, const char *msg,
                  const char *const *kv, size_t npairs);

#endif
