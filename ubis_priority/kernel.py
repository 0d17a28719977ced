"""The array-level UBIS kernel: equation 1 over all pending jobs at once, in NumPy.

Why arrays and not Job objects: the simulator recomputes every priority at every event of a
trace with tens of thousands of queued jobs; building Job objects per event would cost more
than the scheduling itself. The simulator keeps its jobs as columns and calls
the compiled copy of this arithmetic (`ubis_priority.compiled`, checked against this kernel
to the last bit); `ubis_priority.compute(view, cfg)` builds the columns from a ClusterView
and calls `compute_arrays`, so the live agent and the simulator get the same priorities.

Every operation here is written in the same order as `reference.priority_of` (the plain
per-job loop), so the two agree to the last bit; the benchmark and the tests check that.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ubis_priority.interactive import cap_limit, within_cap
from ubis_priority.terms import TERMS, weight_vector
from vjob.config import PriorityConfig
from vjob.errors import InputError

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]


@dataclass(frozen=True)
class JobArrays:
    """One entry per pending job, all arrays of the same length n.

    `os_index` indexes `ClusterArrays.free_by_os` (-1: the job takes any OS image, so every
    free node counts as running its OS); `share_index` indexes the per-entity target and
    usage arrays; `user_index` indexes `user_interactive_held` (the per-user cap).
    """

    submit_time: FloatArray
    nodes: IntArray
    os_index: IntArray
    preempt_count: IntArray
    preempted_s: FloatArray
    """Total preempted time Pt, including a preemption still open at `now`."""
    interactive: BoolArray
    share_index: IntArray
    user_index: IntArray

    def __len__(self) -> int:
        return int(self.nodes.shape[0])


@dataclass(frozen=True)
class ClusterArrays:
    """What equation 1 needs to know about the cluster and the users at instant `now`."""

    now: float
    total_nodes: int
    """Usable nodes: the scale of the two node terms and of the interactive cap."""
    free_nodes: int
    free_by_os: IntArray
    """Free nodes whose VMs currently run image k (UBIS's N_availableOS per image)."""
    target: FloatArray
    """Target share (0..1) per share entity."""
    usage: FloatArray
    """Usage share (0..1: the entity's decayed node-seconds over everybody's) per entity."""
    interactive_held: int
    """Nodes held right now by running interactive jobs (all users)."""
    user_interactive_held: IntArray
    """Nodes held right now by running interactive jobs, per user index."""


@dataclass(frozen=True)
class TermArrays:
    """The result: every term raw, normalised (0..1) and weighted, and the priorities.

    Rows of the (7, n) matrices follow `terms.TERMS`. `capped` marks interactive jobs whose
    I term was set to 0 by the interactive cap (so the explanation can say why).
    """

    raw: FloatArray
    normalised: FloatArray
    weighted: FloatArray
    priority: FloatArray
    capped: BoolArray
    weights: tuple[float, ...]

    @property
    def max_priority(self) -> float:
        """The largest priority the weights allow (every normalised term at 1)."""
        return float(sum(self.weights))


def _check(jobs: JobArrays, cluster: ClusterArrays) -> None:
    """Refuse inconsistent columns with a message naming the column; a silent broadcast or
    an out-of-range index would give wrong priorities, which is worse than no priorities."""
    n = len(jobs)
    for name in ("submit_time", "os_index", "preempt_count", "preempted_s", "interactive", "share_index", "user_index"):
        length = getattr(jobs, name).shape[0]
        if length != n:
            raise InputError(f"priority kernel: jobs.{name} has {length} entries, jobs.nodes has {n}")
    if cluster.total_nodes < 0 or cluster.free_nodes < 0 or cluster.free_nodes > cluster.total_nodes:
        raise InputError(
            f"priority kernel: free_nodes = {cluster.free_nodes}, total_nodes = {cluster.total_nodes}: "
            "need 0 <= free_nodes <= total_nodes"
        )
    if cluster.target.shape != cluster.usage.shape:
        raise InputError("priority kernel: cluster.target and cluster.usage must have one entry per share entity")
    for name in ("target", "usage"):
        column = getattr(cluster, name)
        bad = ~np.isfinite(column) | (column < 0) | (column > 1)
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise InputError(f"priority kernel: cluster.{name}[{first}] = {column[first]}: must be a share in 0..1")
    if n == 0:
        return
    bounds = (
        ("os_index", jobs.os_index, -1, cluster.free_by_os.shape[0]),
        ("share_index", jobs.share_index, 0, cluster.target.shape[0]),
        ("user_index", jobs.user_index, 0, cluster.user_interactive_held.shape[0]),
    )
    for name, index, low, high in bounds:
        bad = (index < low) | (index >= high)
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            value = int(index[first])
            raise InputError(f"priority kernel: jobs.{name}[{first}] = {value}: must be in {low}..{high - 1}")
    for name in ("submit_time", "preempted_s"):
        column = getattr(jobs, name)
        bad = ~np.isfinite(column) | (column < 0) if name == "preempted_s" else ~np.isfinite(column)
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise InputError(f"priority kernel: jobs.{name}[{first}] = {column[first]}: must be finite (Pt >= 0)")
    if (jobs.nodes < 1).any():
        first = int(np.flatnonzero(jobs.nodes < 1)[0])
        raise InputError(f"priority kernel: jobs.nodes[{first}] = {int(jobs.nodes[first])}: must be >= 1")


def _centred(raw: FloatArray, scale: float, out: FloatArray) -> None:
    """A signed node count as a share of the cluster, clipped to -1..1, then moved to 0..1."""
    np.divide(raw, scale, out=out)
    np.maximum(out, -1.0, out=out)
    np.minimum(out, 1.0, out=out)
    out += 1.0
    out /= 2.0


def compute_arrays(jobs: JobArrays, cluster: ClusterArrays, cfg: PriorityConfig) -> TermArrays:
    """Equation 1 for every job of `jobs`; see docs/priority.md for each term's scale.

    Written with in-place operations (`out=`): at 100,000 jobs the temporaries, not the
    arithmetic, are what costs.
    """
    _check(jobs, cluster)
    n = len(jobs)
    nodes = jobs.nodes.astype(np.float64)
    scale = float(max(cluster.total_nodes, 1))

    # N_availableOS: free nodes already running the job's image; "any image" → all free nodes.
    free_by_os = np.append(cluster.free_by_os.astype(np.float64), float(cluster.free_nodes))
    avail = free_by_os[jobs.os_index]

    raw = np.empty((len(TERMS), n), dtype=np.float64)
    norm = np.empty((len(TERMS), n), dtype=np.float64)

    # Target − Usage per share entity first, then spread to the jobs: one gather, not two.
    np.take(cluster.target - cluster.usage, jobs.share_index, out=raw[0])
    np.add(raw[0], 1.0, out=norm[0])
    norm[0] /= 2.0
    np.maximum(norm[0], 0.0, out=norm[0])
    np.minimum(norm[0], 1.0, out=norm[0])

    np.subtract(cluster.now, jobs.submit_time, out=raw[1])
    np.maximum(raw[1], 0.0, out=raw[1])
    np.divide(raw[1], cfg.max_queue_time_s, out=norm[1])
    np.minimum(norm[1], 1.0, out=norm[1])

    np.subtract(avail, nodes, out=raw[2])
    _centred(raw[2], scale, norm[2])

    raw[3] = jobs.preempt_count
    np.divide(raw[3], float(cfg.max_preempt_count), out=norm[3])
    np.minimum(norm[3], 1.0, out=norm[3])

    raw[4] = jobs.preempted_s
    np.divide(raw[4], cfg.max_preempt_time_s, out=norm[4])
    np.minimum(norm[4], 1.0, out=norm[4])

    # N_free − (N_reqOS − N_availableOS), the swaps clamped at 0 (see docs/priority.md).
    np.subtract(nodes, avail, out=raw[5])
    np.maximum(raw[5], 0.0, out=raw[5])
    np.subtract(float(cluster.free_nodes), raw[5], out=raw[5])
    _centred(raw[5], scale, norm[5])

    capped = jobs.interactive & ~_within_caps(jobs, cluster, cfg, nodes)
    raw[6] = jobs.interactive
    np.copyto(norm[6], raw[6])
    norm[6][capped] = 0.0

    weights = weight_vector(cfg.weights)
    weighted = np.multiply(np.asarray(weights, dtype=np.float64)[:, None], norm)
    priority = weighted[0].copy()
    for k in range(1, len(TERMS)):
        priority += weighted[k]
    return TermArrays(raw=raw, normalised=norm, weighted=weighted, priority=priority, capped=capped, weights=weights)


def _within_caps(jobs: JobArrays, cluster: ClusterArrays, cfg: PriorityConfig, nodes: FloatArray) -> BoolArray:
    """Whether starting each job now would keep interactive jobs within their share(s).

    The cap is what stops a user who marks every job interactive: beyond it the job is an
    ordinary job again, it is not refused. The rule is `ubis_priority.interactive`'s.
    """
    limit = cap_limit(cfg.interactive_cap, cluster.total_nodes)
    ok: BoolArray = np.asarray(within_cap(float(cluster.interactive_held), nodes, limit))
    if cfg.interactive_user_cap is not None:
        user_limit = cap_limit(cfg.interactive_user_cap, cluster.total_nodes)
        held = cluster.user_interactive_held.astype(np.float64)[jobs.user_index]
        ok = ok & np.asarray(within_cap(held, nodes, user_limit))  # type: ignore[arg-type]
    return ok
