"""Victim selection: which running batch jobs an interactive job checkpoints to get its nodes.

Why this rule (UBIS, section III.D): the lowest-priority jobs are preempted first, so the work a
site cares least about is the work that waits. Batch jobs never preempt batch jobs: only an
interactive job may preempt, and never another interactive job. Among victims of equal
priority we prefer those whose nodes already run the interactive job's OS image (no OS swap)
and those whose memory is smallest (a checkpoint writes the whole memory of every VM, the
Entropy cost model). Victims are chosen greedily in that order until together with the free
nodes they cover the request, then victims that turned out unnecessary are released again,
highest priority first, so no job is checkpointed for nothing.

The core, `choose_victims`, works on plain `Candidate` tuples: the shared scheduling pass
(`tick.decide`, which the agent runs) and the simulator's compiled pass both call it.
`select_victims` answers the same question for one interactive job on a ClusterView as it is
(for `vjob` tools and tests); the pass builds its candidates itself, as the state changes
within a pass.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from preemption.scheduling.nodes import preemptor_nodes, swaps
from ubis_priority.interactive import cap_limit, within_cap
from ubis_priority.view import compute
from vjob.config import PriorityConfig
from vjob.errors import InputError
from vjob.model import ClusterView, Job, JobClass, JobState

MIB = 1024 * 1024


class Candidate(NamedTuple):
    """A running job that could be checkpointed, reduced to what the choice depends on."""

    job_id: str
    priority: float
    nodes: int
    """Nodes the job holds (all are freed when it is checkpointed)."""
    nodes_with_os: int
    """How many of those nodes already run the preemptor's OS image."""
    checkpoint_bytes: float
    """Memory written to disk to checkpoint it (sum over its VMs)."""


@dataclass(frozen=True, slots=True)
class VictimChoice:
    """The outcome for one interactive job: whom to checkpoint and where the job then runs."""

    job_id: str
    victims: tuple[str, ...]
    """Job ids to checkpoint, lowest priority first; empty when free nodes suffice."""
    nodes: tuple[str, ...]
    """Exactly `job.nodes` node names for the interactive job, nodes with its OS first."""
    checkpoint_bytes: float
    """Total memory the victims' checkpoints write."""
    os_swaps: int
    """How many of `nodes` must switch OS image before the job can start."""


def choose_victims(need: int, candidates: Iterable[Candidate]) -> list[Candidate] | None:
    """The victims that together free at least `need` nodes, or None when all of them cannot.

    Order: lowest priority first; at equal priority the larger share of nodes already on the
    preemptor's OS first, then the cheaper checkpoint, then the job id (deterministic).
    After the greedy pass, victims not needed to reach `need` are dropped, highest priority
    first (a small low-priority job taken early can make a later, larger one sufficient).
    """
    if need <= 0:
        return []
    return greedy_victims(need, sorted(candidates, key=victim_key))


def victim_key(c: Candidate) -> tuple[float, float, float, str]:
    """`choose_victims`' order: lowest priority, larger share of nodes on the preemptor's OS,
    cheaper checkpoint, job id (unique: the order is total)."""
    return (c.priority, -(c.nodes_with_os / c.nodes) if c.nodes else 0.0, c.checkpoint_bytes, c.job_id)


def greedy_victims(need: int, ordered: Iterable[Candidate]) -> list[Candidate] | None:
    """`choose_victims`' rule over candidates already in its order (`victim_key`): take them
    until `need` nodes are freed, then drop the ones not needed, highest priority first; None
    when all of them cannot free `need`. Reads `ordered` only as far as it takes (the pass's
    victim pool keeps it sorted, victim_pool.py)."""
    if need <= 0:
        return []
    chosen: list[Candidate] = []
    freed = 0
    for cand in ordered:
        if freed >= need:
            break
        if cand.nodes <= 0:
            continue
        chosen.append(cand)
        freed += cand.nodes
    if freed < need:
        return None
    for cand in sorted(chosen, key=lambda c: (-c.priority, -c.checkpoint_bytes, c.job_id)):
        if freed - cand.nodes >= need:
            chosen.remove(cand)
            freed -= cand.nodes
    return chosen


def interactive_cap_allows(in_use: int, request: int, total_nodes: int, cap: float | None) -> bool:
    """Whether interactive jobs holding `in_use` nodes may take `request` more under `cap`.

    `cap` is the share of the machine interactive jobs may hold at once (0..1; None = no cap);
    the rule is `ubis_priority.interactive`'s (cap × total nodes, compared as a float, so a
    5 % cap on 1,056 nodes, 52.8, allows 52 nodes).
    """
    if cap is None:
        return True
    return bool(within_cap(float(in_use), float(request), cap_limit(cap, total_nodes)))


def checkpoint_bytes(view: ClusterView, job: Job) -> float:
    """What checkpointing `job` writes: the memory of its VMs in the view, else `memory_mb`
    per allocated node (the Entropy cost model: a suspend writes the whole memory)."""
    vm = [v.memory_mb * MIB for v in view.vms if v.job_id == job.id]
    if vm:
        return float(sum(vm))
    return float(job.memory_mb) * MIB * len(job.allocated_nodes)


