-- idem_route_hash: the shard hash of a scope (src/route.c).  The vectors
-- were computed outside PostgreSQL (Python's hashlib: the first four bytes
-- of SHA-256 of the tenant's UTF-8 bytes, big-endian, signed), so a change
-- of the hash fails here on every version and architecture.
SELECT v.scope, idem_route_hash(v.scope) AS hash, idem_route_hash(v.scope) = v.expected AS as_computed
FROM (VALUES ('', -474954686), ('t1', 1653295577), ('t1/orders', 1653295577),
             ('tenant-42', -149080255), ('tenant-42/payments/eu', -149080255),
             ('Zürich/orders', 1112631390), ('日本', -819282164), ('/x', -474954686)) v(scope, expected);

-- the SQL form of the README gives the same value, for many scopes
SELECT count(*) AS scopes,
       count(*) FILTER (WHERE idem_route_hash(s) = ('x' || left(encode(sha256(convert_to(split_part(s, '/', 1), 'UTF8')), 'hex'), 8))::bit(32)::int) AS same
FROM (SELECT 'tenant-' || i || CASE WHEN i % 3 = 0 THEN '/orders/' || i ELSE '' END AS s
      FROM generate_series(1, 2000) i) g;

-- a scope and its sub-scopes land together; 16 partitions are all used
SELECT count(DISTINCT idem_route_hash('tenant-' || i) & 15) AS partitions_used
FROM generate_series(1, 2000) i;

-- bad input
SELECT idem_route_hash(NULL);
SELECT idem_route_hash(repeat('x', 300));
