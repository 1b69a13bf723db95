-- Tenant as an argument (issue 14): under tenant isolation a role allowed a
-- tenant by idem_grant_tenant works in that tenant's scopes with the scope
-- argument alone, without idempotency.scope (nothing is SET in this file):
--
--   1. idem_grant_tenant / idem_revoke_tenant, idem_tenant_members, and the
--      policy idem_tenant_members they make (TO the roles of the table);
--   2. two roles allowed t1 and t2: every scope-taking function works in the
--      role's sub-scopes and is refused (42501 for a claim or an inbox accept,
--      nothing seen or changed otherwise) in the other's;
--   3. no leak between clients of one session: after the t1 role's calls,
--      the next "client" (SET ROLE to the t2 role) sees none of t1's records;
--   4. a role allowed no tenant, with no setting, sees nothing; revoking
--      ends it; idem_revoke_all takes the tenants too.
--
-- Everything, roles included, is rolled back.  Keys are prefixed "targ.",
-- roles are regress_idem_targ_*.
BEGIN;
SELECT plan(59);
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

SELECT is(coalesce(current_setting('idempotency.scope', true), ''), '', 'idempotency.scope is not set in this session');

CREATE ROLE regress_idem_targ_a;
CREATE ROLE regress_idem_targ_b;
CREATE ROLE regress_idem_targ_none;
SELECT count(*) FROM (SELECT idem_grant(k, r)
  FROM unnest('{client,reconciler,consumer,monitor}'::text[]) k,
       unnest('{regress_idem_targ_a,regress_idem_targ_b,regress_idem_targ_none}'::regrole[]) r) g;
SELECT idem_tenant_isolation();

-- 1. the functions and the table ------------------------------------------------------------------
SELECT lives_ok($$SELECT idem_grant_tenant('t1', 'regress_idem_targ_a')$$, 'idem_grant_tenant');
SELECT lives_ok($$SELECT idem_grant_tenant('t1', 'regress_idem_targ_a')$$, 'a second time changes nothing');
SELECT lives_ok($$SELECT idem_grant_tenant('t2', 'regress_idem_targ_b')$$, 'another role, another tenant');
SELECT results_eq($$SELECT role::text COLLATE "default", tenant FROM idem_tenant_members
                    WHERE role::text LIKE 'regress_idem_targ_%' ORDER BY 1, 2$$,
                  $$VALUES ('regress_idem_targ_a', 't1'), ('regress_idem_targ_b', 't2')$$,
                  'idem_tenant_members lists them, by role name');
SELECT results_eq($$SELECT polrelid::regclass::text, array_to_string(polroles::regrole[], ',') FROM pg_policy
                    WHERE polname = 'idem_tenant_members' ORDER BY 1$$,
                  $$VALUES ('idem_inbox', 'regress_idem_targ_a,regress_idem_targ_b'),
                           ('idem_inbox_streams', 'regress_idem_targ_a,regress_idem_targ_b'),
                           ('idem_outbox', 'regress_idem_targ_a,regress_idem_targ_b'),
                           ('idempotency_records', 'regress_idem_targ_a,regress_idem_targ_b')$$,
                  'its trigger makes the policy idem_tenant_members on the four tables, for these roles only');
SELECT throws_ok($$SELECT idem_grant_tenant('t1/orders', 'regress_idem_targ_a')$$, '22023',
                 'tenant "t1/orders" must be a name without "/"', 'a tenant has no "/"');
SELECT throws_ok($$SELECT idem_grant_tenant('', 'regress_idem_targ_a')$$, '22023', NULL, 'nor is it empty');
SELECT throws_ok($$SELECT idem_grant_tenant(NULL, 'regress_idem_targ_a')$$, '22004',
                 'tenant and grantee must not be NULL', 'NULL is an error');
SELECT throws_ok($$SELECT idem_grant_tenant('t1', 0::oid::regrole)$$, '22023', 'grantee must be a role', 'PUBLIC is refused');
SET LOCAL ROLE regress_idem_targ_a;
SELECT throws_ok($$SELECT idem_grant_tenant('t2', 'regress_idem_targ_a')$$, '42501', NULL,
                 'a role cannot allow itself a tenant');
SELECT throws_ok($$INSERT INTO idem_tenant_members VALUES ('regress_idem_targ_a', 't2')$$, '42501', NULL,
                 'nor write the table');
SELECT is(idem_role_tenants(), '{t1}'::text[], 'idem_role_tenants: the current role''s tenants');
SELECT throws_ok($$SELECT * FROM idem_tenant_members$$, '42501', NULL,
                 'a role cannot read idem_tenant_members (another role''s tenants are not its business)');
SET LOCAL ROLE regress_idem_targ_none;
SELECT is(idem_role_tenants(), '{}'::text[], 'a role allowed no tenant has none');
RESET ROLE;

