-- Maintenance, tenants and the rest, in the SQL edition (generate.py says how
-- this file is read): the epoch triggers on the records (src/removal.c),
-- idem_purge (src/purge.c), idem_role_tenants and idem_refuse_stale_snapshot
-- (src/tenants.c), idem_stats and idem_stats_reset (src/stats.c) and
-- idem_version (src/version.c).

--@ internal

/*
 * The tenants of role "member" (idem_role_tenants, below, passes current_user).
 * idem_tenant_members is the owner's and PUBLIC may not read it, so this
 * reads it as the owner (SECURITY DEFINER); a role may learn only its own
 * tenants, so it answers only for a role that the session's user could
 * become (SET ROLE) anyway: itself or a role it is a member of (every role for
 * a superuser).  For any other role it answers no tenant, as for a role
 * without any: whoever calls it directly with a role not theirs learns
 * nothing.  By the primary key, in its order: the role's tenants sorted.
 */
CREATE FUNCTION @extschema@.idem_sql_maint_role_tenants(member pg_catalog.name)
RETURNS pg_catalog.text[]
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $body$
DECLARE
    role_oid pg_catalog.oid;
BEGIN
    IF member IS NULL OR NOT pg_catalog.pg_has_role(SESSION_USER, member, 'MEMBER') THEN
        RETURN '{}';
    END IF;
    role_oid := pg_catalog.quote_ident(member)::pg_catalog.regrole;
    RETURN ARRAY(SELECT m.tenant FROM @extschema@.idem_tenant_members m
                 WHERE m.role::pg_catalog.oid OPERATOR(pg_catalog.=) role_oid
                 ORDER BY m.tenant);
END
$body$;

/*
 * The error of the epoch triggers when a column of the records they read by
 * name is missing (renamed): src/removal.c, record_column.
 */
CREATE FUNCTION @extschema@.idem_sql_maint_no_column(name text, type text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $body$
BEGIN
    RAISE EXCEPTION 'table "idempotency_records" has no column "%" of type %', name, type
        USING ERRCODE = '55000',
              DETAIL = 'The triggers that keep fencing tokens from repeating read it by name.',
              HINT = 'Give the column back its name and type.';
END
$body$;

/*
 * Whether a row of "source" that this transaction's snapshot sees was
 * deleted or updated by a transaction that committed and that the snapshot
 * does not see (idem_refuse_stale_snapshot): its xmax, widened to a full
 * transaction id around this transaction's own (the rows are read by
 * statements of a transaction that changed the table, so it has one).  An
 * xmax of a multixact or out of reach is not counted; one of a row locker
 * that committed since counts, which at worst asks for a retry.
 */
CREATE FUNCTION @extschema@.idem_sql_maint_rows_changed(source pg_catalog.regclass)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $body$
DECLARE
    snap constant pg_catalog.pg_snapshot := pg_catalog.pg_current_snapshot();
    mine constant pg_catalog.int8 := pg_catalog.pg_current_xact_id()::text::pg_catalog.int8;
    x pg_catalog.int8;
    full_xid pg_catalog.int8;
BEGIN
    FOR x IN EXECUTE pg_catalog.format(
        'SELECT DISTINCT xmax::text::pg_catalog.int8 FROM %s WHERE xmax::text OPERATOR(pg_catalog.<>) ''0''', source)
    LOOP
        full_xid := (mine OPERATOR(pg_catalog.&) (-4294967296)::pg_catalog.int8) OPERATOR(pg_catalog.|) x;
        IF full_xid OPERATOR(pg_catalog.>) (mine OPERATOR(pg_catalog.+) 2147483648) THEN
            full_xid := full_xid OPERATOR(pg_catalog.-) 4294967296;
        ELSIF full_xid OPERATOR(pg_catalog.<) (mine OPERATOR(pg_catalog.-) 2147483648) THEN
            full_xid := full_xid OPERATOR(pg_catalog.+) 4294967296;
        END IF;
        CONTINUE WHEN full_xid OPERATOR(pg_catalog.<) 3;
        BEGIN
            IF NOT pg_catalog.pg_visible_in_snapshot(full_xid::text::pg_catalog.xid8, snap)
               AND pg_catalog.pg_xact_status(full_xid::text::pg_catalog.xid8) OPERATOR(pg_catalog.=) 'committed' THEN
                RETURN true;
            END IF;
        EXCEPTION WHEN invalid_parameter_value THEN
            NULL;   -- a transaction id in the future: a multixact's
        END;
    END LOOP;
    RETURN false;
END
$body$;

--@ idem_records_removed()
-- BEFORE DELETE FOR EACH ROW, ENABLE ALWAYS (src/removal.c): a deleted
-- record of the current epoch (or later) advances the epoch, so that the
-- key's next claim gets tokens above it; a row of an older epoch needs
-- nothing, so a statement spends at most one epoch however many rows it
-- deletes, and a purge (which advanced the epoch first) none.  The epoch is
-- read at each row (the C edition keeps it for the statement: the same
-- answer).  The deletion spends the epoch as part of what the role is
-- allowed (DELETE on the records), not as a right of its own: the epoch is
-- read and advanced as the sequence's owner (00_internal.sql's
-- idem_sql_token_epoch_now and _advance, SECURITY DEFINER), so a role may
-- delete records with nothing on the sequence, and the trigger itself runs
-- as the deleting role.  Nobody may execute the function (REVOKE in the
-- chain), so it runs only as this trigger.
--
-- idem_claim's reuse of a record (a DELETE and INSERT of the key in one
-- statement, the token growing by one) is no removal: the claim announces
-- it in a transaction-local setting (00_internal.sql), and the trigger lets
-- exactly that row be, once.  An error undoes the setting with its
-- (sub)transaction, so a reuse that fails leaves no exemption behind.
LANGUAGE plpgsql
AS $body$
DECLARE
    token pg_catalog.int8;
    announced text;
    epoch_seq pg_catalog.regclass;
    epoch pg_catalog.int8;
