--
-- The consumer inbox and idem_purge: the SQL surface and every error.
--
--   idem_inbox_accept(consumer, message_id, retention, wait) -> boolean
--   idem_inbox_accept_seq(consumer, stream, seq, accept_gap => false) -> new | duplicate | gap
--   idem_inbox_accept_seq(consumer, stream, major, minor, accept_gap => true)
--   idem_inbox_seq(major, minor) = major * 2^20 + minor
--   idem_inbox_watermark(consumer, stream)
--   idem_purge(batch_size => 10000, max_batches => NULL) -> rows deleted
--
-- Errors: 22004 a NULL where a value is required, 22023 an empty name, a
-- non-positive retention, a negative sequence number, a non-positive batch
-- size or batch count, 22001 a name longer than idempotency.max_key_length,
-- 22003 a (major, minor) pair out of range, 22008 a retention that ends past
-- the largest timestamp.  After each failing call the test shows that nothing
-- was written.  Expiry times are never printed: only whether a row is past
-- its expiry, or roughly how long it has left.
--

-- Errors are shown as "ERROR:  <SQLSTATE>: <message>" with DETAIL and HINT.
-- '1 day -25 hours' is negative on every day only where no day has 25
-- hours: pg_regress's PST8PDT has one a year
SET TimeZone = 'UTC';
\i sql/include/expect_error.sql

-- This test's consumers and record keys all start with 'ib-'.  "saved" holds
-- a copy of those rows; the view "unchanged" compares the tables with it.
DELETE FROM idem_inbox WHERE consumer LIKE 'ib-%';
DELETE FROM idem_inbox_streams WHERE consumer LIKE 'ib-%';
DELETE FROM idempotency_records WHERE key LIKE 'ib-%';
CREATE FUNCTION pg_temp.state() RETURNS TABLE (kind text, r text) LANGUAGE sql AS $$
    SELECT 'inbox', i::text FROM idem_inbox i WHERE consumer LIKE 'ib-%'
    UNION ALL
    SELECT 'stream', s::text FROM idem_inbox_streams s WHERE consumer LIKE 'ib-%'
    UNION ALL
    SELECT 'record', r::text FROM idempotency_records r WHERE key LIKE 'ib-%'
$$;
CREATE TEMP TABLE saved (kind text, r text);
CREATE FUNCTION pg_temp.save() RETURNS bigint LANGUAGE sql AS $$
    DELETE FROM saved;
    INSERT INTO saved SELECT * FROM pg_temp.state();
    SELECT count(*) FROM saved;
$$;
CREATE TEMP VIEW unchanged AS
SELECT (SELECT count(*) FROM pg_temp.state()) AS rows,
       NOT EXISTS (
           (SELECT * FROM pg_temp.state() EXCEPT ALL SELECT * FROM saved)
           UNION ALL
           (SELECT * FROM saved EXCEPT ALL SELECT * FROM pg_temp.state())
       ) AS unchanged;

-- How long a row has left: 'expired', 'under 1 min', or whole hours.
CREATE FUNCTION pg_temp.left(expires timestamptz) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN expires <= clock_timestamp() THEN 'expired'
                WHEN expires <= clock_timestamp() + interval '1 minute' THEN 'under 1 min'
                ELSE round(extract(epoch FROM expires - clock_timestamp()) / 3600) || ' h' END
$$;
\set inbox 'SELECT consumer, message_id, pg_temp.left(expires_at) AS left FROM idem_inbox WHERE consumer LIKE \'ib-%\' ORDER BY consumer, message_id'
\set streams 'SELECT consumer, stream, watermark FROM idem_inbox_streams WHERE consumer LIKE \'ib-%\' ORDER BY consumer, stream'

-- Expired rows other tests left behind would be counted by idem_purge below.
SELECT idem_purge() >= 0 AS earlier_expired_rows_purged;
SELECT setval('idem_token_epoch', 1, false) AS epoch_reset;  -- keep later tokens at 1

--
-- idem_inbox_accept(consumer, message_id, retention, wait)
--

