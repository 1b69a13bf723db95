# Which edition the TAP tests run against.  test/run runs them twice: with
# PATH at the server's installation (the C edition), and with IDEM_EDITION=sql
# and PATH at a tree that holds the SQL edition only (idem_sql_edition_tree in
# test/lib.sh), where there is no library to preload and no purge worker.
#
#   use FindBin;
#   use lib $FindBin::RealBin;
#   use IdemEdition;
#
# A file with a line "# idem-test: c-edition-only: REASON" skips itself under
# IDEM_EDITION=sql (test/run counts it from the same line).  Otherwise:
#   sql_edition()       true under IDEM_EDITION=sql, for the assertions that
#                       only the C edition can make (skip them there, with a
#                       reason; test/edition/README.md lists them)
#   c_edition_conf(TXT) TXT (the postgresql.conf lines that preload the library
#                       or set its purge worker) in the C edition, '' in the SQL
#                       edition
package IdemEdition;
use strict;
use warnings;
use Exporter 'import';
use Test::More;

our @EXPORT = qw(sql_edition c_edition_conf);

my $sql = ($ENV{IDEM_EDITION} // 'c') eq 'sql';

sub sql_edition { return $sql; }

sub c_edition_conf { return $sql ? '' : $_[0]; }

if ($sql)
{
	open my $fh, '<', $0 or die "IdemEdition: cannot read $0: $!";
	while (my $line = <$fh>)
	{
		plan skip_all => "c-edition-only: $1"
		  if $line =~ /^# idem-test: c-edition-only: (.*)/;
	}
	close $fh;
	# A run meant for the SQL edition on a tree that can load the C edition
	# would pass for the wrong reason.
	chomp(my $lib = `pg_config --pkglibdir`);
	chomp(my $share = `pg_config --sharedir`);
	my $control = "$share/extension/idempotency.control";
	die "IDEM_EDITION=sql: PATH's pg_config has no idempotency.control in $share/extension"
	  unless -f $control;
	die "IDEM_EDITION=sql: PATH leads to a tree of the C edition ($lib/idempotency.so, "
	  . "or module_pathname in $control); test/lib.sh's idem_sql_edition_tree makes one without"
	  if -e "$lib/idempotency.so" || `grep -c module_pathname '$control'` > 0;
}

1;
