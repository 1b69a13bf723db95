# Scale-out (issue 16): one proxy database with idempotency_router and four
# shards with the extension, 16 partitions (PL/Proxy, SQL/MED).  Every call
# through the proxy lands on the shard of its scope's tenant (checked on the
# shards themselves), a tenant never spans shards, replays, fingerprint
# conflicts and stale tokens behave as on one server, a generated proxy
# function runs a shard-side business function (claim, business row and
# completion in one transaction on one shard), the aggregates add up, and a
# call that fails on the proxy side (a timeout, a killed proxy backend, a
# killed shard backend) is an ambiguous outcome that a retry of the same
# key resolves.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $nshards = 4;
my $npartitions = 16;

# The business of the tests, on every shard: an order is one row, written
# by the function that claims and completes its key in one transaction.
my $shard_setup = q{
	CREATE EXTENSION idempotency;
	CREATE SCHEMA shop;
	CREATE TABLE shop.orders (
		scope text NOT NULL,
		key text NOT NULL,
		amount integer NOT NULL,
		token bigint NOT NULL
	);
	CREATE FUNCTION shop.place_order(tenant text, key text, body jsonb,
	                                 lease interval DEFAULT '30s',
	                                 OUT outcome text, OUT result jsonb)
	LANGUAGE plpgsql
	SET search_path = pg_catalog, pg_temp
	AS $$
	DECLARE
		c public.idem_claim_result;
	BEGIN
		SELECT * INTO c FROM public.idem_claim(key, public.idem_fingerprint(body), lease, tenant);
		outcome := c.outcome;
		IF c.outcome IN ('new', 'takeover') THEN
			INSERT INTO shop.orders VALUES (tenant, key, (body ->> 'amount')::integer, c.token);
			result := jsonb_build_object('order', key, 'amount', (body ->> 'amount')::integer,
			                             'port', current_setting('port'));
			PERFORM public.idem_complete(key, c.token, result, 201, tenant);
		ELSE
			result := c.result;
		END IF;
	END
	$$;
};

my @shards;
for my $i (0 .. $nshards - 1)
{
	my $node = PostgreSQL::Test::Cluster->new("shard$i");
	$node->init;
	$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idempotency'\n");
	$node->start;
	$node->safe_psql('postgres', $shard_setup);
	push @shards, $node;
}
my %shard_of_port = map { $shards[$_]->port => $_ } 0 .. $#shards;

my $proxy = PostgreSQL::Test::Cluster->new('proxy');
$proxy->init;
$proxy->start;
my $shard_list = join(', ', map { "'host=" . $_->host . ' port=' . $_->port . " dbname=postgres'" } @shards);
$proxy->safe_psql('postgres', qq{
	SET client_min_messages = warning;
	CREATE EXTENSION idempotency_router CASCADE;
	SELECT idem_router_configure(ARRAY[$shard_list], $npartitions);
	CREATE USER MAPPING FOR PUBLIC SERVER idempotency;
	CREATE SCHEMA shop;
});
is($proxy->safe_psql('postgres',
		q{SELECT count(*) || ' partitions, ' || count(DISTINCT connstr) || ' shards' FROM idem_router_partitions()}),
	"$npartitions partitions, $nshards shards", 'the cluster: 16 partitions on 4 shards (SQL/MED)');

# psql on the proxy; returns (stdout, stderr) with the SQLSTATE in errors.
sub proxy_psql
{
	my ($sql) = @_;
	my ($out, $err) = ('', '');
	$proxy->psql('postgres', "\\set VERBOSITY verbose\n$sql", stdout => \$out, stderr => \$err);
	return ($out, $err);
}

# The shard a scope must be on: its partition's, as PL/Proxy maps it.
sub shard_of
{
	my ($scope) = @_;
	my $p = $proxy->safe_psql('postgres', "SELECT idem_router_partition('$scope')");
	return $p % $nshards;
}

