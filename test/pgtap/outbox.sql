-- The transactional outbox as an application and its relays use it: an emit
-- commits or rolls back with the business change; a claim hands out
-- available messages, at most one per (topic, key) and in emit order, under
-- one fencing token per batch; ack publishes, nack backs off exponentially
-- (or after retry_after) until idempotency.outbox_max_attempts makes the
-- message dead, which no longer holds up its key; idem_outbox_retry puts it
-- back behind its key's newer messages; an expired lease is taken over with
-- a new token and the old token is refused.  Races of two relays are in
-- test/specs/outbox-relays.spec.  Everything is rolled back; the only
-- waiting is a sleep past leases of a few milliseconds.
BEGIN;
SELECT plan(71);

DELETE FROM idem_outbox;
CREATE TEMP TABLE orders (id text PRIMARY KEY, amount integer NOT NULL CHECK (amount > 0));
CREATE TEMP TABLE m (name text PRIMARY KEY, id uuid);
CREATE FUNCTION pg_temp.id(name text) RETURNS uuid LANGUAGE sql AS $$ SELECT id FROM m WHERE m.name = $1 $$;
CREATE FUNCTION pg_temp.st(name text) RETURNS text LANGUAGE sql AS $$
    SELECT status::text FROM idem_outbox WHERE id = pg_temp.id($1) $$;
-- a business transaction: the order and its event, together
CREATE FUNCTION pg_temp.place(order_id text, amount integer) RETURNS uuid LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO orders VALUES (order_id, amount);
    RETURN idem_outbox_emit('orders', order_id, jsonb_build_object('amount', amount), 'OrderPlaced');
END
$$;

-- emit follows the business transaction -----------------------------------------------------
SAVEPOINT business;
INSERT INTO m VALUES ('rolled back', pg_temp.place('o-1', 10));
SELECT is((SELECT count(*) FROM idem_outbox WHERE aggregateid = 'o-1'), 1::bigint,
          'the emit is visible inside its transaction');
ROLLBACK TO SAVEPOINT business;
SELECT is((SELECT count(*) FROM idem_outbox), 0::bigint, 'a rolled-back business transaction leaves no message');
SELECT throws_ok($$SELECT pg_temp.place('o-2', 0)$$, '23514', NULL,
                 'a business change that fails after its emit ...');
SELECT is((SELECT count(*) FROM idem_outbox), 0::bigint, '... takes the message with it');

INSERT INTO m VALUES ('a1', pg_temp.place('o-a', 1));
SELECT is(substr(pg_temp.id('a1')::text, 15, 1), '7', 'ids are UUIDs of version 7');
SELECT results_eq($$SELECT aggregatetype COLLATE "default", aggregateid COLLATE "default", type, payload, headers,
                           scope COLLATE "default", status::text,
                           attempts, token, available_at = created_at, last_error IS NULL
                    FROM idem_outbox WHERE id = pg_temp.id('a1')$$,
                  $$VALUES ('orders'::text, 'o-a'::text, 'OrderPlaced'::text, '{"amount": 1}'::jsonb,
                            NULL::jsonb, ''::text, 'pending'::text, 0, 0::bigint, true, true)$$,
                  'a new message: the Debezium router''s columns, pending, never claimed, available at once');
INSERT INTO m VALUES ('a2', idem_outbox_emit('orders', 'o-a', '{"amount": 2}', headers => '{"trace": "t1"}')),
                     ('a3', idem_outbox_emit('orders', 'o-a', '{"amount": 3}')),
                     ('b1', idem_outbox_emit('orders', 'o-b', '{}', scope => 'shop')),
                     ('later', idem_outbox_emit('orders', 'o-c', '{}', delay => '1 hour')),
                     ('p1', idem_outbox_emit('payments', 'p', '{}'));
SELECT ok(pg_temp.id('a1') < pg_temp.id('a2') AND pg_temp.id('a2') < pg_temp.id('a3'),
          'ids of one session grow');
SELECT ok((SELECT seq FROM idem_outbox WHERE id = pg_temp.id('a1')) < (SELECT seq FROM idem_outbox WHERE id = pg_temp.id('a2')),
          'seq records the order of emits');
SELECT is((SELECT headers FROM idem_outbox WHERE id = pg_temp.id('a2')), '{"trace": "t1"}'::jsonb, 'headers are kept');
SELECT is((SELECT scope FROM idem_outbox WHERE id = pg_temp.id('b1')), 'shop', 'and the scope');

SELECT is(cardinality(idem_outbox_emit_batch('batch', '{x,y,x}', '{1,2,3}', types => '{T,T,T}')), 3,
          'the batch form emits one message per key');
