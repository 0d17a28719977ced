"""A VM's disks put in place on its node: the overlay over the OS image, and the job disk.

Why apart from the life cycle: these are file operations (qemu-img, copies over ssh, checks
on arrival), not libvirt calls; `define` uses them, and so does the pilot that builds a job
disk here for a member VM another node's pilot defines (`place_job_disk`).

The overlay is created on the node that runs the VM, over the image at the same path there
(`vjob image distribute` put it there). The job disk is built on this machine by the pilot;
it goes to the node by rsync/scp and is checked there against what was built.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from provisioning import integrity, transfer
from provisioning.transfer import Endpoint
from provisioning.vm_places import VMPlaces
from provisioning.vm_types import DriverError, SnapshotError, VMSpec
from vjob import proc


def qemu_img(args: list[str], vm: str, timeout_s: float = 120.0) -> str:
    """Run qemu-img on this machine for `vm` (its errors name the VM)."""
    return proc.run(["qemu-img", *args], timeout_s=timeout_s, job=f"VM {vm}")


def create_overlay(places: VMPlaces, spec: VMSpec, node: str) -> None:
    """The overlay of `spec` created on `node`'s machine (once), over its image."""
    host = places.host(node)
    if host is not None:
        _create_remote_overlay(places, spec, node, host)
        return
    overlay = places.overlay_path(spec.name, node)
    if overlay.exists():
        return
    if not spec.image.is_file():
        raise DriverError("define", spec.name, node, f"image {spec.image} does not exist")
    image = str(spec.image.resolve())
    qemu_img(["create", "-q", "-f", "qcow2", "-F", spec.image_format, "-b", image, str(overlay)], spec.name)
    overlay.chmod(0o600)
    places.own_disk(spec.name, node)


def _create_remote_overlay(places: VMPlaces, spec: VMSpec, node: str, host: str) -> None:
    """The overlay of `spec` created on `host` (once), over the image at the same path there."""
    overlay = Endpoint(places.overlay_path(spec.name, node), host)
    if transfer.exists(overlay):
        return
    image = spec.image.resolve() if spec.image.exists() else spec.image
    if not transfer.exists(Endpoint(image, host)):
        raise DriverError("define", spec.name, node, f"image {image} does not exist on {host} (vjob image distribute)")
    tmp = overlay.path.with_name(overlay.path.name + ".part")
    timeout = places.config.operation_timeout_s
    create = ["qemu-img", "create", "-q", "-f", "qcow2", "-F", spec.image_format, "-b", str(image), str(tmp)]
    transfer.run_on(host, create, timeout_s=timeout)
    transfer.rename(Endpoint(tmp, host), overlay.path, mode=0o600, timeout_s=timeout)
    places.own_disk(spec.name, node)


def attach_job_disk(places: VMPlaces, spec: VMSpec, node: str) -> None:
    """The job disk of `spec` (when it has one) where `node`'s VM reads it, owned by QEMU."""
    if spec.job_disk is None:
        return
    if spec.job_disk != places.job_disk_path(spec.name, node):
        raise DriverError("define", spec.name, node, f"job disk {spec.job_disk}: not in the VM dir")
    host = places.host(node)
    if host is not None:
        send_job_disk(places, spec.name, node, spec.job_disk, host)
    elif not spec.job_disk.is_file():
        raise DriverError("define", spec.name, node, f"job disk {spec.job_disk}: missing")
    places.own_disk(spec.name, node, spec.job_disk)


def place_job_disk(places: VMPlaces, vm: str, node: str) -> dict[str, Any]:
    """The job disk built here for `node`'s VM, put where that node's own pilot defines the
    VM (a per-node job's member whose node lacks the working directory): sent and checked
    on arrival as `define` does, or left here when the node shares this VM directory. Its
    size and sha256 as built, for that pilot to check once more before using it."""
    disk = places.job_disk_path(vm, node)
    if not disk.is_file():
        raise DriverError("define", vm, node, f"job disk {disk}: missing")
    built: dict[str, Any] = {"size_bytes": disk.stat().st_size, "sha256": transfer.sha256_file(disk)}
    host = places.host(node)
    if host is not None:
        places.ensure_dirs(node)
        send_job_disk(places, vm, node, disk, host, built)
    return built


def send_job_disk(
    places: VMPlaces, vm: str, node: str, disk: Path, host: str, built: dict[str, Any] | None = None
) -> None:
    """Send the job disk the pilot built here to `node`'s host and check it there.

    Why checked: it holds the job's files and goes to another machine by rsync/scp; the
    copy must have the size and sha256 of what was built, or the VM is not defined (the
    copy is removed there, the disk here kept for another try). Once it arrived, the copy
    here is removed: the node's is the VM's disk from now on. A vm_dir the node shares
    with this machine (seen there under the same path) needs nothing sent, and the disk is
    not removed, being the node's own.
    """
    remote = Endpoint(disk, host)
    if not disk.is_file():
        if transfer.exists(remote):
            return  # sent by an earlier call
        raise DriverError("define", vm, node, f"job disk {disk}: missing")
    if shares_dir(disk.parent, host):
        return
    built = built or {"size_bytes": disk.stat().st_size, "sha256": transfer.sha256_file(disk)}
    config = places.config
    transfer.copy(Endpoint(disk), remote, method=config.copy_method, timeout_s=config.operation_timeout_s)
    try:
        integrity.check_against(vm, node, disk, built, host)
    except SnapshotError as exc:
        transfer.remove(remote)
        raise DriverError(
            "define",
            vm,
            node,
            f"the job disk sent to {host} does not match the one built ({exc}); "
            f"removed from {host}, the job disk here is kept",
        ) from None
    disk.unlink()


def shares_dir(directory: Path, host: str) -> bool:
    """Whether `host` sees this machine's `directory` (one filesystem): a file made here is there."""
    probe = directory / f".vjob-shared-{os.getpid()}-{threading.get_ident()}"
    probe.touch(mode=0o600)
    try:
        return transfer.exists(Endpoint(probe, host))
    finally:
        probe.unlink(missing_ok=True)
