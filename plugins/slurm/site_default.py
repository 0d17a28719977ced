"""The partitions whose every job is a vjob: the file job_submit.lua reads beside itself.

Why a file beside job_submit.lua, like vjob-images.list and vjob-deadline.threshold: the Lua
runs inside slurmctld under its job lock and may only read small local files, never the
TOML, a program or the store. vjob renders `[slurm] vjob_partitions` and `allow_opt_out` into
`vjob-partitions.conf` (lines `allow_opt_out=yes|no` and `PARTITION IMAGE`), atomically, and
job_submit.lua caches it for 2 s. The agent writes it at its start (make_adapter); a missing
file marks no partition.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from plugins.slurm.environment import DEFAULT_CONF
from vjob import log

if TYPE_CHECKING:
    from plugins.slurm.config import SlurmConfig

DEFAULTS_NAME = "vjob-partitions.conf"
"""job_submit.lua's DEFAULTS_NAME: the file beside it (so beside slurm.conf)."""


def defaults_file(conf: str = "") -> Path:
    """Where job_submit.lua looks: beside slurm.conf (`[slurm] conf`, else $SLURM_CONF, else
    Slurm's default)."""
    return Path(conf or os.environ.get("SLURM_CONF") or DEFAULT_CONF).parent / DEFAULTS_NAME


def render(partitions: dict[str, str], allow_opt_out: bool) -> str:
    """The file's text (names already validated by SlurmConfig)."""
    lines = [
        "# Partitions whose every batch job runs in a VM (written by vjob from [slurm] vjob_partitions",
        "# and allow_opt_out; read by job_submit.lua). Edit the TOML, not this file.",
        f"allow_opt_out={'yes' if allow_opt_out else 'no'}",
        *(f"{part} {image}" for part, image in sorted(partitions.items())),
    ]
    return "\n".join(lines) + "\n"


def write_defaults(path: Path, text: str) -> bool:
    """Write `text` atomically, readable by SlurmUser; False when the file already held it."""
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o644)
    tmp.replace(path)
    return True


def sync_partition_defaults(config: SlurmConfig) -> Path | None:
    """Bring the file in line with `[slurm]`; the path when it was (re)written, else None.

    Written when a partition is marked or a file is there to correct, so a controller that
    marks none gets no file. A failure (an unwritable directory) is logged, never raised: the
    agent still runs, job_submit.lua keeps the old file, and the log says which.
    """
    path = defaults_file(config.conf)
    if not config.vjob_partitions and not path.exists():
        return None
    try:
        changed = write_defaults(path, render(config.vjob_partitions, config.allow_opt_out))
    except OSError as exc:
        log.get("slurm").warning("cannot write job_submit.lua's partition defaults", path=str(path), error=exc.strerror)
        return None
    if changed:
        log.get("slurm").info(
            "wrote job_submit.lua's partition defaults", path=str(path), partitions=config.vjob_partitions
        )
    return path if changed else None
