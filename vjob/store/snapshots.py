"""The `snapshots` table as the agent and `vjob status` use it: record one, list them all.

Why apart from provisioning.driver's own bookkeeping: the driver records what it saved itself
(Saline, the PBS hook, `vjob vm save`), but a job's pilot has no store credentials. The agent
records the pilots' saves for them (agent.pilot_snapshots); both write the same rows — one per
file path, updated when a new save replaces the file — so `vjob status` lists every snapshot
whoever took it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import select

from vjob.store.db import Store
from vjob.store.schema import JobRecord, SnapshotRecord

KINDS = ("memory", "disk_overlay", "full")


@dataclass(frozen=True)
class SnapshotRow:
    """One snapshot as `vjob status` shows it."""

    rms: str
    job: str
    vm: str
    kind: str
    node: str
    path: str
    size_bytes: int
    sha256: str
    created_at: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def recorded(store: Store, path: str) -> tuple[int, float] | None:
    """(size, time) of the row for `path`, None when there is none: the agent hashes a pilot's
    memory state only when it is new or changed, not every tick."""
    with store.session() as s:
        rec = s.scalar(select(SnapshotRecord).where(SnapshotRecord.path == path).order_by(SnapshotRecord.id.desc()))
        return None if rec is None else (rec.size_bytes, rec.created_at)


def record(
    store: Store,
    job_pk: int,
    *,
    vm: str,
    node: str,
    kind: str,
    path: str,
    size_bytes: int,
    sha256: str,
    created_at: float,
) -> int:
    """Record (or update, when the file at `path` was replaced) one snapshot; its row id."""
    if kind not in KINDS:
        raise ValueError(f"snapshot kind {kind!r}: must be one of {', '.join(KINDS)}")
    with store.session() as s:
        rec = s.scalar(select(SnapshotRecord).where(SnapshotRecord.path == path).order_by(SnapshotRecord.id.desc()))
        if rec is None:
            rec = SnapshotRecord(job_id=job_pk, path=path, location_kind="node")
            s.add(rec)
        rec.job_id, rec.vm_name, rec.kind, rec.location = job_pk, vm, kind, node
        rec.size_bytes, rec.sha256, rec.created_at = size_bytes, sha256, created_at
        s.flush()
        return int(rec.id)


def listing(store: Store, *, rms: str | None = None, limit: int = 1000) -> list[SnapshotRow]:
    """The newest `limit` snapshots (of one RMS's jobs when `rms` is given), newest first."""
    query = select(SnapshotRecord, JobRecord.rms, JobRecord.rms_job_id).join(
        JobRecord, SnapshotRecord.job_id == JobRecord.id
    )
    if rms is not None:
        query = query.where(JobRecord.rms == rms)
    query = query.order_by(SnapshotRecord.created_at.desc(), SnapshotRecord.id.desc()).limit(limit)
    with store.session() as s:
        return [
            SnapshotRow(
                job_rms,
                job_id,
                rec.vm_name,
                rec.kind,
                rec.location,
                rec.path,
                rec.size_bytes,
                rec.sha256,
                rec.created_at,
            )
            for rec, job_rms, job_id in s.execute(query)
        ]


__all__ = ["KINDS", "SnapshotRow", "listing", "record", "recorded"]
