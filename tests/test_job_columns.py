"""The jobs' columns kept between calls (ubis_priority.job_columns) give exactly what reading
the jobs afresh gives, tick after tick of a changing cluster.

Why: the agent's ticks keep a table of what the priority kernel and the scheduling pass read
of each Job object, found again by the object's identity (issue 37). A value kept for an
object that changed, a row given to the wrong object, or a string numbered twice would give
other priorities or another decision without failing anything else; so each tick of a seeded
random cluster (jobs kept as the same objects, changed as new ones, arriving, leaving, new
users, accounts and images) is decided twice: with the table kept since the first tick, and
with an empty one; priorities to the bit, decisions field by field.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import numpy as np
import pytest

from preemption.scheduling.tick import decide
from ubis_priority import compute, job_columns, reference
from ubis_priority.job_columns import JobColumns
from vjob.config import parse
from vjob.model import ClusterView, Job, JobClass, JobState, Node
from vjob.rms import PriorityKnob

NODES = 40
KNOB = PriorityKnob(low=1, high=10_000, min_step=1)


def _job(rnd: random.Random, k: int, now: float) -> Job:
    state = rnd.choice((JobState.PENDING, JobState.PENDING, JobState.RUNNING, JobState.HELD, JobState.COMPLETED))
    nodes = rnd.randrange(1, 3)
    since = None if rnd.random() < 0.7 else now - rnd.randrange(0, 500)
    return Job(
        id=str(k),
        user=f"u{rnd.randrange(6)}",
        account=rnd.choice(("", "a1", "a2")),
        job_class=JobClass.INTERACTIVE if rnd.random() < 0.2 else JobClass.BATCH,
        nodes=nodes,
        os_image=rnd.choice(("", "rhel", "deb")),
        submit_time=now - rnd.randrange(1, 5000),
        state=state,
        allocated_nodes=tuple(rnd.sample([f"n{i}" for i in range(NODES)], nodes)) if state is JobState.RUNNING else (),
        start_time=now - rnd.randrange(1, 900) if state is JobState.RUNNING else None,
        walltime=float(rnd.randrange(60, 7200)),
        preempt_count=rnd.randrange(0, 3),
        preempted_seconds=float(rnd.randrange(0, 300)),
        preempted_since=since,
    )


def _changed(rnd: random.Random, job: Job, now: float) -> Job:
    """A new object for `job` with one of what the columns hold changed."""
    what = rnd.randrange(6)
    if what == 0:
        return replace(job, state=JobState.PENDING if job.state is not JobState.PENDING else JobState.HELD)
    if what == 1:
        return replace(job, preempt_count=job.preempt_count + 1, preempted_since=now - 5)
    if what == 2:
        return replace(job, preempted_since=None, preempted_seconds=job.preempted_seconds + 7.5)
    if what == 3:
        return replace(job, user=f"new{rnd.randrange(3)}", account=rnd.choice(("", "a3")))
    if what == 4:
        return replace(job, os_image=rnd.choice(("", "rhel", "suse")))
    return replace(job, submit_time=job.submit_time - 1, nodes=job.nodes + 1)


def _views(seed: int, ticks: int) -> list[ClusterView]:
    """A cluster moving on: each tick most jobs the same objects, some changed, some gone,
    some new; the usage, the users who have some and the targets moving too."""
    rnd = random.Random(seed)
    now = 1_000_000.0
    jobs = {k: _job(rnd, k, now) for k in range(60)}
    nodes = tuple(Node(f"n{i}", 4, 8192, os_image=rnd.choice(("", "rhel", "deb"))) for i in range(NODES))
    out = []
    for _ in range(ticks):
        now += 30.0
        for k in rnd.sample(sorted(jobs), 6):
            jobs[k] = _changed(rnd, jobs[k], now)
        for k in rnd.sample(sorted(jobs), 3):
            del jobs[k]
        for _ in range(4):
            k = max(jobs) + 1
            jobs[k] = _job(rnd, k, now)
        order = sorted(jobs)
        if rnd.random() < 0.3:
            rnd.shuffle(order)  # the same objects in another order
        usage = {f"u{u}": float(rnd.randrange(0, 10_000)) for u in range(rnd.choice((5, 6, 8)))}
        targets = {"u2": rnd.choice((0.1, 0.2))} if rnd.random() < 0.5 else {}  # the store's targets moving
        out.append(ClusterView(now=now, jobs=tuple(jobs[k] for k in order), nodes=nodes, usage=usage, targets=targets))
    return out


@pytest.mark.parametrize("seed", range(8))
def test_kept_columns_give_the_priorities_and_decisions_of_an_empty_table(seed: int, monkeypatch) -> None:
    cfg = parse({"priority": {"targets": {"u1": 0.3}, "account_targets": {"a2": 0.2}}})
    kept = JobColumns()
    for view in _views(seed, 25):
        monkeypatch.setattr(job_columns, "TABLE", kept)
        warm = compute(view, cfg.priority)
        warm_decision = decide(view, cfg, knob=KNOB, checkpointable=None, sleeping={})
        monkeypatch.setattr(job_columns, "TABLE", JobColumns())
        cold = compute(view, cfg.priority)
        cold_decision = decide(view, cfg, knob=KNOB, checkpointable=None, sleeping={})
        assert warm.jobs == cold.jobs and all(a is b for a, b in zip(warm.jobs, cold.jobs, strict=True))
        assert warm.terms.priority.tobytes() == cold.terms.priority.tobytes()
        assert warm.terms.raw.tobytes() == cold.terms.raw.tobytes()
        assert warm_decision == cold_decision
        # and both are the plain per-job rule's (ubis_priority.reference)
        plain = reference.priorities(view, cfg.priority)
        assert warm.as_dict() == pytest.approx(plain, rel=1e-12, abs=1e-12)


def test_each_column_holds_what_the_object_holds_after_changes_and_rebuilds() -> None:
    """The table read back column by column against the objects, through enough churn that
    it is rebuilt (old objects let go) along the way."""
    table = JobColumns()
    rnd = random.Random(99)
    sizes = []
    for view in _views(99, 40):
        jobs = view.jobs
        for _ in range(30):  # 30 changed objects a call: the table outgrows its bound
            k = rnd.randrange(len(jobs))
            jobs = (*jobs[:k], replace(jobs[k], submit_time=jobs[k].submit_time + 1), *jobs[k + 1 :])
        cols = table.of(jobs)
        sizes.append(len(table))
        t = cols.table
        assert [job_columns.STATES[c] for c in cols.state.tolist()] == [j.state for j in jobs]
        assert cols.submit_time.tolist() == [j.submit_time for j in jobs]
        assert cols.nodes.tolist() == [j.nodes for j in jobs]
        assert cols.preempt_count.tolist() == [j.preempt_count for j in jobs]
        assert cols.preempted_seconds.tolist() == [j.preempted_seconds for j in jobs]
        since = [None if np.isnan(s) else s for s in cols.preempted_since.tolist()]
        assert since == [j.preempted_since for j in jobs]
        assert cols.interactive.tolist() == [j.interactive for j in jobs]
        assert [t.images.values[c] for c in cols.os_code.tolist()] == [j.os_image for j in jobs]
        assert [t.users.values[c] for c in cols.user_code.tolist()] == [j.user for j in jobs]
        assert [t.shares.values[c] for c in cols.share_code.tolist()] == [(j.user, j.account) for j in jobs]
        assert table.of(jobs) is cols  # the same tuple again: the same answer
    assert max(sizes) <= 2 * 1024 and any(b < a for a, b in itertools.pairwise(sizes))


def test_one_object_twice_in_a_call_gets_one_row() -> None:
    job = Job(id="1", user="u")
    other = Job(id="2", user="v", state=JobState.RUNNING)
    table = JobColumns()
    cols = table.of((job, other, job))
    assert len(table) == 2 and cols.user_code[0] == cols.user_code[2] != cols.user_code[1]
    assert cols.pick(np.array([2, 1])) == (job, other)
