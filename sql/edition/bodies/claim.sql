-- The claim core of the SQL edition: idem_claim (src/claim.c and the
-- statements of src/record_store.c it runs), idem_lookup (src/lifecycle.c)
-- and idem_await (src/await.c).  Shared helpers: 00_internal.sql.

--@ idem_claim(text, bytea, interval, text, interval, boolean)
-- src/claim.c.  Reads the record first (a replay is one index probe and
-- writes nothing); writes only when the key must change hands: no row, an
-- INSERT ... ON CONFLICT DO NOTHING; a row to take over or reuse, locked with
-- SELECT ... FOR NO KEY UPDATE (SKIP LOCKED with wait => false) and decided
-- again on its newest version.
--
-- Speed: PL/pgSQL sets up each expression it evaluates once per
-- transaction, and the executor each expression of a statement at each
-- run, and each function or operator in them costs a look-up and a
-- privilege check: the hot paths (a replay, a new key) evaluate few
-- expressions with few calls in them, and PERFORM (a query) is kept for
-- the rare paths.
--
-- Locks (C: record_store.c, read_lock): a role that may insert takes
-- RowExclusiveLock on the table before its first read.  A read under
-- AccessShareLock that asks for RowExclusiveLock next deadlocks with
-- REINDEX TABLE, which holds ShareLock on the table while it waits for the
-- index the read holds (test/t/010_maintenance.pl).
--
-- wait => false and a new key (C: a dirty probe of the primary key): a
-- claim that inserts a key holds a shared advisory lock on the key's hash
-- to the end of its transaction (at most 16 keys a transaction, so that a
-- bulk claim does not fill the lock table); a claim with wait => false
-- tries the lock exclusively and answers in_progress when it is held.  A
-- key inserted otherwise (beyond the 16, a plain INSERT) is found by the
-- INSERT itself, run in a subtransaction under lock_timeout once the locks
-- of the table and of its indexes are taken: 55P03 is in_progress.  The
-- INSERT can also wait briefly for a relation extension lock, which is no
-- claim of the key: where the advisory lock was free (no claim inserts the
-- key) the timeout is 100ms, so that only a plain INSERT of the key can
-- make the claim wait that long; beyond the 16, 1ms.
LANGUAGE plpgsql
AS $body$
#variable_conflict use_column
DECLARE
    res @extschema@.idem_claim_result;
    t_now timestamptz := pg_catalog.clock_timestamp();
    quick boolean;
    fast_found boolean;
    lease_at timestamptz;
    expires timestamptz;
    rec record;
    found_row boolean;
    outcome text;
    tok bigint;
    inline_token boolean;
    later bigint;
    inserted integer;
    busy boolean;
    probe boolean;
    dummy text;
    saved_timeout text;
    saved_reuse text;
    probe_timeout text;
    retention_us numeric;
    locked boolean;
