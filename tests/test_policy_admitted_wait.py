"""bench/policy_admitted_wait.py files every second of the admitted wait under a reason:
the parts must add up to the metric it explains, and watching must not change the replay."""

from __future__ import annotations

import numpy as np

from simulator.engine import simulate
from simulator.lublin import generate
from simulator.metrics import schedule_digest
from simulator.replay import ClusterModel
from simulator.setup import UbisSetup, apply
from tests import bench_scripts
from vjob.config import PriorityConfig, SchedulingConfig


def test_the_breakdown_adds_up_to_the_admitted_wait_and_changes_nothing() -> None:
    bench = bench_scripts.load("policy_admitted_wait")
    w = apply(generate(128, 1500, seed=3, load=0.9), 128, UbisSetup(0.2, 12.0, os_count=2, seed=1))
    model, prio = ClusterModel(nodes=128), PriorityConfig(interactive_cap=0.15)
    sim = bench.Watched(w, model, "vjob", prio, scheduling=SchedulingConfig())
    watched = sim.run()
    assert schedule_digest(watched) == schedule_digest(simulate(w, model, "vjob", prio))
    jobs = bench.admitted_jobs(watched)
    total = bench.breakdown(sim, jobs)
    assert jobs and set(total) <= set(bench.REASONS)
    assert np.isclose(sum(total.values()), watched.fit_wait[jobs].sum(), rtol=1e-9, atol=1e-6)
    # A loaded machine: the guard refuses some preemptions, and that is where time goes.
    assert sum(v for k, v in total.items() if k.startswith("guard")) > 0
    assert sim.refusals["guard_moved"] + sim.refusals["guard_past_slack"] > 0
