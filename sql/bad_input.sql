--
-- The bad-input matrix (issue #7): every function of the extension, called
-- with a NULL in each argument where NULL has no documented meaning, empty
-- strings, 256-byte and 1 MB keys and names, zero and negative intervals,
-- wrong tokens, unknown keys and machines, and hostile identifiers (quotes,
-- semicolons, spaces).  Each case must fail with a clear error and write
-- nothing.
--
-- One line per case:  input | outcome, where the outcome is
--   ok <SQLSTATE> <message>     the expected error (or 00000 and the value,
--                               for the few cases that succeed without writing)
--   UNEXPECTED ...              anything else, with the SQLSTATE expected
-- Messages longer than 110 bytes are cut, with their length in bytes.  An
-- outcome ending in "(N row writes rolled back)" is a call that wrote N rows
-- of a user table (counted by pg_stat_xact_user_tables, which counts the
-- writes of aborted subtransactions too) before its error undid them.
--
-- "Writes nothing" is checked after each group: the rows of
-- idempotency_records, idem_inbox, idem_inbox_streams, idem_machines,
-- idem_machine_moves, idem_settings and of this test's tables, the token
-- epoch and the triggers on this test's tables are compared with a snapshot
-- taken before.
--
-- Bad input that works (hostile identifiers, 1 MB and 10 MB values) is at
-- the end.  errors.sql shows the DETAIL and HINT of the record functions'
-- errors; machines.sql and inbox.sql those of the others.
--
\set SHOW_CONTEXT never

-- The SQL edition (sql/edition, no C library) answers two groups of cases by
-- design otherwise (test/edition/expected/bad_input.out): the settings
-- (below) and a trigger function called directly, which PL/pgSQL refuses
-- (0A000) before its body could say how it must be fired (39P01).
SELECT NOT EXISTS (SELECT FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
                   WHERE p.proname = 'idem_claim' AND l.lanname = 'c'
                     AND p.pronamespace = (SELECT extnamespace FROM pg_extension WHERE extname = 'idempotency'))
       AS sql_edition \gset
\if :sql_edition
\set trigger_called_directly 0A000
\else
\set trigger_called_directly 39P01
\endif

CREATE FUNCTION pg_temp.try(sql text, expected text) RETURNS text
LANGUAGE plpgsql AS $f$
DECLARE
    st text;
    msg text;
    res text;
    writes_before bigint;
    writes_after bigint;
    outcome text;
BEGIN
    SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) INTO writes_before
    FROM pg_stat_xact_user_tables;
    BEGIN
        IF sql ~* '^\s*(SELECT|WITH|VALUES|TABLE)\M' THEN
            EXECUTE sql INTO res;
        ELSE
            EXECUTE sql;
        END IF;
        st := '00000';
        msg := coalesce(res, 'NULL');
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
    END;
    SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) INTO writes_after
    FROM pg_stat_xact_user_tables;
    IF octet_length(msg) > 110 THEN
        msg := left(msg, 80) || format('... (%s bytes)', octet_length(msg));
    END IF;
    IF expected LIKE '%|%' AND st = ANY (string_to_array(expected, '|')) THEN
        outcome := 'ok, one of ' || expected;     -- depends on the server's setup
    ELSIF st = expected THEN
        outcome := 'ok ' || st || ' ' || msg;
    ELSE
        outcome := format('UNEXPECTED %s %s (expected %s)', st, msg, expected);
    END IF;
    IF writes_after <> writes_before AND st = '00000' THEN
        outcome := outcome || format(' (wrote %s rows)', writes_after - writes_before);
    ELSIF writes_after <> writes_before THEN
        outcome := outcome || format(' (%s row writes rolled back)', writes_after - writes_before);
    END IF;
    RETURN outcome;
END
$f$;

-- What "writes nothing" compares: one md5 per table over its rows in key
-- order, the token epoch, and the triggers and tables of this test.
CREATE FUNCTION pg_temp.state() RETURNS TABLE (what text, rows bigint, digest text)
LANGUAGE plpgsql AS $f$
BEGIN
    RETURN QUERY
    SELECT 'idempotency_records', count(*), md5(string_agg(t::text, ',' ORDER BY scope, key))
      FROM idempotency_records t
    UNION ALL
    SELECT 'idem_inbox', count(*), md5(string_agg(t::text, ',' ORDER BY consumer, message_id))
      FROM idem_inbox t
    UNION ALL
    SELECT 'idem_inbox_streams', count(*), md5(string_agg(t::text, ',' ORDER BY consumer, stream))
      FROM idem_inbox_streams t
    UNION ALL
    SELECT 'idem_machines', count(*), md5(string_agg(t::text, ',' ORDER BY name)) FROM idem_machines t
    UNION ALL
    SELECT 'idem_machine_moves', count(*),
           md5(string_agg(t::text, ',' ORDER BY machine, from_state, to_state)) FROM idem_machine_moves t
    UNION ALL
    SELECT 'idem_settings', count(*), md5(string_agg(t::text, ',')) FROM idem_settings t
    UNION ALL
    SELECT 'idem_token_epoch', last_value, is_called::text FROM idem_token_epoch
    UNION ALL
    SELECT 'triggers and tables', count(*), md5(string_agg(name, ',' ORDER BY name))
      FROM (SELECT c.relname || '.' || t.tgname AS name
              FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
             WHERE NOT t.tgisinternal AND c.relname LIKE 'bi%'
            UNION ALL
            SELECT relname FROM pg_class
             WHERE relname LIKE 'bi%' AND relnamespace = 'public'::regnamespace) objects;
    IF to_regclass('bi_orders') IS NOT NULL THEN
        RETURN QUERY EXECUTE $q$
        SELECT 'bi_* tables', count(*), md5(string_agg(r, ',' ORDER BY r))
          FROM (SELECT 'o' || t::text AS r FROM bi_orders t
                UNION ALL SELECT 'n' || t::text FROM bi_nopk t
                UNION ALL SELECT 't' || t::text FROM bi_two t
                UNION ALL SELECT 'p' || t::text FROM bi_plain t
                UNION ALL SELECT 'k' || t::text FROM bi_pk2 t) rows $q$;
    END IF;
END
$f$;

CREATE TEMP TABLE snapshot (name text, what text, rows bigint, digest text);
CREATE FUNCTION pg_temp.take_snapshot(name text) RETURNS void LANGUAGE sql AS $f$
    DELETE FROM snapshot WHERE snapshot.name = take_snapshot.name;
    INSERT INTO snapshot SELECT take_snapshot.name, * FROM pg_temp.state();
$f$;
-- 'nothing written', or what changed since the snapshot
CREATE FUNCTION pg_temp.written(since text DEFAULT 'fixtures') RETURNS text LANGUAGE sql AS $f$
    SELECT coalesce('CHANGED: ' || string_agg(coalesce(s.what, n.what), ', ' ORDER BY coalesce(s.what, n.what)),
                    'nothing written')
    FROM (SELECT * FROM snapshot WHERE name = since) s FULL JOIN pg_temp.state() n USING (what)
    WHERE s.rows IS DISTINCT FROM n.rows OR s.digest IS DISTINCT FROM n.digest
$f$;

SELECT pg_temp.take_snapshot('start');
CREATE TEMP TABLE epoch_at_start AS SELECT last_value, is_called FROM idem_token_epoch;

--
-- Fixtures.  Tokens count from 1.
--
SELECT setval('idem_token_epoch', 1, false) AS epoch_reset;
--   bi-proc      processing, token 1, lease of an hour
--   bi-done      succeeded, token 1
--   bi-failed    failed, not retryable, token 1
--   bi-unknown   unknown, token 1
--   bi-released  released: its current token, 2, belongs to nobody
SELECT k, (SELECT token FROM idem_claim(k, idem_fingerprint(k), '1 hour')) AS token
FROM unnest('{bi-proc,bi-done,bi-failed,bi-unknown,bi-released}'::text[]) k;
SELECT idem_complete('bi-done', 1, '{"ok": true}', 200),
       idem_fail('bi-failed', 1, '{"error": "declined"}', retryable => false),
       idem_mark_unknown('bi-unknown', 1, '{"timeout": true}'),
       idem_release('bi-released', 1);
SELECT key, token, status, lease_expires_at IS NOT NULL AS leased
FROM idempotency_records WHERE key LIKE 'bi-%' ORDER BY key;

-- an inbox message and a stream at watermark 5
SELECT idem_inbox_accept('bi-consumer', 'bi-m1') AS accepted,
       idem_inbox_accept_seq('bi-consumer', 'bi-stream', 5) AS seq;

-- bi_m: new -> paid | void, paid -> refunded; rows start in new
--   bi_orders  governed by bi_m, row 1 is new
--   bi_nopk    governed, without a primary key
--   bi_two     two governed columns
--   bi_plain   no machine; its row holds a value that is no state of bi_m
--   bi_pk2     governed, primary key of two columns, row ('x', 1) is new
--   bi_view    a view
SELECT idem_define_machine('bi_m', '{"new": ["paid", "void"], "paid": ["refunded"]}', '{new}');
CREATE TABLE bi_orders (id int PRIMARY KEY, status text);
CREATE TABLE bi_nopk (status text);
CREATE TABLE bi_two (id int PRIMARY KEY, a text, b text);
CREATE TABLE bi_plain (id int PRIMARY KEY, status text);
CREATE TABLE bi_pk2 (a text, b int, status text, PRIMARY KEY (a, b));
CREATE VIEW bi_view AS SELECT * FROM bi_plain;
SELECT idem_attach_machine('bi_orders', 'status', 'bi_m'),
       idem_attach_machine('bi_nopk', 'status', 'bi_m'),
       idem_attach_machine('bi_two', 'a', 'bi_m'),
       idem_attach_machine('bi_two', 'b', 'bi_m'),
       idem_attach_machine('bi_pk2', 'status', 'bi_m');
