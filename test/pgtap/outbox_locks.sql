-- The locks of emits (src/outbox.c): one transaction-level lock per
-- (scope, topic, key), an advisory lock of class 7457, so that per key the
-- order of seq is the order of commits, under its scope's lock (class 7458);
-- a transaction whose first emit is a batch of more than 256 keys locks
-- every key of the scope at once instead.  In a file of its own
-- because that depends on what the transaction emitted before.
-- Everything is rolled back.
BEGIN;
SELECT plan(14);

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
SELECT is((SELECT count(*) FROM pg_locks
           WHERE locktype = 'advisory' AND objsubid = 7458 AND pid = pg_backend_pid()
             AND mode = 'RowExclusiveLock' AND granted),
          2::bigint, '... and one lock per scope, shared: the scopes '''' and other');
ROLLBACK TO SAVEPOINT locks;
SELECT is((SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 7457 AND pid = pg_backend_pid())
          - (SELECT n FROM locks_before),
          0::bigint, 'a rolled-back subtransaction releases them');

-- a transaction's first emit, a batch of more than 256 keys,
-- locks every key of the scope at once: a bulk emit does not fill the shared
-- lock table
SAVEPOINT many;
SELECT cardinality(idem_outbox_emit_batch('bulk', array_agg('k' || g), array_agg('{}'::jsonb)))
FROM generate_series(1, 20000) g;
SELECT is((SELECT count(*) FROM pg_locks
           WHERE locktype = 'advisory' AND objsubid = 7458 AND pid = pg_backend_pid()
             AND mode = 'ExclusiveLock'),
          1::bigint, 'a batch of 20000 keys locks every key of its scope at once ...');
SELECT is((SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 7457 AND pid = pg_backend_pid())
          - (SELECT n FROM locks_before),
          0::bigint, '... and takes no key lock');
SELECT idem_outbox_emit('bulk', 'one-more', '{}');
SELECT is((SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 7457 AND pid = pg_backend_pid())
          - (SELECT n FROM locks_before),
          0::bigint, 'later emits of the transaction to the scope take none either');
SELECT idem_outbox_emit('bulk', 'one-more', '{}', scope => 'tenant-b');
SELECT is((SELECT array_agg(mode ORDER BY objsubid, mode) FROM pg_locks
           WHERE locktype = 'advisory' AND objsubid IN (7457, 7458) AND pid = pg_backend_pid()),
          '{ExclusiveLock,ExclusiveLock,RowExclusiveLock}',
          'an emit to another scope takes its key lock under that scope''s lock, shared');
ROLLBACK TO SAVEPOINT many;
SELECT is((SELECT count(*) FROM pg_locks
           WHERE locktype = 'advisory' AND objsubid IN (7457, 7458) AND pid = pg_backend_pid()),
          0::bigint, 'the rollback of the subtransaction gives those locks back');

-- only a transaction's first emit locks a whole scope: one that emitted to
-- another scope before holds locks, and waiting for a whole scope then
-- could deadlock with an emitter of that scope waiting for one of them
SAVEPOINT other_scope;
SELECT idem_outbox_emit('bulk', 'first', '{}', scope => 'tenant-b');
SELECT cardinality(idem_outbox_emit_batch('bulk', array_agg('k' || g), array_agg('{}'::jsonb), scope => 'tenant-a'))
FROM generate_series(1, 300) g;
SELECT is((SELECT array_agg(DISTINCT objsubid || ' ' || mode || ' ' || count) FROM
             (SELECT objsubid, mode, count(*) FROM pg_locks
               WHERE locktype = 'advisory' AND objsubid IN (7457, 7458) AND pid = pg_backend_pid()
               GROUP BY 1, 2) l),
          '{"7457 ExclusiveLock 301","7458 RowExclusiveLock 2"}',
          'after an emit to tenant-b, a batch of 300 keys to tenant-a locks each key, under tenant-a''s lock shared');
ROLLBACK TO SAVEPOINT other_scope;

-- a first lock taken in a subtransaction that rolled back is given back:
-- the next emit is the first again; one taken in a released subtransaction
-- stays the parent's
SAVEPOINT undone;
SELECT idem_outbox_emit('bulk', 'first', '{}', scope => 'tenant-b');
ROLLBACK TO SAVEPOINT undone;
SAVEPOINT kept;
SELECT cardinality(idem_outbox_emit_batch('bulk', array_agg('k' || g), array_agg('{}'::jsonb), scope => 'tenant-a'))
FROM generate_series(1, 300) g;
SELECT is((SELECT array_agg(objsubid || ' ' || mode) FROM pg_locks
           WHERE locktype = 'advisory' AND objsubid IN (7457, 7458) AND pid = pg_backend_pid()),
          '{"7458 ExclusiveLock"}',
          'after a rolled-back emit, a batch of 300 keys locks all of its scope''s keys at once');
ROLLBACK TO SAVEPOINT kept;
SAVEPOINT inner_one;
SELECT idem_outbox_emit('bulk', 'first', '{}', scope => 'tenant-b');
RELEASE SAVEPOINT inner_one;
SELECT cardinality(idem_outbox_emit_batch('bulk', array_agg('k' || g), array_agg('{}'::jsonb), scope => 'tenant-a'))
FROM generate_series(1, 300) g;
SELECT is((SELECT count(*) FROM pg_locks
           WHERE locktype = 'advisory' AND objsubid = 7458 AND pid = pg_backend_pid()
             AND mode = 'ExclusiveLock'),
          0::bigint, 'after an emit in a released subtransaction, a batch of 300 keys locks each key');
ROLLBACK TO SAVEPOINT other_scope;

-- idem_outbox_lock_key (idem_outbox_retry's) takes its scope's lock too,
-- which a bulk emit to the scope holds off
SAVEPOINT retry;
SELECT idem_outbox_lock_key('tenant-c', 't', 'k');
SELECT is((SELECT array_agg(objsubid || ' ' || mode ORDER BY objsubid) FROM pg_locks
           WHERE locktype = 'advisory' AND objsubid IN (7457, 7458) AND pid = pg_backend_pid()),
          '{"7457 ExclusiveLock","7458 RowExclusiveLock"}',
          'idem_outbox_lock_key takes the key''s lock under its scope''s');
ROLLBACK TO SAVEPOINT retry;

-- a transaction that has emitted to the scope already never upgrades its
-- lock (two doing so at once would deadlock): a later batch of 300 keys
-- takes a lock per key
SELECT idem_outbox_emit('later', 'first', '{}');
SELECT cardinality(idem_outbox_emit_batch('later', array_agg('k' || g), array_agg('{}'::jsonb)))
FROM generate_series(1, 300) g;
SELECT is((SELECT count(*) FROM pg_locks
           WHERE locktype = 'advisory' AND objsubid = 7457 AND pid = pg_backend_pid()
             AND mode = 'ExclusiveLock') - (SELECT n FROM locks_before),
          301::bigint, 'after a first emit, a batch of 300 keys takes 300 key locks');
SELECT is((SELECT count(*) FROM pg_locks
           WHERE locktype = 'advisory' AND objsubid = 7458 AND pid = pg_backend_pid()
             AND mode = 'ExclusiveLock'),
          0::bigint, '... and not its scope''s lock in ExclusiveLock');

SELECT * FROM finish();
ROLLBACK;
