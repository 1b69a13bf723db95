-- The consumer inbox in the SQL edition: src/inbox.c and src/inbox_batch.c
-- as PL/pgSQL (generate.py says how this file is read).
--
-- The same statements as the C edition's (record_store.c STMT_INBOX_*,
-- STMT_STREAM_*, inbox_batch.c BATCH_*), run as the caller, so the same
-- unique-index waits, row locks, EvalPlanQual rechecks and policies decide
-- the races.  Parameters are named by their function (fn.param), columns
-- by their table's alias; "#variable_conflict use_column" lets
-- ON CONFLICT (consumer, message_id) name the columns as the C does.
--
-- wait => false: the C edition probes the primary key with a dirty snapshot
-- before inserting, which SQL cannot.  Here the INSERT itself is the probe:
-- it runs in a subtransaction under lock_timeout = 1ms, after the locks of
-- the table and of its indexes have been taken without it, by planning a
-- no-op INSERT ... ON CONFLICT (so only a wait on a row of the key, another
-- transaction's insert or delete, times out, not one behind REINDEX or
-- pg_repack; a relation extension lock could too, so a timeout counts only
-- when no other session holds the extension lock of the table or of one of
-- its indexes just after it, and the probe gives up at the second that
-- counts).  A timeout is the
-- C edition's 55P03, with its message; everything else is as with
-- wait => true.  An insert the probe made stands when it succeeds and is
-- rolled back with the error when it does not, so nothing is written
-- either way, as in the C edition.

--@ idem_inbox_accept(text, text, interval, boolean)
-- src/inbox.c idem_inbox_accept: insert, or revive a message past its
-- retention, or find the live duplicate; a purge in between: again.  The
-- common case (valid arguments under the default settings, wait => true, a
-- new message) is one statement; everything else, the errors included, is
-- the C edition's path below it.  (In PL/pgSQL each expression evaluated
-- costs about a microsecond at its first use in a transaction, hence the
-- one statement, no DECLARE initializers, and one test of the arguments
-- before a duplicate's two statements.)
LANGUAGE plpgsql
AS $body$
#variable_conflict use_column
DECLARE
    now_ts pg_catalog.timestamptz;
    expires pg_catalog.timestamptz;
    lock_timeout_was pg_catalog.text;
    inserted pg_catalog.bool;
    live pg_catalog.bool;
    tried pg_catalog.bool;              -- whether round 0 of the loop has its INSERT done
    timeouts pg_catalog.int4;           -- the probe's lock timeouts not for an extension lock
