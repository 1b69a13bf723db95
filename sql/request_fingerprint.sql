--
-- idem_request_fingerprint(method, path, body, ignore): SHA-256 of an HTTP
-- request.  The digest's input is, byte by byte:
--
--   0x01                               the scheme's version
--   uint32 big-endian, then the bytes  the method, upper-cased (ASCII)
--   uint32 big-endian, then the bytes  the path, as given
--   uint32 big-endian, then the bytes  the canonical body (its jsonb output,
--                                      as idem_fingerprint(jsonb) hashes it),
--                                      after the ignore paths are removed
--
-- The expected digests of the test vectors below were computed outside the
-- server, with Python's hashlib over that layout:
--
--   import hashlib, struct
--   def fp(method, path, body):
--       f = [method.upper().encode(), path.encode(), body.encode()]
--       return hashlib.sha256(b'\x01' + b''.join(struct.pack('>I', len(x)) + x
--                                                 for x in f)).hexdigest()
--
-- where body is the canonical text, written out by hand.
--

-- Errors are shown as "ERROR:  <SQLSTATE>: <message>" with DETAIL and HINT.
\i sql/include/expect_error.sql

--
-- Test vectors.
--
SELECT encode(idem_request_fingerprint('GET', '/orders', '{}'), 'hex') AS get_orders;
-- canonical body {"amount": 100, "currency": "EUR"}
SELECT encode(idem_request_fingerprint('post', '/payments', '{"currency":"EUR","amount":100}'), 'hex') AS post_payments;
SELECT encode(idem_request_fingerprint('PATCH', '/users/42', 'null'), 'hex') AS patch_null_body;
-- UTF-8 in the path and the body; the number keeps its written scale
SELECT encode(idem_request_fingerprint('DELETE', '/caf' || chr(233), ('["' || chr(233) || '", 1.50]')::jsonb), 'hex') AS utf8;
-- canonical body {"meta": {"client": "web"}, "amount": 100} (shorter keys first)
SELECT encode(idem_request_fingerprint('POST', '/payments',
                                       '{"amount": 100, "meta": {"trace_id": "abc", "client": "web"}}',
                                       ARRAY['meta.trace_id']), 'hex') AS with_ignore;
-- an empty path is hashed as the empty string
SELECT encode(idem_request_fingerprint('GET', '', '""'), 'hex') AS empty_path;

-- The same layout built in SQL (int4send is big-endian), for any request.
CREATE FUNCTION pg_temp.layout(method text, path text, body jsonb) RETURNS bytea
LANGUAGE sql IMMUTABLE AS $$
    SELECT '\x01'::bytea
           || int4send(octet_length(upper(method))) || convert_to(upper(method), 'UTF8')
           || int4send(octet_length(path)) || convert_to(path, 'UTF8')
           || int4send(octet_length(body::text)) || convert_to(body::text, 'UTF8')
$$;
SELECT idem_request_fingerprint(m, p, b) = sha256(pg_temp.layout(m, p, b)) AS matches_layout, m, p, b
FROM (VALUES ('GET', '/orders', '{}'::jsonb),
             ('put', '/orders/1?x=1', '{"b": [1, {"d": null, "c": true}], "a": "x"}'),
             ('OPTIONS', '*', '0'),
             ('M-SEARCH', '/', '[]')) AS v(m, p, b);

-- The body is hashed in the canonical form of idem_fingerprint(jsonb): in
-- the input of GET / it starts at byte 18 (1 + 4 + 3 + 4 + 1 + 4 before it).
SELECT substr(pg_temp.layout('GET', '/', '{"b":1, "a":2}'), 18) = convert_to('{"a": 2, "b": 1}', 'UTF8') AS body_canonical,
       sha256(substr(pg_temp.layout('GET', '/', '{"b":1, "a":2}'), 18)) = idem_fingerprint('{"b":1, "a":2}'::jsonb) AS same_as_idem_fingerprint;

