-- Retention: a finished record is kept (replayed) for its retention counted
-- from completion, then counts as absent and the key is reused with a larger
-- token and any fingerprint; an unknown outcome never expires and waits for
-- idem_resolve; idempotency.retention applies when retention is NULL.
-- Keys are prefixed "re.".
BEGIN;
SELECT plan(77);

CREATE TEMP TABLE c AS
SELECT 'a-new'::text AS label, r.*
FROM idem_claim('re.a', '\xaa'::bytea, '1 hour', retention => '300 ms') r;
CREATE TEMP TABLE snap (label text PRIMARY KEY, r idempotency_records);

-- a succeeded record: replayed within retention, reused after -------------------------------
SELECT lives_ok($$SELECT idem_complete('re.a', 1, '{"v": 1}', 200)$$, 'the owner completes');
SELECT ok((SELECT expires_at - completed_at BETWEEN '300 ms' AND interval '300 ms' + '10 ms' FROM idem_lookup('re.a')),
          'expires_at of a succeeded record is completed_at + retention');
INSERT INTO c SELECT 'a-replay', r.* FROM idem_claim('re.a', '\xaa'::bytea, '1 hour') r;
SELECT results_eq($$SELECT outcome, token, result FROM c WHERE label = 'a-replay'$$,
                  $$VALUES ('replay', NULL::bigint, '{"v": 1}'::jsonb)$$,
                  'within retention the result is replayed');
SELECT pg_sleep(0.35);
INSERT INTO c SELECT 'a-reuse', r.* FROM idem_claim('re.a', '\xbb'::bytea, '1 hour', retention => '1 hour') r;
SELECT results_eq(
    $$SELECT outcome, token, status::text, attempts, result, response_code, recovery_point FROM c WHERE label = 'a-reuse'$$,
    $$VALUES ('new', 2::bigint, 'processing', 1, NULL::jsonb, NULL::int, NULL::text)$$,
    'past retention the key is new again: larger token, attempt 1, no old outcome, another fingerprint');
SELECT results_eq(
    $$SELECT fingerprint, token, status::text, completed_at, result, error, retryable,
             lease_expires_at - created_at, expires_at - created_at, updated_at = created_at
      FROM idem_lookup('re.a')$$,
    $$VALUES ('\xbb'::bytea, 2::bigint, 'processing', NULL::timestamptz, NULL::jsonb, NULL::jsonb, false,
              '1 hour'::interval, '1 hour'::interval, true)$$,
    'the reused record is a fresh record with the new fingerprint, lease and retention');
SELECT throws_ok($$SELECT idem_complete('re.a', 1, '{"v": 1}', 200)$$, 'IK002', NULL,
                 'the previous owner''s token is stale after reuse, even for a repeat');
SELECT throws_ok($$SELECT idem_claim('re.a', '\xaa'::bytea, '1 hour')$$, 'IK001', NULL,
                 'the old fingerprint now conflicts with the new request');

-- a reused key with the same fingerprint is new as well ----------------------------------------
INSERT INTO c SELECT 'same-new', r.* FROM idem_claim('re.same', '\xaa'::bytea, '1 hour', retention => '50 ms') r;
SELECT lives_ok($$SELECT idem_complete('re.same', 1, '{"v": 1}')$$, 'the owner completes');
SELECT pg_sleep(0.1);
INSERT INTO c SELECT 'same-again', r.* FROM idem_claim('re.same', '\xaa'::bytea, '1 hour') r;
SELECT results_eq($$SELECT outcome, token, result FROM c WHERE label = 'same-again'$$,
                  $$VALUES ('new', 2::bigint, NULL::jsonb)$$,
                  'past retention the same request is executed again, not replayed');

-- retention counts from completion, not from the claim --------------------------------------------
INSERT INTO c SELECT 'b-new', r.* FROM idem_claim('re.b', '\xaa'::bytea, '1 hour', retention => '500 ms') r;
SELECT pg_sleep(0.55);
SELECT throws_ok($$SELECT idem_claim('re.b', '\xbb'::bytea, '1 hour')$$, 'IK001', NULL,
                 'past created_at + retention a live lease still holds the key (IK001 for another request)');