BEGIN
    IF TG_WHEN OPERATOR(pg_catalog.<>) 'BEFORE' OR TG_LEVEL OPERATOR(pg_catalog.<>) 'ROW'
       OR TG_OP OPERATOR(pg_catalog.<>) 'DELETE' THEN
        RAISE EXCEPTION 'idem_records_removed() must be called as a BEFORE DELETE FOR EACH ROW trigger'
            USING ERRCODE = '39P01';
    END IF;
    IF TG_RELID OPERATOR(pg_catalog.<>) '@extschema@.idempotency_records'::pg_catalog.regclass THEN
        RAISE EXCEPTION 'idem_records_removed() may only be a trigger of table idempotency_records'
            USING ERRCODE = '39P01', DETAIL = pg_catalog.format('It fired on table "%s".', TG_TABLE_NAME);
    END IF;
    BEGIN
        token := OLD.token;
    EXCEPTION WHEN undefined_column THEN
        PERFORM @extschema@.idem_sql_maint_no_column('token', 'bigint');
    END;
    IF token IS NULL THEN
        RETURN OLD;     -- NOT NULL: only a hand-made table
    END IF;
    -- idem_claim's reuse of this very row is no removal (00_internal.sql,
    -- idem_sql_removal_reuse_take); the setting is read first, so that a
    -- plain DELETE pays no call for it
    announced := pg_catalog.current_setting('idempotency.sql_edition_reuse', true);
    IF announced IS NOT NULL AND announced OPERATOR(pg_catalog.<>) ''
       AND @extschema@.idem_sql_removal_reuse_take(OLD.scope, OLD.key, token) THEN
        RETURN OLD;     -- idem_claim puts it back, token + 1; once
    END IF;
    -- the epoch of the token (shift 16: the SQL edition starts at 0.3.0),
    -- against the epoch now: read directly where the role may (PUBLIC may
    -- read the sequence, unless a DBA revoked it), else as the sequence's
    -- owner, which costs a SECURITY DEFINER call per row
    epoch_seq := '@extschema@.idem_token_epoch'::pg_catalog.regclass;
    IF pg_catalog.has_sequence_privilege(epoch_seq, 'SELECT, USAGE') THEN
        epoch := coalesce(pg_catalog.pg_sequence_last_value(epoch_seq), 0);
    ELSE
        epoch := @extschema@.idem_sql_token_epoch_now();
    END IF;
    IF (token OPERATOR(pg_catalog.>>) 16) OPERATOR(pg_catalog.>=) epoch THEN
        PERFORM @extschema@.idem_sql_token_epoch_advance();
    END IF;
    RETURN OLD;
