"""A running VM migrated by libvirt from one node to another, over a shared VM directory.

Why live on KVM but paused under TCG: on QEMU 7.2 a TCG guest that writes its memory fast
came out of a live migration with memory corrupted — its kernel crashed right after — in 14
of 28 runs at load 2–15 (a swapping guest, and a guest only rewriting a file in RAM, no swap,
no balloon), and in none of 109 paused (docs/remap.md, "The migration defect"). The pause
lasts as long as the copy (seconds for a few hundred MiB).
"""

from __future__ import annotations

import libvirt

from provisioning import domain_xml as domxml
from provisioning import op_timeouts, vm_records
from provisioning.vm_lifecycle import VMLifecycle
from provisioning.vm_types import DriverError
from vjob import log
from vjob.errors import InputError
from vjob.model import VMState

_log = log.get("provisioning")

_FLAGS = libvirt.VIR_MIGRATE_PERSIST_DEST | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE | libvirt.VIR_MIGRATE_UNSAFE
"""Always: the VM stays defined at the destination only; its overlay is shared, not copied."""


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
    if vms.overlay_path(vm, src) != vms.overlay_path(vm, dst):
        raise DriverError(
            "migrate",
            vm,
            src,
            f"live migration needs the overlay at one path on both nodes ({vms.overlay_path(vm, src)} vs "
            f"{vms.overlay_path(vm, dst)}): use a shared vm_dir, or suspend and resume on {dst}",
        )
    dom = vms.require_domain("migrate", vm, src)
    if not vms.active(dom):
        raise DriverError("migrate", vm, src, "the VM is not running (resume it instead)")
    dconn = vms.connection(dst)
    if live is None:
        live = vms.call("migrate", vm, src, lambda: domxml.domain_type(dom.XMLDesc(0))) != "qemu"
    flags = (libvirt.VIR_MIGRATE_LIVE if live else 0) | _FLAGS
    uri = vms.config.migrate_uris.get(dst)
    timeout = op_timeouts.for_domain(vms.config, dom)  # grows with the VM's memory (vjob.save_time)
    vms.call(
        "migrate", vm, src, lambda: dom.migrate(dconn, flags, None, uri, 0), on_timeout=dom.abortJob, timeout_s=timeout
    )
    vm_records.update_vm(vms.store, vm, node=dst, state=VMState.RUNNING)
    _log.info("vm migrated", vm=vm, source=src, destination=dst, live=live)
    return live
