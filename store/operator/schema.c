/* The outbox DDL (DESIGN §1 plus the claim and purge indexes and the wake-up objects): the
 * table as this version wants it, and the idempotent script `outbox-relay schema` prints for
 * people who apply it by hand (migrate.c changes only what the catalog shows differs). */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store.h"
#include "store/source/lease.h"
#include "store/operator/schema.h"
#include "store/operator/schema_private.h"
#include "store/store_private.h"

void store_split_table(const char *table, char *schema, size_t schema_len, char *base,
                       size_t base_len)
{
	const char *dot = strchr(table, '.');

	if (dot) {
		snprintf(schema, schema_len, "%.*s", (int)(dot - table), table);
		snprintf(base, base_len, "%s", dot + 1);
	} else {
		snprintf(schema, schema_len, "%s", "");
		snprintf(base, base_len, "%s", table);
	}
}

#define SBUF_MAX (64 * 1024)

void schema_sbuf_add(struct schema_sbuf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (b->failed)
		return;
	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
		va_end(ap);
		if (n < 0) {
			b->failed = true;
			return;
		}
		if (b->p && b->len + (size_t)n < b->cap) {
			b->len += (size_t)n;
			return;
		}
		size_t want = b->cap ? b->cap * 2 : 4096;
		while (want <= b->len + (size_t)n)
			want *= 2;
		if (want > SBUF_MAX) {
			b->failed = true;
			return;
		}
		char *np = realloc(b->p, want);
		if (!np) {
			b->failed = true;
			return;
		}
		b->p = np;
		b->cap = want;
	}
}

/* ---- what the table should look like ---- */

#define TSTZ "timestamp with time zone"

/* The columns of DESIGN §1, in order (what each field means: schema_private.h). */
const struct schema_column schema_columns[] = {
	{ "seq", "BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,   -- insertion order", "bigint",
	  "BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE", NULL },
	{ "id", "VARCHAR(64)  NOT NULL PRIMARY KEY,", "text", NULL, NULL },
	{ "exchange_name", "VARCHAR(255) NOT NULL,", "text", NULL, NULL },
	{ "routing_key", "VARCHAR(255) NOT NULL,", "text", NULL, NULL },
	{ "body", "TEXT         NOT NULL,", "text", NULL, NULL },
	{ "body_encoding", "VARCHAR(16)  NOT NULL DEFAULT 'utf-8',", "text",
	  "VARCHAR(16) NOT NULL DEFAULT 'utf-8'", "'utf-8'" },
	{ "content_type", "VARCHAR(255) NOT NULL DEFAULT 'application/json',", "text",
	  "VARCHAR(255) NOT NULL DEFAULT 'application/json'", "'application/json'" },
	{ "headers", "TEXT         NOT NULL DEFAULT '{}',", "text", "TEXT NOT NULL DEFAULT '{}'",
	  "'{}'" },
	{ "properties", "TEXT         NOT NULL DEFAULT '{}',", "text", "TEXT NOT NULL DEFAULT '{}'",
	  "'{}'" },
	{ "ordering_key", "VARCHAR(255),", "text", "VARCHAR(255)", NULL },
	{ "txid", "XID8         NOT NULL DEFAULT pg_current_xact_id(),", "xid8",
	  "XID8 NOT NULL DEFAULT pg_current_xact_id()", "pg_current_xact_id()" },
	{ "created_at", "TIMESTAMPTZ  NOT NULL DEFAULT now(),", TSTZ,
	  "TIMESTAMPTZ NOT NULL DEFAULT now()", "now()" },
	{ "available_at", "TIMESTAMPTZ  NOT NULL DEFAULT now(),", TSTZ,
	  "TIMESTAMPTZ NOT NULL DEFAULT now()", "now()" },
	{ "published_at", "TIMESTAMPTZ,", TSTZ, "TIMESTAMPTZ", NULL },
	{ "attempts", "INTEGER      NOT NULL DEFAULT 0,", "integer", "INTEGER NOT NULL DEFAULT 0",
	  "0" },
	{ "last_error", "VARCHAR(1000),", "text", "VARCHAR(1000)", NULL },
	{ "locked_by", "VARCHAR(64),", "text", "VARCHAR(64)", NULL },
	{ "locked_until", "TIMESTAMPTZ,", TSTZ, "TIMESTAMPTZ", NULL },
	/* Set when the cursor source passed the row without publishing it (docs/design.md). */
	{ "deferred_at", "TIMESTAMPTZ", TSTZ, "TIMESTAMPTZ", NULL },
};
_Static_assert(sizeof(schema_columns) / sizeof(schema_columns[0]) == SCHEMA_N_COLUMNS,
               "SCHEMA_N_COLUMNS");

