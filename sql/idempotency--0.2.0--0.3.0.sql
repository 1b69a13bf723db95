/* idempotency--0.2.0--0.3.0.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.3.0'" to load this file. \quit

/*
 * Every SQL change since 0.2.0 goes here, appended in the order it was made.
 * The install script of 0.3.0 is built from 0.1.0's and the update scripts
 * (Makefile), so nothing here may assume a fresh install.
 */

-- ---------------------------------------------------------------------------
-- Issue 25: the tenants' policies rebuilt under a lock (section "tenants")
-- ---------------------------------------------------------------------------

/*
 * The policies naming the roles of idem_tenant_members and of
 * idem_global_reconcilers are rebuilt one transaction at a time.  Their
 * triggers read the table and pg_policy and then drop and create the
 * policies; two transactions that changed a table at once both read before
 * either waited for the other's locks on the policies' tables, so the second
 * failed with 42710 (no policy yet) or made the policies from a list without
 * the first one's rows (a role that idem_tenant_members names was in no
 * policy, a revoked one stayed in them).
 *
 * Each trigger now takes ACCESS EXCLUSIVE on idempotency_records, the first
 * table whose policies either of them rebuilds (and in the order both took
 * it before), before it reads anything, and holds it to the end of the
 * transaction.  Under READ COMMITTED each statement after the wait has a new
 * snapshot, so the list read is the committed one (plus the transaction's
 * own changes); under REPEATABLE READ and SERIALIZABLE a snapshot older than
 * another rebuild's commit fails with 40001 (idem_refuse_stale_snapshot,
 * src/tenants.c).  Every change of the tables, by the functions below or by
 * INSERT, UPDATE, DELETE, TRUNCATE or COPY (a restore), fires the same
 * statement trigger.  SHARE ROW EXCLUSIVE on the table itself would not
 * do: the trigger fires after its statement took ROW EXCLUSIVE there, and
 * two writers each asking for more would deadlock.
 *
 * The roles are printed as regrole, which reads the catalog as it is now (a
 * REPEATABLE READ snapshot may predate a role created since) and prints a
 * dropped role's OID, which is how those rows are skipped.  The extension's
 * schema goes into the policies as an argument of format(), not inside its
 * format string (a schema name with a "%" in it, issue 25).
 */
CREATE FUNCTION @extschema@.idem_refuse_stale_snapshot(source regclass)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_refuse_stale_snapshot'
LANGUAGE C VOLATILE STRICT;
REVOKE EXECUTE ON FUNCTION @extschema@.idem_refuse_stale_snapshot(regclass) FROM PUBLIC;

COMMENT ON FUNCTION @extschema@.idem_refuse_stale_snapshot(regclass) IS
    'fail with 40001 if the transaction''s snapshot misses a committed change of the table (the rebuilds of the tenant policies)';

CREATE OR REPLACE FUNCTION @extschema@.idem_apply_global_reconcilers()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s constant text := '@extschema@';
    roles text;
BEGIN
    -- idem_grant's lock first (section "kinds"): a transaction that grants a
    -- tenant and then a kind takes the two locks in the order idem_grant does
    PERFORM pg_catalog.pg_advisory_xact_lock(7459, 0);
    LOCK TABLE @extschema@.idempotency_records IN ACCESS EXCLUSIVE MODE;
    PERFORM @extschema@.idem_refuse_stale_snapshot(TG_RELID);
    SELECT string_agg(g.role::pg_catalog.text, ', ' ORDER BY g.role::pg_catalog.text) INTO roles
    FROM @extschema@.idem_global_reconcilers g
    WHERE g.role::pg_catalog.text OPERATOR(pg_catalog.<>) g.role::pg_catalog.oid::pg_catalog.text;
    IF EXISTS (SELECT FROM pg_catalog.pg_policy p
               WHERE p.polrelid OPERATOR(pg_catalog.=) '@extschema@.idempotency_records'::pg_catalog.regclass
                 AND p.polname OPERATOR(pg_catalog.=) 'idem_global_reconciler') THEN
        DROP POLICY idem_global_reconciler ON @extschema@.idempotency_records;
        DROP POLICY idem_global_reconciler_resolve ON @extschema@.idempotency_records;
        DROP POLICY idem_global_reconciler_unknown_only ON @extschema@.idempotency_records;
    END IF;
    IF roles IS NOT NULL THEN
        EXECUTE format('CREATE POLICY idem_global_reconciler ON %1$s.idempotency_records '
                       'FOR SELECT TO %2$s USING (true)', s, roles);
        EXECUTE format('CREATE POLICY idem_global_reconciler_resolve ON %1$s.idempotency_records '
                       'FOR UPDATE TO %2$s '
                       'USING (status OPERATOR(pg_catalog.=) ''unknown''::%1$s.idem_status) '
                       'WITH CHECK (true)', s, roles);
        EXECUTE format('CREATE POLICY idem_global_reconciler_unknown_only ON %1$s.idempotency_records '
                       'AS RESTRICTIVE FOR UPDATE TO %2$s '
                       'USING (status OPERATOR(pg_catalog.=) ''unknown''::%1$s.idem_status) '
                       'WITH CHECK (status OPERATOR(pg_catalog.=) ANY (''{succeeded,failed}''::%1$s.idem_status[]))',
                       s, roles);
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION @extschema@.idem_apply_tenant_members()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s constant text := '@extschema@';
    roles text;
    t record;
