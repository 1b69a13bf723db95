-- Fencing whatever removes a record (issue 12, defect 3): a DELETE by a role
-- of the client kind, a TRUNCATE, or idem_purge, each followed by a new claim
-- of the key.  The owner that stalled through the removal must be refused
-- (IK002) and the new owner's token must be one it never held: tokens of a
-- key never repeat.  A removal that is rolled back changes nothing for the
-- owner; removing nothing, or only records of an earlier epoch, and the
-- reuse of a released record inside idem_claim do not spend an epoch.
-- A reuse that fails leaves no exemption behind; an UPDATE cannot move a
-- record to another key; a role needs nothing on the sequence to delete;
-- the epoch moves with the first deleted row, once per statement; a replica
-- session fences too; a renamed column is reported.
--
-- Everything, roles included, is rolled back; the epoch (a sequence, not
-- transactional) is put back at the end.  Keys are prefixed "fd.", roles are
-- regress_idem_fd_*.
BEGIN;
SELECT plan(40);

CREATE TEMP TABLE saved_epoch AS
SELECT last_value, is_called FROM idem_token_epoch;
-- the epoch as idem_token_first reads it (0 before any advance)
CREATE FUNCTION pg_temp.epoch() RETURNS bigint LANGUAGE sql
RETURN coalesce(pg_sequence_last_value('idem_token_epoch'), 0);
GRANT EXECUTE ON FUNCTION pg_temp.epoch() TO PUBLIC;

CREATE ROLE regress_idem_fd_client;
SELECT idem_grant('client', 'regress_idem_fd_client');
CREATE ROLE regress_idem_fd_truncator;
GRANT USAGE ON SCHEMA public TO regress_idem_fd_truncator;
GRANT TRUNCATE ON idempotency_records TO regress_idem_fd_truncator;

CREATE TEMP TABLE tok (label text PRIMARY KEY, token bigint);
GRANT ALL ON tok TO PUBLIC;

-- 1. a DELETE by a client-kind role ------------------------------------------------------------
SET ROLE regress_idem_fd_client;
INSERT INTO tok SELECT 'a-old', token FROM idem_claim('fd.a', '\xaa'::bytea, '1 hour');
-- the old owner stalls; someone cleans up its record by hand
SELECT lives_ok($$DELETE FROM idempotency_records WHERE key = 'fd.a'$$,
                'a client-kind role may delete a record (it holds DELETE, nothing on the sequence)');
INSERT INTO tok SELECT 'a-new', token FROM idem_claim('fd.a', '\xaa'::bytea, '1 hour');
SELECT cmp_ok((SELECT token FROM tok WHERE label = 'a-new'), '>',
              (SELECT token FROM tok WHERE label = 'a-old'),
              'after a DELETE, the new claim of the key gets a token above the old owner''s');
SELECT throws_ok(format($$SELECT idem_complete('fd.a', %s, '{"by": "old"}', 200)$$,
                        (SELECT token FROM tok WHERE label = 'a-old')),
                 'IK002', NULL, 'the stalled old owner''s completion is refused (IK002)');
SELECT lives_ok(format($$SELECT idem_complete('fd.a', %s, '{"by": "new"}', 201)$$,
                       (SELECT token FROM tok WHERE label = 'a-new')),
                'the new owner completes with its own token');
SELECT results_eq($$SELECT status::text, response_code, result FROM idem_lookup('fd.a')$$,
                  $$VALUES ('succeeded', 201, '{"by": "new"}'::jsonb)$$,
                  'the record holds the new owner''s outcome');
RESET ROLE;

