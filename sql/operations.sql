--
-- Operations: the statistics functions without shared_preload_libraries,
-- idem_await, the views idem_stuck and idem_summary, and which records
-- idem_purge removes.
--
--   idem_stats(), idem_stats_reset()   55000 with a hint: pg_regress does not
--                                      preload the library
--   idem_await(key, scope => '', timeout => '5 seconds')
--       the record once it is no longer processing (finished, unknown,
--       released, or its lease expired), or gone, or as it is when the
--       timeout passes, never with the token; a zero timeout is a plain
--       read; under REPEATABLE READ it reads once
--   idem_stuck     unknown outcomes and expired leases, oldest first
--   idem_summary   records by scope and status, with the purgeable ones
--   idem_purge     deletes succeeded, failed and released records past
--                  expires_at, never owned (live or abandoned) or unknown ones
--
-- Timestamps are never printed: leases show as live / expired / none, an
-- await shows whether it waited (no / the timeout), ages and expiries as
-- booleans.  Waits are 100 ms; an await that must return at once gets a 5 s
-- timeout, so that returning at once and waiting it out are far apart.
--

-- Errors are shown as "ERROR:  <SQLSTATE>: <message>" with DETAIL and HINT.
-- '1 day -25 hours' is negative on every day only where no day has 25
-- hours: pg_regress's PST8PDT has one a year
SET TimeZone = 'UTC';
\i sql/include/expect_error.sql
CREATE FUNCTION pg_temp.lease(expires timestamptz) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN expires IS NULL THEN 'none'
                WHEN expires > clock_timestamp() THEN 'live'
                ELSE 'expired' END
$$;

-- What idem_await returned (n = number of rows, 0 or 1) and how long it took:
-- "no" = returned well before its timeout (or at once for a zero timeout),
-- "the timeout" = returned when the timeout had passed, not much later.
CREATE FUNCTION pg_temp.await(k text, s text, timeout interval,
    OUT n bigint, OUT status idem_status, OUT lease text, OUT outcome jsonb, OUT waited text)
LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
    took interval;
BEGIN
    SELECT count(*) OVER (), a.status, pg_temp.lease(a.lease_expires_at), coalesce(a.result, a.error)
    INTO n, status, lease, outcome
    FROM idem_await(k, s, timeout) a;
    took := clock_timestamp() - t0;
    n := coalesce(n, 0);
    waited := CASE
        WHEN took < timeout AND took < interval '1 s' THEN 'no'
        WHEN timeout = interval '0' AND took < interval '1 s' THEN 'no'
        WHEN took >= timeout AND took < timeout + interval '2 s' THEN 'the timeout'
        ELSE 'unexpected: ' || took END;
END
$$;

-- This test's records all have keys starting with 'op-'.  Expired rows that
-- earlier tests left would be counted by the purges below: purge them first.
-- Purging moves the token epoch (not transactional); put it back, so that
-- new keys start at token 1 again.
DELETE FROM idempotency_records WHERE key LIKE 'op-%';
SELECT idem_purge() >= 0 AS leftovers_purged;
SELECT setval('idem_token_epoch', 1, false) AS epoch_reset;

--
-- Statistics live in shared memory: test/run preloads the library (the
-- error without preloading is checked by test/unpreloaded).  Counters are
-- cluster-wide and the purge worker counts what it purges, so only the
-- claim counters, which nothing else moves during this test, are compared.
--
-- The SQL edition has no counters (README, "What needs the C library"):
-- both functions raise 55000 with a hint of its own there
-- (test/edition/expected/operations.out); the claims run all the same.
SELECT NOT EXISTS (SELECT FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
                   WHERE p.proname = 'idem_claim' AND l.lanname = 'c'
                     AND p.pronamespace = (SELECT extnamespace FROM pg_extension WHERE extname = 'idempotency'))
       AS sql_edition \gset
