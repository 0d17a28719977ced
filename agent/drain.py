"""Draining: vjob steps out of the RMS's way without losing anybody's work (`vjob drain`).

Why a mode of the agent and not a stop: stopping the agent leaves the jobs it checkpointed held
for ever (only the agent releases them), the priorities it wrote in place (Slurm keeps a job's
site factor, PBS its Priority or vjob's resource) and its wait notes in the jobs' fields. A
drained agent keeps ticking but only undoes: each tick it releases every job it checkpointed
that the RMS still holds (the job resumes from its saved VM, as after an ordinary release),
puts the RMS's own value back wherever its priority knob holds another (Slurm: site factor 0;
PBS: Priority 0 or the custom resource's default 0), and removes vjob's wait notes from the
interactive jobs' fields. It preempts nothing — no checkpoint for an interactive job, none for
a deadline, no consolidation or remapping — while running vjobs run to their end, and its
bookkeeping (usage, resumes, clean-up of finished jobs' VMs) goes on.

The mark is a row of the store's lease table, `drain:<rms>`, that never runs out: the same code
on SQLite and PostgreSQL, seen by every agent of the cluster (an HA pair's standby too) and by a
restarted one, which stays drained until `vjob drain --undo` deletes the row. After a pass that
left nothing to undo, the acting agent writes `drained:<rms>` (its owner, the time in
`acquired_at`): `vjob drain` waits for that row to be newer than its mark, so it returns only
once the cluster is drained.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sqlalchemy import delete, select

from agent import act
from agent.observe import Observation
from agent.ports import Ports
from agent.status_file import write_status_file
from agent.wait_notice import WaitNotices
from preemption.scheduling.tick import Release
from vjob.errors import CommandError, InputError, StoreError
from vjob.model import ClusterView, JobState, NodeState
from vjob.store import leases
from vjob.store.db import Store
from vjob.store.schema import LeaseRecord

FOREVER_S = 100 * 366 * 86400.0
"""The mark's time to live: it ends by `vjob drain --undo`, never by running out."""


def mark_name(rms: str) -> str:
    return f"drain:{rms}"


def done_name(rms: str) -> str:
    return f"drained:{rms}"


@dataclass(frozen=True)
class Mark:
    """Who asked for the drain (user@host), and when."""

    by: str
    since: float


def read_mark(store: Store, name: str) -> Mark | None:
    with store.session() as s:
        row = s.execute(select(LeaseRecord.owner, LeaseRecord.acquired_at).where(LeaseRecord.name == name)).first()
    return None if row is None else Mark(row[0], row[1])


def mark(store: Store, rms: str, by: str) -> Mark:
    """Drain `rms`; an earlier mark (another operator's) is kept. Returns the mark in force."""
    leases.acquire(store, mark_name(rms), by[:128], FOREVER_S)
    found = read_mark(store, mark_name(rms))
    if found is None:  # deleted by an --undo between the two statements: mark again
        return mark(store, rms, by)
    return found


def unmark(store: Store, rms: str) -> bool:
    """Undrain `rms`; False when it was not drained."""
    with store.session() as s:
        gone = s.execute(delete(LeaseRecord).where(LeaseRecord.name == mark_name(rms))).rowcount
        s.execute(delete(LeaseRecord).where(LeaseRecord.name == done_name(rms)))
    return bool(gone)


def acknowledge(store: Store, rms: str, owner: str) -> None:
    """Record that `owner` finished a drain pass that left nothing to undo, now."""
    with store.session() as s:
        s.execute(delete(LeaseRecord).where(LeaseRecord.name == done_name(rms)))
    leases.acquire(store, done_name(rms), owner[:128], FOREVER_S)


@dataclass
class DrainState:
    """The agent's memory of the mark between ticks (the store may not answer every tick)."""

    mark: Mark | None = None
    cleared: set[str] = field(default_factory=set)
    """Interactive jobs whose field was already cleaned during this drain (one read each)."""
    reset_blind: set[str] = field(default_factory=set)
    """Queued jobs whose knob the RMS does not show (Slurm's sprio lists neither held jobs nor
    jobs waiting for a begin time), set to the RMS's own value once during this drain."""
    acknowledged: float = 0.0
    last: DrainReport | None = None
    """The last pass's report (`vjob drain` prints it when it ran the pass itself)."""


@dataclass
class DrainReport:
    released: list[str] = field(default_factory=list)
    reset: dict[str, int | None] = field(default_factory=dict)
    """job → the value its knob held before the RMS's own was put back (None: not shown)."""
    cleared: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    still_held: list[str] = field(default_factory=list)


def is_drained(ports: Ports, state: DrainState) -> bool:
    """Whether the store marks this RMS drained; the last answer when the store does not reply."""
    try:
        found = read_mark(ports.store(), mark_name(ports.rms))
    except StoreError:
        return state.mark is not None
    if found is None and state.mark is not None:
        ports.log.info("undrained: preempting and ordering again", drained_by=state.mark.by)
        state.cleared.clear()
        state.reset_blind.clear()
    elif found is not None and state.mark is None:
        ports.log.info("drained: releasing, resetting priorities, preempting nothing", drained_by=found.by)
    state.mark = found
    return found is not None


