-- State machines: what the enforcing trigger lets through and what it
-- refuses (initial and terminal states, no-op moves, NULL), redefinitions that
-- apply at once, detaching and attaching again, idem_transition's outcomes,
-- user triggers that try to change the state behind the machine's back,
-- row-level security and privileges, and the records' own machine under the
-- normal lifecycle.  Tables live in the schema mt, records have keys
-- prefixed "mt.", roles are regress_idem_*; all of it is rolled back.
BEGIN;
SELECT plan(129);

CREATE SCHEMA mt;
SET LOCAL search_path = mt, public;

-- the SQLSTATE of a statement, or 'ok'
CREATE FUNCTION pg_temp.code(sql text) RETURNS text LANGUAGE plpgsql AS $fn$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END
$fn$;

SELECT idem_define_machine('mt_order', '{"new": ["paid", "cancelled"], "paid": ["shipped", "refunded"], "shipped": ["delivered"]}',
                           '{new}');
SELECT idem_define_machine('mt_free', '{"a": ["b"], "b": ["c"]}');
CREATE TABLE orders (id int PRIMARY KEY, st text, note text);
CREATE TABLE free (id int PRIMARY KEY, st text);
INSERT INTO orders VALUES (100, NULL, 'before the machine'), (101, NULL, 'before the machine');
SELECT idem_attach_machine('orders', 'st', 'mt_order', log => true);
SELECT idem_attach_machine('free', 'st', 'mt_free');

-- initial states ------------------------------------------------------------------------------
SELECT lives_ok($$INSERT INTO orders VALUES (1, 'new')$$, 'a declared initial state starts a row');
SELECT throws_ok($$INSERT INTO orders VALUES (2, 'paid')$$, 'IK005',
                 'invalid initial state "paid" in column "st" of table "orders"',
                 'a state that is not initial does not');
SELECT throws_ok($$INSERT INTO orders VALUES (2, 'delivered')$$, 'IK005', NULL,
                 'neither does a terminal state');
SELECT throws_ok($$INSERT INTO orders VALUES (2, 'lost')$$, 'IK005', NULL,
                 'nor a value that is no state');
SELECT lives_ok($$INSERT INTO free VALUES (1, 'a'), (2, 'b'), (3, 'c')$$,
                'without declared initial states any state starts a row, a terminal one too');
SELECT throws_ok($$INSERT INTO free VALUES (4, 'd')$$, 'IK005', NULL,
                 'but not a value that is no state');
SELECT is((SELECT count(*) FROM orders WHERE id = 2), 0::bigint, 'no refused row was inserted');

-- moves, terminal states, no-ops ----------------------------------------------------------------
SELECT lives_ok($$UPDATE orders SET st = 'paid' WHERE id = 1$$, 'a move of the machine is allowed');
SELECT throws_ok($$UPDATE orders SET st = 'delivered' WHERE id = 1$$, 'IK005',
                 'invalid transition from "paid" to "delivered" in column "st" of table "orders"',
                 'a move the machine does not contain is refused');
SELECT throws_ok($$UPDATE orders SET st = 'new' WHERE id = 1$$, 'IK005', NULL, 'so is a move back');
SELECT lives_ok($$UPDATE orders SET st = 'shipped' WHERE id = 1$$, 'paid -> shipped');
SELECT lives_ok($$UPDATE orders SET st = 'delivered' WHERE id = 1$$, 'shipped -> delivered');
SELECT throws_ok($$UPDATE orders SET st = 'shipped' WHERE id = 1$$, 'IK005',
                 'invalid transition from "delivered" to "shipped" in column "st" of table "orders"',
                 'nothing leaves a terminal state');
SELECT is(pg_temp.code($$UPDATE orders SET st = 'new' WHERE id = 1$$)
          || pg_temp.code($$UPDATE orders SET st = 'cancelled' WHERE id = 1$$)
          || pg_temp.code($$UPDATE orders SET st = 'refunded' WHERE id = 1$$),
          'IK005IK005IK005', 'to no state at all');