BEGIN
    -- idem_grant's lock first (section "kinds"): a transaction that grants a
    -- tenant and then a kind takes the two locks in the order idem_grant does
    PERFORM pg_catalog.pg_advisory_xact_lock(7459, 0);
    LOCK TABLE @extschema@.idempotency_records IN ACCESS EXCLUSIVE MODE;
    PERFORM @extschema@.idem_refuse_stale_snapshot(TG_RELID);
    SELECT string_agg(DISTINCT m.role::pg_catalog.text, ', ') INTO roles
    FROM @extschema@.idem_tenant_members m
    WHERE m.role::pg_catalog.text OPERATOR(pg_catalog.<>) m.role::pg_catalog.oid::pg_catalog.text;
    FOR t IN SELECT * FROM (VALUES ('@extschema@.idempotency_records'::pg_catalog.regclass, 'scope'),
                                   ('@extschema@.idem_inbox'::pg_catalog.regclass, 'consumer'),
                                   ('@extschema@.idem_inbox_streams'::pg_catalog.regclass, 'consumer'),
                                   ('@extschema@.idem_outbox'::pg_catalog.regclass, 'scope')) v(tab, col)
    LOOP
        IF EXISTS (SELECT FROM pg_catalog.pg_policy p
                   WHERE p.polrelid OPERATOR(pg_catalog.=) t.tab
                     AND p.polname OPERATOR(pg_catalog.=) 'idem_tenant_members') THEN
            EXECUTE format('DROP POLICY idem_tenant_members ON %s', t.tab);
        END IF;
        IF roles IS NOT NULL THEN
            EXECUTE format('CREATE POLICY idem_tenant_members ON %1$s TO %2$s '
                           'USING (pg_catalog.split_part(%3$I, ''/'', 1) OPERATOR(pg_catalog.=) '
                           'ANY ((SELECT %4$s.idem_role_tenants())::pg_catalog.text[])) '
                           'WITH CHECK (pg_catalog.split_part(%3$I, ''/'', 1) OPERATOR(pg_catalog.=) '
                           'ANY ((SELECT %4$s.idem_role_tenants())::pg_catalog.text[]))',
                           t.tab, roles, t.col, s);
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

/*
 * idem_attach_machine as 0.2.0 made it, with the extension's schema passed to
 * format() as an argument instead of written into its format strings: a "%"
 * in the schema's name was read as a format specifier (issue 25).  A
 * trigger it makes is the same as before.
 */
CREATE OR REPLACE FUNCTION @extschema@.idem_attach_machine(
    table_name regclass,
    state_column name,
    machine text,
    log boolean DEFAULT false,
    validate boolean DEFAULT true)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $function$
#variable_conflict use_column
DECLARE
    states text[];
    col_type oid;
    bad text;
    key_columns text[];
    log_table text;
    ext_schema constant text := '@extschema@';
