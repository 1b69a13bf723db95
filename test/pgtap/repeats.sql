-- Idempotent owner calls: repeating idem_complete, idem_fail or
-- idem_mark_unknown with the same token and the same values (a retry after a
-- lost reply) succeeds and changes nothing; the same token with other values,
-- or another finishing call, is IK003 and changes nothing either.
-- Keys are prefixed "rp.".
BEGIN;
SELECT plan(49);

CREATE TEMP TABLE snap (label text PRIMARY KEY, r idempotency_records);
CREATE TEMP TABLE c AS
SELECT 'c-new'::text AS label, r.* FROM idem_claim('rp.c', '\xaa'::bytea, '1 hour') r;

-- idem_complete ------------------------------------------------------------------------------
SELECT lives_ok($$SELECT idem_complete('rp.c', 1, '{"a": 1, "b": [1, 2]}', 201)$$, 'complete');
INSERT INTO snap SELECT 'c', l FROM idem_lookup('rp.c') l;
SELECT pg_sleep(0.01);  -- a rewrite would show in updated_at
SELECT lives_ok($$SELECT idem_complete('rp.c', 1, '{"a": 1, "b": [1, 2]}', 201)$$,
                'complete repeated with the same token and values succeeds');
SELECT lives_ok($$SELECT idem_complete('rp.c', 1, '{ "b": [1,2], "a": 1 }', 201)$$,
                'a result equal as jsonb (other key order, spacing) is the same value');
SELECT is((SELECT l FROM idem_lookup('rp.c') l), (SELECT r FROM snap WHERE label = 'c'),
          'the repeats changed nothing, not even updated_at or completed_at');
SELECT throws_ok($$SELECT idem_complete('rp.c', 1, '{"a": 2, "b": [1, 2]}', 201)$$, 'IK003', NULL,
                 'complete again with another result: IK003');
SELECT throws_ok($$SELECT idem_complete('rp.c', 1, '{"a": 1, "b": [2, 1]}', 201)$$, 'IK003', NULL,
                 'complete again with a reordered array: IK003');
SELECT throws_ok($$SELECT idem_complete('rp.c', 1, '{"a": 1, "b": [1, 2]}', 200)$$, 'IK003', NULL,
                 'complete again with another response code: IK003');
SELECT throws_ok($$SELECT idem_complete('rp.c', 1, '{"a": 1, "b": [1, 2]}')$$, 'IK003', NULL,
                 'complete again without the response code: IK003');
SELECT throws_ok($$SELECT idem_complete('rp.c', 1, NULL, 201)$$, 'IK003', NULL,
                 'complete again without the result: IK003');
SELECT throws_ok($$SELECT idem_fail('rp.c', 1, '{"e": 1}')$$, 'IK003', NULL,
                 'fail after complete: IK003');
SELECT throws_ok($$SELECT idem_mark_unknown('rp.c', 1, '{"e": 1}')$$, 'IK003', NULL,
                 'mark_unknown after complete: IK003');
SELECT throws_ok($$SELECT idem_checkpoint('rp.c', 1, 'p', '1 hour')$$, 'IK003', NULL,
                 'checkpoint after complete: IK003');
SELECT throws_ok($$SELECT idem_release('rp.c', 1)$$, 'IK003', NULL,
                 'release after complete: IK003');
SELECT is((SELECT l FROM idem_lookup('rp.c') l), (SELECT r FROM snap WHERE label = 'c'),
          'the refused calls changed nothing');

-- NULL result and code are values too; SQL NULL is not JSON null ------------------------------
INSERT INTO c SELECT 'cn-new', r.* FROM idem_claim('rp.cnull', '\xaa'::bytea, '1 hour') r;
SELECT lives_ok($$SELECT idem_complete('rp.cnull', 1)$$, 'complete with no result and no code');
INSERT INTO snap SELECT 'cn', l FROM idem_lookup('rp.cnull') l;
SELECT lives_ok($$SELECT idem_complete('rp.cnull', 1, NULL, NULL)$$, 'repeated with NULLs: succeeds');
SELECT throws_ok($$SELECT idem_complete('rp.cnull', 1, 'null'::jsonb)$$, 'IK003', NULL,
                 'repeated with JSON null instead of no result: IK003');
SELECT throws_ok($$SELECT idem_complete('rp.cnull', 1, '{}')$$, 'IK003', NULL,
                 'repeated with an empty object: IK003');
SELECT is((SELECT l FROM idem_lookup('rp.cnull') l), (SELECT r FROM snap WHERE label = 'cn'),
          'nothing changed');
INSERT INTO c SELECT 'cj-new', r.* FROM idem_claim('rp.cjnull', '\xaa'::bytea, '1 hour') r;
SELECT lives_ok($$SELECT idem_complete('rp.cjnull', 1, 'null'::jsonb, 204)$$, 'complete with JSON null');
SELECT lives_ok($$SELECT idem_complete('rp.cjnull', 1, 'null'::jsonb, 204)$$, 'repeated with JSON null: succeeds');
SELECT throws_ok($$SELECT idem_complete('rp.cjnull', 1, NULL, 204)$$, 'IK003', NULL,
                 'repeated with SQL NULL instead of JSON null: IK003');

