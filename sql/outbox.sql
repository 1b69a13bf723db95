--
-- The transactional outbox: the bad-input matrix of every outbox function
-- (NULLs, empty and oversized values, zero and negative batches, leases and
-- intervals, wrong tokens, unknown ids, messages in the wrong state), each
-- case with its SQLSTATE and message, and a check after each group that
-- nothing was written: the rows of idem_outbox and both outbox sequences
-- are compared with a snapshot.  Then the DETAIL and HINT of the outbox's
-- own errors, and bad input that works (1 MB payloads, hostile names).
--
-- Message ids are random: outcomes show the fixture's name instead.
--
\set SHOW_CONTEXT never
-- '1 day -25 hours' is negative on every day only where no day has 25
-- hours: pg_regress's PST8PDT has one a year
SET TimeZone = 'UTC';
\i sql/include/expect_error.sql

DELETE FROM idem_outbox;
SELECT setval('idem_outbox_seq', 1, false) AS seq_reset,
       setval('idem_outbox_token', 1, false) AS token_reset;

-- fixtures: name -> id and the token of its claim
CREATE TEMP TABLE fx (name text PRIMARY KEY, id uuid, token bigint);

CREATE FUNCTION pg_temp.named(msg text) RETURNS text LANGUAGE plpgsql AS $f$
DECLARE
    f record;
BEGIN
    FOR f IN SELECT name, id FROM fx WHERE id IS NOT NULL LOOP
        msg := replace(msg, f.id::text, '<' || f.name || '>');
    END LOOP;
    RETURN msg;
END
$f$;

CREATE FUNCTION pg_temp.try(sql text, expected text) RETURNS text
LANGUAGE plpgsql AS $f$
DECLARE
    st text;
    msg text;
    res text;
    outcome text;
BEGIN
    BEGIN
        EXECUTE sql INTO res;
        st := '00000';
        msg := coalesce(res, 'NULL');
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
    END;
    msg := pg_temp.named(msg);
    IF octet_length(msg) > 110 THEN
        msg := left(msg, 80) || format('... (%s bytes)', octet_length(msg));
    END IF;
    IF st = expected THEN
        outcome := 'ok ' || st || ' ' || msg;
    ELSE
        outcome := format('UNEXPECTED %s %s (expected %s)', st, msg, expected);
    END IF;
    RETURN outcome;
END
$f$;

CREATE FUNCTION pg_temp.state() RETURNS TABLE (what text, rows bigint, digest text)
LANGUAGE sql AS $f$
    SELECT 'idem_outbox', count(*), md5(string_agg(t::text, ',' ORDER BY seq)) FROM idem_outbox t
    UNION ALL
    SELECT 'idem_outbox_seq', last_value, is_called::text FROM idem_outbox_seq
    UNION ALL
    SELECT 'idem_outbox_token', last_value, is_called::text FROM idem_outbox_token
$f$;
CREATE TEMP TABLE snapshot AS SELECT * FROM pg_temp.state();
CREATE FUNCTION pg_temp.snap() RETURNS void LANGUAGE sql AS $f$
    DELETE FROM snapshot;
    INSERT INTO snapshot SELECT * FROM pg_temp.state();
$f$;
CREATE FUNCTION pg_temp.written() RETURNS text LANGUAGE sql AS $f$
    SELECT coalesce('CHANGED: ' || string_agg(coalesce(s.what, n.what), ', ' ORDER BY coalesce(s.what, n.what)),
                    'nothing written')
    FROM snapshot s FULL JOIN pg_temp.state() n USING (what)
    WHERE s.rows IS DISTINCT FROM n.rows OR s.digest IS DISTINCT FROM n.digest
$f$;

--
-- Fixtures.
--   k1a, k1b   topic orders, key k1: k1a in flight (token 1), k1b pending behind it
--   k2         orders/k2, published (token 1)
--   k3         orders/k3, dead (token 2, after one attempt)
--   fresh      orders/k4, pending, never claimed (token 0)
--
INSERT INTO fx (name, id) VALUES
    ('k1a', idem_outbox_emit('orders', 'k1', '{"n": 1}')),
    ('k1b', idem_outbox_emit('orders', 'k1', '{"n": 2}')),
    ('k2', idem_outbox_emit('orders', 'k2', '{"n": 3}'));
