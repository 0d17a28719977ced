"""Where a best-effort vjob goes when OAR warns it (checkpoint signal): the paper's order.

Why a pure module: the Saline paper (section 3.1.1, "using notification callbacks") asks the
RMS for new resources first and live-migrates the VMs there — at the same site, then at
another one — and suspends them to the repository only when no room is found. Which of
those to try, and how many tries fit before OAR's kill, follows from what the manager
observed (free cores per site, the time left, how long a suspension took last time); the
manager carries the plan out (saline_bew.manager), this module does no I/O.

The time budget: a try costs the wait for OAR to start the new job plus the migration; the
suspension that follows a failed try must still end before the kill. So the tries together
may wait at most `time left - suspend - migrate - margin` (and `saline.migrate_wait_s`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from saline_bew.events import EventKind

MARGIN_S = 5.0
"""Kept free before OAR's kill on top of the estimates (scheduler passes, a slow save)."""
MIN_WAIT_S = 3.0
"""A try with less time than this for OAR to start the job (a scheduler pass) is not made."""
MIGRATE_MB_PER_S = 100.0
"""Live-migration speed assumed before one was measured (a 1 Gbit/s link, pre-copy overhead)."""
OPENING = (EventKind.MIGRATION_ASKING, EventKind.MIGRATION_REQUESTED)
"""Entries that open a request: journalled before oarsub, and again with the new job's id."""
CLOSING = (EventKind.MIGRATED, EventKind.MIGRATION_FAILED, EventKind.MIGRATION_ABANDONED)
"""Entries after which the manager no longer owns a request's job: the VMs run in it (migrated),
it was given back (failed), or a later manager deleted it (abandoned)."""


class Path(StrEnum):
    SAME_SITE = "migrate_same_site"
    OTHER_SITE = "migrate_other_site"
    SUSPEND = "suspend"


@dataclass(frozen=True, slots=True)
class Target:
    site: str
    path: Path


@dataclass(frozen=True, slots=True)
class Plan:
    targets: tuple[Target, ...]
    """Live migrations to try, in order; the suspension to the repository always follows a
    failed last try."""
    wait_s: float
    """How long the tries may wait in all for OAR to start the jobs asked for: after that the
    suspension must begin to end before OAR's kill."""
    reason: str
    """Why no migration is planned: journalled with the choice."""


def plan(
    *,
    need: int,
    site: str,
    free: Mapping[str, int | None],
    time_left_s: float,
    suspend_s: float,
    migrate_s: float,
    wait_s: float,
) -> Plan:
    """The migrations to try for a vjob needing `need` cores, warned at `site`.

    `free`: free cores per site as observed now (None: that site's OAR did not answer), the
    vjob's own cores not included (OAR is taking them back). `time_left_s`: until OAR's kill.
    `suspend_s`, `migrate_s`: estimates of a suspension to the repository and of moving the
    VMs live. `wait_s`: the longest wait for OAR to start a job (0: never migrate). Any two
    nodes can migrate: where they share no VM directory the driver copies the disks too
    (provisioning.migration), so no site is ruled out for its storage.
    """
    if need < 1:
        raise ValueError(f"need = {need}: a vjob needs at least one core")
    if wait_s <= 0:
        return Plan((), 0.0, "live migration disabled (saline.migrate_wait_s = 0)")
    roomy = [name for name, cores in free.items() if cores is not None and cores >= need]
    order = [Target(site, Path.SAME_SITE)] if site in roomy else []
    order += [Target(name, Path.OTHER_SITE) for name in roomy if name != site]
    if not order:
        return Plan((), 0.0, f"no site has {need} free cores")
    budget = wait_budget(time_left_s=time_left_s, suspend_s=suspend_s, migrate_s=migrate_s, wait_s=wait_s)
    if budget <= 0:
        return Plan((), 0.0, f"{time_left_s:.0f} s left: no time to try a migration and still suspend")
    return Plan(tuple(order), budget, "")


def wait_budget(*, time_left_s: float, suspend_s: float, migrate_s: float, wait_s: float) -> float:
    """How long the tries may wait for OAR to start a job and still leave room for a migration
    and then a suspension before OAR's kill; 0 when that is less than one scheduler pass."""
    budget = min(wait_s, time_left_s - suspend_s - migrate_s - MARGIN_S)
    return budget if budget >= MIN_WAIT_S else 0.0


def migrate_estimate_s(memory_mb: int, vm_count: int, measured_mb_per_s: float | None = None) -> float:
    """How long moving the VMs' memory should take: at the last measured speed, else assumed."""
    speed = measured_mb_per_s if measured_mb_per_s and measured_mb_per_s > 0 else MIGRATE_MB_PER_S
    return 1.0 + memory_mb * vm_count / speed


def suspend_estimate_s(memory_mb: int, vm_count: int) -> float:
    """A suspension before one was measured: save the memory, then copy it to the repository."""
    return 2.0 + 2 * memory_mb * vm_count / MIGRATE_MB_PER_S


class JournalEntry(Protocol):
    kind: str
    detail: dict[str, Any]


@dataclass(frozen=True, slots=True)
class OpenRequest:
    """A new OAR job asked for a live migration that no manager finished with: its manager died
    while OAR was starting it (or between oarsub and the journal entry of its id)."""

    site: str
    path: str
    oar_job_id: str | None
    """None: oarsub may have run but its id never reached the journal (look for the job by name)."""


def open_request(events: Sequence[JournalEntry]) -> OpenRequest | None:
    """The migration request the journal leaves open, if any.

    Why one at most: a manager asks for one new job at a time and closes it (migrated, failed)
    before the next try, all inside one pass that holds the vjob's lease; so only the last
    request can be open, and only when the manager stopped in the middle of it.
    """
    found: OpenRequest | None = None
    for ev in events:
        if ev.kind in OPENING:
            job_id = ev.detail.get("oar_job_id")
            found = OpenRequest(
                str(ev.detail.get("site", "")), str(ev.detail.get("path", "")), str(job_id) if job_id else None
            )
        elif ev.kind in CLOSING:
            found = None
    return found
