-- The outbox in operations: retention (idem_purge removes published
-- messages after idempotency.outbox_retention, counted from publication,
-- and never pending, in-flight or dead ones), the counters of idem_stats,
-- idem_stuck (dead messages, and messages not published after
-- idempotency.outbox_stuck_after), the kinds emitter and relay of
-- idem_grant, and tenant isolation by scope.  Ages are made by moving
-- timestamps back, not by waiting.  Everything, roles included, is rolled
-- back.  Roles are regress_idem_obx_*.
BEGIN;
SELECT plan(50);
-- No autovacuum of the outbox while this transaction runs: its BRIN summary
-- would wait for the rows this transaction deletes, and the ALTER TABLE of
-- idem_tenant_isolation below for autovacuum: a deadlock (seen on 18).
LOCK TABLE idem_outbox IN SHARE UPDATE EXCLUSIVE MODE;

CREATE FUNCTION pg_temp.sqlstate_of(sql text) RETURNS text LANGUAGE plpgsql AS $fn$
BEGIN
    EXECUTE sql;
    RETURN '00000';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END
$fn$;
GRANT EXECUTE ON FUNCTION pg_temp.sqlstate_of(text) TO PUBLIC;

SELECT ok(idem_purge() >= 0, 'expired rows left by others are purged first (rolled back at the end)');
DELETE FROM idem_outbox;
CREATE TEMP TABLE m (name text PRIMARY KEY, id uuid);
GRANT ALL ON m TO PUBLIC;
CREATE FUNCTION pg_temp.id(name text) RETURNS uuid LANGUAGE sql AS $$ SELECT id FROM m WHERE m.name = $1 $$;
-- move a message's life back by an interval
CREATE FUNCTION pg_temp.age(name text, by interval) RETURNS void LANGUAGE sql AS $$
    UPDATE idem_outbox SET created_at = created_at - by, updated_at = updated_at - by,
                           available_at = available_at - by
    WHERE id = pg_temp.id(name) $$;

-- retention -------------------------------------------------------------------------------------
INSERT INTO m SELECT n, idem_outbox_emit('ret', n, '{}') FROM unnest('{old_pub,new_pub,late_pub}'::text[]) n;
SELECT idem_outbox_ack(ARRAY[id], token) FROM idem_outbox_claim('r', 10);
INSERT INTO m VALUES ('old_flight', idem_outbox_emit('ret', 'old_flight', '{}'));
SELECT count(*) FROM idem_outbox_claim('r', 10);
INSERT INTO m VALUES ('old_dead', idem_outbox_emit('ret', 'old_dead', '{}'));
SET LOCAL idempotency.outbox_max_attempts = 1;
SELECT idem_outbox_nack(id, token, '{"error": "poison"}') FROM idem_outbox_claim('r', 10);
RESET idempotency.outbox_max_attempts;
INSERT INTO m VALUES ('old_pending', idem_outbox_emit('ret', 'old_pending', '{}'));
SELECT results_eq($$SELECT aggregateid COLLATE "default", status::text FROM idem_outbox WHERE aggregatetype = 'ret' ORDER BY seq$$,
                  $$VALUES ('old_pub', 'published'), ('new_pub', 'published'), ('late_pub', 'published'),
                           ('old_flight', 'in_flight'), ('old_dead', 'dead'), ('old_pending', 'pending')$$,
                  'one message of each status');
SELECT pg_temp.age(n, '2 days') FROM unnest('{old_pub,old_pending,old_flight,old_dead}'::text[]) n;
-- emitted long ago, published only an hour ago
UPDATE idem_outbox SET created_at = created_at - interval '2 days', updated_at = updated_at - interval '1 hour'
WHERE id = pg_temp.id('late_pub');
SELECT is(idem_purge(), 1::bigint, 'idem_purge removes one message: published more than idempotency.outbox_retention (1 day) ago');
SELECT is_empty($$SELECT 1 FROM idem_outbox WHERE id = pg_temp.id('old_pub')$$, 'the old published one');
SELECT results_eq($$SELECT aggregateid COLLATE "default" FROM idem_outbox WHERE aggregatetype = 'ret' ORDER BY seq$$,
                  $$VALUES ('new_pub'), ('late_pub'), ('old_flight'), ('old_dead'), ('old_pending')$$,
                  'pending, in-flight and dead messages stay however old, and retention counts from publication');
