# idem-test: c-edition-only: it runs both editions itself, the C edition's server from PATH and the SQL edition's from IDEM_SQL_EDITION_PATH, so it runs in the C edition's pass only
# The same data in both editions: a database of the C edition, dumped with
# pg_dump -Fc, restores into a server that has only the SQL edition (a tree
# without any file of the C edition, IDEM_SQL_EDITION_PATH, made by test/run),
# and a dump of that one restores back into the C edition.  After each
# restore every table of the extension holds the same rows as its source
# (records in every status, the token epoch, the inbox and its watermarks,
# the outbox in every status, the machines and a governed business table),
# and the same script of calls (a replay, a new key's token, a takeover's
# token, an accept of a duplicate and of a new message, the next sequence
# number, an emit and a relay's claim, a transition allowed and one refused)
# prints the same answers on the source and on the restored copy: a record's
# next token is the same whichever edition issues it.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemEdition;

plan skip_all => 'IDEM_SQL_EDITION_PATH (a tree with the SQL edition only) is not set'
  unless $ENV{IDEM_SQL_EDITION_PATH};

my $c = PostgreSQL::Test::Cluster->new('c_edition');
$c->init;
$c->start;
my $s = PostgreSQL::Test::Cluster->new('sql_edition',
	install_path => $ENV{IDEM_SQL_EDITION_PATH});
$s->init;
$s->start;

is($s->safe_psql('postgres',
		"SELECT count(*) FROM pg_available_extension_versions WHERE name = 'idempotency'"),
	'1', 'the SQL edition server offers one idempotency, the SQL edition');

$c->safe_psql('postgres', 'CREATE DATABASE source');
$c->safe_psql('source', 'CREATE EXTENSION idempotency');
$c->safe_psql('source', <<'SQL');
SELECT idem_complete('done', (idem_claim('done', idem_fingerprint('a'), '1 hour')).token,
                     '{"order_id": 7}', 201, headers => '{"Location": "/orders/7"}');
SELECT idem_fail('refused', (idem_claim('refused', idem_fingerprint('b'), '1 hour')).token,
                 '{"reason": "card declined"}', retryable => false, response_code => 402);
SELECT idem_fail('retry', (idem_claim('retry', idem_fingerprint('c'), '1 hour')).token,
                 '{"reason": "timeout"}', retryable => true);
SELECT idem_mark_unknown('timeout', (idem_claim('timeout', idem_fingerprint('d'), '1 hour')).token,
                         '{"provider": "no answer"}');
SELECT idem_checkpoint('running', (idem_claim('running', idem_fingerprint('e'), '1 hour')).token, 'step-2');
SELECT idem_claim('lapsed', idem_fingerprint('l'), '1 millisecond');
SELECT idem_complete('scoped', (idem_claim('scoped', idem_fingerprint('f'), '1 hour', scope => 'tenant-9')).token,
                     '{"scoped": true}', 200, scope => 'tenant-9');
-- a purge moves the token epoch on
SELECT idem_complete('purged',
    (idem_claim('purged', idem_fingerprint('p'), '1 hour', retention => '1 millisecond')).token);
SELECT pg_sleep(0.01);
SELECT idem_purge();
SELECT idem_inbox_accept('billing', 'msg-1');
SELECT idem_inbox_accept_seq('billing', 'orders/0', 41);
SELECT idem_inbox_accept_seq('billing', 'orders/3', 1207, accept_gap => true);
SELECT idem_define_machine('payment', '{"PENDING": ["PAID", "CANCELLED"], "PAID": ["REFUNDED"]}', '{PENDING}');
CREATE TABLE payments (id int PRIMARY KEY, status text NOT NULL DEFAULT 'PENDING');
SELECT idem_attach_machine('payments', 'status', 'payment');
INSERT INTO payments VALUES (1), (2);
UPDATE payments SET status = 'PAID' WHERE id = 2;
SELECT idem_outbox_emit('orders', 'o-1', '{"amount": 1}', type => 'OrderPlaced');
SELECT idem_outbox_emit('orders', 'o-2', '{"amount": 2}');
SELECT idem_outbox_emit('orders', 'o-3', '{"amount": 3}');
SELECT idem_outbox_ack(array_agg(id), max(token)) FROM idem_outbox_claim('relay-0', 1);
SQL
$c->safe_psql('source', 'SELECT pg_sleep(0.01)');

