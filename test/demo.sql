-- The demo of test/demo: every outcome of idem_claim, in psql.
\pset null '-'
\set ECHO all
\set VERBOSITY default
CREATE EXTENSION idempotency;

-- 1. One transaction: claim, business write, complete, commit together.
CREATE TABLE orders (id serial PRIMARY KEY, sku text, qty int);
BEGIN;
SELECT outcome, token, status
  FROM idem_claim('order-7f3a', idem_fingerprint('{"sku":"A1","qty":2}'::jsonb),
                  lease => '30 seconds', scope => 'tenant-42');
INSERT INTO orders (sku, qty) VALUES ('A1', 2);
SELECT idem_complete('order-7f3a', token => 1, result => '{"order_id":1}',
                     response_code => 201, scope => 'tenant-42');
COMMIT;

-- 2. The client retries after a timeout: same key, same body (key order and
--    spacing do not matter) -> replay of the saved result; nothing runs twice.
SELECT outcome, token, status, response_code, result
  FROM idem_claim('order-7f3a', idem_fingerprint('{"qty": 2, "sku": "A1"}'::jsonb),
                  '30 seconds', 'tenant-42');
SELECT count(*) AS orders FROM orders;

-- 3. Same key, another request: an error (IK001), never a replay.
SELECT outcome FROM idem_claim('order-7f3a', idem_fingerprint('{"sku":"A1","qty":3}'::jsonb),
                               '30 seconds', 'tenant-42');

-- 4. Multi-phase: the claim commits on its own, the external call happens
--    outside any transaction.  A duplicate meanwhile sees in_progress.
SELECT outcome, token, status FROM idem_claim('pay-1', idem_fingerprint('charge 10 EUR'), '1 second');
SELECT outcome, token, status FROM idem_claim('pay-1', idem_fingerprint('charge 10 EUR'), '1 second');
SELECT idem_checkpoint('pay-1', 1, 'psp-request-sent') IS NOT NULL AS checkpointed;

-- 5. The worker dies; its lease runs out; the next claim takes over with a
--    larger fencing token and sees where the previous owner got to.
SELECT pg_sleep(1.1);
SELECT outcome, token, status, recovery_point, attempts
  FROM idem_claim('pay-1', idem_fingerprint('charge 10 EUR'), '30 seconds');

-- 6. The old owner wakes up and tries to complete: rejected (IK002).
SELECT idem_complete('pay-1', token => 1, result => '{"charged":true}');

-- 7. The new owner's call to the payment provider times out: the outcome is
--    unknown and must not be redone blindly.
SELECT idem_mark_unknown('pay-1', 2, '{"psp":"timeout after 30s"}');
SELECT outcome, token, status, error
  FROM idem_claim('pay-1', idem_fingerprint('charge 10 EUR'), '30 seconds');

-- 8. Reconciliation found no charge at the provider: resolve as a retryable
--    failure, and the next claim takes over to redo it safely.
SELECT idem_resolve('pay-1', 'failed', '{"psp":"no such charge"}', retryable => true);
SELECT outcome, token, status, attempts
  FROM idem_claim('pay-1', idem_fingerprint('charge 10 EUR'), '30 seconds');
SELECT idem_complete('pay-1', 3, '{"charge_id":"ch_42"}', 201);
SELECT outcome, response_code, result
  FROM idem_claim('pay-1', idem_fingerprint('charge 10 EUR'), '30 seconds');

-- 9. A permanent failure is saved and replayed like a result.
SELECT outcome, token FROM idem_claim('pay-2', idem_fingerprint('charge 99999 EUR'), '30 seconds');
SELECT idem_fail('pay-2', 1, '{"reason":"card declined"}', retryable => false, response_code => 402);
SELECT outcome, status, response_code, error
  FROM idem_claim('pay-2', idem_fingerprint('charge 99999 EUR'), '30 seconds');

-- 10. Releasing a key before any effect: the next claim is new (larger token).
SELECT outcome, token FROM idem_claim('pay-3', idem_fingerprint('a'), '30 seconds');
SELECT idem_release('pay-3', 1);
SELECT outcome, token FROM idem_claim('pay-3', idem_fingerprint('b'), '30 seconds');

-- 11. What is stored.
SELECT scope, key, status, token, attempts, response_code, result, error
  FROM idem_lookup('order-7f3a', 'tenant-42');
SELECT scope, key, status, token, attempts FROM idempotency_records ORDER BY scope, key;

-- 12. State machines: the database refuses illegal moves, whoever sends them.
SELECT idem_define_machine('payment',
  '{"PENDING": ["PAID", "CANCELLED"], "PAID": ["REFUNDED"]}'::jsonb,
  initial => '{PENDING}');
CREATE TABLE payments (id text PRIMARY KEY, status text NOT NULL);
SELECT idem_attach_machine('payments'::regclass, 'status', 'payment');
INSERT INTO payments VALUES ('pay-981', 'PENDING');
-- the payment provider's callback arrives twice: one applies, one is already done
SELECT idem_transition('payments'::regclass, 'pay-981', 'PAID', from_states => '{PENDING}');
SELECT idem_transition('payments'::regclass, 'pay-981', 'PAID', from_states => '{PENDING}');
-- a late cancellation is rejected, and a hand-written step back is an error (IK005)
SELECT idem_transition('payments'::regclass, 'pay-981', 'CANCELLED');
UPDATE payments SET status = 'PENDING' WHERE id = 'pay-981';
SELECT idem_machine_dot('payment');
