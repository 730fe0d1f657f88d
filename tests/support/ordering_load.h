/* ordering_load.h — the ordering-key workload shared by the ordering tests: producer threads
 * whose transactions overlap and commit out of seq order, and the check that a consumer saw
 * every key's rows in the table's seq order. */
#ifndef OUTBOX_TESTS_ORDERING_LOAD_H
#define OUTBOX_TESTS_ORDERING_LOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <libpq-fe.h>

#include "bench/drive/consumer.h"

struct ordering_load;

/* Starts `producers` threads, each on its own connection, that insert keys x per_key rows into
 * table (exchange, routing key "ord.<key>", ordering key "k<NNN>", id "k<NNN>-<NNNNNN>").
 * Every transaction inserts 1-4 rows for random keys with one statement each and sleeps a
 * random 0-5 ms before COMMIT, so transactions overlap and commit out of seq order. table and
 * exchange are copied. Free with ordering_load_join(). */
struct ordering_load *ordering_load_start(const char *table, const char *exchange, size_t keys,
                                          size_t per_key, size_t producers, unsigned seed);
/* Waits for the producers and fails the test if any of them could not commit its rows. */
void ordering_load_join(struct ordering_load *l);
/* Rows committed so far (any thread). */
size_t ordering_load_committed(struct ordering_load *l);

/* Reads the keyed rows of table in seq order (only those matching the SQL condition filter
 * when it is not NULL) and compares each key's rows with the order in which they arrived at
 * the n_cons consumers in cons (a key's rows all go to one of them). With collapse_repeats a
 * delivery that repeats the previous delivery of its key is ignored (a relay killed between
 * confirm and mark resends the row it had just published); otherwise any duplicate fails. Fails the test at the first difference;
 * prints one summary line tagged with what. */
void ordering_check(PGconn *pg, const char *table, const char *filter, struct consumer *const *cons,
                    size_t n_cons, bool collapse_repeats, const char *what);

#endif
