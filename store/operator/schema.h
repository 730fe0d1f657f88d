/* The table's schema (store/operator/schema.c: the DDL text; migrate.c: what the catalog shows
 * missing or different, changed in place, and the seq sequence's check). */
#ifndef OUTBOX_STORE_OPERATOR_SCHEMA_H
#define OUTBOX_STORE_OPERATOR_SCHEMA_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/store.h"

/* The DDL for table/channel (DESIGN §1 and the wake-up objects), idempotent. Returns a new
 * string (free()), NULL on out of memory. table must be a valid identifier. */
char *store_schema_sql(const char *table, const char *channel);
/* Brings the table and its objects up to date (creates them, adds an older table's missing
 * columns, replaces an old wake-up function, builds missing indexes CONCURRENTLY), changing
 * only what the catalog shows missing or different: on an up-to-date table it takes no lock on
 * the table. Each lock a change needs is waited for at most 5 s; then STORE_ERR_QUERY with a
 * message naming the table and the sessions that hold it, and nothing of that step changed.
 * (Index builds block nobody: they wait up to 60 s for older transactions, but fail at once
 * when a transaction has held the table for 5 s already.) */
int store_migrate(struct store *s) __attribute__((warn_unused_result));
/* What the last store_migrate() changed that the operator must act on (borrowed, "" when
 * nothing): setting the seq sequence's CACHE to 1 leaves the values sessions cached before. */
const char *store_notice(const struct store *s);
/* Whether the sequence behind the table's seq column hands out values one at a time, as the
 * ordering watermark needs (store/operator/migrate.c): 0 when it does (or the table or its sequence is
 * missing: other checks say so), 1 when it has CACHE > 1 (store_errmsg() names the sequence
 * and the fix, one line), or an error. The relay's connections and replay refuse such a
 * table (STORE_ERR_FATAL, same message). */
int store_check_sequence(struct store *s) __attribute__((warn_unused_result));

#endif