BEGIN
    IF table_name IS NULL OR state_column IS NULL OR machine IS NULL
       OR log IS NULL OR validate IS NULL THEN
        RAISE EXCEPTION 'arguments of idem_attach_machine must not be null' USING ERRCODE = '22004';
    END IF;
    -- Touch the definition: a concurrent idem_drop_machine waits for us and
    -- then sees the trigger, or (REPEATABLE READ, SERIALIZABLE) fails with
    -- 40001; a mere row lock would not make it re-read the catalog.
    UPDATE @extschema@.idem_machines m SET defined_at = m.defined_at
    WHERE m.name = idem_attach_machine.machine
    RETURNING m.states INTO states;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'state machine "%" does not exist', machine
            USING ERRCODE = '42704',
                  HINT = 'Define it with idem_define_machine() first.';
    END IF;
    SELECT a.atttypid INTO col_type FROM pg_attribute a
    WHERE a.attrelid = table_name AND a.attname = state_column
      AND a.attnum > 0 AND NOT a.attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'column "%" of relation % does not exist', state_column, table_name
            USING ERRCODE = '42703';
    END IF;
    IF EXISTS (SELECT 1 FROM @extschema@.idem_attached_machines a
               WHERE a.table_name = idem_attach_machine.table_name
                 AND a.state_column = idem_attach_machine.state_column) THEN
        RAISE EXCEPTION 'column "%" of relation % already has a state machine', state_column, table_name
            USING ERRCODE = '42710',
                  HINT = 'Detach it with idem_detach_machine() first.';
    END IF;

    -- CREATE TRIGGER checks the caller's TRIGGER privilege and locks the table
    -- (SHARE ROW EXCLUSIVE), so no row changes while we validate.  The name
    -- sorts after ordinary names: BEFORE triggers fire in name order, and this
    -- one must see the row as the other BEFORE triggers left it.  It fires on
    -- every UPDATE, not only those naming the column: another BEFORE trigger
    -- may change the state in an UPDATE that does not.
    EXECUTE format('CREATE TRIGGER %I BEFORE INSERT OR UPDATE ON %s '
                   'FOR EACH ROW EXECUTE FUNCTION %s.idem_enforce_transition(%L, %L)',
                   @extschema@.idem_object_name('zz_idem_machine_', state_column, ''),
                   table_name, ext_schema, machine, state_column);
    -- The rows really inserted (not the rows an INSERT ... ON CONFLICT only
    -- proposes) must start in an initial state; the WHEN clause runs as each
    -- row is inserted and queues an event only for a row to refuse.
    EXECUTE format('CREATE TRIGGER %1$I AFTER INSERT ON %2$s FOR EACH ROW '
                   'WHEN (%3$s.idem_inserted_unchecked(%4$L, %5$L, NEW.tableoid, NEW.%5$I::pg_catalog.text)) '
                   'EXECUTE FUNCTION %3$s.idem_enforce_initial_state(%4$L, %5$L)',
                   @extschema@.idem_object_name('zz_idem_machine_', state_column, '_inserted'),
                   table_name, ext_schema, machine, state_column);

    -- The triggers fire for this table's own rows, not for the rows of its
    -- inheritance children (partitions get clones of them).  The lock taken
    -- by CREATE TRIGGER keeps children from being added while we look.
    IF EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhparent
               WHERE i.inhparent = table_name AND c.relkind <> 'p') THEN
        RAISE EXCEPTION 'cannot attach state machine "%" to table % because it has inheritance children',
                machine, table_name
            USING ERRCODE = '0A000',
                  DETAIL = 'The machine''s triggers would not fire for the rows of the child tables.',
                  HINT = 'Attach the machine to each child table, or use a partitioned table.';
    END IF;

    IF validate THEN
        EXECUTE format('SELECT s FROM (SELECT DISTINCT %I::text AS s FROM %s) v '
                       'WHERE s IS NOT NULL AND NOT s = ANY ($1) LIMIT 1',
                       state_column, table_name)
            INTO bad USING states;
        IF bad IS NOT NULL THEN
            RAISE EXCEPTION 'column "%" of relation % contains "%", which is not a state of machine "%"',
                    state_column, table_name, bad, machine
                USING ERRCODE = '23514',
                      HINT = 'Define the machine with that state, fix the rows, or attach with validate => false.';
        END IF;
    END IF;

    IF log THEN
        SELECT array_agg(a.attname::text ORDER BY k.ord) INTO key_columns
        FROM pg_index i
        CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY k(attnum, ord)
        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
        WHERE i.indrelid = table_name AND i.indisprimary;
        log_table := format('%I.%I',
                            (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                             WHERE c.oid = table_name),
                            @extschema@.idem_object_name('',
                                (SELECT c.relname FROM pg_class c WHERE c.oid = table_name), '_state_log'));
        -- a log table someone else made (with triggers of theirs) must not
        -- run as every writer of the governed table
        IF to_regclass(log_table) IS NOT NULL
           AND (SELECT c.relowner FROM pg_class c WHERE c.oid = to_regclass(log_table))
               <> (SELECT c.relowner FROM pg_class c WHERE c.oid = table_name) THEN
            RAISE EXCEPTION 'log table % already exists and is not owned by the owner of table %',
                            log_table, table_name
                USING ERRCODE = '42P07',
                      HINT = 'Drop or rename that table, or attach with log => false.';
        END IF;
        EXECUTE format('CREATE TABLE IF NOT EXISTS %s ('
                       'logged_at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(), '
                       'row_key jsonb NOT NULL, '
                       'state_column name NOT NULL, '
                       'machine text NOT NULL, '
                       'from_state text, '
                       'to_state text, '
                       'xact_id xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id(), '
                       'changed_by name NOT NULL DEFAULT CURRENT_USER)', log_table);
        EXECUTE format('CREATE TRIGGER %I AFTER INSERT OR UPDATE ON %s '
                       'FOR EACH ROW EXECUTE FUNCTION %s.idem_log_transition(%L, %L, %L%s)',
                       @extschema@.idem_object_name('zz_idem_machine_log_', state_column, ''), table_name,
                       ext_schema, log_table, state_column, machine,
                       coalesce((SELECT string_agg(format(', %L', k), '') FROM unnest(key_columns) k), ''));
    END IF;
