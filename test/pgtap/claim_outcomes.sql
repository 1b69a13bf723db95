-- idem_claim outcomes: new, in_progress, replay, takeover, unknown; what each
-- returns (the fencing token only to an owner); fingerprint conflicts in every
-- state; scopes; and a claim rolled back to a savepoint leaving no trace.
-- Keys are prefixed "co." so this file never meets another file's records.
BEGIN;
SELECT plan(72);

-- Every claim's result row, labelled, so assertions can read NULLs too.
CREATE TEMP TABLE c AS
SELECT 'new'::text AS label, r.*
FROM idem_claim('co.k', '\xaa'::bytea, '1 hour', retention => '1 hour') r;
-- Snapshots of records, to prove that a call changed nothing.
CREATE TEMP TABLE snap (label text PRIMARY KEY, r idempotency_records);

-- new ----------------------------------------------------------------------
SELECT results_eq(
    $$SELECT outcome, token, status::text, attempts, response_code, result, error, recovery_point
      FROM c WHERE label = 'new'$$,
    $$VALUES ('new', 1::bigint, 'processing', 1, NULL::int, NULL::jsonb, NULL::jsonb, NULL::text)$$,
    'a first claim is new, owns token 1, attempt 1, no saved outcome');
SELECT results_eq(
    $$SELECT scope COLLATE "default", key COLLATE "default", fingerprint, token, status::text, completed_at IS NULL, retryable
      FROM idem_lookup('co.k')$$,
    $$VALUES (''::text, 'co.k'::text, '\xaa'::bytea, 1::bigint, 'processing', true, false)$$,
    'the new record is stored in the default scope with the fingerprint and token');
SELECT is((SELECT l.lease_expires_at - l.updated_at FROM idem_lookup('co.k') l),
          '1 hour'::interval, 'the lease runs from the claim');
SELECT is((SELECT l.expires_at - l.created_at FROM idem_lookup('co.k') l),
          '1 hour'::interval, 'retention is set from the claim while processing');
SELECT is((SELECT lease_expires_at FROM c WHERE label = 'new'),
          (SELECT lease_expires_at FROM idem_lookup('co.k')),
          'the claim returns the stored lease expiry');
SELECT is((SELECT expires_at FROM c WHERE label = 'new'),
          (SELECT expires_at FROM idem_lookup('co.k')),
          'the claim returns the stored expiry');

-- in_progress ----------------------------------------------------------------
INSERT INTO snap SELECT 'processing', l FROM idem_lookup('co.k') l;
INSERT INTO c SELECT 'busy', r.* FROM idem_claim('co.k', '\xaa'::bytea, '1 hour') r;
INSERT INTO c SELECT 'busy-nowait', r.* FROM idem_claim('co.k', '\xaa'::bytea, '1 hour', wait => false) r;
SELECT results_eq(
    $$SELECT outcome, token, status::text, attempts FROM c WHERE label IN ('busy', 'busy-nowait') ORDER BY label$$,
    $$VALUES ('in_progress', NULL::bigint, 'processing', 1), ('in_progress', NULL::bigint, 'processing', 1)$$,
    'a claim during a live lease is in_progress and learns no token (wait true and false)');
SELECT is((SELECT lease_expires_at FROM c WHERE label = 'busy'),
          (SELECT lease_expires_at FROM c WHERE label = 'new'),
          'in_progress tells when the owner''s lease ends');
SELECT is((SELECT l FROM idem_lookup('co.k') l), (SELECT r FROM snap WHERE label = 'processing'),
          'an in_progress claim writes nothing');
SELECT throws_ok($$SELECT idem_claim('co.k', '\xbb'::bytea, '1 hour')$$, 'IK001', NULL,
                 'a different fingerprint during a live lease: IK001');

-- replay of a success ---------------------------------------------------------
SELECT lives_ok($$SELECT idem_complete('co.k', 1, '{"id": 7}', 201)$$, 'the owner completes');
INSERT INTO snap SELECT 'succeeded', l FROM idem_lookup('co.k') l;
INSERT INTO c SELECT 'replay', r.* FROM idem_claim('co.k', '\xaa'::bytea, '1 hour') r;
SELECT results_eq(
    $$SELECT outcome, token, status::text, response_code, result, error, lease_expires_at, attempts
      FROM c WHERE label = 'replay'$$,
    $$VALUES ('replay', NULL::bigint, 'succeeded', 201, '{"id": 7}'::jsonb, NULL::jsonb, NULL::timestamptz, 1)$$,
    'a claim of a succeeded key replays its result and code, without a token');