def drain_pass(
    ports: Ports, obs: Observation, state: DrainState, sent: dict[str, int], notices: WaitNotices
) -> DrainReport:
    """One tick of a drained agent: release, reset, clear; acknowledge when nothing is left."""
    report = state.last = DrainReport()
    _release_all(ports, obs, report)
    _reset_priorities(ports, obs.view, state, sent, report)
    _clear_notes(ports, obs.view, state, notices, report)
    if not report.errors and not report.still_held and ports.lease.valid():
        try:
            acknowledge(ports.store(), ports.rms, ports.lease.owner)
            state.acknowledged = time.time()
        except StoreError as exc:
            ports.store.failed(exc)
            report.errors.append(str(exc))
    if report.released or report.reset or report.cleared:
        ports.log.info(
            "drain pass",
            released=report.released,
            priorities_reset=len(report.reset),
            notes_cleared=report.cleared,
            still_held=report.still_held,
        )
    return report


def _release_all(ports: Ports, obs: Observation, report: DrainReport) -> None:
    """Every job vjob checkpointed that the RMS holds: released, pinned to the nodes its VM was
    saved on when those are idle now (a local restore), else wherever the RMS starts it."""
    idle = {n.name for n in obs.view.nodes if n.state is NodeState.IDLE}
    held = {j.id for j in obs.view.jobs if j.state is JobState.HELD}
    for job_id, saved_on in sorted(obs.sleeping.items()):
        if job_id not in held:
            continue
        nodes = tuple(saved_on) if saved_on and set(saved_on) <= idle else ()
        if act.release(ports, Release(job_id, nodes)):
            report.released.append(job_id)
            idle -= set(nodes)
        else:
            report.still_held.append(job_id)
            report.errors.append(f"job {job_id}: release failed")


def _reset_priorities(
    ports: Ports, view: ClusterView, state: DrainState, sent: dict[str, int], report: DrainReport
) -> None:
    """The knob back to the RMS's own value on every queued job where it holds another; on a
    queued job whose value the RMS does not show, once per drain."""
    sent.clear()  # after --undo every value is sent again
    if ports.adapter.abilities.priority is None:
        return
    adapter = ports.adapter
    try:
        held = adapter.knob_values()
    except (CommandError, InputError) as exc:
        ports.metrics.errors.labels(kind="rms").inc()
        report.errors.append(f"cannot read the priorities vjob set: {exc}")
        return
    neutral = adapter.neutral_priority()
    queued = {j.id for j in view.jobs if j.state in (JobState.PENDING, JobState.HELD)}
    blind = sorted(queued - set(held) - state.reset_blind)
    state.reset_blind.update(blind)  # one try each: a failure is reported, not repeated every tick
    wrong = [(j, v) for j, v in sorted(held.items()) if v != neutral] + [(j, None) for j in blind]
    for job_id, value in wrong:
        try:
            adapter.set_priority(job_id, neutral)
            report.reset[job_id] = value
        except (CommandError, InputError) as exc:
            ports.metrics.errors.labels(kind="rms").inc()
            report.errors.append(f"job {job_id}: cannot reset its priority: {exc}")


def _clear_notes(ports: Ports, view: ClusterView, state: DrainState, notices: WaitNotices, report: DrainReport) -> None:
    """vjob's wait reasons out of the interactive jobs' fields, and `vjob status`'s copy: the
    ones this agent wrote (`notices.told`), and — for an agent that has not looked at every
    job's field yet (a fresh one, or a new lease holder: an earlier agent's notes are not in
    `told`) — every waiting interactive job's, read once per job."""
    adapter = ports.adapter
    if adapter.abilities.wait_field is not None:
        listed = {j.id for j in view.jobs}
        candidates = set(notices.told)
        if not notices.synced:
            candidates |= {j.id for j in view.jobs if j.interactive and j.state in (JobState.PENDING, JobState.HELD)}
        failed = False
        for job_id in sorted(candidates - state.cleared):
            if job_id not in listed:
                continue
            try:
                if adapter.tell_wait(job_id, None):
                    report.cleared.append(job_id)
                state.cleared.add(job_id)
            except (CommandError, InputError) as exc:
                failed = True
                ports.metrics.errors.labels(kind="rms").inc()
                report.errors.append(f"job {job_id}: cannot remove its wait note: {exc}")
        notices.synced = notices.synced or not failed  # every note in view is gone (or was never there)
    notices.told.clear()
    if notices.status_path is not None:
        try:
            write_status_file(notices.status_path, {"at": time.time(), "jobs": {}})
        except OSError as exc:
            ports.log.warning("cannot write the wait reasons for vjob status", error=str(exc))


__all__ = [
    "DrainReport",
    "DrainState",
    "Mark",
    "acknowledge",
    "done_name",
    "drain_pass",
    "is_drained",
    "mark",
    "mark_name",
    "read_mark",
    "unmark",
]
