-- Rows inserted into idem_outbox directly, not by idem_outbox_emit (issue
-- 25): the trigger idem_outbox_order gives a row whose seq the column's
-- default drew the emits' lock on its key (class 7457, under its scope's
-- lock, 7458) and then a new seq, so that per key seq order is commit order
-- whoever inserts; a row that brings its own seq keeps it and takes no lock
-- (a restore's COPY, a copy between shards).  The races are in the
-- isolation spec outbox-direct-insert.  Everything is rolled back.
BEGIN;
SELECT plan(19);

DELETE FROM idem_outbox;
CREATE TEMP TABLE m (name text PRIMARY KEY, id uuid);
CREATE FUNCTION pg_temp.id(text) RETURNS uuid LANGUAGE sql AS $$ SELECT id FROM m WHERE name = $1 $$;
CREATE FUNCTION pg_temp.seq(text) RETURNS bigint LANGUAGE sql AS
    $$ SELECT seq FROM idem_outbox WHERE id = (SELECT id FROM m WHERE name = $1) $$;
-- this session's locks of a class of the emits' (7457 a key's, 7458 a
-- scope's) in a mode.  The SQL edition (sql/edition/bodies/outbox.sql) takes
-- them with pg_advisory_xact_lock(int4, int4), the class as the first key:
-- pg_locks shows it in classid, with objsubid 2; and a scope's shared lock is
-- pg_advisory_xact_lock_shared's ShareLock where the C edition takes
-- RowExclusiveLock (the same conflicts between the two modes used).
SELECT NOT EXISTS (SELECT FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
                   WHERE p.proname = 'idem_claim' AND l.lanname = 'c'
                     AND p.pronamespace = (SELECT extnamespace FROM pg_extension WHERE extname = 'idempotency'))
       AS sql_edition \gset
\if :sql_edition
CREATE FUNCTION pg_temp.locks(mode text, class integer) RETURNS bigint LANGUAGE sql AS
    $$ SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND classid = class
                                       AND pid = pg_backend_pid() AND granted
                                       AND mode = CASE $1 WHEN 'RowExclusiveLock' THEN 'ShareLock' ELSE $1 END $$;
\else
CREATE FUNCTION pg_temp.locks(mode text, class integer) RETURNS bigint LANGUAGE sql AS
    $$ SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = class
                                       AND pid = pg_backend_pid() AND mode = $1 AND granted $$;
\endif
-- what an ORM sends: the columns it maps; the rest take their defaults
CREATE FUNCTION pg_temp.direct(name text, key text, scope text DEFAULT '') RETURNS uuid LANGUAGE sql AS $$
    INSERT INTO idem_outbox (id, created_at, available_at, updated_at, scope, aggregatetype, aggregateid, payload)
    VALUES (gen_random_uuid(), now(), now(), now(), scope, 'direct', key, jsonb_build_object('n', name))
    RETURNING id
$$;

-- many rows in one statement (the transaction's first: the count is per
-- transaction): a lock per key, row by row; past 256 keys
-- the scope's lock if it is free at once, and no more key locks
SAVEPOINT many;
INSERT INTO idem_outbox (id, created_at, available_at, updated_at, aggregatetype, aggregateid, payload)
SELECT gen_random_uuid(), now(), now(), now(), 'direct', 'm' || g, '{}' FROM generate_series(1, 1000) g;
SELECT is(pg_temp.locks('ExclusiveLock', 7457), 256::bigint, 'an INSERT of 1000 keys takes 256 key locks ...');
SELECT is(pg_temp.locks('ExclusiveLock', 7458), 1::bigint, '... and then its quiet scope''s lock');
SELECT is((SELECT count(DISTINCT seq) FROM idem_outbox WHERE aggregatetype = 'direct' AND aggregateid LIKE 'm%'),
          1000::bigint, '... every row with a seq of its own');
ROLLBACK TO SAVEPOINT many;

-- one row: a seq after the emits before it, the defaults of an emit's row
SAVEPOINT one;
INSERT INTO m VALUES ('e1', idem_outbox_emit('direct', 'k', '{}'));
SELECT pg_temp.seq('e1') AS e1_seq \gset
ROLLBACK TO SAVEPOINT one;
SAVEPOINT two;
INSERT INTO m VALUES ('d1', pg_temp.direct('d1', 'j'));
SELECT ok(pg_temp.seq('d1') > :e1_seq, 'a row inserted directly gets a seq, after the emits before it');
SELECT is((SELECT row(token, status, attempts, scope, lease_expires_at, relay)::text FROM idem_outbox WHERE id = pg_temp.id('d1')),
          row(0::bigint, 'pending'::idem_outbox_status, 0, ''::text, NULL::timestamptz, NULL::text)::text,
          '... and the defaults an emit''s row gets');
SELECT is(pg_temp.locks('ExclusiveLock', 7457), 1::bigint, '... and takes its key''s lock, as an emit');
SELECT is(pg_temp.locks('RowExclusiveLock', 7458), 1::bigint, '... under its scope''s, shared');
SELECT ok(pg_temp.seq('d1') > currval('idem_outbox_seq') - 2,
          '... drawn after the lock: the default''s draw and the trigger''s');
INSERT INTO m VALUES ('d2', pg_temp.direct('d2', 'j'));
SELECT is(pg_temp.locks('ExclusiveLock', 7457), 1::bigint, 'a second row of the key finds its lock held');
SELECT is(pg_temp.seq('d2'), currval('idem_outbox_seq'), '... and keeps the seq its default drew (after the lock)');
INSERT INTO m VALUES ('e2', idem_outbox_emit('direct', 'j', '{}'));
SELECT ok(pg_temp.seq('e2') > pg_temp.seq('d2'), 'an emit of the key after them comes after them');
SELECT is(pg_temp.locks('ExclusiveLock', 7457), 1::bigint, '... with the same lock');
ROLLBACK TO SAVEPOINT two;

-- seq given: DEFAULT and NULL are drawn; a value is kept, without a lock
SAVEPOINT given;
INSERT INTO idem_outbox (id, seq, created_at, available_at, updated_at, aggregatetype, aggregateid, payload)
VALUES ('00000000-0000-7000-8000-000000000001', DEFAULT, now(), now(), now(), 'direct', 'g', '{}'),
       ('00000000-0000-7000-8000-000000000002', NULL, now(), now(), now(), 'direct', 'g', '{}');
SELECT is((SELECT count(*) FROM idem_outbox WHERE aggregateid = 'g' AND seq > :e1_seq), 2::bigint,
          'a seq given as DEFAULT or NULL is drawn');
ROLLBACK TO SAVEPOINT given;
SAVEPOINT own;
INSERT INTO idem_outbox (id, seq, created_at, available_at, updated_at, aggregatetype, aggregateid, payload)
VALUES ('00000000-0000-7000-8000-000000000003', 5, now(), now(), now(), 'direct', 'o', '{}');
SELECT is((SELECT seq FROM idem_outbox WHERE aggregateid = 'o'), 5::bigint,
          'a row that brings its own seq keeps it (a restore, a copy)');
SELECT is(pg_temp.locks('ExclusiveLock', 7457) + pg_temp.locks('RowExclusiveLock', 7458), 0::bigint,
          '... and takes no lock');
ROLLBACK TO SAVEPOINT own;

-- replica mode (logical replication, some restores): the trigger fires
SAVEPOINT replica;
SET LOCAL session_replication_role = replica;
INSERT INTO m VALUES ('r1', pg_temp.direct('r1', 'r'));
SELECT is(pg_temp.locks('ExclusiveLock', 7457), 1::bigint, 'under session_replication_role = replica too');
ROLLBACK TO SAVEPOINT replica;

-- the kind emitter may insert directly (not seq: covered in outbox_operations)
CREATE ROLE regress_idem_direct_orm;
SELECT idem_grant('emitter', 'regress_idem_direct_orm');
SAVEPOINT orm;
SET LOCAL ROLE regress_idem_direct_orm;
-- no RETURNING: the kind emitter may not read the outbox
INSERT INTO idem_outbox (id, created_at, available_at, updated_at, aggregatetype, aggregateid, payload)
VALUES ('00000000-0000-7000-8000-0000000000aa', now(), now(), now(), 'direct', 'orm', '{}');
RESET ROLE;
INSERT INTO m VALUES ('o1', '00000000-0000-7000-8000-0000000000aa');
SELECT ok(pg_temp.seq('o1') > :e1_seq, 'an emitter''s direct insert gets a seq');
SELECT is(pg_temp.locks('ExclusiveLock', 7457), 1::bigint, '... under its key''s lock');
ROLLBACK TO SAVEPOINT orm;

-- a trigger for INSERT rows only
SELECT is((SELECT tgenabled::text FROM pg_trigger WHERE tgrelid = 'idem_outbox'::regclass AND tgname = 'idem_outbox_order'),
          'A', 'the trigger fires in every session_replication_role');

SELECT * FROM finish();
ROLLBACK;