def select_victims(
    view: ClusterView,
    job: Job,
    priorities: Mapping[str, float] | Any,
    *,
    interactive_cap: float | None = None,
    preemptible: Sequence[JobClass] = (JobClass.BATCH, JobClass.BESTEFFORT),
    exclude: Collection[str] = (),
) -> VictimChoice | None:
    """Decide which running jobs `job` preempts, from one ClusterView; None = it must wait.

    `job` must be an interactive job (batch never preempts batch: a batch job gets None).
    `priorities` maps job id → priority (a `ubis_priority.compute(...)` result, or any mapping
    of job id to float); every running preemptible job needs one, lower = preempted first.
    `interactive_cap` (0..1) is the share of usable nodes interactive jobs may hold together;
    when granting `job` would exceed it, the answer is None and the job waits. `exclude` names
    running jobs that must not be chosen (e.g. jobs not running in a VM, which cannot be
    checkpointed).

    Free nodes are used before anyone is preempted; a job's checkpoint size is the memory of
    its VMs in the view, or `memory_mb` per allocated node when the view has no VMs for it.
    Nothing is changed: the caller acts on the answer (checkpoint the victims, then start `job`
    on `nodes`).
    """
    if job.job_class is not JobClass.INTERACTIVE:
        return None
    usable = [n for n in view.nodes if n.state.usable]
    by_name = {n.name: n for n in usable}
    running = [j for j in view.jobs if j.state is JobState.RUNNING and j.id != job.id]
    interactive_in_use = sum(len(j.allocated_nodes) or j.nodes for j in running if j.interactive)
    if job.nodes > len(usable):
        return None
    if not interactive_cap_allows(interactive_in_use, job.nodes, len(usable), interactive_cap):
        return None
    busy = {name for j in running for name in j.allocated_nodes}
    free = [n.name for n in usable if n.name not in busy]
    prio = _as_mapping(priorities)
    excluded = set(exclude)
    candidates: list[Candidate] = []
    for j in running:
        if j.job_class not in preemptible or not j.allocated_nodes or j.id in excluded:
            continue
        if j.id not in prio:
            raise InputError(
                f"select_victims: running job {j.id} has no priority; pass running_priorities(view, cfg) too"
            )
        on_os = sum(1 for n in j.allocated_nodes if n in by_name and by_name[n].os_image == job.os_image)
        candidates.append(Candidate(j.id, float(prio[j.id]), len(j.allocated_nodes), on_os, checkpoint_bytes(view, j)))
    chosen = choose_victims(job.nodes - len(free), candidates)
    if chosen is None:
        return None
    by_id = {j.id: j for j in running}
    node_os = {name: node.os_image for name, node in by_name.items()}
    victim_nodes = [[n for n in by_id[c.job_id].allocated_nodes if n in by_name] for c in chosen]
    nodes = preemptor_nodes(free, victim_nodes, node_os, job.os_image, job.nodes)
    return VictimChoice(
        job_id=job.id,
        victims=tuple(c.job_id for c in chosen),
        nodes=nodes,
        checkpoint_bytes=sum(c.checkpoint_bytes for c in chosen),
        os_swaps=swaps(nodes, node_os, job.os_image),
    )


def running_priorities(
    view: ClusterView,
    cfg: PriorityConfig,
    preemptible: Sequence[JobClass] = (JobClass.BATCH, JobClass.BESTEFFORT),
    *,
    only: Collection[str] | None = None,
) -> dict[str, float]:
    """The UBIS priority of every running preemptible job of `view` (job id → priority), or of
    those in `only`.

    `ubis_priority.compute` ranks queued jobs; a victim needs a priority too. A running job's
    priority is equation 1 evaluated as if it were back in the queue now, which is exactly the
    situation it would be in once checkpointed: its queue time counts from its submission,
    its Pn/Pt carry over, and the free-node terms see the nodes of all the jobs rated together
    as free. Every other job of the view stays as it is, so the targets are split between the
    same users as for the queue's priorities.
    """
    ids = {j.id for j in view.running if j.job_class in preemptible and (only is None or j.id in only)}
    if not ids:
        return {}
    as_queued = tuple(replace(j, state=JobState.PENDING, allocated_nodes=()) if j.id in ids else j for j in view.jobs)
    prios = compute(replace(view, jobs=as_queued), cfg)
    return {job_id: float(prios.values[prios.index(job_id)]) for job_id in ids}


def _as_mapping(priorities: Mapping[str, float] | Any) -> Mapping[str, float]:
    """Accept a plain mapping or a priorities result object exposing job ids and values."""
    if isinstance(priorities, Mapping):
        return priorities
    for method in ("as_dict", "to_dict", "by_job"):
        fn = getattr(priorities, method, None)
        if callable(fn):
            result = fn()
            if isinstance(result, Mapping):
                return result
    ids = getattr(priorities, "job_ids", None)
    values = getattr(priorities, "priorities", None)
    if values is None:
        values = getattr(priorities, "values", None)
    if ids is not None and values is not None and not callable(values):
        return dict(zip(list(ids), (float(v) for v in values), strict=True))
    raise InputError(f"select_victims: priorities of type {type(priorities).__name__} is not a job-id → float mapping")
