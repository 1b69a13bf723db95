-- The batch inbox (idem_inbox_accept_many), as an application uses it: the
-- de-dup rows of a batch commit or roll back with the business change;
-- the batch answers as the single accept would for each distinct id, in the
-- order of their first appearance, and counts each id once; expired
-- messages are new again, purged ones too; tenant isolation binds it like
-- the single accept; the kind consumer may call it, others get 42501.
-- The batch of sequence numbers (idem_inbox_accept_seq_many) answers as
-- single accepts in array order would.
-- Consumers are prefixed "ib.", "tA" and "tB", roles regress_idem_ibatch_*;
-- all of it is rolled back.
BEGIN;
SELECT plan(45);

-- Expired rows committed by others would be counted by the purges below.
SELECT ok(idem_purge() >= 0, 'expired rows left by others are purged first (rolled back at the end)');

-- The business table the inbox guards, and a handler that processes a batch
-- of deliveries once: accept the batch, then the business change for the new
-- ones only, in the same transaction.
CREATE TEMP TABLE orders (message_id text PRIMARY KEY, amount integer NOT NULL CHECK (amount > 0));
CREATE FUNCTION pg_temp.handle(consumer text, ids text[], amount integer) RETURNS bigint
LANGUAGE sql AS $$
    WITH new AS (SELECT * FROM idem_inbox_accept_many(consumer, ids) AS id),
         ordered AS (INSERT INTO orders SELECT id, amount FROM new RETURNING 1)
    SELECT count(*) FROM ordered
$$;

-- the de-dup rows commit and roll back with the business change ------------------------------
SAVEPOINT delivery;
SELECT is(pg_temp.handle('ib.shop', '{m-1,m-2,m-1}', 10), 2::bigint, 'a batch of m-1, m-2, m-1: two orders');
ROLLBACK TO SAVEPOINT delivery;
SELECT is((SELECT count(*) FROM idem_inbox WHERE consumer = 'ib.shop'), 0::bigint,
          'rolling back the business transaction removes the batch''s de-dup rows too');
SELECT is(pg_temp.handle('ib.shop', '{m-2,m-1}', 10), 2::bigint, 'so the redelivery is processed again, as new');
RELEASE SAVEPOINT delivery;
SELECT is(pg_temp.handle('ib.shop', '{m-1,m-3,m-2}', 10), 1::bigint, 'the next batch: only m-3 is new');
SELECT throws_ok($$SELECT pg_temp.handle('ib.shop', '{m-4,m-5}', 0)$$, '23514', NULL,
                 'the handler fails after accepting m-4 and m-5 (CHECK violation)');
SELECT is((SELECT count(*) FROM idem_inbox WHERE consumer = 'ib.shop' AND message_id IN ('m-4', 'm-5')), 0::bigint,
          'the failed handler left no de-dup row');
SELECT is(pg_temp.handle('ib.shop', '{m-5,m-4}', 20), 2::bigint, 'the redelivery of m-4 and m-5 is processed');
SELECT results_eq($$SELECT message_id COLLATE "default" FROM orders ORDER BY 1$$,
                  $$VALUES ('m-1'), ('m-2'), ('m-3'), ('m-4'), ('m-5')$$, 'each message was ordered exactly once');

-- the same answers as single accepts, in order of first appearance ------------------------------
-- 300 deliveries of 100 ids, 40 of them accepted earlier (by a single accept)
CREATE TEMP TABLE deliveries AS
SELECT g AS n, 'd-' || ((g * 37) % 100) AS id FROM generate_series(1, 300) g;
SELECT is((SELECT count(*) FILTER (WHERE idem_inbox_accept('ib.cmp', 'd-' || g)) FROM generate_series(0, 99) g
           WHERE g % 5 IN (0, 1)), 40::bigint, 'single accepts take 40 of the 100 ids');
CREATE TEMP TABLE batch_answer AS
SELECT row_number() OVER () AS n, id
FROM idem_inbox_accept_many('ib.cmp', (SELECT array_agg(id ORDER BY n) FROM deliveries)) AS id;
SELECT results_eq(
    $$SELECT id FROM batch_answer ORDER BY n$$,
    $$SELECT id FROM deliveries d
      WHERE NOT EXISTS (SELECT FROM deliveries e WHERE e.id = d.id AND e.n < d.n)
        AND substr(d.id, 3)::int % 5 NOT IN (0, 1)
      ORDER BY n$$,
    'the batch returns the ids no single accept had taken, each once, in the order they first appear');
SELECT is((SELECT count(*) FROM idem_inbox WHERE consumer = 'ib.cmp'), 100::bigint, 'and the consumer has the 100 ids');
SELECT is_empty($$SELECT d.id FROM deliveries d WHERE idem_inbox_accept('ib.cmp', d.id)$$,
                'every id of the batch is a duplicate for the single accept afterwards');
SELECT is((SELECT count(*) FROM idem_inbox_accept_many('ib.cmp', (SELECT array_agg(id) FROM deliveries))), 0::bigint,
          'and for the batch');