BEGIN
    INSERT INTO @extschema@.idem_inbox AS i (consumer, message_id, expires_at)
    SELECT idem_inbox_accept.consumer, idem_inbox_accept.message_id,
           pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+)
           coalesce(idem_inbox_accept.retention, '1 day'::pg_catalog.interval)
    WHERE idem_inbox_accept.wait
      AND idem_inbox_accept.consumer OPERATOR(pg_catalog.<>) ''
      AND idem_inbox_accept.message_id OPERATOR(pg_catalog.<>) ''
      AND greatest(pg_catalog.octet_length(idem_inbox_accept.consumer),
                   pg_catalog.octet_length(idem_inbox_accept.message_id)) OPERATOR(pg_catalog.<=) 255
      AND coalesce(pg_catalog.current_setting('idempotency.max_key_length', true), '') OPERATOR(pg_catalog.=) ''
      AND CASE WHEN idem_inbox_accept.retention IS NULL
               THEN coalesce(pg_catalog.current_setting('idempotency.retention', true), '') OPERATOR(pg_catalog.=) ''
               WHEN idem_inbox_accept.retention OPERATOR(pg_catalog.<) '1000 years'::pg_catalog.interval
                AND idem_inbox_accept.retention OPERATOR(pg_catalog.>) '-1000 years'::pg_catalog.interval
               THEN pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) idem_inbox_accept.retention
                    OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()
               ELSE false END
    ON CONFLICT (consumer, message_id) DO NOTHING;
    IF FOUND THEN
        RETURN true;
    END IF;

    now_ts := pg_catalog.clock_timestamp();
    IF idem_inbox_accept.wait
       AND pg_catalog.octet_length(idem_inbox_accept.consumer) OPERATOR(pg_catalog.>) 0
       AND pg_catalog.octet_length(idem_inbox_accept.consumer) OPERATOR(pg_catalog.<=) 255
       AND pg_catalog.octet_length(idem_inbox_accept.message_id) OPERATOR(pg_catalog.>) 0
       AND pg_catalog.octet_length(idem_inbox_accept.message_id) OPERATOR(pg_catalog.<=) 255
       AND coalesce(pg_catalog.current_setting('idempotency.max_key_length', true), '') OPERATOR(pg_catalog.=) ''
       AND (CASE WHEN idem_inbox_accept.retention IS NULL
                 THEN coalesce(pg_catalog.current_setting('idempotency.retention', true), '') OPERATOR(pg_catalog.=) ''
                 WHEN idem_inbox_accept.retention OPERATOR(pg_catalog.<) '1000 years'::pg_catalog.interval
                  AND idem_inbox_accept.retention OPERATOR(pg_catalog.>) '-1000 years'::pg_catalog.interval
                 THEN now_ts OPERATOR(pg_catalog.+) idem_inbox_accept.retention OPERATOR(pg_catalog.>) now_ts
                 ELSE false END) THEN
        -- Valid arguments, and the statement above found the key taken.  A
        -- live row is a duplicate: the C edition's UPDATE would not match it
        -- (nor wait for it) and its SELECT would find it, so one SELECT
        -- answers; an expired row is the loop's to revive.
        expires := now_ts OPERATOR(pg_catalog.+) coalesce(idem_inbox_accept.retention, '1 day'::pg_catalog.interval);
        SELECT i.expires_at OPERATOR(pg_catalog.>) now_ts INTO live FROM @extschema@.idem_inbox AS i
        WHERE i.consumer OPERATOR(pg_catalog.=) idem_inbox_accept.consumer
          AND i.message_id OPERATOR(pg_catalog.=) idem_inbox_accept.message_id;
        IF live THEN
            RETURN false;               -- a live duplicate
        END IF;
        tried := true;                  -- round 0 below: revive it, or it vanished
    ELSE
        -- the arguments, in the C edition's order
        tried := false;                 -- (the statement above did not try the INSERT)
        PERFORM @extschema@.idem_sql_arg_key(idem_inbox_accept.consumer, 'consumer');
        PERFORM @extschema@.idem_sql_arg_key(idem_inbox_accept.message_id, 'message id');
        now_ts := pg_catalog.clock_timestamp();
        expires := @extschema@.idem_sql_retention_expiry(idem_inbox_accept.retention, now_ts);
        IF idem_inbox_accept.wait IS NULL THEN
            RAISE EXCEPTION 'wait must not be null' USING ERRCODE = '22004';
        END IF;

        IF NOT idem_inbox_accept.wait THEN
            -- the probe: the INSERT, refused at once where it would wait (see the top)
            EXECUTE 'INSERT INTO @extschema@.idem_inbox (consumer, message_id) SELECT NULL, NULL WHERE false
                             ON CONFLICT (consumer, message_id) DO NOTHING';   -- the locks (see the top)
            lock_timeout_was := pg_catalog.current_setting('lock_timeout');
            timeouts := 0;
            FOR attempt IN 1 .. 50 LOOP
                BEGIN
                    PERFORM pg_catalog.set_config('lock_timeout', '1ms', true);
                    INSERT INTO @extschema@.idem_inbox AS i (consumer, message_id, expires_at)
                    VALUES (idem_inbox_accept.consumer, idem_inbox_accept.message_id, expires)
                    ON CONFLICT (consumer, message_id) DO NOTHING;
                    inserted := FOUND;
                    PERFORM pg_catalog.set_config('lock_timeout', lock_timeout_was, true);
                    EXIT;
                EXCEPTION WHEN lock_not_available THEN
                    -- (inserts that add pages to the table or an index while
                    -- the machine is busy can hold the extension lock for
                    -- milliseconds: test/t/010_maintenance.pl)
                    IF NOT EXISTS (SELECT FROM pg_catalog.pg_locks l
                            WHERE l.locktype OPERATOR(pg_catalog.=) 'extend'
                              AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                                                                     WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
                              AND l.relation OPERATOR(pg_catalog.=) ANY (ARRAY(
                                      SELECT x.indexrelid FROM pg_catalog.pg_index x
                                       WHERE x.indrelid OPERATOR(pg_catalog.=) '@extschema@.idem_inbox'::pg_catalog.regclass
                                      UNION ALL SELECT '@extschema@.idem_inbox'::pg_catalog.regclass::pg_catalog.oid))) THEN
                        timeouts := timeouts OPERATOR(pg_catalog.+) 1;
                    END IF;
                    IF timeouts OPERATOR(pg_catalog.=) 2 OR attempt OPERATOR(pg_catalog.=) 50 THEN
                        RAISE EXCEPTION 'message "%" of consumer "%" is held by another transaction',
                            idem_inbox_accept.message_id, idem_inbox_accept.consumer
                            USING ERRCODE = '55P03',
                                  DETAIL = 'Another transaction is accepting it, or purging it.',
                                  HINT = 'Retry after that transaction ends, or call with wait => true to wait for it.';
                    END IF;
                END;
            END LOOP;
            IF inserted THEN
                RETURN true;
            END IF;
            tried := true;
        END IF;
    END IF;

    -- Not inserted: the message is there, or it expired and this call
    -- revives it.  When the row vanished in between (a purge committed),
    -- insert again.
    FOR round IN 0 .. 8 LOOP
        IF round OPERATOR(pg_catalog.>) 0 OR NOT tried THEN
            INSERT INTO @extschema@.idem_inbox AS i (consumer, message_id, expires_at)
            VALUES (idem_inbox_accept.consumer, idem_inbox_accept.message_id, expires)
            ON CONFLICT (consumer, message_id) DO NOTHING;
            IF FOUND THEN
                RETURN true;
            END IF;
        END IF;
        UPDATE @extschema@.idem_inbox AS i SET expires_at = expires
        WHERE i.consumer OPERATOR(pg_catalog.=) idem_inbox_accept.consumer
          AND i.message_id OPERATOR(pg_catalog.=) idem_inbox_accept.message_id
          AND i.expires_at OPERATOR(pg_catalog.<=) now_ts;
        IF FOUND THEN
            RETURN true;
        END IF;
        PERFORM FROM @extschema@.idem_inbox AS i
        WHERE i.consumer OPERATOR(pg_catalog.=) idem_inbox_accept.consumer
          AND i.message_id OPERATOR(pg_catalog.=) idem_inbox_accept.message_id;
        IF FOUND THEN
            RETURN false;               -- a live duplicate
        END IF;
        IF round OPERATOR(pg_catalog.=) 8 THEN
            IF pg_catalog.row_security_active('@extschema@.idem_inbox'::pg_catalog.regclass) THEN
                RAISE EXCEPTION 'message "%" of consumer "%" exists, but row-level security hides it',
                    idem_inbox_accept.message_id, idem_inbox_accept.consumer
                    USING ERRCODE = '42501',
                          DETAIL = 'The INSERT conflicts with a row of idem_inbox that its policies do not let this role read.',
                          HINT = 'Check idempotency.scope and the policies of idem_inbox.';
            END IF;
            RAISE EXCEPTION 'could not accept message "%" because of concurrent changes',
                idem_inbox_accept.message_id
                USING ERRCODE = '40001', HINT = 'Retry the transaction.';
        END IF;
        -- purged since the INSERT looked: insert again
    END LOOP;
