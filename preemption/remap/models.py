"""ARRIVE-F's online performance models: computation, communication, memory, migration.

Why these shapes: the paper profiles a running job for one window τ on its sub-cluster A and
predicts the same window on another sub-cluster B without any offline run of the job:
- computation: t^P_A = Σ_i Pctr_i × Cycles_{A,i} / f_A, and for B the same counters with B's
  cycles per event and clock (the counters measure the job, the cycles the hardware);
- blocking communication: t^B_X = Σ_s n^B(s) × l_X(s), messages counted per size, the latency
  l_X(s) precomputed per sub-cluster (here Hockney's l(s) = latency + s / bandwidth);
- non-blocking communication: the logged waits scaled by the latency ratio,
  t^N_B = Σ_s n^N(s) × w_A(s) × l_B(s) / l_A(s);
- memory: swap thrashing is the costliest state there is, so it triggers a move at once;
- migration: a live migration copies the memory once at least, T^M = memory / bandwidth.
All inputs are validated; a missing cycles entry is an error naming the event and sub-cluster.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from vjob.errors import InputError


def _frozen(m: Mapping[str, float] | Mapping[int, float]) -> Mapping:  # type: ignore[type-arg]
    return MappingProxyType(dict(m))


@dataclass(frozen=True, slots=True)
class SubCluster:
    """A homogeneous sub-cluster of the farm: its size, memory, clock, cycles and network."""

    name: str
    nodes: int
    cores_per_node: int
    memory_mb_per_node: int
    freq_ghz: float
    latency_us: float = 50.0
    bandwidth_mb_s: float = 110.0
    cycles: Mapping[str, float] = field(default_factory=dict)
    """Cycles per counted event on this hardware (Cycles_{X,i} of the paper)."""
    rank: int = 0
    """Nominal speed order for "fastest free cluster first" (0 = fastest)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "cycles", _frozen(self.cycles))
        for name, value, low in (
            ("nodes", self.nodes, 1),
            ("cores_per_node", self.cores_per_node, 1),
            ("memory_mb_per_node", self.memory_mb_per_node, 1),
        ):
            if value < low:
                raise InputError(f"subcluster {self.name}: {name} = {value}: must be >= {low}")
        for name, fvalue in (
            ("freq_ghz", self.freq_ghz),
            ("latency_us", self.latency_us),
            ("bandwidth_mb_s", self.bandwidth_mb_s),
        ):
            if not (math.isfinite(fvalue) and fvalue > 0):
                raise InputError(f"subcluster {self.name}: {name} = {fvalue}: must be a finite number > 0")
        for event, c in self.cycles.items():
            if not (math.isfinite(c) and c >= 0):
                raise InputError(f"subcluster {self.name}: cycles.{event} = {c}: must be a finite number >= 0")

    @property
    def slots(self) -> int:
        """Cores of the whole sub-cluster: one VM (MPI rank) per core."""
        return self.nodes * self.cores_per_node

    @property
    def memory_mb_per_slot(self) -> int:
        return self.memory_mb_per_node // self.cores_per_node

    def latency_s(self, size_bytes: int) -> float:
        """Precomputed time of one message of `size_bytes` (Hockney: α + s/β)."""
        return self.latency_us * 1e-6 + size_bytes / (self.bandwidth_mb_s * 1e6)


