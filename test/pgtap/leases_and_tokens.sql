-- Leases and fencing tokens: an expired lease is taken over with the next
-- token; a live one is not; a token only ever grows (takeover, release, reuse
-- after retention); a stale or never-issued token changes nothing for any of
-- the owner's calls; checkpoints extend leases; idempotency.default_lease.
-- The functions read the clock, not now(), so pg_sleep inside this one
-- transaction makes short leases expire.  Keys are prefixed "lt.".
BEGIN;
SELECT plan(69);

CREATE TEMP TABLE c AS
SELECT 'a-new'::text AS label, r.*
FROM idem_claim('lt.a', '\xaa'::bytea, '2 s', retention => '1 hour') r;
CREATE TEMP TABLE snap (label text PRIMARY KEY, r idempotency_records);

-- SQLSTATE and detail of an error, or 'no error'.
CREATE FUNCTION pg_temp.err(sql text) RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
    detail text;
BEGIN
    EXECUTE sql;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;
    RETURN SQLSTATE || ': ' || detail;
END
$fn$;

-- an owner's progress, then its lease expires -------------------------------------
SELECT is((SELECT idem_checkpoint('lt.a', 1, 'charged')),
          (SELECT lease_expires_at FROM c WHERE label = 'a-new'),
          'a checkpoint without extend_lease keeps the lease and returns it');
INSERT INTO c SELECT 'a-busy', r.* FROM idem_claim('lt.a', '\xaa'::bytea, '1 hour') r;
SELECT results_eq(
    $$SELECT outcome, token, recovery_point FROM c WHERE label = 'a-busy'$$,
    $$VALUES ('in_progress', NULL::bigint, 'charged')$$,
    'while the lease lives: in_progress, no token, the owner''s recovery point is visible');
SELECT pg_sleep(2.05);
INSERT INTO c SELECT 'a-takeover', r.* FROM idem_claim('lt.a', '\xaa'::bytea, '1 hour') r;
SELECT results_eq(
    $$SELECT outcome, token, status::text, attempts, recovery_point FROM c WHERE label = 'a-takeover'$$,
    $$VALUES ('takeover', 2::bigint, 'processing', 2, 'charged')$$,
    'after the lease expired: takeover with token+1, attempts+1 and the previous recovery point');
SELECT results_eq(
    $$SELECT token, attempts, recovery_point, lease_expires_at - updated_at FROM idem_lookup('lt.a')$$,
    $$VALUES (2::bigint, 2, 'charged', '1 hour'::interval)$$,
    'the record belongs to the new owner under a fresh lease and keeps the recovery point');
SELECT ok((SELECT lease_expires_at FROM c WHERE label = 'a-takeover') >
          (SELECT lease_expires_at FROM c WHERE label = 'a-new'),
          'the new lease ends after the old one');
INSERT INTO c SELECT 'a-busy2', r.* FROM idem_claim('lt.a', '\xaa'::bytea, '1 hour', wait => false) r;
SELECT results_eq(
    $$SELECT outcome, token, attempts FROM c WHERE label = 'a-busy2'$$,
    $$VALUES ('in_progress', NULL::bigint, 2)$$,
    'a third claimant sees the new owner in progress and gets no token');

-- the fenced-off owner (token 1) can do nothing ----------------------------------------
INSERT INTO snap SELECT 'a-owned-by-2', l FROM idem_lookup('lt.a') l;
SELECT throws_ok($$SELECT idem_complete('lt.a', 1, '{"late": true}', 200)$$, 'IK002', NULL,
                 'stale token: complete is rejected (IK002)');
SELECT throws_ok($$SELECT idem_fail('lt.a', 1, '{"late": true}', false)$$, 'IK002', NULL,
                 'stale token: fail is rejected (IK002)');
SELECT throws_ok($$SELECT idem_checkpoint('lt.a', 1, 'shipped', '1 hour')$$, 'IK002', NULL,
                 'stale token: checkpoint is rejected (IK002)');
SELECT throws_ok($$SELECT idem_release('lt.a', 1)$$, 'IK002', NULL,
                 'stale token: release is rejected (IK002)');
