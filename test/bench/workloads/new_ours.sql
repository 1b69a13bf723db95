\set k random(1, 1000000000000)
BEGIN;
SELECT token FROM idem_claim('n' || :client_id || '-' || :k, '\x01'::bytea, '30 seconds') \gset
SELECT idem_complete('n' || :client_id || '-' || :k, :token, '{"order_id": 1}', 201);
COMMIT;
