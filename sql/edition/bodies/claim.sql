-- The claim core of the SQL edition: idem_claim (src/claim.c and the
-- statements of src/record_store.c it runs), idem_lookup (src/lifecycle.c)
-- and idem_await (src/await.c).  Shared helpers: 00_internal.sql.

--@ idem_claim(text, bytea, interval, text, interval, boolean)
-- src/claim.c.  Reads the record first (a replay is one index probe and
-- writes nothing); writes only when the key must change hands: no row, an
-- INSERT ... ON CONFLICT DO NOTHING; a row to take over or reuse, locked with
-- SELECT ... FOR NO KEY UPDATE (SKIP LOCKED with wait => false) and decided
-- again on its newest version.  With wait => false a new key's INSERT runs in
-- a subtransaction with lock_timeout = 1ms after the table's lock is taken:
-- a wait for another transaction's uncommitted row of the key (C: the dirty
-- probe of the primary key) fails at once with 55P03, which is in_progress.
-- The tokens are tokens.c's (00_internal.sql), computed inline on the hot
-- path once the session has checked its timeline.
LANGUAGE plpgsql
AS $body$
#variable_conflict use_column
DECLARE
    t_now timestamptz := pg_catalog.clock_timestamp();
    lease_at timestamptz;
    expires timestamptz;
    setting text;
    rec record;
    found_row boolean;
    outcome text;
    tok bigint;
    later bigint;
    inserted integer;
    timeline text;
    epoch bigint;
    shift integer;
    busy boolean;
    saved_timeout text;
    saved_reuse text;
    retention_us numeric;
    locked boolean;
