# A shard run as a pg_auto_failover formation fails over under the checker
# (issue 28), as sql/README.md "Failover per shard" says to run one.
#
# Shard 0 is a formation of its own: a monitor, a primary and two standbys,
# each node a PostgreSQL of its own with its pg_autoctl keeper, made with
# pg_autoctl (its own data directory and port, trust for 127.0.0.1 only, no
# SSL), with number-sync-standbys 1: every commit waits for one of the two
# standbys.  The library is preloaded by a line of postgresql.conf below the
# include of pg_autoctl's own settings.  Shard 1 is a plain cluster.  The map
# names shard 0 by what `pg_autoctl show uri --formation default` prints,
# written as "host=a,b,c port=p1,p2,p3 ... target_session_attrs=read-write".
#
# The Jepsen-style checker runs through the PL/Proxy proxy; mid-run the
# primary's machine dies: its pg_autoctl keeper, postmaster and backends get
# SIGKILL (the whole process group).  The monitor promotes a standby, the
# checker goes on, and when it stops:
#   - its own verdict: no property violated (no acknowledged result lost, no
#     stale token completed, no key on two shards), every ambiguous call
#     decided;
#   - every result acknowledged to a client for a key of shard 0 is on the
#     new primary, as acknowledged (checked here from the histories, apart
#     from the checker's P2);
#   - the proxy wrote records on the new primary after the promotion;
#   - the new primary's first token moved the token epoch on, once, for its
#     timeline (the log line), so an owner whose claim a failover lost
#     cannot complete;
#   - the remaining standby follows the new primary synchronously, and the
#     old primary, started again, rejoins as a standby (pg_rewind).
#
# The monitor's health checks are shortened (failure seen in about 5 s, not
# 20 s); its primary_demote_timeout keeps its default (30 s), the time a
# primary cut off from the monitor gets to stop taking writes before a
# standby is promoted, so the shard takes no writes for about 35 s.
#
# Skips itself, saying why, where pg_auto_failover is not installed for the
# PostgreSQL of PATH (postgresql-N-auto-failover; test/lib.sh installs it).
# Needs the checkout (IDEM_CHECKOUT, set by test/run) for the checker, and
# python3-psycopg.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemEdition;
use IPC::Run;
use POSIX ();
use Time::HiRes qw(time sleep);

chomp(my $pg_bindir = `pg_config --bindir`);
chomp(my $pg_sharedir = `pg_config --sharedir`);
my ($major) = `pg_config --version` =~ /PostgreSQL (\d+)/;
my ($autoctl) = grep { -x } map { "$_/pg_autoctl" } split(/:/, $ENV{PATH} // ''), '/usr/bin';
plan skip_all => "pg_auto_failover is not installed for PostgreSQL $major: "
  . (defined $autoctl ? "no $pg_sharedir/extension/pgautofailover.control" : 'no pg_autoctl')
  . " (package postgresql-$major-auto-failover)"
  unless defined $autoctl && -f "$pg_sharedir/extension/pgautofailover.control";

my $checkout = $ENV{IDEM_CHECKOUT};
die "IDEM_CHECKOUT must name the checkout (test/run sets it)"
  unless defined $checkout && -f "$checkout/test/jepsen/checker.py";
my $checker = "$checkout/test/jepsen/checker.py";
my $python = -x '/usr/bin/python3' ? '/usr/bin/python3' : 'python3';
my $duration = 70;    # the checker's run: the kill at about 5 s, then 35-45 s without a primary

# pg_autoctl keeps its configuration, state and pid files under the XDG
# folders: this test's own.
my $base = PostgreSQL::Test::Utils::tempdir('autofailover');
for my $xdg (qw(config data run))
{
	mkdir "$base/$xdg", 0700 or die "mkdir $base/$xdg: $!";
}
$ENV{XDG_CONFIG_HOME} = "$base/config";
$ENV{XDG_DATA_HOME} = "$base/data";
$ENV{XDG_RUNTIME_DIR} = "$base/run";

# The pg_autoctl services this test started (name => pid, each the leader of
# its process group, which holds its PostgreSQL too); whatever happens, none
# outlives the test.
my %service;
my %pgdata;
$SIG{TERM} = $SIG{INT} = sub { die "stopped by a signal\n" };
END
{
	my $status = $?;
	if (%service && ($status != 0 || !PostgreSQL::Test::Utils::all_tests_passing()))
	{
		diag_formation();
	}
	for my $name (keys %service)
	{
		kill 'KILL', -$service{$name};
		waitpid($service{$name}, 0);
	}
	$? = $status;
}

# autoctl(ARGS...): runs pg_autoctl, at most 120 s; returns its exit status
# and its output (pg_autoctl logs on stderr).
sub autoctl
{
	my @args = @_;
	my $out = '';
	my $ok = eval {
		IPC::Run::run([ $autoctl, @args ], '<', \undef, '>', \$out, '2>&1', IPC::Run::timeout(120));
	};
	$out .= "\n(timed out or failed to run: $@)" if $@;
	return ($ok ? 0 : ($? >> 8 || 1), $out);
}

sub autoctl_ok
{
	my ($what, @args) = @_;
	my ($rc, $out) = autoctl(@args);
	diag("pg_autoctl @args:\n$out") if $rc != 0;
	is($rc, 0, $what);
	return $out;
}

# start_service(NAME): "pg_autoctl run" for the node of NAME, in a process
# group of its own, its output in $base/NAME.log.
sub start_service
{
	my ($name) = @_;
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		POSIX::setsid();
		open STDIN, '<', '/dev/null';
		open STDOUT, '>>', "$base/$name.log";
		open STDERR, '>&', \*STDOUT;
		exec($autoctl, 'run', '--pgdata', $pgdata{$name}) or POSIX::_exit(127);
	}
	$service{$name} = $pid;
	return;
}

