--
-- Without shared_preload_libraries: what holds only when the library is
-- loaded on first use.  test/run runs this file on a cluster of its own that
-- does not preload the library (the rest of the suite runs preloaded).
--
--   idem_stats(), idem_stats_reset()   55000 with a hint: statistics live in
--                                      shared memory, reserved only at start
--   everything else works: a claim is not refused
--

\i sql/include/expect_error.sql

SELECT current_setting('shared_preload_libraries') !~ 'idempotency' AS not_preloaded;

SELECT pg_temp.expect_error($$SELECT * FROM idem_stats()$$);
SELECT pg_temp.expect_error($$SELECT idem_stats_reset()$$);
-- the same without the helper, as a client sees it
SELECT * FROM idem_stats();
-- ... and counting still works without them: a claim is not refused.
SELECT outcome, token > 0 AS has_token FROM idem_claim('un-stats', '\x01', '1 hour');
SELECT idem_complete('un-stats', (SELECT token FROM idempotency_records WHERE key = 'un-stats'));
DELETE FROM idempotency_records WHERE key = 'un-stats';

-- idem_stats is PUBLIC: a role without grants gets the same 55000; the
-- reset is granted only, so it is refused before anything else.
SET client_min_messages = warning;
DROP ROLE IF EXISTS regress_idem_unpreloaded;
RESET client_min_messages;
CREATE ROLE regress_idem_unpreloaded;
SET ROLE regress_idem_unpreloaded;
SELECT pg_temp.expect_error($$SELECT * FROM idem_stats()$$);
SELECT pg_temp.expect_error($$SELECT idem_stats_reset()$$);
RESET ROLE;
DROP ROLE regress_idem_unpreloaded;

-- idempotency.max_waiters: without shared memory waiters cannot be counted,
-- so the limit does not apply (idem_await waits its timeout), except that 0
-- still means no waiting at all.
SELECT outcome FROM idem_claim('un-await', '\x01', '1 hour');
SET idempotency.max_waiters = 1;
SELECT clock_timestamp() AS t0 \gset
SELECT status FROM idem_await('un-await', '', '200 ms');
SELECT clock_timestamp() - :'t0' >= '200 ms' AS waited;
SET idempotency.max_waiters = 0;
SELECT clock_timestamp() AS t0 \gset
SELECT status FROM idem_await('un-await', '', '30 s');
SELECT clock_timestamp() - :'t0' < '20 s' AS answered_at_once;
RESET idempotency.max_waiters;
DELETE FROM idempotency_records WHERE key = 'un-await';