SELECT lives_ok($$UPDATE orders SET st = 'delivered', note = 'again' WHERE id = 1$$,
                'staying in a terminal state is allowed (the idempotent no-op)');
SELECT lives_ok($$UPDATE orders SET st = st$$, 'staying in any state is allowed');
SELECT lives_ok($$UPDATE free SET st = 'c' WHERE id = 3$$, 'also without initial states');
SELECT throws_ok($$UPDATE free SET st = 'c' WHERE id = 1$$, 'IK005', NULL,
                 'a -> c is not a move, although a -> b -> c are');
SELECT throws_ok($$UPDATE orders SET st = CASE id WHEN 1 THEN st ELSE 'paid' END$$, 'IK005', NULL,
                 'one refused row (NULL -> paid) refuses the statement');
SELECT results_eq($$SELECT id, st, note FROM orders ORDER BY id$$,
                  $$VALUES (1, 'delivered', 'again'), (100, NULL, 'before the machine'),
                           (101, NULL, 'before the machine')$$,
                  'refused statements changed nothing');

-- NULL ------------------------------------------------------------------------------------------
SELECT throws_ok($$INSERT INTO orders VALUES (3, NULL)$$, 'IK005',
                 'invalid initial state NULL in column "st" of table "orders"',
                 'no row starts in NULL');
SELECT throws_ok($$INSERT INTO free VALUES (4, NULL)$$, 'IK005', NULL,
                 'not even without initial states');
SELECT throws_ok($$UPDATE orders SET st = NULL WHERE id = 1$$, 'IK005',
                 'invalid transition from "delivered" to NULL in column "st" of table "orders"',
                 'no row moves to NULL, not even from a terminal state');
SELECT lives_ok($$UPDATE orders SET st = NULL, note = 'still nothing' WHERE id = 100$$,
                'a row that was NULL before the machine may stay NULL');
SELECT throws_ok($$UPDATE orders SET st = 'paid' WHERE id = 100$$, 'IK005',
                 'invalid initial state "paid" in column "st" of table "orders"',
                 'leaving NULL is entering the machine: not in a state that is not initial');
SELECT lives_ok($$UPDATE orders SET st = 'new' WHERE id = 100$$, 'but in an initial state');
INSERT INTO free VALUES (10, 'a');
ALTER TABLE free DISABLE TRIGGER zz_idem_machine_st;
UPDATE free SET st = NULL WHERE id = 10;
ALTER TABLE free ENABLE TRIGGER zz_idem_machine_st;
SELECT lives_ok($$UPDATE free SET st = 'c' WHERE id = 10$$,
                'without initial states, NULL may move to any state');

-- the transition log ---------------------------------------------------------------------------
SELECT results_eq(
    $$SELECT row_key, from_state, to_state FROM orders_state_log ORDER BY logged_at$$,
    $$VALUES ('{"id": 1}'::jsonb, NULL, 'new'), ('{"id": 1}', 'new', 'paid'), ('{"id": 1}', 'paid', 'shipped'),
             ('{"id": 1}', 'shipped', 'delivered'), ('{"id": 100}', NULL, 'new')$$,
    'the log holds one row per change, none for no-ops or refused statements');

-- redefinition applies at once -----------------------------------------------------------------
INSERT INTO orders VALUES (10, 'new'), (11, 'new'), (12, 'new');
SELECT lives_ok($$UPDATE orders SET st = 'paid' WHERE id = 10$$, 'new -> paid (and the machine is cached)');
SELECT idem_define_machine('mt_order', '{"new": ["cancelled"], "paid": ["shipped", "refunded"], "shipped": ["delivered"]}',
                           '{new}');
SELECT throws_ok($$UPDATE orders SET st = 'paid' WHERE id = 11$$, 'IK005',
                 'invalid transition from "new" to "paid" in column "st" of table "orders"',
                 'a move removed by a redefinition is refused by the next statement');
