"""Slurm's member launch: `srun` starts one member pilot on every other node of the job.

Why srun's environment carries the token: srun gives the step the caller's environment, and a
process's environment is readable by its user and root only (never a command line, which any
user of the node can read). A member names its node by `$SLURMD_NODENAME`, which slurmd sets.
One step for all the other nodes (`--relative=1`); `--kill-on-bad-exit=0`, so a member's failure
does not end the others (the leader sees a lost member and rolls the cut back); `--overlap`, so
the step shares the batch step's resources.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from plugins.member_launch import LEADER_ENV, TOKEN_ENV, Calling, Secret, Started, new_token, popen
from plugins.slurm import hostlist
from plugins.slurm.environment import ENVIRONMENT
from vjob.errors import UsageError

PASSES_ENVIRONMENT = True
"""srun passes the caller's environment: the member needs no $PYTHONPATH on its argv."""


def allocation_nodes(environ: Mapping[str, str]) -> list[str]:
    """The hostlist in $SLURM_JOB_NODELIST, expanded (empty outside a job)."""
    raw = environ.get(ENVIRONMENT.node_list, "")
    return list(hostlist.expand(raw, f"${ENVIRONMENT.node_list}")) if raw else []


def leader_secret(environ: Mapping[str, str]) -> Secret:
    return Secret(new_token())


def start(
    nodes: Sequence[str], address: str, secret: Secret, command: Sequence[str], environ: Mapping[str, str]
) -> list[Started]:
    argv = ["srun", "--ntasks-per-node=1", f"--nodes={len(nodes)}", "--relative=1", "--kill-on-bad-exit=0"]
    env = {**environ, TOKEN_ENV: secret.token, LEADER_ENV: address}
    return [Started(tuple(nodes), popen([*argv, "--overlap", *command], env=env))]


def calling(environ: Mapping[str, str], node: str, *, leader: str = "", nonce: str = "", stdin_fd: int = 0) -> Calling:
    token, address = environ.get(TOKEN_ENV, ""), environ.get(LEADER_ENV, "")
    if not token or not address:
        raise UsageError(
            f"vjob run --member: started by a multi-node job's first pilot only (${TOKEN_ENV} and ${LEADER_ENV} unset)"
        )
    return Calling(address, token, node)
