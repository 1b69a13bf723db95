-- The locks of emits (src/outbox.c): one transaction-level lock per
-- (scope, topic, key), an advisory lock of class 7457, so that per key the
-- order of seq is the order of commits; a transaction whose first emit is a
-- batch of more than 256 keys locks every key at once instead.  In a file of
-- its own because that depends on what the transaction emitted before.
-- Everything is rolled back.
BEGIN;
SELECT plan(8);

-- the emits' lock on a key: one per (scope, topic, key), held to the end of
-- the transaction, in a class of its own beside pg_advisory_lock's
DELETE FROM idem_outbox;
CREATE TEMP TABLE locks_before AS
SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 7457 AND pid = pg_backend_pid();
SAVEPOINT locks;
SELECT idem_outbox_emit('lock', 'k', '{}'), idem_outbox_emit('lock', 'k', '{}'),
       idem_outbox_emit('lock', 'k', '{}', scope => 'other'),
       idem_outbox_emit_batch('lock', '{a,b,a,k}', '{1,2,3,4}');
SELECT is((SELECT count(*) FROM pg_locks
           WHERE locktype = 'advisory' AND objsubid = 7457 AND pid = pg_backend_pid()
             AND mode = 'ExclusiveLock' AND granted) - (SELECT n FROM locks_before),
          4::bigint, 'emits hold one lock per key: (lock, k), (other, lock, k), (lock, a), (lock, b)');
ROLLBACK TO SAVEPOINT locks;
SELECT is((SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 7457 AND pid = pg_backend_pid())
          - (SELECT n FROM locks_before),
          0::bigint, 'a rolled-back subtransaction releases them');

-- a transaction's first emit, a batch of more than 256 keys, locks every
-- key at once: a bulk emit does not fill the shared lock table
SAVEPOINT many;
SELECT cardinality(idem_outbox_emit_batch('bulk', array_agg('k' || g), array_agg('{}'::jsonb)))
FROM generate_series(1, 20000) g;
SELECT is((SELECT count(*) FROM pg_locks
           WHERE locktype = 'advisory' AND objsubid = 7457 AND pid = pg_backend_pid()
             AND mode = 'ExclusiveLock' AND (classid, objid) = (0, 0)),
          1::bigint, 'a batch of 20000 keys locks every key at once ...');
SELECT is((SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 7457 AND pid = pg_backend_pid())
          - (SELECT n FROM locks_before),
          1::bigint, '... and takes no key lock');
SELECT idem_outbox_emit('bulk', 'one-more', '{}');
SELECT is((SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 7457 AND pid = pg_backend_pid())
          - (SELECT n FROM locks_before),
          1::bigint, 'later emits of the transaction take none either');
ROLLBACK TO SAVEPOINT many;
SELECT is((SELECT count(*) FROM pg_locks
           WHERE locktype = 'advisory' AND objsubid = 7457 AND pid = pg_backend_pid() AND mode = 'ExclusiveLock'
             AND (classid, objid) = (0, 0)),
          0::bigint, 'the rollback of the subtransaction gives that lock back');

-- a transaction that has emitted already never upgrades to the all-keys
-- lock (two doing so at once would deadlock): a later batch of 300 keys
-- takes a lock per key
SELECT idem_outbox_emit('later', 'first', '{}');
SELECT cardinality(idem_outbox_emit_batch('later', array_agg('k' || g), array_agg('{}'::jsonb)))
FROM generate_series(1, 300) g;
SELECT is((SELECT count(*) FROM pg_locks
           WHERE locktype = 'advisory' AND objsubid = 7457 AND pid = pg_backend_pid()
             AND mode = 'ExclusiveLock' AND (classid, objid) <> (0, 0)) - (SELECT n FROM locks_before),
          301::bigint, 'after a first emit, a batch of 300 keys takes 300 key locks');
SELECT is((SELECT count(*) FROM pg_locks
           WHERE locktype = 'advisory' AND objsubid = 7457 AND pid = pg_backend_pid()
             AND mode = 'ExclusiveLock' AND (classid, objid) = (0, 0)),
          0::bigint, '... and not the all-keys lock in ExclusiveLock');

SELECT * FROM finish();
ROLLBACK;
