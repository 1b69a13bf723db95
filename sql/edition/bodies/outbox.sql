-- The transactional outbox of the SQL edition: src/outbox.c in PL/pgSQL
-- (emit, batch emit, the key lock of idem_outbox_retry, the counters, seq's
-- default and the order trigger of rows inserted directly).  The relay
-- functions (claim, ack, nack, retry) are the chain's own PL/pgSQL.
-- generate.py says how this file is read.

--@ internal

/*
 * The locks of the outbox (src/outbox.c, "Locking").  The C edition takes
 * advisory locks of its own classes, LOCKTAG_ADVISORY with field4 7457 for
 * a key (scope, topic, key) and 7458 for a scope, keyed by 64-bit hashes
 * (hash_bytes_extended: the scope's hash, and the topic's and key's chained
 * on it as seeds).  SQL reaches only the classes 1 (bigint) and 2
 * (int4, int4) of pg_advisory_xact_lock, so here the class is the first
 * int4 and the lock is (7457, hash >> 32) for a key, (7458, seed >> 32) for
 * a scope: in pg_locks classid 7457 or 7458, objid the upper half of the
 * same hash (pg_catalog.hashtextextended is hash_bytes_extended), objsubid 2
 * instead of the class.  A database holds one edition only, so the two
 * never meet.  Two keys (scopes) whose upper 32 bits collide share a lock,
 * which costs only waits, as a 64-bit collision in C; an application's own
 * pg_advisory_lock(7457, n) would share one too (it should keep away from
 * these two classes).  The modes: C's RowExclusiveLock on a scope, which
 * emitters share and its ExclusiveLock excludes, is the ShareLock of
 * pg_advisory_xact_lock_shared here (same conflicts between the two modes
 * used); ExclusiveLock is ExclusiveLock.  Scope, order, escalation and
 * release (end of transaction, rollback of the subtransaction that took
 * them) are C's.
 *
 * What C keeps in static variables lives in settings that are local to the
 * transaction (set_config(..., true)): they end with it and go back with a
 * rolled-back subtransaction, as the locks do.
 *   idem_sql.outbox_locked  '' before the transaction's first outbox lock
 *                           (outbox_locked_in_xact), then the count of key
 *                           locks the order trigger took (order_keys)
 *   idem_sql.outbox_bulk    ',s1,s2,': the scopes (seed >> 32) whose lock
 *                           this transaction holds in ExclusiveLock (C asks
 *                           its own lock table: idem_lock_held_by_me)
 *   idem_sql.outbox_key     the hash of the key an emit (or the trigger, or
 *                           idem_outbox_lock_key) locked last, or 'b' and a
 *                           scope's seed while a batch emit inserts the rows
 *                           whose keys it locked: the trigger's "key locked
 *                           by me" (C asks its lock table)
 *   idem_sql.outbox_seq     the seq idem_outbox_next_seq drew last
 *                           (default_seq)
 * and in one setting of the session:
 *   idem_sql.outbox_uuid    the last (unix ms << 12 | fraction) of the
 *                           backend's UUIDv7 ids (last_ms, last_fraction)
 * A session may write these settings itself; what it can get by that is
 * its own rows drawing seq before their key's lock (a key of a scope it may
 * write, whose order it could break), so the order trigger does not take
 * idem_sql.outbox_key on trust: it checks the lock with a conditional
 * request, granted at once when this transaction holds it.
 */

-- lock_scope_first (src/outbox.c): the scope's lock before any key lock of
-- the scope; true when this transaction holds it in ExclusiveLock (then no
-- key lock of the scope is needed).  It escalates only at the transaction's
-- first outbox lock, for more than 256 new keys; later only if the lock is
-- free at once.
CREATE FUNCTION @extschema@.idem_sql_outbox_lock_scope(seed bigint, new_keys integer)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    s integer := (seed OPERATOR(pg_catalog.>>) 32)::integer;
    tag text := pg_catalog.concat(',', s, ',');
    bulk text := pg_catalog.current_setting('idem_sql.outbox_bulk', true);
    locked text := pg_catalog.current_setting('idem_sql.outbox_locked', true);