-- true the first time, false for every duplicate; the default retention is
-- idempotency.retention (one day)
SELECT idem_inbox_accept('ib-a', 'm-1') AS accepted;
SELECT idem_inbox_accept('ib-a', 'm-1') AS accepted;
SELECT idem_inbox_accept('ib-a', 'm-1', '1 hour') AS accepted;
SELECT idem_inbox_accept('ib-a', 'm-1', wait => false) AS accepted;
:inbox;
-- a retention given, and the setting
SELECT idem_inbox_accept('ib-a', 'm-2', '1 hour') AS accepted;
SET idempotency.retention = '2h';
SELECT idem_inbox_accept('ib-a', 'm-3') AS accepted;
RESET idempotency.retention;
SELECT idem_inbox_accept('ib-a', 'm-4', '7 days', wait => false) AS accepted;
-- message ids compare bytes ("C" collation); consumers are separate namespaces
SELECT idem_inbox_accept('ib-a', 'M-1') AS accepted;
SELECT idem_inbox_accept('ib-b', 'm-1') AS accepted;
SELECT idem_inbox_accept('ib-b', 'm-1') AS accepted;
:inbox;

-- The purge worker runs beside the suite (test/run preloads the library)
-- and would delete the expired rows below before this test looks at them:
-- one transaction holds it off (its DELETE waits for the EXCLUSIVE lock and
-- then finds nothing left).  Expiry is checked with clock_timestamp(); an
-- expected error rolls back only its own statement (ON_ERROR_ROLLBACK).
\set ON_ERROR_ROLLBACK on
BEGIN;
LOCK TABLE idempotency_records, idem_inbox IN EXCLUSIVE MODE;
-- Past its retention a message counts as new again: the row is revived with
-- the new call's retention, and is a duplicate from then on.
SELECT idem_inbox_accept('ib-r', 'm-short', '500 ms') AS first,
       idem_inbox_accept('ib-r', 'm-short', '500 ms') AS at_once;
SELECT pg_sleep(0.6);
:inbox;
SELECT idem_inbox_accept('ib-r', 'm-short', '1 hour') AS after_retention;
SELECT idem_inbox_accept('ib-r', 'm-short', '1 hour') AS again;
:inbox;
-- a duplicate leaves the row exactly as it was (its expiry included)
SELECT pg_temp.save() AS saved;
SELECT idem_inbox_accept('ib-r', 'm-short', '7 days') AS accepted;
TABLE unchanged;

COMMIT;
\set ON_ERROR_ROLLBACK off

-- NULLs: consumer, message id and wait are required; retention takes the default
SELECT pg_temp.save() AS saved;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept(NULL, 'm-new')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept('ib-a', NULL)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept(NULL, NULL)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept('ib-a', 'm-new', '1 hour', wait => NULL)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept('ib-a', 'm-new', NULL, NULL)$$);
TABLE unchanged;
-- empty names
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept('', 'm-new')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept('ib-a', '')$$);
TABLE unchanged;
-- 255 bytes is the longest name (idempotency.max_key_length); the limit counts bytes
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept('ib-a', repeat('m', 256))$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept('ib-' || repeat('c', 253), 'm-new')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept('ib-a', repeat(chr(233), 128))$$);
TABLE unchanged;
SELECT idem_inbox_accept('ib-a', repeat('m', 255)) AS accepted;
SELECT idem_inbox_accept('ib-a', repeat(chr(233), 127) || 'm') AS accepted;
SELECT idem_inbox_accept('ib-' || repeat('c', 252), 'm-new') AS accepted;
SELECT octet_length(consumer) AS consumer_bytes, octet_length(message_id) AS id_bytes
FROM idem_inbox WHERE consumer LIKE 'ib-%' AND octet_length(consumer) + octet_length(message_id) > 200
ORDER BY 1, 2;
DELETE FROM idem_inbox WHERE consumer LIKE 'ib-%' AND octet_length(consumer) + octet_length(message_id) > 200;
-- a smaller limit
SET idempotency.max_key_length = 10;
SELECT pg_temp.save() AS saved;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept('ib-a', 'm-123456789')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept('ib-consumer', 'm-new')$$);
TABLE unchanged;
SELECT idem_inbox_accept('ib-a', 'm-12345678') AS accepted;
RESET idempotency.max_key_length;
-- retention must be positive
SELECT pg_temp.save() AS saved;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept('ib-a', 'm-new', '0')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept('ib-a', 'm-new', '-1 hour')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept('ib-a', 'm-new', '1 day -25 hours')$$);
TABLE unchanged;
-- an expiry past the largest timestamp
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept('ib-a', 'm-new', '1000000 years')$$);
TABLE unchanged;
-- the errors come before anything is looked at: also for a duplicate
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept('ib-a', 'm-1', '-1 hour')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept('ib-a', 'm-1', '1 hour', NULL)$$);
TABLE unchanged;

