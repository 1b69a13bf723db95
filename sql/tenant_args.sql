-- idem-test: superuser: SET SESSION AUTHORIZATION, which stands for the two clients' logins, is a superuser's
--
-- Tenant as an argument, in autocommit (issue 14): each statement below is
-- its own transaction and nothing SETs idempotency.scope.  A role allowed t1
-- runs a multi-phase step (claim, checkpoint, complete) as three autocommit
-- calls; the next "client" of the same session (a role allowed
-- t2, as a pooler hands the server connection on) sees none of it; SET
-- SESSION AUTHORIZATION stands for the two clients' logins.
--
\i sql/include/expect_error.sql
CREATE ROLE regress_idem_targ_a;
CREATE ROLE regress_idem_targ_b;
SELECT count(*) FROM (SELECT idem_grant(k, r)
                        FROM unnest('{client,monitor}'::text[]) k,
                             unnest('{regress_idem_targ_a,regress_idem_targ_b}'::regrole[]) r) g;
SELECT idem_grant_tenant('t1', 'regress_idem_targ_a');
SELECT idem_grant_tenant('t2', 'regress_idem_targ_b');
SELECT idem_tenant_isolation();
SET SESSION AUTHORIZATION regress_idem_targ_a;
SELECT coalesce(current_setting('idempotency.scope', true), '') AS scope_setting;
SELECT outcome, token FROM idem_claim('targ.pay', '\x01', scope => 't1/payments');
SELECT outcome FROM idem_claim('targ.pay', '\x01', scope => 't1/payments', wait => false);
SELECT idem_checkpoint('targ.pay', 1, 'charged', scope => 't1/payments') IS NOT NULL AS checkpointed;
SELECT idem_complete('targ.pay', 1, '{"payment_id": 7}', 201, scope => 't1/payments');
SELECT outcome, result, response_code FROM idem_claim('targ.pay', '\x01', scope => 't1/payments');
SELECT pg_temp.expect_error($$SELECT * FROM idem_claim('targ.pay', '\x01', scope => 't2/payments')$$);
SELECT scope, key, status FROM idempotency_records WHERE key LIKE 'targ.%';
RESET SESSION AUTHORIZATION;
-- the next client of this server connection
SET SESSION AUTHORIZATION regress_idem_targ_b;
SELECT coalesce(current_setting('idempotency.scope', true), '') AS scope_setting;
SELECT count(*) FROM idempotency_records WHERE key LIKE 'targ.%';
SELECT count(*) FROM idem_lookup('targ.pay', 't1/payments');
SELECT count(*) FROM idem_summary WHERE scope LIKE 't1%';
SELECT pg_temp.expect_error($$SELECT * FROM idem_claim('targ.pay', '\x01', scope => 't1/payments')$$);
SELECT outcome FROM idem_claim('targ.pay', '\x01', scope => 't2/payments');
RESET SESSION AUTHORIZATION;
-- clean up
SELECT idem_tenant_isolation(false);
DELETE FROM idempotency_records WHERE key LIKE 'targ.%';
SELECT idem_revoke_all('regress_idem_targ_a'), idem_revoke_all('regress_idem_targ_b');
SELECT count(*) FROM idem_tenant_members;
DROP ROLE regress_idem_targ_a;
DROP ROLE regress_idem_targ_b;