-- a message accepted earlier in the same transaction, by either form
SELECT results_eq($$SELECT idem_inbox_accept('ib.once', 'x'),
                          (SELECT count(*) FROM idem_inbox_accept_many('ib.once', '{x,y}')),
                          idem_inbox_accept('ib.once', 'y')$$,
                  $$VALUES (true, 1::bigint, false)$$, 'single and batch accepts of one transaction see each other');

-- counters: each distinct id once --------------------------------------------------------------
-- (the SQL edition has no counters: the accepts run, their count is skipped)
SELECT NOT EXISTS (SELECT FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
                   WHERE p.proname = 'idem_claim' AND l.lanname = 'c'
                     AND p.pronamespace = (SELECT extnamespace FROM pg_extension WHERE extname = 'idempotency'))
       AS sql_edition \gset
\if :sql_edition
\else
CREATE TEMP TABLE stats_before AS SELECT counter, value FROM idem_stats();
\endif
SELECT is((SELECT count(*) FROM idem_inbox_accept_many('ib.count', '{a,b,a,c,b,a}')), 3::bigint, 'three new ids');
SELECT is((SELECT count(*) FROM idem_inbox_accept_many('ib.count', '{a,b,d,d}')), 1::bigint, 'then one new, two duplicates');
\if :sql_edition
SELECT skip('idem_stats raises 55000 in the SQL edition: no counters without the C library (README, "What needs the C library")', 1);
\else
SELECT results_eq(
    $$SELECT s.counter COLLATE "default", s.value - b.value FROM idem_stats() s JOIN stats_before b USING (counter)
      WHERE s.counter IN ('inbox_accepted', 'inbox_duplicates') ORDER BY 1$$,
    $$VALUES ('inbox_accepted', 4::bigint), ('inbox_duplicates', 2::bigint)$$,
    'idem_stats counts 4 accepted and 2 duplicates: an id repeated inside a batch counts once');
\endif

-- retention: expired ids are new again; purged ones too --------------------------------------------
SELECT is((SELECT count(*) FROM idem_inbox_accept_many('ib.ret', '{e-1,e-2,e-3}', '1 hour')), 3::bigint, 'three ids for an hour');
UPDATE idem_inbox SET expires_at = now() - interval '1 second' WHERE consumer = 'ib.ret' AND message_id <> 'e-3';
SELECT results_eq($$SELECT id COLLATE "default" FROM idem_inbox_accept_many('ib.ret', '{e-3,e-2,e-1}', '2 hours') id$$,
                  $$VALUES ('e-2'), ('e-1')$$, 'past their retention e-1 and e-2 are new again; e-3 is not');
SELECT ok((SELECT bool_and(expires_at > now() + interval '1 hour') FROM idem_inbox
           WHERE consumer = 'ib.ret' AND message_id IN ('e-1', 'e-2')),
          'their rows were revived with the new retention');
UPDATE idem_inbox SET expires_at = now() - interval '1 second' WHERE consumer = 'ib.ret';
SELECT is(idem_purge(), 3::bigint, 'idem_purge removes the three expired messages');
SELECT is((SELECT count(*) FROM idem_inbox_accept_many('ib.ret', '{e-1,e-2,e-3,e-3}')), 3::bigint,
          'and the batch accepts them again, as new');

-- sequence numbers: the outcomes of single accepts in array order ---------------------------------
-- 200 numbers around a watermark, repeated and out of order, with and
-- without accept_gap: a batch on one stream, single accepts on another
CREATE TEMP TABLE seqs AS
SELECT g::bigint AS n, ((g * 7919) % 23 + g / 4)::bigint AS seq FROM generate_series(1, 200) g;
CREATE TEMP TABLE seq_batch AS
SELECT row_number() OVER () AS n, seq, outcome
FROM idem_inbox_accept_seq_many('ib.seq', 'batch', (SELECT array_agg(seq ORDER BY n) FROM seqs));
CREATE TEMP TABLE seq_single AS
SELECT n, seq, idem_inbox_accept_seq('ib.seq', 'single', seq) AS outcome FROM seqs ORDER BY n;
SELECT results_eq($$SELECT n, seq, outcome FROM seq_batch ORDER BY n$$,
                  $$SELECT n, seq, outcome FROM seq_single ORDER BY n$$,
                  'the batch answers each number as single accepts in the same order do (accept_gap => false)');
SELECT is(idem_inbox_watermark('ib.seq', 'batch'), idem_inbox_watermark('ib.seq', 'single'),
          'and leaves the same watermark');
SELECT results_eq(
    $$SELECT o.outcome FROM idem_inbox_accept_seq_many('ib.seq', 'gaps', (SELECT array_agg(seq ORDER BY n) FROM seqs),
                                                        accept_gap => true) o$$,
    $$SELECT idem_inbox_accept_seq('ib.seq', 'gaps1', seq, accept_gap => true) FROM seqs ORDER BY n$$,
    'and with accept_gap => true');
