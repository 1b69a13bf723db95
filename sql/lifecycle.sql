--
-- The claim lifecycle: every outcome of idem_claim and what the owner's
-- calls (complete, fail, checkpoint, release, mark_unknown) and idem_resolve
-- do to a record.  Timestamps are never printed: leases show as live / expired
-- / none, retention as whether expires_at lies ahead.
--

-- Errors are shown as "ERROR:  <SQLSTATE>: <message>" with DETAIL and HINT.
\i sql/include/expect_error.sql
CREATE FUNCTION pg_temp.lease(expires timestamptz) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN expires IS NULL THEN 'none'
                WHEN expires > clock_timestamp() THEN 'live'
                ELSE 'expired' END
$$;

-- What a claim returns, and what a record holds, without timestamps.
\set claimed 'outcome, token, status, response_code, result, error, recovery_point, pg_temp.lease(lease_expires_at) AS lease, attempts, expires_at > clock_timestamp() AS retained'
\set record 'token, status, attempts, response_code, retryable, recovery_point, result, error, pg_temp.lease(lease_expires_at) AS lease, expires_at > clock_timestamp() AS retained'

-- This test's records all have keys starting with 'lc-'.
DELETE FROM idempotency_records WHERE key LIKE 'lc-%';

--
-- new, in_progress, checkpoint, complete, replay
--
SELECT :claimed FROM idem_claim('lc-a', idem_fingerprint('request a'::text), '1 hour');
SELECT :record FROM idem_lookup('lc-a');
SELECT fingerprint = idem_fingerprint('request a'::text) AS fingerprint_stored,
       lease_expires_at - created_at AS lease, expires_at - created_at AS retention,
       created_at = updated_at AS never_updated, completed_at IS NULL AS not_completed
FROM idem_lookup('lc-a');

-- A second claim of a key whose lease is live: in_progress, without the token.
SELECT :claimed FROM idem_claim('lc-a', idem_fingerprint('request a'::text), '1 hour');
SELECT :claimed FROM idem_claim('lc-a', idem_fingerprint('request a'::text), '1 hour', wait => false);
-- ... and a different request under the same key is refused.
SELECT pg_temp.expect_error($$SELECT idem_claim('lc-a', idem_fingerprint('request b'::text), '1 hour')$$);

-- Checkpoints save a recovery point; extend_lease moves the lease, NULL keeps it.
SELECT idem_checkpoint('lc-a', 1, 'step 1') AS lease_expires_at \gset
SELECT :'lease_expires_at'::timestamptz = lease_expires_at AS returns_stored_lease,
       lease_expires_at - created_at AS lease, recovery_point
FROM idem_lookup('lc-a');
SELECT idem_checkpoint('lc-a', 1, 'step 2', extend_lease => '2 hours') AS lease_expires_at \gset
SELECT :'lease_expires_at'::timestamptz = lease_expires_at AS returns_stored_lease,
       lease_expires_at > now() + interval '119 minutes' AS extended, recovery_point
FROM idem_lookup('lc-a');
SELECT idem_checkpoint('lc-a', 1, NULL) = :'lease_expires_at'::timestamptz AS lease_kept;
SELECT recovery_point, lease_expires_at = :'lease_expires_at'::timestamptz AS lease_kept
FROM idem_lookup('lc-a');

-- Complete: the outcome is saved and the lease ends.
SELECT idem_complete('lc-a', 1, '{"id": 42}', 201);
SELECT :record FROM idem_lookup('lc-a');
SELECT completed_at IS NOT NULL AS completed, completed_at = updated_at AS completed_last,
       expires_at - completed_at AS retention_from_completion
FROM idem_lookup('lc-a');

-- Replay: the saved outcome, without the token; nothing is written.
SELECT r::text AS before_replay FROM idempotency_records r WHERE key = 'lc-a' \gset
SELECT :claimed FROM idem_claim('lc-a', idem_fingerprint('request a'::text), '1 hour');
SELECT :claimed FROM idem_claim('lc-a', idem_fingerprint('request a'::text), '1 hour', wait => false);
SELECT r::text = :'before_replay' AS unchanged FROM idempotency_records r WHERE key = 'lc-a';
SELECT pg_temp.expect_error($$SELECT idem_claim('lc-a', idem_fingerprint('request b'::text), '1 hour')$$);