INSERT INTO bi_orders VALUES (1, 'new');
INSERT INTO bi_plain VALUES (1, 'bogus');
INSERT INTO bi_pk2 VALUES ('x', 1, 'new');
SELECT table_name, state_column, machine FROM idem_attached_machines
WHERE table_name::text LIKE 'bi%' ORDER BY 1, 2;

SELECT pg_temp.take_snapshot('fixtures');

-- The checks catch a call that succeeds where it should fail, and its write.
BEGIN;
SELECT pg_temp.try($$SELECT idem_inbox_accept('bi-consumer', 'bi-self-test')$$, '22023') AS self_test;
SELECT pg_temp.written() AS self_test;
ROLLBACK;
SELECT pg_temp.written();

--
-- idem_fingerprint(jsonb | text | bytea): STRICT, so NULL gives NULL
--
SELECT input, pg_temp.try(sql, expected) AS outcome FROM (VALUES
    ('jsonb NULL',               $$SELECT idem_fingerprint(NULL::jsonb)$$,         '00000'),
    ('text NULL',                $$SELECT idem_fingerprint(NULL::text)$$,          '00000'),
    ('bytea NULL',               $$SELECT idem_fingerprint(NULL::bytea)$$,         '00000'),
    ('untyped NULL (as text)',   $$SELECT idem_fingerprint(NULL)$$,                '00000'),
    ('jsonb nested 100000 deep', $$SELECT idem_fingerprint((repeat('[', 100000) || repeat(']', 100000))::jsonb)$$, '54001'),
    ('jsonb invalid',            $$SELECT idem_fingerprint('{"a": '::jsonb)$$,     '22P02')
) AS c(input, sql, expected);
SELECT pg_temp.written();

--
-- idem_claim(key, fingerprint, lease, scope, retention, wait)
-- NULL lease and retention mean the settings' defaults.
--
SELECT input, pg_temp.try(sql, expected) AS outcome FROM (VALUES
    ('key NULL',                   $$SELECT idem_claim(NULL, '\x01')$$,                                '22004'),
    ('fingerprint NULL',           $$SELECT idem_claim('bi-new', NULL)$$,                              '22004'),
    ('scope NULL',                 $$SELECT idem_claim('bi-new', '\x01', scope => NULL)$$,             '22004'),
    ('wait NULL',                  $$SELECT idem_claim('bi-new', '\x01', wait => NULL)$$,              '22004'),
    ('key empty',                  $$SELECT idem_claim('', '\x01')$$,                                  '22023'),
    ('fingerprint empty',          $$SELECT idem_claim('bi-new', '')$$,                                '22023'),
    ('key 256 bytes',              $$SELECT idem_claim(repeat('k', 256), '\x01')$$,                    '22001'),
    ('key 128 x é (256 bytes)',    $$SELECT idem_claim(repeat('é', 128), '\x01')$$,                    '22001'),
    ('key 1 MB',                   $$SELECT idem_claim(repeat('k', 1048576), '\x01')$$,                '22001'),
    ('scope 256 bytes',            $$SELECT idem_claim('bi-new', '\x01', scope => repeat('s', 256))$$, '22001'),
    ('scope 1 MB',                 $$SELECT idem_claim('bi-new', '\x01', scope => repeat('s', 1048576))$$, '22001'),
    ('fingerprint 65 bytes',       $$SELECT idem_claim('bi-new', decode(repeat('ab', 65), 'hex'))$$,   '22001'),
    ('fingerprint 1 MB',           $$SELECT idem_claim('bi-new', convert_to(repeat('f', 1048576), 'UTF8'))$$, '22001'),
    ('lease 0',                    $$SELECT idem_claim('bi-new', '\x01', '0')$$,                       '22023'),
    ('lease -1 s',                 $$SELECT idem_claim('bi-new', '\x01', '-1 second')$$,               '22023'),
    ('lease 1 day -24 hours',      $$SELECT idem_claim('bi-new', '\x01', '1 day -24 hours')$$,         '22023'),
    ('lease -1 month 30 days',     $$SELECT idem_claim('bi-new', '\x01', '-1 month 30 days')$$,        '22023'),
    ('lease 300000 years',         $$SELECT idem_claim('bi-new', '\x01', '300000 years')$$,            '22008'),
    ('lease -300000 years',        $$SELECT idem_claim('bi-new', '\x01', '-300000 years')$$,           '22008'),
    ('retention 0',                $$SELECT idem_claim('bi-new', '\x01', retention => '0')$$,          '22023'),
    ('retention -1 day',           $$SELECT idem_claim('bi-new', '\x01', retention => '-1 day')$$,     '22023'),
    ('retention 300000 years',     $$SELECT idem_claim('bi-new', '\x01', retention => '300000 years')$$, '22008'),
    ('lease 0, existing key',      $$SELECT idem_claim('bi-proc', idem_fingerprint('bi-proc'::text), '0')$$, '22023'),
    ('other request, processing',  $$SELECT idem_claim('bi-proc', '\x01')$$,                           'IK001'),
    ('other request, succeeded',   $$SELECT idem_claim('bi-done', '\x01')$$,                           'IK001'),
    ('other request, failed',      $$SELECT idem_claim('bi-failed', '\x01')$$,                         'IK001'),
    ('other request, unknown',     $$SELECT idem_claim('bi-unknown', '\x01')$$,                        'IK001')
) AS c(input, sql, expected);
SELECT pg_temp.written();

--
-- idem_complete(key, token, result, response_code, scope, headers)
-- NULL result, response_code and headers are stored as NULL.  headers must
-- be an object of header names (HTTP tokens) to strings or arrays of them.
--
SELECT input, pg_temp.try(sql, expected) AS outcome FROM (VALUES
    ('key NULL',                  $$SELECT idem_complete(NULL, 1)$$,                               '22004'),
    ('token NULL',                $$SELECT idem_complete('bi-proc', NULL)$$,                       '22004'),
    ('scope NULL',                $$SELECT idem_complete('bi-proc', 1, scope => NULL)$$,           '22004'),
    ('key empty',                 $$SELECT idem_complete('', 1)$$,                                 '22023'),
    ('key 256 bytes',             $$SELECT idem_complete(repeat('k', 256), 1)$$,                   '22001'),
    ('key 1 MB',                  $$SELECT idem_complete(repeat('k', 1048576), 1)$$,               '22001'),
    ('scope 1 MB',                $$SELECT idem_complete('bi-proc', 1, scope => repeat('s', 1048576))$$, '22001'),
    ('token 0',                   $$SELECT idem_complete('bi-proc', 0)$$,                          '22023'),
    ('token -1',                  $$SELECT idem_complete('bi-proc', -1)$$,                         '22023'),
    ('token never issued',        $$SELECT idem_complete('bi-proc', 2)$$,                          'IK002'),
    ('token max bigint',          $$SELECT idem_complete('bi-proc', 9223372036854775807)$$,       'IK002'),
    ('token of a released key',   $$SELECT idem_complete('bi-released', 1)$$,                      'IK002'),
    ('token after release',       $$SELECT idem_complete('bi-released', 2)$$,                      'IK002'),
    ('unknown key',               $$SELECT idem_complete('bi-missing', 1)$$,                       'IK004'),
    ('key in another scope',      $$SELECT idem_complete('bi-proc', 1, scope => 'other')$$,        'IK004'),
    ('hostile unknown key',       $$SELECT idem_complete('bi"; DROP TABLE bi_orders; --', 1)$$,    'IK004'),
    ('succeeded, other result',   $$SELECT idem_complete('bi-done', 1, '{"ok": false}', 200)$$,    'IK003'),
    ('failed',                    $$SELECT idem_complete('bi-failed', 1)$$,                        'IK003'),
    ('unknown',                   $$SELECT idem_complete('bi-unknown', 1)$$,                       'IK003'),
    ('headers an array',          $$SELECT idem_complete('bi-proc', 1, headers => '["Location"]')$$, '22023'),
    ('headers a string',          $$SELECT idem_complete('bi-proc', 1, headers => '"Location: /x"')$$, '22023'),
    ('headers JSON null',         $$SELECT idem_complete('bi-proc', 1, headers => 'null')$$,       '22023'),
    ('header value a number',     $$SELECT idem_complete('bi-proc', 1, headers => '{"Location": 2}')$$, '22023'),
    ('header value null',         $$SELECT idem_complete('bi-proc', 1, headers => '{"Location": null}')$$, '22023'),
    ('header value an object',    $$SELECT idem_complete('bi-proc', 1, headers => '{"Location": {"a": "b"}}')$$, '22023'),
    ('header name empty',         $$SELECT idem_complete('bi-proc', 1, headers => '{"": "x"}')$$,  '22023'),
    ('header name with a space',  $$SELECT idem_complete('bi-proc', 1, headers => '{"X Id": "x"}')$$, '22023'),
    ('header name with a colon',  $$SELECT idem_complete('bi-proc', 1, headers => '{"Location:": "x"}')$$, '22023'),
    ('header name not ASCII',     $$SELECT idem_complete('bi-proc', 1, headers => '{"Lócation": "x"}')$$, '22023'),
    ('header array, a number',    $$SELECT idem_complete('bi-proc', 1, headers => '{"Vary": ["Accept", 1]}')$$, '22023'),
    ('header array, an array',    $$SELECT idem_complete('bi-proc', 1, headers => '{"Vary": [["Accept"]]}')$$, '22023'),
    ('header value with CR LF',   $$SELECT idem_complete('bi-proc', 1, headers => '{"Location": "/x\r\nSet-Cookie: a=1"}')$$, '22023'),
    ('header value with LF',      $$SELECT idem_complete('bi-proc', 1, headers => '{"Vary": ["a", "b\nc"]}')$$, '22023'),
    ('header value, a control',   $$SELECT idem_complete('bi-proc', 1, headers => '{"X-Id": "a\u0001b"}')$$, '22023'),
    ('header value with DEL',     $$SELECT idem_complete('bi-proc', 1, headers => '{"X-Id": "a\u007fb"}')$$, '22023'),
    ('header value not ASCII',    $$SELECT idem_complete('bi-proc', 1, headers => '{"X-Note": "5 €"}')$$, '22023'),
    ('header Content-Length',     $$SELECT idem_complete('bi-proc', 1, headers => '{"Content-Length": "2"}')$$, '22023'),
    ('header transfer-encoding',  $$SELECT idem_complete('bi-proc', 1, headers => '{"transfer-encoding": "chunked"}')$$, '22023'),
    ('header Connection',         $$SELECT idem_complete('bi-proc', 1, headers => '{"Connection": "close"}')$$, '22023'),
    ('header name twice (case)',  $$SELECT idem_complete('bi-proc', 1, headers => '{"Location": "/a", "location": "/b"}')$$, '22023'),
    ('headers, stale token',      $$SELECT idem_complete('bi-proc', 2, headers => '{"Location": "/x"}')$$, 'IK002'),
    ('succeeded, other headers',  $$SELECT idem_complete('bi-done', 1, '{"ok": true}', 200, headers => '{"A": "b"}')$$, 'IK003')
) AS c(input, sql, expected);
SELECT pg_temp.written();

