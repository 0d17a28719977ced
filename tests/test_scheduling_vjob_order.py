"""The simulator's compiled vjob order is `policies.vjob_order`, permutation for permutation.

Why: `simulator/vjob_order.py` replaces a whole-queue `np.lexsort` at every pass by a linear
split into tiers that sorts a tier only when it is out of (submission, job) or priority
order; a queue where every tier is out of order (random submissions, requeued jobs, equal
times, equal priorities) must still give `lexsort`'s permutation by tier, priority,
submission and job index, and the guard must be the first batch job of it.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from preemption.scheduling.policies import vjob_order
from simulator.engine import simulate
from simulator.metrics import summary
from simulator.replay import ClusterModel
from simulator.vjob_order import AHEAD_OFF, AHEAD_QUEUE, backfill_window, vjob_queue_order
from simulator.workload import Workload
from vjob.config import PriorityConfig, SchedulingConfig

QUEUE = st.lists(
    st.tuples(
        st.sampled_from([0.0, 1.0, 2.0, 5.0, 7.5]),  # submit: few values, many ties
        st.booleans(),  # interactive
        st.integers(1, 6),  # nodes
        st.integers(0, 2),  # times preempted
        st.sampled_from([0.0, 0.25, 0.5, 0.5, 0.75]),  # UBIS priority: few values, many ties
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(QUEUE, st.integers(0, 8), st.booleans(), st.randoms(use_true_random=False))
def test_the_compiled_order_is_vjob_order(queue: list, held: int, ahead: bool, rnd) -> None:
    n = len(queue)
    submit = np.array([q[0] for q in queue])
    inter = np.array([q[1] for q in queue])
    need = np.array([q[2] for q in queue], dtype=np.int64)
    pc = np.array([float(q[3]) for q in queue])
    prio_of_job = np.array([q[4] for q in queue])
    qjobs = np.arange(n, dtype=np.int64)
    rnd.shuffle(qjobs)  # queue order is not job order once jobs are requeued
    cap = 8.0
    priv = inter[qjobs] & (held + need[qjobs] <= cap)
    prio = prio_of_job[qjobs]
    want = qjobs[vjob_order(submit[qjobs], priv, pc[qjobs] > 0, inter[qjobs] if ahead else None, prio, qjobs)]
    out = np.full(n, -7, dtype=np.int64)
    ahead_mode = AHEAD_QUEUE if ahead else AHEAD_OFF
    scratch = np.full(n, np.nan)
    guard = vjob_queue_order(
        qjobs, inter, need, pc, submit, prio, held, cap, ahead_mode, out, np.empty(n, np.int64), scratch
    )
    assert out.tolist() == want.tolist()
    batch = [int(j) for j in want if not inter[j]]
    assert guard == (batch[0] if batch else -1)


@settings(max_examples=200, deadline=None)
@given(QUEUE, st.integers(0, 40), st.booleans(), st.integers(-1, 10), st.booleans())
def test_the_backfill_window_is_the_numpy_steps(queue: list, start: int, first: bool, depth: int, hard: bool) -> None:
    inter = np.array([q[1] for q in queue])
    order = np.arange(len(queue), dtype=np.int64)[::-1].copy()
    rest = order[start:]
    if first:
        rest = np.concatenate((rest[inter[rest]], rest[~inter[rest]]))
    if depth >= 0:
        rest = rest[:depth]
    if hard:
        rest = rest[~inter[rest]]
    out = np.empty(len(queue), dtype=np.int64)
    count = backfill_window(order, start, inter, first, depth, hard, out)
    assert out[:count].tolist() == rest.tolist()


def test_admitted_interactive_jobs_wait_only_while_they_fit_under_the_cap() -> None:
    """`interactive_admitted` measures the wait the policy imposes while a job fits under the
    cap (victims' checkpoints), not the wait for cap room that the within-cap mean includes."""
    # hard cap of 16 of 64 nodes: B fits only when A ends at 1000 s, and starts on free nodes
    w = Workload.from_columns(
        {
            "submit": [0.0, 10.0],
            "runtime": [1000.0, 100.0],
            "walltime": [1000.0, 100.0],
            "nodes": [16, 8],
            "interactive": [True, True],
        }
    )
    r = simulate(w, ClusterModel(nodes=64, os_count=1), "vjob", PriorityConfig(interactive_cap=0.25), cap_mode="hard")
    assert r.fit_wait.tolist() == [0.0, 0.0] and r.first_start.tolist() == [0.0, 1000.0]
    doc = summary(r)
    assert doc["interactive_within_cap_mean_wait_s"] == 495.0
    assert doc["interactive_admitted"]["mean_wait_s"] == 0.0 and doc["interactive_admitted"]["count"] == 2
    # a batch job holds the machine: the interactive job fits at once and waits for its
    # victim's checkpoint (4096 MB per node at 500 MB/s)
    w = Workload.from_columns(
        {
            "submit": [0.0, 10.0],
            "runtime": [5000.0, 100.0],
            "walltime": [5000.0, 100.0],
            "nodes": [64, 8],
            "interactive": [False, True],
        }
    )
    r = simulate(w, ClusterModel(nodes=64, os_count=1), "vjob", PriorityConfig(interactive_cap=0.25))
    adm = summary(r)["interactive_admitted"]
    assert adm["count"] == 1 and adm["mean_wait_s"] == 4096 / 500 and adm["within_60s"] == 1.0


def test_an_interactive_job_that_loses_the_cap_room_stops_counting_its_admitted_wait() -> None:
    """A hand-made schedule (64 nodes, cap 16, no preemption): batch A holds 56 nodes until
    1,000 s; interactive B (12 nodes, at 10 s) fits the cap but not the 8 free nodes, and
    reserves; interactive C (8 nodes, at 20 s, 500 s) backfills into them and takes the cap
    room B needs until it ends at 520 s; B starts at 1,000 s. B waited 990 s, of which it
    fitted under the cap 10 s + 480 s: its admitted wait is 490 s, not the 990 s counted from
    its first fit (the figure before this test) or from its submission."""
    w = Workload.from_columns(
        {
            "submit": [0.0, 10.0, 20.0],
            "runtime": [1000.0, 100.0, 500.0],
            "walltime": [1000.0, 100.0, 500.0],
            "nodes": [56, 12, 8],
            "interactive": [False, True, True],
        }
    )
    r = simulate(
        w,
        ClusterModel(nodes=64, os_count=1),
        "vjob",
        PriorityConfig(interactive_cap=0.25),
        scheduling=SchedulingConfig(max_preemptions=0),
    )
    assert r.first_start.tolist() == [0.0, 1000.0, 20.0] and r.ran_privileged.tolist() == [False, True, True]
    assert r.fit_wait.tolist()[1:] == [490.0, 0.0]
    doc = summary(r)
    assert doc["interactive_admitted"]["mean_wait_s"] == 245.0 and doc["interactive_admitted"]["within_60s"] == 0.5
    assert doc["interactive_within_cap_mean_wait_s"] == 495.0
