--
-- Bad input for every function, and the extension's own errors.
--
-- Every argument is checked before anything is read or written:
--   22004  a NULL where a value is required
--   22023  an empty key, a non-positive interval or token, an empty fingerprint,
--          a status idem_resolve cannot set
--   22001  a key, scope or fingerprint that is too long
--   IK002  a stale fencing token, IK003 a record in the wrong state,
--   IK004  an unknown key
-- After each failing call the test shows that no record changed.
--

-- Errors are shown as "ERROR:  <SQLSTATE>: <message>" with DETAIL and HINT.
-- '1 day -25 hours' is negative on every day only where no day has 25
-- hours: pg_regress's PST8PDT has one a year
SET TimeZone = 'UTC';
\i sql/include/expect_error.sql
-- This test's records all have keys starting with 'e-'.  "saved" holds a copy
-- of them; the view "unchanged" compares the table with that copy.
DELETE FROM idempotency_records WHERE key LIKE 'e-%';
CREATE TEMP TABLE saved AS SELECT * FROM idempotency_records WHERE false;
CREATE FUNCTION pg_temp.save() RETURNS bigint LANGUAGE sql AS $$
    DELETE FROM saved;
    INSERT INTO saved SELECT * FROM idempotency_records WHERE key LIKE 'e-%';
    SELECT count(*) FROM saved;
$$;
CREATE TEMP VIEW unchanged AS
SELECT (SELECT count(*) FROM idempotency_records WHERE key LIKE 'e-%') AS records,
       NOT EXISTS (
           (SELECT * FROM idempotency_records WHERE key LIKE 'e-%'
            EXCEPT ALL SELECT * FROM saved)
           UNION ALL
           (SELECT * FROM saved
            EXCEPT ALL SELECT * FROM idempotency_records WHERE key LIKE 'e-%')
       ) AS unchanged;