--
-- idem_fail(key, token, error, retryable, scope, response_code, headers)
--
SELECT input, pg_temp.try(sql, expected) AS outcome FROM (VALUES
    ('key NULL',                $$SELECT idem_fail(NULL, 1, '{}')$$,                                '22004'),
    ('token NULL',              $$SELECT idem_fail('bi-proc', NULL, '{}')$$,                        '22004'),
    ('error NULL',              $$SELECT idem_fail('bi-proc', 1, NULL)$$,                           '22004'),
    ('retryable NULL',          $$SELECT idem_fail('bi-proc', 1, '{}', retryable => NULL)$$,        '22004'),
    ('scope NULL',              $$SELECT idem_fail('bi-proc', 1, '{}', scope => NULL)$$,            '22004'),
    ('key empty',               $$SELECT idem_fail('', 1, '{}')$$,                                  '22023'),
    ('key 256 bytes',           $$SELECT idem_fail(repeat('k', 256), 1, '{}')$$,                    '22001'),
    ('key 1 MB',                $$SELECT idem_fail(repeat('k', 1048576), 1, '{}')$$,                '22001'),
    ('scope 1 MB',              $$SELECT idem_fail('bi-proc', 1, '{}', scope => repeat('s', 1048576))$$, '22001'),
    ('token 0',                 $$SELECT idem_fail('bi-proc', 0, '{}')$$,                           '22023'),
    ('token min bigint',        $$SELECT idem_fail('bi-proc', -9223372036854775808, '{}')$$,        '22023'),
    ('token never issued',      $$SELECT idem_fail('bi-proc', 2, '{}')$$,                           'IK002'),
    ('token after release',     $$SELECT idem_fail('bi-released', 2, '{}')$$,                       'IK002'),
    ('unknown key',             $$SELECT idem_fail('bi-missing', 1, '{}')$$,                        'IK004'),
    ('succeeded',               $$SELECT idem_fail('bi-done', 1, '{}')$$,                           'IK003'),
    ('failed, other error',     $$SELECT idem_fail('bi-failed', 1, '{}', retryable => false)$$,     'IK003'),
    ('headers an array',        $$SELECT idem_fail('bi-proc', 1, '{}', headers => '[]')$$,          '22023'),
    ('header value a number',   $$SELECT idem_fail('bi-proc', 1, '{}', headers => '{"Retry-After": 120}')$$, '22023'),
    ('header value true',       $$SELECT idem_fail('bi-proc', 1, '{}', headers => '{"X-Done": true}')$$, '22023'),
    ('header name empty',       $$SELECT idem_fail('bi-proc', 1, '{}', headers => '{"": ["x"]}')$$, '22023'),
    ('header array, a null',    $$SELECT idem_fail('bi-proc', 1, '{}', headers => '{"Vary": ["a", null]}')$$, '22023')
) AS c(input, sql, expected);
SELECT pg_temp.written();

--
-- idem_checkpoint(key, token, recovery_point, extend_lease, scope)
-- NULL recovery_point and extend_lease keep the stored values.
--
SELECT input, pg_temp.try(sql, expected) AS outcome FROM (VALUES
    ('key NULL',                  $$SELECT idem_checkpoint(NULL, 1, 'rp')$$,                          '22004'),
    ('token NULL',                $$SELECT idem_checkpoint('bi-proc', NULL, 'rp')$$,                  '22004'),
    ('scope NULL',                $$SELECT idem_checkpoint('bi-proc', 1, 'rp', scope => NULL)$$,      '22004'),
    ('key empty',                 $$SELECT idem_checkpoint('', 1, 'rp')$$,                            '22023'),
    ('key 256 bytes',             $$SELECT idem_checkpoint(repeat('k', 256), 1, 'rp')$$,              '22001'),
    ('key 1 MB',                  $$SELECT idem_checkpoint(repeat('k', 1048576), 1, 'rp')$$,          '22001'),
    ('scope 1 MB',                $$SELECT idem_checkpoint('bi-proc', 1, 'rp', scope => repeat('s', 1048576))$$, '22001'),
    ('token 0',                   $$SELECT idem_checkpoint('bi-proc', 0, 'rp')$$,                     '22023'),
    ('extend_lease 0',            $$SELECT idem_checkpoint('bi-proc', 1, 'rp', '0')$$,                '22023'),
    ('extend_lease -1 hour',      $$SELECT idem_checkpoint('bi-proc', 1, 'rp', '-1 hour')$$,          '22023'),
    ('extend_lease 1 d -24 h',    $$SELECT idem_checkpoint('bi-proc', 1, 'rp', '1 day -24 hours')$$,  '22023'),
    ('extend_lease 300000 years', $$SELECT idem_checkpoint('bi-proc', 1, 'rp', '300000 years')$$,     '22008'),
    ('token never issued',        $$SELECT idem_checkpoint('bi-proc', 2, 'rp')$$,                     'IK002'),
    ('token after release',       $$SELECT idem_checkpoint('bi-released', 2, 'rp')$$,                 'IK002'),
    ('unknown key',               $$SELECT idem_checkpoint('bi-missing', 1, 'rp')$$,                  'IK004'),
    ('succeeded',                 $$SELECT idem_checkpoint('bi-done', 1, 'rp')$$,                     'IK003'),
    ('unknown',                   $$SELECT idem_checkpoint('bi-unknown', 1, NULL, '1 hour')$$,        'IK003')
) AS c(input, sql, expected);
SELECT pg_temp.written();

--
-- idem_release(key, token, scope)
--
SELECT input, pg_temp.try(sql, expected) AS outcome FROM (VALUES
    ('key NULL',             $$SELECT idem_release(NULL, 1)$$,                           '22004'),
    ('token NULL',           $$SELECT idem_release('bi-proc', NULL)$$,                   '22004'),
    ('scope NULL',           $$SELECT idem_release('bi-proc', 1, NULL)$$,                '22004'),
    ('key empty',            $$SELECT idem_release('', 1)$$,                             '22023'),
    ('key 256 bytes',        $$SELECT idem_release(repeat('k', 256), 1)$$,               '22001'),
    ('key 1 MB',             $$SELECT idem_release(repeat('k', 1048576), 1)$$,           '22001'),
    ('scope 1 MB',           $$SELECT idem_release('bi-proc', 1, repeat('s', 1048576))$$, '22001'),
    ('token -1',             $$SELECT idem_release('bi-proc', -1)$$,                     '22023'),
    ('token never issued',   $$SELECT idem_release('bi-proc', 2)$$,                      'IK002'),
    ('released again',       $$SELECT idem_release('bi-released', 1)$$,                  'IK002'),
    ('unknown key',          $$SELECT idem_release('bi-missing', 1)$$,                   'IK004'),
    ('succeeded',            $$SELECT idem_release('bi-done', 1)$$,                      'IK003'),
    ('unknown',              $$SELECT idem_release('bi-unknown', 1)$$,                   'IK003')
) AS c(input, sql, expected);
SELECT pg_temp.written();