-- Repeating the complete with the same token and values is a no-op...
SELECT idem_complete('lc-a', 1, '{"id": 42}', 201);
SELECT r::text = :'before_replay' AS unchanged FROM idempotency_records r WHERE key = 'lc-a';
-- ... other values are refused.
SELECT pg_temp.expect_error($$SELECT idem_complete('lc-a', 1, '{"id": 43}', 201)$$);
SELECT pg_temp.expect_error($$SELECT idem_complete('lc-a', 1, '{"id": 42}')$$);
SELECT pg_temp.expect_error($$SELECT idem_fail('lc-a', 1, '{"code": "late"}')$$);
SELECT pg_temp.expect_error($$SELECT idem_checkpoint('lc-a', 1, 'step 3')$$);
SELECT r::text = :'before_replay' AS unchanged FROM idempotency_records r WHERE key = 'lc-a';

--
-- takeover after the lease expired; the recovery point is handed over
--
SELECT :claimed FROM idem_claim('lc-b', idem_fingerprint('request b'::text), '100 ms');
SELECT idem_checkpoint('lc-b', 1, 'card charged') IS NOT NULL AS checkpointed;
SELECT pg_sleep(0.3);
SELECT :record FROM idem_lookup('lc-b');
SELECT pg_temp.expect_error($$SELECT idem_claim('lc-b', idem_fingerprint('request a'::text), '1 hour')$$);
SELECT :claimed FROM idem_claim('lc-b', idem_fingerprint('request b'::text), '1 hour');
SELECT :record FROM idem_lookup('lc-b');
-- The new owner holds the lease; the old owner is fenced off.
SELECT :claimed FROM idem_claim('lc-b', idem_fingerprint('request b'::text), '1 hour');
SELECT pg_temp.expect_error($$SELECT idem_complete('lc-b', 1, '{"id": 1}')$$);
SELECT pg_temp.expect_error($$SELECT idem_checkpoint('lc-b', 1, 'late', '1 hour')$$);
SELECT pg_temp.expect_error($$SELECT idem_fail('lc-b', 1, '{"code": "late"}')$$);
SELECT pg_temp.expect_error($$SELECT idem_release('lc-b', 1)$$);
SELECT pg_temp.expect_error($$SELECT idem_mark_unknown('lc-b', 1, '{}')$$);
SELECT idem_complete('lc-b', 2, '{"id": 2}', 200);
SELECT :claimed FROM idem_claim('lc-b', idem_fingerprint('request b'::text), '1 hour');

-- The default lease (idempotency.default_lease) applies when lease is NULL.
SELECT :claimed FROM idem_claim('lc-c', idem_fingerprint('request c'::text), NULL);
SELECT lease_expires_at - now() BETWEEN interval '29 seconds' AND interval '31 seconds' AS default_30s
FROM idem_lookup('lc-c');
SET idempotency.default_lease = '100ms';
SELECT :claimed FROM idem_claim('lc-d', idem_fingerprint('request d'::text), NULL);
SELECT pg_sleep(0.3);
SELECT :claimed FROM idem_claim('lc-d', idem_fingerprint('request d'::text), NULL);
RESET idempotency.default_lease;

--
-- takeover after a retryable failure
--
SELECT :claimed FROM idem_claim('lc-e', idem_fingerprint('request e'::text), '1 hour');
SELECT idem_fail('lc-e', 1, '{"code": "timeout"}', true, response_code => 503);
SELECT :record FROM idem_lookup('lc-e');
SELECT completed_at IS NOT NULL AS completed FROM idem_lookup('lc-e');
-- a repeated fail with the same values is a no-op, other values are refused
SELECT r::text AS before_repeat FROM idempotency_records r WHERE key = 'lc-e' \gset
SELECT idem_fail('lc-e', 1, '{"code": "timeout"}', true, response_code => 503);
SELECT r::text = :'before_repeat' AS unchanged FROM idempotency_records r WHERE key = 'lc-e';
SELECT pg_temp.expect_error($$SELECT idem_fail('lc-e', 1, '{"code": "timeout"}', false, response_code => 503)$$);
SELECT pg_temp.expect_error($$SELECT idem_fail('lc-e', 1, '{"code": "timeout"}', true)$$);
SELECT pg_temp.expect_error($$SELECT idem_fail('lc-e', 1, '{"code": "other"}', true, response_code => 503)$$);
SELECT pg_temp.expect_error($$SELECT idem_claim('lc-e', idem_fingerprint('request a'::text), '1 hour')$$);
-- the next claim takes over at once
SELECT outcome, token, status, response_code, pg_temp.lease(lease_expires_at) AS lease, attempts
FROM idem_claim('lc-e', idem_fingerprint('request e'::text), '1 hour');
SELECT token, status, attempts, response_code, retryable, pg_temp.lease(lease_expires_at) AS lease
FROM idem_lookup('lc-e');
SELECT pg_temp.expect_error($$SELECT idem_fail('lc-e', 1, '{"code": "timeout"}', true, response_code => 503)$$);
SELECT idem_complete('lc-e', 2, '{"id": 5}', 200);
SELECT :record FROM idem_lookup('lc-e');
SELECT :claimed FROM idem_claim('lc-e', idem_fingerprint('request e'::text), '1 hour');

