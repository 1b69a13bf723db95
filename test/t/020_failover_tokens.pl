# Fencing tokens across a failover that loses acknowledged commits
# (src/tokens.c).
#
# A primary with an asynchronous standby, the library preloaded and the
# purge worker on.  The standby stops receiving; the primary then
# acknowledges a claim of a new key and a takeover, which never reach the
# standby, and stops.  The standby is promoted: on it the key is absent and
# the takeover never happened.  A retry of the claim and a new takeover must
# get tokens the lost owners never held, so that each lost owner's
# completion is refused with IK002 instead of being taken for the new
# owner's.  Before the first token of the new timeline the epoch moves on by
# 2^24, once (the log says so), and the timeline is recorded; a later change
# of timeline (simulated) moves it again, once.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemEdition;

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->append_conf('postgresql.conf', c_edition_conf(q{
shared_preload_libraries = 'idempotency'
idempotency.databases = 'postgres'
idempotency.purge_interval = 1
}));
$primary->start;
$primary->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	SELECT idem_claim('before', '\x01', '1 hour');
	SELECT idem_claim('taken', '\x02', '1 millisecond');
});
$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;
$primary->wait_for_catchup($standby);
is($standby->safe_psql('postgres', q{SELECT string_agg(key || ' ' || token, ', ' ORDER BY key)
	FROM idempotency_records}), 'before 1, taken 1', 'the standby has the records');

# The standby stops receiving; the primary acknowledges what it never gets.
$standby->stop('fast');
my $lost_new = $primary->safe_psql('postgres',
	q{SELECT token FROM idem_claim('lost', '\x03', '1 hour')});
$primary->safe_psql('postgres', 'SELECT pg_sleep(0.01)');
my $lost_takeover = $primary->safe_psql('postgres',
	q{SELECT outcome || ' ' || token FROM idem_claim('taken', '\x02', '1 millisecond')});
is("$lost_new|$lost_takeover", '1|takeover 2',
	'the old primary acknowledged a new claim (token 1) and a takeover (token 2)');
$primary->stop('immediate');

$standby->start;
$standby->promote;
is($standby->safe_psql('postgres', q{SELECT count(*) FROM idempotency_records WHERE key = 'lost'}),
	'0', 'after the promotion the claim is lost');
is($standby->safe_psql('postgres', q{SELECT token FROM idempotency_records WHERE key = 'taken'}),
	'1', 'and so is the takeover');
my $timeline = $standby->safe_psql('postgres',
	q{SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int});
cmp_ok($timeline, '>', 1, "the promoted standby is on a new timeline ($timeline)");

my $offset = -s $standby->logfile;
my ($new_outcome, $new_token) = split /\|/, $standby->safe_psql('postgres',
	q{SELECT outcome, token FROM idem_claim('lost', '\x03', '1 hour')});
is($new_outcome, 'new', 'the retry claims the lost key anew');
cmp_ok($new_token, '>', $lost_new, "with a token above the lost owner's ($new_token)");
my ($ret, $out, $err) = $standby->psql('postgres',
	qq{SELECT idem_complete('lost', $lost_new, '{"by": "lost owner"}')});
like($err, qr/ERROR:  token $lost_new is not the current fencing token of idempotency key "lost"/,
	"the lost owner's completion is refused");
is($standby->safe_psql('postgres', q{SELECT status FROM idempotency_records WHERE key = 'lost'}),
	'processing', 'and changes nothing');

my ($takeover_outcome, $takeover_token) = split /\|/, $standby->safe_psql('postgres',
	q{SELECT outcome, token FROM idem_claim('taken', '\x02', '1 hour')});
is($takeover_outcome, 'takeover', 'the expired lease is taken over again');
cmp_ok($takeover_token, '>', 2, "with a token the lost takeover never held ($takeover_token)");
($ret, $out, $err) = $standby->psql('postgres',
	q{SELECT idem_complete('taken', 2, '{"by": "lost taker"}')});
like($err, qr/ERROR:  token 2 is not the current fencing token of idempotency key "taken"/,
	"the lost taker's completion is refused");
$standby->safe_psql('postgres',
	qq{SELECT idem_complete('taken', $takeover_token, '{"by": "new taker"}')});
is($standby->safe_psql('postgres',
		q{SELECT status || ' ' || result FROM idempotency_records WHERE key = 'taken'}),
	'succeeded {"by": "new taker"}', "the new owner's completion goes through");

# The move: once, before the first token, recorded with the timeline.
my $epoch = $standby->safe_psql('postgres', 'SELECT last_value FROM idem_token_epoch');
is($standby->safe_psql('postgres', 'SELECT last_value FROM idem_token_timeline'), $timeline,
	'the new timeline is recorded');
cmp_ok($epoch, '>=', 2**24, "the epoch moved on by 2^24 ($epoch)");
is($new_token, ($epoch << 16) + 1, "the retry's token is the first of that epoch");
my @moves = (slurp_file($standby->logfile) =~ /idempotency token epoch moved from \d+ to \d+ for timeline $timeline/g);
is(scalar @moves, 1, 'the log says so, once');
$standby->safe_psql('postgres', q{SELECT idem_claim('after', '\x04', '1 hour')});
is($standby->safe_psql('postgres', 'SELECT last_value FROM idem_token_epoch'), $epoch,
	'a later claim in another session does not move it again');

# Another timeline (as after a second promotion or a recovery to a point in
# time): the next first token moves the epoch again, once.
$standby->safe_psql('postgres', q{SELECT setval('idem_token_timeline', 1)});
my $before_second = $standby->safe_psql('postgres', 'SELECT last_value FROM idem_token_epoch');
$standby->safe_psql('postgres', q{SELECT idem_claim('second', '\x05', '1 hour')});
$standby->safe_psql('postgres', q{SELECT idem_claim('third', '\x06', '1 hour')});
is($standby->safe_psql('postgres', 'SELECT last_value FROM idem_token_epoch') - $before_second,
	2**24, 'a change of timeline moves the epoch on again, by 2^24, once');
is($standby->safe_psql('postgres', 'SELECT last_value FROM idem_token_timeline'), $timeline,
	'and records the timeline');

$standby->stop;
done_testing();
