"""What a job's VMs use on this node, as the kernel counts it: each QEMU process's CPU seconds
(utime + stime of /proc/PID/stat) and its peak resident memory (VmHWM of /proc/PID/status).

Why the kernel's figures and not libvirt's: the root side must not believe the job's user, and
with a user's own libvirt (qemu:///session) everything libvirt says comes from a daemon that
user runs. /proc is written by the kernel alone.

Which processes are the job's — what a hostile user can and cannot falsify:

* Only processes whose real uid is one of `uids` count (the job's user, plus the system QEMU
  user when root's libvirt runs the job's VMs). The uid is the kernel's; a user cannot make a
  process of another uid, so one user can never put their processes on another's job, nor take
  another's off it.
* Of those, a process counts when its command line names one of the job's VM names (QEMU's
  `-name guest=<name>,...`; the names derive from the job id alone, vjob.pilot_files.vm_names),
  or when it holds one of the job's tap devices (a /dev/net/tun descriptor whose fdinfo says
  `iff: <tap>`; root makes the taps, named for the job, so the descriptor is proof the process
  is that job's VM).
* A user can inflate their own job's figures (run any process named after their own VM): that
  only charges themselves. A user can also hide usage — a QEMU of their own libvirt may be any
  program, under any name — but no more than they could already hide from the RMS: a user's
  libvirt, or a `setsid` child with proctrack/linuxproc, runs outside the job's step anyway.
  These figures are accounting for honest use, not an enforcement boundary (enforcing the
  allocation on the VMs is a cgroup's job: root's libvirt puts each VM in its own scope).

A process is identified by its pid and its start time (field 22 of its stat), so a pid reused
by another process is a new process, never the old one's continuation.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from vjob.usage_record import Usage

TICKS = os.sysconf("SC_CLK_TCK")
MAX_CMDLINE = 65536
"""Bytes of a command line read; QEMU's is a few KiB."""
MAX_FDS = 4096
"""Descriptors looked at per process for a tap (QEMU holds a few dozen)."""


@dataclass(frozen=True)
class Figures:
    """One process's counters at one moment."""

    pid: int
    start: int
    """Start time in clock ticks after boot: with the pid, the process's identity."""
    cpu_s: float
    hwm_kib: int


def _stat(base: Path) -> tuple[float, int] | None:
    """(utime + stime in seconds, start time in ticks) of a process, None when it is gone."""
    try:
        rest = (base / "stat").read_text().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / TICKS, int(rest[19])
    except (OSError, IndexError, ValueError):
        return None


def _status(base: Path) -> tuple[int, int] | None:
    """(real uid, VmHWM in KiB; 0 for a process without memory, a kernel thread) of a process."""
    uid, hwm = -1, 0
    try:
        for line in (base / "status").read_text().splitlines():
            if line.startswith("Uid:"):
                uid = int(line.split()[1])
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return (uid, hwm) if uid >= 0 else None


def names_vm(cmdline: bytes, names: frozenset[str]) -> bool:
    """Whether a command line (NUL-separated) is a QEMU's `-name` for one of `names`: the
    argument after `-name` is `guest=<name>[,...]` or `<name>[,...]`."""
    args = cmdline.split(b"\0")
    for i, arg in enumerate(args[:-1]):
        if arg == b"-name":
            first = args[i + 1].split(b",", 1)[0].decode(errors="replace")
            if first.removeprefix("guest=") in names:
                return True
    return False


def holds_tap(base: Path, taps: frozenset[str]) -> bool:
    """Whether a process holds a /dev/net/tun descriptor attached to one of `taps`."""
    try:
        fds = sorted(os.listdir(base / "fd"), key=lambda s: int(s) if s.isdigit() else 0)[:MAX_FDS]
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(base / "fd" / fd) != "/dev/net/tun":
                continue
            for line in (base / "fdinfo" / fd).read_text().splitlines():
                if line.startswith("iff:") and line.split(None, 1)[-1].strip() in taps:
                    return True
        except OSError:
            continue
    return False


