"""The VM driver on libvirt's test driver: life cycle, idempotence, snapshot safety, errors.

Each test has its own node XML files (no shared state between tests). What the test driver
cannot do (live migration, real memory states) is covered by test_provisioning_realvm.py.
"""

from __future__ import annotations

import stat
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import libvirt
import pytest
from sqlalchemy import select

from provisioning.driver import Driver, DriverError, SnapshotError, VMSpec
from provisioning.performer import DriverPerformer
from provisioning.safe_dirs import UnsafePathError
from provisioning.transfer import sha256_file
from vjob.config import ProvisioningConfig
from vjob.errors import InputError
from vjob.model import Job, VMState
from vjob.store import jobs
from vjob.store.db import Store
from vjob.store.schema import SnapshotRecord, VMRecord

pytestmark = pytest.mark.libvirt


@pytest.fixture
def base_image(tmp_path: Path) -> Path:
    path = tmp_path / "images" / "base.qcow2"
    path.parent.mkdir()
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(path), "64M"], check=True, timeout=30)
    return path


def make_driver(tmp_path: Path, nodes: dict[str, str], store: Store | None = None) -> Driver:
    cfg = ProvisioningConfig(nodes=nodes, snapshot_dir=str(tmp_path / "snap" / "{node}"), operation_timeout_s=30)
    return Driver(cfg, data_dir=tmp_path / "data", store=store)


@pytest.fixture
def driver(tmp_path: Path, test_nodes: dict[str, str]) -> Driver:
    with make_driver(tmp_path, test_nodes) as drv:
        yield drv


def test_define_makes_an_overlay_and_never_writes_the_image(driver: Driver, base_image: Path) -> None:
    before = sha256_file(base_image)
    spec = VMSpec("vm1", base_image)
    driver.define(spec, "n1")
    driver.define(spec, "n1")  # idempotent: same overlay, one domain
    overlay = driver.overlay_path("vm1", "n1")
    info = subprocess.run(["qemu-img", "info", "-U", str(overlay)], capture_output=True, text=True, timeout=30)
    assert f"backing file: {base_image}" in info.stdout
    assert stat.S_IMODE(overlay.stat().st_mode) == 0o600
    assert [v.name for v in driver.list_vms("n1")] == ["vm1"]
    driver.boot("vm1", "n1")
    driver.boot("vm1", "n1")
    assert driver.state("vm1", "n1") == VMState.RUNNING
    driver.stop("vm1", "n1")
    driver.stop("vm1", "n1")
    assert driver.state("vm1", "n1") in (VMState.STOPPED, VMState.DEFINED)
    assert sha256_file(base_image) == before


def test_save_and_restore_on_the_same_node_records_the_snapshot(
    tmp_path: Path, test_nodes: dict[str, str], base_image: Path, store: Store
) -> None:
    job_id = jobs.track(store, Job(id="42", user="alice"))
    with make_driver(tmp_path, test_nodes, store) as drv:
        drv.define(VMSpec("vm1", base_image), "n1", job_id=job_id)
        drv.boot("vm1", "n1")
        snap = drv.save("vm1", "n1")
        assert drv.save("vm1", "n1") == snap  # a repeated save returns what is there
        assert drv.state("vm1", "n1") == VMState.SAVED
        assert stat.S_IMODE(snap.memory_path.stat().st_mode) == 0o600
        assert stat.S_IMODE(snap.memory_path.parent.stat().st_mode) == 0o700
        with store.session() as s:
            rec = s.scalar(select(SnapshotRecord).where(SnapshotRecord.vm_name == "vm1"))
            assert rec is not None
            assert (rec.job_id, rec.size_bytes, rec.sha256, rec.location, rec.kind) == (
                job_id,
                snap.memory_path.stat().st_size,
                sha256_file(snap.memory_path),
                "n1",
                "memory",
            )
            assert s.scalar(select(VMRecord.state).where(VMRecord.name == "vm1")) == "saved"
        drv.restore("vm1", "n1")
        drv.restore("vm1", "n1")  # repeated: already running, nothing to do
        assert drv.state("vm1", "n1") == VMState.RUNNING
        assert not snap.memory_path.exists()  # a stale memory state would corrupt a later resume
        with store.session() as s:
            assert s.scalar(select(SnapshotRecord).where(SnapshotRecord.vm_name == "vm1")) is None
            assert s.scalar(select(VMRecord.state).where(VMRecord.name == "vm1")) == "running"


def test_resume_on_another_node_moves_state_and_definition(driver: Driver, base_image: Path) -> None:
    driver.define(VMSpec("vm1", base_image), "n1")
    driver.boot("vm1", "n1")
    driver.save("vm1", "n1")
    driver.restore("vm1", "n2", from_node="n1")
    assert driver.state("vm1", "n2") == VMState.RUNNING
    assert driver.state("vm1", "n1") is None
    assert driver.list_vms("n1") == []
    assert [(v.name, v.persistent) for v in driver.list_vms("n2")] == [("vm1", True)]
    assert not driver.state_path("vm1", "n1").exists()
    driver.restore("vm1", "n2", from_node="n1")  # repeated after success: nothing to do


