# Crash recovery: the server is stopped with "immediate" (no shutdown
# checkpoint: recovery replays the WAL) while
#   - two sessions run a stream of committed work: one-transaction claims with
#     a business row, and multi-phase work (claim, checkpoint, complete, each
#     committed on its own, several keys at different stages at once);
#   - six sessions are in the middle of a transaction: an uncommitted claim
#     with its business row, a claim and its completion, a takeover, the
#     completion of a committed multi-phase claim, inbox accepts, a
#     state-machine move;
#   - a prepared transaction holds a claim and its completion.
# After the restart: no half-written record (amcheck of the heap and of every
# index, invariants of each status, every one-transaction record with its
# business row), uncommitted claims and inbox rows gone, records from before
# the crash byte for byte unchanged, committed processing records taken over
# after their lease with a larger token and their recovery point (the owner
# from before the crash fenced off), a live lease still owned by its owner,
# completed results intact and replayed, and the prepared transaction still
# pending until COMMIT PREPARED.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemEdition;

my $node = PostgreSQL::Test::Cluster->new('crash');
$node->init;
$node->append_conf('postgresql.conf', 'max_prepared_transactions = 2');
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	CREATE EXTENSION amcheck;
	CREATE TABLE orders (key text PRIMARY KEY, n integer NOT NULL);
	SELECT idem_define_machine('payment', '{"PENDING": ["PAID"]}', '{PENDING}');
	CREATE TABLE payments (id integer PRIMARY KEY, status text NOT NULL);
	SELECT idem_attach_machine('payments', 'status', 'payment');
	INSERT INTO payments VALUES (1, 'PENDING');
});

# --- Committed before the crash -------------------------------------------

$node->safe_psql('postgres', q{
	-- one transaction: claim, business row, completion
	BEGIN;
	SELECT idem_claim('done', idem_fingerprint('a'), '1 hour');
	INSERT INTO orders VALUES ('done', 7);
	SELECT idem_complete('done', 1, '{"order_id": 7}', 201);
	COMMIT;
	-- finished in every other way
	SELECT idem_fail('refused', (SELECT token FROM idem_claim('refused', '\x02', '1 hour')),
	                 '{"reason": "declined"}', retryable => false, response_code => 402);
	SELECT idem_fail('retry', (SELECT token FROM idem_claim('retry', '\x03', '1 hour')),
	                 '{"reason": "timeout"}', retryable => true);
	SELECT idem_mark_unknown('unsure', (SELECT token FROM idem_claim('unsure', '\x04', '1 hour')),
	                         '{"provider": "no answer"}');
	SELECT idem_release('released', (SELECT token FROM idem_claim('released', '\x05', '1 hour')));
	-- multi-phase: claims and checkpoints committed, the owner then "crashed"
	-- (phase2's lease ends first: it is checked once phase's has ended)
	SELECT idem_claim('phase2', idem_fingerprint('b2'), '2 seconds');
	SELECT idem_checkpoint('phase2', 1, 'charged');
	SELECT idem_claim('phase', idem_fingerprint('b'), '2 seconds');
	SELECT idem_checkpoint('phase', 1, 'step-2');
	SELECT idem_claim('live', idem_fingerprint('l'), '1 hour');
	SELECT idem_checkpoint('live', 1, 'step-1');
	SELECT idem_claim('stale', idem_fingerprint('s'), '1 millisecond');
	-- the inbox
	SELECT idem_inbox_accept('billing', 'msg-done');
	SELECT idem_inbox_accept_seq('billing', 'orders/0', 10);
});
my $static_keys = q{('done', 'refused', 'retry', 'unsure', 'released', 'phase', 'live')};
my $static_before = $node->safe_psql('postgres',
	qq{SELECT * FROM idempotency_records WHERE key IN $static_keys ORDER BY key});

# --- Running when the server dies ------------------------------------------

# A stream of one-transaction claims, one COMMIT per key.
my $loop_one = $node->background_psql('postgres');
$loop_one->query_until(qr/started/, q{\echo started
DO $$
BEGIN
	FOR i IN 1 .. 1000000 LOOP
		PERFORM idem_claim('a-' || i, idem_fingerprint('req ' || i), '1 hour');
		INSERT INTO orders VALUES ('a-' || i, i);
		PERFORM idem_complete('a-' || i, 1, jsonb_build_object('n', i), 201);
		COMMIT;
	END LOOP;
END $$;
});

