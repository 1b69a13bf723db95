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

-- ---------------------------------------------------------------------------
-- Issue 25: fencing tokens that never repeat or run out (section "tokens")
-- ---------------------------------------------------------------------------

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
-- Issue 25: grants that earlier update scripts made become ordinary grants
-- (section "grants"; last, so that it also covers what this script grants)
-- ---------------------------------------------------------------------------
