/* idempotency--0.1.0--0.2.0.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.2.0'" to load this file. \quit

/*
 * Every SQL change since 0.1.0 goes here, appended in the order it was made.
 * The install script of 0.2.0 is built from 0.1.0's and this one (Makefile),
 * so nothing here may assume a fresh install.
 */

/*
 * Fencing whatever removes a record (issue 12, defect 3).  A DELETE or
 * TRUNCATE of records advances the token epoch as idem_purge does, so that
 * a key claimed again gets tokens no earlier owner held, and an UPDATE may
 * not move a record to another scope or key (src/removal.c).  The functions
 * read and advance the sequence without the deleting role's privileges on
 * it, and nobody may call them or attach them elsewhere.  ENABLE ALWAYS:
 * with session_replication_role = replica records are removed too.
 */
CREATE FUNCTION @extschema@.idem_records_removed()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_records_removed'
LANGUAGE C;

CREATE FUNCTION @extschema@.idem_records_truncated()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_records_truncated'
LANGUAGE C;

CREATE FUNCTION @extschema@.idem_records_rekeyed()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_records_rekeyed'
LANGUAGE C;

REVOKE EXECUTE ON FUNCTION
    @extschema@.idem_records_removed(),
    @extschema@.idem_records_truncated(),
    @extschema@.idem_records_rekeyed()
FROM PUBLIC;

COMMENT ON FUNCTION @extschema@.idem_records_removed() IS
    'trigger: a deleted record of the current token epoch advances the epoch';
COMMENT ON FUNCTION @extschema@.idem_records_truncated() IS
    'trigger: a TRUNCATE of the records advances the token epoch';
COMMENT ON FUNCTION @extschema@.idem_records_rekeyed() IS
    'trigger: refuses an UPDATE that changes the scope or key of a record';

-- BEFORE: an AFTER row trigger would queue an event per deleted row
CREATE TRIGGER idem_records_removed
    BEFORE DELETE ON @extschema@.idempotency_records
    FOR EACH ROW EXECUTE FUNCTION @extschema@.idem_records_removed();
CREATE TRIGGER idem_records_truncated
    AFTER TRUNCATE ON @extschema@.idempotency_records
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.idem_records_truncated();
CREATE TRIGGER idem_records_rekeyed
    BEFORE UPDATE OF scope, key ON @extschema@.idempotency_records
    FOR EACH ROW EXECUTE FUNCTION @extschema@.idem_records_rekeyed();
ALTER TABLE @extschema@.idempotency_records
    ENABLE ALWAYS TRIGGER idem_records_removed,
    ENABLE ALWAYS TRIGGER idem_records_truncated,
    ENABLE ALWAYS TRIGGER idem_records_rekeyed;

/*
 * The build's identity (issue 12): which SQL version is installed, which
 * library serves it, built from what, for which PostgreSQL.  Readable by
 * all, like version(); it touches no data.
 */
CREATE FUNCTION @extschema@.idem_version(
    OUT sql_version text,
    OUT library_version text,
    OUT build_id text,
    OUT postgresql_major integer)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_version'
LANGUAGE C STABLE STRICT PARALLEL SAFE;

COMMENT ON FUNCTION @extschema@.idem_version() IS
    'the installed SQL version (extversion), the library''s version, its build (git commit) and the PostgreSQL major version it was compiled for';

/*
 * State machines: row movement, INSERT ... ON CONFLICT and inheritance
 * parents (issue 12, defects 4, 5 and 8).
 *
 * An attachment is now two triggers.  The BEFORE INSERT OR UPDATE trigger of
 * 0.1.0 checks every UPDATE, and the insert half of an UPDATE that moves a
 * row to another partition as the move it is.  A new AFTER INSERT trigger
 * refuses a row really inserted in a state that is not initial: the BEFORE
 * trigger cannot, because INSERT ... ON CONFLICT fires it on the proposed
 * row, which a conflict turns into an UPDATE of the existing row, or into
 * nothing.  The AFTER trigger's WHEN clause is evaluated as each row is
 * inserted and queues an event only for the rows it refuses.  The C code
 * still accepts an attachment without the AFTER trigger (the BEFORE trigger
 * then refuses such rows itself); this script adds it to every attachment.
 */
CREATE FUNCTION @extschema@.idem_inserted_unchecked(
    machine text, state_column name, relation oid, state text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_inserted_unchecked'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.idem_inserted_unchecked(text, name, oid, text) IS
    'WHEN clause of idem_enforce_initial_state: whether a row just inserted must be refused';

CREATE FUNCTION @extschema@.idem_enforce_initial_state()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_enforce_initial_state'
LANGUAGE C;

COMMENT ON FUNCTION @extschema@.idem_enforce_initial_state() IS
    'AFTER INSERT trigger: idem_enforce_initial_state(machine, column) refuses rows inserted in a state that is not initial';

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
                   'FOR EACH ROW EXECUTE FUNCTION @extschema@.idem_enforce_transition(%L, %L)',
                   @extschema@.idem_object_name('zz_idem_machine_', state_column, ''),
                   table_name, machine, state_column);
    -- The rows really inserted (not the rows an INSERT ... ON CONFLICT only
    -- proposes) must start in an initial state; the WHEN clause runs as each
    -- row is inserted and queues an event only for a row to refuse.
    EXECUTE format('CREATE TRIGGER %I AFTER INSERT ON %s FOR EACH ROW '
                   'WHEN (@extschema@.idem_inserted_unchecked(%L, %L, NEW.tableoid, NEW.%I::pg_catalog.text)) '
                   'EXECUTE FUNCTION @extschema@.idem_enforce_initial_state(%L, %L)',
                   @extschema@.idem_object_name('zz_idem_machine_', state_column, '_inserted'),
                   table_name, machine, state_column, state_column, machine, state_column);

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
                       'FOR EACH ROW EXECUTE FUNCTION @extschema@.idem_log_transition(%L, %L, %L%s)',
                       @extschema@.idem_object_name('zz_idem_machine_log_', state_column, ''), table_name,
                       log_table, state_column, machine,
                       coalesce((SELECT string_agg(format(', %L', k), '') FROM unnest(key_columns) k), ''));
    END IF;
END
$function$;

COMMENT ON FUNCTION @extschema@.idem_attach_machine(regclass, name, text, boolean, boolean) IS
    'govern a column with a state machine (and optionally log every change in <table>_state_log)';

CREATE OR REPLACE FUNCTION @extschema@.idem_detach_machine(table_name regclass, state_column name)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $function$
#variable_conflict use_column
DECLARE
    trig record;
    found_one boolean := false;
BEGIN
    IF table_name IS NULL OR state_column IS NULL THEN
        RAISE EXCEPTION 'arguments of idem_detach_machine must not be null' USING ERRCODE = '22004';
    END IF;
    FOR trig IN
        SELECT t.tgname FROM pg_trigger t
        WHERE t.tgrelid = table_name
          AND t.tgfoid IN ('@extschema@.idem_enforce_transition()'::regprocedure,
                           '@extschema@.idem_enforce_initial_state()'::regprocedure,
                           '@extschema@.idem_log_transition()'::regprocedure)
          -- all three take the state column as their second argument
          AND @extschema@.idem_trigger_arg(t.tgargs, 2) = state_column::text
    LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', trig.tgname, table_name);
        found_one := true;
    END LOOP;
    IF NOT found_one THEN
        RAISE EXCEPTION 'column "%" of relation % has no state machine', state_column, table_name
            USING ERRCODE = '42704';
    END IF;
END
$function$;

/*
 * Attachments made by 0.1.0 get their AFTER INSERT trigger (clones on
 * partitions come with the parent's), if their trigger fires on INSERT; a
 * trigger made by hand for UPDATE only gets none.  Each AFTER trigger then
 * fires when its BEFORE trigger does: disabled, ENABLE REPLICA or ENABLE
 * ALWAYS like it, partition by partition (parents first, since altering a
 * partitioned table's trigger alters its clones too).  An attachment on an
 * inheritance parent keeps governing the parent's own rows; idem_transition
 * now refuses it.
 */
DO $migrate$
DECLARE
    a record;
    current_state "char";
