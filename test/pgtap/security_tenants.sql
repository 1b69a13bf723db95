-- idem-test: superuser: between the tenants' steps it writes and reads every tenant's rows under tenant isolation, which binds every role but a superuser or BYPASSRLS (FORCE binds the tables' owner)
-- Tenants with sub-scopes and the reconciler across tenants (issue 14),
-- under tenant isolation, tested as roles that row-level security binds:
--
--   1. the rule: a scope belongs to tenant S when it is S or starts with
--      "S/" (idem_scope_in_tenant), and the policy stays a range of the
--      primary key;
--   2. two tenants, t1 and t2, with sub-scopes (t1, t1/orders, t1/refunds,
--      t1//x, t2, t2/orders) and the neighbours t10 and t1x/...: each tenant
--      works in its sub-scopes with every function, and none reads or writes
--      another's records by any function (claim, lookup, await, complete,
--      fail, checkpoint, release, mark_unknown, resolve, idem_stuck,
--      idem_summary, purge, the table itself);
--   3. a tenant whose name contains "/" (t1/orders) is a sub-tree of t1;
--   4. the kind global_reconciler: sees and resolves the unknown records of
--      every tenant, without idempotency.scope, and can do nothing else (no
--      claim, no completion, no insert or delete, no update of a record that
--      is not unknown); a member role inherits it; idem_revoke_all ends it;
--      the kind reconciler stays bound to its tenant.
--
-- Everything, roles included, is rolled back.  Keys are prefixed "ten.",
-- roles are regress_idem_ten_*.
BEGIN;
SELECT plan(87);
SET LOCAL statement_timeout = '60s';

CREATE FUNCTION pg_temp.sqlstate_of(sql pg_catalog.text) RETURNS pg_catalog.text LANGUAGE plpgsql AS $fn$
BEGIN
    EXECUTE sql;
    RETURN '00000';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END
$fn$;
GRANT EXECUTE ON FUNCTION pg_temp.sqlstate_of(pg_catalog.text) TO PUBLIC;
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

-- expired rows committed by others would be counted by the purges below
SELECT ok(idem_purge() >= 0, 'expired rows left by others are purged first (rolled back at the end)');
DO $$ BEGIN PERFORM setval('idem_token_epoch', 1, false); END $$;

CREATE ROLE regress_idem_ten_app;
CREATE ROLE regress_idem_ten_rec;
CREATE ROLE regress_idem_ten_rec_member IN ROLE regress_idem_ten_rec;
CREATE ROLE regress_idem_ten_plain_rec;
SELECT idem_grant(k, 'regress_idem_ten_app') FROM unnest('{client,reconciler,maintenance,monitor}'::text[]) k;
SELECT lives_ok($$SELECT idem_grant('global_reconciler', 'regress_idem_ten_rec')$$, 'idem_grant global_reconciler');
SELECT lives_ok($$SELECT idem_grant('global_reconciler', 'regress_idem_ten_rec')$$, 'a second time changes nothing');
SELECT results_eq($$SELECT role::text COLLATE "default" FROM idem_global_reconcilers$$, $$VALUES ('regress_idem_ten_rec')$$,
                  'the role is listed once in idem_global_reconcilers');
SELECT idem_grant('reconciler', 'regress_idem_ten_plain_rec');
-- exactly what the kind grants, beyond what a role without grants has
CREATE ROLE regress_idem_ten_nobody;
SELECT set_eq(
    $$SELECT p.oid::regprocedure::text FROM pg_proc p
      JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
      JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
      WHERE has_function_privilege('regress_idem_ten_rec', p.oid, 'EXECUTE')
        AND NOT has_function_privilege('regress_idem_ten_nobody', p.oid, 'EXECUTE')$$,
    $$VALUES ('idem_lookup(text,text)'), ('idem_resolve(text,idem_status,jsonb,integer,text,boolean,jsonb)')$$,
    'global_reconciler may execute idem_lookup and idem_resolve, and nothing else that others may not');
SELECT set_eq(
    $$SELECT c.relname::text, m.privilege FROM pg_class c
      JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'e'
      JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency',
      unnest('{SELECT,INSERT,UPDATE,DELETE,TRUNCATE}'::text[]) m(privilege)
      WHERE c.relkind IN ('r', 'v')
        AND has_table_privilege('regress_idem_ten_rec', c.oid, m.privilege)
        AND NOT has_table_privilege('regress_idem_ten_nobody', c.oid, m.privilege)$$,
    $$VALUES ('idempotency_records', 'SELECT'), ('idem_outbox', 'SELECT'),
             ('idem_stuck', 'SELECT'), ('idem_summary', 'SELECT')$$,
    'and may read the records, the outbox (for idem_stuck) and both views, nothing else');
SELECT results_eq(
    $$SELECT attname::text COLLATE "default" FROM pg_attribute
      WHERE attrelid = 'idempotency_records'::regclass AND attnum > 0 AND NOT attisdropped
        AND has_column_privilege('regress_idem_ten_rec', attrelid, attnum, 'UPDATE')
      ORDER BY 1$$,
    $$VALUES ('completed_at'), ('error'), ('expires_at'), ('response_code'), ('response_headers'),
             ('result'), ('retryable'), ('status'), ('updated_at')$$,
    'and update only the columns idem_resolve writes');
SELECT lives_ok($$SELECT idem_tenant_isolation()$$, 'tenant isolation on');

-- 1. the rule --------------------------------------------------------------------------------------
SET LOCAL idempotency.scope = 't1';
SELECT results_eq(
    $$SELECT s, idem_scope_in_tenant(s)
      FROM unnest('{t1,t1/orders,t1/refunds,t1//x,t1/,t1/orders/2026,t10,t1x/a,t1x,t,t2,t2/orders,/t1,"",T1}'::text[])
           WITH ORDINALITY AS u(s, n) ORDER BY n$$,
    $$VALUES ('t1', true), ('t1/orders', true), ('t1/refunds', true), ('t1//x', true), ('t1/', true),
             ('t1/orders/2026', true), ('t10', false), ('t1x/a', false), ('t1x', false), ('t', false),
             ('t2', false), ('t2/orders', false), ('/t1', false), ('', false), ('T1', false)$$,
    'tenant t1 owns t1 and t1/..., not t10, t1x/..., t, T1 or another tenant''s');
SET LOCAL idempotency.scope = '';
SELECT is_empty($$SELECT s FROM unnest('{"",/,t1,/t1}'::text[]) s WHERE idem_scope_in_tenant(s)$$,
                'an empty tenant owns nothing, not even "" or "/"');
RESET idempotency.scope;
SELECT is_empty($$SELECT s FROM unnest('{"",/,t1}'::text[]) s WHERE idem_scope_in_tenant(s)$$,
                'nor does an unset one');
CREATE FUNCTION pg_temp.plan_of(sql text) RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
    line text;
    plan text := '';
BEGIN
    FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) ' || sql LOOP
        plan := plan || line || E'\n';
    END LOOP;
    RETURN plan;