INSERT INTO c SELECT 'b-busy', r.* FROM idem_claim('re.b', '\xaa'::bytea, '1 hour') r;
SELECT is((SELECT outcome FROM c WHERE label = 'b-busy'), 'in_progress',
          'and the same request is in_progress, not new');
SELECT lives_ok($$SELECT idem_complete('re.b', 1, '{"v": "b"}')$$, 'the owner completes late');
SELECT is((SELECT expires_at - completed_at FROM idem_lookup('re.b')), '500 ms'::interval,
          'the expiry moved to completed_at + retention');
INSERT INTO c SELECT 'b-replay', r.* FROM idem_claim('re.b', '\xaa'::bytea, '1 hour') r;
SELECT results_eq($$SELECT outcome, result FROM c WHERE label = 'b-replay'$$,
                  $$VALUES ('replay', '{"v": "b"}'::jsonb)$$,
                  'just after a late completion the result replays');
SELECT pg_sleep(0.55);
INSERT INTO c SELECT 'b-reuse', r.* FROM idem_claim('re.b', '\xbb'::bytea, '1 hour') r;
SELECT results_eq($$SELECT outcome, token FROM c WHERE label = 'b-reuse'$$,
                  $$VALUES ('new', 2::bigint)$$,
                  'retention after completion over: the key is reused');

-- a failed record ------------------------------------------------------------------------------------
INSERT INTO c SELECT 'f-new', r.* FROM idem_claim('re.f', '\xaa'::bytea, '1 hour', retention => '300 ms') r;
SELECT lives_ok($$SELECT idem_fail('re.f', 1, '{"e": "declined"}', false, response_code => 402)$$,
                'the owner fails for good');
SELECT ok((SELECT expires_at - completed_at BETWEEN '300 ms' AND interval '300 ms' + '10 ms' FROM idem_lookup('re.f')),
          'expires_at of a failed record is completed_at + retention');
INSERT INTO c SELECT 'f-replay', r.* FROM idem_claim('re.f', '\xaa'::bytea, '1 hour') r;
SELECT results_eq($$SELECT outcome, status::text, error, response_code FROM c WHERE label = 'f-replay'$$,
                  $$VALUES ('replay', 'failed', '{"e": "declined"}'::jsonb, 402)$$,
                  'within retention the failure replays');
SELECT pg_sleep(0.35);
INSERT INTO c SELECT 'f-reuse', r.* FROM idem_claim('re.f', '\xbb'::bytea, '1 hour') r;
SELECT results_eq($$SELECT outcome, token, error, response_code, attempts FROM c WHERE label = 'f-reuse'$$,
                  $$VALUES ('new', 2::bigint, NULL::jsonb, NULL::int, 1)$$,
                  'past retention a failed key is new again for another request, the old error gone');
-- a retryable failure past retention is new (attempt 1), not a takeover (attempt 2)
INSERT INTO c SELECT 'rf-new', r.* FROM idem_claim('re.rf', '\xaa'::bytea, '1 hour', retention => '50 ms') r;
SELECT lives_ok($$SELECT idem_fail('re.rf', 1, '{"e": "timeout"}', true)$$, 'a retryable failure');
SELECT pg_sleep(0.1);
INSERT INTO c SELECT 'rf-reuse', r.* FROM idem_claim('re.rf', '\xbb'::bytea, '1 hour') r;
SELECT results_eq($$SELECT outcome, token, attempts, error FROM c WHERE label = 'rf-reuse'$$,
                  $$VALUES ('new', 2::bigint, 1, NULL::jsonb)$$,
                  'a retryable failure past retention is reused as new');

