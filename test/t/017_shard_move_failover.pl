# Scale-out under load (issue 16): the Jepsen-style checker runs through a
# PL/Proxy proxy to four shards (16 partitions) while
#   - a partition moves from shard 1 to shard 2 (idem_move_partition, the
#     installed src/tools/idem_move_partition: copied while its writes go on,
#     caught up from a logical replication slot, frozen with a retryable
#     SQLSTATE for the last catch-up and the switch of the proxy's map), and
#   - shard 0, which runs with a synchronous standby, fails: its primary stops
#     (immediate) and the standby is promoted; the proxy reaches it through
#     the multi-host connection string of the map (target_session_attrs=
#     read-write).
# The checker's properties must hold: no acknowledged result lost (P2), no
# key on two shards (P7), no stale token completing (P4), every ambiguous
# call decided.  The move must have copied records and business rows
# written under load, and the proxy must have served shard 0 after the
# promotion (records written there soon after it, a share of the load, and
# few calls failed on the shard side), which the properties alone do not
# show: a proxy that never reached the new primary fails its calls there
# without violating any.  Then, without load, a partition moved while its key is
# owned: the old shard has nothing left to complete (IK004) and refuses new
# claims of the partition (40001), the record moved with its token, and
# after a takeover on the new shard the old token stays refused (IK002).
# The partition's outbox moves with it, a message in every status, as it
# was (tokens, leases, emit order): nothing of it is left to relay on the
# source, whose relay's ack of a message it held finds nothing there (IK004);
# a copy left frozen on the source is not handed out; on the target a
# message keeps its lease, a take-over draws a token above the source's,
# the old holder's ack is refused (IK002), and a message emitted after the
# move waits behind its key's moved one.  Last, a partition moves onto a
# fifth shard, a new node (--new-shard), which a shard of the map spelled
# differently cannot pass for, and its calls land there.
#
# Needs the checkout (IDEM_CHECKOUT, set by test/run) for the checker, the
# mover installed by make install (test/t/IdemMove.pm), and python3-psycopg.
# The shards run with wal_level = logical, which the online move needs.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemEdition;
use IdemMove;
use IPC::Run;
use Time::HiRes qw(time sleep);

my $checkout = $ENV{IDEM_CHECKOUT};
die "IDEM_CHECKOUT must name the checkout (test/run sets it)"
  unless defined $checkout && -f "$checkout/test/jepsen/checker.py";
my $checker = "$checkout/test/jepsen/checker.py";
my $mover = idem_mover();
my $python = -x '/usr/bin/python3' ? '/usr/bin/python3' : 'python3';
my $nshards = 4;

my @shards;
for my $i (0 .. $nshards - 1)
{
	my $node = PostgreSQL::Test::Cluster->new("shard$i");
	$node->init(allows_streaming => 'logical');
	$node->append_conf('postgresql.conf',
		c_edition_conf("shared_preload_libraries = 'idempotency'\n") . "max_connections = 60\n");
	$node->start;
	push @shards, $node;
}

# Shard 0's synchronous standby: a COMMIT returns once the standby has it.
my $primary = $shards[0];
$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('shard0s');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->append_conf('postgresql.conf', "max_connections = 60\n");
$standby->start;
$primary->safe_psql('postgres', q{ALTER SYSTEM SET synchronous_standby_names = 'shard0s'});
$primary->reload;
$primary->poll_query_until('postgres',
	q{SELECT sync_state = 'sync' FROM pg_stat_replication WHERE application_name = 'shard0s'})
  or die 'the standby did not become synchronous';
pass('shard 0 runs with a synchronous standby');

my $proxy = PostgreSQL::Test::Cluster->new('proxy');
$proxy->init;
$proxy->append_conf('postgresql.conf', "max_connections = 60\n");
$proxy->start;

# The shards as the checker and the map see them; shard 0 by both hosts.
my @shard_dsn = map { 'host=' . $_->host . ' port=' . $_->port . ' user=postgres' } @shards;
$shard_dsn[0] = 'host=' . $primary->host . ',' . $standby->host . ' port=' . $primary->port . ','
  . $standby->port . ' user=postgres target_session_attrs=read-write';
my $proxy_dsn = 'host=' . $proxy->host . ' port=' . $proxy->port . ' user=postgres';

