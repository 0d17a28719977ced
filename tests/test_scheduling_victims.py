"""Victim selection and the EASY core, on ClusterViews and numbers small enough to check by hand."""

from __future__ import annotations

import pytest

from preemption.scheduling.easy import backfill, reservation
from preemption.scheduling.tick import Decision, decide
from preemption.scheduling.victims import (
    Candidate,
    choose_victims,
    interactive_cap_allows,
    running_priorities,
    select_victims,
)
from ubis_priority.interactive import cap_limit, within_cap
from vjob.config import Config, PriorityConfig
from vjob.errors import InputError
from vjob.model import VM, ClusterView, Job, JobClass, JobState, Node


def c(job_id: str, prio: float, nodes: int, on_os: int = 0, mem: float = 1.0) -> Candidate:
    return Candidate(job_id, prio, nodes, on_os, mem)


def test_lowest_priority_first_until_enough_nodes():
    got = choose_victims(3, [c("a", 0.5, 2), c("b", 0.1, 2), c("c", 0.3, 2)])
    assert [v.job_id for v in got] == ["b", "c"]


def test_victims_not_needed_after_all_are_released():
    # b (1 node) is taken first, then c (4 nodes) alone covers 4: b is released again.
    got = choose_victims(4, [c("b", 0.1, 1), c("c", 0.2, 4), c("d", 0.9, 4)])
    assert [v.job_id for v in got] == ["c"]


def test_equal_priority_prefers_the_os_then_the_cheaper_checkpoint():
    cands = [c("far", 0.2, 2, on_os=0, mem=1.0), c("near", 0.2, 2, on_os=2, mem=9.0), c("cheap", 0.2, 2, 0, 0.5)]
    assert [v.job_id for v in choose_victims(2, cands)] == ["near"]
    cands = [c("far", 0.2, 2, on_os=0, mem=1.0), c("cheap", 0.2, 2, 0, 0.5)]
    assert [v.job_id for v in choose_victims(2, cands)] == ["cheap"]


def test_not_enough_preemptible_nodes_or_nothing_needed():
    assert choose_victims(5, [c("a", 0.1, 2), c("b", 0.1, 2)]) is None
    assert choose_victims(0, [c("a", 0.1, 2)]) == []


def test_interactive_cap_is_the_one_rule_of_ubis_priority():
    assert interactive_cap_allows(0, 52, 1056, 0.05)
    assert not interactive_cap_allows(0, 53, 1056, 0.05)
    assert not interactive_cap_allows(40, 13, 1056, 0.05)
    assert interactive_cap_allows(1000, 56, 1056, None)
    # 0.29 × 100 is 28.999999999999996 in floating point: the kernel (I term), the simulator
    # and victim selection all admit 28 nodes, not 29 (victim selection used to round up to
    # 29, so an interactive job could preempt with its I term already taken away).
    assert 0.29 * 100 < 29
    assert interactive_cap_allows(0, 28, 100, 0.29)
    assert not interactive_cap_allows(0, 29, 100, 0.29)
    assert within_cap(0.0, 29.0, cap_limit(0.29, 100)) is False


def test_reservation_and_backfill_by_hand():
    # 2 free now; running jobs free 2 nodes at 100 and 4 at 300; head needs 5.
    shadow, extra = reservation(0.0, 2, 5, [(300.0, 4), (100.0, 2)])
    assert (shadow, extra) == (300.0, 3)
    assert reservation(0.0, 6, 5, []) == (0.0, 1)
    assert reservation(0.0, 1, 5, [(10.0, 1)]) == (float("inf"), 0)
    # candidates: 0 ends in time (2 nodes), 1 too long but fits the extra nodes only if <= 3
    started = backfill(0.0, 2, 300.0, 1, [0, 1, 2], [2, 1, 1], [250.0, 1000.0, 10.0])
    assert started == [0]  # takes both free nodes; 1 and 2 find none left
    started = backfill(0.0, 3, 300.0, 1, [0, 1, 2], [1, 1, 1], [1000.0, 1000.0, 10.0])
    assert started == [0, 2]  # 1 would need a second extra node
    assert backfill(0.0, 5, 300.0, 5, [0, 1], [1, 1], [1.0, 1.0], depth=1) == [0]


# -- ClusterView level ----------------------------------------------------------------------
def view(**kw) -> ClusterView:
    nodes = tuple(Node(f"n{i}", cpus=4, memory_mb=8192, os_image="debian" if i < 2 else "rocky") for i in range(4))
    jobs = (
        Job(
            "old",
            "alice",
            nodes=2,
            submit_time=0,
            start_time=10,
            state=JobState.RUNNING,
            walltime=5000,
            allocated_nodes=("n0", "n1"),
            os_image="debian",
            memory_mb=1024,
        ),
        Job(
            "new",
            "bob",
            nodes=2,
            submit_time=500,
            start_time=600,
            state=JobState.RUNNING,
            walltime=5000,
            allocated_nodes=("n2", "n3"),
            os_image="rocky",
            memory_mb=1024,
        ),
        Job("int", "carol", job_class=JobClass.INTERACTIVE, nodes=2, submit_time=900, os_image="debian"),
    )
    return ClusterView(now=1000, nodes=nodes, jobs=kw.get("jobs", jobs), images=("debian", "rocky"))


