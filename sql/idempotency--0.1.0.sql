/* idempotency--0.1.0.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION idempotency" to load this file. \quit

CREATE TYPE @extschema@.idem_status AS ENUM
    ('processing', 'succeeded', 'failed', 'unknown');

COMMENT ON TYPE @extschema@.idem_status IS
    'lifecycle of an idempotency record: processing -> succeeded | failed | unknown';

/*
 * One row per (scope, key).  Columns are ordered so that the fixed-width ones
 * need at most one alignment pad; scope and key use the "C" collation so the
 * primary key compares bytes.  fillfactor leaves room on the page for the
 * updated version of a row, so status changes stay HOT (the primary key is the
 * only index and its columns never change).
 */
CREATE TABLE @extschema@.idempotency_records (
    scope            text COLLATE pg_catalog."C" NOT NULL DEFAULT '',
    key              text COLLATE pg_catalog."C" NOT NULL,
    fingerprint      bytea NOT NULL,
    token            bigint NOT NULL,
    lease_expires_at timestamptz,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    completed_at     timestamptz,
    expires_at       timestamptz NOT NULL,
    purge_after      timestamptz NOT NULL,
    status           @extschema@.idem_status NOT NULL,
    attempts         integer NOT NULL,
    response_code    integer,
    retryable        boolean NOT NULL DEFAULT false,
    recovery_point   text,
    result           jsonb,
    error            jsonb,
    CONSTRAINT idempotency_records_pkey PRIMARY KEY (scope, key)
) WITH (fillfactor = 90);

COMMENT ON TABLE @extschema@.idempotency_records IS
    'idempotency keys, their owner (fencing token, lease) and their saved outcome';

COMMENT ON COLUMN @extschema@.idempotency_records.expires_at IS
    'when retention ends: completion + retention once finished, created_at + retention before';
COMMENT ON COLUMN @extschema@.idempotency_records.purge_after IS
    'created_at + retention: the earliest expires_at can be; never moved by completion';

/*
 * idem_purge finds expired records through this index.  It is on purge_after
 * rather than expires_at because completion moves expires_at: an index on it
 * would make every completion a non-HOT update (a new index entry in the
 * primary key and in this index, and a dead tuple only VACUUM can remove).
 * purge_after is written by the INSERT (and by a takeover or reuse) and
 * never by complete, fail, checkpoint, release or mark_unknown.
 */
CREATE INDEX idempotency_records_purge_after ON @extschema@.idempotency_records (purge_after);

-- Records are application data: pg_dump must keep them.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idempotency_records', '');

/*
 * The token epoch: bumped by every idem_purge of records, read by every new
 * claim, so that the first token of a key claimed again after a purge is
 * larger than any token issued for it before (tokens never go backwards).
 */
CREATE SEQUENCE @extschema@.idem_token_epoch AS bigint MINVALUE 1 START WITH 1
    MAXVALUE 2147483647;

COMMENT ON SEQUENCE @extschema@.idem_token_epoch IS
    'counts purges of records; new keys get tokens from epoch * 2^32 + 1';

SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_token_epoch', '');

/* Fingerprints: SHA-256 computed in the server. */

CREATE FUNCTION @extschema@.idem_fingerprint(request jsonb)
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_fingerprint_jsonb'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION @extschema@.idem_fingerprint(request text)
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_fingerprint_text'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION @extschema@.idem_fingerprint(request bytea)
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_fingerprint_bytea'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

/*
 * The claim lifecycle.  None of these is STRICT: a NULL argument is an error
 * (22004), not a silent NULL result.
 */

/*
 * The claim's answer is a named row type rather than OUT parameters: a query
 * that calls idem_claim in FROM then finds its shape in the type cache,
 * instead of rebuilding it from pg_proc every time it starts.
 */
CREATE TYPE @extschema@.idem_claim_result AS (
    outcome text,
    token bigint,
    status @extschema@.idem_status,
    response_code integer,
    result jsonb,
    error jsonb,
    recovery_point text,
    lease_expires_at timestamptz,
    attempts integer,
    expires_at timestamptz);

CREATE FUNCTION @extschema@.idem_claim(
    key text,
    fingerprint bytea,
    lease interval DEFAULT NULL,
    scope text DEFAULT '',
    retention interval DEFAULT NULL,
    wait boolean DEFAULT true)
RETURNS @extschema@.idem_claim_result
AS 'MODULE_PATHNAME', 'idem_claim'
LANGUAGE C VOLATILE;

CREATE FUNCTION @extschema@.idem_complete(
    key text,
    token bigint,
    result jsonb DEFAULT NULL,
    response_code integer DEFAULT NULL,
    scope text DEFAULT '')
RETURNS void
AS 'MODULE_PATHNAME', 'idem_complete'
LANGUAGE C VOLATILE;

