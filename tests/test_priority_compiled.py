"""The simulator's compiled UBIS kernel gives exactly the checked kernel's priorities, and its
partial order gives exactly what the full UBIS order gives a scheduling pass."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preemption.scheduling.policies import ubis_order
from tests.priority_views import configs, views
from ubis_priority import compute_arrays
from ubis_priority.compiled import (
    COLUMNS,
    INTERACTIVE,
    NODES,
    OS,
    PREEMPT_COUNT,
    PREEMPTED_S,
    SHARE,
    SINCE,
    SUBMIT,
    numpy_sum,
    queue_priorities,
    scalars,
    ubis_leading,
    within_depth,
)
from ubis_priority.view import arrays_from_view
from vjob.config import PriorityConfig

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _columns(jobs) -> np.ndarray:
    cols = np.empty((len(jobs), len(COLUMNS)))
    cols[:, SUBMIT] = jobs.submit_time
    cols[:, NODES] = jobs.nodes
    cols[:, OS] = jobs.os_index
    cols[:, PREEMPT_COUNT] = jobs.preempt_count
    cols[:, PREEMPTED_S] = jobs.preempted_s
    cols[:, SINCE] = np.nan
    cols[:, INTERACTIVE] = jobs.interactive
    cols[:, SHARE] = jobs.share_index
    return cols


def _engine_usage(cluster):
    """The view's usage shares as the engine holds usage (node-seconds per entity), and the
    shares compute_arrays must then be given (node-seconds over their NumPy sum)."""
    raw = cluster.usage * 3.5e6
    total = float(raw.sum())
    return raw, raw / total if total > 0 else np.zeros_like(raw)


@SETTINGS
@given(views(), configs, st.none() | st.floats(0, 5e5))
def test_compiled_priorities_equal_compute_arrays_to_the_last_bit(view, cfg, open_for):
    """Same priorities from the same state. The engine's form of that state: usage as raw
    node-seconds, Pt split into closed time plus a preemption open since `now - open_for`
    (compute_arrays is given the sum, as the engine computed it before), no per-user
    holdings (the per-user cap counts the job alone)."""
    _, jobs, cluster = arrays_from_view(view, cfg)
    cluster = replace(cluster, user_interactive_held=np.zeros_like(cluster.user_interactive_held))
    raw_usage, shares = _engine_usage(cluster)
    cols = _columns(jobs)
    pt = jobs.preempted_s
    if open_for is not None:
        since = cluster.now - open_for
        cols[:, SINCE] = since
        pt = jobs.preempted_s + (cluster.now - since)
    checked = compute_arrays(replace(jobs, preempted_s=pt), replace(cluster, usage=shares), cfg).priority
    got = queue_priorities(
        cols,
        np.arange(len(jobs), dtype=np.int64),
        cluster.now,
        cluster.free_nodes,
        cluster.free_by_os,
        cluster.interactive_held,
        cluster.target,
        raw_usage,
        scalars(cfg, cluster.total_nodes),
        False,
    )
    assert got.tobytes() == checked.tobytes()


def test_compiled_sum_is_numpys_to_the_last_bit():
    rng = np.random.default_rng(0)
    for n in [*range(300), 1000, 4095, 8192, 9000, 20000]:
        values = rng.random(n) * 10 ** rng.uniform(-5, 9, n)
        assert numpy_sum(values) == float(values.sum()), n


def test_as_batch_drops_the_interactive_term_only():
    cfg = PriorityConfig(interactive_cap=0.5)
    cols = np.zeros((2, len(COLUMNS)))
    cols[:, NODES] = 4
    cols[:, SINCE] = math.nan
    cols[0, INTERACTIVE] = 1.0
    args = (np.arange(2, dtype=np.int64), 100.0, 10, np.array([5, 5]), 0)
    share = (np.array([1.0]), np.array([0.0]), scalars(cfg, 16))
    as_queued = queue_priorities(cols, *args, *share, False)
    as_batch = queue_priorities(cols, *args, *share, True)
    assert as_queued[0] - as_batch[0] == cfg.weights.interactive
    assert as_queued[1] == as_batch[1]


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 60),
    st.integers(0, 2**32 - 1),
    st.integers(0, 40),
    st.integers(0, 30),
    st.booleans(),
)
def test_leading_part_is_the_full_order_where_a_pass_can_act(n, seed, free, held, may_preempt):
    """Every job that fits the free nodes (or may preempt), plus the first job that cannot,
    in the full order's sequence and at its positions; nothing else."""
    rng = np.random.default_rng(seed)
    total_nodes = 64
    cfg = PriorityConfig(interactive_cap=0.5)
    cols = np.zeros((n + 5, len(COLUMNS)))
    # coarse values so that equal priorities and equal submit times occur
    cols[:, SUBMIT] = rng.integers(0, 4, n + 5) * 1000.0
    cols[:, NODES] = rng.integers(1, 40, n + 5)
    cols[:, OS] = rng.integers(0, 2, n + 5)
    cols[:, PREEMPT_COUNT] = rng.integers(0, 2, n + 5)
    cols[:, SINCE] = math.nan
    cols[:, INTERACTIVE] = rng.random(n + 5) < 0.3
    queue = rng.permutation(n + 5)[:n].astype(np.int64)
    args = (
        5000.0,
        free,
        np.array([free // 2, free - free // 2]),
        held,
        np.array([0.5]),
        np.array([0.0]),
        scalars(cfg, total_nodes),
    )
    prio = queue_priorities(cols, queue, *args, False)
    full = queue[ubis_order(prio, cols[queue, SUBMIT])]
    rows = cols[queue]
    out = (np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64), np.empty(n))
    m = ubis_leading(rows, queue, *args, may_preempt, *out)
    jobs, entries, got_prio = out[0][:m], out[1][:m], out[2]
    assert got_prio.tobytes() == prio.tobytes()
    assert np.array_equal(queue[entries], jobs)
    place = {int(j): k for k, j in enumerate(full)}
    assert all(place[int(a)] < place[int(b)] for a, b in itertools.pairwise(jobs))
    # the backfill window: how many later entries lie within `depth` places of a head
    for h in range(len(jobs)):
        for depth in (0, 1, 3, 10):
            inside = sum(place[int(j)] <= place[int(jobs[h])] + depth for j in jobs[h + 1 :])
            assert within_depth(rows, got_prio, int(entries[h]), entries[h + 1 :], depth) == inside
    nodes = cols[full, NODES]
    can_act = (nodes <= free) | (
        may_preempt & (cols[full, INTERACTIVE] != 0) & (held + nodes <= cfg.interactive_cap * total_nodes)
    )
    want = set(full[can_act].tolist())
    if not can_act.all():
        want.add(int(full[np.flatnonzero(~can_act)[0]]))
    assert set(jobs.tolist()) == want
