/* identifier.h — the checks that stand between a table or channel name and the SQL text it is
 * pasted into (identifiers cannot be bound as parameters, so anything but this narrow shape
 * is refused rather than quoted). Shared by configuration validation, the store, the
 * producer library and the inbox; part of liboutbox. */
#ifndef OUTBOX_STORE_IDENTIFIER_H
#define OUTBOX_STORE_IDENTIFIER_H

#include <stdbool.h>

/* Table names get derived names by appending up to 12 bytes ("_pending_idx"), and
 * PostgreSQL silently cuts names at 63 bytes, so the part after any schema is at most this
 * long (a longer one would make derived names collide). */
#define STORE_TABLE_BASE_MAX 51

/* "name" or "schema.name", each part [A-Za-z_][A-Za-z0-9_]{0,62}. */
bool store_identifier_valid(const char *s);
/* Same, without a schema part (channel names, derived object names). */
bool store_plain_identifier_valid(const char *s);
/* The part after the schema ("outbox" in "app.outbox") of a valid identifier. */
const char *store_identifier_base(const char *s);
/* A valid identifier whose base is at most STORE_TABLE_BASE_MAX bytes. */
bool store_table_name_valid(const char *s);

#endif