SELECT is(idem_transition('orders', '11', 'paid'), 'rejected',
          'idem_transition sees the redefinition too: no state moves to paid');
SELECT idem_define_machine('mt_order', '{"new": ["paid", "cancelled", "held"], "held": ["paid"], "paid": ["shipped", "refunded"], "shipped": ["delivered"]}',
                           '{new,held}');
SELECT lives_ok($$UPDATE orders SET st = 'held' WHERE id = 11$$, 'a state added by a redefinition is usable at once');
SELECT lives_ok($$INSERT INTO orders VALUES (13, 'held'), (14, 'held')$$, 'and so is a new initial state');
SELECT is(idem_transition('orders', '11', 'paid'), 'applied', 'held -> paid');
SELECT lives_ok($q$DO $do$
BEGIN
    PERFORM idem_define_machine('mt_order', '{"new": ["cancelled"], "held": ["new"]}', '{new}');
    UPDATE orders SET st = 'new' WHERE id = 13;     -- held -> new: only in this definition
    BEGIN
        UPDATE orders SET st = 'paid' WHERE id = 12;
        RAISE EXCEPTION 'new -> paid was allowed';
    EXCEPTION WHEN SQLSTATE 'IK005' THEN
        NULL;
    END;
    PERFORM idem_define_machine('mt_order', '{"new": ["paid", "cancelled"], "paid": ["shipped", "refunded"], "shipped": ["delivered"]}',
                                '{new}');
    UPDATE orders SET st = 'paid' WHERE id = 12;
END
$do$$q$, 'inside one DO block, every statement after a redefinition follows it');
SELECT results_eq($$SELECT id, st FROM orders WHERE id IN (12, 13) ORDER BY id$$,
                  $$VALUES (12, 'paid'), (13, 'new')$$, 'the DO block made the moves of each definition');
SELECT throws_ok($$UPDATE orders SET st = 'paid' WHERE id = 14$$, 'IK005',
                 'invalid transition from "held" to "paid" in column "st" of table "orders"',
                 'a row in a state that a redefinition removed cannot move');
SELECT lives_ok($$UPDATE orders SET st = 'held', note = 'stays' WHERE id = 14$$, 'but can stay');

-- detach and attach again ----------------------------------------------------------------------
SELECT is((SELECT count(*) FROM pg_trigger WHERE tgrelid = 'orders'::regclass), 3::bigint,
          'attached with a log: three triggers (BEFORE, AFTER INSERT, log)');
CREATE TEMP TABLE logged AS SELECT count(*) AS n FROM orders_state_log;
SELECT idem_detach_machine('orders', 'st');
SELECT is((SELECT count(*) FROM pg_trigger WHERE tgrelid = 'orders'::regclass), 0::bigint,
          'detaching drops the enforcing trigger and the log trigger');
SELECT is((SELECT count(*) FROM idem_attached_machines WHERE table_name = 'orders'::regclass), 0::bigint,
          'the table is no longer listed');
SELECT lives_ok($$UPDATE orders SET st = 'new' WHERE id = 1$$, 'without the machine any change is allowed');
SELECT lives_ok($$UPDATE orders SET st = NULL WHERE id = 10$$, 'NULL too');
SELECT is((SELECT count(*) FROM orders_state_log), (SELECT n FROM logged), 'and nothing is logged any more');
SELECT throws_ok($$SELECT idem_transition('orders', '1', 'paid')$$, '42704',
                 'table "orders" has no state machine', 'idem_transition needs an attached machine');
SELECT lives_ok($$UPDATE orders SET st = 'bogus' WHERE id = 14$$, 'a row gets a value that is no state');
SELECT throws_ok($$SELECT idem_attach_machine('orders', 'st', 'mt_order', log => true)$$, '23514', NULL,
                 'attaching again validates the rows');
SELECT is((SELECT count(*) FROM pg_trigger WHERE tgrelid = 'orders'::regclass), 0::bigint,
          'a refused attach leaves no trigger behind');
