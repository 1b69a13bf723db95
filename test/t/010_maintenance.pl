# Routine maintenance while clients run, in the configuration users run (the
# library preloaded, the purge worker on for the database): REINDEX
# (CONCURRENTLY, by table and by index), VACUUM FULL, CLUSTER, ANALYZE and
# pg_repack (table and indexes only) on every table of the extension and on
# a governed table, and redefinitions of the machine, while four sessions
# keep calling every function.  The sessions must see no error at all, and
# afterwards there is one record per key, no token handed out twice for a
# key, and every index agrees with its table (amcheck).
#
# A client is a procedure that loops until told to stop (or a bound),
# committing each round; a round calls everything once on keys of its own,
# checks the outcomes, and records any error with its SQLSTATE instead of
# failing, so that the test can count and show them.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemEdition;
use IPC::Run;

my $clients = 4;

my $node = PostgreSQL::Test::Cluster->new('maintenance');
$node->init;
$node->append_conf('postgresql.conf', c_edition_conf(qq{
shared_preload_libraries = 'idempotency'
idempotency.databases = 'postgres'
idempotency.purge_interval = 1
}));
$node->start;

$node->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	CREATE EXTENSION pg_repack;
	CREATE EXTENSION amcheck;
	CREATE TABLE pay (id text PRIMARY KEY, status text NOT NULL);
	SELECT idem_define_machine('tap_pay',
		'{"PENDING": ["PAID"], "PAID": ["REFUNDED"]}', ARRAY['PENDING']);
	SELECT idem_attach_machine('pay', 'status', 'tap_pay');
	CREATE SEQUENCE tap_seq;
	CREATE TABLE tap_errors (client int, round int, step text, sqlstate text, message text,
		detail text, at timestamptz DEFAULT clock_timestamp());
	CREATE TABLE tap_tokens (key text, token bigint);
	CREATE TABLE tap_progress (client int PRIMARY KEY, rounds int);
	CREATE TABLE tap_stop ();
});

$node->safe_psql('postgres', q{
CREATE PROCEDURE tap_client(me int, max_rounds int) LANGUAGE plpgsql AS $$
DECLARE
	n bigint;
	k text;
	t bigint;
	res text;
	step text;
	detail text;
BEGIN
	INSERT INTO tap_progress VALUES (me, 0);
	COMMIT;
	FOR r IN 1..max_rounds LOOP
		EXIT WHEN EXISTS (SELECT FROM tap_stop);
		n := nextval('tap_seq');
		k := 'c' || me || '-' || n;
		BEGIN
			step := 'claim new';
			SELECT token INTO STRICT t FROM idem_claim(k, '\x01', '1 hour', retention => '1 s');
			INSERT INTO tap_tokens VALUES (k, t);
			step := 'complete';
			PERFORM idem_complete(k, t, '"done"', 200);
			step := 'claim replay';
			SELECT outcome INTO STRICT res FROM idem_claim(k, '\x01');
			IF res <> 'replay' THEN RAISE EXCEPTION 'outcome %', res; END IF;
			step := 'lookup';
			SELECT status INTO STRICT res FROM idem_lookup(k);
			IF res <> 'succeeded' THEN RAISE EXCEPTION 'status %', res; END IF;
			step := 'await';
			SELECT status INTO STRICT res FROM idem_await(k, '', '0 s');
			IF res <> 'succeeded' THEN RAISE EXCEPTION 'status %', res; END IF;

			step := 'claim new, wait => false';
			SELECT token INTO STRICT t FROM idem_claim(k || 'b', '\x01', '1 hour', wait => false);
			INSERT INTO tap_tokens VALUES (k || 'b', t);
			step := 'fail';
			PERFORM idem_fail(k || 'b', t, '{"e": 1}', retryable => true);
			step := 'claim takeover';
			SELECT outcome || ' ' || token INTO STRICT res
				FROM idem_claim(k || 'b', '\x01', '1 hour', wait => false);
			IF res NOT LIKE 'takeover %' THEN RAISE EXCEPTION 'outcome %', res; END IF;
			t := split_part(res, ' ', 2)::bigint;
			INSERT INTO tap_tokens VALUES (k || 'b', t);
			step := 'checkpoint';
			PERFORM idem_checkpoint(k || 'b', t, 'step 1');
			step := 'release';
			PERFORM idem_release(k || 'b', t);

			step := 'claim for unknown';
			SELECT token INTO STRICT t FROM idem_claim(k || 'c', '\x01', retention => '1 s');
			INSERT INTO tap_tokens VALUES (k || 'c', t);
			step := 'mark unknown';
			PERFORM idem_mark_unknown(k || 'c', t, '{"timeout": true}');
			step := 'resolve';
			PERFORM idem_resolve(k || 'c', 'succeeded', '"reconciled"');

			step := 'inbox accept, wait => false';
			IF NOT idem_inbox_accept('tap', k, '1 s', wait => false) THEN
				RAISE EXCEPTION 'not accepted';
			END IF;
			step := 'inbox duplicate';
			IF idem_inbox_accept('tap', k) THEN RAISE EXCEPTION 'accepted twice'; END IF;
			step := 'inbox seq';
			PERFORM idem_inbox_accept_seq('tap', 'stream' || me, n, true);

			step := 'insert governed';
			INSERT INTO pay VALUES (k, 'PENDING');
			step := 'transition';
			res := idem_transition('pay', k, 'PAID');
			IF res <> 'applied' THEN RAISE EXCEPTION 'transition %', res; END IF;
			step := 'update governed';
			UPDATE pay SET status = 'REFUNDED' WHERE id = k;

			IF r % 10 = 0 THEN
				step := 'purge';
				PERFORM idem_purge(100);
			END IF;
		EXCEPTION WHEN OTHERS THEN
			GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;
			INSERT INTO tap_errors VALUES (me, r, step, SQLSTATE, SQLERRM, detail);
		END;
		UPDATE tap_progress SET rounds = r WHERE client = me;
		COMMIT;
	END LOOP;
END
$$;
});

