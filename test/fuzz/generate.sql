-- The statement generator of test/fuzz/run: prints :n statements, one per
-- line, that call the extension's functions (and write the tables they
-- govern) with arguments drawn from pools of valid, edge and hostile values.
-- Deterministic for a given :seed.  Variables:
--   n       number of statements
--   seed    a number in [-1, 1] for setseed()
--   super   'on' when the stream runs as a superuser: adds the statements
--           only a superuser may run (idempotency.max_key_length, ALTER TABLE)
--   wide    'on' adds machine definitions of up to 50000 states
-- psql -X -q -At -v n=1000 -v seed=0.5 -v super=on -v wide=off -f generate.sql
\set ON_ERROR_STOP 1

CREATE FUNCTION pg_temp.pick(VARIADIC items text[]) RETURNS text
LANGUAGE sql VOLATILE AS $$ SELECT items[1 + floor(random() * cardinality(items))::int] $$;

-- one expression of a pool, as SQL text: a usual value four times out of
-- five, an edge or hostile one otherwise
CREATE FUNCTION pg_temp.v(pool text) RETURNS text LANGUAGE plpgsql VOLATILE AS $f$
DECLARE
    usual boolean := random() < 0.8;
BEGIN
    RETURN CASE pool
    WHEN 'key' THEN CASE WHEN usual THEN pg_temp.pick(
        $$'k1'$$, $$'k2'$$, $$'k3'$$, $$'k4'$$, $$'k' || (random() * 40)::int$$,
        $$'n' || (random() * 50)::int$$) ELSE pg_temp.pick(
        $$NULL::text$$, $$''$$, $$repeat('k', 255)$$, $$repeat('k', 256)$$, $$repeat('é', 128)$$,
        $$'k1'' ; DROP TABLE fz_orders; --'$$, $$'a"b c;d'$$, $$E'tab\there'$$, $$repeat('x', 1048576)$$) END
    WHEN 'scope' THEN CASE WHEN usual THEN pg_temp.pick($$''$$, $$''$$, $$'t1'$$, $$'t2'$$)
        ELSE pg_temp.pick($$NULL::text$$, $$repeat('s', 256)$$, $$'t1"; --'$$) END
    WHEN 'fp' THEN CASE WHEN usual THEN pg_temp.pick(
        $$'\x01'::bytea$$, $$idem_fingerprint('k1'::text)$$, $$idem_fingerprint(('k' || (random() * 40)::int)::text)$$)
        ELSE pg_temp.pick($$'\x02'::bytea$$, $$NULL::bytea$$, $$''::bytea$$, $$decode(repeat('ab', 64), 'hex')$$,
                          $$decode(repeat('ab', 65), 'hex')$$) END
    WHEN 'lease' THEN CASE WHEN usual THEN pg_temp.pick(
        $$NULL::interval$$, $$'1 hour'::interval$$, $$'1 ms'::interval$$, $$'10 ms'::interval$$,
        $$'1 microsecond'::interval$$) ELSE pg_temp.pick(
        $$'0'::interval$$, $$'-1 second'::interval$$, $$'1 day -24 hours'::interval$$,
        $$'-1 month 30 days'::interval$$, $$'300000 years'::interval$$, $$'-300000 years'::interval$$,
        $$'178000000 years'::interval$$) END
    WHEN 'timeout' THEN CASE WHEN usual THEN pg_temp.pick($$'0'::interval$$, $$'1 ms'::interval$$, $$'5 ms'::interval$$)
        ELSE pg_temp.pick($$NULL::interval$$, $$'-1 ms'::interval$$, $$'300000 years'::interval$$,
                          $$'1 day -24 hours'::interval$$) END
    WHEN 'token' THEN CASE WHEN usual THEN pg_temp.pick($$1$$, $$2$$, $$(random() * 4)::bigint + 1$$, $$4294967297$$)
        ELSE pg_temp.pick($$NULL::bigint$$, $$0$$, $$-1$$, $$9223372036854775807$$, $$(-9223372036854775807 - 1)$$) END
    WHEN 'json' THEN CASE WHEN usual THEN pg_temp.pick(
        $$'{}'::jsonb$$, $$'{"ok": true}'::jsonb$$, $$NULL::jsonb$$, $$jsonb_build_object('n', random())$$)
        ELSE pg_temp.pick($$'null'::jsonb$$, $$'[]'::jsonb$$, $$'"s"'::jsonb$$,
                          $$jsonb_build_object('blob', repeat('x', 100000))$$,
                          $$(repeat('[', 1000) || repeat(']', 1000))::jsonb$$,
                          $$(SELECT jsonb_object_agg('f' || i, i) FROM generate_series(1, 1000) i)$$) END
    WHEN 'bool' THEN CASE WHEN usual THEN pg_temp.pick($$true$$, $$false$$) ELSE $$NULL::boolean$$ END
    WHEN 'int' THEN CASE WHEN usual THEN pg_temp.pick($$200$$, $$NULL::integer$$, $$500$$)
        ELSE pg_temp.pick($$0$$, $$-1$$, $$2147483647$$, $$(-2147483647 - 1)$$) END
    WHEN 'status' THEN CASE WHEN usual THEN pg_temp.pick($$'succeeded'$$, $$'failed'$$)
        ELSE pg_temp.pick($$'processing'$$, $$'unknown'$$, $$NULL::idem_status$$) END
    WHEN 'consumer' THEN CASE WHEN usual THEN pg_temp.pick($$'c1'$$, $$'t1/c'$$, $$'t2/c'$$, $$'c' || (random() * 5)::int$$)
        ELSE pg_temp.pick($$NULL::text$$, $$''$$, $$repeat('c', 256)$$, $$'c"; --'$$) END
    WHEN 'message' THEN CASE WHEN usual THEN pg_temp.pick($$'m' || (random() * 40)::int$$, $$'m1'$$)
        ELSE pg_temp.pick($$NULL::text$$, $$''$$, $$repeat('m', 256)$$, $$'m''; --'$$) END
    WHEN 'stream' THEN CASE WHEN usual THEN pg_temp.pick($$'s1'$$, $$'s2'$$, $$'s' || (random() * 5)::int$$)
        ELSE pg_temp.pick($$NULL::text$$, $$''$$, $$repeat('s', 256)$$) END
    WHEN 'seq' THEN CASE WHEN usual THEN pg_temp.pick($$(random() * 20)::bigint$$, $$11::bigint$$, $$12::bigint$$)
        ELSE pg_temp.pick($$NULL::bigint$$, $$-1::bigint$$, $$0::bigint$$, $$9223372036854775807::bigint$$,
                          $$9223372036854775806::bigint$$, $$4611686018427387904::bigint$$) END
    WHEN 'major' THEN CASE WHEN usual THEN $$(random() * 100)::bigint$$
        ELSE pg_temp.pick($$NULL::bigint$$, $$-1::bigint$$, $$8796093022207::bigint$$, $$8796093022208::bigint$$) END
    WHEN 'minor' THEN CASE WHEN usual THEN $$(random() * 10)::int$$
        ELSE pg_temp.pick($$NULL::integer$$, $$-1$$, $$1048575$$, $$1048576$$) END
    WHEN 'machine' THEN CASE WHEN usual THEN pg_temp.pick(
        $$'fz_order'$$, $$'fz_flag'$$, $$'fz_new'$$, $$'fz m"; DROP TABLE fz_orders; --'$$)
        ELSE pg_temp.pick($$'idem.record'$$, $$'nope'$$, $$''$$, $$NULL::text$$, $$repeat('m', 64)$$,
                          $$repeat('m', 63)$$) END
    WHEN 'moves' THEN CASE WHEN usual THEN pg_temp.pick(
        $$'{"new": ["paid", "void"], "paid": ["shipped", "refunded"], "shipped": ["delivered"]}'::jsonb$$,
        $$'{"new": ["paid"], "paid": ["new", "void"], "on": ["off"]}'::jsonb$$,
        $$'{"on": ["off"], "off": ["on"]}'::jsonb$$,
        $$'{"a\"b": ["c;d"], "c;d": ["a\"b", "e f"]}'::jsonb$$,
        $$(SELECT jsonb_object_agg('s' || i, jsonb_build_array('s' || (i + 1), 's' || (i * 7 % 50))) FROM generate_series(1, 50) i)$$)
        ELSE pg_temp.pick($$'{}'::jsonb$$, $$'[]'::jsonb$$, $$NULL::jsonb$$, $$'{"": []}'::jsonb$$,
                          $$'{"a": [1]}'::jsonb$$, $$'{"a": "b"}'::jsonb$$, $$'{"a": [null]}'::jsonb$$) END
    WHEN 'initial' THEN CASE WHEN usual THEN pg_temp.pick($$NULL::text[]$$, $$'{}'::text[]$$, $$'{new}'::text[]$$)
        ELSE pg_temp.pick($$'{on}'::text[]$$, $$'{new,NULL}'::text[]$$, $$'{nope}'::text[]$$, $$'{{new}}'::text[]$$) END
    WHEN 'table' THEN CASE WHEN usual THEN pg_temp.pick(
        $$'fz_orders'::regclass$$, $$'fz_two'::regclass$$, $$'fz_pk2'::regclass$$, $$'fz_part'::regclass$$,
        $$'fz_enum'::regclass$$, $$'"fz weird;""t"'::regclass$$)
        ELSE pg_temp.pick($$'fz_nopk'::regclass$$, $$'fz_part_1'::regclass$$, $$'fz_plain'::regclass$$,
                          $$NULL::regclass$$, $$'idempotency_records'::regclass$$, $$'idem_inbox'::regclass$$,
                          $$'pg_class'::regclass$$, $$0::regclass$$) END
    WHEN 'column' THEN CASE WHEN usual THEN pg_temp.pick($$NULL::name$$, $$'status'$$, $$'a'$$, $$'b'$$, $$'st"ate'$$)
        ELSE pg_temp.pick($$'note'$$, $$'id'$$, $$''$$, $$'xmin'$$, $$'status"; --'$$) END
    WHEN 'state' THEN CASE WHEN usual THEN pg_temp.pick(
        $$'new'$$, $$'paid'$$, $$'void'$$, $$'shipped'$$, $$'refunded'$$, $$'delivered'$$, $$'on'$$,
        $$'off'$$, $$'a"b'$$, $$'c;d'$$, $$'e f'$$)
        ELSE pg_temp.pick($$NULL::text$$, $$''$$, $$'nope'$$, $$repeat('p', 10000)$$) END
    WHEN 'states' THEN CASE WHEN usual THEN pg_temp.pick($$NULL::text[]$$, $$'{new}'::text[]$$, $$'{paid,shipped}'::text[]$$)
        ELSE pg_temp.pick($$'{}'::text[]$$, $$'{NULL}'::text[]$$, $$'{nope}'::text[]$$) END
    WHEN 'rowkey' THEN CASE WHEN usual THEN pg_temp.pick(
        $$((random() * 60)::int)::text$$, $$'1'$$, $$((random() * 20)::int * 10)::text$$,
        $$ARRAY['x' || (random() * 3)::int, ((random() * 20)::int)::text]$$)
        ELSE pg_temp.pick($$NULL::text$$, $$''$$, $$'x'$$, $$'1; --'$$, $$repeat('9', 100)$$, $$ARRAY['x1', NULL]$$,
                          $$'{}'::text[]$$, $$'{{x1,2}}'::text[]$$, $$ARRAY['1', '2', '3']$$) END
    WHEN 'rowstate' THEN CASE WHEN usual THEN pg_temp.pick(
        $$'new'$$, $$'paid'$$, $$'void'$$, $$'shipped'$$, $$'refunded'$$, $$'delivered'$$, $$'on'$$, $$'off'$$,
        $$'a"b'$$, $$'c;d'$$, $$'e f'$$)
        ELSE pg_temp.pick($$NULL$$, $$'bogus'$$) END
    WHEN 'batch' THEN CASE WHEN usual THEN pg_temp.pick($$10000$$, $$1$$, $$(random() * 100)::int + 1$$, $$NULL::integer$$)
        ELSE pg_temp.pick($$0$$, $$-1$$, $$2147483647$$) END
    WHEN 'tgargs' THEN pg_temp.pick(
        $$'\x6100620063'::bytea$$, $$''::bytea$$, $$NULL::bytea$$, $$'\x610062'::bytea$$,
        $$decode(repeat('00', 1000), 'hex')$$, $$(SELECT tgargs FROM pg_trigger LIMIT 1)$$)
    WHEN 'iso' THEN pg_temp.pick(
        $$READ COMMITTED$$, $$READ COMMITTED$$, $$REPEATABLE READ$$, $$SERIALIZABLE$$)
    END;
