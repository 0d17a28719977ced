"""Per-node pilots of a multi-node job (`[agent] multinode_pilots = "per-node"`, docs/multinode.md).

The leader (rank 0's pilot, `leader`) starts one member pilot (`member`) per other node by its
RMS's own launcher (`launch`, which picks the plugins/<rms>/member_launch.py of the job's RMS),
and drives each member's VM over an authenticated TCP connection (`link`); `workdir` tells
whether a member sees the leader's working directory.
"""
