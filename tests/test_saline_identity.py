"""Saline network identities: the address formulas, concurrent site masters, exhaustion."""

from __future__ import annotations

import multiprocessing as mp

import pytest
from sqlalchemy import insert, text

from saline_bew.identity import assign, ip_for, mac_for, release
from vjob.errors import ConfigError, ExhaustedError
from vjob.store import identities
from vjob.store.db import Store, now
from vjob.store.schema import VMIdRecord


def test_addresses_follow_subnet_and_vm_ids() -> None:
    assert mac_for("52:54:00", 0x1234, 0x56) == "52:54:00:12:34:56"
    assert ip_for("10.0.0.0/8", 0x1234, 7) == "10.18.52.7"  # the paper's 10.subnet.vm
    assert ip_for("10.0.0.0/8", 1, 1) == "10.0.1.1"
    with pytest.raises(ConfigError, match="needs 24 free bits"):
        ip_for("10.1.0.0/16", 1, 1)


def test_identities_are_stable_per_job_and_released(store: Store) -> None:
    first = assign(
        store, site="a", job_key="job1", vm_names=["j1-0", "j1-1"], mac_prefix="52:54:00", network="10.0.0.0/8"
    )
    again = assign(
        store, site="b", job_key="job1", vm_names=["j1-0", "j1-1"], mac_prefix="52:54:00", network="10.0.0.0/8"
    )
    assert first == again  # a resumed vjob keeps its addresses, whatever site resumes it
    assert len({i.ip for i in first}) == 2 and len({i.subnet_id for i in first}) == 1
    other = assign(store, site="a", job_key="job2", vm_names=["j2-0"], mac_prefix="52:54:00", network="10.0.0.0/8")
    assert other[0].subnet_id != first[0].subnet_id
    release(store, "job1")
    reused = assign(store, site="a", job_key="job3", vm_names=["j3-0"], mac_prefix="52:54:00", network="10.0.0.0/8")
    assert reused[0].subnet_id == first[0].subnet_id  # the freed subnet is handed out again


def _subnet_of(store: Store, site: str, job_key: str) -> int:
    """The subnetID `assign` gives the job (its one VM named `<job_key>-1`)."""
    got = identities.assign(store, site=site, job_key=job_key, vm_names=[f"{job_key}-1"], mac_prefix="52:54:00")
    return got[0].subnet_id


def test_exhaustion_is_a_clear_error(store: Store) -> None:
    sid = _subnet_of(store, "a", "big")  # its VM big-1 holds vmID 1
    with store.session() as s:  # 253 VMs already there; the API hands out the last one
        s.execute(
            insert(VMIdRecord),
            [
                {"subnet_id": sid, "vm_id": i, "vm_name": f"big-{i}", "job_key": "big", "allocated_at": now()}
                for i in range(2, 254)
            ],
        )
    names = [f"big-{i}" for i in range(1, 255)]
    assert identities.assign(store, site="a", job_key="big", vm_names=names, mac_prefix="52:54:00")[-1].vm_id == 254
    with pytest.raises(ExhaustedError, match=f"no free vmID left in subnet {sid}"):
        identities.assign(store, site="a", job_key="big", vm_names=[*names, "big-255"], mac_prefix="52:54:00")
    with store.session() as s:  # every other subnetID taken, in one statement the database runs itself
        s.execute(
            text(
                "WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < :top) "
                "INSERT INTO subnets (subnet_id, site, job_key, allocated_at) "
                "SELECT i, 'x', 'fill' || i, 0 FROM g WHERE i <> :sid"
            ),
            {"top": identities.SUBNET_IDS - 1, "sid": sid},
        )
    with pytest.raises(ExhaustedError, match="no free subnetID left"):
        _subnet_of(store, "a", "one-too-many")


def _master(url: str, site: str, jobs: int, queue: mp.Queue[list[tuple[str, int]]]) -> None:
    store = Store(url)
    got = [(f"{site}-{j}", _subnet_of(store, site, f"{site}-{j}")) for j in range(jobs)]
    store.close()
    queue.put(got)


@pytest.mark.postgres
def test_site_masters_allocating_at_once_never_collide(postgres_url: str) -> None:
    Store(postgres_url).upgrade()
    ctx = mp.get_context("spawn")
    queue: mp.Queue[list[tuple[str, int]]] = ctx.Queue()
    masters = [ctx.Process(target=_master, args=(postgres_url, f"site{i}", 20, queue)) for i in range(3)]
    for p in masters:
        p.start()
    results = [queue.get(timeout=120) for _ in masters]
    for p in masters:
        p.join(timeout=60)
        assert p.exitcode == 0
    subnets = [sid for got in results for _, sid in got]
    assert len(subnets) == 60
    assert len(set(subnets)) == 60, "two site masters handed out the same subnetID"
