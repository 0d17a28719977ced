"""Coordinated checkpoint on libvirt's test driver: all paused before any save, rollback on failure.

The real-QEMU proof (two guests whose counters continue after one cut) is in
test_multinode_realvm.py; here the logic runs fast on test-driver nodes.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import libvirt
import pytest

from pilot.multinode import JobVMs
from plugins.pbs import hook_vm
from preemption.executor import Executor
from preemption.planner.plan import Plan, PlanAction
from provisioning import coordinated, integrity, transfer
from provisioning.coordinated import Member
from provisioning.driver import Driver, DriverError, SnapshotError, VMSpec
from provisioning.performer import DriverPerformer
from provisioning.safe_dirs import UnsafePathError
from vjob import config as vconfig
from vjob.config import ProvisioningConfig
from vjob.model import Action, VMState
from vjob.store.db import Store

pytestmark = pytest.mark.libvirt

MEMBERS = [Member("job7-0", "n1"), Member("job7-1", "n2")]


@pytest.fixture
def driver(tmp_path: Path, test_nodes: dict[str, str]) -> Iterator[Driver]:
    image = tmp_path / "images" / "base.qcow2"
    image.parent.mkdir()
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "64M"], check=True, timeout=30)
    cfg = ProvisioningConfig(nodes=test_nodes, snapshot_dir=str(tmp_path / "snap" / "{node}"), operation_timeout_s=30)
    with Driver(cfg, data_dir=tmp_path / "data") as drv:
        for m in MEMBERS:
            drv.define(VMSpec(m.vm, image), m.node)
            drv.boot(m.vm, m.node)
        yield drv


def _paused(driver: Driver, m: Member) -> bool:
    dom = driver.connection(m.node).lookupByName(m.vm)
    return dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED


def _not_running_unpaused(driver: Driver, m: Member) -> bool:
    """One read of the domain's state: paused, or already saved by a parallel save, are both fine.

    Reading "active?" and then "paused?" in two calls races with the other member's save, which
    may end in between (the domain is then shut off, neither running nor paused).
    """
    try:
        state = driver.connection(m.node).lookupByName(m.vm).state()[0]
    except libvirt.libvirtError:
        return True  # saved and undefined meanwhile
    return state != libvirt.VIR_DOMAIN_RUNNING


def _watch_saves(driver: Driver) -> list[bool]:
    """When any save begins, whether every VM of the job is paused or saved (none may still run)."""
    seen_paused: list[bool] = []
    real_save = driver.save

    def save_watching(vm: str, node: str, **kw: object) -> object:
        seen_paused.extend(_not_running_unpaused(driver, m) for m in MEMBERS)
        return real_save(vm, node, **kw)  # type: ignore[arg-type]

    driver.save = save_watching  # type: ignore[method-assign]
    return seen_paused


def test_every_vm_is_paused_before_any_save_and_all_come_back_running(driver: Driver) -> None:
    seen_paused = _watch_saves(driver)
    cut = coordinated.checkpoint(driver, MEMBERS)
    assert cut.consistent and all(seen_paused) and seen_paused
    assert max(cut.paused_at.values()) <= min(cut.save_started_at.values())
    assert set(cut.snapshots) == {"job7-0", "job7-1"}
    assert all(driver.state(m.vm, m.node) == VMState.SAVED for m in MEMBERS)
    assert coordinated.checkpoint(driver, MEMBERS).snapshots.keys() == cut.snapshots.keys()  # idempotent

    coordinated.restore(driver, MEMBERS)
    for m in MEMBERS:
        assert driver.state(m.vm, m.node) == VMState.RUNNING
        assert not _paused(driver, m)
        assert not driver.state_path(m.vm, m.node).exists()  # a stale state would corrupt the disk later


def test_a_failed_save_abandons_the_cut_and_every_vm_runs_again(driver: Driver, tmp_path: Path) -> None:
    (tmp_path / "snap" / "n2").chmod(0o777)  # n2's snapshot dir is unsafe: its save is refused
    with pytest.raises(UnsafePathError):
        coordinated.checkpoint(driver, MEMBERS)
    for m in MEMBERS:
        assert driver.state(m.vm, m.node) == VMState.RUNNING
        assert not _paused(driver, m)
    assert not driver.state_path("job7-0", "n1").exists()


def test_a_vm_listed_twice_is_refused(driver: Driver) -> None:
    with pytest.raises(DriverError, match="listed twice"):
        coordinated.checkpoint(driver, [MEMBERS[0], MEMBERS[0]])
    assert driver.state("job7-0", "n1") == VMState.RUNNING


def test_a_failed_restore_saves_the_others_again_so_the_cut_survives(driver: Driver) -> None:
    coordinated.checkpoint(driver, MEMBERS)
    state = driver.state_path("job7-1", "n2")
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))  # job7-1's state no longer matches its manifest
    with pytest.raises(SnapshotError, match="is corrupt"):
        coordinated.restore(driver, MEMBERS)
    # job7-0 had come back (paused): it is saved again, so both VMs are at one cut, none runs
    assert driver.state("job7-0", "n1") == VMState.SAVED
    assert driver.state("job7-1", "n2") == VMState.SAVED
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))
    coordinated.restore(driver, MEMBERS)
    assert all(driver.state(m.vm, m.node) == VMState.RUNNING for m in MEMBERS)


def test_a_retried_restore_finds_the_vms_an_earlier_attempt_already_moved(driver: Driver) -> None:
    coordinated.checkpoint(driver, MEMBERS)
    moved = [Member("job7-0", "n2", from_node="n1"), Member("job7-1", "n1", from_node="n2")]
    state = driver.state_path("job7-1", "n2")
    good = state.read_bytes()
    state.write_bytes(good[:-1] + bytes([good[-1] ^ 0xFF]))
    with pytest.raises(SnapshotError):
        coordinated.restore(driver, moved)
    assert driver.state("job7-0", "n2") == VMState.SAVED  # moved, then saved again on n2
    state.write_bytes(good)
    coordinated.restore(driver, moved)  # the same request again
    assert driver.state("job7-0", "n2") == VMState.RUNNING and driver.state("job7-1", "n1") == VMState.RUNNING


def test_the_executor_suspends_a_multi_vm_job_in_one_cut_and_resumes_it_together(driver: Driver, store: Store) -> None:
    """preemption.executor hands the suspends (resumes) of one vjob to the performer's
    coordinated path: every VM paused before any save; then both restored on swapped nodes."""
    seen_paused = _watch_saves(driver)
    performer = DriverPerformer(driver, lambda vm: pytest.fail(f"{vm}: nothing is booted in this test"))
    suspend = Plan(
        pools=(tuple(PlanAction(Action.SUSPEND, m.vm, "job7", m.node) for m in MEMBERS),), placement={}, cost=0
    )
    report = Executor(performer, store, pipeline_interval_s=0.5).execute(suspend, reason="multi-VM cut")
    assert report.state == "done", report.summary()
    assert seen_paused and all(seen_paused)  # the second save began with the first VM paused too
    assert all(driver.state(m.vm, m.node) == VMState.SAVED for m in MEMBERS)
    swap = {"n1": "n2", "n2": "n1"}
    resume = Plan(
        pools=(tuple(PlanAction(Action.RESUME, m.vm, "job7", m.node, swap[m.node]) for m in MEMBERS),),
        placement={},
        cost=0,
    )
    report = Executor(performer, store, pipeline_interval_s=0.5).execute(resume, reason="multi-VM resume")
    assert report.state == "done", report.summary()
    assert all(driver.state(m.vm, swap[m.node]) == VMState.RUNNING for m in MEMBERS)
    assert all(driver.state(m.vm, m.node) is None for m in MEMBERS)


def test_the_pbs_hook_saves_and_restores_a_multi_node_job_in_one_cut(
    tmp_path: Path, test_nodes: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`hook_vm save VM --node N --also VM@NODE`: every VM of the job through
    provisioning.coordinated (one consistent cut), with the store down: one pending record per VM."""
    image = tmp_path / "base.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "64M"], check=True, timeout=30)
    conf = tmp_path / "vjob.toml"
    conf.write_text(
        f'data_dir = "{tmp_path / "data"}"\n[database]\nurl = "postgresql://vjob@127.0.0.1:9/vjob"\n'
        f'connect_timeout_s = 2\n[provisioning]\nsnapshot_dir = "{tmp_path / "snap" / "{node}"}"\n'
        f'[provisioning.nodes]\nn1 = "{test_nodes["n1"]}"\nn2 = "{test_nodes["n2"]}"\n'
    )
    vms = {"vjob-pbs-77-0": "n1", "vjob-pbs-77-1": "n2"}
    cfg = vconfig.load(str(conf))
    drv = Driver(cfg.provisioning, data_dir=cfg.data_path)  # test-driver domains live in one connection
    for vm, node in vms.items():
        drv.define(VMSpec(vm, image), node)
        drv.boot(vm, node)
    monkeypatch.setattr(hook_vm, "Driver", lambda *_a, **_k: contextlib.nullcontext(drv))
    cuts: list[coordinated.Cut] = []
    real_checkpoint = coordinated.checkpoint

    def watched(*args: object, **kw: object) -> coordinated.Cut:
        cuts.append(real_checkpoint(*args, **kw))  # type: ignore[arg-type]
        return cuts[-1]

    monkeypatch.setattr(coordinated, "checkpoint", watched)
    assert (
        hook_vm.main(["--config", str(conf), "save", "vjob-pbs-77-0", "--node", "n1", "--also", "vjob-pbs-77-1@n2"])
        == 0
    )
    assert len(cuts) == 1 and cuts[0].consistent and set(cuts[0].snapshots) == set(vms)
    assert all(drv.state(vm, node) == VMState.SAVED for vm, node in vms.items())
    assert len(list(hook_vm.pending_dir(cfg).glob("*.json"))) == 2
    assert (
        hook_vm.main(["--config", str(conf), "restore", "vjob-pbs-77-0", "--node", "n1", "--also", "vjob-pbs-77-1@n2"])
        == 0
    )
    assert all(drv.state(vm, node) == VMState.RUNNING for vm, node in vms.items())
    assert (
        hook_vm.main(["--config", str(conf), "save", "vjob-pbs-77-0", "--node", "n1", "--also", "vjob-pbs-77-0@n2"])
        == 2
    )  # a VM named twice: refused, nothing done
    drv.close()


