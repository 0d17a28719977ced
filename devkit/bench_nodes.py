"""A provisioning driver over dev-cluster libvirt nodes, for the real-VM remapping benches.

Why one helper: bench/remap_live.py, remap_thrash.py, remap_memory.py, remap_profiling.py and
tests/test_remap_live.py each built the same set-up by hand — a work directory under /var/tmp
that QEMU (another user) can read, an empty qcow2 disk for the guest, a Driver over the nodes
with TCP live migration between them when there are two — and the same tear-down (the VMs on
every node, the connections, the directory). Starting the libvirtds stays with each caller:
they differ (a private second node, the shared one, a given URI) and devkit.libvirtd does it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from provisioning.driver import Driver
from vjob import proc
from vjob.config import ProvisioningConfig

MIGRATE_URI = "tcp://127.0.0.1"
"""Every node of the dev cluster is this machine: live migrations go over loopback TCP."""


@dataclass(frozen=True)
class BenchNodes:
    """What a bench runs on: the driver, its work directory and the guest's empty disk."""

    driver: Driver
    work: Path
    image: Path


@contextmanager
def bench_nodes(
    prefix: str,
    nodes: Mapping[str, str],
    *,
    vms: Sequence[str],
    disk_mib: int = 64,
    timeout_s: float = 120.0,
) -> Iterator[BenchNodes]:
    """A Driver over `nodes` (name → libvirt URI) in a fresh /var/tmp/<prefix>-* directory with
    an empty `disk_mib` qcow2 image; on exit the `vms` are deleted on every node (whatever
    happened), the connections closed and the directory removed."""
    work = Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir="/var/tmp"))
    try:
        work.chmod(0o755)  # QEMU runs as another user and reads the disk from here
        image = work / "images" / "disk.qcow2"
        image.parent.mkdir()
        proc.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), f"{disk_mib}M"], timeout_s=30)
        migrate = {n: MIGRATE_URI for n in nodes} if len(nodes) > 1 else {}
        cfg = ProvisioningConfig(nodes=dict(nodes), migrate_uris=migrate, operation_timeout_s=timeout_s)
        driver = Driver(cfg, data_dir=work)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    try:
        yield BenchNodes(driver, work, image)
    finally:
        try:
            for vm in vms:
                for node in nodes:
                    driver.delete(vm, node)
        finally:
            driver.close()
            shutil.rmtree(work, ignore_errors=True)


__all__ = ["MIGRATE_URI", "BenchNodes", "bench_nodes"]
