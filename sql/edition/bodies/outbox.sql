-- The transactional outbox of the SQL edition: src/outbox.c in PL/pgSQL
-- (emit, batch emit, the key lock of idem_outbox_retry, the counters, seq's
-- default and the order trigger of rows inserted directly).  The relay
-- functions (claim, ack, nack, retry) are the chain's own PL/pgSQL.
-- generate.py says how this file is read; every PL/pgSQL function here runs
-- with search_path = pg_catalog, pg_temp, so operators are pg_catalog's.

--@ internal

/*
 * The locks of the outbox (src/outbox.c, "Locking").  The C edition takes
 * advisory locks of classes of its own: LOCKTAG_ADVISORY with field4 7457
 * for a key (scope, topic, key) and 7458 for a scope, keyed by 64-bit hashes
 * (hash_bytes_extended: the scope's hash is the seed of the topic's, which is
 * the seed of the key's).  SQL reaches only the classes 1 (bigint) and 2
 * (int4, int4) of pg_advisory_xact_lock, so here the class is the first
 * int4 and the lock is (7457, hash >> 32) for a key, (7458, seed >> 32) for
 * a scope: in pg_locks classid 7457 or 7458, objid the upper half of the C
 * edition's hash (pg_catalog.hashtextextended is hash_bytes_extended), and
 * objsubid 2 instead of the class.  A database holds one edition only, so
 * the two kinds never meet.  Two keys (scopes) whose upper halves collide
 * share a lock, which costs only waits, as a 64-bit collision does in C; an
 * application's own pg_advisory_lock(7457, n) or (7458, n) would share one
 * too.  The modes: C's RowExclusiveLock on a scope, which emitters share and
 * its ExclusiveLock excludes, is the ShareLock of
 * pg_advisory_xact_lock_shared here (the same conflicts between the two
 * modes used); ExclusiveLock is ExclusiveLock.  What is locked, in which
 * order, when a transaction escalates to its scope's lock and when the
 * locks go (the end of the transaction, the rollback of the subtransaction
 * that took them) are the C edition's.  One thing is not: any role may
 * call pg_advisory_xact_lock(7457, n) itself, and so take another tenant's
 * key or scope lock if it learns the key (pg_locks shows it while held) and
 * make that tenant's emits wait; the C edition's classes cannot be taken
 * from SQL.  The functions here refuse another tenant's scope before any
 * lock, as C's do.
 *
 * What C keeps in static variables, or asks its own lock table, lives here
 * in placeholder settings (not under "idempotency.": the C library reserves
 * that prefix).  Those of the transaction are set with set_config(..., true):
 * they end with it, and go back with a rolled-back subtransaction, as the
 * locks do.
 *   idem_sql.outbox_locked  '' before the transaction's first outbox lock
 *                           (C: outbox_locked_in_xact), then the count of
 *                           the key locks the order trigger took (order_keys)
 *   idem_sql.outbox_bulk    ',s1,s2,': the scopes (seed >> 32) whose lock
 *                           the transaction holds in ExclusiveLock
 *   idem_sql.outbox_key     what the transaction locked last, for the order
 *                           trigger: a key's hash (an emit, the trigger,
 *                           idem_outbox_lock_key), 'b' and the scope's seed
 *                           while a batch inserts the rows whose keys it
 *                           locked, 'B' and the seed for a scope held in
 *                           ExclusiveLock
 *   idem_sql.outbox_seq     the seq idem_outbox_next_seq drew last (C:
 *                           default_seq)
 * and one of the session (set_config(..., false)):
 *   idem_sql.outbox_uuid    the last (unix ms << 12 | fraction) of the
 *                           backend's UUIDv7 ids (C: last_ms, last_fraction)
 * A session may set these itself.  What it could gain is rows of its own
 * drawing seq before their key's lock; so nothing here takes them on trust
 * where that matters: a lock they say is held is asked for again with
 * pg_try_advisory_xact_lock, which a holder is granted at once.
 */

-- lock_scope_first (src/outbox.c): the scope's lock, before any key lock of
-- the scope; true when this transaction holds it in ExclusiveLock (and then
-- needs no key lock of the scope).  It escalates only at the transaction's
-- first outbox lock, for more than 256 new keys; later only if the lock is
-- free at once, since waiting for a whole scope while holding locks could
-- deadlock.
CREATE FUNCTION @extschema@.idem_sql_outbox_lock_scope(seed bigint, new_keys integer)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    s constant integer := (seed >> 32)::integer;
    bulk constant text := current_setting('idem_sql.outbox_bulk', true);
    first constant boolean := COALESCE(current_setting('idem_sql.outbox_locked', true), '') = '';
    done text;
