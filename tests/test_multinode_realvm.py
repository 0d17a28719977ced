"""Coordinated checkpoint of a two-VM job on real QEMU: one cut, then resumed on swapped nodes.

Two counter guests, one per node (the system libvirtd and the second libvirtd), are paused
together, saved in parallel, and restored each on the other node, paused, then let run
together. Checked: libvirt reported both paused before the first save began (the module
checks it, the timestamps show it), neither guest printed a counter between the pause and
its save, and both continue n → n+1 without a reboot.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit import guest_probe
from devkit.guest_probe import wait_for_counter
from provisioning import coordinated, guest
from provisioning.coordinated import Member
from provisioning.driver import Driver, VMSpec
from vjob.config import ProvisioningConfig
from vjob.model import VMState

pytestmark = [pytest.mark.libvirt, pytest.mark.realvm]

VMS = {"vjob-mn-job-0": "a", "vjob-mn-job-1": "b"}
TICK_TIMEOUT_S = 40.0


@pytest.fixture(scope="module")
def job(libvirt_system: str, libvirt_second_node: str, tiny_guest: guest.GuestFiles) -> Iterator[Driver]:
    work = Path(tempfile.mkdtemp(prefix="vjob-mn-cut-", dir="/var/tmp"))
    work.chmod(0o755)
    image = work / "empty.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "64M"], check=True, timeout=30)
    cfg = ProvisioningConfig(
        nodes={"a": libvirt_system, "b": libvirt_second_node},
        snapshot_dir=str(work / "snapshots" / "{node}"),
        operation_timeout_s=120,
    )
    driver = Driver(cfg, data_dir=work)
    for vm, node in VMS.items():
        for n in ("a", "b"):
            driver.delete(vm, n)
        spec = VMSpec(
            vm, image, memory_mib=128, kernel=tiny_guest.kernel, initrd=tiny_guest.initrd, cmdline=tiny_guest.cmdline
        )
        driver.define(spec, node)
        driver.boot(vm, node)
    for vm, node in VMS.items():
        wait_for_counter(driver.console_log(vm, node), 2, 120)
    try:
        yield driver
    finally:
        for vm in VMS:
            for n in ("a", "b"):
                driver.delete(vm, n)
        driver.close()
        shutil.rmtree(work, ignore_errors=True)


def test_two_vms_saved_in_one_cut_and_resumed_on_other_nodes(job: Driver) -> None:
    driver = job
    members = [Member(vm, node) for vm, node in VMS.items()]
    cut = coordinated.checkpoint(driver, members)
    assert cut.consistent, (cut.paused_at, cut.save_started_at)
    assert max(cut.paused_at.values()) <= min(cut.save_started_at.values())
    before = {}
    for vm, node in VMS.items():
        assert driver.state(vm, node) == VMState.SAVED
        assert cut.snapshots[vm].size_bytes > 32 << 20
        # the balloon: its statistics, and free page reporting (on by default, docs/provisioning.md)
        saved = ET.fromstring(driver.connection(node).saveImageGetXMLDesc(str(cut.snapshots[vm].memory_path), 0))
        balloons = saved.findall("./devices/memballoon")
        assert [(b.get("freePageReporting"), b.find("stats") is not None) for b in balloons] == [("on", True)]
        before[vm] = guest_probe.last_counter(driver.console_log(vm, node))
        assert before[vm] is not None

    swapped = [Member(vm, "b" if node == "a" else "a", from_node=node) for vm, node in VMS.items()]
    resumed = coordinated.restore(driver, swapped)
    assert resumed.running_at >= max(resumed.restored_at.values())
    for m in swapped:
        log = driver.console_log(m.vm, m.node)
        wait_for_counter(log, before[m.vm] + 2, TICK_TIMEOUT_S)
        seen = guest_probe.counters(log)
        assert seen == list(range(1, len(seen) + 1)), f"{m.vm}: counter sequence broken: {seen}"
        assert guest_probe.boots(log) == 1
        assert driver.state(m.vm, m.node) == VMState.RUNNING
        assert driver.state(m.vm, m.from_node or "") is None
    print(
        json.dumps(
            {
                "figure": "coordinated",
                "vms": 2,
                "pause_to_saved_s": round(cut.pause_to_saved_s, 3),
                "restore_to_running_s": round(resumed.restore_to_running_s, 3),
            }
        )
    )
