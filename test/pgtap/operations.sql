-- idem-test: superuser: its other sessions are dblink's, which connects a non-superuser only with a password that the server asks for (the cluster trusts local logins)
-- Operations, as a service and an operator use them.  idem_await returns a
-- finished, unknown or released record at once, no row for an absent key,
-- and a processing record when its timeout has passed; it is woken by
-- another session's committed completion, release or deletion, reads once
-- under REPEATABLE READ, and holds no lock that the owner would wait for.
-- idem_stuck lists unknown outcomes and expired leases, oldest first;
-- idem_summary counts records by scope and status, and the expired finished
-- ones; idem_purge deletes exactly those, never processing (live, abandoned,
-- released) or unknown records; idem_stats needs the library preloaded.
--
-- The other sessions are dblink connections ("owner" claims and finishes
-- keys, "waiter" awaits them); what they commit is deleted after the
-- ROLLBACK at the end (and here first, should an earlier run have died).
-- Keys are prefixed "ot.", scopes "ot.*", roles are regress_idem_*; all the
-- rest is rolled back.  Timing checks are functional, with wide margins: an
-- await that must return early has a 5 s timeout and must take under 2 s.
BEGIN;
SELECT plan(75);
-- a wait that never ends (a dblink call blocked on this transaction) fails the file instead
SET LOCAL statement_timeout = '60s';

-- The other sessions.  The owner first deletes what an earlier run may have
-- left, before this transaction holds any row it could wait for.
CREATE EXTENSION IF NOT EXISTS dblink;
CREATE FUNCTION pg_temp.conninfo() RETURNS text LANGUAGE sql AS $$
    SELECT format('host=%s port=%s dbname=%s user=%s options=-cstatement_timeout=20s',
                  trim(split_part(current_setting('unix_socket_directories'), ',', 1)),
                  current_setting('port'), current_database(), current_user)
$$;
SELECT is(dblink_connect('ot_owner', pg_temp.conninfo()), 'OK', 'a second session: the owner');
SELECT is(dblink_connect('ot_waiter', pg_temp.conninfo()), 'OK', 'a third session: a waiter');
SELECT ok(dblink_exec('ot_owner', $$DELETE FROM idempotency_records WHERE key LIKE 'ot.%'$$) LIKE 'DELETE %',
          'the owner deletes what an earlier run left');

-- Expired rows committed by others would be counted by the purges below.
-- Purging moves the token epoch (not transactional): put it back.
SELECT ok(idem_purge() >= 0, 'expired rows left by others are purged first (rolled back at the end)');
DO $$ BEGIN PERFORM setval('idem_token_epoch', 1, false); END $$;

-- What an await returned, and how long it took.
CREATE TEMP TABLE aw (label text PRIMARY KEY, took interval, n int, status text, has_lease boolean,
                      token bigint, result jsonb, error jsonb, response_code int);
CREATE FUNCTION pg_temp.await(label text, k text, timeout interval, s text DEFAULT '') RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
BEGIN
    INSERT INTO aw (label, n, status, has_lease, token, result, error, response_code)
    SELECT label, count(*) OVER (), a.status::text, a.lease_expires_at IS NOT NULL, a.token,
           a.result, a.error, a.response_code
    FROM idem_await(k, s, timeout) a;
    IF NOT FOUND THEN
        INSERT INTO aw (label, n) VALUES (label, 0);
    END IF;
    UPDATE aw SET took = clock_timestamp() - t0 WHERE aw.label = await.label;
END
$$;
-- The message and hint of the error a statement raises.
CREATE FUNCTION pg_temp.error_of(sql text, OUT state text, OUT message text, OUT hint text)
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE sql;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT, hint = PG_EXCEPTION_HINT;
END
$$;

-- statistics -------------------------------------------------------------------------------------
-- The SQL edition has no counters (README, "What needs the C library"):
-- idem_stats and idem_stats_reset raise the same 55000, with a hint of its own.
SELECT NOT EXISTS (SELECT FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
                   WHERE p.proname = 'idem_claim' AND l.lanname = 'c'
                     AND p.pronamespace = (SELECT extnamespace FROM pg_extension WHERE extname = 'idempotency'))
       AS sql_edition \gset
