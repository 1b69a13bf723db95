\set k random(1, 10000)
BEGIN;
UPDATE bench_accounts SET n = n + 1 WHERE id = :k;
INSERT INTO raw_outbox (aggregatetype, aggregateid, payload, type) VALUES ('accounts', :k::text, '{"amount": 1}', 'Credited');
END;
