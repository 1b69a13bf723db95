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

/*
 * A token is epoch * 2^16 + n from here on, where it was epoch * 2^32 + n:
 * 2^47 epochs, so that no workload spends them (src/tokens.c).  The epoch
 * moves above every token issued so far, so that today's tokens stay valid
 * and every later one is above them; in a fresh install (no record, the
 * epoch never advanced) nothing moves and keys start at 1.
 */
ALTER SEQUENCE @extschema@.idem_token_epoch MAXVALUE 140737488355327;

SELECT pg_catalog.setval('@extschema@.idem_token_epoch', rescaled.epoch)
FROM (SELECT GREATEST(
          (SELECT CASE WHEN is_called THEN (last_value OPERATOR(pg_catalog.+) 1) OPERATOR(pg_catalog.*) 65536
                       ELSE 0 END
             FROM @extschema@.idem_token_epoch),
          (SELECT pg_catalog.max(token) OPERATOR(pg_catalog./) 65536 OPERATOR(pg_catalog.+) 1
             FROM @extschema@.idempotency_records)) AS epoch) rescaled
WHERE rescaled.epoch OPERATOR(pg_catalog.>) 0;

COMMENT ON SEQUENCE @extschema@.idem_token_epoch IS
    'the token epoch: new keys get tokens from epoch * 2^16 + 1; advanced by whatever removes records and by a new timeline';

/*
 * The timeline on which the epoch last moved on.  Before the first token of
 * another timeline (a promoted standby, a recovery to a point in time) the
 * epoch jumps, so that no token issued in a commit the old timeline
 * acknowledged and lost can be issued again.  Not in the dump: a restore
 * records its own server's timeline at CREATE EXTENSION.  Nobody needs a
 * privilege on it; the library reads and sets it as its owner.
 */
CREATE SEQUENCE @extschema@.idem_token_timeline AS bigint MINVALUE 0 START WITH 0;

COMMENT ON SEQUENCE @extschema@.idem_token_timeline IS
    'the timeline on which the token epoch last moved on (idem_token_epoch)';

REVOKE ALL ON SEQUENCE @extschema@.idem_token_timeline FROM PUBLIC;

SELECT pg_catalog.setval('@extschema@.idem_token_timeline',
                         ('x' OPERATOR(pg_catalog.||)
                          pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8)
                         )::bit(32)::bigint);

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
