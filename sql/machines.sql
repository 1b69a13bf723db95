--
-- State machines: defining, showing, attaching, detaching and dropping them,
-- the trigger idem_enforce_transition that refuses the moves a machine does
-- not contain (IK005), idem_transition, the optional transition log, and the
-- records' own machine "idem.record".  Every error shows its SQLSTATE, its
-- message and its DETAIL and HINT.
--
-- Objects of this test: machines "payment", "shipping", "open", "dup", the
-- ones named below for the name checks; tables in the schema ma; records with
-- keys starting with 'ma-'.  Everything is dropped at the end.
--

-- Errors are shown as "ERROR:  <SQLSTATE>: <message>" with DETAIL and HINT.
\i sql/include/expect_error.sql
CREATE SCHEMA ma;
SET search_path = ma, public;
DELETE FROM idempotency_records WHERE key LIKE 'ma-%';

--
-- idem_define_machine: the name.
--
SELECT pg_temp.expect_error($$SELECT idem_define_machine(NULL, '{"A": []}')$$);
SELECT pg_temp.expect_error($$SELECT idem_define_machine('', '{"A": []}')$$);
-- 1 to 63 bytes: 64 bytes are refused, in ASCII and in two-byte characters
SELECT pg_temp.expect_error($$SELECT idem_define_machine(repeat('m', 64), '{"A": []}')$$);
SELECT pg_temp.expect_error($$SELECT idem_define_machine(repeat('é', 32), '{"A": []}')$$);
SELECT idem_define_machine(repeat('m', 63), '{"A": []}');
SELECT idem_define_machine(repeat('é', 31) || 'x', '{"A": []}');
SELECT octet_length(name) AS bytes, states FROM idem_machines
WHERE name IN (repeat('m', 63), repeat('é', 31) || 'x') ORDER BY 1;
SELECT idem_drop_machine(repeat('m', 63));
SELECT idem_drop_machine(repeat('é', 31) || 'x');
-- "idem." belongs to the extension, defined or not; "idem" and "idem_" do not
SELECT pg_temp.expect_error($$SELECT idem_define_machine('idem.record', '{"A": []}')$$);
SELECT pg_temp.expect_error($$SELECT idem_define_machine('idem.mine', '{"A": []}')$$);
SELECT idem_define_machine('idem', '{"A": []}');
SELECT idem_define_machine('idem_x', '{"A": []}');
SELECT idem_drop_machine('idem');
SELECT idem_drop_machine('idem_x');

--
-- idem_define_machine: the moves.
--
SELECT pg_temp.expect_error($$SELECT idem_define_machine('bad', NULL)$$);
-- not an object
SELECT pg_temp.expect_error($$SELECT idem_define_machine('bad', '["A", "B"]')$$);
SELECT pg_temp.expect_error($$SELECT idem_define_machine('bad', '"A"')$$);
SELECT pg_temp.expect_error($$SELECT idem_define_machine('bad', 'null')$$);
-- a value that is not an array
SELECT pg_temp.expect_error($$SELECT idem_define_machine('bad', '{"A": "B"}')$$);
SELECT pg_temp.expect_error($$SELECT idem_define_machine('bad', '{"A": ["B"], "B": {"C": 1}}')$$);
SELECT pg_temp.expect_error($$SELECT idem_define_machine('bad', '{"A": null}')$$);
-- a target that is not a string, or an empty one
SELECT pg_temp.expect_error($$SELECT idem_define_machine('bad', '{"A": ["B", 1]}')$$);
SELECT pg_temp.expect_error($$SELECT idem_define_machine('bad', '{"A": [null]}')$$);
SELECT pg_temp.expect_error($$SELECT idem_define_machine('bad', '{"A": [["B"]]}')$$);
SELECT pg_temp.expect_error($$SELECT idem_define_machine('bad', '{"A": [""]}')$$);
-- an empty state name
SELECT pg_temp.expect_error($$SELECT idem_define_machine('bad', '{"": ["A"]}')$$);
-- no states
SELECT pg_temp.expect_error($$SELECT idem_define_machine('bad', '{}')$$);
-- initial states must be states of the machine
SELECT pg_temp.expect_error($$SELECT idem_define_machine('bad', '{"A": ["B"]}', '{C}')$$);
SELECT pg_temp.expect_error($$SELECT idem_define_machine('bad', '{"A": ["B"]}', '{A,NULL}')$$);
SELECT pg_temp.expect_error($$SELECT idem_define_machine('bad', '{"A": ["B"]}', '{a}')$$);
-- none of these defined anything
SELECT count(*) AS defined FROM idem_machines WHERE name = 'bad';
SELECT count(*) AS moves FROM idem_machine_moves WHERE machine = 'bad';

