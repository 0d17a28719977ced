"""A VM's life on one node: define, boot, pause, stop, delete, and what state it is in.

Why these verbs together: they act on one domain on one node and hold no file beyond its
overlay, job disk and logs; the verbs that write or move a memory state (`checkpoint`,
`saved_move`, `labelled_snapshots`, `migration`) are built on them. Each is idempotent:
after a crash of the agent, calling it again finds what was already done (a domain already
running, an overlay already there) and only finishes the rest.
"""

from __future__ import annotations

from pathlib import Path

import libvirt

from provisioning import disk_placement, integrity, kvm_choice, transfer, vm_records
from provisioning import domain_xml as domxml
from provisioning.libvirt_link import LibvirtLink
from provisioning.transfer import Endpoint
from provisioning.vm_types import DriverError, VMInfo, VMSpec
from vjob import log
from vjob.config import ProvisioningConfig
from vjob.model import VMState
from vjob.store.db import Store

_log = log.get("provisioning")


class VMLifecycle(LibvirtLink):
    """The life-cycle verbs over the nodes' libvirt, with the VMs' rows in `store` (if any)."""

    def __init__(self, config: ProvisioningConfig, *, data_dir: Path, store: Store | None = None) -> None:
        super().__init__(config, data_dir=data_dir)
        self.store = store

    # -- observe ---------------------------------------------------------------------------
    def state(self, vm: str, node: str) -> VMState | None:
        """The VM's state on `node`; None when the node knows no such VM and holds no state file."""
        dom = self.domain(vm, node)
        if dom is not None and self.active(dom):
            return VMState.RUNNING
        saved = transfer.exists(self.endpoint(self.state_path(vm, node), node))
        if dom is None:
            return VMState.SAVED if saved else None
        if saved:
            return VMState.SAVED
        return VMState.STOPPED if transfer.exists(self.endpoint(self.console_log(vm, node), node)) else VMState.DEFINED

    def list_vms(self, node: str) -> list[VMInfo]:
        conn = self.connection(node)
        out = []
        for dom in self.call("list", "-", node, conn.listAllDomains):
            name = dom.name()
            info = dom.info()
            state = self.state(name, node) or VMState.DEFINED
            out.append(VMInfo(name, node, state, int(info[1]) // 1024, int(info[3]), bool(dom.isPersistent())))
        return sorted(out, key=lambda v: v.name)

    # -- define / boot / stop / delete -------------------------------------------------------
    def define(self, spec: VMSpec, node: str, *, job_id: int | None = None) -> None:
        """Create the VM's overlay over its image and define the domain (both only once).

        On a node whose files are on another host (`host`), the overlay is created there over
        the image at the same path (`vjob image distribute` put it there), and the job disk,
        built here by the pilot, is sent there and checked on arrival
        (`disk_placement.send_job_disk`).
        """
        self.ensure_dirs(node)
        overlay = self.overlay_path(spec.name, node)
        disk_placement.create_overlay(self, spec, node)
        disk_placement.attach_job_disk(self, spec, node)
        if self.domain(spec.name, node) is None:
            xml = self.domain_xml(spec, node)
            conn = self.connection(node)
            self.call("define", spec.name, node, lambda: conn.defineXML(xml))
        vm_records.record_vm(self.store, spec, node, job_id, overlay)
        _log.info("vm defined", vm=spec.name, node=node, overlay=str(overlay))

    def domain_xml(self, spec: VMSpec, node: str) -> str:
        """The libvirt domain XML of `spec` on `node` (type test on test:// URIs)."""
        return domxml.domain_xml(
            spec,
            dom_type="test" if self.is_test(node) else self.domain_type(node),
            overlay=self.overlay_path(spec.name, node),
            console_log=self.console_log(spec.name, node),
            job_disk=spec.job_disk,
            output_logs=self.output_logs(spec.name, node) if spec.output_ports else None,
            seclabels=not self.uri(node).endswith("/session"),
            free_page_reporting=self.config.free_page_reporting,
        )

    def domain_type(self, node: str) -> str:
        """ "kvm" or "qemu" for `node`: as configured, or for "auto" the probe's cached verdict."""
        return kvm_choice.domain_type(self, node)

    def boot(self, vm: str, node: str) -> None:
        """Start the VM; a VM already running is left alone, a saved one is refused."""
        dom = self.require_domain("boot", vm, node)
        if self.active(dom):
            return
        if transfer.exists(self.endpoint(self.state_path(vm, node), node)):
            raise DriverError("boot", vm, node, "it has a saved memory state: resume it (booting would lose it)")
        self.call("boot", vm, node, dom.create)
        vm_records.update_vm(self.store, vm, node=node, state=VMState.RUNNING)
        _log.info("vm booted", vm=vm, node=node)

    def stop(self, vm: str, node: str) -> None:
        """Power the VM off (its work since the last checkpoint is lost); the overlay stays."""
        dom = self.domain(vm, node)
        if dom is None or not self.active(dom):
            return
        self.call("stop", vm, node, dom.destroy)
        vm_records.update_vm(self.store, vm, state=VMState.STOPPED)
        _log.info("vm stopped", vm=vm, node=node)

    def delete(self, vm: str, node: str) -> None:
        """Destroy and undefine the VM and remove its overlay, state file and records."""
        dom = self.domain(vm, node)
        if dom is not None:
            if self.active(dom):
                self.call("delete", vm, node, dom.destroy)
            if dom.isPersistent():
                flags = libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
                self.call("delete", vm, node, lambda: dom.undefineFlags(flags))
        state = self.state_path(vm, node)
        disks = (self.overlay_path(vm, node), self.job_disk_path(vm, node), *self.output_logs(vm, node))
        for path in (*disks, state, integrity.manifest_path(state)):
            transfer.remove(Endpoint(path, self.host(node)))
        vm_records.forget_snapshot(self.store, self.state_path(vm, node), node)
        vm_records.forget_vm(self.store, vm)
        _log.info("vm deleted", vm=vm, node=node)

    # -- pause / unpause -------------------------------------------------------------------
    def pause(self, vm: str, node: str) -> bool:
        """Pause a running VM (its vCPUs stop; memory stays): the first half of a coordinated
        checkpoint. True when the VM is now paused; False when it is not running at all."""
        dom = self.domain(vm, node)
        if dom is None or not self.active(dom):
            return False
        if dom.state()[0] != libvirt.VIR_DOMAIN_PAUSED:
            self.call("pause", vm, node, dom.suspend)
        return dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED

    def unpause(self, vm: str, node: str) -> None:
        """Let a paused VM run again (after a failed coordinated checkpoint, or a paused restore)."""
        dom = self.require_domain("unpause", vm, node)
        if dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED:
            self.call("unpause", vm, node, dom.resume)
