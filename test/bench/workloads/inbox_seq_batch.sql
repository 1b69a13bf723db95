SELECT count(*) FROM idem_inbox_accept_seq_many('c', 'p' || :client_id,
    ARRAY(SELECT coalesce(idem_inbox_watermark('c', 'p' || :client_id), 0) + g
          FROM generate_series(1, 100) g)) WHERE outcome = 'new';