END
$body$;

--@ idem_inbox_accept_seq(text, text, bigint, boolean)
-- src/inbox.c idem_inbox_accept_seq: watermark + 1 in one UPDATE (also the
-- fast path: valid arguments under the default settings); else lock the
-- watermark row (or start the stream) and decide.
LANGUAGE plpgsql
AS $body$
#variable_conflict use_column
DECLARE
    now_ts pg_catalog.timestamptz;
    mark pg_catalog.int8;
    result pg_catalog.text;
BEGIN
    -- the common case, seq = watermark + 1, in one statement
    UPDATE @extschema@.idem_inbox_streams AS s
    SET watermark = idem_inbox_accept_seq.seq, updated_at = pg_catalog.clock_timestamp()
    WHERE s.consumer OPERATOR(pg_catalog.=) idem_inbox_accept_seq.consumer
      AND s.stream OPERATOR(pg_catalog.=) idem_inbox_accept_seq.stream
      AND s.watermark OPERATOR(pg_catalog.=)
          CASE WHEN idem_inbox_accept_seq.seq OPERATOR(pg_catalog.>) 0
                AND idem_inbox_accept_seq.accept_gap IS NOT NULL
                AND pg_catalog.octet_length(idem_inbox_accept_seq.consumer) OPERATOR(pg_catalog.<=) 255
                AND pg_catalog.octet_length(idem_inbox_accept_seq.stream) OPERATOR(pg_catalog.<=) 255
                AND coalesce(pg_catalog.current_setting('idempotency.max_key_length', true), '')
                    OPERATOR(pg_catalog.=) ''
               THEN idem_inbox_accept_seq.seq OPERATOR(pg_catalog.-) 1 END;
    IF FOUND THEN
        RETURN 'new';
    END IF;

    IF (idem_inbox_accept_seq.seq OPERATOR(pg_catalog.>=) 0
        AND idem_inbox_accept_seq.accept_gap IS NOT NULL
        AND pg_catalog.octet_length(idem_inbox_accept_seq.consumer) OPERATOR(pg_catalog.>) 0
        AND pg_catalog.octet_length(idem_inbox_accept_seq.consumer) OPERATOR(pg_catalog.<=) 255
        AND pg_catalog.octet_length(idem_inbox_accept_seq.stream) OPERATOR(pg_catalog.>) 0
        AND pg_catalog.octet_length(idem_inbox_accept_seq.stream) OPERATOR(pg_catalog.<=) 255
        AND coalesce(pg_catalog.current_setting('idempotency.max_key_length', true), '')
            OPERATOR(pg_catalog.=) '') IS NOT TRUE THEN
        -- the arguments, in the C edition's order
        PERFORM @extschema@.idem_sql_arg_key(idem_inbox_accept_seq.consumer, 'consumer');
        PERFORM @extschema@.idem_sql_arg_key(idem_inbox_accept_seq.stream, 'stream');
        IF idem_inbox_accept_seq.seq IS NULL THEN
            RAISE EXCEPTION 'seq must not be null' USING ERRCODE = '22004';
        END IF;
        IF idem_inbox_accept_seq.accept_gap IS NULL THEN
            RAISE EXCEPTION 'accept_gap must not be null' USING ERRCODE = '22004';
        END IF;
        IF idem_inbox_accept_seq.seq OPERATOR(pg_catalog.<) 0 THEN
            RAISE EXCEPTION 'sequence number must not be negative' USING ERRCODE = '22023',
                DETAIL = pg_catalog.format('The sequence number given was %s.', idem_inbox_accept_seq.seq);
        END IF;
    END IF;
    now_ts := pg_catalog.clock_timestamp();

    -- (the UPDATE above was the C edition's first statement, or, under
    -- settings it leaves to this path, the lock below decides the same)
    FOR round IN 0 .. 8 LOOP
        IF round OPERATOR(pg_catalog.=) 8 THEN
            IF pg_catalog.row_security_active('@extschema@.idem_inbox_streams'::pg_catalog.regclass) THEN
                RAISE EXCEPTION 'stream "%" of consumer "%" exists, but row-level security hides it',
                    idem_inbox_accept_seq.stream, idem_inbox_accept_seq.consumer
                    USING ERRCODE = '42501',
                          DETAIL = 'The INSERT conflicts with a row of idem_inbox_streams that its policies do not let this role read.',
                          HINT = 'Check idempotency.scope and the policies of idem_inbox_streams.';
            END IF;
            RAISE EXCEPTION 'could not accept sequence number % of stream "%" because of concurrent changes',
                idem_inbox_accept_seq.seq, idem_inbox_accept_seq.stream
                USING ERRCODE = '40001', HINT = 'Retry the transaction.';
        END IF;

        SELECT s.watermark INTO mark FROM @extschema@.idem_inbox_streams AS s
        WHERE s.consumer OPERATOR(pg_catalog.=) idem_inbox_accept_seq.consumer
          AND s.stream OPERATOR(pg_catalog.=) idem_inbox_accept_seq.stream
        FOR UPDATE;
        IF NOT FOUND THEN
            INSERT INTO @extschema@.idem_inbox_streams AS s (consumer, stream, watermark, updated_at)
            VALUES (idem_inbox_accept_seq.consumer, idem_inbox_accept_seq.stream,
                    idem_inbox_accept_seq.seq, now_ts)
            ON CONFLICT (consumer, stream) DO NOTHING;
            IF FOUND THEN
                RETURN 'new';
            END IF;
            CONTINUE;                   -- created concurrently: lock it and look again
        END IF;
        IF idem_inbox_accept_seq.seq OPERATOR(pg_catalog.<=) mark THEN
            RETURN 'duplicate';
        END IF;
        result := CASE WHEN idem_inbox_accept_seq.seq OPERATOR(pg_catalog.=) (mark OPERATOR(pg_catalog.+) 1)
                       THEN 'new' ELSE 'gap' END;
        IF result OPERATOR(pg_catalog.=) 'new' OR idem_inbox_accept_seq.accept_gap THEN
            UPDATE @extschema@.idem_inbox_streams AS s
            SET watermark = idem_inbox_accept_seq.seq, updated_at = now_ts
            WHERE s.consumer OPERATOR(pg_catalog.=) idem_inbox_accept_seq.consumer
              AND s.stream OPERATOR(pg_catalog.=) idem_inbox_accept_seq.stream;
        END IF;
        RETURN result;
    END LOOP;