-- the same with a DELETE of many keys in one statement, some of an older epoch
SET ROLE regress_idem_fd_client;
INSERT INTO tok SELECT 'b1-old', token FROM idem_claim('fd.b1', '\xbb'::bytea, '1 hour');
INSERT INTO tok SELECT 'b2-old', token FROM idem_claim('fd.b2', '\xbb'::bytea, '1 hour');
DELETE FROM idempotency_records WHERE key IN ('fd.a', 'fd.b1', 'fd.b2');
INSERT INTO tok SELECT 'b1-new', token FROM idem_claim('fd.b1', '\xbb'::bytea, '1 hour');
INSERT INTO tok SELECT 'b2-new', token FROM idem_claim('fd.b2', '\xbb'::bytea, '1 hour');
SELECT ok((SELECT bool_and(n.token > o.token) FROM tok o JOIN tok n
           ON n.label = replace(o.label, '-old', '-new') WHERE o.label IN ('b1-old', 'b2-old')),
          'a DELETE of several records: each key is claimed again above its old token');
SELECT throws_ok(format($$SELECT idem_fail('fd.b2', %s, '{"by": "old"}')$$,
                        (SELECT token FROM tok WHERE label = 'b2-old')),
                 'IK002', NULL, 'and each old owner is refused');
RESET ROLE;

-- 2. a TRUNCATE, by a role that holds only TRUNCATE --------------------------------------------
INSERT INTO tok SELECT 'c-old', token FROM idem_claim('fd.c', '\xcc'::bytea, '1 hour');
SET ROLE regress_idem_fd_truncator;
SELECT lives_ok($$TRUNCATE idempotency_records$$,
                'a role with TRUNCATE and nothing on the sequence may truncate the records');
RESET ROLE;
INSERT INTO tok SELECT 'c-new', token FROM idem_claim('fd.c', '\xcc'::bytea, '1 hour');
SELECT cmp_ok((SELECT token FROM tok WHERE label = 'c-new'), '>',
              (SELECT token FROM tok WHERE label = 'c-old'),
              'after a TRUNCATE, the new claim gets a token above the old owner''s');
SELECT throws_ok(format($$SELECT idem_complete('fd.c', %s, '{"by": "old"}', 200)$$,
                        (SELECT token FROM tok WHERE label = 'c-old')),
                 'IK002', NULL, 'the old owner''s completion after a TRUNCATE is refused (IK002)');
SELECT lives_ok(format($$SELECT idem_complete('fd.c', %s, '{"by": "new"}', 201)$$,
                       (SELECT token FROM tok WHERE label = 'c-new')),
                'the new owner completes after the TRUNCATE');

-- 3. a removal rolled back changes nothing for the owner ----------------------------------------
SET ROLE regress_idem_fd_client;
INSERT INTO tok SELECT 'd', token FROM idem_claim('fd.d', '\xdd'::bytea, '1 hour');
SAVEPOINT before_delete;
DELETE FROM idempotency_records WHERE key = 'fd.d';
ROLLBACK TO before_delete;
SELECT is((SELECT token FROM idem_lookup('fd.d')), (SELECT token FROM tok WHERE label = 'd'),
          'a DELETE rolled back leaves the record and its token');
SELECT lives_ok(format($$SELECT idem_complete('fd.d', %s, '{"by": "owner"}', 200)$$,
                       (SELECT token FROM tok WHERE label = 'd')),
                'and its owner completes as if nothing happened');
RESET ROLE;
SAVEPOINT before_truncate;
TRUNCATE idempotency_records;
ROLLBACK TO before_truncate;
SELECT results_eq($$SELECT status::text, token FROM idem_lookup('fd.d')$$,
                  format($$VALUES ('succeeded', %s::bigint)$$, (SELECT token FROM tok WHERE label = 'd')),
                  'a TRUNCATE rolled back leaves the record and its token');

-- 4. purge, then a new claim (idem_purge advanced the epoch before this issue) ----------------
INSERT INTO tok SELECT 'e-old', token FROM idem_claim('fd.e', '\xee'::bytea, '1 hour', retention => '1 microsecond');
SELECT idem_complete('fd.e', (SELECT token FROM tok WHERE label = 'e-old'), '{}', 200);
SELECT pg_sleep(0.01);
SELECT cmp_ok(idem_purge(), '>=', 1::bigint, 'idem_purge removes the expired record');
INSERT INTO tok SELECT 'e-new', token FROM idem_claim('fd.e', '\xee'::bytea, '1 hour');
SELECT cmp_ok((SELECT token FROM tok WHERE label = 'e-new'), '>',
              (SELECT token FROM tok WHERE label = 'e-old'),
              'after idem_purge, the new claim gets a token above the old one');