END
$function$;

-- ---------------------------------------------------------------------------
-- Issue 25: fencing tokens that never repeat or run out (section "tokens")
-- ---------------------------------------------------------------------------

/*
 * A token is epoch * 2^16 + n from here on, where it was epoch * 2^32 + n:
 * 2^47 epochs, so that no workload spends them (src/tokens.c).  The epoch
 * moves above every token issued so far, so that today's tokens stay valid
 * and every later one is above them: every token was below (epoch + 1) *
 * 2^32, which is (epoch + 1) * 2^16 epochs of the new scheme (n would need
 * 2^32 takeovers of one key to reach it), found without reading the
 * records.  In a fresh install (no record, the epoch never advanced)
 * nothing moves and keys start at 1.
 */
ALTER SEQUENCE @extschema@.idem_token_epoch MAXVALUE 140737488355327;

SELECT pg_catalog.setval('@extschema@.idem_token_epoch', rescaled.epoch)
FROM (SELECT CASE WHEN is_called
                  THEN (last_value OPERATOR(pg_catalog.+) 1) OPERATOR(pg_catalog.*) 65536
                  WHEN EXISTS (SELECT FROM @extschema@.idempotency_records) THEN 65536
                  ELSE 0 END AS epoch
        FROM @extschema@.idem_token_epoch) rescaled
WHERE rescaled.epoch OPERATOR(pg_catalog.>) 0;

COMMENT ON SEQUENCE @extschema@.idem_token_epoch IS
    'the token epoch: new keys get tokens from epoch * 2^16 + 1; advanced by whatever removes records and by a new timeline';

/*
 * The timeline on which the epoch last moved on.  Before the first token of
 * another timeline (a promoted standby, a recovery to a point in time) the
 * epoch jumps, so that no token issued in a commit the old timeline
 * acknowledged and lost can be issued again.  Not in the dump: a restore
 * records its own server's timeline at CREATE EXTENSION.  Nobody needs a
 * privilege on it, and a sequence gives PUBLIC none: the library reads and
 * sets it as its owner.
 */
CREATE SEQUENCE @extschema@.idem_token_timeline AS bigint MINVALUE 0 START WITH 0;

COMMENT ON SEQUENCE @extschema@.idem_token_timeline IS
    'the timeline on which the token epoch last moved on (idem_token_epoch)';


-- The server's timeline now.  A server that refuses its WAL position to the
-- installing role (some managed services do, for the SQL edition) leaves 0:
-- there the epoch cannot follow timelines (README, "What needs the C library").
DO $timeline$
BEGIN
    PERFORM pg_catalog.setval('@extschema@.idem_token_timeline',
                              ('x' OPERATOR(pg_catalog.||)
                               pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8)
                              )::bit(32)::bigint);