# What must come back: every row of the extension's tables and of the
# business table, and the sequences' positions.
my @tables = qw(idempotency_records idem_inbox idem_inbox_streams idem_machines
  idem_outbox payments);
# (but for a machine's defined_at: the built-in idem.record is defined by
# each CREATE EXTENSION anew)
my $contents = join(' UNION ALL ', map {
	"SELECT '$_', md5(coalesce(string_agg((to_jsonb(t) - 'defined_at')::text, E'\\n' "
	  . "ORDER BY (to_jsonb(t) - 'defined_at')::text), '')) FROM $_ t"
} @tables)
  . " UNION ALL SELECT 'epoch', last_value::text FROM idem_token_epoch"
  . " UNION ALL SELECT 'outbox seq', last_value::text FROM idem_outbox_seq"
  . " ORDER BY 1";

# The same calls on both sides; each answer on a line of its own.  The
# editions' errors differ only in their CONTEXT lines (PL/pgSQL's), which the
# contract leaves out.
my $calls = <<'SQL';
\set SHOW_CONTEXT never
SELECT 'replay', outcome, status, result, response_code FROM idem_claim('done', idem_fingerprint('a'));
SELECT 'conflict', outcome FROM idem_claim('done', idem_fingerprint('other'));
SELECT 'final', outcome, status FROM idem_claim('refused', idem_fingerprint('b'));
SELECT 'retry', outcome, token FROM idem_claim('retry', idem_fingerprint('c'));
SELECT 'unknown', outcome, status FROM idem_claim('timeout', idem_fingerprint('d'));
SELECT 'running', outcome, recovery_point FROM idem_claim('running', idem_fingerprint('e'));
SELECT 'takeover', outcome, token FROM idem_claim('lapsed', idem_fingerprint('l'));
SELECT 'new', outcome, token FROM idem_claim('fresh', idem_fingerprint('n'));
SELECT 'scoped', outcome, result FROM idem_claim('scoped', idem_fingerprint('f'), scope => 'tenant-9');
SELECT 'inbox dup', idem_inbox_accept('billing', 'msg-1');
SELECT 'inbox new', idem_inbox_accept('billing', 'msg-2');
SELECT 'seq next', idem_inbox_accept_seq('billing', 'orders/0', 42);
SELECT 'seq old', idem_inbox_accept_seq('billing', 'orders/0', 40);
SELECT 'emit', count(*) FROM idem_outbox_emit('orders', 'o-4', '{"amount": 4}');
SELECT 'relay', key, seq FROM idem_outbox_claim('relay-1', 10) ORDER BY seq;
UPDATE payments SET status = 'PAID' WHERE id = 1;
SELECT 'paid', status FROM payments WHERE id = 1;
DO $$BEGIN UPDATE payments SET status = 'PENDING' WHERE id = 2;
   EXCEPTION WHEN OTHERS THEN RAISE NOTICE 'refused % %', SQLSTATE, SQLERRM; END$$;
SQL

sub restore
{
	my ($from, $from_db, $to, $to_db, $what) = @_;
	my $dump = $PostgreSQL::Test::Utils::tmp_check . "/$to_db.dump";
	$from->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $from->connstr($from_db) ],
		"$what: pg_dump -Fc");
	$to->safe_psql('postgres', "CREATE DATABASE $to_db");
	$to->command_ok([ 'pg_restore', '--exit-on-error', '-d', $to->connstr($to_db), $dump ],
		"$what: pg_restore without errors");
	is($to->safe_psql($to_db, $contents), $from->safe_psql($from_db, $contents),
		"$what: every table and sequence holds what the source held");
	my ($out_from, $err_from, $out_to, $err_to);
	# the calls change the data: on copies, so that each side starts equal
	$from->safe_psql('postgres', "CREATE DATABASE ${to_db}_twin TEMPLATE $from_db");
	$from->psql("${to_db}_twin", $calls, stdout => \$out_from, stderr => \$err_from,
		on_error_stop => 0);
	$to->psql($to_db, $calls, stdout => \$out_to, stderr => \$err_to, on_error_stop => 0);
	like($out_from, qr/^replay\|replay\|succeeded\|/m, "$what: the source answered the calls");
	is($out_to, $out_from, "$what: the restored copy answers every call as the source does");
	is($err_to, $err_from, "$what: the same notices (the refused transition)");
}

restore($c, 'source', $s, 'in_sql', 'C edition to SQL edition');
restore($s, 'in_sql', $c, 'back_in_c', 'SQL edition back to the C edition');

done_testing();
