"""The Saline journal: one row per best-effort vjob plus an append-only log of what happened.

Why every change goes through `record`: the row (phase, OAR job, site, latest safe snapshot)
and the event explaining it are written in one transaction, so a manager killed at any point
restarts from a row that matches its journal, and an operator can read the whole life of a
vjob (`vjob besteffort show KEY`) across kills, sites and manager restarts.

Why rows are checked when read (`scan`): the store is shared between the site masters, and
whoever can write to it could forge a row. A row whose fields do not match their grammar
(saline_bew.grammar) is reported, never returned as a vjob to act on, and never stops the
others from being read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any

from sqlalchemy import select

from saline_bew import grammar
from saline_bew.events import EventKind, Phase
from vjob.errors import InputError, VjobError
from vjob.model import Job, JobClass
from vjob.store import jobs as store_jobs
from vjob.store.db import Store, now
from vjob.store.schema import SalineEventRecord, SalineJobRecord

ACTIVE_PHASES = (Phase.SUBMITTED, Phase.RUNNING, Phase.KILLED)
"""The phases a manager acts on; the others wait for the cleanup, then for nothing."""
_ACTIVE = [str(p) for p in ACTIVE_PHASES]
"""The same as plain strings, for the database driver (which may adapt an Enum its own way)."""
RMS = "saline"


class LeaseLost(VjobError):
    """Another site master holds the vjob's lease now: this one must not change it."""


@dataclass(frozen=True, slots=True)
class SalineJob:
    key: str
    job_id: int
    user: str
    image: str
    command: tuple[str, ...]
    vm_count: int
    vcpus: int
    memory_mb: int
    walltime: str
    home_site: str
    site: str
    oar_job_id: str | None
    phase: str
    hosts: tuple[str, ...]
    kills: int
    restarts_from_scratch: int
    snapshot_label: str | None
    snapshot_site: str | None
    snapshot_at: float | None
    last_event_id: int
    error: str
    created_at: float
    updated_at: float

    @property
    def vm_names(self) -> list[str]:
        return [f"{self.key}-vm{i}" for i in range(self.vm_count)]

    @property
    def active(self) -> bool:
        return self.phase in ACTIVE_PHASES


@dataclass(frozen=True, slots=True)
class Event:
    id: int
    at: float
    kind: str
    site: str
    oar_job_id: str
    detail: dict[str, Any]


def _json_list(field: str, text: str) -> tuple[Any, ...]:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise InputError(f"{field} = {grammar.short(text)}: not JSON") from None
    if not isinstance(value, list):
        raise InputError(f"{field} = {grammar.short(text)}: not a JSON list")
    return tuple(value)


def _plain(rec: SalineJobRecord) -> SalineJob:
    return SalineJob(
        key=rec.key,
        job_id=rec.job_id,
        user=rec.user,
        image=rec.image,
        command=_json_list("command_json", rec.command_json),
        vm_count=rec.vm_count,
        vcpus=rec.vcpus,
        memory_mb=rec.memory_mb,
        walltime=rec.walltime,
        home_site=rec.home_site,
        site=rec.site,
        oar_job_id=rec.oar_job_id,
        phase=rec.phase,
        hosts=_json_list("hosts_json", rec.hosts_json),
        kills=rec.kills,
        restarts_from_scratch=rec.restarts_from_scratch,
        snapshot_label=rec.snapshot_label,
        snapshot_site=rec.snapshot_site,
        snapshot_at=rec.snapshot_at,
        last_event_id=rec.last_event_id,
        error=rec.error,
        created_at=rec.created_at,
        updated_at=rec.updated_at,
    )


def create(
    store: Store,
    *,
    key: str,
    user: str,
    image: str,
    command: list[str],
    vm_count: int,
    vcpus: int,
    memory_mb: int,
    walltime: str,
    site: str,
) -> SalineJob:
    """Record a new vjob (before anything is asked of OAR: a failed submission loses nothing)."""
    grammar.word("key", key, grammar.KEY)
    grammar.word("user", user, grammar.USER)
    grammar.word("image", image, grammar.IMAGE)
    grammar.command(command)
    grammar.number("vms", vm_count, 1, grammar.MAX_VMS)
    grammar.number("vcpus", vcpus, 1, grammar.MAX_VCPUS)
    grammar.number("memory", memory_mb, 1, grammar.MAX_MEMORY_MB)
    grammar.word("walltime", walltime, grammar.WALLTIME)
    grammar.word("site", site, grammar.SITE)
    job_id = store_jobs.track(
        store,
        Job(
            id=key,
            user=user,
            job_class=JobClass.BESTEFFORT,
            rms=RMS,
            nodes=vm_count,
            cores=vcpus,
            memory_mb=memory_mb,
            os_image=image,
            submit_time=now(),
        ),
        site=site,
    )
    t = now()
    with store.session() as s:
        s.add(
            SalineJobRecord(
                key=key,
                job_id=job_id,
                user=user,
                image=image,
                command_json=json.dumps(command),
                vm_count=vm_count,
                vcpus=vcpus,
                memory_mb=memory_mb,
                walltime=walltime,
                home_site=site,
                site=site,
                oar_job_id=None,
                phase=str(Phase.SUBMITTED),
                hosts_json="[]",
                kills=0,
                restarts_from_scratch=0,
                last_event_id=0,
                error="",
                created_at=t,
                updated_at=t,
            )
        )
        s.flush()
        s.add(
            SalineEventRecord(
                job_key=key,
                at=t,
                kind=str(EventKind.CREATED),
                site=site,
                oar_job_id="",
                detail=json.dumps({"image": image, "vms": vm_count}),
            )
        )
    return get(store, key)


