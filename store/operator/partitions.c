/* The partitioned outbox table (docs/design.md, "A partitioned table"): its DDL, the three
 * functions migrate creates beside it (keep partitions ahead of the producers, retire done
 * partitions, count what status shows), and the calls of them. The functions run as the
 * table's owner (SECURITY DEFINER), so a relay role that may only read and write rows can
 * create and drop partitions, and nothing more. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store.h"
#include "store/operator/partitions.h"
#include "store/operator/schema_private.h"
#include "store/store_private.h"

/* The parent: the columns of DESIGN §1, but id is unique per partition only (a unique
 * constraint of a partitioned table must contain the partition key), and the parent has no
 * storage parameters (each partition gets the fillfactor). */
void partitions_add_create_table(struct schema_sbuf *b, const char *table)
{
	schema_sbuf_add(b, "CREATE TABLE %s (\n", table);
	for (size_t i = 0; i < SCHEMA_N_COLUMNS; i++) {
		const char *decl = schema_columns[i].decl;

		if (strcmp(schema_columns[i].name, "seq") == 0)
			decl = "BIGINT GENERATED ALWAYS AS IDENTITY,   -- insertion order";
		else if (strcmp(schema_columns[i].name, "id") == 0)
			decl = "VARCHAR(64)  NOT NULL,   -- unique in each partition";
		schema_sbuf_add(b, "  %-13s %s%s\n", schema_columns[i].name, decl,
		                i + 1 == SCHEMA_N_COLUMNS ? "," : "");
	}
	schema_sbuf_add(b, "  UNIQUE (seq)\n) PARTITION BY RANGE (seq)");
}

/* The partitions of the parent (a regclass variable in the functions below) with their
 * bounds: lo and hi are NULL for the DEFAULT partition, lo NULL for one FROM (MINVALUE). Read
 * from the catalog, so that partitions made by hand or by pg_partman count the same. */
#define BOUNDS                                                                              \
	"SELECT c.oid::regclass AS part,"                                                   \
	" (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \\(''(-?\\d+)''\\)'))[1]" \
	"::bigint AS lo,"                                                                   \
	" (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \\(''(-?\\d+)''\\)'))[1]"   \
	"::bigint AS hi,"                                                                   \
	" pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT' AS dflt"                           \
	" FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = parent"

/* The templates below are filled by add_template(): {S} = the schema (quoted), {B} = the
 * table's base name, {T} = the table (schema-qualified, as a literal's text), {F} = the
 * function's name suffix and arguments, {R} = what it returns, {N} = seqs a partition.
 * The head every function shares.
 * search_path pinned: a SECURITY DEFINER function must not resolve names through its caller's
 * path. A lock waited for at most 1 s: while DDL waits, producers queue behind it. */
#define FN_HEAD                                                                 \
	"CREATE OR REPLACE FUNCTION {S}.{B}{F} RETURNS {R}\n"                   \
	"LANGUAGE plpgsql SECURITY DEFINER\n"                                   \
	"SET search_path = pg_catalog, pg_temp SET lock_timeout = '1s'\n"       \
	"AS $fn$\n"                                                             \
	"DECLARE\n"                                                             \
	"  parent regclass := '{T}'::regclass;\n"                               \
	"  ns text := (SELECT relnamespace::regnamespace::text FROM pg_class\n" \
	"              WHERE oid = parent);\n"                                  \
	"  cur bigint := COALESCE(pg_sequence_last_value(\n"                    \
	"    pg_get_serial_sequence(parent::text, 'seq')::regclass), 0);\n"

/* Keeps partitions ahead. New ones start above the top bound and
 * above any row in the DEFAULT partition (a range over such a row could not be attached). A
 * partition is created apart and attached: ATTACH takes SHARE UPDATE EXCLUSIVE on the parent,
 * which producers' inserts do not wait for, where CREATE TABLE ... PARTITION OF would take
 * ACCESS EXCLUSIVE. Each gets the unique index on id; the parent's indexes come with ATTACH.
 * Two calls at once take turns (the advisory lock). A table pg_partman manages is left to
 * pg_partman's own maintenance. */
