"""How a multi-node job's leader pilot starts its member pilots: the RMS's launcher, picked by
name, and the member's command line (docs/multinode.md, "Per-node pilots").

Why the launch itself is in plugins/<rms>/member_launch.py: each RMS has its own per-node
launcher (Slurm `srun`, OAR `oarsh`, PBS `pbsdsh`) that carries a different part of the
caller's world (plugins.member_launch). The pilot knows only what is the same under every RMS:
the member is this package's `vjob run --member`, started by this interpreter.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import cast

from plugins.member_launch import MemberLauncher
from vjob.errors import UsageError

LAUNCHERS = {
    "slurm": "plugins.slurm.member_launch",
    "oar": "plugins.oar.member_launch",
    "pbs": "plugins.pbs.member_launch",
}
"""RMS → the module of its per-node launcher (imported only for the job's RMS, as
plugins.rms_package imports only the RMS's adapter); `per-node` under another is refused."""


def launcher(rms: str) -> MemberLauncher:
    """The member launcher of `rms`; a UsageError names the RMSs that have one."""
    if rms not in LAUNCHERS:
        raise UsageError(
            f'[agent] multinode_pilots = "per-node": no per-node launcher for rms {rms!r} '
            f'(built: {", ".join(LAUNCHERS)}); use multinode_pilots = "leader"'
        )
    return cast(MemberLauncher, importlib.import_module(LAUNCHERS[rms]))


def member_command(rms: str, config: str | None) -> list[str]:
    """The member's argv: the leader's own interpreter (its venv) and, where the launcher does
    not pass the environment (oarsh, pbsdsh), its $PYTHONPATH, then this package's CLI."""
    path = os.environ.get("PYTHONPATH", "")
    argv = ["env", f"PYTHONPATH={path}"] if path and not launcher(rms).PASSES_ENVIRONMENT else []
    argv += [sys.executable, "-m", "vjob.cli"]
    if config:  # oarsh and pbsdsh do not pass $VJOB_CONFIG
        argv += ["--config", config]
    return [*argv, "run", "--member", "--rms", rms]