-- Duplicate moves and moves to the same state are ignored; a state that is
-- only a target, or has only a self-move, is terminal; initial states are
-- stored once each, sorted.
SELECT idem_define_machine('dup', '{"A": ["B", "B", "A", "C"], "B": ["B"], "C": []}', '{B,A,B}');
SELECT name, states, initial_states FROM idem_machines WHERE name = 'dup';
SELECT * FROM idem_machine_moves('dup');
SELECT * FROM idem_machine_states('dup');
-- initial => '{}' is the same as none: every state may start a row
SELECT idem_define_machine('dup', '{"A": ["B"]}', '{}');
SELECT name, states, initial_states FROM idem_machines WHERE name = 'dup';
SELECT * FROM idem_machine_states('dup');
SELECT idem_drop_machine('dup');

--
-- The payment example: moves, states, DOT.
--
SELECT idem_define_machine('payment', '{"PENDING": ["PAID", "CANCELLED"], "PAID": ["REFUNDED"]}', '{PENDING}');
SELECT name, states, initial_states, defined_at <= clock_timestamp() AS defined_at_ok
FROM idem_machines WHERE name = 'payment';
SELECT * FROM idem_machine_moves('payment');
SELECT * FROM idem_machine_states('payment');
\a \t
SELECT idem_machine_dot('payment');
\a \t

-- Redefinition replaces the states, the initial states and every move at once.
SELECT idem_define_machine('payment',
    '{"PENDING": ["PAID"], "PAID": ["REFUNDED", "DISPUTED"], "DISPUTED": ["REFUNDED", "PAID"]}');
SELECT name, states, initial_states FROM idem_machines WHERE name = 'payment';
SELECT * FROM idem_machine_moves('payment');
SELECT * FROM idem_machine_states('payment');
-- A redefinition that fails changes nothing.
SELECT pg_temp.expect_error($$SELECT idem_define_machine('payment', '{"PENDING": ["PAID"]}', '{CANCELLED}')$$);
SELECT pg_temp.expect_error($$SELECT idem_define_machine('payment', '{"PENDING": ["PAID"], "PAID": [1]}')$$);
SELECT name, states, initial_states FROM idem_machines WHERE name = 'payment';
SELECT * FROM idem_machine_moves('payment');
-- back to the example
SELECT idem_define_machine('payment', '{"PENDING": ["PAID", "CANCELLED"], "PAID": ["REFUNDED"]}', '{PENDING}');
SELECT * FROM idem_machine_moves('payment');

-- Unknown machines.
SELECT pg_temp.expect_error($$SELECT * FROM idem_machine_moves('nope')$$);
SELECT pg_temp.expect_error($$SELECT * FROM idem_machine_states('nope')$$);
SELECT pg_temp.expect_error($$SELECT idem_machine_dot('nope')$$);

-- DOT quoted IDs: double quotes and backslashes in the machine's name and in
-- its states are escaped; several initial states share the start point.
SELECT idem_define_machine('say "hi" \ bye', '{"say \"hi\"": ["back\\slash", "plain"], "plain": ["say \"hi\""]}',
                           '{"say \"hi\"", plain}');
SELECT * FROM idem_machine_states('say "hi" \ bye');
\a \t
SELECT idem_machine_dot('say "hi" \ bye');
\a \t
SELECT idem_drop_machine('say "hi" \ bye');

-- The built-in machine of the records.
SELECT name, states, initial_states FROM idem_machines WHERE name = 'idem.record';
SELECT * FROM idem_machine_moves('idem.record');
SELECT * FROM idem_machine_states('idem.record');

