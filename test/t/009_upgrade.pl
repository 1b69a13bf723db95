# idem-test: c-edition-only: it installs 0.1.0 and updates through the C edition's chain (the library of each version checking its SQL objects); the SQL edition starts at 0.3.0, with no script of an older version
# Upgrade in place: ALTER EXTENSION idempotency UPDATE from 0.1.0 keeps
# every row and grant and brings the new behaviour; an updated install is
# the same in the catalogs as a fresh one of the current version.
#
#   1. Database "upgraded": CREATE EXTENSION ... VERSION '0.1.0', records
#      in every status (a checkpoint, leases live and expired, a takeover,
#      a purge that moved the epoch), inbox messages and watermarks,
#      machines attached to tables (one with the transition log), tenant
#      isolation on, grants by idem_grant.  A session on 0.1.0 is warned
#      once that the SQL objects are older than the library.  After the
#      UPDATE every table of the database has the same rows, every object
#      the same privileges, and the new behaviour applies: idem_version(),
#      the fencing of a record deleted by a client-kind role, the machines
#      still enforce and log, the tenants are still isolated.
#   2. Databases "chained" (0.1.0, then UPDATE) and "fresh" (CREATE
#      EXTENSION of the default version): the same members, functions (whole
#      definitions: arguments and defaults, volatility, strictness, pinned
#      search_path), ACLs, comments, columns, indexes, constraints,
#      triggers, policies, types, views, sequences, config dumps and
#      built-in rows, and the same pg_dump --schema-only --binary-upgrade
#      (which writes out every member object), and the same initial
#      privileges (pg_init_privs).  Whatever later work appends to the
#      upgrade script is compared the same way.  Databases "granted_010"
#      and "granted_020" (created at 0.1.0 with roles of idem_grant's
#      client, consumer, maintenance, monitor and reader kinds, one of them
#      updated to 0.2.0 first), updated: their initial privileges are a
#      fresh install's, and restored from pg_dump into new databases, every
#      member has its privileges again and the consumer, the reader and the
#      maintenance role use what 0.2.0's update granted them (issue 25).
#   3. The outbox in a database created at 0.1.0 and updated, on a server
#      that preloads the library (for idem_stats): emit, emit_batch, claim,
#      ack, nack, retry, its rows of idem_stuck and its counters; and a
#      session opened before the update, which had claimed a key then, emits
#      afterwards without reconnecting (src/extension_objects.c: the
#      update's ALTER TABLE of idempotency_records invalidates the session's
#      cache of the extension's objects, so this passes without
#      idem_objects_outbox_seq's second look-up as well).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemEdition;

my $node = PostgreSQL::Test::Cluster->new('upgrade');
$node->init;
$node->start;
my $current = $node->safe_psql('postgres',
	q{SELECT default_version FROM pg_available_extensions WHERE name = 'idempotency'});
isnt($current, '0.1.0', "the default version is $current, not 0.1.0");

# 1. data kept ----------------------------------------------------------------------------------
$node->safe_psql('postgres', 'CREATE DATABASE upgraded');
$node->safe_psql('upgraded', q{CREATE EXTENSION idempotency VERSION '0.1.0'});
$node->safe_psql('upgraded', <<'SQL');
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
SELECT idem_complete('purged',
    (SELECT token FROM idem_claim('purged', idem_fingerprint('p'), '1 hour', retention => '1 millisecond')));
SELECT pg_sleep(0.01);
SELECT idem_purge();
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
-- privileges granted by hand, not by idem_grant: a dashboard reading
-- idem_stuck, a job cleaning the inbox
CREATE ROLE dashboard;
GRANT SELECT ON idem_stuck TO dashboard;
CREATE ROLE inbox_cleanup;
GRANT DELETE ON idem_inbox TO inbox_cleanup;
GRANT SELECT, INSERT, UPDATE ON payments, shipments TO app;
SELECT idem_tenant_isolation(true);
SQL

is( $node->safe_psql('upgraded',
		q{SELECT string_agg(DISTINCT status::text, ',' ORDER BY status::text) FROM idempotency_records}),
	'failed,processing,succeeded,unknown',
	'0.1.0 holds records of every status');

