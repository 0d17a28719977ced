"""Checkpoints on real QEMU guests: the counter guest continues n → n+1, with one boot.

One 128 MiB guest is booted for the module (booting under TCG costs several seconds on two
shared cores) and moved around by the tests: saved and restored on its node, resumed on a
second libvirtd, live-migrated back; a corrupted memory state is refused and, once repaired,
still resumes, proving that the refusal lost nothing.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit import guest_probe
from devkit.guest_probe import wait_for_counter
from provisioning import guest
from provisioning.driver import Driver, SnapshotError, VMSpec
from vjob.config import ProvisioningConfig
from vjob.model import VMState

pytestmark = [pytest.mark.libvirt, pytest.mark.realvm]

VM = "vjob-realvm-counter"
TICK_TIMEOUT_S = 30.0


class Guest:
    """The booted guest, its driver and the node it is on now."""

    def __init__(self, driver: Driver, node: str) -> None:
        self.driver = driver
        self.node = node

    @property
    def log(self) -> Path:
        return self.driver.console_log(VM, self.node)

    def other(self) -> str:
        return "b" if self.node == "a" else "a"

    def assert_continued(self, before: int) -> None:
        """The first counter printed after the checkpoint is before+1, and it never rebooted."""
        wait_for_counter(self.log, before + 2, TICK_TIMEOUT_S)
        seen = guest_probe.counters(self.log)
        assert seen == list(range(1, len(seen) + 1)), f"counter sequence broken: {seen}"
        assert guest_probe.boots(self.log) == 1


@pytest.fixture(scope="module")
def running_guest(libvirt_system: str, libvirt_second_node: str, tiny_guest: guest.GuestFiles) -> Iterator[Guest]:
    work = Path(tempfile.mkdtemp(prefix="vjob-realvm-", dir="/var/tmp"))
    work.chmod(0o755)  # QEMU runs as libvirt-qemu and must reach the overlay and the image
    image = work / "images" / "empty.qcow2"
    image.parent.mkdir()
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "64M"], check=True, timeout=30)
    cfg = ProvisioningConfig(
        nodes={"a": libvirt_system, "b": libvirt_second_node},
        snapshot_dir=str(work / "snapshots" / "{node}"),
        migrate_uris={"a": "tcp://127.0.0.1", "b": "tcp://127.0.0.1"},
        operation_timeout_s=120,
    )
    driver = Driver(cfg, data_dir=work)
    spec = VMSpec(
        VM, image, memory_mib=128, kernel=tiny_guest.kernel, initrd=tiny_guest.initrd, cmdline=tiny_guest.cmdline
    )
    for node in ("a", "b"):  # leftovers of an interrupted earlier run
        driver.delete(VM, node)
    driver.define(spec, "a")
    driver.boot(VM, "a")
    g = Guest(driver, "a")
    wait_for_counter(g.log, 2, 90)
    try:
        yield g
    finally:
        for node in ("a", "b"):
            driver.delete(VM, node)
        driver.close()
        shutil.rmtree(work, ignore_errors=True)


def test_counter_continues_after_save_and_restore(running_guest: Guest) -> None:
    g = running_guest
    snap = g.driver.save(VM, g.node)
    before = guest_probe.last_counter(g.log)
    assert before is not None and snap.size_bytes > 32 << 20  # a real memory image
    assert g.driver.state(VM, g.node) == VMState.SAVED
    g.driver.restore(VM, g.node)
    g.assert_continued(before)


def test_counter_continues_after_resume_on_a_second_node(running_guest: Guest) -> None:
    g = running_guest
    src, dst = g.node, g.other()
    g.driver.save(VM, src)
    before = guest_probe.last_counter(g.log)
    assert before is not None
    g.driver.restore(VM, dst, from_node=src)
    g.node = dst
    assert g.driver.state(VM, src) is None
    assert g.driver.state(VM, dst) == VMState.RUNNING
    g.assert_continued(before)


def test_counter_continues_after_live_migration(running_guest: Guest) -> None:
    g = running_guest
    src, dst = g.node, g.other()
    before = guest_probe.last_counter(g.log)
    assert before is not None
    g.driver.migrate(VM, src, dst)
    g.node = dst
    assert g.driver.state(VM, src) is None
    assert g.driver.state(VM, dst) == VMState.RUNNING
    g.assert_continued(before)


def test_a_corrupted_memory_state_is_refused_and_nothing_is_lost(running_guest: Guest) -> None:
    g = running_guest
    snap = g.driver.save(VM, g.node)
    before = guest_probe.last_counter(g.log)
    assert before is not None
    offset = snap.size_bytes // 2
    with open(snap.memory_path, "r+b") as fh:
        fh.seek(offset)
        original = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([original[0] ^ 0xFF]))
    with pytest.raises(SnapshotError, match="is corrupt"):
        g.driver.restore(VM, g.node)
    assert g.driver.state(VM, g.node) == VMState.SAVED
    assert guest_probe.last_counter(g.log) == before  # the guest did not run from the broken state
    with open(snap.memory_path, "r+b") as fh:
        fh.seek(offset)
        fh.write(original)
    g.driver.restore(VM, g.node)
    g.assert_continued(before)
