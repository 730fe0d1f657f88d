/* `migrate`, the database side: reads the catalog, plans only what is missing or different from
 * the table of schema.c, and applies it with short lock waits (indexes built CONCURRENTLY);
 * and the check that the seq sequence hands out values one at a time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store.h"
#include "store/operator/partitions.h"
#include "store/operator/schema.h"
#include "store/operator/schema_private.h"
#include "store/store_private.h"

/* How long migrate waits for any one lock. Short, because while it waits every producer's
 * INSERT queues behind it; long enough for the relay's own statements to finish. */
#define LOCK_TIMEOUT_S "5"

/* What the catalog says about the table and its objects. */
enum state { MISSING = 0, CURRENT, DIFFERENT };

struct found {
	bool table;                   /* the table exists */
	bool partitioned;             /* ... and is partitioned */
	int part_fns;                 /* how many of the partitions' functions exist */
	int64_t part_rows;            /* seqs a partition, as the existing function has it */
	char schema[STORE_NAME_MAX];  /* where it is (or will be created), as in the catalog */
	char qschema[STORE_NAME_MAX]; /* the same, quoted for SQL text */
	bool fillfactor;              /* its storage parameters are current */
	bool have[SCHEMA_N_COLUMNS], has_default[SCHEMA_N_COLUMNS];
	char family[SCHEMA_N_COLUMNS][40];
	enum state index[SCHEMA_N_INDEXES];
	bool retired[SCHEMA_N_RETIRED]; /* a retired index is still there */
	enum state function, trigger;
	bool position; /* the cursor source's position table exists */
	/* The sequence behind seq (quoted, schema-qualified; "" when none) and its CACHE. */
	char seq[2 * STORE_NAME_MAX + 8];
	int64_t seq_cache;
};

/* One change, with what it does in words for the error message. */
struct change {
	char *sql;
	char what[160];
};

#define MAX_CHANGES 16

struct plan {
	struct change c[MAX_CHANGES];
	size_t n;
	bool failed;
	/* What was asked for: a new table partitioned, rows seqs a partition (0 = as it is);
	 * convert: the table is plain and is converted after the other changes. */
	bool partitioned, convert;
	int64_t rows;
};

static void plan_add(struct plan *pl, const char *what, const struct schema_sbuf *b)
{
	if (b->failed || !b->p || pl->n == MAX_CHANGES) {
		free(b->p);
		pl->failed = true;
		return;
	}
	pl->c[pl->n].sql = b->p;
	snprintf(pl->c[pl->n].what, sizeof(pl->c[pl->n].what), "%s", what);
	pl->n++;
}

static void plan_free(struct plan *pl)
{
	for (size_t i = 0; i < pl->n; i++)
		free(pl->c[i].sql);
	pl->n = 0;
}

/* Sends sql (one or more statements) and returns the result that tells how it went (the
 * caller PQclear()s it), NULL when it could not be sent. Unlike store_exec(), the caller gets
 * the failed result too: a lock timeout is told apart by its SQLSTATE. */
static PGresult *run(struct store *s, const char *sql)
{
	if (store_require_conn(s) != 0 || !PQsendQuery(s->conn, sql))
		return NULL;
	s->inflight = STORE_INFLIGHT_SYNC;
	return store_collect(s);
}

static bool run_ok(const PGresult *res)
{
	return PQresultStatus(res) == PGRES_COMMAND_OK || PQresultStatus(res) == PGRES_TUPLES_OK;
}

static bool lock_timed_out(const PGresult *res)
{
	const char *st = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;

	return st && strcmp(st, "55P03") == 0;
}

/* The schema the table lives in; for a missing table, the one CREATE TABLE would use. A
 * missing schema or a name that is not a table is refused here, before anything is read or
 * changed. */
