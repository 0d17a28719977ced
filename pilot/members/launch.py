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


def pilots_mode(configured: str, euid: int) -> str:
    """How a multi-node job's VMs are driven: `[agent] multinode_pilots` for a root pilot, always
    "per-node" for a pilot that is not root.

    Why a user's job has no choice: its pilot drives its user's own libvirt, qemu:///session,
    which exists on its node only and is reachable by no other node (a Unix socket in the
    user's runtime directory there). The first node's pilot cannot reach the session libvirt of
    another node, so in the leader mode every VM of the job would land on the first node and the
    other nodes of the allocation would stay idle. Each member pilot drives its own node's.
    (On the dev cluster every node is this one machine, so every node's session libvirt is the
    user's one session libvirtd: the per-node mode is what a real site needs, not what this
    machine could tell apart.)"""
    return configured if euid == 0 else "per-node"


def check_user_network(euid: int, node_service: bool) -> None:
    """An ordinary user's multi-node job needs the site's node service: its VMs' taps on the job's
    network are made there (a user's libvirt can make no bridge); refused before anything starts."""
    if euid != 0 and not node_service:
        raise UsageError(
            "a multi-node vjob of an ordinary user needs the node service for its job network, and "
            "[node] socket is unset in the site's configuration (docs/multinode.md, \"An ordinary "
            "user's multi-node job\"): ask the site's operator"
        )


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