\if :sql_edition
SELECT pg_temp.expect_error($$SELECT count(*) FROM idem_stats()$$);
SELECT outcome, token FROM idem_claim('op-stats', '\x01', '1 hour');
SELECT outcome FROM idem_claim('op-stats', '\x01', '1 hour');
SELECT pg_temp.expect_error($$SELECT idem_stats_reset()$$);
\else
SELECT count(*) AS counters, bool_and(value >= 0) AS not_negative,
       bool_and(since IS NOT NULL) AS have_since
FROM idem_stats();
\set counter 'SELECT value FROM idem_stats() WHERE counter = '
SELECT (:counter 'claims_new') AS new_before, (:counter 'claims_in_progress') AS in_progress_before \gset
SELECT outcome, token FROM idem_claim('op-stats', '\x01', '1 hour');
SELECT outcome FROM idem_claim('op-stats', '\x01', '1 hour');
SELECT (:counter 'claims_new') - :new_before AS new_counted,
       (:counter 'claims_in_progress') - :in_progress_before AS in_progress_counted;
SELECT idem_stats_reset();
SELECT value AS claims_new_after_reset FROM idem_stats() WHERE counter = 'claims_new';
\endif
DELETE FROM idempotency_records WHERE key = 'op-stats';
SELECT setval('idem_token_epoch', 1, false) AS epoch_reset;  -- a DELETE moves the epoch

--
-- idem_await: arguments
--
SELECT pg_temp.expect_error($$SELECT * FROM idem_await(NULL)$$);
SELECT pg_temp.expect_error($$SELECT * FROM idem_await(NULL, '', '1 s')$$);
SELECT pg_temp.expect_error($$SELECT * FROM idem_await('op-aw', NULL)$$);
SELECT pg_temp.expect_error($$SELECT * FROM idem_await('op-aw', '', NULL)$$);
SELECT pg_temp.expect_error($$SELECT * FROM idem_await('', '', '1 s')$$);
SELECT pg_temp.expect_error($$SELECT * FROM idem_await(repeat('k', 256))$$);
SELECT pg_temp.expect_error($$SELECT * FROM idem_await('op-aw', repeat('s', 256))$$);
SELECT pg_temp.expect_error($$SELECT * FROM idem_await('op-aw', '', '-1 s')$$);
SELECT pg_temp.expect_error($$SELECT * FROM idem_await('op-aw', '', '-1 day')$$);
SELECT pg_temp.expect_error($$SELECT * FROM idem_await('op-aw', '', '1 day -25 hours')$$);
-- a timeout that ends past the largest timestamp
SELECT pg_temp.expect_error($$SELECT * FROM idem_await('op-aw', '', '300000 years')$$);
-- none of them was a claim
SELECT count(*) AS records FROM idempotency_records WHERE key LIKE 'op-%';

--
-- idem_await: what it returns, and when
--
-- an unknown key: no row, at once
SELECT * FROM pg_temp.await('op-aw-missing', '', '5 s');
SELECT * FROM pg_temp.await('op-aw-missing', '', '0');

-- a finished record: at once
SELECT outcome, token FROM idem_claim('op-aw-done', '\x01', '1 hour');
SELECT idem_complete('op-aw-done', 1, '{"id": 1}', 201);
SELECT * FROM pg_temp.await('op-aw-done', '', '5 s');
-- the default timeout (5 seconds) does not matter either
SELECT key, token, status, attempts, response_code, result FROM idem_await('op-aw-done');
-- the whole record, as idem_lookup returns it
SELECT (SELECT a FROM idem_await('op-aw-done', '', '0') a)::text
     = (SELECT l FROM idem_lookup('op-aw-done') l)::text AS same_as_lookup;
-- a failure, retryable or not, is finished as well
SELECT outcome, token FROM idem_claim('op-aw-failed', '\x01', '1 hour');
SELECT idem_fail('op-aw-failed', 1, '{"code": "timeout"}', retryable => true);
SELECT * FROM pg_temp.await('op-aw-failed', '', '5 s');