# Everything a DBA would not want to lose, as text: the rows of every table
# (the extension's and the user's), the epoch, privileges, row-level
# security, triggers and policies.
my $state_sql = <<'SQL';
SELECT string_agg(line, E'\n' ORDER BY line) FROM (
    SELECT 'acl ' || c.oid::regclass::text || ' ' || coalesce(c.relacl::text, '-') || ' rls '
           || c.relrowsecurity::text || c.relforcerowsecurity::text AS line
      FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'v', 'S')
       -- added by 0.2.0 (tenants, issue 14)
       AND c.relname NOT IN ('idem_global_reconcilers', 'idem_tenant_members')
       -- added by 0.2.0 (the outbox, issue 15)
       AND c.relname NOT IN ('idem_outbox', 'idem_outbox_seq', 'idem_outbox_token')
       -- added by 0.3.0 (fencing tokens across a failover, issue 25)
       AND c.relname <> 'idem_token_timeline'
    UNION ALL
    -- 0.2.0 gives three functions a last argument, headers (issue 14): they
    -- are new functions, which must have the old ones' grants
    SELECT 'acl ' || CASE WHEN p.proname IN ('idem_complete', 'idem_fail', 'idem_resolve')
                          THEN p.proname::text ELSE p.oid::regprocedure::text END
           || ' ' || coalesce(p.proacl::text, '-')
      FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace
       AND p.proname NOT IN ('idem_version', 'idem_records_removed', 'idem_records_truncated',
                              'idem_records_rekeyed', 'idem_enforce_initial_state',
                              'idem_inserted_unchecked')
       -- new in 0.2.0: the request fingerprint (issue 14)
       AND p.proname <> 'idem_request_fingerprint'
       -- added by 0.2.0 (tenants, issue 14)
       AND p.proname NOT IN ('idem_scope_in_tenant', 'idem_apply_global_reconcilers')
       -- added by 0.2.0 (tenant as an argument, issue 14)
       AND p.proname NOT IN ('idem_role_tenants', 'idem_grant_tenant', 'idem_revoke_tenant',
                              'idem_apply_tenant_members')
       -- added by 0.3.0 (the tenants' policies rebuilt under a lock, issue 25)
       AND p.proname <> 'idem_refuse_stale_snapshot'
       -- added by 0.3.0 (purging by pg_cron, issue 26)
       AND p.proname NOT IN ('idem_schedule_purge', 'idem_unschedule_purge')
       -- added by 0.2.0 (the outbox, issue 15)
       AND p.proname NOT LIKE 'idem\_outbox\_%'
       -- added by 0.2.0 (routing, issue 16)
       AND p.proname <> 'idem_route_hash'
       -- added by 0.2.0 (the batch inbox, issue 17)
       AND p.proname NOT IN ('idem_inbox_accept_many', 'idem_inbox_accept_seq_many')
    UNION ALL
    SELECT 'acl schema public ' || nspacl::text FROM pg_namespace WHERE nspname = 'public'
    UNION ALL
    SELECT 'trigger ' || pg_get_triggerdef(t.oid) || ' ' || t.tgenabled::text
      FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
     WHERE NOT t.tgisinternal AND c.relname NOT LIKE 'idem%'
       -- 0.2.0 adds an AFTER INSERT trigger to each attachment (checked below)
       AND t.tgname NOT LIKE 'zz\_idem\_machine\_%\_inserted'
    UNION ALL
    SELECT 'policy ' || polrelid::regclass || ' ' || polname FROM pg_policy
     -- tables added by 0.2.0 (tenants, issue 14; the outbox, issue 15)
     WHERE polrelid::regclass::text NOT IN ('idem_global_reconcilers', 'idem_tenant_members', 'idem_outbox')
    UNION ALL
    SELECT 'epoch ' || last_value || ' ' || is_called FROM idem_token_epoch
) lines
SQL
my @tables = split /\n/, $node->safe_psql('upgraded', q{
	SELECT c.oid::regclass FROM pg_class c
	 WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r' ORDER BY 1});
ok(scalar(grep { $_ eq 'payments_state_log' } @tables), 'the transition log table is among the tables kept');

sub snapshot
{
	my ($db) = @_;
	my $out = $node->safe_psql($db, $state_sql) . "\n";
	# as JSON without the column 0.2.0 adds to the records (issue 14)
	$out .= "$_: " . $node->safe_psql($db,
		"SELECT string_agg((to_jsonb(t) - 'response_headers')::text, E'\\n' ORDER BY (to_jsonb(t) - 'response_headers')::text) FROM $_ t") . "\n"
	  for @tables;
	return $out;
}
my $before = snapshot('upgraded');

# A session on 0.1.0 is told once, with the hint.
my ($ret, $out, $err) = $node->psql('upgraded',
	q{SELECT count(*) FROM idem_lookup('done'); SELECT count(*) FROM idem_lookup('refused');});
like($err, qr/WARNING:  extension "idempotency" is at version "0\.1\.0", older than its library \(version "\Q$current\E"\)/,
	'a session on 0.1.0 is warned that the SQL objects are older than the library');
like($err, qr/HINT:  Run ALTER EXTENSION idempotency UPDATE in this database\./, 'with the hint to update');
is(scalar(() = $err =~ /WARNING/g), 1, 'once per session');
is($out, "1\n1", 'and the 0.1.0 functions work with the new library');
is( $node->safe_psql('upgraded', q{
		SELECT outcome || ' ' || response_code || ' ' || result::text FROM idem_claim('done', idem_fingerprint('a'))}),
	'replay 201 {"order_id": 7}', 'a claim on 0.1.0 replays with the new library (its row has no headers)');

# A dump taken before the update, restored further down.
my $dump_010 = PostgreSQL::Test::Utils::tempdir . '/upgraded-0.1.0.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump_010, '-d', $node->connstr('upgraded') ],
	'pg_dump -Fc of the database at 0.1.0');

$node->safe_psql('upgraded', 'ALTER EXTENSION idempotency UPDATE');
is($node->safe_psql('upgraded', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	$current, "ALTER EXTENSION UPDATE moves to $current");
# The epoch is rescaled by the update to 0.3.0 (tokens become epoch * 2^16
# + n, src/tokens.c): (epoch + 1) * 2^16, above every token issued so far.
(my $rescaled = $before) =~ s/^epoch (\d+) true$/'epoch ' . (($1 + 1) * 65536) . ' true'/me
  or die 'the snapshot has no advanced epoch';
is(snapshot('upgraded'), $rescaled,
	'every row, the epoch (rescaled), the privileges, triggers and policies are kept');
# The outbox of 0.2.0 joins what 0.1.0 had set up: isolation is on, so its
# row-level security is too; ops (maintenance, monitor, reconciler) may purge
# it and read its stuck messages through idem_stuck.
is( $node->safe_psql('upgraded', q{
		SELECT relrowsecurity::text || relforcerowsecurity::text FROM pg_class WHERE oid = 'idem_outbox'::regclass}),
	'truetrue', 'the update turns row-level security on for the outbox of an isolated database');
is( $node->safe_psql('upgraded', q{
		SELECT string_agg(p, ',' ORDER BY p) FROM unnest('{SELECT,INSERT,UPDATE,DELETE}'::text[]) p
		 WHERE has_table_privilege('ops', 'idem_outbox', p)}),
	'DELETE,SELECT,UPDATE', 'the roles that purged and read idem_stuck get the outbox privileges their kinds now have');
is( $node->safe_psql('upgraded', q{
		SELECT count(*) FROM unnest('{SELECT,INSERT,UPDATE,DELETE}'::text[]) p, unnest('{dashboard,inbox_cleanup}'::text[]) r
		 WHERE has_table_privilege(r, 'idem_outbox', p)}),
	'0', 'roles granted SELECT on idem_stuck or DELETE on idem_inbox by hand, not as a kind of idem_grant, get nothing on the outbox');
is( $node->safe_psql('upgraded', q{
		SET ROLE ops; SELECT idem_purge() >= 0, (SELECT count(*) >= 0 FROM idem_stuck)}),
	't|t', 'so idem_purge and idem_stuck work for them after the update');
# The batch inbox of 0.2.0 goes to the roles that could call the single
# accepts (app, a consumer), and to no other.
is( $node->safe_psql('upgraded', q{
		SELECT has_function_privilege('app', 'idem_inbox_accept_many(text, text[], interval, boolean)', 'EXECUTE'),
		       has_function_privilege('app', 'idem_inbox_accept_seq_many(text, text, bigint[], boolean)', 'EXECUTE'),
		       has_function_privilege('ops', 'idem_inbox_accept_many(text, text[], interval, boolean)', 'EXECUTE'),
		       has_function_privilege('ops', 'idem_inbox_accept_seq_many(text, text, bigint[], boolean)', 'EXECUTE')}),
	't|t|f|f', 'the consumer granted before the update may call both batch forms, the others may not');
# What the update adds to user tables: each attachment's AFTER INSERT trigger
# (the rows really inserted must start in an initial state).
is( $node->safe_psql('upgraded', q{
		SELECT string_agg(c.relname || '.' || t.tgname, ',' ORDER BY c.relname, t.tgname)
		  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
		 WHERE t.tgname LIKE 'zz\_idem\_machine\_%\_inserted'}),
	'payments.zz_idem_machine_status_inserted,shipments.zz_idem_machine_state_inserted',
	'and every attachment gained its AFTER INSERT trigger');

($ret, $out, $err) = $node->psql('upgraded', q{SELECT count(*) FROM idem_lookup('done')});
is($err, '', 'after the update no warning');
is( $node->safe_psql('upgraded',
		q{SELECT sql_version = library_version, build_id <> '',
		         postgresql_major = current_setting('server_version_num')::int / 10000
		    FROM idem_version()}),
	't|t|t', 'idem_version(): the SQL objects and the library agree');

# The headers (issue 14): the new functions kept the old ones' grants as
# grants, not as initial privileges of the extension, so a dump writes them
# out; and they save headers that a replay gives back.
my $dump = `pg_dump --schema-only --dbname="@{[ $node->connstr('upgraded') ]}"`;
like($dump, qr/^GRANT ALL ON FUNCTION public\.idem_complete\(.*, headers jsonb\) TO app;$/m,
	'a dump grants the new idem_complete to the client granted the old one');
like($dump, qr/^GRANT ALL ON FUNCTION public\.idem_fail\(.*, headers jsonb\) TO app;$/m, 'and idem_fail');
like($dump, qr/^GRANT ALL ON FUNCTION public\.idem_resolve\(.*, headers jsonb\) TO ops;$/m,
	'and idem_resolve to the reconciler');
is( $node->safe_psql('upgraded', q{
		SELECT string_agg(p.proname || ' ' || i.initprivs::text, ',' ORDER BY p.proname)
		  FROM pg_init_privs i JOIN pg_proc p ON p.oid = i.objoid
		 WHERE p.proname IN ('idem_complete', 'idem_fail', 'idem_resolve')}),
	join(',', map { "$_ {postgres=X/postgres}" } qw(idem_complete idem_fail idem_resolve)),
	'their initial privileges are those of a fresh install');
is( $node->safe_psql('upgraded', q{
		SELECT idem_complete('running', 1, '{"order_id": 8}', 201,
		                     headers => '{"Location": "/orders/8", "X-Request-Id": "r-8"}');
		SELECT outcome || ' ' || response_code || ' ' || response_headers::text
		  FROM idem_claim('running', idem_fingerprint('e'));
		SELECT response_headers::text FROM idem_lookup('running')}),
	qq{\nreplay 201 {"Location": "/orders/8", "X-Request-Id": "r-8"}\n{"Location": "/orders/8", "X-Request-Id": "r-8"}},
	'a record claimed on 0.1.0 is completed with headers after the update, and replays them');

# Machines still enforce and log; tenants are still isolated.
($ret, $out, $err) = $node->psql('upgraded', q{UPDATE payments SET status = 'REFUNDED' WHERE id = 'p2'});
like($err, qr/invalid transition from "PENDING" to "REFUNDED"/, 'the attached machine still refuses a move');
my $logged = $node->safe_psql('upgraded', q{SELECT count(*) FROM payments_state_log});
$node->safe_psql('upgraded', q{UPDATE payments SET status = 'CANCELLED' WHERE id = 'p2'});
is($node->safe_psql('upgraded', q{SELECT count(*) FROM payments_state_log}), $logged + 1,
	'and a legal move is logged');
is( $node->safe_psql('upgraded',
		q{SET ROLE app; SET idempotency.scope = 'tenant-a'; SELECT string_agg(key, ',' ORDER BY key) FROM idempotency_records}),
	'done,stalled', 'a tenant sees only its own records');

# New behaviour: a record deleted by the client-kind role granted under
# 0.1.0 fences its stalled owner (token 1, lease expired) off.
my $fence = $node->safe_psql('upgraded', <<'SQL');
SET ROLE app;
SET idempotency.scope = 'tenant-a';
SELECT token FROM idem_lookup('stalled', 'tenant-a');
DELETE FROM idempotency_records WHERE key = 'stalled';
SELECT outcome || ' ' || (token > 1) FROM idem_claim('stalled', idem_fingerprint('s'), '1 hour', 'tenant-a');
SQL
is($fence, "1\nnew true", 'after a DELETE by the client kind, a new claim gets a token above the old owner\'s');
($ret, $out, $err) = $node->psql('upgraded',
	q{SET ROLE app; SET idempotency.scope = 'tenant-a'; SELECT idem_complete('stalled', 1, '{}', 200, 'tenant-a')});
like($err, qr/token 1 is not the current fencing token/, 'the stalled owner is refused (IK002)');

# 2. catalogs -----------------------------------------------------------------------------------
$node->safe_psql('postgres', 'CREATE DATABASE chained');
$node->safe_psql('chained', q{CREATE EXTENSION idempotency VERSION '0.1.0'});
$node->safe_psql('chained', q{ALTER EXTENSION idempotency UPDATE});
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', q{CREATE EXTENSION idempotency});

# Sections of (what, line); members are found through pg_depend, so new
# objects are compared without this test knowing them.
my $members = q{
    WITH m AS (SELECT d.classid, d.objid FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
                WHERE d.refclassid = 'pg_extension'::regclass AND e.extname = 'idempotency'
                  AND d.deptype = 'e')};
my %catalog = (
	members => q{SELECT pg_describe_object(classid, objid, 0) FROM m},
	functions => q{
        SELECT p.oid::regprocedure || E'\n' || pg_get_functiondef(p.oid) || E'\n'
               || concat_ws(' ', p.provolatile, p.proisstrict, p.proparallel, p.prosecdef,
                            p.proleakproof, p.procost, p.prorows, p.proconfig::text, p.proacl::text,
                            pg_get_function_arguments(p.oid), pg_get_function_result(p.oid))
          FROM m JOIN pg_proc p ON m.classid = 'pg_proc'::regclass AND p.oid = m.objid},
	relations => q{
        SELECT concat_ws(' ', c.oid::regclass, c.relkind, c.relpersistence, c.reloptions::text,
                         c.relacl::text, c.relrowsecurity, c.relforcerowsecurity, c.relreplident)
          FROM m JOIN pg_class c ON m.classid = 'pg_class'::regclass AND c.oid = m.objid},
	columns => q{
        SELECT concat_ws(' ', a.attrelid::regclass, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod),
                         a.attnotnull, a.attidentity, a.attgenerated, a.attcollation::regcollation,
                         a.attisdropped, a.attacl::text, pg_get_expr(ad.adbin, ad.adrelid))
          FROM pg_attribute a LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
         WHERE a.attnum > 0 AND a.attrelid IN (
               SELECT objid FROM m WHERE classid = 'pg_class'::regclass
               UNION SELECT t.typrelid FROM m JOIN pg_type t ON m.classid = 'pg_type'::regclass
                                                            AND t.oid = m.objid AND t.typrelid <> 0)},
	indexes => q{
        SELECT pg_get_indexdef(i.indexrelid) || ' ' || coalesce(c.reloptions::text, '')
          FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
         WHERE i.indrelid IN (SELECT objid FROM m WHERE classid = 'pg_class'::regclass)},
	constraints => q{
        SELECT concat_ws(' ', conrelid::regclass, contypid::regtype, conname, pg_get_constraintdef(oid),
                         condeferrable, condeferred, convalidated)
          FROM pg_constraint
         WHERE conrelid IN (SELECT objid FROM m WHERE classid = 'pg_class'::regclass)
            OR contypid IN (SELECT objid FROM m WHERE classid = 'pg_type'::regclass)},
	triggers => q{
        SELECT pg_get_triggerdef(oid) || ' ' || tgenabled::text FROM pg_trigger
         WHERE NOT tgisinternal AND tgrelid IN (SELECT objid FROM m WHERE classid = 'pg_class'::regclass)},
	policies => q{
        SELECT concat_ws(' ', polrelid::regclass, polname, polcmd, polpermissive, polroles::regrole[]::text,
                         pg_get_expr(polqual, polrelid), pg_get_expr(polwithcheck, polrelid))
          FROM pg_policy WHERE polrelid IN (SELECT objid FROM m WHERE classid = 'pg_class'::regclass)},
	types => q{
        SELECT concat_ws(' ', t.oid::regtype, t.typtype, t.typacl::text,
                         (SELECT string_agg(enumlabel, ',' ORDER BY enumsortorder) FROM pg_enum
                           WHERE enumtypid = t.oid))
          FROM m JOIN pg_type t ON m.classid = 'pg_type'::regclass AND t.oid = m.objid},
	views => q{
        SELECT c.oid::regclass || ' ' || pg_get_viewdef(c.oid)
          FROM m JOIN pg_class c ON m.classid = 'pg_class'::regclass AND c.oid = m.objid AND c.relkind = 'v'},
	sequences => q{
        SELECT concat_ws(' ', seqrelid::regclass, seqtypid::regtype, seqstart, seqincrement, seqmax, seqmin,
                         seqcache, seqcycle)
          FROM pg_sequence WHERE seqrelid IN (SELECT objid FROM m WHERE classid = 'pg_class'::regclass)},
	initprivs => q{
        SELECT pg_describe_object(i.classoid, i.objoid, i.objsubid) || ' ' || i.privtype::text || ' ' || i.initprivs::text
          FROM pg_init_privs i JOIN m ON m.classid = i.classoid AND m.objid = i.objoid},
	comments => q{
        SELECT pg_describe_object(d.classoid, d.objoid, d.objsubid) || ': ' || d.description
          FROM pg_description d WHERE (d.classoid, d.objoid) IN (SELECT classid, objid FROM m)},
	config => q{
        SELECT concat_ws(' ', extversion, extrelocatable, extnamespace::regnamespace, extconfig::regclass[]::text,
                         extcondition::text)
          FROM pg_extension WHERE extname = 'idempotency'},
	rows => q{
        SELECT 'machine ' || concat_ws(' ', name, states::text, initial_states::text) FROM idem_machines
        UNION ALL SELECT 'move ' || concat_ws(' ', machine, from_state, to_state) FROM idem_machine_moves
        UNION ALL SELECT 'record ' || r::text FROM idempotency_records r
        UNION ALL SELECT 'inbox ' || i::text FROM idem_inbox i
        UNION ALL SELECT 'stream ' || s::text FROM idem_inbox_streams s
        UNION ALL SELECT 'settings ' || s::text FROM idem_settings s
        UNION ALL SELECT 'epoch ' || last_value || ' ' || is_called FROM idem_token_epoch});

for my $what (sort keys %catalog)
{
	my $sql = "$members SELECT coalesce(string_agg(line, E'\\n' ORDER BY line), '') FROM ($catalog{$what}) AS s(line)";
	my $chained = $node->safe_psql('chained', $sql);
	isnt($chained, '', "$what: the updated install has some");
	is($chained, $node->safe_psql('fresh', $sql), "$what: the updated install and a fresh one are the same");
}

# pg_dump in binary-upgrade mode writes every member object; the OIDs it
# preserves, the frozen xids and the key of \restrict are the only
# differences allowed.
sub schema_dump
{
	my ($db, @options) = @_;
	my $dump = `pg_dump --schema-only @options --dbname="@{[ $node->connstr($db) ]}"`;
	die "pg_dump of $db failed" if $? != 0;
	$dump =~ s/^.*binary_upgrade_set_next_\w+\(.*\n//mg;
	$dump =~ s/'\{[0-9,]+\}'/'{OIDS}'/g;    # the config tables in binary_upgrade_create_empty_extension
	$dump =~ s/^\\(un)?restrict .*\n//mg;
	$dump =~ s/relfrozenxid = '\d+', relminmxid = '\d+'/relfrozenxid = XID/g;
	$dump =~ s/WHERE oid = '\d+'/WHERE oid = OID/g;    # the toast tables
	$dump =~ s/^--.*\n//mg;
	return $dump;
}
my $chained_dump = schema_dump('chained', '--binary-upgrade');
like($chained_dump, qr/CREATE FUNCTION public\.idem_claim/, 'the binary-upgrade dump writes out the member objects');
is($chained_dump, schema_dump('fresh', '--binary-upgrade'),
	'pg_dump --schema-only --binary-upgrade: the same for both');
is(schema_dump('chained'), schema_dump('fresh'), 'pg_dump --schema-only: the same for both');

# The grants of 0.2.0's update (the outbox for the readers, monitors and
# maintenance roles of idem_grant, the batch inbox for its consumers) are
# ordinary grants after the update to 0.3.0: the initial privileges of every
# member are a fresh install's, and a dump restored elsewhere gives every
# role what it had (issue 25).  Once updated straight from 0.1.0, once from
# a database that was at 0.2.0; the roles exist in the whole cluster.
my $acls_sql = q{
    SELECT coalesce(string_agg(line, E'\n' ORDER BY line), '') FROM (
        SELECT pg_describe_object(m.classid, m.objid, 0) || ' '
               || (SELECT string_agg(a::text, ',' ORDER BY a::text) FROM unnest(x.acl) a)
          FROM m JOIN (
               SELECT 'pg_class'::regclass, oid,
                      coalesce(relacl, acldefault((CASE relkind WHEN 'S' THEN 's' ELSE 'r' END)::"char", relowner))
                 FROM pg_class
               UNION ALL SELECT 'pg_proc'::regclass, oid, coalesce(proacl, acldefault('f', proowner)) FROM pg_proc
               UNION ALL SELECT 'pg_type'::regclass, oid, coalesce(typacl, acldefault('T', typowner)) FROM pg_type
               UNION ALL SELECT 'pg_namespace'::regclass, oid, coalesce(nspacl, acldefault('n', nspowner))
                 FROM pg_namespace) x(classid, objid, acl) ON x.classid = m.classid AND x.objid = m.objid
        UNION ALL
        SELECT pg_describe_object('pg_class'::regclass, a.attrelid, a.attnum) || ' '
               || (SELECT string_agg(i::text, ',' ORDER BY i::text) FROM unnest(a.attacl) i)
          FROM pg_attribute a JOIN m ON m.classid = 'pg_class'::regclass AND m.objid = a.attrelid
         WHERE a.attnum > 0 AND a.attacl IS NOT NULL) s(line)};
# The output, or the error: a role that lost a privilege fails the test
# and the test goes on.
sub psql_or_error
{
	my ($db, $sql) = @_;
	my ($ret, $out, $err) = $node->psql($db, $sql);
	return $ret == 0 ? $out : $err;
}
my $initprivs_sql = "$members SELECT coalesce(string_agg(line, E'\\n' ORDER BY line), '') FROM ($catalog{initprivs}) AS s(line)";
my $fresh_initprivs = $node->safe_psql('fresh', $initprivs_sql);
is( $node->safe_psql('fresh', qq{$members
		SELECT count(*) FROM m JOIN pg_init_privs i ON i.classoid = m.classid AND i.objoid = m.objid,
		       aclexplode(i.initprivs) a
		 WHERE a.grantee NOT IN (0, (SELECT extowner FROM pg_extension WHERE extname = 'idempotency'))}),
	'0', 'a fresh install\'s initial privileges name only the owner and PUBLIC');
$node->safe_psql('postgres', q{CREATE ROLE "Read Only" LOGIN});
for my $from ('0.1.0', '0.2.0')
{
	my $db = 'granted_' . ($from =~ s/\.//gr);
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, <<'SQL');
CREATE EXTENSION idempotency VERSION '0.1.0';
SELECT idem_grant('client', 'app'), idem_grant('consumer', 'app'), idem_grant('maintenance', 'ops'),
       idem_grant('monitor', 'ops'), idem_grant('reader', '"Read Only"');
SQL
	if ($from eq '0.2.0')
	{
		# Grants made at 0.2.0 stay ordinary grants, column privileges and
		# grant options too; a grant made onward by a role with its grant
		# option would be lost, so the update refuses until it is gone.
		$node->safe_psql($db, q{
			ALTER EXTENSION idempotency UPDATE TO '0.2.0';
			GRANT SELECT (scope, aggregateid) ON idem_outbox TO "Read Only";
			GRANT EXECUTE ON FUNCTION idem_inbox_accept_many(text, text[], interval, boolean) TO ops WITH GRANT OPTION;
			SET ROLE ops;
			GRANT EXECUTE ON FUNCTION idem_inbox_accept_many(text, text[], interval, boolean) TO dashboard});
		my (undef, undef, $refused) = $node->psql($db, 'ALTER EXTENSION idempotency UPDATE');
		like($refused, qr/ERROR:  cannot make the initial privileges of function idem_inbox_accept_many\(.*\) ordinary grants\n.*DETAIL:  Role "ops" granted privileges on it to role "dashboard"/s,
			'the update refuses while a role holds a privilege granted onward by another');
		$node->safe_psql($db, q{
			SET ROLE ops; REVOKE EXECUTE ON FUNCTION idem_inbox_accept_many(text, text[], interval, boolean) FROM dashboard});
	}
	$node->safe_psql($db, 'ALTER EXTENSION idempotency UPDATE');
	is($node->safe_psql($db, $initprivs_sql), $fresh_initprivs,
		"from $from: the initial privileges of every member are a fresh install's");

	# a dead message and a published one
	$node->safe_psql($db, q{
		SET idempotency.outbox_max_attempts = 1;
		SELECT idem_outbox_emit('orders', 'o-dead', '{}'), idem_outbox_emit('orders', 'o-done', '{}');
		CREATE TEMP TABLE batch AS SELECT * FROM idem_outbox_claim('relay', 10);
		SELECT idem_outbox_ack(ARRAY(SELECT id FROM batch WHERE aggregateid = 'o-done'), (SELECT max(token) FROM batch));
		SELECT idem_outbox_nack(id, token, '{"error": "poison"}') FROM batch WHERE aggregateid = 'o-dead'});
	my $restored = "${db}_restored";
	my $file = PostgreSQL::Test::Utils::tempdir . "/$db.dump";
	$node->command_ok([ 'pg_dump', '-Fc', '-f', $file, '-d', $node->connstr($db) ], "from $from: pg_dump -Fc");
	$node->safe_psql('postgres', "CREATE DATABASE $restored");
	$node->command_ok([ 'pg_restore', '--exit-on-error', '-d', $node->connstr($restored), $file ],
		"from $from: pg_restore into a new database");
	is($node->safe_psql($restored, "$members $acls_sql"), $node->safe_psql($db, "$members $acls_sql"),
		"from $from: after the restore every member and column has the privileges it had");
	is( psql_or_error($restored, q{
			SET ROLE app; SELECT string_agg(m, ',' ORDER BY m) FROM idem_inbox_accept_many('billing', '{m-1,m-2}') m}),
		'm-1,m-2', "from $from: the consumer calls idem_inbox_accept_many after the restore");
	is( psql_or_error($restored, q{
			SET ROLE "Read Only";
			SELECT string_agg(reason || ' ' || key, ',') FROM idem_stuck WHERE message_id IS NOT NULL}),
		'dead message o-dead', "from $from: the reader's idem_stuck lists the dead message");
	is( psql_or_error($restored, q{
			SELECT pg_sleep(1.1);
			SET ROLE ops; SET idempotency.outbox_retention = 1; SELECT idem_purge();
			RESET ROLE; SELECT string_agg(aggregateid || ' ' || status, ',') FROM idem_outbox}),
		"\n1\no-dead dead", "from $from: the maintenance role's idem_purge purges the published message");
}

# Restoring the dump of 0.1.0 into this build.  pg_dump writes CREATE
# EXTENSION without a version, so a plain restore makes 0.2.0, and the
# dump's grants on the old argument lists of idem_complete, idem_fail and
# idem_resolve fail: the roles lose them.  The README's way: create the
# extension at the dump's version first, restore, then update.
my $new_complete = 'idem_complete(text,bigint,jsonb,integer,text,jsonb)';
my $new_resolve = 'idem_resolve(text,idem_status,jsonb,integer,text,boolean,jsonb)';
my $records = $node->safe_psql('upgraded', 'SELECT count(*) FROM idempotency_records');
$node->safe_psql('postgres', 'CREATE DATABASE restored_plain');
my (undef, $restore_err) = run_command([ 'pg_restore', '-d', $node->connstr('restored_plain'), $dump_010 ]);
like($restore_err, qr/function public\.idem_complete\(text, bigint, jsonb, integer, text\) does not exist/,
	'a plain restore of the 0.1.0 dump fails to grant the old idem_complete');
is($node->safe_psql('restored_plain', qq{SELECT has_function_privilege('app', '$new_complete', 'EXECUTE')}),
	'f', 'and the client has lost it');

$node->safe_psql('postgres', 'CREATE DATABASE restored_010');
$node->safe_psql('restored_010', q{CREATE EXTENSION idempotency VERSION '0.1.0'});
$node->command_ok([ 'pg_restore', '--exit-on-error', '-d', $node->connstr('restored_010'), $dump_010 ],
	'into a database with the extension created at 0.1.0, the dump restores without an error');
$node->safe_psql('restored_010', 'ALTER EXTENSION idempotency UPDATE');
is( $node->safe_psql('restored_010', qq{
		SELECT has_function_privilege('app', '$new_complete', 'EXECUTE'),
		       has_function_privilege('ops', '$new_resolve', 'EXECUTE'),
		       (SELECT count(*) FROM idempotency_records) = $records}),
	't|t|t', 'and after the update the client and the reconciler keep the new functions, and the records are all there');

$node->stop;

# 3. the outbox after an update -----------------------------------------------------------------
my $ob = PostgreSQL::Test::Cluster->new('outbox');
$ob->init;
$ob->append_conf('postgresql.conf', "shared_preload_libraries = 'idempotency'");
$ob->start;
$ob->safe_psql('postgres', 'CREATE DATABASE outbox');
$ob->safe_psql('outbox', q{CREATE EXTENSION idempotency VERSION '0.1.0'});

# A session of 0.1.0 that has used the library (its cache of the
# extension's objects holds no outbox) and stays open across the update.
my $open = $ob->background_psql('outbox', on_error_stop => 0);
$open->query_safe(q{SET client_min_messages = error});    # not the warning of a 0.1.0 session
is($open->query_safe(q{SELECT outcome FROM idem_claim('before', idem_fingerprint('b'), '1 hour')}),
	'new', 'a session opened at 0.1.0 claims a key');
my $open_pid = $open->query_safe(q{SELECT pg_backend_pid()});
$ob->safe_psql('outbox', 'ALTER EXTENSION idempotency UPDATE');

my $counters_sql = q{SELECT counter, value FROM idem_stats() WHERE counter LIKE 'outbox\_%'};
my %counted_before = map { split /\|/ } split /\n/, $ob->safe_psql('outbox', $counters_sql);
is( $ob->safe_psql('outbox', q{
		SELECT idem_outbox_emit('orders', 'o-1', '{"n": 1}', type => 'created') IS NOT NULL;
		SELECT cardinality(idem_outbox_emit_batch('orders', '{o-2,o-3,o-4}',
		                                          ARRAY['{"n": 2}', '{"n": 3}', '{"n": 4}']::jsonb[]))}),
	"t\n3", 'after the update, idem_outbox_emit and idem_outbox_emit_batch emit');
is( $ob->safe_psql('outbox', q{
		CREATE TABLE batch AS SELECT * FROM idem_outbox_claim('relay-1', 10);
		SELECT string_agg(aggregateid, ',' ORDER BY aggregateid) || ' ' || count(DISTINCT token) FROM batch}),
	'o-1,o-2,o-3,o-4 1', 'idem_outbox_claim hands all four out under one token');
is( $ob->safe_psql('outbox', q{
		SELECT idem_outbox_ack((SELECT array_agg(id) FROM batch WHERE aggregateid IN ('o-1', 'o-2')),
		                       (SELECT max(token) FROM batch));
		SELECT idem_outbox_nack(id, token, '{"error": "refused"}', '1 hour') FROM batch WHERE aggregateid = 'o-3';
		SET idempotency.outbox_max_attempts = 1;
		SELECT idem_outbox_nack(id, token, '{"error": "poison"}') FROM batch WHERE aggregateid = 'o-4'}),
	"2\npending\ndead", 'idem_outbox_ack publishes two, idem_outbox_nack gives one back and makes the last dead');
is( $ob->safe_psql('outbox', q{
		SELECT string_agg(concat_ws(' ', reason, topic, key, outbox_status, error ->> 'error'), ',')
		  FROM idem_stuck WHERE message_id IS NOT NULL}),
	'dead message orders o-4 dead poison', 'idem_stuck lists the dead message');
is( $ob->safe_psql('outbox', q{
		SELECT idem_outbox_retry(id) FROM batch WHERE aggregateid = 'o-4';
		SELECT string_agg(aggregateid || ' ' || status || ' ' || attempts, ',' ORDER BY aggregateid)
		  FROM idem_outbox;
		SELECT count(*) FROM idem_stuck WHERE message_id IS NOT NULL}),
	"\no-1 published 1,o-2 published 1,o-3 pending 1,o-4 pending 0\n0",
	'idem_outbox_retry puts it back, and idem_stuck no longer lists it');
my %counted = map { split /\|/ } split /\n/, $ob->safe_psql('outbox', $counters_sql);
is( join(',', map { "$_ " . ($counted{$_} - ($counted_before{$_} // 0)) } sort keys %counted),
	'outbox_dead 1,outbox_emitted 4,outbox_published 2,outbox_retried 2,outbox_taken_over 0',
	'idem_stats counts them: 4 emitted, 2 published, 2 retried (the nack and the retry), 1 dead');

# The session opened before the update emits without reconnecting, and
# its records still work.
is($open->query_safe(q{SELECT idem_outbox_emit('orders', 'o-5', '{"n": 5}') IS NOT NULL}),
	't', 'the session opened before the update emits without reconnecting');
is($open->query_safe(q{SELECT cardinality(idem_outbox_emit_batch('orders', '{o-6}', ARRAY['{}'::jsonb]))}),
	'1', 'and emits a batch');
is($open->query_safe(q{SELECT idem_complete('before', 1, '{}', 200); SELECT status FROM idem_lookup('before')}),
	"\nsucceeded", 'and completes the key it claimed before the update');
is($open->query_safe(q{SELECT pg_backend_pid()}), $open_pid, 'in the same backend as before the update');
$open->quit;
is( $ob->safe_psql('outbox', q{
		SELECT string_agg(aggregateid || ' ' || status, ',' ORDER BY seq) FROM idem_outbox
		 WHERE aggregateid IN ('o-5', 'o-6')}),
	'o-5 pending,o-6 pending', 'its messages are committed, pending');

# A transaction open across the update to 0.3.0, with the extension's
# objects loaded at 0.2.0 and its locks on the records taken: a claim in it
# reads the rescaled epoch.  It must not shift it by 0.2.0's 32 bits (a
# token far ahead of the epoch, which no takeover or release can follow),
# but fail with 40001, or issue a token of the new scheme.
$ob->safe_psql('postgres', 'CREATE DATABASE span');
$ob->safe_psql('span', q{CREATE EXTENSION idempotency VERSION '0.2.0'});
$ob->safe_psql('span', q{SELECT idem_claim('gone', idem_fingerprint('g'), '1 hour');
	DELETE FROM idempotency_records});
my $span = $ob->background_psql('span', on_error_stop => 0);
$span->query_safe(q{SET client_min_messages = error});
$span->query_safe(q{SELECT 1 FROM idem_claim('before', idem_fingerprint('b'), '1 hour')});
$span->query_safe(q{BEGIN; DELETE FROM idempotency_records WHERE false});
$ob->safe_psql('span', q{ALTER EXTENSION idempotency UPDATE});
my $during = $span->query(q{SELECT token FROM idem_claim('during', idem_fingerprint('d'), '1 hour')});
my $during_err = $span->{stderr};
$span->query(q{COMMIT});
$span->quit;
my $epoch = $ob->safe_psql('span', q{SELECT last_value FROM idem_token_epoch});
ok( ($during_err =~ /changed their scheme/ && $during eq '')
	  || ($during_err eq '' && $during ne '' && ($during >> 16) == $epoch),
	"a claim in a transaction open across the update fails with 40001 or takes a token of the new scheme (got '$during', epoch $epoch, '$during_err')");
$ob->stop;
done_testing();