/* The relay's indexes: def follows "ON <table> "; catalog is what pg_get_indexdef() shows
 * after " USING ", which migrate compares to decide whether the index is current.
 *  - unkeyed: unpublished rows without an ordering key, in seq order; the claim walks it from
 *    its floor and stops after `batch`.
 *  - key: unpublished keyed rows by key, then seq. The claim goes through it key by key (one
 *    descent per key to find the next key, one to find its head), so it never reads the rows
 *    queued behind a head; the blocked-key queries read it the same way.
 *    Each unpublished row is in exactly one of the two, so status, dead, requeue --all-dead and
 *    release read both (STORE_UNPUBLISHED) and cost O(unpublished).
 *  - published: the purge walks published rows oldest first and stops at the retention
 *    cut-off, instead of walking the seq index through every row kept for the retention
 *    (days of rows, on every purge). Its cost: each mark inserts one more index entry (a mark
 *    is never a HOT update anyway: published_at is in the other two indexes' predicates), at
 *    the right edge, since published_at grows. Without retention (rows deleted at once) it
 *    stays empty.
 *  - deferred: the cursor source's exceptions (rows it passed without publishing, still
 *    unpublished) by key, then seq: its exception path and the operator commands on a table
 *    it runs read them here. Rows the cursor publishes never enter it, so it stays small. */
const struct schema_index schema_indexes[] = {
	{ "_unkeyed_idx", "(seq)\n  WHERE published_at IS NULL AND ordering_key IS NULL",
	  "btree (seq) WHERE ((published_at IS NULL) AND (ordering_key IS NULL))" },
	{ "_key_idx",
	  "(ordering_key, seq)\n  WHERE published_at IS NULL AND ordering_key IS NOT NULL",
	  "btree (ordering_key, seq) WHERE ((published_at IS NULL) AND (ordering_key IS NOT "
	  "NULL))" },
	{ "_published_idx", "(published_at)\n  WHERE published_at IS NOT NULL",
	  "btree (published_at) WHERE (published_at IS NOT NULL)" },
	{ "_deferred_idx",
	  "(ordering_key, seq)\n  WHERE deferred_at IS NOT NULL AND published_at IS NULL",
	  "btree (ordering_key, seq) WHERE ((deferred_at IS NOT NULL) AND (published_at IS "
	  "NULL))" },
};
_Static_assert(sizeof(schema_indexes) / sizeof(schema_indexes[0]) == SCHEMA_N_INDEXES,
               "SCHEMA_N_INDEXES");

/* Indexes of earlier versions that migrate drops once the current ones are built. The pending
 * index (seq, every unpublished row) made a keyed backlog cost every claim a walk of it. */
const char *const schema_retired_indexes[] = { "_pending_idx" };
_Static_assert(sizeof(schema_retired_indexes) / sizeof(schema_retired_indexes[0]) ==
                       SCHEMA_N_RETIRED,
               "SCHEMA_N_RETIRED");

