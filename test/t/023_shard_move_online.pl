# The online partition move (issue 28: idem_move_partition, sql/README.md
# "Moving a partition", src/tools/README.md), without load: two shards
# (wal_level = logical), a proxy, four partitions.
#   - --help and --dry-run (the plan, nothing changed); a source without
#     wal_level = logical refused before anything is changed;
#   - a move paused inside its copy and after its first catch-up
#     (IDEM_MOVE_TEST_PAUSE): meanwhile a writer through the proxy gets no
#     40001, and changes of every kind are made (claims, completions,
#     releases, failures, a purge, an update that leaves a large TOASTed
#     result unchanged, inbox messages and a watermark, outbox emits, acks
#     and nacks, business inserts, updates and deletes, in a table with a
#     key and in one with REPLICA IDENTITY FULL and equal rows); the target
#     holds the partition meanwhile (a write there gets 40001, its relay and
#     its purge skip the partition's rows); after the move every table's
#     rows of the partition on the target are the source's, exactly;
#   - the shards print dates differently (DateStyle, TimeZone);
#   - failures injected mid-copy, mid-catch-up, after the freeze (an error:
#     the move undoes itself) and after the freeze as a crash, each followed
#     by a run that ends right, while writes go on between them.
# The freeze window is noted.
#
# Needs the mover installed by make install (test/t/IdemMove.pm) and
# python3-psycopg.
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

my $mover = idem_mover();

my @shards;
for my $i (0 .. 1)
{
	my $node = PostgreSQL::Test::Cluster->new("shard$i");
	$node->init(allows_streaming => 'logical');
	$node->append_conf('postgresql.conf', c_edition_conf("shared_preload_libraries = 'idempotency'\n"));
	$node->start;
	$node->safe_psql('postgres', 'CREATE DATABASE app');
	# Servers that print dates each their own way: values pass between them
	# as text (COPY, the slot's changes) and must come out the same.
	$node->safe_psql('postgres', $i == 0
		? q{ALTER DATABASE app SET DateStyle = 'Postgres, MDY'; ALTER DATABASE app SET TimeZone = 'America/New_York'}
		: q{ALTER DATABASE app SET DateStyle = 'SQL, DMY'; ALTER DATABASE app SET TimeZone = 'Asia/Tokyo'});
	$node->safe_psql('app', q{CREATE EXTENSION idempotency;
		CREATE SCHEMA shop;
		CREATE TABLE shop.orders (scope text, id int, amount int, note text, PRIMARY KEY (scope, id));
		CREATE TABLE shop.lines (scope text, item text, qty int);
		ALTER TABLE shop.lines REPLICA IDENTITY FULL;
		CREATE TABLE shop.tags (id int PRIMARY KEY, scope text, tag text)});
	push @shards, $node;
}
my @dsn = map { 'host=' . $_->host . ' port=' . $_->port . ' dbname=app' } @shards;
my $proxy = PostgreSQL::Test::Cluster->new('proxy');
$proxy->init;
$proxy->start;
$proxy->safe_psql('postgres', 'CREATE DATABASE app');
$proxy->safe_psql('app', qq{
	SET client_min_messages = warning;
	CREATE EXTENSION idempotency_router CASCADE;
	SELECT idem_router_configure(ARRAY['$dsn[0]', '$dsn[1]'], 4);
	CREATE USER MAPPING FOR PUBLIC SERVER idempotency;
});
my @proxy_args = ('--proxy', 'host=' . $proxy->host . ' port=' . $proxy->port . ' dbname=app');
my @tables = ('--table', 'shop.orders:scope', '--table', 'shop.lines:scope', '--table', 'shop.tags:scope');

