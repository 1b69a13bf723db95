# A primary with a synchronous streaming standby.
#
# On the hot standby: idem_lookup, idem_await, the views, the watermarks and
# the machine functions read; a claim that can answer from a stored record
# (replay, in_progress, unknown, or IK001) answers without writing; every
# call that would write fails with SQLSTATE 25006 (read_only_sql_transaction)
# and changes nothing.
#
# Failover: completions acknowledged by the primary (a COMMIT that returned,
# with synchronous_commit = on and the standby in sync state) are all on the
# standby after an immediate stop of the primary and a promotion (with WAL
# replay paused on the standby until then, so that only what it had flushed
# counts); an uncommitted claim is not.  The
# promoted standby accepts claims, takes over expired leases with a larger
# token, fences the old owner off, and issues tokens above every token of
# the old primary after a purge.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemEdition;

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->start;
$primary->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	-- a governed table and an inbox, to read and to write on the standby
	SELECT idem_define_machine('payment',
		'{"PENDING": ["PAID", "CANCELLED"], "PAID": ["REFUNDED"]}', '{PENDING}');
	CREATE TABLE payments (id bigint PRIMARY KEY, status text NOT NULL);
	SELECT idem_attach_machine('payments', 'status', 'payment');
	INSERT INTO payments VALUES (1, 'PENDING'), (2, 'PENDING');
	CREATE TABLE plain (id bigint PRIMARY KEY, status text);
	CREATE TABLE orders (key text PRIMARY KEY, n integer NOT NULL);
	CREATE ROLE app;
	SELECT idem_inbox_accept('billing', 'msg-1');
	SELECT idem_inbox_accept_seq('billing', 'orders/0', 41);
});
$primary->backup('base');

my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;

# Synchronous from here on: a commit returns once the standby has flushed it.
$primary->append_conf('postgresql.conf', "synchronous_standby_names = 'standby'");
$primary->reload;
ok( $primary->poll_query_until('postgres',
		q{SELECT sync_state = 'sync' FROM pg_stat_replication WHERE application_name = 'standby'}),
	'the standby is synchronous');
is($primary->safe_psql('postgres', 'SHOW synchronous_commit'), 'on',
	'and commits wait for it (synchronous_commit = on)');

# Records in every status on the primary.
$primary->safe_psql('postgres', q{
	SELECT idem_complete('done', (SELECT token FROM idem_claim('done', '\x01', '1 hour')),
	                     '{"order_id": 7}', 201);
	SELECT idem_claim('running', '\x02', '1 hour');
	SELECT idem_checkpoint('running', 1, 'step-1');
	SELECT idem_claim('short', '\x03', '3 seconds');
	SELECT idem_checkpoint('short', 1, 'charged');
	SELECT idem_mark_unknown('unsure', (SELECT token FROM idem_claim('unsure', '\x04', '1 hour')),
	                         '{"provider": "timeout"}');
	SELECT idem_fail('refused', (SELECT token FROM idem_claim('refused', '\x05', '1 hour')),
	                 '{"reason": "declined"}', retryable => false, response_code => 402);
	SELECT idem_claim('expired', '\x06', '1 millisecond');
});
$primary->wait_for_catchup($standby);

# --- Reads on the hot standby ---------------------------------------------

is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), 't', 'the standby is in recovery');
is( $standby->safe_psql('postgres',
		q{SELECT status, token, response_code, result FROM idem_lookup('done')}),
	'succeeded|1|201|{"order_id": 7}',
	'idem_lookup works on the hot standby');
is( $standby->safe_psql('postgres',
		q{SELECT status, recovery_point FROM idem_lookup('running')}),
	'processing|step-1', 'and shows a checkpoint');
is( $standby->safe_psql('postgres',
		q{SELECT status, result FROM idem_await('done', timeout => '1 second')}),
	'succeeded|{"order_id": 7}', 'idem_await answers a finished record at once on the standby');
is( $standby->safe_psql('postgres',
		q{SELECT status FROM idem_await('running', timeout => '100 milliseconds')}),
	'processing', 'and a processing one after its timeout');
is( $standby->safe_psql('postgres',
		q{SELECT string_agg(key || ':' || reason, ',' ORDER BY key) FROM idem_stuck WHERE key <> 'short'}),
	'expired:lease expired,unsure:unknown outcome', 'idem_stuck reads on the standby');