--
-- idem_mark_unknown(key, token, detail, scope)
--
SELECT input, pg_temp.try(sql, expected) AS outcome FROM (VALUES
    ('key NULL',             $$SELECT idem_mark_unknown(NULL, 1, '{}')$$,                           '22004'),
    ('token NULL',           $$SELECT idem_mark_unknown('bi-proc', NULL, '{}')$$,                   '22004'),
    ('detail NULL',          $$SELECT idem_mark_unknown('bi-proc', 1, NULL)$$,                      '22004'),
    ('scope NULL',           $$SELECT idem_mark_unknown('bi-proc', 1, '{}', NULL)$$,                '22004'),
    ('key empty',            $$SELECT idem_mark_unknown('', 1, '{}')$$,                             '22023'),
    ('key 256 bytes',        $$SELECT idem_mark_unknown(repeat('k', 256), 1, '{}')$$,               '22001'),
    ('key 1 MB',             $$SELECT idem_mark_unknown(repeat('k', 1048576), 1, '{}')$$,           '22001'),
    ('scope 1 MB',           $$SELECT idem_mark_unknown('bi-proc', 1, '{}', repeat('s', 1048576))$$, '22001'),
    ('token 0',              $$SELECT idem_mark_unknown('bi-proc', 0, '{}')$$,                      '22023'),
    ('token never issued',   $$SELECT idem_mark_unknown('bi-proc', 2, '{}')$$,                      'IK002'),
    ('token after release',  $$SELECT idem_mark_unknown('bi-released', 2, '{}')$$,                  'IK002'),
    ('unknown key',          $$SELECT idem_mark_unknown('bi-missing', 1, '{}')$$,                   'IK004'),
    ('succeeded',            $$SELECT idem_mark_unknown('bi-done', 1, '{}')$$,                      'IK003'),
    ('unknown, other detail', $$SELECT idem_mark_unknown('bi-unknown', 1, '{}')$$,                  'IK003')
) AS c(input, sql, expected);
SELECT pg_temp.written();

--
-- idem_resolve(key, status, result, response_code, scope, retryable, headers)
--
SELECT input, pg_temp.try(sql, expected) AS outcome FROM (VALUES
    ('key NULL',                 $$SELECT idem_resolve(NULL, 'succeeded')$$,                         '22004'),
    ('status NULL',              $$SELECT idem_resolve('bi-unknown', NULL)$$,                        '22004'),
    ('scope NULL',               $$SELECT idem_resolve('bi-unknown', 'failed', scope => NULL)$$,     '22004'),
    ('retryable NULL',           $$SELECT idem_resolve('bi-unknown', 'failed', retryable => NULL)$$, '22004'),
    ('key empty',                $$SELECT idem_resolve('', 'succeeded')$$,                           '22023'),
    ('key 256 bytes',            $$SELECT idem_resolve(repeat('k', 256), 'succeeded')$$,             '22001'),
    ('key 1 MB',                 $$SELECT idem_resolve(repeat('k', 1048576), 'succeeded')$$,         '22001'),
    ('scope 1 MB',               $$SELECT idem_resolve('bi-unknown', 'failed', scope => repeat('s', 1048576))$$, '22001'),
    ('status processing',        $$SELECT idem_resolve('bi-unknown', 'processing')$$,                '22023'),
    ('status unknown',           $$SELECT idem_resolve('bi-unknown', 'unknown')$$,                   '22023'),
    ('status empty',             $$SELECT idem_resolve('bi-unknown', '')$$,                          '22P02'),
    ('status hostile',           $$SELECT idem_resolve('bi-unknown', 'succeeded''; --')$$,           '22P02'),
    ('succeeded and retryable',  $$SELECT idem_resolve('bi-unknown', 'succeeded', retryable => true)$$, '22023'),
    ('unknown key',              $$SELECT idem_resolve('bi-missing', 'failed')$$,                    'IK004'),
    ('processing',               $$SELECT idem_resolve('bi-proc', 'failed')$$,                       'IK003'),
    ('succeeded',                $$SELECT idem_resolve('bi-done', 'failed')$$,                       'IK003'),
    ('released',                 $$SELECT idem_resolve('bi-released', 'failed')$$,                   'IK003'),
    ('headers a number',         $$SELECT idem_resolve('bi-unknown', 'succeeded', headers => '201')$$, '22023'),
    ('header value a number',    $$SELECT idem_resolve('bi-unknown', 'succeeded', headers => '{"Location": 7}')$$, '22023'),
    ('header name empty',        $$SELECT idem_resolve('bi-unknown', 'failed', headers => '{"": "x"}')$$, '22023'),
    ('header array, an object',  $$SELECT idem_resolve('bi-unknown', 'failed', headers => '{"Vary": [{}]}')$$, '22023')
) AS c(input, sql, expected);
SELECT pg_temp.written();

--
-- idem_lookup(key, scope) and idem_await(key, scope, timeout): reads; an
-- unknown key is no row.  A timeout that adds up to zero is a plain read.
--
SELECT input, pg_temp.try(sql, expected) AS outcome FROM (VALUES
    ('lookup: key NULL',              $$SELECT count(*) FROM idem_lookup(NULL)$$,                      '22004'),
    ('lookup: scope NULL',            $$SELECT count(*) FROM idem_lookup('bi-proc', NULL)$$,           '22004'),
    ('lookup: key empty',             $$SELECT count(*) FROM idem_lookup('')$$,                        '22023'),
    ('lookup: key 256 bytes',         $$SELECT count(*) FROM idem_lookup(repeat('k', 256))$$,          '22001'),
    ('lookup: key 1 MB',              $$SELECT count(*) FROM idem_lookup(repeat('k', 1048576))$$,      '22001'),
    ('lookup: scope 1 MB',            $$SELECT count(*) FROM idem_lookup('k', repeat('s', 1048576))$$, '22001'),
    ('lookup: unknown key',           $$SELECT count(*) FROM idem_lookup('bi-missing')$$,              '00000'),
    ('lookup: hostile key',           $$SELECT count(*) FROM idem_lookup('bi''; DROP TABLE bi_orders; --')$$, '00000'),
    ('await: key NULL',               $$SELECT count(*) FROM idem_await(NULL)$$,                       '22004'),
    ('await: scope NULL',             $$SELECT count(*) FROM idem_await('bi-proc', NULL)$$,            '22004'),
    ('await: timeout NULL',           $$SELECT count(*) FROM idem_await('bi-proc', '', NULL)$$,        '22004'),
    ('await: key empty',              $$SELECT count(*) FROM idem_await('')$$,                         '22023'),
    ('await: key 256 bytes',          $$SELECT count(*) FROM idem_await(repeat('k', 256))$$,           '22001'),
    ('await: key 1 MB',               $$SELECT count(*) FROM idem_await(repeat('k', 1048576))$$,       '22001'),
    ('await: scope 1 MB',             $$SELECT count(*) FROM idem_await('k', repeat('s', 1048576))$$,  '22001'),
    ('await: timeout -1 s',           $$SELECT count(*) FROM idem_await('bi-proc', '', '-1 second')$$, '22023'),
    ('await: timeout -300000 years',  $$SELECT count(*) FROM idem_await('bi-proc', '', '-300000 years')$$, '22008'),
    ('await: timeout 300000 years',   $$SELECT count(*) FROM idem_await('bi-proc', '', '300000 years')$$,  '22008'),
    ('await: timeout 0',              $$SELECT count(*) FROM idem_await('bi-proc', '', '0')$$,         '00000'),
    ('await: timeout 1 day -24 hours', $$SELECT count(*) FROM idem_await('bi-proc', '', '1 day -24 hours')$$, '00000'),
    ('await: unknown key',            $$SELECT count(*) FROM idem_await('bi-missing', '', '0')$$,      '00000')
) AS c(input, sql, expected);
SELECT pg_temp.written();