SET LOCAL idempotency.outbox_retention = '30min';
SELECT is(idem_purge(), 1::bigint, 'with idempotency.outbox_retention = 30min ...');
SELECT is_empty($$SELECT 1 FROM idem_outbox WHERE id = pg_temp.id('late_pub')$$, '... the one published an hour ago goes too');
SELECT is(idem_purge(), 0::bigint, 'a message published just now stays');
RESET idempotency.outbox_retention;
SELECT is((SELECT count(*) FROM idem_outbox WHERE aggregatetype = 'ret'), 4::bigint, 'four are left');

-- statistics ------------------------------------------------------------------------------------
DELETE FROM idem_outbox;
-- (the SQL edition has no counters: the calls run, the counts are skipped)
SELECT NOT EXISTS (SELECT FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
                   WHERE p.proname = 'idem_claim' AND l.lanname = 'c'
                     AND p.pronamespace = (SELECT extnamespace FROM pg_extension WHERE extname = 'idempotency'))
       AS sql_edition \gset
\if :sql_edition
\else
CREATE TEMP TABLE before AS SELECT counter, value FROM idem_stats() WHERE counter LIKE 'outbox%';
CREATE FUNCTION pg_temp.delta(c text) RETURNS bigint LANGUAGE sql AS $$
    SELECT s.value - b.value FROM idem_stats() s JOIN before b USING (counter) WHERE s.counter = c $$;
\endif
SELECT idem_outbox_emit('st', 'a', '{}'), idem_outbox_emit('st', 'b', '{}');
SELECT cardinality(idem_outbox_emit_batch('st', '{c,d,e}', '{1,2,3}'));
CREATE TEMP TABLE c1 AS SELECT * FROM idem_outbox_claim('r', 10, '10 ms');
SELECT idem_outbox_ack(ARRAY(SELECT id FROM c1 WHERE aggregateid IN ('a', 'b')), (SELECT max(token) FROM c1));
SELECT idem_outbox_ack(ARRAY(SELECT id FROM c1 WHERE aggregateid IN ('a', 'b')), (SELECT max(token) FROM c1));
SELECT idem_outbox_nack(id, token, '{}', '0') FROM c1 WHERE aggregateid = 'c';
SELECT pg_sleep(0.05);
SET LOCAL idempotency.outbox_max_attempts = 1;
SELECT count(*) FROM idem_outbox_claim('r', 10);
RESET idempotency.outbox_max_attempts;
\if :sql_edition
SELECT skip('idem_stats raises 55000 in the SQL edition: no counters without the C library (README, "What needs the C library")', 5);
\else
SELECT is(pg_temp.delta('outbox_emitted'), 5::bigint, 'outbox_emitted counts every message emitted, the batch''s one by one');
SELECT is(pg_temp.delta('outbox_published'), 2::bigint, 'outbox_published counts messages acked, a repeated ack not again');
SELECT is(pg_temp.delta('outbox_retried'), 1::bigint, 'outbox_retried counts a nack back to pending');
SELECT is(pg_temp.delta('outbox_dead'), 2::bigint, 'outbox_dead counts messages whose last lease ran out (d, e)');
SELECT is(pg_temp.delta('outbox_taken_over'), 0::bigint, 'a lease run out on the last attempt is no take-over');
\endif
SELECT lives_ok(format('SELECT idem_outbox_retry(%L)', (SELECT id FROM idem_outbox WHERE aggregateid = 'd')), 'retry d');
\if :sql_edition
SELECT skip('idem_stats raises 55000 in the SQL edition: no counters without the C library (README, "What needs the C library")', 1);
\else
SELECT is(pg_temp.delta('outbox_retried'), 2::bigint, 'outbox_retried counts idem_outbox_retry too');
\endif
CREATE TEMP TABLE c2 AS SELECT * FROM idem_outbox_claim('r', 10, '10 ms');
SELECT pg_sleep(0.05);
SELECT count(*) FROM idem_outbox_claim('r', 10);
\if :sql_edition
SELECT skip('idem_stats raises 55000 in the SQL edition: no counters without the C library (README, "What needs the C library")', 1);
\else
SELECT is(pg_temp.delta('outbox_taken_over'), (SELECT count(*) FROM c2), 'outbox_taken_over counts messages whose lease ran out and were handed out again');
\endif