def job_processes(
    uids: Iterable[int], names: Iterable[str], taps: Iterable[str] = (), proc: Path = Path("/proc")
) -> list[Figures]:
    """The counters of every process of `uids` that names one of `names` or holds one of `taps`."""
    allowed, wanted, tap_set = frozenset(uids), frozenset(names), frozenset(taps)
    found: list[Figures] = []
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        base = Path(entry.path)
        status = _status(base)
        if status is None or status[0] not in allowed:
            continue
        try:
            with (base / "cmdline").open("rb") as fh:
                cmdline = fh.read(MAX_CMDLINE)
        except OSError:
            continue
        if not (names_vm(cmdline, wanted) or (tap_set and holds_tap(base, tap_set))):
            continue
        stat = _stat(base)
        if stat is not None:
            found.append(Figures(int(entry.name), stat[1], stat[0], status[1]))
    return found


@dataclass
class _Seen:
    cpu_s: float
    hwm_kib: int
    accounted_s: float
    """CPU seconds of this process already handed out by `take` (or before the meter saw it)."""


@dataclass
class JobMeter:
    """The VMs of one job on this node, sampled while it runs; `take` hands out one run's usage.

    A process that started after the meter counts from zero (its whole life is this job's
    VM, boot included); one already running when first seen (a VM adopted from a pilot that
    was killed, when the meter is new) counts from that first sight: never twice, at worst less.
    """

    uids: frozenset[int]
    names: frozenset[str]
    taps: frozenset[str] = frozenset()
    proc: Path = Path("/proc")
    since_ticks: int = field(default_factory=lambda: boot_ticks_now())
    seen: dict[tuple[int, int], _Seen] = field(default_factory=dict)
    peak_kib: int = 0
    last_count: int = 0
    idle_samples: int = 0
    processes_seen: int = 0
    """Distinct processes of the job seen since the last take (0: the run measured nothing)."""

    def sample(self) -> int:
        """Read the job's processes now; how many there are."""
        found = job_processes(self.uids, self.names, self.taps, self.proc)
        for f in found:
            key = (f.pid, f.start)
            old = self.seen.get(key)
            if old is None:
                base = 0.0 if f.start >= self.since_ticks else f.cpu_s
                self.seen[key] = _Seen(f.cpu_s, f.hwm_kib, base)
                self.processes_seen += 1
            else:
                old.cpu_s, old.hwm_kib = max(old.cpu_s, f.cpu_s), max(old.hwm_kib, f.hwm_kib)
        self.peak_kib = max(self.peak_kib, sum(f.hwm_kib for f in found))
        self.last_count = len(found)
        self.idle_samples = 0 if found else self.idle_samples + 1
        return len(found)

    def take(self) -> Usage:
        """The usage since the last take (one run): CPU not yet handed out, the run's peak.
        Processes that have ended are forgotten once handed out."""
        cpu = sum(max(0.0, s.cpu_s - s.accounted_s) for s in self.seen.values())
        peak = max([self.peak_kib, *(s.hwm_kib for s in self.seen.values())])
        for s in self.seen.values():
            s.accounted_s = s.cpu_s
        alive = {k for k in self.seen if _alive(self.proc, *k)}
        self.seen = {k: v for k, v in self.seen.items() if k in alive}
        self.peak_kib = 0
        self.processes_seen = sum(1 for _ in self.seen)  # the ones still running belong to the next run too
        return Usage(cpu_s=round(cpu, 2), peak_mib=(peak + 1023) // 1024, runs=1)


def _alive(proc: Path, pid: int, start: int) -> bool:
    """Whether process `pid` still runs and is the one that started at `start`."""
    stat = _stat(proc / str(pid))
    return stat is not None and stat[1] == start


def boot_ticks_now() -> int:
    """Now, in clock ticks after boot (the unit of a process's start time)."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * TICKS)
