"""The performance models of ARRIVE-F: computation, blocking and non-blocking communication."""

from __future__ import annotations

import math

import pytest

from preemption.remap.models import (
    Profile,
    SubCluster,
    blocking_time,
    compute_time,
    delta,
    migration_cost_s,
    nonblocking_time,
    thrashing,
)
from vjob.errors import InputError

SLOW = SubCluster("A", 2, 4, 4096, 2.2, latency_us=50, bandwidth_mb_s=110, cycles={"ins": 0.8, "l2": 20.0})
FAST = SubCluster("B", 2, 4, 4096, 3.0, latency_us=50, bandwidth_mb_s=110, cycles={"ins": 0.6, "l2": 15.0})
FASTETH = SubCluster("C", 2, 4, 4096, 3.0, latency_us=100, bandwidth_mb_s=11.5, cycles={"ins": 0.6, "l2": 15.0})


def test_compute_time_is_counters_times_cycles_over_clock() -> None:
    p = Profile(window_s=50, counters={"ins": 1e11, "l2": 1e9})
    assert compute_time(p, SLOW) == pytest.approx((1e11 * 0.8 + 1e9 * 20) / 2.2e9)
    assert compute_time(p, FAST) == pytest.approx((1e11 * 0.6 + 1e9 * 15) / 3.0e9)


def test_blocking_time_uses_each_clusters_latency_per_size() -> None:
    p = Profile(window_s=50, blocking={8: 1000, 1 << 20: 10})
    expect_c = 1000 * (100e-6 + 8 / 11.5e6) + 10 * (100e-6 + (1 << 20) / 11.5e6)
    assert blocking_time(p, FASTETH) == pytest.approx(expect_c)
    assert blocking_time(p, FAST) < blocking_time(p, FASTETH)


def test_nonblocking_scales_logged_waits_by_latency_ratio() -> None:
    p = Profile(window_s=50, nonblocking={4096: (200, 0.01)})
    assert nonblocking_time(p, FAST, FAST) == pytest.approx(2.0)
    ratio = FASTETH.latency_s(4096) / FAST.latency_s(4096)
    assert nonblocking_time(p, FAST, FASTETH) == pytest.approx(2.0 * ratio)


def test_delta_sign_says_where_the_job_runs_faster() -> None:
    cpu = Profile(window_s=50, counters={"ins": 1e11, "l2": 1e9})
    comm = Profile(window_s=50, counters={"ins": 1e9}, blocking={1 << 16: 20000})
    assert delta(cpu, SLOW, FAST) > 0  # a CPU-bound job gains on the faster clock
    assert delta(cpu, FAST, SLOW) == pytest.approx(-delta(cpu, SLOW, FAST))
    assert delta(comm, FAST, FASTETH) < 0  # a communicating job loses on Fast Ethernet
    assert delta(cpu, FAST, FASTETH) == pytest.approx(0.0)  # same CPU, no messages: no gain


def test_missing_cycles_for_a_counter_is_an_error_naming_both() -> None:
    p = Profile(window_s=50, counters={"flops": 1e9})
    with pytest.raises(InputError, match=r"subcluster A: no cycles.flops"):
        compute_time(p, SLOW)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"window_s": 0}, "window_s = 0"),
        ({"window_s": 50, "counters": {"ins": -1.0}}, r"counters\[ins\] = -1.0"),
        ({"window_s": 50, "blocking": {8: math.nan}}, r"blocking\[8\] = nan"),
        ({"window_s": 50, "nonblocking": {8: (1.0, -2.0)}}, r"nonblocking\[8\]"),
        ({"window_s": 50, "swap_in_pages_s": math.inf}, "swap_in_pages_s = inf"),
    ],
)
def test_bad_profile_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(InputError, match=field):
        Profile(**kwargs)


def test_bad_subcluster_names_the_field() -> None:
    with pytest.raises(InputError, match="subcluster X: freq_ghz = 0"):
        SubCluster("X", 1, 1, 1024, 0)
    with pytest.raises(InputError, match="subcluster X: cores_per_node = 0"):
        SubCluster("X", 1, 0, 1024, 1.0)


def test_thrashing_and_migration_cost() -> None:
    assert thrashing(Profile(window_s=50, swap_in_pages_s=5000), 1000)
    assert not thrashing(Profile(window_s=50, swap_in_pages_s=10), 1000)
    assert migration_cost_s(1100, 110, dirty_factor=1.0) == pytest.approx(10.0)
    with pytest.raises(InputError, match="bandwidth_mb_s = 0"):
        migration_cost_s(100, 0)
