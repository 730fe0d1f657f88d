/* The outbox DDL (DESIGN §1 plus the claim and purge indexes and the wake-up objects): the
 * idempotent script `outbox-relay schema` prints for people who apply it by hand, and `migrate`,
 * which reads the catalog first and changes only what is missing or different. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/outbox_store.h"
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

/* A bounded growable string for building the DDL. */
struct sbuf {
	char *p;
	size_t len, cap;
	bool failed;
};

#define SBUF_MAX (64 * 1024)

static void sbuf_add(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void sbuf_add(struct sbuf *b, const char *fmt, ...)
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

/* The columns of DESIGN §1, in order. family is the type as migrate compares it (any string
 * type counts as "text": a wider VARCHAR chosen by an operator is not refused); add is what an
 * older table gets (NULL: every outbox table has the column, an AceMQ one included); def is
 * the default producers rely on (they insert without the column). */
struct column {
	const char *name;
	const char *decl; /* in CREATE TABLE */
	const char *family;
	const char *add;
	const char *def;
};

#define TSTZ "timestamp with time zone"

static const struct column columns[] = {
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
	{ "locked_until", "TIMESTAMPTZ", TSTZ, "TIMESTAMPTZ", NULL },
};
#define N_COLUMNS (sizeof(columns) / sizeof(columns[0]))

/* Half of each page is left free. A claim and then a mark rewrite every row of a batch, page by
 * page, in one transaction each: with room on the row's own page for the new version,
 * PostgreSQL logs it compactly (and a lease update, which touches no indexed column, stays
 * HOT). At 80 % most new versions went to other pages. Measured with bench/run --only relay,
 * three alternating pairs: WAL per relayed message 1,952-1,957 B at 80 against 511-529 B at
 * 50, PostgreSQL's CPU per message 68-75 us against 43-47 us, 11,864-12,800 against
 * 15,026-16,724 msgs/s. The price: retained published rows take about twice the space. */
#define FILLFACTOR "50"

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
 *    stays empty. */
struct index {
	const char *suffix;
	const char *def;
	const char *catalog;
};

static const struct index indexes[] = {
	{ "_unkeyed_idx", "(seq)\n  WHERE published_at IS NULL AND ordering_key IS NULL",
	  "btree (seq) WHERE ((published_at IS NULL) AND (ordering_key IS NULL))" },
	{ "_key_idx",
	  "(ordering_key, seq)\n  WHERE published_at IS NULL AND ordering_key IS NOT NULL",
	  "btree (ordering_key, seq) WHERE ((published_at IS NULL) AND (ordering_key IS NOT "
	  "NULL))" },
	{ "_published_idx", "(published_at)\n  WHERE published_at IS NOT NULL",
	  "btree (published_at) WHERE (published_at IS NOT NULL)" },
};
#define N_INDEXES (sizeof(indexes) / sizeof(indexes[0]))

/* Indexes of earlier versions that migrate drops once the current ones are built. The pending
 * index (seq, every unpublished row) made a keyed backlog cost every claim a walk of it. */
static const char *const retired_indexes[] = { "_pending_idx" };
#define N_RETIRED (sizeof(retired_indexes) / sizeof(retired_indexes[0]))

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
 * more (store_arm() in outbox_store.h). Should a relay's host vanish while it holds the lock,
 * producers notify until the server drops the session: the relay's session asks for TCP
 * keepalives (store/connection.c). */

/* The body of the wake-up function (what pg_proc.prosrc holds). */
static void add_notify_body(struct sbuf *b, const char *channel)
{
	if (!channel[0]) {
		sbuf_add(b, "\nBEGIN\n"
		            "  RETURN NULL; -- no channel configured: relays poll\n"
		            "END\n");
		return;
	}
	sbuf_add(b,
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
static void add_function_ddl(struct sbuf *b, const char *qschema, const char *base,
                             const char *channel)
{
	sbuf_add(b,
	         "CREATE OR REPLACE FUNCTION %s.%s_wakeup_notify() RETURNS trigger\n"
	         "LANGUAGE plpgsql\nAS $fn$",
	         qschema, base);
	add_notify_body(b, channel);
	sbuf_add(b, "$fn$");
}

static void add_trigger_ddl(struct sbuf *b, const char *qschema, const char *base, const char *tq)
{
	sbuf_add(b,
	         "CREATE TRIGGER %s_wakeup AFTER INSERT ON %s\n"
	         "  FOR EACH STATEMENT EXECUTE FUNCTION %s.%s_wakeup_notify()",
	         base, tq, qschema, base);
}

/* The names this schema derives from the table name; false when the name is refused. */
struct names {
	char t[STORE_NAME_MAX];      /* the table, as given */
	char prefix[STORE_NAME_MAX]; /* "schema." or "" */
	char schema[STORE_NAME_MAX]; /* as given, "" when none */
	char base[STORE_NAME_MAX];
	char lbase[STORE_NAME_MAX]; /* folded to lower case, as the catalog stores it */
	char lschema[STORE_NAME_MAX];
};

static bool names_make(struct names *nm, const char *table)
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

static void add_create_table(struct sbuf *b, const char *if_not_exists, const char *table)
{
	sbuf_add(b, "CREATE TABLE %s%s (\n", if_not_exists, table);
	for (size_t i = 0; i < N_COLUMNS; i++)
		sbuf_add(b, "  %-13s %s\n", columns[i].name, columns[i].decl);
	sbuf_add(b, ") WITH (fillfactor = " FILLFACTOR ")");
}

/* The upgrade of an older table (AceMQ SQLOutboxStore), which lacks some columns: existing
 * rows get a seq in their physical order and become claimable at once. The indexes need the
 * columns, so the script runs this before them. */
static void add_upgrade_script(struct sbuf *b, const char *t)
{
	sbuf_add(b, "-- upgrade an older table in place\nALTER TABLE %s", t);
	for (size_t i = 0, k = 0; i < N_COLUMNS; i++)
		if (columns[i].add)
			sbuf_add(b, "%s\n  ADD COLUMN IF NOT EXISTS %s %s", k++ ? "," : "",
			         columns[i].name, columns[i].add);
	sbuf_add(b,
	         ";\n"
	         "-- room on each page so that lease updates (unindexed columns) stay HOT\n"
	         "ALTER TABLE %s SET (fillfactor = " FILLFACTOR ");\n\n",
	         t);
	/* See store_check_sequence(). */
	sbuf_add(b,
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
static void add_wakeup_script(struct sbuf *b, const struct names *nm, const char *channel)
{
	const char *t = nm->t, *n = nm->base;
	char script_tq[STORE_NAME_MAX + 8]; /* the table as the DO block's format() names it */

	snprintf(script_tq, sizeof(script_tq), "%%1$I.%s", n);
	sbuf_add(b,
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
	add_function_ddl(b, "%1$I", n, channel);
	sbuf_add(b,
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
	add_trigger_ddl(b, "%1$I", n, script_tq);
	sbuf_add(b, "$f$, s);\n"
	            "  END IF;\n"
	            "END\n"
	            "$do$;\n");
}

/* Ownership: returns a new string (caller frees); table and channel borrowed. NULL when
 * out of memory or when table/channel is not a valid identifier (we never build SQL from
 * anything else). */
char *store_schema_sql(const char *table, const char *channel)
{
	struct names nm;
	struct sbuf b = { 0 };
	const char *t, *p, *n;

	if (!names_make(&nm, table) || !channel || (channel[0] && !identifier_plain_valid(channel)))
		return NULL;
	t = nm.t;
	p = nm.prefix;
	n = nm.base;

	sbuf_add(&b,
	         "-- outbox-relay schema for %s (idempotent: safe to apply again)\n"
	         "-- For applying by hand: it takes strong locks on the table even when nothing\n"
	         "-- changes. `outbox-relay migrate` reads the catalog and changes only what "
	         "differs.\n",
	         t);
	add_create_table(&b, "IF NOT EXISTS ", t);
	sbuf_add(&b, ";\n\n");
	add_upgrade_script(&b, t);

	for (size_t i = 0; i < N_INDEXES; i++)
		sbuf_add(&b, "CREATE INDEX IF NOT EXISTS %s%s ON %s %s;\n", n, indexes[i].suffix, t,
		         indexes[i].def);
	sbuf_add(&b, "-- indexes of earlier versions\n");
	for (size_t i = 0; i < N_RETIRED; i++)
		sbuf_add(&b, "DROP INDEX IF EXISTS %s%s%s;\n", p, n, retired_indexes[i]);
	sbuf_add(&b, "\n");

	add_wakeup_script(&b, &nm, channel);

	if (b.failed) {
		free(b.p);
		return NULL;
	}
	return b.p;
}

/* ---- migrate ---- */

/* How long migrate waits for any one lock. Short, because while it waits every producer's
 * INSERT queues behind it; long enough for the relay's own statements to finish. */
#define LOCK_TIMEOUT_S "5"

/* What the catalog says about the table and its objects. */
enum state { MISSING = 0, CURRENT, DIFFERENT };

struct found {
	bool table;                   /* the table exists */
	char schema[STORE_NAME_MAX];  /* where it is (or will be created), as in the catalog */
	char qschema[STORE_NAME_MAX]; /* the same, quoted for SQL text */
	bool fillfactor;              /* its storage parameters are current */
	bool have[N_COLUMNS], has_default[N_COLUMNS];
	char family[N_COLUMNS][40];
	enum state index[N_INDEXES];
	bool retired[N_RETIRED]; /* a retired index is still there */
	enum state function, trigger;
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
};

static void plan_add(struct plan *pl, const char *what, const struct sbuf *b)
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
static int locate_table(struct store *s, const struct names *nm, struct found *f)
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
static void note_index(const struct names *nm, struct found *f, const char *name, const char *a,
                       const char *b)
{
	for (size_t i = 0; i < N_INDEXES; i++) {
		char want[STORE_NAME_MAX];

		snprintf(want, sizeof(want), "%s%s", nm->lbase, indexes[i].suffix);
		if (strcmp(name, want) != 0)
			continue;
		f->index[i] = strcmp(a, indexes[i].catalog) == 0 && strcmp(b, "true") == 0
		                      ? CURRENT
		                      : DIFFERENT;
	}
	for (size_t i = 0; i < N_RETIRED; i++) {
		char old[2 * STORE_NAME_MAX];

		snprintf(old, sizeof(old), "%s%s", nm->lbase, retired_indexes[i]);
		if (strcmp(name, old) == 0)
			f->retired[i] = true;
	}
}

/* The wake-up function is current when its body is the one this version writes for the
 * configured channel, and it pins no settings. */
static int note_function(struct store *s, struct found *f, const char *a, const char *b)
{
	struct sbuf body = { 0 };
	const char *ch = s->opts.channel ? s->opts.channel : "";

	add_notify_body(&body, ch);
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
static int note_fact(struct store *s, const struct names *nm, struct found *f, const PGresult *res,
                     int r)
{
	const char *kind = PQgetvalue(res, r, 0), *name = PQgetvalue(res, r, 1);
	const char *a = PQgetvalue(res, r, 2), *b = PQgetvalue(res, r, 3);

	switch (kind[0]) {
	case 't':
		f->fillfactor = strstr(a, "fillfactor=" FILLFACTOR) != NULL;
		break;
	case 'c':
		for (size_t i = 0; i < N_COLUMNS; i++) {
			if (strcmp(name, columns[i].name) != 0)
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
 * statement trigger with its WHEN). */
static int read_objects(struct store *s, const struct names *nm, struct found *f)
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
	        " WHERE tg.tgname = $2 || '_wakeup'",
	        2, pb, PGRES_TUPLES_OK, &res, "could not read the catalog");
	for (int r = 0; rc == 0 && r < PQntuples(res); r++)
		rc = note_fact(s, nm, f, res, r);
	PQclear(res);
	return rc;
}

/* Where the table is and what it has. Reads the catalog only: no lock on the table, so an
 * up-to-date table is checked without queueing behind (or in front of) anyone. */
static int inspect(struct store *s, const struct names *nm, struct found *f)
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
	struct sbuf b = { 0 };

	add_create_table(&b, "", tq);
	plan_add(pl, "create the table", &b);
	for (size_t i = 0; i < N_INDEXES; i++) {
		memset(&b, 0, sizeof(b));
		sbuf_add(&b, "CREATE INDEX %s%s ON %s %s", base, indexes[i].suffix, tq,
		         indexes[i].def);
		plan_add(pl, "create an index", &b);
	}
}

/* The columns and defaults an existing table lacks, in one ALTER TABLE; a column it must have
 * but cannot be given, or one of the wrong type, is refused before anything is changed. */
static int plan_columns(struct store *s, const struct names *nm, const struct found *f,
                        const char *tq, struct plan *pl)
{
	struct sbuf b = { 0 };
	bool any = false;

	for (size_t i = 0; i < N_COLUMNS; i++) {
		const struct column *c = &columns[i];

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
			sbuf_add(&b, "%s ADD COLUMN %s %s", any ? "," : "", c->name, c->add);
		else if (c->def && !f->has_default[i])
			sbuf_add(&b, "%s ALTER COLUMN %s SET DEFAULT %s", any ? "," : "", c->name,
			         c->def);
		else
			continue;
		any = true;
	}
	if (any) {
		/* ACCESS EXCLUSIVE, and a rewrite for seq and txid: an upgrade, once. */
		struct sbuf a = { 0 };

		sbuf_add(&a, "ALTER TABLE %s%s", tq, b.p ? b.p : "");
		free(b.p);
		plan_add(pl, "add missing columns or defaults", &a);
	}
	return 0;
refused:
	free(b.p); /* what was planned before the refused column */
	return STORE_ERR_FATAL;
}

/* The changes that need a transaction: everything but building indexes on an existing table.
 * Columns the table must have but cannot be given, and columns of the wrong type, are refused
 * before anything is changed. */
static int plan_changes(struct store *s, const struct names *nm, const struct found *f,
                        struct plan *pl)
{
	char tq[2 * STORE_NAME_MAX]; /* the table, schema-qualified */
	const char *ch = s->opts.channel ? s->opts.channel : "";
	struct sbuf b = { 0 };
	int rc;

	snprintf(tq, sizeof(tq), "%s.%s", f->qschema, nm->base);
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
			sbuf_add(&b, "ALTER SEQUENCE %s CACHE 1", f->seq);
			plan_add(pl, "set the seq sequence's CACHE to 1", &b);
		}
		if (!f->fillfactor) {
			/* SHARE UPDATE EXCLUSIVE: producers' inserts do not wait for it. */
			memset(&b, 0, sizeof(b));
			sbuf_add(&b, "ALTER TABLE %s SET (fillfactor = " FILLFACTOR ")", tq);
			plan_add(pl, "set the table's fillfactor", &b);
		}
	}
	if (f->function != CURRENT) {
		memset(&b, 0, sizeof(b));
		add_function_ddl(&b, f->qschema, nm->base, ch);
		plan_add(pl, "replace the wake-up function", &b);
	}
	if (f->trigger == DIFFERENT) {
		memset(&b, 0, sizeof(b));
		sbuf_add(&b, "DROP TRIGGER %s_wakeup ON %s", nm->base, tq);
		plan_add(pl, "replace the wake-up trigger", &b);
	}
	if (f->trigger != CURRENT) {
		/* SHARE ROW EXCLUSIVE on the table: producers wait while it waits. */
		memset(&b, 0, sizeof(b));
		add_trigger_ddl(&b, f->qschema, nm->base, tq);
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
static bool describe_holders(struct store *s, const struct names *nm, const struct found *f,
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
static int step_failed(struct store *s, const struct names *nm, const struct found *f,
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
static int apply_changes(struct store *s, const struct names *nm, const struct found *f,
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
 * end. Indexes an earlier version used and this one does not (retired_indexes) are dropped
 * CONCURRENTLY the same way, after the builds. */
#define INDEX_LOCK_TIMEOUT_S "60"

static int build_indexes(struct store *s, const struct names *nm, const struct found *f,
                         bool changed)
{
	char sql[1024], what[STORE_NAME_MAX + 64], tq[2 * STORE_NAME_MAX], holders[300];
	const char *after = changed ? "the other changes were applied" : "nothing else was changed";
	PGresult *res = NULL;
	int rc = 0;

	if (!f->table)
		return 0;
	snprintf(tq, sizeof(tq), "%s.%s", f->qschema, nm->base);
	/* The builds first, then the drops: the claim has its new index before it loses the
	 * old one. */
	for (size_t i = 0; i < N_INDEXES + N_RETIRED && rc == 0; i++) {
		bool drop = i >= N_INDEXES;

		if (drop ? !f->retired[i - N_INDEXES] : f->index[i] == CURRENT)
			continue;
		snprintf(what, sizeof(what), "%s index %s%s", drop ? "drop the retired" : "create",
		         nm->base, drop ? retired_indexes[i - N_INDEXES] : indexes[i].suffix);
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
			snprintf(sql, sizeof(sql), "DROP INDEX CONCURRENTLY IF EXISTS %s.%s%s",
			         f->qschema, nm->base, retired_indexes[i - N_INDEXES]);
			PQclear(res);
			res = run(s, sql);
		} else if (run_ok(res) && f->index[i] == DIFFERENT) {
			snprintf(sql, sizeof(sql), "DROP INDEX CONCURRENTLY IF EXISTS %s.%s%s",
			         f->qschema, nm->base, indexes[i].suffix);
			PQclear(res);
			res = run(s, sql);
		}
		if (run_ok(res) && !drop) {
			snprintf(sql, sizeof(sql),
			         "CREATE INDEX CONCURRENTLY IF NOT EXISTS %s%s ON %s %s", nm->base,
			         indexes[i].suffix, tq, indexes[i].def);
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
int store_migrate(struct store *s)
{
	char key[STORE_NAME_MAX + 32];
	const char *params[1] = { key };
	struct plan pl = { .n = 0 };
	struct names nm;
	struct found f;
	PGresult *res = NULL;
	int rc;

	s->notice[0] = '\0';
	rc = store_require_conn(s);
	if (rc != 0)
		goto out;
	if (!names_make(&nm, s->table)) {
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
out:
	PQclear(res);
	plan_free(&pl);
	return rc;
}

/* The ordering watermark (store/watermark.h) takes pg_sequence_last_value() as the highest seq
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
