"""Whether Slurm's `scontrol suspend` lets a job's detached process run: pause-first's drainer.

Why Slurm's own configuration decides: a suspend stops the job through its proctrack plugin.
linuxproc signals the descendants of the job's slurmstepd and pgid its process groups; a process
that left both (double fork, a session of its own: pilot.pause_drain's drainer) is not stopped,
so it saves the paused VM while the job's CPUs serve the interactive job (measured on the dev
cluster, docs/preempt-pause.md). cgroup freezes the job's whole cgroup, which a process cannot
leave by forking: the drainer would stop with the job and the save wait for the resume, so
pause-first is off there. The interactive job may only use the memory the victim still holds
if Slurm counts memory (SelectTypeParameters CR_*_Memory): else it would start on a node whose
memory the paused VM fills, so pause-first is off there too.

Read when the agent starts and again at most once a minute when a switch asks (a `scontrol
reconfigure` or a controller restart is seen by the next switch after that), as the site's
priority weights are (plugins.slurm.site_priority).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from vjob.errors import CommandError

READ_EVERY_S = 60.0
SPARING = ("proctrack/linuxproc", "proctrack/pgid")
"""The proctrack plugins whose suspend leaves a detached process running."""
_LINE = re.compile(r"^(ProctrackType|SelectTypeParameters|SelectType)\s*=\s*(.{0,200})$")
_PLUGIN = re.compile(r"[a-z_]{1,32}/[a-z0-9_]{1,32}")


def read_settings(config_text: str) -> dict[str, str]:
    """ProctrackType, SelectType and SelectTypeParameters as `scontrol show config` prints them."""
    found: dict[str, str] = {}
    for line in config_text.splitlines():
        match = _LINE.match(line.strip())
        if match:
            found[match.group(1)] = match.group(2).strip()
    return found


def spares_detached(settings: dict[str, str]) -> tuple[bool, str]:
    """Whether pause-first is safe under these settings, and why (one sentence for the log)."""
    proctrack = settings.get("ProctrackType", "")
    if not _PLUGIN.fullmatch(proctrack):
        raise CommandError(
            ["scontrol", "show", "config"], f"ProctrackType = {proctrack[:60]!r}: not a plugin name vjob reads"
        )
    if proctrack not in SPARING:
        return False, (
            f"ProctrackType={proctrack}: a suspended job is frozen whole (its cgroup), the process saving"
            " the paused VM included; pause-first needs proctrack/linuxproc or proctrack/pgid"
        )
    params = settings.get("SelectTypeParameters", "")
    if "MEMORY" not in params.upper():
        return False, (
            f"SelectTypeParameters={params or '(none)'}: Slurm does not count memory, so the interactive job"
            " could start where the paused VM still holds it; pause-first needs CR_*_Memory"
        )
    return True, f"ProctrackType={proctrack} leaves the drainer running; {params} keeps the victim's memory counted"


class ProctrackReader:
    """`scontrol show config`'s answer, read once and again when a minute old."""

    def __init__(self, run: Callable[[], str], clock: Callable[[], float] = time.monotonic) -> None:
        self.run = run
        self.clock = clock
        self._answer: tuple[bool, str] | None = None
        self._read_at = 0.0

    def spares_detached(self) -> tuple[bool, str]:
        now = self.clock()
        if self._answer is None or now - self._read_at >= READ_EVERY_S:
            self._answer = spares_detached(read_settings(self.run()))
            self._read_at = now
        return self._answer


__all__ = ["READ_EVERY_S", "SPARING", "ProctrackReader", "read_settings", "spares_detached"]
