"""ARRIVE-F's remapping decisions: which running jobs to move or swap between sub-clusters.

Why this rule (the paper's, with two guards it implies):
- the predicted gain of swapping j (on A) and k (on B) is
  T̄ = (η_j t_{A→B,j} + η_k t_{B→A,k}) × β − T^M_{j,k}, and a move of j to idle nodes of B is
  the same with k absent; a decision is taken only when T̄ > T^Thresh. η is the job's VM
  count, so T̄ is in VM-seconds, and T^M charges every migrated VM its migration seconds;
- β is the number of profiling windows the gain is counted over; when the job's remaining time
  is known (walltime) the horizon is min(β, remaining / τ), the paper's exact form;
- thrashing is the exception: a job swapping is moved at once to a sub-cluster whose memory
  per core holds it and is larger than its own (where it has as much it would thrash again),
  whatever the gain (the memory model);
- no job is migrated more than `max_migrations` times, and never into a sub-cluster where it
  would thrash: together they rule out ping-pong;
- candidates are taken greedily by gain; each job is in at most one decision per pass, and the
  free slots are updated as decisions are taken so that every decision fits.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from preemption.remap.models import Profile, SubCluster, delta, thrashing
from vjob.errors import InputError

SWAP_PARTNERS = 8
"""Candidates per (source, destination) pair looked at for swaps: the best few by gain."""


@dataclass(frozen=True, slots=True)
class RemapParams:
    """The paper's knobs (β = 20 windows, τ = 50 s) and the two guards."""

    beta: float = 20.0
    tau_s: float = 50.0
    threshold_s: float = 60.0
    max_migrations: int = 2
    thrash_pages_s: float = 1000.0

    def __post_init__(self) -> None:
        for name, value, low in (("beta", self.beta, 0.0), ("tau_s", self.tau_s, 0.0)):
            if not (math.isfinite(value) and value > low):
                raise InputError(f"remap: {name} = {value}: must be a finite number > {low:g}")
        if not math.isfinite(self.threshold_s):
            raise InputError(f"remap: threshold_s = {self.threshold_s}: must be a finite number")
        if self.max_migrations < 0:
            raise InputError(f"remap: max_migrations = {self.max_migrations}: must be >= 0")


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A running job as the policy sees it: where, how big, and what it would gain elsewhere."""

    id: str
    cluster: str
    slots: int
    memory_mb_per_slot: int = 0
    gains: Mapping[str, float] = field(default_factory=dict)
    """Seconds of one window τ gained (> 0) or lost on each other sub-cluster; empty = not
    profiled for a whole window yet (such a job is never moved for gain)."""
    migrations: int = 0
    thrashing: bool = False
    remaining_s: float | None = None
    migrate_s: float = 0.0
    """Seconds each of its VMs loses to one live migration (T^M per VM)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "gains", MappingProxyType(dict(self.gains)))
        if self.slots < 1:
            raise InputError(f"running job {self.id}: slots = {self.slots}: must be >= 1")
        if self.migrations < 0 or self.migrate_s < 0:
            raise InputError(f"running job {self.id}: migrations and migrate_s must be >= 0")


@dataclass(frozen=True, slots=True)
class Decision:
    """One remapping: a move (one job) or a swap (two jobs), with its predicted gain."""

    kind: Literal["move", "swap"]
    reason: Literal["gain", "thrashing"]
    jobs: tuple[str, ...]
    src: tuple[str, ...]
    dst: tuple[str, ...]
    gain_s: float


def running_job(
    id: str,
    cluster: str,
    slots: int,
    profile: Profile | None,
    farm: Mapping[str, SubCluster],
    params: RemapParams,
    *,
    memory_mb_per_slot: int = 0,
    migrations: int = 0,
    remaining_s: float | None = None,
    migrate_s: float = 0.0,
) -> RunningJob:
    """A RunningJob whose gains come from the performance models applied to its profile."""
    if cluster not in farm:
        raise InputError(f"running job {id}: sub-cluster {cluster!r} is not in the farm")
    gains: dict[str, float] = {}
    if profile is not None:
        scale = params.tau_s / profile.window_s  # gains are per window τ
        gains = {n: delta(profile, farm[cluster], sc) * scale for n, sc in farm.items() if n != cluster}
    return RunningJob(
        id=id,
        cluster=cluster,
        slots=slots,
        memory_mb_per_slot=memory_mb_per_slot,
        gains=gains,
        migrations=migrations,
        thrashing=profile is not None and thrashing(profile, params.thrash_pages_s),
        remaining_s=remaining_s,
        migrate_s=migrate_s,
    )


def horizon(job: RunningJob, params: RemapParams) -> float:
    """Windows the gain is counted over: β, or fewer when the job ends sooner."""
    if job.remaining_s is None:
        return params.beta
    return max(0.0, min(params.beta, job.remaining_s / params.tau_s))


def side_gain(job: RunningJob, dst: str, params: RemapParams) -> float:
    """η_j × t_{A→B,j} × horizon − T^M_j, in VM-seconds."""
    return job.slots * (job.gains.get(dst, 0.0) * horizon(job, params) - job.migrate_s)


