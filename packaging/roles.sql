-- Least-privilege roles for outbox-relay (PostgreSQL 13 or later), step 1 of 2.
--
--   1. this file, once, by a superuser (or a role with CREATEROLE that may grant on the
--      schema), in the application's database, before the table exists:
--        psql -X -v ON_ERROR_STOP=1 -d app -f roles.sql
--   2. `outbox-relay migrate` as the owner role (it creates the table);
--   3. grants.sql as the owner role (or a superuser), after every migrate:
--        psql -X -v ON_ERROR_STOP=1 -d app -v table=outbox -f grants.sql
--
-- The roles (psql variables rename them and choose the schema):
--   owner    (default outbox_owner, LOGIN)     runs `outbox-relay migrate`: owns the table,
--            its indexes, its sequence and its wake-up trigger; CREATE on the schema.
--   relay    (default outbox_relay, LOGIN)     runs `outbox-relay run` and the operator
--            commands (status, dead, keys, requeue, discard, purge, replay).
--   producer (default outbox_producer, NOLOGIN) adds messages; grant it to the application's
--            own login role: GRANT outbox_producer TO app;
--   schema   (default public)
-- For example: psql ... -v relay=billing_relay -v schema=billing -f roles.sql
--
-- Passwords are not set here: give them with psql's \password ROLE, or use another
-- authentication method in pg_hba.conf. An outbox table made earlier by another role: hand
-- it over first (ALTER TABLE outbox OWNER TO outbox_owner; its sequence follows).
-- PostgreSQL 13 and 14 let every role CREATE in schema public (15 no longer does): there,
-- REVOKE CREATE ON SCHEMA public FROM PUBLIC keeps the relay from creating objects in it
-- (check first that your application does not rely on it).

\if :{?owner}
\else
\set owner outbox_owner
\endif
\if :{?relay}
\else
\set relay outbox_relay
\endif
\if :{?producer}
\else
\set producer outbox_producer
\endif
\if :{?schema}
\else
\set schema public
\endif

BEGIN;

CREATE ROLE :"owner" LOGIN;
CREATE ROLE :"relay" LOGIN;
CREATE ROLE :"producer" NOLOGIN;

SELECT format('GRANT CONNECT ON DATABASE %I TO %I, %I, %I', current_database(),
              :'owner', :'relay', :'producer') \gexec

-- migrate creates the table, its indexes and the wake-up trigger's function in the schema.
GRANT USAGE, CREATE ON SCHEMA :"schema" TO :"owner";
GRANT USAGE ON SCHEMA :"schema" TO :"relay", :"producer";

COMMIT;
