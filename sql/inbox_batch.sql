--
-- The batch inbox: the SQL surface and every error.
--
--   idem_inbox_accept_many(consumer, message_ids[], retention, wait) -> SETOF text
--   idem_inbox_accept_seq_many(consumer, stream, seqs[], accept_gap => false)
--       -> TABLE (seq, outcome)
--
-- The ids new to the consumer, each once, in the order of their first
-- appearance in the array.  The errors are those of idem_inbox_accept for
-- each element (22004 a NULL, 22023 an empty id, 22001 one longer than
-- idempotency.max_key_length) and for the other arguments, and 22023 an
-- array of more than one dimension.  The sequence numbers' outcomes are
-- those of idem_inbox_accept_seq called for each in array order; 22004 a
-- NULL, 22023 a negative number.  A bad element refuses the whole batch:
-- after each failing call the test shows that nothing was written.
--

-- Errors are shown as "ERROR:  <SQLSTATE>: <message>" with DETAIL and HINT.
\i sql/include/expect_error.sql

-- This test's consumers all start with 'ibb-'.  "saved" holds a copy of
-- their rows; the view "unchanged" compares the table with it.
DELETE FROM idem_inbox WHERE consumer LIKE 'ibb-%';
DELETE FROM idem_inbox_streams WHERE consumer LIKE 'ibb-%';
CREATE FUNCTION pg_temp.state() RETURNS TABLE (r text) LANGUAGE sql AS $$
    SELECT i::text FROM idem_inbox i WHERE consumer LIKE 'ibb-%'
    UNION ALL
    SELECT s::text FROM idem_inbox_streams s WHERE consumer LIKE 'ibb-%'
$$;
CREATE TEMP TABLE saved (r text);
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
\set inbox 'SELECT consumer, message_id, pg_temp.left(expires_at) AS left FROM idem_inbox WHERE consumer LIKE \'ibb-%\' ORDER BY consumer, message_id'

-- new ids, each once, in the order they first appear; the default
-- retention is idempotency.retention (one day)
SELECT * FROM idem_inbox_accept_many('ibb-a', ARRAY['m-3', 'm-1', 'm-3', 'm-2', 'm-1']) AS new_id;
-- again: all duplicates; then a mix, old ids and new
SELECT * FROM idem_inbox_accept_many('ibb-a', ARRAY['m-1', 'm-2', 'm-3']) AS new_id;
SELECT * FROM idem_inbox_accept_many('ibb-a', ARRAY['m-5', 'm-2', 'm-4', 'm-5'], '2 hours') AS new_id;
-- what a single accept wrote is a duplicate for the batch, and the other way
SELECT idem_inbox_accept('ibb-a', 'm-6') AS single_accepted;
SELECT * FROM idem_inbox_accept_many('ibb-a', ARRAY['m-6', 'm-7']) AS new_id;
SELECT idem_inbox_accept('ibb-a', 'm-7') AS single_accepted;
-- ids compare bytes ("C" collation); consumers are separate namespaces
SELECT * FROM idem_inbox_accept_many('ibb-a', ARRAY['M-1', 'm-1 ', 'm-1']) AS new_id;
SELECT * FROM idem_inbox_accept_many('ibb-b', ARRAY['m-1']) AS new_id;
-- wait => false answers the same when no other transaction holds an id
SELECT * FROM idem_inbox_accept_many('ibb-b', ARRAY['m-1', 'm-2'], wait => false) AS new_id;
-- in a select list, and counted; an empty array accepts nothing
SELECT idem_inbox_accept_many('ibb-c', ARRAY['x', 'y']) AS new_id;
SELECT count(*) AS accepted FROM idem_inbox_accept_many('ibb-c', ARRAY['x', 'y', 'z']);
SELECT count(*) AS accepted FROM idem_inbox_accept_many('ibb-c', '{}');
-- an array with other bounds
SELECT * FROM idem_inbox_accept_many('ibb-c', '[5:6]={w,x}'::text[]) AS new_id;
:inbox;

