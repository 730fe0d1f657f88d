/* "host:port" as the relay's listen address and the test tools write it: one parser for the
 * configuration check and the HTTP endpoint, so that what validates also binds. */
#ifndef OUTBOX_BASE_HOSTPORT_H
#define OUTBOX_BASE_HOSTPORT_H

#include <stddef.h>

struct hostport {
	char host[256]; /* "" for ":port" (every address); IPv6 without its brackets */
	int port;       /* 1..65535 */
};

/* Parses "host:port", "[ipv6]:port" or ":port". A host is a name or an IPv4 address (letters,
 * digits, '.', '-') or, in brackets, an IPv6 address (hex digits, ':', '.'). On success fills
 * *out and returns 0; otherwise returns -1, leaves *out alone and writes one line saying what
 * is wrong to err (errlen bytes, may be 0). */
int hostport_parse(const char *s, struct hostport *out, char *err, size_t errlen)
        __attribute__((warn_unused_result));

#endif