# stop_service(NAME): "pg_autoctl stop", then SIGKILL to what is left after 30 s.
sub stop_service
{
	my ($name) = @_;
	my $pid = delete $service{$name} or return;
	autoctl('stop', '--pgdata', $pgdata{$name});
	for (1 .. 300)
	{
		return if waitpid($pid, POSIX::WNOHANG()) == $pid;
		sleep(0.1);
	}
	kill 'KILL', -$pid;
	waitpid($pid, 0);
	return;
}

# accepting(NODE): waits until NODE's PostgreSQL, started by its keeper,
# accepts connections (pg_isready, which does not fail as a psql whose
# server is not up yet can: before reading its input), 180 s at most.
sub accepting
{
	my ($n) = @_;
	for (1 .. 1800)
	{
		return 1 if system('pg_isready', '-q', '-h', $n->host, '-p', $n->port) == 0;
		sleep(0.1);
	}
	return 0;
}

my $monitor = PostgreSQL::Test::Cluster->new('monitor');
my @nodes = map { PostgreSQL::Test::Cluster->new("node$_") } 1 .. 3;
my %node = map { $_->name => $_ } @nodes;
$pgdata{$_->name} = $_->data_dir for $monitor, @nodes;

# What a failed run shows: the formation as the monitor sees it and the end
# of each service's log.
sub diag_formation
{
	my (undef, $state) = autoctl('show', 'state', '--pgdata', $pgdata{monitor});
	diag("pg_autoctl show state:\n$state");
	for my $name (sort keys %pgdata)
	{
		my $log = "$base/$name.log";
		next unless -f $log;
		my @lines = split /\n/, slurp_file($log);
		splice(@lines, 0, @lines - 40) if @lines > 40;
		diag("$log (last lines):\n" . join("\n", @lines));
	}
	return;
}

# The monitor: its data directory made here (a private socket folder, small
# shared_buffers: pg_autoctl would size them for the machine), its health
# checks shortened.
$monitor->init;
$monitor->append_conf('postgresql.conf', q{
shared_buffers = 16MB
log_statement = none
pgautofailover.health_check_period = 1000
pgautofailover.health_check_timeout = 2000
pgautofailover.health_check_max_retries = 2
pgautofailover.health_check_retry_delay = 1000
pgautofailover.node_considered_unhealthy_timeout = 5000
});
my @common = ('--pgctl', "$pg_bindir/pg_ctl", '--hostname', '127.0.0.1', '--listen', '127.0.0.1',
	'--auth', 'trust', '--no-ssl');
{
	local $ENV{PGHOST} = $monitor->host;
	autoctl_ok('pg_autoctl create monitor', 'create', 'monitor', '--pgdata', $pgdata{monitor},
		'--pgport', $monitor->port, @common);
}
start_service('monitor');
accepting($monitor) or die 'the monitor did not start';
my ($monitor_uri) = autoctl_ok('pg_autoctl show uri', 'show', 'uri', '--pgdata', $pgdata{monitor})
  =~ /monitor \| (postgres:\S+)/;