END
$fn$;
GRANT EXECUTE ON FUNCTION pg_temp.plan_of(text) TO PUBLIC;
SET LOCAL ROLE regress_idem_ten_app;
SET LOCAL idempotency.scope = 't1';
-- Only a bitmap scan is left to the planner: it can use the primary key
-- only where the policy is an index condition (otherwise: a disabled
-- sequential scan with a filter).  With index scans allowed too, a full
-- index-only scan with a filter can be cheaper on a small table that
-- VACUUM has marked all-visible, which 18 chose once.
SET LOCAL enable_seqscan = off;
SET LOCAL enable_indexscan = off;
SET LOCAL enable_indexonlyscan = off;
SELECT matches(pg_temp.plan_of('SELECT key FROM idempotency_records'),
               'Index Cond: \(\(scope >= .*Index Cond: \(scope = |Index Cond: \(scope = .*Index Cond: \(\(scope >= ',
               'the policy is an index condition: the tenant and the range of its sub-scopes in the primary key');
SELECT doesnt_match(pg_temp.plan_of('SELECT key FROM idempotency_records'), 'Filter',
                    'with no filter left over');
RESET enable_seqscan;
RESET enable_indexscan;
RESET enable_indexonlyscan;
RESET ROLE;

-- 2. two tenants with sub-scopes ------------------------------------------------------------------
-- the records, each tenant writing its own: the same key "ten.k" in every scope
SET LOCAL ROLE regress_idem_ten_app;
CREATE TEMP TABLE tokens (scope text PRIMARY KEY, token bigint);
GRANT ALL ON tokens TO PUBLIC;
DO $$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT * FROM (VALUES ('t1', '{t1,t1/orders,t1/refunds,t1//x}'::text[]), ('t2', '{t2,t2/orders}'),
                                   ('t10', '{t10}'), ('t1x', '{t1x/a}')) v(tenant, scopes) LOOP
        PERFORM set_config('idempotency.scope', t.tenant, true);
        INSERT INTO tokens SELECT s, (SELECT token FROM idem_claim('ten.k', '\x01', '1 hour', scope => s))
        FROM unnest(t.scopes) s;
        -- a finished record and an unknown one in each scope
        PERFORM idem_complete('ten.done', (SELECT token FROM idem_claim('ten.done', '\x01', scope => s)),
                              jsonb_build_object('scope', s), 201, scope => s) FROM unnest(t.scopes) s;
        PERFORM idem_mark_unknown('ten.u', (SELECT token FROM idem_claim('ten.u', '\x01', scope => s)),
                                  '{"timeout": true}', scope => s) FROM unnest(t.scopes) s;
    END LOOP;
    PERFORM set_config('idempotency.scope', '', true);
