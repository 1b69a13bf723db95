-- The claim's and the inbox's inserts without SPI (src/direct_write.c) behave
-- as the INSERT ... ON CONFLICT DO NOTHING they replace: the records' state
-- machine trigger and user row triggers fire (BEFORE at once, AFTER at the
-- end of the call, deferred ones at SET CONSTRAINTS / commit), statement
-- triggers still fire (those callers keep the SPI statement), CHECK
-- constraints and column defaults apply, a caller without INSERT or SELECT
-- gets 42501, a read-only transaction 25006, and idempotency.direct_writes =
-- off (the SPI statements) stores the same rows.  Keys are prefixed "dw.";
-- everything is rolled back.
BEGIN;
SELECT plan(33);

-- The SQL edition writes everything through SQL (README, "What needs the C
-- library": idempotency.direct_writes has no effect): which path ran is
-- skipped there; what the writes do (the rest of the file) is the same.
SELECT NOT EXISTS (SELECT FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
                   WHERE p.proname = 'idem_claim' AND l.lanname = 'c'
                     AND p.pronamespace = (SELECT extnamespace FROM pg_extension WHERE extname = 'idempotency'))
       AS sql_edition \gset
\if :sql_edition
SELECT skip('the SQL edition has no writes without SPI: every write is SQL (idempotency.direct_writes has no effect)', 3);
\else
-- which path ran: the statements' saved plans (CachedPlanSource) exist only
-- once the SPI path prepared them; each pgTAP file has a backend of its own
CREATE FUNCTION pg_temp.dw_plans(prefix text) RETURNS bigint LANGUAGE sql AS $$
    SELECT count(*) FROM pg_backend_memory_contexts
    WHERE name = 'CachedPlanSource' AND ident LIKE prefix || '%'
$$;
SELECT idem_complete('dw.path', (SELECT token FROM idem_claim('dw.path', '\x01')), '{}');
SELECT idem_inbox_accept('dw.consumer', 'dw.path');
SELECT is(pg_temp.dw_plans('INSERT INTO %.idempotency_records')
          + pg_temp.dw_plans('UPDATE %.idempotency_records SET status = ''succeeded''')
          + pg_temp.dw_plans('INSERT INTO %.idem_inbox'),
          0::bigint, 'a new key''s claim, its completion and an accept prepare no statement: they wrote directly');
SET LOCAL idempotency.direct_writes = off;
SELECT idem_complete('dw.path.spi', (SELECT token FROM idem_claim('dw.path.spi', '\x01')), '{}');
SELECT idem_inbox_accept('dw.consumer', 'dw.path.spi');
SELECT is(pg_temp.dw_plans('INSERT INTO %.idempotency_records (scope, key, fingerprint, token,'), 1::bigint,
          'with idempotency.direct_writes off the claim prepares its INSERT');
SELECT is(pg_temp.dw_plans('UPDATE %.idempotency_records SET status = ''succeeded''')
          + pg_temp.dw_plans('INSERT INTO %.idem_inbox'),
          2::bigint, '... the completion its UPDATE and the accept its INSERT');
RESET idempotency.direct_writes;
\endif

CREATE TABLE pg_temp.dw_log (what text, key text);
CREATE FUNCTION pg_temp.dw_log_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pg_temp.dw_log VALUES (TG_WHEN || ' ' || TG_LEVEL || ' ' || TG_TABLE_NAME,
                                       CASE WHEN TG_LEVEL = 'ROW'
                                            THEN coalesce(to_jsonb(NEW)->>'key', to_jsonb(NEW)->>'message_id')
                                       END);
    IF TG_WHEN = 'BEFORE' AND TG_LEVEL = 'ROW' AND TG_TABLE_NAME = 'idempotency_records' THEN
        IF NEW.key = 'dw.refused' THEN
            RAISE EXCEPTION 'refused by a user trigger' USING ERRCODE = 'P0001';
        END IF;
        NEW.recovery_point := coalesce(NEW.recovery_point, 'set by trigger');
        RETURN NEW;
    END IF;
    RETURN NULL;
END $$;

-- row triggers --------------------------------------------------------------------------------------------
CREATE TRIGGER dw_before BEFORE INSERT ON idempotency_records
    FOR EACH ROW EXECUTE FUNCTION pg_temp.dw_log_row();
CREATE TRIGGER dw_after AFTER INSERT ON idempotency_records
    FOR EACH ROW EXECUTE FUNCTION pg_temp.dw_log_row();
CREATE CONSTRAINT TRIGGER dw_deferred AFTER INSERT ON idempotency_records
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION pg_temp.dw_log_row();

SELECT is((SELECT outcome FROM idem_claim('dw.a', '\x01', '1 minute')), 'new', 'a new key is claimed');
SELECT is((SELECT array_agg(what ORDER BY what) FROM pg_temp.dw_log WHERE key = 'dw.a'),
          ARRAY['AFTER ROW idempotency_records', 'BEFORE ROW idempotency_records'],
          'BEFORE and AFTER row triggers fired within the call; the deferred one waits');
SELECT is((SELECT recovery_point FROM idem_lookup('dw.a')), 'set by trigger',
          'the row stored is the one the BEFORE trigger returned');
SET CONSTRAINTS dw_deferred IMMEDIATE;
SELECT is((SELECT count(*) FROM pg_temp.dw_log WHERE key = 'dw.a'), 3::bigint,
          'the deferred constraint trigger was queued and fires at SET CONSTRAINTS');
SET CONSTRAINTS dw_deferred DEFERRED;
SELECT throws_ok($$SELECT idem_claim('dw.refused', '\x01', '1 minute')$$, 'P0001',
                 'refused by a user trigger', 'an error of a BEFORE trigger aborts the claim');
SELECT is((SELECT count(*) FROM idempotency_records WHERE key = 'dw.refused'), 0::bigint,
          'and nothing is written');
SELECT is((SELECT outcome FROM idem_claim('dw.a', '\x01', '1 minute')), 'in_progress',
          'a second claim of the key finds it (the conflict is not inserted twice)');
SELECT is((SELECT count(*) FROM pg_temp.dw_log WHERE key = 'dw.a'), 3::bigint,
          'and fires no trigger: it read the record and wrote nothing');
SELECT lives_ok($$SELECT idem_complete('dw.a', (SELECT token FROM idempotency_records WHERE key = 'dw.a'), '{}')$$,
                'the record completes');

-- the records' state machine trigger still fires: with processing no initial state, a claim is refused
SAVEPOINT machine;
UPDATE idem_machines SET initial_states = '{succeeded}' WHERE name = 'idem.record';
SELECT throws_ok($$SELECT idem_claim('dw.m', '\x01', '1 minute')$$, 'IK005', NULL,
                 'the state machine trigger checks the new record');
ROLLBACK TO SAVEPOINT machine;
DROP TRIGGER dw_before ON idempotency_records;
DROP TRIGGER dw_after ON idempotency_records;
DROP TRIGGER dw_deferred ON idempotency_records;

-- statement triggers: the SPI statement fires them ----------------------------------------------------
CREATE TRIGGER dw_statement AFTER INSERT ON idempotency_records
    FOR EACH STATEMENT EXECUTE FUNCTION pg_temp.dw_log_row();
SELECT is((SELECT outcome FROM idem_claim('dw.s', '\x01', '1 minute')), 'new', 'a claim with a statement trigger');
SELECT is((SELECT count(*) FROM pg_temp.dw_log WHERE what = 'AFTER STATEMENT idempotency_records'), 1::bigint,
          'the statement trigger fired once');
DROP TRIGGER dw_statement ON idempotency_records;

-- defaults and constraints ------------------------------------------------------------------------------
ALTER TABLE idempotency_records ALTER COLUMN recovery_point SET DEFAULT 'default point';
SELECT is((SELECT outcome FROM idem_claim('dw.d', '\x01', '1 minute')), 'new', 'a claim with a column DEFAULT');
SELECT is((SELECT recovery_point FROM idempotency_records WHERE key = 'dw.d'), 'default point',
          'a column the claim does not set gets its DEFAULT');
ALTER TABLE idempotency_records ALTER COLUMN recovery_point DROP DEFAULT;
ALTER TABLE idempotency_records ADD CONSTRAINT dw_check CHECK (key <> 'dw.forbidden') NOT VALID;
SELECT throws_ok($$SELECT idem_claim('dw.forbidden', '\x01', '1 minute')$$, '23514', NULL,
                 'a CHECK constraint is checked');
ALTER TABLE idempotency_records DROP CONSTRAINT dw_check;

-- privileges and read-only transactions ---------------------------------------------------------------
CREATE ROLE regress_idem_dw_reader;
GRANT USAGE ON SCHEMA public TO regress_idem_dw_reader;
GRANT SELECT ON idempotency_records, idem_inbox TO regress_idem_dw_reader;
SET LOCAL ROLE regress_idem_dw_reader;
SELECT throws_ok($$SELECT idem_claim('dw.p', '\x01', '1 minute')$$, '42501', NULL,
                 'SELECT without INSERT: the claim of a new key gets 42501');
SELECT throws_ok($$SELECT idem_inbox_accept('dw.consumer', 'dw.p')$$, '42501', NULL,
                 'and so does an inbox accept');
RESET ROLE;
SAVEPOINT read_only;
SET LOCAL transaction_read_only = on;
SELECT throws_ok($$SELECT idem_claim('dw.ro', '\x01', '1 minute')$$, '25006', NULL,
                 'a read-only transaction cannot claim a new key');
ROLLBACK TO SAVEPOINT read_only;

-- with idempotency.direct_writes off the SPI statements write the same rows -----------------------------
SELECT lives_ok($$SELECT idem_complete('dw.on', (SELECT token FROM idem_claim('dw.on', '\x02', '1 minute')), '{"a": 1}', 201)$$,
                'a claim and completion with the direct writes');
SET LOCAL idempotency.direct_writes = off;
SELECT lives_ok($$SELECT idem_complete('dw.off', (SELECT token FROM idem_claim('dw.off', '\x02', '1 minute')), '{"a": 1}', 201)$$,
                'the same through SPI');
RESET idempotency.direct_writes;
SELECT is((SELECT to_jsonb(r) - '{key,created_at,updated_at,completed_at,lease_expires_at,expires_at,purge_after}'::text[]
           FROM idempotency_records r WHERE key = 'dw.on'),
          (SELECT to_jsonb(r) - '{key,created_at,updated_at,completed_at,lease_expires_at,expires_at,purge_after}'::text[]
           FROM idempotency_records r WHERE key = 'dw.off'),
          'both rows are the same but for the key and the times');
SELECT is((SELECT expires_at - completed_at FROM idempotency_records WHERE key = 'dw.on'),
          (SELECT expires_at - completed_at FROM idempotency_records WHERE key = 'dw.off'),
          'and both keep the retention from completion');

-- the inbox --------------------------------------------------------------------------------------------
CREATE TRIGGER dw_inbox AFTER INSERT ON idem_inbox
    FOR EACH ROW EXECUTE FUNCTION pg_temp.dw_log_row();
SELECT ok(idem_inbox_accept('dw.consumer', 'dw.m1') AND NOT idem_inbox_accept('dw.consumer', 'dw.m1'),
          'the inbox accepts a new message once');
SELECT is((SELECT count(*) FROM pg_temp.dw_log WHERE what = 'AFTER ROW idem_inbox' AND key = 'dw.m1'),
          1::bigint, 'its AFTER row trigger fired once');

-- columns whose type an administrator changed: the statement's casts,
-- typmods and domain checks apply, as without direct writes
-- (no savepoints: rolling one back would take pgTAP's count of tests with it)
ALTER TABLE idem_inbox ALTER COLUMN expires_at TYPE date;
SELECT ok(idem_inbox_accept('dw.consumer', 'dw.date', retention => '1 day'), 'an accept into a date expires_at');
SELECT is((SELECT expires_at::text FROM idem_inbox WHERE message_id = 'dw.date'),
          ((now() + interval '1 day')::date)::text, 'stores the date the INSERT''s cast makes');
ALTER TABLE idem_inbox ALTER COLUMN expires_at TYPE timestamptz;
CREATE DOMAIN pg_temp.dw_positive AS integer NOT NULL CHECK (VALUE > 0);
DELETE FROM idem_inbox;
ALTER TABLE idem_inbox ADD COLUMN dw_note pg_temp.dw_positive;
SELECT throws_ok($$SELECT idem_inbox_accept('dw.consumer', 'dw.domain')$$, '23502', NULL,
                 'a domain column without a default refuses the row, as the INSERT does');
ALTER TABLE idem_inbox DROP COLUMN dw_note;
-- a column an administrator added as an identity gets its next value, as
-- from the INSERT (an identity column has no DEFAULT of its own)
ALTER TABLE idem_inbox ADD COLUMN dw_id bigint GENERATED ALWAYS AS IDENTITY;
SELECT ok(idem_inbox_accept('dw.consumer', 'dw.identity'), 'an accept into a table with an identity column');
SELECT isnt((SELECT dw_id FROM idem_inbox WHERE message_id = 'dw.identity'), NULL,
            'fills the identity column');
ALTER TABLE idem_inbox DROP COLUMN dw_id;
ALTER TABLE idempotency_records ALTER COLUMN result TYPE json;
SELECT idem_complete('dw.json', (SELECT token FROM idem_claim('dw.json', '\x01')), '{"a": 1}');
SELECT is((SELECT result::text FROM idempotency_records WHERE key = 'dw.json'), '{"a": 1}',
          'a completion into a json result stores the JSON');
ALTER TABLE idempotency_records ALTER COLUMN result TYPE jsonb;

SELECT * FROM finish();
ROLLBACK;
