-- Purge finds expired records through the index on purge_after, which
-- completion never changes: completions stay HOT updates, purge scans the
-- index (not the table), and a record whose long work moved expires_at past
-- purge_after is kept until expires_at.  Keys are prefixed "pi.".
BEGIN;
SELECT plan(12);

SELECT pg_stat_force_next_flush();
DELETE FROM idempotency_records;
DELETE FROM idem_inbox;

-- purge_after is created_at + retention, and completion leaves it alone -------------------------
SELECT idem_claim('pi.a', '\xaa'::bytea, '1 hour', retention => '1 hour');
CREATE TEMP TABLE before_completion AS SELECT * FROM idem_lookup('pi.a');
SELECT is((SELECT purge_after - created_at FROM before_completion), interval '1 hour',
          'a new record can be purged no earlier than created_at + retention');
SELECT is((SELECT purge_after FROM before_completion), (SELECT expires_at FROM before_completion),
          'while processing, purge_after and expires_at agree');
SELECT pg_sleep(0.05);
SELECT idem_complete('pi.a', (SELECT token FROM before_completion), '{"ok": 1}');
SELECT is((SELECT purge_after FROM idem_lookup('pi.a')), (SELECT purge_after FROM before_completion),
          'completion does not move purge_after');
SELECT ok((SELECT expires_at > purge_after FROM idem_lookup('pi.a')),
          'completion moves expires_at past purge_after (retention counts from completion)');

-- completions, failures and checkpoints are HOT updates --------------------------------------------
CREATE TEMP TABLE hot_before AS
SELECT pg_stat_get_xact_tuples_updated('idempotency_records'::regclass) AS updated,
       pg_stat_get_xact_tuples_hot_updated('idempotency_records'::regclass) AS hot;
SELECT count(*) FROM (
    SELECT idem_complete('pi.h' || g, (SELECT c.token FROM idem_claim('pi.h' || g, '\x01'::bytea, '1 hour') c),
                         '{"order_id": 1}', 201)
    FROM generate_series(1, 50) g) done;
SELECT idem_claim('pi.f', '\x01'::bytea, '1 hour');
SELECT idem_checkpoint('pi.f', (SELECT token FROM idem_lookup('pi.f')), 'step 1');
SELECT idem_fail('pi.f', (SELECT token FROM idem_lookup('pi.f')), '{"e": 1}');
SELECT is(pg_stat_get_xact_tuples_updated('idempotency_records'::regclass) - (SELECT updated FROM hot_before),
          52::bigint, '52 updates: 50 completions, a checkpoint, a failure');
SELECT is(pg_stat_get_xact_tuples_hot_updated('idempotency_records'::regclass) - (SELECT hot FROM hot_before),
          52::bigint, 'all of them HOT: no index entry is written by finishing a record');

-- a record whose purge_after has passed but expires_at has not is kept ---------------------------
SELECT idem_claim('pi.long', '\x01'::bytea, '1 hour', retention => '200 ms');
SELECT pg_sleep(0.3);
SELECT idem_complete('pi.long', (SELECT token FROM idem_lookup('pi.long')), '{"ok": 1}');
SELECT ok((SELECT purge_after < clock_timestamp() AND expires_at > clock_timestamp()
           FROM idem_lookup('pi.long')),
          'long work: purge_after has passed, expires_at (completion + retention) has not');
SELECT is(idem_purge(), 0::bigint, 'purge keeps a record that finished less than its retention ago');
SELECT is((SELECT status::text FROM idem_lookup('pi.long')), 'succeeded', 'and it is still replayed');
SELECT pg_sleep(0.25);

-- purge reads the index, never the whole table --------------------------------------------------
CREATE TEMP TABLE scans_before AS
SELECT pg_stat_get_xact_numscans('idempotency_records'::regclass) AS table_scans,
       pg_stat_get_xact_numscans('idempotency_records_purge_after'::regclass) AS index_scans;
SELECT is(idem_purge(), 1::bigint, 'once expires_at has passed, the record goes');
SELECT cmp_ok(pg_stat_get_xact_numscans('idempotency_records_purge_after'::regclass),
              '>', (SELECT index_scans FROM scans_before), 'purge scanned the purge_after index');
SELECT is(pg_stat_get_xact_numscans('idempotency_records'::regclass), (SELECT table_scans FROM scans_before),
          'and did not scan the table sequentially');

SELECT * FROM finish();
-- purges advanced the token epoch, which no ROLLBACK undoes: later files count tokens from 1
SELECT setval('idem_token_epoch', 1, false);
ROLLBACK;