/* The wake-up. pg_notify serialises committing transactions cluster-wide, so producers notify
 * only while a relay waits for work. A relay about to sleep takes a session advisory lock,
 * (STORE_WAKEUP_LOCK_CLASS, the table's OID), and holds it while it sleeps. Every INSERT
 * statement into the table runs a statement-level trigger whose function tests the lock on its
 * way (take it shared, let it go at once) and notifies only when that fails, that is while a
 * relay holds it. So producers pay one PL/pgSQL call and two lock-table operations per INSERT
 * statement, and no notification while relays are busy (always, under load). Because it is a
 * lock, it ends with the relay's session: nothing to expire.
 * The test is in the function, not in the trigger's WHEN: PostgreSQL reads and prepares a WHEN
 * anew for every statement, while PL/pgSQL keeps the function's expressions prepared for the
 * session. Measured in one session, 500 single-row INSERT statements at a time interleaved
 * over tables with each trigger and one without (as bench/run's trigger_us), seven runs: the
 * test in the WHEN added 3.8-6.6 us per statement, in the function 2.0-4.5 us, 0.52-0.68 of
 * the WHEN's run by run; a WHEN of false (the trigger's machinery alone) 0.4-1.6 us. The
 * function takes the lock's key from TG_RELID, so a dump and restore, which gives the table a
 * new OID, keeps it right.
 * The test and the release are one expression, an IF's condition, not a PERFORM: PL/pgSQL
 * evaluates a plain expression itself, while a PERFORM runs a query through the executor. CASE,
 * not AND, because CASE alone fixes the order in which its parts run. In one session, as
 * above, twelve runs: the function with the release in a PERFORM added 2.7-4.1 us per
 * statement, this one 0.6-2.9 us (0.17-0.70 of it run by run), about what a function that only
 * returns adds (1.7-2.3 us in six of those runs): the test itself is now within the noise.
 * The function runs inside producers' transactions, under whatever search_path they have, and
 * an unqualified name would fail their COMMIT (a path without the object's schema) or
 * resolve to an object of their choosing (a path with another schema first). So it names every
 * function and type with its schema. It does not pin its search_path (SET search_path on the
 * function): that costs every call a configuration change, 1.7-4.7 us more in those runs.
 * The test runs before the producer commits: a relay that takes the lock between the two gets
 * no notification for that transaction. So after arming the relay waits until every
 * transaction holding a seq then has ended (the ordering watermark settles), and claims once
 * more (store_arm() in store/source/lease.h). Should a relay's host vanish while it holds the lock,
 * producers notify until the server drops the session: the relay's session asks for TCP
 * keepalives (store/connection.c). */

/* The body of the wake-up function (what pg_proc.prosrc holds). */
void schema_add_notify_body(struct schema_sbuf *b, const char *channel)
{
	if (!channel[0]) {
		schema_sbuf_add(b, "\nBEGIN\n"
		                   "  RETURN NULL; -- no channel configured: relays poll\n"
		                   "END\n");
		return;
	}
	schema_sbuf_add(
	        b,
	        "\nBEGIN\n"
	        "  -- a relay that waits for rows holds this lock; taken shared, it is refused\n"
	        "  -- (one expression: PL/pgSQL evaluates it without the executor)\n"
	        "  IF (CASE WHEN pg_catalog.pg_try_advisory_lock_shared(" STORE_WAKEUP_LOCK_CLASS
	        ", TG_RELID::pg_catalog.int4)\n"
	        "           THEN pg_catalog.pg_advisory_unlock_shared(" STORE_WAKEUP_LOCK_CLASS
	        ", TG_RELID::pg_catalog.int4) END) THEN\n"
	        "    RETURN NULL;\n"
	        "  END IF;\n"
	        "  PERFORM pg_catalog.pg_notify('%s', '');\n"
	        "  RETURN NULL;\n"
	        "END\n",
	        channel);
}

/* The wake-up function and trigger, created in schema qschema (quoted) on the table tq. The
 * schema script passes "%1$I" for the schema, which format() fills in when the script runs. */
void schema_add_function_ddl(struct schema_sbuf *b, const char *qschema, const char *base,
                             const char *channel)
{
	schema_sbuf_add(b,
	                "CREATE OR REPLACE FUNCTION %s.%s_wakeup_notify() RETURNS trigger\n"
	                "LANGUAGE plpgsql\nAS $fn$",
	                qschema, base);
	schema_add_notify_body(b, channel);
	schema_sbuf_add(b, "$fn$");
}

void schema_add_trigger_ddl(struct schema_sbuf *b, const char *qschema, const char *base,
                            const char *tq)
{
	schema_sbuf_add(b,
	                "CREATE TRIGGER %s_wakeup AFTER INSERT ON %s\n"
	                "  FOR EACH STATEMENT EXECUTE FUNCTION %s.%s_wakeup_notify()",
	                base, tq, qschema, base);
}

