-- The pure functions: fingerprints (src/fingerprint.c) and the shard hash
-- (src/route.c).  Each gives the C edition's bytes exactly: a text is hashed
-- as its bytes in the database's encoding (textsend would convert them to the
-- client's), the jsonb form hashes the jsonb output (JsonbToCString, which
-- is what the C hashes too), and idem_request_fingerprint and
-- idem_route_hash hash their text in UTF-8 whatever the database's encoding.
--
-- The three idem_fingerprint forms are LANGUAGE sql of immutable functions
-- only, so the planner inlines them.  convert_to(x, getdatabaseencoding())
-- gives the same bytes but is STABLE, which stops the inlining; so the text
-- is turned into its own bytes by decode(..., 'escape') after doubling its
-- backslashes (every other byte passes through as it is; every server
-- encoding keeps '\' out of its multibyte characters).  COLLATE "C": replace()
-- refuses a nondeterministic collation the caller's text might carry.

--@ idem_fingerprint(jsonb)
LANGUAGE sql
AS $body$
SELECT pg_catalog.sha256(pg_catalog.decode(pg_catalog.replace(
           request::pg_catalog.text COLLATE pg_catalog."C", E'\\', E'\\\\'), 'escape'))
$body$;

--@ idem_fingerprint(text)
LANGUAGE sql
AS $body$
SELECT pg_catalog.sha256(pg_catalog.decode(pg_catalog.replace(
           request COLLATE pg_catalog."C", E'\\', E'\\\\'), 'escape'))
$body$;

--@ idem_fingerprint(bytea)
LANGUAGE sql
AS $body$
SELECT pg_catalog.sha256(request)
$body$;

--@ idem_request_fingerprint(text, text, jsonb, text[])
-- The digest's input: the version byte 1, then the method (ASCII upper
-- case), the path and the canonical body (both in UTF-8), each after its
-- length as a big-endian uint32 (int4send).  The ignore paths are all checked
-- first, in order, whatever the body; a path is then removed only when
-- every value on its way is an object (-> with a text key reads only
-- objects; arrays and scalars are never entered, as in the C), and removing
-- a path never changes what another one finds but its own subtree, so the
-- paths' order does not matter.
LANGUAGE plpgsql
AS $body$
DECLARE
    upper_method text;
    ignore_path text;
    keys text[];
    nkeys integer;
    container jsonb;
    canonical jsonb := body;
    path_utf8 bytea;
    body_utf8 bytea;
