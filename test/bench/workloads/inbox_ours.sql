\set k random(1, 1000000000000)
SELECT idem_inbox_accept('c' || :client_id, :k::text);
