"""The VM driver's vocabulary: what a VM is made of, a saved VM, a listed VM, and its errors.

Why apart from the driver: the image catalogue, the executor's performer and Saline's VM
manager need these types and the name rule without the libvirt life cycle (and without
importing libvirt).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from vjob.errors import InputError, VjobError
from vjob.model import VMState

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
"""VM, node, image and snapshot-label names (matched whole with `re.fullmatch`)."""
STATE_SUFFIX = ".state"
MANIFEST_SUFFIX = ".json"
OVERLAY_COPY_SUFFIX = ".overlay.qcow2"


class DriverError(VjobError):
    """A VM operation failed; the message names the VM, the node and libvirt's error."""

    def __init__(self, what: str, vm: str, node: str, message: str) -> None:
        self.vm = vm
        self.node = node
        subject = f" of VM {vm}" if vm != "-" else ""
        super().__init__(f"{what}{subject} on node {node}: {message}")


class SnapshotError(DriverError):
    """A snapshot is missing, altered or unknown: restoring it would start a broken state."""


def check_name(kind: str, value: str) -> str:
    """Names end up in paths and libvirt XML: letters, digits, '_', '.', '-' only.

    `fullmatch`, not `match` with `$`: `$` also accepts a trailing newline, which would reach
    file names and the XML.
    """
    if not isinstance(value, str) or not NAME_RE.fullmatch(value) or ".." in value:
        raise InputError(
            f"{kind} name {str(value)[:80]!r}: must match {NAME_RE.pattern} (letters, digits, _ . -; no '..')"
        )
    return value


MAC_RE = re.compile(r"[0-9a-f]{2}(?::[0-9a-f]{2}){5}")
NIC_KINDS = ("bridge", "network", "ethernet")
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
IPV4_RE = re.compile(rf"{_OCTET}(?:\.{_OCTET}){{3}}")
"""A dotted IPv4 address, each number without a leading zero (matched whole)."""


@dataclass(frozen=True)
class Nic:
    """One virtio NIC: its MAC and where it plugs in, a bridge by name (a job's private network)
    or a libvirt network by name (Saline's NAT network, the same name on every node), or a tap
    by name that the node service made for the job's user (`ethernet`, pilot.site_network).

    `isolated`: libvirt's `<port isolated='yes'/>`: the NIC reaches the host's side of the
    network (the NAT gateway) but no other isolated port on it, so VMs of different vjobs that
    share the NAT network cannot talk over it.

    `ip`: the one IPv4 address the guest may use on this NIC. When set, the NIC gets libvirt's
    `clean-traffic` nwfilter with that address (no MAC, IP or ARP spoofing, no other layer-2
    traffic): on a network several vjobs share (Saline's NAT network), a guest's root could
    otherwise answer ARP for, or send from, another vjob's address (issue 39, item 13)."""

    mac: str
    source: str
    kind: str = "bridge"
    isolated: bool = False
    ip: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.mac, str) or not MAC_RE.fullmatch(self.mac):
            raise InputError(f"nic mac = {str(self.mac)[:40]!r}: must match {MAC_RE.pattern}")
        if self.ip and (not isinstance(self.ip, str) or not IPV4_RE.fullmatch(self.ip)):
            raise InputError(f"nic ip = {str(self.ip)[:40]!r}: must be a dotted IPv4 address")
        if self.kind not in NIC_KINDS:
            raise InputError(f"nic kind = {str(self.kind)[:40]!r}: must be one of {', '.join(NIC_KINDS)}")
        check_name(f"nic {self.kind}", self.source)


@dataclass(frozen=True)
class VMSpec:
    """What a VM is made of: an OS image (backing file), memory, CPUs, optional direct boot."""

    name: str
    image: Path
    memory_mib: int = 128
    vcpus: int = 1
    image_format: str = "qcow2"
    kernel: Path | None = None
    initrd: Path | None = None
    cmdline: str = ""
    job_disk: Path | None = None
    """A second disk (vdb) holding the job's files (provisioning.job_disk), part of the VM."""
    output_ports: bool = False
    """Two more serial ports logged to files: the job's stdout (ttyS1) and stderr (ttyS2)."""
    cpu_model: str = ""
    """A named CPU model (e.g. qemu64) so that a saved state restores on any host; "" = libvirt's."""
    nics: tuple[Nic, ...] = ()
    """The VM's NICs in guest order: first a multi-node job's (or a vjob's) private network
    (provisioning.network), then Saline's NAT interface when the site has one."""
    max_memory_mib: int = 0
    """The domain's maximum memory (`<memory>`), the most its balloon can give it later; the
    guest starts with `memory_mib` (`<currentMemory>`). 0 = `memory_mib`: it can never grow.
    The agent's remapping raises it on a node kind with more memory (docs/remap.md)."""

    def __post_init__(self) -> None:
        check_name("vm", self.name)
        if self.memory_mib < 16:
            raise InputError(f"vm {self.name}: memory_mib = {self.memory_mib}: must be >= 16")
        if self.vcpus < 1:
            raise InputError(f"vm {self.name}: vcpus = {self.vcpus}: must be >= 1")
        if self.max_memory_mib and self.max_memory_mib < self.memory_mib:
            raise InputError(
                f"vm {self.name}: max_memory_mib = {self.max_memory_mib}: must be 0 or >= memory_mib "
                f"({self.memory_mib})"
            )
        if self.image_format not in ("qcow2", "raw"):
            raise InputError(f"vm {self.name}: image_format = {self.image_format!r}: must be qcow2 or raw")


@dataclass(frozen=True)
class Snapshot:
    """A saved VM: its memory state (and, for `full`, a copy of its overlay) on one node."""

    vm: str
    node: str
    kind: str
    memory_path: Path
    overlay_path: Path | None
    size_bytes: int
    sha256: str
    created_at: float
    record_id: int | None = None


@dataclass(frozen=True)
class VMInfo:
    """One domain as a node's libvirt reports it."""

    name: str
    node: str
    state: VMState
    memory_mib: int
    vcpus: int
    persistent: bool