DELETE FROM orders WHERE id = 14;
SET LOCAL client_min_messages = warning;   -- the log table exists already (NOTICE)
SELECT lives_ok($$SELECT idem_attach_machine('orders', 'st', 'mt_order', log => true)$$, 're-attaching works');
RESET client_min_messages;
SELECT throws_ok($$UPDATE orders SET st = 'shipped' WHERE id = 1$$, 'IK005', NULL, 'the machine is enforced again');
SELECT lives_ok($$UPDATE orders SET st = 'paid' WHERE id = 1$$, 'new -> paid');
SELECT results_eq($$SELECT from_state, to_state FROM orders_state_log WHERE row_key = '{"id": 1}'
                    ORDER BY logged_at DESC LIMIT 1$$,
                  $$VALUES ('new', 'paid')$$, 'the same log table is written again');

-- idem_transition --------------------------------------------------------------------------------
SELECT idem_define_machine('mt_flow', '{"a": ["z"], "b": ["z", "c"], "c": [], "d": ["a"]}');
CREATE TABLE flow (k text PRIMARY KEY, st text);
SELECT idem_attach_machine('flow', 'st', 'mt_flow');
INSERT INTO flow VALUES ('a', 'a'), ('b', 'b'), ('c', 'c'), ('d', 'd'), ('z', 'z'), ('a2', 'a'), ('b2', 'b');
SELECT is(idem_transition('flow', 'a', 'z'), 'applied', 'from_states NULL: a has a move to z');
SELECT is(idem_transition('flow', 'b', 'z'), 'applied', 'from_states NULL: b has a move to z');
SELECT is(idem_transition('flow', 'c', 'z'), 'rejected', 'from_states NULL: c has none');
SELECT is(idem_transition('flow', 'd', 'z'), 'rejected', 'from_states NULL: d has none either');
SELECT is(idem_transition('flow', 'z', 'z'), 'already', 'a row already in the target: already');
SELECT is(idem_transition('flow', 'a', 'z'), 'already', 'a repeated transition: already');
SELECT is(idem_transition('flow', 'b2', 'z', '{a}'), 'rejected', 'explicit from_states: b is not in {a}');
SELECT is(idem_transition('flow', 'a2', 'z', '{a}'), 'applied', 'explicit from_states: a is');
SELECT is(idem_transition('flow', 'b2', 'z', '{a,b,c,d}'), 'applied', 'b is in {a,b,c,d}');
SELECT throws_ok($$SELECT idem_transition('flow', 'd', 'z', '{a,b,c,d}')$$, 'IK005',
                 'invalid transition from "d" to "z" in column "st" of table "flow"',
                 'the trigger still refuses a move that from_states let through');
SELECT throws_ok($$SELECT idem_transition('flow', 'c', 'a', '{c}')$$, 'IK005', NULL,
                 'from a terminal state as well');
SELECT is(idem_transition('flow', 'd', 'a'), 'applied', 'd -> a');
SELECT results_eq($$SELECT k, st FROM flow ORDER BY k$$,
                  $$VALUES ('a', 'z'), ('a2', 'z'), ('b', 'z'), ('b2', 'z'), ('c', 'c'), ('d', 'a'), ('z', 'z')$$,
                  'each row is where the outcomes say');

-- user triggers cannot get around the machine ----------------------------------------------------
CREATE FUNCTION mt.force_state() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.st := TG_ARGV[0];
    RETURN NEW;
END
$$;
CREATE TRIGGER a_force BEFORE INSERT OR UPDATE ON flow FOR EACH ROW EXECUTE FUNCTION mt.force_state('c');
SELECT lives_ok($$INSERT INTO flow VALUES ('e', 'no such state')$$,
                'the check sees the new row as a_force left it: an INSERT of no state becomes c');
SELECT is((SELECT st FROM flow WHERE k = 'e'), 'c', 'the row starts in c');
SELECT throws_ok($$UPDATE flow SET st = 'z' WHERE k = 'd'$$, 'IK005',
                 'invalid transition from "a" to "c" in column "st" of table "flow"',
                 'a BEFORE trigger named a_... that changes the new state is checked after it: a -> c is refused');
