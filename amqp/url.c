/* Reading amqp.url: the comma-separated nodes of a cluster, each parsed by rabbitmq-c's own
 * amqp_parse_url(), at start (the configuration check) and at the first connect alike; when a
 * URL cannot be read, one line saying which part is wrong and how to write it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <amqp.h>

#include "amqp/broker_private.h"
#include "base/text.h"

/* Everything amqp_parse_url() splits a URL at: inside a part they must be percent-encoded. */
#define URL_DELIMS ":/@?#[]"

/* Whether part p (len bytes) holds a character rabbitmq-c would split it at (one of delims) or
 * a '%' it cannot decode; then why says which, naming the part ("the password"), never quoting
 * it. rabbitmq-c 0.11 decodes %00..%7F only. */
static bool part_wrong(const char *p, size_t len, const char *what, const char *delims, char *why,
                       size_t n)
{
	for (size_t i = 0; i < len; i++) {
		if (p[i] == '%') {
			int hi = i + 1 < len ? text_hex_value(p[i + 1]) : -1;
			int lo = hi >= 0 && i + 2 < len ? text_hex_value(p[i + 2]) : -1;

			if (hi < 0 || lo < 0) {
				snprintf(why, n,
				         "%s holds a '%%' that does not start a %%XX escape: "
				         "write a '%%' itself as %%25",
				         what);
				return true;
			}
			if (hi > 7) {
				snprintf(why, n,
				         "%s holds an escape above %%7F, which the AMQP client "
				         "cannot decode: use ASCII characters there",
				         what);
				return true;
			}
			i += 2;
		} else if (strchr(delims, p[i]) != NULL) {
			snprintf(why, n, "%s holds an unescaped '%c': percent-encode it as %%%02X",
			         what, p[i], (unsigned)(unsigned char)p[i]);
			return true;
		}
	}
	return false;
}

/* The first c in [from, end), or NULL. (Not memchr: GCC's -Wstringop-overread cannot tell
 * that from <= end here.) */
static const char *find_char(const char *from, const char *end, char c)
{
	for (; from < end; from++)
		if (*from == c)
			return from;
	return NULL;
}

/* Says why amqp_parse_url() refused u (len bytes, blanks trimmed). The userinfo ends at the
 * last '@' (as the operator meant it), the host at the first '/' after it. */
static void explain(const char *u, size_t len, char *why, size_t n)
{
	const char *end = u + len, *p, *at = NULL, *slash, *colon;

	if (len >= 7 && strncmp(u, "amqp://", 7) == 0) {
		p = u + 7;
	} else if (len >= 8 && strncmp(u, "amqps://", 8) == 0) {
		p = u + 8;
	} else {
		snprintf(why, n, "does not start with amqp:// or amqps://");
		return;
	}
	for (const char *c = p; c < end; c++)
		if (*c == '@')
			at = c;
	if (at != NULL) {
		colon = find_char(p, at, ':');
		if (part_wrong(p, (size_t)((colon ? colon : at) - p), "the user name", URL_DELIMS,
		               why, n))
			return;
		if (colon != NULL && part_wrong(colon + 1, (size_t)(at - colon - 1), "the password",
		                                URL_DELIMS, why, n))
			return;
		p = at + 1;
	}
	slash = find_char(p, end, '/');
	if (slash == NULL)
		slash = end;
	for (const char *c = p; c < end; c++) {
		if (*c == '?' || *c == '#') {
			snprintf(why, n,
			         "holds an unescaped '%c' (the AMQP client takes no query or "
			         "fragment): in a vhost write it as %%%02X",
			         *c, (unsigned)(unsigned char)*c);
			return;
		}
	}
	if (p < slash && *p == '[') {
		const char *close = find_char(p, slash, ']');

		if (close == NULL) {
			snprintf(why, n, "an IPv6 host is written in brackets: [::1]");
			return;
		}
		colon = close + 1 < slash && close[1] == ':' ? close + 1 : NULL;
		if (close + 1 < slash && colon == NULL) {
			snprintf(why, n, "only ':port' may follow an IPv6 host's ']'");
			return;
		}
	} else {
		colon = find_char(p, slash, ':');
		if (part_wrong(p, (size_t)((colon ? colon : slash) - p), "the host", "[]@", why, n))
			return;
	}
	if (colon != NULL) {
		const char *d = colon + 1;
		long port = 0;

		while (d < slash && *d >= '0' && *d <= '9' && port <= 65535)
			port = port * 10 + (*d++ - '0');
		if (d != slash || d == colon + 1 || port < 1 || port > 65535) {
			snprintf(why, n, "the port is not a number 1..65535");
			return;
		}
	}
	if (slash < end &&
	    part_wrong(slash + 1, (size_t)(end - slash - 1), "the vhost", URL_DELIMS, why, n))
		return;
	snprintf(why, n,
	         "the AMQP client cannot read it: write amqp://user:password@host:port/vhost, "
	         "with any of %% : / @ ? # [ ] inside a part percent-encoded");
}

