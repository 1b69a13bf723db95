\set k random(1, 10000)
SELECT outcome, result, response_code FROM plpgsql_claim('r' || :k, '\x01'::bytea, '30 seconds');
