\set k random(1, 10)
BEGIN;
INSERT INTO raw_keys (key, fingerprint, status, locked_until)
VALUES ('h' || :k, '\x01'::bytea, 'processing', clock_timestamp() + interval '5 ms')
ON CONFLICT DO NOTHING;
UPDATE raw_keys SET token = token + 1, locked_until = clock_timestamp() + interval '5 ms'
 WHERE key = 'h' || :k AND locked_until < clock_timestamp();
COMMIT;
