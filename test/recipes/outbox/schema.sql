-- The outbox recipe's table, applied by outbox/check as a superuser at each
-- run: idempotent.  The role api emits (the application) and relays too; in
-- production give the relay a role of its own: idem_grant('relay', ...).
CREATE TABLE IF NOT EXISTS order_status (
    id text PRIMARY KEY,
    status text NOT NULL);
GRANT SELECT, INSERT, UPDATE ON order_status TO api;
SELECT idem_grant('emitter', 'api'), idem_grant('relay', 'api');
