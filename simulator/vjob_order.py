"""The vjob queue order and its backfill window, compiled, for the simulator's pass.

Why not `np.lexsort` as `tick.decide` does: the order is `policies.vjob_order` (tiers, then
the UBIS priority, then submission time, then the job: its index here, its id's rank live),
and a whole-queue lexsort of four keys at every pass is most of a replay's time. One linear
pass splits the queue into its tiers; a tier is brought into (submission, job) order only
when it is not already in it (the queue buffer keeps jobs in the order they were queued, so
only the checkpointed jobs' tier usually needs it), and is then sorted stably by priority
only when it is not already in priority order. The result is the same permutation as
`policies.vjob_order(..., priority, tie=job index)`, which tests/test_scheduling_vjob_order.py
checks on random queues and tests/test_decision_differential.py through the whole pass.
"""

from __future__ import annotations

import numba
import numpy as np
from numpy.typing import NDArray

from preemption.scheduling.easy import backfill_arrays

AHEAD_OFF, AHEAD_QUEUE = 0, 1
"""`interactive` tiering: off (tiers 0, 1, 3) or on (over-cap interactive jobs are tier 2)."""


@numba.njit(cache=True, nogil=True)
def _by_submit_then_job(part: NDArray[np.int64], submit: NDArray[np.float64]) -> NDArray[np.int64]:  # pragma: no cover
    """`part` (job indices) in (submission time, job index) order; as given when it already is."""
    for k in range(1, part.shape[0]):
        a, b = part[k - 1], part[k]
        if submit[b] < submit[a] or (submit[b] == submit[a] and b < a):
            part = np.sort(part)
            return part[np.argsort(submit[part], kind="mergesort")]
    return part


@numba.njit(cache=True, nogil=True)
def vjob_queue_order(
    qjobs: NDArray[np.int64],
    inter: NDArray[np.bool_],
    need: NDArray[np.int64],
    preempt_count: NDArray[np.float64],
    submit: NDArray[np.float64],
    prio: NDArray[np.float64],
    held: int,
    cap: float,
    ahead: int,
    out: NDArray[np.int64],
    tier_of: NDArray[np.int64],
    prio_of: NDArray[np.float64],
) -> int:  # pragma: no cover - compiled; tests call it through numba
    """Write the jobs `qjobs` into `out` in vjob's order and return the guard (the first
    batch job of that order, -1 if none). Tiers as `policies.vjob_tiers`: 0 interactive
    within the cap (`held + need <= cap`, `within_cap`'s comparison), 1 checkpointed before,
    2 (when `ahead`) the other interactive jobs, 3 the rest; inside a tier the highest
    `prio` (entry k is job `qjobs[k]`'s UBIS priority) first, then the earlier submission,
    then the lower job index. `tier_of` (the queue's length) and `prio_of` (one entry per
    job of the workload) are scratch."""
    n = qjobs.shape[0]
    counts = np.zeros(4, dtype=np.int64)
    for k in range(n):
        j = qjobs[k]
        prio_of[j] = prio[k]
        if inter[j] and held + need[j] <= cap:
            t = 0
        elif preempt_count[j] > 0:
            t = 1
        elif ahead == AHEAD_QUEUE and inter[j]:
            t = 2
        else:
            t = 3
        tier_of[k] = t
        counts[t] += 1
    starts = np.zeros(4, dtype=np.int64)
    for t in range(1, 4):
        starts[t] = starts[t - 1] + counts[t - 1]
    fill = starts.copy()
    for k in range(n):
        t = tier_of[k]
        out[fill[t]] = qjobs[k]
        fill[t] += 1
    for t in range(4):
        lo, hi = starts[t], starts[t] + counts[t]
        if hi - lo < 2:
            continue
        part = _by_submit_then_job(out[lo:hi].copy(), submit)
        ranked = True
        for k in range(1, hi - lo):
            if prio_of[part[k]] > prio_of[part[k - 1]]:
                ranked = False
                break
        if not ranked:
            key = np.empty(hi - lo, dtype=np.float64)
            for k in range(hi - lo):
                key[k] = -prio_of[part[k]]
            part = part[np.argsort(key, kind="mergesort")]
        for k in range(hi - lo):
            out[lo + k] = part[k]
    for k in range(n):
        if not inter[out[k]]:
            return out[k]
    return -1


@numba.njit(cache=True, nogil=True)
def backfill_window(
    order: NDArray[np.int64],
    start: int,
    inter: NDArray[np.bool_],
    interactive_first: bool,
    depth: int,
    drop_interactive: bool,
    out: NDArray[np.int64],
) -> int:  # pragma: no cover - compiled
    """The jobs EASY looks at after the head (`order[start:]`) into `out`, returning their
    count: interactive jobs first when `interactive_first` (each group in order), cut to
    `depth` jobs (-1: all), then without the interactive ones when `drop_interactive` (the
    hard cap) — `_schedule`'s former NumPy steps in the same sequence."""
    m = 0
    if interactive_first:
        for k in range(start, order.shape[0]):
            if inter[order[k]]:
                out[m] = order[k]
                m += 1
        for k in range(start, order.shape[0]):
            if depth >= 0 and m >= depth:
                break
            if not inter[order[k]]:
                out[m] = order[k]
                m += 1
    else:
        for k in range(start, order.shape[0]):
            if depth >= 0 and m >= depth:
                break
            out[m] = order[k]
            m += 1
    if depth >= 0 and m > depth:
        m = depth
    if drop_interactive:
        kept = 0
        for k in range(m):
            if not inter[out[k]]:
                out[kept] = out[k]
                kept += 1
        m = kept
    return m


@numba.njit(cache=True, nogil=True)
def backfill_tiers(
    now: float,
    free: int,
    shadow: float,
    extra: int,
    order: NDArray[np.int64],
    start: int,
    inter: NDArray[np.bool_],
    need: NDArray[np.int64],
    estimate: NDArray[np.float64],
    interactive_first: bool,
    depth: int,
    drop_interactive: bool,
    window: NDArray[np.int64],
) -> NDArray[np.int64]:  # pragma: no cover - compiled
    """The jobs EASY starts behind vjob's head: `backfill_window` into `window` (scratch),
    then the shared rule `easy.backfill_arrays` over that window with each job's size and
    estimate (`need`, `estimate`, by job index). One call per pass instead of a window, two
    gathers and the rule from Python: a million-job replay makes over a million passes."""
    count = backfill_window(order, start, inter, interactive_first, depth, drop_interactive, window)
    rest = window[:count]
    return backfill_arrays(now, free, shadow, extra, rest, need[rest], estimate[rest], -1)
