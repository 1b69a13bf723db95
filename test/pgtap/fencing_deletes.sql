-- Fencing whatever removes a record (issue 12, defect 3): a DELETE by a role
-- of the client kind, a TRUNCATE, or idem_purge, each followed by a new claim
-- of the key.  The owner that stalled through the removal must be refused
-- (IK002) and the new owner's token must be one it never held: tokens of a
-- key never repeat.  A removal that is rolled back changes nothing for the
-- owner; removing nothing, or only records of an earlier epoch, and the
-- reuse of a released record inside idem_claim do not spend an epoch.
--
-- Everything, roles included, is rolled back; the epoch (a sequence, not
-- transactional) is put back at the end.  Keys are prefixed "fd.", roles are
-- regress_idem_fd_*.
BEGIN;
SELECT plan(24);

CREATE TEMP TABLE saved_epoch AS
SELECT last_value, is_called FROM idem_token_epoch;
-- the epoch as idem_store_first_token reads it (0 before any advance)
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
                  WHERE p.proname IN ('idem_records_removed', 'idem_records_truncated')
                    AND has_function_privilege('public', p.oid, 'EXECUTE')$$,
                'PUBLIC cannot execute the removal triggers'' functions');
SELECT is(has_sequence_privilege('regress_idem_fd_client', 'idem_token_epoch', 'USAGE'), false,
          'the client kind still holds nothing but SELECT on the epoch');
CREATE TEMP TABLE other (LIKE idempotency_records);
CREATE TRIGGER t AFTER TRUNCATE ON other EXECUTE FUNCTION idem_records_truncated();
SELECT throws_ok($$TRUNCATE other$$, '39P01', NULL,
                 'the truncate trigger refuses to run on a table other than the records');

SELECT setval('idem_token_epoch', last_value, is_called) FROM saved_epoch;
SELECT * FROM finish();
ROLLBACK;
