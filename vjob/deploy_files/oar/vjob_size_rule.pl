# vjob size rule: a job whose command is vjob's pilot (`vjob run ...`) is refused when the fewest
# cores its request may put on one host, times the largest `memcore` (MiB per core) of the site,
# minus the VM's overhead (@OVERHEAD@ MiB), leaves less than the guest's minimum (@GUEST_MIN@ MiB):
# no resource could give its VM enough memory (the pilot would refuse at start). Installed by
# saline_bew.size_rule; do not edit in place. It fails open: no `memcore` property, a request it
# cannot read, any error: no check. Only core Perl; $dbh is oarsub's database handle.
{
    my $vjob_size_refusal = eval {
        my $refusal = "";
        my $cmd = defined($command) ? "$command" : "";
        if ($cmd =~ m{^\s*(?:\S*/)?vjob(?:\s+--?\S+(?:\s+[^-\s]\S*)?)*\s+run\s} and $cmd !~ /\s--os[\s=]debian-tiny(?:\s|$)/) {
            # The fewest cores a host may get: the product of the counts below the host level of
            # each resource group of the first moldable alternative (1 without a host level).
            my $fewest;
            foreach my $group (@{$ref_resource_list->[0]->[0]}) {
                my ($below, $cores) = (0, 1);
                foreach my $level (@{$group->{resources}}) {
                    if ($level->{resource} =~ /^(host|network_address|nodes)$/) { $below = 1; $cores = 1; next; }
                    $cores *= $level->{value} if ($below and $level->{value} =~ /^[0-9]{1,6}$/);
                }
                $cores = 1 unless $below;
                $fewest = $cores if (not defined($fewest) or $cores < $fewest);
            }
            my $memcore;
            foreach my $value (@{$dbh->selectcol_arrayref("SELECT memcore FROM resources")}) {
                $memcore = $value if (defined($value) and $value =~ /^[0-9]{1,9}$/
                                      and (not defined($memcore) or $value > $memcore));
            }
            if (defined($fewest) and defined($memcore) and $memcore > 0) {
                my $mem = $fewest * $memcore;
                if ($mem - @OVERHEAD@ < @GUEST_MIN@) {
                    my $need = int((@GUEST_MIN@ + @OVERHEAD@ + $memcore - 1) / $memcore);
                    $refusal = "[ADMISSION RULE] vjob: $fewest core" . ($fewest == 1 ? "" : "s")
                        . " (the fewest a host of this job may get) x memcore $memcore MiB = $mem MiB leaves "
                        . ($mem - @OVERHEAD@) . " MiB for the VM after its overhead of @OVERHEAD@ MiB, below the "
                        . "guest's minimum of @GUEST_MIN@ MiB: ask for at least $need cores per host "
                        . "(e.g. -l /host=1/core=$need)\n";
                }
            }
        }
        $refusal;
    };
    die($vjob_size_refusal) if ($vjob_size_refusal);
}
