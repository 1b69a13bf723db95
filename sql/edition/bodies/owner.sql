-- The owner calls (src/lifecycle.c): idem_complete, idem_fail,
-- idem_checkpoint, idem_release, idem_mark_unknown, and idem_resolve.
-- Each owner call is one UPDATE whose WHERE clause requires the caller's
-- fencing token, status 'processing' and a lease (not released); its row
-- lock orders it against a concurrent takeover (READ COMMITTED re-checks the
-- newest version and matches nothing, REPEATABLE READ gets 40001).  When it
-- matched nothing, idem_sql_owner_miss reads the record to say why, or
-- returns quietly for a repeat of a call that already took effect.
-- GetCurrentTimestamp() is clock_timestamp(); the statements are those of
-- src/record_store.c (STMT_COMPLETE ...), with the arguments qualified by the
-- function's name (#variable_conflict use_column).  The SQL edition keeps no
-- shared-memory counters, so nothing is counted (idem_count).

--@ internal
-- idem_arg_headers (src/validation.c): NULL, or a JSON object of HTTP field
-- names (tokens, RFC 9110 5.6.2; not one the server writes itself; no two
-- that differ only in case) to a string or an array of strings of visible
-- ASCII, spaces and tabs.  Checked in the jsonb's own order of keys, as the
-- C edition iterates them, so the first fault found is the same.
CREATE FUNCTION @extschema@.idem_sql_owner_headers(headers jsonb)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $f$
DECLARE
    item record;
    v text;
    bad text;
    prev text;