-- 2. every function with the argument alone ------------------------------------------------------
SET LOCAL ROLE regress_idem_targ_a;
SELECT results_eq($$SELECT outcome::text, token FROM idem_claim('targ.k', '\x01', scope => 't1/orders')$$,
                  $$VALUES ('new', 1::bigint)$$, 'idem_claim in t1/orders, without idempotency.scope');
SELECT is((SELECT outcome::text FROM idem_claim('targ.k', '\x01', scope => 't1/orders', wait => false)),
          'in_progress', 'wait => false answers at once: in progress');
SELECT lives_ok($$SELECT idem_checkpoint('targ.k', 1, 'charged', scope => 't1/orders')$$, 'idem_checkpoint');
SELECT lives_ok($$SELECT idem_complete('targ.k', 1, '{"order": 1}', 201, scope => 't1/orders')$$, 'idem_complete');
SELECT is((SELECT status::text FROM idem_lookup('targ.k', 't1/orders')), 'succeeded', 'idem_lookup');
SELECT is((SELECT status::text FROM idem_await('targ.k', 't1/orders', '0')), 'succeeded', 'idem_await');
SELECT results_eq($$SELECT outcome::text, result FROM idem_claim('targ.k', '\x01', scope => 't1/orders', wait => false)$$,
                  $$VALUES ('replay', '{"order": 1}'::jsonb)$$, 'a replay');
SELECT is((SELECT outcome::text FROM idem_claim('targ.f', '\x01', scope => 't1')), 'new', 'a claim in the tenant itself');
SELECT lives_ok($$SELECT idem_fail('targ.f', 1, '{"e": 1}', true, scope => 't1')$$, 'idem_fail');
SELECT is((SELECT outcome::text FROM idem_claim('targ.r', '\x01', scope => 't1//x')), 'new', 'a claim in t1//x');
SELECT lives_ok($$SELECT idem_release('targ.r', 1, scope => 't1//x')$$, 'idem_release');
SELECT is((SELECT outcome::text FROM idem_claim('targ.u', '\x01', scope => 't1/pay')), 'new', 'a claim in t1/pay');
SELECT lives_ok($$SELECT idem_mark_unknown('targ.u', 1, '{"timeout": true}', scope => 't1/pay')$$, 'idem_mark_unknown');
SELECT results_eq($$SELECT scope COLLATE "default", reason FROM idem_stuck WHERE key LIKE 'targ.%'$$,
                  $$VALUES ('t1/pay', 'unknown outcome')$$, 'idem_stuck shows it');
SELECT results_eq($$SELECT DISTINCT scope COLLATE "default" FROM idem_summary ORDER BY 1$$,
                  $$VALUES ('t1'), ('t1//x'), ('t1/orders'), ('t1/pay')$$, 'idem_summary counts t1''s scopes');
SELECT lives_ok($$SELECT idem_resolve('targ.u', 'succeeded', '{"paid": true}', scope => 't1/pay')$$, 'idem_resolve');
SELECT is((SELECT status::text FROM idem_lookup('targ.u', 't1/pay')), 'succeeded', 'resolved');
SELECT ok((SELECT idem_inbox_accept('t1/billing', 'targ.m1')), 'idem_inbox_accept for consumer t1/billing');
SELECT ok(NOT (SELECT idem_inbox_accept('t1/billing', 'targ.m1', wait => false)), 'a duplicate, at once');
SELECT is(idem_inbox_accept_seq('t1/billing', 'targ.s', 1), 'new', 'idem_inbox_accept_seq');
SELECT is(idem_inbox_watermark('t1/billing', 'targ.s'), 1::bigint, 'idem_inbox_watermark');

-- the other tenant's scopes: refused
SELECT throws_ok($$SELECT * FROM idem_claim('targ.k', '\x01', scope => 't2/orders')$$, '42501',
                 'scope "t2/orders" does not belong to the tenant of this session', 'a claim in t2 is refused');
SELECT throws_ok($$SELECT * FROM idem_claim('targ.k', '\x01', scope => 't2/orders', wait => false)$$, '42501', NULL,
                 'also with wait => false');
SELECT throws_ok($$SELECT * FROM idem_claim('targ.k', '\x01', scope => 't10/orders')$$, '42501', NULL,
                 'and in t10, a neighbour');
SELECT throws_ok($$SELECT idem_inbox_accept('t2/billing', 'targ.m1')$$, '42501', NULL, 'an accept as t2/billing');
RESET ROLE;

