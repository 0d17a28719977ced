"""ARRIVE-F's decisions: properties over random farms and jobs, and the paper's cases."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preemption.remap.models import Profile, SubCluster
from preemption.remap.policy import Decision, RemapParams, RunningJob, decide, running_job, side_gain
from vjob.errors import InputError

CLUSTERS = ("A", "B", "C", "D")
MEM = {"A": 1024, "B": 1024, "C": 1024, "D": 600}


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[RunningJob], dict[str, int], RemapParams]:
    params = RemapParams(
        beta=draw(st.floats(1, 40)),
        tau_s=50.0,
        threshold_s=draw(st.floats(-50, 500)),
        max_migrations=draw(st.integers(0, 3)),
    )
    jobs = []
    for i in range(draw(st.integers(0, 14))):
        home = draw(st.sampled_from(CLUSTERS))
        profiled = draw(st.booleans())
        gains = {c: draw(st.floats(-60, 60)) for c in CLUSTERS if c != home} if profiled else {}
        jobs.append(
            RunningJob(
                id=f"j{i}",
                cluster=home,
                slots=draw(st.integers(1, 8)),
                memory_mb_per_slot=draw(st.sampled_from((100, 500, 900))),
                gains=gains,
                migrations=draw(st.integers(0, 3)),
                thrashing=profiled and draw(st.booleans()),
                remaining_s=draw(st.none() | st.floats(0, 5000)),
                migrate_s=draw(st.floats(0, 30)),
            )
        )
    free = {c: draw(st.integers(0, 8)) for c in CLUSTERS}
    return jobs, free, params


def _apply(jobs: list[RunningJob], free: dict[str, int], decisions: list[Decision]) -> list[RunningJob]:
    by_id = {j.id: j for j in jobs}
    for d in decisions:
        for jid, src, dst in zip(d.jobs, d.src, d.dst, strict=True):
            j = by_id[jid]
            assert j.cluster == src
            free[src] += j.slots
            free[dst] -= j.slots
            # adversarial: after a move every other sub-cluster looks much better, thrashing stays
            gains = {c: 60.0 for c in CLUSTERS if c != dst}
            by_id[jid] = RunningJob(
                j.id,
                dst,
                j.slots,
                j.memory_mb_per_slot,
                gains,
                j.migrations + 1,
                j.thrashing,
                j.remaining_s,
                j.migrate_s,
            )
    return list(by_id.values())


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_no_gain_decision_below_threshold_and_every_decision_fits(
    case: tuple[list[RunningJob], dict[str, int], RemapParams],
) -> None:
    jobs, free, params = case
    decisions = decide(jobs, free, MEM, params)
    by_id = {j.id: j for j in jobs}
    seen: set[str] = set()
    for d in decisions:
        assert not seen & set(d.jobs), "a job is in two decisions of one pass"
        seen |= set(d.jobs)
        expected = sum(side_gain(by_id[i], dst, params) for i, dst in zip(d.jobs, d.dst, strict=True))
        assert d.gain_s == pytest.approx(expected)
        if d.reason == "gain":
            assert d.gain_s > params.threshold_s
            assert all(by_id[i].gains for i in d.jobs), "an unprofiled job moved for gain"
        else:
            assert by_id[d.jobs[0]].thrashing
        for i, dst in zip(d.jobs, d.dst, strict=True):
            assert by_id[i].memory_mb_per_slot <= MEM[dst], "moved where it would thrash"
            assert by_id[i].migrations < params.max_migrations
    left = dict(free)
    _apply(jobs, left, decisions)
    assert all(v >= 0 for v in left.values()), left


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_migrations_per_job_stay_bounded_over_many_passes(
    case: tuple[list[RunningJob], dict[str, int], RemapParams],
) -> None:
    jobs, free, params = case
    start = {j.id: j.migrations for j in jobs}
    for _ in range(3 * params.max_migrations + 3):
        jobs = _apply(jobs, free, decide(jobs, free, MEM, params))
    for j in jobs:
        assert j.migrations <= max(start[j.id], params.max_migrations)


def test_thrashing_job_moves_at_once_whatever_the_gain() -> None:
    params = RemapParams(threshold_s=10_000)
    ft = RunningJob("ft", "D", 4, memory_mb_per_slot=700, gains={"A": 0.0, "B": 0.0}, thrashing=True)
    out = decide([ft], {"A": 4, "B": 0, "D": 0}, {"A": 1024, "B": 1024, "D": 600}, params)
    assert out == [Decision("move", "thrashing", ("ft",), ("D",), ("A",), 0.0)]


def test_thrashing_job_swaps_when_no_room_elsewhere() -> None:
    ft = RunningJob("ft", "D", 4, memory_mb_per_slot=700, gains={"A": 5.0}, thrashing=True)
    small = RunningJob("cg", "A", 4, memory_mb_per_slot=300, gains={"D": -1.0})
    out = decide([ft, small], {"A": 0, "D": 0}, {"A": 1024, "D": 600}, RemapParams())
    assert [(d.kind, d.reason, d.jobs) for d in out] == [("swap", "thrashing", ("ft", "cg"))]


def test_swap_taken_only_when_the_pair_gains_over_the_threshold() -> None:
    params = RemapParams(beta=20, threshold_s=100)
    # the paper's Migration 2 shape: MG gains on B, FT barely loses on A
    mg = RunningJob("mg", "A", 8, gains={"B": 10.0}, migrate_s=4)
    ft = RunningJob("ft", "B", 8, gains={"A": -2.0}, migrate_s=6)
    out = decide([mg, ft], {"A": 0, "B": 0}, {"A": 1024, "B": 1024}, params)
    assert len(out) == 1 and out[0].kind == "swap"
    assert out[0].gain_s == pytest.approx(8 * (10 * 20 - 4) + 8 * (-2 * 20 - 6))
    worse = RunningJob("ft", "B", 8, gains={"A": -9.0}, migrate_s=6)
    assert decide([mg, worse], {"A": 0, "B": 0}, {"A": 1024, "B": 1024}, params) == []


def test_horizon_uses_remaining_time_when_known() -> None:
    params = RemapParams(beta=20, tau_s=50, threshold_s=0)
    ending = RunningJob("j", "A", 1, gains={"B": 10.0}, remaining_s=100, migrate_s=25)
    assert side_gain(ending, "B", params) == pytest.approx(10 * 2 - 25)  # 2 windows left: not worth it
    assert decide([ending], {"A": 0, "B": 1}, {"A": 1, "B": 1}, params) == []


def test_running_job_gains_come_from_the_models() -> None:
    farm = {
        "A": SubCluster("A", 1, 4, 4096, 2.0, cycles={"ins": 1.0}),
        "B": SubCluster("B", 1, 4, 4096, 4.0, cycles={"ins": 1.0}),
    }
    prof = Profile(window_s=25, counters={"ins": 50e9})  # 25 s of work on A, 12.5 s on B
    j = running_job("j", "A", 4, prof, farm, RemapParams(tau_s=50))
    assert j.gains["B"] == pytest.approx(25.0)  # 12.5 s per 25 s window = 25 s per τ
    assert not j.thrashing
    with pytest.raises(InputError, match="sub-cluster 'Z' is not in the farm"):
        running_job("j", "Z", 4, prof, farm, RemapParams())


def test_bad_params_name_the_field() -> None:
    with pytest.raises(InputError, match="beta = 0"):
        RemapParams(beta=0)
    with pytest.raises(InputError, match="max_migrations = -1"):
        RemapParams(max_migrations=-1)