CREATE FUNCTION @extschema@.idem_fail(
    key text,
    token bigint,
    error jsonb,
    retryable boolean DEFAULT true,
    scope text DEFAULT '',
    response_code integer DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_fail'
LANGUAGE C VOLATILE;

CREATE FUNCTION @extschema@.idem_checkpoint(
    key text,
    token bigint,
    recovery_point text,
    extend_lease interval DEFAULT NULL,
    scope text DEFAULT '')
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'idem_checkpoint'
LANGUAGE C VOLATILE;

CREATE FUNCTION @extschema@.idem_release(
    key text,
    token bigint,
    scope text DEFAULT '')
RETURNS void
AS 'MODULE_PATHNAME', 'idem_release'
LANGUAGE C VOLATILE;

CREATE FUNCTION @extschema@.idem_mark_unknown(
    key text,
    token bigint,
    detail jsonb,
    scope text DEFAULT '')
RETURNS void
AS 'MODULE_PATHNAME', 'idem_mark_unknown'
LANGUAGE C VOLATILE;

CREATE FUNCTION @extschema@.idem_resolve(
    key text,
    status @extschema@.idem_status,
    result jsonb DEFAULT NULL,
    response_code integer DEFAULT NULL,
    scope text DEFAULT '',
    retryable boolean DEFAULT false)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_resolve'
LANGUAGE C VOLATILE;

CREATE FUNCTION @extschema@.idem_lookup(
    key text,
    scope text DEFAULT '')
RETURNS SETOF @extschema@.idempotency_records
AS 'MODULE_PATHNAME', 'idem_lookup'
LANGUAGE C STABLE ROWS 1;

CREATE FUNCTION @extschema@.idem_await(
    key text,
    scope text DEFAULT '',
    timeout interval DEFAULT '5 seconds')
RETURNS SETOF @extschema@.idempotency_records
AS 'MODULE_PATHNAME', 'idem_await'
LANGUAGE C VOLATILE ROWS 1;

COMMENT ON FUNCTION @extschema@.idem_await(text, text, interval) IS
    'wait (holding no lock) until the record leaves processing or the timeout passes; returns it';

/* Operations: what is stuck, and how many records are in which state. */
CREATE VIEW @extschema@.idem_stuck WITH (security_invoker = true) AS
SELECT r.scope, r.key, r.status,
       CASE WHEN r.status OPERATOR(pg_catalog.=) 'unknown'
            THEN 'unknown outcome' ELSE 'lease expired' END AS reason,
       pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) r.created_at AS age,
       r.attempts, r.recovery_point, r.error, r.lease_expires_at,
       r.created_at, r.updated_at
FROM @extschema@.idempotency_records r
WHERE r.status OPERATOR(pg_catalog.=) 'unknown'
   OR (r.status OPERATOR(pg_catalog.=) 'processing'
       AND r.lease_expires_at OPERATOR(pg_catalog.<) pg_catalog.clock_timestamp())
ORDER BY r.created_at;

COMMENT ON VIEW @extschema@.idem_stuck IS
    'work that needs a person or a reconciler: unknown outcomes and abandoned leases, oldest first';

CREATE VIEW @extschema@.idem_summary WITH (security_invoker = true) AS
SELECT r.scope, r.status, pg_catalog.count(*) AS records,
       pg_catalog.min(r.created_at) AS oldest,
       pg_catalog.count(*) FILTER (WHERE r.expires_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()
                                    AND (r.status OPERATOR(pg_catalog.=) ANY ('{succeeded,failed}')
                                         OR r.lease_expires_at IS NULL
                                            AND r.status OPERATOR(pg_catalog.=) 'processing'))
           AS expired
FROM @extschema@.idempotency_records r
GROUP BY r.scope, r.status
ORDER BY r.scope, r.status;

COMMENT ON VIEW @extschema@.idem_summary IS
    'records by scope and status, with how many are waiting for idem_purge';

/*
 * Privileges: the fingerprint functions are pure and stay executable by
 * PUBLIC; everything that reads or writes records is granted explicitly
 * (see the README's "Privileges" section).
 */
REVOKE ALL ON TABLE @extschema@.idempotency_records FROM PUBLIC;
-- every claimant reads the epoch; only purging moves it
GRANT SELECT ON SEQUENCE @extschema@.idem_token_epoch TO PUBLIC;
REVOKE EXECUTE ON FUNCTION
    @extschema@.idem_claim(text, bytea, interval, text, interval, boolean),
    @extschema@.idem_complete(text, bigint, jsonb, integer, text),
    @extschema@.idem_fail(text, bigint, jsonb, boolean, text, integer),
    @extschema@.idem_checkpoint(text, bigint, text, interval, text),
    @extschema@.idem_release(text, bigint, text),
    @extschema@.idem_mark_unknown(text, bigint, jsonb, text),
    @extschema@.idem_resolve(text, @extschema@.idem_status, jsonb, integer, text, boolean),
    @extschema@.idem_lookup(text, text),
    @extschema@.idem_await(text, text, interval)
FROM PUBLIC;

/*
 * The consumer inbox: one narrow row per accepted message, kept for its
 * retention and removed by idem_purge; and one watermark row per ordered
 * stream, never purged.  Rows are inserted in time order and deleted by
 * idem_purge, so a BRIN index of a few pages finds the expired ones.
 */
CREATE TABLE @extschema@.idem_inbox (
    consumer   text COLLATE pg_catalog."C" NOT NULL,
    message_id text COLLATE pg_catalog."C" NOT NULL,
    expires_at timestamptz NOT NULL,
    CONSTRAINT idem_inbox_pkey PRIMARY KEY (consumer, message_id)
);

CREATE INDEX idem_inbox_expires_at ON @extschema@.idem_inbox
    USING brin (expires_at) WITH (pages_per_range = 16);

