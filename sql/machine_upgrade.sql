-- idem-test: c-edition-only: it attaches machines under 0.1.0 and updates; the SQL edition starts at 0.3.0, with no script of an older version
--
-- State machines attached under 0.1.0, with the new library, then updated in
-- place: 0.1.0's attachments (one BEFORE trigger each) keep working, already
-- with row movement checked as a move; ALTER EXTENSION ... UPDATE gives each
-- one the AFTER INSERT trigger, after which INSERT ... ON CONFLICT is checked
-- as the UPDATE or INSERT it becomes; an attachment on an inheritance parent
-- is kept with a WARNING.
--
-- Runs in a database of its own, dropped at the end.
--

SELECT current_database() AS regress_db \gset
SET client_min_messages = warning;
DROP DATABASE IF EXISTS regress_idem_machine_upgrade;
RESET client_min_messages;
CREATE DATABASE regress_idem_machine_upgrade;
\c regress_idem_machine_upgrade
\i sql/include/expect_error.sql
CREATE EXTENSION idempotency VERSION '0.1.0';
SELECT idem_define_machine('pay',
    '{"NEW": ["PAID", "VOID"], "PAID": ["REFUNDED"], "VOID": [], "REFUNDED": []}',
    initial => '{NEW}');
CREATE TABLE pt (id int, region text, status text, PRIMARY KEY (id, region))
    PARTITION BY LIST (region);
CREATE TABLE pt_eu PARTITION OF pt FOR VALUES IN ('eu');
CREATE TABLE pt_us PARTITION OF pt FOR VALUES IN ('us');
CREATE TABLE plain (id int PRIMARY KEY, status text);
CREATE TABLE parent (id int PRIMARY KEY, status text);
SELECT idem_attach_machine('pt', 'status', 'pay');
SELECT idem_attach_machine('plain', 'status', 'pay', log => true);
SELECT idem_attach_machine('parent', 'status', 'pay');
CREATE TABLE child () INHERITS (parent);
INSERT INTO pt VALUES (1, 'eu', 'NEW'), (2, 'eu', 'NEW');
-- attachments whose trigger the DBA disabled or set to fire ALWAYS or on
-- REPLICA (on a whole partitioned table, or on one partition only), and a
-- hand-made trigger that fires on UPDATE only
CREATE TABLE dis (id int PRIMARY KEY, status text);
CREATE TABLE alw (id int PRIMARY KEY, status text);
CREATE TABLE rep (id int PRIMARY KEY, status text);
CREATE TABLE upd_only (id int PRIMARY KEY, status text);
CREATE TABLE pd (id int, region text, status text, PRIMARY KEY (id, region))
    PARTITION BY LIST (region);
CREATE TABLE pd_eu PARTITION OF pd FOR VALUES IN ('eu');
CREATE TABLE pd_us PARTITION OF pd FOR VALUES IN ('us');
SELECT idem_attach_machine('dis', 'status', 'pay');
SELECT idem_attach_machine('alw', 'status', 'pay');
SELECT idem_attach_machine('rep', 'status', 'pay');
SELECT idem_attach_machine('pd', 'status', 'pay');
ALTER TABLE dis DISABLE TRIGGER zz_idem_machine_status;
ALTER TABLE alw ENABLE ALWAYS TRIGGER zz_idem_machine_status;
ALTER TABLE rep ENABLE REPLICA TRIGGER zz_idem_machine_status;
ALTER TABLE pd_us DISABLE TRIGGER zz_idem_machine_status;
CREATE TRIGGER by_hand BEFORE UPDATE ON upd_only FOR EACH ROW
    EXECUTE FUNCTION idem_enforce_transition('pay', 'status');
INSERT INTO alw VALUES (1, 'NEW');
INSERT INTO upd_only VALUES (1, 'NEW');
INSERT INTO plain VALUES (1, 'NEW');
INSERT INTO parent VALUES (1, 'NEW');
INSERT INTO child VALUES (2, 'PAID');

