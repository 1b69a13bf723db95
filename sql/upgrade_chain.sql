-- idem-test: c-edition-only: it installs 0.1.0 and updates through the chain; the SQL edition starts at 0.3.0, with no script of an older version
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
-- a column added and dropped again under 0.1.0 leaves a dropped attribute,
-- after which the update adds response_headers
ALTER TABLE idempotency_records ADD COLUMN note text;
ALTER TABLE idempotency_records DROP COLUMN note;
-- 0.1.0's functions have no headers, its table and claim row no column for
-- them: the library completes and replays without
SELECT pg_get_function_arguments('idem_complete'::regproc);
SELECT idem_complete('chain-done', (SELECT token FROM idem_claim('chain-done', '\x02', '1 hour')),
                     '{"id": 1}', 201);
SELECT outcome, response_code, result, to_jsonb(c) ? 'response_headers' AS has_headers
  FROM idem_claim('chain-done', '\x02') c;
SELECT key, status, response_code, result FROM idem_lookup('chain-done');
SELECT idem_fail('chain-failed', (SELECT token FROM idem_claim('chain-failed', '\x03', '1 hour')),
                 '{"reason": "declined"}', false, '', 402);
SELECT outcome, response_code, error FROM idem_claim('chain-failed', '\x03');
SELECT outcome, token FROM idem_claim('chain-open', '\x04', '1 hour');

ALTER EXTENSION idempotency UPDATE TO '0.2.0';
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
SELECT sql_version, library_version, build_id <> '' AS has_build_id,
       postgresql_major = current_setting('server_version_num')::int / 10000 AS this_server
FROM idem_version();
-- ENABLE ALWAYS (A): they fire with session_replication_role = replica too
SELECT tgname, tgenabled FROM pg_trigger WHERE tgrelid = 'idempotency_records'::regclass AND NOT tgisinternal ORDER BY 1;
-- the headers: the last attribute of the claim's row, and a column after the
-- dropped attribute; the same session completes and replays with them
SELECT pg_get_function_arguments('idem_complete'::regproc);
SELECT attnum, attname FROM pg_attribute
 WHERE attrelid = 'idempotency_records'::regclass AND attnum > 17 ORDER BY attnum;
SELECT outcome, response_code, result, to_jsonb(c) ? 'response_headers' AS has_headers, response_headers
  FROM idem_claim('chain-done', '\x02') c;
SELECT idem_complete('chain-open', 1, '{"id": 2}', 201,
                     headers => '{"Location": "/orders/2", "X-Request-Id": "r-2"}');
SELECT outcome, response_code, result, response_headers FROM idem_claim('chain-open', '\x04');
SELECT key, response_headers FROM idem_lookup('chain-open');
SELECT key, response_headers FROM idem_await('chain-open', '', '0 s');
-- the record of 0.1.0 is kept, and its deletion now moves the epoch
SELECT key, token, status FROM idempotency_records WHERE key = 'chain';
DELETE FROM idempotency_records WHERE key = 'chain';
SELECT outcome, token FROM idem_claim('chain', '\x01', '1 hour');

-- a key taken over and one left processing, with tokens of 0.2.0's scheme
SELECT outcome, token FROM idem_claim('chain-taken', '\x05', '1 millisecond');
SELECT pg_sleep(0.01);
SELECT outcome, token FROM idem_claim('chain-taken', '\x05', '1 hour');
SELECT last_value AS epoch_before FROM idem_token_epoch \gset

ALTER EXTENSION idempotency UPDATE TO '0.3.0';
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
SELECT sql_version, library_version FROM idem_version();
-- tokens are epoch * 2^16 + n now: the epoch moved above every token issued
-- so far, so the owners of today's tokens keep them and every new token is
-- above them; the sequence's limit is 2^47 - 1
SELECT e.last_value = (:epoch_before + 1) * 65536 AS epoch_rescaled, s.max_value
  FROM idem_token_epoch e, pg_sequences s
 WHERE s.schemaname = 'public' AND s.sequencename = 'idem_token_epoch';
SELECT last_value = ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint
       AS timeline_recorded
  FROM idem_token_timeline;
SELECT idem_complete('chain', (SELECT token FROM idempotency_records WHERE key = 'chain'), '{"id": 3}');
SELECT outcome, token = (:epoch_before + 1) * 4294967296 + 1 AS first_of_new_epoch
  FROM idem_claim('chain-new', '\x06', '1 hour');
SELECT idem_checkpoint('chain-taken', (SELECT token FROM idempotency_records WHERE key = 'chain-taken'), NULL,
                       '1 millisecond') IS NOT NULL AS owner_still_owns;
SELECT pg_sleep(0.01);
-- a takeover of a token of the old scheme: the new epoch's first token, and
-- the owner before it is fenced off
SELECT outcome, token = (:epoch_before + 1) * 4294967296 + 1 AS first_of_new_epoch
  FROM idem_claim('chain-taken', '\x05', '1 hour');
SELECT idem_complete('chain-taken', 4294967298);

-- an SQL version the library does not know is refused, with a hint
UPDATE pg_extension SET extversion = '99.0.0' WHERE extname = 'idempotency';
\c idem_upgrade_chain
SELECT sql_version, library_version FROM idem_version();
SELECT idem_lookup('chain');
UPDATE pg_extension SET extversion = '0.3.0' WHERE extname = 'idempotency';

\c :regress_db
DROP DATABASE idem_upgrade_chain;
