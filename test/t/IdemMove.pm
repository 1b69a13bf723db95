# The partition mover for the TAP tests: the tool `make install` installed
# (src/tools/idem_move_partition, into pg_config --bindir), checked to be the
# checkout's, so that a test never runs a stale copy.
#
#   use IdemMove;
#   my $mover = idem_mover();        # its path: run it as it is (#!/usr/bin/python3)
package IdemMove;
use strict;
use warnings;
use Exporter 'import';

our @EXPORT = qw(idem_mover);

sub idem_mover
{
	my $checkout = $ENV{IDEM_CHECKOUT};
	die "IDEM_CHECKOUT must name the checkout (test/run sets it)"
	  unless defined $checkout && -f "$checkout/src/tools/idem_move_partition";
	chomp(my $bindir = `pg_config --bindir`);
	my $installed = "$bindir/idem_move_partition";
	die "$installed is missing: make install installs it" unless -x $installed;
	system('cmp', '-s', $installed, "$checkout/src/tools/idem_move_partition") == 0
	  or die "$installed differs from the checkout's src/tools/idem_move_partition: make install";
	return $installed;
}

1;