# Multi-phase work, each step its own transaction, keys at three stages: key
# i is claimed, key i - 5 checkpointed, key i - 10 completed.
my $loop_multi = $node->background_psql('postgres');
$loop_multi->query_until(qr/started/, q{\echo started
DO $$
BEGIN
	FOR i IN 1 .. 1000000 LOOP
		PERFORM idem_claim('b-' || i, idem_fingerprint('pay ' || i), '2 seconds');
		COMMIT;
		IF i > 5 THEN
			PERFORM idem_checkpoint('b-' || (i - 5), 1, 'charged ' || (i - 5));
			COMMIT;
		END IF;
		IF i > 10 THEN
			PERFORM idem_complete('b-' || (i - 10), 1, jsonb_build_object('charge', i - 10), 200);
			COMMIT;
		END IF;
	END LOOP;
END $$;
});

# Sessions in the middle of a transaction.
my @open;
for my $sql (
	# an uncommitted one-transaction claim and its business row
	q{BEGIN; SELECT idem_claim('open', idem_fingerprint('c'), '1 hour');
	  INSERT INTO orders VALUES ('open', 1)},
	# a claim and its completion, not committed
	q{BEGIN; SELECT idem_claim('open-done', idem_fingerprint('d'), '1 hour');
	  SELECT idem_complete('open-done', 1, '{"x": 1}')},
	# a takeover of an expired lease (token 2), not committed
	q{BEGIN; SELECT idem_claim('stale', idem_fingerprint('s'), '1 hour')},
	# the completion of a committed multi-phase claim, not committed
	q{BEGIN; SELECT idem_complete('phase2', 1, '{"charge": "ok"}', 200)},
	# inbox accepts, not committed
	q{BEGIN; SELECT idem_inbox_accept('billing', 'msg-open');
	  SELECT idem_inbox_accept_seq('billing', 'orders/0', 11)},
	# a state-machine move, not committed
	q{BEGIN; SELECT idem_transition('payments', '1', 'PAID')})
{
	my $session = $node->background_psql('postgres');
	$session->query_safe($sql);
	push @open, $session;
}
is($open[2]->query_safe(q{SELECT token FROM idem_lookup('stale')}), '2',
	'(the open takeover holds token 2)');

# A prepared transaction with a claim and its completion.
$node->safe_psql('postgres', q{
	BEGIN;
	SELECT idem_claim('prepared', idem_fingerprint('p'), '1 hour');
	SELECT idem_complete('prepared', 1, '{"prepared": true}', 201);
	PREPARE TRANSACTION 'p1';
});

# Let the streams get going, then crash.
ok( $node->poll_query_until('postgres', q{
		SELECT (SELECT count(*) FROM idempotency_records WHERE key LIKE 'a-%') >= 200
		   AND (SELECT count(*) FROM idempotency_records WHERE key LIKE 'b-%' AND status = 'succeeded') >= 50}),
	'the streams of claims are running');
$node->stop('immediate');
$_->{run}->kill_kill for ($loop_one, $loop_multi, @open);
$node->start;
ok($node->log_contains('database system was not properly shut down; automatic recovery in progress'),
	'the restart ran crash recovery');

# --- No half-written record ------------------------------------------------

is( $node->safe_psql('postgres', q{
		WITH btrees AS MATERIALIZED (
		    SELECT c.oid, c.relname
		      FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam
		     WHERE a.amname = 'btree'
		       AND i.indrelid IN ('idempotency_records'::regclass, 'idem_inbox'::regclass,
		                          'idem_inbox_streams'::regclass, 'orders'::regclass,
		                          'payments'::regclass))
		SELECT string_agg(relname, ',' ORDER BY relname) FROM btrees
		 WHERE bt_index_check(oid, true) IS NOT NULL}),
	'idem_inbox_pkey,idem_inbox_streams_pkey,idempotency_records_pkey,idempotency_records_purge_after,orders_pkey,payments_pkey',
	'every btree index is consistent with its heap (amcheck, heapallindexed)');
is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM verify_heapam('idempotency_records')}),
	'0', 'the records heap has no corruption (verify_heapam)');
is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM verify_heapam('idem_inbox')}),
	'0', 'nor the inbox heap');

is( $node->safe_psql('postgres', q{
		SELECT coalesce(string_agg(key, ','), '') FROM idempotency_records
		 WHERE token < 1 OR attempts < 1 OR expires_at < created_at OR updated_at < created_at
		    OR (status = 'processing' AND (completed_at IS NOT NULL OR result IS NOT NULL))
		    OR (status = 'succeeded' AND (completed_at IS NULL OR lease_expires_at IS NOT NULL OR error IS NOT NULL))
		    OR (status = 'failed' AND (completed_at IS NULL OR error IS NULL OR result IS NOT NULL))
		    OR (status = 'unknown' AND (lease_expires_at IS NOT NULL OR error IS NULL))}),
	'', 'every record is consistent with its status');