SELECT results_eq(
    $$SELECT tgname FROM pg_trigger WHERE tgrelid = 'flow'::regclass AND NOT tgisinternal ORDER BY tgname COLLATE "C"$$,
    $$VALUES ('a_force'::name), ('zz_idem_machine_st'), ('zz_idem_machine_st_inserted')$$,
    'the enforcing triggers'' names sort after the user''s');
DROP TRIGGER a_force ON flow;
INSERT INTO flow VALUES ('f', 'b');
CREATE TRIGGER a_force BEFORE UPDATE OF st ON flow FOR EACH ROW EXECUTE FUNCTION mt.force_state('c');
SELECT lives_ok($$UPDATE flow SET st = 'no such state' WHERE k = 'f'$$,
                'the check sees the row as the user''s trigger left it: b -> c is a move');
SELECT is((SELECT st FROM flow WHERE k = 'f'), 'c', 'and the row is in c');
DROP TRIGGER a_force ON flow;

-- row-level security and privileges ---------------------------------------------------------------
CREATE ROLE regress_idem_mt_app;
CREATE ROLE regress_idem_mt_reader;
GRANT USAGE ON SCHEMA mt TO regress_idem_mt_app, regress_idem_mt_reader;
CREATE TABLE accounts (id int PRIMARY KEY, owner name, st text);
SELECT idem_attach_machine('accounts', 'st', 'mt_order');
INSERT INTO accounts VALUES (1, 'regress_idem_mt_app', 'new'), (2, 'someone else', 'new');
GRANT SELECT, UPDATE ON accounts TO regress_idem_mt_app;
GRANT SELECT ON accounts TO regress_idem_mt_reader;
ALTER TABLE accounts ENABLE ROW LEVEL SECURITY;
CREATE POLICY own ON accounts USING (owner = current_user);

SET LOCAL ROLE regress_idem_mt_app;
SELECT is(idem_transition('accounts', '1', 'paid'), 'applied', 'RLS: a visible row moves');
SELECT throws_ok($$SELECT idem_transition('accounts', '2', 'paid')$$, 'P0002',
                 'no row of table "accounts" has key (2)',
                 'RLS: a row the policy hides is no row at all');
SELECT throws_ok($$SELECT idem_transition('accounts', '1', 'new', '{paid}')$$, 'IK005', NULL,
                 'the machine applies to the role as well');
RESET ROLE;
SELECT results_eq($$SELECT id, st FROM accounts ORDER BY id$$, $$VALUES (1, 'paid'), (2, 'new')$$,
                  'the hidden row did not move');

SET LOCAL ROLE regress_idem_mt_reader;
SELECT throws_ok($$SELECT idem_transition('accounts', '1', 'shipped')$$, '42501', NULL,
                 'a role without UPDATE on the table gets 42501 from idem_transition');
RESET ROLE;

-- The trigger reads definitions without privileges: take every privilege on
-- the definition tables away, and empty the backend's cache by redefining.
REVOKE ALL ON idem_machines, idem_machine_moves FROM PUBLIC;
GRANT INSERT ON accounts TO regress_idem_mt_app;
ALTER TABLE accounts DISABLE ROW LEVEL SECURITY;
SELECT idem_define_machine('mt_order', '{"new": ["paid", "cancelled"], "paid": ["shipped", "refunded"], "shipped": ["delivered"]}',
                           '{new}');
SET LOCAL ROLE regress_idem_mt_app;
SELECT ok(NOT has_table_privilege('idem_machines', 'SELECT')
          AND NOT has_table_privilege('idem_machine_moves', 'SELECT'),
          'the role may not read the definitions');