static int locate_table(struct store *s, const struct schema_names *nm, struct found *f)
{
	const char *pa[2] = { nm->t, nm->lschema };
	PGresult *res = NULL;
	int rc;

	rc = store_exec(s,
	                "SELECT n.nspname::text, quote_ident(n.nspname), c.relkind::text"
	                " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
	                " WHERE c.oid = to_regclass($1)"
	                " UNION ALL SELECT x, quote_ident(x), '' FROM"
	                " (SELECT COALESCE(NULLIF($2, ''), current_schema()) AS x) y"
	                " WHERE to_regclass($1) IS NULL",
	                2, pa, PGRES_TUPLES_OK, &res, "could not read the catalog");
	if (rc != 0)
		goto out;
	if (PQntuples(res) != 1 || PQgetisnull(res, 0, 0)) {
		store_set_error(s,
		                "could not create table '%s': no schema to create it in (the "
		                "search_path names none that exists); qualify database.table",
		                nm->t);
		rc = STORE_ERR_FATAL;
		goto out;
	}
	f->table = PQgetvalue(res, 0, 2)[0] != '\0';
	f->partitioned = PQgetvalue(res, 0, 2)[0] == 'p';
	if (f->table && strchr("rp", PQgetvalue(res, 0, 2)[0]) == NULL) {
		store_set_error(s, "'%s' is not a table", nm->t);
		rc = STORE_ERR_FATAL;
		goto out;
	}
	snprintf(f->schema, sizeof(f->schema), "%s", PQgetvalue(res, 0, 0));
	snprintf(f->qschema, sizeof(f->qschema), "%s", PQgetvalue(res, 0, 1));
out:
	PQclear(res);
	return rc;
}

/* An index row of the catalog: which of ours (or of the retired ones) it is, and whether it
 * is built as this version wants it (a different or invalid one is rebuilt). */
static void note_index(const struct schema_names *nm, struct found *f, const char *name,
                       const char *a, const char *b)
{
	for (size_t i = 0; i < SCHEMA_N_INDEXES; i++) {
		char want[STORE_NAME_MAX];

		snprintf(want, sizeof(want), "%s%s", nm->lbase, schema_indexes[i].suffix);
		if (strcmp(name, want) != 0)
			continue;
		f->index[i] = strcmp(a, schema_indexes[i].catalog) == 0 && strcmp(b, "true") == 0
		                      ? CURRENT
		                      : DIFFERENT;
	}
	for (size_t i = 0; i < SCHEMA_N_RETIRED; i++) {
		char old[2 * STORE_NAME_MAX];

		snprintf(old, sizeof(old), "%s%s", nm->lbase, schema_retired_indexes[i]);
		if (strcmp(name, old) == 0)
			f->retired[i] = true;
	}
}

/* The wake-up function is current when its body is the one this version writes for the
 * configured channel, and it pins no settings. */
static int note_function(struct store *s, struct found *f, const char *a, const char *b)
{
	struct schema_sbuf body = { 0 };
	const char *ch = s->opts.channel ? s->opts.channel : "";

	schema_add_notify_body(&body, ch);
	if (body.failed) {
		free(body.p);
		store_set_error(s, "out of memory");
		return STORE_ERR_NOMEM;
	}
	f->function = strcmp(a, body.p) == 0 && b[0] == '\0' ? CURRENT : DIFFERENT;
	free(body.p);
	return 0;
}

/* One row of read_objects()'s answer, noted in f. */
static int note_fact(struct store *s, const struct schema_names *nm, struct found *f,
                     const PGresult *res, int r)
{
	const char *kind = PQgetvalue(res, r, 0), *name = PQgetvalue(res, r, 1);
	const char *a = PQgetvalue(res, r, 2), *b = PQgetvalue(res, r, 3);

	switch (kind[0]) {
	case 't':
		f->fillfactor = strstr(a, "fillfactor=" SCHEMA_FILLFACTOR) != NULL;
		break;
	case 'c':
		for (size_t i = 0; i < SCHEMA_N_COLUMNS; i++) {
			if (strcmp(name, schema_columns[i].name) != 0)
				continue;
			f->have[i] = true;
			f->has_default[i] = strcmp(b, "true") == 0;
			snprintf(f->family[i], sizeof(f->family[i]), "%s", a);
		}
		break;
	case 'i':
		note_index(nm, f, name, a, b);
		break;
	case 'f':
		return note_function(s, f, a, b);
	case 's':
		snprintf(f->seq, sizeof(f->seq), "%s", name);
		if (store_parse_int64(a, &f->seq_cache) != 0)
			f->seq_cache = 0;
		break;
	case 'p':
		f->position = true;
		break;
	case 'x':
		f->part_fns++;
		if (a[0] && store_parse_int64(a, &f->part_rows) != 0)
			f->part_rows = 0;
		break;
	case 'g':
		f->trigger = strcmp(a, "true") == 0 && strcmp(b, "true") == 0 ? CURRENT : DIFFERENT;
		break;
	default:
		break;
	}
	return 0;
}

/* The table's objects in schema f->schema, read in one statement: one row per fact, t = the
 * table and its storage parameters, c = a column, i = an index, f = the wake-up function,
 * s = the sequence behind seq, g = the trigger (is its function ours, is it this version's
 * statement trigger with its WHEN), p = the position table. */
