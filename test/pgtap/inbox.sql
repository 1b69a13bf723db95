-- The consumer inbox and idem_purge, as an application uses them: the de-dup
-- row commits or rolls back with the business change it guards; consumers
-- and streams are independent; idem_purge works in batches (max_batches
-- counts per table), removes only what has expired and may be forgotten, and
-- a purged key starts afresh; roles without grants get 42501.  Consumers
-- and record keys are prefixed "it.", roles are regress_idem_*; all of it is
-- rolled back.  Nothing here depends on timing beyond sleeping past a short
-- retention.
BEGIN;
SELECT plan(83);

-- Expired rows committed by others would be counted by the purges below.
SELECT ok(idem_purge() >= 0, 'expired rows left by others are purged first (rolled back at the end)');

-- The business table the inbox guards, and a handler that processes a
-- delivery once: accept, then the business change, in the same transaction.
CREATE TEMP TABLE orders (message_id text PRIMARY KEY, amount integer NOT NULL CHECK (amount > 0));
CREATE FUNCTION pg_temp.handle(consumer text, message_id text, amount integer) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT idem_inbox_accept(consumer, message_id) THEN
        RETURN false;                       -- a duplicate: nothing to do
    END IF;
    INSERT INTO orders VALUES (message_id, amount);
    RETURN true;
END
$$;

-- the de-dup row commits and rolls back with the business change ------------------------------
SAVEPOINT delivery;
SELECT is(pg_temp.handle('it.shop', 'm-1', 10), true, 'first delivery of m-1 is processed');
SELECT is((SELECT count(*) FROM orders WHERE message_id = 'm-1'), 1::bigint, 'and its order is written');
ROLLBACK TO SAVEPOINT delivery;
SELECT is((SELECT count(*) FROM idem_inbox WHERE consumer = 'it.shop'), 0::bigint,
          'rolling back the business transaction removes the de-dup row too');
SELECT is(pg_temp.handle('it.shop', 'm-1', 10), true,
          'so the redelivery of m-1 is accepted again, as new');
RELEASE SAVEPOINT delivery;
SELECT is(pg_temp.handle('it.shop', 'm-1', 10), false, 'once that has committed, the next redelivery is a duplicate');
SELECT is((SELECT count(*) FROM orders WHERE message_id = 'm-1'), 1::bigint, 'and m-1 was ordered exactly once');

-- a business change that fails after the accept: the accept goes with it
SELECT throws_ok($$SELECT pg_temp.handle('it.shop', 'm-2', 0)$$, '23514', NULL,
                 'the handler fails after accepting m-2 (CHECK violation)');
SELECT is((SELECT count(*) FROM idem_inbox WHERE consumer = 'it.shop' AND message_id = 'm-2'), 0::bigint,
          'the failed handler left no de-dup row');
SELECT is(pg_temp.handle('it.shop', 'm-2', 20), true, 'the redelivery of m-2 is processed');
SELECT is(pg_temp.handle('it.shop', 'm-2', 20), false, 'and the one after that is a duplicate');

-- many redeliveries: each message is processed once
SELECT is((SELECT count(*) FILTER (WHERE pg_temp.handle('it.shop', 'r-' || (i % 5), 1))
           FROM generate_series(1, 20) i), 5::bigint,
          '20 deliveries of 5 messages: 5 processed');
SELECT is((SELECT count(*) FROM orders WHERE message_id LIKE 'r-%'), 5::bigint, 'and 5 orders written');

-- the same within one statement and one transaction
SELECT results_eq($$SELECT idem_inbox_accept('it.once', 'x'), idem_inbox_accept('it.once', 'x')$$,
                  $$VALUES (true, false)$$, 'a message accepted earlier in the same statement is a duplicate');

-- the watermark of a stream follows the transaction as well
SELECT is(idem_inbox_accept_seq('it.shop', 'ledger', 1), 'new', 'stream ledger starts at 1');
SAVEPOINT seq;
SELECT is(idem_inbox_accept_seq('it.shop', 'ledger', 2), 'new', '2 is new');
SELECT is(idem_inbox_accept_seq('it.shop', 'ledger', 5, accept_gap => true), 'gap', '5 is a gap, accepted');
SELECT is(idem_inbox_watermark('it.shop', 'ledger'), 5::bigint, 'the watermark is 5');
ROLLBACK TO SAVEPOINT seq;
SELECT is(idem_inbox_watermark('it.shop', 'ledger'), 1::bigint, 'rolled back: the watermark is 1 again');
SELECT is(idem_inbox_accept_seq('it.shop', 'ledger', 2), 'new', 'and 2 is new again');
RELEASE SAVEPOINT seq;
SAVEPOINT first_seq;
SELECT is(idem_inbox_accept_seq('it.shop', 'fresh', 7), 'new', 'a stream started in a subtransaction');
ROLLBACK TO SAVEPOINT first_seq;
SELECT is(idem_inbox_watermark('it.shop', 'fresh'), NULL::bigint, 'rolled back: the stream does not exist');
SELECT is(idem_inbox_accept_seq('it.shop', 'fresh', 3), 'new', 'and starts again at another number');
RELEASE SAVEPOINT first_seq;

