# idem-test: c-edition-only: pg_upgrade from 15 to 18 with the C library built for 18 (IDEM_UPGRADE_TO_PATH), the purge worker purging on both sides and idem_version's library; the SQL edition has no library to upgrade (its objects are plain SQL, as in 003 and 021's dump and restore)
# A major-version upgrade with the extension in use: pg_upgrade from
# PostgreSQL 15 to 18 keeps every row, token, grant and attachment, and the
# extension works on 18.
#
#   1. A 15 cluster as users run it (the library preloaded, the purge worker
#      on in database "app"): records in every status (done, failed
#      retryable and not, unknown, in progress with a checkpoint, a
#      takeover, scoped records, a purge by the worker that moved the token
#      epoch), inbox messages and watermarks, machines attached to tables
#      (one with the transition log), tenant isolation on, grants by
#      idem_grant.
#   2. The extension built and installed for 18 (test/run does that, and
#      passes the installation's prefix in IDEM_UPGRADE_TO_PATH), a new 18
#      cluster with the same preload settings, pg_upgrade --check, then
#      pg_upgrade.
#   3. On 18: the same rows in every table, the same privileges, triggers,
#      policies and epoch; idem_version() says 18; replays return the stored
#      results, a stale token is refused, a new claim's token is above every
#      token issued on 15, machines enforce and log, tenants are isolated,
#      and the purge worker purges.
#
# The test is the 15 -> 18 upgrade: on a suite built for another major
# version it is skipped; on 15 without IDEM_UPGRADE_TO_PATH it fails.
use strict;
use warnings;
use Cwd;
use File::Spec;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemEdition;

my $old = PostgreSQL::Test::Cluster->new('old15');
my $old_major = $old->pg_version->major;
plan skip_all => "the test is the upgrade from PostgreSQL 15 to 18; this suite runs on $old_major"
  if $old_major != 15;