SELECT throws_ok($$SELECT count(*) FROM idem_machines$$, '42501', NULL, 'indeed it may not');
SELECT lives_ok($$UPDATE accounts SET st = 'shipped' WHERE id = 1$$, 'it can still make a move');
SELECT throws_ok($$UPDATE accounts SET st = 'delivered' WHERE id = 2$$, 'IK005', NULL, 'and is still refused what is no move');
SELECT throws_ok($$INSERT INTO accounts VALUES (3, 'regress_idem_mt_app', 'paid')$$, 'IK005', NULL,
                 'and an invalid initial state');
SELECT lives_ok($$INSERT INTO accounts VALUES (3, 'regress_idem_mt_app', 'new')$$, 'it may insert in an initial state');
SELECT is(idem_transition('accounts', '3', 'cancelled'), 'applied', 'and use idem_transition');
RESET ROLE;
SELECT results_eq($$SELECT id, st FROM accounts ORDER BY id$$,
                  $$VALUES (1, 'shipped'), (2, 'new'), (3, 'cancelled')$$, 'what the role did');

-- the records' own machine under the normal lifecycle --------------------------------------------
SELECT results_eq($$SELECT outcome, status::text FROM idem_claim('mt.a', '\xaa', '1 hour')$$,
                  $$VALUES ('new', 'processing')$$, 'claim: a new record is processing');
SELECT lives_ok($$SELECT idem_checkpoint('mt.a', 1, 'half')$$, 'checkpoint: stays processing');
SELECT lives_ok($$SELECT idem_complete('mt.a', 1, '{"ok": 1}')$$, 'complete: processing -> succeeded');
SELECT results_eq($$SELECT outcome, status::text FROM idem_claim('mt.a', '\xaa', '1 hour')$$,
                  $$VALUES ('replay', 'succeeded')$$, 'replay of a succeeded record');

SELECT lives_ok($$SELECT idem_claim('mt.f', '\xbb', '1 hour')$$, 'claim mt.f');
SELECT lives_ok($$SELECT idem_fail('mt.f', 1, '{"e": 1}', retryable => true)$$, 'fail: processing -> failed');
SELECT results_eq($$SELECT outcome, token, status::text FROM idem_claim('mt.f', '\xbb', '1 hour')$$,
                  $$VALUES ('takeover', 2::bigint, 'processing')$$, 'a retryable failure is taken over: failed -> processing');
SELECT lives_ok($$SELECT idem_complete('mt.f', 2, '{"ok": 2}')$$, 'and completed');

SELECT lives_ok($$SELECT idem_claim('mt.t', '\xcc', '50 ms')$$, 'claim mt.t with a short lease');
SELECT pg_sleep(0.1);
SELECT results_eq($$SELECT outcome, token, status::text FROM idem_claim('mt.t', '\xcc', '1 hour')$$,
                  $$VALUES ('takeover', 2::bigint, 'processing')$$, 'an expired lease is taken over: processing stays processing');

SELECT lives_ok($$SELECT idem_claim('mt.r', '\xdd', '1 hour')$$, 'claim mt.r');
SELECT lives_ok($$SELECT idem_release('mt.r', 1)$$, 'release keeps the status');
SELECT results_eq($$SELECT outcome, token, status::text FROM idem_claim('mt.r', '\xee', '1 hour')$$,
                  $$VALUES ('new', 3::bigint, 'processing')$$, 'a released key is claimed anew (the row is replaced)');

SELECT lives_ok($$SELECT idem_claim('mt.u', '\x01', '1 hour')$$, 'claim mt.u');
SELECT lives_ok($$SELECT idem_mark_unknown('mt.u', 1, '{"timeout": true}')$$, 'mark_unknown: processing -> unknown');
SELECT results_eq($$SELECT outcome, status::text FROM idem_claim('mt.u', '\x01', '1 hour')$$,
                  $$VALUES ('unknown', 'unknown')$$, 'an unknown outcome is reported, not redone');
