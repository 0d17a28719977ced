"""The Saline manager without OAR: bad input, OAR unreachable, and when a snapshot is safe.

VMs run on libvirt's test driver (provisioning's test-driver nodes n1 and n2): a save there
writes a real state file, so the repository checks see real files of real sizes. The
repository that is full or read-only is a real tmpfs mounted for the test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import libvirt
import pytest

from plugins.oar.client import OarRest
from plugins.oar.parse import OarEvent, OarJob
from provisioning import coordinated, job_disk, network
from provisioning.driver import Driver, DriverError
from provisioning.images import Catalogue
from saline_bew import cleanup, cli, client, deployment, identity, journal, output, protocol, server, snapshots, workdir
from saline_bew.client import RemoteError
from saline_bew.manager import Manager
from saline_bew.repository import Repository
from saline_bew.server import Server
from saline_bew.sites import Site
from saline_bew.vms import SalineVMs
from tests.saline_env import make_real_image
from tests.services import free_port
from vjob.config import ProvisioningConfig, parse
from vjob.errors import CommandError, InputError
from vjob.model import VMState
from vjob.store import jobs as store_jobs
from vjob.store.db import Store, now

NOBODY = pwd.getpwnam("nobody")
"""The submitter of the disks `workdir.receive` checks: qemu-img runs as this account."""

pytestmark = pytest.mark.libvirt


@pytest.fixture
def manager(tmp_path: Path, test_nodes: dict[str, str]) -> Iterator[Manager]:
    with _manager(tmp_path, test_nodes, vm_dir=str(tmp_path / "vms" / "{node}")) as m:
        yield m


@pytest.fixture
def shared_manager(tmp_path: Path, test_nodes: dict[str, str]) -> Iterator[Manager]:
    """One vm_dir for both nodes (shared storage): a VM's saved state restores on either node
    unchanged, which is all the test driver can do (it cannot rewrite a state's disk paths)."""
    with _manager(tmp_path, test_nodes, vm_dir=str(tmp_path / "vms")) as m:
        yield m


@contextlib.contextmanager
def _manager(tmp_path: Path, test_nodes: dict[str, str], *, vm_dir: str) -> Iterator[Manager]:
    store = Store(f"sqlite:///{tmp_path / 'vjob.sqlite'}")
    store.upgrade()
    image = tmp_path / "empty.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "16M"], check=True, timeout=30)
    Catalogue(store, ProvisioningConfig(), data_dir=tmp_path).add("empty", image)
    dead_api = f"http://127.0.0.1:{free_port()}/oarapi"  # nobody listens: OAR is unreachable
    cfg = parse(
        {
            "data_dir": str(tmp_path),
            "provisioning": {
                "nodes": test_nodes,
                "snapshot_dir": str(tmp_path / "snap" / "{node}"),
                "vm_dir": vm_dir,
            },
            "saline": {"sites": [{"name": "a", "oar_api_url": dead_api, "repository": str(tmp_path / "repo")}]},
        }
    )
    sites = {"a": Site("a", OarRest(dead_api, timeout_s=2), Repository("a", str(tmp_path / "repo")))}
    with Driver(cfg.provisioning, data_dir=tmp_path, store=store) as driver:
        yield Manager(cfg, store, sites, SalineVMs(driver, store))
    store.close()


def _running(manager: Manager, node: str = "n1", vms: int = 1) -> journal.SalineJob:
    """A vjob whose VMs run on `node`, as after a deployment."""
    job = journal.create(
        manager.ports.store,
        key="be0123456789",
        user="alice",
        image="empty",
        command=["true"],
        vm_count=vms,
        vcpus=1,
        memory_mb=128,
        walltime="1:00:00",
        site="a",
    )
    assert manager.ports.lease(job.key)  # as after manager.submit: this manager acts on it
    ids = identity.assign(
        manager.ports.store,
        site="a",
        job_key=job.key,
        vm_names=job.vm_names,
        mac_prefix="52:54:00",
        network="10.0.0.0/8",
    )
    image = manager.ports.vms.image("empty")
    for vm, ident in zip(job.vm_names, ids, strict=True):
        manager.ports.vms.boot_fresh(
            manager.ports.vms.spec(vm, image, ["true"], ident, 128, 1), node, job_id=job.job_id
        )
    hosts = [node] * vms
    return journal.record(manager.ports.store, job.key, "deployed", phase="running", hosts=hosts, oar_job_id="1")


def test_unknown_image_is_refused_before_anything_is_recorded(manager: Manager) -> None:
    with pytest.raises(InputError, match=r"image centos9: not in the catalogue"):
        manager.submit(user="alice", image="centos9", command=["true"], site="a")
    assert journal.all_jobs(manager.ports.store) == []


def test_oar_unreachable_is_a_clear_error_and_loses_no_record(manager: Manager) -> None:
    with pytest.raises(CommandError, match="OAR API unreachable"):
        manager.submit(user="alice", image="empty", command=["sleep", "60"], site="a")
    [job] = journal.all_jobs(manager.ports.store)
    assert job.phase == "submitted" and job.oar_job_id is None and "unreachable" in job.error
    assert [e.kind for e in journal.events(manager.ports.store, job.key)] == ["created", "submit_failed"]
    manager.step()  # the manager tries again and fails the same way: the vjob is still there
    again = journal.get(manager.ports.store, job.key)
    assert again.phase == "submitted" and again.command == ("sleep", "60")


def test_a_snapshot_in_the_repository_is_safe_and_owner_only(manager: Manager) -> None:
    job = _running(manager)
    assert snapshots.snapshot(manager.ports, job, reason="periodic")
    job = journal.get(manager.ports.store, job.key)
    assert job.snapshot_label and job.snapshot_site == "a" and job.snapshot_at
    files = sorted((manager.ports.sites["a"].repository.label_dir(job.key, job.snapshot_label)).iterdir())
    assert len(files) == 3 and all(f.stat().st_mode & 0o077 == 0 for f in files)
    assert not any(manager.ports.vms.stage_dir("n1").iterdir()), "the node keeps no copy once it is in the repository"
    first = job.snapshot_label
    assert snapshots.snapshot(manager.ports, job, reason="periodic")
    assert manager.ports.sites["a"].repository.labels(job.key) == [
        journal.get(manager.ports.store, job.key).snapshot_label
    ]
    assert first not in manager.ports.sites["a"].repository.labels(job.key)  # the older one is dropped once superseded


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "small"
    where.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "vjob-test-repo", str(where)], check=True, timeout=30
    )
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False, timeout=30)


