-- The business tables of test/clients' services, and their roles.  No
-- unique constraint on (tenant, idem_key): the extension alone must keep one
-- row per key (the test counts).

-- The extension, unless its functions are there already: installed before
-- (README "An HTTP endpoint"), or the SQL edition's plain script's, which
-- makes no extension.
SELECT NOT EXISTS (SELECT FROM pg_proc WHERE proname = 'idem_claim' AND pg_function_is_visible(oid))
       AS idem_missing \gset
\if :idem_missing
CREATE EXTENSION idempotency;
\endif
CREATE TABLE orders (id bigserial PRIMARY KEY, tenant text NOT NULL, idem_key text NOT NULL,
                     sku text, qty int);
CREATE TABLE payments (id bigserial PRIMARY KEY, tenant text NOT NULL, idem_key text NOT NULL,
                       charge_id text NOT NULL, amount int NOT NULL);

-- The services' role works in the tenants t1 and t2 (not t3) with the scope
-- argument alone; the reconciler sees and resolves every tenant's unknown
-- records.  Then tenant isolation: nothing else is visible to either.
CREATE ROLE api LOGIN;
CREATE ROLE reconciler LOGIN;
SELECT idem_grant('client', 'api');
SELECT idem_grant_tenant('t1', 'api'), idem_grant_tenant('t2', 'api');
SELECT idem_grant('global_reconciler', 'reconciler');
GRANT SELECT, INSERT ON orders, payments TO api;
GRANT INSERT ON payments TO reconciler;
GRANT USAGE ON SEQUENCE orders_id_seq, payments_id_seq TO api;
GRANT USAGE ON SEQUENCE payments_id_seq TO reconciler;
SELECT idem_tenant_isolation();
-- The driver's own connection is the owner's (test/clients/run), whom forced
-- isolation binds too (the C edition's owner is a superuser, who bypasses
-- it): it writes in t1 and t2 and checks that nothing was written in t3.
SELECT idem_grant_tenant(t, quote_ident(current_user)::regrole) FROM unnest('{t1,t2,t3}'::text[]) t;