BEGIN
    IF locked IS NULL OR locked OPERATOR(pg_catalog.=) '' THEN
        PERFORM pg_catalog.set_config('idem_sql.outbox_locked', '0', true);
    ELSIF COALESCE(pg_catalog.strpos(bulk, tag) OPERATOR(pg_catalog.>) 0, false)
          AND pg_catalog.pg_try_advisory_xact_lock(7458, s) THEN
        -- held in ExclusiveLock (granted at once: the setting is not taken on trust)
        RETURN true;
    END IF;
    IF new_keys OPERATOR(pg_catalog.>) 256 THEN
        IF locked IS NULL OR locked OPERATOR(pg_catalog.=) '' THEN
            PERFORM pg_catalog.pg_advisory_xact_lock(7458, s);
        ELSIF NOT pg_catalog.pg_try_advisory_xact_lock(7458, s) THEN
            -- held by others: a key lock per key, waiting only for those
            PERFORM pg_catalog.pg_advisory_xact_lock_shared(7458, s);
            RETURN false;
        END IF;
        PERFORM pg_catalog.set_config('idem_sql.outbox_bulk',
                                      pg_catalog.concat(CASE WHEN bulk OPERATOR(pg_catalog.<>) '' THEN bulk ELSE ',' END, s, ','), true);
        RETURN true;
    END IF;
    PERFORM pg_catalog.pg_advisory_xact_lock_shared(7458, s);
    RETURN false;
END
$fn$;