SELECT throws_ok($$SELECT idem_mark_unknown('lt.a', 1, '{"late": true}')$$, 'IK002', NULL,
                 'stale token: mark_unknown is rejected (IK002)');
SELECT is((SELECT l FROM idem_lookup('lt.a') l), (SELECT r FROM snap WHERE label = 'a-owned-by-2'),
          'the stale owner''s rejected calls changed nothing');
SELECT is(pg_temp.err($$SELECT idem_complete('lt.a', 1)$$),
          'IK002: The key was taken over or released after this token was issued.',
          'the stale-token error says the key changed hands');

-- a token never issued (above the current one) is rejected too ----------------------------
SELECT throws_ok($$SELECT idem_complete('lt.a', 3, '{}')$$, 'IK002', NULL,
                 'never-issued token: complete is rejected (IK002)');
SELECT throws_ok($$SELECT idem_fail('lt.a', 3, '{}')$$, 'IK002', NULL,
                 'never-issued token: fail is rejected (IK002)');
SELECT throws_ok($$SELECT idem_checkpoint('lt.a', 3, 'x')$$, 'IK002', NULL,
                 'never-issued token: checkpoint is rejected (IK002)');
SELECT throws_ok($$SELECT idem_release('lt.a', 3)$$, 'IK002', NULL,
                 'never-issued token: release is rejected (IK002)');
SELECT throws_ok($$SELECT idem_mark_unknown('lt.a', 3, '{}')$$, 'IK002', NULL,
                 'never-issued token: mark_unknown is rejected (IK002)');
SELECT throws_ok($$SELECT idem_complete('lt.a', 9223372036854775807, '{}')$$, 'IK002', NULL,
                 'the largest bigint as a token is rejected (IK002)');
SELECT is((SELECT l FROM idem_lookup('lt.a') l), (SELECT r FROM snap WHERE label = 'a-owned-by-2'),
          'calls with a never-issued token changed nothing');
SELECT is(pg_temp.err($$SELECT idem_release('lt.a', 3)$$),
          'IK002: No such token was issued for this key.',
          'the error for a token from the future says it was never issued');
SELECT throws_ok($$SELECT idem_complete('lt.a', 0, '{}')$$, '22023', NULL, 'token 0 is invalid (22023)');
SELECT throws_ok($$SELECT idem_complete('lt.a', -2, '{}')$$, '22023', NULL, 'a negative token is invalid (22023)');
SELECT throws_ok($$SELECT idem_complete('lt.a', NULL, '{}')$$, '22004', NULL, 'a NULL token is invalid (22004)');
SELECT is((SELECT l FROM idem_lookup('lt.a') l), (SELECT r FROM snap WHERE label = 'a-owned-by-2'),
          'calls with invalid tokens changed nothing');

SELECT lives_ok($$SELECT idem_complete('lt.a', 2, '{"done": true}', 200)$$, 'the current owner completes');
SELECT throws_ok($$SELECT idem_complete('lt.a', 1, '{"done": true}', 200)$$, 'IK002', NULL,
                 'the fenced-off owner cannot pass off the same result as a repeat');
SELECT results_eq(
    $$SELECT status::text, token, result FROM idem_lookup('lt.a')$$,
    $$VALUES ('succeeded', 2::bigint, '{"done": true}'::jsonb)$$,
    'the result is the current owner''s');

-- a lease that expired but was not taken over still belongs to its owner -----------------
INSERT INTO c SELECT 'late-new', r.* FROM idem_claim('lt.late', '\xaa'::bytea, '50 ms') r;
SELECT pg_sleep(0.1);
SELECT lives_ok($$SELECT idem_complete('lt.late', 1, '{"late": "but first"}')$$,
                'an owner whose lease expired may still complete while nobody took over');
INSERT INTO c SELECT 'late-replay', r.* FROM idem_claim('lt.late', '\xaa'::bytea, '1 hour') r;
SELECT results_eq(
    $$SELECT outcome, result FROM c WHERE label = 'late-replay'$$,
    $$VALUES ('replay', '{"late": "but first"}'::jsonb)$$,
    'and the next claim replays that result');