#define FN_AHEAD                                                                                 \
	FN_HEAD                                                                                  \
	"  step bigint := {N};\n"                                                                \
	"  dpart regclass;\n  top bigint;\n  nexthi bigint;\n  nm text;\n  made integer := 0;\n" \
	"  managed boolean := false;\n"                                                          \
	"BEGIN\n"                                                                                \
	"  PERFORM pg_advisory_xact_lock(hashtext('outbox-relay partitions ' || parent));\n"     \
	"  IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_partman') THEN\n"           \
	"    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s.part_config'\n"                     \
	"      ' WHERE parent_table = $1)', (SELECT extnamespace::regnamespace::text\n"          \
	"      FROM pg_extension WHERE extname = 'pg_partman'))\n"                               \
	"      INTO managed USING (SELECT n.nspname || '.' || c.relname FROM pg_class c\n"       \
	"      JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = parent);\n"           \
	"    IF managed THEN\n      RETURN 0;\n    END IF;\n"                                    \
	"  END IF;\n"                                                                            \
	"  SELECT b.part INTO dpart FROM (" BOUNDS ") b WHERE b.dflt;\n"                         \
	"  IF dpart IS NOT NULL THEN\n"                                                          \
	"    EXECUTE format('SELECT max(seq) FROM %s', dpart) INTO top;\n"                       \
	"  END IF;\n"                                                                            \
	"  cur := GREATEST(cur, COALESCE(top, 0));\n"                                            \
	"  SELECT max(b.hi) INTO nexthi FROM (" BOUNDS ") b;\n"                                  \
	"  nexthi := COALESCE(nexthi, cur / step * step + 1);\n"                                 \
	"  IF top IS NOT NULL AND top >= nexthi THEN\n    nexthi := top + 1;\n  END IF;\n"       \
	"  WHILE nexthi <= cur + 2 * step LOOP\n"                                                \
	"    nm := left('{B}', 63 - length('_p' || nexthi)) || '_p' || nexthi;\n"                \
	"    EXECUTE format('CREATE TABLE %s.%I (LIKE %s INCLUDING DEFAULTS)'\n"                 \
	"      ' WITH (fillfactor = " SCHEMA_FILLFACTOR ")', ns, nm, parent);\n"                 \
	"    EXECUTE format('CREATE UNIQUE INDEX ON %s.%I (id)', ns, nm);\n"                     \
	"    EXECUTE format('ALTER TABLE %s ATTACH PARTITION %s.%I FOR VALUES'\n"                \
	"      ' FROM (%s) TO (%s)', parent, ns, nm, nexthi, nexthi + step);\n"                  \
	"    nexthi := nexthi + step;\n    made := made + 1;\n"                                  \
	"  END LOOP;\n"                                                                          \
	"  RETURN made;\n"                                                                       \
	"END\n$fn$"

/* Whether partition p is done, by the row source's definition (pos NULL: the lease source;
 * else the cursor source's position), and its rows' publication older than cut. */
#define DONE_CHECK                                                                                \
	"    EXECUTE format('SELECT NOT EXISTS (SELECT 1 FROM %1$s WHERE published_at IS NULL'\n" \
	"      ' AND (ordering_key IS NULL OR ordering_key IS NOT NULL) AND $1 IS NULL)'\n"       \
	"      ' AND NOT EXISTS (SELECT 1 FROM %1$s WHERE deferred_at IS NOT NULL'\n"             \
	"      ' AND published_at IS NULL)'\n"                                                    \
	"      ' AND COALESCE((SELECT max(published_at) FROM %1$s'\n"                             \
	"      ' WHERE published_at IS NOT NULL) < $2, true)', r.part)\n"                         \
	"      INTO done USING pos, cut;\n"

/* Retires at most one partition a call (the caller loops), so the parent's exclusive lock,
 * which DROP needs, is held for one drop only. A candidate lies wholly below the sequence and,
 * for the cursor source, wholly at or behind its position. The lease source: no row in it
 * unpublished (pending, leased, failed or dead), and the newest published_at older than cut.
 * The cursor source: no deferred row still unpublished (a dead row is one), the newest
 * published_at (rows its exception path published) older than cut, and it was first seen
 * done before cut: its rows carry no time of publication, so the first call that finds it done
 * notes the time in the partition's comment, and the partition goes one retention later.
 * The check is made again under the lock: a replay may have made a row pending meanwhile.
 * The lock is waited for 100 ms at most: producers' inserts queue behind a waiting request
 * for it, and a drop missed is tried again at the next purge. */