static int read_objects(struct store *s, const struct schema_names *nm, struct found *f)
{
	const char *pb[2] = { f->schema, nm->lbase };
	PGresult *res = NULL;
	int rc;

	rc = store_exec(
	        s,
	        "WITH ns AS (SELECT oid FROM pg_namespace WHERE nspname = $1),"
	        " t AS (SELECT c.oid, c.reloptions FROM pg_class c JOIN ns ON c.relnamespace = "
	        "ns.oid"
	        " WHERE c.relname = $2),"
	        " f AS (SELECT p.oid, p.prosrc, p.proconfig FROM pg_proc p"
	        " JOIN ns ON p.pronamespace = ns.oid"
	        " WHERE p.proname = $2 || '_wakeup_notify' AND p.pronargs = 0)"
	        " SELECT 't', NULL, array_to_string(t.reloptions, ','), NULL FROM t"
	        " UNION ALL SELECT 'c', a.attname::text,"
	        " CASE WHEN a.atttypid IN ('text'::regtype, 'varchar'::regtype, 'bpchar'::regtype)"
	        " THEN 'text' ELSE format_type(a.atttypid, NULL) END,"
	        " (a.atthasdef OR a.attidentity <> '')::text"
	        " FROM t JOIN pg_attribute a ON a.attrelid = t.oid"
	        " WHERE a.attnum > 0 AND NOT a.attisdropped"
	        " UNION ALL SELECT 'i', ic.relname::text,"
	        " regexp_replace(pg_get_indexdef(i.indexrelid), '^.* USING ', ''),"
	        " (i.indisvalid AND i.indisready)::text"
	        " FROM t JOIN pg_index i ON i.indrelid = t.oid JOIN pg_class ic ON ic.oid = "
	        "i.indexrelid"
	        " UNION ALL SELECT 'f', NULL, f.prosrc, array_to_string(f.proconfig, ';') FROM f"
	        " UNION ALL SELECT 's', x.q, sq.seqcache::text, NULL FROM (SELECT"
	        " pg_get_serial_sequence(t.oid::regclass::text, 'seq') AS q FROM t"
	        " JOIN pg_attribute a ON a.attrelid = t.oid WHERE a.attname = 'seq'"
	        " AND a.attnum > 0 AND NOT a.attisdropped OFFSET 0) x"
	        " JOIN pg_sequence sq ON sq.seqrelid = x.q::regclass"
	        " UNION ALL SELECT 'g', tg.tgname::text, (tg.tgfoid = f.oid)::text,"
	        " (tg.tgtype = " STORE_WAKEUP_TGTYPE " AND NOT tg.tgdeferrable"
	        " AND tg.tgqual IS NULL)::text"
	        " FROM t JOIN pg_trigger tg ON tg.tgrelid = t.oid LEFT JOIN f ON true"
	        " WHERE tg.tgname = $2 || '_wakeup'"
	        " UNION ALL SELECT 'p', c.relname::text, NULL, NULL FROM pg_class c"
	        " JOIN ns ON c.relnamespace = ns.oid"
	        " WHERE c.relname = $2 || '" SCHEMA_POSITION_SUFFIX "' AND c.relkind IN ('r', 'p')"
	        " UNION ALL SELECT 'x', p.proname::text,"
	        " COALESCE(substring(p.prosrc FROM 'step bigint := (\\d+);'), ''), NULL"
	        " FROM pg_proc p JOIN ns ON p.pronamespace = ns.oid WHERE p.proname IN"
	        " ($2 || '_part_ahead', $2 || '_part_retire', $2 || '_part_status')",
	        2, pb, PGRES_TUPLES_OK, &res, "could not read the catalog");
	for (int r = 0; rc == 0 && r < PQntuples(res); r++)
		rc = note_fact(s, nm, f, res, r);
	PQclear(res);
	return rc;
}

/* Where the table is and what it has. Reads the catalog only: no lock on the table, so an
 * up-to-date table is checked without queueing behind (or in front of) anyone. */
static int inspect(struct store *s, const struct schema_names *nm, struct found *f)
{
	int rc;

	memset(f, 0, sizeof(*f));
	rc = locate_table(s, nm, f);
	if (rc == 0)
		rc = read_objects(s, nm, f);
	return rc;
}

/* A new table is seen by nobody until this transaction commits, so its indexes are built
 * in the same transaction, at no cost to anyone. */
