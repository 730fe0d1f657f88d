/* The cursor source's position as the rest of the store reads it: whether the cursor source
 * runs the table (a row in <table>_position, stream 'main'), and where it is. The lease source
 * refuses such a table, and the operator commands read it with the cursor's definitions
 * (docs/design.md, "Row sources: lease and cursor"). */
#include <stdio.h>
#include <string.h>

#include "store/store.h"
#include "store/store_private.h"

int store_cursor_position(struct store *s, bool *cursor, int64_t *pos)
{
	char name[STORE_NAME_MAX + 16], sql[2 * STORE_NAME_MAX + 96];
	const char *params[1] = { name };
	PGresult *res = NULL;
	int rc;

	*cursor = false;
	*pos = 0;
	snprintf(name, sizeof(name), "%s" STORE_POSITION_SUFFIX, s->table);
	/* Two statements: one naming a missing table would fail. */
	rc = store_exec(s, "SELECT to_regclass($1) IS NOT NULL", 1, params, PGRES_TUPLES_OK, &res,
	                "could not look for the cursor source's position");
	if (rc != 0)
		return rc;
	bool exists = PQntuples(res) == 1 && PQgetvalue(res, 0, 0)[0] == 't';
	PQclear(res);
	res = NULL;
	if (!exists)
		return 0;
	if ((rc = store_format_sql(s, sql, sizeof(sql),
	                           "SELECT position FROM %s WHERE stream = 'main'", name)) != 0)
		return rc;
	rc = store_exec(s, sql, 0, NULL, PGRES_TUPLES_OK, &res,
	                "could not read the cursor source's position");
	if (rc != 0)
		return rc;
	if (PQntuples(res) == 1) {
		if (store_parse_int64(PQgetvalue(res, 0, 0), pos) != 0) {
			store_set_error(s, "the cursor source's position is unreadable");
			rc = STORE_ERR_QUERY;
		} else {
			*cursor = true;
		}
	}
	PQclear(res);
	return rc;
}

int store_table_mode(struct store *s, struct store_table_mode *m)
{
	int rc = store_cursor_position(s, &m->cursor, &m->pos);

	snprintf(m->p, sizeof(m->p), "%lld", (long long)m->pos);
	return rc;
}