#define FN_RETIRE                                                                              \
	FN_HEAD                                                                                \
	"  cut timestamptz := now() - age_ms * interval '1 millisecond';\n"                    \
	"  r record;\n  done boolean;\n  seen text;\n"                                         \
	"BEGIN\n"                                                                              \
	"  rows_gone := 0;\n  dropped := 0;\n"                                                 \
	"  PERFORM pg_advisory_xact_lock(hashtext('outbox-relay partitions ' || parent));\n"   \
	"  FOR r IN SELECT b.part, b.hi FROM (" BOUNDS ") b WHERE NOT b.dflt\n"                \
	"           AND b.hi - 1 <= cur AND (pos IS NULL OR b.hi - 1 <= pos) ORDER BY b.hi\n"  \
	"  LOOP\n" DONE_CHECK "    CONTINUE WHEN NOT done;\n"                                  \
	"    IF pos IS NOT NULL THEN\n"                                                        \
	"      seen := substring(obj_description(r.part, 'pg_class')\n"                        \
	"                        FROM '^outbox-relay: done since (.*)$');\n"                   \
	"      IF seen IS NULL THEN\n"                                                         \
	"        EXECUTE format('COMMENT ON TABLE %s IS %L', r.part,\n"                        \
	"          'outbox-relay: done since ' || now());\n"                                   \
	"        CONTINUE;\n"                                                                  \
	"      END IF;\n"                                                                      \
	"      CONTINUE WHEN seen::timestamptz >= cut;\n"                                      \
	"    END IF;\n"                                                                        \
	"    EXECUTE format('SELECT count(*) FROM %s', r.part) INTO rows_gone;\n"              \
	"    PERFORM set_config('lock_timeout', '100ms', true);\n"                             \
	"    BEGIN\n"                                                                          \
	"      EXECUTE format('LOCK TABLE ONLY %s IN ACCESS EXCLUSIVE MODE', parent);\n"       \
	"    EXCEPTION WHEN lock_not_available THEN\n"                                         \
	"      rows_gone := 0;\n      RETURN;\n"                                               \
	"    END;\n" DONE_CHECK "    IF NOT done THEN\n      rows_gone := 0;\n      RETURN;\n" \
	"    END IF;\n"                                                                        \
	"    EXECUTE format('DROP TABLE %s', r.part);\n"                                       \
	"    dropped := 1;\n"                                                                  \
	"    RETURN;\n"                                                                        \
	"  END LOOP;\n"                                                                        \
	"END\n$fn$"

/* What status shows: the range partitions, the rows in the DEFAULT partition (producers never
 * fail for lack of a partition, but those rows are never retired), and how many partitions
 * dead rows keep (an operator requeues or discards them). */
#define FN_STATUS                                                                              \
	FN_HEAD                                                                                \
	"  dpart regclass;\n"                                                                  \
	"BEGIN\n"                                                                              \
	"  SELECT count(*) FILTER (WHERE NOT b.dflt), (array_agg(b.part) FILTER (WHERE "       \
	"b.dflt))[1]"                                                                          \
	"\n    INTO partitions, dpart FROM (" BOUNDS ") b;\n"                                  \
	"  default_rows := 0;\n"                                                               \
	"  IF dpart IS NOT NULL THEN\n"                                                        \
	"    EXECUTE format('SELECT count(*) FROM %s', dpart) INTO default_rows;\n"            \
	"  END IF;\n"                                                                          \
	"  IF cursor THEN\n"                                                                   \
	"    EXECUTE format('SELECT count(DISTINCT tableoid) FROM %s WHERE deferred_at IS'\n"  \
	"      ' NOT NULL AND published_at IS NULL AND attempts >= $1', parent)\n"             \
	"      INTO dead_partitions USING max_attempts;\n"                                     \
	"  ELSE\n"                                                                             \
	"    EXECUTE format('SELECT count(DISTINCT tableoid) FROM %s WHERE published_at IS'\n" \
	"      ' NULL AND (ordering_key IS NULL OR ordering_key IS NOT NULL)'\n"               \
	"      ' AND attempts >= $1', parent) INTO dead_partitions USING max_attempts;\n"      \
	"  END IF;\n"                                                                          \
	"END\n$fn$"