--
-- Attaching.
--
CREATE TABLE payments (id int PRIMARY KEY, status text, amount int NOT NULL DEFAULT 0);
INSERT INTO payments (id, status) VALUES (1, 'PENDING'), (2, 'PAID'), (3, 'BOGUS'), (4, NULL), (5, NULL);
SELECT pg_temp.expect_error($$SELECT idem_attach_machine(NULL, 'status', 'payment')$$);
SELECT pg_temp.expect_error($$SELECT idem_attach_machine('payments', NULL, 'payment')$$);
SELECT pg_temp.expect_error($$SELECT idem_attach_machine('payments', 'status', NULL)$$);
SELECT pg_temp.expect_error($$SELECT idem_attach_machine('payments', 'status', 'payment', log => NULL)$$);
SELECT pg_temp.expect_error($$SELECT idem_attach_machine('payments', 'status', 'payment', validate => NULL)$$);
SELECT pg_temp.expect_error($$SELECT idem_attach_machine('no_such_table', 'status', 'payment')$$);
SELECT pg_temp.expect_error($$SELECT idem_attach_machine('payments', 'status', 'nope')$$);
SELECT pg_temp.expect_error($$SELECT idem_attach_machine('payments', 'state', 'payment')$$);
SELECT pg_temp.expect_error($$SELECT idem_attach_machine('payments', 'ctid', 'payment')$$);
-- existing rows must be in states of the machine (NULL is let through)
SELECT pg_temp.expect_error($$SELECT idem_attach_machine('payments', 'status', 'payment')$$);
SELECT count(*) AS attached FROM idem_attached_machines WHERE table_name = 'payments'::regclass;
SELECT count(*) AS triggers FROM pg_trigger WHERE tgrelid = 'payments'::regclass;
-- validate => false attaches anyway
SELECT idem_attach_machine('payments', 'status', 'payment', validate => false);
SELECT * FROM idem_attached_machines WHERE table_name = 'payments'::regclass;
-- twice
SELECT pg_temp.expect_error($$SELECT idem_attach_machine('payments', 'status', 'payment')$$);
SELECT pg_temp.expect_error($$SELECT idem_attach_machine('payments', 'status', 'shipping')$$);
-- A row in a state the machine does not know can stay there, but not move.
SELECT pg_temp.expect_error($$UPDATE payments SET status = 'PENDING' WHERE id = 3$$);
UPDATE payments SET status = 'BOGUS', amount = 3 WHERE id = 3;
DELETE FROM payments WHERE id = 3;

--
-- The trigger: every refusal names the machine, the table, the column and
-- both states.
--
-- a move the machine does not contain
SELECT pg_temp.expect_error($$UPDATE payments SET status = 'REFUNDED' WHERE id = 1$$);
-- to a value that is no state
SELECT pg_temp.expect_error($$UPDATE payments SET status = 'SHIPPED' WHERE id = 1$$);
SELECT pg_temp.expect_error($$UPDATE payments SET status = 'pending' WHERE id = 1$$);
-- to NULL
SELECT pg_temp.expect_error($$UPDATE payments SET status = NULL WHERE id = 1$$);
-- from a terminal state
UPDATE payments SET status = 'CANCELLED' WHERE id = 1;
SELECT pg_temp.expect_error($$UPDATE payments SET status = 'PENDING' WHERE id = 1$$);
SELECT pg_temp.expect_error($$UPDATE payments SET status = 'PAID' WHERE id = 1$$);
-- INSERT: only initial states
SELECT pg_temp.expect_error($$INSERT INTO payments (id, status) VALUES (10, 'PAID')$$);
SELECT pg_temp.expect_error($$INSERT INTO payments (id, status) VALUES (10, 'SHIPPED')$$);
SELECT pg_temp.expect_error($$INSERT INTO payments (id, status) VALUES (10, NULL)$$);
SELECT pg_temp.expect_error($$INSERT INTO payments (id) VALUES (10)$$);
INSERT INTO payments (id, status) VALUES (10, 'PENDING');
-- UPDATE from NULL is entering the machine: only initial states
SELECT pg_temp.expect_error($$UPDATE payments SET status = 'PAID' WHERE id = 4$$);
-- NULL to NULL, and staying in a state, are allowed (also from a terminal state)
UPDATE payments SET status = NULL, amount = 4 WHERE id = 4;
UPDATE payments SET status = status, amount = amount + 1;
UPDATE payments SET status = 'CANCELLED' WHERE id = 1;
UPDATE payments SET status = 'PENDING' WHERE id = 4;
-- moves of the machine
UPDATE payments SET status = 'PAID' WHERE id = 10;
UPDATE payments SET status = 'REFUNDED' WHERE id = 10;
-- one refused row fails the whole statement
SELECT pg_temp.expect_error($$UPDATE payments SET status = 'PAID' WHERE id IN (4, 1)$$);
SELECT status FROM payments WHERE id = 4;
-- ON CONFLICT DO UPDATE goes through the trigger as well
SELECT pg_temp.expect_error($$INSERT INTO payments (id, status) VALUES (2, 'PENDING')
                              ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status$$);