is( $standby->safe_psql('postgres',
		q{SELECT string_agg(status || '=' || records, ',' ORDER BY status) FROM idem_summary}),
	'processing=3,succeeded=1,failed=1,unknown=1', 'idem_summary reads on the standby');
is($standby->safe_psql('postgres', q{SELECT idem_inbox_watermark('billing', 'orders/0')}),
	'41', 'idem_inbox_watermark reads on the standby');
is( $standby->safe_psql('postgres',
		q{SELECT string_agg(state, ',' ORDER BY state) FROM idem_machine_states('payment')}),
	'CANCELLED,PAID,PENDING,REFUNDED', 'the machine functions read on the standby');

# Claims that answer from a stored record need no write.
is( $standby->safe_psql('postgres',
		q{SELECT outcome, token IS NULL, response_code, result FROM idem_claim('done', '\x01', '1 hour')}),
	'replay|t|201|{"order_id": 7}', 'a claim of a finished key replays on the standby');
is( $standby->safe_psql('postgres',
		q{SELECT outcome, token IS NULL FROM idem_claim('running', '\x02', '1 hour')}),
	'in_progress|t', 'a claim of a key with a live lease answers in_progress on the standby');
is( $standby->safe_psql('postgres',
		q{SELECT outcome, error FROM idem_claim('unsure', '\x04', '1 hour')}),
	'unknown|{"provider": "timeout"}', 'a claim of an unknown outcome answers unknown');
my ($ret, $out, $err) = $standby->psql('postgres', q{SELECT idem_claim('done', '\x09', '1 hour')},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/ERROR:  IK001:/, 'a different request under a used key still gets IK001');

# --- Every call that would write fails with 25006 --------------------------

my $records_before = $standby->safe_psql('postgres',
	q{SELECT * FROM idempotency_records ORDER BY scope, key});
my @writes = (
	[ 'a claim of a new key' => q{SELECT idem_claim('fresh', '\x01', '1 hour')} ],
	[ 'a claim that would take over an expired lease' =>
		  q{SELECT idem_claim('expired', '\x06', '1 hour')} ],
	[ 'a claim with wait => false of a new key' =>
		  q{SELECT idem_claim('fresh', '\x01', '1 hour', wait => false)} ],
	[ 'idem_complete'      => q{SELECT idem_complete('running', 1, '{}')} ],
	[ 'a repeated idem_complete' => q{SELECT idem_complete('done', 1, '{"order_id": 7}', 201)} ],
	[ 'idem_fail'          => q{SELECT idem_fail('running', 1, '{}')} ],
	[ 'idem_checkpoint'    => q{SELECT idem_checkpoint('running', 1, 'step-2')} ],
	[ 'idem_release'       => q{SELECT idem_release('running', 1)} ],
	[ 'idem_mark_unknown'  => q{SELECT idem_mark_unknown('running', 1, '{}')} ],
	[ 'idem_resolve'       => q{SELECT idem_resolve('unsure', 'succeeded', '{}')} ],
	[ 'idem_inbox_accept of a new message' => q{SELECT idem_inbox_accept('billing', 'msg-2')} ],
	[ 'idem_inbox_accept of a duplicate'   => q{SELECT idem_inbox_accept('billing', 'msg-1')} ],
	[ 'idem_inbox_accept_seq'              => q{SELECT idem_inbox_accept_seq('billing', 'orders/0', 42)} ],
	[ 'idem_inbox_accept_seq of a duplicate' =>
		  q{SELECT idem_inbox_accept_seq('billing', 'orders/0', 41)} ],
	[ 'idem_inbox_accept_seq of a new stream' =>
		  q{SELECT idem_inbox_accept_seq('billing', 'orders/1', 1)} ],
	[ 'the two-part idem_inbox_accept_seq' =>
		  q{SELECT idem_inbox_accept_seq('indexer', 'chain', 19000000, 5)} ],
	[ 'idem_purge'          => q{SELECT idem_purge()} ],
	[ 'idem_define_machine' => q{SELECT idem_define_machine('other', '{"A": ["B"]}')} ],
	[ 'idem_drop_machine'   => q{SELECT idem_drop_machine('payment')} ],
	[ 'idem_attach_machine' => q{SELECT idem_attach_machine('plain', 'status', 'payment')} ],
	[ 'idem_detach_machine' => q{SELECT idem_detach_machine('payments', 'status')} ],
	[ 'idem_transition (text key)'  => q{SELECT idem_transition('payments', '1', 'PAID')} ],
	[ 'idem_transition (array key)' => q{SELECT idem_transition('payments', ARRAY['1'], 'PAID')} ],
	[ 'idem_transition to the current state' =>
		  q{SELECT idem_transition('payments', '1', 'PENDING')} ],
	[ 'idem_tenant_isolation' => q{SELECT idem_tenant_isolation(true)} ],
	[ 'idem_grant'            => q{SELECT idem_grant('client', 'app')} ],
	[ 'idem_revoke_all'       => q{SELECT idem_revoke_all('app')} ],
	[ 'an UPDATE of a governed table' => q{UPDATE payments SET status = 'PAID' WHERE id = 1} ]);
