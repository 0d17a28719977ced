"""The agent's decision for one tick: a pure function of a ClusterView and the configuration.

Why separate from the loop: this is the part the simulator and the tests can run without a
resource manager, a VM or a database, and the part an operator wants explained. It composes
the policies owned by their packages — UBIS priorities (`ubis_priority.compute`), victim
selection (`preemption.scheduling.victims.select_victims`) — and adds only the agent's own
rules:

* only vjobs whose pilot runs their VM (`checkpointable`) can be checkpointed: a batch job
  that is not a vjob, or whose VM is still booting or saving, is never a victim;
* a running job's priority, for the victim choice, is the priority it would have if it were
  back in the queue now (the same equation, so the choice follows the site's weights);
* interactive jobs are served highest priority first; each served job's nodes and victims
  are taken out of the view before the next one is considered, so one tick never picks the
  same node twice;
* a job vjob checkpointed is released only while no interactive job waits for nodes, when
  enough nodes are free for it, highest priority first; its saved node is named so that the
  RMS can give it back (a local resume: restore without copying the memory state).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from preemption.scheduling.victims import running_priorities, select_victims
from ubis_priority import compute, integer_priority
from vjob.config import Config
from vjob.model import ClusterView, Job, JobClass, JobState
from vjob.rms import PriorityKnob


@dataclass(frozen=True)
class Preemption:
    """Checkpoint `victims` so that interactive `job_id` can start on `nodes`."""

    job_id: str
    victims: tuple[str, ...]
    nodes: tuple[str, ...]
    checkpoint_bytes: float


@dataclass(frozen=True)
class Release:
    """Let a checkpointed vjob run again, preferably on the nodes it was saved on."""

    job_id: str
    preferred_nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Decision:
    priorities: Mapping[str, float] = field(default_factory=dict)
    """UBIS priority of every pending or held job."""
    rms_priorities: Mapping[str, int] = field(default_factory=dict)
    """The same mapped to the RMS's integer knob (Slurm site factor, PBS priority); empty when
    the RMS has none (OAR)."""
    preemptions: tuple[Preemption, ...] = ()
    releases: tuple[Release, ...] = ()
    waiting_interactive: tuple[str, ...] = ()
    """Interactive jobs that cannot start and get no victims (cap reached, too big, ...)."""


def decide(
    view: ClusterView,
    cfg: Config,
    *,
    knob: PriorityKnob | None,
    checkpointable: Collection[str],
    sleeping: Mapping[str, tuple[str, ...]],
) -> Decision:
    """What the agent should do now.

    `knob`: the RMS's integer priority range (the adapter's `abilities.priority`), None when the
    RMS has none. `checkpointable`: ids of running vjobs whose VM runs (the pilot's state file
    says so). `sleeping`: ids of the jobs vjob checkpointed and holds, with the nodes they were
    saved on.
    """
    prios = compute(view, cfg.priority)
    pending_prio = prios.as_dict()
    rms_prio: dict[str, int] = {}
    if knob is not None and len(prios):
        values = np.asarray(prios.values, dtype=np.float64)
        ints = integer_priority(values, prios.terms.max_priority, knob.low, knob.high)
        rms_prio = {job_id: int(v) for job_id, v in zip(prios.job_ids, ints, strict=True)}

    keep = set(checkpointable)
    interactive = sorted(
        (j for j in view.pending if j.interactive and j.state is JobState.PENDING),
        key=lambda j: (-pending_prio.get(j.id, 0.0), j.submit_time, j.id),
    )
    preemptions: list[Preemption] = []
    waiting: list[str] = []
    current = view
    victim_prio: dict[str, float] | None = None
    for job in interactive:
        if job.nodes <= len(current.free_nodes()):
            # The RMS starts it by itself; take its nodes out for the next interactive job.
            current = _place(current, job, tuple(n.name for n in current.free_nodes()[: job.nodes]), ())
            continue
        if victim_prio is None:
            victim_prio = running_priorities(view, cfg.priority)
        choice = select_victims(
            current,
            job,
            victim_prio,
            interactive_cap=cfg.priority.interactive_cap,
            preemptible=(JobClass.BATCH,),
            exclude=[j.id for j in current.running if j.id not in keep],
        )
        if choice is None or not choice.victims:
            waiting.append(job.id)
            continue
        preemptions.append(Preemption(job.id, choice.victims, choice.nodes, choice.checkpoint_bytes))
        current = _place(current, job, choice.nodes, choice.victims)

    releases: list[Release] = []
    if not waiting and not preemptions:
        free = {n.name for n in current.free_nodes()}
        held = [j for j in current.pending if j.id in sleeping and j.state is JobState.HELD]
        for job in sorted(held, key=lambda j: (-pending_prio.get(j.id, 0.0), j.submit_time, j.id)):
            if job.nodes > len(free):
                continue
            saved_on = tuple(n for n in sleeping[job.id] if n in free)
            chosen = saved_on if len(saved_on) == job.nodes else ()
            releases.append(Release(job.id, chosen))
            # Reserve the nodes it will take (its own first) before looking at the next one.
            for name in (list(chosen) or sorted(free))[: job.nodes]:
                free.discard(name)
    return Decision(
        priorities=pending_prio,
        rms_priorities=rms_prio,
        preemptions=tuple(preemptions),
        releases=tuple(releases),
        waiting_interactive=tuple(waiting),
    )


def _place(view: ClusterView, job: Job, nodes: tuple[str, ...], victims: tuple[str, ...]) -> ClusterView:
    """The view after `victims` were requeued and `job` started on `nodes`."""
    out = []
    for j in view.jobs:
        if j.id in victims:
            out.append(replace(j, state=JobState.HELD, allocated_nodes=()))
        elif j.id == job.id:
            out.append(replace(j, state=JobState.RUNNING, allocated_nodes=nodes, start_time=view.now))
        else:
            out.append(j)
    return replace(view, jobs=tuple(out))