/* The names this schema derives from the table name; false when the name is refused. */
bool schema_names_make(struct schema_names *nm, const char *table)
{
	if (!identifier_valid(table))
		return false;
	store_split_table(table, nm->schema, sizeof(nm->schema), nm->base, sizeof(nm->base));
	if (strlen(nm->base) > IDENTIFIER_TABLE_BASE_MAX)
		return false;
	if (snprintf(nm->t, sizeof(nm->t), "%s", table) >= (int)sizeof(nm->t) ||
	    snprintf(nm->prefix, sizeof(nm->prefix), "%s%s", nm->schema,
	             nm->schema[0] ? "." : "") >= (int)sizeof(nm->prefix))
		return false;
	/* Unquoted names fold to lower case (identifiers are ASCII here). */
	for (size_t i = 0; i <= strlen(nm->base); i++)
		nm->lbase[i] = (char)tolower((unsigned char)nm->base[i]);
	for (size_t i = 0; i <= strlen(nm->schema); i++)
		nm->lschema[i] = (char)tolower((unsigned char)nm->schema[i]);
	return true;
}

void schema_add_create_table(struct schema_sbuf *b, const char *if_not_exists, const char *table)
{
	schema_sbuf_add(b, "CREATE TABLE %s%s (\n", if_not_exists, table);
	for (size_t i = 0; i < SCHEMA_N_COLUMNS; i++)
		schema_sbuf_add(b, "  %-13s %s\n", schema_columns[i].name, schema_columns[i].decl);
	schema_sbuf_add(b, ") WITH (fillfactor = " SCHEMA_FILLFACTOR ")");
}

/* The cursor source's position (docs/design.md, "Row sources: lease and cursor"): one row per stream
 * (stream 'main'); every row with seq <= position has been published or deferred. Written with
 * compare-and-set by the one relay that leads the table; moved_at says when it last moved. */
void schema_add_create_position(struct schema_sbuf *b, const char *if_not_exists, const char *table)
{
	schema_sbuf_add(b,
	                "CREATE TABLE %s%s" SCHEMA_POSITION_SUFFIX " (\n"
	                "  stream        TEXT         PRIMARY KEY,\n"
	                "  position      BIGINT       NOT NULL,\n"
	                "  leader        TEXT,\n"
	                "  moved_at      TIMESTAMPTZ  NOT NULL DEFAULT now()\n"
	                ")",
	                if_not_exists, table);
}

/* The upgrade of an older table (AceMQ SQLOutboxStore), which lacks some columns: existing
 * rows get a seq in their physical order and become claimable at once. The indexes need the
 * columns, so the script runs this before them. */
static void add_upgrade_script(struct schema_sbuf *b, const char *t)
{
	schema_sbuf_add(b, "-- upgrade an older table in place\nALTER TABLE %s", t);
	for (size_t i = 0, k = 0; i < SCHEMA_N_COLUMNS; i++)
		if (schema_columns[i].add)
			schema_sbuf_add(b, "%s\n  ADD COLUMN IF NOT EXISTS %s %s", k++ ? "," : "",
			                schema_columns[i].name, schema_columns[i].add);
	schema_sbuf_add(b,
	                ";\n"
	                "-- room on each page so that lease updates (unindexed columns) stay HOT\n"
	                "ALTER TABLE %s SET (fillfactor = " SCHEMA_FILLFACTOR ");\n\n",
	                t);
	/* See store_check_sequence(). */
	schema_sbuf_add(
	        b,
	        "-- seq values handed out one at a time (no CACHE): the relay's ordering "
	        "watermark\n"
	        "-- takes the sequence's last value as the highest seq any session holds\n"
	        "DO $do$\n"
	        "DECLARE\n"
	        "  q text := pg_get_serial_sequence('%s', 'seq');\n"
	        "BEGIN\n"
	        "  IF (SELECT seqcache FROM pg_sequence WHERE seqrelid = q::regclass) > 1 THEN\n"
	        "    EXECUTE format('ALTER SEQUENCE %%s CACHE 1', q);\n"
	        "  END IF;\n"
	        "END\n"
	        "$do$;\n\n",
	        t);
}