# The stream of one-transaction claims: each committed key has its business
# row and its result, and nothing exists without the other.
my ($a_total, $a_ok) = split /\|/, $node->safe_psql('postgres', q{
	SELECT count(*), count(*) FILTER (WHERE r.status = 'succeeded' AND r.token = 1
	                                   AND r.result = jsonb_build_object('n', o.n)
	                                   AND o.key IS NOT NULL)
	  FROM idempotency_records r FULL JOIN orders o ON o.key = r.key
	 WHERE coalesce(r.key, o.key) LIKE 'a-%'});
cmp_ok($a_total, '>=', 200, "$a_total one-transaction claims committed before the crash");
is($a_ok, $a_total, 'each is succeeded with its business row, and no business row lacks its record');
is( $node->safe_psql('postgres', q{
		SELECT max(substr(key, 3)::int) = count(*) FROM idempotency_records WHERE key LIKE 'a-%'}),
	't', 'they are the first n keys, without a hole');

# The multi-phase stream: every key is in a stage it committed.
my ($b_total, $b_done, $b_processing) = split /\|/, $node->safe_psql('postgres', q{
	SELECT count(*),
	       count(*) FILTER (WHERE status = 'succeeded' AND token = 1
	                         AND recovery_point = 'charged ' || substr(key, 3)
	                         AND result = jsonb_build_object('charge', substr(key, 3)::int)),
	       count(*) FILTER (WHERE status = 'processing' AND token = 1 AND result IS NULL
	                         AND (recovery_point IS NULL OR recovery_point = 'charged ' || substr(key, 3)))
	  FROM idempotency_records WHERE key LIKE 'b-%'});
is($b_done + $b_processing, $b_total,
	"the $b_total multi-phase keys are all completed with their checkpoint ($b_done) or processing ($b_processing)");
cmp_ok($b_processing, '>=', 9, 'several of them were in the middle of their work');

# --- Uncommitted work is gone ----------------------------------------------

is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_lookup('open')}),
	'0', 'an uncommitted claim does not survive a crash');
is($node->safe_psql('postgres', q{SELECT count(*) FROM orders WHERE key = 'open'}),
	'0', 'nor its business row');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_lookup('open-done')}),
	'0', 'nor an uncommitted claim with its completion');
is( $node->safe_psql('postgres',
		q{SELECT outcome, token FROM idem_claim('open', idem_fingerprint('c'), '1 hour')}),
	'new|1', 'the key is new again, with the first token');
is( $node->safe_psql('postgres',
		q{SELECT status, token, attempts FROM idem_lookup('stale')}),
	'processing|1|1', 'an uncommitted takeover is undone');
is( $node->safe_psql('postgres',
		q{SELECT status, token, recovery_point, result IS NULL FROM idem_lookup('phase2')}),
	'processing|1|charged|t', 'an uncommitted completion of multi-phase work is undone');
is($node->safe_psql('postgres', q{SELECT idem_inbox_watermark('billing', 'orders/0')}),
	'10', 'an uncommitted watermark move is undone');
is( $node->safe_psql('postgres',
		q{SELECT idem_inbox_accept('billing', 'msg-open'), idem_inbox_accept('billing', 'msg-done'),
		         idem_inbox_accept_seq('billing', 'orders/0', 11)}),
	't|f|new', 'an uncommitted inbox accept is gone, a committed one is still a duplicate');
is($node->safe_psql('postgres', q{SELECT status FROM payments WHERE id = 1}),
	'PENDING', 'an uncommitted state-machine move is undone');
is($node->safe_psql('postgres', q{SELECT idem_transition('payments', '1', 'PAID')}),
	'applied', 'and the move applies after the restart');

# --- Committed work is intact ----------------------------------------------

is($node->safe_psql('postgres',
		qq{SELECT * FROM idempotency_records WHERE key IN $static_keys ORDER BY key}),
	$static_before, 'the records committed before the crash are unchanged, column for column');
is( $node->safe_psql(
		'postgres',
		q{SELECT outcome, response_code, result FROM idem_claim('done', idem_fingerprint('a'), '1 hour')}),
	'replay|201|{"order_id": 7}',
	'a completed result survives the crash and replays');
is( $node->safe_psql('postgres',
		q{SELECT outcome, response_code, error FROM idem_claim('refused', '\x02', '1 hour')}),
	'replay|402|{"reason": "declined"}', 'a final failure replays');