UPDATE fx SET token = c.token FROM idem_outbox_claim('bi-relay', 10) c WHERE c.id = fx.id;
SELECT idem_outbox_ack(ARRAY[(SELECT id FROM fx WHERE name = 'k2')], 1) AS acked;
INSERT INTO fx (name, id) VALUES ('k3', idem_outbox_emit('orders', 'k3', '{"n": 4}'));
SET idempotency.outbox_max_attempts = 1;
UPDATE fx SET token = c.token FROM idem_outbox_claim('bi-relay', 10) c WHERE c.id = fx.id;
SELECT idem_outbox_nack((SELECT id FROM fx WHERE name = 'k3'), 2, '{"error": "poison"}') AS nacked;
RESET idempotency.outbox_max_attempts;
INSERT INTO fx (name, id) VALUES ('fresh', idem_outbox_emit('orders', 'k4', '{"n": 5}'));
SELECT f.name, o.seq, o.aggregateid, o.status, o.token, o.attempts
FROM fx f JOIN idem_outbox o USING (id) ORDER BY o.seq;
SELECT pg_temp.snap();

--
-- idem_outbox_emit(topic, key, payload, type, headers, scope, delay)
--
SELECT input, pg_temp.try(sql, expected) AS outcome FROM (VALUES
    ('topic NULL',          $$SELECT idem_outbox_emit(NULL, 'k', '{}')$$,                       '22004'),
    ('topic empty',         $$SELECT idem_outbox_emit('', 'k', '{}')$$,                         '22023'),
    ('topic 256 bytes',     $$SELECT idem_outbox_emit(repeat('t', 256), 'k', '{}')$$,           '22001'),
    ('topic 1 MB',          $$SELECT idem_outbox_emit(repeat('t', 1048576), 'k', '{}')$$,       '22001'),
    ('key NULL',            $$SELECT idem_outbox_emit('t', NULL, '{}')$$,                       '22004'),
    ('key empty',           $$SELECT idem_outbox_emit('t', '', '{}')$$,                         '22023'),
    ('key 256 bytes',       $$SELECT idem_outbox_emit('t', repeat('k', 256), '{}')$$,           '22001'),
    ('key 1 MB',            $$SELECT idem_outbox_emit('t', repeat('k', 1048576), '{}')$$,       '22001'),
    ('payload NULL',        $$SELECT idem_outbox_emit('t', 'k', NULL)$$,                        '22004'),
    ('payload invalid',     $$SELECT idem_outbox_emit('t', 'k', '{"a": ')$$,                    '22P02'),
    ('type empty',          $$SELECT idem_outbox_emit('t', 'k', '{}', type => '')$$,            '22023'),
    ('type 256 bytes',      $$SELECT idem_outbox_emit('t', 'k', '{}', type => repeat('y', 256))$$, '22001'),
    ('headers an array',    $$SELECT idem_outbox_emit('t', 'k', '{}', headers => '[1]')$$,      '22023'),
    ('headers a string',    $$SELECT idem_outbox_emit('t', 'k', '{}', headers => '"h"')$$,      '22023'),
    ('headers JSON null',   $$SELECT idem_outbox_emit('t', 'k', '{}', headers => 'null')$$,     '22023'),
    ('scope NULL',          $$SELECT idem_outbox_emit('t', 'k', '{}', scope => NULL)$$,         '22004'),
    ('scope 256 bytes',     $$SELECT idem_outbox_emit('t', 'k', '{}', scope => repeat('s', 256))$$, '22001'),
    ('delay negative',      $$SELECT idem_outbox_emit('t', 'k', '{}', delay => '-1 second')$$,  '22023'),
    ('delay 1 day -25 h',   $$SELECT idem_outbox_emit('t', 'k', '{}', delay => '1 day -25 hours')$$, '22023'),
    ('delay overflows',     $$SELECT idem_outbox_emit('t', 'k', '{}', delay => '300000 years')$$, '22008')
) AS c(input, sql, expected);
SELECT pg_temp.written();

