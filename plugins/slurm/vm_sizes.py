"""The figures job_submit.lua checks a vjob's memory against, in one small file beside it.

Why a file, and written by vjob: job_submit.lua runs inside slurmctld under its job lock, and
Slurm 22.05 hands it the partitions but not the nodes (no node's RealMemory), nor can it read
vjob.toml. So vjob writes `vjob-vm-sizes` next to slurm.conf (as it writes vjob-images.list and
the deadline threshold there), one line:

    overhead_mib=256 guest_min_mib=256 node_max_mib=4096

— `[provisioning] vm_overhead_mib`, the guest's minimum (vjob.allocation.GUEST_MIN_MEMORY_MIB)
and the largest memory (RealMemory, MiB) of any node the agent sees. The agent's adapter
rewrites it whenever it reads the nodes and a figure changed (`Publisher`, given to
SlurmAdapter by make_adapter). Without the file job_submit.lua
falls back to its built-in defaults (the same figures) and checks only the minimum: a job
above every node's memory is then refused by Slurm itself, without vjob's numbers.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from plugins.slurm.environment import DEFAULT_CONF
from vjob import log
from vjob.allocation import GUEST_MIN_MEMORY_MIB, MAX_MEMORY_MIB
from vjob.errors import InputError
from vjob.model import Node

_log = log.get("slurm")

SIZES_NAME = "vjob-vm-sizes"
"""The file beside slurm.conf (and job_submit.lua) holding the figures."""
_LINE = re.compile(r"overhead_mib=(\d{1,9}) guest_min_mib=(\d{1,9}) node_max_mib=(\d{1,12})")


@dataclass(frozen=True)
class VMSizes:
    """What a vjob's memory per node is checked against at submission."""

    overhead_mib: int
    guest_min_mib: int
    node_max_mib: int

    def __post_init__(self) -> None:
        for name, value, low in (
            ("overhead_mib", self.overhead_mib, 0),
            ("guest_min_mib", self.guest_min_mib, 1),
            ("node_max_mib", self.node_max_mib, 1),
        ):
            if not low <= value <= MAX_MEMORY_MIB:
                raise InputError(f"vm sizes: {name} = {value}: must be {low}..{MAX_MEMORY_MIB}")

    def line(self) -> str:
        return f"overhead_mib={self.overhead_mib} guest_min_mib={self.guest_min_mib} node_max_mib={self.node_max_mib}\n"


def sizes_file(conf: str | os.PathLike[str] = "") -> Path:
    """Where job_submit.lua reads the figures: beside slurm.conf (`conf`, else $SLURM_CONF,
    else Debian's /etc/slurm/slurm.conf), where slurmctld loads the script from."""
    return Path(conf or os.environ.get("SLURM_CONF") or DEFAULT_CONF).parent / SIZES_NAME


def read_sizes(path: Path) -> VMSizes | None:
    """The figures in `path`; None when it is missing or not one well-formed line."""
    try:
        text = Path(path).read_text()[:256]
    except OSError:
        return None
    m = _LINE.fullmatch(text.strip())
    if not m:
        return None
    try:
        return VMSizes(int(m.group(1)), int(m.group(2)), int(m.group(3)))
    except InputError:
        return None


def write_sizes(path: Path, sizes: VMSizes) -> bool:
    """Write `sizes` to `path` atomically (mode 0644: slurmctld's user reads it) unless it
    already holds them; True when written. A symbolic link at `path` is replaced, not followed."""
    path = Path(path)
    if read_sizes(path) == sizes:
        return False
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(sizes.line())
        os.chmod(tmp, 0o644)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return True


def site_sizes(overhead_mib: int, guest_min_mib: int, node_memories_mib: Iterable[int]) -> VMSizes | None:
    """The figures for nodes of these memories (MiB); None without a node to size against."""
    known = [m for m in node_memories_mib if m > 0]
    if not known:
        return None
    return VMSizes(overhead_mib, guest_min_mib, max(known))


class Publisher:
    """Keeps the file in line with the nodes the adapter sees (SlurmAdapter's `on_nodes`):
    rewritten only when a figure changes; a failure (the directory not writable by the agent) is
    logged once per distinct error (a warning for root, the agent; debug for a user's command),
    never raised — the agent still runs, job_submit.lua keeps the old figures or its defaults."""

    def __init__(self, path: Path, overhead_mib: int, guest_min_mib: int = GUEST_MIN_MEMORY_MIB) -> None:
        self.path = Path(path)
        self.overhead_mib = overhead_mib
        self.guest_min_mib = guest_min_mib
        self._last_error = ""

    def __call__(self, nodes: Iterable[Node]) -> None:
        sizes = site_sizes(self.overhead_mib, self.guest_min_mib, (n.memory_mb for n in nodes))
        if sizes is None:
            return
        try:
            if write_sizes(self.path, sizes):
                _log.info("wrote job_submit.lua's VM sizes", path=str(self.path), **asdict(sizes))
            self._last_error = ""
        except OSError as exc:
            if exc.strerror != self._last_error:
                self._last_error = exc.strerror or str(exc)
                # The agent (root) must be able to; a user's `vjob status` reading the nodes need not.
                say = _log.warning if os.geteuid() == 0 else _log.debug
                say("cannot write job_submit.lua's VM sizes", path=str(self.path), error=self._last_error)


__all__ = ["SIZES_NAME", "Publisher", "VMSizes", "read_sizes", "site_sizes", "sizes_file", "write_sizes"]