END
$$;
RESET ROLE;
SELECT is((SELECT count(*) FROM idempotency_records WHERE key LIKE 'ten.%'), 24::bigint,
          'each tenant wrote three records in each of its 8 scopes (seen by a superuser)');

SET LOCAL ROLE regress_idem_ten_app;
SET LOCAL idempotency.scope = 't1';
SELECT results_eq($$SELECT DISTINCT scope COLLATE "default" FROM idempotency_records WHERE key LIKE 'ten.%' ORDER BY 1$$,
                  $$VALUES ('t1'), ('t1//x'), ('t1/orders'), ('t1/refunds')$$,
                  't1 reads its four scopes from the table, not t10 or t1x/a');
SELECT results_eq($$SELECT outcome::text, response_code, result FROM idem_claim('ten.done', '\x01', scope => 't1/orders')$$,
                  $$VALUES ('replay', 201, '{"scope": "t1/orders"}'::jsonb)$$, 't1 replays its record of t1/orders');
SELECT results_eq($$SELECT outcome::text, token FROM idem_claim('ten.new', '\x01', scope => 't1/refunds')$$,
                  $$VALUES ('new', 1::bigint)$$, 't1 claims a new key in t1/refunds');
SELECT lives_ok($$SELECT idem_checkpoint('ten.new', 1, 'charged', scope => 't1/refunds')$$, 'checkpoints it');
SELECT lives_ok($$SELECT idem_complete('ten.new', 1, '{"ok": 1}', scope => 't1/refunds')$$, 'and completes it');
SELECT is((SELECT result FROM idem_lookup('ten.new', 't1/refunds')), '{"ok": 1}'::jsonb, 'looks it up');
SELECT is((SELECT status::text FROM idem_await('ten.new', 't1/refunds', '0')), 'succeeded', 'awaits it');
SELECT lives_ok(format($$SELECT idem_release('ten.k', %s, scope => 't1//x')$$,
                       (SELECT token FROM tokens WHERE scope = 't1//x')), 'releases its claim of t1//x');
SELECT lives_ok(format($$SELECT idem_fail('ten.k', %s, '{"e": 1}', scope => 't1/orders')$$,
                       (SELECT token FROM tokens WHERE scope = 't1/orders')), 'fails its claim of t1/orders');
SELECT results_eq($$SELECT scope COLLATE "default", reason FROM idem_stuck WHERE key LIKE 'ten.%' ORDER BY 1$$,
                  $$VALUES ('t1', 'unknown outcome'), ('t1//x', 'unknown outcome'), ('t1/orders', 'unknown outcome'),
                           ('t1/refunds', 'unknown outcome')$$,
                  'idem_stuck shows t1 the unknown outcomes of its sub-scopes only');
SELECT results_eq($$SELECT DISTINCT scope COLLATE "default" FROM idem_summary ORDER BY 1$$,
                  $$VALUES ('t1'), ('t1//x'), ('t1/orders'), ('t1/refunds')$$,
                  'idem_summary counts t1''s sub-scopes only');

-- t1 reaching for the others: t2, t2/orders, and the neighbours t10 and t1x/a
CREATE TEMP TABLE foreign_scopes (scope text PRIMARY KEY);
INSERT INTO foreign_scopes VALUES ('t2'), ('t2/orders'), ('t10'), ('t1x/a');
GRANT SELECT ON foreign_scopes TO PUBLIC;
SELECT is((SELECT count(*) FROM foreign_scopes f, idem_lookup('ten.done', f.scope)), 0::bigint,
          't1 looks up nothing in t2, t2/orders, t10 or t1x/a');