SELECT is((SELECT l FROM idem_lookup('co.k') l), (SELECT r FROM snap WHERE label = 'succeeded'),
          'a replay writes nothing');
SELECT is((SELECT completed_at IS NOT NULL AND lease_expires_at IS NULL FROM idem_lookup('co.k')),
          true, 'completion records completed_at and drops the lease');
SELECT throws_ok($$SELECT idem_claim('co.k', '\xbb'::bytea, '1 hour')$$, 'IK001', NULL,
                 'a different fingerprint on a succeeded key: IK001');
SELECT is((SELECT l FROM idem_lookup('co.k') l), (SELECT r FROM snap WHERE label = 'succeeded'),
          'a fingerprint conflict writes nothing');

-- replay of a final failure ---------------------------------------------------------
INSERT INTO c SELECT 'f-new', r.* FROM idem_claim('co.fail', '\xaa'::bytea, '1 hour') r;
SELECT lives_ok($$SELECT idem_fail('co.fail', 1, '{"reason": "card declined"}', false, response_code => 402)$$,
                'the owner records a final failure');
INSERT INTO c SELECT 'f-replay', r.* FROM idem_claim('co.fail', '\xaa'::bytea, '1 hour') r;
SELECT results_eq(
    $$SELECT outcome, token, status::text, response_code, result, error, attempts FROM c WHERE label = 'f-replay'$$,
    $$VALUES ('replay', NULL::bigint, 'failed', 402, NULL::jsonb, '{"reason": "card declined"}'::jsonb, 1)$$,
    'a non-retryable failure replays its error and code, without a token');
SELECT throws_ok($$SELECT idem_claim('co.fail', '\xbb'::bytea, '1 hour')$$, 'IK001', NULL,
                 'a different fingerprint on a failed key: IK001');

-- takeover of a retryable failure -------------------------------------------------
INSERT INTO c SELECT 'rf-new', r.* FROM idem_claim('co.retry', '\xaa'::bytea, '1 hour') r;
SELECT lives_ok($$SELECT idem_fail('co.retry', 1, '{"reason": "timeout"}', true, response_code => 503)$$,
                'the owner records a retryable failure');
SELECT throws_ok($$SELECT idem_claim('co.retry', '\xbb'::bytea, '1 hour')$$, 'IK001', NULL,
                 'a different fingerprint on a retryable failure: IK001, no takeover');
INSERT INTO c SELECT 'rf-takeover', r.* FROM idem_claim('co.retry', '\xaa'::bytea, '1 hour') r;
SELECT results_eq(
    $$SELECT outcome, token, status::text, response_code, attempts FROM c WHERE label = 'rf-takeover'$$,
    $$VALUES ('takeover', 2::bigint, 'processing', NULL::int, 2)$$,
    'a retryable failure is taken over: next token, next attempt, processing');
SELECT results_eq(
    $$SELECT token, status::text, retryable, lease_expires_at IS NOT NULL FROM idem_lookup('co.retry')$$,
    $$VALUES (2::bigint, 'processing', false, true)$$,
    'the taken-over record is processing under the new token with a lease');
INSERT INTO c SELECT 'rf-busy', r.* FROM idem_claim('co.retry', '\xaa'::bytea, '1 hour') r;
SELECT results_eq(
    $$SELECT outcome, token FROM c WHERE label = 'rf-busy'$$,
    $$VALUES ('in_progress', NULL::bigint)$$,
    'once taken over, the key is in progress for everyone else');
SELECT lives_ok($$SELECT idem_complete('co.retry', 2, '{"ok": true}', 200)$$, 'the new owner completes');
SELECT results_eq(
    $$SELECT status::text, result, error, response_code FROM idem_lookup('co.retry')$$,
    $$VALUES ('succeeded', '{"ok": true}'::jsonb, NULL::jsonb, 200)$$,
    'completing after a failure keeps the result and clears the old error');

-- takeover of an expired lease ------------------------------------------------------
INSERT INTO c SELECT 'ex-new', r.* FROM idem_claim('co.expired', '\xaa'::bytea, '50 ms') r;
SELECT pg_sleep(0.1);
SELECT throws_ok($$SELECT idem_claim('co.expired', '\xbb'::bytea, '1 hour')$$, 'IK001', NULL,
                 'a different fingerprint on an abandoned (expired lease) record within retention: IK001');
