# The partition mover's troubles (test/shard/move_partition.py, README
# "Moving a partition"), without load: two shards, four partitions, two
# proxies.  Every proxy named is switched before the source is cleaned up,
# so a read through either finds the moved keys.
#
# Needs the checkout (IDEM_CHECKOUT, set by test/run) for the move script,
# and python3-psycopg.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(time sleep);

my $checkout = $ENV{IDEM_CHECKOUT};
die "IDEM_CHECKOUT must name the checkout (test/run sets it)"
  unless defined $checkout && -f "$checkout/test/shard/move_partition.py";
my $mover = "$checkout/test/shard/move_partition.py";
my $python = -x '/usr/bin/python3' ? '/usr/bin/python3' : 'python3';

my @shards;
for my $i (0 .. 1)
{
	my $node = PostgreSQL::Test::Cluster->new("shard$i");
	$node->init;
	$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idempotency'\n");
	$node->start;
	$node->safe_psql('postgres', 'CREATE DATABASE app');
	$node->safe_psql('app', 'CREATE EXTENSION idempotency');
	push @shards, $node;
}
my @dsn = map { 'host=' . $_->host . ' port=' . $_->port . ' dbname=app' } @shards;

my @proxies;
for my $i (1 .. 2)
{
	my $node = PostgreSQL::Test::Cluster->new("proxy$i");
	$node->init;
	$node->start;
	$node->safe_psql('postgres', 'CREATE DATABASE app');
	$node->safe_psql('app', qq{
		SET client_min_messages = warning;
		CREATE EXTENSION idempotency_router CASCADE;
		SELECT idem_router_configure(ARRAY['$dsn[0]', '$dsn[1]'], 4);
		CREATE USER MAPPING FOR PUBLIC SERVER idempotency;
	});
	push @proxies, $node;
}
my @proxy_args = map { ('--proxy', 'host=' . $_->host . ' port=' . $_->port . ' dbname=app') } @proxies;
my $proxy = $proxies[0];

# A scope of a partition, and what the mover says.
sub scope_in
{
	my ($partition, $prefix) = @_;
	return $proxy->safe_psql('app',
		"SELECT s FROM (SELECT '$prefix-' || i AS s FROM generate_series(1, 1000) i) g
		  WHERE idem_router_partition(s) = $partition LIMIT 1");
}
sub move
{
	my (%o) = @_;
	my ($out, @env) = ('');
	my @cmd = ($python, $mover, @{ $o{proxies} // \@proxy_args }, '--partition', $o{partition},
		'--to', $o{to}, @{ $o{args} // [] });
	IPC::Run::run(\@cmd, '>', \$out, '2>&1');
	note($out);
	return ($? >> 8, $out);
}
sub map_of
{
	my ($node, $partition) = @_;
	return $node->safe_psql('app', "SELECT connstr FROM idem_router_partitions() WHERE partition = $partition");
}

# Partition 1 is on shard 1: a few completed keys there.
my $s1 = scope_in(1, 'a');
for my $k (1 .. 5)
{
	my $t = $proxy->safe_psql('app', "SELECT token FROM idem_claim('k$k', '\\x01', '30s', '$s1')");
	$proxy->safe_psql('app', "SELECT idem_complete('k$k', $t, '{\"k\": $k}', 200, '$s1')");
}

# Both proxies are switched before the cleanup: a lookup through either
# finds the moved keys on shard 0.
my ($rc, $out) = move(partition => 1, to => $dsn[0]);
is($rc, 0, 'partition 1 moved from shard 1 to shard 0, both proxies named');
like($out, qr/partition 1 of 4 moved: .*idempotency_records" 5\b/, '... with its five records');
is(map_of($_, 1), $dsn[0], 'proxy ' . $_->name . ' points partition 1 at shard 0') for @proxies;
is($_->safe_psql('app', "SELECT status FROM idem_lookup('k3', '$s1')"), 'succeeded',
	'a lookup through ' . $_->name . ' finds a moved key') for @proxies;

$_->stop for @proxies, @shards;
done_testing();