--
-- replay of a permanent failure
--
SELECT :claimed FROM idem_claim('lc-f', idem_fingerprint('request f'::text), '1 hour');
SELECT idem_fail('lc-f', 1, '{"code": "card_declined"}', retryable => false, response_code => 402);
SELECT :claimed FROM idem_claim('lc-f', idem_fingerprint('request f'::text), '1 hour');
SELECT :claimed FROM idem_claim('lc-f', idem_fingerprint('request f'::text), '1 hour');
SELECT :record FROM idem_lookup('lc-f');
SELECT pg_temp.expect_error($$SELECT idem_claim('lc-f', idem_fingerprint('request a'::text), '1 hour')$$);
SELECT pg_temp.expect_error($$SELECT idem_complete('lc-f', 1, '{"id": 6}')$$);
SELECT pg_temp.expect_error($$SELECT idem_resolve('lc-f', 'succeeded', '{"id": 6}')$$);

--
-- unknown outcome, then resolve
--
SELECT :claimed FROM idem_claim('lc-g', idem_fingerprint('request g'::text), '1 hour');
SELECT idem_checkpoint('lc-g', 1, 'sent to gateway') IS NOT NULL AS checkpointed;
SELECT idem_mark_unknown('lc-g', 1, '{"reason": "gateway timeout"}');
SELECT :record FROM idem_lookup('lc-g');
SELECT completed_at IS NULL AS not_completed FROM idem_lookup('lc-g');
SELECT :claimed FROM idem_claim('lc-g', idem_fingerprint('request g'::text), '1 hour');
SELECT :claimed FROM idem_claim('lc-g', idem_fingerprint('request g'::text), '1 hour', wait => false);
SELECT pg_temp.expect_error($$SELECT idem_claim('lc-g', idem_fingerprint('request a'::text), '1 hour')$$);
-- repeating mark_unknown with the same detail is a no-op; the owner can do nothing else
SELECT r::text AS before_repeat FROM idempotency_records r WHERE key = 'lc-g' \gset
SELECT idem_mark_unknown('lc-g', 1, '{"reason": "gateway timeout"}');
SELECT r::text = :'before_repeat' AS unchanged FROM idempotency_records r WHERE key = 'lc-g';
SELECT pg_temp.expect_error($$SELECT idem_mark_unknown('lc-g', 1, '{"reason": "other"}')$$);
SELECT pg_temp.expect_error($$SELECT idem_complete('lc-g', 1, '{"id": 7}')$$);
SELECT pg_temp.expect_error($$SELECT idem_fail('lc-g', 1, '{"code": "x"}')$$);
SELECT pg_temp.expect_error($$SELECT idem_release('lc-g', 1)$$);
SELECT pg_temp.expect_error($$SELECT idem_checkpoint('lc-g', 1, 'x')$$);
SELECT r::text = :'before_repeat' AS unchanged FROM idempotency_records r WHERE key = 'lc-g';
-- resolve to succeeded: replayed from now on
SELECT idem_resolve('lc-g', 'succeeded', '{"id": 7}', 200);
SELECT :record FROM idem_lookup('lc-g');
SELECT completed_at IS NOT NULL AS completed, expires_at - completed_at AS retention_from_completion
FROM idem_lookup('lc-g');
SELECT :claimed FROM idem_claim('lc-g', idem_fingerprint('request g'::text), '1 hour');
SELECT pg_temp.expect_error($$SELECT idem_resolve('lc-g', 'succeeded', '{"id": 7}', 200)$$);