-- 0.1.0's attachments with the new library: a moved row is checked as a move
UPDATE pt SET region = 'us', status = 'PAID' WHERE id = 1;
SELECT pg_temp.expect_error($$UPDATE pt SET region = 'us', status = 'REFUNDED' WHERE id = 2$$);
-- without the AFTER trigger, the BEFORE trigger refuses a proposed row that
-- is not in an initial state at once, as 0.1.0 did
SELECT pg_temp.expect_error($$INSERT INTO plain VALUES (1, 'PAID') ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status$$);
SELECT pg_temp.expect_error($$INSERT INTO plain VALUES (2, 'PAID')$$);

ALTER EXTENSION idempotency UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
SELECT tgrelid::regclass AS table_name, tgname, pg_get_triggerdef(oid) AS definition
FROM pg_trigger WHERE NOT tgisinternal
ORDER BY tgrelid::regclass::text, tgname;
SELECT * FROM idem_attached_machines ORDER BY table_name::text, state_column;
SELECT tgrelid::regclass AS table_name, tgname, tgenabled
FROM pg_trigger WHERE NOT tgisinternal AND tgrelid IN
    ('dis'::regclass, 'alw'::regclass, 'rep'::regclass, 'upd_only'::regclass,
     'pd'::regclass, 'pd_eu'::regclass, 'pd_us'::regclass)
ORDER BY tgrelid::regclass::text, tgname;
-- each AFTER trigger fires when its BEFORE trigger does: a disabled machine
-- stays off, an ALWAYS one checks the upsert as the UPDATE it becomes, and
-- an UPDATE-only trigger gets no INSERT check
INSERT INTO dis VALUES (1, 'PAID');
INSERT INTO pd VALUES (1, 'us', 'PAID');
SELECT pg_temp.expect_error($$INSERT INTO pd VALUES (1, 'eu', 'PAID')$$);
INSERT INTO alw VALUES (1, 'PAID') ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status;
SELECT pg_temp.expect_error($$INSERT INTO alw VALUES (2, 'PAID')$$);
INSERT INTO rep VALUES (1, 'PAID');
SET session_replication_role = replica;
SELECT pg_temp.expect_error($$INSERT INTO rep VALUES (2, 'PAID')$$);
SELECT pg_temp.expect_error($$INSERT INTO alw VALUES (2, 'PAID')$$);
RESET session_replication_role;
INSERT INTO upd_only VALUES (2, 'PAID');
SELECT pg_temp.expect_error($$UPDATE upd_only SET status = 'NEW' WHERE id = 2$$);

-- the upsert is the UPDATE it becomes, or an INSERT
INSERT INTO plain VALUES (1, 'PAID') ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status;
SELECT pg_temp.expect_error($$INSERT INTO plain VALUES (1, 'NEW') ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status$$);
SELECT pg_temp.expect_error($$INSERT INTO plain VALUES (2, 'PAID') ON CONFLICT DO NOTHING$$);
INSERT INTO plain VALUES (2, 'NEW') ON CONFLICT DO NOTHING;
SELECT row_key, from_state, to_state FROM plain_state_log ORDER BY logged_at, row_key::text;
UPDATE pt SET region = 'eu', status = 'REFUNDED' WHERE id = 1;
SELECT pg_temp.expect_error($$INSERT INTO pt VALUES (3, 'us', 'PAID')$$);
SELECT tableoid::regclass AS part, * FROM pt ORDER BY id;
-- the parent's machine governs its own rows; idem_transition refuses it
SELECT pg_temp.expect_error($$UPDATE parent SET status = 'REFUNDED' WHERE id = 1$$);
SELECT pg_temp.expect_error($$SELECT idem_transition('parent', '2', 'REFUNDED')$$);
-- detaching drops both triggers; attaching to the parent again is refused
SELECT idem_detach_machine('parent', 'status');
SELECT count(*) AS triggers_left FROM pg_trigger WHERE tgrelid = 'parent'::regclass;
SELECT pg_temp.expect_error($$SELECT idem_attach_machine('parent', 'status', 'pay')$$);

\c :regress_db
DROP DATABASE regress_idem_machine_upgrade;