--
-- The inbox: idem_inbox_accept(consumer, message_id, retention, wait),
-- idem_inbox_accept_seq(consumer, stream, seq, accept_gap) and
-- (consumer, stream, major, minor, accept_gap), idem_inbox_seq(major, minor),
-- idem_inbox_watermark(consumer, stream).  NULL retention means the setting.
--
SELECT input, pg_temp.try(sql, expected) AS outcome FROM (VALUES
    ('accept: consumer NULL',       $$SELECT idem_inbox_accept(NULL, 'm')$$,                         '22004'),
    ('accept: message id NULL',     $$SELECT idem_inbox_accept('bi-consumer', NULL)$$,               '22004'),
    ('accept: wait NULL',           $$SELECT idem_inbox_accept('bi-consumer', 'm', wait => NULL)$$,  '22004'),
    ('accept: consumer empty',      $$SELECT idem_inbox_accept('', 'm')$$,                           '22023'),
    ('accept: message id empty',    $$SELECT idem_inbox_accept('bi-consumer', '')$$,                 '22023'),
    ('accept: consumer 256 bytes',  $$SELECT idem_inbox_accept(repeat('c', 256), 'm')$$,             '22001'),
    ('accept: consumer 1 MB',       $$SELECT idem_inbox_accept(repeat('c', 1048576), 'm')$$,         '22001'),
    ('accept: message id 256 bytes', $$SELECT idem_inbox_accept('bi-consumer', repeat('m', 256))$$,  '22001'),
    ('accept: message id 1 MB',     $$SELECT idem_inbox_accept('bi-consumer', repeat('m', 1048576))$$, '22001'),
    ('accept: retention 0',         $$SELECT idem_inbox_accept('bi-consumer', 'm', '0')$$,           '22023'),
    ('accept: retention -1 day',    $$SELECT idem_inbox_accept('bi-consumer', 'm', '-1 day')$$,      '22023'),
    ('accept: retention 300000 y',  $$SELECT idem_inbox_accept('bi-consumer', 'm', '300000 years')$$, '22008'),
    ('accept: duplicate',           $$SELECT idem_inbox_accept('bi-consumer', 'bi-m1')$$,            '00000'),
    ('seq: consumer NULL',          $$SELECT idem_inbox_accept_seq(NULL, 's', 1)$$,                  '22004'),
    ('seq: stream NULL',            $$SELECT idem_inbox_accept_seq('bi-consumer', NULL, 1)$$,        '22004'),
    ('seq: seq NULL',               $$SELECT idem_inbox_accept_seq('bi-consumer', 's', NULL::bigint)$$, '22004'),
    ('seq: accept_gap NULL',        $$SELECT idem_inbox_accept_seq('bi-consumer', 's', 1, accept_gap => NULL)$$, '22004'),
    ('seq: untyped NULL gap (ambiguous)', $$SELECT idem_inbox_accept_seq('bi-consumer', 's', 1::bigint, NULL)$$, '42725'),
    ('seq: consumer empty',         $$SELECT idem_inbox_accept_seq('', 's', 1)$$,                    '22023'),
    ('seq: stream empty',           $$SELECT idem_inbox_accept_seq('bi-consumer', '', 1)$$,          '22023'),
    ('seq: consumer 1 MB',          $$SELECT idem_inbox_accept_seq(repeat('c', 1048576), 's', 1)$$,  '22001'),
    ('seq: stream 256 bytes',       $$SELECT idem_inbox_accept_seq('bi-consumer', repeat('s', 256), 1)$$, '22001'),
    ('seq: stream 1 MB',            $$SELECT idem_inbox_accept_seq('bi-consumer', repeat('s', 1048576), 1)$$, '22001'),
    ('seq: seq -1',                 $$SELECT idem_inbox_accept_seq('bi-consumer', 's', -1)$$,        '22023'),
    ('seq: seq min bigint',         $$SELECT idem_inbox_accept_seq('bi-consumer', 's', -9223372036854775808)$$, '22023'),
    ('seq: duplicate',              $$SELECT idem_inbox_accept_seq('bi-consumer', 'bi-stream', 5)$$, '00000'),
    ('seq: gap, not accepted',      $$SELECT idem_inbox_accept_seq('bi-consumer', 'bi-stream', 9223372036854775807)$$, '00000'),
    ('seq2: major NULL',            $$SELECT idem_inbox_accept_seq('bi-consumer', 's', NULL, 1)$$,   '22004'),
    ('seq2: minor NULL',            $$SELECT idem_inbox_accept_seq('bi-consumer', 's', 1, NULL::int)$$, '22004'),
    ('seq2: accept_gap NULL',       $$SELECT idem_inbox_accept_seq('bi-consumer', 's', 1, 1, NULL)$$, '22004'),
    ('seq2: consumer NULL',         $$SELECT idem_inbox_accept_seq(NULL, 's', 1, 1)$$,               '22004'),
    ('seq2: stream empty',          $$SELECT idem_inbox_accept_seq('bi-consumer', '', 1, 1)$$,       '22023'),
    ('seq2: major -1',              $$SELECT idem_inbox_accept_seq('bi-consumer', 's', -1, 0)$$,     '22003'),
    ('seq2: major 2^43',            $$SELECT idem_inbox_accept_seq('bi-consumer', 's', 8796093022208, 0)$$, '22003'),
    ('seq2: minor 2^20',            $$SELECT idem_inbox_accept_seq('bi-consumer', 's', 0, 1048576)$$, '22003'),
    ('idem_inbox_seq: major NULL',  $$SELECT idem_inbox_seq(NULL, 0)$$,                              '22004'),
    ('idem_inbox_seq: minor NULL',  $$SELECT idem_inbox_seq(0, NULL)$$,                              '22004'),
    ('idem_inbox_seq: minor -1',    $$SELECT idem_inbox_seq(0, -1)$$,                                '22003'),
    ('idem_inbox_seq: max bigint',  $$SELECT idem_inbox_seq(9223372036854775807, 2147483647)$$,      '22003'),
    ('idem_inbox_seq: largest',     $$SELECT idem_inbox_seq(8796093022207, 1048575)$$,               '00000'),
    ('watermark: consumer NULL',    $$SELECT idem_inbox_watermark(NULL, 'bi-stream')$$,              '00000'),
    ('watermark: stream NULL',      $$SELECT idem_inbox_watermark('bi-consumer', NULL)$$,            '00000'),
    ('watermark: empty',            $$SELECT idem_inbox_watermark('', '')$$,                         '00000'),
    ('watermark: 1 MB names',       $$SELECT idem_inbox_watermark(repeat('c', 1048576), repeat('s', 1048576))$$, '00000'),
    ('watermark: hostile names',    $$SELECT idem_inbox_watermark('bi''; --', 'x"; --')$$,           '00000'),
    ('watermark: known stream',     $$SELECT idem_inbox_watermark('bi-consumer', 'bi-stream')$$,     '00000')
) AS c(input, sql, expected);
SELECT pg_temp.written();

--
-- idem_purge(batch_size, max_batches); NULL max_batches means no limit.
-- idem_stats() and idem_stats_reset() take no arguments; they answer 55000
-- unless the library is preloaded.
--
SELECT input, pg_temp.try(sql, expected) AS outcome FROM (VALUES
    ('purge: batch_size NULL',        $$SELECT idem_purge(NULL)$$,              '22004'),
    ('purge: batch_size 0',           $$SELECT idem_purge(0)$$,                 '22023'),
    ('purge: batch_size -1',          $$SELECT idem_purge(-1)$$,                '22023'),
    ('purge: max_batches 0',          $$SELECT idem_purge(10, 0)$$,             '22023'),
    ('purge: max_batches min int',    $$SELECT idem_purge(10, -2147483648)$$,   '22023'),
    ('stats',                         $$SELECT count(*) FROM idem_stats()$$,    '00000|55000'),
    ('stats_reset',                   $$SELECT idem_stats_reset()$$,            '00000|55000')
) AS c(input, sql, expected);
SELECT pg_temp.written();

--
-- Settings: out of range or malformed values are refused (the library is
-- loaded in this session by now); the purge worker's settings cannot be SET.
-- The range errors of the settings with a unit are in guc_ranges.sql.
--
-- The SQL edition registers no setting: idempotency.* are placeholders that
-- SET takes whatever their value (no reserved prefix, no purge worker), and
-- the functions refuse a value they read that is out of range or malformed,
-- with the same 22023 (test/edition/expected/bad_input.out).
\if :sql_edition
SELECT input, pg_temp.try(sql, expected) AS outcome FROM (VALUES
    ('max_key_length 0',         $$SET LOCAL idempotency.max_key_length = 0; SELECT count(*) FROM idem_lookup('bi-k')$$, '22023'),
    ('max_key_length 1025',      $$SET LOCAL idempotency.max_key_length = 1025; SELECT count(*) FROM idem_lookup('bi-k')$$, '22023'),
    ('max_key_length abc',       $$SET LOCAL idempotency.max_key_length = 'abc'; SELECT count(*) FROM idem_lookup('bi-k')$$, '22023'),
    ('default_lease 1 fortnight', $$SET LOCAL idempotency.default_lease = '1 fortnight'; SELECT count(*) FROM idem_claim('bi-k', '\x01')$$, '22023')
) AS c(input, sql, expected);
\else
SELECT input, pg_temp.try(sql, expected) AS outcome FROM (VALUES
    ('max_key_length 0',         $$SET idempotency.max_key_length = 0$$,                '22023'),
    ('max_key_length 1025',      $$SET idempotency.max_key_length = 1025$$,             '22023'),
    ('max_key_length abc',       $$SET idempotency.max_key_length = 'abc'$$,            '22023'),
    ('default_lease 1 fortnight', $$SET idempotency.default_lease = '1 fortnight'$$,    '22023'),
    ('misspelled name',          $$SET idempotency.defualt_lease = '5s'$$,              '42602'),
    ('purge_interval',           $$SET idempotency.purge_interval = 5$$,                '55P02'),
    ('databases',                $$SET idempotency.databases = 'x; DROP TABLE bi_orders'$$, '55P02')
) AS c(input, sql, expected);
\endif
SELECT pg_temp.written();

