"""VM placements recorded in one transaction (vjob.store.vms_many.remember_many) leave the store
as remember() one VM at a time does: new VMs added, a job's VM moved to its new node, a VM name
another job holds left as it is, a job with an odd user refused alone (issue 37 item 1: the
agent's first tick at a site records 20,000 vjobs' VMs)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select

from vjob.errors import InputError
from vjob.model import Job, JobState
from vjob.store import vms as store_vms
from vjob.store.db import Store
from vjob.store.schema import JobRecord, VMRecord
from vjob.store.vms_many import remember_many


def _job(job_id: str, user: str = "alice") -> Job:
    return Job(id=job_id, user=user, rms="slurm", state=JobState.RUNNING)


ROUNDS = [
    [
        (_job("1"), [("vjob-slurm-1", "n1")], "", 512),
        (_job("2"), [("vjob-slurm-2-0", "n1"), ("vjob-slurm-2-1", "n2")], "deb", 256),
    ],
    [
        (_job("1"), [("vjob-slurm-1", "n3")], "", 512),  # moved
        (_job("3"), [("vjob-slurm-2-0", "n9")], "", 128),  # another job's VM name: left as it is
        (_job("4", user="bad user\n"), [("vjob-slurm-4", "n4")], "", 128),  # refused, alone
        (_job("5"), [("vjob-slurm-5", "n5")], "", 0),
    ],
]


def _table(store: Store) -> list[tuple]:
    with store.session() as s:
        rows = s.execute(
            select(
                VMRecord.name, JobRecord.rms_job_id, VMRecord.node, VMRecord.image, VMRecord.memory_mb, VMRecord.state
            )
            .join(JobRecord, VMRecord.job_id == JobRecord.id)
            .order_by(VMRecord.id)
        ).all()
    return [tuple(r) for r in rows]


def test_one_transaction_leaves_the_store_as_one_vm_at_a_time(tmp_path: Path) -> None:
    one, many = (Store(f"sqlite:///{tmp_path / name}") for name in ("one.sqlite", "many.sqlite"))
    for store in (one, many):
        store.upgrade()
    for placements in ROUNDS:
        refused_one = []
        for job, vms, image, memory_mb in placements:
            try:
                for vm, node in vms:
                    store_vms.remember(one, "slurm", job, vm=vm, node=node, image=image, memory_mb=memory_mb)
            except InputError:
                refused_one.append(job.id)
        refused_many = remember_many(many, "slurm", placements)
        assert [job.id for job, _ in refused_many] == refused_one
        assert all(isinstance(exc, InputError) for _, exc in refused_many)
        assert _table(many) == _table(one)
    assert ("vjob-slurm-1", "1", "n3", "-", 512, "running") in _table(many)
    assert ("vjob-slurm-2-0", "2", "n1", "deb", 256, "running") in _table(many)
    assert ("vjob-slurm-5", "5", "n5", "-", 1, "running") in _table(many)
    for store in (one, many):
        store.close()


def test_nothing_to_record_opens_no_transaction(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'v.sqlite'}")
    store.upgrade()
    assert remember_many(store, "slurm", []) == []
    assert _table(store) == []
    store.close()