for my $w (@writes)
{
	my ($what, $sql) = @$w;
	($ret, $out, $err) = $standby->psql('postgres', $sql,
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	like($err, qr/ERROR:  25006: cannot execute [A-Z ]+ in a read-only transaction/,
		"$what fails on the standby with 25006");
}
is( $standby->safe_psql('postgres', q{SELECT * FROM idempotency_records ORDER BY scope, key}),
	$records_before, 'and the refused calls changed no record');

# --- Acknowledged commits, then failover without waiting for catch-up -----

# The standby stops applying WAL (it still receives and flushes it): what it
# has after the promotion then comes only from WAL it had flushed when the
# primary went away, which is what a synchronous commit waits for.
$standby->safe_psql('postgres', 'SELECT pg_wal_replay_pause()');
ok( $standby->poll_query_until('postgres', q{SELECT pg_get_wal_replay_pause_state() = 'paused'}),
	'WAL replay on the standby is paused');

# One session on the primary commits transaction after transaction; each
# query_safe returns once the COMMIT has returned, that is, once the
# synchronous standby has flushed it.
my $writer = $primary->background_psql('postgres');
my $acked = 0;
for my $i (1 .. 40)
{
	# one transaction: the claim, the business row and the completion
	$writer->query_safe(qq{
		BEGIN;
		SELECT idem_claim('k$i', idem_fingerprint('req $i'), '1 hour', scope => 't1');
		INSERT INTO orders VALUES ('k$i', $i);
		SELECT idem_complete('k$i', 1, '{"n": $i}', 201, scope => 't1');
		SELECT idem_inbox_accept('billing', 'evt-$i');
		SELECT idem_inbox_accept_seq('billing', 'orders/0', 41 + $i);
		COMMIT;
	});
	# multi-phase: the claim commits, then the completion commits
	$writer->query_safe(qq{SELECT idem_claim('m$i', idem_fingerprint('pay $i'), '1 hour', scope => 't2')});
	$writer->query_safe(qq{SELECT idem_complete('m$i', 1, '{"charge": $i}', 200, scope => 't2')});
	$acked = $i;
}
# A claim whose transaction is still open when the primary goes away.
my $open = $primary->background_psql('postgres');
$open->query_safe(q{BEGIN; SELECT idem_claim('inflight', '\x07', '1 hour')});

# Tokens across a purge on the old primary: 'recycled' is claimed, purged,
# and claimed again (with a token above the first).
$primary->safe_psql('postgres', q{
	SELECT idem_complete('recycled',
		(SELECT token FROM idem_claim('recycled', '\x08', '1 hour', retention => '1 millisecond')));
	SELECT pg_sleep(0.01);
	SELECT idem_purge();
	SELECT idem_complete('recycled',
		(SELECT token FROM idem_claim('recycled', '\x08', '1 hour', retention => '1 millisecond')));
});
my $recycled_token = $primary->safe_psql('postgres', q{SELECT token FROM idem_lookup('recycled')});
cmp_ok($recycled_token, '>', 65536, 'the token of a key claimed again after a purge is above 2^16');

is($standby->safe_psql('postgres', q{SELECT count(*) FROM idempotency_records WHERE scope = 't1'}),
	'0', 'the standby has applied none of these commits when the primary goes away');

$primary->stop('immediate');
$writer->{run}->kill_kill;
$open->{run}->kill_kill;
$standby->promote;
is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), 'f', 'the standby is promoted');