END
$body$;

--@ idem_records_truncated()
-- AFTER TRUNCATE FOR EACH STATEMENT, ENABLE ALWAYS: a TRUNCATE of the
-- records advances the epoch, as the sequence's owner (a role with TRUNCATE
-- and nothing on the sequence may truncate).
LANGUAGE plpgsql
AS $body$
BEGIN
    IF TG_WHEN OPERATOR(pg_catalog.<>) 'AFTER' OR TG_LEVEL OPERATOR(pg_catalog.<>) 'STATEMENT'
       OR TG_OP OPERATOR(pg_catalog.<>) 'TRUNCATE' THEN
        RAISE EXCEPTION 'idem_records_truncated() must be called as an AFTER TRUNCATE trigger'
            USING ERRCODE = '39P01';
    END IF;
    IF TG_RELID OPERATOR(pg_catalog.<>) '@extschema@.idempotency_records'::pg_catalog.regclass THEN
        RAISE EXCEPTION 'idem_records_truncated() may only be a trigger of table idempotency_records'
            USING ERRCODE = '39P01', DETAIL = pg_catalog.format('It fired on table "%s".', TG_TABLE_NAME);
    END IF;
    PERFORM @extschema@.idem_sql_token_epoch_advance();
    RETURN NULL;
END
$body$;

--@ idem_records_rekeyed()
-- BEFORE UPDATE OF scope, key FOR EACH ROW, ENABLE ALWAYS: refuses an UPDATE
-- that moves a record to another scope or key (src/removal.c says why).
LANGUAGE plpgsql
AS $body$
DECLARE
    old_scope text;
    old_key text;
    new_scope text;
    new_key text;
BEGIN
    IF TG_WHEN OPERATOR(pg_catalog.<>) 'BEFORE' OR TG_LEVEL OPERATOR(pg_catalog.<>) 'ROW'
       OR TG_OP OPERATOR(pg_catalog.<>) 'UPDATE' THEN
        RAISE EXCEPTION 'idem_records_rekeyed() must be called as a BEFORE UPDATE FOR EACH ROW trigger'
            USING ERRCODE = '39P01';
    END IF;
    IF TG_RELID OPERATOR(pg_catalog.<>) '@extschema@.idempotency_records'::pg_catalog.regclass THEN
        RAISE EXCEPTION 'idem_records_rekeyed() may only be a trigger of table idempotency_records'
            USING ERRCODE = '39P01', DETAIL = pg_catalog.format('It fired on table "%s".', TG_TABLE_NAME);
    END IF;
    BEGIN
        old_scope := OLD.scope;
    EXCEPTION WHEN undefined_column THEN
        PERFORM @extschema@.idem_sql_maint_no_column('scope', 'text');
    END;
    BEGIN
        old_key := OLD.key;
    EXCEPTION WHEN undefined_column THEN
        PERFORM @extschema@.idem_sql_maint_no_column('key', 'text');
    END;
    new_scope := NEW.scope;
    new_key := NEW.key;
    -- NULL: the columns' NOT NULL constraints refuse it after this
    IF old_scope IS NULL OR old_key IS NULL OR new_scope IS NULL OR new_key IS NULL
       OR (new_scope OPERATOR(pg_catalog.=) old_scope COLLATE "C"
           AND new_key OPERATOR(pg_catalog.=) old_key COLLATE "C") THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'cannot change the scope or key of an idempotency record'
        USING ERRCODE = '0A000',
              DETAIL = pg_catalog.format('Key "%s" in scope "%s" would become key "%s" in scope "%s".',
                                         old_key, old_scope, new_key, new_scope),
              HINT = 'Fencing tokens of a key must never repeat: delete the record and claim the new key instead.';
END
$body$;

