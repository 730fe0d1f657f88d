-- Least-privilege roles for outbox-relay, step 2 of 2: the privileges on the outbox table.
-- Run after `outbox-relay migrate`, as the table's owner (or a superuser); again after every
-- migrate of a new version (GRANT is idempotent; see docs/operations.md, Upgrades):
--
--   psql -X -v ON_ERROR_STOP=1 -d app -v table=outbox -f grants.sql
--
-- Variables: table (required; schema-qualified when not in the search_path), relay (default
-- outbox_relay), producer (default outbox_producer), as in roles.sql.

\if :{?table}
\else
\echo 'grants.sql: give the table: psql -v table=outbox -f grants.sql'
\quit
\endif
\if :{?relay}
\else
\set relay outbox_relay
\endif
\if :{?producer}
\else
\set producer outbox_producer
\endif

BEGIN;

-- run: the claim, marks, failures and releases are UPDATE ... RETURNING (which reads: SELECT);
-- the retention purge, and relay.retention = 0, DELETE. The operator commands need no more:
-- status, dead and keys read; requeue and replay update; discard and purge delete.
SELECT format('GRANT SELECT, UPDATE, DELETE ON TABLE %s TO %I', :'table'::regclass, :'relay')
\gexec
-- The cursor source (relay.source = cursor) reads and moves its position, and the first relay
-- that leads the table inserts its row.
SELECT format('GRANT SELECT, INSERT, UPDATE ON TABLE %s TO %I',
              (:'table' || '_position')::regclass, :'relay') \gexec
-- The ordering watermark reads the seq column's sequence (pg_sequence_last_value).
SELECT format('GRANT SELECT ON SEQUENCE %s TO %I',
              pg_get_serial_sequence(:'table', 'seq')::regclass, :'relay') \gexec

-- A partitioned table (migrate --partitioned): the relay's maintenance creates partitions
-- ahead and retires done ones, and status counts them, through functions that run as the
-- table's owner (EXECUTE is not PUBLIC's). Nothing on a plain table.
SELECT format('GRANT EXECUTE ON FUNCTION %s TO %I', p.oid::regprocedure, :'relay')
  FROM pg_proc p JOIN pg_class c ON c.relnamespace = p.pronamespace
 WHERE c.oid = :'table'::regclass
   AND p.proname IN (c.relname || '_part_ahead', c.relname || '_part_retire',
                     c.relname || '_part_status') \gexec

-- Producers: INSERT ... ON CONFLICT DO NOTHING (outbox_add, `outbox-relay enqueue`; a
-- partitioned table takes no conflict target, a plain one either form).
-- A conflict target (id), which applications' own SQL may name on a plain table, is read, so
-- the id column needs SELECT; no other column does. The seq
-- identity column draws its value without a privilege on the sequence.
SELECT format('GRANT INSERT, SELECT (id) ON TABLE %s TO %I', :'table'::regclass, :'producer')
\gexec

COMMIT;