is( $standby->safe_psql('postgres', q{
		SELECT count(*) FROM idempotency_records r JOIN orders o ON o.key = r.key
		 WHERE r.scope = 't1' AND r.status = 'succeeded' AND r.result = jsonb_build_object('n', o.n)}),
	$acked, "all $acked acknowledged one-transaction completions are on the promoted standby, with their business rows");
is( $standby->safe_psql('postgres', q{
		SELECT count(*) FROM idempotency_records
		 WHERE scope = 't2' AND status = 'succeeded' AND response_code = 200
		   AND result = jsonb_build_object('charge', substr(key, 2)::int)}),
	$acked, "all $acked acknowledged multi-phase completions are there");
is( $standby->safe_psql('postgres', q{SELECT count(*) FROM idem_inbox WHERE message_id LIKE 'evt-%'}),
	$acked, 'and every acknowledged inbox message');
is($standby->safe_psql('postgres', q{SELECT idem_inbox_watermark('billing', 'orders/0')}),
	41 + $acked, 'and the watermark of the last acknowledged message');
is( $standby->safe_psql('postgres',
		q{SELECT outcome, response_code, result FROM idem_claim('k20', idem_fingerprint('req 20'), '1 hour', scope => 't1')}),
	'replay|201|{"n": 20}',
	'an acknowledged result replays on the promoted standby');
is( $standby->safe_psql('postgres',
		qq{SELECT idem_inbox_accept('billing', 'evt-$acked'),
		          idem_inbox_accept_seq('billing', 'orders/0', 41 + $acked)}),
	'f|duplicate', 'and a redelivered message is a duplicate');
is($standby->safe_psql('postgres', q{SELECT count(*) FROM idem_lookup('inflight')}),
	'0', 'the claim that was not committed is not there');

# The promoted standby is a primary that keeps every guarantee.
# (before its first token the epoch moves on by 2^24, for the commits a
# failover can lose: test/t/020_failover_tokens.pl; tokens only grow)
is( $standby->safe_psql('postgres',
		q{SELECT outcome, token % 65536, token > 65536 FROM idem_claim('inflight', '\x07', '1 hour')}),
	'new|1|t', 'it accepts new claims, in a new epoch');
is( $standby->safe_psql('postgres',
		q{SELECT outcome FROM idem_claim('running', '\x02', '1 hour')}),
	'in_progress', 'a claim with a live lease is still owned after failover');
ok( $standby->poll_query_until('postgres', q{
		SELECT outcome = 'takeover' AND token > 1 AND attempts = 2 AND recovery_point = 'charged'
		  FROM idem_claim('short', '\x03', '1 hour')}),
	'an expired lease is taken over with a larger token, the checkpoint intact');
my $short_token = $standby->safe_psql('postgres', q{SELECT token FROM idempotency_records WHERE key = 'short'});
($ret, $out, $err) = $standby->psql('postgres', q{SELECT idem_complete('short', 1, '{"late": true}')},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/ERROR:  IK002:/, 'the owner from before the failover is fenced off');
$standby->safe_psql('postgres', qq{SELECT idem_complete('short', $short_token, '{"charge": "ok"}')});
is($standby->safe_psql('postgres', q{SELECT status, token, result FROM idem_lookup('short')}),
	qq{succeeded|$short_token|{"charge": "ok"}}, 'the new owner completes');
is( $standby->safe_psql('postgres',
		q{SELECT outcome, token > 2, attempts FROM idem_claim('expired', '\x06', '1 hour')}),
	'takeover|t|2', 'the lease that expired before the failover is taken over too');

$standby->safe_psql('postgres', q{SELECT pg_sleep(0.01); SELECT idem_purge()});
is($standby->safe_psql('postgres', q{SELECT count(*) FROM idem_lookup('recycled')}),
	'0', 'the promoted standby purges');
my $new_token = $standby->safe_psql('postgres',
	q{SELECT token FROM idem_claim('recycled', '\x08', '1 hour')});
cmp_ok($new_token, '>', $recycled_token,
	'a key claimed again after that purge gets a token above every token of the old primary');

is($standby->safe_psql('postgres', q{SELECT idem_transition('payments', '1', 'PAID')}),
	'applied', 'idem_transition works on the promoted standby');
($ret, $out, $err) = $standby->psql('postgres', q{UPDATE payments SET status = 'PENDING' WHERE id = 1},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/ERROR:  IK005: invalid transition from "PAID" to "PENDING"/,
	'and the trigger still enforces the machine');

$standby->stop;
done_testing();
