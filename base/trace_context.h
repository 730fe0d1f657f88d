/* trace_context.h — W3C Trace Context (https://www.w3.org/TR/trace-context/) as it rides with
 * a message: the producer library refuses a malformed traceparent or tracestate before it is
 * stored, and the relay reads the trace id out of a stored traceparent for its log lines. */
#ifndef OUTBOX_BASE_TRACE_CONTEXT_H
#define OUTBOX_BASE_TRACE_CONTEXT_H

#include <stddef.h>

#define TRACE_ID_HEX        32  /* hex digits of a trace-id */
#define TRACE_PARENT_MAX    512 /* characters of a traceparent of a later version */
#define TRACE_STATE_MAX     512 /* characters of a tracestate (the spec's "at least 512") */
#define TRACE_STATE_MEMBERS 32  /* list-members of a tracestate */

/* Checks the traceparent s[0, len). Version 00 is exactly
 * "00-<32 hex trace-id>-<16 hex parent-id>-<2 hex flags>", lowercase hex, neither id all
 * zeros; a later version (01..fe; ff is forbidden) is read as the spec's forward
 * compatibility says: at least 55 characters, the same three fields where version 00 has
 * them, then the end or a dash and more (printable ASCII, at most TRACE_PARENT_MAX in all).
 * Returns NULL when valid, and then writes the trace-id and a NUL into trace_id (33 bytes)
 * unless it is NULL; else a short phrase saying what is wrong (static). */
const char *trace_parent_check(const char *s, size_t len, char *trace_id);

/* Checks the tracestate s[0, len): list-members separated by commas, each key=value, with
 * optional spaces and tabs around them, at most TRACE_STATE_MEMBERS of them, no key twice, at
 * most TRACE_STATE_MAX characters. A key is the spec's simple key (a lowercase letter, then
 * up to 255 of a-z 0-9 _ - * /) or multi-tenant key (tenant@system: a lowercase letter or
 * digit then up to 240 of those, '@', a lowercase letter then up to 13); a value is 1 to 256
 * printable ASCII characters but ',' and '=', not ending in a space. Empty members are
 * allowed, as the spec says. Returns NULL when valid, with the number of non-empty members
 * in *members (may be NULL); else a short phrase saying what is wrong (static). */
const char *trace_state_check(const char *s, size_t len, int *members);

#endif