static void plan_new_table(const char *tq, const char *base, struct plan *pl)
{
	struct schema_sbuf b = { 0 };

	if (pl->partitioned)
		partitions_add_create_table(&b, tq);
	else
		schema_add_create_table(&b, "", tq);
	plan_add(pl, "create the table", &b);
	for (size_t i = 0; i < SCHEMA_N_INDEXES; i++) {
		memset(&b, 0, sizeof(b));
		schema_sbuf_add(&b, "CREATE INDEX %s%s ON %s %s", base, schema_indexes[i].suffix,
		                tq, schema_indexes[i].def);
		plan_add(pl, "create an index", &b);
	}
}

/* The columns and defaults an existing table lacks, in one ALTER TABLE; a column it must have
 * but cannot be given, or one of the wrong type, is refused before anything is changed. */
static int plan_columns(struct store *s, const struct schema_names *nm, const struct found *f,
                        const char *tq, struct plan *pl)
{
	struct schema_sbuf b = { 0 };
	bool any = false;

	for (size_t i = 0; i < SCHEMA_N_COLUMNS; i++) {
		const struct schema_column *c = &schema_columns[i];

		if (!f->have[i] && !c->add) {
			store_set_error(s,
			                "table '%s' has no column %s: it is not an outbox table; "
			                "nothing was changed",
			                nm->t, c->name);
			goto refused;
		}
		if (f->have[i] && strcmp(f->family[i], c->family) != 0) {
			store_set_error(s,
			                "column %s of table '%s' is of type %s, the relay needs "
			                "%s; nothing was changed",
			                c->name, nm->t, f->family[i], c->family);
			goto refused;
		}
		if (f->have[i] && !f->has_default[i] && strcmp(c->name, "seq") == 0) {
			store_set_error(s,
			                "column seq of table '%s' is neither an identity column "
			                "nor has a default; nothing was changed",
			                nm->t);
			goto refused;
		}
		if (!f->have[i])
			schema_sbuf_add(&b, "%s ADD COLUMN %s %s", any ? "," : "", c->name, c->add);
		else if (c->def && !f->has_default[i])
			schema_sbuf_add(&b, "%s ALTER COLUMN %s SET DEFAULT %s", any ? "," : "",
			                c->name, c->def);
		else
			continue;
		any = true;
	}
	if (any) {
		/* ACCESS EXCLUSIVE, and a rewrite for seq and txid: an upgrade, once. */
		struct schema_sbuf a = { 0 };

		schema_sbuf_add(&a, "ALTER TABLE %s%s", tq, b.p ? b.p : "");
		free(b.p);
		plan_add(pl, "add missing columns or defaults", &a);
	}
	return 0;
refused:
	free(b.p); /* what was planned before the refused column */
	return STORE_ERR_FATAL;
}

/* A partitioned table's own objects: its DEFAULT partition (a new table), the functions (when
 * missing, or when a new size of partitions was asked for), and the partitions ahead. (A plain
 * table asked to be partitioned is converted after the other changes: convert().) */
static int plan_partitions(struct store *s, const struct schema_names *nm, const struct found *f,
                           const char *tq, struct plan *pl)
{
	int64_t rows = pl->rows       ? pl->rows
	               : f->part_rows ? f->part_rows
	                              : STORE_PARTITION_ROWS_DEFAULT;
	bool part = f->table ? f->partitioned : pl->partitioned;
	struct schema_sbuf b = { 0 };

	if (!part)
		return 0;
	if (strchr(tq, '\'') != NULL) {
		store_set_error(s,
		                "table '%s': a schema whose name holds a quote is not supported "
		                "for a partitioned table; nothing was changed",
		                nm->t);
		return STORE_ERR_FATAL;
	}
	if (!f->table) {
		partitions_add_default(&b, f->qschema, nm->base, tq);
		plan_add(pl, "create the default partition", &b);
	}
	if (f->part_fns == 3 && (pl->rows == 0 || pl->rows == f->part_rows))
		return 0;
	memset(&b, 0, sizeof(b));
	partitions_add_functions(&b, f->qschema, nm->lbase, tq, (long long)rows);
	plan_add(pl, "create the partitions' functions", &b);
	memset(&b, 0, sizeof(b));
	/* ATTACH takes SHARE UPDATE EXCLUSIVE: producers do not wait for it. */
	schema_sbuf_add(&b, "SELECT %s.%s_part_ahead()", f->qschema, nm->base);
	plan_add(pl, "create the partitions ahead", &b);
	return 0;
}

/* The changes that need a transaction: everything but building indexes on an existing table.
 * Columns the table must have but cannot be given, and columns of the wrong type, are refused
 * before anything is changed. */
