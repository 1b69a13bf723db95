\set k random(1, 1000000000000)
BEGIN;
SELECT token FROM plpgsql_claim('n' || :client_id || '-' || :k, '\x01'::bytea, '30 seconds') \gset
SELECT plpgsql_complete('n' || :client_id || '-' || :k, :token, '{"order_id": 1}', 201);
COMMIT;