die 'no monitor URI in pg_autoctl show uri' unless defined $monitor_uri;

# The primary: its data directory made here too, the library preloaded (a
# line below postgresql.conf's include of postgresql-auto-failover.conf,
# which sets shared_preload_libraries = pg_stat_statements); the standbys
# are pg_basebackup copies of it, postgresql.conf included.
$nodes[0]->init(allows_streaming => 1);
$nodes[0]->append_conf('postgresql.conf', "shared_buffers = 16MB\nmax_connections = 60\nlog_statement = none\n"
	  . c_edition_conf("shared_preload_libraries = 'pg_stat_statements,idempotency'\n"));
for my $n (@nodes)
{
	my $name = $n->name;
	autoctl_ok("pg_autoctl create postgres $name", 'create', 'postgres', '--pgdata', $pgdata{$name},
		'--pgport', $n->port, '--pghost', $n->host, '--name', $name, '--monitor', $monitor_uri, @common);
	start_service($name);
	accepting($n) or die "$name did not start";
}
my $formation_ready = q{
	SELECT count(*) FILTER (WHERE nodename = 'node1' AND reportedstate = 'primary' AND goalstate = 'primary') = 1
	   AND count(*) FILTER (WHERE reportedstate = 'secondary' AND goalstate = 'secondary') = 2
	  FROM pgautofailover.node};
ok($monitor->poll_query_until('pg_auto_failover', $formation_ready),
	'the formation: node1 primary, node2 and node3 secondaries');
autoctl_ok('pg_autoctl set formation number-sync-standbys 1',
	'set', 'formation', 'number-sync-standbys', '--pgdata', $pgdata{node1}, '1');
my (undef, $nss) = autoctl('get', 'formation', 'number-sync-standbys', '--pgdata', $pgdata{node1});
like($nss, qr/^1$/m, '... which pg_autoctl get formation number-sync-standbys reads back');
ok($nodes[0]->poll_query_until('postgres',
		q{SELECT current_setting('synchronous_standby_names') ~ '^ANY 1 \(pgautofailover_standby_\d, pgautofailover_standby_\d\)$'}),
	'the primary waits for ANY 1 of the two standbys at each commit');
is($nodes[0]->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'quorum'}),
	'2', '... both streaming, as quorum candidates');
is($_->safe_psql('postgres', 'SHOW shared_preload_libraries'),
	sql_edition() ? 'pg_stat_statements' : 'pg_stat_statements,idempotency',
	$_->name . ' preloads ' . (sql_edition() ? 'nothing of the extension (SQL edition)' : 'the library'))
  for @nodes;

# Shard 1 (a plain cluster) and the proxy.
my $shard1 = PostgreSQL::Test::Cluster->new('shard1');
$shard1->init;
$shard1->append_conf('postgresql.conf',
	c_edition_conf("shared_preload_libraries = 'idempotency'\n") . "max_connections = 60\n");
$shard1->start;
my $proxy = PostgreSQL::Test::Cluster->new('proxy');
$proxy->init;
$proxy->append_conf('postgresql.conf', "max_connections = 60\n");
$proxy->start;

# Shard 0 in the map as sql/README.md says: the formation's URI, in
# key=value form (PL/Proxy's connection strings), the checker adding dbname.
my $uri = autoctl_ok('pg_autoctl show uri --formation default',
	'show', 'uri', '--pgdata', $pgdata{monitor}, '--formation', 'default');