-- idem_stuck --------------------------------------------------------------------------------------
DELETE FROM idem_outbox;
DELETE FROM m;
INSERT INTO m VALUES ('old_pub', idem_outbox_emit('stuck', 'old_pub', '{}'));
SELECT idem_outbox_ack(ARRAY[id], token) FROM idem_outbox_claim('r', 10);
INSERT INTO m VALUES ('old_flight', idem_outbox_emit('stuck', 'old_flight', '{}'));
SELECT count(*) FROM idem_outbox_claim('r', 10);
INSERT INTO m VALUES ('dead', idem_outbox_emit('stuck', 'dead', '{}'));
SET LOCAL idempotency.outbox_max_attempts = 1;
SELECT idem_outbox_nack(id, token, '{"error": "poison"}') FROM idem_outbox_claim('r', 10);
RESET idempotency.outbox_max_attempts;
INSERT INTO m SELECT n, idem_outbox_emit('stuck', n, '{}') FROM unnest('{fresh,old}'::text[]) n;
SELECT pg_temp.age(n, '10 minutes') FROM unnest('{old,old_pub,old_flight}'::text[]) n;
SELECT results_eq($$SELECT key COLLATE "default", reason, topic COLLATE "default", message_id, outbox_status::text, status::text, error
                    FROM idem_stuck WHERE topic = 'stuck' ORDER BY key$$,
                  $$VALUES ('dead'::text, 'dead message'::text, 'stuck'::text, pg_temp.id('dead'), 'dead'::text, NULL::text,
                            '{"error": "poison"}'::jsonb),
                           ('old', 'message not published', 'stuck', pg_temp.id('old'), 'pending', NULL, NULL),
                           ('old_flight', 'message not published', 'stuck', pg_temp.id('old_flight'), 'in_flight', NULL, NULL)$$,
                  'idem_stuck lists dead messages and those not published 5 minutes after they became due, not fresh or published ones');
SET LOCAL idempotency.outbox_stuck_after = '1h';
SELECT results_eq($$SELECT key COLLATE "default" FROM idem_stuck WHERE topic = 'stuck' ORDER BY key$$, $$VALUES ('dead')$$,
                  'idempotency.outbox_stuck_after sets the age');
RESET idempotency.outbox_stuck_after;
SELECT ok((SELECT age >= interval '10 minutes' FROM idem_stuck WHERE message_id = pg_temp.id('old')), 'with its age');
SELECT ok((SELECT age >= interval '0' FROM idem_stuck WHERE message_id = pg_temp.id('dead')),
          'a dead message has an age too, since its emit');