SELECT is((SELECT count(*) FROM foreign_scopes f, idem_await('ten.k', f.scope, '5 s')), 0::bigint,
          'awaits nothing there, and does not wait for their processing records');
SELECT results_eq($$SELECT f.scope, pg_temp.sqlstate_of(format('SELECT idem_claim(%L, %L, scope => %L)', 'ten.done', '\x01', f.scope))
                    FROM foreign_scopes f ORDER BY 1$$,
                  $$VALUES ('t10', '42501'), ('t1x/a', '42501'), ('t2', '42501'), ('t2/orders', '42501')$$,
                  'a claim there fails with 42501: no replay');
SELECT results_eq($$SELECT f.scope, pg_temp.sqlstate_of(format('SELECT idem_claim(%L, %L, scope => %L, wait => false)', 'ten.k', '\x01', f.scope))
                    FROM foreign_scopes f ORDER BY 1$$,
                  $$VALUES ('t10', '42501'), ('t1x/a', '42501'), ('t2', '42501'), ('t2/orders', '42501')$$,
                  'and so does one with wait => false of their processing key: no in_progress');
SELECT throws_ok($$SELECT idem_claim('ten.new2', '\x01', scope => 't2/orders')$$, '42501',
                 'scope "t2/orders" does not belong to the tenant of this session',
                 'the error names the scope, and nothing of a record');
SELECT throws_ok($$SELECT idem_claim('ten.new2', '\x01', scope => 't10')$$, '42501', NULL,
                 't1 cannot create a record in t10');
