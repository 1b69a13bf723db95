-- Multi-phase work: an owner records recovery points; when it vanishes the next
-- owner takes over and resumes from the last recovery point; every takeover
-- fences off all earlier owners.  And the one-transaction use: the record
-- commits or rolls back with the caller's own writes, so a claim, takeover,
-- checkpoint or completion rolled back to a savepoint leaves no trace.
-- Keys are prefixed "mp.".  (pgTAP keeps its tally in tables, so no assertion
-- runs inside a savepoint that is rolled back: psql variables carry values.)
BEGIN;
SELECT plan(39);

CREATE TEMP TABLE c AS
SELECT 'o1'::text AS label, r.*
FROM idem_claim('mp.order', idem_fingerprint('{"order": 42, "amount": 1000}'::jsonb), '50 ms',
                retention => '1 hour') r;
\set fp 'idem_fingerprint(''{"amount": 1000, "order": 42}''::jsonb)'

-- phase 1: the first owner reserves and charges, then vanishes -----------------------------------
SELECT lives_ok($$SELECT idem_checkpoint('mp.order', 1, 'reserved')$$, 'owner 1 records "reserved"');
SELECT lives_ok($$SELECT idem_checkpoint('mp.order', 1, 'charged')$$, 'owner 1 records "charged"');
SELECT is((SELECT recovery_point FROM idem_lookup('mp.order')), 'charged', 'the last recovery point wins');
SELECT ok((SELECT updated_at > created_at FROM idem_lookup('mp.order')), 'a checkpoint moves updated_at');
SELECT pg_sleep(0.1);

-- phase 2: owner 2 resumes from "charged", ships, vanishes ---------------------------------------
INSERT INTO c SELECT 'o2', r.* FROM idem_claim('mp.order', :fp, '50 ms') r;
SELECT results_eq($$SELECT outcome, token, attempts, recovery_point FROM c WHERE label = 'o2'$$,
                  $$VALUES ('takeover', 2::bigint, 2, 'charged')$$,
                  'owner 2 takes over at attempt 2 and learns the recovery point "charged"');
SELECT throws_ok($$SELECT idem_checkpoint('mp.order', 1, 'refunded')$$, 'IK002', NULL,
                 'owner 1 can no longer record progress');
SELECT lives_ok($$SELECT idem_checkpoint('mp.order', 2, 'shipped', '50 ms')$$, 'owner 2 records "shipped"');
SELECT pg_sleep(0.1);

-- phase 3: owner 3 resumes from "shipped" and fails, retryably -------------------------------------
INSERT INTO c SELECT 'o3', r.* FROM idem_claim('mp.order', :fp, '1 hour') r;
SELECT results_eq($$SELECT outcome, token, attempts, recovery_point FROM c WHERE label = 'o3'$$,
                  $$VALUES ('takeover', 3::bigint, 3, 'shipped')$$,
                  'owner 3 takes over at attempt 3 and learns "shipped"');
SELECT throws_ok($$SELECT idem_checkpoint('mp.order', 2, 'x')$$, 'IK002', NULL, 'owner 2 is fenced off');
SELECT throws_ok($$SELECT idem_checkpoint('mp.order', 1, 'x')$$, 'IK002', NULL, 'owner 1 is still fenced off');
SELECT is((SELECT recovery_point FROM idem_lookup('mp.order')), 'shipped',
          'the fenced-off owners did not move the recovery point');
SELECT lives_ok($$SELECT idem_fail('mp.order', 3, '{"reason": "mailer down"}', true)$$,
                'owner 3 fails retryably');

-- phase 4: owner 4 retries from "shipped" and completes -----------------------------------------------
INSERT INTO c SELECT 'o4', r.* FROM idem_claim('mp.order', :fp, '1 hour') r;
SELECT results_eq($$SELECT outcome, token, attempts, recovery_point FROM c WHERE label = 'o4'$$,
                  $$VALUES ('takeover', 4::bigint, 4, 'shipped')$$,
                  'after a retryable failure owner 4 takes over, still knowing "shipped"');
SELECT throws_ok($$SELECT idem_fail('mp.order', 3, '{"reason": "mailer down"}', true)$$, 'IK002', NULL,
                 'owner 3 cannot repeat its failure over owner 4');
