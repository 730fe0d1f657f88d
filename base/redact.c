/* Finds the secrets of connection strings (libpq conninfo and URIs, AMQP URLs and lists of
 * them) by parsing them the way libpq and rabbitmq-c do, leaning towards masking more wherever
 * those parsers and the writer's intent may differ; then masks them in the string itself
 * (redact_conninfo) or in a message about the connection (redact_message). */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/redact.h"
#include "base/text.h"

/* More spans than this in one string is not a configuration; the rest is masked whole. */
#define SPANS_MAX 64
/* redact_message gives up (and masks everything) past this many bytes of secret forms. */
#define SECRETS_BYTES_MAX (4u * 1024 * 1024)

#define BLANKS " \t\n\r\f\v"
/* Where a library may cut a secret that holds one of the trigger characters below: libpq's
 * userinfo, host list and query delimiters, rabbitmq-c's find_delim() set, conninfo blanks. */
#define PIECE_CUTS "@:/?#[],&=" BLANKS
/* libpq ends the userinfo at the first '@', and sees none when a '/' comes first. */
#define TRIGGERS_LIBPQ "@/"
/* rabbitmq-c 0.11 ends user and password at the first of these (amqp_url.c find_delim). */
#define TRIGGERS_RABBITMQ ":@/?#[]"

enum span_kind {
	SPAN_PLAIN,    /* as written */
	SPAN_URI,      /* percent-encoded */
	SPAN_CONNINFO, /* a libpq conninfo value: maybe quoted, backslash escapes */
};

/* A secret: bytes [start, start + len) of the scanned string. */
struct span {
	size_t start, len;
	enum span_kind kind;
	/* When the secret holds one of these, a library cuts it into pieces that its errors may
	 * echo one by one (a host name, a keyword): look for the pieces too. NULL = never. */
	const char *triggers;
};

struct spans {
	const char *s;
	size_t len;
	struct span v[SPANS_MAX];
	size_t n;
	bool full; /* out of room: the last span runs to the end of s */
};

enum kw_class { KW_PUBLIC, KW_SECRET, KW_UNKNOWN };

/* libpq's keywords (up to PostgreSQL 17) whose values are not secrets, and "ssl" (URI
 * only). A keyword libpq does not know has its value masked: it may be a misspelt password
 * keyword, and libpq refuses it anyway. */
static const char *const public_keywords[] = {
	"host",
	"hostaddr",
	"port",
	"dbname",
	"user",
	"passfile",
	"channel_binding",
	"connect_timeout",
	"client_encoding",
	"options",
	"application_name",
	"fallback_application_name",
	"keepalives",
	"keepalives_idle",
	"keepalives_interval",
	"keepalives_count",
	"tcp_user_timeout",
	"replication",
	"sslmode",
	"sslnegotiation",
	"sslcompression",
	"sslcert",
	"sslkey",
	"sslcertmode",
	"sslrootcert",
	"sslcrl",
	"sslcrldir",
	"sslsni",
	"requirepeer",
	"require_auth",
	"ssl_min_protocol_version",
	"ssl_max_protocol_version",
	"gssencmode",
	"krbsrvname",
	"gsslib",
	"gssdelegation",
	"service",
	"target_session_attrs",
	"load_balance_hosts",
	"ssl",
};

static const char *const secret_keywords[] = { "password", "sslpassword" };

/* ---- small helpers ---- */

static bool is_blank(char c)
{
	return c != '\0' && strchr(BLANKS, c) != NULL;
}