SELECT lives_ok($$SELECT idem_resolve('mt.u', 'succeeded', '{"found": true}')$$, 'resolve: unknown -> succeeded');
SELECT lives_ok($$SELECT idem_claim('mt.u2', '\x02', '1 hour')$$, 'claim mt.u2');
SELECT lives_ok($$SELECT idem_mark_unknown('mt.u2', 1, '{"timeout": true}')$$, 'mark_unknown');
SELECT lives_ok($$SELECT idem_resolve('mt.u2', 'failed', retryable => true)$$, 'resolve: unknown -> failed');
SELECT results_eq($$SELECT outcome, token, status::text FROM idem_claim('mt.u2', '\x02', '1 hour')$$,
                  $$VALUES ('takeover', 2::bigint, 'processing')$$, 'a resolved retryable failure is taken over');

SELECT lives_ok($$SELECT idem_claim('mt.x', '\x03', '1 hour', retention => '50 ms')$$, 'claim mt.x with a short retention');
SELECT lives_ok($$SELECT idem_complete('mt.x', 1, '{"ok": 3}')$$, 'complete mt.x');
SELECT lives_ok($$SELECT idem_claim('mt.y', '\x04', '1 hour', retention => '50 ms')$$, 'claim mt.y with a short retention');
SELECT lives_ok($$SELECT idem_fail('mt.y', 1, '{"e": 4}', retryable => false)$$, 'fail mt.y for good');
SELECT pg_sleep(0.1);
SELECT results_eq($$SELECT outcome, token, status::text FROM idem_claim('mt.x', '\x05', '1 hour')$$,
                  $$VALUES ('new', 2::bigint, 'processing')$$,
                  'past retention a succeeded key is reused: a new processing row, not a move back');
SELECT results_eq($$SELECT outcome, token, status::text FROM idem_claim('mt.y', '\x06', '1 hour')$$,
                  $$VALUES ('new', 2::bigint, 'processing')$$,
                  'so is a failed one');
SELECT throws_ok($$UPDATE idempotency_records SET status = 'processing' WHERE key = 'mt.a'$$, 'IK005',
                 'invalid transition from "succeeded" to "processing" in column "status" of table "idempotency_records"',
                 'by hand, a succeeded record never goes back to processing');
SELECT throws_ok($$UPDATE idempotency_records SET status = 'unknown' WHERE key = 'mt.u'$$, 'IK005', NULL,
                 'nor to unknown');
SELECT results_eq($$SELECT key COLLATE "default", status::text FROM idempotency_records WHERE key LIKE 'mt.%' ORDER BY key$$,
                  $$VALUES ('mt.a', 'succeeded'), ('mt.f', 'succeeded'), ('mt.r', 'processing'), ('mt.t', 'processing'),
                           ('mt.u', 'succeeded'), ('mt.u2', 'processing'), ('mt.x', 'processing'), ('mt.y', 'processing')$$,
                  'every record is where its lifecycle put it');

-- states are the column cast to text: char(n) without padding, boolean as true/false -------------
SELECT idem_define_machine('mt_flag', '{"false": ["true"]}');
CREATE TABLE mt_flags (id int PRIMARY KEY, st boolean NOT NULL);
INSERT INTO mt_flags VALUES (1, false);
SELECT idem_attach_machine('mt_flags', 'st', 'mt_flag');
SELECT lives_ok($$UPDATE mt_flags SET st = true WHERE id = 1$$, 'a boolean column moves false -> true');
SELECT throws_ok($$UPDATE mt_flags SET st = false WHERE id = 1$$, 'IK005', NULL,
                 'and not back: true is terminal');
SELECT idem_define_machine('mt_padded', '{"PENDING": ["PAID"]}');
CREATE TABLE mt_padded (id int PRIMARY KEY, st char(10) NOT NULL);
INSERT INTO mt_padded VALUES (1, 'PENDING'), (2, 'PENDING');
SELECT idem_attach_machine('mt_padded', 'st', 'mt_padded');
SELECT lives_ok($$INSERT INTO mt_padded VALUES (3, 'PENDING')$$, 'a char(10) column holds states without their padding');
SELECT lives_ok($$UPDATE mt_padded SET st = 'PAID' WHERE id = 1$$, 'and moves by UPDATE');
SELECT is(idem_transition('mt_padded', '2', 'PAID'), 'applied', 'and by idem_transition');
SELECT is((SELECT st FROM mt_padded WHERE id = 2), 'PAID'::char(10), 'which stores the whole state');

