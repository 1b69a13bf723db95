/*
 * idempotency_router: the extension's SQL API on the proxy database of a
 * sharded deployment (issue 16, README "Scaling out").
 *
 * The proxy holds no records.  Each function of the API is a PL/Proxy
 * function of the same name and argument list that runs the shard's own
 * function on the shard of the call's scope (RUN ON idem_route_hash(scope);
 * the inbox's by its consumer, whose tenant part names the tenant the same
 * way), so a claim, its business rows and its completion all commit on one
 * shard, and a tenant never spans two.  The outbox's emits run on the shard
 * of their scope too; its relay functions name the shard they work on (a
 * message id carries no scope: see "The outbox" below).  PL/Proxy runs
 * each call in a transaction of its own on the shard (autocommit): what
 * must commit together is one shard-side function, which
 * idem_proxy_function() makes callable through the proxy.
 *
 * The cluster is PL/Proxy's SQL/MED kind: the FOREIGN SERVER "idempotency"
 * of the plproxy wrapper, its options p0 .. p(2^n - 1) the shards'
 * connection strings (many more partitions than shards, so that a partition
 * can move to a new shard without rehashing; idem_router_configure() writes
 * it), and user mappings for the roles that call.  PL/Proxy sends the call
 * as "SELECT ... FROM <schema>.<function>(...)" with the proxy function's
 * schema, so the router is created in the schema that holds the extension on
 * the shards.
 *
 * The types of the API (idem_status, idem_claim_result, idem_outbox_status,
 * and the row type idempotency_records that idem_lookup and idem_await
 * return) are copies of the shards' with the same names, labels and
 * attributes: PL/Proxy matches result columns by name.  The routing hash
 * and the fingerprints are computed here, in SQL, with the C library's
 * results (sql/router.sql checks them against it); functions that only
 * compute run on any shard.
 *
 * The aggregates (idem_summary, idem_stuck, idem_stats) run on every shard
 * (RUN ON ALL: once per distinct connection string) and add up: sums, counts,
 * the earliest time.
 */

\echo Use "CREATE EXTENSION idempotency_router" to load this file. \quit

/*
 * The schema.  PL/Proxy's RUN ON names its function in unquoted words (its
 * scanner has no quoted identifiers there), and every routed function here
 * and every generated one names the hash function with this schema: a name
 * that needs quoting ("Router X", a keyword) cannot be written there.
 */
DO $$
DECLARE
    schema_name name := (SELECT n.nspname
                           FROM pg_catalog.pg_extension e
                           JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
                          WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency_router');
BEGIN
    IF pg_catalog.quote_ident(schema_name) OPERATOR(pg_catalog.<>) schema_name THEN
        RAISE EXCEPTION 'extension "idempotency_router" cannot be created in schema %',
                        pg_catalog.quote_ident(schema_name)
            USING ERRCODE = 'feature_not_supported',
                  DETAIL = 'PL/Proxy''s RUN ON cannot quote the schema of the routing function, so the schema''s name must need no quoting.',
                  HINT = 'Create it, and the extension idempotency on the shards, in a schema such as public or idempotency.';
    END IF;
END
$$;

CREATE TYPE @extschema@.idem_status AS ENUM ('processing', 'succeeded', 'failed', 'unknown');

COMMENT ON TYPE @extschema@.idem_status IS
    'lifecycle of an idempotency record (the shards'' type, for the proxy''s functions)';

CREATE TYPE @extschema@.idem_outbox_status AS ENUM ('pending', 'in_flight', 'published', 'dead');

COMMENT ON TYPE @extschema@.idem_outbox_status IS
    'lifecycle of an outbox message (the shards'' type, for the proxy''s functions)';

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
    expires_at timestamptz,
    response_headers jsonb
);

-- The row type of the shards' table, which idem_lookup and idem_await return.
CREATE TYPE @extschema@.idempotency_records AS (
    scope text COLLATE "C",
    key text COLLATE "C",
    fingerprint bytea,
    token bigint,
    lease_expires_at timestamptz,
    created_at timestamptz,
    updated_at timestamptz,
    completed_at timestamptz,
    expires_at timestamptz,
    purge_after timestamptz,
    status @extschema@.idem_status,
    attempts integer,
    response_code integer,
    retryable boolean,
    recovery_point text,
    result jsonb,
    error jsonb,
    response_headers jsonb
);

/*
 * Routing.  The SQL form of the C idem_route_hash (src/route.c); the proxy
 * has no idempotency library.  convert_to() is STABLE only because of the
 * database encoding, fixed for a database; the result is the same in every
 * encoding.  The shard checks the scope's length.
 */