-- a checkpoint that extends the lease prevents the takeover --------------------------------
INSERT INTO c SELECT 'ext-new', r.* FROM idem_claim('lt.ext', '\xaa'::bytea, '50 ms') r;
CREATE TEMP TABLE ext AS SELECT idem_checkpoint('lt.ext', 1, 'step-1', '1 hour') AS returned;
SELECT is((SELECT returned FROM ext), (SELECT lease_expires_at FROM idem_lookup('lt.ext')),
          'checkpoint returns the extended lease that it stored');
SELECT is((SELECT lease_expires_at - updated_at FROM idem_lookup('lt.ext')), '1 hour'::interval,
          'the extended lease runs from the checkpoint');
SELECT pg_sleep(0.1);
INSERT INTO c SELECT 'ext-busy', r.* FROM idem_claim('lt.ext', '\xaa'::bytea, '1 hour') r;
SELECT results_eq(
    $$SELECT outcome, token, recovery_point FROM c WHERE label = 'ext-busy'$$,
    $$VALUES ('in_progress', NULL::bigint, 'step-1')$$,
    'past the original lease the key is still in progress');
SELECT lives_ok($$SELECT idem_checkpoint('lt.ext', 1, NULL)$$, 'a checkpoint with no recovery point');
SELECT is((SELECT recovery_point FROM idem_lookup('lt.ext')), 'step-1',
          'a NULL recovery point keeps the previous one');
SELECT throws_ok($$SELECT idem_checkpoint('lt.ext', 1, 'x', '0')$$, '22023', NULL,
                 'extend_lease must be positive');
-- an expired lease revived by its owner's checkpoint
INSERT INTO c SELECT 'rev-new', r.* FROM idem_claim('lt.revive', '\xaa'::bytea, '50 ms') r;
SELECT pg_sleep(0.1);
SELECT lives_ok($$SELECT idem_checkpoint('lt.revive', 1, 'resumed', '1 hour')$$,
                'an owner may extend its expired lease while nobody took over');
INSERT INTO c SELECT 'rev-busy', r.* FROM idem_claim('lt.revive', '\xaa'::bytea, '1 hour') r;
SELECT results_eq(
    $$SELECT outcome, token FROM c WHERE label = 'rev-busy'$$,
    $$VALUES ('in_progress', NULL::bigint)$$,
    'then the key is in progress again, not taken over');

-- tokens strictly increase: takeover, release, reuse after release, reuse after retention ------
INSERT INTO c SELECT 'seq-1', r.* FROM idem_claim('lt.seq', '\xaa'::bytea, '50 ms', retention => '1 hour') r;
SELECT pg_sleep(0.1);
INSERT INTO c SELECT 'seq-2', r.* FROM idem_claim('lt.seq', '\xaa'::bytea, '1 hour', retention => '1 hour') r;
SELECT lives_ok($$SELECT idem_release('lt.seq', 2)$$, 'the owner of token 2 releases');
SELECT results_eq(
    $$SELECT status::text, token, lease_expires_at FROM idem_lookup('lt.seq')$$,
    $$VALUES ('processing', 3::bigint, NULL::timestamptz)$$,
    'a release bumps the stored token and drops the lease');
SELECT throws_ok($$SELECT idem_release('lt.seq', 2)$$, 'IK002', NULL,
                 'releasing twice with the same token is stale (IK002)');
SELECT throws_ok($$SELECT idem_complete('lt.seq', 2, '{}')$$, 'IK002', NULL,
                 'the releasing owner is fenced off (IK002)');
INSERT INTO c SELECT 'seq-3', r.* FROM idem_claim('lt.seq', '\xbb'::bytea, '1 hour', retention => '50 ms') r;
SELECT lives_ok($$SELECT idem_complete('lt.seq', 4, '{"n": 3}')$$, 'the owner after the release completes');
SELECT pg_sleep(0.1);
INSERT INTO c SELECT 'seq-4', r.* FROM idem_claim('lt.seq', '\xcc'::bytea, '1 hour') r;
SELECT results_eq(
    $$SELECT label, outcome, token, attempts FROM c WHERE label LIKE 'seq-%' ORDER BY label$$,
    $$VALUES ('seq-1', 'new', 1::bigint, 1), ('seq-2', 'takeover', 2::bigint, 2),
             ('seq-3', 'new', 4::bigint, 1), ('seq-4', 'new', 5::bigint, 1)$$,
    'tokens 1 (new), 2 (takeover), 4 (reuse after a release at 3), 5 (reuse after retention)');
