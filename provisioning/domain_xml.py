"""The libvirt domain XML of a vjob VM, and the paths rewritten in a saved one.

Why ElementTree and never string formatting: names, paths and the kernel command line end up
in the XML; building it as a tree makes every value text or an attribute, never markup.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from provisioning.vm_types import VMSpec

EMULATOR = "/usr/bin/qemu-system-x86_64"
NAT_FILTER = "clean-traffic"
"""libvirt's stock nwfilter (shipped with libvirt's nwfilter driver) put on a NIC that has an
`ip`: no MAC, IP or ARP spoofing and no other layer-2 traffic, so a guest's root cannot take
another vjob's address on a network they share."""
BALLOON_STATS_PERIOD_S = 5
"""How often the guest's balloon driver refreshes its memory statistics (swap in/out, major
faults): the remapping's memory model reads them to see a guest thrash (docs/remap.md)."""


def domain_xml(
    spec: VMSpec,
    *,
    dom_type: str,
    overlay: Path,
    console_log: Path,
    job_disk: Path | None = None,
    output_logs: tuple[Path, Path] | None = None,
    seclabels: bool = True,
    free_page_reporting: bool = False,
) -> str:
    """The domain of `spec` on a node of type `dom_type` ("test" for libvirt's test driver).

    The disk is the VM's overlay, marked `relabel='no'` on real nodes (the driver owns it to
    the QEMU user itself, see docs/provisioning.md); the serial console is logged to a file.
    A real job's VM also has its job disk (vdb) and two serial ports logged to files, the
    job's stdout and stderr (`output_logs`): serial logs go through virtlogd and, unlike a
    file chardev, are reopened in append mode by every restore. A user's own libvirt
    (qemu:///session, `seclabels=False`) has no DAC driver: QEMU runs as the disks' owner.
    """
    seclabels = seclabels and dom_type != "test"
    root = ET.Element("domain", type=dom_type)
    ET.SubElement(root, "name").text = spec.name
    # <memory> is the ceiling the balloon may later grow the guest to (remapping onto a node
    # kind with more memory); the guest boots with <currentMemory>, what its job asked.
    ET.SubElement(root, "memory", unit="MiB").text = str(max(spec.memory_mib, spec.max_memory_mib))
    ET.SubElement(root, "currentMemory", unit="MiB").text = str(spec.memory_mib)
    ET.SubElement(root, "vcpu").text = str(spec.vcpus)
    os_el = ET.SubElement(root, "os")
    ET.SubElement(os_el, "type", arch="x86_64", machine="pc").text = "hvm"
    if spec.kernel is not None:
        ET.SubElement(os_el, "kernel").text = str(spec.kernel)
        if spec.initrd is not None:
            ET.SubElement(os_el, "initrd").text = str(spec.initrd)
        ET.SubElement(os_el, "cmdline").text = spec.cmdline
    else:
        ET.SubElement(os_el, "boot", dev="hd")
    ET.SubElement(ET.SubElement(root, "features"), "acpi")
    if spec.cpu_model and dom_type != "test":
        cpu = ET.SubElement(root, "cpu", mode="custom", match="exact", check="none")
        ET.SubElement(cpu, "model", fallback="forbid").text = spec.cpu_model
    ET.SubElement(root, "clock", offset="utc")
    for event in ("on_poweroff", "on_reboot", "on_crash"):
        ET.SubElement(root, event).text = "destroy"
    devices = ET.SubElement(root, "devices")
    if dom_type != "test":
        ET.SubElement(devices, "emulator").text = EMULATOR
    disk = ET.SubElement(devices, "disk", type="file", device="disk")
    ET.SubElement(disk, "driver", name="qemu", type="qcow2")
    source = ET.SubElement(disk, "source", file=str(overlay))
    if seclabels:
        ET.SubElement(source, "seclabel", model="dac", relabel="no")
    ET.SubElement(disk, "target", dev="vda", bus="virtio")
    if job_disk is not None:
        disk = ET.SubElement(devices, "disk", type="file", device="disk")
        ET.SubElement(disk, "driver", name="qemu", type="qcow2")
        source = ET.SubElement(disk, "source", file=str(job_disk))
        if seclabels:
            ET.SubElement(source, "seclabel", model="dac", relabel="no")
        ET.SubElement(disk, "target", dev="vdb", bus="virtio")
    for want in spec.nics:  # in guest order: the private network first, then the NAT interface
        nic = ET.SubElement(devices, "interface", type=want.kind)
        ET.SubElement(nic, "mac", address=want.mac)
        if want.kind == "ethernet":  # the node service's tap, the user's own: libvirt only opens it
            ET.SubElement(nic, "target", dev=want.source, managed="no")
        else:
            ET.SubElement(nic, "source", {want.kind: want.source})
        ET.SubElement(nic, "model", type="virtio")
        if want.isolated:
            ET.SubElement(nic, "port", isolated="yes")
        if want.ip:  # only this MAC and address leave the NIC, and ARP only for them
            ref = ET.SubElement(nic, "filterref", filter=NAT_FILTER)
            ET.SubElement(ref, "parameter", name="IP", value=want.ip)
    for port, path in enumerate([console_log, *(output_logs or ())]):
        serial = ET.SubElement(devices, "serial", type="pty")
        ET.SubElement(serial, "log", file=str(path), append="on")
        ET.SubElement(serial, "target", port=str(port))
    console = ET.SubElement(devices, "console", type="pty")
    ET.SubElement(console, "target", type="serial", port="0")
    # A virtio balloon, for its statistics (without one a guest reports no swap activity) and
    # for the remapping's memory target per node kind (Driver.set_memory). Saved states keep
    # the device set they were saved with — their own XML is restored — so a state saved
    # before this device existed, or before free page reporting, restores as it was saved.
    # `free_page_reporting` (config provisioning.free_page_reporting): the guest returns freed
    # 2 MiB blocks, which a save then writes as zero pages (16–27 % fewer bytes,
    # bench/checkpoint.py). It was off while a swapping guest crashed after live migrations;
    # that was TCG's live copy, balloon or not (Driver.migrate pauses TCG guests; docs/remap.md,
    # "The migration defect").
    balloon = ET.SubElement(devices, "memballoon", model="virtio")
    if free_page_reporting:
        balloon.set("freePageReporting", "on")
    ET.SubElement(balloon, "stats", period=str(BALLOON_STATS_PERIOD_S))
    return ET.tostring(root, encoding="unicode")


