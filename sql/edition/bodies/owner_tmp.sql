-- TEMPORARY stand-ins for the core helpers of 00_internal.sql (validation.c,
-- tokens.c), until they are merged; to be removed.

--@ internal
CREATE FUNCTION @extschema@.idem_sql_owner_len(value text, what text)
RETURNS void LANGUAGE plpgsql AS $f$
DECLARE
    lim integer := COALESCE(NULLIF(pg_catalog.current_setting('idempotency.max_key_length', true), '')::integer, 255);
BEGIN
    IF pg_catalog.octet_length(value) OPERATOR(pg_catalog.>) lim THEN
        RAISE EXCEPTION '% is too long', what USING ERRCODE = '22001',
            DETAIL = pg_catalog.format('It is %s bytes long; idempotency.max_key_length is %s.', pg_catalog.octet_length(value), lim);
    END IF;
END $f$;

CREATE FUNCTION @extschema@.idem_sql_owner_key_scope(key text, scope text)
RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
    IF key IS NULL THEN
        RAISE EXCEPTION 'idempotency key must not be null' USING ERRCODE = '22004';
    END IF;
    IF key OPERATOR(pg_catalog.=) '' THEN
        RAISE EXCEPTION 'idempotency key must not be empty' USING ERRCODE = '22023';
    END IF;
    PERFORM @extschema@.idem_sql_owner_len(key, 'idempotency key');
    IF scope IS NULL THEN
        RAISE EXCEPTION 'scope must not be null' USING ERRCODE = '22004', HINT = 'Use '''' for the default scope.';
    END IF;
    PERFORM @extschema@.idem_sql_owner_len(scope, 'scope');
END $f$;

CREATE FUNCTION @extschema@.idem_sql_owner_args(key text, token bigint, scope text)
RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
    IF key IS NULL THEN
        RAISE EXCEPTION 'idempotency key must not be null' USING ERRCODE = '22004';
    END IF;
    IF key OPERATOR(pg_catalog.=) '' THEN
        RAISE EXCEPTION 'idempotency key must not be empty' USING ERRCODE = '22023';
    END IF;
    PERFORM @extschema@.idem_sql_owner_len(key, 'idempotency key');
    IF token IS NULL THEN
        RAISE EXCEPTION 'token must not be null' USING ERRCODE = '22004';
    END IF;
    IF token OPERATOR(pg_catalog.<=) 0 THEN
        RAISE EXCEPTION 'token must be positive' USING ERRCODE = '22023',
            DETAIL = pg_catalog.format('Fencing tokens start at 1; %s was given.', token);
    END IF;
    IF scope IS NULL THEN
        RAISE EXCEPTION 'scope must not be null' USING ERRCODE = '22004', HINT = 'Use '''' for the default scope.';
    END IF;
    PERFORM @extschema@.idem_sql_owner_len(scope, 'scope');
END $f$;

CREATE FUNCTION @extschema@.idem_sql_owner_add_interval(base timestamptz, span interval, name text)
RETURNS timestamptz LANGUAGE plpgsql AS $f$
DECLARE
    result timestamptz := base OPERATOR(pg_catalog.+) span;
BEGIN
    IF result OPERATOR(pg_catalog.<=) base THEN
        RAISE EXCEPTION '% must be positive', name USING ERRCODE = '22023',
            DETAIL = pg_catalog.format('The interval given was "%s".', span);
    END IF;
    IF NOT pg_catalog.isfinite(result) THEN
        RAISE EXCEPTION '% must be finite', name USING ERRCODE = '22023';
    END IF;
    RETURN result;
END $f$;

CREATE FUNCTION @extschema@.idem_sql_token_next(old bigint)
RETURNS bigint LANGUAGE plpgsql AS $f$
DECLARE
    epoch bigint := COALESCE(pg_catalog.pg_sequence_last_value('@extschema@.idem_token_epoch'::pg_catalog.regclass), 0);
    first bigint := (epoch OPERATOR(pg_catalog.<<) 16) OPERATOR(pg_catalog.+) 1;
BEGIN
    IF old OPERATOR(pg_catalog.<) first THEN
        RETURN first;
    END IF;
    RETURN old OPERATOR(pg_catalog.+) 1;
END $f$;