SELECT results_eq($$SELECT aggregateid COLLATE "default", payload::text, type FROM idem_outbox
                    WHERE aggregatetype = 'batch' ORDER BY seq$$,
                  $$VALUES ('x'::text, '1'::text, 'T'::text), ('y', '2', 'T'), ('x', '3', 'T')$$,
                  'in array order');
CREATE TEMP TABLE batch_ids AS
SELECT u.id, u.n FROM unnest(idem_outbox_emit_batch('batch-ids', ARRAY(SELECT 'k' || g FROM generate_series(1, 500) g),
                                                    ARRAY(SELECT to_jsonb(g) FROM generate_series(1, 500) g)))
                      WITH ORDINALITY u(id, n);
SELECT results_eq($$SELECT b.n, o.aggregateid COLLATE "default" FROM batch_ids b
                      LEFT JOIN idem_outbox o ON o.id = b.id ORDER BY b.n$$,
                  $$SELECT g::bigint, 'k' || g FROM generate_series(1, 500) g$$,
                  'the batch form returns the ids of its messages, in the order of keys');
DELETE FROM idem_outbox WHERE aggregatetype = 'batch-ids';

-- claim: one per key, in order, one token ---------------------------------------------------
CREATE TEMP TABLE c1 AS SELECT * FROM idem_outbox_claim('relay-1', 100, '1 hour', '{orders}');
SELECT bag_eq($$SELECT id FROM c1$$, $$SELECT pg_temp.id(n) FROM unnest('{a1,b1}'::text[]) n$$,
              'a claim hands out the head of each key of the topics asked for, nothing delayed or behind its key');
SELECT is((SELECT count(DISTINCT token) FROM c1), 1::bigint, 'the batch shares one token');
SELECT ok((SELECT min(token) FROM c1) > 0, 'tokens are positive');
SELECT results_eq($$SELECT DISTINCT status::text, relay, attempts,
                           lease_expires_at BETWEEN clock_timestamp() + interval '59 minutes'
                                                AND clock_timestamp() + interval '1 hour'
                    FROM idem_outbox WHERE id IN (SELECT id FROM c1)$$,
                  $$VALUES ('in_flight'::text, 'relay-1'::text, 1, true)$$,
                  'claimed messages are in flight for the relay, for the lease, with one attempt');
SELECT results_eq($$SELECT type, payload, attempts FROM c1 WHERE id = pg_temp.id('a1')$$,
                  $$VALUES ('OrderPlaced'::text, '{"amount": 1}'::jsonb, 1)$$, 'with type, payload and attempts');
SELECT is_empty($$SELECT * FROM idem_outbox_claim('relay-2', 100, '1 hour', '{orders}')$$,
                'another relay gets nothing: the rest of the topic waits behind its keys');

CREATE TEMP TABLE c2 AS SELECT * FROM idem_outbox_claim('relay-2', 1);
SELECT is((SELECT count(*) FROM c2), 1::bigint, 'batch limits the claim');
SELECT ok((SELECT max(token) FROM c2) > (SELECT max(token) FROM c1), 'the next claim gets a larger token');
CREATE TEMP TABLE c3 AS SELECT * FROM idem_outbox_claim('relay-2', 100);
SELECT is((SELECT count(*) FROM c3), 2::bigint, 'the other topics'' heads go to the next claim (x and y of batch, or payments)');
SELECT ok((SELECT min(token) FROM c3) > (SELECT max(token) FROM c2), 'tokens never repeat');

-- ack ---------------------------------------------------------------------------------------
SELECT is(idem_outbox_ack(ARRAY[pg_temp.id('a1')], (SELECT token FROM c1 LIMIT 1)), 1, 'ack publishes');
SELECT results_eq($$SELECT status::text, available_at, lease_expires_at FROM idem_outbox WHERE id = pg_temp.id('a1')$$,
                  $$VALUES ('published'::text, NULL::timestamptz, NULL::timestamptz)$$,
                  'a published message is out of the claim indexes');
SELECT is(idem_outbox_ack(ARRAY[pg_temp.id('a1')], (SELECT token FROM c1 LIMIT 1)), 0,
          'a repeated ack (its reply was lost) is accepted and changes nothing');
CREATE TEMP TABLE c4 AS SELECT * FROM idem_outbox_claim('relay-1', 100, '1 hour', '{orders}');
SELECT results_eq($$SELECT id FROM c4$$, $$VALUES (pg_temp.id('a2'))$$, 'the key''s next message follows its ack');
SELECT is((SELECT headers FROM c4), '{"trace": "t1"}'::jsonb, 'with its headers');
SELECT throws_ok(format('SELECT idem_outbox_ack(ARRAY[%L, %L]::uuid[], %s)', pg_temp.id('a2'), pg_temp.id('b1'),
                        (SELECT max(token) FROM c4)),
                 'IK002', NULL, 'an ack of a batch with one message of another token ...');
