-- idem-test: superuser: its other sessions are dblink's, which connects a non-superuser only with a password that the server asks for (the cluster trusts local logins)
-- Security (issue #8), the parts that need another database or other sessions:
--
--   1. the extension in a schema of its own ("idem"), with look-alikes of
--      what it uses planted in public, ahead of pg_catalog and behind it: the
--      lifecycle never calls them;
--   2. the wait => false probes under tenant isolation, against an
--      uncommitted claim and an uncommitted accept of another session:
--      tenant A's probe into tenant B's scope fails with 42501 instead of
--      answering in_progress (or 55P03), which would tell A that B is at
--      work on that key; and a tenant's own wait => false answers at once.
--
-- All of it happens in a database of its own, regress_idem_sec_schema, which
-- the file creates (dropping what an earlier run left) and drops at the end,
-- through dblink sessions.  Roles are regress_idem_sec_s_*; they are created
-- and dropped the same way.  This session's own transaction is rolled back.
BEGIN;
SELECT plan(40);
SET LOCAL statement_timeout = '120s';
CREATE EXTENSION IF NOT EXISTS dblink;
CREATE FUNCTION pg_temp.conninfo(db text) RETURNS text LANGUAGE sql AS $$
    SELECT format('host=%s port=%s dbname=%s user=%s options=%L',
                  COALESCE(NULLIF(split_part(current_setting('unix_socket_directories'), ',', 1), ''), '127.0.0.1'),
                  current_setting('port'), db, current_user,
                  '-c statement_timeout=20s -c lock_timeout=10s')
$$;
-- Run sql (one text column, one row) in a session: its value, or its SQLSTATE.
CREATE FUNCTION pg_temp.remote(conn text, sql text) RETURNS text LANGUAGE sql AS $$
    SELECT r FROM dblink(conn, format('SELECT pg_temp.try(%L)', sql)) AS t(r text)
$$;

SELECT is(dblink_connect('ss_admin', pg_temp.conninfo(current_database())), 'OK', 'a session in this database');
SELECT dblink_exec('ss_admin', 'DROP DATABASE IF EXISTS regress_idem_sec_schema') \g /dev/null
SELECT dblink_exec('ss_admin', 'DROP ROLE IF EXISTS regress_idem_sec_s_a, regress_idem_sec_s_b') \g /dev/null
SELECT dblink_exec('ss_admin', 'CREATE ROLE regress_idem_sec_s_a') \g /dev/null
SELECT dblink_exec('ss_admin', 'CREATE ROLE regress_idem_sec_s_b') \g /dev/null
SELECT is(dblink_exec('ss_admin', 'CREATE DATABASE regress_idem_sec_schema'), 'CREATE DATABASE',
          'a database of its own');
SELECT dblink_connect(conn, pg_temp.conninfo('regress_idem_sec_schema'))
FROM unnest(ARRAY['ss_db', 'ss_a', 'ss_b', 'ss_b2']) AS conn \g /dev/null
SELECT dblink_exec(conn, $r$
    CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $f$
    DECLARE
        result text;
    BEGIN
        EXECUTE sql INTO result;
        RETURN coalesce(result, '');
    EXCEPTION WHEN OTHERS THEN
        RETURN SQLSTATE;
    END
    $f$$r$)
FROM unnest(ARRAY['ss_db', 'ss_a', 'ss_b', 'ss_b2']) AS conn \g /dev/null

-- 1. the extension in schema idem, look-alikes in public --------------------------------------------
SELECT ok(dblink_exec('ss_db', $r$
    CREATE SCHEMA idem;
    CREATE EXTENSION idempotency SCHEMA idem;
    CREATE SCHEMA sec_canary;
    CREATE TABLE sec_canary.log (what text);
    GRANT USAGE ON SCHEMA sec_canary TO PUBLIC;
    GRANT INSERT, SELECT ON sec_canary.log TO PUBLIC;
    CREATE FUNCTION public.log(what text) RETURNS boolean LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp AS $f$
    BEGIN
        INSERT INTO sec_canary.log VALUES (what);
        RETURN true;
    END
    $f$;
    DO $do$
    DECLARE
        o record;
        f text[];
        t text;
        n int := 0;
    BEGIN
        -- operators
        FOR o IN
            SELECT oprname, oprleft::regtype::text AS l, oprright::regtype::text AS r, oprresult::regtype::text AS res
            FROM pg_operator
            WHERE oprnamespace = 'pg_catalog'::regnamespace AND oprkind = 'b'
              AND oprname IN ('=', '<>', '<', '<=', '>', '>=', '+', '-', '||', '~~', '!~~', '->>', '->', '#>>')
              AND oprleft::regtype::text IN ('text', 'bytea', 'bigint', 'integer', 'timestamp with time zone', 'jsonb',
                                             'name', 'oid', 'boolean', 'tid', 'anyenum', 'anyarray', 'interval', 'xid8')
              AND oprright::regtype::text IN ('text', 'bytea', 'bigint', 'integer', 'timestamp with time zone', 'jsonb',
                                              'name', 'oid', 'boolean', 'tid', 'anyenum', 'anyarray', 'interval', 'xid8',
                                              'text[]')
            UNION ALL
            SELECT op, 'idem.idem_status', 'idem.idem_status', 'boolean' FROM unnest('{=,<>,<,<=,>,>=}'::text[]) op
        LOOP
            n := n + 1;
            EXECUTE format('CREATE FUNCTION public.op_%s(a %s, b %s) RETURNS %s LANGUAGE plpgsql '
                           'SET search_path = pg_catalog, pg_temp AS $b$ BEGIN PERFORM public.log(%L); '
                           'RETURN a OPERATOR(pg_catalog.%s) b; END $b$',
                           n, o.l, o.r, o.res, format('operator %s(%s, %s)', o.oprname, o.l, o.r), o.oprname);
            EXECUTE format('CREATE OPERATOR public.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = public.op_%s)',
                           o.oprname, o.l, o.r, n);
        END LOOP;
        -- functions, the extension's own names among them
        FOREACH f SLICE 1 IN ARRAY ARRAY[
            ['now()', 'timestamptz', 'RETURN pg_catalog.now()'],
            ['clock_timestamp()', 'timestamptz', 'RETURN pg_catalog.clock_timestamp()'],
            ['current_setting(a text)', 'text', 'RETURN pg_catalog.current_setting(a)'],
            ['current_setting(a text, b boolean)', 'text', 'RETURN pg_catalog.current_setting(a, b)'],
            ['nextval(a regclass)', 'bigint', 'RETURN pg_catalog.nextval(a)'],
            ['starts_with(a text, b text)', 'boolean', 'RETURN pg_catalog.starts_with(a, b)'],
            ['format(a text, b text)', 'text', 'RETURN pg_catalog.format(a, b)'],
            ['format(a text, b text, c text)', 'text', 'RETURN pg_catalog.format(a, b, c)'],
            ['to_jsonb(a anyelement)', 'jsonb', 'RETURN pg_catalog.to_jsonb(a)'],
            ['jsonb_typeof(a jsonb)', 'text', 'RETURN pg_catalog.jsonb_typeof(a)'],
            ['octet_length(a text)', 'integer', 'RETURN pg_catalog.octet_length(a)'],
            ['md5(a text)', 'text', 'RETURN pg_catalog.md5(a)'],
            ['replace(a text, b text, c text)', 'text', 'RETURN pg_catalog.replace(a, b, c)'],
            ['pg_current_xact_id()', 'xid8', 'RETURN pg_catalog.pg_current_xact_id()'],
            ['idem_object_name(a text, b text, c text)', 'name', 'RETURN a || b || c'],
            ['idem_trigger_arg(a bytea, b integer)', 'text', 'RETURN NULL'],
            ['idem_inbox_seq(a bigint, b integer)', 'bigint', 'RETURN a * 1048576 + b'],
            ['idem_consumer_in_scope(a text)', 'boolean', 'RETURN true'],
            ['idem_inbox_accept_seq(a text, b text, c bigint, d boolean)', 'text', 'RETURN ''new''']]
        LOOP
            EXECUTE format('CREATE FUNCTION public.%s RETURNS %s LANGUAGE plpgsql '
                           'SET search_path = pg_catalog, pg_temp AS $b$ BEGIN PERFORM public.log(%L); %s; END $b$',
                           f[1], f[2], 'function ' || f[1], f[3]);
        END LOOP;
        -- the extension's tables and views, as logging views
        FOREACH t IN ARRAY ARRAY['idempotency_records', 'idem_inbox', 'idem_inbox_streams', 'idem_machines',
                                 'idem_machine_moves', 'idem_attached_machines', 'idem_stuck', 'idem_summary']
        LOOP
            EXECUTE format('CREATE VIEW public.%I AS SELECT * FROM idem.%I WHERE public.log(%L)',
                           t, t, 'relation ' || t);
            EXECUTE format('GRANT ALL ON public.%I TO PUBLIC', t);
        END LOOP;
    END
    $do$;
    CREATE FUNCTION public.jsonb_each(a jsonb) RETURNS TABLE (key text, value jsonb) LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp AS $f$
    BEGIN PERFORM public.log('function jsonb_each'); RETURN QUERY SELECT * FROM pg_catalog.jsonb_each(a); END $f$;
    CREATE FUNCTION public.unnest(a anyarray) RETURNS SETOF anyelement LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp AS $f$
    BEGIN PERFORM public.log('function unnest'); RETURN QUERY SELECT * FROM pg_catalog.unnest(a); END $f$;
    CREATE FUNCTION public.count_step(s bigint) RETURNS bigint LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp AS $f$
    BEGIN PERFORM public.log('aggregate count(*)'); RETURN s + 1; END $f$;
    CREATE AGGREGATE public.count(*) (SFUNC = public.count_step, STYPE = bigint, INITCOND = '0');
    CREATE FUNCTION public.string_agg_step(s text, v text, d text) RETURNS text LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp AS $f$
    BEGIN PERFORM public.log('aggregate string_agg'); RETURN CASE WHEN s IS NULL THEN v ELSE s || d || v END; END $f$;
    CREATE AGGREGATE public.string_agg(text, text) (SFUNC = public.string_agg_step, STYPE = text);
    CREATE FUNCTION public.array_agg_step(s text[], v text) RETURNS text[] LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp AS $f$
    BEGIN PERFORM public.log('aggregate array_agg'); RETURN array_append(s, v); END $f$;
    CREATE AGGREGATE public.array_agg(text) (SFUNC = public.array_agg_step, STYPE = text[]);
    CREATE DOMAIN public.text AS pg_catalog.text CHECK (public.log('type text'));
    CREATE DOMAIN public.jsonb AS pg_catalog.jsonb CHECK (public.log('type jsonb'));
    CREATE DOMAIN public.name AS pg_catalog.name CHECK (public.log('type name'));
    CREATE TYPE public.idem_status AS ENUM ('processing', 'succeeded', 'failed', 'unknown');
    CREATE SEQUENCE public.idem_token_epoch;
    CREATE TABLE public.orders (id pg_catalog.int4 PRIMARY KEY, st pg_catalog.text);
    CREATE TABLE public.pairs (a pg_catalog.text, b pg_catalog.int4, st pg_catalog.text, PRIMARY KEY (a, b));
    DELETE FROM sec_canary.log;     -- this script's own calls of format()
    $r$) LIKE 'DELETE %', 'the extension in schema idem; look-alikes planted in public');

-- premise: the look-alikes are found by unqualified names on these paths
SELECT is(pg_temp.remote('ss_db', $$SELECT pg_catalog.set_config('search_path', 'public, pg_catalog, idem', false)$$),
          'public, pg_catalog, idem', 'search_path = public, pg_catalog, idem');
SELECT is(pg_temp.remote('ss_db', $$SELECT (count(*) OPERATOR(pg_catalog.+) 0)::pg_catalog.text FROM idem_machines$$), '1',
          'premise: idem_machines and count(*) unqualified are the planted ones ...');
SELECT is(pg_temp.remote('ss_db', $$SELECT ('a'::pg_catalog.text = 'a'::pg_catalog.text)::pg_catalog.text$$), 'true',
          '... and so is = on text');
SELECT is(pg_temp.remote('ss_db', $$SELECT pg_catalog.set_config('search_path', 'public, idem', false)$$),
          'public, idem', 'search_path = public, idem');
SELECT is(pg_temp.remote('ss_db', $$SELECT ('processing'::idem.idem_status = 'failed'::idem.idem_status)::pg_catalog.text$$),
          'false', '... where pg_catalog comes first, = on idem_status is still the planted one');
SELECT set_eq($$SELECT what FROM dblink('ss_db', 'SELECT DISTINCT what FROM sec_canary.log') AS t(what text)$$,
              $$VALUES ('relation idem_machines'), ('aggregate count(*)'), ('operator =(text, text)'),
                       ('operator =(idem.idem_status, idem.idem_status)')$$,
              'premise: all three were called');
SELECT dblink_exec('ss_db', 'DELETE FROM sec_canary.log') \g /dev/null

-- the lifecycle, every name in it qualified
SELECT is(dblink_exec('ss_db', $r$
    CREATE TEMP TABLE out (n serial, pass pg_catalog.text, label pg_catalog.text, v pg_catalog.text);
    CREATE FUNCTION pg_temp.out(pass pg_catalog.text, label pg_catalog.text, v pg_catalog.text) RETURNS void
    LANGUAGE sql AS $f$ INSERT INTO pg_temp.out (pass, label, v) VALUES (pass, label, v) $f$;
    CREATE FUNCTION pg_temp.lifecycle(p pg_catalog.text) RETURNS void LANGUAGE plpgsql AS $f$
    DECLARE
        tok pg_catalog.int8;
        v pg_catalog.text;
        k pg_catalog.text;
    BEGIN
        k := pg_catalog.concat(p, '.k1');
        SELECT c.token, c.outcome INTO tok, v FROM idem.idem_claim(k, '\x01', '1 hour') c;
        PERFORM pg_temp.out(p, 'claim', v);
        PERFORM idem.idem_checkpoint(k, tok, 'step', '1 hour');
        PERFORM idem.idem_complete(k, tok, '{"ok": 1}', 201);
        SELECT c.outcome INTO v FROM idem.idem_claim(k, '\x01') c;
        PERFORM pg_temp.out(p, 'claim again', v);
        k := pg_catalog.concat(p, '.k2');
        SELECT c.token INTO tok FROM idem.idem_claim(k, '\x01') c;
        PERFORM idem.idem_release(k, tok);
        SELECT c.outcome INTO v FROM idem.idem_claim(k, '\x02', wait => false) c;
        PERFORM pg_temp.out(p, 'claim after release', v);
        k := pg_catalog.concat(p, '.k3');
        SELECT c.token INTO tok FROM idem.idem_claim(k, '\x01') c;
        PERFORM idem.idem_fail(k, tok, '{"e": 1}');
        SELECT c.outcome INTO v FROM idem.idem_claim(k, '\x01') c;
        PERFORM pg_temp.out(p, 'claim after a retryable failure', v);
        k := pg_catalog.concat(p, '.k4');
        SELECT c.token INTO tok FROM idem.idem_claim(k, '\x01') c;
        PERFORM idem.idem_mark_unknown(k, tok, '{"t": 1}');
        SELECT s.reason INTO v FROM idem.idem_stuck s WHERE s.key OPERATOR(pg_catalog.=) k;
        PERFORM pg_temp.out(p, 'idem_stuck', v);
        PERFORM idem.idem_resolve(k, 'failed', '{"r": 1}');
        SELECT l.status::pg_catalog.text INTO v FROM idem.idem_lookup(k) l;
        PERFORM pg_temp.out(p, 'lookup after resolve', v);
        SELECT a.status::pg_catalog.text INTO v FROM idem.idem_await(pg_catalog.concat(p, '.k1'), '', '0') a;
        PERFORM pg_temp.out(p, 'await', v);
        SELECT pg_catalog.sum(s.records)::pg_catalog.text INTO v FROM idem.idem_summary s;
        PERFORM pg_temp.out(p, 'idem_summary', (v IS NOT NULL)::pg_catalog.text);
        k := pg_catalog.concat(p, '.k5');
        SELECT c.token INTO tok FROM idem.idem_claim(k, '\x01') c;
        PERFORM idem.idem_complete(k, tok);
        UPDATE idem.idempotency_records SET expires_at = pg_catalog.now() OPERATOR(pg_catalog.-) '1 day'::pg_catalog.interval,
               purge_after = pg_catalog.now() OPERATOR(pg_catalog.-) '1 day'::pg_catalog.interval
        WHERE key OPERATOR(pg_catalog.=) k;
        PERFORM pg_temp.out(p, 'purge', idem.idem_purge()::pg_catalog.text);
        k := pg_catalog.concat('c.', p);
        PERFORM pg_temp.out(p, 'accept', idem.idem_inbox_accept(k, 'm1', wait => false)::pg_catalog.text);
        PERFORM pg_temp.out(p, 'accept again', idem.idem_inbox_accept(k, 'm1')::pg_catalog.text);
        PERFORM pg_temp.out(p, 'accept_seq', idem.idem_inbox_accept_seq(k, 's', 4));
        PERFORM pg_temp.out(p, 'accept_seq (major, minor)', idem.idem_inbox_accept_seq(k, 'b', 7, 3));
        PERFORM pg_temp.out(p, 'watermark', idem.idem_inbox_watermark(k, 's')::pg_catalog.text);
        PERFORM pg_temp.out(p, 'accept_many', (SELECT pg_catalog.string_agg(i, ',')
            FROM idem.idem_inbox_accept_many(k, ARRAY['m2', 'm1', 'm3', 'm2'], wait => false) i));
        PERFORM pg_temp.out(p, 'accept_seq_many', (SELECT pg_catalog.string_agg(a.outcome, ',')
            FROM idem.idem_inbox_accept_seq_many(k, 's', ARRAY[4, 5, 7]::pg_catalog.int8[]) a));
        k := pg_catalog.concat('m.', p);
        PERFORM idem.idem_define_machine(k, '{"new": ["paid"], "paid": ["done"]}', '{new}');
        PERFORM pg_temp.out(p, 'dot', (pg_catalog.length(idem.idem_machine_dot(k)) OPERATOR(pg_catalog.>) 0)::pg_catalog.text);
        PERFORM idem.idem_attach_machine('public.orders', 'st', k, log => true);
        PERFORM idem.idem_attach_machine('public.pairs', 'st', k);
        INSERT INTO public.orders VALUES (1, 'new');
        INSERT INTO public.pairs VALUES ('x', 1, 'new');
        PERFORM pg_temp.out(p, 'transition', idem.idem_transition('public.orders', '1', 'paid'));
        PERFORM pg_temp.out(p, 'transition again', idem.idem_transition('public.orders', '1', 'paid'));
        PERFORM pg_temp.out(p, 'transition by two columns', idem.idem_transition('public.pairs', ARRAY['x', '1'], 'paid'));
        PERFORM pg_temp.out(p, 'refused update', pg_temp.try('UPDATE public.orders SET st = ''new'' RETURNING ''ok'''));
        SELECT pg_catalog.count(*)::pg_catalog.text INTO v FROM public.orders_state_log;
        PERFORM pg_temp.out(p, 'logged', v);
        PERFORM idem.idem_detach_machine('public.orders', 'st');
        PERFORM idem.idem_detach_machine('public.pairs', 'st');
        PERFORM idem.idem_drop_machine(k);
        DELETE FROM public.orders;
        DELETE FROM public.pairs;
        DROP TABLE public.orders_state_log;
        PERFORM idem.idem_grant('client', 'regress_idem_sec_s_a');
        PERFORM idem.idem_revoke_all('regress_idem_sec_s_a');
        PERFORM idem.idem_tenant_isolation(true);
        PERFORM pg_catalog.set_config('idempotency.scope', 'A', true);
        SELECT c.outcome INTO v FROM idem.idem_claim(pg_catalog.concat(p, '.t'), '\x01', scope => 'A') c;
        PERFORM pg_temp.out(p, 'claim under tenant isolation', v);
        PERFORM pg_temp.out(p, 'accept under tenant isolation', idem.idem_inbox_accept('A/q', p)::pg_catalog.text);
        PERFORM pg_temp.out(p, 'accept_many under tenant isolation', (SELECT pg_catalog.count(*)::pg_catalog.text
            FROM idem.idem_inbox_accept_many('A/q', ARRAY[p, pg_catalog.concat(p, '.x')]) i));
        PERFORM idem.idem_tenant_isolation(false);
    END
    $f$;
    $r$), 'CREATE FUNCTION', 'the lifecycle');
SELECT is(pg_temp.remote('ss_db', $$SELECT pg_catalog.set_config('search_path', 'public, pg_catalog, idem', false)$$),
          'public, pg_catalog, idem', 'pass 1: public ahead of pg_catalog');
SELECT is(pg_temp.remote('ss_db', $$SELECT pg_temp.lifecycle('p1')::pg_catalog.text$$), '', 'the lifecycle ran');
SELECT is(pg_temp.remote('ss_db', $$SELECT pg_catalog.set_config('search_path', 'public, idem', false)$$),
          'public, idem', 'pass 2: public behind pg_catalog, ahead of the extension''s schema');
SELECT is(pg_temp.remote('ss_db', $$SELECT pg_temp.lifecycle('p2')::pg_catalog.text$$), '', 'the lifecycle ran');
SELECT is(pg_temp.remote('ss_db', $$SELECT pg_catalog.set_config('search_path', 'idem', false)$$), 'idem',
          'back to a clean search_path');
SELECT is_empty($$SELECT what FROM dblink('ss_db', 'SELECT what FROM sec_canary.log') AS t(what text)$$,
                'the extension called none of the objects planted in public');
SELECT results_eq($$SELECT pass, label, v FROM dblink('ss_db', 'SELECT pass, label, v FROM out ORDER BY n')
                    AS t(pass text, label text, v text) WHERE pass = 'p1'$$,
    $$VALUES ('p1', 'claim', 'new'), ('p1', 'claim again', 'replay'), ('p1', 'claim after release', 'new'),
             ('p1', 'claim after a retryable failure', 'takeover'), ('p1', 'idem_stuck', 'unknown outcome'),
             ('p1', 'lookup after resolve', 'failed'), ('p1', 'await', 'succeeded'), ('p1', 'idem_summary', 'true'),
             ('p1', 'purge', '1'), ('p1', 'accept', 'true'), ('p1', 'accept again', 'false'), ('p1', 'accept_seq', 'new'),
             ('p1', 'accept_seq (major, minor)', 'new'), ('p1', 'watermark', '4'),
             ('p1', 'accept_many', 'm2,m3'), ('p1', 'accept_seq_many', 'duplicate,new,gap'), ('p1', 'dot', 'true'),
             ('p1', 'transition', 'applied'), ('p1', 'transition again', 'already'),
             ('p1', 'transition by two columns', 'applied'), ('p1', 'refused update', 'IK005'), ('p1', 'logged', '2'),
             ('p1', 'claim under tenant isolation', 'new'), ('p1', 'accept under tenant isolation', 'true'),
             ('p1', 'accept_many under tenant isolation', '1')$$,
    'and every result was right');
SELECT results_eq($$SELECT label, v FROM dblink('ss_db', 'SELECT label, v FROM out WHERE pass = ''p2'' ORDER BY n')
                    AS t(label text, v text)$$,
                  $$SELECT label, v FROM dblink('ss_db', 'SELECT label, v FROM out WHERE pass = ''p1'' ORDER BY n')
                    AS t(label text, v text)$$,
                  'in both passes');

-- 2. the wait => false probes under tenant isolation ------------------------------------------------
SELECT is(dblink_exec('ss_db', $r$
    DO $do$
    BEGIN
        PERFORM idem.idem_tenant_isolation();
        PERFORM idem.idem_grant(k, r) FROM unnest('{client,consumer}'::text[]) k,
            unnest('{regress_idem_sec_s_a,regress_idem_sec_s_b}'::regrole[]) r;
    END
    $do$
    $r$), 'DO', 'tenant isolation on (committed, in this database only); tenants A and B');
SELECT dblink_exec('ss_a', 'SET ROLE regress_idem_sec_s_a') \g /dev/null
SELECT dblink_exec('ss_a', 'SET idempotency.scope = ''A''') \g /dev/null
SELECT dblink_exec(conn, 'SET ROLE regress_idem_sec_s_b') FROM unnest(ARRAY['ss_b', 'ss_b2']) conn \g /dev/null
SELECT dblink_exec(conn, 'SET idempotency.scope = ''B''') FROM unnest(ARRAY['ss_b', 'ss_b2']) conn \g /dev/null
-- B, in an open transaction, claims a key and accepts a message
SELECT dblink_exec('ss_b', 'BEGIN') \g /dev/null
SELECT is(pg_temp.remote('ss_b', $$SELECT outcome FROM idem.idem_claim('sec.busy', '\x0b', '1 hour', scope => 'B')$$),
          'new', 'B claims sec.busy in an open transaction');
SELECT is(pg_temp.remote('ss_b', $$SELECT idem.idem_inbox_accept('B/q', 'busy')::text$$), 'true',
          'and accepts message "busy" as "B/q"');
-- premise: a role that row-level security does not bind learns that B is at work
SELECT is(pg_temp.remote('ss_db', $$SELECT outcome FROM idem.idem_claim('sec.busy', '\x0b', scope => 'B', wait => false)$$),
          'in_progress', 'premise: the probe of a superuser (not bound) answers in_progress');
SELECT is(pg_temp.remote('ss_db', $$SELECT idem.idem_inbox_accept('B/q', 'busy', wait => false)::text$$), '55P03',
          'premise: and its accept fails with 55P03');
-- tenant A learns nothing of it
SELECT is(pg_temp.remote('ss_a', $$SELECT outcome FROM idem.idem_claim('sec.busy', '\x0b', scope => 'B', wait => false)$$),
          '42501', 'A''s wait => false claim of B''s busy key fails with 42501, it does not answer in_progress');
SELECT is(pg_temp.remote('ss_a', $$SELECT idem.idem_inbox_accept('B/q', 'busy', wait => false)::text$$), '42501',
          'A''s wait => false accept as B''s consumer fails with 42501, not 55P03');
SELECT is(pg_temp.remote('ss_a', $$SELECT outcome FROM idem.idem_claim('sec.busy', '\x0a', scope => 'A', wait => false)$$),
          'new', 'A claims the same key in its own scope');
-- B's own wait => false probes its own key under row-level security: it answers at once
-- (with lock_timeout set, a wait would end in 55P03 for the claim)
SELECT is(pg_temp.remote('ss_b2', $$SELECT set_config('lock_timeout', '200ms', false)$$), '200ms',
          'a second session of B, with lock_timeout');
SELECT is(pg_temp.remote('ss_b2', $$SELECT outcome FROM idem.idem_claim('sec.busy', '\x0b', scope => 'B', wait => false)$$),
          'in_progress', 'under tenant isolation a wait => false claim of the own tenant''s busy key answers in_progress at once');
SELECT is(pg_temp.remote('ss_b2', $$SELECT idem.idem_inbox_accept('B/q', 'busy', wait => false)::text$$), '55P03',
          'and a wait => false accept fails at once with 55P03 (held by another transaction)');
SELECT dblink_exec('ss_b', 'COMMIT') \g /dev/null
SELECT is(pg_temp.remote('ss_b2', $$SELECT outcome FROM idem.idem_claim('sec.busy', '\x0b', scope => 'B', wait => false)$$),
          'in_progress', 'once B committed, its second session sees the claim: in_progress');
SELECT is(pg_temp.remote('ss_a', $$SELECT count(*)::text FROM idem.idem_lookup('sec.busy', 'B')$$), '0',
          'and A still sees nothing of it');

-- 3. a schema name with a quote is never pasted into a string literal: the
-- purge (which advances the token epoch by the sequence's OID) still works
SELECT is(pg_temp.remote('ss_db', $$SELECT setval('idem.idem_token_epoch', 1, false)::text$$), '1',
          'the epoch starts over');
SELECT is(dblink_exec('ss_db', $$ALTER SCHEMA idem RENAME TO "idem'); DROP TABLE sec_canary.log; --"$$),
          'ALTER SCHEMA', 'the extension''s schema renamed to a name with a quote and SQL in it');
-- The SQL edition's bodies name the schema they were created in (@extschema@,
-- substituted by CREATE EXTENSION): after a rename they fail (42P01), and no
-- name is pasted into a string there either (PostgreSQL refuses to
-- substitute a schema name with a quote).  So it cannot work on after the
-- rename; the canary below still must live.
SELECT NOT EXISTS (SELECT FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
                   WHERE p.proname = 'idem_claim' AND l.lanname = 'c'
                     AND p.pronamespace = (SELECT extnamespace FROM pg_extension WHERE extname = 'idempotency'))
       AS sql_edition \gset
\if :sql_edition
SELECT skip('the SQL edition''s bodies hold the schema''s name (@extschema@): renaming the schema breaks them, '
            'where the C edition looks its objects up by OID', 4);
\else
SELECT is(pg_temp.remote('ss_db', $$SELECT count(*)::text FROM "idem'); DROP TABLE sec_canary.log; --".idem_claim('sec.q', '\x01', retention => '1 ms')$$),
          '1', 'a claim under the new schema name');
SELECT is(pg_temp.remote('ss_db', $$SELECT "idem'); DROP TABLE sec_canary.log; --".idem_complete('sec.q', 1)::text$$),
          '', 'its completion');
SELECT is(pg_temp.remote('ss_db', $$SELECT (pg_sleep(0.01) IS NOT NULL AND "idem'); DROP TABLE sec_canary.log; --".idem_purge() >= 1)::text$$),
          'true', 'purge deletes the expired record and advances the epoch');
SELECT is(pg_temp.remote('ss_db', $$SELECT is_called::text FROM "idem'); DROP TABLE sec_canary.log; --".idem_token_epoch$$),
          'true', 'the epoch moved');
\endif
SELECT is(pg_temp.remote('ss_db', $$SELECT to_regclass('sec_canary.log') IS NOT NULL$$), 'true',
          'and nothing of the schema name was executed');

-- clean up: the database and the roles
SELECT dblink_disconnect(conn) FROM unnest(ARRAY['ss_db', 'ss_a', 'ss_b', 'ss_b2']) AS conn \g /dev/null
SELECT is(dblink_exec('ss_admin', 'DROP DATABASE regress_idem_sec_schema'), 'DROP DATABASE', 'the database is dropped');
SELECT is(dblink_exec('ss_admin', 'DROP ROLE regress_idem_sec_s_a, regress_idem_sec_s_b'), 'DROP ROLE',
          'and the roles');
SELECT dblink_disconnect('ss_admin') \g /dev/null

SELECT * FROM finish();
ROLLBACK;