-- 3. the next client of the session: the t2 role, still nothing SET
SET LOCAL ROLE regress_idem_targ_b;
SELECT is(coalesce(current_setting('idempotency.scope', true), ''), '', 'still no idempotency.scope');
SELECT is_empty($$SELECT * FROM idempotency_records WHERE key LIKE 'targ.%'$$, 'the t2 role sees none of t1''s records');
SELECT is_empty($$SELECT * FROM idem_lookup('targ.k', 't1/orders')$$, 'idem_lookup of t1''s key: no row');
SELECT is_empty($$SELECT * FROM idem_await('targ.k', 't1/orders', '0')$$, 'idem_await: no row');
SELECT is_empty($$SELECT * FROM idem_stuck WHERE key LIKE 'targ.%'$$, 'idem_stuck: nothing');
SELECT is_empty($$SELECT * FROM idem_inbox WHERE consumer LIKE 't1%'$$, 'nor t1''s inbox');
SELECT is((SELECT array_agg(DISTINCT pg_temp.sqlstate_of(c.sql)) FROM (VALUES
               ($$SELECT idem_complete('targ.f', 1, '{}', 200, scope => 't1')$$),
               ($$SELECT idem_fail('targ.f', 1, '{}', scope => 't1')$$),
               ($$SELECT idem_checkpoint('targ.f', 1, 'x', scope => 't1')$$),
               ($$SELECT idem_release('targ.f', 1, scope => 't1')$$),
               ($$SELECT idem_mark_unknown('targ.f', 1, '{}', scope => 't1')$$),
               ($$SELECT idem_resolve('targ.u', 'failed', scope => 't1/pay')$$)) c(sql)),
          '{IK004}'::text[], 't1''s keys with their tokens: IK004, the key does not exist for t2');
SELECT results_eq($$SELECT outcome::text FROM idem_claim('targ.k', '\x01', scope => 't2/orders')$$,
                  $$VALUES ('new')$$, 'the same key in t2/orders is t2''s own');
SELECT throws_ok($$SELECT * FROM idem_claim('targ.k', '\x01', scope => 't1/orders')$$, '42501', NULL,
                 'and t1/orders is refused to t2');
RESET ROLE;

-- 4. no tenant, revocation -------------------------------------------------------------------------
SET LOCAL ROLE regress_idem_targ_none;
SELECT is_empty($$SELECT * FROM idempotency_records$$, 'a role allowed no tenant, with no setting, sees nothing');
SELECT throws_ok($$SELECT * FROM idem_claim('targ.n', '\x01', scope => 't1')$$, '42501', NULL, 'and claims nothing');
RESET ROLE;
SELECT lives_ok($$SELECT idem_revoke_tenant('t1', 'regress_idem_targ_a')$$, 'idem_revoke_tenant');
SET LOCAL ROLE regress_idem_targ_a;
SELECT is_empty($$SELECT * FROM idempotency_records WHERE key LIKE 'targ.%'$$, 'then the role sees t1 no more');
RESET ROLE;
SELECT lives_ok($$SELECT idem_revoke_all('regress_idem_targ_b')$$, 'idem_revoke_all');
SELECT is_empty($$SELECT * FROM idem_tenant_members WHERE role::text LIKE 'regress_idem_targ_%'$$,
                'takes the tenants too');
SELECT is_empty($$SELECT * FROM pg_policy WHERE polname = 'idem_tenant_members'$$,
                'and with no role left, there is no policy idem_tenant_members');

-- 5. the allowed role is the role, not its name ------------------------------------------------
CREATE ROLE regress_idem_targ_c;
SELECT idem_grant('client', 'regress_idem_targ_c');
SELECT idem_grant_tenant('t1', 'regress_idem_targ_c');
ALTER ROLE regress_idem_targ_c RENAME TO regress_idem_targ_c2;
SET LOCAL ROLE regress_idem_targ_c2;
SELECT is(idem_role_tenants(), '{t1}'::text[], 'a renamed role keeps its tenants');
RESET ROLE;
-- DROP OWNED takes the role's privileges: a role that is no superuser has
-- them only as a member that inherits them, which no creator is by itself
SELECT current_setting('server_version_num')::int >= 160000 AS pg16 \gset
\if :pg16
GRANT regress_idem_targ_c2 TO CURRENT_USER WITH INHERIT TRUE;
\else
GRANT regress_idem_targ_c2 TO CURRENT_USER;
\endif
DROP OWNED BY regress_idem_targ_c2;
DROP ROLE regress_idem_targ_c2;
CREATE ROLE regress_idem_targ_c2;
SELECT idem_grant('client', 'regress_idem_targ_c2');
SELECT idem_grant_tenant('t2', 'regress_idem_targ_a');   -- any change rebuilds the policies
SET LOCAL ROLE regress_idem_targ_c2;
SELECT is(idem_role_tenants(), '{}'::text[], 'a new role of a dropped role''s name gets none of its tenants');
SELECT is_empty($$SELECT * FROM idempotency_records WHERE key LIKE 'targ.%'$$, 'and sees no record');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
