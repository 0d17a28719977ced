"""The agent's per-tick decision (preemption.scheduling.tick): pure, on hand-built cluster views."""

from __future__ import annotations

from preemption.scheduling.tick import Release, decide
from preemption.scheduling.victims import running_priorities
from vjob.config import Config, parse
from vjob.model import ClusterView, Job, JobClass, JobState, Node
from vjob.rms import PriorityKnob

NOW = 1_000_000.0
SLURM_KNOB = PriorityKnob(0, 1_000_000, 1000)


def _cfg(cap: float = 0.5, policy: str = "ubis") -> Config:
    """These tests pin the paper's policy (victims by UBIS priority); vjob's have their own
    (tests/test_scheduling_vjob.py)."""
    return parse({"priority": {"interactive_cap": cap}, "scheduling": {"policy": policy}})


def _nodes(n: int = 8) -> tuple[Node, ...]:
    return tuple(Node(f"node{i}", cpus=4, memory_mb=2000, os_image="debian-tiny") for i in range(1, n + 1))


def _batch(job_id: str, node: str, *, user: str = "alice", submit: float = NOW - 600, pn: int = 0) -> Job:
    return Job(
        id=job_id,
        user=user,
        rms="slurm",
        os_image="debian-tiny",
        submit_time=submit,
        start_time=submit + 1,
        state=JobState.RUNNING,
        allocated_nodes=(node,),
        preempt_count=pn,
    )


def _interactive(job_id: str, nodes: int, submit: float = NOW - 5) -> Job:
    return Job(id=job_id, user="bob", rms="slurm", job_class=JobClass.INTERACTIVE, nodes=nodes, submit_time=submit)


def test_interactive_job_on_a_full_cluster_preempts_just_enough_checkpointable_vjobs():
    batch = [_batch(str(i), f"node{i}") for i in range(1, 9)]
    view = ClusterView(now=NOW, jobs=(*batch, _interactive("100", 2)), nodes=_nodes())
    d = decide(view, _cfg(), knob=SLURM_KNOB, checkpointable={j.id for j in batch}, sleeping={})
    assert len(d.preemptions) == 1
    pre = d.preemptions[0]
    assert pre.job_id == "100"
    assert len(pre.victims) == 2
    assert set(pre.nodes) == {f"node{v}" for v in pre.victims}
    assert d.releases == ()
    assert set(d.rms_priorities) == {"100"}


def test_victims_are_the_lowest_priority_vjobs():
    # Job 1 was already preempted three times: Pn raises its priority, so it is spared.
    batch = [_batch("1", "node1", pn=3), _batch("2", "node2"), _batch("3", "node3", submit=NOW - 60)]
    view = ClusterView(now=NOW, jobs=(*batch, _interactive("100", 1)), nodes=_nodes(3))
    prios = running_priorities(view, _cfg(1.0).priority)
    d = decide(view, _cfg(1.0), knob=SLURM_KNOB, checkpointable={"1", "2", "3"}, sleeping={})
    (pre,) = d.preemptions
    assert pre.victims == (min(prios, key=lambda k: prios[k]),)
    assert "1" not in pre.victims


def test_jobs_that_are_not_checkpointable_vjobs_are_never_victims():
    batch = [_batch(str(i), f"node{i}") for i in range(1, 5)]
    view = ClusterView(now=NOW, jobs=(*batch, _interactive("100", 2)), nodes=_nodes(4))
    d = decide(view, _cfg(), knob=SLURM_KNOB, checkpointable={"3"}, sleeping={})
    # Only one vjob can be checkpointed but two nodes are needed: the job waits.
    assert d.preemptions == ()
    assert d.waiting_interactive == ("100",)
    d2 = decide(view, _cfg(), knob=SLURM_KNOB, checkpointable={"3", "4"}, sleeping={})
    assert set(d2.preemptions[0].victims) == {"3", "4"}


def test_free_nodes_are_used_before_anyone_is_preempted():
    batch = [_batch(str(i), f"node{i}") for i in range(1, 7)]
    view = ClusterView(now=NOW, jobs=(*batch, _interactive("100", 2)), nodes=_nodes())
    d = decide(view, _cfg(), knob=SLURM_KNOB, checkpointable={j.id for j in batch}, sleeping={})
    assert d.preemptions == ()
    assert d.waiting_interactive == ()


def test_the_interactive_cap_makes_the_job_wait():
    batch = [_batch(str(i), f"node{i}") for i in range(1, 9)]
    view = ClusterView(now=NOW, jobs=(*batch, _interactive("100", 3)), nodes=_nodes())
    d = decide(view, _cfg(cap=0.25), knob=SLURM_KNOB, checkpointable={j.id for j in batch}, sleeping={})
    assert d.preemptions == ()
    assert d.waiting_interactive == ("100",)


