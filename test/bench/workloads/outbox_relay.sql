-- one round of a relay: claim a batch of 100, acknowledge it (publishing
-- itself is the broker's cost, measured by nobody here).  Run with -M
-- prepared: :ids is then a parameter.
SELECT coalesce(array_agg(id)::text, '{}') AS ids, coalesce(max(token), 1) AS token,
       count(*) > 0 AS got
FROM idem_outbox_claim('relay' || :client_id, 100, '30 seconds') \gset
\if :got
SELECT idem_outbox_ack(:ids::uuid[], :token);
\endif
