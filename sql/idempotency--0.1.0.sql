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

-- Records are application data: pg_dump must keep them.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idempotency_records', '');

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

CREATE FUNCTION @extschema@.idem_claim(
    key text,
    fingerprint bytea,
    lease interval DEFAULT NULL,
    scope text DEFAULT '',
    retention interval DEFAULT NULL,
    wait boolean DEFAULT true,
    OUT outcome text,
    OUT token bigint,
    OUT status @extschema@.idem_status,
    OUT response_code integer,
    OUT result jsonb,
    OUT error jsonb,
    OUT recovery_point text,
    OUT lease_expires_at timestamptz,
    OUT attempts integer,
    OUT expires_at timestamptz)
RETURNS record
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

/*
 * Privileges: the fingerprint functions are pure and stay executable by
 * PUBLIC; everything that reads or writes records is granted explicitly
 * (see the README's "Privileges" section).
 */
REVOKE ALL ON TABLE @extschema@.idempotency_records FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION
    @extschema@.idem_claim(text, bytea, interval, text, interval, boolean),
    @extschema@.idem_complete(text, bigint, jsonb, integer, text),
    @extschema@.idem_fail(text, bigint, jsonb, boolean, text, integer),
    @extschema@.idem_checkpoint(text, bigint, text, interval, text),
    @extschema@.idem_release(text, bigint, text),
    @extschema@.idem_mark_unknown(text, bigint, jsonb, text),
    @extschema@.idem_resolve(text, @extschema@.idem_status, jsonb, integer, text, boolean),
    @extschema@.idem_lookup(text, text)
FROM PUBLIC;