def checked(rec: SalineJobRecord) -> SalineJob:
    """The row as a vjob, every field checked against its grammar (InputError otherwise)."""
    job = _plain(rec)
    grammar.check_job(job)
    return job


def get(store: Store, key: str) -> SalineJob:
    with store.session() as s:
        rec = s.get(SalineJobRecord, key)
        if rec is None:
            raise InputError(f"best-effort vjob {grammar.short(key)}: unknown (see 'vjob besteffort list')")
        return checked(rec)


Refused = tuple[str, str]
"""A row that failed its checks: (its key, cut to 80 characters, and why)."""


def scan(store: Store, *, active_only: bool = False, cleanup: bool = False) -> tuple[list[SalineJob], list[Refused]]:
    """Every vjob row (the active ones, or the ended ones not yet cleaned up) split into the
    vjobs that pass their checks and the refused rows."""
    with store.session() as s:
        q = select(SalineJobRecord).order_by(SalineJobRecord.created_at)
        if active_only:
            q = q.where(SalineJobRecord.phase.in_(_ACTIVE))
        if cleanup:
            cleaned = select(SalineEventRecord.id).where(
                SalineEventRecord.job_key == SalineJobRecord.key, SalineEventRecord.kind == str(EventKind.CLEANED)
            )
            q = q.where(SalineJobRecord.phase.not_in(_ACTIVE), ~cleaned.exists())
        good: list[SalineJob] = []
        bad: list[Refused] = []
        for rec in s.scalars(q):
            try:
                good.append(checked(rec))
            except InputError as exc:
                bad.append((str(rec.key)[:80], str(exc)))
        return good, bad


def all_jobs(store: Store, *, active_only: bool = False) -> list[SalineJob]:
    """The vjobs that pass their checks (refused rows are left out: see `scan`)."""
    return scan(store, active_only=active_only)[0]


def record(
    store: Store,
    key: str,
    kind: str,
    detail: dict[str, Any] | None = None,
    *,
    owner: str | None = None,
    **changes: Any,
) -> SalineJob:
    """Change the vjob's row and journal why (`kind`: an EventKind), in one transaction.

    With `owner`, the change is made only while that manager holds the vjob's lease (the row
    is locked for the check on PostgreSQL); otherwise it is LeaseLost and nothing changes.
    """
    t = now()
    with store.session() as s:
        rec = s.get(SalineJobRecord, key, with_for_update=owner is not None)
        if rec is None:
            raise InputError(f"best-effort vjob {grammar.short(key)}: unknown")
        if owner is not None and rec.lease_owner != owner:
            raise LeaseLost(f"best-effort vjob {key}: its lease is held by {rec.lease_owner or 'nobody'} now")
        for name, value in changes.items():
            if name == "hosts":
                rec.hosts_json = json.dumps(list(value))
            else:
                setattr(rec, name, str(value) if isinstance(value, Enum) else value)
        rec.updated_at = t
        s.add(
            SalineEventRecord(
                job_key=key,
                at=t,
                kind=str(kind),
                site=rec.site,
                oar_job_id=rec.oar_job_id or "",
                detail=json.dumps(detail or {}, default=str),
            )
        )
        s.flush()
        return checked(rec)


def events(store: Store, key: str) -> list[Event]:
    with store.session() as s:
        rows = s.scalars(
            select(SalineEventRecord).where(SalineEventRecord.job_key == key).order_by(SalineEventRecord.id)
        )
        return [Event(r.id, r.at, r.kind, r.site, r.oar_job_id, _detail(r.detail)) for r in rows]


def _detail(text: str | None) -> dict[str, Any]:
    """An event's detail; a forged or damaged one is shown as such, never raised."""
    try:
        value = json.loads(text or "{}")
    except (ValueError, RecursionError):
        return {"unreadable": grammar.short(text)}
    return value if isinstance(value, dict) else {"unreadable": grammar.short(text)}
