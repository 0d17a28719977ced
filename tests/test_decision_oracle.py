"""An independent oracle for the vjob pass's victim choice and guard, against `decide` called
as the agent calls it.

Why: tests/test_decision_differential.py holds the simulator's pass equal to the shared one,
but both sides call the same `victims.choose_victims` and `guard.keeps_reservation`: a bug in
those is on both sides and passes. The oracle below is written from the specification
(docs/policy.md, "The policy in a page"; the docstrings of preemption/scheduling/victims.py and
guard.py), calls nothing from preemption/ (only `decide`, the code under test, comes from
there), and is slow on purpose: it enumerates every order in which the spec allows ties to be
broken and recomputes every reserved start from the list of holds, time by time.

The states are the one decision it covers in full: a cluster whose nodes are all held by
running jobs (mostly batch, some interactive), one pending interactive job, zero to three
pending batch jobs (the guard is the one vjob's order puts first, below), a previous tick's
anchor or none.
`decide` is called as agent/loop.py calls it: policy from the configuration, the RMS's
priority knob, `checkpointable` = the running jobs whose pilot runs their VM (a drawn
subset), the anchors handed back, no costs (the agent's default: a checkpoint takes no time)
— and once with a checkpoint bandwidth, so that the victims' return (2 × their checkpoint)
matters too.

The spec, as the oracle reads it:
* the interactive job preempts only within the cap: interactive jobs together hold at most
  `interactive_cap` × usable nodes;
* victims are running batch jobs whose pilot runs their VM and that were checkpointed fewer
  than `max_preemptions` times; taken in the order: fewer earlier preemptions, a larger share
  of their nodes already on the interactive job's OS image, a smaller checkpoint (memory of
  every node), the job id; until together they hold the nodes needed; then any victim not
  needed is released again, highest cost (preemptions) first (ties in any order);
* the guard (the first pending batch job of the order: with `tier_order = "ubis"` the highest
  UBIS priority, rated by `ubis_priority.compute`, which its own reference loop holds; then,
  or with "submit" only, the earlier submission,
  then the lower id) must keep its EASY reserved start — the earliest time
  at which enough nodes are free, an end in the past counting as now — within `head_slack_s`
  of its anchor (the previous tick's, else the one it has now), in the pessimistic model:
  each victim holds all its nodes again from the interactive job's estimated end (its start
  once every victim's checkpoint is written, plus its walltime), for its remaining estimate
  plus a remote resume, 2 × its checkpoint time; a guard larger than the machine is never
  delayed;
* the interactive job then runs on `nodes` of its victims' nodes, those on its OS first.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preemption.scheduling.pass_state import Costs
from preemption.scheduling.tick import Decision, decide
from ubis_priority import compute
from vjob.config import Config, PriorityConfig, SchedulingConfig
from vjob.model import ClusterView, Job, JobClass, JobState, Node
from vjob.rms import PriorityKnob

NOW = 50_000.0
MIB = 1024 * 1024
KNOB = PriorityKnob(0, 1_000_000, min_step=1000)
"""Slurm's site factor, as the Slurm adapter declares it."""


@dataclass(frozen=True)
class Case:
    view: ClusterView
    cfg: Config
    checkpointable: frozenset[str]
    anchors: dict[str, float]
    interactive: Job
    guard: Job | None


