"""Which libvirt domain type a node's VMs get: "kvm" or "qemu", as configured or probed.

Why apart from `kvm_probe`: that module holds the verdict's cache and the console check,
light enough for a check of /dev/kvm alone; the probe boot itself needs a libvirt
connection, an overlay and the counter guest's domain XML, which are the driver's.
"""

from __future__ import annotations

import os
import time

import libvirt

from provisioning import domain_xml as domxml
from provisioning import guest, kvm_probe
from provisioning.disk_placement import qemu_img
from provisioning.libvirt_link import LibvirtLink
from provisioning.vm_types import DriverError, VMSpec
from vjob import log

_log = log.get("provisioning")


def domain_type(link: LibvirtLink, node: str) -> str:
    """ "kvm" or "qemu" for `node`: as configured, or for "auto" the probe's cached verdict."""
    configured = link.config.domain_type
    if configured != "auto":
        return configured
    if not kvm_probe.kvm_usable():
        return "qemu"
    verdict = kvm_probe.cached(link.config.cpu_model)
    if verdict is None:
        t0 = time.monotonic()
        verdict = "kvm" if _probe_kvm(link, node) else "qemu"
        kvm_probe.remember(link.config.cpu_model, verdict, time.monotonic() - t0)
        _log.info("kvm probe", node=node, domain_type=verdict, seconds=round(time.monotonic() - t0, 1))
    return verdict


def _probe_kvm(link: LibvirtLink, node: str) -> bool:
    """Boot the counter guest under KVM (transient) until its first COUNTER, or give up."""
    link.ensure_dirs(node)
    files = guest.build()
    name = f"vjob-kvm-probe-{os.getpid()}"
    overlay, console = link.overlay_path(name, node), link.console_log(name, node)
    qemu_img(["create", "-q", "-f", "qcow2", str(overlay), "16M"], name)
    link.own_disk(name, node)
    spec = VMSpec(
        name=name,
        image=overlay,
        memory_mib=128,
        kernel=files.kernel,
        initrd=files.initrd,
        cmdline=files.cmdline,
        cpu_model=link.config.cpu_model,
    )
    xml = domxml.domain_xml(spec, dom_type="kvm", overlay=overlay, console_log=console)
    conn = link.connection(node)
    dom = None
    try:
        dom = link.call("kvm probe", name, node, lambda: conn.createXML(xml, 0))
        deadline = time.monotonic() + kvm_probe.PROBE_TIMEOUT_S
        while time.monotonic() < deadline:
            if kvm_probe.saw_counter(console):
                return True
            time.sleep(0.25)
        return False
    except DriverError as exc:
        _log.info("kvm probe failed to start", node=node, error=str(exc))
        return False
    finally:
        if dom is not None:
            try:
                dom.destroy()
            except libvirt.libvirtError:
                pass
        overlay.unlink(missing_ok=True)
        console.unlink(missing_ok=True)
