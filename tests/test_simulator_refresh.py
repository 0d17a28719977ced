"""`priority_refresh_s`: the exact replay by default, a valid (different) schedule when set."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.engine import simulate
from simulator.lublin import generate
from simulator.replay import ClusterModel, Result
from simulator.setup import UbisSetup, apply
from simulator.workload import Workload
from vjob.config import PriorityConfig
from vjob.errors import InputError

NODES = 96
CAP = 0.15


@pytest.fixture(scope="module")
def workload() -> Workload:
    base = generate(NODES, 900, seed=11, load=0.9)
    return apply(base, NODES, UbisSetup(interactive_frac=0.25, interactive_mean_size=10, seed=11))


def replay(workload: Workload, refresh: float) -> Result:
    model = ClusterModel(nodes=NODES, priority_refresh_s=refresh)
    return simulate(workload, model, "ubis", PriorityConfig(interactive_cap=CAP))


def same_schedule(a: Result, b: Result) -> bool:
    return (
        a.segments == b.segments
        and np.array_equal(a.first_start, b.first_start)
        and np.array_equal(a.end, b.end)
        and np.array_equal(a.preempt_count, b.preempt_count)
    )


def test_a_refresh_shorter_than_any_gap_between_passes_is_the_exact_replay(workload: Workload):
    # every pass is at a later instant, so every pass recomputes every priority
    exact = replay(workload, 0.0)
    assert exact.preemptions > 0
    assert same_schedule(exact, replay(workload, 1e-9))


def test_a_long_refresh_gives_a_different_but_valid_schedule(workload: Workload):
    exact, stale = replay(workload, 0.0), replay(workload, 3600.0)
    assert not same_schedule(exact, stale)
    w = stale.workload
    assert not np.isnan(stale.end).any()
    assert (stale.first_start >= w.submit).all()
    total = np.zeros(len(w))
    for j, start, end, _ in stale.segments:
        assert start >= w.submit[j] and end > start
        total[j] += end - start
    np.testing.assert_allclose(total, w.runtime + stale.overhead_s, rtol=0, atol=1e-6)
    points = sorted([(s, n) for _, s, _, n in stale.segments] + [(e, -n) for _, _, e, n in stale.segments])
    busy = 0
    for _, delta in points:
        busy += delta
        assert busy <= NODES
    assert stale.max_interactive_held <= CAP * NODES


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan")])
def test_a_bad_refresh_is_refused_naming_the_option(bad: float):
    with pytest.raises(InputError, match="--priority-refresh"):
        ClusterModel(nodes=4, priority_refresh_s=bad)