def test_a_corrupt_snapshot_is_refused_before_restore(driver: Driver, base_image: Path) -> None:
    driver.define(VMSpec("vm1", base_image), "n1")
    driver.boot("vm1", "n1")
    snap = driver.save("vm1", "n1")
    with open(snap.memory_path, "r+b") as fh:
        fh.seek(snap.size_bytes // 2)
        fh.write(b"\xff\x00")
    with pytest.raises(SnapshotError, match=r"VM vm1 on node n1: snapshot .* is corrupt"):
        driver.restore("vm1", "n1")
    with pytest.raises(SnapshotError, match="corrupt"):
        driver.restore("vm1", "n2", from_node="n1")
    assert driver.state("vm1", "n1") == VMState.SAVED
    assert driver.state("vm1", "n2") is None  # nothing was started from the broken state
    assert snap.memory_path.exists()  # and nothing was lost


def test_a_missing_or_unrecorded_snapshot_is_refused(driver: Driver, base_image: Path) -> None:
    driver.define(VMSpec("vm1", base_image), "n1")
    driver.boot("vm1", "n1")
    snap = driver.save("vm1", "n1")
    manifest = snap.memory_path.with_name(snap.memory_path.name + ".json")
    manifest.unlink()
    with pytest.raises(SnapshotError, match="no manifest and no store record"):
        driver.restore("vm1", "n1")
    snap.memory_path.unlink()
    with pytest.raises(SnapshotError, match="is missing"):
        driver.restore("vm1", "n1")


def test_save_finishes_after_a_crash_between_libvirt_and_the_rename(driver: Driver, base_image: Path) -> None:
    driver.define(VMSpec("vm1", base_image), "n1")
    driver.boot("vm1", "n1")
    state = driver.state_path("vm1", "n1")
    # What an agent killed right after libvirt wrote the state would leave behind.
    driver.connection("n1").lookupByName("vm1").save(str(state) + ".part")
    snap = driver.save("vm1", "n1")
    assert snap.memory_path == state and snap.sha256 == sha256_file(state)
    driver.restore("vm1", "n1")
    assert driver.state("vm1", "n1") == VMState.RUNNING


def test_a_partial_state_left_by_a_failed_save_is_not_hashed_into_the_next(driver: Driver, base_image: Path) -> None:
    """The save's hash follows libvirt's file as it is written (provisioning.save_hash): an old
    `.part` at that name must not be what it reads."""
    driver.define(VMSpec("vm1", base_image), "n1")
    driver.boot("vm1", "n1")
    state = driver.state_path("vm1", "n1")
    state.parent.mkdir(parents=True, exist_ok=True)
    Path(str(state) + ".part").write_bytes(b"LibvirtQemudPart" + b"\x00" * (20 << 20))
    snap = driver.save("vm1", "n1")
    assert (snap.size_bytes, snap.sha256) == (state.stat().st_size, sha256_file(state))
    assert not Path(str(state) + ".part").exists()
    driver.restore("vm1", "n1")
    assert driver.state("vm1", "n1") == VMState.RUNNING


def test_free_page_reporting_follows_the_config_and_an_old_state_restores_as_saved(
    tmp_path: Path, test_nodes: dict[str, str], base_image: Path
) -> None:
    """New domains get the balloon's free page reporting when `free_page_reporting` is on; a
    state saved before (without it) restores with its own XML, here and on another node."""

    def reporting(drv: Driver, vm: str, node: str) -> list[str | None]:
        root = ET.fromstring(drv.connection(node).lookupByName(vm).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        return [b.get("freePageReporting") for b in root.findall("./devices/memballoon")]

    with make_driver(tmp_path, test_nodes) as drv:
        drv.config.free_page_reporting = False
        drv.define(VMSpec("old", base_image), "n1")
        drv.boot("old", "n1")
        drv.save("old", "n1")
        drv.config.free_page_reporting = True
        drv.define(VMSpec("new", base_image), "n1")
        assert reporting(drv, "new", "n1") == ["on"]
        drv.restore("old", "n1")
        assert reporting(drv, "old", "n1") == [None]
        drv.save("old", "n1")
        drv.restore("old", "n2", from_node="n1")
        assert reporting(drv, "old", "n2") == [None]
        assert drv.state("old", "n2") == VMState.RUNNING


def test_snapshot_keeps_the_vm_running_and_restores_elsewhere(driver: Driver, base_image: Path) -> None:
    driver.define(VMSpec("vm1", base_image), "n1")
    driver.boot("vm1", "n1")
    snap = driver.snapshot("vm1", "n1", label="t1")
    assert driver.state("vm1", "n1") == VMState.RUNNING
    assert (snap.size_bytes, snap.sha256) == (snap.memory_path.stat().st_size, sha256_file(snap.memory_path))
    assert snap.kind == "full" and snap.overlay_path is not None and snap.overlay_path.exists()
    assert stat.S_IMODE(snap.overlay_path.stat().st_mode) == 0o600
    assert driver.snapshot("vm1", "n1", label="t1") == snap
    driver.delete("vm1", "n1")  # the RMS killed the job and its VM
    driver.restore_snapshot("vm1", "n2", label="t1", from_node="n1")
    assert driver.state("vm1", "n2") == VMState.RUNNING
    stopped = driver.snapshot("vm1", "n2", label="t2", keep_running=False)  # on a checkpoint signal
    assert driver.state("vm1", "n2") in (VMState.STOPPED, VMState.DEFINED)
    assert stopped.memory_path.exists() and not driver.state_path("vm1", "n2").exists()
    driver.restore_snapshot("vm1", "n2", label="t2")
    assert driver.state("vm1", "n2") == VMState.RUNNING


def test_delete_is_idempotent_and_removes_files(driver: Driver, base_image: Path) -> None:
    driver.define(VMSpec("vm1", base_image), "n1")
    driver.boot("vm1", "n1")
    driver.save("vm1", "n1")
    driver.delete("vm1", "n1")
    driver.delete("vm1", "n1")
    assert driver.state("vm1", "n1") is None
    assert not driver.overlay_path("vm1", "n1").exists()
    assert not driver.state_path("vm1", "n1").exists()


def test_errors_name_the_vm_the_node_and_libvirt(tmp_path: Path, driver: Driver, base_image: Path) -> None:
    with pytest.raises(DriverError, match=r"boot of VM ghost on node n1: no such domain at test:///"):
        driver.boot("ghost", "n1")
    with pytest.raises(DriverError, match=r"VM vm1 on node n1: image .* does not exist"):
        driver.define(VMSpec("vm1", tmp_path / "nope.qcow2"), "n1")
    driver.define(VMSpec("vm1", base_image), "n1")
    driver.boot("vm1", "n1")
    with pytest.raises(DriverError, match=r"migrate of VM vm1 on node n1: test:///.*(not supported|unsupported)"):
        driver.migrate("vm1", "n1", "n2")
    with pytest.raises(DriverError, match="boot of VM vm1 on node n1: it has a saved memory state"):
        driver.save("vm1", "n1")
        driver.boot("vm1", "n1")
    broken = make_driver(tmp_path, {"far": "test:///nonexistent/node.xml"})
    with pytest.raises(DriverError, match=r"node far: test:///nonexistent/node.xml"):
        broken.state("vm1", "far")


@pytest.mark.parametrize("name", ["", "../etc", "a b", "x;rm", "-flag", "é", "vm1\n", "a" * 129])
def test_bad_names_are_refused(name: str, base_image: Path) -> None:
    with pytest.raises(InputError, match="vm name"):
        VMSpec(name, base_image)


def test_libvirt_errors_are_not_printed(capfd: pytest.CaptureFixture[str], driver: Driver) -> None:
    assert driver.state("ghost", "n1") is None
    assert "libvirt:" not in capfd.readouterr().err


def test_the_performer_carries_out_the_entropy_actions(driver: Driver, base_image: Path) -> None:
    perf = DriverPerformer(driver, lambda vm: VMSpec(vm, base_image, memory_mib=64))
    perf.run("vm1", "n1")
    perf.run("vm1", "n1")  # retried after a crash: still one VM, running
    assert driver.state("vm1", "n1") == VMState.RUNNING
    perf.suspend("vm1", "n1")
    assert driver.state("vm1", "n1") == VMState.SAVED
    perf.resume("vm1", "n2", "n1")
    assert (driver.state("vm1", "n1"), driver.state("vm1", "n2")) == (None, VMState.RUNNING)
    perf.stop("vm1", "n2")
    assert driver.state("vm1", "n2") in (VMState.STOPPED, VMState.DEFINED)


def test_a_vm_directory_others_can_write_is_refused(
    tmp_path: Path, test_nodes: dict[str, str], base_image: Path
) -> None:
    """Root writes users' overlays and memory states there: a 0777 parent (non-sticky) would let
    anyone swap the directory for a symlink to wherever they like."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data").chmod(0o777)
    with make_driver(tmp_path, test_nodes) as drv, pytest.raises(UnsafePathError, match=r"data: is writable by"):
        drv.define(VMSpec("vm1", base_image), "n1")
    assert not (tmp_path / "data" / "vms").exists()