--@ idem_purge(integer, integer)
-- src/purge.c: each table purged in batches of at most batch_size expired
-- rows, locked FOR UPDATE SKIP LOCKED (a purge never waits for a claim or an
-- accept that holds a row), at most max_batches batches per table.  A batch
-- that deletes records first advances the token epoch.  The SQL edition
-- keeps no counters (idem_stats).  Its statements are planned with
-- sequential scans discouraged, as the C edition's are (record_store.c,
-- idem_execute_without_seqscan): a plan made while the table was nearly
-- empty would scan it whole once it has grown; the batches find their rows
-- through the indexes on purge_after and expires_at.  enable_seqscan is set
-- for the transaction and put back at the end (not a SET clause: the
-- functions set search_path only); an error takes the setting back with its
-- (sub)transaction.
LANGUAGE plpgsql
AS $body$
DECLARE
    purged pg_catalog.int8 := 0;
    deleted pg_catalog.int8;
    batches pg_catalog.int4;
    now_ts pg_catalog.timestamptz;
    retention pg_catalog.interval;
    saved_enable_seqscan text;
BEGIN
    IF batch_size IS NULL THEN
        RAISE EXCEPTION 'batch_size must not be null' USING ERRCODE = '22004';
    END IF;
    IF batch_size OPERATOR(pg_catalog.<=) 0 THEN
        RAISE EXCEPTION 'batch_size must be positive'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('The value given was %s.', batch_size);
    END IF;
    IF max_batches OPERATOR(pg_catalog.<=) 0 THEN
        RAISE EXCEPTION 'max_batches must be positive'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('The value given was %s.', max_batches);
    END IF;

    saved_enable_seqscan := pg_catalog.current_setting('enable_seqscan');
    PERFORM pg_catalog.set_config('enable_seqscan', 'off', true);

    -- finished records: the epoch's nextval before a batch that deletes any
    batches := 0;
    LOOP
        EXIT WHEN batches OPERATOR(pg_catalog.>=) max_batches;
        -- its nextval at the limit would say less
        PERFORM @extschema@.idem_sql_token_epoch_require_room(@extschema@.idem_sql_token_epoch_now(), 1);
        now_ts := pg_catalog.clock_timestamp();
        WITH doomed AS (
            SELECT r.ctid FROM @extschema@.idempotency_records r
             WHERE r.purge_after OPERATOR(pg_catalog.<=) now_ts
               AND r.expires_at OPERATOR(pg_catalog.<=) now_ts
               AND (r.status OPERATOR(pg_catalog.=) ANY ('{succeeded,failed}')
                    OR (r.status OPERATOR(pg_catalog.=) 'processing' AND r.lease_expires_at IS NULL))
             LIMIT batch_size FOR UPDATE SKIP LOCKED),
        epoch AS (
            SELECT pg_catalog.nextval('@extschema@.idem_token_epoch'::pg_catalog.regclass)
              FROM (SELECT FROM doomed LIMIT 1) any_doomed)
        DELETE FROM @extschema@.idempotency_records
         WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT d.ctid FROM doomed d))
           AND EXISTS (SELECT FROM epoch);
        GET DIAGNOSTICS deleted = ROW_COUNT;
        purged := purged OPERATOR(pg_catalog.+) deleted;
        batches := batches OPERATOR(pg_catalog.+) 1;
        EXIT WHEN deleted OPERATOR(pg_catalog.<) batch_size;
    END LOOP;

    -- expired inbox messages (never the watermarks)
    batches := 0;
    LOOP
        EXIT WHEN batches OPERATOR(pg_catalog.>=) max_batches;
        now_ts := pg_catalog.clock_timestamp();
        DELETE FROM @extschema@.idem_inbox
         WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY(
               SELECT i.ctid FROM @extschema@.idem_inbox i
                WHERE i.expires_at OPERATOR(pg_catalog.<=) now_ts
                LIMIT batch_size FOR UPDATE SKIP LOCKED));
        GET DIAGNOSTICS deleted = ROW_COUNT;
        purged := purged OPERATOR(pg_catalog.+) deleted;
        batches := batches OPERATOR(pg_catalog.+) 1;
        EXIT WHEN deleted OPERATOR(pg_catalog.<) batch_size;
    END LOOP;

    -- published outbox messages, retention counted from publication; a role
    -- that may not delete from the outbox purges the rest
    IF NOT pg_catalog.has_table_privilege('@extschema@.idem_outbox', 'DELETE') THEN
        PERFORM pg_catalog.set_config('enable_seqscan', saved_enable_seqscan, true);
        RETURN purged;
    END IF;
    retention := pg_catalog.make_interval(secs => @extschema@.idem_sql_setting_int(
        'idempotency.outbox_retention', 86400, 1, 2147483647, 's'));
    batches := 0;
    LOOP
        EXIT WHEN batches OPERATOR(pg_catalog.>=) max_batches;
        now_ts := pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) retention;
        DELETE FROM @extschema@.idem_outbox
         WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY(
               SELECT o.ctid FROM @extschema@.idem_outbox o
                WHERE o.created_at OPERATOR(pg_catalog.<=) now_ts
                  AND o.status OPERATOR(pg_catalog.=) 'published'
                  AND o.updated_at OPERATOR(pg_catalog.<=) now_ts
                LIMIT batch_size FOR UPDATE SKIP LOCKED));
        GET DIAGNOSTICS deleted = ROW_COUNT;
        purged := purged OPERATOR(pg_catalog.+) deleted;
        batches := batches OPERATOR(pg_catalog.+) 1;
        EXIT WHEN deleted OPERATOR(pg_catalog.<) batch_size;
    END LOOP;
    PERFORM pg_catalog.set_config('enable_seqscan', saved_enable_seqscan, true);
    RETURN purged;
