"""A multi-VM job's private network, as data: addresses, the host file, the libvirt interface.

Why from the store's identities (`vjob.store.identities.assign`): Saline already gives each
job a 16-bit subnetID and each VM an 8-bit vmID under database constraints, and the MAC
derived from them; the IPv4 address follows from the same pair (10.<subnet hi>.<subnet lo>.
<vmID>), so a VM restored elsewhere comes back with the same MAC and IP, and two jobs never
share an address. One bridge per job (`vjob-<subnetID in hex>`) keeps jobs apart.

A pilot has no store credentials: `pilot_addresses` derives the same kind of identities from
the RMS job id alone (`pilot_subnet_id`), and `ensure_bridge` makes the job's bridge a transient
libvirt network on a node's libvirt (root's): no forward, no host address, so the job's VMs
reach each other and nothing else. Where the node service makes the bridge, it also joins it
across hosts (a VXLAN per job, provisioning.node_service.tunnel; docs/multinode.md, "Spanning real
hosts"); a root pilot's libvirt bridge on hosts without the service is not joined.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.sax.saxutils import quoteattr

from provisioning import transfer
from vjob import log, proc
from vjob.errors import InputError, VjobError
from vjob.store.identities import Address, mac_address

PILOT_MAC_PREFIX = "52:54:00"
"""QEMU's locally administered prefix, as Saline's default `mac_prefix`."""
_log = log.get("provisioning")

HOSTNAME_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
"""A guest host name (one DNS label, lower case): it goes into /etc/hosts and MPI's host file."""
MAX_VMS = 254
"""vmIDs 1..254: 0 is the subnet's network address, 255 its broadcast."""


@dataclass(frozen=True)
class Peer:
    """One VM on the job's network."""

    vm: str
    hostname: str
    mac: str
    ip: ipaddress.IPv4Address


PILOT_FAMILY = "vjob"
SALINE_FAMILY = "vsal"
FAMILIES = (PILOT_FAMILY, SALINE_FAMILY)


def bridge_name(subnet_id: int, family: str = PILOT_FAMILY) -> str:
    """The job's bridge: at most 15 characters (Linux IFNAMSIZ - 1).

    Why a family: pilots take their subnetID from the RMS job id and Saline from its store, two
    allocators that may hand out the same number at once on one node; a prefix per allocator
    keeps a pilot job and a Saline vjob off each other's bridge.
    """
    _check_range("subnet_id", subnet_id, 1, (1 << 16) - 1)
    if family not in FAMILIES:
        raise InputError(f"network family = {str(family)[:40]!r}: must be one of {', '.join(FAMILIES)}")
    return f"{family}-{subnet_id:04x}"


def ip_address(subnet_id: int, vm_id: int) -> ipaddress.IPv4Address:
    """10.<subnetID high byte>.<subnetID low byte>.<vmID>: one /24 per job."""
    _check_range("subnet_id", subnet_id, 1, (1 << 16) - 1)
    _check_range("vm_id", vm_id, 1, MAX_VMS)
    return ipaddress.IPv4Address((10 << 24) | (subnet_id << 8) | vm_id)


GATEWAY_VM_ID = 254
"""The node's own address on a job's network made by the node service (provisioning.node_service):
the guests' default route and their NFS gateway. Pilot VMs take vmIDs below it."""


def gateway_address(subnet_id: int) -> ipaddress.IPv4Address:
    """The node's address on the job's network: the same on every node, so a guest resumed or
    migrated elsewhere keeps its route and its NFS server's address."""
    return ip_address(subnet_id, GATEWAY_VM_ID)


def peers(addresses: Sequence[Address], *, hostname_prefix: str = "vm") -> list[Peer]:
    """The job's VMs with host names `<prefix><index>` in the order given (rank order: the first
    VM runs the user's script), all of one subnet."""
    if not addresses:
        raise InputError("network of a job: no VM")
    subnets = {a.subnet_id for a in addresses}
    if len(subnets) != 1:
        raise InputError(f"network of a job: VMs in several subnets {sorted(subnets)[:8]}")
    out = []
    for i, a in enumerate(addresses):
        hostname = f"{hostname_prefix}{i}"
        if not HOSTNAME_RE.fullmatch(hostname):
            raise InputError(f"hostname_prefix = {hostname_prefix[:40]!r}: host names must match {HOSTNAME_RE.pattern}")
        out.append(Peer(a.vm_name, hostname, a.mac, ip_address(a.subnet_id, a.vm_id)))
    return out


def hosts_file(job_peers: Sequence[Peer]) -> str:
    """/etc/hosts lines for the guests: every VM reaches the others by host name."""
    return "".join(f"{p.ip} {p.hostname}\n" for p in job_peers)


def node_file(job_peers: Sequence[Peer], *, slots: Sequence[int] | None = None) -> str:
    """The file at $VJOB_NODEFILE in every guest: Open MPI's host file (`host slots=n`)."""
    counts = list(slots) if slots is not None else [1] * len(job_peers)
    if len(counts) != len(job_peers) or any(not isinstance(n, int) or n < 1 for n in counts):
        raise InputError(f"slots = {str(counts)[:80]}: one positive count per VM")
    return "".join(f"{p.hostname} slots={n}\n" for p, n in zip(job_peers, counts, strict=True))


