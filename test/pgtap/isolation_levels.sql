-- idem-test: superuser: its other sessions are dblink's, which connects a non-superuser only with a password that the server asks for (the cluster trusts local logins)
-- Isolation levels.  This transaction runs under REPEATABLE READ and goes
-- through the whole lifecycle on its own records (the claim's read-then-write
-- loop must work with one snapshot).  Then, through dblink, other sessions
-- under READ COMMITTED, REPEATABLE READ and SERIALIZABLE meet records that a
-- third session committed after their snapshot: READ COMMITTED sees the newest
-- state, the snapshot levels get 40001 wherever the claim must write over a
-- change they cannot see, and never act on it.  No session ever waits for
-- another here (each lock is on a different key), and every remote statement
-- has a statement_timeout.  Rows the committing session wrote (keys "il.")
-- are deleted at the start and at the end; everything else rolls back.
BEGIN;
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ;
SELECT plan(37);

SELECT is(current_setting('transaction_isolation'), 'repeatable read', 'this file runs under REPEATABLE READ');

-- part 1: one REPEATABLE READ transaction, its own records ---------------------------------------
CREATE TEMP TABLE c AS
SELECT 'new'::text AS label, r.* FROM idem_claim('il.own', '\xaa'::bytea, '2 s', retention => '1 hour') r;
INSERT INTO c SELECT 'busy', r.* FROM idem_claim('il.own', '\xaa'::bytea, '1 hour') r;
SELECT pg_sleep(2.05);
INSERT INTO c SELECT 'takeover', r.* FROM idem_claim('il.own', '\xaa'::bytea, '1 hour') r;
SELECT results_eq($$SELECT label, outcome, token FROM c ORDER BY token NULLS FIRST$$,
                  $$VALUES ('busy', 'in_progress', NULL::bigint), ('new', 'new', 1::bigint),
                           ('takeover', 'takeover', 2::bigint)$$,
                  'RR: new, in_progress, takeover after the lease expired');
SELECT throws_ok($$SELECT idem_complete('il.own', 1, '{}')$$, 'IK002', NULL, 'RR: the stale token is refused');
SELECT lives_ok($$SELECT idem_release('il.own', 2)$$, 'RR: release');
INSERT INTO c SELECT 'reuse', r.* FROM idem_claim('il.own', '\xbb'::bytea, '1 hour', retention => '2 s') r;
SELECT results_eq($$SELECT outcome, token FROM c WHERE label = 'reuse'$$, $$VALUES ('new', 4::bigint)$$,
                  'RR: a released key is new again, token 4');
SELECT lives_ok($$SELECT idem_complete('il.own', 4, '{"n": 4}')$$, 'RR: complete');
INSERT INTO c SELECT 'replay', r.* FROM idem_claim('il.own', '\xbb'::bytea, '1 hour') r;
SELECT results_eq($$SELECT outcome, result FROM c WHERE label = 'replay'$$,
                  $$VALUES ('replay', '{"n": 4}'::jsonb)$$, 'RR: replay');
SELECT pg_sleep(2.05);
INSERT INTO c SELECT 'expired', r.* FROM idem_claim('il.own', '\xcc'::bytea, '1 hour') r;
SELECT results_eq($$SELECT outcome, token FROM c WHERE label = 'expired'$$, $$VALUES ('new', 5::bigint)$$,
                  'RR: past retention the key is new again, token 5');
SELECT lives_ok($$SELECT idem_mark_unknown('il.own', 5, '{"why": "timeout"}')$$, 'RR: mark unknown');
SELECT lives_ok($$SELECT idem_resolve('il.own', 'failed', '{"why": "not applied"}', retryable => true)$$,
                'RR: resolve as retryable');
INSERT INTO c SELECT 'retry', r.* FROM idem_claim('il.own', '\xcc'::bytea, '1 hour') r;
SELECT results_eq($$SELECT outcome, token, attempts FROM c WHERE label = 'retry'$$,
                  $$VALUES ('takeover', 6::bigint, 2)$$, 'RR: the resolved key is taken over');