-- a live message is stuck when it has been due that long, not by its emit:
-- a delayed one is not listed before it is due (emitted 10 minutes ago);
-- one due for 19 minutes is, with that age; so is one in flight whose lease
-- expired 10 minutes ago.  One backed off by a nack is never due for long
-- while it keeps failing: it is listed as failing, aged from its emit
INSERT INTO m VALUES ('delayed', idem_outbox_emit('due', 'delayed', '{}', delay => '20 minutes'));
UPDATE idem_outbox SET created_at = created_at - interval '10 minutes' WHERE id = pg_temp.id('delayed');
INSERT INTO m VALUES ('backed_off', idem_outbox_emit('due', 'backed_off', '{}'));
SELECT idem_outbox_nack(id, token, '{"error": "busy"}', '1 hour') FROM idem_outbox_claim('r', 10, '30 s', '{due}');
UPDATE idem_outbox SET created_at = created_at - interval '10 minutes' WHERE id = pg_temp.id('backed_off');
INSERT INTO m VALUES ('lease_gone', idem_outbox_emit('due', 'lease_gone', '{}'));
SELECT count(*) FROM idem_outbox_claim('r', 10, '30 s', '{due}');
SELECT pg_temp.age('lease_gone', '20 minutes');
UPDATE idem_outbox SET lease_expires_at = clock_timestamp() - interval '10 minutes' WHERE id = pg_temp.id('lease_gone');
INSERT INTO m VALUES ('due_long', idem_outbox_emit('due', 'due_long', '{}', delay => '1 minute'));
SELECT pg_temp.age('due_long', '20 minutes');
SELECT results_eq($$SELECT key COLLATE "default", outbox_status::text, reason FROM idem_stuck WHERE topic = 'due' ORDER BY key$$,
                  $$VALUES ('backed_off'::text, 'pending'::text, 'message failing'::text),
                           ('due_long', 'pending', 'message not published'),
                           ('lease_gone', 'in_flight', 'message not published')$$,
                  'idem_stuck lists messages due for 5 minutes and failing ones emitted as long ago, not a delayed one');
SELECT ok((SELECT age >= interval '10 minutes' FROM idem_stuck WHERE message_id = pg_temp.id('backed_off')),
          'the age of a failing message counts from its emit');
SELECT ok((SELECT age BETWEEN interval '19 minutes' AND interval '19 minutes 30 seconds'
           FROM idem_stuck WHERE message_id = pg_temp.id('due_long')),
          'the age of a pending message counts from when it became due');

-- the kinds emitter and relay ---------------------------------------------------------------------
DELETE FROM m;
CREATE ROLE regress_idem_obx_app;
CREATE ROLE regress_idem_obx_relay;
CREATE ROLE regress_idem_obx_reader;
SELECT lives_ok($$SELECT idem_grant('emitter', 'regress_idem_obx_app')$$, 'idem_grant emitter');
SELECT lives_ok($$SELECT idem_grant('relay', 'regress_idem_obx_relay')$$, 'idem_grant relay');
SELECT idem_grant('reader', 'regress_idem_obx_reader');
DELETE FROM idem_outbox;
SET LOCAL ROLE regress_idem_obx_app;
INSERT INTO m VALUES ('e1', idem_outbox_emit('sec', 'k', '{}'));
SELECT ok(pg_temp.id('e1') IS NOT NULL, 'an emitter emits');
SELECT ok(cardinality(idem_outbox_emit_batch('sec', '{k2}', '{"{}"}')) = 1, 'also in batches');
SELECT is(pg_temp.sqlstate_of($$SELECT * FROM idem_outbox_claim('x')$$), '42501', 'but may not claim');
SELECT is(pg_temp.sqlstate_of($$SELECT count(*) FROM idem_outbox$$), '42501', 'nor read the outbox');
SELECT is(pg_temp.sqlstate_of($$INSERT INTO idem_outbox (id, created_at, updated_at, aggregatetype, aggregateid, payload,
                                                         status, available_at, lease_expires_at)
                                 VALUES (gen_random_uuid(), now(), now(), 'sec', 'k', '{}', 'in_flight', now(), 'infinity')$$),
          '42501', 'nor write a message in flight by hand');
SELECT is(pg_temp.sqlstate_of($$INSERT INTO idem_outbox (id, seq, created_at, updated_at, aggregatetype, aggregateid, payload, available_at)
                                 VALUES (gen_random_uuid(), 0, now(), now(), 'sec', 'k', '{}', now())$$),
          '42501', 'nor one ahead of its key''s messages');
RESET ROLE;
SET LOCAL ROLE regress_idem_obx_relay;
CREATE TEMP TABLE rc AS SELECT * FROM idem_outbox_claim('relay', 10);
SELECT is((SELECT count(*) FROM rc), 2::bigint, 'a relay claims');
SELECT is(idem_outbox_nack((SELECT id FROM rc WHERE aggregateid = 'k'), (SELECT max(token) FROM rc), '{}', '0')::text,
          'pending', 'nacks');