--
-- idem_inbox_accept_seq(consumer, stream, seq, accept_gap => false)
--

-- The first message of a stream starts it, at whatever number it has.
SELECT idem_inbox_accept_seq('ib-a', 'orders', 10) AS outcome;
SELECT idem_inbox_watermark('ib-a', 'orders') AS watermark;
-- the same number, and any smaller one: duplicate
SELECT idem_inbox_accept_seq('ib-a', 'orders', 10) AS outcome;
SELECT idem_inbox_accept_seq('ib-a', 'orders', 3) AS outcome;
SELECT idem_inbox_accept_seq('ib-a', 'orders', 0) AS outcome;
-- watermark + 1: new
SELECT idem_inbox_accept_seq('ib-a', 'orders', 11) AS outcome;
SELECT idem_inbox_watermark('ib-a', 'orders') AS watermark;
-- a jump is a gap; refused by default: the watermark stays, and the same
-- message is a gap again until the missing ones have arrived
SELECT idem_inbox_accept_seq('ib-a', 'orders', 14) AS outcome;
SELECT idem_inbox_watermark('ib-a', 'orders') AS watermark;
SELECT idem_inbox_accept_seq('ib-a', 'orders', 14, false) AS outcome;
SELECT idem_inbox_accept_seq('ib-a', 'orders', 12) AS outcome;
SELECT idem_inbox_accept_seq('ib-a', 'orders', 13) AS outcome;
SELECT idem_inbox_accept_seq('ib-a', 'orders', 14) AS outcome;
SELECT idem_inbox_watermark('ib-a', 'orders') AS watermark;
-- accept_gap => true: still reported as a gap, but the watermark moves, so the
-- skipped numbers are duplicates from now on
SELECT idem_inbox_accept_seq('ib-a', 'orders', 20, accept_gap => true) AS outcome;
SELECT idem_inbox_watermark('ib-a', 'orders') AS watermark;
SELECT idem_inbox_accept_seq('ib-a', 'orders', 17) AS outcome;
SELECT idem_inbox_accept_seq('ib-a', 'orders', 20, accept_gap => true) AS outcome;
SELECT idem_inbox_accept_seq('ib-a', 'orders', 21, accept_gap => true) AS outcome;
:streams;
-- seq 0 starts a stream at 0; 1 follows it
SELECT idem_inbox_accept_seq('ib-a', 'zero', 0) AS outcome;
SELECT idem_inbox_accept_seq('ib-a', 'zero', 0) AS outcome;
SELECT idem_inbox_accept_seq('ib-a', 'zero', 1) AS outcome;
SELECT idem_inbox_accept_seq('ib-a', 'zero', 1) AS outcome;
-- the largest bigint
SELECT idem_inbox_accept_seq('ib-a', 'max', 9223372036854775806) AS outcome;
SELECT idem_inbox_accept_seq('ib-a', 'max', 9223372036854775807) AS outcome;
SELECT idem_inbox_accept_seq('ib-a', 'max', 9223372036854775807) AS outcome;
-- streams are per consumer; the inbox's message table is not touched
SELECT idem_inbox_accept_seq('ib-b', 'orders', 1) AS outcome;
SELECT count(*) AS inbox_rows_named_like_streams FROM idem_inbox
WHERE consumer LIKE 'ib-%' AND message_id IN ('orders', 'zero', 'max');
:streams;

-- errors
SELECT pg_temp.save() AS saved;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_seq('ib-a', 'orders', -1)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_seq('ib-a', 'new stream', -1, true)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_seq('ib-a', 'orders', -9223372036854775808)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_seq(NULL, 'orders', 22)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_seq('ib-a', NULL, 22)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_seq('ib-a', 'orders', NULL::bigint)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_seq('ib-a', 'orders', 22, NULL::boolean)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_seq('', 'orders', 22)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_seq('ib-a', '', 22)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_seq('ib-a', repeat('s', 256), 22)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_seq('ib-' || repeat('c', 253), 'orders', 22)$$);
TABLE unchanged;
-- an untyped NULL fits both overloads
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_seq('ib-a', 'orders', 22, NULL)$$);
TABLE unchanged;
SELECT idem_inbox_accept_seq('ib-a', repeat('s', 255), 22) AS outcome;
DELETE FROM idem_inbox_streams WHERE consumer = 'ib-a' AND octet_length(stream) = 255;