-- idem_fail ---------------------------------------------------------------------------------------
INSERT INTO c SELECT 'f-new', r.* FROM idem_claim('rp.f', '\xaa'::bytea, '1 hour') r;
SELECT lives_ok($$SELECT idem_fail('rp.f', 1, '{"reason": "declined"}', false, response_code => 402)$$, 'fail');
INSERT INTO snap SELECT 'f', l FROM idem_lookup('rp.f') l;
SELECT pg_sleep(0.01);
SELECT lives_ok($$SELECT idem_fail('rp.f', 1, '{"reason": "declined"}', false, response_code => 402)$$,
                'fail repeated with the same token and values succeeds');
SELECT is((SELECT l FROM idem_lookup('rp.f') l), (SELECT r FROM snap WHERE label = 'f'),
          'the repeat changed nothing');
SELECT throws_ok($$SELECT idem_fail('rp.f', 1, '{"reason": "expired card"}', false, response_code => 402)$$,
                 'IK003', NULL, 'fail again with another error: IK003');
SELECT throws_ok($$SELECT idem_fail('rp.f', 1, '{"reason": "declined"}', true, response_code => 402)$$,
                 'IK003', NULL, 'fail again as retryable: IK003');
SELECT throws_ok($$SELECT idem_fail('rp.f', 1, '{"reason": "declined"}', false, response_code => 400)$$,
                 'IK003', NULL, 'fail again with another response code: IK003');
SELECT throws_ok($$SELECT idem_fail('rp.f', 1, '{"reason": "declined"}', false)$$,
                 'IK003', NULL, 'fail again without the response code: IK003');
SELECT throws_ok($$SELECT idem_complete('rp.f', 1, NULL)$$, 'IK003', NULL, 'complete after fail: IK003');
SELECT throws_ok($$SELECT idem_mark_unknown('rp.f', 1, '{"reason": "declined"}')$$, 'IK003', NULL,
                 'mark_unknown after fail, even with the error as detail: IK003');
SELECT is((SELECT l FROM idem_lookup('rp.f') l), (SELECT r FROM snap WHERE label = 'f'),
          'the refused calls changed nothing');
SELECT throws_ok($$SELECT idem_fail('rp.f', 1, NULL)$$, '22004', NULL, 'fail with a NULL error: 22004');
SELECT throws_ok($$SELECT idem_fail('rp.f', 1, '{}', NULL)$$, '22004', NULL, 'fail with retryable NULL: 22004');

-- a retryable failure can be repeated until someone takes the key over ---------------------------
INSERT INTO c SELECT 'fr-new', r.* FROM idem_claim('rp.fr', '\xaa'::bytea, '1 hour') r;
SELECT lives_ok($$SELECT idem_fail('rp.fr', 1, '{"reason": "timeout"}')$$, 'fail, retryable by default');
SELECT is((SELECT retryable FROM idem_lookup('rp.fr')), true, 'retryable defaults to true');
SELECT lives_ok($$SELECT idem_fail('rp.fr', 1, '{"reason": "timeout"}', true)$$, 'repeated: succeeds');
INSERT INTO c SELECT 'fr-take', r.* FROM idem_claim('rp.fr', '\xaa'::bytea, '1 hour') r;
SELECT is((SELECT token FROM c WHERE label = 'fr-take'), 2::bigint, 'the key is taken over with token 2');
SELECT throws_ok($$SELECT idem_fail('rp.fr', 1, '{"reason": "timeout"}', true)$$, 'IK002', NULL,
                 'after the takeover the old owner''s repeat is stale (IK002)');
SELECT is((SELECT status::text FROM idem_lookup('rp.fr')), 'processing',
          'and did not touch the new owner''s record');

-- idem_mark_unknown --------------------------------------------------------------------------------
INSERT INTO c SELECT 'u-new', r.* FROM idem_claim('rp.u', '\xaa'::bytea, '1 hour') r;
SELECT lives_ok($$SELECT idem_mark_unknown('rp.u', 1, '{"gateway": "no reply"}')$$, 'mark unknown');
INSERT INTO snap SELECT 'u', l FROM idem_lookup('rp.u') l;
SELECT pg_sleep(0.01);
SELECT lives_ok($$SELECT idem_mark_unknown('rp.u', 1, '{"gateway": "no reply"}')$$,
                'mark_unknown repeated with the same token and detail succeeds');
SELECT is((SELECT l FROM idem_lookup('rp.u') l), (SELECT r FROM snap WHERE label = 'u'),
          'the repeat changed nothing');
SELECT throws_ok($$SELECT idem_mark_unknown('rp.u', 1, '{"gateway": "reset"}')$$, 'IK003', NULL,
                 'mark_unknown again with another detail: IK003');
SELECT throws_ok($$SELECT idem_complete('rp.u', 1, '{}')$$, 'IK003', NULL, 'complete after mark_unknown: IK003');
SELECT throws_ok($$SELECT idem_fail('rp.u', 1, '{"gateway": "no reply"}')$$, 'IK003', NULL,
                 'fail after mark_unknown: IK003');
SELECT is((SELECT l FROM idem_lookup('rp.u') l), (SELECT r FROM snap WHERE label = 'u'),
          'the refused calls changed nothing');
SELECT lives_ok($$SELECT idem_resolve('rp.u', 'failed', '{"gateway": "no reply"}')$$, 'resolved as failed');
SELECT throws_ok($$SELECT idem_mark_unknown('rp.u', 1, '{"gateway": "no reply"}')$$, 'IK003', NULL,
                 'after the resolution a mark_unknown is no longer a repeat: IK003');

SELECT * FROM finish();
ROLLBACK;
