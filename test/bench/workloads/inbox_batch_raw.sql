\set k random(1, 10000000000)
WITH accepted AS (
    INSERT INTO raw_inbox (consumer, message_id)
    SELECT 'c' || :client_id, m
    FROM unnest(ARRAY(SELECT (:k::bigint * 1000 + 999 - g)::text FROM generate_series(0, 99) g)) m
    ON CONFLICT DO NOTHING RETURNING message_id)
SELECT count(*) FROM accepted;