-- a processing record with a live lease: returned as it is once the timeout
-- has passed
SELECT outcome, token FROM idem_claim('op-aw-busy', '\x01', '1 hour');
SELECT * FROM pg_temp.await('op-aw-busy', '', '100 ms');
-- a zero timeout is a plain read
SELECT * FROM pg_temp.await('op-aw-busy', '', '0');
SELECT * FROM pg_temp.await('op-aw-busy', '', '0 days');
-- another scope does not have it
SELECT * FROM pg_temp.await('op-aw-busy', 'op-other', '5 s');
-- the wait reads nothing else into the record: it is unchanged
SELECT token, status, attempts, pg_temp.lease(lease_expires_at) AS lease, updated_at = created_at AS never_updated
FROM idem_lookup('op-aw-busy');

-- an abandoned record (lease expired) is still processing: it is waited for
-- like a live one (a claim would take it over)
SELECT outcome, token FROM idem_claim('op-aw-abandoned', '\x01', '100 ms');
SELECT pg_sleep(0.3);
SELECT * FROM pg_temp.await('op-aw-abandoned', '', '100 ms');

-- an unknown outcome: at once (it waits for idem_resolve, not for its owner)
SELECT outcome, token FROM idem_claim('op-aw-unknown', '\x01', '1 hour');
SELECT idem_mark_unknown('op-aw-unknown', 1, '{"gateway": "timeout"}');
SELECT * FROM pg_temp.await('op-aw-unknown', '', '5 s');

-- a released record: processing without a lease, at once (nobody works on it)
SELECT outcome, token FROM idem_claim('op-aw-released', '\x01', '1 hour');
SELECT idem_release('op-aw-released', 1);
SELECT * FROM pg_temp.await('op-aw-released', '', '5 s');

-- under REPEATABLE READ the snapshot cannot show the owner finishing: one read
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT * FROM pg_temp.await('op-aw-busy', '', '5 s');
COMMIT;
\set ON_ERROR_ROLLBACK off
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT * FROM pg_temp.await('op-aw-busy', '', '5 s');
COMMIT;
\set ON_ERROR_ROLLBACK off

-- the caller's own transaction: its completion is seen at once
BEGIN;
SELECT outcome, token FROM idem_claim('op-aw-own', '\x01', '1 hour');
SELECT * FROM pg_temp.await('op-aw-own', '', '100 ms');
SELECT idem_complete('op-aw-own', 1, '{"own": true}');
SELECT * FROM pg_temp.await('op-aw-own', '', '5 s');
ROLLBACK;
SELECT * FROM pg_temp.await('op-aw-own', '', '0');

-- a cancel interrupts the wait
SET statement_timeout = '200ms';
SELECT * FROM idem_await('op-aw-busy', '', '1 min');
RESET statement_timeout;

-- in a set-returning context, one call per key
SELECT k AS key, a.status, pg_temp.lease(a.lease_expires_at) AS lease
FROM unnest(ARRAY['op-aw-done', 'op-aw-missing', 'op-aw-unknown', 'op-aw-released']) k,
     LATERAL idem_await(k, '', '5 s') a
ORDER BY k;

DELETE FROM idempotency_records WHERE key LIKE 'op-aw-%';
SELECT setval('idem_token_epoch', 1, false) AS epoch_reset;  -- a DELETE moves the epoch