\if :sql_edition
SELECT results_eq($$SELECT * FROM pg_temp.error_of('SELECT * FROM idem_stats()')$$,
                  $$VALUES ('55000', 'idempotency statistics are not available',
                            'Statistics are not available in the SQL edition: watch the views idem_summary and idem_stuck, '
                            'and pg_stat_user_functions (track_functions = pl).')$$,
                  'the SQL edition: idem_stats raises 55000 with a hint');
SELECT results_eq($$SELECT * FROM pg_temp.error_of('SELECT idem_stats_reset()')$$,
                  $$VALUES ('55000', 'idempotency statistics are not available',
                            'Statistics are not available in the SQL edition: watch the views idem_summary and idem_stuck, '
                            'and pg_stat_user_functions (track_functions = pl).')$$,
                  'and idem_stats_reset too');
\else
SELECT CASE WHEN current_setting('shared_preload_libraries') ~ '(^|[ ,])idempotency($|[ ,])'
    THEN skip('the library is preloaded: statistics are available (test/t covers them)', 2)
    ELSE collect_tap(
        results_eq($$SELECT * FROM pg_temp.error_of('SELECT * FROM idem_stats()')$$,
                   $$VALUES ('55000', 'idempotency statistics are not available',
                             'Add idempotency to shared_preload_libraries and restart the server.')$$,
                   'without shared_preload_libraries idem_stats raises 55000 with a hint'),
        results_eq($$SELECT * FROM pg_temp.error_of('SELECT idem_stats_reset()')$$,
                   $$VALUES ('55000', 'idempotency statistics are not available',
                             'Add idempotency to shared_preload_libraries and restart the server.')$$,
                   'and idem_stats_reset too'))
    END;
\endif

-- idem_await: arguments --------------------------------------------------------------------------------
SELECT throws_ok($$SELECT * FROM idem_await(NULL)$$, '22004', 'idempotency key must not be null', 'a NULL key: 22004');
SELECT throws_ok($$SELECT * FROM idem_await('ot.a', NULL)$$, '22004', 'scope must not be null', 'a NULL scope: 22004');
SELECT throws_ok($$SELECT * FROM idem_await('ot.a', '', NULL)$$, '22004', 'timeout must not be null',
                 'a NULL timeout: 22004');
SELECT throws_ok($$SELECT * FROM idem_await('ot.a', '', '-1 s')$$, '22023', 'timeout must not be negative',
                 'a negative timeout: 22023');
SELECT throws_ok($$SELECT * FROM idem_await('', '', '1 s')$$, '22023', 'idempotency key must not be empty',
                 'an empty key: 22023');