def domain_type(xml: str) -> str:
    """A domain's type from its XML: "kvm", "qemu" (TCG, QEMU's emulator) or "test"."""
    return ET.fromstring(xml).get("type", "")


def retarget(
    saved_xml: str,
    *,
    overlay: Path,
    console_log: Path,
    job_disk: Path | None = None,
    output_logs: tuple[Path, Path] | None = None,
) -> str | None:
    """A saved domain's XML with this node's disk and log paths; None if unchanged.

    Why: a state saved on one node records that node's paths; restoring it elsewhere must
    point QEMU at the copies on the destination. Disks are matched by target (vda the
    overlay, vdb the job disk), serial logs by port (0 console, 1 stdout, 2 stderr).
    """
    root = ET.fromstring(saved_xml)
    changed = False
    disks = {"vda": overlay, "vdb": job_disk}
    for disk in root.findall("./devices/disk[@device='disk']"):
        source, target = disk.find("source"), disk.find("target")
        dev = target.get("dev") if target is not None else "vda"
        want = disks.get(dev or "vda", overlay)
        if source is not None and source.get("file") and want is not None and source.get("file") != str(want):
            source.set("file", str(want))
            changed = True
    logs = [console_log, *(output_logs or ())]
    for serial in root.findall("./devices/serial"):
        log_el, target = serial.find("log"), serial.find("target")
        port = int(target.get("port", "0")) if target is not None else 0
        want_log = str(logs[port] if port < len(logs) else console_log)
        if log_el is not None and log_el.get("file") != want_log:
            log_el.set("file", want_log)
            changed = True
    # A running domain's XML (what a migration sends) repeats serial port 0 as its <console>,
    # log included: left on the source's path, the destination's QEMU cannot open it.
    for console in root.findall("./devices/console"):
        log_el = console.find("log")
        if log_el is not None and log_el.get("file") != str(console_log):
            log_el.set("file", str(console_log))
            changed = True
    return ET.tostring(root, encoding="unicode") if changed else None