SELECT lives_ok($$SELECT idem_checkpoint('mp.order', 4, 'notified')$$, 'owner 4 records "notified"');
SELECT lives_ok($$SELECT idem_complete('mp.order', 4, '{"order": 42, "state": "done"}', 200)$$,
                'owner 4 completes');
INSERT INTO c SELECT 'replay', r.* FROM idem_claim('mp.order', :fp, '1 hour') r;
SELECT results_eq(
    $$SELECT outcome, token, status::text, result, response_code, error, attempts FROM c WHERE label = 'replay'$$,
    $$VALUES ('replay', NULL::bigint, 'succeeded', '{"order": 42, "state": "done"}'::jsonb, 200, NULL::jsonb, 4)$$,
    'the finished order replays its result and how many attempts it took');
SELECT results_eq(
    $$SELECT label, token FROM c WHERE label ~ '^o[0-9]$' ORDER BY label$$,
    $$VALUES ('o1', 1::bigint), ('o2', 2::bigint), ('o3', 3::bigint), ('o4', 4::bigint)$$,
    'each owner got its own, strictly larger token');
SELECT throws_ok(format('SELECT idem_complete(%L, %s, %L, 200)', 'mp.order', t,
                        '{"order": 42, "state": "done"}'), 'IK002', NULL,
                 format('owner %s cannot repeat owner 4''s completion', t))
FROM generate_series(1, 3) AS t;

-- one transaction: the record and the caller's writes commit or roll back together --------------------
CREATE TEMP TABLE shipments (order_id int PRIMARY KEY, note text);
SAVEPOINT attempt;
SELECT outcome AS t1_outcome, token AS t1_token FROM idem_claim('mp.tx', '\xaa'::bytea, '1 hour') \gset
INSERT INTO shipments VALUES (7, 'first try');
SELECT idem_complete('mp.tx', :t1_token, '{"shipment": 7}') \g /dev/null
SELECT status::text AS t1_status FROM idem_lookup('mp.tx') \gset
ROLLBACK TO SAVEPOINT attempt;
SELECT is(:'t1_outcome' || ' ' || :'t1_token' || ' ' || :'t1_status', 'new 1 succeeded',
          'inside the savepoint: claimed (new, token 1) and completed');
SELECT is_empty($$SELECT * FROM idem_lookup('mp.tx')$$, 'rolled back: no record');
SELECT is_empty($$SELECT * FROM shipments$$, 'rolled back: no shipment either');
INSERT INTO c SELECT 'tx-2', r.* FROM idem_claim('mp.tx', '\xaa'::bytea, '1 hour') r;
INSERT INTO shipments VALUES (7, 'second try');
SELECT lives_ok($$SELECT idem_complete('mp.tx', 1, '{"shipment": 7}')$$, 'the kept attempt completes');
SELECT results_eq($$SELECT outcome, token, attempts FROM c WHERE label = 'tx-2'$$,
                  $$VALUES ('new', 1::bigint, 1)$$,
                  'the kept attempt was new with token 1: the rolled-back one left nothing');
INSERT INTO c SELECT 'tx-replay', r.* FROM idem_claim('mp.tx', '\xaa'::bytea, '1 hour') r;
SELECT results_eq($$SELECT c.outcome, c.result, s.note FROM c JOIN shipments s ON s.order_id = (c.result->>'shipment')::int
                    WHERE c.label = 'tx-replay'$$,
                  $$VALUES ('replay', '{"shipment": 7}'::jsonb, 'second try')$$,
                  'the replayed result points at the kept shipment');