@st.composite
def cases(draw: st.DrawFn) -> Case:
    n_nodes = draw(st.integers(2, 8))
    images = draw(st.integers(1, 2))
    running: list[Job] = []
    node_os: list[str] = []
    used = 0
    while used < n_nodes:
        k = len(running)
        size = draw(st.integers(1, min(3, n_nodes - used)))
        image = f"os{draw(st.integers(0, images - 1))}"
        interactive = draw(st.integers(0, 9)) == 0
        start = NOW - draw(st.integers(0, 20_000))
        running.append(
            Job(
                id=str(k + 1),
                user=f"u{draw(st.integers(0, 2))}",
                job_class=JobClass.INTERACTIVE if interactive else JobClass.BATCH,
                nodes=size,
                memory_mb=draw(st.sampled_from([256, 1000, 4096])),
                os_image=image,
                submit_time=start - 10,
                walltime=float(draw(st.integers(1, 30_000))),  # some have overrun their estimate
                state=JobState.RUNNING,
                allocated_nodes=tuple(f"n{i}" for i in range(used, used + size)),
                start_time=start,
                preempt_count=draw(st.sampled_from([0, 0, 0, 1, 1, 2, 3])),
            )
        )
        node_os += [image] * size
        used += size
    first_pending = len(running) + 1
    inter = Job(
        id=str(first_pending),
        user="u9",
        job_class=JobClass.INTERACTIVE,
        nodes=draw(st.integers(1, min(4, n_nodes))),
        memory_mb=512,
        os_image=f"os{draw(st.integers(0, images - 1))}",
        submit_time=NOW - 5,
        walltime=float(draw(st.integers(60, 7200))),
        state=JobState.PENDING,
    )
    batch = [
        Job(
            id=str(first_pending + 1 + b),
            user=f"u{draw(st.integers(0, 2))}",
            job_class=JobClass.BATCH,
            nodes=draw(st.integers(1, n_nodes + 1)),  # n + 1: a guard that can never start
            memory_mb=1000,
            os_image="os0",
            submit_time=NOW - 1000 + b,
            walltime=3600.0,
            state=JobState.PENDING,
        )
        for b in range(draw(st.integers(0, 3)))
    ]
    cfg = Config(
        priority=PriorityConfig(interactive_cap=draw(st.sampled_from([0.3, 1.0, 1.0, 1.0]))),
        scheduling=SchedulingConfig(
            policy="vjob",
            tier_order=draw(st.sampled_from(["submit", "ubis", "ubis-interactive"])),
            max_preemptions=draw(st.sampled_from([0, 1, 2, 2, 3])),
            head_slack_s=float(draw(st.sampled_from([0, 0, 60, 600, 5000, 1e9]))),
        ),
    )
    view = ClusterView(
        now=NOW,
        nodes=tuple(Node(f"n{i}", cpus=1, memory_mb=8192, os_image=os) for i, os in enumerate(node_os)),
        jobs=(*running, inter, *batch),
        images=tuple(f"os{i}" for i in range(images)),
    )
    prio = compute(view, cfg.priority).as_dict()
    rated = cfg.scheduling.tier_order == "ubis"  # "ubis-interactive" leaves the batch tier by submission
    guard = min(batch, key=lambda j: (-prio[j.id] if rated else 0.0, j.submit_time, len(j.id), j.id)) if batch else None
    anchors = {}
    if guard is not None and draw(st.booleans()):
        anchors[guard.id] = NOW + draw(st.integers(0, 30_000))
    ids = [j.id for j in running]
    checkpointable = frozenset(draw(st.sets(st.sampled_from(ids))) if draw(st.integers(0, 3)) == 0 else ids)
    return Case(view, cfg, checkpointable, anchors, inter, guard)


# -- the oracle: nothing from preemption/ -------------------------------------------------------


def reserved_start(free: int, need: int, holds: list[tuple[float, int]]) -> float:
    """The earliest time at which `need` nodes are free: now if they are, else the first end
    (an end in the past counts as now) by which the free nodes and those released reach it."""
    if need <= free:
        return NOW
    for t in sorted({max(end, NOW) for end, _ in holds}):
        if free + sum(n for end, n in holds if max(end, NOW) <= t) >= need:
            return t
    return math.inf


def checkpoint_s(job: Job, bandwidth: float) -> float:
    """A checkpoint writes each node's memory, all nodes at once."""
    return job.memory_mb / bandwidth


def victim_sets(case: Case, need: int) -> set[tuple[str, ...]]:
    """Every victim set the spec allows (several only when equal costs make the release order
    free), each in the order taken; empty when the candidates cannot free `need` nodes."""
    cfg, inter = case.cfg, case.interactive
    cands = [
        j
        for j in case.view.jobs
        if j.state is JobState.RUNNING
        and j.job_class is JobClass.BATCH
        and j.id in case.checkpointable
        and j.preempt_count < cfg.scheduling.max_preemptions
    ]
    if sum(j.nodes for j in cands) < need:
        return set()
    node_os = {n.name: n.os_image for n in case.view.nodes}

    def share(j: Job) -> float:
        return sum(1 for n in j.allocated_nodes if node_os[n] == inter.os_image) / j.nodes

    taken: list[Job] = []
    for j in sorted(cands, key=lambda j: (j.preempt_count, -share(j), j.memory_mb * MIB * j.nodes, j.id)):
        if sum(t.nodes for t in taken) >= need:
            break
        taken.append(j)
    out = set()
    # release order: highest preempt count first, ties in every order the spec leaves open
    for order in itertools.permutations(taken):
        if any(a.preempt_count < b.preempt_count for a, b in itertools.pairwise(order)):
            continue
        kept = list(taken)
        for j in order:
            if sum(k.nodes for k in kept) - j.nodes >= need:
                kept.remove(j)
        out.add(tuple(j.id for j in kept))
    return out


