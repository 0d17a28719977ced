"""The driver's rows in the store: a VM's (`vms`) and its saved states' (`snapshots`).

Why apart from the libvirt calls: the rows are the driver's bookkeeping, not its actions; a
driver without a store (`store=None`, a pilot on a node without the database) does the same
actions and records nothing, so every function here takes the store and may be given None.

A snapshot row is keyed by path *and* node: nodes without a shared filesystem use the same
paths, so a path alone does not name one file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import select

from provisioning.vm_types import VMSpec
from vjob.model import VMState
from vjob.store.db import Store, now
from vjob.store.schema import SnapshotRecord, VMRecord


def record_vm(store: Store | None, spec: VMSpec, node: str, job_id: int | None, overlay: Path) -> None:
    """The VM's row as defined on `node` (only for a job's VM: `job_id` given)."""
    if store is None or job_id is None:
        return
    with store.session() as s:
        rec = s.scalar(select(VMRecord).where(VMRecord.name == spec.name))
        t = now()
        if rec is None:
            rec = VMRecord(name=spec.name, job_id=job_id, image=str(spec.image), created_at=t)
            s.add(rec)
        rec.node, rec.vcpus, rec.memory_mb = node, spec.vcpus, spec.memory_mib
        rec.overlay_path, rec.state, rec.updated_at = str(overlay), VMState.DEFINED.value, t


def update_vm(store: Store | None, vm: str, **fields: Any) -> None:
    """Set `fields` of the VM's row, when it has one."""
    if store is None:
        return
    with store.session() as s:
        rec = s.scalar(select(VMRecord).where(VMRecord.name == vm))
        if rec is None:
            return
        for key, value in fields.items():
            setattr(rec, key, value.value if isinstance(value, VMState) else value)
        rec.updated_at = now()


def forget_vm(store: Store | None, vm: str) -> None:
    """Remove the VM's row (the VM was deleted)."""
    if store is None:
        return
    with store.session() as s:
        rec = s.scalar(select(VMRecord).where(VMRecord.name == vm))
        if rec is not None:
            s.delete(rec)


def record_snapshot(
    store: Store | None,
    vm: str,
    node: str,
    kind: str,
    path: Path,
    size: int,
    digest: str,
    created: float,
    job_id: int | None,
) -> int | None:
    """The row of a fresh state file (once per digest); its id, None without a job to file it under."""
    if store is None:
        return None
    with store.session() as s:
        rec = s.scalar(select(SnapshotRecord).where(SnapshotRecord.path == str(path), SnapshotRecord.location == node))
        if rec is not None and rec.sha256 == digest:
            return rec.id
        if job_id is None:
            vm_rec = s.scalar(select(VMRecord).where(VMRecord.name == vm))
            job_id = vm_rec.job_id if vm_rec is not None else None
        if job_id is None:
            return None
        if rec is None:
            rec = SnapshotRecord(job_id=job_id, vm_name=vm, path=str(path), location_kind="node")
            s.add(rec)
        rec.kind, rec.size_bytes, rec.sha256, rec.location, rec.created_at = kind, size, digest, node, created
        s.flush()
        return rec.id


def snapshot_record(store: Store | None, path: Path, node: str) -> dict[str, Any] | None:
    """The store row of the state `path` on `node` (the newest), as the manifest's keys."""
    if store is None:
        return None
    with store.session() as s:
        rec = s.scalar(
            select(SnapshotRecord)
            .where(SnapshotRecord.path == str(path), SnapshotRecord.location == node)
            .order_by(SnapshotRecord.id.desc())
        )
        if rec is None:
            return None
        return {"id": rec.id, "size_bytes": rec.size_bytes, "sha256": rec.sha256, "created_at": rec.created_at}


def forget_snapshot(store: Store | None, path: Path, node: str) -> None:
    """Remove the rows of the state `path` on `node` (the file is gone or stale)."""
    if store is None:
        return
    with store.session() as s:
        query = select(SnapshotRecord).where(SnapshotRecord.path == str(path), SnapshotRecord.location == node)
        for rec in s.scalars(query):
            s.delete(rec)
