SELECT count(*)
FROM (SELECT coalesce(idem_inbox_watermark('c', 'p' || :client_id), 0) AS w) x,
     generate_series(1, 100) g,
     LATERAL idem_inbox_accept_seq('c', 'p' || :client_id, x.w + g) o
WHERE o = 'new';