-- part 2: other sessions, through dblink ------------------------------------------------------------
CREATE EXTENSION IF NOT EXISTS dblink;
CREATE FUNCTION pg_temp.conninfo() RETURNS text LANGUAGE sql AS $$
    SELECT format('host=%s port=%s dbname=%s user=%s options=%L',
                  COALESCE(NULLIF(split_part(current_setting('unix_socket_directories'), ',', 1), ''), '127.0.0.1'),
                  current_setting('port'), current_database(), current_user,
                  '-c statement_timeout=10s -c lock_timeout=5s')
$$;
-- Run sql (one text column, one row) in a session: its value, or its SQLSTATE.
CREATE FUNCTION pg_temp.remote(conn text, sql text) RETURNS text LANGUAGE sql AS $$
    SELECT r FROM dblink(conn, format('SELECT pg_temp.try(%L)', sql)) AS t(r text)
$$;
-- A claim in a session: "outcome token", or the SQLSTATE it raised.
CREATE FUNCTION pg_temp.remote_claim(conn text, key text, lease interval) RETURNS text LANGUAGE sql AS $$
    SELECT pg_temp.remote(conn, format(
        'SELECT outcome || '' '' || COALESCE(token::text, ''-'') FROM idem_claim(%L, %L::bytea, %L)',
        key, '\xaa', lease))
$$;
SELECT dblink_connect(conn, pg_temp.conninfo()) FROM unnest(ARRAY['il_other', 'il_rc', 'il_rr', 'il_ser']) AS conn
\g /dev/null
SELECT dblink_exec(conn, $r$
    CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $f$
    DECLARE
        result text;
    BEGIN
        EXECUTE sql INTO result;
        RETURN result;
    EXCEPTION WHEN OTHERS THEN
        RETURN SQLSTATE;
    END
    $f$$r$)
FROM unnest(ARRAY['il_other', 'il_rc', 'il_rr', 'il_ser']) AS conn
\g /dev/null
SELECT dblink_exec('il_other', $$DELETE FROM idempotency_records WHERE key LIKE 'il.%'$$) \g /dev/null
DO $$ BEGIN PERFORM setval('idem_token_epoch', 1, false); END $$;  -- a DELETE moves the epoch

-- committed before the other sessions take their snapshots
SELECT is(pg_temp.remote_claim('il_other', 'il.live', '1 hour'), 'new 1', 'another session commits a claim (live lease)');
SELECT is(pg_temp.remote_claim('il_other', 'il.upd', '50 ms'), 'new 1', 'and one with a short lease');
SELECT is(string_agg(pg_temp.remote_claim('il_other', 'il.stale.' || s, '50 ms'), ', ' ORDER BY s),
          'new 1, new 1, new 1', 'and one short-leased key per reading session')
FROM unnest(ARRAY['rc', 'rr', 'ser']) AS s;

SELECT dblink_exec('il_rc', 'BEGIN ISOLATION LEVEL READ COMMITTED') \g /dev/null
SELECT dblink_exec('il_rr', 'BEGIN ISOLATION LEVEL REPEATABLE READ') \g /dev/null
SELECT dblink_exec('il_ser', 'BEGIN ISOLATION LEVEL SERIALIZABLE') \g /dev/null
SELECT is(string_agg(pg_temp.remote_claim(conn, 'il.live', '1 hour'), ', ' ORDER BY conn),
          'in_progress -, in_progress -, in_progress -',
          'RC, RR and SERIALIZABLE sessions see the live lease (RR and SERIALIZABLE take their snapshots)')
FROM unnest(ARRAY['il_rc', 'il_rr', 'il_ser']) AS conn;

-- committed after those snapshots
SELECT is(pg_temp.remote_claim('il_other', 'il.ins', '1 hour'), 'new 1', 'the committing session claims a new key');
SELECT is(pg_temp.remote('il_other', $$SELECT idem_complete('il.live', 1, '{"done": 1}')::text$$), '',
          'completes il.live');
SELECT is(pg_temp.remote('il_other', $$SELECT idem_checkpoint('il.upd', 1, 'p1')::text IS NOT NULL$$::text), 'true',
          'and records progress on il.upd, whose lease stays short');