#define AHEAD_SIG "_part_ahead()"
#define RETIRE_SIG \
	"_part_retire(age_ms bigint, pos bigint, OUT rows_gone bigint, OUT dropped bigint)"
#define STATUS_SIG                                                                  \
	"_part_status(max_attempts integer, cursor boolean, OUT partitions bigint," \
	" OUT default_rows bigint, OUT dead_partitions bigint)"
#define FN_NAMES                                                      \
	"{S}.{B}_part_ahead(), {S}.{B}_part_retire(bigint, bigint), " \
	"{S}.{B}_part_status(integer, boolean)"

/* The functions run as the table's owner; EXECUTE, which a function gives PUBLIC by default,
 * only to the roles that may DELETE from the table: the relay's (packaging/grants.sql grants it
 * too, for the first migrate, which runs before the grants). */
#define FN_GRANTS                                                                                \
	"DO $do$\nDECLARE\n  r record;\n"                                                        \
	"  o regrole := (SELECT relowner::regrole FROM pg_class WHERE oid = '{T}'::regclass);\n" \
	"BEGIN\n"                                                                                \
	"  IF (SELECT proowner FROM pg_proc WHERE oid = '{S}.{B}_part_ahead'::regproc) <> o "    \
	"THEN\n"                                                                                 \
	"    EXECUTE format('ALTER FUNCTION {S}.{B}_part_ahead() OWNER TO %s', o);\n"            \
	"    EXECUTE format('ALTER FUNCTION {S}.{B}_part_retire(bigint, bigint) OWNER TO %s', "  \
	"o);\n"                                                                                  \
	"    EXECUTE format('ALTER FUNCTION {S}.{B}_part_status(integer, boolean) OWNER TO %s'," \
	" o);\n"                                                                                 \
	"  END IF;\n"                                                                            \
	"  FOR r IN SELECT DISTINCT a.grantee::regrole AS g FROM pg_class c,\n"                  \
	"           aclexplode(c.relacl) a WHERE c.oid = '{T}'::regclass\n"                      \
	"           AND a.privilege_type = 'DELETE' AND a.grantee <> 0\n"                        \
	"           AND a.grantee <> c.relowner LOOP\n"                                          \
	"    EXECUTE format('GRANT EXECUTE ON FUNCTION " FN_NAMES " TO %s', r.g);\n"             \
	"  END LOOP;\n"                                                                          \
	"END\n$do$"

/* Appends tmpl to b with each {X} replaced by vals (S, B, T, F, R, N in that order). */
static void add_template(struct schema_sbuf *b, const char *tmpl, const char *const vals[6])
{
	static const char keys[] = "SBTFRN";
	const char *p = tmpl, *k;

	while (*p) {
		const char *open = strchr(p, '{');

		if (!open || !open[1] || open[2] != '}' || !(k = strchr(keys, open[1]))) {
			size_t n = open ? (size_t)(open - p) + 1 : strlen(p);

			schema_sbuf_add(b, "%.*s", (int)n, p);
			p += n;
			continue;
		}
		schema_sbuf_add(b, "%.*s%s", (int)(open - p), p, vals[k - keys]);
		p = open + 3;
	}
}

void partitions_add_functions(struct schema_sbuf *b, const char *qschema, const char *base,
                              const char *tq, long long rows)
{
	char n[24];
	const char *ahead[6] = { qschema, base, tq, AHEAD_SIG, "integer", n };
	const char *retire[6] = { qschema, base, tq, RETIRE_SIG, "record", n };
	const char *status[6] = { qschema, base, tq, STATUS_SIG, "record", n };

	snprintf(n, sizeof(n), "%lld", rows);
	add_template(b, FN_AHEAD ";\n", ahead);
	add_template(b, FN_RETIRE ";\n", retire);
	add_template(b, FN_STATUS ";\n", status);
	add_template(b, "REVOKE ALL ON FUNCTION " FN_NAMES " FROM PUBLIC;\n", ahead);
	add_template(b, FN_GRANTS, ahead);
}