COMMENT ON TABLE @extschema@.idem_inbox IS
    'messages a consumer has accepted, kept until expires_at to recognise duplicates';

CREATE TABLE @extschema@.idem_inbox_streams (
    consumer   text COLLATE pg_catalog."C" NOT NULL,
    stream     text COLLATE pg_catalog."C" NOT NULL,
    watermark  bigint NOT NULL,
    updated_at timestamptz NOT NULL,
    CONSTRAINT idem_inbox_streams_pkey PRIMARY KEY (consumer, stream)
);

COMMENT ON TABLE @extschema@.idem_inbox_streams IS
    'the highest sequence number each consumer has accepted from each ordered stream';

SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_inbox', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_inbox_streams', '');

CREATE FUNCTION @extschema@.idem_inbox_accept(
    consumer text,
    message_id text,
    retention interval DEFAULT NULL,
    wait boolean DEFAULT true)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_inbox_accept'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.idem_inbox_accept(text, text, interval, boolean) IS
    'true the first time a consumer sees a message (within retention), false for a duplicate';

CREATE FUNCTION @extschema@.idem_inbox_accept_seq(
    consumer text,
    stream text,
    seq bigint,
    accept_gap boolean DEFAULT false)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_inbox_accept_seq'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.idem_inbox_accept_seq(text, text, bigint, boolean) IS
    'ordered de-duplication by watermark: new | duplicate | gap';

CREATE FUNCTION @extschema@.idem_inbox_seq(major bigint, minor integer)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    IF major IS NULL OR minor IS NULL THEN
        RAISE EXCEPTION 'sequence parts must not be null' USING ERRCODE = '22004';
    END IF;
    IF major < 0 OR major >= 8796093022208 OR minor < 0 OR minor >= 1048576 THEN
        RAISE EXCEPTION 'sequence (%, %) is out of range', major, minor
            USING ERRCODE = '22003',
                  DETAIL = 'The major part is 0 to 2^43 - 1 and the minor part 0 to 2^20 - 1.';
    END IF;
    RETURN major * 1048576 + minor;
END
$function$;

COMMENT ON FUNCTION @extschema@.idem_inbox_seq(bigint, integer) IS
    'the bigint sequence number of a (major, minor) pair such as (block number, log index)';

CREATE FUNCTION @extschema@.idem_inbox_accept_seq(
    consumer text,
    stream text,
    major bigint,
    minor integer,
    accept_gap boolean DEFAULT true)
RETURNS text
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
RETURN @extschema@.idem_inbox_accept_seq(consumer, stream,
                                         @extschema@.idem_inbox_seq(major, minor),
                                         accept_gap);

COMMENT ON FUNCTION @extschema@.idem_inbox_accept_seq(text, text, bigint, integer, boolean) IS
    'ordered de-duplication of (block number, log index) pairs: seq = major * 2^20 + minor';


CREATE FUNCTION @extschema@.idem_inbox_watermark(consumer text, stream text)
RETURNS bigint
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
RETURN (SELECT s.watermark FROM @extschema@.idem_inbox_streams s
        WHERE s.consumer OPERATOR(pg_catalog.=) idem_inbox_watermark.consumer
          AND s.stream OPERATOR(pg_catalog.=) idem_inbox_watermark.stream);

/* Retention, shared by the records and the inbox. */
CREATE FUNCTION @extschema@.idem_purge(
    batch_size integer DEFAULT 10000,
    max_batches integer DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_purge'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.idem_purge(integer, integer) IS
    'delete expired finished records and expired inbox messages in batches; returns how many rows went';

REVOKE ALL ON TABLE @extschema@.idem_inbox, @extschema@.idem_inbox_streams FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION
    @extschema@.idem_inbox_accept(text, text, interval, boolean),
    @extschema@.idem_inbox_accept_seq(text, text, bigint, boolean),
    @extschema@.idem_inbox_accept_seq(text, text, bigint, integer, boolean),
    @extschema@.idem_inbox_watermark(text, text),
    @extschema@.idem_purge(integer, integer)
FROM PUBLIC;

/* Statistics (in shared memory: only with shared_preload_libraries). */
CREATE FUNCTION @extschema@.idem_stats(
    OUT counter text,
    OUT value bigint,
    OUT since timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_stats'
LANGUAGE C VOLATILE ROWS 20;

COMMENT ON FUNCTION @extschema@.idem_stats() IS
    'counters of claims by outcome, conflicts, stale tokens, transitions, inbox and purge, since the last reset';

CREATE FUNCTION @extschema@.idem_stats_reset()
RETURNS void
AS 'MODULE_PATHNAME', 'idem_stats_reset'
LANGUAGE C VOLATILE;

REVOKE EXECUTE ON FUNCTION @extschema@.idem_stats_reset() FROM PUBLIC;

/*
 * State machines.
 *
 * A machine is a set of states and of moves between them; it lives in two
 * tables that pg_dump keeps (the extension's own built-in machines, named
 * "idem.*", are created by this script and not dumped).  A machine is
 * attached to a column of a table by the trigger idem_enforce_transition,
 * which refuses every move the machine does not contain.  The trigger reads
 * definitions from a per-backend cache; a statement trigger on the two tables
 * invalidates that cache in every session when a definition changes.
 */

CREATE TABLE @extschema@.idem_machines (
    name           text COLLATE pg_catalog."C" NOT NULL,
    states         text[] NOT NULL,
    initial_states text[] NOT NULL DEFAULT '{}',
    defined_at     timestamptz NOT NULL DEFAULT pg_catalog.now(),
    CONSTRAINT idem_machines_pkey PRIMARY KEY (name)
);

COMMENT ON TABLE @extschema@.idem_machines IS
    'state machines: every state, and the states a new row may start in (none = any)';

CREATE TABLE @extschema@.idem_machine_moves (
    machine    text COLLATE pg_catalog."C" NOT NULL,
    from_state text COLLATE pg_catalog."C" NOT NULL,
    to_state   text COLLATE pg_catalog."C" NOT NULL,
    CONSTRAINT idem_machine_moves_pkey PRIMARY KEY (machine, from_state, to_state)
);

COMMENT ON TABLE @extschema@.idem_machine_moves IS
    'the moves of each state machine; a state without moves is terminal';

SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_machines',
    $$WHERE name OPERATOR(pg_catalog.!~~) 'idem.%'$$);
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_machine_moves',
    $$WHERE machine OPERATOR(pg_catalog.!~~) 'idem.%'$$);