INSERT INTO payments (id, status) VALUES (4, 'PENDING') ON CONFLICT (id) DO UPDATE SET status = 'PAID';
SELECT id, status, amount FROM payments ORDER BY id;

-- A machine without initial states lets rows start anywhere.
SELECT idem_define_machine('open', '{"A": ["B"], "B": ["C"]}');
CREATE TABLE open_rows (id int PRIMARY KEY, st text);
SELECT idem_attach_machine('open_rows', 'st', 'open');
INSERT INTO open_rows VALUES (1, 'A'), (2, 'B'), (3, 'C');
SELECT pg_temp.expect_error($$INSERT INTO open_rows VALUES (4, 'D')$$);
SELECT pg_temp.expect_error($$UPDATE open_rows SET st = 'A' WHERE id = 3$$);
SELECT pg_temp.expect_error($$UPDATE open_rows SET st = 'C' WHERE id = 1$$);

-- Trigger misuse: the function only works as the BEFORE ROW trigger that
-- idem_attach_machine creates.
CREATE TABLE misuse (id int PRIMARY KEY, st text);
CREATE TRIGGER t BEFORE INSERT ON misuse FOR EACH ROW EXECUTE FUNCTION idem_enforce_transition('payment');
SELECT pg_temp.expect_error($$INSERT INTO misuse VALUES (1, 'PENDING')$$);
DROP TRIGGER t ON misuse;
CREATE TRIGGER t AFTER INSERT ON misuse FOR EACH ROW EXECUTE FUNCTION idem_enforce_transition('payment', 'st');
SELECT pg_temp.expect_error($$INSERT INTO misuse VALUES (1, 'PENDING')$$);
DROP TRIGGER t ON misuse;
CREATE TRIGGER t BEFORE INSERT ON misuse FOR EACH ROW EXECUTE FUNCTION idem_enforce_transition('nope', 'st');
SELECT pg_temp.expect_error($$INSERT INTO misuse VALUES (1, 'PENDING')$$);
DROP TRIGGER t ON misuse;
CREATE TRIGGER t BEFORE INSERT ON misuse FOR EACH ROW EXECUTE FUNCTION idem_enforce_transition('payment', 'nope');
SELECT pg_temp.expect_error($$INSERT INTO misuse VALUES (1, 'PENDING')$$);
DROP TRIGGER t ON misuse;
SELECT pg_temp.expect_error($$SELECT idem_enforce_transition()$$);
DROP TABLE misuse;