BEGIN
    FOR a IN
        SELECT t.tgrelid::pg_catalog.regclass AS table_name,
               @extschema@.idem_trigger_arg(t.tgargs, 1) AS machine,
               @extschema@.idem_trigger_arg(t.tgargs, 2) AS state_column
        FROM pg_catalog.pg_trigger t
        WHERE t.tgfoid OPERATOR(pg_catalog.=) '@extschema@.idem_enforce_transition()'::pg_catalog.regprocedure
          AND t.tgparentid OPERATOR(pg_catalog.=) 0
          AND t.tgnargs OPERATOR(pg_catalog.=) 2
          -- TRIGGER_TYPE_INSERT
          AND (t.tgtype::pg_catalog.int4 OPERATOR(pg_catalog.&) 4) OPERATOR(pg_catalog.<>) 0
          AND t.tgrelid OPERATOR(pg_catalog.<>) '@extschema@.idempotency_records'::pg_catalog.regclass
        ORDER BY t.oid
    LOOP
        EXECUTE pg_catalog.format('CREATE TRIGGER %I AFTER INSERT ON %s FOR EACH ROW '
                       'WHEN (@extschema@.idem_inserted_unchecked(%L, %L, NEW.tableoid, NEW.%I::pg_catalog.text)) '
                       'EXECUTE FUNCTION @extschema@.idem_enforce_initial_state(%L, %L)',
                       @extschema@.idem_object_name('zz_idem_machine_', a.state_column, '_inserted'),
                       a.table_name, a.machine, a.state_column, a.state_column, a.machine, a.state_column);
        IF EXISTS (SELECT 1 FROM pg_catalog.pg_inherits i
                   JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) i.inhparent
                   WHERE i.inhparent OPERATOR(pg_catalog.=) a.table_name
                     AND c.relkind OPERATOR(pg_catalog.<>) 'p') THEN
            RAISE WARNING 'state machine "%" on column "%" of table % does not govern the rows of its inheritance children',
                    a.machine, a.state_column, a.table_name
                USING HINT = 'Detach it, and attach the machine to each child table.';
        END IF;
    END LOOP;

    FOR a IN
        SELECT b.tgrelid::pg_catalog.regclass AS table_name, b.tgenabled,
               n.oid AS after_oid, n.tgname AS after_name
        FROM pg_catalog.pg_trigger b
        JOIN pg_catalog.pg_trigger n
          ON n.tgrelid OPERATOR(pg_catalog.=) b.tgrelid
         AND n.tgfoid OPERATOR(pg_catalog.=) '@extschema@.idem_enforce_initial_state()'::pg_catalog.regprocedure
         AND n.tgargs OPERATOR(pg_catalog.=) b.tgargs
        WHERE b.tgfoid OPERATOR(pg_catalog.=) '@extschema@.idem_enforce_transition()'::pg_catalog.regprocedure
          AND b.tgnargs OPERATOR(pg_catalog.=) 2
          AND (b.tgtype::pg_catalog.int4 OPERATOR(pg_catalog.&) 4) OPERATOR(pg_catalog.<>) 0
        ORDER BY (SELECT pg_catalog.count(*) FROM pg_catalog.pg_partition_ancestors(b.tgrelid)), b.oid
    LOOP
        -- read again: altering a parent's trigger has changed its clones
        SELECT t.tgenabled INTO current_state FROM pg_catalog.pg_trigger t
        WHERE t.oid OPERATOR(pg_catalog.=) a.after_oid;
        IF current_state OPERATOR(pg_catalog.<>) a.tgenabled THEN
            EXECUTE pg_catalog.format('ALTER TABLE %s %s TRIGGER %I', a.table_name,
                CASE a.tgenabled WHEN 'D' THEN 'DISABLE' WHEN 'R' THEN 'ENABLE REPLICA'
                                 WHEN 'A' THEN 'ENABLE ALWAYS' ELSE 'ENABLE' END,
                a.after_name);
        END IF;
    END LOOP;
END
$migrate$;

/*
 * The request fingerprint (issue 14): a digest of an HTTP request's method,
 * path and canonical body, less the body's ignore paths (src/fingerprint.c).
 * Pure, like idem_fingerprint, and like it executable by PUBLIC.  Not
 * STRICT: a NULL method, path or body is an error (22004), and a NULL
 * ignore removes nothing.
 */
CREATE FUNCTION @extschema@.idem_request_fingerprint(
    method text,
    path text,
    body jsonb,
    ignore text[] DEFAULT NULL)
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_request_fingerprint'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

COMMENT ON FUNCTION @extschema@.idem_request_fingerprint(text, text, jsonb, text[]) IS
    'SHA-256 of an HTTP request: the method (upper-cased), the path and the canonical body without the ignore paths';

/*
 * Tenants with sub-scopes, and a reconciler across tenants (issue 14).
 *
 * A record's scope belongs to the tenant in idempotency.scope when it is the
 * tenant or starts with the tenant and '/': the inbox's rule for consumers.
 * It is written as a range on the scope column (collation "C", the first
 * column of the primary key) so that the policy stays an index condition;
 * '0' is the character after '/'.  The C code applies the same rule to a
 * claim's scope before it probes the primary key (src/record_store.c,
 * in_tenant), once it has seen that the policy calls this function.
 */
CREATE FUNCTION @extschema@.idem_scope_in_tenant(scope text)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
-- bound at creation and inlined into the policies, like idem_consumer_in_scope
RETURN scope COLLATE pg_catalog."C" OPERATOR(pg_catalog.=)
           NULLIF(pg_catalog.current_setting('idempotency.scope', true), '')
       OR (scope COLLATE pg_catalog."C" OPERATOR(pg_catalog.>=)
               (NULLIF(pg_catalog.current_setting('idempotency.scope', true), '')
                OPERATOR(pg_catalog.||) '/')
           AND scope COLLATE pg_catalog."C" OPERATOR(pg_catalog.<)
               (NULLIF(pg_catalog.current_setting('idempotency.scope', true), '')
                OPERATOR(pg_catalog.||) '0'));

COMMENT ON FUNCTION @extschema@.idem_scope_in_tenant(text) IS
    'whether a record scope belongs to the tenant in idempotency.scope: the tenant itself or "<tenant>/..." (tenant isolation)';

ALTER POLICY idem_tenant ON @extschema@.idempotency_records
    USING (@extschema@.idem_scope_in_tenant(scope))
    WITH CHECK (@extschema@.idem_scope_in_tenant(scope));

/*
 * Reconciliation across tenants: the roles given the kind 'global_reconciler'
 * by idem_grant read every record and may update an unknown one
 * (idem_resolve), whatever idempotency.scope says.  It inserts and deletes
 * nothing, so it cannot claim; the kind grants neither the client's
 * functions nor INSERT or DELETE.
 *
 * The policies that allow it name the roles (TO ...), so that for every
 * other role they do not exist and the tenant policy alone stays an index
 * condition.  They are made from the table idem_global_reconcilers by its
 * trigger, as the settings table's trigger switches row-level security:
 * pg_dump keeps the
 * table, not policies made after CREATE EXTENSION on the extension's tables,
 * and a restore that loads the rows makes the policies again.  A role in a
 * policy cannot be dropped before idem_revoke_all (or DROP OWNED) takes it
 * out.  Roles are kept as regrole, as the catalogs keep grants: a rename
 * keeps the kind, a new role of a dropped role's name does not get it, and
 * pg_upgrade keeps role OIDs.  pg_dump writes them as names (restore the
 * roles first); a row whose role was dropped (DROP OWNED, then DROP ROLE)
 * is skipped, and left out of dumps so that no other cluster reads its
 * number.
 *
 * A third policy, restrictive, confines every UPDATE of these roles to
 * unknown records resolved to succeeded or failed: the permissive tenant
 * policy would otherwise let them change any record of the tenant they SET.
 * Their UPDATE privilege covers only the columns idem_resolve writes.
 */
CREATE TABLE @extschema@.idem_global_reconcilers (
    role regrole PRIMARY KEY
);
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_global_reconcilers',
    'WHERE EXISTS (SELECT FROM pg_catalog.pg_roles a WHERE a.oid OPERATOR(pg_catalog.=) role::pg_catalog.oid)');
REVOKE ALL ON TABLE @extschema@.idem_global_reconcilers FROM PUBLIC;
GRANT SELECT ON TABLE @extschema@.idem_global_reconcilers TO PUBLIC;

COMMENT ON TABLE @extschema@.idem_global_reconcilers IS
    'roles that see the records of every tenant and may resolve their unknown outcomes (idem_grant kind global_reconciler)';

CREATE FUNCTION @extschema@.idem_apply_global_reconcilers()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    roles text;
BEGIN
    SELECT string_agg(quote_ident(a.rolname), ', ' ORDER BY a.rolname) INTO roles
    FROM @extschema@.idem_global_reconcilers g
    JOIN pg_catalog.pg_roles a ON a.oid OPERATOR(pg_catalog.=) g.role::pg_catalog.oid;
    IF EXISTS (SELECT FROM pg_catalog.pg_policy p
               WHERE p.polrelid OPERATOR(pg_catalog.=) '@extschema@.idempotency_records'::pg_catalog.regclass
                 AND p.polname OPERATOR(pg_catalog.=) 'idem_global_reconciler') THEN
        DROP POLICY idem_global_reconciler ON @extschema@.idempotency_records;
        DROP POLICY idem_global_reconciler_resolve ON @extschema@.idempotency_records;
        DROP POLICY idem_global_reconciler_unknown_only ON @extschema@.idempotency_records;
    END IF;
    IF roles IS NOT NULL THEN
        EXECUTE format('CREATE POLICY idem_global_reconciler ON @extschema@.idempotency_records '
                       'FOR SELECT TO %s USING (true)', roles);
        EXECUTE format('CREATE POLICY idem_global_reconciler_resolve ON @extschema@.idempotency_records '
                       'FOR UPDATE TO %s '
                       'USING (status OPERATOR(pg_catalog.=) ''unknown''::@extschema@.idem_status) '
                       'WITH CHECK (true)', roles);
        EXECUTE format('CREATE POLICY idem_global_reconciler_unknown_only ON @extschema@.idempotency_records '
                       'AS RESTRICTIVE FOR UPDATE TO %s '
                       'USING (status OPERATOR(pg_catalog.=) ''unknown''::@extschema@.idem_status) '
                       'WITH CHECK (status OPERATOR(pg_catalog.=) ANY (''{succeeded,failed}''::@extschema@.idem_status[]))',
                       roles);
    END IF;
    RETURN NULL;
