"""The Saline journal: one row per best-effort vjob plus an append-only log of what happened.

Why every change goes through `record`: the row (phase, OAR job, site, latest safe snapshot)
and the event explaining it are written in one transaction, so a manager killed at any point
restarts from a row that matches its journal, and an operator can read the whole life of a
vjob (`vjob besteffort show KEY`) across kills, sites and manager restarts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from vjob.errors import InputError
from vjob.model import Job, JobClass
from vjob.store import jobs as store_jobs
from vjob.store.db import Store, now
from vjob.store.schema import SalineEventRecord, SalineJobRecord

ACTIVE_PHASES = ("submitted", "running", "killed")
RMS = "saline"


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


def _plain(rec: SalineJobRecord) -> SalineJob:
    return SalineJob(
        key=rec.key,
        job_id=rec.job_id,
        user=rec.user,
        image=rec.image,
        command=tuple(json.loads(rec.command_json)),
        vm_count=rec.vm_count,
        vcpus=rec.vcpus,
        memory_mb=rec.memory_mb,
        walltime=rec.walltime,
        home_site=rec.home_site,
        site=rec.site,
        oar_job_id=rec.oar_job_id,
        phase=rec.phase,
        hosts=tuple(json.loads(rec.hosts_json)),
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
                phase="submitted",
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
                kind="created",
                site=site,
                oar_job_id="",
                detail=json.dumps({"image": image, "vms": vm_count}),
            )
        )
    return get(store, key)


def get(store: Store, key: str) -> SalineJob:
    with store.session() as s:
        rec = s.get(SalineJobRecord, key)
        if rec is None:
            raise InputError(f"best-effort vjob {key!r}: unknown (see 'vjob besteffort list')")
        return _plain(rec)


def all_jobs(store: Store, *, active_only: bool = False) -> list[SalineJob]:
    with store.session() as s:
        q = select(SalineJobRecord).order_by(SalineJobRecord.created_at)
        if active_only:
            q = q.where(SalineJobRecord.phase.in_(ACTIVE_PHASES))
        return [_plain(r) for r in s.scalars(q)]


def needing_cleanup(store: Store) -> list[SalineJob]:
    """Ended vjobs whose VMs, snapshots and identities were not yet removed (no `cleaned` event)."""
    cleaned = select(SalineEventRecord.id).where(
        SalineEventRecord.job_key == SalineJobRecord.key, SalineEventRecord.kind == "cleaned"
    )
    with store.session() as s:
        q = select(SalineJobRecord).where(SalineJobRecord.phase.not_in(ACTIVE_PHASES), ~cleaned.exists())
        return [_plain(r) for r in s.scalars(q)]


def record(store: Store, key: str, kind: str, detail: dict[str, Any] | None = None, **changes: Any) -> SalineJob:
    """Change the vjob's row and journal why, in one transaction."""
    t = now()
    with store.session() as s:
        rec = s.get(SalineJobRecord, key)
        if rec is None:
            raise InputError(f"best-effort vjob {key!r}: unknown")
        for name, value in changes.items():
            if name == "hosts":
                rec.hosts_json = json.dumps(list(value))
            else:
                setattr(rec, name, value)
        rec.updated_at = t
        s.add(
            SalineEventRecord(
                job_key=key,
                at=t,
                kind=kind,
                site=rec.site,
                oar_job_id=rec.oar_job_id or "",
                detail=json.dumps(detail or {}, default=str),
            )
        )
        s.flush()
        return _plain(rec)


def events(store: Store, key: str) -> list[Event]:
    with store.session() as s:
        rows = s.scalars(
            select(SalineEventRecord).where(SalineEventRecord.job_key == key).order_by(SalineEventRecord.id)
        )
        return [Event(r.id, r.at, r.kind, r.site, r.oar_job_id, json.loads(r.detail or "{}")) for r in rows]