def interface_xml(peer: Peer, subnet_id: int, family: str = PILOT_FAMILY) -> str:
    """The libvirt <interface> of `peer` on its job's bridge (virtio, fixed MAC)."""
    return (
        f"<interface type='bridge'><source bridge={quoteattr(bridge_name(subnet_id, family))}/>"
        f"<mac address={quoteattr(peer.mac)}/><model type='virtio'/></interface>"
    )


def pilot_subnet_id(rms: str, job_id: str) -> int:
    """The job's subnetID when no store hands one out (a pilot): a numeric job id modulo 65535,
    so jobs running at the same time never share a bridge unless their ids are 65535 apart;
    other ids hashed."""
    if job_id.isdigit():
        return int(job_id) % ((1 << 16) - 1) + 1
    digest = hashlib.sha256(f"{rms}\0{job_id}".encode()).digest()
    return int.from_bytes(digest[:2], "big") % ((1 << 16) - 1) + 1


def pilot_addresses(rms: str, job_id: str, vm_names: Sequence[str]) -> list[Address]:
    """Identities of the job's VMs (vmID = rank + 1), the same at every start of the job."""
    if not 1 <= len(vm_names) <= MAX_VMS:
        raise InputError(f"nodes of job {job_id}: {len(vm_names)}: a job has 1..{MAX_VMS} VMs")
    subnet = pilot_subnet_id(rms, job_id)
    return [Address(vm, subnet, i + 1, mac_address(PILOT_MAC_PREFIX, subnet, i + 1)) for i, vm in enumerate(vm_names)]


def network_xml(subnet_id: int, family: str = PILOT_FAMILY) -> str:
    """An isolated libvirt network: its bridge only, no <forward>, no <ip> (no host address,
    no DHCP): the guests set their own addresses and see only each other."""
    name = quoteattr(bridge_name(subnet_id, family))
    return f"<network><name>{bridge_name(subnet_id, family)}</name><bridge name={name} stp='off' delay='0'/></network>"


def ensure_bridge(conn: Any, subnet_id: int, family: str = PILOT_FAMILY, *, host: str | None = None) -> bool:
    """The job's bridge on the node of `conn` (a libvirt connection), created as a transient
    network when absent; True when created here. A bridge an operator provides (spanning the
    hosts) is used as it is.

    `host`: the node's host when it is not this machine (the driver's `host(node)`). The link
    is then looked for there, over ssh: this machine's /sys/class/net may hold a bridge of the
    same name — the job's own, on this host — and taking it for the operator's made nothing on
    the other host, so libvirt refused the VM's NIC ("Cannot get interface MTU", found by
    Saline's site b with a network stack of its own)."""
    import libvirt  # heavy: libvirt

    name = bridge_name(subnet_id, family)
    try:
        net = conn.networkLookupByName(name)
    except libvirt.libvirtError:
        net = None
    if net is not None and net.isActive():
        return False
    if net is None and _link_exists(name, host):
        return False  # the operator's bridge (docs/multinode.md)
    try:
        if net is not None:
            net.create()
        else:
            conn.networkCreateXML(network_xml(subnet_id, family))
    except libvirt.libvirtError as exc:
        raise VjobError(f"job network {name}: cannot create it on {conn.getURI()}: {exc}") from None
    _log.info("job network created", bridge=name, uri=conn.getURI())
    return True


def remove_bridge(conn: Any, subnet_id: int, family: str = PILOT_FAMILY) -> None:
    """Destroy the job's transient network (no VM of the job runs any more); an operator's
    bridge, not a libvirt network, is left alone."""
    import libvirt  # heavy: libvirt

    try:
        conn.networkLookupByName(bridge_name(subnet_id, family)).destroy()
    except libvirt.libvirtError:
        return


def _link_exists(name: str, host: str | None = None) -> bool:
    if host is not None:
        return transfer.exists(transfer.Endpoint(Path("/sys/class/net") / name, host))
    try:
        with open(f"/sys/class/net/{name}/ifindex"):
            return True
    except OSError:
        return False


def _check_range(field: str, value: int, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InputError(f"{field} = {str(value)[:40]!r}: must be an integer in {low}..{high}")


def job_ssh_key(comment: str) -> tuple[str, str]:
    """A fresh ed25519 key pair for the job's user between the VMs of one job network (private,
    public): made when the job first boots (by the pilot, as the job's user; by Saline's site
    master for a vjob), it lives only on the job disks of the job's own VMs, so in their
    snapshots, and never in a file on a node."""
    with tempfile.TemporaryDirectory(prefix="vjob-key-") as tmp:
        key = Path(tmp) / "id"
        proc.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)], timeout_s=30)
        return key.read_text(), " ".join(key.with_suffix(".pub").read_text().split()[:2])
