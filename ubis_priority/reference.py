"""Equation 1 as a plain per-job Python loop: the oracle for the NumPy kernel.

Why keep a second implementation: the kernel's array code is easy to get subtly wrong (a
broadcast, an index off by one); this one reads like the paper, job by job, and the tests and
bench/priority.py check that both give the same priorities. It is not used in production.
The cluster-wide aggregates (free nodes per image, shares) are computed once, as any sane loop
would; only the per-job arithmetic is done job by job.
"""

from __future__ import annotations

from dataclasses import dataclass

from ubis_priority.interactive import allowed, held_by_interactive
from ubis_priority.shares import share_entities, target_shares, usage_shares
from ubis_priority.terms import weight_vector
from ubis_priority.view import preempted_seconds
from vjob.config import PriorityConfig
from vjob.model import ClusterView, Job


@dataclass(frozen=True)
class Context:
    """The cluster-wide values every job's priority needs, computed once per view."""

    now: float
    total_nodes: int
    free_nodes: int
    free_by_os: dict[str, int]
    targets: dict[tuple[str, str], float]
    usage: dict[str, float]
    interactive_held: int
    user_interactive_held: dict[str, int]
    weights: tuple[float, ...]


def context(view: ClusterView, cfg: PriorityConfig) -> Context:
    free = view.free_nodes()
    free_by_os: dict[str, int] = {}
    for node in free:
        free_by_os[node.os_image] = free_by_os.get(node.os_image, 0) + 1
    entities = share_entities(view.jobs, (*view.usage, *view.targets))
    held, user_held = held_by_interactive(view.running)
    return Context(
        now=view.now,
        total_nodes=sum(1 for n in view.nodes if n.state.usable),
        free_nodes=len(free),
        free_by_os=free_by_os,
        targets=target_shares(entities, view.targets, cfg),
        usage=usage_shares(view.usage),
        interactive_held=held,
        user_interactive_held=user_held,
        weights=weight_vector(cfg.weights),
    )


def _centred(raw: float, scale: float) -> float:
    return (min(max(raw / scale, -1.0), 1.0) + 1.0) / 2.0


def priority_of(job: Job, ctx: Context, cfg: PriorityConfig) -> float:
    """P_j of one pending job."""
    w = ctx.weights
    scale = float(max(ctx.total_nodes, 1))
    nodes = float(job.nodes)
    avail = float(ctx.free_by_os.get(job.os_image, 0)) if job.os_image else float(ctx.free_nodes)

    usage = ctx.targets[(job.user, job.account)] - ctx.usage.get(job.user, 0.0)
    queue = max(ctx.now - job.submit_time, 0.0)
    os_term = avail - nodes
    free_term = float(ctx.free_nodes) - max(nodes - avail, 0.0)

    interactive = 0.0
    if job.interactive:
        ok = allowed(cfg, ctx.total_nodes, ctx.interactive_held, ctx.user_interactive_held.get(job.user, 0), job.nodes)
        interactive = 1.0 if ok else 0.0

    normalised = (
        min(max((usage + 1.0) / 2.0, 0.0), 1.0),
        min(queue / cfg.max_queue_time_s, 1.0),
        _centred(os_term, scale),
        min(float(job.preempt_count) / float(cfg.max_preempt_count), 1.0),
        min(preempted_seconds(job, ctx.now) / cfg.max_preempt_time_s, 1.0),
        _centred(free_term, scale),
        interactive,
    )
    p = w[0] * normalised[0]
    for k in range(1, len(normalised)):
        p += w[k] * normalised[k]
    return p


def priorities(view: ClusterView, cfg: PriorityConfig) -> dict[str, float]:
    """job id → P_j for every pending or held job, one job at a time."""
    ctx = context(view, cfg)
    return {job.id: priority_of(job, ctx, cfg) for job in view.pending}
