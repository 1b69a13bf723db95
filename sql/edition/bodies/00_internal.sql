-- The SQL edition's shared helpers (generate.py says how this file is read):
-- the argument checks of src/validation.c, the settings of src/idempotency.c,
-- the tenant check of src/record_store.c and the token scheme of
-- src/tokens.c.  They are created before the tables they read, so each is
-- PL/pgSQL (its statements are planned at their first call).

--@ internal

-- A setting of src/idempotency.c, read as its DefineCustomIntVariable and
-- guc.c's parse_int would (units, range, rounding); the SQL edition has no
-- library to register it, so it is a placeholder: default when unset.
CREATE FUNCTION @extschema@.idem_sql_setting_int(name text, default_value integer,
                                                 min_value integer, max_value integer,
                                                 unit text)
RETURNS integer
LANGUAGE plpgsql STABLE
AS $fn$
DECLARE
    raw text := pg_catalog.current_setting(name, true);
    parts text[];
    num numeric;
    factor numeric;
    result numeric;
BEGIN
    IF raw IS NULL OR raw OPERATOR(pg_catalog.=) '' THEN
        RETURN default_value;
    END IF;
    parts := pg_catalog.regexp_match(raw,
        '^\s*([-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)\s*(\S*?)\s*$');
    IF parts IS NULL OR (parts[2] OPERATOR(pg_catalog.<>) '' AND unit OPERATOR(pg_catalog.=) '') THEN
        RAISE EXCEPTION 'invalid value for parameter "%": "%"', name, raw
            USING ERRCODE = '22023';
    END IF;
    num := parts[1]::numeric;
    IF parts[2] OPERATOR(pg_catalog.<>) '' THEN
        -- guc.c's time units, in microseconds
        factor := CASE parts[2] WHEN 'us' THEN 1 WHEN 'ms' THEN 1000 WHEN 's' THEN 1000000
                                WHEN 'min' THEN 60000000 WHEN 'h' THEN 3600000000
                                WHEN 'd' THEN 86400000000 END;
        IF factor IS NULL THEN
            RAISE EXCEPTION 'invalid value for parameter "%": "%"', name, raw
                USING ERRCODE = '22023',
                      HINT = 'Valid units for this parameter are "us", "ms", "s", "min", "h", and "d".';
        END IF;
        num := num OPERATOR(pg_catalog.*) factor OPERATOR(pg_catalog./)
               CASE unit WHEN 'ms' THEN 1000 ELSE 1000000 END;
    END IF;
    -- guc.c rounds with rint(): halves to even, as round(float8) does
    result := pg_catalog.round(num::pg_catalog.float8);
    IF result OPERATOR(pg_catalog.>) 2147483647 OR result OPERATOR(pg_catalog.<) -2147483648 THEN
        RAISE EXCEPTION 'invalid value for parameter "%": "%"', name, raw
            USING ERRCODE = '22023', HINT = 'Value exceeds integer range.';
    END IF;
    IF result OPERATOR(pg_catalog.<) min_value OR result OPERATOR(pg_catalog.>) max_value THEN
        RAISE EXCEPTION '%', pg_catalog.format('%s%s is outside the valid range for parameter "%s" (%s .. %s)',
            result, CASE WHEN unit OPERATOR(pg_catalog.=) '' THEN '' ELSE ' ' OPERATOR(pg_catalog.||) unit END,
            name, min_value, max_value)
            USING ERRCODE = '22023';
    END IF;
    RETURN result::integer;
END
$fn$;

-- idem_max_key_length (src/idempotency.c: idempotency.max_key_length, 1 .. 1024, default 255)
CREATE FUNCTION @extschema@.idem_sql_max_key_length()
RETURNS integer
LANGUAGE plpgsql STABLE
AS $fn$
BEGIN
    RETURN @extschema@.idem_sql_setting_int('idempotency.max_key_length', 255, 1, 1024, '');
END
$fn$;