@dataclass(frozen=True, slots=True)
class Profile:
    """What one profiling window τ on the current sub-cluster measured of a job."""

    window_s: float
    counters: Mapping[str, float] = field(default_factory=dict)
    """Hardware events counted in the window (Pctr_{A,j,i}), e.g. instructions, l2_misses."""
    blocking: Mapping[int, float] = field(default_factory=dict)
    """Blocking messages sent in the window, by size in bytes (n^B_j(s))."""
    nonblocking: Mapping[int, tuple[float, float]] = field(default_factory=dict)
    """Non-blocking messages by size: (count, mean logged wait in s) (n^N_j(s), w_A(s))."""
    swap_in_pages_s: float = 0.0
    """Major faults (pages swapped in) per second during the window."""
    swap_out_pages_s: float | None = None
    """Pages swapped out per second; None where not measured (the simulator, old profiles)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            raise InputError(f"profile: window_s = {self.window_s}: must be a finite number > 0")
        for name, m in (("counters", self.counters), ("blocking", self.blocking)):
            object.__setattr__(self, name, _frozen(m))
            for k, v in m.items():
                if not (math.isfinite(v) and v >= 0):
                    raise InputError(f"profile: {name}[{k}] = {v}: must be a finite number >= 0")
        object.__setattr__(self, "nonblocking", MappingProxyType(dict(self.nonblocking)))
        for k, (n, w) in self.nonblocking.items():
            if not (math.isfinite(n) and n >= 0 and math.isfinite(w) and w >= 0):
                raise InputError(f"profile: nonblocking[{k}] = ({n}, {w}): count and wait must be >= 0")
        for size in (*self.blocking, *self.nonblocking):
            if size < 0:
                raise InputError(f"profile: message size {size}: must be >= 0")
        if not (math.isfinite(self.swap_in_pages_s) and self.swap_in_pages_s >= 0):
            raise InputError(f"profile: swap_in_pages_s = {self.swap_in_pages_s}: must be >= 0")
        out = self.swap_out_pages_s
        if out is not None and not (math.isfinite(out) and out >= 0):
            raise InputError(f"profile: swap_out_pages_s = {out}: must be >= 0")


def compute_time(profile: Profile, sc: SubCluster) -> float:
    """t^P on `sc`: the window's counted events × `sc`'s cycles per event / its clock."""
    total = 0.0
    for event, count in profile.counters.items():
        if event not in sc.cycles:
            raise InputError(f"subcluster {sc.name}: no cycles.{event} for the profiled counter {event!r}")
        total += count * sc.cycles[event]
    return total / (sc.freq_ghz * 1e9)


def blocking_time(profile: Profile, sc: SubCluster) -> float:
    """t^B on `sc`: every blocking message at `sc`'s precomputed latency for its size."""
    return sum(n * sc.latency_s(size) for size, n in profile.blocking.items())


def nonblocking_time(profile: Profile, src: SubCluster, dst: SubCluster) -> float:
    """t^N on `dst`: the waits logged on `src` scaled by the latency ratio (t^N_A when equal)."""
    return sum(n * w * dst.latency_s(s) / src.latency_s(s) for s, (n, w) in profile.nonblocking.items())


def delta(profile: Profile, src: SubCluster, dst: SubCluster) -> float:
    """t_{A→B}: seconds of the window gained (> 0) or lost (< 0) had it run on `dst`."""
    return (
        (compute_time(profile, src) - compute_time(profile, dst))
        + (blocking_time(profile, src) - blocking_time(profile, dst))
        + (nonblocking_time(profile, src, src) - nonblocking_time(profile, src, dst))
    )


def thrashing(profile: Profile, pages_s_threshold: float) -> bool:
    """Swap thrashing: more pages swapped in per second than the threshold — and, where swap-outs
    are measured (a guest's balloon statistics), as many swapped out: pages evicted and read
    back again and again. Swap-ins alone are a guest reading back what it evicted before, once
    its memory peak has passed; moving it would buy nothing."""
    rate = profile.swap_in_pages_s
    if profile.swap_out_pages_s is not None:
        rate = min(rate, profile.swap_out_pages_s)
    return rate > pages_s_threshold


def migration_cost_s(memory_mb: float, bandwidth_mb_s: float, dirty_factor: float = 1.2) -> float:
    """Seconds of one VM's live migration: its memory copied once plus the pages it dirtied
    meanwhile (`dirty_factor` ≥ 1; measured from the driver's migrations, docs/remap.md)."""
    if not (memory_mb >= 0 and bandwidth_mb_s > 0 and dirty_factor >= 1):
        raise InputError(
            f"migration cost: memory_mb = {memory_mb}, bandwidth_mb_s = {bandwidth_mb_s}, "
            f"dirty_factor = {dirty_factor}: need memory >= 0, bandwidth > 0, dirty_factor >= 1"
        )
    return memory_mb * dirty_factor / bandwidth_mb_s


def subcluster_of(features: tuple[str, ...], subclusters: Iterable[str]) -> str | None:
    """The sub-cluster a node belongs to: its first RMS feature (Slurm `Features`, PBS resource,
    OAR property) that names one; None for a node of no known sub-cluster (never remapped to)."""
    names = set(subclusters)
    return next((f for f in features if f in names), None)