--
-- idem_transition.
--
-- arguments
SELECT pg_temp.expect_error($$SELECT idem_transition(NULL, '1', 'PAID')$$);
SELECT pg_temp.expect_error($$SELECT idem_transition('payments', NULL::text, 'PAID')$$);
SELECT pg_temp.expect_error($$SELECT idem_transition('payments', NULL::text[], 'PAID')$$);
SELECT pg_temp.expect_error($$SELECT idem_transition('payments', '{1,NULL}'::text[], 'PAID')$$);
SELECT pg_temp.expect_error($$SELECT idem_transition('payments', '1', NULL)$$);
-- a table without a machine, or a column without one
CREATE TABLE plain (id int PRIMARY KEY, st text);
INSERT INTO plain VALUES (1, 'PENDING');
SELECT pg_temp.expect_error($$SELECT idem_transition('plain', '1', 'PAID')$$);
SELECT pg_temp.expect_error($$SELECT idem_transition('payments', '1', 'PAID', state_column => 'amount')$$);
-- a state the machine does not have
SELECT pg_temp.expect_error($$SELECT idem_transition('payments', '10', 'SHIPPED')$$);
-- no such row
SELECT pg_temp.expect_error($$SELECT idem_transition('payments', '999', 'PAID')$$);
SELECT pg_temp.expect_error($$SELECT idem_transition('payments', 'x', 'PAID')$$);
-- the key must have one value per primary key column
SELECT pg_temp.expect_error($$SELECT idem_transition('payments', '{1,2}'::text[], 'PAID')$$);
SELECT pg_temp.expect_error($$SELECT idem_transition('payments', '{}'::text[], 'PAID')$$);
-- a table without a primary key
CREATE TABLE no_pk (id int, st text);
SELECT idem_attach_machine('no_pk', 'st', 'payment');
SELECT pg_temp.expect_error($$SELECT idem_transition('no_pk', '1', 'PAID')$$);
DROP TABLE no_pk;
-- two machines on one table: say which column
ALTER TABLE payments ADD COLUMN refund text;
SELECT idem_define_machine('refund', '{"REQUESTED": ["APPROVED", "DENIED"]}', '{REQUESTED}');
SELECT idem_attach_machine('payments', 'refund', 'refund');
SELECT pg_temp.expect_error($$SELECT idem_transition('payments', '2', 'REFUNDED')$$);
SELECT idem_transition('payments', '2', 'REFUNDED', state_column => 'status') AS outcome;
SELECT pg_temp.expect_error($$SELECT idem_transition('payments', '2', 'REFUNDED', state_column => 'refund')$$);
UPDATE payments SET refund = 'REQUESTED' WHERE id = 2;
SELECT pg_temp.expect_error($$UPDATE payments SET refund = 'REFUNDED' WHERE id = 2$$);
SELECT idem_transition('payments', '2', 'APPROVED', state_column => 'refund') AS outcome;
SELECT idem_detach_machine('payments', 'refund');
ALTER TABLE payments DROP COLUMN refund;
SELECT idem_drop_machine('refund');

-- applied, already, rejected; from_states NULL means every state with a move
-- to the target, given from_states only those.
INSERT INTO payments (id, status) VALUES (20, 'PENDING'), (21, 'PENDING'), (22, 'PENDING');
SELECT idem_transition('payments', '20', 'PAID') AS outcome;
SELECT idem_transition('payments', '20', 'PAID') AS outcome;
SELECT idem_transition('payments', '20', 'CANCELLED') AS outcome;
SELECT idem_transition('payments', '{21}'::text[], 'CANCELLED', '{PAID}') AS outcome;
SELECT idem_transition('payments', '{21}'::text[], 'CANCELLED', '{PENDING}') AS outcome;
SELECT idem_transition('payments', '21', 'PENDING') AS outcome;
SELECT idem_transition('payments', '21', 'PENDING', '{}') AS outcome;
-- explicit from_states do not bypass the machine: the trigger still refuses
SELECT pg_temp.expect_error($$SELECT idem_transition('payments', '22', 'REFUNDED', '{PENDING}')$$);
-- a row whose state is NULL is not in any state with a move to the target
SELECT idem_transition('payments', '5', 'PENDING') AS outcome;
SELECT idem_transition('payments', '5', 'PAID') AS outcome;
SELECT id, status FROM payments WHERE id = 5 OR id >= 20 ORDER BY id;

-- A composite primary key, in primary key order.
CREATE TABLE shipments (region text, no int, st text, PRIMARY KEY (no, region));
SELECT idem_define_machine('shipping', '{"packed": ["sent"], "sent": ["delivered", "lost"]}', '{packed}');
SELECT idem_attach_machine('shipments', 'st', 'shipping', log => true);
INSERT INTO shipments VALUES ('eu', 1, 'packed'), ('us', 1, 'packed');
SELECT idem_transition('shipments', '{1,eu}'::text[], 'sent') AS outcome;
SELECT pg_temp.expect_error($$SELECT idem_transition('shipments', '{eu,1}'::text[], 'sent')$$);
SELECT pg_temp.expect_error($$SELECT idem_transition('shipments', '{1,asia}'::text[], 'sent')$$);
SELECT pg_temp.expect_error($$SELECT idem_transition('shipments', '1', 'sent')$$);
SELECT region, no, st FROM shipments ORDER BY 1, 2;

