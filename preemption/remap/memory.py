"""The memory a vjob VM gets from the node kind it runs on (pure): balloon targets after moves.

Why: the memory model moves a thrashing job at once to a node kind with more memory per slot,
but a VM only has more memory there if its balloon is let out. A domain is defined with a
ceiling (`<memory>`, `domain_max_mib`: the largest kind's memory per slot of the farm, at most
MAX_GROWTH times and never less than what the job asked) and boots with what its job asked (`<currentMemory>`); after
every completed move the agent sets the balloon to the destination kind's memory per slot,
bounded by that ceiling and never below what the job asked (`balloon_target_mib`). A slot is
a node in the agent (one vjob VM per node, as `decide_swaps` counts it). The farm file gives
memory in MB and libvirt in MiB: the farm's figure is taken as MiB (a node's "4096").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from preemption.remap.live import Move, Placement
from preemption.remap.models import SubCluster


@dataclass(frozen=True, slots=True)
class MemoryTarget:
    """What one VM should get on the node a move put it on (before the domain's ceiling)."""

    job: str
    vm: str
    node: str
    kind: str | None
    """The destination's node kind; None when the node is of no known kind (then: what it asked)."""
    want_mib: int
    asked_mib: int


MAX_GROWTH = 4
"""A ceiling at most this many times what the job asked. The guest boots seeing its whole
ceiling before its balloon driver takes the excess back: on real QEMU a 128 MiB counter guest
boots under a 512 MiB ceiling (MemTotal 85 instead of 92 MiB) but panics out of memory under
2048 MiB (bench/remap_memory.py)."""


def domain_max_mib(asked_mib: int, farm: Mapping[str, SubCluster]) -> int:
    """The ceiling a remappable vjob domain is defined with: the most any node kind gives a slot,
    at most MAX_GROWTH × and at least what the job asked. No farm (remapping off): what it asked."""
    return max(asked_mib, min(MAX_GROWTH * asked_mib, max((sc.memory_mb_per_node for sc in farm.values()), default=0)))


def balloon_target_mib(want_mib: int, asked_mib: int, max_mib: int) -> int:
    """The balloon target: the kind's memory per slot, never below what the job asked, never above
    the domain's ceiling (libvirt refuses it: the guest cannot grow past its definition)."""
    return min(max_mib, max(asked_mib, want_mib))


def targets_after(
    moves: Iterable[Move],
    placements: Iterable[Placement],
    node_sc: Mapping[str, str],
    farm: Mapping[str, SubCluster],
) -> list[MemoryTarget]:
    """One target per completed move: the destination kind's memory per slot (a home move too —
    back to its own kind, down if that kind is smaller)."""
    asked = {p.job: p.memory_mb for p in placements}
    out = []
    for m in moves:
        kind = node_sc.get(m.dst)
        own = asked.get(m.job, 0)
        want = farm[kind].memory_mb_per_node if kind in farm else own
        out.append(MemoryTarget(m.job, m.vm, m.dst, kind if kind in farm else None, want, own))
    return out


__all__ = ["MemoryTarget", "balloon_target_mib", "domain_max_mib", "targets_after"]