BEGIN
    IF first THEN
        done := set_config('idem_sql.outbox_locked', '0', true);
    -- (COALESCE: in NULL AND x, x is evaluated, and would take the lock)
    ELSIF COALESCE(strpos(bulk, concat(',', s, ',')) > 0, false) AND pg_try_advisory_xact_lock(7458, s) THEN
        RETURN true;
    END IF;
    IF new_keys > 256 THEN
        IF first THEN
            done := pg_advisory_xact_lock(7458, s)::text;
        ELSIF NOT pg_try_advisory_xact_lock(7458, s) THEN
            -- held by others: a key lock per key, waiting only for those
            done := pg_advisory_xact_lock_shared(7458, s)::text;
            RETURN false;
        END IF;
        done := set_config('idem_sql.outbox_bulk',
                           concat(CASE WHEN bulk <> '' THEN bulk ELSE ',' END, s, ','), true);
        RETURN true;
    END IF;
    done := pg_advisory_xact_lock_shared(7458, s)::text;
    RETURN false;
END
$fn$;

-- new_uuid_v7 (src/outbox.c): reserves n values of the backend's sequence
-- of (unix ms << 12 | sub-millisecond fraction in 4096ths), which always
-- grows (RFC 9562's method 3), and returns the first
CREATE FUNCTION @extschema@.idem_sql_outbox_uuid_first(now_ts timestamptz, n integer)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    us constant bigint := round(date_part('epoch', now_ts) * 1000000::float8)::bigint;
    last constant text := current_setting('idem_sql.outbox_uuid', true);
    v bigint := ((us / 1000) << 12) + (((us % 1000) * 4096) / 1000);
    done text;
BEGIN
    IF last <> '' AND v <= last::bigint THEN
        v := last::bigint + 1;
    END IF;
    done := set_config('idem_sql.outbox_uuid', (v + n - 1)::text, false);
    RETURN v;
END
$fn$;

-- the UUID of version 7 of v (see above): 48 bits of ms, the version, 12
-- bits of fraction, then the variant and 62 random bits (gen_random_uuid's);
-- SQL-standard, so bound at creation and inlined
CREATE FUNCTION @extschema@.idem_sql_outbox_uuid(v bigint)
RETURNS uuid
LANGUAGE sql VOLATILE
RETURN (pg_catalog.lpad(pg_catalog.to_hex(((v OPERATOR(pg_catalog.>>) 12) OPERATOR(pg_catalog.<<) 16)
                                           OPERATOR(pg_catalog.|) 28672
                                           OPERATOR(pg_catalog.|) (v OPERATOR(pg_catalog.&) 4095)), 16, '0')
        OPERATOR(pg_catalog.||) pg_catalog.right(pg_catalog.gen_random_uuid()::text, 17))::uuid;

-- check_name (src/outbox.c): a topic, key or type, not empty and no longer
-- than idempotency.max_key_length
CREATE FUNCTION @extschema@.idem_sql_outbox_check_name(value text, what text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF octet_length(value) = 0 THEN
        RAISE EXCEPTION '% must not be empty', what USING ERRCODE = '22023';
    END IF;
    PERFORM @extschema@.idem_sql_check_length(value, what);
END
$fn$;

-- check_key_bytes (src/outbox.c): topic, key and scope fit one entry of the
-- index idem_outbox_key (BTMaxItemSize of the block size, less 104 bytes:
-- 2600 at 8 kB, 208 at the smallest block size, 1 kB)
CREATE FUNCTION @extschema@.idem_sql_outbox_check_key_bytes(len integer)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    max_bytes constant integer := (((current_setting('block_size')::integer - 72) / 3) & -8) - 104;
BEGIN
    IF len > max_bytes THEN
        RAISE EXCEPTION 'topic, key and scope are too long together'
            USING ERRCODE = '22001',
                  DETAIL = format('They are %s bytes long together; the limit is %s bytes.', len, max_bytes);
    END IF;
END
$fn$;

-- available_at (src/outbox.c): now + delay; NULL is none, negative an error
CREATE FUNCTION @extschema@.idem_sql_outbox_available(now_ts timestamptz, delay interval)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    result timestamptz;
BEGIN
    IF delay IS NULL THEN
        RETURN now_ts;
    END IF;
    result := now_ts + delay;
    IF result < now_ts THEN
        RAISE EXCEPTION 'delay must not be negative'
            USING ERRCODE = '22023',
                  DETAIL = format('The interval given was "%s".', delay);
    END IF;
    -- from PostgreSQL 17 an interval may be infinite: never due
    IF NOT isfinite(result) THEN
        RAISE EXCEPTION 'delay must be finite' USING ERRCODE = '22023';
    END IF;
    RETURN result;
END
$fn$;

-- the checks of idem_outbox_emit (src/outbox.c), in its order; returns
-- available_at.  The emit runs them only when its one test of all fails.
CREATE FUNCTION @extschema@.idem_sql_outbox_check_emit(topic text, key text, payload jsonb, type text,
                                                     headers jsonb, scope text, delay interval,
                                                     now_ts timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
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
    IF headers IS NOT NULL AND jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION 'headers must be a JSON object'
            USING ERRCODE = '22023', HINT = 'Pass NULL for a message without headers.';
    END IF;
    PERFORM @extschema@.idem_sql_arg_scope(scope);
    PERFORM @extschema@.idem_sql_outbox_check_key_bytes(octet_length(topic) + octet_length(key) + octet_length(scope));
    RETURN @extschema@.idem_sql_outbox_available(now_ts, delay);
END
$fn$;

-- one element of a batch emit, checked as src/outbox.c checks it
CREATE FUNCTION @extschema@.idem_sql_outbox_check_element(topic text, k text, p jsonb, t text,
                                                        h jsonb, scope text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF k IS NULL THEN
        RAISE EXCEPTION 'keys must not contain nulls' USING ERRCODE = '22004';
    END IF;
    PERFORM @extschema@.idem_sql_outbox_check_name(k, 'key');
    PERFORM @extschema@.idem_sql_outbox_check_key_bytes(octet_length(topic) + octet_length(k) + octet_length(scope));
    IF p IS NULL THEN
        RAISE EXCEPTION 'payloads must not contain nulls'
            USING ERRCODE = '22004', HINT = 'Pass ''null''::jsonb for a message without a payload.';
    END IF;
    IF t IS NOT NULL THEN
        PERFORM @extschema@.idem_sql_outbox_check_name(t, 'type');
    END IF;
    IF h IS NOT NULL AND jsonb_typeof(h) <> 'object' THEN
        RAISE EXCEPTION 'headers must be a JSON object'
            USING ERRCODE = '22023', HINT = 'Pass NULL for a message without headers.';
    END IF;
END
$fn$;

-- idempotency.outbox_notify (bool, default on), parsed as the C setting is
CREATE FUNCTION @extschema@.idem_sql_outbox_notify_on(value text)
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF value IS NULL OR value = '' THEN
        RETURN true;
    END IF;
    RETURN value::boolean;
EXCEPTION WHEN invalid_text_representation THEN
    RAISE EXCEPTION 'parameter "idempotency.outbox_notify" requires a Boolean value'
        USING ERRCODE = '22023';
END
$fn$;

--@ idem_outbox_emit(text, text, jsonb, text, jsonb, text, interval)
-- One INSERT under the key's lock, as the C edition's (src/outbox.c).  The
-- path of a valid emit is a few simple expressions, which PL/pgSQL
-- evaluates without the executor (a PERFORM, or a call of a PL/pgSQL or SQL
-- function, costs about as much as the INSERT): one test of all the
-- arguments, and the checks in the C edition's order only when it fails (or
-- for a delay).  The order trigger notifies the relays.
LANGUAGE plpgsql
AS $body$
DECLARE
    now_ts constant timestamptz := clock_timestamp();
    available timestamptz;
    hash bigint;
    v bigint;
    message_id uuid;
    done text;
BEGIN
    -- (topic + key + scope <= 208 bytes: each fits idempotency.max_key_length
    -- unset (255), and all three the index at any block size; a NULL fails)
    IF NOT COALESCE(octet_length(topic) > 0 AND octet_length(key) > 0 AND payload IS NOT NULL
                    AND octet_length(topic) + octet_length(key) + octet_length(scope) <= 208
                    AND (type IS NULL OR octet_length(type) BETWEEN 1 AND 255)
                    AND (headers IS NULL OR jsonb_typeof(headers) = 'object')
                    AND delay IS NULL AND current_setting('idempotency.max_key_length', true) IS NULL, false)
       OR row_security_active('@extschema@.idem_outbox'::regclass) THEN
        available := @extschema@.idem_sql_outbox_check_emit(topic, key, payload, type, headers, scope,
                                                            delay, now_ts);
        -- under tenant isolation, another tenant's scope is refused before any lock
        IF row_security_active('@extschema@.idem_outbox'::regclass) THEN
            PERFORM @extschema@.idem_sql_require_tenant('@extschema@.idem_outbox'::regclass, scope, 'emit');
        END IF;
    END IF;

    -- idem_sql_outbox_lock_scope(seed, 1), then the key's lock, inline: the
    -- scope's lock, the key's, the trigger's note, in this order
    hash := hashtextextended(key, hashtextextended(topic, hashtextextended(scope, 0)));
    IF COALESCE(current_setting('idem_sql.outbox_locked', true), '') = '' THEN
        -- the transaction's first outbox lock: no scope of it is held in ExclusiveLock
        done := concat(set_config('idem_sql.outbox_locked', '0', true),
                       pg_advisory_xact_lock_shared(7458, (hashtextextended(scope, 0) >> 32)::integer),
                       pg_advisory_xact_lock(7457, (hash >> 32)::integer),
                       set_config('idem_sql.outbox_key', hash::text, true));
    -- (COALESCE: in NULL AND x, x is evaluated, and would take the lock)
    ELSIF COALESCE(strpos(current_setting('idem_sql.outbox_bulk', true),
                          concat(',', (hashtextextended(scope, 0) >> 32)::integer, ',')) > 0, false)
          AND pg_try_advisory_xact_lock(7458, (hashtextextended(scope, 0) >> 32)::integer) THEN
        -- the scope's lock in ExclusiveLock: no key lock
        done := set_config('idem_sql.outbox_key', concat('B', hashtextextended(scope, 0)), true);
    ELSE
        done := concat(pg_advisory_xact_lock_shared(7458, (hashtextextended(scope, 0) >> 32)::integer),
                       pg_advisory_xact_lock(7457, (hash >> 32)::integer),
                       set_config('idem_sql.outbox_key', hash::text, true));
    END IF;

    -- the id (new_uuid_v7), never below the backend's last (the ms from the
    -- epoch in float8: off by one at worst, as a clock may be)
    v := GREATEST((floor(date_part('epoch', now_ts) * 1000::float8)::bigint << 12)
                  + ((date_part('microseconds', now_ts)::bigint % 1000) * 4096) / 1000,
                  CASE WHEN current_setting('idem_sql.outbox_uuid', true) <> ''
                       THEN current_setting('idem_sql.outbox_uuid', true)::bigint + 1 END);
    message_id := (lpad(to_hex(((v >> 12) << 16) | 28672 | (v & 4095)), 16, '0')
                   || right(gen_random_uuid()::text, 17)
                   || left(set_config('idem_sql.outbox_uuid', v::text, false), 0))::uuid;

    -- seq: its default, drawn now, after the lock
    INSERT INTO @extschema@.idem_outbox (id, created_at, available_at, updated_at, scope,
                                         aggregatetype, aggregateid, type, headers, payload)
    VALUES (message_id, now_ts, COALESCE(available, now_ts), now_ts, scope, topic, key, type, headers, payload);
    RETURN message_id;
END
$body$;

--@ idem_outbox_emit_batch(text, text[], jsonb[], text[], jsonb[], text, interval)
-- Everything is checked before the first INSERT (the first bad element
-- found by one query, then its error); the keys' locks in the order of
-- their hashes, so that two batches never deadlock; one INSERT of the rows
-- in array order; the order trigger notifies the relays.
LANGUAGE plpgsql
AS $body$
DECLARE
    now_ts constant timestamptz := clock_timestamp();
    max_len integer := 255;
    n integer;
    available timestamptz := now_ts;
    bad bigint;
    seed bigint;
    hashes integer[];
    first_id bigint;
    ids uuid[];
    done text;
BEGIN
    IF topic IS NULL THEN
        RAISE EXCEPTION 'topic must not be null' USING ERRCODE = '22004';
    END IF;
    IF current_setting('idempotency.max_key_length', true) IS NOT NULL THEN
        max_len := @extschema@.idem_sql_max_key_length();
    END IF;
    IF octet_length(topic) NOT BETWEEN 1 AND max_len THEN
        PERFORM @extschema@.idem_sql_outbox_check_name(topic, 'topic');
    END IF;
    IF keys IS NULL THEN
        RAISE EXCEPTION 'keys must not be null' USING ERRCODE = '22004';
    END IF;
    IF payloads IS NULL THEN
        RAISE EXCEPTION 'payloads must not be null' USING ERRCODE = '22004';
    END IF;
    IF array_ndims(keys) > 1 THEN
        RAISE EXCEPTION 'keys must be a one-dimensional array' USING ERRCODE = '22023';
    END IF;
    IF array_ndims(payloads) > 1 THEN
        RAISE EXCEPTION 'payloads must be a one-dimensional array' USING ERRCODE = '22023';
    END IF;
    IF array_ndims(types) > 1 THEN
        RAISE EXCEPTION 'types must be a one-dimensional array' USING ERRCODE = '22023';
    END IF;
    IF array_ndims(headers) > 1 THEN
        RAISE EXCEPTION 'headers must be a one-dimensional array' USING ERRCODE = '22023';
    END IF;
    n := cardinality(keys);
    IF n > 100000 THEN
        RAISE EXCEPTION 'a batch of % messages is more than the % allowed', n, 100000
            USING ERRCODE = '54000', HINT = 'Emit them in several calls in the same transaction.';
    END IF;
    IF cardinality(payloads) <> n THEN
        RAISE EXCEPTION 'payloads must have as many elements as keys'
            USING ERRCODE = '2202E',
                  DETAIL = format('keys has %s elements and payloads %s.', n, cardinality(payloads));
    END IF;
    IF cardinality(types) <> n THEN
        RAISE EXCEPTION 'types must have as many elements as keys'
            USING ERRCODE = '2202E',
                  DETAIL = format('keys has %s elements and types %s.', n, cardinality(types));
    END IF;
    IF cardinality(headers) <> n THEN
        RAISE EXCEPTION 'headers must have as many elements as keys'
            USING ERRCODE = '2202E',
                  DETAIL = format('keys has %s elements and headers %s.', n, cardinality(headers));
    END IF;
    IF scope IS NULL OR octet_length(scope) > max_len THEN
        PERFORM @extschema@.idem_sql_arg_scope(scope);
    END IF;
    IF delay IS NOT NULL THEN
        available := @extschema@.idem_sql_outbox_available(now_ts, delay);
    END IF;

    -- the first element that may be bad, then the errors from there on
    SELECT u.i INTO bad
    FROM ROWS FROM (unnest(keys), unnest(payloads), unnest(types), unnest(headers)) WITH ORDINALITY u(k, p, t, h, i)
    WHERE u.k IS NULL OR octet_length(u.k) NOT BETWEEN 1 AND max_len
       OR octet_length(topic) + octet_length(u.k) + octet_length(scope) > 208
       OR u.p IS NULL OR octet_length(u.t) NOT BETWEEN 1 AND max_len
       OR jsonb_typeof(u.h) <> 'object'
    ORDER BY u.i
    LIMIT 1;
    IF FOUND THEN
        PERFORM @extschema@.idem_sql_outbox_check_element(topic, u.k, u.p, u.t, u.h, scope)
        FROM ROWS FROM (unnest(keys), unnest(payloads), unnest(types), unnest(headers)) WITH ORDINALITY u(k, p, t, h, i)
        WHERE u.i >= bad
        ORDER BY u.i;
    END IF;

    IF row_security_active('@extschema@.idem_outbox'::regclass) THEN
        PERFORM @extschema@.idem_sql_require_tenant('@extschema@.idem_outbox'::regclass, scope, 'emit');
    END IF;
    IF n = 0 THEN
        RETURN '{}'::uuid[];
    END IF;

    -- the keys' locks, in the order of their hashes, each once
    seed := hashtextextended(scope, 0);
    hashes := ARRAY(SELECT DISTINCT (hashtextextended(k, hashtextextended(topic, seed)) >> 32)::integer
                    FROM unnest(keys) k ORDER BY 1);
    IF @extschema@.idem_sql_outbox_lock_scope(seed, cardinality(hashes)) THEN
        -- the trigger finds the scope held in ExclusiveLock
        done := set_config('idem_sql.outbox_key', concat('B', seed), true);
    ELSE
        PERFORM pg_advisory_xact_lock(7457, h) FROM unnest(hashes) h;
        -- the trigger finds the rows' keys locked
        done := set_config('idem_sql.outbox_key', concat('b', seed), true);
    END IF;
    hashes := NULL;

    first_id := @extschema@.idem_sql_outbox_uuid_first(now_ts, n);
    ids := ARRAY(SELECT @extschema@.idem_sql_outbox_uuid(first_id + g) FROM generate_series(0, n - 1) g);
    INSERT INTO @extschema@.idem_outbox (id, created_at, available_at, updated_at, scope,
                                         aggregatetype, aggregateid, type, headers, payload)
    SELECT ids[u.i], now_ts, available, now_ts, scope, topic, u.k, u.t, u.h, u.p
    FROM ROWS FROM (unnest(keys), unnest(payloads), unnest(types), unnest(headers)) WITH ORDINALITY u(k, p, t, h, i)
    ORDER BY u.i;
    -- 'b' says nothing once the rows are in
    IF current_setting('idem_sql.outbox_key', true) = concat('b', seed) THEN
        done := set_config('idem_sql.outbox_key', '', true);
    END IF;
    RETURN ids;
END
$body$;

--@ idem_outbox_lock_key(text, text, text)
-- The emits' lock on a key, for idem_outbox_retry; the tenant first, as an
-- emit's.
LANGUAGE plpgsql
AS $body$
DECLARE
    seed constant bigint := hashtextextended(scope, 0);
    hash constant bigint := hashtextextended(key, hashtextextended(topic, seed));
    done text;
BEGIN
    IF row_security_active('@extschema@.idem_outbox'::regclass) THEN
        PERFORM @extschema@.idem_sql_require_tenant('@extschema@.idem_outbox'::regclass, scope, 'emit');
    END IF;
    IF @extschema@.idem_sql_outbox_lock_scope(seed, 1) THEN
        done := set_config('idem_sql.outbox_key', concat('B', seed), true);
    ELSE
        done := concat(pg_advisory_xact_lock(7457, (hash >> 32)::integer),
                       set_config('idem_sql.outbox_key', hash::text, true));
    END IF;
END
$body$;

--@ idem_outbox_counted(text, bigint)
-- The relay functions' counts.  The SQL edition keeps no counters (see
-- idem_stats), but an unrecognized name or a negative n is still the C
-- edition's error, so that a misspelt call shows in the tests.
LANGUAGE plpgsql
AS $body$
BEGIN
    IF counter <> ALL ('{published,retried,dead,taken_over}'::text[]) THEN
        RAISE EXCEPTION 'unrecognized outbox counter "%"', counter USING ERRCODE = '22023';
    END IF;
    IF n < 0 THEN
        RAISE EXCEPTION 'n must not be negative' USING ERRCODE = '22023';
    END IF;
END
$body$;

--@ idem_outbox_next_seq()
-- nextval of idem_outbox_seq, remembered for the order trigger (C:
-- default_seq), under the caller's privileges on the sequence.  A
-- SQL-standard body (bound at creation, so no SET): the planner inlines it
-- into the INSERT as the column's default.
LANGUAGE sql
RETURN pg_catalog.set_config('idem_sql.outbox_seq',
                             pg_catalog.nextval('@extschema@.idem_outbox_seq'::pg_catalog.regclass)::text,
                             true)::bigint;

--@ idem_outbox_order()
-- BEFORE INSERT ON idem_outbox FOR EACH ROW (src/outbox.c, "The order
-- trigger"): a row whose seq its default drew takes its key's lock, as an
-- emit does, and then draws seq again, unless the transaction holds the
-- lock already (an emit's row: six simple expressions).  It notifies the
-- relays for every such row, the emits' included.
LANGUAGE plpgsql
AS $body$
DECLARE
    seed bigint;
    hash bigint;
    keys_locked integer;
    done text;
BEGIN
    -- a seq of the row's own is kept (a NULL one is drawn as a default).
    -- The last one drawn is not forgotten here (C forgets it once used): a
    -- row that brings that very value is taken for a drawn one, which costs
    -- a lock and a new seq
    IF TG_WHEN <> 'BEFORE' OR TG_LEVEL <> 'ROW' OR TG_OP <> 'INSERT'
       OR (NEW.seq IS NOT NULL AND NEW.seq::text IS DISTINCT FROM current_setting('idem_sql.outbox_seq', true)) THEN
        IF TG_WHEN <> 'BEFORE' OR TG_LEVEL <> 'ROW' OR TG_OP <> 'INSERT' THEN
            RAISE EXCEPTION 'function idem_outbox_order must be fired BEFORE INSERT FOR EACH ROW'
                USING ERRCODE = '39P01';
        END IF;
        RETURN NEW;
    END IF;
    done := CASE WHEN COALESCE(current_setting('idempotency.outbox_notify', true), '') = ''
                      OR @extschema@.idem_sql_outbox_notify_on(current_setting('idempotency.outbox_notify', true))
                 THEN pg_notify('idem_outbox', '')::text END;

    -- an emit's row: its key locked before the INSERT, and seq drawn after
    IF NEW.seq IS NOT NULL
       AND (CASE current_setting('idem_sql.outbox_key', true)
                WHEN hashtextextended(NEW.aggregateid, hashtextextended(NEW.aggregatetype,
                                                                        hashtextextended(NEW.scope, 0)))::text
                THEN pg_try_advisory_xact_lock(7457, (hashtextextended(NEW.aggregateid, hashtextextended(NEW.aggregatetype,
                                                          hashtextextended(NEW.scope, 0))) >> 32)::integer)
                ELSE false END) THEN
        RETURN NEW;
    END IF;
    -- NOT NULL columns: a NULL goes on to the executor's own error
    IF NEW.scope IS NULL OR NEW.aggregatetype IS NULL OR NEW.aggregateid IS NULL THEN
        RETURN NEW;
    END IF;
    seed := hashtextextended(NEW.scope, 0);
    hash := hashtextextended(NEW.aggregateid, hashtextextended(NEW.aggregatetype, seed));
    IF (CASE current_setting('idem_sql.outbox_key', true)
            WHEN hash::text THEN pg_try_advisory_xact_lock(7457, (hash >> 32)::integer)
            WHEN concat('b', seed) THEN pg_try_advisory_xact_lock(7457, (hash >> 32)::integer)
            WHEN concat('B', seed) THEN pg_try_advisory_xact_lock(7458, (seed >> 32)::integer)
            ELSE false END) THEN
        -- the key's lock is held (a batch emit's row, or a seq given as NULL)
        IF NEW.seq IS NOT NULL THEN
            RETURN NEW;
        END IF;
    ELSE
        -- another tenant's row: the policy refuses it, before any lock
        IF row_security_active(TG_RELID)
           AND @extschema@.idem_sql_tenant_check(TG_RELID, NEW.scope) = 'outside' THEN
            RETURN NEW;
        END IF;
        IF COALESCE(current_setting('idem_sql.outbox_locked', true), '') = '' THEN
            -- the transaction's first outbox lock (idem_sql_outbox_lock_scope
            -- inline): the scope's lock, the key's, the notes
            done := concat(pg_advisory_xact_lock_shared(7458, (seed >> 32)::integer),
                           pg_advisory_xact_lock(7457, (hash >> 32)::integer),
                           set_config('idem_sql.outbox_locked', '1', true),
                           set_config('idem_sql.outbox_key', hash::text, true));
            NEW.seq := nextval('@extschema@.idem_outbox_seq'::regclass);
            RETURN NEW;
        END IF;
        keys_locked := current_setting('idem_sql.outbox_locked', true)::integer;
        -- past 256 key locks, the scope's lock if it is free at once
        IF @extschema@.idem_sql_outbox_lock_scope(seed, CASE WHEN keys_locked < 256 THEN 1
                                                             ELSE keys_locked + 1 END) THEN
            done := set_config('idem_sql.outbox_key', concat('B', seed), true);
        ELSE
            done := concat(pg_advisory_xact_lock(7457, (hash >> 32)::integer),
                           set_config('idem_sql.outbox_locked', (keys_locked + 1)::text, true),
                           set_config('idem_sql.outbox_key', hash::text, true));
        END IF;
    END IF;
    -- after the lock
    NEW.seq := nextval('@extschema@.idem_outbox_seq'::regclass);
    RETURN NEW;
END
$body$;
