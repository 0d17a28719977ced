"""What the RMS gave a job on one node: its CPUs and, where the RMS says, its memory.

Why a record of its own in the kernel: every RMS states a job's size differently (Slurm's
SLURM_CPUS_ON_NODE and SLURM_MEM_PER_*, PBS's NCPUS and PBS_RESC_MEM, OAR's node file), and
each plugins/<rms>/allocation.py reads its own; the pilot only needs the two numbers per node to
size the job's VMs (pilot.sizing). The readers share the checks here, so that a hostile or
garbled value (huge, negative, not a number) is refused with the variable's name and value
rather than reaching libvirt as a VM of a million vCPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

from vjob.errors import InputError

MAX_CPUS = 4096
"""More CPUs than any node has: a larger figure is a garbled variable, not an allocation."""
MAX_MEMORY_MIB = 1 << 26
"""64 TiB in MiB: more than any node's memory."""
GUEST_MIN_MEMORY_MIB = 256
"""The least a real image's guest boots with (a Debian guest with Python): the pilot, the
submit hooks and job_submit.lua's size file all refuse a job leaving its VM less."""


@dataclass(frozen=True)
class Allocation:
    """The job's share of one node: `cpus` CPUs, `memory_mib` MiB (None: the RMS did not say)."""

    cpus: int
    memory_mib: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.cpus <= MAX_CPUS:
            raise InputError(f"allocation cpus = {self.cpus}: must be 1..{MAX_CPUS}")
        if self.memory_mib is not None and not 1 <= self.memory_mib <= MAX_MEMORY_MIB:
            raise InputError(f"allocation memory = {self.memory_mib} MiB: must be 1..{MAX_MEMORY_MIB}")


def count(var: str, raw: str, *, maximum: int) -> int:
    """A positive decimal integer from the variable `var`, at most `maximum`; refused otherwise."""
    text = raw.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 20:
        raise InputError(f"${var} = {raw[:40]!r}: not a positive whole number")
    value = int(text)
    if not 1 <= value <= maximum:
        raise InputError(f"${var} = {raw[:40]!r}: must be 1..{maximum}")
    return value


def cpus(var: str, raw: str) -> int:
    """A CPU count read from `var`."""
    return count(var, raw, maximum=MAX_CPUS)


def memory_mib(var: str, raw: str, *, unit_bytes: int = 2**20) -> int:
    """A memory figure from `var` given in units of `unit_bytes`, as whole MiB (rounded down)."""
    value = count(var, raw, maximum=MAX_MEMORY_MIB * (2**20 // unit_bytes if unit_bytes < 2**20 else 1))
    mib = value * unit_bytes // 2**20
    if not 1 <= mib <= MAX_MEMORY_MIB:
        raise InputError(f"${var} = {raw[:40]!r}: {mib} MiB, must be 1..{MAX_MEMORY_MIB} MiB")
    return mib
