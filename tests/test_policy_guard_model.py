"""bench/policy_guard_model.py and the `faithful` prototype of bench/policy_prototypes.py
(issue 34 item 5): the faithful model of a victim's return agrees with the guard's own where
the victim can only come back when its preemptor ends, and differs both ways where other
nodes free first; watching the guard's checks does not change the replay."""

from __future__ import annotations

import pytest

from preemption.scheduling.guard import reserved_after
from simulator.engine import simulate
from simulator.lublin import generate
from simulator.metrics import schedule_digest
from simulator.replay import ClusterModel
from simulator.setup import UbisSetup, apply
from tests import bench_scripts
from vjob.config import PriorityConfig, SchedulingConfig

# A full machine: the victim (10 nodes, its estimate ends at 1,000 s, a 10 s checkpoint) and
# an interactive job of 4 nodes that takes 4 of the victim's nodes and runs 500 s once the
# checkpoint is written (ends at 510 s); the 6 other nodes are free again at 10 s.
VICTIM = [(1000.0, 10, 10.0)]
END, READY, NODES = 510.0, 10.0, 4


def _both(need: int, other: tuple[float, int]) -> tuple[float, float]:
    proto = bench_scripts.load("policy_prototypes")
    holds = [(1000.0, 10), other]
    today = reserved_after(0.0, 0, need, holds, VICTIM, 0, END)
    faithful = proto.faithful_after(0.0, 0, need, holds, VICTIM, 0, END, NODES, READY)
    return today, faithful


def test_a_victim_that_can_only_return_when_its_preemptor_ends_is_modelled_alike() -> None:
    # the other 10 nodes free at 5,000 s: the victim needs its 10 back, so it resumes at 510 s
    today, faithful = _both(12, (5000.0, 10))
    assert today == faithful == 5000.0


def test_a_victim_resuming_early_on_other_nodes_moves_the_guard_both_ways() -> None:
    # 10 other nodes free at 200 s: the victim resumes there (ahead of the guard) and is done
    # at 200 + 1,000 + 2 x 10 s, not 1,530 s: a 12-node guard starts sooner than today's model says
    today, faithful = _both(12, (200.0, 10))
    assert (today, faithful) == (1530.0, 1220.0)
    # a 10-node guard would have had those nodes at 200 s; the victim takes them, so it waits
    # for the interactive job's end instead
    today, faithful = _both(10, (200.0, 10))
    assert (today, faithful) == (200.0, 510.0)


def test_watching_the_guard_changes_nothing_and_counts_its_checks() -> None:
    bench = bench_scripts.load("policy_guard_model")
    w = apply(generate(128, 1500, seed=3, load=0.9), 128, UbisSetup(0.2, 12.0, os_count=2, seed=1))
    model, prio = ClusterModel(nodes=128), PriorityConfig(interactive_cap=0.15)
    sim = bench.Watched(w, model, "vjob", prio, scheduling=SchedulingConfig())
    sim.checks = []
    watched = sim.run()
    assert schedule_digest(watched) == schedule_digest(simulate(w, model, "vjob", prio))
    out = bench.report(sim)
    assert out["made"] > 0 and out["refused"] > 0
    assert out["made"] + out["refused"] <= out["checks"] == len(sim.checks)
    assert out["refused_faithful_would_pass"] + out["made_faithful_would_refuse"] <= out["faithful_decides_otherwise"]


def test_each_new_prototype_replays_every_job_and_changes_the_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    """The prototypes the second round measured (docs/policy.md) run a whole replay (the
    simulator refuses one that leaves jobs queued) and are not the plain pass in disguise."""
    from simulator import engine_pass, engine_preempt

    proto = bench_scripts.load("policy_prototypes")
    w = apply(generate(128, 1500, seed=3, load=0.9), 128, UbisSetup(0.2, 12.0, os_count=2, seed=1))
    model, prio = ClusterModel(nodes=128), PriorityConfig(interactive_cap=0.15)
    sched = SchedulingConfig(tier_order="ubis-interactive")
    plain = schedule_digest(simulate(w, model, "vjob", prio, scheduling=sched))
    patches = {
        "walk=1": (engine_pass.SchedulingPass, "_walk", proto._walk_reserving_soon(1.0)),
        "faithful": (engine_preempt.Preempting, "_keeps_guard", proto._faithful_keeps_guard),
        "ckpt=short": (engine_pass.SchedulingPass, "_vjob_order", proto._checkpointed_by("short")),
        "bf=short": (engine_pass.SchedulingPass, "_backfill", proto._backfill_shortest),
    }
    for name, (cls, method, fn) in patches.items():
        with monkeypatch.context() as m:
            m.setattr(cls, method, fn)
            assert schedule_digest(simulate(w, model, "vjob", prio, scheduling=sched)) != plain, name
