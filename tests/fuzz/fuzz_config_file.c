/* Fuzz target: the JSON-with-comments config file, through config_load() (reading, comment
 * stripping, the key-line scanner, flattening, validation). The input is the file. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config/config.h"
#include "tests/fuzz/fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* One in-memory file for the whole run, rewritten for each input: no disk, no leftovers. */
static int memfd = -1;
static char path[64];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *const no_env[] = { NULL };
	struct config_sources src = { path, NULL, 0, no_env, NULL };
	struct config_errors errs = { NULL, 0 };
	struct config *c;

	if (memfd < 0) {
		memfd = memfd_create("fuzz-config", 0);
		if (memfd < 0)
			FUZZ_FAIL("memfd_create failed");
		snprintf(path, sizeof(path), "/proc/self/fd/%d", memfd);
	}
	if (ftruncate(memfd, 0) != 0 || pwrite(memfd, data, size, 0) != (ssize_t)size)
		FUZZ_FAIL("could not write the input");
	c = config_load(&src, &errs);
	fuzz_check_errors(c, &errs, path);
	if (c)
		fuzz_check_round_trip(c);
	config_free(c);
	config_errors_clear(&errs);
	return 0;
}
