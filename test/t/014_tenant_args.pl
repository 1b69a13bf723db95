# Tenant as an argument (issue 14), across sessions: under tenant isolation a
# role allowed t1 by idem_grant_tenant, with no idempotency.scope anywhere,
# claims with wait => false while another session of the same role holds an
# uncommitted claim of the key, and gets in_progress at once (the probe of
# the primary key agrees with the policy idem_tenant_members); a role allowed
# t2 is refused the key (42501) at once, and the same role without the
# argument's tenant gets nothing either.
use strict;
use warnings;
use Time::HiRes qw(time);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemEdition;

my $node = PostgreSQL::Test::Cluster->new('tenant_args');
$node->init;
$node->append_conf('postgresql.conf', c_edition_conf("shared_preload_libraries = 'idempotency'\n"));
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	CREATE ROLE app_t1 LOGIN;
	CREATE ROLE app_t2 LOGIN;
	SELECT idem_grant('client', 'app_t1'), idem_grant('client', 'app_t2');
	SELECT idem_grant_tenant('t1', 'app_t1'), idem_grant_tenant('t2', 'app_t2');
	SELECT idem_tenant_isolation();
});

my $holder = $node->background_psql('postgres', on_error_stop => 1);
$holder->query_safe(q{SET ROLE app_t1});
$holder->query_safe(q{BEGIN});
is($holder->query_safe(q{SELECT outcome FROM idem_claim('held', '\x01', scope => 't1/orders')}),
	'new', 'a session of app_t1 claims t1/orders/held and keeps its transaction open');

my $t0 = time;
is( $node->safe_psql('postgres', q{
		SET ROLE app_t1;
		SET statement_timeout = '20s';
		SELECT coalesce(current_setting('idempotency.scope', true), '') || '|' || outcome
		  FROM idem_claim('held', '\x01', scope => 't1/orders', wait => false)}),
	'|in_progress', 'another session of app_t1, no setting: wait => false answers in_progress');
cmp_ok(time - $t0, '<', 5, '... at once');

my ($out, $err) = ('', '');
$t0 = time;
$node->psql('postgres', q{
		SET ROLE app_t2;
		SET statement_timeout = '20s';
		SELECT outcome FROM idem_claim('held', '\x01', scope => 't1/orders', wait => false)},
	stdout => \$out, stderr => \$err);
like($err, qr/scope "t1\/orders" does not belong to the tenant of this session/,
	'app_t2 is refused t1/orders (42501), with wait => false');
cmp_ok(time - $t0, '<', 5, '... at once, without waiting for the holder');

$holder->query_safe(q{COMMIT});
$holder->quit;
is( $node->safe_psql('postgres', q{
		SET ROLE app_t2;
		SELECT count(*) FROM idempotency_records}),
	'0', 'app_t2, with no setting, sees none of t1\'s records once committed');
is( $node->safe_psql('postgres', q{
		SET ROLE app_t1;
		SELECT scope || '/' || key FROM idempotency_records}),
	't1/orders/held', 'app_t1 sees its record with no setting');

$node->stop;
done_testing();