--
-- An enum column and a varchar column.
--
CREATE TYPE parcel_state AS ENUM ('packed', 'sent', 'delivered', 'lost', 'stolen');
CREATE TABLE parcels (id bigint PRIMARY KEY, st parcel_state, label varchar(12));
INSERT INTO parcels VALUES (1, 'packed', 'packed'), (2, 'stolen', NULL);
-- "stolen" is a label of the type, not a state of the machine
SELECT pg_temp.expect_error($$SELECT idem_attach_machine('parcels', 'st', 'shipping')$$);
DELETE FROM parcels WHERE id = 2;
SELECT idem_attach_machine('parcels', 'st', 'shipping');
SELECT idem_attach_machine('parcels', 'label', 'shipping');
SELECT * FROM idem_attached_machines WHERE table_name = 'parcels'::regclass ORDER BY state_column;
SELECT pg_temp.expect_error($$UPDATE parcels SET st = 'delivered' WHERE id = 1$$);
SELECT pg_temp.expect_error($$UPDATE parcels SET st = 'stolen' WHERE id = 1$$);
SELECT pg_temp.expect_error($$INSERT INTO parcels VALUES (3, 'sent', 'packed')$$);
SELECT pg_temp.expect_error($$UPDATE parcels SET label = 'delivered' WHERE id = 1$$);
SELECT pg_temp.expect_error($$UPDATE parcels SET label = 'packed ' WHERE id = 1$$);
SELECT pg_temp.expect_error($$INSERT INTO parcels VALUES (3, 'packed', 'sent')$$);
SELECT idem_transition('parcels', '1', 'sent', state_column => 'st') AS outcome;
SELECT idem_transition('parcels', '1', 'sent', state_column => 'label') AS outcome;
SELECT idem_transition('parcels', '1', 'sent', state_column => 'label') AS outcome;
UPDATE parcels SET st = 'lost', label = 'delivered' WHERE id = 1;
SELECT pg_temp.expect_error($$SELECT idem_transition('parcels', '1', 'stolen', state_column => 'st')$$);
SELECT pg_temp.expect_error($$SELECT idem_transition('parcels', '1', 'packed', '{lost}', 'st')$$);
SELECT * FROM parcels;

--
-- The transition log: one row per change of the state column, none for a
-- statement that leaves it as it was.
--
-- the log is added by attaching again; a row in a non-state blocks validation
SELECT idem_detach_machine('payments', 'status');
SELECT trigger_name FROM idem_attached_machines WHERE table_name = 'payments'::regclass;
INSERT INTO payments (id, status) VALUES (31, 'PAID');
SELECT idem_attach_machine('payments', 'status', 'payment', log => true);
SELECT tgname, tgtype, pg_get_triggerdef(oid) AS definition
FROM pg_trigger WHERE tgrelid = 'payments'::regclass ORDER BY tgname;
SELECT a.attname, format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull AS not_null,
       pg_get_expr(d.adbin, d.adrelid) AS default
FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = 'payments_state_log'::regclass AND a.attnum > 0 ORDER BY a.attnum;
INSERT INTO payments (id, status) VALUES (30, 'PENDING');
UPDATE payments SET status = 'PAID' WHERE id = 30;
UPDATE payments SET status = 'PAID' WHERE id = 30;
UPDATE payments SET amount = 30 WHERE id = 30;
SELECT idem_transition('payments', '30', 'PAID') AS outcome;
SELECT idem_transition('payments', '30', 'REFUNDED') AS outcome;
SELECT idem_transition('payments', '30', 'REFUNDED') AS outcome;
SELECT pg_temp.expect_error($$UPDATE payments SET status = 'PENDING' WHERE id = 30$$);
UPDATE payments SET status = 'PENDING' WHERE id = 5;
UPDATE payments SET status = status;
UPDATE payments SET status = 'REFUNDED' WHERE id = 31;
SELECT row_key, state_column, machine, from_state, to_state,
       changed_by = current_user AS by_me, xact_id <= pg_current_xact_id() AS xact_ok,
       logged_at <= clock_timestamp() AS logged_at_ok
FROM payments_state_log ORDER BY logged_at;
-- the key of a composite primary key, in primary key order
SELECT row_key, state_column, machine, from_state, to_state FROM shipments_state_log ORDER BY logged_at;

