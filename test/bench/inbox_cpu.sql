-- The variants of test/bench/inbox_cpu, each a PL/pgSQL loop of n batches of
-- 100 new ids (in descending order, so that the batch has to sort them):
--   ours     idem_inbox_accept_many
--   raw      INSERT ... SELECT unnest(...) ON CONFLICT DO NOTHING RETURNING into
--            raw_inbox, the raw inbox of baselines.sql (default collation)
--   raw_c    the same into raw_c_inbox, a copy of idem_inbox (collation "C",
--            expires_at and its BRIN index)
--   singles  100 idem_inbox_accept calls
-- PL/pgSQL keeps the plans of its static statements, as -M prepared does.
SET client_min_messages = warning;
CREATE TABLE raw_inbox (consumer text, message_id text, received_at timestamptz DEFAULT now(),
                        PRIMARY KEY (consumer, message_id));
CREATE TABLE raw_c_inbox (LIKE idem_inbox INCLUDING ALL);

CREATE FUNCTION bench_ours(n int, base bigint) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE total bigint := 0; c bigint;
BEGIN
    FOR i IN 1..n LOOP
        SELECT count(*) INTO c FROM idem_inbox_accept_many('c',
            ARRAY(SELECT ((base + i) * 1000 + 999 - g)::text FROM generate_series(0, 99) g));
        total := total + c;
    END LOOP;
    RETURN total;
END $$;

CREATE FUNCTION bench_raw(n int, base bigint) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE total bigint := 0; c bigint;
BEGIN
    FOR i IN 1..n LOOP
        WITH accepted AS (
            INSERT INTO raw_inbox (consumer, message_id)
            SELECT 'c', m FROM unnest(ARRAY(SELECT ((base + i) * 1000 + 999 - g)::text
                                            FROM generate_series(0, 99) g)) m
            ON CONFLICT DO NOTHING RETURNING message_id)
        SELECT count(*) INTO c FROM accepted;
        total := total + c;
    END LOOP;
    RETURN total;
END $$;

CREATE FUNCTION bench_raw_c(n int, base bigint) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE total bigint := 0; c bigint;
BEGIN
    FOR i IN 1..n LOOP
        WITH accepted AS (
            INSERT INTO raw_c_inbox (consumer, message_id, expires_at)
            SELECT 'c', m, now() + interval '1 day'
            FROM unnest(ARRAY(SELECT ((base + i) * 1000 + 999 - g)::text FROM generate_series(0, 99) g)) m
            ON CONFLICT DO NOTHING RETURNING message_id)
        SELECT count(*) INTO c FROM accepted;
        total := total + c;
    END LOOP;
    RETURN total;
END $$;

CREATE FUNCTION bench_singles(n int, base bigint) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE total bigint := 0;
BEGIN
    FOR i IN 1..n LOOP
        FOR g IN 0..99 LOOP
            IF idem_inbox_accept('c', ((base + i) * 1000 + 999 - g)::text) THEN
                total := total + 1;
            END IF;
        END LOOP;
    END LOOP;
    RETURN total;
END $$;
