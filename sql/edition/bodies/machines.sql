-- State machines (src/machine.c, src/transition.c) in the SQL edition: the
-- enforcing triggers, the WHEN function of the AFTER INSERT check and
-- idem_transition (generate.py says how this file is read).
--
-- What the C edition keeps in per-backend caches (compiled machines, the
-- trigger's column and cast) is read here from the tables and the catalog at
-- every row, with static statements (cached plans).  The records' own
-- machine (idem.record on idempotency_records.status, on every claim) takes
-- a path of its own that reads nothing but the machine.
--
-- Reading the definitions needs no privilege (a machine governs writers who
-- may not read it, like a constraint): the triggers run as the writer, so
-- they read the definition through idem_sql_machine_check and
-- idem_sql_machine_sources, the only SECURITY DEFINER functions here.
--
-- Rows in flight between partitions (src/machine.c, "Rows in flight"): the
-- C edition's notes are per-backend memory, checked against the old
-- version's heap tuple.  Here a note is a session setting
-- (idempotency.sql_machine_leaving / _arrived, JSON), and a row arriving by
-- an UPDATE's row movement is told from a new row by: the same transaction,
-- top-level statement and trigger depth; another partition of the same
-- attachment (the root trigger); a row deleted from the source partition by
-- this transaction since the note (pg_stat_get_xact_tuples_deleted); and the
-- same row (its primary key, hashed).
--
-- What differs from the C edition (for the README's table):
--  - Definitions are read with the statement's snapshot, not the latest one:
--    under REPEATABLE READ and SERIALIZABLE a redefinition committed after
--    the transaction's snapshot applies from its next transaction (under
--    READ COMMITTED from the next statement, as in C).  PL/pgSQL has no
--    read outside the transaction's snapshot.
--  - The notes are session settings, which the session may set itself: a
--    role that can also UPDATE or DELETE rows of a partitioned governed
--    table can forge one and insert a row in a state one legal move away
--    from another (a state it could reach by legal moves anyway).
--  - A row whose primary key a trigger changes between the source's check
--    and the destination's (a BEFORE UPDATE trigger sorting after ours, a
--    BEFORE INSERT trigger of the destination sorting before ours) is
--    checked as a new row; so is a row of a table without a primary key
--    whose other columns such a trigger changes.

--@ internal