--
-- idem_outbox_emit_batch(topic, keys, payloads, types, headers, scope, delay)
--
SELECT input, pg_temp.try(sql, expected) AS outcome FROM (VALUES
    ('topic NULL',          $$SELECT idem_outbox_emit_batch(NULL, '{a}', '{"{}"}')$$,          '22004'),
    ('topic empty',         $$SELECT idem_outbox_emit_batch('', '{a}', '{"{}"}')$$,            '22023'),
    ('topic 256 bytes',     $$SELECT idem_outbox_emit_batch(repeat('t', 256), '{a}', '{"{}"}')$$, '22001'),
    ('keys NULL',           $$SELECT idem_outbox_emit_batch('t', NULL, '{"{}"}')$$,            '22004'),
    ('payloads NULL',       $$SELECT idem_outbox_emit_batch('t', '{a}', NULL)$$,               '22004'),
    ('keys with a NULL',    $$SELECT idem_outbox_emit_batch('t', '{a,NULL}', '{"{}","{}"}')$$, '22004'),
    ('a key empty',         $$SELECT idem_outbox_emit_batch('t', '{a,""}', '{"{}","{}"}')$$,   '22023'),
    ('a key 256 bytes',     $$SELECT idem_outbox_emit_batch('t', ARRAY['a', repeat('k', 256)], '{"{}","{}"}')$$, '22001'),
    ('payloads with a NULL', $$SELECT idem_outbox_emit_batch('t', '{a,b}', '{"{}",NULL}')$$,   '22004'),
    ('fewer payloads',      $$SELECT idem_outbox_emit_batch('t', '{a,b}', '{"{}"}')$$,         '2202E'),
    ('more payloads',       $$SELECT idem_outbox_emit_batch('t', '{a}', '{"{}","{}"}')$$,      '2202E'),
    ('fewer types',         $$SELECT idem_outbox_emit_batch('t', '{a,b}', '{"{}","{}"}', types => '{x}')$$, '2202E'),
    ('a type empty',        $$SELECT idem_outbox_emit_batch('t', '{a}', '{"{}"}', types => '{""}')$$, '22023'),
    ('a type 256 bytes',    $$SELECT idem_outbox_emit_batch('t', '{a,b}', '{"{}","{}"}', types => ARRAY['x', repeat('y', 256)])$$, '22001'),
    ('more types',          $$SELECT idem_outbox_emit_batch('t', '{a}', '{"{}"}', types => '{x,y}')$$, '2202E'),
    ('types, no keys',      $$SELECT idem_outbox_emit_batch('t', '{}', '{}', types => '{x}')$$, '2202E'),
    ('fewer headers',       $$SELECT idem_outbox_emit_batch('t', '{a,b}', '{"{}","{}"}', headers => '{"{}"}')$$, '2202E'),
    ('a header an array',   $$SELECT idem_outbox_emit_batch('t', '{a}', '{"{}"}', headers => '{"[]"}')$$, '22023'),
    ('a header a string',   $$SELECT idem_outbox_emit_batch('t', '{a,b}', '{"{}","{}"}', headers => ARRAY['{}', '"h"']::jsonb[])$$, '22023'),
    ('a header JSON null',  $$SELECT idem_outbox_emit_batch('t', '{a}', '{"{}"}', headers => ARRAY['null']::jsonb[])$$, '22023'),
    ('a header a number',   $$SELECT idem_outbox_emit_batch('t', '{a}', '{"{}"}', headers => ARRAY['1']::jsonb[])$$, '22023'),
    ('more headers',        $$SELECT idem_outbox_emit_batch('t', '{a}', '{"{}"}', headers => '{"{}","{}"}')$$, '2202E'),
    ('keys two-dimensional', $$SELECT idem_outbox_emit_batch('t', '{{a},{b}}', '{"{}","{}"}')$$, '22023'),
    ('payloads two-dimensional', $$SELECT idem_outbox_emit_batch('t', '{a,b}', '{{"{}"},{"{}"}}')$$, '22023'),
    ('types two-dimensional', $$SELECT idem_outbox_emit_batch('t', '{a,b}', '{"{}","{}"}', types => '{{x},{y}}')$$, '22023'),
    ('headers two-dimensional', $$SELECT idem_outbox_emit_batch('t', '{a,b}', '{"{}","{}"}', headers => '{{"{}"},{"{}"}}')$$, '22023'),
    ('keys 1 x 1',          $$SELECT idem_outbox_emit_batch('t', '{{a}}', '{"{}"}')$$,         '22023'),
    ('scope NULL',          $$SELECT idem_outbox_emit_batch('t', '{a}', '{"{}"}', scope => NULL)$$, '22004'),
    ('scope 256 bytes',     $$SELECT idem_outbox_emit_batch('t', '{a}', '{"{}"}', scope => repeat('s', 256))$$, '22001'),
    ('delay negative',      $$SELECT idem_outbox_emit_batch('t', '{a}', '{"{}"}', delay => '-1 s')$$, '22023'),
    ('delay 1 day -25 h',   $$SELECT idem_outbox_emit_batch('t', '{a}', '{"{}"}', delay => '1 day -25 hours')$$, '22023'),
    ('delay overflows',     $$SELECT idem_outbox_emit_batch('t', '{a}', '{"{}"}', delay => '300000 years')$$, '22008'),
    ('no messages, bad delay', $$SELECT idem_outbox_emit_batch('t', '{}', '{}', delay => '-1 s')$$, '22023'),
    ('100001 messages',     $$SELECT idem_outbox_emit_batch('t', array_fill('k'::text, '{100001}'), array_fill('{}'::jsonb, '{100001}'))$$, '54000'),
    ('no messages',         $$SELECT idem_outbox_emit_batch('t', '{}', '{}')$$,                '00000')
) AS c(input, sql, expected);
SELECT pg_temp.written();