/* The swap of a plain table for a partitioned one, in the transaction that holds the table's
 * ACCESS EXCLUSIVE lock ({N} = the bound its validated CHECK guarantees): the table becomes
 * the parent's first partition, FROM (MINVALUE) TO ({N}), attached without a scan; its
 * indexes are renamed so that the parent's indexes, created after, take their names and attach
 * them instead of building; the parent's identity continues the old sequence; the privileges
 * on the table, its columns and its sequence are copied, so producers and relays keep theirs. */
#define CONVERT_SWAP                                                                               \
	"DO $do$\nDECLARE\n"                                                                       \
	"  old regclass := '{T}'::regclass;\n"                                                     \
	"  oseq regclass := pg_get_serial_sequence('{T}', 'seq')::regclass;\n"                     \
	"  last bigint := COALESCE(pg_sequence_last_value(oseq), 0);\n"                            \
	"  r record;\n"                                                                            \
	"BEGIN\n"                                                                                  \
	"  IF last >= {N} - 1 THEN\n"                                                              \
	"    RAISE EXCEPTION 'the sequence reached %, the bound of the first partition', {N};\n"   \
	"  END IF;\n"                                                                              \
	"  ALTER TABLE {T} RENAME TO {B}_pmin;\n"                                                  \
	"  FOR r IN SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid\n"    \
	"           WHERE i.indrelid = old AND c.relname IN ('{B}_unkeyed_idx', '{B}_key_idx',\n"  \
	"           '{B}_published_idx', '{B}_deferred_idx') LOOP\n"                               \
	"    EXECUTE format('ALTER INDEX {S}.%I RENAME TO %I', r.relname,\n"                       \
	"      '{B}_pmin' || substr(r.relname, length('{B}') + 1));\n"                             \
	"  END LOOP;\n"                                                                            \
	"  DROP TRIGGER IF EXISTS {B}_wakeup ON {S}.{B}_pmin;\n"                                   \
	"  CREATE TABLE {T} (LIKE {S}.{B}_pmin INCLUDING DEFAULTS, UNIQUE (seq))\n"                \
	"    PARTITION BY RANGE (seq);\n"                                                          \
	"  EXECUTE format('ALTER TABLE {T} ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY'\n"   \
	"    ' (START WITH %s)', last + 1);\n"                                                     \
	"  ALTER TABLE {T} ATTACH PARTITION {S}.{B}_pmin FOR VALUES FROM (MINVALUE) TO ({N});\n"   \
	"  FOR r IN SELECT a.grantee, a.privilege_type FROM pg_class c, aclexplode(c.relacl) a\n"  \
	"           WHERE c.oid = old AND a.grantee <> c.relowner LOOP\n"                          \
	"    EXECUTE format('GRANT %s ON {T} TO %s', r.privilege_type, CASE WHEN r.grantee = 0\n"  \
	"      THEN 'PUBLIC' ELSE r.grantee::regrole::text END);\n"                                \
	"  END LOOP;\n"                                                                            \
	"  FOR r IN SELECT t.attname, a.grantee, a.privilege_type FROM pg_attribute t,\n"          \
	"           aclexplode(t.attacl) a WHERE t.attrelid = old AND t.attacl IS NOT NULL LOOP\n" \
	"    EXECUTE format('GRANT %s (%I) ON {T} TO %s', r.privilege_type, r.attname,\n"          \
	"      CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE r.grantee::regrole::text END);\n"        \
	"  END LOOP;\n"                                                                            \
	"  FOR r IN SELECT a.grantee, a.privilege_type FROM pg_class c, aclexplode(c.relacl) a\n"  \
	"           WHERE c.oid = oseq AND a.grantee <> c.relowner LOOP\n"                         \
	"    EXECUTE format('GRANT %s ON SEQUENCE %s TO %s', r.privilege_type,\n"                  \
	"      pg_get_serial_sequence('{T}', 'seq'), CASE WHEN r.grantee = 0 THEN 'PUBLIC'\n"      \
	"      ELSE r.grantee::regrole::text END);\n"                                              \
	"  END LOOP;\n"                                                                            \
	"END\n$do$"