-- an abandoned record (expired lease) never counts as absent: it may be half done -----------------
INSERT INTO c SELECT 'ab-new', r.* FROM idem_claim('re.ab', '\xaa'::bytea, '50 ms', retention => '50 ms') r;
SELECT lives_ok($$SELECT idem_checkpoint('re.ab', 1, 'half way')$$, 'the owner checkpoints, then vanishes');
SELECT pg_sleep(0.1);
SELECT throws_ok($$SELECT idem_claim('re.ab', '\xbb'::bytea, '1 hour')$$, 'IK001', NULL,
                 'an abandoned record past retention still refuses another request');
INSERT INTO c SELECT 'ab-takeover', r.* FROM idem_claim('re.ab', '\xaa'::bytea, '1 hour') r;
SELECT results_eq($$SELECT outcome, token, attempts, recovery_point FROM c WHERE label = 'ab-takeover'$$,
                  $$VALUES ('takeover', 2::bigint, 2, 'half way'::text)$$,
                  'an abandoned record past retention is taken over, with its recovery point');

-- unknown outcomes never count as absent -----------------------------------------------------------
INSERT INTO c SELECT 'u-new', r.* FROM idem_claim('re.u', '\xaa'::bytea, '1 hour', retention => '50 ms') r;
SELECT lives_ok($$SELECT idem_mark_unknown('re.u', 1, '{"gateway": "timeout"}')$$, 'the owner marks the outcome unknown');
SELECT pg_sleep(0.1);
SELECT ok((SELECT expires_at < clock_timestamp() FROM idem_lookup('re.u')), 'the unknown record is past its expiry');
INSERT INTO snap SELECT 'u', l FROM idem_lookup('re.u') l;
INSERT INTO c SELECT 'u-claim', r.* FROM idem_claim('re.u', '\xaa'::bytea, '1 hour') r;
SELECT results_eq($$SELECT outcome, token, status::text, error FROM c WHERE label = 'u-claim'$$,
                  $$VALUES ('unknown', NULL::bigint, 'unknown', '{"gateway": "timeout"}'::jsonb)$$,
                  'past retention an unknown outcome is still unknown, with no token');
INSERT INTO c SELECT 'u-claim-nowait', r.* FROM idem_claim('re.u', '\xaa'::bytea, '1 hour', wait => false) r;
SELECT is((SELECT outcome FROM c WHERE label = 'u-claim-nowait'), 'unknown', 'also with wait => false');
SELECT throws_ok($$SELECT idem_claim('re.u', '\xbb'::bytea, '1 hour')$$, 'IK001', NULL,
                 'past retention an unknown key still refuses another request');
SELECT is((SELECT l FROM idem_lookup('re.u') l), (SELECT r FROM snap WHERE label = 'u'),
          'claims of an unknown record write nothing');

-- idem_resolve --------------------------------------------------------------------------------------
SELECT throws_ok($$SELECT idem_resolve('re.u', 'processing')$$, '22023', NULL, 'resolve to processing: 22023');
SELECT throws_ok($$SELECT idem_resolve('re.u', 'unknown')$$, '22023', NULL, 'resolve to unknown: 22023');
SELECT throws_ok($$SELECT idem_resolve('re.u', 'succeeded', '{}', retryable => true)$$, '22023', NULL,
                 'a retryable success: 22023');
SELECT throws_ok($$SELECT idem_resolve('re.u', NULL)$$, '22004', NULL, 'resolve to NULL: 22004');
SELECT throws_ok($$SELECT idem_resolve('re.u', 'failed', '{}', retryable => NULL)$$, '22004', NULL,
                 'retryable NULL: 22004');
SELECT is((SELECT l FROM idem_lookup('re.u') l), (SELECT r FROM snap WHERE label = 'u'),
          'refused resolves change nothing');
-- resolving restarts retention from the resolution
SELECT lives_ok($$SELECT idem_resolve('re.u', 'succeeded', '{"charge": "ch_1"}', 201)$$,
                'the unknown outcome, past retention, is resolved as succeeded');
