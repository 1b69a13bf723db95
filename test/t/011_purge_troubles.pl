# idem-test: c-edition-only: the purge worker when things go wrong (locks, shutdown, cancels, no worker slot), a background process of the C library; the SQL edition has no worker
# The purge worker when things go wrong: a listed database whose tables are
# locked does not hold up the others, and says so once; a run that takes long
# does not keep the launcher from shutting down, and a new launcher starts no
# run beside it; cancel requests never kill the launcher, even while it logs;
# a run that fails the same way every interval (an extension version the
# library does not support, an error in a trigger) logs its error once, not
# every interval; no free worker slot is said once, with core's hint; a
# database marked invalid is said to be being dropped or half-dropped.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Time::HiRes qw(usleep);
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemEdition;

# Longest anything may take: far above what it needs, far below the harness's
# own timeout.
my $timeout = 30;

my $node = PostgreSQL::Test::Cluster->new('troubles');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.databases = ''
idempotency.purge_interval = 1
});
$node->start;
for my $db ('d1', 'd2', 'd3', 'dv', 'df')
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION idempotency');
}

sub set_list
{
	my ($n, $databases) = @_;
	$n->safe_psql('postgres', qq{
		ALTER SYSTEM SET idempotency.databases = '$databases';
		SELECT pg_reload_conf();
	});
}

# Poll $sql in $db until it returns 't', at most $timeout seconds.
sub wait_for
{
	my ($db, $sql) = @_;
	for (my $i = 0; $i < 10 * $timeout; $i++)
	{
		return 1 if $node->safe_psql($db, $sql) eq 't';
		usleep(100_000);
	}
	return 0;
}

sub count_in_log
{
	my ($n, $re, $offset) = @_;
	my $log = slurp_file($n->logfile, $offset);
	my $count = () = $log =~ /$re/g;
	return $count;
}

