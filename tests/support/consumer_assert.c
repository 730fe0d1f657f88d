/* consumer_start(): consumer_open() for the criterion tests, failing the current test instead
 * of returning an error (see consumer_assert.h). Here, so that bench/drive/ needs no criterion. */
#include "tests/support/consumer_assert.h"

#include <criterion/criterion.h>

struct consumer *consumer_start(const char *url, const char *queue, const char *exchange,
                                const char *exchange_type, const char *routing_key)
{
	struct consumer *c = NULL;
	char err[512];

	if (consumer_open(&c, url, queue, exchange, exchange_type, routing_key, err, sizeof(err)) !=
	    0)
		cr_assert_fail("%s", err);
	return c;
}
