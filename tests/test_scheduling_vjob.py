"""The vjob policy's promises (preemption/scheduling/tick.decide, policy "vjob"), on random
small cluster states (hypothesis) and on hand-made ones:

* no batch job is preempted once it reached `[scheduling] max_preemptions`;
* an interactive job within the cap never waits while enough checkpointable victims exist and
  no batch job queues behind it whose reservation it could delay;
* the first batch job in the queue (the guard) never has its reserved start pushed back
  beyond `head_slack_s` by a preemption, counted from the start it had when first guarded
  (`Decision.anchors`), also across ticks;
* the hard cap mode never lets interactive jobs hold more than the cap.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preemption.scheduling.easy import reservation
from preemption.scheduling.pass_state import Costs
from preemption.scheduling.tick import decide
from simulator.engine import simulate
from simulator.metrics import summary
from simulator.replay import ClusterModel
from simulator.workload import Workload
from vjob.config import Config, PriorityConfig, SchedulingConfig
from vjob.model import ClusterView, Job, JobClass, JobState, Node

NOW = 1_000_000.0
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _cfg(cap: float = 1.0, bound: int = 2, slack: float = 600.0, victims: str = "cost") -> Config:
    return Config(
        priority=PriorityConfig(interactive_cap=cap),
        scheduling=SchedulingConfig(policy="vjob", max_preemptions=bound, head_slack_s=slack, victims=victims),
    )


def _nodes(n: int) -> tuple[Node, ...]:
    return tuple(Node(f"n{i}", cpus=1, memory_mb=8192, os_image="deb") for i in range(n))


def _running(job_id: str, nodes: tuple[str, ...], *, pn: int = 0, left: float = 3600.0) -> Job:
    return Job(
        id=job_id,
        user="alice",
        os_image="deb",
        nodes=len(nodes),
        submit_time=NOW - 7200,
        start_time=NOW - 60,
        walltime=60 + left,
        state=JobState.RUNNING,
        allocated_nodes=nodes,
        preempt_count=pn,
        memory_mb=1024,
    )


def _interactive(job_id: str, nodes: int, walltime: float = 1800.0) -> Job:
    return Job(
        id=job_id,
        user="bob",
        os_image="deb",
        job_class=JobClass.INTERACTIVE,
        nodes=nodes,
        submit_time=NOW - 5,
        walltime=walltime,
    )


def _pending(job_id: str, nodes: int, submit: float = NOW - 3000, walltime: float = 7200.0) -> Job:
    return Job(id=job_id, user="carol", os_image="deb", nodes=nodes, submit_time=submit, walltime=walltime)


@st.composite
def full_clusters(draw: st.DrawFn) -> tuple[ClusterView, int]:
    """A full cluster of 1- and 2-node batch jobs with random preemption counts and ends, and
    one or two interactive jobs waiting; returns the view and the preemption bound."""
    n = draw(st.integers(2, 10))
    names = [f"n{i}" for i in range(n)]
    jobs: list[Job] = []
    at = 0
    while at < n:
        size = draw(st.integers(1, min(2, n - at)))
        jobs.append(
            _running(
                f"b{at}",
                tuple(names[at : at + size]),
                pn=draw(st.integers(0, 4)),
                left=float(draw(st.integers(60, 20_000))),
            )
        )
        at += size
    for k in range(draw(st.integers(1, 2))):
        jobs.append(_interactive(f"i{k}", draw(st.integers(1, n)), float(draw(st.integers(600, 7200)))))
    return ClusterView(now=NOW, nodes=_nodes(n), jobs=tuple(jobs)), draw(st.integers(0, 4))


@SETTINGS
@given(full_clusters())
def test_no_job_is_preempted_beyond_the_bound(case: tuple[ClusterView, int]) -> None:
    view, bound = case
    d = decide(view, _cfg(bound=bound), knob=None, checkpointable=None, sleeping={})
    for pre in d.preemptions:
        for victim in pre.victims:
            assert view.job(victim).preempt_count < bound


@SETTINGS
@given(full_clusters())
def test_an_admitted_interactive_job_never_waits_when_victims_exist(case: tuple[ClusterView, int]) -> None:
    """No batch job queues here (nothing to guard), the cap is the whole machine: the first
    interactive job of the pass's order (the two are ranked by their UBIS priority inside
    their tier) starts whenever the batch jobs below the bound hold enough nodes."""
    view, bound = case
    d = decide(view, _cfg(bound=bound), knob=None, checkpointable=None, sleeping={})
    first = view.job(d.order[0])
    assert first.interactive
    eligible = sum(j.nodes for j in view.running if j.preempt_count < bound)
    if eligible >= first.nodes:
        assert first.id in d.starts
    else:
        assert first.id not in d.starts  # it cannot: the bound protects the others


@st.composite
def guarded_clusters(draw: st.DrawFn) -> tuple[ClusterView, float]:
    """`full_clusters` plus a large batch job queued (the guard) and a slack."""
    view, _ = draw(full_clusters())
    guard = _pending("g", draw(st.integers(1, len(view.nodes))), walltime=float(draw(st.integers(600, 9000))))
    return ClusterView(now=NOW, nodes=view.nodes, jobs=(*view.jobs, guard)), draw(
        st.sampled_from([0.0, 60.0, 600.0, 3600.0])
    )


def _guard_start(view: ClusterView, preemptions: dict[str, tuple[str, ...]]) -> float:
    """The guard's EASY reservation after the pass, computed here from scratch on the full
    cluster: the jobs still running keep their estimated ends; each victim holds its nodes
    again from the estimated end of the interactive job that took them, for its remaining
    estimate plus a remote resume (the pessimistic return the policy promises to count)."""
    costs = Costs()
    holds = []
    back: dict[str, float] = {}
    for job_id, victims in preemptions.items():
        ready = max(NOW + costs.checkpoint_s(view.job(v)) for v in victims)
        for v in victims:
            back[v] = ready + (view.job(job_id).walltime or 0) - NOW
    for job in view.running:
        end = (job.start_time or NOW) + (job.walltime or 0)
        if job.id in back:
            end += back[job.id] + 2 * costs.checkpoint_s(job)
        holds.append((end, job.nodes))
    return reservation(NOW, 0, view.job("g").nodes, holds)[0]


@SETTINGS
@given(guarded_clusters(), st.sampled_from(["cost", "guard"]))
def test_the_guards_reservation_never_moves_beyond_the_slack(case: tuple[ClusterView, float], victims: str) -> None:
    """Under either victim order (`[scheduling] victims`)."""
    view, slack = case
    before = reservation(
        NOW, 0, view.job("g").nodes, [((j.start_time or 0) + (j.walltime or 0), j.nodes) for j in view.running]
    )[0]
    d = decide(view, _cfg(bound=10, slack=slack, victims=victims), knob=None, checkpointable=None, sleeping={})
    if d.preemptions and "g" not in d.starts:
        after = _guard_start(view, {p.job_id: p.victims for p in d.preemptions})
        assert after <= before + slack + 1e-6


def test_a_preemption_that_would_delay_the_guard_waits_instead() -> None:
    """Four nodes held by two long batch jobs; the guard needs all four, at the end of the
    earlier one plus the other (t+1 h). An interactive job of 2 nodes for 1 h would push the
    victims, hence the guard, back by an hour: with a 10 min slack it reserves; with 2 h it
    preempts."""
    jobs = (
        _running("b0", ("n0", "n1"), left=3600.0),
        _running("b1", ("n2", "n3"), left=3600.0),
        _interactive("i", 2, walltime=3600.0),
        _pending("g", 4),
    )
    view = ClusterView(now=NOW, nodes=_nodes(4), jobs=jobs)
    strict = decide(view, _cfg(slack=600.0), knob=None, checkpointable=None, sleeping={})
    assert strict.preemptions == () and strict.reserved == "i"
    loose = decide(view, _cfg(slack=7200.0), knob=None, checkpointable=None, sleeping={})
    assert [p.job_id for p in loose.preemptions] == ["i"]
    assert "g" in loose.anchors  # the guard's first reserved start, for the next tick


def test_the_anchor_bounds_the_delay_across_ticks() -> None:
    """A guard already pushed back to its anchor + slack admits no further preemption, even
    though this one alone would stay within the slack of its current reservation."""
    jobs = (
        _running("b0", ("n0", "n1"), left=3600.0),
        _running("b1", ("n2", "n3"), left=3600.0),
        _interactive("i", 2, walltime=600.0),
        _pending("g", 4),
    )
    view = ClusterView(now=NOW, nodes=_nodes(4), jobs=jobs)
    alone = decide(view, _cfg(slack=900.0), knob=None, checkpointable=None, sleeping={})
    assert [p.job_id for p in alone.preemptions] == ["i"]
    anchored = decide(
        view, _cfg(slack=900.0), knob=None, checkpointable=None, sleeping={}, anchors={"g": NOW + 3600.0 - 900.0}
    )
    assert anchored.preemptions == ()


def test_victims_are_the_least_preempted_then_the_cheapest() -> None:
    jobs = (
        _running("twice", ("n0",), pn=1),
        _running("never", ("n1",), pn=0),
        _interactive("i", 1),
    )
    view = ClusterView(now=NOW, nodes=_nodes(2), jobs=jobs)
    d = decide(view, _cfg(), knob=None, checkpointable=None, sleeping={})
    assert [p.victims for p in d.preemptions] == [("never",)]


def test_victims_that_cost_the_guard_nothing_come_first() -> None:
    """The guard (2 nodes) is reserved at the end of b0 (t+1,000 s). By cost alone b0 is the
    victim (never preempted; b1 was once), and its return would push the guard back by the
    interactive job's hour: refused, the interactive job waits. `victims = "guard"` takes b1,
    which ends long after the reserved start anyway: the preemption costs the guard nothing
    and happens."""
    jobs = (
        _running("b0", ("n0", "n1"), left=1000.0),
        _running("b1", ("n2", "n3"), pn=1, left=20_000.0),
        _interactive("i", 2, walltime=3600.0),
        _pending("g", 2),
    )
    view = ClusterView(now=NOW, nodes=_nodes(4), jobs=jobs)
    by_cost = decide(view, _cfg(), knob=None, checkpointable=None, sleeping={})
    assert by_cost.preemptions == () and by_cost.reserved == "i"
    guard = decide(view, _cfg(victims="guard"), knob=None, checkpointable=None, sleeping={})
    assert [(p.job_id, p.victims) for p in guard.preemptions] == [("i", ("b1",))]
    assert _guard_start(view, {"i": ("b1",)}) == NOW + 1000.0


def _interactive_heavy(n_nodes: int = 64) -> Workload:
    """Many interactive jobs at once on a machine full of batch work."""
    rng = np.random.default_rng(3)
    batch, inter = 40, 40
    return Workload.from_columns(
        {
            "submit": np.concatenate([np.zeros(batch), rng.uniform(10, 2000, inter).round()]),
            "runtime": np.concatenate([np.full(batch, 20_000.0), np.full(inter, 3000.0)]),
            "walltime": np.concatenate([np.full(batch, 20_000.0), np.full(inter, 3000.0)]),
            "nodes": np.concatenate([np.full(batch, 4), rng.integers(4, 12, inter)]),
            "interactive": np.concatenate([np.zeros(batch, dtype=bool), np.ones(inter, dtype=bool)]),
        }
    )


def test_the_hard_cap_mode_never_exceeds_the_cap() -> None:
    """The paper's literal reading: under `--cap-mode hard` interactive jobs never hold more
    than the cap; under the default (`preempt`) those beyond it run as ordinary jobs and do."""
    w, model = _interactive_heavy(), ClusterModel(nodes=64, os_count=1)
    cap = PriorityConfig(interactive_cap=0.15)
    for policy in ("vjob", "ubis", "mms"):
        hard = simulate(w, model, policy, cap, cap_mode="hard")
        assert hard.max_interactive_held <= 0.15 * 64
        inter = hard.workload.interactive
        started = ~np.isnan(hard.first_start)
        assert hard.ran_privileged[inter & started].all()  # each one that ran, ran within the cap
        assert not started[inter & (hard.workload.nodes > 0.15 * 64)].any()  # too big for the cap
        soft = simulate(w, model, policy, cap)
        assert not soft.ran_privileged[soft.workload.interactive].all()


def test_summary_has_batch_size_classes() -> None:
    w = Workload.from_columns(
        {
            "submit": [0.0, 0.0, 0.0],
            "runtime": [100.0, 100.0, 100.0],
            "walltime": [100.0, 100.0, 100.0],
            "nodes": [2, 16, 40],
        }
    )
    doc = summary(simulate(w, ClusterModel(nodes=64, os_count=1), "vjob"))
    sizes = doc["batch_by_size"]
    assert {k: v["count"] for k, v in sizes.items()} == {"small": 1, "medium": 1, "large": 1}
    assert sizes["large"]["max_wait_s"] == sizes["large"]["mean_wait_s"]
    assert set(sizes["small"]) == {"count", "mean_wait_s", "mean_response_s", "max_wait_s"}