-- A large body, stored out of line (TOAST), is hashed whole.
CREATE TEMP TABLE big AS
SELECT (SELECT jsonb_build_object('items', jsonb_agg(jsonb_build_object('n', g, 's', md5(g::text))),
                                  'meta', jsonb_build_object('trace_id', 't'))
        FROM generate_series(1, 20000) g) AS j;
SELECT pg_column_size(j) < octet_length(j::text) AS compressed,
       idem_request_fingerprint('POST', '/bulk', j) = sha256(pg_temp.layout('POST', '/bulk', j)) AS big_body,
       idem_request_fingerprint('POST', '/bulk', j, '{meta.trace_id}')
       = sha256(pg_temp.layout('POST', '/bulk', j #- '{meta,trace_id}')) AS big_body_ignore
FROM big;
DROP TABLE big;

--
-- What makes two requests the same, and what does not.
--
-- The method is case-insensitive.
SELECT idem_request_fingerprint('get', '/a', '{}') = idem_request_fingerprint('GET', '/a', '{}') AS lower,
       idem_request_fingerprint('Get', '/a', '{}') = idem_request_fingerprint('GET', '/a', '{}') AS mixed;

-- Key order and whitespace of the body do not matter, at any depth.
SELECT idem_request_fingerprint('POST', '/a', '{"a": 1, "b": {"x": true, "y": null}}')
       = idem_request_fingerprint('POST', '/a', E'{ "b" :{"y":null,\n"x" : true} ,"a":1 }') AS key_order;

-- The method, the path and the body each matter.
SELECT idem_request_fingerprint('POST', '/orders', '{"n": 1}') <> idem_request_fingerprint('PUT', '/orders', '{"n": 1}') AS method_matters,
       idem_request_fingerprint('POST', '/orders', '{"n": 1}') <> idem_request_fingerprint('POST', '/payments', '{"n": 1}') AS path_matters,
       idem_request_fingerprint('POST', '/orders', '{"n": 1}') <> idem_request_fingerprint('POST', '/orders', '{"n": 2}') AS body_matters,
       idem_request_fingerprint('POST', '/orders', '{}') <> idem_fingerprint('{}'::jsonb) AS not_the_body_alone;

-- The path is hashed as given: no case folding, no decoding, the query kept.
SELECT idem_request_fingerprint('GET', '/A', '{}') <> idem_request_fingerprint('GET', '/a', '{}') AS path_case,
       idem_request_fingerprint('GET', '/%61', '{}') <> idem_request_fingerprint('GET', '/a', '{}') AS not_decoded,
       idem_request_fingerprint('GET', '/a?x=1', '{}') <> idem_request_fingerprint('GET', '/a', '{}') AS query_kept;

-- The fields are length-prefixed, so moving bytes from one to the next
-- changes the digest: "GET" + "/a" and "GE" + "T/a"; "/a" + 12 and "/a1" + 2.
SELECT idem_request_fingerprint('GET', '/a', '{}') <> idem_request_fingerprint('GE', 'T/a', '{}') AS method_path,
       idem_request_fingerprint('GET', '/a', '12') <> idem_request_fingerprint('GET', '/a1', '2') AS path_body;

--
-- ignore: key paths removed from the body before hashing.
--
-- Depth 1 and depth 2.
SELECT idem_request_fingerprint('POST', '/a', '{"n": 1, "trace_id": "x"}', '{trace_id}')
       = idem_request_fingerprint('POST', '/a', '{"n": 1}') AS depth_1,
       idem_request_fingerprint('POST', '/a', '{"n": 1, "meta": {"trace_id": "x", "client": "web"}}', '{meta.trace_id}')
       = idem_request_fingerprint('POST', '/a', '{"n": 1, "meta": {"client": "web"}}') AS depth_2,
       idem_request_fingerprint('POST', '/a', '{"n": 1, "meta": {"trace_id": "x"}}', '{meta.trace_id}')
       = idem_request_fingerprint('POST', '/a', '{"n": 1, "meta": {}}') AS leaves_empty_object;

-- So two retries that differ only there have the same fingerprint.
SELECT idem_request_fingerprint('POST', '/a', '{"n": 1, "meta": {"trace_id": "x", "sent_at": 1}}', '{meta.trace_id,meta.sent_at}')
       = idem_request_fingerprint('POST', '/a', '{"meta": {"sent_at": 2, "trace_id": "y"}, "n": 1}', '{meta.trace_id,meta.sent_at}') AS retries_equal,
       idem_request_fingerprint('POST', '/a', '{"n": 1, "meta": {"trace_id": "x"}}', '{meta.trace_id}')
       <> idem_request_fingerprint('POST', '/a', '{"n": 2, "meta": {"trace_id": "x"}}', '{meta.trace_id}') AS rest_still_counts;

-- A removed object goes whole; a path below it then changes nothing; the
-- order of the paths and repeats do not matter.
SELECT idem_request_fingerprint('POST', '/a', '{"n": 1, "meta": {"a": 1, "b": {"c": 2}}}', '{meta}')
       = idem_request_fingerprint('POST', '/a', '{"n": 1}') AS whole_object,
       idem_request_fingerprint('POST', '/a', '{"n": 1, "meta": {"a": 1}}', '{meta.a,meta}')
       = idem_request_fingerprint('POST', '/a', '{"n": 1}') AS prefix_wins,
       idem_request_fingerprint('POST', '/a', '{"n": 1, "a": 1, "b": 2}', '{b,a,b}')
       = idem_request_fingerprint('POST', '/a', '{"n": 1}') AS order_and_repeats,
       idem_request_fingerprint('POST', '/a', '{"a": 1}', '{a}')
       = idem_request_fingerprint('POST', '/a', '{}') AS everything;

-- Keys match exactly: byte by byte, case included.
SELECT idem_request_fingerprint('POST', '/a', '{"Trace": 1}', '{trace}')
       = idem_request_fingerprint('POST', '/a', '{"Trace": 1}') AS case_sensitive,
       idem_request_fingerprint('POST', '/a', ('{"' || chr(233) || '": 1, "n": 2}')::jsonb, ARRAY[chr(233)])
       = idem_request_fingerprint('POST', '/a', '{"n": 2}') AS utf8_key;

-- A NULL or empty ignore removes nothing.
SELECT idem_request_fingerprint('POST', '/a', '{"a": 1}', NULL) = idem_request_fingerprint('POST', '/a', '{"a": 1}') AS null_ignore,
       idem_request_fingerprint('POST', '/a', '{"a": 1}', '{}') = idem_request_fingerprint('POST', '/a', '{"a": 1}') AS empty_ignore;

-- A missing path removes nothing: a missing key at either depth, a path
-- that meets a scalar, an array or null before its end, or a body that is
-- not an object.
SELECT p AS ignore_path, b AS body,
       idem_request_fingerprint('POST', '/a', b, ARRAY[p]) = idem_request_fingerprint('POST', '/a', b) AS unchanged
FROM (VALUES ('x', '{"a": {"b": 1}}'::jsonb),
             ('a.x', '{"a": {"b": 1}}'),
             ('x.b', '{"a": {"b": 1}}'),
             ('a.b.c', '{"a": {"b": 1}}'),
             ('a.b', '{"a": null}'),
             ('a.b', '{"a": [{"b": 1}]}'),
             ('a.0', '{"a": [1, 2]}'),
             ('0', '[1, 2]'),
             ('a', '[{"a": 1}]'),
             ('a', '"a"'),
             ('a', 'null')) AS v(p, b);

-- Limitations: a key that contains a dot cannot be named, nor an array
-- element; remove those from the body with #- before hashing.
SELECT idem_request_fingerprint('POST', '/a', '{"a.b": 1, "n": 2}', '{a.b}')
       = idem_request_fingerprint('POST', '/a', '{"a.b": 1, "n": 2}') AS dotted_key_not_named,
       idem_request_fingerprint('POST', '/a', '{"a.b": 1, "n": 2}'::jsonb #- '{a.b}')
       = idem_request_fingerprint('POST', '/a', '{"n": 2}') AS dotted_key_with_minus,
       idem_request_fingerprint('POST', '/a', '{"items": [{"t": 1, "n": 2}]}'::jsonb #- '{items,0,t}')
       = idem_request_fingerprint('POST', '/a', '{"items": [{"n": 2}]}') AS array_element_with_minus;

--
-- The untyped-parameter trap.  A client that sends parameters untyped, as
-- node-postgres does, makes idem_fingerprint($1) resolve to the text
-- overload: the string is hashed as written, so reordered keys differ.  Cast
-- the parameter ($1::jsonb).  idem_request_fingerprint has one form, so its
-- untyped body parameter is jsonb already.
--
PREPARE fp_untyped AS SELECT idem_fingerprint($1);
PREPARE fp_cast AS SELECT idem_fingerprint($1::jsonb);
PREPARE rfp_untyped AS SELECT idem_request_fingerprint($1, $2, $3);
SELECT name, parameter_types FROM pg_prepared_statements WHERE name LIKE '%fp_%' ORDER BY name;
EXECUTE fp_untyped('{"a":1,"b":2}') \gset u1_
EXECUTE fp_untyped('{"b":2,"a":1}') \gset u2_
EXECUTE fp_cast('{"a":1,"b":2}') \gset c1_
EXECUTE fp_cast('{"b":2,"a":1}') \gset c2_
EXECUTE rfp_untyped('POST', '/a', '{"a":1,"b":2}') \gset r1_
EXECUTE rfp_untyped('POST', '/a', '{"b":2,"a":1}') \gset r2_
SELECT :'u1_idem_fingerprint' = :'u2_idem_fingerprint' AS untyped_equal,
       :'c1_idem_fingerprint' = :'c2_idem_fingerprint' AS cast_equal,
       :'r1_idem_request_fingerprint' = :'r2_idem_request_fingerprint' AS request_fingerprint_equal;
DEALLOCATE ALL;

--
-- Errors.
--
-- NULL arguments (ignore excepted) are errors, not a NULL digest.
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint(NULL, '/a', '{}')$$);
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint('GET', NULL, '{}')$$);
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint('GET', '/a', NULL)$$);
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint(NULL, NULL, NULL, NULL)$$);

