# idem_await's memory stays flat however long it waits.  Under tenant
# isolation each of its reads goes through SPI, and each poll (every 100 ms
# once the sleeps have grown) left its result behind in SPI's memory until
# the call returned: about 8 kB a poll, 290 MB an hour.  A waiter's memory
# is taken twice from the server log (pg_log_backend_memory_contexts), 2.5 s
# apart, while it waits on a key whose owner is at work; it must grow by
# less than 64 kB (it grew by about 200 kB before).  The SQL edition's
# idem_await (PL/pgSQL, reads between pg_sleeps) is held to the same.
use strict;
use warnings;
use IPC::Run;
use Time::HiRes qw(time sleep);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemEdition;

my $node = PostgreSQL::Test::Cluster->new('await_memory');
$node->init;
$node->append_conf('postgresql.conf',
	c_edition_conf("shared_preload_libraries = 'idempotency'\n") . "log_line_prefix = '%p '\n");
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	CREATE ROLE app_t1 LOGIN;
	SELECT idem_grant('client', 'app_t1');
	SELECT idem_tenant_isolation();
	SELECT outcome FROM idem_claim('busy', '\x01', '1 hour', scope => 't1');
});

my $poll = sub {
	my ($cond, $secs) = @_;
	my $until = time + $secs;
	until ($cond->()) { return 0 if time > $until; sleep 0.02; }
	return 1;
};

my ($out, $err) = ('', '');
my $waiter = IPC::Run::start(
	[ 'psql', '-X', '-qAt', '-d', $node->connstr('postgres') . ' application_name=idem_waiter',
	  '-c', q{SET ROLE app_t1}, '-c', q{SET idempotency.scope = 't1'},
	  '-c', q{SELECT status FROM idem_await('busy', 't1', '4 s')} ],
	'>', \$out, '2>', \$err);
my $pid;
# the waiter sleeps on its latch (C) or in pg_sleep (SQL edition)
my $sleep_event = sql_edition() ? 'PgSleep' : 'Extension';
ok( $poll->(sub {
		$pid = $node->safe_psql('postgres', qq{
			SELECT pid FROM pg_stat_activity
			 WHERE application_name = 'idem_waiter' AND wait_event = '$sleep_event'});
		$pid ne '';
	}, 10),
	'a waiter of app_t1 waits for the owner');

my $log_offset = -s $node->logfile;
sleep 0.5;
$node->safe_psql('postgres', "SELECT pg_log_backend_memory_contexts($pid)");
sleep 2.5;
$node->safe_psql('postgres', "SELECT pg_log_backend_memory_contexts($pid)");
$waiter->finish;
chomp $out;
is($out, 'processing', 'the wait times out with the record processing');

my @used;
ok( $poll->(sub {
		my $log = slurp_file($node->logfile, $log_offset);
		@used = $log =~ /^$pid LOG:  Grand total: \d+ bytes in \d+ blocks; \d+ free \(\d+ chunks\); (\d+) used$/mg;
		@used >= 2;
	}, 10),
	'the waiter logged its memory twice');
my $growth = $used[1] - $used[0];
note("memory used by the waiter: $used[0] bytes, then $used[1] bytes 2.5 s later");
cmp_ok($growth, '<', 64 * 1024, "the waiter's memory stays flat (grew by $growth bytes)");

$node->stop;
done_testing();
