# vjob deadline rule: refuse `oarsub -t deadline=DATE` when the job cannot be expected to meet
# its deadline in a vjob VM: x = (walltime x slowdown - time to deadline) / (walltime x slowdown)
# at or over the X the vjob agent publishes in @THRESHOLD@ (docs/deadline.md).
# Installed by `vjob oar install-deadline-rule`, removed by `vjob oar uninstall-deadline-rule`;
# do not edit in place. It fails open: a missing, unreadable, malformed, stale (older than the
# file's own stale=) or future-dated file, a read taking over @READ_TIMEOUT@ s, or any error here, means
# no check: the job is accepted.
# The deadline is OAR's own job type (deadline=YYYY-MM-DD[ HH:MM[:SS]], local time, read as OAR's
# scheduler reads it); the walltime is the smallest of the moldable alternatives (the default
# walltime rule has run before this one). Core Perl only: it runs inside oarsub, as uid oar.
{
    my $vjob_refusal = eval {
        # Bounded: oarsub waits for its rules, and the file could be a FIFO or on a hung mount.
        local $SIG{ALRM} = sub { die("the threshold file was not read within @READ_TIMEOUT@ s\n"); };
        alarm(@READ_TIMEOUT@);
        my $vjob_deadline;
        foreach my $t (@{$type_list}) {
            if ($t =~ /^deadline=(\d\d\d\d-\d\d-\d\d(?:\s+\d\d:\d\d(?::\d\d)?)?)$/) { $vjob_deadline = $1; }
        }
        my $vjob_wall;
        foreach my $mold (@{$ref_resource_list}) {
            my $w = $mold->[1];
            next unless (defined($w) and $w =~ /^[0-9]{1,9}$/ and $w > 0);
            $vjob_wall = $w if (not defined($vjob_wall) or $w < $vjob_wall);
        }
        my $vjob_line;
        if (defined($vjob_deadline) and defined($vjob_wall) and open(my $fh, '<', '@THRESHOLD@')) {
            my $n = read($fh, $vjob_line, 257);
            close($fh);
            $vjob_line = undef unless (defined($n) and $n <= 256);
        }
        my $result;
        if (defined($vjob_line) and $vjob_line =~
                /\Ax=(-?\d{1,3}(?:\.\d{1,9})?) slowdown=(\d{1,3}(?:\.\d{1,9})?) at=(\d{1,12})(?: stale=(\d{1,5}))?\n?\z/) {
            my ($X, $slow, $at) = (0 + $1, 0 + $2, 0 + $3);
            my $stale = defined($4) ? 0 + $4 : @DEFAULT_STALE@;
            my $now = time();
            if ($slow > 0 and $stale >= 1 and $stale <= @MAX_STALE@ and $now - $at <= $stale and $at - $now <= 60) {
                my $left = OAR::IO::sql_to_local($vjob_deadline) - $now;
                my $remaining = $vjob_wall * $slow;
                my $x = ($remaining - $left) / $remaining;
                if ($x >= $X) {
                    $result = sprintf("vjob: refused: the job cannot be expected to meet its deadline: x = %.2f >= X = %.2f "
                        . "(time limit %d min x VM slowdown %.2f = %.0f min to run, deadline in %.0f min); "
                        . "ask for a later deadline or a shorter time limit",
                        $x, $X, int($vjob_wall / 60), $slow, $remaining / 60, $left / 60);
                }
            }
        }
        alarm(0);
        $result;
    };
    alarm(0);
    if ($@) {
        my $why = $@;
        chomp($why);
        $why =~ s/[^ -~]+/ /g;
        print("[ADMISSION RULE] vjob: deadline check skipped (" . substr($why, 0, 200) . "); job accepted\n");
    } elsif (defined($vjob_refusal)) {
        die("[ADMISSION RULE] $vjob_refusal\n");
    }
}
