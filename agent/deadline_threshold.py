"""Where the agent publishes the deadline threshold X for the submit hooks, and whether it can.

Why apart from the duty (agent.deadline): the place follows from the operator's configuration
and the probe is a startup check; neither needs the state the keeper carries between ticks.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from preemption.deadline.threshold_file import THRESHOLD_NAME
from vjob.config import Config


def threshold_path(cfg: Config, rms: str) -> Path | None:
    """Where the hook reads X: [deadline] threshold_file, else beside slurm.conf on Slurm."""
    if cfg.deadline.threshold_file:
        return Path(cfg.deadline.threshold_file)
    if rms == "slurm":
        return Path(cfg.slurm.conf or "/etc/slurm/slurm.conf").parent / THRESHOLD_NAME
    return None


def publish_problem(cfg: Config, rms: str) -> str:
    """Why the agent cannot publish X where the hooks read it ("" when it can, or when nothing
    is published): a file made and removed there, as the agent itself would (O_EXCL, no link
    followed). Why a real write and not a look at modes: the shipped unit's
    ProtectSystem=strict makes /etc read-only to the agent whatever the modes say, and admission
    then silently never refused a job. Said at startup and on every failed publication."""
    path = threshold_path(cfg, rms)
    if cfg.deadline.admission == "none" or path is None:
        return ""
    probe = path.with_name(f".{path.name}.probe.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return unwritable(path, exc)
    return ""


def unwritable(path: Path, exc: OSError) -> str:
    """What the operator is told when X cannot be written where the hooks read it."""
    return (
        f"[deadline] admission is on but the threshold file {path} cannot be written "
        f"({exc.strerror or exc}): the submit hooks accept every job. Make its directory writable "
        f"to the agent (the shipped unit: ReadWritePaths=) or set [deadline] threshold_file to a "
        f"path the hooks read"
    )


__all__ = ["publish_problem", "threshold_path", "unwritable"]
