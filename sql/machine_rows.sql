-- idem-test: superuser: it copies rows from a program (COPY FROM PROGRAM, pg_execute_server_program's) and makes a foreign-data wrapper, both a superuser's
--
-- State machines and the ways a row reaches a governed table besides a plain
-- INSERT or UPDATE: an UPDATE that moves a row to another partition (checked
-- as the move from its old state to its new one, in either direction and
-- across the levels of a partition tree), INSERT ... ON CONFLICT (the conflict
-- path checked as the UPDATE it becomes, the insert path as an INSERT), COPY,
-- multi-row INSERTs, and inheritance parents (refused: their machine would not
-- govern the children's rows).
--
-- Objects of this test: the machines "mr_pay" and "mr_flag", tables in the
-- schema mr.  Everything is dropped at the end.
--

\i sql/include/expect_error.sql
CREATE SCHEMA mr;
SET search_path = mr, public;

SELECT idem_define_machine('mr_pay',
    '{"NEW": ["PAID", "VOID"], "PAID": ["REFUNDED"], "VOID": [], "REFUNDED": []}',
    initial => '{NEW}');
SELECT idem_define_machine('mr_flag', '{"off": ["on"], "on": ["off"]}', initial => '{off}');

--
-- Row movement.  A tree of two levels: mv_eu is a leaf of the root, mv_am is
-- partitioned again into mv_am_us and mv_am_ca.  mv_am_ca was created on its
-- own with its columns in another order, then attached.
--
CREATE TABLE mv (id int, region text, country text, status text, flag text,
                 PRIMARY KEY (id, region, country)) PARTITION BY LIST (region);
CREATE TABLE mv_eu PARTITION OF mv FOR VALUES IN ('eu');
CREATE TABLE mv_am PARTITION OF mv FOR VALUES IN ('am') PARTITION BY LIST (country);
CREATE TABLE mv_am_us PARTITION OF mv_am FOR VALUES IN ('us');
CREATE TABLE mv_am_ca (flag text, status text, country text NOT NULL, id int NOT NULL,
                       region text NOT NULL);
ALTER TABLE mv_am_ca DROP COLUMN flag;
ALTER TABLE mv_am_ca ADD COLUMN flag text;
ALTER TABLE mv_am ATTACH PARTITION mv_am_ca FOR VALUES IN ('ca');
SELECT idem_attach_machine('mv', 'status', 'mr_pay');
INSERT INTO mv VALUES (1, 'eu', '-', 'NEW'), (2, 'eu', '-', 'NEW'), (3, 'am', 'us', 'NEW'),
                      (4, 'am', 'ca', 'NEW');

-- legal moves that also move the row: down the tree, up it, across a level
UPDATE mv SET region = 'am', country = 'us', status = 'PAID' WHERE id = 1;
UPDATE mv SET region = 'eu', country = '-', status = 'PAID' WHERE id = 3;
UPDATE mv SET country = 'ca', status = 'REFUNDED' WHERE id = 1;
-- staying in the state while moving
UPDATE mv SET region = 'am', country = 'ca' WHERE id = 2;
UPDATE mv SET region = 'eu', country = '-' WHERE id = 2;
-- several rows at once, to several partitions
UPDATE mv SET region = 'am', country = CASE id WHEN 2 THEN 'us' ELSE 'ca' END,
              status = CASE status WHEN 'NEW' THEN 'VOID' ELSE status END
WHERE id IN (2, 3);
SELECT tableoid::regclass AS part, id, region, country, status FROM mv ORDER BY id;

-- illegal moves are refused whether or not the row moves
SELECT pg_temp.expect_error($$UPDATE mv SET region = 'eu', country = '-', status = 'NEW' WHERE id = 1$$);
SELECT pg_temp.expect_error($$UPDATE mv SET region = 'eu', country = '-', status = 'REFUNDED' WHERE id = 4$$);
SELECT pg_temp.expect_error($$UPDATE mv SET country = 'us', status = NULL WHERE id = 4$$);
SELECT pg_temp.expect_error($$UPDATE mv SET country = 'us', status = 'BOGUS' WHERE id = 4$$);

-- The destination's own BEFORE INSERT triggers run after the source's
-- checks: the state the row arrives in is checked against the state it left.
CREATE FUNCTION mr.void_on_arrival() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    NEW.status := 'VOID';
    RETURN NEW;
END
$f$;
CREATE TRIGGER a_void_on_arrival BEFORE INSERT ON mv_am_us
    FOR EACH ROW EXECUTE FUNCTION mr.void_on_arrival();
-- NEW -> PAID at the source, then VOID at the destination: PAID was never
-- stored, NEW -> VOID is a move of the machine
UPDATE mv SET country = 'us', status = 'PAID' WHERE id = 4;
SELECT tableoid::regclass AS part, id, status FROM mv WHERE id = 4;
-- PAID -> VOID is not
UPDATE mv SET region = 'eu', country = '-' WHERE id = 3;
SELECT pg_temp.expect_error($$UPDATE mv SET region = 'am', country = 'us' WHERE id = 3$$);
DROP TRIGGER a_void_on_arrival ON mv_am_us;

-- A new row is a new row, whatever UPDATE came before it in the transaction
-- or statement: it must start in an initial state.
SELECT pg_temp.expect_error($$INSERT INTO mv VALUES (10, 'eu', '-', 'PAID')$$);
SELECT pg_temp.expect_error($$INSERT INTO mv_am_ca (id, region, country, status) VALUES (10, 'am', 'ca', 'PAID')$$);
BEGIN;
UPDATE mv SET region = 'am', country = 'us' WHERE id = 3;
SAVEPOINT s;
SELECT pg_temp.expect_error($$INSERT INTO mv VALUES (10, 'am', 'us', 'PAID')$$);
ROLLBACK TO s;
SELECT pg_temp.expect_error($$INSERT INTO mv_am_us VALUES (10, 'am', 'us', 'REFUNDED')$$);
ROLLBACK TO s;
-- an UPDATE that stays in its partition vouches for no INSERT either
UPDATE mv SET status = 'PAID' WHERE id = 3;
SELECT pg_temp.expect_error($$INSERT INTO mv_am_us VALUES (11, 'am', 'us', 'PAID')$$);
ROLLBACK;
SELECT pg_temp.expect_error($q$
DO $do$
BEGIN
    UPDATE mr.mv SET region = 'am', country = 'us' WHERE id = 3;
    INSERT INTO mr.mv VALUES (10, 'am', 'us', 'REFUNDED');
END
$do$$q$);
SELECT pg_temp.expect_error($q$
WITH moved AS (UPDATE mr.mv SET region = 'am', country = 'us' WHERE id = 3 RETURNING *)
INSERT INTO mr.mv SELECT 10, 'am', 'us', status FROM moved$q$);
SELECT tableoid::regclass AS part, id, region, country, status FROM mv ORDER BY id;

-- Two machines on one partitioned table: both moves are checked.
SELECT idem_attach_machine('mv', 'flag', 'mr_flag');
UPDATE mv SET flag = 'off';
UPDATE mv SET region = 'eu', country = '-', flag = 'on' WHERE id = 1;
SELECT pg_temp.expect_error($$UPDATE mv SET region = 'am', country = 'ca', flag = NULL WHERE id = 1$$);
SELECT pg_temp.expect_error($$UPDATE mv SET region = 'am', country = 'ca', status = 'PAID' WHERE id = 1$$);
UPDATE mv SET region = 'am', country = 'ca', flag = 'off' WHERE id = 1;
SELECT tableoid::regclass AS part, id, status, flag FROM mv ORDER BY id;

-- The note an UPDATE that stayed in its partition leaves may outlive the
-- partition's blocks, or the partition: a new row is still a new row.
SELECT pg_temp.expect_error($q$
DO $do$
BEGIN
    UPDATE mr.mv SET flag = 'on' WHERE id = 2;
    TRUNCATE mr.mv_am_us;
    INSERT INTO mr.mv VALUES (12, 'am', 'us', 'PAID', 'off');
END
$do$$q$);
SELECT pg_temp.expect_error($q$
DO $do$
BEGIN
    UPDATE mr.mv SET flag = 'on' WHERE id = 2;
    ALTER TABLE mr.mv_am DETACH PARTITION mr.mv_am_us;
    DROP TABLE mr.mv_am_us;
    INSERT INTO mr.mv VALUES (12, 'am', 'ca', 'PAID', 'off');
END
$do$$q$);

-- idem_transition on the root: the partition that holds the key
SELECT idem_transition('mv', ARRAY['3', 'eu', '-'], 'REFUNDED', state_column => 'status');
SELECT idem_transition('mv', ARRAY['2', 'am', 'us'], 'NEW', state_column => 'status');
INSERT INTO mv VALUES (5, 'am', 'us', 'NEW', 'off');
SELECT idem_transition('mv', ARRAY['5', 'am', 'us'], 'PAID', state_column => 'status');

-- A table partitioned by its state: every move of the machine moves the row,
-- also through idem_transition.
CREATE TABLE by_state (id int, status text, PRIMARY KEY (id, status)) PARTITION BY LIST (status);
CREATE TABLE by_state_open PARTITION OF by_state FOR VALUES IN ('NEW', 'PAID');
CREATE TABLE by_state_closed PARTITION OF by_state FOR VALUES IN ('VOID', 'REFUNDED');
SELECT idem_attach_machine('by_state', 'status', 'mr_pay');
INSERT INTO by_state VALUES (1, 'NEW'), (2, 'NEW');
UPDATE by_state SET status = 'VOID' WHERE id = 1;
SELECT pg_temp.expect_error($$UPDATE by_state SET status = 'REFUNDED' WHERE id = 2$$);
SELECT idem_transition('by_state', ARRAY['2', 'NEW'], 'PAID');
SELECT pg_temp.expect_error($$SELECT idem_transition('by_state', ARRAY['2', 'PAID'], 'VOID', '{PAID}')$$);
SELECT tableoid::regclass AS part, * FROM by_state ORDER BY id;
SELECT pg_temp.expect_error($$INSERT INTO by_state VALUES (3, 'VOID')$$);

--
-- INSERT ... ON CONFLICT.
--
CREATE TABLE up (id int PRIMARY KEY, status text, note text);
SELECT idem_attach_machine('up', 'status', 'mr_pay');
INSERT INTO up VALUES (1, 'NEW'), (2, 'NEW');
-- the conflict path is the UPDATE it becomes: NEW -> PAID, from the proposed row
INSERT INTO up VALUES (1, 'PAID') ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status;
-- ... whatever state the proposed row names, or whether it names one
INSERT INTO up VALUES (1, 'BOGUS') ON CONFLICT (id) DO UPDATE SET status = 'REFUNDED';
INSERT INTO up VALUES (2, NULL) ON CONFLICT (id) DO UPDATE SET note = 'touched';
-- a move the machine does not contain is refused on that path too
SELECT pg_temp.expect_error($$INSERT INTO up VALUES (1, 'NEW') ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status$$);
SELECT pg_temp.expect_error($$INSERT INTO up VALUES (2, 'REFUNDED') ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status$$);
-- the insert path is an INSERT: only initial states
SELECT pg_temp.expect_error($$INSERT INTO up VALUES (3, 'PAID') ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status$$);
SELECT pg_temp.expect_error($$INSERT INTO up VALUES (3, NULL) ON CONFLICT (id) DO UPDATE SET status = 'NEW'$$);
INSERT INTO up VALUES (3, 'NEW') ON CONFLICT (id) DO UPDATE SET status = 'VOID';
-- a conflict whose WHERE is false writes nothing and is not checked
INSERT INTO up VALUES (3, 'BOGUS') ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status WHERE false;
-- several rows, both paths in one statement
INSERT INTO up VALUES (2, 'PAID'), (4, 'NEW') ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status;
SELECT pg_temp.expect_error($$INSERT INTO up VALUES (2, 'REFUNDED'), (5, 'PAID') ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status$$);
SELECT pg_temp.expect_error($$INSERT INTO up VALUES (5, 'NEW'), (2, 'NEW') ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status$$);
-- DO NOTHING: a conflict writes nothing; an insert must start in an initial state
INSERT INTO up VALUES (1, 'PAID') ON CONFLICT DO NOTHING;
INSERT INTO up VALUES (1, NULL) ON CONFLICT (id) DO NOTHING;
SELECT pg_temp.expect_error($$INSERT INTO up VALUES (6, 'PAID') ON CONFLICT DO NOTHING$$);
INSERT INTO up VALUES (6, 'NEW'), (1, 'VOID') ON CONFLICT DO NOTHING;
SELECT * FROM up ORDER BY id;
-- a BEFORE INSERT trigger of the table that fixes the proposed row: the
-- row stored is the one checked
CREATE FUNCTION mr.start_new() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    NEW.status := coalesce(NEW.status, 'NEW');
    RETURN NEW;
END
$f$;
CREATE TRIGGER a_start_new BEFORE INSERT ON up FOR EACH ROW EXECUTE FUNCTION mr.start_new();
INSERT INTO up (id) VALUES (7) ON CONFLICT DO NOTHING;
DROP TRIGGER a_start_new ON up;

-- COPY and multi-row INSERTs: every row is checked, one bad row fails all
SELECT pg_temp.expect_error($$INSERT INTO up VALUES (8, 'NEW'), (9, 'VOID')$$);
COPY up (id, status) FROM stdin;
8	NEW
9	NEW
\.
SELECT pg_temp.expect_error($$COPY up (id, status) FROM PROGRAM 'printf "10\tNEW\n11\tPAID\n"'$$);
SELECT id, status FROM up WHERE id >= 7 ORDER BY id;

-- On a partitioned table, the upsert reaches the partition through the root.
SELECT pg_temp.expect_error($$INSERT INTO mv VALUES (5, 'am', 'us', 'NEW', 'off') ON CONFLICT (id, region, country) DO UPDATE SET status = EXCLUDED.status$$);
INSERT INTO mv VALUES (5, 'am', 'us', 'REFUNDED', 'off') ON CONFLICT (id, region, country) DO UPDATE SET status = EXCLUDED.status;
SELECT pg_temp.expect_error($$INSERT INTO mv VALUES (6, 'am', 'ca', 'PAID', 'off') ON CONFLICT (id, region, country) DO UPDATE SET status = EXCLUDED.status$$);
INSERT INTO mv VALUES (6, 'am', 'ca', 'NEW', 'off') ON CONFLICT (id, region, country) DO NOTHING;
SELECT tableoid::regclass AS part, id, status FROM mv WHERE id >= 5 ORDER BY id;

-- What attaching creates: the BEFORE trigger that checks every UPDATE, and
-- an AFTER INSERT trigger that checks the rows really inserted (cloned to the
-- partitions like the first).
SELECT tgrelid::regclass AS table_name, tgname, pg_get_triggerdef(oid) AS definition
FROM pg_trigger WHERE tgrelid IN ('up'::regclass, 'mv'::regclass, 'mv_am_ca'::regclass)
ORDER BY tgrelid::regclass::text, tgname;
SELECT * FROM idem_attached_machines WHERE table_name IN ('up'::regclass, 'mv'::regclass) ORDER BY table_name::text, state_column;
SELECT idem_detach_machine('up', 'status');
SELECT count(*) AS triggers_left FROM pg_trigger WHERE tgrelid = 'up'::regclass;
INSERT INTO up VALUES (20, 'PAID') ON CONFLICT DO NOTHING;

-- The trigger functions only work as the triggers idem_attach_machine
-- creates; the WHEN function alone says whether a state may start a row.
CREATE TABLE misuse (id int PRIMARY KEY, status text);
CREATE TRIGGER t BEFORE INSERT ON misuse FOR EACH ROW
    EXECUTE FUNCTION idem_enforce_initial_state('mr_pay', 'status');
SELECT pg_temp.expect_error($$INSERT INTO misuse VALUES (1, 'NEW')$$);
DROP TRIGGER t ON misuse;
CREATE TRIGGER t AFTER INSERT ON misuse FOR EACH ROW EXECUTE FUNCTION idem_enforce_initial_state('mr_pay');
SELECT pg_temp.expect_error($$INSERT INTO misuse VALUES (1, 'NEW')$$);
DROP TRIGGER t ON misuse;
CREATE TRIGGER t AFTER INSERT ON misuse FOR EACH ROW EXECUTE FUNCTION idem_enforce_initial_state('mr_none', 'status');
SELECT pg_temp.expect_error($$INSERT INTO misuse VALUES (1, 'NEW')$$);
DROP TRIGGER t ON misuse;
SELECT state, idem_inserted_unchecked('mr_pay', 'status', 'misuse'::regclass, state) AS refused
FROM unnest(ARRAY['NEW', 'PAID', 'BOGUS', NULL]) state;
SELECT idem_inserted_unchecked('mr_none', 'status', 'misuse'::regclass, 'NEW') AS refused;

--
-- Inheritance: the machine's triggers would govern the parent's own rows
-- only, so attaching to a parent is refused, and idem_transition refuses a
-- parent that got children after the machine was attached.
--
CREATE TABLE ih (id int PRIMARY KEY, status text);
CREATE TABLE ih_child (PRIMARY KEY (id)) INHERITS (ih);
SELECT pg_temp.expect_error($$SELECT idem_attach_machine('ih', 'status', 'mr_pay')$$);
SELECT count(*) AS attachments FROM idem_attached_machines WHERE table_name = 'ih'::regclass;
-- a child governs its own rows
SELECT idem_attach_machine('ih_child', 'status', 'mr_pay');
INSERT INTO ih_child VALUES (1, 'NEW');
SELECT pg_temp.expect_error($$UPDATE ih SET status = 'REFUNDED'$$);
SELECT idem_transition('ih_child', '1', 'PAID');
-- a parent that got a child after attaching
CREATE TABLE ih2 (id int PRIMARY KEY, status text);
SELECT idem_attach_machine('ih2', 'status', 'mr_pay');
INSERT INTO ih2 VALUES (1, 'NEW');
SELECT idem_transition('ih2', '1', 'PAID');
CREATE TABLE ih2_child (PRIMARY KEY (id)) INHERITS (ih2);
INSERT INTO ih2_child VALUES (2, 'REFUNDED');
SELECT pg_temp.expect_error($$SELECT idem_transition('ih2', '2', 'NEW', '{REFUNDED}')$$);
SELECT pg_temp.expect_error($$SELECT idem_transition('ih2', '1', 'REFUNDED')$$);
SELECT tableoid::regclass AS part, * FROM ih2 ORDER BY id;
-- without the child it works again
DROP TABLE ih2_child;
SELECT idem_transition('ih2', '1', 'REFUNDED');

--
-- A note vouches for the row movement that left it, and nothing else: not for
-- a later statement of the same top-level statement (a multi-statement
-- query, a DO block), not for another table, whatever left the note unused
-- (the destination's trigger skipped or never run), and not for a state the
-- destination's later triggers put in after the check.
--
CREATE TABLE o2 (id int, region int, status text, PRIMARY KEY (id, region))
    PARTITION BY LIST (region);
CREATE TABLE o2_1 PARTITION OF o2 FOR VALUES IN (1);
CREATE TABLE o2_2 PARTITION OF o2 FOR VALUES IN (2);
CREATE TABLE o2_3 PARTITION OF o2 FOR VALUES IN (3);
SELECT idem_attach_machine('o2', 'status', 'mr_pay');
INSERT INTO o2 VALUES (-1, 1, 'NEW'), (-2, 1, 'NEW'), (10, 1, 'NEW'), (11, 1, 'NEW');

-- a role that may only insert, with a trigger of its own on a temp table
CREATE ROLE regress_mr_alice;
GRANT USAGE ON SCHEMA mr TO regress_mr_alice;
GRANT INSERT, SELECT ON o2 TO regress_mr_alice;
SET ROLE regress_mr_alice;
CREATE TEMP TABLE mine (k int, status text) PARTITION BY LIST (k);
CREATE TEMP TABLE mine_1 PARTITION OF mine FOR VALUES IN (1);
CREATE TEMP TABLE mine_2 PARTITION OF mine FOR VALUES IN (2);
INSERT INTO mine VALUES (1, 'PAID');
CREATE TRIGGER t BEFORE UPDATE ON mine_1 FOR EACH ROW
    EXECUTE FUNCTION idem_enforce_transition('mr_pay', 'status');
-- one simple query of two statements
SELECT pg_temp.expect_error($$UPDATE mine SET k = 2 WHERE k = 1; INSERT INTO mr.o2 VALUES (42, 1, 'REFUNDED')$$);
UPDATE mine SET k = 1;
SELECT pg_temp.expect_error($q$
DO $do$
BEGIN
    UPDATE mine SET k = 2 WHERE k = 1;
    INSERT INTO mr.o2 VALUES (43, 2, 'REFUNDED');
END
$do$$q$);
-- the same command: another table's note is no move of this one
SELECT pg_temp.expect_error($q$
WITH m AS (UPDATE mine SET k = 2 WHERE k = 1 RETURNING 1)
INSERT INTO mr.o2 SELECT 44, 2, 'REFUNDED' FROM m$q$);
DROP TABLE mine;
RESET ROLE;
SELECT count(*) AS inserted FROM o2 WHERE id >= 42;

-- a BEFORE INSERT trigger of the destination that skips the moved row
CREATE FUNCTION mr.skip_negative() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    IF NEW.id < 0 THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END
$f$;
CREATE TRIGGER a_skip BEFORE INSERT ON o2_2 FOR EACH ROW EXECUTE FUNCTION mr.skip_negative();
SELECT pg_temp.expect_error($$UPDATE o2 SET region = 2 WHERE id = -1; INSERT INTO o2 VALUES (7, 1, 'PAID')$$);
SELECT pg_temp.expect_error($q$
DO $do$
BEGIN
    UPDATE mr.o2 SET region = 2 WHERE id = -1;
    INSERT INTO mr.o2 VALUES (7, 3, 'PAID');
END
$do$$q$);
DROP TRIGGER a_skip ON o2_2;
-- the destination's trigger disabled
ALTER TABLE o2_2 DISABLE TRIGGER zz_idem_machine_status;
SELECT pg_temp.expect_error($$UPDATE o2 SET region = 2 WHERE id = -1; INSERT INTO o2 VALUES (7, 3, 'PAID')$$);
ALTER TABLE o2_2 ENABLE TRIGGER zz_idem_machine_status;
SELECT tableoid::regclass AS part, * FROM o2 ORDER BY id;

-- Legal moves pass whatever SQL the other triggers of either partition run
-- (each of their statements advances the command counter), and from a DO
-- block or a function.
CREATE TABLE mr.audit (id int, what text);
CREATE FUNCTION mr.audit_row() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO mr.audit VALUES (OLD.id, TG_NAME || ' ' || TG_TABLE_NAME);
        RETURN OLD;
    END IF;
    INSERT INTO mr.audit VALUES (NEW.id, TG_NAME || ' ' || TG_TABLE_NAME);
    PERFORM count(*) FROM mr.audit;
    RETURN NEW;
END
$f$;
CREATE TRIGGER a_audit BEFORE INSERT ON o2_2 FOR EACH ROW EXECUTE FUNCTION mr.audit_row();
CREATE TRIGGER a_audit BEFORE UPDATE ON o2_1 FOR EACH ROW EXECUTE FUNCTION mr.audit_row();
CREATE TRIGGER zzz_audit BEFORE UPDATE ON o2_1 FOR EACH ROW EXECUTE FUNCTION mr.audit_row();
CREATE TRIGGER b_audit BEFORE DELETE ON o2_1 FOR EACH ROW EXECUTE FUNCTION mr.audit_row();
UPDATE o2 SET region = 2, status = 'PAID' WHERE id = -2;
DO $do$
BEGIN
    UPDATE mr.o2 SET region = 1 WHERE id = -2;
    UPDATE mr.o2 SET region = 2, status = 'REFUNDED' WHERE id = -2;
END
$do$;
CREATE FUNCTION mr.move_to(k int, r int, s text) RETURNS void LANGUAGE sql AS $f$
    UPDATE mr.o2 SET region = r, status = s WHERE id = k;
$f$;
SELECT mr.move_to(11, 2, 'VOID');
SELECT pg_temp.expect_error($$SELECT mr.move_to(11, 1, 'NEW')$$);
SELECT count(*) AS audited FROM mr.audit;
DROP TRIGGER a_audit ON o2_2;
DROP TRIGGER a_audit ON o2_1;
DROP TRIGGER zzz_audit ON o2_1;
DROP TRIGGER b_audit ON o2_1;

-- a BEFORE INSERT trigger of the destination sorting after the check
CREATE FUNCTION mr.late_state() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    NEW.status := TG_ARGV[0];
    RETURN NEW;
END
$f$;
CREATE TRIGGER zzz_late BEFORE INSERT ON o2_2 FOR EACH ROW EXECUTE FUNCTION mr.late_state('REFUNDED');
SELECT pg_temp.expect_error($$UPDATE o2 SET region = 2 WHERE id = 10$$);
DROP TRIGGER zzz_late ON o2_2;
CREATE TRIGGER zzz_late BEFORE INSERT ON o2_2 FOR EACH ROW EXECUTE FUNCTION mr.late_state('PAID');
UPDATE o2 SET region = 2 WHERE id = 10;
DROP TRIGGER zzz_late ON o2_2;
SELECT tableoid::regclass AS part, * FROM o2 ORDER BY id;
SELECT idem_detach_machine('o2', 'status');
REVOKE ALL ON o2 FROM regress_mr_alice;
REVOKE ALL ON SCHEMA mr FROM regress_mr_alice;
DROP ROLE regress_mr_alice;

--
-- idem_transition refuses a parent with inheritance children whatever its
-- kind (here a foreign table), not only an ordinary table.
--
CREATE FOREIGN DATA WRAPPER mr_dummy;
CREATE SERVER mr_nowhere FOREIGN DATA WRAPPER mr_dummy;
CREATE FOREIGN TABLE ft (id int, status text) SERVER mr_nowhere;
SELECT idem_attach_machine('ft', 'status', 'mr_pay', validate => false);
CREATE TABLE ft_child (id int PRIMARY KEY, status text) INHERITS (ft);
SELECT pg_temp.expect_error($$SELECT idem_transition('ft', '1', 'PAID')$$);
SELECT idem_detach_machine('ft', 'status');
DROP TABLE ft_child;
DROP FOREIGN TABLE ft;
DROP SERVER mr_nowhere;
DROP FOREIGN DATA WRAPPER mr_dummy;

--
-- Clean up.
--
SELECT idem_detach_machine('mv', 'status');
SELECT idem_detach_machine('mv', 'flag');
SELECT idem_detach_machine('ih_child', 'status');
SELECT idem_detach_machine('ih2', 'status');
SELECT idem_detach_machine('by_state', 'status');
SELECT idem_drop_machine('mr_pay');
SELECT idem_drop_machine('mr_flag');
SET client_min_messages = warning;
DROP SCHEMA mr CASCADE;
RESET client_min_messages;
RESET search_path;
