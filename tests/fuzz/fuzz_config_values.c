/* Fuzz target: OUTBOX_* environment variables and --set values through config_load(). The
 * input is NAME=value lines: a NAME starting with OUTBOX_ goes to the environment, any other
 * line to --set as it is. OUTBOX_CONFIG and *_FILE variables are left out (they read files,
 * which fuzz_config_file covers). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "tests/fuzz/fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define LINES_MAX 64

static bool reads_a_file(const char *line)
{
	const char *eq = strchr(line, '=');
	size_t name_len = eq ? (size_t)(eq - line) : strlen(line);

	return strncmp(line, "OUTBOX_CONFIG", 13) == 0 ||
	       (name_len >= 5 && strncmp(line + name_len - 5, "_FILE", 5) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *env[LINES_MAX + 1];
	const char *sets[LINES_MAX];
	size_t nenv = 0, nsets = 0;
	struct config_errors errs = { NULL, 0 };
	struct config_sources src;
	struct config *c;
	char *text = malloc(size + 1);

	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = '\0';
	/* Lines end at '\n'; a NUL ends the input (C strings cannot hold one). */
	for (char *line = text; line && *line && nenv + nsets < LINES_MAX;) {
		char *nl = strchr(line, '\n');

		if (nl)
			*nl = '\0';
		if (strncmp(line, "OUTBOX_", 7) == 0) {
			if (!reads_a_file(line))
				env[nenv++] = line;
		} else {
			sets[nsets++] = line;
		}
		line = nl ? nl + 1 : NULL;
	}
	env[nenv] = NULL;
	src = (struct config_sources){ NULL, sets, nsets, env, NULL };
	c = config_load(&src, &errs);
	fuzz_check_errors(c, &errs, NULL);
	if (c)
		fuzz_check_round_trip(c);
	config_free(c);
	config_errors_clear(&errs);
	free(text);
	return 0;
}
