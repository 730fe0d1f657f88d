/* What the DDL text (schema.c) and migrate (migrate.c) share, and nobody else: the table as
 * this version wants it (columns, indexes, fillfactor), the names derived from the table name,
 * and the pieces of DDL both write. */
#ifndef OUTBOX_STORE_SCHEMA_PRIVATE_H
#define OUTBOX_STORE_SCHEMA_PRIVATE_H

#include <stdbool.h>
#include <stddef.h>

#include "store/store_private.h"

/* A bounded growable string for building the DDL. */
struct schema_sbuf {
	char *p;
	size_t len, cap;
	bool failed;
};

/* Appends to b; once out of memory or past its maximum (64 KiB), b is failed and nothing more
 * is added. */
void schema_sbuf_add(struct schema_sbuf *b, const char *fmt, ...)
        __attribute__((format(printf, 2, 3)));

/* The columns of DESIGN §1, in order. family is the type as migrate compares it (any string
 * type counts as "text": a wider VARCHAR chosen by an operator is not refused); add is what an
 * older table gets (NULL: every outbox table has the column, an AceMQ one included); def is
 * the default producers rely on (they insert without the column). */
struct schema_column {
	const char *name;
	const char *decl; /* in CREATE TABLE */
	const char *family;
	const char *add;
	const char *def;
};
#define SCHEMA_N_COLUMNS 19
extern const struct schema_column schema_columns[];

/* Half of each page is left free. A claim and then a mark rewrite every row of a batch, page by
 * page, in one transaction each: with room on the row's own page for the new version,
 * PostgreSQL logs it compactly (and a lease update, which touches no indexed column, stays
 * HOT). At 80 % most new versions went to other pages. Measured with bench/run --only relay,
 * three alternating pairs: WAL per relayed message 1,952-1,957 B at 80 against 511-529 B at
 * 50, PostgreSQL's CPU per message 68-75 us against 43-47 us, 11,864-12,800 against
 * 15,026-16,724 msgs/s. The price: retained published rows take about twice the space. */
#define SCHEMA_FILLFACTOR "50"

/* One of the relay's indexes (schema.c says what each is for): def follows "ON <table> ";
 * catalog is what pg_get_indexdef() shows after " USING ", which migrate compares to decide
 * whether the index is current. */
struct schema_index {
	const char *suffix;
	const char *def;
	const char *catalog;
};
#define SCHEMA_N_INDEXES 4
extern const struct schema_index schema_indexes[];

/* The suffixes of indexes of earlier versions, which migrate drops (schema.c says why). */
#define SCHEMA_N_RETIRED 1
extern const char *const schema_retired_indexes[];

/* The names this schema derives from the table name. */
struct schema_names {
	char t[STORE_NAME_MAX];      /* the table, as given */
	char prefix[STORE_NAME_MAX]; /* "schema." or "" */
	char schema[STORE_NAME_MAX]; /* as given, "" when none */
	char base[STORE_NAME_MAX];
	char lbase[STORE_NAME_MAX]; /* folded to lower case, as the catalog stores it */
	char lschema[STORE_NAME_MAX];
};
/* Fills nm from a table name; false when the name is refused. */
bool schema_names_make(struct schema_names *nm, const char *table);

/* The wake-up (schema.c): the body of its function (what pg_proc.prosrc holds) for channel
 * ("" = none: relays poll), the function, created in schema qschema (quoted, or "%1$I" for
 * format() in the schema script), and the trigger on the table tq. */
void schema_add_notify_body(struct schema_sbuf *b, const char *channel);
void schema_add_function_ddl(struct schema_sbuf *b, const char *qschema, const char *base,
                             const char *channel);
void schema_add_trigger_ddl(struct schema_sbuf *b, const char *qschema, const char *base,
                            const char *tq);
/* CREATE TABLE <if_not_exists><table> with every column and the fillfactor. */
void schema_add_create_table(struct schema_sbuf *b, const char *if_not_exists, const char *table);
/* The cursor source's position table, "<table>_position" beside the outbox table (same schema;
 * its presence with a row says the cursor source runs the table). */
#define SCHEMA_POSITION_SUFFIX STORE_POSITION_SUFFIX
/* CREATE TABLE <if_not_exists><table>_position (table as the outbox table is named, qualified
 * or not). */
void schema_add_create_position(struct schema_sbuf *b, const char *if_not_exists,
                                const char *table);

/* The partitioned table (partitions.c): CREATE TABLE of the parent (no IF NOT EXISTS), its
 * DEFAULT partition, and the functions that keep partitions ahead (rows seqs each), retire
 * done ones and count what status shows, owned by the table's owner and executable by the
 * roles that may delete from it. qschema is quoted, tq = qschema.base; neither may hold a
 * single quote. */
void partitions_add_create_table(struct schema_sbuf *b, const char *table);
void partitions_add_default(struct schema_sbuf *b, const char *qschema, const char *base,
                            const char *tq);
void partitions_add_functions(struct schema_sbuf *b, const char *qschema, const char *base,
                              const char *tq, long long rows);
/* Converts the plain table qschema.base (up to date otherwise; lbase: base folded to lower
 * case) into a partitioned one, rows seqs a partition: a CHECK (seq < bound) added NOT VALID
 * and validated while producers write, then, in one transaction that holds the table's ACCESS
 * EXCLUSIVE lock (waited for at most 5 s), the table becomes the first partition (FROM MINVALUE
 * to the bound) of a new parent of its name (docs/operations.md, "Partitioning"). On failure
 * nothing is changed (the CHECK is dropped again). */
int partitions_convert(struct store *s, const char *qschema, const char *lbase, const char *base,
                       int64_t rows);

#endif
