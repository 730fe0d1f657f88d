/* identifier.h — the checks that stand between a table or channel name and the SQL text it is
 * pasted into (identifiers cannot be bound as parameters, so anything but this narrow shape
 * is refused rather than quoted). Shared by configuration validation, the store, the
 * producer library and the inbox. */
#ifndef OUTBOX_BASE_IDENTIFIER_H
#define OUTBOX_BASE_IDENTIFIER_H

#include <stdbool.h>
#include <stddef.h>

/* Table names get derived names by appending up to 12 bytes ("_pending_idx"), and
 * PostgreSQL silently cuts names at 63 bytes, so the part after any schema is at most this
 * long (a longer one would make derived names collide). */
#define IDENTIFIER_TABLE_BASE_MAX 51

/* "name" or "schema.name", each part [A-Za-z_][A-Za-z0-9_]{0,62} and no part a PostgreSQL
 * reserved key word (select, user, table, order, group, ... in any case). */
bool identifier_valid(const char *s);
/* Same, without a schema part (channel names, derived object names). */
bool identifier_plain_valid(const char *s);
/* The part after the schema ("outbox" in "app.outbox") of a valid identifier. */
const char *identifier_base(const char *s);
/* A valid identifier whose base is at most IDENTIFIER_TABLE_BASE_MAX bytes. */
bool identifier_table_name_valid(const char *s);
/* True when a part of s (either side of a '.') is a reserved key word of PostgreSQL 15, which
 * the parser refuses as an unquoted table or channel name; then that part is copied, as
 * written, into word (n bytes, NUL-terminated; word may be NULL). s must not be NULL. */
bool identifier_reserved_word(const char *s, char *word, size_t n);

#endif
