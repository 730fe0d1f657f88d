/* The outbox DDL (DESIGN §1 plus the claim indexes and the wake-up objects) and `migrate`,
 * which applies it in one transaction and upgrades an older (AceMQ) table in place. */
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

bool store_wakeup_name(const char *table, char *out, size_t len)
{
	char schema[STORE_NAME_MAX], base[STORE_NAME_MAX];
	int w;

	store_split_table(table, schema, sizeof(schema), base, sizeof(base));
	w = snprintf(out, len, "%s%s%s_wakeup", schema, schema[0] ? "." : "", base);
	return w > 0 && (size_t)w < len;
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

/* The names this schema derives from the table name; NULL when the name is refused. */
struct names {
	char t[STORE_NAME_MAX];      /* the table, as given */
	char prefix[STORE_NAME_MAX]; /* "schema." or "" */
	char base[STORE_NAME_MAX];
};

static bool names_make(struct names *nm, const char *table)
{
	char schema[STORE_NAME_MAX];

	if (!identifier_valid(table))
		return false;
	store_split_table(table, schema, sizeof(schema), nm->base, sizeof(nm->base));
	if (strlen(nm->base) > IDENTIFIER_TABLE_BASE_MAX)
		return false;
	if (snprintf(nm->t, sizeof(nm->t), "%s", table) >= (int)sizeof(nm->t) ||
	    snprintf(nm->prefix, sizeof(nm->prefix), "%s%s", schema, schema[0] ? "." : "") >=
	            (int)sizeof(nm->prefix))
		return false;
	return true;
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
	         "CREATE TABLE IF NOT EXISTS %s (\n"
	         "  seq           BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,\n"
	         "  id            VARCHAR(64)  NOT NULL PRIMARY KEY,\n"
	         "  exchange_name VARCHAR(255) NOT NULL,\n"
	         "  routing_key   VARCHAR(255) NOT NULL,\n"
	         "  body          TEXT         NOT NULL,\n"
	         "  body_encoding VARCHAR(16)  NOT NULL DEFAULT 'utf-8',\n"
	         "  content_type  VARCHAR(255) NOT NULL DEFAULT 'application/json',\n"
	         "  headers       TEXT         NOT NULL DEFAULT '{}',\n"
	         "  properties    TEXT         NOT NULL DEFAULT '{}',\n"
	         "  ordering_key  VARCHAR(255),\n"
	         "  txid          XID8         NOT NULL DEFAULT pg_current_xact_id(),\n"
	         "  created_at    TIMESTAMPTZ  NOT NULL DEFAULT now(),\n"
	         "  available_at  TIMESTAMPTZ  NOT NULL DEFAULT now(),\n"
	         "  published_at  TIMESTAMPTZ,\n"
	         "  attempts      INTEGER      NOT NULL DEFAULT 0,\n"
	         "  last_error    VARCHAR(1000),\n"
	         "  locked_by     VARCHAR(64),\n"
	         "  locked_until  TIMESTAMPTZ\n"
	         ") WITH (fillfactor = 80);\n\n",
	         t, t);

	/* An older table (AceMQ SQLOutboxStore) lacks these; existing rows get a seq in their
	 * physical order and become claimable at once. The indexes below need them, so they
	 * come first. */
	sbuf_add(&b,
	         "-- upgrade an older table in place\n"
	         "ALTER TABLE %s\n"
	         "  ADD COLUMN IF NOT EXISTS seq BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,\n"
	         "  ADD COLUMN IF NOT EXISTS properties TEXT NOT NULL DEFAULT '{}',\n"
	         "  ADD COLUMN IF NOT EXISTS ordering_key VARCHAR(255),\n"
	         "  ADD COLUMN IF NOT EXISTS txid XID8 NOT NULL DEFAULT pg_current_xact_id(),\n"
	         "  ADD COLUMN IF NOT EXISTS available_at TIMESTAMPTZ NOT NULL DEFAULT now();\n"
	         "-- room on each page so that lease updates (unindexed columns) stay HOT\n"
	         "ALTER TABLE %s SET (fillfactor = 80);\n\n",
	         t, t);

	/* The claim walks unpublished rows in seq order and stops after `batch` of them; the key
	 * index answers "is there an older unpublished row of this key" with one probe. */
	sbuf_add(&b,
	         "CREATE INDEX IF NOT EXISTS %s_pending_idx ON %s (seq)\n"
	         "  WHERE published_at IS NULL;\n"
	         "CREATE INDEX IF NOT EXISTS %s_key_idx ON %s (ordering_key, seq)\n"
	         "  WHERE published_at IS NULL AND ordering_key IS NOT NULL;\n\n",
	         n, t, n, t);

	/* Wake-up: pg_notify serialises committing transactions cluster-wide, so producers only
	 * notify while a relay has armed the flag (it does so just before it sleeps). The
	 * trigger is deferred so the check happens at commit, once the row is visible. */
	sbuf_add(&b,
	         "-- wake-up: producers notify only while a relay waits (armed_until ahead)\n"
	         "CREATE TABLE IF NOT EXISTS %s%s_wakeup (\n"
	         "  id          INT PRIMARY KEY CHECK (id = 1),\n"
	         "  armed_until TIMESTAMPTZ\n"
	         ");\n"
	         "INSERT INTO %s%s_wakeup (id) VALUES (1) ON CONFLICT DO NOTHING;\n\n",
	         p, n, p, n);
	if (channel[0])
		sbuf_add(&b,
		         "CREATE OR REPLACE FUNCTION %s%s_wakeup_notify() RETURNS trigger\n"
		         "LANGUAGE plpgsql AS $fn$\n"
		         "BEGIN\n"
		         "  IF EXISTS (SELECT 1 FROM %s%s_wakeup\n"
		         "             WHERE armed_until > clock_timestamp()) THEN\n"
		         "    PERFORM pg_notify('%s', '');\n"
		         "  END IF;\n"
		         "  RETURN NULL;\n"
		         "END\n"
		         "$fn$;\n\n",
		         p, n, p, n, channel);
	else
		sbuf_add(&b,
		         "CREATE OR REPLACE FUNCTION %s%s_wakeup_notify() RETURNS trigger\n"
		         "LANGUAGE plpgsql AS $fn$\n"
		         "BEGIN\n"
		         "  RETURN NULL; -- no channel configured: relays poll\n"
		         "END\n"
		         "$fn$;\n\n",
		         p, n);
	/* Constraint triggers have no CREATE OR REPLACE: create it only when missing. */
	sbuf_add(&b,
	         "DO $do$\n"
	         "BEGIN\n"
	         "  IF NOT EXISTS (SELECT 1 FROM pg_trigger\n"
	         "                 WHERE tgrelid = '%s'::regclass AND tgname = '%s_wakeup') THEN\n"
	         "    CREATE CONSTRAINT TRIGGER %s_wakeup AFTER INSERT ON %s\n"
	         "      DEFERRABLE INITIALLY DEFERRED FOR EACH ROW\n"
	         "      EXECUTE FUNCTION %s%s_wakeup_notify();\n"
	         "  END IF;\n"
	         "END\n"
	         "$do$;\n",
	         t, n, n, t, p, n);

	if (b.failed) {
		free(b.p);
		return NULL;
	}
	return b.p;
}