--
-- State machines: idem_define_machine(machine, moves, initial),
-- idem_drop_machine(machine), idem_machine_moves / _states / _dot(machine).
-- NULL initial means any state.
--
SELECT input, pg_temp.try(sql, expected) AS outcome FROM (VALUES
    ('define: machine NULL',        $$SELECT idem_define_machine(NULL, '{"a": []}')$$,             '22004'),
    ('define: moves NULL',          $$SELECT idem_define_machine('bi_x', NULL)$$,                  '22004'),
    ('define: initial has NULL',    $$SELECT idem_define_machine('bi_x', '{"a": []}', '{a,NULL}')$$, '22004'),
    ('define: machine empty',       $$SELECT idem_define_machine('', '{"a": []}')$$,               '22023'),
    ('define: machine 64 bytes',    $$SELECT idem_define_machine(repeat('m', 64), '{"a": []}')$$,  '22023'),
    ('define: machine 1 MB',        $$SELECT idem_define_machine(repeat('m', 1048576), '{"a": []}')$$, '22023'),
    ('define: machine idem.*',      $$SELECT idem_define_machine('idem.x', '{"a": []}')$$,         '42939'),
    ('define: replace idem.record', $$SELECT idem_define_machine('idem.record', '{"a": []}')$$,    '42939'),
    ('define: moves an array',      $$SELECT idem_define_machine('bi_x', '["a"]')$$,               '22023'),
    ('define: moves JSON null',     $$SELECT idem_define_machine('bi_x', 'null')$$,                '22023'),
    ('define: moves a string',      $$SELECT idem_define_machine('bi_x', '"a; DROP TABLE bi_orders"')$$, '22023'),
    ('define: moves {}',            $$SELECT idem_define_machine('bi_x', '{}')$$,                  '22023'),
    ('define: state empty',         $$SELECT idem_define_machine('bi_x', '{"": ["a"]}')$$,         '22023'),
    ('define: targets an object',   $$SELECT idem_define_machine('bi_x', '{"a": {"b": 1}}')$$,     '22023'),
    ('define: targets a string',    $$SELECT idem_define_machine('bi_x', '{"a": "b"}')$$,          '22023'),
    ('define: target a number',     $$SELECT idem_define_machine('bi_x', '{"a": [1]}')$$,          '22023'),
    ('define: target JSON null',    $$SELECT idem_define_machine('bi_x', '{"a": [null]}')$$,       '22023'),
    ('define: target empty',        $$SELECT idem_define_machine('bi_x', '{"a": [""]}')$$,         '22023'),
    ('define: target an array',     $$SELECT idem_define_machine('bi_x', '{"a": [["b"]]}')$$,      '22023'),
    ('define: initial not a state', $$SELECT idem_define_machine('bi_x', '{"a": []}', '{b}')$$,    '22023'),
    ('define: initial empty state', $$SELECT idem_define_machine('bi_x', '{"a": []}', '{""}')$$,   '22023'),
    ('define: initial hostile',     $$SELECT idem_define_machine('bi_x', '{"a": []}', ARRAY['a"; DROP TABLE bi_orders; --'])$$, '22023'),
    ('drop: machine NULL',          $$SELECT idem_drop_machine(NULL)$$,                            '22004'),
    ('drop: machine empty',         $$SELECT idem_drop_machine('')$$,                              '42704'),
    ('drop: unknown machine',       $$SELECT idem_drop_machine('bi_nope')$$,                       '42704'),
    ('drop: hostile unknown',       $$SELECT idem_drop_machine('bi"; DROP TABLE bi_orders; --')$$, '42704'),
    ('drop: machine 1 MB',          $$SELECT idem_drop_machine(repeat('m', 1048576))$$,            '42704'),
    ('drop: idem.record',           $$SELECT idem_drop_machine('idem.record')$$,                   '42939'),
    ('drop: attached',              $$SELECT idem_drop_machine('bi_m')$$,                          '2BP01'),
    ('moves: machine NULL',         $$SELECT count(*) FROM idem_machine_moves(NULL)$$,             '22004'),
    ('moves: unknown machine',      $$SELECT count(*) FROM idem_machine_moves('bi_nope')$$,        '42704'),
    ('moves: machine empty',        $$SELECT count(*) FROM idem_machine_moves('')$$,               '42704'),
    ('states: machine NULL',        $$SELECT count(*) FROM idem_machine_states(NULL)$$,            '22004'),
    ('states: unknown machine',     $$SELECT count(*) FROM idem_machine_states('bi_nope')$$,       '42704'),
    ('states: machine 1 MB',        $$SELECT count(*) FROM idem_machine_states(repeat('m', 1048576))$$, '42704'),
    ('dot: machine NULL',           $$SELECT idem_machine_dot(NULL)$$,                             '22004'),
    ('dot: unknown machine',        $$SELECT idem_machine_dot('bi"; DROP TABLE bi_orders; --')$$,  '42704')
) AS c(input, sql, expected);
SELECT pg_temp.written();

--
-- idem_attach_machine(table_name, state_column, machine, log, validate) and
-- idem_detach_machine(table_name, state_column)
--
SELECT input, pg_temp.try(sql, expected) AS outcome FROM (VALUES
    ('attach: table NULL',          $$SELECT idem_attach_machine(NULL, 'status', 'bi_m')$$,          '22004'),
    ('attach: column NULL',         $$SELECT idem_attach_machine('bi_plain', NULL, 'bi_m')$$,        '22004'),
    ('attach: machine NULL',        $$SELECT idem_attach_machine('bi_plain', 'status', NULL)$$,      '22004'),
    ('attach: log NULL',            $$SELECT idem_attach_machine('bi_plain', 'status', 'bi_m', NULL)$$, '22004'),
    ('attach: validate NULL',       $$SELECT idem_attach_machine('bi_plain', 'status', 'bi_m', false, NULL)$$, '22004'),
    ('attach: table empty',         $$SELECT idem_attach_machine('', 'status', 'bi_m')$$,            '42602'),
    ('attach: unknown table',       $$SELECT idem_attach_machine('bi_nope', 'status', 'bi_m')$$,     '42P01'),
    ('attach: hostile table',       $$SELECT idem_attach_machine('bi_plain; DROP TABLE bi_orders', 'status', 'bi_m')$$, '42602'),
    ('attach: a view',              $$SELECT idem_attach_machine('bi_view', 'status', 'bi_m')$$,     '42809'),
    ('attach: a system catalog',    $$SELECT idem_attach_machine('pg_class', 'relname', 'bi_m', validate => false)$$, '42501'),
    ('attach: column empty',        $$SELECT idem_attach_machine('bi_plain', '', 'bi_m')$$,          '42703'),
    ('attach: system column',       $$SELECT idem_attach_machine('bi_plain', 'xmin', 'bi_m')$$,      '42703'),
    ('attach: hostile column',      $$SELECT idem_attach_machine('bi_plain', 'status"; DROP TABLE bi_orders; --', 'bi_m')$$, '42703'),
    ('attach: column 1 MB',         $$SELECT idem_attach_machine('bi_plain', repeat('c', 1048576), 'bi_m')$$, '42703'),
    ('attach: machine empty',       $$SELECT idem_attach_machine('bi_plain', 'status', '')$$,        '42704'),
    ('attach: unknown machine',     $$SELECT idem_attach_machine('bi_plain', 'status', 'bi_nope')$$, '42704'),
    ('attach: machine 1 MB',        $$SELECT idem_attach_machine('bi_plain', 'status', repeat('m', 1048576))$$, '42704'),
    ('attach: values not states',   $$SELECT idem_attach_machine('bi_plain', 'status', 'bi_m')$$,    '23514'),
    ('attach: attached already',    $$SELECT idem_attach_machine('bi_orders', 'status', 'bi_m')$$,   '42710'),
    ('detach: table NULL',          $$SELECT idem_detach_machine(NULL, 'status')$$,                  '22004'),
    ('detach: column NULL',         $$SELECT idem_detach_machine('bi_orders', NULL)$$,               '22004'),
    ('detach: no machine',          $$SELECT idem_detach_machine('bi_plain', 'status')$$,            '42704'),
    ('detach: column empty',        $$SELECT idem_detach_machine('bi_orders', '')$$,                 '42704'),
    ('detach: hostile column',      $$SELECT idem_detach_machine('bi_orders', 'status"; DROP TABLE bi_orders; --')$$, '42704'),
    ('detach: unknown table',       $$SELECT idem_detach_machine('bi_nope', 'status')$$,             '42P01')
) AS c(input, sql, expected);
SELECT pg_temp.written();

