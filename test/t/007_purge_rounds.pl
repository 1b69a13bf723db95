# idem-test: c-edition-only: the purge worker's bounded runs and the launcher's memory, in the C library; the SQL edition has no worker
# A purge run is bounded: in a database where rows keep expiring faster than
# the run deletes them, the run still ends (after 10 transactions of one batch
# per table), the launcher goes on to the next database in the list, and
# starts the next round at once.  The launcher does not leak memory per run
# (a BackgroundWorkerHandle used to stay allocated each time).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Time::HiRes qw(usleep);
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemEdition;

my $node = PostgreSQL::Test::Cluster->new('rounds');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.databases = 'busy, quiet'
idempotency.purge_interval = 0
idempotency.purge_batch_size = 1
log_min_messages = debug1
});
$node->start;
for my $db ('busy', 'quiet')
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION idempotency');
}

# busy: 20000 records that expire one per millisecond from now on, and a
# trigger that makes each deletion take 20 ms: rows expire 20 times faster
# than a purge deletes them.
$node->safe_psql('busy', q{
	SELECT idem_complete('k' || i,
		(SELECT token FROM idem_claim('k' || i, '\x01', '1 hour',
		                              retention => make_interval(secs => i / 1000.0))))
	  FROM generate_series(1, 20000) AS i;
	CREATE FUNCTION slow_delete() RETURNS trigger LANGUAGE plpgsql
	  AS $$BEGIN PERFORM pg_sleep(0.02); RETURN OLD; END$$;
	CREATE TRIGGER slow_delete AFTER DELETE ON idempotency_records
	  FOR EACH ROW EXECUTE FUNCTION slow_delete();
});
$node->safe_psql('quiet', q{
	SELECT idem_complete('q', (SELECT token FROM idem_claim('q', '\x01', '1 hour',
	                                                        retention => '10 ms')));
});

my $offset = -s $node->logfile;
$node->safe_psql('postgres',
	'ALTER SYSTEM SET idempotency.purge_interval = 1; SELECT pg_reload_conf()');

# poll quiet for at most 60 s (a run that never ends would keep it waiting
# for minutes)
my $purged = 0;
for (my $i = 0; $i < 600 && !$purged; $i++)
{
	$purged = $node->safe_psql('quiet', 'SELECT count(*) = 0 FROM idempotency_records') eq 't';
	usleep(100_000) unless $purged;
}
ok($purged, 'the database after a busy one in the list is purged');
cmp_ok($node->safe_psql('busy', 'SELECT count(*) FROM idempotency_records WHERE purge_after < now()'),
	'>', 0, 'while the busy one still has expired records');
ok($node->log_contains(qr/idempotency purge removed 10 rows in database "busy"\n.*DETAIL:  The run stopped after 10 transactions; the next round starts at once/,
		$offset),
	'a run in the busy database stops after 10 transactions');

# the next rounds follow at once: quiet is purged again, well before busy is
# done
$node->safe_psql('quiet', q{
	SELECT idem_complete('q2', (SELECT token FROM idem_claim('q2', '\x01', '1 hour',
	                                                         retention => '10 ms')));
});
$purged = 0;
for (my $i = 0; $i < 600 && !$purged; $i++)
{
	$purged = $node->safe_psql('quiet', 'SELECT count(*) = 0 FROM idempotency_records') eq 't';
	usleep(100_000) unless $purged;
}
ok($purged, 'and again in the next round');

# memory: the launcher's TopMemoryContext does not grow with the runs (five
# short runs a second)
$node->safe_psql('busy', 'DROP TRIGGER slow_delete ON idempotency_records');
$node->safe_psql('postgres', q{
	ALTER SYSTEM SET idempotency.databases = 'quiet, quiet, quiet, quiet, quiet';
	SELECT pg_reload_conf();
});
sleep(2);
my $pid = $node->safe_psql('postgres',
	q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempotency purge launcher'});
sub top_used
{
	my $from = -s $node->logfile;
	$node->safe_psql('postgres', "SELECT pg_log_backend_memory_contexts($pid)");
	for (my $i = 0; $i < 300; $i++)
	{
		my $log = slurp_file($node->logfile, $from);
		return $1 if $log =~ /\[$pid\] LOG:  level: \d+; TopMemoryContext: .* (\d+) used/;
		usleep(100_000);
	}
	return undef;
}
sub runs_since
{
	my ($from) = @_;
	my $n = () = slurp_file($node->logfile, $from) =~
	  /starting background worker process "idempotency purge quiet"/g;
	return $n;
}
my $before = top_used();
my $mark = -s $node->logfile;
# ten runs at least (five a second when the machine is idle; a loaded one
# may take longer: wait for them rather than for a time)
for (my $i = 0; $i < 10 * $PostgreSQL::Test::Utils::timeout_default && runs_since($mark) < 10; $i++)
{
	usleep(100_000);
}
my $after = top_used();
my $runs = runs_since($mark);
cmp_ok($runs, '>=', 10, "several runs ($runs) between the two looks");
ok(defined $before && defined $after && $after - $before < 16 * $runs,
	'the launcher\'s memory does not grow with each run')
  or diag("TopMemoryContext used: $before, then $after, after $runs runs");

$node->stop('fast');
done_testing();
