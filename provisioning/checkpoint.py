"""A VM suspended to disk and resumed: its memory state saved, described, checked, restored.

Why a state is described and checked: it holds a user's memory and a restore starts QEMU
from it, so it is written owner-only (0600 in a 0700 directory), gets a manifest beside it
(size, sha256, and the digests of its disks) and, when a store is given, a row in
`snapshots`. A restore checks the file against both first; a missing or altered file is a
clear error and the VM is not started from a broken state (UBIS III.D, Saline 3.1).

Every verb is idempotent: a save repeated on a VM already saved returns its snapshot, a
restore repeated on a VM already running only finishes the cleanup.
"""

from __future__ import annotations

from pathlib import Path

import libvirt

from provisioning import domain_xml as domxml
from provisioning import integrity, op_timeouts, save_hash, saved_move, transfer, vm_records
from provisioning.transfer import Endpoint
from provisioning.vm_lifecycle import VMLifecycle
from provisioning.vm_types import DriverError, Snapshot, SnapshotError
from vjob import log
from vjob.model import VMState
from vjob.store.db import now

_log = log.get("provisioning")


def save(vms: VMLifecycle, vm: str, node: str, *, job_id: int | None, bypass_cache: bool, with_disks: bool) -> Snapshot:
    """Suspend the VM to disk (Driver.save): memory state to the snapshot dir, overlay kept."""
    vms.ensure_dirs(node)
    path = vms.state_path(vm, node)
    partial = path.with_name(path.name + ".part")
    dom = vms.domain(vm, node)
    hashed: tuple[int, str] | None = None
    followed = False
    if dom is not None and vms.active(dom):
        hashed, followed = _save_running(vms, dom, vm, node, path, bypass_cache)
    elif not transfer.exists(vms.endpoint(path, node)):
        if dom is not None and transfer.exists(vms.endpoint(partial, node)) and _save_image_ok(vms, partial, node):
            transfer.rename(vms.endpoint(partial, node), path)  # the agent died between libvirt's save and the rename
        else:
            raise DriverError("save", vm, node, "the VM is not running and has no saved state")
    disks = vms.disk_paths(vm, node) if with_disks else None
    snap = describe(vms, vm, node, "memory", path, None, job_id, disks=disks, hashed=hashed)
    vm_records.update_vm(vms.store, vm, state=VMState.SAVED)
    _log.info("vm saved", vm=vm, node=node, bytes=snap.size_bytes, path=str(path), hashed_while_written=followed)
    return snap


def _save_running(
    vms: VMLifecycle, dom: libvirt.virDomain, vm: str, node: str, path: Path, bypass_cache: bool
) -> tuple[tuple[int, str] | None, bool]:
    """libvirt's save of the running `dom` to `path` (through `path`.part, renamed once whole):
    the file's (size, sha256) when it was hashed while written, and whether it was."""
    partial = path.with_name(path.name + ".part")
    flags = libvirt.VIR_DOMAIN_SAVE_RUNNING | (libvirt.VIR_DOMAIN_SAVE_BYPASS_CACHE if bypass_cache else 0)
    if vms.is_test(node):
        flags = 0  # libvirt's test driver accepts no save flags
    hashed: tuple[int, str] | None = None
    followed = False
    # Hashed while libvirt writes it (save_hash), on this machine's files and through the
    # page cache only: with BYPASS_CACHE reading it back would fill the cache it bypasses.
    follower = None
    if vms.host(node) is None and not bypass_cache:
        partial.unlink(missing_ok=True)  # an earlier failed save's: the follower must see libvirt's new file
        follower = save_hash.FollowingHash(partial)
    try:
        timeout = op_timeouts.for_domain(vms.config, dom)  # grows with the VM's memory (vjob.save_time)
        vms.call(
            "save",
            vm,
            node,
            lambda: dom.saveFlags(str(partial), None, flags),
            on_timeout=dom.abortJob,
            timeout_s=timeout,
        )
        transfer.rename(vms.endpoint(partial, node), path, mode=0o600)
        if follower is not None:
            hashed, followed = follower.finish(path), follower.followed
    finally:
        if follower is not None:
            follower.abandon()  # after finish: nothing left to stop; after a failure: the reader stops
    transfer.remove(vms.endpoint(partial, node))
    # an older manifest does not describe this file
    transfer.remove(vms.endpoint(integrity.manifest_path(path), node))
    return hashed, followed