--
-- idem_transition(table_name, key text | text[], to_state, from_states,
-- state_column).  NULL from_states means every state with a move to
-- to_state; NULL state_column means the table's only governed column.
--
SELECT input, pg_temp.try(sql, expected) AS outcome FROM (VALUES
    ('table NULL',               $$SELECT idem_transition(NULL, '1', 'paid')$$,                    '22004'),
    ('key NULL',                 $$SELECT idem_transition('bi_orders', NULL::text, 'paid')$$,      '22004'),
    ('key[] NULL',               $$SELECT idem_transition('bi_orders', NULL::text[], 'paid')$$,    '22004'),
    ('key[] with a NULL',        $$SELECT idem_transition('bi_pk2', ARRAY['x', NULL], 'paid')$$,   '22004'),
    ('to_state NULL',            $$SELECT idem_transition('bi_orders', '1', NULL)$$,               '22004'),
    ('to_state empty',           $$SELECT idem_transition('bi_orders', '1', '')$$,                 '22023'),
    ('to_state not a state',     $$SELECT idem_transition('bi_orders', '1', 'bogus')$$,            '22023'),
    ('to_state hostile',         $$SELECT idem_transition('bi_orders', '1', 'paid''; DROP TABLE bi_orders; --')$$, '22023'),
    ('to_state 1 MB',            $$SELECT idem_transition('bi_orders', '1', repeat('p', 1048576))$$, '22023'),
    ('key[] empty',              $$SELECT idem_transition('bi_orders', '{}'::text[], 'paid')$$,    '22023'),
    ('key[] too short',          $$SELECT idem_transition('bi_pk2', ARRAY['x'], 'paid')$$,         '22023'),
    ('key[] too long',           $$SELECT idem_transition('bi_orders', ARRAY['1', '2'], 'paid')$$, '22023'),
    ('text key, 2-column key',   $$SELECT idem_transition('bi_pk2', 'x', 'paid')$$,                '22023'),
    ('key empty',                $$SELECT idem_transition('bi_orders', '', 'paid')$$,              '22P02'),
    ('key not an integer',       $$SELECT idem_transition('bi_orders', '1; DROP TABLE bi_orders', 'paid')$$, '22P02'),
    ('key 1 MB of digits',       $$SELECT idem_transition('bi_orders', repeat('1', 1048576), 'paid')$$, '22003'),
    ('no such row',              $$SELECT idem_transition('bi_orders', '2', 'paid')$$,             'P0002'),
    ('no such row, hostile key', $$SELECT idem_transition('bi_pk2', ARRAY['x''); DROP TABLE bi_orders; --', '1'], 'paid')$$, 'P0002'),
    ('table without a machine',  $$SELECT idem_transition('bi_plain', '1', 'paid')$$,              '42704'),
    ('a view',                   $$SELECT idem_transition('bi_view', '1', 'paid')$$,               '42704'),
    -- UPDATE on the table is checked before the machine: 42704 for a superuser
    ('a system catalog',         $$SELECT idem_transition('pg_class', '1', 'paid')$$,
     CASE WHEN has_table_privilege('pg_class', 'UPDATE') THEN '42704' ELSE '42501' END),
    ('unknown table',            $$SELECT idem_transition('bi_nope', '1', 'paid')$$,               '42P01'),
    ('column not governed',      $$SELECT idem_transition('bi_orders', '1', 'paid', state_column => 'id')$$, '42704'),
    ('hostile column',           $$SELECT idem_transition('bi_orders', '1', 'paid', state_column => 'status"; DROP TABLE bi_orders; --')$$, '42704'),
    ('two machines, no column',  $$SELECT idem_transition('bi_two', '1', 'paid')$$,                '42702'),
    ('no primary key',           $$SELECT idem_transition('bi_nopk', '1', 'paid')$$,               '55000'),
    ('from a state without the move', $$SELECT idem_transition('bi_orders', '1', 'refunded', ARRAY['new'])$$, 'IK005'),
    ('not allowed from the row''s state', $$SELECT idem_transition('bi_orders', '1', 'refunded')$$, '00000'),
    ('from_states unrelated',    $$SELECT idem_transition('bi_orders', '1', 'paid', ARRAY['void'])$$, '00000'),
    ('from_states empty',        $$SELECT idem_transition('bi_orders', '1', 'paid', '{}')$$,        '00000'),
    ('key two-dimensional',      $$SELECT idem_transition('bi_orders', '{{1}}'::text[], 'paid')$$,   '22023')
) AS c(input, sql, expected);
SELECT pg_temp.written();

--
-- The trigger idem_enforce_transition, misused; the trigger functions
-- idem_log_transition and idem_apply_settings called directly;
-- idem_trigger_arg(tgargs, n), STRICT;
-- the internal idem_object_name(prefix, name, suffix), STRICT, and
-- idem_consumer_in_scope(consumer).  Each CREATE TRIGGER is undone with the
-- error of the INSERT or UPDATE that follows it.
--
SELECT input, pg_temp.try(sql, expected) AS outcome FROM (VALUES
    ('enforce: called directly',   $$SELECT idem_enforce_transition()$$,                               :'trigger_called_directly'),
    ('enforce: AFTER trigger',     $$CREATE TRIGGER bi_zz AFTER INSERT ON bi_plain FOR EACH ROW EXECUTE FUNCTION idem_enforce_transition('bi_m', 'status'); INSERT INTO bi_plain VALUES (5, 'new')$$, '39P01'),
    ('enforce: statement trigger', $$CREATE TRIGGER bi_zz BEFORE INSERT ON bi_plain FOR EACH STATEMENT EXECUTE FUNCTION idem_enforce_transition('bi_m', 'status'); INSERT INTO bi_plain VALUES (5, 'new')$$, '39P01'),
    ('enforce: DELETE trigger',    $$CREATE TRIGGER bi_zz BEFORE DELETE ON bi_plain FOR EACH ROW EXECUTE FUNCTION idem_enforce_transition('bi_m', 'status'); DELETE FROM bi_plain$$, '39P01'),
    ('enforce: INSTEAD OF trigger', $$CREATE TRIGGER bi_zz INSTEAD OF INSERT ON bi_view FOR EACH ROW EXECUTE FUNCTION idem_enforce_transition('bi_m', 'status'); INSERT INTO bi_view VALUES (5, 'new')$$, '39P01'),
    ('enforce: no arguments',      $$CREATE TRIGGER bi_zz BEFORE INSERT ON bi_plain FOR EACH ROW EXECUTE FUNCTION idem_enforce_transition(); INSERT INTO bi_plain VALUES (5, 'new')$$, '39P01'),
    ('enforce: 3 arguments',       $$CREATE TRIGGER bi_zz BEFORE INSERT ON bi_plain FOR EACH ROW EXECUTE FUNCTION idem_enforce_transition('bi_m', 'status', 'x'); INSERT INTO bi_plain VALUES (5, 'new')$$, '39P01'),
    ('enforce: unknown machine',   $$CREATE TRIGGER bi_zz BEFORE INSERT ON bi_plain FOR EACH ROW EXECUTE FUNCTION idem_enforce_transition('bi"; DROP TABLE bi_orders; --', 'status'); INSERT INTO bi_plain VALUES (5, 'new')$$, '42704'),
    ('enforce: machine 100 bytes', $$CREATE TRIGGER bi_zz BEFORE INSERT ON bi_plain FOR EACH ROW EXECUTE FUNCTION idem_enforce_transition('bi_mxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx', 'status'); INSERT INTO bi_plain VALUES (5, 'new')$$, '42704'),
    ('enforce: unknown column',    $$CREATE TRIGGER bi_zz BEFORE INSERT ON bi_plain FOR EACH ROW EXECUTE FUNCTION idem_enforce_transition('bi_m', 'status"; --'); INSERT INTO bi_plain VALUES (5, 'new')$$, '42703'),
    ('enforce: system column',     $$CREATE TRIGGER bi_zz BEFORE UPDATE ON bi_plain FOR EACH ROW EXECUTE FUNCTION idem_enforce_transition('bi_m', 'ctid'); UPDATE bi_plain SET id = id$$, '42703'),
    ('enforce: value not a state', $$CREATE TRIGGER bi_zz BEFORE UPDATE ON bi_plain FOR EACH ROW EXECUTE FUNCTION idem_enforce_transition('bi_m', 'status'); UPDATE bi_plain SET status = 'new'$$, 'IK005'),
    ('enforce: INSERT not initial', $$INSERT INTO bi_orders VALUES (2, 'paid')$$,                         'IK005'),
    ('enforce: INSERT NULL',        $$INSERT INTO bi_orders VALUES (2, NULL)$$,                           'IK005'),
    ('enforce: INSERT hostile',     $$INSERT INTO bi_orders VALUES (2, 'new''); DROP TABLE bi_orders; --')$$, 'IK005'),
    ('enforce: UPDATE to NULL',     $$UPDATE bi_orders SET status = NULL$$,                               'IK005'),
    ('enforce: UPDATE no move',     $$UPDATE bi_orders SET status = 'refunded'$$,                         'IK005'),
    ('log: called directly',        $$SELECT idem_log_transition()$$,                                     '0A000'),
    ('apply_settings: called directly', $$SELECT idem_apply_settings()$$,                                 '0A000'),
    ('machines_changed: called directly', $$SELECT idem_machines_changed()$$,                             :'trigger_called_directly'),
    ('machines_changed: row trigger', $$CREATE TRIGGER bi_zz BEFORE INSERT ON bi_plain FOR EACH ROW EXECUTE FUNCTION idem_machines_changed(); INSERT INTO bi_plain VALUES (5, 'new')$$, '39P01'),
    ('trigger_arg: invalid UTF-8',  $$SELECT idem_trigger_arg('\xc32800', 1)$$,                          '22021'),
    ('trigger_arg: tgargs NULL',    $$SELECT idem_trigger_arg(NULL, 1)$$,                                 '00000'),
    ('trigger_arg: n NULL',         $$SELECT idem_trigger_arg('\x6100', NULL)$$,                          '00000'),
    ('trigger_arg: empty',          $$SELECT idem_trigger_arg('', 1)$$,                                   '00000'),
    ('trigger_arg: n 0',            $$SELECT idem_trigger_arg('\x6100', 0)$$,                             '00000'),
    ('trigger_arg: n -1',           $$SELECT idem_trigger_arg('\x6100', -1)$$,                            '00000'),
    ('trigger_arg: n max int',      $$SELECT idem_trigger_arg('\x6100', 2147483647)$$,                    '00000'),
    ('trigger_arg: no NUL at end',  $$SELECT idem_trigger_arg('\x610062', 2)$$,                           '00000'),
    ('trigger_arg: only NULs',      $$SELECT idem_trigger_arg('\x000000', 3)$$,                           '00000'),
    ('trigger_arg: 1 MB of NULs',   $$SELECT idem_trigger_arg(decode(repeat('00', 1048576), 'hex'), 1048576)$$, '00000'),
    ('object_name: NULL',           $$SELECT idem_object_name('p_', NULL, '_s')$$,                        '00000'),
    ('object_name: 1 MB',           $$SELECT idem_object_name('zz_', repeat('n', 1048576), '_log')$$,     '00000'),
    ('object_name: multibyte',      $$SELECT idem_object_name('zz_', repeat('é', 40), '')$$,              '00000'),
    ('consumer_in_scope: NULL',     $$SELECT idem_consumer_in_scope(NULL)$$,                              '00000'),
    ('consumer_in_scope: no scope', $$SELECT idem_consumer_in_scope('bi-consumer')$$,                     '00000')
) AS c(input, sql, expected);
SELECT pg_temp.written();

