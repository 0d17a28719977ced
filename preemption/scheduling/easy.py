"""EASY backfilling (Lifka 1995), the core every policy here shares.

Why one core: fcfs-easy, mms and ubis differ only in the *order* of the queue and in what an
interactive job may do; once the order is fixed, "start jobs in order while they fit, give the
first that does not fit a reservation, then start any later job that does not delay that
reservation" is the same rule. The scheduling pass (`tick.decide`, which the live agent runs)
calls `reservation` and `backfill`; the simulator calls `reservation`, `backfill_arrays` and
`backfill_leading` from its compiled pass. Live, the RMS does the backfilling itself (Slurm's
backfill scheduler, Maui, OAR): the agent's pass only predicts it, to know which nodes are left
for interactive jobs.

Numbers only: nodes are counted, times are seconds; `running` lists (estimated end, nodes)
of what holds nodes now (running jobs, checkpoints in progress), in any order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from numpy.typing import NDArray

from ubis_priority.compiled import within_depth
from vjob import jit as numba


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
    `candidates[i]`. The entry point of the scheduling pass (`tick.decide`); the rule itself is
    `backfill_arrays`.
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
    the simulator calls it at every scheduling pass, `tick.decide` through `backfill`.
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


@numba.njit(cache=True, nogil=True)
def backfill_leading(
    now: float,
    free: int,
    shadow: float,
    extra: int,
    jobs: NDArray[np.int64],
    entries: NDArray[np.int64],
    prio: NDArray[np.float64],
    rows: NDArray[np.float64],
    head_at: int,
    nodes: NDArray[np.int64],
    estimate: NDArray[np.float64],
    depth: int,
    started_out: NDArray[np.int64],
) -> int:  # pragma: no cover - compiled
    """EASY backfilling (`easy.backfill_arrays`) behind the head `jobs[head_at]` of an
    `ubis_leading` answer (`jobs`, `entries`, `prio`; `rows` as given to it): the later jobs
    that could start now (fit the free nodes and end before the shadow time or fit the extra
    nodes), cut to those within `depth` places after the head in the whole queue order
    (depth < 0: no bound), then the rule itself. `nodes` and `estimate` are per job index.
    Same answer as backfilling over the whole order's window: the other jobs of the window
    could not start anyway. The jobs to start are written to `started_out`; returns how many."""
    later = jobs.shape[0] - head_at - 1
    could = np.empty(later, dtype=np.int64)
    count = 0
    for i in range(head_at + 1, jobs.shape[0]):
        j = jobs[i]
        if nodes[j] <= free and (now + estimate[j] <= shadow or nodes[j] <= extra):
            could[count] = i
            count += 1
    if depth >= 0 and prio.shape[0] > depth + 1 and count > 0:
        count = within_depth(rows, prio, entries[head_at], entries[could[:count]], depth)
    keys = np.empty(count, dtype=np.int64)
    need = np.empty(count, dtype=np.int64)
    est = np.empty(count, dtype=np.float64)
    for k in range(count):
        j = jobs[could[k]]
        keys[k] = j
        need[k] = nodes[j]
        est[k] = estimate[j]
    started = backfill_arrays(now, free, shadow, extra, keys, need, est, -1)
    started_out[: started.shape[0]] = started
    return started.shape[0]
