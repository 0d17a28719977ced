"""A running VM migrated by libvirt from one node to another, its disks copied when the nodes
share no VM directory.

Why live on KVM but paused under TCG: on QEMU 7.2 a TCG guest that writes its memory fast
came out of a live migration with memory corrupted — its kernel crashed right after — in 14
of 28 runs at load 2–15 (a swapping guest, and a guest only rewriting a file in RAM, no swap,
no balloon), and in none of 109 paused (docs/remap.md, "The migration defect"). The pause
lasts as long as the copy (seconds for a few hundred MiB).

The disks: where both nodes see the VM's overlay as one file (a shared `vm_dir`, found by a
probe file: `shares_disks`) only the memory travels. Otherwise the overlay and the job disk go
too (the OS image under the overlay is at the same path on every node: `vjob image
distribute`):
- paused (TCG): the VM is paused first — QEMU flushes its block caches when it stops — so its
  disks do not change until it runs at the destination; they are hashed at the source, copied
  with the copy method, hashed again where they arrived and compared (as a saved VM's move,
  saved_move.copy_checked), and only then is the memory sent. A copy that differs is removed
  from the destination and the VM runs on at the source, as if nothing had been tried.
- live (KVM): libvirt's non-shared-storage migration (VIR_MIGRATE_NON_SHARED_INC): empty
  disks of the same size are made at the destination first (the overlay over the image there)
  and QEMU mirrors the top layers over NBD while the guest runs. Never run here: /dev/kvm is
  unusable on this machine, and TCG migrates paused.
Once the VM runs at the destination, the source's copies are removed: its disks are there only.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import libvirt

from provisioning import domain_xml as domxml
from provisioning import integrity, op_timeouts, transfer, vm_records
from provisioning.transfer import Endpoint
from provisioning.vm_lifecycle import VMLifecycle
from provisioning.vm_types import DriverError, SnapshotError
from vjob import log, proc
from vjob.errors import InputError, VjobError
from vjob.model import VMState

_log = log.get("provisioning")

_FLAGS = libvirt.VIR_MIGRATE_PERSIST_DEST | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE | libvirt.VIR_MIGRATE_UNSAFE
"""Always: the VM stays defined at the destination only. UNSAFE: libvirt would refuse a disk
with host caching on storage it does not know to be shared; ours is shared (one file) or was
copied while the VM was paused, or is mirrored by QEMU (live)."""


def migrate(vms: VMLifecycle, vm: str, src: str, dst: str, *, live: bool | None) -> bool:
    """Migrate a running VM from `src` to `dst` (Driver.migrate); whether the copy was live."""
    if src == dst:
        raise InputError(f"migrate VM {vm}: source and destination are both {src}")
    dst_dom = vms.domain(vm, dst)
    if dst_dom is not None and vms.active(dst_dom):
        src_dom = vms.domain(vm, src)
        if src_dom is not None and not vms.active(src_dom) and src_dom.isPersistent():
            vms.call("migrate", vm, src, src_dom.undefine)
        return False  # already there
    dom = vms.require_domain("migrate", vm, src)
    if not vms.active(dom):
        raise DriverError("migrate", vm, src, "the VM is not running (resume it instead)")
    if live is None:
        live = vms.call("migrate", vm, src, lambda: domxml.domain_type(dom.XMLDesc(0))) != "qemu"
    if vms.is_test(src) or shares_disks(vms, vm, src, dst):
        _send_memory(vms, vm, src, dst, dom, (libvirt.VIR_MIGRATE_LIVE if live else 0) | _FLAGS)
    elif live:
        _migrate_mirroring(vms, vm, src, dst, dom)
    else:
        _migrate_copying(vms, vm, src, dst, dom)
    vm_records.update_vm(vms.store, vm, node=dst, state=VMState.RUNNING)
    _log.info("vm migrated", vm=vm, source=src, destination=dst, live=live)
    return live


def shares_disks(vms: VMLifecycle, vm: str, src: str, dst: str) -> bool:
    """Whether `dst` sees the VM's overlay on `src` as its own (one path, one filesystem): a
    probe file made beside it on `src` is there on `dst`."""
    here, there = vms.endpoint(vms.overlay_path(vm, src), src), vms.endpoint(vms.overlay_path(vm, dst), dst)
    if transfer.same_file(here, there):
        return True
    if here.path != there.path:
        return False
    probe = here.path.with_name(f".vjob-shared-{os.getpid()}-{threading.get_ident()}")
    transfer.write_text(Endpoint(probe, here.host), "")
    try:
        return transfer.exists(Endpoint(probe, there.host))
    finally:
        transfer.remove(Endpoint(probe, here.host))


def _send_memory(
    vms: VMLifecycle, vm: str, src: str, dst: str, dom: libvirt.virDomain, flags: int, xml: str | None = None
) -> None:
    """libvirt's migration of the running domain (memory, and disks when `flags` say so)."""
    dconn = vms.connection(dst)
    uri = vms.config.migrate_uris.get(dst)
    timeout = op_timeouts.for_domain(vms.config, dom)  # grows with the VM's memory (vjob.save_time)
    vms.call(
        "migrate", vm, src, lambda: dom.migrate(dconn, flags, xml, uri, 0), on_timeout=dom.abortJob, timeout_s=timeout
    )