--
-- idem_outbox_claim(relay, batch, lease, topics): nothing is claimable in
-- topic 'none', so a valid call claims nothing
--
SELECT input, pg_temp.try(sql, expected) AS outcome FROM (VALUES
    ('relay NULL',          $$SELECT count(*) FROM idem_outbox_claim(NULL, topics => '{none}')$$, '22004'),
    ('relay empty',         $$SELECT count(*) FROM idem_outbox_claim('', topics => '{none}')$$,   '22023'),
    ('relay 256 bytes',     $$SELECT count(*) FROM idem_outbox_claim(repeat('r', 256), topics => '{none}')$$, '22001'),
    ('batch NULL',          $$SELECT count(*) FROM idem_outbox_claim('r', NULL, topics => '{none}')$$, '22004'),
    ('batch 0',             $$SELECT count(*) FROM idem_outbox_claim('r', 0, topics => '{none}')$$,    '22023'),
    ('batch -1',            $$SELECT count(*) FROM idem_outbox_claim('r', -1, topics => '{none}')$$,   '22023'),
    ('batch 10001',         $$SELECT count(*) FROM idem_outbox_claim('r', 10001, topics => '{none}')$$, '22023'),
    ('batch 2^31 - 1',      $$SELECT count(*) FROM idem_outbox_claim('r', 2147483647, topics => '{none}')$$, '22023'),
    ('batch -2^31',         $$SELECT count(*) FROM idem_outbox_claim('r', -2147483648, topics => '{none}')$$, '22023'),
    ('lease NULL',          $$SELECT count(*) FROM idem_outbox_claim('r', 1, NULL, '{none}')$$,       '22004'),
    ('lease 0',             $$SELECT count(*) FROM idem_outbox_claim('r', 1, '0', '{none}')$$,        '22023'),
    ('lease negative',      $$SELECT count(*) FROM idem_outbox_claim('r', 1, '-1 s', '{none}')$$,     '22023'),
    ('lease 1 day -25 h',   $$SELECT count(*) FROM idem_outbox_claim('r', 1, '1 day -25 hours', '{none}')$$, '22023'),
    ('lease overflows',     $$SELECT count(*) FROM idem_outbox_claim('r', 1, '300000 years', '{none}')$$, '22008'),
    ('topics with a NULL',  $$SELECT count(*) FROM idem_outbox_claim('r', 1, topics => '{none,NULL}')$$, '22004'),
    ('topics all NULL',     $$SELECT count(*) FROM idem_outbox_claim('r', 1, topics => '{NULL}')$$, '22004'),
    ('topics two-dimensional', $$SELECT count(*) FROM idem_outbox_claim('r', 1, topics => '{{none},{other}}')$$, '22023'),
    ('topics an empty name', $$SELECT count(*) FROM idem_outbox_claim('r', 1, topics => '{""}')$$,    '00000'),
    ('topics empty',        $$SELECT count(*) FROM idem_outbox_claim('r', 1, topics => '{}')$$,       '00000'),
    ('valid, nothing due',  $$SELECT count(*) FROM idem_outbox_claim('r', 1, topics => '{none}')$$,   '00000')
) AS c(input, sql, expected);
SELECT pg_temp.written();