SELECT results_eq(
    $$SELECT status::text, result, error, response_code, retryable, token, lease_expires_at
      FROM idem_lookup('re.u')$$,
    $$VALUES ('succeeded', '{"charge": "ch_1"}'::jsonb, NULL::jsonb, 201, false, 1::bigint, NULL::timestamptz)$$,
    'the resolution replaces the unknown detail with the result');
SELECT ok((SELECT expires_at - completed_at BETWEEN '50 ms' AND interval '50 ms' + '10 ms' FROM idem_lookup('re.u')),
          'a resolved record is kept for its retention from the resolution');
SELECT throws_ok($$SELECT idem_resolve('re.u', 'failed', '{}')$$, 'IK003', NULL,
                 'a resolved outcome cannot be resolved again (IK003)');
SELECT throws_ok($$SELECT idem_complete('re.u', 1, '{"charge": "ch_2"}')$$, 'IK003', NULL,
                 'the owner that gave up cannot complete it afterwards (IK003)');
SELECT pg_sleep(0.1);
INSERT INTO c SELECT 'u-reuse', r.* FROM idem_claim('re.u', '\xbb'::bytea, '1 hour') r;
SELECT results_eq($$SELECT outcome, token FROM c WHERE label = 'u-reuse'$$,
                  $$VALUES ('new', 2::bigint)$$,
                  'once resolved and past retention the key can be reused');

-- resolved as succeeded within retention: replay
INSERT INTO c SELECT 'rs-new', r.* FROM idem_claim('re.rs', '\xaa'::bytea, '1 hour', retention => '1 hour') r;
SELECT lives_ok($$SELECT idem_mark_unknown('re.rs', 1, '{"gateway": "timeout"}')$$, 'marked unknown');
SELECT lives_ok($$SELECT idem_resolve('re.rs', 'succeeded', '{"charge": "ch_9"}', 201)$$, 'resolved as succeeded');
INSERT INTO c SELECT 'rs-replay', r.* FROM idem_claim('re.rs', '\xaa'::bytea, '1 hour') r;
SELECT results_eq($$SELECT outcome, token, status::text, result, response_code, error FROM c WHERE label = 'rs-replay'$$,
                  $$VALUES ('replay', NULL::bigint, 'succeeded', '{"charge": "ch_9"}'::jsonb, 201, NULL::jsonb)$$,
                  'a success resolution replays like a completion');
SELECT is((SELECT expires_at - completed_at FROM idem_lookup('re.rs')), '1 hour'::interval,
          'kept for an hour from the resolution');

-- resolved as a final failure: replay of the error
INSERT INTO c SELECT 'rf2-new', r.* FROM idem_claim('re.rfail', '\xaa'::bytea, '1 hour', retention => '1 hour') r;
SELECT lives_ok($$SELECT idem_mark_unknown('re.rfail', 1, '{"gateway": "timeout"}')$$, 'marked unknown');
SELECT lives_ok($$SELECT idem_resolve('re.rfail', 'failed', '{"reason": "never charged"}', 402)$$, 'resolved as failed');
INSERT INTO c SELECT 'rf2-replay', r.* FROM idem_claim('re.rfail', '\xaa'::bytea, '1 hour') r;
SELECT results_eq($$SELECT outcome, token, status::text, result, error, response_code FROM c WHERE label = 'rf2-replay'$$,
                  $$VALUES ('replay', NULL::bigint, 'failed', NULL::jsonb, '{"reason": "never charged"}'::jsonb, 402)$$,
                  'a final failure resolution replays the error');

-- resolved as a retryable failure: the next claim takes over and redoes the work
INSERT INTO c SELECT 'rr-new', r.* FROM idem_claim('re.rretry', '\xaa'::bytea, '1 hour', retention => '1 hour') r;
SELECT lives_ok($$SELECT idem_mark_unknown('re.rretry', 1, '{"gateway": "timeout"}')$$, 'marked unknown');
SELECT lives_ok($$SELECT idem_resolve('re.rretry', 'failed', '{"reason": "not applied"}', retryable => true)$$,
                'resolved as a retryable failure');
