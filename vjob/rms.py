"""The contract between the agent and an RMS adapter (plugins/slurm, plugins/pbs, plugins/oar).

Why a Protocol plus declared abilities: the agent loop (observe → decide → act → record) is the
same for every RMS; only observing and acting differ, and RMSs differ in what they *can* do
(OAR has no per-job priority and cannot requeue a running job; only Slurm can pin a job to
nodes and force its start). An adapter states that once, in `abilities`, and the agent plans
with it — it never probes with `getattr` or learns it from an exception mid-tick. Everything
an RMS-specific piece of code needs to tell the core (its job environment variables, the files
its hooks touch to wake the agent, its integer priority range) is declared here too, so RMS
knowledge lives in plugins/<rms>/ and nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from vjob.errors import VjobError
from vjob.model import Job, Node


@dataclass(frozen=True)
class PriorityKnob:
    """The RMS's per-job integer priority: UBIS's P/Σw in 0..1 maps linearly onto low..high.

    `min_step`: the smallest change worth a command (queue time moves every priority a little
    each tick; Slurm's site factor spans a million, so a change of 1 is noise).
    `share`: how much of the order within a tier vjob owns beside the RMS's own priority
    (preemption.scheduling.site_order; Slurm `[slurm] order_share`): 1 = vjob's whole order
    on the knob; below 1 the knob carries vjob's tier in bands and `share` of the within-tier
    range, and the site's own factors (fair share) the rest — used when the adapter can read
    them (`site_priorities`)."""

    low: int
    high: int
    min_step: int = 1
    share: float = 1.0

    def __post_init__(self) -> None:
        if self.high <= self.low:
            raise ValueError(f"priority knob {self.low}..{self.high}: high must be above low")
        if self.min_step < 1:
            raise ValueError(f"priority knob min_step = {self.min_step}: must be >= 1")
        if not 0.0 <= self.share <= 1.0:
            raise ValueError(f"priority knob share = {self.share}: must be in 0..1")


@dataclass(frozen=True)
class JobEnvironment:
    """Which variables of a job's environment carry what the pilot needs to know.

    `restart_count` is None when the RMS exports no restart counter; `restart_count_from_zero`
    says whether a missing variable inside a job means "first start" (Slurm sets
    SLURM_RESTART_COUNT only from the first restart on)."""

    job_id: str
    node_name: str
    node_list: str
    restart_count: str | None = None
    restart_count_from_zero: bool = False
    script_name: str | None = None
    """Base name of the batch script the RMS runs (Slurm: slurm_script), where it has one."""

    def job_id_from(self, env: Mapping[str, str]) -> str:
        return env.get(self.job_id, "")

    def restarts_from(self, env: Mapping[str, str], *, in_job: bool) -> int | None:
        """How often the RMS restarted the job; None when it cannot be known."""
        if self.restart_count is None:
            return None
        value = env.get(self.restart_count)
        if value is None:
            return 0 if (in_job and self.restart_count_from_zero) else None
        return int(value) if value.isdigit() else None


@dataclass(frozen=True)
class Abilities:
    """What an adapter can do, declared. The agent never calls what is not declared here."""

    priority: PriorityKnob | None
    """The per-job priority knob, or None (OAR: queues order jobs)."""
    requeue_hold: bool
    """A running job can be put back in the queue, held (Slurm requeuehold, PBS qhold+qrerun)."""
    hold_release: bool
    suspend: bool
    """The RMS can suspend/resume a running job itself (PBS qsig, Slurm scontrol suspend)."""
    pin_nodes: bool
    """A held job can be told which nodes to run on (Slurm ReqNodeList: local resume)."""
    start_now: bool
    """A released job's start can be forced (Slurm StartTime=now, after a requeue's delay)."""
    environment: JobEnvironment
    wake_files: tuple[Path, ...] = field(default=())
    """Files the RMS's hooks touch on an interactive submission: a change wakes the agent."""
    wait_field: str | None = None
    """The job field, shown to its user, that root may write and the user may not, where
    `tell_wait` puts why a held-back interactive job waits (Slurm AdminComment, PBS comment);
    None: the RMS has none (OAR), the reason is only in `vjob status`."""
    cpu_handover: bool = False
    """`suspend` gives a running job's CPUs to other jobs at once and keeps its memory allocated
    (Slurm's `scontrol suspend` under cons_tres), so a victim paused by its pilot hands its CPUs
    over while its memory drains to disk (pause-first, docs/preempt-pause.md); whether the RMS's
    suspend lets the drainer run is `suspend_spares_detached`. PBS's `qsig -s suspend` runs
    vjob's checkpoint hook instead: False there."""


class NotSupported(VjobError):
    """An action the adapter's `abilities` do not declare; a programming error in the caller."""


class RMSAdapter(Protocol):
    """What the agent needs from a resource manager."""

    name: str
    abilities: Abilities

    def jobs(self) -> list[Job]:
        """Every job the RMS knows that is pending, held, running or suspended."""
        ...

    def nodes(self) -> list[Node]:
        """Every compute node with its state."""
        ...

    def set_priority(self, job_id: str, value: int) -> None:
        """Give a pending job vjob's priority (only when `abilities.priority` is set)."""
        ...

    def knob_values(self) -> dict[str, int]:
        """What the priority knob holds on each queued job (only when `abilities.priority` is
        set): `vjob drain` puts `neutral_priority()` back wherever it differs."""
        ...

    def neutral_priority(self) -> int:
        """The knob's value on a job vjob never wrote to (the RMS's own)."""
        ...

    def hold(self, job_id: str) -> None: ...

    def release(self, job_id: str) -> None: ...

    def requeue_hold(self, job_id: str) -> None:
        """Put a running job back in the queue, held (after its VMs were checkpointed)."""
        ...

    def suspend(self, job_id: str) -> None:
        """Stop a running job where it runs, keeping its allocation (only when
        `abilities.suspend`; with `abilities.cpu_handover` its CPUs go to other jobs)."""
        ...

    def resume(self, job_id: str) -> None:
        """Let a job `suspend` stopped run again (only when `abilities.suspend`)."""
        ...

    def suspend_spares_detached(self) -> tuple[bool, str]:
        """Whether a process the job started and detached (own session, parent gone: the
        pause-first drainer) keeps running while the RMS holds the job suspended, and why, from
        the RMS's configuration (only when `abilities.cpu_handover`); CommandError when it
        cannot be read. Cheap to call again: the adapter reads it once and again when the RMS's
        configuration may have changed."""
        ...

    def require_nodes(self, job_id: str, nodes: Sequence[str]) -> None:
        """Pin a held job to `nodes` (only when `abilities.pin_nodes`)."""
        ...

    def start_now(self, job_id: str) -> None:
        """Force a released job's start (only when `abilities.start_now`)."""
        ...

    def tell_wait(self, job_id: str, reason: str | None) -> bool:
        """Put why the job waits (None: remove it) into `abilities.wait_field`, every other
        character of the field kept (vjob.record_text); False when it already said so."""
        ...


__all__ = ["Abilities", "JobEnvironment", "NotSupported", "PriorityKnob", "RMSAdapter"]
