"""A saved VM moved from one node to another: its disks and memory state copied, checked on
arrival, and the source's copies removed once the VM runs at the destination.

Why checked on arrival: the copy is what QEMU reads at the destination, so it is hashed
there against what was recorded at save time; a copy that does not match is removed from the
destination and the source's snapshot is kept, so nothing is lost by a bad copy.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import libvirt

from provisioning import file_batch, integrity, transfer, vm_records
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
        bad = [state, integrity.manifest_path(state)]
        for role, path in paths.items():  # a disk both nodes share is the source's own: kept
            if not transfer.same_file(vms.endpoint(sources[role], src), vms.endpoint(path, dst)):
                bad.append(path)
        file_batch.remove_all(vms.host(dst), bad)
        raise SnapshotError(
            "restore",
            vm,
            dst,
            f"the copy from node {src} does not match the snapshot recorded at save time ({exc}); "
            f"refused and removed from {dst}, the snapshot on {src} is kept",
        ) from None


ROUND_TRIPS_REMOTE_SOURCE = 6
"""ssh sessions of `copy_checked` from another host to this machine, job disk and logs
included: the source's files asked about at once, the manifest read, the overlay, the job
disk, both logs (one rsync) and the state; hashed here on arrival. It was 12 (a `test -e`
per optional file, a `stat` per copy's timeout, an rsync per file): tests/test_saved_move_round_trips.py."""


def _copy_between(vms: VMLifecycle, vm: str, src: str, dst: str, disks_arrived: Callable[[], None]) -> None:
    """Overlay and job disk, then (after `disks_arrived`, which may refuse them) the logs, the
    manifest and the state.

    Which of the VM's files the source holds, and their sizes (each copy's timeout grows with
    its size), are asked once for all of them (`file_batch.found`); the two logs travel in one
    rsync; the manifest is written from the text read on the source instead of copied."""
    method = vms.config.copy_method
    host_src, host_dst = vms.host(src), vms.host(dst)
    state_src, state_dst = vms.state_path(vm, src), vms.state_path(vm, dst)
    overlay_src, job_src = vms.overlay_path(vm, src), vms.job_disk_path(vm, src)
    logs = list(zip(vms.output_logs(vm, src), vms.output_logs(vm, dst), strict=True))
    asked = [overlay_src, job_src, *(s for s, _ in logs), state_src]
    sizes = dict(zip(asked, file_batch.found(host_src, [(p, False) for p in asked]), strict=True))

    def timeout(path: Path) -> float:
        got = sizes[path]
        return vms.config.operation_timeout_for((got[0] if got else 0) / 2**20)

    # the overlay is copied even when the source says it is missing: the copy's error names it
    transfer.copy(
        Endpoint(overlay_src, host_src),
        Endpoint(vms.overlay_path(vm, dst), host_dst),
        method=method,
        timeout_s=timeout(overlay_src),
    )
    vms.own_disk(vm, dst)
    if sizes[job_src] is not None:
        job_dst = vms.job_disk_path(vm, dst)
        transfer.copy(
            Endpoint(job_src, host_src), Endpoint(job_dst, host_dst), method=method, timeout_s=timeout(job_src)
        )
        vms.own_disk(vm, dst, job_dst)
    disks_arrived()
    _copy_output_logs(vms, [(s, d) for s, d in logs if sizes[s] is not None], host_src, host_dst)
    manifest_src, manifest_dst = integrity.manifest_path(state_src), integrity.manifest_path(state_dst)
    text = transfer.read_text(Endpoint(manifest_src, host_src))
    if text is None:  # none there: the copy fails naming it, as it always did
        transfer.copy(Endpoint(manifest_src, host_src), Endpoint(manifest_dst, host_dst), method=method)
    else:
        transfer.write_text(Endpoint(manifest_dst, host_dst), text, mode=0o600)
    state = Endpoint(state_src, host_src)
    transfer.copy(state, Endpoint(state_dst, host_dst), method=method, timeout_s=timeout(state_src))


def _copy_output_logs(
    vms: VMLifecycle, logs: list[tuple[Path, Path]], host_src: str | None, host_dst: str | None
) -> None:
    """The job's stdout and stderr so far (the serial logs QEMU appends to): the pilot replays
    them from the start into the RMS's output file, which a requeue truncated. On one machine
    they were the same files; between hosts without them the lines before the cut were lost
    (issue 38). Not checked against a digest: they are the job's output, not what QEMU runs.
    Both in one call when they keep their names in one directory (they always do)."""
    method, timeout = vms.config.copy_method, vms.config.operation_timeout_s
    if logs and all(s.name == d.name and d.parent == logs[0][1].parent for s, d in logs):
        sources = [Endpoint(s, host_src) for s, _ in logs]
        transfer.copy_into(sources, Endpoint(logs[0][1].parent, host_dst), method=method, timeout_s=timeout)
        return
    for log_src, log_dst in logs:
        transfer.copy(Endpoint(log_src, host_src), Endpoint(log_dst, host_dst), method=method, timeout_s=timeout)


def drop_source(vms: VMLifecycle, vm: str, src: str, dst: str) -> None:
    """After a resume elsewhere: the source forgets the VM (definition, overlay, state)."""
    dom = vms.domain(vm, src)
    if dom is not None and not vms.active(dom) and dom.isPersistent():
        vms.call("cleanup", vm, src, lambda: dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE))
    host_src, host_dst = vms.host(src), vms.host(dst)
    gone: list[Path] = []  # removed in one ssh round trip for another host
    overlay_src = Endpoint(vms.overlay_path(vm, src), host_src)
    if not transfer.same_file(overlay_src, Endpoint(vms.overlay_path(vm, dst), host_dst)):
        # its logs too (the job's output among them): a node-local directory would keep every
        # moved VM's (found on two hosts sharing nothing, issue 38)
        gone += [overlay_src.path, vms.job_disk_path(vm, src), vms.console_log(vm, src), *vms.output_logs(vm, src)]
    state_src = Endpoint(vms.state_path(vm, src), host_src)
    if not transfer.same_file(state_src, Endpoint(vms.state_path(vm, dst), host_dst)):
        vm_records.forget_snapshot(vms.store, state_src.path, src)
        gone += [state_src.path, integrity.manifest_path(state_src.path)]
    file_batch.remove_all(host_src, gone)
