\set k random(1, 10000)
SELECT status, response, response_code FROM raw_keys WHERE key = 'r' || :k;