def _save_image_ok(vms: VMLifecycle, path: Path, node: str) -> bool:
    conn = vms.connection(node)
    try:
        conn.saveImageGetXMLDesc(str(path), 0)
    except libvirt.libvirtError:
        return False
    return True


def restore(vms: VMLifecycle, vm: str, node: str, *, from_node: str | None, paused: bool, bypass_cache: bool) -> None:
    """Resume a saved VM on `node`, from its state on `from_node` (Driver.restore)."""
    src = from_node or node
    dom = vms.domain(vm, node)
    if dom is not None and vms.active(dom):
        if src != node:
            saved_move.drop_source(vms, vm, src, node)
        _discard_state(vms, vm, node)
        if not paused:
            vms.unpause(vm, node)
        return  # already resumed (a repeated call)
    # Hashed once: here before a restore where it was saved, on arrival for a move (the
    # copy's bytes are what QEMU reads; hashing the source first cost a second pass).
    if src == node:
        expected = verify(vms, vm, src)
    else:
        expected = _expected(vms, vm, src, vms.state_path(vm, src), "memory")
        disks = integrity.recorded_disks(integrity.read_manifest(vms.state_path(vm, src), vms.host(src)))
        vms.ensure_dirs(node)
        saved_move.copy_checked(vms, vm, src, node, expected, disks)
    restore_state_file(
        vms, vm, node, vms.state_path(vm, node), paused=paused, bypass_cache=bypass_cache, retarget=src != node
    )
    if src != node:
        saved_move.drop_source(vms, vm, src, node)
    _discard_state(vms, vm, node)
    vm_records.update_vm(vms.store, vm, node=node, state=VMState.RUNNING, overlay_path=str(vms.overlay_path(vm, node)))
    _log.info("vm restored", vm=vm, node=node, source=src)


def restore_state_file(
    vms: VMLifecycle,
    vm: str,
    node: str,
    state: Path,
    *,
    paused: bool = False,
    bypass_cache: bool = False,
    retarget: bool = True,
) -> None:
    """Start `vm` on `node` from a verified memory state, and keep it defined afterwards
    (a restored transient domain would vanish at its next shutdown).

    `retarget=False` (a state restored on the node that saved it) skips reading the saved
    XML back to rewrite its paths: they are this node's already, and on a busy libvirtd
    that extra call costs up to seconds.
    """
    conn = vms.connection(node)
    xml = _restore_xml(vms, vm, node, state) if retarget else None
    test = vms.is_test(node)
    flags = 0  # the test driver takes no flags
    if not test:
        flags |= libvirt.VIR_DOMAIN_SAVE_PAUSED if paused else 0
        flags |= libvirt.VIR_DOMAIN_SAVE_BYPASS_CACHE if bypass_cache else 0
    timeout = op_timeouts.for_file(vms.config, vms.endpoint(state, node))  # grows with the state's size
    vms.call("restore", vm, node, lambda: conn.restoreFlags(str(state), xml, flags), timeout_s=timeout)
    if paused and test:
        vms.pause(vm, node)
    restored = vms.require_domain("restore", vm, node)
    if not restored.isPersistent():
        inactive = restored.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
        vms.call("restore", vm, node, lambda: conn.defineXML(inactive))


def _restore_xml(vms: VMLifecycle, vm: str, node: str, state: Path) -> str | None:
    """The saved domain XML with this node's overlay and log paths, or None if unchanged."""
    conn = vms.connection(node)
    xml = vms.call("restore", vm, node, lambda: conn.saveImageGetXMLDesc(str(state), 0))
    return domxml.retarget(
        xml,
        overlay=vms.overlay_path(vm, node),
        console_log=vms.console_log(vm, node),
        job_disk=vms.job_disk_path(vm, node),
        output_logs=vms.output_logs(vm, node),
    )


