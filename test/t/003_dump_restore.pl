# Dump and restore: pg_dump -Fc of a database using the extension, restored
# with pg_restore --exit-on-error into a new database, keeps every record (in
# each status, released and expired ones included, every column), the token
# epoch, inbox messages (live and expired) and stream watermarks, every
# user-defined state machine (hostile names included) but not the built-in
# ones, the attached triggers (on tables with awkward identifiers: quotes,
# spaces, a semicolon, a hostile schema, an enum state column, a column name
# long enough for a shortened trigger name, a composite primary key), the
# transition logs, the tenant policies and the grants of idem_grant.  After
# the restore the triggers still enforce their machines, idem_transition
# works, claims and accepts answer as they did in the source, new keys get
# tokens in the same epoch, and idem.record still governs the records'
# statuses.  Row-level security (idem_tenant_isolation) is not dumped for an
# extension's tables, but idem_settings is, and restoring its row turns
# isolation on again: the test checks that tenants are isolated after the
# restore, and that isolation can be turned off and on there.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemEdition;

my $node = PostgreSQL::Test::Cluster->new('dump');
$node->init;
$node->start;
$node->safe_psql('postgres', 'CREATE DATABASE source');
$node->safe_psql('source', 'CREATE EXTENSION idempotency');

# Records in every status: succeeded, failed (final and retryable), unknown,
# processing (with a live lease and a checkpoint), one in another scope.
$node->safe_psql('source', <<'SQL');
SELECT idem_claim('done', idem_fingerprint('a'), '1 hour');
SELECT idem_complete('done', 1, '{"order_id": 7}', 201);
SELECT idem_claim('refused', idem_fingerprint('b'), '1 hour');
SELECT idem_fail('refused', 1, '{"reason": "card declined"}', retryable => false, response_code => 402);
SELECT idem_claim('retry', idem_fingerprint('c'), '1 hour');
SELECT idem_fail('retry', 1, '{"reason": "timeout"}', retryable => true);
SELECT idem_claim('timeout', idem_fingerprint('d'), '1 hour');
SELECT idem_mark_unknown('timeout', 1, '{"provider": "no answer"}');
SELECT idem_claim('running', idem_fingerprint('e'), '1 hour');
SELECT idem_checkpoint('running', 1, 'step-2');
SELECT idem_claim('done', idem_fingerprint('f'), '1 hour', scope => $s$tenant "x"; y$s$);
SELECT idem_complete('done', 1, '{"scoped": true}', 200, scope => $s$tenant "x"; y$s$);
-- taken over once (attempts 2), with a recovery point
SELECT idem_claim('taken', idem_fingerprint('t'), '1 millisecond');
SELECT pg_sleep(0.01);
SELECT idem_claim('taken', idem_fingerprint('t'), '1 hour');
SELECT idem_checkpoint('taken', 2, 'second try');
-- purged: the token epoch moves on, new keys start at 2^32 + 1
SELECT idem_complete('purged',
    (SELECT token FROM idem_claim('purged', idem_fingerprint('p'), '1 hour', retention => '1 millisecond')));
SELECT pg_sleep(0.01);
SELECT idem_purge();
-- released, and finished but past its retention (not purged yet)
SELECT idem_release('released',
    (SELECT token FROM idem_claim('released', idem_fingerprint('r'), '1 hour')));
SELECT idem_complete('expired',
    (SELECT token FROM idem_claim('expired', idem_fingerprint('x'), '1 hour', retention => '1 millisecond')),
    '{"old": true}');
SQL

