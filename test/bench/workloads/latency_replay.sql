\set k random(1, :rows)
SELECT outcome, result, response_code FROM idem_claim('L' || :k, '\x01'::bytea, '30 seconds');
