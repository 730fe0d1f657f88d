/* consumer_start(): consumer_open() for the criterion tests, failing the current test instead
 * of returning an error. Kept apart so that consumer.c links without criterion. */
#include "bench/drive/consumer.h"

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
