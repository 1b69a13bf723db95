-- The inbox recipe's table (the consumer's business change), applied by
-- inbox/check and outbox/check as a superuser at each run: idempotent.  The
-- runner made the role api a client; it consumes too.
CREATE TABLE IF NOT EXISTS order_events (
    consumer text NOT NULL,
    order_id text NOT NULL,
    n int NOT NULL,                     -- the order's event number: 1, 2, 3, ...
    message_id text NOT NULL,
    stream text NOT NULL,
    stream_offset bigint NOT NULL,
    applied bigint GENERATED ALWAYS AS IDENTITY);   -- the order of applying
GRANT SELECT, INSERT ON order_events TO api;
SELECT idem_grant('consumer', 'api');