SELECT is(pg_temp.st('a2'), 'in_flight', '... publishes none of them');

-- nack: back-off, then dead ----------------------------------------------------------------
SELECT is(idem_outbox_nack(pg_temp.id('a2'), (SELECT max(token) FROM c4), '{"error": "nack"}')::text, 'pending',
          'nack gives the message back');
SELECT ok((SELECT available_at - clock_timestamp() BETWEEN interval '0.5 s' AND interval '1 s'
           FROM idem_outbox WHERE id = pg_temp.id('a2')), 'after 1 s, the first back-off');
SELECT results_eq($$SELECT last_error, lease_expires_at, token FROM idem_outbox WHERE id = pg_temp.id('a2')$$,
                  $$SELECT '{"error": "nack"}'::jsonb, NULL::timestamptz, token FROM c4$$,
                  'with its error, no lease, and the token of the claim it was given back by');
SELECT is_empty($$SELECT * FROM idem_outbox_claim('relay-1', 100, '1 hour', '{orders}') WHERE aggregateid = 'o-a'$$,
                'while it backs off, its key waits: a3 is not handed out');
UPDATE idem_outbox SET available_at = clock_timestamp() WHERE id = pg_temp.id('a2');
CREATE TEMP TABLE c5 AS SELECT * FROM idem_outbox_claim('relay-1', 100, '1 hour', '{orders}');
SELECT results_eq($$SELECT id, attempts FROM c5$$, $$VALUES (pg_temp.id('a2'), 2)$$, 'due again: its second attempt');
SELECT is(idem_outbox_nack(pg_temp.id('a2'), (SELECT max(token) FROM c5), '{}')::text, 'pending', 'a second nack');
SELECT ok((SELECT available_at - clock_timestamp() BETWEEN interval '1.5 s' AND interval '2 s'
           FROM idem_outbox WHERE id = pg_temp.id('a2')), 'backs off 2 s');
UPDATE idem_outbox SET available_at = clock_timestamp(), attempts = 12 WHERE id = pg_temp.id('a2');
SET LOCAL idempotency.outbox_max_attempts = 20;
CREATE TEMP TABLE c6 AS SELECT * FROM idem_outbox_claim('relay-1', 100, '1 hour', '{orders}');
SELECT is(idem_outbox_nack(pg_temp.id('a2'), (SELECT max(token) FROM c6), '{}')::text, 'pending', 'the 13th nack');
SELECT ok((SELECT available_at - clock_timestamp() BETWEEN interval '59 minutes' AND interval '1 hour'
           FROM idem_outbox WHERE id = pg_temp.id('a2')), 'backs off at most an hour');
UPDATE idem_outbox SET available_at = clock_timestamp() WHERE id = pg_temp.id('a2');
CREATE TEMP TABLE c7 AS SELECT * FROM idem_outbox_claim('relay-1', 100, '1 hour', '{orders}');
SELECT is(idem_outbox_nack(pg_temp.id('a2'), (SELECT max(token) FROM c7), '{}', retry_after => '0')::text, 'pending',
          'retry_after overrides the back-off ...');
CREATE TEMP TABLE c8 AS SELECT * FROM idem_outbox_claim('relay-1', 100, '1 hour', '{orders}');
SELECT results_eq($$SELECT id FROM c8$$, $$VALUES (pg_temp.id('a2'))$$, '... 0: at once');
SET LOCAL idempotency.outbox_max_attempts = 15;
SELECT is(idem_outbox_nack(pg_temp.id('a2'), (SELECT max(token) FROM c8), '{"error": "poison"}')::text, 'dead',
          'the nack of the idempotency.outbox_max_attempts-th attempt makes the message dead');
SELECT results_eq($$SELECT status::text, available_at, attempts, last_error FROM idem_outbox WHERE id = pg_temp.id('a2')$$,
                  $$VALUES ('dead'::text, NULL::timestamptz, 15, '{"error": "poison"}'::jsonb)$$,
                  'dead: out of the claim indexes, its attempts and last error kept');
