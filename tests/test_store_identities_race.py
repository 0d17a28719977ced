"""Saline identities under a release racing an assign (issue 23, item 7), with real processes.

The defect: assign read the job's subnetID in one transaction and inserted the VM's vmID in
another; a release (cancel during deployment) in between freed the subnet, another job got it,
and the VM landed in that job's subnet; once that job was released, the next assign handed the
same MAC/IP to a second VM. Each worker here assigns and releases a small pool of jobs at
random, as several site masters would; then the database and the handed-out addresses are
checked: every VM sits in its own job's subnet, no two VMs share a MAC or an IP.
"""

from __future__ import annotations

import multiprocessing as mp
import random

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError

from vjob.errors import InputError, VjobError
from vjob.store import identities
from vjob.store.db import Store
from vjob.store.schema import SubnetRecord, VMIdRecord

JOBS = [f"job{i}" for i in range(8)]
VMS_PER_JOB = 3
PREFIX = "52:54:00"


def _vms(job: str) -> list[str]:
    return [f"{job}-vm{i}" for i in range(VMS_PER_JOB)]


def _racer(url: str, seed: int, rounds: int, out: mp.Queue) -> None:
    """One site master: assign or release a random job of the shared pool, `rounds` times."""
    rng = random.Random(seed)
    store = Store(url)
    problems: list[str] = []
    for _ in range(rounds):
        job = rng.choice(JOBS)
        if rng.random() < 0.35:
            identities.release(store, job)
            continue
        got = identities.assign(store, site=f"site{seed}", job_key=job, vm_names=_vms(job), mac_prefix=PREFIX)
        if len({a.subnet_id for a in got}) != 1:
            problems.append(f"{job}: VMs in several subnets {got}")
        if len({a.mac for a in got}) != len(got):
            problems.append(f"{job}: one MAC twice {got}")
    store.close()
    out.put(problems)


def _race(url: str, workers: int, rounds: int) -> list[str]:
    ctx = mp.get_context("spawn")
    queue: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(url, seed, rounds, queue)) for seed in range(workers)]
    for p in procs:
        p.start()
    problems = [msg for _ in procs for msg in queue.get(timeout=240)]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0, f"racer exited with {p.exitcode}"
    return problems


@pytest.mark.slow
def test_release_racing_assign_never_shares_an_address(store: Store) -> None:
    assert _race(store.url, workers=4, rounds=150) == []
    with store.session() as s:
        owner = dict(s.execute(select(SubnetRecord.subnet_id, SubnetRecord.job_key)).tuples().all())
        rows = list(s.scalars(select(VMIdRecord)))
    for row in rows:  # the VM's name says its job: it must sit in that job's subnet
        job = row.vm_name.rsplit("-vm", 1)[0]
        assert owner.get(row.subnet_id) == job == row.job_key, (
            f"{row.vm_name} in the subnet of {owner.get(row.subnet_id)}"
        )
    # Every job still holding a subnet gets its addresses again: all distinct across jobs.
    handed = []
    for job in sorted(set(owner.values())):
        handed += identities.assign(store, site="check", job_key=job, vm_names=_vms(job), mac_prefix=PREFIX)
    assert len({a.mac for a in handed}) == len(handed)
    assert len({(a.subnet_id, a.vm_id) for a in handed}) == len(handed)


def test_a_vm_cannot_be_put_in_another_jobs_subnet(store: Store) -> None:
    """The database itself refuses it (foreign key on subnet and job), whatever the code does."""
    a = identities.assign(store, site="s", job_key="a", vm_names=["a-vm0"], mac_prefix=PREFIX)[0]
    identities.assign(store, site="s", job_key="b", vm_names=["b-vm0"], mac_prefix=PREFIX)
    with pytest.raises(IntegrityError, match=r"(?i)foreign key"):
        with store.session() as s:
            s.execute(
                text(
                    "INSERT INTO vm_ids (subnet_id, vm_id, vm_name, job_key, mac, allocated_at) "
                    "VALUES (:sid, 9, 'b-vm9', 'b', NULL, 0)"
                ),
                {"sid": a.subnet_id},
            )
    with pytest.raises(IntegrityError, match=r"(?i)unique|duplicate"):
        with store.session() as s:  # one MAC, two rows
            s.execute(
                text(
                    "INSERT INTO vm_ids (subnet_id, vm_id, vm_name, job_key, mac, allocated_at) "
                    "VALUES (:sid, 9, 'a-vm9', 'a', :mac, 0)"
                ),
                {"sid": a.subnet_id, "mac": a.mac},
            )


def test_release_frees_everything_and_assign_is_stable(store: Store) -> None:
    first = identities.assign(store, site="s", job_key="j", vm_names=["j-vm0", "j-vm1"], mac_prefix=PREFIX)
    assert identities.assign(store, site="t", job_key="j", vm_names=["j-vm1", "j-vm0"], mac_prefix="aa:bb:cc") == [
        first[1],
        first[0],
    ]  # same addresses from any site, the MAC fixed at allocation
    assert first[0].mac == f"{PREFIX}:00:01:01"
    identities.release(store, "j")
    with store.session() as s:
        assert s.scalar(text("SELECT COUNT(*) FROM vm_ids")) == 0
    with pytest.raises(VjobError, match="already holds a network identity of job 'k'"):
        identities.assign(store, site="s", job_key="k", vm_names=["x"], mac_prefix=PREFIX)
        identities.assign(store, site="s", job_key="m", vm_names=["x"], mac_prefix=PREFIX)


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("job_key", {"job_key": "job1\n"}),
        ("vm_name", {"vm_names": ["vm0\n"]}),
        ("vm_name", {"vm_names": ["../vm0"]}),
        ("site", {"site": "a\n"}),
        ("mac_prefix", {"mac_prefix": "52:54:00\n"}),
    ],
)
def test_names_with_a_trailing_newline_are_refused(store: Store, field: str, kwargs: dict[str, object]) -> None:
    args: dict[str, object] = {"site": "s", "job_key": "job1", "vm_names": ["vm0"], "mac_prefix": PREFIX} | kwargs
    with pytest.raises(InputError, match=f"^{field} = "):
        identities.assign(store, **args)  # type: ignore[arg-type]