BEGIN
    -- Every argument valid at a glance, no setting to read, no row-level
    -- security, the table's own columns (attribute 19 does not exist)?
    -- Then the common answers (replay, in_progress, unknown) come from one
    -- statement, and a new key needs no more checks.  Anything else takes
    -- the long way, which checks each argument as validation.c does.
    quick := COALESCE(CASE WHEN pg_catalog.octet_length(key) OPERATOR(pg_catalog.<@) '[1,255]'::pg_catalog.int4range
                      AND pg_catalog.length(fingerprint) OPERATOR(pg_catalog.<@) '[1,64]'::pg_catalog.int4range
                      AND pg_catalog.octet_length(scope) OPERATOR(pg_catalog.<=) 255
                      AND wait IS NOT NULL
                      AND pg_catalog.concat(pg_catalog.current_setting('idempotency.max_key_length', true),
                              CASE WHEN lease IS NULL THEN pg_catalog.current_setting('idempotency.default_lease', true) END,
                              CASE WHEN retention IS NULL THEN pg_catalog.current_setting('idempotency.retention', true) END)
                          OPERATOR(pg_catalog.=) ''
                      AND NOT pg_catalog.row_security_active('@extschema@.idempotency_records'::pg_catalog.regclass)
                      AND pg_catalog.has_column_privilege('@extschema@.idempotency_records'::pg_catalog.regclass,
                                                          19::pg_catalog.int2, 'SELECT') IS NULL
                 -- positive, finite intervals (once the others are valid: an
                 -- overflow is then the error validation.c raises first; an
                 -- interval may be infinite from PostgreSQL 17 on)
                 THEN (lease IS NULL OR ((t_now OPERATOR(pg_catalog.+) lease) OPERATOR(pg_catalog.>) t_now
                                         AND pg_catalog.isfinite(lease)))
                      AND (retention IS NULL OR ((t_now OPERATOR(pg_catalog.+) retention) OPERATOR(pg_catalog.>) t_now
                                                 AND pg_catalog.isfinite(retention))) END,
                      false);
    IF pg_catalog.has_table_privilege('@extschema@.idempotency_records'::pg_catalog.regclass, 'INSERT') THEN
        LOCK TABLE @extschema@.idempotency_records IN ROW EXCLUSIVE MODE;
    END IF;
    SELECT CASE WHEN NOT quick OR r.fingerprint OPERATOR(pg_catalog.<>) idem_claim.fingerprint THEN NULL
                ELSE CASE r.status
                     WHEN 'succeeded' THEN CASE WHEN r.expires_at OPERATOR(pg_catalog.>) t_now THEN 'replay' END
                     WHEN 'failed' THEN CASE WHEN r.expires_at OPERATOR(pg_catalog.>) t_now AND NOT r.retryable
                                             THEN 'replay' END
                     WHEN 'processing' THEN CASE WHEN r.lease_expires_at OPERATOR(pg_catalog.>) t_now
                                                 THEN 'in_progress' END
                     ELSE 'unknown' END END,
           NULL, r.status, r.response_code, r.result, r.error, r.recovery_point, r.lease_expires_at,
           r.attempts, r.expires_at, r.response_headers
      INTO res
      FROM @extschema@.idempotency_records r
     WHERE r.scope OPERATOR(pg_catalog.=) idem_claim.scope
       AND r.key OPERATOR(pg_catalog.=) idem_claim.key;
    IF res.outcome IS NOT NULL THEN
        RETURN res;
    END IF;
    fast_found := FOUND;

    IF quick THEN
        lease_at := t_now OPERATOR(pg_catalog.+) COALESCE(lease, '30 s'::interval);
        expires := t_now OPERATOR(pg_catalog.+) COALESCE(retention, '86400 s'::interval);
    ELSE
        -- the arguments, in validation.c's order: key, fingerprint, scope,
        -- lease, retention, wait
        PERFORM @extschema@.idem_sql_arg_key(key, 'idempotency key');
        PERFORM @extschema@.idem_sql_arg_fingerprint(fingerprint);
        PERFORM @extschema@.idem_sql_arg_scope(scope);
        -- lease: given, or idempotency.default_lease (ms, default 30 s)
        IF lease IS NULL THEN
            lease_at := t_now OPERATOR(pg_catalog.+) ('1 ms'::interval OPERATOR(pg_catalog.*)
                @extschema@.idem_sql_setting_int('idempotency.default_lease', 30000, 1, 2147483647, 'ms'));
        ELSE
            lease_at := @extschema@.idem_sql_add_interval(t_now, lease, 'lease');
        END IF;
        -- retention: given, or idempotency.retention (s, default 1 day)
        expires := @extschema@.idem_sql_retention_expiry(retention, t_now);
        IF wait IS NULL THEN
            RAISE EXCEPTION 'wait must not be null' USING ERRCODE = '22004';
        END IF;
        -- under tenant isolation, a scope outside the session's tenant could
        -- only fail the INSERT's policy check, after a read that finds nothing
        IF pg_catalog.row_security_active('@extschema@.idempotency_records'::pg_catalog.regclass) THEN
            PERFORM @extschema@.idem_sql_require_tenant('@extschema@.idempotency_records'::pg_catalog.regclass,
                                                        scope, 'claim');
        -- the direct read of record_store.c (table-level SELECT, no row-level
        -- security) refuses a table with added columns; has_column_privilege
        -- is NULL for an attribute that does not exist (18: the install's)
        ELSIF pg_catalog.has_column_privilege('@extschema@.idempotency_records'::pg_catalog.regclass, 19::int2, 'SELECT') IS NOT NULL
              AND pg_catalog.has_table_privilege('@extschema@.idempotency_records'::pg_catalog.regclass, 'SELECT') THEN
            PERFORM @extschema@.idem_sql_check_record_shape();
        END IF;
        fast_found := true;  -- the read above is not the one to decide on
    END IF;

    FOR round IN 1 .. 8 LOOP
        outcome := NULL;
        IF fast_found OR round OPERATOR(pg_catalog.>) 1 THEN
            SELECT r.scope, r.key, r.fingerprint, r.token, r.lease_expires_at, r.created_at, r.updated_at,
                   r.completed_at, r.expires_at, r.purge_after, r.status, r.attempts, r.response_code,
                   r.retryable, r.recovery_point, r.result, r.error, r.response_headers
              INTO rec
              FROM @extschema@.idempotency_records r
             WHERE r.scope OPERATOR(pg_catalog.=) idem_claim.scope
               AND r.key OPERATOR(pg_catalog.=) idem_claim.key;
            found_row := FOUND;
        ELSE
            found_row := false;  -- the first read found no row
        END IF;

        IF NOT found_row THEN
            -- tokens.c's idem_token_first, inline once this session has
            -- checked its timeline (00_internal.sql: a session that has,
            -- on a primary, stays on that timeline)
            tok := CASE WHEN pg_catalog.current_setting('idempotency.sql_edition_timeline', true) OPERATOR(pg_catalog.<>) ''
                        THEN (COALESCE(pg_catalog.pg_sequence_last_value('@extschema@.idem_token_epoch'::pg_catalog.regclass), 0)
                              OPERATOR(pg_catalog.<<) 16) OPERATOR(pg_catalog.+) 1 END;
            inline_token := tok IS NOT NULL;
            IF NOT inline_token THEN
                tok := @extschema@.idem_sql_token_first();
            END IF;

            busy := false;
            IF wait THEN
                -- say that this transaction inserts the key (see above); the
                -- setting counts the keys in x's
                dummy := CASE WHEN pg_catalog.octet_length(COALESCE(
                                       pg_catalog.current_setting('idempotency.sql_edition_claims', true), ''))
                                   OPERATOR(pg_catalog.<) 16
                              THEN pg_catalog.concat(
                                  pg_catalog.pg_advisory_xact_lock_shared(
                                      pg_catalog.hashtextextended(key, pg_catalog.hashtextextended(scope, 7459))),
                                  pg_catalog.set_config('idempotency.sql_edition_claims',
                                      COALESCE(pg_catalog.current_setting('idempotency.sql_edition_claims', true), '')
                                      OPERATOR(pg_catalog.||) 'x', true)) END;
                INSERT INTO @extschema@.idempotency_records (scope, key, fingerprint, token,
                    lease_expires_at, created_at, updated_at, expires_at, purge_after, status, attempts)
                VALUES (idem_claim.scope, idem_claim.key, idem_claim.fingerprint, tok,
                        lease_at, t_now, t_now, expires, expires, 'processing', 1)
                ON CONFLICT (scope, key) DO NOTHING;
                GET DIAGNOSTICS inserted = ROW_COUNT;
            ELSE
                -- may this role learn of another transaction's uncommitted
                -- row of the key?  Only where its INSERT would wait for that
                -- row (record_store.c, idem_store_insert_in_progress)
                probe := pg_catalog.has_table_privilege('@extschema@.idempotency_records'::pg_catalog.regclass, 'INSERT')
                    AND pg_catalog.has_table_privilege('@extschema@.idempotency_records'::pg_catalog.regclass, 'SELECT')
                    AND (NOT pg_catalog.row_security_active('@extschema@.idempotency_records'::pg_catalog.regclass)
                         OR @extschema@.idem_sql_tenant_check('@extschema@.idempotency_records'::pg_catalog.regclass,
                                                              scope) OPERATOR(pg_catalog.=) 'inside');
                probe_timeout := '1ms';
                IF pg_catalog.octet_length(COALESCE(pg_catalog.current_setting('idempotency.sql_edition_claims', true), ''))
                   OPERATOR(pg_catalog.<) 16 THEN
                    IF probe THEN
                        busy := NOT pg_catalog.pg_try_advisory_xact_lock(
                            pg_catalog.hashtextextended(key, pg_catalog.hashtextextended(scope, 7459)));
                        probe_timeout := '100ms';
                    ELSE
                        PERFORM pg_catalog.pg_advisory_xact_lock_shared(
                            pg_catalog.hashtextextended(key, pg_catalog.hashtextextended(scope, 7459)));
                    END IF;
                    PERFORM pg_catalog.set_config('idempotency.sql_edition_claims',
                        COALESCE(pg_catalog.current_setting('idempotency.sql_edition_claims', true), '')
                        OPERATOR(pg_catalog.||) 'x', true);
                END IF;
                IF busy THEN
                    NULL;
                ELSIF probe THEN
                    -- the indexes' locks first (the table's is held), so that
                    -- only a wait for a row of the key can run into the lock
                    -- timeout, not one behind REINDEX or pg_repack: planning
                    -- an INSERT ... ON CONFLICT locks every index of its table
                    -- (a cached plan of the INSERT below would lock them only
                    -- as it inserts)
                    EXECUTE 'INSERT INTO @extschema@.idempotency_records (scope, key) SELECT NULL, NULL WHERE false
                             ON CONFLICT (scope, key) DO NOTHING';
                    saved_timeout := pg_catalog.current_setting('lock_timeout');
                    BEGIN
                        PERFORM pg_catalog.set_config('lock_timeout', probe_timeout, true);
                        INSERT INTO @extschema@.idempotency_records (scope, key, fingerprint, token,
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
                    -- a role the probe would tell more than its INSERT: the
                    -- INSERT waits for another transaction's row
                    INSERT INTO @extschema@.idempotency_records (scope, key, fingerprint, token,
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
            END IF;
            IF inserted OPERATOR(pg_catalog.=) 1 THEN
                -- a removal advanced the epoch while we inserted: move up
                later := CASE WHEN inline_token
                              THEN (COALESCE(pg_catalog.pg_sequence_last_value('@extschema@.idem_token_epoch'::pg_catalog.regclass), 0)
                                    OPERATOR(pg_catalog.<<) 16) OPERATOR(pg_catalog.+) 1 END;
                IF later IS NULL OR later OPERATOR(pg_catalog.<>) tok THEN
                    IF later IS NULL THEN
                        later := @extschema@.idem_sql_token_first();
                    END IF;
                    IF later OPERATOR(pg_catalog.<>) tok THEN
                        UPDATE @extschema@.idempotency_records r SET token = later
                         WHERE r.scope OPERATOR(pg_catalog.=) idem_claim.scope
                           AND r.key OPERATOR(pg_catalog.=) idem_claim.key;
                        tok := later;
                    END IF;
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
        EXIT WHEN outcome OPERATOR(pg_catalog.<>) ALL ('{needs_reuse,needs_takeover}');
        IF NOT locked THEN
            -- locked by another writer, or deleted meanwhile.  The committed
            -- version is about to be replaced, so none of it is reported
            IF NOT wait AND EXISTS (SELECT FROM @extschema@.idempotency_records r
                                     WHERE r.scope OPERATOR(pg_catalog.=) idem_claim.scope
                                       AND r.key OPERATOR(pg_catalog.=) idem_claim.key) THEN
                found_row := false;
                outcome := 'in_progress';
                EXIT;
            END IF;
            CONTINUE;
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
                retention_us := (pg_catalog.extract('epoch', expires) OPERATOR(pg_catalog.-)
                                 pg_catalog.extract('epoch', t_now)) OPERATOR(pg_catalog.*) 1000000;
            ELSE
                retention_us := (pg_catalog.extract('epoch', rec.expires_at) OPERATOR(pg_catalog.-)
                                 pg_catalog.extract('epoch', COALESCE(rec.completed_at, rec.created_at)))
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
    IF pg_catalog.has_column_privilege('@extschema@.idempotency_records'::pg_catalog.regclass, 19::int2, 'SELECT') IS NOT NULL THEN
        PERFORM @extschema@.idem_sql_check_record_shape();
    END IF;
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
-- READ and SERIALIZABLE it reads once.  idempotency.max_waiters (4) waiters
-- per database: each holds one of the advisory locks (7460, 1..max_waiters),
-- taken in a subtransaction that is rolled back when the wait ends, so the
-- place is given back at once, on an error or a cancel too; one more reads
-- once and returns the processing record, as in C.
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
    max_waiters integer;
    slot integer;
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
    IF pg_catalog.has_column_privilege('@extschema@.idempotency_records'::pg_catalog.regclass, 19::int2, 'SELECT') IS NOT NULL THEN
        PERFORM @extschema@.idem_sql_check_record_shape();
    END IF;

    SELECT r.* INTO rec FROM @extschema@.idempotency_records r
     WHERE r.scope OPERATOR(pg_catalog.=) idem_await.scope
       AND r.key OPERATOR(pg_catalog.=) idem_await.key;
    found_row := FOUND;
    IF found_row AND rec.status OPERATOR(pg_catalog.=) 'processing'
       AND rec.lease_expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()
       AND pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed'
       AND deadline OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp() THEN
        max_waiters := @extschema@.idem_sql_setting_int('idempotency.max_waiters', 4, 0, 2147483647, '');
        BEGIN
            FOR i IN 1 .. max_waiters LOOP
                IF pg_catalog.pg_try_advisory_xact_lock(7460, i) THEN
                    slot := i;
                    EXIT;
                END IF;
            END LOOP;
            LOOP
                EXIT WHEN slot IS NULL;     -- no place: the record as it is
                remaining_ms := pg_catalog.extract('epoch', deadline OPERATOR(pg_catalog.-) pg_catalog.clock_timestamp())
                                OPERATOR(pg_catalog.*) 1000;
                EXIT WHEN remaining_ms OPERATOR(pg_catalog.<=) 0;
                PERFORM pg_catalog.pg_sleep(LEAST(sleep_ms::float8, remaining_ms) OPERATOR(pg_catalog./) 1000);
                sleep_ms := LEAST(sleep_ms OPERATOR(pg_catalog.*) 2, 100);
                SELECT r.* INTO rec FROM @extschema@.idempotency_records r
                 WHERE r.scope OPERATOR(pg_catalog.=) idem_await.scope
                   AND r.key OPERATOR(pg_catalog.=) idem_await.key;
                found_row := FOUND;
                -- an owner still at work? (a released record has no lease)
                EXIT WHEN NOT COALESCE(found_row AND rec.status OPERATOR(pg_catalog.=) 'processing'
                                       AND rec.lease_expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp(), false);
            END LOOP;
            -- the rollback of this subtransaction gives the place back
            RAISE EXCEPTION USING ERRCODE = 'P0004';
        EXCEPTION WHEN assert_failure THEN
            NULL;
        END;
    END IF;
    IF found_row THEN
        -- a waiter is no owner: it does not learn the fencing token
        rec.token := NULL;
        RETURN NEXT rec;
    END IF;
END
$body$;
