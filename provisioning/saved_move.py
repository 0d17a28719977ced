"""A saved VM moved from one node to another: its disks and memory state copied, checked on
arrival, and the source's copies removed once the VM runs at the destination.

Why checked on arrival: the copy is what QEMU reads at the destination, so it is hashed
there against what was recorded at save time; a copy that does not match is removed from the
destination and the source's snapshot is kept, so nothing is lost by a bad copy.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import libvirt

from provisioning import integrity, op_timeouts, transfer, vm_records
from provisioning.transfer import Endpoint
from provisioning.vm_lifecycle import VMLifecycle
from provisioning.vm_types import Snapshot, SnapshotError
from vjob import log

_log = log.get("provisioning")


def copy_checked(
    vms: VMLifecycle, vm: str, src: str, dst: str, expected: Snapshot, disks: dict[str, dict[str, Any]]
) -> None:
    """Copy the saved VM from `src` to `dst`. The state copied must be the one recorded at
    save time (size + sha256, hashed on `dst`), and so must its overlay and job disk when
    their digests were recorded (`disks`; checked as soon as they arrive, before the state
    is sent); otherwise the copies are removed there and the restore refused, and the
    source's snapshot stays where it is."""
    state = vms.state_path(vm, dst)
    paths, sources = vms.disk_paths(vm, dst), vms.disk_paths(vm, src)
    t0 = time.monotonic()
    try:
        _copy_between(vms, vm, src, dst, lambda: integrity.check_disks(vm, dst, disks, paths, vms.host(dst)))
        integrity.check_against(
            vm, dst, state, {"size_bytes": expected.size_bytes, "sha256": expected.sha256}, vms.host(dst)
        )
        # what a move between hosts costs before QEMU restores (docs/multinode.md, "Two hosts")
        _log.info("saved vm copied and checked", vm=vm, source=src, node=dst, seconds=round(time.monotonic() - t0, 3))
    except SnapshotError as exc:
        transfer.remove(vms.endpoint(state, dst))
        transfer.remove(vms.endpoint(integrity.manifest_path(state), dst))
        for role, path in paths.items():  # a disk both nodes share is the source's own: kept
            if not transfer.same_file(vms.endpoint(sources[role], src), vms.endpoint(path, dst)):
                transfer.remove(vms.endpoint(path, dst))
        raise SnapshotError(
            "restore",
            vm,
            dst,
            f"the copy from node {src} does not match the snapshot recorded at save time ({exc}); "
            f"refused and removed from {dst}, the snapshot on {src} is kept",
        ) from None


def _copy_between(vms: VMLifecycle, vm: str, src: str, dst: str, disks_arrived: Callable[[], None]) -> None:
    """Overlay and job disk, then (after `disks_arrived`, which may refuse them) the state."""
    method = vms.config.copy_method
    timeout = vms.config.operation_timeout_s
    state_src, state_dst = vms.state_path(vm, src), vms.state_path(vm, dst)
    overlay_src = Endpoint(vms.overlay_path(vm, src), vms.host(src))
    transfer.copy(
        overlay_src,
        Endpoint(vms.overlay_path(vm, dst), vms.host(dst)),
        method=method,
        timeout_s=op_timeouts.for_file(vms.config, overlay_src),  # each copy's grows with its size
    )
    vms.own_disk(vm, dst)
    job_src = Endpoint(vms.job_disk_path(vm, src), vms.host(src))
    if transfer.exists(job_src):
        job_dst = vms.job_disk_path(vm, dst)
        job_timeout = op_timeouts.for_file(vms.config, job_src)
        transfer.copy(job_src, Endpoint(job_dst, vms.host(dst)), method=method, timeout_s=job_timeout)
        vms.own_disk(vm, dst, job_dst)
    disks_arrived()
    _copy_output_logs(vms, vm, src, dst)
    transfer.copy(
        Endpoint(integrity.manifest_path(state_src), vms.host(src)),
        Endpoint(integrity.manifest_path(state_dst), vms.host(dst)),
        method=method,
        timeout_s=timeout,
    )
    state = Endpoint(state_src, vms.host(src))
    state_timeout = op_timeouts.for_file(vms.config, state)
    transfer.copy(state, Endpoint(state_dst, vms.host(dst)), method=method, timeout_s=state_timeout)


def _copy_output_logs(vms: VMLifecycle, vm: str, src: str, dst: str) -> None:
    """The job's stdout and stderr so far (the serial logs QEMU appends to): the pilot replays
    them from the start into the RMS's output file, which a requeue truncated. On one machine
    they were the same files; between hosts without them the lines before the cut were lost
    (issue 38). Not checked against a digest: they are the job's output, not what QEMU runs."""
    timeout = vms.config.operation_timeout_s
    for log_src, log_dst in zip(vms.output_logs(vm, src), vms.output_logs(vm, dst), strict=True):
        source = Endpoint(log_src, vms.host(src))
        if transfer.exists(source):
            transfer.copy(source, Endpoint(log_dst, vms.host(dst)), method=vms.config.copy_method, timeout_s=timeout)


def drop_source(vms: VMLifecycle, vm: str, src: str, dst: str) -> None:
    """After a resume elsewhere: the source forgets the VM (definition, overlay, state)."""
    dom = vms.domain(vm, src)
    if dom is not None and not vms.active(dom) and dom.isPersistent():
        vms.call("cleanup", vm, src, lambda: dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE))
    host_src, host_dst = vms.host(src), vms.host(dst)
    overlay_src = Endpoint(vms.overlay_path(vm, src), host_src)
    if not transfer.same_file(overlay_src, Endpoint(vms.overlay_path(vm, dst), host_dst)):
        transfer.remove(overlay_src)
        transfer.remove(Endpoint(vms.job_disk_path(vm, src), host_src))
        # its logs too (the job's output among them): a node-local directory would keep every
        # moved VM's (found on two hosts sharing nothing, issue 38)
        for log_path in (vms.console_log(vm, src), *vms.output_logs(vm, src)):
            transfer.remove(Endpoint(log_path, host_src))
    state_src = Endpoint(vms.state_path(vm, src), host_src)
    if not transfer.same_file(state_src, Endpoint(vms.state_path(vm, dst), host_dst)):
        vm_records.forget_snapshot(vms.store, state_src.path, src)
        transfer.remove(state_src)
        transfer.remove(Endpoint(integrity.manifest_path(state_src.path), host_src))
