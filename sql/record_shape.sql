--
-- The store reads and returns records by column position, so a column added
-- to (or dropped from) idempotency_records is refused with a clear error
-- (55000, with a hint) wherever the table's row type is read or returned:
-- the direct primary-key read of claims and lookups, and the rows that
-- idem_lookup and idem_await return, on either path.  The statements of the
-- SPI path (roles with column privileges or row-level security) name their
-- columns, so a claim through them does not depend on the table's shape.
-- A column added and dropped again leaves a dropped attribute at the end of
-- the row type, which changes nothing.  All of it happens in a transaction
-- that is rolled back (psql's ON_ERROR_ROLLBACK keeps it open after each
-- error), so the other tests keep a table without dropped attributes.
--
\i sql/include/expect_error.sql
SELECT outcome, token FROM idem_claim('shape-1', '\x01');
CREATE ROLE regress_shape;
SELECT idem_grant('client', 'regress_shape');
-- column privileges only: this role reads through SPI
REVOKE SELECT ON idempotency_records FROM regress_shape;
GRANT SELECT (scope, key, fingerprint, token, lease_expires_at, created_at, updated_at,
              completed_at, expires_at, purge_after, status, attempts, response_code,
              retryable, recovery_point, result, error, response_headers)
    ON idempotency_records TO regress_shape;

\set ON_ERROR_ROLLBACK on
BEGIN;
ALTER TABLE idempotency_records ADD COLUMN note text DEFAULT 'added';
-- the direct read (this role has table-level SELECT)
SELECT pg_temp.expect_error($$SELECT idem_claim('shape-1', '\x01')$$);
SELECT pg_temp.expect_error($$SELECT idem_claim('shape-2', '\x01')$$);
SELECT pg_temp.expect_error($$SELECT * FROM idem_lookup('shape-1')$$);
SELECT pg_temp.expect_error($$SELECT * FROM idem_await('shape-1', '', '0 s')$$);
-- the SPI path
SET ROLE regress_shape;
SELECT outcome, status FROM idem_claim('shape-1', '\x01');
SELECT pg_temp.expect_error($$SELECT * FROM idem_lookup('shape-1')$$);
SELECT pg_temp.expect_error($$SELECT note FROM idem_await('shape-1', '', '0 s')$$);
RESET ROLE;

-- back in shape (with a dropped attribute at the end): everything works again
ALTER TABLE idempotency_records DROP COLUMN note;
SELECT outcome FROM idem_claim('shape-1', '\x01');
SELECT outcome, token FROM idem_claim('shape-3', '\x01');
SELECT key, status, token FROM idem_lookup('shape-1');
SELECT key, status, token FROM idem_await('shape-3', '', '0 s');
SET ROLE regress_shape;
SELECT outcome FROM idem_claim('shape-3', '\x01');
SELECT key, status, token FROM idem_lookup('shape-1');
SELECT key, status, token FROM idem_await('shape-3', '', '0 s');
RESET ROLE;
ROLLBACK;
\set ON_ERROR_ROLLBACK off

DELETE FROM idempotency_records WHERE key LIKE 'shape-%';
SELECT setval('idem_token_epoch', 1, false) AS epoch_reset;  -- a DELETE moves the epoch
SELECT idem_revoke_all('regress_shape');
DROP ROLE regress_shape;