def _migrate_copying(vms: VMLifecycle, vm: str, src: str, dst: str, dom: libvirt.virDomain) -> None:
    """Paused: the disks copied and checked on `dst`, then the memory; on any failure the
    copies on `dst` are removed and the VM runs on at `src` (paused again if it was)."""
    was_paused = dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED
    vms.pause(vm, src)  # QEMU's `stop` flushes its block caches: the files are the disks now
    sent: list[Endpoint] = []
    try:
        vms.ensure_dirs(dst)
        moved = _copy_disks_checked(vms, vm, src, dst, sent)
        xml = vms.call("migrate", vm, src, lambda: dom.XMLDesc(libvirt.VIR_DOMAIN_XML_MIGRATABLE))
        _send_memory(vms, vm, src, dst, dom, _FLAGS | libvirt.VIR_MIGRATE_PAUSED, _retarget(vms, vm, dst, xml))
    except BaseException:
        _back_to_source(vms, vm, src, dst, sent, was_paused)
        raise
    if not was_paused:
        vms.unpause(vm, dst)
    _drop_source_disks(vms, vm, src, dst, moved)
    _log.info("vm disks moved", vm=vm, source=src, destination=dst, bytes=sum(m["size_bytes"] for m in moved.values()))


def _copy_disks_checked(
    vms: VMLifecycle, vm: str, src: str, dst: str, sent: list[Endpoint]
) -> dict[str, dict[str, Any]]:
    """The paused VM's overlay and job disk, hashed on `src`, copied to `dst` (each appended to
    `sent` before its copy starts) and checked there; their digests by role."""
    sources, targets = vms.disk_paths(vm, src), vms.disk_paths(vm, dst)
    digests = integrity.disk_digests(sources, vms.host(src))
    if "overlay" not in digests:
        raise DriverError("migrate", vm, src, f"its overlay {sources['overlay']} is not there")
    for role in digests:
        origin, target = vms.endpoint(sources[role], src), vms.endpoint(targets[role], dst)
        sent.append(target)
        timeout = op_timeouts.for_file(vms.config, origin)
        transfer.copy(origin, target, method=vms.config.copy_method, timeout_s=timeout)
        vms.own_disk(vm, dst, targets[role])
    try:
        integrity.check_disks(vm, dst, digests, targets, vms.host(dst))
    except SnapshotError as exc:
        raise DriverError(
            "migrate",
            vm,
            dst,
            f"the disks copied from {src} do not match the source's ({exc}); removed from {dst}, "
            f"the VM runs on at {src}",
        ) from None
    return digests


