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