static int plan_changes(struct store *s, const struct schema_names *nm, const struct found *f,
                        struct plan *pl)
{
	char tq[2 * STORE_NAME_MAX]; /* the table, schema-qualified */
	const char *ch = s->opts.channel ? s->opts.channel : "";
	struct schema_sbuf b = { 0 };
	int rc = 0;

	snprintf(tq, sizeof(tq), "%s.%s", f->qschema, nm->base);
	/* A plain table is brought up to date as it is, then converted (store_migrate()). */
	pl->convert = f->table && !f->partitioned && pl->partitioned;
	if (!f->table) {
		plan_new_table(tq, nm->base, pl);
	} else {
		rc = plan_columns(s, nm, f, tq, pl);
		if (rc != 0)
			return rc;
		if (f->seq_cache > 1) {
			/* SHARE ROW EXCLUSIVE on the sequence: waits for producers' open
			 * transactions, and their next nextval() waits for it. */
			memset(&b, 0, sizeof(b));
			schema_sbuf_add(&b, "ALTER SEQUENCE %s CACHE 1", f->seq);
			plan_add(pl, "set the seq sequence's CACHE to 1", &b);
		}
		if (!f->fillfactor && !f->partitioned) {
			/* SHARE UPDATE EXCLUSIVE: producers' inserts do not wait for it. */
			memset(&b, 0, sizeof(b));
			schema_sbuf_add(
			        &b, "ALTER TABLE %s SET (fillfactor = " SCHEMA_FILLFACTOR ")", tq);
			plan_add(pl, "set the table's fillfactor", &b);
		}
	}
	if ((rc = plan_partitions(s, nm, f, tq, pl)) != 0)
		return rc;
	if (!f->position) {
		/* A new table: no lock on the outbox table, seen by nobody before COMMIT. */
		memset(&b, 0, sizeof(b));
		schema_add_create_position(&b, "", tq);
		plan_add(pl, "create the position table", &b);
	}
	if (f->function != CURRENT) {
		memset(&b, 0, sizeof(b));
		schema_add_function_ddl(&b, f->qschema, nm->base, ch);
		plan_add(pl, "replace the wake-up function", &b);
	}
	if (f->trigger == DIFFERENT) {
		memset(&b, 0, sizeof(b));
		schema_sbuf_add(&b, "DROP TRIGGER %s_wakeup ON %s", nm->base, tq);
		plan_add(pl, "replace the wake-up trigger", &b);
	}
	if (f->trigger != CURRENT) {
		/* SHARE ROW EXCLUSIVE on the table: producers wait while it waits. */
		memset(&b, 0, sizeof(b));
		schema_add_trigger_ddl(&b, f->qschema, nm->base, tq);
		plan_add(pl, "create the wake-up trigger", &b);
	}
	if (pl->failed) {
		store_set_error(s, "out of memory");
		return STORE_ERR_NOMEM;
	}
	return 0;
}

/* Who holds a lock on the table in a transaction open for at least min_age_s, as one line
 * ("pid 42 (application_name 'billing', idle in transaction, transaction open 12 s)"); false,
 * with a sentence saying they are gone, when nobody does. Asked on a connection that is idle
 * again. */
static bool describe_holders(struct store *s, const struct schema_names *nm, const struct found *f,
                             const char *min_age_s, char *out, size_t len)
{
	char table[2 * STORE_NAME_MAX + 8];
	const char *params[2] = { table, min_age_s };
	PGresult *res = NULL;
	bool found = false;

	snprintf(table, sizeof(table), "%s.%s", f->qschema, nm->base);
	snprintf(out, len, "a transaction that has ended since");
	if (store_exec(s,
	               "SELECT string_agg(format('pid %s (%s, %s%s)', a.pid,"
	               " CASE WHEN a.application_name = '' THEN 'no application_name'"
	               " ELSE 'application_name ' || quote_literal(a.application_name) END,"
	               " COALESCE(a.state, 'state unknown'),"
	               " CASE WHEN a.xact_start IS NULL THEN '' ELSE ', transaction open '"
	               " || floor(extract(epoch FROM clock_timestamp() - a.xact_start))::bigint"
	               " || ' s' END), ', ' ORDER BY a.pid)"
	               " FROM pg_stat_activity a WHERE a.pid IN (SELECT l.pid FROM pg_locks l"
	               " WHERE l.locktype = 'relation' AND l.granted"
	               " AND l.relation = to_regclass($1)"
	               " AND l.pid <> pg_backend_pid() LIMIT 4)"
	               " AND COALESCE(a.xact_start <= clock_timestamp() - $2::int"
	               " * interval '1 second', $2::int = 0)",
	               2, params, PGRES_TUPLES_OK, &res, "could not name the lock holders") == 0 &&
	    PQntuples(res) == 1 && !PQgetisnull(res, 0, 0)) {
		snprintf(out, len, "%s", PQgetvalue(res, 0, 0));
		found = true;
	}
	PQclear(res);
	return found;
}