-- mirrors idem_arg_not_null (src/validation.c)
CREATE FUNCTION @extschema@.idem_sql_arg_not_null(value anyelement, name text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $fn$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION '% must not be null', name USING ERRCODE = '22004';
    END IF;
END
$fn$;

-- mirrors check_length (src/validation.c)
CREATE FUNCTION @extschema@.idem_sql_check_length(value text, what text)
RETURNS void
LANGUAGE plpgsql STABLE
AS $fn$
DECLARE
    len integer := pg_catalog.octet_length(value);
    max_len integer;
BEGIN
    IF len OPERATOR(pg_catalog.<=) 255
       AND pg_catalog.current_setting('idempotency.max_key_length', true) IS NULL THEN
        RETURN;
    END IF;
    max_len := @extschema@.idem_sql_max_key_length();
    IF len OPERATOR(pg_catalog.>) max_len THEN
        RAISE EXCEPTION '% is too long', what
            USING ERRCODE = '22001',
                  DETAIL = pg_catalog.format('It is %s bytes long; idempotency.max_key_length is %s.',
                                             len, max_len);
    END IF;
END
$fn$;

-- mirrors idem_arg_key (src/validation.c)
CREATE FUNCTION @extschema@.idem_sql_arg_key(key text, what text)
RETURNS text
LANGUAGE plpgsql STABLE
AS $fn$
BEGIN
    IF key IS NULL THEN
        RAISE EXCEPTION '% must not be null', what USING ERRCODE = '22004';
    END IF;
    IF key OPERATOR(pg_catalog.=) '' THEN
        RAISE EXCEPTION '% must not be empty', what USING ERRCODE = '22023';
    END IF;
    PERFORM @extschema@.idem_sql_check_length(key, what);
    RETURN key;
END
$fn$;

-- mirrors idem_arg_scope (src/validation.c)
CREATE FUNCTION @extschema@.idem_sql_arg_scope(scope text)
RETURNS text
LANGUAGE plpgsql STABLE
AS $fn$
BEGIN
    IF scope IS NULL THEN
        RAISE EXCEPTION 'scope must not be null'
            USING ERRCODE = '22004', HINT = 'Use '''' for the default scope.';
    END IF;
    PERFORM @extschema@.idem_sql_check_length(scope, 'scope');
    RETURN scope;
END
$fn$;

-- mirrors idem_arg_fingerprint (src/validation.c)
CREATE FUNCTION @extschema@.idem_sql_arg_fingerprint(fingerprint bytea)
RETURNS bytea
LANGUAGE plpgsql IMMUTABLE
AS $fn$
DECLARE
    len integer := pg_catalog.length(fingerprint);
BEGIN
    IF fingerprint IS NULL THEN
        RAISE EXCEPTION 'fingerprint must not be null' USING ERRCODE = '22004';
    END IF;
    IF len OPERATOR(pg_catalog.=) 0 THEN
        RAISE EXCEPTION 'fingerprint must not be empty'
            USING ERRCODE = '22023',
                  HINT = 'Pass idem_fingerprint(request), a SHA-256 digest of the request.';
    END IF;
    IF len OPERATOR(pg_catalog.>) 64 THEN
        RAISE EXCEPTION 'fingerprint is too long'
            USING ERRCODE = '22001',
                  DETAIL = pg_catalog.format('It is %s bytes long; a fingerprint is a digest of at most 64 bytes.', len),
                  HINT = 'Pass idem_fingerprint(request), a SHA-256 digest of the request.';
    END IF;
    RETURN fingerprint;
END
$fn$;

-- mirrors idem_arg_token (src/validation.c)
CREATE FUNCTION @extschema@.idem_sql_arg_token(token bigint)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE
AS $fn$
BEGIN
    IF token IS NULL THEN
        RAISE EXCEPTION 'token must not be null' USING ERRCODE = '22004';
    END IF;
    IF token OPERATOR(pg_catalog.<=) 0 THEN
        RAISE EXCEPTION 'token must be positive'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('Fencing tokens start at 1; %s was given.', token);
    END IF;
    RETURN token;
END
$fn$;

-- mirrors idem_add_interval (src/validation.c): base + span, after base and finite
CREATE FUNCTION @extschema@.idem_sql_add_interval(base timestamptz, span interval, name text)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
AS $fn$
DECLARE
    result timestamptz := base OPERATOR(pg_catalog.+) span;
BEGIN
    IF result OPERATOR(pg_catalog.<=) base THEN
        RAISE EXCEPTION '% must be positive', name
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('The interval given was "%s".', span);
    END IF;
    IF NOT pg_catalog.isfinite(result) THEN
        RAISE EXCEPTION '% must be finite', name USING ERRCODE = '22023';
    END IF;
    RETURN result;
END
$fn$;

-- mirrors idem_retention_expiry (src/validation.c): now + retention, or
-- + idempotency.retention (seconds, 1 .. INT_MAX, default 1 day) when NULL
CREATE FUNCTION @extschema@.idem_sql_retention_expiry(retention interval, now timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
AS $fn$
BEGIN
    IF retention IS NULL THEN
        RETURN now OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs =>
            @extschema@.idem_sql_setting_int('idempotency.retention', 86400, 1, 2147483647, 's'));
    END IF;
    RETURN @extschema@.idem_sql_add_interval(now, retention, 'retention');
END
$fn$;

-- mirrors idem_arg_headers (src/validation.c): NULL, or a JSON object of
-- header names to a string or an array of strings
CREATE FUNCTION @extschema@.idem_sql_arg_headers(headers jsonb)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
AS $fn$
DECLARE
    item record;
    elem jsonb;
    bad text;
    prev text;
BEGIN
    IF headers IS NULL THEN
        RETURN NULL;
    END IF;
    IF pg_catalog.jsonb_typeof(headers) OPERATOR(pg_catalog.<>) 'object' THEN
        RAISE EXCEPTION 'headers must be a JSON object'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('The value given is a JSON %s.',
                      CASE WHEN pg_catalog.jsonb_typeof(headers) OPERATOR(pg_catalog.=) 'array'
                           THEN 'array' ELSE 'scalar' END),
                  HINT = 'Pass an object of header names and values, such as {"Location": "/orders/7"}.';
    END IF;
    FOR item IN SELECT e.key AS name, e.value FROM pg_catalog.jsonb_each(headers) e LOOP
        IF item.name OPERATOR(pg_catalog.=) '' THEN
            RAISE EXCEPTION 'header name must not be empty' USING ERRCODE = '22023';
        END IF;
        IF item.name OPERATOR(pg_catalog.!~) '^[-A-Za-z0-9!#$%&''*+.^_`|~]+$' THEN
            RAISE EXCEPTION 'invalid header name "%"', item.name
                USING ERRCODE = '22023',
                      DETAIL = 'A header name consists of letters, digits and the characters !#$%&''*+-.^_`|~.';
        END IF;
        IF pg_catalog.lower(item.name) OPERATOR(pg_catalog.=) ANY ('{connection,content-length,keep-alive,proxy-connection,te,trailer,transfer-encoding,upgrade}'::text[]) THEN
            RAISE EXCEPTION 'header "%" cannot be saved', item.name
                USING ERRCODE = '22023',
                      DETAIL = 'The server writes it for each answer it sends: Content-Length and Transfer-Encoding frame the body, the others belong to the connection.';
        END IF;
        IF pg_catalog.jsonb_typeof(item.value) OPERATOR(pg_catalog.=) 'array' THEN
            FOR elem IN SELECT a.value FROM pg_catalog.jsonb_array_elements(item.value) a LOOP
                IF pg_catalog.jsonb_typeof(elem) OPERATOR(pg_catalog.<>) 'string' THEN
                    RAISE EXCEPTION 'value of header "%" must be a string or an array of strings', item.name
                        USING ERRCODE = '22023',
                              HINT = 'Save a header with several values as an array of strings, one per value.';
                END IF;
                bad := pg_catalog.substring(elem OPERATOR(pg_catalog.#>>) '{}', '[^\t -~]');
                EXIT WHEN bad IS NOT NULL;
            END LOOP;
        ELSIF pg_catalog.jsonb_typeof(item.value) OPERATOR(pg_catalog.=) 'string' THEN
            bad := pg_catalog.substring(item.value OPERATOR(pg_catalog.#>>) '{}', '[^\t -~]');
        ELSE
            RAISE EXCEPTION 'value of header "%" must be a string or an array of strings', item.name
                USING ERRCODE = '22023',
                      HINT = 'Save a header with several values as an array of strings, one per value.';
        END IF;
        IF bad OPERATOR(pg_catalog.=) ANY (ARRAY[pg_catalog.chr(13), pg_catalog.chr(10)]) THEN
            RAISE EXCEPTION 'value of header "%" contains a line break', item.name
                USING ERRCODE = '22023',
                      DETAIL = 'Header values cannot contain CR or LF characters.';
        ELSIF bad IS NOT NULL THEN
            RAISE EXCEPTION 'value of header "%" contains a character that cannot be sent', item.name
                USING ERRCODE = '22023',
                      DETAIL = 'Header values consist of visible ASCII characters, spaces and tabs.',
                      HINT = 'Encode other text, for example as RFC 8187 does.';
        END IF;
    END LOOP;
    -- names are case-insensitive: two that differ only in case are refused
    FOR item IN SELECT e.name FROM pg_catalog.jsonb_object_keys(headers) WITH ORDINALITY e(name, n)
                ORDER BY pg_catalog.lower(e.name) COLLATE "C", e.n LOOP
        IF prev IS NOT NULL AND pg_catalog.lower(prev) OPERATOR(pg_catalog.=) pg_catalog.lower(item.name) THEN
            RAISE EXCEPTION 'header "%" is given twice', item.name
                USING ERRCODE = '22023',
                      DETAIL = pg_catalog.format('Header names are case-insensitive: "%s" and "%s" name the same header.',
                                                 prev, item.name),
                      HINT = 'Save a header with several values as one array of strings.';
        END IF;
        prev := item.name;
    END LOOP;
    RETURN headers;
END
$fn$;

-- mirrors idem_check_record_shape (src/record_store.c): the records' columns
-- as the install script made them, response_headers after them; returns
-- its attribute number, or 0
CREATE FUNCTION @extschema@.idem_sql_check_record_shape()
RETURNS integer
LANGUAGE plpgsql STABLE
AS $fn$
DECLARE
    natts integer := 0;
    live integer := 0;
    in_place boolean := true;
    headers integer := 0;
    att record;
BEGIN
    FOR att IN SELECT a.attnum, a.attname, a.atttypid, a.attisdropped
                 FROM pg_catalog.pg_attribute a
                WHERE a.attrelid OPERATOR(pg_catalog.=) '@extschema@.idempotency_records'::pg_catalog.regclass
                  AND a.attnum OPERATOR(pg_catalog.>) 0
                ORDER BY a.attnum LOOP
        natts := att.attnum;
        IF att.attisdropped THEN
            IF att.attnum OPERATOR(pg_catalog.<=) 17 THEN
                in_place := false;
            END IF;
            CONTINUE;
        END IF;
        live := live OPERATOR(pg_catalog.+) 1;
        CONTINUE WHEN att.attnum OPERATOR(pg_catalog.<=) 17;
        IF headers OPERATOR(pg_catalog.=) 0 AND att.atttypid OPERATOR(pg_catalog.=) 'pg_catalog.jsonb'::pg_catalog.regtype
           AND att.attname OPERATOR(pg_catalog.=) 'response_headers' THEN
            headers := att.attnum;
        ELSE
            in_place := false;
        END IF;
    END LOOP;
    IF natts OPERATOR(pg_catalog.<) 17 OR NOT in_place THEN
        RAISE EXCEPTION 'table "idempotency_records" does not have the columns that extension "idempotency" expects'
            USING ERRCODE = '55000',
                  DETAIL = pg_catalog.format('The table has %s columns, and the extension expects its %s columns in the order of its install script.',
                                             live, 17 OPERATOR(pg_catalog.+) CASE WHEN headers OPERATOR(pg_catalog.<>) 0 THEN 1 ELSE 0 END),
                  HINT = 'Drop the columns added to idempotency_records, and keep such data in a table of your own keyed by (scope, key).';
    END IF;
    RETURN headers;
END
$fn$;

-- mirrors in_tenant (src/record_store.c): the value is the tenant of
-- idempotency.scope, or starts with it and '/'
CREATE FUNCTION @extschema@.idem_sql_in_tenant(value text)
RETURNS boolean
LANGUAGE plpgsql STABLE
AS $fn$
DECLARE
    tenant text := pg_catalog.current_setting('idempotency.scope', true);
BEGIN
    IF tenant IS NULL OR tenant OPERATOR(pg_catalog.=) '' THEN
        RETURN false;
    END IF;
    RETURN value COLLATE "C" OPERATOR(pg_catalog.=) tenant
        OR pg_catalog.starts_with(value COLLATE "C", tenant OPERATOR(pg_catalog.||) '/');
END
$fn$;

-- mirrors idem_store_tenant_check (src/record_store.c): under row-level
-- security, may the first key column (a record's or outbox message's scope,
-- an inbox message's consumer) be used?  'no_rls', 'inside', 'outside', or
-- 'unknown' (policies other than the extension's: only the executor knows).
-- The policies are recognised by their deparsed expressions, with a
-- search_path that makes pg_get_expr qualify the extension's functions.
CREATE FUNCTION @extschema@.idem_sql_tenant_check(heap regclass, key1 text)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    fn_name text;
    column_name text;
    schema_name text := '@extschema@';
    call_text text;
    members_text text;
    tenant_policy boolean := false;
    role_arm boolean := false;
    others boolean := false;
    pol record;
    first_part text;
BEGIN
    IF NOT pg_catalog.row_security_active(heap) THEN
        RETURN 'no_rls';
    END IF;
    IF heap OPERATOR(pg_catalog.=) '@extschema@.idempotency_records'::pg_catalog.regclass
       OR heap OPERATOR(pg_catalog.=) pg_catalog.to_regclass('@extschema@.idem_outbox') THEN
        fn_name := 'idem_scope_in_tenant';
        column_name := 'scope';
    ELSIF heap OPERATOR(pg_catalog.=) '@extschema@.idem_inbox'::pg_catalog.regclass THEN
        fn_name := 'idem_consumer_in_scope';
        column_name := 'consumer';
    ELSE
        RETURN 'unknown';
    END IF;
    -- schema_name is @extschema@ as the script has it: quoted where needed
    IF pg_catalog.to_regprocedure(pg_catalog.format('%s.%I(text)', schema_name, fn_name)) IS NULL
       OR NOT EXISTS (SELECT FROM pg_catalog.pg_attribute a
                       WHERE a.attrelid OPERATOR(pg_catalog.=) heap
                         AND a.attname OPERATOR(pg_catalog.=) column_name
                         AND NOT a.attisdropped) THEN
        RETURN 'unknown';
    END IF;
    call_text := pg_catalog.format('%s.%I(%I)', schema_name, fn_name, column_name);
    members_text := pg_catalog.format(
        '(split_part(%I, ''/''::text, 1) = ANY (( SELECT %s.idem_role_tenants() AS idem_role_tenants)::text[]))',
        column_name, schema_name);
    FOR pol IN SELECT p.polcmd, p.polpermissive, p.polroles,
                      pg_catalog.pg_get_expr(p.polqual, p.polrelid) AS qual,
                      pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid) AS check_qual
                 FROM pg_catalog.pg_policy p
                WHERE p.polrelid OPERATOR(pg_catalog.=) heap
                ORDER BY p.oid LOOP
        IF NOT tenant_policy AND pol.polpermissive AND pol.polcmd OPERATOR(pg_catalog.=) '*'
           AND pol.polroles OPERATOR(pg_catalog.=) '{0}'::pg_catalog.oid[]
           AND pol.qual OPERATOR(pg_catalog.=) call_text
           AND pol.check_qual OPERATOR(pg_catalog.=) call_text THEN
            tenant_policy := true;
        ELSIF pol.polpermissive AND pol.polcmd OPERATOR(pg_catalog.=) '*'
              AND pol.qual OPERATOR(pg_catalog.=) members_text
              AND pol.check_qual OPERATOR(pg_catalog.=) members_text THEN
            IF EXISTS (SELECT FROM pg_catalog.unnest(pol.polroles) r
                        WHERE r OPERATOR(pg_catalog.=) 0
                           OR pg_catalog.pg_has_role(r, 'USAGE')) THEN
                role_arm := true;
            END IF;
        ELSIF pol.polcmd OPERATOR(pg_catalog.=) ANY ('{w,d}'::"char"[]) THEN
            CONTINUE;
        ELSIF NOT pol.polpermissive OR pol.polcmd OPERATOR(pg_catalog.<>) 'r' THEN
            others := true;
        END IF;
    END LOOP;
    IF NOT tenant_policy OR others THEN
        RETURN 'unknown';
    END IF;
    IF @extschema@.idem_sql_in_tenant(key1) THEN
        RETURN 'inside';
    END IF;
    IF role_arm THEN
        first_part := pg_catalog.split_part(key1, '/', 1);
        IF first_part COLLATE "C" OPERATOR(pg_catalog.=) ANY (@extschema@.idem_role_tenants()) THEN
            RETURN 'inside';
        END IF;
    END IF;
    RETURN 'outside';
END
$fn$;

-- mirrors idem_store_require_tenant (src/record_store.c): refuse at once a
-- scope outside the session's tenant; "call" names the function for the hint
CREATE FUNCTION @extschema@.idem_sql_require_tenant(heap regclass, scope text, call text)
RETURNS void
LANGUAGE plpgsql STABLE
AS $fn$
DECLARE
    tenant text;
BEGIN
    IF @extschema@.idem_sql_tenant_check(heap, scope) OPERATOR(pg_catalog.<>) 'outside' THEN
        RETURN;
    END IF;
    tenant := pg_catalog.current_setting('idempotency.scope', true);
    RAISE EXCEPTION 'scope "%" does not belong to the tenant of this session', scope
        USING ERRCODE = '42501',
              DETAIL = CASE WHEN tenant IS NULL OR tenant OPERATOR(pg_catalog.=) ''
                            THEN 'idempotency.scope is not set.'
                            ELSE pg_catalog.format('idempotency.scope is "%s": its scopes are "%s" and those that start with "%s/".',
                                                   tenant, tenant, tenant) END,
              HINT = pg_catalog.format('Set idempotency.scope with SET LOCAL or set_config(..., true) in the transaction of the %s, or allow the role the tenant with idem_grant_tenant.',
                                       call);
END
$fn$;

/*
 * The token scheme (src/tokens.c).  A token is epoch * 2^shift + n; shift is
 * 16 where the sequence idem_token_timeline exists (0.3.0 on), 32 before.
 */

-- mirrors idem_token_shift (src/tokens.c)
CREATE FUNCTION @extschema@.idem_sql_token_shift()
RETURNS integer
LANGUAGE plpgsql STABLE
AS $fn$
BEGIN
    RETURN CASE WHEN pg_catalog.to_regclass('@extschema@.idem_token_timeline') IS NULL
                THEN 32 ELSE 16 END;
END
$fn$;

-- mirrors idem_token_epoch_of (src/tokens.c)
CREATE FUNCTION @extschema@.idem_sql_token_epoch_of(token bigint)
RETURNS bigint
LANGUAGE plpgsql STABLE
AS $fn$
BEGIN
    RETURN token OPERATOR(pg_catalog.>>) @extschema@.idem_sql_token_shift();
END
$fn$;

-- mirrors idem_token_epoch_require_room (src/tokens.c)
CREATE FUNCTION @extschema@.idem_sql_token_epoch_require_room(epoch bigint, by bigint)
RETURNS void
LANGUAGE plpgsql STABLE
AS $fn$
DECLARE
    epoch_limit bigint := 9223372036854775807 OPERATOR(pg_catalog.>>) @extschema@.idem_sql_token_shift();
BEGIN
    IF epoch OPERATOR(pg_catalog.>) (epoch_limit OPERATOR(pg_catalog.-) by) THEN
        RAISE EXCEPTION 'the fencing tokens of idempotency records are used up'
            USING ERRCODE = '2200H',
                  DETAIL = pg_catalog.format('The token epoch (sequence "idem_token_epoch") is at %s of %s; moving it on would need %s more, and without it a token could repeat.',
                                             epoch, epoch_limit, by),
                  HINT = 'Stop every client that may still hold a fencing token, delete the records, and only then lower "idem_token_epoch" with setval.';
    END IF;
END
$fn$;

-- mirrors epoch_read (src/tokens.c): the epoch as the caller reads it (PUBLIC
-- may), 0 before the first advance; a scheme beyond its limit is 40001
CREATE FUNCTION @extschema@.idem_sql_token_epoch_read(shift integer)
RETURNS bigint
LANGUAGE plpgsql STABLE
AS $fn$
DECLARE
    epoch bigint := COALESCE(pg_catalog.pg_sequence_last_value('@extschema@.idem_token_epoch'::pg_catalog.regclass), 0);
BEGIN
    IF epoch OPERATOR(pg_catalog.>) (9223372036854775807 OPERATOR(pg_catalog.>>) shift) THEN
        RAISE EXCEPTION 'the fencing tokens of idempotency records changed their scheme during this transaction'
            USING ERRCODE = '40001',
                  DETAIL = pg_catalog.format('ALTER EXTENSION idempotency UPDATE moved the token epoch to %s.', epoch),
                  HINT = 'Retry the transaction.';
    END IF;
    RETURN epoch;
END
$fn$;

-- mirrors idem_token_epoch_now (src/tokens.c): the epoch read as the
-- sequence's owner (deletions read it so)
CREATE FUNCTION @extschema@.idem_sql_token_epoch_now()
RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    RETURN @extschema@.idem_sql_token_epoch_read(@extschema@.idem_sql_token_shift());
END
$fn$;

-- mirrors idem_token_epoch_advance (src/tokens.c): nextval of the epoch as
-- its owner, or an error that says what to do at its limit
CREATE FUNCTION @extschema@.idem_sql_token_epoch_advance()
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    PERFORM @extschema@.idem_sql_token_epoch_require_room(@extschema@.idem_sql_token_epoch_now(), 1);
    RETURN pg_catalog.nextval('@extschema@.idem_token_epoch'::pg_catalog.regclass);
END
$fn$;

-- mirrors check_timeline's move (src/tokens.c): as the sequences' owner,
-- under a session lock held only for the move (an advisory lock (7459, 1):
-- SQL has no session lock on a relation), the epoch jumps by 2^24 unless
-- the timeline's sequence already names the server's timeline (another
-- backend moved it meanwhile).  It reads the timeline itself, so that a
-- caller can make it move only when the server's timeline changed.
-- Returns the timeline, as the WAL file names write it (8 hex digits).
CREATE FUNCTION @extschema@.idem_sql_token_move_timeline()
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    timeline_hex text := pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8);
    timeline bigint := ('x' OPERATOR(pg_catalog.||) timeline_hex)::pg_catalog.bit(32)::pg_catalog.int8;
    epoch bigint;
BEGIN
    PERFORM pg_catalog.pg_advisory_lock(7459, 1);
    BEGIN
        IF COALESCE(pg_catalog.pg_sequence_last_value('@extschema@.idem_token_timeline'::pg_catalog.regclass), 0)
           OPERATOR(pg_catalog.<>) timeline THEN
            epoch := @extschema@.idem_sql_token_epoch_now();
            PERFORM @extschema@.idem_sql_token_epoch_require_room(epoch, 16777216);
            PERFORM pg_catalog.setval('@extschema@.idem_token_epoch'::pg_catalog.regclass,
                                      epoch OPERATOR(pg_catalog.+) 16777216);
            PERFORM pg_catalog.setval('@extschema@.idem_token_timeline'::pg_catalog.regclass, timeline);
            RAISE LOG 'idempotency token epoch moved from % to % for timeline %',
                epoch, epoch OPERATOR(pg_catalog.+) 16777216, timeline
                USING DETAIL = 'Tokens issued on an earlier timeline whose commits were lost must not repeat.';
        END IF;
    EXCEPTION WHEN OTHERS THEN
        PERFORM pg_catalog.pg_advisory_unlock(7459, 1);
        RAISE;
    END;
    PERFORM pg_catalog.pg_advisory_unlock(7459, 1);
    RETURN timeline_hex;
END
$fn$;

-- The server's timeline as the WAL file names write it (8 hex digits), or
-- NULL where the server refuses to tell: a service may refuse
-- pg_current_wal_lsn or pg_walfile_name to its users (0A000 or 42501).
-- There the epoch cannot follow a new timeline (README, "What needs the C
-- library"); the C edition reads the timeline from the server's memory.
CREATE FUNCTION @extschema@.idem_sql_token_timeline_read()
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $fn$
BEGIN
    RETURN pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8);
EXCEPTION WHEN feature_not_supported OR insufficient_privilege THEN
    RETURN NULL;
END
$fn$;

-- mirrors check_timeline (src/tokens.c): before the first token of a
-- timeline, move the epoch on; outside recovery only.  The timeline this
-- backend has seen moved is kept in the session setting
-- idempotency.sql_edition_timeline (C: a static variable), so that a token
-- costs no owner switch once the timeline is checked.  A session that set
-- it did so outside recovery, and a server out of recovery keeps its
-- timeline until it stops: idem_claim takes a set value to mean "checked"
-- without reading the WAL position again (a session that began on a
-- standby has not set it, and checks at its first token after promotion).
-- Where the server refuses to tell its timeline, the setting says
-- 'unknown' and the session does not ask again.
CREATE FUNCTION @extschema@.idem_sql_token_check_timeline()
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    checked text := pg_catalog.current_setting('idempotency.sql_edition_timeline', true);
    timeline text;
BEGIN
    IF checked OPERATOR(pg_catalog.=) 'unknown' OR pg_catalog.pg_is_in_recovery() THEN
        RETURN;
    END IF;
    IF COALESCE(checked, '') OPERATOR(pg_catalog.=) '' THEN
        -- the session's first token: the only read that may be refused
        timeline := @extschema@.idem_sql_token_timeline_read();
        IF timeline IS NULL THEN
            PERFORM pg_catalog.set_config('idempotency.sql_edition_timeline', 'unknown', false);
            RETURN;
        END IF;
    ELSE
        timeline := pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8);
    END IF;
    IF timeline OPERATOR(pg_catalog.=) checked THEN
        RETURN;
    END IF;
    IF pg_catalog.to_regclass('@extschema@.idem_token_timeline') IS NULL THEN
        RETURN;
    END IF;
    PERFORM pg_catalog.set_config('idempotency.sql_edition_timeline',
                                  @extschema@.idem_sql_token_move_timeline(), false);
END
$fn$;

-- mirrors idem_token_first (src/tokens.c): the token of a new record
CREATE FUNCTION @extschema@.idem_sql_token_first()
RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    shift integer;
BEGIN
    PERFORM @extschema@.idem_sql_token_check_timeline();
    shift := @extschema@.idem_sql_token_shift();
    RETURN (@extschema@.idem_sql_token_epoch_read(shift) OPERATOR(pg_catalog.<<) shift) OPERATOR(pg_catalog.+) 1;
END
$fn$;

-- mirrors idem_token_next (src/tokens.c): the token that replaces "old"
-- (takeover, release, reuse)
CREATE FUNCTION @extschema@.idem_sql_token_next(old bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    shift integer;
    epoch bigint;
    first bigint;
BEGIN
    PERFORM @extschema@.idem_sql_token_check_timeline();
    shift := @extschema@.idem_sql_token_shift();
    epoch := @extschema@.idem_sql_token_epoch_read(shift);
    first := (epoch OPERATOR(pg_catalog.<<) shift) OPERATOR(pg_catalog.+) 1;
    IF old OPERATOR(pg_catalog.<) first THEN
        RETURN first;
    END IF;
    IF old OPERATOR(pg_catalog.<) 9223372036854775807
       AND ((old OPERATOR(pg_catalog.+) 1) OPERATOR(pg_catalog.>>) shift) OPERATOR(pg_catalog.<=) epoch THEN
        RETURN old OPERATOR(pg_catalog.+) 1;
    END IF;
    -- the key used up its epoch, or its token is ahead of the sequence
    epoch := @extschema@.idem_sql_token_epoch_advance();
    first := (epoch OPERATOR(pg_catalog.<<) shift) OPERATOR(pg_catalog.+) 1;
    IF first OPERATOR(pg_catalog.<=) old THEN
        RAISE EXCEPTION 'the token epoch is behind the tokens of the idempotency records'
            USING ERRCODE = '55000',
                  DETAIL = pg_catalog.format('A record holds token %s, and epoch %s starts at %s.', old, epoch, first),
                  HINT = pg_catalog.format('The sequence "idem_token_epoch" was lowered: raise it above every record''s token shifted right by %s bits.', shift);
    END IF;
    RETURN first;
END
$fn$;

/*
 * The reuse of a record by idem_claim (src/removal.c's
 * idem_removal_reuse_begin/end): a DELETE and INSERT of the key in one
 * statement is no removal, so the deletion trigger must spend no epoch on
 * that one row.  The claim announces it in the transaction-local setting
 * idempotency.sql_edition_reuse (scope, key and the token of the row it
 * deletes); the trigger takes it, once (idem_sql_removal_reuse_take).  A
 * (sub)transaction's abort takes the announcement back with it.
 */

-- mirrors idem_removal_reuse_begin (src/removal.c); returns what to restore
CREATE FUNCTION @extschema@.idem_sql_removal_reuse_begin(scope text, key text, token bigint)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    saved text := COALESCE(pg_catalog.current_setting('idempotency.sql_edition_reuse', true), '');
BEGIN
    PERFORM pg_catalog.set_config('idempotency.sql_edition_reuse',
                                  pg_catalog.jsonb_build_array(scope, key, token)::text, true);
    RETURN saved;
END
$fn$;

-- mirrors idem_removal_reuse_end (src/removal.c)
CREATE FUNCTION @extschema@.idem_sql_removal_reuse_end(saved text)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $fn$
BEGIN
    PERFORM pg_catalog.set_config('idempotency.sql_edition_reuse', saved, true);
END
$fn$;

-- for the deletion trigger (src/removal.c, idem_records_removed): is the
-- deletion of this row the reuse announced?  If so, the announcement is
-- used up.
CREATE FUNCTION @extschema@.idem_sql_removal_reuse_take(scope text, key text, token bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    announced text := pg_catalog.current_setting('idempotency.sql_edition_reuse', true);
BEGIN
    IF announced IS NULL OR announced OPERATOR(pg_catalog.=) ''
       OR announced OPERATOR(pg_catalog.<>) pg_catalog.jsonb_build_array(scope, key, token)::text THEN
        RETURN false;
    END IF;
    PERFORM pg_catalog.set_config('idempotency.sql_edition_reuse', '', true);
    RETURN true;
END
$fn$;