my $histdir = PostgreSQL::Test::Utils::tempdir;
my ($out, $err) = ('', '');
my $run = IPC::Run::start(
	[ $python, $checker, '--dsn', $proxy_dsn, (map { ('--shard-dsn', $_) } @shard_dsn),
		'--histdir', $histdir, '--clients', 6, '--duration', 40, '--dbname', 'jepsen' ],
	'>', \$out, '2>', \$err);

# The checker creates its databases, then its clients start.
$proxy->poll_query_until('postgres', q{SELECT count(*) = 1 FROM pg_database WHERE datname = 'jepsen'})
  or die 'the checker did not create its database';
$proxy->poll_query_until('jepsen',
	q{SELECT count(*) = 3 FROM pg_proc WHERE pronamespace = to_regnamespace('jepsen')})
  or die 'the checker did not set up the proxy';
sleep(5);

# A partition of shard 1 moves to shard 2 under load.
my %map = map { split /\|/ } split /\n/,
  $proxy->safe_psql('jepsen', 'SELECT partition, connstr FROM idem_router_partitions()');
my $partition = 1;
my $moved = '';
my $t0 = time;
IPC::Run::run([ $mover, '--proxy', "$proxy_dsn dbname=jepsen", '--partition', $partition,
		'--to', $map{2}, '--table', 'jepsen_business:scope' ],
	'>', \$moved, '2>&1');
note($moved);
like($moved, qr/partition 1 of 16 moved: .*idempotency_records" \d+.*; freeze window \d+ ms/,
	'a partition moved from shard 1 to shard 2 while the checker ran');
