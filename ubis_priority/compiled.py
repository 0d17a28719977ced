"""Equation 1 and the UBIS queue order compiled with numba, for the simulator's passes.

Why a compiled copy of the arithmetic: a 100,000-job replay ranks a queue of ~750 jobs about
170,000 times. In NumPy each ranking is ~45 calls plus gathers and a lexsort, and the call
overhead, not the arithmetic, dominates; one compiled loop over the queue does the same
operations in the same order with none of that overhead. `compute_arrays` (kernel.py) stays
the definition the live agent, `vjob prio` and the explanations use; this module repeats its
operations scalar by scalar, in the same order, and `tests/test_priority_compiled.py` checks
that both give the same priorities to the last bit on random and edge-case inputs. numba
compiles without fast-math, so IEEE operations are neither reordered nor fused.

The simulator keeps its per-job columns as the rows of one float64 matrix (`COLUMNS`), so a
call passes one array for all of them and gathers nothing.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
from numpy.typing import NDArray

from ubis_priority.interactive import cap_limit
from ubis_priority.terms import weight_vector
from vjob import jit as numba
from vjob.config import PriorityConfig

COLUMNS: Final[tuple[str, ...]] = (
    "submit_time",
    "nodes",
    "os_index",
    "preempt_count",
    "preempted_s",
    "preempted_since",
    "interactive",
    "share_index",
)
"""Rows of the column matrix: as JobArrays, with Pt split into the closed preemptions'
total (`preempted_s`) and the start of an open one (`preempted_since`, NaN when none);
integer and boolean columns are stored as exact float64 values."""
SUBMIT, NODES, OS, PREEMPT_COUNT, PREEMPTED_S, SINCE, INTERACTIVE, SHARE = range(len(COLUMNS))


def scalars(cfg: PriorityConfig, total_nodes: int) -> NDArray[np.float64]:
    """The configuration as the float vector the compiled kernel reads: the seven weights,
    the three term scales, the cluster scale, the interactive cap and the per-user cap in
    nodes (inf when there is none); computed once per run."""
    user_cap = math.inf if cfg.interactive_user_cap is None else cap_limit(cfg.interactive_user_cap, total_nodes)
    return np.array(
        [
            *weight_vector(cfg.weights),
            cfg.max_queue_time_s,
            float(cfg.max_preempt_count),
            cfg.max_preempt_time_s,
            float(max(total_nodes, 1)),
            cap_limit(cfg.interactive_cap, total_nodes),
            user_cap,
        ],
        dtype=np.float64,
    )


@numba.njit(cache=True, nogil=True)
def _block_sum(values: NDArray[np.float64], start: int, count: int) -> float:  # pragma: no cover - compiled
    """NumPy's sum of at most 128 values: plain below 8, else eight partial sums."""
    if count < 8:
        total = 0.0
        for i in range(start, start + count):
            total += values[i]
        return total
    r0, r1, r2, r3 = values[start], values[start + 1], values[start + 2], values[start + 3]
    r4, r5, r6, r7 = values[start + 4], values[start + 5], values[start + 6], values[start + 7]
    i = 8
    while i < count - count % 8:
        at = start + i
        r0 += values[at]
        r1 += values[at + 1]
        r2 += values[at + 2]
        r3 += values[at + 3]
        r4 += values[at + 4]
        r5 += values[at + 5]
        r6 += values[at + 6]
        r7 += values[at + 7]
        i += 8
    total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < count:
        total += values[start + i]
        i += 1
    return total


@numba.njit(cache=True, nogil=True)
def numpy_sum(values: NDArray[np.float64]) -> float:  # pragma: no cover - compiled
    """`float(values.sum())` to the last bit: NumPy's pairwise summation (blocks of 128 with
    eight partial sums, halves above that), which tests/test_priority_compiled.py checks
    against NumPy for sizes 0..20,000."""
    # NumPy halves a range above 128 values (the first half a multiple of 8) and adds the
    # halves' sums; done here with an explicit stack (a recursive compiled function does not
    # survive numba's on-disk cache). Each range's sum is kept until its sibling's is known.
    starts = np.empty(64, dtype=np.int64)
    counts = np.empty(64, dtype=np.int64)
    first = np.empty(64, dtype=np.float64)  # a split range's first half's sum
    halves_done = np.zeros(64, dtype=np.int64)
    starts[0], counts[0] = 0, values.shape[0]
    top = 0
    while True:
        count = counts[top]
        if count > 128:  # split: push the next half to sum
            half = count // 2
            half -= half % 8
            offset, size = (0, half) if halves_done[top] == 0 else (half, count - half)
            starts[top + 1], counts[top + 1], halves_done[top + 1] = starts[top] + offset, size, 0
            top += 1
            continue
        value = _block_sum(values, starts[top], count)
        while True:  # hand the sum up until a range still has its second half to do
            if top == 0:
                return value
            top -= 1
            if halves_done[top] == 0:
                first[top] = value
                halves_done[top] = 1
                break
            value = first[top] + value


