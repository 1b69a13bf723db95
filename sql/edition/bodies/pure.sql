-- The pure functions: fingerprints (src/fingerprint.c) and the shard hash
-- (src/route.c).  Each gives the C edition's bytes exactly: a text is hashed
-- as its bytes in the database's encoding (textsend would convert them to the
-- client's), the jsonb form hashes the jsonb output (JsonbToCString, which
-- is what the C hashes too), and idem_request_fingerprint and
-- idem_route_hash hash their text in UTF-8 whatever the database's encoding.
--
-- All but the bytea form are PL/pgSQL.  generate.py pins search_path on every body (SET
-- search_path = pg_catalog, pg_temp), and a function with a SET clause is
-- never inlined: a LANGUAGE sql body then costs more per call than a
-- PL/pgSQL one, even sha256(request).  The SET itself costs about 1.5 us a
-- call on PostgreSQL 15 (a setting set on entry and reset on exit, and the
-- search path looked up again), most of what these cost beyond the C's.
-- convert_to(x, getdatabaseencoding()) only checks the bytes and copies
-- them; an expression of immutable functions only (decode(replace(x, '\',
-- '\\'), 'escape')) gives the same bytes and could be inlined without the
-- SET, but its two passes made a 1 kB body four times slower.

--@ idem_fingerprint(jsonb)
LANGUAGE plpgsql
AS $body$
BEGIN
    RETURN pg_catalog.sha256(pg_catalog.convert_to(request::pg_catalog.text,
                                                   pg_catalog.getdatabaseencoding()));
END
$body$;

--@ idem_fingerprint(text)
LANGUAGE plpgsql
AS $body$
BEGIN
    RETURN pg_catalog.sha256(pg_catalog.convert_to(request, pg_catalog.getdatabaseencoding()));
END
$body$;

--@ idem_fingerprint(bytea)
-- SQL-standard: bound at creation, so no SET is needed, and inlined into
-- the caller's query (the C's speed).
LANGUAGE sql
RETURN pg_catalog.sha256(request);

--@ idem_request_fingerprint(text, text, jsonb, text[])
-- The digest's input: the version byte 1, then the method (ASCII upper
-- case), the path and the canonical body (both in UTF-8), each after its
-- length as a big-endian uint32 (int4send).  The ignore paths are checked in
-- order whatever the body (the C checks them all before it removes any, but
-- a removal raises nothing, so one loop gives the same errors); a path is
-- removed only when every value on its way is an object (-> with a text key
-- reads only objects; arrays and scalars are never entered, as in the C),
-- and removing a path never changes what another one finds but its own
-- subtree, so the paths' order does not matter, and the keys of the body
-- itself go in one removal at the end.  A valid call runs one test before the
-- ignore paths; the errors come in the C's order behind it.  The method is
-- ASCII by then, which upper() in the collation "C" maps as the C does
-- (pg_ascii_toupper), and about ten times faster than translate().
LANGUAGE plpgsql
AS $body$
DECLARE
    ignore_path text;
    keys text[];
    container jsonb;
    is_object boolean;
    top_keys text[];
    path_utf8 bytea;
    body_utf8 bytea;
