--
-- The digests of the pure functions, written out: idem_fingerprint (text,
-- bytea, jsonb), idem_request_fingerprint and idem_route_hash over inputs
-- chosen where an implementation could go wrong (backslashes, zero bytes,
-- non-ASCII text, the jsonb output's key order, number scales and string
-- escapes, ignore paths through arrays and scalars), in a UTF-8 and a LATIN1
-- database.  The expected output is the C edition's; the SQL edition
-- (sql/edition) computes the same functions in SQL and runs this test too,
-- so its passing shows that both editions give the same bytes.  The other
-- tests compare digests with sha256() of the same bytes; this one does not
-- need to, it holds the digests.
--
-- Runs partly in a LATIN1 database of its own, dropped at the end.
--
\i sql/include/expect_error.sql
SELECT current_database() AS regress_db \gset

--
-- idem_fingerprint(text): the bytes of the text in the database's encoding.
--
SELECT v.n, octet_length(v.t) AS bytes, encode(idem_fingerprint(v.t), 'hex') AS digest
FROM (VALUES (1, ''), (2, 'abc'), (3, 'a\b'), (4, E'\\'), (5, E'\\\\'), (6, E'\\000'),
             (7, E'\\377'), (8, E'\\x41'), (9, E'x\\0y'), (10, E'tab\there\nnewline'),
             (11, U&'caf\00E9'), (12, U&'\65E5\672C'), (13, U&'\+01F600'),
             (14, repeat('a\', 1000)), (15, ' '), (16, E'\u007f')) AS v(n, t)
ORDER BY v.n;

-- idem_fingerprint(bytea): every byte as it is.
SELECT v.n, encode(idem_fingerprint(v.b), 'hex') AS digest
FROM (VALUES (1, ''::bytea), (2, '\x00'), (3, '\x00ff00'), (4, '\x5c'), (5, '\x5c5c30303030'),
             (6, '\xe9'), (7, '\xc3a9')) AS v(n, b)
ORDER BY v.n;

--
-- idem_fingerprint(jsonb): the jsonb output (keys by length, then bytes;
-- the last duplicate; numbers as written; strings re-escaped).
--
SELECT v.n, v.j::text AS canonical, encode(idem_fingerprint(v.j), 'hex') AS digest
FROM (VALUES (1, 'null'::jsonb), (2, 'true'), (3, 'false'), (4, '0'), (5, '-0'), (6, '1.0'),
             (7, '1.00'), (8, '1e3'), (9, '1E-3'), (10, '1.5e+2'), (11, '-12.3400'),
             (12, '123456789012345678901234567890.0001'), (13, '0.0000001'),
             (14, '""'), (15, '"a\"b\\c\/d"'), (16, '"\b\f\n\r\t"'),
             (17, '"\u0001\u001f\u007f"'), (18, '"\u00e9\u65e5\ud83d\ude00"'),
             (19, '[]'), (20, '{}'), (21, '[1, [2, [3, {}]], "x", null]'),
             (22, '{"bb": 1, "a": 2, "c": {"zz": [], "y": {}}, "": 0}'),
             (23, '{"a": 1, "a": {"b": 2}, "a": 3}'),
             (24, E'{ "b" :{"y":null,\n\t"x" : true} ,"a":1 }'),
             (25, '{"\u00e9": 1, "e": 2, "\u65e5": 3}')) AS v(n, j)
ORDER BY v.n;

--
-- idem_request_fingerprint(method, path, body, ignore).
--
SELECT v.n, encode(idem_request_fingerprint(v.m, v.p, v.b, v.i), 'hex') AS digest
FROM (VALUES (1, 'GET', '/', '{}'::jsonb, NULL::text[]),
             (2, 'get', '/', '{}', NULL),
             (3, 'm-search', '*', 'null', NULL),
             (4, 'a0!#$%&''*+-.^_`|~z', '/x', '[]', NULL),
             (5, 'POST', '', '""', NULL),
             (6, 'POST', U&'/caf\00E9?q=\00E9', '{"b": 1.50, "a": "\u00e9"}', NULL),
             (7, 'PUT', '/a\b', '{"k": "\\"}', NULL),
             (8, 'POST', '/p', '{"a": 1, "b": {"c": 2, "d": 3}}', '{}'),
             (9, 'POST', '/p', '{"a": 1, "b": {"c": 2, "d": 3}}', '{a}'),
             (10, 'POST', '/p', '{"a": 1, "b": {"c": 2, "d": 3}}', '{b.c}'),
             (11, 'POST', '/p', '{"a": 1, "b": {"c": 2, "d": 3}}', '{b.c,b.d}'),
             (12, 'POST', '/p', '{"a": 1, "b": {"c": 2, "d": 3}}', '{b,b.c}'),
             (13, 'POST', '/p', '{"a": 1, "b": {"c": 2, "d": 3}}', '{b.c.x,x,x.y}'),
             (14, 'POST', '/p', '{"a": [{"b": 1}], "c": {"0": 1}}', '{a.0,a.b,a.0.b}'),
             (15, 'POST', '/p', '{"a": [{"b": 1}], "c": {"0": 1}}', '{c.0}'),
             (16, 'POST', '/p', '[{"a": 1}]', '{a,0,0.a}'),
             (17, 'POST', '/p', '"a"', '{a}'),
             (18, 'POST', '/p', '{"a": null, "b": "s", "c": 1}', '{a.x,b.x,c.x}'),
             (19, 'POST', '/p', '{"\u00e9": {"\u00e9": 1, "x": 2}}', ARRAY[U&'\00E9.\00E9']),
             (20, 'POST', '/p', '{"a\\b": 1, "a": {"b\"": 2}}', ARRAY['a\b', 'a.b"']),
             (21, 'POST', '/p', '{"a": {"b": {"c": {"d": 1, "e": 2}}}}', '[5:6]={a.b.c.d,a.b.x}')) AS v(n, m, p, b, i)
ORDER BY v.n;

-- The errors, in the order the C checks them.
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint(NULL, NULL, NULL)$$);
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint('', NULL, NULL)$$);
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint('', '/', NULL)$$);
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint('', '/', '{}', '{{a}}')$$);
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint('G(T', '/', '{}', '{{a}}')$$);
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint('GET', '/', '{}', '{{a}}')$$);
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint('GET', '/', '{}', '{a, NULL, ..}')$$);
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint('GET', '/', '{}', '{a, .., NULL}')$$);
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint('GET', '/', '[]', '{a.b., NULL}')$$);
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint(U&'GET\00A0', '/', '{}')$$);
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint(E'GET\n', '/', '{}')$$);