def test_a_pilot_killed_in_the_middle_of_a_cut_leaves_a_job_its_next_pilot_runs_on(driver: Driver) -> None:
    """SIGKILL after job7-1 was saved, job7-0 still paused (the cut's moment for both): the next
    pilot's first look restores the saved VM paused and lets both run; nothing is booted anew."""
    job = JobVMs(driver, "job7", ["n1", "n2"], 0x77, lambda *_a: pytest.fail("a saved job must not boot"))
    assert driver.pause("job7-0", "n1") and driver.pause("job7-1", "n2")
    driver.save("job7-1", "n2")
    assert driver.state("job7-1", "n2") == VMState.SAVED and _paused(driver, Member("job7-0", "n1"))
    assert job.active()
    assert all(driver.state(m.vm, m.node) == VMState.RUNNING and not _paused(driver, m) for m in MEMBERS)
    cpu = job.cpu()  # the pilot's CPU sample covers every VM of the job
    assert cpu is not None and cpu[1] == 2
    # killed after the whole cut, before its state file said so: the VMs are restored, not booted
    coordinated.checkpoint(driver, MEMBERS)
    JobVMs(driver, "job7", ["n1", "n2"], 0x77, lambda *_a: pytest.fail("a saved job must not boot")).boot()
    assert all(driver.state(m.vm, m.node) == VMState.RUNNING for m in MEMBERS)


