/* Where the store connects and each attempt: every host and address libpq would try (the
 * connection string completed from PG* variables and service files, each host name's
 * addresses), tried in turn with a timeout of its own, polled against the shutdown deadline. */
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "base/clock.h"
#include "store/store.h"
#include "store/store_private.h"

/* Per host tried, unless the connection string sets connect_timeout itself. */
#define CONNECT_TIMEOUT_S "10"
/* Keywords a connection string may repeat per host (libpq's host lists). */
#define HOST_LIST_MAX 16
/* Addresses tried per host name, and in all: each has its own timeout. */
#define ADDRS_PER_HOST_MAX 8
#define TARGETS_MAX        64

void store_attempt_add(struct store_attempt *a, const char *key, const char *val)
{
	if (a->n < (int)(sizeof(a->keys) / sizeof(a->keys[0])) - 1 && val) {
		a->keys[a->n] = key;
		a->vals[a->n] = val;
		a->n++;
	}
	a->keys[a->n] = NULL;
	a->vals[a->n] = NULL;
}

/* One connection attempt, polled so that neither a silent host nor the shutdown deadline can
 * hold it longer than its timeout (libpq enforces connect_timeout only in its blocking
 * calls). Returns the connection (maybe CONNECTION_BAD: PQerrorMessage says why) or NULL on
 * out of memory; *aborted tells that the shutdown deadline ended it. */
PGconn *store_connect_once(struct store *s, const struct store_attempt *a, int expand,
                           bool *aborted)
{
	int64_t deadline = a->timeout_ms > 0 ? clock_mono_ms() + a->timeout_ms : 0;
	PGconn *c = PQconnectStartParams(a->keys, a->vals, expand);
	PostgresPollingStatusType st = PGRES_POLLING_WRITING;

	*aborted = false;
	if (!c || PQstatus(c) == CONNECTION_BAD)
		return c;
	while (st != PGRES_POLLING_OK && st != PGRES_POLLING_FAILED) {
		PGconn *saved = s->conn;
		bool ready;

		/* store_wait_socket() polls s->conn's socket; the socket changes while libpq
		 * walks the addresses of a host, so it is looked up each time. */
		s->conn = c;
		pthread_mutex_lock(&s->fd_lock);
		s->fd = PQsocket(c);
		pthread_mutex_unlock(&s->fd_lock);
		ready = store_wait_socket(s, st == PGRES_POLLING_WRITING, deadline);
		store_forget_fd(s);
		s->conn = saved;
		if (!ready) {
			*aborted = s->aborted;
			s->aborted = false;
			s->no_answer = false;
			PQfinish(c);
			return NULL;
		}
		st = PQconnectPoll(c);
	}
	return c;
}

/* The timeout of one attempt: the connection string's connect_timeout, else ours. libpq
 * reads it as whole seconds, values below 2 meaning 2. */
static int64_t attempt_timeout_ms(const PQconninfoOption *opts)
{
	for (const PQconninfoOption *o = opts; o && o->keyword; o++) {
		if (strcmp(o->keyword, "connect_timeout") == 0 && o->val && o->val[0]) {
			long v = strtol(o->val, NULL, 10);

			return v <= 0 ? 0 : (v < 2 ? 2 : v) * 1000;
		}
	}
	return strtol(CONNECT_TIMEOUT_S, NULL, 10) * 1000;
}

/* Splits a comma-separated libpq list into at most HOST_LIST_MAX parts (in place). */
static int split_list(char *v, char **parts)
{
	int n = 0;

	if (!v || !v[0])
		return 0;
	for (char *p = v; n < HOST_LIST_MAX; n++) {
		parts[n] = p;
		p = strchr(p, ',');
		if (!p) {
			n++;
			break;
		}
		*p++ = '\0';
	}
	return n;
}

/* Our settings first, the user's after: libpq keeps the last value of a repeated keyword,
 * so anything the user sets wins. Keepalives notice a dead peer (a pulled cable, a
 * failed-over VIP) in about 25 s instead of the kernel's 2 hours while the connection is
 * idle; tcp_user_timeout does the same while a request is unanswered at the TCP level.
 * target_session_attrs=read-write: the relay writes on every connection, so a standby (or a
 * primary that came back as one after a failover) is never chosen. */
void store_add_defaults(struct store *s, struct store_attempt *a, char *user_timeout, size_t n)
{
	snprintf(user_timeout, n, "%lld", (long long)(s->opts.admin ? 0 : s->opts.lease_ms));
	store_attempt_add(a, "application_name",
	                  s->opts.application_name ? s->opts.application_name : "outbox-relay");
	store_attempt_add(a, "keepalives", "1");
	store_attempt_add(a, "keepalives_idle", "10");
	store_attempt_add(a, "keepalives_interval", "5");
	store_attempt_add(a, "keepalives_count", "3");
	store_attempt_add(a, "connect_timeout", CONNECT_TIMEOUT_S);
	store_attempt_add(a, "tcp_user_timeout", user_timeout);
	store_attempt_add(a, "target_session_attrs", "read-write");
	store_attempt_add(a, "client_encoding", "UTF8");
}