void broker_url_nodes_free(struct node *nodes, size_t nnodes)
{
	for (size_t i = 0; i < nnodes; i++)
		free(nodes[i].buf);
	free(nodes);
}

int broker_url_parse(const char *url, struct node **out, size_t *nout, char *err, size_t n)
{
	const char *p = url != NULL ? url : "";
	struct node *nodes;
	size_t count = 1, done = 0;

	for (const char *c = p; *c != '\0'; c++)
		count += *c == ',';
	if (count > NODES_MAX) {
		snprintf(err, n, "more than %d URLs", NODES_MAX);
		return BROKER_ERR_CONFIG;
	}
	nodes = calloc(count, sizeof(*nodes));
	if (nodes == NULL) {
		snprintf(err, n, "out of memory");
		return BROKER_ERR_NOMEM;
	}
	for (size_t i = 0; i < count; i++) {
		struct node *nd = &nodes[i];
		size_t len = strcspn(p, ",");
		const char *s = p;
		char where[48] = "", why[240] = "";
		int rc;

		p += len + (p[len] == ',');
		while (len > 0 && (*s == ' ' || *s == '\t')) {
			s++;
			len--;
		}
		while (len > 0 && (s[len - 1] == ' ' || s[len - 1] == '\t'))
			len--;
		if (count > 1)
			snprintf(where, sizeof(where), "URL %zu of %zu: ", i + 1, count);
		nd->buf = strndup(s, len);
		if (nd->buf == NULL) {
			broker_url_nodes_free(nodes, done);
			snprintf(err, n, "out of memory");
			return BROKER_ERR_NOMEM;
		}
		done = i + 1;
		amqp_default_connection_info(&nd->ci);
		rc = len == 0 ? AMQP_STATUS_BAD_URL : amqp_parse_url(nd->buf, &nd->ci);
		if (len == 0)
			snprintf(why, sizeof(why), "empty");
		else if (rc != AMQP_STATUS_OK)
			explain(s, len, why, sizeof(why));
		else if (nd->ci.port < 1 || nd->ci.port > 65535)
			snprintf(why, sizeof(why), "the port is not a number 1..65535");
		if (why[0] != '\0') {
			broker_url_nodes_free(nodes, done);
			snprintf(err, n, "%s%s", where, why);
			return BROKER_ERR_CONFIG;
		}
		/* "amqp://host" and "amqp://host/" both mean the default vhost here, as
		 * operators expect; an explicitly empty vhost is not useful with RabbitMQ. */
		if (nd->ci.vhost == NULL || nd->ci.vhost[0] == '\0')
			nd->ci.vhost = "/";
		if (strchr(nd->ci.host, ':') != NULL) /* IPv6 */
			snprintf(nd->name, sizeof(nd->name), "[%s]:%d", nd->ci.host, nd->ci.port);
		else
			snprintf(nd->name, sizeof(nd->name), "%s:%d", nd->ci.host, nd->ci.port);
	}
	*out = nodes;
	*nout = count;
	return BROKER_OK;
}

int broker_check_url(const char *url, char *why, size_t n)
{
	struct node *nodes = NULL;
	size_t count = 0;
	int rc = broker_url_parse(url, &nodes, &count, why, n);

	if (rc == BROKER_OK)
		broker_url_nodes_free(nodes, count);
	return rc;
}
