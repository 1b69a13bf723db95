# A synchronous streaming standby: every acknowledged result is there after
# promotion; idem_lookup works on the hot standby while writes give a clear
# read-only error.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->start;
$primary->safe_psql('postgres', 'CREATE EXTENSION idempotency');
$primary->backup('base');

my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;

# Synchronous from here on: a commit returns once the standby has flushed it.
$primary->append_conf('postgresql.conf', "synchronous_standby_names = 'standby'");
$primary->reload;
$primary->poll_query_until('postgres',
	q{SELECT sync_state = 'sync' FROM pg_stat_replication WHERE application_name = 'standby'})
  or die "standby did not become synchronous";

# Each completion returns only once the synchronous standby has it.
for my $i (1 .. 20)
{
	$primary->safe_psql('postgres', qq{
		BEGIN;
		SELECT idem_claim('k$i', idem_fingerprint('req $i'), '1 hour', scope => 't1');
		SELECT idem_complete('k$i', 1, '{"n": $i}', 201, scope => 't1');
		COMMIT;
	});
}
$primary->safe_psql('postgres',
	q{SELECT idem_claim('pending', idem_fingerprint('p'), '1 hour')});
$primary->wait_for_catchup($standby);

is( $standby->safe_psql('postgres',
		q{SELECT status, result FROM idem_lookup('k7', 't1')}),
	'succeeded|{"n": 7}',
	'idem_lookup works on the hot standby');

my ($ret, $out, $err) = $standby->psql('postgres',
	q{SELECT idem_claim('k21', idem_fingerprint('x'), '1 hour', scope => 't1')});
isnt($ret, 0, 'a claim on the standby fails');
like($err, qr/read-only transaction/, 'with a read-only error');

($ret, $out, $err) = $standby->psql('postgres',
	q{SELECT idem_complete('pending', 1)});
like($err, qr/read-only transaction/, 'completing on the standby is refused too');

$primary->stop('immediate');
$standby->promote;

is( $standby->safe_psql('postgres',
		q{SELECT count(*) FROM idempotency_records WHERE scope = 't1' AND status = 'succeeded'}),
	'20', 'every acknowledged result is on the promoted standby');
is( $standby->safe_psql('postgres',
		q{SELECT outcome, response_code, result FROM idem_claim('k20', idem_fingerprint('req 20'), '1 hour', scope => 't1')}),
	'replay|201|{"n": 20}',
	'and replays there');
is( $standby->safe_psql('postgres',
		q{SELECT outcome FROM idem_claim('pending', idem_fingerprint('p'), '1 hour')}),
	'in_progress', 'the pending claim is still owned after failover');
is( $standby->safe_psql('postgres',
		q{SELECT outcome, token FROM idem_claim('k21', idem_fingerprint('x'), '1 hour', scope => 't1')}),
	'new|1', 'the promoted standby accepts new claims');

$standby->stop;
done_testing();
