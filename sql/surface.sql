--
-- The SQL surface of the extension: its objects, their shape, privileges and
-- security, and the idempotency.* settings.
--

-- Errors are shown as "ERROR:  <SQLSTATE>: <message>" with DETAIL and HINT.
\i sql/include/expect_error.sql
--
-- The extension itself.
--
SELECT extname, extversion, extrelocatable, extnamespace::regnamespace AS schema,
       extconfig::regclass[] AS config_tables, extcondition
FROM pg_extension WHERE extname = 'idempotency';

SELECT name, version, installed, trusted, relocatable, schema, requires, comment
FROM pg_available_extension_versions WHERE name = 'idempotency' ORDER BY version;

-- Its member objects (what \dx+ idempotency lists).  From PostgreSQL 17 the
-- row types of its tables and views and the array types are members too; they
-- come and go with their table or type, so they are left out of the list.
SELECT pg_describe_object(classid, objid, objsubid) AS object
FROM pg_depend
WHERE refclassid = 'pg_extension'::regclass
  AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
  AND deptype = 'e'
  AND NOT EXISTS (SELECT FROM pg_type t LEFT JOIN pg_class c ON c.oid = t.typrelid
                  WHERE classid = 'pg_type'::regclass AND t.oid = objid
                    AND (t.typcategory = 'A' OR c.relkind IN ('r', 'v', 'p', 'm')))
ORDER BY 1;

--
-- The status type.
--
SELECT enum_range(NULL::idem_status) AS labels;
SELECT obj_description('idem_status'::regtype, 'pg_type') AS comment;

--
-- The records table.
--
SELECT a.attnum, a.attname, format_type(a.atttypid, a.atttypmod) AS type,
       a.attnotnull AS not_null, co.collname AS collation,
       pg_get_expr(d.adbin, d.adrelid) AS default
FROM pg_attribute a
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
LEFT JOIN pg_collation co ON co.oid = a.attcollation
WHERE a.attrelid = 'idempotency_records'::regclass AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum;

-- The claim's row: the saved outcome, headers last (0.2.0).
SELECT a.attnum, a.attname, format_type(a.atttypid, a.atttypmod) AS type
FROM pg_attribute a
WHERE a.attrelid = 'idem_claim_result'::regclass AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum;
SELECT col_description('idempotency_records'::regclass, a.attnum) AS response_headers_comment
FROM pg_attribute a
WHERE a.attrelid = 'idempotency_records'::regclass AND a.attname = 'response_headers';

SELECT relkind, relpersistence, reloptions, relrowsecurity, relhastriggers,
       obj_description(oid, 'pg_class') AS comment
FROM pg_class WHERE oid = 'idempotency_records'::regclass;

-- The primary key is the only constraint (besides NOT NULL, which PostgreSQL
-- 18 also lists here as contype 'n': left out) and the only index.
SELECT conname, contype, pg_get_constraintdef(oid) AS definition
FROM pg_constraint WHERE conrelid = 'idempotency_records'::regclass AND contype <> 'n'
ORDER BY conname;

SELECT indexrelid::regclass AS index, indisprimary, indisunique,
       pg_get_indexdef(indexrelid) AS definition
FROM pg_index WHERE indrelid = 'idempotency_records'::regclass
ORDER BY 1;

SELECT count(*) AS triggers FROM pg_trigger WHERE tgrelid = 'idempotency_records'::regclass;

--
-- The functions: signatures, volatility, strictness, parallel safety, and
-- SECURITY INVOKER (prosecdef false) with no SET clauses.
--
\x on
SELECT p.proname, pg_get_function_arguments(p.oid) AS arguments,
       pg_get_function_result(p.oid) AS result
FROM pg_proc p
JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid
WHERE d.refclassid = 'pg_extension'::regclass
  AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
  AND d.deptype = 'e'
ORDER BY p.oid::regprocedure::text;
\x off

SELECT p.oid::regprocedure AS function, l.lanname AS language, p.provolatile AS volatile, p.proisstrict AS strict,
       p.proparallel AS parallel, p.prosecdef AS security_definer, p.proconfig AS config,
       p.proretset AS returns_set, p.prorows AS rows
FROM pg_proc p
JOIN pg_language l ON l.oid = p.prolang
JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid
WHERE d.refclassid = 'pg_extension'::regclass
  AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
  AND d.deptype = 'e'