def test_a_corrupted_overlay_copy_is_caught_by_the_manifest_and_the_source_kept(
    tmp_path: Path, test_nodes: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The overlay and job disk are hashed into the manifest at save time: an overlay whose copy
    arrives altered (the state's copy intact) is refused on the destination, removed there, and
    the source's snapshot still verifies and restores."""
    image = tmp_path / "base.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "64M"], check=True, timeout=30)
    cfg = ProvisioningConfig(
        nodes=test_nodes,
        vm_dir=str(tmp_path / "vms" / "{node}"),
        snapshot_dir=str(tmp_path / "snap" / "{node}"),
        operation_timeout_s=30,
    )
    with Driver(cfg, data_dir=tmp_path / "data") as drv:
        drv.define(VMSpec("job8-0", image), "n1")
        drv.boot("job8-0", "n1")
        drv.save("job8-0", "n1")
        overlay = drv.overlay_path("job8-0", "n1")
        disks = json.loads(integrity.manifest_path(drv.state_path("job8-0", "n1")).read_text())["disks"]
        assert disks["overlay"]["sha256"] == transfer.sha256_file(overlay)  # recorded at save time
        real_copy = transfer.copy

        def altering_copy(src: transfer.Endpoint, dst: transfer.Endpoint, **kw: Any) -> None:
            real_copy(src, dst, **kw)
            if dst.path.suffix == ".qcow2":  # the overlay's copy only: the state arrives intact
                data = bytearray(dst.path.read_bytes())
                data[len(data) // 2] ^= 0xFF
                dst.path.write_bytes(bytes(data))

        monkeypatch.setattr(transfer, "copy", altering_copy)
        with pytest.raises(
            SnapshotError,
            match=r"does not match the snapshot recorded at save time \(.*snapshot "
            r"\S+/n2/job8-0\.qcow2 is corrupt.*the snapshot on n1 is kept",
        ):
            drv.restore("job8-0", "n2", from_node="n1")
        assert not drv.overlay_path("job8-0", "n2").exists() and not drv.state_path("job8-0", "n2").exists()
        assert drv.state("job8-0", "n2") is None and drv.verify("job8-0", "n1")
        assert transfer.sha256_file(overlay) == disks["overlay"]["sha256"]  # the source's disk is untouched
        # (an unaltered copy restores: test_multinode_transfer.py, on real QEMU; the test driver
        # cannot restore a state under another node's paths)