/* Reports a failed step: a lock timeout as one line naming the table and who holds it, any
 * other error as the server's message. after says what state the table was left in. */
static int step_failed(struct store *s, const struct schema_names *nm, const struct found *f,
                       PGresult *res, const char *timeout_s, const char *what, const char *after)
{
	char holders[300], prefix[256];

	if (!lock_timed_out(res)) {
		snprintf(prefix, sizeof(prefix), "could not migrate table '%s' (%s; %s)", nm->t,
		         what, after);
		return store_result_error(s, res, prefix);
	}
	(void)describe_holders(s, nm, f, "0", holders, sizeof(holders));
	store_set_error(s,
	                "could not %s: table '%s' stayed locked for %s s by %s; %s: run migrate"
	                " again once that transaction has ended",
	                what, nm->t, timeout_s, holders, after);
	return STORE_ERR_QUERY;
}

/* Phase one: every change but index builds, in the transaction store_migrate() opened, each
 * statement waiting at most LOCK_TIMEOUT_S for its lock; then COMMIT. All or nothing: on
 * failure the transaction is rolled back. */
static int apply_changes(struct store *s, const struct schema_names *nm, const struct found *f,
                         const struct plan *pl)
{
	PGresult *res = NULL;
	int rc = 0;

	if (pl->n > 0)
		res = run(s, "SELECT set_config('lock_timeout', '" LOCK_TIMEOUT_S "s', true)");
	for (size_t i = 0; i < pl->n && run_ok(res); i++) {
		PQclear(res);
		res = run(s, pl->c[i].sql);
		if (!run_ok(res)) {
			/* The holders are asked once the transaction is gone, so that its own locks
			 * are not among them. */
			PQclear(run(s, "ROLLBACK"));
			rc = step_failed(s, nm, f, res, LOCK_TIMEOUT_S, pl->c[i].what,
			                 "nothing was changed");
			PQclear(res);
			return rc;
		}
	}
	if (pl->n > 0 && !run_ok(res)) {
		PQclear(run(s, "ROLLBACK"));
		rc = store_result_error(s, res, "could not migrate the outbox table");
		PQclear(res);
		return rc;
	}
	PQclear(res);
	res = run(s, "COMMIT");
	if (!run_ok(res))
		rc = step_failed(s, nm, f, res, LOCK_TIMEOUT_S, "commit", "nothing was changed");
	PQclear(res);
	return rc;
}

/* Phase two: indexes missing from (or different on) a table that already exists are built
 * CONCURRENTLY, so producers keep inserting while a large table is indexed: a plain CREATE
 * INDEX would hold their inserts for the whole build. It cannot run in a transaction, so
 * each index is its own step; a build that fails leaves an invalid index behind, which the
 * next migrate drops and builds again.
 * A concurrent build takes no lock that producers wait for, but it waits itself: for the
 * table's writers, and then for every transaction in the database older than its snapshot,
 * whatever table it works on. So a session that has held the table for LOCK_TIMEOUT_S
 * already (an application transaction left open) fails it at once, with its name, and the
 * waits are otherwise given INDEX_LOCK_TIMEOUT_S, time for an unrelated long transaction to
 * end. Indexes an earlier version used and this one does not (schema_retired_indexes) are dropped
 * CONCURRENTLY the same way, after the builds. */
#define INDEX_LOCK_TIMEOUT_S "60"

