-- deploy/postgres/roles.sql: least-privilege roles for one service database (a compromised
-- relay or service cannot read or change what is not its own).
--
--   migrator (default outbox_migrator)  owns the database, its schema and every object in it;
--                                       applies the migrations (`outbox-relay migrate`,
--                                       `<service> --migrations only`)
--   relay    (default outbox_relay)     exactly what the relay needs: the outbox and the relay's
--                                       own tables (the list below); nothing on business tables
--   service  (order_service, ...)       the service's business tables, its inbox, INSERT on the
--                                       outbox; nothing on the relay's tables
--
-- Run it as a superuser (or your cloud's admin role), connected to the service's database,
-- after the migrations and again after every migration that adds a table:
--
--   psql "postgres://admin@db-host/order" -v ON_ERROR_STOP=1 -v service_role=order_service \
--        -f deploy/postgres/roles.sql
--   (optional: -v relay_role=... -v migrator_role=...)
--
-- It is idempotent and converges: roles are created when missing (LOGIN, no password: set one
-- with `\password outbox_relay`), objects created by another role are handed to the migrator,
-- and every grant below is revoked and given again. Roles are per cluster: the same migrator
-- and relay roles serve every database of the cluster, each database grants them only its own
-- objects.
--
-- TO ADD A TABLE the relay uses: one row in `outbox_grants` below (its relay privileges, and
-- the service's if writers touch it too, e.g. through a trigger on `outbox`). Tables not in
-- the list are business tables: the service gets SELECT, INSERT, UPDATE, DELETE, the relay
-- nothing. Functions keep PostgreSQL's default (EXECUTE for PUBLIC); a trigger function runs
-- with the privileges of the role whose INSERT fired it, so the tables it writes need that
-- role's grant (or the function is SECURITY DEFINER, owned by the migrator).

\set ON_ERROR_STOP on
\if :{?service_role}
\else
  \warn 'roles.sql: set the database''s service role: -v service_role=order_service (wms_service, stock_service)'
  SELECT 1 / 0 AS service_role_is_required;
\endif
\if :{?relay_role}
\else
  \set relay_role outbox_relay
\endif
\if :{?migrator_role}
\else
  \set migrator_role outbox_migrator
\endif

-- Roles are per cluster: one run at a time (several databases may be set up at once).
SELECT pg_advisory_lock(8143372001) AS roles_lock \gset

-- 1. The roles.
SELECT format('CREATE ROLE %I LOGIN', r)
FROM unnest(ARRAY[:'migrator_role', :'relay_role', :'service_role']) AS r
WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) \gexec

-- 2. The database: owned by the migrator; only the relay and the service connect besides.
SELECT format('ALTER DATABASE %I OWNER TO %I', current_database(), :'migrator_role') \gexec
SELECT format('REVOKE ALL ON DATABASE %I FROM PUBLIC', current_database()) \gexec
SELECT format('GRANT CONNECT ON DATABASE %I TO %I, %I', current_database(), :'relay_role',
              :'service_role') \gexec

-- 3. The schema: the migrator creates in it, the others only use it.
ALTER SCHEMA public OWNER TO :"migrator_role";
REVOKE ALL ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO :"relay_role", :"service_role";

-- 4. Objects another role created (a database migrated before these roles existed).
SELECT format('ALTER TABLE public.%I OWNER TO %I', c.relname, :'migrator_role')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
  AND pg_get_userbyid(c.relowner) <> :'migrator_role' \gexec
SELECT format('ALTER SEQUENCE public.%I OWNER TO %I', c.relname, :'migrator_role')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind = 'S'
  AND pg_get_userbyid(c.relowner) <> :'migrator_role'
  AND NOT EXISTS (SELECT 1 FROM pg_depend d
                  WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                    AND d.deptype IN ('a', 'i')) \gexec
SELECT format('ALTER ROUTINE %s OWNER TO %I', p.oid::regprocedure, :'migrator_role')
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'public' AND pg_get_userbyid(p.proowner) <> :'migrator_role' \gexec

-- 5. THE LIST: every table the relay touches, with what the relay and the service may do.
CREATE TEMP TABLE outbox_grants (tbl text PRIMARY KEY, relay text, service text);
INSERT INTO outbox_grants (tbl, relay, service) VALUES
    -- producers insert (RETURNING reads); the relay reads, locks (FOR UPDATE) and deletes
    ('outbox',             'SELECT, UPDATE, DELETE',         'SELECT, INSERT'),
    ('outbox_relay_lease', 'SELECT, INSERT, UPDATE, DELETE', NULL),
    ('outbox_relay_member', 'SELECT, INSERT, UPDATE, DELETE', NULL),
    -- the bucket count: changed by `outbox-relay buckets --set`, run as the migrator; the
    -- relay locks its row FOR SHARE while taking a bucket (which PostgreSQL grants only with
    -- UPDATE), so the count cannot change under the acquisition
    ('outbox_buckets',     'SELECT, UPDATE',                 NULL),
    ('outbox_failure',     'SELECT, INSERT, UPDATE, DELETE', NULL),
    ('outbox_discarded',   'SELECT, INSERT, DELETE',         NULL),
    -- migration bookkeeping: the migrator's alone
    ('_sqlx_migrations',   NULL,                             NULL);

-- Once the outbox schema is migrated, every listed table must exist (a typo fails here).
DO $$
DECLARE missing text;
BEGIN
    IF to_regclass('public.outbox') IS NOT NULL THEN
        SELECT string_agg(tbl, ', ') INTO missing FROM outbox_grants
        WHERE to_regclass('public.' || quote_ident(tbl)) IS NULL;
        IF missing IS NOT NULL THEN
            RAISE EXCEPTION 'roles.sql: listed tables missing after migration: %', missing;
        END IF;
    END IF;
END $$;

-- Start from nothing, so a run converges whatever was granted before.
SELECT format('REVOKE ALL ON public.%I FROM %I, %I', c.relname, :'relay_role', :'service_role')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S') \gexec

-- The relay: the list, nothing else.
SELECT format('GRANT %s ON public.%I TO %I', g.relay, g.tbl, :'relay_role')
FROM outbox_grants g WHERE g.relay IS NOT NULL AND to_regclass('public.' || quote_ident(g.tbl)) IS NOT NULL \gexec

-- The service: what the list gives it, and every table not in the list (its business tables,
-- its inbox, the optional ledger), with their sequences (identity columns need none).
SELECT format('GRANT %s ON public.%I TO %I', g.service, g.tbl, :'service_role')
FROM outbox_grants g WHERE g.service IS NOT NULL AND to_regclass('public.' || quote_ident(g.tbl)) IS NOT NULL \gexec
SELECT format('GRANT SELECT, INSERT, UPDATE, DELETE ON public.%I TO %I', c.relname, :'service_role')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')
  AND c.relname NOT IN (SELECT tbl FROM outbox_grants) \gexec
SELECT format('GRANT USAGE, SELECT ON SEQUENCE public.%I TO %I', c.relname, :'service_role')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind = 'S'
  AND NOT EXISTS (SELECT 1 FROM pg_depend d
                  WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'i')
  AND NOT EXISTS (SELECT 1 FROM pg_depend d JOIN pg_class t ON t.oid = d.refobjid
                  WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'a'
                    AND t.relname IN (SELECT tbl FROM outbox_grants)) \gexec

SELECT pg_advisory_unlock(8143372001) AS roles_unlocked \gset
\echo 'roles.sql: done for database' :DBNAME
