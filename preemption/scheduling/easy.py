"""EASY backfilling (Lifka 1995), the core every policy here shares.

Why one core: fcfs-easy, mms and ubis differ only in the *order* of the queue and in what an
interactive job may do; once the order is fixed, "start jobs in order while they fit, give the
first that does not fit a reservation, then start any later job that does not delay that
reservation" is the same rule. The simulator and the live agent both call these functions.

Numbers only: nodes are counted, times are seconds; `running` lists (estimated end, nodes)
of what holds nodes now (running jobs, checkpoints in progress), in any order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numba
import numpy as np


def reservation(now: float, free: int, need: int, running: Iterable[tuple[float, int]]) -> tuple[float, int]:
    """When `need` nodes will be free at the earliest (shadow time), and how many nodes are
    then left over (extra nodes, which a backfilled job may hold past the shadow time).

    Estimated ends in the past count as `now` (a job overrunning its estimate is assumed to
    end at once, as EASY does). Returns (inf, 0) when even all nodes would not be enough.
    """
    if need <= free:
        return now, free - need
    avail = free
    for end, nodes in sorted(running):
        avail += nodes
        if avail >= need:
            return max(end, now), avail - need
    return float("inf"), 0


def backfill(
    now: float,
    free: int,
    shadow: float,
    extra: int,
    candidates: Sequence[int],
    nodes: Sequence[int] | np.ndarray,
    estimate: Sequence[float] | np.ndarray,
    *,
    depth: int | None = None,
) -> list[int]:
    """The candidates (in the given order) that start now without delaying the reservation.

    A candidate starts when it fits in the free nodes and either ends (by its estimate) before
    the shadow time or uses only extra nodes. `depth` bounds how many candidates are looked
    at (like Slurm's bf_max_job_test). `nodes[i]` and `estimate[i]` belong to
    `candidates[i]`. The live agent's entry point; the rule itself is `backfill_arrays`.
    """
    keys = np.asarray(candidates, dtype=np.int64)
    started = backfill_arrays(
        now,
        free,
        shadow,
        extra,
        keys,
        np.asarray(nodes, dtype=np.int64),
        np.asarray(estimate, dtype=np.float64),
        -1 if depth is None else depth,
    )
    return [int(k) for k in started]


@numba.njit(cache=True, nogil=True)
def backfill_arrays(
    now: float,
    free: int,
    shadow: float,
    extra: int,
    keys: np.ndarray,
    nodes: np.ndarray,
    estimate: np.ndarray,
    depth: int = -1,
) -> np.ndarray:  # pragma: no cover - compiled; the tests call it through numba
    """The backfilling rule over aligned arrays (keys, their nodes, their estimates), compiled:
    the simulator calls it at every scheduling pass, the live agent through `backfill`.
    `depth` < 0 = no bound. Returns the keys that start, in order.
    """
    count = keys.shape[0] if depth < 0 else min(depth, keys.shape[0])
    started = np.empty(count, dtype=np.int64)
    k = 0
    for i in range(count):
        if free <= 0:
            break
        n = nodes[i]
        if n > free:
            continue
        if not now + estimate[i] <= shadow:
            if n > extra:
                continue
            extra -= n
        started[k] = keys[i]
        k += 1
        free -= n
    return started[:k]