INSERT INTO c SELECT 'ex-takeover', r.* FROM idem_claim('co.expired', '\xaa'::bytea, '1 hour') r;
SELECT results_eq(
    $$SELECT outcome, token, status::text, attempts FROM c WHERE label = 'ex-takeover'$$,
    $$VALUES ('takeover', 2::bigint, 'processing', 2)$$,
    'an expired lease is taken over with the next token and attempt');

-- unknown ---------------------------------------------------------------------------
INSERT INTO c SELECT 'u-new', r.* FROM idem_claim('co.unknown', '\xaa'::bytea, '1 hour') r;
SELECT lives_ok($$SELECT idem_mark_unknown('co.unknown', 1, '{"gateway": "no reply"}')$$,
                'the owner marks the outcome unknown');
INSERT INTO c SELECT 'u-claim', r.* FROM idem_claim('co.unknown', '\xaa'::bytea, '1 hour') r;
SELECT results_eq(
    $$SELECT outcome, token, status::text, error, result, lease_expires_at FROM c WHERE label = 'u-claim'$$,
    $$VALUES ('unknown', NULL::bigint, 'unknown', '{"gateway": "no reply"}'::jsonb, NULL::jsonb, NULL::timestamptz)$$,
    'a claim of an unknown outcome says unknown, shows the detail, gives no token');
SELECT is((SELECT token FROM idem_lookup('co.unknown')), 1::bigint,
          'a claim of an unknown outcome does not take the key over');
SELECT throws_ok($$SELECT idem_claim('co.unknown', '\xbb'::bytea, '1 hour')$$, 'IK001', NULL,
                 'a different fingerprint on an unknown outcome: IK001');

-- released keys accept any request -----------------------------------------------------
INSERT INTO c SELECT 'rel-new', r.* FROM idem_claim('co.rel', '\xaa'::bytea, '1 hour') r;
SELECT lives_ok($$SELECT idem_release('co.rel', 1)$$, 'the owner releases the key');
INSERT INTO c SELECT 'rel-again', r.* FROM idem_claim('co.rel', '\xbb'::bytea, '1 hour') r;
SELECT results_eq(
    $$SELECT outcome, status::text, attempts, token > 1 FROM c WHERE label = 'rel-again'$$,
    $$VALUES ('new', 'processing', 1, true)$$,
    'after a release a different fingerprint is accepted as a new claim with a larger token');
SELECT is((SELECT fingerprint FROM idem_lookup('co.rel')), '\xbb'::bytea,
          'the reused record stores the new fingerprint');

-- fingerprints: jsonb requests compare by value ------------------------------------------
INSERT INTO c SELECT 'j-new', r.* FROM idem_claim('co.json', idem_fingerprint('{"amount": 10, "to": ["a", "b"]}'::jsonb), '1 hour') r;
INSERT INTO c SELECT 'j-again', r.* FROM idem_claim('co.json', idem_fingerprint('{ "to":["a","b"],  "amount":10 }'::jsonb), '1 hour') r;
SELECT is((SELECT outcome FROM c WHERE label = 'j-again'), 'in_progress',
          'the same jsonb request with other key order and spacing is the same request');
SELECT throws_ok($$SELECT idem_claim('co.json', idem_fingerprint('{"amount": 10, "to": ["b", "a"]}'::jsonb), '1 hour')$$,
                 'IK001', NULL, 'a jsonb request with a different array order is a different request');

-- scopes ---------------------------------------------------------------------------------
INSERT INTO c SELECT 's-default', r.* FROM idem_claim('co.scoped', '\xaa'::bytea, '1 hour') r;
INSERT INTO c SELECT 's-t1', r.* FROM idem_claim('co.scoped', '\xbb'::bytea, '1 hour', scope => 'tenant-1') r;
INSERT INTO c SELECT 's-t2', r.* FROM idem_claim('co.scoped', '\xcc'::bytea, '1 hour', scope => 'tenant-2') r;
SELECT results_eq(
    $$SELECT label, outcome, token FROM c WHERE label LIKE 's-%' ORDER BY label$$,
    $$VALUES ('s-default', 'new', 1::bigint), ('s-t1', 'new', 1::bigint), ('s-t2', 'new', 1::bigint)$$,
    'the same key in three scopes is three new records, each with its own token 1 and fingerprint');
