"""A multi-VM job's private network, as data: addresses, the host file, the libvirt interface.

Why from the store's identities (`vjob.store.identities.assign`): Saline already gives each
job a 16-bit subnetID and each VM an 8-bit vmID under database constraints, and the MAC
derived from them; the IPv4 address follows from the same pair (10.<subnet hi>.<subnet lo>.
<vmID>), so a VM restored elsewhere comes back with the same MAC and IP, and two jobs never
share an address. One bridge per job (`vjob-<subnetID in hex>`) keeps jobs apart.

This module only computes; creating the bridge (or the VXLAN joining the nodes' bridges) is
the node's set-up and is not done here yet (docs/multinode.md, "Not done yet").
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from xml.sax.saxutils import quoteattr

from vjob.errors import InputError
from vjob.store.identities import Address

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


def bridge_name(subnet_id: int) -> str:
    """The job's bridge: at most 15 characters (Linux IFNAMSIZ - 1)."""
    _check_range("subnet_id", subnet_id, 1, (1 << 16) - 1)
    return f"vjob-{subnet_id:04x}"


def ip_address(subnet_id: int, vm_id: int) -> ipaddress.IPv4Address:
    """10.<subnetID high byte>.<subnetID low byte>.<vmID>: one /24 per job."""
    _check_range("subnet_id", subnet_id, 1, (1 << 16) - 1)
    _check_range("vm_id", vm_id, 1, MAX_VMS)
    return ipaddress.IPv4Address((10 << 24) | (subnet_id << 8) | vm_id)


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


def interface_xml(peer: Peer, subnet_id: int) -> str:
    """The libvirt <interface> of `peer` on its job's bridge (virtio, fixed MAC)."""
    return (
        f"<interface type='bridge'><source bridge={quoteattr(bridge_name(subnet_id))}/>"
        f"<mac address={quoteattr(peer.mac)}/><model type='virtio'/></interface>"
    )


def _check_range(field: str, value: int, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InputError(f"{field} = {str(value)[:40]!r}: must be an integer in {low}..{high}")
