-- The business tables of test/clients' services.  No unique constraint on
-- idem_key: the extension alone must keep one row per key (the test counts).
CREATE EXTENSION IF NOT EXISTS idempotency;
CREATE TABLE orders (id bigserial PRIMARY KEY, idem_key text NOT NULL, sku text, qty int);
CREATE TABLE payments (id bigserial PRIMARY KEY, idem_key text NOT NULL,
                       charge_id text NOT NULL, amount int NOT NULL);