CREATE FUNCTION @extschema@.idem_machines_changed()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_machines_changed'
LANGUAGE C;

CREATE TRIGGER idem_machines_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON @extschema@.idem_machines
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.idem_machines_changed();
CREATE TRIGGER idem_machine_moves_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON @extschema@.idem_machine_moves
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.idem_machines_changed();
-- Attached to a table of one's own, it would make every backend recompile
-- its machines at every statement; the triggers above fire without EXECUTE.
REVOKE EXECUTE ON FUNCTION @extschema@.idem_machines_changed() FROM PUBLIC;

CREATE FUNCTION @extschema@.idem_enforce_transition()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_enforce_transition'
LANGUAGE C;

COMMENT ON FUNCTION @extschema@.idem_enforce_transition() IS
    'BEFORE INSERT OR UPDATE trigger: idem_enforce_transition(machine, column) refuses moves the machine does not contain';

CREATE FUNCTION @extschema@.idem_define_machine(
    machine text,
    moves jsonb,
    initial text[] DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $function$
#variable_conflict use_column
DECLARE
    from_state text;
    targets jsonb;
    target jsonb;
    all_states text[];
    bad text;
BEGIN
    IF idem_define_machine.machine IS NULL THEN
        RAISE EXCEPTION 'machine name must not be null' USING ERRCODE = '22004';
    END IF;
    IF idem_define_machine.machine = '' OR octet_length(idem_define_machine.machine) > 63 THEN
        RAISE EXCEPTION 'invalid machine name "%"', idem_define_machine.machine
            USING ERRCODE = '22023',
                  DETAIL = 'A machine name has 1 to 63 bytes.';
    END IF;
    IF idem_define_machine.machine LIKE 'idem.%' THEN
        RAISE EXCEPTION 'machine name "%" is reserved', idem_define_machine.machine
            USING ERRCODE = '42939',
                  HINT = 'Names starting with "idem." belong to the extension.';
    END IF;
    IF moves IS NULL THEN
        RAISE EXCEPTION 'moves must not be null' USING ERRCODE = '22004';
    END IF;
    IF jsonb_typeof(moves) <> 'object' THEN
        RAISE EXCEPTION 'moves of machine "%" must be a JSON object', idem_define_machine.machine
            USING ERRCODE = '22023',
                  DETAIL = 'Each key is a state; its value is the array of states it may move to.',
                  HINT = 'For example: {"PENDING": ["PAID", "CANCELLED"], "PAID": ["REFUNDED"]}.';
    END IF;
    FOR from_state, targets IN SELECT e.key, e.value FROM jsonb_each(moves) e LOOP
        IF from_state = '' THEN
            RAISE EXCEPTION 'machine "%" has an empty state name', idem_define_machine.machine
                USING ERRCODE = '22023';
        END IF;
        IF jsonb_typeof(targets) <> 'array' THEN
            RAISE EXCEPTION 'moves from state "%" of machine "%" must be a JSON array',
                    from_state, idem_define_machine.machine
                USING ERRCODE = '22023',
                      DETAIL = format('The value given was %s.', targets);
        END IF;
        FOR target IN SELECT t.value FROM jsonb_array_elements(targets) t LOOP
            IF jsonb_typeof(target) <> 'string' OR target #>> '{}' = '' THEN
                RAISE EXCEPTION 'invalid target state % in the moves from state "%" of machine "%"',
                        target, from_state, idem_define_machine.machine
                    USING ERRCODE = '22023',
                          DETAIL = 'States are non-empty strings.';
            END IF;
        END LOOP;
    END LOOP;

    SELECT array_agg(s ORDER BY s COLLATE "C") INTO all_states
    FROM (SELECT e.key AS s FROM jsonb_each(moves) e
          UNION
          SELECT t FROM jsonb_each(moves) e, jsonb_array_elements_text(e.value) t) states;
    IF all_states IS NULL THEN
        RAISE EXCEPTION 'machine "%" has no states', idem_define_machine.machine
            USING ERRCODE = '22023';
    END IF;
    IF cardinality(all_states) > 1000 THEN      -- IDEM_MAX_MACHINE_STATES
        RAISE EXCEPTION 'state machine "%" has % states, more than the % allowed',
                idem_define_machine.machine, cardinality(all_states), 1000
            USING ERRCODE = '54000';
    END IF;

    IF array_position(initial, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'initial states of machine "%" must not contain null', idem_define_machine.machine
            USING ERRCODE = '22004';
    END IF;
    IF initial IS NOT NULL THEN
        SELECT i INTO bad FROM unnest(initial) i WHERE NOT i = ANY (all_states) LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'initial state "%" is not a state of machine "%"',
                    bad, idem_define_machine.machine
                USING ERRCODE = '22023',
                      DETAIL = format('Its states are %s.', all_states);
        END IF;
    END IF;

    -- The row lock serializes concurrent definitions of one machine.
    INSERT INTO @extschema@.idem_machines (name, states, initial_states, defined_at)
    VALUES (idem_define_machine.machine, all_states,
            coalesce((SELECT array_agg(i ORDER BY i COLLATE "C")
                      FROM (SELECT DISTINCT i FROM unnest(initial) i) d), '{}'),
            clock_timestamp())
    ON CONFLICT (name) DO UPDATE
        SET states = EXCLUDED.states, initial_states = EXCLUDED.initial_states,
            defined_at = EXCLUDED.defined_at;
    DELETE FROM @extschema@.idem_machine_moves WHERE machine = idem_define_machine.machine;
    INSERT INTO @extschema@.idem_machine_moves (machine, from_state, to_state)
    SELECT DISTINCT idem_define_machine.machine, e.key, t
    FROM jsonb_each(moves) e, jsonb_array_elements_text(e.value) t
    WHERE e.key <> t;                   -- staying in a state is always allowed
END
$function$;

COMMENT ON FUNCTION @extschema@.idem_define_machine(text, jsonb, text[]) IS
    'create or replace a state machine from {"STATE": ["NEXT", ...], ...}';

/* Where machines are attached: the enforcing triggers, read from the catalog. */
CREATE FUNCTION @extschema@.idem_trigger_arg(tgargs bytea, n integer)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_trigger_arg'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

COMMENT ON FUNCTION @extschema@.idem_trigger_arg(bytea, integer) IS
    'argument n (from 1) of a trigger, from pg_trigger.tgargs';

CREATE VIEW @extschema@.idem_attached_machines AS
SELECT t.tgrelid::pg_catalog.regclass AS table_name,
       @extschema@.idem_trigger_arg(t.tgargs, 2)::pg_catalog.name AS state_column,
       @extschema@.idem_trigger_arg(t.tgargs, 1) AS machine,
       t.tgname AS trigger_name
FROM pg_catalog.pg_trigger t
WHERE t.tgfoid OPERATOR(pg_catalog.=) '@extschema@.idem_enforce_transition()'::pg_catalog.regprocedure
  AND t.tgparentid OPERATOR(pg_catalog.=) 0;      -- not the clones on partitions

COMMENT ON VIEW @extschema@.idem_attached_machines IS
    'every column governed by a state machine, and the trigger that enforces it';

CREATE FUNCTION @extschema@.idem_drop_machine(machine text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $function$
#variable_conflict use_column
DECLARE
    attached text;
BEGIN
    IF idem_drop_machine.machine IS NULL THEN
        RAISE EXCEPTION 'machine name must not be null' USING ERRCODE = '22004';
    END IF;
    IF idem_drop_machine.machine LIKE 'idem.%' THEN
        RAISE EXCEPTION 'machine "%" belongs to the extension', idem_drop_machine.machine
            USING ERRCODE = '42939';
    END IF;
    -- lock the definition first, so that no attach can slip in between
    PERFORM 1 FROM @extschema@.idem_machines WHERE name = idem_drop_machine.machine FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'state machine "%" does not exist', idem_drop_machine.machine
            USING ERRCODE = '42704';
    END IF;
    SELECT string_agg(format('%s.%I', a.table_name, a.state_column), ', ') INTO attached
    FROM @extschema@.idem_attached_machines a WHERE a.machine = idem_drop_machine.machine;
    IF attached IS NOT NULL THEN
        RAISE EXCEPTION 'cannot drop state machine "%" because it is attached', idem_drop_machine.machine
            USING ERRCODE = '2BP01',
                  DETAIL = format('It governs %s.', attached),
                  HINT = 'Detach it with idem_detach_machine() first.';
    END IF;
    DELETE FROM @extschema@.idem_machine_moves WHERE machine = idem_drop_machine.machine;
    DELETE FROM @extschema@.idem_machines WHERE name = idem_drop_machine.machine;
END
$function$;

CREATE FUNCTION @extschema@.idem_machine_moves(machine text)
RETURNS TABLE (from_state text, to_state text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $function$
#variable_conflict use_column
BEGIN
    IF idem_machine_moves.machine IS NULL THEN
        RAISE EXCEPTION 'machine name must not be null' USING ERRCODE = '22004';
    END IF;
    PERFORM 1 FROM @extschema@.idem_machines WHERE name = idem_machine_moves.machine;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'state machine "%" does not exist', idem_machine_moves.machine
            USING ERRCODE = '42704';
    END IF;
    RETURN QUERY
        SELECT m.from_state::text, m.to_state::text
        FROM @extschema@.idem_machine_moves m
        WHERE m.machine = idem_machine_moves.machine
        ORDER BY 1, 2;
END
$function$;

CREATE FUNCTION @extschema@.idem_machine_states(machine text)
RETURNS TABLE (state text, initial boolean, terminal boolean)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $function$
#variable_conflict use_column
DECLARE
    def record;
BEGIN
    IF idem_machine_states.machine IS NULL THEN
        RAISE EXCEPTION 'machine name must not be null' USING ERRCODE = '22004';
    END IF;
    SELECT * INTO def FROM @extschema@.idem_machines WHERE name = idem_machine_states.machine;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'state machine "%" does not exist', idem_machine_states.machine
            USING ERRCODE = '42704';
    END IF;
    RETURN QUERY
        SELECT s, cardinality(def.initial_states) = 0 OR s = ANY (def.initial_states),
               NOT EXISTS (SELECT 1 FROM @extschema@.idem_machine_moves m
                           WHERE m.machine = idem_machine_states.machine AND m.from_state = s)
        FROM unnest(def.states) s
        ORDER BY 1;
END
$function$;

CREATE FUNCTION @extschema@.idem_machine_dot(machine text)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    out text;
BEGIN
    IF machine IS NULL THEN
        RAISE EXCEPTION 'machine name must not be null' USING ERRCODE = '22004';
    END IF;
    -- DOT quoted IDs: escape backslashes and double quotes
    WITH st AS (SELECT * FROM @extschema@.idem_machine_states(machine)),
         q AS (SELECT state, initial, terminal,
                      '"' || replace(replace(state, '\', '\\'), '"', '\"') || '"' AS id FROM st)
    SELECT 'digraph ' || '"' || replace(replace(machine, '\', '\\'), '"', '\"') || '"' || E' {\n'
        || E'    rankdir=LR;\n'
        || E'    node [shape=circle];\n'
        || coalesce((SELECT string_agg(format(E'    %s [shape=%s];\n', id,
                                              CASE WHEN terminal THEN 'doublecircle' ELSE 'circle' END),
                                       '' ORDER BY state) FROM q), '')
        || coalesce((SELECT E'    "" [shape=point];\n'
                            || string_agg(format(E'    "" -> %s;\n', id), '' ORDER BY state)
                     FROM q WHERE initial), '')
        || coalesce((SELECT string_agg(format(E'    %s -> %s;\n', f.id, t.id), ''
                                       ORDER BY m.from_state, m.to_state)
                     FROM @extschema@.idem_machine_moves m
                     JOIN q f ON f.state = m.from_state
                     JOIN q t ON t.state = m.to_state
                     WHERE m.machine = idem_machine_dot.machine), '')
        || '}'
    INTO out;
    RETURN out;
END
$function$;

COMMENT ON FUNCTION @extschema@.idem_machine_dot(text) IS
    'the machine as a Graphviz digraph: initial states marked by an arrow from a point, terminal states as double circles';

/*
 * The optional transition log: an AFTER trigger writing one row per change
 * of the state column into a log table next to the governed table.
 * Arguments: the log table, the state column, the machine, the key columns.
 */
CREATE FUNCTION @extschema@.idem_log_transition()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    new_row jsonb := to_jsonb(NEW);
    old_state text;
    row_key jsonb;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        old_state := to_jsonb(OLD) ->> TG_ARGV[1];
        IF old_state IS NOT DISTINCT FROM new_row ->> TG_ARGV[1] THEN
            RETURN NULL;
        END IF;
    END IF;
    SELECT jsonb_object_agg(k, new_row -> k) INTO row_key
    FROM unnest(TG_ARGV[3:]) k;
    EXECUTE format('INSERT INTO %s (row_key, state_column, machine, from_state, to_state) '
                   'VALUES ($1, $2, $3, $4, $5)', TG_ARGV[0]::pg_catalog.regclass)
        USING coalesce(row_key, new_row), TG_ARGV[1], TG_ARGV[2], old_state,
              new_row ->> TG_ARGV[1];
    RETURN NULL;
END
$function$;

/*
 * prefix || name || suffix as an identifier of at most 63 bytes; a name too
 * long for that is shortened and given a hash of itself, so that two long
 * names cannot end up with the same object name.
 */
CREATE FUNCTION @extschema@.idem_object_name(prefix text, name text, suffix text)
RETURNS name
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
RETURN CASE
    WHEN octet_length(prefix || name || suffix) <= 63 THEN prefix || name || suffix
    ELSE prefix
         || (SELECT coalesce(string_agg(c, '' ORDER BY i), '')
             FROM (SELECT c, i, sum(octet_length(c)) OVER (ORDER BY i) AS bytes
                   FROM regexp_split_to_table(name, '') WITH ORDINALITY AS chars(c, i)) whole_chars
             WHERE bytes <= 54 - octet_length(prefix || suffix))
         || '_' || left(md5(name), 8) || suffix
END;

CREATE FUNCTION @extschema@.idem_attach_machine(
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

CREATE FUNCTION @extschema@.idem_detach_machine(table_name regclass, state_column name)
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
                           '@extschema@.idem_log_transition()'::regprocedure)
          -- both triggers take the state column as their second argument
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

CREATE FUNCTION @extschema@.idem_transition(
    table_name regclass,
    key text,
    to_state text,
    from_states text[] DEFAULT NULL,
    state_column name DEFAULT NULL)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_transition_text'
LANGUAGE C VOLATILE;

CREATE FUNCTION @extschema@.idem_transition(
    table_name regclass,
    key text[],
    to_state text,
    from_states text[] DEFAULT NULL,
    state_column name DEFAULT NULL)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_transition_array'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.idem_transition(regclass, text, text, text[], name) IS
    'compare-and-set of a governed state column by primary key: applied | already | rejected';

/* The records' own statuses follow a built-in machine. */
INSERT INTO @extschema@.idem_machines (name, states, initial_states)
VALUES ('idem.record', '{failed,processing,succeeded,unknown}', '{}');
INSERT INTO @extschema@.idem_machine_moves (machine, from_state, to_state) VALUES
    ('idem.record', 'processing', 'succeeded'),
    ('idem.record', 'processing', 'failed'),
    ('idem.record', 'processing', 'unknown'),
    ('idem.record', 'failed', 'processing'),    -- takeover of a retryable failure
    ('idem.record', 'unknown', 'succeeded'),    -- idem_resolve
    ('idem.record', 'unknown', 'failed');

CREATE TRIGGER zz_idem_machine_status
    BEFORE INSERT OR UPDATE ON @extschema@.idempotency_records
    FOR EACH ROW EXECUTE FUNCTION @extschema@.idem_enforce_transition('idem.record', 'status');

/*
 * Privileges of the state machine objects: definitions are readable by all;
 * changing them is granted explicitly (README, "Privileges").
 */
REVOKE ALL ON TABLE @extschema@.idem_machines, @extschema@.idem_machine_moves FROM PUBLIC;
GRANT SELECT ON TABLE @extschema@.idem_machines, @extschema@.idem_machine_moves,
    @extschema@.idem_attached_machines TO PUBLIC;
REVOKE EXECUTE ON FUNCTION
    @extschema@.idem_define_machine(text, jsonb, text[]),
    @extschema@.idem_drop_machine(text),
    @extschema@.idem_attach_machine(regclass, name, text, boolean, boolean),
    @extschema@.idem_detach_machine(regclass, name)
FROM PUBLIC;

/*
 * Tenant isolation (off until idem_tenant_isolation(true)).  The policies
 * exist from the start, as members of the extension, so that a dump and
 * restore brings them back with CREATE EXTENSION; the switch is row-level
 * security on the three tables, FORCE'd so that their owner is bound too
 * (superusers and BYPASSRLS roles never are).  idempotency.scope names the
 * tenant of the session; empty or unset, it sees and writes nothing.
 * Inbox consumers belong to a tenant by name: "<scope>" or "<scope>/...".
 */
CREATE POLICY idem_tenant ON @extschema@.idempotency_records
    USING (scope OPERATOR(pg_catalog.=)
           NULLIF(pg_catalog.current_setting('idempotency.scope', true), ''))
    WITH CHECK (scope OPERATOR(pg_catalog.=)
                NULLIF(pg_catalog.current_setting('idempotency.scope', true), ''));

CREATE FUNCTION @extschema@.idem_consumer_in_scope(consumer text)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
-- a standard-SQL body is bound at creation, so no search_path applies later;
-- without a SET clause the function can be inlined into the policies
RETURN consumer OPERATOR(pg_catalog.=)
           NULLIF(pg_catalog.current_setting('idempotency.scope', true), '')
       OR pg_catalog.starts_with(consumer,
           NULLIF(pg_catalog.current_setting('idempotency.scope', true), '')
           OPERATOR(pg_catalog.||) '/');

COMMENT ON FUNCTION @extschema@.idem_consumer_in_scope(text) IS
    'whether an inbox consumer belongs to the tenant in idempotency.scope (tenant isolation)';

CREATE POLICY idem_tenant ON @extschema@.idem_inbox
    USING (@extschema@.idem_consumer_in_scope(consumer))
    WITH CHECK (@extschema@.idem_consumer_in_scope(consumer));
CREATE POLICY idem_tenant ON @extschema@.idem_inbox_streams
    USING (@extschema@.idem_consumer_in_scope(consumer))
    WITH CHECK (@extschema@.idem_consumer_in_scope(consumer));

/*
 * Whether isolation is on is kept in a table that pg_dump keeps (a row means
 * on), because pg_dump does not keep row-level security on an extension's
 * tables.  Its trigger applies the row: when idem_tenant_isolation writes it,
 * and when a restore loads it (COPY fires triggers), so that a restored
 * database is isolated again without anyone remembering to ask.
 */
CREATE TABLE @extschema@.idem_settings (
    tenant_isolation boolean NOT NULL,
    only_row         boolean PRIMARY KEY DEFAULT true CHECK (only_row)
);
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_settings', '');
REVOKE ALL ON TABLE @extschema@.idem_settings FROM PUBLIC;
GRANT SELECT ON TABLE @extschema@.idem_settings TO PUBLIC;

COMMENT ON TABLE @extschema@.idem_settings IS
    'settings that must survive dump and restore: tenant_isolation (see idem_tenant_isolation)';

CREATE FUNCTION @extschema@.idem_apply_settings()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    isolated constant boolean := TG_OP <> 'DELETE' AND NEW.tenant_isolation;
    t regclass;
BEGIN
    FOREACH t IN ARRAY ARRAY['@extschema@.idempotency_records', '@extschema@.idem_inbox',
                             '@extschema@.idem_inbox_streams']::regclass[] LOOP
        -- regclass prints a quoted, qualified name
        EXECUTE format('ALTER TABLE %s %s ROW LEVEL SECURITY, %s ROW LEVEL SECURITY', t,
                       CASE WHEN isolated THEN 'ENABLE' ELSE 'DISABLE' END,
                       CASE WHEN isolated THEN 'FORCE' ELSE 'NO FORCE' END);
    END LOOP;
    RETURN NULL;
END
$$;
REVOKE EXECUTE ON FUNCTION @extschema@.idem_apply_settings() FROM PUBLIC;

CREATE TRIGGER idem_apply_settings
    AFTER INSERT OR UPDATE OR DELETE ON @extschema@.idem_settings
    FOR EACH ROW EXECUTE FUNCTION @extschema@.idem_apply_settings();

CREATE FUNCTION @extschema@.idem_tenant_isolation(enabled boolean DEFAULT true)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF enabled IS NULL THEN
        RAISE EXCEPTION 'enabled must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    INSERT INTO @extschema@.idem_settings AS s (tenant_isolation) VALUES (enabled)
        ON CONFLICT (only_row) DO UPDATE SET tenant_isolation = excluded.tenant_isolation;
END
$$;

COMMENT ON FUNCTION @extschema@.idem_tenant_isolation(boolean) IS
    'turn tenant isolation on idempotency.scope on (row-level security, forced) or off';

/*
 * Grants by kind of user: one call per role and kind instead of a page of
 * GRANT statements.  Runs with the caller's privileges (the extension's
 * owner, or a role holding grant options), and quotes every name.
 */
CREATE FUNCTION @extschema@.idem_grant(kind text, grantee regrole)
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
                            '%1$s.idem_complete(text, bigint, jsonb, integer, text), '
                            '%1$s.idem_fail(text, bigint, jsonb, boolean, text, integer), '
                            '%1$s.idem_checkpoint(text, bigint, text, interval, text), '
                            '%1$s.idem_release(text, bigint, text), '
                            '%1$s.idem_mark_unknown(text, bigint, jsonb, text), '
                            '%1$s.idem_lookup(text, text), %1$s.idem_await(text, text, interval)', s);
        tables := format('%s.idempotency_records', s);
        privileges := 'SELECT, INSERT, UPDATE, DELETE';
    WHEN 'reconciler' THEN
        functions := format('%1$s.idem_resolve(text, %1$s.idem_status, jsonb, integer, text, boolean), '
                            '%1$s.idem_lookup(text, text)', s);
        tables := format('%s.idempotency_records', s);
        privileges := 'SELECT, UPDATE';
        EXECUTE format('GRANT SELECT ON TABLE %s.idem_stuck TO %s', s, grantee);
    WHEN 'reader' THEN
        functions := format('%1$s.idem_lookup(text, text), %1$s.idem_await(text, text, interval)', s);
        tables := format('%1$s.idempotency_records, %1$s.idem_stuck, %1$s.idem_summary', s);
        privileges := 'SELECT';
    WHEN 'consumer' THEN
        functions := format('%1$s.idem_inbox_accept(text, text, interval, boolean), '
                            '%1$s.idem_inbox_accept_seq(text, text, bigint, boolean), '
                            '%1$s.idem_inbox_accept_seq(text, text, bigint, integer, boolean), '
                            '%1$s.idem_inbox_watermark(text, text)', s);
        tables := format('%1$s.idem_inbox, %1$s.idem_inbox_streams', s);
        privileges := 'SELECT, INSERT, UPDATE';
    WHEN 'maintenance' THEN
        functions := format('%s.idem_purge(integer, integer)', s);
        tables := format('%1$s.idempotency_records, %1$s.idem_inbox', s);
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
        tables := format('%1$s.idempotency_records, %1$s.idem_stuck, %1$s.idem_summary', s);
        privileges := 'SELECT';
    ELSE
        RAISE EXCEPTION 'unknown kind of user "%"', kind
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'The kinds are client, reconciler, reader, consumer, maintenance, machine_admin and monitor.';
    END CASE;
    EXECUTE format('GRANT USAGE ON SCHEMA %s TO %s', s, grantee);
    EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', functions, grantee);
    EXECUTE format('GRANT %s ON TABLE %s TO %s', privileges, tables, grantee);
END
$$;

COMMENT ON FUNCTION @extschema@.idem_grant(text, regrole) IS
    'grant a role what one kind of user needs: client, reconciler, reader, consumer, maintenance, machine_admin, monitor';

CREATE FUNCTION @extschema@.idem_revoke_all(grantee regrole)
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
END
$$;

COMMENT ON FUNCTION @extschema@.idem_revoke_all(regrole) IS
    'revoke every privilege on the extension''s objects (and its schema) that idem_grant gave a role';

REVOKE EXECUTE ON FUNCTION
    @extschema@.idem_tenant_isolation(boolean),
    @extschema@.idem_grant(text, regrole),
    @extschema@.idem_revoke_all(regrole)
FROM PUBLIC;