END
$body$;

--@ idem_role_tenants()
-- The tenants idem_tenant_members allows the current role (current_user,
-- exactly: not the roles it is a member of).  current_user is taken here,
-- as the caller (SECURITY INVOKER, so a policy's call is the querying
-- role's); the table is read by idem_sql_maint_role_tenants as its owner.
-- PL/pgSQL, whose plans are kept: a SQL function that is not inlined (the
-- pinned search_path prevents it) is planned again at every call.
LANGUAGE plpgsql
AS $body$
BEGIN
    RETURN @extschema@.idem_sql_maint_role_tenants(CURRENT_USER);
END
$body$;

--@ idem_refuse_stale_snapshot(regclass)
-- The check of the triggers that rebuild the policies of the tenants
-- (idem_tenant_members) and of the global reconcilers (idem_global_reconcilers),
-- made once they hold idem_grant's lock, which lets one rebuild run at a
-- time.  Under READ COMMITTED the statements after the lock see what the
-- rebuild before committed.  Under REPEATABLE READ and SERIALIZABLE the
-- snapshot may be older than that commit, and the rebuild would make the
-- policies from a list without the other transaction's rows: 40001 instead.
--
-- The C edition compares every row version under the snapshot and a new
-- one; SQL reads only with the snapshot.  What a rebuild leaves behind is
-- its policies: every rebuild drops the table's policies and creates them
-- anew, so they are the commit marker.  The policies as the snapshot sees
-- them (a SELECT of pg_policy) are compared with the policies as they are
-- now (pg_get_object_address looks a policy up by name in the catalog as
-- committed, whatever the snapshot): a policy dropped, created or made
-- again (a new OID) since the snapshot means another rebuild committed
-- after it.  And a row of the table that the snapshot sees but a committed
-- transaction it does not see deleted or updated (its xmax) means the same.
LANGUAGE plpgsql
AS $body$
DECLARE
    tables pg_catalog.regclass[];
    names text[];
    t pg_catalog.regclass;
    n text;
    seen pg_catalog.oid;
    now_oid pg_catalog.oid;
    stale boolean := false;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_class c
                   WHERE c.oid OPERATOR(pg_catalog.=) source
                     AND c.relkind OPERATOR(pg_catalog.=) 'r'
                     AND c.relnamespace OPERATOR(pg_catalog.=) '@extschema@'::pg_catalog.regnamespace) THEN
        RAISE EXCEPTION 'relation with OID % is not a table of the extension', source::pg_catalog.oid
            USING ERRCODE = '22023';
    END IF;
    -- under READ COMMITTED each statement has a new snapshot
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) ALL ('{repeatable read,serializable}') THEN
        RETURN;
    END IF;

    IF source OPERATOR(pg_catalog.=) '@extschema@.idem_tenant_members'::pg_catalog.regclass THEN
        tables := ARRAY['@extschema@.idempotency_records'::pg_catalog.regclass,
                        '@extschema@.idem_inbox'::pg_catalog.regclass,
                        '@extschema@.idem_inbox_streams'::pg_catalog.regclass,
                        '@extschema@.idem_outbox'::pg_catalog.regclass];
        names := '{idem_tenant_members}';
    ELSIF source OPERATOR(pg_catalog.=) '@extschema@.idem_global_reconcilers'::pg_catalog.regclass THEN
        tables := ARRAY['@extschema@.idempotency_records'::pg_catalog.regclass];
        names := '{idem_global_reconciler,idem_global_reconciler_resolve,idem_global_reconciler_unknown_only}';
    ELSE
        tables := '{}';
        names := '{}';
    END IF;
    <<policies>>
    FOREACH t IN ARRAY tables LOOP
        FOREACH n IN ARRAY names LOOP
            SELECT p.oid INTO seen FROM pg_catalog.pg_policy p
             WHERE p.polrelid OPERATOR(pg_catalog.=) t AND p.polname OPERATOR(pg_catalog.=) n;
            BEGIN
                SELECT a.objid INTO now_oid
                  FROM pg_catalog.pg_class c
                  JOIN pg_catalog.pg_namespace ns ON ns.oid OPERATOR(pg_catalog.=) c.relnamespace,
                       pg_catalog.pg_get_object_address('policy',
                           ARRAY[ns.nspname::text, c.relname::text, n], '{}') a
                 WHERE c.oid OPERATOR(pg_catalog.=) t;
            EXCEPTION WHEN undefined_object THEN
                now_oid := NULL;
            END;
            IF seen IS DISTINCT FROM now_oid THEN
                stale := true;
                EXIT policies;
            END IF;
        END LOOP;
    END LOOP;

    IF NOT stale THEN
        stale := @extschema@.idem_sql_maint_rows_changed(source);
    END IF;
    IF stale THEN
        RAISE EXCEPTION 'could not serialize access due to concurrent update of table "%"',
            (SELECT c.relname FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) source)
            USING ERRCODE = '40001',
                  DETAIL = 'Another transaction changed the table after this transaction''s snapshot was taken.',
                  HINT = 'Retry the transaction.';
    END IF;