BEGIN
    IF headers IS NULL THEN
        RETURN;
    END IF;
    IF pg_catalog.jsonb_typeof(headers) OPERATOR(pg_catalog.<>) 'object' THEN
        RAISE EXCEPTION 'headers must be a JSON object'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('The value given is a JSON %s.',
                      CASE pg_catalog.jsonb_typeof(headers) WHEN 'array' THEN 'array' ELSE 'scalar' END),
                  HINT = 'Pass an object of header names and values, such as {"Location": "/orders/7"}.';
    END IF;
    FOR item IN SELECT e.key, e.value FROM pg_catalog.jsonb_each(headers) e LOOP
        IF item.key OPERATOR(pg_catalog.=) '' THEN
            RAISE EXCEPTION 'header name must not be empty' USING ERRCODE = '22023';
        END IF;
        IF item.key COLLATE "C" OPERATOR(pg_catalog.~) '[^!#$%&''*+.^_`|~0-9A-Za-z-]' THEN
            RAISE EXCEPTION 'invalid header name "%"', item.key
                USING ERRCODE = '22023',
                      DETAIL = 'A header name consists of letters, digits and the characters !#$%&''*+-.^_`|~.';
        END IF;
        IF pg_catalog.lower(item.key COLLATE "C") OPERATOR(pg_catalog.=) ANY
           ('{connection,content-length,keep-alive,proxy-connection,te,trailer,transfer-encoding,upgrade}'::pg_catalog.text[]) THEN
            RAISE EXCEPTION 'header "%" cannot be saved', item.key
                USING ERRCODE = '22023',
                      DETAIL = 'The server writes it for each answer it sends: Content-Length and Transfer-Encoding frame the body, the others belong to the connection.';
        END IF;
        IF pg_catalog.jsonb_typeof(item.value) OPERATOR(pg_catalog.=) 'string' THEN
            v := item.value OPERATOR(pg_catalog.#>>) '{}'::pg_catalog.text[];
        ELSIF pg_catalog.jsonb_typeof(item.value) OPERATOR(pg_catalog.=) 'array' THEN
            -- every element a string; their bytes are checked together below
            -- (the first bad byte of the first bad element decides the error)
            v := NULL;
            FOR bad IN
                SELECT CASE WHEN pg_catalog.jsonb_typeof(a.elem) OPERATOR(pg_catalog.=) 'string'
                            THEN a.elem OPERATOR(pg_catalog.#>>) '{}'::pg_catalog.text[] END
                  FROM pg_catalog.jsonb_array_elements(item.value) a(elem)
            LOOP
                IF bad IS NULL THEN
                    RAISE EXCEPTION 'value of header "%" must be a string or an array of strings', item.key
                        USING ERRCODE = '22023',
                              HINT = 'Save a header with several values as an array of strings, one per value.';
                END IF;
                PERFORM @extschema@.idem_sql_owner_header_value(item.key, bad);
            END LOOP;
        ELSE
            RAISE EXCEPTION 'value of header "%" must be a string or an array of strings', item.key
                USING ERRCODE = '22023',
                      HINT = 'Save a header with several values as an array of strings, one per value.';
        END IF;
        IF v IS NOT NULL THEN
            PERFORM @extschema@.idem_sql_owner_header_value(item.key, v);
        END IF;
    END LOOP;
    -- names are case-insensitive: the first two equal ones in the C
    -- edition's sorted order (pg_strcasecmp; equal names keep their order)
    prev := NULL;
    FOR item IN SELECT e.key, e.n FROM pg_catalog.jsonb_object_keys(headers) WITH ORDINALITY e(key, n)
                 ORDER BY pg_catalog.lower(e.key COLLATE "C") COLLATE "C", e.n LOOP
        IF prev IS NOT NULL AND pg_catalog.lower(prev COLLATE "C") OPERATOR(pg_catalog.=) pg_catalog.lower(item.key COLLATE "C") THEN
            RAISE EXCEPTION 'header "%" is given twice', item.key
                USING ERRCODE = '22023',
                      DETAIL = pg_catalog.format('Header names are case-insensitive: "%s" and "%s" name the same header.', prev, item.key),
                      HINT = 'Save a header with several values as one array of strings.';
        END IF;
        prev := item.key;
    END LOOP;
END
$f$;

-- check_header_value (src/validation.c): the first byte that is neither a
-- tab nor visible ASCII or a space decides: CR or LF, or another.
CREATE FUNCTION @extschema@.idem_sql_owner_header_value(name text, value text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $f$
DECLARE
    bad text := pg_catalog.substring(value COLLATE "C", '[^\t -~]');
BEGIN
    IF bad IS NULL THEN
        RETURN;
    END IF;
    IF bad OPERATOR(pg_catalog.=) ANY (ARRAY[E'\r', E'\n']) THEN
        RAISE EXCEPTION 'value of header "%" contains a line break', name
            USING ERRCODE = '22023', DETAIL = 'Header values cannot contain CR or LF characters.';
    END IF;
    RAISE EXCEPTION 'value of header "%" contains a character that cannot be sent', name
        USING ERRCODE = '22023',
              DETAIL = 'Header values consist of visible ASCII characters, spaces and tabs.',
              HINT = 'Encode other text, for example as RFC 8187 does.';
END
$f$;

-- explain_owner_miss (src/lifecycle.c): an owner's UPDATE matched nothing.
-- Raises IK004 (no record), IK002 (another token, or released), or IK003
-- (not in progress); returns for a repeat with the same token and values of
-- a call that already took effect (want_status not NULL: complete, fail,
-- mark unknown; want_code compared only if compare_code).
CREATE FUNCTION @extschema@.idem_sql_owner_miss(
    p_scope text, p_key text, p_token bigint, action text,
    want_status text, want_result jsonb, want_error jsonb, want_headers jsonb,
    compare_code boolean, want_code integer, want_retryable boolean)
RETURNS void
LANGUAGE plpgsql
AS $f$
DECLARE
    r record;
BEGIN
    SELECT t.token, t.status::pg_catalog.text AS status, t.lease_expires_at, t.result, t.error,
           t.response_headers, t.response_code, t.retryable
      INTO r
      FROM @extschema@.idempotency_records t
     WHERE t.scope OPERATOR(pg_catalog.=) p_scope AND t.key OPERATOR(pg_catalog.=) p_key;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'idempotency key "%" does not exist', p_key
            USING ERRCODE = 'IK004',
                  DETAIL = pg_catalog.format('No record has this key in scope "%s".', p_scope),
                  HINT = 'Claim the key with idem_claim() first.';
    END IF;
    -- release moved the token past the owner's: a released record's current
    -- token is one nobody was given
    IF p_token OPERATOR(pg_catalog.<>) r.token
       OR (r.status OPERATOR(pg_catalog.=) 'processing' AND r.lease_expires_at IS NULL) THEN
        RAISE EXCEPTION 'token % is not the current fencing token of idempotency key "%"', p_token, p_key
            USING ERRCODE = 'IK002',
                  DETAIL = CASE WHEN p_token OPERATOR(pg_catalog.<) r.token
                                THEN 'The key was taken over or released after this token was issued.'
                                ELSE 'No such token was issued for this key.' END,
                  HINT = 'Do not apply this attempt''s outcome; claim the key again to learn its state.';
    END IF;
    IF want_status IS NOT NULL
       AND r.status OPERATOR(pg_catalog.=) want_status
       AND (want_status OPERATOR(pg_catalog.<>) 'failed'
            OR r.retryable OPERATOR(pg_catalog.=) want_retryable)
       AND (NOT compare_code
            OR COALESCE(r.response_code OPERATOR(pg_catalog.=) want_code,
                        r.response_code IS NULL AND want_code IS NULL))
       AND COALESCE(r.result OPERATOR(pg_catalog.=) want_result, r.result IS NULL AND want_result IS NULL)
       AND COALESCE(r.error OPERATOR(pg_catalog.=) want_error, r.error IS NULL AND want_error IS NULL)
       AND COALESCE(r.response_headers OPERATOR(pg_catalog.=) want_headers,
                    r.response_headers IS NULL AND want_headers IS NULL) THEN
        RETURN;
    END IF;
    RAISE EXCEPTION 'cannot % idempotency key "%" because it is not in progress', action, p_key
        USING ERRCODE = 'IK003', DETAIL = pg_catalog.format('Its status is "%s".', r.status);
END
$f$;

--@ idem_complete(text, bigint, jsonb, integer, text, jsonb)
-- STMT_COMPLETE: the outcome saved, the lease ended, the expiry moved by the
-- time the work took (retention counts from completion).
LANGUAGE plpgsql
AS $body$
#variable_conflict use_column
DECLARE
    t_now pg_catalog.timestamptz;
BEGIN
    PERFORM @extschema@.idem_sql_owner_args(idem_complete.key, idem_complete.token, idem_complete.scope);
    IF idem_complete.headers IS NOT NULL THEN
        PERFORM @extschema@.idem_sql_owner_headers(idem_complete.headers);
    END IF;
    t_now := pg_catalog.clock_timestamp();
    UPDATE @extschema@.idempotency_records
       SET status = 'succeeded', result = idem_complete.result,
           response_code = idem_complete.response_code,
           response_headers = idem_complete.headers, error = NULL,
           completed_at = t_now, updated_at = t_now, lease_expires_at = NULL,
           expires_at = expires_at OPERATOR(pg_catalog.+) (t_now OPERATOR(pg_catalog.-) created_at)
     WHERE scope OPERATOR(pg_catalog.=) idem_complete.scope
       AND key OPERATOR(pg_catalog.=) idem_complete.key
       AND token OPERATOR(pg_catalog.=) idem_complete.token
       AND status OPERATOR(pg_catalog.=) 'processing' AND lease_expires_at IS NOT NULL;
    IF NOT FOUND THEN
        PERFORM @extschema@.idem_sql_owner_miss(idem_complete.scope, idem_complete.key,
            idem_complete.token, 'complete', 'succeeded', idem_complete.result, NULL,
            idem_complete.headers, true, idem_complete.response_code, false);
    END IF;
END
$body$;

--@ idem_complete(text, bigint, jsonb, integer, text)
-- 0.1.0's declaration (dropped by the update to 0.2.0): no headers.
LANGUAGE plpgsql
AS $body$
BEGIN
    PERFORM @extschema@.idem_complete($1, $2, $3, $4, $5, NULL::pg_catalog.jsonb);
END
$body$;

--@ idem_fail(text, bigint, jsonb, boolean, text, integer, jsonb)
-- STMT_FAIL
LANGUAGE plpgsql
AS $body$
#variable_conflict use_column
DECLARE
    t_now pg_catalog.timestamptz;
BEGIN
    PERFORM @extschema@.idem_sql_owner_args(idem_fail.key, idem_fail.token, idem_fail.scope);
    IF idem_fail.error IS NULL THEN
        RAISE EXCEPTION 'error must not be null' USING ERRCODE = '22004';
    END IF;
    IF idem_fail.retryable IS NULL THEN
        RAISE EXCEPTION 'retryable must not be null' USING ERRCODE = '22004';
    END IF;
    IF idem_fail.headers IS NOT NULL THEN
        PERFORM @extschema@.idem_sql_owner_headers(idem_fail.headers);
    END IF;
    t_now := pg_catalog.clock_timestamp();
    UPDATE @extschema@.idempotency_records
       SET status = 'failed', error = idem_fail.error, retryable = idem_fail.retryable,
           response_code = idem_fail.response_code,
           response_headers = idem_fail.headers, result = NULL,
           completed_at = t_now, updated_at = t_now, lease_expires_at = NULL,
           expires_at = expires_at OPERATOR(pg_catalog.+) (t_now OPERATOR(pg_catalog.-) created_at)
     WHERE scope OPERATOR(pg_catalog.=) idem_fail.scope
       AND key OPERATOR(pg_catalog.=) idem_fail.key
       AND token OPERATOR(pg_catalog.=) idem_fail.token
       AND status OPERATOR(pg_catalog.=) 'processing' AND lease_expires_at IS NOT NULL;
    IF NOT FOUND THEN
        PERFORM @extschema@.idem_sql_owner_miss(idem_fail.scope, idem_fail.key,
            idem_fail.token, 'fail', 'failed', NULL, idem_fail.error,
            idem_fail.headers, true, idem_fail.response_code, idem_fail.retryable);
    END IF;
END
$body$;

--@ idem_fail(text, bigint, jsonb, boolean, text, integer)
-- 0.1.0's declaration (dropped by the update to 0.2.0): no headers.
LANGUAGE plpgsql
AS $body$
BEGIN
    PERFORM @extschema@.idem_fail($1, $2, $3, $4, $5, $6, NULL::pg_catalog.jsonb);
END
$body$;

--@ idem_checkpoint(text, bigint, text, interval, text)
-- STMT_CHECKPOINT: a recovery point and/or a longer lease (NULL keeps
-- either); returns the lease's end as stored.
LANGUAGE plpgsql
AS $body$
#variable_conflict use_column
DECLARE
    t_now pg_catalog.timestamptz;
    lease pg_catalog.timestamptz;
    stored pg_catalog.timestamptz;
BEGIN
    PERFORM @extschema@.idem_sql_owner_args(idem_checkpoint.key, idem_checkpoint.token, idem_checkpoint.scope);
    t_now := pg_catalog.clock_timestamp();
    IF idem_checkpoint.extend_lease IS NOT NULL THEN
        lease := @extschema@.idem_sql_owner_add_interval(t_now, idem_checkpoint.extend_lease, 'extend_lease');
    END IF;
    UPDATE @extschema@.idempotency_records
       SET recovery_point = COALESCE(idem_checkpoint.recovery_point, recovery_point),
           lease_expires_at = COALESCE(lease, lease_expires_at), updated_at = t_now
     WHERE scope OPERATOR(pg_catalog.=) idem_checkpoint.scope
       AND key OPERATOR(pg_catalog.=) idem_checkpoint.key
       AND token OPERATOR(pg_catalog.=) idem_checkpoint.token
       AND status OPERATOR(pg_catalog.=) 'processing' AND lease_expires_at IS NOT NULL
    RETURNING lease_expires_at INTO stored;
    IF NOT FOUND THEN
        PERFORM @extschema@.idem_sql_owner_miss(idem_checkpoint.scope, idem_checkpoint.key,
            idem_checkpoint.token, 'checkpoint', NULL, NULL, NULL, NULL, false, NULL, false);
    END IF;
    RETURN stored;
END
$body$;

--@ idem_release(text, bigint, text)
-- STMT_RELEASE: the lease ends and the token moves on (idem_token_next of the
-- caller's), which fences the releasing owner off; the next claim reuses the key.
LANGUAGE plpgsql
AS $body$
#variable_conflict use_column
DECLARE
    next_token pg_catalog.int8;
BEGIN
    PERFORM @extschema@.idem_sql_owner_args(idem_release.key, idem_release.token, idem_release.scope);
    next_token := @extschema@.idem_sql_token_next(idem_release.token);
    UPDATE @extschema@.idempotency_records
       SET token = GREATEST(token OPERATOR(pg_catalog.+) 1, next_token), lease_expires_at = NULL,
           updated_at = pg_catalog.clock_timestamp()
     WHERE scope OPERATOR(pg_catalog.=) idem_release.scope
       AND key OPERATOR(pg_catalog.=) idem_release.key
       AND token OPERATOR(pg_catalog.=) idem_release.token
       AND status OPERATOR(pg_catalog.=) 'processing' AND lease_expires_at IS NOT NULL;
    IF NOT FOUND THEN
        PERFORM @extschema@.idem_sql_owner_miss(idem_release.scope, idem_release.key,
            idem_release.token, 'release', NULL, NULL, NULL, NULL, false, NULL, false);
    END IF;
END
$body$;

--@ idem_mark_unknown(text, bigint, jsonb, text)
-- STMT_MARK_UNKNOWN: the outcome is not known; it waits for idem_resolve.
LANGUAGE plpgsql
AS $body$
#variable_conflict use_column
BEGIN
    PERFORM @extschema@.idem_sql_owner_args(idem_mark_unknown.key, idem_mark_unknown.token, idem_mark_unknown.scope);
    IF idem_mark_unknown.detail IS NULL THEN
        RAISE EXCEPTION 'detail must not be null' USING ERRCODE = '22004';
    END IF;
    UPDATE @extschema@.idempotency_records
       SET status = 'unknown', error = idem_mark_unknown.detail, lease_expires_at = NULL,
           updated_at = pg_catalog.clock_timestamp()
     WHERE scope OPERATOR(pg_catalog.=) idem_mark_unknown.scope
       AND key OPERATOR(pg_catalog.=) idem_mark_unknown.key
       AND token OPERATOR(pg_catalog.=) idem_mark_unknown.token
       AND status OPERATOR(pg_catalog.=) 'processing' AND lease_expires_at IS NOT NULL;
    IF NOT FOUND THEN
        PERFORM @extschema@.idem_sql_owner_miss(idem_mark_unknown.scope, idem_mark_unknown.key,
            idem_mark_unknown.token, 'mark unknown', 'unknown', NULL, idem_mark_unknown.detail,
            NULL, false, NULL, false);
    END IF;
END
$body$;

--@ idem_resolve(text, idem_status, jsonb, integer, text, boolean, jsonb)
-- STMT_RESOLVE: an unknown outcome settled after reconciliation, no token
-- needed.  'succeeded' saves result as the result, 'failed' as the error.
LANGUAGE plpgsql
AS $body$
#variable_conflict use_column
DECLARE
    t_now pg_catalog.timestamptz;
    current_status pg_catalog.text;
BEGIN
    PERFORM @extschema@.idem_sql_owner_key_scope(idem_resolve.key, idem_resolve.scope);
    IF idem_resolve.headers IS NOT NULL THEN
        PERFORM @extschema@.idem_sql_owner_headers(idem_resolve.headers);
    END IF;
    IF idem_resolve.status IS NULL THEN
        RAISE EXCEPTION 'status must not be null' USING ERRCODE = '22004';
    END IF;
    IF idem_resolve.retryable IS NULL THEN
        RAISE EXCEPTION 'retryable must not be null' USING ERRCODE = '22004';
    END IF;
    IF idem_resolve.status::pg_catalog.text OPERATOR(pg_catalog.<>) ALL ('{succeeded,failed}'::pg_catalog.text[]) THEN
        RAISE EXCEPTION 'cannot resolve an unknown outcome to status "%"', idem_resolve.status
            USING ERRCODE = '22023', HINT = 'Resolve it to "succeeded" or "failed".';
    END IF;
    IF idem_resolve.status::pg_catalog.text OPERATOR(pg_catalog.=) 'succeeded' AND idem_resolve.retryable THEN
        RAISE EXCEPTION 'a succeeded outcome cannot be retryable'
            USING ERRCODE = '22023', HINT = 'Pass retryable => true only with status "failed".';
    END IF;
    t_now := pg_catalog.clock_timestamp();
    UPDATE @extschema@.idempotency_records
       SET status = idem_resolve.status,
           result = CASE WHEN idem_resolve.status::pg_catalog.text OPERATOR(pg_catalog.=) 'succeeded'
                         THEN idem_resolve.result END,
           error = CASE WHEN idem_resolve.status::pg_catalog.text OPERATOR(pg_catalog.=) 'failed'
                        THEN idem_resolve.result END,
           response_code = idem_resolve.response_code,
           response_headers = idem_resolve.headers, retryable = idem_resolve.retryable,
           completed_at = t_now, updated_at = t_now,
           expires_at = expires_at OPERATOR(pg_catalog.+) (t_now OPERATOR(pg_catalog.-) created_at)
     WHERE scope OPERATOR(pg_catalog.=) idem_resolve.scope
       AND key OPERATOR(pg_catalog.=) idem_resolve.key
       AND status OPERATOR(pg_catalog.=) 'unknown';
    IF NOT FOUND THEN
        SELECT t.status::pg_catalog.text INTO current_status
          FROM @extschema@.idempotency_records t
         WHERE t.scope OPERATOR(pg_catalog.=) idem_resolve.scope
           AND t.key OPERATOR(pg_catalog.=) idem_resolve.key;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'idempotency key "%" does not exist', idem_resolve.key
                USING ERRCODE = 'IK004',
                      DETAIL = pg_catalog.format('No record has this key in scope "%s".', idem_resolve.scope);
        END IF;
        RAISE EXCEPTION 'idempotency key "%" has no unknown outcome to resolve', idem_resolve.key
            USING ERRCODE = 'IK003', DETAIL = pg_catalog.format('Its status is "%s".', current_status);
    END IF;
END
$body$;

--@ idem_resolve(text, idem_status, jsonb, integer, text, boolean)
-- 0.1.0's declaration (dropped by the update to 0.2.0): no headers.
LANGUAGE plpgsql
AS $body$
BEGIN
    PERFORM @extschema@.idem_resolve($1, $2, $3, $4, $5, $6, NULL::pg_catalog.jsonb);
END
$body$;