/* One multi-statement simple query runs as one implicit transaction: either the whole
 * schema and upgrade apply or nothing does. The advisory lock serialises two relays that
 * migrate at the same moment (CREATE ... IF NOT EXISTS is not safe against a concurrent
 * create of the same name). */
int store_migrate(struct store *s)
{
	char *ddl = NULL, *sql = NULL;
	size_t len;
	PGresult *res = NULL;
	int rc;

	rc = store_require_conn(s);
	if (rc != 0)
		goto out;
	ddl = store_schema_sql(s->table, s->opts.channel ? s->opts.channel : "");
	if (!ddl) {
		store_set_error(s, "could not build the schema for table '%s': name not usable",
		                s->table);
		rc = STORE_ERR_FATAL;
		goto out;
	}
	len = strlen(ddl) + strlen(s->table) + 128;
	sql = malloc(len);
	if (!sql) {
		rc = STORE_ERR_NOMEM;
		store_set_error(s, "out of memory");
		goto out;
	}
	snprintf(sql, len, "SELECT pg_advisory_xact_lock(hashtext('outbox-relay migrate %s'));\n%s",
	         s->table, ddl);
	res = PQexec(s->conn, sql);
	if (PQresultStatus(res) != PGRES_COMMAND_OK && PQresultStatus(res) != PGRES_TUPLES_OK) {
		rc = store_result_error(s, res, "could not migrate the outbox table");
		goto out;
	}
	rc = 0;
out:
	PQclear(res);
	free(sql);
	free(ddl);
	return rc;
}