-- idem_await in this transaction (it sees the transaction's own changes) ---------------------------------
DO $$
BEGIN
    PERFORM idem_claim('ot.done', '\x01', '1 hour');
    PERFORM idem_complete('ot.done', 1, '{"id": 1}', 201);
    PERFORM idem_claim('ot.failed', '\x01', '1 hour');
    PERFORM idem_fail('ot.failed', 1, '{"code": "busy"}', retryable => true, response_code => 503);
    PERFORM idem_claim('ot.busy', '\x01', '1 hour');
    PERFORM idem_claim('ot.unknown', '\x01', '1 hour');
    PERFORM idem_mark_unknown('ot.unknown', 1, '{"gateway": "timeout"}');
    PERFORM idem_claim('ot.released', '\x01', '1 hour');
    PERFORM idem_release('ot.released', 1);
    PERFORM idem_claim('ot.abandoned', '\x01', '50 ms');
    PERFORM pg_sleep(0.1);
END
$$;

SELECT pg_temp.await('missing', 'ot.missing', '5 s');
SELECT results_eq($$SELECT n, took < '2 s' FROM aw WHERE label = 'missing'$$, $$VALUES (0, true)$$,
                  'an absent key: no row, at once');
SELECT pg_temp.await('done', 'ot.done', '5 s');
SELECT results_eq($$SELECT n, status, has_lease, result, response_code, took < '2 s' FROM aw WHERE label = 'done'$$,
                  $$VALUES (1, 'succeeded', false, '{"id": 1}'::jsonb, 201, true)$$,
                  'a succeeded record: returned at once with its result');
SELECT is((SELECT to_jsonb(a) - 'token' FROM idem_await('ot.done', '', '0') a),
          (SELECT to_jsonb(l) - 'token' FROM idem_lookup('ot.done') l),
          'idem_await returns the record as idem_lookup does');
SELECT is((SELECT a.token FROM idem_await('ot.done', '', '0') a), NULL,
          'but not its fencing token: a waiter is no owner');
SELECT pg_temp.await('failed', 'ot.failed', '5 s');
SELECT results_eq($$SELECT n, status, error, response_code, took < '2 s' FROM aw WHERE label = 'failed'$$,
                  $$VALUES (1, 'failed', '{"code": "busy"}'::jsonb, 503, true)$$,
                  'a (retryable) failure: returned at once');
SELECT pg_temp.await('unknown', 'ot.unknown', '5 s');
SELECT results_eq($$SELECT n, status, error, took < '2 s' FROM aw WHERE label = 'unknown'$$,
                  $$VALUES (1, 'unknown', '{"gateway": "timeout"}'::jsonb, true)$$,
                  'an unknown outcome: returned at once');
SELECT pg_temp.await('released', 'ot.released', '5 s');
SELECT results_eq($$SELECT n, status, has_lease, token, took < '2 s' FROM aw WHERE label = 'released'$$,
                  $$VALUES (1, 'processing', false, NULL::bigint, true)$$,
                  'a released record: processing without a lease, returned at once');
SELECT pg_temp.await('busy', 'ot.busy', '100 ms');
SELECT results_eq($$SELECT n, status, has_lease, token FROM aw WHERE label = 'busy'$$,
                  $$VALUES (1, 'processing', true, NULL::bigint)$$,
                  'a processing record with a live lease: returned as it is when the timeout passes');
SELECT ok((SELECT took >= '100 ms' AND took < '2 s' FROM aw WHERE label = 'busy'),
          'after waiting out the 100 ms timeout, not much longer');
SELECT pg_temp.await('busy-0', 'ot.busy', '0');
SELECT results_eq($$SELECT n, status, took < '1 s' FROM aw WHERE label = 'busy-0'$$,
                  $$VALUES (1, 'processing', true)$$, 'a zero timeout is a plain read: at once');
SELECT pg_temp.await('abandoned', 'ot.abandoned', '5 s');
SELECT results_eq($$SELECT n, status, has_lease, took < '2 s' FROM aw WHERE label = 'abandoned'$$,
                  $$VALUES (1, 'processing', true, true)$$,
                  'an abandoned record (lease expired) is returned at once: nobody will finish it, claim it');
SELECT pg_temp.await('busy-scope', 'ot.busy', '5 s', 'ot.other');
SELECT results_eq($$SELECT n, took < '2 s' FROM aw WHERE label = 'busy-scope'$$, $$VALUES (0, true)$$,
                  'the same key in another scope: no row, at once');
SELECT lives_ok($$SELECT idem_complete('ot.busy', 1, '{"id": 2}')$$, 'the owner completes');
SELECT pg_temp.await('busy-done', 'ot.busy', '5 s');
SELECT results_eq($$SELECT status, result, took < '2 s' FROM aw WHERE label = 'busy-done'$$,
                  $$VALUES ('succeeded', '{"id": 2}'::jsonb, true)$$,
                  'after the completion in the same transaction: succeeded at once');

-- idem_stuck --------------------------------------------------------------------------------------------------
DO $$
BEGIN
    PERFORM idem_claim('ot.st.a', '\x01', '50 ms');
    PERFORM idem_claim('ot.st.b', '\x01', '1 hour');
    PERFORM idem_mark_unknown('ot.st.b', 1, '{"gateway": "timeout"}');
    PERFORM idem_claim('ot.st.live', '\x01', '1 hour');
    PERFORM idem_claim('ot.st.done', '\x01', '1 hour');
    PERFORM idem_complete('ot.st.done', 1);
    PERFORM idem_claim('ot.st.released', '\x01', '1 hour');
    PERFORM idem_release('ot.st.released', 1);
    PERFORM idem_claim('ot.st.c', '\x01', '50 ms');
    PERFORM idem_checkpoint('ot.st.c', 1, 'step 1');
    PERFORM pg_sleep(0.1);
END
$$;
-- ot.st.a is taken over (keeping its created_at) and abandoned again
SELECT is((SELECT outcome FROM idem_claim('ot.st.a', '\x01', '50 ms')), 'takeover', 'ot.st.a is taken over');
DO $$
BEGIN
    PERFORM idem_claim('ot.st.d', '\x01', '1 hour');
    PERFORM idem_mark_unknown('ot.st.d', 1, '{"gateway": "reset"}');
    PERFORM pg_sleep(0.1);
END
$$;
SELECT results_eq(
    $$SELECT key COLLATE "default", status::text, reason, attempts, recovery_point, error FROM idem_stuck WHERE key LIKE 'ot.st.%'$$,
    $$VALUES ('ot.st.a', 'processing', 'lease expired', 2, NULL, NULL::jsonb),
             ('ot.st.b', 'unknown', 'unknown outcome', 1, NULL, '{"gateway": "timeout"}'),
             ('ot.st.c', 'processing', 'lease expired', 1, 'step 1', NULL),
             ('ot.st.d', 'unknown', 'unknown outcome', 1, NULL, '{"gateway": "reset"}')$$,
    'idem_stuck: unknown outcomes and expired leases, oldest first; not live, finished or released records');
SELECT ok((SELECT bool_and(age > '0' AND age < '1 minute' AND age <= clock_timestamp() - created_at)
           FROM idem_stuck WHERE key LIKE 'ot.st.%'), 'age is the time since created_at');
SELECT lives_ok($$SELECT idem_resolve('ot.st.b', 'succeeded', '{}')$$, 'resolving ot.st.b');
SELECT is((SELECT outcome FROM idem_claim('ot.st.c', '\x01', '1 hour')), 'takeover', 'taking ot.st.c over');
SELECT results_eq($$SELECT key COLLATE "default" FROM idem_stuck WHERE key LIKE 'ot.st.%'$$,
                  $$VALUES ('ot.st.a'), ('ot.st.d')$$, 'takes them off the list');

-- idem_summary ------------------------------------------------------------------------------------------------
DO $$
BEGIN
    PERFORM idem_claim('ot.sum1', '\x01', '1 hour', 'ot.s1', '1 hour');
    PERFORM idem_complete('ot.sum1', 1, scope => 'ot.s1');
    PERFORM idem_claim('ot.sum2', '\x01', '1 hour', 'ot.s1', '50 ms');
    PERFORM idem_complete('ot.sum2', 1, scope => 'ot.s1');
    PERFORM idem_claim('ot.sum3', '\x01', '1 hour', 'ot.s1', '50 ms');
    PERFORM idem_fail('ot.sum3', 1, '{}', false, scope => 'ot.s1');
    PERFORM idem_claim('ot.sum4', '\x01', '1 hour', 'ot.s1', '50 ms');
    PERFORM idem_claim('ot.sum5', '\x01', '1 hour', 'ot.s1', '50 ms');
    PERFORM idem_mark_unknown('ot.sum5', 1, '{}', scope => 'ot.s1');
    PERFORM idem_claim('ot.sum1', '\x01', '1 hour', 'ot.s2', '50 ms');
    PERFORM idem_fail('ot.sum1', 1, '{}', true, scope => 'ot.s2');
    PERFORM idem_claim('ot.sum2', '\x01', '1 hour', 'ot.s2', '50 ms');
    PERFORM idem_release('ot.sum2', 1, scope => 'ot.s2');
    PERFORM pg_sleep(0.1);
END
$$;
SELECT results_eq(
    $$SELECT scope COLLATE "default", status::text, records, expired FROM idem_summary WHERE scope LIKE 'ot.%'$$,
    $$VALUES ('ot.s1', 'processing', 1::bigint, 0::bigint), ('ot.s1', 'succeeded', 2, 1), ('ot.s1', 'failed', 1, 1),
             ('ot.s1', 'unknown', 1, 0), ('ot.s2', 'processing', 1, 1), ('ot.s2', 'failed', 1, 1)$$,
    'idem_summary: records by scope and status; expired = finished or released, and past expires_at');
SELECT ok((SELECT bool_and(s.oldest = (SELECT min(created_at) FROM idempotency_records r
                                       WHERE r.scope = s.scope AND r.status = s.status))
           FROM idem_summary s WHERE scope LIKE 'ot.%'), 'oldest is the earliest created_at of the group');

-- idem_await against other sessions (dblink) ---------------------------------------------------------------
-- Collect the results of an asynchronous query; returns how many statements ran.
CREATE FUNCTION pg_temp.drain(conn text) RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    statements int := 0;
BEGIN
    LOOP
        PERFORM 1 FROM dblink_get_result(conn) AS t(v text);
        EXIT WHEN NOT FOUND;
        statements := statements + 1;
    END LOOP;
    RETURN statements;
END
$$;
CREATE TEMP TABLE owned (key text PRIMARY KEY, token bigint);
CREATE FUNCTION pg_temp.owner_claims(k text, lease interval DEFAULT '1 hour') RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO owned
    SELECT k, t.token FROM dblink('ot_owner',
        format('SELECT token FROM idem_claim(%L, %L, %L)', k, '\x01', lease)) AS t(token bigint)
    RETURNING token
$$;

-- woken by the owner's completion
SELECT ok(pg_temp.owner_claims('ot.wake') IS NOT NULL, 'the owner claims ot.wake and commits');
SELECT results_eq($$SELECT status::text, token FROM idem_lookup('ot.wake')$$,
                  $$SELECT 'processing', token FROM owned WHERE key = 'ot.wake'$$,
                  'this session sees the committed claim');
SELECT is(dblink_send_query('ot_owner',
              format('SELECT pg_sleep(0.3); SELECT idem_complete(%L, %s, %L, 201)',
                     'ot.wake', (SELECT token FROM owned WHERE key = 'ot.wake'), '{"woken": true}')),
          1, 'the owner will complete it in 0.3 s (asynchronously)');
SELECT pg_temp.await('wake', 'ot.wake', '5 s');
SELECT results_eq($$SELECT n, status, result, response_code, has_lease FROM aw WHERE label = 'wake'$$,
                  $$VALUES (1, 'succeeded', '{"woken": true}'::jsonb, 201, false)$$,
                  'idem_await (5 s) returns the committed completion');
SELECT ok((SELECT took >= '100 ms' AND took < '2 s' FROM aw WHERE label = 'wake'),
          'it waited for the completion, and returned soon after it, long before the timeout');
SELECT is(pg_temp.drain('ot_owner'), 2, 'both statements of the owner ran');

-- a timeout against a committed processing record
SELECT ok(pg_temp.owner_claims('ot.slow') IS NOT NULL, 'the owner claims ot.slow and commits');
SELECT pg_temp.await('slow', 'ot.slow', '300 ms');
SELECT results_eq($$SELECT n, status, has_lease, token FROM aw WHERE label = 'slow'$$,
                  $$VALUES (1, 'processing', true, NULL::bigint)$$,
                  'idem_await returns the processing record when the timeout passes');
SELECT ok((SELECT took >= '300 ms' AND took < '2.3 s' FROM aw WHERE label = 'slow'),
          'after the 300 ms timeout, not much longer');

-- woken by a release, and by the record going away
SELECT ok(pg_temp.owner_claims('ot.rel') IS NOT NULL, 'the owner claims ot.rel and commits');
SELECT is(dblink_send_query('ot_owner',
              format('SELECT pg_sleep(0.3); SELECT idem_release(%L, %s)',
                     'ot.rel', (SELECT token FROM owned WHERE key = 'ot.rel'))),
          1, 'the owner will release it in 0.3 s');
SELECT pg_temp.await('rel', 'ot.rel', '5 s');
SELECT results_eq($$SELECT n, status, has_lease, took < '2 s' FROM aw WHERE label = 'rel'$$,
                  $$VALUES (1, 'processing', false, true)$$,
                  'idem_await returns the released record (no lease) soon after the release');
SELECT is(pg_temp.drain('ot_owner'), 2, 'both statements of the owner ran');
SELECT ok(pg_temp.owner_claims('ot.gone') IS NOT NULL, 'the owner claims ot.gone and commits');
SELECT is(dblink_send_query('ot_owner',
              $$SELECT pg_sleep(0.3); DELETE FROM idempotency_records WHERE key = 'ot.gone'$$),
          1, 'the record will be deleted in 0.3 s');
SELECT pg_temp.await('gone', 'ot.gone', '5 s');
SELECT results_eq($$SELECT n, took < '2 s' FROM aw WHERE label = 'gone'$$, $$VALUES (0, true)$$,
                  'idem_await returns no row soon after the record went');
SELECT is(pg_temp.drain('ot_owner'), 2, 'both statements of the owner ran');
DO $$ BEGIN PERFORM setval('idem_token_epoch', 1, false); END $$;  -- the DELETE moved the epoch

-- the waiter holds no lock that the owner needs
SELECT ok(pg_temp.owner_claims('ot.hold') IS NOT NULL, 'the owner claims ot.hold and commits');
CREATE TEMP TABLE waiter AS SELECT pid FROM dblink('ot_waiter', 'SELECT pg_backend_pid()') AS t(pid int);
SELECT is(dblink_send_query('ot_waiter', $$SELECT status FROM idem_await('ot.hold', '', '1.5 s')$$),
          1, 'the waiter awaits ot.hold for 1.5 s');
DO $$ BEGIN PERFORM pg_sleep(0.3); END $$;
-- The SQL edition's idem_await sleeps in pg_sleep between its reads (no
-- latch to wait on without the library), and its first read is planned,
-- which locks every index of the table (AccessShareLock, to the end of the
-- transaction), and it holds an advisory lock as its waiter's place: a wait
-- event of its own, and the same absence of row locks.
\if :sql_edition
SELECT results_eq($$SELECT state, wait_event_type, wait_event, backend_xid IS NULL
                    FROM pg_stat_activity WHERE pid = (SELECT pid FROM waiter)$$,
                  $$VALUES ('active', 'Timeout', 'PgSleep', true)$$,
                  'the SQL edition: the waiter sleeps in pg_sleep (wait event PgSleep), without a transaction id');