-- The method is a non-empty HTTP token.
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint('', '/a', '{}')$$);
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint('GET ', '/a', '{}')$$);
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint('GET /a', '', '{}')$$);
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint(E'GET\t', '/a', '{}')$$);
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint('G' || chr(201) || 'T', '/a', '{}')$$);
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint('GET()', '/a', '{}')$$);

-- ignore: no NULL element, no empty path, no empty key, one dimension.
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint('GET', '/a', '{}', ARRAY['a', NULL])$$);
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint('GET', '/a', '{}', ARRAY[''])$$);
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint('GET', '/a', '{}', ARRAY['.a'])$$);
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint('GET', '/a', '{}', ARRAY['a.'])$$);
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint('GET', '/a', '{}', ARRAY['a..b'])$$);
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint('GET', '/a', '{}', ARRAY['.'])$$);
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint('GET', '/a', '{}', '{{a},{b}}')$$);
-- the paths are checked whatever the body
SELECT pg_temp.expect_error($$SELECT idem_request_fingerprint('GET', '/a', 'null', ARRAY['a..b'])$$);

--
-- IMMUTABLE: usable in an index expression and a generated column.
--
CREATE TEMP TABLE requests (
    method text, path text, body jsonb,
    fp bytea GENERATED ALWAYS AS (idem_request_fingerprint(method, path, body, '{meta.trace_id}')) STORED
);
CREATE INDEX ON requests (idem_request_fingerprint(method, path, body));
INSERT INTO requests (method, path, body) VALUES ('post', '/a', '{"n": 1, "meta": {"trace_id": "x"}}');
SELECT fp = idem_request_fingerprint('POST', '/a', '{"meta": {}, "n": 1}') AS fp_matches FROM requests;
DROP TABLE requests;
