"""A best-effort vjob's VMs on the nodes OAR gave it, through provisioning's libvirt driver.

Why the site master drives the VMs and not a pilot inside the OAR job: OAR kills a
best-effort job with SIGKILL and no grace (notes/oar.md), so nothing inside the job can save
it; the master snapshots periodically from outside, and destroys the VMs itself once OAR has
taken the nodes back (libvirt's QEMU processes are not in the job's cpuset).

On an image without its own kernel the guest is the tiny direct-boot guest of
provisioning.guest: the vjob's COMMAND is its payload script (run by the guest's shell, never
by a host shell), and the guest powers off when the command ends, which is how the manager
sees the vjob finish. An image from `vjob image build` boots its own kernel and the guest
agent runs COMMAND on the first VM from a job disk, as a multi-node job's (`real_specs`); the
job disks are part of each snapshot. The network identity
(subnetID, vmID, MAC, IP) reaches the guest on its kernel command line, and each VM has a NIC
with that MAC on the vjob's private network: provisioning.network's per-job bridge (the one
of multi-node jobs), created on a node before a VM of the vjob arrives there and removed when
the last one leaves, so a vjob resumed or migrated elsewhere finds its network again, with
the same addresses, and no other job's VM is on it. With `[saline] nat_network` each VM has
a second NIC, the paper's NAT interface (provisioning.nat): a static address from its
subnetID/vmID behind the same gateway on every node, set in a real image's guest from job.json.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from provisioning import coordinated, guest, images, job_disk, nat, network, safe_dirs, transfer
from provisioning.coordinated import Cut, Member, Resumed
from provisioning.driver import (
    Driver,
    VMSpec,
)
from provisioning.images import Catalogue
from provisioning.vm_types import Nic
from saline_bew import node_files, workdir
from saline_bew.config import SalineConfig
from saline_bew.identity import NetworkIdentity
from saline_bew.node_files import snapshot_files
from vjob import log
from vjob.errors import InputError
from vjob.model import VMState
from vjob.store.db import Store

_log = log.get("saline")


REAL_MIN_MEMORY_MIB = 256
"""A real image (Debian's kernel, python3, sshd) does not boot in the tiny guest's 128 MiB."""
JOB_SCRIPT = b'#!/bin/sh\nexec "$@"\n'
"""The job disk's script of a vjob: COMMAND is its argv, run as the user (no shell between)."""


def nat_network(cfg: SalineConfig) -> nat.NatNetwork | None:
    """The NAT network of `[saline]` (None when `nat_network` is empty: no second NIC)."""
    return nat.from_config(cfg.nat_network, cfg.nat_range, cfg.nat_mac_prefix, cfg.nat_dns)


@dataclass(frozen=True)
class Restored:
    """A resume from a repository: the coordinated restore, and what fetching the files took."""

    resumed: Resumed
    fetched: node_files.Fetched

    @property
    def restore_to_running_s(self) -> float:
        """From the first VM's restore (its files already on its node) to all running."""
        return self.resumed.restore_to_running_s


@dataclass(frozen=True)
class VMPlan:
    """One VM of the vjob and the node it goes to."""

    name: str
    node: str
    identity: NetworkIdentity


class SalineVMs:
    def __init__(
        self, driver: Driver, store: Store, *, memory_mib: int = 128, nat_network: nat.NatNetwork | None = None
    ) -> None:
        self.driver = driver
        self.store = store
        self.memory_mib = memory_mib
        self.nat = nat_network
        """The NAT network every VM also plugs into (`[saline] nat_network`); None: none."""

    def nics(self, ident: NetworkIdentity) -> tuple[Nic, ...]:
        """The VM's NICs: the vjob's private network first (the guest's first NIC, as before),
        then the NAT interface when the site has one."""
        private = Nic(ident.mac, network.bridge_name(ident.subnet_id, network.SALINE_FAMILY))
        return (private,) if self.nat is None else (private, self.nat.nic(ident.subnet_id, ident.vm_id))

    def image(self, name: str) -> Path:
        """The disk image of catalogue entry `name`; unknown names are an InputError."""
        info = Catalogue(self.store, self.driver.config, data_dir=self.driver.data_dir).get(name)
        path = Path(info.path)
        if not path.is_file():
            raise InputError(f"image {name}: the catalogue's file {path} does not exist")
        return path

    def real(self, image_name: str, node: str) -> images.LocalImage | None:
        """The image as `node` holds it when it boots its own kernel (`vjob image build`: the
        guest agent runs the job from a job disk); None for a plain disk (the tiny guest)."""
        local = images.local_image(self.driver.config, self.driver.data_dir, node, image_name)
        return local if local is not None and local.kernel and local.initrd else None

    def real_specs(
        self,
        local: images.LocalImage,
        command: list[str],
        identities: list[NetworkIdentity],
        placement: list[str],
        *,
        user: str,
        memory_mib: int,
        vcpus: int,
        work: Path | None = None,
    ) -> list[VMSpec]:
        """The VMs of a vjob on a real image, as a multi-node job's (docs/multinode.md): each
        with a job disk whose job.json gives it its address on the vjob's network, every VM's
        name (vm0, vm1…), and one ssh key for the vjob made now, so the user's command, run on
        the first VM as the user, reaches the others with `ssh vm1`. The others wait. `work`:
        the submitter's working directory as received (saline_bew.workdir), when it exists,
        is the first VM's /work; the others start empty."""
        pw = _account(user)
        private, public = network.job_ssh_key(f"vjob-saline-{identities[0].vm_name}")
        peers = [[ident.ip, f"vm{rank}"] for rank, ident in enumerate(identities)]
        prov = self.driver.config
        specs = []
        for rank, (ident, node) in enumerate(zip(identities, placement, strict=True)):
            net = {
                "mac": ident.mac,
                "ip": ident.ip,
                "prefix": 24,
                "peers": peers,
                "leader": rank == 0,
                "ssh_private": private,
                "ssh_public": public,
            }
            if self.nat is not None:
                net["nat"] = self.nat.guest(ident.subnet_id, ident.vm_id)
            job = job_disk.check_description(
                job_disk.JobDescription(
                    script=JOB_SCRIPT,
                    args=command,
                    env={},
                    uid=pw.pw_uid,
                    gid=pw.pw_gid,
                    user=user,
                    home=pw.pw_dir,
                    cwd=pw.pw_dir,
                    hostname=f"vm{rank}",
                    network=net,
                )
            )
            disk = self.driver.job_disk_path(ident.vm_name, node)
            safe_dirs.ensure_dir(disk.parent, 0o711)
            with contextlib.ExitStack() as stack:
                if rank == 0 and work is not None and work.is_file():
                    source = stack.enter_context(
                        workdir.unpacked(
                            work, disk.parent, uid=pw.pw_uid, gid=pw.pw_gid, limit_bytes=prov.stage_limit_mb * 2**20
                        )
                    )
                else:
                    source = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vjob-saline-")))
                job_disk.build(
                    source,
                    job,
                    disk,
                    limit_bytes=prov.stage_limit_mb * 2**20,
                    free_bytes=prov.job_disk_free_mb * 2**20,
                    for_user=True,
                )
            specs.append(
                VMSpec(
                    ident.vm_name,
                    local.path,
                    image_format=local.format,
                    memory_mib=max(memory_mib, REAL_MIN_MEMORY_MIB),
                    vcpus=vcpus,
                    kernel=local.kernel,
                    initrd=local.initrd,
                    cmdline=f"{local.cmdline} {self._identity_args(ident)}",
                    job_disk=disk,
                    output_ports=True,
                    nics=self.nics(ident),
                    cpu_model=prov.cpu_model,
                )
            )
        return specs

    def work_path(self, key: str) -> Path:
        """Where the submitter's working directory of vjob `key` waits for its deployment
        (root's; kept until the vjob is cleaned: a restart from scratch needs it again)."""
        return self.driver.data_dir / "saline-work" / f"{key}{workdir.SUFFIX}"

    def receive_work(self, fd: int, user: str) -> Path:
        """Copy and check the submitter's disk from `fd` (saline_bew.workdir.receive) into
        root's directory under a temporary name; the caller renames it to `work_path`."""
        where = safe_dirs.ensure_dir(self.driver.data_dir / "saline-work", 0o700)
        dest = where / f".incoming-{os.getpid()}-{uuid.uuid4().hex[:8]}{workdir.SUFFIX}"
        pw = _account(user)
        workdir.receive(fd, dest, limit_bytes=self.driver.config.stage_limit_mb * 2**20, uid=pw.pw_uid, gid=pw.pw_gid)
        return dest

    def spec(
        self, name: str, image: Path, command: list[str], identity: NetworkIdentity, memory_mib: int, vcpus: int
    ) -> VMSpec:
        files = guest.build(payload=shlex.join(command) + "\n")
        return VMSpec(
            name,
            image,
            memory_mib=max(memory_mib, guest.MIN_MEMORY_MIB),
            vcpus=vcpus,
            kernel=files.kernel,
            initrd=files.initrd,
            cmdline=f"{files.cmdline} {self._identity_args(identity)}",
            nics=self.nics(identity),
        )

    def _identity_args(self, identity: NetworkIdentity) -> str:
        """The VM's network identity on its kernel command line (read by the guest, or by a person)."""
        args = (
            f"saline.subnet={identity.subnet_id} saline.vm={identity.vm_id} "
            f"saline.mac={identity.mac} saline.ip={identity.ip}"
        )
        if self.nat is not None:
            args += f" saline.nat_ip={self.nat.address(identity.subnet_id, identity.vm_id)}"
        return args

    def network_up(self, subnet_id: int, nodes: list[str]) -> None:
        """The vjob's private network, and the NAT network when there is one, on every node in
        `nodes` (before its VMs boot, are restored or migrate there: libvirt refuses a NIC whose
        network is missing). The NAT network is shared by every vjob: it stays on the node."""
        for node in dict.fromkeys(nodes):
            conn = self.driver.connection(node)
            if self.nat is not None:
                nat.ensure(conn, self.nat)
            network.ensure_bridge(conn, subnet_id, network.SALINE_FAMILY, host=self.driver.host(node))

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
        """Boot from the image: a new vjob, or one killed before its first safe snapshot. What
        a killed run left on the node is deleted first (`stop`), before a job disk is built."""
        self.driver.define(spec, node, job_id=job_id)
        self.driver.boot(spec.name, node)

    def checkpoint(
        self,
        members: list[tuple[str, str]],
        label: str,
        *,
        job_id: int,
        keep_running: bool,
        with_job_disk: bool = False,
        at_cut: Callable[[], object] | None = None,
    ) -> Cut:
        """One consistent cut of the vjob's VMs, left under `label` in their nodes' snapshot dirs.

        Through provisioning.coordinated, the one checkpoint path of vjob (agent, PBS hook,
        Saline): every VM is paused before any is saved, so the snapshots are one cut of the job
        whatever order the saves take. With `keep_running` (a periodic snapshot) the VMs are
        restored paused and let run together; without it (OAR's checkpoint signal) they stay
        stopped at the cut, since work done after the kept state would be lost anyway.
        `at_cut` is called while every VM is saved (the output logs' size at the cut).
        """
        coord = [Member(vm, node) for vm, node in members]
        cut = coordinated.checkpoint(self.driver, coord, job_id=job_id)
        try:
            if at_cut is not None:
                at_cut()
            for vm, node in members:
                node_files.stage(self.driver, cut.snapshots[vm], vm, node, label, keep_state=keep_running)
                if with_job_disk:  # taken at the cut, while the VM is saved: its files as its memory has them
                    node_files.copy_job_disk(self.driver, vm, node, snapshot_files(vm, label, with_job_disk=True)[-1])
        except BaseException:
            for vm, node in members:
                self.drop_staged(vm, node, label)
            if keep_running:  # the job runs on from its saved state, as before the attempt
                coordinated.restore(self.driver, coord)
            raise
        if keep_running:
            coordinated.restore(self.driver, coord)
        return cut

    def migrate(self, vm: str, src: str, dst: str) -> None:
        """Move a running VM to `dst` by migration: no work is lost and no snapshot is written.
        Live on KVM; under TCG the driver pauses the guest for the copy (seconds), because
        QEMU 7.2's live migration corrupted fast-writing TCG guests (docs/remap.md)."""
        self.driver.migrate(vm, src, dst)

    def stage_dir(self, node: str) -> Path:
        return self.driver.snapshot_dir(node)

    def restore(
        self,
        members: list[tuple[str, str]],
        label: str,
        source_dir: Path,
        host: str | None = None,
        *,
        with_job_disk: bool = False,
        expected: Mapping[str, Mapping[str, tuple[int, str]]] | None = None,
    ) -> Restored:
        """Start the vjob's VMs (vm, node) from their snapshot files in `source_dir` (a
        repository; on `host` when it is remote), as one job: every VM's files are fetched to
        its node first (over ssh when the node or the repository is another host), each
        checked where it arrived against `expected` (per VM, the digests the journal took at
        the snapshot: node_files.check_arrived), then all are restored paused and let run
        together (provisioning.coordinated), so no VM runs on, and sends to a peer still being
        restored, before the whole cut is back. The driver checks each memory state against its
        manifest too. A copy that does not match is removed from the node, nothing is started,
        and the repository's snapshot is untouched (SnapshotError)."""
        fetched = node_files.Fetched()
        try:
            for vm, node in members:
                self.driver.delete(vm, node)
                names = snapshot_files(vm, label, with_job_disk=with_job_disk)
                got = node_files.fetch(self.driver, node, source_dir, host, names)
                fetched.bytes += got.bytes
                fetched.copy_s += got.copy_s
                began = time.monotonic()
                node_files.check_arrived(self.driver, vm, node, (expected or {}).get(vm, {}))
                fetched.check_s += time.monotonic() - began
                if with_job_disk:  # where the saved domain (retargeted to this node) looks for vdb
                    disk = self.driver.job_disk_path(vm, node)
                    staged = self.driver.snapshot_dir(node) / names[-1]
                    transfer.rename(node_files.at(self.driver, node, staged), disk)
                    self.driver.own_disk(vm, node, disk)  # the QEMU user's, as define() leaves it
            back = coordinated.restore(self.driver, [Member(vm, node) for vm, node in members], label=label)
            return Restored(back, fetched)
        finally:
            for vm, node in members:
                self.drop_staged(vm, node, label)

    def drop_staged(self, vm: str, node: str, label: str) -> None:
        node_files.drop(self.driver, node, snapshot_files(vm, label, with_job_disk=True))

    def stop(self, vm: str, node: str) -> None:
        """Free the node: the VM is gone from it (its snapshot is what survives)."""
        self.driver.delete(vm, node)

    def finished(self, vm: str, node: str) -> bool:
        """The guest ran its command to the end and powered off."""
        return self.driver.state(vm, node) is VMState.STOPPED

    def console_log(self, vm: str, node: str) -> Path:
        return self.driver.console_log(vm, node)

    def output_logs(self, vm: str, node: str) -> tuple[Path, Path]:
        """A real image's VM: its COMMAND's stdout and stderr as logged on `node` (deleted with
        the VM; saline_bew.output keeps what a safe snapshot covers)."""
        return self.driver.output_logs(vm, node)

    def exit_status(self, vm: str, node: str, *, user: str) -> int | None:
        """The exit status the guest agent left on `vm`'s job disk (None: none readable), read
        as the vjob's `user` (job_disk.read_exit: root never parses a user's file system)."""
        pw = _account(user)
        scratch = safe_dirs.ensure_dir(self.driver.data_dir / "saline-work", 0o700)
        return job_disk.read_exit(self.driver.job_disk_path(vm, node), scratch, uid=pw.pw_uid, gid=pw.pw_gid)


def _account(user: str) -> pwd.struct_passwd:
    """The vjob user's account: its uid owns the job in the VMs and reads its disks."""
    try:
        return pwd.getpwnam(user)
    except KeyError:
        raise InputError(f"user = {user!r}: unknown on this machine (its uid owns the job in the VMs)") from None