SELECT results_eq($$SELECT locktype, coalesce(relation::regclass::text, ''), mode, granted
                    FROM pg_locks WHERE pid = (SELECT pid FROM waiter) ORDER BY 1, 2$$,
                  $$SELECT 'relation', c.oid::regclass::text, 'AccessShareLock', true
                    FROM pg_class c
                    WHERE c.oid = 'idempotency_records'::regclass
                       OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'idempotency_records'::regclass)
                    UNION ALL SELECT 'virtualxid', '', 'ExclusiveLock', true
                    -- its waiter's place (idempotency.max_waiters)
                    UNION ALL SELECT 'advisory', '', 'ExclusiveLock', true
                    ORDER BY 1, 2$$,
                  'its only locks: AccessShareLock on the table and its indexes, its waiter''s place (no row lock)');
\else
SELECT results_eq($$SELECT state, wait_event_type, wait_event, backend_xid IS NULL
                    FROM pg_stat_activity WHERE pid = (SELECT pid FROM waiter)$$,
                  $$VALUES ('active', 'Extension', 'Extension', true)$$,
                  'the waiter sleeps on its latch (wait event Extension), without a transaction id');
SELECT results_eq($$SELECT locktype, coalesce(relation::regclass::text, ''), mode, granted
                    FROM pg_locks WHERE pid = (SELECT pid FROM waiter) ORDER BY 1, 2$$,
                  $$VALUES ('relation', 'idempotency_records', 'AccessShareLock', true),
                           ('relation', 'idempotency_records_pkey', 'AccessShareLock', true),
                           ('virtualxid', '', 'ExclusiveLock', true)$$,
                  'its only locks: AccessShareLock on the table and its index (no row lock)');