@numba.njit(cache=True, nogil=True)
def _centred(raw: float, scale: float) -> float:  # pragma: no cover - compiled
    value = raw / scale
    value = max(value, -1.0)
    value = min(value, 1.0)
    value += 1.0
    return value / 2.0


@numba.njit(cache=True, nogil=True)
def queue_priorities(
    cols: NDArray[np.float64],
    queue: NDArray[np.int64],
    now: float,
    free_nodes: int,
    free_by_os: NDArray[np.int64],
    interactive_held: int,
    target: NDArray[np.float64],
    usage: NDArray[np.float64],
    conf: NDArray[np.float64],
    as_batch: bool,
) -> NDArray[np.float64]:  # pragma: no cover - compiled; tests call it through numba
    """Equation 1 at `now` for the jobs `queue` (row indices into `cols`, one row per job).

    `free_by_os` has the free nodes per image (an os_index of -1, "any image", counts all
    `free_nodes`); `usage` is each share entity's decayed node-seconds (the usage share is
    its ratio to their sum, summed as NumPy does, 0 when the sum is 0);
    `conf` is `scalars(...)`. `as_batch` rates every job as a batch job (a running job rated
    as if it were checkpointed, for victim choice). The cap test `held + nodes <= conf[11]` is
    the numba twin of `interactive.within_cap` (tests/test_decision_differential.py holds the
    simulator's passes equal to the shared decision). The per-user interactive cap, when set,
    counts the job alone (the simulator does not keep per-user holdings; docs/simulator.md,
    "Live and simulated").
    """
    n = queue.shape[0]
    out = np.empty(n, dtype=np.float64)
    scale = conf[10]
    images = free_by_os.shape[0]
    avail_by_os = np.empty(images + 1, dtype=np.float64)
    for i in range(images):
        avail_by_os[i] = free_by_os[i]
    avail_by_os[images] = free_nodes
    usage_total = numpy_sum(usage)
    free = float(free_nodes)
    held = float(interactive_held)
    # the usage term per share entity, then gathered (as compute_arrays does)
    shares = np.empty(target.shape[0], dtype=np.float64)
    for e in range(target.shape[0]):
        share = usage[e] / usage_total if usage_total > 0 else 0.0
        share = target[e] - share
        share += 1.0
        share /= 2.0
        share = max(share, 0.0)
        share = min(share, 1.0)
        shares[e] = share * conf[0]
    for k in range(n):
        row = cols[queue[k]]
        nodes = row[NODES]
        avail = avail_by_os[int(row[OS])]
        p = shares[int(row[SHARE])]

        t = now - row[SUBMIT]
        t = max(t, 0.0)
        t = t / conf[7]
        t = min(t, 1.0)
        p += t * conf[1]

        p += _centred(avail - nodes, scale) * conf[2]

        t = row[PREEMPT_COUNT] / conf[8]
        t = min(t, 1.0)
        p += t * conf[3]

        since = row[SINCE]
        pt = row[PREEMPTED_S] + (0.0 if math.isnan(since) else now - since)
        t = pt / conf[9]
        t = min(t, 1.0)
        p += t * conf[4]

        t = nodes - avail
        t = max(t, 0.0)
        p += _centred(free - t, scale) * conf[5]

        if not as_batch and row[INTERACTIVE] != 0.0 and held + nodes <= conf[11] and nodes <= conf[12]:
            p += conf[6]
        out[k] = p
    return out


@numba.njit(cache=True, nogil=True, inline="always")
def _before(prio: NDArray[np.float64], rows: NDArray[np.float64], a: int, b: int) -> bool:  # pragma: no cover
    """Whether queue entry a comes before b in UBIS order: higher priority, then earlier
    submission, then earlier place in the queue (what `policies.ubis_order` gives)."""
    if prio[a] != prio[b]:
        return prio[a] > prio[b]
    if rows[a, SUBMIT] != rows[b, SUBMIT]:
        return rows[a, SUBMIT] < rows[b, SUBMIT]
    return a < b


