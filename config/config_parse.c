/* Reading the JSON config file (comments allowed, nested sections or dotted keys, the line of
 * every key kept for error messages) and parsing values by type: integers, booleans, enums
 * and durations. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "config/config.h"
#include "config/config_keys.h"

/* A config file is a page of settings; anything this large is a mistake, not a config. */
#define CONFIG_FILE_MAX    (1024 * 1024)
#define CONFIG_PATH_MAX    256
#define CONFIG_ENTRIES_MAX 4096

void config_strip_comments(char *text)
{
	char *p = text;
	bool in_string = false;

	/* Comment markers inside strings are data ("http://x"), so track strings and their
	 * escapes; replace comments by spaces, not by nothing, so jansson's line:column still
	 * point into the file the operator wrote. */
	while (*p) {
		if (in_string) {
			if (*p == '\\' && p[1])
				p++;
			else if (*p == '"')
				in_string = false;
			p++;
		} else if (*p == '"') {
			in_string = true;
			p++;
		} else if (p[0] == '/' && p[1] == '/') {
			while (*p && *p != '\n')
				*p++ = ' ';
		} else if (p[0] == '/' && p[1] == '*') {
			*p++ = ' ';
			*p++ = ' ';
			while (*p && !(p[0] == '*' && p[1] == '/')) {
				if (*p != '\n')
					*p = ' ';
				p++;
			}
			/* An unterminated comment blanks the rest; jansson then reports the
			 * missing end of the object. */
			if (*p) {
				*p++ = ' ';
				*p++ = ' ';
			}
		} else {
			p++;
		}
	}
}

/* Where each key sits: dotted path -> line, found by a small scan over the stripped text. */
struct key_line {
	char *path;
	int line;
};

struct key_lines {
	struct key_line *v;
	size_t n, cap;
};

static void key_lines_clear(struct key_lines *kl)
{
	for (size_t i = 0; i < kl->n; i++)
		free(kl->v[i].path);
	free(kl->v);
	kl->v = NULL;
	kl->n = kl->cap = 0;
}

static int key_lines_add(struct key_lines *kl, const char *path, int line)
{
	if (kl->n == kl->cap) {
		size_t cap = kl->cap ? kl->cap * 2 : 32;
		struct key_line *v;

		if (cap > CONFIG_ENTRIES_MAX)
			return -1;
		v = realloc(kl->v, cap * sizeof(*v));
		if (!v)
			return -1;
		kl->v = v;
		kl->cap = cap;
	}
	kl->v[kl->n].path = strdup(path);
	if (!kl->v[kl->n].path)
		return -1;
	kl->v[kl->n].line = line;
	kl->n++;
	return 0;
}

/* Line of the nth (from 0) occurrence of path. One key can be spelled twice, nested and
 * dotted; jansson walks objects in file order, so the nth entry met is the nth written. */
static int key_lines_find(const struct key_lines *kl, const char *path, size_t nth)
{
	for (size_t i = 0; i < kl->n; i++) {
		if (strcmp(kl->v[i].path, path) == 0 && nth-- == 0)
			return kl->v[i].line;
	}
	return 0;
}

#define SCAN_DEPTH 64

/* Runs after jansson accepted the text, so the structure is known to be valid JSON; the scan
 * only needs to follow strings, braces, brackets, colons and commas. Keys with escapes are
 * kept raw: they cannot name a real key, and then only the line is lost. */
