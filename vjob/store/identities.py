"""Saline network identities: a 16-bit subnetID per job, an 8-bit vmID per VM.

Why a primary key plus retry instead of a lock protocol: the subnetID space is shared by the
masters of every site, and the database's uniqueness constraint is the strongly consistent
arbiter. A master picks the lowest free id it sees and inserts it; if another master took it
first, the insert fails and it tries again. No home-made protocol, same code on SQLite and
PostgreSQL.
"""

from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError

from vjob.errors import ExhaustedError, StoreError
from vjob.store.db import Store, now
from vjob.store.schema import SubnetRecord, VMIdRecord

SUBNET_IDS = 1 << 16
VM_IDS = 1 << 8
_RETRIES = 256


def _lowest_free(used: list[int], start: int, limit: int) -> int | None:
    taken = set(used)
    for candidate in range(start, limit):
        if candidate not in taken:
            return candidate
    return None


def allocate_subnet(store: Store, site: str, job_key: str, *, first: int = 1) -> int:
    """The subnetID of `job_key`, allocating the lowest free one (idempotent per job).

    `first` reserves the ids below it (0 is kept out by default: 10.0.x.x is the network).
    """
    for _ in range(_RETRIES):
        with store.session() as s:
            mine = s.scalar(select(SubnetRecord.subnet_id).where(SubnetRecord.job_key == job_key))
            if mine is not None:
                return mine
            used = list(s.scalars(select(SubnetRecord.subnet_id)))
        candidate = _lowest_free(used, first, SUBNET_IDS)
        if candidate is None:
            raise ExhaustedError(f"no free subnetID left: all {SUBNET_IDS - first} are allocated (site {site})")
        try:
            with store.session() as s:
                s.add(SubnetRecord(subnet_id=candidate, site=site, job_key=job_key, allocated_at=now()))
            return candidate
        except IntegrityError:
            continue  # another master took it (or allocated for this job): look again
    raise StoreError(f"could not allocate a subnetID for {job_key} after {_RETRIES} tries")


def allocate_vm_id(store: Store, subnet_id: int, vm_name: str, *, first: int = 1) -> int:
    """The vmID of `vm_name` in `subnet_id`, allocating the lowest free one (idempotent)."""
    for _ in range(_RETRIES):
        with store.session() as s:
            mine = s.scalar(select(VMIdRecord.vm_id).where(VMIdRecord.vm_name == vm_name))
            if mine is not None:
                return mine
            used = list(s.scalars(select(VMIdRecord.vm_id).where(VMIdRecord.subnet_id == subnet_id)))
        candidate = _lowest_free(used, first, VM_IDS - 1)  # 255 is the broadcast address
        if candidate is None:
            raise ExhaustedError(f"no free vmID left in subnet {subnet_id} for VM {vm_name}")
        try:
            with store.session() as s:
                s.add(VMIdRecord(subnet_id=subnet_id, vm_id=candidate, vm_name=vm_name, allocated_at=now()))
            return candidate
        except IntegrityError:
            continue
    raise StoreError(f"could not allocate a vmID for {vm_name} after {_RETRIES} tries")


def release_subnet(store: Store, job_key: str) -> None:
    """Free the job's subnetID and every vmID in it (idempotent)."""
    with store.session() as s:
        sid = s.scalar(select(SubnetRecord.subnet_id).where(SubnetRecord.job_key == job_key))
        if sid is None:
            return
        s.execute(delete(VMIdRecord).where(VMIdRecord.subnet_id == sid))
        s.execute(delete(SubnetRecord).where(SubnetRecord.subnet_id == sid))