\endif
SET LOCAL lock_timeout = '1s';
CREATE TEMP TABLE t_hold AS SELECT clock_timestamp() AS t0;
SELECT lives_ok(format('SELECT idem_complete(%L, %s, %L)', 'ot.hold',
                       (SELECT token FROM owned WHERE key = 'ot.hold'), '{"held": false}'),
                'the owner''s idem_complete succeeds while the waiter waits (lock_timeout 1 s)');
SELECT ok((SELECT clock_timestamp() - t0 < '1 s' FROM t_hold), 'without waiting');
SET LOCAL lock_timeout = 0;
SELECT is((SELECT status FROM dblink_get_result('ot_waiter') AS t(status text)), 'processing',
          'the waiter does not see the uncommitted completion: processing when its timeout passes');
SELECT is(pg_temp.drain('ot_waiter'), 0, 'and it ran nothing else');

-- REPEATABLE READ: one read from the transaction's snapshot
SELECT ok(pg_temp.owner_claims('ot.rr') IS NOT NULL, 'the owner claims ot.rr and commits');
SELECT is(dblink_exec('ot_waiter', 'BEGIN ISOLATION LEVEL REPEATABLE READ'), 'BEGIN',
          'the waiter begins a REPEATABLE READ transaction');
SELECT results_eq($$SELECT * FROM dblink('ot_waiter',
                      $q$SELECT status::text, clock_timestamp() - statement_timestamp() < '2 s'
                         FROM idem_await('ot.rr', '', '5 s')$q$) AS t(status text, at_once boolean)$$,
                  $$VALUES ('processing', true)$$,
                  'under REPEATABLE READ a processing record is returned at once');
