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
