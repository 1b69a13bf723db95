--
-- idem_fingerprint(): SHA-256 of the request, computed in the server.
--
-- The text and bytea forms hash the bytes as given; the jsonb form hashes the
-- canonical text of the value (its jsonb output), so key order, whitespace
-- and duplicate keys do not matter, but the written scale of numbers does.
-- Every digest is compared with the built-in sha256() of the same bytes.
--

-- A known test vector (FIPS 180-2, "abc").
SELECT encode(idem_fingerprint('abc'::text), 'hex') AS sha256_abc;
SELECT idem_fingerprint('abc'::text) = sha256('abc'::bytea) AS text_matches,
       idem_fingerprint('\x616263'::bytea) = sha256('abc'::bytea) AS bytea_matches,
       idem_fingerprint('abc'::text) = idem_fingerprint('\x616263'::bytea) AS text_equals_bytea;

-- The empty request has a digest too (only NULL has none).
SELECT encode(idem_fingerprint(''::text), 'hex') AS sha256_empty;
SELECT idem_fingerprint(''::text) = sha256(''::bytea) AS empty_text,
       idem_fingerprint(''::bytea) = sha256(''::bytea) AS empty_bytea;

-- An untyped literal resolves to the text form.
SELECT idem_fingerprint('abc') = idem_fingerprint('abc'::text) AS literal_is_text;

-- Every digest is 32 bytes long.
SELECT octet_length(idem_fingerprint('abc'::text)) AS text_len,
       octet_length(idem_fingerprint('\x00'::bytea)) AS bytea_len,
       octet_length(idem_fingerprint('{"a": 1}'::jsonb)) AS jsonb_len;

-- text hashes the UTF-8 bytes of the string (the database encoding).
SELECT idem_fingerprint(chr(233)) = sha256('\xc3a9'::bytea) AS utf8_bytes,
       idem_fingerprint(chr(233)) = sha256(convert_to(chr(233), 'UTF8')) AS convert_to_utf8;

-- bytea hashes every byte, zero bytes included.
SELECT idem_fingerprint('\x00ff00'::bytea) = sha256('\x00ff00'::bytea) AS zero_bytes,
       idem_fingerprint('\x00ff00'::bytea) <> idem_fingerprint('\x00ff'::bytea) AS length_matters;

-- Large values, compressed or stored out of line (TOAST), are hashed whole.
CREATE TEMP TABLE big (t text, b bytea, j jsonb);
INSERT INTO big
SELECT repeat('abcdefgh', 100000),
       convert_to(repeat('abcdefgh', 100000), 'UTF8'),
       (SELECT jsonb_agg(jsonb_build_object('n', g, 's', md5(g::text))) FROM generate_series(1, 20000) g);
SELECT pg_column_size(t) < octet_length(t) AS text_compressed,
       idem_fingerprint(t) = sha256(convert_to(t, 'UTF8')) AS big_text,
       idem_fingerprint(b) = sha256(b) AS big_bytea,
       idem_fingerprint(t) = idem_fingerprint(b) AS text_equals_bytea,
       idem_fingerprint(j) = sha256(convert_to(j::text, 'UTF8')) AS big_jsonb
FROM big;
DROP TABLE big;

--
-- jsonb: the digest of the canonical text, i.e. of the jsonb output.
--
SELECT idem_fingerprint('{"b": 1, "a": [1, 2]}'::jsonb)
       = sha256(convert_to('{"a": [1, 2], "b": 1}', 'UTF8')) AS canonical_text;
SELECT idem_fingerprint('{"a": 1}'::jsonb) = idem_fingerprint('{"a": 1}'::text) AS same_as_canonical_text,
       idem_fingerprint('{"a":1}'::jsonb) = idem_fingerprint('{"a":1}'::text) AS same_as_raw_text;

-- Key order and whitespace do not matter, at any depth.
SELECT idem_fingerprint('{"a": 1, "b": {"x": true, "y": null}}'::jsonb)
       = idem_fingerprint(E'{ "b" :{"y":null,\n\t"x" : true} ,"a":1 }'::jsonb) AS key_order_and_whitespace;

-- Duplicate keys: the last one wins, as in jsonb itself.
SELECT idem_fingerprint('{"a": 1, "a": 2}'::jsonb) = idem_fingerprint('{"a": 2}'::jsonb) AS last_duplicate_wins;

-- Unicode escapes are decoded before hashing.
SELECT idem_fingerprint('"\u00e9"'::jsonb) = idem_fingerprint(('"' || chr(233) || '"')::jsonb) AS escapes_decoded;

-- Numbers keep their written scale: 1, 1.0 and 1.00 are different requests.
SELECT idem_fingerprint('{"amount": 1.0}'::jsonb) = idem_fingerprint('{"amount": 1.00}'::jsonb) AS "1.0 = 1.00",
       idem_fingerprint('{"amount": 1}'::jsonb) = idem_fingerprint('{"amount": 1.0}'::jsonb) AS "1 = 1.0",
       idem_fingerprint('{"amount": 1.0}'::jsonb) = sha256(convert_to('{"amount": 1.0}', 'UTF8')) AS "1.0 hashed as written",
       idem_fingerprint('{"amount": 1.00}'::jsonb) = sha256(convert_to('{"amount": 1.00}', 'UTF8')) AS "1.00 hashed as written";

-- Types and order of values matter.
SELECT idem_fingerprint('{"a": 1}'::jsonb) = idem_fingerprint('{"a": "1"}'::jsonb) AS number_equals_string,
       idem_fingerprint('[1, 2]'::jsonb) = idem_fingerprint('[2, 1]'::jsonb) AS array_order_ignored,
       idem_fingerprint('{}'::jsonb) = idem_fingerprint('[]'::jsonb) AS object_equals_array;

-- Scalars: JSON null is a value, not SQL NULL.
SELECT encode(idem_fingerprint('null'::jsonb), 'hex') AS json_null,
       idem_fingerprint('null'::jsonb) = sha256('null'::bytea) AS json_null_matches,
       idem_fingerprint('"abc"'::jsonb) = sha256('"abc"'::bytea) AS json_string_matches;

-- STRICT: SQL NULL in, NULL out, for all three forms.
SELECT idem_fingerprint(NULL::jsonb) IS NULL AS jsonb_null,
       idem_fingerprint(NULL::text) IS NULL AS text_null,
       idem_fingerprint(NULL::bytea) IS NULL AS bytea_null;

-- IMMUTABLE: usable in an index expression and a generated column.
CREATE TEMP TABLE requests (
    body jsonb,
    fp bytea GENERATED ALWAYS AS (idem_fingerprint(body)) STORED
);
CREATE INDEX ON requests (idem_fingerprint(body));
INSERT INTO requests (body) VALUES ('{"b": 2, "a": 1}'), (NULL);
SELECT body, fp = sha256(convert_to(body::text, 'UTF8')) AS fp_matches, fp IS NULL AS fp_null
FROM requests ORDER BY body;
DROP TABLE requests;