-- consumers are independent namespaces -----------------------------------------------------------
SELECT results_eq($$SELECT idem_inbox_accept('it.billing', 'm-1'), idem_inbox_accept('it.mailer', 'm-1')$$,
                  $$VALUES (true, true)$$, 'the same message id is new for each consumer');
SELECT results_eq($$SELECT idem_inbox_accept('it.billing', 'm-1'), idem_inbox_accept('it.mailer', 'm-1')$$,
                  $$VALUES (false, false)$$, 'and a duplicate for each afterwards');
SELECT is(idem_inbox_accept('it.audit', 'm-1', '50 ms'), true, 'a third consumer keeps it 50 ms only');
SELECT pg_sleep(0.1);
SELECT results_eq($$SELECT idem_inbox_accept('it.audit', 'm-1'), idem_inbox_accept('it.billing', 'm-1')$$,
                  $$VALUES (true, false)$$,
                  'its retention ending makes it new for that consumer only');
SELECT is(idem_inbox_accept('it.shop', 'M-1'), true, 'message ids are case sensitive');

-- streams are independent ------------------------------------------------------------------------
SELECT results_eq(
    $$SELECT idem_inbox_accept_seq('it.billing', 'a', 1), idem_inbox_accept_seq('it.billing', 'b', 1),
             idem_inbox_accept_seq('it.mailer', 'a', 1)$$,
    $$VALUES ('new'::text, 'new'::text, 'new'::text)$$,
    'seq 1 is new on streams a and b of one consumer, and on stream a of another');
SELECT is(idem_inbox_accept_seq('it.billing', 'a', 5), 'gap', 'a gap on billing/a');
SELECT results_eq(
    $$SELECT idem_inbox_accept_seq('it.billing', 'b', 2), idem_inbox_accept_seq('it.mailer', 'a', 2),
             idem_inbox_accept_seq('it.billing', 'a', 2)$$,
    $$VALUES ('new'::text, 'new'::text, 'new'::text)$$,
    'does not hold up billing/b or mailer/a; billing/a goes on from its watermark');
SELECT is(idem_inbox_accept_seq('it.billing', 'b', 9, true), 'gap', 'an accepted gap on billing/b');
SELECT results_eq(
    $$SELECT consumer COLLATE "default", stream COLLATE "default", watermark FROM idem_inbox_streams
      WHERE consumer IN ('it.billing', 'it.mailer') ORDER BY consumer, stream$$,
    $$VALUES ('it.billing', 'a', 2::bigint), ('it.billing', 'b', 9::bigint), ('it.mailer', 'a', 2::bigint)$$,
    'each (consumer, stream) has its own watermark');
SELECT is(idem_inbox_accept('it.billing', 'a'), true,
          'a stream and a message may share a name: separate tables');

-- idem_purge: batches -------------------------------------------------------------------------------
-- five expired finished records, batch_size 2, one batch per call
DO $$
BEGIN
    FOR i IN 1..5 LOOP
        PERFORM idem_complete('it.p' || i,
                              (SELECT c.token FROM idem_claim('it.p' || i, '\xaa'::bytea, '1 hour',
                                                               retention => '50 ms') c),
                              '{}');
    END LOOP;
END
$$;
SELECT pg_sleep(0.1);
SELECT is(idem_purge(2, 1), 2::bigint, 'batch_size 2, max_batches 1: 2 of the 5 expired records go');
SELECT is((SELECT count(*) FROM idempotency_records WHERE key LIKE 'it.p%'), 3::bigint, '3 are left');
SELECT is(idem_purge(2, 1), 2::bigint, 'the next call: 2 more');
SELECT is(idem_purge(2, 1), 1::bigint, 'then the last one');
SELECT is(idem_purge(2, 1), 0::bigint, 'then 0: done');
SELECT is((SELECT count(*) FROM idempotency_records WHERE key LIKE 'it.p%'), 0::bigint, 'all 5 are gone');
-- the same for five expired inbox messages: max_batches counts per table
SELECT is((SELECT count(*) FILTER (WHERE idem_inbox_accept('it.batch', 'm-' || i, '50 ms'))
           FROM generate_series(1, 5) i), 5::bigint, 'five messages kept for 50 ms');