SELECT ok((SELECT count(DISTINCT outcome) = 3 FROM seq_batch), 'the numbers had every outcome: new, duplicate and gap');
SAVEPOINT seq;
SELECT is((SELECT count(*) FROM idem_inbox_accept_seq_many('ib.seq', 'batch', ARRAY[1000, 1001], true)
           WHERE outcome <> 'duplicate'), 2::bigint, 'a batch moves the watermark to 1001');
ROLLBACK TO SAVEPOINT seq;
SELECT is(idem_inbox_watermark('ib.seq', 'batch'), idem_inbox_watermark('ib.seq', 'single'),
          'rolled back: the watermark is the one before');
RELEASE SAVEPOINT seq;

-- privileges -----------------------------------------------------------------------------------
CREATE ROLE regress_idem_ibatch_consumer;
CREATE ROLE regress_idem_ibatch_client;
SELECT idem_grant('consumer', 'regress_idem_ibatch_consumer'), idem_grant('client', 'regress_idem_ibatch_client');
SET LOCAL ROLE regress_idem_ibatch_consumer;
SELECT results_eq($$SELECT id COLLATE "default" FROM idem_inbox_accept_many('ib.role', '{r-2,r-1,r-2}') id$$,
                  $$VALUES ('r-2'), ('r-1')$$, 'the kind consumer accepts a batch');
SELECT is((SELECT count(*) FROM idem_inbox_accept_many('ib.role', '{r-1}', wait => false)), 0::bigint,
          'and with wait => false');
SELECT results_eq($$SELECT outcome FROM idem_inbox_accept_seq_many('ib.role', 's', '{1,2,2}')$$,
                  $$VALUES ('new'), ('new'), ('duplicate')$$, 'and a batch of sequence numbers');
RESET ROLE;
SET LOCAL ROLE regress_idem_ibatch_client;
SELECT throws_ok($$SELECT * FROM idem_inbox_accept_many('ib.role', '{r-3}')$$, '42501', NULL,
                 'the kind client may not');
SELECT throws_ok($$SELECT * FROM idem_inbox_accept_seq_many('ib.role', 's', '{3}')$$, '42501', NULL,
                 'neither form');
RESET ROLE;

-- tenant isolation -------------------------------------------------------------------------------
CREATE ROLE regress_idem_ibatch_ta;
SELECT idem_grant('consumer', 'regress_idem_ibatch_ta');
SELECT ok(idem_inbox_accept('tB/orders', 'b-1'), 'B''s message b-1, before isolation');
SELECT is(idem_inbox_accept_seq('tB/orders', 's', 4), 'new', 'and B''s stream s at 4');
SELECT lives_ok($$SELECT idem_tenant_isolation()$$, 'tenant isolation on');
SET LOCAL ROLE regress_idem_ibatch_ta;
SET LOCAL idempotency.scope = 'tA';
SELECT results_eq($$SELECT id COLLATE "default" FROM idem_inbox_accept_many('tA/orders', '{a-1,a-2}') id$$,
                  $$VALUES ('a-1'), ('a-2')$$, 'tenant A accepts a batch as "tA/orders"');
SELECT is((SELECT count(*) FROM idem_inbox_accept_many('tA/orders', '{a-2,a-3}', wait => false)), 1::bigint,
          'and with wait => false');
SELECT throws_ok($$SELECT * FROM idem_inbox_accept_many('tB/orders', '{b-1,b-2}')$$, '42501',
                 'new row violates row-level security policy for table "idem_inbox"',
                 'A cannot accept a batch as B''s consumer, so it cannot learn that b-1 is a duplicate for B');
SELECT throws_ok($$SELECT * FROM idem_inbox_accept_many('tB/orders', '{b-1}', wait => false)$$, '42501', NULL,
                 'nor with wait => false');
SELECT throws_ok($$SELECT * FROM idem_inbox_accept_many('tAB', '{a-1}')$$, '42501', NULL,
                 'nor as "tAB": a consumer belongs to tA only as "tA" or "tA/..."');
SELECT results_eq($$SELECT outcome FROM idem_inbox_accept_seq_many('tA/orders', 's', '{5,6}')$$,
                  $$VALUES ('new'), ('new')$$, 'A accepts a batch of sequence numbers as "tA/orders"');
SELECT throws_ok($$SELECT * FROM idem_inbox_accept_seq_many('tB/orders', 's', '{5,6}')$$, '42501',
                 'new row violates row-level security policy for table "idem_inbox_streams"',
                 'but not of B''s stream');
RESET ROLE;
-- isolation off, so that the test's own role sees every tenant's rows (it
-- binds every role but a superuser or BYPASSRLS, the tables' owner too)
SELECT idem_tenant_isolation(false);
SELECT results_eq($$SELECT consumer COLLATE "default", count(*) FROM idem_inbox WHERE consumer LIKE 't%' GROUP BY 1 ORDER BY 1$$,
                  $$VALUES ('tA/orders', 3::bigint), ('tB/orders', 1::bigint)$$,
                  'the refused batches wrote nothing');

SELECT * FROM finish();
ROLLBACK;