SELECT throws_ok($$SELECT idem_claim('re.rretry', '\xbb'::bytea, '1 hour')$$, 'IK001', NULL,
                 'another request still conflicts');
INSERT INTO c SELECT 'rr-take', r.* FROM idem_claim('re.rretry', '\xaa'::bytea, '1 hour') r;
SELECT results_eq($$SELECT outcome, token, attempts, status::text FROM c WHERE label = 'rr-take'$$,
                  $$VALUES ('takeover', 2::bigint, 2, 'processing')$$,
                  'the next claim takes the key over with the next token and attempt');
SELECT lives_ok($$SELECT idem_complete('re.rretry', 2, '{"charge": "ch_10"}', 201)$$, 'and completes it');
SELECT throws_ok($$SELECT idem_resolve('re.rretry', 'succeeded')$$, 'IK003', NULL,
                 'resolve of a succeeded record: IK003');
INSERT INTO c SELECT 'proc-new', r.* FROM idem_claim('re.proc', '\xaa'::bytea, '1 hour') r;
SELECT throws_ok($$SELECT idem_resolve('re.proc', 'succeeded')$$, 'IK003', NULL,
                 'resolve of a processing record: IK003');
SELECT is((SELECT status::text FROM idem_lookup('re.proc')), 'processing', 'and the record stays processing');

-- idempotency.retention applies when retention is NULL ---------------------------------------------
-- The SQL edition has no library to register the settings: idempotency.* are
-- placeholders, with no built-in value to show, no unit and no range check
-- when set; its functions apply the same default, unit and range where they
-- read one (a value out of range: 22023 there).
SELECT NOT EXISTS (SELECT FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
                   WHERE p.proname = 'idem_claim' AND l.lanname = 'c'
                     AND p.pronamespace = (SELECT extnamespace FROM pg_extension WHERE extname = 'idempotency'))
       AS sql_edition \gset
\if :sql_edition
SELECT skip('the SQL edition registers no setting: idempotency.retention has no built-in value to show '
            '(the next test checks the one-day default)', 1);
\else
SELECT is(current_setting('idempotency.retention'), '1d', 'the built-in retention is one day');
\endif
INSERT INTO c SELECT 'g0-new', r.* FROM idem_claim('re.g0', '\xaa'::bytea, '1 hour') r;
SELECT is((SELECT expires_at - created_at FROM idem_lookup('re.g0')), '24 hours'::interval,
          'retention => NULL keeps a record one day by default');
SET LOCAL idempotency.retention = '2h';
INSERT INTO c SELECT 'g1-new', r.* FROM idem_claim('re.g1', '\xaa'::bytea, '1 hour', retention => NULL) r;
SELECT is((SELECT expires_at - created_at FROM idem_lookup('re.g1')), '2 hours'::interval,
          'retention => NULL takes idempotency.retention (2h) from the claim');
SELECT is((SELECT expires_at FROM c WHERE label = 'g1-new'), (SELECT expires_at FROM idem_lookup('re.g1')),
          'and the claim returns that expiry');
SELECT lives_ok($$SELECT idem_complete('re.g1', 1, '{}')$$, 'the owner completes');
SELECT is((SELECT expires_at - completed_at FROM idem_lookup('re.g1')), '2 hours'::interval,
          'then it is kept 2h from completion');
SELECT is((SELECT expires_at - created_at FROM idem_lookup('re.g0')), '24 hours'::interval,
          'changing the setting leaves existing records alone');
