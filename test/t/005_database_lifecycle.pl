# idem-test: c-edition-only: CREATE, DROP and ALTER DATABASE and tablespaces against the purge worker's launcher, a background process of the C library; the SQL edition has no worker (pg_cron runs idem_purge instead)
# Database and tablespace lifecycle with the purge worker running (the
# library in shared_preload_libraries): CREATE and DROP DATABASE, ALTER
# DATABASE ... RENAME and SET TABLESPACE, DROP TABLESPACE finish in seconds
# whatever the worker does (list empty, purging paused, databases listed that
# exist, lack the extension, do not exist or are dropped and renamed while
# listed).  Several of these commands wait until every process has absorbed
# a ProcSignalBarrier, so each one runs with a timeout: a launcher that does
# not absorb it fails the test instead of hanging it.  A listed database that
# cannot be purged is skipped with one LOG line, not a FATAL per interval.
# The idle launcher answers pg_log_backend_memory_contexts and survives
# pg_cancel_backend; after pg_terminate_backend the postmaster starts a new
# one.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Time::HiRes qw(usleep);
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemEdition;

# Longest a command may take: far above what each needs, far below the
# harness's own timeout.
my $cmd_timeout = 30;

my $node = PostgreSQL::Test::Cluster->new('lifecycle');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.databases = ''
idempotency.purge_interval = 1
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

my $tsdir = PostgreSQL::Test::Utils::tempdir_short();

# Run $sql in $db, failing (not hanging) after $cmd_timeout seconds.
sub timed_ok
{
	my ($db, $sql, $name) = @_;
	my ($stdout, $stderr, $timed_out) = ('', '', 0);
	my $ret = $node->psql(
		$db, $sql,
		stdout => \$stdout,
		stderr => \$stderr,
		timeout => $cmd_timeout,
		timed_out => \$timed_out,
		on_error_stop => 1);
	ok(!$timed_out && defined $ret && $ret == 0, $name)
	  or diag($timed_out ? "timed out after $cmd_timeout s" : "psql failed: $stderr");
}

# Wait at most $secs seconds for $re in the log after $offset.
sub log_within
{
	my ($re, $offset, $secs) = @_;
	for (my $i = 0; $i < 10 * $secs; $i++)
	{
		return 1 if $node->log_contains($re, $offset);
		usleep(100_000);
	}
	return 0;
}

sub count_in_log
{
	my ($re, $offset) = @_;
	my $log = slurp_file($node->logfile, $offset);
	my $n = () = $log =~ /$re/g;
	return $n;
}

# How often each line was logged since $offset, once every one of them was
# (a loaded machine runs the launcher late: wait for the lines, not for a
# time), and then a few more intervals, in which a line said once stays so.
sub settled_counts
{
	my ($offset, @res) = @_;
	log_within($_, $offset, $PostgreSQL::Test::Utils::timeout_default) for @res;
	sleep(3);
	return map { count_in_log($_, $offset) } @res;
}

