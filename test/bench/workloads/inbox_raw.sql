\set k random(1, 1000000000000)
INSERT INTO raw_inbox (consumer, message_id) VALUES ('c' || :client_id, :k::text) ON CONFLICT DO NOTHING;
