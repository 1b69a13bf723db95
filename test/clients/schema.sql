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
-- orders: the README's Quick start makes the same table in the same database
CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, tenant text NOT NULL DEFAULT '',
                                   idem_key text NOT NULL, sku text, qty int);
CREATE TABLE payments (id bigserial PRIMARY KEY, tenant text NOT NULL, idem_key text NOT NULL,
                       charge_id text NOT NULL, amount int NOT NULL);

-- The services' role works in the tenants t1 and t2 (not t3) with the scope
-- argument alone; the reconciler sees and resolves every tenant's unknown
-- records.  Under tenant isolation, which test/clients/run turns on after
-- this file (the README's database goes on with examples in the default
-- scope), nothing else is visible to either.
CREATE ROLE api LOGIN;
CREATE ROLE reconciler LOGIN;
SELECT idem_grant('client', 'api');
SELECT idem_grant_tenant('t1', 'api'), idem_grant_tenant('t2', 'api');
SELECT idem_grant('global_reconciler', 'reconciler');
GRANT SELECT, INSERT ON orders, payments TO api;
GRANT INSERT ON payments TO reconciler;
GRANT USAGE ON SEQUENCE orders_id_seq, payments_id_seq TO api;
GRANT USAGE ON SEQUENCE payments_id_seq TO reconciler;