EXCEPTION WHEN feature_not_supported OR insufficient_privilege THEN
    NULL;
END
$timeline$;

/*
 * The deletion trigger reads the epoch of a token with the new shift.  Made
 * again as it was, so that every open session reloads the extension's
 * objects (src/extension_objects.c) and finds the new scheme before its next
 * call.
 */
CREATE OR REPLACE FUNCTION @extschema@.idem_records_removed()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_records_removed'
LANGUAGE C;

-- ---------------------------------------------------------------------------
-- Issue 25: the outbox's per-key order for every row (section "outbox order")
-- ---------------------------------------------------------------------------

/*
 * Every row that enters idem_outbox gets its seq as an emit's does: a row
 * inserted directly (an ORM's, under the kind emitter) takes its key's lock
 * and then draws seq, so that per key seq order is commit order whoever
 * inserts (src/outbox.c, the order trigger).  seq's default becomes
 * idem_outbox_next_seq(), nextval of idem_outbox_seq that remembers what it
 * drew, so that the trigger tells a drawn seq from one the row brings: a row
 * that brings its own (a restore's COPY, a copy between shards, logical
 * replication, a row written by its owner) keeps it and takes no lock.  An
 * emitter still may not write seq.  The trigger is enabled ALWAYS, so that
 * sessions in replica mode (session_replication_role) order their rows too.
 * PUBLIC may call the default, as any INSERT must: it is nextval under the
 * caller's own privileges on the sequence.
 */
CREATE FUNCTION @extschema@.idem_outbox_next_seq()
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_outbox_next_seq'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.idem_outbox_next_seq() IS
    'the default of idem_outbox.seq: nextval of idem_outbox_seq, remembered for the trigger idem_outbox_order';

CREATE FUNCTION @extschema@.idem_outbox_order()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_outbox_order'
LANGUAGE C;

COMMENT ON FUNCTION @extschema@.idem_outbox_order() IS
    'trigger of idem_outbox: a row whose seq its default drew takes the emits'' lock on its key and then draws seq, as an emit does';
REVOKE EXECUTE ON FUNCTION @extschema@.idem_outbox_order() FROM PUBLIC;

ALTER TABLE @extschema@.idem_outbox
    ALTER COLUMN seq SET DEFAULT @extschema@.idem_outbox_next_seq();
CREATE TRIGGER idem_outbox_order
    BEFORE INSERT ON @extschema@.idem_outbox
    FOR EACH ROW EXECUTE FUNCTION @extschema@.idem_outbox_order();
ALTER TABLE @extschema@.idem_outbox ENABLE ALWAYS TRIGGER idem_outbox_order;

COMMENT ON COLUMN @extschema@.idem_outbox.seq IS
    'order of emits (idem_outbox_seq), drawn after the key''s lock (trigger idem_outbox_order) unless the row brings its own';

-- ---------------------------------------------------------------------------
-- Issue 25: idem_grant and idem_revoke_all take turns (section "kinds")
-- ---------------------------------------------------------------------------

/*
 * Roles onboarded in parallel: two transactions that GRANT or REVOKE on the
 * same objects update the same catalog rows, and the second fails with
 * "tuple concurrently updated" (XX000) once the first commits.  Each call
 * now first takes a transaction-level advisory lock (7459, 0), so the second
 * waits and then grants on what the first committed.  The bodies are 0.2.0's
 * with that line added.
 */
CREATE OR REPLACE FUNCTION @extschema@.idem_grant(kind text, grantee regrole)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s constant text := '@extschema@';
    functions text;
    tables text;
    privileges text;