--
-- idem_inbox_seq(major, minor) and the (major, minor) overload
--

SELECT idem_inbox_seq(0, 0) AS zero, idem_inbox_seq(0, 1) AS one, idem_inbox_seq(1, 0) AS two_20,
       idem_inbox_seq(5, 7) = 5 * 1048576 + 7 AS encoded,
       idem_inbox_seq(0, 1048575) AS max_minor,
       idem_inbox_seq(8796093022207, 1048575) AS max_both;
-- the order of pairs is the order of their numbers
SELECT bool_and(idem_inbox_seq(a.major, a.minor) < idem_inbox_seq(b.major, b.minor)) AS ordered
FROM (VALUES (0::bigint, 0), (0, 1), (0, 1048575), (1, 0), (1, 1), (100, 0), (8796093022207, 0))
     AS a(major, minor)
JOIN (VALUES (0::bigint, 0), (0, 1), (0, 1048575), (1, 0), (1, 1), (100, 0), (8796093022207, 0))
     AS b(major, minor)
  ON (a.major, a.minor) < (b.major, b.minor);
SELECT pg_temp.expect_error($$SELECT idem_inbox_seq(-1, 0)$$);
SELECT pg_temp.expect_error($$SELECT idem_inbox_seq(0, -1)$$);
SELECT pg_temp.expect_error($$SELECT idem_inbox_seq(8796093022208, 0)$$);
SELECT pg_temp.expect_error($$SELECT idem_inbox_seq(0, 1048576)$$);
SELECT pg_temp.expect_error($$SELECT idem_inbox_seq(NULL, 0)$$);
SELECT pg_temp.expect_error($$SELECT idem_inbox_seq(0, NULL)$$);

-- the overload: the first pair starts the stream; gaps are accepted by
-- default (log indexes of a block are not contiguous across blocks)
SELECT idem_inbox_accept_seq('ib-a', 'chain', 100, 0) AS outcome;
SELECT idem_inbox_watermark('ib-a', 'chain') = idem_inbox_seq(100, 0) AS watermark_is_100_0;
SELECT idem_inbox_accept_seq('ib-a', 'chain', 100, 0) AS outcome;
SELECT idem_inbox_accept_seq('ib-a', 'chain', 100, 1) AS outcome;
SELECT idem_inbox_accept_seq('ib-a', 'chain', 100, 5) AS outcome;
SELECT idem_inbox_watermark('ib-a', 'chain') = idem_inbox_seq(100, 5) AS watermark_is_100_5;
SELECT idem_inbox_accept_seq('ib-a', 'chain', 100, 3) AS outcome;
SELECT idem_inbox_accept_seq('ib-a', 'chain', 101, 0) AS outcome;
SELECT idem_inbox_accept_seq('ib-a', 'chain', 99, 1048575) AS outcome;
SELECT idem_inbox_accept_seq('ib-a', 'chain', 101, 1) AS outcome;
-- accept_gap => false: refused, the watermark stays
SELECT idem_inbox_accept_seq('ib-a', 'chain', 103, 0, accept_gap => false) AS outcome;
SELECT idem_inbox_watermark('ib-a', 'chain') = idem_inbox_seq(101, 1) AS watermark_is_101_1;
SELECT idem_inbox_accept_seq('ib-a', 'chain', 101, 2, false) AS outcome;
-- both overloads keep the same watermark
SELECT idem_inbox_accept_seq('ib-a', 'chain', idem_inbox_seq(101, 2)) AS outcome;
SELECT idem_inbox_accept_seq('ib-a', 'chain', idem_inbox_seq(101, 3)) AS outcome;
SELECT idem_inbox_accept_seq('ib-a', 'chain', 101, 4) AS outcome;
SELECT watermark, watermark = idem_inbox_seq(101, 4) AS is_101_4 FROM idem_inbox_streams
WHERE consumer = 'ib-a' AND stream = 'chain';
-- errors of the overload
SELECT pg_temp.save() AS saved;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_seq('ib-a', 'chain', -1, 0)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_seq('ib-a', 'chain', 102, 1048576)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_seq('ib-a', 'chain', 8796093022208, 0)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_seq('ib-a', 'chain', NULL::bigint, 0)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_seq('ib-a', 'chain', 102, NULL::integer)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_seq('ib-a', 'chain', 102, 0, NULL)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_seq(NULL, 'chain', 102, 0)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_seq('ib-a', '', 102, 0)$$);
TABLE unchanged;

