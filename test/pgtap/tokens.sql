-- The fencing tokens' space (src/tokens.c): epoch * 2^16 + n, 2^47 epochs.
-- No workload may use them up within a century at 10,000 epoch-spending
-- statements a second, a deletion rolled back again and again spends one
-- epoch at most, a key that used up its epoch's tokens goes on in a new
-- epoch (never in one not yet begun), and at the limit whatever needs a new
-- epoch fails with 2200H and says what to do, rather than repeat a token.
--
-- Everything is rolled back; the epoch (a sequence, not transactional) is
-- put back at the end.  Keys are prefixed "tk.".
BEGIN;
SELECT plan(16);

CREATE TEMP TABLE saved_epoch AS SELECT last_value, is_called FROM idem_token_epoch;
CREATE FUNCTION pg_temp.epoch() RETURNS bigint LANGUAGE sql
RETURN coalesce(pg_sequence_last_value('idem_token_epoch'), 0);

-- the space -----------------------------------------------------------------------------------
SELECT cmp_ok((SELECT max_value FROM pg_sequences
                WHERE schemaname = 'public' AND sequencename = 'idem_token_epoch'),
              '>=', (10000::numeric * 86400 * 36525)::bigint,
              'the epochs last a century at 10,000 epoch-spending statements a second');
SELECT is((SELECT max_value FROM pg_sequences
            WHERE schemaname = 'public' AND sequencename = 'idem_token_epoch'),
          (2::numeric ^ 47 - 1)::bigint, '... 2^47 - 1 of them, whose tokens fit in a bigint');

-- a deletion rolled back again and again -------------------------------------------------------
SELECT outcome FROM idem_claim('tk.rollback', '\x01', '1 hour');
CREATE TEMP TABLE before_rollbacks AS SELECT pg_temp.epoch() AS epoch;
SAVEPOINT d1; DELETE FROM idempotency_records WHERE key = 'tk.rollback'; ROLLBACK TO SAVEPOINT d1;
SAVEPOINT d2; DELETE FROM idempotency_records WHERE key = 'tk.rollback'; ROLLBACK TO SAVEPOINT d2;
SAVEPOINT d3; DELETE FROM idempotency_records WHERE key = 'tk.rollback'; ROLLBACK TO SAVEPOINT d3;
SAVEPOINT d4; DELETE FROM idempotency_records WHERE key = 'tk.rollback'; ROLLBACK TO SAVEPOINT d4;
SELECT is(pg_temp.epoch() - (SELECT epoch FROM before_rollbacks), 1::bigint,
          'four deletions of a record, each rolled back, spend one epoch: the record is of an older one after the first');

-- a key that uses up its epoch's tokens --------------------------------------------------------
SELECT outcome FROM idem_claim('tk.busy', '\x02', '1 hour');
-- as if 65534 takeovers had happened in this epoch (a token may be set by hand:
-- only scope and key are refused)
UPDATE idempotency_records SET token = (pg_temp.epoch() << 16) + 65535,
       lease_expires_at = clock_timestamp() - interval '1 second'
 WHERE key = 'tk.busy';
CREATE TEMP TABLE busy AS SELECT token AS old, pg_temp.epoch() AS epoch FROM idempotency_records WHERE key = 'tk.busy';
SELECT results_eq($$SELECT outcome, token FROM idem_claim('tk.busy', '\x02', '1 hour')$$,
                  $$SELECT 'takeover', ((epoch + 1) << 16) + 1 FROM busy$$,
                  'the takeover of the last token of an epoch gets the first token of a new epoch');
SELECT is(pg_temp.epoch(), (SELECT epoch + 1 FROM busy), '... which it began');
SELECT ok((SELECT token > old FROM idempotency_records, busy WHERE key = 'tk.busy'), '... above the old token');
DELETE FROM idempotency_records WHERE key = 'tk.busy';
SELECT ok((SELECT token > (SELECT old FROM busy) + 1 FROM idem_claim('tk.busy', '\x02', '1 hour')),
          'after its deletion the key starts above every token it had');

-- a token of an older epoch is followed by the current epoch's first ----------------------------
SELECT outcome FROM idem_claim('tk.old', '\x03', '1 millisecond');
SELECT pg_sleep(0.01);
CREATE TEMP TABLE moved AS SELECT nextval('idem_token_epoch') AS epoch;
SELECT results_eq($$SELECT outcome, token FROM idem_claim('tk.old', '\x03', '1 hour')$$,
                  $$SELECT 'takeover', (epoch << 16) + 1 FROM moved$$,
                  'a takeover of a token of an older epoch gets the current epoch''s first token');
SELECT lives_ok($$SELECT idem_release('tk.old', (SELECT token FROM idempotency_records WHERE key = 'tk.old'))$$,
                'a release in the same epoch ...');
SELECT is((SELECT token FROM idempotency_records WHERE key = 'tk.old'), (SELECT (epoch << 16) + 2 FROM moved),
          '... moves the token on by one');

-- at the limit ---------------------------------------------------------------------------------
SELECT setval('idem_token_epoch', (2::numeric ^ 47 - 1)::bigint);
SELECT results_eq($$SELECT outcome, token FROM idem_claim('tk.last', '\x04', '1 millisecond')$$,
                  $$VALUES ('new', ((2::numeric ^ 47 - 1)::bigint << 16) + 1)$$,
                  'in the last epoch new keys are still claimed');
SELECT throws_ok($$DELETE FROM idempotency_records WHERE key = 'tk.last'$$, '2200H',
                 'the fencing tokens of idempotency records are used up',
                 'a deletion that needs a new epoch fails at the limit');
SELECT throws_ok($$SELECT idem_purge()$$, '2200H',
                 'the fencing tokens of idempotency records are used up', '... as does a purge');
UPDATE idempotency_records SET token = token + 65534 WHERE key = 'tk.last';
SELECT pg_sleep(0.01);
SELECT throws_ok($$SELECT idem_claim('tk.last', '\x04', '1 hour')$$, '2200H',
                 'the fencing tokens of idempotency records are used up',
                 'a takeover past the last token fails: no token repeats');
SELECT is((SELECT count(*) FROM idempotency_records WHERE key = 'tk.last'
             AND token = ((2::numeric ^ 47 - 1)::bigint << 16) + 65535), 1::bigint,
          '... and changes nothing');
SELECT is((SELECT count(*) FROM idempotency_records WHERE key = 'tk.last'), 1::bigint,
          'the refused deletion deleted nothing');

SELECT setval('idem_token_epoch', last_value, is_called) FROM saved_epoch;
SELECT * FROM finish();
ROLLBACK;