END
$body$;

--@ idem_inbox_accept_many(text, text[], interval, boolean)
-- src/inbox_batch.c idem_inbox_accept_many: the distinct ids in key order
-- (collation "C", the primary key's, so that overlapping batches wait for
-- each other in one order), then per round one INSERT ... SELECT unnest,
-- one UPDATE (revive) and one SELECT (live duplicates) for the ids left;
-- the new ids are returned in the order of their first appearance.  The
-- first statement checks the arguments (as the default settings allow them;
-- otherwise it writes nothing and the checks below say why), sorts the ids
-- and inserts them: the common case, every id new, is that statement and
-- the answer.
LANGUAGE plpgsql
AS $body$
#variable_conflict use_column
DECLARE
    max_len pg_catalog.int4;
    now_ts pg_catalog.timestamptz;
    expires pg_catalog.timestamptz;
    bad_n pg_catalog.int8;
    bad_id pg_catalog.text;
    fast pg_catalog.bool;               -- whether the first statement inserted
    nelems pg_catalog.int8;
    pending pg_catalog.text[];             -- the ids not decided yet, in key order
    got pg_catalog.text[];
    accepted pg_catalog.text[];
    cur pg_catalog.text;
    lock_timeout_was pg_catalog.text;
BEGIN
    WITH v AS (
        SELECT coalesce(pg_catalog.bool_and(m.id IS NOT NULL
                        AND pg_catalog.octet_length(m.id) OPERATOR(pg_catalog.>) 0
                        AND pg_catalog.octet_length(m.id) OPERATOR(pg_catalog.<=) 255), false)
               AND idem_inbox_accept_many.wait
               AND pg_catalog.array_ndims(idem_inbox_accept_many.message_ids) OPERATOR(pg_catalog.=) 1
               AND pg_catalog.octet_length(idem_inbox_accept_many.consumer) OPERATOR(pg_catalog.>) 0
               AND pg_catalog.octet_length(idem_inbox_accept_many.consumer) OPERATOR(pg_catalog.<=) 255
               AND coalesce(pg_catalog.current_setting('idempotency.max_key_length', true), '')
                   OPERATOR(pg_catalog.=) ''
               AND CASE WHEN idem_inbox_accept_many.retention IS NULL
                        THEN coalesce(pg_catalog.current_setting('idempotency.retention', true), '')
                             OPERATOR(pg_catalog.=) ''
                        WHEN idem_inbox_accept_many.retention OPERATOR(pg_catalog.<) '1000 years'::pg_catalog.interval
                         AND idem_inbox_accept_many.retention OPERATOR(pg_catalog.>) '-1000 years'::pg_catalog.interval
                        THEN pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) idem_inbox_accept_many.retention
                             OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()
                        ELSE false END AS ok,
               pg_catalog.array_agg(DISTINCT m.id COLLATE pg_catalog."C" ORDER BY m.id COLLATE pg_catalog."C") AS ids,
               pg_catalog.count(*) AS nelems
        FROM pg_catalog.unnest(idem_inbox_accept_many.message_ids) AS m(id)),
    ins AS (
        INSERT INTO @extschema@.idem_inbox AS i (consumer, message_id, expires_at)
        SELECT idem_inbox_accept_many.consumer, p.id,
               n.now OPERATOR(pg_catalog.+) coalesce(idem_inbox_accept_many.retention, '1 day'::pg_catalog.interval)
        FROM v, pg_catalog.unnest(v.ids) AS p(id), (SELECT pg_catalog.clock_timestamp() AS now) AS n
        WHERE v.ok
        ON CONFLICT (consumer, message_id) DO NOTHING
        RETURNING i.message_id)
    SELECT v.ok, v.ids, v.nelems, (SELECT pg_catalog.array_agg(ins.message_id) FROM ins)
    INTO fast, pending, nelems, got
    FROM v;
    IF fast AND pg_catalog.cardinality(got) OPERATOR(pg_catalog.=) pg_catalog.cardinality(pending) THEN
        -- every id was new
        IF nelems OPERATOR(pg_catalog.=) pg_catalog.cardinality(pending) THEN
            RETURN QUERY SELECT m.id FROM pg_catalog.unnest(idem_inbox_accept_many.message_ids) AS m(id);
        ELSE
            RETURN QUERY
            SELECT m.id FROM pg_catalog.unnest(idem_inbox_accept_many.message_ids) WITH ORDINALITY AS m(id, n)
            GROUP BY m.id ORDER BY pg_catalog.min(m.n);
        END IF;
        RETURN;
    END IF;

    IF fast THEN
        now_ts := pg_catalog.clock_timestamp();
        expires := now_ts OPERATOR(pg_catalog.+) coalesce(idem_inbox_accept_many.retention, '1 day'::pg_catalog.interval);
    ELSE
        -- the arguments, every element included, in the C edition's order
        PERFORM @extschema@.idem_sql_arg_key(idem_inbox_accept_many.consumer, 'consumer');
        IF idem_inbox_accept_many.message_ids IS NULL THEN
            RAISE EXCEPTION 'message_ids must not be null' USING ERRCODE = '22004';
        END IF;
        IF pg_catalog.array_ndims(idem_inbox_accept_many.message_ids) OPERATOR(pg_catalog.>) 1 THEN
            RAISE EXCEPTION 'message_ids must be a one-dimensional array' USING ERRCODE = '22023',
                DETAIL = pg_catalog.format('The array given has %s dimensions.',
                                           pg_catalog.array_ndims(idem_inbox_accept_many.message_ids));
        END IF;
        max_len := @extschema@.idem_sql_max_key_length();
        SELECT m.n, m.id INTO bad_n, bad_id
        FROM pg_catalog.unnest(idem_inbox_accept_many.message_ids) WITH ORDINALITY AS m(id, n)
        WHERE m.id IS NULL OR pg_catalog.octet_length(m.id) OPERATOR(pg_catalog.=) 0
           OR pg_catalog.octet_length(m.id) OPERATOR(pg_catalog.>) max_len
        ORDER BY m.n LIMIT 1;
        IF FOUND THEN
            bad_n := bad_n OPERATOR(pg_catalog.+) pg_catalog.array_lower(idem_inbox_accept_many.message_ids, 1)
                     OPERATOR(pg_catalog.-) 1;
            IF bad_id IS NULL THEN
                RAISE EXCEPTION 'message id must not be null' USING ERRCODE = '22004',
                    DETAIL = pg_catalog.format('Element %s of message_ids is null.', bad_n);
            ELSIF pg_catalog.octet_length(bad_id) OPERATOR(pg_catalog.=) 0 THEN
                RAISE EXCEPTION 'message id must not be empty' USING ERRCODE = '22023',
                    DETAIL = pg_catalog.format('Element %s of message_ids is empty.', bad_n);
            END IF;
            RAISE EXCEPTION 'message id is too long' USING ERRCODE = '22001',
                DETAIL = pg_catalog.format('Element %s of message_ids is %s bytes long; idempotency.max_key_length is %s.',
                                           bad_n, pg_catalog.octet_length(bad_id), max_len);
        END IF;
        now_ts := pg_catalog.clock_timestamp();
        expires := @extschema@.idem_sql_retention_expiry(idem_inbox_accept_many.retention, now_ts);
        IF idem_inbox_accept_many.wait IS NULL THEN
            RAISE EXCEPTION 'wait must not be null' USING ERRCODE = '22004';
        END IF;
        IF pg_catalog.cardinality(idem_inbox_accept_many.message_ids) OPERATOR(pg_catalog.=) 0 THEN
            RETURN;
        END IF;
    END IF;

    IF fast THEN
        -- The first statement inserted those new; the others were taken.
        -- Those live now are duplicates (the C edition's UPDATE would not
        -- match them, nor wait for them, and its SELECT would find them):
        -- one SELECT; the expired are round 0's to revive.
        accepted := coalesce(got, '{}');
        SELECT pg_catalog.array_agg(i.message_id) INTO got FROM @extschema@.idem_inbox AS i
        WHERE i.consumer OPERATOR(pg_catalog.=) idem_inbox_accept_many.consumer
          AND i.message_id OPERATOR(pg_catalog.=) ANY (pending)
          AND i.expires_at OPERATOR(pg_catalog.>) now_ts;
        -- (the rows inserted above are live too: when every id is, all are decided)
        IF pg_catalog.cardinality(got) OPERATOR(pg_catalog.=) pg_catalog.cardinality(pending) THEN
            pending := '{}';
        ELSE
            pending := ARRAY(SELECT x.id FROM (SELECT p.id COLLATE pg_catalog."C" AS id FROM pg_catalog.unnest(pending) AS p(id)
                                               EXCEPT
                                               SELECT g.id COLLATE pg_catalog."C" FROM pg_catalog.unnest(accepted OPERATOR(pg_catalog.||) got) AS g(id)) AS x
                             ORDER BY x.id);
        END IF;
    ELSIF NOT idem_inbox_accept_many.wait THEN
        -- the probe: the INSERT, refused at once where it would wait (see the
        -- top); then, to name the id, one id at a time in key order
        EXECUTE 'INSERT INTO @extschema@.idem_inbox (consumer, message_id) SELECT NULL, NULL WHERE false
                         ON CONFLICT (consumer, message_id) DO NOTHING';   -- the locks (see the top)
        lock_timeout_was := pg_catalog.current_setting('lock_timeout');
        BEGIN
            PERFORM pg_catalog.set_config('lock_timeout', '1ms', true);
            WITH ins AS (
                INSERT INTO @extschema@.idem_inbox AS i (consumer, message_id, expires_at)
                SELECT idem_inbox_accept_many.consumer, p.id, expires
                FROM pg_catalog.unnest(pending) AS p(id)
                ON CONFLICT (consumer, message_id) DO NOTHING
                RETURNING i.message_id)
            SELECT pg_catalog.array_agg(ins.message_id) INTO got FROM ins;
            PERFORM pg_catalog.set_config('lock_timeout', lock_timeout_was, true);
        EXCEPTION WHEN lock_not_available THEN
            got := '{}';
            cur := NULL;
            BEGIN
                PERFORM pg_catalog.set_config('lock_timeout', '1ms', true);
                FOREACH cur IN ARRAY pending LOOP
                    INSERT INTO @extschema@.idem_inbox AS i (consumer, message_id, expires_at)
                    VALUES (idem_inbox_accept_many.consumer, cur, expires)
                    ON CONFLICT (consumer, message_id) DO NOTHING;
                    IF FOUND THEN
                        got := got OPERATOR(pg_catalog.||) cur;
                    END IF;
                END LOOP;
                PERFORM pg_catalog.set_config('lock_timeout', lock_timeout_was, true);
            EXCEPTION WHEN lock_not_available THEN
                RAISE EXCEPTION 'message "%" of consumer "%" is held by another transaction',
                    cur, idem_inbox_accept_many.consumer
                    USING ERRCODE = '55P03',
                          DETAIL = 'Another transaction is accepting it, or purging it.',
                          HINT = 'Retry after that transaction ends, or call with wait => true to wait for it.';
            END;
        END;
        accepted := coalesce(got, '{}');
        IF got IS NOT NULL THEN
            pending := ARRAY(SELECT x.id FROM (SELECT p.id COLLATE pg_catalog."C" AS id FROM pg_catalog.unnest(pending) AS p(id)
                                               EXCEPT
                                               SELECT g.id COLLATE pg_catalog."C" FROM pg_catalog.unnest(got) AS g(id)) AS x
                             ORDER BY x.id);
        END IF;
    ELSE
        accepted := '{}';
        fast := NULL;               -- round 0 inserts
    END IF;

    FOR round IN 0 .. 8 LOOP
        EXIT WHEN pg_catalog.cardinality(pending) OPERATOR(pg_catalog.=) 0;
        IF round OPERATOR(pg_catalog.>) 0 OR fast IS NULL THEN
            WITH ins AS (
                INSERT INTO @extschema@.idem_inbox AS i (consumer, message_id, expires_at)
                SELECT idem_inbox_accept_many.consumer, p.id, expires
                FROM pg_catalog.unnest(pending) AS p(id)
                ON CONFLICT (consumer, message_id) DO NOTHING
                RETURNING i.message_id)
            SELECT pg_catalog.array_agg(ins.message_id) INTO got FROM ins;
            IF got IS NOT NULL THEN
                accepted := accepted OPERATOR(pg_catalog.||) got;
                pending := ARRAY(SELECT x.id FROM (SELECT p.id COLLATE pg_catalog."C" AS id FROM pg_catalog.unnest(pending) AS p(id)
                                                   EXCEPT
                                                   SELECT g.id COLLATE pg_catalog."C" FROM pg_catalog.unnest(got) AS g(id)) AS x
                                 ORDER BY x.id);
                EXIT WHEN pg_catalog.cardinality(pending) OPERATOR(pg_catalog.=) 0;
            END IF;
        END IF;
        -- past their retention: new again, under their row locks
        WITH rev AS (
            UPDATE @extschema@.idem_inbox AS i SET expires_at = expires
            WHERE i.consumer OPERATOR(pg_catalog.=) idem_inbox_accept_many.consumer
              AND i.message_id OPERATOR(pg_catalog.=) ANY (pending)
              AND i.expires_at OPERATOR(pg_catalog.<=) now_ts
            RETURNING i.message_id)
        SELECT pg_catalog.array_agg(rev.message_id) INTO got FROM rev;
        IF got IS NOT NULL THEN
            accepted := accepted OPERATOR(pg_catalog.||) got;
            pending := ARRAY(SELECT x.id FROM (SELECT p.id COLLATE pg_catalog."C" AS id FROM pg_catalog.unnest(pending) AS p(id)
                                               EXCEPT
                                               SELECT g.id COLLATE pg_catalog."C" FROM pg_catalog.unnest(got) AS g(id)) AS x
                             ORDER BY x.id);
            EXIT WHEN pg_catalog.cardinality(pending) OPERATOR(pg_catalog.=) 0;
        END IF;
        -- the live duplicates
        SELECT pg_catalog.array_agg(i.message_id) INTO got FROM @extschema@.idem_inbox AS i
        WHERE i.consumer OPERATOR(pg_catalog.=) idem_inbox_accept_many.consumer
          AND i.message_id OPERATOR(pg_catalog.=) ANY (pending);
        IF got IS NOT NULL THEN
            pending := ARRAY(SELECT x.id FROM (SELECT p.id COLLATE pg_catalog."C" AS id FROM pg_catalog.unnest(pending) AS p(id)
                                               EXCEPT
                                               SELECT g.id COLLATE pg_catalog."C" FROM pg_catalog.unnest(got) AS g(id)) AS x
                             ORDER BY x.id);
            EXIT WHEN pg_catalog.cardinality(pending) OPERATOR(pg_catalog.=) 0;
        END IF;
        -- purged since the INSERT looked: insert those again
        IF round OPERATOR(pg_catalog.=) 8 THEN
            IF pg_catalog.row_security_active('@extschema@.idem_inbox'::pg_catalog.regclass) THEN
                RAISE EXCEPTION 'message "%" of consumer "%" exists, but row-level security hides it',
                    pending[1], idem_inbox_accept_many.consumer
                    USING ERRCODE = '42501',
                          DETAIL = 'The INSERT conflicts with a row of idem_inbox that its policies do not let this role read.',
                          HINT = 'Check idempotency.scope and the policies of idem_inbox.';
            END IF;
            RAISE EXCEPTION 'could not accept message "%" because of concurrent changes', pending[1]
                USING ERRCODE = '40001', HINT = 'Retry the transaction.';
        END IF;
    END LOOP;

    -- the new ids, in the order of their first appearance
    IF pg_catalog.cardinality(accepted) OPERATOR(pg_catalog.=) 0 THEN
        RETURN;
    END IF;
    -- (grouped, not joined: a generic plan guesses 10 elements per array
    -- and would join in a nested loop, quadratic in a large batch)
    RETURN QUERY
    SELECT u.id
    FROM (SELECT a.id COLLATE pg_catalog."C" AS id, NULL::pg_catalog.int8 AS n, true AS acc
          FROM pg_catalog.unnest(accepted) AS a(id)
          UNION ALL
          SELECT m.id COLLATE pg_catalog."C", m.n, false
          FROM pg_catalog.unnest(idem_inbox_accept_many.message_ids) WITH ORDINALITY AS m(id, n)) AS u
    GROUP BY u.id HAVING pg_catalog.bool_or(u.acc) ORDER BY pg_catalog.min(u.n);
