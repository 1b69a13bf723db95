# idem-test: c-edition-only: the purge worker and its statistics live in the C library, preloaded; the SQL edition schedules idem_purge with pg_cron instead (test/run checks that run), and idem_stats raises 55000
# The purge worker, with the library in shared_preload_libraries: it purges
# on its interval in every listed database, follows a SIGHUP change of its
# settings, comes back after a crash, and lets the server shut down cleanly.
# The statistics count what happens.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemEdition;
use Time::HiRes qw(time sleep);

my $node = PostgreSQL::Test::Cluster->new('worker');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.databases = 'postgres'
idempotency.purge_interval = 1
restart_after_crash = on
});
$node->start;

$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
$node->safe_psql('postgres', 'CREATE DATABASE second');
$node->safe_psql('second', 'CREATE EXTENSION idempotency');

# expired: finished, with a short retention; kept: unfinished or unknown
# (tokens come from the claims: after a purge, new keys start above 2^32)
my $setup = q{
	SELECT idem_complete('done',
		(SELECT token FROM idem_claim('done', '\x01', '1 hour', retention => '50 ms')));
	SELECT idem_fail('failed',
		(SELECT token FROM idem_claim('failed', '\x01', '1 hour', retention => '50 ms')),
		'{"e": 1}', retryable => false);
	SELECT idem_claim('running', '\x01', '1 hour', retention => '50 ms');
	SELECT idem_mark_unknown('unsure',
		(SELECT token FROM idem_claim('unsure', '\x01', '1 hour', retention => '50 ms')),
		'{"timeout": true}');
	SELECT idem_inbox_accept('consumer', 'message', '50 ms');
	SELECT idem_inbox_accept_seq('consumer', 'stream', 7);
};
$node->safe_psql('postgres', $setup);
$node->safe_psql('second', $setup);

ok( $node->poll_query_until(
		'postgres', q{SELECT count(*) = 2 AND bool_and(status IN ('processing', 'unknown'))
		              FROM idempotency_records}),
	'the worker purges the expired records of a listed database');
is($node->safe_psql('postgres', 'SELECT count(*) FROM idem_inbox'), '0',
	'and its expired inbox messages');
is($node->safe_psql('postgres', q{SELECT idem_inbox_watermark('consumer', 'stream')}), '7',
	'but never a watermark');
is($node->safe_psql('postgres',
		q{SELECT value >= 3 FROM idem_stats() WHERE counter = 'purged_rows'}),
	't', 'the statistics count the purged rows');

# the outbox: published messages go after idempotency.outbox_retention (here
# 1 s, set for the database, which the worker's runs read when they
# connect); pending, in-flight and dead ones stay
$node->safe_psql('postgres', q{ALTER DATABASE postgres SET idempotency.outbox_retention = 1});
$node->safe_psql('postgres', q{
	SELECT idem_outbox_emit('w', k, '{}') FROM unnest('{published,flight,dead,pending}'::text[]) k;
	SELECT idem_outbox_ack(ARRAY[id], token) FROM idem_outbox_claim('r', 10) WHERE aggregateid = 'published';
});
$node->safe_psql('postgres', q{
	SET idempotency.outbox_max_attempts = 1;
	SELECT idem_outbox_nack(id, token, '{}') FROM idem_outbox WHERE aggregateid = 'dead';
	UPDATE idem_outbox SET status = 'pending', available_at = now(), lease_expires_at = NULL
	 WHERE aggregateid = 'pending';
	UPDATE idem_outbox SET created_at = created_at - interval '1 day', updated_at = updated_at - interval '1 day'
	 WHERE aggregateid <> 'published';
});
ok( $node->poll_query_until('postgres',
		q{SELECT string_agg(aggregateid || ':' || status, ',' ORDER BY seq) = 'flight:in_flight,dead:dead,pending:pending'
		  FROM idem_outbox}),
	'the worker purges published outbox messages after idempotency.outbox_retention, and no other');
$node->safe_psql('postgres', q{ALTER DATABASE postgres RESET idempotency.outbox_retention});

