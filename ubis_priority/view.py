"""`compute(view, cfg)`: the UBIS priorities of a ClusterView's pending jobs.

Why a separate step that builds columns: the kernel works on arrays (for the simulator's
sake); this module is the one place that turns the model's Job/Node objects into those
arrays, so that the live agent, `vjob prio` and the tests all go through the same path.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np

from ubis_priority import job_columns
from ubis_priority.interactive import held_by_interactive
from ubis_priority.kernel import ClusterArrays, JobArrays, TermArrays, compute_arrays
from ubis_priority.shares import share_entities_of, target_shares, usage_shares
from ubis_priority.terms import SCALES, TERMS
from vjob.config import PriorityConfig
from vjob.model import ClusterView, Job

_job_id = attrgetter("id")


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
        """job id → priority (`tolist` gives the very floats `float()` of each would)."""
        return dict(zip(map(_job_id, self.jobs), self.terms.priority.tolist(), strict=True))

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

    The jobs' own values come from `job_columns` (read once per Job object, then gathered):
    at 100,000 jobs reading them at every call, not the kernel, was what the agent paid for.
    """
    cols = job_columns.columns(view.jobs)
    state = cols.state
    at = np.flatnonzero((state == job_columns.PENDING) | (state == job_columns.HELD))
    pending = cols.pick(at)
    is_running = state == job_columns.RUNNING
    running = cols.pick(np.flatnonzero(is_running))
    table = cols.table
    usable = [n for n in view.nodes if n.state.usable]
    busy = {name for job in running for name in job.allocated_nodes}
    free = [n for n in usable if n.name not in busy]

    os_code = cols.os_code[at]
    images = sorted({*view.images, *(n.os_image for n in view.nodes), *table.images.present(os_code)} - {""})
    image_index = {name: k for k, name in enumerate(images)}
    free_by_os = np.zeros(len(images), dtype=np.int64)
    for node in free:
        if node.os_image:
            free_by_os[image_index[node.os_image]] += 1

    entities, targets = _shares(table, table.shares.present(cols.share_code), view, cfg)
    users = sorted({u for u, _ in entities}.union(table.users.present(cols.user_code[is_running])))
    used = usage_shares(view.usage)

    held, per_user = held_by_interactive(cols.pick(np.flatnonzero(is_running & cols.interactive)))  # its only ones
    user_held = np.array([per_user.get(u, 0) for u in users], dtype=np.int64)

    cluster = ClusterArrays(
        now=view.now,
        total_nodes=len(usable),
        free_nodes=len(free),
        free_by_os=free_by_os,
        target=np.fromiter(map(targets.__getitem__, entities), dtype=np.float64, count=len(entities)),
        usage=np.fromiter(
            map(used.get, map(itemgetter(0), entities), repeat(0.0)), dtype=np.float64, count=len(entities)
        ),
        interactive_held=held,
        user_interactive_held=user_held,
    )
    jobs = JobArrays(
        submit_time=cols.submit_time[at],
        nodes=cols.nodes[at],
        os_index=table.images.positions(images)[os_code],  # "" is not among `images`: -1
        preempt_count=cols.preempt_count[at],
        preempted_s=_preempted(cols.preempted_seconds[at], cols.preempted_since[at], view.now),
        interactive=cols.interactive[at],
        share_index=table.shares.positions(entities)[cols.share_code[at]],
        user_index=table.users.positions(users)[cols.user_code[at]],
    )
    return pending, jobs, cluster


def _shares(
    table: job_columns.JobColumns, pairs: list[Any], view: ClusterView, cfg: PriorityConfig
) -> tuple[list[tuple[str, str]], dict[tuple[str, str], float]]:
    """The share entities and their targets (`shares.share_entities`, `target_shares`), the
    last ones again while the jobs' (user, account) pairs, the users with usage or a target
    and the targets are the same: 8,000 pairs at a site's size, 0.02 s a tick to redo. The
    targets are compared by `repr` (0.0 and -0.0 are not the same target to the bit)."""
    key = (
        pairs,
        tuple(view.usage),
        repr(tuple(view.targets.items())),
        repr((sorted(cfg.targets.items()), sorted(cfg.account_targets.items()))),
    )
    last = table.memo.get("shares")
    if last is not None and last[0] == key:
        return last[1]  # type: ignore[return-value]
    entities = share_entities_of(pairs, (*view.usage, *view.targets))
    answer = (entities, target_shares(entities, view.targets, cfg))
    table.memo["shares"] = (key, answer)
    return answer


def _preempted(seconds: np.ndarray, since: np.ndarray, now: float) -> np.ndarray:
    """Pt of every job, vectorised `preempted_seconds` (same arithmetic, same result): `since`
    is NaN where no preemption runs, and `now > NaN` is false, as `now > now` was."""
    open_ = now > since
    if open_.any():
        seconds[open_] = seconds[open_] + (now - since[open_])
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