BEGIN
    -- the arguments, in validation.c's order: key, fingerprint, scope, lease,
    -- retention, wait (the full checks only where the quick ones fail)
    IF key IS NULL OR key OPERATOR(pg_catalog.=) '' OR pg_catalog.octet_length(key) OPERATOR(pg_catalog.>) 255
       OR fingerprint IS NULL OR pg_catalog.length(fingerprint) OPERATOR(pg_catalog.=) 0
       OR pg_catalog.length(fingerprint) OPERATOR(pg_catalog.>) 64
       OR scope IS NULL OR pg_catalog.octet_length(scope) OPERATOR(pg_catalog.>) 255
       OR pg_catalog.current_setting('idempotency.max_key_length', true) OPERATOR(pg_catalog.<>) '' THEN
        PERFORM @extschema@.idem_sql_arg_key(key, 'idempotency key');
        PERFORM @extschema@.idem_sql_arg_fingerprint(fingerprint);
        PERFORM @extschema@.idem_sql_arg_scope(scope);
    END IF;
    IF lease IS NULL THEN
        setting := pg_catalog.current_setting('idempotency.default_lease', true);
        IF setting IS NULL OR setting OPERATOR(pg_catalog.=) '' THEN
            lease_at := t_now OPERATOR(pg_catalog.+) '30 s'::interval;
        ELSE
            lease_at := t_now OPERATOR(pg_catalog.+)
                ('1 ms'::interval OPERATOR(pg_catalog.*)
                 @extschema@.idem_sql_setting_int('idempotency.default_lease', 30000, 1, 2147483647, 'ms'));
        END IF;
    ELSE
        lease_at := t_now OPERATOR(pg_catalog.+) lease;
        IF lease_at OPERATOR(pg_catalog.<=) t_now OR NOT pg_catalog.isfinite(lease_at) THEN
            lease_at := @extschema@.idem_sql_add_interval(t_now, lease, 'lease');
        END IF;
    END IF;
    IF retention IS NULL THEN
        setting := pg_catalog.current_setting('idempotency.retention', true);
        IF setting IS NULL OR setting OPERATOR(pg_catalog.=) '' THEN
            expires := t_now OPERATOR(pg_catalog.+) '86400 s'::interval;
        ELSE
            expires := @extschema@.idem_sql_retention_expiry(NULL, t_now);
        END IF;
    ELSE
        expires := t_now OPERATOR(pg_catalog.+) retention;
        IF expires OPERATOR(pg_catalog.<=) t_now OR NOT pg_catalog.isfinite(expires) THEN
            expires := @extschema@.idem_sql_add_interval(t_now, retention, 'retention');
        END IF;
    END IF;
    IF wait IS NULL THEN
        RAISE EXCEPTION 'wait must not be null' USING ERRCODE = '22004';
    END IF;

    -- under tenant isolation, a scope outside the session's tenant could only
    -- fail the INSERT's policy check, after a read that finds nothing
    IF pg_catalog.row_security_active('@extschema@.idempotency_records'::pg_catalog.regclass) THEN
        PERFORM @extschema@.idem_sql_require_tenant('@extschema@.idempotency_records'::pg_catalog.regclass,
                                                    scope, 'claim');
    END IF;

    FOR round IN 1 .. 8 LOOP
        outcome := NULL;
        SELECT r.scope, r.key, r.fingerprint, r.token, r.lease_expires_at, r.created_at, r.updated_at,
               r.completed_at, r.expires_at, r.purge_after, r.status, r.attempts, r.response_code,
               r.retryable, r.recovery_point, r.result, r.error, r.response_headers
          INTO rec
          FROM @extschema@.idempotency_records r
         WHERE r.scope OPERATOR(pg_catalog.=) idem_claim.scope
           AND r.key OPERATOR(pg_catalog.=) idem_claim.key;
        found_row := FOUND;

        IF NOT found_row THEN
            -- tokens.c's idem_token_first, inline once the timeline is checked
            timeline := CASE WHEN pg_catalog.pg_is_in_recovery() THEN NULL
                             ELSE pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8) END;
            IF timeline OPERATOR(pg_catalog.=) pg_catalog.current_setting('idempotency.sql_edition_timeline', true) THEN
                tok := (COALESCE(pg_catalog.pg_sequence_last_value('@extschema@.idem_token_epoch'::pg_catalog.regclass), 0)
                        OPERATOR(pg_catalog.<<) 16) OPERATOR(pg_catalog.+) 1;
            ELSE
                tok := @extschema@.idem_sql_token_first();
            END IF;

            busy := false;
            IF wait THEN
                INSERT INTO @extschema@.idempotency_records AS r (scope, key, fingerprint, token,
                    lease_expires_at, created_at, updated_at, expires_at, purge_after, status, attempts)
                VALUES (idem_claim.scope, idem_claim.key, idem_claim.fingerprint, tok,
                        lease_at, t_now, t_now, expires, expires, 'processing', 1)
                ON CONFLICT (scope, key) DO NOTHING;
                GET DIAGNOSTICS inserted = ROW_COUNT;
            ELSIF pg_catalog.has_table_privilege('@extschema@.idempotency_records'::pg_catalog.regclass, 'INSERT')
                  AND pg_catalog.has_table_privilege('@extschema@.idempotency_records'::pg_catalog.regclass, 'SELECT')
                  AND (NOT pg_catalog.row_security_active('@extschema@.idempotency_records'::pg_catalog.regclass)
                       OR @extschema@.idem_sql_tenant_check('@extschema@.idempotency_records'::pg_catalog.regclass,
                                                            scope) OPERATOR(pg_catalog.=) 'inside') THEN
                -- the table's lock first, so that only a wait for a row of
                -- the key can run into the lock timeout
                LOCK TABLE @extschema@.idempotency_records IN ROW EXCLUSIVE MODE;
                saved_timeout := pg_catalog.current_setting('lock_timeout');
                BEGIN
                    PERFORM pg_catalog.set_config('lock_timeout', '1ms', true);
                    INSERT INTO @extschema@.idempotency_records AS r (scope, key, fingerprint, token,
                        lease_expires_at, created_at, updated_at, expires_at, purge_after, status, attempts)
                    VALUES (idem_claim.scope, idem_claim.key, idem_claim.fingerprint, tok,
                            lease_at, t_now, t_now, expires, expires, 'processing', 1)
                    ON CONFLICT (scope, key) DO NOTHING;
                    GET DIAGNOSTICS inserted = ROW_COUNT;
                    PERFORM pg_catalog.set_config('lock_timeout', saved_timeout, true);
                EXCEPTION WHEN lock_not_available THEN
                    busy := true;
                END;
            ELSE
                -- the probe would tell more than the INSERT: it waits as with wait => true
                INSERT INTO @extschema@.idempotency_records AS r (scope, key, fingerprint, token,
                    lease_expires_at, created_at, updated_at, expires_at, purge_after, status, attempts)
                VALUES (idem_claim.scope, idem_claim.key, idem_claim.fingerprint, tok,
                        lease_at, t_now, t_now, expires, expires, 'processing', 1)
                ON CONFLICT (scope, key) DO NOTHING;
                GET DIAGNOSTICS inserted = ROW_COUNT;
            END IF;
            IF busy THEN
                outcome := 'in_progress';
                EXIT;
            END IF;
            IF inserted OPERATOR(pg_catalog.=) 1 THEN
                -- a removal advanced the epoch while we inserted: move up
                later := (COALESCE(pg_catalog.pg_sequence_last_value('@extschema@.idem_token_epoch'::pg_catalog.regclass), 0)
                          OPERATOR(pg_catalog.<<) 16) OPERATOR(pg_catalog.+) 1;
                IF timeline IS DISTINCT FROM pg_catalog.current_setting('idempotency.sql_edition_timeline', true) THEN
                    later := @extschema@.idem_sql_token_first();
                END IF;
                IF later OPERATOR(pg_catalog.<>) tok THEN
                    UPDATE @extschema@.idempotency_records r SET token = later
                     WHERE r.scope OPERATOR(pg_catalog.=) idem_claim.scope
                       AND r.key OPERATOR(pg_catalog.=) idem_claim.key;
                    tok := later;
                END IF;
                RETURN ROW('new', tok, 'processing'::@extschema@.idem_status, NULL, NULL, NULL, NULL,
                           lease_at, 1, expires, NULL)::@extschema@.idem_claim_result;
            END IF;
            CONTINUE;  -- committed by someone else meanwhile
        END IF;

        -- classify (src/claim.c): what a claim at t_now makes of the record;
        -- a reuse or takeover is decided again once the row is locked
        locked := false;
        LOOP
            IF rec.status OPERATOR(pg_catalog.=) 'processing' AND rec.lease_expires_at IS NULL THEN
                outcome := 'needs_reuse';  -- released by its owner
            ELSIF rec.status OPERATOR(pg_catalog.=) ANY ('{succeeded,failed}')
                  AND NOT (rec.expires_at OPERATOR(pg_catalog.>) t_now) THEN
                outcome := 'needs_reuse';  -- finished and past its retention
            ELSE
                IF rec.fingerprint OPERATOR(pg_catalog.<>) fingerprint THEN
                    RAISE EXCEPTION 'idempotency key "%" was already used for a different request', key
                        USING ERRCODE = 'IK001',
                              DETAIL = pg_catalog.format('The request fingerprint differs from the one stored for this key in scope "%s".', scope),
                              HINT = 'Use a new idempotency key for a different request.';
                END IF;
                IF rec.status OPERATOR(pg_catalog.=) 'succeeded' THEN
                    outcome := 'replay';
                ELSIF rec.status OPERATOR(pg_catalog.=) 'processing' THEN
                    outcome := CASE WHEN rec.lease_expires_at OPERATOR(pg_catalog.>) t_now THEN 'in_progress'
                                    ELSE 'needs_takeover' END;  -- abandoned: possibly half done
                ELSIF rec.status OPERATOR(pg_catalog.=) 'failed' THEN
                    outcome := CASE WHEN rec.retryable THEN 'needs_takeover' ELSE 'replay' END;
                ELSE
                    outcome := 'unknown';
                END IF;
            END IF;
            EXIT WHEN locked OR outcome OPERATOR(pg_catalog.<>) ALL ('{needs_reuse,needs_takeover}');

            -- lock the newest version and decide again on it
            IF wait THEN
                SELECT r.scope, r.key, r.fingerprint, r.token, r.lease_expires_at, r.created_at, r.updated_at,
                       r.completed_at, r.expires_at, r.purge_after, r.status, r.attempts, r.response_code,
                       r.retryable, r.recovery_point, r.result, r.error, r.response_headers
                  INTO rec
                  FROM @extschema@.idempotency_records r
                 WHERE r.scope OPERATOR(pg_catalog.=) idem_claim.scope
                   AND r.key OPERATOR(pg_catalog.=) idem_claim.key
                   FOR NO KEY UPDATE;
            ELSE
                SELECT r.scope, r.key, r.fingerprint, r.token, r.lease_expires_at, r.created_at, r.updated_at,
                       r.completed_at, r.expires_at, r.purge_after, r.status, r.attempts, r.response_code,
                       r.retryable, r.recovery_point, r.result, r.error, r.response_headers
                  INTO rec
                  FROM @extschema@.idempotency_records r
                 WHERE r.scope OPERATOR(pg_catalog.=) idem_claim.scope
                   AND r.key OPERATOR(pg_catalog.=) idem_claim.key
                   FOR NO KEY UPDATE SKIP LOCKED;
            END IF;
            EXIT WHEN NOT FOUND;
            locked := true;
        END LOOP;
        CONTINUE WHEN outcome OPERATOR(pg_catalog.=) ANY ('{needs_reuse,needs_takeover}') AND NOT locked
                      AND (wait OR NOT EXISTS (SELECT FROM @extschema@.idempotency_records r
                                                WHERE r.scope OPERATOR(pg_catalog.=) idem_claim.scope
                                                  AND r.key OPERATOR(pg_catalog.=) idem_claim.key));
        IF outcome OPERATOR(pg_catalog.=) ANY ('{needs_reuse,needs_takeover}') AND NOT locked THEN
            -- locked by another writer: the committed version is about to be
            -- replaced, so none of it is reported
            found_row := false;
            outcome := 'in_progress';
            EXIT;
        END IF;
        IF outcome OPERATOR(pg_catalog.=) 'needs_reuse' THEN
            -- the key is never absent, so no epoch is spent: the removal
            -- trigger is told that this row's DELETE is no removal
            tok := @extschema@.idem_sql_token_next(rec.token);
            saved_reuse := @extschema@.idem_sql_removal_reuse_begin(scope, key, rec.token);
            WITH old AS (
                DELETE FROM @extschema@.idempotency_records r
                 WHERE r.scope OPERATOR(pg_catalog.=) idem_claim.scope
                   AND r.key OPERATOR(pg_catalog.=) idem_claim.key
                RETURNING r.token)
            INSERT INTO @extschema@.idempotency_records AS r (scope, key, fingerprint, token,
                lease_expires_at, created_at, updated_at, expires_at, purge_after, status, attempts)
            SELECT idem_claim.scope, idem_claim.key, idem_claim.fingerprint,
                   GREATEST(old.token OPERATOR(pg_catalog.+) 1, tok),
                   lease_at, t_now, t_now, expires, expires, 'processing', 1
              FROM old
            RETURNING r.scope, r.key, r.fingerprint, r.token, r.lease_expires_at, r.created_at, r.updated_at,
                      r.completed_at, r.expires_at, r.purge_after, r.status, r.attempts, r.response_code,
                      r.retryable, r.recovery_point, r.result, r.error, r.response_headers
              INTO rec;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'locked idempotency record vanished' USING ERRCODE = 'XX000';
            END IF;
            PERFORM @extschema@.idem_sql_removal_reuse_end(saved_reuse);
            outcome := 'new';
        ELSIF outcome OPERATOR(pg_catalog.=) 'needs_takeover' THEN
            -- created_at + retention: the claim's own, else the record's
            -- (expires_at - completed_at after a failure, - created_at before)
            IF retention IS NOT NULL THEN
                retention_us := (pg_catalog.extract(epoch FROM expires) OPERATOR(pg_catalog.-)
                                 pg_catalog.extract(epoch FROM t_now)) OPERATOR(pg_catalog.*) 1000000;
            ELSE
                retention_us := (pg_catalog.extract(epoch FROM rec.expires_at) OPERATOR(pg_catalog.-)
                                 pg_catalog.extract(epoch FROM COALESCE(rec.completed_at, rec.created_at)))
                                OPERATOR(pg_catalog.*) 1000000;
            END IF;
            expires := rec.created_at OPERATOR(pg_catalog.+)
                       ('1 microsecond'::interval OPERATOR(pg_catalog.*) retention_us::float8);
            tok := @extschema@.idem_sql_token_next(rec.token);
            UPDATE @extschema@.idempotency_records r SET
                   token = GREATEST(r.token OPERATOR(pg_catalog.+) 1, tok), lease_expires_at = lease_at,
                   updated_at = t_now, completed_at = NULL, status = 'processing',
                   attempts = r.attempts OPERATOR(pg_catalog.+) 1, response_code = NULL,
                   response_headers = NULL, retryable = false, expires_at = expires, purge_after = expires
             WHERE r.scope OPERATOR(pg_catalog.=) idem_claim.scope
               AND r.key OPERATOR(pg_catalog.=) idem_claim.key
            RETURNING r.scope, r.key, r.fingerprint, r.token, r.lease_expires_at, r.created_at, r.updated_at,
                      r.completed_at, r.expires_at, r.purge_after, r.status, r.attempts, r.response_code,
                      r.retryable, r.recovery_point, r.result, r.error, r.response_headers
              INTO rec;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'locked idempotency record vanished' USING ERRCODE = 'XX000';
            END IF;
            outcome := 'takeover';
        END IF;
        EXIT;
    END LOOP;

    IF outcome IS NULL OR outcome OPERATOR(pg_catalog.=) ANY ('{needs_reuse,needs_takeover}') THEN
        -- eight rounds, each lost to a race
        IF pg_catalog.row_security_active('@extschema@.idempotency_records'::pg_catalog.regclass) THEN
            RAISE EXCEPTION 'idempotency key "%" exists in scope "%", but row-level security hides it', key, scope
                USING ERRCODE = '42501',
                      DETAIL = 'The claim''s INSERT conflicts with a row that the policies on idempotency_records do not let this role read.',
                      HINT = 'Check idempotency.scope and the policies of idempotency_records.';
        END IF;
        RAISE EXCEPTION 'could not claim idempotency key "%" because of concurrent changes', key
            USING ERRCODE = '40001', HINT = 'Retry the transaction.';
    END IF;

    IF NOT found_row THEN
        -- an uncommitted claim of another transaction: it is processing
        RETURN ROW(outcome, NULL, 'processing'::@extschema@.idem_status, NULL, NULL, NULL, NULL,
                   NULL, NULL, NULL, NULL)::@extschema@.idem_claim_result;
    END IF;
    -- only an owner (new, takeover) learns the token
    RETURN ROW(outcome,
               CASE WHEN outcome OPERATOR(pg_catalog.=) ANY ('{new,takeover}') THEN rec.token END,
               rec.status, rec.response_code, rec.result, rec.error, rec.recovery_point,
               rec.lease_expires_at, rec.attempts, rec.expires_at,
               rec.response_headers)::@extschema@.idem_claim_result;
