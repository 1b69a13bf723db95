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
-- explain_owner_miss (src/lifecycle.c): an owner's UPDATE matched nothing.
-- Raises IK004 (no record), IK002 (another token, or released), or IK003
-- (not in progress); returns for a repeat with the same token and values of
-- a call that already took effect (want_status not NULL: complete, fail,
-- mark unknown; want_code compared only if compare_code).
CREATE FUNCTION @extschema@.idem_sql_owner_miss(
    p_scope pg_catalog.text, p_key pg_catalog.text, p_token pg_catalog.int8, action pg_catalog.text,
    want_status pg_catalog.text, want_result pg_catalog.jsonb, want_error pg_catalog.jsonb,
    want_headers pg_catalog.jsonb, compare_code pg_catalog.bool, want_code pg_catalog.int4,
    want_retryable pg_catalog.bool)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $f$
DECLARE
    r record;
    seqscan pg_catalog.text := pg_catalog.current_setting('enable_seqscan');
    ignored pg_catalog.text := pg_catalog.set_config('enable_seqscan', 'off', true);
BEGIN
    SELECT t.token, t.status::pg_catalog.text AS status, t.lease_expires_at, t.result, t.error,
           t.response_headers, t.response_code, t.retryable
      INTO r
      FROM @extschema@.idempotency_records t
     WHERE t.scope OPERATOR(pg_catalog.=) p_scope AND t.key OPERATOR(pg_catalog.=) p_key;
    ignored := pg_catalog.set_config('enable_seqscan', seqscan, true);
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
    seqscan pg_catalog.text;
    ignored pg_catalog.text;
    t_now pg_catalog.timestamptz;
BEGIN
    IF idem_complete.key IS NULL OR idem_complete.key OPERATOR(pg_catalog.=) ''
       OR pg_catalog.octet_length(idem_complete.key) OPERATOR(pg_catalog.>) 255
       OR idem_complete.token IS NULL OR idem_complete.token OPERATOR(pg_catalog.<=) 0
       OR idem_complete.scope IS NULL OR pg_catalog.octet_length(idem_complete.scope) OPERATOR(pg_catalog.>) 255
       OR pg_catalog.current_setting('idempotency.max_key_length', true) OPERATOR(pg_catalog.<>) '' THEN
        PERFORM @extschema@.idem_sql_arg_key(idem_complete.key, 'idempotency key');
        PERFORM @extschema@.idem_sql_arg_token(idem_complete.token);
        PERFORM @extschema@.idem_sql_arg_scope(idem_complete.scope);
    END IF;
    IF idem_complete.headers IS NOT NULL THEN
        PERFORM @extschema@.idem_sql_arg_headers(idem_complete.headers);
    END IF;
    t_now := pg_catalog.clock_timestamp();
    -- planned without sequential scans, as the C edition's statements
    -- (record_store.c, idem_execute_without_seqscan): a generic plan
    -- cached while the table was small must not scan it once it grew
    seqscan := pg_catalog.current_setting('enable_seqscan');
    ignored := pg_catalog.set_config('enable_seqscan', 'off', true);
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
    ignored := pg_catalog.set_config('enable_seqscan', seqscan, true);
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
    seqscan pg_catalog.text;
    ignored pg_catalog.text;
    t_now pg_catalog.timestamptz;
BEGIN
    IF idem_fail.key IS NULL OR idem_fail.key OPERATOR(pg_catalog.=) ''
       OR pg_catalog.octet_length(idem_fail.key) OPERATOR(pg_catalog.>) 255
       OR idem_fail.token IS NULL OR idem_fail.token OPERATOR(pg_catalog.<=) 0
       OR idem_fail.scope IS NULL OR pg_catalog.octet_length(idem_fail.scope) OPERATOR(pg_catalog.>) 255
       OR pg_catalog.current_setting('idempotency.max_key_length', true) OPERATOR(pg_catalog.<>) '' THEN
        PERFORM @extschema@.idem_sql_arg_key(idem_fail.key, 'idempotency key');
        PERFORM @extschema@.idem_sql_arg_token(idem_fail.token);
        PERFORM @extschema@.idem_sql_arg_scope(idem_fail.scope);
    END IF;
    IF idem_fail.error IS NULL THEN
        RAISE EXCEPTION 'error must not be null' USING ERRCODE = '22004';
    END IF;
    IF idem_fail.retryable IS NULL THEN
        RAISE EXCEPTION 'retryable must not be null' USING ERRCODE = '22004';
    END IF;
    IF idem_fail.headers IS NOT NULL THEN
        PERFORM @extschema@.idem_sql_arg_headers(idem_fail.headers);
    END IF;
    t_now := pg_catalog.clock_timestamp();
    -- planned without sequential scans, as the C edition's statements
    -- (record_store.c, idem_execute_without_seqscan): a generic plan
    -- cached while the table was small must not scan it once it grew
    seqscan := pg_catalog.current_setting('enable_seqscan');
    ignored := pg_catalog.set_config('enable_seqscan', 'off', true);
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
    ignored := pg_catalog.set_config('enable_seqscan', seqscan, true);
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
    seqscan pg_catalog.text;
    ignored pg_catalog.text;
    t_now pg_catalog.timestamptz;
    lease pg_catalog.timestamptz;
    stored pg_catalog.timestamptz;
