# idem-test: c-edition-only: the purge worker's launcher on a standby and after a promotion, a background process of the C library; the SQL edition has no worker
# The purge worker on a hot standby (the library preloaded on both servers):
# the launcher runs there, purges nothing and says so once in the log; after
# a promotion it purges the expired records.  The primary's purge is paused
# here, so that the expired records reach the standby and stay.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Time::HiRes qw(usleep);
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemEdition;

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.databases = 'postgres'
idempotency.purge_interval = 0
});
$primary->start;
$primary->safe_psql('postgres', 'CREATE EXTENSION idempotency');
$primary->backup('base');

my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->append_conf('postgresql.conf', 'idempotency.purge_interval = 1');
$standby->start;

$primary->safe_psql('postgres', q{
	SELECT idem_complete(k, (SELECT token FROM idem_claim(k, '\x01', '1 hour',
	                                                       retention => '10 ms')))
	  FROM (VALUES ('a'), ('b'), ('c')) AS v(k);
});
$primary->wait_for_catchup($standby);

sub launcher_pid
{
	my ($node) = @_;
	for (my $i = 0; $i < 300; $i++)
	{
		my $pid = $node->safe_psql('postgres',
			q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempotency purge launcher'});
		return $pid if $pid =~ /^\d+$/;
		usleep(100_000);
	}
	return '';
}

like(launcher_pid($standby), qr/^\d+$/, 'the launcher runs on the hot standby');
# the line once, then several intervals (waited for: a loaded machine is late)
for (my $i = 0; $i < 10 * $PostgreSQL::Test::Utils::timeout_default
	&& !$standby->log_contains(qr/idempotency purge launcher does not purge while the server is in recovery/); $i++)
{
	usleep(100_000);
}
sleep(4);
my $said = () = slurp_file($standby->logfile) =~
  /idempotency purge launcher does not purge while the server is in recovery/g;
is($said, 1, 'and says once that it does not purge during recovery');
is($standby->safe_psql('postgres',
		'SELECT count(*) FROM idempotency_records WHERE purge_after < now()'),
	'3', 'the expired records are still there');
ok(!$standby->log_contains(qr/FATAL|could not start the idempotency purge/),
	'no purge run was tried');

$standby->promote;
ok( $standby->poll_query_until('postgres', 'SELECT count(*) = 0 FROM idempotency_records'),
	'after the promotion the launcher purges the expired records');
ok($standby->log_contains('idempotency purge launcher starts purging after the end of recovery'),
	'and says so');
is($primary->safe_psql('postgres', 'SELECT count(*) FROM idempotency_records'), '3',
	'the paused primary kept them (the promoted standby purged them itself)');

$standby->stop('fast');
$primary->stop('fast');
done_testing();