-- Past its retention a message counts as new again (its row is revived with
-- the new call's retention).  The purge worker runs beside the suite and
-- would delete the expired row first: one transaction holds it off.
\set ON_ERROR_ROLLBACK on
BEGIN;
LOCK TABLE idem_inbox IN EXCLUSIVE MODE;
SELECT * FROM idem_inbox_accept_many('ibb-r', ARRAY['short', 'long'], '500 ms') AS new_id;
SELECT pg_sleep(0.6);
SELECT * FROM idem_inbox_accept_many('ibb-r', ARRAY['long', 'short', 'other'], '1 hour') AS new_id;
SELECT * FROM idem_inbox_accept_many('ibb-r', ARRAY['long', 'short', 'other'], '1 hour') AS new_id;
SELECT consumer, message_id, pg_temp.left(expires_at) AS left FROM idem_inbox
WHERE consumer = 'ibb-r' ORDER BY message_id;
-- a duplicate leaves its row exactly as it was (its expiry included)
SELECT pg_temp.save() AS saved;
SELECT count(*) AS accepted FROM idem_inbox_accept_many('ibb-r', ARRAY['long', 'short'], '7 days');
TABLE unchanged;
COMMIT;
\set ON_ERROR_ROLLBACK off

-- A large batch, with every id twice and a thousand already there.
SELECT count(*) AS accepted
FROM idem_inbox_accept_many('ibb-l', ARRAY(SELECT 'id-' || g FROM generate_series(1, 1000) g));
SELECT count(*) AS accepted, count(DISTINCT id) AS distinct_ids,
       min(id) AS first, max(id) AS last
FROM idem_inbox_accept_many('ibb-l', ARRAY(SELECT 'id-' || (g % 5000) FROM generate_series(10000, 0, -1) g)) id;
SELECT count(*) AS rows FROM idem_inbox WHERE consumer = 'ibb-l';

--
-- Errors: nothing is written, the good elements before a bad one included.
--
SELECT pg_temp.save() AS saved;
-- NULLs: consumer, the array, an element and wait; retention takes the default
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_many(NULL, ARRAY['new-1'])$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_many('ibb-a', NULL)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_many('ibb-a', ARRAY['new-1', NULL, 'new-2'])$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_many('ibb-a', '[0:1]={new-1,NULL}')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_many('ibb-a', ARRAY['new-1'], '1 hour', wait => NULL)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_many('ibb-a', ARRAY[NULL]::text[], NULL, NULL)$$);
TABLE unchanged;
-- empty names
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_many('', ARRAY['new-1'])$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_many('ibb-a', ARRAY['new-1', ''])$$);
TABLE unchanged;
-- 255 bytes is the longest name (idempotency.max_key_length); the limit counts bytes
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_many('ibb-a', ARRAY['new-1', repeat('m', 256)])$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_many('ibb-a', ARRAY[repeat(chr(233), 128)])$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_many('ibb-' || repeat('c', 253), ARRAY['new-1'])$$);
TABLE unchanged;
SELECT count(*) AS accepted FROM idem_inbox_accept_many('ibb-a', ARRAY[repeat('m', 255), repeat(chr(233), 127) || 'm']);
DELETE FROM idem_inbox WHERE consumer = 'ibb-a' AND octet_length(message_id) = 255;
SELECT pg_temp.save() AS saved;
-- a smaller limit
SET idempotency.max_key_length = 10;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_many('ibb-a', ARRAY['m-1', 'm-123456789'])$$);
TABLE unchanged;
RESET idempotency.max_key_length;
-- more than one dimension
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_many('ibb-a', ARRAY[['new-1', 'new-2'], ['new-3', 'new-4']])$$);
TABLE unchanged;
-- retention must be positive, and end before the largest timestamp
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_many('ibb-a', ARRAY['new-1'], '0')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_many('ibb-a', ARRAY['new-1'], '-1 hour')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_many('ibb-a', ARRAY['new-1'], '1000000 years')$$);
TABLE unchanged;
-- the checks come before anything is looked at: also for an empty array,
-- and for ids that are all duplicates
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_many('ibb-a', '{}', '-1 hour')$$);
SELECT pg_temp.expect_error($$SELECT idem_inbox_accept_many('ibb-a', ARRAY['m-1'], '1 hour', NULL)$$);
TABLE unchanged;