SELECT lives_ok(format('SELECT * FROM dblink(%L, %L) AS t(v text)', 'ot_owner',
                       format('SELECT idem_complete(%L, %s)', 'ot.rr', (SELECT token FROM owned WHERE key = 'ot.rr'))),
                'the owner completes ot.rr and commits');
SELECT results_eq($$SELECT * FROM dblink('ot_waiter',
                      $q$SELECT status::text, clock_timestamp() - statement_timestamp() < '2 s'
                         FROM idem_await('ot.rr', '', '5 s')$q$) AS t(status text, at_once boolean)$$,
                  $$VALUES ('processing', true)$$,
                  'the snapshot cannot show the completion: still processing, at once');
SELECT is(dblink_exec('ot_waiter', 'COMMIT'), 'COMMIT', 'and ends it');
SELECT results_eq($$SELECT * FROM dblink('ot_waiter',
                      $q$SELECT status::text FROM idem_await('ot.rr', '', '5 s')$q$) AS t(status text)$$,
                  $$VALUES ('succeeded')$$, 'a new transaction sees it');

SELECT is(dblink_disconnect('ot_owner'), 'OK', 'the owner disconnects');
SELECT is(dblink_disconnect('ot_waiter'), 'OK', 'the waiter disconnects');

-- idem_purge -------------------------------------------------------------------------------------------------
DO $$
BEGIN
    PERFORM idem_claim('ot.pu.succeeded', '\x01', '1 hour', retention => '50 ms');
    PERFORM idem_complete('ot.pu.succeeded', 1);
    PERFORM idem_claim('ot.pu.failed', '\x01', '1 hour', retention => '50 ms');
    PERFORM idem_fail('ot.pu.failed', 1, '{}', false);
    PERFORM idem_claim('ot.pu.retryable', '\x01', '1 hour', retention => '50 ms');
    PERFORM idem_fail('ot.pu.retryable', 1, '{}', true);
    PERFORM idem_claim('ot.pu.live', '\x01', '1 hour', retention => '1 hour');
    PERFORM idem_complete('ot.pu.live', 1);
    PERFORM idem_claim('ot.pu.processing', '\x01', '1 hour', retention => '50 ms');
    PERFORM idem_claim('ot.pu.abandoned', '\x01', '50 ms', retention => '50 ms');
    PERFORM idem_claim('ot.pu.unknown', '\x01', '1 hour', retention => '50 ms');
    PERFORM idem_mark_unknown('ot.pu.unknown', 1, '{}');
    PERFORM idem_claim('ot.pu.released', '\x01', '1 hour', retention => '50 ms');
    PERFORM idem_release('ot.pu.released', 1);
    PERFORM pg_sleep(0.1);