SELECT throws_ok($$SELECT idem_complete('lt.seq', 1, '{}')$$, 'IK002', NULL, 'token 1 is fenced off for good');
SELECT throws_ok($$SELECT idem_complete('lt.seq', 2, '{}')$$, 'IK002', NULL, 'token 2 is fenced off for good');
SELECT throws_ok($$SELECT idem_complete('lt.seq', 4, '{"n": 3}')$$, 'IK002', NULL,
                 'token 4 is fenced off after reuse, even repeating its own completion');
SELECT lives_ok($$SELECT idem_complete('lt.seq', 5, '{"n": 4}')$$, 'token 5 is the owner');

-- a release resets the record for whoever comes next ------------------------------------------
INSERT INTO c SELECT 'rel-new', r.* FROM idem_claim('lt.rel', '\xaa'::bytea, '50 ms') r;
SELECT pg_sleep(0.1);
INSERT INTO c SELECT 'rel-take', r.* FROM idem_claim('lt.rel', '\xaa'::bytea, '1 hour') r;
SELECT lives_ok($$SELECT idem_checkpoint('lt.rel', 2, 'half done')$$, 'the second owner checkpoints');
SELECT lives_ok($$SELECT idem_release('lt.rel', 2)$$, 'and releases');
INSERT INTO c SELECT 'rel-next', r.* FROM idem_claim('lt.rel', '\xaa'::bytea, '1 hour') r;
SELECT results_eq(
    $$SELECT outcome, token, attempts, recovery_point FROM c WHERE label = 'rel-next'$$,
    $$VALUES ('new', 4::bigint, 1, NULL::text)$$,
    'a claim after a release is new: token above the bumped one, attempts and recovery point reset');
SELECT lives_ok($$SELECT idem_complete('lt.rel', 4, '{}')$$, 'the new owner completes');
SELECT throws_ok($$SELECT idem_release('lt.rel', 4)$$, 'IK003', NULL,
                 'a finished key cannot be released (IK003)');

-- wait => false takes over an expired lease just the same --------------------------------------
INSERT INTO c SELECT 'nw-new', r.* FROM idem_claim('lt.nowait', '\xaa'::bytea, '50 ms', wait => false) r;
SELECT pg_sleep(0.1);
INSERT INTO c SELECT 'nw-take', r.* FROM idem_claim('lt.nowait', '\xaa'::bytea, '1 hour', wait => false) r;
SELECT results_eq(
    $$SELECT label, outcome, token FROM c WHERE label LIKE 'nw-%' ORDER BY label$$,
    $$VALUES ('nw-new', 'new', 1::bigint), ('nw-take', 'takeover', 2::bigint)$$,
    'wait => false: new, then takeover after expiry');

-- idempotency.default_lease applies when lease is NULL ----------------------------------------
-- The SQL edition has no library to register the settings: idempotency.* are
-- placeholders, with no built-in value to show, no unit, no range check when
-- set and no reserved prefix; its functions apply the same default, unit and
-- range where they read one (a value out of range: 22023 there).
SELECT NOT EXISTS (SELECT FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
                   WHERE p.proname = 'idem_claim' AND l.lanname = 'c'
                     AND p.pronamespace = (SELECT extnamespace FROM pg_extension WHERE extname = 'idempotency'))
       AS sql_edition \gset
SET LOCAL idempotency.default_lease = '7s';
INSERT INTO c SELECT 'dl-new', r.* FROM idem_claim('lt.default', '\xaa'::bytea, NULL) r;
SELECT is((SELECT lease_expires_at - updated_at FROM idem_lookup('lt.default')), '7 seconds'::interval,
          'lease => NULL takes idempotency.default_lease (7s)');