my ($window) = $moved =~ /freeze window (\d+) ms/;
my ($caught) = $moved =~ /caught up \(inserted, updated, deleted\): (.*)/;
note("freeze window: $window ms; changes caught up from the slot: " . ($caught // 'none'));
my ($copied_records) = $moved =~ /moved: .*idempotency_records" (\d+)/;
my ($copied_business) = $moved =~ /moved: .*jepsen_business" (\d+)/;
cmp_ok($copied_records // 0, '>', 0, "... copying the partition's records written under load ($copied_records)");
cmp_ok($copied_business // 0, '>', 0, "... and its business rows ($copied_business)");
is($proxy->safe_psql('jepsen', "SELECT connstr FROM idem_router_partitions() WHERE partition = $partition"),
	$map{2}, '... the proxy\'s map points at shard 2');

# Shard 0 fails over to its synchronous standby under load.
sleep(4);
$primary->stop('immediate');
$standby->promote;
my $promoted_at = $standby->safe_psql('postgres', 'SELECT clock_timestamp()');
pass('shard 0\'s primary stopped, its standby promoted, while the checker ran');

$run->finish;
note($out);
note($err) if $err ne '';
is($?, 0, 'the checker through the proxy passed (exit status 0)');
like($out, qr/violations=P1:0,P2:0,P3:0,P4:0,P5:0,P6:0,P7:0 -> PASS/,
	'no property violated: no acknowledged result lost, no key on two shards, no stale token completed');
my ($moves) = $out =~ /(\d+) serialization failures/;
note("calls refused during the freeze (40001) and retried: $moves");
like($out, qr/a later replay decided \d+ committed, \d+ not/, 'every ambiguous call was decided by a lookup');
is($standby->safe_psql('jepsen', q{SELECT pg_is_in_recovery()}), 'f', 'the promoted standby serves shard 0');
ok($standby->safe_psql('jepsen', q{SELECT count(*) FROM idempotency_records}) > 0,
	'... with shard 0\'s records');
is($shards[1]->safe_psql('jepsen',
		"SELECT count(*) FROM idempotency_records WHERE (idem_route_hash(scope) & 15) = $partition"),
	'0', 'the moved partition\'s records are gone from shard 1');
# The proxy served shard 0 after the promotion: the checker's calls wrote
# records there soon after it, not only the other shards' (a proxy that
# never reached the new primary would count its calls to shard 0 as failed
# on the shard side and still pass the properties).
my $after = "updated_at > '$promoted_at'";
my ($served, $first) = split /\|/, $standby->safe_psql('jepsen',
	"SELECT count(*), coalesce(extract(epoch FROM min(updated_at) - '$promoted_at'), -1) FROM idempotency_records WHERE $after");
my $elsewhere = 0;
$elsewhere += $shards[$_]->safe_psql('jepsen', "SELECT count(*) FROM idempotency_records WHERE $after") for 1 .. 3;
my ($requests) = $out =~ /requests (\d+):/;
my ($remote) = $out =~ /(\d+) calls failed on the shard side/;
note(sprintf('after the promotion: %d records written on shard 0 (the first after %.2f s), %d on shards 1 to 3;'
	  . ' %d of %d calls failed on the shard side', $served, $first, $elsewhere, $remote // -1, $requests // -1));
cmp_ok($served, '>', 0, 'the checker\'s calls through the proxy wrote records on shard 0 after its promotion');
ok($first >= 0 && $first < 10, '... the first within 10 s of it');
cmp_ok($served * 8, '>', $elsewhere, '... and shard 0 took a share of the load (it has a quarter of the partitions), not a trickle');
ok(defined $remote && $remote * 20 < $requests,
	'... so the calls that failed on the shard side (' . ($remote // '?') . ') are few (under 5% of the requests)');

# Fencing across a move, without load: an owner of a key of partition 5
# (shard 1), a move to shard 3 while it works.
my $scope = $proxy->safe_psql('jepsen',
	q{SELECT s FROM (SELECT 'fence-' || i AS s FROM generate_series(1, 1000) i) g
	   WHERE idem_router_partition(s) = 5 LIMIT 1});
my $token = $proxy->safe_psql('jepsen', "SELECT token FROM idem_claim('k', '\\x01', '3s', '$scope')");

# The partition's outbox: five messages emitted through the proxy, and a
# relay on shard 1 (on the shard directly) that publishes one, makes one
# dead, and holds two in flight, one for an hour, one for 2 s.
my %msg = map { $_ => $proxy->safe_psql('jepsen', "SELECT idem_outbox_emit('move', '$_', '{}', scope => '$scope')") }
  qw(published dead held lapsing pending);
sub src_claim
{
	my ($lease) = @_;
	return split /\|/, $shards[1]->safe_psql('jepsen',
		"SELECT id, token FROM idem_outbox_claim('relay-src', 1, '$lease', ARRAY['move'])");
}
my ($mid, $mtok) = src_claim('30s');
$shards[1]->safe_psql('jepsen', "SELECT idem_outbox_ack(ARRAY['$mid']::uuid[], $mtok)");
($mid, $mtok) = src_claim('30s');
$shards[1]->safe_psql('jepsen',
	"SET idempotency.outbox_max_attempts = 1; SELECT idem_outbox_nack('$mid', $mtok, '{\"error\": \"poison\"}')");
my ($held_id, $held_token) = src_claim('1h');
my ($lapsing_id, $lapsing_token) = src_claim('2s');
my $outbox_rows = q{SELECT string_agg(o::text, E'\n' ORDER BY seq) FROM idem_outbox o WHERE aggregatetype = 'move'};
my $before = $shards[1]->safe_psql('jepsen', $outbox_rows);
is($shards[1]->safe_psql('jepsen',
		q{SELECT string_agg(aggregateid || ' ' || status, ', ' ORDER BY seq) FROM idem_outbox WHERE aggregatetype = 'move'}),
	'published published, dead dead, held in_flight, lapsing in_flight, pending pending',
	'before the move, the partition\'s outbox on shard 1: a message in every status');
IPC::Run::run([ $mover, '--proxy', "$proxy_dsn dbname=jepsen", '--partition', 5,
		'--to', $map{3} ], '>', \$moved, '2>&1');
like($moved, qr/partition 5 of 16 moved/, 'a partition with an owned key moved to shard 3');
my ($o, $e) = ('', '');
$shards[1]->psql('jepsen', "\\set VERBOSITY verbose\nSELECT idem_complete('k', $token, '{}', 200, '$scope')",
	stdout => \$o, stderr => \$e);
like($e, qr/ERROR:  IK004: /, 'the old shard has nothing left for the owner to complete (IK004)');
$shards[1]->psql('jepsen', "\\set VERBOSITY verbose\nSELECT idem_claim('k2', '\\x01', '3s', '$scope')",
	stdout => \$o, stderr => \$e);
like($e, qr/ERROR:  40001: partition 5 of 16 has moved to another shard/,
	'... and refuses a new claim of the partition with a retryable 40001 (the fence stays)');
like($moved, qr/idem_outbox" 5\b/, 'the move copied the partition\'s five outbox messages');
is($shards[3]->safe_psql('jepsen', $outbox_rows), $before,
	'... to shard 3 as they were: status, token, lease, attempts, emit order');
is($shards[1]->safe_psql('jepsen', q{SELECT count(*) FROM idem_outbox WHERE (idem_route_hash(scope) & 15) = 5}),
	'0', 'no message of the partition is left on shard 1');
is($shards[1]->safe_psql('jepsen', q{SELECT count(*) FROM idem_outbox_claim('relay-src', 100, '30s', ARRAY['move'])}),
	'0', '... so its relay has nothing of it to hand out');
$shards[1]->psql('jepsen',
	"\\set VERBOSITY verbose\nSELECT idem_outbox_ack(ARRAY['$held_id']::uuid[], $held_token)",
	stdout => \$o, stderr => \$e);
like($e, qr/ERROR:  IK004: /,
	'the source relay\'s ack of a message it held finds nothing on shard 1 (IK004): it publishes nothing as done');
$shards[1]->psql('jepsen',
	"\\set VERBOSITY verbose\nSELECT idem_outbox_emit('move', 'late', '{}', scope => '$scope')",
	stdout => \$o, stderr => \$e);
like($e, qr/ERROR:  40001: partition 5 of 16 has moved/, 'an emit of the partition on shard 1: 40001');
# A copy left on the source (a move that failed between its switch and its
# cleanup leaves one): frozen, never handed out there, its ack refused.
$shards[1]->safe_psql('jepsen', qq{
	SET session_replication_role = replica;
	INSERT INTO idem_outbox (id, seq, token, created_at, available_at, lease_expires_at, updated_at,
	                         attempts, status, scope, aggregatetype, aggregateid, payload)
	VALUES ('$held_id', 1, 7, now(), now(), now() - interval '1s', now(), 1, 'in_flight', '$scope',
	        'move', 'left', '{}')});
is($shards[1]->safe_psql('jepsen', q{SELECT count(*) FROM idem_outbox_claim('relay-src', 100, '30s', ARRAY['move'])}),
	'0', 'a copy left frozen on shard 1 (its lease run out) is not taken over by its relay');
$shards[1]->psql('jepsen', "\\set VERBOSITY verbose\nSELECT idem_outbox_ack(ARRAY['$held_id']::uuid[], 7)",
	stdout => \$o, stderr => \$e);
like($e, qr/ERROR:  40001: partition 5 of 16 has moved/, '... and an ack of it is refused with 40001');
$shards[1]->safe_psql('jepsen', "SET idem_move.cleanup = 'on'; DELETE FROM idem_outbox WHERE id = '$held_id'");
my $later = $proxy->safe_psql('jepsen', "SELECT idem_outbox_emit('move', 'pending', '{\"n\": 2}', scope => '$scope')");
is($shards[3]->safe_psql('jepsen', "SELECT count(*) FROM idem_outbox WHERE id = '$later'"), '1',
	'an emit through the proxy after the move lands on shard 3');
is($shards[3]->safe_psql('jepsen', "SELECT token || ' ' || status FROM idempotency_records WHERE scope = '$scope' AND key = 'k'"),
	"$token processing", 'the record moved with its token');
sleep(3.5);
my $takeover = $proxy->safe_psql('jepsen', "SELECT outcome || ' ' || token FROM idem_claim('k', '\\x01', '30s', '$scope')");
like($takeover, qr/^takeover (\d+)$/, 'after the lease, a claim through the proxy takes the key over on shard 3');
my ($new) = $takeover =~ /(\d+)$/;
cmp_ok($new, '>', $token, '... with a larger token');
$proxy->psql('jepsen', "\\set VERBOSITY verbose\nSELECT idem_complete('k', $token, '{}', 200, '$scope')",
	stdout => \$o, stderr => \$e);
like($e, qr/ERROR:  IK002: /, 'the stale owner is refused through the proxy (IK002) on the new shard');

# The outbox on shard 3, through the proxy: the held message keeps its
# hour-long lease, the lapsed one is taken over with a token above every one
# the source issued, the pending one comes before the message its key
# emitted after the move, and the old holder's ack is refused.
my @got = split /\n/, $proxy->safe_psql('jepsen',
	"SELECT aggregateid || ' ' || id || ' ' || token FROM idem_outbox_claim_on('$map{3}', 'relay-dst', 100, '30s', ARRAY['move']) ORDER BY aggregateid");
is(join(', ', map { (split / /)[0] } @got), 'lapsing, pending',
	'a relay of shard 3 gets a lapsed and a pending message, not the held one');
my ($dst_token) = (split / /, $got[0] // '')[2];
cmp_ok($dst_token // 0, '>', $lapsing_token, "... under a token above the source's ($lapsing_token)");
is(join(' ', map { (split / /)[1] } @got), "$lapsing_id $msg{pending}", '... the moved ones, not the message their key emitted after the move');
$proxy->psql('jepsen',
	"\\set VERBOSITY verbose\nSELECT idem_outbox_ack_on('$map{3}', ARRAY['$lapsing_id']::uuid[], $lapsing_token)",
	stdout => \$o, stderr => \$e);
like($e, qr/ERROR:  IK002: /, 'the old holder\'s ack of the lapsed message on shard 3: IK002');
is($proxy->safe_psql('jepsen',
		"SELECT idem_outbox_ack_on('$map{3}', ARRAY['$lapsing_id', '$msg{pending}']::uuid[], $dst_token)"),
	'2', 'the new holder acknowledges both');
is($proxy->safe_psql('jepsen',
		"SELECT string_agg(id::text, ' ') FROM idem_outbox_claim_on('$map{3}', 'relay-dst', 100, '30s', ARRAY['move'])"),
	$later, '... and then the later message of the key is handed out');

# Growing onto a fifth shard, a new node: its schema is shard 3's (pg_dump
# --schema-only: the extension, the business table and functions); the
# move of partition 3 needs --new-shard, and refuses shard 2 spelled
# differently.
my $shard4 = PostgreSQL::Test::Cluster->new('shard4');
$shard4->init;
$shard4->append_conf('postgresql.conf', c_edition_conf("shared_preload_libraries = 'idempotency'\n"));
$shard4->start;
my $dump = '';
IPC::Run::run([ 'pg_dump', '--schema-only', '--no-owner', '-d', $map{3} ], '>', \$dump)
  or die 'pg_dump of shard 3 failed';
$shard4->safe_psql('postgres', 'CREATE DATABASE jepsen');
$shard4->safe_psql('jepsen', $dump);
my $new_dsn = 'host=' . $shard4->host . ' port=' . $shard4->port . ' user=postgres dbname=jepsen';
my @move3 = ($mover, '--proxy', "$proxy_dsn dbname=jepsen", '--partition', 3,
	'--table', 'jepsen_business:scope');
IPC::Run::run([ @move3, '--to', $new_dsn ], '>', \$moved, '2>&1');
like($moved, qr/is not a shard of the map .*--new-shard/,
	'a move to a shard the map does not hold needs --new-shard');
my $respelled = 'port=' . $shards[2]->port . ' dbname=jepsen host=' . $shards[2]->host . ' user=postgres';
IPC::Run::run([ @move3, '--to', $respelled, '--new-shard' ], '>', \$moved, '2>&1');
like($moved, qr/is shard .* of the map, spelled\s+differently/,
	'--new-shard refuses a shard of the map under another spelling');
is($proxy->safe_psql('jepsen', q{SELECT count(DISTINCT connstr) FROM idem_router_partitions()}), '4',
	'... and the map still has four shards');
my $p3_records = $shards[3]->safe_psql('jepsen',
	q{SELECT count(*) FROM idempotency_records WHERE (idem_route_hash(scope) & 15) = 3});
IPC::Run::run([ @move3, '--to', $new_dsn, '--new-shard' ], '>', \$moved, '2>&1');
note($moved);
like($moved, qr/partition 3 of 16 moved: .*idempotency_records" $p3_records\b/,
	"partition 3 moved onto a fifth shard with --new-shard ($p3_records records)");
is($proxy->safe_psql('jepsen', q{SELECT connstr FROM idem_router_partitions() WHERE partition = 3}),
	$new_dsn, '... the map names the new shard for it');
my $scope3 = $proxy->safe_psql('jepsen',
	q{SELECT s FROM (SELECT 'grow-' || i AS s FROM generate_series(1, 1000) i) g
	   WHERE idem_router_partition(s) = 3 LIMIT 1});
is($proxy->safe_psql('jepsen', "SELECT outcome FROM idem_claim('g', '\\x01', '30s', '$scope3')"), 'new',
	'a claim of the partition through the proxy');
is($shard4->safe_psql('jepsen', "SELECT count(*) FROM idempotency_records WHERE scope = '$scope3'")
	  . ' ' . $shards[3]->safe_psql('jepsen', "SELECT count(*) FROM idempotency_records WHERE scope = '$scope3'"),
	'1 0', '... lands on the new shard, not on shard 3');
is($proxy->safe_psql('jepsen', "SELECT status FROM idem_lookup('g', '$scope3')"), 'processing',
	'... and a lookup through the proxy reads it there');

$shard4->stop;
$proxy->stop;
$standby->stop;
$_->stop for @shards[1 .. $#shards];
done_testing();
