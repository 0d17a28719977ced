"""Saline network identities: a 16-bit subnetID per job, an 8-bit vmID per VM.

Why one transaction per assignment, a row lock and constraints instead of a lock protocol: the
subnetID space is shared by the masters of every site, and the database is the strongly
consistent arbiter. `assign` reads the job's subnet (locking its row), allocates what is
missing and inserts it, all in one transaction; `release` locks the same row before it deletes.
A release racing an assign therefore runs wholly before or wholly after it, never between its
look and its insert (the defect of the former API, where a VM inserted with a stale subnetID
landed in the subnet another job had meanwhile been given, and the next assign handed its
MAC/IP out a second time).

The constraints say the same thing to the database, so no code path can break it:
- (subnet_id, vm_id) is the primary key of vm_ids and the MAC is unique: one address per VM;
- a vm_ids row carries its job_key, with a foreign key on (subnet_id, job_key): a VM can only
  sit in its own job's subnet, and releasing the subnet removes its VMs (ON DELETE CASCADE).
A master that loses a race gets an IntegrityError, rolls back and looks again.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from vjob.errors import ExhaustedError, InputError, StoreError, VjobError
from vjob.store.db import Store, now
from vjob.store.schema import SubnetRecord, VMIdRecord

SUBNET_IDS = 1 << 16
VM_IDS = 1 << 8
_RETRIES = 256

# Keys and VM names become libvirt names, file names and log fields: a closed ASCII set, no
# leading dot or dash, capped at the column width; `fullmatch`, so a trailing newline is refused.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
SITE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAC_PREFIX = re.compile(r"[0-9a-fA-F]{2}(?::[0-9a-fA-F]{2}){2}")


@dataclass(frozen=True, slots=True)
class Address:
    """One VM's network identity as the store holds it."""

    vm_name: str
    subnet_id: int
    vm_id: int
    mac: str


def check_name(field: str, value: object, pattern: re.Pattern[str] = NAME) -> str:
    """`value` if it is a string matching `pattern` in full, else an InputError naming `field`."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise InputError(f"{field} = {_shown(value)}: must match {pattern.pattern}")
    return value


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def mac_address(prefix: str, subnet_id: int, vm_id: int) -> str:
    """prefix (3 octets) + subnetID (2 octets) + vmID (1 octet), lower case."""
    check_name("mac_prefix", prefix, MAC_PREFIX)
    return f"{prefix.lower()}:{subnet_id >> 8:02x}:{subnet_id & 0xFF:02x}:{vm_id:02x}"


def _lowest_free(used: Sequence[int], start: int, limit: int) -> int | None:
    taken = set(used)
    for candidate in range(start, limit):
        if candidate not in taken:
            return candidate
    return None


def assign(
    store: Store,
    *,
    site: str,
    job_key: str,
    vm_names: Sequence[str],
    mac_prefix: str,
    first_subnet: int = 1,
    first_vm: int = 1,
) -> list[Address]:
    """The identities of the job's VMs, in the order of `vm_names`: allocated on first call,
    the same on every later one (from any site), allocated and checked in one transaction.

    `first_subnet` reserves the subnetIDs below it (0 by default: 10.0.x.x is the network);
    `first_vm` the vmIDs below it (0 is the subnet's network address); 255 is the broadcast.
    """
    check_name("site", site, SITE)
    check_name("job_key", job_key)
    names = [check_name("vm_name", n) for n in vm_names]
    if len(set(names)) != len(names):
        raise InputError(f"vm_names = {_shown(names)}: a VM name appears twice")
    check_name("mac_prefix", mac_prefix, MAC_PREFIX)
    for _ in range(_RETRIES):
        try:
            with store.session("assign network identities") as s:
                return _assign_once(s, site, job_key, names, mac_prefix.lower(), first_subnet, first_vm)
        except IntegrityError:
            continue  # another master inserted the same subnetID, vmID or VM first: look again
    raise StoreError(f"could not assign network identities to {job_key} after {_RETRIES} tries")


def _assign_once(
    s: Session, site: str, job_key: str, names: list[str], prefix: str, first_subnet: int, first_vm: int
) -> list[Address]:
    # FOR UPDATE on PostgreSQL (SQLite's BEGIN IMMEDIATE already serialises writers): a release
    # of this job, or another master assigning to it, waits for this transaction, or we for it.
    sid = _subnet(s, site, job_key, first_subnet)
    held = {r.vm_name: r for r in s.scalars(select(VMIdRecord).where(VMIdRecord.vm_name.in_(names)))}
    for name, row in held.items():
        if row.job_key != job_key:
            raise VjobError(f"vm_name = {name!r}: already holds a network identity of job {row.job_key!r}")
    used_ids = set(s.scalars(select(VMIdRecord.vm_id).where(VMIdRecord.subnet_id == sid)))
    for name in sorted(set(names) - set(held)):  # one order for every master: no deadlock
        vm_id = _lowest_free(sorted(used_ids), first_vm, VM_IDS - 1)
        if vm_id is None:
            raise ExhaustedError(f"no free vmID left in subnet {sid} for VM {name}")
        used_ids.add(vm_id)
        row = VMIdRecord(
            subnet_id=sid,
            vm_id=vm_id,
            vm_name=name,
            job_key=job_key,
            mac=mac_address(prefix, sid, vm_id),
            allocated_at=now(),
        )
        s.add(row)
        held[name] = row
    for row in held.values():
        if row.mac is None:  # allocated before the MAC was stored (schema 0004): fix it now
            row.mac = mac_address(prefix, row.subnet_id, row.vm_id)
    s.flush()
    return [Address(n, held[n].subnet_id, held[n].vm_id, held[n].mac or "") for n in names]


def release(store: Store, job_key: str) -> None:
    """Free the job's subnetID and every vmID in it, in one transaction (idempotent)."""
    check_name("job_key", job_key)
    with store.session("release network identities") as s:
        sid = s.scalar(select(SubnetRecord.subnet_id).where(SubnetRecord.job_key == job_key).with_for_update())
        if sid is None:
            return
        s.execute(delete(VMIdRecord).where(VMIdRecord.subnet_id == sid))
        s.execute(delete(SubnetRecord).where(SubnetRecord.subnet_id == sid))


def _subnet(s: Session, site: str, job_key: str, first: int) -> int:
    """The job's subnetID, its row locked; allocated (lowest free from `first`) if it has none."""
    sid = s.scalar(select(SubnetRecord.subnet_id).where(SubnetRecord.job_key == job_key).with_for_update())
    if sid is not None:
        return sid
    used = list(s.scalars(select(SubnetRecord.subnet_id)))
    candidate = _lowest_free(used, first, SUBNET_IDS)
    if candidate is None:
        raise ExhaustedError(f"no free subnetID left: all {SUBNET_IDS - first} are allocated (site {site})")
    s.add(SubnetRecord(subnet_id=candidate, site=site, job_key=job_key, allocated_at=now()))
    s.flush()
    return candidate
