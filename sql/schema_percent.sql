--
-- The extension in a schema with a "%" in its name (issue 25): the functions
-- that build statements with format() pass the schema as an argument, so
-- that idem_grant (global_reconciler), idem_grant_tenant, idem_revoke_tenant
-- and idem_revoke_all (through the triggers that rebuild the policies) and
-- idem_attach_machine work there.
--
-- Runs in a database of its own, dropped at the end.
--

SELECT current_database() AS regress_db \gset
SET client_min_messages = warning;
DROP DATABASE IF EXISTS regress_idem_schema_percent;
DROP ROLE IF EXISTS regress_idem_pct_a;
RESET client_min_messages;
CREATE DATABASE regress_idem_schema_percent;
\c regress_idem_schema_percent
\i sql/include/expect_error.sql
CREATE ROLE regress_idem_pct_a;
CREATE SCHEMA "idem%s";
CREATE EXTENSION idempotency SCHEMA "idem%s";

-- the policies of the global reconcilers and of the tenants
SELECT "idem%s".idem_grant('client', 'regress_idem_pct_a');
SELECT "idem%s".idem_grant('global_reconciler', 'regress_idem_pct_a');
SELECT "idem%s".idem_grant_tenant('t1', 'regress_idem_pct_a');
SELECT polrelid::regclass AS "table", polname, polroles::regrole[] AS roles,
       pg_get_expr(polqual, polrelid) AS using
FROM pg_policy
WHERE polname LIKE 'idem_global_reconciler%' OR polname = 'idem_tenant_members'
ORDER BY 1, 2;

-- a claim in the role's tenant, without idempotency.scope
SELECT "idem%s".idem_tenant_isolation();
SET ROLE regress_idem_pct_a;
SELECT outcome FROM "idem%s".idem_claim('k', '\x01', '1 hour', scope => 't1/orders');
SELECT pg_temp.expect_error($$SELECT * FROM "idem%s".idem_claim('k', '\x01', '1 hour', scope => 't2/orders')$$);
RESET ROLE;
SELECT "idem%s".idem_tenant_isolation(false);

-- a state machine attached, with its log
CREATE TABLE pay (id int PRIMARY KEY, status text);
SELECT "idem%s".idem_define_machine('pay', '{"NEW": ["PAID"], "PAID": []}', initial => '{NEW}');
SELECT "idem%s".idem_attach_machine('pay', 'status', 'pay', log => true);
INSERT INTO pay VALUES (1, 'NEW');
UPDATE pay SET status = 'PAID';
SELECT pg_temp.expect_error($$UPDATE pay SET status = 'NEW'$$);
SELECT pg_temp.expect_error($$INSERT INTO pay VALUES (2, 'PAID')$$);
SELECT row_key, from_state, to_state FROM pay_state_log ORDER BY logged_at;
SELECT tgname, pg_get_triggerdef(oid) AS definition
FROM pg_trigger WHERE tgrelid = 'pay'::regclass ORDER BY 1;

-- revoked: no policy is left, and the role can be dropped
SELECT "idem%s".idem_revoke_tenant('t1', 'regress_idem_pct_a');
SELECT "idem%s".idem_revoke_all('regress_idem_pct_a');
SELECT count(*) AS policies FROM pg_policy
WHERE polname LIKE 'idem_global_reconciler%' OR polname = 'idem_tenant_members';
DROP ROLE regress_idem_pct_a;

\c :regress_db
DROP DATABASE regress_idem_schema_percent;