# The launcher's PID, waiting for one to run (it restarts 10 s after an exit).
sub launcher_pid
{
	my $pid = '';
	for (my $i = 0; $i < 10 * $timeout && $pid !~ /^\d+$/; $i++)
	{
		$pid = $node->safe_psql('postgres',
			q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempotency purge launcher'});
		usleep(100_000) unless $pid =~ /^\d+$/;
	}
	return $pid;
}

my $expire = q{
	SELECT idem_complete('%s', (SELECT token FROM idem_claim('%s', '\x01', '1 hour',
	                                                        retention => '10 ms')))};
sub expire_key
{
	my ($db, $key) = @_;
	$node->safe_psql($db, sprintf($expire, $key, $key));
}
sub purged
{
	my ($db, $key) = @_;
	return wait_for($db,
		"SELECT count(*) = 0 FROM idempotency_records WHERE key = '$key'");
}

# --- a locked table: the run is "busy", the next database is purged ---
my $offset = -s $node->logfile;
expire_key('d1', 'k1');
expire_key('d2', 'k1');
my $locker = $node->background_psql('d1');
$locker->query_safe('BEGIN; LOCK TABLE idempotency_records IN SHARE MODE');
set_list($node, 'd1, d2');
ok(purged('d2', 'k1'), 'a database after a locked one is purged');
ok(wait_for('postgres', q{SELECT count(*) = 0 FROM pg_stat_activity
	WHERE backend_type = 'idempotency purge' AND wait_event_type = 'Lock'}),
	'no purge run waits for the lock');
# five rounds in a row find it locked: one LOG line
my $busy_re = qr/idempotency purge could not lock the tables of database "d1" in 5 rounds in a row/;
for (my $i = 0; $i < 10 * $timeout && !$node->log_contains($busy_re, $offset); $i++)
{
	usleep(100_000);
}
sleep(3);
is(count_in_log($node, $busy_re, $offset), 1, 'a database locked for long is said once');
ok(!$node->log_contains(qr/ERROR/, $offset), 'and no run fails');
$offset = -s $node->logfile;
$locker->query_safe('COMMIT');
ok(purged('d1', 'k1'), 'after the lock goes, the database is purged');
ok($node->log_contains(qr/idempotency purge resumes in database "d1"/, $offset),
	'and that is said');
$locker->quit;

# --- a lock the run waits for inside idem_purge (here an advisory lock taken
# by a trigger): the run's lock_timeout ends it busy, not failed ---
$node->safe_psql('d1', q{
	CREATE FUNCTION wait_for_lock() RETURNS trigger LANGUAGE plpgsql
	AS $$BEGIN PERFORM pg_advisory_xact_lock(4242); RETURN OLD; END$$;
	CREATE TRIGGER wait_for_lock BEFORE DELETE ON idempotency_records
	FOR EACH ROW EXECUTE FUNCTION wait_for_lock();
});
$offset = -s $node->logfile;
$locker = $node->background_psql('d1');
$locker->query_safe('SELECT pg_advisory_lock(4242)');
expire_key('d1', 'k2');
for (my $i = 0; $i < 10 * $timeout && !$node->log_contains($busy_re, $offset); $i++)
{
	usleep(100_000);
}
is(count_in_log($node, $busy_re, $offset), 1, 'a run that times out on a lock is busy');
ok(!$node->log_contains(qr/idempotency purge of database "d1" failed/, $offset),
	'not a failed run');
$offset = -s $node->logfile;
$locker->query_safe('SELECT pg_advisory_unlock(4242)');
ok(purged('d1', 'k2'), 'after the lock goes, the database is purged');
$locker->quit;
$node->safe_psql('d1', 'DROP TRIGGER wait_for_lock ON idempotency_records; DROP FUNCTION wait_for_lock()');

# --- pg_terminate_backend of the launcher while its run takes long ---
$node->safe_psql('d3', q{
	CREATE FUNCTION slow_delete() RETURNS trigger LANGUAGE plpgsql
	  AS $$BEGIN PERFORM pg_sleep(600); RETURN OLD; END$$;
	CREATE TRIGGER slow_delete AFTER DELETE ON idempotency_records
	  FOR EACH ROW EXECUTE FUNCTION slow_delete();
});
expire_key('d3', 'k1');
set_list($node, 'd3, d2');
ok(wait_for('postgres', q{SELECT count(*) = 1 FROM pg_stat_activity
	WHERE backend_type = 'idempotency purge' AND wait_event = 'PgSleep'}),
	'a run in d3 sleeps in the trigger');
my $old = launcher_pid();
$node->safe_psql('postgres', "SELECT pg_terminate_backend($old)");
ok(wait_for('postgres', qq{SELECT count(*) = 0 FROM pg_stat_activity
	WHERE pid = $old OR backend_type = 'idempotency purge'}),
	'pg_terminate_backend ends the launcher and its run');
ok(wait_for('postgres', qq{SELECT count(*) = 1 FROM pg_stat_activity
	WHERE backend_type = 'idempotency purge launcher' AND pid <> $old}),
	'a new launcher starts');
# runs of d3 keep sleeping; never two at once
my $most = 0;
for (my $i = 0; $i < 30; $i++)
{
	my $n = $node->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity
		WHERE backend_type = 'idempotency purge'});
	$most = $n if $n > $most;
	usleep(100_000);
}
is($most, 1, 'purge runs never overlap');
set_list($node, '');
$node->safe_psql('postgres', q{SELECT pg_cancel_backend(pid) FROM pg_stat_activity
	WHERE backend_type = 'idempotency purge'});
$node->safe_psql('d3', 'DROP TRIGGER slow_delete ON idempotency_records');
ok(wait_for('postgres', q{SELECT count(*) = 0 FROM pg_stat_activity
	WHERE backend_type = 'idempotency purge'}), 'the sleeping run ends on a cancel');