static int scan_key_lines(const char *text, struct key_lines *kl)
{
	/* Per nesting level: is it an object, and the dotted path of the object itself. */
	bool is_obj[SCAN_DEPTH];
	size_t prefix_len[SCAN_DEPTH];
	char path[CONFIG_PATH_MAX * 2];
	size_t last_key_len = 0;
	bool expect_key = false;
	int depth = -1;
	int line = 1;

	path[0] = '\0';
	for (const char *p = text; *p; p++) {
		if (*p == '\n') {
			line++;
		} else if (*p == '"') {
			const char *start = ++p;

			while (*p && *p != '"') {
				if (*p == '\\' && p[1])
					p++;
				p++;
			}
			if (!*p)
				break;
			if (depth >= 0 && is_obj[depth] && expect_key) {
				size_t base = prefix_len[depth];
				size_t klen = (size_t)(p - start);
				int w;

				w = snprintf(path + base, sizeof(path) - base, "%s%.*s",
				             base ? "." : "", (int)klen, start);
				if (w < 0 || (size_t)w >= sizeof(path) - base) {
					path[base] = '\0';
					last_key_len = base;
				} else {
					last_key_len = base + (size_t)w;
					if (key_lines_add(kl, path, line) < 0)
						return -1;
				}
				expect_key = false;
			}
		} else if (*p == '{' || *p == '[') {
			if (depth + 1 >= SCAN_DEPTH)
				return 0; /* deeper than any key: lines of the rest stay unknown */
			depth++;
			is_obj[depth] = *p == '{';
			/* The new object's path is the key just read (or "" at the top). */
			prefix_len[depth] = depth > 0 && is_obj[depth - 1] ? last_key_len : 0;
			if (depth > 0 && !is_obj[depth - 1])
				prefix_len[depth] = prefix_len[depth - 1];
			path[prefix_len[depth]] = '\0';
			expect_key = is_obj[depth];
		} else if (*p == '}' || *p == ']') {
			if (depth >= 0)
				depth--;
			if (depth >= 0)
				path[prefix_len[depth]] = '\0';
			expect_key = false;
		} else if (*p == ',') {
			if (depth >= 0) {
				path[prefix_len[depth]] = '\0';
				expect_key = is_obj[depth];
			}
		}
	}
	return 0;
}

static int entries_add(struct config_file *f, size_t *cap, struct config_file_entry *e)
{
	if (f->n == *cap) {
		size_t ncap = *cap ? *cap * 2 : 32;
		struct config_file_entry *v;

		if (ncap > CONFIG_ENTRIES_MAX)
			return -1;
		v = realloc(f->v, ncap * sizeof(*v));
		if (!v)
			return -1;
		f->v = v;
		*cap = ncap;
	}
	f->v[f->n++] = *e;
	return 0;
}

static char *json_text(json_t *v, enum config_json_kind *kind, int64_t *ms, bool *ms_ok)
{
	char buf[64];

	*ms = 0;
	*ms_ok = false;
	switch (json_typeof(v)) {
	case JSON_STRING:
		*kind = CONFIG_JSON_STRING;
		return strdup(json_string_value(v));
	case JSON_INTEGER: {
		json_int_t n = json_integer_value(v);

		*kind = CONFIG_JSON_INT;
		/* A number is seconds when the key is a duration; keep it in range of int64 ms. */
		if (n >= 0 && n <= INT64_MAX / 1000) {
			*ms = (int64_t)n * 1000;
			*ms_ok = true;
		}
		snprintf(buf, sizeof(buf), "%" JSON_INTEGER_FORMAT, n);
		return strdup(buf);
	}
	case JSON_REAL: {
		double d = json_real_value(v);

		*kind = CONFIG_JSON_REAL;
		if (d >= 0 && d <= 1e15) {
			*ms = (int64_t)(d * 1000.0 + 0.5);
			*ms_ok = true;
		}
		snprintf(buf, sizeof(buf), "%g", d);
		return strdup(buf);
	}
	case JSON_TRUE:
	case JSON_FALSE:
		*kind = CONFIG_JSON_BOOL;
		return strdup(json_is_true(v) ? "true" : "false");
	case JSON_NULL:
		*kind = CONFIG_JSON_NULL;
		return strdup("null");
	case JSON_ARRAY:
		*kind = CONFIG_JSON_ARRAY;
		return strdup("[...]");
	case JSON_OBJECT:
	default:
		*kind = CONFIG_JSON_OBJECT;
		return strdup("{...}");
	}
}

