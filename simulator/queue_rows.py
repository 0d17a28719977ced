"""The simulator's queue as two parallel buffers: job indices, and a copy of each queued
job's columns (the rows the UBIS kernel reads).

Why a copy: a scheduling pass rates every queued job; gathered from the matrix of all jobs'
columns (8 MB for 125,000 jobs) the rows are scattered cache misses, read from a buffer kept
in queue order they stream. Nothing changes a queued job's columns (Pn and Pt change when it
is checkpointed or started, i.e. while it is not queued), so the copy made at queueing time
stays right. Appending and compacting are compiled and allocate nothing.
"""

from __future__ import annotations

import numba
import numpy as np
from numpy.typing import NDArray


@numba.njit(cache=True, nogil=True)
def queue_append(
    jobs: NDArray[np.int64],
    rows: NDArray[np.float64],
    length: int,
    cols: NDArray[np.float64],
    arrived: NDArray[np.int64],
) -> int:  # pragma: no cover - compiled; tests call it through numba
    """Append `arrived` (with their rows of `cols` when `rows` has room for them) after the
    first `length` entries; returns the new length. `jobs` must have room."""
    copy_rows = rows.shape[0] >= jobs.shape[0]
    for k in range(arrived.shape[0]):
        j = arrived[k]
        jobs[length] = j
        if copy_rows:
            rows[length, :] = cols[j, :]
        length += 1
    return length


@numba.njit(cache=True, nogil=True)
def queue_remove(
    jobs: NDArray[np.int64],
    rows: NDArray[np.float64],
    length: int,
    started: NDArray[np.int64],
    mark: NDArray[np.bool_],
) -> int:  # pragma: no cover - compiled
    """Remove the jobs `started` from the first `length` entries, keeping the others' order;
    returns the new length. `mark` is a scratch array of the workload's size, all False (and
    left so)."""
    for j in started:
        mark[j] = True
    copy_rows = rows.shape[0] >= jobs.shape[0]
    kept = 0
    for k in range(length):
        j = jobs[k]
        if mark[j]:
            continue
        if kept != k:
            jobs[kept] = j
            if copy_rows:
                rows[kept, :] = rows[k, :]
        kept += 1
    for j in started:
        mark[j] = False
    return kept