END
$$;
REVOKE EXECUTE ON FUNCTION @extschema@.idem_apply_global_reconcilers() FROM PUBLIC;

CREATE TRIGGER idem_apply_global_reconcilers
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON @extschema@.idem_global_reconcilers
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.idem_apply_global_reconcilers();

/*
 * Tenant as an argument (issue 14): a role allowed a tenant works in that
 * tenant's scopes without idempotency.scope, so that a step of a multi-phase
 * request is one autocommit call and nothing is left in the session for the
 * next client of a pooled connection.
 *
 * idem_tenant_members says which role (exactly current_user: no
 * inheritance through role membership) is allowed which tenant.  Roles are
 * kept as regrole, as for the global reconcilers above: a rename keeps the
 * tenants, a new role of a dropped role's name does not get them, and the
 * rows of dropped roles are skipped and not dumped.  A tenant
 * here is a name without '/', and a scope belongs to it when the scope's text
 * before its first '/' is the tenant: 't1' allows 't1', 't1/orders',
 * 't1//x', not 't10' or 't1x/orders'.
 *
 * A second permissive policy, idem_tenant_members, on the three tables
 * accepts a row when its scope's (an inbox row: its consumer's) first part is
 * one of idem_role_tenants(), which reads the table itself for the current
 * role's rows (src/tenants.c: PUBLIC cannot read the table, and a role
 * learns only its own tenants).  The policy names the roles of the table (TO ...), made
 * by the table's trigger as for the global reconcilers (pg_dump keeps the
 * table, and a restore that loads the rows makes the policies again), so
 * that for every other role it does not exist and idem_tenant alone stays a
 * range of the primary key.  The function is called in a scalar sub-select,
 * so that it runs at most once per query (an initPlan).  A role named in a
 * policy cannot be dropped before idem_revoke_tenant or idem_revoke_all (or
 * DROP OWNED) takes it out.
 *
 * The C code (src/record_store.c, idem_store_tenant_check) recognises this
 * policy and calls idem_role_tenants() itself, so that its answer agrees
 * with the policy's; with policies of any other form it answers "unknown".
 */
CREATE TABLE @extschema@.idem_tenant_members (
    role regrole NOT NULL,
    tenant text NOT NULL
        CONSTRAINT idem_tenant_members_tenant_check
        CHECK (tenant OPERATOR(pg_catalog.<>) ''
               AND pg_catalog.strpos(tenant, '/') OPERATOR(pg_catalog.=) 0),
    PRIMARY KEY (role, tenant)
);
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_tenant_members',
    'WHERE EXISTS (SELECT FROM pg_catalog.pg_roles a WHERE a.oid OPERATOR(pg_catalog.=) role::pg_catalog.oid)');
-- No privilege for PUBLIC (a table's default, left as it is: an explicit
-- REVOKE would only write the owner's default privileges into relacl, which
-- pg_upgrade does not carry): idem_role_tenants reads it for the other
-- roles, their own rows only.

COMMENT ON TABLE @extschema@.idem_tenant_members IS
    'the tenants each role may work in without idempotency.scope (idem_grant_tenant)';

CREATE FUNCTION @extschema@.idem_role_tenants()
RETURNS text[]
-- reads idem_tenant_members itself, the current role's rows only (src/tenants.c)
AS 'MODULE_PATHNAME', 'idem_role_tenants'
LANGUAGE C STABLE PARALLEL SAFE;

COMMENT ON FUNCTION @extschema@.idem_role_tenants() IS
    'the tenants the current role may work in without idempotency.scope (tenant isolation)';

CREATE FUNCTION @extschema@.idem_apply_tenant_members()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    roles text;
    t record;
BEGIN
    SELECT string_agg(DISTINCT quote_ident(a.rolname), ', ') INTO roles
    FROM @extschema@.idem_tenant_members m
    JOIN pg_catalog.pg_roles a ON a.oid OPERATOR(pg_catalog.=) m.role::pg_catalog.oid;
    -- idem_outbox is created below, before anything can fire this trigger
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
                           'ANY ((SELECT @extschema@.idem_role_tenants())::pg_catalog.text[])) '
                           'WITH CHECK (pg_catalog.split_part(%3$I, ''/'', 1) OPERATOR(pg_catalog.=) '
                           'ANY ((SELECT @extschema@.idem_role_tenants())::pg_catalog.text[]))',
                           t.tab, roles, t.col);
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;
REVOKE EXECUTE ON FUNCTION @extschema@.idem_apply_tenant_members() FROM PUBLIC;

CREATE TRIGGER idem_apply_tenant_members
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON @extschema@.idem_tenant_members
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.idem_apply_tenant_members();

CREATE FUNCTION @extschema@.idem_grant_tenant(tenant text, grantee regrole)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF tenant IS NULL OR grantee IS NULL THEN
        RAISE EXCEPTION 'tenant and grantee must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF grantee OPERATOR(pg_catalog.=) 0 THEN
        RAISE EXCEPTION 'grantee must be a role'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'No tenant is allowed to PUBLIC: name a role.';
    END IF;
    IF tenant OPERATOR(pg_catalog.=) '' OR pg_catalog.strpos(tenant, '/') OPERATOR(pg_catalog.<>) 0 THEN
        RAISE EXCEPTION 'tenant "%" must be a name without "/"', tenant
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'The role is allowed the tenant''s scopes: the tenant itself and those that start with "<tenant>/".';
    END IF;
    INSERT INTO @extschema@.idem_tenant_members (role, tenant)
    VALUES (grantee, idem_grant_tenant.tenant)
    ON CONFLICT ON CONSTRAINT idem_tenant_members_pkey DO NOTHING;
END
$$;
REVOKE EXECUTE ON FUNCTION @extschema@.idem_grant_tenant(text, regrole) FROM PUBLIC;

COMMENT ON FUNCTION @extschema@.idem_grant_tenant(text, regrole) IS
    'allow a role the scopes of a tenant without idempotency.scope (tenant isolation)';

CREATE FUNCTION @extschema@.idem_revoke_tenant(tenant text, grantee regrole)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF tenant IS NULL OR grantee IS NULL THEN
        RAISE EXCEPTION 'tenant and grantee must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    DELETE FROM @extschema@.idem_tenant_members m
     WHERE m.tenant OPERATOR(pg_catalog.=) idem_revoke_tenant.tenant
       AND m.role::pg_catalog.oid OPERATOR(pg_catalog.=) grantee::pg_catalog.oid;
END
$$;
REVOKE EXECUTE ON FUNCTION @extschema@.idem_revoke_tenant(text, regrole) FROM PUBLIC;

COMMENT ON FUNCTION @extschema@.idem_revoke_tenant(text, regrole) IS
    'take a tenant allowed by idem_grant_tenant from a role';

-- a role that loses its privileges is no longer a global reconciler and loses
-- its tenants too
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

COMMENT ON FUNCTION @extschema@.idem_revoke_all(regrole) IS
    'revoke every privilege on the extension''s objects (and its schema) that idem_grant gave a role, its place among the global reconcilers and its tenants';

/*
 * Routing for sharded deployments (issue 16): a hash of the scope's tenant
 * part that every server computes alike (src/route.c).
 */
CREATE FUNCTION @extschema@.idem_route_hash(scope text)
RETURNS integer
AS 'MODULE_PATHNAME', 'idem_route_hash'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

COMMENT ON FUNCTION @extschema@.idem_route_hash(text) IS
    'the shard hash of a scope: the first 4 bytes of SHA-256 of its tenant part (before the first "/"), big-endian int4';

/*
 * Response headers (issue 14, "From an HTTP API"): idem_complete, idem_fail
 * and idem_resolve save the answer's headers with its status and body, and
 * a replay gives them back (the claim's row, idem_lookup, idem_await).  A
 * JSON object of header names to a string or an array of strings; the C
 * code checks it (src/validation.c).  The column has no default, so adding
 * it rewrites nothing; it comes last, in the table's row type too, which
 * idem_lookup and idem_await return.  The library still serves 0.1.0's
 * table and functions without it.  A takeover clears it with the other
 * outcome columns (STMT_TAKEOVER in src/record_store.c).
 */