-- Records to act on:
--   e-proc   processing, token 1, live lease
--   e-done   succeeded, token 1
--   e-taken  processing, token 2 (token 1's lease expired and was taken over)
SELECT outcome, token FROM idem_claim('e-proc', idem_fingerprint('proc'::text), '1 hour');
SELECT outcome, token FROM idem_claim('e-done', idem_fingerprint('done'::text), '1 hour');
SELECT idem_complete('e-done', 1, '{"ok": true}', 200);
SELECT outcome, token FROM idem_claim('e-taken', idem_fingerprint('taken'::text), '10 ms');
SELECT pg_sleep(0.1);
SELECT outcome, token FROM idem_claim('e-taken', idem_fingerprint('taken'::text), '1 hour');
SELECT key, token, status FROM idempotency_records WHERE key LIKE 'e-%' ORDER BY key;
SELECT pg_temp.save() AS saved;

--
-- idem_claim(key, fingerprint, lease, scope, retention, wait)
--

-- NULLs (lease and retention may be NULL: they take the settings' defaults)
SELECT pg_temp.expect_error($$SELECT idem_claim(NULL, '\x01', '1 hour')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_claim('e-new', NULL, '1 hour')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_claim('e-new', '\x01', '1 hour', scope => NULL)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_claim('e-new', '\x01', '1 hour', wait => NULL)$$);
TABLE unchanged;

-- keys: empty, 255 bytes (the longest), 256 bytes; the limit counts bytes
SELECT pg_temp.expect_error($$SELECT idem_claim('', '\x01', '1 hour')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_claim('e-' || repeat('k', 254), '\x01', '1 hour')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_claim('e-' || repeat(chr(233), 127), '\x01', '1 hour')$$);
TABLE unchanged;
SELECT octet_length('e-' || repeat(chr(233), 127)) AS bytes, length('e-' || repeat(chr(233), 127)) AS characters;
SELECT outcome, token, octet_length(k) AS key_bytes
FROM (SELECT 'e-' || repeat('k', 253) AS k) s, idem_claim(k, '\x01', '1 hour');
SELECT outcome, token, octet_length(k) AS key_bytes
FROM (SELECT 'e-' || repeat(chr(233), 126) || 'k' AS k) s, idem_claim(k, '\x01', '1 hour');
SELECT pg_temp.save() AS saved;

-- scopes: empty is the default scope; 255 bytes is the longest
SELECT pg_temp.expect_error($$SELECT idem_claim('e-new', '\x01', '1 hour', scope => repeat('s', 256))$$);
TABLE unchanged;
SELECT outcome, token FROM idem_claim('e-scoped', '\x01', '1 hour', scope => repeat('s', 255));
SELECT key, octet_length(scope) AS scope_bytes, token FROM idem_lookup('e-scoped', repeat('s', 255));
SELECT pg_temp.save() AS saved;

-- idempotency.max_key_length lowers the limit, for keys and scopes alike
SET idempotency.max_key_length = 10;
SELECT pg_temp.expect_error($$SELECT idem_claim('e-456789012', '\x01', '1 hour')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_claim('e-new', '\x01', '1 hour', scope => 'scope-89012')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT * FROM idem_lookup('e-456789012')$$);
SELECT outcome, token FROM idem_claim('e-45678901', '\x01', '1 hour', scope => 'scope-8901');
RESET idempotency.max_key_length;
SELECT pg_temp.save() AS saved;

-- fingerprints: empty, 64 bytes (the longest), 65 bytes
SELECT pg_temp.expect_error($$SELECT idem_claim('e-new', '', '1 hour')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_claim('e-new', decode(repeat('ab', 65), 'hex'), '1 hour')$$);
TABLE unchanged;
SELECT outcome, token FROM idem_claim('e-fp64', decode(repeat('ab', 64), 'hex'), '1 hour');
SELECT outcome, token FROM idem_claim('e-fp1', '\x01', '1 hour');
SELECT key, encode(fingerprint, 'hex') AS fingerprint, octet_length(fingerprint) AS fingerprint_bytes
FROM idempotency_records WHERE key IN ('e-fp64', 'e-fp1') ORDER BY key;
SELECT pg_temp.save() AS saved;

-- leases: zero, negative, and positive parts adding up to a negative span
SELECT pg_temp.expect_error($$SELECT idem_claim('e-new', '\x01', '0')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_claim('e-new', '\x01', '-1 second')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_claim('e-new', '\x01', '1 day -25 hours')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_claim('e-new', '\x01', '300000 years')$$);
TABLE unchanged;
-- the same checks apply to a claim of an existing key
SELECT pg_temp.expect_error($$SELECT idem_claim('e-proc', idem_fingerprint('proc'::text), '0')$$);
TABLE unchanged;

-- retention: the same rules
SELECT pg_temp.expect_error($$SELECT idem_claim('e-new', '\x01', '1 hour', retention => '0')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_claim('e-new', '\x01', '1 hour', retention => '-1 day')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_claim('e-new', '\x01', '1 hour', retention => '1 day -25 hours')$$);
TABLE unchanged;

-- Infinite intervals, which PostgreSQL has from 17 on: an infinite lease
-- could never be taken over after a crash, an infinite retention never
-- purged, so each is refused with 22023.  On 15 'infinity' is no interval
-- (22007) and the call is never made: only "refused" is shown, so that 15
-- and 17 compare against the same lines.
CREATE FUNCTION pg_temp.refused_if_infinite(sql text) RETURNS text LANGUAGE plpgsql AS $f$
DECLARE
    st text;
    msg text;
BEGIN
    BEGIN
        EXECUTE sql;
        RETURN 'accepted';
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
    END;
    IF (st = '22007' AND current_setting('server_version_num')::int < 170000)
       OR (st = '22023' AND msg LIKE '% must be finite') THEN
        RETURN 'refused';
    END IF;
    RETURN st || ': ' || msg;
END
$f$;
SELECT input, pg_temp.refused_if_infinite(sql) AS outcome FROM (VALUES
    ('claim, lease infinity',      $$SELECT idem_claim('e-new', '\x01', 'infinity')$$),
    ('claim, retention infinity',  $$SELECT idem_claim('e-new', '\x01', '1 hour', retention => 'infinity')$$),
    ('checkpoint, extend_lease infinity',
     $$SELECT idem_checkpoint('e-proc', 1, 'rp', extend_lease => 'infinity')$$),
    ('inbox, retention infinity',  $$SELECT idem_inbox_accept('e-inbox', 'm', 'infinity')$$)
) AS c(input, sql);
TABLE unchanged;
SELECT count(*) AS inbox_rows FROM idem_inbox WHERE consumer = 'e-inbox';

-- a different request under a used key
SELECT pg_temp.expect_error($$SELECT idem_claim('e-proc', idem_fingerprint('other'::text), '1 hour')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_claim('e-done', idem_fingerprint('other'::text), '1 hour')$$);
TABLE unchanged;

--
-- idem_complete(key, token, result, response_code, scope)
--
SELECT pg_temp.expect_error($$SELECT idem_complete(NULL, 1)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_complete('e-proc', NULL)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_complete('e-proc', 1, scope => NULL)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_complete('', 1)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_complete(repeat('k', 256), 1)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_complete('e-proc', 1, scope => repeat('s', 256))$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_complete('e-proc', 0)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_complete('e-proc', -1)$$);
TABLE unchanged;
-- stale token: an earlier owner's, or one never issued
SELECT pg_temp.expect_error($$SELECT idem_complete('e-taken', 1, '{"ok": true}')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_complete('e-proc', 2, '{"ok": true}')$$);
TABLE unchanged;
-- unknown key, and a known key in another scope
SELECT pg_temp.expect_error($$SELECT idem_complete('e-missing', 1)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_complete('e-proc', 1, scope => 'other')$$);
TABLE unchanged;
-- already succeeded, with another result or response code
SELECT pg_temp.expect_error($$SELECT idem_complete('e-done', 1, '{"ok": false}', 200)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_complete('e-done', 1, '{"ok": true}', 201)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_complete('e-done', 1, '{"ok": true}')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_complete('e-done', 1)$$);
TABLE unchanged;

--
-- idem_fail(key, token, error, retryable, scope, response_code)
--
SELECT pg_temp.expect_error($$SELECT idem_fail(NULL, 1, '{}')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_fail('e-proc', NULL, '{}')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_fail('e-proc', 1, NULL)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_fail('e-proc', 1, '{}', retryable => NULL)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_fail('e-proc', 1, '{}', scope => NULL)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_fail('', 1, '{}')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_fail(repeat('k', 256), 1, '{}')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_fail('e-proc', 1, '{}', scope => repeat('s', 256))$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_fail('e-proc', 0, '{}')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_fail('e-proc', -9223372036854775808, '{}')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_fail('e-taken', 1, '{}')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_fail('e-missing', 1, '{}')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_fail('e-done', 1, '{}')$$);
TABLE unchanged;

--
-- idem_checkpoint(key, token, recovery_point, extend_lease, scope)
-- (recovery_point and extend_lease may be NULL: the stored value is kept)
--
SELECT pg_temp.expect_error($$SELECT idem_checkpoint(NULL, 1, 'rp')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_checkpoint('e-proc', NULL, 'rp')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_checkpoint('e-proc', 1, 'rp', scope => NULL)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_checkpoint('', 1, 'rp')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_checkpoint(repeat('k', 256), 1, 'rp')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_checkpoint('e-proc', 1, 'rp', scope => repeat('s', 256))$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_checkpoint('e-proc', 0, 'rp')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_checkpoint('e-proc', 1, 'rp', extend_lease => '0')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_checkpoint('e-proc', 1, 'rp', extend_lease => '-1 hour')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_checkpoint('e-proc', 1, 'rp', extend_lease => '1 day -25 hours')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_checkpoint('e-taken', 1, 'rp')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_checkpoint('e-missing', 1, 'rp')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_checkpoint('e-done', 1, 'rp')$$);
TABLE unchanged;

--
-- idem_release(key, token, scope)
--
SELECT pg_temp.expect_error($$SELECT idem_release(NULL, 1)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_release('e-proc', NULL)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_release('e-proc', 1, NULL)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_release('', 1)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_release(repeat('k', 256), 1)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_release('e-proc', 1, repeat('s', 256))$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_release('e-proc', 0)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_release('e-taken', 1)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_release('e-missing', 1)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_release('e-done', 1)$$);
TABLE unchanged;

--
-- idem_mark_unknown(key, token, detail, scope)
--
SELECT pg_temp.expect_error($$SELECT idem_mark_unknown(NULL, 1, '{}')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_mark_unknown('e-proc', NULL, '{}')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_mark_unknown('e-proc', 1, NULL)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_mark_unknown('e-proc', 1, '{}', NULL)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_mark_unknown('', 1, '{}')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_mark_unknown(repeat('k', 256), 1, '{}')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_mark_unknown('e-proc', 1, '{}', repeat('s', 256))$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_mark_unknown('e-proc', -1, '{}')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_mark_unknown('e-taken', 1, '{}')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_mark_unknown('e-missing', 1, '{}')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_mark_unknown('e-done', 1, '{}')$$);
TABLE unchanged;

--
-- idem_resolve(key, status, result, response_code, scope, retryable)
--
SELECT pg_temp.expect_error($$SELECT idem_resolve(NULL, 'succeeded')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_resolve('e-proc', NULL)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_resolve('e-proc', 'failed', scope => NULL)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_resolve('e-proc', 'failed', retryable => NULL)$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_resolve('', 'succeeded')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_resolve(repeat('k', 256), 'succeeded')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_resolve('e-proc', 'succeeded', scope => repeat('s', 256))$$);
TABLE unchanged;
-- statuses it cannot resolve to
SELECT pg_temp.expect_error($$SELECT idem_resolve('e-proc', 'processing')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_resolve('e-proc', 'unknown')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_resolve('e-proc', 'done')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_resolve('e-proc', 'succeeded', '{}', retryable => true)$$);
TABLE unchanged;
-- records that are not unknown, and an unknown key
SELECT pg_temp.expect_error($$SELECT idem_resolve('e-proc', 'succeeded', '{}')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_resolve('e-done', 'failed', '{}')$$);
TABLE unchanged;
SELECT pg_temp.expect_error($$SELECT idem_resolve('e-missing', 'succeeded', '{}')$$);
TABLE unchanged;

--
-- idem_lookup(key, scope): an unknown key is no row, not an error
--
SELECT pg_temp.expect_error($$SELECT * FROM idem_lookup(NULL)$$);
SELECT pg_temp.expect_error($$SELECT * FROM idem_lookup('e-proc', NULL)$$);
SELECT pg_temp.expect_error($$SELECT * FROM idem_lookup('')$$);
SELECT pg_temp.expect_error($$SELECT * FROM idem_lookup(repeat('k', 256))$$);
SELECT pg_temp.expect_error($$SELECT * FROM idem_lookup('e-proc', repeat('s', 256))$$);
SELECT count(*) AS rows FROM idem_lookup('e-missing');
SELECT count(*) AS rows FROM idem_lookup('e-' || repeat('k', 253));

-- The records after all of the above: only the successful calls left a trace.
SELECT left(key, 12) AS key, octet_length(key) AS key_bytes, octet_length(scope) AS scope_bytes,
       token, status, attempts, result, error, recovery_point
FROM idempotency_records WHERE key LIKE 'e-%' ORDER BY key COLLATE "C", scope;
TABLE unchanged;

DELETE FROM idempotency_records WHERE key LIKE 'e-%';
SELECT setval('idem_token_epoch', 1, false) AS epoch_reset;  -- a DELETE moves the epoch