# The clients, each a session of its own for the whole test.
my @harness;
my (@out, @err);
for my $i (1 .. $clients)
{
	push @harness,
	  IPC::Run::start(
		[
			'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d',
			$node->connstr('postgres'), '-c', "CALL tap_client($i, 1000000)"
		],
		'>', \$out[$i], '2>', \$err[$i]);
}
ok( $node->poll_query_until(
		'postgres', "SELECT count(*) = $clients AND min(rounds) > 0 FROM tap_progress"),
	'every client is running');

my $rounds_before = $node->safe_psql('postgres', 'SELECT sum(rounds) FROM tap_progress');

my @tables = qw(idempotency_records idem_inbox idem_inbox_streams idem_machines
  idem_machine_moves idem_settings pay);
my $redefine = q{SELECT idem_define_machine('tap_pay',
	'{"PENDING": ["PAID"], "PAID": ["REFUNDED"]}', ARRAY['PENDING'])};
for my $table (@tables)
{
	my @indexes = split /\n/, $node->safe_psql('postgres',
		"SELECT indexrelid::regclass FROM pg_index WHERE indrelid = '$table'::regclass ORDER BY 1");
	my @commands = (
		"REINDEX TABLE CONCURRENTLY $table",
		(map { "REINDEX INDEX CONCURRENTLY $_" } @indexes),
		$redefine,
		"REINDEX TABLE $table",
		"VACUUM FULL $table",
		"CLUSTER $table USING ${table}_pkey",
		"ANALYZE $table",
		$redefine);
	for my $command (@commands)
	{
		my ($ret, $stdout, $stderr) = $node->psql('postgres', $command);
		is($ret, 0, "$command") or diag($stderr);
	}
	for my $mode ([], ['--only-indexes'])
	{
		my ($stdout, $stderr);
		my $ok = IPC::Run::run(
			[
				'pg_repack', '--no-kill-backend', '--wait-timeout=60',
				'--host' => $node->host, '--port' => $node->port,
				'--dbname' => 'postgres', @$mode,
				'--table' => "public.$table"
			],
			'>', \$stdout, '2>', \$stderr);
		ok($ok, "pg_repack @$mode --table $table") or diag($stderr);
	}
}

my $rounds_during = $node->safe_psql('postgres', 'SELECT sum(rounds) FROM tap_progress');
cmp_ok($rounds_during, '>', $rounds_before, 'the clients made progress during the maintenance');

# one more round each after the last command, then stop
my $target = $node->safe_psql('postgres', 'SELECT max(rounds) + 1 FROM tap_progress');
$node->poll_query_until('postgres', "SELECT min(rounds) >= $target FROM tap_progress");
$node->safe_psql('postgres', 'INSERT INTO tap_stop DEFAULT VALUES');
for my $i (1 .. $clients)
{
	ok($harness[ $i - 1 ]->finish, "client $i ended without an error") or diag($err[$i]);
}

is($node->safe_psql('postgres', 'SELECT count(*) FROM tap_errors'),
	'0', 'the clients met no error');
diag($node->safe_psql('postgres',
		q{SELECT string_agg(format('%s client %s round %s %s: %s %s (%s)', at, client, round,
		                           step, sqlstate, message, detail), E'\n') FROM tap_errors}))
  if $node->safe_psql('postgres', 'SELECT count(*) FROM tap_errors') ne '0';

# Invariants, read without the indexes (a broken index could hide a duplicate).
my $seqscan = 'SET enable_indexscan = off; SET enable_bitmapscan = off; SET enable_indexonlyscan = off;';
is( $node->safe_psql('postgres', qq{$seqscan
		SELECT count(*) FROM (SELECT scope, key FROM idempotency_records
		                      GROUP BY 1, 2 HAVING count(*) > 1) d}),
	'0', 'one record per key');
is( $node->safe_psql('postgres', qq{$seqscan
		SELECT count(*) FROM (SELECT key, token FROM tap_tokens
		                      GROUP BY 1, 2 HAVING count(*) > 1) d}),
	'0', 'no token was handed out twice for a key');
is( $node->safe_psql('postgres', qq{$seqscan
		SELECT count(*) FROM (SELECT consumer, message_id FROM idem_inbox
		                      GROUP BY 1, 2 HAVING count(*) > 1) d}),
	'0', 'one inbox row per message');
is($node->safe_psql('postgres', q{SELECT count(*) FROM pay WHERE status <> 'REFUNDED'}),
	'0', 'every governed row made its moves');
my @btrees = split /\n/, $node->safe_psql('postgres', q{
	SELECT i.indexrelid::regclass FROM pg_index i
	JOIN pg_class c ON c.oid = i.indexrelid
	JOIN pg_am am ON am.oid = c.relam AND am.amname = 'btree'
	WHERE i.indrelid = ANY (ARRAY['idempotency_records', 'idem_inbox', 'idem_inbox_streams',
	                              'idem_machines', 'idem_machine_moves', 'idem_settings',
	                              'pay']::regclass[])
	ORDER BY 1});
for my $index (@btrees)
{
	my ($ret, $stdout, $stderr) =
	  $node->psql('postgres', "SELECT bt_index_check('$index', heapallindexed => true)");
	is($ret, 0, "index $index agrees with its table") or diag($stderr);
}
unlike(slurp_file($node->logfile), qr/could not open relation with OID/,
	'the server log has no stale OID');

$node->stop;
done_testing();
