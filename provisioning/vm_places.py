"""Where a node's VM files are, and who owns them: the driver's map of the nodes it serves.

Why apart from the libvirt calls: every path here follows from the configuration alone
(`vm_dir`, `snapshot_dir`, `hosts`, `copy_method`), so the places can be named, created and
handed to another machine's ssh without opening a libvirt connection.

Files of a node whose `host` is another machine are reached over ssh (`transfer.Endpoint`);
the same paths hold on every node, which is what lets a saved VM move between them.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from provisioning import safe_dirs, transfer
from provisioning.transfer import Endpoint
from provisioning.vm_types import STATE_SUFFIX, DriverError, check_name
from vjob.config import ProvisioningConfig


class VMPlaces:
    """The VM and snapshot directories of each node, and the files of each VM in them."""

    def __init__(self, config: ProvisioningConfig, *, data_dir: Path) -> None:
        self.config = config
        self.data_dir = Path(data_dir)

    def uri(self, node: str) -> str:
        check_name("node", node)
        return self.config.nodes.get(node, self.config.default_uri)

    def is_test(self, node: str) -> bool:
        """Whether `node` is served by libvirt's test driver (no QEMU, no files of its own)."""
        return self.uri(node).startswith("test:")

    def host(self, node: str) -> str | None:
        """ssh host of `node` for its files, None when they are on this machine.

        None when the copy method is local (one filesystem) or when `hosts` maps the node to ""
        (the node the driver runs on, e.g. the pilot's own node); otherwise every file of the
        node (states, manifests, overlays) is read, hashed and renamed over ssh on that host.
        """
        if self.config.copy_method == "local":
            return None
        return self.config.hosts.get(node, node) or None

    def endpoint(self, path: Path, node: str) -> Endpoint:
        """`path` on `node`'s machine."""
        return Endpoint(path, self.host(node))

    def _dir(self, configured: str, default: str, node: str) -> Path:
        raw = configured or str(self.data_dir / default)
        return Path(raw.replace("{node}", check_name("node", node)))

    def vm_dir(self, node: str) -> Path:
        return self._dir(self.config.vm_dir, "vms", node)

    def snapshot_dir(self, node: str) -> Path:
        return self._dir(self.config.snapshot_dir, "snapshots", node)

    def overlay_path(self, vm: str, node: str) -> Path:
        return self.vm_dir(node) / f"{check_name('vm', vm)}.qcow2"

    def console_log(self, vm: str, node: str) -> Path:
        return self.vm_dir(node) / f"{check_name('vm', vm)}.console.log"

    def job_disk_path(self, vm: str, node: str) -> Path:
        """The VM's job disk (provisioning.job_disk): a real job's files, part of the VM."""
        return self.vm_dir(node) / f"{check_name('vm', vm)}.job.qcow2"

    def output_logs(self, vm: str, node: str) -> tuple[Path, Path]:
        """Where the guest's second and third serial ports (the job's stdout, stderr) are logged."""
        base = self.vm_dir(node) / check_name("vm", vm)
        return base.with_name(base.name + ".stdout.log"), base.with_name(base.name + ".stderr.log")

    def disk_paths(self, vm: str, node: str) -> dict[str, Path]:
        """The VM's disks on `node` by role (integrity.DISK_ROLES): what moves with its state."""
        return {"overlay": self.overlay_path(vm, node), "job_disk": self.job_disk_path(vm, node)}

    def state_path(self, vm: str, node: str) -> Path:
        return self.snapshot_dir(node) / f"{check_name('vm', vm)}{STATE_SUFFIX}"

    def ensure_dirs(self, node: str) -> None:
        """Create or check the node's VM and snapshot directories: ours only (safe_dirs), since
        root writes users' overlays and memory states there and restores VMs from them."""
        if self.host(node) is not None:
            transfer.ensure_remote_dir(self.endpoint(self.vm_dir(node), node), 0o711)
            transfer.ensure_remote_dir(self.endpoint(self.snapshot_dir(node), node), 0o700)
            return
        vm_dir = safe_dirs.ensure_dir(self.vm_dir(node), 0o711)
        vm_dir.chmod(0o711)  # QEMU (libvirt-qemu) must traverse it; nobody may list it
        snap = safe_dirs.ensure_dir(self.snapshot_dir(node), 0o700)
        snap.chmod(0o700)

    def own_disk(self, vm: str, node: str, disk: Path | None = None) -> None:
        """Give the VM's overlay (or `disk`) to the QEMU user, 0600, and keep libvirt from
        relabelling it.

        Why: with dynamic ownership, the libvirtd a VM leaves restores the file's original
        owner after a migration or a save, while the QEMU on the other node still has to
        reopen it: "Permission denied" at resume, or a failed save later. A fixed owner and
        `relabel='no'` on the disk make every node agree.
        """
        if self.is_test(node) or (self.host(node) is None and os.geteuid() != 0):
            return  # a user's own libvirt (qemu:///session): QEMU runs as the user, who owns the disk
        overlay = disk or self.overlay_path(vm, node)
        host = self.host(node)
        user = self.config.qemu_user
        if host is None:
            try:
                pw = pwd.getpwnam(user)
            except KeyError:
                raise DriverError("define", vm, node, f"qemu_user {user!r} does not exist on this machine") from None
            os.chown(overlay, pw.pw_uid, pw.pw_gid)
            overlay.chmod(0o600)
        else:
            transfer.run_on(host, ["chown", f"{user}:", str(overlay)], timeout_s=60)