--
-- idem_outbox_ack(ids, token)
--
SELECT input, pg_temp.try(sql, expected) AS outcome FROM (VALUES
    ('ids NULL',            $$SELECT idem_outbox_ack(NULL, 1)$$,                                 '22004'),
    ('ids with a NULL',     $$SELECT idem_outbox_ack(ARRAY[(SELECT id FROM fx WHERE name = 'k1a'), NULL], 1)$$, '22004'),
    ('token NULL',          $$SELECT idem_outbox_ack(ARRAY[(SELECT id FROM fx WHERE name = 'k1a')], NULL)$$, '22004'),
    ('token 0',             $$SELECT idem_outbox_ack(ARRAY[(SELECT id FROM fx WHERE name = 'k1a')], 0)$$,  '22023'),
    ('token -1',            $$SELECT idem_outbox_ack(ARRAY[(SELECT id FROM fx WHERE name = 'k1a')], -1)$$, '22023'),
    ('token too new',       $$SELECT idem_outbox_ack(ARRAY[(SELECT id FROM fx WHERE name = 'k1a')], 2)$$,  'IK002'),
    ('unknown id',          $$SELECT idem_outbox_ack('{00000000-0000-7000-8000-000000000000}', 1)$$,     'IK004'),
    ('one good, one unknown', $$SELECT idem_outbox_ack(ARRAY[(SELECT id FROM fx WHERE name = 'k1a'), '00000000-0000-7000-8000-000000000000'], 1)$$, 'IK004'),
    ('pending, never claimed', $$SELECT idem_outbox_ack(ARRAY[(SELECT id FROM fx WHERE name = 'fresh')], 1)$$, 'IK002'),
    ('pending behind its key', $$SELECT idem_outbox_ack(ARRAY[(SELECT id FROM fx WHERE name = 'k1a'), (SELECT id FROM fx WHERE name = 'k1b')], 1)$$, 'IK002'),
    ('dead, its own token', $$SELECT idem_outbox_ack(ARRAY[(SELECT id FROM fx WHERE name = 'k3')], 2)$$,   'IK003'),
    ('published, another token', $$SELECT idem_outbox_ack(ARRAY[(SELECT id FROM fx WHERE name = 'k2')], 2)$$, 'IK002'),
    ('published: a repeat', $$SELECT idem_outbox_ack(ARRAY[(SELECT id FROM fx WHERE name = 'k2')], 1)$$,   '00000'),
    ('unknown id, twice',   $$SELECT idem_outbox_ack('{00000000-0000-7000-8000-000000000000,00000000-0000-7000-8000-000000000000}', 1)$$, 'IK004'),
    ('stale token, twice',  $$SELECT idem_outbox_ack(ARRAY[(SELECT id FROM fx WHERE name = 'k3'), (SELECT id FROM fx WHERE name = 'k3')], 1)$$, 'IK002'),
    ('ids two-dimensional', $$SELECT idem_outbox_ack(ARRAY[ARRAY[(SELECT id FROM fx WHERE name = 'k1a')], ARRAY[(SELECT id FROM fx WHERE name = 'k1b')]], 1)$$, '22023'),
    ('no ids',              $$SELECT idem_outbox_ack('{}', 1)$$,                                  '00000'),
    ('no ids, token 0',     $$SELECT idem_outbox_ack('{}', 0)$$,                                  '22023')
) AS c(input, sql, expected);
SELECT pg_temp.written();