# Where a key's record is: the shards that hold it.
sub holders
{
	my ($scope, $key) = @_;
	return join(',', grep {
		$shards[$_]->safe_psql('postgres',
			"SELECT count(*) FROM idempotency_records WHERE scope = '$scope' AND key = '$key'") > 0
	} 0 .. $#shards);
}

# 1. Claims of 64 tenants (and sub-scopes), completed, each on its shard only.
my $tenants = 64;
$proxy->safe_psql('postgres', qq{
	SELECT idem_complete('k', c.token, jsonb_build_object('t', t), 200, s)
	  FROM generate_series(1, $tenants) t,
	       LATERAL (SELECT 'tenant-' || t || CASE WHEN t % 2 = 0 THEN '/orders' ELSE '' END AS s) sc,
	       LATERAL idem_claim('k', '\\x01', '30s', s) c;
	SELECT idem_complete('k2', c.token, NULL, 204, 'tenant-' || t || '/refunds/eu')
	  FROM generate_series(1, $tenants) t,
	       LATERAL idem_claim('k2', '\\x02', '30s', 'tenant-' || t || '/refunds/eu') c;
});
my ($misplaced, $spanning) = (0, 0);
my %used;
for my $t (1 .. $tenants)
{
	my $scope = "tenant-$t" . ($t % 2 == 0 ? '/orders' : '');
	my $want = shard_of("tenant-$t");
	$used{$want}++;
	$misplaced++ if holders($scope, 'k') ne "$want";
	$spanning++ if holders("tenant-$t/refunds/eu", 'k2') ne "$want";
}
is($misplaced, 0, "$tenants claims through the proxy: each record on its partition's shard only");
is($spanning, 0, 'a tenant never spans shards: its sub-scopes land with it');
is(scalar(keys %used), $nshards, 'the tenants use every shard');
my @counts = map { $_->safe_psql('postgres', 'SELECT count(*) FROM idempotency_records') } @shards;
is(eval { my $s = 0; $s += $_ for @counts; $s }, 2 * $tenants,
	'the shards hold exactly the records claimed (' . join(' + ', @counts) . ')');

# 2. Replay, conflict, in_progress, stale token, through the proxy.
my ($out, $err) = proxy_psql(q{SELECT outcome, result, response_code FROM idem_claim('k', '\x01', '30s', 'tenant-3')});
is($out, 'replay|{"t": 3}|200', 'a replay through the proxy gives the stored result');
($out, $err) = proxy_psql(q{SELECT outcome FROM idem_claim('k', '\x09', '30s', 'tenant-3')});
like($err, qr/ERROR:  IK001: .*already used for a different request/,
	'a different request under the key raises IK001 through the proxy');
$proxy->safe_psql('postgres', q{
	SELECT idem_complete('h', c.token, '{"id": 1}', 201, 'tenant-4', headers => '{"Location": "/orders/1"}')
	  FROM idem_claim('h', '\x01', '30s', 'tenant-4') c});
is($proxy->safe_psql('postgres', q{
		SELECT c.outcome || ' ' || c.response_headers::text || ' ' || l.response_headers::text
		  FROM idem_claim('h', '\x01', '30s', 'tenant-4') c, idem_lookup('h', 'tenant-4') l}),
	'replay {"Location": "/orders/1"} {"Location": "/orders/1"}',
	'the answer\'s headers saved through the proxy come back with the replay and idem_lookup');
$proxy->safe_psql('postgres', q{SELECT token FROM idem_claim('busy', '\x01', '1h', 'tenant-5')});
($out, $err) = proxy_psql(q{SELECT outcome FROM idem_claim('busy', '\x01', '1h', 'tenant-5')});
is($out, 'in_progress', 'a second claim of a key in progress: in_progress');
my $old = $proxy->safe_psql('postgres', q{SELECT token FROM idem_claim('lease', '\x01', '50ms', 'tenant-6')});
sleep(1);
my $new = $proxy->safe_psql('postgres',
	q{SELECT outcome || ' ' || token FROM idem_claim('lease', '\x01', '30s', 'tenant-6')});
like($new, qr/^takeover \d+$/, 'after the lease, a claim through the proxy takes over');
($out, $err) = proxy_psql(qq{SELECT idem_complete('lease', $old, '{}', 200, 'tenant-6')});
like($err, qr/ERROR:  IK002: /, 'the stale owner\'s completion through the proxy raises IK002');
$new =~ s/^takeover //;
($out, $err) = proxy_psql(qq{SELECT idem_complete('lease', $new, '{"by": "new"}', 200, 'tenant-6')});
is($err, '', 'the new owner completes');
is($shards[ shard_of('tenant-6') ]->safe_psql('postgres',
		q{SELECT status || ' ' || result::text FROM idempotency_records WHERE scope = 'tenant-6' AND key = 'lease'}),
	'succeeded {"by": "new"}', '... on the shard, the new owner\'s result');
is($proxy->safe_psql('postgres', q{SELECT key || ' ' || status FROM idem_lookup('lease', 'tenant-6')}),
	'lease succeeded', 'idem_lookup through the proxy');
is($proxy->safe_psql('postgres', q{
		SELECT idem_inbox_accept('tenant-7/billing', 'm1')::text || ' '
		       || idem_inbox_accept('tenant-7/billing', 'm1')::text}),
	'true false', 'the inbox through the proxy: a redelivery is recognised');
is($shards[ shard_of('tenant-7') ]->safe_psql('postgres',
		q{SELECT count(*) FROM idem_inbox WHERE consumer = 'tenant-7/billing'}),
	'1', '... on the shard of the consumer\'s tenant');
is($proxy->safe_psql('postgres', q{
		SELECT string_agg(id, ',') FROM idem_inbox_accept_many('tenant-7/billing', '{m2,m1,m3,m2}') id}),
	'm2,m3', 'a batch through the proxy: the new ids, once each, in order');
is($proxy->safe_psql('postgres', q{
		SELECT string_agg(seq || ' ' || outcome, ',') FROM idem_inbox_accept_seq_many('tenant-7/billing', 's', '{4,5,5,7}')}),
	'4 new,5 new,5 duplicate,7 gap', 'a batch of sequence numbers through the proxy');
is($shards[ shard_of('tenant-7') ]->safe_psql('postgres',
		q{SELECT count(*) || ' ' || (SELECT watermark FROM idem_inbox_streams WHERE consumer = 'tenant-7/billing')
		  FROM idem_inbox WHERE consumer = 'tenant-7/billing'}),
	'3 5', '... both on the shard of the consumer\'s tenant');
($out, $err) = proxy_psql(q{SELECT idem_claim('k', '\x01', '30s', NULL)});
like($err, qr/ERROR:  22004: scope must not be null/, 'a NULL scope: 22004 on the proxy');

# 3. The business function through its generated proxy function.
is($proxy->safe_psql('postgres',
		q{SELECT idem_proxy_function('shop.place_order(text, text, jsonb, interval)', 'tenant')}),
	'shop.place_order(text,text,jsonb,interval)', 'idem_proxy_function creates the proxy function');
($out, $err) = proxy_psql(q{SELECT outcome FROM shop.place_order('tenant-9/eu', 'order-1', '{"amount": 7}')});
is($out, 'new', 'an order through the proxy: new');
($out, $err) = proxy_psql(q{SELECT outcome, result->>'amount' FROM shop.place_order('tenant-9/eu', 'order-1', '{"amount": 7}')});
is($out, 'replay|7', 'the same order again: replay of the stored result');
($out, $err) = proxy_psql(q{SELECT outcome FROM shop.place_order('tenant-9/eu', 'order-1', '{"amount": 8}')});
like($err, qr/ERROR:  IK001: /, 'another order under the key: IK001');
my $s9 = shard_of('tenant-9');
is(join(',', map { $shards[$_]->safe_psql('postgres', q{SELECT count(*) FROM shop.orders WHERE key = 'order-1'}) } 0 .. $#shards),
	join(',', map { $_ == $s9 ? 1 : 0 } 0 .. $#shards),
	'one business row, on the tenant\'s shard, committed with its record');
is($shards[$s9]->safe_psql('postgres',
		q{SELECT r.token = o.token AND r.status = 'succeeded' FROM idempotency_records r JOIN shop.orders o USING (scope, key)
		   WHERE key = 'order-1'}),
	't', '... written with the token of the record that succeeded');

# 4. The aggregates over all shards.
my $sum_records = 0;
$sum_records += $_->safe_psql('postgres', 'SELECT count(*) FROM idempotency_records') for @shards;
is($proxy->safe_psql('postgres', 'SELECT sum(records) FROM idem_summary'), $sum_records,
	"idem_summary adds up the shards' records ($sum_records)");
is($proxy->safe_psql('postgres', q{SELECT records || ' ' || status FROM idem_summary WHERE scope = 'tenant-6'}),
	'1 succeeded', '... one row per scope and status');
my $sum_new = 0;
$sum_new += $_->safe_psql('postgres', q{SELECT value FROM idem_stats() WHERE counter = 'claims_new'}) for @shards;
is($proxy->safe_psql('postgres', q{SELECT value FROM idem_stats() WHERE counter = 'claims_new'}), $sum_new,
	"idem_stats adds up the shards' counters (claims_new $sum_new)");
is($proxy->safe_psql('postgres', q{SELECT count(DISTINCT shard) FROM idem_shard_stats()}), $nshards,
	'idem_shard_stats: one set of counters per shard');
$proxy->safe_psql('postgres', q{SELECT token FROM idem_claim('stuck', '\x01', '10ms', 'tenant-11')});
sleep(1);
is($proxy->safe_psql('postgres', q{SELECT reason || ' ' || shard FROM idem_stuck WHERE key = 'stuck'}),
	'lease expired local:' . $shards[ shard_of('tenant-11') ]->port . '/postgres',
	'idem_stuck lists a lease that ran out, with its shard');

# 5. Proxy-side failures are ambiguous; a retry of the same key resolves them.
# A statement_timeout on the proxy cancels the shard's statement too: the
# retry claims anew and commits once.
my $s13 = shard_of('tenant-13');
my $blocker = $shards[$s13]->background_psql('postgres', on_error_stop => 1);
$blocker->query_safe('BEGIN');
$blocker->query_safe('LOCK TABLE shop.orders');
($out, $err) = proxy_psql(q{SET statement_timeout = '300ms';
	SELECT outcome FROM shop.place_order('tenant-13', 'order-t', '{"amount": 1}')});
like($err, qr/ERROR:  57014: /, 'a proxy-side timeout: the client does not know the outcome');
$blocker->query_safe('COMMIT');
($out, $err) = proxy_psql(q{SELECT outcome FROM shop.place_order('tenant-13', 'order-t', '{"amount": 1}')});
like($out, qr/^(new|takeover|replay)$/, "the retry of the same key learns the truth ($out)");
is($shards[$s13]->safe_psql('postgres', q{SELECT count(*) FROM shop.orders WHERE key = 'order-t'}),
	'1', '... and the order exists once');

# A proxy backend killed while its call waits on the shard: the shard's
# statement goes on and may commit after the client lost its connection.
$blocker->query_safe('BEGIN');
$blocker->query_safe('LOCK TABLE shop.orders');
my $victim = $proxy->background_psql('postgres', on_error_stop => 0);
my $victim_pid = $victim->query_safe('SELECT pg_backend_pid()');
$victim->query_until(qr/sent/, q{\echo sent
	SELECT outcome FROM shop.place_order('tenant-13', 'order-k', '{"amount": 2}');
});
$shards[$s13]->poll_query_until('postgres',
	q{SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%place_order%'})
  or die 'the call did not reach the shard';
$proxy->safe_psql('postgres', "SELECT pg_terminate_backend($victim_pid)");
eval { $victim->quit };
$blocker->query_safe('COMMIT');
$blocker->quit;
$shards[$s13]->poll_query_until('postgres',
	q{SELECT count(*) = 0 FROM pg_stat_activity WHERE query LIKE '%place_order%' AND pid <> pg_backend_pid()})
  or die 'the shard statement did not end';
($out, $err) = proxy_psql(q{SELECT outcome FROM shop.place_order('tenant-13', 'order-k', '{"amount": 2}')});
like($out, qr/^(new|takeover|replay)$/, "a killed proxy backend: the retry of the same key learns the truth ($out)");
is($shards[$s13]->safe_psql('postgres', q{SELECT count(*) FROM shop.orders WHERE key = 'order-k'}),
	'1', '... and the order exists once');

# A shard backend killed under the proxy: the call fails, the next one
# reconnects.
my $session = $proxy->background_psql('postgres', on_error_stop => 0);
$session->query_safe(q{SELECT outcome FROM shop.place_order('tenant-13', 'order-a', '{"amount": 3}')});
$shards[$s13]->safe_psql('postgres', q{
	SELECT pg_terminate_backend(pid) FROM pg_stat_activity
	 WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND datname = 'postgres'});
my $r = $session->query(q{SELECT outcome FROM shop.place_order('tenant-13', 'order-a', '{"amount": 3}')});
$r = $session->query(q{SELECT outcome FROM shop.place_order('tenant-13', 'order-a', '{"amount": 3}')})
  if $r !~ /^(replay)$/;
is($r, 'replay', 'after a shard backend was killed, the proxy reconnects and the retry replays');
$session->quit;

$proxy->stop;
$_->stop for @shards;
done_testing();