-- 5. what does not spend an epoch ---------------------------------------------------------------
CREATE TEMP TABLE e AS SELECT pg_temp.epoch() AS before;
DELETE FROM idempotency_records WHERE key = 'fd.none';
SELECT is(pg_temp.epoch(), (SELECT before FROM e), 'a DELETE that removes nothing leaves the epoch');
-- fd.d was claimed before several advances: its token belongs to an older epoch
DELETE FROM idempotency_records WHERE key = 'fd.d';
SELECT is(pg_temp.epoch(), (SELECT before FROM e),
          'a DELETE of records of older epochs only leaves the epoch (new tokens are above them already)');
INSERT INTO tok SELECT 'f', token FROM idem_claim('fd.f', '\xff'::bytea, '1 hour');
SELECT idem_release('fd.f', (SELECT token FROM tok WHERE label = 'f'));
UPDATE tok SET token = (SELECT token FROM idem_lookup('fd.f')) WHERE label = 'f';
UPDATE e SET before = pg_temp.epoch();
SELECT results_eq($$SELECT outcome, token FROM idem_claim('fd.f', '\xff'::bytea, '1 hour')$$,
                  format($$VALUES ('new', %s::bigint)$$, (SELECT token FROM tok WHERE label = 'f') + 1),
                  'a released record is reused with the next token');
SELECT is(pg_temp.epoch(), (SELECT before FROM e),
          'the reuse (a DELETE and INSERT of the key in one statement) leaves the epoch');
INSERT INTO tok SELECT 'g', token FROM idem_claim('fd.g', '\x99'::bytea, '1 hour');
DELETE FROM idempotency_records WHERE key = 'fd.g';
SELECT is(pg_temp.epoch(), (SELECT before FROM e) + 1,
          'a DELETE of a record of the current epoch advances it by one');

-- 6. no new privilege: the trigger functions cannot be called or attached by others --------------
SELECT is_empty($$SELECT p.oid::regprocedure FROM pg_proc p
                  WHERE p.proname IN ('idem_records_removed', 'idem_records_truncated', 'idem_records_rekeyed')
                    AND has_function_privilege('public', p.oid, 'EXECUTE')$$,
                'PUBLIC cannot execute the removal triggers'' functions');
SELECT is(has_sequence_privilege('regress_idem_fd_client', 'idem_token_epoch', 'USAGE'), false,
          'the client kind still holds nothing but SELECT on the epoch');
CREATE TEMP TABLE other (LIKE idempotency_records);
CREATE TRIGGER t AFTER TRUNCATE ON other EXECUTE FUNCTION idem_records_truncated();
SELECT throws_ok($$TRUNCATE other$$, '39P01', NULL,
                 'the truncate trigger refuses to run on a table other than the records');

-- 7. a reuse that fails inside idem_claim leaves no exemption behind --------------------------
-- A user's trigger refuses the re-inserted row while regress_idem_fd.refuse
-- is on; the claim's error is caught (throws_ok runs it in a subtransaction)
-- and the transaction goes on.  A later DELETE of the key is a removal like
-- any other: the epoch moves, and the next claim's token is a new one.
CREATE FUNCTION regress_idem_fd_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('regress_idem_fd.refuse', true) = TG_WHEN THEN
        RAISE EXCEPTION 'refused by a user trigger';
    END IF;
    RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
END $$;
-- one fires after the reuse's DELETE (BEFORE INSERT), one before it (its
-- name sorts before idem_records_removed)
CREATE TRIGGER regress_idem_fd_refuse_insert BEFORE INSERT ON idempotency_records
    FOR EACH ROW EXECUTE FUNCTION regress_idem_fd_refuse();
