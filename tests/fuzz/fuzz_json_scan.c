/* Fuzz target: the JSON scanner of base/json_scan.h against jansson as the relay reads a row
 * (JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, an object): the producer library refuses with the
 * scanner what the relay could not read, so both must agree on every input, but those nested
 * deeper than the scanner follows. For an accepted object, every member the scanner lists is
 * one of jansson's, key unescaped the same, in the same number. The comparison reads the input
 * up to its first NUL, as a column and the library's arguments are C strings; the whole input
 * goes through the scanner first, for the sanitizers. */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json_scan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A finding: libFuzzer saves the input that led here and reports it as a crash. */
#define CHECK(cond, ...)                                        \
	do {                                                    \
		if (!(cond)) {                                  \
			fprintf(stderr, "fuzz check failed: "); \
			fprintf(stderr, __VA_ARGS__);           \
			fputc('\n', stderr);                    \
			abort();                                \
		}                                               \
	} while (0)

struct members {
	json_t *obj;
	size_t n;
};

static int check_member(const char *text, const struct jscan_member *m, void *arg)
{
	struct members *ms = arg;
	char key[256];
	size_t n = jscan_string_copy(text, m->key_start, m->key_end, key, sizeof(key));

	ms->n++;
	if (ms->obj != NULL && n < sizeof(key) && strlen(key) == n)
		CHECK(json_object_get(ms->obj, key) != NULL, "member '%s' is not jansson's", key);
	CHECK(m->value_start < m->value_end, "an empty value");
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *text = (const char *)data;
	struct jscan_result res;
	struct members ms = { NULL, 0 };
	json_error_t jerr;
	json_t *v;
	int rc;

	rc = jscan_object(text, size, JSCAN_DEPTH_MAX, NULL, NULL, &res);
	CHECK(rc == JSCAN_OK || rc == JSCAN_INVALID, "jscan_object returned %d", rc);
	size = strnlen(text, size);
	v = json_loadb(text, size, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL,
	               &jerr);
	if (v != NULL && !json_is_object(v)) {
		json_decref(v);
		v = NULL;
	}
	ms.obj = v;
	rc = jscan_object(text, size, JSCAN_DEPTH_MAX, check_member, &ms, &res);
	CHECK(rc == JSCAN_OK || rc == JSCAN_INVALID, "jscan_object returned %d", rc);
	CHECK(rc != JSCAN_INVALID || res.offset <= size, "error offset %zu past %zu", res.offset,
	      size);
	if (rc == JSCAN_INVALID && strstr(res.error, "nested deeper") != NULL) {
		json_decref(v);
		return 0;
	}
	CHECK((rc == JSCAN_OK) == (v != NULL), "scanner %s, jansson %s",
	      rc == JSCAN_OK ? "takes it" : res.error, v != NULL ? "takes it" : jerr.text);
	if (v != NULL)
		CHECK(ms.n == json_object_size(v), "%zu members, jansson %zu", ms.n,
		      json_object_size(v));
	json_decref(v);
	return 0;
}