--
-- idem_outbox_nack(id, token, error, retry_after)
--
SELECT input, pg_temp.try(sql, expected) AS outcome FROM (VALUES
    ('id NULL',             $$SELECT idem_outbox_nack(NULL, 1, '{}')$$,                           '22004'),
    ('token NULL',          $$SELECT idem_outbox_nack((SELECT id FROM fx WHERE name = 'k1a'), NULL, '{}')$$, '22004'),
    ('token 0',             $$SELECT idem_outbox_nack((SELECT id FROM fx WHERE name = 'k1a'), 0, '{}')$$,    '22023'),
    ('token -1',            $$SELECT idem_outbox_nack((SELECT id FROM fx WHERE name = 'k1a'), -1, '{}')$$,   '22023'),
    ('error NULL',          $$SELECT idem_outbox_nack((SELECT id FROM fx WHERE name = 'k1a'), 1, NULL)$$,    '22004'),
    ('error a string',      $$SELECT idem_outbox_nack((SELECT id FROM fx WHERE name = 'k1a'), 1, '"refused"')$$, '22023'),
    ('error an array',      $$SELECT idem_outbox_nack((SELECT id FROM fx WHERE name = 'k1a'), 1, '["refused"]')$$, '22023'),
    ('error JSON null',     $$SELECT idem_outbox_nack((SELECT id FROM fx WHERE name = 'k1a'), 1, 'null')$$,  '22023'),
    ('retry_after negative', $$SELECT idem_outbox_nack((SELECT id FROM fx WHERE name = 'k1a'), 1, '{}', '-1 s')$$, '22023'),
    ('retry_after 1 day -25 h', $$SELECT idem_outbox_nack((SELECT id FROM fx WHERE name = 'k1a'), 1, '{}', '1 day -25 hours')$$, '22023'),
    ('retry_after overflows', $$SELECT idem_outbox_nack((SELECT id FROM fx WHERE name = 'k1a'), 1, '{}', '300000 years')$$, '22008'),
    ('token too new',       $$SELECT idem_outbox_nack((SELECT id FROM fx WHERE name = 'k1a'), 7, '{}')$$,    'IK002'),
    ('unknown id',          $$SELECT idem_outbox_nack('00000000-0000-7000-8000-000000000000', 1, '{}')$$, 'IK004'),
    ('stale token',         $$SELECT idem_outbox_nack((SELECT id FROM fx WHERE name = 'k3'), 1, '{}')$$,     'IK002'),
    ('published',           $$SELECT idem_outbox_nack((SELECT id FROM fx WHERE name = 'k2'), 1, '{}')$$,     'IK003'),
    ('dead',                $$SELECT idem_outbox_nack((SELECT id FROM fx WHERE name = 'k3'), 2, '{}')$$,     'IK003'),
    ('pending, never claimed', $$SELECT idem_outbox_nack((SELECT id FROM fx WHERE name = 'fresh'), 1, '{}')$$, 'IK002')
) AS c(input, sql, expected);
SELECT pg_temp.written();

--
-- idem_outbox_retry(id)
--
SELECT input, pg_temp.try(sql, expected) AS outcome FROM (VALUES
    ('id NULL',             $$SELECT idem_outbox_retry(NULL)$$,                                   '22004'),
    ('unknown id',          $$SELECT idem_outbox_retry('00000000-0000-7000-8000-000000000000')$$, 'IK004'),
    ('in flight',           $$SELECT idem_outbox_retry((SELECT id FROM fx WHERE name = 'k1a'))$$, 'IK003'),
    ('pending',             $$SELECT idem_outbox_retry((SELECT id FROM fx WHERE name = 'fresh'))$$, 'IK003'),
    ('published',           $$SELECT idem_outbox_retry((SELECT id FROM fx WHERE name = 'k2'))$$,  'IK003')
) AS c(input, sql, expected);
SELECT pg_temp.written();

