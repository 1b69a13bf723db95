\set k random(1, 10000000000)
SELECT count(*) FROM idem_inbox_accept_many('c' || :client_id,
    ARRAY(SELECT (:k::bigint * 1000 + 999 - g)::text FROM generate_series(0, 99) g));
