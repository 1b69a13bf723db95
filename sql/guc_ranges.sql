-- idem-test: c-edition-only: the range checks of registered settings (SET refuses a value out of range); the SQL edition has no library to register idempotency.*, only placeholders
--
-- The range errors of the settings that have a unit.  PostgreSQL writes the
-- message, and from 17 it names the unit in the range too ("(1 ms ..
-- 2147483647 ms)" where 15 says "(1 .. 2147483647)"), so PostgreSQL 17 and 18
-- compare against guc_ranges_1.out.  A refused value leaves the setting as
-- it was.  The other checks of the settings: surface.sql, bad_input.sql.
--
\i sql/include/expect_error.sql
SELECT count(*) FROM idem_version();  -- loads the library: its settings exist

SELECT pg_temp.expect_error($$SET idempotency.default_lease = 0$$);
SELECT pg_temp.expect_error($$SET idempotency.default_lease = '-1s'$$);
SELECT pg_temp.expect_error($$SET idempotency.default_lease = '25 days'$$);
SHOW idempotency.default_lease;

SELECT pg_temp.expect_error($$SET idempotency.retention = 0$$);
SELECT pg_temp.expect_error($$SET idempotency.retention = '-1s'$$);
SELECT pg_temp.expect_error($$SET idempotency.retention = '69 years'$$);
SHOW idempotency.retention;
