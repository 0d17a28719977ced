"""Named snapshots of a running VM (memory + a copy of its overlay), and the VM started again
from one: Saline's periodic snapshots and an RMS's checkpoint signal before a kill.

Why save → copy → restore rather than libvirt's external snapshots: libvirt 9.0 cannot
revert external snapshots, and the pair (memory, overlay copy) taken while the VM is stopped
is consistent and can be restored on any node holding the OS image.
"""

from __future__ import annotations

import os

from provisioning import checkpoint, integrity, op_timeouts, transfer, vm_records
from provisioning.transfer import Endpoint
from provisioning.vm_lifecycle import VMLifecycle
from provisioning.vm_types import OVERLAY_COPY_SUFFIX, STATE_SUFFIX, Snapshot, check_name
from vjob import log
from vjob.model import VMState

_log = log.get("provisioning")


def snapshot(vms: VMLifecycle, vm: str, node: str, *, label: str, job_id: int | None, keep_running: bool) -> Snapshot:
    """A consistent memory + overlay snapshot of a running VM, named `label` (Driver.snapshot)."""
    check_name("snapshot label", label)
    vms.ensure_dirs(node)
    snap_dir = vms.snapshot_dir(node)
    memory = snap_dir / f"{vm}@{label}{STATE_SUFFIX}"
    overlay_copy = snap_dir / f"{vm}@{label}{OVERLAY_COPY_SUFFIX}"
    if memory.exists() and integrity.manifest_path(memory).exists():
        return checkpoint.describe(vms, vm, node, "full", memory, overlay_copy, job_id)
    state = vms.state_path(vm, node)
    saved = checkpoint.save(vms, vm, node, job_id=None, bypass_cache=False, with_disks=False)
    try:
        transfer.copy(Endpoint(vms.overlay_path(vm, node)), Endpoint(overlay_copy), method="local")
        os.replace(state, memory)
        integrity.manifest_path(state).unlink(missing_ok=True)
        vm_records.forget_snapshot(vms.store, state, node)
        if keep_running:
            conn = vms.connection(node)
            vms.call("snapshot", vm, node, lambda: conn.restore(str(memory)))
            # The running VM is now ahead of `memory`; libvirt keeps no reference to it.
    except BaseException:
        if not state.exists() and memory.exists() and vms.state(vm, node) != VMState.RUNNING:
            os.replace(memory, state)  # keep the VM resumable from its normal state file
        raise
    vm_records.update_vm(vms.store, vm, state=VMState.RUNNING if keep_running else VMState.STOPPED)
    # `memory` is the saved state renamed (one file, only read since): its save-time digest
    # describes it, no second pass (Saline's periodic snapshots)
    hashed = (saved.size_bytes, saved.sha256)
    snap = checkpoint.describe(vms, vm, node, "full", memory, overlay_copy, job_id, hashed=hashed)
    _log.info("vm snapshot", vm=vm, node=node, label=label, bytes=snap.size_bytes, running=keep_running)
    return snap


def restore_snapshot(vms: VMLifecycle, vm: str, node: str, *, label: str, from_node: str | None, paused: bool) -> None:
    """Start the VM on `node` from snapshot `label` taken on `from_node` (Driver.restore_snapshot)."""
    src = from_node or node
    memory_src = vms.snapshot_dir(src) / f"{vm}@{label}{STATE_SUFFIX}"
    overlay_src = vms.snapshot_dir(src) / f"{vm}@{label}{OVERLAY_COPY_SUFFIX}"
    expected = checkpoint.verify_file(vms, vm, src, memory_src, kind="full")  # before the running VM is stopped
    vms.stop(vm, node)
    vms.ensure_dirs(node)
    method = vms.config.copy_method
    overlay = Endpoint(overlay_src, vms.host(src))
    transfer.copy(
        overlay,
        Endpoint(vms.overlay_path(vm, node), vms.host(node)),
        method=method,
        timeout_s=op_timeouts.for_file(vms.config, overlay),  # each copy's grows with its size
    )
    vms.own_disk(vm, node)
    state = vms.state_path(vm, node)
    memory = Endpoint(memory_src, vms.host(src))
    transfer.copy(
        memory, Endpoint(state, vms.host(node)), method=method, timeout_s=op_timeouts.for_file(vms.config, memory)
    )
    if src != node or memory_src != state:
        recorded = {"size_bytes": expected.size_bytes, "sha256": expected.sha256}
        integrity.check_against(vm, node, state, recorded, vms.host(node))
    checkpoint.restore_state_file(vms, vm, node, state, paused=paused)
    transfer.remove(Endpoint(state, vms.host(node)))
    vm_records.update_vm(vms.store, vm, node=node, state=VMState.RUNNING)