END
$body$;

--@ idem_lookup(text, text)
-- src/lifecycle.c: the record as stored, expired or not; no row when there
-- is none.  Read-only (a hot standby runs it).
LANGUAGE plpgsql
AS $body$
#variable_conflict use_column
BEGIN
    IF key IS NULL OR key OPERATOR(pg_catalog.=) '' OR pg_catalog.octet_length(key) OPERATOR(pg_catalog.>) 255
       OR scope IS NULL OR pg_catalog.octet_length(scope) OPERATOR(pg_catalog.>) 255
       OR pg_catalog.current_setting('idempotency.max_key_length', true) OPERATOR(pg_catalog.<>) '' THEN
        PERFORM @extschema@.idem_sql_arg_key(key, 'idempotency key');
        PERFORM @extschema@.idem_sql_arg_scope(scope);
    END IF;
    PERFORM @extschema@.idem_sql_check_record_shape();
    RETURN QUERY
    SELECT r.* FROM @extschema@.idempotency_records r
     WHERE r.scope OPERATOR(pg_catalog.=) idem_lookup.scope
       AND r.key OPERATOR(pg_catalog.=) idem_lookup.key;
END
$body$;

--@ idem_await(text, text, interval)
-- src/await.c: re-reads the record until no owner is at work on it (it
-- finished, was released, is gone, or its lease expired) or the timeout
-- passes; returns it without the fencing token.  Each read is a plain
-- statement of its own (a fresh snapshot under READ COMMITTED) and no lock
-- is held but the readers' AccessShareLock; between reads it sleeps with
-- pg_sleep, 1 ms doubling up to 100 ms (C: WaitLatch).  Under REPEATABLE
-- READ and SERIALIZABLE it reads once.  idempotency.max_waiters cannot be
-- counted without shared memory: as in C without preloading, only 0 (never
-- wait) applies.
LANGUAGE plpgsql
AS $body$
#variable_conflict use_column
DECLARE
    t_now timestamptz := pg_catalog.clock_timestamp();
    deadline timestamptz;
    sleep_ms integer := 1;
    remaining_ms float8;
    rec @extschema@.idempotency_records;
    found_row boolean;
