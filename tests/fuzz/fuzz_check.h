/* What the config fuzz targets check after config_load(), besides what the sanitizers see:
 * the errors are well-formed lines, and a snapshot that loaded survives the round trip of
 * its own printed values (config_value_text() read back through --set gives the same). */
#ifndef OUTBOX_TESTS_FUZZ_CHECK_H
#define OUTBOX_TESTS_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"

#define FUZZ_VALUE_MAX 1024

/* A finding: libFuzzer saves the input that led here and reports it as a crash. */
#define FUZZ_FAIL(...)                                  \
	do {                                            \
		fprintf(stderr, "fuzz check failed: "); \
		fprintf(stderr, __VA_ARGS__);           \
		fputc('\n', stderr);                    \
		abort();                                \
	} while (0)

/* path: the config file's path, whose syntax errors ("<path>:L:C: invalid JSON: ...") must
 * not quote the token jansson stopped at; NULL when there is no file. */
static inline void fuzz_check_errors(const struct config *c, const struct config_errors *errs,
                                     const char *path)
{
	if ((c == NULL) != (errs->n > 0))
		FUZZ_FAIL("config_load returned %s with %zu errors", c ? "a config" : "NULL",
		          errs->n);
	for (size_t i = 0; i < errs->n; i++) {
		const char *line = errs->lines[i];
		size_t len = strlen(line);
		int line_no, column, after = 0;

		if (len == 0 || len >= 1024)
			FUZZ_FAIL("error line %zu has %zu bytes", i, len);
		if (path && strncmp(line, path, strlen(path)) == 0 &&
		    sscanf(line + strlen(path), ":%d:%d: invalid JSON: %n", &line_no, &column,
		           &after) == 2 &&
		    after > 0 && strstr(line, " near '"))
			FUZZ_FAIL("a JSON error quotes its token: %s", line);
	}
}

/* Every key's value read back as --set gives the same value (secrets are shown redacted, so
 * they are left out). A format that its parser refuses, or reads differently, is a bug:
 * `config show` would print something the relay cannot be given. */
static inline void fuzz_check_round_trip(const struct config *c)
{
	size_t n = config_key_count();
	char(*vals)[FUZZ_VALUE_MAX] = calloc(n, sizeof(*vals));
	char(*sets)[FUZZ_VALUE_MAX + 64] = calloc(n, sizeof(*sets));
	const char **setv = calloc(n, sizeof(*setv));
	const char *const no_env[] = { NULL };
	struct config_sources src = { NULL, NULL, 0, no_env, NULL };
	struct config_errors errs = { NULL, 0 };
	struct config *again;
	size_t nsets = 0;

	if (!vals || !sets || !setv)
		goto out;
	for (size_t i = 0; i < n; i++) {
		config_value_text(c, i, vals[i], sizeof(vals[i]));
		if (strlen(vals[i]) + 1 >= sizeof(vals[i]))
			goto out; /* cut: not comparable */
		if (config_key_sensitive(i))
			continue;
		snprintf(sets[nsets], sizeof(sets[nsets]), "%s=%s", config_key_name(i), vals[i]);
		setv[nsets] = sets[nsets];
		nsets++;
	}
	src.sets = setv;
	src.nsets = nsets;
	again = config_load(&src, &errs);
	if (!again)
		FUZZ_FAIL("the printed values do not load again: %s",
		          errs.n ? errs.lines[0] : "(no error)");
	for (size_t i = 0; i < n; i++) {
		char v[FUZZ_VALUE_MAX];

		if (config_key_sensitive(i))
			continue;
		config_value_text(again, i, v, sizeof(v));
		if (strcmp(v, vals[i]) != 0)
			FUZZ_FAIL("%s: printed \"%s\", read back as \"%s\"", config_key_name(i),
			          vals[i], v);
	}
	config_free(again);
out:
	config_errors_clear(&errs);
	free(vals);
	free(sets);
	free(setv);
}

#endif