/* Adds path = v as one entry, with the line it sits on and where a named source's parts are. */
static int add_entry(struct config_file *f, size_t *cap, const struct key_lines *kl,
                     const char *path, json_t *v, size_t name_len, size_t rel)
{
	struct config_file_entry e;
	size_t seen = 0;

	memset(&e, 0, sizeof(e));
	for (size_t j = 0; j < f->n; j++) {
		if (strcmp(f->v[j].key, path) == 0)
			seen++;
	}
	e.line = key_lines_find(kl, path, seen);
	e.name_len = name_len;
	e.rel = rel;
	e.key = strdup(path);
	e.text = json_text(v, &e.kind, &e.ms, &e.ms_ok);
	if (!e.key || !e.text || entries_add(f, cap, &e) < 0) {
		free(e.key);
		free(e.text);
		return -1;
	}
	return 0;
}

static int flatten(json_t *obj, const char *prefix, size_t name_len, size_t rel,
                   const struct key_lines *kl, struct config_file *f, size_t *cap);

/* The top-level "sources" object: one entry per member, so that a source given as {} is still
 * named, then the member's keys with the source's name and the key's start marked. */
static int flatten_sources(json_t *obj, const struct key_lines *kl, struct config_file *f,
                           size_t *cap)
{
	const char *name;
	json_t *v;

	json_object_foreach(obj, name, v)
	{
		char path[CONFIG_PATH_MAX];
		int w = snprintf(path, sizeof(path), "sources.%s", name);

		if (w < 0 || (size_t)w >= sizeof(path))
			path[sizeof(path) - 1] = '\0'; /* reported as a bad name, truncated */
		if (add_entry(f, cap, kl, path, v, strlen(path) - 8, strlen(path)) < 0)
			return -1;
		if (json_is_object(v) &&
		    flatten(v, path, strlen(path) - 8, strlen(path) + 1, kl, f, cap) < 0)
			return -1;
	}
	return 0;
}

/* Flattens obj into dotted entries, descending only into sections the key table knows, so
 * that an unknown section is reported once as an unknown key rather than once per leaf.
 * Under a named source, path + rel is the key within the source. */
static int flatten(json_t *obj, const char *prefix, size_t name_len, size_t rel,
                   const struct key_lines *kl, struct config_file *f, size_t *cap)
{
	const char *name;
	json_t *v;

	json_object_foreach(obj, name, v)
	{
		char path[CONFIG_PATH_MAX];
		int w;

		w = snprintf(path, sizeof(path), "%s%s%s", prefix, *prefix ? "." : "", name);
		if (w < 0 || (size_t)w >= sizeof(path))
			path[sizeof(path) - 1] = '\0'; /* reported as unknown, truncated */
		if (!*prefix && strcmp(name, "sources") == 0 && json_is_object(v)) {
			if (flatten_sources(v, kl, f, cap) < 0)
				return -1;
			continue;
		}
		if (json_is_object(v) && strlen(path) > rel && config_key_index(path + rel) < 0 &&
		    config_key_is_section(path + rel)) {
			if (flatten(v, path, name_len, rel, kl, f, cap) < 0)
				return -1;
			continue;
		}
		if (add_entry(f, cap, kl, path, v, name_len, rel) < 0)
			return -1;
	}
	return 0;
}

void config_file_clear(struct config_file *f)
{
	if (!f)
		return;
	for (size_t i = 0; i < f->n; i++) {
		free(f->v[i].key);
		free(f->v[i].text);
	}
	free(f->v);
	f->v = NULL;
	f->n = 0;
}

char *config_read_file(const char *path, size_t max, size_t *out_len, int *err)
{
	FILE *fp = fopen(path, "rb");
	char *buf = NULL;
	size_t cap = 0, len = 0;

	if (!fp) {
		*err = errno;
		return NULL;
	}
	for (;;) {
		size_t got;

		if (len == cap) {
			/* Room for max + 1 bytes, so that a longer file is noticed. */
			size_t want = cap ? cap * 2 : 4096;
			char *p;

			if (cap > max) {
				*err = EFBIG;
				goto fail;
			}
			if (want > max + 1)
				want = max + 1;
			p = realloc(buf, want + 1);
			if (!p) {
				*err = ENOMEM;
				goto fail;
			}
			buf = p;
			cap = want;
		}
		got = fread(buf + len, 1, cap - len, fp);
		len += got;
		if (got == 0)
			break;
	}
	if (ferror(fp)) {
		*err = errno ? errno : EIO;
		goto fail;
	}
	if (len > max) {
		*err = EFBIG;
		goto fail;
	}
	fclose(fp);
	buf[len] = '\0';
	*out_len = len;
	return buf;
fail:
	fclose(fp);
	free(buf);
	return NULL;
}