static bool is_alpha(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static bool is_digit(char c)
{
	return c >= '0' && c <= '9';
}

static char lower(char c)
{
	return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

/* True when s[a, b) holds one of the characters of set (NUL never counts). */
static bool has_any(const char *s, size_t a, size_t b, const char *set)
{
	for (size_t i = a; i < b; i++) {
		if (s[i] != '\0' && strchr(set, s[i]))
			return true;
	}
	return false;
}

/* True when s[a, b) holds the string w. */
static bool contains(const char *s, size_t a, size_t b, const char *w)
{
	size_t len = strlen(w);

	for (size_t i = a; i + len <= b; i++) {
		if (memcmp(s + i, w, len) == 0)
			return true;
	}
	return false;
}

/* Length of "scheme://" at s (avail bytes), or 0 when s does not start with one. libpq only
 * knows postgresql:// and postgres:// and reads anything else as a conninfo, but a URI it
 * refuses ("PostgreSQL://u:p@h") is still a URI to whoever wrote it, password included. */
static size_t scheme_len(const char *s, size_t avail)
{
	size_t i = 0;

	if (avail == 0 || !is_alpha(s[0]))
		return 0;
	while (i < avail &&
	       (is_alpha(s[i]) || is_digit(s[i]) || s[i] == '+' || s[i] == '-' || s[i] == '.'))
		i++;
	if (avail - i >= 3 && memcmp(s + i, "://", 3) == 0)
		return i + 3;
	return 0;
}

static bool word_is(const char *w, size_t len, const char *name)
{
	size_t i;

	for (i = 0; i < len && name[i]; i++) {
		if (lower(w[i]) != name[i])
			return false;
	}
	return i == len && name[i] == '\0';
}

/* The characters whose presence in a userinfo password makes the library of this scheme
 * parse the URI differently from us. */
static const char *scheme_triggers(const char *scheme, size_t len)
{
	if (word_is(scheme, len, "postgresql") || word_is(scheme, len, "postgres"))
		return TRIGGERS_LIBPQ;
	if (word_is(scheme, len, "amqp") || word_is(scheme, len, "amqps"))
		return TRIGGERS_RABBITMQ;
	return TRIGGERS_LIBPQ TRIGGERS_RABBITMQ;
}

/* Keywords compare without regard to case (libpq's do not, but "PASSWORD" is a password to
 * whoever wrote it); URI query keywords are percent-decoded first, as libpq does. */
static enum kw_class classify(const char *kw, size_t len, bool percent)
{
	char buf[64];
	size_t n = 0;

	for (size_t i = 0; i < len; i++) {
		char c = kw[i];

		if (percent && c == '%' && i + 2 < len && text_hex_value(kw[i + 1]) >= 0 &&
		    text_hex_value(kw[i + 2]) >= 0) {
			c = (char)(text_hex_value(kw[i + 1]) * 16 + text_hex_value(kw[i + 2]));
			i += 2;
		}
		if (n + 1 >= sizeof(buf))
			return KW_UNKNOWN;
		buf[n++] = c;
	}
	for (size_t i = 0; i < sizeof(secret_keywords) / sizeof(secret_keywords[0]); i++) {
		if (word_is(buf, n, secret_keywords[i]))
			return KW_SECRET;
	}
	for (size_t i = 0; i < sizeof(public_keywords) / sizeof(public_keywords[0]); i++) {
		if (word_is(buf, n, public_keywords[i]))
			return KW_PUBLIC;
	}
	return KW_UNKNOWN;
}

/* Whether a dbname value p[0, len) (percent-encoded in a URI) is itself a connection string,
 * which libpq expands in some calls: "host=h password=x" or "postgresql://u:x@h/db". */
static bool holds_conninfo(const char *p, size_t len, bool percent)
{
	char buf[512] = ""; /* initialised for GCC 12 at -O1, which cannot see n bounds the reads */
	size_t n = 0;

	if (!percent)
		return has_any(p, 0, len, "=") || contains(p, 0, len, "://");
	if (len > sizeof(buf))
		return true; /* too long to look at: mask it */
	for (size_t i = 0; i < len; i++) {
		if (p[i] == '%' && i + 2 < len && text_hex_value(p[i + 1]) >= 0 &&
		    text_hex_value(p[i + 2]) >= 0) {
			buf[n++] = (char)(text_hex_value(p[i + 1]) * 16 + text_hex_value(p[i + 2]));
			i += 2;
		} else {
			buf[n++] = p[i];
		}
	}
	return has_any(buf, 0, n, "=") || contains(buf, 0, n, "://");
}

/* ---- finding the secrets ---- */

static void mark(struct spans *sp, size_t start, size_t end, enum span_kind kind,
                 const char *triggers)
{
	if (end <= start)
		return;
	if (sp->full) {
		/* The last span already runs to the end; only let it start earlier. */
		struct span *last = &sp->v[sp->n - 1];

		if (start < last->start) {
			last->len += last->start - start;
			last->start = start;
		}
		return;
	}
	if (sp->n == SPANS_MAX - 1) {
		/* Out of room: mask everything from here on rather than let a secret through. */
		sp->v[sp->n++] = (struct span){ start, sp->len - start, SPAN_PLAIN, NULL };
		sp->full = true;
		return;
	}
	sp->v[sp->n++] = (struct span){ start, end - start, kind, triggers };
}

/* A run of keyword=value pairs (conninfo) or key=value parameters (URI query) whose values
 * are secret or doubtful, with what follows them up to the next known keyword: libpq reads
 * "password=a b host=h" as the password "a" and then a word "b" that it echoes in its
 * error, but the writer meant the password "a b". */
struct run {
	bool open;
	size_t start, end;
	enum span_kind kind;
	bool extended; /* more than one value: it may be cut at blanks, '&' or '=' */
};

static void run_close(struct spans *sp, struct run *r, const char *triggers)
{
	if (r->open)
		mark(sp, r->start, r->end, r->kind, r->extended ? triggers : NULL);
	r->open = false;
}

/* Adds the value s[start, end) of one keyword=value of class cls (or a lone word) to the run:
 * a secret or doubtful value opens a run, a public one closes it. */
static void run_add(struct spans *sp, struct run *r, enum kw_class cls, size_t start, size_t end,
                    enum span_kind kind, const char *triggers)
{
	if (r->open && cls != KW_PUBLIC) {
		r->end = end;
		r->extended = true;
		return;
	}
	run_close(sp, r, triggers);
	if (cls != KW_PUBLIC)
		*r = (struct run){ true, start, end, kind, false };
}

/* End of a conninfo value starting at p, as libpq's conninfo_parse() reads it. */
static size_t conninfo_value_end(const char *s, size_t p, size_t b)
{
	if (p < b && s[p] == '\'') {
		for (p++; p < b && s[p] != '\''; p++) {
			if (s[p] == '\\' && p + 1 < b)
				p++;
		}
		/* An unterminated quote runs to the end: libpq refuses it, we mask it all. */
		return p < b ? p + 1 : b;
	}
	for (; p < b && !is_blank(s[p]); p++) {
		if (s[p] == '\\' && p + 1 < b)
			p++;
	}
	return p;
}

static void scan_conninfo(struct spans *sp, size_t a, size_t b)
{
	const char *s = sp->s;
	struct run r = { false, 0, 0, SPAN_CONNINFO, false };
	size_t p = a;

	while (p < b) {
		size_t kw, kw_end, v, v_end;
		enum kw_class cls;

		if (is_blank(s[p])) {
			p++;
			continue;
		}
		kw = p;
		while (p < b && s[p] != '=' && !is_blank(s[p]))
			p++;
		kw_end = p;
		while (p < b && is_blank(s[p]))
			p++;
		if (p >= b || s[p] != '=') {
			/* A word without '=': libpq stops with 'missing "=" after "<word>"'. */
			run_add(sp, &r, KW_UNKNOWN, kw, kw_end, SPAN_CONNINFO, BLANKS);
			continue;
		}
		p++;
		/* libpq skips blanks after '=': in "password= host=x" the password is "host=x". */
		while (p < b && is_blank(s[p]))
			p++;
		v = p;
		v_end = p = conninfo_value_end(s, p, b);
		cls = classify(s + kw, kw_end - kw, false);
		run_add(sp, &r, cls, v, v_end, SPAN_CONNINFO, BLANKS);
		/* A dbname may itself be a connection string (expand_dbname): all of it goes. */
		if (cls == KW_PUBLIC && word_is(s + kw, kw_end - kw, "dbname") &&
		    holds_conninfo(s + v, v_end - v, false))
			mark(sp, v, v_end, SPAN_CONNINFO, NULL);
	}
	run_close(sp, &r, BLANKS);
}

static void scan_query(struct spans *sp, size_t a, size_t b)
{
	const char *s = sp->s;
	struct run r = { false, 0, 0, SPAN_URI, false };
	size_t p = a;

	while (p < b) {
		size_t seg = p, end = p, eq;

		while (end < b && s[end] != '&')
			end++;
		for (eq = seg; eq < end && s[eq] != '='; eq++)
			;
		if (eq < end) {
			enum kw_class cls = classify(s + seg, eq - seg, true);

			run_add(sp, &r, cls, eq + 1, end, SPAN_URI, "&=");
			if (cls == KW_PUBLIC && word_is(s + seg, eq - seg, "dbname") &&
			    holds_conninfo(s + eq + 1, end - eq - 1, true))
				mark(sp, eq + 1, end, SPAN_URI, NULL);
		} else { /* no '=': libpq echoes the word in its error */
			run_add(sp, &r, KW_UNKNOWN, seg, end, SPAN_URI, "&=");
		}
		p = end + 1;
	}
	run_close(sp, &r, "&=");
}

static bool all_digits(const char *s, size_t a, size_t b)
{
	for (size_t i = a; i < b; i++) {
		if (!is_digit(s[i]))
			return false;
	}
	return true;
}

/* "h1:5432,[::1]:5433,h3": a port that is not a number is masked, since it is most likely
 * the rest of a password whose '/' or '@' the libraries took for a delimiter. */
static void scan_hosts(struct spans *sp, size_t a, size_t b)
{
	const char *s = sp->s;
	size_t p = a;

	while (p < b) {
		if (s[p] == '[') {
			while (p < b && s[p] != ']')
				p++;
		}
		while (p < b && s[p] != ':' && s[p] != ',')
			p++;
		if (p < b && s[p] == ':') {
			size_t port = ++p;

			while (p < b && s[p] != ',')
				p++;
			if (!all_digits(s, port, p))
				mark(sp, port, p, SPAN_URI, NULL);
		}
		if (p < b)
			p++; /* the comma */
	}
}

/* One URI, s[a, b). */
static void scan_uri(struct spans *sp, size_t a, size_t b)
{
	const char *s = sp->s;
	size_t pre = scheme_len(s + a, b - a);
	size_t auth = a + pre, rest = auth, at = SIZE_MAX, p;

	/* The last '@': a raw '@' (or '/', '?', '#') in a password must not leave the rest of
	 * it in view. An '@' in the path or query makes us mask too much, never too little. */
	for (size_t i = auth; i < b; i++) {
		if (s[i] == '@')
			at = i;
	}
	if (at != SIZE_MAX) {
		size_t colon = auth;

		while (colon < at && s[colon] != ':')
			colon++;
		if (has_any(s, auth, colon, "/?#&=" BLANKS))
			/* The "user" runs into a path or query: no telling where the password is. */
			mark(sp, auth, at, SPAN_URI, TRIGGERS_LIBPQ TRIGGERS_RABBITMQ);
		else if (colon < at)
			mark(sp, colon + 1, at, SPAN_URI, scheme_triggers(s + a, pre - 3));
		rest = at + 1;
	}
	for (p = rest; p < b && s[p] != '/' && s[p] != '?';)
		p++;
	scan_hosts(sp, rest, p);
	while (p < b && s[p] != '?')
		p++;
	if (p < b)
		scan_query(sp, p + 1, b);
}

/* s[a, end): URIs separated by commas. A comma starts a new URI only when a scheme follows
 * it (blanks allowed before), so a libpq host list or a comma in a password stays whole. */
static void scan_uri_list(struct spans *sp, size_t a)
{
	const char *s = sp->s;
	size_t start = a;

	for (size_t i = a; i < sp->len; i++) {
		size_t j = i + 1;

		if (s[i] != ',')
			continue;
		while (j < sp->len && is_blank(s[j]))
			j++;
		if (scheme_len(s + j, sp->len - j) == 0)
			continue;
		scan_uri(sp, start, i);
		start = j;
		i = j - 1;
	}
	scan_uri(sp, start, sp->len);
}

static void sort_spans(struct spans *sp)
{
	for (size_t i = 1; i < sp->n; i++) {
		struct span v = sp->v[i];
		size_t j = i;

		while (j > 0 && sp->v[j - 1].start > v.start) {
			sp->v[j] = sp->v[j - 1];
			j--;
		}
		sp->v[j] = v;
	}
}

static void scan(struct spans *sp, const char *s)
{
	size_t p = 0;

	sp->s = s ? s : "";
	sp->len = strlen(sp->s);
	sp->n = 0;
	sp->full = false;
	/* Leading blanks make libpq read a URI as a conninfo, which then echoes it whole. */
	while (p < sp->len && is_blank(sp->s[p]))
		p++;
	if (scheme_len(sp->s + p, sp->len - p))
		scan_uri_list(sp, p);
	else
		scan_conninfo(sp, p, sp->len);
	sort_spans(sp);
}

/* ---- output ---- */

/* Bounded output: always NUL-terminated, silently truncated at n - 1 bytes. */
struct out_buf {
	char *p;
	size_t n, len;
};

static void put(struct out_buf *o, const char *s, size_t len)
{
	for (size_t i = 0; i < len && o->len + 1 < o->n; i++)
		o->p[o->len++] = s[i];
	o->p[o->len] = '\0';
}

/* Merged runs of sorted spans: the run at or after *i, returned as [*start, *end). */
static bool next_run(const struct spans *sp, size_t *i, size_t *start, size_t *end)
{
	if (*i >= sp->n)
		return false;
	*start = sp->v[*i].start;
	*end = *start + sp->v[*i].len;
	for ((*i)++; *i < sp->n && sp->v[*i].start <= *end; (*i)++) {
		size_t e = sp->v[*i].start + sp->v[*i].len;

		if (e > *end)
			*end = e;
	}
	return true;
}

void redact_conninfo(const char *s, char *out, size_t n)
{
	struct out_buf o = { out, n, 0 };
	struct spans sp;
	size_t pos = 0, i = 0, start, end;

	if (!out || n == 0)
		return;
	out[0] = '\0';
	scan(&sp, s);
	while (next_run(&sp, &i, &start, &end)) {
		put(&o, sp.s + pos, start - pos);
		put(&o, REDACT_MASK, strlen(REDACT_MASK));
		pos = end;
	}
	put(&o, sp.s + pos, sp.len - pos);
}

/* ---- secrets in messages ---- */

struct secrets {
	char **v;
	size_t *len;
	size_t n, cap, bytes;
	bool failed;
};

/* Adds a copy of p[0, len) unless it is empty or known already. */
static void secret_add(struct secrets *ss, const char *p, size_t len)
{
	char *copy;

	if (ss->failed || len == 0)
		return;
	for (size_t i = 0; i < ss->n; i++) {
		if (ss->len[i] == len && memcmp(ss->v[i], p, len) == 0)
			return;
	}
	if (ss->bytes + len > SECRETS_BYTES_MAX) {
		ss->failed = true;
		return;
	}
	if (ss->n == ss->cap) {
		size_t cap = ss->cap ? ss->cap * 2 : 16;
		char **v = realloc(ss->v, cap * sizeof(*v));
		size_t *l;

		if (!v) {
			ss->failed = true;
			return;
		}
		ss->v = v;
		l = realloc(ss->len, cap * sizeof(*l));
		if (!l) {
			ss->failed = true;
			return;
		}
		ss->len = l;
		ss->cap = cap;
	}
	copy = malloc(len);
	if (!copy) {
		ss->failed = true;
		return;
	}
	memcpy(copy, p, len);
	ss->v[ss->n] = copy;
	ss->len[ss->n] = len;
	ss->n++;
	ss->bytes += len;
}

static void secrets_free(struct secrets *ss)
{
	for (size_t i = 0; i < ss->n; i++)
		free(ss->v[i]);
	free(ss->v);
	free(ss->len);
}

/* Writes p[0, len) percent-decoded into buf (room for len bytes); returns its length.
 * Invalid escapes stay as written, as in the message that complains about them, and so does
 * %00: libpq refuses it, and a message (a C string) could only hold it as written. */
static size_t percent_decode(const char *p, size_t len, char *buf)
{
	size_t n = 0;

	for (size_t i = 0; i < len; i++) {
		if (p[i] == '%' && i + 2 < len && text_hex_value(p[i + 1]) >= 0 &&
		    text_hex_value(p[i + 2]) >= 0 &&
		    (text_hex_value(p[i + 1]) | text_hex_value(p[i + 2])) != 0) {
			buf[n++] = (char)(text_hex_value(p[i + 1]) * 16 + text_hex_value(p[i + 2]));
			i += 2;
		} else {
			buf[n++] = p[i];
		}
	}
	return n;
}

/* Writes p[0, len) percent-encoded (all but RFC 3986's unreserved characters) into buf (room
 * for 3 * len bytes); returns its length. */
static size_t percent_encode(const char *p, size_t len, char *buf, bool upper)
{
	const char *hex = upper ? "0123456789ABCDEF" : "0123456789abcdef";
	size_t n = 0;

	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)p[i];

		if (is_alpha((char)c) || is_digit((char)c) || c == '-' || c == '.' || c == '_' ||
		    c == '~') {
			buf[n++] = (char)c;
		} else {
			buf[n++] = '%';
			buf[n++] = hex[c >> 4];
			buf[n++] = hex[c & 15];
		}
	}
	return n;
}