BEGIN
    IF method IS NULL THEN
        RAISE EXCEPTION 'method must not be null' USING ERRCODE = '22004';
    END IF;
    IF path IS NULL THEN
        RAISE EXCEPTION 'path must not be null' USING ERRCODE = '22004';
    END IF;
    IF body IS NULL THEN
        RAISE EXCEPTION 'body must not be null' USING ERRCODE = '22004',
            HINT = 'Pass ''null''::jsonb for a request without a body.';
    END IF;
    IF pg_catalog.octet_length(method) OPERATOR(pg_catalog.=) 0 THEN
        RAISE EXCEPTION 'method must not be empty' USING ERRCODE = '22023';
    END IF;
    -- an HTTP token (RFC 9110, section 5.6.2): all of it in this set
    IF pg_catalog.octet_length(pg_catalog.ltrim(method,
           'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789!#$%&''*+-.^_`|~'))
       OPERATOR(pg_catalog.<>) 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = pg_catalog.format('invalid HTTP method "%s"', method),
            DETAIL = 'A method consists of letters, digits and the characters !#$%&''*+-.^_`|~.';
    END IF;
    upper_method := pg_catalog.translate(method, 'abcdefghijklmnopqrstuvwxyz',
                                         'ABCDEFGHIJKLMNOPQRSTUVWXYZ');

    IF ignore IS NOT NULL THEN
        IF pg_catalog.array_ndims(ignore) OPERATOR(pg_catalog.>) 1 THEN
            RAISE EXCEPTION 'ignore must be a one-dimensional array' USING ERRCODE = '22023';
        END IF;
        FOREACH ignore_path IN ARRAY ignore LOOP
            IF ignore_path IS NULL THEN
                RAISE EXCEPTION 'ignore must not contain nulls' USING ERRCODE = '22004';
            END IF;
            IF pg_catalog.octet_length(ignore_path) OPERATOR(pg_catalog.=) 0
               OR pg_catalog.array_position(
                      pg_catalog.string_to_array(ignore_path COLLATE pg_catalog."C", '.'),
                      ''::pg_catalog.text COLLATE pg_catalog."C") IS NOT NULL THEN
                RAISE EXCEPTION USING ERRCODE = '22023',
                    MESSAGE = pg_catalog.format('invalid ignore path "%s"', ignore_path),
                    DETAIL = 'An ignore path is one or more keys separated by dots, and no key may be empty.';
            END IF;
        END LOOP;
        IF pg_catalog.jsonb_typeof(body) OPERATOR(pg_catalog.=) 'object' THEN
            FOREACH ignore_path IN ARRAY ignore LOOP
                keys := pg_catalog.string_to_array(ignore_path COLLATE pg_catalog."C", '.');
                nkeys := pg_catalog.cardinality(keys);
                container := canonical;
                FOR i IN 1 .. nkeys OPERATOR(pg_catalog.-) 1 LOOP
                    container := container OPERATOR(pg_catalog.->) keys[i];
                    EXIT WHEN container IS NULL
                        OR pg_catalog.jsonb_typeof(container) OPERATOR(pg_catalog.<>) 'object';
                END LOOP;
                IF container IS NOT NULL
                   AND pg_catalog.jsonb_typeof(container) OPERATOR(pg_catalog.=) 'object' THEN
                    canonical := canonical OPERATOR(pg_catalog.#-) keys;
                END IF;
            END LOOP;
        END IF;
    END IF;

    path_utf8 := pg_catalog.convert_to(path, 'UTF8');
    body_utf8 := pg_catalog.convert_to(canonical::pg_catalog.text, 'UTF8');
    RETURN pg_catalog.sha256(
        '\x01'::pg_catalog.bytea
        OPERATOR(pg_catalog.||) pg_catalog.int4send(pg_catalog.octet_length(upper_method))
        OPERATOR(pg_catalog.||) pg_catalog.convert_to(upper_method, 'UTF8')
        OPERATOR(pg_catalog.||) pg_catalog.int4send(pg_catalog.octet_length(path_utf8))
        OPERATOR(pg_catalog.||) path_utf8
        OPERATOR(pg_catalog.||) pg_catalog.int4send(pg_catalog.octet_length(body_utf8))
        OPERATOR(pg_catalog.||) body_utf8);
END
$body$;

--@ idem_route_hash(text)
-- The first four bytes of SHA-256 of the tenant part's UTF-8 bytes, read as
-- a big-endian signed integer.  The scope is checked as idem_arg_scope does
-- (src/validation.c); idempotency.max_key_length is a placeholder without the
-- library, read here with the C GUC's default and range.
LANGUAGE plpgsql
AS $body$
DECLARE
    setting text;
    max_key_length integer := 255;
    len integer;
    digest bytea;
BEGIN
    IF scope IS NULL THEN
        RAISE EXCEPTION 'scope must not be null' USING ERRCODE = '22004',
            HINT = 'Use '''' for the default scope.';
    END IF;
    len := pg_catalog.octet_length(scope);
    setting := pg_catalog.current_setting('idempotency.max_key_length', true);
    IF setting OPERATOR(pg_catalog.<>) '' THEN
        IF setting COLLATE pg_catalog."C"
           OPERATOR(pg_catalog.!~) '^[[:space:]]*[+-]?[0-9]+[[:space:]]*$' THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = pg_catalog.format('invalid value for parameter "%s": "%s"',
                                            'idempotency.max_key_length', setting);
        END IF;
        IF setting::pg_catalog.numeric OPERATOR(pg_catalog.<) 1
           OR setting::pg_catalog.numeric OPERATOR(pg_catalog.>) 1024 THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = pg_catalog.format('%s is outside the valid range for parameter "%s" (%s .. %s)',
                                            setting::pg_catalog.numeric, 'idempotency.max_key_length', 1, 1024);
        END IF;
        max_key_length := setting::pg_catalog.int4;
    END IF;
    IF len OPERATOR(pg_catalog.>) max_key_length THEN
        RAISE EXCEPTION 'scope is too long' USING ERRCODE = '22001',
            DETAIL = pg_catalog.format('It is %s bytes long; idempotency.max_key_length is %s.',
                                       len, max_key_length);
    END IF;
    digest := pg_catalog.sha256(pg_catalog.convert_to(
        pg_catalog.split_part(scope COLLATE pg_catalog."C", '/', 1), 'UTF8'));
    RETURN (pg_catalog.get_byte(digest, 0) OPERATOR(pg_catalog.<<) 24)
           OPERATOR(pg_catalog.|) (pg_catalog.get_byte(digest, 1) OPERATOR(pg_catalog.<<) 16)
           OPERATOR(pg_catalog.|) (pg_catalog.get_byte(digest, 2) OPERATOR(pg_catalog.<<) 8)
           OPERATOR(pg_catalog.|) pg_catalog.get_byte(digest, 3);
END
$body$;
