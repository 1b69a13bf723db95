-- The payments recipe's table of charges, applied by check as a superuser (again at
-- each run: idempotent).  The runner made the role api a client
-- (idem_grant); the reconciler runs inside the service, as api too.
CREATE TABLE IF NOT EXISTS charges (
    key text PRIMARY KEY,               -- the Idempotency-Key, also the provider's payment id
    charge_id text NOT NULL,
    amount int NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now());
GRANT SELECT, INSERT ON charges TO api;
SELECT idem_grant('reconciler', 'api');   -- idem_resolve, for the reconciler
