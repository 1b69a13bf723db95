-- The business tables of the end-to-end test (test/outbox/run).
--   e2e_keys   one row per message key: the last sequence number emitted
--              for it (its row lock orders the emits of a key)
--   emits      one row per committed emit, written in the emit's transaction
--   rolled_back  ids of emits whose transaction rolled back (written after
--              the rollback, on another connection)
--   applied    one row per message the consumers applied, in the order
--              they applied them (order_no); no unique constraint, so a
--              message applied twice shows as two rows
CREATE EXTENSION idempotency;
CREATE TABLE e2e_keys (key text PRIMARY KEY, n integer NOT NULL DEFAULT 0);
CREATE TABLE emits (id uuid PRIMARY KEY, key text NOT NULL, n integer NOT NULL);
CREATE TABLE rolled_back (id uuid PRIMARY KEY);
CREATE TABLE applied (order_no bigserial PRIMARY KEY, msg_id uuid NOT NULL, key text NOT NULL,
                      n integer NOT NULL, consumer text NOT NULL);
INSERT INTO e2e_keys (key) SELECT 'k' || i FROM generate_series(1, 40) i;
INSERT INTO e2e_keys (key) SELECT 'pg' || i FROM generate_series(1, 20) i;
-- The workloads' roles, of the kinds the README recommends (idem_grant),
-- created by the owner, who runs this file (test/outbox/run); the owner
-- itself only reads for the checks.
CREATE ROLE e2e_emitter LOGIN;
CREATE ROLE e2e_relay LOGIN;
CREATE ROLE e2e_consumer LOGIN;
SELECT idem_grant('emitter', 'e2e_emitter'), idem_grant('relay', 'e2e_relay'),
       idem_grant('consumer', 'e2e_consumer');
GRANT SELECT, UPDATE ON e2e_keys TO e2e_emitter;
GRANT INSERT ON emits, rolled_back TO e2e_emitter;
GRANT INSERT ON applied TO e2e_consumer;
GRANT USAGE ON SEQUENCE applied_order_no_seq TO e2e_consumer;
-- Attempts count every claim; broker restarts must not kill messages.  The
-- relays' connections set idempotency.outbox_max_attempts (test/outbox/run):
-- on 15 only a superuser may ALTER DATABASE or ROLE ... SET a setting
-- that no loaded library defines (the SQL edition's).