-- a takeover with retention => NULL keeps the record's retention
INSERT INTO c SELECT 'g2-new', r.* FROM idem_claim('re.g2', '\xaa'::bytea, '50 ms', retention => '1 hour') r;
SELECT pg_sleep(0.1);
INSERT INTO c SELECT 'g2-take', r.* FROM idem_claim('re.g2', '\xaa'::bytea, '1 hour') r;
SELECT results_eq($$SELECT outcome, expires_at - (SELECT created_at FROM idem_lookup('re.g2')) FROM c WHERE label = 'g2-take'$$,
                  $$VALUES ('takeover', '1 hour'::interval)$$,
                  'a takeover with retention => NULL keeps the retention given at the claim');
SELECT lives_ok($$SELECT idem_complete('re.g2', 2, '{}')$$, 'the new owner completes');
SELECT is((SELECT expires_at - completed_at FROM idem_lookup('re.g2')), '1 hour'::interval,
          'and that retention counts from completion');
-- a one-second setting, end to end
SET LOCAL idempotency.retention = 1;
\if :sql_edition
SELECT skip('the SQL edition registers no setting: a placeholder shows no unit (the tests below check that 1 is a second)', 1);
\else
SELECT is(current_setting('idempotency.retention'), '1s', 'idempotency.retention is in seconds');
\endif
INSERT INTO c SELECT 'g3-new', r.* FROM idem_claim('re.g3', '\xaa'::bytea, '1 hour') r;
SELECT lives_ok($$SELECT idem_complete('re.g3', 1, '{"n": 3}')$$, 'the owner completes');
INSERT INTO c SELECT 'g3-replay', r.* FROM idem_claim('re.g3', '\xaa'::bytea, '1 hour') r;
SELECT is((SELECT outcome FROM c WHERE label = 'g3-replay'), 'replay', 'replayed within the second');
SELECT pg_sleep(1.1);
INSERT INTO c SELECT 'g3-reuse', r.* FROM idem_claim('re.g3', '\xbb'::bytea, '1 hour') r;
SELECT results_eq($$SELECT outcome, token FROM c WHERE label = 'g3-reuse'$$,
                  $$VALUES ('new', 2::bigint)$$,
                  'reused once the second has passed');
\if :sql_edition
SET LOCAL idempotency.retention = 0;
SELECT throws_ok($$SELECT idem_claim('re.g4', '\xaa'::bytea, '1 hour')$$, '22023', NULL,
                 'a zero retention setting is refused (the SQL edition: by the claim that reads it)');
SET LOCAL idempotency.retention = 1;
\else
SELECT throws_ok($$SET LOCAL idempotency.retention = 0$$, '22023', NULL, 'a zero retention setting is refused');
\endif

-- retention counts from the final completion, also after takeovers -------------------------------
SELECT idem_claim('re.tk', '\xaa'::bytea, '1 hour', retention => '1 hour');
SELECT pg_sleep(0.2);
SELECT idem_fail('re.tk', 1, '{"e": 1}', true);
SELECT is((SELECT outcome FROM idem_claim('re.tk', '\xaa'::bytea, '1 hour')), 'takeover',
          'a retryable failure is taken over');
SELECT pg_sleep(0.1);
SELECT idem_complete('re.tk', 2, '{"ok": 1}');
SELECT is((SELECT expires_at - completed_at FROM idem_lookup('re.tk')), interval '1 hour',
          'after a failed attempt and a takeover, retention is counted from completion exactly');
SELECT idem_claim('re.tl', '\xaa'::bytea, '50 ms', retention => '1 hour');
SELECT pg_sleep(0.2);
SELECT is((SELECT outcome FROM idem_claim('re.tl', '\xaa'::bytea, '1 hour', retention => '2 hours')),
          'takeover', 'an expired lease is taken over with a new retention');
SELECT pg_sleep(0.1);
SELECT idem_complete('re.tl', 2);
SELECT is((SELECT expires_at - completed_at FROM idem_lookup('re.tl')), interval '2 hours',
          'the retention given with the takeover counts from completion exactly');
SELECT is((SELECT completed_at FROM idem_lookup('re.tk') WHERE status = 'processing'), NULL,
          'no completion time survives into a taken-over attempt');

SELECT * FROM finish();
ROLLBACK;