--
-- idem_inbox_watermark(consumer, stream): NULL for a stream never seen
--
SELECT idem_inbox_watermark('ib-a', 'orders') AS orders,
       idem_inbox_watermark('ib-b', 'orders') AS orders_of_b,
       idem_inbox_watermark('ib-a', 'never') AS never,
       idem_inbox_watermark('ib-nobody', 'orders') AS nobody,
       idem_inbox_watermark('ib-a', 'ORDERS') AS upper_case,
       idem_inbox_watermark(NULL, 'orders') AS null_consumer,
       idem_inbox_watermark('ib-a', NULL) AS null_stream;

--
-- idem_purge(batch_size, max_batches)
--

-- errors
SELECT pg_temp.save() AS saved;
SELECT pg_temp.expect_error($$SELECT idem_purge(0)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_purge(-1)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_purge(NULL)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_purge(10, 0)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_purge(10, -1)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_purge(NULL, NULL)$$);
TABLE unchanged;

-- The purge worker runs beside the suite (test/run preloads the library)
-- and would delete the expired rows below before this test looks at them:
-- one transaction holds it off (its DELETE waits for the EXCLUSIVE lock and
-- then finds nothing left).  Expiry is checked with clock_timestamp(); an
-- expected error rolls back only its own statement (ON_ERROR_ROLLBACK).
\set ON_ERROR_ROLLBACK on
BEGIN;
LOCK TABLE idempotency_records, idem_inbox IN EXCLUSIVE MODE;
-- Rows to purge or keep, all with a short retention unless said otherwise:
--   ib-succeeded, ib-failed (final), ib-retryable (retryable failure): finished, purged
--   ib-kept: succeeded, retention 1 hour: kept
--   ib-processing (live lease), ib-abandoned (expired lease), ib-released
--   (released by its owner), ib-unknown: may stand for work with effects: kept
--   inbox: three expired messages of ib-p (purged), two retained ones (kept)
SELECT outcome, token FROM idem_claim('ib-succeeded', '\x01', '1 hour', retention => '100 ms');
SELECT idem_complete('ib-succeeded', 1, '{"ok": true}');
SELECT outcome, token FROM idem_claim('ib-failed', '\x01', '1 hour', retention => '100 ms');
SELECT idem_fail('ib-failed', 1, '{"e": "declined"}', false);
SELECT outcome, token FROM idem_claim('ib-retryable', '\x01', '1 hour', retention => '100 ms');
SELECT idem_fail('ib-retryable', 1, '{"e": "timeout"}', true);
SELECT outcome, token FROM idem_claim('ib-kept', '\x01', '1 hour', retention => '1 hour');
SELECT idem_complete('ib-kept', 1, '{"ok": true}');
SELECT outcome, token FROM idem_claim('ib-processing', '\x01', '1 hour', retention => '100 ms');
SELECT outcome, token FROM idem_claim('ib-abandoned', '\x01', '100 ms', retention => '100 ms');
SELECT outcome, token FROM idem_claim('ib-released', '\x01', '1 hour', retention => '100 ms');
SELECT idem_release('ib-released', 1);
SELECT outcome, token FROM idem_claim('ib-unknown', '\x01', '1 hour', retention => '100 ms');
SELECT idem_mark_unknown('ib-unknown', 1, '{"gateway": "timeout"}');
SELECT idem_inbox_accept('ib-p', 'old-' || i, '100 ms') AS accepted FROM generate_series(1, 3) i;
SELECT idem_inbox_accept('ib-p', 'new-' || i, '1 hour') AS accepted FROM generate_series(1, 2) i;
SELECT pg_sleep(0.3);
SELECT key, status, pg_temp.left(expires_at) AS left FROM idempotency_records
WHERE key LIKE 'ib-%' ORDER BY key;
:inbox;
SELECT count(*) AS streams FROM idem_inbox_streams WHERE consumer LIKE 'ib-%';