SELECT pg_sleep(0.1);

-- a key inserted after the snapshot
SELECT is(pg_temp.remote_claim('il_rr', 'il.ins', '1 hour'), '40001',
          'RR: a claim of a key committed after the snapshot fails with 40001');
SELECT is(pg_temp.remote_claim('il_ser', 'il.ins', '1 hour'), '40001',
          'SERIALIZABLE: likewise 40001');
SELECT is(pg_temp.remote('il_rr', $$SELECT idem_claim('il.ins', '\xaa'::bytea, '1 hour', wait => false)::text$$), '40001',
          'RR: also with wait => false');
SELECT is(pg_temp.remote_claim('il_rc', 'il.ins', '1 hour'), 'in_progress -',
          'RC: the committed claim is simply in progress');

-- a key completed after the snapshot
SELECT is(pg_temp.remote_claim('il_rr', 'il.live', '1 hour'), 'in_progress -',
          'RR: a key completed after the snapshot still reads as in_progress (no token, nothing written)');
SELECT is(pg_temp.remote_claim('il_ser', 'il.live', '1 hour'), 'in_progress -',
          'SERIALIZABLE: likewise in_progress');
SELECT is(pg_temp.remote_claim('il_rc', 'il.live', '1 hour'), 'replay -',
          'RC: the completion replays');

-- an expired lease whose record changed after the snapshot: the takeover must not happen
SELECT is(pg_temp.remote_claim('il_rr', 'il.upd', '1 hour'), '40001',
          'RR: taking over a record changed after the snapshot fails with 40001');
SELECT is(pg_temp.remote_claim('il_ser', 'il.upd', '1 hour'), '40001',
          'SERIALIZABLE: likewise 40001');
SELECT is(pg_temp.remote('il_other', $$SELECT token || ' ' || recovery_point FROM idem_lookup('il.upd')$$), '1 p1',
          'the failed takeovers changed nothing');
SELECT is(pg_temp.remote_claim('il_rc', 'il.upd', '1 hour'), 'takeover 2',
          'RC: the same takeover succeeds with token 2');

-- an expired lease untouched since the snapshot: every level takes it over
SELECT is(pg_temp.remote_claim('il_' || s, 'il.stale.' || s, '1 hour'), 'takeover 2',
          s || ': an expired lease unchanged since the snapshot is taken over with token 2')
FROM unnest(ARRAY['rc', 'rr', 'ser']) AS s;
SELECT is(pg_temp.remote('il_' || s, format($$SELECT idem_complete(%L, 2, '{}')::text$$, 'il.stale.' || s)), '',
          s || ': and the new owner completes')
FROM unnest(ARRAY['rc', 'rr', 'ser']) AS s;

-- the sessions end; nothing of theirs was committed
SELECT dblink_exec(conn, 'ROLLBACK') FROM unnest(ARRAY['il_rc', 'il_rr', 'il_ser']) AS conn \g /dev/null
SELECT is(pg_temp.remote('il_other', $$SELECT string_agg(key || ':' || token || ':' || status, ' ' ORDER BY key) FROM idempotency_records WHERE key LIKE 'il.%'$$),
          'il.ins:1:processing il.live:1:succeeded il.stale.rc:1:processing il.stale.rr:1:processing il.stale.ser:1:processing il.upd:1:processing',
          'after the rollbacks only the committing session''s work is left');
SELECT is_empty($$SELECT * FROM idempotency_records WHERE key LIKE 'il.%' AND key <> 'il.own'$$,
                'this REPEATABLE READ transaction never saw the other sessions'' commits');
SELECT dblink_exec('il_other', $$DELETE FROM idempotency_records WHERE key LIKE 'il.%'$$) \g /dev/null
DO $$ BEGIN PERFORM setval('idem_token_epoch', 1, false); END $$;  -- a DELETE moves the epoch
SELECT dblink_disconnect(conn) FROM unnest(ARRAY['il_other', 'il_rc', 'il_rr', 'il_ser']) AS conn \g /dev/null

SELECT * FROM finish();
ROLLBACK;
