/* Operator logs on stderr: one event a line, logfmt text or JSON. Only relay/ logs; the
 * other modules return errors with text and relay/ decides what to say, once. */
#ifndef OUTBOX_RELAY_LOG_H
#define OUTBOX_RELAY_LOG_H

#include <stdbool.h>
#include <stddef.h>

enum log_level { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR };
enum log_format { LOG_FORMAT_TEXT = 0, LOG_FORMAT_JSON };

/* Set once at start, before threads exist. Defaults: info, text. */
void log_setup(enum log_level min_level, enum log_format format);
bool log_enabled(enum log_level level);

/* Writes one line: ts, level, component, msg, then key/value string pairs terminated by a
 * NULL key. Text form:  ts=2026-11-30T05:54:05.123Z level=warn component=relay
 *   msg="could not publish, will retry in 4s" id="a1" error="no route"
 * JSON form: {"ts":"…","level":"warn","component":"relay","msg":"…","id":"a1",…}.
 * Values are quoted and escaped (text: when they contain space, quote, = or are empty; JSON:
 * always). A value may be NULL (written as ""). Thread-safe: each line is one write(2).
 * Never pass message bodies or secrets. */
void log_event(enum log_level level, const char *component, const char *msg, ...)
        __attribute__((sentinel));

/* The same with the pairs in an array: kv[2i] is a key, kv[2i+1] its value (borrowed). */
void log_event_kv(enum log_level level, const char *component, const char *msg,
                  const char *const *kv, size_t npairs);

#endif