-- The purge returns how many rows went: three records and three messages
SELECT idem_purge() AS purged;
SELECT setval('idem_token_epoch', 1, false) AS epoch_reset;  -- keep later tokens at 1
SELECT key, status, pg_temp.left(expires_at) AS left FROM idempotency_records
WHERE key LIKE 'ib-%' ORDER BY key;
:inbox;
-- watermarks are never purged
SELECT count(*) AS streams FROM idem_inbox_streams WHERE consumer LIKE 'ib-%';
-- nothing left to purge
SELECT idem_purge() AS purged;
SELECT setval('idem_token_epoch', 1, false) AS epoch_reset;  -- keep later tokens at 1
SELECT idem_purge(1, 1) AS purged;
SELECT setval('idem_token_epoch', 1, false) AS epoch_reset;  -- keep later tokens at 1

-- batch_size 1 without max_batches goes on until nothing is left:
-- three messages and three records, expired
DO $$
BEGIN
    FOR i IN 1..3 LOOP
        PERFORM idem_inbox_accept('ib-q', 'm-' || i, '100 ms');
        PERFORM idem_claim('ib-batch-' || i, '\x01', '1 hour', retention => '100 ms');
        PERFORM idem_complete('ib-batch-' || i, 1);
    END LOOP;
END
$$;
SELECT (SELECT count(*) FROM idem_inbox WHERE consumer = 'ib-q') AS messages,
       (SELECT count(*) FROM idempotency_records WHERE key LIKE 'ib-batch-%') AS records;
SELECT pg_sleep(0.3);
SELECT idem_purge(1) AS purged;
SELECT setval('idem_token_epoch', 1, false) AS epoch_reset;  -- keep later tokens at 1
SELECT (SELECT count(*) FROM idem_inbox WHERE consumer = 'ib-q') AS messages,
       (SELECT count(*) FROM idempotency_records WHERE key LIKE 'ib-batch-%') AS records;

-- max_batches bounds the number of batches per table: five expired finished
-- records and five expired messages
DO $$
BEGIN
    FOR i IN 1..5 LOOP
        PERFORM idem_claim('ib-m' || i, '\x01', '1 hour', retention => '100 ms');
        PERFORM idem_complete('ib-m' || i, 1);
        PERFORM idem_inbox_accept('ib-m', 'm-' || i, '100 ms');
    END LOOP;
END
$$;
SELECT pg_sleep(0.3);
\set remaining 'SELECT (SELECT count(*) FROM idempotency_records WHERE key LIKE \'ib-m%\') AS records, (SELECT count(*) FROM idem_inbox WHERE consumer = \'ib-m\') AS messages'
SELECT idem_purge(2, 1) AS purged;
SELECT setval('idem_token_epoch', 1, false) AS epoch_reset;  -- keep later tokens at 1
:remaining;
SELECT idem_purge(1, 2) AS purged;
SELECT setval('idem_token_epoch', 1, false) AS epoch_reset;  -- keep later tokens at 1
:remaining;
SELECT idem_purge(2, 1) AS purged;
SELECT setval('idem_token_epoch', 1, false) AS epoch_reset;  -- keep later tokens at 1
:remaining;
SELECT idem_purge(2, 1) AS purged;
SELECT setval('idem_token_epoch', 1, false) AS epoch_reset;  -- keep later tokens at 1

-- A purged record is absent: the next claim of its key is new, with token 1.
SELECT outcome, token, status, attempts, result FROM idem_claim('ib-succeeded', '\x02', '1 hour');
-- A purged message is new.
SELECT idem_inbox_accept('ib-p', 'old-1') AS accepted;

COMMIT;
\set ON_ERROR_ROLLBACK off

-- clean up
DELETE FROM idem_inbox WHERE consumer LIKE 'ib-%';
DELETE FROM idem_inbox_streams WHERE consumer LIKE 'ib-%';
DELETE FROM idempotency_records WHERE key LIKE 'ib-%';
-- purges bumped the token epoch; later tests expect fresh keys at token 1
SELECT setval('idem_token_epoch', 1, false);