/* Adds p[0, len) as written, percent-decoded, and percent-encoded both from the decoded and
 * from the written form. */
static void add_percent_forms(struct secrets *ss, const char *p, size_t len)
{
	char *buf = malloc(3 * len + 1);
	char *dec = malloc(len + 1);
	size_t dlen, n;

	if (!buf || !dec) {
		ss->failed = true;
		goto out;
	}
	secret_add(ss, p, len);
	dlen = percent_decode(p, len, dec);
	secret_add(ss, dec, dlen);
	n = percent_encode(dec, dlen, buf, true);
	secret_add(ss, buf, n);
	n = percent_encode(dec, dlen, buf, false);
	secret_add(ss, buf, n);
	n = percent_encode(p, len, buf, true);
	secret_add(ss, buf, n);
out:
	free(buf);
	free(dec);
}

/* A conninfo value with its backslash escapes resolved; inner = only the quoted part when it
 * starts with a quote (the value libpq stores), else quotes are kept (they are data there). */
static size_t conninfo_unescape(const char *p, size_t len, char *buf, bool inner)
{
	size_t n = 0, i = 0;

	if (inner) {
		if (len == 0 || p[0] != '\'')
			return 0;
		i = 1;
	}
	for (; i < len; i++) {
		if (inner && p[i] == '\'')
			break;
		if (p[i] == '\\' && i + 1 < len)
			i++;
		buf[n++] = p[i];
	}
	return n;
}