--
-- idem_route_hash(scope): the tenant part's UTF-8 bytes.
--
SELECT v.n, idem_route_hash(v.s) AS hash
FROM (VALUES (1, ''), (2, '/'), (3, 't1'), (4, 't1/'), (5, 't1//x'), (6, 'a\b/c'),
             (7, U&'caf\00E9/x'), (8, U&'\65E5\672C'), (9, U&'\+01F600/x'),
             (10, repeat('x', 255))) AS v(n, s)
ORDER BY v.n;
SELECT pg_temp.expect_error($$SELECT idem_route_hash(NULL)$$);
SELECT pg_temp.expect_error($$SELECT idem_route_hash(repeat('x', 256))$$);
SET idempotency.max_key_length = 4;
SELECT idem_route_hash('ab/c') = idem_route_hash('ab') AS within_4;
SELECT pg_temp.expect_error($$SELECT idem_route_hash('abcde')$$);
RESET idempotency.max_key_length;

--
-- A LATIN1 database: idem_fingerprint hashes the LATIN1 bytes, the request
-- fingerprint and the route hash the UTF-8 ones (the same digests as above).
--
SET client_min_messages = warning;
DROP DATABASE IF EXISTS regress_idem_pure_latin1;
RESET client_min_messages;
CREATE DATABASE regress_idem_pure_latin1 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C'
    TEMPLATE template0;
\c regress_idem_pure_latin1
SET client_encoding = 'UTF8';
CREATE EXTENSION idempotency;
SELECT encode(idem_fingerprint(U&'caf\00E9'), 'hex') AS text_latin1,
       idem_fingerprint(U&'caf\00E9') = sha256('\x636166e9') AS is_latin1_bytes,
       encode(idem_fingerprint('{"\u00e9": 1, "e": 2}'::jsonb), 'hex') AS jsonb_latin1;
SELECT encode(idem_request_fingerprint('POST', U&'/caf\00E9?q=\00E9', '{"b": 1.50, "a": "\u00e9"}'), 'hex') AS request_6,
       encode(idem_request_fingerprint('POST', '/p', '{"\u00e9": {"\u00e9": 1, "x": 2}}', ARRAY[U&'\00E9.\00E9']), 'hex') AS request_19;
SELECT idem_route_hash(U&'caf\00E9/x') AS route_7, idem_route_hash(U&'\00FF\00E9\00C9') AS route_latin1;
\c :regress_db
DROP DATABASE regress_idem_pure_latin1;
