--
-- The upgrade chain, like contrib/pg_stat_statements' oldextversions: each
-- released version installed, checked, and updated to the next.  In a
-- database of its own, so that the other tests keep the current version.
--
\set regress_db :DBNAME
CREATE DATABASE idem_upgrade_chain;
\c idem_upgrade_chain
SET client_min_messages = warning;

CREATE EXTENSION idempotency VERSION '0.1.0';
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
-- 0.1.0 has no idem_version() and no removal triggers
SELECT to_regprocedure('idem_version()') IS NULL AS no_idem_version;
SELECT tgname FROM pg_trigger WHERE tgrelid = 'idempotency_records'::regclass AND NOT tgisinternal ORDER BY 1;
-- the new library serves it, and says once that it is older
SELECT outcome, token FROM idem_claim('chain', '\x01', '1 hour');

ALTER EXTENSION idempotency UPDATE TO '0.2.0';
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
SELECT sql_version, library_version, build_id <> '' AS has_build_id,
       postgresql_major = current_setting('server_version_num')::int / 10000 AS this_server
FROM idem_version();
-- ENABLE ALWAYS (A): they fire with session_replication_role = replica too
SELECT tgname, tgenabled FROM pg_trigger WHERE tgrelid = 'idempotency_records'::regclass AND NOT tgisinternal ORDER BY 1;
-- the record of 0.1.0 is kept, and its deletion now moves the epoch
SELECT key, token, status FROM idempotency_records;
DELETE FROM idempotency_records WHERE key = 'chain';
SELECT outcome, token FROM idem_claim('chain', '\x01', '1 hour');

-- an SQL version the library does not know is refused, with a hint
UPDATE pg_extension SET extversion = '99.0.0' WHERE extname = 'idempotency';
\c idem_upgrade_chain
SELECT sql_version, library_version FROM idem_version();
SELECT idem_lookup('chain');
UPDATE pg_extension SET extversion = '0.2.0' WHERE extname = 'idempotency';

\c :regress_db
DROP DATABASE idem_upgrade_chain;
