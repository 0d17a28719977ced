"""Why a held-back interactive job waits (preemption/scheduling/waiting.py), as the pass
(`tick.decide`) records it: each reason on a hand-made cluster where it is the true one, and
on random states every waiting interactive job has exactly one reason, in vjob's text form."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preemption.scheduling.tick import decide
from preemption.scheduling.waiting import WaitKind, WaitReason
from vjob.config import Config, PriorityConfig, SchedulingConfig
from vjob.model import ClusterView, Job, JobClass, JobState, Node

NOW = 1_000_000.0


def _cfg(cap: float = 1.0, user_cap: float | None = None, slack: float = 600.0, policy: str = "vjob") -> Config:
    return Config(
        priority=PriorityConfig(interactive_cap=cap, interactive_user_cap=user_cap),
        scheduling=SchedulingConfig(policy=policy, head_slack_s=slack),
    )


def _nodes(n: int) -> tuple[Node, ...]:
    return tuple(Node(f"n{i}", cpus=1, memory_mb=8192, os_image="deb") for i in range(n))


def _running(job_id: str, nodes: tuple[str, ...], *, left: float = 3600.0, interactive: bool = False) -> Job:
    return Job(
        id=job_id,
        user="bob" if interactive else "alice",
        os_image="deb",
        job_class=JobClass.INTERACTIVE if interactive else JobClass.BATCH,
        nodes=len(nodes),
        submit_time=NOW - 7200,
        start_time=NOW - 60,
        walltime=60 + left,
        state=JobState.RUNNING,
        allocated_nodes=nodes,
        memory_mb=1024,
    )


def _interactive(job_id: str, nodes: int, walltime: float = 3600.0, submit: float = NOW - 5) -> Job:
    return Job(
        id=job_id,
        user="bob",
        os_image="deb",
        job_class=JobClass.INTERACTIVE,
        nodes=nodes,
        submit_time=submit,
        walltime=walltime,
    )


def _full(n: int) -> list[Job]:
    return [_running(f"b{i}", (f"n{i}",)) for i in range(n)]


def _waits(view: ClusterView, cfg: Config, checkpointable: set[str] | None = None) -> dict[str, WaitReason]:
    d = decide(view, cfg, knob=None, checkpointable=checkpointable, sleeping={})
    assert set(d.waits) == set(d.waiting_interactive)
    return dict(d.waits)


def test_over_the_cap_names_the_nodes_held_and_the_limit() -> None:
    jobs = (_running("i0", ("n0", "n1"), interactive=True), *_full(4)[2:], _interactive("i1", 1))
    waits = _waits(ClusterView(now=NOW, nodes=_nodes(4), jobs=jobs), _cfg(cap=0.5))
    assert waits["i1"] == WaitReason(WaitKind.CAP, held=2, limit=2, request=1)
    assert waits["i1"].text() == "vjob: interactive cap reached (2/2 nodes; this job asks 1)"


def test_a_cap_of_zero_holds_every_interactive_job_on_a_full_cluster() -> None:
    view = ClusterView(now=NOW, nodes=_nodes(3), jobs=(*_full(3), _interactive("i", 1)))
    assert _waits(view, _cfg(cap=0.0))["i"].text() == "vjob: interactive cap reached (0/0 nodes; this job asks 1)"


def test_the_users_own_cap_is_named_when_the_machines_is_not_reached() -> None:
    jobs = (_running("i0", ("n0",), interactive=True), *_full(4)[1:], _interactive("i1", 1))
    waits = _waits(ClusterView(now=NOW, nodes=_nodes(4), jobs=jobs), _cfg(cap=1.0, user_cap=0.25))
    assert waits["i1"].kind is WaitKind.USER_CAP
    assert waits["i1"].text() == "vjob: your interactive cap reached (1/1 nodes; this job asks 1)"


def test_no_checkpointable_victim_when_the_running_jobs_are_not_vjobs() -> None:
    view = ClusterView(now=NOW, nodes=_nodes(4), jobs=(*_full(4), _interactive("i", 2)))
    waits = _waits(view, _cfg(), checkpointable={"b3"})
    assert waits["i"] == WaitReason(WaitKind.NO_VICTIM, limit=1, request=2)
    assert waits["i"].text() == "vjob: no checkpointable victim (can free 1 of 2 nodes)"
    assert _waits(view, _cfg(), checkpointable={"b2", "b3"}) == {}  # with two victims it starts


def test_the_guard_says_which_job_and_by_how_much() -> None:
    """The guard g needs all four nodes at t+1 h; checkpointing b0 for a 1 h interactive job
    brings b0 back at t+2 h: g would start an hour later, beyond a 10 min slack."""
    jobs = (
        _running("b0", ("n0", "n1")),
        _running("b1", ("n2", "n3")),
        _interactive("i", 2),
        Job(id="g", user="carol", os_image="deb", nodes=4, submit_time=NOW - 3000, walltime=7200.0),
    )
    view = ClusterView(now=NOW, nodes=_nodes(4), jobs=jobs)
    waits = _waits(view, _cfg(slack=600.0))
    assert waits["i"] == WaitReason(WaitKind.GUARD, request=2, job="g", delay_s=3600.0)
    assert waits["i"].text() == "vjob: would delay job g by 60 min"
    assert _waits(view, _cfg(slack=7200.0)) == {}


def test_a_job_behind_the_head_names_the_head() -> None:
    """Two interactive jobs, no victim: the first one in vjob's order is the head (no victim),
    the second waits behind it."""
    jobs = (*_full(2), _interactive("i1", 2, submit=NOW - 50), _interactive("i2", 1))
    view = ClusterView(now=NOW, nodes=_nodes(2), jobs=jobs)
    d = decide(view, _cfg(), knob=None, checkpointable=set(), sleeping={})
    first, second = (j for j in d.order if j in ("i1", "i2"))
    assert d.reserved == first and d.waits[first].kind is WaitKind.NO_VICTIM
    assert d.waits[second].kind is WaitKind.BEHIND and d.waits[second].job == first
    assert d.waits[second].text() == f"vjob: waits behind job {first} at the head of the queue"


def test_too_large_and_a_policy_that_does_not_preempt() -> None:
    view = ClusterView(now=NOW, nodes=_nodes(2), jobs=(*_full(2), _interactive("big", 5)))
    assert _waits(view, _cfg())["big"].text() == "vjob: asks 5 nodes but the cluster has 2 usable"
    view = ClusterView(now=NOW, nodes=_nodes(2), jobs=(*_full(2), _interactive("i", 1)))
    assert _waits(view, _cfg(policy="mms"))["i"].kind is WaitKind.NO_PREEMPTION


def test_a_delay_is_never_shown_as_zero_minutes() -> None:
    assert WaitReason(WaitKind.GUARD, job="7", delay_s=0.4).text() == "vjob: would delay job 7 by 1 min"
    assert WaitReason(WaitKind.GUARD, job="7", delay_s=61.0).text() == "vjob: would delay job 7 by 2 min"


@st.composite
def clusters(draw: st.DrawFn) -> tuple[ClusterView, Config, set[str]]:
    n = draw(st.integers(1, 8))
    jobs: list[Job] = []
    for i in range(n):
        if draw(st.booleans()):
            jobs.append(_running(f"b{i}", (f"n{i}",), left=float(draw(st.integers(60, 20_000)))))
    for k in range(draw(st.integers(1, 3))):
        jobs.append(_interactive(f"i{k}", draw(st.integers(1, n + 1)), submit=NOW - k))
    if draw(st.booleans()):
        jobs.append(Job(id="g", user="carol", os_image="deb", nodes=n, submit_time=NOW - 3000, walltime=7200.0))
    cfg = _cfg(
        cap=draw(st.sampled_from([0.0, 0.25, 0.5, 1.0])),
        slack=float(draw(st.integers(0, 4000))),
        policy=draw(st.sampled_from(["vjob", "ubis", "mms"])),
    )
    ckpt = {j.id for j in jobs if j.state is JobState.RUNNING and draw(st.booleans())}
    return ClusterView(now=NOW, nodes=_nodes(n), jobs=tuple(jobs)), cfg, ckpt


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(clusters())
def test_every_waiting_interactive_job_has_one_reason_in_vjobs_text_form(case: tuple) -> None:
    view, cfg, ckpt = case
    d = decide(view, cfg, knob=None, checkpointable=ckpt, sleeping={})
    assert list(d.waits) == list(d.waiting_interactive)
    for reason in d.waits.values():
        text = reason.text()
        assert text.startswith("vjob: ") and len(text) <= 120
        assert not any(c in text for c in ",[]\n\t") and "  " not in text
        if reason.kind is WaitKind.GUARD:
            assert reason.delay_s > cfg.scheduling.head_slack_s - 1e-6