static int build_indexes(struct store *s, const struct schema_names *nm, const struct found *f,
                         bool changed)
{
	char sql[1024], what[STORE_NAME_MAX + 64], tq[2 * STORE_NAME_MAX], holders[300];
	const char *after = changed ? "the other changes were applied" : "nothing else was changed";
	/* A partitioned table's indexes cannot be built CONCURRENTLY: the build holds producers'
	 * inserts (docs/operations.md, "Partitioning"). */
	const char *conc = f->partitioned ? "" : "CONCURRENTLY ";
	PGresult *res = NULL;
	int rc = 0;

	if (!f->table)
		return 0;
	snprintf(tq, sizeof(tq), "%s.%s", f->qschema, nm->base);
	/* The builds first, then the drops: the claim has its new index before it loses the
	 * old one. */
	for (size_t i = 0; i < SCHEMA_N_INDEXES + SCHEMA_N_RETIRED && rc == 0; i++) {
		bool drop = i >= SCHEMA_N_INDEXES;

		if (drop ? !f->retired[i - SCHEMA_N_INDEXES] : f->index[i] == CURRENT)
			continue;
		snprintf(what, sizeof(what), "%s index %s%s", drop ? "drop the retired" : "create",
		         nm->base,
		         drop ? schema_retired_indexes[i - SCHEMA_N_INDEXES]
		              : schema_indexes[i].suffix);
		if (describe_holders(s, nm, f, LOCK_TIMEOUT_S, holders, sizeof(holders))) {
			store_set_error(
			        s,
			        "could not %s: table '%s' has been locked for over " LOCK_TIMEOUT_S
			        " s by %s; %s: run migrate again once that transaction has ended",
			        what, nm->t, holders, after);
			rc = STORE_ERR_QUERY;
			break;
		}
		PQclear(res);
		res = run(s, "SET lock_timeout = '" INDEX_LOCK_TIMEOUT_S "s'");
		if (run_ok(res) && drop) {
			snprintf(sql, sizeof(sql), "DROP INDEX %sIF EXISTS %s.%s%s", conc,
			         f->qschema, nm->base,
			         schema_retired_indexes[i - SCHEMA_N_INDEXES]);
			PQclear(res);
			res = run(s, sql);
		} else if (run_ok(res) && f->index[i] == DIFFERENT) {
			snprintf(sql, sizeof(sql), "DROP INDEX %sIF EXISTS %s.%s%s", conc,
			         f->qschema, nm->base, schema_indexes[i].suffix);
			PQclear(res);
			res = run(s, sql);
		}
		if (run_ok(res) && !drop) {
			snprintf(sql, sizeof(sql), "CREATE INDEX %sIF NOT EXISTS %s%s ON %s %s",
			         conc, nm->base, schema_indexes[i].suffix, tq,
			         schema_indexes[i].def);
			PQclear(res);
			res = run(s, sql);
		}
		if (!run_ok(res))
			rc = step_failed(s, nm, f, res, INDEX_LOCK_TIMEOUT_S, what, after);
	}
	PQclear(res);
	PQclear(run(s, "RESET lock_timeout"));
	return rc;
}

/* Reads the catalog and changes only what is missing or different, so that the run on every
 * deployment (Compose runs it on each `up`) finds an up-to-date table and takes no lock on
 * it at all. Every lock a change needs is waited for at most LOCK_TIMEOUT_S: while a DDL
 * statement waits for a lock, every producer's INSERT queues behind it, so an open
 * transaction on the table must make migrate fail, not stall the application (index builds,
 * which nobody queues behind, see build_indexes()). The reading
 * and the changes share one transaction, which first takes an advisory lock: two migrates of
 * the same table take turns (CREATE ... is not safe against a concurrent create of the same
 * name, and the second must see what the first did). A transaction lock, not a session lock:
 * through a transaction-pooling proxy a session lock would stay behind on a server connection
 * and hold every later migrate. Index builds come after, outside any transaction. */
/* The conversion of an up-to-date plain table, then a check that it is what a partitioned
 * table should be (an ordinary migrate of it, which finds nothing to change). */
static int migrate(struct store *s, bool partitioned, int64_t rows);

static int convert(struct store *s, const struct schema_names *nm, const struct found *f,
                   int64_t rows)
{
	char tq[2 * STORE_NAME_MAX];
	int rc;

	snprintf(tq, sizeof(tq), "%s.%s", f->qschema, nm->base);
	if (strchr(tq, '\'') != NULL) {
		store_set_error(s,
		                "table '%s': a schema whose name holds a quote is not supported "
		                "for a partitioned table; nothing was changed",
		                nm->t);
		return STORE_ERR_FATAL;
	}
	rc = partitions_convert(s, f->qschema, nm->lbase, nm->base,
	                        rows ? rows : STORE_PARTITION_ROWS_DEFAULT);
	if (rc == 0)
		rc = migrate(s, false, 0);
	if (rc == 0)
		snprintf(s->notice, sizeof(s->notice),
		         "table %s is now partitioned by seq, its rows so far in %s_pmin; restart "
		         "the table's relays (they read the old sequence and wake-up lock until "
		         "they reconnect)",
		         nm->t, nm->base);
	return rc;
}