CREATE TRIGGER a_regress_idem_fd_refuse_delete BEFORE DELETE ON idempotency_records
    FOR EACH ROW EXECUTE FUNCTION regress_idem_fd_refuse();
INSERT INTO tok SELECT 'lk-1', token FROM idem_claim('fd.lk', '\x01'::bytea, '1 hour');
SELECT idem_release('fd.lk', (SELECT token FROM tok WHERE label = 'lk-1'));
SET LOCAL regress_idem_fd.refuse = 'BEFORE';
SELECT throws_ok($$SELECT idem_claim('fd.lk', '\x01'::bytea, '1 hour')$$, 'P0001',
                 'refused by a user trigger', 'the reuse fails in a user''s BEFORE INSERT trigger');
-- and as PL/pgSQL would catch it
DO $$
BEGIN
    PERFORM idem_claim('fd.lk', '\x01'::bytea, '1 hour');
EXCEPTION WHEN raise_exception THEN
END $$;
SET LOCAL regress_idem_fd.refuse = '';
UPDATE e SET before = pg_temp.epoch();
DELETE FROM idempotency_records WHERE key = 'fd.lk';
SELECT is(pg_temp.epoch(), (SELECT before FROM e) + 1,
          'after a failed reuse, a DELETE of the key in the same transaction advances the epoch');
INSERT INTO tok SELECT 'lk-2', token FROM idem_claim('fd.lk', '\x01'::bytea, '1 hour');
SELECT cmp_ok((SELECT token FROM tok WHERE label = 'lk-2'), '>',
              (SELECT token FROM tok WHERE label = 'lk-1'),
              'and the next claim of the key gets a token above the first owner''s');
-- the same, the reuse failing before its DELETE is done
SELECT idem_release('fd.lk', (SELECT token FROM tok WHERE label = 'lk-2'));
DROP TRIGGER regress_idem_fd_refuse_insert ON idempotency_records;
DO $$
BEGIN
    PERFORM set_config('regress_idem_fd.refuse', 'BEFORE', true);
    PERFORM idem_claim('fd.lk', '\x01'::bytea, '1 hour');
EXCEPTION WHEN raise_exception THEN
    PERFORM set_config('regress_idem_fd.refuse', '', true);
END $$;
UPDATE e SET before = pg_temp.epoch();
DELETE FROM idempotency_records WHERE key = 'fd.lk';
SELECT is(pg_temp.epoch(), (SELECT before FROM e) + 1,
          'a reuse refused by a BEFORE DELETE trigger leaves no exemption either');
DROP TRIGGER a_regress_idem_fd_refuse_delete ON idempotency_records;

-- 8. an UPDATE may not move a record to another key (client kind: table-wide UPDATE) ----------
SET ROLE regress_idem_fd_client;
INSERT INTO tok SELECT 'rk', token FROM idem_claim('fd.rk', '\x02'::bytea, '1 hour');
SELECT throws_ok($$UPDATE idempotency_records SET key = 'fd.rk-moved' WHERE key = 'fd.rk'$$,
                 '0A000', 'cannot change the scope or key of an idempotency record',
                 'an UPDATE of a record''s key is refused');
SELECT throws_ok($$UPDATE idempotency_records SET scope = 'fd.elsewhere' WHERE key = 'fd.rk'$$,
                 '0A000', 'cannot change the scope or key of an idempotency record',
                 'an UPDATE of a record''s scope is refused');
SELECT lives_ok($$UPDATE idempotency_records SET scope = scope, key = key WHERE key = 'fd.rk'$$,
                'an UPDATE that leaves scope and key as they are is allowed');
SELECT results_eq($$SELECT c.outcome, l.token FROM idem_claim('fd.rk', '\x02'::bytea, '1 hour') c,
                           idem_lookup('fd.rk') l$$,
                  format($$VALUES ('in_progress', %s::bigint)$$, (SELECT token FROM tok WHERE label = 'rk')),
                  'the record stays where it was: the next claim finds its owner');
RESET ROLE;