--
-- idem_stuck: unknown outcomes and expired leases, oldest (by created_at) first
--
SELECT outcome, token FROM idem_claim('op-st-a', '\x01', '100 ms');     -- abandoned, taken over, abandoned again
SELECT outcome, token FROM idem_claim('op-st-b', '\x01', '1 hour');     -- unknown
SELECT idem_mark_unknown('op-st-b', 1, '{"gateway": "timeout"}');
SELECT outcome, token FROM idem_claim('op-st-c', '\x01', '1 hour');     -- live lease: not stuck
SELECT outcome, token FROM idem_claim('op-st-d', '\x01', '1 hour');     -- succeeded: not stuck
SELECT idem_complete('op-st-d', 1);
SELECT outcome, token FROM idem_claim('op-st-e', '\x01', '1 hour');     -- failed, retryable: not stuck
SELECT idem_fail('op-st-e', 1, '{"code": "busy"}');
SELECT outcome, token FROM idem_claim('op-st-f', '\x01', '1 hour');     -- released: not stuck
SELECT idem_release('op-st-f', 1);
SELECT outcome, token FROM idem_claim('op-st-g', '\x01', '100 ms');     -- abandoned after a checkpoint
SELECT idem_checkpoint('op-st-g', 1, 'step 1') IS NOT NULL AS checkpointed;
SELECT outcome, token FROM idem_claim('op-st-h', '\x01', '1 hour');     -- unknown, then resolved: not stuck
SELECT idem_mark_unknown('op-st-h', 1, '{"gateway": "timeout"}');
SELECT idem_resolve('op-st-h', 'succeeded', '{"id": 8}');
SELECT pg_sleep(0.3);
-- op-st-a is taken over (it keeps its created_at) and abandoned again
SELECT outcome, token, attempts FROM idem_claim('op-st-a', '\x01', '100 ms');
SELECT outcome, token FROM idem_claim('op-st-i', '\x01', '1 hour');     -- the newest unknown
SELECT idem_mark_unknown('op-st-i', 1, '{"gateway": "reset"}');
SELECT pg_sleep(0.3);

SELECT key, status, reason, attempts, recovery_point, error, pg_temp.lease(lease_expires_at) AS lease,
       age > interval '0' AND age < interval '1 minute' AS age_ok
FROM idem_stuck WHERE key LIKE 'op-st-%';
-- the order is by created_at, which a takeover keeps: op-st-a comes first
-- although it changed last
SELECT count(*) AS stuck, array_agg(key ORDER BY created_at) = array_agg(key) AS oldest_first,
       array_agg(key ORDER BY updated_at) <> array_agg(key) AS not_by_last_change
FROM idem_stuck WHERE key LIKE 'op-st-%';
-- a stuck record that is taken over again is no longer stuck; resolving an
-- unknown one takes it off the list
SELECT outcome, token, attempts FROM idem_claim('op-st-g', '\x01', '1 hour');
SELECT idem_resolve('op-st-b', 'failed', '{"code": "declined"}', 402);
SELECT key, reason FROM idem_stuck WHERE key LIKE 'op-st-%';
-- a lease runs out while the view is read: clock_timestamp(), not now()
BEGIN;
SELECT outcome, token FROM idem_claim('op-st-j', '\x01', '100 ms');
SELECT count(*) AS stuck_j FROM idem_stuck WHERE key = 'op-st-j';
SELECT pg_sleep(0.3);
SELECT key, reason FROM idem_stuck WHERE key = 'op-st-j';
ROLLBACK;

DELETE FROM idempotency_records WHERE key LIKE 'op-st-%';
SELECT setval('idem_token_epoch', 1, false) AS epoch_reset;  -- a DELETE moves the epoch