/* The DEFAULT partition: a producer never fails for want of a partition. */
void partitions_add_default(struct schema_sbuf *b, const char *qschema, const char *base,
                            const char *tq)
{
	schema_sbuf_add(b,
	                "CREATE TABLE %s.%s_default PARTITION OF %s DEFAULT"
	                " WITH (fillfactor = " SCHEMA_FILLFACTOR ");\n"
	                "CREATE UNIQUE INDEX ON %s.%s_default (id)",
	                qschema, base, tq, qschema, base);
}

/* ---- the calls ---- */

/* Whether the table is partitioned, and the schema its functions live in (quoted). */
static int lookup(struct store *s, bool *partitioned, char *qschema, size_t cap)
{
	const char *params[1] = { s->table };
	PGresult *res = NULL;
	int rc;

	*partitioned = false;
	rc = store_exec(s,
	                "SELECT c.relkind = 'p', quote_ident(n.nspname) FROM pg_class c"
	                " JOIN pg_namespace n ON n.oid = c.relnamespace"
	                " WHERE c.oid = to_regclass($1)",
	                1, params, PGRES_TUPLES_OK, &res, "could not look up the table");
	if (rc != 0)
		return rc;
	if (PQntuples(res) == 1 && PQgetvalue(res, 0, 0)[0] == 't') {
		*partitioned = true;
		snprintf(qschema, cap, "%s", PQgetvalue(res, 0, 1));
	}
	PQclear(res);
	return 0;
}

int store_partitioned(struct store *s, bool *partitioned)
{
	char qschema[STORE_NAME_MAX];

	return lookup(s, partitioned, qschema, sizeof(qschema));
}

int store_partitions_ahead(struct store *s, int *made)
{
	char qschema[STORE_NAME_MAX], sql[3 * STORE_NAME_MAX];
	PGresult *res = NULL;
	bool part;
	int rc;

	*made = 0;
	if ((rc = lookup(s, &part, qschema, sizeof(qschema))) != 0 || !part)
		return rc;
	if ((rc = store_format_sql(s, sql, sizeof(sql), "SELECT %s.%s_part_ahead()", qschema,
	                           identifier_base(s->table))) != 0)
		return rc;
	rc = store_exec(s, sql, 0, NULL, PGRES_TUPLES_OK, &res,
	                "could not create the partitions ahead");
	if (rc != 0)
		return rc;
	int64_t n = 0;

	if (store_parse_int64(PQgetvalue(res, 0, 0), &n) == 0)
		*made = (int)n;
	PQclear(res);
	return 0;
}

/* One call of the retire function: at most one partition. */
static int retire_one(struct store *s, const char *sql, const char *const *params, int64_t *rows,
                      int64_t *dropped)
{
	PGresult *res = NULL;
	int rc;

	rc = store_exec(s, sql, 2, params, PGRES_TUPLES_OK, &res,
	                "could not retire the done partitions");
	if (rc != 0)
		return rc;
	if (PQntuples(res) != 1 || store_parse_int64(PQgetvalue(res, 0, 0), rows) != 0 ||
	    store_parse_int64(PQgetvalue(res, 0, 1), dropped) != 0) {
		store_set_error(s, "the partitions' retirement answered something unreadable");
		rc = STORE_ERR_QUERY;
	}
	PQclear(res);
	return rc;
}

/* Each call drops at most one partition and holds the table's lock for that drop only; the
 * loop stops when a call drops none. */