sub scope_in
{
	my ($partition, $prefix) = @_;
	return $proxy->safe_psql('app',
		"SELECT s FROM (SELECT '$prefix-' || i AS s FROM generate_series(1, 1000) i) g
		  WHERE idem_router_partition(s) = $partition LIMIT 1");
}
sub map_of
{
	my ($partition) = @_;
	return $proxy->safe_psql('app', "SELECT connstr FROM idem_router_partitions() WHERE partition = $partition");
}
sub move
{
	my (%o) = @_;
	my $out = '';
	local $ENV{IDEM_MOVE_TEST_FAIL} = $o{fail} // '';
	IPC::Run::run([ $mover, @proxy_args, '--partition', $o{partition}, '--to', $o{to}, @tables,
			@{ $o{args} // [] } ], '>', \$out, '2>&1', IPC::Run::timeout(120));
	note($out);
	return ($? >> 8, $out);
}

# The partition's rows of every table, as text, in one order: what the
# target must hold after a move is what the source held at its freeze.
my %routing = (idempotency_records => 'scope', idem_inbox => 'consumer', idem_inbox_streams => 'consumer',
	idem_outbox => 'scope', 'shop.orders' => 'scope', 'shop.lines' => 'scope', 'shop.tags' => 'scope');
sub rows_of
{
	my ($node, $partition) = @_;
	return join("\n", map {
		"$_: " . $node->safe_psql('app',
			"SET DateStyle = ISO; SET TimeZone = UTC;
			 SELECT count(*) || E'\\n' || coalesce(string_agg(x::text, E'\\n' ORDER BY x::text), '')
			   FROM $_ x WHERE (idem_route_hash($routing{$_}) & 3) = $partition")
	} sort keys %routing);
}
sub count_of
{
	my ($node, $partition) = @_;
	return $node->safe_psql('app',
		"SELECT count(*) FROM idempotency_records WHERE (idem_route_hash(scope) & 3) = $partition");
}

# A file in the pause folder lets a paused move go on.
my $pause = PostgreSQL::Test::Utils::tempdir;
sub resume
{
	my ($point) = @_;
	open my $fh, '>', "$pause/$point" or die $!;
	close $fh;
}

# --help, and the checks before anything is changed.
my $help = '';
IPC::Run::run([ $mover, '--help' ], '>', \$help, '2>&1');
like($help, qr/usage: idem_move_partition .*--dry-run.*freeze/s, '--help prints the usage and the steps');

my $a = scope_in(1, 't');          # partition 1, on shard 1: the one moved first
my $b = scope_in(3, 'u');          # partition 3, on shard 1: the failures
my $c = scope_in(1, 'c');          # an inbox consumer of partition 1
is(map_of(1) . ' ' . map_of(3), "$dsn[1] $dsn[1]", 'partitions 1 and 3 are on shard 1');

$shards[1]->safe_psql('app', 'ALTER SYSTEM SET wal_level = replica');
$shards[1]->restart;
my ($rc, $out) = move(partition => 1, to => $dsn[0]);
isnt($rc, 0, 'a move from a shard without wal_level = logical is refused');
like($out, qr/error: the source shard has wal_level = replica; an online move needs logical\n.*HINT: Set wal_level = logical on the source shard .*Nothing was changed\./s,
	'... saying why, with a hint');
is($shards[1]->safe_psql('app', q{SELECT to_regnamespace('idem_move') IS NULL})
	  . $shards[0]->safe_psql('app', q{SELECT to_regnamespace('idem_move') IS NULL}), 'tt',
	'... before anything is changed on either shard');
$shards[1]->safe_psql('app', 'ALTER SYSTEM RESET wal_level');
$shards[1]->safe_psql('app', 'ALTER SYSTEM SET max_replication_slots = 0');
$shards[1]->restart;
($rc, $out) = move(partition => 1, to => $dsn[0]);
like($out, qr/error: the source shard has no free replication slot \(max_replication_slots = 0, 0 in use\)\n.*HINT: Raise max_replication_slots/s,
	'a source without a free replication slot is refused, with a hint');
is($shards[1]->safe_psql('app', q{SELECT to_regnamespace('idem_move') IS NULL}), 't', '... before anything is changed');
$shards[1]->safe_psql('app', 'ALTER SYSTEM RESET max_replication_slots');
$shards[1]->restart;

# Partition 1's data on shard 1, of every kind; and some of partition 3.
$shards[1]->safe_psql('app', qq{
	DO \$\$ DECLARE t bigint; BEGIN
	FOR i IN 1 .. 30 LOOP
		SELECT token INTO t FROM idem_claim('k' || i, '\\x01', '30s', '$a');
		PERFORM idem_complete('k' || i, t, jsonb_build_object('i', i), 200, '$a');
	END LOOP;
	FOR i IN 1 .. 3 LOOP
		SELECT token INTO t FROM idem_claim('old' || i, '\\x01', '30s', '$a');
		PERFORM idem_complete('old' || i, t, '{}', 200, '$a');
	END LOOP;
	SELECT token INTO t FROM idem_claim('big', '\\x01', '30s', '$a');
	PERFORM idem_complete('big', t, jsonb_build_object('big', (SELECT string_agg(md5(i::text), '')
	                                                            FROM generate_series(1, 1000) i)), 200, '$a');
	FOR i IN 1 .. 10 LOOP
		SELECT token INTO t FROM idem_claim('u' || i, '\\x01', '30s', '$b');
		PERFORM idem_complete('u' || i, t, '{}', 200, '$b');
	END LOOP;
	END \$\$;
	UPDATE idempotency_records SET expires_at = now() - interval '1 hour', purge_after = now() - interval '1 hour'
	 WHERE scope = '$a' AND key LIKE 'old%';
	SELECT idem_inbox_accept('$c', 'm' || i) FROM generate_series(1, 10) i;
	SELECT idem_inbox_accept('$c', 'gone' || i) FROM generate_series(1, 3) i;
	UPDATE idem_inbox SET expires_at = now() - interval '1 hour' WHERE consumer = '$c' AND message_id LIKE 'gone%';
	SELECT idem_inbox_accept_seq('$c', 's1', i) FROM generate_series(1, 5) i;
	SELECT idem_outbox_emit('mv', 'e' || i, jsonb_build_object('i', i), scope => '$a') FROM generate_series(1, 6) i;
	INSERT INTO shop.orders SELECT '$a', i, i * 10, 'n' || i FROM generate_series(1, 50) i;
	INSERT INTO shop.orders SELECT '$b', i, i, 'b' FROM generate_series(1, 5) i;
	INSERT INTO shop.lines SELECT '$a', 'x', 1 FROM generate_series(1, 3);
	INSERT INTO shop.lines SELECT '$a', 'i' || i, i FROM generate_series(1, 10) i;
	INSERT INTO shop.lines VALUES ('$b', 'z', 1);
	INSERT INTO shop.tags SELECT i, CASE WHEN i <= 5 THEN '$a' ELSE '$b' END, 't' || i FROM generate_series(1, 10) i;
});
my %token = map { $_ => $shards[1]->safe_psql('app', "SELECT token FROM idem_claim('$_', '\\x01', '1h', '$a')") }
  qw(p1 p2 p3 p4 p5);
# a relay on shard 1: e1 published, e2 dead, e3 and e4 in flight, e5 and e6 pending
my %held = map { split /\|/ } split /\n/, $shards[1]->safe_psql('app',
	q{SELECT aggregateid, id || ' ' || token FROM idem_outbox_claim('relay-1', 4, '1h', ARRAY['mv'])});
sub held { my ($k) = @_; return split / /, $held{$k}; }
$shards[1]->safe_psql('app', "SELECT idem_outbox_ack(ARRAY['" . (held('e1'))[0] . "']::uuid[], " . (held('e1'))[1] . ")");
$shards[1]->safe_psql('app', "SET idempotency.outbox_max_attempts = 1; SELECT idem_outbox_nack('"
	  . (held('e2'))[0] . "', " . (held('e2'))[1] . ", '{\"error\": \"poison\"}')");
is($shards[1]->safe_psql('app', "SELECT string_agg(aggregateid || ' ' || status, ', ' ORDER BY aggregateid) FROM idem_outbox WHERE scope = '$a'"),
	'e1 published, e2 dead, e3 in_flight, e4 in_flight, e5 pending, e6 pending',
	'before the move, partition 1\'s outbox holds a message in every status');

# The dry run: the plan, and nothing changed.
my $dry = '';
IPC::Run::run([ $mover, @proxy_args, '--partition', 1, '--to', $dsn[0], @tables, '--dry-run' ], '>', \$dry, '2>&1');
note($dry);
like($dry, qr/dry run: nothing is changed.*source .*wal_level logical.*"public"\."idempotency_records" +by scope +about \d+ rows, [\d.]+ MB \(primary key: scope, key\).*"shop"\."lines" +by scope +about \d+ rows.*\(replica identity full\).*slot +"idem_move_\d+_p1_of_4"/s,
	'--dry-run prints the plan: source, tables with their estimated rows and bytes and their keys, the slot');
is($shards[1]->safe_psql('app', q{SELECT to_regnamespace('idem_move') IS NULL})
	  . $shards[0]->safe_psql('app', q{SELECT to_regnamespace('idem_move') IS NULL})
	  . $shards[1]->safe_psql('app', q{SELECT count(*) FROM pg_replication_slots}) . ' ' . map_of(1),
	"tt0 $dsn[1]", '... and changes nothing');

# The move of partition 1 to shard 0, paused in its copy (after the
# records' table) and after its first catch-up.
my $moved = '';
my $h;
{
	local $ENV{IDEM_MOVE_TEST_PAUSE} = 'copy,catch-up';
	local $ENV{IDEM_MOVE_TEST_PAUSE_DIR} = $pause;
	$h = IPC::Run::start([ $mover, @proxy_args, '--partition', 1, '--to', $dsn[0], @tables ],
		'>', \$moved, '2>&1', IPC::Run::timeout(180));
}
$h->pump until $moved =~ /paused at copy/;
pass('the move paused in its copy, after the records');
# The mover's advisory lock is of a class of its own: the extension's
# (7457 to 7460) are taken by claims, grants and emits.
is($shards[1]->safe_psql('app', q{SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
	WHERE l.locktype = 'advisory' AND a.application_name = 'idem-move' AND l.classid BETWEEN 7457 AND 7460}),
	'0', 'the mover holds no advisory lock of the extension\'s classes');

# A writer through the proxy while the partition is copied: no 40001.
my ($o, $e) = ('', '');
$proxy->psql('app', qq{
	DO \$\$ DECLARE t bigint; BEGIN
	FOR i IN 1 .. 20 LOOP
		SELECT token INTO t FROM idem_claim('w' || i, '\\x01', '30s', '$a');
		PERFORM idem_complete('w' || i, t, jsonb_build_object('w', i), 201, '$a');
	END LOOP;
	END \$\$;
	SELECT idem_complete('p1', $token{p1}, '{"done": 1}', 200, '$a');
	SELECT idem_complete('p2', $token{p2}, '{"done": 2}', 200, '$a');
	SELECT idem_release('p3', $token{p3}, '$a');
	SELECT idem_fail('p4', $token{p4}, '{"error": "again"}', true, '$a');
	SELECT idem_inbox_accept('$c', 'n' || i) FROM generate_series(1, 5) i;
	SELECT idem_inbox_accept_seq('$c', 's1', 6);
	SELECT idem_inbox_accept_seq('$c', 's1', 7);
	SELECT idem_outbox_emit('mv', 'e7', '{"i": 7}', scope => '$a');
}, stdout => \$o, stderr => \$e, on_error_stop => 1);
is($e, '', 'a writer through the proxy during the copy: claims, completions, a release, a failure, inbox and outbox calls, no error (no 40001)');
# On the source directly: the relay, the purge, an update that leaves the
# large result unchanged (TOASTed), business rows; and some of partition 3.
$shards[1]->safe_psql('app', "SELECT idem_outbox_ack(ARRAY['" . (held('e3'))[0] . "']::uuid[], " . (held('e3'))[1] . ")");
$shards[1]->safe_psql('app', "SELECT idem_outbox_nack('" . (held('e4'))[0] . "', " . (held('e4'))[1] . ", '{\"error\": \"later\"}', '0s')");
my $purged = $shards[1]->safe_psql('app', 'SELECT idem_purge(1000)');
cmp_ok($purged, '>=', 6, "... a purge on the source during the copy ($purged rows: expired records and inbox messages)");
$shards[1]->safe_psql('app', qq{
	UPDATE idempotency_records SET expires_at = expires_at + interval '1 day' WHERE scope = '$a' AND key = 'big';
	INSERT INTO shop.orders SELECT '$a', i, i, 'new' FROM generate_series(51, 55) i;
	UPDATE shop.orders SET amount = -1, note = 'changed' WHERE scope = '$a' AND id = 1;
	DELETE FROM shop.orders WHERE scope = '$a' AND id IN (2, 53);
	INSERT INTO shop.lines VALUES ('$a', 'y', 2), ('$a', 'x', 1);
	UPDATE shop.lines SET qty = 9 WHERE ctid = (SELECT ctid FROM shop.lines WHERE scope = '$a' AND item = 'x' LIMIT 1);
	DELETE FROM shop.lines WHERE ctid = (SELECT ctid FROM shop.lines WHERE scope = '$a' AND item = 'x' AND qty = 1 LIMIT 1);
	DELETE FROM shop.lines WHERE scope = '$a' AND item = 'i3';
	INSERT INTO shop.orders VALUES ('$b', 6, 6, 'b');
	-- rows that change tenant, in and out of the partition: by a key that
	-- holds the routing column, and by one that does not
	UPDATE shop.orders SET scope = '$b', id = 100 WHERE scope = '$a' AND id = 4;
	UPDATE shop.orders SET scope = '$a', id = 101 WHERE scope = '$b' AND id = 1;
	UPDATE shop.tags SET scope = '$b' WHERE id = 1;
	UPDATE shop.tags SET scope = '$a' WHERE id = 6;
	UPDATE shop.tags SET tag = 'x' WHERE id IN (2, 7);
	DELETE FROM shop.tags WHERE id IN (3, 8);
});
resume('copy');
$h->pump until $moved =~ /paused at catch-up/;
pass('the copy committed on the target and the first catch-up ran');

# The target holds the partition: a write there gets 40001, its relay and
# its purge skip the partition's rows (one made expired on the target for
# the test, then set back).
$shards[0]->psql('app', "\\set VERBOSITY verbose\nSELECT idem_claim('direct', '\\x01', '30s', '$a')",
	stdout => \$o, stderr => \$e);
like($e, qr/ERROR:  40001: partition 1 of 4 is being moved onto this shard/,
	'during the move, a claim of the partition on the target gets 40001');
is($shards[0]->safe_psql('app', q{SELECT count(*) FROM idem_outbox_claim('relay-0', 100, '30s', ARRAY['mv'])}), '0',
	'... the target\'s relay is handed none of the partition\'s messages');
my $saved = $shards[0]->safe_psql('app', "SELECT expires_at || '|' || purge_after FROM idempotency_records WHERE scope = '$a' AND key = 'k30'");
my ($exp, $pa) = split /\|/, $saved;
$shards[0]->safe_psql('app', "SET session_replication_role = replica;
	UPDATE idempotency_records SET expires_at = now() - interval '1 hour', purge_after = now() - interval '1 hour'
	 WHERE scope = '$a' AND key = 'k30'");
$shards[0]->safe_psql('app', 'SELECT idem_purge(1000)');
is($shards[0]->safe_psql('app', "SELECT count(*) FROM idempotency_records WHERE scope = '$a' AND key = 'k30'"), '1',
	'... and the target\'s purge leaves the partition\'s expired record to the source\'s');
$shards[0]->safe_psql('app', "SET session_replication_role = replica;
	UPDATE idempotency_records SET expires_at = '$exp', purge_after = '$pa' WHERE scope = '$a' AND key = 'k30'");

# More changes after the first catch-up, then the source's rows are final
# (nothing writes the partition any more): the target must end with them.
$proxy->safe_psql('app', qq{
	SELECT idem_inbox_accept_seq('$c', 's1', 8);
	SELECT idem_complete('p5', $token{p5}, '{"done": 5}', 200, '$a');
});
$shards[1]->safe_psql('app', qq{
	UPDATE shop.orders SET note = 'late' WHERE scope = '$a' AND id = 3;
	INSERT INTO shop.lines VALUES ('$a', 'x', 1);
});
my ($e5id, $e5tok) = split /\|/, $shards[1]->safe_psql('app',
	q{SELECT id, token FROM idem_outbox_claim('relay-1', 1, '1h', ARRAY['mv']) WHERE aggregateid = 'e5'});
$shards[1]->safe_psql('app', "SELECT idem_outbox_ack(ARRAY['$e5id']::uuid[], $e5tok)") if $e5id;
my $expected = rows_of($shards[1], 1);
resume('catch-up');
$h->finish;
note($moved);
is($? >> 8, 0, 'the move of partition 1 to shard 0 ended');
like($moved, qr/partition 1 of 4 moved: .*; freeze window \d+ ms/, '... and says so');
my ($window) = $moved =~ /freeze window (\d+) ms/;
my ($rate) = $moved =~ /copy [\d.]+ s at ([\d.]+) MB\/s/;
note("freeze window $window ms (last catch-up and switch), the copy at $rate MB/s while writes went on");
cmp_ok($window, '<', 10000, '... with a freeze window of the last catch-up and the switch only');
like($moved, qr/caught up \(inserted, updated, deleted\): .*"shop"\."lines" \+\d+ ~\d+ -\d+.*; [1-9]\d* unchanged TOASTed values kept/,
	'... having caught up changes of every table, an unchanged TOASTed value among them');
is(rows_of($shards[0], 1), $expected,
	'every table\'s rows of partition 1 on shard 0 are those shard 1 held at the freeze, exactly');
is(count_of($shards[1], 1) . ' ' . $shards[1]->safe_psql('app', 'SELECT count(*) FROM pg_replication_slots'), '0 0',
	'shard 1 holds none of them any more, nor a replication slot');
is($shards[0]->safe_psql('app', q{SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'idem_move_hold%'})
	  . ' ' . $shards[0]->safe_psql('app', 'SELECT count(*) FROM idem_move.holding'), '0 0',
	'the target\'s hold is gone');
is($proxy->safe_psql('app', "SELECT status FROM idem_lookup('w7', '$a')"), 'succeeded',
	'a key written during the copy is found through the proxy on shard 0');
is($proxy->safe_psql('app', "SELECT outcome FROM idem_claim('after', '\\x01', '30s', '$a')"), 'new',
	'... where a new claim of the partition goes');
$shards[1]->psql('app', "\\set VERBOSITY verbose\nSELECT idem_claim('stale', '\\x01', '30s', '$a')",
	stdout => \$o, stderr => \$e);
like($e, qr/ERROR:  40001: partition 1 of 4 has moved to another shard/, 'shard 1 refuses the partition\'s writes (the fence stays)');

# Failures, each followed by a run: partition 3 (shard 1 to shard 0), with
# writes through the proxy between the runs.
my $n = 0;
sub write_b
{
	$n++;
	return $proxy->safe_psql('app', "SELECT outcome FROM idem_claim('between$n', '\\x01', '30s', '$b')");
}
($rc, $out) = move(partition => 3, to => $dsn[0], fail => 'mid-copy');
is($rc, 3, 'a move of partition 3 crashed in its copy');
is(write_b() . ' ' . $shards[1]->safe_psql('app', 'SELECT count(*) FROM pg_replication_slots'), 'new 0',
	'... its writes go on on the source, and its slot went with its session');
($rc, $out) = move(partition => 3, to => $dsn[0], fail => 'mid-catch-up');
is($rc, 3, 'the next run crashed after its first catch-up');
like($out, qr/resuming: partition 3 was left by an interrupted move: it starts over/, '... having started over');
is(write_b(), 'new', '... and the writes still go on on the source');
($rc, $out) = move(partition => 3, to => $dsn[0], fail => 'after-freeze');
is($rc, 1, 'the next run failed after its freeze');
like($out, qr/stopped after the freeze.*the move is undone: the partition is served by the source as before/s,
	'... and undid the move');
is(write_b() . ' ' . count_of($shards[0], 3) . ' ' . $shards[0]->safe_psql('app', 'SELECT count(*) FROM idem_move.holding'),
	'new 0 0', '... so the source takes writes again, and the target holds nothing of the partition');
($rc, $out) = move(partition => 3, to => $dsn[0], fail => 'crash-after-freeze');
is($rc, 3, 'the next run crashed after its freeze');
$proxy->psql('app', "SELECT idem_claim('frozen', '\\x01', '30s', '$b')", stdout => \$o, stderr => \$e);
like($e, qr/partition 3 of 4 has moved to another shard/, '... leaving the partition frozen on the source (40001)');
$expected = rows_of($shards[1], 3);
# (through --direct: the connection strings of the map spelled otherwise, as
# where the map goes through a pooler and the tool must not)
my @direct = map { ('--direct', $dsn[$_], 'dbname=app port=' . $shards[$_]->port . ' host=' . $shards[$_]->host) } 0 .. 1;
($rc, $out) = move(partition => 3, to => $dsn[0], args => \@direct);
is($rc, 0, 'the last run moved partition 3 (connecting to the shards through --direct)');
like($out, qr/resuming: partition 3 was left by an interrupted move \(frozen on the source: unfrozen now, writes go on\): it starts over/,
	'... after unfreezing the source and starting over');
is(rows_of($shards[0], 3), $expected, '... with every table\'s rows of partition 3 as the source held them, exactly');
is($proxy->safe_psql('app', "SELECT count(*) FROM generate_series(1, $n) g, idem_lookup('between' || g, '$b') l WHERE l.status = 'processing'"),
	$n, '... the claims made between the runs among them, found through the proxy');

$proxy->stop;
$_->stop for @shards;
done_testing();