--
-- The internal helpers: idem_outbox_check_token (the errors of ack and
-- nack), idem_outbox_counted (STRICT: NULL counts nothing), idem_outbox_stuck,
-- idem_outbox_lock_key (STRICT: NULL locks nothing; any text is a key)
--
SELECT input, pg_temp.try(sql, expected) AS outcome FROM (VALUES
    ('check_token NULL id', $$SELECT idem_outbox_check_token(NULL, 1, 'ack')$$,                 '22004'),
    ('check_token NULL token', $$SELECT idem_outbox_check_token((SELECT id FROM fx WHERE name = 'k1a'), NULL, 'ack')$$, '22004'),
    ('check_token NULL verb', $$SELECT idem_outbox_check_token((SELECT id FROM fx WHERE name = 'k1a'), 1, NULL)$$, '22004'),
    ('check_token unknown', $$SELECT idem_outbox_check_token('00000000-0000-7000-8000-000000000000', 1, 'ack')$$, 'IK004'),
    ('check_token stale',   $$SELECT idem_outbox_check_token((SELECT id FROM fx WHERE name = 'k3'), 1, 'ack')$$, 'IK002'),
    ('check_token current', $$SELECT idem_outbox_check_token((SELECT id FROM fx WHERE name = 'k1a'), 1, 'ack')$$, 'IK003'),
    ('counted unknown name', $$SELECT idem_outbox_counted('bogus', 1)$$,                           '22023'),
    ('counted negative',    $$SELECT idem_outbox_counted('published', -1)$$,                       '22023'),
    ('counted NULL',        $$SELECT idem_outbox_counted(NULL, 1)$$,                               '00000'),
    ('counted NULL n',      $$SELECT idem_outbox_counted('published', NULL)$$,                     '00000'),
    ('counted -2^63',       $$SELECT idem_outbox_counted('dead', -9223372036854775808)$$,          '22023'),
    ('counted unknown, -1', $$SELECT idem_outbox_counted('bogus', -1)$$,                           '22023'),
    ('counted 0',           $$SELECT idem_outbox_counted('retried', 0)$$,                          '00000'),
    ('stuck',               $$SELECT count(*) FROM idem_outbox_stuck()$$,                          '00000'),
    ('lock_key NULL',       $$SELECT idem_outbox_lock_key(NULL, 't', 'k')$$,                       '00000'),
    ('lock_key NULL topic', $$SELECT idem_outbox_lock_key('', NULL, 'k')$$,                        '00000'),
    ('lock_key NULL key',   $$SELECT idem_outbox_lock_key('', 't', NULL)$$,                        '00000'),
    ('lock_key empty',      $$SELECT idem_outbox_lock_key('', '', '')$$,                            '00000'),
    ('lock_key long',       $$SELECT idem_outbox_lock_key('', 't', repeat('k', 100000))$$,         '00000')
) AS c(input, sql, expected);
SELECT pg_temp.written();

--
-- Infinite intervals, which PostgreSQL has from 17 on: an infinite delay or
-- retry_after would make a message that is never due, an infinite lease one
-- that no relay could take over after a crash.  Each must be refused.  On 15
-- 'infinity' is no interval (22007) and the call is never made, so only
-- "refused" is shown, and 15 and 17 compare against the same lines.
--
CREATE FUNCTION pg_temp.refused(sql text) RETURNS text LANGUAGE plpgsql AS $f$
DECLARE
    outcome text;
BEGIN
    outcome := pg_temp.try(sql, CASE WHEN current_setting('server_version_num')::int < 170000
                                     THEN '22007' ELSE '22023' END);
    -- +infinity must be refused as infinite, -infinity as negative
    RETURN CASE WHEN outcome LIKE 'ok 22007 invalid input syntax for type interval: "%infinity"'
                  OR (outcome LIKE 'ok 22023 % must be finite' AND sql NOT LIKE '%-infinity%')
                  OR (outcome ~ '^ok 22023 .* must (not be negative|be positive)$' AND sql LIKE '%-infinity%')
                THEN 'refused' ELSE outcome END;
END
$f$;
-- (in a transaction rolled back, so that a row written here shows only here)
BEGIN;
SELECT input, pg_temp.refused(sql) AS outcome FROM (VALUES
    ('emit, delay infinity',   $$SELECT idem_outbox_emit('t', 'k', '{}', delay => 'infinity')$$),
    ('emit, delay -infinity',  $$SELECT idem_outbox_emit('t', 'k', '{}', delay => '-infinity')$$),
    ('batch, delay infinity',  $$SELECT idem_outbox_emit_batch('t', '{a}', '{"{}"}', delay => 'infinity')$$),
    ('batch, delay -infinity', $$SELECT idem_outbox_emit_batch('t', '{a}', '{"{}"}', delay => '-infinity')$$),
    ('claim, lease infinity',  $$SELECT count(*) FROM idem_outbox_claim('r', 1, 'infinity', '{none}')$$),
    ('claim, lease -infinity', $$SELECT count(*) FROM idem_outbox_claim('r', 1, '-infinity', '{none}')$$),
    ('nack, retry_after infinity',  $$SELECT idem_outbox_nack((SELECT id FROM fx WHERE name = 'k1a'), 1, '{}', 'infinity')$$),
    ('nack, retry_after -infinity', $$SELECT idem_outbox_nack((SELECT id FROM fx WHERE name = 'k1a'), 1, '{}', '-infinity')$$)
) AS c(input, sql);
SELECT pg_temp.written();
ROLLBACK;
SELECT pg_temp.snap();