ORDER BY p.oid::regprocedure::text;

SELECT count(*) AS security_definer_functions
FROM pg_proc p
JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid
WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
  AND d.deptype = 'e' AND p.prosecdef;

--
-- Privileges: PUBLIC may run the fingerprint functions and nothing else.
--
SELECT p.oid::regprocedure AS function,
       has_function_privilege('public', p.oid, 'EXECUTE') AS public_execute
FROM pg_proc p
JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid
WHERE d.refclassid = 'pg_extension'::regclass
  AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
  AND d.deptype = 'e'
ORDER BY p.oid::regprocedure::text;

SELECT privilege, has_table_privilege('public', 'idempotency_records', privilege) AS public_has
FROM unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER']) AS privilege;

SELECT count(*) AS public_acl_entries
FROM pg_class c, aclexplode(c.relacl) a
WHERE c.oid = 'idempotency_records'::regclass AND a.grantee = 0;

SELECT count(*) AS public_column_privileges
FROM pg_attribute a, aclexplode(a.attacl) x
WHERE a.attrelid = 'idempotency_records'::regclass AND x.grantee = 0;

-- An ordinary role: it can fingerprint, but not claim, look up or read records.
SET client_min_messages = warning;
DROP ROLE IF EXISTS regress_idem_nobody;
RESET client_min_messages;
CREATE ROLE regress_idem_nobody;
SET ROLE regress_idem_nobody;
SELECT encode(idem_fingerprint('abc'::text), 'hex') AS fingerprint;
SELECT idem_fingerprint('{"a": 1}'::jsonb) = idem_fingerprint('\x7b2261223a20317d'::bytea) AS fingerprint_ok;
SELECT pg_temp.expect_error($$SELECT * FROM idem_claim('surface-key', '\x01', '1 hour')$$);
SELECT pg_temp.expect_error($$SELECT idem_complete('surface-key', 1)$$);
SELECT pg_temp.expect_error($$SELECT * FROM idem_lookup('surface-key')$$);
SELECT pg_temp.expect_error($$SELECT count(*) FROM idempotency_records$$);
RESET ROLE;

-- The functions run with the caller's privileges (SECURITY INVOKER): EXECUTE
-- alone does not let the role read the table through idem_lookup or write it
-- through idem_claim.
GRANT EXECUTE ON FUNCTION idem_lookup(text, text),
    idem_claim(text, bytea, interval, text, interval, boolean) TO regress_idem_nobody;
SET ROLE regress_idem_nobody;
SELECT pg_temp.expect_error($$SELECT * FROM idem_lookup('surface-key')$$);
SELECT pg_temp.expect_error($$SELECT * FROM idem_claim('surface-key', '\x01', '1 hour')$$);
RESET ROLE;
-- ... and with the table privileges as well it works.
GRANT SELECT, INSERT, UPDATE ON idempotency_records TO regress_idem_nobody;
SET ROLE regress_idem_nobody;
SELECT outcome, token, status FROM idem_claim('surface-key', '\x01', '1 hour');
SELECT key, token, status FROM idem_lookup('surface-key');
RESET ROLE;
DELETE FROM idempotency_records WHERE key = 'surface-key';
SELECT setval('idem_token_epoch', 1, false) AS epoch_reset;  -- a DELETE moves the epoch
REVOKE ALL ON idempotency_records FROM regress_idem_nobody;
REVOKE ALL ON FUNCTION idem_lookup(text, text),
    idem_claim(text, bytea, interval, text, interval, boolean) FROM regress_idem_nobody;

--
-- Settings.  They exist once the library is loaded (on first use, or here
-- explicitly); "idempotency" is then a reserved prefix.
--
LOAD 'idempotency';

-- The defaults (boot_val): test/run's postgresql.conf sets the worker's.
SELECT name, unit, boot_val, min_val, max_val, context, vartype, short_desc
FROM pg_settings WHERE name LIKE 'idempotency.%' ORDER BY name;

SHOW idempotency.default_lease;
SHOW idempotency.retention;
SHOW idempotency.max_key_length;
SHOW idempotency.max_waiters;

SET idempotency.default_lease = '5s';
SHOW idempotency.default_lease;
SET idempotency.default_lease = '2min';
SHOW idempotency.default_lease;
RESET idempotency.default_lease;
SHOW idempotency.default_lease;

