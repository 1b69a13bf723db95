-- idem-test: superuser: it reads the install script from the server's disk (pg_read_file), creates a BYPASSRLS role and checks what binds a superuser and what does not
-- Security (issue #8): the privilege model, tenant isolation, search_path
-- safety and hostile identifiers, tested as several roles.
--
--   1. the install script: no SECURITY DEFINER, search_path pinned where set,
--      nothing writable by PUBLIC, no roles created, objects qualified;
--   2. roles: a role without rights is refused every function; idem_grant's
--      kinds each allow their own work and nothing more; idem_revoke_all;
--   3. tenant isolation (idem_tenant_isolation, idempotency.scope): tenant A
--      cannot see, replay, complete, await, resolve, purge or accept into
--      tenant B's records and messages; FORCE binds a table owner that is not
--      a superuser; a policy that hides a row the claim's INSERT conflicts
--      with gives 42501; the C code's reads honour privileges and policies;
--   4. search_path: functions, operators, types and tables planted in a
--      schema "evil" ahead of pg_catalog are never called by the extension,
--      through the whole lifecycle;
--   5. identifiers with quotes, spaces and semicolons: machines attached,
--      moved, logged and detached; nothing injected (a canary table stays).
--
-- Everything, roles included, is rolled back.  Keys are prefixed "sec.",
-- roles are regress_idem_sec_*, schemas sec_*.  The variant with the
-- extension in a schema of its own (objects planted in public) and the
-- wait => false probe against another session are in security_schema.sql.
BEGIN;
SELECT plan(221);
SET LOCAL statement_timeout = '60s';

-- The SQLSTATE of a statement, or '00000'.
CREATE FUNCTION pg_temp.sqlstate_of(sql pg_catalog.text) RETURNS pg_catalog.text LANGUAGE plpgsql AS $fn$
BEGIN
    EXECUTE sql;
    RETURN '00000';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END
$fn$;
GRANT EXECUTE ON FUNCTION pg_temp.sqlstate_of(pg_catalog.text) TO PUBLIC;
-- The number of rows a statement processed.
CREATE FUNCTION pg_temp.row_count(sql text) RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
    n bigint;
BEGIN
    EXECUTE sql;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$fn$;
GRANT EXECUTE ON FUNCTION pg_temp.row_count(text) TO PUBLIC;

-- Expired rows committed by others would be counted by the purges below;
-- purging moves the token epoch (not transactional): it is put back at the end.
SELECT ok(idem_purge() >= 0, 'expired rows left by others are purged first (rolled back at the end)');

-- 1. the install script ----------------------------------------------------------------------------
CREATE TEMP TABLE ext_functions AS
SELECT p.oid, p.oid::regprocedure::text AS signature, p.prosecdef, p.proconfig, l.lanname,
       p.prosqlbody IS NOT NULL AS sql_standard_body
FROM pg_proc p
JOIN pg_language l ON l.oid = p.prolang
JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency';
CREATE TEMP TABLE ext_relations AS
SELECT c.oid, c.oid::regclass::text AS name, c.relkind, c.relacl
FROM pg_class c
JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'e'
JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency';
GRANT SELECT ON ext_functions, ext_relations TO PUBLIC;

-- The SQL edition (sql/edition: no C library) has the same 70 functions, in
-- PL/pgSQL and SQL, and internal helpers beside them, all named idem_sql_*
-- (sql/edition/bodies, "--@ internal"); a few of those are SECURITY DEFINER
-- (each named below, with search_path pinned), and the helpers that are not
-- qualify every name instead of pinning search_path (section 4 plants
-- look-alikes ahead of pg_catalog and runs the whole lifecycle).
SELECT NOT EXISTS (SELECT FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
                   WHERE p.proname = 'idem_claim' AND l.lanname = 'c'
                     AND p.pronamespace = (SELECT extnamespace FROM pg_extension WHERE extname = 'idempotency'))
       AS sql_edition \gset
\if :sql_edition
SELECT is((SELECT count(*) FROM ext_functions WHERE signature NOT LIKE 'idem\_sql\_%'), 70::bigint,
          'the extension has 70 functions, besides the SQL edition''s internal idem_sql_* helpers');
SELECT results_eq($$SELECT signature, proconfig::text COLLATE "default" FROM ext_functions WHERE prosecdef ORDER BY 1$$,
                  $$VALUES ('idem_sql_machine_check(text,"char",text,text,text,text,text)', '{"search_path=pg_catalog, pg_temp"}'),
                           ('idem_sql_machine_sources(text,text)', '{"search_path=pg_catalog, pg_temp"}'),
                           ('idem_sql_maint_role_tenants(name)', '{"search_path=pg_catalog, pg_temp"}'),
                           ('idem_sql_token_epoch_advance()', '{"search_path=pg_catalog, pg_temp"}'),
                           ('idem_sql_token_epoch_now()', '{"search_path=pg_catalog, pg_temp"}'),
                           ('idem_sql_token_move_timeline()', '{"search_path=pg_catalog, pg_temp"}')$$,
                  'the SQL edition: the only SECURITY DEFINER functions are its internal helpers that read the machine '
                  'definitions, a role''s own tenants and the token epoch, and advance or move the epoch, '
                  'each with search_path = pg_catalog, pg_temp');
\else
SELECT is((SELECT count(*) FROM ext_functions), 70::bigint, 'the extension has 70 functions');
SELECT is_empty($$SELECT signature FROM ext_functions WHERE prosecdef$$,
                'no function is SECURITY DEFINER');
\endif
SELECT is_empty($$SELECT signature FROM ext_functions
                  WHERE proconfig IS NOT NULL AND proconfig <> '{"search_path=pg_catalog, pg_temp"}'$$,
                'every function that sets a configuration sets exactly search_path = pg_catalog, pg_temp');
\if :sql_edition
SELECT is_empty($$SELECT signature FROM ext_functions
                  WHERE lanname IN ('plpgsql', 'sql') AND proconfig IS NULL AND NOT sql_standard_body
                    AND (signature NOT LIKE 'idem\_sql\_%' OR prosecdef)$$,
                'every PL/pgSQL and SQL function pins search_path, unless its body is bound at creation (SQL-standard) '
                'or it is an internal idem_sql_* helper of the SQL edition that is not SECURITY DEFINER');
SELECT results_eq($$SELECT signature, sql_standard_body FROM ext_functions
                    WHERE proconfig IS NULL AND lanname <> 'c' AND signature NOT LIKE 'idem\_sql\_%' ORDER BY 1$$,
                  $$VALUES ('idem_consumer_in_scope(text)', true), ('idem_fingerprint(bytea)', true),
                           ('idem_outbox_next_seq()', true), ('idem_scope_in_tenant(text)', true)$$,
                  'the only ones without SET search_path, besides the SQL edition''s internal helpers, are '
                  'idem_consumer_in_scope and idem_scope_in_tenant, so that the policies can inline them, '
                  'idem_outbox_next_seq, inlined as idem_outbox.seq''s default, and idem_fingerprint(bytea), '
                  'inlined into its callers: SQL-standard bodies, bound at creation');
\else
SELECT is_empty($$SELECT signature FROM ext_functions
                  WHERE lanname IN ('plpgsql', 'sql') AND proconfig IS NULL AND NOT sql_standard_body$$,
                'every PL/pgSQL and SQL function pins search_path, unless its body is bound at creation (SQL-standard)');
SELECT results_eq($$SELECT signature FROM ext_functions WHERE proconfig IS NULL AND lanname <> 'c' ORDER BY 1$$,
                  $$VALUES ('idem_consumer_in_scope(text)'), ('idem_scope_in_tenant(text)')$$,
                  'the only ones without SET search_path are idem_consumer_in_scope and idem_scope_in_tenant, so that the policies can inline them');
\endif

SELECT is_empty($$SELECT r.name, a.privilege_type FROM ext_relations r, aclexplode(r.relacl) a
                  WHERE a.grantee = 0 AND a.privilege_type <> 'SELECT'$$,
                'nothing of the extension is writable by PUBLIC');
SELECT results_eq($$SELECT r.name FROM ext_relations r, aclexplode(r.relacl) a WHERE a.grantee = 0 ORDER BY 1$$,
                  $$VALUES ('idem_attached_machines'), ('idem_global_reconcilers'), ('idem_machine_moves'),
                           ('idem_machines'), ('idem_settings'), ('idem_token_epoch')$$,
                  'PUBLIC may read the machine definitions, the settings, the global reconcilers and the token epoch, nothing else '
                  '(a role learns its own tenants from idem_role_tenants)');
SELECT is_empty($$SELECT name FROM ext_relations
                  WHERE relkind = 'v' AND relacl IS NULL AND name NOT IN ('idem_stuck', 'idem_summary')$$,
                'the views without privileges (owner only) are idem_stuck and idem_summary');
\if :sql_edition
-- The SQL edition: the same, and its internal helpers, which are called as
-- the caller (the functions above run them so) but for the SECURITY DEFINER
-- ones, which only read what PUBLIC may read (the machine definitions, the
-- token epoch), answer a role only its own tenants, advance the token epoch
-- by one, as any deletion of a record does, or move it once for a new
-- timeline of the server, which the helper reads itself (one that took the
-- timeline from its caller would let PUBLIC exhaust the epochs, 2^24 a call).
SELECT set_eq(
    $$SELECT signature FROM ext_functions f
      WHERE ((SELECT proacl IS NULL FROM pg_proc WHERE oid = f.oid)
             OR EXISTS (SELECT FROM pg_proc p, aclexplode(p.proacl) a
                        WHERE p.oid = f.oid AND a.grantee = 0 AND a.privilege_type = 'EXECUTE'))
        -- the helpers that run as their caller do only what the caller may
        AND NOT (signature LIKE 'idem\_sql\_%' AND NOT prosecdef)$$,
    $$VALUES ('idem_consumer_in_scope(text)'), ('idem_enforce_initial_state()'), ('idem_enforce_transition()'),
             ('idem_fingerprint(bytea)'), ('idem_fingerprint(jsonb)'), ('idem_fingerprint(text)'),
             ('idem_inbox_seq(bigint,integer)'), ('idem_inserted_unchecked(text,name,oid,text)'),
             ('idem_log_transition()'), ('idem_machine_dot(text)'), ('idem_machine_moves(text)'),
             ('idem_machine_states(text)'), ('idem_object_name(text,text,text)'), ('idem_outbox_next_seq()'), ('idem_outbox_stuck()'),
             ('idem_request_fingerprint(text,text,jsonb,text[])'), ('idem_role_tenants()'), ('idem_route_hash(text)'),
             ('idem_scope_in_tenant(text)'), ('idem_stats()'), ('idem_transition(regclass,text,text,text[],name)'),
             ('idem_transition(regclass,text[],text,text[],name)'), ('idem_trigger_arg(bytea,integer)'),
             ('idem_version()'),
             ('idem_sql_machine_check(text,"char",text,text,text,text,text)'), ('idem_sql_machine_sources(text,text)'),
             ('idem_sql_maint_role_tenants(name)'), ('idem_sql_token_epoch_advance()'), ('idem_sql_token_epoch_now()'),
             ('idem_sql_token_move_timeline()')$$,
    'PUBLIC may execute only what it may in the C edition (pure functions, readers of definitions and counters, the build''s '
    'identity, trigger functions, idem_transition, idem_outbox_stuck, idem_outbox_next_seq), the SQL edition''s internal '
    'helpers that run as their caller, and the SECURITY DEFINER ones named here, none of which writes but the token epoch''s steps');
\else
SELECT results_eq(
    $$SELECT signature FROM ext_functions f
      WHERE (SELECT proacl IS NULL FROM pg_proc WHERE oid = f.oid)
         OR EXISTS (SELECT FROM pg_proc p, aclexplode(p.proacl) a
                    WHERE p.oid = f.oid AND a.grantee = 0 AND a.privilege_type = 'EXECUTE')
      ORDER BY 1$$,
    $$VALUES ('idem_consumer_in_scope(text)'), ('idem_enforce_initial_state()'), ('idem_enforce_transition()'),
             ('idem_fingerprint(bytea)'), ('idem_fingerprint(jsonb)'), ('idem_fingerprint(text)'),
             ('idem_inbox_seq(bigint,integer)'), ('idem_inserted_unchecked(text,name,oid,text)'),
             ('idem_log_transition()'), ('idem_machine_dot(text)'), ('idem_machine_moves(text)'),
             ('idem_machine_states(text)'), ('idem_object_name(text,text,text)'), ('idem_outbox_next_seq()'), ('idem_outbox_stuck()'),
             ('idem_request_fingerprint(text,text,jsonb,text[])'), ('idem_role_tenants()'), ('idem_route_hash(text)'),
             ('idem_scope_in_tenant(text)'), ('idem_stats()'), ('idem_transition(regclass,text,text,text[],name)'),
             ('idem_transition(regclass,text[],text,text[],name)'), ('idem_trigger_arg(bytea,integer)'),
             ('idem_version()')$$,
    'PUBLIC may execute only pure functions, readers of definitions and counters, the build''s identity, trigger functions, '
    'idem_transition (which acts with the caller''s table privileges), idem_outbox_stuck (idem_stuck''s reader of the outbox) '
    'and idem_outbox_next_seq (the default of idem_outbox.seq: nextval under the caller''s privileges)');
\endif

-- the script itself
CREATE TEMP TABLE install_script AS
SELECT pg_read_file((SELECT setting FROM pg_config WHERE name = 'SHAREDIR')
                    || '/extension/idempotency--' || (SELECT default_version FROM pg_available_extensions WHERE name = 'idempotency') || '.sql') AS body;
SELECT ok((SELECT body !~* '\mCREATE\s+(ROLE|USER|GROUP)\M' AND body !~* '\mALTER\s+(ROLE|USER)\M'
           FROM install_script),
          'the install script creates and alters no role');
\if :sql_edition
-- the functions whose declaration (up to its body) says SECURITY DEFINER;
-- a statement with a semicolon before the body (SQL-standard) is not one
SELECT results_eq(
    $$SELECT m[1] FROM install_script,
             regexp_matches(body, 'CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+@extschema@\.(\w+)\s*\(([^$;]*?)\mAS\s+\$', 'gi') m
      WHERE m[2] ~* '\mSECURITY\s+DEFINER\M' ORDER BY 1$$,
    $$VALUES ('idem_sql_machine_check'), ('idem_sql_machine_sources'), ('idem_sql_maint_role_tenants'),
             ('idem_sql_token_epoch_advance'), ('idem_sql_token_epoch_now'), ('idem_sql_token_move_timeline')$$,
    'and declares SECURITY DEFINER only the SQL edition''s helpers above');
\else
SELECT ok((SELECT body !~* 'SECURITY\s+DEFINER' FROM install_script), 'and declares nothing SECURITY DEFINER');
\endif
SELECT is_empty(
    $$SELECT m[1] FROM install_script,
             regexp_matches(body, '^(CREATE\s+(?:TYPE|TABLE|SEQUENCE|FUNCTION|VIEW|(?:UNIQUE\s+)?INDEX\s+\S+\s+ON|TRIGGER\s+\S+\s+(?:[^;\s]+\s+)*?ON|POLICY\s+\S+\s+ON)\s+(?!@extschema@\.)\S+)', 'gin') m$$,
    'every statement of the script that creates an object, and every table it indexes or puts a trigger or policy on, is qualified with @extschema@');
SELECT is_empty(
    $$SELECT m[1] FROM install_script,
             regexp_matches(body, '((?:EXECUTE\s+FUNCTION|REFERENCES|FROM|JOIN|INTO|UPDATE)\s+(?:ONLY\s+)?(?:idem_|idempotency_)\w+)', 'gi') m$$,
    'it never names one of its own tables or functions without the schema');

-- 2. roles ---------------------------------------------------------------------------------------
-- One call per function that PUBLIC may not execute; the arguments are valid,
-- so that a role allowed to call the function gets past the privilege check.
CREATE TABLE sec_plain (id int PRIMARY KEY, st text);       -- no machine: attach would create one
CREATE TABLE sec_attached (id int PRIMARY KEY, st text);    -- a machine: detach would drop it
SELECT idem_define_machine('sec.m', '{"a": ["b"]}');
SELECT idem_attach_machine('sec_attached', 'st', 'sec.m');
CREATE TEMP TABLE calls (signature text PRIMARY KEY, proname text, sql text);
INSERT INTO calls VALUES
    ('idem_claim(text,bytea,interval,text,interval,boolean)', 'idem_claim', $$SELECT * FROM idem_claim('sec.n', '\x01')$$),
    ('idem_complete(text,bigint,jsonb,integer,text,jsonb)', 'idem_complete', $$SELECT idem_complete('sec.n', 1)$$),
    ('idem_fail(text,bigint,jsonb,boolean,text,integer,jsonb)', 'idem_fail', $$SELECT idem_fail('sec.n', 1, '{}')$$),
    ('idem_checkpoint(text,bigint,text,interval,text)', 'idem_checkpoint', $$SELECT idem_checkpoint('sec.n', 1, 'p')$$),
    ('idem_release(text,bigint,text)', 'idem_release', $$SELECT idem_release('sec.n', 1)$$),
    ('idem_mark_unknown(text,bigint,jsonb,text)', 'idem_mark_unknown', $$SELECT idem_mark_unknown('sec.n', 1, '{}')$$),
    ('idem_resolve(text,idem_status,jsonb,integer,text,boolean,jsonb)', 'idem_resolve', $$SELECT idem_resolve('sec.n', 'succeeded')$$),
    ('idem_lookup(text,text)', 'idem_lookup', $$SELECT * FROM idem_lookup('sec.n')$$),
    ('idem_await(text,text,interval)', 'idem_await', $$SELECT * FROM idem_await('sec.n', '', '0')$$),
    ('idem_inbox_accept(text,text,interval,boolean)', 'idem_inbox_accept', $$SELECT idem_inbox_accept('sec.c', 'm')$$),
    ('idem_inbox_accept_seq(text,text,bigint,boolean)', 'idem_inbox_accept_seq', $$SELECT idem_inbox_accept_seq('sec.c', 's', 1)$$),
    ('idem_inbox_accept_seq(text,text,bigint,integer,boolean)', 'idem_inbox_accept_seq', $$SELECT idem_inbox_accept_seq('sec.c', 's', 1, 0)$$),
    ('idem_inbox_watermark(text,text)', 'idem_inbox_watermark', $$SELECT idem_inbox_watermark('sec.c', 's')$$),
    ('idem_inbox_accept_many(text,text[],interval,boolean)', 'idem_inbox_accept_many', $$SELECT * FROM idem_inbox_accept_many('sec.c', '{m}')$$),
    ('idem_inbox_accept_seq_many(text,text,bigint[],boolean)', 'idem_inbox_accept_seq_many', $$SELECT * FROM idem_inbox_accept_seq_many('sec.c', 's', '{1}')$$),
    ('idem_purge(integer,integer)', 'idem_purge', $$SELECT idem_purge()$$),
    ('idem_schedule_purge(text,integer,integer)', 'idem_schedule_purge', $$SELECT idem_schedule_purge()$$),
    ('idem_unschedule_purge()', 'idem_unschedule_purge', $$SELECT idem_unschedule_purge()$$),
    ('idem_stats_reset()', 'idem_stats_reset', $$SELECT idem_stats_reset()$$),
    ('idem_define_machine(text,jsonb,text[])', 'idem_define_machine', $$SELECT idem_define_machine('sec.m', '{"a": ["b"]}')$$),
    ('idem_drop_machine(text)', 'idem_drop_machine', $$SELECT idem_drop_machine('sec.unused')$$),
    ('idem_attach_machine(regclass,name,text,boolean,boolean)', 'idem_attach_machine', $$SELECT idem_attach_machine('sec_plain', 'st', 'sec.m')$$),
    ('idem_detach_machine(regclass,name)', 'idem_detach_machine', $$SELECT idem_detach_machine('sec_attached', 'st')$$),
    ('idem_tenant_isolation(boolean)', 'idem_tenant_isolation', $$SELECT idem_tenant_isolation()$$),
    ('idem_grant(text,regrole)', 'idem_grant', $$SELECT idem_grant('client', 'regress_idem_sec_nobody')$$),
    ('idem_revoke_all(regrole)', 'idem_revoke_all', $$SELECT idem_revoke_all('regress_idem_sec_nobody')$$),
    ('idem_grant_tenant(text,regrole)', 'idem_grant_tenant', $$SELECT idem_grant_tenant('t1', 'regress_idem_sec_nobody')$$),
    ('idem_revoke_tenant(text,regrole)', 'idem_revoke_tenant', $$SELECT idem_revoke_tenant('t1', 'regress_idem_sec_nobody')$$),
    ('idem_refuse_stale_snapshot(regclass)', 'idem_refuse_stale_snapshot', $$SELECT idem_refuse_stale_snapshot('idem_tenant_members')$$),
    ('idem_outbox_emit(text,text,jsonb,text,jsonb,text,interval)', 'idem_outbox_emit', $$SELECT idem_outbox_emit('sec.t', 'k', '{}')$$),
    ('idem_outbox_emit_batch(text,text[],jsonb[],text[],jsonb[],text,interval)', 'idem_outbox_emit_batch', $$SELECT idem_outbox_emit_batch('sec.t', '{k}', '{"{}"}')$$),
    ('idem_outbox_claim(text,integer,interval,text[])', 'idem_outbox_claim', $$SELECT * FROM idem_outbox_claim('sec.r')$$),
    ('idem_outbox_ack(uuid[],bigint)', 'idem_outbox_ack', $$SELECT idem_outbox_ack('{00000000-0000-7000-8000-000000000000}', 1)$$),
    ('idem_outbox_nack(uuid,bigint,jsonb,interval)', 'idem_outbox_nack', $$SELECT idem_outbox_nack('00000000-0000-7000-8000-000000000000', 1, '{}')$$),
    ('idem_outbox_retry(uuid)', 'idem_outbox_retry', $$SELECT idem_outbox_retry('00000000-0000-7000-8000-000000000000')$$),
    ('idem_outbox_check_token(uuid,bigint,text)', 'idem_outbox_check_token', $$SELECT idem_outbox_check_token('00000000-0000-7000-8000-000000000000', 1, 'ack')$$),
    ('idem_outbox_counted(text,bigint)', 'idem_outbox_counted', $$SELECT idem_outbox_counted('published', 0)$$),
    ('idem_outbox_lock_key(text,text,text)', 'idem_outbox_lock_key', $$SELECT idem_outbox_lock_key('', 'sec.t', 'k')$$),
    -- trigger functions: with EXECUTE, a direct call fails with 0A000 instead
    ('idem_machines_changed()', 'idem_machines_changed', $$SELECT idem_machines_changed()$$),
    ('idem_apply_settings()', 'idem_apply_settings', $$SELECT idem_apply_settings()$$),
    ('idem_apply_global_reconcilers()', 'idem_apply_global_reconcilers', $$SELECT idem_apply_global_reconcilers()$$),
    ('idem_apply_tenant_members()', 'idem_apply_tenant_members', $$SELECT idem_apply_tenant_members()$$),
    ('idem_records_removed()', 'idem_records_removed', $$SELECT idem_records_removed()$$),
    ('idem_outbox_order()', 'idem_outbox_order', $$SELECT idem_outbox_order()$$),
    ('idem_records_truncated()', 'idem_records_truncated', $$SELECT idem_records_truncated()$$),
    ('idem_records_rekeyed()', 'idem_records_rekeyed', $$SELECT idem_records_rekeyed()$$);
GRANT SELECT ON calls TO PUBLIC;
SELECT set_eq($$SELECT signature FROM calls$$,
              $$SELECT signature FROM ext_functions f
                WHERE NOT EXISTS (SELECT FROM pg_proc p WHERE p.oid = f.oid AND p.proacl IS NULL)
                  AND NOT EXISTS (SELECT FROM pg_proc p, aclexplode(p.proacl) a
                                  WHERE p.oid = f.oid AND a.grantee = 0 AND a.privilege_type = 'EXECUTE')$$,
              'the calls below cover every function that PUBLIC may not execute');

-- Which calls a role gets past the privilege checks of: each call runs in a
-- subtransaction that is rolled back whatever happens, and what counts is
-- whether it failed with 42501 (any other outcome, error or not, means the
-- role was allowed to try).
CREATE FUNCTION pg_temp.allowed(sql text) RETURNS boolean LANGUAGE plpgsql
SET client_min_messages = error        -- GRANT and REVOKE without grant options only warn
AS $fn$
BEGIN
    BEGIN
        EXECUTE sql;
        RAISE EXCEPTION 'roll back' USING ERRCODE = 'SEC00';
    EXCEPTION WHEN OTHERS THEN
        RETURN SQLSTATE <> '42501';
    END;
END
$fn$;
GRANT EXECUTE ON FUNCTION pg_temp.allowed(text) TO PUBLIC;

CREATE ROLE regress_idem_sec_nobody;
CREATE ROLE regress_idem_sec_exec;
CREATE ROLE regress_idem_sec_client;
CREATE ROLE regress_idem_sec_reader;
CREATE ROLE regress_idem_sec_reconciler;
CREATE ROLE regress_idem_sec_consumer;
CREATE ROLE regress_idem_sec_maint;
CREATE ROLE regress_idem_sec_madmin;
CREATE ROLE regress_idem_sec_monitor;
CREATE ROLE regress_idem_sec_emitter;
CREATE ROLE regress_idem_sec_relay;
CREATE ROLE "regress_idem_sec we'ird; role";
SELECT lives_ok($$SELECT idem_grant('client', 'regress_idem_sec_client')$$, 'idem_grant client');
SELECT lives_ok($$SELECT idem_grant('reader', 'regress_idem_sec_reader')$$, 'idem_grant reader');
SELECT lives_ok($$SELECT idem_grant('reconciler', 'regress_idem_sec_reconciler')$$, 'idem_grant reconciler');
SELECT lives_ok($$SELECT idem_grant('consumer', 'regress_idem_sec_consumer')$$, 'idem_grant consumer');
SELECT lives_ok($$SELECT idem_grant('maintenance', 'regress_idem_sec_maint')$$, 'idem_grant maintenance');
SELECT lives_ok($$SELECT idem_grant('machine_admin', 'regress_idem_sec_madmin')$$, 'idem_grant machine_admin');
SELECT lives_ok($$SELECT idem_grant('monitor', 'regress_idem_sec_monitor')$$, 'idem_grant monitor');
SELECT lives_ok($$SELECT idem_grant('emitter', 'regress_idem_sec_emitter')$$, 'idem_grant emitter');
SELECT lives_ok($$SELECT idem_grant('relay', 'regress_idem_sec_relay')$$, 'idem_grant relay');
SELECT lives_ok($$SELECT idem_grant('reader', '"regress_idem_sec we''ird; role"')$$,
                'idem_grant to a role whose name has a quote, a space and a semicolon');
-- EXECUTE on every function, and no privilege on the tables
GRANT EXECUTE ON FUNCTION idem_claim(text, bytea, interval, text, interval, boolean),
    idem_complete(text, bigint, jsonb, integer, text, jsonb), idem_fail(text, bigint, jsonb, boolean, text, integer, jsonb),
    idem_checkpoint(text, bigint, text, interval, text), idem_release(text, bigint, text),
    idem_mark_unknown(text, bigint, jsonb, text), idem_resolve(text, idem_status, jsonb, integer, text, boolean, jsonb),
    idem_lookup(text, text), idem_await(text, text, interval),
    idem_inbox_accept(text, text, interval, boolean), idem_inbox_accept_seq(text, text, bigint, boolean),
    idem_inbox_accept_seq(text, text, bigint, integer, boolean), idem_inbox_watermark(text, text),
    idem_inbox_accept_many(text, text[], interval, boolean), idem_inbox_accept_seq_many(text, text, bigint[], boolean),
    idem_purge(integer, integer), idem_define_machine(text, jsonb, text[]), idem_drop_machine(text),
    idem_attach_machine(regclass, name, text, boolean, boolean), idem_detach_machine(regclass, name),
    idem_tenant_isolation(boolean), idem_grant(text, regrole), idem_revoke_all(regrole),
    idem_grant_tenant(text, regrole), idem_revoke_tenant(text, regrole),
    idem_outbox_emit(text, text, jsonb, text, jsonb, text, interval),
    idem_outbox_emit_batch(text, text[], jsonb[], text[], jsonb[], text, interval),
    idem_outbox_claim(text, integer, interval, text[]), idem_outbox_ack(uuid[], bigint),
    idem_outbox_nack(uuid, bigint, jsonb, interval), idem_outbox_retry(uuid),
    idem_outbox_check_token(uuid, bigint, text)
  TO regress_idem_sec_exec;

-- what each kind grants, exactly
CREATE FUNCTION pg_temp.grants_of(role name) RETURNS TABLE (object text, privileges text) LANGUAGE sql AS $fn$
    SELECT o.object, string_agg(a.privilege_type, ', ' ORDER BY a.privilege_type)
    FROM (SELECT format('%s %s', CASE r.relkind WHEN 'S' THEN 'sequence' WHEN 'v' THEN 'view' ELSE 'table' END, r.name) AS object,
                 (SELECT relacl FROM pg_class WHERE oid = r.oid) AS acl FROM ext_relations r
          UNION ALL
          SELECT 'function ' || signature, (SELECT proacl FROM pg_proc WHERE oid = f.oid) FROM ext_functions f
          UNION ALL
          SELECT 'schema ' || nspname, nspacl FROM pg_namespace
          WHERE oid = (SELECT extnamespace FROM pg_extension WHERE extname = 'idempotency')) o,
         aclexplode(o.acl) a
    WHERE a.grantee = (SELECT oid FROM pg_roles WHERE rolname = role)
    GROUP BY o.object ORDER BY o.object
$fn$;
SELECT results_eq($$SELECT * FROM pg_temp.grants_of('regress_idem_sec_client')$$,
    $$VALUES ('function idem_await(text,text,interval)', 'EXECUTE'),
             ('function idem_checkpoint(text,bigint,text,interval,text)', 'EXECUTE'),
             ('function idem_claim(text,bytea,interval,text,interval,boolean)', 'EXECUTE'),
             ('function idem_complete(text,bigint,jsonb,integer,text,jsonb)', 'EXECUTE'),
             ('function idem_fail(text,bigint,jsonb,boolean,text,integer,jsonb)', 'EXECUTE'),
             ('function idem_lookup(text,text)', 'EXECUTE'),
             ('function idem_mark_unknown(text,bigint,jsonb,text)', 'EXECUTE'),
             ('function idem_release(text,bigint,text)', 'EXECUTE'),
             ('schema public', 'USAGE'),
             ('table idempotency_records', 'DELETE, INSERT, SELECT, UPDATE')$$,
    'client: the owner calls, lookup and await; SELECT, INSERT, UPDATE, DELETE on the records');
SELECT results_eq($$SELECT * FROM pg_temp.grants_of('regress_idem_sec_reconciler')$$,
    $$VALUES ('function idem_lookup(text,text)', 'EXECUTE'),
             ('function idem_resolve(text,idem_status,jsonb,integer,text,boolean,jsonb)', 'EXECUTE'),
             ('schema public', 'USAGE'),
             ('table idem_outbox', 'SELECT'),
             ('table idempotency_records', 'SELECT, UPDATE'),
             ('view idem_stuck', 'SELECT')$$,
    'reconciler: idem_resolve and lookup; SELECT, UPDATE on the records, SELECT on idem_stuck and the outbox');
SELECT results_eq($$SELECT * FROM pg_temp.grants_of('regress_idem_sec_reader')$$,
    $$VALUES ('function idem_await(text,text,interval)', 'EXECUTE'),
             ('function idem_lookup(text,text)', 'EXECUTE'),
             ('schema public', 'USAGE'),
             ('table idem_outbox', 'SELECT'),
             ('table idempotency_records', 'SELECT'),
             ('view idem_stuck', 'SELECT'),
             ('view idem_summary', 'SELECT')$$,
    'reader: lookup and await; SELECT on the records, the outbox and both views');
SELECT results_eq($$SELECT * FROM pg_temp.grants_of('regress_idem_sec_consumer')$$,
    $$VALUES ('function idem_inbox_accept(text,text,interval,boolean)', 'EXECUTE'),
             ('function idem_inbox_accept_many(text,text[],interval,boolean)', 'EXECUTE'),
             ('function idem_inbox_accept_seq(text,text,bigint,boolean)', 'EXECUTE'),
             ('function idem_inbox_accept_seq(text,text,bigint,integer,boolean)', 'EXECUTE'),
             ('function idem_inbox_accept_seq_many(text,text,bigint[],boolean)', 'EXECUTE'),
             ('function idem_inbox_watermark(text,text)', 'EXECUTE'),
             ('schema public', 'USAGE'),
             ('table idem_inbox', 'INSERT, SELECT, UPDATE'),
             ('table idem_inbox_streams', 'INSERT, SELECT, UPDATE')$$,
    'consumer: the inbox functions; SELECT, INSERT, UPDATE on the two inbox tables');
SELECT results_eq($$SELECT * FROM pg_temp.grants_of('regress_idem_sec_maint')$$,
    $$VALUES ('function idem_purge(integer,integer)', 'EXECUTE'),
             ('function idem_schedule_purge(text,integer,integer)', 'EXECUTE'),
             ('function idem_unschedule_purge()', 'EXECUTE'),
             ('schema public', 'USAGE'),
             ('sequence idem_token_epoch', 'USAGE'),
             ('table idem_inbox', 'DELETE, SELECT, UPDATE'),
             ('table idem_outbox', 'DELETE, SELECT, UPDATE'),
             ('table idempotency_records', 'DELETE, SELECT, UPDATE')$$,
    'maintenance: idem_purge and its pg_cron schedule; SELECT, UPDATE, DELETE on the records, the inbox and the outbox; USAGE on the epoch');
SELECT results_eq($$SELECT * FROM pg_temp.grants_of('regress_idem_sec_madmin')$$,
    $$VALUES ('function idem_attach_machine(regclass,name,text,boolean,boolean)', 'EXECUTE'),
             ('function idem_define_machine(text,jsonb,text[])', 'EXECUTE'),
             ('function idem_detach_machine(regclass,name)', 'EXECUTE'),
             ('function idem_drop_machine(text)', 'EXECUTE'),
             ('schema public', 'USAGE'),
             ('table idem_machine_moves', 'DELETE, INSERT, UPDATE'),
             ('table idem_machines', 'DELETE, INSERT, UPDATE')$$,
    'machine_admin: define, drop, attach, detach; INSERT, UPDATE, DELETE on the definitions');
SELECT results_eq($$SELECT * FROM pg_temp.grants_of('regress_idem_sec_monitor')$$,
    $$VALUES ('function idem_stats_reset()', 'EXECUTE'),
             ('schema public', 'USAGE'),
             ('table idem_outbox', 'SELECT'),
             ('table idempotency_records', 'SELECT'),
             ('view idem_stuck', 'SELECT'),
             ('view idem_summary', 'SELECT')$$,
    'monitor: idem_stats_reset; SELECT on the records, the outbox and both views');
SELECT results_eq($$SELECT * FROM pg_temp.grants_of('regress_idem_sec_emitter')$$,
    $$VALUES ('function idem_outbox_emit(text,text,jsonb,text,jsonb,text,interval)', 'EXECUTE'),
             ('function idem_outbox_emit_batch(text,text[],jsonb[],text[],jsonb[],text,interval)', 'EXECUTE'),
             ('schema public', 'USAGE'),
             ('sequence idem_outbox_seq', 'USAGE')$$,
    'emitter: the two emits; USAGE on the outbox''s seq');
SELECT results_eq($$SELECT attname::text COLLATE "default" FROM pg_attribute
                    WHERE attrelid = 'idem_outbox'::regclass AND attnum > 0
                      AND has_column_privilege('regress_idem_sec_emitter', attrelid, attnum, 'INSERT')
                    ORDER BY attnum$$,
    $$VALUES ('id'), ('created_at'), ('available_at'), ('updated_at'), ('scope'), ('aggregatetype'),
             ('aggregateid'), ('type'), ('headers'), ('payload')$$,
    'and INSERT on the columns an emit sets, not on seq, status, token, lease, attempts, relay or last_error');
SELECT results_eq($$SELECT * FROM pg_temp.grants_of('regress_idem_sec_relay')$$,
    $$VALUES ('function idem_outbox_ack(uuid[],bigint)', 'EXECUTE'),
             ('function idem_outbox_check_token(uuid,bigint,text)', 'EXECUTE'),
             ('function idem_outbox_claim(text,integer,interval,text[])', 'EXECUTE'),
             ('function idem_outbox_counted(text,bigint)', 'EXECUTE'),
             ('function idem_outbox_lock_key(text,text,text)', 'EXECUTE'),
             ('function idem_outbox_nack(uuid,bigint,jsonb,interval)', 'EXECUTE'),
             ('function idem_outbox_retry(uuid)', 'EXECUTE'),
             ('schema public', 'USAGE'),
             ('sequence idem_outbox_seq', 'USAGE'),
             ('sequence idem_outbox_token', 'USAGE'),
             ('table idem_outbox', 'SELECT, UPDATE')$$,
    'relay: claim, ack, nack, retry; SELECT, UPDATE on the outbox, USAGE on its sequences');

-- who may call what: the privilege matrix
CREATE FUNCTION pg_temp.allowed_calls(role name) RETURNS SETOF text LANGUAGE plpgsql AS $fn$
BEGIN
    EXECUTE format('SET LOCAL ROLE %I', role);
    RETURN QUERY SELECT c.signature FROM calls c WHERE pg_temp.allowed(c.sql) ORDER BY 1;
    RESET ROLE;
END
$fn$;
SELECT is_empty($$SELECT c COLLATE "default" FROM pg_temp.allowed_calls('regress_idem_sec_nobody') c$$,
                'a role without rights is refused every one of these functions (42501)');
SELECT is_empty($$SELECT c COLLATE "default" FROM pg_temp.allowed_calls('regress_idem_sec_exec') c$$,
                'EXECUTE without table privileges is not enough: the functions run as the caller (42501)');
SELECT results_eq($$SELECT c COLLATE "default" FROM pg_temp.allowed_calls('regress_idem_sec_client') c$$,
    $$VALUES ('idem_await(text,text,interval)'), ('idem_checkpoint(text,bigint,text,interval,text)'),
             ('idem_claim(text,bytea,interval,text,interval,boolean)'), ('idem_complete(text,bigint,jsonb,integer,text,jsonb)'),
             ('idem_fail(text,bigint,jsonb,boolean,text,integer,jsonb)'), ('idem_lookup(text,text)'),
             ('idem_mark_unknown(text,bigint,jsonb,text)'), ('idem_release(text,bigint,text)')$$,
    'client: claim, the owner calls, lookup and await; nothing else');
SELECT results_eq($$SELECT c COLLATE "default" FROM pg_temp.allowed_calls('regress_idem_sec_reader') c$$,
    $$VALUES ('idem_await(text,text,interval)'), ('idem_lookup(text,text)')$$, 'reader: lookup and await');
SELECT results_eq($$SELECT c COLLATE "default" FROM pg_temp.allowed_calls('regress_idem_sec we''ird; role') c$$,
    $$VALUES ('idem_await(text,text,interval)'), ('idem_lookup(text,text)')$$,
    'the role with the odd name got what a reader gets');
SELECT results_eq($$SELECT c COLLATE "default" FROM pg_temp.allowed_calls('regress_idem_sec_reconciler') c$$,
    $$VALUES ('idem_lookup(text,text)'), ('idem_resolve(text,idem_status,jsonb,integer,text,boolean,jsonb)')$$,
    'reconciler: resolve and lookup');
SELECT results_eq($$SELECT c COLLATE "default" FROM pg_temp.allowed_calls('regress_idem_sec_consumer') c$$,
    $$VALUES ('idem_inbox_accept(text,text,interval,boolean)'), ('idem_inbox_accept_many(text,text[],interval,boolean)'),
             ('idem_inbox_accept_seq(text,text,bigint,boolean)'),
             ('idem_inbox_accept_seq(text,text,bigint,integer,boolean)'),
             ('idem_inbox_accept_seq_many(text,text,bigint[],boolean)'), ('idem_inbox_watermark(text,text)')$$,
    'consumer: the inbox functions');
SELECT results_eq($$SELECT c COLLATE "default" FROM pg_temp.allowed_calls('regress_idem_sec_maint') c$$,
    $$VALUES ('idem_purge(integer,integer)'), ('idem_schedule_purge(text,integer,integer)'),
             ('idem_unschedule_purge()')$$, 'maintenance: idem_purge and its pg_cron schedule');
SELECT results_eq($$SELECT c COLLATE "default" FROM pg_temp.allowed_calls('regress_idem_sec_madmin') c$$,
    $$VALUES ('idem_define_machine(text,jsonb,text[])'), ('idem_drop_machine(text)')$$,
    'machine_admin: define and drop; attach needs TRIGGER on the table, detach its ownership (below)');
SELECT results_eq($$SELECT c COLLATE "default" FROM pg_temp.allowed_calls('regress_idem_sec_monitor') c$$,
    $$VALUES ('idem_stats_reset()')$$, 'monitor: idem_stats_reset');
SELECT results_eq($$SELECT c COLLATE "default" FROM pg_temp.allowed_calls('regress_idem_sec_emitter') c$$,
    $$VALUES ('idem_outbox_emit(text,text,jsonb,text,jsonb,text,interval)'),
             ('idem_outbox_emit_batch(text,text[],jsonb[],text[],jsonb[],text,interval)')$$,
    'emitter: the two emits');
SELECT results_eq($$SELECT c COLLATE "default" FROM pg_temp.allowed_calls('regress_idem_sec_relay') c$$,
    $$VALUES ('idem_outbox_ack(uuid[],bigint)'), ('idem_outbox_check_token(uuid,bigint,text)'),
             ('idem_outbox_claim(text,integer,interval,text[])'), ('idem_outbox_counted(text,bigint)'),
             ('idem_outbox_lock_key(text,text,text)'),
             ('idem_outbox_nack(uuid,bigint,jsonb,interval)'), ('idem_outbox_retry(uuid)')$$,
    'relay: claim, ack, nack, retry and their helpers');

-- a few of these spelled out, with their messages
SET LOCAL ROLE regress_idem_sec_nobody;
SELECT throws_ok($$SELECT * FROM idem_claim('sec.n', '\x01')$$, '42501', 'permission denied for function idem_claim',
                 'no rights: idem_claim is refused');
SELECT throws_ok($$SELECT * FROM idem_lookup('sec.n')$$, '42501', 'permission denied for function idem_lookup',
                 'no rights: idem_lookup is refused');
SELECT throws_ok($$SELECT count(*) FROM idempotency_records$$, '42501', 'permission denied for table idempotency_records',
                 'no rights: the records are not readable');
SELECT throws_ok($$SELECT count(*) FROM idem_inbox$$, '42501', NULL, 'nor the inbox');
SELECT throws_ok($$SELECT count(*) FROM idem_inbox_streams$$, '42501', NULL, 'nor the watermarks');
SELECT throws_ok($$SELECT count(*) FROM idem_stuck$$, '42501', NULL, 'nor idem_stuck');
SELECT throws_ok($$SELECT count(*) FROM idem_summary$$, '42501', NULL, 'nor idem_summary');
SELECT throws_ok($$INSERT INTO idem_machines (name, states) VALUES ('sec.x', '{a}')$$, '42501', NULL,
                 'no rights: the definitions are not writable');
SELECT throws_ok($$SELECT nextval('idem_token_epoch')$$, '42501', NULL, 'nor is the token epoch');
SELECT throws_ok($$SELECT idem_transition('sec_plain', '1', 'b')$$, '42501', 'permission denied for table sec_plain',
                 'idem_transition (executable by PUBLIC) checks the caller''s UPDATE privilege on the table');
SELECT lives_ok($$SELECT count(*) FROM idem_machines$$, 'the definitions are readable by everyone');
RESET ROLE;

SET LOCAL ROLE regress_idem_sec_client;
SELECT throws_ok($$SELECT idem_purge()$$, '42501', NULL, 'client: idem_purge is refused');
SELECT throws_ok($$SELECT idem_define_machine('sec.m', '{"a": ["b"]}')$$, '42501', NULL, 'client: idem_define_machine is refused');
SELECT throws_ok($$SELECT idem_resolve('sec.n', 'succeeded')$$, '42501', NULL, 'client: idem_resolve is refused');
SELECT throws_ok($$SELECT idem_inbox_accept('sec.c', 'm')$$, '42501', NULL, 'client: the inbox is refused');
SELECT throws_ok($$UPDATE idem_machines SET states = states$$, '42501', NULL, 'client: the definitions are not writable');
RESET ROLE;

-- each kind at work
SET LOCAL ROLE regress_idem_sec_client;
SELECT outcome AS c1_outcome, token AS c1_token FROM idem_claim('sec.c1', '\x01', '1 hour') \gset
SELECT is(:'c1_outcome'::text, 'new', 'client: claims a key');
SELECT lives_ok(format($$SELECT idem_checkpoint('sec.c1', %s, 'half way')$$, :c1_token), 'client: checkpoints it');
SELECT lives_ok(format($$SELECT idem_complete('sec.c1', %s, '{"ok": 1}', 201)$$, :c1_token), 'client: completes it');
SELECT results_eq($$SELECT outcome, result FROM idem_claim('sec.c1', '\x01')$$, $$VALUES ('replay', '{"ok": 1}'::jsonb)$$,
                  'client: a second claim replays it');
SELECT is((SELECT status::text FROM idem_lookup('sec.c1')), 'succeeded', 'client: looks it up');
SELECT is((SELECT status::text FROM idem_await('sec.c1', '', '0')), 'succeeded', 'client: awaits it');
SELECT lives_ok($$SELECT idem_fail('sec.c2', (SELECT token FROM idem_claim('sec.c2', '\x01')), '{"e": 1}')$$,
                'client: fails a claim');
SELECT lives_ok($$SELECT idem_release('sec.c3', (SELECT token FROM idem_claim('sec.c3', '\x01')))$$,
                'client: releases a claim');
SELECT is((SELECT outcome FROM idem_claim('sec.c3', '\x02')), 'new',
          'client: claims a released key again (DELETE and INSERT)');
SELECT lives_ok($$SELECT idem_mark_unknown('sec.c4', (SELECT token FROM idem_claim('sec.c4', '\x01')), '{"timeout": true}')$$,
                'client: marks an outcome unknown');
SELECT throws_ok($$SELECT idem_resolve('sec.c4', 'succeeded')$$, '42501', 'permission denied for function idem_resolve',
                 'client: cannot resolve it');
RESET ROLE;

SET LOCAL ROLE regress_idem_sec_reader;
SELECT is((SELECT result FROM idem_lookup('sec.c1')), '{"ok": 1}'::jsonb, 'reader: looks a record up');
SELECT is((SELECT count(*) FROM idem_stuck WHERE key = 'sec.c4'), 1::bigint, 'reader: sees the unknown outcome in idem_stuck');
SELECT throws_ok($$SELECT * FROM idem_claim('sec.r1', '\x01')$$, '42501', NULL, 'reader: cannot claim');
SELECT throws_ok($$UPDATE idempotency_records SET result = '{}' WHERE key = 'sec.c1'$$, '42501', NULL,
                 'reader: cannot write the table');
RESET ROLE;

SET LOCAL ROLE regress_idem_sec_reconciler;
SELECT lives_ok($$SELECT idem_resolve('sec.c4', 'failed', '{"reconciled": true}')$$, 'reconciler: resolves the unknown outcome');
SELECT throws_ok($$SELECT * FROM idem_claim('sec.r1', '\x01')$$, '42501', NULL, 'reconciler: cannot claim');
RESET ROLE;

SET LOCAL ROLE regress_idem_sec_consumer;
SELECT results_eq($$SELECT idem_inbox_accept('sec.c', 'm1'), idem_inbox_accept('sec.c', 'm1')$$,
                  $$VALUES (true, false)$$, 'consumer: accepts a message, then knows it as a duplicate');
SELECT results_eq($$SELECT idem_inbox_accept_seq('sec.c', 's', 1), idem_inbox_accept_seq('sec.c', 'b', 7, 3)$$,
                  $$VALUES ('new', 'new')$$, 'consumer: accepts sequence numbers (both forms)');
SELECT is(idem_inbox_watermark('sec.c', 's'), 1::bigint, 'consumer: reads a watermark');
SELECT throws_ok($$SELECT idem_purge()$$, '42501', NULL, 'consumer: cannot purge');
RESET ROLE;

-- expired: sec.c1's record and the message m1
UPDATE idempotency_records SET expires_at = now() - interval '1 day', purge_after = now() - interval '1 day'
WHERE key = 'sec.c1';
UPDATE idem_inbox SET expires_at = now() - interval '1 day' WHERE consumer = 'sec.c';
SET LOCAL ROLE regress_idem_sec_maint;
SELECT is(idem_purge(), 2::bigint, 'maintenance: purges the expired record and message');
SELECT throws_ok($$SELECT * FROM idem_claim('sec.r1', '\x01')$$, '42501', NULL, 'maintenance: cannot claim');
SELECT throws_ok($$SELECT idem_inbox_accept('sec.c', 'm2')$$, '42501', NULL, 'maintenance: cannot accept messages');
RESET ROLE;

SET LOCAL ROLE regress_idem_sec_monitor;
SELECT ok((SELECT count(*) FROM idem_summary) > 0, 'monitor: reads idem_summary');
SELECT isnt(pg_temp.sqlstate_of('SELECT idem_stats_reset()'), '42501',
            'monitor: may reset the statistics (55000 when the library is not preloaded)');
SELECT throws_ok($$SELECT * FROM idem_lookup('sec.c1')$$, '42501', NULL, 'monitor: cannot call idem_lookup');
RESET ROLE;

-- machine_admin: define and drop; attach needs TRIGGER on the table, detach its ownership
CREATE TABLE sec_madmin_own (id int PRIMARY KEY, st text);
ALTER TABLE sec_madmin_own OWNER TO regress_idem_sec_madmin;
SET LOCAL ROLE regress_idem_sec_madmin;
SELECT lives_ok($$SELECT idem_define_machine('sec.m2', '{"a": ["b"]}')$$, 'machine_admin: defines a machine');
SELECT lives_ok($$SELECT idem_attach_machine('sec_madmin_own', 'st', 'sec.m2')$$, 'machine_admin: attaches it to a table it owns');
SELECT throws_ok($$SELECT idem_attach_machine('sec_plain', 'st', 'sec.m2')$$, '42501', 'permission denied for table sec_plain',
                 'machine_admin: cannot attach to a table without TRIGGER privilege');
SELECT throws_ok($$SELECT idem_detach_machine('sec_attached', 'st')$$, '42501', 'must be owner of relation sec_attached',
                 'machine_admin: cannot detach from a table it does not own');
SELECT lives_ok($$SELECT idem_detach_machine('sec_madmin_own', 'st')$$, 'machine_admin: detaches from its own table');
SELECT lives_ok($$SELECT idem_drop_machine('sec.m2')$$, 'machine_admin: drops the machine');
SELECT throws_ok($$SELECT * FROM idem_claim('sec.r1', '\x01')$$, '42501', NULL, 'machine_admin: cannot claim');
SELECT throws_ok($$SELECT idem_purge()$$, '42501', NULL, 'machine_admin: cannot purge');
RESET ROLE;
-- the regclass arguments: the caller's own privileges on the table decide
GRANT TRIGGER ON sec_plain TO regress_idem_sec_madmin;
SET LOCAL ROLE regress_idem_sec_madmin;
SELECT throws_ok($$SELECT idem_attach_machine('sec_plain', 'st', 'sec.m')$$, '42501', 'permission denied for table sec_plain',
                 'with TRIGGER but without SELECT, attach (validate => true) is refused');
SELECT lives_ok($$SELECT idem_attach_machine('sec_plain', 'st', 'sec.m', validate => false)$$,
                'with TRIGGER, attach without validation works');
RESET ROLE;
SELECT idem_detach_machine('sec_plain', 'st');
GRANT SELECT ON sec_plain TO regress_idem_sec_madmin;
SET LOCAL ROLE regress_idem_sec_madmin;
SELECT throws_ok($$SELECT idem_attach_machine('sec_plain', 'st', 'sec.m', log => true)$$, '42501',
                 'permission denied for schema public',
                 'with log => true, the caller needs CREATE on the table''s schema');
RESET ROLE;
-- idem_transition with UPDATE but not SELECT on the table
GRANT UPDATE ON sec_attached TO regress_idem_sec_client;
INSERT INTO sec_attached VALUES (1, 'a');
SET LOCAL ROLE regress_idem_sec_client;
SELECT throws_ok($$SELECT idem_transition('sec_attached', '1', 'b')$$, '42501', 'permission denied for table sec_attached',
                 'idem_transition needs SELECT as well as UPDATE on the table');
RESET ROLE;
GRANT SELECT ON sec_attached TO regress_idem_sec_client;
SET LOCAL ROLE regress_idem_sec_client;
SELECT is(idem_transition('sec_attached', '1', 'b'), 'applied', 'with both, it moves the row');
RESET ROLE;

-- idem_grant's arguments
SELECT throws_ok($$SELECT idem_grant('superuser', 'regress_idem_sec_nobody')$$, '22023', 'unknown kind of user "superuser"',
                 'idem_grant refuses an unknown kind');
SELECT throws_ok($$SELECT idem_grant(NULL, 'regress_idem_sec_nobody')$$, '22004', NULL, 'idem_grant refuses a NULL kind');
SELECT throws_ok($$SELECT idem_grant('client', NULL)$$, '22004', NULL, 'idem_grant refuses a NULL role');
SELECT throws_ok($$SELECT idem_grant('client', 'regress_idem_sec_no_such_role')$$, '42704', NULL,
                 'idem_grant refuses a role that does not exist');
SELECT throws_ok($$SELECT idem_grant('client', 'public')$$, '42704', NULL, 'PUBLIC is no role idem_grant grants to');
SELECT is_empty($$SELECT * FROM pg_temp.grants_of('regress_idem_sec_nobody')$$, 'none of these granted anything');
-- a role that may execute idem_grant but holds no grant options hands out nothing
SET LOCAL ROLE regress_idem_sec_exec;
SET LOCAL client_min_messages = error;     -- GRANT without grant options warns before it fails
SELECT throws_ok($$SELECT idem_grant('client', 'regress_idem_sec_nobody')$$, '42501', NULL,
                 'idem_grant runs with the caller''s privileges: without grant options it fails');
SELECT throws_ok($$SELECT idem_tenant_isolation()$$, '42501', 'permission denied for table idem_settings',
                 'and so does idem_tenant_isolation for a role that may not write the settings');
RESET ROLE;
RESET client_min_messages;
SELECT is_empty($$SELECT * FROM pg_temp.grants_of('regress_idem_sec_nobody')$$, 'still nothing granted');

-- idem_revoke_all
SELECT lives_ok($$SELECT idem_grant('reader', 'regress_idem_sec_client')$$, 'a second kind for the client role');
SELECT lives_ok($$SELECT idem_revoke_all('regress_idem_sec_client')$$, 'idem_revoke_all');
SELECT is_empty($$SELECT * FROM pg_temp.grants_of('regress_idem_sec_client')$$,
                'idem_revoke_all leaves the role no privilege on the extension''s objects or schema');
SELECT is_empty($$SELECT c COLLATE "default" FROM pg_temp.allowed_calls('regress_idem_sec_client') c$$,
                'and the former client is refused every function');
SELECT lives_ok($$SELECT idem_revoke_all('"regress_idem_sec we''ird; role"')$$, 'idem_revoke_all of the odd name');
SELECT is_empty($$SELECT * FROM pg_temp.grants_of('regress_idem_sec we''ird; role')$$, 'which has nothing left either');
SELECT throws_ok($$SELECT idem_revoke_all(NULL)$$, '22004', 'grantee must not be NULL',
                 'idem_revoke_all(NULL) is an error, like every NULL argument of the API');
SELECT isnt_empty($$SELECT * FROM pg_temp.grants_of('regress_idem_sec_reader')$$,
                  'the other roles keep theirs');

-- 3. tenant isolation ----------------------------------------------------------------------------
-- The C code reads the record through the primary key without the executor
-- only for a role with table-level SELECT and no policy in force; any other
-- role goes through SPI, which applies column privileges and policies.
CREATE ROLE regress_idem_sec_colsel;
GRANT EXECUTE ON FUNCTION idem_lookup(text, text), idem_claim(text, bytea, interval, text, interval, boolean)
    TO regress_idem_sec_colsel;
GRANT SELECT (scope, key), INSERT ON idempotency_records TO regress_idem_sec_colsel;
SET LOCAL ROLE regress_idem_sec_colsel;
SELECT throws_ok($$SELECT * FROM idem_lookup('sec.c3')$$, '42501', 'permission denied for table idempotency_records',
                 'SELECT on two columns only: idem_lookup is refused (no direct read of the whole row)');
SELECT throws_ok($$SELECT * FROM idem_claim('sec.c3', '\x02')$$, '42501', 'permission denied for table idempotency_records',
                 'and so is idem_claim');
RESET ROLE;
GRANT SELECT ON idempotency_records TO regress_idem_sec_colsel;
SET LOCAL ROLE regress_idem_sec_colsel;
SELECT is((SELECT count(*) FROM idem_lookup('sec.c3')), 1::bigint, 'with SELECT on the table, the same lookup works');
RESET ROLE;

-- tokens below start at 1
DO $$ BEGIN PERFORM setval('idem_token_epoch', 1, false); END $$;
CREATE ROLE regress_idem_sec_ta;
CREATE ROLE regress_idem_sec_tb;
DO $$
BEGIN
    PERFORM idem_grant(k, r)
    FROM unnest('{client,reconciler,consumer,maintenance,monitor}'::text[]) k,
         unnest('{regress_idem_sec_ta,regress_idem_sec_tb}'::regrole[]) r;
END
$$;
SELECT results_eq($$SELECT relname::text COLLATE "default", relrowsecurity, relforcerowsecurity FROM pg_class
                    WHERE oid IN ('idempotency_records'::regclass, 'idem_inbox'::regclass, 'idem_inbox_streams'::regclass)
                    ORDER BY 1$$,
                  $$VALUES ('idem_inbox', false, false), ('idem_inbox_streams', false, false),
                           ('idempotency_records', false, false)$$,
                  'after the install, row-level security is off');
SELECT lives_ok($$SELECT idem_tenant_isolation()$$, 'idem_tenant_isolation() turns tenant isolation on');
SELECT results_eq($$SELECT relname::text COLLATE "default", relrowsecurity, relforcerowsecurity FROM pg_class
                    WHERE oid IN ('idempotency_records'::regclass, 'idem_inbox'::regclass, 'idem_inbox_streams'::regclass)
                    ORDER BY 1$$,
                  $$VALUES ('idem_inbox', true, true), ('idem_inbox_streams', true, true),
                           ('idempotency_records', true, true)$$,
                  'row-level security is enabled and forced on the three tables');

-- tenant B's records and messages, written by B under isolation
SET LOCAL ROLE regress_idem_sec_tb;
SET LOCAL idempotency.scope = 'tB';
SELECT lives_ok($$SELECT idem_complete('sec.t1', (SELECT token FROM idem_claim('sec.t1', '\x0b', scope => 'tB')),
                                       '{"secret": "b"}', scope => 'tB')$$, 'B: claims and completes sec.t1');
SELECT token AS b2_token FROM idem_claim('sec.t2', '\x0b', '1 hour', scope => 'tB') \gset
SELECT lives_ok($$SELECT idem_mark_unknown('sec.t3', (SELECT token FROM idem_claim('sec.t3', '\x0b', scope => 'tB')),
                                           '{"b": "timeout"}', scope => 'tB')$$, 'B: an unknown outcome');
SELECT lives_ok($$SELECT idem_complete('sec.t4', (SELECT token FROM idem_claim('sec.t4', '\x0b', scope => 'tB')),
                                       scope => 'tB')$$, 'B: sec.t4, which will expire');
SELECT results_eq($$SELECT idem_inbox_accept('tB/orders', 'm1'), idem_inbox_accept('tB', 'm2'),
                           idem_inbox_accept_seq('tB/orders', 's', 5)$$,
                  $$VALUES (true, true, 'new')$$, 'B: accepts messages as "tB" and "tB/orders"');
SELECT is((SELECT count(*) FROM idempotency_records), 4::bigint, 'B sees its four records');
RESET ROLE;
-- tenant A's
SET LOCAL ROLE regress_idem_sec_ta;
SET LOCAL idempotency.scope = 'tA';
SELECT lives_ok($$SELECT idem_complete('sec.t1', (SELECT token FROM idem_claim('sec.t1', '\x0a', scope => 'tA')),
                                       '{"secret": "a"}', scope => 'tA')$$, 'A: the same key in its own scope');
SELECT lives_ok($$SELECT idem_mark_unknown('sec.t3', (SELECT token FROM idem_claim('sec.t3', '\x0a', scope => 'tA')),
                                           '{"a": "timeout"}', scope => 'tA')$$, 'A: an unknown outcome');
SELECT lives_ok($$SELECT idem_complete('sec.t4', (SELECT token FROM idem_claim('sec.t4', '\x0a', scope => 'tA')),
                                       scope => 'tA')$$, 'A: sec.t4, which will expire');
SELECT is(idem_inbox_accept('tA/orders', 'm1'), true, 'A: accepts a message as "tA/orders"');
RESET ROLE;
UPDATE idempotency_records SET expires_at = now() - interval '1 day', purge_after = now() - interval '1 day'
WHERE key = 'sec.t4';
UPDATE idem_inbox SET expires_at = now() - interval '1 day' WHERE message_id = 'm1' AND consumer IN ('tA/orders', 'tB/orders');
SELECT results_eq($$SELECT scope COLLATE "default", count(*) FROM idempotency_records WHERE key LIKE 'sec.t%' GROUP BY scope ORDER BY 1$$,
                  $$VALUES ('tA', 3::bigint), ('tB', 4)$$,
                  'a superuser bypasses row-level security: it sees both tenants');

SET LOCAL ROLE regress_idem_sec_ta;
SET LOCAL idempotency.scope = 'tA';
SELECT results_eq($$SELECT DISTINCT scope COLLATE "default" FROM idempotency_records$$, $$VALUES ('tA')$$,
                  'A reads only its own scope from the table');
SELECT is_empty($$SELECT * FROM idem_lookup('sec.t1', 'tB')$$, 'A cannot look up B''s record');
SELECT is((SELECT result FROM idem_lookup('sec.t1', 'tA')), '{"secret": "a"}'::jsonb, 'A looks up its own');
SELECT throws_ok($$SELECT * FROM idem_claim('sec.t1', '\x0b', scope => 'tB')$$, '42501',
                 'scope "tB" does not belong to the tenant of this session',
                 'A cannot replay B''s record: the claim fails with 42501, no result is returned');
SELECT throws_ok($$SELECT * FROM idem_claim('sec.t9', '\x0b', scope => 'tB')$$, '42501', NULL,
                 'A cannot create a record in B''s scope');
SELECT throws_ok($$SELECT * FROM idem_claim('sec.t2', '\x0b', scope => 'tB', wait => false)$$, '42501', NULL,
                 'a wait => false claim of B''s processing key fails the same way, it does not answer in_progress');
SELECT throws_ok(format($$SELECT idem_complete('sec.t2', %s, '{"forged": true}', scope => 'tB')$$, :b2_token),
                 'IK004', 'idempotency key "sec.t2" does not exist',
                 'A cannot complete B''s record, even with B''s token: for A it does not exist');
SELECT throws_ok(format($$SELECT idem_fail('sec.t2', %s, '{}', scope => 'tB')$$, :b2_token), 'IK004', NULL, 'nor fail it');
SELECT throws_ok(format($$SELECT idem_checkpoint('sec.t2', %s, 'x', scope => 'tB')$$, :b2_token), 'IK004', NULL,
                 'nor checkpoint it');
SELECT throws_ok(format($$SELECT idem_release('sec.t2', %s, scope => 'tB')$$, :b2_token), 'IK004', NULL, 'nor release it');
SELECT throws_ok(format($$SELECT idem_mark_unknown('sec.t2', %s, '{}', scope => 'tB')$$, :b2_token), 'IK004', NULL,
                 'nor mark it unknown');
SELECT throws_ok($$SELECT idem_resolve('sec.t3', 'succeeded', scope => 'tB')$$, 'IK004', NULL,
                 'nor resolve B''s unknown outcome');
SELECT is_empty($$SELECT * FROM idem_await('sec.t1', 'tB', '0')$$, 'idem_await of B''s finished record returns nothing');
SELECT is_empty($$SELECT * FROM idem_await('sec.t2', 'tB', '10 s')$$,
                'idem_await of B''s processing record returns nothing (and does not wait for it)');
SELECT results_eq($$SELECT key COLLATE "default", scope COLLATE "default" FROM idem_stuck WHERE key LIKE 'sec.t%'$$,
                  $$VALUES ('sec.t3', 'tA')$$, 'idem_stuck shows A only its own unknown outcome');
SELECT results_eq($$SELECT DISTINCT scope COLLATE "default" FROM idem_summary$$, $$VALUES ('tA')$$,
                  'idem_summary counts only A''s scope');
SELECT is(idem_purge(), 2::bigint, 'A''s purge deletes A''s expired record and message, and nothing of B''s');
-- the inbox
SELECT throws_ok($$SELECT idem_inbox_accept('tB/orders', 'm1')$$, '42501',
                 'new row violates row-level security policy for table "idem_inbox"',
                 'A cannot accept a message as B''s consumer "tB/orders"');
SELECT throws_ok($$SELECT idem_inbox_accept('tB', 'm3')$$, '42501', NULL, 'nor as "tB"');
SELECT throws_ok($$SELECT idem_inbox_accept('tAB', 'm1')$$, '42501', NULL,
                 'nor as "tAB": a consumer belongs to tA only as "tA" or "tA/..."');
SELECT is(idem_inbox_accept('tA', 'm9'), true, 'A accepts as "tA"');
SELECT throws_ok($$SELECT idem_inbox_accept_seq('tB/orders', 's', 6)$$, '42501',
                 'new row violates row-level security policy for table "idem_inbox_streams"',
                 'A cannot advance B''s watermark');
SELECT throws_ok($$SELECT idem_inbox_accept_seq('tB/orders', 's', 5)$$, '42501', NULL,
                 'nor learn that a sequence number is a duplicate for B');
SELECT is(idem_inbox_watermark('tB/orders', 's'), NULL, 'B''s watermark reads as NULL');
SELECT is((SELECT count(*) FROM idem_inbox WHERE consumer NOT LIKE 'tA%'), 0::bigint, 'A reads none of B''s messages');
-- the table itself
SELECT is(pg_temp.row_count($$UPDATE idempotency_records SET result = '{"forged": true}' WHERE scope = 'tB'$$), 0::bigint,
          'an UPDATE of B''s rows changes nothing');
SELECT is(pg_temp.row_count($$DELETE FROM idempotency_records WHERE scope = 'tB'$$), 0::bigint,
          'a DELETE of B''s rows deletes nothing');
-- no record changes scope or key (idem_records_rekeyed, BEFORE the policies' check)
SELECT throws_ok($$UPDATE idempotency_records SET scope = 'tB' WHERE key = 'sec.t1'$$, '0A000', NULL,
                 'A cannot move its own record into B''s scope');
-- without a scope
SET LOCAL idempotency.scope = '';
SELECT is((SELECT count(*) FROM idempotency_records), 0::bigint, 'with idempotency.scope empty, A sees no record');
SELECT throws_ok($$SELECT * FROM idem_claim('sec.t8', '\x0a')$$, '42501', NULL, 'and can write none, not even in scope ''''');
RESET idempotency.scope;
SELECT is((SELECT count(*) FROM idempotency_records), 0::bigint, 'with idempotency.scope reset, none either');
RESET ROLE;
SELECT results_eq($$SELECT scope COLLATE "default", key COLLATE "default", status::text, token, result
                    FROM idempotency_records WHERE scope = 'tB' ORDER BY key$$,
                  format($$VALUES ('tB', 'sec.t1', 'succeeded', 1::bigint, '{"secret": "b"}'::jsonb),
                                  ('tB', 'sec.t2', 'processing', %s, NULL), ('tB', 'sec.t3', 'unknown', 1, NULL),
                                  ('tB', 'sec.t4', 'succeeded', 1, NULL)$$, :b2_token),
                  'B''s records are as B left them, the expired one included');
SELECT results_eq($$SELECT consumer COLLATE "default", message_id COLLATE "default" FROM idem_inbox
                    WHERE consumer LIKE 't%' ORDER BY 1, 2$$,
                  $$VALUES ('tA', 'm9'), ('tB', 'm2'), ('tB/orders', 'm1')$$,
                  'B''s messages are all there, its expired one too; A''s expired one is purged');
SELECT is((SELECT watermark FROM idem_inbox_streams WHERE consumer = 'tB/orders'), 5::bigint, 'B''s watermark is 5');

-- idem_consumer_in_scope
SET LOCAL idempotency.scope = 'tA';
SELECT results_eq($$SELECT c, idem_consumer_in_scope(c) FROM unnest('{tA,tA/x,tA/x/y,tAB,tB/x,tB,"",/tA}'::text[]) c$$,
                  $$VALUES ('tA', true), ('tA/x', true), ('tA/x/y', true), ('tAB', false), ('tB/x', false),
                           ('tB', false), ('', false), ('/tA', false)$$,
                  'a consumer belongs to tenant tA when it is "tA" or starts with "tA/"');
SET LOCAL idempotency.scope = '';
SELECT is_empty($$SELECT c FROM unnest('{tA,tA/x,"",/}'::text[]) c WHERE idem_consumer_in_scope(c)$$,
                'with no scope, no consumer belongs to the session');
RESET idempotency.scope;

-- Policies of one's own.  One that lets a role insert into any scope does
-- not open B's scope to A: the claim's INSERT ... ON CONFLICT (scope, key)
-- needs SELECT on the key columns, so PostgreSQL checks the new row against
-- the SELECT policies too.
CREATE POLICY sec_insert_anywhere ON idempotency_records AS PERMISSIVE FOR INSERT TO regress_idem_sec_ta
    WITH CHECK (true);
SET LOCAL ROLE regress_idem_sec_ta;
SET LOCAL idempotency.scope = 'tA';
SELECT throws_ok($$SELECT * FROM idem_claim('sec.t1', '\x0b', scope => 'tB')$$, '42501',
                 'new row violates row-level security policy for table "idempotency_records"',
                 'a policy that lets A insert anywhere: the claim in B''s scope still fails with 42501');
RESET ROLE;
-- One that also shows A every processing record, whatever its scope: the
-- new row passes, but it conflicts with B's finished record, which A cannot
-- see.  The claim says so instead of retrying into a 40001.
CREATE POLICY sec_see_processing ON idempotency_records AS PERMISSIVE FOR SELECT TO regress_idem_sec_ta
    USING (status = 'processing');
SET LOCAL ROLE regress_idem_sec_ta;
SET LOCAL idempotency.scope = 'tA';
SELECT throws_ok($$SELECT * FROM idem_claim('sec.t1', '\x0b', scope => 'tB')$$, '42501',
                 'idempotency key "sec.t1" exists in scope "tB", but row-level security hides it',
                 'a claim whose INSERT conflicts with a row that a policy hides fails with 42501, not 40001');
RESET ROLE;
DROP POLICY sec_insert_anywhere ON idempotency_records;
DROP POLICY sec_see_processing ON idempotency_records;
SELECT results_eq($$SELECT status::text, result FROM idempotency_records WHERE scope = 'tB' AND key = 'sec.t1'$$,
                  $$VALUES ('succeeded', '{"secret": "b"}'::jsonb)$$, 'and B''s record was not touched');
-- The same for the inbox: A may insert any message, and sees every message
-- kept longer than 30 days; B's message (kept for a day) stays hidden.
SELECT idem_inbox_accept('tB/q', 'sec.hidden');
CREATE POLICY sec_inbox_insert_anywhere ON idem_inbox AS PERMISSIVE FOR INSERT TO regress_idem_sec_ta
    WITH CHECK (true);
CREATE POLICY sec_inbox_see_long ON idem_inbox AS PERMISSIVE FOR SELECT TO regress_idem_sec_ta
    USING (expires_at > now() + interval '30 days');
SET LOCAL ROLE regress_idem_sec_ta;
SET LOCAL idempotency.scope = 'tA';
SELECT throws_ok($$SELECT idem_inbox_accept('tB/q', 'sec.hidden', '60 days')$$, '42501',
                 'message "sec.hidden" of consumer "tB/q" exists, but row-level security hides it',
                 'an accept whose INSERT conflicts with a message that a policy hides fails with 42501, not 40001');
RESET ROLE;
DROP POLICY sec_inbox_insert_anywhere ON idem_inbox;
DROP POLICY sec_inbox_see_long ON idem_inbox;
SELECT cmp_ok((SELECT expires_at FROM idem_inbox WHERE consumer = 'tB/q' AND message_id = 'sec.hidden'),
              '<', now() + interval '2 days', 'and B''s message was not touched');

-- A log table that another role made is refused: its triggers would run as
-- every writer of the governed table.  And the log trigger takes its first
-- argument as a table, never as SQL.
CREATE TABLE sec_logged (id int PRIMARY KEY, st text);
CREATE TABLE sec_logged_state_log (x int);
ALTER TABLE sec_logged_state_log OWNER TO regress_idem_sec_nobody;
SELECT throws_ok($$SELECT idem_attach_machine('sec_logged', 'st', 'sec.m', log => true)$$, '42P07',
                 'log table public.sec_logged_state_log already exists and is not owned by the owner of table public.sec_logged',
                 'attach refuses a log table owned by another role');
ALTER TABLE sec_logged_state_log OWNER TO CURRENT_USER;
DROP TABLE sec_logged_state_log;
CREATE TABLE sec_log_victim (x int);
CREATE TRIGGER sec_handmade_log AFTER INSERT ON sec_logged FOR EACH ROW
    EXECUTE FUNCTION idem_log_transition('sec_log_victim (x) VALUES (1); DROP TABLE sec_log_victim; --', 'st', 'sec.m');
SELECT throws_ok($$INSERT INTO sec_logged VALUES (1, 'a')$$, '42602', NULL,
                 'a log trigger whose table argument carries SQL fails as an invalid name');
SELECT has_table('sec_log_victim', 'and runs none of it');
DROP TABLE sec_logged;

-- idem_transition applies the policies of the governed table
CREATE TABLE sec_tenant_orders (id int PRIMARY KEY, tenant text, st text);
SELECT idem_attach_machine('sec_tenant_orders', 'st', 'sec.m');
INSERT INTO sec_tenant_orders VALUES (1, 'tA', 'a'), (2, 'tB', 'a');
ALTER TABLE sec_tenant_orders ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
CREATE POLICY by_tenant ON sec_tenant_orders USING (tenant = current_setting('idempotency.scope', true));
GRANT SELECT, UPDATE ON sec_tenant_orders TO regress_idem_sec_ta;
SET LOCAL ROLE regress_idem_sec_ta;
SET LOCAL idempotency.scope = 'tA';
SELECT throws_ok($$SELECT idem_transition('sec_tenant_orders', '2', 'b')$$, 'P0002',
                 'no row of table "sec_tenant_orders" has key (2)', 'A cannot move B''s row: for A it does not exist');
SELECT is(idem_transition('sec_tenant_orders', '1', 'b'), 'applied', 'A moves its own');
RESET ROLE;
SELECT results_eq($$SELECT id, st FROM sec_tenant_orders ORDER BY id$$, $$VALUES (1, 'b'), (2, 'a')$$,
                  'B''s row did not move');

-- FORCE binds a table owner that is not a superuser
CREATE ROLE regress_idem_sec_owner;
ALTER TABLE idempotency_records OWNER TO regress_idem_sec_owner;
GRANT EXECUTE ON FUNCTION idem_lookup(text, text) TO regress_idem_sec_owner;
SET LOCAL ROLE regress_idem_sec_owner;
SET LOCAL idempotency.scope = 'tA';
SELECT is((SELECT count(*) FROM idempotency_records WHERE scope = 'tB'), 0::bigint,
          'the owner of the table, not a superuser, is bound by the policy (FORCE)');
SELECT is_empty($$SELECT * FROM idem_lookup('sec.t1', 'tB')$$, 'and idem_lookup shows it nothing of B');
RESET ROLE;
ALTER TABLE idempotency_records NO FORCE ROW LEVEL SECURITY;
SET LOCAL ROLE regress_idem_sec_owner;
SET LOCAL idempotency.scope = 'tA';
SELECT is((SELECT count(*) FROM idem_lookup('sec.t1', 'tB')), 1::bigint,
          'without FORCE the owner would see B''s record: FORCE is what binds it');
RESET ROLE;
ALTER TABLE idempotency_records FORCE ROW LEVEL SECURITY;
ALTER TABLE idempotency_records OWNER TO CURRENT_USER;

-- BYPASSRLS
CREATE ROLE regress_idem_sec_bypass BYPASSRLS;
SELECT idem_grant('reader', 'regress_idem_sec_bypass');
SET LOCAL ROLE regress_idem_sec_bypass;
SET LOCAL idempotency.scope = 'tA';
SELECT is((SELECT count(*) FROM idem_lookup('sec.t1', 'tB')), 1::bigint, 'a BYPASSRLS role is not bound');
RESET ROLE;
SELECT is(idem_purge(), 2::bigint,
          'a superuser (the purge worker) is not bound either: its purge removes B''s expired record and message');

-- off again
SELECT lives_ok($$SELECT idem_tenant_isolation(false)$$, 'idem_tenant_isolation(false) turns it off');
SELECT results_eq($$SELECT bool_or(relrowsecurity), bool_or(relforcerowsecurity) FROM pg_class
                    WHERE oid IN ('idempotency_records'::regclass, 'idem_inbox'::regclass, 'idem_inbox_streams'::regclass)$$,
                  $$VALUES (false, false)$$, 'row-level security is off on the three tables');
SET LOCAL ROLE regress_idem_sec_ta;
SET LOCAL idempotency.scope = 'tA';
SELECT is((SELECT count(*) FROM idem_lookup('sec.t1', 'tB')), 1::bigint, 'and A sees B''s record again');
RESET ROLE;

-- 4. search_path -----------------------------------------------------------------------------------
-- A schema "evil", put first on search_path (ahead of pg_catalog, and
-- after it), holds look-alikes of what the extension uses: operators on
-- every type it compares or computes with (and on idem_status, which beat
-- pg_catalog's anyenum ones even behind it), functions, aggregates, types,
-- and views named like the extension's tables and the catalogs.  Each logs
-- its use into sec_canary.log and then behaves like the original, so an
-- attack would go unnoticed but for the log.  Temporary views shadow the
-- extension's tables too (pg_temp comes first for relations).  The whole
-- lifecycle runs under that search_path, as a superuser and as a tenant; the
-- log must stay empty and every result must be right.
CREATE SCHEMA sec_canary;
CREATE TABLE sec_canary.log (what text);
CREATE TABLE sec_canary.x (canary int);      -- the table the hostile names of part 5 try to drop
GRANT USAGE ON SCHEMA sec_canary TO PUBLIC;
GRANT INSERT, SELECT ON sec_canary.log TO PUBLIC;
CREATE SCHEMA evil;
GRANT USAGE ON SCHEMA evil TO PUBLIC;
CREATE FUNCTION evil.log(what text) RETURNS boolean LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO sec_canary.log VALUES (what);
    RETURN true;
END
$$;

-- operators
DO $do$
DECLARE
    o record;
    n int := 0;
BEGIN
    FOR o IN
        SELECT oprname, oprleft::regtype::text AS l, oprright::regtype::text AS r, oprresult::regtype::text AS res
        FROM pg_operator
        WHERE oprnamespace = 'pg_catalog'::regnamespace AND oprkind = 'b'
          AND oprname IN ('=', '<>', '<', '<=', '>', '>=', '+', '-', '||', '~~', '!~~', '->>', '->', '#>>')
          AND oprleft::regtype::text IN ('text', 'bytea', 'bigint', 'integer', 'timestamp with time zone', 'jsonb',
                                         'name', 'oid', 'boolean', 'tid', 'anyenum', 'anyarray', 'interval', 'xid8')
          AND oprright::regtype::text IN ('text', 'bytea', 'bigint', 'integer', 'timestamp with time zone', 'jsonb',
                                          'name', 'oid', 'boolean', 'tid', 'anyenum', 'anyarray', 'interval', 'xid8',
                                          'text[]')
        UNION ALL
        SELECT op, 'idem_status', 'idem_status', 'boolean' FROM unnest('{=,<>,<,<=,>,>=}'::text[]) op
    LOOP
        n := n + 1;
        EXECUTE format('CREATE FUNCTION evil.op_%s(a %s, b %s) RETURNS %s LANGUAGE plpgsql '
                       'SET search_path = pg_catalog, pg_temp AS $f$ BEGIN PERFORM evil.log(%L); '
                       'RETURN a OPERATOR(pg_catalog.%s) b; END $f$',
                       n, o.l, o.r, o.res, format('operator %s(%s, %s)', o.oprname, o.l, o.r), o.oprname);
        EXECUTE format('CREATE OPERATOR evil.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = evil.op_%s)',
                       o.oprname, o.l, o.r, n);
    END LOOP;
END
$do$;

-- functions, each logging its call and then doing what the original does
DO $do$
DECLARE
    f text[];
BEGIN
    FOREACH f SLICE 1 IN ARRAY ARRAY[
        -- name and arguments, result, body
        ['now()', 'timestamptz', 'RETURN pg_catalog.now()'],
        ['clock_timestamp()', 'timestamptz', 'RETURN pg_catalog.clock_timestamp()'],
        ['current_setting(a text)', 'text', 'RETURN pg_catalog.current_setting(a)'],
        ['current_setting(a text, b boolean)', 'text', 'RETURN pg_catalog.current_setting(a, b)'],
        ['nextval(a regclass)', 'bigint', 'RETURN pg_catalog.nextval(a)'],
        ['setval(a regclass, b bigint)', 'bigint', 'RETURN pg_catalog.setval(a, b)'],
        ['pg_sequence_last_value(a regclass)', 'bigint', 'RETURN pg_catalog.pg_sequence_last_value(a)'],
        ['starts_with(a text, b text)', 'boolean', 'RETURN pg_catalog.starts_with(a, b)'],
        ['format(a text)', 'text', 'RETURN pg_catalog.format(a)'],
        ['format(a text, b text)', 'text', 'RETURN pg_catalog.format(a, b)'],
        ['format(a text, b text, c text)', 'text', 'RETURN pg_catalog.format(a, b, c)'],
        ['format(a text, b name, c regclass)', 'text', 'RETURN pg_catalog.format(a, b, c)'],
        ['quote_ident(a text)', 'text', 'RETURN pg_catalog.quote_ident(a)'],
        ['quote_literal(a text)', 'text', 'RETURN pg_catalog.quote_literal(a)'],
        ['concat(a text, b text)', 'text', 'RETURN pg_catalog.concat(a, b)'],
        ['to_jsonb(a anyelement)', 'jsonb', 'RETURN pg_catalog.to_jsonb(a)'],
        ['jsonb_typeof(a jsonb)', 'text', 'RETURN pg_catalog.jsonb_typeof(a)'],
        ['jsonb_build_object(a text, b jsonb)', 'jsonb', 'RETURN pg_catalog.jsonb_build_object(a, b)'],
        ['array_position(a anyarray, b anyelement)', 'integer', 'RETURN pg_catalog.array_position(a, b)'],
        ['cardinality(a anyarray)', 'integer', 'RETURN pg_catalog.cardinality(a)'],
        ['octet_length(a text)', 'integer', 'RETURN pg_catalog.octet_length(a)'],
        ['length(a text)', 'integer', 'RETURN pg_catalog.length(a)'],
        ['md5(a text)', 'text', 'RETURN pg_catalog.md5(a)'],
        ['left(a text, b integer)', 'text', 'RETURN pg_catalog.left(a, b)'],
        ['replace(a text, b text, c text)', 'text', 'RETURN pg_catalog.replace(a, b, c)'],
        ['lower(a text)', 'text', 'RETURN pg_catalog.lower(a)'],
        ['pg_current_xact_id()', 'xid8', 'RETURN pg_catalog.pg_current_xact_id()'],
        ['pg_extension_config_dump(a regclass, b text)', 'void', 'PERFORM pg_catalog.pg_extension_config_dump(a, b)'],
        ['has_table_privilege(a regclass, b text)', 'boolean', 'RETURN pg_catalog.has_table_privilege(a, b)'],
        -- the extension's own functions, as the extension calls them
        ['idem_object_name(a text, b text, c text)', 'name', 'RETURN a || b || c'],
        ['idem_trigger_arg(a bytea, b integer)', 'text', 'RETURN NULL'],
        ['idem_inbox_seq(a bigint, b integer)', 'bigint', 'RETURN a * 1048576 + b'],
        ['idem_consumer_in_scope(a text)', 'boolean', 'RETURN true'],
        ['idem_inbox_accept_seq(a text, b text, c bigint, d boolean)', 'text', 'RETURN ''new'''],
        ['idem_fingerprint(a jsonb)', 'bytea', 'RETURN ''\x00''::bytea']]
    LOOP
        EXECUTE format('CREATE FUNCTION evil.%s RETURNS %s LANGUAGE plpgsql '
                       'SET search_path = pg_catalog, pg_temp AS $f$ BEGIN PERFORM evil.log(%L); %s; END $f$',
                       f[1], f[2], 'function ' || f[1], f[3]);
    END LOOP;
END
$do$;
CREATE FUNCTION evil.jsonb_each(a jsonb) RETURNS TABLE (key text, value jsonb) LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN PERFORM evil.log('function jsonb_each'); RETURN QUERY SELECT * FROM pg_catalog.jsonb_each(a); END $$;
CREATE FUNCTION evil.jsonb_array_elements(a jsonb) RETURNS SETOF jsonb LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN PERFORM evil.log('function jsonb_array_elements'); RETURN QUERY SELECT * FROM pg_catalog.jsonb_array_elements(a); END $$;
CREATE FUNCTION evil.jsonb_array_elements_text(a jsonb) RETURNS SETOF text LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN PERFORM evil.log('function jsonb_array_elements_text'); RETURN QUERY SELECT * FROM pg_catalog.jsonb_array_elements_text(a); END $$;
CREATE FUNCTION evil.unnest(a anyarray) RETURNS SETOF anyelement LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN PERFORM evil.log('function unnest'); RETURN QUERY SELECT * FROM pg_catalog.unnest(a); END $$;
CREATE FUNCTION evil.regexp_split_to_table(a text, b text) RETURNS SETOF text LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN PERFORM evil.log('function regexp_split_to_table'); RETURN QUERY SELECT * FROM pg_catalog.regexp_split_to_table(a, b); END $$;
CREATE FUNCTION evil.idem_machine_states(a text) RETURNS TABLE (state text, initial boolean, terminal boolean)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN PERFORM evil.log('function idem_machine_states'); END $$;
CREATE FUNCTION evil.idem_enforce_transition() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN PERFORM evil.log('function idem_enforce_transition'); RETURN NEW; END $$;
CREATE FUNCTION evil.idem_log_transition() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN PERFORM evil.log('function idem_log_transition'); RETURN NULL; END $$;

-- aggregates
CREATE FUNCTION evil.count_step(s bigint) RETURNS bigint LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN PERFORM evil.log('aggregate count(*)'); RETURN s + 1; END $$;
CREATE AGGREGATE evil.count(*) (SFUNC = evil.count_step, STYPE = bigint, INITCOND = '0');
CREATE FUNCTION evil.sum_step(s bigint, v integer) RETURNS bigint LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN PERFORM evil.log('aggregate sum(integer)'); RETURN coalesce(s, 0) + v; END $$;
CREATE AGGREGATE evil.sum(integer) (SFUNC = evil.sum_step, STYPE = bigint);
CREATE FUNCTION evil.min_step(s timestamptz, v timestamptz) RETURNS timestamptz LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN PERFORM evil.log('aggregate min(timestamptz)'); RETURN least(s, v); END $$;
CREATE AGGREGATE evil.min(timestamptz) (SFUNC = evil.min_step, STYPE = timestamptz);
CREATE FUNCTION evil.string_agg_step(s text, v text, d text) RETURNS text LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN PERFORM evil.log('aggregate string_agg(text, text)'); RETURN CASE WHEN s IS NULL THEN v ELSE s || d || v END; END $$;
CREATE AGGREGATE evil.string_agg(text, text) (SFUNC = evil.string_agg_step, STYPE = text);
CREATE FUNCTION evil.array_agg_step(s text[], v text) RETURNS text[] LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN PERFORM evil.log('aggregate array_agg(text)'); RETURN array_append(s, v); END $$;
CREATE AGGREGATE evil.array_agg(text) (SFUNC = evil.array_agg_step, STYPE = text[]);
CREATE FUNCTION evil.jsonb_object_agg_step(s jsonb, k text, v jsonb) RETURNS jsonb LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN PERFORM evil.log('aggregate jsonb_object_agg(text, jsonb)'); RETURN coalesce(s, '{}') || jsonb_build_object(k, v); END $$;
CREATE AGGREGATE evil.jsonb_object_agg(text, jsonb) (SFUNC = evil.jsonb_object_agg_step, STYPE = jsonb);

-- types
CREATE DOMAIN evil.text AS pg_catalog.text CHECK (evil.log('type text'));
CREATE DOMAIN evil.name AS pg_catalog.name CHECK (evil.log('type name'));
CREATE DOMAIN evil.jsonb AS pg_catalog.jsonb CHECK (evil.log('type jsonb'));
CREATE DOMAIN evil.bytea AS pg_catalog.bytea CHECK (evil.log('type bytea'));
CREATE DOMAIN evil.regclass AS pg_catalog.regclass CHECK (evil.log('type regclass'));
CREATE DOMAIN evil.regprocedure AS pg_catalog.regprocedure CHECK (evil.log('type regprocedure'));
CREATE DOMAIN evil.timestamptz AS pg_catalog.timestamptz CHECK (evil.log('type timestamptz'));
CREATE DOMAIN evil.oid AS pg_catalog.oid CHECK (evil.log('type oid'));
CREATE DOMAIN evil.xid8 AS pg_catalog.xid8 CHECK (evil.log('type xid8'));
CREATE TYPE evil.idem_status AS ENUM ('processing', 'succeeded', 'failed', 'unknown');

-- tables and catalogs, as views that log every read (and, with the check
-- option, every write)
DO $do$
DECLARE
    t text;
BEGIN
    -- (without the pseudo-typed columns some catalogs have)
    FOREACH t IN ARRAY ARRAY['public.idempotency_records', 'public.idem_inbox', 'public.idem_inbox_streams',
                             'public.idem_machines', 'public.idem_machine_moves', 'public.idem_attached_machines',
                             'public.idem_stuck', 'public.idem_summary',
                             'pg_catalog.pg_trigger', 'pg_catalog.pg_class', 'pg_catalog.pg_attribute',
                             'pg_catalog.pg_index', 'pg_catalog.pg_namespace', 'pg_catalog.pg_depend',
                             'pg_catalog.pg_proc', 'pg_catalog.pg_extension', 'pg_catalog.pg_type']
    LOOP
        EXECUTE format('CREATE VIEW evil.%I AS SELECT %s FROM %s WHERE evil.log(%L)%s',
                       split_part(t, '.', 2),
                       (SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute
                        WHERE attrelid = t::regclass AND attnum > 0 AND NOT attisdropped
                          AND atttypid <> 'anyarray'::regtype),
                       t, 'relation ' || t,
                       CASE WHEN t LIKE 'public.idem%' AND t NOT IN ('public.idem_attached_machines', 'public.idem_stuck',
                                                                    'public.idem_summary')
                            THEN ' WITH CASCADED CHECK OPTION' ELSE '' END);
        EXECUTE format('GRANT ALL ON evil.%I TO PUBLIC', split_part(t, '.', 2));
        IF t LIKE 'public.idem%' THEN
            EXECUTE format('CREATE TEMP VIEW %I AS SELECT * FROM %s WHERE evil.log(%L)',
                           split_part(t, '.', 2), t, 'temporary relation ' || t);
            EXECUTE format('GRANT ALL ON pg_temp.%I TO PUBLIC', split_part(t, '.', 2));
        END IF;
    END LOOP;
END
$do$;
CREATE SEQUENCE evil.idem_token_epoch;
GRANT ALL ON SEQUENCE evil.idem_token_epoch TO PUBLIC;

-- The planted objects are live: unqualified names on this search_path find them.
SET LOCAL search_path = evil, pg_catalog, public;
SELECT count(*) FROM idempotency_records \g /dev/null
SELECT 'a'::pg_catalog.text = 'b'::pg_catalog.text, now(), 'x'::text, 'processing'::public.idem_status = 'failed' \g /dev/null
SET LOCAL search_path = evil, public;
SELECT 'processing'::public.idem_status = 'failed'::public.idem_status, pg_catalog.count(*) FROM idem_machines \g /dev/null
RESET search_path;
SELECT set_has($$SELECT DISTINCT what COLLATE "default" FROM sec_canary.log$$,
               $$VALUES ('temporary relation public.idempotency_records'), ('temporary relation public.idem_machines'),
                        ('aggregate count(*)'), ('function now()'), ('operator =(text, text)'), ('type text'),
                        ('operator =(idem_status, idem_status)')$$,
               'premise: on these search paths, unqualified names find the planted objects (even behind pg_catalog, '
               'an operator on idem_status beats pg_catalog''s anyenum one)');
DELETE FROM sec_canary.log;

-- The lifecycle, in three steps so that time can be moved in between; every
-- name in these bodies is qualified, so that only the extension's own
-- resolution is on trial.  Results go to sp_out.
CREATE TEMP TABLE sp_out (n serial, pass pg_catalog.text, label pg_catalog.text, v pg_catalog.text);
GRANT ALL ON sp_out, sp_out_n_seq TO PUBLIC;
CREATE TABLE sec_canary.orders_p1 (id pg_catalog.int4 PRIMARY KEY, st pg_catalog.text);
CREATE TABLE sec_canary.pairs_p1 (a pg_catalog.text, b pg_catalog.int4, st pg_catalog.text, PRIMARY KEY (a, b));
CREATE TABLE sec_canary.orders_p2 (LIKE sec_canary.orders_p1 INCLUDING ALL);
CREATE TABLE sec_canary.pairs_p2 (LIKE sec_canary.pairs_p1 INCLUDING ALL);
CREATE FUNCTION pg_temp.out(pass pg_catalog.text, label pg_catalog.text, v pg_catalog.text) RETURNS void
LANGUAGE sql AS $fn$ INSERT INTO pg_temp.sp_out (pass, label, v) VALUES (pass, label, v) $fn$;

CREATE FUNCTION pg_temp.sp_phase1(p pg_catalog.text) RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
    tok pg_catalog.int8;
    v pg_catalog.text;
    k pg_catalog.text;
BEGIN
    -- claims and the owner calls
    k := pg_catalog.concat(p, '.k1');
    SELECT c.token, c.outcome INTO tok, v FROM public.idem_claim(k, '\x01', '1 hour') c;
    PERFORM pg_temp.out(p, 'claim k1', v);
    PERFORM public.idem_checkpoint(k, tok, 'step 1', '1 hour');
    PERFORM public.idem_complete(k, tok, '{"ok": 1}', 201);
    SELECT c.outcome INTO v FROM public.idem_claim(k, '\x01') c;
    PERFORM pg_temp.out(p, 'claim k1 again', v);
    k := pg_catalog.concat(p, '.k2');
    SELECT c.token INTO tok FROM public.idem_claim(k, '\x01') c;
    PERFORM public.idem_fail(k, tok, '{"e": 1}', false, response_code => 422);
    SELECT c.outcome INTO v FROM public.idem_claim(k, '\x01') c;
    PERFORM pg_temp.out(p, 'claim k2 after a final failure', v);
    k := pg_catalog.concat(p, '.k3');
    SELECT c.token INTO tok FROM public.idem_claim(k, '\x01') c;
    PERFORM public.idem_release(k, tok);
    SELECT c.outcome INTO v FROM public.idem_claim(k, '\x02') c;
    PERFORM pg_temp.out(p, 'claim k3 after release', v);
    k := pg_catalog.concat(p, '.k4');
    SELECT c.token INTO tok FROM public.idem_claim(k, '\x01') c;
    PERFORM public.idem_mark_unknown(k, tok, '{"timeout": true}');
    SELECT c.outcome INTO v FROM public.idem_claim(k, '\x01') c;
    PERFORM pg_temp.out(p, 'claim k4 unknown', v);
    PERFORM public.idem_resolve(k, 'succeeded', '{"reconciled": true}');
    SELECT c.outcome INTO v FROM public.idem_claim(k, '\x01') c;
    PERFORM pg_temp.out(p, 'claim k4 resolved', v);
    SELECT c.outcome INTO v FROM public.idem_claim(pg_catalog.concat(p, '.k5'), '\x01', '1 hour') c;
    PERFORM pg_temp.out(p, 'claim k5', v);
    SELECT c.outcome INTO v FROM public.idem_claim(pg_catalog.concat(p, '.k6'), '\x01', wait => false) c;
    PERFORM pg_temp.out(p, 'claim k6 wait => false', v);
    k := pg_catalog.concat(p, '.k7');
    SELECT c.token INTO tok FROM public.idem_claim(k, '\x01', retention => '1 hour') c;
    PERFORM public.idem_complete(k, tok);
    k := pg_catalog.concat(p, '.k8');
    SELECT c.token INTO tok FROM public.idem_claim(k, '\x01') c;
    PERFORM public.idem_fail(k, tok, '{"e": "retry"}');
    SELECT l.status::pg_catalog.text INTO v FROM public.idem_lookup(pg_catalog.concat(p, '.k1')) l;
    PERFORM pg_temp.out(p, 'lookup k1', v);
    SELECT a.status::pg_catalog.text INTO v FROM public.idem_await(pg_catalog.concat(p, '.k1'), '', '0') a;
    PERFORM pg_temp.out(p, 'await k1', v);
    SELECT a.status::pg_catalog.text INTO v FROM public.idem_await(pg_catalog.concat(p, '.k5'), '', '0') a;
    PERFORM pg_temp.out(p, 'await k5', v);
    SELECT s.reason INTO v FROM public.idem_stuck s WHERE s.key OPERATOR(pg_catalog.=) pg_catalog.concat(p, '.k4');
    PERFORM pg_temp.out(p, 'idem_stuck k4', v);
    SELECT s.records::pg_catalog.text INTO v FROM public.idem_summary s
    WHERE s.scope OPERATOR(pg_catalog.=) '' AND s.status OPERATOR(pg_catalog.=) 'processing'::public.idem_status;
    PERFORM pg_temp.out(p, 'idem_summary has processing records', (v IS NOT NULL)::pg_catalog.text);
    SELECT public.idem_fingerprint('{"b": 2, "a": 1}'::pg_catalog.jsonb)::pg_catalog.text INTO v;
    PERFORM pg_temp.out(p, 'fingerprint', v);

    -- the inbox
    k := pg_catalog.concat('c.', p);
    PERFORM pg_temp.out(p, 'accept m1', public.idem_inbox_accept(k, 'm1')::pg_catalog.text);
    PERFORM pg_temp.out(p, 'accept m1 again', public.idem_inbox_accept(k, 'm1')::pg_catalog.text);
    PERFORM pg_temp.out(p, 'accept m2 wait => false', public.idem_inbox_accept(k, 'm2', wait => false)::pg_catalog.text);
    PERFORM pg_temp.out(p, 'accept_seq 1', public.idem_inbox_accept_seq(k, 's', 1));
    PERFORM pg_temp.out(p, 'accept_seq 1 again', public.idem_inbox_accept_seq(k, 's', 1));
    PERFORM pg_temp.out(p, 'accept_seq 2', public.idem_inbox_accept_seq(k, 's', 2));
    PERFORM pg_temp.out(p, 'accept_seq 5', public.idem_inbox_accept_seq(k, 's', 5));
    PERFORM pg_temp.out(p, 'accept_seq (7, 3)', public.idem_inbox_accept_seq(k, 'b', 7, 3));
    PERFORM pg_temp.out(p, 'watermark', public.idem_inbox_watermark(k, 's')::pg_catalog.text);
    PERFORM pg_temp.out(p, 'idem_inbox_seq', public.idem_inbox_seq(7, 3)::pg_catalog.text);

    -- state machines
    k := pg_catalog.concat('sec.sp.', p);
    PERFORM public.idem_define_machine(k, '{"new": ["paid"], "paid": ["done"]}', '{new}');
    SELECT pg_catalog.string_agg(m.from_state OPERATOR(pg_catalog.||) '>' OPERATOR(pg_catalog.||) m.to_state, ' ')
    INTO v FROM public.idem_machine_moves(k) m;
    PERFORM pg_temp.out(p, 'machine moves', v);
    SELECT pg_catalog.string_agg(m.state, ' ') INTO v FROM public.idem_machine_states(k) m WHERE m.terminal;
    PERFORM pg_temp.out(p, 'terminal states', v);
    PERFORM pg_temp.out(p, 'dot', (pg_catalog.length(public.idem_machine_dot(k)) OPERATOR(pg_catalog.>) 0)::pg_catalog.text);
    PERFORM public.idem_attach_machine(pg_catalog.concat('sec_canary.orders_', p)::pg_catalog.regclass, 'st', k, log => true);
    PERFORM public.idem_attach_machine(pg_catalog.concat('sec_canary.pairs_', p)::pg_catalog.regclass, 'st', k);
    SELECT pg_catalog.count(*)::pg_catalog.text INTO v FROM public.idem_attached_machines a
    WHERE a.machine OPERATOR(pg_catalog.=) k;
    PERFORM pg_temp.out(p, 'attached', v);
    EXECUTE pg_catalog.format('INSERT INTO sec_canary.orders_%s VALUES (1, %L), (2, %L)', p, 'new', 'new');
    EXECUTE pg_catalog.format('INSERT INTO sec_canary.pairs_%s VALUES (%L, 1, %L)', p, 'x', 'new');
    PERFORM pg_temp.out(p, 'transition 1 paid',
                        public.idem_transition(pg_catalog.concat('sec_canary.orders_', p)::pg_catalog.regclass, '1', 'paid'));
    PERFORM pg_temp.out(p, 'transition 1 paid again',
                        public.idem_transition(pg_catalog.concat('sec_canary.orders_', p)::pg_catalog.regclass, '1', 'paid'));
    PERFORM pg_temp.out(p, 'transition 2 done',
                        public.idem_transition(pg_catalog.concat('sec_canary.orders_', p)::pg_catalog.regclass, '2', 'done'));
    PERFORM pg_temp.out(p, 'transition (x, 1) paid',
                        public.idem_transition(pg_catalog.concat('sec_canary.pairs_', p)::pg_catalog.regclass,
                                               ARRAY['x', '1'], 'paid', '{new}', 'st'));
    PERFORM pg_temp.out(p, 'update 1 done', pg_temp.sqlstate_of(pg_catalog.format(
        'UPDATE sec_canary.orders_%s SET st = %L WHERE id OPERATOR(pg_catalog.=) 1', p, 'done')));
    PERFORM pg_temp.out(p, 'update 2 done', pg_temp.sqlstate_of(pg_catalog.format(
        'UPDATE sec_canary.orders_%s SET st = %L WHERE id OPERATOR(pg_catalog.=) 2', p, 'done')));
    EXECUTE pg_catalog.format('SELECT pg_catalog.string_agg(pg_catalog.concat(from_state, %L, to_state), %L ORDER BY logged_at) '
                              'FROM sec_canary.orders_%s_state_log', '>', ' ', p) INTO v;
    PERFORM pg_temp.out(p, 'state log', v);
    PERFORM public.idem_detach_machine(pg_catalog.concat('sec_canary.orders_', p)::pg_catalog.regclass, 'st');
    PERFORM public.idem_detach_machine(pg_catalog.concat('sec_canary.pairs_', p)::pg_catalog.regclass, 'st');
    PERFORM public.idem_drop_machine(k);
    PERFORM pg_temp.out(p, 'machine dropped',
                        pg_temp.sqlstate_of(pg_catalog.format('SELECT public.idem_machine_dot(%L)', k)));

    -- grants
    PERFORM public.idem_grant('client', 'regress_idem_sec_nobody');
    PERFORM pg_temp.out(p, 'granted', pg_catalog.has_function_privilege('regress_idem_sec_nobody',
        'public.idem_claim(pg_catalog.text, pg_catalog.bytea, pg_catalog.interval, pg_catalog.text, pg_catalog.interval, pg_catalog.bool)',
        'EXECUTE')::pg_catalog.text);
    PERFORM public.idem_revoke_all('regress_idem_sec_nobody');
    PERFORM pg_temp.out(p, 'revoked', pg_catalog.has_table_privilege('regress_idem_sec_nobody',
        'public.idempotency_records', 'SELECT')::pg_catalog.text);

    -- tenant isolation, as tenant A
    PERFORM public.idem_tenant_isolation(true);
    SET LOCAL ROLE regress_idem_sec_ta;
    PERFORM pg_catalog.set_config('idempotency.scope', 'tA', true);
    k := pg_catalog.concat(p, '.t1');
    SELECT c.token, c.outcome INTO tok, v FROM public.idem_claim(k, '\x0a', scope => 'tA') c;
    PERFORM pg_temp.out(p, 'tenant claim', v);
    PERFORM public.idem_complete(k, tok, '{"t": 1}', scope => 'tA');
    SELECT c.outcome INTO v FROM public.idem_claim(k, '\x0a', scope => 'tA') c;
    PERFORM pg_temp.out(p, 'tenant claim again', v);
    SELECT l.status::pg_catalog.text INTO v FROM public.idem_lookup(k, 'tA') l;
    PERFORM pg_temp.out(p, 'tenant lookup', v);
    SELECT pg_catalog.count(*)::pg_catalog.text INTO v FROM public.idem_lookup('sec.t1', 'tB') l;
    PERFORM pg_temp.out(p, 'tenant lookup of B', v);
    SELECT pg_catalog.count(*)::pg_catalog.text INTO v FROM public.idem_await('sec.t2', 'tB', '0') l;
    PERFORM pg_temp.out(p, 'tenant await of B', v);
    PERFORM pg_temp.out(p, 'tenant claim in B', pg_temp.sqlstate_of(
        'SELECT * FROM public.idem_claim(''sec.t1'', ''\x0b'', scope => ''tB'')'));
    PERFORM pg_temp.out(p, 'tenant accept', public.idem_inbox_accept(pg_catalog.concat('tA/', p), 'm1')::pg_catalog.text);
    PERFORM pg_temp.out(p, 'tenant accept_seq', public.idem_inbox_accept_seq(pg_catalog.concat('tA/', p), 's', 3, 1));
    PERFORM pg_temp.out(p, 'tenant accept as B', pg_temp.sqlstate_of(
        'SELECT public.idem_inbox_accept(''tB/orders'', ''m7'')'));
    PERFORM pg_temp.out(p, 'tenant purge', public.idem_purge()::pg_catalog.text);
    SELECT pg_catalog.count(*)::pg_catalog.text INTO v FROM public.idem_stuck s
    WHERE s.scope OPERATOR(pg_catalog.<>) 'tA';
    PERFORM pg_temp.out(p, 'tenant idem_stuck of others', v);
    RESET ROLE;
    PERFORM pg_catalog.set_config('idempotency.scope', '', true);
    PERFORM public.idem_tenant_isolation(false);
END
$fn$;

-- time passes: k5's lease runs out, k7 and the message m1 expire, m2 too (it will be accepted again)
CREATE FUNCTION pg_temp.sp_backdate(p pg_catalog.text) RETURNS void LANGUAGE sql AS $fn$
    UPDATE public.idempotency_records SET lease_expires_at = pg_catalog.now() - interval '1 minute'
    WHERE key = pg_catalog.concat(p, '.k5');
    UPDATE public.idempotency_records
    SET expires_at = pg_catalog.now() - interval '1 day', purge_after = pg_catalog.now() - interval '1 day'
    WHERE key = pg_catalog.concat(p, '.k7');
    UPDATE public.idem_inbox SET expires_at = pg_catalog.now() - interval '1 day' WHERE consumer = pg_catalog.concat('c.', p);
$fn$;

CREATE FUNCTION pg_temp.sp_phase2(p pg_catalog.text) RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
    tok pg_catalog.int8;
    v pg_catalog.text;
    k pg_catalog.text;
BEGIN
    k := pg_catalog.concat(p, '.k5');
    SELECT c.token, c.outcome INTO tok, v FROM public.idem_claim(k, '\x01', '1 hour') c;
    PERFORM pg_temp.out(p, 'claim k5 after its lease', v);
    PERFORM public.idem_complete(k, tok);
    SELECT c.outcome INTO v FROM public.idem_claim(pg_catalog.concat(p, '.k8'), '\x01') c;
    PERFORM pg_temp.out(p, 'claim k8 after a retryable failure', v);
    PERFORM pg_temp.out(p, 'accept m2 expired', public.idem_inbox_accept(pg_catalog.concat('c.', p), 'm2')::pg_catalog.text);
    PERFORM pg_temp.out(p, 'purge', public.idem_purge()::pg_catalog.text);
    SELECT c.outcome INTO v FROM public.idem_claim(pg_catalog.concat(p, '.k7'), '\x02') c;
    PERFORM pg_temp.out(p, 'claim k7 after the purge', v);
    PERFORM pg_temp.out(p, 'accept m1 after the purge', public.idem_inbox_accept(pg_catalog.concat('c.', p), 'm1')::pg_catalog.text);
END
$fn$;

-- pass 1: evil ahead of pg_catalog
SET LOCAL search_path = evil, pg_catalog, public;
SELECT pg_temp.sp_phase1('p1') \g /dev/null
RESET search_path;
SELECT pg_temp.sp_backdate('p1') \g /dev/null
SET LOCAL search_path = evil, pg_catalog, public;
SELECT pg_temp.sp_phase2('p1') \g /dev/null
RESET search_path;
SELECT is_empty($$SELECT what FROM sec_canary.log$$,
                'search_path = evil, pg_catalog, public: the lifecycle called no planted object');
-- pass 2: evil behind pg_catalog (implicitly first), ahead of the extension's schema
SET LOCAL search_path = evil, public;
SELECT pg_temp.sp_phase1('p2') \g /dev/null
RESET search_path;
SELECT pg_temp.sp_backdate('p2') \g /dev/null
SET LOCAL search_path = evil, public;
SELECT pg_temp.sp_phase2('p2') \g /dev/null
RESET search_path;
SELECT is_empty($$SELECT what FROM sec_canary.log$$,
                'search_path = evil, public: the lifecycle called no planted object');
SELECT results_eq($$SELECT label COLLATE "default", v COLLATE "default" FROM sp_out WHERE pass = 'p1' ORDER BY n$$,
                  $$SELECT label COLLATE "default", v COLLATE "default" FROM sp_out WHERE pass = 'p2' ORDER BY n$$,
                  'both passes gave the same results');
SELECT results_eq($$SELECT label COLLATE "default", v COLLATE "default" FROM sp_out WHERE pass = 'p1' ORDER BY n$$,
    $$VALUES ('claim k1', 'new'), ('claim k1 again', 'replay'), ('claim k2 after a final failure', 'replay'),
             ('claim k3 after release', 'new'), ('claim k4 unknown', 'unknown'), ('claim k4 resolved', 'replay'),
             ('claim k5', 'new'), ('claim k6 wait => false', 'new'), ('lookup k1', 'succeeded'), ('await k1', 'succeeded'),
             ('await k5', 'processing'), ('idem_stuck k4', NULL), ('idem_summary has processing records', 'true'),
             ('fingerprint', (SELECT idem_fingerprint('{"a": 1, "b": 2}'::jsonb)::text)),
             ('accept m1', 'true'), ('accept m1 again', 'false'), ('accept m2 wait => false', 'true'),
             ('accept_seq 1', 'new'), ('accept_seq 1 again', 'duplicate'), ('accept_seq 2', 'new'), ('accept_seq 5', 'gap'),
             ('accept_seq (7, 3)', 'new'), ('watermark', '2'), ('idem_inbox_seq', '7340035'),
             ('machine moves', 'new>paid paid>done'), ('terminal states', 'done'), ('dot', 'true'), ('attached', '2'),
             ('transition 1 paid', 'applied'), ('transition 1 paid again', 'already'), ('transition 2 done', 'rejected'),
             ('transition (x, 1) paid', 'applied'), ('update 1 done', '00000'), ('update 2 done', 'IK005'),
             ('state log', '>new >new new>paid paid>done'), ('machine dropped', '42704'),
             ('granted', 'true'), ('revoked', 'false'),
             ('tenant claim', 'new'), ('tenant claim again', 'replay'), ('tenant lookup', 'succeeded'),
             ('tenant lookup of B', '0'), ('tenant await of B', '0'), ('tenant claim in B', '42501'),
             ('tenant accept', 'true'), ('tenant accept_seq', 'new'), ('tenant accept as B', '42501'),
             ('tenant purge', '0'), ('tenant idem_stuck of others', '0'),
             ('claim k5 after its lease', 'takeover'), ('claim k8 after a retryable failure', 'takeover'),
             ('accept m2 expired', 'true'), ('purge', '2'), ('claim k7 after the purge', 'new'),
             ('accept m1 after the purge', 'true')$$,
    'and the right ones: every outcome of the lifecycle, the inbox, machines, grants and tenant isolation');
DROP VIEW pg_temp.idempotency_records, pg_temp.idem_inbox, pg_temp.idem_inbox_streams, pg_temp.idem_machines,
    pg_temp.idem_machine_moves, pg_temp.idem_attached_machines, pg_temp.idem_stuck, pg_temp.idem_summary;

-- 5. hostile identifiers ---------------------------------------------------------------------------
-- A schema, tables, columns, a machine and states whose names carry double
-- and single quotes, spaces, semicolons, backslashes and comment markers.
-- Every statement built from them must quote them; any that did not would
-- fail, or drop the canary table sec_canary.x.
CREATE ROLE regress_idem_sec_app;
CREATE SCHEMA "sec ""sch""; DROP TABLE sec_canary.x; --" AUTHORIZATION regress_idem_sec_madmin;
GRANT USAGE ON SCHEMA "sec ""sch""; DROP TABLE sec_canary.x; --" TO regress_idem_sec_app;
SET LOCAL ROLE regress_idem_sec_madmin;
CREATE TABLE "sec ""sch""; DROP TABLE sec_canary.x; --"."order; DROP TABLE sec_canary.x; --" (
    "id; --" int PRIMARY KEY,
    "st""ate col" text);
CREATE TABLE "sec ""sch""; DROP TABLE sec_canary.x; --"."o'k 2" (
    "a b" text,
    "c"";" int,
    "st""ate col" text,
    PRIMARY KEY ("a b", "c"";"));
INSERT INTO "sec ""sch""; DROP TABLE sec_canary.x; --"."order; DROP TABLE sec_canary.x; --" VALUES (1, 'NEW'''), (2, 'NEW''');
INSERT INTO "sec ""sch""; DROP TABLE sec_canary.x; --"."o'k 2" VALUES ('x''y; --', 7, 'NEW''');
GRANT SELECT, UPDATE ON "sec ""sch""; DROP TABLE sec_canary.x; --"."order; DROP TABLE sec_canary.x; --",
    "sec ""sch""; DROP TABLE sec_canary.x; --"."o'k 2" TO regress_idem_sec_app;
SELECT lives_ok($$SELECT idem_define_machine('m"''; DROP TABLE sec_canary.x; --',
                                             jsonb_build_object('NEW''', jsonb_build_array('PA"ID'),
                                                                'PA"ID', jsonb_build_array('DONE; --', 'RE\FUND')),
                                             ARRAY['NEW'''])$$,
                'a machine whose name and states have quotes, semicolons and a backslash');
SELECT lives_ok($$SELECT idem_attach_machine(
                      '"sec ""sch""; DROP TABLE sec_canary.x; --"."order; DROP TABLE sec_canary.x; --"',
                      'st"ate col', 'm"''; DROP TABLE sec_canary.x; --', log => true)$$,
                'attached, with a transition log, to a column "st""ate col" of a table "order; DROP TABLE sec_canary.x; --"');
SELECT lives_ok($$SELECT idem_attach_machine('"sec ""sch""; DROP TABLE sec_canary.x; --"."o''k 2"',
                                             'st"ate col', 'm"''; DROP TABLE sec_canary.x; --')$$,
                'and to a table "o''k 2" with a primary key of two oddly named columns');
GRANT INSERT ON "sec ""sch""; DROP TABLE sec_canary.x; --"."order; DROP TABLE sec_canary.x; --_state_log"
    TO regress_idem_sec_app;
RESET ROLE;
SELECT results_eq($$SELECT table_name::text COLLATE "default", state_column::text COLLATE "default",
                           machine COLLATE "default", trigger_name::text COLLATE "default"
                    FROM idem_attached_machines WHERE machine = 'm"''; DROP TABLE sec_canary.x; --' ORDER BY 1$$,
                  $$VALUES ('"sec ""sch""; DROP TABLE sec_canary.x; --"."o''k 2"', 'st"ate col',
                            'm"''; DROP TABLE sec_canary.x; --', 'zz_idem_machine_st"ate col'),
                           ('"sec ""sch""; DROP TABLE sec_canary.x; --"."order; DROP TABLE sec_canary.x; --"', 'st"ate col',
                            'm"''; DROP TABLE sec_canary.x; --', 'zz_idem_machine_st"ate col')$$,
                  'idem_attached_machines shows both, names intact');

SET LOCAL ROLE regress_idem_sec_app;
SELECT is(idem_transition('"sec ""sch""; DROP TABLE sec_canary.x; --"."order; DROP TABLE sec_canary.x; --"', '1', 'PA"ID'),
          'applied', 'idem_transition moves a row of the oddly named table');
SELECT is(idem_transition('"sec ""sch""; DROP TABLE sec_canary.x; --"."order; DROP TABLE sec_canary.x; --"', '1', 'PA"ID'),
          'already', 'and answers already the second time');
SELECT is(idem_transition('"sec ""sch""; DROP TABLE sec_canary.x; --"."order; DROP TABLE sec_canary.x; --"', '2', 'DONE; --',
                          state_column => 'st"ate col'),
          'rejected', 'a state named "DONE; --" is only a value: row 2 cannot reach it from NEW''');
SELECT throws_ok($$SELECT idem_transition('"sec ""sch""; DROP TABLE sec_canary.x; --"."order; DROP TABLE sec_canary.x; --"',
                                          '1; DROP TABLE sec_canary.x; --', 'PA"ID')$$, '22P02', NULL,
                 'a key carrying SQL is a value that does not convert to integer');
SELECT is(idem_transition('"sec ""sch""; DROP TABLE sec_canary.x; --"."o''k 2"', ARRAY['x''y; --', '7'], 'PA"ID'),
          'applied', 'idem_transition moves a row by a two-column key holding a quote and a semicolon');
SELECT throws_ok($$SELECT idem_transition('"sec ""sch""; DROP TABLE sec_canary.x; --"."o''k 2"',
                                          ARRAY['x'' OR ''1''=''1', '7'], 'PA"ID')$$, 'P0002', NULL,
                 'a key written as an injection finds no row');
SELECT lives_ok($$UPDATE "sec ""sch""; DROP TABLE sec_canary.x; --"."order; DROP TABLE sec_canary.x; --"
                  SET "st""ate col" = 'DONE; --' WHERE "id; --" = 1$$, 'the trigger lets a move through');
SELECT throws_ok($$UPDATE "sec ""sch""; DROP TABLE sec_canary.x; --"."order; DROP TABLE sec_canary.x; --"
                   SET "st""ate col" = 'RE\FUND' WHERE "id; --" = 1$$, 'IK005',
                 'invalid transition from "DONE; --" to "RE\FUND" in column "st"ate col" of table "order; DROP TABLE sec_canary.x; --"',
                 'and refuses the rest, naming the column and table as they are');
SELECT throws_ok($$UPDATE "sec ""sch""; DROP TABLE sec_canary.x; --"."order; DROP TABLE sec_canary.x; --"
                   SET "st""ate col" = 'DONE; --' WHERE "id; --" = 2$$, 'IK005',
                 'invalid transition from "NEW''" to "DONE; --" in column "st"ate col" of table "order; DROP TABLE sec_canary.x; --"',
                 'a state with a quote in the error message as well');
RESET ROLE;
SELECT results_eq($$SELECT row_key, state_column::text COLLATE "default", machine COLLATE "default",
                           from_state COLLATE "default", to_state COLLATE "default"
                    FROM "sec ""sch""; DROP TABLE sec_canary.x; --"."order; DROP TABLE sec_canary.x; --_state_log"
                    ORDER BY logged_at$$,
                  $$VALUES ('{"id; --": 1}'::jsonb, 'st"ate col', 'm"''; DROP TABLE sec_canary.x; --', 'NEW''', 'PA"ID'),
                           ('{"id; --": 1}'::jsonb, 'st"ate col', 'm"''; DROP TABLE sec_canary.x; --', 'PA"ID', 'DONE; --')$$,
                  'the log table "order; DROP TABLE sec_canary.x; --_state_log" holds both moves, keys and names intact');
SELECT ok(strpos(idem_machine_dot('m"''; DROP TABLE sec_canary.x; --'), 'digraph "m\"''; DROP TABLE sec_canary.x; --"') = 1
          AND strpos(idem_machine_dot('m"''; DROP TABLE sec_canary.x; --'), '"PA\"ID" -> "RE\\FUND";') > 0,
          'idem_machine_dot escapes the quotes and backslashes of names and states');
SET LOCAL ROLE regress_idem_sec_madmin;
SELECT lives_ok($$SELECT idem_detach_machine('"sec ""sch""; DROP TABLE sec_canary.x; --"."order; DROP TABLE sec_canary.x; --"',
                                             'st"ate col')$$, 'detached from the first table');
SELECT lives_ok($$SELECT idem_detach_machine('"sec ""sch""; DROP TABLE sec_canary.x; --"."o''k 2"', 'st"ate col')$$,
                'and from the second');
SELECT lives_ok($$SELECT idem_drop_machine('m"''; DROP TABLE sec_canary.x; --')$$, 'the machine is dropped');
RESET ROLE;
SELECT is_empty($$SELECT tgname FROM pg_trigger
                  WHERE tgrelid IN ('"sec ""sch""; DROP TABLE sec_canary.x; --"."order; DROP TABLE sec_canary.x; --"'::regclass,
                                    '"sec ""sch""; DROP TABLE sec_canary.x; --"."o''k 2"'::regclass)$$,
                'both triggers of each table are gone');
SELECT lives_ok($$UPDATE "sec ""sch""; DROP TABLE sec_canary.x; --"."order; DROP TABLE sec_canary.x; --"
                  SET "st""ate col" = 'anything' WHERE "id; --" = 1$$, 'the column is free again');

-- values: keys, scopes, consumers and tenant names with the same characters
SET LOCAL idempotency.scope = 't''A"; DROP TABLE sec_canary.x; --';
SELECT idem_tenant_isolation();
SET LOCAL ROLE regress_idem_sec_ta;
SELECT is((SELECT outcome FROM idem_claim('k''"; DROP TABLE sec_canary.x; --', '\x01',
                                          scope => 't''A"; DROP TABLE sec_canary.x; --')), 'new',
          'a claim of a key and a scope that carry SQL, under tenant isolation');
SELECT is((SELECT count(*) FROM idem_lookup('k''"; DROP TABLE sec_canary.x; --', 't''A"; DROP TABLE sec_canary.x; --')),
          1::bigint, 'and its lookup');
SELECT is(idem_inbox_accept('t''A"; DROP TABLE sec_canary.x; --/q''"', 'm''; --'), true,
          'an accept by a consumer of that tenant');
RESET ROLE;
SELECT idem_tenant_isolation(false);
RESET idempotency.scope;

SELECT ok(to_regclass('sec_canary.x') IS NOT NULL, 'the canary table is still there');
SELECT is((SELECT count(*) FROM pg_class WHERE relnamespace = '"sec ""sch""; DROP TABLE sec_canary.x; --"'::regnamespace
             AND relkind = 'r'), 3::bigint, 'and so are the two tables and the log table');

-- purges moved the token epoch (not transactional); later files expect token 1
DO $$ BEGIN PERFORM setval('idem_token_epoch', 1, false); END $$;
SELECT * FROM finish();
ROLLBACK;