--
-- Hostile identifiers: quotes, spaces, semicolons and backslashes in the
-- schema, table and column names are quoted everywhere, never executed.
--
CREATE SCHEMA "ma ""s""; x";
CREATE TABLE "ma ""s""; x"."pay ""ments""; DROP TABLE ma.payments; --" (
    "k""ey; --" text PRIMARY KEY,
    "st ""at\e""; DROP TABLE ma.payments; --" text);
INSERT INTO "ma ""s""; x"."pay ""ments""; DROP TABLE ma.payments; --" VALUES ('k 1''; --', 'PENDING');
SELECT idem_attach_machine('"ma ""s""; x"."pay ""ments""; DROP TABLE ma.payments; --"',
                           'st "at\e"; DROP TABLE ma.payments; --', 'payment', log => true);
SELECT * FROM idem_attached_machines WHERE machine = 'payment' ORDER BY table_name::text;
SELECT idem_transition('"ma ""s""; x"."pay ""ments""; DROP TABLE ma.payments; --"', 'k 1''; --', 'PAID') AS outcome;
SELECT idem_transition('"ma ""s""; x"."pay ""ments""; DROP TABLE ma.payments; --"', 'k 1''; --', 'PAID') AS outcome;
SELECT pg_temp.expect_error($$SELECT idem_transition('"ma ""s""; x"."pay ""ments""; DROP TABLE ma.payments; --"', 'k 1''; --', 'CANCELLED', '{PAID}')$$);
SELECT pg_temp.expect_error($$SELECT idem_transition('"ma ""s""; x"."pay ""ments""; DROP TABLE ma.payments; --"', 'k 2', 'PAID')$$);
SELECT pg_temp.expect_error($$UPDATE "ma ""s""; x"."pay ""ments""; DROP TABLE ma.payments; --" SET "st ""at\e""; DROP TABLE ma.payments; --" = 'DROP TABLE ma.payments'$$);
SELECT * FROM "ma ""s""; x"."pay ""ments""; DROP TABLE ma.payments; --";
SELECT row_key, state_column, machine, from_state, to_state
FROM "ma ""s""; x"."pay ""ments""; DROP TABLE ma.payments; --_state_log" ORDER BY logged_at;
SELECT pg_temp.expect_error($$SELECT idem_drop_machine('payment')$$);
SELECT idem_detach_machine('"ma ""s""; x"."pay ""ments""; DROP TABLE ma.payments; --"',
                           'st "at\e"; DROP TABLE ma.payments; --');
SELECT count(*) AS triggers FROM pg_trigger
WHERE tgrelid = '"ma ""s""; x"."pay ""ments""; DROP TABLE ma.payments; --"'::regclass;
-- ma.payments is still there
SELECT count(*) AS payments FROM ma.payments;
SET client_min_messages = warning;
DROP SCHEMA "ma ""s""; x" CASCADE;
RESET client_min_messages;

--
-- Detaching and dropping.
--
SELECT pg_temp.expect_error($$SELECT idem_detach_machine('plain', 'st')$$);
SELECT pg_temp.expect_error($$SELECT idem_detach_machine('payments', 'amount')$$);
SELECT pg_temp.expect_error($$SELECT idem_detach_machine('payments', 'nope')$$);
SELECT pg_temp.expect_error($$SELECT idem_detach_machine('no_such_table', 'status')$$);
SELECT pg_temp.expect_error($$SELECT idem_drop_machine('payment')$$);
SELECT pg_temp.expect_error($$SELECT idem_drop_machine('shipping')$$);
SELECT pg_temp.expect_error($$SELECT idem_drop_machine('nope')$$);
SELECT pg_temp.expect_error($$SELECT idem_drop_machine('idem.record')$$);
SELECT pg_temp.expect_error($$SELECT idem_drop_machine('idem.nope')$$);
-- detaching removes the enforcing trigger and the log trigger, not the log
SELECT idem_detach_machine('payments', 'status');
SELECT pg_temp.expect_error($$SELECT idem_detach_machine('payments', 'status')$$);
SELECT count(*) AS triggers FROM pg_trigger WHERE tgrelid = 'payments'::regclass;
UPDATE payments SET status = 'anything' WHERE id = 30;
SELECT count(*) AS log_rows FROM payments_state_log WHERE row_key = '{"id": 30}';
SELECT pg_temp.expect_error($$SELECT idem_transition('payments', '30', 'PAID')$$);