# The inbox: messages (one expired, not purged yet; one with a hostile
# consumer and id) and stream watermarks (one-part and two-part forms).
$node->safe_psql('source', <<'SQL');
SELECT idem_inbox_accept('billing', 'msg-1');
SELECT idem_inbox_accept('billing', 'msg-old', retention => '1 millisecond');
SELECT idem_inbox_accept($c$we"ird/consumer$c$, $m$id; 'x' \ y$m$);
SELECT idem_inbox_accept_seq('billing', 'orders/0', 41);
SELECT idem_inbox_accept_seq('billing', 'orders/0', 42);
SELECT idem_inbox_accept_seq('billing', 'orders/3', 1207, accept_gap => true);
SELECT idem_inbox_accept_seq('indexer', 'mainnet/usdc', 19000000, 5);
SQL

# Machines: "payment", and one whose name and states are hostile to quoting
# (double and single quotes, a semicolon, commas, braces, backslashes, a
# state called NULL).  Both are attached, with the transition log.
$node->safe_psql('source', <<'SQL');
SELECT idem_define_machine('payment',
    '{"PENDING": ["PAID", "CANCELLED"], "PAID": ["REFUNDED"]}', '{PENDING}');
SELECT idem_define_machine($m$we"ird; machine$m$,
    jsonb_build_object($s$a "b"$s$, jsonb_build_array('c,d', 'NULL'),
                       'c,d', jsonb_build_array('{g}'),
                       'NULL', jsonb_build_array($s$h'i j\k$s$)),
    ARRAY[$s$a "b"$s$]);

CREATE TABLE payments (id text PRIMARY KEY, status text NOT NULL, amount integer);
SELECT idem_attach_machine('payments', 'status', 'payment', log => true);
INSERT INTO payments VALUES ('p1', 'PENDING', 10), ('p2', 'PENDING', 20), ('p3', 'PENDING', 30);
SELECT idem_transition('payments', 'p1', 'PAID');
SELECT idem_transition('payments', 'p1', 'REFUNDED', from_states => '{PAID}');
UPDATE payments SET status = 'CANCELLED' WHERE id = 'p3';

CREATE TABLE "odd ""table""" (id integer PRIMARY KEY, "state col" text);
SELECT idem_attach_machine('"odd ""table"""', 'state col', $m$we"ird; machine$m$, log => true);
INSERT INTO "odd ""table""" VALUES (1, $s$a "b"$s$), (2, $s$a "b"$s$);
SELECT idem_transition('"odd ""table"""', '1', 'NULL');
SQL

# A table in a schema with a hostile name, with a composite primary key and
# an enum state column whose name is so long that the trigger names are
# shortened with a hash; with the transition log.
$node->safe_psql('source', <<'SQL');
CREATE SCHEMA "Sch ""ema""; x";
CREATE TYPE "Sch ""ema""; x"."Order State" AS ENUM ('new', 'paid', 'shipped');
SELECT idem_define_machine('order', '{"new": ["paid"], "paid": ["shipped"]}', '{new}');
CREATE TABLE "Sch ""ema""; x"."Orders ""2024""" (
    "Order Id" integer,
    "Region" text,
    "the state of this order, in a column with a rather long name" "Sch ""ema""; x"."Order State",
    PRIMARY KEY ("Order Id", "Region"));
SELECT idem_attach_machine('"Sch ""ema""; x"."Orders ""2024"""',
    'the state of this order, in a column with a rather long name', 'order', log => true);
INSERT INTO "Sch ""ema""; x"."Orders ""2024""" VALUES (1, 'eu', 'new'), (1, 'us', 'new'), (2, 'eu', 'new');
SELECT idem_transition('"Sch ""ema""; x"."Orders ""2024"""', ARRAY['1', 'eu'], 'paid');
SELECT idem_transition('"Sch ""ema""; x"."Orders ""2024"""', ARRAY['1', 'eu'], 'shipped');
SELECT idem_transition('"Sch ""ema""; x"."Orders ""2024"""', ARRAY['2', 'eu'], 'paid');
SQL

# A backup taken by a role that reads all data (no superuser, no BYPASSRLS),
# in a database without isolation: nothing of the extension is behind
# row-level security then, idem_tenant_members included (idem_role_tenants
# reads it for the other roles), and its rows are in the dump.
my $backup_dump = PostgreSQL::Test::Utils::tempdir . '/by_backup.sql';
$node->safe_psql('postgres', 'CREATE DATABASE backup_source');
$node->safe_psql('backup_source', q{
	CREATE EXTENSION idempotency;
	CREATE ROLE backup LOGIN;
	GRANT pg_read_all_data TO backup;
	CREATE ROLE app_t9;
	SELECT idem_grant_tenant('t9', 'app_t9');
});
$node->command_ok(
	[ 'pg_dump', '-U', 'backup', '-f', $backup_dump, '-d', $node->connstr('backup_source') ],
	'pg_dump by a role with pg_read_all_data works');
like(slurp_file($backup_dump), qr/^app_t9\tt9$/m, 'and the dump holds the tenant members');

# Grants and tenant isolation (forced row-level security on the three tables).
$node->safe_psql('source', <<'SQL');
CREATE ROLE tenant_app;
SELECT idem_grant('client', 'tenant_app');
SELECT idem_grant('consumer', 'tenant_app');
CREATE ROLE tenant_reconcile;
SELECT idem_grant('global_reconciler', 'tenant_reconcile');
SELECT idem_tenant_isolation(true);
SQL

# Sanity of the source before dumping it.
is( $node->safe_psql(
		'source', q{SELECT string_agg(key || ':' || status, ',' ORDER BY scope, key) FROM idempotency_records}),
	'done:succeeded,expired:succeeded,refused:failed,released:processing,retry:failed,running:processing,'
	  . 'taken:processing,timeout:unknown,done:succeeded',
	'the source has records in every status');
is( $node->safe_psql('source', q{
		SELECT count(*) FROM idempotency_records
		 WHERE key = 'taken' AND attempts = 2 AND token = 2
		    OR key = 'released' AND lease_expires_at IS NULL
		    OR key = 'expired' AND expires_at < clock_timestamp()}),
	'3', 'among them a taken-over, a released and an expired record');
is($node->safe_psql('source', q{SELECT last_value, is_called FROM idem_token_epoch}),
	'1|t', 'the source purged once: the token epoch is 1');
# row-level security of the three tables: enabled/forced
my $rls_state = q{
	SELECT string_agg(relname || ':' || relrowsecurity || '/' || relforcerowsecurity, ',' ORDER BY relname)
	  FROM pg_class WHERE relname IN ('idempotency_records', 'idem_inbox', 'idem_inbox_streams')};
is($node->safe_psql('source', $rls_state),
	'idem_inbox:true/true,idem_inbox_streams:true/true,idempotency_records:true/true',
	'the source has tenant isolation on (row-level security enabled and forced)');
is($node->safe_psql('source', q{SELECT string_agg(id || ':' || status, ',' ORDER BY id) FROM payments}),
	'p1:REFUNDED,p2:PENDING,p3:CANCELLED', 'the source payments went through their moves');

my $tempdir = PostgreSQL::Test::Utils::tempdir;
my $dump = "$tempdir/source.dump";
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('source') ],
	'pg_dump -Fc of the source database');

# The archive as SQL: the built-in machine is not in it, the others are.
my $script = "$tempdir/source.sql";
$node->command_ok([ 'pg_restore', '-f', $script, $dump ], 'pg_restore -f lists the archive as SQL');
my $sql = slurp_file($script);
unlike($sql, qr/idem\.record/, 'the built-in machine idem.record is not dumped');
like($sql, qr/we"ird; machine/, 'the machine with a hostile name is dumped');
like($sql, qr/CREATE EXTENSION IF NOT EXISTS idempotency/, 'the dump creates the extension');

$node->safe_psql('postgres', 'CREATE DATABASE restored');
$node->command_ok(
	[ 'pg_restore', '--exit-on-error', '-d', $node->connstr('restored'), $dump ],
	'pg_restore into a new database, without errors');

# Everything the dump carries is equal in both databases.
my %same = (
	'records' => q{
		SELECT scope, key, encode(fingerprint, 'hex'), token, lease_expires_at, created_at,
		       updated_at, completed_at, expires_at, purge_after, status, attempts, response_code,
		       retryable, recovery_point, result, error
		  FROM idempotency_records ORDER BY scope, key},
	'token epoch' => q{SELECT last_value, is_called FROM idem_token_epoch},
	'inbox messages' => q{SELECT * FROM idem_inbox ORDER BY consumer, message_id},
	'stream watermarks' => q{SELECT * FROM idem_inbox_streams ORDER BY consumer, stream},
	'tenant policies' => q{
		SELECT polrelid::regclass::text, polname, polcmd, polpermissive, polroles::text,
		       pg_get_expr(polqual, polrelid), pg_get_expr(polwithcheck, polrelid)
		  FROM pg_policy ORDER BY 1, 2},
	'table privileges' => q{
		SELECT c.relname, a.grantee::regrole, a.privilege_type, a.is_grantable
		  FROM pg_class c, aclexplode(c.relacl) a
		 WHERE c.relnamespace = 'public'::regnamespace AND c.relname LIKE 'idem%'
		 ORDER BY 1, 2, 3},
	'function privileges' => q{
		SELECT p.oid::regprocedure::text, a.grantee::regrole, a.privilege_type
		  FROM pg_proc p, aclexplode(p.proacl) a
		 WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'idem%'
		 ORDER BY 1, 2, 3},
	# idem.record is made anew by CREATE EXTENSION: all but its defined_at
	'machines' => q{
		SELECT name, states, initial_states,
		       CASE WHEN name NOT LIKE 'idem.%' THEN defined_at END
		  FROM idem_machines ORDER BY name},
	'moves' =>
	  q{SELECT machine, from_state, to_state FROM idem_machine_moves ORDER BY machine, from_state, to_state},
	'states of the hostile machine' =>
	  q{SELECT * FROM idem_machine_states($m$we"ird; machine$m$)},
	'DOT of the hostile machine' => q{SELECT idem_machine_dot($m$we"ird; machine$m$)},
	'attachments' => q{
		SELECT table_name::text, state_column, machine, trigger_name
		  FROM idem_attached_machines ORDER BY 1, 2},
	'payments'        => q{SELECT * FROM payments ORDER BY id},
	'odd table'       => q{SELECT * FROM "odd ""table""" ORDER BY id},
	'payments log'    => q{SELECT * FROM payments_state_log ORDER BY logged_at, to_state},
	'odd table log'   => q{SELECT * FROM "odd ""table""_state_log" ORDER BY logged_at, to_state},
	'orders in the hostile schema' => q{SELECT * FROM "Sch ""ema""; x"."Orders ""2024""" ORDER BY 1, 2},
	'their log' => q{SELECT * FROM "Sch ""ema""; x"."Orders ""2024""_state_log" ORDER BY logged_at, to_state},
	'enforcing triggers' => q{
		SELECT tgrelid::regclass::text, tgname, tgenabled, pg_get_triggerdef(oid)
		  FROM pg_trigger WHERE NOT tgisinternal ORDER BY 1, 2});
for my $what (sort keys %same)
{
	my $before = $node->safe_psql('source', $same{$what});
	my $after = $node->safe_psql('restored', $same{$what});
	isnt($before, '', "$what: the source has some");
	is($after, $before, "$what: equal after the restore");
}

is( $node->safe_psql(
		'restored', q{SELECT count(*) FROM idem_machines WHERE name = 'idem.record'}),
	'1', 'idem.record exists exactly once after the restore');
is( $node->safe_psql(
		'restored',
		q{SELECT string_agg(from_state || '>' || to_state, ',' ORDER BY from_state, to_state)
		    FROM idem_machine_moves WHERE machine = 'idem.record'}),
	'failed>processing,processing>failed,processing>succeeded,processing>unknown,unknown>failed,unknown>succeeded',
	'with its moves exactly once');
is($node->safe_psql('restored', q{SELECT count(*) FROM payments_state_log}),
	'6', 'the payments log has its six rows: three inserts and three moves');

# The restored triggers enforce the machines.
my ($ret, $out, $err) = $node->psql('restored',
	q{UPDATE payments SET status = 'PENDING' WHERE id = 'p3'},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
isnt($ret, 0, 'an illegal UPDATE fails after the restore');
like(
	$err,
	qr/IK005: invalid transition from "CANCELLED" to "PENDING" in column "status" of table "payments"/,
	'with the invalid-transition error');
($ret, $out, $err) = $node->psql('restored',
	q{UPDATE payments SET status = 'PAID' WHERE id = 'p1'},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/IK005: invalid transition from "REFUNDED" to "PAID"/,
	'a restored terminal state stays terminal');
($ret, $out, $err) = $node->psql('restored', q{INSERT INTO payments VALUES ('p9', 'PAID', 90)},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/IK005: invalid initial state "PAID"/, 'the initial states are enforced');

is($node->safe_psql('restored', q{SELECT idem_transition('payments', 'p2', 'PAID')}),
	'applied', 'a legal idem_transition applies after the restore');
is($node->safe_psql('restored', q{SELECT idem_transition('payments', 'p2', 'PAID')}),
	'already', 'and is idempotent');
is($node->safe_psql('restored', q{SELECT idem_transition('payments', 'p3', 'PAID')}),
	'rejected', 'a move from a state without that move is rejected');
is( $node->safe_psql(
		'restored',
		q{SELECT row_key::text || ' ' || from_state || '>' || to_state FROM payments_state_log
		   ORDER BY logged_at DESC LIMIT 1}),
	'{"id": "p2"} PENDING>PAID',
	'the restored log trigger records the new move');

# The hostile machine's trigger too.
is( $node->safe_psql(
		'restored', q{SELECT idem_transition('"odd ""table"""', '2', 'c,d', state_column => 'state col')}),
	'applied', 'idem_transition on the table governed by the hostile machine');
is( $node->safe_psql(
		'restored', q{SELECT idem_transition('"odd ""table"""', '2', '{g}')}),
	'applied', 'a state with braces is reached');
($ret, $out, $err) = $node->psql('restored',
	q{UPDATE "odd ""table""" SET "state col" = $s$a "b"$s$ WHERE id = 1},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/IK005: invalid transition from "NULL" to "a "b""/,
	'the hostile machine refuses an illegal move');
($ret, $out, $err) = $node->psql('restored',
	q{UPDATE "odd ""table""" SET "state col" = NULL WHERE id = 1},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/IK005: invalid transition from "NULL" to NULL/,
	'the state called NULL is a string, and SQL NULL is still no state');
is( $node->safe_psql(
		'restored',
		q{SELECT string_agg(from_state || '>' || to_state, ',' ORDER BY logged_at)
		    FROM "odd ""table""_state_log" WHERE row_key = '{"id": 2}'}),
	qq{a "b">c,d,c,d>{g}},
	'and logs its moves');

# Claims replay the restored outcomes.
is( $node->safe_psql(
		'restored',
		q{SELECT outcome, token IS NULL, status, response_code, result
		    FROM idem_claim('done', idem_fingerprint('a'), '1 hour')}),
	'replay|t|succeeded|201|{"order_id": 7}',
	'a restored success replays');
is( $node->safe_psql(
		'restored',
		q{SELECT outcome, status, response_code, error FROM idem_claim('refused', idem_fingerprint('b'), '1 hour')}),
	'replay|failed|402|{"reason": "card declined"}',
	'a restored final failure replays');
is( $node->safe_psql(
		'restored',
		q{SELECT outcome, token, status, attempts, error FROM idem_claim('retry', idem_fingerprint('c'), '1 hour')}),
	'takeover|' . (65536 + 1) . '|processing|2|{"reason": "timeout"}',
	'a restored retryable failure is taken over with the first token of the restored epoch (its own is of an earlier one)');
is( $node->safe_psql(
		'restored',
		q{SELECT outcome, token IS NULL, status, error FROM idem_claim('timeout', idem_fingerprint('d'), '1 hour')}),
	'unknown|t|unknown|{"provider": "no answer"}',
	'a restored unknown outcome stays unknown');
is( $node->safe_psql(
		'restored',
		q{SELECT outcome, token IS NULL, status, recovery_point FROM idem_claim('running', idem_fingerprint('e'), '1 hour')}),
	'in_progress|t|processing|step-2',
	'a restored live lease is still in progress');
is( $node->safe_psql(
		'restored',
		q{SELECT outcome, result FROM idem_claim('done', idem_fingerprint('f'), '1 hour', scope => $s$tenant "x"; y$s$)}),
	'replay|{"scoped": true}',
	'a restored record in another scope replays');
($ret, $out, $err) = $node->psql('restored',
	q{SELECT idem_claim('done', idem_fingerprint('not a'), '1 hour')},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/IK001/, 'a restored fingerprint still refuses a different request');
is( $node->safe_psql(
		'restored',
		q{SELECT outcome, token FROM idem_claim('brand new', idem_fingerprint('g'), '1 hour')}),
	'new|' . (65536 + 1), 'a new key is claimed in the restored database, in the restored token epoch');
my $old_token = $node->safe_psql('restored', q{SELECT token FROM idem_lookup('expired')});
is( $node->safe_psql(
		'restored',
		q{SELECT outcome, token, attempts FROM idem_claim('expired', idem_fingerprint('another x'), '1 hour')}),
	'new|' . ($old_token + 1) . '|1',
	'a restored expired record counts as absent: its key is new, with the next token');
$old_token = $node->safe_psql('restored', q{SELECT token FROM idem_lookup('released')});
is( $node->safe_psql(
		'restored', q{SELECT outcome, token FROM idem_claim('released', idem_fingerprint('r'), '1 hour')}),
	'new|' . ($old_token + 1), 'so does a restored released record');
is( $node->safe_psql(
		'restored',
		q{SELECT outcome, token IS NULL, attempts, recovery_point FROM idem_claim('taken', idem_fingerprint('t'), '1 hour')}),
	'in_progress|t|2|second try', 'a restored takeover keeps its attempts and recovery point');
$node->safe_psql('restored', q{SELECT idem_complete('taken', 2, '{"second": true}')});
is($node->safe_psql('restored', q{SELECT status, result FROM idem_lookup('taken')}),
	'succeeded|{"second": true}', 'and its owner completes it with the token it had before the dump');

# The inbox answers as in the source.
is( $node->safe_psql(
		'restored',
		q{SELECT idem_inbox_accept('billing', 'msg-1'), idem_inbox_accept('billing', 'msg-old'),
		         idem_inbox_accept($c$we"ird/consumer$c$, $m$id; 'x' \ y$m$),
		         idem_inbox_accept('billing', 'msg-2')}),
	'f|t|f|t', 'restored messages are duplicates, an expired one and a new one are accepted');
is( $node->safe_psql(
		'restored',
		q{SELECT idem_inbox_accept_seq('billing', 'orders/0', 42), idem_inbox_accept_seq('billing', 'orders/0', 43),
		         idem_inbox_accept_seq('billing', 'orders/3', 1207),
		         idem_inbox_accept_seq('indexer', 'mainnet/usdc', 19000000, 5),
		         idem_inbox_accept_seq('indexer', 'mainnet/usdc', 19000000, 6)}),
	'duplicate|new|duplicate|duplicate|new', 'restored watermarks go on from where they were');

# The table in the hostile schema.
is( $node->safe_psql(
		'restored',
		q{SELECT trigger_name = 'zz_idem_machine_' || left(state_column, 38) || '_'
		                        || left(md5(state_column), 8)
		    FROM idem_attached_machines WHERE machine = 'order'}),
	't', 'its shortened trigger name is restored');
($ret, $out, $err) = $node->psql('restored',
	q{UPDATE "Sch ""ema""; x"."Orders ""2024""" SET "the state of this order, in a column with a rather long name" = 'new'
	   WHERE "Order Id" = 2},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/IK005: invalid transition from "paid" to "new"/, 'its trigger refuses an illegal move of the enum');
is( $node->safe_psql(
		'restored', q{SELECT idem_transition('"Sch ""ema""; x"."Orders ""2024"""', ARRAY['2', 'eu'], 'shipped')}),
	'applied', 'idem_transition by composite key works there');
is( $node->safe_psql(
		'restored',
		q{SELECT row_key::text || ' ' || from_state || '>' || to_state
		    FROM "Sch ""ema""; x"."Orders ""2024""_state_log" ORDER BY logged_at DESC LIMIT 1}),
	'{"Region": "eu", "Order Id": 2} paid>shipped', 'and the move is logged');

# Tenant isolation: the policies come back with CREATE EXTENSION (compared
# above), and the grants.  pg_dump writes no row-level security for an
# extension's tables, but the setting's row in idem_settings is dumped, and
# loading it turns isolation on again (its trigger fires on the COPY).
is($node->safe_psql('restored', $rls_state),
	'idem_inbox:true/true,idem_inbox_streams:true/true,idempotency_records:true/true',
	'row-level security is enabled and forced again after the restore');
is($node->safe_psql('restored', q{SELECT tenant_isolation FROM idem_settings}), 't',
	'from the restored setting');
my $tenant_view = q{
	SET ROLE tenant_app;
	SET idempotency.scope = 'tenant "x"; y';
	SELECT (SELECT count(*) FROM idempotency_records) || ' ' || (SELECT count(*) FROM idem_inbox);
};
is($node->safe_psql('restored', $tenant_view), '1 0',
	'a tenant sees its own records only, with nothing to turn on');
$node->safe_psql('restored', q{SELECT idem_tenant_isolation(false)});
cmp_ok((split / /, $node->safe_psql('restored', $tenant_view))[0], '>', 1,
	'idem_tenant_isolation(false) turns it off: the tenant sees every scope');
$node->safe_psql('restored', q{SELECT idem_tenant_isolation(true)});
is($node->safe_psql('restored', $rls_state),
	'idem_inbox:true/true,idem_inbox_streams:true/true,idempotency_records:true/true',
	'and idem_tenant_isolation(true) on again');
is( $node->safe_psql('restored', q{
		SET ROLE tenant_app;
		SET idempotency.scope = 'tenant "x"; y';
		SELECT outcome, result FROM idem_claim('done', idem_fingerprint('f'), '1 hour', scope => 'tenant "x"; y')}),
	'replay|{"scoped": true}', 'and claims its keys with the restored grants');
# The global reconciler's policies are not dumped (made after CREATE
# EXTENSION on its tables); loading idem_global_reconcilers makes them again.
is( $node->safe_psql('restored', q{
		SELECT string_agg(polname || ':' || array_to_string(polroles::regrole[], ','), ' ' ORDER BY polname)
		  FROM pg_policy WHERE polname LIKE 'idem_global%'}),
	'idem_global_reconciler:tenant_reconcile idem_global_reconciler_resolve:tenant_reconcile'
	  . ' idem_global_reconciler_unknown_only:tenant_reconcile',
	'the global reconciler\'s policies are made again by the restore');
my $all_records = $node->safe_psql('restored', q{SELECT count(*) FROM idempotency_records});
cmp_ok($all_records, '>', 1, 'the restored records are in several scopes');
is( $node->safe_psql('restored', q{
		SET ROLE tenant_reconcile;
		SELECT count(*) FROM idempotency_records}),
	$all_records, 'and the global reconciler sees all of them without a tenant, as the superuser does');

# The records' built-in machine still governs them.
($ret, $out, $err) = $node->psql('restored',
	q{UPDATE idempotency_records SET status = 'processing' WHERE key = 'done' AND scope = ''},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
isnt($ret, 0, 'a succeeded record cannot go back to processing');
like(
	$err,
	qr/IK005: invalid transition from "succeeded" to "processing" in column "status" of table "idempotency_records"/,
	'idem.record refuses succeeded -> processing after the restore');

# The restored definitions are the restored database's own: a redefinition
# there applies there only.
$node->safe_psql('restored',
	q{SELECT idem_define_machine('payment', '{"PENDING": ["PAID"], "PAID": ["REFUNDED", "PENDING"]}', '{PENDING}')});
is($node->safe_psql('restored', q{SELECT idem_transition('payments', 'p2', 'PENDING')}),
	'applied', 'a redefinition in the restored database takes effect there');
is($node->safe_psql('source', q{SELECT idem_transition('payments', 'p2', 'PAID')}),
	'applied', 'the source moves p2 to PAID');
($ret, $out, $err) = $node->psql('source', q{UPDATE payments SET status = 'PENDING' WHERE id = 'p2'});
like($err, qr/invalid transition from "PAID" to "PENDING"/, 'but keeps its own definition');

$node->stop;
done_testing();
