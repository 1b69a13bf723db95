--
-- A call nested in another (here: from a trigger on idempotency_records,
-- fired by the outer idem_claim's INSERT) must never free the prepared
-- statement the outer call is executing.
--
-- The nested call finds the extension's objects reloaded: after a GRANT on
-- the schema (what idem_grant does), which changes nothing the statements
-- depend on, and after ALTER SCHEMA ... RENAME, which does.  The trigger
-- counts the saved plans of the claim's INSERT that still exist at that
-- moment (pg_backend_memory_contexts shows each as a CachedPlanSource named
-- by its SQL): the outer INSERT is running, so its plan must be there.
--
CREATE ROLE regress_nested;
CREATE TABLE nested_seen (key text, insert_plans bigint);

CREATE FUNCTION nested_insert_plans() RETURNS bigint LANGUAGE sql AS $$
    SELECT count(*) FROM pg_backend_memory_contexts
    WHERE name = 'CachedPlanSource'
      AND ident LIKE 'INSERT INTO %.idempotency_records (scope, key, fingerprint, token,%'
$$;

CREATE FUNCTION nested_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.key = 'nested-grant' THEN
        PERFORM public.idem_grant('reader', 'regress_nested');
        PERFORM public.idem_lookup('nested-none');
    ELSIF NEW.key = 'nested-rename' THEN
        ALTER SCHEMA public RENAME TO nested_renamed;
        PERFORM nested_renamed.idem_lookup('nested-none');
        ALTER SCHEMA nested_renamed RENAME TO public;
    ELSE
        RETURN NEW;
    END IF;
    INSERT INTO public.nested_seen VALUES (NEW.key, public.nested_insert_plans());
    RETURN NEW;
END
$$;
CREATE TRIGGER nested BEFORE INSERT ON idempotency_records
    FOR EACH ROW EXECUTE FUNCTION nested_trigger();
-- A statement trigger keeps the claim on its SPI INSERT (the insert without
-- SPI, src/direct_write.c, has no plan to keep; statement triggers need the
-- statement).
CREATE FUNCTION nested_statement() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RETURN NULL;
END
$$;
CREATE TRIGGER nested_statement AFTER INSERT ON idempotency_records
    FOR EACH STATEMENT EXECUTE FUNCTION nested_statement();

-- prepares the INSERT
SELECT outcome, token FROM idem_claim('nested-first', '\x01');
SELECT nested_insert_plans();

-- the GRANT reloads the objects, finds the same ones, and keeps every plan
SELECT outcome, token FROM idem_claim('nested-grant', '\x01');
SELECT idem_complete('nested-grant', 1, '"done"');
-- the plan survived, and is still the only one
SELECT * FROM nested_seen;
SELECT nested_insert_plans();

-- the rename makes every plan old, but the running one is freed only after
-- the outer call has finished with it (not in the SQL edition, whose bodies
-- name their schema: they fail while it has another name;
-- test/edition/expected/nested_calls.out)
SELECT NOT EXISTS (SELECT FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
                   WHERE p.proname = 'idem_claim' AND l.lanname = 'c'
                     AND p.pronamespace = (SELECT extnamespace FROM pg_extension WHERE extname = 'idempotency'))
       AS sql_edition \gset
\if :sql_edition
\else
DELETE FROM nested_seen;
SELECT outcome, token FROM idem_claim('nested-rename', '\x01');
SELECT idem_complete('nested-rename', 1, '"done"');
SELECT * FROM nested_seen;
\endif
-- the old plans are gone: the next new claim prepares the only INSERT plan
SELECT outcome, token FROM idem_claim('nested-after', '\x01');
SELECT nested_insert_plans();

SELECT key, status, token, result FROM idempotency_records
WHERE key LIKE 'nested-%' ORDER BY key;

DROP TRIGGER nested ON idempotency_records;
DROP TRIGGER nested_statement ON idempotency_records;
DELETE FROM idempotency_records WHERE key LIKE 'nested-%';
SELECT setval('idem_token_epoch', 1, false) AS epoch_reset;  -- a DELETE moves the epoch
DROP TABLE nested_seen;
DROP FUNCTION nested_trigger(), nested_statement(), nested_insert_plans();
SELECT idem_revoke_all('regress_nested');
DROP ROLE regress_nested;