SELECT lives_ok($$SELECT idem_complete('co.scoped', 1, '{"scope": "tenant-1"}', scope => 'tenant-1')$$,
                'completing in scope tenant-1');
SELECT lives_ok($$SELECT idem_release('co.scoped', 1, scope => 'tenant-2')$$,
                'releasing in scope tenant-2');
SELECT results_eq(
    $$SELECT scope COLLATE "default", status::text, token, result FROM idempotency_records WHERE key = 'co.scoped' ORDER BY scope$$,
    $$VALUES (''::text, 'processing', 1::bigint, NULL::jsonb),
             ('tenant-1', 'succeeded', 1::bigint, '{"scope": "tenant-1"}'::jsonb),
             ('tenant-2', 'processing', 2::bigint, NULL::jsonb)$$,
    'completing or releasing in one scope leaves the others as they were');
INSERT INTO c SELECT 's-default-again', r.* FROM idem_claim('co.scoped', '\xaa'::bytea, '1 hour') r;
INSERT INTO c SELECT 's-t1-again', r.* FROM idem_claim('co.scoped', '\xbb'::bytea, '1 hour', scope => 'tenant-1') r;
SELECT results_eq(
    $$SELECT label, outcome FROM c WHERE label IN ('s-default-again', 's-t1-again') ORDER BY label$$,
    $$VALUES ('s-default-again', 'in_progress'), ('s-t1-again', 'replay')$$,
    'each scope answers from its own record');
SELECT throws_ok($$SELECT idem_claim('co.scoped', '\xbb'::bytea, '1 hour')$$, 'IK001', NULL,
                 'another scope''s fingerprint is a conflict in the default scope');
SELECT throws_ok($$SELECT idem_complete('co.scoped', 1, '{}', scope => 'tenant-9')$$, 'IK004', NULL,
                 'a token of one scope means nothing in a scope without the key (IK004)');
SELECT is((SELECT count(*) FROM idem_lookup('co.scoped', 'tenant-1')), 1::bigint,
          'idem_lookup finds the key in its scope');
SELECT is_empty($$SELECT * FROM idem_lookup('co.scoped', 'tenant-9')$$,
                'idem_lookup finds nothing in a scope without the key');
-- (scope, key) is a pair, not a concatenation
INSERT INTO c SELECT 'pair-1', r.* FROM idem_claim('b:c', '\xaa'::bytea, '1 hour', scope => 'co.a') r;
INSERT INTO c SELECT 'pair-2', r.* FROM idem_claim('c', '\xbb'::bytea, '1 hour', scope => 'co.a:b') r;
SELECT results_eq(
    $$SELECT label, outcome FROM c WHERE label LIKE 'pair-%' ORDER BY label$$,
    $$VALUES ('pair-1', 'new'), ('pair-2', 'new')$$,
    'scope co.a + key b:c and scope co.a:b + key c are different records');

-- a claim rolled back to a savepoint leaves no trace -----------------------------------------
-- (pgTAP keeps its tally in tables, so no assertion runs inside a savepoint
-- that is rolled back: psql variables carry what was seen there.)
SAVEPOINT s;
SELECT outcome AS sp_outcome FROM idem_claim('co.sp', '\xaa'::bytea, '1 hour') \gset
SELECT count(*) AS sp_rows FROM idem_lookup('co.sp') \gset
ROLLBACK TO SAVEPOINT s;
SELECT is(:'sp_outcome' || '/' || :'sp_rows', 'new/1', 'inside the savepoint the claim was new and visible');
SELECT is_empty($$SELECT * FROM idem_lookup('co.sp')$$, 'after ROLLBACK TO the record is gone');
SELECT is_empty($$SELECT * FROM idempotency_records WHERE key = 'co.sp'$$, 'and the table has no row for it');
INSERT INTO c SELECT 'sp-2', r.* FROM idem_claim('co.sp', '\xbb'::bytea, '1 hour', wait => false) r;
SELECT results_eq(
    $$SELECT outcome, token, attempts FROM c WHERE label = 'sp-2'$$,
    $$VALUES ('new', 1::bigint, 1)$$,
    'a claim after the rollback (wait => false) is new again with token 1 and any fingerprint');