int config_file_read(const char *path, struct config_file *out, struct config_errors *errs)
{
	struct config_file f = { NULL, 0 };
	struct key_lines kl = { NULL, 0, 0 };
	json_error_t jerr;
	json_t *root = NULL;
	size_t cap = 0;
	size_t len = 0;
	char *text;
	int err = 0;
	int rc = -1;

	text = config_read_file(path, CONFIG_FILE_MAX, &len, &err);
	if (!text) {
		config_errors_add(errs, "%s: could not read config file: %s", path, strerror(err));
		return -1;
	}
	if (strlen(text) != len) {
		/* jansson would stop at the NUL and read half a file as if it were all of it. */
		config_errors_add(errs, "%s: invalid config file: contains a NUL byte", path);
		goto out;
	}
	config_strip_comments(text);
	root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		/* jansson quotes the token it stopped at ("invalid escape near '"amqp://u:pw\\q'"):
		 * that may be part of a password, and line:column already say where it is. */
		char *near = strstr(jerr.text, " near '");

		if (near)
			*near = '\0';
		config_errors_add(errs, "%s:%d:%d: invalid JSON: %s", path, jerr.line, jerr.column,
		                  jerr.text);
		goto out;
	}
	if (!json_is_object(root)) {
		config_errors_add(errs,
		                  "%s: invalid config file: the top level must be a JSON "
		                  "object",
		                  path);
		goto out;
	}
	if (scan_key_lines(text, &kl) < 0 || flatten(root, "", 0, 0, &kl, &f, &cap) < 0) {
		config_errors_add(errs,
		                  "%s: could not read config file: out of memory or too "
		                  "many keys",
		                  path);
		config_file_clear(&f);
		goto out;
	}
	*out = f;
	rc = 0;
out:
	key_lines_clear(&kl);
	json_decref(root);
	free(text);
	return rc;
}

int config_parse_int(const char *s, int64_t *out)
{
	char *end = NULL;
	long long v;

	/* strtoll skips leading blanks and accepts "+"; a config value should be exactly a
	 * number, so demand a digit or minus sign first. */
	if (!s || !(*s == '-' || (*s >= '0' && *s <= '9')))
		return -1;
	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0')
		return -1;
	*out = (int64_t)v;
	return 0;
}

int config_parse_bool(const char *s, bool *out)
{
	static const char *const yes[] = { "true", "1", "yes", "on" };
	static const char *const no[] = { "false", "0", "no", "off" };

	if (!s)
		return -1;
	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		if (strcasecmp(s, yes[i]) == 0) {
			*out = true;
			return 0;
		}
		if (strcasecmp(s, no[i]) == 0) {
			*out = false;
			return 0;
		}
	}
	return -1;
}

int config_parse_enum(const char *s, const char *const *choices, int64_t *out)
{
	if (!s || !choices)
		return -1;
	for (int64_t i = 0; choices[i]; i++) {
		if (strcmp(s, choices[i]) == 0) {
			*out = i;
			return 0;
		}
	}
	return -1;
}