BEGIN
    IF kind IS NULL OR grantee IS NULL THEN
        RAISE EXCEPTION 'kind and grantee must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF grantee OPERATOR(pg_catalog.=) 0 THEN
        RAISE EXCEPTION 'grantee must be a role'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Nothing is granted to PUBLIC: name a role.';
    END IF;
    -- one call at a time: concurrent GRANTs of the same objects fail with
    -- "tuple concurrently updated"
    PERFORM pg_catalog.pg_advisory_xact_lock(7459, 0);
    CASE kind
    WHEN 'client' THEN
        functions := format('%1$s.idem_claim(text, bytea, interval, text, interval, boolean), '
                            '%1$s.idem_complete(text, bigint, jsonb, integer, text, jsonb), '
                            '%1$s.idem_fail(text, bigint, jsonb, boolean, text, integer, jsonb), '
                            '%1$s.idem_checkpoint(text, bigint, text, interval, text), '
                            '%1$s.idem_release(text, bigint, text), '
                            '%1$s.idem_mark_unknown(text, bigint, jsonb, text), '
                            '%1$s.idem_lookup(text, text), %1$s.idem_await(text, text, interval)', s);
        tables := format('%s.idempotency_records', s);
        privileges := 'SELECT, INSERT, UPDATE, DELETE';
    WHEN 'reconciler' THEN
        functions := format('%1$s.idem_resolve(text, %1$s.idem_status, jsonb, integer, text, boolean, jsonb), '
                            '%1$s.idem_lookup(text, text)', s);
        tables := format('%s.idempotency_records', s);
        privileges := 'SELECT, UPDATE';
        EXECUTE format('GRANT SELECT ON TABLE %1$s.idem_stuck, %1$s.idem_outbox TO %2$s', s, grantee);
    WHEN 'global_reconciler' THEN
        functions := format('%1$s.idem_resolve(text, %1$s.idem_status, jsonb, integer, text, boolean, jsonb), '
                            '%1$s.idem_lookup(text, text)', s);
        tables := format('%s.idempotency_records', s);
        -- only the columns idem_resolve sets (STMT_RESOLVE in src/record_store.c)
        privileges := 'SELECT, UPDATE (status, result, error, response_code, response_headers, '
                      'retryable, completed_at, updated_at, expires_at)';
        EXECUTE format('GRANT SELECT ON TABLE %1$s.idem_stuck, %1$s.idem_summary, %1$s.idem_outbox TO %2$s',
                       s, grantee);
        EXECUTE format('INSERT INTO %s.idem_global_reconcilers (role) '
                       'VALUES (%s::pg_catalog.oid::pg_catalog.regrole) ON CONFLICT (role) DO NOTHING',
                       s, grantee::pg_catalog.oid);
    WHEN 'reader' THEN
        functions := format('%1$s.idem_lookup(text, text), %1$s.idem_await(text, text, interval)', s);
        tables := format('%1$s.idempotency_records, %1$s.idem_stuck, %1$s.idem_summary, %1$s.idem_outbox', s);
        privileges := 'SELECT';
    WHEN 'consumer' THEN
        functions := format('%1$s.idem_inbox_accept(text, text, interval, boolean), '
                            '%1$s.idem_inbox_accept_seq(text, text, bigint, boolean), '
                            '%1$s.idem_inbox_accept_seq(text, text, bigint, integer, boolean), '
                            '%1$s.idem_inbox_watermark(text, text), '
                            '%1$s.idem_inbox_accept_many(text, text[], interval, boolean), '
                            '%1$s.idem_inbox_accept_seq_many(text, text, bigint[], boolean)', s);
        tables := format('%1$s.idem_inbox, %1$s.idem_inbox_streams', s);
        privileges := 'SELECT, INSERT, UPDATE';
    WHEN 'maintenance' THEN
        functions := format('%1$s.idem_purge(integer, integer), '
                            '%1$s.idem_schedule_purge(text, integer, integer), '
                            '%1$s.idem_unschedule_purge()', s);
        tables := format('%1$s.idempotency_records, %1$s.idem_inbox, %1$s.idem_outbox', s);
        privileges := 'SELECT, UPDATE, DELETE';
        EXECUTE format('GRANT USAGE ON SEQUENCE %s.idem_token_epoch TO %s', s, grantee);
    WHEN 'machine_admin' THEN
        functions := format('%1$s.idem_define_machine(text, jsonb, text[]), '
                            '%1$s.idem_drop_machine(text), '
                            '%1$s.idem_attach_machine(regclass, name, text, boolean, boolean), '
                            '%1$s.idem_detach_machine(regclass, name)', s);
        tables := format('%1$s.idem_machines, %1$s.idem_machine_moves', s);
        privileges := 'INSERT, UPDATE, DELETE';
    WHEN 'monitor' THEN
        functions := format('%s.idem_stats_reset()', s);
        tables := format('%1$s.idempotency_records, %1$s.idem_stuck, %1$s.idem_summary, %1$s.idem_outbox', s);
        privileges := 'SELECT';
    WHEN 'emitter' THEN
        functions := format('%1$s.idem_outbox_emit(text, text, jsonb, text, jsonb, text, interval), '
                            '%1$s.idem_outbox_emit_batch(text, text[], jsonb[], text[], jsonb[], text, interval)', s);
        tables := format('%s.idem_outbox', s);
        -- only the columns an emit sets: status, seq, token, lease and
        -- attempts take their defaults, so an emitter cannot write a
        -- message in flight or ahead of others of its key
        privileges := 'INSERT (id, created_at, available_at, updated_at, scope, '
                      'aggregatetype, aggregateid, type, headers, payload)';
        EXECUTE format('GRANT USAGE ON SEQUENCE %s.idem_outbox_seq TO %s', s, grantee);
    WHEN 'relay' THEN
        functions := format('%1$s.idem_outbox_claim(text, integer, interval, text[]), '
                            '%1$s.idem_outbox_ack(uuid[], bigint), '
                            '%1$s.idem_outbox_nack(uuid, bigint, jsonb, interval), '
                            '%1$s.idem_outbox_retry(uuid), '
                            '%1$s.idem_outbox_lock_key(text, text, text), '
                            '%1$s.idem_outbox_check_token(uuid, bigint, text), '
                            '%1$s.idem_outbox_counted(text, bigint)', s);
        tables := format('%s.idem_outbox', s);
        privileges := 'SELECT, UPDATE';
        EXECUTE format('GRANT USAGE ON SEQUENCE %1$s.idem_outbox_token, %1$s.idem_outbox_seq TO %2$s', s, grantee);
    ELSE
        RAISE EXCEPTION 'unknown kind of user "%"', kind
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'The kinds are client, reconciler, global_reconciler, reader, consumer, maintenance, machine_admin, monitor, emitter and relay.';
    END CASE;
    EXECUTE format('GRANT USAGE ON SCHEMA %s TO %s', s, grantee);
    EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', functions, grantee);
    EXECUTE format('GRANT %s ON TABLE %s TO %s', privileges, tables, grantee);