SELECT pg_sleep(0.1);
SELECT is(idem_purge(2, 1), 2::bigint, 'batch_size 2, max_batches 1: 2 of the 5 expired messages go');
SELECT is((SELECT count(*) FROM idem_inbox WHERE consumer = 'it.batch'), 3::bigint, '3 are left');
SELECT is(idem_purge(2, 1), 2::bigint, 'the next call: 2 more');
SELECT is(idem_purge(2, 1), 1::bigint, 'then the last one');
SELECT is(idem_purge(2, 1), 0::bigint, 'then 0: done');
-- both tables in one call: one batch of each
DO $$
BEGIN
    FOR i IN 1..3 LOOP
        PERFORM idem_complete('it.q' || i,
                              (SELECT c.token FROM idem_claim('it.q' || i, '\xaa'::bytea, '1 hour',
                                                               retention => '50 ms') c),
                              '{}');
        PERFORM idem_inbox_accept('it.q', 'm-' || i, '50 ms');
    END LOOP;
END
$$;
SELECT pg_sleep(0.1);
SELECT is(idem_purge(2, 1), 4::bigint, '3 expired records and 3 expired messages, batch_size 2, max_batches 1: 2 + 2 go');
SELECT results_eq($$SELECT (SELECT count(*) FROM idempotency_records WHERE key LIKE 'it.q%'),
                           (SELECT count(*) FROM idem_inbox WHERE consumer = 'it.q')$$,
                  $$VALUES (1::bigint, 1::bigint)$$, 'one of each is left');
SELECT is(idem_purge(2, 1), 2::bigint, 'the next call takes both');
SELECT is(idem_purge(2, 1), 0::bigint, 'then 0');
-- five expired inbox messages and two that are retained, batch_size 2
SELECT is((SELECT count(*) FILTER (WHERE idem_inbox_accept('it.purge', 'old-' || i, '50 ms'))
           FROM generate_series(1, 5) i), 5::bigint, 'five messages kept for 50 ms');
SELECT is((SELECT count(*) FILTER (WHERE idem_inbox_accept('it.purge', 'new-' || i, '1 hour'))
           FROM generate_series(1, 2) i), 2::bigint, 'two kept for an hour');
SELECT pg_sleep(0.1);
SELECT is(idem_purge(2), 5::bigint, 'batch_size 2 without max_batches: all 5 expired messages go');
SELECT results_eq($$SELECT message_id COLLATE "default" FROM idem_inbox WHERE consumer = 'it.purge' ORDER BY 1$$,
                  $$VALUES ('new-1'), ('new-2')$$, 'the retained ones stay');
SELECT is(idem_purge(2), 0::bigint, 'and a second purge finds nothing');
SELECT is(idem_inbox_accept('it.purge', 'old-3'), true, 'a purged message is new again');
SELECT is(idem_inbox_watermark('it.shop', 'ledger'), 2::bigint, 'watermarks survive purges');

-- a purged record starts afresh, above every token issued before -----------------------------------
-- it.gone and it.kept go through the same history (an owner whose lease
-- expired, a takeover with token 2, completion, retention over); only
-- it.gone is purged before the key is claimed again.  The purges above moved
-- the token epoch; start from epoch 0 so that the first tokens are 1.
SELECT setval('idem_token_epoch', 1, false);
SELECT is((SELECT outcome FROM idem_claim('it.gone', '\xaa'::bytea, '50 ms', retention => '50 ms')), 'new',
          'it.gone: claimed with token 1 and a 50 ms lease');
SELECT pg_sleep(0.1);
SELECT is((SELECT outcome FROM idem_claim('it.gone', '\xaa'::bytea, '1 hour', retention => '50 ms')), 'takeover',
          'it.gone: the first owner''s lease expired; a takeover with token 2');
SELECT lives_ok($$SELECT idem_complete('it.gone', 2, '{"v": 2}')$$, 'the second owner completes it.gone');
SELECT pg_sleep(0.1);
SELECT is(idem_purge(), 1::bigint, 'the purge removes it.gone');
SELECT is((SELECT count(*) FROM idempotency_records WHERE key = 'it.gone'), 0::bigint, 'it.gone is absent');
SELECT results_eq(
    $$SELECT outcome, token, status::text, attempts, result FROM idem_claim('it.gone', '\xbb'::bytea, '1 hour')$$,
    $$VALUES ('new', 65537::bigint, 'processing', 1, NULL::jsonb)$$,
    'a later claim of the purged key is new, with a token above all earlier ones (2^16 + 1), and no trace of the old result');
SELECT throws_ok($$SELECT idem_complete('it.gone', 1, '{"zombie": true}')$$, 'IK002', NULL,
                 'the first owner, stalled through the purge, cannot complete the new owner''s work');
SELECT setval('idem_token_epoch', 1, false);
SELECT is((SELECT outcome FROM idem_claim('it.kept', '\xaa'::bytea, '50 ms', retention => '50 ms')), 'new',
          'it.kept: claimed with token 1 and a 50 ms lease');
