# vjob admission rule: `oarsub -t besteffort -t vjob=IMAGE [-t vjob_vms=N] COMMAND` becomes a
# Saline best-effort vjob (COMMAND runs in VMs that survive OAR's kills). Installed by
# `vjob oar install-rules`, removed by `vjob oar uninstall-rules`; do not edit in place.
# It fails open: if Saline cannot take the job (no manager, store down, a bad word, no answer
# within @TIMEOUT@ s), the job is accepted as a plain best-effort job, with a message. A
# `-t vjob=IMAGE` without `-t besteffort` is refused with the reason (it does not need vjob up).
# Site default ("@DEFAULT_IMAGE@", empty: none): a best-effort job naming no image gets it;
# `-t vjob=off` opts out where allowed (@ALLOW_OPT_OUT@) and is refused, saying so, where not.
# Only core Perl modules (IO::Socket::UNIX, JSON::PP): it runs inside oarsub, as uid oar.
{
    my ($vjob_image, $vjob_vms);
    my @vjob_types;
    foreach my $t (@{$type_list}) {
        if ($t =~ /^vjob=(.*)$/s) { $vjob_image = $1; }
        elsif ($t =~ /^vjob_vms=(.*)$/s) { $vjob_vms = $1; }
        else { push(@vjob_types, $t); }
    }
    if (defined($vjob_image) and $vjob_image eq "off") {
        @{$type_list} = @vjob_types;
        if ("@DEFAULT_IMAGE@" ne "" and "@ALLOW_OPT_OUT@" ne "yes") {
            die("[ADMISSION RULE] vjob: refused: every best-effort job here runs in a VM (image @DEFAULT_IMAGE@) and "
                . "this site does not let a job opt out: drop -t vjob=off\n");
        }
        undef $vjob_image;
    } elsif (not defined($vjob_image) and "@DEFAULT_IMAGE@" ne "" and grep(/^besteffort$/, @{$type_list})) {
        $vjob_image = "@DEFAULT_IMAGE@";
    }
    if (defined($vjob_image)) {
        # OAR's type check (rule "Check if job types are valid") does not know vjob's types.
        @{$type_list} = @vjob_types;
        if (not grep(/^besteffort$/, @{$type_list})) {
            # Refused rather than run on the bare nodes: the user asked for an image and a job
            # that survives preemption; neither would hold. Not a vjob failure: nothing to fail open.
            die("[ADMISSION RULE] vjob: refused: -t vjob=IMAGE needs -t besteffort (on OAR a vjob is a best-effort "
                . "job run in VMs that survive OAR's kills; see docs/saline.md). Add -t besteffort, or drop -t vjob=... "
                . "to run on the nodes themselves.\n");
        } elsif ($jobType eq "INTERACTIVE" or $reservationField ne "None") {
            print("[ADMISSION RULE] vjob: an interactive job or a reservation cannot be a vjob; job accepted as a plain OAR job\n");
        } else {
            my $vjob_answer;
            my $vjob_ok = eval {
                local $SIG{ALRM} = sub { die("no answer within @TIMEOUT@ s\n"); };
                local $SIG{PIPE} = 'IGNORE';
                alarm(@TIMEOUT@);
                require IO::Socket::UNIX;
                require JSON::PP;
                my $vms = defined($vjob_vms) ? $vjob_vms : "1";
                die("-t vjob_vms=$vms: not a number\n") unless ($vms =~ /^[0-9]{1,3}$/);
                my $wall = $ref_resource_list->[0]->[1];
                $wall = 0 unless (defined($wall) and $wall =~ /^[0-9]{1,9}$/);
                my $sock = IO::Socket::UNIX->new(Type => IO::Socket::UNIX::SOCK_STREAM(), Peer => '@SOCKET@')
                    or die("no Saline manager at @SOCKET@ ($!)\n");
                my $json = JSON::PP->new->ascii->canonical;
                print $sock $json->encode({op => "admit", site => "@SITE@", user => "$user", image => "$vjob_image",
                                           vms => 0 + $vms, walltime_s => 0 + $wall, command => "$command"}) . "\n";
                my $line = <$sock>;
                close($sock);
                alarm(0);
                die("the Saline manager closed the connection\n") unless defined($line);
                my $reply = $json->decode($line);
                die("Saline refused it: " . substr("$reply->{error}", 0, 300) . "\n") unless ($reply->{ok});
                $vjob_answer = $reply->{result};
                die("the Saline manager gave a bad answer\n") unless (ref($vjob_answer) eq "HASH"
                    and $vjob_answer->{key} =~ /^be[0-9a-f]{10}$/
                    and $vjob_answer->{resources} =~ /^[0-9]{1,4}$/
                    and $vjob_answer->{checkpoint} =~ /^[0-9]{1,6}$/ and $vjob_answer->{signal} =~ /^[0-9]{1,2}$/
                    and $vjob_answer->{command} =~ m{^/bin/sh /[A-Za-z0-9_./-]+ be[0-9a-f]{10}( /[A-Za-z0-9_./-]+ /[A-Za-z0-9_./-]+ stage)?$}
                    and $vjob_answer->{properties} =~ /^[A-Za-z0-9_=<>!' ().,-]{0,1024}$/);
                1;
            };
            alarm(0);
            if ($vjob_ok) {
                my $key = $vjob_answer->{key};
                $job_name = $key;
                $command = $vjob_answer->{command};
                $checkpoint = 0 + $vjob_answer->{checkpoint};
                $checkpoint_signal = 0 + $vjob_answer->{signal};
                my $wall = $ref_resource_list->[0]->[1];
                $ref_resource_list = [[[{resources => [{resource => "resource_id", value => $vjob_answer->{resources}}],
                                         property => undef}], $wall]];
                my $props = $vjob_answer->{properties};
                if ($props ne "") {
                    $jobproperties = ($jobproperties ne "") ? "($jobproperties) AND ($props)" : $props;
                }
                print("[ADMISSION RULE] vjob: best-effort vjob $key (Saline resumes it after a kill: vjob besteffort show $key)\n");
            } else {
                my $why = $@ || "unknown error\n";
                chomp($why);
                $why =~ s/[^ -~]+/ /g;
                print("[ADMISSION RULE] vjob: Saline did not take the job ($why); job accepted as a plain best-effort job\n");
            }
        }
    }
}