my ($hostports, $params) = $uri =~ m{^postgres(?:ql)?://([^/\s]+)/\w*\?(\S+)}m
  or die "no formation URI in: $uri";
my @hp = map { [ split /:/ ] } split /,/, $hostports;
my $formation_dsn = 'host=' . join(',', map { $_->[0] } @hp) . ' port=' . join(',', map { $_->[1] } @hp)
  . join('', map { " $_" } split /&/, $params);
like($formation_dsn, qr/^host=127\.0\.0\.1,127\.0\.0\.1,127\.0\.0\.1 port=\d+,\d+,\d+ .*target_session_attrs=read-write/,
	"the formation's URI as a connection string: $formation_dsn");
my $shard1_dsn = 'host=' . $shard1->host . ' port=' . $shard1->port;
my $proxy_dsn = 'host=' . $proxy->host . ' port=' . $proxy->port;

my $histdir = PostgreSQL::Test::Utils::tempdir;
my ($out, $err) = ('', '');
my $run = IPC::Run::start(
	[ $python, $checker, '--dsn', $proxy_dsn, '--shard-dsn', $formation_dsn, '--shard-dsn', $shard1_dsn,
		'--histdir', $histdir, '--clients', 4, '--duration', $duration, '--dbname', 'jepsen' ],
	'>', \$out, '2>', \$err, IPC::Run::timeout($duration + 300));
$proxy->poll_query_until('postgres', q{SELECT count(*) = 1 FROM pg_database WHERE datname = 'jepsen'})
  or die 'the checker did not create its database';
$proxy->poll_query_until('jepsen',
	q{SELECT count(*) = 3 FROM pg_proc WHERE pronamespace = to_regnamespace('jepsen')})
  or die 'the checker did not set up the proxy';
sleep(5);

# The primary's machine dies: its keeper, postmaster and backends at once.
my $acked_before = $nodes[0]->safe_psql('jepsen', q{SELECT count(*) FROM idempotency_records WHERE status = 'succeeded'});
my $killed_at = time;
kill 'KILL', -$service{node1};
waitpid(delete $service{node1}, 0);
pass("node1 (the primary) killed with its keeper while the checker ran ($acked_before results stored on it)");

# The monitor promotes a standby: reported and assigned wait_primary or
# primary.  Until then the promoted standby is read-only
# (default_transaction_read_only, so that target_session_attrs=read-write
# passes it by).
my $promoted;
while (time - $killed_at < 150)
{
	$promoted = $monitor->safe_psql('pg_auto_failover', q{
		SELECT nodename FROM pgautofailover.node
		 WHERE nodename <> 'node1' AND reportedstate IN ('wait_primary', 'primary')
		   AND goalstate IN ('wait_primary', 'primary')});
	last if $promoted ne '';
	sleep(0.2);
}
my $promotion = time - $killed_at;
ok(defined $node{$promoted}, sprintf('the monitor promoted %s, %.1f s after the kill', $promoted || 'nothing', $promotion))
  or die 'no promotion';
my $new = $node{$promoted};
my $writable;
while (time - $killed_at < 180)
{
	my ($rc, $writes) = eval {
		$new->psql('postgres',
			q{SELECT NOT pg_is_in_recovery() AND NOT current_setting('transaction_read_only')::bool});
	};
	last if defined $rc && $rc == 0 && $writes eq 't';
	sleep(0.2);
}
$writable = time - $killed_at;
my $writable_at = $new->safe_psql('postgres', 'SELECT clock_timestamp()');
note(sprintf('%s took writes %.1f s after the kill', $promoted, $writable));
cmp_ok($writable, '<', $duration - 15, "... and took writes before the checker's last 15 s");

my $finished = eval { $run->finish; 1 };
my $status = $finished ? $? : -1;
note($out);
note($err) if $err ne '';
ok($finished, 'the checker finished in time') or $run->kill_kill;
is($status, 0, 'the checker through the proxy passed (exit status 0)');
like($out, qr/violations=P1:0,P2:0,P3:0,P4:0,P5:0,P6:0,P7:0 -> PASS/,
	"the checker's verdict: no property violated, no acknowledged result lost");
like($out, qr/a later replay decided \d+ committed, \d+ not/, '... and every ambiguous call decided by a lookup');

# Every result acknowledged to a client for a key of shard 0 is on the new
# primary, as acknowledged: the histories' acknowledged completions (A) and
# replays (R) of the run (the checker loaded them into the proxy's database,
# schema merged), against the records there.
my $formation_connstr = $proxy->safe_psql('jepsen',
	q{SELECT connstr FROM idem_router_partitions() WHERE connstr LIKE '%target_session_attrs%' LIMIT 1});
my $tenants = $proxy->safe_psql('jepsen', qq{
	SELECT string_agg(n::text, ',') FROM generate_series(0, 63) n
	 WHERE idem_router_partition('jepsen-' || n) IN
	       (SELECT partition FROM idem_router_partitions() WHERE connstr = '$formation_connstr')});
die "no tenant of the checker on shard 0 ($formation_connstr)" if $tenants eq '';
my $acked = $proxy->safe_psql('jepsen', qq{
	COPY (SELECT DISTINCT kind, intent, result FROM merged.jepsen_history
	       WHERE kind IN ('A', 'R') AND client >= 0 AND intent % 64 IN ($tenants))
	TO STDOUT});
$acked .= "\n" if $acked ne '';
my ($n_acked, $n_replays, $missing, $example) = split /\|/, $new->safe_psql('jepsen', qq{
CREATE TEMP TABLE acked (kind text, intent bigint, result jsonb);
COPY acked FROM STDIN;
$acked\\.
SELECT count(*) FILTER (WHERE a.kind = 'A'), count(*) FILTER (WHERE a.kind = 'R'),
       count(*) FILTER (WHERE r.key IS NULL OR r.status <> 'succeeded' OR r.result IS DISTINCT FROM a.result),
       min(a.intent) FILTER (WHERE r.key IS NULL OR r.status <> 'succeeded' OR r.result IS DISTINCT FROM a.result)
  FROM acked a
  LEFT JOIN idempotency_records r ON r.scope = 'jepsen-' || a.intent % 64 AND r.key = a.intent::text});
cmp_ok($n_acked, '>', 0, "completions acknowledged for keys of shard 0: $n_acked (and $n_replays replays)");
is($missing, '0', '... every one on the new primary, succeeded, with the acknowledged result'
	  . ($missing ? " (e.g. intent $example)" : ''));

# The proxy served the new primary: records written there after it took writes.
my ($served, $first) = split /\|/, $new->safe_psql('jepsen', qq{
	SELECT count(*), coalesce(extract(epoch FROM min(updated_at) - '$writable_at'), -1)
	  FROM idempotency_records WHERE updated_at > '$writable_at'});
my ($remote) = $out =~ /(\d+) calls failed on the shard side/;
my ($requests) = $out =~ /requests (\d+):/;
note(sprintf('after the promotion: %d records written on %s (the first after %.2f s); %d of %d calls'
	  . ' failed on the shard side (most while shard 0 had no primary)',
	$served, $promoted, $first, $remote // -1, $requests // -1));
cmp_ok($served, '>', 0, "the checker's calls through the proxy wrote records on $promoted after its promotion");
ok($first >= 0 && $first < 10, '... the first within 10 s of it');

# The token epoch moved on before the new timeline's first token, once,
# and says so in the log.
my $timeline = $new->safe_psql('jepsen',
	q{SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int});
cmp_ok($timeline, '>', 1, "the new primary is on a new timeline ($timeline)");
my ($epoch, $recorded) = split /\|/, $new->safe_psql('jepsen',
	'SELECT (SELECT last_value FROM idem_token_epoch), (SELECT last_value FROM idem_token_timeline)');
is($recorded, $timeline, '... which the extension recorded');
cmp_ok($epoch, '>=', 2**24, "the token epoch moved on by 2^24 ($epoch): a token the old primary issued is never current again");
my $log = join('', map { slurp_file($_) } glob($new->data_dir . '/log/*'));
my @moves = $log =~ /idempotency token epoch moved from \d+ to \d+ for timeline $timeline/g;
is(scalar @moves, 1, "the new primary's log says so, once: idempotency token epoch moved ... for timeline $timeline");
# Tokens of the old timeline's epochs (below 2^24) are below 2^40.
my $new_tokens = $new->safe_psql('jepsen', q{SELECT count(*) FROM idempotency_records WHERE token >= 1::bigint << 40});
cmp_ok($new_tokens, '>', 0,
	"keys claimed on the new primary hold tokens above every token of the old timeline ($new_tokens)");

# The formation after: the other standby follows the new primary, which
# waits for it at each commit; the old primary, started again, rejoins.
my $other = (grep { $_->name ne 'node1' && $_->name ne $promoted } @nodes)[0];
ok($monitor->poll_query_until('pg_auto_failover', qq{
	SELECT count(*) = 2 FROM pgautofailover.node
	 WHERE (nodename = '$promoted' AND reportedstate = 'primary' AND goalstate = 'primary')
	    OR (nodename = '${\ $other->name}' AND reportedstate = 'secondary' AND goalstate = 'secondary')}),
	"$promoted primary, " . $other->name . ' its secondary');
like($new->safe_psql('postgres', 'SHOW synchronous_standby_names'), qr/^ANY 1 \(/,
	'... with synchronous replication');
start_service('node1');
ok($monitor->poll_query_until('pg_auto_failover',
		q{SELECT reportedstate = 'secondary' AND goalstate = 'secondary' FROM pgautofailover.node WHERE nodename = 'node1'}),
	'node1, started again, rejoins as a secondary');
is($nodes[0]->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), 't', '... a standby of the new primary');

stop_service($_) for qw(node1 node2 node3 monitor);
$shard1->stop;
$proxy->stop;
done_testing();