-- new_uuid_v7 (src/outbox.c): reserves n ids of the backend's sequence of
-- (unix ms << 12 | sub-millisecond fraction in 4096ths), which always grows
-- (RFC 9562's method 3), and returns the first
CREATE FUNCTION @extschema@.idem_sql_outbox_uuid_first(now_ts timestamptz, n integer)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    us bigint := pg_catalog.round(pg_catalog.date_part('epoch', now_ts) OPERATOR(pg_catalog.*) 1000000::float8)::bigint;
    -- (OPERATOR() binds left to right, all at one precedence)
    v bigint := ((us OPERATOR(pg_catalog./) 1000) OPERATOR(pg_catalog.<<) 12)
                OPERATOR(pg_catalog.+) (((us OPERATOR(pg_catalog.%) 1000) OPERATOR(pg_catalog.*) 4096)
                                        OPERATOR(pg_catalog./) 1000);
    last text := pg_catalog.current_setting('idem_sql.outbox_uuid', true);
BEGIN
    IF last IS NOT NULL AND last OPERATOR(pg_catalog.<>) '' AND v OPERATOR(pg_catalog.<=) last::bigint THEN
        v := last::bigint OPERATOR(pg_catalog.+) 1;
    END IF;
    PERFORM pg_catalog.set_config('idem_sql.outbox_uuid',
                                  (v OPERATOR(pg_catalog.+) n OPERATOR(pg_catalog.-) 1)::text, false);
    RETURN v;
END
$fn$;

-- the UUID of version 7 for v (see above): 48 bits of ms, the version, 12
-- bits of fraction, then the variant and 62 random bits (gen_random_uuid's)
CREATE FUNCTION @extschema@.idem_sql_outbox_uuid(v bigint)
RETURNS uuid
LANGUAGE sql VOLATILE
RETURN (pg_catalog.lpad(pg_catalog.to_hex(((v OPERATOR(pg_catalog.>>) 12) OPERATOR(pg_catalog.<<) 16)
                                           OPERATOR(pg_catalog.|) 28672
                                           OPERATOR(pg_catalog.|) (v OPERATOR(pg_catalog.&) 4095)), 16, '0')
        OPERATOR(pg_catalog.||) pg_catalog.right(pg_catalog.gen_random_uuid()::text, 17))::uuid;

-- check_name (src/outbox.c): a topic, key or type, not empty and no longer
-- than idempotency.max_key_length; raises the error (the callers test first)
CREATE FUNCTION @extschema@.idem_sql_outbox_check_name(value text, what text)
RETURNS void
LANGUAGE plpgsql STABLE
AS $fn$
BEGIN
    IF pg_catalog.octet_length(value) OPERATOR(pg_catalog.=) 0 THEN
        RAISE EXCEPTION '% must not be empty', what USING ERRCODE = '22023';
    END IF;
    PERFORM @extschema@.idem_sql_check_length(value, what);
END
$fn$;

-- idempotency.max_key_length without a call while it is not set
CREATE FUNCTION @extschema@.idem_sql_outbox_max_key_length()
RETURNS integer
LANGUAGE sql STABLE
RETURN CASE WHEN pg_catalog.current_setting('idempotency.max_key_length', true) IS NULL THEN 255
            ELSE @extschema@.idem_sql_max_key_length() END;

-- check_key_bytes (src/outbox.c): topic, key and scope fit one entry of the
-- index idem_outbox_key (BTMaxItemSize of the block size, less 104 bytes:
-- 2600 at 8 kB)
CREATE FUNCTION @extschema@.idem_sql_outbox_check_key_bytes(len integer)
RETURNS void
LANGUAGE plpgsql STABLE
AS $fn$
DECLARE
    max_bytes integer := (((pg_catalog.current_setting('block_size')::integer OPERATOR(pg_catalog.-) 72)
                           OPERATOR(pg_catalog./) 3) OPERATOR(pg_catalog.&) -8) OPERATOR(pg_catalog.-) 104;
BEGIN
    IF len OPERATOR(pg_catalog.>) max_bytes THEN
        RAISE EXCEPTION 'topic, key and scope are too long together'
            USING ERRCODE = '22001',
                  DETAIL = pg_catalog.format('They are %s bytes long together; the limit is %s bytes.', len, max_bytes);
    END IF;
END
$fn$;

-- available_at (src/outbox.c): now + delay; NULL is none, negative an error
CREATE FUNCTION @extschema@.idem_sql_outbox_available(now_ts timestamptz, delay interval)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
AS $fn$
DECLARE
    result timestamptz;
BEGIN
    IF delay IS NULL THEN
        RETURN now_ts;
    END IF;
    result := now_ts OPERATOR(pg_catalog.+) delay;
    IF result OPERATOR(pg_catalog.<) now_ts THEN
        RAISE EXCEPTION 'delay must not be negative'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('The interval given was "%s".', delay);
    END IF;
    -- from PostgreSQL 17 an interval may be infinite: never due
    IF NOT pg_catalog.isfinite(result) THEN
        RAISE EXCEPTION 'delay must be finite' USING ERRCODE = '22023';
    END IF;
    RETURN result;
END
$fn$;

-- idempotency.outbox_notify (bool, default on), as the C setting parses it
CREATE FUNCTION @extschema@.idem_sql_outbox_notify_on(value text)
RETURNS boolean
LANGUAGE plpgsql STABLE
AS $fn$
BEGIN
    IF value IS NULL OR value OPERATOR(pg_catalog.=) '' THEN
        RETURN true;
    END IF;
    BEGIN
        RETURN value::boolean;
    EXCEPTION WHEN invalid_text_representation THEN
        RAISE EXCEPTION 'parameter "idempotency.outbox_notify" requires a Boolean value'
            USING ERRCODE = '22023';
    END;
END
$fn$;

-- one element of a batch emit, checked as src/outbox.c does (raises the
-- first error)
CREATE FUNCTION @extschema@.idem_sql_outbox_check_element(topic text, k text, p jsonb, t text,
                                                        h jsonb, scope text)
RETURNS void
LANGUAGE plpgsql STABLE
AS $fn$
BEGIN
    IF k IS NULL THEN
        RAISE EXCEPTION 'keys must not contain nulls' USING ERRCODE = '22004';
    END IF;
    PERFORM @extschema@.idem_sql_outbox_check_name(k, 'key');
    PERFORM @extschema@.idem_sql_outbox_check_key_bytes(
        pg_catalog.octet_length(topic) OPERATOR(pg_catalog.+) pg_catalog.octet_length(k)
        OPERATOR(pg_catalog.+) pg_catalog.octet_length(scope));
    IF p IS NULL THEN
        RAISE EXCEPTION 'payloads must not contain nulls'
            USING ERRCODE = '22004', HINT = 'Pass ''null''::jsonb for a message without a payload.';
    END IF;
    IF t IS NOT NULL THEN
        PERFORM @extschema@.idem_sql_outbox_check_name(t, 'type');
    END IF;
    IF h IS NOT NULL AND pg_catalog.jsonb_typeof(h) OPERATOR(pg_catalog.<>) 'object' THEN
        RAISE EXCEPTION 'headers must be a JSON object'
            USING ERRCODE = '22023', HINT = 'Pass NULL for a message without headers.';
    END IF;
END
$fn$;

-- the checks of idem_outbox_emit (src/outbox.c), in its order; returns
-- available_at
CREATE FUNCTION @extschema@.idem_sql_outbox_check_emit(topic text, key text, payload jsonb, type text,
                                                     headers jsonb, scope text, delay interval,
                                                     now_ts timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
AS $fn$
BEGIN
    IF topic IS NULL THEN
        RAISE EXCEPTION 'topic must not be null' USING ERRCODE = '22004';
    END IF;
    PERFORM @extschema@.idem_sql_outbox_check_name(topic, 'topic');
    IF key IS NULL THEN
        RAISE EXCEPTION 'key must not be null' USING ERRCODE = '22004';
    END IF;
    PERFORM @extschema@.idem_sql_outbox_check_name(key, 'key');
    IF payload IS NULL THEN
        RAISE EXCEPTION 'payload must not be null'
            USING ERRCODE = '22004', HINT = 'Pass ''null''::jsonb for a message without a payload.';
    END IF;
    IF type IS NOT NULL THEN
        PERFORM @extschema@.idem_sql_outbox_check_name(type, 'type');
    END IF;
    IF headers IS NOT NULL AND pg_catalog.jsonb_typeof(headers) OPERATOR(pg_catalog.<>) 'object' THEN
        RAISE EXCEPTION 'headers must be a JSON object'
            USING ERRCODE = '22023', HINT = 'Pass NULL for a message without headers.';
    END IF;
    PERFORM @extschema@.idem_sql_arg_scope(scope);
    PERFORM @extschema@.idem_sql_outbox_check_key_bytes(
        pg_catalog.octet_length(topic) OPERATOR(pg_catalog.+) pg_catalog.octet_length(key)
        OPERATOR(pg_catalog.+) pg_catalog.octet_length(scope));
    RETURN @extschema@.idem_sql_outbox_available(now_ts, delay);
END
$fn$;

--@ idem_outbox_emit(text, text, jsonb, text, jsonb, text, interval)
-- One INSERT under the key's lock, as the C edition's (src/outbox.c).  The
-- hot path is a few simple expressions (PL/pgSQL evaluates those without
-- the executor; each PERFORM or call of a PL/pgSQL or SQL function would
-- cost more than the INSERT): one test of every argument, the checks in the
-- C edition's order only when it fails (or with a delay).
LANGUAGE plpgsql
AS $body$
DECLARE
    now_ts constant timestamptz := pg_catalog.clock_timestamp();
    available timestamptz := now_ts;
    seed bigint;
    hash bigint;
    v bigint;
    message_id uuid;
    done text;
BEGIN
    IF topic IS NULL OR key IS NULL OR payload IS NULL OR scope IS NULL OR delay IS NOT NULL
       OR pg_catalog.current_setting('idempotency.max_key_length', true) IS NOT NULL
       OR pg_catalog.octet_length(topic) OPERATOR(pg_catalog.=) 0
       OR pg_catalog.octet_length(key) OPERATOR(pg_catalog.=) 0
       OR pg_catalog.octet_length(type) OPERATOR(pg_catalog.=) 0
       OR pg_catalog.octet_length(type) OPERATOR(pg_catalog.>) 255
       OR pg_catalog.jsonb_typeof(headers) OPERATOR(pg_catalog.<>) 'object'
       OR pg_catalog.octet_length(topic) OPERATOR(pg_catalog.+) pg_catalog.octet_length(key)
          OPERATOR(pg_catalog.+) pg_catalog.octet_length(scope) OPERATOR(pg_catalog.>) 208
    THEN
        available := @extschema@.idem_sql_outbox_check_emit(topic, key, payload, type, headers, scope,
                                                            delay, now_ts);
    END IF;

    -- under tenant isolation, another tenant's scope is refused before any lock
    IF pg_catalog.row_security_active('@extschema@.idem_outbox'::pg_catalog.regclass) THEN
        PERFORM @extschema@.idem_sql_require_tenant('@extschema@.idem_outbox'::pg_catalog.regclass, scope, 'emit');
    END IF;

    -- the key's lock under the scope's, as idem_sql_outbox_lock_scope(seed,
    -- 1) takes them (see the internal block above), inline
    seed := pg_catalog.hashtextextended(scope, 0);
    hash := pg_catalog.hashtextextended(key, pg_catalog.hashtextextended(topic, seed));
    IF pg_catalog.current_setting('idem_sql.outbox_locked', true) IS NULL
       OR pg_catalog.current_setting('idem_sql.outbox_locked', true) OPERATOR(pg_catalog.=) '' THEN
        done := pg_catalog.set_config('idem_sql.outbox_locked', '0', true);
    ELSIF COALESCE(pg_catalog.strpos(pg_catalog.current_setting('idem_sql.outbox_bulk', true),
                                     pg_catalog.concat(',', (seed OPERATOR(pg_catalog.>>) 32)::integer, ','))
                       OPERATOR(pg_catalog.>) 0, false)
          AND pg_catalog.pg_try_advisory_xact_lock(7458, (seed OPERATOR(pg_catalog.>>) 32)::integer) THEN
        -- the scope's lock in ExclusiveLock: no key lock
        hash := NULL;
    END IF;
    IF hash IS NOT NULL THEN
        -- in this order: the scope's, the key's, then the trigger's note
        done := pg_catalog.concat(pg_catalog.pg_advisory_xact_lock_shared(7458, (seed OPERATOR(pg_catalog.>>) 32)::integer),
                                  pg_catalog.pg_advisory_xact_lock(7457, (hash OPERATOR(pg_catalog.>>) 32)::integer),
                                  pg_catalog.set_config('idem_sql.outbox_key', hash::text, true));
    END IF;

    -- the id (new_uuid_v7): never below the backend's last
    v := pg_catalog.round(pg_catalog.date_part('epoch', now_ts) OPERATOR(pg_catalog.*) 1000000::float8)::bigint;
    v := GREATEST(
        ((v OPERATOR(pg_catalog./) 1000) OPERATOR(pg_catalog.<<) 12)
        OPERATOR(pg_catalog.+) (((v OPERATOR(pg_catalog.%) 1000) OPERATOR(pg_catalog.*) 4096) OPERATOR(pg_catalog./) 1000),
        CASE WHEN pg_catalog.current_setting('idem_sql.outbox_uuid', true) OPERATOR(pg_catalog.<>) ''
             THEN pg_catalog.current_setting('idem_sql.outbox_uuid', true)::bigint OPERATOR(pg_catalog.+) 1 END);
    message_id := (pg_catalog.lpad(pg_catalog.to_hex(((v OPERATOR(pg_catalog.>>) 12) OPERATOR(pg_catalog.<<) 16)
                                                     OPERATOR(pg_catalog.|) 28672
                                                     OPERATOR(pg_catalog.|) (v OPERATOR(pg_catalog.&) 4095)), 16, '0')
                   OPERATOR(pg_catalog.||) pg_catalog.right(pg_catalog.gen_random_uuid()::text, 17)
                   OPERATOR(pg_catalog.||) pg_catalog.left(pg_catalog.set_config('idem_sql.outbox_uuid', v::text, false), 0))::uuid;

    -- seq: its default, drawn now, after the lock; the trigger notifies
    INSERT INTO @extschema@.idem_outbox (id, created_at, available_at, updated_at, scope,
                                         aggregatetype, aggregateid, type, headers, payload)
    VALUES (message_id, now_ts, available, now_ts, scope, topic, key, type, headers, payload);
    RETURN message_id;
END
$body$;

--@ idem_outbox_emit_batch(text, text[], jsonb[], text[], jsonb[], text, interval)
-- Everything is checked before the first INSERT; the keys' locks in the
-- order of their hashes (two batches never deadlock); the rows in array
-- order; one notification.
LANGUAGE plpgsql
AS $body$
DECLARE
    now_ts constant timestamptz := pg_catalog.clock_timestamp();
    max_len integer;
    n integer;
    available timestamptz;
    bad integer;
    seed bigint;
    hashes integer[];
    first_id bigint;
    ids uuid[];
BEGIN
    IF topic IS NULL THEN
        RAISE EXCEPTION 'topic must not be null' USING ERRCODE = '22004';
    END IF;
    max_len := @extschema@.idem_sql_outbox_max_key_length();
    IF pg_catalog.octet_length(topic) OPERATOR(pg_catalog.=) 0
       OR pg_catalog.octet_length(topic) OPERATOR(pg_catalog.>) max_len THEN
        PERFORM @extschema@.idem_sql_outbox_check_name(topic, 'topic');
    END IF;
    IF keys IS NULL THEN
        RAISE EXCEPTION 'keys must not be null' USING ERRCODE = '22004';
    END IF;
    IF payloads IS NULL THEN
        RAISE EXCEPTION 'payloads must not be null' USING ERRCODE = '22004';
    END IF;
    IF pg_catalog.array_ndims(keys) OPERATOR(pg_catalog.>) 1 THEN
        RAISE EXCEPTION 'keys must be a one-dimensional array' USING ERRCODE = '22023';
    END IF;
    IF pg_catalog.array_ndims(payloads) OPERATOR(pg_catalog.>) 1 THEN
        RAISE EXCEPTION 'payloads must be a one-dimensional array' USING ERRCODE = '22023';
    END IF;
    IF pg_catalog.array_ndims(types) OPERATOR(pg_catalog.>) 1 THEN
        RAISE EXCEPTION 'types must be a one-dimensional array' USING ERRCODE = '22023';
    END IF;
    IF pg_catalog.array_ndims(headers) OPERATOR(pg_catalog.>) 1 THEN
        RAISE EXCEPTION 'headers must be a one-dimensional array' USING ERRCODE = '22023';
    END IF;
    n := pg_catalog.cardinality(keys);
    IF n OPERATOR(pg_catalog.>) 100000 THEN
        RAISE EXCEPTION 'a batch of % messages is more than the % allowed', n, 100000
            USING ERRCODE = '54000', HINT = 'Emit them in several calls in the same transaction.';
    END IF;
    IF pg_catalog.cardinality(payloads) OPERATOR(pg_catalog.<>) n THEN
        RAISE EXCEPTION 'payloads must have as many elements as keys'
            USING ERRCODE = '2202E',
                  DETAIL = pg_catalog.format('keys has %s elements and payloads %s.', n, pg_catalog.cardinality(payloads));
    END IF;
    IF pg_catalog.cardinality(types) OPERATOR(pg_catalog.<>) n THEN
        RAISE EXCEPTION 'types must have as many elements as keys'
            USING ERRCODE = '2202E',
                  DETAIL = pg_catalog.format('keys has %s elements and types %s.', n, pg_catalog.cardinality(types));
    END IF;
    IF pg_catalog.cardinality(headers) OPERATOR(pg_catalog.<>) n THEN
        RAISE EXCEPTION 'headers must have as many elements as keys'
            USING ERRCODE = '2202E',
                  DETAIL = pg_catalog.format('keys has %s elements and headers %s.', n, pg_catalog.cardinality(headers));
    END IF;
    IF scope IS NULL OR pg_catalog.octet_length(scope) OPERATOR(pg_catalog.>) max_len THEN
        PERFORM @extschema@.idem_sql_arg_scope(scope);
    END IF;
    IF delay IS NULL THEN
        available := now_ts;
    ELSE
        available := @extschema@.idem_sql_outbox_available(now_ts, delay);
    END IF;

    -- the first bad element, then its error, in the C edition's order
    SELECT u.i INTO bad
    FROM ROWS FROM (pg_catalog.unnest(keys), pg_catalog.unnest(payloads), pg_catalog.unnest(types), pg_catalog.unnest(headers)) WITH ORDINALITY u(k, p, t, h, i)
    WHERE u.k IS NULL OR pg_catalog.octet_length(u.k) OPERATOR(pg_catalog.=) 0
       OR pg_catalog.octet_length(u.k) OPERATOR(pg_catalog.>) max_len
       OR pg_catalog.octet_length(topic) OPERATOR(pg_catalog.+) pg_catalog.octet_length(u.k)
          OPERATOR(pg_catalog.+) pg_catalog.octet_length(scope) OPERATOR(pg_catalog.>) 208
       OR u.p IS NULL
       OR pg_catalog.octet_length(u.t) OPERATOR(pg_catalog.=) 0
       OR pg_catalog.octet_length(u.t) OPERATOR(pg_catalog.>) max_len
       OR pg_catalog.jsonb_typeof(u.h) OPERATOR(pg_catalog.<>) 'object'
    ORDER BY u.i
    LIMIT 1;
    IF FOUND THEN
        PERFORM @extschema@.idem_sql_outbox_check_element(topic, u.k, u.p, u.t, u.h, scope)
        FROM ROWS FROM (pg_catalog.unnest(keys), pg_catalog.unnest(payloads), pg_catalog.unnest(types), pg_catalog.unnest(headers)) WITH ORDINALITY u(k, p, t, h, i)
        WHERE u.i OPERATOR(pg_catalog.>=) bad
        ORDER BY u.i;
    END IF;

    IF pg_catalog.row_security_active('@extschema@.idem_outbox'::pg_catalog.regclass) THEN
        PERFORM @extschema@.idem_sql_require_tenant('@extschema@.idem_outbox'::pg_catalog.regclass, scope, 'emit');
    END IF;
    IF n OPERATOR(pg_catalog.=) 0 THEN
        RETURN '{}'::uuid[];
    END IF;

    -- the keys' locks, in the order of their hashes, each once
    seed := pg_catalog.hashtextextended(scope, 0);
    hashes := ARRAY(SELECT DISTINCT (pg_catalog.hashtextextended(k, pg_catalog.hashtextextended(topic, seed))
                                     OPERATOR(pg_catalog.>>) 32)::integer AS h
                    FROM pg_catalog.unnest(keys) k ORDER BY 1);
    IF NOT @extschema@.idem_sql_outbox_lock_scope(seed, pg_catalog.cardinality(hashes)) THEN
        PERFORM pg_catalog.pg_advisory_xact_lock(7457, h) FROM pg_catalog.unnest(hashes) h;
    END IF;
    hashes := NULL;

    first_id := @extschema@.idem_sql_outbox_uuid_first(now_ts, n);
    ids := ARRAY(SELECT @extschema@.idem_sql_outbox_uuid(first_id OPERATOR(pg_catalog.+) g)
                 FROM pg_catalog.generate_series(0, n OPERATOR(pg_catalog.-) 1) g);
    -- the trigger finds the rows' keys locked (see the internal block)
    PERFORM pg_catalog.set_config('idem_sql.outbox_key', pg_catalog.concat('b', seed), true);
    INSERT INTO @extschema@.idem_outbox (id, created_at, available_at, updated_at, scope,
                                         aggregatetype, aggregateid, type, headers, payload)
    SELECT ids[u.i], now_ts, available, now_ts, scope, topic, u.k, u.t, u.h, u.p
    FROM ROWS FROM (pg_catalog.unnest(keys), pg_catalog.unnest(payloads), pg_catalog.unnest(types), pg_catalog.unnest(headers)) WITH ORDINALITY u(k, p, t, h, i)
    ORDER BY u.i;
    -- (the trigger notified the relays)
    PERFORM pg_catalog.set_config('idem_sql.outbox_key', '', true);
    RETURN ids;
END
$body$;

--@ idem_outbox_lock_key(text, text, text)
-- The emits' lock on a key, for idem_outbox_retry; the tenant first.
LANGUAGE plpgsql
AS $body$
DECLARE
    seed bigint;
    hash bigint;
BEGIN
    IF pg_catalog.row_security_active('@extschema@.idem_outbox'::pg_catalog.regclass) THEN
        PERFORM @extschema@.idem_sql_require_tenant('@extschema@.idem_outbox'::pg_catalog.regclass, scope, 'emit');
    END IF;
    seed := pg_catalog.hashtextextended(scope, 0);
    hash := pg_catalog.hashtextextended(key, pg_catalog.hashtextextended(topic, seed));
    IF NOT @extschema@.idem_sql_outbox_lock_scope(seed, 1) THEN
        PERFORM pg_catalog.pg_advisory_xact_lock(7457, (hash OPERATOR(pg_catalog.>>) 32)::integer);
        PERFORM pg_catalog.set_config('idem_sql.outbox_key', hash::text, true);
    END IF;
END
$body$;

--@ idem_outbox_counted(text, bigint)
-- The relay functions' counts.  An unrecognized name is an error, so that a
-- misspelt call shows in the tests.
LANGUAGE plpgsql
AS $body$
BEGIN
    IF counter OPERATOR(pg_catalog.<>) ALL ('{published,retried,dead,taken_over}'::text[]) THEN
        RAISE EXCEPTION 'unrecognized outbox counter "%"', counter USING ERRCODE = '22023';
    END IF;
    IF n OPERATOR(pg_catalog.<) 0 THEN
        RAISE EXCEPTION 'n must not be negative' USING ERRCODE = '22023';
    END IF;
END
$body$;

--@ idem_outbox_next_seq()
-- nextval of idem_outbox_seq, remembered for the order trigger (C:
-- default_seq), under the caller's privileges on the sequence
LANGUAGE sql
AS $body$
SELECT pg_catalog.set_config('idem_sql.outbox_seq',
                             pg_catalog.nextval('@extschema@.idem_outbox_seq'::pg_catalog.regclass)::text,
                             true)::bigint
$body$;

--@ idem_outbox_order()
-- BEFORE INSERT ON idem_outbox FOR EACH ROW (src/outbox.c, "The order
-- trigger"): a row whose seq its default drew takes its key's lock, as an
-- emit does, and then draws seq again, unless the transaction holds it (an
-- emit's row: three simple expressions).  It notifies the relays for every
-- such row, the emits' too (they leave it to the trigger).
LANGUAGE plpgsql
AS $body$
DECLARE
    seed bigint;
    hash bigint;
    keys_locked integer;
    done text;
BEGIN
    -- a seq of the row's own is kept (a NULL one is drawn as a default); the
    -- last drawn is not forgotten (C: default_lxid): a row that brings that
    -- very value is taken for a drawn one, which costs a lock and a new seq
    IF TG_WHEN OPERATOR(pg_catalog.<>) 'BEFORE' OR TG_LEVEL OPERATOR(pg_catalog.<>) 'ROW'
       OR TG_OP OPERATOR(pg_catalog.<>) 'INSERT' THEN
        RAISE EXCEPTION 'function idem_outbox_order must be fired BEFORE INSERT FOR EACH ROW'
            USING ERRCODE = '39P01';
    END IF;
    IF NEW.seq IS NOT NULL AND NEW.seq::text IS DISTINCT FROM pg_catalog.current_setting('idem_sql.outbox_seq', true) THEN
        RETURN NEW;
    END IF;
    IF pg_catalog.current_setting('idempotency.outbox_notify', true) IS NULL
       OR pg_catalog.current_setting('idempotency.outbox_notify', true) OPERATOR(pg_catalog.=) ''
       OR @extschema@.idem_sql_outbox_notify_on(pg_catalog.current_setting('idempotency.outbox_notify', true)) THEN
        done := pg_catalog.pg_notify('idem_outbox', '')::text;
    END IF;
    -- NOT NULL columns: a NULL goes on to the executor's own error
    IF NEW.scope IS NULL OR NEW.aggregatetype IS NULL OR NEW.aggregateid IS NULL THEN
        RETURN NEW;
    END IF;

    seed := pg_catalog.hashtextextended(NEW.scope, 0);
    hash := pg_catalog.hashtextextended(NEW.aggregateid, pg_catalog.hashtextextended(NEW.aggregatetype, seed));
    -- does this transaction hold the key's lock (or the scope's in
    -- ExclusiveLock)?  Not on trust: the conditional request is granted at
    -- once when it does
    -- (COALESCE: NULL AND x evaluates x, which would take the lock)
    IF (COALESCE(pg_catalog.strpos(pg_catalog.current_setting('idem_sql.outbox_bulk', true),
                                   pg_catalog.concat(',', (seed OPERATOR(pg_catalog.>>) 32)::integer, ','))
                     OPERATOR(pg_catalog.>) 0, false)
        AND pg_catalog.pg_try_advisory_xact_lock(7458, (seed OPERATOR(pg_catalog.>>) 32)::integer))
       OR (COALESCE(pg_catalog.current_setting('idem_sql.outbox_key', true) OPERATOR(pg_catalog.=) ANY
                        (ARRAY[hash::text, pg_catalog.concat('b', seed)]), false)
           AND pg_catalog.pg_try_advisory_xact_lock(7457, (hash OPERATOR(pg_catalog.>>) 32)::integer)) THEN
        -- seq was drawn under it (an emit's row)
        IF NEW.seq IS NOT NULL THEN
            RETURN NEW;
        END IF;
    ELSE
        -- another tenant's row: the policy refuses it, before any lock
        IF pg_catalog.row_security_active(TG_RELID)
           AND @extschema@.idem_sql_tenant_check(TG_RELID, NEW.scope) OPERATOR(pg_catalog.=) 'outside' THEN
            RETURN NEW;
        END IF;
        keys_locked := CASE WHEN pg_catalog.current_setting('idem_sql.outbox_locked', true) OPERATOR(pg_catalog.<>) ''
                            THEN pg_catalog.current_setting('idem_sql.outbox_locked', true)::integer ELSE 0 END;
        -- past 256 key locks, the scope's lock if it is free at once
        IF NOT @extschema@.idem_sql_outbox_lock_scope(seed, CASE WHEN keys_locked OPERATOR(pg_catalog.<) 256 THEN 1
                                                                 ELSE keys_locked OPERATOR(pg_catalog.+) 1 END) THEN
            done := pg_catalog.concat(pg_catalog.pg_advisory_xact_lock(7457, (hash OPERATOR(pg_catalog.>>) 32)::integer),
                                      pg_catalog.set_config('idem_sql.outbox_locked', (keys_locked OPERATOR(pg_catalog.+) 1)::text, true),
                                      pg_catalog.set_config('idem_sql.outbox_key', hash::text, true));
        END IF;
    END IF;
    -- after the lock
    NEW.seq := pg_catalog.nextval('@extschema@.idem_outbox_seq'::pg_catalog.regclass);
    RETURN NEW;
END
$body$;
