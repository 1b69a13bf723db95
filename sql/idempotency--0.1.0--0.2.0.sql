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
 * a key claimed again gets tokens no earlier owner held (src/removal.c).
 * The functions advance the sequence without the deleting role's privileges
 * on it, and nobody may call them or attach them elsewhere.
 */
CREATE FUNCTION @extschema@.idem_records_removed()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_records_removed'
LANGUAGE C;

CREATE FUNCTION @extschema@.idem_records_truncated()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_records_truncated'
LANGUAGE C;

REVOKE EXECUTE ON FUNCTION
    @extschema@.idem_records_removed(),
    @extschema@.idem_records_truncated()
FROM PUBLIC;

COMMENT ON FUNCTION @extschema@.idem_records_removed() IS
    'trigger: a deleted record of the current token epoch advances the epoch';
COMMENT ON FUNCTION @extschema@.idem_records_truncated() IS
    'trigger: a TRUNCATE of the records advances the token epoch';

CREATE TRIGGER idem_records_removed
    AFTER DELETE ON @extschema@.idempotency_records
    FOR EACH ROW EXECUTE FUNCTION @extschema@.idem_records_removed();
CREATE TRIGGER idem_records_truncated
    AFTER TRUNCATE ON @extschema@.idempotency_records
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.idem_records_truncated();

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