sub launcher_pid
{
	my $pid;
	for (my $i = 0; $i < 10 * $cmd_timeout; $i++)
	{
		$pid = $node->safe_psql('postgres',
			q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempotency purge launcher'});
		return $pid if $pid =~ /^\d+$/;
		usleep(100_000);
	}
	return '';
}

sub set_worker
{
	my ($databases, $interval) = @_;
	$node->safe_psql('postgres', qq{
		ALTER SYSTEM SET idempotency.databases = '$databases';
		ALTER SYSTEM SET idempotency.purge_interval = $interval;
		SELECT pg_reload_conf();
	});
	sleep(2);    # let the launcher take the reload
}

# Every lifecycle command, each with a timeout; $tag keeps the names apart.
my $round = 0;
sub lifecycle
{
	my ($tag) = @_;
	$round++;
	my $ts = "ts$round";
	mkdir "$tsdir/$ts" or die "mkdir: $!";

	timed_ok('postgres', "CREATE DATABASE plain$round", "$tag: CREATE DATABASE");
	timed_ok('postgres', "DROP DATABASE plain$round", "$tag: DROP DATABASE");
	timed_ok('postgres', "CREATE TABLESPACE $ts LOCATION '$tsdir/$ts'",
		"$tag: CREATE TABLESPACE");
	timed_ok('postgres', "CREATE DATABASE moved$round", "$tag: CREATE DATABASE to move");
	timed_ok('postgres', "ALTER DATABASE moved$round SET TABLESPACE $ts",
		"$tag: ALTER DATABASE SET TABLESPACE");
	timed_ok('postgres', "ALTER DATABASE moved$round RENAME TO renamed$round",
		"$tag: ALTER DATABASE RENAME");
	timed_ok('postgres', "ALTER DATABASE renamed$round SET TABLESPACE pg_default",
		"$tag: ALTER DATABASE SET TABLESPACE back");
	timed_ok('postgres', "DROP DATABASE renamed$round", "$tag: DROP DATABASE moved");
	# a dropped table leaves a file until the next checkpoint, so DROP
	# TABLESPACE checkpoints and waits for a ProcSignalBarrier
	timed_ok('postgres', "CREATE TABLE t$round (i int) TABLESPACE $ts; DROP TABLE t$round",
		"$tag: a table created and dropped in the tablespace");
	timed_ok('postgres', "DROP TABLESPACE $ts", "$tag: DROP TABLESPACE");
}

my $pid = launcher_pid();
like($pid, qr/^\d+$/, 'the launcher runs');

# --- the list empty ---
lifecycle('list empty');

my $offset = -s $node->logfile;
$node->safe_psql('postgres', "SELECT pg_log_backend_memory_contexts($pid)");
ok(log_within(qr/logging memory contexts of PID $pid/, $offset, $cmd_timeout),
	'the idle launcher logs its memory contexts on request');

$offset = -s $node->logfile;
$node->safe_psql('postgres', "SELECT pg_cancel_backend($pid)");
sleep(2);
is(launcher_pid(), $pid, 'a cancel of the idle launcher leaves it running');

# --- purging paused ---
set_worker('postgres', 0);
lifecycle('paused');
is(launcher_pid(), $pid, 'the launcher is the same process');

# --- databases listed: one with the extension, one without, one that does
# not exist; then one of them dropped and one renamed while listed ---
$node->safe_psql('postgres', 'CREATE DATABASE withext');
$node->safe_psql('withext', 'CREATE EXTENSION idempotency');
$node->safe_psql('postgres', 'CREATE DATABASE noext');
$node->safe_psql('postgres', 'CREATE DATABASE closed ALLOW_CONNECTIONS false');
$offset = -s $node->logfile;
set_worker('postgres, withext, noext, ghost, closed', 1);

my $expire = q{
	SELECT idem_complete('k', (SELECT token FROM idem_claim('k', '\x01', '1 hour',
	                                                        retention => '10 ms')))};
$node->safe_psql('postgres', $expire);
$node->safe_psql('withext', $expire);
ok( $node->poll_query_until('withext', 'SELECT count(*) = 0 FROM idempotency_records'),
	'a listed database after ones that are skipped is purged');

# a cancel between runs: the launcher stays, and goes on purging
$node->safe_psql('postgres', "SELECT pg_cancel_backend($pid)");
$node->safe_psql('postgres', $expire =~ s/'k'/'k2'/gr);
ok( $node->poll_query_until('postgres',
		q{SELECT count(*) = 0 FROM idempotency_records WHERE key = 'k2'}),
	'after a cancel the launcher purges again');
is(launcher_pid(), $pid, 'and it is the same process');

lifecycle('databases listed');

my @said = settled_counts($offset,
	qr/idempotency purge skips database "ghost", which does not exist/,
	qr/idempotency purge skips database "noext", which does not have the extension/,
	qr/idempotency purge skips database "closed", which does not allow connections/);
is($said[0], 1, 'a listed database that does not exist is skipped with one LOG line');
is($said[1], 1, 'a listed database without the extension is skipped with one LOG line');
is($said[2], 1, 'a listed database that does not allow connections is skipped with one LOG line');
ok(!$node->log_contains(qr/FATAL/, $offset), 'and no purge run fails');

$offset = -s $node->logfile;
timed_ok('postgres', 'DROP DATABASE withext', 'DROP DATABASE of a listed database');
timed_ok('postgres', 'ALTER DATABASE noext RENAME TO noext_renamed',
	'ALTER DATABASE RENAME of a listed database');
timed_ok('postgres', 'CREATE DATABASE ghost', 'CREATE DATABASE of a listed name');
@said = settled_counts($offset,
	qr/idempotency purge skips database "withext", which does not exist/,
	qr/idempotency purge skips database "noext", which does not exist/,
	qr/idempotency purge skips database "ghost", which does not have the extension/);
is($said[0], 1, 'a listed database dropped is skipped with one LOG line');
is($said[1], 1, 'a listed database renamed is skipped with one LOG line');
is($said[2], 1, 'a listed name created without the extension: one LOG line');
# (a database dropped in the instant between the launcher's look-up and the
# run's connection fails that one run: "database 16385 does not exist")
ok(!$node->log_contains(qr/FATAL(?!:  database \d+ does not exist)/, $offset),
	'and no purge run fails');
timed_ok('postgres', 'DROP DATABASE ghost', 'DROP DATABASE of a listed database it visits');
timed_ok('postgres', 'ALTER DATABASE closed ALLOW_CONNECTIONS true',
	'ALTER DATABASE ALLOW_CONNECTIONS of a listed database');
timed_ok('postgres', 'DROP DATABASE closed', 'and its DROP DATABASE');

# --- pg_terminate_backend: the postmaster starts a new launcher ---
$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
my $new;
for (my $i = 0; $i < 10 * $cmd_timeout; $i++)
{
	$new = $node->safe_psql('postgres',
		q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempotency purge launcher'});
	last if $new =~ /^\d+$/ && $new ne $pid;
	usleep(100_000);
}
ok($new =~ /^\d+$/ && $new ne $pid, 'after pg_terminate_backend a new launcher starts');
$node->safe_psql('postgres', $expire =~ s/'k'/'k3'/gr);
ok( $node->poll_query_until('postgres',
		q{SELECT count(*) = 0 FROM idempotency_records WHERE key = 'k3'}),
	'and it purges');

$node->stop('fast');
ok(!$node->log_contains('terminated by signal|PANIC|TRAP'), 'nothing crashed');

done_testing();
