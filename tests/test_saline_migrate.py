"""Migrate before suspend on a real OAR 2.5.9 (Saline paper 3.1.1, issue 21 item 4).

OAR's warning is real (`oardel -c`, the checkpoint that OAR also sends before a best-effort
kill): the manager asks OAR for new resources, waits for the job to start, moves the VMs
there and gives the warned job back; only when that fails does it suspend into the
repository. The sites are the one OAR of tests/services/oar.py (a: host localhost, b: host
127.0.0.1, two resources each).

The VMs run on libvirt's test driver, one node file per OAR host, with one vm_dir for both
(live migration needs one overlay path): the test driver cannot migrate, so a move to another
host is the failing try that must end in a suspension, and a move to other cores of the same
host is the migration that needs no copy. The live migration itself between two real
libvirtds is `tests/test_provisioning_realvm.py::test_counter_continues_after_live_migration`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugins.oar.client import OarCommands
from provisioning.driver import Driver
from saline_bew import journal
from saline_bew.manager import Manager
from saline_bew.repository import Repository
from saline_bew.sites import Site
from saline_bew.vms import SalineVMs
from tests.saline_env import make_image, until
from tests.services import wait_for
from tests.services.libvirt import make_test_node
from vjob.config import parse
from vjob.model import VMState
from vjob.store.db import Store

pytestmark = [pytest.mark.oar, pytest.mark.libvirt]


@pytest.fixture
def manager(tmp_path: Path, oar_cluster) -> Iterator[Manager]:
    store = Store(f"sqlite:///{tmp_path / 'vjob.sqlite'}")
    store.upgrade()
    make_image(store, tmp_path)
    nodes = {host: make_test_node(tmp_path / "nodes", host.replace(".", "_")) for host in oar_cluster.sites.values()}
    cfg = parse(
        {
            "data_dir": str(tmp_path),
            "provisioning": {"nodes": nodes, "snapshot_dir": str(tmp_path / "snap" / "{node}")},
            "saline": {
                "poll_interval_s": 1,
                "checkpoint_delay_s": 60,
                "snapshot_period_s": 3600,
                "migrate_wait_s": 20,
                "sites": [
                    {"name": s, "repository": str(tmp_path / f"repo-{s}"), "oar_properties": oar_cluster.properties(s)}
                    for s in ("a", "b")
                ],
            },
        }
    )
    client = OarCommands(timeout_s=30)
    sites = {
        sc.name: Site(sc.name, client, Repository(sc.name, sc.repository), sc.oar_properties) for sc in cfg.saline.sites
    }
    with Driver(cfg.provisioning, data_dir=tmp_path, store=store) as driver:
        m = Manager(cfg, store, sites, SalineVMs(driver, store))
        yield m
        for job in journal.all_jobs(store):
            if job.active:
                m.cancel(job.key)
    store.close()


def _warned(manager: Manager, oar_cluster, *, vms: int, site: str, room_at: str) -> journal.SalineJob:
    """A vjob of `vms` VMs running at `site`, then OAR's checkpoint warning for its job, once
    `room_at` has every core free (earlier tests' jobs on the shared OAR have ended)."""
    _wait_site_free(manager, site, oar_cluster.resources_per_site)
    job = manager.submit(user=oar_cluster.user, image="empty", command=["sleep", "1"], vm_count=vms, site=site)
    job = until(manager, job.key, lambda j: j.phase == "running", 60, f"deployed at site {site}")
    assert job.hosts == (oar_cluster.sites[site],) * vms
    _wait_site_free(manager, room_at, oar_cluster.resources_per_site - (vms if room_at == site else 0))
    OarCommands().checkpoint(job.oar_job_id or "", user=oar_cluster.user)
    return job


def _wait_site_free(manager: Manager, site: str, cores: int) -> None:
    """Earlier tests' jobs on the shared OAR end first. oardel takes OAR seconds, and a job the
    Saline end-to-end tests left can take minutes under CI's load; going on before it ended let
    the manager move the new vjob to the other site, so a site that never frees is a failure
    named here, not a wrong placement asserted later."""
    wait_for(
        lambda: manager.ports.sites[site].free_cores() >= cores,
        240,
        f"{cores} free cores at site {site} (earlier tests' OAR jobs ending)",
        interval=1,
    )


class ManagerKilled(BaseException):
    """The manager process ends here (SIGKILL): nothing after this line of it runs."""


def _die_in_the_wait(manager: Manager, warned_id: str) -> None:
    """The manager's pass over the warned vjob, killed while it waits for OAR to start the new
    job it asked for (the first look at a job other than the warned one)."""
    client = manager.ports.sites["b"].client
    real_job = client.job

    def job(job_id: str, *, user: str = "") -> object:
        if job_id != warned_id:
            raise ManagerKilled
        return real_job(job_id, user=user)

    client.job = job  # type: ignore[method-assign]
    try:
        with pytest.raises(ManagerKilled):
            manager.step()
    finally:
        client.job = real_job  # type: ignore[method-assign]


def test_warning_with_room_on_the_same_host_moves_the_vjob_and_writes_nothing(manager: Manager, oar_cluster) -> None:
    """Site b has a free core on the vjob's own host: the vjob takes it over in a new OAR job,
    the warned job is given back, the VM never stopped, the repository stays empty. (Site b:
    the next test needs all of site a at once, and OAR frees a deleted job's cores slowly.)

    The manager is killed while OAR starts the new job, and started again (the same master:
    it takes its leases back at once): the request was journalled with its id before the wait,
    so the new manager takes that job over rather than asking OAR again, and no job of the
    vjob is left running (before, it ran until its walltime)."""
    job = _warned(manager, oar_cluster, vms=1, site="b", room_at="b")
    old = job.oar_job_id
    _die_in_the_wait(manager, old or "")
    asked = [e for e in journal.events(manager.ports.store, job.key) if e.kind == "migration_requested"]
    assert len(asked) == 1, "the request is journalled, with its id, before the wait"
    manager = Manager(
        manager.ports.config, manager.ports.store, manager.ports.sites, manager.ports.vms, owner=manager.ports.owner
    )
    moved = until(manager, job.key, lambda j: j.oar_job_id != old, 60, "moved to a new OAR job")
    assert moved.oar_job_id == asked[0].detail["oar_job_id"], "the job the dead manager asked for was not taken over"
    assert [e.kind for e in journal.events(manager.ports.store, job.key)].count("migration_requested") == 1
    mine = [j for j in OarCommands().jobs() if j.name == job.key and not j.finished and j.id != moved.oar_job_id]
    assert all(j.id == old for j in mine), f"another job of the vjob runs on: {mine}"
    journey = [(e.kind, e.detail) for e in journal.events(manager.ports.store, job.key)]
    assert moved.phase == "running", journey
    assert moved.site == "b" and moved.hosts == ("127.0.0.1",) and moved.kills == 0
    events = journal.events(manager.ports.store, job.key)
    kinds = [e.kind for e in events]
    assert "migration_requested" in kinds and "migrated" in kinds
    assert "snapshot" not in kinds and "killed" not in kinds
    relocated = next(e for e in events if e.kind == "relocation")
    assert relocated.detail["path"] == "migrate_same_site" and relocated.detail["running_s"] < 60
    assert manager.ports.sites["b"].repository.labels(job.key) == []
    assert manager.ports.vms.driver.state(job.vm_names[0], "127.0.0.1") is VMState.RUNNING
    gone = OarCommands().job(old or "")
    deadline = time.monotonic() + 30
    while gone is not None and not gone.finished and time.monotonic() < deadline:
        time.sleep(1)
        gone = OarCommands().job(old or "")
    assert gone is None or gone.finished, f"the warned OAR job was not given back: {gone}"
    assert manager.ports.metrics.value("vjob_saline_relocations_total", {"path": "migrate_same_site"}) == 1
    print(f"\nwarning → running on new resources: {relocated.detail['running_s']:.1f} s, nothing written")


def test_a_failed_live_migration_falls_back_to_the_suspension(manager: Manager, oar_cluster) -> None:
    """Site a is full (two VMs on its two cores), site b has room: the new job starts at b, the
    live migration to 127.0.0.1 fails (the test driver cannot migrate), so that job is given
    back and the VMs are suspended into site a's repository, nothing lost."""
    job = _warned(manager, oar_cluster, vms=2, site="a", room_at="b")
    killed = until(manager, job.key, lambda j: j.kills == 1, 90, "suspended after the failed migration")
    events = journal.events(manager.ports.store, job.key)
    kinds = [e.kind for e in events]
    asked = next(e for e in events if e.kind == "migration_requested")
    assert asked.detail["site"] == "b" and asked.detail["path"] == "migrate_other_site"
    failed = next(e for e in events if e.kind == "migration_failed")
    assert "migrate" in failed.detail["error"] and failed.detail["hosts"] == ["localhost", "localhost"]
    assert kinds.index("migration_failed") < kinds.index("snapshot") < kinds.index("killed")
    assert "migrated" not in kinds
    snap = next(e for e in events if e.kind == "snapshot")
    assert snap.detail["reason"] == "checkpoint"
    kill = next(e for e in events if e.kind == "killed")
    assert kill.detail["cause"] == "checkpoint" and kill.detail["lost_s"] == 0
    assert killed.snapshot_label in manager.ports.sites["a"].repository.labels(job.key)
    new = OarCommands().job(str(asked.detail["oar_job_id"]))
    deadline = time.monotonic() + 30
    while new is not None and not new.finished and time.monotonic() < deadline:
        time.sleep(1)
        new = OarCommands().job(str(asked.detail["oar_job_id"]))
    assert new is None or new.finished, f"the job asked for the migration was not given back: {new}"
    assert manager.ports.metrics.value("vjob_saline_relocations_total", {"path": "suspend"}) == 1