BEGIN
    PERFORM @extschema@.idem_sql_arg_key(key, 'idempotency key');
    PERFORM @extschema@.idem_sql_arg_scope(scope);
    IF timeout IS NULL THEN
        RAISE EXCEPTION 'timeout must not be null' USING ERRCODE = '22004';
    END IF;
    -- a zero timeout is a plain read; a negative one is an error
    deadline := t_now OPERATOR(pg_catalog.+) timeout;
    IF deadline OPERATOR(pg_catalog.<) t_now THEN
        RAISE EXCEPTION 'timeout must not be negative'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('The interval given was "%s".', timeout);
    END IF;
    PERFORM @extschema@.idem_sql_check_record_shape();

    SELECT r.* INTO rec FROM @extschema@.idempotency_records r
     WHERE r.scope OPERATOR(pg_catalog.=) idem_await.scope
       AND r.key OPERATOR(pg_catalog.=) idem_await.key;
    found_row := FOUND;
    IF found_row AND rec.status OPERATOR(pg_catalog.=) 'processing'
       AND rec.lease_expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()
       AND pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed'
       AND deadline OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()
       AND @extschema@.idem_sql_setting_int('idempotency.max_waiters', 4, 0, 2147483647, '') OPERATOR(pg_catalog.<>) 0 THEN
        LOOP
            remaining_ms := pg_catalog.extract(epoch FROM deadline OPERATOR(pg_catalog.-) pg_catalog.clock_timestamp())
                            OPERATOR(pg_catalog.*) 1000;
            EXIT WHEN remaining_ms OPERATOR(pg_catalog.<=) 0;
            PERFORM pg_catalog.pg_sleep(LEAST(sleep_ms::float8, remaining_ms) OPERATOR(pg_catalog./) 1000);
            sleep_ms := LEAST(sleep_ms OPERATOR(pg_catalog.*) 2, 100);
            SELECT r.* INTO rec FROM @extschema@.idempotency_records r
             WHERE r.scope OPERATOR(pg_catalog.=) idem_await.scope
               AND r.key OPERATOR(pg_catalog.=) idem_await.key;
            found_row := FOUND;
            EXIT WHEN NOT (found_row AND rec.status OPERATOR(pg_catalog.=) 'processing'
                           AND rec.lease_expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp());
        END LOOP;
    END IF;
    IF found_row THEN
        -- a waiter is no owner: it does not learn the fencing token
        rec.token := NULL;
        RETURN NEXT rec;
    END IF;
END
$body$;