END
$body$;

--@ idem_inbox_accept_seq_many(text, text, bigint[], boolean)
-- src/inbox_batch.c idem_inbox_accept_seq_many: lock the watermark row once
-- (or start the stream with the first number), decide each number in array
-- order as idem_inbox_accept_seq would, update the row once.  The decisions
-- are one statement: with gaps accepted the watermark before a number is
-- the largest of the row's and of the numbers before it; without, the same
-- holds up to the first gap, after which a loop decides as the C does.
LANGUAGE plpgsql
AS $body$
#variable_conflict use_column
DECLARE
    now_ts pg_catalog.timestamptz;
    bad_n pg_catalog.int8;
    bad_seq pg_catalog.int8;
    mark pg_catalog.int8;
    locked pg_catalog.int8;
    first_new pg_catalog.bool;
    gaps pg_catalog.bool;
    s pg_catalog.int8;
    i pg_catalog.int4;
    outcomes pg_catalog.text[];
BEGIN
    IF NOT (idem_inbox_accept_seq_many.accept_gap IS NOT NULL
            AND pg_catalog.octet_length(idem_inbox_accept_seq_many.consumer) OPERATOR(pg_catalog.>) 0
            AND pg_catalog.octet_length(idem_inbox_accept_seq_many.consumer) OPERATOR(pg_catalog.<=) 255
            AND pg_catalog.octet_length(idem_inbox_accept_seq_many.stream) OPERATOR(pg_catalog.>) 0
            AND pg_catalog.octet_length(idem_inbox_accept_seq_many.stream) OPERATOR(pg_catalog.<=) 255
            AND pg_catalog.array_ndims(idem_inbox_accept_seq_many.seqs) OPERATOR(pg_catalog.=) 1
            AND 0::pg_catalog.int8 OPERATOR(pg_catalog.<=) ALL (idem_inbox_accept_seq_many.seqs)
            AND coalesce(pg_catalog.current_setting('idempotency.max_key_length', true), '')
                OPERATOR(pg_catalog.=) '') IS TRUE THEN
        -- the arguments, every element included, in the C edition's order
        PERFORM @extschema@.idem_sql_arg_key(idem_inbox_accept_seq_many.consumer, 'consumer');
        PERFORM @extschema@.idem_sql_arg_key(idem_inbox_accept_seq_many.stream, 'stream');
        IF idem_inbox_accept_seq_many.seqs IS NULL THEN
            RAISE EXCEPTION 'seqs must not be null' USING ERRCODE = '22004';
        END IF;
        IF pg_catalog.array_ndims(idem_inbox_accept_seq_many.seqs) OPERATOR(pg_catalog.>) 1 THEN
            RAISE EXCEPTION 'seqs must be a one-dimensional array' USING ERRCODE = '22023',
                DETAIL = pg_catalog.format('The array given has %s dimensions.',
                                           pg_catalog.array_ndims(idem_inbox_accept_seq_many.seqs));
        END IF;
        SELECT u.n, u.s INTO bad_n, bad_seq
        FROM pg_catalog.unnest(idem_inbox_accept_seq_many.seqs) WITH ORDINALITY AS u(s, n)
        WHERE u.s IS NULL OR u.s OPERATOR(pg_catalog.<) 0
        ORDER BY u.n LIMIT 1;
        IF FOUND THEN
            bad_n := bad_n OPERATOR(pg_catalog.+) pg_catalog.array_lower(idem_inbox_accept_seq_many.seqs, 1)
                     OPERATOR(pg_catalog.-) 1;
            IF bad_seq IS NULL THEN
                RAISE EXCEPTION 'seq must not be null' USING ERRCODE = '22004',
                    DETAIL = pg_catalog.format('Element %s of seqs is null.', bad_n);
            END IF;
            RAISE EXCEPTION 'sequence number must not be negative' USING ERRCODE = '22023',
                DETAIL = pg_catalog.format('Element %s of seqs is %s.', bad_n, bad_seq);
        END IF;
        IF idem_inbox_accept_seq_many.accept_gap IS NULL THEN
            RAISE EXCEPTION 'accept_gap must not be null' USING ERRCODE = '22004';
        END IF;
        IF pg_catalog.cardinality(idem_inbox_accept_seq_many.seqs) OPERATOR(pg_catalog.=) 0 THEN
            RETURN;
        END IF;
    END IF;
    now_ts := pg_catalog.clock_timestamp();

    FOR round IN 0 .. 8 LOOP
        IF round OPERATOR(pg_catalog.=) 8 THEN
            IF pg_catalog.row_security_active('@extschema@.idem_inbox_streams'::pg_catalog.regclass) THEN
                RAISE EXCEPTION 'stream "%" of consumer "%" exists, but row-level security hides it',
                    idem_inbox_accept_seq_many.stream, idem_inbox_accept_seq_many.consumer
                    USING ERRCODE = '42501',
                          DETAIL = 'The INSERT conflicts with a row of idem_inbox_streams that its policies do not let this role read.',
                          HINT = 'Check idempotency.scope and the policies of idem_inbox_streams.';
            END IF;
            RAISE EXCEPTION 'could not accept sequence number % of stream "%" because of concurrent changes',
                idem_inbox_accept_seq_many.seqs[pg_catalog.array_lower(idem_inbox_accept_seq_many.seqs, 1)],
                idem_inbox_accept_seq_many.stream
                USING ERRCODE = '40001', HINT = 'Retry the transaction.';
        END IF;
        SELECT st.watermark INTO mark FROM @extschema@.idem_inbox_streams AS st
        WHERE st.consumer OPERATOR(pg_catalog.=) idem_inbox_accept_seq_many.consumer
          AND st.stream OPERATOR(pg_catalog.=) idem_inbox_accept_seq_many.stream
        FOR UPDATE;
        IF FOUND THEN
            first_new := false;
            EXIT;
        END IF;
        -- a new stream: its first number starts it, as in idem_inbox_accept_seq
        mark := idem_inbox_accept_seq_many.seqs[pg_catalog.array_lower(idem_inbox_accept_seq_many.seqs, 1)];
        INSERT INTO @extschema@.idem_inbox_streams AS st (consumer, stream, watermark, updated_at)
        VALUES (idem_inbox_accept_seq_many.consumer, idem_inbox_accept_seq_many.stream, mark, now_ts)
        ON CONFLICT (consumer, stream) DO NOTHING;
        IF FOUND THEN
            first_new := true;
            EXIT;
        END IF;
        -- else created concurrently: lock it and look again
    END LOOP;
    locked := mark;

    -- the common case: the numbers that follow the watermark, in order (or
    -- the new stream's first number and those that follow it): all new
    IF mark OPERATOR(pg_catalog.<) (9223372036854775807::pg_catalog.int8
           OPERATOR(pg_catalog.-) pg_catalog.cardinality(idem_inbox_accept_seq_many.seqs))
       AND idem_inbox_accept_seq_many.seqs OPERATOR(pg_catalog.=)
           ARRAY(SELECT pg_catalog.generate_series(
                     CASE WHEN first_new THEN mark ELSE mark OPERATOR(pg_catalog.+) 1 END,
                     CASE WHEN first_new THEN mark ELSE mark OPERATOR(pg_catalog.+) 1 END
                     OPERATOR(pg_catalog.+) (pg_catalog.cardinality(idem_inbox_accept_seq_many.seqs)
                                             OPERATOR(pg_catalog.-) 1))) THEN
        mark := idem_inbox_accept_seq_many.seqs[pg_catalog.cardinality(idem_inbox_accept_seq_many.seqs)];
        IF mark OPERATOR(pg_catalog.<>) locked THEN
            UPDATE @extschema@.idem_inbox_streams AS st SET watermark = mark, updated_at = now_ts
            WHERE st.consumer OPERATOR(pg_catalog.=) idem_inbox_accept_seq_many.consumer
              AND st.stream OPERATOR(pg_catalog.=) idem_inbox_accept_seq_many.stream;
        END IF;
        RETURN QUERY SELECT u.s, 'new'::pg_catalog.text
        FROM pg_catalog.unnest(idem_inbox_accept_seq_many.seqs) AS u(s);
        RETURN;
    END IF;

    -- each number against the watermark before it (the first number of a
    -- new stream: new, it started the stream)
    SELECT pg_catalog.array_agg(CASE WHEN first_new AND u.n OPERATOR(pg_catalog.=) 1 THEN 'new'
                                     WHEN u.s OPERATOR(pg_catalog.<=) u.before THEN 'duplicate'
                                     WHEN u.s OPERATOR(pg_catalog.=) (u.before OPERATOR(pg_catalog.+) 1) THEN 'new'
                                     ELSE 'gap' END ORDER BY u.n),
           coalesce(pg_catalog.bool_or(CASE WHEN u.s OPERATOR(pg_catalog.<=) u.before THEN false
                                            ELSE u.s OPERATOR(pg_catalog.<>) (u.before OPERATOR(pg_catalog.+) 1) END),
                    false),
           pg_catalog.max(u.s)
    INTO outcomes, gaps, s
    FROM (SELECT x.s, x.n,
                 greatest(mark, pg_catalog.max(x.s) OVER (ORDER BY x.n ROWS BETWEEN UNBOUNDED PRECEDING
                                                                                AND 1 PRECEDING)) AS before
          FROM pg_catalog.unnest(idem_inbox_accept_seq_many.seqs) WITH ORDINALITY AS x(s, n)) AS u;
    IF idem_inbox_accept_seq_many.accept_gap OR NOT gaps THEN
        mark := greatest(mark, s);
    ELSE
        -- a gap refused: from there the watermark stays where it was, so
        -- decide in array order, as the C edition does
        outcomes := '{}';
        i := 0;
        FOREACH s IN ARRAY idem_inbox_accept_seq_many.seqs LOOP
            i := i OPERATOR(pg_catalog.+) 1;
            IF first_new AND i OPERATOR(pg_catalog.=) 1 THEN
                outcomes[i] := 'new';   -- the number that started the stream
            ELSIF s OPERATOR(pg_catalog.<=) mark THEN
                outcomes[i] := 'duplicate';
            ELSIF s OPERATOR(pg_catalog.=) (mark OPERATOR(pg_catalog.+) 1) THEN
                outcomes[i] := 'new';
                mark := s;
            ELSE
                outcomes[i] := 'gap';   -- refused: the watermark stays
            END IF;
        END LOOP;
    END IF;
    IF mark OPERATOR(pg_catalog.<>) locked THEN
        UPDATE @extschema@.idem_inbox_streams AS st SET watermark = mark, updated_at = now_ts
        WHERE st.consumer OPERATOR(pg_catalog.=) idem_inbox_accept_seq_many.consumer
          AND st.stream OPERATOR(pg_catalog.=) idem_inbox_accept_seq_many.stream;
    END IF;

    RETURN QUERY SELECT u.s, u.o
    FROM ROWS FROM (pg_catalog.unnest(idem_inbox_accept_seq_many.seqs), pg_catalog.unnest(outcomes)) AS u(s, o);
END
$body$;
