/* The partitioned outbox table (store/operator/partitions.c; docs/design.md, "A partitioned
 * table"): a table range-partitioned by seq, kept partitions ahead of the producers, and
 * retention that drops whole partitions instead of deleting rows. */
#ifndef OUTBOX_STORE_OPERATOR_PARTITIONS_H
#define OUTBOX_STORE_OPERATOR_PARTITIONS_H

#include <stdbool.h>
#include <stdint.h>

#include "store/store.h"

/* `migrate --partition-rows N`: the default, and the bounds. */
#define STORE_PARTITION_ROWS_DEFAULT 1000000
#define STORE_PARTITION_ROWS_MIN     100
#define STORE_PARTITION_ROWS_MAX     1000000000000LL

/* As store_migrate(), but a table that does not exist yet is created range-partitioned by seq,
 * partition_rows seqs a partition (0 = keep what the table has, or the default), with a
 * DEFAULT partition, two empty partitions above the sequence, and the functions that keep
 * partitions ahead and retire done ones. A plain table is brought up to date, then converted
 * while producers write (docs/operations.md, "Partitioning": a CHECK validated, then one short
 * exclusive lock); store_notice() then says to restart its relays. On a partitioned one, a
 * partition_rows given replaces the size of the partitions to come. */
int store_migrate_partitioned(struct store *s, int64_t partition_rows)
        __attribute__((warn_unused_result));

/* Whether the table is partitioned (false, 0 for a plain or missing table). */
int store_partitioned(struct store *s, bool *partitioned) __attribute__((warn_unused_result));

/* On a partitioned table, creates the partitions needed so that two empty ones lie above the
 * sequence (and above any row that fell into the DEFAULT partition); *made gets how many.
 * Nothing on a plain table, or on one pg_partman manages (its own maintenance creates them).
 * One statement; waits at most 1 s for a lock, then fails (STORE_ERR_QUERY) and can be called
 * again. */
int store_partitions_ahead(struct store *s, int *made) __attribute__((warn_unused_result));

/* On a partitioned table, drops each partition whose rows are all done and past
 * older_than_ms (store/operator/partitions.c says what done means for each row source; the
 * cursor source's position is pos when cursor). Never the DEFAULT partition, nor one the
 * sequence has not passed. *rows gets how many rows went with them, *dropped how many
 * partitions. Takes the table's exclusive lock for each drop, waiting at most 1 s for it
 * (then stops, returns 0, and the next call goes on). */
int store_partitions_retire(struct store *s, int64_t older_than_ms, bool cursor, int64_t pos,
                            int64_t *rows, int64_t *dropped) __attribute__((warn_unused_result));

/* Fills *p (struct store_partitions: store/store.h; all zero on a plain table). cursor says which row source's dead rows count. */
int store_partitions_info(struct store *s, bool cursor, struct store_partitions *p)
        __attribute__((warn_unused_result));

#endif
