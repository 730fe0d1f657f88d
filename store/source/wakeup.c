/* Who holds the wake-up lock when this session could not take it: a relay asleep (exclusive,
 * for as long as it sleeps) or a producer's trigger testing it (shared, for an instant). */
#include <stdio.h>

#include "store/store.h"
#include "store/source/lease.h"
#include "store/store_private.h"

int store_wakeup_armed_elsewhere(struct store *s)
{
	char key[16], db[16];
	const char *params[2];
	PGresult *res = NULL;
	int rc, held;

	/* The lock's second key is the table's OID as an int4 (schema.c); pg_locks shows it as
	 * an oid. Read only after a refused try (rare), since the lock list takes every lock
	 * partition of the server. */
	snprintf(key, sizeof(key), "%u", (unsigned int)s->table_key);
	snprintf(db, sizeof(db), "%u", s->db_oid);
	params[0] = key;
	params[1] = db;
	rc = store_exec(s,
	                "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks"
	                " WHERE locktype = 'advisory' AND database = $2::oid"
	                " AND classid = " STORE_WAKEUP_LOCK_CLASS " AND objid = $1::oid"
	                " AND objsubid = 2 AND mode = 'ExclusiveLock' AND granted"
	                " AND pid <> pg_catalog.pg_backend_pid())",
	                2, params, PGRES_TUPLES_OK, &res,
	                "could not read who holds the wake-up lock");
	if (rc != 0)
		return rc;
	held = PQntuples(res) == 1 && PQgetvalue(res, 0, 0)[0] == 't';
	PQclear(res);
	return held ? 1 : 0;
}