SAVEPOINT s2;
SELECT idem_complete('co.sp', 1, '{"n": 1}') \g /dev/null
SELECT status::text AS sp_status FROM idem_lookup('co.sp') \gset
ROLLBACK TO SAVEPOINT s2;
SELECT is(:'sp_status'::text, 'succeeded', 'inside a savepoint the completion took effect');
SELECT results_eq(
    $$SELECT status::text, result, token FROM idem_lookup('co.sp')$$,
    $$VALUES ('processing', NULL::jsonb, 1::bigint)$$,
    'a completion rolled back to a savepoint leaves the record processing');
SELECT lives_ok($$SELECT idem_complete('co.sp', 1, '{"n": 2}')$$, 'the owner can still complete it');
SELECT is((SELECT result FROM idem_lookup('co.sp')), '{"n": 2}'::jsonb, 'with the value of the kept completion');

-- lookups ----------------------------------------------------------------------------------
SELECT is_empty($$SELECT * FROM idem_lookup('co.never')$$, 'idem_lookup of an unused key returns no row');
SELECT throws_ok($$SELECT idem_complete('co.never', 1)$$, 'IK004', NULL, 'complete of an unused key: IK004');
SELECT throws_ok($$SELECT idem_fail('co.never', 1, '{}')$$, 'IK004', NULL, 'fail of an unused key: IK004');
SELECT throws_ok($$SELECT idem_checkpoint('co.never', 1, 'p')$$, 'IK004', NULL, 'checkpoint of an unused key: IK004');
SELECT throws_ok($$SELECT idem_release('co.never', 1)$$, 'IK004', NULL, 'release of an unused key: IK004');
SELECT throws_ok($$SELECT idem_mark_unknown('co.never', 1, '{}')$$, 'IK004', NULL, 'mark_unknown of an unused key: IK004');
SELECT throws_ok($$SELECT idem_resolve('co.never', 'succeeded')$$, 'IK004', NULL, 'resolve of an unused key: IK004');

-- arguments are checked before anything is written ---------------------------------------------
SELECT throws_ok($$SELECT idem_claim(NULL, '\xaa'::bytea, '1 hour')$$, '22004', NULL, 'NULL key: 22004');
SELECT throws_ok($$SELECT idem_claim('', '\xaa'::bytea, '1 hour')$$, '22023', NULL, 'empty key: 22023');
SELECT throws_ok($$SELECT idem_claim('co.bad', NULL, '1 hour')$$, '22004', NULL, 'NULL fingerprint: 22004');
SELECT throws_ok($$SELECT idem_claim('co.bad', '\xaa'::bytea, '1 hour', scope => NULL)$$, '22004', NULL, 'NULL scope: 22004');
SELECT throws_ok($$SELECT idem_claim('co.bad', '\xaa'::bytea, '0')$$, '22023', NULL, 'zero lease: 22023');
SELECT throws_ok($$SELECT idem_claim('co.bad', '\xaa'::bytea, '1 day -25 hours')$$, '22023', NULL, 'negative lease: 22023');
SELECT throws_ok($$SELECT idem_claim('co.bad', '\xaa'::bytea, '1 hour', retention => '-1 s')$$, '22023', NULL, 'negative retention: 22023');
SELECT is_empty($$SELECT * FROM idempotency_records WHERE key = 'co.bad'$$, 'rejected claims wrote nothing');

-- a read-only transaction can look but not claim -------------------------------------------------
-- The probe sets the transaction read-only inside a block that it then
-- undoes, so the rest of the file runs read-write.
CREATE FUNCTION pg_temp.read_only_probe(OUT claim_state text, OUT lookup_status text)
LANGUAGE plpgsql AS $fn$
BEGIN
    BEGIN
        SET LOCAL transaction_read_only = on;
        SELECT l.status::text INTO lookup_status FROM idem_lookup('co.k') l;
        BEGIN
            PERFORM idem_claim('co.ro', '\xaa'::bytea, '1 hour');
            claim_state := 'no error';
        EXCEPTION WHEN OTHERS THEN
            claim_state := SQLSTATE;
        END;
        RAISE EXCEPTION 'undo' USING ERRCODE = 'P0001';
    EXCEPTION WHEN raise_exception THEN
        NULL;
    END;
END
$fn$;
SELECT results_eq($$SELECT * FROM pg_temp.read_only_probe()$$, $$VALUES ('25006', 'succeeded')$$,
                  'read-only: idem_lookup works, idem_claim fails with 25006');
SELECT is(current_setting('transaction_read_only'), 'off', 'the probe left the transaction read-write');

SELECT * FROM finish();
ROLLBACK;