RESET idempotency.outbox_max_attempts;
CREATE TEMP TABLE c9 AS SELECT * FROM idem_outbox_claim('relay-1', 100, '1 hour', '{orders}');
SELECT results_eq($$SELECT id FROM c9$$, $$VALUES (pg_temp.id('a3'))$$, 'a dead message no longer holds up its key');
SELECT is(idem_outbox_ack(ARRAY[pg_temp.id('a3')], (SELECT max(token) FROM c9)), 1, 'a3 is published');
SELECT throws_ok(format('SELECT idem_outbox_ack(ARRAY[%L]::uuid[], %s)', pg_temp.id('a2'), (SELECT max(token) FROM c8)),
                 'IK003', NULL, 'a dead message cannot be acknowledged');

-- retry -------------------------------------------------------------------------------------
INSERT INTO m VALUES ('a4', idem_outbox_emit('orders', 'o-a', '{"amount": 4}'));
SELECT lives_ok(format('SELECT idem_outbox_retry(%L)', pg_temp.id('a2')), 'an operator retries the dead message');
SELECT results_eq($$SELECT status::text, attempts, available_at <= clock_timestamp(),
                           seq > (SELECT seq FROM idem_outbox WHERE id = pg_temp.id('a4'))
                    FROM idem_outbox WHERE id = pg_temp.id('a2')$$,
                  $$VALUES ('pending'::text, 0, true, true)$$,
                  'pending at once, its attempts from 0, behind what its key emitted meanwhile');
CREATE TEMP TABLE c10 AS SELECT * FROM idem_outbox_claim('relay-1', 100, '1 hour', '{orders}');
SELECT results_eq($$SELECT id FROM c10 WHERE aggregateid = 'o-a'$$, $$VALUES (pg_temp.id('a4'))$$,
                  'so a4 goes first ...');
SELECT is(idem_outbox_ack(ARRAY[pg_temp.id('a4')], (SELECT token FROM c10 LIMIT 1)), 1, '... is published ...');
CREATE TEMP TABLE c11 AS SELECT * FROM idem_outbox_claim('relay-1', 100, '1 hour', '{orders}');
SELECT results_eq($$SELECT id, attempts FROM c11 WHERE aggregateid = 'o-a'$$, $$VALUES (pg_temp.id('a2'), 1)$$,
                  '... and then the retried message');

-- takeover of an expired lease --------------------------------------------------------------
DELETE FROM idem_outbox;
INSERT INTO m VALUES ('t1', idem_outbox_emit('jobs', 'j', '{}')), ('t2', idem_outbox_emit('jobs', 'j', '{}'));
CREATE TEMP TABLE old AS SELECT * FROM idem_outbox_claim('stale-relay', 10, '1 hour');
SELECT results_eq($$SELECT id FROM old$$, $$VALUES (pg_temp.id('t1'))$$, 'a relay claims t1');
SELECT is_empty($$SELECT * FROM idem_outbox_claim('relay-1', 10, '1 hour')$$,
                'before the lease runs out, nobody else gets t1, nor t2 behind it');
-- the lease runs out (moved back rather than waited for, so that a slow
-- machine cannot make it run out early)
UPDATE idem_outbox SET lease_expires_at = clock_timestamp() - interval '1 second' WHERE id = pg_temp.id('t1');
CREATE TEMP TABLE new AS SELECT * FROM idem_outbox_claim('relay-1', 10, '1 hour');
SELECT results_eq($$SELECT id, attempts FROM new$$, $$VALUES (pg_temp.id('t1'), 2)$$,
                  'after it, the next claim takes t1 over (its second attempt), and still not t2');
SELECT ok((SELECT max(token) FROM new) > (SELECT max(token) FROM old), 'under a newer token');
SELECT is((SELECT relay FROM idem_outbox WHERE id = pg_temp.id('t1')), 'relay-1', 'for the new relay');
SELECT throws_ok(format('SELECT idem_outbox_ack(ARRAY[%L]::uuid[], %s)', pg_temp.id('t1'), (SELECT max(token) FROM old)),
                 'IK002', NULL, 'the stale relay''s ack is refused with the stale-token SQLSTATE');
SELECT throws_ok(format('SELECT idem_outbox_nack(%L, %s, ''{}'')', pg_temp.id('t1'), (SELECT max(token) FROM old)),
                 'IK002', NULL, 'and so is its nack');
SELECT is(idem_outbox_ack(ARRAY[pg_temp.id('t1')], (SELECT max(token) FROM new)), 1, 'the new relay''s ack is accepted');