def guard_allows(case: Case, victims: list[Job], bandwidth: float) -> bool:
    guard = case.guard
    if guard is None:
        return True
    holds = [(j.start_time + j.walltime, j.nodes) for j in case.view.running]  # type: ignore[operator]
    before = reserved_start(0, guard.nodes, holds)
    if math.isinf(before):
        return True
    ready = NOW + max(checkpoint_s(v, bandwidth) for v in victims)
    interactive_end = ready + case.interactive.walltime  # type: ignore[operator]
    gone = {v.id for v in victims}
    after_holds = [(j.start_time + j.walltime, j.nodes) for j in case.view.running if j.id not in gone]  # type: ignore[operator]
    after_holds += [
        (interactive_end + max(0.0, v.start_time + v.walltime - NOW) + 2 * checkpoint_s(v, bandwidth), v.nodes)  # type: ignore[operator]
        for v in victims
    ]
    after = reserved_start(0, guard.nodes, after_holds)
    return after <= case.anchors.get(guard.id, before) + case.cfg.scheduling.head_slack_s


def within_cap(case: Case) -> bool:
    held = sum(j.nodes for j in case.view.running if j.job_class is JobClass.INTERACTIVE)
    return held + case.interactive.nodes <= case.cfg.priority.interactive_cap * len(case.view.nodes)


def check(case: Case, decision: Decision, bandwidth: float) -> None:
    inter = case.interactive
    by_id = {j.id: j for j in case.view.jobs}
    allowed_sets = victim_sets(case, inter.nodes) if within_cap(case) else set()
    passing = {s for s in allowed_sets if guard_allows(case, [by_id[v] for v in s], bandwidth)}
    mine = [p for p in decision.preemptions if p.job_id == inter.id]
    assert all(p.job_id == inter.id for p in decision.preemptions), decision.preemptions
    if not mine:
        assert not passing, f"the interactive job waits, the spec lets it preempt {sorted(passing)}"
        assert inter.id in decision.waiting_interactive
        return
    (pre,) = mine
    assert pre.victims in allowed_sets, f"victims {pre.victims}, the spec allows {sorted(allowed_sets)}"
    assert pre.victims in passing, f"victims {pre.victims} move the guard beyond its slack"
    victim_nodes = [n for v in pre.victims for n in by_id[v].allocated_nodes]
    assert len(set(pre.nodes)) == inter.nodes and set(pre.nodes) <= set(victim_nodes)
    node_os = {n.name: n.os_image for n in case.view.nodes}
    on_os = sum(1 for n in victim_nodes if node_os[n] == inter.os_image)
    assert sum(1 for n in pre.nodes if node_os[n] == inter.os_image) == min(on_os, inter.nodes)
    assert pre.checkpoint_bytes == sum(by_id[v].memory_mb * MIB * by_id[v].nodes for v in pre.victims)
    assert inter.id in decision.starts


def as_the_agent_decides(case: Case, costs: Costs | None = None) -> Decision:
    """agent/loop.py's call (`Agent.tick`); `costs` only for the variant with a bandwidth."""
    extra = {} if costs is None else {"costs": costs}
    return decide(
        case.view,
        case.cfg,
        knob=KNOB,
        checkpointable=case.checkpointable,
        sleeping={},
        anchors=case.anchors,
        **extra,
    )


ORACLE = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@ORACLE
@given(cases())
def test_the_agents_decision_chooses_the_victims_and_keeps_the_guard_as_specified(case: Case) -> None:
    check(case, as_the_agent_decides(case), math.inf)


@ORACLE
@given(cases(), st.sampled_from([0.5, 3.0, 50.0]))
def test_the_same_with_checkpoints_that_take_time(case: Case, bandwidth: float) -> None:
    check(case, as_the_agent_decides(case, Costs(bandwidth_mb_s=bandwidth)), bandwidth)
