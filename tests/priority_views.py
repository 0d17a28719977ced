"""Hypothesis strategies for ClusterViews, shared by the priority tests."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from vjob.config import PriorityConfig, PriorityWeights
from vjob.model import ClusterView, Job, JobClass, JobState, Node, NodeState

IMAGES = ("debian", "centos", "suse")
USERS = ("alice", "bob", "carol", "dave")


@st.composite
def views(draw: st.DrawFn, *, min_pending: int = 0, max_nodes: int = 24) -> ClusterView:
    """A consistent view: nodes with images and states, running jobs on some of them, pending jobs."""
    n_nodes = draw(st.integers(0, max_nodes))
    nodes = [
        Node(
            name=f"n{i}",
            cpus=8,
            memory_mb=16384,
            os_image=draw(st.sampled_from(("", *IMAGES))),
            state=draw(st.sampled_from([NodeState.IDLE] * 4 + [NodeState.DOWN, NodeState.DRAINED])),
        )
        for i in range(n_nodes)
    ]
    now = draw(st.floats(1e6, 2e9))
    jobs: list[Job] = []
    free = [n.name for n in nodes if n.state.usable]
    k = 0
    while free and draw(st.booleans()):
        size = draw(st.integers(1, len(free)))
        alloc, free = tuple(free[:size]), free[size:]
        jobs.append(
            Job(
                id=f"r{k}",
                user=draw(st.sampled_from(USERS)),
                job_class=draw(st.sampled_from(list(JobClass))),
                nodes=size,
                state=JobState.RUNNING,
                start_time=now - 10,
                allocated_nodes=alloc,
            )
        )
        k += 1
    n_pending = draw(st.integers(min_pending, 12))
    for i in range(n_pending):
        jobs.append(
            Job(
                id=f"p{i}",
                user=draw(st.sampled_from(USERS)),
                account=draw(st.sampled_from(("", "phys", "chem"))),
                job_class=draw(st.sampled_from(list(JobClass))),
                nodes=draw(st.integers(1, max_nodes + 5)),
                os_image=draw(st.sampled_from(("", *IMAGES, "plan9"))),
                submit_time=now - draw(st.floats(0, 30 * 86400)),
                preempt_count=draw(st.integers(0, 8)),
                preempted_seconds=draw(st.floats(0, 3 * 86400)),
                preempted_since=draw(st.none() | st.floats(now - 86400, now + 10)),
                state=draw(st.sampled_from((JobState.PENDING, JobState.HELD))),
            )
        )
    usage = draw(st.dictionaries(st.sampled_from(USERS), st.floats(0, 1e9), max_size=4))
    targets = draw(st.dictionaries(st.sampled_from(USERS[:2]), st.floats(0, 0.5), max_size=2))
    return ClusterView(now=now, jobs=tuple(jobs), nodes=tuple(nodes), images=IMAGES, usage=usage, targets=targets)


# A weight is 0 (term switched off) or at least 1e-3: a subnormal weight would be lost in the
# rounding of the sum, and no admin sets one.
weight = st.just(0.0) | st.floats(1e-3, 2)
weights = st.builds(
    PriorityWeights,
    usage=weight,
    queue_time=weight,
    os_available=weight,
    preempt_count=weight,
    preempt_time=weight,
    free_nodes=weight,
    interactive=weight,
)

configs = st.builds(
    PriorityConfig,
    weights=weights,
    max_queue_time_s=st.floats(60, 30 * 86400),
    max_preempt_count=st.integers(1, 10),
    max_preempt_time_s=st.floats(60, 7 * 86400),
    interactive_cap=st.floats(0, 1),
    interactive_user_cap=st.none() | st.floats(0, 1),
)


def with_job(view: ClusterView, job: Job) -> ClusterView:
    """`view` with the job of the same id replaced by `job`."""
    return replace(view, jobs=tuple(job if j.id == job.id else j for j in view.jobs))