int config_parse_duration(const char *s, int64_t *out_ms)
{
	static const int64_t pow10[] = { 1,      10,      100,      1000,      10000,
		                         100000, 1000000, 10000000, 100000000, 1000000000 };
	int64_t whole = 0, frac = 0, unit;
	int frac_digits = 0;
	bool digits = false;
	const char *p = s;

	if (!s)
		return -1;
	while (*p >= '0' && *p <= '9') {
		if (whole > (INT64_MAX - 9) / 10)
			return -1;
		whole = whole * 10 + (*p - '0');
		digits = true;
		p++;
	}
	if (*p == '.') {
		p++;
		while (*p >= '0' && *p <= '9') {
			/* Nine places is below a millisecond for every unit. */
			if (frac_digits == 9)
				return -1;
			frac = frac * 10 + (*p - '0');
			frac_digits++;
			digits = true;
			p++;
		}
	}
	if (!digits)
		return -1;
	if (strcmp(p, "ms") == 0)
		unit = 1;
	else if (*p == '\0' || strcmp(p, "s") == 0)
		unit = 1000;
	else if (strcmp(p, "m") == 0)
		unit = 60 * 1000;
	else if (strcmp(p, "h") == 0)
		unit = 60 * 60 * 1000;
	else if (strcmp(p, "d") == 0)
		unit = 24 * 60 * 60 * 1000;
	else
		return -1;
	if (whole > INT64_MAX / unit)
		return -1;
	/* frac < 1e9 and unit < 1e8, so the product fits; a fraction of a millisecond is not
	 * something the relay can honour, so it is an error rather than silently rounded. */
	if ((frac * unit) % pow10[frac_digits] != 0)
		return -1;
	if (whole * unit > INT64_MAX - (frac * unit) / pow10[frac_digits])
		return -1;
	*out_ms = whole * unit + (frac * unit) / pow10[frac_digits];
	return 0;
}

void config_format_duration(int64_t ms, char *buf, size_t n)
{
	static const struct {
		int64_t ms;
		const char *unit;
	} units[] = {
		{ 24LL * 60 * 60 * 1000, "d" },
		{ 60LL * 60 * 1000, "h" },
		{ 60LL * 1000, "m" },
		{ 1000, "s" },
	};

	if (!buf || n == 0)
		return;
	if (ms == 0) {
		snprintf(buf, n, "0");
		return;
	}
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		if (ms % units[i].ms == 0) {
			snprintf(buf, n, "%" PRId64 "%s", ms / units[i].ms, units[i].unit);
			return;
		}
	}
	snprintf(buf, n, "%" PRId64 "ms", ms);
}

int config_parse_size(const char *s, int64_t *out_bytes)
{
	static const struct {
		const char *suffix;
		int64_t unit;
	} units[] = {
		{ "", 1 },
		{ "KiB", 1024 },
		{ "k", 1024 },
		{ "K", 1024 },
		{ "MiB", 1024 * 1024 },
		{ "m", 1024 * 1024 },
		{ "M", 1024 * 1024 },
		{ "GiB", 1024 * 1024 * 1024 },
		{ "g", 1024 * 1024 * 1024 },
		{ "G", 1024 * 1024 * 1024 },
	};
	int64_t whole = 0;
	const char *p = s;

	/* Whole numbers only: "1.5MiB" would be a fraction of a byte for some inputs, and
	 * "16MB" is refused rather than guessed as 10^6 or 2^20. */
	if (!s || !(*p >= '0' && *p <= '9'))
		return -1;
	while (*p >= '0' && *p <= '9') {
		if (whole > (INT64_MAX - 9) / 10)
			return -1;
		whole = whole * 10 + (*p - '0');
		p++;
	}
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		if (strcmp(p, units[i].suffix) == 0) {
			if (whole > INT64_MAX / units[i].unit)
				return -1;
			*out_bytes = whole * units[i].unit;
			return 0;
		}
	}
	return -1;
}

void config_format_size(int64_t bytes, char *buf, size_t n)
{
	static const struct {
		int64_t unit;
		const char *suffix;
	} units[] = {
		{ 1024LL * 1024 * 1024, "GiB" },
		{ 1024LL * 1024, "MiB" },
		{ 1024, "KiB" },
	};

	if (!buf || n == 0)
		return;
	for (size_t i = 0; bytes != 0 && i < sizeof(units) / sizeof(units[0]); i++) {
		if (bytes % units[i].unit == 0) {
			snprintf(buf, n, "%" PRId64 "%s", bytes / units[i].unit, units[i].suffix);
			return;
		}
	}
	snprintf(buf, n, "%" PRId64, bytes);
}