-- from_states that include the target: a row already there is 'already', never 'applied' --------
SELECT idem_define_machine('mt_pay', '{"PENDING": ["PAID"]}');
CREATE TABLE mt_pay (id text PRIMARY KEY, st text NOT NULL);
INSERT INTO mt_pay VALUES ('a', 'PAID');
SELECT idem_attach_machine('mt_pay', 'st', 'mt_pay');
SELECT is(idem_transition('mt_pay', 'a', 'PAID', '{PENDING,PAID}'), 'already',
          'a row in the target state is already there even when from_states names the target');

-- an UPDATE that does not name the state column is still checked --------------------------------
CREATE FUNCTION pg_temp.mt_sneak() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN NEW.st := 'PENDING'; RETURN NEW; END $f$;
CREATE TRIGGER a_sneak BEFORE UPDATE ON mt_pay FOR EACH ROW EXECUTE FUNCTION pg_temp.mt_sneak();
SELECT throws_ok($$UPDATE mt_pay SET id = id WHERE id = 'a'$$, 'IK005', NULL,
                 'a BEFORE trigger moving the state in an UPDATE of other columns is refused');
DROP TRIGGER a_sneak ON mt_pay;

-- the log table of a table with a 63-byte name is another table, with a distinct name ------------
CREATE TABLE mt_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa (id int PRIMARY KEY, st text);
CREATE TABLE mt_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab (id int PRIMARY KEY, st text);
SELECT idem_attach_machine('mt_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', 'st', 'mt_pay', log => true);
SELECT idem_attach_machine('mt_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab', 'st', 'mt_pay', log => true);
SELECT lives_ok($$INSERT INTO mt_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa VALUES (1, 'PENDING')$$,
                'a governed table with a 63-byte name accepts rows');
SELECT is((SELECT count(*)::int FROM pg_class WHERE relname LIKE 'mt_aaaa%_state_log'), 2,
          'two long table names get two log tables');

-- At most 1000 states: a compiled machine keeps an nstates x nstates matrix
-- in every backend (46341 states overflowed it into a crash once).
SELECT throws_ok($$SELECT idem_define_machine('mt.huge', jsonb_build_object('a', '["b"]'::jsonb)
                       || (SELECT jsonb_object_agg('x' || i, '[]'::jsonb) FROM generate_series(1, 999) i))$$,
                 '54000', 'state machine "mt.huge" has 1001 states, more than the 1000 allowed',
                 'a machine of 1001 states is refused');
SELECT lives_ok($$SELECT idem_define_machine('mt.huge', jsonb_build_object('a', '["b"]'::jsonb)
                      || (SELECT jsonb_object_agg('x' || i, '[]'::jsonb) FROM generate_series(1, 998) i))$$,
                'one of 1000 states is defined');
CREATE TABLE mt_huge (id int PRIMARY KEY, st text);
SELECT idem_attach_machine('mt_huge', 'st', 'mt.huge');
INSERT INTO mt_huge VALUES (1, 'a');
SELECT is(idem_transition('mt_huge', '1', 'b'), 'applied', 'and works');
-- a definition edited by hand past the limit fails at the next write, cleanly
UPDATE idem_machines SET states = states || (SELECT array_agg('y' || i) FROM generate_series(1, 50000) i)
WHERE name = 'mt.huge';
SELECT throws_ok($$INSERT INTO mt_huge VALUES (2, 'a')$$, '54000',
                 'state machine "mt.huge" has 51000 states, more than the 1000 allowed',
                 'a hand-edited definition of 51000 states fails the write with 54000, without a crash');
SELECT throws_ok($$SELECT idem_transition('mt_huge', '1', 'a')$$, '54000', NULL, 'and so does idem_transition');

SELECT * FROM finish();
ROLLBACK;