END
$body$;

--@ idem_stats()
-- The counters live in the C edition's shared memory, which only its
-- library, loaded at server start, reserves.  The SQL edition has no library
-- and keeps no counters (a write per call on the hot path would cost more
-- than the calls): the C edition's error without preloading (55000, the same
-- message), with a detail and hint that say so (README, "What needs the C
-- library").
LANGUAGE plpgsql
AS $body$
BEGIN
    RAISE EXCEPTION 'idempotency statistics are not available'
        USING ERRCODE = '55000',
              DETAIL = 'The C edition keeps them in shared memory; the SQL edition has no library, and counting every call would cost a write per call.',
              HINT = 'Statistics are not available in the SQL edition: watch the views idem_summary and idem_stuck, and pg_stat_user_functions (track_functions = pl).';
END
$body$;

--@ idem_stats_reset()
LANGUAGE plpgsql
AS $body$
BEGIN
    RAISE EXCEPTION 'idempotency statistics are not available'
        USING ERRCODE = '55000',
              DETAIL = 'The C edition keeps them in shared memory; the SQL edition has no library, and counting every call would cost a write per call.',
              HINT = 'Statistics are not available in the SQL edition: watch the views idem_summary and idem_stuck, and pg_stat_user_functions (track_functions = pl).';
END
$body$;

--@ idem_version()
-- library_version: the version of the edition's code, which is these SQL
-- objects themselves (generate.py writes the chain's version for
-- @edition_version@, and a later version's script re-creates this body); sql_version: the
-- extension's extversion, or without an extension (the plain install) the
-- same version as the code; build_id: the edition instead of the build's
-- identity (README, "What needs the C library"); postgresql_major: the
-- server's.
LANGUAGE plpgsql
AS $body$
BEGIN
    SELECT e.extversion INTO sql_version
      FROM pg_catalog.pg_depend d
      JOIN pg_catalog.pg_extension e ON e.oid OPERATOR(pg_catalog.=) d.refobjid
     WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
       AND d.objid OPERATOR(pg_catalog.=) '@extschema@.idem_version()'::pg_catalog.regprocedure
       AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
       AND d.deptype OPERATOR(pg_catalog.=) 'e';
    library_version := '@edition_version@';   -- generate.py: the chain's version
    sql_version := coalesce(sql_version, library_version);
    build_id := 'SQL edition';
    postgresql_major := pg_catalog.current_setting('server_version_num')::pg_catalog.int4 OPERATOR(pg_catalog./) 10000;
END
$body$;