CREATE FUNCTION @extschema@.idem_route_hash(scope text)
RETURNS integer
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF scope IS NULL THEN
        RAISE EXCEPTION 'scope must not be null'
            USING ERRCODE = 'null_value_not_allowed', HINT = 'Use '''' for the default scope.';
    END IF;
    RETURN ('x' || left(encode(sha256(convert_to(split_part(scope, '/', 1), 'UTF8')), 'hex'), 8))::bit(32)::integer;
END
$$;

COMMENT ON FUNCTION @extschema@.idem_route_hash(text) IS
    'the shard hash of a scope, as on the shards: the first 4 bytes of SHA-256 of its tenant part, big-endian int4';

-- The partition map: the options p0 .. pN of the server "idempotency".
CREATE FUNCTION @extschema@.idem_router_partitions(OUT partition integer, OUT connstr text)
RETURNS SETOF record
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT substr(o.name, 2)::integer, o.value
      FROM pg_foreign_server s
      JOIN pg_foreign_data_wrapper w ON w.oid = s.srvfdw AND w.fdwname = 'plproxy',
           LATERAL (SELECT split_part(opt, '=', 1) AS name, substr(opt, strpos(opt, '=') + 1) AS value
                      FROM unnest(s.srvoptions) opt) o
     WHERE s.srvname = 'idempotency' AND o.name ~ '^p[0-9]+$'
     ORDER BY 1
$$;

COMMENT ON FUNCTION @extschema@.idem_router_partitions() IS
    'the partitions of the PL/Proxy cluster "idempotency" and the connection string of each one''s shard';

CREATE FUNCTION @extschema@.idem_router_partition(scope text)
RETURNS integer
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    partitions integer;
BEGIN
    SELECT count(*) INTO partitions FROM @extschema@.idem_router_partitions();
    IF partitions = 0 THEN
        RAISE EXCEPTION 'PL/Proxy cluster "idempotency" is not configured'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Create it with idem_router_configure().';
    END IF;
    -- PL/Proxy's mapping: the hash's low bits
    RETURN @extschema@.idem_route_hash(scope) & (partitions - 1);
END
$$;

COMMENT ON FUNCTION @extschema@.idem_router_partition(text) IS
    'the partition of a scope in the PL/Proxy cluster "idempotency": idem_route_hash(scope) & (partitions - 1)';

/*
 * The cluster, written the PL/Proxy way: a FOREIGN SERVER of the plproxy
 * wrapper with 2^n partitions, shard i holding partitions i, i + shards,
 * i + 2 * shards, ...  The user mappings (which carry passwords) are the
 * administrator's.  Runs with the caller's privileges.
 */
CREATE FUNCTION @extschema@.idem_router_configure(shards text[], partitions integer DEFAULT 16)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer := cardinality(shards);
    options text;
BEGIN
    IF shards IS NULL OR partitions IS NULL THEN
        RAISE EXCEPTION 'shards and partitions must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF n = 0 OR array_position(shards, NULL) IS NOT NULL OR array_position(shards, '') IS NOT NULL THEN
        RAISE EXCEPTION 'invalid list of shards'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'The list must hold one connection string per shard, none of them empty or NULL.';
    END IF;
    IF partitions < 1 OR partitions > 65536 OR partitions & (partitions - 1) <> 0 OR partitions < n THEN
        RAISE EXCEPTION 'invalid number of partitions: %', partitions
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = format('PL/Proxy needs a power of two, no less than the number of shards (%s) and at most 65536.', n);
    END IF;
    IF (SELECT count(DISTINCT s) FROM unnest(shards) s) <> n THEN
        RAISE EXCEPTION 'the same shard is listed twice'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'PL/Proxy runs a call once per distinct connection string, so a shard listed twice would be counted twice.';
    END IF;
    SELECT string_agg(format('p%s %L', i, shards[i % n + 1]), ', ' ORDER BY i) INTO options
      FROM generate_series(0, partitions - 1) i;
    EXECUTE format('CREATE SERVER idempotency FOREIGN DATA WRAPPER plproxy OPTIONS (%s)', options);
END
$$;

COMMENT ON FUNCTION @extschema@.idem_router_configure(text[], integer) IS
    'create the PL/Proxy cluster "idempotency" (a foreign server) with the partitions spread over the shards';

-- Point one partition at another shard (the last step of a move).  A shard
-- the map does not hold yet (growing onto a new node) must be asked for
-- with new_shard => true: PL/Proxy tells shards apart only by the string, so
-- the caller vouches that it names another server or database than every
-- shard of the map (test/shard/move_partition.py --new-shard checks that).
CREATE FUNCTION @extschema@.idem_router_set_partition(partition integer, connstr text,
                                                      new_shard boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    known boolean;
BEGIN
    IF partition IS NULL OR connstr IS NULL OR connstr = '' OR new_shard IS NULL THEN
        RAISE EXCEPTION 'partition, connection string and new_shard must not be null or empty'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM @extschema@.idem_router_partitions() p WHERE p.partition = idem_router_set_partition.partition) THEN
        RAISE EXCEPTION 'PL/Proxy cluster "idempotency" has no partition %', partition
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    known := EXISTS (SELECT 1 FROM @extschema@.idem_router_partitions() p WHERE p.connstr = idem_router_set_partition.connstr);
    IF NOT known AND NOT new_shard THEN
        RAISE EXCEPTION 'connection string is not one of the cluster''s shards'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'PL/Proxy runs a call once per distinct connection string, so each shard must be written exactly as in the other partitions.',
                  HINT = 'Copy it from idem_router_partitions(), or pass new_shard => true for a shard the map does not hold yet.';
    END IF;
    IF known AND new_shard THEN
        RAISE EXCEPTION 'connection string is one of the cluster''s shards already'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Leave new_shard false to point the partition at a shard of the map.';
    END IF;
    EXECUTE format('ALTER SERVER idempotency OPTIONS (SET p%s %L)', partition, connstr);
END
$$;

COMMENT ON FUNCTION @extschema@.idem_router_set_partition(integer, text, boolean) IS
    'point a partition of the PL/Proxy cluster "idempotency" at another of its shards, or (new_shard) at a shard it does not hold yet';

/*
 * Fingerprints, computed here as the C library computes them: SHA-256 of the
 * bytes as given, or of the jsonb value's canonical text, in the database's
 * encoding.  idem_request_fingerprint runs on any shard.
 */
CREATE FUNCTION @extschema@.idem_fingerprint(request jsonb)
RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT sha256(convert_to(request::text, getdatabaseencoding())) $$;

CREATE FUNCTION @extschema@.idem_fingerprint(request text)
RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT sha256(convert_to(request, getdatabaseencoding())) $$;

CREATE FUNCTION @extschema@.idem_fingerprint(request bytea)
RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT sha256(request) $$;

CREATE FUNCTION @extschema@.idem_request_fingerprint(method text, path text, body jsonb,
                                                     ignore text[] DEFAULT NULL)
RETURNS bytea
LANGUAGE plproxy
AS $$ CLUSTER 'idempotency'; RUN ON ANY; $$;

CREATE FUNCTION @extschema@.idem_inbox_seq(major bigint, minor integer)
RETURNS bigint
LANGUAGE plproxy
AS $$ CLUSTER 'idempotency'; RUN ON ANY; $$;

/*
 * The API: each call on the shard of its scope.
 */
CREATE FUNCTION @extschema@.idem_claim(
    key text,
    fingerprint bytea,
    lease interval DEFAULT NULL,
    scope text DEFAULT '',
    retention interval DEFAULT NULL,
    wait boolean DEFAULT true)
RETURNS @extschema@.idem_claim_result
LANGUAGE plproxy
AS $$ CLUSTER 'idempotency'; RUN ON @extschema@.idem_route_hash(scope); $$;

CREATE FUNCTION @extschema@.idem_complete(
    key text,
    token bigint,
    result jsonb DEFAULT NULL,
    response_code integer DEFAULT NULL,
    scope text DEFAULT '',
    headers jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plproxy
AS $$ CLUSTER 'idempotency'; RUN ON @extschema@.idem_route_hash(scope); $$;

CREATE FUNCTION @extschema@.idem_fail(
    key text,
    token bigint,
    error jsonb,
    retryable boolean DEFAULT true,
    scope text DEFAULT '',
    response_code integer DEFAULT NULL,
    headers jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plproxy
AS $$ CLUSTER 'idempotency'; RUN ON @extschema@.idem_route_hash(scope); $$;

CREATE FUNCTION @extschema@.idem_checkpoint(
    key text,
    token bigint,
    recovery_point text,
    extend_lease interval DEFAULT NULL,
    scope text DEFAULT '')
RETURNS timestamptz
LANGUAGE plproxy
AS $$ CLUSTER 'idempotency'; RUN ON @extschema@.idem_route_hash(scope); $$;

CREATE FUNCTION @extschema@.idem_release(key text, token bigint, scope text DEFAULT '')
RETURNS void
LANGUAGE plproxy
AS $$ CLUSTER 'idempotency'; RUN ON @extschema@.idem_route_hash(scope); $$;

CREATE FUNCTION @extschema@.idem_mark_unknown(key text, token bigint, detail jsonb,
                                              scope text DEFAULT '')
RETURNS void
LANGUAGE plproxy
AS $$ CLUSTER 'idempotency'; RUN ON @extschema@.idem_route_hash(scope); $$;

CREATE FUNCTION @extschema@.idem_resolve(
    key text,
    status @extschema@.idem_status,
    result jsonb DEFAULT NULL,
    response_code integer DEFAULT NULL,
    scope text DEFAULT '',
    retryable boolean DEFAULT false,
    headers jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plproxy
AS $$ CLUSTER 'idempotency'; RUN ON @extschema@.idem_route_hash(scope); $$;

CREATE FUNCTION @extschema@.idem_lookup(key text, scope text DEFAULT '')
RETURNS SETOF @extschema@.idempotency_records
LANGUAGE plproxy
AS $$ CLUSTER 'idempotency'; RUN ON @extschema@.idem_route_hash(scope); $$;

CREATE FUNCTION @extschema@.idem_await(key text, scope text DEFAULT '',
                                       timeout interval DEFAULT '5s')
RETURNS SETOF @extschema@.idempotency_records
LANGUAGE plproxy
AS $$ CLUSTER 'idempotency'; RUN ON @extschema@.idem_route_hash(scope); $$;

-- The inbox: on the shard of the consumer's tenant ("t1/billing": "t1").
CREATE FUNCTION @extschema@.idem_inbox_accept(consumer text, message_id text,
                                              retention interval DEFAULT NULL,
                                              wait boolean DEFAULT true)
RETURNS boolean
LANGUAGE plproxy
AS $$ CLUSTER 'idempotency'; RUN ON @extschema@.idem_route_hash(consumer); $$;

CREATE FUNCTION @extschema@.idem_inbox_accept_seq(consumer text, stream text, seq bigint,
                                                  accept_gap boolean DEFAULT false)
RETURNS text
LANGUAGE plproxy
AS $$ CLUSTER 'idempotency'; RUN ON @extschema@.idem_route_hash(consumer); $$;

CREATE FUNCTION @extschema@.idem_inbox_accept_seq(consumer text, stream text, major bigint,
                                                  minor integer, accept_gap boolean DEFAULT true)
RETURNS text
LANGUAGE plproxy
AS $$ CLUSTER 'idempotency'; RUN ON @extschema@.idem_route_hash(consumer); $$;

CREATE FUNCTION @extschema@.idem_inbox_watermark(consumer text, stream text)
RETURNS bigint
LANGUAGE plproxy
AS $$ CLUSTER 'idempotency'; RUN ON @extschema@.idem_route_hash(consumer); $$;

-- The batch inbox (issue 17): a batch has one consumer, so one shard.
CREATE FUNCTION @extschema@.idem_inbox_accept_many(consumer text, message_ids text[],
                                                   retention interval DEFAULT NULL,
                                                   wait boolean DEFAULT true)
RETURNS SETOF text
LANGUAGE plproxy
AS $$ CLUSTER 'idempotency'; RUN ON @extschema@.idem_route_hash(consumer); $$;

CREATE FUNCTION @extschema@.idem_inbox_accept_seq_many(consumer text, stream text, seqs bigint[],
                                                       accept_gap boolean DEFAULT false)
RETURNS TABLE (seq bigint, outcome text)
LANGUAGE plproxy
AS $$ CLUSTER 'idempotency'; RUN ON @extschema@.idem_route_hash(consumer); $$;

/*
 * The outbox.  An emit runs on the shard of its scope, the message's tenant,
 * so that it lands where the tenant's records and business rows are.
 * Through the proxy an emit is a transaction of its own on the shard: a
 * message that must commit with a business change is emitted by the
 * shard-side business function (idem_proxy_function), in its transaction.
 *
 * A relay works on one shard: a claim hands out that shard's messages under
 * that shard's fencing token, and the ack or nack of the batch must go to the
 * same shard.  A message id is a UUID without a scope, so it cannot be
 * routed by hash; the relay functions of the proxy take the shard instead,
 * written as in the partition map, and run there (RUN ON the shard's lowest
 * partition): idem_outbox_claim_on, idem_outbox_ack_on, idem_outbox_nack_on.
 * A relay that can reach the shards is better run on each shard directly,
 * where it can LISTEN (PL/Proxy does not forward notifications).  Retrying a
 * dead message is an operator's rare act on an id seen in idem_stuck: it is
 * looked for on every shard (RUN ON ALL), ids being unique.
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
LANGUAGE plproxy
AS $$ CLUSTER 'idempotency'; RUN ON @extschema@.idem_route_hash(scope); $$;

CREATE FUNCTION @extschema@.idem_outbox_emit_batch(
    topic text,
    keys text[],
    payloads jsonb[],
    types text[] DEFAULT NULL,
    headers jsonb[] DEFAULT NULL,
    scope text DEFAULT '',
    delay interval DEFAULT NULL)
RETURNS uuid[]
LANGUAGE plproxy
AS $$ CLUSTER 'idempotency'; RUN ON @extschema@.idem_route_hash(scope); $$;

-- The partition a shard is reached by: its lowest one in the map.
CREATE FUNCTION @extschema@.idem_router_shard(shard text)
RETURNS integer
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    p integer;
BEGIN
    IF shard IS NULL THEN
        RAISE EXCEPTION 'shard must not be null'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'Name the shard by its connection string, as in idem_router_partitions().';
    END IF;
    SELECT min(m.partition) INTO p FROM @extschema@.idem_router_partitions() m WHERE m.connstr = shard;
    IF p IS NULL THEN
        RAISE EXCEPTION 'connection string is not one of the cluster''s shards'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'A shard is named by its connection string exactly as in the partition map, and only a shard that holds a partition can be reached through the proxy.',
                  HINT = 'Copy it from idem_router_partitions(), or run the relay on the shard directly.';
    END IF;
    RETURN p;
END
$$;

COMMENT ON FUNCTION @extschema@.idem_router_shard(text) IS
    'the lowest partition of a shard of the PL/Proxy cluster "idempotency" (the shard named by its connection string in the map)';

CREATE FUNCTION @extschema@.idem_outbox_claim_on(
    shard text,
    relay text,
    batch integer DEFAULT 100,
    lease interval DEFAULT '30 seconds',
    topics text[] DEFAULT NULL)
RETURNS TABLE (id uuid, aggregatetype text, aggregateid text, type text,
               payload jsonb, headers jsonb, attempts integer, token bigint)
LANGUAGE plproxy
AS $$
    CLUSTER 'idempotency';
    RUN ON @extschema@.idem_router_shard(shard);
    SELECT c.id, c.aggregatetype, c.aggregateid, c.type, c.payload, c.headers, c.attempts, c.token
      FROM @extschema@.idem_outbox_claim(relay, batch, lease, topics) c;
$$;

COMMENT ON FUNCTION @extschema@.idem_outbox_claim_on(text, text, integer, interval, text[]) IS
    'idem_outbox_claim on one shard, named by its connection string in the map';

CREATE FUNCTION @extschema@.idem_outbox_ack_on(shard text, ids uuid[], token bigint)
RETURNS integer
LANGUAGE plproxy
AS $$
    CLUSTER 'idempotency';
    RUN ON @extschema@.idem_router_shard(shard);
    SELECT @extschema@.idem_outbox_ack(ids, token);
$$;

COMMENT ON FUNCTION @extschema@.idem_outbox_ack_on(text, uuid[], bigint) IS
    'idem_outbox_ack on one shard, named by its connection string in the map: the shard of the claim';

CREATE FUNCTION @extschema@.idem_outbox_nack_on(shard text, id uuid, token bigint, error jsonb,
                                                retry_after interval DEFAULT NULL)
RETURNS @extschema@.idem_outbox_status
LANGUAGE plproxy
AS $$
    CLUSTER 'idempotency';
    RUN ON @extschema@.idem_router_shard(shard);
    SELECT @extschema@.idem_outbox_nack(id, token, error, retry_after);
$$;

COMMENT ON FUNCTION @extschema@.idem_outbox_nack_on(text, uuid, bigint, jsonb, interval) IS
    'idem_outbox_nack on one shard, named by its connection string in the map: the shard of the claim';

-- Each shard retries the message if it holds it, and says so.
CREATE FUNCTION @extschema@.idem_shard_outbox_retry(message_id uuid, OUT shard text)
RETURNS SETOF text
LANGUAGE plproxy
AS $$
    CLUSTER 'idempotency';
    RUN ON ALL;
    SELECT pg_catalog.format('%s:%s/%s', COALESCE(pg_catalog.host(pg_catalog.inet_server_addr()), 'local'),
                             pg_catalog.current_setting('port'), pg_catalog.current_database()) AS shard
      FROM @extschema@.idem_outbox o
     CROSS JOIN LATERAL @extschema@.idem_outbox_retry(o.id) r
     WHERE o.id OPERATOR(pg_catalog.=) message_id;
$$;

CREATE FUNCTION @extschema@.idem_outbox_retry(id uuid)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF id IS NULL THEN
        RAISE EXCEPTION 'id must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT EXISTS (SELECT FROM @extschema@.idem_shard_outbox_retry(id)) THEN
        RAISE EXCEPTION 'outbox message % does not exist', id
            USING ERRCODE = 'IK004',
                  DETAIL = 'No shard holds it: it was never emitted, its transaction has not committed, or it was purged after its retention.';
    END IF;
END
$$;

COMMENT ON FUNCTION @extschema@.idem_outbox_retry(uuid) IS
    'put a dead outbox message back on whichever shard holds it (looked for on every shard)';

/*
 * Over all shards.  Each shard answers once (RUN ON ALL runs once per
 * distinct connection string) with its rows and its name; the views and
 * idem_stats() add the rows up.  A scope is on one shard, so idem_summary
 * has a row per scope and status as on one server.  The shards' idem_stuck
 * lists the outbox's dead and late messages after the records, and their
 * idem_stats the outbox counters: both come through as they are.
 */
CREATE FUNCTION @extschema@.idem_shard_summary(
    OUT shard text, OUT scope text, OUT status @extschema@.idem_status, OUT records bigint,
    OUT oldest timestamptz, OUT expired bigint)
RETURNS SETOF record
LANGUAGE plproxy
AS $$
    CLUSTER 'idempotency';
    RUN ON ALL;
    SELECT pg_catalog.format('%s:%s/%s', COALESCE(pg_catalog.host(pg_catalog.inet_server_addr()), 'local'),
                             pg_catalog.current_setting('port'), pg_catalog.current_database()) AS shard,
           v.scope, v.status, v.records, v.oldest, v.expired
      FROM @extschema@.idem_summary v;
$$;

CREATE FUNCTION @extschema@.idem_shard_stuck(
    OUT shard text, OUT scope text, OUT key text, OUT status @extschema@.idem_status,
    OUT reason text, OUT age interval, OUT attempts integer, OUT recovery_point text,
    OUT error jsonb, OUT lease_expires_at timestamptz, OUT created_at timestamptz,
    OUT updated_at timestamptz, OUT topic text, OUT message_id uuid,
    OUT outbox_status @extschema@.idem_outbox_status)
RETURNS SETOF record
LANGUAGE plproxy
AS $$
    CLUSTER 'idempotency';
    RUN ON ALL;
    SELECT pg_catalog.format('%s:%s/%s', COALESCE(pg_catalog.host(pg_catalog.inet_server_addr()), 'local'),
                             pg_catalog.current_setting('port'), pg_catalog.current_database()) AS shard,
           v.scope, v.key, v.status, v.reason, v.age, v.attempts, v.recovery_point, v.error,
           v.lease_expires_at, v.created_at, v.updated_at, v.topic, v.message_id, v.outbox_status
      FROM @extschema@.idem_stuck v;
$$;

CREATE FUNCTION @extschema@.idem_shard_stats(
    OUT shard text, OUT counter text, OUT value bigint, OUT since timestamptz)
RETURNS SETOF record
LANGUAGE plproxy
AS $$
    CLUSTER 'idempotency';
    RUN ON ALL;
    SELECT pg_catalog.format('%s:%s/%s', COALESCE(pg_catalog.host(pg_catalog.inet_server_addr()), 'local'),
                             pg_catalog.current_setting('port'), pg_catalog.current_database()) AS shard,
           v.counter, v.value, v.since
      FROM @extschema@.idem_stats() v;
$$;

CREATE VIEW @extschema@.idem_summary AS
    SELECT s.scope COLLATE "C" AS scope, s.status, sum(s.records)::bigint AS records,
           min(s.oldest) AS oldest, sum(s.expired)::bigint AS expired
      FROM @extschema@.idem_shard_summary() s
     GROUP BY 1, s.status
     ORDER BY 1, s.status;

CREATE VIEW @extschema@.idem_stuck AS
    SELECT s.scope COLLATE "C" AS scope, s.key COLLATE "C" AS key, s.status, s.reason, s.age,
           s.attempts, s.recovery_point, s.error, s.lease_expires_at, s.created_at, s.updated_at,
           s.topic, s.message_id, s.outbox_status, s.shard
      FROM @extschema@.idem_shard_stuck() s
     ORDER BY s.created_at;

-- The counters of all shards added up, in the shards' order; since: the
-- earliest of their resets.
CREATE FUNCTION @extschema@.idem_stats(OUT counter text, OUT value bigint, OUT since timestamptz)
RETURNS SETOF record
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.counter, sum(s.value)::bigint, min(s.since)
      FROM @extschema@.idem_shard_stats() WITH ORDINALITY s(shard, counter, value, since, n)
     GROUP BY s.counter
     ORDER BY min(s.n)
$$;

/*
 * The proxy function of a user's shard-side business procedure (claim,
 * business writes and completion in one function, so they commit on one
 * shard in one transaction).  The function's definition is read from every
 * shard, which must agree on it, with search_path = pg_catalog there, so
 * every name in it comes schema-qualified; the proxy function gets the same
 * schema, name, arguments and result, and runs on the shard of the scope
 * argument (referred to by position, whatever its name).  The shard's query
 * is parsed under the mapped user's search_path, so it names everything
 * with its schema; the lookup takes the name only after set_config() has
 * run (through s.sp), so no plan can resolve it under that search_path.
 * Every name and argument list comes from the catalogs, quoted by
 * PostgreSQL, and goes into the DDL with %I or as it was deparsed.
 */
CREATE FUNCTION @extschema@.idem_shard_function(
    i_function text,
    OUT schema_name text, OUT function_name text, OUT kind text, OUT arguments text,
    OUT result text, OUT argnames text[], OUT argmodes text[], OUT argtypes text[])
RETURNS SETOF record
LANGUAGE plproxy
AS $$
    CLUSTER 'idempotency';
    RUN ON ALL;
    SELECT d.schema_name, d.function_name, d.kind, d.arguments, d.result, d.argnames,
           d.argmodes, d.argtypes
      FROM (SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true) AS sp) s
     CROSS JOIN LATERAL (
           SELECT n.nspname::pg_catalog.text AS schema_name, p.proname::pg_catalog.text AS function_name,
                  p.prokind::pg_catalog.text AS kind,
                  pg_catalog.pg_get_function_arguments(p.oid) AS arguments,
                  pg_catalog.pg_get_function_result(p.oid) AS result,
                  p.proargnames AS argnames, p.proargmodes::pg_catalog.text[] AS argmodes,
                  ARRAY(SELECT pg_catalog.format_type(t.t, NULL)
                          FROM pg_catalog.unnest(p.proargtypes::pg_catalog.oid[]) WITH ORDINALITY t(t, o)
                         ORDER BY t.o) AS argtypes
             FROM pg_catalog.pg_proc p
             JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
            WHERE p.oid OPERATOR(pg_catalog.=)
                  pg_catalog.to_regprocedure(CASE WHEN s.sp IS NOT NULL THEN i_function END)) d;
$$;

CREATE FUNCTION @extschema@.idem_proxy_function(shard_function text, scope_argument text,
                                                replace boolean DEFAULT false)
RETURNS regprocedure
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- the name itself: @extschema@ comes quoted already where quoting is needed
    router_schema name := (SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
                            WHERE e.extname = 'idempotency_router');
    shards integer;
    d record;
    scope_position integer := 0;
    inputs integer := 0;
    mode text;
    signature text;
    existed boolean;
    created regprocedure;
BEGIN
    IF shard_function IS NULL OR scope_argument IS NULL OR replace IS NULL THEN
        RAISE EXCEPTION 'shard function, scope argument and replace must not be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT count(DISTINCT p.connstr) INTO shards FROM @extschema@.idem_router_partitions() p;
    IF shards = 0 THEN
        RAISE EXCEPTION 'PL/Proxy cluster "idempotency" is not configured'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Create it with idem_router_configure().';
    END IF;
    SELECT f.*, count(*) OVER () AS found,
           count(*) OVER (PARTITION BY f.schema_name, f.function_name, f.kind, f.arguments,
                                       f.result, f.argnames, f.argmodes, f.argtypes) AS same
      INTO d
      FROM @extschema@.idem_shard_function(shard_function) f;
    IF coalesce(d.found, 0) < shards THEN
        RAISE EXCEPTION 'function % does not exist on every shard', shard_function
            USING ERRCODE = 'undefined_function',
                  DETAIL = format('It was found on %s of the %s shards.', coalesce(d.found, 0), shards),
                  HINT = 'Create it on every shard first, and name it with its schema and argument types, as in "shop.place_order(text, text, jsonb)".';
    END IF;
    IF d.same <> d.found THEN
        RAISE EXCEPTION 'function % differs between the shards', shard_function
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Give it the same arguments and result on every shard.';
    END IF;
    IF d.kind <> 'f' THEN
        RAISE EXCEPTION '% is not a plain function', shard_function
            USING ERRCODE = 'wrong_object_type',
                  DETAIL = 'PL/Proxy calls a function with SELECT; a procedure, aggregate or window function cannot be called so.';
    END IF;
    FOR i IN 1 .. coalesce(cardinality(d.argnames), cardinality(d.argtypes)) LOOP
        mode := coalesce(d.argmodes[i], 'i');
        CONTINUE WHEN mode NOT IN ('i', 'b', 'v');
        inputs := inputs + 1;
        IF d.argnames[i] = scope_argument THEN
            IF mode = 'v' THEN
                RAISE EXCEPTION 'scope argument "%" of % is variadic', scope_argument, shard_function
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            scope_position := inputs;
        END IF;
    END LOOP;
    IF scope_position = 0 THEN
        RAISE EXCEPTION 'function % has no input argument named "%"', shard_function, scope_argument
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Name the argument that carries the scope (a text) as it is, without quotes.';
    END IF;
    IF d.argtypes[scope_position] <> 'text' THEN
        RAISE EXCEPTION 'scope argument "%" of % is of type %, not text', scope_argument,
                        shard_function, d.argtypes[scope_position]
            USING ERRCODE = 'datatype_mismatch';
    END IF;
    signature := format('%I.%I(%s)', d.schema_name, d.function_name, array_to_string(d.argtypes, ', '));
    existed := to_regprocedure(signature) IS NOT NULL;
    EXECUTE format('CREATE %sFUNCTION %I.%I(%s) RETURNS %s LANGUAGE plproxy AS %L',
                   CASE WHEN replace THEN 'OR REPLACE ' END, d.schema_name, d.function_name,
                   d.arguments, d.result,
                   format(E'\n    CLUSTER %L;\n    RUN ON %I.idem_route_hash($%s);\n',
                          'idempotency', router_schema, scope_position));
    created := signature::regprocedure;
    -- Not PUBLIC's, like the router's own functions: a call runs on the shard
    -- as the user mapping's role, whoever calls here.  A replaced function
    -- keeps its privileges, as CREATE OR REPLACE does.
    IF NOT existed THEN
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', created);
    END IF;
    RETURN created;
END
$$;

COMMENT ON FUNCTION @extschema@.idem_proxy_function(text, text, boolean) IS
    'create the proxy function of a shard-side function: same name and arguments, run on the shard of the scope argument; a new one is not PUBLIC''s (grant EXECUTE on it)';

/*
 * Privileges as on the shards: PUBLIC may compute (hashes, fingerprints,
 * the partition map), nothing more.  Calling needs EXECUTE here, USAGE on
 * the server and a user mapping, and the privileges on the shards.
 */
REVOKE EXECUTE ON FUNCTION
    @extschema@.idem_router_configure(text[], integer),
    @extschema@.idem_router_set_partition(integer, text, boolean),
    @extschema@.idem_request_fingerprint(text, text, jsonb, text[]),
    @extschema@.idem_inbox_seq(bigint, integer),
    @extschema@.idem_claim(text, bytea, interval, text, interval, boolean),
    @extschema@.idem_complete(text, bigint, jsonb, integer, text, jsonb),
    @extschema@.idem_fail(text, bigint, jsonb, boolean, text, integer, jsonb),
    @extschema@.idem_checkpoint(text, bigint, text, interval, text),
    @extschema@.idem_release(text, bigint, text),
    @extschema@.idem_mark_unknown(text, bigint, jsonb, text),
    @extschema@.idem_resolve(text, @extschema@.idem_status, jsonb, integer, text, boolean, jsonb),
    @extschema@.idem_lookup(text, text),
    @extschema@.idem_await(text, text, interval),
    @extschema@.idem_inbox_accept(text, text, interval, boolean),
    @extschema@.idem_inbox_accept_seq(text, text, bigint, boolean),
    @extschema@.idem_inbox_accept_seq(text, text, bigint, integer, boolean),
    @extschema@.idem_inbox_watermark(text, text),
    @extschema@.idem_outbox_emit(text, text, jsonb, text, jsonb, text, interval),
    @extschema@.idem_outbox_emit_batch(text, text[], jsonb[], text[], jsonb[], text, interval),
    @extschema@.idem_outbox_claim_on(text, text, integer, interval, text[]),
    @extschema@.idem_outbox_ack_on(text, uuid[], bigint),
    @extschema@.idem_outbox_nack_on(text, uuid, bigint, jsonb, interval),
    @extschema@.idem_shard_outbox_retry(uuid),
    @extschema@.idem_outbox_retry(uuid),
    @extschema@.idem_inbox_accept_many(text, text[], interval, boolean),
    @extschema@.idem_inbox_accept_seq_many(text, text, bigint[], boolean),
    @extschema@.idem_shard_summary(),
    @extschema@.idem_shard_stuck(),
    @extschema@.idem_shard_stats(),
    @extschema@.idem_stats(),
    @extschema@.idem_shard_function(text),
    @extschema@.idem_proxy_function(text, text, boolean)
FROM PUBLIC;
REVOKE ALL ON TABLE @extschema@.idem_summary, @extschema@.idem_stuck FROM PUBLIC;