@pytest.mark.parametrize("problem", ["full", "read-only"])
def test_a_full_or_unwritable_repository_is_not_reported_safe(manager: Manager, tmpfs: Path, problem: str) -> None:
    job = _running(manager)
    assert snapshots.snapshot(manager.ports, job, reason="periodic")  # a first, safe snapshot in the good repository
    safe = journal.get(manager.ports.store, job.key)
    if problem == "read-only":
        subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True, timeout=30)
    manager.ports.sites["a"].repository = Repository("a", str(tmpfs / "repo") if problem == "full" else str(tmpfs))
    assert not snapshots.snapshot(manager.ports, safe, reason="checkpoint")
    after = journal.get(manager.ports.store, job.key)
    assert after.snapshot_label == safe.snapshot_label and after.snapshot_at == safe.snapshot_at
    expected = "bytes free" if problem == "full" else "not writable"
    assert expected in after.error
    failed = [e for e in journal.events(manager.ports.store, job.key) if e.kind == "snapshot_failed"]
    assert len(failed) == 1 and expected in failed[0].detail["error"]
    assert manager.ports.metrics.value("vjob_saline_snapshots_total") == 1
    assert manager.ports.metrics.value("vjob_saline_snapshot_failures_total") == 1
    assert not any(manager.ports.vms.stage_dir("n1").iterdir()), "a failed snapshot leaves no half copy on the node"


def test_cli_submit_errors_and_the_kept_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The user commands through the manager's socket; the manager built from the file."""
    from saline_bew.cli import build
    from vjob.cli import main

    submitted_in = tmp_path / "submitted-in"  # not the checkout: submit stages its directory
    submitted_in.mkdir()
    monkeypatch.chdir(submitted_in)

    image = tmp_path / "img.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "16M"], check=True, timeout=30)
    conf = tmp_path / "vjob.toml"
    conf.write_text(
        f'data_dir = "{tmp_path}"\n'
        f'[database]\nurl = "sqlite:///{tmp_path / "v.sqlite"}"\n'
        f'[[saline.sites]]\nname = "a"\noar_api_url = "http://127.0.0.1:{free_port()}/oarapi"\n'
        f'repository = "{tmp_path / "repo"}"\n'
    )
    assert main(["--config", str(conf), "db", "upgrade"]) == 0
    store = Store(f"sqlite:///{tmp_path / 'v.sqlite'}")
    Catalogue(store, ProvisioningConfig(), data_dir=tmp_path).add("empty", image)
    manager = build(argparse.Namespace(config=str(conf), debug=False))
    sock = tmp_path / "run" / "saline.sock"
    capsys.readouterr()
    with server.Server(manager, sock):
        base = ["besteffort", "--socket", str(sock), "submit", "--user", "nobody"]
        assert main([*base, "--image", "nope", "--", "true"]) == 2
        assert "image nope: not in the catalogue" in capsys.readouterr().err
        assert main([*base, "--image", "empty"]) == 2
        assert "missing COMMAND" in capsys.readouterr().err
        assert main([*base, "--image", "empty", "--", "sleep", "5"]) == 1
        err = capsys.readouterr().err
        assert "OAR API unreachable" in err and "the vjob is recorded" in err
        assert main(["besteffort", "--socket", str(sock), "list", "--json"]) == 0
        listed = capsys.readouterr().out
        assert '"phase": "submitted"' in listed and '"oar_job_id": null' in listed
        assert main(["besteffort", "--socket", str(sock), "list"]) == 0
        table = capsys.readouterr().out.splitlines()  # not a terminal: plain aligned columns, full headers
        assert table[1].split()[:4] == ["key", "user", "phase", "site"] and "safe snapshot" in table[1]
        assert table[2].split()[1:3] == ["nobody", "submitted"] and table[2].startswith(json.loads(listed)[0]["key"])
        manager.step()  # retries, journals, goes on
        key = json.loads(listed)[0]["key"]
        assert main(["besteffort", "--socket", str(sock), "show", key]) == 0
        out = capsys.readouterr().out
        shown = json.loads(out[out.index("{") :])  # after the manager's log lines, if the test's capture got them
        assert [e["kind"] for e in shown["journal"]] == ["created", "submit_failed", "submit_failed"]
    assert not sock.exists()
    assert main(["besteffort", "--socket", str(sock), "list"]) == 1
    assert "no Saline manager listens there" in capsys.readouterr().err
    assert main(["--config", str(conf), "besteffort", "manager", "--once"]) == 0
    store.close()