--
-- The outbox's own errors in full.
--
SELECT pg_temp.expect_error($$SELECT idem_outbox_emit('t', 'k', NULL)$$);
SELECT pg_temp.expect_error($$SELECT idem_outbox_emit('t', 'k', '{}', headers => '[]')$$);
SELECT pg_temp.expect_error($$SELECT idem_outbox_emit('t', repeat('k', 300), '{}')$$);
SELECT pg_temp.expect_error($$SELECT idem_outbox_emit('t', 'k', '{}', delay => '-1 s')$$);
SELECT pg_temp.expect_error($$SELECT idem_outbox_emit_batch('t', '{a,b}', '{"{}"}')$$);
SELECT pg_temp.expect_error($$SELECT idem_outbox_claim('r', 0)$$);
SELECT pg_temp.expect_error($$SELECT idem_outbox_claim('r', lease => '0')$$);
SELECT pg_temp.expect_error($$SELECT idem_outbox_nack(NULL, 1, NULL)$$);
SELECT pg_temp.expect_error($$SELECT idem_outbox_nack(gen_random_uuid(), 1, NULL)$$);
-- stale: k3 was dead under token 2, k1a is in flight under token 1
CREATE FUNCTION pg_temp.expect_named_error(sql text) RETURNS void LANGUAGE plpgsql AS $f$
DECLARE
    st text; msg text; det text; hnt text;
BEGIN
    BEGIN
        EXECUTE sql;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
                                det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
    END;
    msg := st || ': ' || pg_temp.named(msg);
    IF hnt <> '' THEN
        RAISE EXCEPTION USING ERRCODE = st, MESSAGE = msg, DETAIL = det, HINT = hnt;
    END IF;
    RAISE EXCEPTION USING ERRCODE = st, MESSAGE = msg, DETAIL = det;
END
$f$;
SELECT pg_temp.expect_named_error($$SELECT idem_outbox_ack(ARRAY[(SELECT id FROM fx WHERE name = 'k3')], 1)$$);
SELECT pg_temp.expect_named_error($$SELECT idem_outbox_ack(ARRAY[(SELECT id FROM fx WHERE name = 'k1a')], 5)$$);
SELECT pg_temp.expect_named_error($$SELECT idem_outbox_nack((SELECT id FROM fx WHERE name = 'k2'), 1, '{}')$$);
SELECT pg_temp.expect_named_error($$SELECT idem_outbox_retry((SELECT id FROM fx WHERE name = 'fresh'))$$);
SELECT pg_temp.expect_named_error($$SELECT idem_outbox_ack('{00000000-0000-7000-8000-000000000000}', 1)$$);
SELECT pg_temp.written();

--
-- Bad input that works: a 1 MB payload, a payload that is JSON null,
-- hostile names, an ack naming one message twice; rolled back.
--
BEGIN;
CREATE TEMP TABLE works ON COMMIT DROP AS
SELECT 'hostile' AS name,
       idem_outbox_emit('t''; DROP TABLE x; --', 'k "quoted" \ key',
                        jsonb_build_object('big', repeat('x', 1048576)),
                        type => 'Type; --', headers => '{"h": "v"}') AS id
UNION ALL
SELECT 'JSON null', idem_outbox_emit('t', 'k', 'null');
SELECT w.name, octet_length(o.payload::text) AS payload_bytes, o.aggregatetype, o.aggregateid,
       o.type, o.headers, o.status
FROM works w JOIN idem_outbox o USING (id) ORDER BY o.seq;
SELECT cardinality(idem_outbox_emit_batch('t', '{a,b,c}', '{1,2,3}', types => '{x,NULL,z}',
                                          headers => '{NULL,"{}",NULL}')) AS emitted;
SELECT o.aggregateid, o.payload, o.type, o.headers FROM idem_outbox o
WHERE o.aggregatetype = 't' AND o.aggregateid IN ('a', 'b', 'c') ORDER BY o.seq;
-- one id twice in an ack: published once, and 1 returned
SELECT idem_outbox_ack(ARRAY[(SELECT id FROM fx WHERE name = 'k1a'), (SELECT id FROM fx WHERE name = 'k1a')], 1) AS acked;
SELECT f.name, o.status, o.token FROM fx f JOIN idem_outbox o USING (id) WHERE f.name = 'k1a';
ROLLBACK;
-- no rows; the sequence moved (sequences are not transactional)
SELECT pg_temp.written();
DELETE FROM idem_outbox;
