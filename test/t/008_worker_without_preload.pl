# idem-test: c-edition-only: the C library's log line when idempotency.databases is set without preloading; the SQL edition has no library and no worker
# Without shared_preload_libraries, idempotency.databases set: the sessions
# that load the library do not each write to the server log that no purge
# worker runs (the line is at DEBUG1; there is no shared memory to say it
# once per server).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemEdition;

my $node = PostgreSQL::Test::Cluster->new('nopreload');
$node->init;
$node->append_conf('postgresql.conf', "idempotency.databases = 'postgres'");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

my $line = qr/idempotency.databases is set, but no purge worker runs/;
my $offset = -s $node->logfile;
$node->safe_psql('postgres', 'SELECT idem_purge(10, 1)') for 1 .. 3;
my $n = () = slurp_file($node->logfile, $offset) =~ /$line/g;
is($n, 0, 'sessions that load the library log nothing at the default log level');

$node->append_conf('postgresql.conf', 'log_min_messages = debug1');
$node->reload;
$offset = -s $node->logfile;
$node->safe_psql('postgres', 'SELECT idem_purge(10, 1)');
ok($node->log_contains(qr/DEBUG:  $line/, $offset), 'the line is there at DEBUG1');

$node->stop('fast');
done_testing();