--
-- idem_inbox_accept_seq_many(consumer, stream, seqs, accept_gap => false)
--

-- The first number of a new stream starts it; then each number as
-- idem_inbox_accept_seq would answer it, in array order.
SELECT * FROM idem_inbox_accept_seq_many('ibb-a', 'orders', ARRAY[10, 11, 11, 9, 13, 12, 13, 15]);
SELECT idem_inbox_watermark('ibb-a', 'orders') AS watermark;
-- the same with accept_gap => true: a gap moves the watermark
SELECT * FROM idem_inbox_accept_seq_many('ibb-a', 'orders', ARRAY[14, 20, 16, 21], accept_gap => true);
SELECT idem_inbox_watermark('ibb-a', 'orders') AS watermark;
-- the single accept agrees
SELECT idem_inbox_accept_seq('ibb-a', 'orders', 21) AS single, idem_inbox_accept_seq('ibb-a', 'orders', 22) AS next;
SELECT * FROM idem_inbox_accept_seq_many('ibb-a', 'orders', ARRAY[22, 23]);
-- all duplicates, or a refused gap: the watermark row is not written
SELECT pg_temp.save() AS saved;
SELECT * FROM idem_inbox_accept_seq_many('ibb-a', 'orders', ARRAY[1, 23, 25]);
TABLE unchanged;
-- seq 0 starts a stream at 0; an empty array answers nothing and starts none
SELECT * FROM idem_inbox_accept_seq_many('ibb-a', 'zero', ARRAY[0, 0, 1]);
SELECT count(*) AS outcomes FROM idem_inbox_accept_seq_many('ibb-a', 'none', '{}');
SELECT idem_inbox_watermark('ibb-a', 'none') AS watermark;
-- an array with other bounds; streams of a consumer and consumers are separate
SELECT * FROM idem_inbox_accept_seq_many('ibb-b', 'orders', '[3:4]={7,8}'::bigint[]);
SELECT consumer, stream, watermark FROM idem_inbox_streams WHERE consumer LIKE 'ibb-%' ORDER BY 1, 2;

-- Errors: nothing is written.
SELECT pg_temp.save() AS saved;
SELECT pg_temp.expect_error($$SELECT * FROM idem_inbox_accept_seq_many(NULL, 'orders', ARRAY[30])$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT * FROM idem_inbox_accept_seq_many('ibb-a', NULL, ARRAY[30])$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT * FROM idem_inbox_accept_seq_many('ibb-a', 'orders', NULL)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT * FROM idem_inbox_accept_seq_many('ibb-a', 'orders', ARRAY[30, NULL])$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT * FROM idem_inbox_accept_seq_many('ibb-a', 'orders', ARRAY[30], NULL)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT * FROM idem_inbox_accept_seq_many('ibb-a', 'orders', ARRAY[30, -1])$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT * FROM idem_inbox_accept_seq_many('', 'orders', ARRAY[30])$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT * FROM idem_inbox_accept_seq_many('ibb-a', '', ARRAY[30])$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT * FROM idem_inbox_accept_seq_many('ibb-a', repeat('s', 256), ARRAY[30])$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT * FROM idem_inbox_accept_seq_many('ibb-a', 'orders', ARRAY[[30, 31], [32, 33]])$$);
TABLE unchanged;

-- The functions are not for PUBLIC.
SELECT has_function_privilege('public', 'idem_inbox_accept_many(text, text[], interval, boolean)',
                              'EXECUTE') AS public_may_execute;
SELECT has_function_privilege('public', 'idem_inbox_accept_seq_many(text, text, bigint[], boolean)',
                              'EXECUTE') AS public_may_execute_seq;

DELETE FROM idem_inbox WHERE consumer LIKE 'ibb-%';
DELETE FROM idem_inbox_streams WHERE consumer LIKE 'ibb-%';