-- Every attachment, with the records' own.
SELECT * FROM idem_attached_machines ORDER BY table_name::text, state_column;

--
-- The records' built-in machine: a finished record never goes back.
--
SELECT outcome, token FROM idem_claim('ma-done', '\x01', '1 hour');
SELECT idem_complete('ma-done', 1, '{"ok": true}');
SELECT pg_temp.expect_error($$UPDATE idempotency_records SET status = 'processing' WHERE key = 'ma-done'$$);
SELECT pg_temp.expect_error($$UPDATE idempotency_records SET status = 'failed' WHERE key = 'ma-done'$$);
SELECT pg_temp.expect_error($$UPDATE idempotency_records SET status = 'unknown' WHERE key = 'ma-done'$$);
SELECT pg_temp.expect_error($$SELECT idem_resolve('ma-done', 'failed')$$);
-- staying succeeded is allowed (a no-op on the status)
UPDATE idempotency_records SET response_code = 200, status = 'succeeded' WHERE key = 'ma-done';
SELECT key, status, token, response_code FROM idempotency_records WHERE key = 'ma-done';
SELECT outcome, token, status FROM idem_claim('ma-fail', '\x02', '1 hour');
SELECT idem_fail('ma-fail', 1, '{"code": "no"}', retryable => false);
SELECT pg_temp.expect_error($$UPDATE idempotency_records SET status = 'succeeded' WHERE key = 'ma-fail'$$);
SELECT outcome, token FROM idem_claim('ma-unknown', '\x03', '1 hour');
SELECT idem_mark_unknown('ma-unknown', 1, '{"timeout": true}');
SELECT pg_temp.expect_error($$UPDATE idempotency_records SET status = 'processing' WHERE key = 'ma-unknown'$$);
SELECT idem_resolve('ma-unknown', 'succeeded', '{"found": true}');
SELECT key, status FROM idempotency_records WHERE key LIKE 'ma-%' ORDER BY key;
DELETE FROM idempotency_records WHERE key LIKE 'ma-%';
SELECT setval('idem_token_epoch', 1, false) AS epoch_reset;  -- a DELETE moves the epoch

--
-- Privileges: defining, attaching, detaching and dropping machines is not
-- granted to PUBLIC; reading definitions is.
--
SET client_min_messages = warning;
DROP ROLE IF EXISTS regress_idem_machines;
RESET client_min_messages;
CREATE ROLE regress_idem_machines;
GRANT USAGE ON SCHEMA ma TO regress_idem_machines;
SET ROLE regress_idem_machines;
SELECT pg_temp.expect_error($$SELECT idem_define_machine('mine', '{"A": []}')$$);
SELECT pg_temp.expect_error($$SELECT idem_attach_machine('plain', 'st', 'payment')$$);
SELECT pg_temp.expect_error($$SELECT idem_detach_machine('parcels', 'st')$$);
SELECT pg_temp.expect_error($$SELECT idem_drop_machine('open')$$);
SELECT pg_temp.expect_error($$INSERT INTO idem_machines (name, states) VALUES ('mine', '{A}')$$);
SELECT pg_temp.expect_error($$DELETE FROM idem_machine_moves WHERE machine = 'payment'$$);
SELECT * FROM idem_machine_moves('payment');
SELECT count(*) AS attachments FROM idem_attached_machines WHERE machine = 'shipping';
-- idem_transition runs with the caller's privileges
SELECT pg_temp.expect_error($$SELECT idem_transition('parcels', '1', 'sent', state_column => 'st')$$);
RESET ROLE;
REVOKE USAGE ON SCHEMA ma FROM regress_idem_machines;
DROP ROLE regress_idem_machines;

--
-- Clean up.
--
SELECT idem_detach_machine('parcels', 'st');
SELECT idem_detach_machine('parcels', 'label');
SELECT idem_detach_machine('shipments', 'st');
SELECT idem_detach_machine('open_rows', 'st');
SELECT idem_drop_machine('payment');
SELECT idem_drop_machine('shipping');
SELECT idem_drop_machine('open');
SET client_min_messages = warning;
DROP SCHEMA ma CASCADE;
RESET client_min_messages;
RESET search_path;
SELECT name FROM idem_machines ORDER BY name;
SELECT * FROM idem_attached_machines;
