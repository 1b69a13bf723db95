# The partition mover's troubles (idem_move_partition, sql/README.md
# "Moving a partition"), without load: two shards, four partitions, two
# proxies.  Every proxy named is switched before the source is cleaned up,
# so a read through either finds the moved keys.  An idle transaction that
# holds an xid keeps the slot from being created: the move gives up after
# --slot-timeout, naming it, with nothing left.  A freeze blocked by an
# idle transaction's lock stalls other writers of the source for at most
# its lock timeout, and gives up cleanly (no fence left, the copy undone)
# or succeeds once the blocker ends.  Business tables are copied column by name, and a target
# that lacks a column is refused; a schema idem_move that is not the
# mover's (or a superuser's) is refused.  A move that stopped between its
# copy and its switch resumes when run again, unless the target's rows are
# not the source's; one that stopped after one proxy's switch resumes too.
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
	my @cmd = ($mover, @{ $o{proxies} // \@proxy_args }, '--partition', $o{partition},
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

# The slot's creation waits for the transactions open on the source (its
# snapshot needs a consistent point): an idle transaction that wrote
# (a claim of partition 0, uncommitted) keeps the move of partition 2
# (shard 0 to shard 1) from starting; after --slot-timeout it gives up,
# naming the transaction, with nothing left on either shard.
my $s0 = scope_in(0, 'b');
my $s2 = scope_in(2, 'c');
$proxy->safe_psql('app', "SELECT idem_claim('k$_', '\\x01', '30s', '$s2')") for 1 .. 3;
my $blocker = $shards[0]->background_psql('app');
$blocker->query_safe("BEGIN; SELECT idem_claim('blocker', '\\x01', '30s', '$s0')");
($rc, $out) = move(partition => 2, to => $dsn[1], args => [ '--slot-timeout', '2' ]);
isnt($rc, 0, 'a move whose slot cannot be created (an idle transaction holds an xid) gives up');
like($out, qr/could not create the replication slot on the source within --slot-timeout \(2 s\).*pid \d+ \(postgres, idle in transaction/s,
	'... after --slot-timeout, naming the transaction');
like($out, qr/the move is undone/, '... and says the move is undone');
is($shards[0]->safe_psql('app', q{SELECT count(*) FROM pg_replication_slots}), '0', '... no slot left on the source');
is($shards[1]->safe_psql('app', q{SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'idem_move_hold_p2_of_4%'})
	  . ' ' . $shards[1]->safe_psql('app', q{SELECT count(*) FROM idem_move.holding}),
	'0 0', '... nor a hold on the target');
$blocker->query_safe('COMMIT');

# A freeze that cannot get its locks stalls nobody for long: the move
# pauses after its first catch-up (IDEM_MOVE_TEST_PAUSE), an idle
# transaction on shard 0 then takes a write lock on the records (a claim of
# partition 0, uncommitted); the freeze of partition 2 waits at most
# --lock-timeout for each lock, rolls back and tries again.
my $pause = PostgreSQL::Test::Utils::tempdir;
my @move2 = ($mover, @proxy_args, '--partition', 2, '--to', $dsn[1], '--lock-timeout', '1s');
sub start_move
{
	my ($retries, $outref) = @_;
	unlink "$pause/catch-up";
	local $ENV{IDEM_MOVE_TEST_PAUSE} = 'catch-up';
	local $ENV{IDEM_MOVE_TEST_PAUSE_DIR} = $pause;
	my $h = IPC::Run::start([ @move2, '--lock-retries', $retries ], '>', $outref, '2>&1',
		IPC::Run::timeout(60));
	$h->pump until $$outref =~ /paused at catch-up/;
	$blocker->query_safe("BEGIN; SELECT idem_claim('blocker-$retries', '\\x01', '30s', '$s0')");
	open my $fh, '>', "$pause/catch-up" or die $!;
	close $fh;
	$shards[0]->poll_query_until('app',
		q{SELECT count(*) > 0 FROM pg_stat_activity WHERE application_name = 'idem-move' AND wait_event_type = 'Lock'})
	  or die 'the move did not wait for its lock';
	return $h;
}
# The mover's exit status in $?, or 255 when it ran into the timeout (killed).
sub finish_move
{
	my ($h) = @_;
	return if eval { $h->finish; 1 };
	$h->kill_kill;
	$? = 255 << 8;
}
my $failed = '';
my $h = start_move(1, \$failed);
# A claim of another partition of shard 0 queues behind the freeze's lock
# request: it must go through once that request times out.
my $t0 = time;
my ($o, $e) = ('', '');
$proxy->psql('app', "SET statement_timeout = '15s'; SELECT outcome FROM idem_claim('other', '\\x01', '30s', '$s0')",
	stdout => \$o, stderr => \$e);
my $waited = time - $t0;
note(sprintf('a claim on shard 0 during the blocked freeze took %.2f s', $waited));
is($o, 'new', 'a claim of another partition of the source goes through while the freeze is blocked');
cmp_ok($waited, '<', 3, '... within about the lock timeout (1 s)');
finish_move($h);
note($failed);
isnt($? >> 8, 0, 'the move gives up when the lock is still held after its last try');
like($failed, qr/the freeze on the source: no lock within lock_timeout 1s in 2 tries \(.*\); nothing was changed there.*pid \d+ \(postgres, idle in transaction/s,
	'... and says so, naming the idle transaction that holds the lock');
like($failed, qr/the move is undone: the partition is served by the source as before/, '... and that the move is undone');
is($shards[0]->safe_psql('app', q{SELECT count(*) FROM pg_trigger WHERE tgname = 'idem_move_p2_of_4'}), '0',
	'... leaving no fence on the source');
is($shards[1]->safe_psql('app', q{SELECT count(*) FROM idempotency_records WHERE (idem_route_hash(scope) & 3) = 2}), '0',
	'... nor the copy on the target');
is(map_of($_, 2), $dsn[0], '... and partition 2 of ' . $_->name . ' on shard 0') for @proxies;
is($proxy->safe_psql('app', "SET statement_timeout = '15s'; SELECT outcome FROM idem_claim('k4', '\\x01', '30s', '$s2')"), 'new',
	'... where it still takes claims');
$blocker->query_safe('COMMIT');

# The same move, while the blocker ends during its tries: it moves.
my $moved2 = '';
$h = start_move(6, \$moved2);
sleep(1.5);
$blocker->query_safe('COMMIT');
$blocker->quit;
finish_move($h);
note($moved2);
is($? >> 8, 0, 'the move succeeds once the idle transaction ends between its tries');
like($moved2, qr/no lock within lock_timeout 1s \(try 1 of 7.*partition 2 of 4 moved: .*idempotency_records" 4\b/s,
	'... after a try that timed out, with the partition\'s four records');

# Business tables are copied by column name: shard 0 has the columns of
# shop.orders in another order than shard 1, and lacks one of shop.notes.
# Partition 3 (shard 1) moves to shard 0.
# (The online move applies the changes made during its copy by key: orders
# has a primary key, notes none, but REPLICA IDENTITY FULL, loose neither.)
$shards[1]->safe_psql('app', q{CREATE SCHEMA shop;
	CREATE TABLE shop.orders (scope text, id text, amount text, note text, PRIMARY KEY (scope, id));
	CREATE TABLE shop.notes (scope text, body text, author text);
	ALTER TABLE shop.notes REPLICA IDENTITY FULL;
	CREATE TABLE shop.loose (scope text, x int)});
$shards[0]->safe_psql('app', q{CREATE SCHEMA shop;
	CREATE TABLE shop.orders (note text, amount text, id text, scope text, extra text DEFAULT 'd',
	                          PRIMARY KEY (id, scope));
	CREATE TABLE shop.notes (scope text, body text);
	ALTER TABLE shop.notes REPLICA IDENTITY FULL;
	CREATE TABLE shop.loose (scope text, x int)});
my $s3 = scope_in(3, 'd');
$shards[1]->safe_psql('app', "INSERT INTO shop.orders VALUES ('$s3', 'o1', '10', 'n1'), ('$s3', 'o2', '20', 'n2')");
$proxy->safe_psql('app', "SELECT idem_claim('k1', '\\x01', '30s', '$s3')");
($rc, $out) = move(partition => 3, to => $dsn[0], args => [ '--table', 'shop.orders:scope', '--table', 'shop.notes:scope' ]);
isnt($rc, 0, 'a move whose target table lacks a column of the source\'s is refused');
like($out, qr/the target's table "shop"\."notes" lacks column author of the source's/, '... naming the column');
($rc, $out) = move(partition => 3, to => $dsn[0], args => [ '--table', 'shop.orders:scope', '--table', 'shop.loose:scope' ]);
isnt($rc, 0, 'a move of a table without a primary key or REPLICA IDENTITY FULL is refused');
like($out, qr/table "shop"\."loose" has neither a primary key nor REPLICA IDENTITY FULL.*HINT: .*REPLICA IDENTITY FULL on the source\. Nothing was changed\./s,
	'... naming it, with a hint');
is($shards[1]->safe_psql('app', q{SELECT count(*) FROM pg_trigger WHERE tgname = 'idem_move_p3_of_4'}), '0',
	'... before anything is frozen');

# The fence's functions run in every writer's session: a schema idem_move
# or a function in it that someone else owns is refused, not trusted.
$shards[1]->safe_psql('app', q{CREATE ROLE mallory; ALTER SCHEMA idem_move OWNER TO mallory});
($rc, $out) = move(partition => 3, to => $dsn[0], args => [ '--table', 'shop.orders:scope' ]);
isnt($rc, 0, 'a move is refused when the source\'s schema idem_move belongs to another role');
like($out, qr/schema idem_move is owned by mallory\. Nothing was changed/, '... saying whose it is');
$shards[1]->safe_psql('app', q{ALTER SCHEMA idem_move OWNER TO postgres; ALTER FUNCTION idem_move.refuse() OWNER TO mallory});
($rc, $out) = move(partition => 3, to => $dsn[0], args => [ '--table', 'shop.orders:scope' ]);
like($out, qr/function idem_move\.refuse\(\) is owned by mallory/, '... or a function in it does');
$shards[1]->safe_psql('app', q{ALTER FUNCTION idem_move.refuse() OWNER TO postgres; GRANT CREATE ON SCHEMA idem_move TO PUBLIC});
($rc, $out) = move(partition => 3, to => $dsn[0], args => [ '--table', 'shop.orders:scope' ]);
like($out, qr/PUBLIC may create objects in schema idem_move/, '... or anyone may create objects in it');
is($shards[1]->safe_psql('app', q{SELECT count(*) FROM pg_trigger WHERE tgname = 'idem_move_p3_of_4'}), '0',
	'... and nothing is frozen');
$shards[1]->safe_psql('app', q{REVOKE CREATE ON SCHEMA idem_move FROM PUBLIC});

($rc, $out) = move(partition => 3, to => $dsn[0], args => [ '--table', 'shop.orders:scope' ]);
like($out, qr/partition 3 of 4 moved: .*"shop"\."orders" 2/, 'partition 3 moved with its two orders');
is($shards[0]->safe_psql('app', q{SELECT string_agg(concat_ws(' ', scope, id, amount, note, extra), ', ' ORDER BY id) FROM shop.orders}),
	"$s3 o1 10 n1 d, $s3 o2 20 n2 d", '... each value in its column of the same name on shard 0');

# A move that failed between its copy and its switch resumes: the rerun
# finds partition 0 frozen on shard 0 by the run whose copy shard 1
# recorded with its rows, so the copy is skipped (shard 1's rows are the
# partition's now: its relays and purge may have changed them), both
# proxies are switched and the source cleaned up.  Meanwhile the frozen
# source refuses a DELETE of the partition's rows (a business row's, whose
# copy would come back, and a record's) and a claim that reuses a released
# key (a DELETE and an INSERT), all with 40001.
$shards[0]->safe_psql('app', "INSERT INTO shop.notes VALUES ('$s0', 'b0')");
my $released = $proxy->safe_psql('app', "SELECT token FROM idem_claim('released', '\\x01', '30s', '$s0')");
$proxy->safe_psql('app', "SELECT idem_release('released', $released, '$s0')");
my $p0_records = $shards[0]->safe_psql('app',
	q{SELECT count(*) FROM idempotency_records WHERE (idem_route_hash(scope) & 3) = 0});
{
	local $ENV{IDEM_MOVE_TEST_FAIL} = 'after-copy';
	($rc, $out) = move(partition => 0, to => $dsn[1], args => [ '--table', 'shop.notes:scope' ]);
}
isnt($rc, 0, 'a move of partition 0 stopped between its copy and its switch');
like($out, qr/stopped between the copy and the switch/, '... as the test asked');
is($shards[1]->safe_psql('app', q{SELECT count(*) FROM idempotency_records WHERE (idem_route_hash(scope) & 3) = 0}),
	$p0_records, "... after the copy of the partition's $p0_records records committed");
is(map_of($proxy, 0), $dsn[0], '... and before the switch');
($o, $e) = ('', '');
$shards[0]->psql('app', "\\set VERBOSITY verbose\nSELECT idem_claim('k9', '\\x01', '30s', '$s0')",
	stdout => \$o, stderr => \$e);
like($e, qr/ERROR:  40001: partition 0 of 4 has moved/, '... so the partition is frozen on shard 0');
($o, $e) = ('', '');
$shards[0]->psql('app', "\\set VERBOSITY verbose\nDELETE FROM idempotency_records WHERE scope = '$s0' AND key = 'other'",
	stdout => \$o, stderr => \$e);
like($e, qr/ERROR:  40001: partition 0 of 4 has moved/, '... so is a DELETE of a record of it');
($o, $e) = ('', '');
$shards[0]->psql('app', "\\set VERBOSITY verbose\nSELECT idem_claim('released', '\\x01', '30s', '$s0')",
	stdout => \$o, stderr => \$e);
like($e, qr/ERROR:  40001: partition 0 of 4 has moved/, '... and a claim that reuses a released key');
$shards[0]->psql('app', "\\set VERBOSITY verbose\nDELETE FROM shop.notes WHERE scope = '$s0'",
	stdout => \$o, stderr => \$e);
like($e, qr/ERROR:  40001: partition 0 of 4 has moved/, '... while a business DELETE of the partition is refused');
($rc, $out) = move(partition => 0, to => $dsn[1], args => [ '--table', 'shop.notes:scope' ]);
is($rc, 0, 'the rerun of the move succeeds');
like($out, qr/resuming: partition 0 is frozen on the source and a proxy points at the target already \(or a run began to switch\): the copy is skipped.*partition 0 of 4 moved: .*idempotency_records" $p0_records\b/s,
	'... skipping the copy, which the first run committed');
is(map_of($_, 0), $dsn[1], '... ' . $_->name . ' points partition 0 at shard 1') for @proxies;
is($shards[0]->safe_psql('app', q{SELECT count(*) FROM idempotency_records WHERE (idem_route_hash(scope) & 3) = 0}),
	'0', '... and shard 0 holds none of its records any more');
is($proxy->safe_psql('app', "SELECT status FROM idem_lookup('other', '$s0')"), 'processing',
	'... which a lookup through the proxy finds on shard 1');

# Rows of the partition on the target that no record ties to the source's
# freeze (an older run's, say) while no proxy points there: nobody can have
# written them through a proxy, so the rerun copies again in their place.
# Partition 1 stops after its copy; then the target's record of it names
# another run, and a copied record changes on shard 1.
{
	local $ENV{IDEM_MOVE_TEST_FAIL} = 'after-copy';
	($rc, $out) = move(partition => 1, to => $dsn[1]);
}
like($out, qr/stopped between the copy and the switch/, 'a move of partition 1 stopped after its copy');
$shards[1]->safe_psql('app', "UPDATE idem_move.switched SET run = 'another run' WHERE partition = 1");
$shards[1]->safe_psql('app', "UPDATE idempotency_records SET result = '{\"k\": 99}' WHERE scope = '$s1' AND key = 'k2'");
($rc, $out) = move(partition => 1, to => $dsn[1]);
is($rc, 0, '... and after a copied row changed on the target, the rerun succeeds');
like($out, qr/frozen on the source: unfrozen now, writes go on\): it starts over; no proxy points at the target: its rows there \(.*\) are an interrupted copy, made again/,
	'... unfreezing the source and copying again');
is($shards[1]->safe_psql('app', "SELECT result FROM idempotency_records WHERE scope = '$s1' AND key = 'k2'"),
	'{"k": 2}', '... with the source\'s row in place of the changed copy');
is(map_of($_, 1), $dsn[1], '... and ' . $_->name . ' switched') for @proxies;

# Rows of a partition on a target while the source is not frozen for it
# are nobody's copy: partition 1 is on shard 1 now, and a record of it is
# planted on shard 0 before a move back there.
$shards[0]->safe_psql('app', "SET session_replication_role = replica;
	INSERT INTO idempotency_records (scope, key, fingerprint, token, lease_expires_at, created_at, updated_at,
	                                 expires_at, purge_after, status, attempts)
	VALUES ('$s1', 'planted', '\\x01', 1, now(), now(), now(), now() + interval '1 day',
	        now() + interval '1 day', 'processing', 1)");
($rc, $out) = move(partition => 1, to => $dsn[0]);
isnt($rc, 0, 'rows of a partition on a target whose source is not frozen for it are refused');
like($out, qr/the target holds rows of partition 1 already .*the partition is not frozen on the source/,
	'... saying so');
is(map_of($proxy, 1), $dsn[1], '... and nothing is switched');
$shards[0]->safe_psql('app', "SET session_replication_role = replica; DELETE FROM idempotency_records WHERE key = 'planted'");

# Bad options are refused before anything is done.
($rc, $out) = move(partition => 1, to => $dsn[0], args => ['--lock-retries', '-1']);
is($rc, 2, 'a negative --lock-retries is refused');
like($out, qr/--lock-retries must not be negative/, '... saying so');
($rc, $out) = move(partition => 1, to => $dsn[0], args => ['--lock-timeout', '0']);
isnt($rc, 0, 'a --lock-timeout of 0 is refused');
like($out, qr/--lock-timeout must be more than 0/, '... saying so');
is(map_of($proxy, 1), $dsn[1], '... and nothing is switched');

# A move that stopped after one proxy's switch resumes too, although the
# target has taken writes through that proxy since.
{
	local $ENV{IDEM_MOVE_TEST_FAIL} = 'after-first-switch';
	($rc, $out) = move(partition => 3, to => $dsn[1]);
}
like($out, qr/stopped after the switch of one proxy/, 'a move of partition 3 stopped after one proxy\'s switch');
is(map_of($proxies[0], 3) . ' ' . map_of($proxies[1], 3), "$dsn[1] $dsn[0]", '... proxy1 switched, proxy2 not');
is($proxies[0]->safe_psql('app', "SELECT outcome FROM idem_claim('late', '\\x01', '30s', '$s3')"), 'new',
	'... and a claim through proxy1 is served by the target');
# The rerun names proxy2 only: the target's record of the begun switch
# still keeps it from taking the target's rows for an interrupted copy.
($rc, $out) = move(partition => 3, to => $dsn[1],
	proxies => [ '--proxy', 'host=' . $proxies[1]->host . ' port=' . $proxies[1]->port . ' dbname=app' ]);
is($rc, 0, 'the rerun succeeds, naming only the proxy not yet switched');
like($out, qr/resuming: partition 3 is frozen on the source and a proxy points at the target already \(or a run began to switch\)/,
	'... resuming: the target is the partition\'s shard already');
is(map_of($proxies[1], 3), $dsn[1], '... and proxy2 is switched');
is($proxies[1]->safe_psql('app', "SELECT status FROM idem_lookup('late', '$s3')"), 'processing',
	'... so a lookup through proxy2 finds the claim made through proxy1');

$_->stop for @proxies, @shards;
done_testing();