--
-- Security: idem_grant(kind, grantee), idem_revoke_all(grantee),
-- idem_tenant_isolation(enabled)
--
SELECT input, pg_temp.try(sql, expected) AS outcome FROM (VALUES
    ('grant: kind NULL',           $$SELECT idem_grant(NULL, 'postgres')$$,                         '22004'),
    ('grant: grantee NULL',        $$SELECT idem_grant('client', NULL)$$,                           '22004'),
    ('grant: kind empty',          $$SELECT idem_grant('', 'postgres')$$,                           '22023'),
    ('grant: unknown kind',        $$SELECT idem_grant('admin', 'postgres')$$,                      '22023'),
    ('grant: hostile kind',        $$SELECT idem_grant('client TO PUBLIC; --', 'postgres')$$,        '22023'),
    ('grant: unknown role',        $$SELECT idem_grant('client', 'regress_bi_nobody')$$,            '42704'),
    ('grant: hostile role',        $$SELECT idem_grant('client', 'x; DROP TABLE bi_orders')$$,      '42602'),
    ('grant: role empty',          $$SELECT idem_grant('client', '')$$,                             '42602'),
    ('revoke_all: unknown role',   $$SELECT idem_revoke_all('regress_bi_nobody')$$,                 '42704'),
    ('revoke_all: hostile role',   $$SELECT idem_revoke_all('"x"; DROP TABLE bi_orders; --"')$$,    '42602'),
    ('tenant_isolation: text',     $$SELECT idem_tenant_isolation('maybe')$$,                       '22P02'),
    ('tenant_isolation: NULL',     $$SELECT idem_tenant_isolation(NULL)$$,                          '22004'),
    ('revoke_all: NULL',           $$SELECT idem_revoke_all(NULL)$$,                                '22004'),
    ('grant: PUBLIC (0)',          $$SELECT idem_grant('client', '-')$$,                            '22023'),
    ('revoke_all: PUBLIC (0)',     $$SELECT idem_revoke_all('-')$$,                                 '22023')
) AS c(input, sql, expected);
SELECT pg_temp.written();

-- The whole matrix, checked again: nothing written, nothing left behind.
SELECT count(*) AS bi_orders_rows FROM bi_orders;
SELECT pg_temp.written();

--
-- Bad input that works.  These calls write, as they should.
--

-- Hostile identifiers are data: keys, scopes, consumers, message ids and
-- streams with quotes, semicolons and spaces are stored as given.
SELECT outcome, token
FROM idem_claim($$bi'; DROP TABLE bi_orders; --"$$, '\x01', scope => $$sc"ope; x y$$);
SELECT idem_complete($$bi'; DROP TABLE bi_orders; --"$$, 1, '{"ok": true}', scope => $$sc"ope; x y$$);
SELECT scope, key, status FROM idem_lookup($$bi'; DROP TABLE bi_orders; --"$$, $$sc"ope; x y$$);
SELECT idem_inbox_accept($$bi-c"; x$$, $$m'; y$$) AS first, idem_inbox_accept($$bi-c"; x$$, $$m'; y$$) AS again;
SELECT idem_inbox_accept_seq($$bi-c"; x$$, $$s"; DROP TABLE bi_orders; --$$, 7) AS seq;
SELECT idem_inbox_watermark($$bi-c"; x$$, $$s"; DROP TABLE bi_orders; --$$) AS watermark;

-- ... and so are machine, state, table and column names: the machine
-- works, its Graphviz output is escaped, and the log table gets a quoted name.
SELECT idem_define_machine($$bi m"; DROP TABLE bi_orders; --$$,
                           $${"a\"b": ["c;d", "e f"], "c;d": ["g\\h"], "e f": ["'q'"]}$$, $${"a\"b"}$$);
SELECT * FROM idem_machine_states($$bi m"; DROP TABLE bi_orders; --$$);
SELECT idem_machine_dot($$bi m"; DROP TABLE bi_orders; --$$);
CREATE TABLE "bi weird;""t" ("id ""k" int PRIMARY KEY, "st""ate; x" text);
SELECT idem_attach_machine('"bi weird;""t"', 'st"ate; x', $$bi m"; DROP TABLE bi_orders; --$$, log => true);
SELECT table_name, state_column, machine, trigger_name FROM idem_attached_machines
WHERE machine LIKE 'bi m%';
INSERT INTO "bi weird;""t" VALUES (1, 'a"b');
SELECT idem_transition('"bi weird;""t"', '1', 'c;d') AS to_c,
       idem_transition('"bi weird;""t"', '1', 'g\h') AS to_g;
SELECT row_key, state_column, from_state, to_state FROM "bi weird;""t_state_log" ORDER BY logged_at;
SELECT idem_detach_machine('"bi weird;""t"', 'st"ate; x');
SELECT idem_drop_machine($$bi m"; DROP TABLE bi_orders; --$$);
DROP TABLE "bi weird;""t", "bi weird;""t_state_log";

-- A role whose name needs quoting.
CREATE ROLE "regress_bi ro;le""x";
SELECT idem_grant('client', '"regress_bi ro;le""x"');
SELECT has_function_privilege('regress_bi ro;le"x', 'idem_claim(text,bytea,interval,text,interval,boolean)', 'EXECUTE') AS granted;
SELECT idem_revoke_all('"regress_bi ro;le""x"');
SELECT has_function_privilege('regress_bi ro;le"x', 'idem_claim(text,bytea,interval,text,interval,boolean)', 'EXECUTE') AS granted;
DROP ROLE "regress_bi ro;le""x";

-- 1 MB recovery points, and 10 MB results, errors and details: stored and
-- replayed whole.  Fingerprints of 10 MB requests.
SELECT outcome, token FROM idem_claim('bi-big', '\x01', '1 hour');
SELECT octet_length(idem_checkpoint('bi-big', 1, repeat('r', 1048576))::text) > 0 AS checkpointed;
SELECT idem_complete('bi-big', 1, jsonb_build_object('blob', repeat('x', 10 * 1024 * 1024)), 200);
SELECT outcome, response_code, octet_length(result::text) AS result_bytes, octet_length(recovery_point) AS rp_bytes
FROM idem_claim('bi-big', '\x01');
SELECT outcome, token FROM idem_claim('bi-big-fail', '\x01', '1 hour');
SELECT idem_fail('bi-big-fail', 1, jsonb_build_object('blob', repeat('e', 10 * 1024 * 1024)), false);
SELECT outcome, octet_length(error::text) AS error_bytes FROM idem_claim('bi-big-fail', '\x01');
SELECT outcome, token FROM idem_claim('bi-big-unknown', '\x01', '1 hour');
SELECT idem_mark_unknown('bi-big-unknown', 1, jsonb_build_object('blob', repeat('u', 10 * 1024 * 1024)));
SELECT idem_resolve('bi-big-unknown', 'succeeded', jsonb_build_object('blob', repeat('s', 10 * 1024 * 1024)));
SELECT outcome, octet_length(result::text) AS result_bytes FROM idem_claim('bi-big-unknown', '\x01');
SELECT idem_fingerprint(jsonb_build_object('blob', repeat('x', 10 * 1024 * 1024)))
         = sha256(convert_to(jsonb_build_object('blob', repeat('x', 10 * 1024 * 1024))::text, 'UTF8')) AS jsonb_10mb,
       idem_fingerprint(repeat('x', 10 * 1024 * 1024)) = sha256(convert_to(repeat('x', 10 * 1024 * 1024), 'UTF8')) AS text_10mb,
       idem_fingerprint(convert_to(repeat('x', 10 * 1024 * 1024), 'UTF8')) = sha256(convert_to(repeat('x', 10 * 1024 * 1024), 'UTF8')) AS bytea_10mb;

--
-- Clean up: the tables are as they were before the fixtures.
--
DELETE FROM idempotency_records WHERE key LIKE 'bi%';
DELETE FROM idem_inbox WHERE consumer LIKE 'bi-%';
DELETE FROM idem_inbox_streams WHERE consumer LIKE 'bi-%';
SELECT idem_detach_machine('bi_orders', 'status'), idem_detach_machine('bi_nopk', 'status'),
       idem_detach_machine('bi_two', 'a'), idem_detach_machine('bi_two', 'b'),
       idem_detach_machine('bi_pk2', 'status');
SELECT idem_drop_machine('bi_m');
DROP VIEW bi_view;
DROP TABLE bi_orders, bi_nopk, bi_two, bi_plain, bi_pk2;
SELECT setval('idem_token_epoch', last_value, is_called) > 0 AS epoch_restored FROM epoch_at_start;
SELECT pg_temp.written('start') AS since_start;
