"""Coordinated checkpoint on libvirt's test driver: all paused before any save, rollback on failure.

The real-QEMU proof (two guests whose counters continue after one cut) is in
test_multinode_realvm.py; here the logic runs fast on test-driver nodes.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import libvirt
import pytest

from provisioning import coordinated
from provisioning.coordinated import Member
from provisioning.driver import Driver, DriverError, SnapshotError, VMSpec
from provisioning.safe_dirs import UnsafePathError
from vjob.config import ProvisioningConfig
from vjob.model import VMState

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


def test_every_vm_is_paused_before_any_save_and_all_come_back_running(driver: Driver) -> None:
    seen_paused: list[bool] = []
    real_save = driver.save

    def save_watching(vm: str, node: str, **kw: object) -> object:
        # when any save begins, every VM of the job that is not yet saved must be paused
        seen_paused.extend(_paused(driver, m) for m in MEMBERS if driver.state(m.vm, m.node) == VMState.RUNNING)
        return real_save(vm, node, **kw)  # type: ignore[arg-type]

    driver.save = save_watching  # type: ignore[method-assign]
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
