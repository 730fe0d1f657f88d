/* The host:port parser of hostport.h. Strict on purpose: the address comes from an operator's
 * configuration, and a typo is better refused at start than bound somewhere unexpected. */
#include "base/hostport.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define NAME_CHARS "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-"
#define IPV6_CHARS "0123456789abcdefABCDEF:."

static int port_of(const char *p)
{
	int port = 0;
	size_t n = strlen(p);

	if (n == 0 || n > 5 || strspn(p, "0123456789") != n)
		return -1;
	for (size_t i = 0; i < n; i++)
		port = port * 10 + (p[i] - '0');
	return port >= 1 && port <= 65535 ? port : -1;
}

int hostport_parse(const char *s, struct hostport *out, char *err, size_t errlen)
{
	const char *host, *port_text;
	size_t hostlen;
	int port;

	if (err && errlen > 0)
		err[0] = '\0';
	if (s == NULL || s[0] == '\0') {
		if (err && errlen > 0)
			snprintf(err, errlen, "empty address: expected host:port");
		return -1;
	}
	if (s[0] == '[') {
		const char *close = strchr(s, ']');

		if (close == NULL || close[1] != ':' || close == s + 1 ||
		    strspn(s + 1, IPV6_CHARS) != (size_t)(close - s - 1)) {
			if (err && errlen > 0)
				snprintf(err, errlen, "bad address '%s': expected [ipv6]:port", s);
			return -1;
		}
		host = s + 1;
		hostlen = (size_t)(close - host);
		port_text = close + 2;
	} else {
		const char *colon = strchr(s, ':');

		/* Several colons without brackets is an IPv6 address whose port cannot be told. */
		if (colon == NULL || strchr(colon + 1, ':') != NULL ||
		    strspn(s, NAME_CHARS) != (size_t)(colon - s)) {
			if (err && errlen > 0)
				snprintf(err, errlen,
				         "bad address '%s': expected host:port, [ipv6]:port or "
				         ":port",
				         s);
			return -1;
		}
		host = s;
		hostlen = (size_t)(colon - s);
		port_text = colon + 1;
	}
	port = port_of(port_text);
	if (port < 0) {
		if (err && errlen > 0)
			snprintf(err, errlen, "bad port in address '%s': allowed 1..65535", s);
		return -1;
	}
	if (hostlen >= sizeof(out->host)) {
		if (err && errlen > 0)
			snprintf(err, errlen, "host name too long in address '%.64s...'", s);
		return -1;
	}
	memcpy(out->host, host, hostlen);
	out->host[hostlen] = '\0';
	out->port = port;
	return 0;
}
