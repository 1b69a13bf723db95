\set k random(1, 1000000000000)
BEGIN;
INSERT INTO raw_keys (key, fingerprint, status, locked_until)
VALUES ('n' || :client_id || '-' || :k, '\x01'::bytea, 'processing', now() + interval '30 seconds')
ON CONFLICT DO NOTHING;
UPDATE raw_keys SET status = 'succeeded', response = '{"order_id": 1}', response_code = 201,
       completed_at = now(), locked_until = NULL
 WHERE key = 'n' || :client_id || '-' || :k AND status = 'processing' AND token = 1;
COMMIT;