def test_cancel_cleans_vms_snapshots_and_identities_once(manager: Manager) -> None:
    job = _running(manager)
    assert snapshots.snapshot(manager.ports, job, reason="periodic")
    repo = manager.ports.sites["a"].repository
    assert repo.labels(job.key)
    journal.record(manager.ports.store, job.key, "test", oar_job_id=None)  # no OAR job to delete (OAR is unreachable)
    manager.cancel(job.key)
    manager.step()
    manager.step()
    assert repo.labels(job.key) == []
    assert manager.ports.vms.driver.state(job.vm_names[0], "n1") is None
    kinds = [e.kind for e in journal.events(manager.ports.store, job.key)]
    assert kinds.count("cleaned") == 1 and kinds[-2:] == ["cancelled", "cleaned"]
    fresh = identity.assign(
        manager.ports.store,
        site="a",
        job_key="next",
        vm_names=["next-vm0"],
        mac_prefix="52:54:00",
        network="10.0.0.0/8",
    )
    assert fresh[0].subnet_id == 1  # the cancelled vjob's subnet is free again


def test_cancel_with_a_node_unreachable_is_recorded_and_the_cleanup_removes_the_vms_later(
    manager: Manager, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = _running(manager)
    journal.record(manager.ports.store, job.key, "test", oar_job_id=None)  # no OAR job to delete (OAR is unreachable)
    driver = manager.ports.vms.driver
    real_connection = driver.connection

    def unreachable(node: str) -> object:
        raise DriverError("connect", "-", node, "libvirt unreachable")

    monkeypatch.setattr(driver, "connection", unreachable)
    assert manager.cancel(job.key).phase == "cancelled"  # recorded, not raised: the OAR job is gone
    kinds = [e.kind for e in journal.events(manager.ports.store, job.key)]
    assert kinds[-1] == "cancelled" and "cleaned" not in kinds
    manager.step()  # the node is still unreachable: the cleanup fails and is retried, nothing lost
    assert "cleaned" not in [e.kind for e in journal.events(manager.ports.store, job.key)]
    monkeypatch.setattr(driver, "connection", real_connection)
    assert driver.state(job.vm_names[0], "n1") == VMState.RUNNING
    manager.step()
    assert driver.state(job.vm_names[0], "n1") is None
    assert [e.kind for e in journal.events(manager.ports.store, job.key)].count("cleaned") == 1


def _killed_by_oar(job: journal.SalineJob) -> OarJob:
    """What oarstat shows of the vjob's OAR job after OAR's scheduler took the nodes back."""
    return OarJob(
        id=job.oar_job_id or "1",
        state="Error",
        user=job.user,
        types=("besteffort",),
        events=(OarEvent(7, "BESTEFFORT_KILL", now(), "[MetaSched] kill the besteffort job"),),
    )


def _running_again(job: journal.SalineJob, host: str) -> OarJob:
    return OarJob(id="2", state="Running", user=job.user, types=("besteffort",), hosts=(host,), resources=(3,))


def test_a_kill_before_the_first_snapshot_restarts_from_scratch_and_is_counted(manager: Manager) -> None:
    job = _running(manager)
    with pytest.raises(CommandError, match="unreachable"):  # the kill is handled, then OAR is asked again
        manager._ended(job, _killed_by_oar(job))
    job = journal.get(manager.ports.store, job.key)
    assert job.phase == "submitted" and job.kills == 1 and job.hosts == ()
    assert manager.ports.vms.driver.state(job.vm_names[0], "n1") is None, "the killed VM must not keep the node"
    deployment.deploy(manager.ports, job, _running_again(job, "n2"))
    job = journal.get(manager.ports.store, job.key)
    assert job.restarts_from_scratch == 1 and job.hosts == ("n2",)
    assert [e.kind for e in journal.events(manager.ports.store, job.key)][-1] == "restarted_from_scratch"
    assert store_jobs.get(manager.ports.store, "saline", job.key).preempt_count == 1
    assert manager.ports.metrics.value("vjob_saline_kills_total") == 1
    assert manager.ports.metrics.value("vjob_saline_resubmissions_total") == 1
    assert "vjob_saline_kills_total 1.0" in manager.ports.metrics.text()


def test_a_kill_after_a_snapshot_resumes_from_the_repository(manager: Manager) -> None:
    job = _running(manager)
    assert snapshots.snapshot(manager.ports, job, reason="periodic")
    job = journal.get(manager.ports.store, job.key)
    with pytest.raises(CommandError, match="unreachable"):
        manager._ended(job, _killed_by_oar(job))
    killed = [e for e in journal.events(manager.ports.store, job.key) if e.kind == "killed"]
    assert killed[0].detail["cause"] == "besteffort_kill" and killed[0].detail["snapshot"] == job.snapshot_label
    # OAR gives it the same host again (the test driver cannot rewrite paths for another node;
    # the resume on another node and site is tested on real QEMU in test_saline_e2e).
    deployment.deploy(manager.ports, journal.get(manager.ports.store, job.key), _running_again(job, "n1"))
    after = journal.get(manager.ports.store, job.key)
    assert after.restarts_from_scratch == 0 and after.phase == "running" and after.hosts == ("n1",)
    assert manager.ports.vms.driver.state(job.vm_names[0], "n1") is VMState.RUNNING
    resumed = journal.events(manager.ports.store, job.key)[-1]
    assert resumed.kind == "resumed" and resumed.detail["label"] == job.snapshot_label
    record = store_jobs.get(manager.ports.store, "saline", job.key)
    assert record.preempt_count == 1 and record.preempted_since is None


@pytest.mark.parametrize("suspend", [False, True])
def test_a_two_vm_vjob_is_snapshotted_in_one_cut(
    manager: Manager, suspend: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every VM of the job is paused before any of them is saved (issue: Saline used to save one
    VM after another while the others ran on, which is no consistent snapshot of the job)."""
    job = _running(manager, vms=2)
    calls: list[tuple[str, str]] = []
    driver = manager.ports.vms.driver
    for name in ("pause", "save", "snapshot"):
        real = getattr(driver, name)

        def spy(vm: str, node: str, *args: object, _real=real, _name=name, **kwargs: object) -> object:
            calls.append((_name, vm))
            return _real(vm, node, *args, **kwargs)

        setattr(driver, name, spy)
    cuts: list[coordinated.Cut] = []
    real_checkpoint = coordinated.checkpoint

    def spy_checkpoint(*args: object, **kwargs: object) -> coordinated.Cut:
        cuts.append(real_checkpoint(*args, **kwargs))  # type: ignore[arg-type]
        return cuts[-1]

    monkeypatch.setattr(coordinated, "checkpoint", spy_checkpoint)
    assert snapshots.snapshot(manager.ports, job, reason="checkpoint" if suspend else "periodic", suspend=suspend)
    [cut] = cuts  # provisioning's one coordinated path (issue 16), not a loop of Saline's own
    assert cut.consistent and set(cut.snapshots) == set(job.vm_names)
    first_save = min(i for i, (what, _) in enumerate(calls) if what in ("save", "snapshot"))
    paused_first = {vm for what, vm in calls[:first_save] if what == "pause"}
    assert paused_first == set(job.vm_names), f"a save began before every VM was paused: {calls}"
    states = {manager.ports.vms.driver.state(vm, "n1") for vm in job.vm_names}
    if suspend:
        assert VMState.RUNNING not in states, "on OAR's checkpoint signal the VMs stop at the snapshot"
    else:
        assert states == {VMState.RUNNING}, "a periodic snapshot lets every VM run on, none left paused"
    after = journal.get(manager.ports.store, job.key)
    files = sorted(manager.ports.sites["a"].repository.label_dir(job.key, after.snapshot_label).iterdir())
    assert len(files) == 6, "memory, overlay copy and manifest of each of the two VMs"


def _nics(manager: Manager, vm: str, node: str) -> list[tuple[str | None, str | None]]:
    """(MAC, bridge) of every NIC of `vm` as libvirt on `node` has it."""
    dom = manager.ports.vms.driver.connection(node).lookupByName(vm)
    root = ET.fromstring(dom.XMLDesc(0))
    return [
        (nic.find("mac").get("address"), nic.find("source").get("bridge"))  # type: ignore[union-attr]
        for nic in root.findall("./devices/interface[@type='bridge']")
    ]


def _bridges(manager: Manager, node: str) -> set[str]:
    """The job networks active on `node` (libvirt networks named like provisioning's bridges)."""
    return {n.name() for n in manager.ports.vms.driver.connection(node).listAllNetworks() if n.isActive()}


def test_a_vjobs_vms_are_on_its_own_network_with_the_same_addresses_after_a_resume_elsewhere(
    shared_manager: Manager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each VM has a NIC whose MAC is the one of its subnetID/vmID on the vjob's bridge
    (provisioning.network, the multi-node jobs' network); another vjob gets another bridge; a
    kill takes the network off the node with the VMs; a resume on another node creates it
    there and the VMs come back with the same MACs."""
    manager = shared_manager
    monkeypatch.setattr(network, "_link_exists", lambda _name, _host=None: False)  # whatever bridges this host has
    first = journal.create(
        manager.ports.store,
        key="be0123456789",
        user="alice",
        image="empty",
        command=["true"],
        vm_count=2,
        vcpus=1,
        memory_mb=128,
        walltime="1:00:00",
        site="a",
    )
    other = journal.create(
        manager.ports.store,
        key="beabcdefabcd",
        user="bob",
        image="empty",
        command=["true"],
        vm_count=1,
        vcpus=1,
        memory_mb=128,
        walltime="1:00:00",
        site="a",
    )
    for job in (first, other):
        assert manager.ports.lease(job.key)
        journal.record(manager.ports.store, job.key, "test", oar_job_id="1")  # as after the submission
        deployment.deploy(manager.ports, journal.get(manager.ports.store, job.key), _running_again(job, "n1"))
    ids = identity.assign(
        manager.ports.store,
        site="a",
        job_key=first.key,
        vm_names=first.vm_names,
        mac_prefix="52:54:00",
        network="10.0.0.0/8",
    )
    (theirs,) = identity.assign(
        manager.ports.store,
        site="a",
        job_key=other.key,
        vm_names=other.vm_names,
        mac_prefix="52:54:00",
        network="10.0.0.0/8",
    )
    bridge = network.bridge_name(ids[0].subnet_id, network.SALINE_FAMILY)
    assert (
        theirs.subnet_id != ids[0].subnet_id and network.bridge_name(theirs.subnet_id, network.SALINE_FAMILY) != bridge
    )
    assert _bridges(manager, "n1") == {bridge, network.bridge_name(theirs.subnet_id, network.SALINE_FAMILY)}
    for vm, ident in zip(first.vm_names, ids, strict=True):
        assert _nics(manager, vm, "n1") == [(ident.mac, bridge)]
        assert ident.mac == f"52:54:00:{ident.subnet_id >> 8:02x}:{ident.subnet_id & 0xFF:02x}:{ident.vm_id:02x}"
        assert ident.ip == str(network.ip_address(ident.subnet_id, ident.vm_id))
    assert _nics(manager, other.vm_names[0], "n1") == [
        (theirs.mac, network.bridge_name(theirs.subnet_id, network.SALINE_FAMILY))
    ]

    job = journal.get(manager.ports.store, first.key)
    assert snapshots.snapshot(manager.ports, job, reason="periodic")
    with pytest.raises(CommandError, match="unreachable"):  # killed; then OAR is asked again
        manager._ended(journal.get(manager.ports.store, job.key), _killed_by_oar(job))
    assert _bridges(manager, "n1") == {network.bridge_name(theirs.subnet_id, network.SALINE_FAMILY)}, (
        "the killed vjob's network stayed"
    )
    assert bridge not in _bridges(manager, "n2")
    deployment.deploy(manager.ports, journal.get(manager.ports.store, job.key), _running_again(job, "n2"))
    resumed = journal.get(manager.ports.store, job.key)
    assert resumed.hosts == ("n2", "n2") and journal.events(manager.ports.store, job.key)[-1].kind == "resumed"
    assert _bridges(manager, "n2") == {bridge}
    for vm, ident in zip(first.vm_names, ids, strict=True):
        assert _nics(manager, vm, "n2") == [(ident.mac, bridge)]
    journal.record(manager.ports.store, other.key, "test", oar_job_id=None)  # no OAR job to delete (OAR is unreachable)
    manager.cancel(other.key)
    assert _bridges(manager, "n1") == set()


def test_a_resume_restores_every_vm_paused_before_any_runs(manager: Manager) -> None:
    """A three-VM vjob resumed from the repository comes back as one job: every VM is restored
    paused (provisioning.coordinated's restore) and none runs before the last one is back
    (Saline used to restore them one after another, each running at once while the next was
    still being restored: the first ones ran on, and sent to peers that were not there yet)."""
    job = _running(manager, vms=3)
    assert snapshots.snapshot(manager.ports, job, reason="periodic")
    job = journal.get(manager.ports.store, job.key)
    with pytest.raises(CommandError, match="unreachable"):
        manager._ended(job, _killed_by_oar(job))
    driver = manager.ports.vms.driver
    calls: list[tuple[str, str, bool]] = []
    real_restore, real_unpause = driver.restore_snapshot, driver.unpause

    def restore_snapshot(vm: str, node: str, **kwargs: object) -> None:
        real_restore(vm, node, **kwargs)  # type: ignore[arg-type]
        state = driver.connection(node).lookupByName(vm).state()[0]
        calls.append(("restored", vm, state == libvirt.VIR_DOMAIN_PAUSED))

    def unpause(vm: str, node: str) -> None:
        calls.append(("unpause", vm, False))
        real_unpause(vm, node)

    driver.restore_snapshot = restore_snapshot  # type: ignore[method-assign]
    driver.unpause = unpause  # type: ignore[method-assign]
    deployment.deploy(manager.ports, journal.get(manager.ports.store, job.key), _running_again(job, "n1"))
    restored = [(vm, paused) for what, vm, paused in calls if what == "restored"]
    assert sorted(vm for vm, _ in restored) == job.vm_names
    assert all(paused for _, paused in restored), f"a VM ran as soon as it was restored: {calls}"
    first_run = min((i for i, (what, _, _) in enumerate(calls) if what == "unpause"), default=len(calls))
    assert first_run == 3, f"a VM was let run before every VM was back: {calls}"
    assert {vm for what, vm, _ in calls if what == "unpause"} == set(job.vm_names)
    after = journal.get(manager.ports.store, job.key)
    assert after.phase == "running" and after.hosts == ("n1",) * 3
    assert {driver.state(vm, "n1") for vm in job.vm_names} == {VMState.RUNNING}
    states = [driver.connection("n1").lookupByName(vm).state()[0] for vm in job.vm_names]
    assert states == [libvirt.VIR_DOMAIN_RUNNING] * 3, "a VM was left paused"
    resumed = journal.events(manager.ports.store, job.key)[-1]
    assert resumed.kind == "resumed" and resumed.detail["restore_to_running_s"] >= 0


def test_a_real_image_vjob_gets_job_disks_on_its_network_and_keeps_them_across_a_resume(
    manager: Manager, tmp_path: Path
) -> None:
    """An image with its own kernel (`vjob image build`) runs COMMAND through the guest agent:
    each VM has a job disk whose job.json gives it its address on the vjob's network, the names
    of all VMs and the vjob's ssh key; the first VM runs COMMAND as the user. The job disk is
    part of every snapshot and is back under the VM at the resume; the vjob is done when the
    first VM powers off (the others only serve it). Guests talking over it: bench/saline_network.py."""
    _real_image(manager, tmp_path)
    job = journal.create(
        manager.ports.store,
        key="be0123456789",
        user="nobody",
        image="real",
        command=["ssh", "vm1", "true"],
        vm_count=2,
        vcpus=1,
        memory_mb=128,
        walltime="1:00:00",
        site="a",
    )
    assert manager.ports.lease(job.key)
    journal.record(manager.ports.store, job.key, "test", oar_job_id="1")
    deployment.deploy(manager.ports, journal.get(manager.ports.store, job.key), _running_again(job, "n1"))
    driver = manager.ports.vms.driver
    ids = identity.assign(
        manager.ports.store,
        site="a",
        job_key=job.key,
        vm_names=job.vm_names,
        mac_prefix="52:54:00",
        network="10.0.0.0/8",
    )
    described = []
    for rank, vm in enumerate(job.vm_names):
        xml = ET.fromstring(driver.connection("n1").lookupByName(vm).XMLDesc(0))
        assert xml.findtext("./os/kernel") and "init=/sbin/vjob-init" in (xml.findtext("./os/cmdline") or "")
        assert xml.find("./devices/disk/target[@dev='vdb']") is not None, "no job disk"
        raw = tmp_path / f"{vm}.raw"
        subprocess.run(
            ["qemu-img", "convert", "-q", "-U", "-O", "raw", str(driver.job_disk_path(vm, "n1")), str(raw)],
            check=True,
            timeout=60,
        )
        debugfs = shutil.which("debugfs") or "/usr/sbin/debugfs"
        shown = subprocess.run(
            [debugfs, "-R", "cat /.vjob/job.json", str(raw)], capture_output=True, check=True, timeout=30
        )
        described.append(json.loads(shown.stdout))
        for inode in ("/.vjob", "/.vjob/script", "/work"):  # built by root as if by the user, who runs it
            st = subprocess.run([debugfs, "-R", f"stat {inode}", str(raw)], capture_output=True, check=True, timeout=30)
            assert re.search(rb"User:\s+65534\s+Group:\s+65534", st.stdout), (inode, st.stdout[:200])
        net = described[-1]["network"]
        assert net["mac"] == ids[rank].mac and net["ip"] == ids[rank].ip and net["leader"] is (rank == 0)
        assert net["peers"] == [[i.ip, f"vm{r}"] for r, i in enumerate(ids)]
        assert described[-1]["argv"] == ["script", "ssh", "vm1", "true"] and described[-1]["user"] == "nobody"
    assert described[0]["network"]["ssh_public"] == described[1]["network"]["ssh_public"] != ""

    job = journal.get(manager.ports.store, job.key)
    assert snapshots.snapshot(manager.ports, job, reason="periodic")
    label = journal.get(manager.ports.store, job.key).snapshot_label
    files = {p.name for p in manager.ports.sites["a"].repository.label_dir(job.key, label).iterdir()}
    assert {f"{vm}@{label}.job.qcow2" for vm in job.vm_names} <= files, files
    with pytest.raises(CommandError, match="unreachable"):
        manager._ended(journal.get(manager.ports.store, job.key), _killed_by_oar(job))
    assert not driver.job_disk_path(job.vm_names[0], "n1").exists(), "the kill left the job disk"
    deployment.deploy(manager.ports, journal.get(manager.ports.store, job.key), _running_again(job, "n1"))
    assert journal.events(manager.ports.store, job.key)[-1].kind == "resumed"
    for vm in job.vm_names:
        assert driver.job_disk_path(vm, "n1").is_file() and driver.state(vm, "n1") is VMState.RUNNING
    job = journal.get(manager.ports.store, job.key)
    assert not deployment.finished(manager.ports, job)
    driver.console_log(job.vm_names[0], "n1").touch()  # a real guest's console (the test driver writes none)
    driver.stop(job.vm_names[0], "n1")  # the first VM powered off: COMMAND ended; vm1 still serves
    assert deployment.finished(manager.ports, job)


def _real_image(manager: Manager, tmp_path: Path) -> None:
    make_real_image(manager.ports.store, tmp_path)


def _debugfs(raw: Path, request: str) -> bytes:
    debugfs = shutil.which("debugfs") or "/usr/sbin/debugfs"
    return subprocess.run([debugfs, "-R", request, str(raw)], capture_output=True, check=True, timeout=30).stdout


def test_the_submitters_directory_reaches_the_first_vms_job_disk_through_the_socket(
    manager: Manager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`vjob besteffort submit` builds the disk of its working directory itself and passes it
    open over the socket (SCM_RIGHTS): `./simulate` is on the first VM's /work, owned by the
    user; a symlink planted to a root-only file stays a symlink (its target's bytes are on no
    disk); the manager keeps its own checked copy until the vjob is cleaned."""
    _real_image(manager, tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    (home / "simulate").write_text("#!/bin/sh\necho simulated\n")
    (home / "simulate").chmod(0o755)
    secret = tmp_path / "root-only"
    secret.write_text("TOPSECRET-4f1d")
    secret.chmod(0o600)
    (home / "secret").symlink_to(secret)
    monkeypatch.chdir(home)
    args = argparse.Namespace(socket=str(tmp_path / "sock" / "saline.sock"), stage_limit_mb=16)
    request = {
        "op": "submit",
        "image": "real",
        "command": ["./simulate", "--steps", "1e9"],
        "vms": 2,
        "vcpus": 1,
        "memory": 128,
        "walltime": "4:00:00",
        "site": None,
        "user": "nobody",
    }
    with Server(manager, Path(args.socket)), pytest.raises(RemoteError, match="recorded"):  # OAR is down
        cli._submit_with_workdir(args, request)
    (job,) = journal.all_jobs(manager.ports.store)
    kept = manager.ports.vms.work_path(job.key)
    # the submitter's, owner-only (qemu-img runs on it as them), where only root's descriptors reach it
    assert kept.is_file() and kept.stat().st_uid == NOBODY.pw_uid and stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert kept.parent.stat().st_uid == 0 and stat.S_IMODE(kept.parent.stat().st_mode) == 0o700
    journal.record(manager.ports.store, job.key, "test", oar_job_id="1")
    deployment.deploy(manager.ports, journal.get(manager.ports.store, job.key), _running_again(job, "n1"))
    driver = manager.ports.vms.driver
    raws = []
    for vm in job.vm_names:
        raws.append(tmp_path / f"{vm}.raw")
        subprocess.run(
            ["qemu-img", "convert", "-q", "-U", "-O", "raw", str(driver.job_disk_path(vm, "n1")), str(raws[-1])],
            check=True,
            timeout=60,
        )
    assert _debugfs(raws[0], "cat /work/simulate") == b"#!/bin/sh\necho simulated\n"
    assert re.search(rb"User:\s+65534\s+Group:\s+65534", _debugfs(raws[0], "stat /work/simulate"))
    link = _debugfs(raws[0], "stat /work/secret")
    assert (
        b"Type: symlink" in link and _debugfs(raws[0], "cat /work/secret") == str(secret).encode()
    )  # the target's name
    assert b"TOPSECRET" not in driver.job_disk_path(job.vm_names[0], "n1").read_bytes()  # qcow2: data uncompressed
    assert b"simulate" not in _debugfs(raws[1], "ls /work"), "only the first VM gets the directory"
    assert json.loads(_debugfs(raws[0], "cat /.vjob/job.json"))["argv"] == ["script", "./simulate", "--steps", "1e9"]
    cleanup.clean(manager.ports, journal.get(manager.ports.store, job.key))
    assert not kept.exists()


def test_an_oversized_directory_or_a_crafted_disk_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over the stage limit: refused on the user's side before anything is sent; and the
    manager's own checks on what arrives: a pipe, a disk over the limit, a qcow2 with a backing
    file (it would make QEMU read a host file) are refused, and nothing is kept."""
    big = tmp_path / "big"
    big.mkdir()
    (big / "data").write_bytes(b"x" * (2 << 20))
    monkeypatch.chdir(big)
    args = argparse.Namespace(socket=str(tmp_path / "nobody-listens.sock"), stage_limit_mb=1)
    with pytest.raises(InputError, match=r"more than 1 MiB to stage.*stage_limit_mb"):
        cli._submit_with_workdir(args, {"op": "submit", "command": ["./run"]})
    dest = tmp_path / "in.work.qcow2"
    read_end, write_end = os.pipe()
    try:
        with pytest.raises(InputError, match="not a regular file"):
            workdir.receive(read_end, dest, limit_bytes=1 << 20, uid=NOBODY.pw_uid, gid=NOBODY.pw_gid)
    finally:
        os.close(read_end)
        os.close(write_end)
    huge = tmp_path / "huge.qcow2"
    huge.write_bytes(b"\0" * (workdir.EXT4_MARGIN + (2 << 20)))
    backed = tmp_path / "backed.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", "/etc/shadow", str(backed), "1M"],
        check=True,
        timeout=30,
    )
    for path, why in ((huge, "over 65 MiB"), (backed, "no backing file")):
        fd = os.open(path, os.O_RDONLY)
        try:
            with pytest.raises(InputError, match=why):
                workdir.receive(fd, dest, limit_bytes=1 << 20, uid=NOBODY.pw_uid, gid=NOBODY.pw_gid)
        finally:
            os.close(fd)
        assert not dest.exists()


def _agent_exits(disk: Path, code: bytes, scratch: Path) -> None:
    """What the guest agent does when COMMAND ends (the test driver runs no guest): `/.vjob/exit`
    written on the job disk, here with debugfs on a raw copy put back as the qcow2."""
    raw, value, script = scratch / "exit.raw", scratch / "exit.value", scratch / "exit.debugfs"
    subprocess.run(["qemu-img", "convert", "-q", "-U", "-O", "raw", str(disk), str(raw)], check=True, timeout=60)
    value.write_bytes(code)
    script.write_text(f"cd /.vjob\nwrite {value} exit\n")
    debugfs = shutil.which("debugfs") or "/usr/sbin/debugfs"
    subprocess.run([debugfs, "-w", "-f", str(script), str(raw)], capture_output=True, check=True, timeout=30)
    subprocess.run(["qemu-img", "convert", "-q", "-O", "qcow2", str(raw), str(disk)], check=True, timeout=60)


def test_commands_output_and_exit_status_reach_its_user_once_without_what_a_resume_replays(
    manager: Manager, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first VM's output logs (written here as virtlogd would: the test driver runs no
    guest) are kept by the manager up to each safe snapshot's cut; a kill loses what came
    after it, and the resumed VM prints that again, so it appears once. At the end the rest is
    kept and the exit status is read off the job disk: `show` says it, `output` streams the
    output through the socket to the vjob's owner only."""
    _real_image(manager, tmp_path)
    job = journal.create(
        manager.ports.store,
        key="be0123456789",
        user="nobody",
        image="real",
        command=["./simulate"],
        vm_count=1,
        vcpus=1,
        memory_mb=128,
        walltime="1:00:00",
        site="a",
    )
    assert manager.ports.lease(job.key)
    journal.record(manager.ports.store, job.key, "test", oar_job_id="1")
    deployment.deploy(manager.ports, journal.get(manager.ports.store, job.key), _running_again(job, "n1"))
    vm = job.vm_names[0]
    out, err = manager.ports.vms.output_logs(vm, "n1")
    out.write_bytes(b"step 1\n")
    err.write_bytes(b"warning 1\n")
    cut = manager.ports.vms.checkpoint

    def printing_on(*args: object, **kwargs: object) -> object:
        taken = cut(*args, **kwargs)
        with out.open("ab") as fh:  # the VM runs on after the cut, while its files are gathered
            fh.write(b"step 2\n")  # not in this snapshot: lost with the kill, printed again after the resume
        return taken

    monkeypatch.setattr(manager.ports.vms, "checkpoint", printing_on)
    assert snapshots.snapshot(manager.ports, journal.get(manager.ports.store, job.key), reason="periodic")
    monkeypatch.setattr(manager.ports.vms, "checkpoint", cut)
    assert (manager.ports.output_dir / f"{job.key}.stdout").read_bytes() == b"step 1\n"
    with pytest.raises(CommandError, match="unreachable"):
        manager._ended(journal.get(manager.ports.store, job.key), _killed_by_oar(job))
    assert not out.exists(), "the kill deletes the VM and its logs"
    deployment.deploy(manager.ports, journal.get(manager.ports.store, job.key), _running_again(job, "n1"))
    out.write_bytes(b"step 2\nstep 3\n")
    err.write_bytes(b"")
    _agent_exits(manager.ports.vms.driver.job_disk_path(vm, "n1"), b"3\n", tmp_path)
    manager.ports.vms.driver.stop(vm, "n1")
    deployment.complete(manager.ports, journal.get(manager.ports.store, job.key))
    finished = journal.events(manager.ports.store, job.key)[-1]
    assert finished.kind == "finished" and finished.detail["exit_code"] == 3
    assert finished.detail["output_bytes"] == [len(b"step 1\nstep 2\nstep 3\n"), len(b"warning 1\n")]
    kept = manager.ports.output_dir / f"{job.key}.stdout"
    assert kept.stat().st_uid == 0 and stat.S_IMODE(kept.stat().st_mode) == 0o600

    sock = tmp_path / "sock" / "saline.sock"
    args = argparse.Namespace(socket=str(sock), key=job.key, stderr=False, both=False)
    with Server(manager, sock):
        capsys.readouterr()
        assert cli.output_cmd(args) == 0
        assert capsys.readouterr().out == "step 1\nstep 2\nstep 3\n"
        assert cli.output_cmd(argparse.Namespace(socket=str(sock), key=job.key, stderr=True, both=False)) == 0
        assert capsys.readouterr().out == "warning 1\n"
        assert client.call(sock, {"op": "show", "key": job.key})["exit_code"] == 3
    with pytest.raises(server.Refused, match="another user"):
        server.Handler(manager)(protocol.Output(op="output", key=job.key), 1)  # uid 1 (daemon) is not nobody


def test_a_crafted_exit_file_or_an_output_over_the_limit_is_not_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exit file is on a disk the user could have written: anything but a number in
    0..255 is no exit status. An output over the limit is cut there and said; a commit after a
    manager died between its append and its journal entry cuts the copy back first."""
    staged = tmp_path / "staged"
    staged.mkdir()
    built = tmp_path / "built.qcow2"
    job_disk.build(
        staged,
        job_disk.JobDescription(
            script=b"#!/bin/sh\n", args=[], env={}, uid=0, gid=0, user="root", home="/root", cwd="/work"
        ),
        built,
        limit_bytes=1 << 20,
        free_bytes=0,
    )
    assert job_disk.read_exit(built, tmp_path) is None  # the job never ended
    cases = ((b"0\n", 0), (b"255\n", 255), (b"256\n", None), (b"9" * 40, None), (b"-1\n", None), ("³\n".encode(), None))
    for content, expected in cases:
        disk = tmp_path / "job.qcow2"
        shutil.copyfile(built, disk)
        _agent_exits(disk, content, tmp_path)
        assert job_disk.read_exit(disk, tmp_path) == expected, content
    log = tmp_path / "vm.stdout.log"
    log.write_bytes(b"abcdefgh")
    dest = tmp_path / "kept"
    assert output.commit(log, 0, 4, dest, 0) == (4, False)
    assert output.commit(log, 4, None, dest, 4) == (8, False)
    assert output.commit(log, 4, None, dest, 4) == (8, False)  # done again from the journal's 4: not doubled
    assert dest.read_bytes() == b"abcdefgh"
    monkeypatch.setattr(output, "LIMIT_BYTES", 6)
    assert output.commit(log, 4, None, dest, 4) == (6, True) and dest.read_bytes() == b"abcdef"
    assert output.commit(tmp_path / "missing.log", 0, None, dest, 6) == (6, False)