def decide(
    jobs: Iterable[RunningJob],
    free_slots: Mapping[str, int],
    memory_mb_per_slot: Mapping[str, int],
    params: RemapParams,
) -> list[Decision]:
    """The moves and swaps to make now, most gainful first; every one fits the free slots."""
    running = [j for j in jobs if j.migrations < params.max_migrations]
    free = dict(free_slots)
    for j in running:
        if j.cluster not in free or j.cluster not in memory_mb_per_slot:
            raise InputError(f"running job {j.id}: sub-cluster {j.cluster!r} is not in the farm")
    clusters = list(memory_mb_per_slot)
    taken: set[str] = set()
    out: list[Decision] = []

    def fits_memory(job: RunningJob, dst: str) -> bool:
        return job.memory_mb_per_slot <= memory_mb_per_slot[dst]

    def relieves(job: RunningJob, dst: str) -> bool:
        """A thrashing job's destination: its memory fits and there is more of it per slot."""
        return fits_memory(job, dst) and memory_mb_per_slot[dst] > memory_mb_per_slot[job.cluster]

    # Thrashing first: move now (or swap) to where the memory holds it, best gain first.
    for j in sorted((j for j in running if j.thrashing), key=lambda j: -j.slots):
        best: Decision | None = None
        for dst in clusters:
            if dst == j.cluster or not relieves(j, dst):
                continue
            if free.get(dst, 0) >= j.slots:
                cand = Decision("move", "thrashing", (j.id,), (j.cluster,), (dst,), side_gain(j, dst, params))
                if best is None or cand.gain_s > best.gain_s:
                    best = cand
        if best is None:
            for k in running:
                if k.id in taken or k.id == j.id or k.cluster == j.cluster or k.thrashing:
                    continue
                if not (relieves(j, k.cluster) and fits_memory(k, j.cluster)):
                    continue
                if not _swap_fits(j, k, free):
                    continue
                g = side_gain(j, k.cluster, params) + side_gain(k, j.cluster, params)
                cand = Decision("swap", "thrashing", (j.id, k.id), (j.cluster, k.cluster), (k.cluster, j.cluster), g)
                if best is None or cand.gain_s > best.gain_s:
                    best = cand
        if best is not None:
            _take(best, running, free, taken)
            out.append(best)

    # Then gains: moves to free slots and swaps, greedily by predicted gain over the threshold.
    cands: list[tuple[float, Decision]] = []
    profiled = [j for j in running if j.id not in taken and j.gains and not j.thrashing]
    by_pair: dict[tuple[str, str], list[tuple[float, RunningJob]]] = {}
    for j in profiled:
        for dst in clusters:
            if dst == j.cluster or not fits_memory(j, dst):
                continue
            g = side_gain(j, dst, params)
            by_pair.setdefault((j.cluster, dst), []).append((g, j))
            if free.get(dst, 0) >= j.slots and g > params.threshold_s:
                cands.append((g, Decision("move", "gain", (j.id,), (j.cluster,), (dst,), g)))
    for (a, b), js in by_pair.items():
        if a > b or (b, a) not in by_pair:
            continue
        top_j = sorted(js, key=lambda x: -x[0])[:SWAP_PARTNERS]
        top_k = sorted(by_pair[(b, a)], key=lambda x: -x[0])[:SWAP_PARTNERS]
        for gj, j in top_j:
            for gk, k in top_k:
                g = gj + gk
                if g > params.threshold_s and _swap_fits(j, k, free):
                    cands.append((g, Decision("swap", "gain", (j.id, k.id), (a, b), (b, a), g)))
    cands.sort(key=lambda c: (-c[0], c[1].jobs))
    for _, d in cands:
        if any(i in taken for i in d.jobs) or not _still_fits(d, running, free):
            continue
        _take(d, running, free, taken)
        out.append(d)
    return out


def _swap_fits(j: RunningJob, k: RunningJob, free: Mapping[str, int]) -> bool:
    return free.get(k.cluster, 0) + k.slots >= j.slots and free.get(j.cluster, 0) + j.slots >= k.slots


def _still_fits(d: Decision, running: list[RunningJob], free: Mapping[str, int]) -> bool:
    size = {j.id: j.slots for j in running}
    need: dict[str, int] = {}
    for i, src, dst in zip(d.jobs, d.src, d.dst, strict=True):
        need[dst] = need.get(dst, 0) + size[i]
        need[src] = need.get(src, 0) - size[i]
    return all(free.get(c, 0) >= n for c, n in need.items())


def _take(d: Decision, running: list[RunningJob], free: dict[str, int], taken: set[str]) -> None:
    size = {j.id: j.slots for j in running}
    for i, src, dst in zip(d.jobs, d.src, d.dst, strict=True):
        free[src] = free.get(src, 0) + size[i]
        free[dst] = free.get(dst, 0) - size[i]
        taken.add(i)