def test_select_victims_takes_the_lowest_priority_running_job():
    v = view()
    choice = select_victims(v, v.job("int"), {"old": 0.6, "new": 0.3})
    assert choice is not None
    assert choice.victims == ("new",) and choice.nodes == ("n2", "n3")
    assert choice.os_swaps == 2  # rocky nodes must boot debian
    assert choice.checkpoint_bytes == 2 * 1024 * 1024 * 1024


def test_select_victims_uses_vm_memory_and_refuses_batch_and_caps():
    v = view()
    vms = (VM("vm-new-0", "new", "rocky", memory_mb=512, node="n2"), VM("vm-new-1", "new", "rocky", 512, node="n3"))
    v2 = ClusterView(now=v.now, nodes=v.nodes, jobs=v.jobs, vms=vms, images=v.images)
    choice = select_victims(v2, v2.job("int"), {"old": 0.6, "new": 0.3})
    assert choice is not None and choice.checkpoint_bytes == 1024 * 1024 * 1024
    assert select_victims(v, v.job("old"), {"old": 0.6, "new": 0.3}) is None  # batch never preempts
    assert select_victims(v, v.job("int"), {"old": 0.6, "new": 0.3}, interactive_cap=0.25) is None
    with pytest.raises(InputError, match="running job new has no priority"):
        select_victims(v, v.job("int"), {"old": 0.6})


def test_running_priorities_rank_the_later_job_lower():
    prios = running_priorities(view(), PriorityConfig())
    assert set(prios) == {"old", "new"}
    assert prios["new"] < prios["old"]  # less queue time; everything else equal or in its favour
    choice = select_victims(view(), view().job("int"), prios)
    assert choice is not None and choice.victims == ("new",)


def _decide(v: ClusterView, policy: str, cfg: PriorityConfig) -> Decision:
    return decide(v, Config(priority=cfg), knob=None, checkpointable=None, sleeping={}, policy=policy)


def test_the_one_pass_preempts_under_ubis_and_waits_under_mms():
    cfg = PriorityConfig(interactive_cap=1.0)
    d = _decide(view(), "ubis", cfg)
    assert d.starts == ("int",) and d.preemptions[0].victims == ("new",)
    d = _decide(view(), "mms", cfg)
    assert d.starts == () and d.preemptions == () and d.reserved == "int"


def test_the_one_pass_starts_what_fits_and_backfills():
    nodes = tuple(Node(f"n{i}", cpus=1, memory_mb=1024) for i in range(4))
    jobs = (
        Job(
            "r",
            "u",
            nodes=2,
            submit_time=0,
            start_time=0,
            walltime=100,
            state=JobState.RUNNING,
            allocated_nodes=("n0", "n1"),
        ),
        Job("big", "u", nodes=4, submit_time=1, walltime=50),
        Job("long", "u", nodes=2, submit_time=2, walltime=500),
        Job("short", "u", nodes=2, submit_time=3, walltime=50),
    )
    d = _decide(ClusterView(now=10, nodes=nodes, jobs=jobs), "fcfs-easy", PriorityConfig())
    assert d.starts == ("short",) and d.reserved == "big"
    with pytest.raises(InputError, match="--policy = 'lifo'"):
        _decide(ClusterView(now=10, nodes=nodes, jobs=jobs), "lifo", PriorityConfig())


def test_backfill_follows_the_easy_rule_on_random_queues():
    """Against an oracle written from the rule's statement: walk the candidates in order; one
    starts iff it fits the free nodes and ends before the shadow time or fits the extra nodes;
    never more than `depth` candidates looked at."""
    import numpy as np

    from preemption.scheduling.easy import backfill_arrays

    rng = np.random.default_rng(3)
    for _ in range(300):
        n = int(rng.integers(1, 40))
        keys = rng.permutation(1000)[:n]
        nodes = rng.integers(1, 9, n)
        est = rng.uniform(0, 500, n)
        free, extra = int(rng.integers(0, 20)), int(rng.integers(0, 10))
        shadow = float(rng.uniform(0, 600))
        depth = int(rng.integers(1, 50))
        want: list[int] = []
        f, x = free, extra
        for i in range(min(n, depth)):
            fits = nodes[i] <= f
            in_time = est[i] <= shadow
            if fits and (in_time or nodes[i] <= x):
                want.append(int(keys[i]))
                f -= int(nodes[i])
                x -= 0 if in_time else int(nodes[i])
        got = backfill_arrays(0.0, free, shadow, extra, keys, nodes, est, depth)
        assert got.tolist() == want
        assert backfill(0.0, free, shadow, extra, keys.tolist(), nodes, est, depth=depth) == want