BEGIN
    IF idem_checkpoint.key IS NULL OR idem_checkpoint.key OPERATOR(pg_catalog.=) ''
       OR pg_catalog.octet_length(idem_checkpoint.key) OPERATOR(pg_catalog.>) 255
       OR idem_checkpoint.token IS NULL OR idem_checkpoint.token OPERATOR(pg_catalog.<=) 0
       OR idem_checkpoint.scope IS NULL OR pg_catalog.octet_length(idem_checkpoint.scope) OPERATOR(pg_catalog.>) 255
       OR pg_catalog.current_setting('idempotency.max_key_length', true) OPERATOR(pg_catalog.<>) '' THEN
        PERFORM @extschema@.idem_sql_arg_key(idem_checkpoint.key, 'idempotency key');
        PERFORM @extschema@.idem_sql_arg_token(idem_checkpoint.token);
        PERFORM @extschema@.idem_sql_arg_scope(idem_checkpoint.scope);
    END IF;
    t_now := pg_catalog.clock_timestamp();
    IF idem_checkpoint.extend_lease IS NOT NULL THEN
        lease := t_now OPERATOR(pg_catalog.+) idem_checkpoint.extend_lease;
        IF lease OPERATOR(pg_catalog.<=) t_now OR NOT pg_catalog.isfinite(lease) THEN
            lease := @extschema@.idem_sql_add_interval(t_now, idem_checkpoint.extend_lease, 'extend_lease');
        END IF;
    END IF;
    -- planned without sequential scans, as the C edition's statements
    -- (record_store.c, idem_execute_without_seqscan): a generic plan
    -- cached while the table was small must not scan it once it grew
    seqscan := pg_catalog.current_setting('enable_seqscan');
    ignored := pg_catalog.set_config('enable_seqscan', 'off', true);
    UPDATE @extschema@.idempotency_records
       SET recovery_point = COALESCE(idem_checkpoint.recovery_point, recovery_point),
           lease_expires_at = COALESCE(lease, lease_expires_at), updated_at = t_now
     WHERE scope OPERATOR(pg_catalog.=) idem_checkpoint.scope
       AND key OPERATOR(pg_catalog.=) idem_checkpoint.key
       AND token OPERATOR(pg_catalog.=) idem_checkpoint.token
       AND status OPERATOR(pg_catalog.=) 'processing' AND lease_expires_at IS NOT NULL
    RETURNING lease_expires_at INTO stored;
    ignored := pg_catalog.set_config('enable_seqscan', seqscan, true);
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
    seqscan pg_catalog.text;
    ignored pg_catalog.text;
    next_token pg_catalog.int8;
BEGIN
    IF idem_release.key IS NULL OR idem_release.key OPERATOR(pg_catalog.=) ''
       OR pg_catalog.octet_length(idem_release.key) OPERATOR(pg_catalog.>) 255
       OR idem_release.token IS NULL OR idem_release.token OPERATOR(pg_catalog.<=) 0
       OR idem_release.scope IS NULL OR pg_catalog.octet_length(idem_release.scope) OPERATOR(pg_catalog.>) 255
       OR pg_catalog.current_setting('idempotency.max_key_length', true) OPERATOR(pg_catalog.<>) '' THEN
        PERFORM @extschema@.idem_sql_arg_key(idem_release.key, 'idempotency key');
        PERFORM @extschema@.idem_sql_arg_token(idem_release.token);
        PERFORM @extschema@.idem_sql_arg_scope(idem_release.scope);
    END IF;
    next_token := @extschema@.idem_sql_token_next(idem_release.token);
    -- planned without sequential scans, as the C edition's statements
    -- (record_store.c, idem_execute_without_seqscan): a generic plan
    -- cached while the table was small must not scan it once it grew
    seqscan := pg_catalog.current_setting('enable_seqscan');
    ignored := pg_catalog.set_config('enable_seqscan', 'off', true);
    UPDATE @extschema@.idempotency_records
       SET token = GREATEST(token OPERATOR(pg_catalog.+) 1, next_token), lease_expires_at = NULL,
           updated_at = pg_catalog.clock_timestamp()
     WHERE scope OPERATOR(pg_catalog.=) idem_release.scope
       AND key OPERATOR(pg_catalog.=) idem_release.key
       AND token OPERATOR(pg_catalog.=) idem_release.token
       AND status OPERATOR(pg_catalog.=) 'processing' AND lease_expires_at IS NOT NULL;
    ignored := pg_catalog.set_config('enable_seqscan', seqscan, true);
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
DECLARE
    seqscan pg_catalog.text;
    ignored pg_catalog.text;
