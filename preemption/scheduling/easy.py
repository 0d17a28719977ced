"""EASY backfilling (Lifka 1995), the core every policy here shares.

Why one core: fcfs-easy, mms and ubis differ only in the *order* of the queue and in what an
interactive job may do; once the order is fixed, "start jobs in order while they fit, give the
first that does not fit a reservation, then start any later job that does not delay that
reservation" is the same rule. The simulator and the live agent both call these functions.

Numbers only: nodes are counted, times are seconds; `running` lists (estimated end, nodes)
of what holds nodes now (running jobs, checkpoints in progress), in any order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

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
    candidates: Iterable[int],
    nodes: Callable[[int], int] | Sequence[int],
    estimate: Callable[[int], float] | Sequence[float],
    *,
    depth: int | None = None,
    may_start: Callable[[int], bool] | None = None,
) -> list[int]:
    """The candidates (in the given order) that start now without delaying the reservation.

    A candidate starts when it fits in the free nodes and either ends (by its estimate) before
    the shadow time or uses only extra nodes. `depth` bounds how many candidates are looked
    at (like Slurm's bf_max_job_test); `may_start` can veto one (e.g. the interactive cap).
    """
    size = nodes if callable(nodes) else nodes.__getitem__
    est = estimate if callable(estimate) else estimate.__getitem__
    started: list[int] = []
    looked = 0
    for key in candidates:
        if free <= 0 or (depth is not None and looked >= depth):
            break
        looked += 1
        n = size(key)
        if n > free:
            continue
        ends_in_time = now + est(key) <= shadow
        if not ends_in_time and n > extra:
            continue
        if may_start is not None and not may_start(key):
            continue
        started.append(key)
        free -= n
        if not ends_in_time:
            extra -= n
    return started


def backfill_arrays(
    now: float,
    free: int,
    shadow: float,
    extra: int,
    keys: np.ndarray,
    nodes: np.ndarray,
    estimate: np.ndarray,
    *,
    depth: int | None = None,
) -> list[int]:
    """`backfill` for candidates given as aligned arrays (keys, their nodes, their estimates).

    Same decisions as `backfill`: free and extra nodes only shrink as jobs start, so a job
    that fails the test against the starting values fails it later too; the vectorised test
    finds the few that pass, and only those are walked in order.
    """
    if depth is not None:
        keys, nodes, estimate = keys[:depth], nodes[:depth], estimate[:depth]
    in_time = now + estimate <= shadow
    maybe = np.flatnonzero((nodes <= free) & (in_time | (nodes <= extra)))
    started: list[int] = []
    for i in maybe.tolist():
        if free <= 0:
            break
        n = int(nodes[i])
        if n > free:
            continue
        if not in_time[i]:
            if n > extra:
                continue
            extra -= n
        started.append(int(keys[i]))
        free -= n
    return started