@numba.njit(cache=True, nogil=True)
def ubis_leading(
    rows: NDArray[np.float64],
    queue: NDArray[np.int64],
    now: float,
    free_nodes: int,
    free_by_os: NDArray[np.int64],
    interactive_held: int,
    target: NDArray[np.float64],
    usage: NDArray[np.float64],
    conf: NDArray[np.float64],
    may_preempt: bool,
    jobs_out: NDArray[np.int64],
    entries_out: NDArray[np.int64],
    prio_out: NDArray[np.float64],
) -> int:  # pragma: no cover - compiled
    """The part of the UBIS order of `queue` a scheduling pass can act on.

    `rows[k]` holds the columns of job `queue[k]` (the simulator's queue keeps that copy so
    that a pass reads its rows in sequence; see simulator/queue_rows.py).

    Why not the whole order: sorting ~750 jobs at each of ~170,000 passes was most of a
    replay. A pass starts a job only if it fits the free nodes (`nodes <= free_nodes`) or, when
    `may_preempt`, if it is an interactive job within the cap; every other job can only be the
    head (the first job that cannot start, which gets the EASY reservation) or count towards
    the backfill depth. So the answer is every such candidate job plus the first other job
    (the latest possible head), in UBIS order (`policies.ubis_order`'s). Written to the
    buffers (room for the whole queue; returning fresh arrays costs a boxing per call): the
    first m entries of `jobs_out` (job indices) and `entries_out` (their places in `queue`),
    and in `prio_out` every queued job's priority, from which `within_depth` places any of
    them in the full order when the backfill depth needs it. Returns m.
    """
    n = queue.shape[0]
    prio = queue_priorities(
        rows, np.arange(n), now, free_nodes, free_by_os, interactive_held, target, usage, conf, False
    )
    pick = np.zeros(n, dtype=np.bool_)
    barrier = -1
    for k in range(n):
        nodes = rows[k, NODES]
        if nodes <= free_nodes or (
            may_preempt and rows[k, INTERACTIVE] != 0.0 and interactive_held + nodes <= conf[11]
        ):
            pick[k] = True
        elif barrier < 0 or _before(prio, rows, k, barrier):
            barrier = k
    if barrier >= 0:
        pick[barrier] = True
    chosen = np.flatnonzero(pick)
    m = chosen.shape[0]
    if m > 16:  # by priority first; the insertion sort below then only settles ties
        key = np.empty(m, dtype=np.float64)
        for i in range(m):
            key[i] = -prio[chosen[i]]
        chosen = chosen[np.argsort(key)]
    for i in range(1, m):
        entry = chosen[i]
        at = i - 1
        while at >= 0 and _before(prio, rows, entry, chosen[at]):
            chosen[at + 1] = chosen[at]
            at -= 1
        chosen[at + 1] = entry
    for i in range(m):
        jobs_out[i] = queue[chosen[i]]
        entries_out[i] = chosen[i]
    prio_out[:n] = prio
    return m


@numba.njit(cache=True, nogil=True)
def _place(rows: NDArray[np.float64], prio: NDArray[np.float64], entry: int) -> int:  # pragma: no cover
    before = 0
    for k in range(prio.shape[0]):
        if _before(prio, rows, k, entry):
            before += 1
    return before


@numba.njit(cache=True, nogil=True)
def within_depth(
    rows: NDArray[np.float64], prio: NDArray[np.float64], head: int, later: NDArray[np.int64], depth: int
) -> int:  # pragma: no cover - compiled
    """How many of the queue entries `later` (in UBIS order, all after entry `head`) lie
    within `depth` places after `head` in the full order of the queue `ubis_leading` rated:
    a prefix, since places grow along `later`. Counting a place reads the whole queue, so the
    last entry is tried first (usually all are within) and the cut is found by bisection."""
    count = later.shape[0]
    if count == 0:
        return 0
    limit = _place(rows, prio, head) + depth
    if _place(rows, prio, later[count - 1]) <= limit:
        return count
    low, high = 0, count - 1  # later[high] is beyond the window; find the first such entry
    while low < high:
        mid = (low + high) // 2
        if _place(rows, prio, later[mid]) <= limit:
            low = mid + 1
        else:
            high = mid
    return low
