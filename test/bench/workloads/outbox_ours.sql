\set k random(1, 10000)
BEGIN;
UPDATE bench_accounts SET n = n + 1 WHERE id = :k;
SELECT idem_outbox_emit('accounts', :k::text, '{"amount": 1}', 'Credited');
END;