static void add_span(struct secrets *ss, const struct spans *sp, const struct span *v)
{
	const char *p = sp->s + v->start;
	size_t len = v->len;

	add_percent_forms(ss, p, len);
	if (v->kind == SPAN_CONNINFO) {
		char *buf = malloc(len + 1);

		if (!buf) {
			ss->failed = true;
			return;
		}
		if (len >= 2 && p[0] == '\'' && p[len - 1] == '\'')
			add_percent_forms(ss, p + 1, len - 2); /* inside the quotes, as written */
		add_percent_forms(ss, buf, conninfo_unescape(p, len, buf, false));
		add_percent_forms(ss, buf, conninfo_unescape(p, len, buf, true));
		free(buf);
	}
	if (v->triggers && has_any(p, 0, len, v->triggers)) {
		size_t a = 0;

		for (size_t i = 0; i <= len; i++) {
			if (i == len || (p[i] != '\0' && strchr(PIECE_CUTS, p[i]))) {
				add_percent_forms(ss, p + a, i - a);
				a = i + 1;
			}
		}
	}
}

void redact_message(const char *msg, const char *conninfo, char *out, size_t n)
{
	struct out_buf o = { out, n, 0 };
	struct secrets ss = { NULL, NULL, 0, 0, 0, false };
	struct spans sp;
	size_t mlen, i = 0, start, end;
	bool masked = false;

	if (!out || n == 0)
		return;
	out[0] = '\0';
	if (!msg)
		return;
	scan(&sp, conninfo);
	for (size_t k = 0; k < sp.n; k++)
		add_span(&ss, &sp, &sp.v[k]);
	while (next_run(&sp, &i, &start, &end))
		secret_add(&ss, sp.s + start, end - start);
	if (ss.failed) {
		put(&o, REDACT_MASK, strlen(REDACT_MASK));
		goto out;
	}
	mlen = strlen(msg);
	for (size_t pos = 0; pos < mlen;) {
		size_t best = 0;

		/* The longest secret at the leftmost position: "p@ss" before its piece "p". */
		for (size_t k = 0; k < ss.n; k++) {
			if (ss.len[k] > best && ss.len[k] <= mlen - pos && ss.v[k][0] == msg[pos] &&
			    memcmp(ss.v[k], msg + pos, ss.len[k]) == 0)
				best = ss.len[k];
		}
		if (best) {
			if (!masked)
				put(&o, REDACT_MASK, strlen(REDACT_MASK));
			masked = true;
			pos += best;
		} else {
			put(&o, msg + pos, 1);
			masked = false;
			pos++;
		}
	}
out:
	secrets_free(&ss);
}