ALTER TABLE @extschema@.idempotency_records ADD COLUMN response_headers jsonb;

COMMENT ON COLUMN @extschema@.idempotency_records.response_headers IS
    'the saved answer''s headers: {"Name": "value" or ["value", ...]}, or NULL';

ALTER TYPE @extschema@.idem_claim_result ADD ATTRIBUTE response_headers jsonb;

/*
 * A new argument list is a new function: each function is made anew beside
 * the old one, given the old one's grants, and the old one dropped (an
 * overload with a default would make idem_complete('k', 1) ambiguous).  The
 * grants are copied by the C helper, so that they stay grants rather than
 * become initial privileges of the extension, which pg_dump would leave
 * out (src/upgrade.c); the helper lives only in this script.  PUBLIC has
 * none, as in 0.1.0.
 */
CREATE FUNCTION @extschema@.idem_copy_function_grants(from_function regprocedure,
                                                      to_function regprocedure)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_copy_function_grants'
LANGUAGE C STRICT;

CREATE FUNCTION @extschema@.idem_complete(
    key text,
    token bigint,
    result jsonb DEFAULT NULL,
    response_code integer DEFAULT NULL,
    scope text DEFAULT '',
    headers jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_complete'
LANGUAGE C VOLATILE;

CREATE FUNCTION @extschema@.idem_fail(
    key text,
    token bigint,
    error jsonb,
    retryable boolean DEFAULT true,
    scope text DEFAULT '',
    response_code integer DEFAULT NULL,
    headers jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_fail'
LANGUAGE C VOLATILE;

CREATE FUNCTION @extschema@.idem_resolve(
    key text,
    status @extschema@.idem_status,
    result jsonb DEFAULT NULL,
    response_code integer DEFAULT NULL,
    scope text DEFAULT '',
    retryable boolean DEFAULT false,
    headers jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_resolve'
LANGUAGE C VOLATILE;

REVOKE EXECUTE ON FUNCTION
    @extschema@.idem_complete(text, bigint, jsonb, integer, text, jsonb),
    @extschema@.idem_fail(text, bigint, jsonb, boolean, text, integer, jsonb),
    @extschema@.idem_resolve(text, @extschema@.idem_status, jsonb, integer, text, boolean, jsonb)
FROM PUBLIC;

SELECT @extschema@.idem_copy_function_grants(
    '@extschema@.idem_complete(text, bigint, jsonb, integer, text)',
    '@extschema@.idem_complete(text, bigint, jsonb, integer, text, jsonb)');
SELECT @extschema@.idem_copy_function_grants(
    '@extschema@.idem_fail(text, bigint, jsonb, boolean, text, integer)',
    '@extschema@.idem_fail(text, bigint, jsonb, boolean, text, integer, jsonb)');
SELECT @extschema@.idem_copy_function_grants(
    '@extschema@.idem_resolve(text, @extschema@.idem_status, jsonb, integer, text, boolean)',
    '@extschema@.idem_resolve(text, @extschema@.idem_status, jsonb, integer, text, boolean, jsonb)');

DROP FUNCTION @extschema@.idem_copy_function_grants(regprocedure, regprocedure);
DROP FUNCTION @extschema@.idem_complete(text, bigint, jsonb, integer, text);
DROP FUNCTION @extschema@.idem_fail(text, bigint, jsonb, boolean, text, integer);
DROP FUNCTION @extschema@.idem_resolve(text, @extschema@.idem_status, jsonb, integer, text, boolean);

COMMENT ON FUNCTION @extschema@.idem_complete(text, bigint, jsonb, integer, text, jsonb) IS
    'the owner saves the outcome: result, response code and headers (fencing token checked)';
COMMENT ON FUNCTION @extschema@.idem_fail(text, bigint, jsonb, boolean, text, integer, jsonb) IS
    'the owner saves a failure: error, retryable, response code and headers (fencing token checked)';
COMMENT ON FUNCTION @extschema@.idem_resolve(text, @extschema@.idem_status, jsonb, integer, text, boolean, jsonb) IS
    'settle an unknown outcome after reconciliation: succeeded or failed, with the answer''s code and headers';

/*
 * The transactional outbox (issue 15).  A message is a row committed with
 * the business change that emits it; relays publish it afterwards, at least
 * once, and the consumer's inbox makes its effect exactly once.
 *
 * The first five columns are those of Debezium's outbox event router (id,
 * aggregatetype = the topic, aggregateid = the key, type, payload), so that
 * change data capture can route the table without a relay.  The rest is the
 * relay protocol:
 *
 *   seq          order of emits (idem_outbox_seq); per (scope, topic, key) a
 *                message is handed out only when no earlier one is pending
 *                or in flight and none of its key is in flight.  Emits of
 *                one key are serialized by a lock (src/outbox.c), so that
 *                per key seq order is commit order
 *   token        the fencing token of the claim that last handed it out
 *                (idem_outbox_token, one per claimed batch, never repeated)
 *   available_at when it may be handed out; NULL once published or dead, so
 *                that both partial indexes hold only live messages
 *   lease_expires_at  while in flight: when another relay may take it over
 *
 * HOT: a claim changes only columns no index covers (status, token, lease,
 * relay, attempts, updated_at), so it stays on its page; an ack and a nack
 * change available_at (the partial indexes' predicate), which takes the
 * message out of or moves it within the claim indexes.  Published messages
 * are purged through a BRIN index on created_at (rows arrive in time order),
 * after idempotency.outbox_retention counted from publication (updated_at).
 * The fixed-width columns come first, so that a row has no alignment pad.
 */
CREATE TYPE @extschema@.idem_outbox_status AS ENUM
    ('pending', 'in_flight', 'published', 'dead');

COMMENT ON TYPE @extschema@.idem_outbox_status IS
    'lifecycle of an outbox message: pending -> in_flight -> published, or back to pending (nack, expired lease), or dead after idempotency.outbox_max_attempts';

CREATE SEQUENCE @extschema@.idem_outbox_seq AS bigint MINVALUE 1 START WITH 1;
COMMENT ON SEQUENCE @extschema@.idem_outbox_seq IS
    'the order of emits: per (topic, key) messages are published in seq order';
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_outbox_seq', '');

CREATE SEQUENCE @extschema@.idem_outbox_token AS bigint MINVALUE 1 START WITH 1;
COMMENT ON SEQUENCE @extschema@.idem_outbox_token IS
    'fencing tokens of outbox claims: one per claimed batch, never repeated (dumped, so a restore does not repeat them either)';
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_outbox_token', '');

CREATE TABLE @extschema@.idem_outbox (
    id               uuid NOT NULL,
    seq              bigint NOT NULL DEFAULT pg_catalog.nextval('@extschema@.idem_outbox_seq'::pg_catalog.regclass),
    token            bigint NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL,
    available_at     timestamptz,
    lease_expires_at timestamptz,
    updated_at       timestamptz NOT NULL,
    attempts         integer NOT NULL DEFAULT 0,
    status           @extschema@.idem_outbox_status NOT NULL DEFAULT 'pending',
    scope            text COLLATE pg_catalog."C" NOT NULL DEFAULT '',
    aggregatetype    text COLLATE pg_catalog."C" NOT NULL,
    aggregateid      text COLLATE pg_catalog."C" NOT NULL,
    type             text,
    relay            text,
    headers          jsonb,
    last_error       jsonb,
    payload          jsonb NOT NULL,
    CONSTRAINT idem_outbox_pkey PRIMARY KEY (id),
    -- a live message can be handed out; published and dead ones cannot
    CONSTRAINT idem_outbox_available_check
        CHECK ((available_at IS NULL) OPERATOR(pg_catalog.=)
               (status OPERATOR(pg_catalog.=) ANY ('{published,dead}'::@extschema@.idem_outbox_status[]))),
    CONSTRAINT idem_outbox_lease_check
        CHECK ((lease_expires_at IS NOT NULL) OPERATOR(pg_catalog.=)
               (status OPERATOR(pg_catalog.=) 'in_flight'::@extschema@.idem_outbox_status))
) WITH (fillfactor = 90);

COMMENT ON TABLE @extschema@.idem_outbox IS
    'transactional outbox: messages committed with the business change, published by relays (idem_outbox_claim / ack / nack)';
COMMENT ON COLUMN @extschema@.idem_outbox.aggregatetype IS 'the topic (Debezium outbox router: aggregatetype)';
COMMENT ON COLUMN @extschema@.idem_outbox.aggregateid IS 'the message key; per (scope, topic, key) the order of emits is kept (Debezium: aggregateid)';
COMMENT ON COLUMN @extschema@.idem_outbox.seq IS 'order of emits (idem_outbox_seq)';
COMMENT ON COLUMN @extschema@.idem_outbox.token IS 'fencing token of the claim that last handed the message out; 0 before the first';
COMMENT ON COLUMN @extschema@.idem_outbox.available_at IS 'when the message may be handed out (delay, back-off); NULL once published or dead';
COMMENT ON COLUMN @extschema@.idem_outbox.lease_expires_at IS 'while in flight: when another relay may take the message over';
COMMENT ON COLUMN @extschema@.idem_outbox.updated_at IS 'last change of status: for a published message, when it was published';
COMMENT ON COLUMN @extschema@.idem_outbox.attempts IS 'how many times a claim handed the message out';
COMMENT ON COLUMN @extschema@.idem_outbox.relay IS 'the relay that claimed the message last';
COMMENT ON COLUMN @extschema@.idem_outbox.last_error IS 'the error of the last nack';

-- claim: available messages, oldest first, in emit order (a batch emitted
-- at one time has one available_at: seq keeps the scan from sorting it)
CREATE INDEX idem_outbox_available ON @extschema@.idem_outbox (available_at, seq)
    WHERE available_at IS NOT NULL;
-- claim: the live messages of a key, in emit order (head of line); the
-- scope is part of the key, so that one tenant's messages never hold up
-- another's
CREATE INDEX idem_outbox_key ON @extschema@.idem_outbox (aggregatetype, aggregateid, scope, seq)
    WHERE available_at IS NOT NULL;
-- purge: published messages, in time order
CREATE INDEX idem_outbox_created_at ON @extschema@.idem_outbox
    USING brin (created_at) WITH (pages_per_range = 16);

-- Messages are application data: pg_dump must keep them.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_outbox', '');

/*
 * Emitting is one INSERT in the caller's transaction (C, one prepared
 * statement kept per backend: src/outbox.c), and a NOTIFY on the channel
 * idem_outbox with an empty payload.  PostgreSQL folds identical
 * notifications of a transaction into one, so relays are woken once per
 * committing transaction however many messages it emitted, and never for
 * one that rolled back.
 */
CREATE FUNCTION @extschema@.idem_outbox_emit(
    topic text,
    key text,
    payload jsonb,
    type text DEFAULT NULL,
    headers jsonb DEFAULT NULL,
    scope text DEFAULT '',
    delay interval DEFAULT NULL)
RETURNS uuid
AS 'MODULE_PATHNAME', 'idem_outbox_emit'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.idem_outbox_emit(text, text, jsonb, text, jsonb, text, interval) IS
    'emit a message in the current transaction: one row of idem_outbox; relays are notified on channel idem_outbox at commit';

CREATE FUNCTION @extschema@.idem_outbox_emit_batch(
    topic text,
    keys text[],
    payloads jsonb[],
    types text[] DEFAULT NULL,
    headers jsonb[] DEFAULT NULL,
    scope text DEFAULT '',
    delay interval DEFAULT NULL)
RETURNS uuid[]
AS 'MODULE_PATHNAME', 'idem_outbox_emit_batch'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.idem_outbox_emit_batch(text, text[], jsonb[], text[], jsonb[], text, interval) IS
    'emit many messages of one topic in the current transaction, in array order; returns their ids';

/*
 * The relay protocol, in PL/pgSQL: batch operations, one statement each.
 *
 * A claim hands out up to batch messages that are available (pending and
 * due, or in flight with an expired lease) and at the head of their key:
 * no earlier live message of the same (scope, topic, key), and no message
 * of that key in flight.  Rows another claim has locked are skipped (SKIP
 * LOCKED); a row changed by a claim that committed after this statement's
 * snapshot is checked again in its new version (EvalPlanQual), so a message
 * already in flight is not handed out twice.
 *
 * The head-of-line test reads the statement's snapshot.  That is safe
 * because emits of one key are serialized until commit (src/outbox.c): a
 * snapshot that sees a message of a key sees every earlier one, so the head
 * it finds is the real head, or one that another claim holds (locked,
 * skipped) or has since published.  Without that lock a later message that
 * committed first could be handed out while an earlier one was still
 * uncommitted, and two relays could each hold one message of a key
 * (test/specs/outbox-relays.spec has both cases).  A message in flight whose
 * lease ran out is taken over even with an earlier live message of its key
 * (which the lock rules out, but rows copied in by hand may not), so that
 * no key can be stuck behind a dead relay's message.
 *
 * The whole batch gets one token of the sequence idem_outbox_token, drawn only when
 * the batch has messages.  A message taken over whose attempts have reached
 * idempotency.outbox_max_attempts is made dead instead of handed out.
 */
CREATE FUNCTION @extschema@.idem_outbox_claim(
    relay text,
    batch integer DEFAULT 100,
    lease interval DEFAULT '30 seconds',
    topics text[] DEFAULT NULL)
RETURNS TABLE (id uuid, aggregatetype text, aggregateid text, type text,
               payload jsonb, headers jsonb, attempts integer, token bigint)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $function$
#variable_conflict use_column
DECLARE
    now_ts constant timestamptz := clock_timestamp();
    lease_end timestamptz;
    m record;
    dead integer := 0;
    taken_over integer := 0;
    max_attempts constant integer :=
        coalesce(nullif(current_setting('idempotency.outbox_max_attempts', true), '')::integer, 10);
BEGIN
    IF relay IS NULL THEN
        RAISE EXCEPTION 'relay must not be null' USING ERRCODE = '22004';
    END IF;
    IF relay = '' THEN
        RAISE EXCEPTION 'relay must not be empty' USING ERRCODE = '22023';
    END IF;
    IF octet_length(relay) > 255 THEN
        RAISE EXCEPTION 'relay is too long' USING ERRCODE = '22001',
            DETAIL = format('It is %s bytes long; a relay name has at most 255 bytes.', octet_length(relay));
    END IF;
    IF batch IS NULL THEN
        RAISE EXCEPTION 'batch must not be null' USING ERRCODE = '22004';
    END IF;
    IF batch <= 0 OR batch > 10000 THEN
        RAISE EXCEPTION 'batch must be between 1 and 10000' USING ERRCODE = '22023',
            DETAIL = format('The value given was %s.', batch);
    END IF;
    IF lease IS NULL THEN
        RAISE EXCEPTION 'lease must not be null' USING ERRCODE = '22004';
    END IF;
    lease_end := now_ts + lease;
    IF lease_end <= now_ts THEN
        RAISE EXCEPTION 'lease must be positive' USING ERRCODE = '22023',
            DETAIL = format('The interval given was "%s".', lease);
    END IF;
    -- from PostgreSQL 17 an interval may be infinite: a lease that never
    -- expires would hold its keys for ever after a relay's crash
    IF NOT isfinite(lease_end) THEN
        RAISE EXCEPTION 'lease must be finite' USING ERRCODE = '22023',
            DETAIL = format('The interval given was "%s".', lease);
    END IF;
    -- (array_position refuses a multidimensional array with 0A000)
    IF array_ndims(topics) > 1 THEN
        RAISE EXCEPTION 'topics must be a one-dimensional array' USING ERRCODE = '22023';
    END IF;
    IF array_position(topics, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'topics must not contain nulls' USING ERRCODE = '22004';
    END IF;

    FOR m IN
    WITH candidates AS (
        SELECT o.id, o.status, o.available_at, o.seq
        FROM @extschema@.idem_outbox o
        WHERE o.available_at <= now_ts
          AND (o.status = 'pending'
               OR (o.status = 'in_flight' AND o.lease_expires_at <= now_ts))
          AND (topics IS NULL OR o.aggregatetype = ANY (topics))
          -- no earlier live message of the key (an expired lease is
          -- taken over regardless)
          AND (o.status = 'in_flight'
               OR NOT EXISTS (SELECT FROM @extschema@.idem_outbox p
                              WHERE p.aggregatetype = o.aggregatetype
                                AND p.aggregateid = o.aggregateid
                                AND p.scope = o.scope
                                AND p.available_at IS NOT NULL
                                AND p.seq < o.seq
                              OFFSET 0))
          -- and no later one of the key in flight (a dead message put back
          -- by idem_outbox_retry comes after those emitted meanwhile)
          AND NOT EXISTS (SELECT FROM @extschema@.idem_outbox p
                          WHERE p.aggregatetype = o.aggregatetype
                            AND p.aggregateid = o.aggregateid
                            AND p.scope = o.scope
                            AND p.available_at IS NOT NULL
                            AND p.seq > o.seq
                            AND p.status = 'in_flight'
                          OFFSET 0)
        -- OFFSET 0 keeps each NOT EXISTS a probe of idem_outbox_key per
        -- candidate: pulled up into an anti-join, it may be planned as a
        -- scan of the whole table (in flight is rare in the statistics)
        ORDER BY o.available_at, o.seq
        LIMIT batch
        FOR NO KEY UPDATE OF o SKIP LOCKED),
    batch_token AS (
        SELECT nextval('@extschema@.idem_outbox_token'::regclass) AS token
        FROM (SELECT FROM candidates LIMIT 1) any_candidate),
    claimed AS (
        UPDATE @extschema@.idem_outbox o
        SET status = CASE WHEN c.status = 'in_flight' AND o.attempts >= max_attempts
                          THEN 'dead' ELSE 'in_flight' END::@extschema@.idem_outbox_status,
            available_at = CASE WHEN c.status = 'in_flight' AND o.attempts >= max_attempts
                                THEN NULL ELSE o.available_at END,
            lease_expires_at = CASE WHEN c.status = 'in_flight' AND o.attempts >= max_attempts
                                    THEN NULL ELSE lease_end END,
            last_error = CASE WHEN c.status = 'in_flight' AND o.attempts >= max_attempts
                              THEN jsonb_build_object('error', 'the lease of the last attempt expired',
                                                      'relay', o.relay)
                              ELSE o.last_error END,
            token = CASE WHEN c.status = 'in_flight' AND o.attempts >= max_attempts
                         THEN o.token ELSE t.token END,
            attempts = CASE WHEN c.status = 'in_flight' AND o.attempts >= max_attempts
                            THEN o.attempts ELSE o.attempts + 1 END,
            relay = CASE WHEN c.status = 'in_flight' AND o.attempts >= max_attempts
                         THEN o.relay ELSE idem_outbox_claim.relay END,
            updated_at = now_ts
        FROM candidates c, batch_token t
        WHERE o.id = c.id
        RETURNING o.id, o.aggregatetype, o.aggregateid, o.type, o.payload,
                  o.headers, o.attempts, o.token, o.status, c.status AS old_status,
                  o.available_at, o.seq)
    SELECT * FROM claimed c ORDER BY c.available_at NULLS LAST, c.seq
    LOOP
        IF m.status = 'dead' THEN
            dead := dead + 1;
            CONTINUE;
        END IF;
        IF m.old_status = 'in_flight' THEN
            taken_over := taken_over + 1;
        END IF;
        id := m.id;
        aggregatetype := m.aggregatetype;
        aggregateid := m.aggregateid;
        type := m.type;
        payload := m.payload;
        headers := m.headers;
        attempts := m.attempts;
        token := m.token;
        RETURN NEXT;
    END LOOP;
    IF dead > 0 THEN
        PERFORM @extschema@.idem_outbox_counted('dead', dead);
    END IF;
    IF taken_over > 0 THEN
        PERFORM @extschema@.idem_outbox_counted('taken_over', taken_over);
    END IF;
END
$function$;

COMMENT ON FUNCTION @extschema@.idem_outbox_claim(text, integer, interval, text[]) IS
    'hand out up to batch available messages, at most one per (topic, key), under one fencing token and a lease';

/*
 * ack and nack match a message only in flight under the caller's token.
 * Anything else is an error that leaves every message as it was: a token
 * that is not the message's (it was taken over: IK002, the records'
 * stale-token SQLSTATE), a message that is not in flight (IK003), an id
 * that is not there (IK004).  An ack repeated with the token that published
 * the message is accepted again (a lost reply), and counts nothing.
 */
CREATE FUNCTION @extschema@.idem_outbox_check_token(message_id uuid, token bigint, verb text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    m record;
BEGIN
    IF message_id IS NULL OR token IS NULL OR verb IS NULL THEN
        RAISE EXCEPTION 'arguments of idem_outbox_check_token must not be null' USING ERRCODE = '22004';
    END IF;
    SELECT o.token, o.status INTO m FROM @extschema@.idem_outbox o WHERE o.id = message_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'outbox message % does not exist', message_id
            USING ERRCODE = 'IK004',
                  DETAIL = 'It was never emitted, its transaction has not committed, or it was purged after its retention.';
    END IF;
    IF m.token <> token THEN
        RAISE EXCEPTION 'token % is not the current fencing token of outbox message %', token, message_id
            USING ERRCODE = 'IK002',
                  DETAIL = CASE WHEN token < m.token
                                THEN 'The message was claimed again after this token was issued.'
                                ELSE 'No such token was issued for this message.' END,
                  HINT = 'Do not acknowledge this delivery; the relay holding the current token publishes the message.';
    END IF;
    RAISE EXCEPTION 'cannot % outbox message % because it is not in flight', verb, message_id
        USING ERRCODE = 'IK003',
              DETAIL = format('Its status is "%s".', m.status);
END
$function$;

COMMENT ON FUNCTION @extschema@.idem_outbox_check_token(uuid, bigint, text) IS
    'raises the error of an ack or nack that matched no message in flight (IK002, IK003 or IK004)';

CREATE FUNCTION @extschema@.idem_outbox_ack(ids uuid[], token bigint)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $function$
#variable_conflict use_column
DECLARE
    now_ts constant timestamptz := clock_timestamp();
    wanted integer;
    acked integer;
    missing uuid;
BEGIN
    IF ids IS NULL THEN
        RAISE EXCEPTION 'ids must not be null' USING ERRCODE = '22004';
    END IF;
    -- (array_position refuses a multidimensional array with 0A000)
    IF array_ndims(ids) > 1 THEN
        RAISE EXCEPTION 'ids must be a one-dimensional array' USING ERRCODE = '22023';
    END IF;
    IF array_position(ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'ids must not contain nulls' USING ERRCODE = '22004';
    END IF;
    IF token IS NULL THEN
        RAISE EXCEPTION 'token must not be null' USING ERRCODE = '22004';
    END IF;
    IF token <= 0 THEN
        RAISE EXCEPTION 'token must be positive' USING ERRCODE = '22023',
            DETAIL = format('Fencing tokens start at 1; %s was given.', token);
    END IF;
    SELECT count(DISTINCT u) INTO wanted FROM unnest(ids) u;
    IF wanted = 0 THEN
        RETURN 0;
    END IF;

    WITH acked AS (
        UPDATE @extschema@.idem_outbox o
        SET status = 'published', available_at = NULL, lease_expires_at = NULL,
            updated_at = now_ts
        WHERE o.id = ANY (ids) AND o.token = idem_outbox_ack.token AND o.status = 'in_flight'
        RETURNING o.id)
    SELECT count(*) INTO acked FROM acked;

    IF acked < wanted THEN
        -- a repeat of an ack that committed is fine; anything else is not
        SELECT u INTO missing FROM unnest(ids) u
        WHERE NOT EXISTS (SELECT FROM @extschema@.idem_outbox o
                          WHERE o.id = u AND o.token = idem_outbox_ack.token
                            AND o.status = 'published')
        LIMIT 1;
        IF missing IS NOT NULL THEN
            PERFORM @extschema@.idem_outbox_check_token(missing, token, 'acknowledge');
        END IF;
    END IF;
    IF acked > 0 THEN
        PERFORM @extschema@.idem_outbox_counted('published', acked);
    END IF;
    RETURN acked;
END
$function$;

COMMENT ON FUNCTION @extschema@.idem_outbox_ack(uuid[], bigint) IS
    'mark messages in flight under token as published (all or none); returns how many it marked';

/*
 * nack: the relay could not publish the message.  It becomes pending again,
 * available after retry_after, or by default after 1 s * 2^(attempts - 1),
 * at most 1 hour; or dead once it has been handed out
 * idempotency.outbox_max_attempts times.  Its key waits behind it either
 * way until it is published or dead.
 */
CREATE FUNCTION @extschema@.idem_outbox_nack(
    id uuid,
    token bigint,
    error jsonb,
    retry_after interval DEFAULT NULL)
RETURNS @extschema@.idem_outbox_status
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $function$
#variable_conflict use_column
DECLARE
    now_ts constant timestamptz := clock_timestamp();
    max_attempts constant integer :=
        coalesce(nullif(current_setting('idempotency.outbox_max_attempts', true), '')::integer, 10);
    new_status @extschema@.idem_outbox_status;
BEGIN
    IF id IS NULL THEN
        RAISE EXCEPTION 'id must not be null' USING ERRCODE = '22004';
    END IF;
    IF token IS NULL THEN
        RAISE EXCEPTION 'token must not be null' USING ERRCODE = '22004';
    END IF;
    IF token <= 0 THEN
        RAISE EXCEPTION 'token must be positive' USING ERRCODE = '22023',
            DETAIL = format('Fencing tokens start at 1; %s was given.', token);
    END IF;
    IF error IS NULL THEN
        RAISE EXCEPTION 'error must not be null' USING ERRCODE = '22004',
            HINT = 'Pass what the broker answered, for example jsonb_build_object(''error'', ''nack'').';
    END IF;
    -- last_error is an object or NULL, as the claim's own errors are
    IF jsonb_typeof(error) <> 'object' THEN
        RAISE EXCEPTION 'error must be a JSON object' USING ERRCODE = '22023',
            DETAIL = format('It is a JSON %s.', jsonb_typeof(error)),
            HINT = 'Pass what the broker answered, for example jsonb_build_object(''error'', ''nack'').';
    END IF;
    IF now_ts + retry_after < now_ts THEN
        RAISE EXCEPTION 'retry_after must not be negative' USING ERRCODE = '22023',
            DETAIL = format('The interval given was "%s".', retry_after);
    END IF;
    -- from PostgreSQL 17 an interval may be infinite: never due again
    IF NOT isfinite(now_ts + retry_after) THEN
        RAISE EXCEPTION 'retry_after must be finite' USING ERRCODE = '22023',
            DETAIL = format('The interval given was "%s".', retry_after);
    END IF;

    UPDATE @extschema@.idem_outbox o
    SET status = CASE WHEN o.attempts >= max_attempts THEN 'dead' ELSE 'pending' END::@extschema@.idem_outbox_status,
        available_at = CASE WHEN o.attempts >= max_attempts THEN NULL
                            ELSE now_ts + coalesce(retry_after,
                                     least(interval '1 hour',
                                           interval '1 second' * power(2, least(greatest(o.attempts - 1, 0), 12))))
                       END,
        lease_expires_at = NULL,
        last_error = idem_outbox_nack.error,
        updated_at = now_ts
    WHERE o.id = idem_outbox_nack.id AND o.token = idem_outbox_nack.token AND o.status = 'in_flight'
    RETURNING o.status INTO new_status;
    IF NOT FOUND THEN
        PERFORM @extschema@.idem_outbox_check_token(idem_outbox_nack.id, idem_outbox_nack.token, 'nack');
    END IF;
    PERFORM @extschema@.idem_outbox_counted(CASE new_status WHEN 'dead' THEN 'dead' ELSE 'retried' END, 1);
    RETURN new_status;
END
$function$;

COMMENT ON FUNCTION @extschema@.idem_outbox_nack(uuid, bigint, jsonb, interval) IS
    'give a message in flight back: pending after retry_after (default: exponential back-off) or dead after idempotency.outbox_max_attempts';

/*
 * An operator puts a dead message back: pending at once, its attempts
 * counted from 0, and a new seq, so that it goes after everything its key
 * emitted meanwhile (those were published while it was dead).  The new seq
 * is drawn under the emits' lock on the key, as an emit's is.
 */
CREATE FUNCTION @extschema@.idem_outbox_retry(id uuid)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $function$
#variable_conflict use_column
DECLARE
    now_ts constant timestamptz := clock_timestamp();
    current_status @extschema@.idem_outbox_status;
    m record;
BEGIN
    IF id IS NULL THEN
        RAISE EXCEPTION 'id must not be null' USING ERRCODE = '22004';
    END IF;
    SELECT o.scope, o.aggregatetype, o.aggregateid INTO m
    FROM @extschema@.idem_outbox o WHERE o.id = idem_outbox_retry.id;
    IF FOUND THEN
        PERFORM @extschema@.idem_outbox_lock_key(m.scope, m.aggregatetype, m.aggregateid);
    END IF;
    UPDATE @extschema@.idem_outbox o
    SET status = 'pending', available_at = now_ts, attempts = 0, updated_at = now_ts,
        seq = nextval('@extschema@.idem_outbox_seq'::regclass)
    WHERE o.id = idem_outbox_retry.id AND o.status = 'dead';
    IF NOT FOUND THEN
        SELECT o.status INTO current_status FROM @extschema@.idem_outbox o
        WHERE o.id = idem_outbox_retry.id;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'outbox message % does not exist', id
                USING ERRCODE = 'IK004',
                      DETAIL = 'It was never emitted, its transaction has not committed, or it was purged after its retention.';
        END IF;
        RAISE EXCEPTION 'cannot retry outbox message % because it is not dead', id
            USING ERRCODE = 'IK003',
                  DETAIL = format('Its status is "%s".', current_status);
    END IF;
    PERFORM @extschema@.idem_outbox_counted('retried', 1);
END
$function$;

COMMENT ON FUNCTION @extschema@.idem_outbox_retry(uuid) IS
    'put a dead outbox message back: pending now, attempts from 0, after the messages its key emitted meanwhile';

-- the emits' lock on a key (src/outbox.c), for idem_outbox_retry
CREATE FUNCTION @extschema@.idem_outbox_lock_key(scope text, topic text, key text)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_outbox_lock_key'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION @extschema@.idem_outbox_lock_key(text, text, text) IS
    'take the lock that serializes the emits of one (scope, topic, key) until the end of the transaction; used by idem_outbox_retry';

-- the relay functions' counts in idem_stats (a no-op without preloading)
CREATE FUNCTION @extschema@.idem_outbox_counted(counter text, n bigint)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_outbox_counted'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION @extschema@.idem_outbox_counted(text, bigint) IS
    'adds n to an outbox counter of idem_stats (published, retried, dead, taken_over); called by the relay functions';

REVOKE ALL ON TABLE @extschema@.idem_outbox FROM PUBLIC;
REVOKE ALL ON SEQUENCE @extschema@.idem_outbox_seq, @extschema@.idem_outbox_token FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION
    @extschema@.idem_outbox_emit(text, text, jsonb, text, jsonb, text, interval),
    @extschema@.idem_outbox_emit_batch(text, text[], jsonb[], text[], jsonb[], text, interval),
    @extschema@.idem_outbox_claim(text, integer, interval, text[]),
    @extschema@.idem_outbox_check_token(uuid, bigint, text),
    @extschema@.idem_outbox_ack(uuid[], bigint),
    @extschema@.idem_outbox_nack(uuid, bigint, jsonb, interval),
    @extschema@.idem_outbox_retry(uuid),
    @extschema@.idem_outbox_lock_key(text, text, text),
    @extschema@.idem_outbox_counted(text, bigint)
FROM PUBLIC;

/*
 * The outbox in operations, security and tenant isolation (issue 15).
 *
 * idem_stuck lists, after the records, the outbox messages that need a
 * person: dead ones, messages not yet published
 * idempotency.outbox_stuck_after (5 minutes) after they became due (their
 * available_at, so that neither a delay nor a nack's back-off counts), and
 * failing ones emitted that long ago.  Its columns
 * stay those of 0.1.0 (key is the message key, status is NULL for a
 * message), followed by topic, message_id and outbox_status.  The kinds
 * of idem_grant that read idem_stuck now read idem_outbox too, and roles
 * granted them before this update get it below.
 */
/*
 * The outbox's rows of idem_stuck come from a function, so that a role that
 * may read idem_stuck but not idem_outbox (granted so by hand before this
 * update) still reads the view: it gets the records' rows only, instead of
 * an error.  The function runs as the caller, under row-level security.
 */
CREATE FUNCTION @extschema@.idem_outbox_stuck()
RETURNS TABLE (scope text, key text, reason text, age interval, attempts integer,
               error jsonb, lease_expires_at timestamptz, created_at timestamptz,
               updated_at timestamptz, topic text, message_id uuid,
               outbox_status @extschema@.idem_outbox_status)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    stuck_after constant interval :=
        coalesce(nullif(current_setting('idempotency.outbox_stuck_after', true), '')::interval,
                 interval '5 minutes');
BEGIN
    IF NOT has_table_privilege('@extschema@.idem_outbox', 'SELECT') THEN
        RETURN;
    END IF;
    -- A live message's age counts from when it became due: a pending one
    -- delayed or backed off is not stuck before it may be handed out.  An
    -- in-flight one keeps the available_at it was claimed at, which is
    -- before its lease's expiry, so one whose lease expired stuck_after ago
    -- is listed too.  A message that keeps failing is never due for long (a
    -- relay claims it again as soon as it is), so a pending one that failed
    -- and was emitted stuck_after ago is listed as failing, aged from its
    -- emit: it holds up its key's later messages, which are listed too.
    RETURN QUERY
    SELECT o.scope::text, o.aggregateid::text,
           CASE WHEN o.status = 'dead' THEN 'dead message'
                WHEN o.available_at < clock_timestamp() - stuck_after THEN 'message not published'
                ELSE 'message failing' END,
           clock_timestamp() - CASE WHEN o.status <> 'dead'
                                     AND o.available_at < clock_timestamp() - stuck_after
                                    THEN o.available_at ELSE o.created_at END,
           o.attempts, o.last_error,
           o.lease_expires_at, o.created_at, o.updated_at, o.aggregatetype::text, o.id, o.status
    FROM @extschema@.idem_outbox o
    WHERE o.status = 'dead'
       OR (o.status IN ('pending', 'in_flight') AND o.available_at < clock_timestamp() - stuck_after)
       OR (o.status = 'pending' AND o.attempts > 0 AND o.created_at < clock_timestamp() - stuck_after);
END
$function$;

COMMENT ON FUNCTION @extschema@.idem_outbox_stuck() IS
    'the outbox rows of idem_stuck: dead messages and those not published after idempotency.outbox_stuck_after (none without SELECT on idem_outbox)';

CREATE OR REPLACE VIEW @extschema@.idem_stuck WITH (security_invoker = true) AS
SELECT * FROM (
    SELECT r.scope, r.key, r.status,
           CASE WHEN r.status OPERATOR(pg_catalog.=) 'unknown'
                THEN 'unknown outcome' ELSE 'lease expired' END AS reason,
           pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) r.created_at AS age,
           r.attempts, r.recovery_point, r.error, r.lease_expires_at,
           r.created_at, r.updated_at,
           NULL::pg_catalog.text AS topic, NULL::pg_catalog.uuid AS message_id,
           NULL::@extschema@.idem_outbox_status AS outbox_status
    FROM @extschema@.idempotency_records r
    WHERE r.status OPERATOR(pg_catalog.=) 'unknown'
       OR (r.status OPERATOR(pg_catalog.=) 'processing'
           AND r.lease_expires_at OPERATOR(pg_catalog.<) pg_catalog.clock_timestamp())
    UNION ALL
    SELECT o.scope COLLATE pg_catalog."C", o.key COLLATE pg_catalog."C", NULL::@extschema@.idem_status,
           o.reason, o.age, o.attempts, NULL::pg_catalog.text, o.error, o.lease_expires_at,
           o.created_at, o.updated_at, o.topic, o.message_id, o.outbox_status
    FROM @extschema@.idem_outbox_stuck() o
) stuck
ORDER BY created_at;

COMMENT ON VIEW @extschema@.idem_stuck IS
    'work that needs a person or a reconciler: unknown outcomes, abandoned leases, dead outbox messages and messages not published after idempotency.outbox_stuck_after, oldest first';

/*
 * The roles that idem_grant made readers of idem_stuck (reader, monitor,
 * reconciler: they read the records' results already) now read the outbox
 * too, and maintenance roles purge it.  A role is taken for one of those
 * kinds only when it holds all that the kind got in 0.1.0, so that a role
 * granted one of these privileges by hand (SELECT on idem_stuck for a
 * dashboard, DELETE on idem_inbox for a cleanup job) gets nothing more.
 */
DO $grants$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT a.grantee::pg_catalog.regrole AS role
        FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
        WHERE c.oid OPERATOR(pg_catalog.=) '@extschema@.idem_stuck'::pg_catalog.regclass
          AND a.privilege_type OPERATOR(pg_catalog.=) 'SELECT'
          AND a.grantee OPERATOR(pg_catalog.<>) 0
          AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
          AND pg_catalog.has_table_privilege(a.grantee, '@extschema@.idempotency_records', 'SELECT')
    LOOP
        EXECUTE pg_catalog.format('GRANT SELECT ON TABLE @extschema@.idem_outbox TO %s', r.role);
    END LOOP;
    FOR r IN
        SELECT DISTINCT a.grantee::pg_catalog.regrole AS role
        FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
        WHERE c.oid OPERATOR(pg_catalog.=) '@extschema@.idem_inbox'::pg_catalog.regclass
          AND a.privilege_type OPERATOR(pg_catalog.=) 'DELETE'
          AND a.grantee OPERATOR(pg_catalog.<>) 0
          AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
          AND pg_catalog.has_table_privilege(a.grantee, '@extschema@.idempotency_records', 'DELETE')
          AND pg_catalog.has_function_privilege(a.grantee, '@extschema@.idem_purge(integer, integer)', 'EXECUTE')
    LOOP
        EXECUTE pg_catalog.format('GRANT SELECT, UPDATE, DELETE ON TABLE @extschema@.idem_outbox TO %s', r.role);
    END LOOP;
END
$grants$;

/*
 * Tenant isolation covers the outbox by scope, as the records: the policy
 * idem_tenant (a range of scope under idempotency.scope), the policy of the
 * roles allowed tenants (idem_tenant_members), and row-level security
 * switched with the other tables by idem_tenant_isolation.  A relay sees
 * the messages of its tenant; a relay for every tenant needs BYPASSRLS.
 */
CREATE POLICY idem_tenant ON @extschema@.idem_outbox
    USING (@extschema@.idem_scope_in_tenant(scope))
    WITH CHECK (@extschema@.idem_scope_in_tenant(scope));

CREATE OR REPLACE FUNCTION @extschema@.idem_apply_settings()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    isolated constant boolean := TG_OP <> 'DELETE' AND NEW.tenant_isolation;
    t regclass;
BEGIN
    FOREACH t IN ARRAY ARRAY['@extschema@.idempotency_records', '@extschema@.idem_inbox',
                             '@extschema@.idem_inbox_streams', '@extschema@.idem_outbox']::regclass[] LOOP
        -- regclass prints a quoted, qualified name
        EXECUTE format('ALTER TABLE %s %s ROW LEVEL SECURITY, %s ROW LEVEL SECURITY', t,
                       CASE WHEN isolated THEN 'ENABLE' ELSE 'DISABLE' END,
                       CASE WHEN isolated THEN 'FORCE' ELSE 'NO FORCE' END);
    END LOOP;
    RETURN NULL;
END
$$;

-- a database isolated before this update isolates the outbox too, and the
-- roles allowed tenants get their policy on it
DO $isolate$
BEGIN
    IF EXISTS (SELECT FROM @extschema@.idem_settings s WHERE s.tenant_isolation) THEN
        ALTER TABLE @extschema@.idem_outbox ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
    END IF;
    IF EXISTS (SELECT FROM @extschema@.idem_tenant_members) THEN
        -- the trigger makes the policies again, now with the outbox
        UPDATE @extschema@.idem_tenant_members m SET tenant = m.tenant WHERE false;
    END IF;
END
$isolate$;

/*
 * idem_grant, defined once for 0.2.0: the kind global_reconciler (above),
 * the new argument lists of idem_complete, idem_fail and idem_resolve, the
 * global reconciler's UPDATE on response_headers (idem_resolve sets it), and
 * the outbox kinds emitter and relay (issue 15), and the batch inbox
 * (idem_inbox_accept_many and idem_inbox_accept_seq_many, below) for the
 * kind consumer.
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
        functions := format('%s.idem_purge(integer, integer)', s);
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

COMMENT ON FUNCTION @extschema@.idem_grant(text, regrole) IS
    'grant a role what one kind of user needs: client, reconciler, global_reconciler, reader, consumer, maintenance, machine_admin, monitor, emitter, relay';


/*
 * The batch inbox (issue 17): idem_inbox_accept_many accepts an array of
 * message ids in one statement and returns those new to the consumer, each
 * once, in the order of their first appearance (src/inbox_batch.c).  The
 * kind consumer of idem_grant may call it and idem_inbox_accept_seq_many
 * (below); roles that may call idem_inbox_accept (idem_inbox_accept_seq)
 * since before this update may call the batch form too.
 */
CREATE FUNCTION @extschema@.idem_inbox_accept_many(
    consumer text,
    message_ids text[],
    retention interval DEFAULT NULL,
    wait boolean DEFAULT true)
RETURNS SETOF text
AS 'MODULE_PATHNAME', 'idem_inbox_accept_many'
LANGUAGE C VOLATILE ROWS 100;

COMMENT ON FUNCTION @extschema@.idem_inbox_accept_many(text, text[], interval, boolean) IS
    'the message ids of a batch that a consumer sees for the first time (within retention), each once, in array order';

/*
 * idem_inbox_accept_seq_many: the outcome of each sequence number of a batch,
 * in array order, as idem_inbox_accept_seq called for each in turn, with one
 * lock and one update of the watermark row.
 */
CREATE FUNCTION @extschema@.idem_inbox_accept_seq_many(
    consumer text,
    stream text,
    seqs bigint[],
    accept_gap boolean DEFAULT false)
RETURNS TABLE (seq bigint, outcome text)
AS 'MODULE_PATHNAME', 'idem_inbox_accept_seq_many'
LANGUAGE C VOLATILE ROWS 100;

COMMENT ON FUNCTION @extschema@.idem_inbox_accept_seq_many(text, text, bigint[], boolean) IS
    'ordered de-duplication of a batch of sequence numbers, in array order: new | duplicate | gap for each';

REVOKE EXECUTE ON FUNCTION
    @extschema@.idem_inbox_accept_many(text, text[], interval, boolean),
    @extschema@.idem_inbox_accept_seq_many(text, text, bigint[], boolean)
FROM PUBLIC;

DO $grants$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT a.grantee::pg_catalog.regrole AS role, f.batch
        FROM (VALUES ('@extschema@.idem_inbox_accept(text, text, interval, boolean)'::pg_catalog.regprocedure,
                      '@extschema@.idem_inbox_accept_many(text, text[], interval, boolean)'::pg_catalog.regprocedure),
                     ('@extschema@.idem_inbox_accept_seq(text, text, bigint, boolean)'::pg_catalog.regprocedure,
                      '@extschema@.idem_inbox_accept_seq_many(text, text, bigint[], boolean)'::pg_catalog.regprocedure)
             ) f(single, batch),
             pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
        WHERE p.oid OPERATOR(pg_catalog.=) f.single
          AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
          AND a.grantee OPERATOR(pg_catalog.<>) 0
          AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s', r.batch, r.role);
    END LOOP;
END
$grants$;