-- resolve to failed: the payload is the error; replayed as a permanent failure
SELECT :claimed FROM idem_claim('lc-h', idem_fingerprint('request h'::text), '1 hour');
SELECT idem_mark_unknown('lc-h', 1, '{"reason": "connection reset"}');
SELECT idem_resolve('lc-h', 'failed', '{"code": "declined"}', 402);
SELECT :record FROM idem_lookup('lc-h');
SELECT :claimed FROM idem_claim('lc-h', idem_fingerprint('request h'::text), '1 hour');

-- resolve to failed, retryable: the next claim takes over and redoes the work
SELECT :claimed FROM idem_claim('lc-i', idem_fingerprint('request i'::text), '1 hour');
SELECT idem_mark_unknown('lc-i', 1, '{"reason": "connection reset"}');
SELECT idem_resolve('lc-i', 'failed', '{"code": "not_sent"}', retryable => true);
SELECT :record FROM idem_lookup('lc-i');
SELECT outcome, token, status, pg_temp.lease(lease_expires_at) AS lease, attempts
FROM idem_claim('lc-i', idem_fingerprint('request i'::text), '1 hour');
SELECT idem_complete('lc-i', 2, '{"id": 9}');
SELECT :claimed FROM idem_claim('lc-i', idem_fingerprint('request i'::text), '1 hour');

--
-- release: the key is free again, even for a different request
--
SELECT :claimed FROM idem_claim('lc-j', idem_fingerprint('request j'::text), '1 hour');
SELECT idem_checkpoint('lc-j', 1, 'half done') IS NOT NULL AS checkpointed;
SELECT idem_release('lc-j', 1);
SELECT token, status, pg_temp.lease(lease_expires_at) AS lease FROM idem_lookup('lc-j');
SELECT pg_temp.expect_error($$SELECT idem_release('lc-j', 1)$$);
SELECT pg_temp.expect_error($$SELECT idem_complete('lc-j', 1, '{}')$$);
SELECT :claimed FROM idem_claim('lc-j', idem_fingerprint('request j2'::text), '1 hour');
SELECT :record FROM idem_lookup('lc-j');
SELECT fingerprint = idem_fingerprint('request j2'::text) AS new_fingerprint FROM idem_lookup('lc-j');
SELECT pg_temp.expect_error($$SELECT idem_claim('lc-j', idem_fingerprint('request j'::text), '1 hour')$$);
SELECT pg_temp.expect_error($$SELECT idem_complete('lc-j', 1, '{}')$$);
SELECT idem_complete('lc-j', 3, '{"id": 10}');
SELECT :claimed FROM idem_claim('lc-j', idem_fingerprint('request j2'::text), '1 hour');

-- The purge worker runs beside the suite (test/run preloads the library)
-- and would delete the expired rows below before this test looks at them:
-- one transaction holds it off (its DELETE waits for the EXCLUSIVE lock and
-- then finds nothing left).  Expiry is checked with clock_timestamp(); an
-- expected error rolls back only its own statement (ON_ERROR_ROLLBACK).
\set ON_ERROR_ROLLBACK on
BEGIN;
LOCK TABLE idempotency_records, idem_inbox IN EXCLUSIVE MODE;
--
-- retention: a finished record past its retention counts as absent
--
SELECT :claimed FROM idem_claim('lc-k', idem_fingerprint('request k'::text), '1 hour', retention => '100 ms');
SELECT idem_complete('lc-k', 1, '{"id": 11}');
SELECT pg_sleep(0.3);
-- idem_lookup still shows it ...
SELECT :record FROM idem_lookup('lc-k');
-- ... but a claim starts afresh, with a larger token, for any request.
SELECT :claimed FROM idem_claim('lc-k', idem_fingerprint('request k2'::text), '1 hour');
SELECT :record FROM idem_lookup('lc-k');
SELECT fingerprint = idem_fingerprint('request k2'::text) AS new_fingerprint,
       completed_at IS NULL AS not_completed
FROM idem_lookup('lc-k');
SELECT pg_temp.expect_error($$SELECT idem_complete('lc-k', 1, '{"id": 11}')$$);

