"""A best-effort vjob's VMs on the nodes OAR gave it, through provisioning's libvirt driver.

Why the site master drives the VMs and not a pilot inside the OAR job: OAR kills a
best-effort job with SIGKILL and no grace (notes/oar.md), so nothing inside the job can save
it; the master snapshots periodically from outside, and destroys the VMs itself once OAR has
taken the nodes back (libvirt's QEMU processes are not in the job's cpuset).

The guest is the tiny direct-boot guest of provisioning.guest: the vjob's COMMAND is its
payload script (run by the guest's shell, never by a host shell), and the guest powers off
when the command ends, which is how the manager sees the vjob finish. The network identity
(subnetID, vmID, MAC, IP) reaches the guest on its kernel command line, and each VM has a NIC
with that MAC on the vjob's private network: provisioning.network's per-job bridge (the one
of multi-node jobs), created on a node before a VM of the vjob arrives there and removed when
the last one leaves, so a vjob resumed or migrated elsewhere finds its network again, with
the same addresses, and no other job's VM is on it.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from provisioning import coordinated, guest, network, transfer
from provisioning.coordinated import Cut, Member
from provisioning.driver import (  # _write_manifest: the driver's own manifest format
    MANIFEST_SUFFIX,
    OVERLAY_COPY_SUFFIX,
    STATE_SUFFIX,
    Driver,
    VMSpec,
    _write_manifest,
)
from provisioning.images import Catalogue
from provisioning.vm_types import Snapshot
from saline_bew.identity import NetworkIdentity
from vjob import log
from vjob.errors import InputError
from vjob.model import VMState
from vjob.store.db import Store

_log = log.get("saline")


def snapshot_files(vm: str, label: str) -> list[str]:
    """The files one VM's snapshot is made of, as the driver names them."""
    base = f"{vm}@{label}{STATE_SUFFIX}"
    return [base, base + MANIFEST_SUFFIX, f"{vm}@{label}{OVERLAY_COPY_SUFFIX}"]


@dataclass(frozen=True)
class VMPlan:
    """One VM of the vjob and the node it goes to."""

    name: str
    node: str
    identity: NetworkIdentity


