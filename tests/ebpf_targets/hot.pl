# A target for tests/ebpf_runtimes.rs: two hot subs at a 2:1 CPU split, run by
# Perl as it is (the receiver walks the interpreter's context stacks; no flag
# or module). Each round's length is random (1 to 8 units, the same for both
# subs). The subs are called from a method of a package, itself called from a
# sub called by the file's own code, so a stack reads
# main::RUNTIME -> main::main -> Runner::run -> main::proflow_hot_two.
# Usage: perl hot.pl SECONDS. Prints "ready PID" when it starts spinning and
# "rounds N" when it ends.
use strict;
use warnings;
use Time::HiRes qw(time);

use constant N => 20000;

sub proflow_hot_two {
    my ($k) = @_;
    my $s = 0;
    my $n = 2 * $k * N;
    for (my $i = 0; $i < $n; $i++) {
        $s += $i;
    }
    return $s;
}

sub proflow_hot_one {
    my ($k) = @_;
    my $s = 0;
    my $n = $k * N;
    for (my $i = 0; $i < $n; $i++) {
        $s += $i;
    }
    return $s;
}

package Runner;

sub new { return bless {}, shift }

sub run {
    my ($self, $seconds) = @_;
    my $end = time() + $seconds;
    my $rounds = 0;
    while (time() < $end) {
        my $k = 1 + int(rand(8));
        main::proflow_hot_two($k);
        main::proflow_hot_one($k);
        $rounds++;
    }
    return $rounds;
}

package main;

sub main {
    my $seconds = @ARGV ? $ARGV[0] : 30;
    $| = 1;
    print "ready $$\n";
    my $rounds = Runner->new->run($seconds);
    print "rounds $rounds\n";
}

main();