# --- cancel requests while the launcher logs a lot ---
my $pid = launcher_pid();
$offset = -s $node->logfile;
my @a = map { "ghost_a$_" } 1 .. 40;
my @b = map { "ghost_b$_" } 1 .. 40;
my $t0 = time;
my $flip = 0;
# 8 s of flips, longer while the launcher has logged too little (a loaded
# machine), within the timeout
while (time - $t0 < 8
	|| (count_in_log($node, qr/skips database "ghost_/, $offset) <= 80
		&& time - $t0 < $PostgreSQL::Test::Utils::timeout_default))
{
	# a new list forgets the skip states: 40 LOG lines each time
	set_list($node, join(', ', $flip++ % 2 ? @a : @b));
	for (my $i = 0; $i < 200; $i++)
	{
		kill 'INT', $pid;
		usleep(500);
	}
}
set_list($node, '');
sleep(1);
cmp_ok(count_in_log($node, qr/skips database "ghost_/, $offset), '>', 80,
	'the launcher logged while it was sent cancel requests');
is(launcher_pid(), $pid, 'cancel requests do not end the launcher');
ok(!$node->log_contains(qr/canceling statement due to user request/, $offset),
	'nor make it log an error');

# --- a run that fails the same way every interval ---
$offset = -s $node->logfile;
$node->safe_psql('dv', q{UPDATE pg_extension SET extversion = '9.9.9'
	WHERE extname = 'idempotency'});
$node->safe_psql('df', q{
	CREATE FUNCTION fail_delete() RETURNS trigger LANGUAGE plpgsql
	  AS $$BEGIN RAISE EXCEPTION 'no deletes today'; END$$;
	CREATE TRIGGER fail_delete AFTER DELETE ON idempotency_records
	  FOR EACH ROW EXECUTE FUNCTION fail_delete();
});
expire_key('df', 'k1');
expire_key('d2', 'k2');
set_list($node, 'dv, df, d2');
ok(purged('d2', 'k2'), 'a database after failing ones is purged');
sleep(5);    # several intervals
is(count_in_log($node, qr/ERROR:  extension "idempotency" is at version "9.9.9"/, $offset),
	1, 'an unsupported extension version is said once');
is(count_in_log($node, qr/ERROR:  no deletes today/, $offset),
	1, 'an error of every run is said once');
is(count_in_log($node, qr/exited with exit code 1/, $offset),
	0, 'and no run exits with an error code');
$offset = -s $node->logfile;
$node->safe_psql('dv', q{UPDATE pg_extension SET extversion = '0.3.0'
	WHERE extname = 'idempotency'});
$node->safe_psql('df', 'DROP TRIGGER fail_delete ON idempotency_records');
ok(purged('df', 'k1'), 'after the cause goes, the database is purged');
ok( $node->log_contains(qr/idempotency purge resumes in database "df"/, $offset)
	  && $node->log_contains(qr/idempotency purge resumes in database "dv"/, $offset),
	'and purging resumes in both');

# --- a database marked invalid (as DROP DATABASE does before removing files) ---
$offset = -s $node->logfile;
$node->safe_psql('postgres', 'CREATE DATABASE dinv');
$node->safe_psql('postgres',
	q{UPDATE pg_database SET datconnlimit = -2 WHERE datname = 'dinv'});
set_list($node, 'dinv');
my $invalid_re = qr/skips database "dinv", which is invalid\n.*DETAIL:  It is being dropped, or a DROP DATABASE of it was interrupted\./;
for (my $i = 0; $i < 10 * $timeout && !$node->log_contains(qr/skips database "dinv"/, $offset); $i++)
{
	usleep(100_000);
}
ok($node->log_contains($invalid_re, $offset),
	'an invalid database is said to be being dropped or half-dropped');
set_list($node, '');
$node->safe_psql('postgres', 'DROP DATABASE dinv');

$node->stop('fast');
ok(!$node->log_contains('terminated by signal|PANIC|TRAP'), 'nothing crashed');

# --- no free worker slot: said once, with core's hint ---
my $small = PostgreSQL::Test::Cluster->new('noslots');
$small->init;
$small->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.databases = 'postgres'
idempotency.purge_interval = 1
max_worker_processes = 1
max_logical_replication_workers = 0
max_parallel_workers = 0
});
$small->start;
$small->safe_psql('postgres', 'CREATE EXTENSION idempotency');
# the line once, then several intervals (waited for: a loaded machine is late)
for (my $i = 0; $i < 10 * $PostgreSQL::Test::Utils::timeout_default
	&& !$small->log_contains(qr/could not start the idempotency purge/, 0); $i++)
{
	usleep(100_000);
}
sleep(4);
my $slots_re = qr/could not start the idempotency purge of database "postgres"\n(.*DETAIL: .*\n)?.*HINT:  You might need to increase max_worker_processes/;
is(count_in_log($small, qr/could not start the idempotency purge/, 0), 1,
	'no free worker slot is said once');
ok($small->log_contains($slots_re, 0), 'with core\'s hint');
$small->stop('fast');

done_testing();
