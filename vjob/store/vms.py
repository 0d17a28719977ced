"""Which VMs belong to which job, as the agent confirmed them: the `vms` table.

Why the agent keeps this and not the pilots' state files: a state file is written by the job's
user. Whatever root deletes or moves must come from a record root wrote itself, from what the
RMS confirmed (the job runs on that node) — never from a path or name a user typed.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from vjob.model import Job
from vjob.store import jobs as store_jobs
from vjob.store.db import Store, now
from vjob.store.schema import JobRecord, VMRecord


def remember(store: Store, rms: str, job: Job, *, vm: str, node: str, image: str = "", memory_mb: int = 0) -> None:
    """Record (or move) `vm` of `job` on `node`. A VM name already owned by another job is left
    as it is: names are derived from the job id, so that only happens on a forged claim."""
    job_pk = store_jobs.track(store, job)
    with store.session() as s:
        row = s.scalars(select(VMRecord).where(VMRecord.name == vm)).first()
        placed(s, row, vm=vm, job_pk=job_pk, node=node, image=image, memory_mb=memory_mb, stamp=now())


def placed(
    s: Session, row: VMRecord | None, *, vm: str, job_pk: int, node: str, image: str, memory_mb: int, stamp: float
) -> VMRecord:
    """`row` (the VM's, None: none yet) made or moved to `node` in session `s`, the rule of
    `remember` and of vms_many.remember_many: a name another job owns is left as it is."""
    if row is None:
        row = VMRecord(
            name=vm,
            job_id=job_pk,
            node=node,
            image=image or "-",
            memory_mb=max(1, memory_mb),
            state="running",
            created_at=stamp,
            updated_at=stamp,
        )
        s.add(row)
    elif row.job_id == job_pk and row.node != node:
        row.node = node
        row.updated_at = stamp
    return row


@dataclass(frozen=True)
class OwnedVM:
    name: str
    node: str


def of_job(store: Store, rms: str, rms_job_id: str) -> list[OwnedVM]:
    """The VMs recorded for one job, with the node each was last confirmed on."""
    with store.session() as s:
        rows = s.execute(
            select(VMRecord.name, VMRecord.node)
            .join(JobRecord, VMRecord.job_id == JobRecord.id)
            .where(JobRecord.rms == rms, JobRecord.rms_job_id == rms_job_id)
        ).all()
        return [OwnedVM(name, node) for name, node in rows if node]


def forget(store: Store, rms: str, rms_job_id: str) -> None:
    """Drop a job's VM records once its VMs are deleted."""
    with store.session() as s:
        ids = select(JobRecord.id).where(JobRecord.rms == rms, JobRecord.rms_job_id == rms_job_id)
        s.execute(delete(VMRecord).where(VMRecord.job_id.in_(ids)))


__all__ = ["OwnedVM", "forget", "of_job", "remember"]