/* What libpq would connect to: the host, hostaddr, port and connect_timeout values of the
 * connection string completed the way libpq completes it, from a service file entry (service=
 * or PGSERVICE) and the PG* environment variables (PGHOST=a,b, PGPORT, PGHOSTADDR, ...).
 * libpq has no call that does only this: a start whose options are read and then refused,
 * before any name is looked up or any socket made (an unknown target_session_attrs), leaves
 * the completed values on the connection for PQconninfo(). Returns the option array (free
 * with PQconninfoFree) or NULL, then the caller uses the string as it is. */
static PQconninfoOption *completed_options(const struct store_attempt *base)
{
	struct store_attempt probe = *base;
	PQconninfoOption *opts = NULL;
	PGconn *c;

	store_attempt_add(&probe, "target_session_attrs", "not-a-value-only-read-the-options");
	c = PQconnectStartParams(probe.keys, probe.vals, 0);
	if (c && PQstatus(c) == CONNECTION_BAD && PQsocket(c) < 0)
		opts = PQconninfo(c);
	PQfinish(c);
	return opts;
}

static const char *option_value(const PQconninfoOption *opts, const char *key)
{
	for (const PQconninfoOption *o = opts; o && o->keyword; o++)
		if (strcmp(o->keyword, key) == 0)
			return o->val && o->val[0] ? o->val : NULL;
	return NULL;
}

/* One address to try: the host as written (TLS verification, .pgpass and the logs use it),
 * one of its addresses (hostaddr; "" = let libpq look it up or use a socket directory), the
 * port ("" = libpq's default). */
struct target {
	char host[256];
	char addr[INET6_ADDRSTRLEN + 32];
	char port[16];
};

static void target_set(struct target *t, const char *host, const char *addr, const char *port)
{
	snprintf(t->host, sizeof(t->host), "%s", host);
	snprintf(t->addr, sizeof(t->addr), "%s", addr);
	snprintf(t->port, sizeof(t->port), "%s", port);
}

/* Adds host's targets to t (at most max - *n): one per address the name resolves to, in the
 * order getaddrinfo() gives them, as libpq would try them, so that each gets a deadline of its
 * own. A socket directory, an address, or a name that does not resolve is one target, left to
 * libpq (which says why it failed). */
static void add_targets(struct target *t, int *n, int max, const char *host, const char *addr,
                        const char *port)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	struct addrinfo *res = NULL;
	int first = *n;

	if (*n >= max)
		return;
	if (addr[0] || !host[0] || host[0] == '/' || host[0] == '@' ||
	    getaddrinfo(host, NULL, &hints, &res) != 0) {
		target_set(&t[(*n)++], host, addr, port);
		return;
	}
	for (struct addrinfo *ai = res; ai && *n < max && *n - first < ADDRS_PER_HOST_MAX;
	     ai = ai->ai_next) {
		char num[INET6_ADDRSTRLEN + 32];
		bool seen = false;

		if (getnameinfo(ai->ai_addr, ai->ai_addrlen, num, sizeof(num), NULL, 0,
		                NI_NUMERICHOST) != 0)
			continue;
		for (int k = first; k < *n && !seen; k++)
			seen = strcmp(t[k].addr, num) == 0;
		if (!seen)
			target_set(&t[(*n)++], host, num, port);
	}
	freeaddrinfo(res);
	if (*n == first)
		target_set(&t[(*n)++], host, "", port);
}

/* The keywords every attempt shares: our defaults, then the connection string's own values but
 * host, hostaddr and port, which each target sets. Returns what libpq completes the string's
 * host list to (see completed_options()), or NULL. base borrows from opts and user_timeout. */
static PQconninfoOption *base_attempt(struct store *s, const PQconninfoOption *opts,
                                      struct store_attempt *base, char *user_timeout, size_t n)
{
	struct store_attempt probe;

	store_add_defaults(s, base, user_timeout, n);
	for (const PQconninfoOption *o = opts; o->keyword; o++) {
		if (o->val && strcmp(o->keyword, "host") != 0 &&
		    strcmp(o->keyword, "hostaddr") != 0 && strcmp(o->keyword, "port") != 0)
			store_attempt_add(base, o->keyword, o->val);
	}
	/* The string's own values first: they win over the environment and a service entry. */
	probe = *base;
	for (const PQconninfoOption *o = opts; o->keyword; o++)
		if (o->val &&
		    (strcmp(o->keyword, "host") == 0 || strcmp(o->keyword, "hostaddr") == 0 ||
		     strcmp(o->keyword, "port") == 0))
			store_attempt_add(&probe, o->keyword, o->val);
	return completed_options(&probe);
}

