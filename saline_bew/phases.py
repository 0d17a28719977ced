"""What the Saline manager does next with one vjob: a pure function of what it observed.

Why apart from the loop (saline_bew.manager): the decision — deploy, snapshot, evacuate,
count a kill, resubmit, move, complete — is the heart of Saline and is easiest to trust when
it can be tested on its own, on any record and any OAR answer, without OAR, libvirt or a
database. The manager observes (the vjob's row and journal, its OAR job, whether its VMs
powered off), calls `decide`, and acts; nothing here does I/O.

The per-vjob failure accounting (`backoff`) lives here for the same reason: how many times in
a row a vjob failed and when to try it again follow from its journal alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from plugins.oar.parse import CHECKPOINT_EVENTS, OarJob
from saline_bew.events import EventKind, Phase

KILL_EVENTS = ("BESTEFFORT_KILL", "WALLTIME")
"""OAR's events (not the journal's) that say OAR killed the job."""
DEPLOY_EVENTS = (EventKind.DEPLOYED, EventKind.RESUMED, EventKind.RESTARTED_FROM_SCRATCH)
SAFE_POINT_EVENTS = (*DEPLOY_EVENTS, EventKind.SNAPSHOT)
NOT_PROGRESS = frozenset(
    {
        EventKind.STEP_FAILED,
        EventKind.ERROR,
        EventKind.SUBMIT_FAILED,
        EventKind.WAITING_FOR_RESOURCES,
        EventKind.SNAPSHOT_FAILED,
    }
)
"""Journal entries that do not reset the count of failures in a row."""


class Kind(StrEnum):
    WAIT = "wait"
    RESUBMIT = "resubmit"
    """Killed, or never got an OAR job: ask OAR again (same site if it has room)."""
    FORGET_OAR_JOB = "forget_oar_job"
    """OAR lost a job that never ran: drop its id, the next pass asks again."""
    KILLED = "killed"
    COMPLETE = "complete"
    CANCELLED_IN_OAR = "cancelled_in_oar"
    """The user deleted the OAR job (oardel): no kill event, so the vjob ends."""
    CANCEL = "cancel"
    """The user asked (vjob besteffort cancel)."""
    ADOPT = "adopt"
    """Admitted by OAR's admission rule (the user typed oarsub): find the OAR job named after
    the vjob and take it as the vjob's job, instead of submitting one."""
    DEPLOY = "deploy"
    MOVE = "move"
    EVACUATE = "evacuate"
    SNAPSHOT = "snapshot"


@dataclass(frozen=True, slots=True)
class Action:
    kind: Kind
    cause: str = ""
    """KILLED: besteffort_kill, walltime or vanished."""
    lost_s: float = 0.0
    """KILLED: work lost since the last safe point."""
    event_id: int | None = None
    """EVACUATE: the newest OAR checkpoint event acted on."""
    warned_at: float | None = None
    """EVACUATE: when OAR first warned (its kill follows `checkpoint_delay_s` later)."""


class JobRecord(Protocol):
    """The fields of saline_bew.journal.SalineJob the decision reads."""

    phase: str
    oar_job_id: str | None
    updated_at: float
    snapshot_at: float | None
    last_event_id: int


class Timing(Protocol):
    """The fields of saline_bew.config.SalineConfig the decision reads."""

    snapshot_period_s: float
    requeue_after_s: float


@dataclass(frozen=True, slots=True)
class Observed:
    """What the manager saw of one vjob this pass."""

    oar_job: OarJob | None = None
    """Its OAR job as OAR shows it; None when OAR does not know it (or it was not asked)."""
    vms_finished: bool = False
    """Running: every VM of the vjob powered off (its command ended)."""
    last_safe_point: float = 0.0
    """When the vjob last became safe to resume from: deployed, resumed or snapshot."""
    last_deploy: float = 0.0
    cancel_requested: bool = False
    admitted_at: float | None = None
    """When OAR's admission rule recorded the vjob, while its OAR job is not adopted yet."""


def needs_oar(job: JobRecord, cancel_requested: bool) -> bool:
    """Whether the decision depends on the OAR job (the manager asks OAR only then)."""
    return not cancel_requested and job.phase != Phase.KILLED and job.oar_job_id is not None


