# idem_await behind a transaction pooler: a real PgBouncer (pool_mode =
# transaction, default_pool_size = 2) in front of a cluster that preloads the
# library, one request that claims a key and completes it in a second
# transaction, and 8 duplicates that await it.  With idempotency.max_waiters
# = 1 one duplicate waits and sees the completion, the other 7 answer at once
# (processing: the caller's 409 with Retry-After), and the completion is not
# held up behind waiters.  Without the limit (IDEM_TEST_MAX_WAITERS=100) two
# waiters hold both server connections until their timeout, the completion
# waits in PgBouncer's queue behind them, and this test fails.
#
# Also without PgBouncer: a waiter that is cancelled by statement_timeout or
# terminated gives its slot back.
#
# The SQL edition (IdemEdition.pm) keeps the limit without the library: a
# waiter's slot is an advisory lock (7460, 1 .. max_waiters), counted here
# from pg_locks, and the refused duplicates, which it cannot count
# (idem_stats raises 55000), from their answers.
use strict;
use warnings;
use File::Spec;
use IPC::Run;
use Time::HiRes qw(time sleep);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemEdition;

my $pgbouncer = '/usr/sbin/pgbouncer';
plan skip_all => "$pgbouncer is not installed (test/lib.sh installs it)" unless -x $pgbouncer;

my $max_waiters = $ENV{IDEM_TEST_MAX_WAITERS} // 1;
my $wait_s = 10;    # the duplicates' idem_await timeout

my $node = PostgreSQL::Test::Cluster->new('await_pool');
$node->init;
$node->append_conf('postgresql.conf',
	c_edition_conf("shared_preload_libraries = 'idempotency'\n")
	  . "idempotency.max_waiters = $max_waiters\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

my $stat = sub {
	$node->safe_psql('postgres',
		"SELECT value FROM idem_stats() WHERE counter = '$_[0]'");
};
# the waiters holding a slot
my $waiting = sql_edition()
  ? sub {
	$node->safe_psql('postgres', q{
		SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
		   AND classid = 7460 AND objsubid = 2
		   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())});
  }
  : sub { $stat->('await_waiting') };
my $poll = sub {
	my ($cond, $secs) = @_;
	my $until = time + $secs;
	until ($cond->()) { return 0 if time > $until; sleep 0.02; }
	return 1;
};

# --- a waiter gives its slot back on statement_timeout and on termination
$node->safe_psql('postgres',
	q{SELECT outcome FROM idem_claim('slot', '\x01', '1 hour')});
my ($out, $err) = ('', '');
my $rc = $node->psql('postgres',
	q{SET statement_timeout = '200ms'; SELECT * FROM idem_await('slot', '', '30 s')},
	stdout => \$out, stderr => \$err);
like($err, qr/canceling statement due to statement timeout/, 'statement_timeout cancels a waiter');
is($waiting->(), 0, '... and its slot is free');

my ($wout, $werr) = ('', '');
my $waiter = IPC::Run::start(
	[ 'psql', '-X', '-At', '-d', $node->connstr('postgres'),
	  '-c', q{SELECT status FROM idem_await('slot', '', '60 s')} ],
	'>', \$wout, '2>', \$werr);
ok($poll->(sub { $waiting->() == 1 }, 30), 'a waiter holds a slot');
$node->safe_psql('postgres',
	q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity
	   WHERE query LIKE '%idem_await(''slot''%' AND pid <> pg_backend_pid()});
$waiter->finish;
like($werr, qr/terminating connection/, 'the waiter is terminated');
ok($poll->(sub { $waiting->() == 0 }, 10), '... and its slot is free');

# --- behind PgBouncer
my $dir = PostgreSQL::Test::Utils::tempdir;
my $bport = PostgreSQL::Test::Cluster::get_free_port();
my $user = $node->safe_psql('postgres', 'SELECT current_user');
my $host = $node->host;
my $pgport = $node->port;
PostgreSQL::Test::Utils::append_to_file("$dir/userlist.txt", qq{"$user" ""\n});
PostgreSQL::Test::Utils::append_to_file("$dir/pgbouncer.ini", qq{
[databases]
app = host=$host port=$pgport dbname=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $bport
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
pool_mode = transaction
default_pool_size = 2
max_client_conn = 100
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
});
my $bouncer = IPC::Run::start([ $pgbouncer, "$dir/pgbouncer.ini" ],
	'>', "$dir/pgbouncer.out", '2>&1');
my $via = "host=127.0.0.1 port=$bport dbname=app user=$user";
ok($poll->(sub { system('psql', '-X', '-Atq', '-d', $via, '-c', 'SELECT 1') == 0 }, 30),
	'PgBouncer answers');

my $bpsql = sub {
	my ($o, $e) = ('', '');
	IPC::Run::run([ 'psql', '-X', '-At', '-v', 'ON_ERROR_STOP=1', '-d', $via, '-c', $_[0] ],
		'>', \$o, '2>', \$e) or die "psql through PgBouncer failed: $e";
	chomp $o;
	return $o;
};

# the first request claims (its own transaction) ...
is($bpsql->(q{SELECT outcome FROM idem_claim('pay-1', '\x02', '1 hour')}), 'new',
	'the first request claims the key');
my $refused0 = sql_edition() ? 0 : $stat->('await_refused');

# ... 8 duplicates arrive and await it ...
my @dups;
for my $i (1 .. 8)
{
	my $d = { out => '', err => '' };
	$d->{h} = IPC::Run::start(
		[ 'psql', '-X', '-At', '-d', $via, '-c',
		  qq{SELECT status FROM idem_await('pay-1', '', '$wait_s s')} ],
		'>', \$d->{out}, '2>', \$d->{err});
	push @dups, $d;
}
my $started = time;
# until each duplicate waits or was answered (bounded: without the limit, only
# two get a server connection)
# (the SQL edition: the duplicates that answered at once, from their output)
my $answered = sub {
	for my $d (@dups) { eval { $d->{h}->pump_nb if $d->{h}->pumpable }; }
	return scalar grep { $_->{out} =~ /processing/ } @dups;
};
$poll->(sub { $waiting->() + (sql_edition() ? $answered->() : $stat->('await_refused') - $refused0) >= 8 }, 5);

# ... and the first request completes in a second transaction
$bpsql->(q{SELECT idem_complete('pay-1',
	(SELECT token FROM idempotency_records WHERE key = 'pay-1'), '{"paid": 1}', 201)});
my $completed_after = time - $started;
ok($completed_after < $wait_s,
	"the completion is not held up behind the waiters (done before their $wait_s s timeout)");

$_->{h}->finish for @dups;
my %status;
$status{ $_->{out} =~ s/\s+$//r }++ for @dups;
note 'duplicates: ' . join(', ', map { "$_ => $status{$_}" } sort keys %status);
is($status{succeeded} // 0, $max_waiters < 8 ? $max_waiters : 8,
	'each duplicate that waited saw the completion');
is($status{processing} // 0, $max_waiters < 8 ? 8 - $max_waiters : 0,
	'the others answered at once with the record in progress (409, Retry-After)');
SKIP:
{
	skip 'the SQL edition counts no refused waiters (idem_stats raises 55000)', 1 if sql_edition();
	is($stat->('await_refused') - $refused0, $max_waiters < 8 ? 8 - $max_waiters : 0,
		'... and are counted in await_refused');
}
is($waiting->(), 0, 'no waiter slot is left taken');

$bouncer->kill_kill;
$node->stop('fast');
done_testing();
