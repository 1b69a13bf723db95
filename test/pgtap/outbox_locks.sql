-- The locks of emits (src/outbox.c): one transaction-level lock per
-- (scope, topic, key), an advisory lock of class 7457, so that per key the
-- order of seq is the order of commits, under its scope's lock (class 7458);
-- a transaction whose first emit is a batch of more than 256 keys locks
-- every key of the scope at once instead.  In a file of its own
-- because that depends on what the transaction emitted before.
-- Everything is rolled back.
BEGIN;
SELECT plan(12);

-- the emits' lock on a key: one per (scope, topic, key), held to the end of
-- the transaction, in a class of its own beside pg_advisory_lock's
DELETE FROM idem_outbox;
-- The view emit_locks: this session's locks of the two classes (class 7457
-- or 7458, mode, granted).  The SQL edition (sql/edition/bodies/outbox.sql)
-- takes them with pg_advisory_xact_lock(int4, int4), the class as the first
-- key: pg_locks shows it in classid, with objsubid 2, in the space of
-- pg_advisory_lock's own (int4, int4) locks, not in a class of its own; and
-- a scope's shared lock is pg_advisory_xact_lock_shared's ShareLock where the
-- C edition takes RowExclusiveLock (the same conflicts between the two modes
-- used): :'shared' names it.
SELECT NOT EXISTS (SELECT FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
                   WHERE p.proname = 'idem_claim' AND l.lanname = 'c'
                     AND p.pronamespace = (SELECT extnamespace FROM pg_extension WHERE extname = 'idempotency'))
       AS sql_edition \gset
\if :sql_edition
CREATE TEMP VIEW emit_locks AS
SELECT classid::int AS class, mode, granted FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 2 AND classid IN (7457, 7458) AND pid = pg_backend_pid();
\set shared ShareLock
\else
CREATE TEMP VIEW emit_locks AS
SELECT objsubid::int AS class, mode, granted FROM pg_locks
WHERE locktype = 'advisory' AND objsubid IN (7457, 7458) AND pid = pg_backend_pid();
\set shared RowExclusiveLock
\endif
CREATE TEMP TABLE locks_before AS
SELECT count(*) AS n FROM emit_locks WHERE class = 7457;
SAVEPOINT locks;
SELECT idem_outbox_emit('lock', 'k', '{}'), idem_outbox_emit('lock', 'k', '{}'),
       idem_outbox_emit('lock', 'k', '{}', scope => 'other'),
       idem_outbox_emit_batch('lock', '{a,b,a,k}', '{1,2,3,4}');
SELECT is((SELECT count(*) FROM emit_locks
           WHERE class = 7457 AND mode = 'ExclusiveLock' AND granted) - (SELECT n FROM locks_before),
          4::bigint, 'emits hold one lock per key: (lock, k), (other, lock, k), (lock, a), (lock, b)');
SELECT is((SELECT count(*) FROM emit_locks
           WHERE class = 7458 AND mode = :'shared' AND granted),
          2::bigint, '... and one lock per scope, shared: the scopes '''' and other');
ROLLBACK TO SAVEPOINT locks;
SELECT is((SELECT count(*) FROM emit_locks WHERE class = 7457) - (SELECT n FROM locks_before),
          0::bigint, 'a rolled-back subtransaction releases them');

-- a transaction's first emit, a batch of more than 256 keys,
-- locks every key of the scope at once: a bulk emit does not fill the shared
-- lock table
SAVEPOINT many;
SELECT cardinality(idem_outbox_emit_batch('bulk', array_agg('k' || g), array_agg('{}'::jsonb)))
FROM generate_series(1, 20000) g;
SELECT is((SELECT count(*) FROM emit_locks WHERE class = 7458 AND mode = 'ExclusiveLock'),
          1::bigint, 'a batch of 20000 keys locks every key of its scope at once ...');
SELECT is((SELECT count(*) FROM emit_locks WHERE class = 7457) - (SELECT n FROM locks_before),
          0::bigint, '... and takes no key lock');
SELECT idem_outbox_emit('bulk', 'one-more', '{}');
SELECT is((SELECT count(*) FROM emit_locks WHERE class = 7457) - (SELECT n FROM locks_before),
          0::bigint, 'later emits of the transaction to the scope take none either');
SELECT idem_outbox_emit('bulk', 'one-more', '{}', scope => 'tenant-b');
SELECT is((SELECT array_agg(mode ORDER BY class, mode) FROM emit_locks),
          ARRAY['ExclusiveLock', 'ExclusiveLock', :'shared'],
          'an emit to another scope takes its key lock under that scope''s lock, shared');
ROLLBACK TO SAVEPOINT many;
SELECT is((SELECT count(*) FROM emit_locks),
          0::bigint, 'the rollback of the subtransaction gives those locks back');

-- only a transaction's first emit waits for a whole scope: one that
-- emitted to another scope before holds locks, and waiting for a whole
-- scope then could deadlock with an emitter of that scope waiting for one
-- of them.  It takes the scope's lock if it is free at once (here: no other
-- session; isolation spec outbox-relays shows the key locks it takes when
-- the lock is not free)
SAVEPOINT other_scope;
SELECT idem_outbox_emit('bulk', 'first', '{}', scope => 'tenant-b');
SELECT cardinality(idem_outbox_emit_batch('bulk', array_agg('k' || g), array_agg('{}'::jsonb), scope => 'tenant-a'))
FROM generate_series(1, 300) g;
SELECT is((SELECT array_agg(DISTINCT class || ' ' || mode || ' ' || count) FROM
             (SELECT class, mode, count(*) FROM emit_locks GROUP BY 1, 2) l),
          ARRAY['7457 ExclusiveLock 1', '7458 ExclusiveLock 1', '7458 ' || :'shared' || ' 1'],
          'after an emit to tenant-b, a batch of 300 keys to tenant-a takes tenant-a''s lock, free at once');
ROLLBACK TO SAVEPOINT other_scope;

ROLLBACK TO SAVEPOINT other_scope;

-- idem_outbox_lock_key (idem_outbox_retry's) takes its scope's lock too,
-- which a bulk emit to the scope holds off
SAVEPOINT retry;
SELECT idem_outbox_lock_key('tenant-c', 't', 'k');
SELECT is((SELECT array_agg(class || ' ' || mode ORDER BY class) FROM emit_locks),
          ARRAY['7457 ExclusiveLock', '7458 ' || :'shared'],
          'idem_outbox_lock_key takes the key''s lock under its scope''s');
ROLLBACK TO SAVEPOINT retry;

-- a transaction that has emitted to the scope already upgrades its lock
-- only if it is free at once (two waiting to upgrade would deadlock)
SELECT idem_outbox_emit('later', 'first', '{}');
SELECT cardinality(idem_outbox_emit_batch('later', array_agg('k' || g), array_agg('{}'::jsonb)))
FROM generate_series(1, 300) g;
SELECT is((SELECT count(*) FROM emit_locks WHERE class = 7457 AND mode = 'ExclusiveLock')
          - (SELECT n FROM locks_before),
          1::bigint, 'after a first emit, a batch of 300 keys takes no more key locks ...');
SELECT is((SELECT count(*) FROM emit_locks WHERE class = 7458 AND mode = 'ExclusiveLock'),
          1::bigint, '... but its scope''s lock, free at once');

SELECT * FROM finish();
ROLLBACK;