sleep(2);
is($node->safe_psql('second', 'SELECT count(*) FROM idempotency_records'), '4',
	'a database that is not listed is left alone');

# SIGHUP: list the second database too
$node->append_conf('postgresql.conf', "idempotency.databases = 'postgres, second'");
$node->reload;
ok( $node->poll_query_until('second', 'SELECT count(*) = 2 FROM idempotency_records'),
	'after a reload the worker purges the newly listed database');

# SIGHUP: pause it
# (the postmaster logs each start of a run at DEBUG1)
$node->append_conf('postgresql.conf', "idempotency.purge_interval = 0\nlog_min_messages = debug1");
$node->reload;
# The launcher has taken the reload when it starts no run for three
# intervals in a row (a loaded machine may take it late: wait for that, not
# for a fixed time, before the next records expire).
{
	my $quiet_since = time;
	my $from = -s $node->logfile;
	my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
	while (time - $quiet_since < 3 && time < $deadline)
	{
		if (slurp_file($node->logfile, $from) =~ /starting background worker process "idempotency purge/)
		{
			$quiet_since = time;
			$from = -s $node->logfile;
		}
		sleep(0.2);
	}
}
$node->safe_psql('postgres', $setup =~ s/'done'/'done2'/gr =~ s/'failed'/'failed2'/gr
	=~ s/'running'/'running2'/gr =~ s/'unsure'/'unsure2'/gr =~ s/'message'/'message2'/gr);
sleep(3);
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempotency_records WHERE key LIKE '%2'}),
	'4', 'an interval of 0 pauses purging');

$node->append_conf('postgresql.conf', 'idempotency.purge_interval = 1');
$node->reload;
ok( $node->poll_query_until('postgres',
		q{SELECT count(*) = 2 FROM idempotency_records WHERE key LIKE '%2'}),
	'and a positive interval resumes it');

# a crash of the launcher: the postmaster restarts it
my $launcher = $node->safe_psql('postgres', q{
	SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempotency purge launcher'});
like($launcher, qr/^\d+$/, 'the launcher shows in pg_stat_activity');
kill 'KILL', $launcher;
ok( $node->poll_query_until('postgres', qq{
		SELECT pid <> $launcher FROM pg_stat_activity
		WHERE backend_type = 'idempotency purge launcher'}),
	'the postmaster restarts the launcher after it crashed');
$node->safe_psql('postgres', q{
	SELECT idem_complete('after-crash',
		(SELECT token FROM idem_claim('after-crash', '\x01', '1 hour', retention => '50 ms')));
});
ok( $node->poll_query_until('postgres',
		q{SELECT count(*) = 0 FROM idempotency_records WHERE key = 'after-crash'}),
	'and the restarted launcher purges again');

# statistics
$node->safe_psql('postgres', 'SELECT idem_stats_reset()');
$node->safe_psql('postgres', q{
	SELECT idem_claim('s1', '\x01', '1 hour');
	SELECT idem_claim('s1', '\x01', '1 hour');
});
is( $node->safe_psql('postgres',
		q{SELECT string_agg(counter || '=' || value, ',' ORDER BY counter) FROM idem_stats()
		  WHERE counter IN ('claims_new', 'claims_in_progress', 'completions')}),
	'claims_in_progress=1,claims_new=1,completions=0',
	'the statistics count claims by outcome since the reset');
my ($ret, $out, $err) = $node->psql('postgres', q{SELECT idem_claim('s1', '\x02', '1 hour')});
is($node->safe_psql('postgres',
		q{SELECT value FROM idem_stats() WHERE counter = 'fingerprint_conflicts'}),
	'1', 'and fingerprint conflicts');

# a clean shutdown with the worker running
$node->stop('fast');
ok($node->log_contains('idempotency purge launcher shutting down'),
	'the launcher shuts down with the server');
ok(!$node->log_contains('terminated by signal (?!9:)|PANIC|TRAP'),
	'and nothing crashed but what the test killed')
  or diag('see the server log');

done_testing();