SELECT throws_ok($$SELECT idem_claim('ten.new2', '\x01')$$, '42501', NULL, 'nor in the scope ''''');
SELECT results_eq(
    $$SELECT f.scope, fn, pg_temp.sqlstate_of(format(sql, 'ten.k', t.token, f.scope))
      FROM foreign_scopes f JOIN tokens t USING (scope),
           (VALUES ('complete', 'SELECT idem_complete(%L, %s, scope => %L)'),
                   ('fail', 'SELECT idem_fail(%L, %s, ''{}'', scope => %L)'),
                   ('checkpoint', 'SELECT idem_checkpoint(%L, %s, ''p'', scope => %L)'),
                   ('release', 'SELECT idem_release(%L, %s, scope => %L)'),
                   ('mark_unknown', 'SELECT idem_mark_unknown(%L, %s, ''{}'', scope => %L)')) c(fn, sql)
      WHERE pg_temp.sqlstate_of(format(sql, 'ten.k', t.token, f.scope)) <> 'IK004'$$,
    $$SELECT NULL::text, NULL::text, NULL::text WHERE false$$,
    'complete, fail, checkpoint, release and mark_unknown with the others'' keys and tokens: IK004 for every one');
SELECT is((SELECT count(*) FROM foreign_scopes f
           WHERE pg_temp.sqlstate_of(format('SELECT idem_resolve(%L, %L, scope => %L)', 'ten.u', 'succeeded', f.scope)) = 'IK004'),
          4::bigint, 'resolve of their unknown outcomes: IK004');
SELECT is(pg_temp.row_count($$UPDATE idempotency_records SET result = '{"forged": 1}'
                              WHERE scope IN ('t2', 't2/orders', 't10', 't1x/a')$$), 0::bigint,
          'an UPDATE of their rows changes nothing');
SELECT is(pg_temp.row_count($$DELETE FROM idempotency_records WHERE scope IN ('t2', 't2/orders', 't10', 't1x/a')$$),
          0::bigint, 'a DELETE deletes nothing');
SELECT throws_ok($$INSERT INTO idempotency_records (scope, key, fingerprint, token, created_at, updated_at,
                                                    expires_at, purge_after, status, attempts)
                   VALUES ('t10', 'ten.x', '\x01', 1, now(), now(), now(), now(), 'processing', 1)$$,
                 '42501', NULL, 'an INSERT into t10 is refused');
RESET ROLE;
UPDATE idempotency_records SET expires_at = now() - interval '1 day', purge_after = now() - interval '1 day'
WHERE key = 'ten.done';
SET LOCAL ROLE regress_idem_ten_app;
SET LOCAL idempotency.scope = 't1';
SELECT is(idem_purge(), 4::bigint, 't1''s purge deletes the expired records of its four scopes only');
RESET ROLE;
SELECT results_eq($$SELECT scope COLLATE "default" FROM idempotency_records WHERE key = 'ten.done' ORDER BY 1$$,
                  $$VALUES ('t10'), ('t1x/a'), ('t2'), ('t2/orders')$$,
                  'the others'' expired records are still there');
SELECT results_eq($$SELECT scope COLLATE "default", status::text FROM idempotency_records
                    WHERE key = 'ten.k' AND scope IN ('t2', 't2/orders', 't10', 't1x/a') ORDER BY 1$$,
                  $$VALUES ('t10', 'processing'), ('t1x/a', 'processing'), ('t2', 'processing'), ('t2/orders', 'processing')$$,
                  'and their claims are untouched');

-- t2 reaching for t1's sub-scopes
SET LOCAL ROLE regress_idem_ten_app;
SET LOCAL idempotency.scope = 't2';
SELECT results_eq($$SELECT DISTINCT scope COLLATE "default" FROM idempotency_records ORDER BY 1$$,
                  $$VALUES ('t2'), ('t2/orders')$$, 't2 reads its two scopes only');
SELECT is_empty($$SELECT * FROM idem_lookup('ten.new', 't1/refunds')$$, 't2 cannot look up t1/refunds');
SELECT throws_ok($$SELECT idem_claim('ten.new', '\x01', scope => 't1/refunds')$$, '42501',
                 'scope "t1/refunds" does not belong to the tenant of this session',
                 't2 cannot replay t1/refunds''s record');
SELECT throws_ok($$SELECT idem_claim('ten.new3', '\x01', scope => 't1/orders')$$, '42501', NULL,
                 'nor create one in t1/orders');
SELECT is((SELECT outcome::text FROM idem_claim('ten.path', '\x01', scope => 't2/../t1')), 'new',
          'a scope is a name, not a path: "t2/../t1" is a sub-scope of t2');
SET LOCAL idempotency.scope = 't1';
SELECT is_empty($$SELECT * FROM idem_lookup('ten.path', 't2/../t1')$$, 'which t1 does not see');
SET LOCAL idempotency.scope = 't2';
SELECT throws_ok(format($$SELECT idem_complete('ten.k', %s, scope => 't1/refunds')$$,
                        (SELECT token FROM tokens WHERE scope = 't1/refunds')),
                 'IK004', NULL, 't2 cannot complete t1/refunds''s claim with its token');
SELECT throws_ok($$SELECT idem_resolve('ten.u', 'failed', scope => 't1//x')$$, 'IK004', NULL,
                 'nor resolve t1//x''s unknown outcome');
SELECT is_empty($$SELECT * FROM idem_stuck WHERE scope LIKE 't1%'$$, 'idem_stuck shows t2 nothing of t1');
SELECT is_empty($$SELECT * FROM idem_summary WHERE scope LIKE 't1%'$$, 'nor does idem_summary');
-- t10 is not t1 and t1 is not t10
SET LOCAL idempotency.scope = 't10';
SELECT results_eq($$SELECT DISTINCT scope COLLATE "default" FROM idempotency_records ORDER BY 1$$,
                  $$VALUES ('t10')$$, 't10 reads only t10');
SELECT throws_ok($$SELECT idem_claim('ten.k', '\x01', scope => 't1')$$, '42501', NULL, 't10 cannot claim in t1');
RESET ROLE;

-- 3. a tenant named t1/orders: a sub-tree of t1 -----------------------------------------------------
SET LOCAL ROLE regress_idem_ten_app;
SET LOCAL idempotency.scope = 't1/orders';
SELECT is((SELECT outcome::text FROM idem_claim('ten.k', '\x01', scope => 't1/orders/2026')), 'new',
          'tenant t1/orders claims in t1/orders/2026');
SELECT results_eq($$SELECT DISTINCT scope COLLATE "default" FROM idempotency_records ORDER BY 1$$,
                  $$VALUES ('t1/orders'), ('t1/orders/2026')$$,
                  'and reads t1/orders and t1/orders/..., not t1 or t1/refunds');
SELECT throws_ok($$SELECT idem_claim('ten.k', '\x01', scope => 't1')$$, '42501', NULL, 'it cannot claim in t1');
SELECT throws_ok($$SELECT idem_claim('ten.k', '\x01', scope => 't1/ordersx')$$, '42501', NULL,
                 'nor in t1/ordersx');
SET LOCAL idempotency.scope = 't1';
SELECT ok(EXISTS (SELECT FROM idem_lookup('ten.k', 't1/orders/2026')), 'tenant t1 sees what t1/orders wrote');
RESET ROLE;

-- 4. the reconciler across tenants ---------------------------------------------------------------
-- one stuck claim: t2/orders's lease has run out
UPDATE idempotency_records SET lease_expires_at = now() - interval '1 minute' WHERE scope = 't2/orders' AND key = 'ten.k';
SET LOCAL ROLE regress_idem_ten_rec;
RESET idempotency.scope;
SELECT results_eq($$SELECT scope COLLATE "default", reason FROM idem_stuck WHERE key LIKE 'ten.%' ORDER BY 1, 2$$,
                  $$VALUES ('t1', 'unknown outcome'), ('t1//x', 'unknown outcome'), ('t1/orders', 'unknown outcome'),
                           ('t1/refunds', 'unknown outcome'), ('t10', 'unknown outcome'), ('t1x/a', 'unknown outcome'),
                           ('t2', 'unknown outcome'), ('t2/orders', 'lease expired'), ('t2/orders', 'unknown outcome')$$,
                  'without idempotency.scope, idem_stuck shows the global reconciler every tenant''s unknown and stuck records');
SELECT results_eq($$SELECT DISTINCT scope COLLATE "default" FROM idem_summary WHERE scope IN ('t1', 't2', 't10') ORDER BY 1$$,
                  $$VALUES ('t1'), ('t10'), ('t2')$$, 'idem_summary counts every tenant');
SELECT is((SELECT error FROM idem_lookup('ten.u', 't2')), '{"timeout": true}'::jsonb, 'it looks up t2''s unknown record');
SELECT lives_ok($$SELECT idem_resolve('ten.u', 'succeeded', '{"charged": true}', 201, scope => 't1/orders',
                                      headers => '{"Location": "/charges/1"}')$$,
                'it resolves t1/orders''s unknown record');
SELECT lives_ok($$SELECT idem_resolve('ten.u', 'failed', '{"charged": false}', scope => 't2', retryable => true)$$,
                'and t2''s');
SELECT throws_ok($$SELECT idem_resolve('ten.u', 'succeeded', scope => 't2')$$, 'IK003', NULL,
                 'a second resolve is IK003, as for anyone');
SELECT throws_ok($$SELECT idem_resolve('ten.done', 'succeeded', scope => 't2')$$, 'IK003', NULL,
                 'a record that is not unknown cannot be resolved');
SET LOCAL idempotency.scope = 't1';
SELECT lives_ok($$SELECT idem_resolve('ten.u', 'failed', scope => 't2/orders')$$,
                'idempotency.scope does not narrow it: it resolves t2/orders''s record with the tenant set to t1');
-- what it may not do
SELECT throws_ok($$SELECT idem_claim('ten.r', '\x01', scope => 't2')$$, '42501',
                 'permission denied for function idem_claim', 'it cannot claim');
SELECT throws_ok(format($$SELECT idem_complete('ten.k', %s, scope => 't2')$$, (SELECT token FROM tokens WHERE scope = 't2')),
                 '42501', 'permission denied for function idem_complete', 'nor complete a client''s claim');
SELECT throws_ok(format($$SELECT idem_mark_unknown('ten.k', %s, '{}', scope => 't2')$$, (SELECT token FROM tokens WHERE scope = 't2')),
                 '42501', NULL, 'nor mark one unknown');
SELECT throws_ok($$SELECT * FROM idem_await('ten.k', 't2', '0')$$, '42501', NULL, 'nor await one');
SELECT throws_ok($$SELECT idem_purge()$$, '42501', NULL, 'nor purge');
SELECT throws_ok($$DELETE FROM idempotency_records WHERE scope = 't2'$$, '42501', NULL, 'nor delete records');
SELECT throws_ok($$INSERT INTO idempotency_records (scope, key, fingerprint, token, created_at, updated_at,
                                                    expires_at, purge_after, status, attempts)
                   VALUES ('t2', 'ten.x', '\x01', 1, now(), now(), now(), now(), 'processing', 1)$$,
                 '42501', NULL, 'nor insert them');
SELECT is(pg_temp.row_count($$UPDATE idempotency_records SET result = '{"forged": 1}' WHERE scope = 't2' AND key <> 'ten.u'$$),
          0::bigint, 'an UPDATE of records that are not unknown changes nothing');
SELECT is(pg_temp.row_count($$UPDATE idempotency_records SET result = '{"forged": 1}' WHERE scope = 't1' AND key <> 'ten.u'$$),
          0::bigint, 'nor of the tenant it SET: the permissive tenant policy does not widen it');
SELECT throws_ok($$UPDATE idempotency_records SET token = token + 5 WHERE scope = 't1'$$, '42501', NULL,
                 'it may update only the columns idem_resolve writes (not a token)');
SELECT throws_ok($$UPDATE idempotency_records SET status = 'processing' WHERE key = 'ten.u' AND scope = 't10'$$,
                 'IK005', NULL, 'nor put an unknown record back to processing (the records'' machine refuses it)');
SAVEPOINT resolve_by_hand;
SELECT is(pg_temp.row_count($$UPDATE idempotency_records SET status = 'failed' WHERE key = 'ten.u' AND scope = 't10'$$),
          1::bigint, 'an UPDATE reaches unknown records only, to resolve them');
ROLLBACK TO SAVEPOINT resolve_by_hand;
RESET ROLE;
SELECT results_eq($$SELECT scope COLLATE "default", status::text, result, retryable FROM idempotency_records
                    WHERE key = 'ten.u' AND scope IN ('t1/orders', 't2', 't2/orders') ORDER BY 1$$,
                  $$VALUES ('t1/orders', 'succeeded', '{"charged": true}'::jsonb, false),
                           ('t2', 'failed', NULL, true), ('t2/orders', 'failed', NULL, false)$$,
                  'the resolutions are saved (a failure''s result is its error)');
SET LOCAL ROLE regress_idem_ten_app;
SET LOCAL idempotency.scope = 't2';
SELECT is((SELECT outcome::text FROM idem_claim('ten.u', '\x01', scope => 't2')), 'takeover',
          't2''s client takes over the record the reconciler failed as retryable');
RESET ROLE;
-- a member inherits it; the kind reconciler stays in its tenant
SET LOCAL ROLE regress_idem_ten_rec_member;
RESET idempotency.scope;
SELECT is((SELECT count(DISTINCT scope) FROM idem_stuck WHERE key LIKE 'ten.%' AND scope IN ('t1', 't10', 't1x/a')), 3::bigint,
          'a member of the global reconciler sees every tenant too');
RESET ROLE;
SET LOCAL ROLE regress_idem_ten_plain_rec;
SET LOCAL idempotency.scope = 't1';
SELECT results_eq($$SELECT DISTINCT scope COLLATE "default" FROM idem_stuck WHERE key LIKE 'ten.%' ORDER BY 1$$,
                  $$VALUES ('t1'), ('t1//x'), ('t1/refunds')$$,
                  'the kind reconciler sees only its tenant''s sub-scopes');
SELECT throws_ok($$SELECT idem_resolve('ten.u', 'failed', scope => 't10')$$, 'IK004', NULL,
                 'and cannot resolve another tenant''s record');
RESET ROLE;
-- idem_revoke_all ends it
SELECT lives_ok($$SELECT idem_revoke_all('regress_idem_ten_rec')$$, 'idem_revoke_all of the global reconciler');
SELECT is_empty($$SELECT * FROM idem_global_reconcilers$$, 'takes it out of idem_global_reconcilers');
SELECT is_empty($$SELECT polname FROM pg_policy WHERE polrelid = 'idempotency_records'::regclass
                  AND polname LIKE 'idem_global%'$$, 'and the policies that named it are gone');
GRANT SELECT ON idempotency_records TO regress_idem_ten_rec;
SET LOCAL ROLE regress_idem_ten_rec_member;
RESET idempotency.scope;
SELECT is((SELECT count(*) FROM idempotency_records), 0::bigint,
          'with SELECT granted by hand, the former reconciler sees no record without a tenant');
RESET ROLE;
SELECT lives_ok($$SELECT idem_tenant_isolation(false)$$, 'isolation off');

-- purges moved the token epoch (not transactional); later files expect token 1
DO $$ BEGIN PERFORM setval('idem_token_epoch', 1, false); END $$;
SELECT * FROM finish();
ROLLBACK;