def _discard_state(vms: VMLifecycle, vm: str, node: str) -> None:
    """A memory state is stale once the VM runs again: restoring it later would pair it
    with a newer overlay and corrupt the guest's disk, so it is removed."""
    path = vms.state_path(vm, node)
    vm_records.forget_snapshot(vms.store, path, node)
    transfer.remove(Endpoint(path, vms.host(node)))
    transfer.remove(Endpoint(integrity.manifest_path(path), vms.host(node)))


# -- checks and descriptions -----------------------------------------------------------------
def verify(vms: VMLifecycle, vm: str, node: str) -> Snapshot:
    """Check the saved memory state of `vm` on `node` before it is restored."""
    return verify_file(vms, vm, node, vms.state_path(vm, node), kind="memory")


def verify_file(vms: VMLifecycle, vm: str, node: str, path: Path, *, kind: str) -> Snapshot:
    """The state `path` on `node` checked (hashed there) against its store row or manifest."""
    snap = _expected(vms, vm, node, path, kind)
    integrity.check_against(vm, node, path, {"size_bytes": snap.size_bytes, "sha256": snap.sha256}, vms.host(node))
    return snap


def _expected(vms: VMLifecycle, vm: str, node: str, path: Path, kind: str) -> Snapshot:
    """What the state `path` on `node` must be (store row, else manifest), without hashing it:
    a state about to be copied is hashed where it arrives (`integrity.check_against`)."""
    host = vms.host(node)
    record = vm_records.snapshot_record(vms.store, path, node)
    expected = record or integrity.read_manifest(path, host)
    if not transfer.exists(Endpoint(path, host)):
        raise SnapshotError("restore", vm, node, f"snapshot {Endpoint(path, host).spec()} is missing")
    if expected is None:
        raise SnapshotError("restore", vm, node, f"snapshot {path} has no manifest and no store record")
    if "size_bytes" not in expected or "sha256" not in expected:
        raise SnapshotError("restore", vm, node, f"snapshot {path}: its manifest is unreadable (no size and sha256)")
    return Snapshot(
        vm,
        node,
        kind,
        path,
        None,
        int(expected["size_bytes"]),
        str(expected["sha256"]),
        float(expected.get("created_at", 0.0)),
        record.get("id") if record else None,
    )


def describe(
    vms: VMLifecycle,
    vm: str,
    node: str,
    kind: str,
    path: Path,
    overlay: Path | None,
    job_id: int | None,
    *,
    disks: dict[str, Path] | None = None,
    hashed: tuple[int, str] | None = None,
) -> Snapshot:
    """Hash a fresh state file (on its node), write its manifest and its store row (once);
    `disks` (role: path) are hashed into the manifest too. `hashed`: the (size, sha256) of
    this very file computed while it was written (save_hash), used when the size agrees."""
    host = vms.host(node)
    existing = integrity.read_manifest(path, host)
    actual = transfer.size(Endpoint(path, host))
    if actual is None:
        raise SnapshotError("save", vm, node, f"state {Endpoint(path, host).spec()} vanished after the save")
    if existing is not None and existing.get("size_bytes") == actual:
        size, digest, created = int(existing["size_bytes"]), str(existing["sha256"]), float(existing["created_at"])
    else:
        digest = hashed[1] if hashed is not None and hashed[0] == actual else transfer.sha256(Endpoint(path, host))
        size, created = actual, now()
        integrity.write_manifest(
            path,
            {
                "vm": vm,
                "node": node,
                "kind": kind,
                "size_bytes": size,
                "sha256": digest,
                "created_at": created,
                "overlay": str(overlay) if overlay else None,
                integrity.DISKS: integrity.disk_digests(disks, host) if disks else {},
            },
            host,
        )
    record_id = vm_records.record_snapshot(vms.store, vm, node, kind, path, size, digest, created, job_id)
    return Snapshot(vm, node, kind, path, overlay, size, digest, created, record_id)