-- The purge worker runs beside the suite (test/run preloads the library)
-- and would delete the expired rows below before this test looks at them:
-- one transaction holds it off (its DELETE waits for the EXCLUSIVE lock and
-- then finds nothing left).  Expiry is checked with clock_timestamp(); an
-- expected error rolls back only its own statement (ON_ERROR_ROLLBACK).
\set ON_ERROR_ROLLBACK on
BEGIN;
LOCK TABLE idempotency_records, idem_inbox IN EXCLUSIVE MODE;
--
-- idem_summary: records by scope and status; "expired" counts the finished
-- ones past expires_at (those idem_purge will delete)
--
SELECT count(*) AS summary_rows FROM idem_summary WHERE scope LIKE 'op-%';
-- scope op-s1: 2 live successes, 1 expired success, 1 expired (final)
-- failure, 1 processing past its retention (live lease), 1 unknown past its
-- retention
SELECT outcome FROM idem_claim('op-sum-1', '\x01', '1 hour', 'op-s1', '1 hour');
SELECT idem_complete('op-sum-1', 1, scope => 'op-s1');
SELECT outcome FROM idem_claim('op-sum-2', '\x01', '1 hour', 'op-s1', '1 hour');
SELECT idem_complete('op-sum-2', 1, scope => 'op-s1');
SELECT outcome FROM idem_claim('op-sum-3', '\x01', '1 hour', 'op-s1', '100 ms');
SELECT idem_complete('op-sum-3', 1, scope => 'op-s1');
SELECT outcome FROM idem_claim('op-sum-4', '\x01', '1 hour', 'op-s1', '100 ms');
SELECT idem_fail('op-sum-4', 1, '{"code": "declined"}', false, scope => 'op-s1');
SELECT outcome FROM idem_claim('op-sum-5', '\x01', '1 hour', 'op-s1', '100 ms');
SELECT outcome FROM idem_claim('op-sum-6', '\x01', '1 hour', 'op-s1', '100 ms');
SELECT idem_mark_unknown('op-sum-6', 1, '{}', scope => 'op-s1');
-- scope op-s2: a retryable failure within its retention, a released record
-- past its retention
SELECT outcome FROM idem_claim('op-sum-1', '\x01', '1 hour', 'op-s2', '1 hour');
SELECT idem_fail('op-sum-1', 1, '{"code": "busy"}', true, scope => 'op-s2');
SELECT outcome FROM idem_claim('op-sum-2', '\x01', '1 hour', 'op-s2', '100 ms');
SELECT idem_release('op-sum-2', 1, scope => 'op-s2');
SELECT pg_sleep(0.3);

SELECT scope, status, records, expired,
       oldest = (SELECT min(r.created_at) FROM idempotency_records r
                 WHERE r.scope = s.scope AND r.status = s.status) AS oldest_ok
FROM idem_summary s WHERE scope LIKE 'op-%';

--
-- idem_purge: only succeeded and failed records past expires_at go
--
-- one record of each kind, all but op-pu-live past their retention
SELECT outcome FROM idem_claim('op-pu-succeeded', '\x01', '1 hour', retention => '100 ms');
SELECT idem_complete('op-pu-succeeded', 1, '{"id": 1}');
SELECT outcome FROM idem_claim('op-pu-failed', '\x01', '1 hour', retention => '100 ms');
SELECT idem_fail('op-pu-failed', 1, '{"code": "declined"}', false);
SELECT outcome FROM idem_claim('op-pu-retryable', '\x01', '1 hour', retention => '100 ms');
SELECT idem_fail('op-pu-retryable', 1, '{"code": "busy"}', true);
SELECT outcome FROM idem_claim('op-pu-resolved', '\x01', '1 hour', retention => '100 ms');
SELECT idem_mark_unknown('op-pu-resolved', 1, '{}');
SELECT idem_resolve('op-pu-resolved', 'succeeded', '{"id": 4}');
SELECT outcome FROM idem_claim('op-pu-live', '\x01', '1 hour', retention => '1 hour');
SELECT idem_complete('op-pu-live', 1, '{"id": 5}');
SELECT outcome FROM idem_claim('op-pu-processing', '\x01', '1 hour', retention => '100 ms');
SELECT outcome FROM idem_claim('op-pu-abandoned', '\x01', '100 ms', retention => '100 ms');
SELECT outcome FROM idem_claim('op-pu-unknown', '\x01', '1 hour', retention => '100 ms');
SELECT idem_mark_unknown('op-pu-unknown', 1, '{}');
SELECT outcome FROM idem_claim('op-pu-released', '\x01', '1 hour', retention => '100 ms');
SELECT idem_release('op-pu-released', 1);
SELECT pg_sleep(0.3);
SELECT key, token, status, retryable, pg_temp.lease(lease_expires_at) AS lease,
       expires_at <= clock_timestamp() AS past_expiry