def _retarget(vms: VMLifecycle, vm: str, dst: str, xml: str) -> str | None:
    """The running domain's XML with `dst`'s disk and log paths (None: they are the same)."""
    return domxml.retarget(
        xml,
        overlay=vms.overlay_path(vm, dst),
        console_log=vms.console_log(vm, dst),
        job_disk=vms.job_disk_path(vm, dst),
        output_logs=vms.output_logs(vm, dst),
    )


def _back_to_source(vms: VMLifecycle, vm: str, src: str, dst: str, sent: list[Endpoint], was_paused: bool) -> None:
    """A failed disk-copying migration undone: the copies on `dst` removed (unless the VM runs
    there after all: a timeout that came as libvirt finished), the VM running at `src` again."""
    there = vms.domain(vm, dst)
    if there is not None and vms.active(there):
        return
    for target in sent:
        try:
            transfer.remove(target)
        except VjobError as exc:
            _log.warning("cannot remove a disk copy", vm=vm, node=dst, path=str(target.path), error=str(exc)[:300])
    here = vms.domain(vm, src)
    if not was_paused and here is not None and vms.active(here):
        vms.unpause(vm, src)


def _drop_source_disks(vms: VMLifecycle, vm: str, src: str, dst: str, moved: dict[str, Any]) -> None:
    """The source's copies of the disks now used at `dst` removed: the VM's disks are there only."""
    sources, targets = vms.disk_paths(vm, src), vms.disk_paths(vm, dst)
    for role in moved:
        origin = vms.endpoint(sources[role], src)
        if not transfer.same_file(origin, vms.endpoint(targets[role], dst)):
            transfer.remove(origin)


def _migrate_mirroring(vms: VMLifecycle, vm: str, src: str, dst: str, dom: libvirt.virDomain) -> None:
    """Live, disks not shared (KVM): empty disks of the same sizes made on `dst` (the overlay
    over the same image), then libvirt's migration with QEMU mirroring the disks' top layers
    (VIR_MIGRATE_NON_SHARED_INC). Not run on this machine (no usable /dev/kvm)."""
    sources, targets = vms.disk_paths(vm, src), vms.disk_paths(vm, dst)
    made: list[Endpoint] = []
    try:
        vms.ensure_dirs(dst)
        for role, path in sources.items():
            if transfer.exists(vms.endpoint(path, src)):
                made.append(vms.endpoint(targets[role], dst))
                _make_empty_like(vms, vm, src, dst, path, targets[role])
        xml = vms.call("migrate", vm, src, lambda: dom.XMLDesc(libvirt.VIR_DOMAIN_XML_MIGRATABLE))
        flags = _FLAGS | libvirt.VIR_MIGRATE_LIVE | libvirt.VIR_MIGRATE_NON_SHARED_INC
        _send_memory(vms, vm, src, dst, dom, flags, _retarget(vms, vm, dst, xml))
    except BaseException:
        _back_to_source(vms, vm, src, dst, made, was_paused=True)
        raise
    _drop_source_disks(vms, vm, src, dst, {role: {} for role in sources})


def _make_empty_like(vms: VMLifecycle, vm: str, src: str, dst: str, path: Path, target: Path) -> None:
    """On `dst`, a qcow2 of the virtual size of `path` on `src`, over the same backing file."""
    timeout = vms.config.operation_timeout_s
    info_cmd = ["qemu-img", "info", "-U", "--output=json", str(path)]
    host = vms.host(src)
    raw = transfer.run_on(host, info_cmd, timeout_s=timeout) if host else _local(info_cmd, timeout)
    info = json.loads(raw)
    create = ["qemu-img", "create", "-q", "-f", "qcow2"]
    if info.get("backing-filename"):
        create += ["-F", str(info.get("backing-filename-format", "qcow2")), "-b", str(info["full-backing-filename"])]
    create += [str(target), str(int(info["virtual-size"]))]
    there = vms.host(dst)
    transfer.run_on(there, create, timeout_s=timeout) if there else _local(create, timeout)
    vms.own_disk(vm, dst, target)


def _local(argv: list[str], timeout_s: float) -> str:
    return proc.run(argv, timeout_s=timeout_s)