END
$$;
SELECT ok((SELECT bool_and(expires_at < clock_timestamp()) FROM idempotency_records
           WHERE key LIKE 'ot.pu.%' AND key <> 'ot.pu.live'), 'all but ot.pu.live are past expires_at');
SELECT is(idem_purge(), 8::bigint,
          'idem_purge deletes the 3 expired finished and the released ot.pu records, and the 4 expired ones of the summary');
SELECT results_eq($$SELECT key COLLATE "default", status::text FROM idempotency_records WHERE key LIKE 'ot.pu.%' ORDER BY key$$,
                  $$VALUES ('ot.pu.abandoned', 'processing'), ('ot.pu.live', 'succeeded'),
                           ('ot.pu.processing', 'processing'), ('ot.pu.unknown', 'unknown')$$,
                  'it keeps a live succeeded record and every owned (live or abandoned) or unknown one; the released one goes');
SELECT is(idem_purge(), 0::bigint, 'a second purge finds nothing');
SELECT is((SELECT sum(expired) FROM idem_summary WHERE scope LIKE 'ot.%'), 0::numeric,
          'and idem_summary counts nothing expired');
SELECT results_eq($$SELECT outcome, token FROM idem_claim('ot.pu.released', '\x02', '1 hour')$$,
                  $$VALUES ('new', 65537::bigint)$$,
                  'the purged released key is new again, with a token of the next epoch');