END
$f$;

CREATE FUNCTION pg_temp.statement(super boolean, wide boolean, nested boolean DEFAULT false)
RETURNS text LANGUAGE plpgsql VOLATILE AS $f$
DECLARE
    r float8 := random() * (CASE WHEN nested THEN 80 ELSE 100 END);
    v text;
BEGIN
    IF r < 18 THEN
        RETURN format('SELECT * FROM idem_claim(%s, %s, %s, %s, %s, %s);',
                      pg_temp.v('key'), pg_temp.v('fp'), pg_temp.v('lease'), pg_temp.v('scope'),
                      pg_temp.v('lease'), pg_temp.v('bool'));
    ELSIF r < 20 THEN
        RETURN format('SELECT outcome, token FROM idem_claim(%s, %s);', pg_temp.v('key'), pg_temp.v('fp'));
    ELSIF r < 26 THEN
        RETURN format('SELECT idem_complete(%s, %s, %s, %s, %s);', pg_temp.v('key'), pg_temp.v('token'),
                      pg_temp.v('json'), pg_temp.v('int'), pg_temp.v('scope'));
    ELSIF r < 30 THEN
        RETURN format('SELECT idem_fail(%s, %s, %s, %s, %s, %s);', pg_temp.v('key'), pg_temp.v('token'),
                      pg_temp.v('json'), pg_temp.v('bool'), pg_temp.v('scope'), pg_temp.v('int'));
    ELSIF r < 33 THEN
        RETURN format('SELECT idem_checkpoint(%s, %s, %s, %s, %s);', pg_temp.v('key'), pg_temp.v('token'),
                      pg_temp.pick($$'rp'$$, $$NULL::text$$, $$''$$, $$repeat('r', 100000)$$),
                      pg_temp.v('lease'), pg_temp.v('scope'));
    ELSIF r < 35 THEN
        RETURN format('SELECT idem_release(%s, %s, %s);', pg_temp.v('key'), pg_temp.v('token'), pg_temp.v('scope'));
    ELSIF r < 37 THEN
        RETURN format('SELECT idem_mark_unknown(%s, %s, %s, %s);', pg_temp.v('key'), pg_temp.v('token'),
                      pg_temp.v('json'), pg_temp.v('scope'));
    ELSIF r < 39 THEN
        RETURN format('SELECT idem_resolve(%s, %s, %s, %s, %s, %s);', pg_temp.v('key'), pg_temp.v('status'),
                      pg_temp.v('json'), pg_temp.v('int'), pg_temp.v('scope'), pg_temp.v('bool'));
    ELSIF r < 41 THEN
        RETURN format('SELECT count(*) FROM idem_lookup(%s, %s);', pg_temp.v('key'), pg_temp.v('scope'));
    ELSIF r < 42 THEN
        RETURN format('SELECT count(*) FROM idem_await(%s, %s, %s);', pg_temp.v('key'), pg_temp.v('scope'),
                      pg_temp.v('timeout'));
    ELSIF r < 47 THEN
        RETURN format('SELECT idem_inbox_accept(%s, %s, %s, %s);', pg_temp.v('consumer'), pg_temp.v('message'),
                      pg_temp.v('lease'), pg_temp.v('bool'));
    ELSIF r < 51 THEN
        RETURN format('SELECT idem_inbox_accept_seq(%s, %s, %s, accept_gap => %s);', pg_temp.v('consumer'),
                      pg_temp.v('stream'), pg_temp.v('seq'), pg_temp.v('bool'));
    ELSIF r < 53 THEN
        RETURN format('SELECT idem_inbox_accept_seq(%s, %s, %s, %s, %s);', pg_temp.v('consumer'),
                      pg_temp.v('stream'), pg_temp.v('major'), pg_temp.v('minor'), pg_temp.v('bool'));
    ELSIF r < 54 THEN
        RETURN format('SELECT idem_inbox_seq(%s, %s), idem_inbox_watermark(%s, %s);', pg_temp.v('major'),
                      pg_temp.v('minor'), pg_temp.v('consumer'), pg_temp.v('stream'));
    ELSIF r < 56 THEN
        RETURN format('SELECT idem_purge(%s, %s);', pg_temp.v('batch'), pg_temp.v('batch'));
    ELSIF r < 58 THEN
        RETURN format('SELECT idem_define_machine(%s, %s, %s);', pg_temp.v('machine'), pg_temp.v('moves'),
                      pg_temp.v('initial'));
    ELSIF r < 59 THEN
        RETURN format('SELECT idem_drop_machine(%s);', pg_temp.v('machine'));
    ELSIF r < 61 THEN
        RETURN format('SELECT idem_attach_machine(%s, %s, %s, %s, %s);', pg_temp.v('table'), pg_temp.v('column'),
                      pg_temp.v('machine'), pg_temp.v('bool'), pg_temp.v('bool'));
    ELSIF r < 62 THEN
        RETURN format('SELECT idem_detach_machine(%s, %s);', pg_temp.v('table'), pg_temp.v('column'));
    ELSIF r < 63 THEN
        RETURN format('SELECT %s(%s);', pg_temp.pick('idem_machine_dot', 'count(*) FROM idem_machine_moves',
                                                     'count(*) FROM idem_machine_states'),
                      pg_temp.v('machine'));
    ELSIF r < 70 THEN
        RETURN format('SELECT idem_transition(%s, %s, %s, %s, %s);', pg_temp.v('table'), pg_temp.v('rowkey'),
                      pg_temp.v('state'), pg_temp.v('states'), pg_temp.v('column'));
    ELSIF r < 78 THEN
        v := pg_temp.pick('fz_orders', 'fz_part', 'fz_pk2', 'fz_enum', 'fz_two', 'fz_nopk', '"fz weird;""t"');
        RETURN CASE v
            WHEN 'fz_orders' THEN pg_temp.pick(
                format('UPDATE fz_orders SET status = %s WHERE id = %s;', pg_temp.v('rowstate'), (random() * 60)::int),
                format('INSERT INTO fz_orders VALUES (%s, %s) ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status;',
                       (random() * 60)::int, pg_temp.v('rowstate')),
                format('UPDATE fz_orders SET note = %L WHERE id %% 7 = %s;', 'n', (random() * 7)::int),
                format('DELETE FROM fz_orders WHERE id = %s;', (random() * 60)::int + 60))
            WHEN 'fz_part' THEN pg_temp.pick(
                format('UPDATE fz_part SET status = %s, id = id + %s WHERE id = %s;', pg_temp.v('rowstate'),
                       pg_temp.pick('0', '100', '-100'), (random() * 20)::int * 10),
                format('INSERT INTO fz_part VALUES (%s, %s);', (random() * 300)::int, pg_temp.v('rowstate')))
            WHEN 'fz_pk2' THEN
                format('UPDATE fz_pk2 SET status = %s WHERE b = %s;', pg_temp.v('rowstate'), (random() * 20)::int)
            WHEN 'fz_enum' THEN
                format('UPDATE fz_enum SET status = %s WHERE id = %s;',
                       pg_temp.pick($$'new'$$, $$'paid'$$, $$'void'$$, $$'shipped'$$, $$NULL$$),
                       (random() * 20)::int)
            WHEN 'fz_two' THEN
                format('UPDATE fz_two SET a = %s, b = %s WHERE id = %s;', pg_temp.v('rowstate'),
                       pg_temp.v('rowstate'), (random() * 20)::int)
            WHEN 'fz_nopk' THEN
                format('UPDATE fz_nopk SET status = %s;', pg_temp.v('rowstate'))
            ELSE
                format('UPDATE "fz weird;""t" SET "st""ate" = %s WHERE "id ""k" = %s;', pg_temp.v('rowstate'),
                       (random() * 10)::int)
            END;
    ELSIF r < 80 THEN
        -- the records' own machine, idem.record, governs direct writes
        RETURN format('UPDATE idempotency_records SET status = %s WHERE key = %s;', pg_temp.v('status'),
                      pg_temp.v('key'));
    ELSIF r < 86 THEN
        -- a transaction block of a few statements, with a savepoint; one
        -- statement per line (an error aborts the rest of the block)
        RETURN format(E'BEGIN ISOLATION LEVEL %s;\n%s\nSAVEPOINT s;\n%s\n%s\n%s;',
                      pg_temp.v('iso'), pg_temp.statement(super, wide, true),
                      pg_temp.statement(super, wide, true),
                      pg_temp.pick('ROLLBACK TO SAVEPOINT s;', 'RELEASE SAVEPOINT s;', 'SELECT 1;'),
                      pg_temp.pick('COMMIT', 'COMMIT', 'ROLLBACK', E'PREPARE TRANSACTION ''fz'';\nROLLBACK PREPARED ''fz'''));
    ELSIF r < 89 THEN
        RETURN pg_temp.pick(
            format('SET idempotency.default_lease = %L;', pg_temp.pick('1ms', '30s', '0', '1h')),
            format('SET idempotency.retention = %L;', pg_temp.pick('1s', '1d', '0', '-1')),
            format('SET idempotency.scope = %L;', pg_temp.pick('', 't1', 't2', 't1"; --')),
            'RESET idempotency.scope;', 'RESET ALL;',
            CASE WHEN super THEN format('SET idempotency.max_key_length = %s;', pg_temp.pick('1', '10', '255', '1024', '0'))
                 ELSE 'RESET idempotency.default_lease;' END);
    ELSIF r < 90 THEN
        RETURN pg_temp.pick('SELECT count(*) FROM idem_stats();', 'SELECT idem_stats_reset();',
                            'SELECT count(*) FROM idem_stuck;', 'SELECT count(*) FROM idem_summary;',
                            'SELECT count(*) FROM idem_attached_machines;');
    ELSIF r < 91 THEN
        RETURN format('SELECT idem_trigger_arg(%s, %s) IS NULL;', pg_temp.v('tgargs'), pg_temp.v('int'));
    ELSIF r < 92 THEN
        RETURN format('SELECT length(idem_request_fingerprint(%s, %s, %s, %s));',
                      pg_temp.pick($$'GET'$$, $$'post'$$, $$''$$, $$NULL::text$$, $$'GET /'$$,
                                   $$repeat('M', 1000000)$$),
                      pg_temp.v('key'), pg_temp.v('json'),
                      pg_temp.pick($$NULL::text[]$$, $$'{}'::text[]$$, $$'{ok}'::text[]$$, $$'{n.x,f1,ok}'::text[]$$,
                                   $$ARRAY['']$$, $$ARRAY['a..b']$$, $$ARRAY[NULL::text]$$, $$'{{a},{b}}'::text[]$$,
                                   $$ARRAY(SELECT 'f' || i FROM generate_series(1, 1000, 2) i)$$,
                                   $$ARRAY[repeat('a.', 10000) || 'a']$$));
    ELSIF r < 93 THEN
        RETURN format('SELECT length(idem_fingerprint(%s));',
                      pg_temp.pick($$'x'::text$$, $$''::text$$, $$NULL::text$$, $$repeat('x', 1000000)$$,
                                   $$'{"b": 1, "a": [1.0, 2]}'::jsonb$$, $$'\x00'::bytea$$,
                                   pg_temp.v('json')));
    ELSIF r < 95 THEN
        -- the tables under the machines change under their triggers
        IF super THEN
            RETURN pg_temp.pick('ALTER TABLE fz_orders RENAME COLUMN status TO status_x;',
                                'ALTER TABLE fz_orders RENAME COLUMN status_x TO status;',
                                'ALTER TABLE fz_two ALTER COLUMN b TYPE varchar(10);',
                                'ALTER TABLE fz_two ALTER COLUMN b TYPE text;',
                                'SELECT idem_tenant_isolation(true);', 'SELECT idem_tenant_isolation(false);',
                                'SET ROLE fuzz;', 'RESET ROLE;',
                                'DISCARD ALL;', 'VACUUM idempotency_records;', 'ANALYZE fz_orders;');
        END IF;
        RETURN pg_temp.pick('SELECT idem_tenant_isolation(false);', 'DISCARD PLANS;', 'DISCARD ALL;');
    ELSIF r < 96 THEN
        -- prepared statements, executed again after the definitions changed
        RETURN pg_temp.pick(
            'PREPARE c(text) AS SELECT outcome FROM idem_claim($1, ''\x01''::bytea, ''1 hour''::interval);',
            format('EXECUTE c(%s);', pg_temp.v('key')), 'DEALLOCATE ALL;',
            format('PREPARE t(text) AS SELECT idem_transition(''fz_orders'', $1, %s);', pg_temp.v('state')),
            format('EXECUTE t(%s);', pg_temp.v('rowkey')));
    ELSIF r < 97 AND wide AND NOT nested THEN
        -- a wide machine governs fz_plain, and a row is written: the
        -- machine is compiled with nstates^2 move flags
        RETURN format(E'SET statement_timeout = ''60s'';\nSELECT idem_define_machine(%L, (SELECT jsonb_object_agg(''w'' || i, jsonb_build_array(''w'' || (i + 1))) FROM generate_series(1, %s) i));\n'
                      'SELECT idem_attach_machine(''fz_plain'', ''status'', %L, validate => false);\n'
                      'INSERT INTO fz_plain VALUES (1000 + (random() * 100000)::int, ''w1'');\n'
                      'RESET statement_timeout;',
                      'fz_wide', pg_temp.pick('100', '1000', '35000', '46341', '50000'), 'fz_wide');
    ELSE
        RETURN format('SELECT idem_complete(%s, %s);', pg_temp.v('key'), pg_temp.v('token'));
    END IF;
END
$f$;

SELECT setseed(:seed) \g /dev/null
SELECT pg_temp.statement(:'super' = 'on', :'wide' = 'on') FROM generate_series(1, :n);
