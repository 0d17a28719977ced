"""How long a VM's save (or a move, which is a save, a copy and a restore) may take: the one
rule every timeout a save must meet is derived from.

Why one place: a save writes the guest's memory, so its time grows with the VM, and issue 33
sizes VMs to the job's allocation — a 64 GiB guest is an ordinary job now. Before, the agent's
wait scaled with the memory but libvirt's call under it gave up after a flat 300 s, so a 64 GiB
save at 5 s/GiB (320 s) was aborted half written; and nothing told the operator how long Slurm's
KillWait must be for the pilot to save on SIGTERM. Every such figure is now `floor + rate × GiB`
with the rate below:
- the agent's wait for a victim's save (`[agent] checkpoint_timeout_s` + `checkpoint_timeout_per_gib_s`
  per GiB, capped: vjob.config.site.AgentConfig.checkpoint_timeout_for);
- libvirt's save, restore and migrate calls and the copies of a state (`[provisioning]
  operation_timeout_s` + BUDGET_S_PER_GIB per GiB: ProvisioningConfig.operation_timeout_for);
- the KillWait (and PBS kill_delay) an operator sets for the largest VM (killwait_s, docs/slurm.md).
"""

from __future__ import annotations

import math

SAVE_S_PER_GIB = 5.0
"""A save's time per GiB of guest memory, measured (docs/provisioning.md, bench/checkpoint.py):
5.1 s/GiB for one VM and 4.3 for four at low load, 8.0 and 6.6 under load, on a local disk."""
MARGIN = 2.0
"""Every budget allows twice the measured rate: a loaded node or a slower disk must not turn a
save that would finish into one aborted half written."""
BUDGET_S_PER_GIB = MARGIN * SAVE_S_PER_GIB
"""Seconds a timeout allows per GiB of the VM: 10 s/GiB."""
KILLWAIT_FLOOR_S = 10.0
"""What a SIGTERMed pilot needs besides writing the memory: pausing, the manifest, exiting."""


def gib(memory_mib: float) -> float:
    """`memory_mib` in GiB (a negative or missing figure counts as none)."""
    return max(0.0, float(memory_mib or 0)) / 1024


def budget_s(
    memory_mib: float, floor_s: float, *, per_gib_s: float = BUDGET_S_PER_GIB, cap_s: float = math.inf
) -> float:
    """How long to allow for the save of a VM of `memory_mib` MiB: `floor_s` plus `per_gib_s`
    per GiB, at most `cap_s`."""
    return min(cap_s, floor_s + per_gib_s * gib(memory_mib))


def expected_save_s(memory_mib: float) -> float:
    """What a save of this VM is expected to take at the measured rate (no margin)."""
    return SAVE_S_PER_GIB * gib(memory_mib)


def killwait_s(memory_mib: float, vms_per_node: int = 1) -> int:
    """The least KillWait (whole seconds) under which a pilot SIGTERMed by the RMS still saves
    `vms_per_node` VMs of `memory_mib` MiB each on one node: their saves with the margin, plus
    KILLWAIT_FLOOR_S. Slurm's default of 30 s holds a 1 GiB guest; a 64 GiB one needs 650 s."""
    return math.ceil(budget_s(memory_mib * max(1, vms_per_node), KILLWAIT_FLOOR_S))


__all__ = ["BUDGET_S_PER_GIB", "MARGIN", "SAVE_S_PER_GIB", "budget_s", "expected_save_s", "gib", "killwait_s"]