-- a takeover rolled back leaves the previous owner in place ------------------------------------------
INSERT INTO c SELECT 'tk-1', r.* FROM idem_claim('mp.tk', '\xaa'::bytea, '50 ms', retention => '1 hour') r;
SELECT lives_ok($$SELECT idem_checkpoint('mp.tk', 1, 'step-1')$$, 'owner 1 checkpoints');
CREATE TEMP TABLE snap (label text PRIMARY KEY, r idempotency_records);
INSERT INTO snap SELECT 'tk', l FROM idem_lookup('mp.tk') l;
SELECT pg_sleep(0.1);
SAVEPOINT take;
SELECT outcome AS tk_outcome, token AS tk_token FROM idem_claim('mp.tk', '\xaa'::bytea, '1 hour') \gset
SELECT idem_checkpoint('mp.tk', :tk_token, 'step-2') \g /dev/null
SELECT recovery_point AS tk_point FROM idem_lookup('mp.tk') \gset
ROLLBACK TO SAVEPOINT take;
SELECT is(:'tk_outcome' || ' ' || :'tk_token' || ' ' || :'tk_point', 'takeover 2 step-2',
          'inside the savepoint: taken over with token 2, progress recorded');
SELECT is((SELECT l FROM idem_lookup('mp.tk') l), (SELECT r FROM snap WHERE label = 'tk'),
          'rolled back: the record is exactly as owner 1 left it');
INSERT INTO c SELECT 'tk-2', r.* FROM idem_claim('mp.tk', '\xaa'::bytea, '1 hour') r;
SELECT results_eq($$SELECT outcome, token, attempts, recovery_point FROM c WHERE label = 'tk-2'$$,
                  $$VALUES ('takeover', 2::bigint, 2, 'step-1')$$,
                  'the next takeover starts from owner 1''s state: attempt 2, recovery point "step-1"');
SELECT throws_ok($$SELECT idem_checkpoint('mp.tk', 1, 'step-2')$$, 'IK002', NULL,
                 'and fences off owner 1');

-- a release or an unknown mark rolled back leaves the owner in charge ----------------------------
INSERT INTO c SELECT 'rl-1', r.* FROM idem_claim('mp.rl', '\xaa'::bytea, '1 hour') r;
SAVEPOINT rel;
SELECT idem_release('mp.rl', 1) \g /dev/null
ROLLBACK TO SAVEPOINT rel;
SAVEPOINT unk;
SELECT idem_mark_unknown('mp.rl', 1, '{"x": 1}') \g /dev/null
ROLLBACK TO SAVEPOINT unk;
SELECT results_eq($$SELECT token, status::text, lease_expires_at IS NOT NULL FROM idem_lookup('mp.rl')$$,
                  $$VALUES (1::bigint, 'processing', true)$$,
                  'after the rolled-back release and mark: token 1, processing, leased');
SELECT throws_ok($$SELECT idem_claim('mp.rl', '\xbb'::bytea, '1 hour')$$, 'IK001', NULL,
                 'the key is not released: another request conflicts');
SELECT lives_ok($$SELECT idem_complete('mp.rl', 1, '{"ok": true}')$$, 'owner 1 completes');

-- work done in one statement: claim, write, complete ------------------------------------------------
CREATE FUNCTION pg_temp.ship(order_id int, request jsonb) RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
    cl record;
BEGIN
    SELECT * INTO cl FROM idem_claim('mp.ship.' || order_id, idem_fingerprint(request), '1 hour');
    IF cl.outcome IN ('new', 'takeover') THEN
        INSERT INTO shipments VALUES (order_id, request->>'note');
        PERFORM idem_complete('mp.ship.' || order_id, cl.token, jsonb_build_object('shipped', order_id), 201);
        RETURN jsonb_build_object('outcome', cl.outcome, 'shipped', order_id);
    END IF;
    RETURN jsonb_build_object('outcome', cl.outcome, 'result', cl.result);
END
$fn$;
SELECT is(pg_temp.ship(8, '{"note": "parcel"}'), '{"outcome": "new", "shipped": 8}'::jsonb,
          'a function claims, writes and completes in one go');
SELECT is(pg_temp.ship(8, '{"note": "parcel"}'), '{"outcome": "replay", "result": {"shipped": 8}}'::jsonb,
          'calling it again replays without writing');
SELECT is((SELECT count(*) FROM shipments WHERE order_id = 8), 1::bigint, 'one shipment for two calls');
SELECT throws_ok($$SELECT pg_temp.ship(8, '{"note": "other"}')$$, 'IK001', NULL,
                 'another request under the same key is refused inside the function too');

SELECT * FROM finish();
ROLLBACK;