END
$$;

CREATE OR REPLACE FUNCTION @extschema@.idem_revoke_all(grantee regrole)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s constant text := '@extschema@';
    object record;
BEGIN
    IF grantee IS NULL THEN
        RAISE EXCEPTION 'grantee must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF grantee OPERATOR(pg_catalog.=) 0 THEN
        RAISE EXCEPTION 'grantee must be a role' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- one call at a time: concurrent GRANTs of the same objects fail with
    -- "tuple concurrently updated"
    PERFORM pg_catalog.pg_advisory_xact_lock(7459, 0);
    FOR object IN
        SELECT pg_catalog.format('FUNCTION %s', p.oid::pg_catalog.regprocedure) AS name
        FROM pg_catalog.pg_depend d JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) d.objid
        WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
          AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
          AND d.refobjid OPERATOR(pg_catalog.=) (SELECT e.oid FROM pg_catalog.pg_extension e
                                                 WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency')
          AND d.deptype OPERATOR(pg_catalog.=) 'e'
        UNION ALL
        SELECT pg_catalog.format('TABLE %s', c.oid::pg_catalog.regclass)
        FROM pg_catalog.pg_depend d JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) d.objid
        WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
          AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
          AND d.refobjid OPERATOR(pg_catalog.=) (SELECT e.oid FROM pg_catalog.pg_extension e
                                                 WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency')
          AND d.deptype OPERATOR(pg_catalog.=) 'e'
          AND c.relkind OPERATOR(pg_catalog.=) ANY ('{r,v,S}')
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON %s FROM %s', object.name, grantee);
    END LOOP;
    EXECUTE pg_catalog.format('REVOKE USAGE ON SCHEMA %s FROM %s', s, grantee);
    DELETE FROM @extschema@.idem_global_reconcilers g
     WHERE g.role::pg_catalog.oid OPERATOR(pg_catalog.=) grantee::pg_catalog.oid;
    DELETE FROM @extschema@.idem_tenant_members m
     WHERE m.role::pg_catalog.oid OPERATOR(pg_catalog.=) grantee::pg_catalog.oid;
END
$$;


-- ---------------------------------------------------------------------------
-- Issue 26: idem_purge on a schedule by pg_cron (section "purge schedule")
-- ---------------------------------------------------------------------------

/*
 * Where the library cannot be loaded (the SQL edition on a managed service)
 * there is no purge worker; every such service offers pg_cron.  These two
 * schedule and unschedule idem_purge as a pg_cron job of this database,
 * named 'idem_purge in <database>', as the calling role (pg_cron runs
 * a job as the role that scheduled it).  Calling idem_schedule_purge again
 * changes the job's schedule.  pg_cron lives in one database of the cluster
 * (cron.database_name); from any other one these fail with the statement to
 * run there instead.  A run is one transaction (pg_cron's), so it deletes at
 * most max_batches batches (10 by default, as the purge worker's run) and
 * never holds a long backlog's rows locked at once; the next minute goes on.
 */
CREATE FUNCTION @extschema@.idem_schedule_purge(
    schedule text DEFAULT '* * * * *',
    batch_size integer DEFAULT 10000,
    max_batches integer DEFAULT 10)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    job_name constant text := 'idem_purge in ' || current_database();
    command constant text := format('SELECT %I.idem_purge(%s, %s)', '@extschema@',
                                    batch_size, coalesce(max_batches::text, 'NULL'));
BEGIN
    IF schedule IS NULL OR batch_size IS NULL THEN
        RAISE EXCEPTION 'schedule and batch_size must not be null' USING ERRCODE = '22004';
    END IF;
    IF batch_size < 1 OR max_batches < 1 THEN
        RAISE EXCEPTION 'batch_size and max_batches must be at least 1' USING ERRCODE = '22023';
    END IF;
    IF to_regclass('cron.job') IS NULL THEN
        RAISE EXCEPTION 'pg_cron is not installed in database "%"', current_database()
            USING ERRCODE = '55000',
                  HINT = format('Run CREATE EXTENSION pg_cron in the database that cron.database_name names; '
                                'if that is another database, run there: SELECT cron.schedule_in_database(%L, %L, %L, %L)',
                                job_name, schedule, command, current_database());
    END IF;
    RETURN cron.schedule(job_name, schedule, command);
END
$$;

COMMENT ON FUNCTION @extschema@.idem_schedule_purge(text, integer, integer) IS
    'schedule idem_purge with pg_cron in this database (where no purge worker runs); returns the job id';

CREATE FUNCTION @extschema@.idem_unschedule_purge()
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    job_name constant text := 'idem_purge in ' || current_database();
BEGIN
    IF to_regclass('cron.job') IS NULL THEN
        RAISE EXCEPTION 'pg_cron is not installed in database "%"', current_database()
            USING ERRCODE = '55000';
    END IF;
    IF NOT EXISTS (SELECT FROM cron.job j WHERE j.jobname = job_name AND j.username = current_user) THEN
        RETURN false;
    END IF;
    RETURN cron.unschedule(job_name);
END
$$;

COMMENT ON FUNCTION @extschema@.idem_unschedule_purge() IS
    'remove the pg_cron job of idem_schedule_purge; false when there was none';

REVOKE EXECUTE ON FUNCTION @extschema@.idem_schedule_purge(text, integer, integer),
    @extschema@.idem_unschedule_purge() FROM PUBLIC;


-- ---------------------------------------------------------------------------
-- Issue 25: grants that earlier update scripts made become ordinary grants
-- (section "grants"; last, so that it also covers what this script grants)
-- ---------------------------------------------------------------------------

/*
 * PostgreSQL records what a GRANT or REVOKE in an extension script leaves
 * as the object's initial privileges, and pg_dump writes out only what
 * differs from those: the roles that 0.2.0's update granted the outbox and
 * the batch inbox (and any role a script's GRANT or REVOKE on an older
 * object found there) came back from no dump.  The C helper turns every
 * grant to a role other than the owner and PUBLIC in the members' initial
 * privileges into an ordinary grant, leaving the privileges as they are
 * and the initial ones as a fresh install's (src/upgrade.c).  It lives only
 * in this script, and runs last.
 */
CREATE FUNCTION @extschema@.idem_make_grants_ordinary()
RETURNS void
AS 'MODULE_PATHNAME', 'idem_make_grants_ordinary'
LANGUAGE C;

SELECT @extschema@.idem_make_grants_ordinary();

DROP FUNCTION @extschema@.idem_make_grants_ordinary();