SELECT is((SELECT lease_expires_at FROM c WHERE label = 'dl-new'),
          (SELECT lease_expires_at FROM idem_lookup('lt.default')),
          'and the claim returns that lease');
SET LOCAL idempotency.default_lease = 50;
\if :sql_edition
SELECT skip('the SQL edition registers no setting: a placeholder shows no unit (the next test checks that 50 is 50 ms)', 1);
\else
SELECT is(current_setting('idempotency.default_lease'), '50ms', 'idempotency.default_lease is in milliseconds');
\endif
INSERT INTO c SELECT 'dl-short', r.* FROM idem_claim('lt.default2', '\xaa'::bytea, NULL) r;
SELECT is((SELECT lease_expires_at - updated_at FROM idem_lookup('lt.default2')), '50 ms'::interval,
          'a 50 ms default lease');
SELECT pg_sleep(0.1);
INSERT INTO c SELECT 'dl-take', r.* FROM idem_claim('lt.default2', '\xaa'::bytea, NULL) r;
SELECT results_eq(
    $$SELECT outcome, token, attempts FROM c WHERE label = 'dl-take'$$,
    $$VALUES ('takeover', 2::bigint, 2)$$,
    'the default lease expires like a given one and the key is taken over');
SELECT is((SELECT lease_expires_at - updated_at FROM idem_lookup('lt.default2')), '50 ms'::interval,
          'the takeover''s lease => NULL also takes the default');
SELECT is((SELECT lease_expires_at - updated_at FROM idem_lookup('lt.default')), '7 seconds'::interval,
          'changing the setting does not touch leases already granted');
\if :sql_edition
SET LOCAL idempotency.default_lease = 0;
SELECT throws_ok($$SELECT idem_claim('lt.zero', '\xaa'::bytea, NULL)$$, '22023', NULL,
                 'a zero default lease is refused (the SQL edition: by the claim that reads it)');
SET LOCAL idempotency.default_lease = 50;
SELECT skip('the SQL edition reserves no prefix: without the library a misspelled idempotency.* setting is a placeholder', 1);
RESET idempotency.default_lease;
INSERT INTO c SELECT 'dl-builtin', r.* FROM idem_claim('lt.default3', '\xaa'::bytea, NULL) r;
SELECT is((SELECT lease_expires_at - updated_at FROM idem_lookup('lt.default3')), '30 seconds'::interval,
          'the built-in default lease is 30s (the SQL edition: the lease of a claim without one)');
\else
SELECT throws_ok($$SET LOCAL idempotency.default_lease = 0$$, '22023', NULL,
                 'a zero default lease is refused');
SELECT throws_ok($$SET LOCAL idempotency.default_lease_ms = 5$$, '42602', NULL,
                 'a misspelled idempotency.* setting is refused (reserved prefix)');
RESET idempotency.default_lease;
SELECT is(current_setting('idempotency.default_lease'), '30s', 'the built-in default lease is 30s');
\endif

-- after a release, the token that release moved to was never issued -----------------------------
SELECT idem_claim('lt.forged', '\xaa'::bytea, '1 hour');
SELECT idem_release('lt.forged', 1);
SELECT throws_ok($$SELECT idem_complete('lt.forged', 2, '{"forged": true}')$$, 'IK002', NULL,
                 'completing a released record with the next token: IK002');
SELECT throws_ok($$SELECT idem_checkpoint('lt.forged', 2, 'x', '1 hour')$$, 'IK002', NULL,
                 'checkpointing it: IK002');
SELECT throws_ok($$SELECT idem_fail('lt.forged', 2, '{}')$$, 'IK002', NULL, 'failing it: IK002');
SELECT throws_ok($$SELECT idem_mark_unknown('lt.forged', 2, '{}')$$, 'IK002', NULL,
                 'marking it unknown: IK002');
SELECT results_eq($$SELECT outcome, token FROM idem_claim('lt.forged', '\xbb'::bytea, '1 hour')$$,
                  $$VALUES ('new', 3::bigint)$$, 'the released key is still new for the next claimant');

SELECT * FROM finish();
ROLLBACK;
