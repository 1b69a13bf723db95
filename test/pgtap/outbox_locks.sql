-- The locks of emits (src/outbox.c): one transaction-level lock per
-- (scope, topic, key), an advisory lock of class 7457, so that per key the
-- order of seq is the order of commits; past 256 key locks in one
-- transaction, one lock of every key at once instead.  In a file of its own
-- because the count of key locks is per transaction: each test starts in a
-- transaction that has emitted nothing.  Everything is rolled back.
BEGIN;
SELECT plan(6);

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

-- past 256 key locks in a transaction, one lock of every key instead: a
-- bulk emit cannot fill the shared lock table
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
SELECT lives_ok($$SELECT idem_outbox_emit('bulk', 'one-more', '{}')$$, 'later emits of the transaction need none either');
ROLLBACK TO SAVEPOINT many;
SELECT is((SELECT count(*) FROM pg_locks
           WHERE locktype = 'advisory' AND objsubid = 7457 AND pid = pg_backend_pid() AND mode = 'ExclusiveLock'
             AND (classid, objid) = (0, 0)),
          0::bigint, 'the rollback of the subtransaction gives that lock back');

SELECT * FROM finish();
ROLLBACK;