static int migrate(struct store *s, bool partitioned, int64_t rows)
{
	char key[STORE_NAME_MAX + 32];
	const char *params[1] = { key };
	struct plan pl = { .n = 0, .partitioned = partitioned, .rows = rows };
	struct schema_names nm;
	struct found f;
	PGresult *res = NULL;
	int rc;

	s->notice[0] = '\0';
	rc = store_require_conn(s);
	if (rc != 0)
		goto out;
	if (!schema_names_make(&nm, s->table)) {
		store_set_error(s, "could not build the schema for table '%s': name not usable",
		                s->table);
		rc = STORE_ERR_FATAL;
		goto out;
	}
	snprintf(key, sizeof(key), "outbox-relay migrate %s", s->table);
	res = run(s, "BEGIN");
	if (!run_ok(res)) {
		rc = store_result_error(s, res, "could not migrate the outbox table");
		goto out;
	}
	if ((rc = store_exec(s, "SELECT pg_advisory_xact_lock(hashtext($1))", 1, params,
	                     PGRES_TUPLES_OK, NULL, "could not take the migrate lock")) != 0 ||
	    (rc = inspect(s, &nm, &f)) != 0 || (rc = plan_changes(s, &nm, &f, &pl)) != 0) {
		if (store_connected(s))
			PQclear(run(s, "ROLLBACK"));
		goto out;
	}
	if ((rc = apply_changes(s, &nm, &f, &pl)) != 0)
		goto out;
	if (f.seq_cache > 1)
		snprintf(s->notice, sizeof(s->notice),
		         "sequence %s had CACHE %lld and now has CACHE 1; a session that cached "
		         "values before keeps them until it ends: restart the producers' "
		         "connections (or run DISCARD SEQUENCES in them) before relays start",
		         f.seq, (long long)f.seq_cache);
	rc = build_indexes(s, &nm, &f, pl.n > 0);
	if (rc == 0 && pl.convert)
		rc = convert(s, &nm, &f, rows);
out:
	PQclear(res);
	plan_free(&pl);
	return rc;
}

int store_migrate(struct store *s)
{
	return migrate(s, false, 0);
}

int store_migrate_partitioned(struct store *s, int64_t partition_rows)
{
	if (partition_rows != 0 && (partition_rows < STORE_PARTITION_ROWS_MIN ||
	                            partition_rows > STORE_PARTITION_ROWS_MAX)) {
		store_set_error(s, "partition rows %lld out of range (%d to %lld)",
		                (long long)partition_rows, STORE_PARTITION_ROWS_MIN,
		                STORE_PARTITION_ROWS_MAX);
		return STORE_ERR_FATAL;
	}
	return migrate(s, true, partition_rows);
}

/* The ordering watermark (store/source/watermark.h) takes pg_sequence_last_value() as the highest seq
 * handed out, and the sequence's lock holders as the transactions that may still commit one
 * below it. With CACHE n > 1 a session takes n values at once: last_value counts values no
 * transaction holds yet, and a later transaction of that session draws one of them without any
 * lock held meanwhile, below rows already committed and published. A key's rows then go out in
 * seq order, not in the order they were committed (its second row first). */
int store_check_sequence(struct store *s)
{
	const char *params[1] = { s->table };
	PGresult *res = NULL;
	int64_t cache = 0;
	int rc;

	rc = store_exec(
	        s,
	        "SELECT x.q, sq.seqcache::text FROM (SELECT pg_get_serial_sequence($1, 'seq')"
	        " AS q FROM pg_attribute WHERE attrelid = to_regclass($1)"
	        " AND attname = 'seq' AND attnum > 0 AND NOT attisdropped OFFSET 0) x"
	        " JOIN pg_sequence sq ON sq.seqrelid = x.q::regclass",
	        1, params, PGRES_TUPLES_OK, &res, "could not read the seq sequence");
	if (rc != 0)
		return rc;
	if (PQntuples(res) == 1 && store_parse_int64(PQgetvalue(res, 0, 1), &cache) == 0 &&
	    cache > 1) {
		const char *q = PQgetvalue(res, 0, 0);

		store_set_error(s,
		                "sequence %s behind seq of table '%s' has CACHE %lld, which lets a "
		                "key's rows go out of commit order (a session hands out values it "
		                "cached earlier); run 'outbox-relay migrate' or ALTER SEQUENCE %s "
		                "CACHE 1, then restart the producers' connections",
		                q, s->table, (long long)cache, q);
		rc = 1;
	}
	PQclear(res);
	return rc;
}

const char *store_notice(const struct store *s)
{
	return s->notice;
}