class SalineVMs:
    def __init__(self, driver: Driver, store: Store, *, memory_mib: int = 128) -> None:
        self.driver = driver
        self.store = store
        self.memory_mib = memory_mib

    def image(self, name: str) -> Path:
        """The disk image of catalogue entry `name`; unknown names are an InputError."""
        info = Catalogue(self.store, self.driver.config, data_dir=self.driver.data_dir).get(name)
        path = Path(info.path)
        if not path.is_file():
            raise InputError(f"image {name}: the catalogue's file {path} does not exist")
        return path

    def spec(
        self, name: str, image: Path, command: list[str], identity: NetworkIdentity, memory_mib: int, vcpus: int
    ) -> VMSpec:
        files = guest.build(payload=shlex.join(command) + "\n")
        ids = (
            f"saline.subnet={identity.subnet_id} saline.vm={identity.vm_id} "
            f"saline.mac={identity.mac} saline.ip={identity.ip}"
        )
        return VMSpec(
            name,
            image,
            memory_mib=max(memory_mib, guest.MIN_MEMORY_MIB),
            vcpus=vcpus,
            kernel=files.kernel,
            initrd=files.initrd,
            cmdline=f"{files.cmdline} {ids}",
            nic=(identity.mac, network.bridge_name(identity.subnet_id, network.SALINE_FAMILY)),
        )

    def network_up(self, subnet_id: int, nodes: list[str]) -> None:
        """The vjob's private network on every node in `nodes` (before its VMs boot, are
        restored or migrate there: libvirt refuses a NIC whose bridge is missing)."""
        for node in dict.fromkeys(nodes):
            network.ensure_bridge(self.driver.connection(node), subnet_id, network.SALINE_FAMILY)

    def network_down(self, subnet_id: int, nodes: list[str]) -> None:
        """Remove the vjob's network from nodes none of its VMs runs on any more. Best effort:
        a bridge left behind holds no VM and costs nothing; it is logged."""
        for node in dict.fromkeys(nodes):
            try:
                network.remove_bridge(self.driver.connection(node), subnet_id, network.SALINE_FAMILY)
            except Exception as exc:  # noqa: BLE001 - see above
                bridge = network.bridge_name(subnet_id, network.SALINE_FAMILY)
                _log.warning("vjob network not removed", node=node, bridge=bridge, error=str(exc)[:300])

    def boot_fresh(self, spec: VMSpec, node: str, *, job_id: int) -> None:
        """Boot from the image: a new vjob, or one killed before its first safe snapshot."""
        self.driver.delete(spec.name, node)  # whatever a killed run left there
        self.driver.define(spec, node, job_id=job_id)
        self.driver.boot(spec.name, node)

    def checkpoint(self, members: list[tuple[str, str]], label: str, *, job_id: int, keep_running: bool) -> Cut:
        """One consistent cut of the vjob's VMs, left under `label` in their nodes' snapshot dirs.

        Through provisioning.coordinated, the one checkpoint path of vjob (agent, PBS hook,
        Saline): every VM is paused before any is saved, so the snapshots are one cut of the job
        whatever order the saves take. With `keep_running` (a periodic snapshot) the VMs are
        restored paused and let run together; without it (OAR's checkpoint signal) they stay
        stopped at the cut, since work done after the kept state would be lost anyway.
        """
        coord = [Member(vm, node) for vm, node in members]
        cut = coordinated.checkpoint(self.driver, coord, job_id=job_id)
        try:
            for vm, node in members:
                _stage(self.driver, cut.snapshots[vm], vm, node, label, keep_state=keep_running)
        except BaseException:
            for vm, node in members:
                self.drop_staged(vm, node, label)
            if keep_running:  # the job runs on from its saved state, as before the attempt
                coordinated.restore(self.driver, coord)
            raise
        if keep_running:
            coordinated.restore(self.driver, coord)
        return cut

    def can_migrate(self) -> bool:
        """Live migration needs the overlay at one path on every node (`Driver.migrate`): a
        vm_dir shared by the nodes, so not one with `{node}` in it."""
        return "{node}" not in self.driver.config.vm_dir

    def migrate(self, vm: str, src: str, dst: str) -> None:
        """Move a running VM to `dst` live: it never stops, so no work is lost and no snapshot
        is written."""
        self.driver.migrate(vm, src, dst)

    def stage_dir(self, node: str) -> Path:
        return self.driver.snapshot_dir(node)

    def restore(self, vm: str, node: str, label: str, source_dir: Path, host: str | None = None) -> None:
        """Start `vm` on `node` from the snapshot files in `source_dir` (a repository; on `host`
        over rsync when it is remote). The driver checks the memory state that arrived against
        its manifest before restoring it."""
        self.driver.delete(vm, node)
        dest = self.driver.snapshot_dir(node)
        dest.mkdir(parents=True, exist_ok=True, mode=0o700)
        method = "local" if host is None else "rsync"
        for name in snapshot_files(vm, label):
            transfer.copy(transfer.Endpoint(source_dir / name, host), transfer.Endpoint(dest / name), method=method)
        self.driver.restore_snapshot(vm, node, label=label)
        self.drop_staged(vm, node, label)

    def drop_staged(self, vm: str, node: str, label: str) -> None:
        for name in snapshot_files(vm, label):
            (self.driver.snapshot_dir(node) / name).unlink(missing_ok=True)

    def stop(self, vm: str, node: str) -> None:
        """Free the node: the VM is gone from it (its snapshot is what survives)."""
        self.driver.delete(vm, node)

    def finished(self, vm: str, node: str) -> bool:
        """The guest ran its command to the end and powered off."""
        return self.driver.state(vm, node) is VMState.STOPPED

    def console_log(self, vm: str, node: str) -> Path:
        return self.driver.console_log(vm, node)


def _stage(driver: Driver, snap: Snapshot, vm: str, node: str, label: str, *, keep_state: bool) -> None:
    """Name the saved state of `vm` and a copy of its overlay `label` in the node's snapshot dir,
    with the manifest of the state, as `Driver.snapshot` names them (a restore is the same).

    `keep_state`: the VM is restored from its state file next, so the labelled state is a hard
    link to it (one directory, no copy of the memory); otherwise the state file is moved.
    """
    stage = driver.snapshot_dir(node)
    memory = stage / f"{vm}@{label}{STATE_SUFFIX}"
    overlay_copy = stage / f"{vm}@{label}{OVERLAY_COPY_SUFFIX}"
    transfer.copy(transfer.Endpoint(driver.overlay_path(vm, node)), transfer.Endpoint(overlay_copy), method="local")
    memory.unlink(missing_ok=True)  # a label is never reused; a crashed earlier attempt may have left it
    if keep_state:
        os.link(snap.memory_path, memory)
    else:
        os.replace(snap.memory_path, memory)
    _write_manifest(
        memory,
        {
            "vm": vm,
            "node": node,
            "kind": "full",
            "size_bytes": snap.size_bytes,
            "sha256": snap.sha256,
            "created_at": snap.created_at,
            "overlay": None,
        },
    )