-- a lease that keeps running out: dead after max attempts
SET LOCAL idempotency.outbox_max_attempts = 1;
CREATE TEMP TABLE short AS SELECT * FROM idem_outbox_claim('crashing-relay', 10, '1 hour');
SELECT results_eq($$SELECT id FROM short$$, $$VALUES (pg_temp.id('t2'))$$, 't2 is claimed by a relay that then dies');
UPDATE idem_outbox SET lease_expires_at = clock_timestamp() - interval '1 second' WHERE id = pg_temp.id('t2');
SELECT is_empty($$SELECT * FROM idem_outbox_claim('relay-1', 10, '1 hour')$$,
                'its lease ran out on its last attempt: the next claim does not hand it out ...');
SELECT results_eq($$SELECT status::text, last_error ->> 'error', last_error ->> 'relay' FROM idem_outbox WHERE id = pg_temp.id('t2')$$,
                  $$VALUES ('dead'::text, 'the lease of the last attempt expired'::text, 'crashing-relay'::text)$$,
                  '... but makes it dead, and says why');
RESET idempotency.outbox_max_attempts;

-- an expired lease is taken over even with an earlier live message of its
-- key (emits' locks rule that out; rows copied in by hand may not): the key
-- is never stuck between the two
DELETE FROM idem_outbox;
INSERT INTO m VALUES ('y1', idem_outbox_emit('jobs', 'y', '{}')), ('y2', idem_outbox_emit('jobs', 'y', '{}'));
CREATE TEMP TABLE y AS SELECT * FROM idem_outbox_claim('dying-relay', 10, '1 hour');
UPDATE idem_outbox SET seq = 0 WHERE id = pg_temp.id('y2');
UPDATE idem_outbox SET lease_expires_at = clock_timestamp() - interval '1 second' WHERE id = pg_temp.id('y1');
SELECT results_eq($$SELECT id FROM idem_outbox_claim('relay-1', 10, '1 hour')$$, $$VALUES (pg_temp.id('y1'))$$,
                  'an expired lease is taken over even behind an earlier live message of its key');

-- ids grow within a backend, also inside one batch (one timestamp for all)
CREATE TEMP TABLE grow_ids AS
SELECT u.id, u.n FROM unnest(idem_outbox_emit_batch('ids', array_fill('k'::text, ARRAY[500]),
                                                    array_fill('{}'::jsonb, ARRAY[500]))) WITH ORDINALITY u(id, n);
SELECT is((SELECT count(*) FROM (SELECT id < lead(id) OVER (ORDER BY n) AS grows FROM grow_ids) g WHERE NOT grows),
          0::bigint, 'the ids of a batch grow in array order');
SELECT ok((SELECT id FROM grow_ids ORDER BY n LIMIT 1) > pg_temp.id('y2'), 'after those emitted before');

-- scopes: the same topic and key in two scopes are two keys
DELETE FROM idem_outbox;
SELECT idem_outbox_emit('jobs', 'same', '{}', scope => 'a'), idem_outbox_emit('jobs', 'same', '{}', scope => 'b');
SELECT is((SELECT count(*) FROM idem_outbox_claim('relay-1', 10, '1 hour')), 2::bigint,
          'one scope''s message of a key does not hold up another scope''s');

-- topic, key and scope must fit one entry of the index idem_outbox_key
-- together (a B-tree entry is at most 2704 bytes): at a raised
-- max_key_length, three values of 1000 bytes each are refused before
-- anything is written, not by the index's 54000 (no savepoint: its
-- rollback would undo pgTAP's count of the tests in it)
SET LOCAL idempotency.max_key_length = 1024;
CREATE TEMP TABLE long_value AS
SELECT (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 32) g) AS v;
SELECT throws_ok($$SELECT idem_outbox_emit(left(v, 1000), left(v, 1000), '{}', scope => left(v, 1000)) FROM long_value$$,
                 '22001', 'topic, key and scope are too long together',
                 'an emit whose topic, key and scope have 3000 bytes together is refused');
SELECT throws_ok($$SELECT idem_outbox_emit_batch(left(v, 1000), ARRAY['short', left(v, 1000)], '{1,2}', scope => left(v, 1000))
                   FROM long_value$$,
                 '22001', 'topic, key and scope are too long together',
                 'so is a batch with one such key');
SELECT is((SELECT count(*) FROM idem_outbox, long_value WHERE aggregatetype = left(v, 1000)), 0::bigint,
          '... and neither wrote a message');
SELECT lives_ok($$SELECT idem_outbox_emit(left(v, 1000), left(v, 1000), '{}', scope => left(v, 600)) FROM long_value$$,
                'an emit of 2600 bytes together is accepted');
SELECT is((SELECT count(*) FROM idem_outbox, long_value WHERE aggregatetype = left(v, 1000)), 1::bigint,
          '... and written');
RESET idempotency.max_key_length;

SELECT * FROM finish();
ROLLBACK;
