"""The site the real-QEMU Saline benches run a manager on, and the moves they put it through.

Why one helper: bench/saline_network.py, saline_nat.py and saline_output.py each built the
same thing by hand — a work directory QEMU (another user) can read, root's libvirtd and
possibly a second one of our own as another site's node, a SQLite store, the `debian12`
image (cached by content), a configuration with one repository per site, an OAR client that
points at nothing (OAR is not part of these benches; test_saline_e2e runs it) and a Manager
over a Driver — and the same evacuation on OAR's warning with the first VM's output kept
(its logs go with the VM). They differ in what runs in the guest and what they check.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devkit import libvirtd
from plugins.oar.client import OarRest
from provisioning import image_build
from provisioning.driver import Driver
from provisioning.images import Catalogue
from saline_bew import evacuation, journal
from saline_bew.manager import Manager
from saline_bew.repository import Repository
from saline_bew.sites import Site
from saline_bew.vms import SalineVMs
from vjob import progress
from vjob.config import Config, ProvisioningConfig, parse
from vjob.errors import CommandError
from vjob.store.db import Store

USER = "oaruser1"
"""A user of this machine (the OAR tests' user): COMMAND runs as its uid in the guest."""


@dataclass(frozen=True)
class SecondNode:
    """A second libvirtd of our own, node `nb`: its host name and migration port range."""

    hostname: str
    migration_ports: tuple[int, int]


@dataclass(frozen=True)
class SalineBench:
    """What a bench drives: the manager (its store, its VMs), the driver and the libvirt
    library directories of the nodes (a bench may need to prepare them)."""

    manager: Manager
    driver: Driver
    work: Path
    lib_dirs: tuple[Path, ...]


def require_root(why: str) -> None:
    if os.geteuid() != 0:
        raise SystemExit(f"root only: {why}")


@contextmanager
def saline_bench(
    prefix: str,
    bar: progress.Progress,
    figures: dict[str, Any],
    *,
    second: SecondNode | None = None,
    saline: Mapping[str, Any] | None = None,
    vms: Callable[[Driver, Store, Config], SalineVMs] | None = None,
    keep: bool = False,
) -> Iterator[SalineBench]:
    """A manager over node `na` (root's libvirtd) and, with `second`, `nb` (a libvirtd of our
    own); one site per node (`a`, `b`) with its repository in the work directory; `saline`
    adds keys to the [saline] section; `vms` makes the manager's SalineVMs. Advances `bar` once
    (the image). Everything started is stopped on exit, the work directory removed unless
    `keep`."""
    work = Path(tempfile.mkdtemp(prefix=f"vjob-{prefix}-"))
    os.chmod(work, 0o755)
    system = libvirtd.start_system(work / "log")
    node_b = None
    lib_dirs = [Path("/var/lib/libvirt")]
    try:
        nodes = {"na": libvirtd.SYSTEM_URI}
        if second is not None:
            base_b = Path(f"/var/tmp/vjob-{prefix}-nodeb")
            node_b = libvirtd.start_second_node(
                base_b, hostname=second.hostname, migration_ports=second.migration_ports
            )
            nodes["nb"] = node_b.uri
            lib_dirs.append(base_b / "lib")
        store = Store(f"sqlite:///{work / 'vjob.sqlite'}")
        store.upgrade()
        bar.relabel("image debian12 (cached by content; a cold build takes minutes)")
        built = image_build.build(Catalogue(store, ProvisioningConfig(), data_dir=work / "data"), "debian12")
        figures["image_cached"] = built.cached
        bar.advance()
        names = ("a", "b")[: len(nodes)]
        cfg = parse(
            {
                "data_dir": str(work / "data"),
                "provisioning": {
                    "nodes": nodes,
                    "vm_dir": str(work / "vms" / "{node}"),
                    "snapshot_dir": str(work / "snap" / "{node}"),
                    "job_disk_free_mb": 64,
                },
                "saline": {
                    "sites": [{"name": s, "repository": str(work / f"repo-{s}")} for s in names],
                    **(saline or {}),
                },
            }
        )
        dead = OarRest("http://127.0.0.1:9/oarapi", timeout_s=1)  # nobody listens there
        sites = {sc.name: Site(sc.name, dead, Repository(sc.name, sc.repository)) for sc in cfg.saline.sites}
        with Driver(cfg.provisioning, data_dir=work / "data", store=store) as driver:
            machines = vms(driver, store, cfg) if vms is not None else SalineVMs(driver, store)
            yield SalineBench(Manager(cfg, store, sites, machines), driver, work, tuple(lib_dirs))
        store.close()
    finally:
        if node_b is not None:
            libvirtd.stop(node_b)
        libvirtd.stop(system)
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def leased_job(manager: Manager, key: str, command: list[str], *, vm_count: int, memory_mb: int) -> journal.SalineJob:
    """A vjob of USER's at site a, recorded and leased by `manager`, as a submission leaves it
    before the manager deploys it (the benches then drive that deployment step by step)."""
    job = journal.create(
        manager.ports.store,
        key=key,
        user=USER,
        image="debian12",
        command=command,
        vm_count=vm_count,
        vcpus=1,
        memory_mb=memory_mb,
        walltime="1:00:00",
        site="a",
    )
    if not manager.ports.lease(job.key):
        raise RuntimeError(f"bench: the manager could not lease vjob {key}")
    return job


def numbered_lines(log: Path, line: re.Pattern[str]) -> list[tuple[int, str]]:
    """(counter, rest) of every `line` the guest printed so far: the pattern's groups 1 and
    the last."""
    try:
        text = log.read_text(errors="replace")
    except FileNotFoundError:
        return []
    return [(int(m.group(1)), m.group(m.lastindex or 1).strip()) for m in line.finditer(text)]


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Seconds until `predicate()` holds; the bench stops naming `what` past `timeout_s`."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            raise SystemExit(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.5)
    return time.monotonic() - start


def plain_rsync(files: list[Path], host: str, dest: Path, ssh_config: Path) -> float:
    """Seconds for one plain rsync of `files` to `host:dest` (made first, not timed) over ssh
    with `ssh_config`: what the link gives with no check and no manager around it, the figure
    a relocation's copy is set beside. `dest` is removed afterwards."""
    ssh = ["ssh", "-F", str(ssh_config), host, "--"]
    subprocess.run([*ssh, "mkdir", "-p", "-m", "700", "--", str(dest)], check=True, timeout=60)
    try:
        start = time.monotonic()
        rsync = ["rsync", "-t", "-e", f"ssh -F {ssh_config}", *map(str, files), f"{host}:{dest}/"]
        subprocess.run(rsync, check=True, timeout=600)
        return time.monotonic() - start
    finally:
        subprocess.run([*ssh, "rm", "-rf", "--", str(dest)], check=False, timeout=60)


def move_figures(snapshot: Mapping[str, Any], resumed: Mapping[str, Any], plain_s: float) -> dict[str, Any]:
    """A relocation's figures from its journal entries (the snapshot it resumed from, the
    resume): bytes moved, the time of each step, the copy's MB/s and a plain rsync's of the
    same files (`plain_s`), and their ratio."""
    moved = int(resumed["bytes"])
    mb = moved / 1e6
    copy_s = float(resumed["copy_s"])
    return {
        "bytes": moved,
        "snapshot_s": snapshot.get("took_s"),
        "snapshot_cut_s": snapshot.get("staged_s"),
        "snapshot_to_repository_s": snapshot.get("gather_s"),
        "copy_s": copy_s,
        "check_s": resumed["check_s"],
        "restore_s": resumed["restore_to_running_s"],
        "copy_mb_per_s": round(mb / copy_s, 1) if copy_s > 0 else None,
        "plain_rsync_s": round(plain_s, 3),
        "plain_rsync_mb_per_s": round(mb / plain_s, 1) if plain_s > 0 else None,
        "copy_vs_plain": round(copy_s / plain_s, 2) if plain_s > 0 else None,
    }


def evacuate_keeping_output(manager: Manager, key: str, log: Path) -> tuple[Path, float]:
    """OAR's checkpoint warning with no site that has room: one coordinated cut into the
    repository, the nodes freed (`evacuation.evacuate`). The first VM's output log goes with the
    VM, so a copy is kept just before it is deleted. Returns (the copy, warning → nodes freed
    in s). The resubmission to OAR afterwards fails (OAR is not part of the benches)."""
    job = journal.get(manager.ports.store, key)
    kept = Path(str(log) + ".kept")
    real_stop = manager.ports.vms.stop

    def stop(vm: str, node: str) -> None:
        if vm == job.vm_names[0]:
            shutil.copyfile(log, kept)
        real_stop(vm, node)

    manager.ports.vms.stop = stop  # type: ignore[method-assign]
    warned = time.time()
    try:
        evacuation.evacuate(manager.ports, job, 1, warned)
    except CommandError:
        pass
    finally:
        manager.ports.vms.stop = real_stop  # type: ignore[method-assign]
    return kept, time.time() - warned


__all__ = [
    "USER",
    "SalineBench",
    "SecondNode",
    "evacuate_keeping_output",
    "move_figures",
    "numbered_lines",
    "plain_rsync",
    "require_root",
    "saline_bench",
    "wait_for",
]
