-- idem-test: superuser: it creates idempotency_router and PL/Proxy, extensions only a superuser may create (not trusted)
--
-- idempotency_router, the extension of a sharded deployment's proxy
-- database (README "Scaling out").  Here beside the extension itself, in a
-- schema of its own, to check that what the router computes in SQL is what
-- the C library computes, and the errors of its configuration functions.
-- Calls through PL/Proxy to real shards are tested by TAP 016.
--
SET client_min_messages = warning;
-- Not in a schema whose name needs quoting: PL/Proxy's RUN ON cannot
-- quote it (nothing is left behind).
-- (without CONTEXT: from 18 on it names the extension script's line too)
\set SHOW_CONTEXT never
CREATE SCHEMA "Router X";
CREATE EXTENSION idempotency_router SCHEMA "Router X" CASCADE;
CREATE SCHEMA "all";
CREATE EXTENSION idempotency_router SCHEMA "all" CASCADE;
\set SHOW_CONTEXT errors
SELECT count(*) AS extensions FROM pg_extension WHERE extname IN ('idempotency_router', 'plproxy');
DROP SCHEMA "Router X", "all";
CREATE SCHEMA router;
CREATE EXTENSION idempotency_router SCHEMA router CASCADE;
RESET client_min_messages;

-- The routing hash: the fixed vectors of route_hash.sql, and 2000 scopes.
SELECT v.scope, router.idem_route_hash(v.scope) AS hash,
       router.idem_route_hash(v.scope) = v.expected AS as_computed,
       router.idem_route_hash(v.scope) = public.idem_route_hash(v.scope) AS as_in_c
FROM (VALUES ('', -474954686), ('t1', 1653295577), ('t1/orders', 1653295577),
             ('tenant-42', -149080255), ('tenant-42/payments/eu', -149080255),
             ('Zürich/orders', 1112631390), ('日本', -819282164), ('/x', -474954686)) v(scope, expected);
SELECT count(*) AS scopes,
       count(*) FILTER (WHERE router.idem_route_hash(s) = public.idem_route_hash(s)) AS same
FROM (SELECT 'tenant-' || i || CASE WHEN i % 3 = 0 THEN '/orders/' || i ELSE '' END AS s
      FROM generate_series(1, 2000) i) g;
SELECT router.idem_route_hash(NULL);

-- The fingerprints: the same digests as the C library's.
SELECT count(*) AS requests,
       count(*) FILTER (WHERE router.idem_fingerprint(j) = public.idem_fingerprint(j)) AS jsonb_same,
       count(*) FILTER (WHERE router.idem_fingerprint(j::text) = public.idem_fingerprint(j::text)) AS text_same,
       count(*) FILTER (WHERE router.idem_fingerprint(convert_to(j::text, 'UTF8'))
                              = public.idem_fingerprint(convert_to(j::text, 'UTF8'))) AS bytea_same
FROM (VALUES ('{"a": 1, "b": [1, 2.50, null]}'::jsonb), ('{"b": 2, "a": 1, "a": 3}'),
             ('"Zürich 日本"'), ('1.00'), ('[]'), ('{}'), ('{"x": {"y": {"z": "\\u0001"}}}'),
             ('null'), ('true'), ('{"amount": 1e3, "k": "v"}')) v(j);
SELECT encode(router.idem_fingerprint('abc'::text), 'hex') AS sha256_abc,
       router.idem_fingerprint(''::bytea) = public.idem_fingerprint(''::bytea) AS empty_same,
       router.idem_fingerprint(NULL::jsonb) IS NULL AS null_is_null;

-- Not configured yet.
SELECT count(*) AS partitions FROM router.idem_router_partitions();
SELECT router.idem_router_partition('t1');

-- The cluster: bad input.
SELECT router.idem_router_configure(NULL);
SELECT router.idem_router_configure('{}');
SELECT router.idem_router_configure(ARRAY['dbname=a', NULL]);
SELECT router.idem_router_configure(ARRAY['dbname=a', '']);
SELECT router.idem_router_configure(ARRAY['dbname=a', 'dbname=a']);
SELECT router.idem_router_configure(ARRAY['dbname=a', 'dbname=b'], 12);
SELECT router.idem_router_configure(ARRAY['dbname=a', 'dbname=b', 'dbname=c'], 2);
SELECT router.idem_router_configure(ARRAY['dbname=a'], 131072);
SELECT count(*) AS servers FROM pg_foreign_server WHERE srvname = 'idempotency';

-- Four shards, sixteen partitions (nothing connects to them here).
SELECT router.idem_router_configure(ARRAY['dbname=s0', 'dbname=s1', 'dbname=s2', 'dbname=s3'], 16);
SELECT * FROM router.idem_router_partitions();
SELECT router.idem_router_configure(ARRAY['dbname=s0']);
SELECT s.scope, router.idem_router_partition(s.scope) AS partition,
       router.idem_router_partition(s.scope) = public.idem_route_hash(s.scope) & 15 AS low_bits
FROM (VALUES ('t1'), ('t1/orders'), ('tenant-42'), ('')) s(scope);

-- Moving a partition: to one of the shards, written as in the map, or to a
-- new one with new_shard.
SELECT router.idem_router_set_partition(16, 'dbname=s1');
SELECT router.idem_router_set_partition(NULL, 'dbname=s1');
SELECT router.idem_router_set_partition(5, '');
SELECT router.idem_router_set_partition(5, 'dbname=s9');
SELECT router.idem_router_set_partition(5, 'dbname=s1 ');
SELECT router.idem_router_set_partition(5, 'dbname=s2');
SELECT router.idem_router_set_partition(5, 'dbname=s2', NULL);
-- A shard the map does not hold yet: only when asked for.
SELECT router.idem_router_set_partition(6, 'dbname=s4', new_shard => true);
SELECT router.idem_router_set_partition(7, 'dbname=s4', new_shard => true);
SELECT partition, connstr FROM router.idem_router_partitions() WHERE partition IN (4, 5, 6, 7);

-- A relay through the proxy names its shard as in the map; the call runs on
-- the shard's lowest partition.
SELECT v.shard, router.idem_router_shard(v.shard) AS runs_on
FROM (VALUES ('dbname=s0'), ('dbname=s1'), ('dbname=s2'), ('dbname=s3')) v(shard);
SELECT router.idem_router_shard('dbname=s9');
SELECT router.idem_router_shard('dbname=s1 ');
SELECT router.idem_router_shard(NULL);
SELECT router.idem_outbox_retry(NULL);

-- The generator's arguments.
SELECT router.idem_proxy_function(NULL, 'scope');
SELECT router.idem_proxy_function('shop.f(text)', NULL);

-- What PUBLIC may do on the proxy: compute, nothing more.
SELECT p.oid::regprocedure AS function, has_function_privilege('public', p.oid, 'EXECUTE') AS public_executes
FROM pg_proc p JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency_router')
ORDER BY p.oid::regprocedure::text;
SELECT c.relname, has_table_privilege('public', c.oid, 'SELECT') AS public_selects
FROM pg_class c WHERE c.relnamespace = 'router'::regnamespace AND c.relkind = 'v' ORDER BY 1;
-- Every function that runs SQL on the proxy pins its search_path, and none
-- is SECURITY DEFINER (the PL/Proxy ones name everything with its schema).
SELECT l.lanname, count(*) AS functions,
       count(*) FILTER (WHERE p.proconfig = '{"search_path=pg_catalog, pg_temp"}') AS pinned,
       count(*) FILTER (WHERE p.prosecdef) AS security_definer
FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency_router')
GROUP BY 1 ORDER BY 1;

-- The router's API is the extension's: every function of the router that
-- the extension has too has the same arguments (names, types, defaults) and
-- result, and the types have the same attributes and labels.  A change of
-- the extension's API that the router does not follow fails here.
WITH f AS (
    SELECT e.extname, p.proname, replace(p.oid::regprocedure::text, 'router.', '') AS signature,
           pg_get_function_identity_arguments(p.oid) AS identity,
           replace(pg_get_function_arguments(p.oid), 'router.', '') AS arguments,
           replace(pg_get_function_result(p.oid), 'router.', '') AS result
      FROM pg_proc p
      JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
      JOIN pg_extension e ON e.oid = d.refobjid)
SELECT r.signature,
       CASE WHEN x.proname IS NULL THEN 'the router''s own'
            WHEN r.arguments = x.arguments AND r.result = x.result THEN 'as in the extension'
            ELSE format('DIFFERS: %s -> %s, the extension: %s -> %s', r.arguments, r.result, x.arguments, x.result)
       END AS api
  FROM f r
  LEFT JOIN f x ON x.extname = 'idempotency' AND x.proname = r.proname
                AND replace(r.identity, 'router.', '') = x.identity
 WHERE r.extname = 'idempotency_router'
 ORDER BY 1;
SELECT t.typname, count(*) AS attributes,
       count(*) FILTER (WHERE x.attname IS NOT NULL) AS as_in_the_extension
  FROM pg_type t
  JOIN pg_attribute a ON a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped
  LEFT JOIN pg_attribute x ON x.attrelid = format('public.%I', t.typname)::regclass
                          AND x.attnum > 0 AND NOT x.attisdropped AND x.attname = a.attname
                          AND replace(format_type(a.atttypid, a.atttypmod), 'router.', '') = format_type(x.atttypid, x.atttypmod)
                          AND a.attcollation = x.attcollation
 WHERE t.typnamespace = 'router'::regnamespace AND t.typname IN ('idem_claim_result', 'idempotency_records')
 GROUP BY 1 ORDER BY 1;
SELECT (SELECT count(*) FROM pg_attribute WHERE attrelid = 'public.idem_claim_result'::regclass AND attnum > 0 AND NOT attisdropped) AS claim_result_attributes,
       (SELECT count(*) FROM pg_attribute WHERE attrelid = 'public.idempotency_records'::regclass AND attnum > 0 AND NOT attisdropped) AS record_columns,
       enum_range(NULL::router.idem_status)::text = enum_range(NULL::public.idem_status)::text AS same_statuses,
       enum_range(NULL::router.idem_outbox_status)::text = enum_range(NULL::public.idem_outbox_status)::text AS same_outbox_statuses;
-- The views over all shards have the shards' columns (idem_stuck: with the
-- outbox's), in order: none of the extension's missing or different here.
WITH c AS (
    SELECT n.nspname, c.relname, a.attnum, a.attname,
           replace(format_type(a.atttypid, a.atttypmod), 'router.', '') AS type
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
      JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
     WHERE n.nspname IN ('public', 'router') AND c.relname IN ('idem_stuck', 'idem_summary'))
SELECT relname, attnum, attname, type FROM c WHERE nspname = 'public'
EXCEPT
SELECT relname, attnum, attname, type FROM c WHERE nspname = 'router'
ORDER BY 1, 2;
SELECT c.relname, c.relnamespace::regnamespace AS schema, count(*) AS columns,
       (array_agg(a.attname ORDER BY a.attnum DESC))[1] AS last
  FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
 WHERE c.relnamespace IN ('public'::regnamespace, 'router'::regnamespace)
   AND c.relname IN ('idem_stuck', 'idem_summary')
 GROUP BY 1, 2 ORDER BY 1, 2::text;

DROP SERVER idempotency;
DROP EXTENSION idempotency_router;
DROP EXTENSION plproxy;
DROP SCHEMA router;