BEGIN
    -- an HTTP method is a token (RFC 9110, section 5.6.2)
    IF method IS NULL OR path IS NULL OR body IS NULL
       OR method COLLATE pg_catalog."C"
          OPERATOR(pg_catalog.!~) '^[A-Za-z0-9!#$%&''*+.^_`|~-]+$' THEN
        IF method IS NULL THEN
            RAISE EXCEPTION 'method must not be null' USING ERRCODE = '22004';
        ELSIF path IS NULL THEN
            RAISE EXCEPTION 'path must not be null' USING ERRCODE = '22004';
        ELSIF body IS NULL THEN
            RAISE EXCEPTION 'body must not be null' USING ERRCODE = '22004',
                HINT = 'Pass ''null''::jsonb for a request without a body.';
        ELSIF pg_catalog.octet_length(method) OPERATOR(pg_catalog.=) 0 THEN
            RAISE EXCEPTION 'method must not be empty' USING ERRCODE = '22023';
        ELSE
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = pg_catalog.format('invalid HTTP method "%s"', method),
                DETAIL = 'A method consists of letters, digits and the characters !#$%&''*+-.^_`|~.';
        END IF;
    END IF;

    IF ignore IS NOT NULL THEN
        IF pg_catalog.array_ndims(ignore) OPERATOR(pg_catalog.>) 1 THEN
            RAISE EXCEPTION 'ignore must be a one-dimensional array' USING ERRCODE = '22023';
        END IF;
        is_object := pg_catalog.jsonb_typeof(body) OPERATOR(pg_catalog.=) 'object';
        FOREACH ignore_path IN ARRAY ignore LOOP
            -- keys separated by dots, none of them empty
            IF ignore_path IS NULL
               OR ignore_path COLLATE pg_catalog."C" OPERATOR(pg_catalog.!~) '^[^.]+([.][^.]+)*$' THEN
                IF ignore_path IS NULL THEN
                    RAISE EXCEPTION 'ignore must not contain nulls' USING ERRCODE = '22004';
                END IF;
                RAISE EXCEPTION USING ERRCODE = '22023',
                    MESSAGE = pg_catalog.format('invalid ignore path "%s"', ignore_path),
                    DETAIL = 'An ignore path is one or more keys separated by dots, and no key may be empty.';
            END IF;
            CONTINUE WHEN NOT is_object;
            IF pg_catalog.strpos(ignore_path COLLATE pg_catalog."C", '.') OPERATOR(pg_catalog.=) 0 THEN
                -- a key of the body itself: all of them removed at once below
                top_keys := top_keys OPERATOR(pg_catalog.||) ignore_path;
                CONTINUE;
            END IF;
            keys := pg_catalog.string_to_array(ignore_path COLLATE pg_catalog."C", '.');
            container := body OPERATOR(pg_catalog.->) keys[1];
            FOR i IN 2 .. pg_catalog.cardinality(keys) OPERATOR(pg_catalog.-) 1 LOOP
                EXIT WHEN pg_catalog.jsonb_typeof(container) IS DISTINCT FROM 'object';
                container := container OPERATOR(pg_catalog.->) keys[i];
            END LOOP;
            IF pg_catalog.jsonb_typeof(container) OPERATOR(pg_catalog.=) 'object' THEN
                body := body OPERATOR(pg_catalog.#-) keys;
            END IF;
        END LOOP;
        IF top_keys IS NOT NULL THEN
            body := body OPERATOR(pg_catalog.-) top_keys;
        END IF;
    END IF;

    path_utf8 := pg_catalog.convert_to(path, 'UTF8');
    body_utf8 := pg_catalog.convert_to(body::pg_catalog.text, 'UTF8');
    RETURN pg_catalog.sha256(
        '\x01'::pg_catalog.bytea
        OPERATOR(pg_catalog.||) pg_catalog.int4send(pg_catalog.octet_length(method))
        OPERATOR(pg_catalog.||) pg_catalog.convert_to(pg_catalog.upper(method COLLATE pg_catalog."C"), 'UTF8')
        OPERATOR(pg_catalog.||) pg_catalog.int4send(pg_catalog.octet_length(path_utf8))
        OPERATOR(pg_catalog.||) path_utf8
        OPERATOR(pg_catalog.||) pg_catalog.int4send(pg_catalog.octet_length(body_utf8))
        OPERATOR(pg_catalog.||) body_utf8);
END
$body$;

--@ idem_route_hash(text)
-- The first four bytes of SHA-256 of the tenant part's UTF-8 bytes, read as
-- a big-endian signed integer.  The scope is checked as idem_arg_scope does
-- (src/validation.c), inline: a scope within the default limit while
-- idempotency.max_key_length is not set runs one test and no other function;
-- otherwise the setting is read by the shared idem_sql_max_key_length.
LANGUAGE plpgsql
AS $body$
DECLARE
    max_key_length integer;
BEGIN
    IF scope IS NULL OR pg_catalog.octet_length(scope) OPERATOR(pg_catalog.>) 255
       OR pg_catalog.current_setting('idempotency.max_key_length', true) OPERATOR(pg_catalog.<>) '' THEN
        IF scope IS NULL THEN
            RAISE EXCEPTION 'scope must not be null' USING ERRCODE = '22004',
                HINT = 'Use '''' for the default scope.';
        END IF;
        max_key_length := @extschema@.idem_sql_max_key_length();
        IF pg_catalog.octet_length(scope) OPERATOR(pg_catalog.>) max_key_length THEN
            RAISE EXCEPTION 'scope is too long' USING ERRCODE = '22001',
                DETAIL = pg_catalog.format('It is %s bytes long; idempotency.max_key_length is %s.',
                                           pg_catalog.octet_length(scope), max_key_length);
        END IF;
    END IF;
    -- '/' is ASCII, never part of a multibyte character
    RETURN (('x' OPERATOR(pg_catalog.||) pg_catalog.encode(pg_catalog.substr(pg_catalog.sha256(
                pg_catalog.convert_to(pg_catalog.split_part(scope COLLATE pg_catalog."C", '/', 1), 'UTF8')),
                1, 4), 'hex'))::pg_catalog.bit(32))::pg_catalog.int4;
END
$body$;