SELECT pg_sleep(0.1);
SELECT is((SELECT outcome FROM idem_claim('it.kept', '\xaa'::bytea, '1 hour', retention => '50 ms')), 'takeover',
          'it.kept: a takeover with token 2');
SELECT lives_ok($$SELECT idem_complete('it.kept', 2, '{"v": 2}')$$, 'the second owner completes it.kept');
SELECT pg_sleep(0.1);
SELECT results_eq(
    $$SELECT outcome, token, status::text, attempts, result FROM idem_claim('it.kept', '\xbb'::bytea, '1 hour')$$,
    $$VALUES ('new', 3::bigint, 'processing', 1, NULL::jsonb)$$,
    'the same history without a purge: the key is reused with the next token, 3');

-- privileges ------------------------------------------------------------------------------------
CREATE ROLE regress_idem_inbox_nobody;
CREATE ROLE regress_idem_inbox_exec;
GRANT EXECUTE ON FUNCTION idem_inbox_accept(text, text, interval, boolean),
    idem_inbox_accept_seq(text, text, bigint, boolean), idem_inbox_watermark(text, text),
    idem_purge(integer, integer) TO regress_idem_inbox_exec;
SET LOCAL ROLE regress_idem_inbox_nobody;
SELECT throws_ok($$SELECT idem_inbox_accept('it.priv', 'm-1')$$, '42501', NULL,
                 'a role without grants gets 42501 from idem_inbox_accept');
SELECT throws_ok($$SELECT idem_inbox_accept('it.priv', 'm-1', wait => false)$$, '42501', NULL,
                 'also with wait => false');
SELECT throws_ok($$SELECT idem_purge()$$, '42501', NULL, 'and from idem_purge');
SELECT throws_ok($$SELECT idem_inbox_accept_seq('it.priv', 's', 1)$$, '42501', NULL, 'and from idem_inbox_accept_seq');
SELECT throws_ok($$SELECT idem_inbox_accept_seq('it.priv', 's', 1, 0)$$, '42501', NULL,
                 'and from the (major, minor) overload');
SELECT throws_ok($$SELECT idem_inbox_watermark('it.priv', 's')$$, '42501', NULL, 'and from idem_inbox_watermark');
RESET ROLE;
-- EXECUTE alone is not enough: the functions run with the caller's table privileges
SET LOCAL ROLE regress_idem_inbox_exec;
SELECT throws_ok($$SELECT idem_inbox_accept('it.priv', 'm-1')$$, '42501', NULL,
                 'EXECUTE without privileges on idem_inbox: 42501 from idem_inbox_accept');
SELECT throws_ok($$SELECT idem_purge()$$, '42501', NULL,
                 'EXECUTE without DELETE on the tables: 42501 from idem_purge');
SELECT throws_ok($$SELECT idem_inbox_accept_seq('it.priv', 's', 1)$$, '42501', NULL,
                 'EXECUTE without privileges on idem_inbox_streams: 42501 from idem_inbox_accept_seq');
RESET ROLE;
SELECT is((SELECT count(*) FROM idem_inbox WHERE consumer = 'it.priv'), 0::bigint, 'none of them wrote anything');
SELECT is((SELECT count(*) FROM idem_inbox_streams WHERE consumer = 'it.priv'), 0::bigint, 'nor started a stream');
-- with the table privileges the functions use, the same role can
GRANT SELECT, INSERT, UPDATE ON idem_inbox, idem_inbox_streams TO regress_idem_inbox_exec;
GRANT SELECT, UPDATE, DELETE ON idem_inbox, idempotency_records TO regress_idem_inbox_exec;
GRANT USAGE ON SEQUENCE idem_token_epoch TO regress_idem_inbox_exec;
SET LOCAL ROLE regress_idem_inbox_exec;
SELECT results_eq($$SELECT idem_inbox_accept('it.priv', 'm-1'), idem_inbox_accept('it.priv', 'm-1', wait => false)$$,
                  $$VALUES (true, false)$$, 'granted SELECT, INSERT, UPDATE on idem_inbox: accept works');
SELECT results_eq($$SELECT idem_inbox_accept_seq('it.priv', 's', 1), idem_inbox_accept_seq('it.priv', 's', 1)$$,
                  $$VALUES ('new'::text, 'duplicate'::text)$$,
                  'granted SELECT, INSERT, UPDATE on idem_inbox_streams: accept_seq works');
SELECT is(idem_inbox_watermark('it.priv', 's'), 1::bigint, 'and idem_inbox_watermark');
SELECT is(idem_purge(), 0::bigint, 'granted SELECT, UPDATE, DELETE on both tables: idem_purge works');
RESET ROLE;

-- purges bumped the token epoch (not transactional); later files expect token 1
SELECT setval('idem_token_epoch', 1, false);
SELECT * FROM finish();
ROLLBACK;
