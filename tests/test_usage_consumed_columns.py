"""The usage charged and the codes placed from the jobs' columns are the per-job rules', to the bit.

Why: issue 37 (round 2) has `ubis_priority.usage._consumed` look only at the running and
finished jobs, found in the jobs' columns (job_columns), instead of every job of the view
(100,000 of them pending at a site's size). Held here against the former loop over every job,
on seeded random views of every state, with and without a previous charge, and on the same
Job objects seen again with others changed (the columns are kept per object). Beside it,
`job_columns.Strings.positions`, whose look-ups moved into C, against its former loop.
"""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from ubis_priority.job_columns import Strings, preempted_running
from ubis_priority.usage import ACCOUNT, USER, _consumed
from vjob.model import ClusterView, Job, JobState, Node

NOW = 1_000_000.0


def _former(view: ClusterView, since: float | None) -> dict[tuple[str, str], float]:
    """`_consumed` before the columns: every job of the view looked at."""
    amounts: dict[tuple[str, str], float] = {}
    for job in view.jobs:
        if job.start_time is None:
            continue
        if job.state is JobState.RUNNING:
            end = view.now
        elif job.state.finished and job.end_time is not None:
            end = min(job.end_time, view.now)
        else:
            continue
        begin = job.start_time if since is None else max(job.start_time, since)
        if end <= begin:
            continue
        node_seconds = float(len(job.allocated_nodes) or job.nodes) * (end - begin)
        keys = [(USER, job.user)] + ([(ACCOUNT, job.account)] if job.account else [])
        for key in keys:
            amounts[key] = amounts.get(key, 0.0) + node_seconds
    return amounts


def _job(rnd: random.Random, k: int) -> Job:
    state = rnd.choice(list(JobState))
    started = rnd.random() < 0.8 or state is JobState.RUNNING
    start = NOW - rnd.uniform(0, 5000) if started else None
    return Job(
        id=str(k),
        user=f"u{rnd.randrange(4)}",
        account=rnd.choice(("", "a", "b")),
        nodes=rnd.randrange(1, 4),
        state=state,
        submit_time=NOW - 6000,
        start_time=start,
        end_time=None if start is None or rnd.random() < 0.3 else start + rnd.uniform(0, 7000),
        allocated_nodes=tuple(f"n{i}" for i in range(rnd.randrange(0, 3))) if started else (),
    )


@pytest.mark.parametrize("seed", range(30))
def test_the_charged_amounts_are_the_former_loops(seed: int) -> None:
    rnd = random.Random(seed)
    jobs = [_job(rnd, k) for k in range(rnd.randrange(0, 120))]
    nodes = tuple(Node(f"n{i}", cpus=1, memory_mb=1024) for i in range(3))
    for step in range(3):  # the same objects again, some replaced: the columns kept per object
        view = ClusterView(now=NOW + step, nodes=nodes, jobs=tuple(jobs))
        for since in (None, NOW - rnd.uniform(0, 4000)):
            got = _consumed(view, since)
            assert list(got.items()) == list(_former(view, since).items())
        for k in rnd.sample(range(len(jobs)), min(len(jobs), 5)):
            jobs[k] = _job(rnd, k)


@pytest.mark.parametrize("seed", range(30))
def test_the_positions_of_codes_are_the_per_value_loops(seed: int) -> None:
    """`Strings.positions` (looked up in C, the loop kept for a value listed twice) against
    the loop it replaced, with values never numbered and values repeated."""
    rnd = random.Random(seed)
    table = Strings()
    for k in rnd.sample(range(40), rnd.randrange(0, 40)):
        table(("u", k) if k % 2 else f"v{k}")
    ordered = [("u", k) if k % 2 else f"v{k}" for k in (rnd.randrange(0, 60) for _ in range(rnd.randrange(0, 50)))]
    if rnd.random() < 0.5:
        ordered = list(dict.fromkeys(ordered))  # each once, as the share entities and users are
    expected = np.full(len(table.values) + 1, -1, dtype=np.int64)
    for k, value in enumerate(ordered):
        if value in table.code:
            expected[table.code[value]] = k
    assert table.positions(ordered).tolist() == expected.tolist()


@pytest.mark.parametrize("seed", range(20))
def test_the_preempted_running_jobs_are_those_of_the_view(seed: int) -> None:
    """`job_columns.preempted_running` (what act.record_resumes looks at) is the view's
    running jobs with a preemption time open, in order, on objects seen again."""
    rnd = random.Random(seed)
    jobs = [replace(_job(rnd, k), preempted_since=rnd.choice((None, NOW - 50.0))) for k in range(rnd.randrange(0, 90))]
    nodes = tuple(Node(f"n{i}", cpus=1, memory_mb=1024) for i in range(3))
    for _ in range(3):
        view = ClusterView(now=NOW, nodes=nodes, jobs=tuple(jobs))
        expected = [j for j in view.running if j.preempted_since is not None]
        assert [id(j) for j in preempted_running(view.jobs)] == [id(j) for j in expected]
        for k in rnd.sample(range(len(jobs)), min(len(jobs), 5)):
            jobs[k] = replace(jobs[k], preempted_since=None if jobs[k].preempted_since else NOW - 5.0)