/* The wake-up function and trigger as a DO block: the function is created in the schema the
 * outbox table lives in, found when the script runs (the name may be unqualified). A trigger
 * of an earlier version (a deferred constraint trigger, or one that tests the lock in its
 * WHEN) is replaced. */
static void add_wakeup_script(struct schema_sbuf *b, const struct schema_names *nm,
                              const char *channel)
{
	const char *t = nm->t, *n = nm->base;
	char script_tq[STORE_NAME_MAX + 8]; /* the table as the DO block's format() names it */

	snprintf(script_tq, sizeof(script_tq), "%%1$I.%s", n);
	schema_sbuf_add(
	        b,
	        "-- wake-up: producers notify only while a relay waits (it holds an advisory "
	        "lock);\n"
	        "-- the trigger function names every object with its schema, so producers' own\n"
	        "-- search_path neither breaks nor redirects it\n"
	        "DO $do$\n"
	        "DECLARE\n"
	        "  s text := (SELECT n.nspname FROM pg_class c\n"
	        "             JOIN pg_namespace n ON n.oid = c.relnamespace\n"
	        "             WHERE c.oid = '%s'::regclass);\n"
	        "BEGIN\n"
	        "  EXECUTE format($f$",
	        t);
	schema_add_function_ddl(b, "%1$I", n, channel);
	schema_sbuf_add(
	        b,
	        "$f$, s);\n"
	        "  IF EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = '%s'::regclass\n"
	        "             AND tgname = '%s_wakeup' AND (tgtype <> " STORE_WAKEUP_TGTYPE
	        "\n             OR tgqual IS NOT NULL)) THEN\n"
	        "    EXECUTE format($f$DROP TRIGGER %s_wakeup ON %%1$I.%s$f$, s);\n"
	        "  END IF;\n"
	        "  IF NOT EXISTS (SELECT 1 FROM pg_trigger\n"
	        "                 WHERE tgrelid = '%s'::regclass AND tgname = '%s_wakeup') THEN\n"
	        "    EXECUTE format($f$",
	        t, nm->lbase, n, n, t, nm->lbase);
	schema_add_trigger_ddl(b, "%1$I", n, script_tq);
	schema_sbuf_add(b, "$f$, s);\n"
	                   "  END IF;\n"
	                   "END\n"
	                   "$do$;\n");
}

/* Ownership: returns a new string (caller frees); table and channel borrowed. NULL when
 * out of memory or when table/channel is not a valid identifier (we never build SQL from
 * anything else). */
char *store_schema_sql(const char *table, const char *channel)
{
	struct schema_names nm;
	struct schema_sbuf b = { 0 };
	const char *t, *p, *n;

	if (!schema_names_make(&nm, table) || !channel ||
	    (channel[0] && !identifier_plain_valid(channel)))
		return NULL;
	t = nm.t;
	p = nm.prefix;
	n = nm.base;

	schema_sbuf_add(
	        &b,
	        "-- outbox-relay schema for %s (idempotent: safe to apply again)\n"
	        "-- For applying by hand: it takes strong locks on the table even when nothing\n"
	        "-- changes. `outbox-relay migrate` reads the catalog and changes only what "
	        "differs.\n",
	        t);
	schema_add_create_table(&b, "IF NOT EXISTS ", t);
	schema_sbuf_add(&b, ";\n\n");
	add_upgrade_script(&b, t);

	for (size_t i = 0; i < SCHEMA_N_INDEXES; i++)
		schema_sbuf_add(&b, "CREATE INDEX IF NOT EXISTS %s%s ON %s %s;\n", n,
		                schema_indexes[i].suffix, t, schema_indexes[i].def);
	schema_sbuf_add(&b, "-- indexes of earlier versions\n");
	for (size_t i = 0; i < SCHEMA_N_RETIRED; i++)
		schema_sbuf_add(&b, "DROP INDEX IF EXISTS %s%s%s;\n", p, n,
		                schema_retired_indexes[i]);
	schema_sbuf_add(&b, "\n-- the cursor source's position (relay.source = cursor)\n");
	schema_add_create_position(&b, "IF NOT EXISTS ", t);
	schema_sbuf_add(&b, ";\n\n");

	add_wakeup_script(&b, &nm, channel);

	if (b.failed) {
		free(b.p);
		return NULL;
	}
	return b.p;
}
