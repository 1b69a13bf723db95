\set k random(1, 10)
SELECT outcome FROM plpgsql_claim('h' || :k, '\x01'::bytea, '5 ms');
