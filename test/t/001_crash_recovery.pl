# Crash recovery: an immediate shutdown in the middle of claims leaves no
# half-written record; uncommitted claims vanish, committed processing records
# are taken over after their lease with a larger token, and completed results
# survive intact.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('crash');
$node->init;
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

# A finished one-transaction claim, and a multi-phase claim that committed
# its claim and a checkpoint, then "crashed" with the process.
$node->safe_psql('postgres', q{
	BEGIN;
	SELECT idem_claim('done', idem_fingerprint('a'), '1 hour');
	SELECT idem_complete('done', 1, '{"order_id": 7}', 201);
	COMMIT;
	SELECT idem_claim('phase', idem_fingerprint('b'), '2 seconds');
	SELECT idem_checkpoint('phase', 1, 'step-2');
});

# An open transaction holding an uncommitted claim when the server dies.
my $open = $node->background_psql('postgres');
$open->query_safe(q{BEGIN; SELECT idem_claim('open', idem_fingerprint('c'), '1 hour')});

$node->stop('immediate');
$open->{run}->kill_kill;
$node->start;

is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_lookup('open')}),
	'0', 'an uncommitted claim does not survive a crash');
is( $node->safe_psql(
		'postgres', q{SELECT outcome, token FROM idem_claim('open', idem_fingerprint('c'), '1 hour')}),
	'new|1',
	'its key is new again, with the first token');

is( $node->safe_psql(
		'postgres',
		q{SELECT outcome, response_code, result FROM idem_claim('done', idem_fingerprint('a'), '1 hour')}),
	'replay|201|{"order_id": 7}',
	'a completed result survives the crash and replays');

is( $node->safe_psql(
		'postgres',
		q{SELECT status, token, recovery_point FROM idem_lookup('phase')}),
	'processing|1|step-2',
	'a committed processing record survives with its checkpoint');

ok( $node->poll_query_until(
		'postgres',
		q{SELECT outcome = 'takeover' AND token = 2 AND recovery_point = 'step-2'
		  FROM idem_claim('phase', idem_fingerprint('b'), '1 hour')}),
	'after its lease, the record is taken over with a larger token');

my ($ret, $out, $err) = $node->psql('postgres',
	q{SELECT idem_complete('phase', 1, '{"late": true}')});
like($err, qr/token 1 is not the current fencing token/,
	'the pre-crash owner cannot complete after the takeover');
is($node->safe_psql('postgres', q{SELECT result IS NULL FROM idem_lookup('phase')}),
	't', 'and wrote nothing');

# No half-written rows: the table's only index agrees with the heap.
$node->safe_psql('postgres', 'CREATE EXTENSION amcheck');
is( $node->safe_psql(
		'postgres',
		q{SELECT bt_index_check('idempotency_records_pkey'::regclass, true)}),
	'', 'the primary key index is consistent with the heap after recovery');

$node->stop;
done_testing();