SELECT is(idem_outbox_ack(ARRAY(SELECT id FROM rc WHERE aggregateid = 'k2'), (SELECT max(token) FROM rc)), 1, 'acks');
SELECT is(pg_temp.sqlstate_of($$SELECT idem_outbox_retry(gen_random_uuid())$$), 'IK004', 'may retry (this id is unknown)');
SELECT is(pg_temp.sqlstate_of($$SELECT idem_outbox_emit('sec', 'k', '{}')$$), '42501', 'but may not emit');
SELECT is(pg_temp.sqlstate_of($$DELETE FROM idem_outbox$$), '42501', 'nor delete messages');
RESET ROLE;
SET LOCAL ROLE regress_idem_obx_reader;
SELECT is(pg_temp.sqlstate_of($$SELECT count(*) FROM idem_stuck$$), '00000', 'a reader reads idem_stuck, which reads the outbox');
SELECT is(pg_temp.sqlstate_of($$SELECT * FROM idem_outbox_claim('x')$$), '42501', 'and claims nothing');
RESET ROLE;

-- tenant isolation by scope -----------------------------------------------------------------------
DELETE FROM idem_outbox;
SELECT idem_tenant_isolation(true);
SELECT ok((SELECT relrowsecurity AND relforcerowsecurity FROM pg_class WHERE oid = 'idem_outbox'::regclass),
          'isolation switches row-level security on the outbox too');
SET LOCAL ROLE regress_idem_obx_app;
SET LOCAL idempotency.scope = 't1';
SELECT is(pg_temp.sqlstate_of($$SELECT idem_outbox_emit('ten', 'k', '{}', scope => 't1')$$), '00000',
          'the tenant t1 emits in its scope');
SELECT is(pg_temp.sqlstate_of($$SELECT idem_outbox_emit('ten', 'k', '{}', scope => 't1/orders')$$), '00000',
          'and in its sub-scopes');
SELECT is(pg_temp.sqlstate_of($$SELECT idem_outbox_emit('ten', 'k', '{}', scope => 't2')$$), '42501',
          'not in another tenant''s scope');
SELECT is(pg_temp.sqlstate_of($$SELECT idem_outbox_emit('ten', 'k', '{}')$$), '42501', 'nor in the default scope');
SET LOCAL idempotency.scope = 't2';
SELECT idem_outbox_emit('ten', 'k', '{}', scope => 't2');
RESET ROLE;
SET LOCAL ROLE regress_idem_obx_relay;
SET LOCAL idempotency.scope = 't1';
SELECT is((SELECT count(*) FROM idem_outbox), 2::bigint, 'a relay of t1 sees the two messages of t1 ...');
SELECT is((SELECT count(*) FROM idem_outbox_claim('relay-t1', 10)), 2::bigint,
          '... and claims both (a key is per scope: t1 and t1/orders do not hold each other up)');
SET LOCAL idempotency.scope = '';
SELECT is((SELECT count(*) FROM idem_outbox_claim('relay-none', 10)), 0::bigint, 'without a tenant it claims nothing');
RESET ROLE;
SELECT idem_grant_tenant('t2', 'regress_idem_obx_relay');
SET LOCAL ROLE regress_idem_obx_relay;
SELECT results_eq($$SELECT o.scope COLLATE "default" FROM idem_outbox_claim('relay-t2', 10) c JOIN idem_outbox o USING (id)$$,
                  $$VALUES ('t2'::text)$$,
                  'a relay allowed tenant t2 by idem_grant_tenant claims its messages without idempotency.scope');
RESET ROLE;
SELECT idem_tenant_isolation(false);
SELECT ok((SELECT NOT relrowsecurity FROM pg_class WHERE oid = 'idem_outbox'::regclass), 'and off again');

SELECT * FROM finish();
ROLLBACK;
