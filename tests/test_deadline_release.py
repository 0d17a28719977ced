"""A vjob checkpointed for its deadline runs again only where x < X (the simulator's rule, one
pure function for both): held_verdict's properties, and the agent's release gate on views
(the real-Slurm run is in tests/test_deadline_slurm.py)."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.deadline import DeadlineKeeper
from preemption.deadline import KINDS, Held, VOModel, held_verdict, job_kind, predicted_remaining, resume_x, x_factor
from preemption.scheduling.tick import Release
from vjob.config import parse
from vjob.errors import InputError
from vjob.model import ClusterView, Job, JobState, Node

SETTINGS = settings(max_examples=300, deadline=None)
xs = st.floats(-5, 5)


@SETTINGS
@given(alone=xs, here=st.one_of(st.none(), xs), threshold=st.one_of(st.none(), xs))
def test_a_held_job_is_released_only_onto_a_placement_under_X(alone, here, threshold) -> None:
    verdict = held_verdict(alone, here, threshold)
    if threshold is None:
        assert verdict is Held.RELEASE  # no deadline admission: the ordinary rule
    elif alone >= threshold:
        assert verdict is Held.CANCEL  # not even alone: hopeless anywhere
    elif here is not None and here < threshold:
        assert verdict is Held.RELEASE
    else:
        assert verdict is Held.HOLD
    if verdict is Held.RELEASE and threshold is not None:
        assert here is not None and here < threshold


@SETTINGS
@given(
    estimate=st.floats(1, 1e6),
    share=st.floats(0, 1),
    slowdown=st.floats(1, 5),
    left=st.floats(-1e6, 1e6),
    pause=st.floats(0, 1e4),
)
def test_resume_x_is_eq_1_with_the_restore_added(estimate, share, slowdown, left, pause) -> None:
    done = share * estimate
    want = x_factor(predicted_remaining(estimate, done, slowdown) + pause, left)
    assert resume_x(estimate, done, slowdown, left, pause_s=pause) == want
    if left > 0:  # a longer restore never makes a job that can still make it look likelier to
        assert resume_x(estimate, done, slowdown, left, pause_s=pause + 60) >= want


def test_resume_x_names_a_bad_pause() -> None:
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(InputError, match="pause_s"):
            resume_x(60, 0, 1.1, 60, pause_s=bad)


@SETTINGS
@given(n=st.integers(0, 64))
def test_the_worst_slowdown_bounds_every_kind_and_grows_with_neighbours(n) -> None:
    vo = VOModel.default()
    for kind in KINDS:
        for neighbour in KINDS:
            assert vo.slowdown(kind, [neighbour] * n) <= vo.worst(n) + 1e-12
    assert vo.worst(n + 1) >= vo.worst(n)
    assert vo.worst(0) == max(vo.slowdown(k) for k in KINDS)


def test_worst_names_a_bad_neighbour_count() -> None:
    with pytest.raises(InputError, match="neighbours = -1"):
        VOModel.default().worst(-1)


# -- the agent's release gate ---------------------------------------------------------------


def _keeper(x: float, checkpoint_s: float = 0.0) -> DeadlineKeeper:
    cfg = parse({"deadline": {"admission": "static", "static_x": x, "x_min": -1, "checkpoint_s": checkpoint_s}})
    return DeadlineKeeper(cfg, "slurm")


def _view(now: float, held: Job, busy: dict[str, int], nodes: int = 3) -> ClusterView:
    """`held` plus `busy[node]` one-CPU running jobs on each node."""
    jobs = [held]
    for node, count in busy.items():
        jobs += [
            Job(id=f"{node}-{i}", user="u", state=JobState.RUNNING, allocated_nodes=(node,), start_time=now - 10)
            for i in range(count)
        ]
    names = [f"n{i}" for i in range(1, nodes + 1)]
    return ClusterView(now=now, jobs=tuple(jobs), nodes=tuple(Node(n, 4, 4096) for n in names))


def test_the_gate_pins_a_held_job_to_a_node_where_it_makes_it_and_holds_it_when_none() -> None:
    now = time.time()
    keeper = _keeper(0.0)
    # 600 s of work, 100 done; alone (1.10): 550 s for 560 left, x < 0; beside one job (1.18): 590, x > 0
    held = Job(id="7", user="u", state=JobState.HELD, walltime=600, deadline=now + 560)
    keeper.parked["7"] = (100.0, now - 5)
    other = Release("8", ("n1",))  # not held for its deadline: passes untouched
    # every node has a neighbour: no placement under X, the job stays held
    full = _view(now, held, {"n1": 1, "n2": 1, "n3": 2})
    assert keeper.releases(full, [Release("7"), other], now) == [other]
    row = keeper.evaluate(held, now)
    assert row is not None and row.decision == Held.HOLD.value and row.x < 0
    # n2 free: released, pinned there (not left to the RMS, which might pick n1 again)
    freed = _view(now, held, {"n1": 1, "n3": 2})
    assert keeper.releases(freed, [Release("7"), other], now) == [Release("7", ("n2",)), other]
    # its saved node named by the pass, but now busy: held
    assert keeper.releases(freed, [Release("7", ("n1",))], now) == []
    # the restore counted: 20 s of it and alone no longer makes it -> hopeless, cancelled
    slow = _keeper(0.0, checkpoint_s=20.0)
    slow.parked["7"] = (100.0, now - 5)
    assert slow.evaluate(held, now).decision == Held.CANCEL.value
    assert slow.releases(freed, [Release("7")], now) == []


def test_two_held_jobs_released_in_one_tick_do_not_share_the_free_node() -> None:
    now = time.time()
    keeper = _keeper(0.0)
    a = Job(id="a", user="u", state=JobState.HELD, walltime=600, deadline=now + 560)
    b = Job(id="b", user="u", state=JobState.HELD, walltime=600, deadline=now + 560)
    keeper.parked.update({"a": (100.0, now), "b": (100.0, now)})
    view = _view(now, a, {"n1": 1, "n3": 1})
    view = ClusterView(now=now, jobs=(*view.jobs, b), nodes=view.nodes)
    assert keeper.releases(view, [Release("a"), Release("b")], now) == [Release("a", ("n2",))]


def test_a_parked_job_that_runs_again_is_judged_as_any_running_job() -> None:
    now = time.time()
    keeper = _keeper(0.0)
    keeper.parked["7"] = (100.0, now - 60)
    keeper.given_up.add("9")
    rerun = Job(
        id="7",
        user="u",
        state=JobState.RUNNING,
        walltime=600,
        deadline=now + 9000,
        start_time=now - 10,
        allocated_nodes=("n2",),
    )
    cancelled = Job(id="9", user="u", state=JobState.HELD, walltime=600, deadline=now + 60)
    view = ClusterView(now=now, jobs=(rerun, cancelled))
    keeper.unpark(view)
    assert keeper.parked == {}
    assert keeper.evaluate(rerun, now).decision == "continue"
    assert keeper.releases(view, [Release("9"), Release("5")], now) == [Release("5")]  # 9 never again
    keeper.unpark(ClusterView(now=now, jobs=(rerun,)))  # gone from the RMS: forgotten
    assert keeper.given_up == set()


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("vjob:kind=cpu", "cpu"),
        ("vjob:deadline=1764100000,vjob:kind=io", "io"),
        ("run 3; vjob:kind=mem", "mem"),
        ("", None),
        ("no kind here", None),
        ("xvjob:kind=cpu", None),
    ],
)
def test_the_job_kind_comes_from_its_comment(text: str, kind: str | None) -> None:
    assert job_kind(text) == kind


@pytest.mark.parametrize("bad", ["vjob:kind=gpu", "vjob:kind=cpu2", "vjob:kind=CPU", "vjob:kind=", "vjob:kind=c.u"])
def test_a_kind_that_is_not_known_is_refused_naming_it(bad: str) -> None:
    with pytest.raises(InputError, match=r"job kind = '.*': must be one of cpu, mem, io"):
        job_kind(bad)


def test_a_declared_kind_sets_the_slowdown_a_job_is_judged_at() -> None:
    now = time.time()
    keeper = _keeper(0.0)
    # 600 s of work with 630 s left: as io (the worst, 1.10) x > 0; as cpu (1.02) x < 0
    job = Job(id="5", user="u", state=JobState.RUNNING, walltime=600, deadline=now + 630, start_time=now)
    assert keeper.evaluate(job, now).x > 0
    keeper.kinds["5"] = "cpu"
    assert keeper.evaluate(job, now).x < 0
    assert VOModel.default().worst(1, "cpu") == pytest.approx(1.04)  # 1 + 0.02 + the worst neighbour's 0.02
