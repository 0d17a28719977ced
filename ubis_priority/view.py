"""`compute(view, cfg)`: the UBIS priorities of a ClusterView's pending jobs.

Why a separate step that builds columns: the kernel works on arrays (for the simulator's
sake); this module is the one place that turns the model's Job/Node objects into those
arrays, so that the live agent, `vjob prio` and the tests all go through the same path.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from ubis_priority.interactive import held_by_interactive
from ubis_priority.kernel import ClusterArrays, JobArrays, TermArrays, compute_arrays
from ubis_priority.shares import share_entities, target_shares, usage_shares
from ubis_priority.terms import SCALES, TERMS
from vjob.config import PriorityConfig
from vjob.model import ClusterView, Job, JobClass, JobState


@dataclass(frozen=True)
class TermExplanation:
    """One term of one job: raw value → normalised (0..1) → weighted."""

    term: str
    raw: float
    normalised: float
    weight: float
    weighted: float
    scale: str
    note: str = ""


@dataclass(frozen=True)
class Explanation:
    """Why a job has its priority, term by term (what `vjob prio --explain` prints)."""

    job_id: str
    user: str
    priority: float
    max_priority: float
    terms: tuple[TermExplanation, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job_id,
            "user": self.user,
            "priority": self.priority,
            "max_priority": self.max_priority,
            "terms": [t.__dict__ for t in self.terms],
        }


@dataclass(frozen=True)
class Priorities:
    """The priorities of the pending jobs of one view, in the view's order, with all terms."""

    jobs: tuple[Job, ...]
    terms: TermArrays

    @property
    def job_ids(self) -> tuple[str, ...]:
        return tuple(j.id for j in self.jobs)

    @property
    def values(self) -> np.ndarray:
        """The float priorities, in 0..max_priority."""
        return self.terms.priority

    def __len__(self) -> int:
        return len(self.jobs)

    def as_dict(self) -> dict[str, float]:
        """job id → priority."""
        return {j.id: float(p) for j, p in zip(self.jobs, self.terms.priority, strict=True)}

    @cached_property
    def _positions(self) -> dict[str, int]:
        return {job.id: i for i, job in enumerate(self.jobs)}

    def index(self, job_id: str) -> int:
        """Position of `job_id` in `jobs` and in the arrays; KeyError when it is not pending."""
        return self._positions[job_id]

    def ranked(self) -> list[int]:
        """Indices from highest to lowest priority; ties go to the earlier submission, then
        the smaller job id, so the order is the same on every run."""
        order = sorted(
            range(len(self.jobs)),
            key=lambda i: (-float(self.terms.priority[i]), self.jobs[i].submit_time, self.jobs[i].id),
        )
        return order

    def explain(self, job_id: str) -> Explanation:
        i = self.index(job_id)
        t = self.terms
        notes = dict.fromkeys(TERMS, "")
        if t.capped[i]:
            notes["interactive"] = "interactive cap reached: the I term counts 0"
        job = self.jobs[i]
        if job.os_image == "":
            notes["os_available"] = "no OS image asked: every free node counts as running it"
        return Explanation(
            job_id=job.id,
            user=job.user,
            priority=float(t.priority[i]),
            max_priority=t.max_priority,
            terms=tuple(
                TermExplanation(
                    term=name,
                    raw=float(t.raw[k, i]),
                    normalised=float(t.normalised[k, i]),
                    weight=t.weights[k],
                    weighted=float(t.weighted[k, i]),
                    scale=SCALES[name],
                    note=notes[name],
                )
                for k, name in enumerate(TERMS)
            ),
        )


def arrays_from_view(view: ClusterView, cfg: PriorityConfig) -> tuple[tuple[Job, ...], JobArrays, ClusterArrays]:
    """The kernel's columns for `view` (pending and held jobs, in the view's order).

    One pass sorts the jobs into pending and running (the view's properties would scan all
    jobs once per use), then one comprehension per column: at 100,000 jobs this, not the
    kernel, is what the agent path pays for.
    """
    pending_list: list[Job] = []
    running: list[Job] = []
    for job in view.jobs:
        if job.state is JobState.PENDING or job.state is JobState.HELD:
            pending_list.append(job)
        elif job.state is JobState.RUNNING:
            running.append(job)
    pending = tuple(pending_list)
    usable = [n for n in view.nodes if n.state.usable]
    busy = {name for job in running for name in job.allocated_nodes}
    free = [n for n in usable if n.name not in busy]

    images = sorted({*view.images, *(n.os_image for n in view.nodes), *(j.os_image for j in pending)} - {""})
    image_index = {name: k for k, name in enumerate(images)}
    free_by_os = np.zeros(len(images), dtype=np.int64)
    for node in free:
        if node.os_image:
            free_by_os[image_index[node.os_image]] += 1
    image_index[""] = -1

    entities = share_entities(view.jobs, (*view.usage, *view.targets))
    users = sorted({u for u, _ in entities} | {j.user for j in running})
    share_of = {e: k for k, e in enumerate(entities)}
    targets = target_shares(entities, view.targets, cfg)
    used = usage_shares(view.usage)
    user_of = {u: k for k, u in enumerate(users)}

    held, per_user = held_by_interactive(running)
    user_held = np.array([per_user.get(u, 0) for u in users], dtype=np.int64)

    cluster = ClusterArrays(
        now=view.now,
        total_nodes=len(usable),
        free_nodes=len(free),
        free_by_os=free_by_os,
        target=np.array([targets[e] for e in entities], dtype=np.float64),
        usage=np.array([used.get(u, 0.0) for u, _ in entities], dtype=np.float64),
        interactive_held=held,
        user_interactive_held=user_held,
    )
    n = len(pending)
    jobs = JobArrays(
        submit_time=np.array([j.submit_time for j in pending], dtype=np.float64),
        nodes=np.array([j.nodes for j in pending], dtype=np.int64),
        os_index=np.array([image_index[j.os_image] for j in pending], dtype=np.int64),
        preempt_count=np.array([j.preempt_count for j in pending], dtype=np.int64),
        preempted_s=_preempted(
            np.array([j.preempted_seconds for j in pending], dtype=np.float64),
            [j.preempted_since for j in pending],
            view.now,
        ),
        interactive=np.fromiter((j.job_class is JobClass.INTERACTIVE for j in pending), dtype=np.bool_, count=n),
        share_index=np.array([share_of[(j.user, j.account)] for j in pending], dtype=np.int64),
        user_index=np.array([user_of[j.user] for j in pending], dtype=np.int64),
    )
    return pending, jobs, cluster


def _preempted(seconds: np.ndarray, since: list[float | None], now: float) -> np.ndarray:
    """Pt of every job, vectorised `preempted_seconds` (same arithmetic, same result)."""
    if all(s is None for s in since):
        return seconds
    start = np.array([now if s is None else s for s in since], dtype=np.float64)
    open_ = now > start
    seconds[open_] = seconds[open_] + (now - start[open_])
    return seconds


def preempted_seconds(job: Job, now: float) -> float:
    """Pt: the recorded preempted time plus the preemption still running at `now`, if any."""
    if job.preempted_since is not None and now > job.preempted_since:
        return job.preempted_seconds + (now - job.preempted_since)
    return job.preempted_seconds


def compute(view: ClusterView, cfg: PriorityConfig) -> Priorities:
    """The UBIS priority of every pending (or held) job of `view`."""
    pending, jobs, cluster = arrays_from_view(view, cfg)
    return Priorities(jobs=pending, terms=compute_arrays(jobs, cluster, cfg))