my $new_path = $ENV{IDEM_UPGRADE_TO_PATH};
if (!defined $new_path || !-x "$new_path/bin/pg_upgrade")
{
	fail('IDEM_UPGRADE_TO_PATH names a PostgreSQL 18 installation with the extension'
		  . ' (test/run builds one with idem_source_build 18)');
	diag('IDEM_UPGRADE_TO_PATH is ' . ($new_path // 'not set'));
	done_testing();
	exit;
}

my $preload = q{
shared_preload_libraries = 'idempotency'
idempotency.databases = 'app'
idempotency.purge_interval = 1
};

# 1. PostgreSQL 15 ------------------------------------------------------------------------------
$old->init;
$old->append_conf('postgresql.conf', $preload);
$old->start;
$old->safe_psql('postgres', 'CREATE DATABASE app');
$old->safe_psql('app', 'CREATE EXTENSION idempotency');
$old->safe_psql('app', <<'SQL');
SELECT idem_claim('done', idem_fingerprint('a'), '1 hour');
SELECT idem_complete('done', 1, '{"order_id": 7}', 201);
SELECT idem_claim('refused', idem_fingerprint('b'), '1 hour');
SELECT idem_fail('refused', 1, '{"reason": "declined"}', retryable => false, response_code => 402);
SELECT idem_claim('retry', idem_fingerprint('c'), '1 hour');
SELECT idem_fail('retry', 1, '{"reason": "timeout"}', retryable => true);
SELECT idem_claim('timeout', idem_fingerprint('d'), '1 hour');
SELECT idem_mark_unknown('timeout', 1, '{"provider": "no answer"}');
SELECT idem_claim('running', idem_fingerprint('e'), '1 hour');
SELECT idem_checkpoint('running', 1, 'step-2');
SELECT idem_claim('done', idem_fingerprint('f'), '1 hour', scope => 'tenant-a');
SELECT idem_complete('done', 1, '{"scoped": true}', 200, scope => 'tenant-a');
SELECT idem_claim('taken', idem_fingerprint('t'), '1 millisecond');
SELECT pg_sleep(0.01);
SELECT idem_claim('taken', idem_fingerprint('t'), '1 hour');
SELECT idem_checkpoint('taken', 2, 'second try');
SELECT idem_claim('stalled', idem_fingerprint('s'), '1 millisecond', scope => 'tenant-a');
SELECT idem_release('released',
    (SELECT token FROM idem_claim('released', idem_fingerprint('r'), '1 hour')));
SELECT idem_inbox_accept('billing', 'msg-1');
SELECT idem_inbox_accept('billing', 'msg-old', retention => '1 millisecond');
SELECT idem_inbox_accept('tenant-a/billing', 'msg-2');
SELECT idem_inbox_accept_seq('billing', 'orders/0', 42);
SELECT idem_inbox_accept_seq('indexer', 'mainnet/usdc', 19000000, 5);
SELECT idem_define_machine('payment',
    '{"PENDING": ["PAID", "CANCELLED"], "PAID": ["REFUNDED"]}', '{PENDING}');
CREATE TABLE payments (id text PRIMARY KEY, status text NOT NULL);
SELECT idem_attach_machine('payments', 'status', 'payment', log => true);
INSERT INTO payments VALUES ('p1', 'PENDING'), ('p2', 'PENDING');
SELECT idem_transition('payments', 'p1', 'PAID');
CREATE TABLE shipments (id integer PRIMARY KEY, state text);
SELECT idem_attach_machine('shipments', 'state', 'payment');
INSERT INTO shipments VALUES (1, 'PENDING');
CREATE ROLE app LOGIN;
SELECT idem_grant('client', 'app');
SELECT idem_grant('consumer', 'app');
CREATE ROLE ops LOGIN;
SELECT idem_grant('maintenance', 'ops');
SELECT idem_grant('monitor', 'ops');
SELECT idem_grant('reconciler', 'ops');
GRANT SELECT, INSERT, UPDATE ON payments, shipments TO app;
-- the outbox: a message of each status
SELECT idem_outbox_emit('orders', 'o-' || i, jsonb_build_object('n', i)) FROM generate_series(1, 4) i;
SELECT idem_outbox_ack(ARRAY[id], token) FROM idem_outbox_claim('relay', 1);
SELECT count(*) FROM idem_outbox_claim('relay', 1);
SET idempotency.outbox_max_attempts = 1;
SELECT idem_outbox_nack(id, token, '{"error": "poison"}') FROM idem_outbox_claim('relay', 1);
RESET idempotency.outbox_max_attempts;
GRANT INSERT ON idem_outbox TO app;
GRANT SELECT, UPDATE ON idem_outbox TO ops;
GRANT USAGE ON SEQUENCE idem_outbox_seq TO app;
GRANT USAGE ON SEQUENCE idem_outbox_token TO ops;
SELECT idem_tenant_isolation(true);
SQL

# A record that expires at once: its token is kept for the check on 18.
my $purged_token = $old->safe_psql('app', q{
	SELECT token FROM idem_claim('purged', idem_fingerprint('p'), '1 hour', retention => '1 millisecond')});
$old->safe_psql('app', "SELECT idem_complete('purged', $purged_token)");

# The purge worker, not a call of ours, deletes the expired record and
# message, and moves the epoch.
ok( $old->poll_query_until('app', q{
		SELECT NOT EXISTS (SELECT FROM idempotency_records WHERE key = 'purged')
		   AND NOT EXISTS (SELECT FROM idem_inbox WHERE message_id = 'msg-old')}),
	'on 15 the purge worker purges the expired record and message');
my $epoch_before = $old->safe_psql('app', 'SELECT last_value FROM idem_token_epoch');
cmp_ok($epoch_before, '>=', 1, 'and moved the token epoch');
# The last token issued on 15, of the current epoch.
my $last_token = $old->safe_psql('app',
	q{SELECT token FROM idem_claim('last', idem_fingerprint('l'), '1 hour')});
is($last_token, $epoch_before * 2**16 + 1, 'a new key on 15 starts in the current epoch');
is($old->safe_psql('app', 'SELECT max(token) FROM idempotency_records'), $last_token,
	'and its token is the largest issued');
is( $old->safe_psql('app',
		q{SELECT string_agg(DISTINCT status::text, ',' ORDER BY status::text) FROM idempotency_records}),
	'failed,processing,succeeded,unknown', '15 holds records of every status');
my $taken = $old->safe_psql('app', q{SELECT token FROM idempotency_records WHERE key = 'taken'});
cmp_ok($taken, '>', 1, "the taken-over record's token is $taken");

# Everything a DBA would not want to lose, as text.  Privileges are compared
# grant by grant without MAINTAIN, which PostgreSQL 17 added (an owner holds
# it after the upgrade; checked below).
my $state_sql = <<'SQL';
SELECT string_agg(line, E'\n' ORDER BY line) FROM (
    SELECT 'acl ' || c.oid::regclass::text || ' '
           || coalesce((SELECT string_agg(a.grantor::regrole || '>' || a.grantee::regrole || ' '
                                          || a.privilege_type || ' ' || a.is_grantable,
                                          ',' ORDER BY 1)
                          FROM aclexplode(c.relacl) a WHERE a.privilege_type <> 'MAINTAIN'), '-')
           || ' rls ' || c.relrowsecurity::text || c.relforcerowsecurity::text AS line
      FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'v', 'S')
    UNION ALL
    SELECT 'acl ' || p.oid::regprocedure || ' ' || coalesce(p.proacl::text, '-')
      FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace
    UNION ALL
    SELECT 'acl type ' || t.oid::regtype || ' ' || coalesce(t.typacl::text, '-')
      FROM pg_type t WHERE t.typnamespace = 'public'::regnamespace AND t.typtype IN ('e', 'c', 'd')
    UNION ALL
    SELECT 'acl schema public ' || nspacl::text FROM pg_namespace WHERE nspname = 'public'
    UNION ALL
    SELECT 'role ' || r.rolname || ' member of ' || m.roleid::regrole
      FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.member WHERE r.rolname IN ('app', 'ops')
    UNION ALL
    SELECT 'trigger ' || pg_get_triggerdef(t.oid) || ' ' || t.tgenabled::text
      FROM pg_trigger t WHERE NOT t.tgisinternal
    UNION ALL
    SELECT 'policy ' || polrelid::regclass || ' ' || polname || ' '
           || coalesce(pg_get_expr(polqual, polrelid), '-') FROM pg_policy
    UNION ALL
    SELECT 'epoch ' || last_value || ' ' || is_called FROM idem_token_epoch
    UNION ALL
    SELECT 'extension ' || extversion || ' ' || extconfig::regclass[]::text
      FROM pg_extension WHERE extname = 'idempotency'
) lines
SQL
my @tables = split /\n/, $old->safe_psql('app', q{
	SELECT c.oid::regclass FROM pg_class c
	 WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r' ORDER BY 1});
ok(scalar(grep { $_ eq 'payments_state_log' } @tables), 'the transition log table is among the tables compared');
ok(scalar(grep { $_ eq 'idem_inbox_streams' } @tables), 'and the watermarks');

sub snapshot
{
	my ($node) = @_;
	my $out = $node->safe_psql('app', $state_sql) . "\n";
	$out .= "$_: "
	  . $node->safe_psql('app', "SELECT string_agg(t::text, E'\\n' ORDER BY t::text) FROM $_ t") . "\n"
	  for @tables;
	return $out;
}
my $before = snapshot($old);
like($before, qr/^idem_inbox_streams: \(billing,orders\/0,42,/m, 'the snapshot holds the rows');

# Debian's 15.20 (15.20-0+deb12u1) gives every column an attribute option
# pg_attver=N that its own pg_dump leaves out, but 18.6's pg_dump writes out
# (ALTER TABLE ... ALTER COLUMN ... SET (pg_attver=N)) and 18.6 refuses
# ('unrecognized parameter "pg_attver"'): pg_upgrade fails at "Restoring
# database schemas" for any table, with or without the extension.  Where the
# old server does this, the option is removed from the user columns before
# the upgrade (RESET does not remove it); nothing else is changed.
my $attver = $old->safe_psql('app', q{
	SELECT count(*) FROM pg_attribute
	 WHERE attrelid >= 16384 AND EXISTS (SELECT FROM unnest(attoptions) o WHERE o LIKE 'pg_attver=%')});
if ($attver > 0)
{
	diag("the 15 server stamps columns with pg_attver ($attver here): removing it before pg_upgrade");
	$old->safe_psql('app', q{
		UPDATE pg_attribute
		   SET attoptions = (SELECT array_agg(o) FROM unnest(attoptions) o WHERE o NOT LIKE 'pg_attver=%')
		 WHERE attrelid >= 16384 AND EXISTS (SELECT FROM unnest(attoptions) o WHERE o LIKE 'pg_attver=%')});
}
$old->stop;

# 2. pg_upgrade to PostgreSQL 18 ----------------------------------------------------------------
my $new = PostgreSQL::Test::Cluster->new('new18', install_path => $new_path);
is($new->pg_version->major, 18, "$new_path is PostgreSQL 18");
# 18's initdb turns data checksums on by default; the 15 cluster has none.
$new->init(extra => ['--no-data-checksums']);
$new->append_conf('postgresql.conf', $preload);

my @upgrade = (
	"$new_path/bin/pg_upgrade", '--no-sync',
	'-d', File::Spec->rel2abs($old->data_dir), '-D', File::Spec->rel2abs($new->data_dir),
	'-b', $old->config_data('--bindir'), '-B', "$new_path/bin",
	'-s', $new->host, '-p', $old->port, '-P', $new->port);
# pg_upgrade writes its files into the working directory's tree
my $cwd = getcwd();
chdir(PostgreSQL::Test::Utils::tempdir());
$new->command_like([ @upgrade, '--check' ], qr/\*Clusters are compatible\*/,
	'pg_upgrade --check: the clusters are compatible');
$new->command_ok([ @upgrade, '--retain' ], 'pg_upgrade from 15 to 18');
chdir($cwd);

# pg_upgrade ran both servers in binary-upgrade mode, where the purge launcher
# must not start (it would write while pg_upgrade dumps and restores).  The
# servers' log is kept by --retain under the new data directory.
my @server_logs = glob($new->data_dir . '/pg_upgrade_output.d/*/log/pg_upgrade_server.log');
is(scalar(@server_logs), 1, "pg_upgrade's server log is kept");
my $upgrade_log = @server_logs ? slurp_file($server_logs[0]) : '';
like($upgrade_log, qr/database system is ready to accept connections/,
	"the log holds the servers' runs");
unlike($upgrade_log, qr/idempotency purge/,
	'no purge launcher or run in the binary-upgrade servers');

# 3. PostgreSQL 18 ------------------------------------------------------------------------------
$new->start;
is(snapshot($new), $before,
	'on 18 every row, the epoch, the privileges, triggers, policies and the version are kept');
is( $new->safe_psql('app', q{
		SELECT count(*) FROM pg_class c, aclexplode(c.relacl) a
		 WHERE c.relnamespace = 'public'::regnamespace AND a.privilege_type = 'MAINTAIN'
		   AND a.grantee <> c.relowner}),
	'0', 'MAINTAIN, new in 17, went to no role but the owners');
is( $new->safe_psql('app',
		q{SELECT sql_version = library_version, build_id <> '', postgresql_major FROM idem_version()}),
	't|t|18', 'idem_version(): the SQL objects and the library agree, on PostgreSQL 18');

# Replays return what 15 stored.
is( $new->safe_psql('app', q{
		SELECT concat_ws(' ', outcome, token, status, response_code, result)
		  FROM idem_claim('done', idem_fingerprint('a'), '1 hour')}),
	'replay succeeded 201 {"order_id": 7}', 'a replay returns the stored result');
is( $new->safe_psql('app', q{
		SELECT concat_ws(' ', outcome, status, response_code, error)
		  FROM idem_claim('refused', idem_fingerprint('b'), '1 hour')}),
	'replay failed 402 {"reason": "declined"}', 'and the stored error of a final failure');
is( $new->safe_psql('app', q{
		SELECT concat_ws(' ', outcome, status, response_code, result)
		  FROM idem_claim('done', idem_fingerprint('f'), '1 hour', scope => 'tenant-a')}),
	'replay succeeded 200 {"scoped": true}', 'and a scoped record\'s');
is( $new->safe_psql('app', q{
		SELECT concat_ws(' ', outcome, status, error) FROM idem_claim('timeout', idem_fingerprint('d'))}),
	'unknown unknown {"provider": "no answer"}', 'an unknown outcome stays unknown');
is( $new->safe_psql('app', q{
		SELECT concat_ws(' ', outcome, status, recovery_point)
		  FROM idem_claim('running', idem_fingerprint('e'), '1 hour', wait => false)}),
	'in_progress processing step-2', 'a record in progress is still owned, with its checkpoint');
my ($ret, $out, $err) = $new->psql('app', q{SELECT idem_claim('done', idem_fingerprint('other'))});
like($err, qr/IK001|fingerprint/, 'a replay with another request is refused');

# Fencing: the taken-over record's old token is refused, the current one works.
($ret, $out, $err) = $new->psql('app',
	"SELECT idem_complete('taken', @{[ $taken - 1 ]}, '{}', 200)");
like($err, qr/token @{[ $taken - 1 ]} is not the current fencing token/, 'a stale token is refused (IK002)');
$new->safe_psql('app', qq{SELECT idem_complete('taken', $taken, '{"late": true}', 200)});
is( $new->safe_psql('app', qq{
		SELECT concat_ws(' ', outcome, response_code, result)
		  FROM idem_claim('taken', idem_fingerprint('t'))}),
	'replay 200 {"late": true}', 'and the current owner completes');
is( $new->safe_psql('app', q{
		SELECT concat_ws(' ', outcome, attempts, error)
		  FROM idem_claim('retry', idem_fingerprint('c'), '1 hour')}),
	'takeover 2 {"reason": "timeout"}', 'a retryable failure is taken over');

# Tokens keep growing: the epoch came along (with a sequence started
# afresh a new key would get token 1 again).
is( $new->safe_psql('app', q{SELECT token FROM idem_claim('after', idem_fingerprint('n'), '1 hour')}),
	$epoch_before * 2**16 + 1, 'a new key starts in the epoch reached on 15');
my $reclaimed = $new->safe_psql('app', q{SELECT token FROM idem_claim('purged', idem_fingerprint('p2'), '1 hour')});
cmp_ok($reclaimed, '>', $purged_token,
	"a key purged on 15 and claimed again on 18 gets a token ($reclaimed) above its old one ($purged_token)");

# Machines still enforce and log; tenants are still isolated.
($ret, $out, $err) = $new->psql('app', q{UPDATE payments SET status = 'REFUNDED' WHERE id = 'p2'});
like($err, qr/invalid transition from "PENDING" to "REFUNDED"/, 'the attached machine still refuses a move');
($ret, $out, $err) = $new->psql('app', q{INSERT INTO shipments VALUES (2, 'PAID')});
isnt($ret, 0, 'and a row that does not start in an initial state');
my $logged = $new->safe_psql('app', q{SELECT count(*) FROM payments_state_log});
$new->safe_psql('app', q{UPDATE payments SET status = 'CANCELLED' WHERE id = 'p2'});
is($new->safe_psql('app', q{SELECT count(*) FROM payments_state_log}), $logged + 1, 'a legal move is logged');
is($new->safe_psql('app', q{SELECT status FROM payments WHERE id = 'p2'}), 'CANCELLED', 'and made');
is( $new->safe_psql('app',
		q{SET ROLE app; SET idempotency.scope = 'tenant-a'; SELECT string_agg(key, ',' ORDER BY key) FROM idempotency_records}),
	'done,stalled', 'a tenant sees only its own records');
is( $new->safe_psql('app',
		q{SET ROLE app; SET idempotency.scope = 'tenant-a'; SELECT count(*) FROM idem_inbox}),
	'1', 'and its own inbox messages');
($ret, $out, $err) = $new->psql('app', q{SET ROLE app; SELECT idem_purge()});
like($err, qr/permission denied/, 'the client role still may not purge');
is($new->safe_psql('app', q{SET ROLE ops; SELECT idem_purge() >= 0}), 't', 'the maintenance role may');

# The purge worker runs on 18: it purges an expired record and moves the epoch.
my $short = $new->safe_psql('app', q{
	SELECT idem_complete('short',
		(SELECT token FROM idem_claim('short', idem_fingerprint('x'), '1 hour', retention => '50 ms')))});
ok( $new->poll_query_until('postgres',
		q{SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempotency purge launcher'}),
	'the purge launcher runs on 18');
ok( $new->poll_query_until('app',
		q{SELECT NOT EXISTS (SELECT FROM idempotency_records WHERE key = 'short')}),
	'and the worker purges an expired record');
cmp_ok($new->safe_psql('app', 'SELECT last_value FROM idem_token_epoch'), '>', $epoch_before,
	'moving the epoch on');
my $token = $new->safe_psql('app', q{SELECT token FROM idem_claim('later', idem_fingerprint('z'), '1 hour')});
cmp_ok($token, '>', $last_token,
	"then a new key's token ($token) is above every token issued on 15 ($last_token)");
unlike(slurp_file($new->logfile), qr/idempotency purge of database "app" failed/,
	'no purge run failed on 18');

$new->stop;
done_testing();