is( $node->safe_psql('postgres',
		q{SELECT outcome, token, attempts FROM idem_claim('retry', '\x03', '1 hour')}),
	'takeover|2|2', 'a retryable failure is taken over with the next token');
is( $node->safe_psql('postgres',
		q{SELECT outcome, error FROM idem_claim('unsure', '\x04', '1 hour')}),
	'unknown|{"provider": "no answer"}', 'an unknown outcome stays unknown');
is( $node->safe_psql('postgres',
		q{SELECT outcome, token FROM idem_claim('released', '\x05', '1 hour')}),
	'new|3', 'a released key is new, with a token above the release');
is( $node->safe_psql('postgres',
		q{SELECT outcome, token IS NULL, recovery_point FROM idem_claim('live', idem_fingerprint('l'), '1 hour')}),
	'in_progress|t|step-1', 'a committed claim with a live lease is still in progress');
$node->safe_psql('postgres', q{SELECT idem_complete('live', 1, '{"finished": "after the crash"}')});
is($node->safe_psql('postgres', q{SELECT status, result FROM idem_lookup('live')}),
	'succeeded|{"finished": "after the crash"}', 'and its owner can still complete it');

# Committed processing records are taken over after their lease, with a
# larger token and their recovery point, and the old owner is fenced off.
ok( $node->poll_query_until(
		'postgres',
		q{SELECT outcome = 'takeover' AND token = 2 AND recovery_point = 'step-2'
		  FROM idem_claim('phase', idem_fingerprint('b'), '1 hour')}),
	'after its lease, a checkpointed record is taken over with a larger token');
is( $node->safe_psql('postgres',
		q{SELECT outcome, token, attempts, recovery_point FROM idem_claim('phase2', idem_fingerprint('b2'), '1 hour')}),
	'takeover|2|2|charged', 'so is the one whose completion was not committed');
is( $node->safe_psql('postgres',
		q{SELECT outcome, token, attempts FROM idem_claim('stale', idem_fingerprint('s'), '1 hour')}),
	'takeover|2|2', 'and the one whose takeover was not committed');
my ($ret, $out, $err) = $node->psql('postgres',
	q{SELECT idem_complete('phase', 1, '{"late": true}')},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/IK002: .*token 1 is not the current fencing token/,
	'the pre-crash owner cannot complete after the takeover');
is($node->safe_psql('postgres', q{SELECT result IS NULL FROM idem_lookup('phase')}),
	't', 'and wrote nothing');

# The multi-phase stream's unfinished keys, once their 2-second leases are over.
ok( $node->poll_query_until('postgres', q{
		SELECT count(*) = 0 FROM idempotency_records
		 WHERE key LIKE 'b-%' AND status = 'processing' AND lease_expires_at > clock_timestamp()}),
	'the leases of the unfinished multi-phase keys run out');
is( $node->safe_psql('postgres', q{
		SELECT count(*) FILTER (WHERE c.outcome = 'takeover' AND c.token = 2 AND c.attempts = 2
		                         AND c.recovery_point IS NOT DISTINCT FROM r.recovery_point)
		  FROM (SELECT key, fingerprint, recovery_point FROM idempotency_records
		         WHERE key LIKE 'b-%' AND status = 'processing') r,
		       LATERAL idem_claim(r.key, r.fingerprint, '1 hour') c}),
	$b_processing, "all $b_processing are taken over with token 2 and their recovery point");
is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM idempotency_records r,
		       LATERAL idem_claim(r.key, r.fingerprint, '1 hour') c
		 WHERE r.key LIKE 'b-%' AND r.status = 'succeeded'
		   AND c.outcome = 'replay' AND c.result = r.result}),
	$b_done, "all $b_done completed ones replay their result");

# --- The prepared transaction -----------------------------------------------

is($node->safe_psql('postgres', q{SELECT gid FROM pg_prepared_xacts}),
	'p1', 'the prepared transaction survives the crash');
is( $node->safe_psql('postgres',
		q{SELECT outcome FROM idem_claim('prepared', idem_fingerprint('p'), '1 hour', wait => false)}),
	'in_progress', 'its claim is in progress meanwhile');
$node->safe_psql('postgres', q{COMMIT PREPARED 'p1'});
is( $node->safe_psql('postgres',
		q{SELECT outcome, response_code, result FROM idem_claim('prepared', idem_fingerprint('p'), '1 hour')}),
	'replay|201|{"prepared": true}', 'after COMMIT PREPARED its result replays');

$node->stop;
done_testing();