-- idem_await reads with the caller's privileges and row-level security ----------------------------------------
CREATE ROLE regress_idem_ops_tenant;
GRANT EXECUTE ON FUNCTION idem_await(text, text, interval) TO regress_idem_ops_tenant;
GRANT SELECT ON idempotency_records, idem_stuck TO regress_idem_ops_tenant;
GRANT SELECT, INSERT, UPDATE ON aw TO regress_idem_ops_tenant;
ALTER TABLE idempotency_records ENABLE ROW LEVEL SECURITY;
CREATE POLICY ot_tenant ON idempotency_records TO regress_idem_ops_tenant USING (scope = 'ot.s1');
SET LOCAL ROLE regress_idem_ops_tenant;
SELECT pg_temp.await('rls-hidden', 'ot.done', '5 s');
SELECT pg_temp.await('rls-done', 'ot.sum1', '5 s', 'ot.s1');
SELECT pg_temp.await('rls-busy', 'ot.sum4', '100 ms', 'ot.s1');
RESET ROLE;
SELECT results_eq($$SELECT label, n, status, took < '2 s' OR label = 'rls-busy', took >= '100 ms' OR label <> 'rls-busy'
                    FROM aw WHERE label LIKE 'rls-%' ORDER BY label$$,
                  $$VALUES ('rls-busy', 1, 'processing', true, true), ('rls-done', 1, 'succeeded', true, true),
                           ('rls-hidden', 0, NULL, true, true)$$,
                  'under a policy: a hidden record is absent, a visible one is returned, a processing one waited for');
SET LOCAL ROLE regress_idem_ops_tenant;
SELECT results_eq($$SELECT key COLLATE "default" FROM idem_stuck WHERE key LIKE 'ot.%'$$, $$VALUES ('ot.sum5')$$,
                  'idem_stuck shows only the rows the policy lets the caller see');
RESET ROLE;

-- purges moved the token epoch (not transactional); later files expect token 1
DO $$ BEGIN PERFORM setval('idem_token_epoch', 1, false); END $$;
SELECT * FROM finish();
ROLLBACK;

-- what the other sessions committed
DELETE FROM idempotency_records WHERE key LIKE 'ot.%';
DO $$ BEGIN PERFORM setval('idem_token_epoch', 1, false); END $$;  -- a DELETE moves the epoch