def decide(job: JobRecord, seen: Observed, *, now: float, timing: Timing) -> Action:
    """The next action for an active vjob (phase submitted, running or killed)."""
    if seen.cancel_requested:
        return Action(Kind.CANCEL)
    if job.phase == Phase.SUBMITTED and job.oar_job_id is None and seen.admitted_at is not None:
        return Action(Kind.ADOPT)
    if job.phase == Phase.KILLED or job.oar_job_id is None:
        return Action(Kind.RESUBMIT)
    oj = seen.oar_job
    if oj is None or oj.finished:
        return _ended(job, seen, now=now)
    if job.phase == Phase.SUBMITTED:
        if oj.state == "Running" and oj.hosts:
            return Action(Kind.DEPLOY)
        if oj.state == "Waiting" and now - job.updated_at > timing.requeue_after_s:
            return Action(Kind.MOVE)
        return Action(Kind.WAIT)
    warnings = [e for e in oj.events if e.type in CHECKPOINT_EVENTS and e.event_id > job.last_event_id]
    if warnings:  # OAR repeats the warning every scheduler pass: the first one starts the countdown
        return Action(
            Kind.EVACUATE, event_id=max(e.event_id for e in warnings), warned_at=min(e.date for e in warnings)
        )
    if seen.vms_finished:
        return Action(Kind.COMPLETE)
    if now - seen.last_safe_point >= timing.snapshot_period_s:
        return Action(Kind.SNAPSHOT)
    return Action(Kind.WAIT)


def _ended(job: JobRecord, seen: Observed, *, now: float) -> Action:
    """The OAR job is over (or OAR forgot it): a kill, the end of the command, or a cancel."""
    oj = seen.oar_job
    if oj is None and job.phase == Phase.SUBMITTED:
        return Action(Kind.FORGET_OAR_JOB)
    types = {e.type for e in oj.events} if oj else set()
    if oj is None or oj.killed_for_besteffort or "WALLTIME" in types:
        cause = "vanished" if oj is None else ("besteffort_kill" if oj.killed_for_besteffort else "walltime")
        kill_at = next((e.date for e in (oj.events if oj else ()) if e.type in KILL_EVENTS), now)
        lost = 0.0
        if job.phase == Phase.RUNNING:
            lost = max(0.0, kill_at - max(job.snapshot_at or 0.0, seen.last_deploy))
        return Action(Kind.KILLED, cause=cause, lost_s=lost)
    if job.phase == Phase.RUNNING and seen.vms_finished:
        return Action(Kind.COMPLETE)
    return Action(Kind.CANCELLED_IN_OAR)


class JournalEntry(Protocol):
    at: float
    kind: str
    detail: dict[str, Any]


def last_at(events: Sequence[JournalEntry], kinds: Sequence[str], default: float) -> float:
    for ev in reversed(events):
        if ev.kind in kinds:
            return ev.at
    return default


AFTER_ADMISSION = frozenset(
    {
        EventKind.ADOPTED,
        EventKind.SUBMITTED,
        EventKind.SUBMIT_FAILED,
        EventKind.KILLED,
        EventKind.OAR_JOB_VANISHED,
        EventKind.MOVED,
    }
)
"""Entries after which an admitted vjob's OAR job is no longer to be adopted."""


def admitted_at(events: Sequence[JournalEntry]) -> float | None:
    """When the admission rule recorded the vjob, if its OAR job still awaits adoption."""
    for ev in reversed(events):
        if ev.kind in AFTER_ADMISSION:
            return None
        if ev.kind == EventKind.ADMITTED:
            return ev.at
    return None


def cancel_requested(events: Sequence[JournalEntry]) -> bool:
    return any(ev.kind == EventKind.CANCEL_REQUESTED for ev in events)


def backoff(events: Sequence[JournalEntry], *, base_s: float, cap_s: float = 3600.0) -> tuple[int, float]:
    """(failures in a row, the time before which the vjob is not tried again).

    A failure is a `step_failed` entry; anything that shows progress (a deployment, a
    snapshot, a submission…) resets the count. The wait doubles with each failure."""
    failures = 0
    last = 0.0
    for ev in reversed(events):
        if ev.kind == EventKind.STEP_FAILED:
            failures += 1
            last = max(last, ev.at)
        elif ev.kind not in NOT_PROGRESS:
            break
    if not failures:
        return 0, 0.0
    return failures, last + min(cap_s, base_s * 2 ** (failures - 1))
