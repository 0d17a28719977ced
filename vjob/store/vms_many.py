"""Many VM placements recorded in one transaction (vjob.store.vms.remember, batched).

Why: the agent records each running vjob's VMs once per placement (agent.observe._remember_vms).
An agent starting at a site's size (20,000 running vjobs) made three transactions per VM, about
15 s of its first tick's CPU; in steady state the few placements a tick cost a few hundredths
of a second. The rule is remember()'s: a VM name not recorded is added, one recorded for the
same job is moved to its node, one recorded for another job is left as it is.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select

from vjob.errors import InputError
from vjob.model import Job
from vjob.store import jobs as store_jobs
from vjob.store.db import Store, now
from vjob.store.schema import JobRecord, VMRecord
from vjob.store.vms import placed

Placement = tuple[Job, Sequence[tuple[str, str]], str, int]
"""A job, its VMs as (name, node), the image they run and the memory of each (MiB)."""
CHUNK = 500
"""Names per IN list (under SQLite's limit of bound parameters)."""


def remember_many(store: Store, rms: str, placements: Sequence[Placement]) -> list[tuple[Job, InputError]]:
    """Record (or move) every VM of these placements; the jobs refused with why (an odd id or
    user name, vjob.store.jobs: their VMs are not recorded, the others are)."""
    refused = store_jobs.track_many(store, [p[0] for p in placements])
    bad = {id(job) for job, _ in refused}
    todo = [p for p in placements if id(p[0]) not in bad]
    if not todo:
        return refused
    ids = sorted({job.id for job, *_ in todo})
    names = sorted({vm for _, vms, *_ in todo for vm, _node in vms})
    with store.session() as s:
        pks: dict[str, int] = {}
        for i in range(0, len(ids), CHUNK):
            part = ids[i : i + CHUNK]
            query = select(JobRecord.rms_job_id, JobRecord.id).where(
                JobRecord.rms == rms, JobRecord.rms_job_id.in_(part)
            )
            pks.update((job_id, pk) for job_id, pk in s.execute(query))
        rows: dict[str, VMRecord] = {}
        for i in range(0, len(names), CHUNK):
            rows.update((r.name, r) for r in s.scalars(select(VMRecord).where(VMRecord.name.in_(names[i : i + CHUNK]))))
        stamp = now()
        for job, vms, image, memory_mb in todo:
            job_pk = pks[job.id]
            for vm, node in vms:
                rows[vm] = placed(
                    s, rows.get(vm), vm=vm, job_pk=job_pk, node=node, image=image, memory_mb=memory_mb, stamp=stamp
                )
    return refused


__all__ = ["Placement", "remember_many"]
