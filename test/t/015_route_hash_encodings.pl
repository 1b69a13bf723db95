# idem_route_hash in databases whose encoding is not UTF-8: the hash is of
# the tenant's UTF-8 bytes, so a LATIN1 and an EUC_JP database route a scope
# as a UTF-8 one does (the vectors are those of sql/route_hash.sql, computed
# outside PostgreSQL).  The scopes are written with U& escapes, so the
# client's encoding plays no part.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemEdition;

my $node = PostgreSQL::Test::Cluster->new('route_hash');
$node->init;
$node->start;

my %vectors = (
	LATIN1 => [ q{U&'Z\00FCrich/orders'}, 1112631390 ],
	EUC_JP => [ q{U&'\65E5\672C'},       -819282164 ],
	UTF8   => [ q{U&'Z\00FCrich'},        1112631390 ]);
for my $encoding (sort keys %vectors)
{
	my ($scope, $expected) = @{ $vectors{$encoding} };
	my $db = lc "db_$encoding";
	$node->safe_psql('postgres',
		"CREATE DATABASE $db ENCODING '$encoding' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0");
	$node->safe_psql($db, 'CREATE EXTENSION idempotency');
	is($node->safe_psql($db, "SELECT idem_route_hash($scope)"), $expected,
		"a $encoding database hashes the tenant's UTF-8 bytes");
	is( $node->safe_psql($db,
			"SELECT ('x' || left(encode(sha256(convert_to(split_part($scope, '/', 1), 'UTF8')), 'hex'), 8))::bit(32)::int"),
		$expected, "and so does the SQL form there");
}

$node->stop;
done_testing();