-- 9. deleting needs DELETE on the records and nothing on the sequence ---------------------------
CREATE ROLE regress_idem_fd_deleter;
GRANT USAGE ON SCHEMA public TO regress_idem_fd_deleter;
GRANT SELECT, DELETE ON idempotency_records TO regress_idem_fd_deleter;
REVOKE SELECT ON SEQUENCE idem_token_epoch FROM PUBLIC;
INSERT INTO tok SELECT 'p', token FROM idem_claim('fd.p', '\x03'::bytea, '1 hour');
UPDATE e SET before = pg_temp.epoch();
SET ROLE regress_idem_fd_deleter;
SELECT throws_ok($$SELECT last_value FROM idem_token_epoch$$, '42501', NULL,
                 'the deleter cannot read the sequence');
SELECT lives_ok($$DELETE FROM idempotency_records WHERE key = 'fd.p'$$,
                'a role with SELECT and DELETE on the records, and nothing on the sequence, may delete');
RESET ROLE;
SELECT is(pg_temp.epoch(), (SELECT before FROM e) + 1, 'and its DELETE advances the epoch');
GRANT SELECT ON SEQUENCE idem_token_epoch TO PUBLIC;

-- 10. BEFORE DELETE: the epoch moves with the first row, once per statement ---------------------
INSERT INTO tok SELECT 'q' || i, token FROM generate_series(1, 3) i,
    idem_claim('fd.q' || i, '\x04'::bytea, '1 hour');
UPDATE e SET before = pg_temp.epoch();
SELECT results_eq($$WITH d AS (DELETE FROM idempotency_records WHERE key LIKE 'fd.q%'
                                RETURNING pg_temp.epoch() AS seen)
                    SELECT DISTINCT seen FROM d$$,
                  format($$VALUES (%s::bigint)$$, (SELECT before FROM e) + 1),
                  'the epoch has moved when the row is deleted, and only once for three rows');

-- 11. session_replication_role = replica (an apply worker, a restore) fences too ----------------
SET LOCAL session_replication_role = replica;
INSERT INTO tok SELECT 'r', token FROM idem_claim('fd.r', '\x05'::bytea, '1 hour');
UPDATE e SET before = pg_temp.epoch();
DELETE FROM idempotency_records WHERE key = 'fd.r';
SELECT is(pg_temp.epoch(), (SELECT before FROM e) + 1, 'a DELETE as a replica advances the epoch');
INSERT INTO tok SELECT 'r', token FROM idem_claim('fd.r', '\x05'::bytea, '1 hour')
    ON CONFLICT (label) DO UPDATE SET token = excluded.token;
SELECT throws_ok($$UPDATE idempotency_records SET key = 'fd.r-moved' WHERE key = 'fd.r'$$,
                 '0A000', NULL, 'an UPDATE of the key as a replica is refused');
-- (the sequence is not transactional: the advance outlives the rollback)
UPDATE e SET before = pg_temp.epoch();
SAVEPOINT before_replica_truncate;
TRUNCATE idempotency_records;
ROLLBACK TO before_replica_truncate;
SELECT is(pg_temp.epoch(), (SELECT before FROM e) + 1, 'a TRUNCATE as a replica advances the epoch');
SET LOCAL session_replication_role = origin;

-- 12. a renamed column is reported, not misread ------------------------------------------------
INSERT INTO tok SELECT 's', token FROM idem_claim('fd.s', '\x06'::bytea, '1 hour');
-- (throws_ok's subtransaction rolls the rename back)
SELECT throws_ok($t$DO $do$
                   BEGIN
                       ALTER TABLE idempotency_records RENAME COLUMN token TO token_renamed;
                       DELETE FROM idempotency_records WHERE key = 'fd.s';
                   END $do$$t$, '55000',
                 'table "idempotency_records" has no column "token" of type bigint',
                 'a DELETE after a column of the records was renamed says which column is missing');

SELECT setval('idem_token_epoch', last_value, is_called) FROM saved_epoch;
SELECT * FROM finish();
ROLLBACK;