/* Every address to try, in libpq's order, from the host, hostaddr and port lists of hosts
 * (the completed options, else only what the string says: libpq completes the rest inside
 * one attempt). Returns a new array of *nt targets (caller frees), NULL when out of memory. */
static struct target *make_targets(struct store *s, const PQconninfoOption *hosts_from, int *nt)
{
	char *hosts, *addrs, *ports;
	char *host_v[HOST_LIST_MAX], *addr_v[HOST_LIST_MAX], *port_v[HOST_LIST_MAX];
	struct target *targets;
	const char *v;
	int nh, na, np, count, n = 0;

	hosts = (v = option_value(hosts_from, "host")) ? strdup(v) : NULL;
	addrs = (v = option_value(hosts_from, "hostaddr")) ? strdup(v) : NULL;
	ports = (v = option_value(hosts_from, "port")) ? strdup(v) : NULL;
	nh = split_list(hosts, host_v);
	na = split_list(addrs, addr_v);
	np = split_list(ports, port_v);
	count = nh > na ? nh : na;
	if (count == 0)
		count = 1; /* libpq's default socket */
	targets = calloc(TARGETS_MAX, sizeof(*targets));
	if (!targets) {
		store_set_error(s, "out of memory");
		goto out;
	}
	for (int i = 0; i < count; i++)
		add_targets(targets, &n, TARGETS_MAX, i < nh ? host_v[i] : "",
		            i < na ? addr_v[i] : "",
		            np == 1 ? port_v[0] : (i < np ? port_v[i] : ""));
	*nt = n;
out:
	free(hosts);
	free(addrs);
	free(ports);
	return targets;
}

/* Tries the targets in turn until one accepts and is writable (s->conn); otherwise the last
 * failure stays in the error message, with s->server naming where it happened. */
static int try_targets(struct store *s, const struct store_attempt *base,
                       const struct target *targets, int nt)
{
	bool aborted = false;

	for (int i = 0; i < nt; i++) {
		const struct target *t = &targets[i];
		struct store_attempt a = *base;
		PGconn *c;

		if (t->host[0])
			store_attempt_add(&a, "host", t->host);
		if (t->addr[0])
			store_attempt_add(&a, "hostaddr", t->addr);
		if (t->port[0])
			store_attempt_add(&a, "port", t->port);
		c = store_connect_once(s, &a, 0, &aborted);
		if (!c) {
			if (aborted) {
				store_set_line(s, "could not connect to PostgreSQL",
				               "stopped at the shutdown deadline");
				return STORE_ERR_ABORTED;
			}
			snprintf(s->server, sizeof(s->server), "%s:%s",
			         t->host[0] ? t->host : t->addr, t->port);
			if (t->addr[0] && t->host[0] && strcmp(t->host, t->addr) != 0)
				store_set_error(
				        s,
				        "could not connect to PostgreSQL at %s (%s): timeout "
				        "expired",
				        s->server, t->addr);
			else
				store_set_error(
				        s, "could not connect to PostgreSQL at %s: timeout expired",
				        s->server);
			continue;
		}
		if (PQstatus(c) == CONNECTION_OK) {
			s->conn = c;
			return 0;
		}
		snprintf(s->server, sizeof(s->server), "%s:%s", PQhost(c) ? PQhost(c) : "",
		         PQport(c) ? PQport(c) : "");
		store_set_line(s, "could not connect to PostgreSQL", PQerrorMessage(c));
		PQfinish(c);
	}
	return STORE_ERR_CONN;
}

/* Connects to the first address that accepts and is writable, of every host libpq would try —
 * written in database.url, given by PGHOST or a service file entry — and of every address a
 * host name resolves to, giving each its own timeout: a host that silently drops packets must
 * not keep the relay from the next one, as after a failover where the old primary's machine
 * is gone. */
int store_open_connection(struct store *s)
{
	char *errbuf = NULL;
	char user_timeout[24];
	PQconninfoOption *opts, *done;
	struct store_attempt base = { .n = 0 };
	struct target *targets;
	int nt = 0, rc;

	opts = PQconninfoParse(s->opts.conninfo ? s->opts.conninfo : "", &errbuf);
	if (!opts) {
		rc = errbuf ? STORE_ERR_FATAL : STORE_ERR_NOMEM;
		store_set_line(s, "invalid database.url", errbuf ? errbuf : "out of memory");
		PQfreemem(errbuf);
		return rc;
	}
	done = base_attempt(s, opts, &base, user_timeout, sizeof(user_timeout));
	base.timeout_ms = attempt_timeout_ms(done ? done : opts);
	targets = make_targets(s, done ? done : opts, &nt);
	rc = targets ? try_targets(s, &base, targets, nt) : STORE_ERR_NOMEM;
	PQconninfoFree(opts);
	PQconninfoFree(done);
	free(targets);
	return rc;
}