int store_partitions_retire(struct store *s, int64_t older_than_ms, bool cursor, int64_t pos,
                            int64_t *rows, int64_t *dropped)
{
	char qschema[STORE_NAME_MAX], sql[3 * STORE_NAME_MAX], age[24], p[24];
	const char *params[2] = { age, cursor ? p : NULL };
	bool part;
	int rc;

	*rows = *dropped = 0;
	if ((rc = lookup(s, &part, qschema, sizeof(qschema))) != 0 || !part)
		return rc;
	snprintf(age, sizeof(age), "%lld", (long long)(older_than_ms > 0 ? older_than_ms : 0));
	snprintf(p, sizeof(p), "%lld", (long long)pos);
	if ((rc = store_format_sql(s, sql, sizeof(sql),
	                           "SELECT * FROM %s.%s_part_retire($1::bigint, $2::bigint)",
	                           qschema, identifier_base(s->table))) != 0)
		return rc;
	for (;;) {
		int64_t n = 0, d = 0;

		if ((rc = retire_one(s, sql, params, &n, &d)) != 0)
			return rc;
		if (d == 0)
			return 0;
		*rows += n;
		*dropped += d;
	}
}

int store_partitions_info(struct store *s, bool cursor, struct store_partitions *out)
{
	char qschema[STORE_NAME_MAX], sql[3 * STORE_NAME_MAX], max[16];
	const char *params[2] = { max, cursor ? "true" : "false" };
	struct store_partitions r = { .partitioned = false };
	PGresult *res = NULL;
	int rc;

	if ((rc = lookup(s, &r.partitioned, qschema, sizeof(qschema))) != 0)
		return rc;
	if (!r.partitioned) {
		*out = r;
		return 0;
	}
	snprintf(max, sizeof(max), "%d", s->opts.max_attempts);
	if ((rc = store_format_sql(s, sql, sizeof(sql),
	                           "SELECT * FROM %s.%s_part_status($1::int, $2::boolean)", qschema,
	                           identifier_base(s->table))) != 0)
		return rc;
	rc = store_exec(s, sql, 2, params, PGRES_TUPLES_OK, &res,
	                "could not read the table's partitions");
	if (rc != 0)
		return rc;
	if (PQntuples(res) != 1 || store_parse_int64(PQgetvalue(res, 0, 0), &r.partitions) != 0 ||
	    store_parse_int64(PQgetvalue(res, 0, 1), &r.default_rows) != 0 ||
	    store_parse_int64(PQgetvalue(res, 0, 2), &r.dead_partitions) != 0) {
		store_set_error(s, "the partitions' status answered something unreadable");
		rc = STORE_ERR_QUERY;
	} else {
		*out = r;
	}
	PQclear(res);
	return rc;
}

/* ---- converting a plain table ---- */

/* The swap's statements: the lock, CONVERT_SWAP, the parent's indexes (which attach the
 * renamed ones), the DEFAULT partition, the functions, the partitions ahead, the wake-up
 * trigger. One text: the server runs it as one transaction, all or nothing. */
static void add_swap(struct schema_sbuf *b, const char *qschema, const char *lbase,
                     const char *base, const char *tq, int64_t bound, int64_t rows)
{
	char n[24];
	const char *vals[6] = { qschema, lbase, tq, "", "", n };

	snprintf(n, sizeof(n), "%lld", (long long)bound);
	schema_sbuf_add(b, "SET lock_timeout = '5s';\nLOCK TABLE %s IN ACCESS EXCLUSIVE MODE;\n",
	                tq);
	add_template(b, CONVERT_SWAP ";\n", vals);
	for (size_t i = 0; i < SCHEMA_N_INDEXES; i++)
		schema_sbuf_add(b, "CREATE INDEX %s%s ON %s %s;\n", base, schema_indexes[i].suffix,
		                tq, schema_indexes[i].def);
	partitions_add_default(b, qschema, base, tq);
	schema_sbuf_add(b, ";\n");
	partitions_add_functions(b, qschema, lbase, tq, (long long)rows);
	schema_sbuf_add(b, ";\nSELECT %s.%s_part_ahead();\n", qschema, base);
	schema_add_trigger_ddl(b, qschema, base, tq);
}

/* Runs sql (several statements, one implicit transaction, the last one a command); on failure
 * the error says what. */
static int convert_step(struct store *s, const char *sql, const char *what)
{
	char prefix[STORE_NAME_MAX + 96];

	snprintf(prefix, sizeof(prefix), "could not convert table '%s' (%s)", s->table, what);
	return store_exec(s, sql, 0, NULL, PGRES_COMMAND_OK, NULL, prefix);
}