-- The machine "machine_name", for a row of rel_name whose column col moves
-- from from_s to to_s (mode 'u', check_move), starts in to_s (mode 'n'), or
-- may start in to_s (mode 'i': answers, refuses nothing).  Raises IK005 as
-- src/machine.c's report_invalid_move; for a missing machine 42704 naming
-- the trigger trig, or NULL when trig is NULL.  SECURITY DEFINER: writers
-- may not be able to read the definitions (README, "Privileges").
CREATE FUNCTION @extschema@.idem_sql_machine_check(machine_name text, mode "char", from_s text, to_s text,
                                                   rel_name text, col text, trig text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    states text[];
    initial text[];
    n integer;
    rf text;
    rt text;
    list text;
BEGIN
    -- (one plain statement each, so that their plans are generic and cached)
    SELECT m.states, m.initial_states INTO states, initial
      FROM @extschema@.idem_machines m
     WHERE m.name = machine_name;
    IF NOT FOUND OR octet_length(machine_name) >= 64 THEN
        IF trig IS NULL THEN
            RETURN NULL;
        END IF;
        RAISE EXCEPTION 'state machine "%" does not exist', machine_name
            USING ERRCODE = '42704',
                  DETAIL = format('Trigger "%s" of table "%s" enforces it.', trig, rel_name);
    END IF;
    IF cardinality(states) > 1000 THEN
        n := cardinality(array_remove(states, NULL));
        IF n > 1000 THEN
            RAISE EXCEPTION 'state machine "%" has % states, more than the % allowed', machine_name, n, 1000
                USING ERRCODE = '54000';
        END IF;
    END IF;

    IF mode = 'u' THEN
        -- staying is allowed, so is NULL to NULL; from NULL is entering the machine
        IF to_s IS NULL THEN
            IF from_s IS NULL THEN
                RETURN true;
            END IF;
            rf := from_s;
        ELSIF from_s = to_s THEN
            RETURN true;
        ELSIF NOT coalesce(to_s = ANY (states), false) THEN
            rf := from_s;
            rt := to_s;
        ELSIF from_s IS NULL THEN
            IF cardinality(initial) = 0 OR to_s = ANY (initial) THEN
                RETURN true;
            ELSIF NOT EXISTS (SELECT FROM unnest(initial) i WHERE i = ANY (states)) THEN
                RETURN true;    -- none of the initial states is a state
            END IF;
            rt := to_s;
        ELSIF coalesce(from_s = ANY (states), false)
              AND EXISTS (SELECT FROM @extschema@.idem_machine_moves v
                          WHERE v.machine = machine_name AND v.from_state = from_s AND v.to_state = to_s) THEN
            RETURN true;
        ELSE
            rf := from_s;
            rt := to_s;
        END IF;
    ELSE
        -- an initial state, or any state when the machine declares none
        -- (expressions without a subquery are evaluated without the executor)
        IF coalesce(to_s = ANY (states), false) THEN
            IF cardinality(initial) = 0 OR to_s = ANY (initial) THEN
                RETURN true;
            ELSIF NOT EXISTS (SELECT FROM unnest(initial) i WHERE i = ANY (states)) THEN
                RETURN true;
            END IF;
        END IF;
        IF mode = 'i' THEN
            RETURN false;
        END IF;
        rt := to_s;
    END IF;

    -- report_invalid_move(from = rf, to = rt)
    IF rt IS NULL AND rf IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'IK005',
            MESSAGE = format('invalid initial state NULL in column "%s" of table "%s"', col, rel_name),
            DETAIL = format('NULL is not a state of state machine "%s".', machine_name);
    ELSIF rt IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'IK005',
            MESSAGE = format('invalid transition from "%s" to NULL in column "%s" of table "%s"', rf, col, rel_name),
            DETAIL = format('NULL is not a state of state machine "%s".', machine_name);
    ELSIF NOT coalesce(rt = ANY (states), false) THEN
        RAISE EXCEPTION USING ERRCODE = 'IK005',
            MESSAGE = CASE WHEN rf IS NULL
                           THEN format('invalid initial state "%s" in column "%s" of table "%s"', rt, col, rel_name)
                           ELSE format('invalid transition from "%s" to "%s" in column "%s" of table "%s"',
                                       rf, rt, col, rel_name) END,
            DETAIL = format('"%s" is not a state of state machine "%s".', rt, machine_name);
    ELSIF rf IS NULL THEN
        SELECT string_agg(format('"%s"', s), ', ' ORDER BY s COLLATE "C") INTO list
          FROM (SELECT DISTINCT s FROM unnest(states) s WHERE s = ANY (initial)) d;
        RAISE EXCEPTION USING ERRCODE = 'IK005',
            MESSAGE = format('invalid initial state "%s" in column "%s" of table "%s"', rt, col, rel_name),
            DETAIL = format('State machine "%s" starts in %s only.', machine_name, list);
    ELSIF NOT coalesce(rf = ANY (states), false) THEN
        RAISE EXCEPTION USING ERRCODE = 'IK005',
            MESSAGE = format('invalid transition from "%s" to "%s" in column "%s" of table "%s"', rf, rt, col, rel_name),
            DETAIL = format('"%s" is not a state of state machine "%s".', rf, machine_name);
    END IF;
    SELECT string_agg(format('"%s"', s), ', ' ORDER BY s COLLATE "C") INTO list
      FROM (SELECT DISTINCT s FROM unnest(states) s
             WHERE EXISTS (SELECT FROM @extschema@.idem_machine_moves v
                           WHERE v.machine = machine_name AND v.from_state = rf AND v.to_state = s)) d;
    RAISE EXCEPTION USING ERRCODE = 'IK005',
        MESSAGE = format('invalid transition from "%s" to "%s" in column "%s" of table "%s"', rf, rt, col, rel_name),
        DETAIL = CASE WHEN list IS NOT NULL
                      THEN format('State machine "%s" allows from "%s" only: %s.', machine_name, rf, list)
                      ELSE format('"%s" is a terminal state of state machine "%s".', rf, machine_name) END;
END
$fn$;

-- The states of machine "machine_name" with a move to to_s, in strcmp order
-- (idem_transition's from_states when it is NULL); its errors are
-- src/transition.c's.  SECURITY DEFINER for the reason above.
CREATE FUNCTION @extschema@.idem_sql_machine_sources(machine_name text, to_s text)
RETURNS text[]
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    states text[];
    n integer;
BEGIN
    SELECT m.states INTO states FROM @extschema@.idem_machines m WHERE m.name = machine_name;
    IF NOT FOUND OR octet_length(machine_name) >= 64 THEN
        RAISE EXCEPTION 'state machine "%" does not exist', machine_name USING ERRCODE = '42704';
    END IF;
    IF cardinality(states) > 1000 THEN
        n := cardinality(array_remove(states, NULL));
        IF n > 1000 THEN
            RAISE EXCEPTION 'state machine "%" has % states, more than the % allowed', machine_name, n, 1000
                USING ERRCODE = '54000';
        END IF;
    END IF;
    IF NOT coalesce(to_s = ANY (states), false) THEN
        RAISE EXCEPTION '"%" is not a state of state machine "%"', to_s, machine_name USING ERRCODE = '22023';
    END IF;
    RETURN ARRAY(SELECT s FROM (SELECT DISTINCT s FROM unnest(states) s
                                 WHERE EXISTS (SELECT FROM @extschema@.idem_machine_moves v
                                               WHERE v.machine = machine_name AND v.from_state = s
                                                 AND v.to_state = to_s)) d
                 ORDER BY s COLLATE "C");
END
$fn$;

-- How the triggers read a state of type typ, as "col::text" would cast it
-- (src/machine.c's prepare_text_cast): 'j' from to_jsonb, whose text is the
-- cast's for these types (an enum's label, true/false, the digits); 'b' the
-- same without char(n)'s padding; 'x' by the cast itself (EXECUTE).
CREATE FUNCTION @extschema@.idem_sql_machine_how(typ oid)
RETURNS "char"
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    kind "char";
    base oid;
BEGIN
    -- bool, name, int8, int2, int4, text, varchar, numeric, uuid
    IF typ IN (16, 19, 20, 21, 23, 25, 1043, 1700, 2950) THEN
        RETURN 'j';
    ELSIF typ = 1042 THEN   -- bpchar
        RETURN 'b';
    ELSIF typ < 16384 THEN
        RETURN 'x';
    END IF;
    SELECT t.typtype, t.typbasetype INTO kind, base FROM pg_type t WHERE t.oid = typ;
    IF kind = 'e' THEN
        RETURN 'j';
    ELSIF kind = 'd' THEN
        RETURN @extschema@.idem_sql_machine_how(base);
    END IF;
    RETURN 'x';
END
$fn$;

-- The trigger's column col of relation relid: how to read it (above), or
-- the trigger's error for a column that is not (any more) there.
CREATE FUNCTION @extschema@.idem_sql_machine_column(relid oid, col text, trig text, rel_name text)
RETURNS "char"
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    num smallint;
    typ oid;
BEGIN
    SELECT a.attnum, a.atttypid INTO num, typ
      FROM pg_attribute a
     WHERE a.attrelid = relid AND a.attname = col::name AND NOT a.attisdropped
       AND octet_length(col) < 64;
    IF num IS NULL OR num <= 0 THEN
        RAISE EXCEPTION 'column "%" of relation "%" does not exist', col, rel_name
            USING ERRCODE = '42703',
                  HINT = format('Trigger "%s" names it: detach the machine with that column name, then attach it again.',
                                trig);
    END IF;
    RETURN @extschema@.idem_sql_machine_how(typ);
END
$fn$;

-- The state of column col in row r, read as idem_sql_machine_column says.
CREATE FUNCTION @extschema@.idem_sql_machine_state(r anyelement, col text, how "char")
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    state text;
BEGIN
    IF how = 'j' THEN
        RETURN to_jsonb(r) ->> col;
    ELSIF how = 'b' THEN
        RETURN rtrim(to_jsonb(r) ->> col, ' ');
    END IF;
    EXECUTE format('SELECT ($1).%I::pg_catalog.text', col) INTO state USING r;
    RETURN state;
END
$fn$;

-- A row between two partitions, as the notes name it: a digest of its
-- primary key (without the state column, which may be part of it), or of
-- all its columns but the state when there is no such key.  The key, not
-- the whole row: the destination's own BEFORE INSERT triggers may fill
-- other columns.
CREATE FUNCTION @extschema@.idem_sql_machine_row(r jsonb, keycols text[], col text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    RETURN md5(coalesce((SELECT jsonb_object_agg(e.key, e.value) FROM jsonb_each(r) e
                          WHERE e.key = ANY (keycols) AND e.key <> col),
                        r - col)::text);
END
$fn$;

-- Stores a note of the rows in flight (src/machine.c, "Rows in flight"):
-- empty once it holds no column.
CREATE FUNCTION @extschema@.idem_sql_machine_note(setting text, note jsonb)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    PERFORM set_config(setting,
                       CASE WHEN note IS NULL OR note -> 'c' = '{}'::jsonb THEN '' ELSE note::text END,
                       false);
END
$fn$;

--@ idem_enforce_transition()
-- BEFORE INSERT OR UPDATE ... FOR EACH ROW, idem_enforce_transition(machine,
-- column): src/machine.c says what it lets through.
LANGUAGE plpgsql
AS $body$
DECLARE
    col text;
    num smallint;
    typ oid;
    how "char";
    part boolean := false;
    attachment oid;
    keycols text[];
    f text;
    t text;
    depth integer;
    raw text;
    note jsonb;
    entry jsonb;
    xid text;
BEGIN
    -- The records' own machine, at every claim: the column is known, the
    -- table is no partition, a state of the machine may start a row.  (Few
    -- statements, none with a subquery: PL/pgSQL evaluates each without the
    -- executor.)
    IF TG_RELID = '@extschema@.idempotency_records'::regclass AND TG_NARGS = 2 AND TG_ARGV[1] = 'status'
       AND TG_WHEN = 'BEFORE' AND TG_LEVEL = 'ROW' THEN
        IF TG_OP = 'UPDATE' THEN
            PERFORM @extschema@.idem_sql_machine_check(TG_ARGV[0], 'u', OLD.status::text, NEW.status::text,
                                                       TG_TABLE_NAME, 'status', TG_NAME);
            RETURN NEW;
        ELSIF TG_OP = 'INSERT'
              AND @extschema@.idem_sql_machine_check(TG_ARGV[0], 'i', NULL, NEW.status::text,
                                                     TG_TABLE_NAME, 'status', TG_NAME)
              AND coalesce(current_setting('idempotency.sql_machine_arrived', true), '') = '' THEN
            RETURN NEW;
        END IF;
    END IF;

    IF TG_WHEN <> 'BEFORE' OR TG_LEVEL <> 'ROW' OR TG_OP NOT IN ('INSERT', 'UPDATE') THEN
        RAISE EXCEPTION 'idem_enforce_transition must be fired BEFORE INSERT OR UPDATE FOR EACH ROW'
            USING ERRCODE = '39P01';
    END IF;
    IF TG_NARGS <> 2 THEN
        RAISE EXCEPTION USING ERRCODE = '39P01',
            MESSAGE = format('trigger "%s" of table "%s" must pass %s a machine and a column',
                             TG_NAME, TG_TABLE_NAME, 'idem_enforce_transition');
    END IF;
    col := TG_ARGV[1];
    IF TG_RELID = '@extschema@.idempotency_records'::regclass AND col = 'status' THEN
        t := NEW.status::text;
        IF TG_OP = 'UPDATE' THEN
            f := OLD.status::text;
        END IF;
    ELSE
        -- (a few index scans of the catalog a row: what the C edition caches)
        SELECT a.attnum, a.atttypid, c.relispartition INTO num, typ, part
          FROM pg_class c
          LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = col::name AND NOT a.attisdropped
                                  AND octet_length(col) < 64
         WHERE c.oid = TG_RELID;
        IF num > 0 THEN
            how := CASE WHEN typ IN (16, 19, 20, 21, 23, 25, 1043, 1700, 2950) THEN 'j'
                        ELSE @extschema@.idem_sql_machine_how(typ) END;
        END IF;
        IF part THEN
            -- the attachment: the trigger this one is a clone of, or itself
            WITH RECURSIVE up(oid, parent) AS (
                SELECT g.oid, g.tgparentid FROM pg_trigger g
                 WHERE g.tgrelid = TG_RELID AND g.tgname = TG_NAME
                UNION ALL
                SELECT p.oid, p.tgparentid FROM pg_trigger p, up WHERE p.oid = up.parent)
            SELECT up.oid INTO attachment FROM up WHERE up.parent = 0;
            -- the row's identity between the partitions: its primary key
            SELECT array_agg(a.attname::text) INTO keycols
              FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
             WHERE i.indrelid = TG_RELID AND i.indisprimary;
        END IF;
        IF how IS NULL THEN
            RAISE EXCEPTION 'column "%" of relation "%" does not exist', col, TG_TABLE_NAME
                USING ERRCODE = '42703',
                      HINT = format('Trigger "%s" names it: detach the machine with that column name, then attach it again.',
                                    TG_NAME);
        ELSIF how = 'j' THEN
            t := to_jsonb(NEW) ->> col;
            IF TG_OP = 'UPDATE' THEN
                f := to_jsonb(OLD) ->> col;
            END IF;
        ELSE
            t := @extschema@.idem_sql_machine_state(NEW, col, how);
            IF TG_OP = 'UPDATE' THEN
                f := @extschema@.idem_sql_machine_state(OLD, col, how);
            END IF;
        END IF;
    END IF;

    IF TG_OP = 'UPDATE' THEN
        PERFORM @extschema@.idem_sql_machine_check(TG_ARGV[0], 'u', f, t, TG_TABLE_NAME, col, TG_NAME);
        IF part THEN
            -- the row may be about to move to another partition: the note
            -- "leaving", per column, of this row of this partition
            depth := pg_trigger_depth();
            xid := pg_current_xact_id()::text;
            entry := jsonb_build_object('a', attachment, 'f', f, 'h', @extschema@.idem_sql_machine_row(to_jsonb(NEW), keycols, col),
                                        'n', pg_stat_get_xact_tuples_deleted(TG_RELID));
            raw := current_setting('idempotency.sql_machine_leaving', true);
            IF raw <> '' THEN
                note := raw::jsonb;
            END IF;
            IF note IS NULL OR note ->> 'x' IS DISTINCT FROM xid
               OR note ->> 's' IS DISTINCT FROM statement_timestamp()::text
               OR (note ->> 'd')::integer IS DISTINCT FROM depth
               OR (note ->> 'r')::oid IS DISTINCT FROM TG_RELID
               OR note ->> 'k' IS DISTINCT FROM md5(to_jsonb(OLD)::text) THEN
                note := jsonb_build_object('x', xid, 's', statement_timestamp()::text, 'd', depth, 'r', TG_RELID,
                                           'k', md5(to_jsonb(OLD)::text), 'c', '{}'::jsonb);
            END IF;
            note := jsonb_set(note, ARRAY['c', col], entry);
            PERFORM set_config('idempotency.sql_machine_leaving', note::text, false);
        END IF;
        RETURN NEW;
    END IF;

    depth := pg_trigger_depth();
    IF part THEN
        -- a row arriving by an UPDATE's row movement is checked as the move it is
        raw := current_setting('idempotency.sql_machine_leaving', true);
        IF raw <> '' THEN
            note := raw::jsonb;
            entry := note -> 'c' -> col;
            IF entry IS NOT NULL
               AND note ->> 'x' = pg_current_xact_id_if_assigned()::text
               AND note ->> 's' = statement_timestamp()::text
               AND (note ->> 'd')::integer = depth
               AND (note ->> 'r')::oid <> TG_RELID THEN
                note := jsonb_set(note, '{c}', (note -> 'c') - col);
                IF (entry ->> 'a')::oid = attachment THEN
                    IF (NOT current_setting('track_counts')::boolean
                        OR pg_stat_get_xact_tuples_deleted((note ->> 'r')::oid) > (entry ->> 'n')::bigint)
                       AND entry ->> 'h' = @extschema@.idem_sql_machine_row(to_jsonb(NEW), keycols, col) THEN
                        PERFORM @extschema@.idem_sql_machine_note('idempotency.sql_machine_leaving', note);
                        PERFORM @extschema@.idem_sql_machine_check(TG_ARGV[0], 'u', entry ->> 'f', t,
                                                                   TG_TABLE_NAME, col, TG_NAME);
                        -- the note "arrived" for the WHEN clause of the AFTER INSERT check
                        xid := pg_current_xact_id_if_assigned()::text;
                        note := NULL;
                        raw := current_setting('idempotency.sql_machine_arrived', true);
                        IF raw <> '' THEN
                            note := raw::jsonb;
                        END IF;
                        IF note IS NULL OR note ->> 'x' IS DISTINCT FROM xid
                           OR (note ->> 'd')::integer IS DISTINCT FROM depth
                           OR (note ->> 'r')::oid IS DISTINCT FROM TG_RELID THEN
                            note := jsonb_build_object('x', xid, 'd', depth, 'r', TG_RELID, 'c', '{}'::jsonb);
                        END IF;
                        note := jsonb_set(note, ARRAY['c', col], jsonb_build_object('f', entry -> 'f', 't', t));
                        PERFORM set_config('idempotency.sql_machine_arrived', note::text, false);
                        RETURN NEW;
                    END IF;
                    -- not a row this command moved: the note is void
                    note := NULL;
                END IF;
                PERFORM @extschema@.idem_sql_machine_note('idempotency.sql_machine_leaving', note);
            END IF;
        END IF;
    END IF;

    -- A new row, or only a proposed one (INSERT ... ON CONFLICT): not in an
    -- initial state, it passes when the AFTER INSERT check fires with this
    -- trigger and will refuse it if it is really inserted.
    IF @extschema@.idem_sql_machine_check(TG_ARGV[0], 'i', NULL, t, TG_TABLE_NAME, col, TG_NAME) THEN
        NULL;
    ELSIF NOT EXISTS (
           SELECT FROM pg_trigger me, pg_trigger a
            WHERE me.tgrelid = TG_RELID AND me.tgname = TG_NAME
              AND a.tgrelid = TG_RELID
              AND a.tgfoid = '@extschema@.idem_enforce_initial_state()'::regprocedure
              AND a.tgtype & (1 | 2 | 4 | 64) = (1 | 4)      -- ROW, AFTER, INSERT
              AND a.tgnargs = 2 AND a.tgargs = me.tgargs
              AND (a.tgenabled = 'A' OR a.tgenabled = me.tgenabled)) THEN
        PERFORM @extschema@.idem_sql_machine_check(TG_ARGV[0], 'n', NULL, t, TG_TABLE_NAME, col, TG_NAME);
    END IF;
    -- whatever note "arrived" this column has here is not this row's (and
    -- one of another transaction is nobody's)
    raw := current_setting('idempotency.sql_machine_arrived', true);
    IF raw <> '' THEN
        note := raw::jsonb;
        IF note ->> 'x' IS DISTINCT FROM pg_current_xact_id_if_assigned()::text THEN
            PERFORM @extschema@.idem_sql_machine_note('idempotency.sql_machine_arrived', NULL);
        ELSIF (note ->> 'r')::oid = TG_RELID AND (note ->> 'd')::integer = depth AND note -> 'c' ? col THEN
            PERFORM @extschema@.idem_sql_machine_note('idempotency.sql_machine_arrived',
                                                      jsonb_set(note, '{c}', (note -> 'c') - col));
        END IF;
    END IF;
    RETURN NEW;
END
$body$;

--@ idem_inserted_unchecked(text, name, oid, text)
-- The WHEN clause of the AFTER INSERT check, evaluated as each row is
-- stored: false for a row that arrived by row movement (checked again here
-- if it is stored in another state than the one checked), otherwise whether
-- "state" may not start a row.
LANGUAGE plpgsql
AS $body$
DECLARE
    raw text;
    note jsonb;
    checked jsonb;
    allowed boolean;
BEGIN
    IF machine IS NULL OR state_column IS NULL OR relation IS NULL THEN
        RETURN true;
    END IF;
    raw := current_setting('idempotency.sql_machine_arrived', true);
    IF raw <> '' THEN
        note := raw::jsonb;
        IF note ->> 'x' = pg_current_xact_id_if_assigned()::text
           AND (note ->> 'r')::oid = relation
           AND (note ->> 'd')::integer = pg_trigger_depth() + 1
           AND note -> 'c' ? state_column::text THEN
            checked := note -> 'c' -> state_column::text;
            PERFORM @extschema@.idem_sql_machine_note('idempotency.sql_machine_arrived',
                                                      jsonb_set(note, '{c}', (note -> 'c') - state_column::text));
            IF checked ->> 't' IS NOT DISTINCT FROM state THEN
                RETURN false;
            END IF;
        END IF;
    END IF;
    allowed := @extschema@.idem_sql_machine_check(machine, 'i', NULL, state, NULL, NULL, NULL);
    IF allowed IS NULL THEN
        RETURN true;     -- no such machine: the trigger reports it
    END IF;
    IF checked IS NOT NULL THEN
        PERFORM @extschema@.idem_sql_machine_check(machine, 'u', checked ->> 'f', state,
                                                   (SELECT c.relname::text FROM pg_class c WHERE c.oid = relation),
                                                   state_column::text, NULL);
        RETURN false;
    END IF;
    RETURN NOT allowed;
END
$body$;

--@ idem_enforce_initial_state()
-- AFTER INSERT ... FOR EACH ROW, WHEN (idem_inserted_unchecked(...)): a row
-- really inserted must start in an initial state.
LANGUAGE plpgsql
AS $body$
BEGIN
    IF TG_WHEN <> 'AFTER' OR TG_LEVEL <> 'ROW' OR TG_OP <> 'INSERT' THEN
        RAISE EXCEPTION 'idem_enforce_initial_state must be fired AFTER INSERT FOR EACH ROW'
            USING ERRCODE = '39P01';
    END IF;
    IF TG_NARGS <> 2 THEN
        RAISE EXCEPTION USING ERRCODE = '39P01',
            MESSAGE = format('trigger "%s" of table "%s" must pass %s a machine and a column',
                             TG_NAME, TG_TABLE_NAME, 'idem_enforce_initial_state');
    END IF;
    PERFORM @extschema@.idem_sql_machine_check(
        TG_ARGV[0], 'n', NULL,
        @extschema@.idem_sql_machine_state(
            NEW, TG_ARGV[1], @extschema@.idem_sql_machine_column(TG_RELID, TG_ARGV[1], TG_NAME, TG_TABLE_NAME)),
        TG_TABLE_NAME, TG_ARGV[1], TG_NAME);
    RETURN NULL;
END
$body$;

--@ idem_transition(regclass, text, text, text[], name)
LANGUAGE plpgsql
AS $body$
BEGIN
    IF table_name IS NULL THEN
        RAISE EXCEPTION 'table_name must not be null' USING ERRCODE = '22004';
    ELSIF key IS NULL THEN
        RAISE EXCEPTION 'key must not be null' USING ERRCODE = '22004';
    ELSIF to_state IS NULL THEN
        RAISE EXCEPTION 'to_state must not be null' USING ERRCODE = '22004';
    END IF;
    RETURN @extschema@.idem_transition(table_name, ARRAY[key], to_state, from_states, state_column);
END
$body$;

--@ idem_transition(regclass, text[], text, text[], name)
-- A compare-and-set by primary key (src/transition.c):
--   UPDATE t SET col = to WHERE pk = key AND col::text = ANY (from) AND col::text <> to
-- then, if it matched nothing, a read of the row: 'already' or 'rejected'.
-- The statements are built from the catalog as src/transition.c builds them
-- (quoted names, the primary key's equality operators, the key as text cast
-- to each column's type) and run as the caller, without sequential scans.
LANGUAGE plpgsql
AS $body$
DECLARE
    rel record;
    machine_name text;
    column_name text;
    n bigint;
    col record;
    sources text[];
    nkeys integer;
    lefts text[];
    rights text[];
    cond_update text;
    cond_select text;
    target text;
    current_state text;
    saved_seqscan text;
BEGIN
    IF table_name IS NULL THEN
        RAISE EXCEPTION 'table_name must not be null' USING ERRCODE = '22004';
    ELSIF key IS NULL THEN
        RAISE EXCEPTION 'key must not be null' USING ERRCODE = '22004';
    ELSIF to_state IS NULL THEN
        RAISE EXCEPTION 'to_state must not be null' USING ERRCODE = '22004';
    END IF;

    SELECT c.relname, c.relkind, c.relhassubclass, s.nspname,
           has_any_column_privilege(c.oid, 'UPDATE') AS may_update
      INTO rel
      FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
     WHERE c.oid = table_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'relation with OID % does not exist', table_name::oid USING ERRCODE = '42P01';
    END IF;
    IF NOT rel.may_update THEN
        RAISE EXCEPTION 'permission denied for % %',
                CASE rel.relkind WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view'
                                 WHEN 'f' THEN 'foreign table' WHEN 'S' THEN 'sequence'
                                 WHEN 'i' THEN 'index' WHEN 'I' THEN 'index' WHEN 'c' THEN 'type'
                                 ELSE 'table' END,
                rel.relname
            USING ERRCODE = '42501';
    END IF;

    -- the enforcing trigger of state_column (or the only one)
    SELECT count(*), min(@extschema@.idem_trigger_arg(t.tgargs, 1)), min(@extschema@.idem_trigger_arg(t.tgargs, 2))
      INTO n, machine_name, column_name
      FROM pg_trigger t
     WHERE t.tgrelid = table_name
       AND t.tgfoid = '@extschema@.idem_enforce_transition()'::regprocedure
       AND t.tgnargs = 2
       AND (state_column IS NULL OR @extschema@.idem_trigger_arg(t.tgargs, 2) = state_column::text);
    IF n = 0 THEN
        RAISE EXCEPTION USING ERRCODE = '42704',
            MESSAGE = CASE WHEN state_column IS NOT NULL
                           THEN format('column "%s" of table "%s" has no state machine', state_column, rel.relname)
                           ELSE format('table "%s" has no state machine', rel.relname) END,
            HINT = 'Attach one with idem_attach_machine().';
    ELSIF n > 1 THEN
        RAISE EXCEPTION 'table "%" has more than one state machine', rel.relname
            USING ERRCODE = '42702', HINT = 'Name the column with state_column => ...';
    END IF;

    -- the machine's triggers do not fire for the rows of inheritance children
    IF rel.relkind <> 'p' AND rel.relhassubclass
       AND EXISTS (SELECT FROM pg_inherits i WHERE i.inhparent = table_name) THEN
        RAISE EXCEPTION 'table "%" has inheritance children', rel.relname
            USING ERRCODE = '0A000',
                  DETAIL = format('State machine "%s" governs the rows of table "%s" only, not those of its children.',
                                  machine_name, rel.relname),
                  HINT = 'Attach the machine to each child table, and call idem_transition on the child that holds the row.';
    END IF;
    SELECT a.attnum, a.atttypid, a.atttypmod INTO col
      FROM pg_attribute a
     WHERE a.attrelid = table_name AND a.attname = column_name::name AND NOT a.attisdropped
       AND octet_length(column_name) < 64;
    IF col.attnum IS NULL OR col.attnum <= 0 THEN
        RAISE EXCEPTION 'column "%" of relation "%" does not exist', column_name, rel.relname
            USING ERRCODE = '42703';
    END IF;

    -- the machine (its latest definition), the target, the sources
    sources := @extschema@.idem_sql_machine_sources(machine_name, to_state);

    IF array_ndims(key) > 1 THEN
        RAISE EXCEPTION 'key must be a one-dimensional array'
            USING ERRCODE = '22023',
                  HINT = 'Pass the primary key''s values in primary key order, as in ARRAY[''a'', ''1''].';
    ELSIF array_position(key, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'key must not contain nulls' USING ERRCODE = '22004';
    END IF;

    -- "pk1 OPERATOR(...) ($2)[1]::type AND ..." from the primary key, in key
    -- order (src/transition.c's append_key_condition)
    SELECT count(*),
           array_agg(format('%I', a.attname)
                     || CASE WHEN a.atttypid <> o.oprleft
                             THEN format('::%I.%I', ln.nspname, lt.typname) ELSE '' END
                     || format(' OPERATOR(%I.%s) ', opn.nspname, o.oprname) ORDER BY k.ord),
           array_agg(CASE WHEN o.oprright <> 'pg_catalog.text'::regtype
                          THEN format('::%I.%I', rn.nspname, rt.typname) ELSE '' END ORDER BY k.ord)
      INTO nkeys, lefts, rights
      FROM pg_index i
     CROSS JOIN LATERAL unnest(i.indkey::int2[], i.indclass::oid[]) WITH ORDINALITY AS k(attnum, opclass, ord)
      JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
      JOIN pg_opclass oc ON oc.oid = k.opclass
      LEFT JOIN pg_amop am ON am.amopfamily = oc.opcfamily AND am.amoplefttype = oc.opcintype
                          AND am.amoprighttype = oc.opcintype AND am.amopstrategy = 3
      LEFT JOIN pg_operator o ON o.oid = am.amopopr
      LEFT JOIN pg_namespace opn ON opn.oid = o.oprnamespace
      LEFT JOIN pg_type lt ON lt.oid = o.oprleft
      LEFT JOIN pg_namespace ln ON ln.oid = lt.typnamespace
      LEFT JOIN pg_type rt ON rt.oid = o.oprright
      LEFT JOIN pg_namespace rn ON rn.oid = rt.typnamespace
     WHERE i.indrelid = table_name AND i.indisprimary AND i.indisvalid AND i.indimmediate
       AND k.ord <= i.indnkeyatts;
    IF nkeys = 0 THEN
        RAISE EXCEPTION 'table "%" has no primary key', rel.relname
            USING ERRCODE = '55000', HINT = 'idem_transition addresses rows by primary key.';
    END IF;
    FOR i IN 1 .. nkeys LOOP
        IF lefts[i] IS NULL THEN
            RAISE EXCEPTION 'missing equality operator for primary key column %', i USING ERRCODE = 'XX000';
        END IF;
        -- the UPDATE takes the key as $2, the SELECT as $1
        cond_update := concat_ws(' AND ', cond_update, format('%s($2)[%s]%s', lefts[i], i, rights[i]));
        cond_select := concat_ws(' AND ', cond_select, format('%s($1)[%s]%s', lefts[i], i, rights[i]));
    END LOOP;
    IF cardinality(key) <> nkeys THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('the primary key of table "%s" has %s column%s, but the key has %s values',
                             rel.relname, nkeys, CASE WHEN nkeys = 1 THEN '' ELSE 's' END, cardinality(key)),
            HINT = 'Pass a key of several columns as text[], in primary key order.';
    END IF;

    -- ONLY: the rows of inheritance children are not governed
    target := format('%s%I.%I', CASE WHEN rel.relkind <> 'p' THEN 'ONLY ' ELSE '' END, rel.nspname, rel.relname);
    saved_seqscan := current_setting('enable_seqscan');
    PERFORM set_config('enable_seqscan', 'off', true);
    EXECUTE format('UPDATE %s SET %I = CAST($1 AS %s) WHERE %s AND '
                   'CAST(%I AS pg_catalog.text) OPERATOR(pg_catalog.=) ANY ($3) AND '
                   'CAST(%I AS pg_catalog.text) OPERATOR(pg_catalog.<>) $1',
                   target, column_name, format_type(col.atttypid, col.atttypmod),
                   cond_update, column_name, column_name)
        USING to_state, key, coalesce(from_states, sources);
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        PERFORM set_config('enable_seqscan', saved_seqscan, true);
        RETURN 'applied';
    END IF;
    EXECUTE format('SELECT CAST(%I AS pg_catalog.text) FROM %s WHERE %s',
                   column_name, target, cond_select)
        INTO current_state USING key;
    GET DIAGNOSTICS n = ROW_COUNT;
    PERFORM set_config('enable_seqscan', saved_seqscan, true);
    IF n = 0 THEN
        RAISE EXCEPTION 'no row of table "%" has key (%)', rel.relname, array_to_string(key, ', ')
            USING ERRCODE = 'P0002';
    END IF;
    RETURN CASE WHEN current_state = to_state THEN 'already' ELSE 'rejected' END;
END
$body$;