SET idempotency.retention = '7d';
SHOW idempotency.retention;
RESET idempotency.retention;
SHOW idempotency.retention;

SET idempotency.max_key_length = 64;
SHOW idempotency.max_key_length;
RESET idempotency.max_key_length;
SHOW idempotency.max_key_length;

SET idempotency.max_waiters = 0;
SHOW idempotency.max_waiters;
SET idempotency.max_waiters = 2147483647;
SHOW idempotency.max_waiters;
RESET idempotency.max_waiters;
SHOW idempotency.max_waiters;

-- Out of range (the settings with a unit: guc_ranges.sql).
SELECT pg_temp.expect_error($$SET idempotency.max_key_length = 0$$);
SELECT pg_temp.expect_error($$SET idempotency.max_key_length = 1025$$);
SELECT pg_temp.expect_error($$SET idempotency.default_lease = 'soon'$$);
SELECT pg_temp.expect_error($$SET idempotency.max_waiters = -1$$);
SELECT pg_temp.expect_error($$SET idempotency.max_waiters = 2147483648$$);
SELECT pg_temp.expect_error($$SET idempotency.max_waiters = 'few'$$);
SHOW idempotency.max_waiters;

-- Unknown settings under the reserved prefix are errors, not placeholders.
SELECT pg_temp.expect_error($$SET idempotency.default_leases = '5s'$$);
SELECT pg_temp.expect_error($$SET idempotency.bogus = 1$$);
SELECT pg_temp.expect_error($$SELECT set_config('idempotency.bogus', '1', false)$$);
SELECT pg_temp.expect_error($$SHOW idempotency.bogus$$);
-- no placeholder was created
SELECT name FROM pg_settings WHERE name LIKE 'idempotency.%' ORDER BY name;

-- default_lease and retention are user settings; max_key_length and
-- max_waiters are for superusers (42501), so an application cannot raise its
-- own limit of waiters.
SET ROLE regress_idem_nobody;
SET idempotency.default_lease = '10s';
SHOW idempotency.default_lease;
SET idempotency.retention = '1h';
SHOW idempotency.retention;
SELECT pg_temp.expect_error($$SET idempotency.max_key_length = 10$$);
SHOW idempotency.max_key_length;
SELECT pg_temp.expect_error($$SET idempotency.max_waiters = 100$$);
SELECT pg_temp.expect_error($$SELECT set_config('idempotency.max_waiters', '100', true)$$);
SHOW idempotency.max_waiters;
RESET ROLE;
RESET idempotency.default_lease;
RESET idempotency.retention;

DROP ROLE regress_idem_nobody;

--
-- The outbox table: the columns of Debezium's outbox event router first by
-- name (id, aggregatetype, aggregateid, type, payload), the relay's after the
-- fixed-width ones; its constraints, the three indexes (two partial
-- B-trees over live messages for the claim, BRIN on created_at for the
-- purge), its order trigger, and its status type.
--
SELECT a.attnum, a.attname, format_type(a.atttypid, a.atttypmod) AS type,
       a.attnotnull AS not_null, co.collname AS collation,
       pg_get_expr(d.adbin, d.adrelid) AS default
FROM pg_attribute a
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
LEFT JOIN pg_collation co ON co.oid = a.attcollation
WHERE a.attrelid = 'idem_outbox'::regclass AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum;

SELECT relkind, relpersistence, reloptions, relrowsecurity,
       obj_description(oid, 'pg_class') AS comment
FROM pg_class WHERE oid = 'idem_outbox'::regclass;

SELECT conname, contype, pg_get_constraintdef(oid) AS definition
FROM pg_constraint WHERE conrelid = 'idem_outbox'::regclass AND contype <> 'n'
ORDER BY conname;

SELECT indexrelid::regclass AS index, indisprimary, indisunique,
       pg_get_indexdef(indexrelid) AS definition
FROM pg_index WHERE indrelid = 'idem_outbox'::regclass
ORDER BY 1;

-- Its one trigger (0.3.0): a row whose seq the default drew takes its key's
-- lock and draws again, as an emit does; fired also in replica mode (A).
SELECT tgname, tgenabled, pg_get_triggerdef(oid) AS definition
FROM pg_trigger WHERE tgrelid = 'idem_outbox'::regclass AND NOT tgisinternal
ORDER BY 1;

SELECT enum_range(NULL::idem_outbox_status) AS labels;
