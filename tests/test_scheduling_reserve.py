"""vjob's interactive reserve (`[scheduling] interactive_reserve_nodes`) over whole replays:
every job finishes (a prototype stopped waking its passes up and left most jobs queued), the
reserve is really kept free while the cap has room, and a replay that stops waking up is an
error instead of a set of means over the jobs that happened to finish."""

from __future__ import annotations

import numpy as np
import pytest

from preemption.scheduling.reserve import need_beside, recent_interactive, reserve_asked, reserve_nodes
from simulator.engine import Simulation, simulate
from simulator.replay import ClusterModel
from simulator.workload import Workload
from vjob.config import Config, PriorityConfig, SchedulingConfig


def _mixed(n: int = 400, seed: int = 5) -> Workload:
    """Batch jobs up to the whole machine (some larger than the machine minus any reserve)
    and small interactive jobs, arriving faster than 64 nodes can serve."""
    rng = np.random.default_rng(seed)
    inter = rng.random(n) < 0.3
    nodes = np.where(inter, rng.integers(1, 6, n), rng.choice([1, 2, 4, 8, 16, 32, 60, 64], n))
    runtime = rng.uniform(50, 4000, n).round()
    return Workload.from_columns(
        {
            "submit": np.sort(rng.uniform(0, 40_000, n)).round(),
            "runtime": runtime,
            "walltime": (runtime * rng.uniform(1.0, 3.0, n)).round(),
            "nodes": nodes,
            "interactive": inter,
        }
    )


def test_reserve_arithmetic() -> None:
    assert reserve_nodes(0, 10.0, 0) == 0
    assert reserve_nodes(4, 10.0, 0) == 4
    assert reserve_nodes(4, 9.6, 7) == 2  # only the cap's room (2.6 nodes: 2 whole ones)
    assert reserve_nodes(4, 9.6, 12) == 0
    assert need_beside(5, 0, 8) == 5
    assert need_beside(5, 2, 8) == 7
    assert need_beside(6, 2, 8) == 8
    assert need_beside(7, 2, 8) == 7  # it could never leave the reserve: not held to it


@pytest.mark.parametrize("reserve", [2, 8, 64])
def test_every_job_finishes_with_the_reserve(reserve: int) -> None:
    w, model = _mixed(), ClusterModel(nodes=64, os_count=1)
    cap = PriorityConfig(interactive_cap=0.15)
    res = simulate(w, model, "vjob", cap, scheduling=SchedulingConfig(interactive_reserve_nodes=reserve))
    assert not np.isnan(res.end).any()
    assert (res.workload.nodes > 64 - reserve).any()  # jobs the uncapped reserve would block forever
    base = simulate(w, model, "vjob", cap)
    # the reserve changes the schedule (it is not a knob that does nothing here)
    assert not np.array_equal(res.first_start, base.first_start)


@pytest.mark.parametrize("arrivals", [1, 3])
def test_every_job_finishes_with_the_adaptive_reserve(arrivals: int) -> None:
    """`interactive_reserve_arrivals`: held only while that many recent interactive jobs are
    queued or running. Every job finishes, and the schedule lies strictly between no reserve
    and the fixed one (it is neither)."""
    w, model = _mixed(), ClusterModel(nodes=64, os_count=1)
    cap = PriorityConfig(interactive_cap=0.15)
    adaptive = SchedulingConfig(interactive_reserve_nodes=8, interactive_reserve_arrivals=arrivals)
    res = simulate(w, model, "vjob", cap, scheduling=adaptive)
    assert not np.isnan(res.end).any()
    fixed = simulate(w, model, "vjob", cap, scheduling=SchedulingConfig(interactive_reserve_nodes=8))
    base = simulate(w, model, "vjob", cap)
    assert not np.array_equal(res.first_start, fixed.first_start)
    assert not np.array_equal(res.first_start, base.first_start)


def test_reserve_held_only_while_interactive_jobs_arrive() -> None:
    assert recent_interactive([], 100.0, 50.0) == 0
    assert recent_interactive([10.0, 50.0, 51.0, 100.0], 100.0, 50.0) == 2  # (50, 100]
    assert reserve_asked(8, 0, 0) == 8  # 0: always, the fixed reserve
    assert reserve_asked(8, 2, 1) == 0
    assert reserve_asked(8, 2, 2) == 8


def test_the_reserve_is_free_after_every_pass() -> None:
    """After each pass, the free nodes are at least the reserve the cap leaves room for, unless
    a job larger than the machine minus the reserve was just started or nothing runs: a
    batch or over-cap start never eats it."""
    w, model = _mixed(), ClusterModel(nodes=64, os_count=1)
    sim = Simulation(
        w, model, "vjob", PriorityConfig(interactive_cap=0.15), scheduling=SchedulingConfig(interactive_reserve_nodes=6)
    )
    schedule = sim._schedule
    checked = 0

    def watched(now: float) -> None:
        nonlocal checked
        before = set(sim.cluster.running)
        schedule(now)
        new = set(sim.cluster.running) - before
        kept = reserve_nodes(6, sim.rules.cap_nodes, sim.cluster.held_interactive)
        eaten = [j for j in new if not sim.out.privileged[j]]
        if eaten and sim.cluster.free < kept:
            # only allowed for a job that needs the machine minus less than the reserve
            assert any(sim.jobs.need[j] + kept > model.nodes for j in eaten), (now, sim.cluster.free, kept)
        checked += bool(new)

    sim._schedule = watched  # type: ignore[method-assign]
    res = sim.run()
    assert not np.isnan(res.end).any() and checked > 50


def test_a_replay_that_stops_waking_up_is_an_error() -> None:
    """What the broken prototype did: passes that stop firing leave jobs queued; `run` now
    raises instead of returning means over the finished ones."""
    sim = Simulation(_mixed(60), ClusterModel(nodes=64, os_count=1), "vjob", PriorityConfig(interactive_cap=0.15))
    sim._may_start = lambda: sim.cluster.free >= 64  # type: ignore[method-assign]  # passes only on an empty machine
    sim.cluster.running.clear()
    original = sim._schedule

    def once(now: float) -> None:  # and then never again: the wake-ups the prototype lost
        original(now)
        sim._may_start = lambda: False  # type: ignore[method-assign]

    sim._schedule = once  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="jobs unfinished"):
        sim.run()


def test_the_reserve_key_is_validated() -> None:
    with pytest.raises(ValueError, match="interactive_reserve_nodes"):
        Config.model_validate({"scheduling": {"interactive_reserve_nodes": -1}})
    assert (
        Config.model_validate({"scheduling": {"interactive_reserve_nodes": 8}}).scheduling.interactive_reserve_nodes
        == 8
    )