FROM idempotency_records WHERE key LIKE 'op-pu-%' ORDER BY key;

-- 4 of op-pu-* and the 2 expired records of op-s1
SELECT idem_purge() AS purged;
SELECT key, status, pg_temp.lease(lease_expires_at) AS lease
FROM idempotency_records WHERE key LIKE 'op-pu-%' ORDER BY key;
-- nothing expired is left: a second purge deletes nothing
SELECT idem_purge() AS purged;
-- idem_summary agrees: nothing expired
SELECT scope, status, records, expired FROM idem_summary WHERE scope LIKE 'op-%';
-- processing past retention is still waited for, and the released record,
-- never purged, is reused by the next claim with the next token
SELECT * FROM pg_temp.await('op-pu-processing', '', '100 ms');
SELECT outcome, token, status, attempts FROM idem_claim('op-pu-released', '\x02', '1 hour');

COMMIT;
\set ON_ERROR_ROLLBACK off

-- the batch arguments
SELECT pg_temp.expect_error($$SELECT idem_purge(NULL)$$);
SELECT pg_temp.expect_error($$SELECT idem_purge(0)$$);
SELECT pg_temp.expect_error($$SELECT idem_purge(10, 0)$$);

--
-- Privileges: idem_stats is PUBLIC, the rest is granted; the views and
-- idem_await read the table with the caller's privileges
--
SET client_min_messages = warning;
DROP ROLE IF EXISTS regress_idem_ops;
RESET client_min_messages;
CREATE ROLE regress_idem_ops;
SET ROLE regress_idem_ops;
SELECT count(*) AS counters FROM idem_stats();
SELECT pg_temp.expect_error($$SELECT idem_stats_reset()$$);
SELECT pg_temp.expect_error($$SELECT * FROM idem_await('op-pu-live')$$);
SELECT pg_temp.expect_error($$SELECT * FROM idem_stuck$$);
SELECT pg_temp.expect_error($$SELECT * FROM idem_summary$$);
SELECT pg_temp.expect_error($$SELECT idem_purge()$$);
RESET ROLE;
GRANT SELECT ON idem_stuck, idem_summary TO regress_idem_ops;
GRANT EXECUTE ON FUNCTION idem_await(text, text, interval) TO regress_idem_ops;
SET ROLE regress_idem_ops;
SELECT pg_temp.expect_error($$SELECT * FROM idem_stuck$$);
SELECT pg_temp.expect_error($$SELECT * FROM idem_summary$$);
SELECT pg_temp.expect_error($$SELECT * FROM idem_await('op-pu-live')$$);
RESET ROLE;
GRANT SELECT ON idempotency_records TO regress_idem_ops;
SET ROLE regress_idem_ops;
SELECT key, reason FROM idem_stuck WHERE key LIKE 'op-%';
SELECT scope, status, records, expired FROM idem_summary WHERE scope LIKE 'op-%';
SELECT * FROM pg_temp.await('op-pu-live', '', '5 s');
SELECT * FROM pg_temp.await('op-pu-processing', '', '100 ms');
RESET ROLE;
REVOKE ALL ON idempotency_records, idem_stuck, idem_summary FROM regress_idem_ops;
REVOKE ALL ON FUNCTION idem_await(text, text, interval) FROM regress_idem_ops;
DROP ROLE regress_idem_ops;

-- clean up; the purges moved the token epoch: put it back for later tests
DELETE FROM idempotency_records WHERE key LIKE 'op-%';
SELECT setval('idem_token_epoch', 1, false) AS epoch_reset;