BEGIN
    IF idem_mark_unknown.key IS NULL OR idem_mark_unknown.key OPERATOR(pg_catalog.=) ''
       OR pg_catalog.octet_length(idem_mark_unknown.key) OPERATOR(pg_catalog.>) 255
       OR idem_mark_unknown.token IS NULL OR idem_mark_unknown.token OPERATOR(pg_catalog.<=) 0
       OR idem_mark_unknown.scope IS NULL OR pg_catalog.octet_length(idem_mark_unknown.scope) OPERATOR(pg_catalog.>) 255
       OR pg_catalog.current_setting('idempotency.max_key_length', true) OPERATOR(pg_catalog.<>) '' THEN
        PERFORM @extschema@.idem_sql_arg_key(idem_mark_unknown.key, 'idempotency key');
        PERFORM @extschema@.idem_sql_arg_token(idem_mark_unknown.token);
        PERFORM @extschema@.idem_sql_arg_scope(idem_mark_unknown.scope);
    END IF;
    IF idem_mark_unknown.detail IS NULL THEN
        RAISE EXCEPTION 'detail must not be null' USING ERRCODE = '22004';
    END IF;
    -- planned without sequential scans, as the C edition's statements
    -- (record_store.c, idem_execute_without_seqscan): a generic plan
    -- cached while the table was small must not scan it once it grew
    seqscan := pg_catalog.current_setting('enable_seqscan');
    ignored := pg_catalog.set_config('enable_seqscan', 'off', true);
    UPDATE @extschema@.idempotency_records
       SET status = 'unknown', error = idem_mark_unknown.detail, lease_expires_at = NULL,
           updated_at = pg_catalog.clock_timestamp()
     WHERE scope OPERATOR(pg_catalog.=) idem_mark_unknown.scope
       AND key OPERATOR(pg_catalog.=) idem_mark_unknown.key
       AND token OPERATOR(pg_catalog.=) idem_mark_unknown.token
       AND status OPERATOR(pg_catalog.=) 'processing' AND lease_expires_at IS NOT NULL;
    ignored := pg_catalog.set_config('enable_seqscan', seqscan, true);
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
    seqscan pg_catalog.text;
    ignored pg_catalog.text;
    t_now pg_catalog.timestamptz;
    current_status pg_catalog.text;
BEGIN
    IF idem_resolve.key IS NULL OR idem_resolve.key OPERATOR(pg_catalog.=) ''
       OR pg_catalog.octet_length(idem_resolve.key) OPERATOR(pg_catalog.>) 255
       OR idem_resolve.scope IS NULL OR pg_catalog.octet_length(idem_resolve.scope) OPERATOR(pg_catalog.>) 255
       OR pg_catalog.current_setting('idempotency.max_key_length', true) OPERATOR(pg_catalog.<>) '' THEN
        PERFORM @extschema@.idem_sql_arg_key(idem_resolve.key, 'idempotency key');
        PERFORM @extschema@.idem_sql_arg_scope(idem_resolve.scope);
    END IF;
    IF idem_resolve.headers IS NOT NULL THEN
        PERFORM @extschema@.idem_sql_arg_headers(idem_resolve.headers);
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
    -- planned without sequential scans, as the C edition's statements
    -- (record_store.c, idem_execute_without_seqscan): a generic plan
    -- cached while the table was small must not scan it once it grew
    seqscan := pg_catalog.current_setting('enable_seqscan');
    ignored := pg_catalog.set_config('enable_seqscan', 'off', true);
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
    ignored := pg_catalog.set_config('enable_seqscan', seqscan, true);
    IF NOT FOUND THEN
        -- (enable_seqscan stays off: an error follows, which puts it back)
        ignored := pg_catalog.set_config('enable_seqscan', 'off', true);
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
