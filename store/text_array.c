/* Parameter literals for the relay's batch statements: text, int64 and boolean arrays built into
 * buffers the handle keeps, so that marking 500 rows allocates nothing once warm. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "store/store_private.h"

/* 10000 ids or 10000 error texts of 1000 characters fit. */
#define ARRAY_BUF_MAX  ((size_t)64 << 20)
#define ELEM_CHARS_MAX 1000

const char *store_string_at(const void *items, size_t i)
{
	return ((const char *const *)items)[i];
}

static int slot_reserve(struct store *s, enum store_slot slot, size_t need)
{
	size_t cap = s->arr_cap[slot];
	char *p;

	if (need <= cap)
		return 0;
	if (need > ARRAY_BUF_MAX) {
		store_set_error(s, "parameter of %zu bytes exceeds the limit of %zu", need,
		                ARRAY_BUF_MAX);
		return STORE_ERR_NOMEM;
	}
	if (cap == 0)
		cap = 1024;
	while (cap < need)
		cap *= 2;
	if (cap > ARRAY_BUF_MAX)
		cap = ARRAY_BUF_MAX;
	p = realloc(s->arr[slot], cap);
	if (!p) {
		store_set_error(s, "out of memory");
		return STORE_ERR_NOMEM;
	}
	s->arr[slot] = p;
	s->arr_cap[slot] = cap;
	return 0;
}

/* Appends element v (quoted, escaped) at p + *len. */
static void put_element(char *p, size_t *len, const char *v, bool sanitize)
{
	size_t vlen = strlen(v), j = 0, chars = 0, l = *len;

	p[l++] = '"';
	while (j < vlen && (!sanitize || chars < ELEM_CHARS_MAX)) {
		size_t k = sanitize ? utf8_seq_len((const unsigned char *)v + j, vlen - j) : 1;

		if (k == 0) {
			p[l++] = '?';
			j++;
		} else {
			for (size_t m = 0; m < k; m++) {
				char c = v[j + m];

				if (c == '"' || c == '\\')
					p[l++] = '\\';
				p[l++] = c;
			}
			j += k;
		}
		chars++;
	}
	p[l++] = '"';
	*len = l;
}

int store_text_array(struct store *s, enum store_slot slot, const void *items, size_t n,
                     const char *(*get)(const void *items, size_t i), bool sanitize,
                     const char **out)
{
	size_t need = 3, len = 0;
	char *p;
	int rc;

	/* Worst case per element: every byte escaped, quotes and a comma. */
	for (size_t i = 0; i < n; i++) {
		const char *v = get(items, i);
		need += v ? 2 * strlen(v) + 3 : 5;
	}
	rc = slot_reserve(s, slot, need);
	if (rc != 0)
		return rc;
	p = s->arr[slot];
	p[len++] = '{';
	for (size_t i = 0; i < n; i++) {
		const char *v = get(items, i);

		if (i > 0)
			p[len++] = ',';
		if (!v) {
			memcpy(p + len, "NULL", 4);
			len += 4;
			continue;
		}
		put_element(p, &len, v, sanitize);
	}
	p[len++] = '}';
	p[len] = '\0';
	*out = p;
	return 0;
}

int store_int_array(struct store *s, enum store_slot slot, const void *items, size_t n,
                    int64_t (*get)(const void *items, size_t i), const char **out)
{
	size_t len = 0, need = 3 + n * 22;
	char *p;
	int rc;

	rc = slot_reserve(s, slot, need);
	if (rc != 0)
		return rc;
	p = s->arr[slot];
	p[len++] = '{';
	for (size_t i = 0; i < n; i++) {
		int w = snprintf(p + len, need - len, "%s%lld", i ? "," : "",
		                 (long long)get(items, i));

		if (w < 0 || (size_t)w >= need - len) {
			store_set_error(s, "could not format a parameter array");
			return STORE_ERR_NOMEM;
		}
		len += (size_t)w;
	}
	p[len++] = '}';
	p[len] = '\0';
	*out = p;
	return 0;
}

int store_bool_array(struct store *s, enum store_slot slot, const void *items, size_t n,
                     bool (*get)(const void *items, size_t i), const char **out)
{
	size_t len = 0, need = 3 + n * 2;
	char *p;
	int rc;

	rc = slot_reserve(s, slot, need);
	if (rc != 0)
		return rc;
	p = s->arr[slot];
	p[len++] = '{';
	for (size_t i = 0; i < n; i++) {
		if (i > 0)
			p[len++] = ',';
		p[len++] = get(items, i) ? 't' : 'f';
	}
	p[len++] = '}';
	p[len] = '\0';
	*out = p;
	return 0;
}