/* The sequence's last value (0 before the first). */
static int last_seq(struct store *s, int64_t *last)
{
	const char *params[1] = { s->table };
	PGresult *res = NULL;
	int rc;

	rc = store_exec(s,
	                "SELECT COALESCE(pg_sequence_last_value(pg_get_serial_sequence($1, 'seq')"
	                "::regclass), 0)",
	                1, params, PGRES_TUPLES_OK, &res, "could not read the seq sequence");
	if (rc == 0 && store_parse_int64(PQgetvalue(res, 0, 0), last) != 0) {
		store_set_error(s, "the seq sequence's value is unreadable");
		rc = STORE_ERR_QUERY;
	}
	PQclear(res);
	return rc;
}

/* The bound of the first partition lies this many partitions above the sequence: producers
 * keep inserting while the CHECK is validated, and an insert at or past the bound would fail. */
#define CONVERT_MARGIN_PARTITIONS 10

/* After a failed step: the CHECK would fail producers' inserts once the sequence reached the
 * bound, so it goes again. The first error is the one reported. */
static void convert_undo(struct store *s, const char *tq, const char *lbase)
{
	char sql[3 * STORE_NAME_MAX], keep[STORE_ERRMSG_MAX];
	int undo;

	if (!store_connected(s))
		return;
	snprintf(keep, sizeof(keep), "%s", store_errmsg(s));
	snprintf(sql, sizeof(sql), "ALTER TABLE %s DROP CONSTRAINT IF EXISTS %s_seq_below", tq,
	         lbase);
	undo = store_exec(s, sql, 0, NULL, PGRES_COMMAND_OK, NULL, "could not undo");
	store_set_error(s, "%s%s", keep,
	                undo != 0 ? " (and its CHECK is still there: run migrate again, which "
	                            "replaces it, or drop it)"
	                          : "");
}

int partitions_convert(struct store *s, const char *qschema, const char *lbase, const char *base,
                       int64_t rows)
{
	char tq[2 * STORE_NAME_MAX], sql[4 * STORE_NAME_MAX];
	struct schema_sbuf b = { 0 };
	int64_t last = 0, bound;
	int rc;

	snprintf(tq, sizeof(tq), "%s.%s", qschema, base);
	if ((rc = last_seq(s, &last)) != 0)
		return rc;
	bound = last + CONVERT_MARGIN_PARTITIONS * rows;
	/* ADD CONSTRAINT takes ACCESS EXCLUSIVE for a moment; NOT VALID reads no row. */
	snprintf(sql, sizeof(sql),
	         "SET lock_timeout = '5s'; ALTER TABLE %s DROP CONSTRAINT IF EXISTS %s_seq_below,"
	         " ADD CONSTRAINT %s_seq_below CHECK (seq < %lld) NOT VALID",
	         tq, lbase, lbase, (long long)bound);
	rc = convert_step(s, sql, "the bound's CHECK; nothing was changed");
	if (rc == 0) {
		/* SHARE UPDATE EXCLUSIVE while it reads the table: producers keep inserting. */
		snprintf(
		        sql, sizeof(sql),
		        "SET lock_timeout = '60s'; ALTER TABLE %s VALIDATE CONSTRAINT %s_seq_below",
		        tq, lbase);
		rc = convert_step(s, sql, "validating the bound; nothing was changed");
		add_swap(&b, qschema, lbase, base, tq, bound, rows);
		if (rc == 0 && b.failed) {
			store_set_error(s, "out of memory");
			rc = STORE_ERR_NOMEM;
		}
		if (rc == 0)
			rc = convert_step(s, b.p, "the swap; nothing was changed");
		if (rc != 0)
			convert_undo(s, tq, lbase);
	}
	free(b.p);
	if (store_connected(s) &&
	    store_exec(s, "RESET lock_timeout", 0, NULL, PGRES_COMMAND_OK, NULL, "reset") != 0 &&
	    rc == 0)
		rc = STORE_ERR_QUERY;
	return rc;
}