def test_two_interactive_jobs_in_one_tick_never_share_a_victim():
    batch = [_batch(str(i), f"node{i}") for i in range(1, 9)]
    view = ClusterView(now=NOW, jobs=(*batch, _interactive("100", 2), _interactive("101", 2)), nodes=_nodes())
    d = decide(view, _cfg(), knob=SLURM_KNOB, checkpointable={j.id for j in batch}, sleeping={})
    assert len(d.preemptions) == 2
    a, b = d.preemptions
    assert not set(a.victims) & set(b.victims)
    assert not set(a.nodes) & set(b.nodes)


def test_checkpointed_jobs_are_released_on_their_own_nodes_when_nodes_are_free():
    held = [
        Job(
            id="7",
            user="alice",
            rms="slurm",
            submit_time=NOW - 900,
            state=JobState.HELD,
            preempt_count=1,
            preempted_since=NOW - 100,
        ),
        Job(
            id="8",
            user="alice",
            rms="slurm",
            submit_time=NOW - 900,
            state=JobState.HELD,
            preempt_count=1,
            preempted_since=NOW - 100,
        ),
    ]
    running = [_batch(str(i), f"node{i}") for i in range(1, 7)]
    view = ClusterView(now=NOW, jobs=(*running, *held), nodes=_nodes())
    d = decide(view, _cfg(), knob=SLURM_KNOB, checkpointable=set(), sleeping={"7": ("node7",), "8": ("node8",)})
    assert {r.job_id for r in d.releases} == {"7", "8"}
    assert {r.job_id: r.preferred_nodes for r in d.releases} == {"7": ("node7",), "8": ("node8",)}


def test_a_held_job_is_not_released_when_it_would_delay_the_waiting_interactive_job():
    # The interactive job (2 nodes, within the cap) outranks the held job but cannot preempt
    # (no checkpointable vjob): it is the head, and its EASY reservation is at the first end
    # of a running job (start + 1 h). The held job would take the one free node past that
    # time, so it is not released: it waits its turn, as in the simulator.
    held = Job(id="9", user="alice", rms="slurm", submit_time=NOW - 900, state=JobState.HELD, preempted_since=NOW)
    running = [_batch(str(i), f"node{i}") for i in range(1, 8)]
    view = ClusterView(now=NOW, jobs=(*running, held, _interactive("100", 2)), nodes=_nodes())
    d = decide(view, _cfg(cap=0.25), knob=SLURM_KNOB, checkpointable=set(), sleeping={"9": ("node8",)})
    assert d.waiting_interactive == ("100",)
    assert d.reserved == "100"
    assert d.releases == ()


def test_a_held_job_is_released_in_its_turn_after_the_interactive_job_ahead_of_it():
    # One free node: the interactive job ahead takes it, nothing is left for the held job.
    held = Job(id="9", user="alice", rms="slurm", submit_time=NOW - 900, state=JobState.HELD, preempted_since=NOW)
    running = [_batch(str(i), f"node{i}") for i in range(1, 8)]
    view = ClusterView(now=NOW, jobs=(*running, held, _interactive("100", 1)), nodes=_nodes())
    d = decide(view, _cfg(), knob=SLURM_KNOB, checkpointable=set(), sleeping={"9": ("node8",)})
    assert d.starts == ("100",)
    assert d.releases == ()
    # Two free nodes: both start, the held job on the node it was saved on.
    view2 = ClusterView(now=NOW, jobs=(*running[:6], held, _interactive("100", 1)), nodes=_nodes())
    d2 = decide(view2, _cfg(), knob=SLURM_KNOB, checkpointable=set(), sleeping={"9": ("node8",)})
    assert d2.starts == ("100", "9")
    assert d2.releases == (Release("9", ("node8",)),)


def test_a_job_held_by_someone_else_is_never_released():
    held = Job(id="7", user="alice", rms="slurm", submit_time=NOW - 900, state=JobState.HELD)
    view = ClusterView(now=NOW, jobs=(held,), nodes=_nodes())
    d = decide(view, _cfg(), knob=SLURM_KNOB, checkpointable=set(), sleeping={})
    assert d.releases == ()


def test_an_interactive_job_larger_than_the_cluster_waits_and_preempts_nobody():
    batch = [_batch(str(i), f"node{i}") for i in range(1, 9)]
    view = ClusterView(now=NOW, jobs=(*batch, _interactive("100", 99)), nodes=_nodes())
    d = decide(view, _cfg(cap=1.0), knob=SLURM_KNOB, checkpointable={j.id for j in batch}, sleeping={})
    assert d.preemptions == ()
    assert d.waiting_interactive == ("100",)


def test_without_a_priority_knob_no_integer_priorities_are_asked_for() -> None:
    """OAR declares no knob: the decision still ranks (and preempts) but maps nothing."""
    batch = [_batch(str(i), f"node{i}") for i in range(1, 9)]
    view = ClusterView(now=NOW, jobs=(*batch, _interactive("100", 2)), nodes=_nodes())
    d = decide(view, _cfg(), knob=None, checkpointable={j.id for j in batch}, sleeping={})
    assert d.rms_priorities == {}
    assert set(d.priorities) == {"100"}
    assert len(d.preemptions) == 1
