"""The three scheduling policies as queue orders plus a preemption switch, and their live entry
point `decide(view, policy, cfg)`.

Why a policy is an order: with EASY backfilling as the shared mechanism (easy.py), what
distinguishes the paper's contenders is whom the scheduler serves first and whether an
interactive job may take nodes from running batch jobs:

- `fcfs-easy`: submission order; no class is special; nobody is preempted.
- `mms` (the paper's "modified Maui scheduler"): interactive jobs within the interactive cap
  go first, in submission order, and the first of them that does not fit gets the EASY
  reservation (Maui gathers nodes for it as they free up); no preemption.
- `mms-block`: `mms` as the UBIS paper describes its baseline's behaviour ("blocks for
  available nodes, preventing any new jobs from executing until the high priority job receives
  its resource requirements"): no backfilling while an interactive job holds the reservation.
- `ubis`: UBIS priority order (ubis_priority's kernel); an interactive job within the cap
  that does not fit checkpoints the lowest-priority batch jobs (victims.py) and starts once
  their checkpoints are written; preempted jobs queue again with their Pn/Pt raised.

Interactive jobs beyond the cap are ordinary jobs under every policy (ubis_priority sets
their I term to 0): they are neither refused nor allowed to preempt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from preemption.scheduling.easy import backfill, reservation
from preemption.scheduling.victims import VictimChoice, running_priorities, select_victims
from vjob.config import PriorityConfig
from vjob.errors import InputError
from vjob.model import ClusterView, Job, JobState

POLICIES = ("fcfs-easy", "mms", "mms-block", "ubis")


def check_policy(name: str) -> str:
    """`name` if it is a known policy, else an InputError listing the known ones."""
    if name not in POLICIES:
        raise InputError(f"--policy = {name!r}: must be one of {', '.join(POLICIES)}")
    return name


def blocks_behind_interactive(policy: str) -> bool:
    """Whether nothing may backfill while an interactive job holds the reservation."""
    return policy == "mms-block"


def preempts(policy: str) -> bool:
    """Whether interactive jobs may checkpoint batch jobs under `policy`."""
    return policy == "ubis"


def fcfs_order(submit: Sequence[float] | np.ndarray) -> np.ndarray:
    """Indices in submission order (stable: equal times keep their given order)."""
    return np.argsort(np.asarray(submit, dtype=np.float64), kind="stable")


def mms_order(submit: Sequence[float] | np.ndarray, privileged: Sequence[bool] | np.ndarray) -> np.ndarray:
    """Privileged interactive jobs first, then everyone else, each group in submission order."""
    sub = np.asarray(submit, dtype=np.float64)
    priv = np.asarray(privileged, dtype=bool)
    return np.lexsort((sub, ~priv))


def ubis_order(priority: Sequence[float] | np.ndarray, submit: Sequence[float] | np.ndarray) -> np.ndarray:
    """Highest UBIS priority first; ties to the earlier submission."""
    return np.lexsort((np.asarray(submit, dtype=np.float64), -np.asarray(priority, dtype=np.float64)))


@dataclass(frozen=True)
class Decision:
    """What a policy wants done now: start these jobs (preempting the victims first)."""

    start: tuple[str, ...]
    preemptions: tuple[VictimChoice, ...]
    reserved: str | None
    """The job holding the EASY reservation, if any."""


def decide(view: ClusterView, policy: str, cfg: PriorityConfig, *, depth: int | None = None) -> Decision:
    """One scheduling pass of `policy` over a ClusterView (the live agent's entry point).

    Job estimates are `walltime` (else 1 h); running jobs end at start + walltime. The answer
    lists the jobs to start (in order) and, for ubis, the victims to checkpoint for each
    interactive job that needs them; nothing is changed.
    """
    from ubis_priority import compute, interactive_allowed

    check_policy(policy)
    pending = list(view.pending)
    if not pending:
        return Decision((), (), None)
    usable = sum(1 for n in view.nodes if n.state.usable)
    free = len(view.free_nodes())
    privileged = [j.interactive and interactive_allowed(view, j, cfg) for j in pending]
    submit = [j.submit_time for j in pending]
    if policy == "fcfs-easy":
        order = fcfs_order(submit)
    elif policy in ("mms", "mms-block"):
        order = mms_order(submit, privileged)
    else:
        prios = compute(view, cfg)
        by_id = prios.as_dict()
        order = ubis_order([by_id[j.id] for j in pending], submit)
    running = [(_end(j, view.now), len(j.allocated_nodes) or j.nodes) for j in view.running]
    started: list[str] = []
    held_interactive = sum(n for j, n in zip(view.running, (r[1] for r in running), strict=True) if j.interactive)
    cap = cfg.interactive_cap * usable
    queue = [pending[i] for i in order]
    head: Job | None = None
    head_priv = False
    rest: list[Job] = []
    for k, job in enumerate(queue):
        is_priv = job.interactive and held_interactive + job.nodes <= cap
        if job.nodes <= free:
            started.append(job.id)
            free -= job.nodes
            running.append((view.now + _estimate(job), job.nodes))
            held_interactive += job.nodes if is_priv else 0
            continue
        if preempts(policy) and is_priv and not started:
            # One preemption per pass: the next pass sees the checkpoints under way, so two
            # interactive jobs never count on the same free nodes or the same victims.
            choice = select_victims(view, job, running_priorities(view, cfg), interactive_cap=cfg.interactive_cap)
            if choice is not None:
                return Decision((job.id,), (choice,), None)
        head, head_priv = job, is_priv
        rest = queue[k + 1 :]
        break
    if head is None or (blocks_behind_interactive(policy) and head_priv):
        return Decision(tuple(started), (), None if head is None else head.id)
    shadow, extra = reservation(view.now, free, head.nodes, running)
    late = backfill(
        view.now,
        free,
        shadow,
        extra,
        list(range(len(rest))),
        [j.nodes for j in rest],
        [_estimate(j) for j in rest],
        depth=depth,
    )
    return Decision(tuple(started) + tuple(rest[i].id for i in late), (), head.id)


def _estimate(job: Job) -> float:
    return job.walltime if job.walltime and job.walltime > 0 else 3600.0


def _end(job: Job, now: float) -> float:
    if job.state is not JobState.RUNNING or job.start_time is None:
        return now
    return job.start_time + _estimate(job)
