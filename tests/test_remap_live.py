"""Live remapping on real QEMU: a CPU-bound guest on a capped ("slow") node is profiled, the
policy decides to move it to the free uncapped ("fast") node, the driver live-migrates it, and
it finishes there with the checksum computed here. The timing comparison is bench/remap_live.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from provisioning import guest
from provisioning.driver import Driver, VMSpec
from tests import bench_scripts
from vjob.config import ProvisioningConfig

pytestmark = [
    pytest.mark.libvirt,
    pytest.mark.realvm,
    pytest.mark.skipif(os.geteuid() != 0, reason="the slow node kind is a cgroup CPU quota: root only"),
]

ITERATIONS = 30_000


def _checksum(n: int) -> int:
    s = 7
    for i in range(1, n + 1):
        s = (s * 31 + i) % 1000003
    return s


def test_cpu_bound_guest_moves_to_the_free_fast_node_and_finishes_with_the_same_result(
    libvirt_system: str, libvirt_second_node: str
) -> None:
    bench = bench_scripts.load("remap_live")
    files = guest.build(payload=bench.PAYLOAD.format(n=ITERATIONS))
    work = Path(tempfile.mkdtemp(prefix="vjob-remap-live-", dir="/var/tmp"))
    work.chmod(0o755)
    image = work / "empty.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "64M"], check=True, timeout=30)
    cfg = ProvisioningConfig(
        nodes={"a": libvirt_system, "b": libvirt_second_node},
        migrate_uris={"a": "tcp://127.0.0.1", "b": "tcp://127.0.0.1"},
        operation_timeout_s=120,
    )
    driver = Driver(cfg, data_dir=work)
    spec = VMSpec(bench.VM, image, memory_mib=128, kernel=files.kernel, initrd=files.initrd, cmdline=files.cmdline)
    try:
        out = bench.run(driver, spec, slow_quota=0.33, remap=True, tau=4.0, timeout=300.0)
        assert out["moved"] is not None, out
        assert [d["reason"] for d in out["decisions"]] == ["gain"]
        assert out["result"] == _checksum(ITERATIONS)
        assert bench.RESULT_RE.findall(driver.console_log(bench.VM, "b").read_bytes()), "did not finish on b"
    finally:
        for node in ("a", "b"):
            driver.delete(bench.VM, node)
        driver.close()
        shutil.rmtree(work, ignore_errors=True)