-- a permanent failure past its retention, likewise
SELECT :claimed FROM idem_claim('lc-l', idem_fingerprint('request l'::text), '1 hour', retention => '100 ms');
SELECT idem_fail('lc-l', 1, '{"code": "declined"}', false);
SELECT pg_sleep(0.3);
SELECT :claimed FROM idem_claim('lc-l', idem_fingerprint('request l'::text), '1 hour');

-- an abandoned claim (lease expired) past its retention is not absent: it may
-- be half done, so it is taken over (and still bound to its request)
SELECT :claimed FROM idem_claim('lc-m', idem_fingerprint('request m'::text), '100 ms', retention => '100 ms');
SELECT pg_sleep(0.3);
SELECT pg_temp.expect_error($$SELECT idem_claim('lc-m', idem_fingerprint('request m2'::text), '1 hour')$$);
SELECT :claimed FROM idem_claim('lc-m', idem_fingerprint('request m'::text), '1 hour');

-- an unknown outcome never expires: it waits for idem_resolve
SELECT :claimed FROM idem_claim('lc-n', idem_fingerprint('request n'::text), '1 hour', retention => '100 ms');
SELECT idem_mark_unknown('lc-n', 1, '{"reason": "crash"}');
SELECT pg_sleep(0.3);
SELECT :claimed FROM idem_claim('lc-n', idem_fingerprint('request n'::text), '1 hour');
SELECT pg_temp.expect_error($$SELECT idem_claim('lc-n', idem_fingerprint('request n2'::text), '1 hour')$$);

COMMIT;
\set ON_ERROR_ROLLBACK off

-- The default retention (idempotency.retention) applies when retention is NULL.
SELECT expires_at - created_at AS retention FROM idem_lookup('lc-c');
SET idempotency.retention = '1h';
SELECT :claimed FROM idem_claim('lc-o', idem_fingerprint('request o'::text), '1 hour');
SELECT expires_at - created_at AS retention FROM idem_lookup('lc-o');
RESET idempotency.retention;

--
-- scopes keep keys apart
--
SELECT :claimed FROM idem_claim('lc-s', idem_fingerprint('tenant 1'::text), '1 hour', scope => 'tenant-1');
SELECT :claimed FROM idem_claim('lc-s', idem_fingerprint('tenant 2'::text), '1 hour', scope => 'tenant-2');
SELECT :claimed FROM idem_claim('lc-s', idem_fingerprint('default'::text), '1 hour');
SELECT idem_complete('lc-s', 1, '{"tenant": 1}', scope => 'tenant-1');
SELECT scope, token, status, result FROM idempotency_records WHERE key = 'lc-s' ORDER BY scope;
SELECT count(*) AS rows FROM idem_lookup('lc-s', 'tenant-3');

--
-- a claim lives in its transaction: rolled back, it never happened
--
BEGIN;
SELECT :claimed FROM idem_claim('lc-t', idem_fingerprint('request t'::text), '1 hour');
SELECT :claimed FROM idem_claim('lc-t', idem_fingerprint('request t'::text), '1 hour');
ROLLBACK;
SELECT count(*) AS rows FROM idem_lookup('lc-t');
SELECT :claimed FROM idem_claim('lc-t', idem_fingerprint('request t'::text), '1 hour', wait => false);

-- complete in the claim's own transaction
BEGIN;
SELECT token FROM idem_claim('lc-u', idem_fingerprint('request u'::text), '1 hour');
SELECT idem_complete('lc-u', 1, '{"id": 21}');
COMMIT;
\set ON_ERROR_ROLLBACK off
SELECT :claimed FROM idem_claim('lc-u', idem_fingerprint('request u'::text), '1 hour');

--
-- idem_lookup: the record as stored, or no row
--
SELECT scope, key, token, status, attempts, response_code, result
FROM idem_lookup('lc-a');
SELECT count(*) AS rows FROM idem_lookup('lc-missing');
SELECT count(*) AS rows FROM idem_lookup('lc-a', 'another scope');
SELECT (idem_lookup('lc-a')).status;

-- All of this test's records.
SELECT key, scope, token, status, attempts, response_code, retryable, result, error
FROM idempotency_records WHERE key LIKE 'lc-%' ORDER BY key, scope;

DELETE FROM idempotency_records WHERE key LIKE 'lc-%';
SELECT setval('idem_token_epoch', 1, false) AS epoch_reset;  -- a DELETE moves the epoch
