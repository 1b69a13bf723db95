-- Fixtures of test/fuzz/run: records in every status, inbox messages and
-- streams, state machines (one with a hostile name) attached to tables of
-- several shapes, and the role "fuzz" that sqlsmith and one generator stream
-- connect as.  Run as a superuser in a fresh database.
\set ON_ERROR_STOP 1
SET client_min_messages = warning;
CREATE EXTENSION idempotency;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'fuzz') THEN
        CREATE ROLE fuzz LOGIN;
    END IF;
END
$$;
SELECT idem_grant(kind, 'fuzz')
FROM unnest('{client,reconciler,reader,consumer,maintenance,machine_admin,monitor}'::text[]) kind;
GRANT EXECUTE ON FUNCTION idem_tenant_isolation(boolean) TO fuzz;
GRANT CREATE ON SCHEMA public TO fuzz;

-- Records: k1..k40 in scopes '' and t1/t2; every status, live and expired leases.
SELECT count(*) AS claimed FROM (
    SELECT idem_claim('k' || i, idem_fingerprint(('k' || i)::text),
                      CASE WHEN i % 5 = 0 THEN '1 ms' ELSE '1 hour' END::interval,
                      scope => (ARRAY['', 't1', 't2'])[1 + i % 3])
    FROM generate_series(1, 40) i) c;
SELECT count(idem_complete('k' || i, 1, jsonb_build_object('n', i), 200, (ARRAY['', 't1', 't2'])[1 + i % 3]))
FROM generate_series(1, 40) i WHERE i % 4 = 1 AND i % 5 <> 0;
SELECT count(idem_fail('k' || i, 1, '{"e": 1}', i % 8 = 2, (ARRAY['', 't1', 't2'])[1 + i % 3]))
FROM generate_series(1, 40) i WHERE i % 4 = 2 AND i % 5 <> 0;
SELECT count(idem_mark_unknown('k' || i, 1, '{"u": 1}', (ARRAY['', 't1', 't2'])[1 + i % 3]))
FROM generate_series(1, 40) i WHERE i % 4 = 3 AND i % 5 <> 0;
SELECT count(idem_release('k' || i, 1, (ARRAY['', 't1', 't2'])[1 + i % 3]))
FROM generate_series(1, 40) i WHERE i % 8 = 0 AND i % 5 <> 0;

-- Inbox messages and streams.
SELECT count(idem_inbox_accept(c, 'm' || i, CASE WHEN i % 3 = 0 THEN '1 ms' END::interval))
FROM unnest('{c1,t1/c,t2/c}'::text[]) c, generate_series(1, 30) i;
SELECT count(idem_inbox_accept_seq(c, s, 10))
FROM unnest('{c1,t1/c,t2/c}'::text[]) c, unnest('{s1,s2}'::text[]) s;

-- Machines and governed tables.
SELECT idem_define_machine('fz_order', '{"new": ["paid", "void"], "paid": ["shipped", "refunded"],
                                         "shipped": ["delivered"], "void": [], "refunded": []}', '{new}');
SELECT idem_define_machine('fz_flag', '{"on": ["off"], "off": ["on"]}');
SELECT idem_define_machine('fz m"; DROP TABLE fz_orders; --', '{"a\"b": ["c;d"], "c;d": ["a\"b", "e f"]}');

CREATE TABLE fz_orders (id int PRIMARY KEY, status text, note text);
CREATE TABLE fz_two (id int PRIMARY KEY, a text, b text);
CREATE TABLE fz_nopk (status text);
CREATE TABLE fz_pk2 (a text, b int, status text, PRIMARY KEY (a, b));
CREATE TABLE fz_part (id int PRIMARY KEY, status text) PARTITION BY RANGE (id);
CREATE TABLE fz_part_1 PARTITION OF fz_part FOR VALUES FROM (MINVALUE) TO (100);
CREATE TABLE fz_part_2 PARTITION OF fz_part FOR VALUES FROM (100) TO (MAXVALUE);
CREATE TYPE fz_state AS ENUM ('new', 'paid', 'void', 'shipped', 'refunded', 'delivered');
CREATE TABLE fz_enum (id bigint PRIMARY KEY, status fz_state);
CREATE TABLE "fz weird;""t" ("id ""k" int PRIMARY KEY, "st""ate" text);
CREATE TABLE fz_plain (id int PRIMARY KEY, status text);

SELECT idem_attach_machine('fz_orders', 'status', 'fz_order', log => true),
       idem_attach_machine('fz_two', 'a', 'fz_order'),
       idem_attach_machine('fz_two', 'b', 'fz_flag'),
       idem_attach_machine('fz_nopk', 'status', 'fz_flag'),
       idem_attach_machine('fz_pk2', 'status', 'fz_order'),
       idem_attach_machine('fz_part', 'status', 'fz_order'),
       idem_attach_machine('fz_enum', 'status', 'fz_order'),
       idem_attach_machine('"fz weird;""t"', 'st"ate', 'fz m"; DROP TABLE fz_orders; --', log => true);

INSERT INTO fz_orders SELECT i, 'new' FROM generate_series(1, 50) i;
INSERT INTO fz_two SELECT i, 'new', 'on' FROM generate_series(1, 20) i;
INSERT INTO fz_nopk SELECT 'off' FROM generate_series(1, 5);
INSERT INTO fz_pk2 SELECT 'x' || (i % 3), i, 'new' FROM generate_series(1, 20) i;
INSERT INTO fz_part SELECT i * 10, 'new' FROM generate_series(1, 20) i;
INSERT INTO fz_enum SELECT i, 'new' FROM generate_series(1, 20) i;
INSERT INTO "fz weird;""t" SELECT i, 'a"b' FROM generate_series(1, 10) i;
INSERT INTO fz_plain SELECT i, 'whatever' FROM generate_series(1, 10) i;

ALTER TABLE fz_orders OWNER TO fuzz;
ALTER TABLE fz_orders_state_log OWNER TO fuzz;
ALTER TABLE fz_two OWNER TO fuzz;
ALTER TABLE fz_nopk OWNER TO fuzz;
ALTER TABLE fz_pk2 OWNER TO fuzz;
ALTER TABLE fz_part OWNER TO fuzz;
ALTER TABLE fz_part_1 OWNER TO fuzz;
ALTER TABLE fz_part_2 OWNER TO fuzz;
ALTER TABLE fz_enum OWNER TO fuzz;
ALTER TABLE fz_plain OWNER TO fuzz;
-- "fz weird;""t" stays the superuser's: sqlsmith, which does not quote
-- names, would spend half its queries on syntax errors there; the
-- generator's superuser stream writes it.
ANALYZE;
